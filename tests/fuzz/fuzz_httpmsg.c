/* fuzz_httpmsg.c — libFuzzer target: the HTTP/1.1 request- and response-head parsers and the
 * chunked decoder keep httpmsg.h's promises on any input. The input is parsed as a request head
 * and as a response head (to a HEAD request and to another) with a few max values (the answer must
 * not depend on the bytes after the head, nor on how much of the buffer is passed), and decoded as
 * a chunked body whole and in two pieces (the same data and outcome either way). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "httpmsg.h"

static int inside(const char *buf, size_t len, struct httpmsg_slice s)
{
    return s.p != NULL && s.p >= buf && s.n <= len && (size_t)(s.p - buf) <= len - s.n;
}

static int is_ws(char ch)
{
    return ch == ' ' || ch == '\t';
}

/* The fields of a parsed head of len bytes at buf: inside it, names not empty, values trimmed and
 * free of CR and NUL. */
static void check_fields(const char *buf, size_t len, const struct httpmsg_header *hs, size_t n)
{
    if (n > HTTPMSG_MAX_HEADERS)
        abort();
    for (size_t i = 0; i < n; i++) {
        const struct httpmsg_header *h = &hs[i];
        if (!inside(buf, len, h->name) || h->name.n == 0)
            abort();
        if (h->value.n > 0 && !inside(buf, len, h->value))
            abort();
        if (h->value.n > 0 && (is_ws(h->value.p[0]) || is_ws(h->value.p[h->value.n - 1])))
            abort();
        if (memchr(h->value.p, '\r', h->value.n) || memchr(h->value.p, '\0', h->value.n))
            abort();
    }
}

static void check_err(const char *err, size_t cap)
{
    if (memchr(err, '\0', cap) == NULL)
        abort();
    for (size_t i = 0; err[i]; i++)
        if ((unsigned char)err[i] < 0x20 || (unsigned char)err[i] >= 0x7f)
            abort();
}

static void fuzz_head(const char *buf, size_t len, size_t max, size_t split)
{
    static struct httpmsg_request req, req2;
    char err[96], err2[96], tiny[5];
    int status = 0, status2 = 0;
    long r, r2;

    r = httpmsg_parse_request(buf, len, max, &req, &status, err, sizeof(err));
    if (r == -1) {
        if (status != 400 && status != 431 && status != 501 && status != 505)
            abort();
        check_err(err, sizeof(err));
        if (err[0] == '\0')
            abort();
    } else if (r == 0) {
        if (len >= max)
            abort(); /* no head within max once len reached it: 431 */
    } else {
        if (r < 0 || (size_t)r > len || (size_t)r > max)
            abort();
        if (!inside(buf, (size_t)r, req.method) || !inside(buf, (size_t)r, req.target))
            abort();
        if (req.method.n == 0 || req.method.n > HTTPMSG_MAX_METHOD || req.target.n == 0)
            abort();
        if (req.minor != 0 && req.minor != 1)
            abort();
        check_fields(buf, (size_t)r, req.headers, req.nheaders);
        if (req.body == HTTPMSG_BODY_LENGTH && (req.length == 0 || req.length > INT64_MAX))
            abort();
        if (req.body == HTTPMSG_BODY_CHUNKED && !httpmsg_find(&req, "transfer-encoding", NULL))
            abort();
        if (req.body != HTTPMSG_BODY_NONE && req.body != HTTPMSG_BODY_LENGTH &&
            req.body != HTTPMSG_BODY_CHUNKED)
            abort(); /* never CLOSE for a request */
        /* The head alone gives the same answer, one byte less is "not yet". */
        if (httpmsg_parse_request(buf, (size_t)r, max, &req2, &status2, err2, sizeof(err2)) != r)
            abort();
        if (req2.nheaders != req.nheaders || req2.body != req.body || req2.length != req.length ||
            req2.keep_alive != req.keep_alive || req2.expect_continue != req.expect_continue)
            abort();
        if (httpmsg_parse_request(buf, (size_t)r - 1, max, &req2, &status2, err2, sizeof(err2)) !=
            0)
            abort();
    }

    /* A prefix: "not yet", or the same answer (refused alike: the same status and words). */
    if (split > len)
        split = len;
    status2 = 0;
    r2 = httpmsg_parse_request(buf, split, max, &req2, &status2, err2, sizeof(err2));
    if (r > 0) {
        if (r2 != (split >= (size_t)r ? r : 0))
            abort();
    } else if (r == 0) {
        if (r2 != 0)
            abort();
    } else if (r2 != 0 && (r2 != -1 || status2 != status || strcmp(err, err2) != 0)) {
        abort();
    }

    /* A tiny err buffer, and none. */
    memset(tiny, 'x', sizeof(tiny));
    r2 = httpmsg_parse_request(buf, len, max, &req2, &status2, tiny, 4);
    if (r2 != r || tiny[4] != 'x' || memchr(tiny, '\0', 4) == NULL)
        abort();
    if (httpmsg_parse_request(buf, len, max, &req2, &status2, NULL, 0) != r)
        abort();
}

static int same_response(const struct httpmsg_response *a, const struct httpmsg_response *b)
{
    if (a->minor != b->minor || a->status != b->status || a->reason.p != b->reason.p ||
        a->reason.n != b->reason.n || a->nheaders != b->nheaders || a->body != b->body ||
        a->length != b->length || a->keep_alive != b->keep_alive)
        return 0;
    for (size_t i = 0; i < a->nheaders; i++)
        if (a->headers[i].name.p != b->headers[i].name.p ||
            a->headers[i].name.n != b->headers[i].name.n ||
            a->headers[i].value.p != b->headers[i].value.p ||
            a->headers[i].value.n != b->headers[i].value.n)
            return 0;
    return 1;
}

/* Returns the answer for the whole buffer. */
static long fuzz_response(const char *buf, size_t len, size_t max, size_t split, int head_request)
{
    static struct httpmsg_response res, res2;
    char err[96], err2[96], tiny[5];
    long r, r2;

    r = httpmsg_parse_response(buf, len, max, head_request, &res, err, sizeof(err));
    if (r == -1) {
        check_err(err, sizeof(err));
        if (err[0] == '\0')
            abort();
    } else if (r == 0) {
        if (len >= max)
            abort();
    } else {
        if (r < 0 || (size_t)r > len || (size_t)r > max || (size_t)r < 13)
            abort(); /* "HTTP/1.1 200\n\n" at least, one byte aside */
        if (memcmp(buf, "HTTP/1.", 7) != 0 || buf[8] != ' ')
            abort();
        if (res.minor != buf[7] - '0' || (res.minor != 0 && res.minor != 1))
            abort();
        if (res.status < 100 || res.status > 999)
            abort();
        if (res.reason.p == NULL || res.reason.p < buf + 12 || res.reason.p > buf + r ||
            (res.reason.n > 0 && !inside(buf, (size_t)r, res.reason)))
            abort();
        if (memchr(res.reason.p, '\r', res.reason.n) || memchr(res.reason.p, '\n', res.reason.n) ||
            memchr(res.reason.p, '\0', res.reason.n))
            abort();
        check_fields(buf, (size_t)r, res.headers, res.nheaders);
        switch (res.body) {
        case HTTPMSG_BODY_NONE:
            if (res.length != 0)
                abort();
            break;
        case HTTPMSG_BODY_LENGTH:
            if (res.length == 0 || res.length > INT64_MAX)
                abort();
            break;
        case HTTPMSG_BODY_CHUNKED:
            if (res.length != 0)
                abort();
            break;
        case HTTPMSG_BODY_CLOSE:
            if (res.length != 0 || res.keep_alive)
                abort();
            break;
        default:
            abort();
        }
        if ((head_request || res.status < 200 || res.status == 204 || res.status == 304) &&
            res.body != HTTPMSG_BODY_NONE)
            abort();
        if (res.keep_alive != 0 && res.keep_alive != 1)
            abort();
        /* The head alone gives the same answer, one byte less is "not yet". */
        if (httpmsg_parse_response(buf, (size_t)r, max, head_request, &res2, err2, sizeof(err2)) !=
                r ||
            !same_response(&res, &res2))
            abort();
        if (httpmsg_parse_response(buf, (size_t)r - 1, max, head_request, &res2, err2,
                                   sizeof(err2)) != 0)
            abort();
    }

    /* A prefix: "not yet", or the same answer (refused alike: the same words). */
    if (split > len)
        split = len;
    r2 = httpmsg_parse_response(buf, split, max, head_request, &res2, err2, sizeof(err2));
    if (r > 0) {
        if (r2 != (split >= (size_t)r ? r : 0))
            abort();
    } else if (r == 0) {
        if (r2 != 0)
            abort();
    } else if (r2 != 0 && (r2 != -1 || strcmp(err, err2) != 0)) {
        abort();
    }

    /* A tiny err buffer, and none. */
    memset(tiny, 'x', sizeof(tiny));
    r2 = httpmsg_parse_response(buf, len, max, head_request, &res2, tiny, 4);
    if (r2 != r || tiny[4] != 'x' || memchr(tiny, '\0', 4) == NULL)
        abort();
    if (httpmsg_parse_response(buf, len, max, head_request, &res2, NULL, 0) != r)
        abort();
    return r;
}

static void fuzz_responses(const char *buf, size_t len, size_t max, size_t split)
{
    long get = fuzz_response(buf, len, max, split, 0);
    long head = fuzz_response(buf, len, max, split, 1);

    /* The request's method changes the body only: a head read for one is read alike for the
     * other, bar the framing fields refused for a body that a HEAD response does not have. */
    if (get > 0 && head != get)
        abort();
    if (get == 0 && head != 0)
        abort();
    if (head >= 0 && get != head && get != -1)
        abort();
    if (head == -1 && get != -1)
        abort();
}

struct decoded {
    long consumed; /* -1: refused */
    int done;
    size_t ndata;
};

/* Feeds buf[0..len) cut at split, each piece until used up or done; the data into out. */
static void fuzz_chunked_feed(const char *buf, size_t len, size_t split, char *out,
                              struct decoded *d)
{
    struct httpmsg_chunked c;
    size_t pos = 0;
    char err[64];

    httpmsg_chunked_init(&c);
    memset(d, 0, sizeof(*d));
    for (int piece = 0; piece < 2 && !d->done; piece++) {
        size_t end = piece == 0 ? split : len;
        while (pos < end && !d->done) {
            size_t off = 0, dlen = 0;
            long r = httpmsg_chunked_feed(&c, buf + pos, end - pos, &off, &dlen, &d->done, err,
                                          sizeof(err));
            if (r < 0) {
                check_err(err, sizeof(err));
                if (r != -1)
                    abort();
                d->consumed = -1;
                return;
            }
            if (r == 0 || (size_t)r > end - pos || off > (size_t)r || dlen > (size_t)r - off)
                abort();
            memcpy(out + d->ndata, buf + pos + off, dlen);
            d->ndata += dlen;
            pos += (size_t)r;
        }
    }
    if (d->done) {
        size_t off, dlen;
        int done = 0;
        /* Nothing more after the end of the body. */
        if (httpmsg_chunked_feed(&c, buf, len, &off, &dlen, &done, err, sizeof(err)) != 0 || !done)
            abort();
    }
    d->consumed = (long)pos;
}

static void fuzz_chunked(const char *buf, size_t len, size_t split)
{
    char *a = malloc(len + 1), *b = malloc(len + 1);
    struct decoded da, db;

    if (a == NULL || b == NULL)
        abort();
    if (split > len)
        split = len;
    fuzz_chunked_feed(buf, len, len, a, &da);
    fuzz_chunked_feed(buf, len, split, b, &db);
    if (da.consumed != db.consumed || da.done != db.done || da.ndata != db.ndata ||
        memcmp(a, b, da.ndata) != 0)
        abort();
    if (da.consumed >= 0 && da.ndata > (size_t)da.consumed)
        abort();
    free(a);
    free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *buf;
    size_t split;
    /* An exact copy, so that ASan catches any read past size. */
    char *copy = malloc(size ? size : 1);

    if (copy == NULL)
        return 0;
    memcpy(copy, data, size);
    buf = copy;
    split = size > 0 ? ((size_t)data[0] * 7 + (size_t)data[size - 1]) % (size + 1) : 0;

    fuzz_head(buf, size, 8192, split);
    fuzz_head(buf, size, 64, split);
    fuzz_head(buf, size, size > 1 ? size - 1 : 0, split);
    fuzz_head(buf, size, 1 + split, size / 2);
    fuzz_responses(buf, size, 8192, split);
    fuzz_responses(buf, size, 64, split);
    fuzz_responses(buf, size, size > 1 ? size - 1 : 0, split);
    fuzz_responses(buf, size, 1 + split, size / 2);
    fuzz_chunked(buf, size, split);
    free(copy);
    return 0;
}
