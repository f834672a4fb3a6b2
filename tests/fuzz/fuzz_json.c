/* fuzz_json.c — libFuzzer target: the JSON reader keeps its promises on any input, and a
 * document it accepts survives a compact re-encoding token for token. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

#define FUZZ_MAX_TOKENS 70000 /* more than one token per byte of the longest input run.sh feeds */

struct fuzz_tok {
    enum json_type type;
    size_t off; /* of the slice in its input */
    size_t len;
};

static int fuzz_is_ws(unsigned char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static int fuzz_is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

/* Checks a string or key token: it decodes into len + 1 bytes, and equals its decoding. */
static void fuzz_check_string(const struct json_token *t)
{
    char *out = malloc(t->len + 1);
    size_t n = 0;

    if (out == NULL)
        abort();
    if (json_unescape(t->ptr, t->len, out, t->len + 1, &n) != FG_OK || n > t->len || out[n] != '\0')
        abort();
    if (t->escaped != (memchr(t->ptr, '\\', t->len) != NULL))
        abort();
    if (memchr(out, '\0', n) == NULL && !json_string_equals(t, out))
        abort();
    if (n > 0 && json_unescape(t->ptr, t->len, out, n, &n) != FG_ERR_LIMIT)
        abort();
    free(out);
}

/* Checks a number token: an int64 conversion prints back to the same text. */
static void fuzz_check_number(const struct json_token *t)
{
    int64_t v = 0;
    char tmp[32];
    int rc = json_number_int64(t, &v);
    int integer = memchr(t->ptr, '.', t->len) == NULL && memchr(t->ptr, 'e', t->len) == NULL &&
                  memchr(t->ptr, 'E', t->len) == NULL;

    if (rc == FG_OK) {
        int n = snprintf(tmp, sizeof(tmp), "%lld", (long long)v);
        int neg_zero = t->len == 2 && t->ptr[0] == '-' && t->ptr[1] == '0';
        if (!integer || n <= 0)
            abort();
        if (!neg_zero && ((size_t)n != t->len || memcmp(tmp, t->ptr, t->len) != 0))
            abort();
    } else if (rc == FG_ERR_LIMIT) {
        if (!integer || t->len < 19)
            abort();
    } else if (rc != FG_ERR_PROTO || integer) {
        abort();
    }
}

/* Reads buf[0..len) to the end, checking every token; records them in toks (may be NULL).
 * Returns the final status. */
static int fuzz_read(const char *buf, size_t len, struct fuzz_tok *toks, size_t *ntoks)
{
    struct json_reader r;
    struct json_token t;
    int depth = 0;
    size_t n = 0;

    json_reader_init(&r, buf, len);
    for (;;) {
        int rc = json_next(&r, &t);
        if (rc != FG_OK) {
            if ((rc != FG_ERR_PROTO && rc != FG_ERR_LIMIT) || t.type != JSON_NONE)
                abort();
            if (json_reader_error(&r)[0] == '\0' || r.err_off > len)
                abort();
            if (rc == FG_ERR_LIMIT && depth != JSON_MAX_DEPTH)
                abort();
            if (json_next(&r, &t) != rc)
                abort();
            *ntoks = n;
            return rc;
        }
        if (t.type == JSON_END) {
            if (depth != 0 || json_next(&r, &t) != FG_OK || t.type != JSON_END)
                abort();
            *ntoks = n;
            return FG_OK;
        }
        if (n >= len || t.ptr < buf || t.len > len || (size_t)(t.ptr - buf) > len - t.len)
            abort();
        if (t.type == JSON_OBJECT_END || t.type == JSON_ARRAY_END)
            depth--;
        if (t.depth != depth || depth < 0)
            abort();
        if (t.type == JSON_OBJECT_BEGIN || t.type == JSON_ARRAY_BEGIN)
            depth++;
        if (depth > JSON_MAX_DEPTH)
            abort();
        if (t.type == JSON_STRING || t.type == JSON_KEY)
            fuzz_check_string(&t);
        if (t.type == JSON_NUMBER)
            fuzz_check_number(&t);
        if (toks != NULL) {
            if (n >= FUZZ_MAX_TOKENS)
                abort();
            toks[n].type = t.type;
            toks[n].off = (size_t)(t.ptr - buf);
            toks[n].len = t.len;
        }
        n++;
    }
}

static int fuzz_ends_value(enum json_type t)
{
    return t != JSON_OBJECT_BEGIN && t != JSON_ARRAY_BEGIN && t != JSON_KEY && t != JSON_NONE;
}

/* Writes the tokens back as compact JSON into out (at most len bytes: compact is never longer
 * than the original); returns its length. */
static size_t fuzz_reencode(const char *buf, const struct fuzz_tok *toks, size_t n, char *out,
                            size_t cap)
{
    size_t o = 0;
    enum json_type prev = JSON_NONE;

    for (size_t i = 0; i < n; i++) {
        int quoted = toks[i].type == JSON_STRING || toks[i].type == JSON_KEY;
        int closing = toks[i].type == JSON_OBJECT_END || toks[i].type == JSON_ARRAY_END;
        size_t need = toks[i].len + 4;
        if (cap - o < need)
            abort();
        if (prev == JSON_KEY)
            out[o++] = ':';
        else if (fuzz_ends_value(prev) && !closing)
            out[o++] = ',';
        if (quoted)
            out[o++] = '"';
        memcpy(out + o, buf + toks[i].off, toks[i].len);
        o += toks[i].len;
        if (quoted)
            out[o++] = '"';
        prev = toks[i].type;
    }
    return o;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct fuzz_tok toks[FUZZ_MAX_TOKENS], toks2[FUZZ_MAX_TOKENS];
    char *buf = malloc(size > 0 ? size : 1);
    size_t n = 0, n2 = 0;
    int rc;

    if (buf == NULL)
        abort();
    if (size >= FUZZ_MAX_TOKENS) {
        free(buf); /* longer than run.sh's -max_len; the token table is sized for that */
        return 0;
    }
    memcpy(buf, data, size); /* exactly size bytes, so a read past the end traps */
    rc = fuzz_read(buf, size, toks, &n);

    if (rc == FG_OK) {
        /* A compact re-encoding reads back as the same tokens. */
        char *re = malloc(size + 4);
        size_t relen;
        if (re == NULL)
            abort();
        relen = fuzz_reencode(buf, toks, n, re, size + 4);
        if (relen > size || fuzz_read(re, relen, toks2, &n2) != FG_OK || n2 != n)
            abort();
        for (size_t i = 0; i < n; i++) {
            if (toks[i].type != toks2[i].type || toks[i].len != toks2[i].len ||
                memcmp(buf + toks[i].off, re + toks2[i].off, toks[i].len) != 0)
                abort();
        }
        free(re);

        /* Dropping the last non-blank byte leaves an incomplete document, unless the document
         * is a number that still ends in a digit. */
        size_t end = size;
        while (end > 0 && fuzz_is_ws((unsigned char)buf[end - 1]))
            end--;
        int number = n == 1 && toks[0].type == JSON_NUMBER;
        if (end > 0 && !(number && end >= 2 && fuzz_is_digit((unsigned char)buf[end - 2]))) {
            size_t cut = end - 1;
            char *p = malloc(cut > 0 ? cut : 1);
            if (p == NULL)
                abort();
            memcpy(p, buf, cut);
            if (fuzz_read(p, cut, NULL, &n2) != FG_ERR_PROTO)
                abort();
            free(p);
        }
    }

    /* The first token's json_skip() reaches the end exactly when the document is valid. */
    {
        struct json_reader r;
        struct json_token t;
        json_reader_init(&r, buf, size);
        if (json_next(&r, &t) == FG_OK) {
            int src = json_skip(&r, &t);
            if (src == FG_OK) {
                src = json_next(&r, &t);
                if (src == FG_OK && t.type != JSON_END)
                    abort();
            }
            if (src != rc)
                abort();
        }
    }

    /* The lock-body reader never fails silently and agrees with the reader on syntax. */
    {
        char err[200];
        long long ttl = 0, wait = 0;
        size_t k = 0;
        int lrc = json_parse_lock_request(buf, size, &ttl, &wait, err, sizeof(err));
        while (k < size && fuzz_is_ws((unsigned char)buf[k]))
            k++;
        if (lrc == FG_OK) {
            if (ttl < -1 || wait < -1 || err[0] != '\0' || (k < size && rc != FG_OK))
                abort();
        } else {
            if (ttl != -1 || wait != -1 || err[0] == '\0' || strlen(err) >= sizeof(err))
                abort();
            for (const char *p = err; *p != '\0'; p++) {
                if ((unsigned char)*p < 0x20 || (unsigned char)*p >= 0x7f)
                    abort();
            }
            if (rc != FG_OK && size <= JSON_LOCK_MAX_BODY && strncmp(err, "invalid JSON: ", 14))
                abort();
        }
    }
    free(buf);
    return 0;
}
