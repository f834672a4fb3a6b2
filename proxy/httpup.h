/* httpup.h — one HTTP/1.1 client connection to an HTTP store: sends a request whose body may be
 * streamed, reads the response's head and streams its body back; kept alive between requests.
 * Framing only: deadlines, retries and what an answer means are the caller's (httpstore.c). */
#ifndef FG_HTTPUP_H
#define FG_HTTPUP_H

#include <event2/util.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

struct event_base;
struct evbuffer;
struct evkeyvalq;
struct httpup;

#define HTTPUP_MAX_HEAD (64 * 1024) /* bytes of a response's status line and header fields */

/* How a request ended, for httpup_handler.done(). */
enum httpup_end {
    HTTPUP_OK,        /* the response was read whole */
    HTTPUP_CONNECT,   /* the connection could not be made: nothing was sent */
    HTTPUP_CLOSED,    /* the store closed the connection (or it broke) before the response ended */
    HTTPUP_MALFORMED, /* the response could not be read (why says how) */
};

struct httpup_handler {
    /* The final response's status line and header fields (interim 1xx answers are skipped).
     * length: the body's Content-Length, or -1 when it is chunked or ends with the connection
     * (the caller frames it anew), 0 for none. Returns 0 to read the body, -1 to stop (the
     * connection is then not reused; done() is not called). */
    int (*head)(void *arg, int status, const char *reason, const struct evkeyvalq *headers,
                int64_t length);
    /* More of the response's body (de-chunked) is in buf; drain what is taken. */
    void (*body)(void *arg, struct evbuffer *buf);
    /* The request is over: end says how; why is a message for anything but HTTPUP_OK. */
    void (*done)(void *arg, enum httpup_end end, const char *why);
    /* What was waiting to be written to the store has been written (after httpup_unsent() was
     * above 0): the caller may send more of the request's body. May be NULL. */
    void (*drained)(void *arg);
};

/* Starts connecting to sa. The handler is set by httpup_request(). Returns NULL when out of
 * memory or sockets (errno set). */
struct httpup *httpup_connect(struct event_base *base, const struct sockaddr *sa, socklen_t salen);
/* Closes the connection at once, whatever it was doing; no callback runs. NULL is a no-op. */
void httpup_free(struct httpup *up);

/* 1 when the connection is established (its TCP handshake is done). */
int httpup_connected(const struct httpup *up);
/* 1 when the connection can carry a new request: idle after a whole response with keep-alive,
 * with no byte after that response's end (read or queued in the socket), and the store has not
 * closed it since. */
int httpup_reusable(const struct httpup *up);
/* 1 once any byte of the current request was written to the store's socket. */
int httpup_sent(const struct httpup *up);

/* Sends a request's head: method and target (path and query) as given, the header fields of
 * headers as given (the caller leaves out hop-by-hop ones, Content-Length and
 * Transfer-Encoding), then the body's framing: body_length >= 0 a Content-Length, -1 chunked.
 * h/arg get the answer. head_request: the method is HEAD (its response has no body). Returns 0,
 * or -1 when the connection cannot take a request (busy, or closed). */
int httpup_request(struct httpup *up, const char *method, const char *target,
                   const struct evkeyvalq *headers, int64_t body_length, int head_request,
                   const struct httpup_handler *h, void *arg);
/* Sends more of the request's body (drains buf), framed as httpup_request() said. */
void httpup_send_body(struct httpup *up, struct evbuffer *buf);
/* The request's body is complete (for a chunked one: the last chunk). */
void httpup_end_body(struct httpup *up);
/* Bytes of the request not yet written to the store's socket. */
size_t httpup_unsent(const struct httpup *up);
/* Stops (1) or resumes (0) reading the response: back-pressure from a slow client. */
void httpup_pause(struct httpup *up, int pause);

#endif
