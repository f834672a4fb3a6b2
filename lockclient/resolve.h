/* resolve.h — host names resolved off the event loop.
 *
 * getaddrinfo() blocks for as long as the name service takes: seconds per attempt, times the
 * attempts and the search domains of resolv.conf (ndots:5 in a Kubernetes pod). Called on the
 * event loop, one slow lookup freezes every connection of the process. resolve_start() runs it on
 * a worker thread instead and calls back on the loop with the result. It is still getaddrinfo(),
 * so /etc/hosts, search domains and nsswitch.conf behave as everywhere else.
 *
 * Lookups of one host and port in flight at once are shared, also one whose requests all gave up
 * (a connect timeout): a name service that stalls ties up one thread per name, not one per
 * reconnect attempt, and other names are not queued behind it. A request joins the lookup in
 * flight however long it has run, so a name service that recovers is seen once that lookup
 * returns. At most RESOLVE_MAX_THREADS lookups run at once; more wait their turn. Numeric
 * addresses need no lookup and no thread.
 *
 * Every function is called on the thread that runs the event_base it is given. */
#ifndef FG_RESOLVE_H
#define FG_RESOLVE_H

#include <stddef.h>
#include <sys/socket.h>

#ifdef __cplusplus
extern "C" {
#endif

struct addrinfo;
struct event_base;
struct resolve_req;

#define RESOLVE_MAX_THREADS 8

/* The outcome of a request. res: the host's addresses (SOCK_STREAM, port set), valid during the
 * call only; NULL on failure, with the reason in err ("cannot resolve 'db': Name or service not
 * known"). */
typedef void resolve_cb(const struct addrinfo *res, const char *err, void *arg);

/* Starts resolving host (a name or a numeric IPv4/IPv6 address) for port. cb is called once, from
 * the loop, never from inside resolve_start(); the request is gone after the call. Returns NULL
 * when out of memory or threads (then cb is never called). */
struct resolve_req *resolve_start(struct event_base *base, const char *host, int port,
                                  resolve_cb *cb, void *arg);

/* Forgets a request whose callback has not run yet: cb will not be called. */
void resolve_cancel(struct resolve_req *r);

/* The address to connect to: the first IPv4 one if any (servers commonly listen on 127.0.0.1
 * only, while "localhost" names ::1 too), else the first. */
const struct addrinfo *resolve_pick(const struct addrinfo *res);

/* The numeric host of an address ("10.0.0.7", "fd00::7") into out; "" when not IP. */
void resolve_numeric_host(const struct sockaddr *sa, char *out, size_t cap);

/* resolve_pick()'s address as text into out (64 bytes hold any), for clients that connect by
 * host string (hiredis, evhttp). Returns 0, or -1 when res is NULL (the lookup failed). */
int resolve_pick_host(const struct addrinfo *res, char *out, size_t cap);

#ifdef __cplusplus
}
#endif

#endif
