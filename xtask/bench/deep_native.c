// Section 2's deep native stacks: one thread per CPU calls down a chain of distinct functions
// `depth` frames deep (default 30, at most 64), then spins in a leaf, so every sample walks that
// many native frames; prints "ready" once started. Distinct functions rather than one recursive
// function: a walk over real code meets a new function at each frame, and the unwinder's cache
// of its last table row would make a recursion look cheaper than real stacks are.
// Built twice by the bench: with frame pointers (walked by them) and with -fomit-frame-pointer
// (walked by the unwind tables).
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static int depth = 30;

__attribute__((noinline)) static unsigned long spin(void) {
    unsigned long sum = 0;
    for (volatile unsigned long i = 0; i < 1000000UL; i++) {
        sum += i;
    }
    return sum;
}

// Level `level` of the chain: the last one spins, the others call the next function. The result
// is used after the call: no tail call, every level keeps its frame.
#define LEVEL(name, next)                                                      \
    __attribute__((noinline)) static unsigned long name(int level) {           \
        unsigned long sum = level >= depth ? spin() : next(level + 1);         \
        __asm__ volatile("" ::: "memory");                                     \
        return sum + (unsigned long)level;                                     \
    }

__attribute__((noinline)) static unsigned long level_last(int level) {
    unsigned long sum = spin();
    __asm__ volatile("" ::: "memory");
    return sum + (unsigned long)level;
}

#define EIGHT(p, next)                                                         \
    LEVEL(p##7, next) LEVEL(p##6, p##7) LEVEL(p##5, p##6) LEVEL(p##4, p##5)    \
    LEVEL(p##3, p##4) LEVEL(p##2, p##3) LEVEL(p##1, p##2) LEVEL(p##0, p##1)

EIGHT(level_h, level_last)
EIGHT(level_g, level_h0)
EIGHT(level_f, level_g0)
EIGHT(level_e, level_f0)
EIGHT(level_d, level_e0)
EIGHT(level_c, level_d0)
EIGHT(level_b, level_c0)
EIGHT(level_a, level_b0)

static void *run(void *unused) {
    (void)unused;
    unsigned long total = 0;
    for (;;) {
        // main/thread entry and `run` are two frames: the chain starts at level 2.
        total += level_a0(2);
        __asm__ volatile("" ::"r"(total) : "memory");
    }
    return NULL;
}

int main(int argc, char **argv) {
    depth = argc > 1 ? atoi(argv[1]) : 30;
    if (depth > 64) {
        depth = 64;
    }
    int threads = argc > 2 ? atoi(argv[2]) : 1;
    for (int i = 1; i < threads; i++) {
        pthread_t thread;
        pthread_create(&thread, NULL, run, NULL);
    }
    // The bench waits for this line before it measures.
    printf("ready\n");
    fflush(stdout);
    run(NULL);
    return 0;
}
