/* test_config.c — unit tests of the configuration module: YAML, environment, flags, checks. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

/* The file of DESIGN.md section 5, verbatim. */
static const char design_sample[] =
    "listen:   { resp: 127.0.0.1:6380, http: 127.0.0.1:8380 }\n"
    "backend:  { url: \"etcd://127.0.0.1:2379\", prefix: /fencegate/locks/, session_ttl_ms: 10000 "
    "}\n"
    "stores:\n"
    "  - { name: cache,  url: \"redis://127.0.0.1:6379\" }            # upstream of the RESP "
    "endpoint\n"
    "  - { name: ledger, url: \"postgresql://app@127.0.0.1:5432/app\" }\n"
    "  - { name: blobs,  url: \"http://127.0.0.1:9000\" }\n"
    "protect:\n"
    "  - { store: cache, keys: \"wallet:*\", lock: \"wallet:$1\" }      # $1 = what the first * "
    "matched\n";

static void assert_contains_(const char *hay, const char *needle, const char *file, int line)
{
    if (!strstr(hay, needle)) {
        print_error("expected \"%s\"\n      in \"%s\"\n", needle, hay);
        _fail(file, line);
    }
}
#define assert_contains(h, n) assert_contains_((h), (n), __FILE__, __LINE__)

static void assert_starts_with_(const char *s, const char *prefix, const char *file, int line)
{
    if (strncmp(s, prefix, strlen(prefix)) != 0) {
        print_error("expected prefix \"%s\"\n             of \"%s\"\n", prefix, s);
        _fail(file, line);
    }
}
#define assert_starts_with(s, p) assert_starts_with_((s), (p), __FILE__, __LINE__)

static struct cfg *new_cfg(void)
{
    struct cfg *c = calloc(1, sizeof *c);

    assert_non_null(c);
    cfg_defaults(c);
    return c;
}

static int parse(struct cfg *c, const char *yaml, struct cfg_error *err)
{
    memset(err, 0, sizeof *err);
    return cfg_parse_yaml(c, yaml, strlen(yaml), "t.yaml", err);
}

/* Parses yaml over the defaults and asserts it fails with exactly `msg`. */
static void expect_yaml_msg(const char *yaml, const char *msg)
{
    struct cfg *c = new_cfg();
    struct cfg_error err;

    assert_int_equal(parse(c, yaml, &err), FG_ERR_CONFIG);
    assert_string_equal(err.msg, msg);
    free(c);
}

/* Parses yaml over the defaults and asserts it fails with a message holding both needles. */
static void expect_yaml_err(const char *yaml, const char *needle1, const char *needle2)
{
    struct cfg *c = new_cfg();
    struct cfg_error err;

    assert_int_equal(parse(c, yaml, &err), FG_ERR_CONFIG);
    assert_contains(err.msg, needle1);
    if (needle2)
        assert_contains(err.msg, needle2);
    free(c);
}

static void expect_yaml_ok(const char *yaml, struct cfg *c)
{
    struct cfg_error err;
    int rc = parse(c, yaml, &err);

    if (rc != FG_OK)
        print_error("unexpected error: %s\n", err.msg);
    assert_int_equal(rc, FG_OK);
}

/* Clears what struct cfg keeps only for error messages (where each value came from), so that
 * two configs can be compared by what they configure. */
static void forget_origins(struct cfg *c)
{
    memset(c->source, 0, sizeof c->source);
    memset(c->origin, 0, sizeof c->origin);
    for (int i = 0; i < CFG_MAX_PROTECT; i++)
        memset(&c->protect[i].at, 0, sizeof c->protect[i].at);
    for (int i = 0; i < CFG_MAX_STORES; i++)
        memset(&c->stores[i].at, 0, sizeof c->stores[i].at);
}

static void finish_ok(struct cfg *c)
{
    struct cfg_error err;
    int rc;

    memset(&err, 0, sizeof err);
    rc = cfg_finish(c, &err);
    if (rc != FG_OK)
        print_error("unexpected error: %s\n", err.msg);
    assert_int_equal(rc, FG_OK);
}

static void assert_addr(const struct cfg_addr *a, const char *host, int port)
{
    assert_string_equal(a->host, host);
    assert_int_equal(a->port, port);
}

/* ---- defaults and the DESIGN.md sample ----------------------------------------------------- */

static void test_defaults_without_any_config(void **state)
{
    struct cfg *c = new_cfg();
    struct cfg_error err;
    enum cfg_action action = CFG_HELP;
    char *env[] = {"PATH=/usr/bin", "HOME=/root", NULL};
    char *argv[] = {"fencegate", NULL};

    assert_int_equal(cfg_apply_env(c, env, &err), FG_OK);
    assert_int_equal(cfg_apply_args(c, 1, argv, &action, &err), FG_OK);
    assert_int_equal(action, CFG_RUN);
    assert_null(cfg_config_path(1, argv, env));
    finish_ok(c);

    assert_addr(&c->listen_resp, "127.0.0.1", 6380);
    assert_addr(&c->listen_http, "127.0.0.1", 8380);
    assert_int_equal(c->upstream.kind, CFG_URL_REDIS);
    assert_string_equal(c->upstream.raw, "redis://127.0.0.1:6379");
    assert_int_equal(c->upstream.nhosts, 1);
    assert_addr(&c->upstream.hosts[0], "127.0.0.1", 6379);
    assert_int_equal(c->backend.kind, CFG_URL_REDIS);
    assert_string_equal(c->backend.raw, "redis://127.0.0.1:6379");
    assert_addr(&c->backend.hosts[0], "127.0.0.1", 6379);
    assert_int_equal(c->backend.db, 0);
    assert_string_equal(c->backend_prefix, "/fencegate/locks/");
    assert_int_equal(c->session_ttl_ms, 10000);
    assert_int_equal(c->max_clients, 10000);
    assert_int_equal(c->max_request_bytes, 512LL * 1024 * 1024 + 64 * 1024);
    assert_int_equal(c->max_pending_bytes, 1024 * 1024);
    assert_int_equal(c->upstream_multiplex, 1);
    assert_int_equal(c->fenced_transactions, 1);
    assert_int_equal(c->max_args, 8388608);
    assert_int_equal(c->shutdown_grace_ms, 10000);
    assert_int_equal(c->log_level, CFG_LOG_INFO);
    assert_int_equal(c->app_health_url.kind, 0); /* no application health check */
    assert_int_equal(c->app_health_interval_ms, 1000);
    assert_int_equal(c->app_health_timeout_ms, 1000);
    assert_int_equal(c->app_health_failures, 3);
    /* The default Redis is both the upstream and a store. */
    assert_int_equal(c->nstores, 1);
    assert_string_equal(c->stores[0].name, "redis");
    assert_string_equal(c->stores[0].url.raw, "redis://127.0.0.1:6379");
    assert_int_equal(c->nprotect, 0);
    free(c);
}

static void test_design_sample(void **state)
{
    struct cfg *c = new_cfg();

    expect_yaml_ok(design_sample, c);
    assert_addr(&c->listen_resp, "127.0.0.1", 6380);
    assert_addr(&c->listen_http, "127.0.0.1", 8380);
    assert_int_equal(c->backend.kind, CFG_URL_ETCD);
    assert_string_equal(c->backend.raw, "etcd://127.0.0.1:2379");
    assert_int_equal(c->backend.nhosts, 1);
    assert_addr(&c->backend.hosts[0], "127.0.0.1", 2379);
    assert_string_equal(c->backend_prefix, "/fencegate/locks/");
    assert_int_equal(c->session_ttl_ms, 10000);

    assert_int_equal(c->nstores, 3);
    assert_string_equal(c->stores[0].name, "cache");
    assert_int_equal(c->stores[0].url.kind, CFG_URL_REDIS);
    assert_addr(&c->stores[0].url.hosts[0], "127.0.0.1", 6379);
    assert_string_equal(c->stores[1].name, "ledger");
    assert_int_equal(c->stores[1].url.kind, CFG_URL_POSTGRES);
    assert_string_equal(c->stores[1].url.raw, "postgresql://app@127.0.0.1:5432/app");
    assert_addr(&c->stores[1].url.hosts[0], "127.0.0.1", 5432);
    assert_string_equal(c->stores[1].url.path, "app");
    assert_string_equal(c->stores[2].name, "blobs");
    assert_int_equal(c->stores[2].url.kind, CFG_URL_HTTP);
    assert_addr(&c->stores[2].url.hosts[0], "127.0.0.1", 9000);
    assert_string_equal(c->stores[2].url.path, "");

    assert_int_equal(c->nprotect, 1);
    assert_string_equal(c->protect[0].store, "cache");
    assert_string_equal(c->protect[0].keys, "wallet:*");
    assert_string_equal(c->protect[0].lock, "wallet:$1");

    finish_ok(c);
    /* The first redis store is the upstream, and it is not added twice. */
    assert_int_equal(c->upstream.kind, CFG_URL_REDIS);
    assert_string_equal(c->upstream.raw, "redis://127.0.0.1:6379");
    assert_int_equal(c->nstores, 3);
    free(c);
}

/* Block and flow shapes of the same settings parse to the same values. */
static void test_block_and_flow_shapes(void **state)
{
    struct cfg *a = new_cfg(), *b = new_cfg();

    expect_yaml_ok("listen:\n"
                   "  resp: 0.0.0.0:7000\n"
                   "  http: '[::1]:7001'\n"
                   "limits:\n"
                   "  max_clients: 5\n"
                   "  max_args: \"99\"\n"
                   "log:\n"
                   "  level: DEBUG\n"
                   "shutdown_grace_ms: 0\n"
                   "stores:\n"
                   "  - name: s1\n"
                   "    url: redis://h1\n",
                   a);
    expect_yaml_ok("{listen: {resp: 0.0.0.0:7000, http: '[::1]:7001'},\n"
                   " limits: {max_clients: 5, max_args: \"99\"}, log: {level: DEBUG},\n"
                   " shutdown_grace_ms: 0, stores: [{name: s1, url: 'redis://h1'}]}\n",
                   b);
    forget_origins(a);
    forget_origins(b);
    assert_memory_equal(a, b, sizeof *a);
    assert_addr(&a->listen_resp, "0.0.0.0", 7000);
    assert_addr(&a->listen_http, "::1", 7001);
    assert_int_equal(a->max_clients, 5);
    assert_int_equal(a->max_args, 99);
    assert_int_equal(a->log_level, CFG_LOG_DEBUG);
    assert_int_equal(a->shutdown_grace_ms, 0);
    assert_int_equal(a->nstores, 1);
    assert_addr(&a->stores[0].url.hosts[0], "h1", 6379);
    free(a);
    free(b);
}

static void test_empty_documents_keep_defaults(void **state)
{
    static const char *const docs[] = {"",
                                       "\n",
                                       "# only a comment\n",
                                       "---\n",
                                       "~\n",
                                       "--- null\n...\n",
                                       "listen:\nstores:\nprotect: ~\n"};
    struct cfg *want = new_cfg();

    for (size_t i = 0; i < sizeof docs / sizeof docs[0]; i++) {
        struct cfg *c = new_cfg();

        expect_yaml_ok(docs[i], c);
        forget_origins(c);
        assert_memory_equal(c, want, sizeof *c);
        free(c);
    }
    free(want);
}

/* ---- YAML errors: each names source:line:column, the key and the value -------------------- */

static void test_yaml_syntax_errors(void **state)
{
    expect_yaml_err("listen:\n\tresp: 1\n", "t.yaml:2:1: YAML syntax error: ", "tabs");
    expect_yaml_err("listen: { resp: 1\n",
                    "t.yaml:2:1: YAML syntax error: ", "did not find expected ',' or '}'");
    expect_yaml_err("listen:\n  resp: 1\n bad: 2\n", "t.yaml:3:2: YAML syntax error: ", NULL);
    expect_yaml_err("log: { level: \"info }\n", "t.yaml:", "YAML syntax error: ");
    expect_yaml_err("a: 1\nb: \x01\n",
                    "t.yaml:2:4: YAML syntax error: ", "control characters are not allowed");
    expect_yaml_err("log:\n  level: \xc3\x28\n", "t.yaml:2:11: YAML syntax error: ", "UTF-8");
    {
        /* A NUL byte inside the given length. */
        static const char nul[] = "log:\n  level: in\0fo\n";
        struct cfg *c = new_cfg();
        struct cfg_error err;

        assert_int_equal(cfg_parse_yaml(c, nul, sizeof nul - 1, "t.yaml", &err), FG_ERR_CONFIG);
        assert_contains(err.msg, "t.yaml:2:");
        assert_contains(err.msg, "YAML syntax error: ");
        free(c);
    }
}

static void test_unknown_keys(void **state)
{
    expect_yaml_msg("lisen: {}\n",
                    "t.yaml:1:1: unknown key 'lisen' (expected one of: listen, upstream, "
                    "upstream_multiplex, fenced_transactions, backend, stores, protect, "
                    "limits, log, shutdown_grace_ms, app_health)");
    expect_yaml_msg("listen:\n  resp: 1234\n  rsp: 1\n",
                    "t.yaml:3:3: listen: unknown key 'rsp' (expected one of: resp, http)");
    expect_yaml_err("backend: { url: redis://h, ttl: 5 }\n", "t.yaml:1:28: backend: ",
                    "unknown key 'ttl' (expected one of: url, prefix, session_ttl_ms, tls_ca_file, "
                    "tls_cert_file, tls_key_file, tls_server_name, password_file)");
    expect_yaml_err("stores:\n  - { name: a, url: redis://h, port: 1 }\n",
                    "t.yaml:2:32: stores[0]: unknown key 'port'", NULL);
    expect_yaml_err("protect:\n  - { store: a, keys: 'x:*', lock: 'x:$1', mode: w }\n",
                    "t.yaml:2:44: protect[0]: unknown key 'mode'", NULL);
    expect_yaml_err("app_health: { url: 'http://h/', period_ms: 5 }\n", "t.yaml:1:33: app_health: ",
                    "unknown key 'period_ms' (expected one of: url, interval_ms, timeout_ms, "
                    "failure_threshold)");
    /* Keys are case-sensitive. */
    expect_yaml_err("Listen: {}\n", "t.yaml:1:1: unknown key 'Listen'", NULL);
}

/* app_health.url: an http:// URL, or empty for none. */
static void test_app_health_url(void **state)
{
    struct cfg *c = new_cfg();

    expect_yaml_ok("app_health:\n  url: http://[::1]:9000/live/z\n", c);
    assert_int_equal(c->app_health_url.kind, CFG_URL_HTTP);
    assert_addr(&c->app_health_url.hosts[0], "::1", 9000);
    assert_string_equal(c->app_health_url.path, "/live/z");
    expect_yaml_ok("app_health: { url: '' }\n", c); /* a later source turns it off */
    assert_int_equal(c->app_health_url.kind, 0);
    free(c);
    expect_yaml_msg("app_health: { url: 'redis://h:1' }\n",
                    "t.yaml:1:20: app_health.url: bad URL 'redis://h:1': the health check must be "
                    "an http:// URL");
    expect_yaml_err("app_health: { url: 'https://h/' }\n",
                    "t.yaml:1:20: app_health.url: ", "https:// is not supported");
    expect_yaml_err("app_health: { url: 'http://h:0/' }\n", "t.yaml:1:20: app_health.url: ", NULL);
    expect_yaml_err("app_health: { url: 'http://h/x?verbose=1' }\n",
                    "app_health.url: ", "query strings");
}

static void test_wrong_types(void **state)
{
    expect_yaml_msg("listen: 5\n", "t.yaml:1:9: listen: expected a mapping of resp, http, got '5'");
    expect_yaml_msg("listen:\n  resp: [127.0.0.1:1]\n",
                    "t.yaml:2:9: listen.resp: expected an address HOST:PORT, got a list");
    expect_yaml_err("limits:\n  max_clients: { a: 1 }\n",
                    "t.yaml:2:16: limits.max_clients: expected a number, got a mapping", NULL);
    expect_yaml_err("stores: { name: a }\n",
                    "t.yaml:1:9: stores: expected a list of { name, url } mappings, got a mapping",
                    NULL);
    expect_yaml_err("stores:\n  - redis://h\n",
                    "t.yaml:2:5: stores[0]: expected a mapping { name, url }, got 'redis://h'",
                    NULL);
    expect_yaml_err("protect: x\n", "t.yaml:1:10: protect: expected a list", NULL);
    expect_yaml_err("- listen\n", "t.yaml:1:1: the top level must be a mapping", "got a list");
    expect_yaml_err("hello\n", "t.yaml:1:1: the top level must be a mapping", "got 'hello'");
    expect_yaml_err("? [a]\n: b\n", "t.yaml:1:3: expected a key", "got a list");
    expect_yaml_err("upstream:\n", "t.yaml:", "upstream: missing value (expected a redis:// URL)");
    expect_yaml_err("log: { level: ~ }\n", "t.yaml:1:15: log.level: missing value", NULL);
}

static void test_duplicate_keys(void **state)
{
    expect_yaml_msg("log:\n  level: info\n  level: debug\n",
                    "t.yaml:3:3: log.level: duplicate key (first given at line 2)");
    expect_yaml_msg("shutdown_grace_ms: 1\nlog: {}\nshutdown_grace_ms: 2\n",
                    "t.yaml:3:1: shutdown_grace_ms: duplicate key (first given at line 1)");
    expect_yaml_err("stores:\n  - { name: a, name: b, url: redis://h }\n",
                    "t.yaml:2:16: stores[0].name: duplicate key (first given at line 2)", NULL);
}

static void test_anchors_aliases_tags_documents(void **state)
{
    expect_yaml_err("listen: &l { resp: 1234 }\n", "t.yaml:1:9: anchors ('&l') are not supported",
                    NULL);
    expect_yaml_err("log: { level: &x info }\nupstream: *x\n",
                    "t.yaml:1:15: anchors ('&x') are not supported", NULL);
    expect_yaml_err("upstream: *x\n", "t.yaml:1:11: aliases ('*x') are not supported", NULL);
    expect_yaml_err("log: { level: !!str info }\n", "t.yaml:1:15: tags (", "are not supported");
    expect_yaml_err("log: {}\n---\nlog: {}\n", "t.yaml:2:1: a second YAML document", NULL);
}

static void test_bad_address_in_yaml(void **state)
{
    /* The example of the brief, exactly. */
    expect_yaml_msg(
        "listen:\n  resp: 127.0.0.1:99999\n",
        "t.yaml:2:9: listen.resp: bad address '127.0.0.1:99999': port must be 1..65535");
    expect_yaml_msg("listen: { http: '256.1.1.1:80' }\n",
                    "t.yaml:1:17: listen.http: bad address '256.1.1.1:80': bad IPv4 address (four "
                    "numbers 0..255, no leading zeros)");
    expect_yaml_err("listen:\n  resp: \"in\\0side:1\"\n",
                    "t.yaml:2:9: listen.resp: value 'in\\x00side:1' contains a NUL byte", NULL);
}

static void test_bad_url_in_yaml(void **state)
{
    expect_yaml_msg(
        "backend:\n  url: ftp://h\n",
        "t.yaml:2:8: backend.url: bad URL 'ftp://h': unknown scheme (expected redis://, "
        "etcd://, etcds://, postgresql://, postgres:// or http://)");
    expect_yaml_err("stores:\n  - { name: b, url: \"https://blobs\" }\n",
                    "t.yaml:2:21: stores[0].url: bad URL 'https://blobs': ", "TLS");
    expect_yaml_err("backend: { url: 'postgresql://h/db' }\n",
                    "t.yaml:1:17: backend.url: bad URL 'postgresql://h/db': ",
                    "the lock backend must be redis:// or etcd://");
    expect_yaml_err("upstream: etcd://h\n", "t.yaml:1:11: upstream: bad URL 'etcd://h': ",
                    "the upstream must be a redis:// URL");
    expect_yaml_err("stores:\n  - { name: e, url: 'etcd://h' }\n",
                    "t.yaml:2:21: stores[0].url: bad URL 'etcd://h': a store must be", NULL);
    expect_yaml_err("stores:\n  - { name: e, url: 'redis://:6379' }\n",
                    "t.yaml:2:21: stores[0].url: bad URL 'redis://:6379': empty host", NULL);
}

static void test_numbers_and_ranges(void **state)
{
    static const struct {
        const char *key, *sub;
        long long min, max;
    } nums[] = {
        {"backend", "session_ttl_ms", 500, 3600000},
        {"limits", "max_clients", 1, 1000000},
        {"limits", "max_request_bytes", 1024, 4294967296LL},
        {"limits", "max_pending_bytes", 4096, 1073741824LL},
        {"limits", "max_args", 1, 2147483647LL},
        {NULL, "shutdown_grace_ms", 0, 600000},
        {"app_health", "interval_ms", 100, 600000},
        {"app_health", "timeout_ms", 100, 600000},
        {"app_health", "failure_threshold", 1, 1000},
    };
    static const char *const bad_syntax[] = {"10k", "1e3",  "0x10", "1_000", "+5",   "5.0",
                                             "'-'", "\"\"", "1 2",  "010",   "true", "\"12 \""};
    char yaml[256], where[64], quoted[64];

    for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++) {
        const long long ok[] = {nums[i].min, nums[i].max};
        const long long out[] = {nums[i].min - 1, nums[i].max + 1};
        const char *key = nums[i].sub;

        for (int k = 0; k < 2; k++) {
            struct cfg *c = new_cfg();

            if (nums[i].key)
                snprintf(yaml, sizeof yaml, "%s:\n  %s: %lld\n", nums[i].key, key, ok[k]);
            else
                snprintf(yaml, sizeof yaml, "%s: %lld\n", key, ok[k]);
            expect_yaml_ok(yaml, c);
            if (!strcmp(key, "session_ttl_ms"))
                assert_int_equal(c->session_ttl_ms, ok[k]);
            else if (!strcmp(key, "max_clients"))
                assert_int_equal(c->max_clients, ok[k]);
            else if (!strcmp(key, "max_request_bytes"))
                assert_int_equal(c->max_request_bytes, ok[k]);
            else if (!strcmp(key, "max_pending_bytes"))
                assert_int_equal(c->max_pending_bytes, ok[k]);
            else if (!strcmp(key, "max_args"))
                assert_int_equal(c->max_args, ok[k]);
            else if (!strcmp(key, "interval_ms"))
                assert_int_equal(c->app_health_interval_ms, ok[k]);
            else if (!strcmp(key, "timeout_ms"))
                assert_int_equal(c->app_health_timeout_ms, ok[k]);
            else if (!strcmp(key, "failure_threshold"))
                assert_int_equal(c->app_health_failures, ok[k]);
            else
                assert_int_equal(c->shutdown_grace_ms, ok[k]);
            free(c);

            if (nums[i].key) {
                snprintf(yaml, sizeof yaml, "%s:\n  %s: %lld\n", nums[i].key, key, out[k]);
                snprintf(where, sizeof where, "t.yaml:2:%zu: %s.%s: ", strlen(key) + 5, nums[i].key,
                         key);
            } else {
                snprintf(yaml, sizeof yaml, "%s: %lld\n", key, out[k]);
                snprintf(where, sizeof where, "t.yaml:1:%zu: %s: ", strlen(key) + 3, key);
            }
            snprintf(quoted, sizeof quoted, "number '%lld' is out of range: must be %lld..%lld",
                     out[k], nums[i].min, nums[i].max);
            expect_yaml_err(yaml, where, quoted);
        }
        for (size_t b = 0; b < sizeof bad_syntax / sizeof bad_syntax[0]; b++) {
            if (nums[i].key)
                snprintf(yaml, sizeof yaml, "%s:\n  %s: %s\n", nums[i].key, key, bad_syntax[b]);
            else
                snprintf(yaml, sizeof yaml, "%s: %s\n", key, bad_syntax[b]);
            expect_yaml_err(yaml, "bad number '", "t.yaml:");
        }
        /* Overflow of long long is "out of range", not wrap-around. */
        if (nums[i].key)
            snprintf(yaml, sizeof yaml, "%s:\n  %s: 99999999999999999999999\n", nums[i].key, key);
        else
            snprintf(yaml, sizeof yaml, "%s: 99999999999999999999999\n", key);
        expect_yaml_err(yaml, "number '99999999999999999999999' is out of range", NULL);
        if (nums[i].key)
            snprintf(yaml, sizeof yaml, "%s:\n  %s: -99999999999999999999999\n", nums[i].key, key);
        else
            snprintf(yaml, sizeof yaml, "%s: -99999999999999999999999\n", key);
        expect_yaml_err(yaml, "number '-99999999999999999999999' is out of range", NULL);
    }
    expect_yaml_msg("limits: { max_clients: 10k }\n",
                    "t.yaml:1:24: limits.max_clients: bad number '10k': expected a decimal integer "
                    "1..1000000");
    expect_yaml_err("limits: { max_args: 010 }\n", "bad number '010': leading zeros", NULL);
    /* 2^64 + 5 would wrap around to 5 without the overflow check. */
    expect_yaml_err(
        "limits: { max_clients: 18446744073709551621 }\n",
        "t.yaml:1:24: limits.max_clients: number '18446744073709551621' is out of range", NULL);
    expect_yaml_err(
        "log: { level: verbose }\n",
        "t.yaml:1:15: log.level: bad log level 'verbose': expected error, warn, info or "
        "debug",
        NULL);
}

static void test_lock_templates(void **state)
{
    struct cfg *c = new_cfg();

    expect_yaml_msg("protect:\n  - { store: cache, keys: \"wallet:*\", lock: \"wallet:$2\" }\n",
                    "t.yaml:2:45: protect[0].lock: bad lock template 'wallet:$2': $2 refers to '*' "
                    "number 2, but keys 'wallet:*' has 1");
    /* The lock may come before the keys; the position is still the lock's. */
    expect_yaml_err("protect:\n"
                    "  - store: s\n"
                    "    lock: 'a:$1'\n"
                    "    keys: 'plain'\n",
                    "t.yaml:3:11: protect[0].lock: bad lock template 'a:$1'", "has 0");
    expect_yaml_err("protect:\n  - { store: s, keys: 'a:*', lock: 'a:$0' }\n",
                    "t.yaml:2:36: protect[0].lock: bad lock template 'a:$0'", "no $0");
    expect_yaml_err("protect:\n  - { store: s, keys: '', lock: 'a' }\n",
                    "t.yaml:2:23: protect[0].keys: empty key pattern", NULL);
    expect_yaml_err("protect:\n  - { store: s, keys: 'a', lock: \"\" }\n",
                    "t.yaml:2:34: protect[0].lock: empty lock name", NULL);
    expect_yaml_err("protect:\n  - { store: s, keys: 'a' }\n",
                    "t.yaml:2:5: protect[0]: missing 'lock'", NULL);
    /* Two stars, two captures, in any order; '$' not before a digit is literal. */
    expect_yaml_ok("protect:\n"
                   "  - { store: s, keys: 'o:*:*', lock: 'o:$2:$1:$$x' }\n"
                   "  - { store: s, keys: 'k?', lock: 'k' }\n",
                   c);
    assert_int_equal(c->nprotect, 2);
    assert_string_equal(c->protect[0].lock, "o:$2:$1:$$x");
    assert_string_equal(c->protect[1].keys, "k?");
    /* Only '*' and '?' are special in keys (fence.c). Redis's own globs (KEYS, SCAN MATCH) also
     * have [classes] and \\ escapes; written here they would match literally and leave the keys
     * they were meant for unprotected, so they are refused. */
    expect_yaml_err("protect:\n  - { store: s, keys: 'user:[0-9]*', lock: 'u:$1' }\n",
                    "t.yaml:2:23: protect[0].keys: bad key pattern 'user:[0-9]*': '[' ", NULL);
    expect_yaml_err("protect:\n  - { store: s, keys: 'a\\*b:*', lock: 'a:$1' }\n",
                    "t.yaml:2:23: protect[0].keys: bad key pattern 'a\\\\*b:*': '\\\\' ", NULL);
    /* "$$" is a '$' of the lock name, as fence.c expands it: "$$1" names no '*' ... */
    expect_yaml_ok("protect:\n  - { store: s, keys: 'price', lock: 'cost:$$1' }\n", c);
    assert_string_equal(c->protect[0].lock, "cost:$$1");
    expect_yaml_ok("protect:\n  - { store: s, keys: 'p:*', lock: 'p:$$$$0:$$$1' }\n", c);
    /* ... and "$$$2" is a '$' and then $2. */
    expect_yaml_err("protect:\n  - { store: s, keys: 'a:*', lock: 'a:$$$2' }\n",
                    "t.yaml:2:36: protect[0].lock: bad lock template 'a:$$$2': $2 refers to '*' "
                    "number 2, but keys 'a:*' has 1",
                    NULL);
    free(c);
}

static void test_store_entries(void **state)
{
    expect_yaml_msg("stores:\n"
                    "  - { name: a, url: 'redis://h1' }\n"
                    "  - { name: a, url: 'redis://h2' }\n",
                    "t.yaml:3:13: stores[1].name: duplicate store name 'a' (stores[0] has it)");
    expect_yaml_err("stores:\n  - { name: 'a b', url: 'redis://h1' }\n",
                    "t.yaml:2:13: stores[0].name: bad store name 'a b': ", NULL);
    expect_yaml_err("stores:\n  - { url: 'redis://h1' }\n", "t.yaml:2:5: stores[0]: missing 'name'",
                    NULL);
    expect_yaml_err("stores:\n  - { name: x }\n", "t.yaml:2:5: stores[0]: missing 'url'", NULL);
    {
        /* A long but valid name; one byte more is refused. */
        char yaml[512], name[200];
        struct cfg *c = new_cfg();

        memset(name, 'n', 127);
        name[127] = '\0';
        snprintf(yaml, sizeof yaml, "stores:\n  - { name: %s, url: 'redis://h' }\n", name);
        expect_yaml_ok(yaml, c);
        assert_string_equal(c->stores[0].name, name);
        name[127] = 'n';
        name[128] = '\0';
        snprintf(yaml, sizeof yaml, "stores:\n  - { name: %s, url: 'redis://h' }\n", name);
        expect_yaml_err(yaml, "stores[0].name: bad store name", "longer than 127 bytes");
        free(c);
    }
    {
        /* 64 stores fit; the 65th is an error that names its position. */
        size_t cap = 80 * 70, o;
        char *yaml = malloc(cap);
        struct cfg *c = new_cfg();

        assert_non_null(yaml);
        o = (size_t)snprintf(yaml, cap, "stores:\n");
        for (int i = 0; i < CFG_MAX_STORES; i++)
            o += (size_t)snprintf(yaml + o, cap - o, "  - { name: s%d, url: 'redis://h%d' }\n", i,
                                  i);
        expect_yaml_ok(yaml, c);
        assert_int_equal(c->nstores, CFG_MAX_STORES);
        snprintf(yaml + o, cap - o, "  - { name: extra, url: 'redis://x' }\n");
        expect_yaml_err(yaml, "t.yaml:66:5: stores[64]: too many stores (at most 64)", NULL);
        free(yaml);
        free(c);
    }
}

/* A stand-in resolver: "alias" and "h" are one address. */
static int same_host_stub(const char *a, const char *b)
{
    return (strcmp(a, "alias") == 0 && strcmp(b, "h") == 0) ||
           (strcmp(a, "h") == 0 && strcmp(b, "alias") == 0);
}

/* The lock backend is the store's own Redis when port and db agree and the host does: spelled
 * alike (in any case), or one address as the resolver says. */
static void test_store_is_backend(void **state)
{
    static const struct {
        const char *upstream, *backend;
        int same;
    } cases[] = {
        {"redis://127.0.0.1:6379", NULL, 1}, /* backend defaults to the upstream */
        {"redis://Redis.Local:7000/2", "redis://redis.local:7000/2", 1},
        {"redis://u:p@h:7000", "redis://other:q@h:7000", 1},
        {"redis://h:7000/2", "redis://h:7000/3", 0},
        {"redis://h:7000", "redis://h:7001", 0},
        {"redis://localhost:6379", "redis://127.0.0.1:6379", 0},
        {"redis://h:7000", "etcd://h:2379", 0},
        {"redis://h:7000", "redis://alias:7000", 2},     /* 2: one address, the resolver says */
        {"redis://h:7000/1", "redis://alias:7000/2", 0}, /* but never across databases */
        {"redis://h:7000", "redis://alias:7001", 0},
    };

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct cfg *c = new_cfg();
        struct cfg_error err;

        assert_int_equal(cfg_parse_url(cases[i].upstream, &c->upstream, &err), FG_OK);
        if (cases[i].backend)
            assert_int_equal(cfg_parse_url(cases[i].backend, &c->backend, &err), FG_OK);
        finish_ok(c);
        if (cfg_store_is_backend(c, NULL) != (cases[i].same == 1) ||
            cfg_store_is_backend(c, same_host_stub) != (cases[i].same != 0))
            fail_msg("case %zu: %s and %s", i, cases[i].upstream,
                     cases[i].backend ? cases[i].backend : "(none)");
        free(c);
    }
}

/* A second document replaces lists rather than appending to them. */
static void test_lists_replace(void **state)
{
    struct cfg *c = new_cfg();

    expect_yaml_ok("stores: [{name: a, url: 'redis://a'}, {name: b, url: 'redis://b'}]\n", c);
    assert_int_equal(c->nstores, 2);
    expect_yaml_ok("stores: [{name: c, url: 'http://c'}]\n", c);
    assert_int_equal(c->nstores, 1);
    assert_string_equal(c->stores[0].name, "c");
    expect_yaml_ok("stores: []\n", c);
    assert_int_equal(c->nstores, 0);
    free(c);
}

/* Every prefix of a valid file either parses or fails with a positioned message. */
static void test_every_truncation_is_positioned(void **state)
{
    size_t n = strlen(design_sample);

    for (size_t len = 0; len <= n; len++) {
        struct cfg *c = new_cfg();
        struct cfg_error err;
        size_t line = 0, col = 0;
        char tail;

        memset(&err, 0, sizeof err);
        if (cfg_parse_yaml(c, design_sample, len, "t.yaml", &err) != FG_OK) {
            if (sscanf(err.msg, "t.yaml:%zu:%zu%c", &line, &col, &tail) != 3 || tail != ':' ||
                line < 1 || col < 1) {
                print_error("prefix %zu: unpositioned error \"%s\"\n", len, err.msg);
                fail();
            }
        }
        free(c);
    }
}

/* ---- precedence: defaults < file < environment < flags ------------------------------------ */

static void test_precedence(void **state)
{
    struct cfg *c = new_cfg();
    struct cfg_error err;
    enum cfg_action action;
    char *env[] = {"FENCEGATE_LISTEN_RESP=127.0.0.1:1222", "FENCEGATE_LISTEN_HTTP=127.0.0.1:2222",
                   NULL};
    char *argv[] = {"fencegate", "--resp", "127.0.0.1:1333", NULL};

    expect_yaml_ok("listen: { resp: 127.0.0.1:1111, http: 127.0.0.1:2111 }\n"
                   "limits: { max_clients: 11 }\n",
                   c);
    assert_int_equal(c->listen_resp.port, 1111);
    assert_int_equal(cfg_apply_env(c, env, &err), FG_OK);
    assert_int_equal(c->listen_resp.port, 1222);
    assert_int_equal(cfg_apply_args(c, 3, argv, &action, &err), FG_OK);
    finish_ok(c);
    assert_int_equal(c->listen_resp.port, 1333); /* set in all three: the flag wins */
    assert_int_equal(c->listen_http.port, 2222); /* file and environment: the environment wins */
    assert_int_equal(c->max_clients, 11);        /* file only: beats the default */
    assert_int_equal(c->max_pending_bytes, 1024 * 1024); /* nowhere: the default */
    free(c);
}

static void test_later_flag_wins(void **state)
{
    struct cfg *c = new_cfg();
    struct cfg_error err;
    enum cfg_action action;
    char *argv[] = {"fencegate", "--max-clients", "5", "--max-clients=6", NULL};

    assert_int_equal(cfg_apply_args(c, 4, argv, &action, &err), FG_OK);
    assert_int_equal(c->max_clients, 6);
    free(c);
}

/* ---- environment and flags, setting by setting -------------------------------------------- */

struct setting_case {
    const char *env, *flag, *value;
    void (*check)(const struct cfg *c);
};

static void chk_resp(const struct cfg *c)
{
    assert_addr(&c->listen_resp, "10.1.2.3", 7001);
}
static void chk_http(const struct cfg *c)
{
    assert_addr(&c->listen_http, "::", 7002);
}
static void chk_upstream(const struct cfg *c)
{
    assert_int_equal(c->upstream.kind, CFG_URL_REDIS);
    assert_addr(&c->upstream.hosts[0], "cache.svc", 6390);
    assert_int_equal(c->upstream.db, 2);
}
static void chk_backend(const struct cfg *c)
{
    assert_int_equal(c->backend.kind, CFG_URL_ETCD);
    assert_int_equal(c->backend.nhosts, 2);
    assert_addr(&c->backend.hosts[1], "e2", 2380);
}
static void chk_prefix(const struct cfg *c)
{
    assert_string_equal(c->backend_prefix, "/other/");
}
static void chk_ttl(const struct cfg *c)
{
    assert_int_equal(c->session_ttl_ms, 1500);
}
static void chk_clients(const struct cfg *c)
{
    assert_int_equal(c->max_clients, 77);
}
static void chk_request(const struct cfg *c)
{
    assert_int_equal(c->max_request_bytes, 4294967296LL);
}
static void chk_pending(const struct cfg *c)
{
    assert_int_equal(c->max_pending_bytes, 8192);
}
static void chk_args(const struct cfg *c)
{
    assert_int_equal(c->max_args, 2147483647LL);
}
static void chk_log(const struct cfg *c)
{
    assert_int_equal(c->log_level, CFG_LOG_WARN);
}
static void chk_mux(const struct cfg *c)
{
    assert_int_equal(c->upstream_multiplex, 0);
}
static void chk_txn(const struct cfg *c)
{
    assert_int_equal(c->fenced_transactions, 0);
}
static void chk_grace(const struct cfg *c)
{
    assert_int_equal(c->shutdown_grace_ms, 0);
}
static void chk_tls_ca(const struct cfg *c)
{
    assert_string_equal(c->backend_tls_ca, "/dev/null");
}
static void chk_tls_cert(const struct cfg *c)
{
    assert_string_equal(c->backend_tls_cert, "/dev/null");
}
static void chk_tls_key(const struct cfg *c)
{
    assert_string_equal(c->backend_tls_key, "/dev/null");
}
static void chk_tls_name(const struct cfg *c)
{
    assert_string_equal(c->backend_tls_server_name, "etcd.svc");
}
static void chk_pw_file(const struct cfg *c)
{
    assert_string_equal(c->backend_password_file, "/dev/null");
}
static void chk_app_url(const struct cfg *c)
{
    assert_int_equal(c->app_health_url.kind, CFG_URL_HTTP);
    assert_addr(&c->app_health_url.hosts[0], "127.0.0.1", 8080);
    assert_string_equal(c->app_health_url.path, "/healthz");
}
static void chk_app_interval(const struct cfg *c)
{
    assert_int_equal(c->app_health_interval_ms, 250);
}
static void chk_app_timeout(const struct cfg *c)
{
    assert_int_equal(c->app_health_timeout_ms, 600000);
}
static void chk_app_failures(const struct cfg *c)
{
    assert_int_equal(c->app_health_failures, 1);
}

static const struct setting_case settings[] = {
    {"FENCEGATE_LISTEN_RESP", "resp", "10.1.2.3:7001", chk_resp},
    {"FENCEGATE_LISTEN_HTTP", "http", "[::]:7002", chk_http},
    {"FENCEGATE_UPSTREAM", "upstream", "redis://cache.svc:6390/2", chk_upstream},
    {"FENCEGATE_BACKEND", "backend", "etcd://e1,e2:2380", chk_backend},
    {"FENCEGATE_BACKEND_PREFIX", "backend-prefix", "/other/", chk_prefix},
    {"FENCEGATE_SESSION_TTL_MS", "session-ttl-ms", "1500", chk_ttl},
    {"FENCEGATE_MAX_CLIENTS", "max-clients", "77", chk_clients},
    {"FENCEGATE_MAX_REQUEST_BYTES", "max-request-bytes", "4294967296", chk_request},
    {"FENCEGATE_MAX_PENDING_BYTES", "max-pending-bytes", "8192", chk_pending},
    {"FENCEGATE_MAX_ARGS", "max-args", "2147483647", chk_args},
    {"FENCEGATE_LOG_LEVEL", "log-level", "warn", chk_log},
    {"FENCEGATE_SHUTDOWN_GRACE_MS", "shutdown-grace-ms", "0", chk_grace},
    {"FENCEGATE_UPSTREAM_MULTIPLEX", "upstream-multiplex", "off", chk_mux},
    {"FENCEGATE_FENCED_TRANSACTIONS", "fenced-transactions", "false", chk_txn},
    {"FENCEGATE_BACKEND_TLS_CA_FILE", "backend-tls-ca-file", "/dev/null", chk_tls_ca},
    {"FENCEGATE_BACKEND_TLS_CERT_FILE", "backend-tls-cert-file", "/dev/null", chk_tls_cert},
    {"FENCEGATE_BACKEND_TLS_KEY_FILE", "backend-tls-key-file", "/dev/null", chk_tls_key},
    {"FENCEGATE_BACKEND_TLS_SERVER_NAME", "backend-tls-server-name", "etcd.svc", chk_tls_name},
    {"FENCEGATE_BACKEND_PASSWORD_FILE", "backend-password-file", "/dev/null", chk_pw_file},
    {"FENCEGATE_APP_HEALTH_URL", "app-health-url", "http://127.0.0.1:8080/healthz", chk_app_url},
    {"FENCEGATE_APP_HEALTH_INTERVAL_MS", "app-health-interval-ms", "250", chk_app_interval},
    {"FENCEGATE_APP_HEALTH_TIMEOUT_MS", "app-health-timeout-ms", "600000", chk_app_timeout},
    {"FENCEGATE_APP_HEALTH_FAILURE_THRESHOLD", "app-health-failure-threshold", "1",
     chk_app_failures},
};

#define NSETTINGS (sizeof settings / sizeof settings[0])

static void test_env_sets_each_setting(void **state)
{
    for (size_t i = 0; i < NSETTINGS; i++) {
        struct cfg *c = new_cfg();
        struct cfg_error err;
        char var[256];
        char *env[] = {var, NULL};

        snprintf(var, sizeof var, "%s=%s", settings[i].env, settings[i].value);
        assert_int_equal(cfg_apply_env(c, env, &err), FG_OK);
        settings[i].check(c);
        free(c);
    }
}

static void test_flags_set_each_setting(void **state)
{
    for (size_t i = 0; i < NSETTINGS; i++) {
        for (int form = 0; form < 2; form++) {
            struct cfg *c = new_cfg();
            struct cfg_error err;
            enum cfg_action action = CFG_HELP;
            char flag[64], joined[256];
            char *argv[] = {"fencegate", flag, (char *)settings[i].value, NULL};
            int argc = 3;

            snprintf(flag, sizeof flag, "--%s", settings[i].flag);
            if (form == 1) {
                snprintf(joined, sizeof joined, "--%s=%s", settings[i].flag, settings[i].value);
                argv[1] = joined;
                argv[2] = NULL;
                argc = 2;
            }
            memset(&err, 0, sizeof err);
            if (cfg_apply_args(c, argc, argv, &action, &err) != FG_OK)
                print_error("%s: %s\n", argv[1], err.msg);
            assert_int_equal(action, CFG_RUN);
            settings[i].check(c);
            free(c);
        }
    }
}

static void test_env_errors(void **state)
{
    struct cfg *c = new_cfg();
    struct cfg_error err;
    char *unknown[] = {"FENCEGATE_LISTEN=127.0.0.1:1", NULL};
    char *bad_addr[] = {"FENCEGATE_LISTEN_RESP=x", NULL};
    char *bad_num[] = {"FENCEGATE_MAX_CLIENTS=1e3", NULL};
    char *bad_url[] = {"FENCEGATE_UPSTREAM=etcd://h:2379", NULL};
    char *ignored[] = {"PATH=/bin",
                       "FENCEGATE_CONFIG=/nonexistent.yaml",
                       "FENCEGATE_LISTEN_RESP=",
                       "fencegate_listen_resp=bogus",
                       "FENCEGATE_NOEQUALS",
                       NULL};

    assert_int_equal(cfg_apply_env(c, unknown, &err), FG_ERR_CONFIG);
    /* More than 3 edits from every name: no guess, and the message is whole (it listed every
     * variable, cut off at 600 bytes in mid-name). */
    assert_string_equal(err.msg, "environment FENCEGATE_LISTEN: unknown variable ('fencegate "
                                 "--help' lists the ones it reads)");
    char *typo[] = {"FENCEGATE_LISTEN_RSP=127.0.0.1:1", NULL};
    assert_int_equal(cfg_apply_env(c, typo, &err), FG_ERR_CONFIG);
    assert_string_equal(err.msg, "environment FENCEGATE_LISTEN_RSP: unknown variable (did you mean "
                                 "FENCEGATE_LISTEN_RESP? 'fencegate --help' lists the ones it "
                                 "reads)");
    /* A name made from a setting's YAML key or its flag, as a user guesses it, is answered with
     * the variable that sets it (it got no guess: more than 3 edits from every variable). */
    {
        static const char *const guesses[][2] = {
            {"FENCEGATE_BACKEND_URL", "FENCEGATE_BACKEND"},
            {"FENCEGATE_RESP", "FENCEGATE_LISTEN_RESP"},
            {"FENCEGATE_BACKEND_SESSION_TTL_MS", "FENCEGATE_SESSION_TTL_MS"},
            {"FENCEGATE_LIMITS_MAX_CLIENTS", "FENCEGATE_MAX_CLIENTS"},
            {"FENCEGATE_LIMITS_MAX_ARG", "FENCEGATE_MAX_ARGS"},
        };

        for (size_t i = 0; i < sizeof guesses / sizeof guesses[0]; i++) {
            char var[80], want[200];
            char *env[] = {var, NULL};

            snprintf(var, sizeof var, "%s=1", guesses[i][0]);
            snprintf(want, sizeof want, "environment %s: unknown variable (did you mean %s? ",
                     guesses[i][0], guesses[i][1]);
            assert_int_equal(cfg_apply_env(c, env, &err), FG_ERR_CONFIG);
            assert_starts_with(err.msg, want);
        }
    }
    /* The variables fencectl and injected application containers read are left alone. */
    char *clients[] = {"FENCEGATE_HTTP=127.0.0.1:8380", "FENCEGATE_HTTP_ADDR=127.0.0.1:8380",
                       "FENCEGATE_RESP_ADDR=127.0.0.1:6380", NULL};
    assert_int_equal(cfg_apply_env(c, clients, &err), FG_OK);

    assert_int_equal(cfg_apply_env(c, bad_addr, &err), FG_ERR_CONFIG);
    assert_string_equal(err.msg, "environment FENCEGATE_LISTEN_RESP: bad address 'x': missing port "
                                 "(expected HOST:PORT)");

    assert_int_equal(cfg_apply_env(c, bad_num, &err), FG_ERR_CONFIG);
    assert_string_equal(err.msg, "environment FENCEGATE_MAX_CLIENTS: bad number '1e3': expected a "
                                 "decimal integer 1..1000000");

    assert_int_equal(cfg_apply_env(c, bad_url, &err), FG_ERR_CONFIG);
    assert_starts_with(err.msg, "environment FENCEGATE_UPSTREAM: bad URL 'etcd://h:2379': ");

    /* Other variables, FENCEGATE_CONFIG and empty values change nothing. */
    free(c);
    c = new_cfg();
    {
        struct cfg *want = new_cfg();

        assert_int_equal(cfg_apply_env(c, ignored, &err), FG_OK);
        assert_memory_equal(c, want, sizeof *c);
        free(want);
    }
    assert_int_equal(cfg_apply_env(c, NULL, &err), FG_OK);
    free(c);
}

/* Kubernetes gives every container variables for each Service of its namespace (service links,
 * on by default). The chart's webhook Service, "<release>-fencegate-injector" or
 * "fencegate-injector", yields FENCEGATE_INJECTOR_SERVICE_HOST and friends in every pod of the
 * release's namespace, the injected sidecar included: they must not stop it. Typos still do. */
static void test_env_ignores_kubernetes_service_links(void **state)
{
    char *links[] = {"FENCEGATE_INJECTOR_SERVICE_HOST=10.96.0.12",
                     "FENCEGATE_INJECTOR_SERVICE_PORT=443",
                     "FENCEGATE_INJECTOR_SERVICE_PORT_HTTPS=443",
                     "FENCEGATE_INJECTOR_PORT=tcp://10.96.0.12:443",
                     "FENCEGATE_INJECTOR_PORT_443_TCP=tcp://10.96.0.12:443",
                     "FENCEGATE_INJECTOR_PORT_443_TCP_PROTO=tcp",
                     "FENCEGATE_INJECTOR_PORT_443_TCP_PORT=443",
                     "FENCEGATE_INJECTOR_PORT_443_TCP_ADDR=10.96.0.12",
                     "FENCEGATE_SERVICE_HOST=10.96.0.13", /* a Service named "fencegate" */
                     "FENCEGATE_SERVICE_PORT=6380",
                     "FENCEGATE_PORT=tcp://10.96.0.13:6380",
                     "FENCEGATE_PORT_8380_UDP=udp://10.96.0.13:8380",
                     "FENCEGATE_PORT_6380_SCTP_ADDR=10.96.0.13",
                     NULL};
    static const char *const typos[] = {"FENCEGATE_RESP_PORT=6380", "FENCEGATE_PORT=6380",
                                        "FENCEGATE_LISTEN_PORT=tcp", "FENCEGATE_PORT_X_TCP=1",
                                        "FENCEGATE_PORT_443=tcp://10.0.0.1:443"};
    struct cfg *c = new_cfg(), *want = new_cfg();
    struct cfg_error err;

    memset(&err, 0, sizeof err);
    if (cfg_apply_env(c, links, &err) != FG_OK)
        print_error("%s\n", err.msg);
    assert_int_equal(cfg_apply_env(c, links, &err), FG_OK);
    assert_memory_equal(c, want, sizeof *c);
    for (size_t i = 0; i < sizeof typos / sizeof typos[0]; i++) {
        char *env[] = {(char *)typos[i], NULL};
        char name[64];

        snprintf(name, sizeof name, "environment %.*s: unknown variable",
                 (int)(strchr(typos[i], '=') - typos[i]), typos[i]);
        assert_int_equal(cfg_apply_env(c, env, &err), FG_ERR_CONFIG);
        assert_starts_with(err.msg, name);
    }
    free(want);
    free(c);
}

static void expect_args_msg(int argc, char **argv, const char *msg, int exact)
{
    struct cfg *c = new_cfg();
    struct cfg_error err;
    enum cfg_action action;

    memset(&err, 0, sizeof err);
    assert_int_equal(cfg_apply_args(c, argc, argv, &action, &err), FG_ERR_CONFIG);
    if (exact)
        assert_string_equal(err.msg, msg);
    else
        assert_starts_with(err.msg, msg);
    free(c);
}

static void test_flag_errors(void **state)
{
    char *a1[] = {"fencegate", "--foo", NULL};
    char *a2[] = {"fencegate", "--resp", NULL};
    char *a3[] = {"fencegate", "--resp", "x:0", NULL};
    char *a4[] = {"fencegate", "--resp", "--http", "1234", NULL};
    char *a5[] = {"fencegate", "serve", NULL};
    char *a6[] = {"fencegate", "-x", NULL};
    char *a7[] = {"fencegate", "--help=yes", NULL};
    char *a8[] = {"fencegate", "--config", NULL};
    char *a9[] = {"fencegate", "--foo=1", NULL};
    char *a10[] = {"fencegate", "--", "x", NULL};
    char *a11[] = {"fencegate", "--resp=", NULL};
    char *a12[] = {"fencegate", "--log-level", "loud", NULL};
    char *a13[] = {"fencegate", "--backend", "http://h", NULL};
    char *a14[] = {"fencegate", "--upstream-multiplex", "maybe", NULL};

    expect_args_msg(2, a1, "unknown flag '--foo' (see --help)", 1);
    expect_args_msg(2, a2, "flag --resp needs a value", 1);
    expect_args_msg(3, a3, "flag --resp: bad address 'x:0': port must be 1..65535", 1);
    expect_args_msg(4, a4, "flag --resp needs a value", 1);
    expect_args_msg(2, a5, "unexpected argument 'serve'", 0);
    expect_args_msg(2, a6, "unknown flag '-x' (see --help)", 1);
    expect_args_msg(2, a7, "flag --help takes no value", 1);
    expect_args_msg(2, a8, "flag --config needs a value", 1);
    expect_args_msg(2, a9, "unknown flag '--foo' (see --help)", 1);
    expect_args_msg(3, a10, "unexpected argument 'x'", 0);
    expect_args_msg(2, a11, "flag --resp: bad address '': empty", 0);
    expect_args_msg(3, a12, "flag --log-level: bad log level 'loud'", 0);
    expect_args_msg(3, a13, "flag --backend: bad URL 'http://h': the lock backend must be", 0);
    expect_args_msg(3, a14, "flag --upstream-multiplex: bad value 'maybe': expected true or false",
                    1);
}

static void test_help_and_version(void **state)
{
    static const struct {
        const char *arg;
        enum cfg_action want;
    } cases[] = {
        {"-h", CFG_HELP}, {"--help", CFG_HELP}, {"-V", CFG_VERSION}, {"--version", CFG_VERSION}};

    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct cfg *c = new_cfg();
        struct cfg_error err;
        enum cfg_action action = CFG_RUN;
        char *argv[] = {"fencegate", "--resp", "1234", (char *)cases[i].arg, "--bogus", NULL};

        /* Flags before it still apply; what follows it is not read. */
        assert_int_equal(cfg_apply_args(c, 5, argv, &action, &err), FG_OK);
        assert_int_equal(action, cases[i].want);
        assert_int_equal(c->listen_resp.port, 1234);
        free(c);
    }
    {
        struct cfg *c = new_cfg();
        struct cfg_error err;
        enum cfg_action action = CFG_HELP;
        char *argv[] = {"fencegate", "--config", "/etc/x.yaml", "--config=/y.yaml", NULL};

        assert_int_equal(cfg_apply_args(c, 4, argv, &action, &err), FG_OK);
        assert_int_equal(action, CFG_RUN);
        free(c);
    }
}

static void test_config_path(void **state)
{
    char *env[] = {"HOME=/", "FENCEGATE_CONFIG=/env.yaml", NULL};
    char *env_empty[] = {"FENCEGATE_CONFIG=", NULL};
    char *a0[] = {"fencegate", NULL};
    char *a1[] = {"fencegate", "--config", "/a.yaml", NULL};
    char *a2[] = {"fencegate", "--config=/b.yaml", "--resp", "1"};
    char *a3[] = {"fencegate", "--config", "/a.yaml", "--config=/c.yaml", NULL};
    /* "--config" here is the value of --backend-prefix, not a flag. */
    char *a4[] = {"fencegate", "--backend-prefix", "x", "--config", "/d.yaml", NULL};
    char *a5[] = {"fencegate", "--", "--config", "/e.yaml", NULL};
    char *a6[] = {"fencegate", "--config", NULL};

    assert_null(cfg_config_path(1, a0, NULL));
    assert_string_equal(cfg_config_path(1, a0, env), "/env.yaml");
    assert_null(cfg_config_path(1, a0, env_empty));
    assert_string_equal(cfg_config_path(3, a1, env), "/a.yaml");
    assert_string_equal(cfg_config_path(4, a2, NULL), "/b.yaml");
    assert_string_equal(cfg_config_path(4, a3, env), "/c.yaml");
    assert_string_equal(cfg_config_path(5, a4, NULL), "/d.yaml");
    assert_string_equal(cfg_config_path(4, a5, env), "/env.yaml");
    assert_null(cfg_config_path(2, a6, NULL));
}

/* ---- cfg_finish ------------------------------------------------------------------------------ */

static void test_finish_upstream_store(void **state)
{
    struct cfg *c = new_cfg();
    struct cfg_error err;

    /* An explicit upstream that is no store becomes a store named "redis". */
    expect_yaml_ok("upstream: redis://10.0.0.1:6379\n"
                   "stores: [{ name: pg, url: 'postgresql://db/app' }]\n",
                   c);
    finish_ok(c);
    assert_int_equal(c->nstores, 2);
    assert_string_equal(c->stores[1].name, "redis");
    assert_addr(&c->stores[1].url.hosts[0], "10.0.0.1", 6379);
    free(c);

    /* "redis" taken by another kind of store: "redis-upstream". */
    c = new_cfg();
    expect_yaml_ok("stores: [{ name: redis, url: 'http://h' }]\n", c);
    finish_ok(c);
    assert_int_equal(c->nstores, 2);
    assert_string_equal(c->stores[1].name, "redis-upstream");
    assert_string_equal(c->upstream.raw, "redis://127.0.0.1:6379");
    free(c);

    /* Both taken: an error that says what to do. */
    c = new_cfg();
    expect_yaml_ok("stores: [{ name: redis, url: 'http://h' }, { name: redis-upstream, url: "
                   "'http://i' }]\n",
                   c);
    assert_int_equal(cfg_finish(c, &err), FG_ERR_CONFIG);
    assert_contains(err.msg, "names 'redis' and 'redis-upstream' are taken");
    free(c);

    /* No explicit upstream: the first redis store, even when not the first store. */
    c = new_cfg();
    expect_yaml_ok("stores: [{ name: pg, url: 'postgres://db/x' }, { name: a, url: 'redis://h1' },"
                   " { name: b, url: 'redis://h2' }]\n",
                   c);
    finish_ok(c);
    assert_int_equal(c->nstores, 3);
    assert_addr(&c->upstream.hosts[0], "h1", 6379);
    free(c);

    /* The same endpoint written differently is the same store. */
    c = new_cfg();
    expect_yaml_ok("upstream: 'redis://H1:6379/0'\nstores: [{ name: a, url: 'redis://h1' }]\n", c);
    finish_ok(c);
    assert_int_equal(c->nstores, 1);
    free(c);

    /* A different database is a different store. */
    c = new_cfg();
    expect_yaml_ok("upstream: 'redis://h1/1'\nstores: [{ name: a, url: 'redis://h1' }]\n", c);
    finish_ok(c);
    assert_int_equal(c->nstores, 2);
    assert_int_equal(c->stores[1].url.db, 1);
    free(c);
}

static void test_finish_protect_rules(void **state)
{
    struct cfg *c = new_cfg();
    struct cfg_error err;

    expect_yaml_ok("stores: [{ name: cache, url: 'redis://h' }, { name: ledger, url: "
                   "'postgresql://p/db' }]\n"
                   "protect: [{ store: cache, keys: 'a:*', lock: 'a:$1' },"
                   " { store: nope, keys: 'b', lock: 'b' }]\n",
                   c);
    assert_int_equal(cfg_finish(c, &err), FG_ERR_CONFIG);
    assert_string_equal(
        err.msg,
        "t.yaml:2:65: protect[1].store: unknown store 'nope' (known stores: cache, ledger)");
    free(c);

    /* A rule may name the store the upstream becomes. */
    c = new_cfg();
    expect_yaml_ok("protect: [{ store: redis, keys: 'w:*', lock: 'w:$1' }]\n", c);
    finish_ok(c);
    assert_string_equal(c->stores[0].name, "redis");
    free(c);

    /* cfg_finish re-checks templates of rules set by other means. */
    c = new_cfg();
    c->nprotect = 1;
    snprintf(c->protect[0].store, sizeof c->protect[0].store, "redis");
    snprintf(c->protect[0].keys, sizeof c->protect[0].keys, "k");
    snprintf(c->protect[0].lock, sizeof c->protect[0].lock, "l:$1");
    assert_int_equal(cfg_finish(c, &err), FG_ERR_CONFIG);
    assert_starts_with(err.msg, "protect[0].lock: bad lock template 'l:$1'");
    free(c);
}

/* A rule on a Redis store guards the writes sent through the Redis endpoint, which all go to the
 * upstream: a rule on a Redis store that is not the upstream guards nothing. Such a config (an
 * --upstream or FENCEGATE_UPSTREAM over a file's stores, a second Redis store) is refused, naming
 * the rule and where the upstream came from; it used to start with the rule silently unused, and
 * the keys it named written without their lock. */
static void test_finish_protect_rules_guard_the_upstream_only(void **state)
{
    static const char rule_on_cache[] = "stores:\n"
                                        "  - { name: cache, url: 'redis://127.0.0.1:6379' }\n"
                                        "protect:\n"
                                        "  - { store: cache, keys: 'w:*', lock: 'w:$1' }\n";
    static const struct {
        const char *yaml, *env, *flag, *start, *also;
    } bad[] = {
        {rule_on_cache, NULL, "--upstream=redis://localhost:6379",
         "t.yaml:4:14: protect[0].store: 'cache' (redis://127.0.0.1:6379) is not the Redis "
         "endpoint's upstream redis://localhost:6379 (flag --upstream)",
         "would guard nothing"},
        {rule_on_cache, "FENCEGATE_UPSTREAM=redis://u:secret@10.0.0.9:6379", NULL,
         "t.yaml:4:14: protect[0].store: 'cache' (redis://127.0.0.1:6379) is not the Redis "
         "endpoint's upstream redis://u:***@10.0.0.9:6379 (environment FENCEGATE_UPSTREAM)",
         NULL},
        /* Another database of the same Redis is another store. */
        {rule_on_cache, NULL, "--upstream=redis://127.0.0.1:6379/1",
         "t.yaml:4:14: protect[0].store: 'cache'", "flag --upstream"},
        /* No upstream given: it is the first Redis store, and a rule on the second is unused. */
        {"stores:\n"
         "  - { name: a, url: 'redis://h1' }\n"
         "  - { name: b, url: 'redis://h2' }\n"
         "protect: [{ store: b, keys: k, lock: l }]\n",
         NULL, NULL,
         "t.yaml:4:20: protect[0].store: 'b' (redis://h2) is not the Redis endpoint's upstream "
         "redis://h1 (the first redis:// store, 'a')",
         NULL},
        {"upstream: 'redis://h1:6379'\n"
         "stores: [{ name: a, url: 'redis://h1:6380' }]\n"
         "protect: [{ store: a, keys: k, lock: l }]\n",
         NULL, NULL,
         "t.yaml:3:20: protect[0].store: 'a' (redis://h1:6380) is not the Redis endpoint's "
         "upstream redis://h1:6379 (upstream, t.yaml:1:11)",
         NULL},
    };
    /* The upstream's own store, however its URL is spelled (host case, default port and
     * database, another user), and rules on HTTP stores, are fine. */
    static const char *const fine[] = {
        "upstream: 'redis://H1:6379/0'\n"
        "stores: [{ name: a, url: 'redis://h1' }]\n"
        "protect: [{ store: a, keys: k, lock: l }]\n",
        "upstream: 'redis://alice:pw@h1'\n"
        "stores: [{ name: a, url: 'redis://bob:pw2@h1:6379' }]\n"
        "protect: [{ store: a, keys: k, lock: l }]\n",
        "stores: [{ name: web, url: 'http://h' }, { name: a, url: 'redis://h1' }]\n"
        "protect: [{ store: web, keys: 'r/*', lock: 'r:$1' }, { store: a, keys: k, lock: l }]\n",
    };

    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct cfg *c = new_cfg();
        struct cfg_error err;
        enum cfg_action action;
        char *env[] = {(char *)bad[i].env, NULL};
        char *argv[] = {"fencegate", (char *)bad[i].flag, NULL};

        expect_yaml_ok(bad[i].yaml, c);
        assert_int_equal(cfg_apply_env(c, env, &err), FG_OK);
        assert_int_equal(cfg_apply_args(c, bad[i].flag ? 2 : 1, argv, &action, &err), FG_OK);
        memset(&err, 0, sizeof err);
        assert_int_equal(cfg_finish(c, &err), FG_ERR_CONFIG);
        assert_starts_with(err.msg, bad[i].start);
        if (bad[i].also)
            assert_contains(err.msg, bad[i].also);
        free(c);
    }
    for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++) {
        struct cfg *c = new_cfg();

        expect_yaml_ok(fine[i], c);
        finish_ok(c);
        free(c);
    }
}

/* Two listeners on one port fail at bind unless their addresses differ and neither is a
 * wildcard; config says so before anything starts (exit 2, not 1 at bind). */
static void test_finish_listeners_overlap(void **state)
{
    const char *clash[] = {
        "listen: { resp: 7000, http: 7000 }\n",
        "listen: { resp: '0.0.0.0:7000', http: '127.0.0.1:7000' }\n",
        "listen: { resp: '127.0.0.2:7000', http: '[::]:7000' }\n",
        "listen: { resp: '[::0]:7000', http: '10.0.0.1:7000' }\n",
    };
    const char *fine[] = {
        "listen: { resp: '127.0.0.1:7000', http: '127.0.0.2:7000' }\n",
        "listen: { resp: '0.0.0.0:7000', http: '0.0.0.0:7001' }\n",
    };
    struct cfg_error err;

    for (size_t i = 0; i < sizeof clash / sizeof clash[0]; i++) {
        struct cfg *c = new_cfg();
        expect_yaml_ok(clash[i], c);
        assert_int_equal(cfg_finish(c, &err), FG_ERR_CONFIG);
        assert_contains(err.msg, "give them different ports");
        assert_contains(err.msg, "7000");
        free(c);
    }
    for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++) {
        struct cfg *c = new_cfg();
        expect_yaml_ok(fine[i], c);
        finish_ok(c);
        free(c);
    }
}

/* Checks that need every source applied still name where the offending value came from: the
 * file's line and column, the variable or the flag. */
static void test_finish_errors_name_their_source(void **state)
{
    struct cfg_error err;
    enum cfg_action action;
    struct cfg *c = new_cfg();

    expect_yaml_ok("stores:\n"
                   "  - { name: cache, url: 'redis://h' }\n"
                   "protect:\n"
                   "  - { store: cache, keys: 'a:*', lock: 'a:$1' }\n"
                   "  - store: cahce\n"
                   "    keys: b\n"
                   "    lock: b\n",
                   c);
    assert_int_equal(cfg_finish(c, &err), FG_ERR_CONFIG);
    assert_string_equal(err.msg, "t.yaml:5:12: protect[1].store: unknown store 'cahce' (known "
                                 "stores: cache)");
    free(c);

    /* PostgreSQL stores take the lock from each request: a rule for one is a mistake. */
    c = new_cfg();
    expect_yaml_ok("stores: [{ name: ledger, url: 'postgresql://p/db' }]\n"
                   "protect: [{ store: ledger, keys: 'accounts', lock: 'l' }]\n",
                   c);
    assert_int_equal(cfg_finish(c, &err), FG_ERR_CONFIG);
    assert_starts_with(err.msg, "t.yaml:2:20: protect[0].store: 'ledger' is a PostgreSQL store");
    free(c);

    c = new_cfg();
    expect_yaml_ok("backend:\n  url: etcd://e\n  prefix: locks/\n", c);
    assert_int_equal(cfg_finish(c, &err), FG_ERR_CONFIG);
    assert_starts_with(err.msg, "t.yaml:3:11: backend.prefix: bad prefix 'locks/': an etcd "
                                "backend needs a prefix that starts with '/'");
    free(c);

    c = new_cfg();
    expect_yaml_ok("backend: { url: 'etcd://fg@e' }\n", c);
    assert_int_equal(cfg_finish(c, &err), FG_ERR_CONFIG);
    assert_starts_with(err.msg, "t.yaml:1:17: backend.url: etcd user 'fg' has no password");
    free(c);

    c = new_cfg();
    expect_yaml_ok("backend:\n  tls_cert_file: /dev/null\n", c);
    assert_int_equal(cfg_finish(c, &err), FG_ERR_CONFIG);
    assert_starts_with(err.msg, "t.yaml:2:18: backend.tls_");
    free(c);

    c = new_cfg();
    expect_yaml_ok("listen:\n  resp: 7000\n  http: 127.0.0.1:7000\n", c);
    assert_int_equal(cfg_finish(c, &err), FG_ERR_CONFIG);
    assert_starts_with(err.msg, "t.yaml:3:9: listen.http: ");
    free(c);

    /* The file set the prefix, the environment the etcd URL: the prefix is what is wrong. */
    {
        char *env[] = {"FENCEGATE_BACKEND=etcd://e", NULL};
        char *argv[] = {"fencegate", "--backend-prefix", "x/", NULL};

        c = new_cfg();
        expect_yaml_ok("backend: { prefix: locks/ }\n", c);
        assert_int_equal(cfg_apply_env(c, env, &err), FG_OK);
        assert_int_equal(cfg_finish(c, &err), FG_ERR_CONFIG);
        assert_starts_with(err.msg, "t.yaml:1:20: backend.prefix: bad prefix 'locks/'");
        assert_int_equal(cfg_apply_args(c, 3, argv, &action, &err), FG_OK);
        assert_int_equal(cfg_finish(c, &err), FG_ERR_CONFIG);
        assert_starts_with(err.msg, "flag --backend-prefix: backend.prefix: bad prefix 'x/'");
        free(c);
    }
}

static void test_finish_backend_checks(void **state)
{
    struct cfg_error err;
    enum cfg_action action;
    char *etcd_bad[] = {"fencegate", "--backend", "etcd://e", "--backend-prefix", "locks/", NULL};
    char *redis_ok[] = {"fencegate", "--backend", "redis://r", "--backend-prefix", "locks:", NULL};
    char *same[] = {"fencegate", "--resp", "7000", "--http", "127.0.0.1:7000", NULL};
    struct cfg *c = new_cfg();

    assert_int_equal(cfg_apply_args(c, 5, etcd_bad, &action, &err), FG_OK);
    assert_int_equal(cfg_finish(c, &err), FG_ERR_CONFIG);
    assert_starts_with(err.msg, "flag --backend-prefix: backend.prefix: bad prefix 'locks/': an "
                                "etcd backend needs a prefix that starts with '/'");
    free(c);

    c = new_cfg();
    assert_int_equal(cfg_apply_args(c, 5, redis_ok, &action, &err), FG_OK);
    finish_ok(c);
    assert_string_equal(c->backend_prefix, "locks:");
    free(c);

    c = new_cfg();
    assert_int_equal(cfg_apply_args(c, 5, same, &action, &err), FG_OK);
    assert_int_equal(cfg_finish(c, &err), FG_ERR_CONFIG);
    assert_contains(err.msg, "'127.0.0.1:7000'");
    free(c);

    expect_yaml_err("backend: { prefix: '' }\n", "t.yaml:1:20: backend.prefix: empty prefix", NULL);

    /* An etcd user needs a password, in the URL or in a file; a file needs a user. */
    char *no_pw[] = {"fencegate", "--backend", "etcd://fg@e", NULL};
    char *pw_file[] = {"fencegate", "--backend", "etcd://fg@e", "--backend-password-file",
                       "/dev/null", NULL};
    char *no_user[] = {"fencegate", "--backend", "etcd://e", "--backend-password-file",
                       "/dev/null", NULL};
    c = new_cfg();
    assert_int_equal(cfg_apply_args(c, 3, no_pw, &action, &err), FG_OK);
    assert_int_equal(cfg_finish(c, &err), FG_ERR_CONFIG);
    assert_starts_with(err.msg, "flag --backend: backend.url: etcd user 'fg' has no password");
    free(c);
    c = new_cfg();
    assert_int_equal(cfg_apply_args(c, 5, pw_file, &action, &err), FG_OK);
    finish_ok(c);
    assert_string_equal(c->backend_password_file, "/dev/null");
    free(c);
    c = new_cfg();
    assert_int_equal(cfg_apply_args(c, 5, no_user, &action, &err), FG_OK);
    assert_int_equal(cfg_finish(c, &err), FG_ERR_CONFIG);
    assert_contains(err.msg, "an etcd password needs a user in the URL");
    free(c);

    /* TLS: only with etcds://, a client certificate with its key, files that can be read. */
    char *tls_ok[] = {"fencegate", "--backend", "etcds://e:2379", "--backend-tls-ca-file",
                      "/dev/null", NULL};
    char *tls_plain[] = {"fencegate", "--backend", "etcd://e", "--backend-tls-ca-file",
                         "/dev/null", NULL};
    char *tls_half[] = {"fencegate", "--backend", "etcds://e", "--backend-tls-cert-file",
                        "/dev/null", NULL};
    c = new_cfg();
    assert_int_equal(cfg_apply_args(c, 5, tls_ok, &action, &err), FG_OK);
    finish_ok(c);
    assert_int_equal(c->backend.kind, CFG_URL_ETCD);
    assert_int_equal(c->backend.tls, 1);
    free(c);
    c = new_cfg();
    assert_int_equal(cfg_apply_args(c, 5, tls_plain, &action, &err), FG_OK);
    assert_int_equal(cfg_finish(c, &err), FG_ERR_CONFIG);
    assert_starts_with(err.msg,
                       "flag --backend-tls-ca-file: backend.tls_ca_file: TLS settings need "
                       "an etcds:// backend URL, not 'etcd://e'");
    free(c);
    c = new_cfg();
    assert_int_equal(cfg_apply_args(c, 5, tls_half, &action, &err), FG_OK);
    assert_int_equal(cfg_finish(c, &err), FG_ERR_CONFIG);
    assert_contains(err.msg, "a client certificate needs both");
    free(c);
    expect_yaml_err("backend: { tls_ca_file: /nonexistent/ca.pem }\n",
                    "t.yaml:1:25: backend.tls_ca_file: cannot read file '/nonexistent/ca.pem': "
                    "No such file or directory",
                    NULL);
    /* A directory passes access(R_OK) but is no PEM or password file: refused where it is named,
     * not later by the TLS or password code without a position. */
    expect_yaml_err("backend: { tls_ca_file: /tmp }\n",
                    "t.yaml:1:25: backend.tls_ca_file: cannot read file '/tmp': it is a directory",
                    NULL);
    expect_yaml_err("backend:\n  password_file: /\n",
                    "t.yaml:2:18: backend.password_file: cannot read file '/': it is a directory",
                    NULL);
    {
        char *dir_env[] = {"FENCEGATE_BACKEND_TLS_KEY_FILE=/tmp", NULL};

        c = new_cfg();
        assert_int_equal(cfg_apply_env(c, dir_env, &err), FG_ERR_CONFIG);
        assert_string_equal(err.msg, "environment FENCEGATE_BACKEND_TLS_KEY_FILE: cannot read file "
                                     "'/tmp': it is a directory");
        free(c);
    }
    /* A name in SNI carries no trailing dot (RFC 6066), unlike a host to connect to. */
    expect_yaml_err("backend: { tls_server_name: 'etcd.example.' }\n",
                    "t.yaml:1:29: backend.tls_server_name: bad host name 'etcd.example.'", NULL);
    expect_yaml_err("backend: { tls_server_name: 'a b' }\n",
                    "t.yaml:1:29: backend.tls_server_name: bad host name 'a b'", NULL);

    /* No backend given: the locks live in the upstream Redis, not in some other default. */
    char *up_only[] = {"fencegate", "--upstream", "redis://10.1.2.3:7000/2", NULL};
    c = new_cfg();
    assert_int_equal(cfg_apply_args(c, 3, up_only, &action, &err), FG_OK);
    finish_ok(c);
    assert_int_equal(c->backend.kind, CFG_URL_REDIS);
    assert_addr(&c->backend.hosts[0], "10.1.2.3", 7000);
    assert_int_equal(c->backend.db, 2);
    free(c);
}

/* ---- addresses and URLs ------------------------------------------------------------------- */

static void test_parse_addr_table(void **state)
{
    static const struct {
        const char *in, *host;
        int port;
    } good[] = {
        {"127.0.0.1:6380", "127.0.0.1", 6380},
        {"0.0.0.0:1", "0.0.0.0", 1},
        {"255.255.255.255:65535", "255.255.255.255", 65535},
        {"localhost:80", "localhost", 80},
        {"my-host.example.com:8080", "my-host.example.com", 8080},
        {"redis-0.redis.ns.svc.cluster.local:6379", "redis-0.redis.ns.svc.cluster.local", 6379},
        /* A fully qualified name (Kubernetes users write one to skip the search domains). */
        {"redis.ns.svc.cluster.local.:6379", "redis.ns.svc.cluster.local.", 6379},
        {"localhost.:80", "localhost.", 80},
        {"[::1]:6380", "::1", 6380},
        {"[fe80::1:2]:7", "fe80::1:2", 7},
        {"[::ffff:1.2.3.4]:9", "::ffff:1.2.3.4", 9},
        {":7000", "127.0.0.1", 7000},
        {"7000", "127.0.0.1", 7000},
    };
    static const struct {
        const char *in, *why;
    } bad[] = {
        {"", "empty"},
        {"127.0.0.1:99999", "port must be 1..65535"},
        {"127.0.0.1:0", "port must be 1..65535"},
        {"127.0.0.1:-1", "port must be a number"},
        {"h:8x", "port must be a number"},
        {"h:", "missing port after ':'"},
        {":", "missing port after ':'"},
        {"0", "port must be 1..65535"},
        {"99999", "port must be 1..65535"},
        {"127.0.0.1", "missing port"},
        {"localhost", "missing port"},
        {"256.1.1.1:80", "bad IPv4 address"},
        {"1.2.3:80", "bad IPv4 address"},
        {"1.2.3.4.5:80", "bad IPv4 address"},
        {"01.2.3.4:80", "bad IPv4 address"},
        {"::1:80", "IPv6 addresses need brackets"},
        {"[::1", "missing ']'"},
        {"[::1]x", "unexpected text after ']'"},
        {"[::1]", "missing port"},
        {"[1::2::3]:80", "bad IPv6 address"},
        {"[127.0.0.1]:80", "bad IPv6 address"},
        {"[]:80", "empty host"},
        {"host_name:80", "bad host name"},
        {"-a:80", "bad host name"},
        {"a-:80", "bad host name"},
        {"a..b:80", "bad host name"},
        {".a:80", "bad host name"},
        {"a..:80", "bad host name"},
        {"a-.:80", "bad host name"},
        {"1.2.3.4.:80", "bad IPv4 address"},
        {"h st:80", "bad host name"},
    };
    struct cfg_error err;

    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        struct cfg_addr a;

        memset(&err, 0, sizeof err);
        if (cfg_parse_addr(good[i].in, &a, &err) != FG_OK)
            print_error("%s: %s\n", good[i].in, err.msg);
        assert_int_equal(cfg_parse_addr(good[i].in, &a, &err), FG_OK);
        assert_addr(&a, good[i].host, good[i].port);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct cfg_addr a = {"untouched", 42};
        char want[128];

        if (cfg_parse_addr(bad[i].in, &a, &err) == FG_OK) {
            print_error("%s: accepted\n", bad[i].in);
            fail();
        }
        snprintf(want, sizeof want, "bad address '%s': ", bad[i].in);
        assert_starts_with(err.msg, want);
        assert_contains(err.msg, bad[i].why);
        assert_addr(&a, "untouched", 42);
    }
    {
        /* Labels of 63 bytes pass; 64 do not; long input is refused with a bounded message. */
        char s[400];
        struct cfg_addr a;

        memset(s, 'a', 63);
        memcpy(s + 63, ".b:1", 5);
        assert_int_equal(cfg_parse_addr(s, &a, &err), FG_OK);
        memset(s, 'a', 64);
        memcpy(s + 64, ".b:1", 5);
        assert_int_equal(cfg_parse_addr(s, &a, &err), FG_ERR_CONFIG);
        assert_contains(err.msg, "at most 63 bytes");
        memset(s, 'a', sizeof s - 1);
        s[sizeof s - 1] = '\0';
        assert_int_equal(cfg_parse_addr(s, &a, &err), FG_ERR_CONFIG);
        assert_contains(err.msg, "...': longer than 300 bytes");
        assert_true(strlen(err.msg) < 200);
    }
}

static void test_parse_url_table(void **state)
{
    struct cfg_url *u = calloc(1, sizeof *u);
    struct cfg_error err;

    assert_non_null(u);
#define URL_OK(s)                                                                                  \
    do {                                                                                           \
        memset(&err, 0, sizeof err);                                                               \
        if (cfg_parse_url((s), u, &err) != FG_OK)                                                  \
            print_error("%s: %s\n", (s), err.msg);                                                 \
        assert_int_equal(cfg_parse_url((s), u, &err), FG_OK);                                      \
        assert_string_equal(u->raw, (s));                                                          \
    } while (0)

    URL_OK("redis://127.0.0.1:6379");
    assert_int_equal(u->kind, CFG_URL_REDIS);
    assert_int_equal(u->nhosts, 1);
    assert_addr(&u->hosts[0], "127.0.0.1", 6379);
    assert_int_equal(u->db, 0);
    assert_string_equal(u->user, "");
    assert_string_equal(u->password, "");

    URL_OK("redis://localhost");
    assert_addr(&u->hosts[0], "localhost", 6379);
    URL_OK("redis://redis.ns.svc.cluster.local.:6379/1");
    assert_addr(&u->hosts[0], "redis.ns.svc.cluster.local.", 6379);
    URL_OK("etcd://etcd-0.etcd.ns.svc.cluster.local.:2379,etcd-1.etcd.ns.svc.cluster.local.");
    assert_int_equal(u->nhosts, 2);
    assert_addr(&u->hosts[1], "etcd-1.etcd.ns.svc.cluster.local.", 2379);

    URL_OK("redis://app:p%40ss@cache.internal:7000/3");
    assert_string_equal(u->user, "app");
    assert_string_equal(u->password, "p@ss");
    assert_addr(&u->hosts[0], "cache.internal", 7000);
    assert_int_equal(u->db, 3);

    URL_OK("redis://:secret@h/");
    assert_string_equal(u->user, "");
    assert_string_equal(u->password, "secret");
    assert_int_equal(u->db, 0);

    URL_OK("redis://u:pa/ss@h");
    assert_string_equal(u->password, "pa/ss");
    assert_addr(&u->hosts[0], "h", 6379);

    URL_OK("redis://[::1]:6380/15");
    assert_addr(&u->hosts[0], "::1", 6380);
    assert_int_equal(u->db, 15);

    URL_OK("redis://h:1/2147483647"); /* upper case: test_url_scheme_in_any_case */
    assert_int_equal(u->kind, CFG_URL_REDIS);
    assert_int_equal(u->db, INT_MAX);

    URL_OK("etcd://127.0.0.1:2379");
    assert_int_equal(u->kind, CFG_URL_ETCD);
    assert_int_equal(u->nhosts, 1);
    assert_addr(&u->hosts[0], "127.0.0.1", 2379);

    URL_OK("etcd://a,b:2380,[::1]/");
    assert_int_equal(u->nhosts, 3);
    assert_addr(&u->hosts[0], "a", 2379);
    assert_addr(&u->hosts[1], "b", 2380);
    assert_addr(&u->hosts[2], "::1", 2379);

    URL_OK("etcd://fg@h1"); /* a user name; the password comes from backend.password_file */
    assert_string_equal(u->user, "fg");
    assert_string_equal(u->password, "");

    URL_OK("etcd://fg:p%40ss@w:rd@h1,h2:2380");
    assert_string_equal(u->user, "fg");
    assert_string_equal(u->password, "p@ss@w:rd");
    assert_int_equal(u->nhosts, 2);
    assert_addr(&u->hosts[1], "h2", 2380);

    URL_OK("postgresql://app@127.0.0.1:5432/app");
    assert_int_equal(u->kind, CFG_URL_POSTGRES);
    assert_addr(&u->hosts[0], "127.0.0.1", 5432);
    assert_string_equal(u->path, "app");

    URL_OK("postgres://u:pw@db.local/mydb?sslmode=disable");
    assert_int_equal(u->kind, CFG_URL_POSTGRES);
    assert_addr(&u->hosts[0], "db.local", 5432);
    assert_string_equal(u->path, "mydb");

    URL_OK("postgresql://h1:5433,h2/db");
    assert_int_equal(u->nhosts, 2);
    assert_addr(&u->hosts[0], "h1", 5433);
    assert_addr(&u->hosts[1], "h2", 5432);

    URL_OK("http://127.0.0.1:9000");
    assert_int_equal(u->kind, CFG_URL_HTTP);
    assert_addr(&u->hosts[0], "127.0.0.1", 9000);
    assert_string_equal(u->path, "");

    URL_OK("http://blobs/api/v1/");
    assert_addr(&u->hosts[0], "blobs", 80);
    assert_string_equal(u->path, "/api/v1/");
#undef URL_OK

    {
        static const struct {
            const char *in, *why;
        } bad[] = {
            {"", "empty"},
            {"127.0.0.1:6379", "missing scheme"},
            {"ftp://h", "unknown scheme (expected redis://, etcd://, etcds://, postgresql://, "
                        "postgres:// or "
                        "http://)"},
            {"https://h", "not supported yet (no TLS)"},
            {"rediss://h", "not supported yet (no TLS)"},
            {"redis://", "empty host"},
            {"redis://:6379", "empty host"},
            {"redis://u@", "empty host"},
            {"redis://h:0", "port must be 1..65535"},
            {"redis://h:65536", "port must be 1..65535"},
            {"redis://h:abc", "port must be a number"},
            {"redis://h:", "missing port"},
            {"redis://h/x", "database after '/' must be a number"},
            {"redis://h/2147483648", "database number out of range"},
            {"redis://h/-1", "database after '/' must be a number"},
            {"redis://h?db=1", "query strings"},
            {"redis://h/1#x", "query strings"},
            {"redis://u%4@h", "bad %-escape"},
            {"redis://u%zz@h", "bad %-escape"},
            {"redis://u%00@h", "%00"},
            {"redis://256.1.1.1", "bad IPv4 address"},
            {"redis://::1:6379", "IPv6 addresses need brackets"},
            {"redis://[::g]:1", "bad IPv6 address"},
            {"redis://h h", "spaces"},
            {"redis://h1:1,h2:2", "one HOST:PORT only (lists separated by ',' are for etcd:// and"},
            {"etcd://", "empty host"},
            {"etcd://a,,b", "empty host"},
            {"etcd://a,", "empty host"},
            {"etcd://:@h", "a user name is needed"},
            {"etcd://@h", "a user name is needed"},
            {"etcd://h/prefix", "no path"},
            {"etcd://h:99999", "port must be 1..65535"},
            {"postgresql:///db", "empty host"},
            {"postgres://u@/db", "empty host"},
            {"postgres://h:99999/db", "port must be 1..65535"},
            {"http://", "empty host"},
            {"http://u@h", "credentials"},
            {"http://h/p?q", "query strings"},
            {"http://h_x", "bad host name"},
            {"http://h:80x", "port must be a number"},
        };

        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            char want[128], masked[128];

            memset(&err, 0, sizeof err);
            if (cfg_parse_url(bad[i].in, u, &err) == FG_OK) {
                print_error("%s: accepted\n", bad[i].in);
                fail();
            }
            snprintf(want, sizeof want,
                     "bad URL '%s': ", cfg_url_masked(masked, sizeof masked, bad[i].in));
            assert_starts_with(err.msg, want);
            assert_contains(err.msg, bad[i].why);
            assert_int_equal(u->kind, 0);
        }
    }
    {
        /* Sixteen etcd hosts fit, seventeen do not. */
        char s[512];
        size_t o = (size_t)snprintf(s, sizeof s, "etcd://h0");

        for (int i = 1; i < CFG_MAX_HOSTS; i++)
            o += (size_t)snprintf(s + o, sizeof s - o, ",h%d", i);
        assert_int_equal(cfg_parse_url(s, u, &err), FG_OK);
        assert_int_equal(u->nhosts, CFG_MAX_HOSTS);
        snprintf(s + o, sizeof s - o, ",h99");
        assert_int_equal(cfg_parse_url(s, u, &err), FG_ERR_CONFIG);
        assert_contains(err.msg, "more than 16 hosts");
    }
    {
        /* A URL as long as the buffer allows, and one byte more. */
        char s[CFG_MAX_STR + 1];

        memcpy(s, "http://h/", 9);
        memset(s + 9, 'p', sizeof s - 10);
        s[CFG_MAX_STR - 1] = '\0';
        assert_int_equal(cfg_parse_url(s, u, &err), FG_OK);
        assert_int_equal(strlen(u->path), CFG_MAX_STR - 1 - 8);
        s[CFG_MAX_STR - 1] = 'p';
        s[CFG_MAX_STR] = '\0';
        assert_int_equal(cfg_parse_url(s, u, &err), FG_ERR_CONFIG);
        assert_contains(err.msg, "too long (at most 1023 bytes)");
    }
    /* User info without ':' is a password, as redis-cli -u and the lock client read it. */
    assert_int_equal(cfg_parse_url("redis://s%40cret@h:1", u, &err), FG_OK);
    assert_string_equal(u->user, "");
    assert_string_equal(u->password, "s@cret");
    assert_int_equal(cfg_parse_url("redis://bob:pw@h:1", u, &err), FG_OK);
    assert_string_equal(u->user, "bob");
    assert_string_equal(u->password, "pw");
    free(u);
}

/* Error messages end up in logs: a password in a URL is masked, everything else is kept. */
/* A scheme is read in any case (RFC 3986), and the URL is kept with it in lower case: the lock
 * client and libpq, which get the URL as written, know the lower-case spellings only. An
 * ETCD://... backend passed every check and then stopped start-up with the lock client's
 * "unknown scheme", without the file, variable or flag; a POSTGRESQL://... store started, and
 * libpq took the whole URL for a database name on the local socket. */
static void test_url_scheme_in_any_case(void **state)
{
    static const struct {
        const char *in, *raw;
        enum cfg_url_kind kind;
    } cases[] = {
        {"REDIS://u:Pw@H:7000/2", "redis://u:Pw@H:7000/2", CFG_URL_REDIS},
        {"Etcd://e1,e2:2380", "etcd://e1,e2:2380", CFG_URL_ETCD},
        {"ETCDS://e", "etcds://e", CFG_URL_ETCD},
        {"POSTGRESQL://App@DB/Ledger?sslmode=disable", "postgresql://App@DB/Ledger?sslmode=disable",
         CFG_URL_POSTGRES},
        {"Postgres://db/x", "postgres://db/x", CFG_URL_POSTGRES},
        {"HTTP://Web:9000/API", "http://Web:9000/API", CFG_URL_HTTP},
    };
    struct cfg_url *u = calloc(1, sizeof *u);
    struct cfg *c = new_cfg();
    struct cfg_error err;
    enum cfg_action action;
    char *argv[] = {"fencegate", "--backend", "ETCD://127.0.0.1:2379", NULL};

    assert_non_null(u);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(&err, 0, sizeof err);
        if (cfg_parse_url(cases[i].in, u, &err) != FG_OK)
            fail_msg("%s: %s", cases[i].in, err.msg);
        assert_string_equal(u->raw, cases[i].raw);
        assert_int_equal(u->kind, cases[i].kind);
    }
    assert_int_equal(cfg_apply_args(c, 3, argv, &action, &err), FG_OK);
    finish_ok(c);
    assert_string_equal(c->backend.raw, "etcd://127.0.0.1:2379");
    free(c);
    free(u);
}

/* Where a setting came from, for errors main.c finds (a listen address in use, a password file
 * read at start): the file's line and column, the variable, the flag, or nothing. */
static void test_where(void **state)
{
    struct cfg *c = new_cfg();
    struct cfg_error err;
    enum cfg_action action;
    char *env[] = {"FENCEGATE_LISTEN_HTTP=127.0.0.1:9", NULL};
    char *argv[] = {"fencegate", "--backend-password-file=/dev/null", NULL};
    char w[64];

    expect_yaml_ok("listen:\n  resp: 127.0.0.1:7\n  http: 127.0.0.1:8\n", c);
    assert_int_equal(cfg_apply_env(c, env, &err), FG_OK);
    assert_int_equal(cfg_apply_args(c, 2, argv, &action, &err), FG_OK);
    assert_string_equal(cfg_where(c, "listen.resp", w, sizeof w), "t.yaml:2:9: ");
    assert_string_equal(cfg_where(c, "listen.http", w, sizeof w),
                        "environment FENCEGATE_LISTEN_HTTP: ");
    assert_string_equal(cfg_where(c, "backend.password_file", w, sizeof w),
                        "flag --backend-password-file: ");
    assert_string_equal(cfg_where(c, "log.level", w, sizeof w), "");
    assert_string_equal(cfg_where(c, "listen.resp", w, 8), "t.yaml:");
    free(c);
}

/* A store URL refused by a check outside this module (libpq's parser, in main.c) is reported
 * at its place in the file; what libpq quotes is left out when the URL holds a password. */
static void test_store_url_error(void **state)
{
    struct cfg *c = new_cfg();
    struct cfg_error err;

    expect_yaml_ok("stores:\n"
                   "  - { name: a, url: 'redis://h' }\n"
                   "  - name: pg\n"
                   "    url: 'postgresql://app:s3cret@db/x?sslmod=require'\n",
                   c);
    finish_ok(c);
    cfg_store_url_error(c, 1, "invalid URI query parameter: \"sslmod\"\n", &err);
    assert_string_equal(err.msg, "t.yaml:4:10: stores[1].url: bad URL "
                                 "'postgresql://app:***@db/x?sslmod=require': invalid URI query "
                                 "parameter");
    snprintf(c->stores[1].url.raw, sizeof c->stores[1].url.raw, "postgresql://db/x?sslmod=r");
    cfg_store_url_error(c, 1, "invalid URI query parameter: \"sslmod\"\n", &err);
    assert_string_equal(err.msg, "t.yaml:4:10: stores[1].url: bad URL 'postgresql://db/x?sslmod=r'"
                                 ": invalid URI query parameter: \"sslmod\"");
    free(c);
}

static void test_password_not_in_errors(void **state)
{
    struct cfg_url *u = calloc(1, sizeof *u);
    struct cfg_error err;

    assert_non_null(u);
    assert_int_equal(cfg_parse_url("redis://app:hunter2@h:99999", u, &err), FG_ERR_CONFIG);
    assert_string_equal(err.msg, "bad URL 'redis://app:***@h:99999': port must be 1..65535");
    assert_int_equal(cfg_parse_url("postgresql://app:hunter2@h:0/db", u, &err), FG_ERR_CONFIG);
    assert_null(strstr(err.msg, "hunter2"));
    assert_contains(err.msg, "'postgresql://app:***@h:0/db'");
    expect_yaml_err("upstream: 'redis://:hunter2@h:0'\n", "'redis://:***@h:0'", NULL);
    assert_int_equal(cfg_parse_url("postgresql://h:0/db?password=hunter2", u, &err), FG_ERR_CONFIG);
    assert_contains(err.msg, "'postgresql://h:0/db?password=***'");
    assert_int_equal(cfg_parse_url("redis://hunter2@h:0", u, &err), FG_ERR_CONFIG);
    assert_contains(err.msg, "'redis://***@h:0'");
    free(u);
}

/* Logs and HTTP answers name stores by URL: every password libpq or Redis would read is masked. */
static void test_url_masked(void **state)
{
    static const char *const cases[][2] = {
        {"postgresql://fencegate:s3cretpw@127.0.0.1:31432/postgres?password=otherpw",
         "postgresql://fencegate:***@127.0.0.1:31432/postgres?password=***"},
        {"postgres://h/db?sslmode=disable&PassWord=x&application_name=a",
         "postgres://h/db?sslmode=disable&PassWord=***&application_name=a"},
        {"postgresql://h/db?pass%77ord=x&sslpassword=y",
         "postgresql://h/db?pass%77ord=***&sslpassword=***"},
        {"postgresql://app@h/db?options=a@b", "postgresql://app@h/db?options=a@b"},
        {"postgresql://app:@h/db", "postgresql://app:@h/db"},
        {"redis://:redispw@127.0.0.1:6379", "redis://:***@127.0.0.1:6379"},
        {"redis://redispw@127.0.0.1:6379/2", "redis://***@127.0.0.1:6379/2"},
        {"redis://u:p/w?x@h:1", "redis://u:***@h:1"},
        {"etcd://root@h:2379", "etcd://root@h:2379"},
        {"http://127.0.0.1:9000/prefix", "http://127.0.0.1:9000/prefix"},
    };
    char out[256], small[20];

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_string_equal(cfg_url_masked(out, sizeof out, cases[i][0]), cases[i][1]);
    assert_string_equal(cfg_url_masked(small, sizeof small, cases[0][0]), "postgresql://fenceg");
}

/* Values at and past their declared maxima are refused with a bounded, escaped message. */
static void test_long_and_odd_values(void **state)
{
    struct cfg *c = new_cfg();
    struct cfg_url *u = calloc(1, sizeof *u);
    struct cfg_addr a;
    struct cfg_error err;
    enum cfg_action action;
    char big[1400], var[1500];
    char *env[] = {var, NULL};
    char *argv[] = {"fencegate", "--backend-prefix",
                    "/a\x01"
                    "b/",
                    NULL};

    assert_non_null(u);
    /* A prefix may be 200 bytes, what both lock backends take (they refused more at start). */
    memset(big, 'p', 200);
    big[200] = '\0';
    snprintf(var, sizeof var, "FENCEGATE_BACKEND_PREFIX=%s", big);
    assert_int_equal(cfg_apply_env(c, env, &err), FG_OK);
    assert_int_equal(strlen(c->backend_prefix), 200);
    big[200] = 'p';
    big[201] = '\0';
    snprintf(var, sizeof var, "FENCEGATE_BACKEND_PREFIX=%s", big);
    assert_int_equal(cfg_apply_env(c, env, &err), FG_ERR_CONFIG);
    assert_contains(err.msg, "environment FENCEGATE_BACKEND_PREFIX: prefix 'ppp");
    assert_contains(err.msg, "...' is too long (at most 200 bytes)");
    assert_int_equal(cfg_apply_args(c, 3, argv, &action, &err), FG_ERR_CONFIG);
    assert_string_equal(err.msg,
                        "flag --backend-prefix: prefix '/a\\x01b/' contains a control character");

    /* A YAML scalar longer than any field: the message quotes only its start. */
    memset(big, 'x', 1100);
    big[1100] = '\0';
    snprintf(var, sizeof var, "upstream: redis://%s\n", big);
    expect_yaml_err(var, "t.yaml:1:11: upstream: value 'redis://xxx",
                    "...' is too long (at most 1023 bytes)");
    {
        struct cfg_error e2;

        assert_int_equal(parse(c, var, &e2), FG_ERR_CONFIG);
        assert_true(strlen(e2.msg) < 300);
    }

    /* User info: %-escapes in either case; a password past 255 bytes. */
    assert_int_equal(cfg_parse_url("redis://%41%4a:%6A%7e@h", u, &err), FG_OK);
    assert_string_equal(u->user, "AJ");
    assert_string_equal(u->password, "j~");
    memset(big, 'w', 300);
    big[300] = '\0';
    snprintf(var, sizeof var, "redis://u:%s@h", big);
    assert_int_equal(cfg_parse_url(var, u, &err), FG_ERR_CONFIG);
    assert_contains(err.msg, "password too long");
    assert_null(strstr(err.msg, "www"));

    /* Host names: 253 bytes pass, 254 do not. */
    memset(big, 0, sizeof big);
    for (int i = 0; i < 4; i++) {
        memset(big + i * 64, 'h', 63);
        big[i * 64 + 63] = '.';
    }
    big[253] = '\0'; /* four labels of 63, the last one cut to 61 */
    snprintf(var, sizeof var, "%s:1", big);
    assert_int_equal(cfg_parse_addr(var, &a, &err), FG_OK);
    assert_int_equal(strlen(a.host), 253);
    big[253] = 'h';
    big[254] = '\0';
    snprintf(var, sizeof var, "%s:1", big);
    assert_int_equal(cfg_parse_addr(var, &a, &err), FG_ERR_CONFIG);
    assert_contains(err.msg, "host name longer than 253 bytes");

    /* Quotes and control bytes in a value are escaped in messages. */
    assert_int_equal(cfg_parse_addr("a'b\n:1", &a, &err), FG_ERR_CONFIG);
    assert_starts_with(err.msg, "bad address 'a\\'b\\x0a:1': bad host name");
    assert_int_equal(
        cfg_parse_addr("[0123:4567:89ab:cdef:0123:4567:89ab:cdef:0123:4567:89ab]:1", &a, &err),
        FG_ERR_CONFIG);
    assert_contains(err.msg, "bad IPv6 address");
    free(u);
    free(c);
}

/* ---- usage and example files -------------------------------------------------------------- */

static void test_usage_lists_every_flag(void **state)
{
    const char *u = cfg_usage();

    assert_starts_with(u, "usage: fencegate [--config FILE] [--resp HOST:PORT] [--http HOST:PORT]");
    assert_contains(u, "fencegate --version");
    assert_contains(u, "config/examples/");
    for (size_t i = 0; i < NSETTINGS; i++) {
        char flag[64];
        const char *at, *eol;

        /* One line per flag, naming its environment variable. */
        snprintf(flag, sizeof flag, "  --%s ", settings[i].flag);
        at = strstr(u, flag);
        if (!at) {
            print_error("flag %s missing from usage\n", flag);
            fail();
        }
        eol = strchr(at, '\n');
        assert_non_null(eol);
        at = strstr(at, settings[i].env);
        assert_non_null(at);
        assert_true(at < eol);
    }
    assert_contains(u, "--config FILE             FENCEGATE_CONFIG");
    assert_contains(u, "-h, --help");
    assert_contains(u, "-V, --version");
    assert_contains(u, "(default 127.0.0.1:6380)");
    assert_contains(u, "(default 127.0.0.1:8380)");
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;

    assert_non_null(f);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    n = ftell(f);
    assert_true(n >= 0);
    rewind(f);
    buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static void test_example_files_parse(void **state)
{
    static const char *const keys[] = {"listen:",
                                       "resp:",
                                       "http:",
                                       "upstream:",
                                       "backend:",
                                       "url:",
                                       "prefix:",
                                       "session_ttl_ms:",
                                       "upstream_multiplex:",
                                       "fenced_transactions:",
                                       "stores:",
                                       "name:",
                                       "protect:",
                                       "store:",
                                       "keys:",
                                       "lock:",
                                       "limits:",
                                       "max_clients:",
                                       "max_args:",
                                       "log:",
                                       "max_request_bytes:",
                                       "max_pending_bytes:",
                                       "level:",
                                       "shutdown_grace_ms:",
                                       "app_health:",
                                       "interval_ms:",
                                       "failure_threshold:"};
    const char *file = __FILE__, *slash = strrchr(file, '/');
    char dir[PATH_MAX], path[PATH_MAX + 256];
    DIR *d;
    struct dirent *de;
    int seen = 0, seen_redis = 0, seen_etcd = 0;

    assert_non_null(slash);
    snprintf(dir, sizeof dir, "%.*s/../../config/examples", (int)(slash - file), file);
    d = opendir(dir);
    assert_non_null(d);
    while ((de = readdir(d)) != NULL) {
        size_t n = strlen(de->d_name), len;
        struct cfg *c;
        struct cfg_error err;
        char *text;
        int rc;

        if (n < 6 || strcmp(de->d_name + n - 5, ".yaml") != 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        text = read_file(path, &len);
        c = new_cfg();
        memset(&err, 0, sizeof err);
        rc = cfg_parse_yaml(c, text, len, de->d_name, &err);
        if (rc == FG_OK)
            rc = cfg_finish(c, &err);
        if (rc != FG_OK)
            print_error("%s\n", err.msg);
        assert_int_equal(rc, FG_OK);
        seen++;
        if (strcmp(de->d_name, "redis.yaml") == 0 || strcmp(de->d_name, "etcd.yaml") == 0) {
            /* The full examples show every key. */
            for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
                if (!strstr(text, keys[k])) {
                    print_error("%s does not show %s\n", de->d_name, keys[k]);
                    fail();
                }
            }
            if (de->d_name[0] == 'r') {
                assert_int_equal(c->backend.kind, CFG_URL_REDIS);
                seen_redis = 1;
            } else {
                assert_int_equal(c->backend.kind, CFG_URL_ETCD);
                seen_etcd = 1;
            }
            assert_true(c->nprotect > 0);
        }
        free(text);
        free(c);
    }
    closedir(d);
    assert_true(seen >= 3);
    assert_true(seen_redis && seen_etcd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_without_any_config),
        cmocka_unit_test(test_design_sample),
        cmocka_unit_test(test_block_and_flow_shapes),
        cmocka_unit_test(test_empty_documents_keep_defaults),
        cmocka_unit_test(test_yaml_syntax_errors),
        cmocka_unit_test(test_unknown_keys),
        cmocka_unit_test(test_app_health_url),
        cmocka_unit_test(test_wrong_types),
        cmocka_unit_test(test_duplicate_keys),
        cmocka_unit_test(test_anchors_aliases_tags_documents),
        cmocka_unit_test(test_bad_address_in_yaml),
        cmocka_unit_test(test_bad_url_in_yaml),
        cmocka_unit_test(test_numbers_and_ranges),
        cmocka_unit_test(test_lock_templates),
        cmocka_unit_test(test_store_is_backend),
        cmocka_unit_test(test_store_entries),
        cmocka_unit_test(test_lists_replace),
        cmocka_unit_test(test_every_truncation_is_positioned),
        cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_later_flag_wins),
        cmocka_unit_test(test_env_sets_each_setting),
        cmocka_unit_test(test_flags_set_each_setting),
        cmocka_unit_test(test_env_errors),
        cmocka_unit_test(test_env_ignores_kubernetes_service_links),
        cmocka_unit_test(test_flag_errors),
        cmocka_unit_test(test_help_and_version),
        cmocka_unit_test(test_config_path),
        cmocka_unit_test(test_finish_upstream_store),
        cmocka_unit_test(test_finish_protect_rules),
        cmocka_unit_test(test_finish_protect_rules_guard_the_upstream_only),
        cmocka_unit_test(test_finish_backend_checks),
        cmocka_unit_test(test_finish_errors_name_their_source),
        cmocka_unit_test(test_finish_listeners_overlap),
        cmocka_unit_test(test_parse_addr_table),
        cmocka_unit_test(test_parse_url_table),
        cmocka_unit_test(test_url_scheme_in_any_case),
        cmocka_unit_test(test_where),
        cmocka_unit_test(test_store_url_error),
        cmocka_unit_test(test_password_not_in_errors),
        cmocka_unit_test(test_url_masked),
        cmocka_unit_test(test_long_and_odd_values),
        cmocka_unit_test(test_usage_lists_every_flag),
        cmocka_unit_test(test_example_files_parse),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
