// A local user's attack on a TCP endpoint: opens COUNT connections to HOST:PORT, never sends a
// byte, and holds them until killed. Prints "holding N" once the connections are set up (N:
// those established). Used by tests/tests/security_endpoints.rs against the daemon's /metrics.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s HOST PORT COUNT\n", argv[0]);
        return 2;
    }
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    if (inet_pton(AF_INET, argv[1], &address.sin_addr) != 1) {
        fprintf(stderr, "bad address %s\n", argv[1]);
        return 2;
    }
    int count = atoi(argv[3]);
    // As many descriptors as this user may have.
    struct rlimit limit;
    getrlimit(RLIMIT_NOFILE, &limit);
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);

    // Non-blocking connects: one the server's full backlog delays (its SYN retried a second
    // later) does not hold up the others. In batches, so that a server accepting as fast as it
    // can keeps up: past a full accept queue a connection is established on this side only,
    // and would cost the server nothing.
    int *fds = calloc(count, sizeof *fds);
    int opened = 0;
    for (; opened < count; opened++) {
        if (opened % 50 == 49) {
            struct timespec pause_10ms = {.tv_nsec = 10000000};
            nanosleep(&pause_10ms, NULL);
        }
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            perror("socket");
            break;
        }
        if (connect(fd, (struct sockaddr *)&address, sizeof address) != 0 &&
            errno != EINPROGRESS) {
            perror("connect");
            close(fd);
            break;
        }
        fds[opened] = fd;
    }
    // Established: those with a peer. Wait up to 5 s for the delayed ones.
    int held = 0;
    for (int waited_ms = 0; waited_ms <= 5000; waited_ms += 100) {
        held = 0;
        for (int i = 0; i < opened; i++) {
            struct sockaddr_in peer;
            socklen_t length = sizeof peer;
            held += getpeername(fds[i], (struct sockaddr *)&peer, &length) == 0;
        }
        if (held == opened) {
            break;
        }
        struct timespec pause_100ms = {.tv_nsec = 100000000};
        nanosleep(&pause_100ms, NULL);
    }
    printf("holding %d\n", held);
    fflush(stdout);
    for (;;) {
        pause();
    }
}
