/* httpstore.c — HTTP stores: a request under lock L is forwarded to the store with L's fencing
 * token, after the mark of (store, L) in the lock backend was checked and raised to the token.
 *
 * One forward is a small state machine (enum hs_state). The client's request body is already
 * buffered by evhttp (up to the HTTP endpoint's body limit); the store's response is streamed
 * back chunk by chunk, and reading from the store pauses while the client's output is above
 * HS_WATERMARK. Every teardown goes through hs_fwd_finish(), which defers the frees to the loop so
 * that no evhttp object is freed inside its own callback.
 *
 * Store connections are kept alive: a forward whose response was read whole gives its connection
 * back to its store's idle list (at most HS_POOL_MAX, each for at most HS_POOL_IDLE_MS), and the
 * next forward to that store takes the newest. Without that, every forward would leave a socket
 * in TIME_WAIT, and a few hundred forwards a second would run out of local ports. A connection
 * the store closed while idle is reopened by evhttp on its next request.
 *
 * evhttp would look the store's host name up with a blocking getaddrinfo() when it connects, on
 * the loop. So a new connection is made to the address looked up off the loop (resolve.h), while
 * the Host header keeps the name; a pooled connection stays bound to its address. */
#include "httpstore.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "clock.h"
#include "config.h"
#include "fence.h"
#include "http.h"
#include "httphdr.h"
#include "httpwatch.h"
#include "log.h"
#include "metrics.h"
#include "resolve.h"

#define HS_WATERMARK            (256 * 1024) /* client output bytes above which the store is not read */
#define HS_MAX_RESPONSE_HEADERS (64 * 1024) /* the store's status line and headers, bytes */
#define HS_MAX_KEY              (CFG_MAX_STR + LOCK_MAX_NAME + 2)
#define HS_POOL_MAX             32   /* idle connections kept per store */
#define HS_POOL_IDLE_MS         2000 /* an idle connection is closed after this long */

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
    struct evhttp_request *req;     /* the client's; NULL once answered or its connection went */
    struct httpwatch watch;         /* of the client going away; watch.conn is the client's
                                     * connection while req is set */
    struct evhttp_connection *conn; /* to the store */
    struct evhttp_request *ureq;    /* to the store; NULL once evhttp is done with it */
    struct resolve_req *resolving;  /* HS_RESOLVING */
    struct event *timer;            /* lookup, connect, then response deadline */
    struct event *fin;              /* deferred teardown */
    enum hs_state state;
    int connected; /* the connect deadline passed with a connection */
    int sent;      /* the store connection was up: the request may have reached the store */
    int started;   /* the reply to the client has started */
    int refused;   /* the store's answer cannot be relayed (a 1xx, an unknown transfer coding) */
    int uerr;      /* 1 + enum evhttp_request_error of a failed store request, else 0 */
    int paused;    /* reading from the store is off: the client is slow */
    int reusable;  /* the store's response was read whole: conn can serve another forward */
    size_t unsent; /* paused: the client's pending output when the idle timer was last armed */
    long long timeout_ms;
    uint64_t token;
    struct lock_session_ref owner; /* the session that holds lock with token */
    char why[96];                  /* refused: what was wrong with the store's answer */
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
    struct evhttp_connection *conn;
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
        evhttp_connection_free(e->conn);
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

/* The newest idle connection to store i, or NULL. */
static struct evhttp_connection *hs_pool_take(struct httpstore *hs, int i)
{
    struct hs_idle *e;
    struct evhttp_connection *conn;

    hs_pool_trim(hs, i, clock_now_ms() - HS_POOL_IDLE_MS);
    e = hs->idle[i];
    if (!e)
        return NULL;
    hs->idle[i] = e->next;
    hs->nidle[i]--;
    conn = e->conn;
    free(e);
    return conn;
}

/* Keeps conn for store i's next forward, or frees it when the list is full. */
static void hs_pool_put(struct httpstore *hs, int i, struct evhttp_connection *conn)
{
    struct hs_idle *e = hs->nidle[i] < HS_POOL_MAX && hs->sweep ? malloc(sizeof(*e)) : NULL;

    if (!e) {
        evhttp_connection_free(conn);
        return;
    }
    evhttp_connection_set_closecb(conn, NULL, NULL); /* its forward is gone */
    e->conn = conn;
    e->since_ms = clock_now_ms();
    e->next = hs->idle[i];
    hs->idle[i] = e;
    hs->nidle[i]++;
    if (!evtimer_pending(hs->sweep, NULL))
        hs_arm(hs->sweep, HS_POOL_IDLE_MS / 2);
}

/* ---- forwards ---- */

/* f has no client's request to answer any more: it answered it, or gave it back to evhttp. */
static void hs_req_done(struct hs_fwd *f)
{
    f->req = NULL;
    httpwatch_stop(&f->watch);
}

static void hs_fwd_free(struct hs_fwd *f)
{
    struct httpstore *hs = f->hs;

    httpwatch_stop(&f->watch);
    resolve_cancel(f->resolving);
    if (f->conn && f->reusable && !f->ureq)
        hs_pool_put(hs, (int)(f->st - hs->cfg->stores), f->conn);
    else if (f->conn)
        evhttp_connection_free(f->conn); /* frees a store request still pending, silently */
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

static void hs_on_fin(evutil_socket_t fd, short what, void *arg)
{
    struct hs_fwd *f = arg;

    /* Every path answers before it ends; never leave a client hanging regardless. */
    if (f->req && f->started) {
        hs_abort_client(f); /* a started reply cannot be ended cleanly */
    } else if (f->req) {
        http_reply_error(f->req, 502, f->sent ? "outcome_unknown" : "store_unavailable",
                         "the forward ended without an answer");
        hs_req_done(f);
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
        http_reply_error(f->req, status, code, msg);
    hs_req_done(f);
    hs_fwd_finish(f);
}

/* The reply has started and the store failed: the client must not take a cut body for a whole
 * one, so its connection is closed. */
static void hs_abort_client(struct hs_fwd *f)
{
    struct evhttp_connection *cconn = f->watch.conn;

    if (!f->req)
        return;
    hs_req_done(f);                /* first: freeing the connection runs its close callback */
    evhttp_connection_free(cconn); /* frees the request with it */
}

/* The client went away (its request is freed or left to libevent). */
static void hs_on_client_gone(void *arg)
{
    struct hs_fwd *f = arg;

    f->req = NULL;
    if (f->state != HS_RAISING)
        hs_fwd_finish(f); /* the mark's answer ends a raising one */
}

/* The store connection closed or is freed after it was up (libevent calls this only for a
 * connection that was connected): from then on the request may have reached the store. */
static void hs_on_store_close(struct evhttp_connection *conn, void *arg)
{
    struct hs_fwd *f = arg;

    f->sent = 1;
}

static void hs_on_error(enum evhttp_request_error err, void *arg)
{
    struct hs_fwd *f = arg;

    f->uerr = 1 + (int)err;
}

static int hs_on_headers(struct evhttp_request *ureq, void *arg)
{
    struct hs_fwd *f = arg;
    struct evkeyvalq *in = evhttp_request_get_input_headers(ureq), *out;
    const char *conn = evhttp_find_header(in, "Connection");
    const char *te = evhttp_find_header(in, "Transfer-Encoding");
    int code = evhttp_request_get_response_code(ureq), cl = 0;

    if (!f->req || f->state != HS_SENT)
        return -1; /* nobody to answer: stop reading */
    if (code < 200) {
        /* An interim answer (100 Continue, 103 Early Hints, ...): libevent 2.1 would take it for
         * the final one (or stall after a 100), so it is neither relayed nor waited past. */
        f->refused = 1;
        snprintf(f->why, sizeof(f->why), "an interim %d response, which is not relayed", code);
        return -1;
    }
    if (te && strcasecmp(te, "chunked") != 0) {
        f->refused = 1;
        snprintf(f->why, sizeof(f->why), "Transfer-Encoding '%.40s', which cannot be decoded", te);
        return -1;
    }
    out = evhttp_request_get_output_headers(f->req);
    for (struct evkeyval *kv = in->tqh_first; kv; kv = kv->next.tqe_next) {
        if (httphdr_is_hop_by_hop(kv->key, conn))
            continue;
        if (strcasecmp(kv->key, "Content-Length") == 0) {
            /* libevent de-chunks a chunked body and frames it anew (RFC 9112 §6.3: the
             * Transfer-Encoding wins), and reads a plain one by the first Content-Length: pass
             * on only that one, so the client's framing is the one libevent read. */
            if (te || cl++)
                continue;
        }
        evhttp_add_header(out, kv->key, kv->value);
    }
    f->state = HS_STREAMING;
    f->started = 1;
    hs_arm(f->timer, f->timeout_ms); /* from now on: the idle limit of the stream */
    evhttp_send_reply_start(f->req, code, evhttp_request_get_response_code_line(ureq));
    return 0;
}

/* The client's connection wrote out everything it had: read from the store again. */
static void hs_on_drained(struct evhttp_connection *conn, void *arg)
{
    struct hs_fwd *f = arg;

    if (f->paused && f->state == HS_STREAMING && f->ureq) {
        f->paused = 0;
        hs_arm(f->timer, f->timeout_ms); /* the client made progress */
        bufferevent_enable(evhttp_connection_get_bufferevent(f->conn), EV_READ);
    }
}

static void hs_on_chunk(struct evhttp_request *ureq, void *arg)
{
    struct hs_fwd *f = arg;
    struct evbuffer *b = evhttp_request_get_input_buffer(ureq), *pending;

    if (f->state != HS_STREAMING || !f->req) {
        hs_fwd_finish(f); /* the client left: the store connection is dropped */
        return;
    }
    hs_arm(f->timer, f->timeout_ms); /* the store made progress */
    evhttp_send_reply_chunk_with_cb(f->req, b, hs_on_drained, f);
    pending = bufferevent_get_output(evhttp_connection_get_bufferevent(f->watch.conn));
    f->unsent = evbuffer_get_length(pending);
    if (!f->paused && f->unsent > HS_WATERMARK) {
        f->paused = 1;
        bufferevent_disable(evhttp_connection_get_bufferevent(f->conn), EV_READ);
    }
}

static void hs_on_done(struct evhttp_request *ureq, void *arg)
{
    struct hs_fwd *f = arg;
    char msg[600];

    f->ureq = NULL; /* evhttp frees it after this returns */
    if (f->state == HS_DONE)
        return;
    if (!ureq || evhttp_request_get_response_code(ureq) == 0) {
        metrics_inc(&fg_metrics, M_HSTORE_ERRORS, 1);
        if (f->state == HS_STREAMING) {
            log_warn("http store %s: the response to %s broke off (%s); closing the client's "
                     "connection",
                     f->st->name, f->target,
                     f->uerr == 1 + EVREQ_HTTP_TIMEOUT ? "timeout" : "connection lost");
            hs_abort_client(f);
            hs_fwd_finish(f);
        } else if (!f->sent) {
            snprintf(msg, sizeof(msg),
                     "store '%s' (%.200s) is unreachable or refused the connection; nothing was "
                     "sent",
                     f->st->name, f->st->url.raw);
            hs_fwd_fail(f, 502, "store_unavailable", msg);
        } else if (f->uerr == 1 + EVREQ_HTTP_TIMEOUT) {
            snprintf(msg, sizeof(msg),
                     "store '%s' (%.200s) did not answer within %lld ms; the request may or may "
                     "not have been applied",
                     f->st->name, f->st->url.raw, f->timeout_ms);
            hs_fwd_fail(f, 504, "store_timeout", msg);
        } else {
            const char *what = f->refused ? f->why
                               : f->uerr == 1 + EVREQ_HTTP_INVALID_HEADER
                                   ? "sent a response that could not be read (malformed, or "
                                     "headers above 64 KiB)"
                                   : "closed the connection before answering";
            snprintf(msg, sizeof(msg),
                     "store '%s' (%.200s) %s%s; the request may or may not have been applied",
                     f->st->name, f->st->url.raw, f->refused ? "answered with " : "", what);
            hs_fwd_fail(f, 502, "outcome_unknown", msg);
        }
        return;
    }
    if (f->state == HS_SENT && hs_on_headers(ureq, f) < 0) {
        snprintf(msg, sizeof(msg),
                 "store '%s' (%.200s) answered with %s; the request may or may not have been "
                 "applied",
                 f->st->name, f->st->url.raw, f->refused ? f->why : "nothing usable");
        hs_fwd_fail(f, 502, "outcome_unknown", msg);
        return;
    }
    if (f->req) {
        struct evhttp_request *r = f->req;
        struct evbuffer *b = evhttp_request_get_input_buffer(ureq);
        if (evbuffer_get_length(b) > 0)
            evhttp_send_reply_chunk(r, b);
        hs_req_done(f); /* first: the end may free r and its connection at once */
        evhttp_send_reply_end(r);
    }
    f->reusable = !f->paused; /* evhttp keeps it open, or reopens it, for the next request */
    hs_fwd_finish(f);
}

/* 1 when the store connection's socket is connected. */
static int hs_connected(struct hs_fwd *f)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    evutil_socket_t fd = bufferevent_getfd(evhttp_connection_get_bufferevent(f->conn));

    return fd >= 0 && getpeername(fd, (struct sockaddr *)&ss, &sl) == 0;
}

static void hs_on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct hs_fwd *f = arg;
    struct httpstore *hs = f->hs;
    char msg[600];

    if (f->state == HS_STREAMING && f->paused && f->req) {
        size_t left = evbuffer_get_length(
            bufferevent_get_output(evhttp_connection_get_bufferevent(f->watch.conn)));
        if (left < f->unsent) { /* the client is reading, slowly: not idle */
            f->unsent = left;
            hs_arm(f->timer, f->timeout_ms);
            return;
        }
    }
    if (f->state == HS_STREAMING) {
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
    if (!f->connected && !hs_connected(f)) {
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
             "store '%s' (%.200s) did not answer within %lld ms; the request may or may not have "
             "been applied",
             f->st->name, f->st->url.raw, f->timeout_ms);
    hs_fwd_fail(f, 504, "store_timeout", msg);
}

/* Sends the client's request to the store on f->conn, stamped with the token. */
static void hs_send(struct hs_fwd *f)
{
    struct httpstore *hs = f->hs;
    struct evhttp_request *req = f->req;
    struct evkeyvalq *in = evhttp_request_get_input_headers(req), *out;
    const char *conn = evhttp_find_header(in, "Connection");
    struct evbuffer *body = evhttp_request_get_input_buffer(req);
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    const struct cfg_addr *a = &f->st->url.hosts[0];
    struct timeval tv = {(time_t)(f->timeout_ms / 1000),
                         (suseconds_t)(f->timeout_ms % 1000) * 1000};
    char num[32], host[300];
    size_t blen = evbuffer_get_length(body);

    f->ureq = f->conn ? evhttp_request_new(hs_on_done, f) : NULL;
    if (!f->ureq) {
        hs_fwd_fail(f, 503, "unavailable", "out of memory");
        return;
    }
    evhttp_connection_set_timeout_tv(f->conn, &tv); /* idle limit while the body streams */
    evhttp_connection_set_max_headers_size(f->conn, HS_MAX_RESPONSE_HEADERS);
    evhttp_connection_set_closecb(f->conn, hs_on_store_close, f);
    evhttp_request_set_header_cb(f->ureq, hs_on_headers);
    evhttp_request_set_chunked_cb(f->ureq, hs_on_chunk);
    evhttp_request_set_error_cb(f->ureq, hs_on_error);
    out = evhttp_request_get_output_headers(f->ureq);
    for (struct evkeyval *kv = in->tqh_first; kv; kv = kv->next.tqe_next)
        if (!httphdr_drop_request(kv->key, conn))
            evhttp_add_header(out, kv->key, kv->value);
    httphdr_host(host, sizeof(host), a->host, a->port);
    evhttp_add_header(out, "Host", host);
    snprintf(num, sizeof(num), "%" PRIu64, f->token);
    if (evhttp_add_header(out, "Fence-Lock", f->lock) != 0 ||
        evhttp_add_header(out, "Fencing-Token", num) != 0) { /* never unstamped */
        evhttp_request_free(f->ureq);
        f->ureq = NULL;
        hs_fwd_fail(f, 400, "bad_request",
                    "the lock name cannot be sent in a Fence-Lock header; nothing was forwarded");
        return;
    }
    if (blen > 0 || cmd == EVHTTP_REQ_POST || cmd == EVHTTP_REQ_PUT || cmd == EVHTTP_REQ_PATCH) {
        snprintf(num, sizeof(num), "%zu", blen);
        evhttp_add_header(out, "Content-Length", num);
    }
    evbuffer_add_buffer(evhttp_request_get_output_buffer(f->ureq), body);
    f->state = HS_SENT;
    if (evhttp_make_request(f->conn, f->ureq, cmd, f->target) != 0) {
        f->ureq = NULL; /* freed by evhttp */
        if (f->state == HS_SENT) {
            metrics_inc(&fg_metrics, M_HSTORE_ERRORS, 1);
            hs_fwd_fail(f, 502, "store_unavailable", "cannot connect to the store");
        }
        return;
    }
    metrics_inc(&fg_metrics, M_HSTORE_FORWARDED, 1);
    hs_arm(f->timer, f->timeout_ms < hs->connect_ms ? f->timeout_ms : hs->connect_ms);
}

static void hs_on_resolved(const struct addrinfo *res, const char *err, void *arg)
{
    struct hs_fwd *f = arg;
    char addr[64], msg[800];

    f->resolving = NULL;
    if (resolve_pick_host(res, addr, sizeof(addr)) < 0) {
        metrics_inc(&fg_metrics, M_HSTORE_ERRORS, 1);
        snprintf(msg, sizeof(msg), "store '%s' (%.200s): %.300s; nothing was sent", f->st->name,
                 f->st->url.raw, err);
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
    f->conn = evhttp_connection_base_new(f->hs->base, NULL, addr,
                                         (unsigned short)f->st->url.hosts[0].port);
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
        http_json_escape(esc, sizeof(esc), text);
        snprintf(body, sizeof(body),
                 "{\"error\":\"stale_token\",\"token\":%" PRIu64 ",\"mark\":%" PRIu64
                 ",\"message\":\"%s\"}",
                 f->token, mark, esc);
        http_reply_json(f->req, 409, body);
        hs_req_done(f);
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
                      struct evhttp_request *req, struct lock_session *sess)
{
    struct httpstore *hs = arg;
    struct evkeyvalq *in = evhttp_request_get_input_headers(req);
    const char *lock = NULL, *query, *tmo;
    int nlock = 0, tlen, klen, held;
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
    for (struct evkeyval *kv = in->tqh_first; kv; kv = kv->next.tqe_next) {
        if (strcasecmp(kv->key, "Fence-Lock") == 0) {
            nlock++;
            lock = kv->value;
        }
    }
    /* A path that could leave the store's prefix is refused before anything else is judged. */
    query = evhttp_uri_get_query(evhttp_request_get_evhttp_uri(req));
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
                     "lock %.300s (token %" PRIu64 ") was lost: its lease ran out or the backend "
                     "refused a renewal; re-acquire it with POST /v1/locks/{name}; nothing was "
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
    if (!http_token_claim_ok(req, lock, token)) {
        metrics_inc(&fg_metrics, M_HSTORE_LOCKLOST, 1);
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
    httpwatch_start(&f->watch, req, hs_on_client_gone, f);
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
