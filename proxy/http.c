/* http.c — the HTTP endpoint: health, readiness and Prometheus metrics (the lock API comes later). */
#include "http.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "metrics.h"
#include "net.h"
#include "upstream.h"

#define HTTP_MAX_HEADERS 16384
#define HTTP_MAX_BODY    (1024 * 1024)
#define HTTP_TIMEOUT_S   30

struct http_api {
    struct evhttp *http;
    struct upstream *up;
};

/* Sends a JSON body with the given status. body must be a complete JSON document. */
static void http_json(struct evhttp_request *req, int code, const char *reason, const char *body)
{
    struct evbuffer *b = evbuffer_new();

    if (!b) {
        evhttp_send_error(req, 500, "out of memory");
        return;
    }
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    evbuffer_add(b, body, strlen(body));
    evbuffer_add(b, "\n", 1);
    evhttp_send_reply(req, code, reason, b);
    evbuffer_free(b);
}

/* Writes s into out as a JSON string body (quotes and control bytes escaped). */
static void json_escape(char *out, size_t cap, const char *s)
{
    size_t o = 0;

    for (; *s && o + 7 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            out[o++] = '\\';
            out[o++] = (char)ch;
        } else if (ch < 0x20) {
            o += (size_t)snprintf(out + o, cap - o, "\\u%04x", ch);
        } else {
            out[o++] = (char)ch;
        }
    }
    out[o] = '\0';
}

static void http_readyz(struct http_api *h, struct evhttp_request *req)
{
    char body[1024], why[512];

    if (upstream_is_up(h->up)) {
        snprintf(body, sizeof(body), "{\"status\":\"ready\",\"upstream\":\"%s\"}",
                 upstream_name(h->up));
        http_json(req, 200, "OK", body);
        return;
    }
    json_escape(why, sizeof(why), upstream_error(h->up));
    snprintf(body, sizeof(body),
             "{\"error\":\"unavailable\",\"message\":\"upstream %s is unreachable: %s\"}",
             upstream_name(h->up), why);
    http_json(req, 503, "Service Unavailable", body);
}

static void http_metrics(struct evhttp_request *req)
{
    size_t cap = 16384, need;
    char *text = NULL;
    struct evbuffer *b;

    for (;;) {
        char *p = realloc(text, cap);
        if (!p) {
            free(text);
            evhttp_send_error(req, 500, "out of memory");
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
        evhttp_send_error(req, 500, "out of memory");
        return;
    }
    evbuffer_add(b, text, need);
    free(text);
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
                      "text/plain; version=0.0.4");
    evhttp_send_reply(req, 200, "OK", b);
    evbuffer_free(b);
}

static void http_dispatch(struct evhttp_request *req, void *arg)
{
    struct http_api *h = arg;
    const char *path = evhttp_uri_get_path(evhttp_request_get_evhttp_uri(req));
    enum evhttp_cmd_type m = evhttp_request_get_command(req);

    metrics_inc(&fg_metrics, M_HTTP_REQUESTS, 1);
    if (!path)
        path = "/";
    if (strcmp(path, "/healthz") && strcmp(path, "/readyz") && strcmp(path, "/metrics")) {
        http_json(req, 404, "Not Found",
                  "{\"error\":\"not_found\",\"message\":\"no such endpoint; see /healthz, "
                  "/readyz, /metrics\"}");
        return;
    }
    if (m != EVHTTP_REQ_GET && m != EVHTTP_REQ_HEAD) {
        evhttp_add_header(evhttp_request_get_output_headers(req), "Allow", "GET, HEAD");
        http_json(req, 405, "Method Not Allowed",
                  "{\"error\":\"method_not_allowed\",\"message\":\"use GET\"}");
        return;
    }
    if (!strcmp(path, "/healthz"))
        http_json(req, 200, "OK", "{\"status\":\"ok\"}");
    else if (!strcmp(path, "/readyz"))
        http_readyz(h, req);
    else
        http_metrics(req);
}

struct http_api *http_new(struct event_base *base, const struct cfg *cfg, struct upstream *up,
                          char *err, size_t errlen)
{
    struct http_api *h = calloc(1, sizeof(*h));
    int fd;

    if (!h || !(h->http = evhttp_new(base))) {
        snprintf(err, errlen, "out of memory");
        free(h);
        return NULL;
    }
    h->up = up;
    fd = net_listen(cfg->listen_http.host, cfg->listen_http.port, 128, err, errlen);
    if (fd < 0 || !evhttp_accept_socket_with_handle(h->http, fd)) {
        if (fd >= 0) {
            snprintf(err, errlen, "cannot serve HTTP on %s:%d", cfg->listen_http.host,
                     cfg->listen_http.port);
            close(fd);
        }
        http_free(h);
        return NULL;
    }
    evhttp_set_max_headers_size(h->http, HTTP_MAX_HEADERS);
    evhttp_set_max_body_size(h->http, HTTP_MAX_BODY);
    evhttp_set_timeout(h->http, HTTP_TIMEOUT_S);
    evhttp_set_allowed_methods(h->http, EVHTTP_REQ_GET | EVHTTP_REQ_HEAD | EVHTTP_REQ_POST |
                                            EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
                                            EVHTTP_REQ_PATCH);
    evhttp_set_gencb(h->http, http_dispatch, h);
    return h;
}

void http_free(struct http_api *h)
{
    if (!h)
        return;
    if (h->http)
        evhttp_free(h->http);
    free(h);
}
