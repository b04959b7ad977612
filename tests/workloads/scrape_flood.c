// A local user's attack on an HTTP endpoint: for SECONDS, keeps up to COUNT connections to
// HOST:PORT, each sending pipelined `GET /metrics` requests as fast as the server takes them and
// reading every answer; a connection the server closes is opened again at once. Prints one line
// at the end: "connections N answers A bytes B" (A: `HTTP/1.1 200` status lines read). Used by
// tests/tests/security_endpoints.rs against the daemon's /metrics.
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static const char REQUEST[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
static const char STATUS[] = "HTTP/1.1 200";

static struct sockaddr_in address;
static int epoll_fd;
static long connections;

struct connection {
    int fd;
    size_t matched;  // bytes of STATUS matched so far ('H' starts it only)
};

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static int open_one(struct connection *c) {
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    c->matched = 0;
    if (c->fd < 0) {
        return -1;
    }
    if (connect(c->fd, (struct sockaddr *)&address, sizeof address) != 0 && errno != EINPROGRESS) {
        close(c->fd);
        c->fd = -1;
        return -1;
    }
    struct epoll_event event = {.events = EPOLLIN | EPOLLOUT, .data.ptr = c};
    epoll_ctl(epoll_fd, EPOLL_CTL_ADD, c->fd, &event);
    connections++;
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s HOST PORT COUNT SECONDS\n", argv[0]);
        return 2;
    }
    address.sin_family = AF_INET;
    address.sin_port = htons(atoi(argv[2]));
    if (inet_pton(AF_INET, argv[1], &address.sin_addr) != 1) {
        fprintf(stderr, "bad address %s\n", argv[1]);
        return 2;
    }
    int count = atoi(argv[3]);
    double end = now() + atof(argv[4]);
    // As many descriptors as this user may have.
    struct rlimit limit;
    getrlimit(RLIMIT_NOFILE, &limit);
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
    if ((rlim_t)count + 16 > limit.rlim_cur) {
        count = (int)limit.rlim_cur - 16;
    }

    // Many requests in one write: the server finds them pipelined.
    static char requests[64 * (sizeof REQUEST - 1)];
    for (size_t i = 0; i < 64; i++) {
        memcpy(requests + i * (sizeof REQUEST - 1), REQUEST, sizeof REQUEST - 1);
    }
    static char buffer[1 << 16];
    epoll_fd = epoll_create1(0);
    struct connection *all = calloc(count, sizeof *all);
    for (int i = 0; i < count; i++) {
        open_one(&all[i]);
    }
    long answers = 0;
    long long bytes = 0;
    struct epoll_event events[256];
    while (now() < end) {
        int ready = epoll_wait(epoll_fd, events, 256, 100);
        for (int i = 0; i < ready; i++) {
            struct connection *c = events[i].data.ptr;
            int closed = (events[i].events & (EPOLLERR | EPOLLHUP)) != 0;
            if (events[i].events & EPOLLOUT) {
                if (send(c->fd, requests, sizeof requests, MSG_NOSIGNAL) < 0 && errno != EAGAIN) {
                    closed = 1;
                }
            }
            if (events[i].events & EPOLLIN) {
                for (;;) {
                    ssize_t n = recv(c->fd, buffer, sizeof buffer, 0);
                    if (n == 0 || (n < 0 && errno != EAGAIN)) {
                        closed = 1;
                        break;
                    }
                    if (n < 0) {
                        break;
                    }
                    bytes += n;
                    for (ssize_t j = 0; j < n; j++) {
                        if (buffer[j] == STATUS[c->matched]) {
                            if (++c->matched == sizeof STATUS - 1) {
                                answers++;
                                c->matched = 0;
                            }
                        } else {
                            c->matched = buffer[j] == STATUS[0];
                        }
                    }
                }
            }
            if (closed) {
                epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c->fd, NULL);
                close(c->fd);
                open_one(c);
            }
        }
    }
    printf("connections %ld answers %ld bytes %lld\n", connections, answers, bytes);
    return 0;
}
