// A local user's attack on the unwind-table budget: dlopens every library named on the command
// line (each with tens of thousands of unwind rows), then spins so that the daemon samples it and
// loads the tables of everything it maps. Used by tests/tests/hostile_files.rs.
#include <dlfcn.h>
#include <stdio.h>
#include <time.h>

__attribute__((noinline)) static void hoarder_spin(void) {
    for (volatile unsigned long i = 0; i < 1000000UL; i++) {
    }
}

int main(int argc, char **argv) {
    int loaded = 0;
    for (int i = 1; i < argc; i++) {
        if (dlopen(argv[i], RTLD_NOW | RTLD_LOCAL) != NULL) {
            loaded++;
        }
    }
    printf("loaded %d\n", loaded);
    fflush(stdout);
    time_t end = time(NULL) + 120;
    while (time(NULL) < end) {
        hoarder_spin();
    }
    return 0;
}
