// A native workload with a known CPU split: per round, hot_a runs 7 units of work and hot_b 3,
// so a sampler should find ~70% of the process's samples in hot_a and ~30% in hot_b, each under
// main. Built with frame pointers (-fno-omit-frame-pointer) by the tests. A round takes about
// 0.1 ms, far less than a sampling period (5 ms at 199 Hz): with rounds of 4.5 ms (UNIT was
// 200000), close to the period, samples kept falling in the same phase of the rounds and
// hot_a's share came out 64-68%.
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

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 10.0;
    time_t end = time(NULL) + (time_t)seconds;
    while (time(NULL) < end) {
        hot_a(7);
        hot_b(3);
    }
    return 0;
}
