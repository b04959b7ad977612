// The bystander of the hostile-scenario tests (tests/src/hostile.rs): an innocent process that
// spins in one distinctively named function, so that its profiles show whether the daemon kept
// profiling it while another user attacked the daemon.
#include <stdlib.h>
#include <time.h>

__attribute__((noinline)) void bystander_spin(void) {
    for (volatile unsigned long i = 0; i < 1000000UL; i++) {
    }
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 60.0;
    time_t end = time(NULL) + (time_t)seconds;
    while (time(NULL) < end) {
        bystander_spin();
    }
    return 0;
}
