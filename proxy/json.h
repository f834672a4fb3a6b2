/* json.h — a strict RFC 8259 JSON pull reader over a caller's buffer (no I/O, no allocation). */
#ifndef FG_JSON_H
#define FG_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "fg_error.h"

/* Declared limits. */
#define JSON_MAX_DEPTH     32          /* open objects/arrays at once; the 33rd is an error */
#define JSON_MAX_ERR       160         /* bytes of the reader's error text, NUL included */
#define JSON_LOCK_MAX_BODY (64 * 1024) /* largest body json_parse_lock_request() accepts */

enum json_type {
    JSON_NONE = 0,     /* no token (before the first call, or after an error) */
    JSON_OBJECT_BEGIN, /* '{' */
    JSON_OBJECT_END,   /* '}' */
    JSON_ARRAY_BEGIN,  /* '[' */
    JSON_ARRAY_END,    /* ']' */
    JSON_KEY,          /* a member name; the slice is the raw text between the quotes */
    JSON_STRING,       /* a string value; the slice is the raw text between the quotes */
    JSON_NUMBER,       /* a number; the slice is its text, valid per the grammar */
    JSON_TRUE,
    JSON_FALSE,
    JSON_NULL,
    JSON_END, /* the document is complete and only whitespace follows it */
};

/* One token. ptr/len is a slice of the reader's input (never NUL-terminated); for JSON_KEY and
 * JSON_STRING it excludes the quotes and is still escaped (see json_unescape()). */
struct json_token {
    enum json_type type;
    const char *ptr;
    size_t len;
    size_t off;  /* offset of the token's first byte in the input (the quote, for strings) */
    int depth;   /* containers open around the token; a container's begin/end token is outside */
    int escaped; /* strings and keys: 1 when the slice holds a backslash escape */
};

/* The reader state. Public so that callers can keep it on the stack: the reader never
 * allocates. Initialise with json_reader_init(); do not touch the fields. */
struct json_reader {
    const char *buf;
    size_t len;
    size_t pos;
    int state;
    int depth;
    unsigned char stack[JSON_MAX_DEPTH]; /* '{' or '[' per open container */
    int err;                             /* FG_OK, or the sticky error json_next() returned */
    size_t err_off;                      /* where the error was found */
    char errstr[JSON_MAX_ERR];           /* "unexpected end of input at offset 12" */
};

/* Prepares r to read the document buf[0..len). The buffer is only read, never past len, and
 * must outlive the tokens. A document is exactly one JSON value (any type, per RFC 8259) with
 * optional whitespace around it; an empty document is an error. */
void json_reader_init(struct json_reader *r, const char *buf, size_t len);

/* Reads the next token into *t. Returns FG_OK (a token, JSON_END once the whole document has
 * been read; JSON_END repeats on later calls), FG_ERR_PROTO (the input is not JSON: bad syntax,
 * a bad escape or number, a raw control character or invalid UTF-8 in a string, a lone
 * surrogate, trailing garbage, or the input ends early) or FG_ERR_LIMIT (nesting deeper than
 * JSON_MAX_DEPTH). Errors are sticky: later calls return the same code; json_reader_error()
 * says what and where. Duplicate member names are not detected here: that needs memory, and
 * what to do about them is the caller's decision. */
int json_next(struct json_reader *r, struct json_token *t) FG_MUST_CHECK;

/* After json_next() returned FG_OK with token t, skips the rest of the value t began, so that
 * the next token is the one after that value: for a begin token, up to its matching end; for a
 * key, the member's whole value; for a scalar, nothing. Returns FG_OK or the error json_next()
 * met on the way. */
int json_skip(struct json_reader *r, const struct json_token *t) FG_MUST_CHECK;

/* The reader's error text (never NULL; "" while there is no error). Valid while r lives. */
const char *json_reader_error(const struct json_reader *r);

/* Decodes the escaped string text s[0..len) (a JSON_KEY or JSON_STRING slice) into out: the
 * escapes are resolved, \uXXXX becomes UTF-8 (a surrogate pair becomes one 4-byte character)
 * and the result is NUL-terminated. The decoded text may itself hold NUL bytes (from "\u0000"):
 * use *outlen, not strlen(). The decoded length never exceeds len, so cap = len + 1 always
 * suffices. Returns FG_OK with *outlen, FG_ERR_LIMIT when the text and its NUL do not fit in cap
 * (out is then an empty string if cap > 0), or FG_ERR_PROTO when s is not valid string text
 * (cannot happen for a slice json_next() returned). */
int json_unescape(const char *s, size_t len, char *out, size_t cap, size_t *outlen) FG_MUST_CHECK;

/* Writes the NUL-terminated text s into out (cap > 0 bytes, NUL-terminated) as the inside of a
 * JSON string: quotes, backslashes and control bytes escaped, a byte that is not part of valid
 * UTF-8 as \ufffd; cut short, at a whole escape or character, when it does not fit. */
void json_escape(char *out, size_t cap, const char *s);

/* Whether the string token t (JSON_KEY or JSON_STRING) decodes to exactly the NUL-terminated
 * text want. Returns 1 or 0; any other token type gives 0. */
int json_string_equals(const struct json_token *t, const char *want);

/* Converts a JSON_NUMBER token that is an integer (no fraction and no exponent: "5e3" and "5.0"
 * are not integers here) to an int64. Returns FG_OK with *out, FG_ERR_PROTO when t is not a
 * number or not an integer, or FG_ERR_LIMIT when it is outside [INT64_MIN, INT64_MAX]. */
int json_number_int64(const struct json_token *t, int64_t *out) FG_MUST_CHECK;

/* Reads the body of POST /v1/locks/{name}: an empty body (or whitespace only), or an object with
 * the optional members "ttl_ms" and "wait_ms", each a non-negative integer. A missing member
 * leaves its output at -1. Returns FG_OK, FG_ERR_PROTO (not JSON, not an object, an unknown or
 * duplicate key, a value of the wrong type, negative or not an integer) or FG_ERR_LIMIT (the body
 * is larger than JSON_LOCK_MAX_BODY, nested deeper than JSON_MAX_DEPTH, or a number does not fit
 * in 64 bits). On error both outputs are -1 and err (errlen bytes, always NUL-terminated when
 * errlen > 0) says what was wrong, in words fit for a 400 reply, e.g.
 * wait_ms: expected a non-negative integer, got "abc". body may be NULL when len is 0. */
int json_parse_lock_request(const char *body, size_t len, long long *ttl_ms, long long *wait_ms,
                            char *err, size_t errlen) FG_MUST_CHECK;

/* 1 when s[0..len) is well-formed UTF-8 (RFC 3629), as JSON text must be. */
int json_utf8_valid(const char *s, size_t len);

#endif
