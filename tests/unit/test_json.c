/* test_json.c — unit tests of the JSON pull reader, string/number decoding and the lock body. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "json.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define S(lit)       lit, sizeof(lit) - 1

/* A document with an explicit length, so that NUL bytes can be part of it. */
struct doc {
    const char *text;
    size_t len;
};

/* ---- Helpers ------------------------------------------------------------------------------- */

/* A heap copy of exactly n bytes, so that AddressSanitizer traps any read past the end. */
static char *exact_copy(const char *s, size_t n)
{
    char *p = malloc(n > 0 ? n : 1);
    assert_non_null(p);
    if (n > 0)
        memcpy(p, s, n);
    return p;
}

/* Reads the whole document; returns FG_OK once JSON_END is reached or the first error. Checks
 * on the way what every token promises: slices inside the input, depths that match the
 * nesting, and at most one token per input byte (plus the END). */
static int read_all(const char *buf, size_t len, struct json_reader *r, size_t *ntokens)
{
    struct json_token t;
    int depth = 0;
    size_t n = 0;

    json_reader_init(r, buf, len);
    for (;;) {
        int rc = json_next(r, &t);
        if (rc != FG_OK) {
            assert_int_equal(t.type, JSON_NONE);
            assert_true(json_reader_error(r)[0] != '\0');
            /* Errors are sticky. */
            assert_int_equal(json_next(r, &t), rc);
            if (ntokens != NULL)
                *ntokens = n;
            return rc;
        }
        n++;
        assert_true(n <= len + 1);
        if (t.type == JSON_END) {
            assert_int_equal(depth, 0);
            assert_string_equal(json_reader_error(r), "");
            /* END repeats. */
            assert_int_equal(json_next(r, &t), FG_OK);
            assert_int_equal(t.type, JSON_END);
            if (ntokens != NULL)
                *ntokens = n;
            return FG_OK;
        }
        assert_true(t.ptr >= buf && t.len <= len && (size_t)(t.ptr - buf) <= len - t.len);
        assert_true(t.off < len);
        if (t.type == JSON_OBJECT_END || t.type == JSON_ARRAY_END)
            depth--;
        assert_int_equal(t.depth, depth);
        if (t.type == JSON_OBJECT_BEGIN || t.type == JSON_ARRAY_BEGIN)
            depth++;
        assert_true(depth >= 0 && depth <= JSON_MAX_DEPTH);
    }
}

/* Renders the token stream of a document as text: { } [ ] K:raw S:raw N:raw t f n $. Errors end
 * the text with "!<code>". */
static void render(const char *buf, size_t len, char *out, size_t cap)
{
    struct json_reader r;
    struct json_token t;
    size_t o = 0;

    json_reader_init(&r, buf, len);
    out[0] = '\0';
    for (;;) {
        int rc = json_next(&r, &t);
        int k;
        if (rc != FG_OK) {
            k = snprintf(out + o, cap - o, "!%d", rc);
            assert_true(k > 0 && (size_t)k < cap - o);
            return;
        }
        switch (t.type) {
        case JSON_OBJECT_BEGIN:
            k = snprintf(out + o, cap - o, "{ ");
            break;
        case JSON_OBJECT_END:
            k = snprintf(out + o, cap - o, "} ");
            break;
        case JSON_ARRAY_BEGIN:
            k = snprintf(out + o, cap - o, "[ ");
            break;
        case JSON_ARRAY_END:
            k = snprintf(out + o, cap - o, "] ");
            break;
        case JSON_KEY:
            k = snprintf(out + o, cap - o, "K:%.*s ", (int)t.len, t.ptr);
            break;
        case JSON_STRING:
            k = snprintf(out + o, cap - o, "S:%.*s ", (int)t.len, t.ptr);
            break;
        case JSON_NUMBER:
            k = snprintf(out + o, cap - o, "N:%.*s ", (int)t.len, t.ptr);
            break;
        case JSON_TRUE:
            k = snprintf(out + o, cap - o, "t ");
            break;
        case JSON_FALSE:
            k = snprintf(out + o, cap - o, "f ");
            break;
        case JSON_NULL:
            k = snprintf(out + o, cap - o, "n ");
            break;
        case JSON_END:
            k = snprintf(out + o, cap - o, "$");
            assert_true(k > 0 && (size_t)k < cap - o);
            return;
        default:
            fail_msg("unexpected token type %d", (int)t.type);
            return;
        }
        assert_true(k > 0 && (size_t)k < cap - o);
        o += (size_t)k;
    }
}

static char *repeat(const char *open, size_t n, const char *middle, const char *close)
{
    size_t lo = strlen(open), lm = strlen(middle), lc = strlen(close);
    char *s = malloc(n * (lo + lc) + lm + 1);
    size_t o = 0;
    assert_non_null(s);
    for (size_t i = 0; i < n; i++, o += lo)
        memcpy(s + o, open, lo);
    memcpy(s + o, middle, lm);
    o += lm;
    for (size_t i = 0; i < n; i++, o += lc)
        memcpy(s + o, close, lc);
    s[o] = '\0';
    return s;
}

/* ---- Valid documents ----------------------------------------------------------------------- */

static const struct doc valid_docs[] = {
    {S("0")},
    {S("-0")},
    {S("1")},
    {S("-1")},
    {S("1234567890")},
    {S("1.5")},
    {S("-1.5e10")},
    {S("0.0")},
    {S("0e0")},
    {S("1e5")},
    {S("1E+5")},
    {S("1e-5")},
    {S("-0.000001E-0")},
    {S("1E400")},
    {S("123456789012345678901234567890123456789")},
    {S("true")},
    {S("false")},
    {S("null")},
    {S("\"\"")},
    {S("\"abc\"")},
    {S("\"\\\"\\\\\\/\\b\\f\\n\\r\\t\"")},
    {S("\"\\u0000\"")},
    {S("\"\\u00e9\\u20AC\"")},
    {S("\"\\uD83D\\uDE00\"")},
    {S("\"\\uDBFF\\uDFFF\"")},
    {S("\"\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\xF4\x8F\xBF\xBF\"")},
    {S("\"\x7F\"")},
    {S("\"'\"")},
    {S("[]")},
    {S("{}")},
    {S("[[]]")},
    {S("[{}]")},
    {S(" \t\r\n[ 1 , 2 ] \n")},
    {S("[1,\"x\",null,true,false,-2.5e-3,[],{}]")},
    {S("{\"a\":{\"b\":[1,{\"c\":null}]}}")},
    {S("{\"\":0}")},
    {S("{\"a\":1,\"a\":2}")},
    {S("{\"ttl_ms\": 5000, \"wait_ms\": 1000}")},
    {S("{\"lock\":\"L\",\"statements\":[{\"sql\":\"UPDATE t SET v = $1\",\"params\":[1,\"x\","
       "null,true]}]}")},
    {S("[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]")}, /* 32 deep */
};

static void test_valid_documents(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(valid_docs); i++) {
        struct json_reader r;
        char *copy = exact_copy(valid_docs[i].text, valid_docs[i].len);
        int rc = read_all(copy, valid_docs[i].len, &r, NULL);
        if (rc != FG_OK)
            fail_msg("valid doc #%zu %s rejected: %s", i, valid_docs[i].text,
                     json_reader_error(&r));
        free(copy);
    }
}

/* The length of doc once trailing whitespace is dropped. */
static size_t trimmed_len(const struct doc *d)
{
    size_t n = d->len;
    while (n > 0 && strchr(" \t\r\n", d->text[n - 1]) != NULL)
        n--;
    return n;
}

/* Every prefix of a valid document, in a buffer of exactly its size, is rejected cleanly unless
 * it is a whole document itself: a document whose trailing whitespace is cut, or, for a number,
 * a prefix that ends in a digit ("12" of "123", not "1." nor "1e"). */
static void test_valid_documents_split_everywhere(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(valid_docs); i++) {
        const struct doc *d = &valid_docs[i];
        size_t lead = 0;
        while (lead < d->len && strchr(" \t\r\n", d->text[lead]) != NULL)
            lead++;
        int is_number = d->text[lead] == '-' || (d->text[lead] >= '0' && d->text[lead] <= '9');
        size_t full = trimmed_len(d);
        for (size_t n = 0; n < d->len; n++) {
            struct json_reader r;
            char *copy = exact_copy(d->text, n);
            int want_ok = n >= full ||
                          (is_number && n > lead && d->text[n - 1] >= '0' && d->text[n - 1] <= '9');
            int rc = read_all(copy, n, &r, NULL);
            if (want_ok && rc != FG_OK)
                fail_msg("doc #%zu cut at %zu rejected: %s", i, n, json_reader_error(&r));
            if (!want_ok && rc != FG_ERR_PROTO)
                fail_msg("doc #%zu (%s) cut at %zu: want FG_ERR_PROTO, got %d", i, d->text, n, rc);
            if (!want_ok)
                assert_true(r.err_off <= n);
            free(copy);
        }
    }
}

/* ---- Token streams ------------------------------------------------------------------------- */

static void test_token_streams(void **state)
{
    static const struct {
        const char *in;
        const char *want;
    } cases[] = {
        {"{}", "{ } $"},
        {" [ ] ", "[ ] $"},
        {"{\"a\":[1,\"x\",null,true,false]}", "{ K:a [ N:1 S:x n t f ] } $"},
        {"{\"k\\n\":\"v\\u0041\"}", "{ K:k\\n S:v\\u0041 } $"},
        {"-12.5e+3", "N:-12.5e+3 $"},
        {"[[],{}]", "[ [ ] { } ] $"},
        {"{\"a\":{\"b\":{}},\"c\":0}", "{ K:a { K:b { } } K:c N:0 } $"},
        {"[1,]", "[ N:1 !-2"},
        {"{\"a\":1 x", "{ K:a N:1 !-2"},
        {"[1] 2", "[ N:1 ] !-2"},
    };
    char out[512];
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        render(cases[i].in, strlen(cases[i].in), out, sizeof(out));
        assert_string_equal(out, cases[i].want);
    }
}

static void test_token_fields(void **state)
{
    const char *in = "{\"ab\": [\"c\\n\", 12]}";
    struct json_reader r;
    struct json_token t;
    (void)state;

    json_reader_init(&r, in, strlen(in));
    assert_int_equal(json_next(&r, &t), FG_OK);
    assert_int_equal(t.type, JSON_OBJECT_BEGIN);
    assert_int_equal(t.off, 0);
    assert_int_equal(t.depth, 0);
    assert_int_equal(json_next(&r, &t), FG_OK);
    assert_int_equal(t.type, JSON_KEY);
    assert_int_equal(t.off, 1);
    assert_ptr_equal(t.ptr, in + 2);
    assert_int_equal(t.len, 2);
    assert_int_equal(t.depth, 1);
    assert_int_equal(t.escaped, 0);
    assert_int_equal(json_next(&r, &t), FG_OK);
    assert_int_equal(t.type, JSON_ARRAY_BEGIN);
    assert_int_equal(t.off, 7);
    assert_int_equal(t.depth, 1);
    assert_int_equal(json_next(&r, &t), FG_OK);
    assert_int_equal(t.type, JSON_STRING);
    assert_int_equal(t.len, 3);
    assert_int_equal(t.escaped, 1);
    assert_int_equal(t.depth, 2);
    assert_int_equal(json_next(&r, &t), FG_OK);
    assert_int_equal(t.type, JSON_NUMBER);
    assert_int_equal(t.off, 15);
    assert_int_equal(t.len, 2);
    assert_int_equal(json_next(&r, &t), FG_OK);
    assert_int_equal(t.type, JSON_ARRAY_END);
    assert_int_equal(t.depth, 1);
    assert_int_equal(json_next(&r, &t), FG_OK);
    assert_int_equal(t.type, JSON_OBJECT_END);
    assert_int_equal(t.depth, 0);
    assert_int_equal(json_next(&r, &t), FG_OK);
    assert_int_equal(t.type, JSON_END);
}

/* ---- Invalid documents --------------------------------------------------------------------- */

static const struct {
    struct doc d;
    int rc;
    const char *msg; /* a substring of the error text */
} invalid_docs[] = {
    {{S("")}, FG_ERR_PROTO, "empty document at offset 0"},
    {{S(" \n\t")}, FG_ERR_PROTO, "empty document"},
    {{S("01")}, FG_ERR_PROTO, "leading zero in a number at offset 1"},
    {{S("-01")}, FG_ERR_PROTO, "leading zero"},
    {{S("00")}, FG_ERR_PROTO, "leading zero"},
    {{S("[01]")}, FG_ERR_PROTO, "leading zero"},
    {{S("-")}, FG_ERR_PROTO, "unexpected end of input inside a number"},
    {{S("-a")}, FG_ERR_PROTO, "expected a digit after '-'"},
    {{S("[-]")}, FG_ERR_PROTO, "expected a digit after '-'"},
    {{S("1.")}, FG_ERR_PROTO, "end of input inside a number"},
    {{S("[1.]")}, FG_ERR_PROTO, "expected a digit after '.'"},
    {{S("1.e5")}, FG_ERR_PROTO, "expected a digit after '.'"},
    {{S(".5")}, FG_ERR_PROTO, "unexpected '.' (expected a value) at offset 0"},
    {{S("+1")}, FG_ERR_PROTO, "unexpected '+'"},
    {{S("1e")}, FG_ERR_PROTO, "end of input inside a number"},
    {{S("1e+")}, FG_ERR_PROTO, "end of input inside a number"},
    {{S("[1E-]")}, FG_ERR_PROTO, "exponent"},
    {{S("[1ex]")}, FG_ERR_PROTO, "exponent"},
    {{S("0x10")}, FG_ERR_PROTO, "after the end of the document"},
    {{S("1 2")}, FG_ERR_PROTO, "unexpected '2' after the end of the document at offset 2"},
    {{S("Infinity")}, FG_ERR_PROTO, "unexpected 'I'"},
    {{S("-Infinity")}, FG_ERR_PROTO, "expected a digit after '-'"},
    {{S("NaN")}, FG_ERR_PROTO, "unexpected 'N'"},
    {{S("tru")}, FG_ERR_PROTO, "unexpected end of input"},
    {{S("trux")}, FG_ERR_PROTO, "invalid literal (expected true)"},
    {{S("nul")}, FG_ERR_PROTO, "unexpected end of input"},
    {{S("True")}, FG_ERR_PROTO, "unexpected 'T'"},
    {{S("truex")}, FG_ERR_PROTO, "after the end of the document"},
    {{S("[true false]")}, FG_ERR_PROTO, "expected ',' or ']'"},
    {{S("[1,]")}, FG_ERR_PROTO, "unexpected ']' (expected a value) at offset 3"},
    {{S("[,1]")}, FG_ERR_PROTO, "unexpected ','"},
    {{S("[1 2]")}, FG_ERR_PROTO, "expected ',' or ']'"},
    {{S("{\"a\":1,}")}, FG_ERR_PROTO, "expected a member name) at offset 7"},
    {{S("{,}")}, FG_ERR_PROTO, "expected a member name or '}'"},
    {{S("{\"a\"}")}, FG_ERR_PROTO, "expected ':'"},
    {{S("{\"a\" 1}")}, FG_ERR_PROTO, "expected ':'"},
    {{S("{\"a\":}")}, FG_ERR_PROTO, "expected a value"},
    {{S("{\"a\":1 \"b\":2}")}, FG_ERR_PROTO, "expected ',' or '}'"},
    {{S("{a:1}")}, FG_ERR_PROTO, "unexpected 'a' (expected a member name or '}')"},
    {{S("{'a':1}")}, FG_ERR_PROTO, "unexpected '''"},
    {{S("{1:1}")}, FG_ERR_PROTO, "expected a member name"},
    {{S("'x'")}, FG_ERR_PROTO, "unexpected '''"},
    {{S("[1}")}, FG_ERR_PROTO, "expected ',' or ']'"},
    {{S("{]")}, FG_ERR_PROTO, "expected a member name or '}'"},
    {{S("{\"a\":1]")}, FG_ERR_PROTO, "expected ',' or '}'"},
    {{S("]")}, FG_ERR_PROTO, "unexpected ']'"},
    {{S("}")}, FG_ERR_PROTO, "unexpected '}'"},
    {{S(":")}, FG_ERR_PROTO, "unexpected ':'"},
    {{S("[")}, FG_ERR_PROTO, "unexpected end of input at offset 1"},
    {{S("{} {}")}, FG_ERR_PROTO, "after the end of the document"},
    {{S("[] x")}, FG_ERR_PROTO, "unexpected 'x' after the end"},
    {{S("\"abc")}, FG_ERR_PROTO, "end of input inside a string"},
    {{S("\"\\\"")}, FG_ERR_PROTO, "end of input inside a string"},
    {{S("\"\t\"")}, FG_ERR_PROTO, "raw control character in a string (escape it) at offset 1"},
    {{S("\"a\nb\"")}, FG_ERR_PROTO, "raw control character"},
    {{S("\"\x01\"")}, FG_ERR_PROTO, "raw control character"},
    {{S("\"\x1F\"")}, FG_ERR_PROTO, "raw control character"},
    {{S("\"\\x41\"")}, FG_ERR_PROTO, "invalid escape in a string at offset 1"},
    {{S("\"\\a\"")}, FG_ERR_PROTO, "invalid escape"},
    {{S("\"\\'\"")}, FG_ERR_PROTO, "invalid escape"},
    {{S("\"\\U0041\"")}, FG_ERR_PROTO, "invalid escape"},
    {{S("\"\\u12\"")}, FG_ERR_PROTO, "four hex digits"},
    {{S("\"\\u12G4\"")}, FG_ERR_PROTO, "four hex digits"},
    {{S("\"\\u")}, FG_ERR_PROTO, "end of input inside a string"},
    {{S("\"\\uD800\"")}, FG_ERR_PROTO, "lone high surrogate"},
    {{S("\"\\uDBFFx\"")}, FG_ERR_PROTO, "lone high surrogate"},
    {{S("\"\\uD800\\u0041\"")}, FG_ERR_PROTO, "lone high surrogate"},
    {{S("\"\\uD800\\uD800\"")}, FG_ERR_PROTO, "lone high surrogate"},
    {{S("\"\\uD800\\n\"")}, FG_ERR_PROTO, "lone high surrogate"},
    {{S("\"\\uD800\\uZZZZ\"")}, FG_ERR_PROTO, "four hex digits"},
    {{S("\"\\uDC00\"")}, FG_ERR_PROTO, "lone low surrogate"},
    {{S("\"\\uDFFF\\uD800\"")}, FG_ERR_PROTO, "lone low surrogate"},
    {{S("\"a\0b\"")}, FG_ERR_PROTO, "raw control character in a string (escape it) at offset 2"},
    {{S("\0")}, FG_ERR_PROTO, "unexpected byte 0x00 (expected a value) at offset 0"},
    {{S("[1]\0")}, FG_ERR_PROTO, "unexpected byte 0x00 after the end of the document"},
    {{S("[1,\0]")}, FG_ERR_PROTO, "unexpected byte 0x00"},
    {{S("{\"a\0\":1}")}, FG_ERR_PROTO, "raw control character"},
    {{S("\xEF\xBB\xBF{}")}, FG_ERR_PROTO, "unexpected byte 0xEF"},
    {{S("\"\xC0\xAF\"")}, FG_ERR_PROTO, "invalid UTF-8 in a string at offset 1"},
    {{S("\"\xC1\xBF\"")}, FG_ERR_PROTO, "invalid UTF-8"},
    {{S("\"\xE0\x80\xAF\"")}, FG_ERR_PROTO, "invalid UTF-8"},
    {{S("\"\xED\xA0\x80\"")}, FG_ERR_PROTO, "invalid UTF-8"},
    {{S("\"\xF0\x80\x80\xAF\"")}, FG_ERR_PROTO, "invalid UTF-8"},
    {{S("\"\xF4\x90\x80\x80\"")}, FG_ERR_PROTO, "invalid UTF-8"},
    {{S("\"\xF5\x80\x80\x80\"")}, FG_ERR_PROTO, "invalid UTF-8"},
    {{S("\"\x80\"")}, FG_ERR_PROTO, "invalid UTF-8"},
    {{S("\"\xFF\"")}, FG_ERR_PROTO, "invalid UTF-8"},
    {{S("\"\xC3\"")}, FG_ERR_PROTO, "invalid UTF-8"},
    {{S("\"\xE2\x82\"")}, FG_ERR_PROTO, "invalid UTF-8"},
    {{S("\"\xE2\x82")}, FG_ERR_PROTO, "end of input inside a string"},
    {{S("\f1")}, FG_ERR_PROTO, "unexpected byte 0x0C"},
    {{S("\v1")}, FG_ERR_PROTO, "unexpected byte 0x0B"},
    {{S("[1]\xC2\xA0")}, FG_ERR_PROTO, "unexpected byte 0xC2 after the end"},
    {{S("\x7F")}, FG_ERR_PROTO, "unexpected byte 0x7F"},
    {{S("[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]")},
     FG_ERR_LIMIT,
     "nesting deeper than 32 levels at offset 32"},
};

static void test_invalid_documents(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(invalid_docs); i++) {
        struct json_reader r;
        char *copy = exact_copy(invalid_docs[i].d.text, invalid_docs[i].d.len);
        int rc = read_all(copy, invalid_docs[i].d.len, &r, NULL);
        if (rc != invalid_docs[i].rc)
            fail_msg("invalid doc #%zu: want %d, got %d (%s)", i, invalid_docs[i].rc, rc,
                     json_reader_error(&r));
        if (strstr(json_reader_error(&r), invalid_docs[i].msg) == NULL)
            fail_msg("invalid doc #%zu: error \"%s\" lacks \"%s\"", i, json_reader_error(&r),
                     invalid_docs[i].msg);
        assert_true(r.err_off <= invalid_docs[i].d.len);
        free(copy);
    }
}

/* Deep nesting stops at the limit without recursion or memory, even 100000 levels deep, and
 * the same limit holds for objects. */
static void test_deep_nesting(void **state)
{
    struct json_reader r;
    size_t n = 0;
    char *s;
    (void)state;

    s = repeat("[", 100000, "", "]");
    assert_int_equal(read_all(s, strlen(s), &r, &n), FG_ERR_LIMIT);
    assert_int_equal(n, JSON_MAX_DEPTH);
    assert_int_equal(r.err_off, JSON_MAX_DEPTH);
    free(s);

    s = repeat("{\"a\":", JSON_MAX_DEPTH, "0", "}");
    assert_int_equal(read_all(s, strlen(s), &r, NULL), FG_OK);
    free(s);
    s = repeat("{\"a\":", JSON_MAX_DEPTH + 1, "0", "}");
    assert_int_equal(read_all(s, strlen(s), &r, NULL), FG_ERR_LIMIT);
    assert_non_null(strstr(json_reader_error(&r), "nesting deeper than 32"));
    free(s);

    /* Depth is per open container: many siblings at depth 32 are fine. */
    s = repeat("[", JSON_MAX_DEPTH - 1, "[],[],[],[]", "]");
    assert_int_equal(read_all(s, strlen(s), &r, NULL), FG_OK);
    free(s);
}

/* A NULL buffer reads as an empty document. */
static void test_null_buffer(void **state)
{
    struct json_reader r;
    struct json_token t;
    (void)state;
    json_reader_init(&r, NULL, 10);
    assert_int_equal(json_next(&r, &t), FG_ERR_PROTO);
    assert_string_equal(json_reader_error(&r), "empty document at offset 0");
}

/* ---- Strings ------------------------------------------------------------------------------- */

static void test_unescape(void **state)
{
    static const struct {
        struct doc in;
        struct doc out;
    } cases[] = {
        {{S("")}, {S("")}},
        {{S("plain")}, {S("plain")}},
        {{S("a\\nb")}, {S("a\nb")}},
        {{S("\\\"\\\\\\/\\b\\f\\n\\r\\t")}, {S("\"\\/\b\f\n\r\t")}},
        {{S("\\u0041\\u00e9")}, {S("A\xC3\xA9")}},
        {{S("\\u07FF\\u0800")}, {S("\xDF\xBF\xE0\xA0\x80")}},
        {{S("\\u20AC\\uFFFF")}, {S("\xE2\x82\xAC\xEF\xBF\xBF")}},
        {{S("\\uD83D\\uDE00")}, {S("\xF0\x9F\x98\x80")}},
        {{S("\\uD800\\uDC00")}, {S("\xF0\x90\x80\x80")}},
        {{S("\\uDBFF\\uDFFF")}, {S("\xF4\x8F\xBF\xBF")}},
        {{S("a\\u0000b")}, {S("a\0b")}},
        {{S("\xC3\xA9x")}, {S("\xC3\xA9x")}},
    };
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        size_t cap = cases[i].in.len + 1;
        char *out = malloc(cap);
        size_t n = 99;
        assert_non_null(out);
        assert_int_equal(json_unescape(cases[i].in.text, cases[i].in.len, out, cap, &n), FG_OK);
        assert_int_equal(n, cases[i].out.len);
        assert_memory_equal(out, cases[i].out.text, n);
        assert_int_equal(out[n], '\0');
        /* Exactly enough room (text + NUL) works; one byte less is FG_ERR_LIMIT. */
        assert_int_equal(json_unescape(cases[i].in.text, cases[i].in.len, out, n + 1, &n), FG_OK);
        assert_int_equal(json_unescape(cases[i].in.text, cases[i].in.len, out, n, &n),
                         FG_ERR_LIMIT);
        assert_int_equal(n, 0);
        if (cases[i].out.len > 0)
            assert_int_equal(out[0], '\0');
        free(out);
    }
}

static void test_unescape_rejects_bad_text(void **state)
{
    static const struct doc bad[] = {
        {S("\\")},       {S("\\x")},        {S("\\u12")},
        {S("\\uD800")},  {S("\\uDC00")},    {S("\\uD800\\u0041")},
        {S("a\"b")},     {S("\x01")},       {S("\xC0\xAF")},
        {S("\xE2\x82")}, {S("\\uD800\\u")}, {S("\0")},
    };
    char out[64];
    size_t n;
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        if (json_unescape(bad[i].text, bad[i].len, out, sizeof(out), &n) != FG_ERR_PROTO)
            fail_msg("bad string text #%zu accepted", i);
        assert_int_equal(out[0], '\0');
    }
}

/* Every string token of the valid documents decodes into len + 1 bytes. */
static void test_unescape_fits_in_len_plus_one(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(valid_docs); i++) {
        struct json_reader r;
        struct json_token t;
        json_reader_init(&r, valid_docs[i].text, valid_docs[i].len);
        while (json_next(&r, &t) == FG_OK && t.type != JSON_END) {
            if (t.type != JSON_STRING && t.type != JSON_KEY)
                continue;
            char *out = malloc(t.len + 1);
            size_t n;
            assert_non_null(out);
            assert_int_equal(json_unescape(t.ptr, t.len, out, t.len + 1, &n), FG_OK);
            assert_true(n <= t.len);
            assert_int_equal(t.escaped, memchr(t.ptr, '\\', t.len) != NULL);
            free(out);
        }
    }
}

static void test_string_equals(void **state)
{
    const char *in = "{\"ttl\\u005fms\":\"a\\u0000b\",\"x\":\"\\uD83D\\uDE00\",\"plain\":1}";
    struct json_reader r;
    struct json_token t;
    (void)state;

    json_reader_init(&r, in, strlen(in));
    assert_int_equal(json_next(&r, &t), FG_OK);
    assert_int_equal(json_string_equals(&t, "{"), 0); /* not a string token */
    assert_int_equal(json_next(&r, &t), FG_OK);
    assert_true(json_string_equals(&t, "ttl_ms"));
    assert_false(json_string_equals(&t, "ttl_m"));
    assert_false(json_string_equals(&t, "ttl_mss"));
    assert_false(json_string_equals(&t, "ttl\\u005fms"));
    assert_int_equal(json_next(&r, &t), FG_OK);
    assert_false(json_string_equals(&t, "a")); /* the decoded text holds a NUL */
    assert_int_equal(json_next(&r, &t), FG_OK);
    assert_true(json_string_equals(&t, "x"));
    assert_int_equal(json_next(&r, &t), FG_OK);
    assert_true(json_string_equals(&t, "\xF0\x9F\x98\x80"));
    assert_int_equal(json_next(&r, &t), FG_OK);
    assert_true(json_string_equals(&t, "plain"));
    assert_false(json_string_equals(&t, ""));
}

/* ---- Numbers ------------------------------------------------------------------------------- */

static int number_of(const char *text, int64_t *v)
{
    struct json_reader r;
    struct json_token t;
    json_reader_init(&r, text, strlen(text));
    assert_int_equal(json_next(&r, &t), FG_OK);
    *v = 12345;
    return json_number_int64(&t, v);
}

static void test_number_int64(void **state)
{
    static const struct {
        const char *in;
        int rc;
        int64_t v;
    } cases[] = {
        {"0", FG_OK, 0},
        {"-0", FG_OK, 0},
        {"7", FG_OK, 7},
        {"-42", FG_OK, -42},
        {"5000", FG_OK, 5000},
        {"9223372036854775807", FG_OK, INT64_MAX},
        {"-9223372036854775808", FG_OK, INT64_MIN},
        {"9223372036854775808", FG_ERR_LIMIT, 0},
        {"-9223372036854775809", FG_ERR_LIMIT, 0},
        {"18446744073709551616", FG_ERR_LIMIT, 0},
        {"123456789012345678901234567890123456789", FG_ERR_LIMIT, 0},
        {"1.0", FG_ERR_PROTO, 0},
        {"1.5", FG_ERR_PROTO, 0},
        {"1e3", FG_ERR_PROTO, 0},
        {"1E400", FG_ERR_PROTO, 0},
        {"-0.0", FG_ERR_PROTO, 0},
        {"\"5\"", FG_ERR_PROTO, 0},
        {"true", FG_ERR_PROTO, 0},
        {"[5]", FG_ERR_PROTO, 0},
    };
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        int64_t v;
        int rc = number_of(cases[i].in, &v);
        if (rc != cases[i].rc)
            fail_msg("%s: want %d, got %d", cases[i].in, cases[i].rc, rc);
        if (rc == FG_OK)
            assert_true(v == cases[i].v);
        else
            assert_true(v == 12345); /* untouched on error */
    }
}

/* ---- Skipping ------------------------------------------------------------------------------ */

static void test_skip(void **state)
{
    const char *in = "{\"a\":[1,{\"b\":[2,[3]]},\"]\"],\"c\":{\"d\":{}},\"e\":5}";
    struct json_reader r;
    struct json_token t;
    (void)state;

    json_reader_init(&r, in, strlen(in));
    assert_int_equal(json_next(&r, &t), FG_OK);
    assert_int_equal(json_next(&r, &t), FG_OK);
    assert_true(json_string_equals(&t, "a"));
    assert_int_equal(json_next(&r, &t), FG_OK);
    assert_int_equal(t.type, JSON_ARRAY_BEGIN);
    assert_int_equal(json_skip(&r, &t), FG_OK);
    assert_int_equal(json_next(&r, &t), FG_OK);
    assert_true(json_string_equals(&t, "c"));
    assert_int_equal(json_skip(&r, &t), FG_OK); /* a key: skips its whole value */
    assert_int_equal(json_next(&r, &t), FG_OK);
    assert_true(json_string_equals(&t, "e"));
    assert_int_equal(json_next(&r, &t), FG_OK);
    assert_int_equal(t.type, JSON_NUMBER);
    assert_int_equal(json_skip(&r, &t), FG_OK); /* a scalar: nothing to skip */
    assert_int_equal(json_next(&r, &t), FG_OK);
    assert_int_equal(t.type, JSON_OBJECT_END);
    assert_int_equal(json_next(&r, &t), FG_OK);
    assert_int_equal(t.type, JSON_END);

    /* The whole document from its first token; an error inside is reported. */
    json_reader_init(&r, in, strlen(in));
    assert_int_equal(json_next(&r, &t), FG_OK);
    assert_int_equal(json_skip(&r, &t), FG_OK);
    assert_int_equal(json_next(&r, &t), FG_OK);
    assert_int_equal(t.type, JSON_END);
    json_reader_init(&r, "[1,[2,}]]", 9);
    assert_int_equal(json_next(&r, &t), FG_OK);
    assert_int_equal(json_skip(&r, &t), FG_ERR_PROTO);
}

/* ---- The lock request body ----------------------------------------------------------------- */

static const struct {
    struct doc body;
    int rc;
    long long ttl, wait;
    const char *err; /* the whole error text for short ones, or a substring prefixed by '~' */
} lock_cases[] = {
    {{S("")}, FG_OK, -1, -1, ""},
    {{S(" \r\n\t")}, FG_OK, -1, -1, ""},
    {{S("{}")}, FG_OK, -1, -1, ""},
    {{S(" { } ")}, FG_OK, -1, -1, ""},
    {{S("{\"ttl_ms\": 5000, \"wait_ms\": 1000}")}, FG_OK, 5000, 1000, ""},
    {{S("{\"wait_ms\":1000}")}, FG_OK, -1, 1000, ""},
    {{S("{\"ttl_ms\":5000}")}, FG_OK, 5000, -1, ""},
    {{S("{\"ttl_ms\":0,\"wait_ms\":0}")}, FG_OK, 0, 0, ""},
    {{S("{\"wait_ms\":2,\"ttl_ms\":1}")}, FG_OK, 1, 2, ""},
    {{S("{\"ttl\\u005fms\":7}")}, FG_OK, 7, -1, ""},
    {{S("{\"ttl_ms\":9223372036854775807}")}, FG_OK, INT64_MAX, -1, ""},
    {{S("{\"wait_ms\":\"abc\"}")},
     FG_ERR_PROTO,
     -1,
     -1,
     "wait_ms: expected a non-negative integer, got \"abc\""},
    {{S("{\"ttl_ms\":-5}")},
     FG_ERR_PROTO,
     -1,
     -1,
     "ttl_ms: expected a non-negative integer, got -5"},
    {{S("{\"ttl_ms\":-0}")},
     FG_ERR_PROTO,
     -1,
     -1,
     "ttl_ms: expected a non-negative integer, got -0"},
    {{S("{\"ttl_ms\":1.5}")},
     FG_ERR_PROTO,
     -1,
     -1,
     "ttl_ms: expected a non-negative integer, got 1.5"},
    {{S("{\"ttl_ms\":1e3}")},
     FG_ERR_PROTO,
     -1,
     -1,
     "ttl_ms: expected a non-negative integer, got 1e3"},
    {{S("{\"ttl_ms\":5.0}")},
     FG_ERR_PROTO,
     -1,
     -1,
     "ttl_ms: expected a non-negative integer, got 5.0"},
    {{S("{\"ttl_ms\":null}")},
     FG_ERR_PROTO,
     -1,
     -1,
     "ttl_ms: expected a non-negative integer, got null"},
    {{S("{\"ttl_ms\":true}")},
     FG_ERR_PROTO,
     -1,
     -1,
     "ttl_ms: expected a non-negative integer, got true"},
    {{S("{\"wait_ms\":[1]}")},
     FG_ERR_PROTO,
     -1,
     -1,
     "wait_ms: expected a non-negative integer, got an array"},
    {{S("{\"wait_ms\":{}}")},
     FG_ERR_PROTO,
     -1,
     -1,
     "wait_ms: expected a non-negative integer, got an object"},
    {{S("{\"wait_ms\":\"5\"}")},
     FG_ERR_PROTO,
     -1,
     -1,
     "wait_ms: expected a non-negative integer, got \"5\""},
    {{S("{\"ttl_ms\":99999999999999999999}")},
     FG_ERR_LIMIT,
     -1,
     -1,
     "ttl_ms: 99999999999999999999 is too large (at most 9223372036854775807)"},
    {{S("{\"ttl_ms\":1,\"foo\":2}")},
     FG_ERR_PROTO,
     -1,
     -1,
     "unknown key \"foo\" (expected \"ttl_ms\" or \"wait_ms\")"},
    {{S("{\"TTL_MS\":1}")}, FG_ERR_PROTO, -1, -1, "~unknown key \"TTL_MS\""},
    {{S("{\"\\u0001\\n\xC3\xA9\":1}")},
     FG_ERR_PROTO,
     -1,
     -1,
     "~unknown key \"\\\\u0001\\\\n\\xC3\\xA9\""},
    {{S("{\"ttl_ms\":1,\"ttl_ms\":2}")}, FG_ERR_PROTO, -1, -1, "duplicate key \"ttl_ms\""},
    {{S("{\"wait_ms\":1,\"wait\\u005fms\":1}")}, FG_ERR_PROTO, -1, -1, "duplicate key \"wait_ms\""},
    {{S("[1]")}, FG_ERR_PROTO, -1, -1, "request body: expected a JSON object, got an array"},
    {{S("\"x\"")}, FG_ERR_PROTO, -1, -1, "request body: expected a JSON object, got \"x\""},
    {{S("5")}, FG_ERR_PROTO, -1, -1, "request body: expected a JSON object, got 5"},
    {{S("null")}, FG_ERR_PROTO, -1, -1, "request body: expected a JSON object, got null"},
    {{S("{\"ttl_ms\":1} x")},
     FG_ERR_PROTO,
     -1,
     -1,
     "invalid JSON: unexpected 'x' after the end of the document at offset 13"},
    {{S("{\"ttl_ms\":1}\0")}, FG_ERR_PROTO, -1, -1, "~invalid JSON: unexpected byte 0x00"},
    {{S("{\"ttl_ms\":01}")}, FG_ERR_PROTO, -1, -1, "~invalid JSON: leading zero"},
    {{S("{\"ttl_ms\":1,}")}, FG_ERR_PROTO, -1, -1, "~invalid JSON: unexpected '}'"},
    /* A syntax error anywhere wins over a type error before it. */
    {{S("{\"foo\":1,")}, FG_ERR_PROTO, -1, -1, "invalid JSON: unexpected end of input at offset 9"},
    {{S("{\"ttl_ms\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}")},
     FG_ERR_LIMIT,
     -1,
     -1,
     "invalid JSON: nesting deeper than 32 levels at offset 41"},
};

static void test_lock_request(void **state)
{
    (void)state;
    for (size_t i = 0; i < ARRAY_LEN(lock_cases); i++) {
        char err[256];
        long long ttl = 77, wait = 77;
        char *copy = exact_copy(lock_cases[i].body.text, lock_cases[i].body.len);
        memset(err, 'Z', sizeof(err));
        int rc =
            json_parse_lock_request(copy, lock_cases[i].body.len, &ttl, &wait, err, sizeof(err));
        if (rc != lock_cases[i].rc)
            fail_msg("lock body #%zu: want %d, got %d (%s)", i, lock_cases[i].rc, rc, err);
        assert_true(ttl == lock_cases[i].ttl);
        assert_true(wait == lock_cases[i].wait);
        if (lock_cases[i].err[0] == '~') {
            if (strstr(err, lock_cases[i].err + 1) == NULL)
                fail_msg("lock body #%zu: error \"%s\" lacks \"%s\"", i, err,
                         lock_cases[i].err + 1);
        } else {
            assert_string_equal(err, lock_cases[i].err);
        }
        /* The message is plain printable ASCII whatever the body held. */
        for (const char *p = err; *p != '\0'; p++)
            assert_true(*p >= 0x20 && *p < 0x7f);
        free(copy);
    }
}

/* Every proper prefix of a valid body (other than empty or whitespace) is rejected. */
static void test_lock_request_split(void **state)
{
    static const char body[] = "{\"ttl_ms\": 5000, \"wait_ms\": 1000}";
    (void)state;
    for (size_t n = 1; n < sizeof(body) - 1; n++) {
        char err[256];
        long long ttl = 0, wait = 0;
        char *copy = exact_copy(body, n);
        int rc = json_parse_lock_request(copy, n, &ttl, &wait, err, sizeof(err));
        assert_int_equal(rc, FG_ERR_PROTO);
        assert_true(ttl == -1 && wait == -1);
        assert_non_null(strstr(err, "invalid JSON: unexpected end of input"));
        free(copy);
    }
}

static void test_lock_request_size_limit(void **state)
{
    char *body = malloc(JSON_LOCK_MAX_BODY + 1);
    char err[256];
    long long ttl, wait;
    (void)state;

    assert_non_null(body);
    memset(body, ' ', JSON_LOCK_MAX_BODY + 1);
    memcpy(body, "{\"ttl_ms\":9}", 12);
    assert_int_equal(
        json_parse_lock_request(body, JSON_LOCK_MAX_BODY, &ttl, &wait, err, sizeof(err)), FG_OK);
    assert_true(ttl == 9 && wait == -1);
    assert_int_equal(
        json_parse_lock_request(body, JSON_LOCK_MAX_BODY + 1, &ttl, &wait, err, sizeof(err)),
        FG_ERR_LIMIT);
    assert_true(ttl == -1 && wait == -1);
    assert_string_equal(err, "request body is 65537 bytes; the limit is 65536 bytes");
    free(body);
}

/* A small or absent error buffer is never overrun, and the text stays NUL-terminated. */
static void test_lock_request_small_err_buffer(void **state)
{
    char err[9];
    long long ttl, wait;
    (void)state;

    memset(err, 'Z', sizeof(err));
    assert_int_equal(json_parse_lock_request(S("{\"foo\":1}"), &ttl, &wait, err, 8), FG_ERR_PROTO);
    assert_string_equal(err, "unknown");
    assert_int_equal(err[8], 'Z');
    assert_int_equal(json_parse_lock_request(S("{\"foo\":1}"), &ttl, &wait, NULL, 0), FG_ERR_PROTO);
    assert_int_equal(json_parse_lock_request(NULL, 0, &ttl, &wait, NULL, 0), FG_OK);
    assert_true(ttl == -1 && wait == -1);
}

/* A long offending value is quoted only in part. */
static void test_lock_request_long_value(void **state)
{
    char body[400];
    char err[256];
    long long ttl, wait;
    int n;
    (void)state;

    n = snprintf(body, sizeof(body), "{\"wait_ms\":\"%0300d\"}", 0);
    assert_true(n > 0 && (size_t)n < sizeof(body));
    assert_int_equal(json_parse_lock_request(body, (size_t)n, &ttl, &wait, err, sizeof(err)),
                     FG_ERR_PROTO);
    assert_string_equal(err, "wait_ms: expected a non-negative integer, got "
                             "\"0000000000000000000000000000000000000000...\"");
}

/* json_escape(): what a JSON parser reads back is the text, and a cut never splits an escape. */
static void test_escape(void **state)
{
    char out[64], back[64];
    size_t n;
    const char *text = "say \"hi\"\\ \x01\ttab";

    (void)state;
    json_escape(out, sizeof(out), text);
    assert_string_equal(out, "say \\\"hi\\\"\\\\ \\u0001\\u0009tab");
    assert_int_equal(json_unescape(out, strlen(out), back, sizeof(back), &n), FG_OK);
    assert_int_equal(n, strlen(text));
    assert_memory_equal(back, text, n);
    for (size_t cap = 1; cap < 40; cap++) { /* every cut is whole escapes, NUL-terminated */
        char small[40];
        memset(small, 'x', sizeof(small));
        json_escape(small, cap, text);
        assert_true(strlen(small) < cap);
        assert_int_equal(strncmp(small, out, strlen(small)), 0);
        assert_int_equal(json_unescape(small, strlen(small), back, sizeof(back), &n), FG_OK);
    }
    /* UTF-8 passes whole, never cut inside a character; bytes that are not UTF-8 (a store's
     * error message in another encoding) become U+FFFD, so the answer stays valid JSON. */
    json_escape(out, sizeof(out), "caf\xc3\xa9 \xe9t\xe9 \xed\xa0\x80 \xf0\x9f\x98\x80");
    assert_string_equal(out, "caf\xc3\xa9 \\ufffdt\\ufffd \\ufffd\\ufffd\\ufffd \xf0\x9f\x98\x80");
    for (size_t cap = 1; cap < 40; cap++) {
        char small[40];
        json_escape(small, cap, "\xc3\xa9\xc3\xa9\xc3\xa9\xf0\x9f\x98\x80\xf0\x9f\x98\x80");
        assert_true(strlen(small) < cap);
        assert_true(json_utf8_valid(small, strlen(small)));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_documents),
        cmocka_unit_test(test_valid_documents_split_everywhere),
        cmocka_unit_test(test_token_streams),
        cmocka_unit_test(test_token_fields),
        cmocka_unit_test(test_invalid_documents),
        cmocka_unit_test(test_deep_nesting),
        cmocka_unit_test(test_null_buffer),
        cmocka_unit_test(test_unescape),
        cmocka_unit_test(test_unescape_rejects_bad_text),
        cmocka_unit_test(test_unescape_fits_in_len_plus_one),
        cmocka_unit_test(test_string_equals),
        cmocka_unit_test(test_number_int64),
        cmocka_unit_test(test_skip),
        cmocka_unit_test(test_lock_request),
        cmocka_unit_test(test_lock_request_split),
        cmocka_unit_test(test_lock_request_size_limit),
        cmocka_unit_test(test_lock_request_small_err_buffer),
        cmocka_unit_test(test_lock_request_long_value),
        cmocka_unit_test(test_escape),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
