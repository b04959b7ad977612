// Threads that wait without end, each wait from a new depth of 1 to 900 frames: as many distinct
// deep off-CPU stacks as the off-CPU and lock programs will take (tests/tests/security_floods.rs).
//
//   deep_sleepers THREADS SECONDS
//
// Each thread sleeps 5 ms at the bottom of its recursion, returns, and starts again at another
// depth. Prints "ready" once every thread runs.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static time_t end;

static __attribute__((noinline)) void sleep_deep(unsigned depth) {
    volatile char frame[16];
    frame[0] = (char)depth;
    if (depth > 1) {
        sleep_deep(depth - 1);
    } else {
        struct timespec wait = {0, 5 * 1000 * 1000};
        nanosleep(&wait, NULL);
    }
    frame[1] = frame[0];
}

static void *sleeper(void *argument) {
    unsigned seed = (unsigned)(size_t)argument;
    while (time(NULL) < end) {
        sleep_deep(1 + rand_r(&seed) % 900);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: deep_sleepers THREADS SECONDS\n");
        return 1;
    }
    unsigned threads = (unsigned)atoi(argv[1]);
    end = time(NULL) + atoi(argv[2]);
    pthread_t *running = calloc(threads, sizeof(pthread_t));
    for (unsigned i = 0; i < threads; i++) {
        pthread_create(&running[i], NULL, sleeper, (void *)(size_t)(i + 1));
    }
    printf("ready\n");
    fflush(stdout);
    for (unsigned i = 0; i < threads; i++) {
        pthread_join(running[i], NULL);
    }
    return 0;
}
