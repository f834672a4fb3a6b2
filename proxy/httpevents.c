/* httpevents.c — Server-Sent Events for the HTTP lock API. Each stream is a chunked 200 reply
 * that never ends by itself; every event is one chunk:
 *     id: <n>\nevent: <type>\ndata: <json>\n\n
 * Event ids count up from 1 for the life of the process. Past events are not kept: a client that
 * reconnects asks GET /v1/locks for the state and then follows the stream. */
#include "httpevents.h"

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <inttypes.h>
#include <sys/socket.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"
#include "httpd.h"
#include "json.h"
#include "lock.h"

struct hev_stream {
    struct hev_stream *prev, *next;
    struct http_events *ev;
    struct httpd_req *req; /* NULL once its client is gone */
    size_t lock_len;       /* 0: every lock */
    char lock[LOCK_MAX_NAME + 1];
};

struct http_events {
    struct hev_stream *streams;
    int nstreams;
    uint64_t next_id;
    struct event *keepalive;
};

/* Takes s off the list and frees it; its request is already answered or gone. */
static void hev_forget(struct hev_stream *s)
{
    struct http_events *ev = s->ev;

    if (s->req)
        httpd_req_on_gone(s->req, NULL, NULL);
    if (s->prev)
        s->prev->next = s->next;
    else
        ev->streams = s->next;
    if (s->next)
        s->next->prev = s->prev;
    ev->nstreams--;
    free(s);
}

/* The client closed the stream (the request is no longer ours). */
static void hev_on_gone(void *arg)
{
    struct hev_stream *s = arg;

    s->req = NULL;
    hev_forget(s);
}

/* Ends a stream cleanly: the last chunk, then the connection serves the next request or closes. */
static void hev_end(struct hev_stream *s)
{
    struct httpd_req *req = s->req;

    hev_forget(s);
    httpd_reply_end(req);
}

/* A client that does not read: its connection is closed, and the request with it. */
static void hev_cut(struct hev_stream *s)
{
    struct httpd_req *req = s->req;

    hev_forget(s);
    httpd_reply_abort(req);
}

/* Sends text (n bytes) to s as one chunk. Returns 0, or -1 when s was cut (and freed). */
static int hev_send(struct hev_stream *s, const char *text, size_t n)
{
    struct evbuffer *b;

    if (httpd_req_unsent(s->req) + n > HTTPEVENTS_MAX_PENDING) {
        hev_cut(s);
        return -1;
    }
    b = evbuffer_new();
    if (!b || evbuffer_add(b, text, n) != 0) {
        evbuffer_free(b);
        hev_cut(s);
        return -1;
    }
    httpd_reply_chunk(s->req, b);
    evbuffer_free(b);
    return 0;
}

static void hev_on_keepalive(evutil_socket_t fd, short what, void *arg)
{
    static const char ping[] = ": keepalive\n\n";
    struct http_events *ev = arg;
    struct hev_stream *s, *next;

    (void)fd;
    (void)what;
    for (s = ev->streams; s; s = next) {
        next = s->next;
        (void)hev_send(s, ping, sizeof(ping) - 1);
    }
}

struct http_events *http_events_new(struct event_base *base)
{
    struct http_events *ev = calloc(1, sizeof(*ev));
    struct timeval tv = {HTTPEVENTS_KEEPALIVE_MS / 1000, (HTTPEVENTS_KEEPALIVE_MS % 1000) * 1000};

    if (!ev)
        return NULL;
    ev->keepalive = event_new(base, -1, EV_PERSIST, hev_on_keepalive, ev);
    if (!ev->keepalive) {
        free(ev);
        return NULL;
    }
    event_add(ev->keepalive, &tv);
    return ev;
}

/* Reads ?lock=NAME into s. NAME is percent-decoded as the lock path /v1/locks/{name} is ('+' is
 * a plus sign, not a space) and must be a name that path accepts. Returns NULL, or why the query
 * is refused. */
static const char *hev_query(struct httpd_req *req, struct hev_stream *s)
{
    const char *q = evhttp_uri_get_query(httpd_req_uri(req));
    const char *why = NULL;

    while (q && *q && !why) {
        const char *end = q + strcspn(q, "&");
        size_t n = 0;
        char *v = NULL;
        if (end - q < 5 || memcmp(q, "lock=", 5) != 0)
            why = "unknown query parameter; the only one is lock=NAME";
        else if (s->lock_len)
            why = "lock= is given twice; one stream follows one lock, or every lock without it";
        else if ((v = malloc((size_t)(end - q) - 4)) == NULL)
            why = "out of memory";
        else {
            memcpy(v, q + 5, (size_t)(end - q) - 5);
            v[end - q - 5] = '\0';
            char *d = evhttp_uridecode(v, 0, &n);
            if (!d || n == 0 || n > LOCK_MAX_NAME || memchr(d, '\0', n) || !json_utf8_valid(d, n))
                why = "lock=NAME: the name must be 1..512 bytes of UTF-8, without NUL";
            else
                memcpy(s->lock, d, (s->lock_len = n) + 1);
            free(d);
        }
        free(v);
        q = *end ? end + 1 : end;
    }
    return why;
}

void http_events_serve(struct http_events *ev, struct httpd_req *req)
{
    static const char hello[] = "retry: 1000\n: fencegate lock events\n\n";
    struct evkeyvalq *h = httpd_req_output_headers(req);
    struct hev_stream *s;
    const char *why;
    evutil_socket_t fd;
    int sndbuf = HTTPEVENTS_SNDBUF;

    if (ev->nstreams >= HTTPEVENTS_MAX_STREAMS) {
        http_reply_error(req, 503, "unavailable",
                         "too many event streams are open (64); close one first");
        return;
    }
    s = calloc(1, sizeof(*s));
    if (!s) {
        http_reply_error(req, 503, "unavailable", "out of memory");
        return;
    }
    if ((why = hev_query(req, s)) != NULL) {
        free(s);
        http_reply_error(req, 400, "bad_request", why);
        return;
    }
    s->ev = ev;
    s->req = req;
    s->next = ev->streams;
    if (ev->streams)
        ev->streams->prev = s;
    ev->streams = s;
    ev->nstreams++;
    evhttp_add_header(h, "Content-Type", "text/event-stream");
    evhttp_add_header(h, "Cache-Control", "no-cache");
    httpd_reply_start(req, 200, "OK");
    httpd_req_on_gone(req, hev_on_gone, s);
    if ((fd = httpd_req_fd(req)) >= 0) /* the kernel's share of a stalled stream stays small too */
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
    (void)hev_send(s, hello, sizeof(hello) - 1);
}

int http_events_open(const struct http_events *ev)
{
    return ev ? ev->nstreams : 0;
}

void http_events_emit(struct http_events *ev, const char *type, const char *lock, size_t len,
                      const char *data)
{
    struct hev_stream *s, *next;
    char *text = NULL;
    int n = 0;

    if (!ev || !ev->streams)
        return;
    for (s = ev->streams; s; s = next) {
        next = s->next;
        if (lock && s->lock_len && (s->lock_len != len || memcmp(s->lock, lock, len) != 0))
            continue;
        if (!text) {
            n = snprintf(NULL, 0, "id: %" PRIu64 "\nevent: %s\ndata: %s\n\n", ev->next_id + 1, type,
                         data);
            text = n > 0 ? malloc((size_t)n + 1) : NULL;
            if (!text)
                return;
            snprintf(text, (size_t)n + 1, "id: %" PRIu64 "\nevent: %s\ndata: %s\n\n", ++ev->next_id,
                     type, data);
        }
        (void)hev_send(s, text, (size_t)n);
    }
    free(text);
}

void http_events_end(struct http_events *ev, const char *type, const char *data)
{
    if (!ev)
        return;
    http_events_emit(ev, type, NULL, 0, data);
    while (ev->streams)
        hev_end(ev->streams);
}

void http_events_free(struct http_events *ev)
{
    if (!ev)
        return;
    while (ev->streams)
        hev_cut(ev->streams);
    event_free(ev->keepalive);
    free(ev);
}
