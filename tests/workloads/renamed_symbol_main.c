// Runs the hot loop of renamed_symbol_lib.c's library for argv[1] seconds.
#include <stdlib.h>

void library_entry(double seconds);

int main(int argc, char **argv) {
    library_entry(argc > 1 ? atof(argv[1]) : 30.0);
    return 0;
}
