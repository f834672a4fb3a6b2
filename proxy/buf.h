/* buf.h — a byte buffer with a read cursor, grown on demand and freed when drained. */
#ifndef FG_BUF_H
#define FG_BUF_H

#include <stddef.h>

#include "fg_error.h"

struct buf {
    char *data;
    size_t start; /* first unread byte */
    size_t end;   /* one past the last byte */
    size_t cap;
};

static inline size_t buf_len(const struct buf *b)
{
    return b->end - b->start;
}

static inline char *buf_head(const struct buf *b)
{
    return b->data + b->start;
}

/* Makes room for n more bytes at the tail (compacting or growing). Returns FG_OK or FG_ERR_NOMEM.
 */
int buf_reserve(struct buf *b, size_t n) FG_MUST_CHECK;
/* Appends n bytes. Returns FG_OK or FG_ERR_NOMEM. */
int buf_append(struct buf *b, const void *p, size_t n) FG_MUST_CHECK;
/* Drops n bytes from the head; when the buffer becomes empty its memory is released, so idle
 * connections hold no buffers. */
void buf_consume(struct buf *b, size_t n);
/* Releases the memory. */
void buf_free(struct buf *b);

#endif
