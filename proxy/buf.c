/* buf.c — a byte buffer with a read cursor, grown on demand and freed when drained. */
#include "buf.h"

#include <stdlib.h>
#include <string.h>

#define BUF_MIN 16384

int buf_reserve(struct buf *b, size_t n)
{
    size_t len = buf_len(b), cap;
    char *p;

    if (b->cap - b->end >= n)
        return FG_OK;
    if (b->start > 0 && b->cap - len >= n && b->start >= len) {
        /* Compact only when the live part is small next to the hole, so a large buffer that is
         * read a little at a time is not moved over and over. */
        memmove(b->data, b->data + b->start, len);
        b->start = 0;
        b->end = len;
        return FG_OK;
    }
    cap = b->cap ? b->cap : BUF_MIN;
    while (cap - len < n) {
        if (cap > ((size_t)-1) / 2)
            return FG_ERR_NOMEM;
        cap *= 2;
    }
    if (b->start > 0) {
        memmove(b->data, b->data + b->start, len);
        b->start = 0;
        b->end = len;
    }
    p = realloc(b->data, cap);
    if (!p)
        return FG_ERR_NOMEM;
    b->data = p;
    b->cap = cap;
    return FG_OK;
}

int buf_append(struct buf *b, const void *p, size_t n)
{
    int rc = buf_reserve(b, n);

    if (rc != FG_OK)
        return rc;
    memcpy(b->data + b->end, p, n);
    b->end += n;
    return FG_OK;
}

void buf_consume(struct buf *b, size_t n)
{
    b->start += n;
    if (b->start >= b->end)
        buf_free(b);
}

void buf_free(struct buf *b)
{
    free(b->data);
    b->data = NULL;
    b->start = b->end = b->cap = 0;
}
