/* test_cmdtable.c — unit tests of the COMMAND-reply parser, lookups and key positions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cmdtable.h"

#define FIXTURE_MAX (4 * 1024 * 1024)

struct fixture {
    char *data;
    size_t len;
};

static struct fixture load_fixture(const char *name)
{
    char path[1024];
    int n = snprintf(path, sizeof(path), "%s/%s", FG_FIXTURES, name);
    assert_true(n > 0 && (size_t)n < sizeof(path));
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    struct fixture fx = {malloc(FIXTURE_MAX), 0};
    assert_non_null(fx.data);
    fx.len = fread(fx.data, 1, FIXTURE_MAX, f);
    assert_true(feof(f));
    fclose(f);
    assert_true(fx.len > 0);
    return fx;
}

static struct cmd_table *parse_ok(const struct fixture *fx)
{
    int err = 12345;
    struct cmd_table *t = cmd_table_parse(fx->data, fx->len, &err);
    assert_non_null(t);
    assert_int_equal(err, FG_OK);
    return t;
}

static const struct cmd_info *lookup(const struct cmd_table *t, const char *name, const char *sub)
{
    return cmd_lookup(t, name, strlen(name), sub, sub ? strlen(sub) : 0);
}

static void assert_keys(const struct cmd_info *ci, size_t argc, const size_t *want, size_t nwant)
{
    size_t idx[32];
    memset(idx, 0xff, sizeof(idx));
    size_t n = cmd_keys(ci, argc, idx, 32);
    assert_int_equal(n, nwant);
    for (size_t i = 0; i < nwant; i++)
        assert_int_equal(idx[i], want[i]);
    for (size_t i = nwant; i < 32; i++)
        assert_int_equal(idx[i], (size_t)-1); /* nothing written past the keys */
}

static void test_redis7_fixture(void **state)
{
    (void)state;
    struct fixture fx = load_fixture("command-redis7.resp");
    struct cmd_table *t = parse_ok(&fx);
    assert_true(cmd_table_count(t) > 200);

    const struct cmd_info *set = lookup(t, "set", NULL);
    assert_non_null(set);
    assert_string_equal(set->name, "set");
    assert_int_equal(set->arity, -3);
    assert_true(set->flags & CMD_WRITE);
    assert_true(set->flags & CMD_DENYOOM);
    assert_false(set->flags & CMD_READONLY);
    assert_false(set->flags & CMD_MOVABLEKEYS);
    assert_int_equal(set->first_key, 1);
    assert_int_equal(set->last_key, 1);
    assert_int_equal(set->step, 1);
    assert_keys(set, 3, (size_t[]){1}, 1);
    assert_keys(set, 5, (size_t[]){1}, 1); /* SET k v EX 10: options are not keys */

    const struct cmd_info *get = lookup(t, "GET", NULL);
    assert_non_null(get);
    assert_ptr_equal(get, lookup(t, "gEt", NULL));
    assert_true(get->flags & CMD_READONLY);
    assert_true(get->flags & CMD_FAST);
    assert_false(get->flags & CMD_WRITE);
    assert_int_equal(get->arity, 2);

    const struct cmd_info *mset = lookup(t, "MSET", NULL);
    assert_non_null(mset);
    assert_int_equal(mset->first_key, 1);
    assert_int_equal(mset->last_key, -1);
    assert_int_equal(mset->step, 2);
    assert_keys(mset, 5, (size_t[]){1, 3}, 2);
    assert_keys(mset, 7, (size_t[]){1, 3, 5}, 3);

    const struct cmd_info *del = lookup(t, "del", NULL);
    assert_non_null(del);
    assert_int_equal(del->first_key, 1);
    assert_int_equal(del->last_key, -1);
    assert_int_equal(del->step, 1);
    assert_true(del->flags & CMD_WRITE);
    assert_keys(del, 4, (size_t[]){1, 2, 3}, 3);

    const struct cmd_info *eval = lookup(t, "EVAL", NULL);
    assert_non_null(eval);
    assert_true(eval->flags & CMD_MOVABLEKEYS);
    assert_true(eval->flags & CMD_NOSCRIPT);

    const struct cmd_info *blpop = lookup(t, "blpop", NULL);
    assert_non_null(blpop);
    assert_true(blpop->flags & CMD_BLOCKING);
    assert_keys(blpop, 5, (size_t[]){1, 2, 3}, 3); /* BLPOP a b c 0: the timeout is not a key */

    const struct cmd_info *sub = lookup(t, "subscribe", NULL);
    assert_non_null(sub);
    assert_true(sub->flags & CMD_PUBSUB);

    const struct cmd_info *kill = lookup(t, "CLIENT", "KILL");
    assert_non_null(kill);
    assert_string_equal(kill->name, "client|kill");
    assert_true(kill->flags & CMD_ADMIN);
    assert_true(kill->flags & CMD_LOADING);
    assert_true(kill->flags & CMD_STALE);
    assert_ptr_equal(kill, lookup(t, "Client|Kill", NULL));

    assert_true(cmd_table_has_subcommands(t));

    /* An unknown subcommand falls back to the container; so does a missing one. */
    const struct cmd_info *client = lookup(t, "client", NULL);
    assert_non_null(client);
    assert_string_equal(client->name, "client");
    assert_ptr_equal(lookup(t, "client", "nosuchsub"), client);
    assert_ptr_equal(cmd_lookup(t, "client", 6, "kill", 0), client);

    const struct cmd_info *xc = lookup(t, "xgroup", "create");
    assert_non_null(xc);
    assert_string_equal(xc->name, "xgroup|create");
    assert_true(xc->flags & CMD_WRITE);
    assert_int_equal(xc->first_key, 2);
    assert_keys(xc, 5, (size_t[]){2}, 1); /* XGROUP CREATE key group id */

    /* A plain command given a "subcommand" (its first argument) is still found. */
    assert_ptr_equal(lookup(t, "set", "mykey"), set);

    assert_null(lookup(t, "nosuchcommand", NULL));
    assert_null(lookup(t, "nosuchcommand", "kill"));
    assert_null(lookup(t, "se", NULL));
    assert_null(lookup(t, "sett", NULL));
    assert_null(cmd_lookup(t, "set", 0, NULL, 0));
    assert_null(cmd_lookup(t, NULL, 3, NULL, 0));
    assert_null(cmd_lookup(NULL, "set", 3, NULL, 0));

    /* Names need not be NUL-terminated: only name_len bytes count. */
    const char buf[] = {'S', 'E', 'T', 'E', 'X', 'K', 'I', 'L', 'L', 'Z'};
    assert_ptr_equal(cmd_lookup(t, buf, 3, NULL, 0), set);
    assert_ptr_equal(cmd_lookup(t, buf, 5, NULL, 0), lookup(t, "setex", NULL));
    const char cbuf[] = {'c', 'l', 'i', 'e', 'n', 't', 'x'};
    assert_ptr_equal(cmd_lookup(t, cbuf, 6, buf + 5, 4), kill);

    /* Every stored name is lower case and every container's subcommands are reachable. */
    assert_non_null(lookup(t, "config", "set"));
    assert_string_equal(lookup(t, "CONFIG", "SET")->name, "config|set");

    cmd_table_free(t);
    free(fx.data);
}

static void test_redis6_fixture(void **state)
{
    (void)state;
    struct fixture fx = load_fixture("command-redis6.resp");
    struct cmd_table *t = parse_ok(&fx);
    assert_int_equal(cmd_table_count(t), 9);

    const struct cmd_info *set = lookup(t, "SET", NULL);
    assert_non_null(set);
    assert_int_equal(set->flags, CMD_WRITE | CMD_DENYOOM);
    assert_keys(set, 3, (size_t[]){1}, 1);

    const struct cmd_info *get = lookup(t, "get", NULL);
    assert_non_null(get);
    assert_int_equal(get->flags, CMD_READONLY | CMD_FAST);

    assert_keys(lookup(t, "mset", NULL), 5, (size_t[]){1, 3}, 2);
    assert_keys(lookup(t, "del", NULL), 2, (size_t[]){1}, 1);
    assert_true(lookup(t, "eval", NULL)->flags & CMD_MOVABLEKEYS);
    assert_true(lookup(t, "subscribe", NULL)->flags & CMD_PUBSUB);
    /* "random" is not a flag we map: ignored, the others kept. */
    assert_int_equal(lookup(t, "client", NULL)->flags,
                     CMD_ADMIN | CMD_NOSCRIPT | CMD_LOADING | CMD_STALE);
    /* No subcommands in Redis 6: CLIENT KILL is CLIENT. */
    assert_ptr_equal(lookup(t, "client", "kill"), lookup(t, "client", NULL));
    assert_false(cmd_table_has_subcommands(t));
    assert_false(cmd_table_has_subcommands(NULL));
    /* last_key -2: BLPOP a b 0 has keys 1 and 2. */
    assert_keys(lookup(t, "blpop", NULL), 4, (size_t[]){1, 2}, 2);
    /* A six-field entry (Redis 5 and older) parses too. */
    const struct cmd_info *ping = lookup(t, "ping", NULL);
    assert_non_null(ping);
    assert_int_equal(ping->flags, CMD_STALE | CMD_FAST);
    assert_keys(ping, 1, NULL, 0);

    cmd_table_free(t);
    free(fx.data);
}

static void assert_rejected(const char *buf, size_t len)
{
    int err = 0;
    struct cmd_table *t = cmd_table_parse(buf, len, &err);
    assert_null(t);
    assert_int_equal(err, FG_ERR_PROTO);
}

#define REJECT(s) assert_rejected((s), sizeof(s) - 1)

static void test_truncated(void **state)
{
    (void)state;
    struct fixture r6 = load_fixture("command-redis6.resp");
    for (size_t cut = 0; cut < r6.len; cut++)
        assert_rejected(r6.data, cut);

    struct fixture r7 = load_fixture("command-redis7.resp");
    /* Every offset near both ends, and a stride through the middle (each parse is O(len)). */
    for (size_t cut = 0; cut < r7.len; cut++) {
        if (cut < 4096 || cut + 512 > r7.len || cut % 97 == 0)
            assert_rejected(r7.data, cut);
    }
    cmd_table_free(parse_ok(&r7)); /* the full reply still parses */
    free(r6.data);
    free(r7.data);
}

static void test_malformed(void **state)
{
    (void)state;
    REJECT("");
    REJECT("hello world\r\n");
    REJECT("-ERR unknown command 'COMMAND'\r\n");
    REJECT("+OK\r\n");
    REJECT(":1\r\n");
    REJECT("*-1\r\n");
    REJECT("*1\r\n:5\r\n");                                     /* entry is not an array */
    REJECT("*1\r\n*3\r\n$3\r\nget\r\n:2\r\n*0\r\n");            /* too few fields */
    REJECT("*1\r\n*6\r\n:3\r\n:2\r\n*0\r\n:1\r\n:1\r\n:1\r\n"); /* name not a string */
    REJECT("*1\r\n*6\r\n$3\r\nget\r\n$1\r\n2\r\n*0\r\n:1\r\n:1\r\n:1\r\n"); /* arity a bulk */
    REJECT("*1\r\n*6\r\n$3\r\nget\r\n:2\r\n:0\r\n:1\r\n:1\r\n:1\r\n");      /* flags not a list */
    REJECT("*1\r\n*6\r\n$3\r\nget\r\n:2\r\n*0\r\n:1\r\n:99999999999\r\n:1\r\n"); /* not an int */
    REJECT("*1\r\n*6\r\n$-1\r\n:2\r\n*0\r\n:1\r\n:1\r\n:1\r\n");                 /* null name */
    REJECT("*999999999999\r\n");
    REJECT("*2\r\n*6\r\n$3\r\nget\r\n:2\r\n*0\r\n:1\r\n:1\r\n:1\r\n");   /* count says 2, has 1 */
    REJECT("*1\r\n*6\r\n$3\r\nget\r\n:2\r\n*0\r\n:1\r\n:1\r\n:1\r\nXX"); /* trailing bytes */
    REJECT("*1\r\n*6\r\n$4\r\nget\r\n:2\r\n*0\r\n:1\r\n:1\r\n:1\r\n");   /* bad bulk length */
    /* Subcommand list holding a non-entry. */
    REJECT("*1\r\n*10\r\n$1\r\nx\r\n:2\r\n*0\r\n:1\r\n:1\r\n:1\r\n*0\r\n*0\r\n*0\r\n*1\r\n:1\r\n");

    int err = 0;
    assert_null(cmd_table_parse(NULL, 10, &err));
    assert_int_equal(err, FG_ERR_PROTO);
    assert_null(cmd_table_parse("x", 1, NULL)); /* a NULL err pointer is tolerated */
    cmd_table_free(NULL);
    assert_int_equal(cmd_table_count(NULL), 0);
}

/* Shapes a real Redis does not send but a tolerant parser must accept. */
static void test_tolerated(void **state)
{
    (void)state;
    int err = 0;
    /* Empty table; a nil entry (as COMMAND INFO gives for unknown names); unknown flags; a
     * status-string name; extra unknown fields including nested maps; a name too long to store
     * (left out); a duplicate (first wins). */
    static const char reply[] =
        "*6\r\n"
        "*-1\r\n"
        "*6\r\n+GeT\r\n:2\r\n*3\r\n+readonly\r\n+whatever\r\n$4\r\nfast\r\n:1\r\n:1\r\n:1\r\n"
        "*9\r\n$3\r\nset\r\n:-3\r\n*1\r\n+write\r\n:1\r\n:1\r\n:1\r\n"
        "*1\r\n+@write\r\n*0\r\n*1\r\n*2\r\n$5\r\nflags\r\n*1\r\n+RW\r\n"
        "*6\r\n$70\r\n"
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n"
        ":1\r\n*0\r\n:0\r\n:0\r\n:0\r\n"
        "*6\r\n$3\r\nget\r\n:7\r\n*1\r\n+write\r\n:1\r\n:1\r\n:1\r\n"
        "*10\r\n$3\r\nobj\r\n:-2\r\n*0\r\n:0\r\n:0\r\n:0\r\n*0\r\n*0\r\n*0\r\n"
        "*1\r\n*6\r\n$8\r\nobj|Free\r\n:3\r\n*1\r\n+readonly\r\n:2\r\n:2\r\n:1\r\n";
    struct cmd_table *t = cmd_table_parse(reply, sizeof(reply) - 1, &err);
    assert_non_null(t);
    assert_int_equal(err, FG_OK);
    assert_int_equal(cmd_table_count(t), 4); /* get, set, obj, obj|free */
    const struct cmd_info *get = lookup(t, "get", NULL);
    assert_non_null(get);
    assert_string_equal(get->name, "get");
    assert_int_equal(get->arity, 2);
    assert_int_equal(get->flags, CMD_READONLY | CMD_FAST);
    assert_int_equal(lookup(t, "set", NULL)->flags, CMD_WRITE);
    const struct cmd_info *of = lookup(t, "OBJ", "FREE");
    assert_non_null(of);
    assert_string_equal(of->name, "obj|free");
    assert_keys(of, 3, (size_t[]){2}, 1);
    cmd_table_free(t);

    t = cmd_table_parse("*0\r\n", 4, &err);
    assert_non_null(t);
    assert_int_equal(cmd_table_count(t), 0);
    assert_null(lookup(t, "get", NULL));
    cmd_table_free(t);
}

static void test_keys_edges(void **state)
{
    (void)state;
    struct cmd_info ci;
    memset(&ci, 0, sizeof(ci));

    assert_int_equal(cmd_keys(NULL, 5, NULL, 0), 0);
    assert_int_equal(cmd_keys(&ci, 5, NULL, 0), 0); /* first_key 0: no keys */

    ci.first_key = 1, ci.last_key = 1, ci.step = 1;
    assert_keys(&ci, 1, NULL, 0); /* "SET" alone: index 1 does not exist */
    assert_keys(&ci, 0, NULL, 0);
    assert_keys(&ci, 2, (size_t[]){1}, 1);

    /* A fixed range longer than the call: clamped, never an index >= argc. */
    ci.first_key = 1, ci.last_key = 3, ci.step = 1;
    assert_keys(&ci, 3, (size_t[]){1, 2}, 2);

    /* MSET k v k: the dangling key is still reported (Redis would refuse the call). */
    ci.first_key = 1, ci.last_key = -1, ci.step = 2;
    assert_keys(&ci, 4, (size_t[]){1, 3}, 2);
    assert_keys(&ci, 2, (size_t[]){1}, 1);
    assert_keys(&ci, 1, NULL, 0);

    /* last counting from the end past the start: empty. */
    ci.first_key = 1, ci.last_key = -2, ci.step = 1;
    assert_keys(&ci, 2, NULL, 0);
    assert_keys(&ci, 1, NULL, 0);
    ci.last_key = -100;
    assert_keys(&ci, 5, NULL, 0);

    /* Fewer slots than keys: the count is still the full count; only max are written. */
    ci.first_key = 1, ci.last_key = -1, ci.step = 1;
    size_t idx[3] = {99, 99, 99};
    assert_int_equal(cmd_keys(&ci, 10, idx, 2), 9);
    assert_int_equal(idx[0], 1);
    assert_int_equal(idx[1], 2);
    assert_int_equal(idx[2], 99);
    assert_int_equal(cmd_keys(&ci, 10, NULL, 0), 9);

    /* A step of 0 from a broken reply: treated as 1, terminates. */
    ci.first_key = 2, ci.last_key = -1, ci.step = 0;
    assert_keys(&ci, 4, (size_t[]){2, 3}, 2);

    /* Extreme values do not overflow. */
    ci.first_key = 1, ci.last_key = -2147483647 - 1, ci.step = 1;
    assert_keys(&ci, 5, NULL, 0);
    ci.first_key = 2147483647, ci.last_key = 2147483647, ci.step = 2147483647;
    assert_keys(&ci, 5, NULL, 0);
    ci.first_key = 1, ci.last_key = 2147483647, ci.step = 2147483647;
    assert_keys(&ci, 5, (size_t[]){1}, 1);
    ci.first_key = -1, ci.last_key = -1, ci.step = 1;
    assert_keys(&ci, 5, NULL, 0);
}

/* Every single-byte corruption of a small reply is either parsed or rejected, never a crash (run
 * under FG_SANITIZE to catch out-of-bounds reads). */
static void test_mutations(void **state)
{
    (void)state;
    struct fixture fx = load_fixture("command-redis6.resp");
    static const char subst[] = {'*', '$', ':', '+', '-', '0', '9', '\r', '\n', 'x', '\0'};
    char *copy = malloc(fx.len);
    assert_non_null(copy);
    size_t parsed = 0;
    for (size_t i = 0; i < fx.len; i++) {
        for (size_t k = 0; k < sizeof(subst); k++) {
            memcpy(copy, fx.data, fx.len);
            copy[i] = subst[k];
            int err = 0;
            struct cmd_table *t = cmd_table_parse(copy, fx.len, &err);
            if (t != NULL) {
                assert_int_equal(err, FG_OK);
                parsed++;
                /* Whatever parsed must answer lookups sanely. */
                const struct cmd_info *ci = lookup(t, "mset", NULL);
                if (ci != NULL) {
                    size_t idx[8];
                    size_t n = cmd_keys(ci, 5, idx, 8);
                    for (size_t j = 0; j < n && j < 8; j++)
                        assert_true(idx[j] < 5);
                }
                cmd_table_free(t);
            } else {
                assert_true(err == FG_ERR_PROTO || err == FG_ERR_NOMEM);
            }
        }
    }
    assert_true(parsed > 0); /* e.g. a changed digit inside a flag name still parses */
    free(copy);
    free(fx.data);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_redis7_fixture), cmocka_unit_test(test_redis6_fixture),
        cmocka_unit_test(test_truncated),      cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_tolerated),      cmocka_unit_test(test_keys_edges),
        cmocka_unit_test(test_mutations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
