/* httpwatch.h — noticing that an HTTP client went away while its request waits for something
 * asynchronous (the lock backend, a store). */
#ifndef FG_HTTPWATCH_H
#define FG_HTTPWATCH_H

struct evhttp_request;
struct evhttp_connection;

/* The watched request's client closed, timed out or had its connection freed: the request is no
 * longer the owner's (it was freed, or libevent frees it) and the watch has stopped. */
typedef void (*httpwatch_gone_cb)(void *arg);

/* One watched request, embedded in its owner's object (so starting one cannot fail). Only
 * httpwatch.c writes it; the owner may read conn, the request's connection, while it runs.
 * All-zero is a watch that is not running. */
struct httpwatch {
    struct evhttp_request *req; /* NULL when not running */
    struct evhttp_connection *conn;
    httpwatch_gone_cb gone;
    void *arg;
    struct httpwatch *prev, *next;
};

/* Starts watching req, which must still be on its connection (as in a request handler): when its
 * client goes away before the watch is stopped, gone(arg) is called once, and from then on the
 * owner must treat req as NULL. Installs the connection's close callback (evhttp keeps one per
 * connection; every watch uses the same one). A running w is stopped first. */
void httpwatch_start(struct httpwatch *w, struct evhttp_request *req, httpwatch_gone_cb gone,
                     void *arg);
/* Stops w: no gone call comes after it. The owner stops its watch when it is done with req (has
 * answered it, at the latest before evhttp_send_reply_end(), which may free req and its
 * connection at once) and before it frees w. A watch not running is a no-op. */
void httpwatch_stop(struct httpwatch *w);

/* 1 when req's client has closed its connection. A watch reports that only once libevent 2.1
 * notices, which is when it next reads or writes, and it reads nothing while a request is being
 * answered; this asks the socket (end of stream, or an error: nobody will read the answer). */
int httpwatch_peer_closed(struct evhttp_request *req);

#endif
