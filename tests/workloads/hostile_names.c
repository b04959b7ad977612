// A process whose names are terminal escapes: its comm and a thread's name set with
// prctl(PR_SET_NAME), and the function both threads spin in, whose symbol name has them too.
// Usage: hostile_names SECONDS

#include <pthread.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

// ESC [2J (clear screen), BEL, and U+009B (CSI as a C1 character, UTF-8 encoded).
#define SPIN_SYMBOL "\"spin\033[2J\007\302\233\""

// Counts `n` down with a frame of its own, so the walk reaches its callers. Written in
// assembly: only a quoted assembler name can hold these bytes.
__asm__(".text\n"
        ".globl " SPIN_SYMBOL "\n"
        ".type " SPIN_SYMBOL ", @function\n" SPIN_SYMBOL ":\n"
        "  push %rbp\n"
        "  mov %rsp, %rbp\n"
        "1: dec %rdi\n"
        "  jnz 1b\n"
        "  pop %rbp\n"
        "  ret\n"
        ".size " SPIN_SYMBOL ", .-" SPIN_SYMBOL "\n");
extern void hostile_spin(unsigned long n) __asm__(SPIN_SYMBOL);

static double seconds;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void spin_until_done(void) {
    double end = now() + seconds;
    while (now() < end) {
        hostile_spin(10 * 1000 * 1000);
    }
}

static void *worker(void *arg) {
    (void)arg;
    // OSC 0 (set the terminal's title), BEL, then CSI as a C1 character.
    prctl(PR_SET_NAME, "\033]0;pwn\007\302\233", 0, 0, 0);
    spin_until_done();
    return NULL;
}

int main(int argc, char **argv) {
    seconds = argc > 1 ? atof(argv[1]) : 30;
    // Red text, then a bell and a newline: the process's name as every tool shows it.
    prctl(PR_SET_NAME, "\033[31m<&X\007\n", 0, 0, 0);
    pthread_t thread;
    if (pthread_create(&thread, NULL, worker, NULL) != 0) {
        return 1;
    }
    spin_until_done();
    pthread_join(thread, NULL);
    return 0;
}
