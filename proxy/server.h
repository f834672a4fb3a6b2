/* server.h — the RESP endpoint: client connections, each with its own upstream connection. */
#ifndef FG_SERVER_H
#define FG_SERVER_H

#include <stddef.h>

struct event_base;
struct cfg;
struct upstream;
struct lock_client;
struct server;

/* Listens on lfd, a socket bound to cfg's RESP address (net_bind()), which the server takes and
 * closes (also when it fails), and starts accepting. Connections take their locks from `locks`;
 * with store_is_backend (the upstream is the lock backend's own Redis) fenced writes also check
 * the lock keys there. Returns NULL with a reason in err (out of memory, ...). cfg, up and locks
 * must outlive the server. */
struct server *server_new(struct event_base *base, const struct cfg *cfg, int lfd,
                          struct upstream *up, struct lock_client *locks, int store_is_backend,
                          char *err, size_t errlen);

/* Closes every connection and the listener at once; NULL is a no-op. */
void server_free(struct server *s);

/* Stops accepting and lets each connection finish what it has in flight: idle connections close
 * now, others once their pending replies have been written. Calls done(arg) once no connection is
 * left (possibly before returning). */
void server_drain(struct server *s, void (*done)(void *arg), void *arg);

/* Closes every connection now (their locks are released), as when a drain's grace runs out; a
 * drain waiting for them is then done. Never from inside a client's callback. */
void server_close_all(struct server *s);

/* Connections open now. */
int server_client_count(const struct server *s);

#endif
