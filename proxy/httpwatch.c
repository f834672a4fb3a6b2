/* httpwatch.c — noticing that an HTTP client went away while its request waits for something
 * asynchronous: one close callback for every connection with a watched request. */
#include "httpwatch.h"

#include <errno.h>
#include <event2/bufferevent.h>
#include <event2/http.h>
#include <sys/socket.h>
#include <stddef.h>

/* Every running watch, of every connection. The sidecar serves HTTP from one event loop thread. */
static struct httpwatch *httpwatch_running;

/* A connection with watched requests is going away. When the client closed or timed out,
 * libevent 2.1 has already taken the unfinished request off the connection
 * (evhttp_request_get_connection() is NULL) and no longer frees it, so it is freed here; when the
 * connection is freed with the request still on it (evhttp_free at shutdown), libevent frees the
 * request after this returns. Watches are therefore matched on the connection remembered when
 * they started, not on their request's. */
static void httpwatch_on_close(struct evhttp_connection *conn, void *arg)
{
    for (;;) {
        struct httpwatch *w = httpwatch_running;
        struct evhttp_request *req;
        httpwatch_gone_cb gone;
        void *garg;

        while (w && w->conn != conn)
            w = w->next;
        if (!w)
            return;
        req = w->req;
        gone = w->gone;
        garg = w->arg;
        httpwatch_stop(w);
        if (!evhttp_request_get_connection(req))
            evhttp_request_free(req);
        gone(garg); /* may stop or free other watches: the next is looked up afresh */
    }
}

void httpwatch_start(struct httpwatch *w, struct evhttp_request *req, httpwatch_gone_cb gone,
                     void *arg)
{
    httpwatch_stop(w);
    w->req = req;
    w->conn = evhttp_request_get_connection(req);
    w->gone = gone;
    w->arg = arg;
    w->prev = NULL;
    w->next = httpwatch_running;
    if (httpwatch_running)
        httpwatch_running->prev = w;
    httpwatch_running = w;
    evhttp_connection_set_closecb(w->conn, httpwatch_on_close, NULL);
}

void httpwatch_stop(struct httpwatch *w)
{
    if (!w->req)
        return;
    if (w->prev)
        w->prev->next = w->next;
    else
        httpwatch_running = w->next;
    if (w->next)
        w->next->prev = w->prev;
    w->req = NULL;
    w->conn = NULL;
    w->prev = w->next = NULL;
}

int httpwatch_peer_closed(struct evhttp_request *req)
{
    struct evhttp_connection *conn = evhttp_request_get_connection(req);
    struct bufferevent *bev = conn ? evhttp_connection_get_bufferevent(conn) : NULL;
    evutil_socket_t fd = bev ? bufferevent_getfd(bev) : -1;
    char b;
    ssize_t n;

    if (fd < 0)
        return 0;
    n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}
