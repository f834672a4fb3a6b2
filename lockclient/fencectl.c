/* fencectl.c — runs a command while the fencegate sidecar holds a lock for it (HTTP API client). */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef FG_VERSION
#define FG_VERSION "dev"
#endif

/* Exit codes, as documented in --help. 0..255 otherwise are the command's own. */
#define FCTL_EXIT_LOCKED   1   /* the lock is held by someone else after --wait */
#define FCTL_EXIT_USAGE    2   /* bad command line */
#define FCTL_EXIT_LOST     3   /* the lock was lost while the command ran */
#define FCTL_EXIT_UNAVAIL  4   /* sidecar unreachable, or it cannot grant locks now (503) */
#define FCTL_EXIT_REJECTED 5   /* 400, or an answer fencectl does not understand */
#define FCTL_EXIT_INTERNAL 125 /* fencectl itself failed (fork, memory) */
#define FCTL_EXIT_NOEXEC   126 /* COMMAND exists but cannot be run */
#define FCTL_EXIT_NOTFOUND 127 /* COMMAND not found */

/* Declared limits. */
#define FCTL_DEFAULT_HTTP    "127.0.0.1:8380"
#define FCTL_MAX_NAME        1024              /* bytes of a lock name */
#define FCTL_MAX_HEADERS     (16 * 1024)       /* status line and headers of a reply */
#define FCTL_MAX_BODY        (1024 * 1024)     /* body of a reply, after de-chunking */
#define FCTL_MAX_RAW         (3 * 1024 * 1024) /* bytes read for one reply, chunk framing included */
#define FCTL_MAX_MS          2147483647LL      /* largest --ttl / --wait */
#define FCTL_JSON_DEPTH      32                /* nesting fencectl follows in a reply */
#define FCTL_CONNECT_MS      3000              /* connect timeout */
#define FCTL_POST_SLACK_MS   15000             /* reply timeout of POST beyond --wait */
#define FCTL_DELETE_MS       5000              /* whole DELETE exchange */
#define FCTL_DEFAULT_TTL_MS  10000             /* when neither the reply nor --ttl gives one */
#define FCTL_MIN_CHECK_MS    200               /* shortest interval between lock checks */
#define FCTL_MAX_CHECK_IO_MS 2000              /* longest a single lock check may take */
#define FCTL_KILL_GRACE_MS   5000              /* SIGTERM to SIGKILL */
#define FCTL_MSG_MAX         512               /* error text kept from a reply */

/* Result of one HTTP exchange. */
enum fctl_net {
    FCTL_NET_OK = 0,
    FCTL_NET_UNREACHABLE = -1, /* no connection, reset, or timed out */
    FCTL_NET_BADREPLY = -2,    /* connected, but the reply is not HTTP we can read */
    FCTL_NET_INTERRUPTED = -3, /* a stop signal arrived while waiting */
};

struct fctl_addr {
    char host[256];
    char port[8];
    char text[300]; /* as given, for messages and the Host header */
};

struct fctl_reply {
    int status;
    char *body; /* NUL-terminated, owned; NULL when there is none */
    size_t len;
};

/* What a lock reply or error reply carried. */
struct fctl_answer {
    long long token; /* -1 if absent */
    long long ttl_ms;
    char error[64];
    char message[FCTL_MSG_MAX];
};

/* ---- Signals ------------------------------------------------------------------------------- */

static volatile sig_atomic_t fctl_child_pid;   /* 0 until the command runs */
static volatile sig_atomic_t fctl_child_pgrp;  /* its process group when it leads one, else 0 */
static volatile sig_atomic_t fctl_stop_signal; /* a stop signal that arrived before that */
static int fctl_wake[2] = {-1, -1};            /* self-pipe: signals wake the main loop */

/* Sends sig to the command: to its whole process group when it has one of its own, so that what
 * it started (a shell script's children) gets it too. Async-signal-safe. */
static void fctl_signal_command(int sig)
{
    pid_t pgrp = (pid_t)fctl_child_pgrp, child = (pid_t)fctl_child_pid;
    if (pgrp > 0)
        kill(-pgrp, sig);
    else if (child > 0)
        kill(child, sig);
}

/* Forwards SIGINT/SIGTERM/SIGHUP to the command, and wakes the main loop. When the command shares
 * fencectl's process group (the terminal's foreground group), a signal the kernel sent because of
 * the terminal (Ctrl-C) reached the command too, so it is not sent a second time. kill() and
 * write() are async-signal-safe. */
static void fctl_on_signal(int sig, siginfo_t *si, void *ctx)
{
    int saved = errno;
    (void)ctx;
    if (sig != SIGCHLD) {
        pid_t child = (pid_t)fctl_child_pid;
        if (child > 0) {
            if (fctl_child_pgrp > 0 || si == NULL || si->si_code != SI_KERNEL)
                fctl_signal_command(sig);
        } else {
            fctl_stop_signal = sig;
        }
    }
    if (fctl_wake[1] >= 0) {
        char b = (char)sig;
        ssize_t n = write(fctl_wake[1], &b, 1);
        (void)n; /* a full pipe already holds a wake-up */
    }
    errno = saved;
}

static const int fctl_forwarded[] = {SIGINT, SIGTERM, SIGHUP};

/* Installs the handlers. A signal that fencectl was started with ignored (nohup, a background
 * job) stays ignored, for fencectl and for the command. */
static int fctl_signals_install(void)
{
    struct sigaction sa;

    if (pipe2(fctl_wake, O_CLOEXEC | O_NONBLOCK) != 0)
        return -1;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = fctl_on_signal;
    sa.sa_flags = SA_SIGINFO; /* no SA_RESTART: poll() must return on a signal */
    sigemptyset(&sa.sa_mask);
    for (size_t i = 0; i < sizeof(fctl_forwarded) / sizeof(fctl_forwarded[0]); i++) {
        struct sigaction old;
        if (sigaction(fctl_forwarded[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN)
            continue;
        if (sigaction(fctl_forwarded[i], &sa, NULL) != 0)
            return -1;
    }
    sa.sa_flags = SA_SIGINFO | SA_NOCLDSTOP;
    if (sigaction(SIGCHLD, &sa, NULL) != 0)
        return -1;
    signal(SIGPIPE, SIG_IGN);
    return 0;
}

static void fctl_wake_drain(void)
{
    char b[64];
    while (read(fctl_wake[0], b, sizeof(b)) > 0)
        ;
}

/* ---- Small helpers ------------------------------------------------------------------------- */

static void fctl_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fctl_err(const char *fmt, ...)
{
    char line[2048];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    fprintf(stderr, "fencectl: %s\n", line);
    fflush(stderr);
}

static long long fctl_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Parses a whole decimal number of milliseconds in [0, FCTL_MAX_MS]. Returns 0 or -1. */
static int fctl_parse_ms(const char *s, long long *out)
{
    long long v = 0;

    if (*s == '\0')
        return -1;
    for (; *s != '\0'; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        v = v * 10 + (*s - '0');
        if (v > FCTL_MAX_MS)
            return -1;
    }
    *out = v;
    return 0;
}

/* Parses HOST:PORT or [V6]:PORT. Returns 0 or -1. */
static int fctl_parse_addr(const char *s, struct fctl_addr *a)
{
    const char *colon, *host = s;
    size_t hlen;
    long port = 0;

    if (strlen(s) >= sizeof(a->text))
        return -1;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (close == NULL || close[1] != ':')
            return -1;
        host = s + 1;
        hlen = (size_t)(close - host);
        colon = close + 1;
    } else {
        colon = strrchr(s, ':');
        if (colon == NULL || memchr(s, ':', (size_t)(colon - s)) != NULL)
            return -1;
        hlen = (size_t)(colon - s);
    }
    if (hlen == 0 || hlen >= sizeof(a->host) || colon[1] == '\0' || strlen(colon + 1) > 5)
        return -1;
    for (const char *p = colon + 1; *p != '\0'; p++) {
        if (*p < '0' || *p > '9')
            return -1;
        port = port * 10 + (*p - '0');
    }
    if (port < 1 || port > 65535)
        return -1;
    memcpy(a->host, host, hlen);
    a->host[hlen] = '\0';
    snprintf(a->port, sizeof(a->port), "%ld", port);
    snprintf(a->text, sizeof(a->text), "%s", s);
    return 0;
}

/* Percent-encodes name as one path segment: everything but RFC 3986's unreserved characters. */
static void fctl_path_encode(const char *name, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;

    for (const unsigned char *p = (const unsigned char *)name; *p != '\0'; p++) {
        if (o + 4 > cap)
            break;
        if (isalnum(*p) || *p == '-' || *p == '.' || *p == '_' || *p == '~') {
            out[o++] = (char)*p;
        } else {
            out[o++] = '%';
            out[o++] = hex[*p >> 4];
            out[o++] = hex[*p & 15];
        }
    }
    out[o] = '\0';
}

/* ---- HTTP/1.1 client ----------------------------------------------------------------------- */

/* Waits for events on fd until deadline. Returns 1 ready, 0 timed out, FCTL_NET_INTERRUPTED
 * when interruptible and a stop signal arrived. */
static int fctl_wait_fd(int fd, short events, long long deadline, int interruptible)
{
    for (;;) {
        struct pollfd p[2] = {{.fd = fd, .events = events}, {.fd = fctl_wake[0], .events = POLLIN}};
        long long left = deadline - fctl_now_ms();
        int rc;
        if (interruptible && fctl_stop_signal != 0)
            return FCTL_NET_INTERRUPTED;
        if (left <= 0)
            return 0;
        rc = poll(p, interruptible && fctl_wake[0] >= 0 ? 2 : 1,
                  (int)(left > INT_MAX ? INT_MAX : left));
        if (rc < 0 && errno != EINTR)
            return 0;
        if (rc > 0 && p[0].revents != 0)
            return 1;
        if (rc > 0 && p[1].revents != 0)
            fctl_wake_drain();
    }
}

/* Connects to a (any of its addresses) before deadline. Returns the socket, or -1 with err. */
static int fctl_connect(const struct fctl_addr *a, long long deadline, int interruptible,
                        int *interrupted, char *err, size_t errlen)
{
    struct addrinfo hints, *res = NULL;
    int gai, fd = -1, last_errno = ETIMEDOUT;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    gai = getaddrinfo(a->host, a->port, &hints, &res);
    if (gai != 0) {
        snprintf(err, errlen, "cannot resolve %s: %s", a->host, gai_strerror(gai));
        return -1;
    }
    for (struct addrinfo *ai = res; ai != NULL; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            last_errno = errno;
            continue;
        }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
            break;
        if (errno == EINPROGRESS) {
            int w = fctl_wait_fd(fd, POLLOUT, deadline, interruptible);
            int soerr = 0;
            socklen_t sl = sizeof(soerr);
            if (w == FCTL_NET_INTERRUPTED) {
                *interrupted = 1;
                close(fd);
                fd = -1;
                break;
            }
            if (w == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0)
                break;
            last_errno = w == 1 ? soerr : ETIMEDOUT;
        } else {
            last_errno = errno;
        }
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0 && !*interrupted)
        snprintf(err, errlen, "cannot connect to %s: %s", a->text, strerror(last_errno));
    return fd;
}

/* Case-insensitive prefix test for header names. */
static int fctl_header_is(const char *line, size_t len, const char *name)
{
    size_t n = strlen(name);
    return len > n && line[n] == ':' && strncasecmp(line, name, n) == 0;
}

/* Decodes a chunked body p[0..n) into out (cap bytes). Returns 1 when the last chunk and the
 * trailers are complete (*outlen set), 0 when more bytes are needed, -1 when malformed or larger
 * than cap. */
static int fctl_dechunk(const char *p, size_t n, char *out, size_t cap, size_t *outlen)
{
    size_t pos = 0, o = 0;

    for (;;) {
        const char *eol = memmem(p + pos, n - pos, "\r\n", 2);
        size_t size = 0, i = pos;
        if (eol == NULL)
            return n - pos > 1024 ? -1 : 0;
        if (i == (size_t)(eol - p) || !isxdigit((unsigned char)p[i]))
            return -1;
        for (; i < (size_t)(eol - p) && isxdigit((unsigned char)p[i]); i++) {
            int d = isdigit((unsigned char)p[i]) ? p[i] - '0'
                                                 : (tolower((unsigned char)p[i]) - 'a' + 10);
            if (size > (SIZE_MAX - 15) / 16)
                return -1;
            size = size * 16 + (size_t)d;
        }
        if (i < (size_t)(eol - p) && p[i] != ';' && p[i] != ' ' && p[i] != '\t')
            return -1;
        pos = (size_t)(eol - p) + 2;
        if (size == 0) {
            /* Trailer lines, then an empty line. */
            for (;;) {
                eol = memmem(p + pos, n - pos, "\r\n", 2);
                if (eol == NULL)
                    return n - pos > FCTL_MAX_HEADERS ? -1 : 0;
                if ((size_t)(eol - p) == pos) {
                    *outlen = o;
                    return 1;
                }
                pos = (size_t)(eol - p) + 2;
            }
        }
        if (size > cap - o)
            return -1;
        if (n - pos < size + 2)
            return 0;
        if (p[pos + size] != '\r' || p[pos + size + 1] != '\n')
            return -1;
        memcpy(out + o, p + pos, size);
        o += size;
        pos += size + 2;
    }
}

/* Parses the reply in raw[0..n) (eof: the peer has closed). Returns 1 with *r filled (the body
 * malloc'd), 0 when more bytes are needed, -1 with err when it is not a reply we can read. */
static int fctl_parse_reply(const char *raw, size_t n, int eof, struct fctl_reply *r, char *err,
                            size_t errlen)
{
    size_t start = 0;

    for (;;) {
        const char *end = memmem(raw + start, n - start, "\r\n\r\n", 4);
        const char *line, *next, *body;
        long long clen = -1;
        int chunked = 0, status;
        size_t hlen, have;

        if (end == NULL) {
            if (n - start > FCTL_MAX_HEADERS) {
                snprintf(err, errlen, "reply headers longer than %d bytes", FCTL_MAX_HEADERS);
                return -1;
            }
            if (eof) {
                snprintf(err, errlen, "connection closed before a complete reply");
                return -1;
            }
            return 0;
        }
        hlen = (size_t)(end - (raw + start)) + 4;
        if (hlen > FCTL_MAX_HEADERS) {
            snprintf(err, errlen, "reply headers longer than %d bytes", FCTL_MAX_HEADERS);
            return -1;
        }
        line = raw + start;
        if (hlen < 14 || strncmp(line, "HTTP/1.", 7) != 0 || !isdigit((unsigned char)line[7]) ||
            line[8] != ' ' || !isdigit((unsigned char)line[9]) ||
            !isdigit((unsigned char)line[10]) || !isdigit((unsigned char)line[11]) ||
            (line[12] != ' ' && line[12] != '\r')) {
            snprintf(err, errlen, "the reply is not HTTP/1.x");
            return -1;
        }
        status = (line[9] - '0') * 100 + (line[10] - '0') * 10 + (line[11] - '0');
        if (status < 100) {
            snprintf(err, errlen, "invalid HTTP status %d", status);
            return -1;
        }
        next = (const char *)memmem(line, hlen, "\r\n", 2) + 2;
        while (next < end + 2) {
            const char *eol = memmem(next, (size_t)(end + 2 - next), "\r\n", 2);
            size_t llen = (size_t)(eol - next);
            const char *v;
            if (fctl_header_is(next, llen, "content-length")) {
                long long x = 0;
                v = next + 15;
                while (v < eol && (*v == ' ' || *v == '\t'))
                    v++;
                if (v == eol)
                    x = -2;
                for (; v < eol && *v != ' ' && *v != '\t'; v++) {
                    if (!isdigit((unsigned char)*v) || x > FCTL_MAX_BODY) {
                        x = -2;
                        break;
                    }
                    x = x * 10 + (*v - '0');
                }
                if (x < 0 || (clen >= 0 && clen != x)) {
                    snprintf(err, errlen, "invalid Content-Length in the reply");
                    return -1;
                }
                clen = x;
            } else if (fctl_header_is(next, llen, "transfer-encoding")) {
                char te[64];
                size_t k = 0;
                for (v = next + 18; v < eol && k + 1 < sizeof(te); v++) {
                    if (*v != ' ' && *v != '\t')
                        te[k++] = (char)tolower((unsigned char)*v);
                }
                te[k] = '\0';
                if (strcmp(te, "chunked") != 0) {
                    snprintf(err, errlen, "unsupported Transfer-Encoding in the reply");
                    return -1;
                }
                chunked = 1;
            }
            next = eol + 2;
        }
        body = raw + start + hlen;
        have = n - start - hlen;
        if (status < 200) { /* 100 Continue and friends: the real reply follows */
            start += hlen;
            continue;
        }
        r->status = status;
        if (status == 204 || status == 304)
            clen = 0, chunked = 0;
        if (clen > FCTL_MAX_BODY) {
            snprintf(err, errlen, "reply body larger than %d bytes", FCTL_MAX_BODY);
            return -1;
        }
        if (chunked) {
            char *out = malloc(FCTL_MAX_BODY + 1);
            size_t olen = 0;
            int rc;
            if (out == NULL) {
                snprintf(err, errlen, "out of memory");
                return -1;
            }
            rc = fctl_dechunk(body, have, out, FCTL_MAX_BODY, &olen);
            if (rc <= 0) {
                free(out);
                if (rc < 0 || eof) {
                    snprintf(err, errlen, "%s",
                             rc < 0 ? "malformed chunked reply body"
                                    : "connection closed inside the reply body");
                    return -1;
                }
                return 0;
            }
            out[olen] = '\0';
            r->body = out;
            r->len = olen;
            return 1;
        }
        if (clen < 0) {
            if (!eof)
                return 0; /* the body runs to the end of the connection */
            clen = (long long)have;
            if (clen > FCTL_MAX_BODY) {
                snprintf(err, errlen, "reply body larger than %d bytes", FCTL_MAX_BODY);
                return -1;
            }
        }
        if (have < (size_t)clen) {
            if (eof) {
                snprintf(err, errlen, "connection closed inside the reply body");
                return -1;
            }
            return 0;
        }
        r->body = malloc((size_t)clen + 1);
        if (r->body == NULL) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        memcpy(r->body, body, (size_t)clen);
        r->body[clen] = '\0';
        r->len = (size_t)clen;
        return 1;
    }
}

/* One HTTP/1.1 exchange with Connection: close. body may be NULL (no body sent). The whole
 * exchange must end within timeout_ms. Returns FCTL_NET_OK with *r (free r->body), or an
 * enum fctl_net error with err. */
static int fctl_http(const struct fctl_addr *a, const char *method, const char *path,
                     const char *extra_headers, const char *body, int timeout_ms, int interruptible,
                     struct fctl_reply *r, char *err, size_t errlen)
{
    long long deadline = fctl_now_ms() + timeout_ms;
    long long cdeadline =
        deadline < fctl_now_ms() + FCTL_CONNECT_MS ? deadline : fctl_now_ms() + FCTL_CONNECT_MS;
    char req[FCTL_MAX_NAME * 3 + 1024];
    size_t blen = body != NULL ? strlen(body) : 0;
    char *raw = NULL;
    size_t n = 0, cap = 0, sent = 0, reqlen;
    int interrupted = 0, fd, rc = FCTL_NET_UNREACHABLE, eof = 0;
    int k;

    memset(r, 0, sizeof(*r));
    k = snprintf(req, sizeof(req),
                 "%s %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: fencectl/%s\r\n"
                 "Accept: application/json\r\nConnection: close\r\n%s",
                 method, path, a->text, FG_VERSION, extra_headers ? extra_headers : "");
    if (k < 0 || (size_t)k >= sizeof(req)) {
        snprintf(err, errlen, "request too long");
        return FCTL_NET_BADREPLY;
    }
    reqlen = (size_t)k;
    if (body != NULL)
        k = snprintf(req + reqlen, sizeof(req) - reqlen,
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s", blen, body);
    else
        k = snprintf(req + reqlen, sizeof(req) - reqlen, "\r\n");
    if (k < 0 || (size_t)k >= sizeof(req) - reqlen) {
        snprintf(err, errlen, "request too long");
        return FCTL_NET_BADREPLY;
    }
    reqlen += (size_t)k;

    fd = fctl_connect(a, cdeadline, interruptible, &interrupted, err, errlen);
    if (fd < 0)
        return interrupted ? FCTL_NET_INTERRUPTED : FCTL_NET_UNREACHABLE;

    while (sent < reqlen) {
        ssize_t w = send(fd, req + sent, reqlen - sent, MSG_NOSIGNAL);
        if (w > 0) {
            sent += (size_t)w;
            continue;
        }
        if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
            int wr = fctl_wait_fd(fd, POLLOUT, deadline, interruptible);
            if (wr == 1)
                continue;
            rc = wr == FCTL_NET_INTERRUPTED ? wr : FCTL_NET_UNREACHABLE;
            snprintf(err, errlen, "timed out sending to %s", a->text);
            goto out;
        }
        snprintf(err, errlen, "sending to %s: %s", a->text, strerror(errno));
        goto out;
    }

    for (;;) {
        int pr = fctl_parse_reply(raw != NULL ? raw : "", n, eof, r, err, errlen);
        if (pr > 0) {
            rc = FCTL_NET_OK;
            goto out;
        }
        if (pr < 0) {
            rc = n == 0 ? FCTL_NET_UNREACHABLE : FCTL_NET_BADREPLY;
            if (n == 0)
                snprintf(err, errlen, "%s closed the connection without replying", a->text);
            goto out;
        }
        if (cap - n < 16384) {
            size_t ncap = cap == 0 ? 32768 : cap * 2;
            char *nr;
            if (ncap > FCTL_MAX_RAW) {
                snprintf(err, errlen, "reply larger than %d bytes", FCTL_MAX_RAW);
                rc = FCTL_NET_BADREPLY;
                goto out;
            }
            nr = realloc(raw, ncap);
            if (nr == NULL) {
                snprintf(err, errlen, "out of memory");
                rc = FCTL_NET_BADREPLY;
                goto out;
            }
            raw = nr;
            cap = ncap;
        }
        ssize_t got = recv(fd, raw + n, cap - n, 0);
        if (got > 0) {
            n += (size_t)got;
            continue;
        }
        if (got == 0) {
            eof = 1;
            continue;
        }
        if (errno == EAGAIN || errno == EINTR) {
            int wr = fctl_wait_fd(fd, POLLIN, deadline, interruptible);
            if (wr == 1)
                continue;
            rc = wr == FCTL_NET_INTERRUPTED ? wr : FCTL_NET_UNREACHABLE;
            snprintf(err, errlen, "no reply from %s within %d ms", a->text, timeout_ms);
            goto out;
        }
        snprintf(err, errlen, "reading from %s: %s", a->text, strerror(errno));
        rc = FCTL_NET_UNREACHABLE;
        goto out;
    }
out:
    free(raw);
    close(fd);
    if (rc != FCTL_NET_OK) {
        free(r->body);
        memset(r, 0, sizeof(*r));
    }
    return rc;
}

/* ---- A small JSON reader for the sidecar's replies ----------------------------------------- */

/* fencectl is one self-contained file, so it reads the few reply shapes it needs with this
 * bounded recursive reader rather than linking the sidecar's own parser. */
struct fctl_json {
    const char *p;
    const char *end;
};

static void fctl_jws(struct fctl_json *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static int fctl_jpeek(struct fctl_json *j)
{
    fctl_jws(j);
    return j->p < j->end ? (unsigned char)*j->p : -1;
}

static int fctl_jexpect(struct fctl_json *j, char c)
{
    if (fctl_jpeek(j) != (unsigned char)c)
        return -1;
    j->p++;
    return 0;
}

/* Appends n bytes to out unless an earlier piece did not fit: a cut string ends cleanly. */
static void fctl_jemit(char *out, size_t cap, size_t *o, int *full, const unsigned char *b,
                       size_t n)
{
    if (out == NULL || *full)
        return;
    if (*o + n >= cap) {
        *full = 1;
        return;
    }
    memcpy(out + *o, b, n);
    *o += n;
}

static void fctl_jput(char *out, size_t cap, size_t *o, int *full, unsigned long cp)
{
    unsigned char b[4];
    size_t n;
    if (cp < 0x80) {
        b[0] = (unsigned char)cp;
        n = 1;
    } else if (cp < 0x800) {
        b[0] = (unsigned char)(0xC0 | (cp >> 6));
        b[1] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        b[0] = (unsigned char)(0xE0 | (cp >> 12));
        b[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        b[2] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        b[0] = (unsigned char)(0xF0 | (cp >> 18));
        b[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
        b[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        b[3] = (unsigned char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    fctl_jemit(out, cap, o, full, b, n);
}

static long fctl_jhex4(struct fctl_json *j)
{
    long v = 0;
    if (j->end - j->p < 4)
        return -1;
    for (int k = 0; k < 4; k++) {
        int c = (unsigned char)j->p[k];
        if (!isxdigit(c))
            return -1;
        v = v * 16 + (isdigit(c) ? c - '0' : tolower(c) - 'a' + 10);
    }
    j->p += 4;
    return v;
}

/* Reads a string into out (cap bytes, NUL-terminated). out may be NULL to skip it. Returns 0,
 * 1 when the text was cut to fit, or -1 when it is not a JSON string. */
static int fctl_jstring(struct fctl_json *j, char *out, size_t cap)
{
    size_t o = 0;
    int full = 0;

    if (fctl_jexpect(j, '"') != 0)
        return -1;
    while (j->p < j->end && *j->p != '"') {
        unsigned char c = (unsigned char)*j->p++;
        if (c < 0x20)
            return -1;
        if (c != '\\') {
            fctl_jemit(out, cap, &o, &full, &c, 1);
            continue;
        }
        if (j->p >= j->end)
            return -1;
        c = (unsigned char)*j->p++;
        switch (c) {
        case 'b':
            c = '\b';
            break;
        case 'f':
            c = '\f';
            break;
        case 'n':
            c = '\n';
            break;
        case 'r':
            c = '\r';
            break;
        case 't':
            c = '\t';
            break;
        case '"':
        case '\\':
        case '/':
            break;
        case 'u': {
            long cp = fctl_jhex4(j);
            if (cp < 0 || (cp >= 0xDC00 && cp <= 0xDFFF))
                return -1;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                long lo;
                if (j->end - j->p < 2 || j->p[0] != '\\' || j->p[1] != 'u')
                    return -1;
                j->p += 2;
                lo = fctl_jhex4(j);
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return -1;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            fctl_jput(out, cap, &o, &full, (unsigned long)cp);
            continue;
        }
        default:
            return -1;
        }
        fctl_jemit(out, cap, &o, &full, &c, 1);
    }
    if (j->p >= j->end)
        return -1;
    j->p++;
    if (out != NULL && cap > 0)
        out[o] = '\0';
    return full;
}

/* Reads an integer (no fraction, no exponent) that fits in a long long. Returns 0 or -1. */
static int fctl_jint(struct fctl_json *j, long long *v)
{
    int neg = 0;
    unsigned long long x = 0;
    const char *start;

    fctl_jws(j);
    if (j->p < j->end && *j->p == '-') {
        neg = 1;
        j->p++;
    }
    start = j->p;
    while (j->p < j->end && isdigit((unsigned char)*j->p)) {
        unsigned d = (unsigned)(*j->p - '0');
        if (x > (ULLONG_MAX - d) / 10 || x * 10 + d > (unsigned long long)LLONG_MAX)
            return -1;
        x = x * 10 + d;
        j->p++;
    }
    if (j->p == start || (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E')))
        return -1;
    *v = neg ? -(long long)x : (long long)x;
    return 0;
}

/* Skips one value of any type. Returns 0 or -1. */
static int fctl_jskip(struct fctl_json *j, int depth)
{
    int c = fctl_jpeek(j);

    if (depth > FCTL_JSON_DEPTH)
        return -1;
    if (c == '"')
        return fctl_jstring(j, NULL, 0) < 0 ? -1 : 0;
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->p++;
        if (fctl_jpeek(j) == close) {
            j->p++;
            return 0;
        }
        for (;;) {
            if (c == '{' && (fctl_jstring(j, NULL, 0) < 0 || fctl_jexpect(j, ':') != 0))
                return -1;
            if (fctl_jskip(j, depth + 1) != 0)
                return -1;
            if (fctl_jpeek(j) == ',') {
                j->p++;
                continue;
            }
            return fctl_jexpect(j, close);
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        if (c == '-')
            j->p++;
        while (j->p < j->end && (isdigit((unsigned char)*j->p) || *j->p == '.' || *j->p == 'e' ||
                                 *j->p == 'E' || *j->p == '+' || *j->p == '-'))
            j->p++;
        return 0;
    }
    for (int k = 0; k < 3; k++) {
        static const char *const words[3] = {"true", "false", "null"};
        size_t n = strlen(words[k]);
        if ((size_t)(j->end - j->p) >= n && memcmp(j->p, words[k], n) == 0) {
            j->p += n;
            return 0;
        }
    }
    return -1;
}

/* Reads the object of a lock reply or an error reply into *ans. Returns 0 or -1. */
static int fctl_parse_answer(const char *body, size_t len, struct fctl_answer *ans)
{
    struct fctl_json j = {body, body + len};
    char key[64];

    ans->token = -1;
    ans->ttl_ms = -1;
    ans->error[0] = '\0';
    ans->message[0] = '\0';
    if (body == NULL || fctl_jexpect(&j, '{') != 0)
        return -1;
    if (fctl_jpeek(&j) == '}') {
        j.p++;
        return 0;
    }
    for (;;) {
        int rc;
        if (fctl_jstring(&j, key, sizeof(key)) < 0 || fctl_jexpect(&j, ':') != 0)
            return -1;
        if (!strcmp(key, "token"))
            rc = fctl_jint(&j, &ans->token);
        else if (!strcmp(key, "ttl_ms"))
            rc = fctl_jint(&j, &ans->ttl_ms);
        else if (!strcmp(key, "error") && fctl_jpeek(&j) == '"')
            rc = fctl_jstring(&j, ans->error, sizeof(ans->error));
        else if (!strcmp(key, "message") && fctl_jpeek(&j) == '"')
            rc = fctl_jstring(&j, ans->message, sizeof(ans->message));
        else
            rc = fctl_jskip(&j, 1);
        if (rc < 0)
            return -1;
        if (fctl_jpeek(&j) == ',') {
            j.p++;
            continue;
        }
        return fctl_jexpect(&j, '}');
    }
}

/* What GET /v1/locks says about our lock. */
enum fctl_lock_view { FCTL_VIEW_HELD, FCTL_VIEW_MISSING, FCTL_VIEW_LOST, FCTL_VIEW_OTHER_TOKEN };

/* Reads {"locks":[{"name","token","state","remaining_ms",...},...]} and finds name. Returns 0 with
 * *view (and, when held, *remaining_ms: -1 when the entry has none), or -1 when the body is not
 * that shape. */
static int fctl_parse_locks(const char *body, size_t len, const char *name, long long token,
                            enum fctl_lock_view *view, long long *seen_token,
                            long long *remaining_ms)
{
    struct fctl_json j = {body, body + len};
    char key[64];
    int found = 0;

    *view = FCTL_VIEW_MISSING;
    if (body == NULL || fctl_jexpect(&j, '{') != 0)
        return -1;
    if (fctl_jpeek(&j) == '}')
        return -1; /* no "locks" member */
    for (;;) {
        if (fctl_jstring(&j, key, sizeof(key)) < 0 || fctl_jexpect(&j, ':') != 0)
            return -1;
        if (strcmp(key, "locks") != 0) {
            if (fctl_jskip(&j, 1) != 0)
                return -1;
        } else {
            found = 1;
            if (fctl_jexpect(&j, '[') != 0)
                return -1;
            if (fctl_jpeek(&j) == ']') {
                j.p++;
            } else {
                for (;;) {
                    char lname[FCTL_MAX_NAME + 8];
                    char state[32] = "";
                    long long t = -1, rem = -1;
                    int named = 0;
                    if (fctl_jexpect(&j, '{') != 0)
                        return -1;
                    while (fctl_jpeek(&j) != '}') {
                        int rc;
                        if (fctl_jstring(&j, key, sizeof(key)) < 0 || fctl_jexpect(&j, ':') != 0)
                            return -1;
                        if (!strcmp(key, "name")) {
                            rc = fctl_jstring(&j, lname, sizeof(lname));
                            named = rc == 0; /* a cut name is longer than any of ours */
                        } else if (!strcmp(key, "token")) {
                            rc = fctl_jint(&j, &t);
                        } else if (!strcmp(key, "remaining_ms") && fctl_jpeek(&j) != '"') {
                            rc = fctl_jint(&j, &rem);
                        } else if (!strcmp(key, "state") && fctl_jpeek(&j) == '"') {
                            rc = fctl_jstring(&j, state, sizeof(state));
                        } else {
                            rc = fctl_jskip(&j, 3);
                        }
                        if (rc < 0)
                            return -1;
                        if (fctl_jpeek(&j) == ',')
                            j.p++;
                        else if (fctl_jpeek(&j) != '}')
                            return -1;
                    }
                    j.p++;
                    if (named && !strcmp(lname, name)) {
                        /* Our token wins over any other entry of the same name. */
                        if (t == token && *view != FCTL_VIEW_HELD) {
                            *view = strcmp(state, "held") == 0 ? FCTL_VIEW_HELD : FCTL_VIEW_LOST;
                            *remaining_ms = rem;
                        } else if (*view == FCTL_VIEW_MISSING) {
                            *view = FCTL_VIEW_OTHER_TOKEN;
                            *seen_token = t;
                        }
                    }
                    if (fctl_jpeek(&j) == ',') {
                        j.p++;
                        continue;
                    }
                    if (fctl_jexpect(&j, ']') != 0)
                        return -1;
                    break;
                }
            }
        }
        if (fctl_jpeek(&j) == ',') {
            j.p++;
            continue;
        }
        if (fctl_jexpect(&j, '}') != 0)
            return -1;
        return found ? 0 : -1;
    }
}

/* ---- Command line -------------------------------------------------------------------------- */

static const char fctl_help[] =
    "usage: fencectl [--http HOST:PORT] lock NAME [--ttl MS] [--wait MS] -- COMMAND [ARGS...]\n"
    "       fencectl --help | --version\n"
    "\n"
    "Runs COMMAND while the fencegate sidecar holds the distributed lock NAME, and hands the\n"
    "command the lock's fencing token.\n"
    "\n"
    "  --http HOST:PORT  the sidecar's HTTP endpoint (default 127.0.0.1:8380; the environment\n"
    "                    variable FENCEGATE_HTTP, else FENCEGATE_HTTP_ADDR, which the injector\n"
    "                    sets in application containers, overrides the default; this flag\n"
    "                    overrides both)\n"
    "  --ttl MS          lease of the lock in milliseconds (default: the sidecar's session TTL)\n"
    "  --wait MS         wait up to MS milliseconds for a lock held by someone else\n"
    "                    (default: the sidecar's, which tries once)\n"
    "\n"
    "How it works:\n"
    "  1. POST /v1/locks/NAME asks the sidecar for the lock. The lock is held by the sidecar's "
    "own\n"
    "     session: renewed by the sidecar while it runs, released by fencectl after COMMAND\n"
    "     ends (DELETE), or released by the sidecar when the sidecar gets SIGTERM.\n"
    "  2. COMMAND runs with FENCE_TOKEN=<token> and FENCE_LOCK=<NAME> in its environment. Pass\n"
    "     the token with every write (for example through the sidecar's fenced endpoints), so\n"
    "     that a store rejects writes from a holder that has lost the lock. COMMAND runs in a\n"
    "     process group of its own, so that signals reach what it starts too; but when fencectl\n"
    "     runs in the foreground of a terminal, COMMAND stays in fencectl's group (so that it can\n"
    "     read the terminal and gets Ctrl-C), and only COMMAND itself is signalled. SIGINT,\n"
    "     SIGTERM and SIGHUP sent to fencectl are forwarded to COMMAND('s group).\n"
    "  3. While COMMAND runs, fencectl checks the lock (GET /v1/locks) every TTL/3, but not\n"
    "     more often than every 200 ms, and at once when the sidecar's event stream of the lock\n"
    "     (GET /v1/events?lock=NAME) carries anything, so that a loss the sidecar sees stops\n"
    "     COMMAND within a round trip (without a stream, as past the sidecar's 64, only the\n"
    "     periodic checks are made). If the lock is lost (gone, marked lost, or held under\n"
    "     another token), or the sidecar does not confirm it before the lease it last reported\n"
    "     (remaining_ms) runs out (fail safe: the sidecar is down, frozen or unreadable),\n"
    "     COMMAND('s group) gets SIGTERM, then SIGKILL 5 seconds later if it is still running,\n"
    "     and fencectl exits with status 3 (non-zero) once COMMAND is gone; what is left of its\n"
    "     group then is killed at once. A lost lock is not released: by then the name may\n"
    "     belong to a newer holder.\n"
    "  4. When COMMAND exits, fencectl releases the lock and exits with COMMAND's status. If\n"
    "     the sidecar answers that the lock was no longer held (HTTP 404, or 409: held under\n"
    "     another token), it was lost after the last check, maybe while COMMAND ran: fencectl\n"
    "     exits with status 3. A release that fails otherwise is only a warning: without an\n"
    "     answer the sidecar keeps the lock until its session ends; after HTTP 503 (the backend\n"
    "     was not reached) the backend deletes the lock once it is reached again, and at worst\n"
    "     the lease runs out.\n"
    "  5. If fencectl itself dies without doing this (SIGKILL, the OOM killer), a guardian\n"
    "     process it started with COMMAND (in a process group of its own) stops COMMAND('s\n"
    "     group) as for a lost lock and releases the lock under its token.\n"
    "\n"
    "Exit status:\n"
    "  0..255  COMMAND's own exit status; 128+N when COMMAND was killed by signal N\n"
    "  1       the lock is held by someone else (HTTP 409), after --wait\n"
    "  2       usage error\n"
    "  3       the lock was lost while COMMAND ran; COMMAND was signalled, or (when the\n"
    "          release found it lost) had ended\n"
    "  4       the sidecar is unreachable (connection refused, timeout) or cannot grant the\n"
    "          lock now (HTTP 503: its lock backend is unavailable, it is shutting down,\n"
    "          the application's health check fails, or its HTTP clients hold 10000 locks)\n"
    "  5       the sidecar rejected the request (HTTP 400) or answered something unexpected\n"
    "  125     fencectl itself failed (for example, fork failed)\n"
    "  126     COMMAND was found but could not be run\n"
    "  127     COMMAND was not found\n"
    "Codes 1-5 and 125-127 can also be COMMAND's own; stderr tells them apart.\n";

struct fctl_args {
    struct fctl_addr addr;
    const char *name;
    long long ttl_ms;  /* -1: not given */
    long long wait_ms; /* -1: not given */
    char **command;
};

static int fctl_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fctl_usage_error(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr,
            "fencectl: %s\nusage: fencectl [--http HOST:PORT] lock NAME [--ttl MS] "
            "[--wait MS] -- COMMAND [ARGS...]\n(see fencectl --help)\n",
            msg);
    return FCTL_EXIT_USAGE;
}

/* Reads the value of option opt at argv[*i] ("--opt V" or "--opt=V"). Returns it or NULL. */
static const char *fctl_opt_value(int argc, char **argv, int *i, const char *opt)
{
    size_t n = strlen(opt);
    if (strncmp(argv[*i], opt, n) != 0)
        return NULL;
    if (argv[*i][n] == '=')
        return argv[*i] + n + 1;
    if (argv[*i][n] != '\0' || *i + 1 >= argc)
        return NULL;
    return argv[++*i];
}

static int fctl_is_opt(const char *arg, const char *opt)
{
    size_t n = strlen(opt);
    return strncmp(arg, opt, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

/* Parses the command line. Returns -1 to go on, or an exit status (0 for --help/--version). */
static int fctl_parse_args(int argc, char **argv, struct fctl_args *a)
{
    const char *http = NULL, *v;
    int i = 1;

    memset(a, 0, sizeof(*a));
    a->ttl_ms = a->wait_ms = -1;
    for (int k = 1; k < argc && strcmp(argv[k], "--") != 0; k++) {
        if (!strcmp(argv[k], "--help") || !strcmp(argv[k], "-h")) {
            fputs(fctl_help, stdout);
            return 0;
        }
        if (!strcmp(argv[k], "--version") || !strcmp(argv[k], "-V")) {
            printf("fencectl %s\n", FG_VERSION);
            return 0;
        }
    }
    for (; i < argc; i++) {
        if (fctl_is_opt(argv[i], "--http")) {
            if ((http = fctl_opt_value(argc, argv, &i, "--http")) == NULL)
                return fctl_usage_error("--http needs HOST:PORT");
            if (fctl_parse_addr(http, &a->addr) != 0) /* here, not as a stray word later */
                return fctl_usage_error("--http '%s' is not HOST:PORT", http);
            continue;
        }
        break;
    }
    if (i >= argc)
        return fctl_usage_error("missing the 'lock' subcommand");
    if (strcmp(argv[i], "lock") != 0)
        return fctl_usage_error("unknown subcommand or option '%s'", argv[i]);
    if (++i >= argc || argv[i][0] == '\0' || !strcmp(argv[i], "--"))
        return fctl_usage_error("lock needs a NAME");
    if (fctl_is_opt(argv[i], "--ttl") || fctl_is_opt(argv[i], "--wait") ||
        fctl_is_opt(argv[i], "--http"))
        return fctl_usage_error("lock needs a NAME before its options (got '%s')", argv[i]);
    a->name = argv[i++];
    if (strlen(a->name) > FCTL_MAX_NAME)
        return fctl_usage_error("lock name longer than %d bytes", FCTL_MAX_NAME);
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        if (fctl_is_opt(argv[i], "--ttl")) {
            if ((v = fctl_opt_value(argc, argv, &i, "--ttl")) == NULL ||
                fctl_parse_ms(v, &a->ttl_ms) != 0)
                return fctl_usage_error("--ttl needs a whole number of milliseconds (0..%lld)",
                                        FCTL_MAX_MS);
        } else if (fctl_is_opt(argv[i], "--wait")) {
            if ((v = fctl_opt_value(argc, argv, &i, "--wait")) == NULL ||
                fctl_parse_ms(v, &a->wait_ms) != 0)
                return fctl_usage_error("--wait needs a whole number of milliseconds (0..%lld)",
                                        FCTL_MAX_MS);
        } else if (fctl_is_opt(argv[i], "--http")) {
            if ((http = fctl_opt_value(argc, argv, &i, "--http")) == NULL)
                return fctl_usage_error("--http needs HOST:PORT");
            if (fctl_parse_addr(http, &a->addr) != 0)
                return fctl_usage_error("--http '%s' is not HOST:PORT", http);
        } else {
            return fctl_usage_error("unexpected '%s' (put '--' before COMMAND)", argv[i]);
        }
    }
    if (i >= argc)
        return fctl_usage_error("missing '-- COMMAND'");
    if (i + 1 >= argc || argv[i + 1][0] == '\0')
        return fctl_usage_error("missing COMMAND after '--'");
    a->command = argv + i + 1;
    if (http == NULL) {
        const char *var = "FENCEGATE_HTTP", *env = getenv(var);
        if (env == NULL || env[0] == '\0')
            env = getenv(var = "FENCEGATE_HTTP_ADDR"); /* set by the injector */
        http = env != NULL && env[0] != '\0' ? env : FCTL_DEFAULT_HTTP;
        if (fctl_parse_addr(http, &a->addr) != 0)
            return fctl_usage_error("%s='%s' is not HOST:PORT", var, http);
    } else if (fctl_parse_addr(http, &a->addr) != 0) {
        return fctl_usage_error("--http '%s' is not HOST:PORT", http);
    }
    return -1;
}

/* ---- Lock life cycle ----------------------------------------------------------------------- */

/* Builds the path of the lock: /v1/locks/<percent-encoded name>. */
static void fctl_lock_path(const char *name, char *out, size_t cap)
{
    int k = snprintf(out, cap, "/v1/locks/");
    if (k > 0 && (size_t)k < cap)
        fctl_path_encode(name, out + k, cap - (size_t)k);
}

/* Asks for the lock. Returns -1 with *token and *ttl_ms on success, or an exit status. */
static int fctl_acquire(const struct fctl_args *a, const char *path, long long *token,
                        long long *ttl_ms)
{
    char body[128];
    char err[512];
    struct fctl_reply r;
    struct fctl_answer ans;
    long long timeout = (a->wait_ms > 0 ? a->wait_ms : 0) + FCTL_POST_SLACK_MS;
    int rc, parsed;

    snprintf(body, sizeof(body), "{");
    if (a->ttl_ms >= 0)
        snprintf(body + strlen(body), sizeof(body) - strlen(body), "\"ttl_ms\":%lld", a->ttl_ms);
    if (a->wait_ms >= 0)
        snprintf(body + strlen(body), sizeof(body) - strlen(body), "%s\"wait_ms\":%lld",
                 a->ttl_ms >= 0 ? "," : "", a->wait_ms);
    snprintf(body + strlen(body), sizeof(body) - strlen(body), "}");

    rc = fctl_http(&a->addr, "POST", path, NULL, body, (int)(timeout > INT_MAX ? INT_MAX : timeout),
                   1, &r, err, sizeof(err));
    if (rc == FCTL_NET_INTERRUPTED) {
        fctl_err("interrupted while asking for lock %s", a->name);
        return 128 + (int)fctl_stop_signal;
    }
    if (rc == FCTL_NET_UNREACHABLE) {
        fctl_err("sidecar unavailable: %s (is fencegate running? see --http / FENCEGATE_HTTP)",
                 err);
        return FCTL_EXIT_UNAVAIL;
    }
    if (rc != FCTL_NET_OK) {
        fctl_err("unexpected answer from the sidecar at %s: %s", a->addr.text, err);
        return FCTL_EXIT_REJECTED;
    }
    parsed = fctl_parse_answer(r.body, r.len, &ans);
    free(r.body);
    if (r.status == 200 && parsed == 0 && ans.token >= 0) {
        *token = ans.token;
        *ttl_ms = ans.ttl_ms;
        return -1;
    }
    switch (r.status) {
    case 409:
        fctl_err("lock %s is held by someone else%s%s", a->name, ans.message[0] ? ": " : "",
                 ans.message);
        return FCTL_EXIT_LOCKED;
    case 503: /* the backend is down, the sidecar is stopping, the application is unhealthy, or
               * the HTTP session holds its most locks: the sidecar's message says which */
        fctl_err("sidecar at %s cannot take lock %s now: %s", a->addr.text, a->name,
                 ans.message[0] ? ans.message : "HTTP 503");
        return FCTL_EXIT_UNAVAIL;
    case 400:
        fctl_err("the sidecar rejected the request for lock %s%s%s", a->name,
                 ans.message[0] ? ": " : "", ans.message);
        return FCTL_EXIT_REJECTED;
    case 200:
        fctl_err("unexpected answer from the sidecar at %s: HTTP 200 without a token",
                 a->addr.text);
        return FCTL_EXIT_REJECTED;
    default:
        fctl_err("unexpected answer from the sidecar at %s: HTTP %d%s%s%s%s", a->addr.text,
                 r.status, ans.error[0] ? " " : "", ans.error, ans.message[0] ? ": " : "",
                 ans.message);
        return FCTL_EXIT_REJECTED;
    }
}

/* Releases the lock. Returns 1 when the sidecar says the lock was no longer ours (404 not held,
 * 409 held under another token): it was lost before the release, maybe while the command ran.
 * Otherwise 0; a release that fails (no answer, 503) is only a warning: the lock was still held,
 * and the sidecar's backend deletes it once it can, at worst when its lease runs out. */
static int fctl_release(const struct fctl_args *a, const char *path, long long token)
{
    char err[512], hdr[64];
    struct fctl_reply r;
    int rc, lost = 0;

    /* The token header lets a sidecar refuse to release a newer holder's lock of the same name. */
    snprintf(hdr, sizeof(hdr), "Fencing-Token: %lld\r\n", token);
    rc = fctl_http(&a->addr, "DELETE", path, hdr, NULL, FCTL_DELETE_MS, 0, &r, err, sizeof(err));
    if (rc != FCTL_NET_OK) {
        fctl_err("warning: could not release lock %s (token %lld): %s; it stays held until the "
                 "sidecar's session ends",
                 a->name, token, err);
        return 0;
    }
    if (r.status == 404 || r.status == 409) {
        fctl_err("lock %s (token %lld) was lost before it was released (the sidecar answered HTTP "
                 "%d: %s), maybe while the command ran",
                 a->name, token, r.status,
                 r.status == 404 ? "not held" : "held under another token");
        lost = 1;
    } else if (r.status < 200 || r.status > 299)
        fctl_err("warning: releasing lock %s (token %lld): the sidecar answered HTTP %d", a->name,
                 token, r.status);
    free(r.body);
    return lost;
}

/* Checks the lock once. Returns 1 held (*remaining_ms: the lease left as the sidecar counts it,
 * -1 when it did not say), 0 lost (logged), -1 could not tell (err says why). */
static int fctl_check(const struct fctl_args *a, long long token, int timeout_ms,
                      long long *remaining_ms, char *err, size_t errlen)
{
    struct fctl_reply r;
    enum fctl_lock_view view;
    long long other = -1;
    int rc = fctl_http(&a->addr, "GET", "/v1/locks", NULL, NULL, timeout_ms, 0, &r, err, errlen);

    if (rc != FCTL_NET_OK)
        return -1;
    if (r.status != 200) {
        snprintf(err, errlen, "GET /v1/locks answered HTTP %d", r.status);
        free(r.body);
        return -1;
    }
    rc = fctl_parse_locks(r.body, r.len, a->name, token, &view, &other, remaining_ms);
    free(r.body);
    if (rc != 0) {
        snprintf(err, errlen, "GET /v1/locks answered something unexpected");
        return -1;
    }
    switch (view) {
    case FCTL_VIEW_HELD:
        return 1;
    case FCTL_VIEW_MISSING:
        fctl_err("the sidecar no longer lists lock %s", a->name);
        return 0;
    case FCTL_VIEW_LOST:
        fctl_err("the sidecar reports lock %s (token %lld) as lost", a->name, token);
        return 0;
    default:
        fctl_err("lock %s is now held under token %lld, not %lld", a->name, other, token);
        return 0;
    }
}

/* Opens the sidecar's event stream of the lock (GET /v1/events?lock=NAME) on a non-blocking
 * socket. fencectl does not parse it: whatever arrives (an event, the stream's end) only makes it
 * check the lock at once (GET /v1/locks decides), so a lost lock is noticed within a round trip
 * rather than at the next periodic check. Returns the socket, or -1. */
static int fctl_events_open(const struct fctl_args *a, int timeout_ms)
{
    char req[FCTL_MAX_NAME * 3 + 512], enc[FCTL_MAX_NAME * 3 + 1], err[512];
    int interrupted = 0, fd, k;

    fctl_path_encode(a->name, enc, sizeof(enc));
    k = snprintf(req, sizeof(req),
                 "GET /v1/events?lock=%s HTTP/1.1\r\nHost: %s\r\nUser-Agent: fencectl/%s\r\n"
                 "Accept: text/event-stream\r\n\r\n",
                 enc, a->addr.text, FG_VERSION);
    if (k < 0 || (size_t)k >= sizeof(req))
        return -1;
    fd = fctl_connect(&a->addr, fctl_now_ms() + timeout_ms, 0, &interrupted, err, sizeof(err));
    if (fd < 0)
        return -1;
    if (send(fd, req, (size_t)k, MSG_NOSIGNAL) != (ssize_t)k) { /* fits an empty socket */
        close(fd);
        return -1;
    }
    return fd;
}

/* Whether fencectl runs in the foreground of its controlling terminal (an interactive shell, or a
 * script run from one). The command then stays in fencectl's process group: a group of its own
 * would not be the terminal's foreground group, so it would be stopped when it reads the terminal,
 * and Ctrl-C would not reach it. Elsewhere (cron, a Kubernetes Job, systemd, a background job)
 * there is no such terminal, and the command gets a process group of its own. */
static int fctl_terminal_foreground(void)
{
    int fd = open("/dev/tty", O_RDWR | O_NOCTTY | O_CLOEXEC);
    int fg;

    if (fd < 0)
        return 0;
    fg = tcgetpgrp(fd) == getpgrp();
    close(fd);
    return fg;
}

/* Starts the command, in a process group of its own unless fencectl is in the foreground of a
 * terminal. Returns its pid, or -1 (fork failed). */
static pid_t fctl_spawn(const struct fctl_args *a, long long token)
{
    sigset_t block, old;
    pid_t pid;
    int own_group = !fctl_terminal_foreground();

    sigemptyset(&block);
    for (size_t i = 0; i < sizeof(fctl_forwarded) / sizeof(fctl_forwarded[0]); i++)
        sigaddset(&block, fctl_forwarded[i]);
    sigaddset(&block, SIGCHLD);
    /* Blocked across fork, so that a signal in between is forwarded once the pid is known. */
    sigprocmask(SIG_BLOCK, &block, &old);
    pid = fork();
    if (pid == 0) {
        char tok[32];
        struct sigaction dfl;
        memset(&dfl, 0, sizeof(dfl));
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        for (size_t i = 0; i < sizeof(fctl_forwarded) / sizeof(fctl_forwarded[0]); i++) {
            struct sigaction cur;
            if (sigaction(fctl_forwarded[i], NULL, &cur) == 0 && cur.sa_handler != SIG_IGN)
                sigaction(fctl_forwarded[i], &dfl, NULL);
        }
        sigaction(SIGCHLD, &dfl, NULL);
        signal(SIGPIPE, SIG_DFL);
        if (own_group)
            setpgid(0, 0);
        sigprocmask(SIG_SETMASK, &old, NULL);
        snprintf(tok, sizeof(tok), "%lld", token);
        if (setenv("FENCE_TOKEN", tok, 1) != 0 || setenv("FENCE_LOCK", a->name, 1) != 0) {
            fctl_err("cannot set the command's environment: %s", strerror(errno));
            _exit(FCTL_EXIT_INTERNAL);
        }
        execvp(a->command[0], a->command);
        int e = errno;
        if (e == ENOENT) {
            fctl_err("%s: command not found", a->command[0]);
            _exit(FCTL_EXIT_NOTFOUND);
        }
        fctl_err("cannot run %s: %s", a->command[0], strerror(e));
        _exit(FCTL_EXIT_NOEXEC);
    }
    if (pid > 0) {
        /* Both sides set the group, so that it exists before either goes on. */
        if (own_group && (setpgid(pid, pid) == 0 || errno == EACCES))
            fctl_child_pgrp = (sig_atomic_t)pid;
        fctl_child_pid = (sig_atomic_t)pid;
        if (fctl_stop_signal != 0) /* arrived after the lock was granted, before the fork */
            fctl_signal_command((int)fctl_stop_signal);
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    return pid;
}

/* ---- The guardian ---------------------------------------------------------------------------
 *
 * fencectl can die without its clean-up: SIGKILL (the OOM killer, kill -9), a crash. The command
 * would go on with nobody watching the lock, and the sidecar, whose session holds the lock, would
 * renew it for as long as it runs: the name blocked for every other holder. So once the command
 * runs, a guardian process waits on a pipe whose write end only fencectl holds. fencectl writes
 * a byte before it exits; an end of file without it means fencectl is gone, and the guardian
 * does what fencectl would have: stops the command('s group), SIGTERM then SIGKILL after the
 * grace as for a lost lock, and releases the lock under its token. */

static int fctl_guard_fd = -1; /* fencectl's end of the pipe; -1 without a guardian */
static pid_t fctl_guard_pid;

/* Whether pid exists and is not a zombie (an orphan's zombie may wait long to be reaped). */
static int fctl_pid_running(pid_t pid)
{
    char path[64], buf[512];
    ssize_t n;
    int fd;

    if (kill(pid, 0) != 0 && errno == ESRCH)
        return 0;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno != ENOENT; /* no /proc: trust kill() */
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    const char *end = strrchr(buf, ')'); /* the name in parentheses may hold anything */
    return end == NULL || end[1] != ' ' || end[2] != 'Z';
}

static void fctl_guard_run(int fd, const struct fctl_args *a, const char *path, long long token,
                           pid_t pid, pid_t pgrp) __attribute__((noreturn));
static void fctl_guard_run(int fd, const struct fctl_args *a, const char *path, long long token,
                           pid_t pid, pid_t pgrp)
{
    const int quiet[] = {SIGINT, SIGTERM, SIGHUP, SIGTTOU, SIGPIPE};
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    char b;
    ssize_t n;

    /* A group of its own: Ctrl-C, or a kill of fencectl's group, is not meant for it. Only
     * stderr stays: a reader of fencectl's output sees its end when fencectl's is. */
    setpgid(0, 0);
    if (null >= 0) {
        dup2(null, STDIN_FILENO);
        dup2(null, STDOUT_FILENO);
        close(null);
    }
    for (size_t i = 0; i < sizeof(quiet) / sizeof(quiet[0]); i++)
        signal(quiet[i], SIG_IGN);
    signal(SIGCHLD, SIG_DFL);
    close(fctl_wake[0]);
    close(fctl_wake[1]);
    fctl_wake[0] = fctl_wake[1] = -1;
    while ((n = read(fd, &b, 1)) < 0 && errno == EINTR)
        ;
    if (n == 1)
        _exit(0); /* fencectl finished and did its own clean-up */
    fctl_err("fencectl ended without releasing lock %s (token %lld); stopping %s and releasing "
             "the lock",
             a->name, token, a->command[0]);
    kill(pgrp > 0 ? -pgrp : pid, SIGTERM);
    for (long long end = fctl_now_ms() + FCTL_KILL_GRACE_MS;
         fctl_pid_running(pid) && fctl_now_ms() < end;)
        poll(NULL, 0, 50);
    if (fctl_pid_running(pid))
        fctl_err("%s did not exit %d s after SIGTERM; sending SIGKILL", a->command[0],
                 FCTL_KILL_GRACE_MS / 1000);
    kill(pgrp > 0 ? -pgrp : pid, SIGKILL); /* the command, or what is left of its group */
    for (long long end = fctl_now_ms() + 1000; fctl_pid_running(pid) && fctl_now_ms() < end;)
        poll(NULL, 0, 20);
    (void)fctl_release(a, path, token);
    _exit(0);
}

/* Starts the guardian of the running command; without one (fork failed) fencectl goes on. */
static void fctl_guard_start(const struct fctl_args *a, const char *path, long long token,
                             pid_t pid, pid_t pgrp)
{
    int p[2];
    pid_t g;

    if (pipe2(p, O_CLOEXEC) != 0) {
        fctl_err("warning: no guardian for lock %s: pipe: %s", a->name, strerror(errno));
        return;
    }
    g = fork();
    if (g == 0) {
        close(p[1]);
        fctl_guard_run(p[0], a, path, token, pid, pgrp);
    }
    close(p[0]);
    if (g < 0) {
        fctl_err("warning: no guardian for lock %s: fork: %s", a->name, strerror(errno));
        close(p[1]);
        return;
    }
    fctl_guard_fd = p[1];
    fctl_guard_pid = g;
}

/* Tells the guardian that fencectl has done its own clean-up, and reaps it. */
static void fctl_guard_stop(void)
{
    char b = 0;

    if (fctl_guard_fd < 0)
        return;
    if (write(fctl_guard_fd, &b, 1) != 1)
        kill(fctl_guard_pid, SIGKILL); /* it must not release what fencectl has dealt with */
    close(fctl_guard_fd);
    fctl_guard_fd = -1;
    while (waitpid(fctl_guard_pid, NULL, 0) < 0 && errno == EINTR)
        ;
}

/* Runs the command under the lock and watches the lock until the command is gone. Returns
 * fencectl's exit status. */
static int fctl_run(const struct fctl_args *a, const char *path, long long token, long long ttl)
{
    long long interval = ttl / 3 > FCTL_MIN_CHECK_MS ? ttl / 3 : FCTL_MIN_CHECK_MS;
    int io_ms = (int)(interval < FCTL_MAX_CHECK_IO_MS ? interval : FCTL_MAX_CHECK_IO_MS);
    long long now = fctl_now_ms();
    /* lease_end: when the lease last confirmed by the sidecar runs out, counted from the moment
     * that check was sent. Without a newer confirmation by then, the lock may belong to someone
     * else (a sidecar that is frozen or gone renews nothing). */
    long long lease_end = now + ttl, next_check = now + interval, kill_at = -1;
    long long last_check = now, events_retry = now;
    int lost = 0, warned = 0, status = 0, events = -1, events_ok = 0;
    pid_t pid = fctl_spawn(a, token);

    if (pid < 0) {
        fctl_err("cannot start %s: fork: %s", a->command[0], strerror(errno));
        (void)fctl_release(a, path, token);
        return FCTL_EXIT_INTERNAL;
    }
    fctl_guard_start(a, path, token, pid, (pid_t)fctl_child_pgrp);
    /* Each pass waits for a signal or the next deadline, so the loop sleeps between checks and
     * ends when the command has been reaped. */
    for (;;) {
        siginfo_t si;
        int wr;
        memset(&si, 0, sizeof(si));
        /* WNOWAIT: the command stays a zombie, so its process group id cannot be reused while
         * what is left of the group is killed. */
        wr = waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT);
        if (wr == 0 && si.si_pid == pid) {
            pid_t pgrp = (pid_t)fctl_child_pgrp;
            fctl_child_pid = 0;
            fctl_child_pgrp = 0;
            /* The lock is lost: nothing the command started may go on running without it. */
            if (lost && pgrp > 0)
                kill(-pgrp, SIGKILL);
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
                ;
            break;
        }
        if (wr < 0 && errno != EINTR) {
            fctl_err("waitpid: %s", strerror(errno));
            status = 0;
            break;
        }
        now = fctl_now_ms();
        if (lost && kill_at >= 0 && now >= kill_at) {
            fctl_err("%s did not exit %d s after SIGTERM; sending SIGKILL", a->command[0],
                     FCTL_KILL_GRACE_MS / 1000);
            fctl_signal_command(SIGKILL);
            kill_at = -1;
        }
        if (!lost && events < 0 && now >= events_retry) {
            events = fctl_events_open(a, io_ms);
            events_ok = 0;
            now = fctl_now_ms();
            events_retry = now + interval; /* when it fails or ends: not more often than checks */
        }
        if (!lost && (now >= next_check || now >= lease_end)) {
            char err[512] = "";
            long long sent = now, remaining = -1;
            last_check = now;
            int held =
                now < lease_end ? fctl_check(a, token, io_ms, &remaining, err, sizeof(err)) : -1;
            now = fctl_now_ms();
            next_check = now + interval;
            if (held == 1) {
                lease_end = sent + (remaining >= 0 ? remaining : ttl);
                /* Ask again before that lease runs out, in case the sidecar renewed it. */
                if (next_check > lease_end - io_ms)
                    next_check = lease_end - io_ms > now + FCTL_MIN_CHECK_MS
                                     ? lease_end - io_ms
                                     : now + FCTL_MIN_CHECK_MS;
                if (warned)
                    fctl_err("sidecar at %s reachable again; lock %s still held", a->addr.text,
                             a->name);
                warned = 0;
            } else if (held < 0) {
                if (!warned && now < lease_end)
                    fctl_err("warning: cannot check lock %s: %s", a->name, err);
                warned = 1;
                if (now >= lease_end) {
                    fctl_err("the sidecar did not confirm lock %s before the lease it last "
                             "reported ran out%s%s; assuming it is lost",
                             a->name, err[0] ? ": " : "", err);
                    held = 0;
                }
            }
            if (held == 0) {
                fctl_err("lock %s (token %lld) was lost; stopping %s", a->name, token,
                         a->command[0]);
                lost = 1;
                fctl_signal_command(SIGTERM);
                kill_at = now + FCTL_KILL_GRACE_MS;
            }
            continue; /* reap at once if the command is already gone */
        }
        long long until = lost ? (kill_at >= 0 ? kill_at : now + 1000)
                               : (next_check < lease_end ? next_check : lease_end);
        if (!lost && events < 0 && events_retry < until)
            until = events_retry;
        struct pollfd p[2] = {{.fd = fctl_wake[0], .events = POLLIN},
                              {.fd = events, .events = POLLIN}};
        long long left = until - now;
        if (left < 0)
            left = 0;
        if (poll(p, events >= 0 ? 2 : 1, (int)(left > INT_MAX ? INT_MAX : left)) <= 0)
            continue;
        if (p[0].revents != 0)
            fctl_wake_drain();
        if (events >= 0 && p[1].revents != 0) {
            char buf[4096];
            ssize_t n = recv(events, buf, sizeof(buf), MSG_DONTWAIT);
            if (n < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
            if (n > 0 && !events_ok) {
                /* The answer's first bytes: a stream (200), or none to be had. A sidecar without
                 * one (404, 405) is not asked again; 503 (too many streams) is, later. */
                events_ok =
                    n >= 12 && memcmp(buf, "HTTP/1.", 7) == 0 && memcmp(buf + 8, " 200", 4) == 0;
                if (!events_ok) {
                    if (n >= 12 &&
                        (memcmp(buf + 8, " 404", 4) == 0 || memcmp(buf + 8, " 405", 4) == 0))
                        events_retry = LLONG_MAX;
                    close(events);
                    events = -1;
                    continue;
                }
                const char *hend = memmem(buf, (size_t)n, "\r\n\r\n", 4);
                if (hend == NULL || hend + 4 == buf + n)
                    continue; /* only the headers: nothing has happened yet */
            }
            if (n <= 0) { /* the stream ended: the sidecar stops, or restarted */
                close(events);
                events = -1;
            }
            /* Something happened to the lock or the sidecar: check now (at most every 200 ms). */
            if (!lost)
                next_check =
                    last_check + FCTL_MIN_CHECK_MS > now ? last_check + FCTL_MIN_CHECK_MS : now;
        }
    }
    if (events >= 0)
        close(events);
    fctl_child_pid = 0;
    fctl_child_pgrp = 0;
    if (lost)
        return FCTL_EXIT_LOST; /* not released: a newer holder may own the name now */
    if (fctl_release(a, path, token)) {
        if (WIFEXITED(status))
            fctl_err("%s exited with status %d; exiting 3 (lock lost)", a->command[0],
                     WEXITSTATUS(status));
        else if (WIFSIGNALED(status))
            fctl_err("%s was killed by signal %d; exiting 3 (lock lost)", a->command[0],
                     WTERMSIG(status));
        return FCTL_EXIT_LOST;
    }
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return FCTL_EXIT_INTERNAL;
}

int main(int argc, char **argv)
{
    struct fctl_args a;
    char path[16 + FCTL_MAX_NAME * 3];
    long long token = -1, ttl = -1;
    int rc = fctl_parse_args(argc, argv, &a);

    if (rc >= 0)
        return rc;
    if (fctl_signals_install() != 0) {
        fctl_err("cannot install signal handlers: %s", strerror(errno));
        return FCTL_EXIT_INTERNAL;
    }
    fctl_lock_path(a.name, path, sizeof(path));
    rc = fctl_acquire(&a, path, &token, &ttl);
    if (rc >= 0)
        return rc;
    if (fctl_stop_signal != 0) {
        /* Stopped while the lock was being granted: give it back and do not run the command. */
        (void)fctl_release(&a, path, token);
        return 128 + (int)fctl_stop_signal;
    }
    if (ttl <= 0)
        ttl = a.ttl_ms > 0 ? a.ttl_ms : FCTL_DEFAULT_TTL_MS;
    rc = fctl_run(&a, path, token, ttl);
    fctl_guard_stop();
    return rc;
}
