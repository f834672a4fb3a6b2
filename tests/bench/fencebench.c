/* fencebench.c — load generator for fencegate's locks and fenced writes (thread per connection).
 * Build: cc -O2 -pthread -I proxy tests/bench/fencebench.c proxy/fence.c */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "fence.h" /* fencegate's own fencing scripts, sent straight to Redis by script-set,
                      group-set and txn-set: built with proxy/fence.c */

#define FB_MAX_CONNS     1000
#define FB_MAX_PIPELINE  1024
#define FB_MAX_LOCKS     100000 /* locks one connection may hold in hold mode */
#define FB_MAX_SECONDS   3600
#define FB_READ_BUF      65536                   /* one reply larger than this is refused */
#define FB_CMD_MAX       4096                    /* upper bound of one encoded command */
#define FB_MAX_ELEMS     32                      /* elements of a reply array we accept */
#define FB_MAX_GROUP     16                      /* writes of one group-set call */
#define FB_MAX_ARGS      (5 + 10 * FB_MAX_GROUP) /* a group-set call of FB_MAX_GROUP writes */
#define FB_MAX_DEPTH     4                       /* nesting of arrays in a reply */
#define FB_IO_TIMEOUT_S  10 /* a send or receive that blocks longer is a failure */
#define FB_NAME_MAX      160
#define FB_MAX_LATENCIES 1000000 /* acquire round trips recorded per connection (--latency) */
#define FB_ERR_MAX       240
#define FB_DEFAULT_TTL   10000        /* fencegate's default --session-ttl-ms */
#define FB_PREFIX        "fencegate:" /* fencegate's default backend key prefix */

/* The same SET NX PX + INCR script fencegate's Redis backend runs to acquire (see
 * lockclient/lock_redis.c). KEYS: lock, counter. ARGV: owner, ttl. Returns {1, token} or
 * {0, holder's pttl}. */
static const char fb_acquire_script[] =
    "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then\n"
    "  return {1, redis.call('INCR', KEYS[2])}\n"
    "end\n"
    "if redis.call('GET', KEYS[1]) == ARGV[1] then\n"
    "  redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
    "  return {1, redis.call('INCR', KEYS[2])}\n"
    "end\n"
    "return {0, redis.call('PTTL', KEYS[1])}\n";

/* The same owner-checked release script fencegate's Redis backend runs. KEYS: locks. ARGV:
 * owner, lock key prefix, channel prefix. Returns how many were ours and deleted. */
static const char fb_release_script[] =
    "local n = 0\n"
    "for _, k in ipairs(KEYS) do\n"
    "  if redis.call('GET', k) == ARGV[1] then\n"
    "    redis.call('DEL', k)\n"
    "    redis.call('PUBLISH', ARGV[3] .. string.sub(k, #ARGV[2] + 1), 'released')\n"
    "    n = n + 1\n"
    "  end\n"
    "end\n"
    "return n\n";

enum fb_mode {
    FB_SET,
    FB_FENCED_SET,
    FB_SCRIPT_SET,
    FB_GROUP_SET,
    FB_TXN_SET,
    FB_ACQUIRE_RELEASE,
    FB_ACQUIRE_SCRIPT,
    FB_HOLD
};

static const char *const fb_mode_names[] = {
    "set",     "fenced-set",      "script-set",     "group-set",
    "txn-set", "acquire-release", "acquire-script", "hold"};

struct fb_opts {
    char host[64];
    int port;
    int conns;
    int pipeline;
    long seconds;
    uint64_t requests; /* 0: no cap */
    enum fb_mode mode;
    long locks;    /* hold mode: locks per connection */
    int gate;      /* hold mode: wait for SIGUSR1 between connecting and acquiring */
    int latency;   /* cycle modes, pipeline 1: record each acquire's round trip */
    long keyspace; /* distinct keys per connection for SET */
    long ttl_ms;   /* acquire-script lease */
    char prefix[64];
};

/* One decoded reply: its type byte and, for arrays, the first elements' types and integers. */
struct fb_reply {
    char type;
    long long integer;
    const char *str; /* simple string, error or bulk: points into the read buffer */
    size_t len;
    long long nelem;
    long long nok; /* elements that are +OK */
    char elem_type[2];
    long long elem_int[2];
};

struct fb_conn {
    int id;
    int fd;
    char *rbuf;
    size_t rpos, rlen;
    char *wbuf;
    size_t wlen, wcap;
    uint64_t ops, errors, seq;
    uint64_t last_token;
    uint64_t cmd_index; /* cycle modes: even = acquire next, odd = release next */
    int failed;
    char err[FB_ERR_MAX];
    struct timespec end;
    char lock[FB_NAME_MAX];
    char lock_key[FB_NAME_MAX + 32];
    char token_key[FB_NAME_MAX + 32];
    char hwm_key[FB_NAME_MAX + 32];
    char owner[64];
    char token[24]; /* script-set: the token its writes carry */
    char sha[48];   /* script-set: the write script's SHA-1, from SCRIPT LOAD */
    uint32_t *lat;  /* --latency: microseconds of each acquire's round trip */
    size_t nlat;
};

static struct fb_opts fb_opt;
static struct fb_conn *fb_conns;
static atomic_uint_fast64_t fb_total_ops;
static struct timespec fb_deadline;
static pthread_barrier_t fb_start;

static double fb_secs(const struct timespec *t)
{
    return (double)t->tv_sec + (double)t->tv_nsec / 1e9;
}

static int fb_before(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

/* Records the first error of a connection; later ones only count. */
static void fb_note(struct fb_conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void fb_note(struct fb_conn *c, const char *fmt, ...)
{
    va_list ap;

    if (c->err[0])
        return;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof(c->err), fmt, ap);
    va_end(ap);
}

/* ---- RESP encoding ---------------------------------------------------------------------------
 */

/* Appends one command as a RESP array. Returns 0, or -1 when it would pass the buffer's cap. */
static int fb_cmd(struct fb_conn *c, int argc, const char *const *argv)
{
    char head[32];
    int n;

    if (argc < 1 || argc > FB_MAX_ARGS)
        return -1;
    n = snprintf(head, sizeof(head), "*%d\r\n", argc);
    if (c->wlen + (size_t)n > c->wcap)
        return -1;
    memcpy(c->wbuf + c->wlen, head, (size_t)n);
    c->wlen += (size_t)n;
    for (int i = 0; i < argc; i++) {
        size_t len = strlen(argv[i]);
        n = snprintf(head, sizeof(head), "$%zu\r\n", len);
        if (c->wlen + (size_t)n + len + 2 > c->wcap)
            return -1;
        memcpy(c->wbuf + c->wlen, head, (size_t)n);
        c->wlen += (size_t)n;
        memcpy(c->wbuf + c->wlen, argv[i], len);
        c->wlen += len;
        memcpy(c->wbuf + c->wlen, "\r\n", 2);
        c->wlen += 2;
    }
    return 0;
}

/* ---- RESP decoding ---------------------------------------------------------------------------
 */

/* Parses a decimal integer of exactly n bytes. Returns 0 or -1. */
static int fb_int(const char *p, size_t n, long long *out)
{
    long long v = 0;
    int neg = 0;
    size_t i = 0;

    if (n > 0 && p[0] == '-') {
        neg = 1;
        i = 1;
    }
    if (i == n || n - i > 18)
        return -1;
    for (; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return -1;
        v = v * 10 + (p[i] - '0');
    }
    *out = neg ? -v : v;
    return 0;
}

/* Decodes one reply from p[0..n). Returns 1 with *used set, 0 when more bytes are needed, or -1
 * on malformed input. Only what the benchmark checks is kept in r. */
static int fb_parse(const char *p, size_t n, int depth, struct fb_reply *r, size_t *used)
{
    const char *crlf;
    size_t line, off;
    long long v;

    if (n < 3)
        return 0;
    crlf = memmem(p + 1, n - 1, "\r\n", 2);
    if (!crlf)
        return n >= FB_READ_BUF ? -1 : 0;
    line = (size_t)(crlf - p);
    off = line + 2;
    memset(r, 0, sizeof(*r));
    r->type = p[0];
    switch (p[0]) {
    case '+':
    case '-':
        r->str = p + 1;
        r->len = line - 1;
        *used = off;
        return 1;
    case ':':
        if (fb_int(p + 1, line - 1, &r->integer) < 0)
            return -1;
        *used = off;
        return 1;
    case '$':
        if (fb_int(p + 1, line - 1, &v) < 0 || v < -1 || v > FB_READ_BUF)
            return -1;
        if (v == -1) {
            *used = off;
            return 1;
        }
        if (n < off + (size_t)v + 2)
            return 0;
        r->str = p + off;
        r->len = (size_t)v;
        *used = off + (size_t)v + 2;
        return 1;
    case '*':
        if (fb_int(p + 1, line - 1, &v) < 0 || v < -1 || v > FB_MAX_ELEMS || depth >= FB_MAX_DEPTH)
            return -1;
        r->nelem = v;
        r->nok = 0;
        for (long long i = 0; i < v; i++) {
            struct fb_reply e;
            size_t u = 0;
            int rc = fb_parse(p + off, n - off, depth + 1, &e, &u);
            if (rc <= 0)
                return rc;
            r->nok += e.type == '+' && e.len == 2 && memcmp(e.str, "OK", 2) == 0;
            if (i < 2) {
                r->elem_type[i] = e.type;
                r->elem_int[i] = e.integer;
            }
            off += u;
        }
        r->type = '*';
        *used = off;
        return 1;
    default:
        return -1;
    }
}

/* ---- socket I/O ------------------------------------------------------------------------------
 */

static int fb_connect(struct fb_conn *c)
{
    struct sockaddr_in sa;
    struct timeval tv = {FB_IO_TIMEOUT_S, 0};
    int one = 1;

    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)fb_opt.port);
    if (inet_pton(AF_INET, fb_opt.host, &sa.sin_addr) != 1) {
        fb_note(c, "bad host '%s' (an IPv4 address is expected)", fb_opt.host);
        return -1;
    }
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0) {
        fb_note(c, "socket: %s", strerror(errno));
        return -1;
    }
    (void)setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    (void)setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    (void)setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        fb_note(c, "connect to %s:%d: %s", fb_opt.host, fb_opt.port, strerror(errno));
        return -1;
    }
    return 0;
}

/* Sends the whole write buffer. Returns 0 or -1 (error noted). */
static int fb_flush(struct fb_conn *c)
{
    size_t off = 0;

    while (off < c->wlen) {
        ssize_t n = send(c->fd, c->wbuf + off, c->wlen - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            fb_note(c, "send: %s", n < 0 ? strerror(errno) : "connection closed");
            return -1;
        }
        off += (size_t)n;
    }
    c->wlen = 0;
    return 0;
}

/* Reads the next reply, blocking. Returns 0, or -1 on I/O error, timeout or malformed input.
 * The reply's strings stay valid until the next call. */
static int fb_read_reply(struct fb_conn *c, struct fb_reply *r)
{
    for (;;) {
        size_t used = 0;
        int rc = fb_parse(c->rbuf + c->rpos, c->rlen - c->rpos, 0, r, &used);
        ssize_t n;

        if (rc < 0) {
            fb_note(c, "malformed or oversized reply");
            return -1;
        }
        if (rc == 1) {
            c->rpos += used;
            return 0;
        }
        if (c->rpos > 0) {
            memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
            c->rlen -= c->rpos;
            c->rpos = 0;
        }
        if (c->rlen == FB_READ_BUF) {
            fb_note(c, "reply larger than %d bytes", FB_READ_BUF);
            return -1;
        }
        n = recv(c->fd, c->rbuf + c->rlen, FB_READ_BUF - c->rlen, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0)
                fb_note(c, "recv: connection closed by the server");
            else if (errno == EAGAIN || errno == EWOULDBLOCK)
                fb_note(c, "recv: no reply within %d s", FB_IO_TIMEOUT_S);
            else
                fb_note(c, "recv: %s", strerror(errno));
            return -1;
        }
        c->rlen += (size_t)n;
    }
}

/* ---- the commands ----------------------------------------------------------------------------
 */

static int fb_push_set(struct fb_conn *c)
{
    char key[64];
    const char *argv[3] = {"SET", key, "xxx"};
    /* As fencegate sends it with the locks in the store's Redis (the default): the mark and the
     * lock key, whose owner the script checks. */
    const char *script[12] = {"EVALSHA", c->sha,   "2",     c->hwm_key, c->lock_key, "1",
                              c->owner,  c->token, c->lock, "SET",      key,         "xxx"};

    snprintf(key, sizeof(key), "k:%d:%" PRIu64, c->id, c->seq % (uint64_t)fb_opt.keyspace);
    c->seq++;
    if (fb_opt.mode == FB_SCRIPT_SET)
        return fb_cmd(c, 12, script);
    return fb_cmd(c, 3, argv);
}

/* group-set: one call of the group script carrying n SETs. */
static int fb_push_group(struct fb_conn *c, int n)
{
    char keys[FB_MAX_GROUP][64], count[16], nkeys[16];
    const char *argv[FB_MAX_ARGS];
    int argc = 0;

    snprintf(count, sizeof(count), "%d", n);
    argv[argc++] = "EVALSHA";
    argv[argc++] = c->sha;
    snprintf(nkeys, sizeof(nkeys), "%d", 2 * n);
    argv[argc++] = nkeys;
    for (int i = 0; i < n; i++) {
        argv[argc++] = c->hwm_key;
        argv[argc++] = c->lock_key;
    }
    argv[argc++] = count;
    for (int i = 0; i < n; i++) {
        snprintf(keys[i], sizeof(keys[i]), "k:%d:%" PRIu64, c->id,
                 c->seq % (uint64_t)fb_opt.keyspace);
        c->seq++;
        argv[argc++] = "7"; /* n, owner, token, lock, SET, key, value */
        argv[argc++] = "1";
        argv[argc++] = c->owner;
        argv[argc++] = c->token;
        argv[argc++] = c->lock;
        argv[argc++] = "SET";
        argv[argc++] = keys[i];
        argv[argc++] = "xxx";
    }
    return fb_cmd(c, argc, argv);
}

/* The next command of an acquire/release cycle (alternating). */
static int fb_push_cycle(struct fb_conn *c)
{
    char ttl[24];
    int acquire = (c->cmd_index % 2) == 0;

    c->cmd_index++;
    if (fb_opt.mode == FB_ACQUIRE_RELEASE) {
        const char *argv[2] = {acquire ? "FENCE.ACQUIRE" : "FENCE.RELEASE", c->lock};
        return fb_cmd(c, 2, argv);
    }
    snprintf(ttl, sizeof(ttl), "%ld", fb_opt.ttl_ms);
    if (acquire) {
        const char *argv[7] = {"EVAL",       fb_acquire_script, "2", c->lock_key,
                               c->token_key, c->owner,          ttl};
        return fb_cmd(c, 7, argv);
    }
    const char *argv[7] = {"EVAL",
                           fb_release_script,
                           "1",
                           c->lock_key,
                           c->owner,
                           FB_PREFIX "lock:",
                           FB_PREFIX "released:"};
    return fb_cmd(c, 7, argv);
}

/* Checks a token reply: FENCE.ACQUIRE's integer or the script's {1, token}. Tokens of one lock
 * must grow. Returns 0 or -1 (noted). */
static int fb_check_token(struct fb_conn *c, const struct fb_reply *r, const char *what)
{
    long long tok;

    if (r->type == ':') {
        tok = r->integer;
    } else if (r->type == '*' && r->nelem == 2 && r->elem_type[0] == ':' && r->elem_int[0] == 1 &&
               r->elem_type[1] == ':') {
        tok = r->elem_int[1];
    } else {
        if (r->type == '-' || r->type == '+')
            fb_note(c, "%s: unexpected reply '%c%.*s'", what, r->type,
                    (int)(r->len > 160 ? 160 : r->len), r->str);
        else if (r->type == '*' && r->nelem == 2 && r->elem_int[0] == 0)
            fb_note(c, "%s: lock busy (holder's pttl %lld ms)", what, r->elem_int[1]);
        else
            fb_note(c, "%s: unexpected reply of type '%c'", what, r->type);
        return -1;
    }
    if (tok <= 0 || (uint64_t)tok <= c->last_token) {
        fb_note(c, "%s: token %lld does not exceed the previous one %" PRIu64, what, tok,
                c->last_token);
        return -1;
    }
    c->last_token = (uint64_t)tok;
    return 0;
}

static int fb_is_ok(const struct fb_reply *r)
{
    return r->type == '+' && r->len == 2 && memcmp(r->str, "OK", 2) == 0;
}

static void fb_note_reply(struct fb_conn *c, const struct fb_reply *r, const char *what)
{
    if (r->type == '-' || r->type == '+')
        fb_note(c, "%s: unexpected reply '%c%.*s'", what, r->type,
                (int)(r->len > 160 ? 160 : r->len), r->str);
    else
        fb_note(c, "%s: unexpected reply of type '%c' (%lld)", what, r->type, r->integer);
}

/* Reads the replies of cmds commands and counts the good ones in *ok: SETs when cycle is 0, else
 * acquire/release commands whose first has cmd_index cycle_start (acquires are counted). Returns
 * 0, or -1 on an I/O failure. */
static int fb_read_batch(struct fb_conn *c, int cmds, int cycle, uint64_t cycle_start, uint64_t *ok)
{
    struct fb_reply r;

    for (int i = 0; i < cmds; i++) {
        if (fb_read_reply(c, &r) < 0)
            return -1;
        if (!cycle) {
            if (fb_is_ok(&r)) {
                (*ok)++;
            } else {
                c->errors++;
                fb_note_reply(c, &r, "SET");
            }
        } else if ((cycle_start + (uint64_t)i) % 2 == 0) {
            if (fb_check_token(c, &r, "acquire") == 0)
                (*ok)++;
            else
                c->errors++;
        } else if (!(r.type == ':' && r.integer == 1)) {
            c->errors++;
            fb_note_reply(c, &r, "release");
        }
    }
    return 0;
}

/* txn-set: n SETs as fencegate sends a run of writes under one lock: WATCH the mark, EVAL of the
 * check script, MULTI, the SETs, EXEC. */
static int fb_push_txn(struct fb_conn *c, int n)
{
    const char *watch[2] = {"WATCH", c->hwm_key}, *multi[1] = {"MULTI"}, *exec[1] = {"EXEC"};
    const char *check[9] = {
        "EVAL", fence_txn_check_script(), "2", c->hwm_key, c->lock_key, "1", c->owner, c->token,
        c->lock};

    if (fb_cmd(c, 2, watch) < 0 || fb_cmd(c, 9, check) < 0 || fb_cmd(c, 1, multi) < 0)
        return -1;
    for (int i = 0; i < n; i++)
        if (fb_push_set(c) < 0)
            return -1;
    return fb_cmd(c, 1, exec);
}

/* txn-set: +OK, :0, +OK, n times +QUEUED, then EXEC's array: n times +OK. */
static int fb_read_txn(struct fb_conn *c, int n, uint64_t *ok)
{
    struct fb_reply r;
    int good = 1;

    for (int i = 0; i < 3 + n; i++) {
        if (fb_read_reply(c, &r) < 0)
            return -1;
        if (i == 1 ? !(r.type == ':' && r.integer == 0) : r.type != '+') {
            good = 0;
            fb_note_reply(c, &r, i == 1 ? "transaction check" : "transaction step");
        }
    }
    if (fb_read_reply(c, &r) < 0)
        return -1;
    if (good && r.type == '*' && r.nelem == n && r.nok == n) {
        *ok += (uint64_t)n;
    } else {
        c->errors++;
        if (good)
            fb_note_reply(c, &r, "EXEC");
    }
    return 0;
}

/* group-set: the array reply of one call of n writes, each +OK. */
static int fb_read_group(struct fb_conn *c, int n, uint64_t *ok)
{
    struct fb_reply r;

    if (fb_read_reply(c, &r) < 0)
        return -1;
    if (r.type == '*' && r.nelem == n && r.nok == n) {
        *ok += (uint64_t)n;
    } else {
        c->errors++;
        fb_note_reply(c, &r, "group call");
    }
    return 0;
}

/* ---- phases ----------------------------------------------------------------------------------
 */

/* Acquires one lock through fencegate on a connection with nothing pending. */
static int fb_fence_acquire(struct fb_conn *c, const char *name)
{
    const char *argv[2] = {"FENCE.ACQUIRE", name};
    struct fb_reply r;

    if (fb_cmd(c, 2, argv) < 0 || fb_flush(c) < 0 || fb_read_reply(c, &r) < 0)
        return -1;
    c->last_token = 0;
    return fb_check_token(c, &r, "FENCE.ACQUIRE");
}

/* script-set, group-set, txn-set: loads the write (group) script (txn-set needs none), takes the
 * lock with the acquire script and raises its mark to the token, straight from Redis, so the
 * writes carry a real token from the lock's counter. */
static int fb_script_setup(struct fb_conn *c)
{
    const char *load[3] = {"SCRIPT", "LOAD",
                           fb_opt.mode == FB_GROUP_SET ? fence_group_script()
                                                       : fence_write_script()};
    struct fb_reply r;
    uint64_t start = c->cmd_index, ok = 0;

    if (fb_opt.mode != FB_TXN_SET) {
        if (fb_cmd(c, 3, load) < 0 || fb_flush(c) < 0 || fb_read_reply(c, &r) < 0)
            return -1;
        if (r.type != '$' || r.len == 0 || r.len >= sizeof(c->sha)) {
            fb_note_reply(c, &r, "SCRIPT LOAD");
            return -1;
        }
        memcpy(c->sha, r.str, r.len);
        c->sha[r.len] = '\0';
    }
    /* the acquire half of a cycle (cmd_index even); its release is sent after the load loop */
    if (fb_push_cycle(c) < 0 || fb_flush(c) < 0 || fb_read_batch(c, 1, 1, start, &ok) < 0)
        return -1;
    if (ok != 1)
        return -1;
    snprintf(c->token, sizeof(c->token), "%" PRIu64, c->last_token);
    /* fence on acquire, as fencegate's acquire script does it: the writes need mark == token */
    const char *raise[5] = {"EVAL", fence_raise_script(), "1", c->hwm_key, c->token};
    if (fb_cmd(c, 5, raise) < 0 || fb_flush(c) < 0 || fb_read_reply(c, &r) < 0)
        return -1;
    if (r.type != ':' || r.integer != 0) {
        fb_note_reply(c, &r, "fence on acquire");
        return -1;
    }
    return 0;
}

/* Phase 1: connect, check the server answers, and take the lock fenced-set writes under. */
static void *fb_setup(void *arg)
{
    struct fb_conn *c = arg;
    const char *ping[1] = {"PING"};
    struct fb_reply r;

    if (fb_connect(c) < 0 || fb_cmd(c, 1, ping) < 0 || fb_flush(c) < 0 ||
        fb_read_reply(c, &r) < 0) {
        c->failed = 1;
        return NULL;
    }
    if (!(r.type == '+' && r.len == 4 && memcmp(r.str, "PONG", 4) == 0)) {
        fb_note_reply(c, &r, "PING");
        c->failed = 1;
        return NULL;
    }
    if (fb_opt.mode == FB_FENCED_SET && fb_fence_acquire(c, c->lock) < 0)
        c->failed = 1;
    if ((fb_opt.mode == FB_SCRIPT_SET || fb_opt.mode == FB_GROUP_SET ||
         fb_opt.mode == FB_TXN_SET) &&
        fb_script_setup(c) < 0)
        c->failed = 1;
    return NULL;
}

/* Hold mode: acquires fb_opt.locks locks "<prefix>:<conn>:<i>", fb_opt.pipeline at a time. */
static void *fb_hold(void *arg)
{
    struct fb_conn *c = arg;
    struct fb_reply r;
    char name[FB_NAME_MAX];

    for (long i = 0; i < fb_opt.locks;) {
        long batch = fb_opt.locks - i < fb_opt.pipeline ? fb_opt.locks - i : fb_opt.pipeline;
        for (long j = 0; j < batch; j++) {
            const char *argv[2] = {"FENCE.ACQUIRE", name};
            snprintf(name, sizeof(name), "%s:%d:%ld", fb_opt.prefix, c->id, i + j);
            if (fb_cmd(c, 2, argv) < 0) {
                fb_note(c, "command buffer full");
                c->failed = 1;
                return NULL;
            }
        }
        if (fb_flush(c) < 0) {
            c->failed = 1;
            return NULL;
        }
        for (long j = 0; j < batch; j++) {
            if (fb_read_reply(c, &r) < 0) {
                c->failed = 1;
                return NULL;
            }
            c->last_token = 0; /* every lock is new: only positivity is checked */
            if (fb_check_token(c, &r, "FENCE.ACQUIRE") < 0)
                c->errors++;
            else
                c->ops++;
        }
        i += batch;
    }
    return NULL;
}

/* Phase 2: the timed load loop, then the clean-up that leaves no lock behind. */
static void *fb_load(void *arg)
{
    struct fb_conn *c = arg;
    int cycle = fb_opt.mode == FB_ACQUIRE_RELEASE || fb_opt.mode == FB_ACQUIRE_SCRIPT;
    struct timespec now;

    pthread_barrier_wait(&fb_start);
    for (;;) {
        uint64_t start = c->cmd_index, ok = 0;
        int timed = c->lat && c->cmd_index % 2 == 0 && c->nlat < FB_MAX_LATENCIES;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (!fb_before(&now, &fb_deadline))
            break;
        if (fb_opt.requests && atomic_load(&fb_total_ops) >= fb_opt.requests)
            break;
        if (fb_opt.mode == FB_GROUP_SET) {
            if (fb_push_group(c, fb_opt.pipeline) < 0 || fb_flush(c) < 0 ||
                fb_read_group(c, fb_opt.pipeline, &ok) < 0) {
                c->failed = 1;
                goto out;
            }
        } else if (fb_opt.mode == FB_TXN_SET) {
            if (fb_push_txn(c, fb_opt.pipeline) < 0 || fb_flush(c) < 0 ||
                fb_read_txn(c, fb_opt.pipeline, &ok) < 0) {
                c->failed = 1;
                goto out;
            }
        } else {
            for (int i = 0; i < fb_opt.pipeline; i++) {
                if ((cycle ? fb_push_cycle(c) : fb_push_set(c)) < 0) {
                    fb_note(c, "command buffer full");
                    c->failed = 1;
                    goto out;
                }
            }
            if (fb_flush(c) < 0 || fb_read_batch(c, fb_opt.pipeline, cycle, start, &ok) < 0) {
                c->failed = 1;
                goto out;
            }
        }
        if (timed) {
            struct timespec t1;
            clock_gettime(CLOCK_MONOTONIC, &t1);
            c->lat[c->nlat++] = (uint32_t)((fb_secs(&t1) - fb_secs(&now)) * 1e6);
        }
        c->ops += ok;
        atomic_fetch_add(&fb_total_ops, ok);
    }
out:
    clock_gettime(CLOCK_MONOTONIC, &c->end);
    if (c->failed)
        return NULL;
    /* Not measured: release what the loop or the setup left held. */
    if ((cycle || fb_opt.mode == FB_SCRIPT_SET || fb_opt.mode == FB_GROUP_SET ||
         fb_opt.mode == FB_TXN_SET) &&
        c->cmd_index % 2 == 1) {
        uint64_t start = c->cmd_index, ok = 0;
        if (fb_push_cycle(c) < 0 || fb_flush(c) < 0 || fb_read_batch(c, 1, 1, start, &ok) < 0)
            c->failed = 1;
    } else if (fb_opt.mode == FB_FENCED_SET) {
        const char *argv[2] = {"FENCE.RELEASE", c->lock};
        struct fb_reply r;
        if (fb_cmd(c, 2, argv) < 0 || fb_flush(c) < 0 || fb_read_reply(c, &r) < 0)
            c->failed = 1;
        else if (!(r.type == ':' && r.integer == 1)) {
            c->errors++;
            fb_note_reply(c, &r, "FENCE.RELEASE");
        }
    }
    return NULL;
}

static int fb_cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* --latency: p50 and p99 of the acquires' round trips over every connection. */
static void fb_print_latency(void)
{
    size_t n = 0, k = 0;
    uint32_t *all;

    for (int i = 0; i < fb_opt.conns; i++)
        n += fb_conns[i].nlat;
    all = n ? malloc(n * sizeof(*all)) : NULL;
    if (!all) {
        printf("acquire_latency samples=0\n");
        return;
    }
    for (int i = 0; i < fb_opt.conns; i++) {
        memcpy(all + k, fb_conns[i].lat, fb_conns[i].nlat * sizeof(*all));
        k += fb_conns[i].nlat;
    }
    qsort(all, n, sizeof(*all), fb_cmp_u32);
    printf("acquire_latency samples=%zu p50_us=%u p99_us=%u\n", n, all[n / 2], all[n * 99 / 100]);
    free(all);
}

/* Runs fn on every connection, one thread each, and waits for all. Returns 0 or -1. */
static int fb_run(void *(*fn)(void *))
{
    pthread_t *tids = calloc((size_t)fb_opt.conns, sizeof(*tids));
    int started = 0, rc = 0;

    if (!tids)
        return -1;
    for (; started < fb_opt.conns; started++) {
        if (pthread_create(&tids[started], NULL, fn, &fb_conns[started]) != 0) {
            fprintf(stderr, "fencebench: cannot start thread %d\n", started);
            rc = -1;
            break;
        }
    }
    for (int i = 0; i < started; i++)
        pthread_join(tids[i], NULL);
    free(tids);
    return rc;
}

/* Prints the first error of up to 3 connections. Returns how many connections failed. */
static int fb_report_errors(uint64_t *errors)
{
    int failed = 0, shown = 0;

    *errors = 0;
    for (int i = 0; i < fb_opt.conns; i++) {
        struct fb_conn *c = &fb_conns[i];
        *errors += c->errors;
        failed += c->failed;
        if (c->err[0] && shown < 3) {
            fprintf(stderr, "fencebench: connection %d: %s\n", c->id, c->err);
            shown++;
        }
    }
    return failed;
}

/* ---- options ---------------------------------------------------------------------------------
 */

static int fb_long(const char *s, long min, long max, long *out)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

static void fb_usage(FILE *f)
{
    fputs("usage: fencebench --port P [--host 127.0.0.1] [--conns N] [--pipeline D] [--seconds S]\n"
          "                  [--mode set|fenced-set|script-set|group-set|txn-set|\n"
          "                          acquire-release|\n"
          "                          acquire-script|hold]\n"
          "                  [--requests CAP] [--keyspace K] [--ttl-ms MS] [--prefix NAME]\n"
          "                  [--locks L] [--gate] [--latency]\n"
          "  set              SET k:<conn>:<n> straight (n cycles through --keyspace values)\n"
          "  fenced-set       FENCE.ACQUIRE <prefix>:<conn> once, then the same SETs\n"
          "  script-set       take the lock with the acquire script, then send each SET as\n"
          "                   EVALSHA of a fenced-write script (as fencegate does) straight at\n"
          "                   Redis\n"
          "  group-set        the same, but each round is one EVALSHA of a group script carrying\n"
          "                   D SETs (as fencegate groups writes that meet); D <= 16\n"
          "  txn-set          the same, but each round is one transaction of D SETs as fencegate\n"
          "                   sends a run of writes under one lock (WATCH, check, MULTI, the\n"
          "                   SETs, EXEC); D <= 32\n"
          "  acquire-release  FENCE.ACQUIRE / FENCE.RELEASE <prefix>:<conn>, alternating\n"
          "  acquire-script   the same via EVAL of fencegate's Redis acquire/release scripts\n"
          "  hold             acquire --locks L locks <prefix>:<conn>:<i> per connection, print\n"
          "                   'held', keep them until SIGTERM or --seconds; with --gate, print\n"
          "                   'connected' first and wait for SIGUSR1 before acquiring\n"
          "Pipeline D = commands in flight per connection (in cycle modes an acquire and a\n"
          "release are two commands; in group-set and txn-set, the writes of one call). Output:\n"
          "one line of key=value pairs on stdout, where ops counts the SETs answered OK, or in\n"
          "cycle modes the acquires answered with a token (one per cycle); with --latency\n"
          "(cycle modes, pipeline 1) a second line with the acquires' p50 and p99.\n"
          "Exit: 0 measured (see errors=), 1 usage, 2 connection/setup failure.\n",
          f);
}

static int fb_parse_opts(int argc, char **argv)
{
    long v;

    snprintf(fb_opt.host, sizeof(fb_opt.host), "127.0.0.1");
    snprintf(fb_opt.prefix, sizeof(fb_opt.prefix), "bench");
    fb_opt.conns = 50;
    fb_opt.pipeline = 1;
    fb_opt.seconds = 5;
    fb_opt.keyspace = 1000;
    fb_opt.ttl_ms = FB_DEFAULT_TTL;
    fb_opt.mode = FB_SET;
    fb_opt.port = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;

        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fb_usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "--gate")) {
            fb_opt.gate = 1;
            continue;
        }
        if (!strcmp(a, "--latency")) {
            fb_opt.latency = 1;
            continue;
        }
        if (!val) {
            fprintf(stderr, "fencebench: %s needs a value\n", a);
            return -1;
        }
        i++;
        if (!strcmp(a, "--port")) {
            bad = fb_long(val, 1, 65535, &v);
            fb_opt.port = (int)v;
        } else if (!strcmp(a, "--host")) {
            bad = snprintf(fb_opt.host, sizeof(fb_opt.host), "%s", val) >= (int)sizeof(fb_opt.host);
        } else if (!strcmp(a, "--conns")) {
            bad = fb_long(val, 1, FB_MAX_CONNS, &v);
            fb_opt.conns = (int)v;
        } else if (!strcmp(a, "--pipeline")) {
            bad = fb_long(val, 1, FB_MAX_PIPELINE, &v);
            fb_opt.pipeline = (int)v;
        } else if (!strcmp(a, "--seconds")) {
            bad = fb_long(val, 1, FB_MAX_SECONDS, &fb_opt.seconds);
        } else if (!strcmp(a, "--requests")) {
            bad = fb_long(val, 0, 1000000000L, &v);
            fb_opt.requests = (uint64_t)v;
        } else if (!strcmp(a, "--keyspace")) {
            bad = fb_long(val, 1, 100000000L, &fb_opt.keyspace);
        } else if (!strcmp(a, "--ttl-ms")) {
            bad = fb_long(val, 1, 3600000, &fb_opt.ttl_ms);
        } else if (!strcmp(a, "--locks")) {
            bad = fb_long(val, 0, FB_MAX_LOCKS, &fb_opt.locks);
        } else if (!strcmp(a, "--prefix")) {
            bad = strchr(val, '{') || strchr(val, '}') ||
                  snprintf(fb_opt.prefix, sizeof(fb_opt.prefix), "%s", val) >=
                      (int)sizeof(fb_opt.prefix);
        } else if (!strcmp(a, "--mode")) {
            bad = 1;
            for (size_t m = 0; m < sizeof(fb_mode_names) / sizeof(fb_mode_names[0]); m++) {
                if (!strcmp(val, fb_mode_names[m])) {
                    fb_opt.mode = (enum fb_mode)m;
                    bad = 0;
                }
            }
        } else {
            fprintf(stderr, "fencebench: unknown option %s\n", a);
            return -1;
        }
        if (bad) {
            fprintf(stderr, "fencebench: bad value '%s' for %s\n", val, a);
            return -1;
        }
    }
    if (fb_opt.port == 0) {
        fprintf(stderr, "fencebench: --port is required\n");
        return -1;
    }
    if (fb_opt.mode == FB_GROUP_SET && fb_opt.pipeline > FB_MAX_GROUP) {
        fprintf(stderr, "fencebench: group-set carries at most %d writes per call (--pipeline)\n",
                FB_MAX_GROUP);
        return -1;
    }
    if (fb_opt.mode == FB_TXN_SET && fb_opt.pipeline > FB_MAX_ELEMS) {
        fprintf(stderr,
                "fencebench: txn-set carries at most %d writes per transaction "
                "(--pipeline)\n",
                FB_MAX_ELEMS);
        return -1;
    }
    return 0;
}

/* Waits up to timeout_s for SIGUSR1, SIGTERM or SIGINT (blocked in every thread). Returns the
 * signal, or 0 when the time ran out. */
static int fb_wait_signal(long timeout_s)
{
    sigset_t set;
    struct timespec ts = {timeout_s, 0};
    int sig;

    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    do {
        sig = sigtimedwait(&set, NULL, &ts);
    } while (sig < 0 && errno == EINTR);
    return sig < 0 ? 0 : sig;
}

static int fb_main_hold(void)
{
    uint64_t errors;
    uint64_t held = 0;
    int sig;

    printf("connected conns=%d\n", fb_opt.conns);
    fflush(stdout);
    if (fb_opt.gate) {
        sig = fb_wait_signal(fb_opt.seconds);
        if (sig == 0) {
            fprintf(stderr, "fencebench: no SIGUSR1 within %ld s; giving up\n", fb_opt.seconds);
            return 2;
        }
        if (sig != SIGUSR1)
            return 0;
    }
    if (fb_run(fb_hold) < 0 || fb_report_errors(&errors) > 0)
        return 2;
    for (int i = 0; i < fb_opt.conns; i++)
        held += fb_conns[i].ops;
    printf("held locks=%" PRIu64 " conns=%d errors=%" PRIu64 "\n", held, fb_opt.conns, errors);
    fflush(stdout);
    (void)fb_wait_signal(fb_opt.seconds);
    return 0;
}

int main(int argc, char **argv)
{
    struct timespec t0, end = {0, 0};
    uint64_t errors, ops = 0;
    sigset_t set;
    double secs;
    int rc = 0;

    if (fb_parse_opts(argc, argv) < 0) {
        fb_usage(stderr);
        return 1;
    }
    /* Signals are taken with sigtimedwait by the main thread only. */
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);

    fb_conns = calloc((size_t)fb_opt.conns, sizeof(*fb_conns));
    if (!fb_conns)
        return 2;
    for (int i = 0; i < fb_opt.conns; i++) {
        struct fb_conn *c = &fb_conns[i];
        c->id = i;
        c->fd = -1;
        c->wcap = (size_t)fb_opt.pipeline * FB_CMD_MAX;
        c->rbuf = malloc(FB_READ_BUF);
        c->wbuf = malloc(c->wcap);
        if (!c->rbuf || !c->wbuf)
            return 2;
        if (fb_opt.latency && fb_opt.pipeline == 1 &&
            (fb_opt.mode == FB_ACQUIRE_RELEASE || fb_opt.mode == FB_ACQUIRE_SCRIPT) &&
            !(c->lat = malloc(FB_MAX_LATENCIES * sizeof(*c->lat))))
            return 2;
        snprintf(c->lock, sizeof(c->lock), "%s:%d", fb_opt.prefix, i);
        snprintf(c->lock_key, sizeof(c->lock_key), FB_PREFIX "lock:{%s}", c->lock);
        snprintf(c->token_key, sizeof(c->token_key), FB_PREFIX "token:{%s}", c->lock);
        snprintf(c->hwm_key, sizeof(c->hwm_key), FB_PREFIX "hwm:{%s}", c->lock);
        snprintf(c->owner, sizeof(c->owner), "fencebench-%ld-%d", (long)getpid(), i);
    }
    if (fb_run(fb_setup) < 0 || fb_report_errors(&errors) > 0) {
        fprintf(stderr, "fencebench: setup failed against %s:%d\n", fb_opt.host, fb_opt.port);
        return 2;
    }
    if (fb_opt.mode == FB_HOLD)
        return fb_main_hold();

    if (pthread_barrier_init(&fb_start, NULL, (unsigned)fb_opt.conns + 1) != 0)
        return 2;
    {
        pthread_t *tids = calloc((size_t)fb_opt.conns, sizeof(*tids));
        if (!tids)
            return 2;
        for (int i = 0; i < fb_opt.conns; i++) {
            if (pthread_create(&tids[i], NULL, fb_load, &fb_conns[i]) != 0) {
                fprintf(stderr, "fencebench: cannot start thread %d\n", i);
                exit(2); /* the others wait on the barrier forever */
            }
        }
        clock_gettime(CLOCK_MONOTONIC, &t0);
        fb_deadline = t0;
        fb_deadline.tv_sec += fb_opt.seconds;
        pthread_barrier_wait(&fb_start);
        for (int i = 0; i < fb_opt.conns; i++)
            pthread_join(tids[i], NULL);
        free(tids);
    }
    for (int i = 0; i < fb_opt.conns; i++) {
        ops += fb_conns[i].ops;
        if (fb_before(&end, &fb_conns[i].end))
            end = fb_conns[i].end;
    }
    if (fb_report_errors(&errors) > 0)
        rc = 2;
    secs = fb_secs(&end) - fb_secs(&t0);
    printf("mode=%s conns=%d pipeline=%d ops=%" PRIu64 " errors=%" PRIu64
           " seconds=%.3f ops_per_sec=%.1f\n",
           fb_mode_names[fb_opt.mode], fb_opt.conns, fb_opt.pipeline, ops, errors, secs,
           secs > 0 ? (double)ops / secs : 0.0);
    if (fb_opt.latency)
        fb_print_latency();
    return rc;
}
