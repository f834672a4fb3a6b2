/* resolve.c — host names resolved off the event loop (see resolve.h).
 *
 * A lookup is shared by the requests for one host and port while it runs. Its result reaches the
 * loop through an eventfd the worker writes once done. A lookup whose requests were all cancelled
 * while a worker runs it is orphaned: its event is freed on the loop at once, and the worker frees
 * the rest when getaddrinfo() returns. Until then a new request for the name adopts it (a fresh
 * event): a name service that stalls keeps one thread per name busy, not one per attempt, which
 * would leave other names queued behind a single stalled one. */
#include "resolve.h"

#include <arpa/inet.h>
#include <errno.h>
#include <event2/event.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct lookup {
    struct lookup *next;  /* in `inflight` (mu) */
    struct lookup *qnext; /* in the worker queue (mu) */
    struct event_base *base;
    char *host;
    int port;
    int efd;          /* -1 for a numeric host, resolved at once */
    struct event *ev; /* the eventfd, or a zero timer for a numeric host */
    struct resolve_req *reqs;
    int delivering; /* the loop is calling back: cancels must not free the lookup */
    /* Under mu: */
    int done, orphaned;
    /* Set by the worker before `done`: */
    struct addrinfo *res;
    int gai, sys_errno;
};

struct resolve_req {
    struct resolve_req *next;
    struct lookup *lk;
    resolve_cb *cb;
    void *arg;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work = PTHREAD_COND_INITIALIZER;
static struct lookup *queue_head, *queue_tail, *inflight;
static int nthreads, nidle, nqueued;

static void unlink_inflight_locked(struct lookup *lk);

static void lookup_free(struct lookup *lk)
{
    if (lk->res)
        freeaddrinfo(lk->res);
    if (lk->efd >= 0)
        close(lk->efd);
    free(lk->host);
    free(lk);
}

static int lookup_run(struct lookup *lk, int flags)
{
    struct addrinfo hints;
    char port[16];

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = flags | AI_NUMERICSERV;
    snprintf(port, sizeof(port), "%d", lk->port);
    lk->gai = getaddrinfo(lk->host, port, &hints, &lk->res);
    lk->sys_errno = errno;
    if (lk->gai == 0 && !lk->res)
        lk->gai = EAI_NONAME;
    return lk->gai;
}

static void *worker(void *unused)
{
    (void)unused;
    for (;;) {
        struct lookup *lk;
        int orphaned;

        pthread_mutex_lock(&mu);
        while (!queue_head) {
            nidle++;
            pthread_cond_wait(&work, &mu);
            nidle--;
        }
        lk = queue_head;
        nqueued--;
        queue_head = lk->qnext;
        if (!queue_head)
            queue_tail = NULL;
        pthread_mutex_unlock(&mu);

        lookup_run(lk, AI_ADDRCONFIG); /* even when orphaned: a request may adopt it meanwhile */

        /* Written under mu: once `done` is seen, the loop may close the eventfd. */
        pthread_mutex_lock(&mu);
        orphaned = lk->orphaned;
        if (orphaned) {
            unlink_inflight_locked(lk); /* nobody can adopt it any more */
        } else {
            uint64_t one = 1;
            (void)!write(lk->efd, &one, sizeof(one)); /* a fresh counter: cannot overflow */
        }
        lk->done = 1;
        pthread_mutex_unlock(&mu);
        if (orphaned)
            lookup_free(lk);
    }
    return NULL;
}

/* Queues lk for a worker, starting one when none is idle (up to RESOLVE_MAX_THREADS). Called with
 * mu held. */
static int enqueue_locked(struct lookup *lk)
{
    if (nqueued >= nidle && nthreads < RESOLVE_MAX_THREADS) { /* no idle thread left for it */
        pthread_attr_t attr;
        pthread_t t;
        sigset_t all, old;
        int rc;

        /* Signals stay with the loop's thread: the worker starts with all of them blocked. */
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        rc = pthread_create(&t, &attr, worker, NULL);
        pthread_attr_destroy(&attr);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        if (rc != 0 && nthreads == 0)
            return -1; /* no thread at all: nothing would ever run it */
        if (rc == 0)
            nthreads++;
    }
    lk->qnext = NULL;
    if (queue_tail)
        queue_tail->qnext = lk;
    else
        queue_head = lk;
    queue_tail = lk;
    nqueued++;
    pthread_cond_signal(&work);
    return 0;
}

static void unlink_inflight_locked(struct lookup *lk)
{
    for (struct lookup **p = &inflight; *p; p = &(*p)->next)
        if (*p == lk) {
            *p = lk->next;
            return;
        }
}

static void lookup_done_cb(evutil_socket_t fd, short what, void *arg)
{
    struct lookup *lk = arg;
    char err[300] = "";

    (void)fd;
    (void)what;
    pthread_mutex_lock(&mu);
    unlink_inflight_locked(lk); /* a request made from a callback starts a lookup of its own */
    pthread_mutex_unlock(&mu);
    if (lk->gai == EAI_SYSTEM)
        snprintf(err, sizeof(err), "cannot resolve '%s': %s", lk->host, strerror(lk->sys_errno));
    else if (lk->gai != 0)
        snprintf(err, sizeof(err), "cannot resolve '%s': %s", lk->host, gai_strerror(lk->gai));
    lk->delivering = 1;
    while (lk->reqs) {
        struct resolve_req *r = lk->reqs;
        lk->reqs = r->next;
        r->cb(lk->gai == 0 ? lk->res : NULL, err, r->arg);
        free(r);
    }
    event_free(lk->ev);
    lookup_free(lk);
}

static struct lookup *lookup_new(struct event_base *base, const char *host, int port)
{
    struct lookup *lk = calloc(1, sizeof(*lk));

    if (!lk)
        return NULL;
    lk->efd = -1;
    lk->base = base;
    lk->port = port;
    lk->host = strdup(host);
    if (!lk->host)
        goto fail;
    if (lookup_run(lk, AI_NUMERICHOST) == 0) { /* no name service needed: answer on the next turn */
        lk->ev = evtimer_new(base, lookup_done_cb, lk);
        if (!lk->ev)
            goto fail;
        event_active(lk->ev, EV_TIMEOUT, 0);
        return lk;
    }
    lk->gai = 0;
    lk->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (lk->efd < 0)
        goto fail;
    lk->ev = event_new(base, lk->efd, EV_READ, lookup_done_cb, lk);
    if (!lk->ev || event_add(lk->ev, NULL) < 0)
        goto fail;
    pthread_mutex_lock(&mu);
    if (enqueue_locked(lk) < 0) {
        pthread_mutex_unlock(&mu);
        goto fail;
    }
    lk->next = inflight;
    inflight = lk;
    pthread_mutex_unlock(&mu);
    return lk;
fail:
    if (lk->ev)
        event_free(lk->ev);
    lookup_free(lk);
    return NULL;
}

/* A new request takes over an orphaned lookup still running: the worker reports to the loop
 * again. Called with mu held. Returns 0 when out of memory. */
static int lookup_adopt(struct lookup *lk)
{
    lk->ev = event_new(lk->base, lk->efd, EV_READ, lookup_done_cb, lk);
    if (!lk->ev || event_add(lk->ev, NULL) < 0) {
        if (lk->ev)
            event_free(lk->ev);
        lk->ev = NULL;
        return 0;
    }
    lk->orphaned = 0;
    return 1;
}

struct resolve_req *resolve_start(struct event_base *base, const char *host, int port,
                                  resolve_cb *cb, void *arg)
{
    struct resolve_req *r = calloc(1, sizeof(*r));
    struct lookup *lk;

    if (!r)
        return NULL;
    pthread_mutex_lock(&mu);
    for (lk = inflight; lk; lk = lk->next)
        if (lk->base == base && lk->port == port && strcmp(lk->host, host) == 0)
            break;
    if (lk && lk->orphaned && !lookup_adopt(lk))
        lk = NULL;
    pthread_mutex_unlock(&mu);
    if (!lk)
        lk = lookup_new(base, host, port);
    if (!lk) {
        free(r);
        return NULL;
    }
    r->lk = lk;
    r->cb = cb;
    r->arg = arg;
    struct resolve_req **tail = &lk->reqs; /* callbacks run in the order of the requests */
    while (*tail)
        tail = &(*tail)->next;
    *tail = r;
    return r;
}

void resolve_cancel(struct resolve_req *r)
{
    struct lookup *lk;
    int done;

    if (!r)
        return;
    lk = r->lk;
    for (struct resolve_req **p = &lk->reqs; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            break;
        }
    free(r);
    if (lk->reqs || lk->delivering)
        return;
    /* Nobody waits for it any more. */
    event_free(lk->ev);
    lk->ev = NULL;
    pthread_mutex_lock(&mu);
    done = lk->done || lk->efd < 0; /* a numeric lookup never reached a worker */
    if (done)
        unlink_inflight_locked(lk);
    else
        lk->orphaned = 1; /* the worker frees it, unless a request adopts it first */
    pthread_mutex_unlock(&mu);
    if (done)
        lookup_free(lk);
}

const struct addrinfo *resolve_pick(const struct addrinfo *res)
{
    for (const struct addrinfo *a = res; a; a = a->ai_next)
        if (a->ai_family == AF_INET)
            return a;
    return res;
}

int resolve_pick_host(const struct addrinfo *res, char *out, size_t cap)
{
    const struct addrinfo *a = resolve_pick(res);

    out[0] = '\0';
    if (a)
        resolve_numeric_host(a->ai_addr, out, cap);
    return out[0] ? 0 : -1;
}

void resolve_numeric_host(const struct sockaddr *sa, char *out, size_t cap)
{
    const void *src = NULL;

    if (sa->sa_family == AF_INET)
        src = &((const struct sockaddr_in *)(const void *)sa)->sin_addr;
    else if (sa->sa_family == AF_INET6)
        src = &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr;
    if (!src || !inet_ntop(sa->sa_family, src, out, (socklen_t)cap))
        out[0] = '\0';
}
