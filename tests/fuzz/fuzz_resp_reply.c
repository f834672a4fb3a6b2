/* fuzz_resp_reply.c — libFuzzer target: reply scanner, skipper and element reader must agree. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "resp.h"

#define FUZZ_COPY_MAX 4096 /* unconsumed bytes up to this size are copied, so overreads trap */
#define FUZZ_MAX_ENDS 4096

struct fuzz_scan {
    size_t ends[FUZZ_MAX_ENDS]; /* absolute end of each whole reply */
    char types[FUZZ_MAX_ENDS];
    size_t nends;
    int rc; /* the last status */
    size_t consumed;
};

/* Feeds in[0..n) to a scanner in chunks (all at once when seed is 0), consuming what it reports. */
static void fuzz_scan_run(const char *in, size_t n, uint64_t seed, struct fuzz_scan *out)
{
    struct resp_scanner s;
    size_t start = 0, have = 0;
    int rc = RESP_SCAN_MORE;

    resp_scanner_init(&s);
    out->nends = 0;
    while (have < n && rc != RESP_SCAN_INVALID) {
        if (seed == 0) {
            have = n;
        } else {
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            size_t step =
                (seed >> 60) < 12 ? 1 + (size_t)((seed >> 33) % 8) : 1 + (seed >> 33) % 512;
            have = n - have < step ? n : have + step;
        }
        while (start < have && out->nends < FUZZ_MAX_ENDS) {
            size_t avail = have - start, used = SIZE_MAX;
            const char *buf = in + start;
            char *copy = NULL;
            if (avail <= FUZZ_COPY_MAX) {
                copy = malloc(avail);
                if (copy == NULL)
                    abort();
                memcpy(copy, buf, avail);
                buf = copy;
            }
            rc = resp_scan_reply(&s, buf, avail, &used);
            free(copy);
            if (used > avail)
                abort();
            if (rc == RESP_SCAN_INVALID)
                break;
            start += used;
            if (rc == RESP_SCAN_MORE)
                break;
            if (rc != RESP_SCAN_DONE || used == 0 || s.depth != 0 || s.bulk_left != 0)
                abort();
            out->types[out->nends] = s.top_type;
            out->ends[out->nends++] = start;
        }
        if (out->nends == FUZZ_MAX_ENDS)
            break;
    }
    out->rc = rc;
    out->consumed = start;
}

/* Walks one reply with resp_read_elem and an explicit counter stack; returns its length, or 0
 * when the reader disagrees with itself. */
static size_t fuzz_walk(const char *buf, size_t len)
{
    /* A plain counter per open aggregate (no tail-call merging, unlike the scanner): every
     * level takes at least 4 bytes, so len / 4 + 1 entries are enough. A push inside a reply
     * is no element of its parent (push[]), as to the scanner. */
    long long *stack = malloc((len / 4 + 1) * sizeof(*stack));
    char *push = malloc(len / 4 + 1);
    size_t depth = 0, pos = 0, deepest_open = 0;

    if (!stack || !push)
        abort();

    for (;;) {
        struct resp_elem e;
        size_t used = 0, open = 0;
        if (resp_read_elem(buf + pos, len - pos, &e, &used) != RESP_DONE) {
            free(stack);
            free(push);
            return 0;
        }
        if (used == 0 || used > len - pos)
            abort();
        pos += used;
        if ((e.type == '*' || e.type == '~' || e.type == '>' || e.type == '%' || e.type == '|') &&
            e.count > 0) {
            if (depth > len / 4)
                abort();
            push[depth] = e.type == '>' && depth > 0;
            stack[depth++] = e.count;
            /* What the scanner keeps: this level, and each ancestor with more than the current
             * child to go (one in its last child is merged into it, unless that is a push). */
            open = 1;
            for (size_t i = 0; i + 1 < depth; i++)
                open += stack[i] > 1 || push[i + 1];
            if (open > deepest_open)
                deepest_open = open;
            /* the scanner accepted this reply, so it never kept more than it follows */
            if (deepest_open > RESP_MAX_DEPTH)
                abort();
            continue;
        }
        while (depth > 0 && --stack[depth - 1] == 0) {
            depth--;
            if (push[depth])
                break;
        }
        if (depth == 0) {
            free(stack);
            free(push);
            return pos;
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct fuzz_scan whole, split;
    const char *in = (const char *)data;
    uint64_t seed = 1469598103934665603ULL;
    size_t prev = 0, used;

    for (size_t i = 0; i < size; i++)
        seed = (seed ^ data[i]) * 1099511628211ULL;
    seed |= 1;
    fuzz_scan_run(in, size, 0, &whole);
    fuzz_scan_run(in, size, seed, &split);
    /* the same replies at the same places, however the bytes arrive */
    if (whole.nends != split.nends || whole.rc != split.rc ||
        memcmp(whole.ends, split.ends, whole.nends * sizeof(whole.ends[0])) != 0 ||
        memcmp(whole.types, split.types, whole.nends) != 0)
        abort();
    if (whole.rc != RESP_SCAN_INVALID && whole.consumed != split.consumed)
        abort();
    /* every whole reply is also one element to the skipper and to the reader */
    for (size_t i = 0; i < whole.nends; i++) {
        size_t len = whole.ends[i] - prev;
        if (resp_skip_elem(in + prev, size - prev, &used) != RESP_DONE || used != len)
            abort();
        if (whole.types[i] != in[prev])
            abort();
        if (fuzz_walk(in + prev, size - prev) != len)
            abort();
        prev = whole.ends[i];
    }
    /* what follows the last whole reply is cut short or broken to the skipper as well */
    if (whole.nends < FUZZ_MAX_ENDS && prev < size) {
        int rc = resp_skip_elem(in + prev, size - prev, &used);
        if (rc != (whole.rc == RESP_SCAN_INVALID ? RESP_INVALID : RESP_PARTIAL))
            abort();
    }
    return 0;
}
