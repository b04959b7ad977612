// Section 2's deep native stacks: one thread per CPU recurses `depth` frames (default 30), then
// spins in a leaf, so every sample walks that many native frames; prints "ready" once started.
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

// The result is used after the call: no tail call, every level keeps its frame.
__attribute__((noinline)) static unsigned long recurse(int level) {
    unsigned long sum = level >= depth ? spin() : recurse(level + 1);
    __asm__ volatile("" ::: "memory");
    return sum + (unsigned long)level;
}

static void *run(void *unused) {
    (void)unused;
    unsigned long total = 0;
    for (;;) {
        // main/thread entry and `run` are two frames: recurse from level 2.
        total += recurse(2);
        __asm__ volatile("" ::"r"(total) : "memory");
    }
    return NULL;
}

int main(int argc, char **argv) {
    depth = argc > 1 ? atoi(argv[1]) : 30;
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
