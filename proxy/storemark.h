/* storemark.h — raises a lock's high-water mark in the Redis store before a token is handed out. */
#ifndef FG_STOREMARK_H
#define FG_STOREMARK_H

#include <stdint.h>

#include "lock.h"

struct event_base;
struct cfg_url;
struct store_marks;

/* A connection (made on first use, remade after loss) to the Redis store at url. Returns NULL
 * when out of memory. */
struct store_marks *store_marks_new(struct event_base *base, const struct cfg_url *url,
                                    long long timeout_ms);
/* Fails pending raises (done with status -1) and frees. NULL is a no-op. */
void store_marks_free(struct store_marks *m);

/* The lock client's fence hook (see lock.h): raises the mark of `name` to `token` in the store and
 * calls done(ctx, 0, 0, NULL) when raised, done(ctx, 1, mark, msg) when the store's mark is
 * already >= token (the token counter went backwards), done(ctx, -1, 0, msg) when the store
 * could not be reached in time. arg is the struct store_marks. */
void store_marks_hook(void *arg, const char *name, uint64_t token, lock_fence_done done, void *ctx);

/* Raises that happened, and raises that found the mark at or above the token. */
uint64_t store_marks_raised(const struct store_marks *m);
uint64_t store_marks_regressions(const struct store_marks *m);

#endif
