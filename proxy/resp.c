/* resp.c — pure RESP codec: resumable request parser, streaming reply scanner, header encoder. */
#include "resp.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define RESP_ARGV_FIRST 16   /* argv slots allocated when the first argument arrives */
#define RESP_ARGV_KEEP  1024 /* larger argv arrays are released before the next message */
#define RESP_ERR_SIZE   128
#define RESP_LL_MAXLEN  20 /* "-9223372036854775808"; Redis's string2ll refuses 21+ bytes */

enum resp_pstate {
    RESP_PS_START,     /* nothing of the message seen yet */
    RESP_PS_COUNT,     /* reading "*<count>\r\n" */
    RESP_PS_BULK_HDR,  /* reading "$<len>\r\n" */
    RESP_PS_BULK_DATA, /* waiting for <payload>\r\n */
    RESP_PS_INLINE,    /* waiting for the inline line's '\n' */
    RESP_PS_ERROR,     /* a protocol error was reported; only reset leaves this state */
};

struct resp_parser {
    struct resp_limits lim;
    enum resp_pstate state;
    size_t pos;     /* bytes of the current message fully parsed */
    size_t seen;    /* bytes of the line starting at pos already searched for its terminator */
    long long left; /* multibulk arguments still expected */
    long long bulk; /* payload length of the bulk being read */
    int has_quoted; /* inline message with quoted tokens */
    struct resp_slice *argv;
    size_t argc;
    size_t cap;
    char err[RESP_ERR_SIZE];
};

/* ---- Shared helpers ------------------------------------------------------------------------ */

/* Parses a whole decimal integer the way Redis's string2ll does: no sign but '-', no leading
 * zeros, no "-0", no spaces, at most 20 bytes. Returns 1 and sets *out, or 0. */
static int resp_str2ll(const char *s, size_t n, long long *out)
{
    unsigned long long v;
    size_t i = 0;
    int neg = 0;

    if (n == 0 || n > RESP_LL_MAXLEN)
        return 0;
    if (n == 1 && s[0] == '0') {
        *out = 0;
        return 1;
    }
    if (s[0] == '-') {
        neg = 1;
        i = 1;
        if (n == 1)
            return 0;
    }
    if (s[i] < '1' || s[i] > '9')
        return 0;
    v = (unsigned long long)(s[i++] - '0');
    for (; i < n; i++) {
        unsigned d;
        if (s[i] < '0' || s[i] > '9')
            return 0;
        d = (unsigned)(s[i] - '0');
        if (v > (ULLONG_MAX - d) / 10)
            return 0;
        v = v * 10 + d;
    }
    if (neg) {
        if (v > (unsigned long long)LLONG_MAX + 1)
            return 0;
        *out = -(long long)(v - 1) - 1;
    } else {
        if (v > (unsigned long long)LLONG_MAX)
            return 0;
        *out = (long long)v;
    }
    return 1;
}

/* Finds the byte `term` ending the line that starts at buf[start], allowing at most `max` bytes
 * before it. *seen remembers how much of the line was already searched, so feeding a long line in
 * small pieces stays linear. When `nul_ok` is 0 a NUL byte inside the line is an error. Returns 1
 * with *at = index of the terminator, 0 when more bytes are needed, -1 when the line is too long,
 * -2 when it holds a forbidden NUL. */
static int resp_find_term(const char *buf, size_t len, size_t start, size_t *seen, size_t max,
                          char term, int nul_ok, size_t *at)
{
    size_t window = max < SIZE_MAX - start - 1 ? start + max + 1 : SIZE_MAX;
    size_t end = len < window ? len : window;
    size_t from = start + *seen;

    if (from < end) {
        const char *hit = memchr(buf + from, term, end - from);
        size_t stop = hit ? (size_t)(hit - buf) : end;
        if (!nul_ok && memchr(buf + from, '\0', stop - from) != NULL)
            return -2;
        if (hit) {
            *seen = stop - start;
            *at = stop;
            return 1;
        }
        *seen = end - start;
    }
    return len >= window ? -1 : 0;
}

/* ---- Requests ------------------------------------------------------------------------------ */

/* Returns a parser owned by the caller (free with resp_parser_free()), or NULL when out of
 * memory. NULL limits mean the RESP_DEFAULT_* values. */
struct resp_parser *resp_parser_new(const struct resp_limits *lim)
{
    struct resp_parser *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    if (lim != NULL) {
        p->lim = *lim;
    } else {
        p->lim.max_bulk = RESP_DEFAULT_MAX_BULK;
        p->lim.max_args = RESP_DEFAULT_MAX_ARGS;
        p->lim.max_inline = RESP_DEFAULT_MAX_INLINE;
    }
    p->state = RESP_PS_START;
    return p;
}

/* Frees the parser and its argv; NULL is a no-op. */
void resp_parser_free(struct resp_parser *p)
{
    if (p == NULL)
        return;
    free(p->argv);
    free(p);
}

/* Returns the last protocol error ("" when the parser is not failed); owned by the parser. */
const char *resp_parser_error(const struct resp_parser *p)
{
    return p->state == RESP_PS_ERROR ? p->err : "";
}

/* Forgets any partial message and any error; argv memory is kept for reuse. */
void resp_parser_reset(struct resp_parser *p)
{
    p->state = RESP_PS_START;
    p->pos = 0;
    p->seen = 0;
    p->left = 0;
    p->bulk = 0;
    p->has_quoted = 0;
    p->argc = 0;
    p->err[0] = '\0';
}

/* Records a protocol error; always returns RESP_INVALID so callers can `return resp_fail(...)`. */
static int resp_fail(struct resp_parser *p, const char *msg)
{
    size_t n = strlen(msg);
    if (n >= sizeof(p->err))
        n = sizeof(p->err) - 1;
    memcpy(p->err, msg, n);
    p->err[n] = '\0';
    p->state = RESP_PS_ERROR;
    return RESP_INVALID;
}

/* Redis's "expected '$', got 'X'"; like Redis, CR and LF are shown as spaces so the error stays
 * one line (and so is NUL, which would otherwise cut the message short). */
static int resp_fail_dollar(struct resp_parser *p, char got)
{
    static const char head[] = "Protocol error: expected '$', got '";
    size_t n = sizeof(head) - 1;
    memcpy(p->err, head, n);
    p->err[n++] = (got == '\r' || got == '\n' || got == '\0') ? ' ' : got;
    p->err[n++] = '\'';
    p->err[n] = '\0';
    p->state = RESP_PS_ERROR;
    return RESP_INVALID;
}

/* Appends one slice, doubling argv only as arguments actually arrive. Returns 0 or -1. */
static int resp_push_arg(struct resp_parser *p, size_t off, size_t len)
{
    if (p->argc == p->cap) {
        size_t ncap = p->cap ? p->cap * 2 : RESP_ARGV_FIRST;
        struct resp_slice *n;
        if (ncap > SIZE_MAX / sizeof(*n))
            return -1;
        n = realloc(p->argv, ncap * sizeof(*n));
        if (n == NULL)
            return -1;
        p->argv = n;
        p->cap = ncap;
    }
    p->argv[p->argc].off = off;
    p->argv[p->argc].len = len;
    p->argc++;
    return 0;
}

static int resp_isspace(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* Splits an inline line buf[0..end) into raw token slices the way Redis's sdssplitargs() reads it:
 * blanks separate tokens, "..." allows backslash escapes, '...' allows only \', and a closing
 * quote must be followed by a blank or the end of the line. Returns 0, -1 on unbalanced quotes,
 * -2 when out of memory, -3 past max_args tokens. The line holds no NUL (checked when it was
 * found). */
static int resp_split_inline(struct resp_parser *p, const char *buf, size_t end)
{
    size_t i = 0;

    for (;;) {
        size_t start;
        int inq = 0, insq = 0, done = 0;

        while (i < end && resp_isspace(buf[i]))
            i++;
        if (i >= end || buf[i] == '\0')
            return 0; /* sdssplitargs() stops at a NUL too (though none can get here) */
        start = i;
        while (!done) {
            char c = i < end ? buf[i] : '\0';
            char next = i + 1 < end ? buf[i + 1] : '\0';
            if (inq) {
                if (c == '\\' && next != '\0') {
                    i += 2; /* "\x41" is \x then two plain bytes: same extent */
                } else if (c == '"') {
                    if (next != '\0' && !resp_isspace(next))
                        return -1;
                    i++;
                    done = 1;
                } else if (c == '\0') {
                    return -1;
                } else {
                    i++;
                }
            } else if (insq) {
                if (c == '\\' && next == '\'') {
                    i += 2;
                } else if (c == '\'') {
                    if (next != '\0' && !resp_isspace(next))
                        return -1;
                    i++;
                    done = 1;
                } else if (c == '\0') {
                    return -1;
                } else {
                    i++;
                }
            } else if (c == ' ' || c == '\n' || c == '\r' || c == '\t' || c == '\0') {
                done = 1;
            } else if (c == '"') {
                inq = 1;
                p->has_quoted = 1;
                i++;
            } else if (c == '\'') {
                insq = 1;
                p->has_quoted = 1;
                i++;
            } else {
                i++;
            }
        }
        if (p->argc >= p->lim.max_args)
            return -3;
        if (resp_push_arg(p, start, i - start) != 0)
            return -2;
    }
}

/* Fills *out with the finished message and readies the parser for the next one. */
static int resp_finish(struct resp_parser *p, struct resp_request *out, size_t len, int is_inline)
{
    out->argc = p->argc;
    out->argv = p->argv;
    out->len = len;
    out->is_inline = is_inline;
    out->has_quoted = p->has_quoted;
    resp_parser_reset(p);
    return RESP_DONE;
}

static int resp_parse_inline(struct resp_parser *p, const char *buf, size_t len,
                             struct resp_request *out)
{
    size_t nl, end;
    int rc = resp_find_term(buf, len, 0, &p->seen, p->lim.max_inline, '\n', 0, &nl);

    if (rc == 0)
        return RESP_PARTIAL;
    if (rc == -1)
        return resp_fail(p, "Protocol error: too big inline request");
    if (rc == -2)
        return resp_fail(p, "Protocol error: NUL byte in inline request");
    end = (nl > 0 && buf[nl - 1] == '\r') ? nl - 1 : nl;
    rc = resp_split_inline(p, buf, end);
    if (rc == -1)
        return resp_fail(p, "Protocol error: unbalanced quotes in request");
    if (rc == -3)
        return resp_fail(p, "Protocol error: too many arguments in inline request");
    if (rc != 0)
        return resp_fail(p, "out of memory while parsing a request");
    return resp_finish(p, out, nl + 1, 1);
}

/* Reads a "<type><integer>\r\n" header at buf[p->pos]. Returns 1 with *val and p->pos advanced
 * past the line, 0 when more bytes are needed, or RESP_INVALID. */
static int resp_read_header(struct resp_parser *p, const char *buf, size_t len, long long *val,
                            const char *too_big, const char *bad_int, const char *no_lf)
{
    size_t cr;
    int rc = resp_find_term(buf, len, p->pos, &p->seen, RESP_MAX_LINE, '\r', 1, &cr);

    if (rc == 0)
        return 0;
    if (rc < 0)
        return resp_fail(p, too_big);
    if (cr + 1 >= len)
        return 0;
    if (buf[cr + 1] != '\n')
        return resp_fail(p, no_lf);
    if (!resp_str2ll(buf + p->pos + 1, cr - p->pos - 1, val))
        return resp_fail(p, bad_int);
    p->pos = cr + 2;
    p->seen = 0;
    return 1;
}

static int resp_parse_multibulk(struct resp_parser *p, const char *buf, size_t len,
                                struct resp_request *out)
{
    long long v;
    int rc;

    if (p->state == RESP_PS_COUNT) {
        rc = resp_read_header(p, buf, len, &v, "Protocol error: too big mbulk count string",
                              "Protocol error: invalid multibulk length",
                              "Protocol error: expected CRLF after the multibulk length");
        if (rc <= 0)
            return rc == 0 ? RESP_PARTIAL : rc;
        if (v > 0 && (unsigned long long)v > p->lim.max_args)
            return resp_fail(p, "Protocol error: invalid multibulk length");
        if (v <= 0)
            return resp_finish(p, out, p->pos, 0);
        p->left = v;
        p->state = RESP_PS_BULK_HDR;
    }
    for (;;) {
        if (p->state == RESP_PS_BULK_HDR) {
            if (p->pos >= len)
                return RESP_PARTIAL;
            if (buf[p->pos] != '$')
                return resp_fail_dollar(p, buf[p->pos]);
            rc = resp_read_header(p, buf, len, &v, "Protocol error: too big bulk count string",
                                  "Protocol error: invalid bulk length",
                                  "Protocol error: expected CRLF after the bulk length");
            if (rc <= 0)
                return rc == 0 ? RESP_PARTIAL : rc;
            if (v < 0 || v > p->lim.max_bulk)
                return resp_fail(p, "Protocol error: invalid bulk length");
            p->bulk = v;
            p->state = RESP_PS_BULK_DATA;
        }
        /* The payload is never scanned: only its two terminating bytes are looked at. */
        if ((unsigned long long)(len - p->pos) < (unsigned long long)p->bulk + 2)
            return RESP_PARTIAL;
        if (buf[p->pos + (size_t)p->bulk] != '\r' || buf[p->pos + (size_t)p->bulk + 1] != '\n')
            return resp_fail(p, "Protocol error: expected CRLF after the bulk data");
        if (resp_push_arg(p, p->pos, (size_t)p->bulk) != 0)
            return resp_fail(p, "out of memory while parsing a request");
        p->pos += (size_t)p->bulk + 2;
        p->state = RESP_PS_BULK_HDR;
        if (--p->left == 0)
            return resp_finish(p, out, p->pos, 0);
    }
}

/* Parses one request starting at buf[0]. Returns RESP_DONE (with *out filled and the parser ready
 * for the next message), RESP_PARTIAL (call again with the same message start and more bytes;
 * nothing already validated is looked at again) or RESP_INVALID (resp_parser_error() has Redis's
 * wording; the parser stays failed until resp_parser_reset()). */
int resp_parse_request(struct resp_parser *p, const char *buf, size_t len, struct resp_request *out)
{
    if (p->state == RESP_PS_ERROR)
        return RESP_INVALID;
    if (p->state == RESP_PS_START) {
        if (p->cap > RESP_ARGV_KEEP) {
            free(p->argv); /* the previous message's argv is no longer promised to anyone */
            p->argv = NULL;
            p->cap = 0;
        }
        if (len == 0)
            return RESP_PARTIAL;
        p->state = buf[0] == '*' ? RESP_PS_COUNT : RESP_PS_INLINE;
    }
    if (len < p->pos)
        return RESP_PARTIAL; /* the caller lost bytes it had shown us; wait for them again */
    if (p->state == RESP_PS_INLINE)
        return resp_parse_inline(p, buf, len, out);
    return resp_parse_multibulk(p, buf, len, out);
}

/* ---- Replies ------------------------------------------------------------------------------- */

/* One reply header line, decoded. */
struct resp_hdr {
    char type;
    long long n;     /* bulk-like: payload length (-1 null); aggregate: children (-1 null);
                      * ':' value; '#' 1/0 */
    size_t text;     /* index of the line's text (after the type byte) */
    size_t text_len; /* its length */
    size_t next;     /* index just past the line's CRLF */
};

static int resp_is_bulk_type(char t)
{
    return t == '$' || t == '=' || t == '!';
}

static int resp_is_aggr_type(char t)
{
    return t == '*' || t == '~' || t == '>' || t == '%' || t == '|';
}

/* The common header, decoded in one pass: '$', '*' or ':' with a canonical non-negative number of
 * at most 18 digits (so no overflow) and its CRLF, all in buf. Returns 1 with *h filled, or 0
 * for anything else (a sign, a leading zero, a short or unusual line), which the general path
 * below then judges: both accept a line the same way. Array-of-bulk replies are mostly these. */
static int resp_reply_header_fast(const char *buf, size_t len, struct resp_hdr *h)
{
    char t = buf[0];
    long long v = 0;
    size_t i = 1;

    if (t != '$' && t != '*' && t != ':')
        return 0;
    if (len > 1 && buf[1] == '0') {
        i = 2; /* "0" alone; "01" is refused by the general path */
    } else {
        for (; i < len && i <= 18 && buf[i] >= '0' && buf[i] <= '9'; i++)
            v = v * 10 + (buf[i] - '0');
        if (i == 1)
            return 0;
    }
    if (i + 1 >= len || buf[i] != '\r' || buf[i + 1] != '\n')
        return 0;
    h->type = t;
    h->n = v;
    h->text = 1;
    h->text_len = i - 1;
    h->next = i + 2;
    return 1;
}

/* Reads and validates the reply header line at buf[0]. *seen carries the search position of an
 * unfinished line between calls. Returns 1 with *h filled, 0 when more bytes are needed, -1 when
 * the line is not RESP (unknown type, bad number, missing LF, longer than RESP_MAX_LINE). */
static int resp_reply_header(const char *buf, size_t len, size_t *seen, struct resp_hdr *h)
{
    size_t cr;
    const char *txt;
    long long v = 0;
    int rc;

    if (len == 0)
        return 0;
    if (*seen == 0 && resp_reply_header_fast(buf, len, h))
        return 1;
    h->type = buf[0];
    if (!resp_is_bulk_type(h->type) && !resp_is_aggr_type(h->type) && h->type != '+' &&
        h->type != '-' && h->type != ':' && h->type != '_' && h->type != ',' && h->type != '#' &&
        h->type != '(')
        return -1;
    rc = resp_find_term(buf, len, 0, seen, RESP_MAX_LINE, '\r', 1, &cr);
    if (rc <= 0)
        return rc;
    if (cr + 1 >= len)
        return 0;
    if (buf[cr + 1] != '\n')
        return -1;
    h->text = 1;
    h->text_len = cr - 1;
    h->next = cr + 2;
    txt = buf + 1;
    h->n = 0;
    switch (h->type) {
    case '+':
    case '-':
    case ',':
    case '(': /* Redis passes a script's big_number through as it is ("123  123") */
        return 1;
    case '_':
        return h->text_len == 0 ? 1 : -1;
    case '#':
        if (h->text_len != 1 || (txt[0] != 't' && txt[0] != 'f'))
            return -1;
        h->n = txt[0] == 't';
        return 1;
    default:
        break;
    }
    if (!resp_str2ll(txt, h->text_len, &v))
        return -1;
    if (h->type == ':') {
        h->n = v;
        return 1;
    }
    if (v < 0) {
        /* Only RESP2's null bulk "$-1" and null array "*-1" may be negative. */
        if (v != -1 || (h->type != '$' && h->type != '*'))
            return -1;
        h->n = -1;
        return 1;
    }
    if (h->type == '%') {
        if (v > LLONG_MAX / 2)
            return -1;
        v *= 2;
    } else if (h->type == '|') {
        if (v > (LLONG_MAX - 1) / 2)
            return -1;
        v = v * 2 + 1; /* the annotated element completes the attribute */
    } else if (resp_is_bulk_type(h->type) && v > LLONG_MAX - 2) {
        return -1;
    }
    h->n = v;
    return 1;
}

/* Readies an embedded scanner for the first byte of a reply; it owns no memory. remaining[] is
 * left as it is: a level is set when it opens (replies are scanned one by one, and clearing the
 * whole stack each time showed in profiles). */
void resp_scanner_init(struct resp_scanner *s)
{
    s->depth = 0;
    s->bulk_left = 0;
    s->top_type = 0;
    s->line_seen = 0;
}

/* Counts one finished element against the open aggregates, closing those it completes; a push
 * inside a reply is not an element of it. Returns 1 when that finishes the top-level reply. */
static int resp_scan_complete(struct resp_scanner *s)
{
    while (s->depth > 0) {
        if (--s->remaining[s->depth - 1] > 0)
            return 0;
        s->depth--;
        if (s->push[s->depth])
            return 0;
    }
    return 1;
}

/* Scans reply bytes from buf[0]. Returns RESP_SCAN_DONE when a whole top-level reply ends at
 * buf[*used - 1] (the scanner is ready for the next one), RESP_SCAN_MORE when every one of the
 * *used bytes belongs to an unfinished reply (an unfinished header line is not counted and must be
 * passed again), or RESP_SCAN_INVALID when the bytes are not RESP; *used then covers the bytes
 * accepted before the error, and the scanner must be re-initialised before further use. */
int resp_scan_reply(struct resp_scanner *s, const char *buf, size_t len, size_t *used)
{
    size_t pos = 0;

    *used = 0;
    if (s->depth == 0 && s->bulk_left == 0)
        s->top_type = len > 0 ? buf[0] : 0;
    for (;;) {
        struct resp_hdr h;
        int rc;

        if (s->bulk_left > 0) {
            size_t avail = len - pos;
            size_t take = (unsigned long long)avail < (unsigned long long)s->bulk_left
                              ? avail
                              : (size_t)s->bulk_left;
            /* Only the bulk's last two bytes (its CRLF) are looked at, wherever they fall. */
            long long cr = s->bulk_left - 2; /* index of the CR in this chunk; < 0 if passed */
            if (cr >= 0 && (unsigned long long)cr < take && buf[pos + (size_t)cr] != '\r') {
                *used = pos;
                return RESP_SCAN_INVALID;
            }
            if ((unsigned long long)(cr + 1) < take && buf[pos + (size_t)(cr + 1)] != '\n') {
                *used = pos;
                return RESP_SCAN_INVALID;
            }
            pos += take;
            s->bulk_left -= (long long)take;
            if (s->bulk_left > 0) {
                *used = pos;
                return RESP_SCAN_MORE;
            }
            if (resp_scan_complete(s)) {
                *used = pos;
                return RESP_SCAN_DONE;
            }
            continue;
        }
        rc = resp_reply_header(buf + pos, len - pos, &s->line_seen, &h);
        if (rc <= 0) {
            *used = pos;
            return rc == 0 ? RESP_SCAN_MORE : RESP_SCAN_INVALID;
        }
        s->line_seen = 0;
        pos += h.next;
        if (resp_is_bulk_type(h.type) && h.n >= 0) {
            if ((unsigned long long)(len - pos) < (unsigned long long)h.n + 2) {
                s->bulk_left = h.n + 2;
                continue;
            }
            /* The whole payload is here: only its CRLF is looked at. */
            if (buf[pos + (size_t)h.n] != '\r' || buf[pos + (size_t)h.n + 1] != '\n') {
                *used = pos;
                return RESP_SCAN_INVALID;
            }
            pos += (size_t)h.n + 2;
            if (resp_scan_complete(s)) {
                *used = pos;
                return RESP_SCAN_DONE;
            }
            continue;
        }
        if (resp_is_aggr_type(h.type) && h.n > 0) {
            /* An aggregate that is the last element of its parent ends exactly when its parent
             * does: it takes the parent's place (a tail call), so nesting through last elements
             * (a Lua table that contains itself, returned by a script) costs no depth. */
            int push = h.type == '>' && s->depth > 0;

            if (!push && s->depth > 0 && s->remaining[s->depth - 1] == 1) {
                s->remaining[s->depth - 1] = h.n;
                continue;
            }
            if (s->depth >= RESP_MAX_DEPTH) {
                *used = pos - h.next;
                return RESP_SCAN_INVALID;
            }
            s->push[s->depth] = (unsigned char)push;
            s->remaining[s->depth++] = h.n;
            continue;
        }
        if (resp_scan_complete(s)) {
            *used = pos;
            return RESP_SCAN_DONE;
        }
    }
}

/* Reads the element header at buf[0] of a reply held whole in memory. Returns RESP_DONE with *e
 * and *used filled (*used covers an aggregate's header only, any other element whole; maps count
 * 2 children per pair, attributes 2n + 1 with the annotated element last), RESP_PARTIAL when the
 * element is cut short, or RESP_INVALID. */
int resp_read_elem(const char *buf, size_t len, struct resp_elem *e, size_t *used)
{
    struct resp_hdr h;
    size_t seen = 0;
    int rc = resp_reply_header(buf, len, &seen, &h);

    *used = 0;
    if (rc <= 0)
        return rc == 0 ? RESP_PARTIAL : RESP_INVALID;
    memset(e, 0, sizeof(*e));
    e->type = h.type;
    if (resp_is_aggr_type(h.type)) {
        e->count = h.n;
        *used = h.next;
        return RESP_DONE;
    }
    if (resp_is_bulk_type(h.type)) {
        if (h.n < 0) {
            *used = h.next;
            return RESP_DONE;
        }
        if ((unsigned long long)(len - h.next) < (unsigned long long)h.n + 2)
            return RESP_PARTIAL;
        if (buf[h.next + (size_t)h.n] != '\r' || buf[h.next + (size_t)h.n + 1] != '\n')
            return RESP_INVALID;
        e->str = buf + h.next;
        e->len = (size_t)h.n;
        *used = h.next + (size_t)h.n + 2;
        return RESP_DONE;
    }
    if (h.type == ':' || h.type == '#') {
        e->ival = h.n;
    } else if (h.type != '_') {
        e->str = buf + h.text;
        e->len = h.text_len;
    }
    *used = h.next;
    return RESP_DONE;
}

/* Skips one whole element, children included, with the streaming scanner, so nesting costs no
 * stack. Returns RESP_DONE with *used, RESP_PARTIAL (*used 0) when the element is cut short, or
 * RESP_INVALID (*used 0), which includes nesting deeper than RESP_MAX_DEPTH (see resp.h). */
int resp_skip_elem(const char *buf, size_t len, size_t *used)
{
    struct resp_scanner s;
    size_t n = 0;
    int rc;

    resp_scanner_init(&s);
    rc = resp_scan_reply(&s, buf, len, &n);
    *used = 0;
    if (rc == RESP_SCAN_DONE) {
        *used = n;
        return RESP_DONE;
    }
    return rc == RESP_SCAN_MORE ? RESP_PARTIAL : RESP_INVALID;
}

/* ---- Encoding ------------------------------------------------------------------------------ */

/* Writes "<type><n>\r\n" into out, which must hold at least 32 bytes (the longest header is 24).
 * Returns the number of bytes written; no NUL is appended. */
size_t resp_write_header(char *out, char type, long long n)
{
    char digits[24];
    size_t nd = 0, len = 0;
    unsigned long long v = n < 0 ? 0ULL - (unsigned long long)n : (unsigned long long)n;

    do {
        digits[nd++] = (char)('0' + (int)(v % 10));
        v /= 10;
    } while (v > 0);
    out[len++] = type;
    if (n < 0)
        out[len++] = '-';
    while (nd > 0)
        out[len++] = digits[--nd];
    out[len++] = '\r';
    out[len++] = '\n';
    return len;
}
