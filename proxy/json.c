/* json.c — a strict RFC 8259 JSON pull reader, string/number decoding, and the lock-body reader. */
#include "json.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* What the reader expects next. Punctuation (':' and ',') is consumed between tokens. */
enum json_state {
    JSON_ST_START = 0,    /* the document's value */
    JSON_ST_VALUE,        /* a value after ':' or after ',' in an array */
    JSON_ST_ARRAY_FIRST,  /* a value or ']' right after '[' */
    JSON_ST_OBJECT_FIRST, /* a member name or '}' right after '{' */
    JSON_ST_OBJECT_KEY,   /* a member name after ',' */
    JSON_ST_COLON,        /* ':' after a member name */
    JSON_ST_AFTER_VALUE,  /* ',' or the end of the open container */
    JSON_ST_DONE,         /* the document's value is complete; only whitespace may follow */
};

/* The outcome of decoding one unit (a raw byte sequence or an escape) of string text. */
enum json_step {
    JSON_STEP_OK = 0,
    JSON_STEP_QUOTE, /* an unescaped '"': the end of the string */
    JSON_STEP_SHORT, /* the input ends inside the unit */
    JSON_STEP_BAD,   /* not valid string text; *why says what */
};

#define JSON_SHOW_MAX 40 /* bytes of offending input quoted in an error message */

static int json_is_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static int json_is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

static int json_hex(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Describes a byte for an error message: 'x' when printable, else byte 0xNN. */
static void json_byte_desc(unsigned char c, char *out, size_t cap)
{
    if (c > 0x20 && c < 0x7f)
        snprintf(out, cap, "'%c'", c);
    else
        snprintf(out, cap, "byte 0x%02X", c);
}

/* Records a sticky error at offset off and returns code. */
static int json_fail(struct json_reader *r, int code, size_t off, const char *fmt, ...)
    FG_PRINTF(4, 5);
static int json_fail(struct json_reader *r, int code, size_t off, const char *fmt, ...)
{
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(r->errstr, sizeof(r->errstr), fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof(r->errstr))
        snprintf(r->errstr + n, sizeof(r->errstr) - (size_t)n, " at offset %zu", off);
    r->err = code;
    r->err_off = off;
    return code;
}

static int json_fail_eof(struct json_reader *r, const char *where)
{
    return json_fail(r, FG_ERR_PROTO, r->len, "unexpected end of input%s", where);
}

/* Reads 4 hex digits at s[i]: the code unit, -1 if they are not hex, -2 if s ends first. */
static long json_hex4(const unsigned char *s, size_t len, size_t i)
{
    long v = 0;
    for (size_t k = 0; k < 4; k++) {
        if (i + k >= len)
            return -2;
        int h = json_hex(s[i + k]);
        if (h < 0)
            return -1;
        v = v * 16 + h;
    }
    return v;
}

/* Length of a well-formed UTF-8 sequence at s[i] (RFC 3629: no overlongs, no surrogates, nothing
 * above U+10FFFF), 0 if the input ends inside it, -1 if it is malformed. */
static int json_utf8_len(const unsigned char *s, size_t len, size_t i)
{
    unsigned char c = s[i];
    unsigned char lo = 0x80, hi = 0xBF;
    int n;

    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else {
        return -1;
    }
    for (int k = 1; k < n; k++) {
        if (i + (size_t)k >= len)
            return 0;
        unsigned char b = s[i + (size_t)k];
        if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF))
            return -1;
    }
    return n;
}

int json_utf8_valid(const char *s, size_t len)
{
    for (size_t i = 0; i < len;) {
        int n = json_utf8_len((const unsigned char *)s, len, i);
        if (n <= 0)
            return 0;
        i += (size_t)n;
    }
    return 1;
}

/* Encodes code point cp (valid, not a surrogate) as UTF-8 into out; returns the byte count. */
static size_t json_put_utf8(unsigned long cp, unsigned char out[4])
{
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xC0 | (cp >> 6));
        out[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | (cp >> 12));
        out[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (unsigned char)(0xF0 | (cp >> 18));
    out[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decodes the unit of string text at s[i]. On JSON_STEP_OK, *adv is the bytes it spans and, if
 * enc is not NULL, enc[0..*enclen) its UTF-8 encoding (raw bytes are copied as they are, since
 * they were validated). On JSON_STEP_BAD, *why names the problem. Both the reader and
 * json_unescape() go through here, so they cannot disagree on what a string is. */
static enum json_step json_str_step(const unsigned char *s, size_t len, size_t i, size_t *adv,
                                    unsigned char enc[4], size_t *enclen, const char **why)
{
    unsigned char c = s[i];

    if (c == '"')
        return JSON_STEP_QUOTE;
    if (c < 0x20) {
        *why = "raw control character in a string (escape it)";
        return JSON_STEP_BAD;
    }
    if (c != '\\') {
        int n = json_utf8_len(s, len, i);
        if (n == 0)
            return JSON_STEP_SHORT;
        if (n < 0) {
            *why = "invalid UTF-8 in a string";
            return JSON_STEP_BAD;
        }
        if (enc != NULL) {
            memcpy(enc, s + i, (size_t)n);
            *enclen = (size_t)n;
        }
        *adv = (size_t)n;
        return JSON_STEP_OK;
    }
    if (i + 1 >= len)
        return JSON_STEP_SHORT;
    unsigned char e = s[i + 1];
    unsigned char one;
    switch (e) {
    case '"':
    case '\\':
    case '/':
        one = e;
        break;
    case 'b':
        one = '\b';
        break;
    case 'f':
        one = '\f';
        break;
    case 'n':
        one = '\n';
        break;
    case 'r':
        one = '\r';
        break;
    case 't':
        one = '\t';
        break;
    case 'u': {
        long u = json_hex4(s, len, i + 2);
        unsigned long cp;
        if (u == -2)
            return JSON_STEP_SHORT;
        if (u < 0) {
            *why = "invalid \\u escape (four hex digits expected)";
            return JSON_STEP_BAD;
        }
        *adv = 6;
        cp = (unsigned long)u;
        if (cp >= 0xDC00 && cp <= 0xDFFF) {
            *why = "lone low surrogate in a \\u escape";
            return JSON_STEP_BAD;
        }
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            long lo;
            if (i + 6 >= len || (s[i + 6] == '\\' && i + 7 >= len))
                return JSON_STEP_SHORT;
            if (s[i + 6] != '\\' || s[i + 7] != 'u') {
                *why = "lone high surrogate in a \\u escape";
                return JSON_STEP_BAD;
            }
            lo = json_hex4(s, len, i + 8);
            if (lo == -2)
                return JSON_STEP_SHORT;
            if (lo < 0) {
                *why = "invalid \\u escape (four hex digits expected)";
                return JSON_STEP_BAD;
            }
            if (lo < 0xDC00 || lo > 0xDFFF) {
                *why = "lone high surrogate in a \\u escape";
                return JSON_STEP_BAD;
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + ((unsigned long)lo - 0xDC00);
            *adv = 12;
        }
        if (enc != NULL)
            *enclen = json_put_utf8(cp, enc);
        return JSON_STEP_OK;
    }
    default:
        *why = "invalid escape in a string";
        return JSON_STEP_BAD;
    }
    if (enc != NULL) {
        enc[0] = one;
        *enclen = 1;
    }
    *adv = 2;
    return JSON_STEP_OK;
}

/* Scans the string whose opening quote is at r->pos; fills t with its inner slice. */
static int json_scan_string(struct json_reader *r, struct json_token *t, enum json_type type)
{
    const unsigned char *s = (const unsigned char *)r->buf;
    size_t start = r->pos;
    size_t i = start + 1;
    int escaped = 0;

    for (;;) {
        size_t adv = 0;
        const char *why = "";
        if (i >= r->len)
            return json_fail_eof(r, " inside a string");
        enum json_step st = json_str_step(s, r->len, i, &adv, NULL, NULL, &why);
        if (st == JSON_STEP_QUOTE)
            break;
        if (st == JSON_STEP_SHORT)
            return json_fail_eof(r, " inside a string");
        if (st == JSON_STEP_BAD)
            return json_fail(r, FG_ERR_PROTO, i, "%s", why);
        if (s[i] == '\\')
            escaped = 1;
        i += adv;
    }
    t->type = type;
    t->ptr = r->buf + start + 1;
    t->len = i - start - 1;
    t->off = start;
    t->escaped = escaped;
    r->pos = i + 1;
    return FG_OK;
}

/* Scans the number that starts at r->pos, per the RFC 8259 grammar
 * -? (0 | [1-9][0-9]*) (.[0-9]+)? ([eE][+-]?[0-9]+)? */
static int json_scan_number(struct json_reader *r, struct json_token *t)
{
    const unsigned char *s = (const unsigned char *)r->buf;
    size_t len = r->len;
    size_t i = r->pos;

    if (s[i] == '-')
        i++;
    if (i >= len)
        return json_fail_eof(r, " inside a number");
    if (s[i] == '0') {
        i++;
        if (i < len && json_is_digit(s[i]))
            return json_fail(r, FG_ERR_PROTO, i, "leading zero in a number");
    } else if (json_is_digit(s[i])) {
        while (i < len && json_is_digit(s[i]))
            i++;
    } else {
        return json_fail(r, FG_ERR_PROTO, i, "expected a digit after '-'");
    }
    if (i < len && s[i] == '.') {
        i++;
        if (i >= len)
            return json_fail_eof(r, " inside a number");
        if (!json_is_digit(s[i]))
            return json_fail(r, FG_ERR_PROTO, i, "expected a digit after '.' in a number");
        while (i < len && json_is_digit(s[i]))
            i++;
    }
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < len && (s[i] == '+' || s[i] == '-'))
            i++;
        if (i >= len)
            return json_fail_eof(r, " inside a number");
        if (!json_is_digit(s[i]))
            return json_fail(r, FG_ERR_PROTO, i, "expected a digit in a number's exponent");
        while (i < len && json_is_digit(s[i]))
            i++;
    }
    t->type = JSON_NUMBER;
    t->ptr = r->buf + r->pos;
    t->len = i - r->pos;
    t->off = r->pos;
    r->pos = i;
    return FG_OK;
}

/* Scans the literal word (true, false, null) at r->pos. */
static int json_scan_literal(struct json_reader *r, struct json_token *t, const char *word,
                             enum json_type type)
{
    size_t n = strlen(word);
    size_t have = r->len - r->pos;

    if (have < n) {
        if (memcmp(r->buf + r->pos, word, have) == 0)
            return json_fail_eof(r, "");
        n = have;
    }
    for (size_t k = 0; k < n; k++) {
        if (r->buf[r->pos + k] != word[k])
            return json_fail(r, FG_ERR_PROTO, r->pos, "invalid literal (expected %s)", word);
    }
    t->type = type;
    t->ptr = r->buf + r->pos;
    t->len = n;
    t->off = r->pos;
    r->pos += n;
    return FG_OK;
}

/* After a complete value: what comes next depends on whether a container is open. */
static void json_value_done(struct json_reader *r)
{
    r->state = r->depth == 0 ? JSON_ST_DONE : JSON_ST_AFTER_VALUE;
}

/* Reads the value starting at r->pos (not whitespace, not past the end). */
static int json_read_value(struct json_reader *r, struct json_token *t)
{
    unsigned char c = (unsigned char)r->buf[r->pos];
    char desc[16];
    int rc;

    t->depth = r->depth;
    t->escaped = 0;
    switch (c) {
    case '{':
    case '[':
        if (r->depth >= JSON_MAX_DEPTH)
            return json_fail(r, FG_ERR_LIMIT, r->pos, "nesting deeper than %d levels",
                             JSON_MAX_DEPTH);
        r->stack[r->depth++] = c;
        t->type = c == '{' ? JSON_OBJECT_BEGIN : JSON_ARRAY_BEGIN;
        t->ptr = r->buf + r->pos;
        t->len = 1;
        t->off = r->pos;
        r->pos++;
        r->state = c == '{' ? JSON_ST_OBJECT_FIRST : JSON_ST_ARRAY_FIRST;
        return FG_OK;
    case '"':
        rc = json_scan_string(r, t, JSON_STRING);
        break;
    case 't':
        rc = json_scan_literal(r, t, "true", JSON_TRUE);
        break;
    case 'f':
        rc = json_scan_literal(r, t, "false", JSON_FALSE);
        break;
    case 'n':
        rc = json_scan_literal(r, t, "null", JSON_NULL);
        break;
    default:
        if (c == '-' || json_is_digit(c)) {
            rc = json_scan_number(r, t);
            break;
        }
        json_byte_desc(c, desc, sizeof(desc));
        return json_fail(r, FG_ERR_PROTO, r->pos, "unexpected %s (expected a value)", desc);
    }
    if (rc == FG_OK)
        json_value_done(r);
    return rc;
}

/* Closes the innermost container with the byte at r->pos. */
static void json_close(struct json_reader *r, struct json_token *t)
{
    unsigned char open = r->stack[--r->depth];
    t->type = open == '{' ? JSON_OBJECT_END : JSON_ARRAY_END;
    t->ptr = r->buf + r->pos;
    t->len = 1;
    t->off = r->pos;
    t->depth = r->depth;
    t->escaped = 0;
    r->pos++;
    json_value_done(r);
}

void json_reader_init(struct json_reader *r, const char *buf, size_t len)
{
    memset(r, 0, sizeof(*r));
    r->buf = buf;
    r->len = buf == NULL ? 0 : len;
    r->state = JSON_ST_START;
}

/* Returns the next token; see json.h. Whitespace and punctuation are consumed in one bounded
 * walk over the input, so a call does work proportional to the bytes it moves past. */
int json_next(struct json_reader *r, struct json_token *t)
{
    char desc[16];

    memset(t, 0, sizeof(*t));
    if (r->err != FG_OK)
        return r->err;
    for (;;) {
        while (r->pos < r->len && json_is_ws((unsigned char)r->buf[r->pos]))
            r->pos++;
        if (r->state == JSON_ST_DONE) {
            if (r->pos < r->len) {
                json_byte_desc((unsigned char)r->buf[r->pos], desc, sizeof(desc));
                return json_fail(r, FG_ERR_PROTO, r->pos,
                                 "unexpected %s after the end of the document", desc);
            }
            t->type = JSON_END;
            t->off = r->len;
            t->ptr = r->buf == NULL ? NULL : r->buf + r->len;
            return FG_OK;
        }
        if (r->pos >= r->len) {
            if (r->state == JSON_ST_START)
                return json_fail(r, FG_ERR_PROTO, r->len, "empty document");
            return json_fail_eof(r, "");
        }
        unsigned char c = (unsigned char)r->buf[r->pos];
        int in_object = r->depth > 0 && r->stack[r->depth - 1] == '{';
        json_byte_desc(c, desc, sizeof(desc));
        switch (r->state) {
        case JSON_ST_START:
        case JSON_ST_VALUE:
            return json_read_value(r, t);
        case JSON_ST_ARRAY_FIRST:
            if (c == ']') {
                json_close(r, t);
                return FG_OK;
            }
            return json_read_value(r, t);
        case JSON_ST_OBJECT_FIRST:
        case JSON_ST_OBJECT_KEY:
            if (c == '"') {
                t->depth = r->depth;
                int rc = json_scan_string(r, t, JSON_KEY);
                if (rc == FG_OK)
                    r->state = JSON_ST_COLON;
                return rc;
            }
            if (c == '}' && r->state == JSON_ST_OBJECT_FIRST) {
                json_close(r, t);
                return FG_OK;
            }
            return json_fail(r, FG_ERR_PROTO, r->pos, "unexpected %s (expected a member name%s)",
                             desc, r->state == JSON_ST_OBJECT_FIRST ? " or '}'" : "");
        case JSON_ST_COLON:
            if (c != ':')
                return json_fail(r, FG_ERR_PROTO, r->pos, "unexpected %s (expected ':')", desc);
            r->pos++;
            r->state = JSON_ST_VALUE;
            continue;
        case JSON_ST_AFTER_VALUE:
            if (c == ',') {
                r->pos++;
                r->state = in_object ? JSON_ST_OBJECT_KEY : JSON_ST_VALUE;
                continue;
            }
            if (c == (in_object ? '}' : ']')) {
                json_close(r, t);
                return FG_OK;
            }
            return json_fail(r, FG_ERR_PROTO, r->pos, "unexpected %s (expected ',' or '%c')", desc,
                             in_object ? '}' : ']');
        default:
            return json_fail(r, FG_ERR_PROTO, r->pos, "reader used after an error");
        }
    }
}

/* Skips the rest of the value that t began; see json.h. */
int json_skip(struct json_reader *r, const struct json_token *t)
{
    struct json_token x;
    int rc;

    if (t->type == JSON_KEY) {
        rc = json_next(r, &x);
        if (rc != FG_OK)
            return rc;
        return json_skip(r, &x);
    }
    if (t->type != JSON_OBJECT_BEGIN && t->type != JSON_ARRAY_BEGIN)
        return r->err;
    /* Each call moves forward in the input, so this loop ends within r->len calls. */
    for (;;) {
        rc = json_next(r, &x);
        if (rc != FG_OK)
            return rc;
        if ((x.type == JSON_OBJECT_END || x.type == JSON_ARRAY_END) && x.depth == t->depth)
            return FG_OK;
        if (x.type == JSON_END)
            return FG_ERR_PROTO; /* t did not come from this reader's current container */
    }
}

const char *json_reader_error(const struct json_reader *r)
{
    return r->errstr;
}

/* Decodes string text; see json.h. */
int json_unescape(const char *s, size_t len, char *out, size_t cap, size_t *outlen)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, o = 0;

    *outlen = 0;
    if (cap > 0)
        out[0] = '\0';
    while (i < len) {
        unsigned char enc[4];
        size_t adv = 0, n = 0;
        const char *why = "";
        enum json_step st = json_str_step(u, len, i, &adv, enc, &n, &why);
        if (st != JSON_STEP_OK) {
            if (cap > 0)
                out[0] = '\0';
            return FG_ERR_PROTO;
        }
        if (cap == 0 || n > cap - 1 - o) {
            if (cap > 0)
                out[0] = '\0';
            return FG_ERR_LIMIT;
        }
        memcpy(out + o, enc, n);
        o += n;
        i += adv;
    }
    if (cap == 0)
        return FG_ERR_LIMIT;
    out[o] = '\0';
    *outlen = o;
    return FG_OK;
}

/* Compares the decoded text of t with want, one decoded unit at a time (no buffer needed). */
int json_string_equals(const struct json_token *t, const char *want)
{
    const unsigned char *u = (const unsigned char *)t->ptr;
    size_t wlen = strlen(want);
    size_t i = 0, o = 0;

    if (t->type != JSON_KEY && t->type != JSON_STRING)
        return 0;
    if (!t->escaped)
        return t->len == wlen && memcmp(t->ptr, want, wlen) == 0;
    while (i < t->len) {
        unsigned char enc[4];
        size_t adv = 0, n = 0;
        const char *why = "";
        if (json_str_step(u, t->len, i, &adv, enc, &n, &why) != JSON_STEP_OK)
            return 0;
        if (n > wlen - o || memcmp(want + o, enc, n) != 0)
            return 0;
        o += n;
        i += adv;
    }
    return o == wlen;
}

/* Converts an integer number token; see json.h. */
int json_number_int64(const struct json_token *t, int64_t *out)
{
    const unsigned char *s = (const unsigned char *)t->ptr;
    size_t i = 0;
    int neg = 0;
    uint64_t v = 0;
    uint64_t limit;

    if (t->type != JSON_NUMBER || t->len == 0)
        return FG_ERR_PROTO;
    if (s[0] == '-') {
        neg = 1;
        i = 1;
    }
    if (i >= t->len)
        return FG_ERR_PROTO;
    limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    for (; i < t->len; i++) {
        if (!json_is_digit(s[i]))
            return FG_ERR_PROTO; /* a fraction or an exponent */
    }
    for (i = (size_t)neg; i < t->len; i++) {
        unsigned d = s[i] - '0';
        if (v > (limit - d) / 10)
            return FG_ERR_LIMIT;
        v = v * 10 + d;
    }
    if (neg)
        *out = v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v;
    else
        *out = (int64_t)v;
    return FG_OK;
}

/* ---- The lock request body ----------------------------------------------------------------- */

/* Writes an error message into err (bounded, NUL-terminated) and returns code. */
static int json_lock_fail(char *err, size_t errlen, int code, const char *fmt, ...) FG_PRINTF(4, 5);
static int json_lock_fail(char *err, size_t errlen, int code, const char *fmt, ...)
{
    va_list ap;
    if (errlen > 0) {
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* Renders input text for an error message: at most JSON_SHOW_MAX bytes, printable ASCII as is
 * (with '"' and '\' backslashed) and anything else as \xNN, so the message is plain ASCII
 * whatever the client sent. */
static void json_show(const char *s, size_t len, char *out, size_t cap)
{
    size_t o = 0;
    size_t n = len > JSON_SHOW_MAX ? JSON_SHOW_MAX : len;

    if (cap == 0)
        return;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char tmp[8];
        int k;
        if (c == '"' || c == '\\')
            k = snprintf(tmp, sizeof(tmp), "\\%c", c);
        else if (c >= 0x20 && c < 0x7f)
            k = snprintf(tmp, sizeof(tmp), "%c", c);
        else
            k = snprintf(tmp, sizeof(tmp), "\\x%02X", c);
        if (k < 0 || (size_t)k >= cap - o)
            break;
        memcpy(out + o, tmp, (size_t)k);
        o += (size_t)k;
    }
    if (n < len && cap - o > 3) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o] = '\0';
}

/* Describes the value token t the way an error message quotes it: "abc", 1.5, an object. */
static void json_describe(const struct json_token *t, char *out, size_t cap)
{
    char shown[JSON_SHOW_MAX * 4 + 8];

    switch (t->type) {
    case JSON_OBJECT_BEGIN:
        snprintf(out, cap, "an object");
        return;
    case JSON_ARRAY_BEGIN:
        snprintf(out, cap, "an array");
        return;
    case JSON_STRING:
        json_show(t->ptr, t->len, shown, sizeof(shown));
        snprintf(out, cap, "\"%s\"", shown);
        return;
    default:
        json_show(t->ptr, t->len, shown, sizeof(shown));
        snprintf(out, cap, "%s", shown);
        return;
    }
}

/* Reads the lock request body; see json.h. Two passes: the first checks that the whole body is
 * JSON (so a syntax error is always reported as such, wherever it is), the second reads it. */
int json_parse_lock_request(const char *body, size_t len, long long *ttl_ms, long long *wait_ms,
                            char *err, size_t errlen)
{
    static const char *const names[2] = {"ttl_ms", "wait_ms"};
    long long vals[2] = {-1, -1};
    struct json_reader r;
    struct json_token t;
    char what[JSON_SHOW_MAX * 4 + 16];
    size_t k;
    int rc;

    *ttl_ms = -1;
    *wait_ms = -1;
    if (errlen > 0)
        err[0] = '\0';
    if (len > JSON_LOCK_MAX_BODY)
        return json_lock_fail(err, errlen, FG_ERR_LIMIT,
                              "request body is %zu bytes; the limit is %d bytes", len,
                              JSON_LOCK_MAX_BODY);
    for (k = 0; k < len && json_is_ws((unsigned char)body[k]); k++)
        ;
    if (k == len)
        return FG_OK;

    json_reader_init(&r, body, len);
    do {
        rc = json_next(&r, &t);
        if (rc != FG_OK)
            return json_lock_fail(err, errlen, rc, "invalid JSON: %s", json_reader_error(&r));
    } while (t.type != JSON_END);

    json_reader_init(&r, body, len);
    if (json_next(&r, &t) != FG_OK)
        return json_lock_fail(err, errlen, FG_ERR_PROTO, "invalid JSON");
    if (t.type != JSON_OBJECT_BEGIN) {
        json_describe(&t, what, sizeof(what));
        return json_lock_fail(err, errlen, FG_ERR_PROTO,
                              "request body: expected a JSON object, got %s", what);
    }
    /* The first pass proved the structure, so every json_next() below succeeds. */
    for (;;) {
        int which = -1;
        int64_t v;

        if (json_next(&r, &t) != FG_OK)
            return json_lock_fail(err, errlen, FG_ERR_PROTO, "invalid JSON");
        if (t.type == JSON_OBJECT_END)
            break;
        for (int n = 0; n < 2; n++) {
            if (json_string_equals(&t, names[n]))
                which = n;
        }
        if (which < 0) {
            json_show(t.ptr, t.len, what, sizeof(what));
            return json_lock_fail(err, errlen, FG_ERR_PROTO,
                                  "unknown key \"%s\" (expected \"ttl_ms\" or \"wait_ms\")", what);
        }
        if (vals[which] != -1)
            return json_lock_fail(err, errlen, FG_ERR_PROTO, "duplicate key \"%s\"", names[which]);
        if (json_next(&r, &t) != FG_OK)
            return json_lock_fail(err, errlen, FG_ERR_PROTO, "invalid JSON");
        json_describe(&t, what, sizeof(what));
        if (t.type != JSON_NUMBER || t.ptr[0] == '-')
            return json_lock_fail(err, errlen, FG_ERR_PROTO,
                                  "%s: expected a non-negative integer, got %s", names[which],
                                  what);
        rc = json_number_int64(&t, &v);
        if (rc == FG_ERR_LIMIT)
            return json_lock_fail(err, errlen, FG_ERR_LIMIT, "%s: %s is too large (at most %lld)",
                                  names[which], what, (long long)INT64_MAX);
        if (rc != FG_OK)
            return json_lock_fail(err, errlen, FG_ERR_PROTO,
                                  "%s: expected a non-negative integer, got %s", names[which],
                                  what);
        vals[which] = (long long)v;
    }
    *ttl_ms = vals[0];
    *wait_ms = vals[1];
    return FG_OK;
}

void json_escape(char *out, size_t cap, const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t o = 0, len = strlen(s), i = 0;

    while (i < len && o + 7 < cap) {
        unsigned char ch = u[i];
        int n = json_utf8_len(u, len, i);
        if (ch == '"' || ch == '\\') {
            out[o++] = '\\';
            out[o++] = (char)ch;
        } else if (ch < 0x20) {
            o += (size_t)snprintf(out + o, cap - o, "\\u%04x", ch);
        } else if (n <= 0) { /* not UTF-8 (a store's message, say): JSON text must be */
            o += (size_t)snprintf(out + o, cap - o, "\\ufffd");
        } else if (n > 1) {
            memcpy(out + o, s + i, (size_t)n); /* whole: n <= 4 < 7 */
            o += (size_t)n;
            i += (size_t)n;
            continue;
        } else {
            out[o++] = (char)ch;
        }
        i++;
    }
    out[o] = '\0';
}
