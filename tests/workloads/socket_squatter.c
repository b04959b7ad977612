// Another user's trap for an attach client: listens on PATH (a JVM's attach socket path, taken
// before the JVM binds it), open to everyone, and answers every connection as a JVM that loaded
// the agent would. Prints "listening", then one line per connection: the request bytes it got.
// Used by tests/tests/security_endpoints.rs.
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s PATH\n", argv[0]);
        return 2;
    }
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    strncpy(address.sun_path, argv[1], sizeof address.sun_path - 1);
    int listener = socket(AF_UNIX, SOCK_STREAM, 0);
    if (bind(listener, (struct sockaddr *)&address, sizeof address) != 0 ||
        chmod(argv[1], 0777) != 0 || listen(listener, 16) != 0) {
        perror(argv[1]);
        return 1;
    }
    printf("listening\n");
    fflush(stdout);
    for (;;) {
        int connection = accept(listener, NULL, NULL);
        if (connection < 0) {
            continue;
        }
        // A request is five NUL-terminated fields (version, command, three arguments).
        char request[4096];
        size_t got = 0;
        int nuls = 0;
        while (nuls < 5 && got < sizeof request) {
            ssize_t n = read(connection, request + got, sizeof request - got);
            if (n <= 0) {
                break;
            }
            for (ssize_t i = 0; i < n; i++) {
                nuls += request[got + i] == 0;
            }
            got += n;
        }
        printf("request of %zu bytes\n", got);
        fflush(stdout);
        const char forged[] = "0\nreturn code: 0\n";
        write(connection, forged, sizeof forged - 1);
        close(connection);
    }
}
