/* httpstore.c — HTTP stores: a request under lock L is forwarded to the store with L's fencing
 * token, after the mark of (store, L) in the lock backend was checked and raised to the token.
 *
 * One forward is a small state machine (enum hs_state). Both bodies stream: the client's request
 * body is read only once the forward is cleared (lock, mark, a connection to the store; a client
 * that sent "Expect: 100-continue" is told to go on then) and is passed on as it arrives, reading
 * from the client pausing while more than HS_WATERMARK waits to be written to the store; the
 * store's response is passed back the same way, reading from the store pausing while the client's
 * output is above HS_WATERMARK. The wire protocol on the store's side is httpup.c's. Every
 * teardown goes through hs_fwd_finish(), which defers the frees to the loop.
 *
 * Store connections are kept alive: a forward whose response was read whole gives its connection
 * back to its store's idle list (at most HS_POOL_MAX, each for at most HS_POOL_IDLE_MS), and the
 * next forward to that store takes the newest. Without that, every forward would leave a socket
 * in TIME_WAIT, and a few hundred forwards a second would run out of local ports. A connection
 * the store closed, or sent anything on, while idle is dropped when it is next taken.
 *
 * A new connection is made to the address of the store's host name looked up off the loop
 * (resolve.h), while the Host header keeps the name; a pooled connection stays bound to its
 * address. */
#include "httpstore.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <inttypes.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>

#include "clock.h"
#include "config.h"
#include "fence.h"
#include "http.h"
#include "httpd.h"
#include "httphdr.h"
#include "httpup.h"
#include "json.h"
#include "log.h"
#include "metrics.h"
#include "resolve.h"

#define HS_WATERMARK                                                                               \
    (256 * 1024) /* bytes waiting for the slower side above which the other                        \
                  * side is not read */
#define HS_MAX_KEY      (CFG_MAX_STR + LOCK_MAX_NAME + 2)
#define HS_POOL_MAX     32   /* idle connections kept per store */
#define HS_POOL_IDLE_MS 2000 /* an idle connection is closed after this long */
#define HS_IDLE_POLL_MS 1000 /* how often a streaming reply's client is checked for reading */

enum hs_state {
    HS_RAISING,   /* waiting for the mark */
    HS_RESOLVING, /* marked; looking the store's host name up for a new connection */
    HS_SENT,      /* forwarded; waiting for the response headers */
    HS_STREAMING, /* the reply to the client has started; the timer is the idle limit */
    HS_DONE,      /* finished; the frees are queued */
};

struct hs_fwd {
    struct httpstore *hs;
    struct hs_fwd *prev, *next;
    const struct cfg_store *st;
    struct httpd_req *req;         /* the client's; NULL once answered or its connection went */
    struct httpup *conn;           /* to the store */
    struct resolve_req *resolving; /* HS_RESOLVING */
    struct event *timer;           /* lookup, connect, then response deadline */
    struct event *fin;             /* deferred teardown */
    enum hs_state state;
    int connected;    /* the connect deadline passed with a connection */
    int started;      /* the reply to the client has started */
    int paused;       /* reading from the store is off: the client is slow */
    int body_paused;  /* reading the client's body is off: the store is slow */
    int body_done;    /* the client's body is passed on whole */
    int head_request; /* the request is HEAD */
    int reusable;     /* the store's response was read whole: conn can serve another forward */
    size_t unsent;    /* streaming: the client's pending output when last looked at */
    long long timeout_ms;
    long long progress_ms; /* streaming: when the store or the client last made progress */
    uint64_t token;
    struct lock_session_ref owner; /* the session that holds lock with token */
    char lock[LOCK_MAX_NAME + 1];
    char target[]; /* path and query sent to the store */
};

/* One fence-on-acquire call: the marks of every HTTP store, answered once all have answered. */
struct hs_hook {
    struct httpstore *hs;
    struct hs_hook *prev, *next;
    lock_fence_done done;
    void *ctx;
    int waiting;
    int status;
    uint64_t mark;
    char msg[300];
};

/* An idle store connection; a store's list is newest first. */
struct hs_idle {
    struct hs_idle *next;
    struct httpup *conn;
    long long since_ms; /* monotonic */
};

struct httpstore {
    struct event_base *base;
    const struct cfg *cfg;
    struct fence_rules *rules[CFG_MAX_STORES]; /* per store (index in cfg->stores): its protect
                                                * rules over paths, or NULL */
    struct lock_client *locks;
    long long connect_ms, response_ms;
    struct hs_fwd *fwds;
    struct hs_hook *hooks;
    struct hs_idle *idle[CFG_MAX_STORES]; /* per store */
    int nidle[CFG_MAX_STORES];
    struct event *sweep; /* closes connections idle too long; armed while any is idle */
};

static void hs_arm(struct event *ev, long long ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};

    evtimer_add(ev, &tv);
}

/* "<store>/<lock>": the key of the backend's mark. Returns its length, or -1 if it is too long. */
static int hs_mark_key(char *out, size_t cap, const char *store, const char *lock)
{
    int n = snprintf(out, cap, "%s/%s", store, lock);

    return n < 0 || (size_t)n >= cap || (size_t)n > LOCK_MAX_MARK_KEY ? -1 : n;
}

/* ---- idle store connections ---- */

/* Closes the connections of store i idle since before `before` (all of them when before < 0):
 * they sit at the tail of its list. */
static void hs_pool_trim(struct httpstore *hs, int i, long long before)
{
    struct hs_idle **pp = &hs->idle[i];

    while (*pp && (before >= 0 && (*pp)->since_ms >= before))
        pp = &(*pp)->next;
    while (*pp) {
        struct hs_idle *e = *pp;
        *pp = e->next;
        httpup_free(e->conn);
        free(e);
        hs->nidle[i]--;
    }
}

static void hs_on_sweep(evutil_socket_t fd, short what, void *arg)
{
    struct httpstore *hs = arg;
    int any = 0;

    for (int i = 0; i < hs->cfg->nstores; i++) {
        hs_pool_trim(hs, i, clock_now_ms() - HS_POOL_IDLE_MS);
        any |= hs->nidle[i] > 0;
    }
    if (any)
        hs_arm(hs->sweep, HS_POOL_IDLE_MS / 2);
}

/* The newest idle connection to store i that the store has not closed, or NULL. */
static struct httpup *hs_pool_take(struct httpstore *hs, int i)
{
    hs_pool_trim(hs, i, clock_now_ms() - HS_POOL_IDLE_MS);
    while (hs->idle[i]) {
        struct hs_idle *e = hs->idle[i];
        struct httpup *conn = e->conn;
        hs->idle[i] = e->next;
        hs->nidle[i]--;
        free(e);
        if (httpup_reusable(conn))
            return conn;
        httpup_free(conn);
    }
    return NULL;
}

/* Keeps conn for store i's next forward, or frees it when the list is full. */
static void hs_pool_put(struct httpstore *hs, int i, struct httpup *conn)
{
    struct hs_idle *e = hs->nidle[i] < HS_POOL_MAX && hs->sweep ? malloc(sizeof(*e)) : NULL;

    if (!e) {
        httpup_free(conn);
        return;
    }
    e->conn = conn;
    e->since_ms = clock_now_ms();
    e->next = hs->idle[i];
    hs->idle[i] = e;
    hs->nidle[i]++;
    if (!evtimer_pending(hs->sweep, NULL))
        hs_arm(hs->sweep, HS_POOL_IDLE_MS / 2);
}

/* ---- forwards ---- */

/* Takes the client's request off f, to answer it: f no longer hears of its client leaving.
 * Returns NULL when there is none (answered already, or the client left). */
static struct httpd_req *hs_req_take(struct hs_fwd *f)
{
    struct httpd_req *r = f->req;

    if (r)
        httpd_req_on_gone(r, NULL, NULL);
    f->req = NULL;
    return r;
}

static void hs_fwd_free(struct hs_fwd *f)
{
    struct httpstore *hs = f->hs;

    (void)hs_req_take(f); /* unanswered here only if its client is gone (hs_on_fin answers) */
    resolve_cancel(f->resolving);
    if (f->conn && f->reusable && httpup_reusable(f->conn))
        hs_pool_put(hs, (int)(f->st - hs->cfg->stores), f->conn);
    else
        httpup_free(f->conn); /* drops a store request still pending, silently */
    if (f->prev)
        f->prev->next = f->next;
    else
        hs->fwds = f->next;
    if (f->next)
        f->next->prev = f->prev;
    if (f->timer)
        event_free(f->timer);
    if (f->fin)
        event_free(f->fin);
    free(f);
}

static void hs_abort_client(struct hs_fwd *f);

/* 1 when the request may have reached the store: its connection was made. */
static int hs_sent(const struct hs_fwd *f)
{
    return f->conn && httpup_sent(f->conn);
}

static void hs_on_fin(evutil_socket_t fd, short what, void *arg)
{
    struct hs_fwd *f = arg;

    /* Every path answers before it ends; never leave a client hanging regardless. */
    if (f->req && f->started) {
        hs_abort_client(f); /* a started reply cannot be ended cleanly */
    } else if (f->req) {
        http_reply_error(hs_req_take(f), 502, hs_sent(f) ? "outcome_unknown" : "store_unavailable",
                         "the forward ended without an answer");
    }
    hs_fwd_free(f);
}

/* Ends f: no more callbacks act on it; the store connection is freed from the loop. */
static void hs_fwd_finish(struct hs_fwd *f)
{
    if (f->state == HS_DONE)
        return;
    f->state = HS_DONE;
    resolve_cancel(f->resolving);
    f->resolving = NULL;
    if (f->timer)
        evtimer_del(f->timer);
    event_active(f->fin, EV_TIMEOUT, 1);
}

/* Answers the client with an error (before any reply has started) and ends f. */
static void hs_fwd_fail(struct hs_fwd *f, int status, const char *code, const char *msg)
{
    if (f->req)
        http_reply_error(hs_req_take(f), status, code, msg);
    hs_fwd_finish(f);
}

/* The reply has started and the store failed: the client must not take a cut body for a whole
 * one, so its connection is closed. */
static void hs_abort_client(struct hs_fwd *f)
{
    struct httpd_req *r = hs_req_take(f);

    if (r)
        httpd_reply_abort(r);
}

/* The client went away (its request is freed or left to libevent). What the store did with a
 * request it was sent is not known, so that is logged, naming the store. */
static void hs_on_client_gone(void *arg)
{
    struct hs_fwd *f = arg;

    f->req = NULL;
    metrics_inc(&fg_metrics, M_HSTORE_ABANDONED, 1);
    log_info("http store %s: the client of %s left before the answer was through; %s", f->st->name,
             f->target,
             f->state == HS_STREAMING ? "the store had answered"
             : hs_sent(f)             ? "the store may or may not have applied the request"
                                      : "nothing was sent to the store");
    if (f->state != HS_RAISING)
        hs_fwd_finish(f); /* the mark's answer ends a raising one */
}

/* Arms the idle limit of a streaming reply: timeout_ms after the last progress. While the client
 * has output pending, whether it takes any is only seen by looking (hs_on_timer()), so it is
 * looked at every HS_IDLE_POLL_MS (a quarter of the limit, if shorter): a client that stops
 * reading is cut that long after the limit at most, not up to a whole limit later. */
static void hs_stream_arm(struct hs_fwd *f)
{
    long long left = f->progress_ms + f->timeout_ms - clock_now_ms();
    long long poll = f->timeout_ms / 4 < HS_IDLE_POLL_MS ? f->timeout_ms / 4 : HS_IDLE_POLL_MS;

    if (left < 1)
        left = 1;
    hs_arm(f->timer, f->unsent > 0 && poll >= 1 && poll < left ? poll : left);
}

/* The store sent more of the reply, or the client took some (or sent more of its body): the idle
 * limit starts again. */
static void hs_stream_progress(struct hs_fwd *f)
{
    f->progress_ms = clock_now_ms();
    f->unsent = f->req ? httpd_req_unsent(f->req) : 0;
    hs_stream_arm(f);
}

/* The client's request body as it arrives: passed on to the store. */
static void hs_on_client_body(void *arg, int done)
{
    struct hs_fwd *f = arg;

    if (f->state != HS_SENT && f->state != HS_STREAMING)
        return;
    httpup_send_body(f->conn, httpd_req_body(f->req));
    if (done) {
        f->body_done = 1;
        httpup_end_body(f->conn);
    }
    if (f->state == HS_STREAMING)
        hs_stream_progress(f);
    else if (f->connected)
        hs_arm(f->timer, f->timeout_ms); /* the upload made progress */
    if (!done && !f->body_paused && httpup_unsent(f->conn) > HS_WATERMARK) {
        f->body_paused = 1; /* the store takes it slower than the client sends it */
        httpd_req_body_pause(f->req, 1);
    }
}

/* What waited to be written to the store is written: read the client's body again. */
static void hs_on_store_drained(void *arg)
{
    struct hs_fwd *f = arg;

    if (f->body_paused && f->req && !f->body_done) {
        f->body_paused = 0;
        httpd_req_body_pause(f->req, 0);
    }
}

/* The store's final answer: its status and headers go to the client, the reply starts. */
static int hs_on_head(void *arg, int code, const char *reason, const struct evkeyvalq *in,
                      int64_t length)
{
    struct hs_fwd *f = arg;
    struct evkeyvalq *out;
    const char *conn = evhttp_find_header(in, "Connection");
    char num[32];

    if (!f->req || f->state != HS_SENT)
        return -1; /* nobody to answer: stop reading */
    if (evhttp_find_header(in, "Transfer-Encoding") && evhttp_find_header(in, "Content-Length")) {
        /* RFC 9112 §6.3: a response splitting vector; relayed, one of the two would be a lie. */
        char msg[600];
        snprintf(msg, sizeof(msg),
                 "store '%s' (%.200s) answered with both Transfer-Encoding and Content-Length, "
                 "which is not relayed; the request may or may not have been applied",
                 f->st->name, f->st->url.raw);
        hs_fwd_fail(f, 502, "outcome_unknown", msg);
        return -1;
    }
    out = httpd_req_output_headers(f->req);
    for (const struct evkeyval *kv = in->tqh_first; kv; kv = kv->next.tqe_next) {
        if (httphdr_is_hop_by_hop(kv->key, conn))
            continue;
        /* The body is framed anew for the client: by its length when the store gave one, else
         * chunked. A bodiless answer (HEAD, 304) keeps the store's, which describes the
         * resource, not this message. */
        if (strcasecmp(kv->key, "Content-Length") == 0 && length != 0)
            continue;
        evhttp_add_header(out, kv->key, kv->value);
    }
    if (length > 0) {
        snprintf(num, sizeof(num), "%" PRId64, length);
        evhttp_add_header(out, "Content-Length", num);
    }
    f->state = HS_STREAMING;
    f->started = 1;
    httpd_reply_start(f->req, code, reason && *reason ? reason : NULL);
    hs_stream_progress(f); /* from now on the timer is the idle limit of the stream */
    return 0;
}

/* The client's connection wrote out everything it had: read from the store again. */
static void hs_on_drained(void *arg)
{
    struct hs_fwd *f = arg;

    if (f->paused && f->state == HS_STREAMING) {
        f->paused = 0;
        hs_stream_progress(f); /* the client took everything */
        httpup_pause(f->conn, 0);
    }
}

static void hs_on_body(void *arg, struct evbuffer *b)
{
    struct hs_fwd *f = arg;

    if (f->state != HS_STREAMING || !f->req) {
        evbuffer_drain(b, evbuffer_get_length(b));
        httpup_pause(f->conn, 1);
        hs_fwd_finish(f); /* the client left: the store connection is dropped */
        return;
    }
    httpd_reply_chunk(f->req, b);
    hs_stream_progress(f); /* the store sent more */
    if (!f->paused && f->unsent > HS_WATERMARK) {
        f->paused = 1;
        httpd_req_on_drained(f->req, hs_on_drained, f);
        httpup_pause(f->conn, 1);
    }
}

static void hs_on_done(void *arg, enum httpup_end end, const char *why)
{
    struct hs_fwd *f = arg;
    char msg[600];

    if (f->state == HS_DONE)
        return;
    if (end != HTTPUP_OK) {
        metrics_inc(&fg_metrics, M_HSTORE_ERRORS, 1);
        if (f->state == HS_STREAMING && (!f->req || httpd_reply_retract(f->req) != 0)) {
            log_warn("http store %s: the response to %s broke off (%s); closing the client's "
                     "connection",
                     f->st->name, f->target, why);
            hs_abort_client(f);
            hs_fwd_finish(f);
        } else if (end == HTTPUP_CONNECT) {
            snprintf(msg, sizeof(msg),
                     "store '%s' (%.200s) is unreachable or refused the connection (%s); nothing "
                     "was sent",
                     f->st->name, f->st->url.raw, why);
            hs_fwd_fail(f, 502, "store_unavailable", msg);
        } else {
            /* Streaming, the reply was taken back before any of it reached the client (the
             * failure came with the head, e.g. a malformed first chunk): it can still be told. */
            f->started = 0;
            snprintf(msg, sizeof(msg),
                     "store '%s' (%.200s) %s%s; the request may or may not have been applied",
                     f->st->name, f->st->url.raw,
                     end == HTTPUP_MALFORMED ? "answered with something that cannot be relayed: "
                                             : "",
                     why);
            hs_fwd_fail(f, 502, "outcome_unknown", msg);
        }
        return;
    }
    if (f->req) {
        struct httpd_req *r = hs_req_take(f);
        httpd_reply_end(r);
    }
    f->reusable = 1; /* if the store keeps the connection open (httpup_reusable()) */
    hs_fwd_finish(f);
}

static const struct httpup_handler hs_up_handler = {
    .head = hs_on_head,
    .body = hs_on_body,
    .done = hs_on_done,
    .drained = hs_on_store_drained,
};

static void hs_on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct hs_fwd *f = arg;
    struct httpstore *hs = f->hs;
    char msg[600];

    if (f->state == HS_STREAMING) {
        long long now = clock_now_ms();
        if (f->req) {
            size_t left = httpd_req_unsent(f->req);
            if (left < f->unsent) /* the client took some since it was last looked at */
                f->progress_ms = now;
            f->unsent = left;
        }
        if (now - f->progress_ms < f->timeout_ms) {
            hs_stream_arm(f);
            return;
        }
        /* Neither the store sent more nor the client took any for timeout_ms: a stalled store
         * or a client that stopped reading. The reply cannot be finished cleanly. */
        metrics_inc(&fg_metrics, M_HSTORE_ERRORS, 1);
        log_warn("http store %s: the response to %s made no progress for %lld ms (%s); closing "
                 "the client's connection",
                 f->st->name, f->target, f->timeout_ms,
                 f->paused ? "the client stopped reading" : "the store stopped sending");
        hs_abort_client(f);
        hs_fwd_finish(f);
        return;
    }
    if (f->state == HS_RESOLVING) {
        metrics_inc(&fg_metrics, M_HSTORE_ERRORS, 1);
        snprintf(msg, sizeof(msg),
                 "store '%s' (%.200s): resolving '%.100s' took longer than %lld ms; nothing was "
                 "sent",
                 f->st->name, f->st->url.raw, f->st->url.hosts[0].host,
                 f->timeout_ms < hs->connect_ms ? f->timeout_ms : hs->connect_ms);
        hs_fwd_fail(f, 502, "store_unavailable", msg);
        return;
    }
    if (f->state != HS_SENT)
        return;
    if (!f->connected && !httpup_connected(f->conn)) {
        metrics_inc(&fg_metrics, M_HSTORE_ERRORS, 1);
        snprintf(msg, sizeof(msg),
                 "store '%s' (%.200s) did not accept a connection within %lld ms; nothing was "
                 "sent",
                 f->st->name, f->st->url.raw, hs->connect_ms);
        hs_fwd_fail(f, 502, "store_unavailable", msg);
        return;
    }
    if (!f->connected && f->timeout_ms > hs->connect_ms) {
        f->connected = 1; /* in time: the rest of the response timeout starts */
        hs_arm(f->timer, f->timeout_ms - hs->connect_ms);
        return;
    }
    metrics_inc(&fg_metrics, M_HSTORE_ERRORS, 1);
    snprintf(msg, sizeof(msg),
             "store '%s' (%.200s) did not answer within %lld ms%s; the request may or may not "
             "have been applied",
             f->st->name, f->st->url.raw, f->timeout_ms,
             f->body_done || !f->req || httpd_req_body_length(f->req) == 0
                 ? ""
                 : " (or the request body stopped arriving)");
    hs_fwd_fail(f, 504, "store_timeout", msg);
}

/* Sends the client's request to the store on f->conn, stamped with the token, then its body as it
 * arrives. */
static void hs_send(struct hs_fwd *f)
{
    struct httpstore *hs = f->hs;
    struct httpd_req *req = f->req;
    struct evkeyvalq *in = httpd_req_input_headers(req), out;
    const char *conn = evhttp_find_header(in, "Connection");
    enum evhttp_cmd_type cmd = httpd_req_method(req);
    const struct cfg_addr *a = &f->st->url.hosts[0];
    int64_t blen = httpd_req_body_length(req);
    char num[32], host[300];
    int rc;

    TAILQ_INIT(&out);
    for (struct evkeyval *kv = in->tqh_first; kv; kv = kv->next.tqe_next)
        if (!httphdr_drop_request(kv->key, conn))
            evhttp_add_header(&out, kv->key, kv->value);
    httphdr_host(host, sizeof(host), a->host, a->port);
    evhttp_add_header(&out, "Host", host);
    snprintf(num, sizeof(num), "%" PRIu64, f->token);
    if (evhttp_add_header(&out, "Fence-Lock", f->lock) != 0 ||
        evhttp_add_header(&out, "Fencing-Token", num) != 0) { /* never unstamped */
        evhttp_clear_headers(&out);
        hs_fwd_fail(f, 400, "bad_request",
                    "the lock name cannot be sent in a Fence-Lock header; nothing was forwarded");
        return;
    }
    if (blen == 0 && (cmd == EVHTTP_REQ_POST || cmd == EVHTTP_REQ_PUT || cmd == EVHTTP_REQ_PATCH))
        evhttp_add_header(&out, "Content-Length", "0");
    f->head_request = cmd == EVHTTP_REQ_HEAD;
    f->body_done = blen == 0;
    rc = httpup_request(f->conn, httpd_req_method_name(req), f->target, &out, blen, f->head_request,
                        &hs_up_handler, f);
    evhttp_clear_headers(&out);
    if (rc != 0) {
        metrics_inc(&fg_metrics, M_HSTORE_ERRORS, 1);
        hs_fwd_fail(f, 502, "store_unavailable", "cannot send to the store; nothing was sent");
        return;
    }
    f->state = HS_SENT;
    metrics_inc(&fg_metrics, M_HSTORE_FORWARDED, 1);
    hs_arm(f->timer, f->timeout_ms < hs->connect_ms ? f->timeout_ms : hs->connect_ms);
    if (!f->body_done)
        httpd_req_body_start(req, hs_on_client_body, f);
}

static void hs_on_resolved(const struct addrinfo *res, const char *err, void *arg)
{
    struct hs_fwd *f = arg;
    const struct addrinfo *ai = res ? resolve_pick(res) : NULL;
    char msg[800];

    f->resolving = NULL;
    if (!ai) {
        metrics_inc(&fg_metrics, M_HSTORE_ERRORS, 1);
        snprintf(msg, sizeof(msg), "store '%s' (%.200s): %.300s; nothing was sent", f->st->name,
                 f->st->url.raw, err ? err : "no address");
        hs_fwd_fail(f, 502, "store_unavailable", msg);
        return;
    }
    if (!lock_still_held(f->owner, f->lock, strlen(f->lock), f->token)) {
        /* The mark was checked before the lookup, which may have taken seconds. */
        metrics_inc(&fg_metrics, M_HSTORE_LOCKLOST, 1);
        snprintf(msg, sizeof(msg),
                 "the lock was lost while the store's host name was looked up; re-acquire it; "
                 "nothing was forwarded to store '%s'",
                 f->st->name);
        hs_fwd_fail(f, 409, "lock_lost", msg);
        return;
    }
    f->conn = httpup_connect(f->hs->base, ai->ai_addr, ai->ai_addrlen);
    if (!f->conn) {
        metrics_inc(&fg_metrics, M_HSTORE_ERRORS, 1);
        snprintf(msg, sizeof(msg), "store '%s' (%.200s): cannot connect: %s; nothing was sent",
                 f->st->name, f->st->url.raw, strerror(errno));
        hs_fwd_fail(f, 502, "store_unavailable", msg);
        return;
    }
    hs_send(f);
}

/* Forwards on an idle connection to the store, or on a new one once the store's host name is
 * looked up (again: it may name another address by now). The lookup has the connect deadline;
 * the connection then has its own. */
static void hs_forward(struct hs_fwd *f)
{
    struct httpstore *hs = f->hs;
    const struct cfg_addr *a = &f->st->url.hosts[0];

    f->timer = evtimer_new(hs->base, hs_on_timer, f);
    if (!f->timer) {
        hs_fwd_fail(f, 503, "unavailable", "out of memory");
        return;
    }
    f->conn = hs_pool_take(hs, (int)(f->st - hs->cfg->stores));
    if (f->conn) {
        metrics_inc(&fg_metrics, M_HSTORE_REUSED, 1);
        hs_send(f);
        return;
    }
    f->resolving = resolve_start(hs->base, a->host, a->port, hs_on_resolved, f);
    if (!f->resolving) {
        hs_fwd_fail(f, 503, "unavailable",
                    "cannot resolve the store's host: out of memory or "
                    "threads");
        return;
    }
    f->state = HS_RESOLVING;
    hs_arm(f->timer, f->timeout_ms < hs->connect_ms ? f->timeout_ms : hs->connect_ms);
}

/* The mark's answer: forward, or refuse with nothing sent. */
static void hs_on_marked(void *arg, int status, uint64_t mark, const char *msg)
{
    struct hs_fwd *f = arg;
    char body[1800], esc[1200], text[1100];

    if (!f->req) { /* the client left while the mark was raised */
        hs_fwd_finish(f);
        return;
    }
    if (status == LOCK_OK && !lock_still_held(f->owner, f->lock, strlen(f->lock), f->token)) {
        /* Lost here (lease over, renewal refused, released) while the mark was raised: with etcd
         * the mark alone decided, and a former holder's request must not go out. */
        status = LOCK_LOST;
        msg = "the lock was lost while its mark was raised (its lease ran out, or it was released)";
    }
    if (status == LOCK_OK) {
        hs_forward(f);
        return;
    }
    if (status == LOCK_STALE) {
        metrics_inc(&fg_metrics, M_HSTORE_STALE, 1);
        snprintf(text, sizeof(text),
                 "STALE lock %.300s: token %" PRIu64 " < high-water mark %" PRIu64
                 " for store '%s' (a newer holder exists; re-acquire); nothing was forwarded",
                 f->lock, f->token, mark, f->st->name);
        /* A newer grant raised the mark: the lock is another's, whatever the lease says. */
        lock_forfeit(f->owner, f->lock, strlen(f->lock), f->token, text);
        json_escape(esc, sizeof(esc), text);
        snprintf(body, sizeof(body),
                 "{\"error\":\"stale_token\",\"token\":%" PRIu64 ",\"mark\":%" PRIu64
                 ",\"message\":\"%s\"}",
                 f->token, mark, esc);
        http_reply_json(hs_req_take(f), 409, body);
        hs_fwd_finish(f);
        return;
    }
    if (status == LOCK_LOST) {
        metrics_inc(&fg_metrics, M_HSTORE_LOCKLOST, 1);
        snprintf(text, sizeof(text), "%s; re-acquire it; nothing was forwarded to store '%s'",
                 msg && *msg ? msg : "the lock backend does not hold the lock for this sidecar",
                 f->st->name);
        hs_fwd_fail(f, 409, "lock_lost", text);
        return;
    }
    snprintf(text, sizeof(text),
             "cannot prove token %" PRIu64 " of lock %.300s is current for store '%s': %s; "
             "nothing was forwarded",
             f->token, f->lock, f->st->name, msg && *msg ? msg : "the lock backend failed");
    if (status == LOCK_INVALID)
        hs_fwd_fail(f, 400, "bad_request", text);
    else
        hs_fwd_fail(f, 503, "unavailable", text);
}

void httpstore_handle(void *arg, const struct cfg_store *st, const char *rest,
                      struct httpd_req *req, struct lock_session *sess)
{
    struct httpstore *hs = arg;
    struct evkeyvalq *in = httpd_req_input_headers(req);
    const char *lock = NULL, *query, *tmo;
    int nlock, tlen, klen, held;
    long long timeout = hs->response_ms, rem;
    uint64_t token;
    size_t len;
    char msg[1200], target[HTTPHDR_MAX_TARGET], decoded[HTTPHDR_MAX_TARGET], key[HS_MAX_KEY],
        ruled[LOCK_MAX_NAME + 1];
    struct hs_fwd *f;
    const struct fence_rules *rules = hs->rules[st - hs->cfg->stores];
    int rl;

    if (!sess) {
        http_reply_error(req, 503, "unavailable",
                         "the sidecar is shutting down; nothing is forwarded to stores");
        return;
    }
    lock = httpd_req_header(req, "Fence-Lock", &nlock);
    /* A path that could leave the store's prefix is refused before anything else is judged. */
    query = evhttp_uri_get_query(httpd_req_uri(req));
    tlen = httphdr_target(target, sizeof(target), st->url.path, rest, query);
    if (tlen == -1) {
        http_reply_error(req, 400, "bad_request",
                         "the path has a '.' or '..' segment, which could leave the store's "
                         "path prefix; send a normalised path");
        return;
    }
    if (tlen < 0) {
        snprintf(msg, sizeof(msg), "the forwarded path and query are longer than %d bytes",
                 HTTPHDR_MAX_TARGET);
        http_reply_error(req, 414, "uri_too_long", msg);
        return;
    }
    /* Protect rules of this store map the path, as the store will read it (percent-decoded,
     * after /http/), to its lock. */
    rl = 0;
    if (rules) {
        int dlen = httphdr_decode_path(decoded, sizeof(decoded), rest);
        const char *dkey = decoded[0] == '/' ? decoded + 1 : decoded;
        if (dlen < 0) {
            http_reply_error(req, dlen == HTTPHDR_PATH_REFUSED ? 400 : 414,
                             dlen == HTTPHDR_PATH_REFUSED ? "bad_request" : "uri_too_long",
                             dlen == HTTPHDR_PATH_REFUSED
                                 ? "the path has an encoded '/' (%2F), an encoded NUL (%00), a "
                                   "malformed %-escape or an empty segment (//); the store's "
                                   "protect rules could not tell which lock guards it"
                                 : "the path is too long");
            return;
        }
        rl = fence_lock_for_key(rules, dkey, (size_t)dlen - (size_t)(dkey - decoded), ruled,
                                LOCK_MAX_NAME);
        if (rl < 0) { /* a rule claims the path, but its lock could never be held: fail closed */
            snprintf(msg, sizeof(msg),
                     "path %.300s of store '%s' is protected by a lock whose name would be longer "
                     "than %d bytes; no lock can fence it, so nothing was forwarded",
                     rest, st->name, LOCK_MAX_NAME);
            http_reply_error(req, 414, "uri_too_long", msg);
            return;
        }
    }
    if (rl > 0) {
        ruled[rl] = '\0';
        if (lock && nlock == 1 && strcmp(lock, ruled) != 0) {
            snprintf(msg, sizeof(msg),
                     "Fence-Lock: path %.300s of store '%s' is protected by lock %.300s, not "
                     "%.300s; nothing was forwarded",
                     rest, st->name, ruled, lock);
            http_reply_error(req, 409, "wrong_lock", msg);
            return;
        }
        if (!lock) {
            lock = ruled;
            nlock = 1;
        }
    }
    if (!lock || !*lock) {
        http_reply_error(req, 400, "bad_request",
                         "missing Fence-Lock header: name the lock (taken with POST "
                         "/v1/locks/{name}) that fences this request, or give the store a "
                         "protect rule for this path");
        return;
    }
    len = strlen(lock);
    if (nlock > 1 || len > LOCK_MAX_NAME || strpbrk(lock, "\r\n")) {
        /* the forwarded request names its lock in a Fence-Lock header, which cannot hold CR/LF */
        snprintf(msg, sizeof(msg), "Fence-Lock: %s",
                 nlock > 1             ? "sent more than once; send exactly one lock name"
                 : len > LOCK_MAX_NAME ? "the lock name is longer than 512 bytes"
                                       : "the lock name has a CR or LF, which the forwarded "
                                         "request's Fence-Lock header cannot carry");
        http_reply_error(req, 400, "bad_request", msg);
        return;
    }
    tmo = evhttp_find_header(in, "Fence-Timeout-Ms");
    if (tmo && httphdr_parse_ms(tmo, HTTPSTORE_MAX_TIMEOUT_MS, &timeout) != 0) {
        snprintf(msg, sizeof(msg), "Fence-Timeout-Ms: expected milliseconds in 1..%d, got '%.40s'",
                 HTTPSTORE_MAX_TIMEOUT_MS, tmo);
        http_reply_error(req, 400, "bad_request", msg);
        return;
    }
    held = lock_state(sess, lock, len, &token, &rem);
    if (held != 1) {
        metrics_inc(&fg_metrics, M_HSTORE_LOCKLOST, 1);
        if (held < 0)
            snprintf(msg, sizeof(msg),
                     "lock %.300s (token %" PRIu64 ") was lost (GET /v1/events and the sidecar's "
                     "log say why); re-acquire it with POST /v1/locks/{name}; nothing was "
                     "forwarded",
                     lock, token);
        else
            snprintf(msg, sizeof(msg),
                     "lock %.300s is not held by this sidecar; acquire it with POST "
                     "/v1/locks/{name} first; nothing was forwarded",
                     lock);
        http_reply_error(req, 409, "lock_lost", msg);
        return;
    }
    switch (http_token_claim_ok(req, lock, token)) {
    case 0:
        metrics_inc(&fg_metrics, M_HSTORE_LOCKLOST, 1);
        /* fall through */
    case -1:
        return;
    }
    klen = hs_mark_key(key, sizeof(key), st->name, lock);
    if (klen < 0 || !hs->locks) {
        http_reply_error(req, klen < 0 ? 400 : 503, klen < 0 ? "bad_request" : "unavailable",
                         klen < 0 ? "store and lock names are too long for a mark key"
                                  : "the lock backend is not set up yet");
        return;
    }
    f = calloc(1, sizeof(*f) + (size_t)tlen + 1);
    if (!f || !(f->fin = event_new(hs->base, -1, 0, hs_on_fin, f))) {
        free(f);
        http_reply_error(req, 503, "unavailable", "out of memory");
        return;
    }
    f->hs = hs;
    f->st = st;
    f->req = req;
    f->token = token;
    f->owner = lock_session_ref(sess);
    f->timeout_ms = timeout;
    memcpy(f->lock, lock, len + 1);
    memcpy(f->target, target, (size_t)tlen + 1);
    f->next = hs->fwds;
    if (hs->fwds)
        hs->fwds->prev = f;
    hs->fwds = f;
    httpd_req_on_gone(req, hs_on_client_gone, f);
    if (lock_mark_raise_held(sess, lock, key, (size_t)klen, token, hs_on_marked, f) != 0)
        hs_fwd_fail(f, 503, "unavailable", "the lock backend took no more calls");
}

/* ---- fence on acquire ---- */

static void hs_hook_answer(void *arg, int status, uint64_t mark, const char *msg)
{
    struct hs_hook *k = arg;
    struct httpstore *hs = k->hs;

    if (status == LOCK_STALE && k->status >= 0) {
        k->status = 1;
        if (mark > k->mark)
            k->mark = mark;
        if (!k->msg[0])
            snprintf(k->msg, sizeof(k->msg), "an HTTP store's mark is ahead: %s", msg);
    } else if (status != LOCK_OK && k->status >= 0) {
        k->status = -1;
        snprintf(k->msg, sizeof(k->msg), "HTTP store mark: %s",
                 msg && *msg ? msg : "the lock backend failed");
    }
    if (--k->waiting > 0)
        return;
    if (k->prev)
        k->prev->next = k->next;
    else
        hs->hooks = k->next;
    if (k->next)
        k->next->prev = k->prev;
    k->done(k->ctx, k->status, k->mark, k->msg[0] ? k->msg : NULL);
    free(k);
}

void httpstore_fence_hook(void *arg, const char *name, uint64_t token, lock_fence_done done,
                          void *ctx)
{
    struct httpstore *hs = arg;
    struct hs_hook *k;
    char key[HS_MAX_KEY];
    int n = 0;

    for (int i = 0; i < hs->cfg->nstores; i++)
        n += hs->cfg->stores[i].url.kind == CFG_URL_HTTP;
    if (n == 0) {
        done(ctx, 0, 0, NULL);
        return;
    }
    if (!hs->locks || !(k = calloc(1, sizeof(*k)))) {
        done(ctx, -1, 0, hs->locks ? "out of memory" : "HTTP store marks: no lock client");
        return;
    }
    k->hs = hs;
    k->done = done;
    k->ctx = ctx;
    k->waiting = n + 1; /* the extra one keeps k while the raises are queued */
    k->next = hs->hooks;
    if (hs->hooks)
        hs->hooks->prev = k;
    hs->hooks = k;
    for (int i = 0; i < hs->cfg->nstores; i++) {
        const struct cfg_store *st = &hs->cfg->stores[i];
        int klen;
        if (st->url.kind != CFG_URL_HTTP)
            continue;
        klen = hs_mark_key(key, sizeof(key), st->name, name);
        if (klen < 0)
            hs_hook_answer(k, LOCK_INVALID, 0, "store and lock names are too long for a mark key");
        else if (lock_mark_raise(hs->locks, key, (size_t)klen, token, hs_hook_answer, k) != 0)
            hs_hook_answer(k, LOCK_UNAVAILABLE, 0, "the lock backend took no more calls");
    }
    hs_hook_answer(k, LOCK_OK, 0, NULL);
}

/* ---- lifetime ---- */

struct httpstore *httpstore_new(struct event_base *base, const struct cfg *cfg,
                                const struct httpstore_options *opt)
{
    struct httpstore *hs = calloc(1, sizeof(*hs));

    if (!hs)
        return NULL;
    hs->base = base;
    hs->cfg = cfg;
    for (int i = 0; i < cfg->nstores; i++) {
        struct fence_rule rules[CFG_MAX_PROTECT];
        size_t n = 0;
        int err = 0;
        if (cfg->stores[i].url.kind != CFG_URL_HTTP)
            continue;
        for (int j = 0; j < cfg->nprotect; j++) {
            if (strcmp(cfg->protect[j].store, cfg->stores[i].name) == 0) {
                rules[n].glob = cfg->protect[j].keys;
                rules[n].lock_template = cfg->protect[j].lock;
                n++;
            }
        }
        if (n > 0 && !(hs->rules[i] = fence_rules_new(rules, n, &err))) {
            httpstore_free(hs);
            return NULL;
        }
    }
    hs->connect_ms =
        opt && opt->connect_timeout_ms > 0 ? opt->connect_timeout_ms : HTTPSTORE_CONNECT_TIMEOUT_MS;
    hs->response_ms = opt && opt->response_timeout_ms > 0 ? opt->response_timeout_ms
                                                          : HTTPSTORE_RESPONSE_TIMEOUT_MS;
    hs->sweep = evtimer_new(base, hs_on_sweep, hs); /* without it, nothing is kept idle */
    return hs;
}

void httpstore_set_lock_client(struct httpstore *hs, struct lock_client *locks)
{
    hs->locks = locks;
}

void httpstore_free(struct httpstore *hs)
{
    if (!hs)
        return;
    while (hs->fwds)
        hs_fwd_free(hs->fwds);
    while (hs->hooks) {
        struct hs_hook *k = hs->hooks;
        hs->hooks = k->next;
        k->done(k->ctx, -1, 0, "shutting down");
        free(k);
    }
    for (int i = 0; i < CFG_MAX_STORES; i++) {
        hs_pool_trim(hs, i, -1);
        fence_rules_free(hs->rules[i]);
    }
    if (hs->sweep)
        event_free(hs->sweep);
    free(hs);
}
