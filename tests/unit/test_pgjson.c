/* test_pgjson.c — unit tests of the SQL request body parser and the result renderer. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "json.h"
#include "pgjson.h"

/* Parses a NUL-free literal from an exact-size heap copy (ASan catches reads past the end). */
static int parse(const char *text, struct pgjson_request *rq, char *err, size_t errlen)
{
    size_t n = strlen(text);
    char *copy = malloc(n ? n : 1);
    int rc;

    assert_non_null(copy);
    memcpy(copy, text, n);
    rc = pgjson_parse_request(copy, n, rq, err, errlen);
    free(copy);
    return rc;
}

static void expect_error(const char *text, int want_rc, const char *want_substr)
{
    struct pgjson_request rq;
    char err[300];
    int rc = parse(text, &rq, err, sizeof(err));

    if (rc != want_rc || !strstr(err, want_substr))
        fail_msg("body %s: rc %d err '%s', want rc %d and '%s'", text, rc, err, want_rc,
                 want_substr);
    assert_int_equal(rq.nstmts, 0);
    assert_null(rq.lock);
}

static void test_parse_ok(void **state)
{
    struct pgjson_request rq;
    char err[300];
    const char *body = "{\"lock\":\"orders\\/1\",\"statements\":[{\"sql\":\"UPDATE t SET v=$1 "
                       "WHERE id=$2\",\"params\":[\"a\\\"b\",42,-1.5e3,true,false,null,"
                       "{\"k\": [1, 2]},[\"x\"]]},{\"params\":[],\"sql\":\"SELECT 1\"}]}";

    assert_int_equal(parse(body, &rq, err, sizeof(err)), FG_OK);
    assert_string_equal(rq.lock, "orders/1");
    assert_int_equal(rq.lock_len, 8);
    assert_int_equal(rq.nstmts, 2);
    assert_string_equal(rq.stmts[0].sql, "UPDATE t SET v=$1 WHERE id=$2");
    assert_int_equal(rq.stmts[0].nparams, 8);
    assert_string_equal(rq.stmts[0].params[0], "a\"b");
    assert_string_equal(rq.stmts[0].params[1], "42");
    assert_string_equal(rq.stmts[0].params[2], "-1.5e3");
    assert_string_equal(rq.stmts[0].params[3], "true");
    assert_string_equal(rq.stmts[0].params[4], "false");
    assert_null(rq.stmts[0].params[5]);
    assert_string_equal(rq.stmts[0].params[6], "{\"k\": [1, 2]}");
    assert_string_equal(rq.stmts[0].params[7], "[\"x\"]");
    assert_string_equal(rq.stmts[1].sql, "SELECT 1");
    assert_int_equal(rq.stmts[1].nparams, 0);
    pgjson_request_free(&rq);
    pgjson_request_free(&rq); /* twice is safe */
}

static void test_parse_unicode(void **state)
{
    struct pgjson_request rq;
    char err[300];

    assert_int_equal(parse("{\"statements\":[{\"sql\":\"SELECT $1\",\"params\":[\"\\u00e9\\ud83d"
                           "\\ude00\"]}],\"lock\":\"L\"}",
                           &rq, err, sizeof(err)),
                     FG_OK);
    assert_string_equal(rq.stmts[0].params[0], "\xc3\xa9\xf0\x9f\x98\x80");
    pgjson_request_free(&rq);
}

static void test_parse_errors(void **state)
{
    expect_error("", FG_ERR_PROTO, "empty body");
    expect_error("{\"lock\":", FG_ERR_PROTO, "not valid JSON");
    expect_error("[1]", FG_ERR_PROTO, "expected an object");
    expect_error("{\"statements\":[{\"sql\":\"SELECT 1\"}]}", FG_ERR_PROTO, "missing \"lock\"");
    expect_error("{\"lock\":\"L\"}", FG_ERR_PROTO, "missing \"statements\"");
    expect_error("{\"lock\":\"L\",\"statements\":[]}", FG_ERR_PROTO, "at least one");
    expect_error("{\"lock\":5,\"statements\":[]}", FG_ERR_PROTO,
                 "lock: expected a string, got a number");
    expect_error("{\"lock\":\"\",\"statements\":[]}", FG_ERR_PROTO, "lock: must not be empty");
    expect_error("{\"lock\":\"a\\u0000b\",\"statements\":[]}", FG_ERR_PROTO, "\\u0000");
    expect_error("{\"lock\":\"L\",\"lock\":\"M\",\"statements\":[]}", FG_ERR_PROTO,
                 "duplicate key \"lock\"");
    expect_error("{\"lock\":\"L\",\"stmts\":[]}", FG_ERR_PROTO, "unknown key \"stmts\"");
    expect_error("{\"lock\":\"L\",\"statements\":{}}", FG_ERR_PROTO,
                 "statements: expected an array, got an object");
    expect_error("{\"lock\":\"L\",\"statements\":[\"SELECT 1\"]}", FG_ERR_PROTO,
                 "statements[0]: expected an object");
    expect_error("{\"lock\":\"L\",\"statements\":[{\"params\":[]}]}", FG_ERR_PROTO,
                 "statements[0]: missing \"sql\"");
    expect_error("{\"lock\":\"L\",\"statements\":[{\"sql\":\"  \"}]}", FG_ERR_PROTO,
                 "statements[0].sql: empty statement");
    expect_error("{\"lock\":\"L\",\"statements\":[{\"sql\":1}]}", FG_ERR_PROTO,
                 "statements[0].sql: expected a string, got a number");
    expect_error("{\"lock\":\"L\",\"statements\":[{\"sql\":\"SELECT 1\"},{\"sql\":\"SELECT "
                 "$1\",\"params\":{}}]}",
                 FG_ERR_PROTO, "statements[1].params: expected an array, got an object");
    expect_error("{\"lock\":\"L\",\"statements\":[{\"sql\":\"SELECT $1\",\"params\":[\"a\","
                 "\"\\u0000\"]}]}",
                 FG_ERR_PROTO, "statements[0].params[1]: a string holding \\u0000");
    expect_error("{\"lock\":\"L\",\"statements\":[{\"sql\":\"x\",\"sql\":\"y\"}]}", FG_ERR_PROTO,
                 "duplicate key \"sql\"");
    expect_error("{\"lock\":\"L\",\"statements\":[{\"sql\":\"x\",\"bind\":[]}]}", FG_ERR_PROTO,
                 "statements[0]: unknown key \"bind\"");
    expect_error("{\"lock\":\"L\",\"statements\":[{\"sql\":\"SELECT 1\"}]} x", FG_ERR_PROTO,
                 "not valid JSON");
}

static void test_parse_limits(void **state)
{
    char lock[PGJSON_MAX_LOCK + 2];
    char *body;
    size_t cap = 64 + 24 * (PGJSON_MAX_STATEMENTS + 1), n;

    memset(lock, 'x', sizeof(lock) - 1);
    lock[sizeof(lock) - 1] = '\0';
    body = malloc(cap);
    assert_non_null(body);
    snprintf(body, cap, "{\"lock\":\"%s\",\"statements\":[{\"sql\":\"SELECT 1\"}]}", lock);
    expect_error(body, FG_ERR_LIMIT, "lock: longer than 512 bytes");

    n = (size_t)snprintf(body, cap, "{\"lock\":\"L\",\"statements\":[");
    for (int i = 0; i <= PGJSON_MAX_STATEMENTS; i++)
        n += (size_t)snprintf(body + n, cap - n, "%s{\"sql\":\"SELECT 1\"}", i ? "," : "");
    snprintf(body + n, cap - n, "]}");
    expect_error(body, FG_ERR_LIMIT, "more than 1000 statements");
    free(body);
}

static void test_txn_keyword(void **state)
{
    assert_string_equal(pgjson_txn_keyword("COMMIT"), "COMMIT");
    assert_string_equal(pgjson_txn_keyword("  begin;"), "BEGIN");
    assert_string_equal(pgjson_txn_keyword("-- hi\n/* a /* nested */ */ Rollback"), "ROLLBACK");
    assert_string_equal(pgjson_txn_keyword("end"), "END");
    assert_string_equal(pgjson_txn_keyword("START TRANSACTION"), "START");
    assert_string_equal(pgjson_txn_keyword("prepare transaction 'x'"), "PREPARE");
    assert_null(pgjson_txn_keyword("UPDATE t SET commit = 1"));
    assert_null(pgjson_txn_keyword("SELECT 'COMMIT'"));
    assert_null(pgjson_txn_keyword("ENDING"));
    assert_null(pgjson_txn_keyword(""));
    expect_error("{\"lock\":\"L\",\"statements\":[{\"sql\":\"UPDATE t SET v = 1\"},{\"sql\":\" "
                 "/* x */ commit\"}]}",
                 FG_ERR_PROTO, "statements[1].sql: COMMIT is not allowed");
}

static void expect_refused(const char *sql, const char *want_substr)
{
    const char *why = pgjson_refusal(sql);

    if (!why || !strstr(why, want_substr))
        fail_msg("sql '%s': refusal '%s', want '%s'", sql, why ? why : "(none)", want_substr);
}

static void expect_allowed(const char *sql)
{
    const char *why = pgjson_refusal(sql);

    if (why)
        fail_msg("sql '%s' refused: %s", sql, why);
}

static void test_refusal_lexing(void **state)
{
    /* PostgreSQL ends "--" comments at \r too, nests block comments, and ";COMMIT" is COMMIT. */
    assert_string_equal(pgjson_txn_keyword("-- x\rCOMMIT"), "COMMIT");
    assert_string_equal(pgjson_txn_keyword("--x\r\nCOMMIT"), "COMMIT");
    assert_string_equal(pgjson_txn_keyword(";COMMIT"), "COMMIT");
    assert_string_equal(pgjson_txn_keyword(" ; ;\t;commit"), "COMMIT");
    assert_string_equal(pgjson_txn_keyword("/* a /* b */ c */COMMIT"), "COMMIT");
    assert_string_equal(pgjson_txn_keyword("/**/;/* */--\r;end"), "END");
    assert_null(pgjson_txn_keyword("/* a /* b */ COMMIT */ SELECT 1"));
    assert_null(pgjson_txn_keyword("-- COMMIT\nSELECT 1"));
    assert_null(pgjson_txn_keyword("COMMITTED"));
    expect_refused(";COMMIT", "transaction control");
    expect_refused("-- x\rCOMMIT", "transaction control");
    expect_refused("/* /* */ */ savepoint s", "transaction control");
    expect_refused("ROLLBACK", "transaction control");
    /* Empty statements yield no result: refused. */
    expect_refused("", "empty statement");
    expect_refused(" \r\n\t", "empty statement");
    expect_refused(";", "empty statement");
    expect_refused("; ;", "empty statement");
    expect_refused("-- only a comment", "empty statement");
    expect_refused("-- only\r", "empty statement");
    expect_refused("/* a /* nested */ comment */", "empty statement");
    expect_refused("/* unterminated", "empty statement");
    expect_allowed("SELECT 1");
    expect_allowed("-- c\rSELECT 1");
    expect_allowed("/* COMMIT */ UPDATE t SET commit = 1");
    expect_allowed("SELECT 'COMMIT'");
    expect_allowed("DO $$BEGIN PERFORM 1; END$$");
}

static void test_refusal_keywords(void **state)
{
    expect_refused("COPY t TO STDOUT", "COPY is not allowed");
    expect_refused(" copy t FROM STDIN", "COPY is not allowed");
    expect_refused(";Copy t TO STDOUT", "COPY is not allowed");
    expect_refused("LISTEN ch", "LISTEN, UNLISTEN");
    expect_refused("unlisten *", "LISTEN, UNLISTEN");
    expect_refused("DISCARD ALL", "LISTEN, UNLISTEN");
    expect_refused("DEALLOCATE ALL", "LISTEN, UNLISTEN");
    expect_refused("RESET ALL", "RESET is not allowed");
    expect_refused("RESET ROLE", "RESET is not allowed");
    expect_refused("SET ROLE other", "SET ROLE");
    expect_refused("set/* */role other", "SET ROLE");
    expect_refused("SET SESSION AUTHORIZATION other", "SET ROLE");
    expect_refused("SET SESSION -- c\r AUTHORIZATION other", "SET ROLE");
    expect_refused("SET search_path = s, public", "session-level SET");
    expect_refused("SET SESSION search_path = s", "session-level SET");
    expect_refused("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY", "session-level SET");
    expect_refused("SET statement_timeout TO 0", "session-level SET");
    expect_refused("SET LOCALE = 1", "session-level SET");
    expect_allowed("SET LOCAL search_path = s");
    expect_allowed("set local statement_timeout = 100");
    expect_allowed("SET /* c */ LOCAL ROLE other");
    expect_allowed("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE");
    expect_allowed("SET CONSTRAINTS ALL DEFERRED");
    expect_allowed("SELECT set_config('x.y', '1', true)");
    expect_allowed("SETTLE");
    expect_allowed("NOTIFY ch");
    /* fencegate's own table, however it is spelled. */
    expect_refused("UPDATE fencegate_fence SET token = 0", "fencegate_fence");
    expect_refused("SELECT * FROM public.\"FenceGate_Fence\"", "fencegate_fence");
    expect_refused("DROP TABLE FENCEGATE_FENCE", "fencegate_fence");
    expect_refused("SELECT * FROM my_fencegate_fences", "fencegate_fence"); /* a plain substring */
    expect_allowed("SELECT 'fencegate', 'fence'");
    /* ... spelled with Unicode escapes, or through fencegate's prepared statements. */
    expect_refused("UPDATE U&\"fencegate\\005ffence\" SET token = 1", "Unicode-escaped");
    expect_refused("SELECT * FROM u&\"x\"", "Unicode-escaped");
    expect_allowed("SELECT U&'caf\\00e9', 'u&'");
    expect_refused("EXECUTE fencegate_fence_r1('L', 9)", "fencegate_fence");
    expect_refused("execute q(1)", "EXECUTE is not allowed");
    expect_refused("DO $$ BEGIN EXECUTE 'EXECUTE fencegate_fence_c(1)'; END $$", "fencegate_fence");
    /* Through the parser: the index and the reason. */
    expect_error("{\"lock\":\"L\",\"statements\":[{\"sql\":\"SELECT 1\"},{\"sql\":\";COMMIT\"}]}",
                 FG_ERR_PROTO, "statements[1].sql: COMMIT is not allowed");
    expect_error("{\"lock\":\"L\",\"statements\":[{\"sql\":\"-- x\\rCOMMIT\"}]}", FG_ERR_PROTO,
                 "statements[0].sql: COMMIT is not allowed");
    expect_error("{\"lock\":\"L\",\"statements\":[{\"sql\":\"SELECT 1\"},{\"sql\":\"SELECT 2\"},"
                 "{\"sql\":\"COPY t TO STDOUT\"}]}",
                 FG_ERR_PROTO, "statements[2].sql: COPY is not allowed");
    expect_error("{\"lock\":\"L\",\"statements\":[{\"sql\":\"SET search_path = x\"}]}",
                 FG_ERR_PROTO, "statements[0].sql: a session-level SET is not allowed");
    expect_error("{\"lock\":\"L\",\"statements\":[{\"sql\":\"-- c\"},{\"sql\":\"SELECT 1\"}]}",
                 FG_ERR_PROTO, "statements[0].sql: empty statement");
}

static void test_buf_limit(void **state)
{
    struct pgjson_buf b = {0};

    b.limit = 10;
    pgjson_puts(&b, "12345");
    pgjson_puts(&b, "67890");
    assert_int_equal(b.len, 10);
    assert_int_equal(b.failed, 0);
    pgjson_puts(&b, "x");
    assert_int_equal(b.over, 1);
    assert_int_equal(b.failed, 1);
    assert_int_equal(b.len, 10);
    pgjson_buf_free(&b);
}

/* The output must be one valid JSON document. */
static void assert_valid_json(const char *s)
{
    struct json_reader r;
    struct json_token t;

    json_reader_init(&r, s, strlen(s));
    do {
        if (json_next(&r, &t) != FG_OK)
            fail_msg("not JSON (%s): %s", json_reader_error(&r), s);
    } while (t.type != JSON_END);
}

static void test_put_str(void **state)
{
    struct pgjson_buf b = {0};

    pgjson_put_str(&b, "a\"b\\c\n\x01\xc3\xa9\xff\xe2\x82", 12);
    assert_string_equal(b.p, "\"a\\\"b\\\\c\\u000a\\u0001\xc3\xa9\xef\xbf\xbd\xef\xbf\xbd\xef"
                             "\xbf\xbd\"");
    assert_valid_json(b.p);
    pgjson_buf_free(&b);
}

static void test_put_value(void **state)
{
    static const struct {
        unsigned oid;
        const char *text;
        const char *want;
    } cases[] = {
        {PGJSON_OID_INT4, "42", "42"},
        {PGJSON_OID_INT8, "-9223372036854775808", "-9223372036854775808"},
        {PGJSON_OID_NUMERIC, "1.50", "1.50"},
        {PGJSON_OID_NUMERIC, "NaN", "\"NaN\""},
        {PGJSON_OID_FLOAT8, "Infinity", "\"Infinity\""},
        {PGJSON_OID_FLOAT8, "1e+300", "1e+300"},
        {PGJSON_OID_FLOAT8, "01", "\"01\""},
        {PGJSON_OID_BOOL, "t", "true"},
        {PGJSON_OID_BOOL, "f", "false"},
        {PGJSON_OID_TEXT, "42", "\"42\""},
        {114, "{\"a\":1}", "\"{\\\"a\\\":1}\""},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct pgjson_buf b = {0};
        pgjson_put_value(&b, cases[i].oid, cases[i].text, strlen(cases[i].text), 0);
        if (strcmp(b.p, cases[i].want))
            fail_msg("oid %u '%s': got %s, want %s", cases[i].oid, cases[i].text, b.p,
                     cases[i].want);
        pgjson_buf_free(&b);
    }
    {
        struct pgjson_buf b = {0};
        pgjson_put_value(&b, PGJSON_OID_INT4, NULL, 0, 1);
        assert_string_equal(b.p, "null");
        pgjson_buf_free(&b);
    }
}

static void test_command(void **state)
{
    size_t n;
    long long rows;

    pgjson_command("UPDATE 3", &n, &rows);
    assert_int_equal(n, 6);
    assert_int_equal(rows, 3);
    pgjson_command("INSERT 0 1", &n, &rows);
    assert_int_equal(n, 6);
    assert_int_equal(rows, 1);
    pgjson_command("CREATE TABLE", &n, &rows);
    assert_int_equal(n, 12);
    assert_int_equal(rows, -1);
    pgjson_command("", &n, &rows);
    assert_int_equal(n, 0);
    assert_int_equal(rows, -1);
}

/* A fake two-column, two-row result. */
static const char *fake_name(void *arg, int col)
{
    return col == 0 ? "id" : "na\"me";
}
static unsigned fake_type(void *arg, int col)
{
    return col == 0 ? PGJSON_OID_INT4 : 99999;
}
static const char *fake_value(void *arg, int row, int col, size_t *n)
{
    static const char *v[2][2] = {{"1", "one"}, {"2", NULL}};
    if (!v[row][col])
        return NULL;
    *n = strlen(v[row][col]);
    return v[row][col];
}

static void test_put_result(void **state)
{
    struct pgjson_buf b = {0};
    struct pgjson_result r = {"SELECT 2", 2, 2, NULL, fake_name, fake_type, fake_value};
    struct pgjson_result u = {"UPDATE 0", 0, 0, NULL, fake_name, fake_type, fake_value};

    pgjson_put_result(&b, &r);
    assert_string_equal(b.p, "{\"command\":\"SELECT\",\"rows_affected\":2,\"columns\":[\"id\","
                             "\"na\\\"me\"],\"types\":[\"int4\",\"99999\"],\"rows\":[[1,\"one\"],"
                             "[2,null]]}");
    assert_valid_json(b.p);
    pgjson_buf_free(&b);
    pgjson_put_result(&b, &u);
    assert_string_equal(b.p, "{\"command\":\"UPDATE\",\"rows_affected\":0,\"columns\":[],"
                             "\"types\":[],\"rows\":[]}");
    pgjson_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_ok),         cmocka_unit_test(test_parse_unicode),
        cmocka_unit_test(test_parse_errors),     cmocka_unit_test(test_parse_limits),
        cmocka_unit_test(test_txn_keyword),      cmocka_unit_test(test_put_str),
        cmocka_unit_test(test_put_value),        cmocka_unit_test(test_command),
        cmocka_unit_test(test_put_result),       cmocka_unit_test(test_refusal_lexing),
        cmocka_unit_test(test_refusal_keywords), cmocka_unit_test(test_buf_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
