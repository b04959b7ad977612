// A pool of 32 threads named as a Java pool's would be, `pool-worker-0` to `pool-worker-31`,
// each running `pool_task` a millisecond in every fifty (together about 0.64 of a CPU, spread
// over the pool so that most threads get sampled and a program beside it still gets its
// share), while the main thread waits for them.
// Usage: thread_pool SECONDS

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

#define THREADS 32

static double seconds;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void pool_task(double until) {
    while (now() < until) {
    }
}

static void *worker(void *arg) {
    char name[16];
    snprintf(name, sizeof name, "pool-worker-%d", (int)(long)arg);
    prctl(PR_SET_NAME, name, 0, 0, 0);
    double end = now() + seconds;
    struct timespec rest = {0, 49 * 1000 * 1000};
    while (now() < end) {
        pool_task(now() + 0.001);
        nanosleep(&rest, NULL);
    }
    return NULL;
}

int main(int argc, char **argv) {
    seconds = argc > 1 ? atof(argv[1]) : 30;
    pthread_t threads[THREADS];
    for (long i = 0; i < THREADS; i++) {
        if (pthread_create(&threads[i], NULL, worker, (void *)i) != 0) {
            return 1;
        }
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
    }
    return 0;
}
