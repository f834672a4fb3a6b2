/* httpmsg.c — HTTP/1.1 message framing (RFC 9112): a request head parser and a resumable chunked
 * body decoder. Pure: no I/O, no allocation, no globals; results are slices of the caller's bytes.
 *
 * The head parser reads complete lines only, in order, and never looks at a byte at or past max:
 * so its answer for a buffer depends only on the bytes of the head (and, for 0 versus 431, on
 * whether len reached max), never on what follows the head. The one look at an incomplete line is
 * the method of the request line, so that bytes that cannot start an HTTP request (a TLS
 * handshake, say) are refused before max bytes have come; the complete line is checked the same
 * way first, so the answer is the same however the bytes were split. */
#include <limits.h>
#include <string.h>

#include "httpmsg.h"

/* ---- Errors: short text with a bounded, printable excerpt of the offending bytes ------------- */

#define EXCERPT_MAX 40

struct ebuf {
    char *p;
    size_t cap;
    size_t n;
};

static void eb_char(struct ebuf *e, char ch)
{
    if (e->cap > 0 && e->n + 1 < e->cap)
        e->p[e->n++] = ch;
}

static void eb_str(struct ebuf *e, const char *s)
{
    for (; *s; s++)
        eb_char(e, *s);
}

static void eb_excerpt(struct ebuf *e, const char *p, size_t n)
{
    size_t k = n > EXCERPT_MAX ? EXCERPT_MAX : n;

    eb_char(e, '\'');
    for (size_t i = 0; i < k; i++) {
        unsigned char ch = (unsigned char)p[i];
        eb_char(e, ch >= 0x20 && ch < 0x7f ? (char)ch : '?');
    }
    if (k < n)
        eb_str(e, "...");
    eb_char(e, '\'');
}

static void eb_num(struct ebuf *e, uint64_t v)
{
    char d[24];
    size_t k = 0;

    do {
        d[k++] = (char)('0' + v % 10);
        v /= 10;
    } while (v > 0);
    while (k > 0)
        eb_char(e, d[--k]);
}

static void eb_end(struct ebuf *e)
{
    if (e->cap > 0)
        e->p[e->n] = '\0';
}

/* err = "<before>'<excerpt of p[0..n)>'<after>"; no excerpt when p is NULL. */
static void set_err(char *err, size_t errcap, const char *before, const char *p, size_t n,
                    const char *after)
{
    struct ebuf e = {err, err != NULL ? errcap : 0, 0};

    eb_str(&e, before);
    if (p != NULL)
        eb_excerpt(&e, p, n);
    eb_str(&e, after);
    eb_end(&e);
}

/* ---- Characters --------------------------------------------------------------------------- */

/* tchar of RFC 9110 §5.6.2. */
static int is_tchar(unsigned char ch)
{
    if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9'))
        return 1;
    return ch != '\0' && strchr("!#$%&'*+-.^_`|~", ch) != NULL;
}

static int is_ws(unsigned char ch)
{
    return ch == ' ' || ch == '\t';
}

static unsigned char lower(unsigned char ch)
{
    return ch >= 'A' && ch <= 'Z' ? (unsigned char)(ch + 32) : ch;
}

/* 1 when p[0..n) equals the NUL-terminated s, ignoring ASCII case. */
static int eq_nocase(const char *p, size_t n, const char *s)
{
    size_t i;

    for (i = 0; i < n; i++)
        if (s[i] == '\0' || lower((unsigned char)p[i]) != lower((unsigned char)s[i]))
            return 0;
    return s[i] == '\0';
}

/* The next element of a comma-separated list in [*p, end), trimmed of SP and HT (possibly
 * empty); *p moves past it and its comma. Returns 0 when the list is used up. */
static int list_next(const char **p, const char *end, struct httpmsg_slice *item)
{
    const char *s = *p, *c;

    if (s == NULL || s > end)
        return 0;
    c = memchr(s, ',', (size_t)(end - s));
    if (c == NULL)
        c = end;
    *p = c < end ? c + 1 : end + 1;
    while (s < c && is_ws((unsigned char)*s))
        s++;
    while (c > s && is_ws((unsigned char)c[-1]))
        c--;
    item->p = s;
    item->n = (size_t)(c - s);
    return 1;
}

/* ---- Request head ------------------------------------------------------------------------- */

static long refuse(int *status, int code, char *err, size_t errcap, const char *before,
                   const char *p, size_t n, const char *after)
{
    if (status != NULL)
        *status = code;
    set_err(err, errcap, before, p, n, after);
    return -1;
}

/* The answer when no complete head lies within min(len, max) bytes; head is "request head" or
 * "response head". */
static long incomplete(size_t len, size_t max, const char *head, int *status, char *err,
                       size_t errcap)
{
    struct ebuf e = {err, err != NULL ? errcap : 0, 0};

    if (len < max)
        return 0;
    if (status != NULL)
        *status = 431;
    eb_str(&e, head);
    eb_str(&e, " is over ");
    eb_num(&e, max);
    eb_str(&e, " bytes");
    eb_end(&e);
    return -1;
}

/* Checks the content of a complete line of a head ("request head" or "response head") for NUL and
 * bare CR. Returns 0 or -1 (refused). */
static long check_line(const char *s, size_t n, const char *head, int *status, char *err,
                       size_t errcap)
{
    if (memchr(s, '\0', n) != NULL)
        return refuse(status, 400, err, errcap, "NUL byte in the ", NULL, 0, head);
    if (memchr(s, '\r', n) != NULL)
        return refuse(status, 400, err, errcap, "CR not followed by LF in line ", s, n, "");
    return 0;
}

/* Parses the request line s[0..n) (its line end removed; complete when full, else the bytes of it
 * seen so far). Returns 0 (valid, or incomplete and valid so far), or -1 (refused). */
static long parse_request_line(const char *s, size_t n, int full, struct httpmsg_request *req,
                               int *status, char *err, size_t errcap)
{
    size_t m, t, sp;
    const char *v;

    /* The method first, also on a line not complete yet (see the top of this file). */
    for (m = 0; m < n && s[m] != ' ' && s[m] != '\r'; m++) {
        if (!is_tchar((unsigned char)s[m]))
            return refuse(status, 400, err, errcap, "request method ", s, m + 1, " is not a token");
        if (m + 1 > HTTPMSG_MAX_METHOD)
            return refuse(status, 400, err, errcap, "request method ", s, m + 1, " is too long");
    }
    if (!full)
        return 0;
    if (check_line(s, n, "request head", status, err, errcap) < 0)
        return -1;
    if (m == 0)
        return refuse(status, 400, err, errcap, "request line ", s, n, " has no method");
    if (m == n)
        return refuse(status, 400, err, errcap, "request line ", s, n, " has no target");
    /* method SP target SP version: the version is after the last SP, the target between. */
    for (sp = n; sp > m + 1 && s[sp - 1] != ' '; sp--)
        ;
    if (sp == m + 1)
        return refuse(status, 400, err, errcap, "request line ", s, n, " has no HTTP version");
    if (sp == n)
        return refuse(status, 400, err, errcap, "request line ", s, n, " ends with a space");
    t = sp - 1 - (m + 1);
    if (t == 0)
        return refuse(status, 400, err, errcap, "request line ", s, n, " has an empty target");
    for (size_t i = m + 1; i < sp - 1; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == ' ')
            return refuse(status, 400, err, errcap, "request target ", s + m + 1, t,
                          " has a space");
        if (ch < 0x21 || ch == 0x7f)
            return refuse(status, 400, err, errcap, "request target ", s + m + 1, t,
                          " has a control byte");
    }
    v = s + sp;
    if (n - sp != 8 || memcmp(v, "HTTP/", 5) != 0 || v[5] < '0' || v[5] > '9' || v[6] != '.' ||
        v[7] < '0' || v[7] > '9')
        return refuse(status, 400, err, errcap, "HTTP version ", v, n - sp, " is malformed");
    if (v[5] != '1' || (v[7] != '0' && v[7] != '1'))
        return refuse(status, 505, err, errcap, "HTTP version ", v, n - sp, " is not supported");
    req->method.p = s;
    req->method.n = m;
    req->target.p = s + m + 1;
    req->target.n = t;
    req->minor = v[7] - '0';
    return 0;
}

/* Parses the header line s[0..n) (complete, line end removed, not empty) of a head into
 * hs[*nh], the next of the fields. */
static long parse_field(const char *s, size_t n, const char *head, struct httpmsg_header *hs,
                        size_t *nh, int *status, char *err, size_t errcap)
{
    struct httpmsg_header *h;
    size_t i, b, e;

    if (check_line(s, n, head, status, err, errcap) < 0)
        return -1;
    if (is_ws((unsigned char)s[0]))
        return refuse(status, 400, err, errcap, "header line ", s, n,
                      " starts with whitespace (obsolete line folding)");
    for (i = 0; i < n && is_tchar((unsigned char)s[i]); i++)
        ;
    if (i == n)
        return refuse(status, 400, err, errcap, "header line ", s, n, " has no ':'");
    if (s[i] != ':') {
        if (is_ws((unsigned char)s[i]) && memchr(s + i, ':', n - i) != NULL)
            return refuse(status, 400, err, errcap, "header field name ", s, i,
                          " has whitespace before ':'");
        if (memchr(s + i, ':', n - i) == NULL)
            return refuse(status, 400, err, errcap, "header line ", s, n, " has no ':'");
        return refuse(status, 400, err, errcap, "header field name ", s, i + 1, " is not a token");
    }
    if (i == 0)
        return refuse(status, 400, err, errcap, "header line ", s, n, " has an empty field name");
    if (*nh >= HTTPMSG_MAX_HEADERS)
        return refuse(status, 431, err, errcap, "more than 100 header fields", NULL, 0, "");
    for (b = i + 1; b < n && is_ws((unsigned char)s[b]); b++)
        ;
    for (e = n; e > b && is_ws((unsigned char)s[e - 1]); e--)
        ;
    h = &hs[(*nh)++];
    h->name.p = s;
    h->name.n = i;
    h->value.p = s + b;
    h->value.n = e - b;
    return 0;
}

/* Parses the header fields of a head from buf[pos..lim), pos being just after the start line, up
 * to and including the empty line that ends them, into hs[0..*nh). Returns the head's length (>
 * 0); or, when the empty line is not within lim, incomplete()'s answer; or -1 (refused). */
static long parse_fields(const char *buf, size_t pos, size_t lim, size_t len, size_t max,
                         const char *head, struct httpmsg_header *hs, size_t *nh, int *status,
                         char *err, size_t errcap)
{
    for (;;) {
        const char *lf = pos < lim ? memchr(buf + pos, '\n', lim - pos) : NULL;
        size_t n;

        if (lf == NULL)
            return incomplete(len, max, head, status, err, errcap);
        n = (size_t)(lf - (buf + pos));
        if (n > 0 && buf[pos + n - 1] == '\r')
            n--;
        if (n > 0 && parse_field(buf + pos, n, head, hs, nh, status, err, errcap) < 0)
            return -1;
        pos = (size_t)(lf - buf) + 1;
        if (n == 0)
            return (long)pos;
    }
}

/* Content-Length: 1*DIGIT below 2^63. Returns 0 with *out, or -1. */
static int parse_length(const struct httpmsg_slice *v, uint64_t *out)
{
    uint64_t n = 0;

    if (v->n == 0)
        return -1;
    for (size_t i = 0; i < v->n; i++) {
        unsigned d = (unsigned char)v->p[i] - (unsigned)'0';
        if (d > 9)
            return -1;
        if (n > ((uint64_t)INT64_MAX - d) / 10)
            return -1;
        n = n * 10 + d;
    }
    *out = n;
    return 0;
}

/* The fields' Content-Length values: *cl the number when every one is valid and they are all the
 * same number, else -1 (refused). Call it only when one was sent. */
static long content_length(const struct httpmsg_header *hs, size_t nh, uint64_t *cl, int *status,
                           char *err, size_t errcap)
{
    int seen = 0;

    for (size_t i = 0; i < nh; i++) {
        const struct httpmsg_header *h = &hs[i];
        uint64_t v;

        if (!eq_nocase(h->name.p, h->name.n, "content-length"))
            continue;
        if (parse_length(&h->value, &v) < 0)
            return refuse(status, 400, err, errcap, "bad Content-Length ", h->value.p, h->value.n,
                          "");
        /* Sent twice: the same number (compared as numbers) or refused. */
        if (seen && v != *cl)
            return refuse(status, 400, err, errcap, "Content-Length sent twice, the second ",
                          h->value.p, h->value.n, " differs");
        seen = 1;
        *cl = v;
    }
    return 0;
}

/* Which framing fields hs[0..nh) has, and what its Connection fields list. */
static void scan_fields(const struct httpmsg_header *hs, size_t nh, int *has_cl, int *has_te,
                        int *close, int *keep)
{
    *has_cl = *has_te = *close = *keep = 0;
    for (size_t i = 0; i < nh; i++) {
        const struct httpmsg_header *h = &hs[i];
        const char *p = h->value.p, *end = h->value.p + h->value.n;
        struct httpmsg_slice it;

        if (eq_nocase(h->name.p, h->name.n, "content-length")) {
            *has_cl = 1;
        } else if (eq_nocase(h->name.p, h->name.n, "transfer-encoding")) {
            *has_te = 1;
        } else if (eq_nocase(h->name.p, h->name.n, "connection")) {
            while (list_next(&p, end, &it)) {
                if (eq_nocase(it.p, it.n, "close"))
                    *close = 1;
                else if (eq_nocase(it.p, it.n, "keep-alive"))
                    *keep = 1;
            }
        }
    }
}

/* What the fields say about the body and the connection, once the head is complete. */
static long read_fields(struct httpmsg_request *req, int *status, char *err, size_t errcap)
{
    int has_cl, has_te, close, keep;
    uint64_t cl = 0;

    scan_fields(req->headers, req->nheaders, &has_cl, &has_te, &close, &keep);
    if (has_cl && content_length(req->headers, req->nheaders, &cl, status, err, errcap) < 0)
        return -1;
    for (size_t i = 0; i < req->nheaders; i++) {
        const struct httpmsg_header *h = &req->headers[i];

        if (eq_nocase(h->name.p, h->name.n, "expect") &&
            eq_nocase(h->value.p, h->value.n, "100-continue"))
            req->expect_continue = 1;
    }
    req->keep_alive = req->minor == 1 ? !close : keep && !close;
    if (has_te && has_cl)
        return refuse(status, 400, err, errcap, "both Transfer-Encoding and Content-Length", NULL,
                      0, "");
    if (has_te) {
        int chunked = 0, codings = 0;

        /* The codings of every Transfer-Encoding field, in order, make one list; only a lone
         * "chunked" is supported. chunked twice is malformed (RFC 9112 §6.1), so 400, not 501. */
        for (size_t i = 0; i < req->nheaders; i++) {
            const struct httpmsg_header *h = &req->headers[i];
            const char *p = h->value.p, *end = h->value.p + h->value.n;
            struct httpmsg_slice it;

            if (!eq_nocase(h->name.p, h->name.n, "transfer-encoding"))
                continue;
            while (list_next(&p, end, &it)) {
                if (it.n == 0)
                    continue;
                codings++;
                if (!eq_nocase(it.p, it.n, "chunked"))
                    return refuse(status, 501, err, errcap, "unsupported Transfer-Encoding ", it.p,
                                  it.n, "");
                if (chunked)
                    return refuse(status, 400, err, errcap,
                                  "Transfer-Encoding has chunked more than once", NULL, 0, "");
                chunked = 1;
            }
        }
        if (codings == 0)
            return refuse(status, 400, err, errcap, "empty Transfer-Encoding", NULL, 0, "");
        req->body = HTTPMSG_BODY_CHUNKED;
        /* An HTTP/1.0 message with Transfer-Encoding has faulty framing (RFC 9112 §6.1): the
         * body is read as chunked, then the connection closed. */
        if (req->minor == 0)
            req->keep_alive = 0;
    } else if (has_cl && cl > 0) {
        req->body = HTTPMSG_BODY_LENGTH;
        req->length = cl;
    }
    return 0;
}

long httpmsg_parse_request(const char *buf, size_t len, size_t max, struct httpmsg_request *req,
                           int *status, char *err, size_t errcap)
{
    size_t lim = len < max ? len : max, pos = 0;
    const char *lf;
    long end;

    if (lim > (size_t)LONG_MAX)
        lim = (size_t)LONG_MAX;
    req->method.p = req->target.p = NULL;
    req->method.n = req->target.n = 0;
    req->minor = 0;
    req->nheaders = 0;
    req->body = HTTPMSG_BODY_NONE;
    req->length = 0;
    req->keep_alive = 0;
    req->expect_continue = 0;
    if (status != NULL)
        *status = 0;
    if (err != NULL && errcap > 0)
        err[0] = '\0';

    if (lim == 0) /* buf may be NULL then */
        return incomplete(len, max, "request head", status, err, errcap);

    /* Empty lines before the request line. */
    for (;;) {
        if (pos < lim && buf[pos] == '\n')
            pos++;
        else if (pos + 1 < lim && buf[pos] == '\r' && buf[pos + 1] == '\n')
            pos += 2;
        else
            break;
    }

    /* The request line. */
    lf = pos < lim ? memchr(buf + pos, '\n', lim - pos) : NULL;
    if (lf == NULL) {
        if (parse_request_line(buf + pos, lim - pos, 0, req, status, err, errcap) < 0)
            return -1;
        return incomplete(len, max, "request head", status, err, errcap);
    } else {
        size_t n = (size_t)(lf - (buf + pos));
        if (n > 0 && buf[pos + n - 1] == '\r')
            n--;
        if (parse_request_line(buf + pos, n, 1, req, status, err, errcap) < 0)
            return -1;
        pos = (size_t)(lf - buf) + 1;
    }

    /* Header fields, up to the empty line. */
    end = parse_fields(buf, pos, lim, len, max, "request head", req->headers, &req->nheaders,
                       status, err, errcap);
    if (end <= 0)
        return end;
    if (read_fields(req, status, err, errcap) < 0)
        return -1;
    return end;
}

int httpmsg_find(const struct httpmsg_request *req, const char *name, struct httpmsg_slice *value)
{
    for (size_t i = 0; i < req->nheaders; i++) {
        if (eq_nocase(req->headers[i].name.p, req->headers[i].name.n, name)) {
            if (value != NULL)
                *value = req->headers[i].value;
            return 1;
        }
    }
    return 0;
}

/* ---- Response head ------------------------------------------------------------------------ */

static const char resp_head[] = "response head";

/* Parses the status line s[0..n) (its line end removed; complete when full, else the bytes of it
 * seen so far) into res. Returns 0 (valid, or incomplete and valid so far), or -1 (refused). */
static long parse_status_line(const char *s, size_t n, int full, struct httpmsg_response *res,
                              char *err, size_t errcap)
{
    static const char http[] = "HTTP/";
    size_t k;

    /* "HTTP/" first, also on a line not complete yet, so that a peer that does not speak HTTP is
     * refused without waiting for max bytes. Checked the same way on the complete line first, up
     * to a CR (which might be the line end's), so the answer is the same however it was split. */
    for (k = 0; k < n && k < sizeof(http) - 1 && s[k] != '\r'; k++)
        if (s[k] != http[k])
            return refuse(NULL, 0, err, errcap, "bad status line ", s, k + 1,
                          " (it must start with HTTP/)");
    if (!full)
        return 0;
    if (check_line(s, n, resp_head, NULL, err, errcap) < 0)
        return -1;
    if (n == 0)
        return refuse(NULL, 0, err, errcap, "empty line before the status line", NULL, 0, "");
    /* HTTP/d.d SP 3DIGIT [ SP reason-phrase ] */
    for (k = 0; k < n && s[k] != ' '; k++)
        ;
    if (k != 8 || s[5] < '0' || s[5] > '9' || s[6] != '.' || s[7] < '0' || s[7] > '9')
        return refuse(NULL, 0, err, errcap, "bad status line ", s, n, "");
    if (s[5] != '1' || (s[7] != '0' && s[7] != '1'))
        return refuse(NULL, 0, err, errcap, "HTTP version ", s, 8, " is not supported");
    if (n < 12 || s[9] < '1' || s[9] > '9' || s[10] < '0' || s[10] > '9' || s[11] < '0' ||
        s[11] > '9' || (n > 12 && s[12] != ' '))
        return refuse(NULL, 0, err, errcap, "bad status line ", s, n, "");
    res->minor = s[7] - '0';
    res->status = (s[9] - '0') * 100 + (s[10] - '0') * 10 + (s[11] - '0');
    res->reason.p = n > 12 ? s + 13 : s + 12;
    res->reason.n = n > 12 ? n - 13 : 0;
    return 0;
}

/* The codings of every Transfer-Encoding field of res, in order, make one list: the body is
 * chunked when chunked is the last of them, else it runs to the close. Returns 0, or -1 (refused:
 * chunked more than once, or no codings at all). */
static long response_te(struct httpmsg_response *res, char *err, size_t errcap)
{
    int chunked = 0, codings = 0, last_chunked = 0;

    for (size_t i = 0; i < res->nheaders; i++) {
        const struct httpmsg_header *h = &res->headers[i];
        const char *p = h->value.p, *end = h->value.p + h->value.n;
        struct httpmsg_slice it;

        if (!eq_nocase(h->name.p, h->name.n, "transfer-encoding"))
            continue;
        while (list_next(&p, end, &it)) {
            if (it.n == 0)
                continue;
            codings++;
            last_chunked = eq_nocase(it.p, it.n, "chunked");
            if (last_chunked && chunked++)
                return refuse(NULL, 0, err, errcap, "Transfer-Encoding has chunked more than once",
                              NULL, 0, "");
        }
    }
    if (codings == 0)
        return refuse(NULL, 0, err, errcap, "empty Transfer-Encoding", NULL, 0, "");
    res->body = last_chunked ? HTTPMSG_BODY_CHUNKED : HTTPMSG_BODY_CLOSE;
    return 0;
}

/* What the fields say about the body and the connection, once the head is complete (RFC 9112
 * §6.3). */
static long response_fields(struct httpmsg_response *res, int head_request, char *err,
                            size_t errcap)
{
    int has_cl, has_te, close, keep;
    uint64_t cl = 0;

    scan_fields(res->headers, res->nheaders, &has_cl, &has_te, &close, &keep);
    res->keep_alive = res->minor == 1 ? !close : keep && !close;
    if (head_request || res->status < 200 || res->status == 204 || res->status == 304) {
        /* No body, whatever the fields say. */
    } else if (has_te) {
        if (response_te(res, err, errcap) < 0)
            return -1;
    } else if (has_cl) {
        if (content_length(res->headers, res->nheaders, &cl, NULL, err, errcap) < 0)
            return -1;
        if (cl > 0) {
            res->body = HTTPMSG_BODY_LENGTH;
            res->length = cl;
        }
    } else {
        res->body = HTTPMSG_BODY_CLOSE;
    }
    /* Both framings: perhaps smuggling (RFC 9112 §6.3). Transfer-Encoding in HTTP/1.0: faulty
     * framing (§6.1). A body to the close, or a switch to another protocol: the end of HTTP. */
    if ((has_te && has_cl) || (has_te && res->minor == 0) || res->body == HTTPMSG_BODY_CLOSE ||
        res->status == 101)
        res->keep_alive = 0;
    return 0;
}

long httpmsg_parse_response(const char *buf, size_t len, size_t max, int head_request,
                            struct httpmsg_response *res, char *err, size_t errcap)
{
    size_t lim = len < max ? len : max, n;
    const char *lf;
    long end;

    if (lim > (size_t)LONG_MAX)
        lim = (size_t)LONG_MAX;
    memset(res, 0, sizeof(*res));
    res->reason.p = NULL;
    res->body = HTTPMSG_BODY_NONE;
    if (err != NULL && errcap > 0)
        err[0] = '\0';

    if (lim == 0) /* buf may be NULL then */
        return incomplete(len, max, resp_head, NULL, err, errcap);

    /* The status line. */
    lf = memchr(buf, '\n', lim);
    if (lf == NULL) {
        if (parse_status_line(buf, lim, 0, res, err, errcap) < 0)
            return -1;
        return incomplete(len, max, resp_head, NULL, err, errcap);
    }
    n = (size_t)(lf - buf);
    if (n > 0 && buf[n - 1] == '\r')
        n--;
    if (parse_status_line(buf, n, 1, res, err, errcap) < 0)
        return -1;

    /* Header fields, up to the empty line. */
    end = parse_fields(buf, (size_t)(lf - buf) + 1, lim, len, max, resp_head, res->headers,
                       &res->nheaders, NULL, err, errcap);
    if (end <= 0)
        return end;
    if (response_fields(res, head_request, err, errcap) < 0)
        return -1;
    return end;
}

/* ---- Chunked body ------------------------------------------------------------------------- */

/* Whitespace between a chunk size and ';' (BWS in RFC 9112's chunk-ext grammar) is accepted;
 * whitespace before the line end is not. Extensions are skipped unparsed (any byte but NUL and a
 * bare CR), trailer lines likewise; both count against their limits. */
enum {
    CH_SIZE0 = 0, /* at the start of a chunk-size line: a hex digit must come */
    CH_SIZE,      /* in the hex digits */
    CH_BWS,       /* whitespace after the size: ';' must come */
    CH_EXT,       /* in the extensions, up to the line end */
    CH_DATA,      /* in a chunk's data */
    CH_DATA_END,  /* after a chunk's data: CRLF or LF */
    CH_TRAILER0,  /* at the start of a trailer line (an empty one ends the body) */
    CH_TRAILER,   /* in a trailer line */
    CH_DONE,
    CH_ERROR,
};

void httpmsg_chunked_init(struct httpmsg_chunked *c)
{
    memset(c, 0, sizeof(*c));
    c->state = CH_SIZE0;
}

static int hexval(unsigned char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

static long chunk_fail(struct httpmsg_chunked *c, char *err, size_t errcap, const char *before,
                       const char *p, size_t n, const char *after)
{
    c->state = CH_ERROR;
    set_err(err, errcap, before, p, n, after);
    return -1;
}

/* The end of a chunk-size line. */
static void chunk_line_end(struct httpmsg_chunked *c)
{
    c->line = 0;
    c->digits = 0;
    c->state = c->left > 0 ? CH_DATA : CH_TRAILER0;
}

long httpmsg_chunked_feed(struct httpmsg_chunked *c, const char *buf, size_t len, size_t *data_off,
                          size_t *data_len, int *done, char *err, size_t errcap)
{
    size_t i = 0;

    *data_off = 0;
    *data_len = 0;
    *done = c->state == CH_DONE;
    if (err != NULL && errcap > 0)
        err[0] = '\0';
    if (c->state == CH_ERROR)
        return chunk_fail(c, err, errcap, "chunked body already refused", NULL, 0, "");
    if (len > (size_t)LONG_MAX)
        len = (size_t)LONG_MAX;
    while (i < len && c->state != CH_DONE) {
        unsigned char ch;

        if (c->state == CH_DATA) {
            size_t n = len - i;
            if ((uint64_t)n > c->left)
                n = (size_t)c->left;
            *data_off = i;
            *data_len = n;
            c->left -= n;
            i += n;
            if (c->left == 0)
                c->state = CH_DATA_END;
            return (long)i; /* one run of data per call */
        }
        ch = (unsigned char)buf[i++];
        if (c->cr) { /* in every line state, a CR must be followed by LF */
            if (ch != '\n')
                return chunk_fail(c, err, errcap, "CR not followed by LF in a chunked body", NULL,
                                  0, "");
            c->cr = 0;
        } else if (ch == '\r' && c->state != CH_SIZE0 && c->state != CH_DATA) {
            c->cr = 1;
            if (c->state == CH_TRAILER0 || c->state == CH_TRAILER)
                c->trailers++; /* a chunk-size line's limit is on its content, a CR aside */
            if (c->state == CH_BWS)
                return chunk_fail(c, err, errcap, "whitespace before the end of a chunk-size line",
                                  NULL, 0, "");
            if (c->trailers > HTTPMSG_MAX_TRAILERS)
                return chunk_fail(c, err, errcap, "trailer section is too long", NULL, 0, "");
            continue;
        }
        /* ch is LF (after an optional CR) or any other byte. */
        switch (c->state) {
        case CH_SIZE0:
        case CH_SIZE: {
            int d = hexval(ch);
            if (d >= 0) {
                if (++c->line > HTTPMSG_MAX_CHUNK_LINE)
                    return chunk_fail(c, err, errcap, "chunk-size line is too long", NULL, 0, "");
                if (d > 0 || c->digits > 0) {
                    /* 15 significant hex digits are below 2^60; 16 are not. */
                    if (c->digits >= 15)
                        return chunk_fail(c, err, errcap, "chunk size is 2^60 or more", NULL, 0,
                                          "");
                    c->digits++;
                    c->left = c->left * 16 + (uint64_t)d;
                }
                c->state = CH_SIZE;
                break;
            }
            if (c->state == CH_SIZE0)
                return chunk_fail(c, err, errcap, "chunk size ", (const char *)&buf[i - 1], 1,
                                  " is not hexadecimal");
            if (ch == '\n') {
                chunk_line_end(c);
            } else if (ch == ';') {
                c->line++;
                c->state = CH_EXT;
            } else if (is_ws(ch)) {
                c->line++;
                c->state = CH_BWS;
            } else {
                return chunk_fail(c, err, errcap, "chunk size has ", (const char *)&buf[i - 1], 1,
                                  " after its digits");
            }
            if (c->line > HTTPMSG_MAX_CHUNK_LINE)
                return chunk_fail(c, err, errcap, "chunk-size line is too long", NULL, 0, "");
            break;
        }
        case CH_BWS:
            if (ch == '\n')
                return chunk_fail(c, err, errcap, "whitespace before the end of a chunk-size line",
                                  NULL, 0, "");
            if (++c->line > HTTPMSG_MAX_CHUNK_LINE)
                return chunk_fail(c, err, errcap, "chunk-size line is too long", NULL, 0, "");
            if (ch == ';')
                c->state = CH_EXT;
            else if (!is_ws(ch))
                return chunk_fail(c, err, errcap, "chunk size has ", (const char *)&buf[i - 1], 1,
                                  " after its digits");
            break;
        case CH_EXT:
            if (ch == '\n') {
                chunk_line_end(c);
                break;
            }
            if (ch == '\0')
                return chunk_fail(c, err, errcap, "NUL byte in a chunk extension", NULL, 0, "");
            if (++c->line > HTTPMSG_MAX_CHUNK_LINE)
                return chunk_fail(c, err, errcap, "chunk-size line is too long", NULL, 0, "");
            break;
        case CH_DATA_END:
            if (ch != '\n')
                return chunk_fail(c, err, errcap, "chunk data is followed by ",
                                  (const char *)&buf[i - 1], 1, ", not CRLF");
            c->state = CH_SIZE0;
            break;
        case CH_TRAILER0:
        case CH_TRAILER:
            if (++c->trailers > HTTPMSG_MAX_TRAILERS)
                return chunk_fail(c, err, errcap, "trailer section is too long", NULL, 0, "");
            if (ch == '\n') {
                c->state = c->state == CH_TRAILER0 ? CH_DONE : CH_TRAILER0;
                break;
            }
            if (ch == '\0')
                return chunk_fail(c, err, errcap, "NUL byte in a trailer field", NULL, 0, "");
            c->state = CH_TRAILER;
            break;
        default:
            return chunk_fail(c, err, errcap, "chunked decoder in a bad state", NULL, 0, "");
        }
    }
    *done = c->state == CH_DONE;
    return (long)i;
}
