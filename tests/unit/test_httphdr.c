/* test_httphdr.c — unit tests of the HTTP store's header filtering and target building. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "httphdr.h"

static void test_hop_by_hop_fixed(void **state)
{
    const char *hop[] = {"Connection",
                         "connection",
                         "Keep-Alive",
                         "TE",
                         "te",
                         "Trailer",
                         "Upgrade",
                         "Transfer-Encoding",
                         "TRANSFER-ENCODING",
                         "Proxy-Authorization",
                         "Proxy-Connection",
                         "proxy-authenticate"};
    const char *end[] = {"Content-Type", "Content-Length", "Authorization", "X-Request-Id",
                         "Tea",          "Trailers-Extra", "Fence-Lock",    "ETag"};

    for (size_t i = 0; i < sizeof(hop) / sizeof(hop[0]); i++)
        assert_int_equal(httphdr_is_hop_by_hop(hop[i], NULL), 1);
    for (size_t i = 0; i < sizeof(end) / sizeof(end[0]); i++)
        assert_int_equal(httphdr_is_hop_by_hop(end[i], NULL), 0);
}

static void test_hop_by_hop_named_by_connection(void **state)
{
    const char *conn = " keep-alive , X-Hop,x-other\t,, ";

    assert_int_equal(httphdr_is_hop_by_hop("X-Hop", conn), 1);
    assert_int_equal(httphdr_is_hop_by_hop("x-hop", conn), 1);
    assert_int_equal(httphdr_is_hop_by_hop("X-Other", conn), 1);
    assert_int_equal(httphdr_is_hop_by_hop("X-Ho", conn), 0); /* whole tokens only */
    assert_int_equal(httphdr_is_hop_by_hop("X-Hop-2", conn), 0);
    assert_int_equal(httphdr_is_hop_by_hop("Content-Type", conn), 0);
    assert_int_equal(httphdr_is_hop_by_hop("X-Hop", ""), 0);
    assert_int_equal(httphdr_is_hop_by_hop("", conn), 0); /* an empty item names nothing */
}

static void test_request_headers_replaced(void **state)
{
    /* Set by fencegate from the lock, never taken from the client. */
    assert_int_equal(httphdr_drop_request("Fencing-Token", NULL), 1);
    assert_int_equal(httphdr_drop_request("fencing-token", NULL), 1);
    assert_int_equal(httphdr_drop_request("Fence-Lock", NULL), 1);
    assert_int_equal(httphdr_drop_request("Host", NULL), 1);
    assert_int_equal(httphdr_drop_request("Content-Length", NULL), 1);
    assert_int_equal(httphdr_drop_request("Expect", NULL), 1);
    assert_int_equal(httphdr_drop_request("Fence-Timeout-Ms", NULL), 1);
    assert_int_equal(httphdr_drop_request("Upgrade", NULL), 1);
    assert_int_equal(httphdr_drop_request("X-Custom", "close, X-Custom"), 1);
    assert_int_equal(httphdr_drop_request("X-Custom", NULL), 0);
    assert_int_equal(httphdr_drop_request("Authorization", NULL), 0);
    assert_int_equal(httphdr_drop_request("Content-Type", NULL), 0);
}

static void test_target(void **state)
{
    char out[64];

    assert_int_equal(httphdr_target(out, sizeof(out), "", "/a/b", NULL), 4);
    assert_string_equal(out, "/a/b");
    assert_int_equal(httphdr_target(out, sizeof(out), "/prefix", "/a", "x=1&y=2"), 17);
    assert_string_equal(out, "/prefix/a?x=1&y=2");
    assert_true(httphdr_target(out, sizeof(out), "", "", NULL) > 0);
    assert_string_equal(out, "/");
    assert_true(httphdr_target(out, sizeof(out), "/p", "", "q") > 0);
    assert_string_equal(out, "/p?q");
    assert_true(httphdr_target(out, sizeof(out), "", "/a%20b/..x/.y/...", "") > 0);
    assert_string_equal(out, "/a%20b/..x/.y/...?");

    /* Dot segments could climb out of the prefix. */
    assert_int_equal(httphdr_target(out, sizeof(out), "/p", "/..", NULL), -1);
    assert_int_equal(httphdr_target(out, sizeof(out), "/p", "/a/../../admin", NULL), -1);
    assert_int_equal(httphdr_target(out, sizeof(out), "/p", "/./a", NULL), -1);
    assert_int_equal(httphdr_target(out, sizeof(out), "/p", "/%2e%2E/a", NULL), -1);
    assert_int_equal(httphdr_target(out, sizeof(out), "/p", "/.%2e", NULL), -1);
    assert_int_equal(httphdr_target(out, sizeof(out), "/p", "/a/.", NULL), -1);
    /* ... also as servers that decode %2f or %5c, split at '\\' or drop ';' parameters read
     * them. */
    assert_int_equal(httphdr_target(out, sizeof(out), "/p", "/..%2fx", NULL), -1);
    assert_int_equal(httphdr_target(out, sizeof(out), "/p", "/..%2Fx", NULL), -1);
    assert_int_equal(httphdr_target(out, sizeof(out), "/p", "/..%5cx", NULL), -1);
    assert_int_equal(httphdr_target(out, sizeof(out), "/p", "/a\\..\\x", NULL), -1);
    assert_int_equal(httphdr_target(out, sizeof(out), "/p", "/..;/x", NULL), -1);
    assert_int_equal(httphdr_target(out, sizeof(out), "/p", "/x%2f%2e%2e", NULL), -1);
    assert_int_equal(httphdr_target(out, sizeof(out), "/p", "/a;b/..;c=d", NULL), -1);
    assert_true(httphdr_target(out, sizeof(out), "/p", "/..a%2fb.;x/a..%5c.b/;../c", NULL) > 0);

    /* Too long for the buffer: refused, never truncated. */
    assert_int_equal(httphdr_target(out, 8, "/prefix", "/abc", NULL), -2);
    assert_int_equal(httphdr_target(out, 5, "", "/abcd", NULL), -2);
    assert_int_equal(httphdr_target(out, 6, "", "/abcd", NULL), 5);
}

static void test_decode_path(void **state)
{
    char out[32];

    /* Rules see the path as the store will: escapes decoded, any case of hex digits. */
    assert_int_equal(httphdr_decode_path(out, sizeof(out), "/reports/7"), 10);
    assert_string_equal(out, "/reports/7");
    assert_int_equal(httphdr_decode_path(out, sizeof(out), "/r%65ports/%37"), 10);
    assert_string_equal(out, "/reports/7");
    assert_int_equal(httphdr_decode_path(out, sizeof(out), "/R%65PORTS/%4a%4A"), 11);
    assert_string_equal(out, "/RePORTS/JJ");
    assert_int_equal(httphdr_decode_path(out, sizeof(out), "/a%20b+c/%7Bt%7d"), 10);
    assert_string_equal(out, "/a b+c/{t}");
    assert_int_equal(httphdr_decode_path(out, sizeof(out), "/%25zz"), 4); /* decoded once */
    assert_string_equal(out, "/%zz");
    assert_int_equal(httphdr_decode_path(out, sizeof(out), "/%ff"), 2); /* any byte but NUL */
    assert_int_equal((unsigned char)out[1], 0xff);
    assert_int_equal(httphdr_decode_path(out, sizeof(out), ""), 0);
    assert_string_equal(out, "");
    assert_int_equal(httphdr_decode_path(out, sizeof(out), "/a/"), 3); /* a trailing '/' stays */
    assert_string_equal(out, "/a/");

    /* Refused: a store could read another path than the rules saw. */
    const char *refused[] = {"/reports%2F7", "/reports%2f7", "/a%00b",  "/a%0",
                             "/a%",          "/a%g0",        "/a%0g",   "//reports/7",
                             "/reports//7",  "/a/%2F",       "/a%2F/b", "/x//"};
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++)
        assert_int_equal(httphdr_decode_path(out, sizeof(out), refused[i]), HTTPHDR_PATH_REFUSED);

    /* Too long: refused, never truncated. */
    assert_int_equal(httphdr_decode_path(out, 4, "/abc"), -2);
    assert_int_equal(httphdr_decode_path(out, 5, "/abc"), 4);
    assert_int_equal(httphdr_decode_path(out, 4, "/%61%62"), 3);
    assert_string_equal(out, "/ab");
    assert_int_equal(httphdr_decode_path(out, 0, ""), -2);
}

static void test_parse_ms(void **state)
{
    long long v = 0;

    assert_int_equal(httphdr_parse_ms("250", 1000, &v), 0);
    assert_int_equal(v, 250);
    assert_int_equal(httphdr_parse_ms("1000", 1000, &v), 0);
    assert_int_equal(httphdr_parse_ms("1001", 1000, &v), -1);
    assert_int_equal(httphdr_parse_ms("0", 1000, &v), -1);
    assert_int_equal(httphdr_parse_ms("", 1000, &v), -1);
    assert_int_equal(httphdr_parse_ms("-5", 1000, &v), -1);
    assert_int_equal(httphdr_parse_ms(" 5", 1000, &v), -1);
    assert_int_equal(httphdr_parse_ms("5ms", 1000, &v), -1);
    assert_int_equal(httphdr_parse_ms("99999999999999999999999", 1000, &v), -1);
    assert_int_equal(httphdr_parse_ms(NULL, 1000, &v), -1);
    assert_int_equal(v, 1000); /* untouched by the failures */
}

static void test_host(void **state)
{
    char out[64];

    httphdr_host(out, sizeof(out), "store.svc", 80);
    assert_string_equal(out, "store.svc");
    httphdr_host(out, sizeof(out), "store.svc", 8080);
    assert_string_equal(out, "store.svc:8080");
    httphdr_host(out, sizeof(out), "::1", 80);
    assert_string_equal(out, "[::1]");
    httphdr_host(out, sizeof(out), "fd00::7", 8080);
    assert_string_equal(out, "[fd00::7]:8080");
    httphdr_host(out, 8, "store.svc", 8080);
    assert_string_equal(out, "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hop_by_hop_fixed),
        cmocka_unit_test(test_hop_by_hop_named_by_connection),
        cmocka_unit_test(test_request_headers_replaced),
        cmocka_unit_test(test_target),
        cmocka_unit_test(test_decode_path),
        cmocka_unit_test(test_parse_ms),
        cmocka_unit_test(test_host),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
