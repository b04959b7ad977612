// A native workload with a known CPU split: per round, hot_a runs 7 units of work and hot_b 3,
// so a sampler should find about 70% of the process's samples in hot_a and 30% in hot_b, each
// under main. Built with frame pointers (-fno-omit-frame-pointer) by the tests. A round takes
// about 0.1 ms, far less than a sampling period (5 ms at 199 Hz): with rounds of 4.5 ms (UNIT
// was 200000), close to the period, samples kept falling in the same phase of the rounds and
// hot_a's share came out 64-68%.
//
// Equal units of the two identical loops do not always take equal time: on the test machine
// one process's split came out 48.5% and another's 86.6% of hot_a's share of the time (each
// loop's speed depends on where its counter and code fall), so the workload measures its own
// split when asked. Usage: native_split SECONDS [SPLIT_FILE]; SPLIT_FILE is rewritten each
// second with "<ns in hot_a> <ns in hot_b>\n" since the start, by the monotonic clock (a vDSO
// read, about 20 ns, against a round's 0.1 ms).
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define UNIT 5000UL

__attribute__((noinline)) void hot_a(unsigned long units) {
    for (volatile unsigned long i = 0; i < units * UNIT; i++) {
    }
}

__attribute__((noinline)) void hot_b(unsigned long units) {
    for (volatile unsigned long i = 0; i < units * UNIT; i++) {
    }
}

static unsigned long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (unsigned long long)t.tv_sec * 1000000000ULL + (unsigned long long)t.tv_nsec;
}

// Written to a temporary name and renamed, so a reader never sees half a line.
static void write_split(const char *path, unsigned long long a_ns, unsigned long long b_ns) {
    char temporary[4096];
    snprintf(temporary, sizeof temporary, "%s.new", path);
    FILE *file = fopen(temporary, "w");
    if (file == NULL) {
        return;
    }
    fprintf(file, "%llu %llu\n", a_ns, b_ns);
    fclose(file);
    rename(temporary, path);
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 10.0;
    const char *split_file = argc > 2 ? argv[2] : NULL;
    time_t end = time(NULL) + (time_t)seconds;
    time_t written = 0;
    unsigned long long a_ns = 0, b_ns = 0;
    for (;;) {
        time_t second = time(NULL);
        if (second >= end) {
            break;
        }
        if (split_file != NULL && second != written) {
            write_split(split_file, a_ns, b_ns);
            written = second;
        }
        unsigned long long start = now_ns();
        hot_a(7);
        unsigned long long middle = now_ns();
        hot_b(3);
        unsigned long long finish = now_ns();
        a_ns += middle - start;
        b_ns += finish - middle;
    }
    return 0;
}
