/* net.c — socket plumbing: resolve, listen, non-blocking connect, socket options. */
#include "net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Resolves host:port (numeric or a name) to its first address, blocking: for start-up only (the
 * listeners; outgoing connections use resolve.h). Returns FG_OK, or FG_ERR_NOTFOUND with a reason
 * in err. */
static int net_resolve(const char *host, int port, struct net_addr *out, char *err, size_t errlen)
{
    struct addrinfo hints, *res = NULL;
    char portstr[16];
    int rc;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    snprintf(portstr, sizeof(portstr), "%d", port);
    rc = getaddrinfo(host, portstr, &hints, &res);
    if (rc != 0 || !res) {
        snprintf(err, errlen, "cannot resolve '%s': %s", host, gai_strerror(rc));
        return FG_ERR_NOTFOUND;
    }
    memcpy(&out->ss, res->ai_addr, res->ai_addrlen);
    out->len = res->ai_addrlen;
    freeaddrinfo(res);
    return FG_OK;
}

static int net_same_sockaddr(const struct sockaddr *x, const struct sockaddr *y)
{
    if (x->sa_family != y->sa_family)
        return 0;
    if (x->sa_family == AF_INET)
        return memcmp(&((const struct sockaddr_in *)(const void *)x)->sin_addr,
                      &((const struct sockaddr_in *)(const void *)y)->sin_addr,
                      sizeof(struct in_addr)) == 0;
    if (x->sa_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)(const void *)x)->sin6_addr,
                      &((const struct sockaddr_in6 *)(const void *)y)->sin6_addr,
                      sizeof(struct in6_addr)) == 0;
    return 0;
}

int net_same_host(const char *a, const char *b)
{
    struct addrinfo hints, *ra = NULL, *rb = NULL;
    int same = 0;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(a, NULL, &hints, &ra) == 0 && getaddrinfo(b, NULL, &hints, &rb) == 0)
        for (const struct addrinfo *x = ra; x && !same; x = x->ai_next)
            for (const struct addrinfo *y = rb; y && !same; y = y->ai_next)
                same = net_same_sockaddr(x->ai_addr, y->ai_addr);
    if (ra)
        freeaddrinfo(ra);
    if (rb)
        freeaddrinfo(rb);
    return same;
}

int net_prepare(int fd)
{
    int one = 1, fl = fcntl(fd, F_GETFL);

    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return -1;
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
        return -1;
    /* Fails harmlessly on non-TCP sockets; latency matters more than packet count here. */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return 0;
}

int net_bind(const char *host, int port, char *err, size_t errlen)
{
    struct net_addr a;
    int fd, one = 1;

    if (net_resolve(host, port, &a, err, errlen) != FG_OK)
        return -1;
    fd = socket(a.ss.ss_family, SOCK_STREAM, 0);
    if (fd < 0) {
        snprintf(err, errlen, "socket: %s", strerror(errno));
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (net_prepare(fd) < 0 || bind(fd, (struct sockaddr *)&a.ss, a.len) < 0) {
        snprintf(err, errlen, "cannot listen on %s:%d: %s", host, port, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

/* Whether sa is 0.0.0.0 or ::, which takes its port on every address. */
static int net_unspecified(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return ((const struct sockaddr_in *)(const void *)sa)->sin_addr.s_addr == htonl(INADDR_ANY);
    if (sa->sa_family == AF_INET6)
        return IN6_IS_ADDR_UNSPECIFIED(&((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr);
    return 0;
}

static int net_port_of(const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return ntohs(((const struct sockaddr_in *)(const void *)sa)->sin_port);
    if (sa->sa_family == AF_INET6)
        return ntohs(((const struct sockaddr_in6 *)(const void *)sa)->sin6_port);
    return -1;
}

int net_bound_overlap(int a, int b)
{
    struct sockaddr_storage x, y;
    socklen_t xl = sizeof(x), yl = sizeof(y);
    const struct sockaddr *xs = (const struct sockaddr *)&x, *ys = (const struct sockaddr *)&y;

    if (getsockname(a, (struct sockaddr *)&x, &xl) < 0 ||
        getsockname(b, (struct sockaddr *)&y, &yl) < 0 || net_port_of(xs) < 0 ||
        net_port_of(xs) != net_port_of(ys))
        return 0;
    return net_unspecified(xs) || net_unspecified(ys) || net_same_sockaddr(xs, ys);
}

int net_listen(int fd, const char *host, int port, int backlog, char *err, size_t errlen)
{
    if (listen(fd, backlog) < 0) {
        snprintf(err, errlen, "cannot listen on %s:%d: %s", host, port, strerror(errno));
        return -1;
    }
    return 0;
}

int net_connect(const struct net_addr *a)
{
    int fd = socket(a->ss.ss_family, SOCK_STREAM, 0), saved;

    if (fd < 0)
        return -1;
    if (net_prepare(fd) < 0)
        goto fail;
#ifdef TCP_USER_TIMEOUT
    {
        /* Sent data unacknowledged this long: the peer is cut off. Without it, retransmissions
         * backing off across repeated cuts hold a request for minutes; with it the connection
         * fails and its requests are answered. A busy Redis still acknowledges at once. */
        unsigned ms = NET_USER_TIMEOUT_MS;
        (void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof(ms));
    }
#endif
    if (connect(fd, (const struct sockaddr *)&a->ss, a->len) < 0 && errno != EINPROGRESS)
        goto fail;
    return fd;
fail:
    saved = errno;
    close(fd);
    errno = saved;
    return -1;
}

int net_connect_result(int fd)
{
    int e = 0;
    socklen_t len = sizeof(e);

    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) < 0)
        return errno;
    return e;
}

void net_format(const struct sockaddr *sa, char *out, size_t cap)
{
    char host[INET6_ADDRSTRLEN] = "?";

    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
        inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
        snprintf(out, cap, "%s:%d", host, ntohs(in->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
        snprintf(out, cap, "[%s]:%d", host, ntohs(in6->sin6_port));
    } else {
        snprintf(out, cap, "unix");
    }
}
