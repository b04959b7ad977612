// A native workload that spends its time in the vDSO: main -> run_loop -> read_clock ->
// libc's clock_gettime -> the vDSO's __vdso_clock_gettime (and its frameless internal helpers).
// The vDSO is no file on disk: its frames are unwound by the table the daemon builds from the
// host's vDSO image, and named from that image's symbols. Built -O2 -fomit-frame-pointer, so
// only unwind tables find read_clock and run_loop.
#include <stdlib.h>
#include <time.h>

// The result is used after the call, and an empty asm follows it: no tail calls.
__attribute__((noinline)) unsigned long read_clock(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    __asm__ volatile("" ::: "memory");
    return (unsigned long)now.tv_nsec;
}

__attribute__((noinline)) unsigned long run_loop(time_t end) {
    unsigned long total = 0;
    for (unsigned long n = 1;; n++) {
        total += read_clock();
        if ((n & 0xffff) == 0 && time(NULL) >= end) {
            break;
        }
    }
    __asm__ volatile("" ::: "memory");
    return total;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 10.0;
    unsigned long total = run_loop(time(NULL) + (time_t)seconds);
    return total == 42 ? 1 : 0;
}
