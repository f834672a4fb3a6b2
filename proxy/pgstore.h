/* pgstore.h — PostgreSQL stores: a bounded libpq connection pool per store on the event loop,
 * POST /v1/stores/{store}/sql (fenced SQL batches) and fence on acquire.
 *
 * A batch runs in a transaction block fencegate opens and closes itself, in one pipeline: BEGIN,
 * the settings and the lock's advisory lock (shared), a plain read that the lock's row of
 * fencegate_fence holds exactly the token (else an error, so nothing after it runs), the
 * statements, a check that the block is still fencegate's, COMMIT; a block an error left open is
 * rolled back in a second round trip. See pgstore.c. */
#ifndef FG_PGSTORE_H
#define FG_PGSTORE_H

#include <stdint.h>

#include "lock.h"

struct event_base;
struct cfg;
struct cfg_store;
struct httpd_req;
struct lock_session;
struct pgstores;
struct pgstore;

#define PGSTORE_POOL_SIZE  8    /* connections per store, unless pool_size says otherwise */
#define PGSTORE_TIMEOUT_MS 5000 /* statement_timeout, unless timeout_ms says otherwise */
#define PGSTORE_QUEUE_MAX  1024 /* requests waiting for a connection, unless queue_max says */
/* Fence-on-acquire jobs waiting for a connection: a reserve of their own, so that a flood of
 * SQL batches filling queue_max never makes lock acquisitions fail. */
#define PGSTORE_FENCE_QUEUE_MAX 1024
/* Bytes of rendered JSON results per batch; past it the batch (committed: COMMIT went out in the
 * same pipeline) is answered 413 with "committed":true and no results. */
#define PGSTORE_RESULT_MAX (16u * 1024 * 1024)

/* One pool per postgresql:// store of cfg; connects in the background. NULL when out of memory.
 * cfg must outlive it. When cfg has such a store, pqlib_load() (pqlib.h) must have succeeded. */
struct pgstores *pgstores_new(struct event_base *base, const struct cfg *cfg);
void pgstores_free(struct pgstores *p);
int pgstores_count(const struct pgstores *p);
struct pgstore *pgstores_get(struct pgstores *p, int i);

/* lock_fence_hook for one store (arg: struct pgstore): raises fencegate_fence's row for name to
 * token. 0 raised; 1 with the mark when it is already >= token; -1 when the store cannot be
 * reached or refuses (the acquisition fails closed). */
void pgstore_fence_hook(void *arg, const char *name, uint64_t token, lock_fence_done done,
                        void *ctx);
/* http_store_handler (arg: struct pgstores) for /v1/stores/{store}/sql. */
void pgstore_handle(void *arg, const struct cfg_store *store, const char *rest,
                    struct httpd_req *req, struct lock_session *sess);
/* http_ready_check (arg: struct pgstores): NULL when every store has a live connection. */
const char *pgstore_ready(void *arg);

#endif
