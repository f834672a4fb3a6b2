/* http.h — the HTTP endpoint: the lock API, health, readiness and Prometheus metrics. */
#ifndef FG_HTTP_H
#define FG_HTTP_H

#include <stddef.h>
#include <stdint.h>

struct event_base;
struct cfg;
struct upstream;
struct lock_client;
struct http_api;
struct httpd_req;
struct cfg_store;
struct lock_session;

/* Listens on fd, a socket bound to cfg's HTTP address (net_bind()), which it takes and closes
 * (also when it fails). Locks taken over HTTP belong to one session of `locks`, the sidecar's
 * own. Returns NULL with a reason in err. cfg, up and locks must outlive it. */
struct http_api *http_new(struct event_base *base, const struct cfg *cfg, int fd,
                          struct upstream *up, struct lock_client *locks, char *err, size_t errlen);
/* A handler of /v1/stores/{store}/{verb}[/...]: `store` is the store's configuration, `rest` the
 * decoded-free remainder of the path after "/{verb}" ("" or "/..."), `sess` the sidecar's own lock
 * session whose locks fence the request (NULL while shutting down). It must answer req, now or
 * later (see http_reply_error()). */
typedef void (*http_store_handler)(void *arg, const struct cfg_store *store, const char *rest,
                                   struct httpd_req *req, struct lock_session *sess);
/* Routes /v1/stores/{store}/{verb}... of every store of this URL kind (enum cfg_url_kind) to fn.
 * streams: fn takes the request's body as it arrives (httpd_req_body_start()), with no size
 * limit, rather than whole within HTTPD_MAX_BODY. Returns 0, or -1 when the routing table is
 * full. */
int http_route_stores(struct http_api *h, int url_kind, const char *verb, http_store_handler fn,
                      void *arg, int streams);
/* A readiness check: returns NULL when ready, else why not (shown by /readyz). */
typedef const char *(*http_ready_check)(void *arg);
int http_add_ready_check(struct http_api *h, http_ready_check fn, void *arg);

/* A client may send "Fencing-Token: T", the token its POST /v1/locks/{lock} returned. Clients of
 * one sidecar share its session, so this is how a client whose lock was lost (and then taken
 * again by another client of the same sidecar) is told apart. Returns 1 when there is no such
 * header or it names `held`; else answers req: 409 token_mismatch and returns 0 (a lost lock's
 * client), or 400 and returns -1 (a malformed claim, which says nothing about the lock). */
int http_token_claim_ok(struct httpd_req *req, const char *lock, uint64_t held);

/* Answers req with {"error": code, "message": msg} and the given status. */
void http_reply_error(struct httpd_req *req, int status, const char *code, const char *msg);
/* Answers req with a complete JSON document and the given status. */
void http_reply_json(struct httpd_req *req, int status, const char *body);

/* Releases every lock held over HTTP and refuses new ones from now on (on SIGTERM). */
void http_release_all(struct http_api *h);
/* Then: the HTTP connections drain (httpd_drain()), and done(arg) runs when none is left;
 * http_close_all() closes the rest when the grace period is over. */
void http_drain(struct http_api *h, void (*done)(void *), void *arg);
void http_close_all(struct http_api *h);
int http_conn_count(const struct http_api *h);
/* Releases the locks, answers pending requests 503 and frees. NULL is a no-op. */
void http_free(struct http_api *h);

#endif
