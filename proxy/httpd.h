/* httpd.h — the HTTP/1.1 server of the HTTP endpoint: connections, keep-alive, request heads and
 * bodies (httpmsg.h), replies whole or streamed, back-pressure, and telling a handler that its
 * client went away. Handlers see one request at a time per connection (pipelined requests wait
 * their turn, in order). */
#ifndef FG_HTTPD_H
#define FG_HTTPD_H

#include <event2/http.h>
#include <event2/util.h>
#include <stddef.h>
#include <stdint.h>

#include "fg_error.h"

struct event_base;
struct evbuffer;
struct evhttp_uri;
struct evkeyvalq;
struct httpd;
struct httpd_req;

#define HTTPD_MAX_HEAD      16384         /* bytes of a request's line and header fields */
#define HTTPD_MAX_BODY      (1024 * 1024) /* bytes of a request body */
#define HTTPD_TIMEOUT_MS    30000         /* reading a request, or writing, without progress */
#define HTTPD_MAX_PIPELINED (64 * 1024)   /* bytes read ahead while a request is answered */
#define HTTPD_MAX_UNSENT    (256 * 1024)  /* answers queued unread before the next request waits */
#define HTTPD_MAX_CONNS     1024          /* connections open; more are answered 503 and closed */

/* A request whose head and body arrived: the handler owns r until it answers it (httpd_reply(),
 * httpd_reply_end() or httpd_reply_abort()), which frees r. */
typedef void (*httpd_handler)(struct httpd_req *r, void *arg);
/* r's client went away before r was answered; r is freed once this returns, so the callback
 * must neither answer nor keep it. */
typedef void (*httpd_gone_cb)(void *arg);
/* Everything sent to r's client so far has been written to its socket. */
typedef void (*httpd_drained_cb)(void *arg);
/* Decides, once a request's head has arrived and it has a body, whether its handler takes the body
 * as it arrives (1) rather than whole, within HTTPD_MAX_BODY (0). */
typedef int (*httpd_stream_cb)(struct httpd_req *r, void *arg);
/* More of a streamed body is in httpd_req_body(r) (the reader drains what it takes); done: that
 * was the end of it. */
typedef void (*httpd_body_cb)(void *arg, int done);

/* Serves HTTP on the listening socket fd (taken over: closed by httpd_free()), calling
 * handler(r, arg) for each request. Returns NULL when out of memory. */
struct httpd *httpd_new(struct event_base *base, evutil_socket_t fd, httpd_handler handler,
                        void *arg);
/* Closes the listener and every connection. Requests a handler still owns are told they are gone
 * (their gone callbacks run); ones without a gone callback are left to be answered, which then
 * only frees them. NULL is a no-op. */
void httpd_free(struct httpd *srv);
/* Shutting down: accepts no more connections, closes the idle ones, and each other one once the
 * request it has begun is answered (its reply says "Connection: close"); done(arg) runs once, from
 * the loop, when no connection is left. */
void httpd_drain(struct httpd *srv, void (*done)(void *), void *arg);
/* The drain's time is up: closes every connection now, as httpd_free() does. */
void httpd_close_all(struct httpd *srv);
/* Connections open. */
int httpd_conn_count(const struct httpd *srv);
/* Lets stream(r, arg) choose which requests' handlers take their bodies as they arrive. */
void httpd_set_stream(struct httpd *srv, httpd_stream_cb stream);

/* The request's method (EVHTTP_REQ_*), target (parsed; path and query are raw, as sent), header
 * fields and body. */
enum evhttp_cmd_type httpd_req_method(const struct httpd_req *r);
/* The method as sent ("GET", ...). */
const char *httpd_req_method_name(const struct httpd_req *r);
const struct evhttp_uri *httpd_req_uri(const struct httpd_req *r);
struct evkeyvalq *httpd_req_input_headers(struct httpd_req *r);
/* The first value of the request's header field name (any case), NULL when there is none; *count
 * is set to how many fields have that name (a second one is a conflicting claim). */
const char *httpd_req_header(struct httpd_req *r, const char *name, int *count);
struct evbuffer *httpd_req_body(struct httpd_req *r);
/* The body's length as the client declared it: -1 when chunked (unknown), 0 when none. */
int64_t httpd_req_body_length(const struct httpd_req *r);

/* A streamed request (httpd_stream_cb said so; for any other, cb is never called): starts reading
 * its body (telling a client that sent "Expect: 100-continue" to go on), calling cb(arg, done)
 * from the loop as it arrives. A body that stops arriving for HTTPD_TIMEOUT_MS, or is malformed,
 * ends the request as if its client had gone (the gone callback runs) and is answered 408 or 400,
 * or, when a reply has started, closes the connection. A reply sent before the body is read whole
 * closes the connection after it. */
void httpd_req_body_start(struct httpd_req *r, httpd_body_cb cb, void *arg);
/* Stops (pause 1) or resumes (0) reading a streamed body: back-pressure from its reader. */
void httpd_req_body_pause(struct httpd_req *r, int pause);

/* Header fields of the reply, to be added before it starts. */
struct evkeyvalq *httpd_req_output_headers(struct httpd_req *r);

/* Answers r whole: status code, reason (NULL: the standard one) and body (may be NULL; drained).
 * Content-Length is set here. Frees r. */
void httpd_reply(struct httpd_req *r, int code, const char *reason, struct evbuffer *body);

/* A streamed reply: the status and headers now, then the body in pieces, then the end (which
 * frees r). Framed with the Content-Length among the output headers when there is one (the
 * caller then sends exactly that many bytes), else chunked (HTTP/1.1) or ended by closing the
 * connection (HTTP/1.0). httpd_reply_chunk() drains buf. */
void httpd_reply_start(struct httpd_req *r, int code, const char *reason);
void httpd_reply_chunk(struct httpd_req *r, struct evbuffer *buf);
void httpd_reply_end(struct httpd_req *r);
/* Closes r's connection at once, so that the client cannot take a partial reply for a whole
 * one. Frees r; its gone callback does not run. */
void httpd_reply_abort(struct httpd_req *r);
/* Takes back a started reply of which no byte has been written to the client's socket yet (its
 * head and body are dropped from the output, and the output headers cleared), so that r can be
 * answered anew, e.g. with an error. Returns 0 (also when no reply was started), or -1 when some
 * of it may have reached the client (or the client is gone): then only httpd_reply_abort() is
 * left. */
int httpd_reply_retract(struct httpd_req *r) FG_MUST_CHECK;

/* Calls gone(arg) if r's client goes away before r is answered (at most once; replaces an earlier
 * one). NULL stops it. */
void httpd_req_on_gone(struct httpd_req *r, httpd_gone_cb gone, void *arg);
/* Calls drained(arg) once, when what is waiting to be written to r's client has all been written.
 * NULL stops it. */
void httpd_req_on_drained(struct httpd_req *r, httpd_drained_cb drained, void *arg);
/* Bytes of the reply not yet written to the client's socket. */
size_t httpd_req_unsent(const struct httpd_req *r);
/* The socket of r's connection, or -1 when its client is gone. */
evutil_socket_t httpd_req_fd(const struct httpd_req *r);

#endif
