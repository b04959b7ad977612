// A workload that spends most of its time in the kernel: large reads from /dev/zero (the kernel
// clears the user buffer). Samples should show kernel frames under read_loop and main.
//
// The read is a raw `syscall` instruction inside read_loop, not libc's read(): libc is built
// without frame pointers, and a frame-pointer walk from inside a frameless leaf skips that leaf's
// caller. Here the interrupted user instruction is in read_loop itself.
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>

static char buffer[1 << 20];

static inline long raw_read(int fd, void *buf, unsigned long len) {
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"((long)SYS_read), "D"((long)fd), "S"(buf), "d"(len)
                     : "rcx", "r11", "memory");
    return ret;
}

__attribute__((noinline)) void read_loop(int fd, time_t end) {
    while (time(NULL) < end) {
        if (raw_read(fd, buffer, sizeof buffer) < 0) {
            exit(1);
        }
    }
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 10.0;
    int fd = open("/dev/zero", O_RDONLY);
    if (fd < 0) {
        return 1;
    }
    read_loop(fd, time(NULL) + (time_t)seconds);
    return 0;
}
