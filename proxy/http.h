/* http.h — the HTTP endpoint: health, readiness and Prometheus metrics (the lock API comes later). */
#ifndef FG_HTTP_H
#define FG_HTTP_H

#include <stddef.h>

struct event_base;
struct cfg;
struct upstream;
struct http_api;

/* Binds the HTTP listener from cfg. Returns NULL with a reason in err. cfg and up must outlive it. */
struct http_api *http_new(struct event_base *base, const struct cfg *cfg, struct upstream *up,
                          char *err, size_t errlen);
void http_free(struct http_api *h); /* NULL is a no-op */

#endif
