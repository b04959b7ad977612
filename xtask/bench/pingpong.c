/* Two threads passing a byte back and forth through two pipes: every round trip is two context
 * switches per thread, the worst case for an off-CPU profiler's cost per switch. Runs for
 * argv[1] seconds (default 5), both threads on CPU argv[2] if given (else wherever the
 * scheduler puts them: then most round trips cross CPUs, and their rate swings with where the
 * threads land), and prints the round trips per second it made. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int ping[2], pong[2];
static volatile int stop;

static void *echo(void *unused) {
    (void)unused;
    char byte;
    while (read(ping[0], &byte, 1) == 1) {
        if (write(pong[1], &byte, 1) != 1) {
            break;
        }
    }
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 5;
    if (argc > 2) {
        /* Set before the echo thread starts, which inherits it. */
        cpu_set_t cpus;
        CPU_ZERO(&cpus);
        CPU_SET(atoi(argv[2]), &cpus);
        if (sched_setaffinity(0, sizeof cpus, &cpus)) {
            perror("sched_setaffinity");
            return 1;
        }
    }
    if (pipe(ping) || pipe(pong)) {
        perror("pipe");
        return 1;
    }
    pthread_t thread;
    pthread_create(&thread, NULL, echo, NULL);
    double start = now(), end = start + seconds;
    long trips = 0;
    char byte = 1;
    while ((trips & 1023) || now() < end) {
        if (write(ping[1], &byte, 1) != 1 || read(pong[0], &byte, 1) != 1) {
            return 1;
        }
        trips++;
    }
    printf("%.0f\n", trips / (now() - start));
    return 0;
}
