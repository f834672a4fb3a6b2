/* fencehooks.h — fence on acquire across several stores: one lock_fence_hook that runs every
 * registered store's hook for a grant, in parallel, and reports once all have answered. */
#ifndef FG_FENCEHOOKS_H
#define FG_FENCEHOOKS_H

#include "lock.h"

#define FENCEHOOKS_MAX 64

struct fencehooks {
    struct {
        lock_fence_hook fn;
        void *arg;
    } hook[FENCEHOOKS_MAX];
    int n;
};

/* Adds a store's hook (same contract as lock_fence_hook). Returns 0, or -1 when full. */
int fencehooks_add(struct fencehooks *fh, lock_fence_hook fn, void *arg);

/* The combined hook; arg is the struct fencehooks. Outcome: any store failing -> status -1 (the
 * first message); else any store whose mark is at or above the token -> status 1 with the highest
 * mark; else 0. With no hooks it answers 0 at once. */
void fencehooks_run(void *arg, const char *name, uint64_t token, lock_fence_done done, void *ctx);

#endif
