/* test_util.h — helpers the C integration tests share: the clock, free loopback ports, removing a
 * temporary directory, and running a libevent loop until a flag is set or a deadline passes, or
 * for a while, timing its turns.
 * Header-only (static functions): each test is one program. */
#ifndef FG_TEST_UTIL_H
#define FG_TEST_UTIL_H

#include <errno.h>
#include <event2/event.h>
#include <ftw.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static inline int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* A TCP port on 127.0.0.1 that nothing listens on now, or -1. */
static inline int free_port(void)
{
    struct sockaddr_in a;
    socklen_t al = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &al) != 0) {
        close(fd);
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

static inline int test_rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* Removes dir and everything below it (best effort). */
static inline void rm_tree(const char *dir)
{
    nftw(dir, test_rm_entry, 8, FTW_DEPTH | FTW_PHYS);
}

/* Starts argv[0] (found on PATH) as a child that dies with the test however the test ends:
 * stdin from /dev/null, stdout and stderr appended to log (or /dev/null when log is NULL).
 * Returns its pid, or -1. */
static inline pid_t spawn_server(char *const argv[], const char *log)
{
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
        _exit(1);
    int devnull = open("/dev/null", O_RDWR);
    int out = log ? open(log, O_WRONLY | O_CREAT | O_APPEND, 0600) : devnull;
    if (devnull >= 0)
        dup2(devnull, 0);
    if (out >= 0) {
        dup2(out, 1);
        dup2(out, 2);
    }
    execvp(argv[0], argv);
    _exit(127);
}

/* Waits (up to 5 s) for the child *pid to exit and reaps it; *pid becomes 0. */
static inline void proc_reap(pid_t *pid)
{
    int64_t end = now_ms() + 5000;
    while (*pid > 0 && now_ms() < end) {
        pid_t w = waitpid(*pid, NULL, WNOHANG);
        if (w == *pid || (w < 0 && errno == ECHILD)) {
            *pid = 0;
            return;
        }
        sleep_ms(5);
    }
}

/* Kills the child *pid (SIGKILL works on a stopped one too) and reaps it. */
static inline void proc_kill(pid_t *pid)
{
    if (*pid <= 0)
        return;
    kill(*pid, SIGKILL);
    proc_reap(pid);
}

/* Runs base's loop for ms; returns the longest one turn of it took (a test keeps a short timer
 * armed, so that a turn normally ends within its period). */
static inline int64_t run_for_worst(struct event_base *base, int ms)
{
    int64_t end = now_ms() + ms, worst = 0;
    while (now_ms() < end) {
        int64_t t0 = now_ms();
        event_base_loop(base, EVLOOP_ONCE);
        if (now_ms() - t0 > worst)
            worst = now_ms() - t0;
    }
    return worst;
}

/* Runs base's loop until *flag >= want or timeout_ms passed; returns 1 if the flag got there.
 * The loop must have a timer ticking (EVLOOP_ONCE returns only after an event). */
static inline int loop_until(struct event_base *base, const int *flag, int want, int timeout_ms)
{
    int64_t end = now_ms() + timeout_ms;
    while (*flag < want && now_ms() < end)
        event_base_loop(base, EVLOOP_ONCE);
    return *flag >= want;
}

/* Runs base's loop for ms milliseconds. */
static inline void loop_for(struct event_base *base, int ms)
{
    int64_t end = now_ms() + ms;
    while (now_ms() < end)
        event_base_loop(base, EVLOOP_ONCE);
}

#endif
