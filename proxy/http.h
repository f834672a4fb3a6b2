/* http.h — the HTTP endpoint: the lock API, health, readiness and Prometheus metrics. */
#ifndef FG_HTTP_H
#define FG_HTTP_H

#include <stddef.h>

struct event_base;
struct cfg;
struct upstream;
struct lock_client;
struct http_api;

/* Binds the HTTP listener from cfg. Locks taken over HTTP belong to one session of `locks`, the
 * sidecar's own. Returns NULL with a reason in err. cfg, up and locks must outlive it. */
struct http_api *http_new(struct event_base *base, const struct cfg *cfg, struct upstream *up,
                          struct lock_client *locks, char *err, size_t errlen);
/* Releases every lock held over HTTP and refuses new ones from now on (on SIGTERM). */
void http_release_all(struct http_api *h);
/* Releases the locks, answers pending requests 503 and frees. NULL is a no-op. */
void http_free(struct http_api *h);

#endif
