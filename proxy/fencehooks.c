/* fencehooks.c — runs every store's fence hook for one grant and folds the answers into one. */
#include "fencehooks.h"

#include <stdio.h>
#include <stdlib.h>

struct fencehooks_call {
    lock_fence_done done;
    void *ctx;
    int waiting; /* hooks that have not answered yet, plus one while starting them */
    int status;
    uint64_t mark;
    char msg[256];
};

int fencehooks_add(struct fencehooks *fh, lock_fence_hook fn, void *arg)
{
    if (fh->n >= FENCEHOOKS_MAX)
        return -1;
    fh->hook[fh->n].fn = fn;
    fh->hook[fh->n].arg = arg;
    fh->n++;
    return 0;
}

static void fencehooks_answer(void *ctx, int status, uint64_t repaired_min, const char *msg)
{
    struct fencehooks_call *c = ctx;

    if (status < 0 && c->status >= 0) {
        c->status = -1;
        snprintf(c->msg, sizeof(c->msg), "%s", msg ? msg : "a store could not be fenced");
    } else if (status > 0 && c->status >= 0) {
        c->status = 1;
        if (repaired_min > c->mark)
            c->mark = repaired_min;
        if (!c->msg[0])
            snprintf(c->msg, sizeof(c->msg), "%s", msg ? msg : "a store's mark is ahead");
    }
    if (--c->waiting > 0)
        return;
    c->done(c->ctx, c->status, c->mark, c->msg[0] ? c->msg : NULL);
    free(c);
}

void fencehooks_run(void *arg, const char *name, uint64_t token, lock_fence_done done, void *ctx)
{
    struct fencehooks *fh = arg;
    struct fencehooks_call *c = calloc(1, sizeof(*c));
    int i;

    if (!c) {
        done(ctx, -1, 0, "out of memory while fencing");
        return;
    }
    c->done = done;
    c->ctx = ctx;
    c->waiting = fh->n + 1; /* the extra one keeps c alive while hooks answer synchronously */
    for (i = 0; i < fh->n; i++)
        fh->hook[i].fn(fh->hook[i].arg, name, token, fencehooks_answer, c);
    fencehooks_answer(c, 0, 0, NULL);
}
