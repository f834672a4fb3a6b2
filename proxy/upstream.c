/* upstream.c — the upstream Redis as a whole: address, health probe with backoff, command table. */
#include "upstream.h"

#include <errno.h>
#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "buf.h"
#include "clock.h"
#include "cmdtable.h"
#include "config.h"
#include "log.h"
#include "metrics.h"
#include "resolve.h"
#include "resp.h"

#define UP_PROBE_INTERVAL_MS 1000
#define UP_PROBE_TIMEOUT_MS  2000
#define UP_BACKOFF_MIN_MS    100
#define UP_BACKOFF_MAX_MS    5000
#define UP_MAX_REPLY         (16 * 1024 * 1024) /* a COMMAND reply is ~250 KB */

enum up_probe_state { UP_IDLE, UP_RESOLVING, UP_CONNECTING, UP_WAITING };

struct upstream {
    struct event_base *base;
    char name[300];
    char host[256];
    int port;
    struct net_addr addr;
    int have_addr;
    int up;
    char error[256];
    struct cmd_table *commands;

    char prelude[1024];
    size_t prelude_len;
    int prelude_replies;

    /* the probe connection */
    enum up_probe_state state;
    struct resolve_req *resolving; /* the host name's lookup (state UP_RESOLVING) */
    int fd;
    struct event *ev;    /* fd readiness */
    struct event *timer; /* next probe, or the deadline of the current one */
    struct buf in;
    struct resp_scanner scan;
    size_t scanned;
    int expect;        /* replies still expected in this round */
    int reply_index;   /* index of the next reply in this round */
    int want_commands; /* this round asked for COMMAND */
    int oom_possible;  /* INFO memory: a maxmemory limit may refuse writes (or it is unknown) */
    int evicts_any;    /* INFO memory: a maxmemory limit with an allkeys-* policy (logged once) */
    int backoff_ms;
    int busy;                 /* the last PING was answered -BUSY, -LOADING or -MASTERDOWN */
    int commands_again;       /* COMMAND was answered so too: ask again next round */
    long long quick_retry_ms; /* when the probe last reconnected at once (up_quick_retry) */
    long long woken_ms;       /* when a refused client last made it probe at once */
    int woken;                /* the probe in flight is such a one */
    int unanswered;           /* down because a PING on a connection Redis took went unanswered */
    int probed;               /* a probe has had an outcome */
    void (*probed_cb)(void *arg); /* upstream_on_first_probe() */
    void *probed_arg;
};

static void up_schedule(struct upstream *u, int ms);
static void up_resolved(const struct addrinfo *res, const char *why, void *arg);
static int up_send_round(struct upstream *u, int fresh);

/* Appends one command in multibulk form to out. Returns the new length, or cap on overflow. */
static size_t up_encode(char *out, size_t len, size_t cap, int argc, const char **argv)
{
    int n = snprintf(out + len, cap - len, "*%d\r\n", argc);

    if (n < 0 || (size_t)n >= cap - len)
        return cap;
    len += (size_t)n;
    for (int i = 0; i < argc; i++) {
        n = snprintf(out + len, cap - len, "$%zu\r\n%s\r\n", strlen(argv[i]), argv[i]);
        if (n < 0 || (size_t)n >= cap - len)
            return cap;
        len += (size_t)n;
    }
    return len;
}

static void up_build_prelude(struct upstream *u, const struct cfg_url *url)
{
    size_t len = 0, cap = sizeof(u->prelude);

    u->prelude_replies = 0;
    if (url->password[0]) {
        const char *auth2[] = {"AUTH", url->password};
        const char *auth3[] = {"AUTH", url->user, url->password};
        if (url->user[0])
            len = up_encode(u->prelude, len, cap, 3, auth3);
        else
            len = up_encode(u->prelude, len, cap, 2, auth2);
        u->prelude_replies++;
    }
    if (url->db != 0 && len < cap) {
        char db[16];
        const char *sel[] = {"SELECT", db};
        snprintf(db, sizeof(db), "%d", url->db);
        len = up_encode(u->prelude, len, cap, 2, sel);
        u->prelude_replies++;
    }
    u->prelude_len = len < cap ? len : 0;
}

static void up_set_state(struct upstream *u, int up, const char *why)
{
    if (up && !u->up)
        log_info("upstream %s is up", u->name);
    else if (!up && (u->up || strcmp(u->error, why) != 0))
        log_warn("upstream %s is down: %s", u->name, why);
    u->up = up;
    u->unanswered = 0;
    snprintf(u->error, sizeof(u->error), "%s", up ? "" : why);
    fg_metrics.gauge[G_UPSTREAM_UP] = up;
    if (!u->probed) {
        void (*cb)(void *arg) = u->probed_cb;

        u->probed = 1;
        u->probed_cb = NULL;
        if (cb)
            cb(u->probed_arg);
    }
}

static void up_close_probe(struct upstream *u)
{
    resolve_cancel(u->resolving);
    u->resolving = NULL;
    if (u->ev) {
        event_free(u->ev);
        u->ev = NULL;
    }
    if (u->fd >= 0) {
        close(u->fd);
        u->fd = -1;
    }
    buf_free(&u->in);
    u->state = UP_IDLE;
}

/* Marks the upstream down, drops the probe connection and retries after a growing delay. */
static void up_fail(struct upstream *u, const char *why)
{
    up_set_state(u, 0, why);
    up_close_probe(u);
    if (!u->woken || !u->backoff_ms) /* a probe a client asked for does not lengthen it */
        u->backoff_ms = u->backoff_ms ? u->backoff_ms * 2 : UP_BACKOFF_MIN_MS;
    u->woken = 0;
    if (u->backoff_ms > UP_BACKOFF_MAX_MS)
        u->backoff_ms = UP_BACKOFF_MAX_MS;
    /* Jitter keeps a fleet of sidecars from probing a restarting Redis in lockstep. */
    up_schedule(u, u->backoff_ms / 2 + rand() % (u->backoff_ms / 2 + 1));
}

static void up_schedule(struct upstream *u, int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};

    evtimer_add(u->timer, &tv);
}

/* The value of "field:" in an INFO reply (a bulk string of CRLF-ended lines), or NULL. */
static const char *up_info_field(const char *r, size_t len, const char *field, size_t *vlen)
{
    size_t flen = strlen(field);
    const char *p = r, *end = r + len, *eol;

    for (; p < end; p = eol + 1) {
        eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol)
            break;
        if ((size_t)(eol - p) > flen && memcmp(p, field, flen) == 0 && p[flen] == ':') {
            *vlen = (size_t)(eol - p) - flen - 1 - (eol[-1] == '\r');
            return p + flen + 1;
        }
    }
    return NULL;
}

/* What the upstream's maxmemory setting may do: refuse a write (a limit with a policy that may
 * find nothing to evict: noeviction, volatile-*; or an INFO reply we cannot read), and evict any
 * key, fence marks included (a limit with an allkeys-* policy). Sets u's two flags, and says
 * once what an evicted mark costs. */
static void up_read_memory(struct upstream *u, const char *r, size_t len)
{
    size_t n, pn;
    const char *max = up_info_field(r, len, "maxmemory", &n);
    const char *policy = up_info_field(r, len, "maxmemory_policy", &pn);
    int evicts = 0;

    if (r[0] != '$' || !max || !policy) {
        u->oom_possible = 1;
        return;
    }
    if (!(n == 1 && max[0] == '0'))
        evicts = pn > 8 && memcmp(policy, "allkeys-", 8) == 0;
    u->oom_possible = !(n == 1 && max[0] == '0') && !evicts;
    if (evicts && !u->evicts_any)
        log_warn("upstream %s: maxmemory-policy %.*s may evict fence marks (fencegate:hwm:*); a "
                 "holder whose mark is evicted has its next fenced write refused LOCKLOST and must "
                 "acquire again. Prefer noeviction or a volatile-* policy",
                 u->name, (int)(pn > 40 ? 40 : pn), policy);
    u->evicts_any = evicts;
}

/* Whether an error answer to PING means a Redis that works but is busy for a while: a script or
 * function past its time limit (-BUSY), a dataset being loaded (-LOADING), a replica whose master
 * is down and that serves no stale data (-MASTERDOWN). */
static int up_transient(const char *r, size_t len)
{
    static const char *const codes[] = {"-BUSY ", "-LOADING ", "-MASTERDOWN "};

    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
        if (len > strlen(codes[i]) && memcmp(r, codes[i], strlen(codes[i])) == 0)
            return 1;
    return 0;
}

/* Handles one complete reply of the current round. Returns 0, or -1 after up_fail(). */
static int up_on_reply(struct upstream *u, const char *r, size_t len)
{
    char why[256];
    int idx = u->reply_index++;

    if (idx < u->prelude_replies) {
        if (r[0] == '-') {
            snprintf(why, sizeof(why), "upstream rejected %s: %.*s",
                     idx == 0 && u->prelude_replies > 1 ? "AUTH" : "AUTH/SELECT",
                     (int)(len > 200 ? 200 : len - 2), r + 1);
            up_fail(u, why);
            return -1;
        }
        return 0;
    }
    if (idx == u->prelude_replies) { /* PING */
        if (up_transient(r, len)) {
            /* Reachable, and busy for a while (a long script, loading its data, a replica
             * whose master is down): clients get Redis' own answer, as they would directly. */
            if (!u->busy)
                log_info("upstream %s answered PING with %.*s; still forwarding commands, which "
                         "Redis answers the same way until it is done",
                         u->name, (int)(len > 200 ? 200 : len - 2), r);
            u->busy = 1;
            return 0;
        }
        u->busy = 0;
        if (r[0] != '+') {
            snprintf(why, sizeof(why), "PING answered %.*s", (int)(len > 200 ? 200 : len - 2), r);
            up_fail(u, why);
            return -1;
        }
        return 0;
    }
    if (idx == u->prelude_replies + 1) { /* INFO memory */
        up_read_memory(u, r, len);
        return 0;
    }
    if (u->want_commands) { /* COMMAND */
        int err = 0;
        struct cmd_table *t;

        if ((u->commands_again = up_transient(r, len)) != 0)
            return 0;
        t = cmd_table_parse(r, len, &err);
        if (!t) {
            log_warn("upstream %s: cannot read its COMMAND reply (%s); writes cannot be "
                     "classified until it can",
                     u->name, fg_strerror(err));
        } else {
            cmd_table_free(u->commands);
            u->commands = t;
            log_info("upstream %s: %zu commands described", u->name, cmd_table_count(t));
        }
    }
    return 0;
}

static void up_on_timer(evutil_socket_t fd, short what, void *arg);

/* The probe connection of an upstream that was up was closed (CLIENT KILL, a Redis timeout, a
 * proxy in between): connect again at once, still up, and call it down only if that fails.
 * Clients are not told of a blip Redis itself would not show them. At most once a second, so a
 * server that keeps closing falls back to the backoff. Returns 1 when a reconnect is scheduled. */
static int up_quick_retry(struct upstream *u)
{
    long long now = clock_now_ms();

    if (u->quick_retry_ms && now - u->quick_retry_ms < 1000)
        return 0;
    u->quick_retry_ms = now;
    up_close_probe(u);
    evtimer_del(u->timer);
    up_schedule(u, 0);
    return 1;
}

void upstream_report_alive(struct upstream *u)
{
    if (u->up || !u->unanswered)
        return;
    up_set_state(u, 1, "");
    u->backoff_ms = 0;
    if (u->state == UP_IDLE && u->fd < 0) { /* reconnect the probe now, not after its backoff */
        evtimer_del(u->timer);
        up_schedule(u, 0);
    }
}

void upstream_wake(struct upstream *u)
{
    long long now;

    if (u->up || u->state != UP_IDLE)
        return;
    now = clock_now_ms();
    if (now - u->woken_ms < UP_BACKOFF_MIN_MS)
        return;
    u->woken_ms = now;
    u->woken = 1;
    evtimer_del(u->timer);
    up_schedule(u, 0);
}

static void up_on_io(evutil_socket_t fd, short what, void *arg)
{
    struct upstream *u = arg;
    char why[256];

    if (u->state == UP_CONNECTING) {
        int e = net_connect_result(u->fd);
        if (e != 0) {
            snprintf(why, sizeof(why), "connect: %s", strerror(e));
            metrics_inc(&fg_metrics, M_UPSTREAM_CONNECT_ERRORS, 1);
            up_fail(u, why);
            return;
        }
        if (up_send_round(u, 1) < 0) {
            up_fail(u, "cannot write to the upstream");
            return;
        }
        u->state = UP_WAITING;
        event_free(u->ev);
        u->ev = event_new(u->base, u->fd, EV_READ | EV_PERSIST, up_on_io, u);
        event_add(u->ev, NULL);
        return;
    }
    for (;;) {
        ssize_t n;
        if (buf_reserve(&u->in, 65536) != FG_OK) {
            up_fail(u, "out of memory");
            return;
        }
        n = read(u->fd, u->in.data + u->in.end, u->in.cap - u->in.end);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
            snprintf(why, sizeof(why), "%s", n == 0 ? "connection closed" : strerror(errno));
            if (u->up && up_quick_retry(u))
                return;
            up_fail(u, why);
            return;
        }
        if (n < 0)
            break;
        u->in.end += (size_t)n;
    }
    while (u->expect > 0 && buf_len(&u->in) > u->scanned) {
        size_t used = 0;
        int rc = resp_scan_reply(&u->scan, buf_head(&u->in) + u->scanned,
                                 buf_len(&u->in) - u->scanned, &used);
        u->scanned += used;
        if (rc == RESP_SCAN_INVALID || u->scanned > UP_MAX_REPLY) {
            up_fail(u, "protocol error in reply");
            return;
        }
        if (rc != RESP_SCAN_DONE)
            break;
        if (up_on_reply(u, buf_head(&u->in), u->scanned) < 0)
            return;
        buf_consume(&u->in, u->scanned);
        u->scanned = 0;
        u->expect--;
    }
    if (u->expect == 0 && u->state == UP_WAITING) {
        u->state = UP_IDLE;
        u->backoff_ms = 0;
        u->woken = 0;
        up_set_state(u, 1, "");
        evtimer_del(u->timer);
        up_schedule(u, UP_PROBE_INTERVAL_MS);
    }
}

/* Sends one probe round on the (connected or connecting) probe socket. */
static int up_send_round(struct upstream *u, int fresh)
{
    static const char probe[] = "*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nINFO\r\n$6\r\nmemory\r\n";
    char req[1200];
    size_t len = 0;
    ssize_t n;

    /* After a reconnect the server may have been upgraded; a busy one may not have answered. */
    u->want_commands = fresh || u->commands_again;
    u->reply_index = fresh ? 0 : u->prelude_replies;
    if (fresh && u->prelude_len) {
        memcpy(req, u->prelude, u->prelude_len);
        len = u->prelude_len;
    }
    memcpy(req + len, probe, sizeof(probe) - 1);
    len += sizeof(probe) - 1;
    if (u->want_commands) {
        memcpy(req + len, "*1\r\n$7\r\nCOMMAND\r\n", 17);
        len += 17;
    }
    u->expect = (fresh ? u->prelude_replies : 0) + 2 + u->want_commands;
    resp_scanner_init(&u->scan);
    u->scanned = 0;
    /* A probe round is tiny; if the socket cannot take it whole, the upstream is in trouble. */
    n = write(u->fd, req, len);
    return n == (ssize_t)len ? 0 : -1;
}

static void up_on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct upstream *u = arg;
    char err[320];

    if (u->state == UP_RESOLVING) {
        snprintf(err, sizeof(err), "resolving '%s' timed out after %d ms", u->host,
                 UP_PROBE_TIMEOUT_MS);
        up_fail(u, err);
        return;
    }
    if (u->state != UP_IDLE) { /* the deadline of a probe in flight passed */
        int unanswered = u->state == UP_WAITING;
        up_fail(u, unanswered ? "PING timed out" : "connect timed out");
        u->unanswered = unanswered;
        return;
    }
    if (u->fd >= 0) { /* a healthy connection: just PING again */
        if (up_send_round(u, 0) < 0) {
            up_fail(u, "cannot write to the upstream");
            return;
        }
        u->state = UP_WAITING;
        up_schedule(u, UP_PROBE_TIMEOUT_MS);
        return;
    }
    /* A new connection: the name is looked up again, as it may now name another address. */
    u->resolving = resolve_start(u->base, u->host, u->port, up_resolved, u);
    if (!u->resolving) {
        up_fail(u, "cannot resolve: out of memory or threads");
        return;
    }
    u->state = UP_RESOLVING;
    up_schedule(u, UP_PROBE_TIMEOUT_MS);
}

static void up_resolved(const struct addrinfo *res, const char *why, void *arg)
{
    struct upstream *u = arg;
    const struct addrinfo *a = resolve_pick(res);
    char err[256];

    u->resolving = NULL;
    if (!a) {
        up_fail(u, why);
        return;
    }
    memcpy(&u->addr.ss, a->ai_addr, a->ai_addrlen);
    u->addr.len = a->ai_addrlen;
    u->have_addr = 1;
    u->fd = net_connect(&u->addr);
    if (u->fd < 0) {
        snprintf(err, sizeof(err), "connect: %s", strerror(errno));
        metrics_inc(&fg_metrics, M_UPSTREAM_CONNECT_ERRORS, 1);
        up_fail(u, err);
        return;
    }
    /* The first round is sent from the write callback, once the connect completed. */
    u->state = UP_CONNECTING;
    u->ev = event_new(u->base, u->fd, EV_WRITE, up_on_io, u);
    event_add(u->ev, NULL);
    up_schedule(u, UP_PROBE_TIMEOUT_MS);
    u->expect = 0;
}

struct upstream *upstream_new(struct event_base *base, const struct cfg_url *url, char *err,
                              size_t errlen)
{
    struct upstream *u = calloc(1, sizeof(*u));

    if (!u) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    u->base = base;
    u->oom_possible = 1; /* until a probe reads INFO memory */
    u->fd = -1;
    snprintf(u->host, sizeof(u->host), "%s", url->hosts[0].host);
    u->port = url->hosts[0].port;
    snprintf(u->name, sizeof(u->name), "redis://%s%s%s:%d%s", strchr(u->host, ':') ? "[" : "",
             u->host, strchr(u->host, ':') ? "]" : "", u->port, url->db ? "/" : "");
    if (url->db) {
        size_t l = strlen(u->name);
        snprintf(u->name + l, sizeof(u->name) - l, "%d", url->db);
    }
    up_build_prelude(u, url);
    snprintf(u->error, sizeof(u->error), "not probed yet");
    u->timer = evtimer_new(base, up_on_timer, u);
    if (!u->timer) {
        snprintf(err, errlen, "out of memory");
        free(u);
        return NULL;
    }
    up_schedule(u, 0);
    return u;
}

void upstream_free(struct upstream *u)
{
    if (!u)
        return;
    up_close_probe(u);
    if (u->timer)
        event_free(u->timer);
    cmd_table_free(u->commands);
    free(u);
}

int upstream_on_first_probe(struct upstream *u, void (*cb)(void *arg), void *arg)
{
    if (u->probed)
        return 1;
    u->probed_cb = cb;
    u->probed_arg = arg;
    return 0;
}

int upstream_is_up(const struct upstream *u)
{
    return u->up;
}

const char *upstream_name(const struct upstream *u)
{
    return u->name;
}

const char *upstream_error(const struct upstream *u)
{
    return u->error;
}

const struct net_addr *upstream_addr(const struct upstream *u)
{
    return u->have_addr ? &u->addr : NULL;
}

const struct cmd_table *upstream_commands(const struct upstream *u)
{
    return u->commands;
}

int upstream_oom_possible(const struct upstream *u)
{
    return u->oom_possible;
}

const char *upstream_prelude(const struct upstream *u, size_t *len, int *nreplies)
{
    *len = u->prelude_len;
    *nreplies = u->prelude_replies;
    return u->prelude;
}

void upstream_report_failure(struct upstream *u, const char *why)
{
    if (!u->up)
        return;
    /* Trust the session's evidence now; the probe decides when the upstream is back. */
    up_close_probe(u);
    evtimer_del(u->timer);
    u->backoff_ms = 0;
    up_fail(u, why);
}
