/* slowdns.c — a name service that can stall, for tests (LD_PRELOAD=libslowdns.so).
 *
 * Every name ending in ".fgtest" resolves to 127.0.0.1; one that also begins with "two." to
 * 127.0.0.2 and then 127.0.0.1 (a name with two addresses, the first of which a server bound to
 * 127.0.0.1 refuses). When SLOWDNS_FILE names a file, each of
 * its lines "NAME MS" makes a lookup of NAME wait MS milliseconds first, as a DNS server that does
 * not answer makes getaddrinfo() wait. The file is read at every lookup, so a test can make a
 * name slow (or fast again) while the process runs. Other names go to libc unchanged. */
#include <dlfcn.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static long stall_ms(const char *node)
{
    const char *path = getenv("SLOWDNS_FILE");
    char name[256];
    long ms, found = 0;
    FILE *f;

    if (!path || !(f = fopen(path, "r")))
        return 0;
    while (fscanf(f, "%255s %ld", name, &ms) == 2)
        if (strcmp(name, node) == 0)
            found = ms;
    fclose(f);
    return found;
}

int getaddrinfo(const char *node, const char *service, const struct addrinfo *hints,
                struct addrinfo **res)
{
    typedef int gai_fn(const char *, const char *, const struct addrinfo *, struct addrinfo **);
    gai_fn *real = (gai_fn *)(uintptr_t)dlsym(RTLD_NEXT, "getaddrinfo");
    size_t n = node ? strlen(node) : 0;

    if (n > 7 && strcmp(node + n - 7, ".fgtest") == 0) {
        struct addrinfo h = {0};
        long ms;

        if (hints && (hints->ai_flags & AI_NUMERICHOST))
            return EAI_NONAME; /* a name, not an address */
        ms = stall_ms(node);
        if (ms > 0) {
            struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
            while (nanosleep(&ts, &ts) != 0)
                ;
        }
        if (hints)
            h = *hints;
        h.ai_family = AF_INET;
        h.ai_flags |= AI_NUMERICHOST;
        if (strncmp(node, "two.", 4) == 0) {
            struct addrinfo *first = NULL, *last;
            int rc = real("127.0.0.2", service, &h, &first);
            if (rc != 0)
                return rc;
            for (last = first; last->ai_next; last = last->ai_next)
                ;
            /* glibc allocates each entry on its own: freeaddrinfo() frees the joined list. */
            rc = real("127.0.0.1", service, &h, &last->ai_next);
            if (rc != 0) {
                freeaddrinfo(first);
                return rc;
            }
            *res = first;
            return 0;
        }
        return real("127.0.0.1", service, &h, res);
    }
    return real(node, service, hints, res);
}
