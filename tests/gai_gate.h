/* gai_gate.h — a name service that stalls, for C tests of code that looks host names up.
 *
 * A test that includes it defines getaddrinfo() itself, which comes before libc's for the code the
 * test links statically: a lookup of "slow.test" waits while the gate is closed (gate(1)), at most
 * 3 s so that a caller blocking its loop on it shows as slow instead of hanging the test, then
 * names 127.0.0.1; "missing.test" names nothing; other names go to libc. slow_calls_now() counts
 * the lookups of "slow.test" that began. Header-only: each test is one program. */
#ifndef FG_GAI_GATE_H
#define FG_GAI_GATE_H

#include <dlfcn.h>
#include <netdb.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

static pthread_mutex_t g_gate_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_gate_cv = PTHREAD_COND_INITIALIZER;
static int g_gate_closed, g_slow_calls;

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res)
{
    typedef int gai_fn(const char *, const char *, const struct addrinfo *, struct addrinfo **);
    gai_fn *real = (gai_fn *)(uintptr_t)dlsym(RTLD_NEXT, "getaddrinfo");
    int numeric_only = hints && (hints->ai_flags & AI_NUMERICHOST);

    if (node && strcmp(node, "missing.test") == 0 && !numeric_only)
        return EAI_NONAME;
    if (node && strcmp(node, "slow.test") == 0) {
        struct timespec until;
        if (numeric_only)
            return EAI_NONAME; /* a name, not an address */
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 3;
        pthread_mutex_lock(&g_gate_mu);
        g_slow_calls++;
        while (g_gate_closed && pthread_cond_timedwait(&g_gate_cv, &g_gate_mu, &until) == 0)
            ;
        pthread_mutex_unlock(&g_gate_mu);
        node = "127.0.0.1";
    }
    return real(node, service, hints, res);
}

static inline void gate(int closed)
{
    pthread_mutex_lock(&g_gate_mu);
    g_gate_closed = closed;
    if (!closed)
        pthread_cond_broadcast(&g_gate_cv);
    pthread_mutex_unlock(&g_gate_mu);
}

static inline int slow_calls_now(void)
{
    pthread_mutex_lock(&g_gate_mu);
    int n = g_slow_calls;
    pthread_mutex_unlock(&g_gate_mu);
    return n;
}

#endif
