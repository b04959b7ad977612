// A library whose hot function is local (named only by .symtab), so that a copy with that name
// renamed still loads and runs: tests/tests/hostile_files.rs copies it, renames the function,
// and runs the same program on the copy as another user.
__attribute__((noinline)) static void victim_hot(void) {
    for (volatile unsigned long i = 0; i < 1000000UL; i++) {
    }
}

void library_entry(double seconds);

#include <time.h>

void library_entry(double seconds) {
    time_t end = time(NULL) + (time_t)seconds;
    while (time(NULL) < end) {
        victim_hot();
    }
}
