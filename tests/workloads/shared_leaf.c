// A native workload whose 70/30 split is only visible below a shared leaf: per round, hot_a
// calls leaf for 7 units of work and hot_b for 3, and nearly all time is spent in leaf. The leaf
// builds no frame (`omit-frame-pointer`, whatever the build flags), so a frame-pointer walk from
// it skips its caller; only the unwind tables find hot_a and hot_b. The tests build it twice:
// with frame pointers elsewhere, and with -O2 -fomit-frame-pointer throughout.
#include <stdlib.h>
#include <time.h>

#define UNIT 200000UL

// The sum is returned and used, and an empty asm follows each call: no call is a tail call,
// so every caller keeps a frame on the stack to be found.
__attribute__((noinline, optimize("omit-frame-pointer"))) unsigned long leaf(unsigned long units) {
    unsigned long sum = 0;
    for (volatile unsigned long i = 0; i < units * UNIT; i++) {
        sum += i;
    }
    return sum;
}

__attribute__((noinline)) unsigned long hot_a(void) {
    unsigned long sum = leaf(7);
    __asm__ volatile("" ::: "memory");
    return sum + 1;
}

__attribute__((noinline)) unsigned long hot_b(void) {
    unsigned long sum = leaf(3);
    __asm__ volatile("" ::: "memory");
    return sum + 1;
}

__attribute__((noinline)) unsigned long run_loop(time_t end) {
    unsigned long total = 0;
    while (time(NULL) < end) {
        total += hot_a();
        total += hot_b();
    }
    __asm__ volatile("" ::: "memory");
    return total;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 10.0;
    unsigned long total = run_loop(time(NULL) + (time_t)seconds);
    return total == 42 ? 1 : 0;
}
