/* appcheck.c — the application's health check: one GET of app_health.url per interval on a new
 * connection (Connection: close, as a kubelet probe), passing on a status of 200..399 within
 * timeout_ms. The body is read and dropped. The URL's host name is looked up off the loop
 * (resolve.h) at each check, within the same timeout: evhttp would call a blocking getaddrinfo()
 * on the loop; the Host header keeps the name. */
#include "appcheck.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "config.h"
#include "httphdr.h"
#include "log.h"
#include "metrics.h"
#include "resolve.h"

#define APPCHECK_MAX_HEADERS 16384

enum appcheck_state { AC_IDLE, AC_RESOLVING, AC_PROBING, AC_ANSWERED };

struct appcheck {
    struct event_base *base;
    const struct cfg *cfg;
    appcheck_cb cb;
    void *arg;
    struct resolve_req *resolving;  /* the host's lookup (AC_RESOLVING) */
    struct evhttp_connection *conn; /* of the check in progress */
    struct event *timer;            /* the next check, or the running check's deadline */
    struct event *fin;              /* ends a check from the loop, outside libevent's callbacks */
    enum appcheck_state state;
    long long started_ms;
    int status;    /* the answer's HTTP status; 0 none */
    int err;       /* enum evhttp_request_error + 1; 0 none */
    int connected; /* the check's connection was up at some point */
    int failures;  /* failed checks in a row */
    int healthy;
    char host[300]; /* Host header */
    char why[1400];
};

static void appcheck_arm(struct appcheck *a, long long ms)
{
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000) * 1000};

    evtimer_add(a->timer, &tv);
}

/* The outcome of one check: counts it, and tells the owner when the verdict changes. */
static void appcheck_result(struct appcheck *a, const char *fail)
{
    const char *url = a->cfg->app_health_url.raw;

    metrics_inc(&fg_metrics, M_APP_CHECKS, 1);
    if (!fail) {
        a->failures = 0;
        if (!a->healthy) {
            a->healthy = 1;
            a->why[0] = '\0';
            fg_metrics.gauge[G_APP_HEALTHY] = 1;
            log_info("app health check %s passes again: HTTP locks may be taken", url);
            a->cb(a->arg, 1, "");
        }
        return;
    }
    metrics_inc(&fg_metrics, M_APP_CHECK_FAILURES, 1);
    a->failures++;
    snprintf(a->why, sizeof(a->why),
             "the application's health check %s failed %d time%s in a row "
             "(last: %s)",
             url, a->failures, a->failures == 1 ? "" : "s", fail);
    if (!a->healthy)
        return;
    if (a->failures < a->cfg->app_health_failures) {
        log_info("app health check %s failed (%d of %d before HTTP locks are given up): %s", url,
                 a->failures, a->cfg->app_health_failures, fail);
        return;
    }
    a->healthy = 0;
    fg_metrics.gauge[G_APP_HEALTHY] = 0;
    log_warn("%s: giving up every lock held over HTTP; new ones are refused until it passes",
             a->why);
    a->cb(a->arg, 0, a->why);
}

static void appcheck_start(struct appcheck *a);

/* Ends the running check with its outcome and schedules the next one interval after it began. */
static void appcheck_end(struct appcheck *a, const char *fail)
{
    long long next = a->started_ms + a->cfg->app_health_interval_ms - clock_now_ms();

    resolve_cancel(a->resolving);
    a->resolving = NULL;
    if (a->conn)
        evhttp_connection_free(a->conn); /* frees a request still pending, silently */
    a->conn = NULL;
    a->state = AC_IDLE;
    appcheck_arm(a, next > 0 ? next : 0);
    appcheck_result(a, fail);
}

static void appcheck_on_fin(evutil_socket_t fd, short what, void *arg)
{
    struct appcheck *a = arg;
    char fail[200];
    static const char *const errs[] = {
        "no answer in time",       "the connection closed before a response",
        "invalid response header", "buffer error",
        "request cancelled",       "response too large"};

    (void)fd;
    (void)what;
    if (a->state != AC_ANSWERED)
        return;
    if (a->status >= 200 && a->status <= 399) {
        appcheck_end(a, NULL);
        return;
    }
    if (a->status > 0)
        snprintf(fail, sizeof(fail), "HTTP status %d", a->status);
    else if (!a->connected)
        snprintf(fail, sizeof(fail), "cannot connect (refused or unreachable)");
    else
        snprintf(fail, sizeof(fail), "%s",
                 a->err > 0 && a->err <= (int)(sizeof errs / sizeof errs[0]) ? errs[a->err - 1]
                                                                             : errs[1]);
    appcheck_end(a, fail);
}

static void appcheck_on_error(enum evhttp_request_error err, void *arg)
{
    struct appcheck *a = arg;

    a->err = 1 + (int)err;
}

/* Reads and drops the body as it comes: a check never buffers it. */
static void appcheck_on_chunk(struct evhttp_request *req, void *arg)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(req);

    (void)arg;
    evbuffer_drain(in, evbuffer_get_length(in));
}

/* libevent calls this only for a connection that was up. */
static void appcheck_on_close(struct evhttp_connection *conn, void *arg)
{
    struct appcheck *a = arg;

    (void)conn;
    a->connected = 1;
}

static void appcheck_on_done(struct evhttp_request *req, void *arg)
{
    struct appcheck *a = arg;

    if (a->state != AC_PROBING)
        return;
    a->status = req ? evhttp_request_get_response_code(req) : 0;
    a->state = AC_ANSWERED;
    evtimer_del(a->timer);
    event_active(a->fin, EV_TIMEOUT, 1); /* the connection is freed outside its callback */
}

/* The host's address is known: connect to it and send the check. */
static void appcheck_resolved(const struct addrinfo *res, const char *err, void *arg)
{
    struct appcheck *a = arg;
    const struct cfg_url *u = &a->cfg->app_health_url;
    struct evhttp_request *req;
    struct evkeyvalq *h;
    char addr[64];

    a->resolving = NULL;
    if (resolve_pick_host(res, addr, sizeof(addr)) < 0) {
        appcheck_end(a, err);
        return;
    }
    a->conn = evhttp_connection_base_new(a->base, NULL, addr, (unsigned short)u->hosts[0].port);
    req = a->conn ? evhttp_request_new(appcheck_on_done, a) : NULL;
    if (!req) {
        appcheck_end(a, "out of memory");
        return;
    }
    evhttp_connection_set_retries(a->conn, 0);
    evhttp_connection_set_closecb(a->conn, appcheck_on_close, a);
    evhttp_connection_set_max_headers_size(a->conn, APPCHECK_MAX_HEADERS);
    evhttp_request_set_chunked_cb(req, appcheck_on_chunk);
    evhttp_request_set_error_cb(req, appcheck_on_error);
    h = evhttp_request_get_output_headers(req);
    evhttp_add_header(h, "Host", a->host);
    evhttp_add_header(h, "User-Agent", "fencegate-app-health");
    evhttp_add_header(h, "Accept", "*/*");
    evhttp_add_header(h, "Connection", "close");
    a->state = AC_PROBING;
    if (evhttp_make_request(a->conn, req, EVHTTP_REQ_GET, u->path[0] ? u->path : "/") != 0) {
        if (a->state == AC_PROBING) /* else its callback already ran, and fin ends it */
            appcheck_end(a, "cannot send the request"); /* req was freed by evhttp */
    }
}

/* A check begins: its timeout covers the lookup, the connection and the answer. */
static void appcheck_start(struct appcheck *a)
{
    const struct cfg_url *u = &a->cfg->app_health_url;

    a->started_ms = clock_now_ms();
    a->status = a->err = a->connected = 0;
    a->resolving = resolve_start(a->base, u->hosts[0].host, u->hosts[0].port, appcheck_resolved, a);
    if (!a->resolving) {
        appcheck_end(a, "cannot resolve: out of memory or threads");
        return;
    }
    a->state = AC_RESOLVING;
    appcheck_arm(a, a->cfg->app_health_timeout_ms);
}

static void appcheck_on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct appcheck *a = arg;
    char fail[160];

    (void)fd;
    (void)what;
    if (a->state == AC_IDLE) {
        appcheck_start(a);
    } else if (a->state == AC_RESOLVING) {
        snprintf(fail, sizeof(fail), "resolving '%.60s' took longer than %lld ms",
                 a->cfg->app_health_url.hosts[0].host, a->cfg->app_health_timeout_ms);
        appcheck_end(a, fail);
    } else if (a->state == AC_PROBING) {
        snprintf(fail, sizeof(fail), "no answer within %lld ms", a->cfg->app_health_timeout_ms);
        appcheck_end(a, fail);
    }
}

struct appcheck *appcheck_new(struct event_base *base, const struct cfg *cfg, appcheck_cb cb,
                              void *arg, char *err, size_t errlen)
{
    const struct cfg_url *u = &cfg->app_health_url;
    struct appcheck *a;

    err[0] = '\0';
    if (u->kind != CFG_URL_HTTP)
        return NULL;
    a = calloc(1, sizeof(*a));
    if (!a || !(a->timer = evtimer_new(base, appcheck_on_timer, a)) ||
        !(a->fin = event_new(base, -1, 0, appcheck_on_fin, a))) {
        snprintf(err, errlen, "out of memory");
        appcheck_free(a);
        return NULL;
    }
    a->base = base;
    a->cfg = cfg;
    a->cb = cb;
    a->arg = arg;
    a->healthy = 1;
    httphdr_host(a->host, sizeof(a->host), u->hosts[0].host, u->hosts[0].port);
    appcheck_arm(a, 0);
    return a;
}

int appcheck_healthy(const struct appcheck *a)
{
    return !a || a->healthy;
}

const char *appcheck_why(const struct appcheck *a)
{
    return a && !a->healthy ? a->why : "";
}

void appcheck_free(struct appcheck *a)
{
    if (!a)
        return;
    resolve_cancel(a->resolving);
    if (a->conn)
        evhttp_connection_free(a->conn);
    if (a->timer)
        event_free(a->timer);
    if (a->fin)
        event_free(a->fin);
    free(a);
}
