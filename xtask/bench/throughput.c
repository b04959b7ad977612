// Native throughput workload for `cargo xtask bench`: `throughput THREADS`.
//
// THREADS workers hash and sort small buffers through a few non-inlined calls (frame pointers
// kept, so the profiler walks a real native stack). Prints "ready", then every 100 ms
// "ops COUNT NANOS": operations done so far and CLOCK_MONOTONIC, taken together so that a rate
// between two reports is exact.
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define MAX_THREADS 256
#define ITEMS 64

// One counter per cache line: workers never share a line.
struct counter {
    _Alignas(64) uint64_t ops;
    uint64_t result; // written after each operation, so the compiler cannot drop the work
};

static struct counter counters[MAX_THREADS];

__attribute__((noinline)) static uint64_t hash_items(const uint32_t *items, int n) {
    uint64_t hash = 1469598103934665603ULL;
    for (int i = 0; i < n; i++) {
        hash = (hash ^ items[i]) * 1099511628211ULL;
    }
    return hash;
}

__attribute__((noinline)) static void sort_items(uint32_t *items, int n) {
    for (int i = 1; i < n; i++) {
        uint32_t item = items[i];
        int j = i - 1;
        while (j >= 0 && items[j] > item) {
            items[j + 1] = items[j];
            j--;
        }
        items[j + 1] = item;
    }
}

__attribute__((noinline)) static uint64_t operation(uint64_t seed) {
    uint32_t items[ITEMS];
    for (int i = 0; i < ITEMS; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        items[i] = (uint32_t)(seed >> 33);
    }
    sort_items(items, ITEMS);
    return seed ^ hash_items(items, ITEMS);
}

static void *worker(void *arg) {
    struct counter *counter = arg;
    uint64_t seed = (uint64_t)(uintptr_t)arg;
    for (;;) {
        seed = operation(seed);
        __atomic_store_n(&counter->result, seed, __ATOMIC_RELAXED);
        __atomic_store_n(&counter->ops, counter->ops + 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

static uint64_t now_nanos(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    if (threads < 1 || threads > MAX_THREADS) {
        fprintf(stderr, "usage: throughput THREADS (1 to %d)\n", MAX_THREADS);
        return 2;
    }
    for (int t = 0; t < threads; t++) {
        pthread_t thread;
        if (pthread_create(&thread, NULL, worker, &counters[t]) != 0) {
            perror("pthread_create");
            return 1;
        }
    }
    printf("ready\n");
    fflush(stdout);
    const struct timespec pause = {0, 100 * 1000 * 1000};
    for (;;) {
        nanosleep(&pause, NULL);
        uint64_t total = 0;
        for (int t = 0; t < threads; t++) {
            total += __atomic_load_n(&counters[t].ops, __ATOMIC_RELAXED);
        }
        printf("ops %llu %llu\n", (unsigned long long)total, (unsigned long long)now_nanos());
        fflush(stdout);
    }
}
