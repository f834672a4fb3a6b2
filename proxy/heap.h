/* heap.h — how fencegate's memory goes back to the system: not at every free while traffic
 * flows, but once the sidecar is idle. */
#ifndef FG_HEAP_H
#define FG_HEAP_H

#include <event2/event.h>

struct heap_keeper;

/* Keeps freed memory in the process while requests come, and hands it back to the system at the
 * first one-second tick that finds no bytes moved since the one before, or no connection open,
 * and at every tenth tick while traffic goes on. Returns NULL when out of memory; the allocator
 * then keeps its defaults. */
struct heap_keeper *heap_keeper_new(struct event_base *base);
void heap_keeper_free(struct heap_keeper *k);

#endif
