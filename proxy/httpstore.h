/* httpstore.h — HTTP stores: ANY /v1/stores/{store}/http/{path} forwarded to the store with the
 * caller's fencing token, after the lock backend's mark for (store, lock) was raised to it. */
#ifndef FG_HTTPSTORE_H
#define FG_HTTPSTORE_H

#include <stdint.h>

#include "lock.h"

struct event_base;
struct cfg;
struct cfg_store;
struct httpd_req;
struct lock_session;
struct httpstore;

#define HTTPSTORE_CONNECT_TIMEOUT_MS  2000   /* default: connect to the store */
#define HTTPSTORE_RESPONSE_TIMEOUT_MS 20000  /* default: request sent .. response headers */
#define HTTPSTORE_MAX_TIMEOUT_MS      300000 /* most a Fence-Timeout-Ms header may ask for */

struct httpstore_options {
    long long connect_timeout_ms;  /* 0 = HTTPSTORE_CONNECT_TIMEOUT_MS */
    long long response_timeout_ms; /* 0 = HTTPSTORE_RESPONSE_TIMEOUT_MS */
};

/* The HTTP stores of cfg (stores of kind CFG_URL_HTTP; none is fine). opt may be NULL. cfg must
 * outlive it. Returns NULL when out of memory. */
struct httpstore *httpstore_new(struct event_base *base, const struct cfg *cfg,
                                const struct httpstore_options *opt);
/* The lock client that holds the marks. Set before the event loop runs; until then marks fail
 * closed (LOCK_UNAVAILABLE). */
void httpstore_set_lock_client(struct httpstore *hs, struct lock_client *locks);
/* Frees everything, answering nothing more: call after the HTTP endpoint and the lock client are
 * freed (neither calls back after that). NULL is a no-op. */
void httpstore_free(struct httpstore *hs);

/* An http_store_handler (http.h) for /v1/stores/{store}/http/...; arg is the struct httpstore. */
void httpstore_handle(void *arg, const struct cfg_store *store, const char *rest,
                      struct httpd_req *req, struct lock_session *sess);

/* A lock_fence_hook (lock.h), arg the struct httpstore: raises the mark of (store, name) to token
 * for every HTTP store. done(ctx, 0) when all were raised; done(ctx, 1, mark) when a mark is above
 * the token; done(ctx, -1, 0, msg) when a mark could not be raised (fail closed). */
void httpstore_fence_hook(void *arg, const char *name, uint64_t token, lock_fence_done done,
                          void *ctx);

#endif
