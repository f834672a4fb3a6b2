/* http.c — the HTTP endpoint: the lock API, health, readiness and Prometheus metrics. */
#include "http.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "appcheck.h"
#include "clock.h"
#include "config.h"
#include "httpd.h"
#include "httpevents.h"
#include "json.h"
#include "lock.h"
#include "log.h"
#include "metrics.h"
#include "net.h"
#include "upstream.h"

#define HTTP_LOCKS_PREFIX  "/v1/locks"
#define HTTP_STORES_PREFIX "/v1/stores/"
#define HTTP_MAX_ROUTES    8
#define HTTP_BUSY_RETRY_MS 25
#define HTTP_ESC_NAME      (LOCK_MAX_NAME * 6 + 1) /* a lock name JSON-escaped, every byte \u00XX */

/* A lock the sidecar's session holds for HTTP clients: its lease and when it was granted. */
struct http_grant {
    struct http_grant *next;
    uint64_t token;
    long long ttl_ms;
    uint64_t t0_ms;
    size_t len;
    char name[];
};

/* An acquisition in flight. req is NULL once its HTTP connection went away. */
struct http_acquire {
    struct http_api *h;
    struct http_acquire *prev, *next;
    struct httpd_req *req;
    struct event *retry; /* the lock is held by this very sidecar: poll until it is free */
    long long ttl_ms, wait_ms;
    uint64_t deadline_ms;
    uint64_t t0_us; /* an acquisition: when it was asked for (fencegate_lock_wait_seconds) */
    uint64_t token; /* a release: the token being given back */
    int inflight;   /* an acquisition the backend is working on */
    size_t len;
    char name[];
};

struct http_api {
    struct httpd *srv;
    struct upstream *up;
    const struct cfg *cfg;
    struct event_base *base;
    struct lock_client *locks;
    struct lock_session *sess; /* the sidecar's own session: every HTTP-held lock */
    struct http_grant *grants;
    struct http_acquire *pending;
    struct appcheck *app;       /* the application's health check; NULL when none is configured */
    struct http_events *events; /* GET /v1/events streams */
    int stopping;               /* SIGTERM: no new acquisitions */
    struct {
        int kind; /* enum cfg_url_kind */
        char verb[16];
        http_store_handler fn;
        void *arg;
        int streams; /* the handler takes request bodies as they arrive */
    } route[HTTP_MAX_ROUTES];
    int nroutes;
    struct {
        http_ready_check fn;
        void *arg;
    } ready[HTTP_MAX_ROUTES];
    int nready;
};

/* Sends a JSON body with the given status. body must be a complete JSON document. */
static void http_json(struct httpd_req *req, int code, const char *reason, const char *body)
{
    struct evbuffer *b = evbuffer_new();

    if (!b) {
        httpd_reply(req, 500, NULL, NULL);
        return;
    }
    evhttp_add_header(httpd_req_output_headers(req), "Content-Type", "application/json");
    evbuffer_add(b, body, strlen(body));
    evbuffer_add(b, "\n", 1);
    httpd_reply(req, code, reason, b);
    evbuffer_free(b);
}

/* Ready when the store (the upstream) answered its last probe and the lock backend is
 * connected; not ready while shutting down. */
static void http_readyz(struct http_api *h, struct httpd_req *req)
{
    char body[1024], why[512];

    if (h->stopping) {
        http_json(req, 503, "Service Unavailable",
                  "{\"error\":\"unavailable\",\"message\":\"shutting down\"}");
        return;
    }
    if (!upstream_is_up(h->up)) {
        json_escape(why, sizeof(why), upstream_error(h->up));
        snprintf(body, sizeof(body),
                 "{\"error\":\"unavailable\",\"message\":\"upstream %s is unreachable: %s\"}",
                 upstream_name(h->up), why);
        http_json(req, 503, "Service Unavailable", body);
        return;
    }
    const char *no = lock_client_not_ready(h->locks);
    if (no) {
        snprintf(why, sizeof(why), "the lock backend is not ready: %s", no);
        http_reply_error(req, 503, "unavailable", why);
        return;
    }
    for (int i = 0; i < h->nready; i++) {
        no = h->ready[i].fn(h->ready[i].arg);
        if (no) {
            http_reply_error(req, 503, "unavailable", no);
            return;
        }
    }
    snprintf(body, sizeof(body), "{\"status\":\"ready\",\"upstream\":\"%s\"}",
             upstream_name(h->up));
    http_json(req, 200, "OK", body);
}

static void http_metrics(struct http_api *h, struct httpd_req *req)
{
    size_t cap = 16384, need;
    char *text = NULL;
    struct evbuffer *b;
    struct lock_stats st;

    /* Counters the lock client keeps itself. */
    lock_client_stats(h->locks, &st);
    fg_metrics.counter[M_LOCK_RENEWALS] = st.renewals;
    fg_metrics.counter[M_LOCK_RENEWAL_TRIPS] = st.renewal_round_trips;
    fg_metrics.counter[M_TOKEN_REPAIRS] = st.token_repairs;
    fg_metrics.counter[M_TOKEN_REGRESSIONS] = st.token_regressions;
    fg_metrics.counter[M_LOCK_BATCHES] = st.backend_batches;
    fg_metrics.counter[M_LOCK_BATCHED] = st.backend_batched;

    for (;;) {
        char *p = realloc(text, cap);
        if (!p) {
            free(text);
            httpd_reply(req, 500, NULL, NULL);
            return;
        }
        text = p;
        need = metrics_render(&fg_metrics, text, cap);
        if (need < cap)
            break;
        cap = need + 1;
    }
    b = evbuffer_new();
    if (!b) {
        free(text);
        httpd_reply(req, 500, NULL, NULL);
        return;
    }
    evbuffer_add(b, text, need);
    free(text);
    evhttp_add_header(httpd_req_output_headers(req), "Content-Type", "text/plain; version=0.0.4");
    httpd_reply(req, 200, "OK", b);
    evbuffer_free(b);
}

/* Sends {"error": code, "message": msg} with status. */
static void http_error(struct httpd_req *req, int status, const char *reason, const char *code,
                       const char *msg)
{
    char body[1200], esc[1024];

    json_escape(esc, sizeof(esc), msg);
    snprintf(body, sizeof(body), "{\"error\":\"%s\",\"message\":\"%s\"}", code, esc);
    http_json(req, status, reason, body);
}

/* 405, with the methods the resource takes in an Allow header (RFC 9110 15.5.6). */
static void http_not_allowed(struct httpd_req *req, const char *allow, const char *msg)
{
    evhttp_add_header(httpd_req_output_headers(req), "Allow", allow);
    http_error(req, 405, "Method Not Allowed", "method_not_allowed", msg);
}

/* Tells the event streams about a lock of the sidecar's session: {"name","token"[,"ttl_ms"]
 * [,"reason"]} (ttl_ms when > 0, reason when not NULL). */
static void http_event_lock(struct http_api *h, const char *type, const char *name, size_t len,
                            uint64_t token, long long ttl_ms, const char *reason)
{
    char nm[LOCK_MAX_NAME + 1], esc[LOCK_MAX_NAME * 6 + 8], why[1100] = "", data[4600];
    char ttl[40] = "";

    if (!http_events_open(h->events))
        return;
    snprintf(nm, sizeof(nm), "%.*s", (int)len, name);
    json_escape(esc, sizeof(esc), nm);
    if (ttl_ms > 0)
        snprintf(ttl, sizeof(ttl), ",\"ttl_ms\":%lld", ttl_ms);
    if (reason) {
        char r[1024];
        json_escape(r, sizeof(r), reason);
        snprintf(why, sizeof(why), ",\"reason\":\"%s\"", r);
    }
    snprintf(data, sizeof(data), "{\"name\":\"%s\",\"token\":%" PRIu64 "%s%s}", esc, token, ttl,
             why);
    http_events_emit(h->events, type, name, len, data);
}

static struct http_grant **http_grant_find(struct http_api *h, const char *name, size_t len)
{
    struct http_grant **p;

    for (p = &h->grants; *p; p = &(*p)->next)
        if ((*p)->len == len && memcmp((*p)->name, name, len) == 0)
            return p;
    return p;
}

static void http_grant_end(struct http_api *h, const char *name, size_t len)
{
    struct http_grant **p = http_grant_find(h, name, len), *g = *p;

    if (!g)
        return;
    metrics_observe(&fg_metrics, H_LOCK_HOLD, (clock_now_ms() - g->t0_ms) * 1000);
    *p = g->next;
    free(g);
}

static void http_on_lost(void *arg, const char *name, uint64_t token, const char *why)
{
    struct http_api *h = arg;
    struct http_grant *g = *http_grant_find(h, name, strlen(name));

    metrics_inc(&fg_metrics, M_LOCKS_LOST, 1);
    if (g && g->token == token) /* not a later grant of the same name */
        http_grant_end(h, name, strlen(name));
    log_warn("http lock %s (token %" PRIu64 ") lost: %s", name, token, why);
    http_event_lock(h, "lost", name, strlen(name), token, 0, why);
}

static void http_acquire_free(struct http_acquire *a)
{
    struct http_api *h = a->h;

    if (a->prev)
        a->prev->next = a->next;
    else
        h->pending = a->next;
    if (a->next)
        a->next->prev = a->prev;
    if (a->retry)
        event_free(a->retry);
    free(a); /* a->req, if any, is answered (which freed it) */
}

/* The client of a waiting request went away. A release goes on; an acquisition ends at its next
 * retry, or goes on with the backend and gives back a lock granted with nobody to take it. */
static void http_on_client_gone(void *arg)
{
    struct http_acquire *a = arg;

    a->req = NULL;
}

/* A request that waits for the lock backend, tracked so that its connection closing early is
 * noticed (req becomes NULL). Returns NULL when out of memory. */
static struct http_acquire *http_pending_new(struct http_api *h, struct httpd_req *req,
                                             const char *name, size_t len)
{
    struct http_acquire *a = calloc(1, sizeof(*a) + len + 1);

    if (!a)
        return NULL;
    a->h = h;
    a->req = req;
    a->len = len;
    memcpy(a->name, name, len);
    a->next = h->pending;
    if (h->pending)
        h->pending->prev = a;
    h->pending = a;
    httpd_req_on_gone(req, http_on_client_gone, a);
    return a;
}

/* 1 when msg, the lock client's reason for a refused acquisition, names the lock itself at its
 * start ("lock L is held by ...", "fence on acquire of lock L (token T) failed: ..."), so that the
 * answer names it once. Names hold no NUL, so a match of len bytes lies inside msg. */
static int http_names_lock(const char *msg, const char *name, size_t len)
{
    static const char *const heads[] = {"lock ", "fence on acquire of lock "};

    for (size_t i = 0; msg && i < sizeof(heads) / sizeof(heads[0]); i++) {
        size_t n = strlen(heads[i]);
        if (strncmp(msg, heads[i], n) == 0 && strncmp(msg + n, name, len) == 0 &&
            (msg[n + len] == ' ' || msg[n + len] == ':'))
            return 1;
    }
    return 0;
}

static void http_on_acquired(void *arg, int status, uint64_t token, const char *msg)
{
    struct http_acquire *a = arg;
    struct http_api *h = a->h;
    char body[HTTP_ESC_NAME + 300], esc[HTTP_ESC_NAME], text[600];
    long long ttl = a->ttl_ms > 0 ? a->ttl_ms : h->cfg->session_ttl_ms;

    /* Every answer to an acquisition, as FENCE.ACQUIRE's (fencing_on_acquired()). */
    metrics_observe(&fg_metrics, H_LOCK_WAIT, clock_now_us() - a->t0_us);
    if (status == LOCK_OK && (!a->req || !appcheck_healthy(h->app))) {
        /* Nobody is there to learn the token, or nobody to be trusted with it: give it back. */
        (void)lock_release(h->sess, a->name, a->len, NULL, NULL);
        if (a->req)
            http_error(a->req, 503, "Service Unavailable", "app_unhealthy", appcheck_why(h->app));
        http_acquire_free(a);
        return;
    }
    if (status == LOCK_OK) {
        struct http_grant *g = malloc(sizeof(*g) + a->len);
        metrics_inc(&fg_metrics, M_LOCKS_ACQUIRED, 1);
        if (g) {
            g->token = token;
            g->ttl_ms = ttl;
            g->t0_ms = clock_now_ms();
            g->len = a->len;
            memcpy(g->name, a->name, a->len);
            g->next = h->grants;
            h->grants = g;
        }
        json_escape(esc, sizeof(esc), a->name);
        snprintf(body, sizeof(body), "{\"name\":\"%s\",\"token\":%" PRIu64 ",\"ttl_ms\":%lld}", esc,
                 token, ttl);
        http_json(a->req, 200, "OK", body);
        http_event_lock(h, "acquired", a->name, a->len, token, ttl, NULL);
    } else if (a->req) {
        if (http_names_lock(msg, a->name, a->len))
            snprintf(text, sizeof(text), "%s", msg);
        else
            snprintf(text, sizeof(text), "lock %s: %s", a->name, msg ? msg : "not acquired");
        if (status == LOCK_BUSY) {
            metrics_inc(&fg_metrics, M_LOCKS_BUSY, 1);
            http_error(a->req, 409, "Conflict", "locked", text);
        } else if (status == LOCK_INVALID) {
            http_error(a->req, 400, "Bad Request", "bad_request", text);
        } else {
            http_error(a->req, 503, "Service Unavailable", "unavailable", text);
        }
    }
    http_acquire_free(a);
}

static void http_acquire_start(struct http_acquire *a);

static void http_on_retry(evutil_socket_t fd, short what, void *arg)
{
    http_acquire_start(arg);
}

/* 1 when another HTTP client's acquisition of the same lock is with the backend now. */
static int http_acquire_racing(const struct http_acquire *a)
{
    for (const struct http_acquire *b = a->h->pending; b; b = b->next)
        if (b != a && b->inflight && b->len == a->len && memcmp(b->name, a->name, a->len) == 0)
            return 1;
    return 0;
}

/* Whether the session may take no more locks for HTTP clients: those it holds and those the
 * backend is acquiring for them (each may be granted) make LOCK_SESSION_MAX_HELD. A lock the
 * session holds, or is acquiring, for another HTTP client is waited for before this check. */
static int http_session_full(const struct http_api *h)
{
    size_t n = lock_count(h->sess);

    for (const struct http_acquire *b = h->pending; b && n < LOCK_SESSION_MAX_HELD; b = b->next)
        n += b->inflight != 0;
    return n >= LOCK_SESSION_MAX_HELD;
}

/* Asks the backend, unless this sidecar itself holds the lock for another HTTP client, or is
 * acquiring it for one: then the request waits here, as it would for a holder elsewhere. All
 * HTTP clients share the sidecar's session, so the session alone cannot tell them apart. */
static void http_acquire_start(struct http_acquire *a)
{
    struct http_api *h = a->h;
    uint64_t token, now = clock_now_ms();
    long long rem, wait;

    if (!a->req) { /* nobody waits any more: stop waiting */
        http_acquire_free(a);
        return;
    }
    if (lock_state(h->sess, a->name, a->len, &token, &rem) == 1 || http_acquire_racing(a)) {
        struct timeval tv = {0, HTTP_BUSY_RETRY_MS * 1000};
        if (now >= a->deadline_ms) {
            http_on_acquired(a, LOCK_BUSY, 0, "held by another client of this sidecar");
            return;
        }
        if (!a->retry && !(a->retry = evtimer_new(h->base, http_on_retry, a))) {
            http_on_acquired(a, LOCK_UNAVAILABLE, 0, "out of memory");
            return;
        }
        evtimer_add(a->retry, &tv);
        return;
    }
    if (http_session_full(h)) {
        char text[600];
        snprintf(text, sizeof(text),
                 "lock %s: this sidecar's HTTP clients hold %d locks (or are being granted them), "
                 "the most its one session may hold; release some first",
                 a->name, LOCK_SESSION_MAX_HELD);
        http_error(a->req, 503, "Service Unavailable", "too_many_locks", text);
        http_acquire_free(a);
        return;
    }
    wait = a->wait_ms <= 0 ? 0 : (long long)(a->deadline_ms > now ? a->deadline_ms - now : 0);
    a->inflight = 1;
    if (lock_acquire(h->sess, a->name, a->len, a->ttl_ms > 0 ? a->ttl_ms : 0, wait, 0,
                     http_on_acquired, a) < 0)
        http_on_acquired(a, LOCK_UNAVAILABLE, 0, "cannot queue the request");
}

/* 1 when path is under /v1/locks. */
static int http_is_locks(const char *path)
{
    size_t n = strlen(HTTP_LOCKS_PREFIX);

    return !strncmp(path, HTTP_LOCKS_PREFIX, n) && (path[n] == '/' || path[n] == '\0');
}

/* 1 when req declares (Content-Length) a body larger than the lock API takes. Such a request is
 * answered from its head (http_streams() has it handed over before its body is read), so that a
 * client waiting for "100 Continue" sends nothing and the server reads nothing. */
static int http_locks_body_too_large(struct httpd_req *req)
{
    return httpd_req_body_length(req) > JSON_LOCK_MAX_BODY;
}

static void http_lock_too_large(struct httpd_req *req, size_t len)
{
    char msg[200];

    snprintf(msg, sizeof(msg),
             "the request body (%zu bytes) is over the limit of the lock API, %d bytes; nothing "
             "was done",
             len, JSON_LOCK_MAX_BODY);
    http_error(req, 413, NULL, "request_too_large", msg);
}

static void http_lock_post(struct http_api *h, struct httpd_req *req, const char *name, size_t len)
{
    struct evbuffer *in = httpd_req_body(req);
    size_t blen = evbuffer_get_length(in);
    long long ttl = -1, wait = -1;
    char err[512];
    struct http_acquire *a;
    char *body = blen ? (char *)evbuffer_pullup(in, (ev_ssize_t)blen) : NULL;

    if (h->stopping) {
        http_error(req, 503, "Service Unavailable", "unavailable",
                   "the sidecar is shutting down and takes no new locks");
        return;
    }
    if (!appcheck_healthy(h->app)) {
        http_error(req, 503, "Service Unavailable", "app_unhealthy", appcheck_why(h->app));
        return;
    }
    if (blen > JSON_LOCK_MAX_BODY) { /* chunked: its length is known once read */
        http_lock_too_large(req, blen);
        return;
    }
    if (json_parse_lock_request(body, blen, &ttl, &wait, err, sizeof(err)) != FG_OK) {
        http_error(req, 400, "Bad Request", "bad_request", err);
        return;
    }
    if (ttl >= 0 && (ttl < LOCK_MIN_TTL_MS || ttl > LOCK_MAX_TTL_MS)) { /* -1: not given */
        snprintf(err, sizeof(err),
                 "lock %.*s: ttl_ms %lld is out of range: expected milliseconds in %d..%d",
                 len > 300 ? 300 : (int)len, name, ttl, LOCK_MIN_TTL_MS, LOCK_MAX_TTL_MS);
        http_error(req, 400, "Bad Request", "bad_request", err);
        return;
    }
    if (wait > 86400000) {
        http_error(req, 400, "Bad Request", "bad_request",
                   "wait_ms: expected milliseconds in 0..86400000");
        return;
    }
    if (!h->sess &&
        !(h->sess = lock_session_new(h->locks, h->cfg->session_ttl_ms, http_on_lost, h))) {
        http_error(req, 503, "Service Unavailable", "unavailable", "out of memory");
        return;
    }
    a = http_pending_new(h, req, name, len);
    if (!a) {
        http_error(req, 503, "Service Unavailable", "unavailable", "out of memory");
        return;
    }
    a->t0_us = clock_now_us();
    a->ttl_ms = ttl;
    a->wait_ms = wait < 0 ? 0 : wait;
    a->deadline_ms = clock_now_ms() + (uint64_t)a->wait_ms;
    http_acquire_start(a);
}

static void http_on_deleted(void *arg, int status, const char *msg)
{
    struct http_acquire *a = arg;
    char body[HTTP_ESC_NAME + 300], esc[HTTP_ESC_NAME];

    char text[700];

    if (status == LOCK_UNAVAILABLE)
        log_warn("http release of %s: %s (the backend deletes the key once it can; at worst its "
                 "lease runs out)",
                 a->name, msg ? msg : "backend error");
    if (a->req && status == LOCK_OK) {
        json_escape(esc, sizeof(esc), a->name);
        snprintf(body, sizeof(body), "{\"name\":\"%s\",\"released\":true,\"token\":%" PRIu64 "}",
                 esc, a->token);
        http_json(a->req, 200, "OK", body);
    } else if (a->req && status == LOCK_NOT_HELD) {
        snprintf(text, sizeof(text),
                 "lock %.300s (token %" PRIu64 ") was lost before the release: the backend no "
                 "longer held it for this sidecar",
                 a->name, a->token);
        http_error(a->req, 404, "Not Found", "not_held", text);
    } else if (a->req) {
        snprintf(text, sizeof(text),
                 "lock %.300s (token %" PRIu64 "): the release did not reach the backend (%.200s); "
                 "this sidecar no longer holds it, and its lease runs out by itself",
                 a->name, a->token, msg ? msg : "backend error");
        http_error(a->req, 503, "Service Unavailable", "unavailable", text);
    }
    http_event_lock(a->h, status == LOCK_NOT_HELD ? "lost" : "released", a->name, a->len, a->token,
                    0, NULL);
    http_acquire_free(a);
}

/* Answers once the backend has let go, so 200 means another holder can take the lock now. A
 * "Fencing-Token" header (fencectl sends one) must match: a client whose lock was lost must not
 * release the lock a newer holder took under the same name. */
static void http_lock_delete(struct http_api *h, struct httpd_req *req, const char *name,
                             size_t len)
{
    uint64_t token;
    long long rem;
    char body[HTTP_ESC_NAME + 300], esc[HTTP_ESC_NAME];
    int st = h->sess ? lock_state(h->sess, name, len, &token, &rem) : 0;
    struct http_acquire *a;

    json_escape(esc, sizeof(esc), name);
    if (st == 1 && http_token_claim_ok(req, name, token) != 1)
        return;
    if (st != 1) {
        if (st < 0) /* lost: forget it */
            (void)lock_release(h->sess, name, len, NULL, NULL);
        http_grant_end(h, name, len);
        snprintf(body, sizeof(body),
                 "{\"error\":\"not_held\",\"message\":\"lock %s is not held by this sidecar%s\"}",
                 esc, st < 0 ? " (it was lost)" : "");
        http_json(req, 404, "Not Found", body);
        return;
    }
    http_grant_end(h, name, len);
    metrics_inc(&fg_metrics, M_LOCKS_RELEASED, 1);
    a = http_pending_new(h, req, name, len);
    if (!a) {
        (void)lock_release(h->sess, name, len, NULL, NULL);
        http_error(req, 503, "Service Unavailable", "unavailable", "out of memory");
        return;
    }
    a->token = token;
    if (lock_release(h->sess, name, len, http_on_deleted, a) < 0)
        http_on_deleted(a, LOCK_UNAVAILABLE, "cannot queue the release");
}

struct http_list {
    struct http_api *h;
    struct evbuffer *b;
    int n;
};

static void http_list_one(void *arg, const char *name, size_t len, int state, uint64_t token,
                          long long remaining_ms)
{
    struct http_list *l = arg;
    struct http_grant *g = *http_grant_find(l->h, name, len);
    char esc[HTTP_ESC_NAME], nm[LOCK_MAX_NAME + 1];

    snprintf(nm, sizeof(nm), "%.*s", (int)len, name);
    json_escape(esc, sizeof(esc), nm);
    evbuffer_add_printf(l->b,
                        "%s{\"name\":\"%s\",\"token\":%" PRIu64
                        ",\"ttl_ms\":%lld,\"remaining_ms\":%lld,\"state\":\"%s\"}",
                        l->n++ ? "," : "", esc, token, g ? g->ttl_ms : 0LL,
                        state == 1 ? remaining_ms : 0LL, state == 1 ? "held" : "lost");
}

static void http_lock_list(struct http_api *h, struct httpd_req *req)
{
    struct http_list l = {h, evbuffer_new(), 0};

    if (!l.b) {
        httpd_reply(req, 500, NULL, NULL);
        return;
    }
    evbuffer_add_printf(l.b, "{\"locks\":[");
    if (h->sess)
        lock_foreach(h->sess, http_list_one, &l);
    evbuffer_add_printf(l.b, "]}\n");
    evhttp_add_header(httpd_req_output_headers(req), "Content-Type", "application/json");
    httpd_reply(req, 200, "OK", l.b);
    evbuffer_free(l.b);
}

/* /v1/locks and /v1/locks/{name}. */
static void http_locks(struct http_api *h, struct httpd_req *req, const char *path)
{
    enum evhttp_cmd_type m = httpd_req_method(req);
    const char *rest = path + strlen(HTTP_LOCKS_PREFIX);
    size_t len = 0;
    char *name;

    if (http_locks_body_too_large(req)) {
        http_lock_too_large(req, (size_t)httpd_req_body_length(req));
        return;
    }
    /* POST or DELETE /v1/locks/ names a lock, an empty one: refused below as such. */
    if (*rest == '\0' || (!strcmp(rest, "/") && m != EVHTTP_REQ_POST && m != EVHTTP_REQ_DELETE)) {
        if (m != EVHTTP_REQ_GET && m != EVHTTP_REQ_HEAD) {
            http_not_allowed(req, "GET, HEAD",
                             "use GET /v1/locks, or POST / DELETE /v1/locks/{name}");
            return;
        }
        http_lock_list(h, req);
        return;
    }
    name = evhttp_uridecode(rest + 1, 0, &len);
    if (!name || len == 0 || len > LOCK_MAX_NAME || memchr(name, '\0', len) ||
        !json_utf8_valid(name, len)) {
        http_error(req, 400, "Bad Request", "bad_request",
                   "lock name must be 1..512 bytes of UTF-8 (it comes back in JSON), without NUL");
        free(name);
        return;
    }
    if (m == EVHTTP_REQ_POST)
        http_lock_post(h, req, name, len);
    else if (m == EVHTTP_REQ_DELETE)
        http_lock_delete(h, req, name, len);
    else
        http_not_allowed(req, "POST, DELETE",
                         "use POST to acquire or DELETE to release /v1/locks/{name}");
    free(name);
}

void http_release_all(struct http_api *h)
{
    if (!h->stopping)
        http_events_end(
            h->events, "shutdown",
            "{\"reason\":\"the sidecar is shutting down; its HTTP locks are released\"}");
    h->stopping = 1;
    while (h->grants) {
        metrics_inc(&fg_metrics, M_LOCKS_RELEASED, 1);
        http_grant_end(h, h->grants->name, h->grants->len);
    }
    lock_session_free(h->sess); /* releases every lock of the session */
    h->sess = NULL;
}

void http_drain(struct http_api *h, void (*done)(void *), void *arg)
{
    httpd_drain(h->srv, done, arg);
}

void http_close_all(struct http_api *h)
{
    httpd_close_all(h->srv);
}

int http_conn_count(const struct http_api *h)
{
    return httpd_conn_count(h->srv);
}

int http_token_claim_ok(struct httpd_req *req, const char *lock, uint64_t held)
{
    char body[HTTP_ESC_NAME + 300], esc[HTTP_ESC_NAME];
    uint64_t v = 0;
    size_t i;
    int n;
    const char *want = httpd_req_header(req, "Fencing-Token", &n);

    /* Two fields are two claims: whichever one were taken, the client meant the other too. */
    if (n == 0)
        return 1;
    if (n > 1) {
        http_error(req, 400, NULL, "bad_request",
                   "Fencing-Token: sent more than once; send exactly one token");
        return -1;
    }
    /* Canonical decimal only ("0" or no leading zero), as POST /v1/locks returned it. */
    for (i = 0; want[i] >= '0' && want[i] <= '9' && i < 20; i++) {
        if (v > (UINT64_MAX - (uint64_t)(want[i] - '0')) / 10) {
            i = 0;
            break;
        }
        v = v * 10 + (uint64_t)(want[i] - '0');
    }
    if (i == 0 || want[i] != '\0' || (want[0] == '0' && i > 1)) {
        http_error(req, 400, NULL, "bad_request",
                   "Fencing-Token: expected the decimal token POST /v1/locks returned");
        return -1;
    }
    if (v == held)
        return 1;
    json_escape(esc, sizeof(esc), lock);
    snprintf(body, sizeof(body),
             "{\"error\":\"token_mismatch\",\"token\":%" PRIu64 ",\"held\":%" PRIu64
             ",\"message\":\"lock %s is held by this sidecar under token %" PRIu64 ", not %" PRIu64
             ": the lock this client took was lost and taken again; re-acquire\"}",
             v, held, esc, held, v);
    http_json(req, 409, NULL, body);
    return 0;
}

void http_reply_error(struct httpd_req *req, int status, const char *code, const char *msg)
{
    http_error(req, status, NULL, code, msg);
}

void http_reply_json(struct httpd_req *req, int status, const char *body)
{
    http_json(req, status, NULL, body);
}

int http_route_stores(struct http_api *h, int url_kind, const char *verb, http_store_handler fn,
                      void *arg, int streams)
{
    if (h->nroutes >= HTTP_MAX_ROUTES || strlen(verb) >= sizeof(h->route[0].verb))
        return -1;
    h->route[h->nroutes].kind = url_kind;
    snprintf(h->route[h->nroutes].verb, sizeof(h->route[0].verb), "%s", verb);
    h->route[h->nroutes].fn = fn;
    h->route[h->nroutes].arg = arg;
    h->route[h->nroutes].streams = streams;
    h->nroutes++;
    return 0;
}

int http_add_ready_check(struct http_api *h, http_ready_check fn, void *arg)
{
    if (h->nready >= HTTP_MAX_ROUTES)
        return -1;
    h->ready[h->nready].fn = fn;
    h->ready[h->nready].arg = arg;
    h->nready++;
    return 0;
}

/* The store of /v1/stores/{store}/{verb}[/rest] (path) and the route of its kind for verb.
 * Returns the route's index, -1 (*st NULL) when there is no such store, -2 when it has no such
 * endpoint; *verb and *vlen are the verb, *rest what follows it ("" or "/..."). */
static int http_store_route(const struct http_api *h, const char *path, const struct cfg_store **st,
                            const char **verb, size_t *vlen, const char **rest)
{
    const char *name = path + strlen(HTTP_STORES_PREFIX), *slash = strchr(name, '/');
    size_t nlen = slash ? (size_t)(slash - name) : strlen(name);
    const char *r;

    *st = NULL;
    *verb = slash ? slash + 1 : "";
    for (int i = 0; i < h->cfg->nstores; i++)
        if (strlen(h->cfg->stores[i].name) == nlen && !memcmp(h->cfg->stores[i].name, name, nlen))
            *st = &h->cfg->stores[i];
    if (!*st)
        return -1;
    r = strchr(*verb, '/');
    *vlen = r ? (size_t)(r - *verb) : strlen(*verb);
    *rest = r ? r : "";
    for (int i = 0; i < h->nroutes; i++)
        if (h->route[i].kind == (int)(*st)->url.kind && strlen(h->route[i].verb) == *vlen &&
            !memcmp(h->route[i].verb, *verb, *vlen))
            return i;
    return -2;
}

/* Whether req's handler takes its body as it arrives (httpd_stream_cb): a store's that streams,
 * and a lock API request whose body is too large, refused from its head before it is read. */
static int http_streams(struct httpd_req *req, void *arg)
{
    const struct http_api *h = arg;
    const char *path = evhttp_uri_get_path(httpd_req_uri(req)), *verb, *rest;
    const struct cfg_store *st;
    size_t vlen;
    int i;

    if (path && http_is_locks(path))
        return http_locks_body_too_large(req);
    if (!path || strncmp(path, HTTP_STORES_PREFIX, strlen(HTTP_STORES_PREFIX)) != 0 || h->stopping)
        return 0;
    i = http_store_route(h, path, &st, &verb, &vlen, &rest);
    return i >= 0 && h->route[i].streams;
}

/* /v1/stores/{store}/{verb}[/rest]: finds the store and the handler of its kind. */
static void http_stores(struct http_api *h, struct httpd_req *req, const char *path)
{
    const char *name = path + strlen(HTTP_STORES_PREFIX), *verb, *rest;
    const struct cfg_store *st;
    size_t vlen;
    char msg[768], url[256];
    int i = http_store_route(h, path, &st, &verb, &vlen, &rest);

    if (!st) {
        size_t nlen = strcspn(name, "/");
        snprintf(msg, sizeof(msg), "no store named '%.*s' is configured",
                 (int)(nlen > 200 ? 200 : nlen), name);
        http_reply_error(req, 404, "unknown_store", msg);
        return;
    }
    /* The session exists before the first lock, so that "no lock held" is not "shutting down". */
    if (!h->stopping && !h->sess)
        h->sess = lock_session_new(h->locks, h->cfg->session_ttl_ms, http_on_lost, h);
    if (i >= 0) {
        h->route[i].fn(h->route[i].arg, st, rest, req, h->stopping ? NULL : h->sess);
        return;
    }
    snprintf(msg, sizeof(msg), "store '%s' (%s) has no endpoint '%.*s'%s", st->name,
             cfg_url_masked(url, sizeof(url), st->url.raw), (int)(vlen > 64 ? 64 : vlen), verb,
             st->url.kind == CFG_URL_POSTGRES ? "; use /v1/stores/{store}/sql"
             : st->url.kind == CFG_URL_HTTP   ? "; use /v1/stores/{store}/http/{path}"
                                              : "; Redis stores are written through the RESP "
                                                "endpoint");
    http_reply_error(req, 404, "not_found", msg);
}

static void http_dispatch(struct httpd_req *req, void *arg)
{
    struct http_api *h = arg;
    const char *path = evhttp_uri_get_path(httpd_req_uri(req));
    enum evhttp_cmd_type m = httpd_req_method(req);

    metrics_inc(&fg_metrics, M_HTTP_REQUESTS, 1);
    if (!path)
        path = "/";
    if (http_is_locks(path)) {
        http_locks(h, req, path);
        return;
    }
    if (!strncmp(path, HTTP_STORES_PREFIX, strlen(HTTP_STORES_PREFIX))) {
        http_stores(h, req, path);
        return;
    }
    if (!strcmp(path, "/v1/events")) {
        if (m != EVHTTP_REQ_GET)
            http_not_allowed(req, "GET", "use GET /v1/events");
        else if (h->stopping)
            http_error(req, 503, "Service Unavailable", "unavailable", "shutting down");
        else
            http_events_serve(h->events, req);
        return;
    }
    if (strcmp(path, "/healthz") && strcmp(path, "/readyz") && strcmp(path, "/metrics")) {
        http_json(req, 404, "Not Found",
                  "{\"error\":\"not_found\",\"message\":\"no such endpoint; see /v1/locks, "
                  "/v1/events, /healthz, /readyz, /metrics\"}");
        return;
    }
    if (m != EVHTTP_REQ_GET && m != EVHTTP_REQ_HEAD) {
        http_not_allowed(req, "GET, HEAD", "use GET");
        return;
    }
    if (!strcmp(path, "/healthz"))
        http_json(req, 200, "OK", "{\"status\":\"ok\"}");
    else if (!strcmp(path, "/readyz"))
        http_readyz(h, req);
    else
        http_metrics(h, req);
}

/* The application's health check changed its verdict: a failing application keeps no lock. */
static void http_on_app_health(void *arg, int healthy, const char *why)
{
    struct http_api *h = arg;

    char esc[1500], data[1600];

    if (healthy) {
        http_events_emit(h->events, "app_healthy", NULL, 0, "{}");
        return;
    }
    json_escape(esc, sizeof(esc), why);
    snprintf(data, sizeof(data), "{\"reason\":\"%s\"}", esc);
    http_events_emit(h->events, "app_unhealthy", NULL, 0, data);
    lock_session_lose_all(h->sess, why);
}

struct http_api *http_new(struct event_base *base, const struct cfg *cfg, int fd,
                          struct upstream *up, struct lock_client *locks, char *err, size_t errlen)
{
    struct http_api *h = calloc(1, sizeof(*h));

    if (!h) {
        snprintf(err, errlen, "out of memory");
        close(fd);
        return NULL;
    }
    h->up = up;
    h->cfg = cfg;
    h->base = base;
    h->locks = locks;
    if (net_listen(fd, cfg->listen_http.host, cfg->listen_http.port, 128, err, errlen) < 0) {
        close(fd);
        http_free(h);
        return NULL;
    }
    if (!(h->srv = httpd_new(base, fd, http_dispatch, h))) {
        snprintf(err, errlen, "cannot serve HTTP on %s:%d: out of memory", cfg->listen_http.host,
                 cfg->listen_http.port);
        close(fd);
        http_free(h);
        return NULL;
    }
    httpd_set_stream(h->srv, http_streams);
    if (!(h->events = http_events_new(base))) {
        snprintf(err, errlen, "out of memory");
        http_free(h);
        return NULL;
    }
    fg_metrics.gauge[G_APP_HEALTHY] = 1;
    h->app = appcheck_new(base, cfg, http_on_app_health, h, err, errlen);
    if (!h->app && err[0]) {
        http_free(h);
        return NULL;
    }
    return h;
}

void http_free(struct http_api *h)
{
    if (!h)
        return;
    http_release_all(h);
    while (h->pending) {
        struct http_acquire *a = h->pending;
        if (a->req)
            http_error(a->req, 503, "Service Unavailable", "unavailable", "shutting down");
        http_acquire_free(a);
    }
    appcheck_free(h->app);
    http_events_free(h->events);
    httpd_free(h->srv);
    free(h);
}
