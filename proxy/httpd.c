/* httpd.c — the HTTP/1.1 server of the HTTP endpoint, on bufferevents.
 *
 * A connection reads one request at a time: its head (httpmsg_parse_request()), then its body
 * into a buffer (Content-Length or chunked, at most HTTPD_MAX_BODY), then hands it to the
 * handler and reads nothing more of it until the reply is done, except to notice the client
 * leaving (end of stream or an error), which is why reading stays on while a request is answered
 * (up to HTTPD_MAX_PIPELINED bytes of whatever comes next; past that reading stops, and so does
 * the noticing). The next request is taken from the loop, never from inside a reply call, so a
 * handler that answers at once does not see the next request start under it; and only once the
 * answers before it are written but for HTTPD_MAX_UNSENT bytes, so a client that pipelines
 * requests without reading the answers holds that much memory, not one answer per request.
 *
 * Every request the server refuses before a handler sees it (malformed, too large, a method or
 * version it does not serve) is answered with a JSON error naming what was wrong, and its
 * connection is closed: the bytes after a refused head cannot be trusted to start a request.
 *
 * A connection closed while its client may still be sending (a refusal, or a reply sent before
 * the request's body was read) lingers: its sending side is shut once the reply is written, and
 * what still arrives is read and dropped for up to HTTPD_LINGER_MS. Closed at once, the unread
 * bytes would make the kernel reset the connection, and a client busy sending its body would get
 * the reset instead of the answer. */
#include "httpd.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/listener.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/queue.h>
#include <sys/socket.h>
#include <time.h>

#include "bevread.h"
#include "clock.h"
#include "httpmsg.h"
#include "json.h"
#include "log.h"
#include "metrics.h"

enum httpd_state {
    HC_HEAD,    /* reading a request's head (or idle between requests) */
    HC_BODY,    /* reading its body */
    HC_HANDLER, /* the handler has the request */
    HC_CLOSING, /* the last reply is being written; then the connection closes */
    HC_LINGER,  /* written and shut for sending: dropping what the client still sends */
};

struct httpd_conn {
    struct httpd *srv;
    struct httpd_conn *prev, *next;
    struct bufferevent *bev;
    struct event *resume; /* takes the next request from the loop */
    struct httpd_req *req;
    enum httpd_state state;
    struct httpmsg_chunked chunked;
    int is_chunked;
    uint64_t left;     /* Content-Length body bytes still to read */
    int body_done;     /* the current request's body is read whole */
    int streaming;     /* its handler takes its body as it arrives */
    int linger;        /* close by lingering: the client may still be sending */
    int unsent;        /* the next request waits until the answers queued are written */
    long long head_ms; /* when the request head being read began to arrive (0: not begun) */
};

struct httpd_req {
    struct httpd_conn *conn; /* NULL once its client is gone */
    enum evhttp_cmd_type method;
    struct evhttp_uri *uri;
    struct evkeyvalq in, out;
    struct evbuffer *body;
    int minor;      /* HTTP/1.<minor> */
    int keep_alive; /* the connection may serve another request after this one */
    int started;    /* the reply's head is written */
    int framing;    /* a started reply: HR_LENGTH, HR_CHUNKED or HR_CLOSE */
    int no_body;    /* a started reply carries no body (HEAD, 204, 304) */
    httpd_gone_cb gone;
    void *gone_arg;
    httpd_drained_cb drained;
    void *drained_arg;
    int expect_continue;   /* the client waits for "100 Continue" before it sends the body */
    int64_t body_length;   /* -1: chunked */
    httpd_body_cb body_cb; /* a streamed body: its reader */
    void *body_arg;
    int body_paused;
    /* A started reply: the bytes waiting for the client before its head, and the bytes it has
     * put in the output since (head and body); see httpd_reply_retract(). */
    size_t reply_from, reply_bytes;
};

enum { HR_LENGTH, HR_CHUNKED, HR_CLOSE };

#define HTTPD_ACCEPT_PAUSE_MS 100
#define HTTPD_LINGER_MS       5000 /* at most, reading and dropping before closing */
#define HTTPD_LINGER_IDLE_MS  1000 /* ... or once the client sends nothing for this long */

struct httpd {
    struct event_base *base;
    struct evconnlistener *lev;
    struct event *unpause; /* accepting again after running out of descriptors */
    int short_logged;      /* the shortage is logged; cleared by the next accept */
    httpd_handler handler;
    httpd_stream_cb stream;
    void *arg;
    struct httpd_conn *conns;
    int nconns;
    struct event *drained_ev; /* runs drained() from the loop once no connection is left */
    void (*drained)(void *);  /* set by httpd_drain() */
    void *drained_arg;
};

static const struct {
    const char *name;
    enum evhttp_cmd_type method;
} httpd_methods[] = {
    {"GET", EVHTTP_REQ_GET}, {"HEAD", EVHTTP_REQ_HEAD},     {"POST", EVHTTP_REQ_POST},
    {"PUT", EVHTTP_REQ_PUT}, {"DELETE", EVHTTP_REQ_DELETE}, {"PATCH", EVHTTP_REQ_PATCH},
};

static const char *httpd_reason(int code)
{
    switch (code) {
    case 100:
        return "Continue";
    case 200:
        return "OK";
    case 201:
        return "Created";
    case 202:
        return "Accepted";
    case 204:
        return "No Content";
    case 206:
        return "Partial Content";
    case 301:
        return "Moved Permanently";
    case 302:
        return "Found";
    case 304:
        return "Not Modified";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 409:
        return "Conflict";
    case 411:
        return "Length Required";
    case 412:
        return "Precondition Failed";
    case 413:
        return "Content Too Large";
    case 414:
        return "URI Too Long";
    case 422:
        return "Unprocessable Content";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    case 505:
        return "HTTP Version Not Supported";
    default:
        return code < 300   ? "OK"
               : code < 400 ? "Redirect"
               : code < 500 ? "Client Error"
                            : "Server Error";
    }
}

static const char *httpd_method_name(enum evhttp_cmd_type m)
{
    for (size_t i = 0; i < sizeof(httpd_methods) / sizeof(httpd_methods[0]); i++)
        if (httpd_methods[i].method == m)
            return httpd_methods[i].name;
    return "?";
}

static void httpd_set_read_timeout(struct httpd_conn *c, int on)
{
    struct timeval tv = {HTTPD_TIMEOUT_MS / 1000, (HTTPD_TIMEOUT_MS % 1000) * 1000};

    bufferevent_set_timeouts(c->bev, on ? &tv : NULL, &tv);
}

/* ---- requests ---- */

static void httpd_req_free(struct httpd_req *r)
{
    if (!r)
        return;
    if (r->uri)
        evhttp_uri_free(r->uri);
    evhttp_clear_headers(&r->in);
    evhttp_clear_headers(&r->out);
    if (r->body)
        evbuffer_free(r->body);
    free(r);
}

static struct httpd_req *httpd_req_new(void)
{
    struct httpd_req *r = calloc(1, sizeof(*r));

    if (!r)
        return NULL;
    TAILQ_INIT(&r->in);
    TAILQ_INIT(&r->out);
    if (!(r->body = evbuffer_new())) {
        free(r);
        return NULL;
    }
    return r;
}

enum evhttp_cmd_type httpd_req_method(const struct httpd_req *r)
{
    return r->method;
}

const char *httpd_req_method_name(const struct httpd_req *r)
{
    return httpd_method_name(r->method);
}

const struct evhttp_uri *httpd_req_uri(const struct httpd_req *r)
{
    return r->uri;
}

struct evkeyvalq *httpd_req_input_headers(struct httpd_req *r)
{
    return &r->in;
}

const char *httpd_req_header(struct httpd_req *r, const char *name, int *count)
{
    const char *first = NULL;

    *count = 0;
    for (struct evkeyval *kv = r->in.tqh_first; kv; kv = kv->next.tqe_next)
        if (strcasecmp(kv->key, name) == 0 && (*count)++ == 0)
            first = kv->value;
    return first;
}

struct evkeyvalq *httpd_req_output_headers(struct httpd_req *r)
{
    return &r->out;
}

struct evbuffer *httpd_req_body(struct httpd_req *r)
{
    return r->body;
}

void httpd_req_on_gone(struct httpd_req *r, httpd_gone_cb gone, void *arg)
{
    r->gone = gone;
    r->gone_arg = arg;
}

void httpd_req_on_drained(struct httpd_req *r, httpd_drained_cb drained, void *arg)
{
    r->drained = drained;
    r->drained_arg = arg;
}

size_t httpd_req_unsent(const struct httpd_req *r)
{
    return r->conn ? evbuffer_get_length(bufferevent_get_output(r->conn->bev)) : 0;
}

evutil_socket_t httpd_req_fd(const struct httpd_req *r)
{
    return r->conn ? bufferevent_getfd(r->conn->bev) : -1;
}

int64_t httpd_req_body_length(const struct httpd_req *r)
{
    return r->body_length;
}

/* Tells a client that waits for it (Expect: 100-continue) to send the body. */
static void httpd_continue(struct httpd_req *r)
{
    if (r->expect_continue && r->conn && !r->started)
        evbuffer_add(bufferevent_get_output(r->conn->bev), "HTTP/1.1 100 Continue\r\n\r\n", 25);
    r->expect_continue = 0;
}

void httpd_req_body_start(struct httpd_req *r, httpd_body_cb cb, void *arg)
{
    struct httpd_conn *c = r->conn;

    r->body_cb = cb;
    r->body_arg = arg;
    if (!c || !c->streaming || c->body_done)
        return;
    httpd_continue(r);
    httpd_set_read_timeout(c, !r->body_paused);
    event_active(c->resume, EV_READ, 1); /* what already arrived, from the loop */
}

void httpd_req_body_pause(struct httpd_req *r, int pause)
{
    struct httpd_conn *c = r->conn;

    r->body_paused = pause;
    if (!c || !c->streaming || c->body_done)
        return;
    if (pause) {
        bufferevent_disable(c->bev, EV_READ);
    } else {
        httpd_set_read_timeout(c, 1);
        bufferevent_enable(c->bev, EV_READ);
        event_active(c->resume, EV_READ, 1);
    }
}

/* ---- connections ---- */

/* Takes c's request from it. The handler that owns it hears that its client is gone, or finds out
 * when it answers. */
static void httpd_req_detach(struct httpd_conn *c)
{
    struct httpd_req *r = c->req;

    c->req = NULL;
    if (r && c->state == HC_HANDLER) {
        httpd_gone_cb gone = r->gone;
        r->conn = NULL;
        r->gone = NULL;
        r->drained = NULL;
        if (gone) {
            gone(r->gone_arg);
            httpd_req_free(r);
        }
    } else {
        httpd_req_free(r);
    }
}

static void httpd_conn_free(struct httpd_conn *c)
{
    struct httpd *srv = c->srv;

    httpd_req_detach(c);
    srv->nconns--;
    fg_metrics.gauge[G_HTTP_CONNECTIONS_OPEN] = srv->nconns;
    if (c->prev)
        c->prev->next = c->next;
    else
        srv->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    bufferevent_free(c->bev);
    event_free(c->resume);
    free(c);
    if (srv->drained && !srv->conns)
        event_active(srv->drained_ev, 0, 1);
}

/* Appends "Date: ..." for now to b. */
static void httpd_add_date(struct evbuffer *b)
{
    char date[64];
    time_t t = time(NULL);
    struct tm tm;

    if (gmtime_r(&t, &tm) && strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT", &tm) > 0)
        evbuffer_add_printf(b, "Date: %s\r\n", date);
}

/* Writes the status line and header fields of r's reply. length >= 0: a Content-Length to send;
 * -1: the framing is the caller's. */
static void httpd_write_head(struct httpd_req *r, int code, const char *reason, long long length,
                             const char *framing)
{
    struct evbuffer *out = bufferevent_get_output(r->conn->bev);

    if (!r->conn->body_done) {
        r->keep_alive = 0; /* answered before its body was read: the rest cannot be skipped */
        r->conn->linger = 1;
    }
    evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\n", code, reason ? reason : httpd_reason(code));
    if (!evhttp_find_header(&r->out, "Date"))
        httpd_add_date(out);
    for (struct evkeyval *kv = r->out.tqh_first; kv; kv = kv->next.tqe_next) {
        if (length >= 0 && strcasecmp(kv->key, "Content-Length") == 0)
            continue; /* set here */
        if (strcasecmp(kv->key, "Connection") == 0 || strcasecmp(kv->key, "Transfer-Encoding") == 0)
            continue; /* the server's to decide */
        evbuffer_add_printf(out, "%s: %s\r\n", kv->key, kv->value);
    }
    if (length >= 0)
        evbuffer_add_printf(out, "Content-Length: %lld\r\n", length);
    if (framing)
        evbuffer_add_printf(out, "%s\r\n", framing);
    if (!r->keep_alive)
        evbuffer_add(out, "Connection: close\r\n", 19);
    else if (r->minor == 0)
        evbuffer_add(out, "Connection: keep-alive\r\n", 24);
    evbuffer_add(out, "\r\n", 2);
}

static void httpd_on_resume(evutil_socket_t fd, short what, void *arg);

/* r is answered: the connection takes the next request, or closes once the reply is written. */
static void httpd_req_done(struct httpd_req *r)
{
    struct httpd_conn *c = r->conn;

    if (!c) {
        httpd_req_free(r);
        return;
    }
    c->req = NULL;
    if (!r->keep_alive || c->srv->drained) {
        c->state = HC_CLOSING;
        bufferevent_disable(c->bev, EV_READ);
        if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
            event_active(c->resume, EV_WRITE, 1); /* nothing to wait for: close from the loop */
    } else {
        c->state = HC_HEAD;
        c->streaming = 0;
        if (evbuffer_get_length(bufferevent_get_output(c->bev)) > HTTPD_MAX_UNSENT) {
            c->unsent = 1; /* httpd_on_write() goes on once they are written */
            bufferevent_disable(c->bev, EV_READ);
        } else {
            httpd_set_read_timeout(c, 1);
            bufferevent_enable(c->bev, EV_READ);
            event_active(c->resume, EV_READ, 1);
        }
    }
    httpd_req_free(r);
}

void httpd_reply(struct httpd_req *r, int code, const char *reason, struct evbuffer *body)
{
    size_t n = body ? evbuffer_get_length(body) : 0;
    int bodiless = code == 204 || code == 304 || code < 200;

    if (r->conn && !r->started) {
        httpd_write_head(r, code, reason, bodiless ? -1 : (long long)n, NULL);
        if (n > 0 && !bodiless && r->method != EVHTTP_REQ_HEAD)
            evbuffer_add_buffer(bufferevent_get_output(r->conn->bev), body);
    }
    if (body)
        evbuffer_drain(body, n);
    httpd_req_done(r);
}

void httpd_reply_start(struct httpd_req *r, int code, const char *reason)
{
    const char *cl = evhttp_find_header(&r->out, "Content-Length");
    struct evbuffer *out;

    r->started = 1;
    r->no_body = r->method == EVHTTP_REQ_HEAD || code == 204 || code == 304;
    if (!r->conn)
        return;
    out = bufferevent_get_output(r->conn->bev);
    r->reply_from = evbuffer_get_length(out);
    if (cl || r->no_body) {
        r->framing = HR_LENGTH;
        httpd_write_head(r, code, reason, -1, NULL);
    } else if (r->minor >= 1) {
        r->framing = HR_CHUNKED;
        httpd_write_head(r, code, reason, -1, "Transfer-Encoding: chunked");
    } else {
        r->framing = HR_CLOSE;
        r->keep_alive = 0;
        httpd_write_head(r, code, reason, -1, NULL);
    }
    r->reply_bytes = evbuffer_get_length(out) - r->reply_from;
}

void httpd_reply_chunk(struct httpd_req *r, struct evbuffer *buf)
{
    size_t n = evbuffer_get_length(buf), before;
    struct evbuffer *out;

    if (!r->conn || r->no_body || n == 0) {
        evbuffer_drain(buf, n);
        return;
    }
    out = bufferevent_get_output(r->conn->bev);
    before = evbuffer_get_length(out);
    if (r->framing == HR_CHUNKED)
        evbuffer_add_printf(out, "%zx\r\n", n);
    evbuffer_add_buffer(out, buf);
    if (r->framing == HR_CHUNKED)
        evbuffer_add(out, "\r\n", 2);
    r->reply_bytes += evbuffer_get_length(out) - before;
}

/* Nothing is written to the socket but from the output's front, so while the output still holds
 * every byte queued before the reply and by it, none of the reply has reached the client. */
int httpd_reply_retract(struct httpd_req *r)
{
    struct evbuffer *out, *before;

    if (!r->started)
        return 0;
    if (!r->conn)
        return -1;
    out = bufferevent_get_output(r->conn->bev);
    if (evbuffer_get_length(out) != r->reply_from + r->reply_bytes)
        return -1;
    if (!(before = evbuffer_new()))
        return -1;
    evbuffer_unfreeze(out, 1); /* a socket bufferevent keeps its output's front frozen */
    evbuffer_remove_buffer(out, before, r->reply_from);
    evbuffer_drain(out, evbuffer_get_length(out));
    evbuffer_freeze(out, 1);
    evbuffer_add_buffer(out, before);
    evbuffer_free(before);
    evhttp_clear_headers(&r->out);
    r->started = 0;
    r->no_body = 0;
    r->reply_from = r->reply_bytes = 0;
    return 0;
}

void httpd_reply_end(struct httpd_req *r)
{
    if (r->conn && r->framing == HR_CHUNKED && !r->no_body)
        evbuffer_add(bufferevent_get_output(r->conn->bev), "0\r\n\r\n", 5);
    httpd_req_done(r);
}

void httpd_reply_abort(struct httpd_req *r)
{
    struct httpd_conn *c = r->conn;

    if (c) {
        r->gone = NULL;
        c->req = NULL;
        httpd_conn_free(c);
    }
    httpd_req_free(r);
}

/* Refuses the request being read with a JSON error, then closes the connection. */
static void httpd_refuse(struct httpd_conn *c, int code, const char *error, const char *msg)
{
    struct evbuffer *out = bufferevent_get_output(c->bev);
    char body[800], esc[600];
    int n;
    size_t o;

    json_escape(esc, sizeof(esc), msg);
    n = snprintf(body, sizeof(body), "{\"error\":\"%s\",\"message\":\"%s\"}\n", error, esc);
    o = n < 0 ? 0 : (size_t)n < sizeof(body) ? (size_t)n : sizeof(body) - 1;
    evbuffer_add_printf(out, "HTTP/1.1 %d %s\r\n", code, httpd_reason(code));
    httpd_add_date(out);
    evbuffer_add_printf(out,
                        "Content-Type: application/json\r\nContent-Length: %zu\r\n"
                        "Connection: close\r\n\r\n",
                        o);
    evbuffer_add(out, body, o);
    httpd_req_free(c->req);
    c->req = NULL;
    c->state = HC_CLOSING;
    c->linger = 1;
    bufferevent_disable(c->bev, EV_READ);
}

/* Hands the request whose body is read to the handler. */
static void httpd_dispatch(struct httpd_conn *c)
{
    struct httpd_req *r = c->req;

    c->state = HC_HANDLER;
    httpd_set_read_timeout(c, 0); /* answering may take long: reading is only for noticing EOF */
    c->srv->handler(r, c->srv->arg);
}

/* Builds c->req from a parsed head (n bytes at the start of the input). Returns 0, or -1 after
 * refusing it. */
static int httpd_take_head(struct httpd_conn *c, const struct httpmsg_request *m, const char *head,
                           size_t n)
{
    struct httpd_req *r = httpd_req_new();
    char *copy = malloc(n + 1), *target;
    size_t i;

    if (!r || !copy) {
        free(copy);
        httpd_req_free(r);
        httpd_refuse(c, 503, "unavailable", "out of memory");
        return -1;
    }
    c->req = r;
    r->conn = c;
    r->minor = m->minor;
    r->keep_alive = m->keep_alive;
    memcpy(copy, head, n);
    copy[n] = '\0';
    for (i = 0; i < sizeof(httpd_methods) / sizeof(httpd_methods[0]); i++)
        if (strlen(httpd_methods[i].name) == m->method.n &&
            memcmp(httpd_methods[i].name, m->method.p, m->method.n) == 0)
            break;
    if (i == sizeof(httpd_methods) / sizeof(httpd_methods[0])) {
        char msg[100];
        snprintf(msg, sizeof(msg), "method '%.*s' is not supported", (int)m->method.n, m->method.p);
        free(copy);
        httpd_refuse(c, 501, "not_implemented", msg);
        return -1;
    }
    r->method = httpd_methods[i].method;
    target = copy + (m->target.p - head);
    target[m->target.n] = '\0';
    r->uri = evhttp_uri_parse_with_flags(target, EVHTTP_URI_NONCONFORMANT);
    if (!r->uri || !evhttp_uri_get_path(r->uri)) {
        free(copy);
        httpd_refuse(c, 400, "bad_request", "the request target cannot be parsed");
        return -1;
    }
    for (i = 0; i < m->nheaders; i++) {
        char *k = copy + (m->headers[i].name.p - head), *v = copy + (m->headers[i].value.p - head);
        k[m->headers[i].name.n] = '\0';
        v[m->headers[i].value.n] = '\0';
        if (evhttp_add_header(&r->in, k, v) != 0) {
            free(copy);
            httpd_refuse(c, 400, "bad_request", "a header field cannot be stored");
            return -1;
        }
    }
    free(copy);
    /* RFC 9112 §3.2: an HTTP/1.1 request without a Host field, or with more than one, is 400. */
    if (r->minor >= 1) {
        int hosts;

        (void)httpd_req_header(r, "Host", &hosts);
        if (hosts != 1) {
            httpd_refuse(c, 400, "bad_request",
                         hosts ? "the request has more than one Host header"
                               : "an HTTP/1.1 request must have a Host header");
            return -1;
        }
    }
    return 0;
}

/* Moves what the input holds of the current request's body into its body buffer, at most up to
 * `limit` bytes there (0: none). Returns 1 when the body is complete, 0 when more is to come, -1
 * when it is malformed (why says how) and -2 when it is over limit. */
static int httpd_take_body(struct httpd_conn *c, size_t limit, char *why, size_t whycap)
{
    struct evbuffer *in = bufferevent_get_input(c->bev), *body = c->req->body;

    if (!c->is_chunked) {
        size_t len = evbuffer_get_length(in);
        size_t take = c->left < len ? (size_t)c->left : len;
        if (limit && evbuffer_get_length(body) + take > limit)
            return -2;
        evbuffer_remove_buffer(in, body, take);
        c->left -= take;
        return c->left == 0;
    }
    while (evbuffer_get_length(in) > 0) {
        struct evbuffer_iovec v;
        size_t off = 0, dlen = 0;
        int done = 0;
        long n;

        if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
            break;
        n = httpmsg_chunked_feed(&c->chunked, v.iov_base, v.iov_len, &off, &dlen, &done, why,
                                 whycap);
        if (n < 0)
            return -1;
        if (limit && evbuffer_get_length(body) + dlen > limit)
            return -2;
        if (dlen > 0)
            evbuffer_add(body, (const char *)v.iov_base + off, dlen);
        evbuffer_drain(in, (size_t)n);
        if (done)
            return 1;
    }
    return 0;
}

/* Reads what the input holds of the current request: its head, then (unless its handler takes
 * the body as it comes) its body. Hands it to the handler once complete, or refuses it. */
static void httpd_read_request(struct httpd_conn *c)
{
    struct evbuffer *in = bufferevent_get_input(c->bev);
    char err[300], msg[160];
    int status = 400;

    if (c->state == HC_HEAD) {
        struct httpmsg_request m;
        size_t len = evbuffer_get_length(in), want = len < HTTPD_MAX_HEAD ? len : HTTPD_MAX_HEAD;
        const char *p;
        long n;

        if (len == 0)
            return;
        p = (const char *)evbuffer_pullup(in, (ev_ssize_t)want);
        n = httpmsg_parse_request(p, want, HTTPD_MAX_HEAD, &m, &status, err, sizeof(err));
        if (n == 0) { /* a head arriving a byte now and then holds the connection: not for ever */
            if (!c->head_ms)
                c->head_ms = clock_now_ms();
            else if (clock_now_ms() - c->head_ms > HTTPD_TIMEOUT_MS)
                httpd_refuse(c, 408, "request_timeout",
                             "the request head took longer than 30 s to arrive");
            return;
        }
        c->head_ms = 0;
        if (n < 0) {
            httpd_refuse(c, status,
                         status == 431   ? "headers_too_large"
                         : status == 501 ? "not_implemented"
                         : status == 505 ? "version_not_supported"
                                         : "bad_request",
                         err);
            return;
        }
        if (httpd_take_head(c, &m, p, (size_t)n) < 0)
            return;
        evbuffer_drain(in, (size_t)n);
        c->is_chunked = m.body == HTTPMSG_BODY_CHUNKED;
        c->left = m.body == HTTPMSG_BODY_LENGTH ? m.length : 0;
        c->body_done = m.body == HTTPMSG_BODY_NONE;
        httpmsg_chunked_init(&c->chunked);
        c->req->expect_continue = m.expect_continue && m.minor >= 1;
        c->req->body_length = c->is_chunked ? -1 : (int64_t)c->left;
        c->streaming = !c->body_done && c->srv->stream && c->srv->stream(c->req, c->srv->arg);
        if (c->body_done || c->streaming) {
            httpd_dispatch(c);
            return;
        }
        if (c->left > HTTPD_MAX_BODY) {
            snprintf(msg, sizeof(msg),
                     "the request body (%" PRIu64 " bytes) is over the limit of %d bytes; "
                     "nothing was done",
                     c->left, HTTPD_MAX_BODY);
            httpd_refuse(c, 413, "request_too_large", msg);
            return;
        }
        httpd_continue(c->req);
        c->state = HC_BODY;
    }
    switch (httpd_take_body(c, HTTPD_MAX_BODY, err, sizeof(err))) {
    case 1:
        c->body_done = 1;
        httpd_dispatch(c);
        return;
    case -1:
        httpd_refuse(c, 400, "bad_request", err);
        return;
    case -2:
        snprintf(msg, sizeof(msg),
                 "the request body is over the limit of %d bytes; nothing was done",
                 HTTPD_MAX_BODY);
        httpd_refuse(c, 413, "request_too_large", msg);
        return;
    }
}

/* A streamed body that is malformed (code 400) or stopped arriving (408) ends its request: the
 * handler hears that its client is gone, so what it passed on is never completed, and the client
 * is told why, unless part of an answer has gone to it already, which only closing can end. */
static void httpd_stream_fail(struct httpd_conn *c, int code, const char *what)
{
    struct httpd_req *r = c->req;
    char msg[400];
    int started = httpd_reply_retract(r) != 0;

    log_warn("http: %s %s: the request body %s; %s", httpd_method_name(r->method),
             evhttp_uri_get_path(r->uri), what,
             started ? "closing the connection" : "giving the request up");
    snprintf(msg, sizeof(msg), "the request body %s; it was not passed on whole", what);
    httpd_req_detach(c);
    if (started)
        httpd_conn_free(c);
    else
        httpd_refuse(c, code, code == 408 ? "request_timeout" : "bad_request", msg);
}

/* Passes what the input holds of a streamed body on to its handler. */
static void httpd_stream_body(struct httpd_conn *c)
{
    struct httpd_req *r = c->req;
    size_t before = evbuffer_get_length(r->body);
    char why[300], what[320];
    int rc = httpd_take_body(c, 0, why, sizeof(why));

    if (rc < 0) {
        snprintf(what, sizeof(what), "is malformed (%s)", why);
        httpd_stream_fail(c, 400, what);
        return;
    }
    if (rc == 1) {
        c->body_done = 1;
        httpd_set_read_timeout(c, 0);
    }
    if (rc == 1 || evbuffer_get_length(r->body) > before)
        r->body_cb(r->body_arg, rc == 1); /* may answer r and free c */
}

/* Reads the current request on from what the input holds. A request handed to its handler may be
 * answered, and c freed, before this returns: c is not touched after it; the next request is
 * taken from the loop (httpd_req_done()). */
static void httpd_serve(struct httpd_conn *c)
{
    struct httpd_req *r = c->req;

    if (c->state == HC_HEAD || c->state == HC_BODY)
        httpd_read_request(c);
    else if (c->state == HC_HANDLER && c->streaming && !c->body_done && r->body_cb &&
             !r->body_paused)
        httpd_stream_body(c);
}

/* The last reply is written: closes c, or lets it linger (see the top of the file). */
static void httpd_close(struct httpd_conn *c)
{
    struct timeval idle = {HTTPD_LINGER_IDLE_MS / 1000, (HTTPD_LINGER_IDLE_MS % 1000) * 1000};
    struct timeval most = {HTTPD_LINGER_MS / 1000, (HTTPD_LINGER_MS % 1000) * 1000};
    evutil_socket_t fd = bufferevent_getfd(c->bev);

    if (!c->linger || fd < 0 || shutdown(fd, SHUT_WR) != 0) {
        httpd_conn_free(c);
        return;
    }
    c->state = HC_LINGER;
    evbuffer_drain(bufferevent_get_input(c->bev),
                   evbuffer_get_length(bufferevent_get_input(c->bev)));
    bufferevent_set_timeouts(c->bev, &idle, NULL);
    bufferevent_enable(c->bev, EV_READ);
    event_add(c->resume, &most); /* the whole of it: httpd_on_resume() closes */
}

static void httpd_on_read(struct bufferevent *bev, void *arg)
{
    struct httpd_conn *c = arg;

    (void)bev;
    if (c->state == HC_LINGER) {
        struct evbuffer *in = bufferevent_get_input(c->bev);
        evbuffer_drain(in, evbuffer_get_length(in));
        return;
    }
    bevread_ready(c->bev);
    httpd_serve(c);
}

static void httpd_on_write(struct bufferevent *bev, void *arg)
{
    struct httpd_conn *c = arg;
    struct httpd_req *r = c->req;

    (void)bev;
    if (c->state == HC_CLOSING) {
        httpd_close(c);
        return;
    }
    if (c->unsent) {
        c->unsent = 0;
        httpd_set_read_timeout(c, 1);
        bufferevent_enable(c->bev, EV_READ);
        httpd_serve(c); /* c may be freed */
        return;
    }
    if (r && r->drained) {
        httpd_drained_cb cb = r->drained;
        r->drained = NULL;
        cb(r->drained_arg);
    }
}

/* c, between requests, takes no other: it closes once the answers queued are written. */
static void httpd_close_after_output(struct httpd_conn *c)
{
    httpd_req_free(c->req);
    c->req = NULL;
    c->state = HC_CLOSING;
    c->linger = 0;
    c->unsent = 0;
    bufferevent_disable(c->bev, EV_READ);
}

static void httpd_on_event(struct bufferevent *bev, short what, void *arg)
{
    struct httpd_conn *c = arg;

    (void)bev;
    if ((what & BEV_EVENT_TIMEOUT) && (what & BEV_EVENT_READING)) { /* a request stopped coming */
        if (c->state == HC_BODY) {
            httpd_refuse(c, 408, "request_timeout", "the request body stopped arriving");
            return;
        }
        if (c->state == HC_HEAD && evbuffer_get_length(bufferevent_get_input(c->bev)) > 0) {
            httpd_refuse(c, 408, "request_timeout", "the request head stopped arriving");
            return;
        }
        if (c->state == HC_HANDLER && c->streaming && !c->body_done) {
            httpd_stream_fail(c, 408, "stopped arriving");
            return;
        }
    }
    if ((what & BEV_EVENT_EOF) && !(what & BEV_EVENT_ERROR) && c->state != HC_HANDLER &&
        evbuffer_get_length(bufferevent_get_output(c->bev)) > 0) {
        /* The client shut its sending side (a half-close) with answers still on their way to
         * it: they go out whole, then the connection closes. A request it had begun cannot be
         * completed. */
        httpd_close_after_output(c);
        return;
    }
    httpd_conn_free(c); /* end of stream, an error, or a timeout: the client is gone (one waiting
                         * for an answer to a request being handled is taken to have given up) */
}

/* From the loop: the next request after a reply, or closing after the last one. */
static void httpd_on_resume(evutil_socket_t fd, short what, void *arg)
{
    struct httpd_conn *c = arg;

    (void)fd;
    (void)what;
    if (c->state == HC_LINGER) {
        httpd_conn_free(c); /* lingered long enough */
        return;
    }
    if (c->state == HC_CLOSING) {
        if (evbuffer_get_length(bufferevent_get_output(c->bev)) == 0)
            httpd_close(c);
        return;
    }
    httpd_serve(c);
}

static void httpd_on_accept(struct evconnlistener *lev, evutil_socket_t fd, struct sockaddr *sa,
                            int salen, void *arg)
{
    struct httpd *srv = arg;
    struct httpd_conn *c = calloc(1, sizeof(*c));
    int one = 1;

    (void)lev;
    (void)sa;
    (void)salen;
    srv->short_logged = 0;
    if (c) {
        c->bev = bufferevent_socket_new(srv->base, fd, BEV_OPT_CLOSE_ON_FREE);
        c->resume = event_new(srv->base, -1, 0, httpd_on_resume, c);
    }
    if (!c || !c->bev || !c->resume) {
        if (c && c->bev)
            bufferevent_free(c->bev);
        else
            evutil_closesocket(fd);
        if (c && c->resume)
            event_free(c->resume);
        free(c);
        return;
    }
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    c->srv = srv;
    c->state = HC_HEAD;
    c->next = srv->conns;
    if (srv->conns)
        srv->conns->prev = c;
    srv->conns = c;
    srv->nconns++;
    fg_metrics.gauge[G_HTTP_CONNECTIONS_OPEN] = srv->nconns;
    bufferevent_setcb(c->bev, httpd_on_read, httpd_on_write, httpd_on_event, c);
    bevread_setup(c->bev, HTTPD_MAX_HEAD + HTTPD_MAX_PIPELINED);
    httpd_set_read_timeout(c, 1);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    if (srv->nconns > HTTPD_MAX_CONNS) {
        char msg[160];
        snprintf(msg, sizeof(msg),
                 "the HTTP endpoint has %d connections open, the most it takes; try again once "
                 "some have closed",
                 HTTPD_MAX_CONNS);
        httpd_refuse(c, 503, "too_many_connections", msg);
    }
}

/* accept() failed. Out of descriptors, the pending connection stays pending: accepting pauses
 * for HTTPD_ACCEPT_PAUSE_MS at a time instead of the loop spinning on it, logged once until a
 * connection is accepted again. */
static void httpd_on_accept_error(struct evconnlistener *lev, void *arg)
{
    struct httpd *srv = arg;
    struct timeval tv = {0, HTTPD_ACCEPT_PAUSE_MS * 1000};
    int e = EVUTIL_SOCKET_ERROR();

    if (e != EMFILE && e != ENFILE && e != ENOBUFS && e != ENOMEM)
        return; /* the connection's own trouble (ECONNABORTED, ...): the next one is fine */
    if (!srv->short_logged)
        log_warn("http: cannot accept a connection: %s; accepting pauses %d ms at a time until "
                 "it can",
                 strerror(e), HTTPD_ACCEPT_PAUSE_MS);
    srv->short_logged = 1;
    evconnlistener_disable(lev);
    evtimer_add(srv->unpause, &tv);
}

static void httpd_on_unpause(evutil_socket_t fd, short what, void *arg)
{
    struct httpd *srv = arg;

    (void)fd;
    (void)what;
    if (srv->lev)
        evconnlistener_enable(srv->lev);
}

static void httpd_on_drained(evutil_socket_t fd, short what, void *arg)
{
    struct httpd *srv = arg;
    void (*done)(void *) = srv->drained;

    (void)fd;
    (void)what;
    if (done && !srv->conns) {
        srv->drained = NULL;
        done(srv->drained_arg);
    }
}

void httpd_drain(struct httpd *srv, void (*done)(void *), void *arg)
{
    struct httpd_conn *c, *next;

    evconnlistener_free(srv->lev); /* closed: a new connection is refused, not left waiting */
    srv->lev = NULL;
    event_del(srv->unpause);
    srv->drained = done;
    srv->drained_arg = arg;
    for (c = srv->conns; c; c = next) {
        int quiet = evbuffer_get_length(bufferevent_get_output(c->bev)) == 0;

        next = c->next;
        if (c->state == HC_HEAD && quiet && evbuffer_get_length(bufferevent_get_input(c->bev)) > 0)
            httpd_refuse(c, 503, "unavailable",
                         "the sidecar is shutting down; send the request again"); /* a head begun */
        else if (c->state == HC_LINGER || (c->state == HC_HEAD && quiet))
            httpd_conn_free(c); /* idle */
        else if (c->state == HC_HEAD)
            httpd_close_after_output(c); /* an event stream's last events, answers unread */
        else if (c->req && !c->req->started)
            c->req->keep_alive = 0; /* its reply says Connection: close */
    }
    event_active(srv->drained_ev, 0, 1); /* in case none was busy */
}

int httpd_conn_count(const struct httpd *srv)
{
    return srv->nconns;
}

void httpd_close_all(struct httpd *srv)
{
    while (srv->conns)
        httpd_conn_free(srv->conns);
}

void httpd_set_stream(struct httpd *srv, httpd_stream_cb stream)
{
    srv->stream = stream;
}

struct httpd *httpd_new(struct event_base *base, evutil_socket_t fd, httpd_handler handler,
                        void *arg)
{
    struct httpd *srv = calloc(1, sizeof(*srv));

    if (!srv)
        return NULL;
    srv->base = base;
    srv->handler = handler;
    srv->arg = arg;
    srv->unpause = evtimer_new(base, httpd_on_unpause, srv);
    srv->drained_ev = event_new(base, -1, 0, httpd_on_drained, srv);
    srv->lev = srv->unpause && srv->drained_ev
                   ? evconnlistener_new(base, httpd_on_accept, srv, LEV_OPT_CLOSE_ON_FREE, 0, fd)
                   : NULL;
    if (!srv->lev) {
        if (srv->unpause)
            event_free(srv->unpause);
        if (srv->drained_ev)
            event_free(srv->drained_ev);
        free(srv);
        return NULL;
    }
    evconnlistener_set_error_cb(srv->lev, httpd_on_accept_error);
    return srv;
}

void httpd_free(struct httpd *srv)
{
    if (!srv)
        return;
    srv->drained = NULL;
    if (srv->lev)
        evconnlistener_free(srv->lev);
    event_free(srv->unpause);
    httpd_close_all(srv);
    event_free(srv->drained_ev);
    free(srv);
}
