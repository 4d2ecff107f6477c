/*
 * What this machine's kernel charges for the operations an agent's join is
 * made of, without kvlane: a process forked and reaped, a thread started and
 * joined (with and without a malloc of its own, which gives it a glibc
 * arena), fresh anonymous pages touched, a loopback TCP connection opened
 * and accepted, a 64-byte round trip on it, and one "join-shaped" child:
 * 9 threads that each malloc and touch 64 KiB, and 10 connections to a
 * listener here, each with one round trip. The composite's CPU against
 * bench/etcd_scale's "CPU of one agent process until joined" says how much
 * of an agent's join is the machine's price for these operations (see
 * docs/performance.md, etcd section). Last, the price of a system call
 * (getppid) on each CPU the process may run on: on a VM whose vCPUs are not
 * alike, a row heavy in system calls measures the vCPU it landed on
 * (docs/performance.md, session 20). Medians of many runs.
 *
 *   build/bench/os_costs [reps]
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t median(uint64_t *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_u64);
    return v[n / 2];
}

static void *idle_thread(void *arg)
{
    return arg;
}

static void *malloc_thread(void *arg)
{
    size_t len = arg ? 64 * 1024 : 256;
    char *p = malloc(len);
    if (p != NULL)
        memset(p, 1, len);
    free(p);
    return NULL;
}

/* A listening loopback socket and its port. */
static int listener(uint16_t *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof(sa);
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || listen(fd, 128) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &sl) != 0)
        return -1;
    *port = ntohs(sa.sin_port);
    return fd;
}

static int dial(uint16_t port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

/* Echo 64-byte messages on every accepted connection (a thread each). */
static void *echo_conn(void *arg)
{
    int fd = (int)(intptr_t)arg, one = 1;
    char buf[64];
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_WAITALL);
        if (n <= 0 || send(fd, buf, (size_t)n, 0) != n)
            break;
    }
    close(fd);
    return NULL;
}

static void *echo_server(void *arg)
{
    int lfd = (int)(intptr_t)arg;
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0)
            return NULL;
        pthread_t t;
        if (pthread_create(&t, NULL, echo_conn, (void *)(intptr_t)fd) == 0)
            pthread_detach(t);
        else
            close(fd);
    }
}

static int round_trip(int fd)
{
    char buf[64] = {1};
    return send(fd, buf, sizeof(buf), 0) == (ssize_t)sizeof(buf) &&
                   recv(fd, buf, sizeof(buf), MSG_WAITALL) == (ssize_t)sizeof(buf)
               ? 0
               : -1;
}

static uint64_t cpu_us(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (uint64_t)ru.ru_utime.tv_sec * 1000000u + (uint64_t)ru.ru_utime.tv_usec +
           (uint64_t)ru.ru_stime.tv_sec * 1000000u + (uint64_t)ru.ru_stime.tv_usec;
}

/* The join-shaped child: its CPU (us) through a pipe. */
static void composite_child(uint16_t port, int out)
{
    pthread_t th[9];
    int fds[10];
    uint64_t c;
    for (int i = 0; i < 9; i++)
        if (pthread_create(&th[i], NULL, malloc_thread, (void *)1) != 0)
            _exit(2);
    for (int i = 0; i < 10; i++)
        if ((fds[i] = dial(port)) < 0 || round_trip(fds[i]) != 0)
            _exit(3);
    for (int i = 0; i < 9; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 10; i++)
        close(fds[i]);
    c = cpu_us();
    if (write(out, &c, sizeof(c)) != (ssize_t)sizeof(c))
        _exit(4);
    _exit(0);
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 200;
    if (reps < 10 || reps > 100000) {
        fprintf(stderr, "usage: os_costs [reps, 10..100000]\n");
        return 2;
    }
    uint64_t *v = calloc((size_t)reps, sizeof(uint64_t));
    if (v == NULL)
        return 1;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    printf("os_costs: %d reps, %ld CPUs; medians\n", reps, ncpu);

    for (int r = 0; r < reps; r++) {
        uint64_t t0 = now_ns();
        pid_t p = fork();
        if (p == 0)
            _exit(0);
        waitpid(p, NULL, 0);
        v[r] = now_ns() - t0;
    }
    printf("%-52s %9.1f us\n", "fork + exit + waitpid", (double)median(v, reps) / 1e3);

    for (int r = 0; r < reps; r++) {
        pthread_t t;
        uint64_t t0 = now_ns();
        if (pthread_create(&t, NULL, idle_thread, NULL) != 0)
            return 1;
        pthread_join(t, NULL);
        v[r] = now_ns() - t0;
    }
    printf("%-52s %9.1f us\n", "pthread_create + join (empty thread)", (double)median(v, reps) / 1e3);

    for (int r = 0; r < reps; r++) {
        pthread_t t;
        uint64_t t0 = now_ns();
        if (pthread_create(&t, NULL, malloc_thread, (void *)1) != 0)
            return 1;
        pthread_join(t, NULL);
        v[r] = now_ns() - t0;
    }
    printf("%-52s %9.1f us\n", "the same, the thread mallocs and touches 64 KiB",
           (double)median(v, reps) / 1e3);

    const size_t pages = 256;
    for (int r = 0; r < reps; r++) {
        char *m = mmap(NULL, pages * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
        if (m == MAP_FAILED)
            return 1;
        uint64_t t0 = now_ns();
        for (size_t i = 0; i < pages; i++)
            m[i * 4096] = 1;
        v[r] = (now_ns() - t0) / pages;
        munmap(m, pages * 4096);
    }
    printf("%-52s %9.3f us\n", "first touch of an anonymous 4 KiB page",
           (double)median(v, reps) / 1e3);

    uint16_t port;
    int lfd = listener(&port);
    pthread_t srv;
    if (lfd < 0 || pthread_create(&srv, NULL, echo_server, (void *)(intptr_t)lfd) != 0)
        return 1;
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = now_ns();
        int fd = dial(port);
        if (fd < 0 || round_trip(fd) != 0)
            return 1;
        close(fd);
        v[r] = now_ns() - t0;
    }
    printf("%-52s %9.1f us\n", "loopback TCP: connect, accept (a thread), 64 B round trip",
           (double)median(v, reps) / 1e3);
    int fd = dial(port);
    for (int r = 0; r < reps && fd >= 0; r++) {
        uint64_t t0 = now_ns();
        if (round_trip(fd) != 0)
            return 1;
        v[r] = now_ns() - t0;
    }
    close(fd);
    printf("%-52s %9.1f us\n", "loopback TCP: 64 B round trip on a kept connection",
           (double)median(v, reps) / 1e3);

    int n = reps / 10 < 10 ? 10 : reps / 10;
    for (int r = 0; r < n; r++) {
        int pf[2];
        if (pipe(pf) != 0)
            return 1;
        pid_t p = fork();
        if (p == 0) {
            close(pf[0]);
            composite_child(port, pf[1]);
        }
        close(pf[1]);
        uint64_t c = 0;
        if (read(pf[0], &c, sizeof(c)) != (ssize_t)sizeof(c))
            return 1;
        close(pf[0]);
        waitpid(p, NULL, 0);
        v[r] = c;
    }
    printf("%-52s %9.2f ms\n", "join-shaped child (9 threads, 10 connections): CPU",
           (double)median(v, n) / 1e3);

    cpu_set_t all, one;
    if (sched_getaffinity(0, sizeof(all), &all) != 0)
        return 0;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &all))
            continue;
        CPU_ZERO(&one);
        CPU_SET(c, &one);
        if (sched_setaffinity(0, sizeof(one), &one) != 0)
            continue;
        for (int r = 0; r < reps; r++) {
            uint64_t t0 = now_ns();
            for (int k = 0; k < 100; k++)
                (void)getppid();
            v[r] = (now_ns() - t0) / 100;
        }
        char what[64];
        snprintf(what, sizeof(what), "a system call (getppid) on CPU %d", c);
        printf("%-52s %9.3f us\n", what, (double)median(v, reps) / 1e3);
    }
    (void)sched_setaffinity(0, sizeof(all), &all);
    return 0;
}
