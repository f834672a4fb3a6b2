/* heap.c — see heap.h.
 *
 * glibc gives the top of its heap back to the kernel as soon as more than 128 KiB of it is free,
 * and serves every block past a threshold (128 KiB, raised as large blocks are freed) with an mmap
 * of its own. A proxy of large values makes and drops such blocks at every request: a client's
 * request buffer, the shared upstream connection's queue. The kernel then maps, zeroes and faults
 * in fresh pages each time; ten clients' 100 KB SETs through fencegate spent half its CPU in page
 * faults and copies into new pages, at a fifth of twemproxy's rate (tests/bench/README.md,
 * "Large values"). Here blocks up to HEAP_MMAP_MAX come from the heap, freed memory stays in the
 * process while traffic flows, and malloc_trim() returns it once traffic stops, so an idle
 * sidecar stays as small as before, and every 10 s while it goes on, so a burst of large values
 * is not kept for ever by a trickle of small ones behind it. */
#include "heap.h"

#include <stdint.h>
#include <stdlib.h>

#include "metrics.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#define HEAP_TICK_MS        1000
#define HEAP_BUSY_TRIM_TICK 10         /* while traffic flows, trim every 10th tick */
#define HEAP_MMAP_MAX       (32 << 20) /* glibc's own ceiling for its moving threshold */
#define HEAP_KEEP_MAX       (64 << 20) /* free memory kept at the heap's top between trims */

struct heap_keeper {
    struct event *tick;
    uint64_t moved; /* bytes moved as of the last tick */
    int dirty;      /* bytes moved since the last trim: memory may have been freed */
    int ticks;      /* ticks since the last trim */
};

static uint64_t heap_bytes_moved(void)
{
    const uint64_t *c = fg_metrics.counter;

    return c[M_BYTES_FROM_CLIENTS] + c[M_BYTES_TO_CLIENTS] + c[M_BYTES_TO_UPSTREAM] +
           c[M_BYTES_FROM_UPSTREAM] + c[M_HTTP_REQUESTS];
}

static void heap_on_tick(evutil_socket_t fd, short what, void *arg)
{
    struct heap_keeper *k = arg;
    uint64_t moved = heap_bytes_moved();
    int quiet = moved == k->moved || (fg_metrics.gauge[G_CONNECTIONS_OPEN] == 0 &&
                                      fg_metrics.gauge[G_HTTP_CONNECTIONS_OPEN] == 0);

    (void)fd;
    (void)what;
    if (moved != k->moved)
        k->dirty = 1;
    k->moved = moved;
    if (k->dirty && (quiet || ++k->ticks >= HEAP_BUSY_TRIM_TICK)) {
#ifdef __GLIBC__
        malloc_trim(0);
#endif
        k->dirty = 0;
        k->ticks = 0;
    }
}

struct heap_keeper *heap_keeper_new(struct event_base *base)
{
    struct timeval tv = {HEAP_TICK_MS / 1000, (HEAP_TICK_MS % 1000) * 1000};
    struct heap_keeper *k = calloc(1, sizeof(*k));

    if (!k)
        return NULL;
    k->tick = event_new(base, -1, EV_PERSIST, heap_on_tick, k);
    if (!k->tick || event_add(k->tick, &tv) != 0) {
        heap_keeper_free(k);
        return NULL;
    }
    k->moved = heap_bytes_moved();
#ifdef __GLIBC__
    mallopt(M_MMAP_THRESHOLD, HEAP_MMAP_MAX);
    mallopt(M_TRIM_THRESHOLD, HEAP_KEEP_MAX);
#endif
    return k;
}

void heap_keeper_free(struct heap_keeper *k)
{
    if (!k)
        return;
    if (k->tick)
        event_free(k->tick);
    free(k);
}
