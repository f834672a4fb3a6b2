/* net.h — socket plumbing: resolve, listen, non-blocking connect, socket options. */
#ifndef FG_NET_H
#define FG_NET_H

#include <stddef.h>
#include <sys/socket.h>

#include "fg_error.h"

struct net_addr {
    struct sockaddr_storage ss;
    socklen_t len;
};

/* Whether hosts a and b (numeric or names) resolve to a common address: two spellings of one
 * endpoint ("localhost" and "127.0.0.1", two DNS names of one service). 0 when either cannot be
 * resolved. Blocks on the resolver: for start-up. */
int net_same_host(const char *a, const char *b);

/* A non-blocking socket bound to host:port with SO_REUSEADDR, not listening yet: fencegate binds
 * both of its addresses before it listens on either, so that one that cannot be had leaves
 * nothing accepting connections. Returns the fd, or -1 with the reason in err ("cannot listen on
 * HOST:PORT: Address already in use"). */
int net_bind(const char *host, int port, char *err, size_t errlen);

/* Whether sockets a and b from net_bind() take one address: the same port on the same address,
 * or on an unspecified one (0.0.0.0, ::), which takes the port on every address. Linux lets two
 * SO_REUSEADDR sockets bind so while neither listens, and the second listen() then fails: two
 * names of one address ("localhost" and "127.0.0.1") are found here, before either listens. */
int net_bound_overlap(int a, int b);

/* listen() on a socket from net_bind(). Returns 0, or -1 with the reason in err. */
int net_listen(int fd, const char *host, int port, int backlog, char *err, size_t errlen);

#define NET_USER_TIMEOUT_MS 10000 /* TCP_USER_TIMEOUT of the connections net_connect() makes */

/* Starts a non-blocking connect; returns the fd (the connect may still be in progress) or -1 with
 * errno set. */
int net_connect(const struct net_addr *a);

/* After a non-blocking connect became writable: 0 when connected, else the socket's errno. */
int net_connect_result(int fd);

/* Non-blocking + close-on-exec + TCP_NODELAY (when TCP). Returns 0 or -1 with errno set. */
int net_prepare(int fd);

/* "127.0.0.1:6380" / "[::1]:6380" for an address, into out. */
void net_format(const struct sockaddr *sa, char *out, size_t cap);

#endif
