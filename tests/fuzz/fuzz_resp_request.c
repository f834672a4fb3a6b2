/* fuzz_resp_request.c — libFuzzer target: the request parser must agree with itself under any
 * split. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "resp.h"

#define FUZZ_COPY_MAX 4096 /* messages up to this size are copied per call, so overreads trap */

/* A digest of everything the parser reported, so two runs can be compared cheaply. */
struct fuzz_digest {
    uint64_t h;
    size_t events;
};

static void fuzz_mix(struct fuzz_digest *d, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        d->h ^= b[i];
        d->h *= 1099511628211ULL;
    }
}

static void fuzz_mix_size(struct fuzz_digest *d, size_t v)
{
    fuzz_mix(d, &v, sizeof(v));
}

static int fuzz_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* Checks what a RESP_DONE promises about the message at buf[0..avail). */
static void fuzz_check_done(const struct resp_limits *lim, const char *buf, size_t avail,
                            const struct resp_request *r)
{
    if (r->len == 0 || r->len > avail)
        abort();
    if (r->is_inline) {
        if (buf[r->len - 1] != '\n' || memchr(buf, '\n', r->len - 1) != NULL)
            abort();
        if (r->len - 1 > lim->max_inline)
            abort();
    } else if (buf[0] != '*') {
        abort();
    } else if (r->argc > lim->max_args) {
        abort();
    }
    for (size_t i = 0; i < r->argc; i++) {
        const struct resp_slice *s = &r->argv[i];
        if (s->off > r->len || s->len > r->len - s->off)
            abort();
        if (r->is_inline) {
            if (s->len == 0)
                abort();
            if (!r->has_quoted) {
                for (size_t k = 0; k < s->len; k++) {
                    if (fuzz_space(buf[s->off + k]) && buf[s->off + k] != '\v' &&
                        buf[s->off + k] != '\f')
                        abort();
                }
            }
        } else {
            if ((long long)s->len > lim->max_bulk || s->off < 2 || buf[s->off - 1] != '\n' ||
                s->off + s->len + 2 > r->len || buf[s->off + s->len] != '\r' ||
                buf[s->off + s->len + 1] != '\n')
                abort();
        }
    }
}

static void fuzz_record(struct fuzz_digest *d, int rc, const struct resp_parser *p,
                        const struct resp_request *r)
{
    d->events++;
    fuzz_mix(d, &rc, sizeof(rc));
    if (rc == RESP_DONE) {
        fuzz_mix_size(d, r->len);
        fuzz_mix_size(d, r->argc);
        fuzz_mix(d, &r->is_inline, sizeof(r->is_inline));
        fuzz_mix(d, &r->has_quoted, sizeof(r->has_quoted));
        for (size_t i = 0; i < r->argc; i++) {
            fuzz_mix_size(d, r->argv[i].off);
            fuzz_mix_size(d, r->argv[i].len);
        }
    } else if (rc == RESP_INVALID) {
        const char *e = resp_parser_error(p);
        size_t n = strlen(e);
        if (n == 0 || memchr(e, '\r', n) != NULL || memchr(e, '\n', n) != NULL)
            abort();
        fuzz_mix(d, e, n);
    }
}

/* Feeds in[0..n) in chunks (all at once when seed is 0), the way a connection would. */
static void fuzz_run(const struct resp_limits *lim, const char *in, size_t n, uint64_t seed,
                     struct fuzz_digest *d)
{
    struct resp_parser *p = resp_parser_new(lim);
    size_t base = 0, have = 0;
    int rc = RESP_PARTIAL;

    if (p == NULL)
        abort();
    d->h = 1469598103934665603ULL;
    d->events = 0;
    while (have < n && rc != RESP_INVALID) {
        if (seed == 0) {
            have = n;
        } else {
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            size_t step =
                (seed >> 60) < 12 ? 1 + (size_t)((seed >> 33) % 8) : 1 + (seed >> 33) % 512;
            have = n - have < step ? n : have + step;
        }
        while (base < have) {
            size_t avail = have - base;
            const char *buf = in + base;
            char *copy = NULL;
            struct resp_request r;
            if (avail <= FUZZ_COPY_MAX) {
                copy = malloc(avail);
                if (copy == NULL)
                    abort();
                memcpy(copy, buf, avail);
                buf = copy;
            }
            rc = resp_parse_request(p, buf, avail, &r);
            if (rc == RESP_DONE)
                fuzz_check_done(lim, buf, avail, &r);
            if (rc != RESP_PARTIAL)
                fuzz_record(d, rc, p, &r);
            free(copy);
            if (rc != RESP_DONE)
                break;
            base += r.len;
        }
    }
    fuzz_mix(d, &rc, sizeof(rc));
    fuzz_mix_size(d, base);
    resp_parser_free(p);
}

/* ---- An independent, whole-buffer reference for the multibulk form ------------------------- */

#define REF_MAX_ARGS 64

struct ref_result {
    int rc;
    size_t len;
    size_t argc;
    struct resp_slice argv[REF_MAX_ARGS];
    char err[96];
};

/* A Redis integer: "0", or an optional '-' then a non-zero digit then digits, parsed by strtoll. */
static int ref_int(const char *s, size_t n, long long *v)
{
    char tmp[32];
    size_t i;
    char *end;
    long long x;

    if (n == 0 || n > 20)
        return 0;
    memcpy(tmp, s, n);
    tmp[n] = '\0';
    i = tmp[0] == '-' ? 1 : 0;
    if (i == n)
        return 0;
    for (size_t k = i; k < n; k++) {
        if (tmp[k] < '0' || tmp[k] > '9')
            return 0;
    }
    if (tmp[i] == '0' && (i == 1 || n > 1))
        return 0;
    errno = 0;
    x = strtoll(tmp, &end, 10);
    if (errno == ERANGE || *end != '\0')
        return 0;
    *v = x;
    return 1;
}

static int ref_fail(struct ref_result *r, const char *msg)
{
    snprintf(r->err, sizeof(r->err), "%s", msg);
    return r->rc = RESP_INVALID;
}

/* Reads the "<x><int>\r\n" line at b[start]: 1 with *v and *next, 0 partial, or RESP_INVALID. */
static int ref_line(const char *b, size_t n, size_t start, long long *v, size_t *next,
                    struct ref_result *r, const char *too_big, const char *no_lf,
                    const char *bad_int)
{
    size_t cr = start;
    while (cr < n && b[cr] != '\r')
        cr++;
    if (cr - start > RESP_MAX_LINE)
        return ref_fail(r, too_big);
    if (cr >= n)
        return 0;
    if (cr + 1 >= n)
        return 0;
    if (b[cr + 1] != '\n')
        return ref_fail(r, no_lf);
    if (!ref_int(b + start + 1, cr - start - 1, v))
        return ref_fail(r, bad_int);
    *next = cr + 2;
    return 1;
}

static void ref_parse(const struct resp_limits *lim, const char *b, size_t n, struct ref_result *r)
{
    long long count, len;
    size_t pos = 0;
    int rc;

    r->rc = RESP_PARTIAL;
    r->argc = 0;
    rc = ref_line(b, n, 0, &count, &pos, r, "Protocol error: too big mbulk count string",
                  "Protocol error: expected CRLF after the multibulk length",
                  "Protocol error: invalid multibulk length");
    if (rc <= 0)
        return;
    if (count > 0 && (unsigned long long)count > lim->max_args) {
        ref_fail(r, "Protocol error: invalid multibulk length");
        return;
    }
    for (long long i = 0; i < count; i++) {
        if (pos >= n)
            return;
        if (b[pos] != '$') {
            char c = b[pos] == '\r' || b[pos] == '\n' || b[pos] == '\0' ? ' ' : b[pos];
            snprintf(r->err, sizeof(r->err), "Protocol error: expected '$', got '%c'", c);
            r->rc = RESP_INVALID;
            return;
        }
        rc = ref_line(b, n, pos, &len, &pos, r, "Protocol error: too big bulk count string",
                      "Protocol error: expected CRLF after the bulk length",
                      "Protocol error: invalid bulk length");
        if (rc <= 0)
            return;
        if (len < 0 || len > lim->max_bulk) {
            ref_fail(r, "Protocol error: invalid bulk length");
            return;
        }
        if (n - pos < (size_t)len + 2)
            return;
        if (b[pos + len] != '\r' || b[pos + len + 1] != '\n') {
            ref_fail(r, "Protocol error: expected CRLF after the bulk data");
            return;
        }
        if (r->argc < REF_MAX_ARGS) {
            r->argv[r->argc].off = pos;
            r->argv[r->argc].len = (size_t)len;
        }
        r->argc++;
        pos += (size_t)len + 2;
    }
    r->len = pos;
    r->rc = RESP_DONE;
}

/* The parser's verdict on a whole buffer starting with '*' must be the reference's. */
static void ref_compare(const struct resp_limits *lim, const char *b, size_t n)
{
    static struct ref_result ref;
    struct resp_parser *p = resp_parser_new(lim);
    struct resp_request r;
    int rc;

    if (p == NULL)
        abort();
    ref_parse(lim, b, n, &ref);
    rc = resp_parse_request(p, b, n, &r);
    if (rc != ref.rc)
        abort();
    if (rc == RESP_INVALID && strcmp(resp_parser_error(p), ref.err) != 0)
        abort();
    if (rc == RESP_DONE) {
        if (r.len != ref.len || r.argc != ref.argc || r.is_inline)
            abort();
        for (size_t i = 0; i < r.argc && i < REF_MAX_ARGS; i++) {
            if (r.argv[i].off != ref.argv[i].off || r.argv[i].len != ref.argv[i].len)
                abort();
        }
    }
    resp_parser_free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const struct resp_limits small = {.max_bulk = 8, .max_args = 4, .max_inline = 16};
    const struct resp_limits defaults = {.max_bulk = RESP_DEFAULT_MAX_BULK,
                                         .max_args = RESP_DEFAULT_MAX_ARGS,
                                         .max_inline = RESP_DEFAULT_MAX_INLINE};
    const struct resp_limits *lims[2] = {&defaults, &small};
    uint64_t seed = 1469598103934665603ULL;

    for (size_t i = 0; i < size; i++)
        seed = (seed ^ data[i]) * 1099511628211ULL;
    seed |= 1;
    for (int l = 0; l < 2; l++) {
        struct fuzz_digest whole, split;
        fuzz_run(lims[l], (const char *)data, size, 0, &whole);
        fuzz_run(lims[l], (const char *)data, size, seed, &split);
        if (whole.h != split.h || whole.events != split.events)
            abort(); /* the result depends on how the bytes arrived */
        if (size > 0 && data[0] == '*')
            ref_compare(lims[l], (const char *)data, size);
    }
    return 0;
}
