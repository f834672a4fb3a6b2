/* test_resp.c — unit tests of the RESP codec: request parser, reply scanner, element reader. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fg_error.h"
#include "resp.h"

/* Heap in use, to show that a declared count costs no memory. ASan replaces malloc, so under it
 * the sanitizer's own counter is used; otherwise glibc's arena statistics. */
#if defined(__SANITIZE_ADDRESS__)
#define TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#endif
#ifdef TEST_ASAN
/* The sanitizer runtime's own counter (gcc 12 ships the runtime but not this header). */
size_t __sanitizer_get_current_allocated_bytes(void);
static size_t heap_in_use(void)
{
    return __sanitizer_get_current_allocated_bytes();
}
#else
#include <malloc.h>
static size_t heap_in_use(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}
#endif

#define S(lit) lit, sizeof(lit) - 1

/* ---- A growing text log: two runs of a parser agree when their logs are byte-equal ---------- */

struct tlog {
    char *buf;
    size_t len;
    size_t cap;
};

static void log_bytes(struct tlog *l, const void *p, size_t n)
{
    if (l->len + n + 1 > l->cap) {
        size_t ncap = (l->len + n + 1) * 2;
        char *b = realloc(l->buf, ncap);
        assert_non_null(b);
        l->buf = b;
        l->cap = ncap;
    }
    memcpy(l->buf + l->len, p, n);
    l->len += n;
    l->buf[l->len] = '\0';
}

static void log_fmt(struct tlog *l, const char *fmt, ...) FG_PRINTF(2, 3);
static void log_fmt(struct tlog *l, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    assert_true(n >= 0 && (size_t)n < sizeof(tmp));
    log_bytes(l, tmp, (size_t)n);
}

static void log_free(struct tlog *l)
{
    free(l->buf);
    memset(l, 0, sizeof(*l));
}

static void assert_logs_equal(const struct tlog *a, const struct tlog *b, const char *what,
                              size_t cut)
{
    if (a->len != b->len || memcmp(a->buf, b->buf, a->len) != 0) {
        print_error("%s: split at %zu differs\nwhole:\n%s\nsplit:\n%s\n", what, cut, a->buf,
                    b->buf);
        fail();
    }
}

/* ---- Request parser driver ----------------------------------------------------------------- */

/* Feeds `in` to a new parser in chunks ending at cuts[] (ascending, the last one n), the way a
 * connection would. Each call gets the current message copied into a new exact-size heap block,
 * so a parser that kept pointers or read past len is caught (under ASan). Logs every result. */
static void feed_requests(const struct resp_limits *lim, const char *in, size_t n,
                          const size_t *cuts, size_t ncuts, struct tlog *log)
{
    struct resp_parser *p = resp_parser_new(lim);
    size_t base = 0;
    int rc = RESP_PARTIAL;

    assert_non_null(p);
    for (size_t c = 0; c < ncuts && rc != RESP_INVALID; c++) {
        size_t have = cuts[c];
        assert_true(have <= n);
        while (base < have) {
            size_t avail = have - base;
            char *copy = malloc(avail);
            struct resp_request r;
            assert_non_null(copy);
            memcpy(copy, in + base, avail);
            rc = resp_parse_request(p, copy, avail, &r);
            if (rc == RESP_DONE) {
                assert_true(r.len > 0 && r.len <= avail);
                log_fmt(log, "MSG argc=%zu len=%zu inline=%d quoted=%d:", r.argc, r.len,
                        r.is_inline, r.has_quoted);
                for (size_t i = 0; i < r.argc; i++) {
                    assert_true(r.argv[i].off + r.argv[i].len <= r.len);
                    log_fmt(log, " [%zu]", r.argv[i].len);
                    log_bytes(log, copy + r.argv[i].off, r.argv[i].len);
                }
                log_fmt(log, "\n");
                base += r.len;
            } else if (rc == RESP_INVALID) {
                log_fmt(log, "INVALID %s\n", resp_parser_error(p));
            } else {
                assert_int_equal(rc, RESP_PARTIAL);
            }
            free(copy);
            if (rc != RESP_DONE)
                break;
        }
    }
    log_fmt(log, "END consumed=%zu rc=%d\n", base, rc);
    resp_parser_free(p);
}

/* Runs `in` whole, split at every offset, split twice (short inputs) and byte by byte; every way
 * must log exactly the same thing. Returns (in *whole) the log of the single-chunk run. */
static void requests_every_split(const struct resp_limits *lim, const char *in, size_t n,
                                 struct tlog *whole)
{
    size_t cuts[3];
    size_t *bytes = malloc((n + 1) * sizeof(*bytes));

    assert_non_null(bytes);
    cuts[0] = n;
    feed_requests(lim, in, n, cuts, 1, whole);
    for (size_t k = 0; k <= n; k++) {
        struct tlog t = {0};
        cuts[0] = k;
        cuts[1] = n;
        feed_requests(lim, in, n, cuts, 2, &t);
        assert_logs_equal(whole, &t, in, k);
        log_free(&t);
    }
    if (n <= 80) {
        for (size_t a = 0; a <= n; a++) {
            for (size_t b = a; b <= n; b++) {
                struct tlog t = {0};
                cuts[0] = a;
                cuts[1] = b;
                cuts[2] = n;
                feed_requests(lim, in, n, cuts, 3, &t);
                assert_logs_equal(whole, &t, in, a * 1000 + b);
                log_free(&t);
            }
        }
    }
    for (size_t k = 0; k < n; k++)
        bytes[k] = k + 1;
    {
        struct tlog t = {0};
        feed_requests(lim, in, n, bytes, n, &t);
        assert_logs_equal(whole, &t, in, 1);
        log_free(&t);
    }
    free(bytes);
}

/* ---- Valid requests ------------------------------------------------------------------------ */

struct req_case {
    const char *in;
    size_t in_len;
    const char *expect; /* the log of a whole run */
    size_t expect_len;
};

#define END_OK(n) "END consumed=" #n " rc=0\n"

static const struct req_case req_valid[] = {
    {S("*1\r\n$4\r\nPING\r\n"), S("MSG argc=1 len=14 inline=0 quoted=0: [4]PING\n" END_OK(14))},
    {S("*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nv\0\r\nx\r\n"),
     S("MSG argc=3 len=31 inline=0 quoted=0: [3]SET [1]k [5]v\0\r\nx\n" END_OK(31))},
    {S("*0\r\n"), S("MSG argc=0 len=4 inline=0 quoted=0:\n" END_OK(4))},
    {S("*-1\r\n"), S("MSG argc=0 len=5 inline=0 quoted=0:\n" END_OK(5))},
    {S("*-5\r\n"), S("MSG argc=0 len=5 inline=0 quoted=0:\n" END_OK(5))},
    {S("*2\r\n$0\r\n\r\n$0\r\n\r\n"),
     S("MSG argc=2 len=16 inline=0 quoted=0: [0] [0]\n" END_OK(16))},
    {S("*1\r\n$13\r\n*1\r\n$3\r\nfoo\r\n\r\n"),
     S("MSG argc=1 len=24 inline=0 quoted=0: [13]*1\r\n$3\r\nfoo\r\n\n" END_OK(24))},
    {S("*1\r\n$4\r\nPING\r\nPING\r\n*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\n\r\n*0\r\n*-1\r\n"),
     S("MSG argc=1 len=14 inline=0 quoted=0: [4]PING\n"
       "MSG argc=1 len=6 inline=1 quoted=0: [4]PING\n"
       "MSG argc=2 len=22 inline=0 quoted=0: [4]ECHO [2]hi\n"
       "MSG argc=0 len=2 inline=1 quoted=0:\n"
       "MSG argc=0 len=4 inline=0 quoted=0:\n"
       "MSG argc=0 len=5 inline=0 quoted=0:\n" END_OK(53))},
    {S("PING\n"), S("MSG argc=1 len=5 inline=1 quoted=0: [4]PING\n" END_OK(5))},
    {S("SET k v\r\n"), S("MSG argc=3 len=9 inline=1 quoted=0: [3]SET [1]k [1]v\n" END_OK(9))},
    {S("  SET\t k  \"a b\" 'c d'  \r\n"),
     S("MSG argc=4 len=25 inline=1 quoted=1: [3]SET [1]k [5]\"a b\" [5]'c d'\n" END_OK(25))},
    {S("\r\n"), S("MSG argc=0 len=2 inline=1 quoted=0:\n" END_OK(2))},
    {S(" \t \n"), S("MSG argc=0 len=4 inline=1 quoted=0:\n" END_OK(4))},
    {S("\n\n"),
     S("MSG argc=0 len=1 inline=1 quoted=0:\nMSG argc=0 len=1 inline=1 quoted=0:\n" END_OK(2))},
    /* The quoting cases below were checked against redis-server 7.0.15. */
    {S("ECHO 'a\\'b'\r\n"),
     S("MSG argc=2 len=13 inline=1 quoted=1: [4]ECHO [6]'a\\'b'\n" END_OK(13))},
    {S("ECHO a\"b c\" \r\n"),
     S("MSG argc=2 len=14 inline=1 quoted=1: [4]ECHO [6]a\"b c\"\n" END_OK(14))},
    {S("ECHO \"\\x41\\x4\"\r\n"),
     S("MSG argc=2 len=16 inline=1 quoted=1: [4]ECHO [9]\"\\x41\\x4\"\n" END_OK(16))},
    {S("ECHO a\vb\r\n"), S("MSG argc=2 len=10 inline=1 quoted=0: [4]ECHO [3]a\vb\n" END_OK(10))},
    {S("\vECHO x\r\n"), S("MSG argc=2 len=9 inline=1 quoted=0: [4]ECHO [1]x\n" END_OK(9))},
    {S("ECHO \"x\"\v\r\n"),
     S("MSG argc=2 len=11 inline=1 quoted=1: [4]ECHO [3]\"x\"\n" END_OK(11))},
    {S("ECHO x\r\r\n"), S("MSG argc=2 len=9 inline=1 quoted=0: [4]ECHO [1]x\n" END_OK(9))},
    {S("ECHO \"a\\\"b\" \"c\\\\\"\r\n"),
     S("MSG argc=3 len=19 inline=1 quoted=1: [4]ECHO [6]\"a\\\"b\" [5]\"c\\\\\"\n" END_OK(19))},
    {S("ECHO \"\" ''\n"),
     S("MSG argc=3 len=11 inline=1 quoted=1: [4]ECHO [2]\"\" [2]''\n" END_OK(11))},
    {S("ECHO \"a\"\r\n"), S("MSG argc=2 len=10 inline=1 quoted=1: [4]ECHO [3]\"a\"\n" END_OK(10))},
    {S("$3\r\n"), S("MSG argc=1 len=4 inline=1 quoted=0: [2]$3\n" END_OK(4))},
    {S("x\x80\xff\r\n"), S("MSG argc=1 len=5 inline=1 quoted=0: [3]x\x80\xff\n" END_OK(5))},
};

static void test_request_valid_every_split(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(req_valid) / sizeof(req_valid[0]); i++) {
        struct tlog whole = {0};
        const struct req_case *c = &req_valid[i];
        requests_every_split(NULL, c->in, c->in_len, &whole);
        if (whole.len != c->expect_len || memcmp(whole.buf, c->expect, whole.len) != 0) {
            print_error("case %zu\nwant:\n%s\ngot:\n%s\n", i, c->expect, whole.buf);
            fail();
        }
        log_free(&whole);
    }
}

/* A large binary argument arriving in every split still comes out byte-exact. */
static void test_request_big_binary_arg(void **state)
{
    char msg[400];
    size_t n = 0;
    struct tlog whole = {0};
    struct resp_parser *p = resp_parser_new(NULL);
    struct resp_request r;

    (void)state;
    memcpy(msg, "*2\r\n$3\r\nSET\r\n$300\r\n", 19);
    n = 19;
    for (int i = 0; i < 300; i++)
        msg[n++] = (char)(i % 7 == 0 ? '\r' : i % 5 == 0 ? '\n' : i % 3 == 0 ? '\0' : i);
    msg[n++] = '\r';
    msg[n++] = '\n';
    requests_every_split(NULL, msg, n, &whole);
    log_free(&whole);
    assert_int_equal(resp_parse_request(p, msg, n, &r), RESP_DONE);
    assert_int_equal(r.argc, 2);
    assert_int_equal(r.argv[1].off, 19);
    assert_int_equal(r.argv[1].len, 300);
    assert_memory_equal(msg + r.argv[1].off, msg + 19, 300);
    resp_parser_free(p);
}

/* ---- Malformed requests -------------------------------------------------------------------- */

struct req_bad {
    const char *in;
    size_t in_len;
    const char *error; /* resp_parser_error() */
    size_t done;       /* whole messages before the bad one */
};

static const struct req_bad req_invalid[] = {
    {S("*abc\r\n"), "Protocol error: invalid multibulk length", 0},
    {S("*-0\r\n"), "Protocol error: invalid multibulk length", 0},
    {S("*01\r\n"), "Protocol error: invalid multibulk length", 0},
    {S("*+1\r\n"), "Protocol error: invalid multibulk length", 0},
    {S("* 1\r\n"), "Protocol error: invalid multibulk length", 0},
    {S("*1 \r\n"), "Protocol error: invalid multibulk length", 0},
    {S("*\r\n"), "Protocol error: invalid multibulk length", 0},
    {S("*-\r\n"), "Protocol error: invalid multibulk length", 0},
    {S("*1\0\r\n"), "Protocol error: invalid multibulk length", 0},
    {S("*1\n$4\r\nPING\r\n"), "Protocol error: invalid multibulk length", 0},
    {S("*99999999999999999999\r\n"), "Protocol error: invalid multibulk length", 0},
    {S("*3000000000\r\n"), "Protocol error: invalid multibulk length", 0},
    {S("*1\r\n$99999999999\r\n"), "Protocol error: invalid bulk length", 0},
    {S("*1\r\n$-1\r\n"), "Protocol error: invalid bulk length", 0},
    {S("*1\r\n$-0\r\n"), "Protocol error: invalid bulk length", 0},
    {S("*1\r\n$04\r\nPING\r\n"), "Protocol error: invalid bulk length", 0},
    {S("*1\r\n$\r\n"), "Protocol error: invalid bulk length", 0},
    {S("*1\r\n$4x\r\nPING\r\n"), "Protocol error: invalid bulk length", 0},
    {S("*1\r\n$-9223372036854775808\r\n"), "Protocol error: invalid bulk length", 0},
    {S("*3\r\n$3\r\nSET\r\n$1\r\nx\r\nfooz\r\n"), "Protocol error: expected '$', got 'f'", 0},
    {S("*1\r\n\r$4\r\n"), "Protocol error: expected '$', got ' '", 0},
    {S("*1\r\n\n"), "Protocol error: expected '$', got ' '", 0},
    {S("*1\r\n\0"), "Protocol error: expected '$', got ' '", 0},
    {S("*1\r\n:1\r\n"), "Protocol error: expected '$', got ':'", 0},
    {S("*1\r\n$4\r\nPINGXY"), "Protocol error: expected CRLF after the bulk data", 0},
    {S("*1\r\n$4\r\nPINGX\n"), "Protocol error: expected CRLF after the bulk data", 0},
    {S("*1\r\n$4\r\nPING\rX"), "Protocol error: expected CRLF after the bulk data", 0},
    {S("*1\r\n$4\r\nPING\n\r"), "Protocol error: expected CRLF after the bulk data", 0},
    {S("*1\rX"), "Protocol error: expected CRLF after the multibulk length", 0},
    {S("*1\r\n$4\rXPING\r\n"), "Protocol error: expected CRLF after the bulk length", 0},
    {S("ECHO \"a\"b\r\n"), "Protocol error: unbalanced quotes in request", 0},
    {S("ECHO \"abc\r\n"), "Protocol error: unbalanced quotes in request", 0},
    {S("ECHO 'abc\r\n"), "Protocol error: unbalanced quotes in request", 0},
    {S("ECHO \"a\\\"\r\n"), "Protocol error: unbalanced quotes in request", 0},
    {S("ECHO \"a\"'b'\r\n"), "Protocol error: unbalanced quotes in request", 0},
    {S("ECHO 'a'b\n"), "Protocol error: unbalanced quotes in request", 0},
    {S("ECHO \"a\\\n"), "Protocol error: unbalanced quotes in request", 0},
    {S("PI\0NG\r\n"), "Protocol error: NUL byte in inline request", 0},
    {S("PING \0\n"), "Protocol error: NUL byte in inline request", 0},
    {S("PING\r\n*x\r\n"), "Protocol error: invalid multibulk length", 1},
    {S("*0\r\n*1\r\n$1\r\nx\r\n*1\r\n$1\r\nxyz"),
     "Protocol error: expected CRLF after the bulk data", 2},
};

static void test_request_invalid(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(req_invalid) / sizeof(req_invalid[0]); i++) {
        const struct req_bad *c = &req_invalid[i];
        struct tlog whole = {0};
        char want[256];
        const char *line;
        size_t msgs = 0;

        requests_every_split(NULL, c->in, c->in_len, &whole);
        snprintf(want, sizeof(want), "INVALID %s\n", c->error);
        line = strstr(whole.buf, "INVALID ");
        if (line == NULL || strncmp(line, want, strlen(want)) != 0) {
            print_error("case %zu: want %s got:\n%s\n", i, want, whole.buf);
            fail();
        }
        for (const char *m = whole.buf; (m = strstr(m, "MSG ")) != NULL; m++)
            msgs++;
        assert_int_equal(msgs, c->done);
        log_free(&whole);
    }
}

/* After RESP_INVALID the parser stays failed; a reset makes it usable again. */
static void test_request_error_is_sticky_until_reset(void **state)
{
    struct resp_parser *p = resp_parser_new(NULL);
    struct resp_request r;

    (void)state;
    assert_string_equal(resp_parser_error(p), "");
    assert_int_equal(resp_parse_request(p, S("*x\r\n"), &r), RESP_INVALID);
    assert_string_equal(resp_parser_error(p), "Protocol error: invalid multibulk length");
    assert_int_equal(resp_parse_request(p, S("PING\r\n"), &r), RESP_INVALID);
    resp_parser_reset(p);
    assert_int_equal(resp_parse_request(p, S("PING\r\n"), &r), RESP_DONE);
    assert_int_equal(r.argc, 1);
    assert_int_equal(r.is_inline, 1);
    /* a reset in the middle of a message forgets it */
    assert_int_equal(resp_parse_request(p, S("*2\r\n$3\r\nGET\r\n"), &r), RESP_PARTIAL);
    resp_parser_reset(p);
    assert_int_equal(resp_parse_request(p, S("*1\r\n$3\r\nGET\r\n"), &r), RESP_DONE);
    assert_int_equal(r.argc, 1);
    assert_int_equal(r.len, 13);
    assert_int_equal(resp_parse_request(p, "", 0, &r), RESP_PARTIAL);
    resp_parser_free(p);
    resp_parser_free(NULL);
}

/* ---- Limits: exactly at the limit is accepted, one past it rejected ------------------------ */

static int parse_once(const struct resp_limits *lim, const char *in, size_t n, char *err,
                      size_t errlen)
{
    struct resp_parser *p = resp_parser_new(lim);
    struct resp_request r;
    int rc;
    assert_non_null(p);
    rc = resp_parse_request(p, in, n, &r);
    snprintf(err, errlen, "%s", rc == RESP_INVALID ? resp_parser_error(p) : "");
    resp_parser_free(p);
    return rc;
}

static void test_request_limits(void **state)
{
    struct resp_limits lim = {.max_bulk = 5, .max_args = 3, .max_inline = 10};
    char err[128];

    (void)state;
    assert_int_equal(parse_once(&lim, S("*3\r\n$1\r\na\r\n$1\r\nb\r\n$5\r\nccccc\r\n"), err, 128),
                     RESP_DONE);
    assert_int_equal(parse_once(&lim, S("*4\r\n"), err, 128), RESP_INVALID);
    assert_string_equal(err, "Protocol error: invalid multibulk length");
    assert_int_equal(parse_once(&lim, S("*1\r\n$6\r\n"), err, 128), RESP_INVALID);
    assert_string_equal(err, "Protocol error: invalid bulk length");

    /* inline: bytes before '\n' (a '\r' included) count against max_inline */
    assert_int_equal(parse_once(&lim, S("abcdefghij\n"), err, 128), RESP_DONE);
    assert_int_equal(parse_once(&lim, S("abcdefghi\r\n"), err, 128), RESP_DONE);
    assert_int_equal(parse_once(&lim, S("abcdefghijk\n"), err, 128), RESP_INVALID);
    assert_string_equal(err, "Protocol error: too big inline request");
    assert_int_equal(parse_once(&lim, S("abcdefghij"), err, 128), RESP_PARTIAL);
    assert_int_equal(parse_once(&lim, S("abcdefghijk"), err, 128), RESP_INVALID);
    assert_string_equal(err, "Protocol error: too big inline request");
    /* inline arguments count against max_args as multibulk ones do */
    assert_int_equal(parse_once(&lim, S("a b  c\n"), err, 128), RESP_DONE);
    assert_int_equal(parse_once(&lim, S("a b c d\n"), err, 128), RESP_INVALID);
    assert_string_equal(err, "Protocol error: too many arguments in inline request");

    /* the defaults: Redis's 512 MB bulk, our 8 Mi arguments */
    assert_int_equal(parse_once(NULL, S("*1\r\n$536870912\r\n"), err, 128), RESP_PARTIAL);
    assert_int_equal(parse_once(NULL, S("*1\r\n$536870913\r\n"), err, 128), RESP_INVALID);
    assert_string_equal(err, "Protocol error: invalid bulk length");
    assert_int_equal(parse_once(NULL, S("*8388608\r\n"), err, 128), RESP_PARTIAL);
    assert_int_equal(parse_once(NULL, S("*8388609\r\n"), err, 128), RESP_INVALID);
    assert_string_equal(err, "Protocol error: invalid multibulk length");
}

/* Header lines: RESP_MAX_LINE bytes before the CR are read (and then judged as a number), one
 * more is "too big", with or without a CR in sight. */
static void test_request_header_line_limit(void **state)
{
    size_t n = RESP_MAX_LINE + 8;
    char *buf = malloc(n);
    char err[128];

    (void)state;
    assert_non_null(buf);
    memset(buf, '1', n);
    buf[0] = '*';
    buf[RESP_MAX_LINE] = '\r';
    buf[RESP_MAX_LINE + 1] = '\n';
    assert_int_equal(parse_once(NULL, buf, RESP_MAX_LINE + 2, err, 128), RESP_INVALID);
    assert_string_equal(err, "Protocol error: invalid multibulk length");
    assert_int_equal(parse_once(NULL, buf, RESP_MAX_LINE, err, 128), RESP_PARTIAL);
    buf[RESP_MAX_LINE] = '1';
    assert_int_equal(parse_once(NULL, buf, RESP_MAX_LINE + 1, err, 128), RESP_INVALID);
    assert_string_equal(err, "Protocol error: too big mbulk count string");
    buf[RESP_MAX_LINE + 1] = '\r';
    buf[RESP_MAX_LINE + 2] = '\n';
    assert_int_equal(parse_once(NULL, buf, RESP_MAX_LINE + 3, err, 128), RESP_INVALID);
    assert_string_equal(err, "Protocol error: too big mbulk count string");

    /* the same for a bulk header after "*1\r\n" */
    memset(buf, '1', n);
    memcpy(buf, "*1\r\n$", 5);
    buf[4 + RESP_MAX_LINE] = '\r';
    buf[4 + RESP_MAX_LINE + 1] = '\n';
    assert_int_equal(parse_once(NULL, buf, 4 + RESP_MAX_LINE + 2, err, 128), RESP_INVALID);
    assert_string_equal(err, "Protocol error: invalid bulk length");
    assert_int_equal(parse_once(NULL, buf, 4 + RESP_MAX_LINE, err, 128), RESP_PARTIAL);
    buf[4 + RESP_MAX_LINE] = '1';
    assert_int_equal(parse_once(NULL, buf, 4 + RESP_MAX_LINE + 1, err, 128), RESP_INVALID);
    assert_string_equal(err, "Protocol error: too big bulk count string");
    free(buf);
}

/* A huge declared count costs nothing until arguments arrive, then argv grows with them. */
static void test_request_huge_count_allocates_nothing(void **state)
{
    struct resp_limits lim = {.max_bulk = RESP_DEFAULT_MAX_BULK,
                              .max_args = SIZE_MAX,
                              .max_inline = RESP_DEFAULT_MAX_INLINE};
    static const char *counts[] = {"*2147483647\r\n", "*9223372036854775807\r\n"};
    size_t before, probe;
    char *big;

    (void)state;
    /* the probe must see a 1 MB block, or the assertions below would prove nothing */
    before = heap_in_use();
    big = malloc(1 << 20);
    assert_non_null(big);
    memset(big, 1, 1 << 20);
    probe = heap_in_use() - before;
    assert_true(probe >= (1 << 20));
    free(big);

    for (size_t c = 0; c < 2; c++) {
        size_t n = strlen(counts[c]), base;
        char *msg = malloc(n + 7 * 2000);
        struct resp_parser *p;
        struct resp_request r;

        assert_non_null(msg);
        memcpy(msg, counts[c], n);
        for (int i = 0; i < 2000; i++) {
            memcpy(msg + n, "$1\r\nx\r\n", 7);
            n += 7;
        }
        before = heap_in_use();
        p = resp_parser_new(&lim);
        assert_non_null(p);
        base = strlen(counts[c]) + 3 * 7;
        assert_int_equal(resp_parse_request(p, msg, base, &r), RESP_PARTIAL);
        assert_true(heap_in_use() - before < 4096);
        /* 2000 arguments: a few tens of KB, not gigabytes */
        assert_int_equal(resp_parse_request(p, msg, n, &r), RESP_PARTIAL);
        assert_true(heap_in_use() - before < 2000 * 2 * sizeof(struct resp_slice) + 4096);
        resp_parser_free(p);
        free(msg);
    }
}

/* A message arriving in tiny pieces costs linear time: 1 Mi arguments fed 3 bytes at a time,
 * and a 4 MB inline line fed 1 byte at a time. A parser that rescanned from the message start
 * on every call would need hours here. */
static void test_request_linear_time(void **state)
{
    size_t nargs = 1 << 20, n = 0;
    size_t cap = 16 + nargs * 7;
    char *msg = malloc(cap);
    struct resp_parser *p = resp_parser_new(NULL);
    struct resp_limits lim = {.max_bulk = 16, .max_args = 16, .max_inline = 8 << 20};
    struct resp_request r;
    clock_t t0 = clock();
    int rc = RESP_PARTIAL;

    (void)state;
    assert_non_null(msg);
    assert_non_null(p);
    memcpy(msg, "*1048576\r\n", 10);
    n = 10;
    for (size_t i = 0; i < nargs; i++) {
        memcpy(msg + n, "$1\r\nx\r\n", 7);
        n += 7;
    }
    for (size_t have = 3; rc == RESP_PARTIAL; have = have + 3 < n ? have + 3 : n)
        rc = resp_parse_request(p, msg, have, &r);
    assert_int_equal(rc, RESP_DONE);
    assert_int_equal(r.argc, nargs);
    assert_int_equal(r.len, n);
    assert_int_equal(r.argv[nargs - 1].off, n - 3);
    resp_parser_free(p);

    p = resp_parser_new(&lim);
    assert_non_null(p);
    n = 4 << 20;
    memset(msg, 'a', n);
    msg[n - 1] = '\n';
    rc = RESP_PARTIAL;
    for (size_t have = 1; rc == RESP_PARTIAL && have <= n; have++)
        rc = resp_parse_request(p, msg, have, &r);
    assert_int_equal(rc, RESP_DONE);
    assert_int_equal(r.argc, 1);
    assert_int_equal(r.argv[0].len, n - 1);
    resp_parser_free(p);
    free(msg);
    assert_true((double)(clock() - t0) / CLOCKS_PER_SEC < 60.0);
}

/* ---- Reply scanner ------------------------------------------------------------------------- */

/* Feeds replies in chunks ending at cuts[], consuming what the scanner reports, copying what is
 * still unconsumed to a new exact-size block on each call. Logs each reply's end and type. */
static void feed_replies(const char *in, size_t n, const size_t *cuts, size_t ncuts,
                         struct tlog *log)
{
    struct resp_scanner s;
    size_t start = 0;
    int rc = RESP_SCAN_MORE;

    resp_scanner_init(&s);
    for (size_t c = 0; c < ncuts && rc != RESP_SCAN_INVALID; c++) {
        size_t have = cuts[c];
        while (start < have) {
            size_t avail = have - start, used = 12345;
            char *copy = malloc(avail);
            assert_non_null(copy);
            memcpy(copy, in + start, avail);
            rc = resp_scan_reply(&s, copy, avail, &used);
            free(copy);
            assert_true(used <= avail);
            if (rc == RESP_SCAN_INVALID) {
                log_fmt(log, "INVALID\n");
                break;
            }
            start += used;
            if (rc == RESP_SCAN_MORE)
                break;
            assert_int_equal(rc, RESP_SCAN_DONE);
            assert_true(used > 0);
            log_fmt(log, "REPLY end=%zu type=%c\n", start, s.top_type);
        }
    }
    /* where an error is noticed depends on the split, so only the verdict is logged */
    if (rc == RESP_SCAN_INVALID)
        log_fmt(log, "END rc=%d\n", rc);
    else
        log_fmt(log, "END consumed=%zu rc=%d\n", start, rc);
}

static void replies_every_split(const char *in, size_t n, struct tlog *whole)
{
    size_t cuts[3];
    size_t *bytes = malloc((n + 1) * sizeof(*bytes));

    assert_non_null(bytes);
    cuts[0] = n;
    feed_replies(in, n, cuts, 1, whole);
    for (size_t k = 0; k <= n; k++) {
        struct tlog t = {0};
        cuts[0] = k;
        cuts[1] = n;
        feed_replies(in, n, cuts, 2, &t);
        assert_logs_equal(whole, &t, "reply", k);
        log_free(&t);
    }
    if (n <= 80) {
        for (size_t a = 0; a <= n; a++) {
            for (size_t b = a; b <= n; b++) {
                struct tlog t = {0};
                cuts[0] = a;
                cuts[1] = b;
                cuts[2] = n;
                feed_replies(in, n, cuts, 3, &t);
                assert_logs_equal(whole, &t, "reply", a * 1000 + b);
                log_free(&t);
            }
        }
    }
    for (size_t k = 0; k < n; k++)
        bytes[k] = k + 1;
    {
        struct tlog t = {0};
        feed_replies(in, n, bytes, n, &t);
        assert_logs_equal(whole, &t, "reply bytewise", 1);
        log_free(&t);
    }
    free(bytes);
}

struct reply_case {
    const char *in;
    size_t len;
};

static const struct reply_case replies_valid[] = {
    {S("+OK\r\n")},
    {S("-ERR unknown command 'x'\r\n")},
    {S(":0\r\n")},
    {S(":-42\r\n")},
    {S(":9223372036854775807\r\n")},
    {S(":-9223372036854775808\r\n")},
    {S(":999999999999999999\r\n")},  /* 18 digits: the scanner's one-pass header */
    {S(":1000000000000000000\r\n")}, /* 19: the general one */
    {S("$5\r\nhello\r\n")},
    {S("$10\r\n0123456789\r\n")},
    {S("$0\r\n\r\n")},
    {S("$-1\r\n")},
    {S("$6\r\na\r\n\0bc\r\n")},
    {S("*-1\r\n")},
    {S("*0\r\n")},
    {S("*2\r\n$3\r\nfoo\r\n:1\r\n")},
    {S("*2\r\n*2\r\n:1\r\n:2\r\n*1\r\n*0\r\n")},
    {S("*3\r\n$-1\r\n*-1\r\n_\r\n")},
    {S("%2\r\n+a\r\n:1\r\n+b\r\n*1\r\n:2\r\n")},
    {S("%0\r\n")},
    {S("~2\r\n+a\r\n+b\r\n")},
    {S(">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n")},
    /* a push inside a reply is no element of it (Redis 7.0: a keyspace event in the reply of a
     * blocked BZPOPMAX it serves to a RESP3 client listening to such events) */
    {S("*3\r\n$3\r\nz:1\r\n>3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$1\r\nm\r\n$1\r\nm\r\n,0\r\n")},
    {S("*2\r\n:1\r\n>2\r\n:2\r\n*1\r\n>1\r\n:3\r\n:4\r\n:5\r\n")},
    {S("_\r\n")},
    {S(",3.14\r\n")},
    {S(",-inf\r\n")},
    {S("#t\r\n")},
    {S("#f\r\n")},
    {S("=15\r\ntxt:Some string\r\n")},
    {S("(3492890328409238509324850943850943825024385\r\n")},
    {S("(-12\r\n")},
    {S("(123  123\r\n")}, /* a script's big_number, as Redis 7.0 relays it */
    {S("!21\r\nSYNTAX invalid syntax\r\n")},
    {S("|1\r\n+key-popularity\r\n%2\r\n$1\r\na\r\n,0.1923\r\n$1\r\nb\r\n,0.0012\r\n"
       "*2\r\n:2039123\r\n:9543892\r\n")},
    {S("*2\r\n|1\r\n+ttl\r\n:3600\r\n:1\r\n:2\r\n")},
    {S("|0\r\n:1\r\n")},
    {S("+\r\n")},
};

static void test_reply_valid_every_split(void **state)
{
    struct tlog want = {0}, whole = {0};
    char *all;
    size_t total = 0, n = 0;

    (void)state;
    for (size_t i = 0; i < sizeof(replies_valid) / sizeof(replies_valid[0]); i++) {
        const struct reply_case *c = &replies_valid[i];
        struct tlog one = {0};
        char expect[128];
        total += c->len;
        log_fmt(&want, "REPLY end=%zu type=%c\n", total, c->in[0]);
        /* each reply alone, every split */
        replies_every_split(c->in, c->len, &one);
        snprintf(expect, sizeof(expect), "REPLY end=%zu type=%c\nEND consumed=%zu rc=0\n", c->len,
                 c->in[0], c->len);
        if (strcmp(one.buf, expect) != 0) {
            print_error("reply case %zu: got\n%s\n", i, one.buf);
            fail();
        }
        log_free(&one);
    }
    log_fmt(&want, "END consumed=%zu rc=0\n", total);
    /* and all of them back to back, as a pipeline's replies */
    all = malloc(total);
    assert_non_null(all);
    for (size_t i = 0; i < sizeof(replies_valid) / sizeof(replies_valid[0]); i++) {
        memcpy(all + n, replies_valid[i].in, replies_valid[i].len);
        n += replies_valid[i].len;
    }
    {
        size_t cuts[2];
        for (size_t k = 0; k <= n; k++) {
            struct tlog t = {0};
            cuts[0] = k;
            cuts[1] = n;
            feed_replies(all, n, cuts, 2, &t);
            assert_logs_equal(&want, &t, "pipeline", k);
            log_free(&t);
        }
        {
            size_t *bytes = malloc(n * sizeof(*bytes));
            assert_non_null(bytes);
            for (size_t k = 0; k < n; k++)
                bytes[k] = k + 1;
            feed_replies(all, n, bytes, n, &whole);
            assert_logs_equal(&want, &whole, "pipeline bytewise", 1);
            free(bytes);
        }
    }
    free(all);
    log_free(&want);
    log_free(&whole);
}

static const struct reply_case replies_invalid[] = {
    {S("?\r\n")},
    {S("x")},
    {S(":abc\r\n")},
    {S(":01\r\n")},
    {S("$01\r\n")},
    {S("*00\r\n")},
    {S(":-0\r\n")},
    {S(":\r\n")},
    {S(":1\rX")},
    {S("$-2\r\n")},
    {S("$abc\r\n")},
    {S("$3\r\nfooXY")},
    {S("$3\r\nfoo\rX")},
    {S("$3\r\nfoo\n\r")},
    {S("$3\r\nfooX\n")},
    {S("$3\r\nfoo\n\n")},
    {S("$9223372036854775806\r\n")},
    {S("*-2\r\n")},
    {S("~-1\r\n")},
    {S("%-1\r\n")},
    {S(">-1\r\n")},
    {S("|-1\r\n")},
    {S("=-1\r\n")},
    {S("!-1\r\n")},
    {S("%4611686018427387904\r\n")},
    {S("_x\r\n")},
    {S("#x\r\n")},
    {S("#\r\n")},
    {S("#tt\r\n")},
    {S("+OK\rX")},
    {S("*1\r\n?\r\n")},
    {S("*1\n:1\r\n")},
    {S("*2\r\n:1\r\n:2\r\n*1\r\n$1\r\nab\r\n")},
    {S("*?\r\n")},
};

static void test_reply_invalid(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(replies_invalid) / sizeof(replies_invalid[0]); i++) {
        const struct reply_case *c = &replies_invalid[i];
        struct tlog whole = {0};
        size_t used = 0;
        replies_every_split(c->in, c->len, &whole);
        if (strstr(whole.buf, "INVALID\n") == NULL) {
            print_error("reply invalid case %zu accepted:\n%s\n", i, whole.buf);
            fail();
        }
        /* skipping the first element fails too, unless a whole reply precedes the bad bytes */
        if (strstr(whole.buf, "REPLY") == NULL)
            assert_int_equal(resp_skip_elem(c->in, c->len, &used), RESP_INVALID);
        log_free(&whole);
    }
}

/* n nested one-element arrays around ":1\r\n". */
static char *nested(size_t depth, size_t *len)
{
    char *b = malloc(depth * 4 + 5);
    assert_non_null(b);
    for (size_t i = 0; i < depth; i++)
        memcpy(b + i * 4, "*1\r\n", 4);
    memcpy(b + depth * 4, ":1\r\n", 4);
    *len = depth * 4 + 4;
    return b;
}

/* depth two-element arrays, each with the next one first and ":2" last, around ":1": every level
 * stays open while its first element is scanned. */
static char *nested_first(size_t depth, size_t *len)
{
    char *b = malloc(depth * 8 + 5);
    assert_non_null(b);
    for (size_t i = 0; i < depth; i++)
        memcpy(b + i * 4, "*2\r\n", 4);
    memcpy(b + depth * 4, ":1\r\n", 4);
    for (size_t i = 0; i < depth; i++)
        memcpy(b + depth * 4 + 4 + i * 4, ":2\r\n", 4);
    *len = depth * 8 + 4;
    return b;
}

static void test_reply_depth_limit(void **state)
{
    size_t len, used;
    char *b;
    struct resp_scanner s;

    (void)state;
    /* Nesting through last elements is followed at any depth (Redis returns such replies for a
     * script whose table contains itself, down to Lua's stack limit), split or whole. */
    b = nested(200000, &len);
    resp_scanner_init(&s);
    assert_int_equal(resp_scan_reply(&s, b, len, &used), RESP_SCAN_DONE);
    assert_int_equal(used, len);
    assert_int_equal(resp_skip_elem(b, len, &used), RESP_DONE);
    assert_int_equal(used, len);
    resp_scanner_init(&s);
    assert_int_equal(resp_scan_reply(&s, b, len / 2, &used), RESP_SCAN_MORE);
    assert_int_equal(resp_scan_reply(&s, b + used, len - used, &used), RESP_SCAN_DONE);
    free(b);
    b = nested(RESP_MAX_DEPTH, &len);
    memcpy(b + len - 4, "*0\r\n", 4); /* an empty aggregate at the bottom opens nothing */
    assert_int_equal(resp_skip_elem(b, len, &used), RESP_DONE);
    assert_int_equal(used, len);
    free(b);

    /* Aggregates open before their parents' ends: RESP_MAX_DEPTH of them, not one more. */
    b = nested_first(RESP_MAX_DEPTH, &len);
    resp_scanner_init(&s);
    assert_int_equal(resp_scan_reply(&s, b, len, &used), RESP_SCAN_DONE);
    assert_int_equal(used, len);
    assert_int_equal(resp_skip_elem(b, len, &used), RESP_DONE);
    free(b);
    b = nested_first(RESP_MAX_DEPTH + 1, &len);
    resp_scanner_init(&s);
    assert_int_equal(resp_scan_reply(&s, b, len, &used), RESP_SCAN_INVALID);
    assert_int_equal(resp_skip_elem(b, len, &used), RESP_INVALID);
    free(b);
    /* far deeper input costs no stack: rejected, not crashed */
    b = nested_first(200000, &len);
    assert_int_equal(resp_skip_elem(b, len, &used), RESP_INVALID);
    free(b);
}

/* A bulk is consumed as it arrives; only its CRLF is checked; bulk_left tracks what remains. */
static void test_reply_bulk_in_pieces(void **state)
{
    struct resp_scanner s;
    size_t used;
    static char chunk[65536];
    long long size = 100LL << 20, left;

    (void)state;
    resp_scanner_init(&s);
    assert_int_equal(resp_scan_reply(&s, S("$10\r\n01234"), &used), RESP_SCAN_MORE);
    assert_int_equal(used, 10);
    assert_int_equal(s.bulk_left, 7);
    assert_int_equal(s.top_type, '$');
    assert_int_equal(resp_scan_reply(&s, S("56789\r"), &used), RESP_SCAN_MORE);
    assert_int_equal(used, 6);
    assert_int_equal(s.bulk_left, 1);
    assert_int_equal(resp_scan_reply(&s, S("\n+OK\r\n"), &used), RESP_SCAN_DONE);
    assert_int_equal(used, 1);
    assert_int_equal(s.top_type, '$');
    assert_int_equal(resp_scan_reply(&s, S("+OK\r\n"), &used), RESP_SCAN_DONE);
    assert_int_equal(s.top_type, '+');
    /* the finished reply's type is forgotten on the next call */
    assert_int_equal(resp_scan_reply(&s, "", 0, &used), RESP_SCAN_MORE);
    assert_int_equal(s.top_type, 0);

    /* an unfinished header line is left for the next call */
    resp_scanner_init(&s);
    assert_int_equal(resp_scan_reply(&s, S("*3\r\n:1\r\n:2"), &used), RESP_SCAN_MORE);
    assert_int_equal(used, 8);
    assert_int_equal(s.line_seen, 2);
    assert_int_equal(resp_scan_reply(&s, S(":2\r\n:3\r\n"), &used), RESP_SCAN_DONE);
    assert_int_equal(used, 8);
    assert_int_equal(s.top_type, '*');

    /* a 100 MB reply streamed in 64 KB pieces, never held whole */
    resp_scanner_init(&s);
    assert_int_equal(resp_scan_reply(&s, S("*2\r\n$104857600\r\n"), &used), RESP_SCAN_MORE);
    assert_int_equal(used, 16);
    for (left = size; left > 0; left -= (long long)sizeof(chunk)) {
        assert_int_equal(resp_scan_reply(&s, chunk, sizeof(chunk), &used), RESP_SCAN_MORE);
        assert_int_equal(used, sizeof(chunk));
    }
    assert_int_equal(s.bulk_left, 2);
    assert_int_equal(resp_scan_reply(&s, S("\r\n+x\r\n"), &used), RESP_SCAN_DONE);
    assert_int_equal(used, 6);
    assert_int_equal(s.top_type, '*');

    /* a bad terminator is caught even when the bulk arrives in pieces */
    resp_scanner_init(&s);
    assert_int_equal(resp_scan_reply(&s, S("$3\r\nab"), &used), RESP_SCAN_MORE);
    assert_int_equal(resp_scan_reply(&s, S("c\r"), &used), RESP_SCAN_MORE);
    assert_int_equal(resp_scan_reply(&s, S("x"), &used), RESP_SCAN_INVALID);

    /* nothing to scan */
    resp_scanner_init(&s);
    assert_int_equal(resp_scan_reply(&s, "", 0, &used), RESP_SCAN_MORE);
    assert_int_equal(used, 0);
    assert_int_equal(s.top_type, 0);
}

/* Header lines up to RESP_MAX_LINE bytes before the CR are accepted; longer ones are not. */
static void test_reply_line_limit(void **state)
{
    size_t n = RESP_MAX_LINE + 3, used;
    char *b = malloc(n);
    struct resp_scanner s;

    (void)state;
    assert_non_null(b);
    memset(b, 'a', n);
    b[0] = '+';
    b[RESP_MAX_LINE] = '\r';
    b[RESP_MAX_LINE + 1] = '\n';
    resp_scanner_init(&s);
    assert_int_equal(resp_scan_reply(&s, b, RESP_MAX_LINE + 2, &used), RESP_SCAN_DONE);
    assert_int_equal(used, RESP_MAX_LINE + 2);
    resp_scanner_init(&s);
    assert_int_equal(resp_scan_reply(&s, b, RESP_MAX_LINE, &used), RESP_SCAN_MORE);
    assert_int_equal(used, 0);
    b[RESP_MAX_LINE] = 'a';
    b[RESP_MAX_LINE + 1] = '\r';
    b[RESP_MAX_LINE + 2] = '\n';
    resp_scanner_init(&s);
    assert_int_equal(resp_scan_reply(&s, b, RESP_MAX_LINE + 1, &used), RESP_SCAN_INVALID);
    resp_scanner_init(&s);
    assert_int_equal(resp_scan_reply(&s, b, RESP_MAX_LINE + 3, &used), RESP_SCAN_INVALID);
    free(b);
}

/* Replies fed in small pieces cost linear time: a 1 Mi-element array 3 bytes at a time, and a
 * RESP_MAX_LINE status line 1 byte at a time, each call passing the unconsumed rest again. */
static void test_reply_linear_time(void **state)
{
    size_t nel = 1 << 20, n = 0, start = 0, used;
    char *b = malloc(16 + nel * 4);
    struct resp_scanner s;
    clock_t t0 = clock();
    int rc = RESP_SCAN_MORE;

    (void)state;
    assert_non_null(b);
    memcpy(b, "*1048576\r\n", 10);
    n = 10;
    for (size_t i = 0; i < nel; i++) {
        memcpy(b + n, ":7\r\n", 4);
        n += 4;
    }
    resp_scanner_init(&s);
    for (size_t have = 3; rc == RESP_SCAN_MORE; have = have + 3 < n ? have + 3 : n) {
        rc = resp_scan_reply(&s, b + start, have - start, &used);
        start += used;
    }
    assert_int_equal(rc, RESP_SCAN_DONE);
    assert_int_equal(start, n);

    memset(b, 'x', RESP_MAX_LINE);
    b[0] = '+';
    b[RESP_MAX_LINE] = '\r';
    b[RESP_MAX_LINE + 1] = '\n';
    resp_scanner_init(&s);
    rc = RESP_SCAN_MORE;
    for (size_t have = 1; rc == RESP_SCAN_MORE; have++) {
        rc = resp_scan_reply(&s, b, have, &used);
        if (rc == RESP_SCAN_MORE) {
            assert_int_equal(used, 0);
            assert_true(s.line_seen <= have);
        }
    }
    assert_int_equal(rc, RESP_SCAN_DONE);
    assert_int_equal(used, RESP_MAX_LINE + 2);
    free(b);
    assert_true((double)(clock() - t0) / CLOCKS_PER_SEC < 60.0);
}

/* ---- Element reader and skipper ------------------------------------------------------------ */

static void test_read_elem(void **state)
{
    struct resp_elem e;
    size_t used;

    (void)state;
    assert_int_equal(resp_read_elem(S("+OK\r\nrest"), &e, &used), RESP_DONE);
    assert_int_equal(e.type, '+');
    assert_int_equal(used, 5);
    assert_int_equal(e.len, 2);
    assert_memory_equal(e.str, "OK", 2);

    assert_int_equal(resp_read_elem(S("-ERR x\r\n"), &e, &used), RESP_DONE);
    assert_int_equal(e.type, '-');
    assert_int_equal(e.len, 5);
    assert_memory_equal(e.str, "ERR x", 5);

    assert_int_equal(resp_read_elem(S(":-17\r\n"), &e, &used), RESP_DONE);
    assert_int_equal(e.type, ':');
    assert_int_equal(e.ival, -17);
    assert_int_equal(used, 6);

    assert_int_equal(resp_read_elem(S("$3\r\nf\0o\r\n"), &e, &used), RESP_DONE);
    assert_int_equal(e.type, '$');
    assert_int_equal(used, 9);
    assert_int_equal(e.len, 3);
    assert_memory_equal(e.str, "f\0o", 3);

    assert_int_equal(resp_read_elem(S("$-1\r\n"), &e, &used), RESP_DONE);
    assert_null(e.str);
    assert_int_equal(used, 5);

    assert_int_equal(resp_read_elem(S("*3\r\n:1\r\n"), &e, &used), RESP_DONE);
    assert_int_equal(e.type, '*');
    assert_int_equal(e.count, 3);
    assert_int_equal(used, 4);

    assert_int_equal(resp_read_elem(S("*-1\r\n"), &e, &used), RESP_DONE);
    assert_int_equal(e.count, -1);

    assert_int_equal(resp_read_elem(S("%2\r\n"), &e, &used), RESP_DONE);
    assert_int_equal(e.type, '%');
    assert_int_equal(e.count, 4);

    assert_int_equal(resp_read_elem(S("|1\r\n"), &e, &used), RESP_DONE);
    assert_int_equal(e.count, 3);

    assert_int_equal(resp_read_elem(S("~5\r\n"), &e, &used), RESP_DONE);
    assert_int_equal(e.count, 5);
    assert_int_equal(resp_read_elem(S(">0\r\n"), &e, &used), RESP_DONE);
    assert_int_equal(e.count, 0);

    assert_int_equal(resp_read_elem(S("#t\r\n"), &e, &used), RESP_DONE);
    assert_int_equal(e.ival, 1);
    assert_int_equal(resp_read_elem(S("#f\r\n"), &e, &used), RESP_DONE);
    assert_int_equal(e.ival, 0);

    assert_int_equal(resp_read_elem(S("_\r\n"), &e, &used), RESP_DONE);
    assert_int_equal(e.type, '_');
    assert_null(e.str);

    assert_int_equal(resp_read_elem(S(",1.5\r\n"), &e, &used), RESP_DONE);
    assert_int_equal(e.len, 3);
    assert_memory_equal(e.str, "1.5", 3);

    assert_int_equal(resp_read_elem(S("(123456789012345678901234567890\r\n"), &e, &used),
                     RESP_DONE);
    assert_int_equal(e.len, 30);

    assert_int_equal(resp_read_elem(S("=8\r\ntxt:abcd\r\n"), &e, &used), RESP_DONE);
    assert_int_equal(e.type, '=');
    assert_int_equal(e.len, 8);
    assert_memory_equal(e.str, "txt:abcd", 8);

    assert_int_equal(resp_read_elem(S("!3\r\nERR\r\n"), &e, &used), RESP_DONE);
    assert_int_equal(e.type, '!');
    assert_int_equal(e.len, 3);

    /* cut short, or broken */
    assert_int_equal(resp_read_elem(S("$3\r\nfo"), &e, &used), RESP_PARTIAL);
    assert_int_equal(resp_read_elem(S("$3\r\nfoo\r"), &e, &used), RESP_PARTIAL);
    assert_int_equal(resp_read_elem(S("+OK"), &e, &used), RESP_PARTIAL);
    assert_int_equal(resp_read_elem(S("+OK\r"), &e, &used), RESP_PARTIAL);
    assert_int_equal(resp_read_elem("", 0, &e, &used), RESP_PARTIAL);
    assert_int_equal(resp_read_elem(S("$3\r\nfooxx"), &e, &used), RESP_INVALID);
    assert_int_equal(resp_read_elem(S(":x\r\n"), &e, &used), RESP_INVALID);
    assert_int_equal(resp_read_elem(S("?\r\n"), &e, &used), RESP_INVALID);
}

static void test_skip_elem(void **state)
{
    static const char cmd[] =
        "*2\r\n*6\r\n$3\r\nget\r\n:2\r\n*2\r\n+readonly\r\n+fast\r\n:1\r\n:1\r\n"
        ":1\r\n%1\r\n+k\r\n~1\r\n+v\r\n:9\r\n";
    size_t len = sizeof(cmd) - 1, used;

    (void)state;
    assert_int_equal(resp_skip_elem(cmd, len, &used), RESP_DONE);
    assert_int_equal(used, len - 4);
    /* every proper prefix is partial */
    for (size_t k = 0; k < len - 4; k++)
        assert_int_equal(resp_skip_elem(cmd, k, &used), RESP_PARTIAL);
    /* a child skipped on its own */
    assert_int_equal(resp_skip_elem(cmd + 4, len - 4, &used), RESP_DONE);
    assert_memory_equal(cmd + 4 + used, "%1\r\n", 4);
    /* the element after an attribute belongs to it */
    assert_int_equal(resp_skip_elem(S("|1\r\n+a\r\n+b\r\n:5\r\n:6\r\n"), &used), RESP_DONE);
    assert_int_equal(used, 16);
    assert_int_equal(resp_skip_elem(S("$-1\r\n"), &used), RESP_DONE);
    assert_int_equal(used, 5);
}

/* ---- Encoding and errors ------------------------------------------------------------------- */

static void test_write_header(void **state)
{
    char out[32];

    (void)state;
    assert_int_equal(resp_write_header(out, '*', 3), 4);
    assert_memory_equal(out, "*3\r\n", 4);
    assert_int_equal(resp_write_header(out, '$', 0), 4);
    assert_memory_equal(out, "$0\r\n", 4);
    assert_int_equal(resp_write_header(out, '*', -1), 5);
    assert_memory_equal(out, "*-1\r\n", 5);
    assert_int_equal(resp_write_header(out, '$', 1234567890), 13);
    assert_memory_equal(out, "$1234567890\r\n", 13);
    assert_int_equal(resp_write_header(out, ':', LLONG_MAX), 22);
    assert_memory_equal(out, ":9223372036854775807\r\n", 22);
    assert_int_equal(resp_write_header(out, ':', LLONG_MIN), 23);
    assert_memory_equal(out, ":-9223372036854775808\r\n", 23);
}

static void test_fg_strerror(void **state)
{
    static const int codes[] = {FG_OK,          FG_ERR_NOMEM,    FG_ERR_PROTO,
                                FG_ERR_LIMIT,   FG_ERR_CONFIG,   FG_ERR_IO,
                                FG_ERR_UNAVAIL, FG_ERR_NOTFOUND, FG_ERR_AGAIN};
    size_t n = sizeof(codes) / sizeof(codes[0]);

    (void)state;
    assert_string_equal(fg_strerror(FG_ERR_NOMEM), "out of memory");
    assert_string_equal(fg_strerror(12345), "unknown error");
    for (size_t i = 0; i < n; i++) {
        assert_non_null(fg_strerror(codes[i]));
        assert_string_not_equal(fg_strerror(codes[i]), "unknown error");
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(fg_strerror(codes[i]), fg_strerror(codes[j]));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_request_valid_every_split),
        cmocka_unit_test(test_request_big_binary_arg),
        cmocka_unit_test(test_request_invalid),
        cmocka_unit_test(test_request_error_is_sticky_until_reset),
        cmocka_unit_test(test_request_limits),
        cmocka_unit_test(test_request_header_line_limit),
        cmocka_unit_test(test_request_huge_count_allocates_nothing),
        cmocka_unit_test(test_request_linear_time),
        cmocka_unit_test(test_reply_valid_every_split),
        cmocka_unit_test(test_reply_invalid),
        cmocka_unit_test(test_reply_depth_limit),
        cmocka_unit_test(test_reply_bulk_in_pieces),
        cmocka_unit_test(test_reply_line_limit),
        cmocka_unit_test(test_reply_linear_time),
        cmocka_unit_test(test_read_elem),
        cmocka_unit_test(test_skip_elem),
        cmocka_unit_test(test_write_header),
        cmocka_unit_test(test_fg_strerror),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
