/* httpevents.h — GET /v1/events: what happens to the locks held over HTTP, as a Server-Sent
 * Events stream (text/event-stream), so that an application learns at once that a lock it works
 * under was lost instead of at its next write (DESIGN.md §1: "HTTP 409 and an event"). */
#ifndef FG_HTTPEVENTS_H
#define FG_HTTPEVENTS_H

#include <stddef.h>

struct event_base;
struct httpd_req;
struct http_events;

#define HTTPEVENTS_MAX_STREAMS 64          /* open streams; more are answered 503 */
#define HTTPEVENTS_MAX_PENDING (256 << 10) /* bytes a stream may leave unread before it is cut */
#define HTTPEVENTS_SNDBUF      (64 << 10)  /* a stream socket's send buffer (SO_SNDBUF) */
/* A comment line this often keeps proxies and client read timeouts quiet. */
#define HTTPEVENTS_KEEPALIVE_MS 15000

/* NULL when out of memory. */
struct http_events *http_events_new(struct event_base *base);
/* Serves GET /v1/events[?lock=NAME] on req: answers 400 (bad query) or 503 (too many streams),
 * or starts the stream, which stays open until the client goes away or http_events_end(). */
void http_events_serve(struct http_events *ev, struct httpd_req *req);
/* Streams open now (0 for NULL): callers skip building events nobody would get. */
int http_events_open(const struct http_events *ev);
/* Sends one event to every stream that wants it: type is the SSE event name, data a complete
 * JSON object (one line). A lock event (lock non-NULL, len bytes) goes to the streams of every
 * lock and of that lock; a sidecar event (lock NULL) goes to every stream. A stream that has left
 * more than HTTPEVENTS_MAX_PENDING bytes unread is closed instead. */
void http_events_emit(struct http_events *ev, const char *type, const char *lock, size_t len,
                      const char *data);
/* Sends a last event of this type (e.g. "shutdown") with data and ends every stream. */
void http_events_end(struct http_events *ev, const char *type, const char *data);
/* Ends every stream without a word and frees ev. NULL is a no-op. */
void http_events_free(struct http_events *ev);

#endif
