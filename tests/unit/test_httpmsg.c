/* test_httpmsg.c — unit tests of the HTTP/1.1 request- and response-head parsers and the
 * chunked-body decoder. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "httpmsg.h"

#define S(lit) lit, sizeof(lit) - 1
#define MAX    8192

static int slice_is(struct httpmsg_slice s, const char *want)
{
    return s.n == strlen(want) && memcmp(s.p, want, s.n) == 0;
}

/* Parses buf[0..len) whose head is head bytes: every shorter prefix says "not yet", the head
 * alone and the whole buffer (the head and what follows) give head. *req is from the last. */
static void parse_ok_max(const char *buf, size_t len, size_t head, size_t max,
                         struct httpmsg_request *req)
{
    char err[128];
    int status = 0;

    for (size_t k = 0; k < head; k++) {
        long r = httpmsg_parse_request(buf, k, max, req, &status, err, sizeof(err));
        if (r != 0)
            fail_msg("prefix %zu of %zu: %ld (%d %s)", k, head, r, status, err);
    }
    assert_int_equal(httpmsg_parse_request(buf, head, max, req, &status, err, sizeof(err)),
                     (long)head);
    status = 0;
    long r = httpmsg_parse_request(buf, len, max, req, &status, err, sizeof(err));
    if (r != (long)head)
        fail_msg("whole: %ld (%d %s), want %zu", r, status, err, head);
}

static void parse_ok(const char *buf, size_t len, size_t head, struct httpmsg_request *req)
{
    parse_ok_max(buf, len, head, MAX, req);
}

/* A head complete in the whole string. */
static void parse_head(const char *s, struct httpmsg_request *req)
{
    parse_ok(s, strlen(s), strlen(s), req);
}

/* buf[0..len) is refused with status and an err containing what; every prefix is either "not
 * yet" or the same refusal. */
static void parse_bad(const char *buf, size_t len, int want, const char *what)
{
    struct httpmsg_request req;
    char err[128], err2[128];
    int status = 0, status2;

    long r = httpmsg_parse_request(buf, len, MAX, &req, &status, err, sizeof(err));
    if (r != -1 || status != want)
        fail_msg("'%.*s': %ld status %d (%s), want -1 %d", (int)len, buf, r, status, err, want);
    if (strstr(err, what) == NULL)
        fail_msg("'%.*s': err '%s' does not say '%s'", (int)len, buf, err, what);
    for (size_t k = 0; k < len; k++) {
        status2 = 0;
        r = httpmsg_parse_request(buf, k, MAX, &req, &status2, err2, sizeof(err2));
        if (r == 0)
            continue;
        if (r != -1 || status2 != status || strcmp(err, err2) != 0)
            fail_msg("'%.*s' prefix %zu: %ld %d '%s'", (int)len, buf, k, r, status2, err2);
    }
}

#define BAD(lit, st, what) parse_bad(S(lit), st, what)

/* ---- Valid requests ------------------------------------------------------------------------ */

static void test_get(void **state)
{
    struct httpmsg_request req;
    struct httpmsg_slice v;

    parse_head("GET /v1/locks?x=1 HTTP/1.1\r\nHost: a.b\r\nUser-Agent: t/1\r\n\r\n", &req);
    assert_true(slice_is(req.method, "GET"));
    assert_true(slice_is(req.target, "/v1/locks?x=1"));
    assert_int_equal(req.minor, 1);
    assert_int_equal(req.nheaders, 2);
    assert_true(slice_is(req.headers[0].name, "Host"));
    assert_true(slice_is(req.headers[0].value, "a.b"));
    assert_true(slice_is(req.headers[1].name, "User-Agent"));
    assert_int_equal(req.body, HTTPMSG_BODY_NONE);
    assert_int_equal(req.keep_alive, 1);
    assert_int_equal(req.expect_continue, 0);
    assert_int_equal(httpmsg_find(&req, "host", &v), 1);
    assert_true(slice_is(v, "a.b"));

    /* No fields at all; Host is not required here (the server above decides). */
    parse_head("OPTIONS * HTTP/1.1\r\n\r\n", &req);
    assert_true(slice_is(req.method, "OPTIONS"));
    assert_true(slice_is(req.target, "*"));
    assert_int_equal(req.nheaders, 0);

    /* A method of the most bytes allowed, tchars of every kind, a target with bytes >= 0x80. */
    parse_head("ABCDEFGHIJKLMNOPQRSTUVWXYZ!#$%&' /\xc3\xa9?a=%20 HTTP/1.0\r\n\r\n", &req);
    assert_int_equal(req.method.n, HTTPMSG_MAX_METHOD);
    parse_head("ABCDEFGHIJKLMNOPQRSTUVWXYZ012345 / HTTP/1.1\r\n\r\n", &req);
    assert_int_equal(req.method.n, HTTPMSG_MAX_METHOD);
    assert_true(slice_is(req.target, "/"));
}

static void test_post_length(void **state)
{
    const char msg[] = "POST /x HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello";
    const char zero[] = "POST /x HTTP/1.1\r\nContent-Length: 0\r\n\r\n";
    const char big[] = "PUT /x HTTP/1.1\r\nContent-Length: 9223372036854775807\r\n\r\n";
    const char twice[] = "PUT /x HTTP/1.1\r\nContent-Length: 7\r\ncontent-length: 007\r\n\r\n";
    struct httpmsg_request req;

    parse_ok(S(msg), sizeof(msg) - 1 - 5, &req);
    assert_true(slice_is(req.method, "POST"));
    assert_int_equal(req.body, HTTPMSG_BODY_LENGTH);
    assert_int_equal(req.length, 5);
    parse_head(zero, &req);
    assert_int_equal(req.body, HTTPMSG_BODY_NONE);
    parse_head(big, &req);
    assert_int_equal(req.body, HTTPMSG_BODY_LENGTH);
    assert_true(req.length == UINT64_C(9223372036854775807));
    parse_head(twice, &req); /* the same number twice */
    assert_int_equal(req.length, 7);
}

static void test_chunked_request(void **state)
{
    struct httpmsg_request req;

    parse_head("POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", &req);
    assert_int_equal(req.body, HTTPMSG_BODY_CHUNKED);
    assert_int_equal(req.keep_alive, 1);
    parse_head("POST /x HTTP/1.1\r\nTransfer-Encoding: CHUNKED \r\n\r\n", &req);
    assert_int_equal(req.body, HTTPMSG_BODY_CHUNKED);
    /* The list spread over several fields, empty elements ignored. */
    parse_head("POST /x HTTP/1.1\r\nTransfer-Encoding: ,\r\nX: y\r\ntransfer-encoding: , chunked ,"
               "\r\n\r\n",
               &req);
    assert_int_equal(req.body, HTTPMSG_BODY_CHUNKED);
    /* HTTP/1.0 with chunked: read, then the connection is closed. */
    parse_head("POST /x HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n",
               &req);
    assert_int_equal(req.body, HTTPMSG_BODY_CHUNKED);
    assert_int_equal(req.keep_alive, 0);
}

static void test_keep_alive(void **state)
{
    struct httpmsg_request req;

    parse_head("GET / HTTP/1.1\r\n\r\n", &req);
    assert_int_equal(req.keep_alive, 1);
    parse_head("GET / HTTP/1.1\r\nConnection: keep-alive, Close\r\n\r\n", &req);
    assert_int_equal(req.keep_alive, 0);
    parse_head("GET / HTTP/1.1\r\nConnection: x-foo\r\nConnection: ,CLOSE\t\r\n\r\n", &req);
    assert_int_equal(req.keep_alive, 0);
    parse_head("GET / HTTP/1.1\r\nConnection: closed, x-close\r\n\r\n", &req);
    assert_int_equal(req.keep_alive, 1); /* whole tokens only */
    parse_head("GET / HTTP/1.0\r\n\r\n", &req);
    assert_int_equal(req.minor, 0);
    assert_int_equal(req.keep_alive, 0);
    parse_head("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", &req);
    assert_int_equal(req.keep_alive, 1);
    parse_head("GET / HTTP/1.0\r\nConnection: upgrade, keep-alive\r\n\r\n", &req);
    assert_int_equal(req.keep_alive, 1);
    parse_head("GET / HTTP/1.0\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n", &req);
    assert_int_equal(req.keep_alive, 0);
    parse_head("GET / HTTP/1.0\r\nKeep-Alive: timeout=5\r\n\r\n", &req);
    assert_int_equal(req.keep_alive, 0);
}

static void test_line_ends(void **state)
{
    const char lead[] = "\r\n\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n";
    struct httpmsg_request req;
    struct httpmsg_slice v;

    parse_head(lead, &req); /* the empty lines count in the length */
    assert_true(slice_is(req.method, "GET"));
    assert_true(req.method.p == lead + 5);
    parse_head("GET / HTTP/1.0\nHost: h\nX-A: 1\n\n", &req);
    assert_int_equal(req.nheaders, 2);
    assert_int_equal(httpmsg_find(&req, "x-a", &v), 1);
    assert_true(slice_is(v, "1"));
    parse_head("GET / HTTP/1.1\r\nA: 1\nB: 2\r\n\n", &req); /* mixed */
    assert_int_equal(req.nheaders, 2);
    parse_head("\nGET / HTTP/1.1\n\r\n", &req);
    assert_int_equal(req.nheaders, 0);
}

static void test_values(void **state)
{
    struct httpmsg_request req;

    parse_head("GET / HTTP/1.1\r\nX-A: \t v a\tl \t \r\nX-E:\r\nX-S:   \r\nX-B:v\r\n"
               "X-C: \x01\x7f\xff ok\r\n\r\n",
               &req);
    assert_int_equal(req.nheaders, 5);
    assert_true(slice_is(req.headers[0].value, "v a\tl"));
    assert_true(slice_is(req.headers[1].value, ""));
    assert_true(slice_is(req.headers[2].value, ""));
    assert_true(slice_is(req.headers[3].value, "v"));
    assert_true(slice_is(req.headers[4].value, "\x01\x7f\xff ok"));
}

static void test_expect_and_find(void **state)
{
    struct httpmsg_request req;
    struct httpmsg_slice v = {NULL, 0};

    parse_head("PUT / HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 3\r\n\r\n", &req);
    assert_int_equal(req.expect_continue, 1);
    parse_head("PUT / HTTP/1.1\r\nExpect: 100-continuex\r\n\r\n", &req);
    assert_int_equal(req.expect_continue, 0);
    parse_head("PUT / HTTP/1.1\r\nexpect:100-continue \r\n\r\n", &req);
    assert_int_equal(req.expect_continue, 1);

    parse_head("GET / HTTP/1.1\r\nContent-Type: a\r\nX: 1\r\ncontent-type: b\r\n\r\n", &req);
    assert_int_equal(httpmsg_find(&req, "CONTENT-type", &v), 1);
    assert_true(slice_is(v, "a")); /* the first */
    assert_int_equal(httpmsg_find(&req, "x", &v), 1);
    assert_true(slice_is(v, "1"));
    assert_int_equal(httpmsg_find(&req, "Content", &v), 0);
    assert_int_equal(httpmsg_find(&req, "Content-Type-X", &v), 0);
    assert_int_equal(httpmsg_find(&req, "Missing", &v), 0);
}

/* ---- Refusals ------------------------------------------------------------------------------ */

static void test_bad_request_line(void **state)
{
    BAD("G@T / HTTP/1.1\r\n\r\n", 400, "method 'G@'");
    BAD("\x16\x03\x01\x02\x00\x01\x00", 400, "not a token"); /* TLS, refused before a line end */
    BAD("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456 / HTTP/1.1\r\n\r\n", 400, "too long");
    BAD(" / HTTP/1.1\r\n\r\n", 400, "no method");
    BAD("GET\r\n\r\n", 400, "no target");
    BAD("GET /\r\n\r\n", 400, "no HTTP version");
    BAD("GET  HTTP/1.1\r\n\r\n", 400, "empty target");
    BAD("GET /a b HTTP/1.1\r\n\r\n", 400, "target '/a b' has a space");
    BAD("GET  / HTTP/1.1\r\n\r\n", 400, "space");
    BAD("GET /a\x01 HTTP/1.1\r\n\r\n", 400, "control byte");
    BAD("GET /a\x7f HTTP/1.1\r\n\r\n", 400, "control byte");
    BAD("GET /a\tb HTTP/1.1\r\n\r\n", 400, "control byte");
    BAD("GET / HTTP/2.0\r\n\r\n", 505, "HTTP version 'HTTP/2.0' is not supported");
    BAD("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505, "'HTTP/2.0'");
    BAD("GET / HTTP/1.2\r\n\r\n", 505, "'HTTP/1.2'");
    BAD("GET / HTTP/0.9\r\n\r\n", 505, "not supported");
    BAD("GET / HTTP/1.10\r\n\r\n", 400, "malformed");
    BAD("GET / http/1.1\r\n\r\n", 400, "malformed");
    BAD("GET / HTTP/1\r\n\r\n", 400, "malformed");
    BAD("GET / HTTP/1.1 \r\n\r\n", 400, "ends with a space");
    BAD("GET / HTTP/1.x\r\n\r\n", 400, "malformed");
    BAD("GET / HTTP/1.1\rX\r\n\r\n", 400, "CR not followed by LF");
    BAD("\rGET / HTTP/1.1\r\n\r\n", 400, "CR not followed by LF");
    BAD("GET /\0 HTTP/1.1\r\n\r\n", 400, "NUL");
}

static void test_bad_fields(void **state)
{
    BAD("GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400,
        "header field name 'Host' has whitespace before ':'");
    BAD("GET / HTTP/1.1\r\nHost\t: a\r\n\r\n", 400, "whitespace before ':'");
    BAD("GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n", 400, "folding");
    BAD("GET / HTTP/1.1\r\n\tX: a\r\n\r\n", 400, "folding");
    BAD("GET / HTTP/1.1\r\nX: a\rb\r\n\r\n", 400, "CR not followed by LF");
    BAD("GET / HTTP/1.1\r\nX: a\r\r\n\r\n", 400, "CR not followed by LF");
    BAD("GET / HTTP/1.1\r\nX: a\0b\r\n\r\n", 400, "NUL");
    BAD("GET / HTTP/1.1\r\nX@Y: 1\r\n\r\n", 400, "'X@' is not a token");
    BAD("GET / HTTP/1.1\r\n: v\r\n\r\n", 400, "empty field name");
    BAD("GET / HTTP/1.1\r\nNoColon\r\n\r\n", 400, "'NoColon' has no ':'");
    BAD("GET / HTTP/1.1\r\nNo Colon\r\n\r\n", 400, "has no ':'");
    BAD("GET / HTTP/1.1\r\nX: 1\r\n\r\r\n", 400, "CR not followed by LF");
}

static void test_bad_framing(void **state)
{
    BAD("POST / HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400, "bad Content-Length 'abc'");
    BAD("POST / HTTP/1.1\r\nContent-Length:\r\n\r\n", 400, "bad Content-Length ''");
    BAD("POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400, "Content-Length");
    BAD("POST / HTTP/1.1\r\nContent-Length: +1\r\n\r\n", 400, "Content-Length");
    BAD("POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n", 400, "'5, 5'");
    BAD("POST / HTTP/1.1\r\nContent-Length: 1 2\r\n\r\n", 400, "Content-Length");
    BAD("POST / HTTP/1.1\r\nContent-Length: 0x10\r\n\r\n", 400, "Content-Length");
    BAD("POST / HTTP/1.1\r\nContent-Length: 9223372036854775808\r\n\r\n", 400,
        "'9223372036854775808'");
    BAD("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", 400,
        "Content-Length");
    BAD("POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", 400,
        "Content-Length sent twice");
    BAD("POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", 400,
        "both Transfer-Encoding and Content-Length");
    BAD("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n", 400, "both");
    BAD("POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n", 501,
        "unsupported Transfer-Encoding 'gzip'");
    BAD("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501, "'gzip'");
    BAD("POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 501, "'gzip'");
    BAD("POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n", 501,
        "'gzip'");
    BAD("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n", 501,
        "'identity'");
    BAD("POST / HTTP/1.1\r\nTransfer-Encoding: chunked;x=1\r\n\r\n", 501, "'chunked;x=1'");
    BAD("POST / HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", 400,
        "chunked more than once");
    BAD("POST / HTTP/1.1\r\nTransfer-Encoding: \r\n\r\n", 400, "empty Transfer-Encoding");
}

static void test_err_buffer(void **state)
{
    const char msg[] =
        "GET / HTTP/1.1\r\nContent-Length: \x01\x80zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"
        "zzzzzzzzzzzzzzzzzzzz\r\n\r\n";
    struct httpmsg_request req;
    char err[256];
    int status;

    /* An excerpt: bounded and printable. */
    assert_int_equal(httpmsg_parse_request(S(msg), MAX, &req, &status, err, sizeof(err)), -1);
    assert_int_equal(status, 400);
    assert_non_null(strstr(err, "bad Content-Length '??zzz"));
    assert_non_null(strstr(err, "...'"));
    assert_true(strlen(err) < 80);
    for (size_t i = 0; err[i]; i++)
        assert_true(err[i] >= 0x20 && err[i] < 0x7f);

    /* Never past errcap, always terminated. */
    memset(err, 'X', sizeof(err));
    assert_int_equal(httpmsg_parse_request(S(msg), MAX, &req, &status, err, 8), -1);
    assert_int_equal(strlen(err), 7);
    assert_int_equal(err[8], 'X');
    memset(err, 'X', sizeof(err));
    assert_int_equal(httpmsg_parse_request(S(msg), MAX, &req, &status, err, 1), -1);
    assert_int_equal(err[0], '\0');
    assert_int_equal(err[1], 'X');
    assert_int_equal(httpmsg_parse_request(S(msg), MAX, &req, &status, NULL, 0), -1);
    assert_int_equal(status, 400);
}

/* ---- Limits -------------------------------------------------------------------------------- */

static void test_max(void **state)
{
    const char msg[] = "GET /abc HTTP/1.1\r\nHost: h\r\n\r\nBODYBODY";
    size_t head = sizeof(msg) - 1 - 8;
    struct httpmsg_request req;
    char err[128];
    int status;

    /* A head of exactly max bytes parses, also with more bytes after it in the buffer. */
    parse_ok_max(S(msg), head, head, &req);
    /* One byte less: "not yet" below max, refused from max on. */
    for (size_t k = 0; k <= sizeof(msg) - 1; k++) {
        long r = httpmsg_parse_request(msg, k, head - 1, &req, &status, err, sizeof(err));
        if (k < head - 1) {
            assert_int_equal(r, 0);
        } else {
            assert_int_equal(r, -1);
            assert_int_equal(status, 431);
            assert_non_null(strstr(err, "over"));
        }
    }
    /* Leading empty lines count against max. */
    assert_int_equal(httpmsg_parse_request(S("\r\n\r\nGET / HTTP/1.1\r\n\r\n"), 21, &req, &status,
                                           err, sizeof(err)),
                     -1);
    assert_int_equal(status, 431);
    assert_int_equal(httpmsg_parse_request(S("\r\n\r\nGET / HTTP/1.1\r\n\r\n"), 22, &req, &status,
                                           err, sizeof(err)),
                     22);
    /* A request line of any length never complete within max: 431, not a wait forever. */
    assert_int_equal(
        httpmsg_parse_request(S("GET /aaaaaaaaaaaaaaaa"), 10, &req, &status, err, sizeof(err)), -1);
    assert_int_equal(status, 431);
    assert_int_equal(
        httpmsg_parse_request(S("GET /aaaaaaaaaaaaaaaa"), 0, &req, &status, err, sizeof(err)), -1);
    /* Nothing yet; a NULL buffer of no bytes is fine. */
    assert_int_equal(httpmsg_parse_request(NULL, 0, 10, &req, &status, err, sizeof(err)), 0);
    assert_int_equal(httpmsg_parse_request(NULL, 0, 0, &req, &status, err, sizeof(err)), -1);
    assert_int_equal(status, 431);
}

static void test_max_headers(void **state)
{
    static char buf[MAX * 2];
    struct httpmsg_request req;
    size_t n;
    char err[128];
    int status;

    n = (size_t)snprintf(buf, sizeof(buf), "GET / HTTP/1.1\r\n");
    for (int i = 0; i < HTTPMSG_MAX_HEADERS; i++)
        n += (size_t)snprintf(buf + n, sizeof(buf) - n, "X-%d: %d\r\n", i, i);
    memcpy(buf + n, "\r\n", 2);
    parse_ok(buf, n + 2, n + 2, &req);
    assert_int_equal(req.nheaders, HTTPMSG_MAX_HEADERS);
    assert_true(slice_is(req.headers[HTTPMSG_MAX_HEADERS - 1].value, "99"));

    memcpy(buf + n, "X-100: 100\r\n\r\n", 14);
    n += 14;
    assert_int_equal(httpmsg_parse_request(buf, n, MAX, &req, &status, err, sizeof(err)), -1);
    assert_int_equal(status, 431);
    assert_non_null(strstr(err, "header fields"));
}

/* ---- Response heads ------------------------------------------------------------------------ */

/* Parses the response buf[0..len) whose head is head bytes, as parse_ok_max() does requests. */
static void resp_ok_max(const char *buf, size_t len, size_t head, size_t max, int head_request,
                        struct httpmsg_response *res)
{
    char err[128];

    for (size_t k = 0; k < head; k++) {
        long r = httpmsg_parse_response(buf, k, max, head_request, res, err, sizeof(err));
        if (r != 0)
            fail_msg("prefix %zu of %zu: %ld (%s)", k, head, r, err);
    }
    assert_int_equal(httpmsg_parse_response(buf, head, max, head_request, res, err, sizeof(err)),
                     (long)head);
    long r = httpmsg_parse_response(buf, len, max, head_request, res, err, sizeof(err));
    if (r != (long)head)
        fail_msg("whole: %ld (%s), want %zu", r, err, head);
}

/* A response head complete in the whole string. */
static void resp_head(const char *s, int head_request, struct httpmsg_response *res)
{
    resp_ok_max(s, strlen(s), strlen(s), MAX, head_request, res);
}

/* The body framing and keep_alive of the response head s. */
static void resp_framing(const char *s, int head_request, enum httpmsg_body body, uint64_t length,
                         int keep_alive)
{
    struct httpmsg_response res;

    resp_head(s, head_request, &res);
    if (res.body != body || res.length != length || res.keep_alive != keep_alive)
        fail_msg("'%s': body %d length %llu keep_alive %d, want %d %llu %d", s, (int)res.body,
                 (unsigned long long)res.length, res.keep_alive, (int)body,
                 (unsigned long long)length, keep_alive);
}

/* buf[0..len) is refused with an err containing what; every prefix is either "not yet" or the
 * same refusal. */
static void resp_bad(const char *buf, size_t len, int head_request, const char *what)
{
    struct httpmsg_response res;
    char err[128], err2[128];

    long r = httpmsg_parse_response(buf, len, MAX, head_request, &res, err, sizeof(err));
    if (r != -1)
        fail_msg("'%.*s': %ld, want -1", (int)len, buf, r);
    if (strstr(err, what) == NULL)
        fail_msg("'%.*s': err '%s' does not say '%s'", (int)len, buf, err, what);
    for (size_t k = 0; k < len; k++) {
        r = httpmsg_parse_response(buf, k, MAX, head_request, &res, err2, sizeof(err2));
        if (r == 0)
            continue;
        if (r != -1 || strcmp(err, err2) != 0)
            fail_msg("'%.*s' prefix %zu: %ld '%s'", (int)len, buf, k, r, err2);
    }
}

#define RBAD(lit, what) resp_bad(S(lit), 0, what)

static void test_response(void **state)
{
    const char msg[] = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\n"
                       "hello";
    struct httpmsg_response res;

    resp_ok_max(S(msg), sizeof(msg) - 1 - 5, MAX, 0, &res);
    assert_int_equal(res.minor, 1);
    assert_int_equal(res.status, 200);
    assert_true(slice_is(res.reason, "OK"));
    assert_int_equal(res.nheaders, 2);
    assert_true(slice_is(res.headers[0].name, "Content-Type"));
    assert_true(slice_is(res.headers[0].value, "text/plain"));
    assert_true(slice_is(res.headers[1].name, "Content-Length"));
    assert_int_equal(res.body, HTTPMSG_BODY_LENGTH);
    assert_int_equal(res.length, 5);
    assert_int_equal(res.keep_alive, 1);

    /* Reason phrases: with spaces and other bytes, empty after the SP, or no SP at all. */
    resp_head("HTTP/1.0 404 Not  Found \x01\xff\r\n\r\n", 0, &res);
    assert_int_equal(res.minor, 0);
    assert_int_equal(res.status, 404);
    assert_true(slice_is(res.reason, "Not  Found \x01\xff"));
    resp_head("HTTP/1.1 200 \r\nContent-Length: 0\r\n\r\n", 0, &res);
    assert_int_equal(res.status, 200);
    assert_true(slice_is(res.reason, ""));
    resp_head("HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n", 0, &res);
    assert_int_equal(res.status, 200);
    assert_true(slice_is(res.reason, ""));
    resp_head("HTTP/1.1 999\n\n", 0, &res);
    assert_int_equal(res.status, 999);
    resp_head("HTTP/1.1 100 Continue\r\n\r\n", 0, &res);
    assert_int_equal(res.status, 100);
    assert_int_equal(res.nheaders, 0);

    /* LF line ends, mixed; field values trimmed as for requests. */
    resp_head("HTTP/1.1 201 Created\nLocation:  /x \t\r\nX-E:\n\n", 0, &res);
    assert_int_equal(res.nheaders, 2);
    assert_true(slice_is(res.headers[0].value, "/x"));
    assert_true(slice_is(res.headers[1].value, ""));
}

static void test_response_framing(void **state)
{
    /* HEAD, 1xx, 204, 304: no body whatever the fields say. */
    resp_framing("HTTP/1.1 200 OK\r\nContent-Length: 42\r\n\r\n", 1, HTTPMSG_BODY_NONE, 0, 1);
    resp_framing("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", 1, HTTPMSG_BODY_NONE, 0,
                 1);
    resp_framing("HTTP/1.1 200 OK\r\n\r\n", 1, HTTPMSG_BODY_NONE, 0, 1);
    resp_framing("HTTP/1.1 200 OK\r\nContent-Length: bad\r\n\r\n", 1, HTTPMSG_BODY_NONE, 0, 1);
    resp_framing("HTTP/1.1 100 Continue\r\n\r\n", 0, HTTPMSG_BODY_NONE, 0, 1);
    resp_framing("HTTP/1.1 103 Early Hints\r\nContent-Length: 5\r\n\r\n", 0, HTTPMSG_BODY_NONE, 0,
                 1);
    resp_framing("HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n", 0, HTTPMSG_BODY_NONE, 0,
                 0);
    resp_framing("HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n", 0, HTTPMSG_BODY_NONE, 0,
                 1);
    resp_framing("HTTP/1.1 304 Not Modified\r\nContent-Length: 1234\r\n\r\n", 0, HTTPMSG_BODY_NONE,
                 0, 1);
    resp_framing("HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n", 0,
                 HTTPMSG_BODY_NONE, 0, 1);
    /* But both framings still close the connection. */
    resp_framing(
        "HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n", 0,
        HTTPMSG_BODY_NONE, 0, 0);

    /* Transfer-Encoding. */
    resp_framing("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", 0, HTTPMSG_BODY_CHUNKED,
                 0, 1);
    resp_framing("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, CHUNKED\r\n\r\n", 0,
                 HTTPMSG_BODY_CHUNKED, 0, 1);
    resp_framing("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\ntransfer-encoding: , chunked ,\r\n"
                 "\r\n",
                 0, HTTPMSG_BODY_CHUNKED, 0, 1);
    resp_framing("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n", 0,
                 HTTPMSG_BODY_CHUNKED, 0, 0);
    resp_framing("HTTP/1.1 200 OK\r\nContent-Length: bad\r\nTransfer-Encoding: chunked\r\n\r\n", 0,
                 HTTPMSG_BODY_CHUNKED, 0, 0);
    resp_framing("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", 0, HTTPMSG_BODY_CLOSE, 0, 0);
    resp_framing("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 0,
                 HTTPMSG_BODY_CLOSE, 0, 0);
    resp_framing("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\n",
                 0, HTTPMSG_BODY_CLOSE, 0, 0);
    resp_framing("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked;q=1\r\n\r\n", 0, HTTPMSG_BODY_CLOSE,
                 0, 0);
    resp_framing("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nContent-Length: 5\r\n\r\n", 0,
                 HTTPMSG_BODY_CLOSE, 0, 0);
    /* HTTP/1.0 with Transfer-Encoding: read, then closed. */
    resp_framing("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n",
                 0, HTTPMSG_BODY_CHUNKED, 0, 0);

    /* Content-Length. */
    resp_framing("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", 0, HTTPMSG_BODY_NONE, 0, 1);
    resp_framing("HTTP/1.1 200 OK\r\nContent-Length: 9223372036854775807\r\n\r\n", 0,
                 HTTPMSG_BODY_LENGTH, UINT64_C(9223372036854775807), 1);
    resp_framing("HTTP/1.1 200 OK\r\nContent-Length: 7\r\ncontent-length: 007\r\n\r\n", 0,
                 HTTPMSG_BODY_LENGTH, 7, 1);
    resp_framing("HTTP/1.1 500 Oops\r\nContent-Length: 3\r\nConnection: close\r\n\r\n", 0,
                 HTTPMSG_BODY_LENGTH, 3, 0);

    /* Nothing: to the close. */
    resp_framing("HTTP/1.1 200 OK\r\n\r\n", 0, HTTPMSG_BODY_CLOSE, 0, 0);
    resp_framing("HTTP/1.1 200 OK\r\nConnection: keep-alive\r\n\r\n", 0, HTTPMSG_BODY_CLOSE, 0, 0);
    resp_framing("HTTP/1.0 200 OK\r\n\r\n", 0, HTTPMSG_BODY_CLOSE, 0, 0);
}

static void test_response_keep_alive(void **state)
{
    resp_framing("HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n", 0, HTTPMSG_BODY_LENGTH, 1, 1);
    resp_framing("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nConnection: keep-alive, Close\r\n\r\n", 0,
                 HTTPMSG_BODY_LENGTH, 1, 0);
    resp_framing("HTTP/1.1 200 OK\r\nConnection: x\r\nConnection: ,CLOSE\t\r\nContent-Length: 1\r\n"
                 "\r\n",
                 0, HTTPMSG_BODY_LENGTH, 1, 0);
    resp_framing("HTTP/1.1 200 OK\r\nConnection: closed\r\nContent-Length: 1\r\n\r\n", 0,
                 HTTPMSG_BODY_LENGTH, 1, 1);
    resp_framing("HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n", 0, HTTPMSG_BODY_LENGTH, 1, 0);
    resp_framing("HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 1\r\n\r\n", 0,
                 HTTPMSG_BODY_LENGTH, 1, 1);
    resp_framing("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nConnection: close\r\n"
                 "Content-Length: 1\r\n\r\n",
                 0, HTTPMSG_BODY_LENGTH, 1, 0);
    resp_framing("HTTP/1.0 304 Not Modified\r\nConnection: keep-alive\r\n\r\n", 0,
                 HTTPMSG_BODY_NONE, 0, 1);
    resp_framing("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n\r\n", 1, HTTPMSG_BODY_NONE, 0, 1);
    resp_framing("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\n\r\n", 0, HTTPMSG_BODY_CLOSE, 0, 0);
    resp_framing("HTTP/1.0 204 x\r\nConnection: keep-alive\r\n\r\n", 0, HTTPMSG_BODY_NONE, 0, 1);
}

static void test_response_bad(void **state)
{
    /* Status lines. */
    RBAD("HTTP/2.0 200 OK\r\n\r\n", "HTTP version 'HTTP/2.0' is not supported");
    RBAD("HTTP/1.2 200 OK\r\n\r\n", "'HTTP/1.2' is not supported");
    RBAD("HTTP/0.9 200 OK\r\n\r\n", "not supported");
    RBAD("HTTP/2 200 OK\r\n\r\n", "bad status line 'HTTP/2 200 OK'");
    RBAD("HTTP/1.10 200 OK\r\n\r\n", "bad status line");
    RBAD("HTTP/1.x 200 OK\r\n\r\n", "bad status line");
    RBAD("http/1.1 200 OK\r\n\r\n", "bad status line 'h'");
    RBAD("HTTX/1.1 200 OK\r\n\r\n", "bad status line 'HTTX'");
    RBAD("\x16\x03\x01\x02\x00", "bad status line '?'"); /* refused before a line end */
    RBAD("<html>", "bad status line '<'");
    RBAD("HTTP/1.1 20 OK\r\n\r\n", "bad status line");
    RBAD("HTTP/1.1 20\r\n\r\n", "bad status line");
    RBAD("HTTP/1.1 1000 OK\r\n\r\n", "bad status line 'HTTP/1.1 1000 OK'");
    RBAD("HTTP/1.1 1000\r\n\r\n", "bad status line");
    RBAD("HTTP/1.1 099 OK\r\n\r\n", "bad status line");
    RBAD("HTTP/1.1 abc OK\r\n\r\n", "bad status line");
    RBAD("HTTP/1.1 2x0 OK\r\n\r\n", "bad status line");
    RBAD("HTTP/1.1  200 OK\r\n\r\n", "bad status line");
    RBAD("HTTP/1.1 200\tOK\r\n\r\n", "bad status line");
    RBAD("HTTP/1.1\r\n\r\n", "bad status line");
    RBAD("HTTP/1.1 \r\n\r\n", "bad status line");
    RBAD(" HTTP/1.1 200 OK\r\n\r\n", "bad status line ' '");
    RBAD("\r\nHTTP/1.1 200 OK\r\n\r\n", "empty line before the status line");
    RBAD("\nHTTP/1.1 200 OK\r\n\r\n", "empty line before the status line");
    RBAD("HTTP/1.1 200 O\rK\r\n\r\n", "CR not followed by LF");
    RBAD("HT\rTP/1.1 200 OK\r\n\r\n", "CR not followed by LF");
    RBAD("HTTP/1.1 200 O\0K\r\n\r\n", "NUL byte in the response head");
    RBAD("H\0TTP/1.1 200 OK\r\n\r\n", "bad status line 'H?'");

    /* Fields, as for requests. */
    RBAD("HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n", "folding");
    RBAD("HTTP/1.1 200 OK\r\n X: a\r\n\r\n", "folding");
    RBAD("HTTP/1.1 200 OK\r\nX: a\rb\r\n\r\n", "CR not followed by LF");
    RBAD("HTTP/1.1 200 OK\r\nX: 1\r\n\r\r\n", "CR not followed by LF");
    RBAD("HTTP/1.1 200 OK\r\nX: a\0b\r\n\r\n", "NUL");
    RBAD("HTTP/1.1 200 OK\r\nHost : a\r\n\r\n", "whitespace before ':'");
    RBAD("HTTP/1.1 200 OK\r\nX@Y: 1\r\n\r\n", "'X@' is not a token");
    RBAD("HTTP/1.1 200 OK\r\nNoColon\r\n\r\n", "has no ':'");
    RBAD("HTTP/1.1 200 OK\r\n: v\r\n\r\n", "empty field name");

    /* Framing. */
    RBAD("HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n", "bad Content-Length 'abc'");
    RBAD("HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\n", "bad Content-Length ''");
    RBAD("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "bad Content-Length");
    RBAD("HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\n", "bad Content-Length");
    RBAD("HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n", "bad Content-Length '5, 5'");
    RBAD("HTTP/1.1 200 OK\r\nContent-Length: 9223372036854775808\r\n\r\n",
         "bad Content-Length '9223372036854775808'");
    RBAD("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
         "Content-Length sent twice");
    RBAD("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n",
         "chunked more than once");
    RBAD(
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
        "chunked more than once");
    RBAD("HTTP/1.1 200 OK\r\nTransfer-Encoding: , \r\n\r\n", "empty Transfer-Encoding");
    /* A bad Content-Length is not refused where it does not frame the body (HEAD, 1xx, 204, 304,
     * Transfer-Encoding): see test_response_framing. */
}

static void test_response_limits(void **state)
{
    static char buf[MAX * 2];
    const char msg[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi";
    size_t head = sizeof(msg) - 1 - 2, n;
    struct httpmsg_response res;
    char err[128];

    /* A head of exactly max bytes parses; one byte less is "not yet" below max, then refused. */
    resp_ok_max(S(msg), head, head, 0, &res);
    assert_int_equal(res.length, 2);
    for (size_t k = 0; k <= sizeof(msg) - 1; k++) {
        long r = httpmsg_parse_response(msg, k, head - 1, 0, &res, err, sizeof(err));
        if (k < head - 1) {
            assert_int_equal(r, 0);
        } else {
            assert_int_equal(r, -1);
            assert_non_null(strstr(err, "response head is over"));
        }
    }
    assert_int_equal(httpmsg_parse_response(NULL, 0, 10, 0, &res, err, sizeof(err)), 0);
    assert_int_equal(httpmsg_parse_response(NULL, 0, 0, 0, &res, err, sizeof(err)), -1);
    assert_int_equal(httpmsg_parse_response(S("HTTP/1.1 200 OK"), 10, 0, &res, err, sizeof(err)),
                     -1);
    assert_non_null(strstr(err, "over 10 bytes"));

    /* HTTPMSG_MAX_HEADERS fields, then one more. */
    n = (size_t)snprintf(buf, sizeof(buf), "HTTP/1.1 204 No Content\r\n");
    for (int i = 0; i < HTTPMSG_MAX_HEADERS; i++)
        n += (size_t)snprintf(buf + n, sizeof(buf) - n, "X-%d: %d\r\n", i, i);
    memcpy(buf + n, "\r\n", 2);
    resp_ok_max(buf, n + 2, n + 2, MAX, 0, &res);
    assert_int_equal(res.nheaders, HTTPMSG_MAX_HEADERS);
    assert_true(slice_is(res.headers[HTTPMSG_MAX_HEADERS - 1].value, "99"));
    memcpy(buf + n, "X-100: 100\r\n\r\n", 14);
    n += 14;
    assert_int_equal(httpmsg_parse_response(buf, n, MAX, 0, &res, err, sizeof(err)), -1);
    assert_non_null(strstr(err, "more than 100 header fields"));

    /* The err buffer: bounded, terminated, optional. */
    memset(err, 'X', sizeof(err));
    assert_int_equal(httpmsg_parse_response(S("HTTP/3.0 200 OK\r\n\r\n"), MAX, 0, &res, err, 8),
                     -1);
    assert_int_equal(strlen(err), 7);
    assert_int_equal(err[8], 'X');
    assert_int_equal(httpmsg_parse_response(S("HTTP/3.0 200 OK\r\n\r\n"), MAX, 0, &res, NULL, 0),
                     -1);
}

/* The request parser never reports a body to the close. */
static void test_request_never_close(void **state)
{
    struct httpmsg_request req;

    parse_head("POST / HTTP/1.1\r\n\r\n", &req);
    assert_int_equal(req.body, HTTPMSG_BODY_NONE);
    parse_head("POST / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", &req);
    assert_int_equal(req.body, HTTPMSG_BODY_NONE);
    assert_int_equal(req.keep_alive, 1);
}

/* ---- Chunked bodies ------------------------------------------------------------------------ */

struct feed_result {
    long consumed; /* total; -1 on error */
    int done;
    char data[256];
    size_t ndata;
    char err[128];
};

/* Feeds buf[0..len) in pieces that end at the offsets cuts[0..ncuts) (ascending), then at len,
 * each piece fed until used up or done. */
static void feed(struct httpmsg_chunked *c, const char *buf, size_t len, const size_t *cuts,
                 size_t ncuts, struct feed_result *out)
{
    size_t pos = 0;

    memset(out, 0, sizeof(*out));
    for (size_t k = 0; k <= ncuts && !out->done; k++) {
        size_t end = k < ncuts ? cuts[k] : len;
        while (pos < end && !out->done) {
            size_t off, dlen;
            long r = httpmsg_chunked_feed(c, buf + pos, end - pos, &off, &dlen, &out->done,
                                          out->err, sizeof(out->err));
            if (r < 0) {
                out->consumed = -1;
                return;
            }
            assert_true(r > 0);
            assert_true((size_t)r <= end - pos);
            assert_true(off + dlen <= (size_t)r);
            assert_true(out->ndata + dlen <= sizeof(out->data));
            memcpy(out->data + out->ndata, buf + pos + off, dlen);
            out->ndata += dlen;
            pos += (size_t)r;
        }
    }
    out->consumed = (long)pos;
}

static void feed_whole(const char *buf, size_t len, struct feed_result *out)
{
    struct httpmsg_chunked c;

    httpmsg_chunked_init(&c);
    feed(&c, buf, len, NULL, 0, out);
}

static const char body[] =
    "5;ext=1;q=\"a b\"\r\nhello\r\n1A ; a=b\r\nabcdefghijklmnopqrstuvwxyz\r\n"
    "00000003\nxyz\n0;last\r\nTrailer-A: 1\r\nB: two\n\r\nNEXT REQUEST";
static const char body_data[] = "helloabcdefghijklmnopqrstuvwxyzxyz";
#define BODY_LEN (sizeof(body) - 1 - 12)

static void check_body(const struct feed_result *r)
{
    if (r->consumed != (long)BODY_LEN)
        fail_msg("consumed %ld (%s), want %zu", r->consumed, r->err, BODY_LEN);
    assert_int_equal(r->done, 1);
    assert_int_equal(r->ndata, strlen(body_data));
    assert_memory_equal(r->data, body_data, r->ndata);
}

static void test_chunked_whole_and_split(void **state)
{
    struct httpmsg_chunked c;
    struct feed_result r;
    size_t cuts[2], all[sizeof(body)];

    feed_whole(S(body), &r);
    check_body(&r);

    /* Byte by byte. */
    for (size_t i = 0; i < sizeof(body) - 1; i++)
        all[i] = i + 1;
    httpmsg_chunked_init(&c);
    feed(&c, S(body), all, sizeof(body) - 1, &r);
    check_body(&r);

    /* Two calls, at every split. */
    for (size_t k = 0; k <= sizeof(body) - 1; k++) {
        cuts[0] = k;
        httpmsg_chunked_init(&c);
        feed(&c, S(body), cuts, 1, &r);
        check_body(&r);
    }
    /* Three calls. */
    for (size_t a = 0; a <= BODY_LEN; a += 3)
        for (size_t b = a; b <= BODY_LEN; b += 5) {
            cuts[0] = a;
            cuts[1] = b;
            httpmsg_chunked_init(&c);
            feed(&c, S(body), cuts, 2, &r);
            check_body(&r);
        }
}

static void test_chunked_calls(void **state)
{
    const char two[] = "3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n";
    struct httpmsg_chunked c;
    size_t off, dlen;
    int done;
    char err[64];

    httpmsg_chunked_init(&c);
    /* One run of data per call. */
    assert_int_equal(httpmsg_chunked_feed(&c, S(two), &off, &dlen, &done, err, sizeof(err)), 6);
    assert_int_equal(off, 3);
    assert_int_equal(dlen, 3);
    assert_int_equal(done, 0);
    assert_int_equal(httpmsg_chunked_feed(&c, two + 6, 0, &off, &dlen, &done, err, sizeof(err)), 0);
    assert_int_equal(httpmsg_chunked_feed(&c, two + 6, sizeof(two) - 1 - 6, &off, &dlen, &done, err,
                                          sizeof(err)),
                     8);
    assert_int_equal(off, 5);
    assert_int_equal(dlen, 3);
    assert_memory_equal(two + 6 + off, "def", 3);
    assert_int_equal(httpmsg_chunked_feed(&c, two + 14, sizeof(two) - 1 - 14, &off, &dlen, &done,
                                          err, sizeof(err)),
                     sizeof(two) - 1 - 14);
    assert_int_equal(dlen, 0);
    assert_int_equal(done, 1);
    /* Done: nothing more is consumed. */
    assert_int_equal(httpmsg_chunked_feed(&c, S("5\r\n"), &off, &dlen, &done, err, sizeof(err)), 0);
    assert_int_equal(done, 1);

    /* Only the last chunk, with leading zeros; LF line ends. */
    httpmsg_chunked_init(&c);
    assert_int_equal(httpmsg_chunked_feed(&c, S("000\n\nX"), &off, &dlen, &done, err, sizeof(err)),
                     5);
    assert_int_equal(done, 1);
}

static void test_chunked_sizes(void **state)
{
    struct feed_result r;

    feed_whole(S("0000a\r\n0123456789\r\n0\r\n\r\n"), &r);
    assert_int_equal(r.done, 1);
    assert_int_equal(r.ndata, 10);
    assert_memory_equal(r.data, "0123456789", 10);
    feed_whole(S("A\r\n0123456789\r\n0\r\n\r\n"), &r);
    assert_int_equal(r.ndata, 10);

    /* 2^60 - 1: the size line is accepted (its data would follow). */
    feed_whole(S("fffffffffffffff\r\n"), &r);
    assert_int_equal(r.consumed, 17);
    assert_int_equal(r.done, 0);
    feed_whole(S("0000000FFFFFFFFFFFFFFF;x\r\nab"), &r);
    assert_int_equal(r.consumed, 28);
    assert_int_equal(r.ndata, 2);
    /* 2^60 and more: refused. */
    feed_whole(S("1000000000000000\r\n"), &r);
    assert_int_equal(r.consumed, -1);
    assert_non_null(strstr(r.err, "2^60"));
    feed_whole(S("00001000000000000000\r\n"), &r);
    assert_int_equal(r.consumed, -1);
    feed_whole(S("ffffffffffffffffffffffff\r\n"), &r);
    assert_int_equal(r.consumed, -1);

    /* Whitespace before ';' is tolerated. */
    feed_whole(S("3 \t;x\r\nabc\r\n0\r\n\r\n"), &r);
    assert_int_equal(r.done, 1);
    assert_int_equal(r.ndata, 3);
}

static void chunked_bad(const char *buf, size_t len, const char *what)
{
    struct feed_result r;
    struct httpmsg_chunked c;
    size_t off, dlen;
    int done;

    feed_whole(buf, len, &r);
    if (r.consumed != -1)
        fail_msg("'%.*s': consumed %ld, done %d", (int)len, buf, r.consumed, r.done);
    if (strstr(r.err, what) == NULL)
        fail_msg("'%.*s': err '%s' does not say '%s'", (int)len, buf, r.err, what);
    /* Byte by byte, the same refusal. */
    httpmsg_chunked_init(&c);
    for (size_t i = 0; i < len; i++) {
        long n = httpmsg_chunked_feed(&c, buf + i, 1, &off, &dlen, &done, r.err, sizeof(r.err));
        if (n < 0)
            break;
        assert_int_equal(n, 1);
        assert_int_equal(done, 0);
        if (i + 1 == len)
            fail_msg("'%.*s': accepted byte by byte", (int)len, buf);
    }
    assert_non_null(strstr(r.err, what));
    /* And refused from then on. */
    assert_int_equal(httpmsg_chunked_feed(&c, S("0\r\n\r\n"), &off, &dlen, &done, NULL, 0), -1);
}

#define CBAD(lit, what) chunked_bad(S(lit), what)

static void test_chunked_bad(void **state)
{
    static char big[HTTPMSG_MAX_CHUNK_LINE + 64];
    static char trailers[HTTPMSG_MAX_TRAILERS + 64];
    size_t n;
    struct feed_result r;

    CBAD("x\r\n", "not hexadecimal");
    CBAD("\r\n", "not hexadecimal");
    CBAD(";a\r\n", "not hexadecimal");
    CBAD(" 5\r\n", "not hexadecimal");
    CBAD("5x\r\n", "after its digits");
    CBAD("5 x\r\n", "after its digits");
    CBAD("5 \r\nhello\r\n", "whitespace");
    CBAD("5 \nhello\r\n", "whitespace");
    CBAD("5\rX", "CR not followed by LF");
    CBAD("5;a\rb\r\n", "CR not followed by LF");
    CBAD("5;a\0b\r\n", "NUL");
    CBAD("5\r\nhelloX\r\n", "followed by 'X'");
    CBAD("5\r\nhello\rX", "CR not followed by LF");
    CBAD("5\r\nhello\r\r\n", "CR not followed by LF");
    CBAD("0\r\nX: a\0\r\n\r\n", "NUL");
    CBAD("0\r\nX: a\rb\r\n\r\n", "CR not followed by LF");
    CBAD("0\r\n\rX", "CR not followed by LF");
    CBAD("1000000000000000\r\n", "2^60");

    /* A chunk-size line over HTTPMSG_MAX_CHUNK_LINE, extensions included. */
    memset(big, 'a', sizeof(big));
    memcpy(big, "5;", 2);
    memcpy(big + HTTPMSG_MAX_CHUNK_LINE, "\r\n", 2); /* the most bytes, the line end aside */
    feed_whole(big, HTTPMSG_MAX_CHUNK_LINE + 2, &r);
    assert_int_equal(r.consumed, HTTPMSG_MAX_CHUNK_LINE + 2);
    memcpy(big + HTTPMSG_MAX_CHUNK_LINE, "a\r\n", 3);
    chunked_bad(big, HTTPMSG_MAX_CHUNK_LINE + 3, "too long");
    memset(big, '0', sizeof(big)); /* leading zeros count too */
    chunked_bad(big, sizeof(big), "too long");

    /* A trailer section over HTTPMSG_MAX_TRAILERS. */
    n = (size_t)snprintf(trailers, sizeof(trailers), "0\r\n");
    while (n + 12 < sizeof(trailers))
        n += (size_t)snprintf(trailers + n, sizeof(trailers) - n, "X-T: 12345\r\n");
    chunked_bad(trailers, n, "trailer section is too long");
    /* And one just at the limit is fine. */
    memset(trailers, 'a', sizeof(trailers));
    memcpy(trailers, "0\r\nX:", 5);
    memcpy(trailers + 3 + HTTPMSG_MAX_TRAILERS - 4, "\r\n\r\n", 4);
    feed_whole(trailers, 3 + HTTPMSG_MAX_TRAILERS, &r);
    assert_int_equal(r.consumed, 3 + HTTPMSG_MAX_TRAILERS);
    assert_int_equal(r.done, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_get),
        cmocka_unit_test(test_post_length),
        cmocka_unit_test(test_chunked_request),
        cmocka_unit_test(test_keep_alive),
        cmocka_unit_test(test_line_ends),
        cmocka_unit_test(test_values),
        cmocka_unit_test(test_expect_and_find),
        cmocka_unit_test(test_bad_request_line),
        cmocka_unit_test(test_bad_fields),
        cmocka_unit_test(test_bad_framing),
        cmocka_unit_test(test_err_buffer),
        cmocka_unit_test(test_max),
        cmocka_unit_test(test_max_headers),
        cmocka_unit_test(test_response),
        cmocka_unit_test(test_response_framing),
        cmocka_unit_test(test_response_keep_alive),
        cmocka_unit_test(test_response_bad),
        cmocka_unit_test(test_response_limits),
        cmocka_unit_test(test_request_never_close),
        cmocka_unit_test(test_chunked_whole_and_split),
        cmocka_unit_test(test_chunked_calls),
        cmocka_unit_test(test_chunked_sizes),
        cmocka_unit_test(test_chunked_bad),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
