/* server.c — the RESP endpoint: client connections and their upstream connections.
 *
 * A client starts on the shared upstream connection, which carries the requests of every client
 * that has no connection state on the server (twemproxy's multiplexing): plain reads and writes,
 * PING, ECHO, PUBLISH, fenced writes. The first request that would create or read connection state
 * (SELECT, MULTI, WATCH, subscriptions, blocking commands, CLIENT, HELLO, AUTH, scripts, admin
 * commands) "pins" the client: once its shared replies are in, it gets an upstream connection of
 * its own and keeps it, so that state lives where Redis keeps it. A deep pipeline
 * (SRV_SHARED_MAX_OPS) or unread replies past max_pending_bytes pin too: the shared connection
 * cannot push back on one client, a connection of its own can. With `upstream_multiplex: false`
 * every client is pinned from the start.
 *
 * Requests are parsed only to classify them; their bytes are forwarded as received. Replies are
 * scanned only to find their boundaries, so each can be matched to the request that caused it: a
 * queue of pending operations ("ops") per client keeps replies fencegate writes itself (errors,
 * FENCE.* replies) in the exact order of the pipeline, and the shared connection keeps, for each
 * reply it waits for, the client it belongs to. Lock commands and fenced writes live in
 * fencing.c. */
#include "server.h"

#include <errno.h>
#include <event2/event.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "buf.h"
#include "client.h"
#include "clock.h"
#include "cmdtable.h"
#include "config.h"
#include "fence.h"
#include "fencing.h"
#include "lock.h"
#include "log.h"
#include "metrics.h"
#include "net.h"
#include "resp.h"
#include "upstream.h"

/* One upstream connection that carries the requests of every unpinned client. Redis answers a
 * connection's requests in order, so `who` (a ring) names, for each reply still due, the client
 * it goes to: NULL for the link's own prelude (AUTH/SELECT) and for a client that has gone.
 * Fenced writes that arrive back to back are gathered in `g_reqs` and go out when anything else
 * is sent or the link is flushed: runs under the same locks as pipelined transactions, the rest
 * as calls of the group script. The `who` entry of a call's first write records how many writes
 * the call answers. */
struct who_ent {
    struct client *c;
    uint32_t grp; /* > 1: this reply and the grp - 1 after it come as one array */
    uint8_t txn;  /* this write and the grp - 1 after it went as a pipelined transaction */
};

struct ulink {
    struct server *srv;
    int fd;
    enum up_state state;
    struct event *rev, *wev;
    int rev_on, wev_on;
    struct event *fail_ev;  /* runs lk_fail() outside the callback that found the failure */
    struct event *flush_ev; /* writes `out` after the events ready now were handled */
    struct buf in, out;
    struct resp_scanner scan;
    size_t rscan_off;
    int prelude_left; /* replies to the link's own AUTH/SELECT still due */
    int quiet_left;   /* then replies to its CLIENT NO-EVICT, whatever they say */
    unsigned script_loaded : 1;
    unsigned group_loaded : 1; /* the group script is in Redis' cache (else it goes as EVAL) */
    unsigned failed : 1;       /* a write failed; lk_fail() is scheduled */
    unsigned flush_due : 1;    /* flush_ev is active */
    unsigned out_full : 1;     /* `out` passed max_pending_bytes: unpinned clients stop parsing */
    unsigned due_full : 1;     /* due_cap replies are due: unpinned clients stop parsing */
    char why[256];             /* why it is down */
    struct who_ent *who;
    size_t who_head, who_count, who_cap;
    uint64_t who_seq; /* entries ever pushed */
    /* Replies and their bytes received lately (both halved as they grow): their mean size sets
     * due_cap, the most replies that may be due at once (SRV_DUE_BYTES' worth). */
    uint64_t rx_replies, rx_bytes;
    size_t due_cap;
    size_t resume_turn; /* where lk_resume_clients() starts next */
    /* The open group: g_count fenced writes in g_reqs, where g_lay says, whose `who` entries
     * were pushed as entries g_seq, g_seq + 1, ... */
    struct buf g_reqs;
    struct fence_layout g_lay[SRV_GROUP_MAX_WRITES]; /* offsets into g_reqs */
    size_t g_count;
    uint64_t g_seq;
    size_t txn_seen; /* replies of the transaction at the head of `who` scanned so far */
};

/* Scratch space for reads: a connection keeps a buffer only for bytes it could not handle yet. */
static char srv_scratch[SRV_READ_CHUNK];

static void cl_close(struct client *c);
static void cl_process_input(struct client *c);
static void lk_send(struct ulink *lk, const char *p, size_t n);
static void lk_send_fenced(struct ulink *lk, const char *p, size_t n,
                           const struct fence_layout *lay);
static int lk_push(struct ulink *lk, struct client *c);
static void lk_schedule_fail(struct ulink *lk, const char *why);
static void cl_flush(struct client *c);

/* Reads what fd has: into the shared scratch space when b holds nothing (*scratch = 1), else
 * onto the end of b, whose unfinished message the new bytes continue. Returns read()'s result,
 * or -2 when b cannot grow. */
static ssize_t srv_read(int fd, struct buf *b, int *scratch)
{
    *scratch = buf_len(b) == 0;
    if (*scratch)
        return read(fd, srv_scratch, sizeof(srv_scratch));
    if (buf_reserve(b, SRV_READ_CHUNK) != FG_OK)
        return -2;
    return read(fd, b->data + b->end, b->cap - b->end);
}

/* Reads reply bytes from fd and hands handle() everything not handled yet (what b kept from
 * before, then the new bytes); b keeps what it leaves. handle() returns the bytes it handled, or
 * -1 when the connection went away under it (b is then not touched again). Returns 1 when there
 * was nothing to read, 0 when bytes were handled, -1 when the connection is unusable (*why says
 * why: closed by the upstream, a read error, or fencegate out of memory). */
static int srv_read_reply(int fd, struct buf *b, long (*handle)(void *, const char *, size_t),
                          void *arg, const char **why)
{
    const char *src;
    size_t len;
    long done;
    int scratch;
    ssize_t n = srv_read(fd, b, &scratch);

    *why = "fencegate is out of memory";
    if (n == -2)
        return -1;
    if (n <= 0) {
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return 1;
        *why = n == 0 ? "connection closed by the upstream" : strerror(errno);
        return -1;
    }
    metrics_inc(&fg_metrics, M_BYTES_FROM_UPSTREAM, (uint64_t)n);
    if (scratch) {
        src = srv_scratch;
        len = (size_t)n;
    } else {
        b->end += (size_t)n;
        src = buf_head(b);
        len = buf_len(b);
    }
    done = handle(arg, src, len);
    if (done < 0)
        return 0;
    if (!scratch)
        buf_consume(b, (size_t)done);
    else if ((size_t)done < len && buf_append(b, src + done, len - (size_t)done) != FG_OK)
        return -1;
    return 0;
}

/* The clock read once per batch of requests or replies: the latency of a command is measured
 * between the batch that sent it and the one that completed it (one clock read per batch, not
 * two per command). */
static uint64_t srv_batch_us;

static void batch_start(void)
{
    srv_batch_us = clock_now_us();
}

uint64_t batch_now(void)
{
    return srv_batch_us;
}

/* ---- event interest ------------------------------------------------------------------------ */

static void ev_want(struct event *ev, int *on, int want)
{
    if (!ev || *on == want)
        return;
    if (want)
        event_add(ev, NULL);
    else
        event_del(ev);
    *on = want;
}

static size_t cl_pending_limit(const struct client *c)
{
    return (size_t)c->srv->cfg->max_pending_bytes;
}

static int cl_can_parse(const struct client *c)
{
    return !c->closing && !c->quit_sent && !c->blocked && c->ops_count < SRV_MAX_OPS &&
           buf_len(&c->uout) < cl_pending_limit(c) &&
           (c->pinned || !(c->srv->shared->out_full || c->srv->shared->due_full)) &&
           buf_len(&c->out) < cl_pending_limit(c);
}

/* ---- op queue -------------------------------------------------------------------------------- */

struct op *op_at(struct client *c, size_t i)
{
    return &c->ops[(c->ops_head + i) % c->ops_cap];
}

static int cl_push_barrier(struct client *c);

struct op *op_push(struct client *c, enum op_kind kind)
{
    struct op *o;

    if (kind == OP_LOCAL && c->push_barrier && cl_push_barrier(c) < 0)
        return NULL;
    if (kind != OP_LOCAL)
        c->push_barrier = 0; /* its reply follows the pushes */
    if (c->ops_count == c->ops_cap) {
        size_t cap = c->ops_cap ? c->ops_cap * 2 : 16;
        struct op *n = malloc(cap * sizeof(*n));
        if (!n) {
            if (kind != OP_LOCAL && !c->pinned) /* see below */
                lk_schedule_fail(c->srv->shared, "fencegate is out of memory");
            return NULL;
        }
        for (size_t i = 0; i < c->ops_count; i++)
            n[i] = *op_at(c, i);
        free(c->ops);
        c->ops = n;
        c->ops_cap = cap;
        c->ops_head = 0;
    }
    if (kind != OP_LOCAL && !c->pinned) {
        if (lk_push(c->srv->shared, c) < 0) {
            /* Its bytes may be on the link already: without its entry every later reply would
             * go to the wrong client, so the link fails as a whole. */
            lk_schedule_fail(c->srv->shared, "fencegate is out of memory");
            return NULL;
        }
        c->used_shared = 1;
    }
    o = op_at(c, c->ops_count++);
    c->ops_pushed++;
    memset(o, 0, sizeof(*o));
    o->kind = (uint8_t)kind;
    o->nreplies = 1;
    if (c->silent_cmd && kind != OP_HIDDEN)
        o->flags = OPF_SILENT;
    return o;
}

static void op_pop(struct client *c)
{
    struct op *o = op_at(c, 0);

    free(o->reply);
    c->ops_head = (c->ops_head + 1) % c->ops_cap;
    c->ops_count--;
    if (c->wait_idle && c->ops_count == 0) { /* a SYNC waited for this (REQ_IDLE) */
        c->wait_idle = 0;
        cl_unblock(c);
    }
    if (c->ops_count == 0 && c->ops_cap > 64) {
        free(c->ops); /* give back what a long pipeline grew */
        c->ops = NULL;
        c->ops_cap = c->ops_head = 0;
    }
}

/* ---- output ---------------------------------------------------------------------------------- */

/* Writes bytes to the client: straight to the socket when nothing is queued, else queued. */
static void cl_send(struct client *c, const char *p, size_t n)
{
    if (n == 0 || c->dead)
        return;
    metrics_inc(&fg_metrics, M_BYTES_TO_CLIENTS, n);
    if (buf_len(&c->out) == 0 && !c->processing) {
        ssize_t w = write(c->fd, p, n);
        if (w < 0 && errno != EAGAIN && errno != EINTR) {
            c->dead = 1; /* the client went away; closed once the callback unwinds */
            return;
        }
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        }
    }
    if (n > 0 && buf_append(&c->out, p, n) != FG_OK) {
        log_error("client %" PRIu64 " %s: out of memory for %zu reply bytes; closing", c->id,
                  c->peer, n);
        c->dead = 1;
    }
}

static void up_drop(struct client *c, const char *why);

/* Whether fenced writes under the same locks may go as pipelined transactions: when configured,
 * not after the upstream broke a transaction's rules, and only with Redis 7 (fence_encode_txn()).
 */
static int srv_txn_ok(const struct server *s)
{
    return s->cfg->fenced_transactions && !s->no_txn &&
           cmd_table_has_subcommands(upstream_commands(s->up));
}

int up_txn_ok(const struct client *c)
{
    return srv_txn_ok(c->srv);
}

/* A pinned client's fenced writes under the same locks, gathered while its requests are parsed
 * and sent when anything else goes upstream or parsing stops: as one pipelined transaction when
 * there are several, as they came when there is one. */
struct srv_run {
    struct buf reqs;
    struct fence_layout lay[SRV_GROUP_MAX_WRITES]; /* offsets into reqs */
    size_t count;
    uint64_t first_op; /* the number (ops_pushed) of the first write's op */
};

static void up_write(struct client *c, const char *p, size_t n);

static void up_run_flush(struct client *c)
{
    struct srv_run *u = c->run;
    const char *reqs = buf_head(&u->reqs);
    size_t k = u->count, need;
    char *enc;

    c->run = NULL; /* taken: a write below that fails drops the upstream, and its ops */
    if (k < SRV_TXN_MIN_WRITES || !srv_txn_ok(c->srv)) {
        for (size_t i = 0; i < k && c->ufd >= 0; i++)
            up_write(c, reqs + u->lay[i].start, u->lay[i].end - u->lay[i].start);
    } else if (!(enc = malloc(need = fence_encode_txn(reqs, u->lay, k, NULL, 0)))) {
        c->dead = 1;
    } else {
        fence_encode_txn(reqs, u->lay, k, enc, need);
        up_write(c, enc, need);
        free(enc);
        metrics_inc(&fg_metrics, M_FENCED_TXNS, 1);
        if (c->ufd >= 0) /* still up: the run's first op is where it was pushed */
            op_at(c, c->ops_count - (size_t)(c->ops_pushed - u->first_op))->txn_run = (uint8_t)k;
    }
    buf_free(&u->reqs);
    free(u); /* an idle connection keeps none of it */
}

/* Adds a fenced write (p, n bytes laid out as lay says) to `g`, whose requests are in b. */
static int run_append(struct buf *b, struct fence_layout *g, const char *p, size_t n,
                      const struct fence_layout *lay)
{
    size_t base = buf_len(b);

    if (buf_append(b, p, n) != FG_OK)
        return -1;
    *g = *lay;
    fence_layout_shift(g, base);
    return 0;
}

/* Gathers a pinned client's fenced write; its op is pushed next. */
static void up_run_add(struct client *c, const char *p, size_t n, const struct fence_layout *lay)
{
    struct srv_run *u = c->run;

    if (u && (u->count == SRV_GROUP_MAX_WRITES || buf_len(&u->reqs) + n > SRV_GROUP_MAX_BYTES ||
              !fence_same_locks(buf_head(&u->reqs), &u->lay[0], p, lay)))
        up_run_flush(c);
    if (!c->run) {
        if (!(c->run = calloc(1, sizeof(*c->run)))) {
            c->dead = 1;
            return;
        }
        c->run->first_op = c->ops_pushed;
    }
    u = c->run;
    if (run_append(&u->reqs, &u->lay[u->count], p, n, lay) < 0) {
        c->dead = 1;
        return;
    }
    u->count++;
}

/* Sends bytes to the upstream, after the fenced writes gathered before them. */
void up_send(struct client *c, const char *p, size_t n)
{
    if (c->run)
        up_run_flush(c);
    up_write(c, p, n);
}

/* Writes bytes to the upstream (or queues them while it connects). A write that fails does not
 * drop the connection here: callers send while they hold an op of the queue that dropping it
 * would fail and free (a NOSCRIPT's write sent again, a held-back block after its check). The
 * error is kept, later bytes are discarded, and cl_update() drops the connection. */
static void up_write(struct client *c, const char *p, size_t n)
{
    if (n == 0 || c->uwrite_errno)
        return;
    metrics_inc(&fg_metrics, M_BYTES_TO_UPSTREAM, n);
    if (!c->pinned) {
        lk_send(c->srv->shared, p, n);
        return;
    }
    if (c->ustate == U_READY && buf_len(&c->uout) == 0) {
        ssize_t w = write(c->ufd, p, n);
        if (w < 0 && errno != EAGAIN && errno != EINTR) {
            c->uwrite_errno = errno;
            return;
        }
        if (w > 0) {
            p += w;
            n -= (size_t)w;
        }
    }
    if (n > 0 && buf_append(&c->uout, p, n) != FG_OK) {
        log_error("client %" PRIu64 " %s: out of memory for %zu request bytes; closing", c->id,
                  c->peer, n);
        c->dead = 1;
    }
}

void up_send_fenced(struct client *c, const char *p, size_t n, const struct fence_layout *lay)
{
    if (upstream_oom_possible(c->srv->up)) {
        up_send(c, p, n);
        return;
    }
    if (c->pinned) {
        /* Not where a transaction of fencegate's own would mix with the application's (its WATCH
         * or MULTI), nor where replies do not come one per request (RESP3 pushes, pub/sub). */
        if (c->in_multi || c->client_watched || c->resp3 || c->mode != MODE_NORMAL)
            up_send(c, p, n);
        else
            up_run_add(c, p, n, lay);
        return;
    }
    metrics_inc(&fg_metrics, M_BYTES_TO_UPSTREAM, n);
    lk_send_fenced(c->srv->shared, p, n, lay);
}

/* Accumulates contiguous byte ranges so a pipeline is written with one system call. */
void span_flush(struct client *c, struct span *s, int to_upstream)
{
    if (s->n) {
        if (to_upstream)
            up_send(c, s->p, s->n);
        else
            cl_send(c, s->p, s->n);
    }
    s->n = 0;
}

void span_add(struct client *c, struct span *s, const char *p, size_t n, int to_upstream)
{
    if (s->n && s->p + s->n == p) {
        s->n += n;
        return;
    }
    span_flush(c, s, to_upstream);
    s->p = p;
    s->n = n;
}

/* Sends every ready local reply now at the head of the queue. */
void ops_emit_ready(struct client *c)
{
    while (c->ops_count > 0) {
        struct op *o = op_at(c, 0);
        if (o->kind != OP_LOCAL || !o->reply)
            break;
        if (!(o->flags & OPF_SILENT))
            cl_send(c, o->reply, o->reply_len);
        op_pop(c);
    }
}

/* Queues a reply of our own, in pipeline order. Takes a copy. */
void cl_reply_local(struct client *c, const char *p, size_t n)
{
    struct op *o;

    metrics_inc(&fg_metrics, M_COMMANDS_LOCAL, 1);
    if (c->ops_count == 0 && !c->push_barrier) {
        if (!c->silent_cmd)
            cl_send(c, p, n);
        return;
    }
    o = op_push(c, OP_LOCAL);
    if (!o || !(o->reply = malloc(n))) {
        c->dead = 1;
        return;
    }
    memcpy(o->reply, p, n);
    o->reply_len = n;
}

void cl_reply_error(struct client *c, const char *fmt, ...)
{
    char buf[1024];
    va_list ap;
    int n;

    buf[0] = '-';
    va_start(ap, fmt);
    n = vsnprintf(buf + 1, sizeof(buf) - 3, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    n = n + 1 > (int)sizeof(buf) - 3 ? (int)sizeof(buf) - 3 : n + 1;
    for (int i = 1; i < n; i++)
        if (buf[i] == '\r' || buf[i] == '\n')
            buf[i] = ' ';
    buf[n++] = '\r';
    buf[n++] = '\n';
    cl_reply_local(c, buf, (size_t)n);
}

static void cl_reply_unavailable(struct client *c)
{
    char msg[512];
    int n = snprintf(msg, sizeof(msg),
                     "-UNAVAILABLE upstream %s is unreachable: %s (fencegate retries in the "
                     "background; try again shortly)\r\n",
                     upstream_name(c->srv->up), c->down_why[0] ? c->down_why : "unknown error");

    metrics_inc(&fg_metrics, M_UNAVAILABLE_REPLIES, 1);
    cl_reply_local(c, msg, (size_t)n < sizeof(msg) ? (size_t)n : sizeof(msg) - 1);
    upstream_wake(c->srv->up);
}

/* ---- upstream connection --------------------------------------------------------------------- */

static void up_on_read(evutil_socket_t fd, short what, void *arg);
static void up_on_write(evutil_socket_t fd, short what, void *arg);

static void up_close_fd(struct client *c)
{
    if (c->urev)
        event_free(c->urev);
    if (c->uwev)
        event_free(c->uwev);
    c->urev = c->uwev = NULL;
    c->urev_on = c->uwev_on = 0;
    if (c->ufd >= 0)
        close(c->ufd);
    c->ufd = -1;
    c->push_barrier = 0; /* no push can come from a closed connection */
    buf_free(&c->uin);
    buf_free(&c->uout);
    resp_scanner_init(&c->scan);
    c->rscan_off = 0;
    c->script_loaded = 0;
    c->txn_seen = 0;
    c->uwrite_errno = 0;
    if (c->run) { /* its writes fail with the connection */
        buf_free(&c->run->reqs);
        free(c->run);
        c->run = NULL;
    }
}

/* Every op that waited for the upstream gets -UNAVAILABLE instead, in order. */
static void ops_fail_upstream(struct client *c)
{
    size_t n = c->ops_count;

    for (size_t i = 0; i < n; i++) {
        struct op o = *op_at(c, 0);
        c->ops_head = (c->ops_head + 1) % c->ops_cap;
        c->ops_count--;
        if (o.kind == OP_LOCAL) {
            struct op *k = op_push(c, OP_LOCAL);
            if (!k) {
                free(o.reply);
                c->dead = 1;
                continue;
            }
            *k = o;
        } else {
            unsigned silent = c->silent_cmd;
            free(o.reply); /* a fenced write's request, kept for a NOSCRIPT */
            c->silent_cmd = (o.flags & OPF_SILENT) != 0;
            for (uint32_t r = 0; o.kind == OP_FORWARD && r < o.nreplies; r++)
                cl_reply_unavailable(c);
            c->silent_cmd = silent;
        }
    }
    /* A barrier on a failed command is gone; one on an unanswered reply of our own (FENCE.ACQUIRE
     * waiting for its lock) still holds: what follows it must not run before the lock is held. */
    c->blocked = c->wait_idle = 0;
    for (size_t i = 0; i < c->ops_count; i++)
        if (op_at(c, i)->kind == OP_LOCAL && !op_at(c, i)->reply)
            c->blocked = 1;
    ops_emit_ready(c);
}

/* The upstream could not be reached: pending commands fail, later ones retry when it is back. */
static void up_connect_failed(struct client *c, const char *why)
{
    snprintf(c->down_why, sizeof(c->down_why), "%s", why);
    metrics_inc(&fg_metrics, M_UPSTREAM_CONNECT_ERRORS, 1);
    log_debug("client %" PRIu64 " %s: upstream connect failed: %s", c->id, c->peer, why);
    upstream_report_failure(c->srv->up, why);
    up_close_fd(c);
    c->ustate = U_DOWN;
    ops_fail_upstream(c);
}

/* The upstream connection broke while in use. Its server-side state (database, transaction,
 * subscriptions) is gone, so the client connection ends too, as it would with Redis itself. */
static void up_drop(struct client *c, const char *why)
{
    if (c->dead)
        return;
    /* Redis closes on purpose after QUIT, after a CLIENT KILL that named this connection, and
     * in place of SHUTDOWN's reply: what was sent behind them is never answered, as with Redis. */
    if (c->quit_sent || c->end_expected ||
        (c->ops_count && (op_at(c, 0)->flags & OPF_MAY_END) && !c->reply_partial)) {
        c->closing = 1;
        up_close_fd(c);
        c->ustate = U_DOWN;
        return;
    }
    metrics_inc(&fg_metrics, M_UPSTREAM_DROPS, 1);
    log_warn("client %" PRIu64 " %s: upstream connection lost: %s", c->id, c->peer, why);
    snprintf(c->down_why, sizeof(c->down_why), "connection lost: %s", why);
    if (c->reply_partial) {
        c->dead = 1; /* half a reply went out; nothing can follow it */
        return;
    }
    up_close_fd(c);
    c->ustate = U_DOWN;
    if (c->mode == MODE_NORMAL)
        ops_fail_upstream(c);
    c->closing = 1;
}

static int up_connect(struct client *c)
{
    const struct net_addr *a = upstream_addr(c->srv->up);
    const char *prelude;
    size_t plen;
    int nrep;

    if (!a) {
        snprintf(c->down_why, sizeof(c->down_why), "%s", upstream_error(c->srv->up));
        return -1;
    }
    c->ufd = net_connect(a);
    if (c->ufd < 0) {
        int e = errno;
        if (e == EMFILE ||
            e == ENFILE) { /* our shortage, not the upstream's: do not mark it down */
            snprintf(c->down_why, sizeof(c->down_why), "fencegate is out of descriptors: %s",
                     strerror(e));
            c->ustate = U_DOWN;
            ops_fail_upstream(c);
            return -1;
        }
        up_connect_failed(c, strerror(e));
        return -1;
    }
    c->urev = event_new(c->srv->base, c->ufd, EV_READ | EV_PERSIST, up_on_read, c);
    c->uwev = event_new(c->srv->base, c->ufd, EV_WRITE | EV_PERSIST, up_on_write, c);
    if (!c->urev || !c->uwev) {
        c->dead = 1;
        return -1;
    }
    c->ustate = U_CONNECTING;
    prelude = upstream_prelude(c->srv->up, &plen, &nrep);
    if (plen) {
        up_send(c, prelude, plen);
        for (int i = 0; i < nrep; i++) {
            struct op *o = op_push(c, OP_HIDDEN);
            if (!o) {
                c->dead = 1;
                return -1;
            }
            o->flags |= OPF_PRELUDE;
        }
    }
    return 0;
}

/* ---- the shared upstream connection ---------------------------------------------------------- */

static int rep_normal(struct client *c, const char *r, size_t n, char type, struct span *sp);
static int rep_may_stream(const struct client *c, char top_type);

static int lk_push(struct ulink *lk, struct client *c)
{
    if (lk->who_count == lk->who_cap) {
        size_t cap = lk->who_cap ? lk->who_cap * 2 : 64;
        struct who_ent *n = malloc(cap * sizeof(*n));
        if (!n)
            return -1;
        for (size_t i = 0; i < lk->who_count; i++)
            n[i] = lk->who[(lk->who_head + i) % lk->who_cap];
        free(lk->who);
        lk->who = n;
        lk->who_cap = cap;
        lk->who_head = 0;
    }
    lk->who[(lk->who_head + lk->who_count++) % lk->who_cap] = (struct who_ent){c, 0, 0};
    lk->who_seq++;
    if (c) {
        c->shared_pending++;
        if (lk->who_count >= lk->due_cap)
            lk->due_full = 1;
    }
    return 0;
}

static struct who_ent *lk_at(const struct ulink *lk, size_t i)
{
    return &lk->who[(lk->who_head + i) % lk->who_cap];
}

static struct client *lk_head(const struct ulink *lk)
{
    return lk->who_count ? lk_at(lk, 0)->c : NULL;
}

static void lk_pop(struct ulink *lk)
{
    struct client *c = lk_at(lk, 0)->c;

    if (c)
        c->shared_pending--;
    lk->who_head = (lk->who_head + 1) % lk->who_cap;
    lk->who_count--;
}

/* A client that closes leaves its replies to be read and dropped. */
static void lk_forget(struct ulink *lk, struct client *c)
{
    for (size_t i = 0; c->shared_pending && i < lk->who_count; i++) {
        struct who_ent *w = lk_at(lk, i);
        if (w->c == c) {
            w->c = NULL;
            c->shared_pending--;
        }
    }
}

static void lk_close_fd(struct ulink *lk)
{
    if (lk->flush_due)
        event_del(lk->flush_ev);
    lk->flush_due = 0;
    if (lk->rev)
        event_free(lk->rev);
    if (lk->wev)
        event_free(lk->wev);
    lk->rev = lk->wev = NULL;
    lk->rev_on = lk->wev_on = 0;
    if (lk->fd >= 0)
        close(lk->fd);
    lk->fd = -1;
    lk->state = U_DOWN;
    buf_free(&lk->in);
    buf_free(&lk->out);
    resp_scanner_init(&lk->scan);
    lk->rscan_off = 0;
    lk->prelude_left = lk->quiet_left = 0;
    lk->script_loaded = lk->group_loaded = 0;
    buf_free(&lk->g_reqs);
    lk->g_count = 0;
    lk->txn_seen = 0;
    lk->failed = 0;
    lk->out_full = lk->due_full = 0;
}

/* The link is gone: every reply still due to a client becomes -UNAVAILABLE, in order. The
 * clients stay connected (they had no state on the server), except one that was being sent half
 * a reply. Runs only from the link's own callbacks, never inside a client's. */
static void lk_fail(struct ulink *lk, const char *why)
{
    struct server *s = lk->srv;
    struct client *c, *next;

    if (lk->state == U_READY) {
        metrics_inc(&fg_metrics, M_UPSTREAM_DROPS, 1);
        log_warn("shared upstream connection lost: %s", why);
    }
    snprintf(lk->why, sizeof(lk->why), "%s", why);
    lk_close_fd(lk);
    for (size_t i = 0; i < lk->who_count; i++) {
        c = lk_at(lk, i)->c;
        if (c)
            c->shared_pending = 0;
    }
    lk->who_count = lk->who_head = 0;
    for (c = s->clients; c; c = next) {
        next = c->next;
        if (c->pinned)
            continue;
        if (c->ops_count == 0) {
            cl_update(c); /* one stopped by a full link may go on */
            continue;
        }
        if (c->reply_partial) {
            c->dead = 1; /* half a reply went out; nothing can follow it */
        } else {
            snprintf(c->down_why, sizeof(c->down_why), "%s", why);
            ops_fail_upstream(c);
        }
        cl_update(c);
    }
}

static void lk_on_fail(evutil_socket_t fd, short what, void *arg)
{
    struct ulink *lk = arg;

    if (lk->failed)
        lk_fail(lk, lk->why);
}

/* A write failed inside some client's callback: fail the link from a callback of its own. */
static void lk_schedule_fail(struct ulink *lk, const char *why)
{
    if (lk->failed)
        return;
    lk->failed = 1;
    snprintf(lk->why, sizeof(lk->why), "connection lost: %s", why);
    event_active(lk->fail_ev, 0, 0);
}

static void lk_update(struct ulink *lk)
{
    ev_want(lk->rev, &lk->rev_on, lk->state == U_READY && !lk->failed);
    ev_want(lk->wev, &lk->wev_on,
            !lk->failed &&
                (lk->state == U_CONNECTING || (lk->state == U_READY && buf_len(&lk->out) > 0)));
}

static void lk_want_flush(struct ulink *lk)
{
    if (buf_len(&lk->out) + buf_len(&lk->g_reqs) >= (size_t)lk->srv->cfg->max_pending_bytes)
        lk->out_full = 1;
    if (lk->state == U_READY && !lk->wev_on && !lk->flush_due) {
        lk->flush_due = 1;
        event_active(lk->flush_ev, 0, 0);
    }
}

/* Appends writes [a, b) of the open group to `out` (encoded straight into it): one write as it
 * came, several as one call of the group script, or (txn) as one pipelined transaction. The `who`
 * entry of write a (number g_seq + a) records how many writes the call answers. Returns -1 when
 * out of memory. */
static int lk_emit(struct ulink *lk, size_t a, size_t b, int txn)
{
    const struct server *s = lk->srv;
    const struct fence_layout *lay = lk->g_lay + a;
    const char *reqs = buf_head(&lk->g_reqs), *sha;
    size_t k = b - a, need;
    struct who_ent *w;

    if (k == 0)
        return 0;
    sha = lk->group_loaded ? s->group_sha : NULL;
    need = txn      ? fence_encode_txn(reqs, lay, k, NULL, 0)
           : k == 1 ? lay->end - lay->start
                    : fence_encode_group(sha, reqs, lay, k, NULL, 0);
    if (buf_reserve(&lk->out, need) != FG_OK)
        return -1;
    if (txn) {
        fence_encode_txn(reqs, lay, k, lk->out.data + lk->out.end, need);
        metrics_inc(&fg_metrics, M_FENCED_TXNS, 1);
    } else if (k == 1)
        memcpy(lk->out.data + lk->out.end, reqs + lay->start, need);
    else
        fence_encode_group(sha, reqs, lay, k, lk->out.data + lk->out.end, need);
    lk->out.end += need;
    if (txn || k > 1) {
        if (!txn) /* an EVAL, if it was one, put the group script in the cache */
            lk->group_loaded = 1;
        w = lk_at(lk, lk->who_count - (size_t)(lk->who_seq - (lk->g_seq + a)));
        w->grp = (uint32_t)k;
        w->txn = txn != 0;
    }
    return 0;
}

/* Sends the open group: each run of at least SRV_TXN_MIN_WRITES writes under the same locks as a
 * pipelined transaction, the writes between runs as they came or as a call of the group script. */
static void lk_close_group(struct ulink *lk)
{
    const char *reqs = buf_head(&lk->g_reqs);
    size_t k = lk->g_count, from = 0, i = 0, j;

    if (k == 0)
        return;
    lk->g_count = 0;
    while (i < k) {
        for (j = i + 1; j < k && fence_same_locks(reqs, &lk->g_lay[i], reqs, &lk->g_lay[j]); j++)
            ;
        if (j - i >= SRV_TXN_MIN_WRITES && srv_txn_ok(lk->srv)) {
            if (lk_emit(lk, from, i, 0) < 0 || lk_emit(lk, i, j, 1) < 0)
                goto nomem;
            from = j;
        }
        i = j;
    }
    if (lk_emit(lk, from, k, 0) < 0)
        goto nomem;
    buf_consume(&lk->g_reqs, buf_len(&lk->g_reqs));
    return;
nomem:
    lk_schedule_fail(lk, "fencegate is out of memory");
}

/* Queues bytes for the link. They are written once the event loop has handled every event that
 * was ready with them (flush_ev runs lk_on_write), so the requests of many clients travel in one
 * write and Redis reads them with one read: the point of sharing a connection. */
static void lk_send(struct ulink *lk, const char *p, size_t n)
{
    if (lk->failed)
        return; /* its replies fail with the link */
    lk_close_group(lk);
    if (buf_append(&lk->out, p, n) != FG_OK) {
        lk_schedule_fail(lk, "fencegate is out of memory");
        return;
    }
    lk_want_flush(lk);
}

/* A fenced write joins the open group when its `who` entry (pushed next) follows the group's. */
static void lk_send_fenced(struct ulink *lk, const char *p, size_t n,
                           const struct fence_layout *lay)
{
    if (lk->failed)
        return;
    if (lk->g_count > 0 &&
        (lk->who_seq != lk->g_seq + lk->g_count || lk->g_count == SRV_GROUP_MAX_WRITES ||
         buf_len(&lk->g_reqs) + n > SRV_GROUP_MAX_BYTES))
        lk_close_group(lk);
    if (lk->g_count == 0)
        lk->g_seq = lk->who_seq;
    if (run_append(&lk->g_reqs, &lk->g_lay[lk->g_count], p, n, lay) < 0) {
        lk_schedule_fail(lk, "fencegate is out of memory");
        return;
    }
    lk->g_count++;
    lk_want_flush(lk);
}

static void lk_on_read(evutil_socket_t fd, short what, void *arg);
static void lk_on_write(evutil_socket_t fd, short what, void *arg);

/* Opens the shared connection (asynchronously), with the upstream's AUTH/SELECT prelude queued.
 * Returns -1 when it could not even start; lk->why says why. */
static int lk_connect(struct ulink *lk)
{
    static const char noevict[] = "*3\r\n$6\r\nCLIENT\r\n$8\r\nNO-EVICT\r\n$2\r\non\r\n";
    struct server *s = lk->srv;
    const struct net_addr *a = upstream_addr(s->up);
    const char *prelude;
    size_t plen;
    int nrep;

    if (!a) {
        snprintf(lk->why, sizeof(lk->why), "%s", upstream_error(s->up));
        return -1;
    }
    lk->fd = net_connect(a);
    if (lk->fd < 0) {
        int e = errno;
        if (e == EMFILE || e == ENFILE) { /* our shortage, not the upstream's */
            snprintf(lk->why, sizeof(lk->why), "fencegate is out of descriptors: %s", strerror(e));
        } else {
            snprintf(lk->why, sizeof(lk->why), "%s", strerror(e));
            metrics_inc(&fg_metrics, M_UPSTREAM_CONNECT_ERRORS, 1);
            upstream_report_failure(s->up, lk->why);
        }
        return -1;
    }
    lk->rev = event_new(s->base, lk->fd, EV_READ | EV_PERSIST, lk_on_read, lk);
    lk->wev = event_new(s->base, lk->fd, EV_WRITE | EV_PERSIST, lk_on_write, lk);
    if (!lk->rev || !lk->wev) {
        lk_close_fd(lk);
        snprintf(lk->why, sizeof(lk->why), "fencegate is out of memory");
        return -1;
    }
    lk->state = U_CONNECTING;
    prelude = upstream_prelude(s->up, &plen, &nrep);
    for (int i = 0; i < nrep; i++)
        if (lk_push(lk, NULL) < 0) {
            lk_close_fd(lk);
            snprintf(lk->why, sizeof(lk->why), "fencegate is out of memory");
            return -1;
        }
    lk->prelude_left = nrep;
    if (plen)
        lk_send(lk, prelude, plen);
    /* Many clients' requests and replies pass on this one connection, which makes it the
     * biggest client Redis 7's client eviction (maxmemory-clients) would pick, and every
     * unpinned client would lose its requests with it. Excluded, each client's bytes are
     * bounded by max_pending_bytes instead. An error (before 7.0, or an ACL) changes nothing. */
    if (lk_push(lk, NULL) < 0) {
        lk_close_fd(lk);
        snprintf(lk->why, sizeof(lk->why), "fencegate is out of memory");
        return -1;
    }
    lk->quiet_left = 1;
    lk_send(lk, noevict, sizeof(noevict) - 1);
    lk_update(lk);
    return 0;
}

/* Redis took enough of what waited for it, or answered enough of what it had: lets the unpinned
 * clients held back by a full link go on. The walk starts one client further down the list each
 * time, so that the clients near its head, which could fill the link again at once, do not keep
 * those behind them waiting. */
static void lk_resume_clients(struct ulink *lk)
{
    struct client *c, *next;
    size_t k, i;

    if (lk->out_full || lk->due_full || lk->srv->nclients == 0)
        return;
    k = lk->resume_turn++ % (size_t)lk->srv->nclients;
    for (c = lk->srv->clients, i = 0; c && i < k; i++)
        c = c->next;
    for (; c; c = next) { /* clients k.. */
        next = c->next;
        if (!c->pinned)
            cl_update(c);
    }
    for (c = lk->srv->clients, i = 0; c && i < k; c = next, i++) { /* then ..k-1 */
        next = c->next;
        if (!c->pinned)
            cl_update(c);
    }
}

static void lk_on_write(evutil_socket_t fd, short what, void *arg)
{
    struct ulink *lk = arg;

    lk->flush_due = 0;
    if (lk->failed)
        return;
    if (lk->state == U_CONNECTING) {
        int e = net_connect_result(lk->fd);
        if (e != 0) {
            metrics_inc(&fg_metrics, M_UPSTREAM_CONNECT_ERRORS, 1);
            upstream_report_failure(lk->srv->up, strerror(e));
            lk_fail(lk, strerror(e));
            return;
        }
        lk->state = U_READY;
    }
    lk_close_group(lk);
    if (lk->failed)
        return;
    while (buf_len(&lk->out) > 0) {
        ssize_t w = write(lk->fd, buf_head(&lk->out), buf_len(&lk->out));
        if (w < 0) {
            if (errno != EAGAIN && errno != EINTR) {
                lk_fail(lk, strerror(errno));
                return;
            }
            break;
        }
        buf_consume(&lk->out, (size_t)w);
    }
    lk_update(lk);
    if (lk->out_full && buf_len(&lk->out) < (size_t)lk->srv->cfg->max_pending_bytes) {
        lk->out_full = 0;
        lk_resume_clients(lk);
    }
}

/* Sends the bytes gathered for client `to` and lets it act on what it received. */
static void lk_hand_over(struct client **to, struct span *sp)
{
    if (*to) {
        span_flush(*to, sp, 0);
        cl_update(*to); /* may close it */
        *to = NULL;
    }
}

/* Gives one reply to the client at the head of `who` (dropped when it has gone). */
static void lk_deliver(struct ulink *lk, const char *r, size_t n, char type, struct client **to,
                       struct span *sp)
{
    struct client *c = lk_head(lk);

    if (c != *to)
        lk_hand_over(to, sp);
    lk_pop(lk);
    if (c) {
        *to = c;
        if (rep_normal(c, r, n, type, sp) < 0)
            c->dead = 1;
        c->reply_partial = 0;
    }
}

/* The start of p as printable text (\xNN for other bytes), for a log line. */
static const char *shown_bytes(const char *p, size_t n, char *out, size_t cap)
{
    size_t k = 0;

    out[0] = '\0';
    for (size_t i = 0; i < n && k + 5 < cap; i++)
        k += (size_t)snprintf(out + k, cap - k, (p[i] >= 0x20 && p[i] < 0x7f) ? "%c" : "\\x%02x",
                              (unsigned char)p[i]);
    return out;
}

/* One whole reply: where it lies and its type. */
struct srv_reply {
    const char *p;
    size_t n;
    char type;
};

/* Cuts `count` whole replies off the front of p[0..n) into out. Returns the bytes they take, or
 * 0 when p does not start with that many. */
static size_t replies_cut(const char *p, size_t n, size_t count, struct srv_reply *out)
{
    size_t off = 0, used;

    for (size_t i = 0; i < count; i++) {
        struct resp_scanner sc;
        resp_scanner_init(&sc);
        if (resp_scan_reply(&sc, p + off, n - off, &used) != RESP_SCAN_DONE)
            return 0;
        out[i] = (struct srv_reply){p + off, used, sc.top_type};
        off += used;
    }
    return off;
}

/* The elements of r, an array of exactly count whole replies. Returns 0, or -1 when r is not. */
static int reply_elements(const struct srv_reply *r, size_t count, struct srv_reply *out)
{
    const char *p = r->p + 1, *end = r->p + r->n;
    size_t got = 0;

    if (r->type != '*')
        return -1;
    while (p < end && *p >= '0' && *p <= '9' && got <= count)
        got = got * 10 + (size_t)(*p++ - '0');
    if (got != count || end - p < 2 || p[0] != '\r')
        return -1;
    p += 2;
    return replies_cut(p, (size_t)(end - p), count, out) == (size_t)(end - p) ? 0 : -1;
}

/* The reply to a group of k fenced writes: an array whose elements answer them in order, or one
 * error (NOSCRIPT, OOM, ...) that answers each of them. Returns -1 for anything else. */
static int lk_deliver_group(struct ulink *lk, const char *r, size_t n, size_t k, struct client **to,
                            struct span *sp)
{
    struct srv_reply whole = {r, n, r[0]}, el[SRV_GROUP_MAX_WRITES];

    if (r[0] == '-') {
        if (n > 9 && memcmp(r, "-NOSCRIPT", 9) == 0)
            lk->group_loaded = 0;
        for (size_t i = 0; i < k; i++)
            lk_deliver(lk, r, n, '-', to, sp);
        return 0;
    }
    if (reply_elements(&whole, k, el) < 0)
        return -1;
    for (size_t i = 0; i < k; i++)
        lk_deliver(lk, el[i].p, el[i].n, el[i].type, to, sp);
    return 0;
}

static int reply_is(const struct srv_reply *r, const char *text)
{
    return r->n == strlen(text) && memcmp(r->p, text, r->n) == 0;
}

/* Splits the replies to a pipelined transaction of k fenced writes (fence_encode_txn()), r[0..n):
 * WATCH's, the check's, MULTI's and each write's queueing, then EXEC's. out[0..k) gets the reply
 * for each write: its element of EXEC's array; when EXEC applied nothing, why (the check's
 * refusal, else the write's own refusal when queued, else EXEC's error). Returns 1 when the writes
 * were applied without a check that passed, or outside MULTI (*odd being the reply that says so),
 * 0 otherwise, -1 when the replies are not a transaction's. */
static int txn_split(const char *r, size_t n, size_t k, struct srv_reply *out,
                     struct srv_reply *odd)
{
#define TXN_MOVED                                                                                  \
    "-STALE a lock of this write changed hands while it was in flight; it was not applied "        \
    "(re-acquire)\r\n"
    static const struct srv_reply moved = {TXN_MOVED, sizeof(TXN_MOVED) - 1, '-'};
#undef TXN_MOVED
    struct srv_reply rep[SRV_TXN_EXTRA_REPLIES + SRV_GROUP_MAX_WRITES], el[SRV_GROUP_MAX_WRITES];
    const struct srv_reply *check = &rep[1], *queued = &rep[3], *exec;
    int watch_ok;

    if (k == 0 || k > SRV_GROUP_MAX_WRITES ||
        replies_cut(r, n, SRV_TXN_EXTRA_REPLIES + k, rep) != n)
        return -1;
    exec = &rep[3 + k];
    watch_ok = reply_is(&rep[0], "+OK\r\n");
    /* MULTI refused: the writes ran on their own, as the queue replies show */
    if (!reply_is(&rep[2], "+OK\r\n")) {
        *odd = rep[2];
        memcpy(out, queued, k * sizeof(*out));
        return 1;
    }
    if (reply_elements(exec, k, el) == 0) { /* applied */
        memcpy(out, el, k * sizeof(*out));
        if (watch_ok && reply_is(check, ":0\r\n"))
            return 0;
        *odd = watch_ok ? *check : rep[0];
        return 1;
    }
    for (size_t i = 0; i < k; i++) {
        if (reply_is(exec, "*-1\r\n") || reply_is(exec, "_\r\n")) /* WATCH saw a mark move */
            out[i] = check->type == '-' ? *check : moved;
        else if (exec->type == '-') /* EXECABORT: say what was refused */
            out[i] = queued[i].type == '-' ? queued[i] : *exec;
        else
            return -1;
    }
    return 0;
}

/* The reply for each of the k writes of a pipelined transaction, into out (txn_split()). After
 * writes that went unfenced, logs it and has fenced writes go as script calls from then on.
 * Returns 0, or -1 when the replies are not a transaction's. */
static int txn_replies(struct server *s, const char *r, size_t n, size_t k, struct srv_reply *out)
{
    struct srv_reply odd;
    int unfenced = txn_split(r, n, k, out, &odd);
    char shown[64];

    if (unfenced < 0)
        return -1;
    if (unfenced) {
        log_error("fenced writes in a pipelined transaction may have gone without the fence: the "
                  "upstream answered %s; fenced writes go as script calls from now on",
                  shown_bytes(odd.p, odd.n, shown, sizeof(shown)));
        s->no_txn = 1;
    }
    return 0;
}

/* Gives each of the k writes of a pipelined transaction its reply, on a pinned connection.
 * Returns -1 when they cannot be paired. */
static int up_deliver_txn(struct client *c, const char *r, size_t n, size_t k, struct span *sp)
{
    struct srv_reply out[SRV_GROUP_MAX_WRITES];

    if (txn_replies(c->srv, r, n, k, out) < 0)
        return -1;
    for (size_t i = 0; i < k; i++) {
        if (rep_normal(c, out[i].p, out[i].n, out[i].type, sp) < 0)
            return -1;
        c->reply_partial = 0;
    }
    return 0;
}

/* Gives each of the k writes of a pipelined transaction its reply, on the shared connection. */
static int lk_deliver_txn(struct ulink *lk, const char *r, size_t n, size_t k, struct client **to,
                          struct span *sp)
{
    struct srv_reply out[SRV_GROUP_MAX_WRITES];

    if (txn_replies(lk->srv, r, n, k, out) < 0)
        return -1;
    for (size_t i = 0; i < k; i++)
        lk_deliver(lk, out[i].p, out[i].n, out[i].type, to, sp);
    return 0;
}

/* Why a reply stream was given up: what the scanner choked on, so the log shows it. */
static const char *bad_reply_why(const char *reply, size_t at, size_t avail, char *out, size_t cap)
{
    char shown[64];

    snprintf(out, cap, "protocol error in upstream reply (byte %zu of it, from: %s)", at,
             shown_bytes(reply, avail, shown, sizeof(shown)));
    return out;
}

/* Handles reply bytes src[0..len) (the first lk->rscan_off already scanned): each whole reply goes
 * to the client at the head of `who`. Returns the bytes handled, or -1 when the link failed. */
static long lk_process(struct ulink *lk, const char *src, size_t len)
{
    size_t pos = 0, scan = lk->rscan_off, used;
    struct span sp = {NULL, 0};
    struct client *to = NULL, *c;
    uint32_t grp;
    int rc, txn;

    batch_start();
    while (scan < len && !lk->failed) {
        rc = resp_scan_reply(&lk->scan, src + scan, len - scan, &used);
        scan += used;
        if (rc == RESP_SCAN_INVALID) {
            char why[160];
            lk_hand_over(&to, &sp);
            lk_fail(lk, bad_reply_why(src + pos, scan - pos, len - pos, why, sizeof(why)));
            return -1;
        }
        if (lk->who_count == 0) {
            lk_hand_over(&to, &sp);
            lk_fail(lk, "the upstream sent a reply nobody asked for");
            return -1;
        }
        c = lk_head(lk);
        grp = lk_at(lk, 0)->grp;
        txn = lk_at(lk, 0)->txn;
        if (c != to)
            lk_hand_over(&to, &sp);
        if (grp > 1 || txn) { /* a call answering several writes is split whole, never streamed */
            if (rc == RESP_SCAN_MORE)
                break;
            if (txn && ++lk->txn_seen < grp + SRV_TXN_EXTRA_REPLIES)
                continue; /* the transaction's next reply */
            lk->txn_seen = 0;
            if ((txn ? lk_deliver_txn : lk_deliver_group)(lk, src + pos, scan - pos, grp, &to,
                                                          &sp) < 0) {
                lk_hand_over(&to, &sp);
                lk_fail(lk, txn ? "the upstream's replies to a pipelined transaction of fenced "
                                  "writes are not those of a transaction"
                                : "the upstream's reply to a group of fenced writes is not one "
                                  "reply per write");
                return -1;
            }
            pos = scan;
            continue;
        }
        if (rc == RESP_SCAN_MORE) {
            /* Stream an unfinished reply where its client allows; drop a gone client's as it
             * comes. The prelude's replies are kept whole, to be read. */
            if (scan > pos && (c ? rep_may_stream(c, lk->scan.top_type) : !lk->prelude_left)) {
                if (c) {
                    span_add(c, &sp, src + pos, scan - pos, 0);
                    c->reply_partial = 1;
                    to = c;
                }
                pos = scan;
            }
            break;
        }
        if (!c && lk->prelude_left > 0) {
            size_t n = scan - pos; /* "-ERR ...\r\n" */
            lk_pop(lk);
            lk->prelude_left--;
            if (lk->scan.top_type == '-') {
                char why[200];
                snprintf(why, sizeof(why), "it rejected fencegate's AUTH/SELECT: %.*s",
                         (int)(n < 3         ? 0
                               : n - 3 > 120 ? 120
                                             : n - 3),
                         src + pos + 1);
                lk_fail(lk, why);
                return -1;
            }
        } else if (!c && lk->quiet_left > 0) {
            lk_pop(lk);
            lk->quiet_left--;
        } else {
            lk_deliver(lk, src + pos, scan - pos, lk->scan.top_type, &to, &sp);
        }
        pos = scan;
    }
    lk_hand_over(&to, &sp);
    lk->rscan_off = scan - pos;
    return (long)pos;
}

/* Counts n reply bytes handled, of which `replies` whole replies, and sets the budget of
 * replies due from their mean size: Redis builds every reply to what one read brought before it
 * writes any, and replies of many MB at once on one connection make it slow (a pipeline of 800
 * 16 KB GETs ran at a seventh of the rate of one of 64). A client is held back while the budget
 * is spent (cl_can_parse()) and lets go once half of it is free again. */
static void lk_account(struct ulink *lk, size_t n, uint64_t replies)
{
    uint64_t mean;

    lk->rx_bytes += n;
    lk->rx_replies += replies;
    if (lk->rx_replies >= 1024) {
        lk->rx_bytes /= 2;
        lk->rx_replies /= 2;
    }
    mean = lk->rx_replies ? lk->rx_bytes / lk->rx_replies : 0;
    lk->due_cap = mean == 0                             ? SIZE_MAX
                  : mean >= SRV_DUE_BYTES / SRV_DUE_MIN ? SRV_DUE_MIN
                                                        : (size_t)(SRV_DUE_BYTES / mean);
    if (lk->due_full && lk->who_count <= lk->due_cap / 2) {
        lk->due_full = 0;
        lk_resume_clients(lk);
    }
}

static long lk_handle(void *arg, const char *src, size_t len)
{
    struct ulink *lk = arg;
    uint64_t popped = lk->who_seq - lk->who_count;
    long done;

    upstream_report_alive(lk->srv->up);
    done = lk_process(lk, src, len);
    if (lk->fd < 0)
        return -1;
    lk_account(lk, (size_t)done, lk->who_seq - lk->who_count - popped);
    return done;
}

static void lk_on_read(evutil_socket_t fd, short what, void *arg)
{
    struct ulink *lk = arg;
    const char *why;

    if (srv_read_reply(lk->fd, &lk->in, lk_handle, lk, &why) < 0)
        lk_fail(lk, why);
}

static void lk_free(struct ulink *lk);

static struct ulink *lk_new(struct server *s)
{
    struct ulink *lk = calloc(1, sizeof(*lk));

    if (!lk)
        return NULL;
    lk->srv = s;
    lk->due_cap = SIZE_MAX;
    lk->fd = -1;
    resp_scanner_init(&lk->scan);
    lk->fail_ev = event_new(s->base, -1, 0, lk_on_fail, lk);
    lk->flush_ev = event_new(s->base, -1, 0, lk_on_write, lk);
    if (!lk->fail_ev || !lk->flush_ev) {
        lk_free(lk);
        return NULL;
    }
    return lk;
}

static void lk_free(struct ulink *lk)
{
    if (!lk)
        return;
    lk_close_fd(lk);
    if (lk->fail_ev)
        event_free(lk->fail_ev);
    if (lk->flush_ev)
        event_free(lk->flush_ev);
    free(lk->who);
    free(lk);
}

/* Whether c's requests use the shared connection; connects it when needed. 0 when c can send
 * now (the bytes are queued while it connects), -1 when it is down (c->down_why says why). */
static int lk_ready_for(struct client *c)
{
    struct ulink *lk = c->srv->shared;

    if (lk->state == U_DOWN && !lk->failed) {
        if (upstream_is_up(c->srv->up)) {
            if (lk_connect(lk) == 0)
                return 0;
        } else {
            snprintf(lk->why, sizeof(lk->why), "%s", upstream_error(c->srv->up));
        }
    }
    if (lk->state != U_DOWN && !lk->failed)
        return 0;
    snprintf(c->down_why, sizeof(c->down_why), "%s", lk->why);
    return -1;
}

void up_expect_again(struct client *c)
{
    if (!c->pinned && lk_push(c->srv->shared, c) < 0) {
        lk_schedule_fail(c->srv->shared, "fencegate is out of memory");
        c->dead = 1;
    }
}

int up_script_loaded(const struct client *c)
{
    return c->pinned ? c->script_loaded : c->srv->shared->script_loaded;
}

void up_set_script_loaded(struct client *c, int loaded)
{
    if (c->pinned)
        c->script_loaded = loaded != 0;
    else if (loaded)
        c->srv->shared->script_loaded = 1;
    else /* a SCRIPT FLUSH took the group script too */
        c->srv->shared->script_loaded = c->srv->shared->group_loaded = 0;
}

/* ---- replies --------------------------------------------------------------------------------- */

/* Whether bytes of an unfinished reply may go to the client before the reply is complete. */
static int rep_may_stream(const struct client *c, char top_type)
{
    const struct op *o;

    if (c->mode == MODE_PUBSUB && !c->marker_wait)
        return !(c->reply_off && top_type == '-'); /* an error to drop whole (rep_pubsub) */
    if (c->mode == MODE_MONITOR)
        return 1;
    if (c->mode == MODE_PUBSUB)
        return 0;
    if (top_type == '>')
        return 1;
    if (c->ops_count == 0)
        return 0;
    o = &c->ops[c->ops_head];
    if (o->kind == OP_FORWARD && (o->flags & ~OPF_SILENT) == OPF_FENCED)
        return top_type != '-'; /* an error may be a NOSCRIPT to act on */
    return o->kind == OP_FORWARD && (o->flags & ~(OPF_BARRIER | OPF_SILENT)) == 0;
}

void cl_unblock(struct client *c)
{
    c->blocked = 0;
    c->stalled = 1;
}

/* What RESET does to the connection state fencegate keeps, in whatever mode it was sent (the mode
 * and the protocol change once its +RESET arrives). */
static void cl_reset_state(struct client *c)
{
    c->db = 0;
    c->reply_off = c->skip_next = c->in_multi = c->client_watched = 0;
}

/* A whole reply (r, n bytes; only its tail if part was already streamed) in pub/sub mode. Under
 * CLIENT REPLY OFF an error is dropped: in RESP2 pub/sub mode it can only answer a command (one
 * the mode refuses), and Redis answers none then; confirmations and messages still pass. */
static void rep_pubsub(struct client *c, const char *r, size_t n, struct span *sp)
{
    char pong[128];
    int pl;

    if (c->reply_off && !c->reply_partial && n > 0 && r[0] == '-')
        return;
    if (c->marker_wait && !c->reply_partial) {
        pl = snprintf(pong, sizeof(pong), "*2\r\n$4\r\npong\r\n$%zu\r\n%s\r\n", c->marker_len,
                      c->marker);
        if ((size_t)pl == n && memcmp(r, pong, n) == 0) { /* still subscribed */
            c->marker_wait = 0;
            c->pass_once = 1;
            cl_unblock(c);
            return;
        }
        pl = snprintf(pong, sizeof(pong), "$%zu\r\n%s\r\n", c->marker_len, c->marker);
        if ((size_t)pl == n && memcmp(r, pong, n) == 0) { /* the last subscription is gone */
            c->marker_wait = 0;
            c->mode = MODE_NORMAL;
            cl_unblock(c);
            return;
        }
    }
    span_add(c, sp, r, n, 0);
}

/* Pops the op a reply completed, then sends the replies of our own that were waiting behind it
 * (after the bytes gathered so far, to keep the order). */
static void rep_pop(struct client *c, struct span *sp)
{
    op_pop(c);
    if (c->ops_count && op_at(c, 0)->kind == OP_LOCAL) {
        span_flush(c, sp, 0);
        ops_emit_ready(c);
    }
}

/* A whole reply in normal mode: pairs it with the op at the head of the queue. Returns -1 when
 * the stream cannot be paired (the connection is then dropped). */
static int rep_normal(struct client *c, const char *r, size_t n, char type, struct span *sp)
{
    struct op *o;
    char *why;

    if (type == '>') { /* RESP3 push: out of band */
        span_add(c, sp, r, n, 0);
        return 0;
    }
    if (c->ops_count == 0 || op_at(c, 0)->kind == OP_LOCAL) {
        char shown[80];
        log_error("client %" PRIu64 " %s: upstream sent a reply nobody asked for (%s%s, RESP%d); "
                  "closing",
                  c->id, c->peer, shown_bytes(r, n, shown, sizeof(shown)), n > 16 ? "..." : "",
                  c->resp3 ? 3 : 2);
        return -1;
    }
    o = op_at(c, 0);
    if (o->kind == OP_HIDDEN) {
        if (type == '-' && (o->flags & OPF_PRELUDE)) {
            snprintf(c->down_why, sizeof(c->down_why), "it rejected fencegate's AUTH/SELECT: %.*s",
                     (int)(n > 120 ? 120 : n - 2), r + 1);
            span_flush(c, sp, 0);
            op_pop(c);
            up_close_fd(c);
            c->ustate = U_DOWN;
            ops_fail_upstream(c);
            return 0;
        }
        if (type == '-' && (o->flags & OPF_SCRIPT_LOAD))
            up_set_script_loaded(c, 0); /* refused (-BUSY, say): load it again next time */
        if (type == '-' && (o->flags & OPF_TXN_QUEUED) && !c->txn_err) {
            c->txn_err = malloc(n - 2); /* without '-' and CRLF, plus a NUL */
            if (c->txn_err) {
                memcpy(c->txn_err, r + 1, n - 3);
                c->txn_err[n - 3] = '\0';
            }
        }
        rep_pop(c, sp);
        return 0;
    }
    why = c->txn_err; /* the first refusal in a held-back block (or a script's check) */
    c->txn_err = NULL;
    if (why) {
        static const char generic[] =
            "-EXECABORT Transaction discarded because of previous errors.\r\n";
        if (r && n == sizeof(generic) - 1 && memcmp(r, generic, n) == 0) {
            /* Redis refused it at queue time, not (as it would have, had the block reached it
             * as it was typed) at EXEC: say why, as Redis's EXEC does. */
            char msg[1024];
            int ml = snprintf(msg, sizeof(msg),
                              "-EXECABORT Transaction discarded because of: %.960s\r\n", why);
            span_flush(c, sp, 0);
            if (ml > 0 && !(o->flags & OPF_SILENT))
                cl_send(c, msg, (size_t)ml);
            r = NULL;
        }
    }
    if (o->flags & OPF_TXN_CHECK) {
        if (fencing_txn_checked(c, r, n))
            r = NULL;    /* the block went out; EXEC's own reply will answer the application */
        o = op_at(c, 0); /* the block's ops were pushed behind it: the queue may have moved */
    }
    if (o->txn_exec && !c->reply_partial &&
        ((n == 5 && memcmp(r, "*-1\r\n", 5) == 0) || (n == 3 && memcmp(r, "_\r\n", 3) == 0))) {
        static const char moved[] =
            "-STALE a lock of this transaction changed hands before EXEC; nothing was applied "
            "(re-acquire)\r\n";
        char msg[1024];
        int ml = why ? snprintf(msg, sizeof(msg), "-%.960s%s\r\n", why,
                                (o->flags & OPF_UNWRAP) ? "" : "; the transaction was not applied")
                     : 0;
        if (why)
            fencing_on_reply(c, why, strlen(why));
        else
            metrics_inc(&fg_metrics, M_STALE_REFUSED, 1);
        span_flush(c, sp, 0);
        if (!(o->flags & OPF_SILENT))
            cl_send(c, ml > 0 ? msg : moved, ml > 0 ? (size_t)ml : sizeof(moved) - 1);
        r = NULL;
    } else if (o->txn_exec && why && r && type == '*') {
        /* A script alone or a MULTI block went in one round trip and was applied although its
         * check did not pass (a refusal while queueing would have aborted it; see
         * txn_replies() for runs of writes). */
        log_error("client %" PRIu64 " %s: a fenced script or MULTI block may have run without "
                  "the fence: its check was answered '%.200s'; fenced writes go as script calls "
                  "from now on",
                  c->id, c->peer, why);
        c->srv->no_txn = 1;
    }
    free(why);
    if (r && (o->flags & OPF_FENCED) && !c->reply_partial) {
        if (n > 9 && memcmp(r, "-NOSCRIPT", 9) == 0) {
            if (fencing_noscript(c, o))
                return 0; /* sent again; its reply is still to come */
            static const char gone[] =
                "-UNAVAILABLE the fence script vanished from the upstream (SCRIPT FLUSH?) while "
                "this write was pipelined; it was not applied, retry it\r\n";
            span_flush(c, sp, 0);
            if (!(o->flags & OPF_SILENT))
                cl_send(c, gone, sizeof(gone) - 1);
            r = NULL;
        } else {
            if ((o->flags & OPF_NULL_ARRAY) && n == 5 && memcmp(r, "$-1\r\n", 5) == 0)
                r = "*-1\r\n"; /* as Redis answers the write itself */
            fencing_on_reply(c, r, n);
        }
    }
    if (r && (o->flags & OPF_UNWRAP) && n > 4 && memcmp(r, "*1\r\n", 4) == 0) {
        struct srv_reply el[1] = {{NULL, 0, 0}}, whole = {r, n, '*'};
        if (reply_elements(&whole, 1, el) == 0) { /* the script's */
            r = el[0].p; /* never streamed (rep_may_stream), so the whole array is here */
            n = el[0].n;
        }
    }
    if (r && !(o->flags & OPF_SILENT))
        span_add(c, sp, r, n, 0);
    if (r && !c->reply_partial) {
        if ((o->flags & OPF_HELLO) && (type == '%' || type == '*')) {
            c->resp3 = type == '%';
            /* Back to RESP2 with subscriptions made in RESP3: their messages now come as
             * replies. Pub/sub mode pairs nothing, and its marker PING tells whether any
             * subscription is left. */
            if (!c->resp3 && c->sub_resp3) {
                c->mode = MODE_PUBSUB;
                c->sub_resp3 = 0;
            }
        }
        if ((o->flags & OPF_RESET) && type == '+') {
            c->resp3 = c->sub_resp3 = 0;
            c->mode = MODE_NORMAL;
        }
        if ((o->flags & OPF_ENTER_PUBSUB) && type == '*')
            c->mode = MODE_PUBSUB;
        if ((o->flags & OPF_SELECT) && type == '-' &&
            c->select_op == c->ops_pushed - c->ops_count) /* no SELECT after it */
            c->db = c->db_before;
        if ((o->flags & OPF_ENTER_MONITOR) && type == '+')
            c->mode = MODE_MONITOR;
    }
    if (--o->nreplies > 0 && c->mode == MODE_NORMAL)
        return 0;
    c->end_expected = (o->flags & OPF_MAY_END) && type != '-';
    metrics_observe(&fg_metrics, H_COMMAND_LATENCY, batch_now() - o->t0_us);
    if (o->flags & OPF_BARRIER)
        cl_unblock(c);
    rep_pop(c, sp);
    return 0;
}

/* Handles reply bytes src[0..len), whose first c->rscan_off bytes were scanned before. Returns
 * the bytes fully handled (the caller keeps the rest), or -1 after dropping the connection. */
static long rep_process(struct client *c, const char *src, size_t len)
{
    size_t pos = 0, scan = c->rscan_off, used;
    struct span sp = {NULL, 0};
    int rc;

    batch_start();
    while (scan < len && !c->dead && c->ufd >= 0) {
        if (c->mode == MODE_REPLICA) { /* verbatim from here on */
            span_add(c, &sp, src + pos, len - pos, 0);
            pos = scan = len;
            break;
        }
        if (c->blocked && scan == pos && c->ops_count &&
            (op_at(c, 0)->flags & OPF_ENTER_REPLICA)) { /* SYNC's op is a barrier */
            /* The replies before SYNC/PSYNC are all in: what follows is its stream, which
             * starts with newlines, a +FULLRESYNC line or an RDB payload, not one reply. */
            c->mode = MODE_REPLICA;
            cl_unblock(c);
            op_pop(c);
            continue;
        }
        rc = resp_scan_reply(&c->scan, src + scan, len - scan, &used);
        scan += used;
        if (rc == RESP_SCAN_INVALID) {
            char why[160];
            span_flush(c, &sp, 0);
            up_drop(c, bad_reply_why(src + pos, scan - pos, len - pos, why, sizeof(why)));
            return -1;
        }
        if (c->mode == MODE_NORMAL && c->ops_count && op_at(c, 0)->txn_run) {
            size_t k = op_at(c, 0)->txn_run;
            if (rc == RESP_SCAN_MORE)
                break; /* a transaction's replies are split whole, never streamed */
            if (++c->txn_seen < k + SRV_TXN_EXTRA_REPLIES)
                continue; /* the transaction's next reply */
            c->txn_seen = 0;
            c->end_expected = 0;
            if (up_deliver_txn(c, src + pos, scan - pos, k, &sp) < 0) {
                span_flush(c, &sp, 0);
                if (!c->dead)
                    up_drop(c, "the upstream's replies to a pipelined transaction of fenced "
                               "writes are not those of a transaction");
                return -1;
            }
            pos = scan;
            continue;
        }
        if (rc == RESP_SCAN_MORE) {
            if (scan > pos && rep_may_stream(c, c->scan.top_type)) {
                if (c->mode != MODE_NORMAL || c->scan.top_type == '>' ||
                    !(op_at(c, 0)->flags & OPF_SILENT))
                    span_add(c, &sp, src + pos, scan - pos, 0);
                c->reply_partial = 1;
                pos = scan;
            }
            break;
        }
        if (c->mode == MODE_NORMAL) {
            if (rep_normal(c, src + pos, scan - pos, c->scan.top_type, &sp) < 0) {
                span_flush(c, &sp, 0);
                c->dead = 1;
                return -1;
            }
        } else if (c->mode == MODE_PUBSUB) {
            rep_pubsub(c, src + pos, scan - pos, &sp);
        } else {
            span_add(c, &sp, src + pos, scan - pos, 0);
            /* Monitor lines are "+<time> [...] ...": only RESET's answer is "+RESET". */
            if (c->monitor_reset && scan - pos == 8 && memcmp(src + pos, "+RESET\r\n", 8) == 0) {
                c->monitor_reset = 0;
                c->mode = MODE_NORMAL;
                c->resp3 = c->sub_resp3 = 0;
                cl_reset_state(c);
                cl_unblock(c);
            }
        }
        c->reply_partial = 0;
        pos = scan;
    }
    span_flush(c, &sp, 0);
    c->rscan_off = scan - pos;
    return (long)pos;
}

static long up_handle(void *arg, const char *src, size_t len)
{
    struct client *c = arg;
    long done;

    upstream_report_alive(c->srv->up);
    done = rep_process(c, src, len);

    return c->ufd < 0 ? -1 : done;
}

static void up_on_read(evutil_socket_t fd, short what, void *arg)
{
    struct client *c = arg;
    const char *why;
    int rc = srv_read_reply(c->ufd, &c->uin, up_handle, c, &why);

    if (rc > 0)
        return;
    if (rc < 0)
        up_drop(c, why);
    cl_update(c);
}

static void up_flush(struct client *c)
{
    while (buf_len(&c->uout) > 0) {
        ssize_t w = write(c->ufd, buf_head(&c->uout), buf_len(&c->uout));
        if (w < 0) {
            if (errno != EAGAIN && errno != EINTR)
                up_drop(c, strerror(errno));
            return;
        }
        buf_consume(&c->uout, (size_t)w);
    }
}

static void up_on_write(evutil_socket_t fd, short what, void *arg)
{
    struct client *c = arg;

    if (c->ustate == U_CONNECTING) {
        int e = net_connect_result(c->ufd);
        if (e != 0) {
            up_connect_failed(c, strerror(e));
            cl_update(c);
            return;
        }
        c->ustate = U_READY;
    }
    up_flush(c);
    cl_update(c);
}

/* ---- requests -------------------------------------------------------------------------------- */

/* Sends the pub/sub barrier: a PING whose echo tells whether the connection is still subscribed. */
static void cl_send_marker(struct client *c)
{
    char cmd[128];
    int n;

    c->marker_len =
        (size_t)snprintf(c->marker, sizeof(c->marker), "fencegate-barrier-%" PRIu64, c->id);
    n = snprintf(cmd, sizeof(cmd), "*2\r\n$4\r\nPING\r\n$%zu\r\n%s\r\n", c->marker_len, c->marker);
    up_send(c, cmd, (size_t)n);
    c->marker_wait = 1;
    c->blocked = 1;
}

static int is_subscribe(const char *p, size_t n)
{
    return name_is(p, n, "subscribe") || name_is(p, n, "psubscribe") || name_is(p, n, "ssubscribe");
}

static int is_unsubscribe(const char *p, size_t n)
{
    return name_is(p, n, "unsubscribe") || name_is(p, n, "punsubscribe") ||
           name_is(p, n, "sunsubscribe");
}

/* Commands that create or read state of their connection, or hold it, though COMMAND does not
 * flag them so (Redis 6 has no "blocking" flag): they need an upstream connection of their own. */
#define NAME(lit)                                                                                  \
    {                                                                                              \
        lit, sizeof(lit) - 1                                                                       \
    }
static const struct {
    const char *s;
    size_t n;
} srv_pinning[] = {
    NAME("select"),      NAME("client"),       NAME("hello"),        NAME("auth"),
    NAME("reset"),       NAME("readonly"),     NAME("readwrite"),    NAME("asking"),
    NAME("cluster"),     NAME("wait"),         NAME("waitaof"),      NAME("eval"),
    NAME("evalsha"),     NAME("eval_ro"),      NAME("evalsha_ro"),   NAME("fcall"),
    NAME("fcall_ro"),    NAME("script"),       NAME("function"),     NAME("multi"),
    NAME("exec"),        NAME("discard"),      NAME("watch"),        NAME("unwatch"),
    NAME("monitor"),     NAME("subscribe"),    NAME("psubscribe"),   NAME("ssubscribe"),
    NAME("unsubscribe"), NAME("punsubscribe"), NAME("sunsubscribe"), NAME("sync"),
    NAME("psync"),       NAME("replconf"),     NAME("debug"),
};
#undef NAME

/* Whether the upstream lacks this CLIENT subcommand, so that it only earns an error and leaves no
 * state (clients send CLIENT SETINFO on connect; Redis has it from 7.2). Only a table that lists
 * subcommands (Redis 7) can tell; with Redis 6 the answer is no. */
static int req_unknown_client_sub(const struct cmd_table *t, const char *sub, size_t len)
{
    const struct cmd_info *ci = cmd_lookup(t, "client", 6, sub, len);

    return cmd_table_has_subcommands(t) && ci && !strchr(ci->name, '|');
}

/* Whether a request of an unpinned client may travel on the shared upstream connection: it
 * neither depends on nor leaves state on its connection, and returns at once. Anything unknown
 * pins: the cost of a wrong "no" is one connection, of a wrong "yes" a broken semantic. */
static int req_shareable(const struct client *c, const char *m, const struct resp_request *r)
{
    const char *name = m + r->argv[0].off;
    size_t nlen = r->argv[0].len;
    const struct cmd_table *t = upstream_commands(c->srv->up);
    const struct cmd_info *ci;
    unsigned blocking = CMD_BLOCKING;

    if ((nlen > 6 && name_is(name, 6, "fence.")) || name_is(name, nlen, "ping") ||
        name_is(name, nlen, "echo") || name_is(name, nlen, "quit") ||
        name_is(name, nlen, "publish") || name_is(name, nlen, "spublish"))
        return 1; /* answered here, or stateless (publishing is not subscribing) */
    if (t && r->argc >= 2 && name_is(name, nlen, "client") &&
        req_unknown_client_sub(t, m + r->argv[1].off, r->argv[1].len))
        return 1;
    for (size_t i = 0; i < sizeof(srv_pinning) / sizeof(srv_pinning[0]); i++)
        if (nlen == srv_pinning[i].n && strncasecmp(name, srv_pinning[i].s, nlen) == 0)
            return 0;
    if (name_is(name, nlen, "xread") || name_is(name, nlen, "xreadgroup")) {
        if (xread_blocks(m, r))
            return 0;
        blocking = 0;
    }
    if (t && r->argc >= 2) /* a container's subcommand carries the flags (Redis 7) */
        ci = cmd_lookup(t, name, nlen, m + r->argv[1].off, r->argv[1].len);
    else
        ci = t ? cmd_lookup(t, name, nlen, NULL, 0) : NULL;
    return ci && !(ci->flags & (CMD_ADMIN | CMD_PUBSUB | CMD_NOSCRIPT | blocking));
}

/* A SELECT argument as Redis reads it (plain decimal, no sign or leading zero, up to INT_MAX);
 * anything else is refused by Redis, and the database stays `current`. */
static int db_parse(const char *p, size_t n, int current)
{
    long long v = 0;

    if (n == 0 || n > 10 || (p[0] == '0' && n > 1))
        return current;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return current;
        v = v * 10 + (p[i] - '0');
    }
    return v > INT_MAX ? current : (int)v;
}

/* Whether fencegate answers this request itself, so that it goes on while the upstream is down:
 * FENCE.* needs only the lock backend. A lock can still be released or looked at, and an
 * acquisition says itself that it was not made (its fence on acquire cannot reach the store). */
static int req_answered_here(const struct client *c, const char *m, const struct resp_request *r)
{
    return c->mode == MODE_NORMAL && fencing_is_command(m + r->argv[0].off, r->argv[0].len);
}

/* WAIT (and WAITAOF) count the replicas that acknowledged the last write of their own
 * connection. A client's writes on the shared connection are not its pinned connection's, where
 * WAIT would answer at once that every replica has them. A PUBLISH, which Redis propagates to
 * its replicas, first moves the pinned connection's write offset to the end of the replication
 * stream, past them (its reply is swallowed). Once is enough: later writes go on this
 * connection. */
static void cl_wait_after_shared(struct client *c, struct span *sp)
{
    static const char publish[] = "*3\r\n$7\r\nPUBLISH\r\n$14\r\nfencegate:wait\r\n$0\r\n\r\n";

    if (!c->pinned || !c->used_shared || c->mode != MODE_NORMAL || c->in_multi)
        return;
    span_flush(c, sp, 1);
    up_send(c, publish, sizeof(publish) - 1);
    if (!op_push(c, OP_HIDDEN)) {
        c->dead = 1;
        return;
    }
    c->used_shared = 0;
}

/* Sends a PING of fencegate's own (its reply swallowed) behind a RESP3 (un)subscribe's pushes,
 * for a reply of our own to wait for. Returns 0, or -1 when its op cannot be queued. */
static int cl_push_barrier(struct client *c)
{
    static const char ping[] = "*1\r\n$4\r\nPING\r\n";

    c->push_barrier = 0;
    up_send(c, ping, sizeof(ping) - 1);
    return op_push(c, OP_HIDDEN) ? 0 : -1;
}

/* Forwards a RESP3 (un)subscribe, which Redis answers with pushes only. What fencegate answers
 * itself next (CLIENT REPLY ON, a held-back MULTI's +OK) must follow those pushes as in Redis:
 * it waits for a PING sent behind them then (op_push), unless a forwarded command's reply, which
 * follows them anyway, comes first. The PING is not sent at once: it would be the subscriber's
 * last command in Redis's CLIENT LIST (cmd=ping), where subscribers are found by cmd=subscribe
 * to be killed. */
static enum req_action req_forward_pushes(struct client *c, const char *m,
                                          const struct resp_request *r, struct span *sp)
{
    metrics_inc(&fg_metrics, M_COMMANDS_FORWARDED, 1);
    span_add(c, sp, m, r->len, 1);
    span_flush(c, sp, 1);
    c->push_barrier = 1;
    return REQ_SKIP;
}

/* Decides what to do with one request and queues the op for its reply. */
static enum req_action req_classify(struct client *c, const char *m, const struct resp_request *r,
                                    struct span *sp)
{
    const char *name = m + r->argv[0].off;
    size_t nlen = r->argv[0].len;
    struct op *o;
    uint16_t flags = 0;
    uint32_t nreplies = 1;

    if (c->mode == MODE_MONITOR) {
        if (name_is(name, nlen, "quit"))
            c->quit_sent = 1;
        if (name_is(name, nlen, "reset") && !c->monitor_reset) {
            /* Redis leaves monitor mode: what follows waits for its +RESET in the stream, then
             * is read as normal requests (fenced again). */
            c->monitor_reset = 1;
            c->blocked = 1;
        }
        return REQ_FORWARD;
    }
    if (c->mode == MODE_REPLICA) {
        if (name_is(name, nlen, "replconf"))
            return REQ_FORWARD; /* REPLCONF ACK: the replica's offset; Redis does not answer */
        /* Redis runs what a replica link sends without answering it: a write here would skip
         * fencing, and no error can be fitted into the stream. */
        log_warn("client %" PRIu64 " %s: sent %.*s on a replication stream, where only REPLCONF "
                 "may follow SYNC/PSYNC; closing",
                 c->id, c->peer, (int)(nlen > 64 ? 64 : nlen), name);
        c->dead = 1;
        return REQ_SKIP;
    }
    if (c->mode == MODE_PUBSUB) {
        if (c->pass_once) {
            c->pass_once = 0;
            return REQ_FORWARD;
        }
        if (name_is(name, nlen, "reset")) {
            cl_reset_state(c); /* pub/sub mode ends too: the next command's marker PING finds it */
            return REQ_FORWARD;
        }
        /* Under CLIENT REPLY OFF Redis shows nothing of a PING; its answer here, an array like
         * a message and as liable to be streamed in pieces, is not sent for at all. */
        if (name_is(name, nlen, "ping") && c->reply_off)
            return REQ_SKIP;
        if (is_subscribe(name, nlen) || is_unsubscribe(name, nlen) || name_is(name, nlen, "ping"))
            return REQ_FORWARD;
        if (name_is(name, nlen, "quit")) {
            c->quit_sent = 1;
            return REQ_FORWARD;
        }
        return REQ_HOLD; /* the caller sends the barrier PING after what came before */
    }

    if (r->argc == 3 && name_is(name, nlen, "client") &&
        name_is(m + r->argv[1].off, r->argv[1].len, "reply")) {
        /* fencegate keeps the reply mode itself: Redis always answers, so fencing still sees
         * what happened to every write (with Redis silent, a fenced write's refusal or a
         * NOSCRIPT would go unseen). Anything but ON, OFF or SKIP earns Redis's own error. */
        const char *a = m + r->argv[2].off;
        size_t al = r->argv[2].len;
        if (name_is(a, al, "off")) {
            c->reply_off = 1;
            c->skip_next = 0;
            return REQ_SKIP;
        }
        if (name_is(a, al, "skip")) {
            c->skip_next = !c->reply_off;
            return REQ_SKIP;
        }
        if (name_is(a, al, "on")) {
            c->reply_off = c->skip_next = 0;
            cl_reply_local(c, "+OK\r\n", 5);
            return REQ_SKIP;
        }
    }
    /* A request under CLIENT REPLY OFF, or the one after SKIP, gets silent ops; subscription
     * confirmations are pushed by Redis whatever the mode, and RESET turns OFF off before it
     * answers, so neither is silenced (a SKIP still silences RESET's answer, as in Redis). */
    c->silent_cmd = (c->reply_off || c->skip_next) &&
                    !((is_subscribe(name, nlen) && r->argc >= 2) || is_unsubscribe(name, nlen) ||
                      (c->reply_off && name_is(name, nlen, "reset")));
    c->skip_next = 0;
    /* Fenced writes need the connection's database: the marks live in the store's. Redis
     * refuses a SELECT argument it would not read as this number, so the database stays; one
     * it reads but has not (out of range) is refused too, and its reply puts the database back
     * (while writes are fenced the requests after it wait for that reply). Inside MULTI,
     * whether it ever runs is not known yet. */
    if (name_is(name, nlen, "select") && r->argc == 2) {
        if (c->in_multi) {
            c->db = -1;
        } else {
            c->db_before = c->db;
            c->select_op = c->ops_pushed; /* the op pushed below */
            c->db = db_parse(m + r->argv[1].off, r->argv[1].len, c->db);
            flags = OPF_SELECT | (fencing_active(c) ? OPF_BARRIER : 0);
        }
    }
    if (nlen > 6 && name_is(name, 6, "fence.")) {
        enum req_action act = fencing_command(c, m, r);
        if (act != REQ_FORWARD)
            return act;
    }
    if (c->txn && (name_is(name, nlen, "reset") || name_is(name, nlen, "quit")))
        fencing_txn_drop(c); /* Redis runs them at once inside MULTI, ending the block */
    if (c->txn)
        return fencing_txn_queue(c, m, r, sp);
    if (name_is(name, nlen, "watch"))
        c->client_watched = 1;
    else if (name_is(name, nlen, "unwatch"))
        c->client_watched = 0;
    if (name_is(name, nlen, "reset")) { /* inside MULTI too: Redis runs it at once */
        flags = OPF_BARRIER | OPF_RESET;
        cl_reset_state(c);
    } else if (c->in_multi) {
        if (name_is(name, nlen, "exec") || name_is(name, nlen, "discard")) {
            c->in_multi = 0;
            c->client_watched = 0;
        }
    } else if (name_is(name, nlen, "multi")) {
        c->in_multi = 1;
        if (fencing_active(c)) { /* held back until EXEC, to be fenced as a whole */
            (void)fencing_txn_begin(c, m, r->len);
            return REQ_SKIP;
        }
    } else if (name_is(name, nlen, "hello")) {
        flags = OPF_BARRIER | OPF_HELLO;
    } else if (is_subscribe(name, nlen)) {
        if (c->resp3 && r->argc >= 2) {
            c->sub_resp3 = 1;
            return req_forward_pushes(c, m, r, sp);
        }
        if (!c->resp3)
            flags = OPF_BARRIER | OPF_ENTER_PUBSUB;
    } else if (is_unsubscribe(name, nlen)) {
        if (c->resp3)
            return req_forward_pushes(c, m, r, sp);
        nreplies = r->argc > 1 ? (uint32_t)(r->argc - 1) : 1;
    } else if (name_is(name, nlen, "wait") || name_is(name, nlen, "waitaof")) {
        cl_wait_after_shared(c, sp);
    } else if (name_is(name, nlen, "monitor")) {
        flags = OPF_BARRIER | OPF_ENTER_MONITOR;
    } else if (name_is(name, nlen, "sync") || name_is(name, nlen, "psync")) {
        if (c->ops_count > 0)
            return REQ_IDLE; /* Redis refuses them on a connection with replies pending */
        flags = OPF_BARRIER | OPF_ENTER_REPLICA;
    } else if (name_is(name, nlen, "quit")) {
        if (!c->pinned) { /* nothing upstream to end: answer as Redis does, after the rest */
            cl_reply_local(c, "+OK\r\n", 5);
            c->closing = 1;
            return REQ_SKIP;
        }
        c->quit_sent = 1;
    } else if (name_is(name, nlen, "shutdown") ||
               (r->argc >= 2 && name_is(name, nlen, "client") &&
                name_is(m + r->argv[1].off, r->argv[1].len, "kill"))) {
        flags = OPF_MAY_END; /* Redis may close the connection on purpose (up_drop) */
    }
    if (!flags && nreplies == 1 && fencing_write(c, m, r, sp) == REQ_SKIP)
        return REQ_SKIP;
    o = op_push(c, OP_FORWARD);
    if (!o) {
        c->dead = 1;
        return REQ_SKIP;
    }
    o->flags |= flags;
    o->nreplies = nreplies;
    o->t0_us = batch_now();
    if (flags & OPF_BARRIER)
        c->blocked = 1;
    return REQ_FORWARD;
}

/* Answers a protocol error the way Redis does, then closes once everything before it is sent. */
static void cl_protocol_error(struct client *c, const char *msg)
{
    char line[256];
    int n = snprintf(line, sizeof(line), "-ERR %s\r\n", msg);

    metrics_inc(&fg_metrics, M_PROTOCOL_ERRORS, 1);
    log_info("client %" PRIu64 " %s: %s; closing the connection", c->id, c->peer, msg);
    c->silent_cmd = c->reply_off || c->skip_next; /* Redis does not answer it then either */
    cl_reply_local(c, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
    c->closing = 1;
}

/* Parses and handles whole requests in src[0..len). Returns the bytes consumed. */
static size_t req_process(struct client *c, const char *src, size_t len)
{
    size_t pos = 0;
    struct span sp = {NULL, 0};
    struct resp_request r;

    batch_start();
    c->stalled = 0;
    c->processing = 1;
    while (pos < len && !c->dead) {
        int rc;
        enum req_action act;

        if (!cl_can_parse(c)) {
            c->stalled = 1;
            break;
        }
        rc = resp_parse_request(c->parser, src + pos, len - pos, &r);
        /* A request over the limit is refused whole or in part, whichever shows it first. */
        if ((rc == RESP_PARTIAL && len - pos > (size_t)c->srv->cfg->max_request_bytes) ||
            (rc == RESP_DONE && r.len > (size_t)c->srv->cfg->max_request_bytes)) {
            char msg[160];
            snprintf(msg, sizeof(msg),
                     "Protocol error: request larger than max_request_bytes (%lld)",
                     c->srv->cfg->max_request_bytes);
            span_flush(c, &sp, 1);
            cl_protocol_error(c, msg);
            pos = len;
            break;
        }
        if (rc == RESP_PARTIAL)
            break;
        if (rc != RESP_DONE) {
            span_flush(c, &sp, 1);
            cl_protocol_error(c, resp_parser_error(c->parser));
            pos = len;
            break;
        }
        if (r.argc == 0) { /* Redis ignores empty requests and sends no reply */
            pos += r.len;
            continue;
        }
        if (!c->pinned && (c->pin_pending || c->slow_reader || c->ops_count >= SRV_SHARED_MAX_OPS ||
                           r.len > cl_pending_limit(c) || r.argc > SRV_SHARED_MAX_ARGS ||
                           !req_shareable(c, src + pos, &r))) {
            c->pin_pending = 1;
            if (c->ops_count > 0) { /* its shared replies first, so the order holds */
                c->blocked = 1;
                c->stalled = 1;
                break;
            }
            c->pinned = 1;
            c->pin_pending = 0;
            metrics_inc(&fg_metrics, M_CLIENTS_PINNED, 1);
        }
        if (!c->pinned) {
            if (c->srv->shared->state == U_DOWN)
                span_flush(c, &sp, 1); /* before the link's prelude is queued */
            if (lk_ready_for(c) < 0 && !req_answered_here(c, src + pos, &r)) {
                cl_reply_unavailable(c);
                pos += r.len;
                continue;
            }
        } else if (c->ustate == U_DOWN) {
            if (upstream_is_up(c->srv->up) && c->mode == MODE_NORMAL) {
                span_flush(c, &sp, 1);
                if (up_connect(c) < 0 && c->dead)
                    break;
            }
            if (c->ustate == U_DOWN && !req_answered_here(c, src + pos, &r)) {
                if (!upstream_is_up(c->srv->up))
                    snprintf(c->down_why, sizeof(c->down_why), "%s", upstream_error(c->srv->up));
                /* A refused SELECT, CLIENT SETNAME, ... would be missing from an upstream
                 * connection made later, under a client that may not have noticed: the
                 * connection ends after this reply, as a direct client's would, and the client
                 * starts over. A refused stateless command leaves nothing missing. */
                if (!req_shareable(c, src + pos, &r))
                    c->closing = 1;
                cl_reply_unavailable(c);
                pos += r.len;
                continue;
            }
        }
        act = req_classify(c, src + pos, &r, &sp);
        c->silent_cmd = 0;
        if (act == REQ_IDLE) {
            span_flush(c, &sp, 1);
            c->wait_idle = c->blocked = c->stalled = 1;
            break;
        }
        if (act == REQ_HOLD) {
            span_flush(c, &sp, 1);
            cl_send_marker(c);
            c->stalled = 1;
            break;
        }
        if (act == REQ_FORWARD) {
            metrics_inc(&fg_metrics, M_COMMANDS_FORWARDED, 1);
            span_add(c, &sp, src + pos, r.len, 1);
        }
        pos += r.len;
    }
    span_flush(c, &sp, 1);
    if (c->run)
        up_run_flush(c);
    c->processing = 0;
    cl_flush(c); /* replies fencegate wrote itself go out together, as Redis sends a pipeline's */
    return pos;
}

/* Handles requests already buffered in c->in (after a barrier or back-pressure lifted). */
static void cl_process_input(struct client *c)
{
    size_t done;

    if (buf_len(&c->in) == 0) {
        c->stalled = 0; /* nothing is held back */
        return;
    }
    if (!cl_can_parse(c)) {
        c->stalled = 1; /* what was read is handled once it may be (cl_update) */
        return;
    }
    done = req_process(c, buf_head(&c->in), buf_len(&c->in));
    buf_consume(&c->in, done);
}

static void cl_on_read(evutil_socket_t fd, short what, void *arg)
{
    struct client *c = arg;
    int scratch;
    ssize_t n = srv_read(c->fd, &c->in, &scratch);

    if (n == -2) {
        c->dead = 1;
        goto out;
    }
    if (n == 0) { /* its end of the stream: what came before it is still answered */
        c->rd_eof = 1;
        goto out;
    }
    if (n < 0) {
        if (errno == EAGAIN || errno == EINTR)
            return;
        c->dead = 1;
        goto out;
    }
    metrics_inc(&fg_metrics, M_BYTES_FROM_CLIENTS, (uint64_t)n);
    if (scratch) {
        size_t done = req_process(c, srv_scratch, (size_t)n);
        if (done < (size_t)n && !c->closing &&
            buf_append(&c->in, srv_scratch + done, (size_t)n - done) != FG_OK)
            c->dead = 1;
    } else {
        c->in.end += (size_t)n;
        cl_process_input(c);
    }
out:
    cl_update(c);
}

/* Writes what is queued for the client, as far as the socket takes it. */
static void cl_flush(struct client *c)
{
    while (buf_len(&c->out) > 0 && !c->dead) {
        ssize_t w = write(c->fd, buf_head(&c->out), buf_len(&c->out));
        if (w < 0) {
            if (errno != EAGAIN && errno != EINTR)
                c->dead = 1;
            break;
        }
        buf_consume(&c->out, (size_t)w);
    }
}

static void cl_on_write(evutil_socket_t fd, short what, void *arg)
{
    struct client *c = arg;

    cl_flush(c);
    cl_update(c);
}

/* A client that ended its side of the stream gets what Redis gives it: the replies to every
 * request it sent, except one still blocked (BLPOP, XREAD BLOCK, WAIT), which Redis drops when it
 * reads the end, with everything behind it. So once every request of a pinned client went
 * upstream, and no reply still due can make fencegate send more (a fenced write's NOSCRIPT, a
 * held-back block after its check, a lock command; not a reply of its own that is ready, such as
 * CLIENT REPLY ON's), the end is passed on and Redis closes the connection after its last reply. */
static void up_pass_eof(struct client *c)
{
    if (!c->pinned || c->ustate != U_READY || c->quit_sent || c->run || buf_len(&c->uout) > 0 ||
        (c->stalled && buf_len(&c->in) > 0)) /* a part of a request left will never be whole */
        return;
    for (size_t i = 0; i < c->ops_count; i++) {
        const struct op *o = op_at(c, i);
        if ((o->kind == OP_LOCAL && !o->reply) || (o->flags & (OPF_FENCED | OPF_TXN_CHECK)))
            return;
    }
    if (shutdown(c->ufd, SHUT_WR) == 0)
        c->quit_sent = 1;
}

/* Re-evaluates what the connection waits for, after any event. Closes it when it is done. */
void cl_update(struct client *c)
{
    struct server *s = c->srv;
    int idle;

    if (!c->pinned && buf_len(&c->out) >= cl_pending_limit(c))
        c->slow_reader = 1; /* unread replies cannot push back on a shared connection */
    if (c->pin_pending && c->blocked && c->ops_count == 0)
        cl_unblock(c); /* its shared replies are in: it pins at its next request */
    /* Requests held back by a barrier or by back-pressure may be handled now. */
    if (!c->dead && c->stalled && cl_can_parse(c))
        cl_process_input(c);
    if (c->uwrite_errno) /* up_write() failed in a callback that held ops */
        up_drop(c, strerror(c->uwrite_errno));
    if (!c->dead && c->ustate == U_READY && buf_len(&c->uout) > 0 && !c->uwev_on)
        up_flush(c);

    /* Draining answers what the client sent before it (whole requests already read), then
     * closes: after the pushes of a RESP3 (un)subscribe too. */
    if ((s->draining || c->rd_eof) && c->push_barrier && cl_push_barrier(c) < 0)
        c->dead = 1;
    idle = c->ops_count == 0 && buf_len(&c->uout) == 0 && !c->reply_partial &&
           !(c->stalled && buf_len(&c->in) > 0);
    if ((s->draining || c->rd_eof) && (idle || c->mode != MODE_NORMAL))
        c->closing = 1;
    else if (c->rd_eof)
        up_pass_eof(c);
    if (c->dead || (c->closing && buf_len(&c->out) == 0 &&
                    (c->ops_count == 0 || (c->pinned && c->ustate == U_DOWN)))) {
        cl_close(c);
        return;
    }
    ev_want(c->rev, &c->rev_on,
            !c->closing && !c->quit_sent && !c->rd_eof && !s->draining && cl_can_parse(c));
    ev_want(c->wev, &c->wev_on, buf_len(&c->out) > 0);
    ev_want(c->urev, &c->urev_on, c->ustate == U_READY && buf_len(&c->out) < cl_pending_limit(c));
    ev_want(c->uwev, &c->uwev_on,
            c->ustate == U_CONNECTING || (c->ustate == U_READY && buf_len(&c->uout) > 0));
}

/* ---- connection lifecycle -------------------------------------------------------------------- */

static void cl_close(struct client *c)
{
    struct server *s = c->srv;

    if (c->rev)
        event_free(c->rev);
    if (c->wev)
        event_free(c->wev);
    fencing_close(c);
    if (!c->pinned)
        lk_forget(s->shared, c);
    up_close_fd(c);
    close(c->fd);
    buf_free(&c->in);
    buf_free(&c->out);
    resp_parser_free(c->parser);
    while (c->ops_count)
        op_pop(c);
    free(c->ops);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->clients = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->nclients--;
    fg_metrics.gauge[G_CONNECTIONS_OPEN] = s->nclients;
    log_debug("client %" PRIu64 " %s: closed", c->id, c->peer);
    free(c);
    if (s->draining && s->nclients == 0 && s->drained) {
        void (*done)(void *) = s->drained;
        s->drained = NULL;
        done(s->drained_arg);
    }
}

static void srv_on_accept_resume(evutil_socket_t fd, short what, void *arg)
{
    struct server *s = arg;

    if (s->lev && !s->accept_held)
        event_add(s->lev, NULL);
}

/* The upstream's first probe has an outcome: accept the connections waiting in the backlog. */
static void srv_on_first_probe(void *arg)
{
    struct server *s = arg;

    s->accept_held = 0;
    /* The shared connection is opened before the first client is accepted, not by its first
     * request: a crowd that takes every descriptor on connect would otherwise leave none for it,
     * and each of them would be refused. Should this fail, the first request tries again. */
    if (s->shared && s->shared->state == U_DOWN && upstream_is_up(s->up))
        (void)lk_connect(s->shared);
    if (s->lev)
        event_add(s->lev, NULL);
}

static void srv_on_accept(evutil_socket_t lfd, short what, void *arg)
{
    struct server *s = arg;

    for (int burst = 0; burst < 64; burst++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof(ss);
        struct client *c;
        int fd = accept(lfd, (struct sockaddr *)&ss, &sl);

        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE) {
                /* Out of descriptors: the pending connection stays in the backlog and the
                 * listener would fire again at once. Pause accepting instead of spinning. */
                struct timeval tv = {0, SRV_ACCEPT_PAUSE_MS * 1000};
                log_warn("accept: %s; not accepting for %d ms (raise the descriptor limit)",
                         strerror(errno), SRV_ACCEPT_PAUSE_MS);
                event_del(s->lev);
                evtimer_add(s->accept_timer, &tv);
            } else if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) {
                log_warn("accept: %s", strerror(errno));
            }
            return;
        }
        if (net_prepare(fd) < 0) {
            close(fd);
            continue;
        }
        metrics_inc(&fg_metrics, M_CONNECTIONS_ACCEPTED, 1);
        if (s->nclients >= s->cfg->max_clients) {
            static const char msg[] = "-ERR max number of clients reached\r\n";
            metrics_inc(&fg_metrics, M_CONNECTIONS_REJECTED, 1);
            (void)!write(fd, msg, sizeof(msg) - 1);
            close(fd);
            continue;
        }
        c = calloc(1, sizeof(*c));
        if (!c || !(c->parser = resp_parser_new(&s->lim))) {
            free(c);
            close(fd);
            continue;
        }
        c->srv = s;
        c->id = ++s->next_id;
        c->fd = fd;
        c->ufd = -1;
        c->db = s->cfg->upstream.db;
        net_format((struct sockaddr *)&ss, c->peer, sizeof(c->peer));
        resp_scanner_init(&c->scan);
        c->rev = event_new(s->base, fd, EV_READ | EV_PERSIST, cl_on_read, c);
        c->wev = event_new(s->base, fd, EV_WRITE | EV_PERSIST, cl_on_write, c);
        c->next = s->clients;
        if (s->clients)
            s->clients->prev = c;
        s->clients = c;
        s->nclients++;
        fg_metrics.gauge[G_CONNECTIONS_OPEN] = s->nclients;
        if (!c->rev || !c->wev) {
            cl_close(c);
            continue;
        }
        /* A pinned client connects upstream now, so its first command does not pay for it. */
        c->pinned = !s->shared;
        if (c->pinned && upstream_is_up(s->up))
            (void)up_connect(c);
        log_debug("client %" PRIu64 " %s: connected", c->id, c->peer);
        cl_update(c);
    }
}

/* The protect rules that apply to the RESP endpoint's upstream store: those of every store that
 * is the upstream as config.h reads it, so that no rule config.c let through is left out. Returns
 * 0 or -1 with err. */
static int srv_load_rules(struct server *s, char *err, size_t errlen)
{
    const struct cfg *cfg = s->cfg;
    struct fence_rule rules[CFG_MAX_PROTECT];
    size_t n = 0;
    int rc = 0;

    for (int i = 0; i < cfg->nprotect; i++) {
        for (int j = 0; j < cfg->nstores; j++) {
            if (strcmp(cfg->stores[j].name, cfg->protect[i].store) != 0 ||
                !cfg_is_upstream(cfg, &cfg->stores[j].url))
                continue;
            rules[n].glob = cfg->protect[i].keys;
            rules[n].lock_template = cfg->protect[i].lock;
            n++;
        }
    }
    if (n == 0)
        return 0;
    s->rules = fence_rules_new(rules, n, &rc);
    if (!s->rules) {
        snprintf(err, errlen, "protect rules: %s", fg_strerror(rc));
        return -1;
    }
    return 0;
}

struct server *server_new(struct event_base *base, const struct cfg *cfg, int lfd,
                          struct upstream *up, struct lock_client *locks, int store_is_backend,
                          char *err, size_t errlen)
{
    struct server *s = calloc(1, sizeof(*s));

    if (!s) {
        snprintf(err, errlen, "out of memory");
        close(lfd);
        return NULL;
    }
    s->base = base;
    s->cfg = cfg;
    s->up = up;
    s->locks = locks;
    s->lfd = lfd;
    fence_script_sha(fence_write_script(), s->write_sha);
    fence_script_sha(fence_group_script(), s->group_sha);
    if (locks && store_is_backend)
        s->owner_prefix = lock_client_redis_lock_prefix(locks);
    if (s->owner_prefix && strlen(s->owner_prefix) > sizeof("lock:") - 1)
        s->backend_plen = strlen(s->owner_prefix) - (sizeof("lock:") - 1);
    if (srv_load_rules(s, err, errlen) < 0) {
        close(lfd);
        free(s);
        return NULL;
    }
    s->lim.max_bulk = RESP_DEFAULT_MAX_BULK < cfg->max_request_bytes ? RESP_DEFAULT_MAX_BULK
                                                                     : cfg->max_request_bytes;
    s->lim.max_args = (size_t)cfg->max_args;
    s->lim.max_inline = RESP_DEFAULT_MAX_INLINE;
    if (cfg->upstream_multiplex && !(s->shared = lk_new(s))) {
        snprintf(err, errlen, "out of memory");
        server_free(s);
        return NULL;
    }
    if (net_listen(lfd, cfg->listen_resp.host, cfg->listen_resp.port, 511, err, errlen) < 0) {
        server_free(s);
        return NULL;
    }
    s->lev = event_new(base, s->lfd, EV_READ | EV_PERSIST, srv_on_accept, s);
    s->accept_timer = evtimer_new(base, srv_on_accept_resume, s);
    if (!s->lev || !s->accept_timer) {
        snprintf(err, errlen, "out of memory");
        server_free(s);
        return NULL;
    }
    /* Connections wait in the backlog until Redis has been looked at: one that sends a command
     * at once gets Redis's answer (or why Redis is down), not "not probed yet". */
    s->accept_held = !upstream_on_first_probe(up, srv_on_first_probe, s);
    if (!s->accept_held && event_add(s->lev, NULL) < 0) {
        snprintf(err, errlen, "out of memory");
        server_free(s);
        return NULL;
    }
    return s;
}

static void srv_stop_listening(struct server *s)
{
    if (s->accept_timer) {
        event_free(s->accept_timer);
        s->accept_timer = NULL;
    }
    if (s->lev) {
        event_free(s->lev);
        s->lev = NULL;
    }
    if (s->lfd >= 0) {
        close(s->lfd);
        s->lfd = -1;
    }
}

void server_free(struct server *s)
{
    if (!s)
        return;
    s->drained = NULL;
    if (s->accept_held)
        upstream_on_first_probe(s->up, NULL, NULL);
    server_close_all(s);
    srv_stop_listening(s);
    lk_free(s->shared);
    fence_rules_free(s->rules);
    free(s);
}

void server_close_all(struct server *s)
{
    while (s && s->clients)
        cl_close(s->clients);
}

void server_drain(struct server *s, void (*done)(void *arg), void *arg)
{
    struct client *c, *next;

    s->draining = 1;
    s->drained = done;
    s->drained_arg = arg;
    srv_stop_listening(s);
    if (s->nclients == 0) {
        s->drained = NULL;
        done(arg);
        return;
    }
    for (c = s->clients; c; c = next) {
        next = c->next;
        cl_update(c);
    }
}

int server_client_count(const struct server *s)
{
    return s->nclients;
}
