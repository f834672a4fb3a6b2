/* httpup.c — one HTTP/1.1 client connection to an HTTP store, on a bufferevent.
 *
 * The request goes out as the caller gives it (head, then body pieces); the response is read as
 * it arrives, even while the request's body is still going out (a store may answer early). A
 * response head is parsed by httpmsg_parse_response(); interim 1xx answers are skipped; the body
 * is de-chunked, counted against its Content-Length, or read until the store closes.
 *
 * Callbacks may free the connection (httpup_free()): a free from inside one is finished when the
 * callback returns (depth counts the callbacks running). */
#include "httpup.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <sys/socket.h>

#include "bevread.h"
#include "httpmsg.h"

enum httpup_state {
    HU_IDLE,    /* no request */
    HU_HEAD,    /* a request is out; waiting for the response's head */
    HU_BODY,    /* reading the response's body */
    HU_STOPPED, /* the caller stopped the response, or it failed: not reusable */
};

struct httpup {
    struct bufferevent *bev;
    struct event *resume; /* reading on after a pause, from the loop */
    const struct httpup_handler *h;
    void *arg;
    enum httpup_state state;
    int connected;
    int closed;       /* the store closed the connection, or it broke */
    int close_error;  /* closed by an error (errno, or -1), not a clean end of stream */
    int head_request; /* the current request is HEAD */
    int req_chunked;  /* the request's body is chunked */
    int req_done;     /* the request's body is complete */
    int paused;
    int keep_alive;            /* the response allows another request on this connection */
    enum httpmsg_body framing; /* the response body's */
    uint64_t left;             /* HTTPMSG_BODY_LENGTH: bytes still to come */
    struct httpmsg_chunked chunked;
    struct evbuffer *piece; /* de-chunked body handed to the caller */
    int depth;              /* callbacks running */
    int freeing;            /* freed from inside a callback */
};

static void up_destroy(struct httpup *up)
{
    bufferevent_free(up->bev);
    event_free(up->resume);
    evbuffer_free(up->piece);
    free(up);
}

/* Returns 1 when up was freed while the callback ran (the caller must not touch it). */
static int up_cb_end(struct httpup *up)
{
    if (--up->depth == 0 && up->freeing) {
        up_destroy(up);
        return 1;
    }
    return 0;
}

/* Ends the current request: done(end, why), after which up may be gone. */
static void up_finish(struct httpup *up, enum httpup_end end, const char *why)
{
    const struct httpup_handler *h = up->h;

    if (end != HTTPUP_OK || !up->keep_alive || !up->req_done || up->framing == HTTPMSG_BODY_CLOSE ||
        evbuffer_get_length(bufferevent_get_input(up->bev)) > 0) {
        /* Bytes past the response's end (a HEAD answered with a body, more than Content-Length)
         * would be taken for the next request's response: the connection is done for. */
        up->state = HU_STOPPED;
    } else {
        /* Idle, it reads again whatever its last reader did (paused on the last piece): to notice
         * the store closing it, and so that the next request's response is read. */
        up->state = HU_IDLE;
        up->paused = 0;
        if (!up->closed && !up->freeing)
            bufferevent_enable(up->bev, EV_READ);
    }
    up->h = NULL;
    if (!h)
        return;
    up->depth++;
    h->done(up->arg, end, why);
    (void)up_cb_end(up);
}

/* Hands what `piece` holds to the caller. Returns 1 when up was freed meanwhile. */
static int up_deliver(struct httpup *up)
{
    if (evbuffer_get_length(up->piece) == 0 || !up->h)
        return 0;
    up->depth++;
    up->h->body(up->arg, up->piece);
    return up_cb_end(up);
}

/* Reads a response head from the input. Returns 1 when one was taken (state HU_BODY, or the
 * request finished), 0 when more is needed, -1 when up is done for (or freed). */
static int up_read_head(struct httpup *up)
{
    struct evbuffer *in = bufferevent_get_input(up->bev);
    size_t len = evbuffer_get_length(in), want = len < HTTPUP_MAX_HEAD ? len : HTTPUP_MAX_HEAD;
    struct httpmsg_response m;
    struct evkeyvalq headers;
    char err[300], *copy, reason[128];
    const char *p;
    long n;
    int rc;

    if (len == 0)
        return 0;
    p = (const char *)evbuffer_pullup(in, (ev_ssize_t)want);
    n = httpmsg_parse_response(p, want, HTTPUP_MAX_HEAD, up->head_request, &m, err, sizeof(err));
    if (n == 0)
        return 0;
    if (n < 0) {
        up_finish(up, HTTPUP_MALFORMED, err);
        return -1;
    }
    if (m.status < 200) {
        evbuffer_drain(in, (size_t)n);
        if (m.status == 101) {
            up_finish(up, HTTPUP_MALFORMED, "101 Switching Protocols, which is not relayed");
            return -1;
        }
        return 1; /* interim (100 Continue, 103 Early Hints): the final answer follows */
    }
    TAILQ_INIT(&headers);
    if (!(copy = malloc((size_t)n + 1))) {
        up_finish(up, HTTPUP_MALFORMED, "out of memory");
        return -1;
    }
    memcpy(copy, p, (size_t)n);
    for (size_t i = 0; i < m.nheaders; i++) {
        char *k = copy + (m.headers[i].name.p - p), *v = copy + (m.headers[i].value.p - p);
        k[m.headers[i].name.n] = '\0';
        v[m.headers[i].value.n] = '\0';
        evhttp_add_header(&headers, k, v);
    }
    snprintf(reason, sizeof(reason), "%.*s", (int)m.reason.n, m.reason.p);
    free(copy);
    evbuffer_drain(in, (size_t)n);
    if (m.body == HTTPMSG_BODY_CLOSE && evhttp_find_header(&headers, "Transfer-Encoding")) {
        /* A coding other than chunked: its bytes are not the body, and nothing here decodes
         * them. */
        snprintf(err, sizeof(err), "Transfer-Encoding '%.60s', which cannot be decoded",
                 evhttp_find_header(&headers, "Transfer-Encoding"));
        evhttp_clear_headers(&headers);
        up_finish(up, HTTPUP_MALFORMED, err);
        return -1;
    }
    up->keep_alive = m.keep_alive;
    up->framing = m.body;
    up->left = m.length;
    httpmsg_chunked_init(&up->chunked);
    up->state = HU_BODY;
    up->depth++;
    rc = up->h->head(up->arg, m.status, reason, &headers,
                     m.body == HTTPMSG_BODY_LENGTH ? (int64_t)m.length
                     : m.body == HTTPMSG_BODY_NONE ? 0
                                                   : -1);
    evhttp_clear_headers(&headers);
    if (up_cb_end(up))
        return -1;
    if (rc < 0) {
        up->state = HU_STOPPED;
        up->h = NULL;
        return -1;
    }
    if (m.body == HTTPMSG_BODY_NONE) {
        up_finish(up, HTTPUP_OK, NULL);
        return -1;
    }
    return 1;
}

/* Reads the response's body from the input. Returns 0 to wait for more, -1 when up is done for
 * (or freed). */
static int up_read_body(struct httpup *up)
{
    struct evbuffer *in = bufferevent_get_input(up->bev);

    while (!up->paused && evbuffer_get_length(in) > 0) {
        if (up->framing == HTTPMSG_BODY_CHUNKED) {
            struct evbuffer_iovec v;
            size_t off = 0, dlen = 0;
            int done = 0;
            char err[200];
            long n;
            if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
                break;
            n = httpmsg_chunked_feed(&up->chunked, v.iov_base, v.iov_len, &off, &dlen, &done, err,
                                     sizeof(err));
            if (n < 0) {
                up_finish(up, HTTPUP_MALFORMED, err);
                return -1;
            }
            evbuffer_add(up->piece, (const char *)v.iov_base + off, dlen);
            evbuffer_drain(in, (size_t)n);
            if (up_deliver(up))
                return -1;
            if (done) {
                up_finish(up, HTTPUP_OK, NULL);
                return -1;
            }
        } else {
            size_t len = evbuffer_get_length(in);
            size_t take =
                up->framing == HTTPMSG_BODY_LENGTH && up->left < len ? (size_t)up->left : len;
            evbuffer_remove_buffer(in, up->piece, take);
            if (up->framing == HTTPMSG_BODY_LENGTH)
                up->left -= take;
            if (up_deliver(up))
                return -1;
            if (up->framing == HTTPMSG_BODY_LENGTH && up->left == 0) {
                up_finish(up, HTTPUP_OK, NULL);
                return -1;
            }
        }
        if (up->state != HU_BODY)
            return -1; /* the caller stopped it */
    }
    return 0;
}

/* The connection closed and what was read before the end is used up: the response ends here,
 * whole only when its body runs to the close. */
static void up_at_close(struct httpup *up)
{
    char why[200];

    if (up->state == HU_BODY && up->framing == HTTPMSG_BODY_CLOSE && !up->close_error) {
        up_finish(up, HTTPUP_OK, NULL);
        return;
    }
    snprintf(why, sizeof(why), "%s%s%s",
             up->state == HU_HEAD ? "closed the connection before answering"
                                  : "closed the connection in the middle of the response",
             up->close_error > 0 ? ": " : "",
             up->close_error > 0 ? evutil_socket_error_to_string(up->close_error) : "");
    up_finish(up, HTTPUP_CLOSED, why);
}

static void up_read(struct httpup *up)
{
    for (;;) {
        if (up->paused || up->freeing)
            return;
        if (up->state == HU_HEAD) {
            int rc = up_read_head(up);
            if (rc < 0)
                return;
            if (rc == 0) {
                if (up->closed && up->h)
                    up_at_close(up);
                return;
            }
        } else if (up->state == HU_BODY) {
            if (up_read_body(up) == 0 && up->closed && up->h && !up->paused &&
                evbuffer_get_length(bufferevent_get_input(up->bev)) == 0)
                up_at_close(up);
            return;
        } else {
            /* Bytes nobody asked for: the connection cannot be trusted for another request. */
            struct evbuffer *in = bufferevent_get_input(up->bev);
            if (evbuffer_get_length(in) > 0) {
                evbuffer_drain(in, evbuffer_get_length(in));
                up->state = HU_STOPPED;
                bufferevent_disable(up->bev, EV_READ);
            }
            return;
        }
    }
}

static void up_on_read(struct bufferevent *bev, void *arg)
{
    bevread_ready(bev);
    up_read(arg);
}

static void up_on_resume(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    up_read(arg);
}

static void up_on_write(struct bufferevent *bev, void *arg)
{
    struct httpup *up = arg;

    (void)bev;
    if (up->h && up->h->drained) {
        up->depth++;
        up->h->drained(up->arg);
        (void)up_cb_end(up);
    }
}

static void up_on_event(struct bufferevent *bev, short what, void *arg)
{
    struct httpup *up = arg;
    char why[200];
    int e = EVUTIL_SOCKET_ERROR();

    (void)bev;
    if (what & BEV_EVENT_CONNECTED) {
        int one = 1;
        up->connected = 1;
        (void)setsockopt(bufferevent_getfd(up->bev), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return;
    }
    up->closed = 1;
    up->close_error = (what & BEV_EVENT_ERROR) ? (e ? e : -1) : 0;
    bufferevent_disable(up->bev, EV_READ | EV_WRITE);
    if (!up->h)
        return; /* idle, or stopped: not reusable any more */
    if (!up->connected) {
        snprintf(why, sizeof(why), "cannot connect: %s",
                 e ? evutil_socket_error_to_string(e) : "connection closed");
        up_finish(up, HTTPUP_CONNECT, why);
        return;
    }
    up->depth++;
    up_read(up); /* what came before the end, then the end (unless paused: then on resume) */
    (void)up_cb_end(up);
}

struct httpup *httpup_connect(struct event_base *base, const struct sockaddr *sa, socklen_t salen)
{
    struct httpup *up = calloc(1, sizeof(*up));

    if (!up)
        return NULL;
    up->bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    up->resume = event_new(base, -1, 0, up_on_resume, up);
    up->piece = evbuffer_new();
    if (!up->bev || !up->resume || !up->piece) {
        if (up->bev)
            bufferevent_free(up->bev);
        if (up->resume)
            event_free(up->resume);
        if (up->piece)
            evbuffer_free(up->piece);
        free(up);
        errno = ENOMEM;
        return NULL;
    }
    bufferevent_setcb(up->bev, up_on_read, up_on_write, up_on_event, up);
    bevread_setup(up->bev, HTTPUP_MAX_HEAD + 256 * 1024);
    if (bufferevent_socket_connect(up->bev, sa, (int)salen) != 0) {
        int e = errno;
        up_destroy(up);
        errno = e;
        return NULL;
    }
    bufferevent_enable(up->bev, EV_READ | EV_WRITE);
    return up;
}

void httpup_free(struct httpup *up)
{
    if (!up)
        return;
    if (up->depth > 0) {
        up->freeing = 1;
        up->h = NULL;
        bufferevent_disable(up->bev, EV_READ | EV_WRITE);
        return;
    }
    up_destroy(up);
}

int httpup_connected(const struct httpup *up)
{
    return up->connected;
}

/* 1 when the socket has nothing queued to read and is not closed. The loop may not have read
 * yet what arrived since the last response (stray bytes, the store's close): peeked at, not
 * read, so that the bufferevent still sees it. */
static int up_socket_quiet(const struct httpup *up)
{
    int e = errno;
    char c;
    ssize_t n = recv(bufferevent_getfd(up->bev), &c, 1, MSG_PEEK | MSG_DONTWAIT);
    int quiet = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);

    errno = e;
    return quiet;
}

int httpup_reusable(const struct httpup *up)
{
    return up->state == HU_IDLE && up->connected && !up->closed && !up->freeing &&
           evbuffer_get_length(bufferevent_get_input(up->bev)) == 0 && up_socket_quiet(up);
}

int httpup_sent(const struct httpup *up)
{
    return up->connected;
}

int httpup_request(struct httpup *up, const char *method, const char *target,
                   const struct evkeyvalq *headers, int64_t body_length, int head_request,
                   const struct httpup_handler *h, void *arg)
{
    struct evbuffer *out = bufferevent_get_output(up->bev);

    if (up->state != HU_IDLE || up->closed || up->freeing)
        return -1;
    up->h = h;
    up->arg = arg;
    up->state = HU_HEAD;
    up->head_request = head_request;
    up->req_chunked = body_length < 0;
    up->req_done = body_length == 0;
    up->keep_alive = 0;
    up->paused = 0; /* a new response: read it whatever the last reader did */
    up->framing = HTTPMSG_BODY_NONE;
    evbuffer_add_printf(out, "%s %s HTTP/1.1\r\n", method, target);
    for (const struct evkeyval *kv = headers->tqh_first; kv; kv = kv->next.tqe_next)
        evbuffer_add_printf(out, "%s: %s\r\n", kv->key, kv->value);
    if (body_length > 0)
        evbuffer_add_printf(out, "Content-Length: %" PRId64 "\r\n", body_length);
    else if (body_length < 0)
        evbuffer_add(out, "Transfer-Encoding: chunked\r\n", 28);
    evbuffer_add(out, "\r\n", 2);
    bufferevent_enable(up->bev, EV_READ | EV_WRITE);
    return 0;
}

void httpup_send_body(struct httpup *up, struct evbuffer *buf)
{
    struct evbuffer *out = bufferevent_get_output(up->bev);
    size_t n = evbuffer_get_length(buf);

    if (n == 0 || up->req_done || up->closed) {
        evbuffer_drain(buf, n);
        return;
    }
    if (up->req_chunked)
        evbuffer_add_printf(out, "%zx\r\n", n);
    evbuffer_add_buffer(out, buf);
    if (up->req_chunked)
        evbuffer_add(out, "\r\n", 2);
}

void httpup_end_body(struct httpup *up)
{
    if (!up->req_done && up->req_chunked && !up->closed)
        evbuffer_add(bufferevent_get_output(up->bev), "0\r\n\r\n", 5);
    up->req_done = 1;
}

size_t httpup_unsent(const struct httpup *up)
{
    return evbuffer_get_length(bufferevent_get_output(up->bev));
}

void httpup_pause(struct httpup *up, int pause)
{
    if (up->paused == pause)
        return;
    up->paused = pause;
    if (pause) {
        bufferevent_disable(up->bev, EV_READ);
    } else {
        if (!up->closed)
            bufferevent_enable(up->bev, EV_READ);
        event_active(up->resume, EV_READ, 1); /* what was read before the pause (or the end) */
    }
}
