/* test_fence.c — unit tests of key-to-lock rules, write verdicts, SHA-1 and the EVALSHA encoding.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "fence.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---- Helpers ------------------------------------------------------------------------------- */

static struct fence_rules *rules_or_fail(const struct fence_rule *rules, size_t n)
{
    int err = 0;
    struct fence_rules *r = fence_rules_new(rules, n, &err);
    if (r == NULL)
        fail_msg("fence_rules_new failed: %d", err);
    return r;
}

/* Fails unless key (klen bytes) maps to exactly want (wlen bytes), or to no lock if want is NULL.
 */
static void assert_lock(const struct fence_rules *r, const char *key, size_t klen, const char *want,
                        size_t wlen)
{
    char lock[FENCE_MAX_LOCK];
    int n = fence_lock_for_key(r, key, klen, lock, sizeof(lock));
    if (want == NULL) {
        if (n != 0)
            fail_msg("key \"%.*s\": want no lock, got %d \"%.*s\"", (int)klen, key, n,
                     n > 0 ? n : 0, lock);
        return;
    }
    if (n < 0 || (size_t)n != wlen || memcmp(lock, want, wlen) != 0)
        fail_msg("key \"%.*s\": want \"%.*s\", got %d \"%.*s\"", (int)klen, key, (int)wlen, want, n,
                 n > 0 ? n : 0, lock);
}

static void assert_lock_str(const struct fence_rules *r, const char *key, const char *want)
{
    assert_lock(r, key, strlen(key), want, want ? strlen(want) : 0);
}

/* One rule, one key: what lock (as a string) does the rule give, or NULL. */
struct glob_case {
    const char *glob;
    const char *tmpl;
    const char *key;
    size_t klen; /* 0: strlen(key) */
    const char *want;
    size_t wlen; /* 0: strlen(want) */
};

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- Globs and captures -------------------------------------------------------------------- */

static void test_glob_table(void **state)
{
    (void)state;
    /* None of these keys has a '{', so only the rule can claim them. */
    static const struct glob_case cases[] = {
        {"wallet:*", "$1", "wallet:7", 0, "7", 0},
        {"wallet:*", "wallet:$1", "wallet:7", 0, "wallet:7", 0},
        {"wallet:*", "L", "wallet", 0, NULL, 0},
        {"wallet:*", "L", "xwallet:7", 0, NULL, 0},
        {"wallet:*", "L", "Wallet:7", 0, NULL, 0}, /* case-sensitive */
        {"exact", "L", "exact", 0, "L", 0},
        {"exact", "L", "exac", 0, NULL, 0},
        {"exact", "L", "exactt", 0, NULL, 0},
        {"a?c", "L", "abc", 0, "L", 0},
        {"a?c", "L", "ac", 0, NULL, 0},
        {"a?c", "L", "abbc", 0, NULL, 0},
        {"?", "L", "", 0, NULL, 0},
        {"??", "L", "xy", 0, "L", 0},
        {"*", "[$1]", "", 0, "[]", 0}, /* empty capture, empty key */
        {"*", "L", "anything at all", 0, "L", 0},
        {"a*", "<$1>", "a", 0, "<>", 0},
        {"*a", "L", "b", 0, NULL, 0},
        {"a*b*c", "$1|$2", "abc", 0, "|", 0},
        {"a*b*c", "$1|$2", "aXbYc", 0, "X|Y", 0},
        {"a*b*c", "L", "aXbYcZ", 0, NULL, 0},
        /* Leftmost-shortest: earlier stars take as little as the whole match allows. */
        {"a:*:b:*", "$1|$2", "a:x:b:y:b:z", 0, "x|y:b:z", 0},
        {"*:*", "$1|$2", "a:b:c", 0, "a|b:c", 0},
        {"*x", "$1", "axbx", 0, "axb", 0},
        {"**", "$1|$2", "ab", 0, "|ab", 0},
        {"*?*", "$1|$2", "abc", 0, "|bc", 0},
        {"*?", "$1", "abc", 0, "ab", 0},
        {"u:*:?:*", "$1/$2", "u:1:2:3:4", 0, "1/3:4", 0},
        /* The ninth star is reachable; stars past the ninth still match. */
        {"*.*.*.*.*.*.*.*.*", "$9$1", "1.2.3.4.5.6.7.8.9", 0, "91", 0},
        {"*.*.*.*.*.*.*.*.*.*.*", "$1-$9", "a.b.c.d.e.f.g.h.i.j.k", 0, "a-i", 0},
        {"*.*.*.*.*.*.*.*.*.*.*", "L", "a.b.c", 0, NULL, 0},
        /* Binary keys: NUL and high bytes are ordinary bytes. */
        {"k*z", "$1", "k\0\377z", 4, "\0\377", 2},
        {"k?z", "L", "k\0z", 3, "L", 0},
        {"kz", "L", "k\0z", 3, NULL, 0},
        {"k*", "$1", "k\0", 2, "\0", 1},
        {"k", "L", "k\0", 2, NULL, 0},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        const struct glob_case *c = &cases[i];
        struct fence_rule rule = {c->glob, c->tmpl};
        struct fence_rules *r = rules_or_fail(&rule, 1);
        size_t klen = c->klen ? c->klen : strlen(c->key);
        size_t wlen = c->want ? (c->wlen ? c->wlen : strlen(c->want)) : 0;
        print_message("case %zu: glob \"%s\"\n", i, c->glob);
        assert_lock(r, c->key, klen, c->want, wlen);
        fence_rules_free(r);
    }
}

/* A backtracking matcher that retries every split would need ~C(10000, 6) steps here. */
static void test_glob_no_blowup(void **state)
{
    (void)state;
    enum { N = 10 * 1024 };
    struct fence_rule rule = {"a*a*a*a*a*a*b", "$5|$6"};
    struct fence_rules *r = rules_or_fail(&rule, 1);
    char *key = malloc(N + 1);
    char lock[FENCE_MAX_LOCK];
    assert_non_null(key);
    memset(key, 'a', N);

    double t0 = now_seconds();
    for (int round = 0; round < 10; round++)
        assert_int_equal(fence_lock_for_key(r, key, N, lock, sizeof(lock)), 0);
    /* With a final 'b' it matches: $1..$5 are empty, $6 holds the rest. */
    key[N] = 'b';
    char *big = malloc(N);
    assert_non_null(big);
    int n = fence_lock_for_key(r, key, N + 1, big, N);
    assert_int_equal(n, 1 + (N - 6));
    assert_int_equal(big[0], '|');
    for (int i = 1; i < n; i++)
        assert_int_equal(big[i], 'a');
    double elapsed = now_seconds() - t0;
    print_message("11 matches against a 10 KB key: %.4f s\n", elapsed);
    assert_true(elapsed < 1.0);

    free(big);
    free(key);
    fence_rules_free(r);
}

/* ---- Templates ----------------------------------------------------------------------------- */

static void test_template_expansion(void **state)
{
    (void)state;
    static const struct glob_case cases[] = {
        {"w:*", "$$", "w:1", 0, "$", 0},
        {"w:*", "$$1", "w:1", 0, "$1", 0},  /* "$$" then a literal '1' */
        {"w:*", "$$$1", "w:7", 0, "$7", 0}, /* "$$" then "$1" */
        {"w:*", "cost$", "w:7", 0, "cost$", 0},
        {"w:*", "$0$1", "w:7", 0, "$07", 0}, /* "$0" is literal */
        {"w:*", "$a$1", "w:7", 0, "$a7", 0},
        {"w:*", "$1$1", "w:7", 0, "77", 0},
        {"w:*", "pre-$1-post", "w:7", 0, "pre-7-post", 0},
        {"w:*", "$10", "w:7", 0, "70", 0}, /* one digit only: "$1" then '0' */
        {"*:*", "$2:$1", "a:b", 0, "b:a", 0},
        {"plain", "$$", "plain", 0, "$", 0},
    };
    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        const struct glob_case *c = &cases[i];
        struct fence_rule rule = {c->glob, c->tmpl};
        struct fence_rules *r = rules_or_fail(&rule, 1);
        print_message("case %zu: template \"%s\"\n", i, c->tmpl);
        assert_lock_str(r, c->key, c->want);
        fence_rules_free(r);
    }
}

static void test_template_rejected(void **state)
{
    (void)state;
    static const struct fence_rule bad[] = {
        {"plain", "$1"}, {"w:*", "$2"}, {"*:*", "$1$3"}, {"w:*", "ok-$1-$9"},
        {"w:?", "$1"},   {NULL, "x"},   {"w:*", NULL},
    };
    for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
        int err = 0;
        print_message("case %zu\n", i);
        assert_null(fence_rules_new(&bad[i], 1, &err));
        assert_int_equal(err, FG_ERR_CONFIG);
    }
    /* A bad rule after good ones fails the whole set (and frees what was copied). */
    struct fence_rule mixed[] = {{"a:*", "$1"}, {"b:*", "b"}, {"c", "$1"}};
    int err = 0;
    assert_null(fence_rules_new(mixed, 3, &err));
    assert_int_equal(err, FG_ERR_CONFIG);

    /* "$$1" references nothing, so it needs no star. */
    struct fence_rule escaped = {"plain", "$$1$$$$"};
    struct fence_rules *r = rules_or_fail(&escaped, 1);
    assert_lock_str(r, "plain", "$1$$");
    fence_rules_free(r);

    fence_rules_free(NULL);
}

/* ---- Rule order and hash tags -------------------------------------------------------------- */

static void test_rules_order(void **state)
{
    (void)state;
    struct fence_rule rules[] = {
        {"wallet:*", "w:$1"},  {"wallet:vip:*", "vip:$1"}, /* shadowed by the rule above */
        {"lock:*", "$1"},                                  /* empty for "lock:": steps aside */
        {"lock:", "fallback"}, {"cache:*", "c"},
    };
    struct fence_rules *r = rules_or_fail(rules, ARRAY_LEN(rules));
    assert_lock_str(r, "wallet:vip:3", "w:vip:3");
    assert_lock_str(r, "wallet:{x}", "w:{x}"); /* a rule beats the hash tag */
    assert_lock_str(r, "lock:a", "a");
    assert_lock_str(r, "lock:", "fallback");
    assert_lock_str(r, "cache:{t}", "c");
    assert_lock_str(r, "other{t}", "t"); /* no rule: the hash tag */
    assert_lock_str(r, "other", NULL);
    fence_rules_free(r);

    /* With only the empty-expanding rule, such a key falls to the hash tag, then to nothing. */
    struct fence_rule only = {"lock:*", "$1"};
    r = rules_or_fail(&only, 1);
    assert_lock_str(r, "lock:", NULL);
    assert_lock_str(r, "lock:{t}", "{t}");
    fence_rules_free(r);
}

static void test_hash_tag(void **state)
{
    (void)state;
    struct fence_rules *r = rules_or_fail(NULL, 0);
    assert_lock_str(r, "{user1}.a", "user1");
    assert_lock_str(r, "x{user1}", "user1");
    assert_lock_str(r, "foo{}{bar}", NULL); /* the first tag is empty: no tag at all */
    assert_lock_str(r, "foo{{bar}}zap", "{bar");
    assert_lock_str(r, "foo{bar}{zap}", "bar");
    assert_lock_str(r, "{", NULL);
    assert_lock_str(r, "}{", NULL);
    assert_lock_str(r, "abc{def", NULL);
    assert_lock_str(r, "abc}def{", NULL);
    assert_lock_str(r, "{}", NULL);
    assert_lock_str(r, "", NULL);
    assert_lock(r, "{\0}", 3, "\0", 1);
    assert_lock(r, "a\0{b\0c}", 7, "b\0c", 3);
    fence_rules_free(r);
}

static void test_lock_overflow(void **state)
{
    (void)state;
    char lock[FENCE_MAX_LOCK];
    struct fence_rule rule = {"k:*", "lock-$1"};
    struct fence_rules *r = rules_or_fail(&rule, 1);

    /* "lock-" + 3 bytes = 8: fits in 8, not in 7. */
    assert_int_equal(fence_lock_for_key(r, "k:abc", 5, lock, 8), 8);
    assert_memory_equal(lock, "lock-abc", 8);
    assert_int_equal(fence_lock_for_key(r, "k:abc", 5, lock, 7), FG_ERR_LIMIT);
    assert_int_equal(fence_lock_for_key(r, "k:abc", 5, lock, 0), FG_ERR_LIMIT);

    /* A hash tag too long for the buffer. */
    assert_int_equal(fence_lock_for_key(r, "{abcd}", 6, lock, 4), 4);
    assert_int_equal(fence_lock_for_key(r, "{abcde}", 7, lock, 4), FG_ERR_LIMIT);

    /* A capture longer than FENCE_MAX_LOCK. */
    enum { KLEN = FENCE_MAX_LOCK + 10 };
    char key[KLEN];
    memcpy(key, "k:", 2);
    memset(key + 2, 'x', KLEN - 2);
    assert_int_equal(fence_lock_for_key(r, key, KLEN, lock, sizeof(lock)), FG_ERR_LIMIT);
    /* Exactly FENCE_MAX_LOCK bytes still fit. */
    assert_int_equal(fence_lock_for_key(r, key, FENCE_MAX_LOCK - 3, lock, sizeof(lock)),
                     FENCE_MAX_LOCK);
    fence_rules_free(r);
}

/* ---- Decisions ----------------------------------------------------------------------------- */

struct held {
    const char *name;
    enum fence_lock_state state;
    uint64_t token;
};

struct session {
    const struct held *locks;
    size_t n;
    int calls;
};

static enum fence_lock_state session_lookup(void *arg, const char *lock, size_t len,
                                            uint64_t *token)
{
    struct session *s = arg;
    s->calls++;
    for (size_t i = 0; i < s->n; i++) {
        if (strlen(s->locks[i].name) == len && memcmp(s->locks[i].name, lock, len) == 0) {
            *token = s->locks[i].token;
            return s->locks[i].state;
        }
    }
    return FENCE_NOT_HELD;
}

/* The session every decision test runs against. */
static const struct held session_locks[] = {
    {"wallet:7", FENCE_HELD, 42}, {"wallet:9", FENCE_LOST, 40}, {"acct", FENCE_HELD, 7},
    {"job", FENCE_HELD, 5},       {"t0", FENCE_HELD, 100},      {"t1", FENCE_HELD, 101},
    {"t2", FENCE_HELD, 102},      {"t3", FENCE_HELD, 103},      {"t4", FENCE_HELD, 104},
    {"t5", FENCE_HELD, 105},      {"t6", FENCE_HELD, 106},      {"t7", FENCE_HELD, 107},
    {"t8", FENCE_HELD, 108},      {"big", FENCE_HELD, 1},
};

struct decide_case {
    const char *what;
    const char *argv[12]; /* NULL-terminated */
    size_t keys[11];      /* argv indexes; 0-terminated (argv[0] is the command name) */
    const char *only;     /* the one-lock rule's lock, or NULL */
    uint64_t only_token;
    enum fence_verdict verdict;
    const char *locks[FENCE_MAX_LOCKS + 1]; /* APPLY: expected "name=token", in order */
    size_t key_index;                       /* NOLOCK / LOCKLOST / TOOMANY */
    const char *offending;
};

static void run_decide(const struct fence_rules *r, const struct decide_case *c)
{
    const char *argv[12];
    size_t lens[12];
    size_t keys[11];
    size_t argc = 0, nkeys = 0;
    struct session s = {session_locks, ARRAY_LEN(session_locks), 0};
    struct fence_lock_ref only;
    struct fence_decision d;

    print_message("decide: %s\n", c->what);
    for (; c->argv[argc] != NULL; argc++) {
        argv[argc] = c->argv[argc];
        lens[argc] = strlen(c->argv[argc]);
    }
    for (; c->keys[nkeys] != 0; nkeys++)
        keys[nkeys] = c->keys[nkeys];
    if (c->only != NULL) {
        only.len = strlen(c->only);
        memcpy(only.name, c->only, only.len);
        only.token = c->only_token;
    }
    memset(&d, 0xA5, sizeof(d)); /* the decision must not rely on the caller zeroing it */
    fence_decide(r, argv, lens, keys, nkeys, c->only ? &only : NULL, session_lookup, &s, &d);

    assert_int_equal(d.verdict, c->verdict);
    if (c->verdict == FENCE_APPLY || c->verdict == FENCE_PASS) {
        size_t want = 0;
        while (c->locks[want] != NULL)
            want++;
        assert_int_equal(d.nlocks, want);
        for (size_t i = 0; i < want; i++) {
            char got[FENCE_MAX_LOCK + 32];
            snprintf(got, sizeof(got), "%.*s=%llu", (int)d.locks[i].len, d.locks[i].name,
                     (unsigned long long)d.locks[i].token);
            assert_string_equal(got, c->locks[i]);
        }
    } else {
        assert_int_equal(d.key_index, c->key_index);
        assert_int_equal(d.offending.len, strlen(c->offending));
        assert_memory_equal(d.offending.name, c->offending, d.offending.len);
    }
}

static void test_decide_table(void **state)
{
    (void)state;
    static const struct decide_case cases[] = {
        {"unclaimed keys, no one-lock: pass",
         {"MSET", "a", "1", "b", "2", NULL},
         {1, 3},
         NULL,
         0,
         FENCE_PASS,
         {NULL},
         0,
         NULL},
        {"a keyless write, no one-lock: pass",
         {"FLUSHDB", NULL},
         {0},
         NULL,
         0,
         FENCE_PASS,
         {NULL},
         0,
         NULL},
        {"a keyless write under the one-lock rule: fenced by that lock",
         {"FLUSHDB", NULL},
         {0},
         "job",
         5,
         FENCE_APPLY,
         {"job=5"},
         0,
         NULL},
        {"unclaimed key under the one-lock rule",
         {"SET", "a", "1", NULL},
         {1},
         "job",
         5,
         FENCE_APPLY,
         {"job=5"},
         0,
         NULL},
        {"two unclaimed keys, one-lock rule: one lock",
         {"MSET", "a", "1", "b", "2", NULL},
         {1, 3},
         "job",
         5,
         FENCE_APPLY,
         {"job=5"},
         0,
         NULL},
        {"claimed and held: the lookup's token",
         {"SET", "wallet:7", "1", NULL},
         {1},
         NULL,
         0,
         FENCE_APPLY,
         {"wallet:7=42"},
         0,
         NULL},
        {"claimed key plus unclaimed key under the same only lock",
         {"MSET", "wallet:7", "1", "x", "2", NULL},
         {1, 3},
         "wallet:7",
         42,
         FENCE_APPLY,
         {"wallet:7=42"},
         0,
         NULL},
        {"claimed key plus unclaimed key under another only lock",
         {"MSET", "x", "1", "wallet:7", "2", NULL},
         {1, 3},
         "job",
         5,
         FENCE_APPLY,
         {"job=5", "wallet:7=42"},
         0,
         NULL},
        {"values are not keys: only the key indexes count",
         {"MSET", "a", "wallet:8", "b", "{zz}", NULL},
         {1, 3},
         NULL,
         0,
         FENCE_PASS,
         {NULL},
         0,
         NULL},
        {"claimed and not held: NOLOCK even with an only lock",
         {"MSET", "a", "1", "wallet:8", "2", NULL},
         {1, 3},
         "job",
         5,
         FENCE_NOLOCK,
         {NULL},
         3,
         "wallet:8"},
        {"hash tag not held, with an only lock: the tag steps aside for the one-lock rule",
         {"SET", "{user1}.a", "1", NULL},
         {1},
         "job",
         5,
         FENCE_APPLY,
         {"job=5"},
         0,
         NULL},
        {"hash tag not held, no only lock: pass (tags also just place keys in slots)",
         {"SET", "{user1}.a", "1", NULL},
         {1},
         NULL,
         0,
         FENCE_PASS,
         {NULL},
         0,
         NULL},
        {"hash tag lost: LOCKLOST",
         {"SET", "{wallet:9}.a", "1", NULL},
         {1},
         NULL,
         0,
         FENCE_LOCKLOST,
         {NULL},
         1,
         "wallet:9"},
        {"claimed and lost: LOCKLOST",
         {"SET", "wallet:9", "1", NULL},
         {1},
         NULL,
         0,
         FENCE_LOCKLOST,
         {NULL},
         1,
         "wallet:9"},
        {"first offending key wins (NOLOCK first)",
         {"MSET", "wallet:8", "1", "wallet:9", "2", NULL},
         {1, 3},
         NULL,
         0,
         FENCE_NOLOCK,
         {NULL},
         1,
         "wallet:8"},
        {"first offending key wins (LOCKLOST first)",
         {"MSET", "wallet:9", "1", "wallet:8", "2", NULL},
         {1, 3},
         NULL,
         0,
         FENCE_LOCKLOST,
         {NULL},
         1,
         "wallet:9"},
        {"held keys before an offending one do not save it",
         {"MSET", "wallet:7", "1", "wallet:9", "2", NULL},
         {1, 3},
         NULL,
         0,
         FENCE_LOCKLOST,
         {NULL},
         3,
         "wallet:9"},
        {"two keys, same lock: counted once",
         {"MSET", "acct:1", "1", "acct:2", "2", "{acct}x", "3", NULL},
         {1, 3, 5},
         NULL,
         0,
         FENCE_APPLY,
         {"acct=7"},
         0,
         NULL},
        {"two keys, two locks",
         {"MSET", "wallet:7", "1", "acct:1", "2", NULL},
         {1, 3},
         NULL,
         0,
         FENCE_APPLY,
         {"wallet:7=42", "acct=7"},
         0,
         NULL},
        {"eight distinct locks fit",
         {"DEL", "{t0}", "{t1}", "{t2}", "{t3}", "{t4}", "{t5}", "{t6}", "{t7}", "{t0}a", NULL},
         {1, 2, 3, 4, 5, 6, 7, 8, 9},
         NULL,
         0,
         FENCE_APPLY,
         {"t0=100", "t1=101", "t2=102", "t3=103", "t4=104", "t5=105", "t6=106", "t7=107"},
         0,
         NULL},
        {"nine distinct locks: TOOMANY",
         {"DEL", "{t0}", "{t1}", "{t2}", "{t3}", "{t4}", "{t5}", "{t6}", "{t7}", "{t8}", NULL},
         {1, 2, 3, 4, 5, 6, 7, 8, 9},
         NULL,
         0,
         FENCE_TOOMANY,
         {NULL},
         9,
         "t8"},
        {"eight claimed locks plus the only lock: TOOMANY",
         {"DEL", "{t0}", "{t1}", "{t2}", "{t3}", "{t4}", "{t5}", "{t6}", "{t7}", "plain", NULL},
         {1, 2, 3, 4, 5, 6, 7, 8, 9},
         "job",
         5,
         FENCE_TOOMANY,
         {NULL},
         9,
         "job"},
    };
    struct fence_rule rules[] = {{"wallet:*", "wallet:$1"}, {"acct:*", "acct"}};
    struct fence_rules *r = rules_or_fail(rules, ARRAY_LEN(rules));
    for (size_t i = 0; i < ARRAY_LEN(cases); i++)
        run_decide(r, &cases[i]);
    fence_rules_free(r);
}

/* A key whose lock name cannot be represented is refused, never forwarded unfenced. */
static void test_decide_overlong_lock(void **state)
{
    (void)state;
    enum { KLEN = FENCE_MAX_LOCK + 3 };
    char key[KLEN];
    key[0] = '{';
    memset(key + 1, 'b', KLEN - 2);
    key[KLEN - 1] = '}';
    const char *argv[] = {"SET", key, "v"};
    size_t lens[] = {3, KLEN, 1};
    size_t keys[] = {1};
    struct session s = {session_locks, ARRAY_LEN(session_locks), 0};
    struct fence_lock_ref only = {"job", 3, 5};
    struct fence_decision d;
    struct fence_rules *r = rules_or_fail(NULL, 0);

    fence_decide(r, argv, lens, keys, 1, &only, session_lookup, &s, &d);
    assert_int_equal(d.verdict, FENCE_NOLOCK);
    assert_int_equal(d.key_index, 1);
    assert_int_equal(d.offending.len, FENCE_MAX_LOCK);
    assert_memory_equal(d.offending.name, key + 1, FENCE_MAX_LOCK);
    fence_rules_free(r);
}

/* ---- SHA-1 --------------------------------------------------------------------------------- */

static void assert_sha(const char *msg, const char *want)
{
    char got[41];
    memset(got, 'X', sizeof(got));
    fence_script_sha(msg, got);
    assert_int_equal(got[40], '\0');
    assert_string_equal(got, want);
}

static void test_sha1_vectors(void **state)
{
    (void)state;
    /* FIPS 180 examples. */
    assert_sha("abc", "a9993e364706816aba3e25717850c26c9cd0d89d");
    assert_sha("", "da39a3ee5e6b4b0d3255bfef95601890afd80709");
    assert_sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
               "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
    char *million = malloc(1000001);
    assert_non_null(million);
    memset(million, 'a', 1000000);
    million[1000000] = '\0';
    assert_sha(million, "34aa973cd4c4daa4f61eeb2bdbad27316534016f");
    free(million);

    /* Lengths around the padding boundaries (55/56 bytes leave or need an extra block). */
    static const struct {
        size_t n;
        const char *sha;
    } edges[] = {
        {55, "a617d006d1ca12671785098a19a87fe58443bde9"},
        {56, "4ad5bb7ae3c4024768d364b77c52128ea3cffebe"},
        {63, "fc8a5ab77259625085ead3ec96515b3b8d933fad"},
        {64, "93249d4c2f8903ebf41ac358473148ae6ddd7042"},
        {65, "cf2a63cc308225cf07b498d2309a01dd0df52f67"},
        {119, "edd0f1133d0e4ca5f3e98bb7e0295f31d20d2cdb"},
        {120, "23a58eee587aa1f50d19a969ab36a3fe3e88c393"},
    };
    for (size_t i = 0; i < ARRAY_LEN(edges); i++) {
        char msg[128];
        for (size_t j = 0; j < edges[i].n; j++)
            msg[j] = (char)('a' + j % 26);
        msg[edges[i].n] = '\0';
        assert_sha(msg, edges[i].sha);
    }
    /* What "SCRIPT LOAD" "return 1" answers on a real Redis. */
    assert_sha("return 1", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db");
}

/* ---- Encoding ------------------------------------------------------------------------------ */

static void test_hwm_key(void **state)
{
    (void)state;
    char out[64];
    const char *want = "fencegate:hwm:{wallet:7}";
    size_t wlen = strlen(want);

    assert_int_equal(fence_hwm_key("wallet:7", 8, out, sizeof(out)), wlen);
    assert_memory_equal(out, want, wlen);
    assert_int_equal(fence_hwm_key("wallet:7", 8, out, wlen), wlen);
    assert_int_equal(fence_hwm_key("wallet:7", 8, out, wlen - 1), FG_ERR_LIMIT);
    assert_int_equal(fence_hwm_key("wallet:7", 8, out, 3), FG_ERR_LIMIT);
    assert_int_equal(fence_hwm_key("a\0b", 3, out, sizeof(out)), 19);
    assert_memory_equal(out, "fencegate:hwm:{a\0b}", 19);
    assert_int_equal(fence_hwm_key("", 0, out, sizeof(out)), 16);
    assert_memory_equal(out, "fencegate:hwm:{}", 16);
}

/* Reads one "<type><decimal>\r\n" header at *pos; fails the test on anything else. */
static size_t parse_header(const char *buf, size_t len, size_t *pos, char type)
{
    size_t v = 0, digits = 0;
    assert_true(*pos < len);
    assert_int_equal(buf[*pos], type);
    (*pos)++;
    while (*pos < len && buf[*pos] >= '0' && buf[*pos] <= '9') {
        v = v * 10 + (size_t)(buf[*pos] - '0');
        (*pos)++;
        digits++;
    }
    assert_true(digits > 0);
    assert_true(*pos + 2 <= len);
    assert_memory_equal(buf + *pos, "\r\n", 2);
    *pos += 2;
    return v;
}

struct arg {
    const char *p;
    size_t n;
};

static void assert_arg(const struct arg *a, const char *want, size_t wlen);

/* Parses the RESP multibulk of bulk strings at *pos, moving *pos past it. */
static size_t parse_next(const char *buf, size_t len, size_t *pos, struct arg *args, size_t max)
{
    size_t count = parse_header(buf, len, pos, '*');
    assert_true(count <= max);
    for (size_t i = 0; i < count; i++) {
        size_t n = parse_header(buf, len, pos, '$');
        assert_true(*pos + n + 2 <= len);
        args[i].p = buf + *pos;
        args[i].n = n;
        *pos += n;
        assert_memory_equal(buf + *pos, "\r\n", 2);
        *pos += 2;
    }
    return count;
}

/* Parses a whole RESP multibulk of bulk strings; fails unless it uses exactly len bytes. */
static size_t parse_multibulk(const char *buf, size_t len, struct arg *args, size_t max)
{
    size_t pos = 0;
    size_t count = parse_next(buf, len, &pos, args, max);
    assert_int_equal(pos, len);
    return count;
}

/* Checks that the command at *pos is exactly want[0..n). */
static void assert_command(const char *buf, size_t len, size_t *pos, const char *const *want,
                           size_t n)
{
    struct arg args[16];
    assert_int_equal(parse_next(buf, len, pos, args, ARRAY_LEN(args)), n);
    for (size_t i = 0; i < n; i++)
        assert_arg(&args[i], want[i], strlen(want[i]));
}

static void assert_arg(const struct arg *a, const char *want, size_t wlen)
{
    assert_int_equal(a->n, wlen);
    assert_memory_equal(a->p, want, wlen);
}

static void test_encode_write(void **state)
{
    (void)state;
    struct fence_decision d;
    memset(&d, 0, sizeof(d));
    d.verdict = FENCE_APPLY;
    d.nlocks = 2;
    memcpy(d.locks[0].name, "wallet:7", 8);
    d.locks[0].len = 8;
    d.locks[0].token = 42;
    memcpy(d.locks[1].name, "b\r\n\0x", 5); /* a name with RESP's own bytes in it */
    d.locks[1].len = 5;
    d.locks[1].token = UINT64_MAX;
    const char sha[41] = "0123456789abcdef0123456789abcdef01234567";
    const char *argv[] = {"SET", "wallet:7", "v\0\r\n", ""};
    size_t lens[] = {3, 8, 4, 0};

    char buf[1024];
    size_t n = fence_encode_write(sha, &d, argv, lens, 4, buf, sizeof(buf), NULL);
    assert_true(n > 0 && n < sizeof(buf));

    struct arg args[32];
    size_t count = parse_multibulk(buf, n, args, ARRAY_LEN(args));
    assert_int_equal(count, 5 + 3 * 2 + 4);
    assert_arg(&args[0], "EVALSHA", 7);
    assert_arg(&args[1], sha, 40);
    assert_arg(&args[2], "2", 1);
    assert_arg(&args[3], "fencegate:hwm:{wallet:7}", 24);
    assert_arg(&args[4], "fencegate:hwm:{b\r\n\0x}", 21);
    assert_arg(&args[5], "2", 1);
    assert_arg(&args[6], "", 0); /* no owner to check */
    assert_arg(&args[7], "42", 2);
    assert_arg(&args[8], "18446744073709551615", 20);
    assert_arg(&args[9], "wallet:7", 8);
    assert_arg(&args[10], "b\r\n\0x", 5);
    for (size_t i = 0; i < 4; i++)
        assert_arg(&args[11 + i], argv[i], lens[i]);

    /* The marks are the same bytes fence_hwm_key() produces. */
    char mark[64];
    int mlen = fence_hwm_key(d.locks[1].name, d.locks[1].len, mark, sizeof(mark));
    assert_arg(&args[4], mark, (size_t)mlen);

    /* Too small: the needed length comes back and nothing is written past cap. */
    char small[1024];
    for (size_t cap = 0; cap < n; cap += 7) {
        memset(small, '#', sizeof(small));
        assert_int_equal(fence_encode_write(sha, &d, argv, lens, 4, small, cap, NULL), n);
        for (size_t i = cap; i < sizeof(small); i++)
            assert_int_equal(small[i], '#');
        assert_memory_equal(small, buf, cap); /* a prefix of the whole encoding */
    }
    memset(small, '#', sizeof(small));
    assert_int_equal(fence_encode_write(sha, &d, argv, lens, 4, small, n, NULL), n);
    assert_memory_equal(small, buf, n);
    assert_int_equal(small[n], '#');

    /* With an owner: the lock keys follow the marks, the owner id follows n, and the layout
     * tells the marks from the lock keys. */
    const struct fence_owner own = {"fencegate:lock:", 15, "ab12:7", 6};
    struct fence_layout lay;
    d.owner = &own;
    n = fence_encode_write(sha, &d, argv, lens, 4, buf, sizeof(buf), &lay);
    assert_int_equal(fence_encode_write(sha, &d, argv, lens, 4, NULL, 0, NULL), n);
    count = parse_multibulk(buf, n, args, ARRAY_LEN(args));
    assert_int_equal(count, 5 + 4 * 2 + 4);
    assert_arg(&args[2], "4", 1);
    assert_arg(&args[3], "fencegate:hwm:{wallet:7}", 24);
    assert_arg(&args[4], "fencegate:hwm:{b\r\n\0x}", 21);
    assert_arg(&args[5], "fencegate:lock:{wallet:7}", 25);
    assert_arg(&args[6], "fencegate:lock:{b\r\n\0x}", 22);
    assert_arg(&args[7], "2", 1);
    assert_arg(&args[8], "ab12:7", 6);
    assert_arg(&args[9], "42", 2);
    assert_arg(&args[11], "wallet:7", 8);
    assert_int_equal(lay.nlocks, 2);
    assert_int_equal(lay.nkeys, 4);
    assert_int_equal(lay.nargv, 2 + 2 * 2 + 4);
    assert_true(buf + lay.keys_off == args[3].p - 5);  /* "$24\r\n" */
    assert_true(buf + lay.marks_end == args[5].p - 5); /* "$25\r\n" */
    assert_true(buf + lay.argv_off == args[7].p - 4);  /* "$1\r\n" */
    assert_true(buf + lay.cmd_off == args[13].p - 4);  /* "$3\r\n" */
}

/* Another database's write: EVAL with the db script's body, the marks, then the two databases
 * ahead of the write script's ARGV. */
static void test_encode_write_db(void **state)
{
    (void)state;
    struct fence_decision d;
    memset(&d, 0, sizeof(d));
    d.verdict = FENCE_APPLY;
    d.nlocks = 1;
    memcpy(d.locks[0].name, "job", 3);
    d.locks[0].len = 3;
    d.locks[0].token = 5;
    const char *argv[] = {"SET", "k", "v"};
    size_t lens[] = {3, 1, 1};
    const char *body = fence_write_db_script();

    char buf[4096];
    size_t n = fence_encode_write_db(0, 15, &d, argv, lens, 3, buf, sizeof(buf));
    assert_true(n > 0 && n < sizeof(buf));
    assert_int_equal(fence_encode_write_db(0, 15, &d, argv, lens, 3, NULL, 0), n);

    struct arg args[16];
    size_t count = parse_multibulk(buf, n, args, ARRAY_LEN(args));
    assert_int_equal(count, 5 + 2 + 3 + 3);
    assert_arg(&args[0], "EVAL", 4);
    assert_arg(&args[1], body, strlen(body));
    assert_arg(&args[2], "1", 1);
    assert_arg(&args[3], "fencegate:hwm:{job}", 19);
    assert_arg(&args[4], "0", 1);
    assert_arg(&args[5], "15", 2);
    assert_arg(&args[6], "1", 1);
    assert_arg(&args[7], "", 0);
    assert_arg(&args[8], "5", 1);
    assert_arg(&args[9], "job", 3);
    for (size_t i = 0; i < 3; i++)
        assert_arg(&args[10 + i], argv[i], lens[i]);
    /* The script selects both databases, the command's first. */
    assert_non_null(strstr(body, "redis.call('SELECT', ARGV[2])\nredis.call('SELECT', ARGV[1])"));
}

static void test_encode_write_token_zero_and_no_locks(void **state)
{
    (void)state;
    struct fence_decision d;
    memset(&d, 0, sizeof(d));
    const char sha[41] = "e0e1f9fabfc9d4800c877a703b823ac0578ff8db";
    const char *argv[] = {"INCR", "n"};
    size_t lens[] = {4, 1};
    char buf[256];
    struct arg args[16];

    size_t n = fence_encode_write(sha, &d, argv, lens, 2, buf, sizeof(buf), NULL);
    assert_int_equal(parse_multibulk(buf, n, args, ARRAY_LEN(args)), 7);
    assert_arg(&args[2], "0", 1);
    assert_arg(&args[3], "0", 1);
    assert_arg(&args[4], "", 0);
    assert_arg(&args[5], "INCR", 4);
    assert_arg(&args[6], "n", 1);

    d.nlocks = 1;
    memcpy(d.locks[0].name, "L", 1);
    d.locks[0].len = 1;
    d.locks[0].token = 0;
    n = fence_encode_write(sha, &d, argv, lens, 2, buf, sizeof(buf), NULL);
    assert_int_equal(parse_multibulk(buf, n, args, ARRAY_LEN(args)), 10);
    assert_arg(&args[3], "fencegate:hwm:{L}", 17);
    assert_arg(&args[6], "0", 1);
    assert_arg(&args[7], "L", 1);
}

/* A group is the writes' marks in order, the count of writes, and each write's count and ARGV. */
static void test_encode_group(void **state)
{
    (void)state;
    const char sha[41] = "e0e1f9fabfc9d4800c877a703b823ac0578ff8db";
    struct fence_decision d1, d2;
    memset(&d1, 0, sizeof(d1));
    memset(&d2, 0, sizeof(d2));
    d1.nlocks = 1;
    memcpy(d1.locks[0].name, "a", 1);
    d1.locks[0].len = 1;
    d1.locks[0].token = 7;
    d2.nlocks = 2;
    memcpy(d2.locks[0].name, "b", 1);
    d2.locks[0].len = 1;
    d2.locks[0].token = 8;
    memcpy(d2.locks[1].name, "c\r\n", 3);
    d2.locks[1].len = 3;
    d2.locks[1].token = 9;
    const char *argv1[] = {"SET", "k", ""}, *argv2[] = {"INCR", "n"};
    size_t lens1[] = {3, 1, 0}, lens2[] = {4, 1};
    char enc[512];
    struct fence_layout lay[2];
    size_t n1 = fence_encode_write(sha, &d1, argv1, lens1, 3, enc, sizeof(enc), &lay[0]);
    fence_encode_write(sha, &d2, argv2, lens2, 2, enc + n1, sizeof(enc) - n1, &lay[1]);
    assert_int_equal(lay[0].nkeys, 1);
    assert_int_equal(lay[0].nargv, 7);
    assert_int_equal(lay[0].end, n1);
    assert_int_equal(lay[1].nkeys, 2);
    assert_int_equal(lay[1].nargv, 8);
    fence_layout_shift(&lay[1], n1); /* as the caller rebases them */

    char buf[1024];
    struct arg args[32];
    size_t n = fence_encode_group("0123456789012345678901234567890123456789", enc, lay, 2, buf,
                                  sizeof(buf));
    assert_true(n > 0 && n < sizeof(buf));
    const char *want[] = {"EVALSHA",
                          "0123456789012345678901234567890123456789",
                          "3",
                          "fencegate:hwm:{a}",
                          "fencegate:hwm:{b}",
                          "fencegate:hwm:{c\r\n}",
                          "2",
                          "7",
                          "1",
                          "",
                          "7",
                          "a",
                          "SET",
                          "k",
                          "",
                          "8",
                          "2",
                          "",
                          "8",
                          "9",
                          "b",
                          "c\r\n",
                          "INCR",
                          "n"};
    assert_int_equal(parse_multibulk(buf, n, args, ARRAY_LEN(args)), ARRAY_LEN(want));
    for (size_t i = 0; i < ARRAY_LEN(want); i++)
        assert_arg(&args[i], want[i], strlen(want[i]));

    /* Without a SHA the script's body goes as EVAL; the rest is the same. */
    char big[4096];
    size_t m = fence_encode_group(NULL, enc, lay, 2, big, sizeof(big));
    assert_int_equal(parse_multibulk(big, m, args, ARRAY_LEN(args)), ARRAY_LEN(want));
    assert_arg(&args[0], "EVAL", 4);
    assert_arg(&args[1], fence_group_script(), strlen(fence_group_script()));
    for (size_t i = 2; i < ARRAY_LEN(want); i++)
        assert_arg(&args[i], want[i], strlen(want[i]));

    /* Too small a buffer: the needed length, nothing past cap. */
    memset(big, '#', sizeof(big));
    assert_int_equal(fence_encode_group(sha, enc, lay, 2, big, 10), n);
    assert_int_equal(big[10], '#');
}

/* Writes under the same locks and tokens go as one transaction: WATCH on the marks, the check
 * (always with its body), MULTI, the commands as the client sent them, EXEC. Nothing raises a
 * mark: the check requires each to equal its token. */
static void test_encode_txn(void **state)
{
    (void)state;
    const char sha[41] = "0123456789012345678901234567890123456789";
    /* A SET under a (token 7), an INCR under a (7), then under b (7), then under a (8). */
    struct fence_decision d[4];
    memset(d, 0, sizeof(d));
    for (int i = 0; i < 4; i++) {
        d[i].nlocks = 1;
        memcpy(d[i].locks[0].name, i == 2 ? "b" : "a", 1);
        d[i].locks[0].len = 1;
        d[i].locks[0].token = i == 3 ? 8 : 7;
    }
    const char *argv[4][3] = {{"SET", "k", ""}, {"INCR", "n"}, {"INCR", "n"}, {"INCR", "n"}};
    size_t lens[4][3] = {{3, 1, 0}, {4, 1}, {4, 1}, {4, 1}}, argc[4] = {3, 2, 2, 2};
    char enc[1024];
    struct fence_layout lay[4];
    size_t off = 0;
    for (int i = 0; i < 4; i++) {
        size_t n = fence_encode_write(sha, &d[i], argv[i], lens[i], argc[i], enc + off,
                                      sizeof(enc) - off, &lay[i]);
        assert_int_equal(lay[i].start, 0);
        assert_int_equal(lay[i].argc, argc[i]);
        fence_layout_shift(&lay[i], off); /* as the caller rebases them */
        off += n;
    }
    assert_true(fence_same_locks(enc, &lay[0], enc, &lay[1]));
    assert_false(fence_same_locks(enc, &lay[0], enc, &lay[2])); /* another lock */
    assert_false(fence_same_locks(enc, &lay[0], enc, &lay[3])); /* another token */

    char buf[4096];
    size_t n = fence_encode_txn(enc, lay, 2, buf, sizeof(buf)), pos = 0;
    assert_true(n > 0 && n < sizeof(buf));
    const char *watch[] = {"WATCH", "fencegate:hwm:{a}"};
    const char *check[] = {"EVAL", fence_txn_check_script(), "1", "fencegate:hwm:{a}", "1", "", "7",
                           "a"};
    const char *multi[] = {"MULTI"}, *exec[] = {"EXEC"};
    const char *set[] = {"SET", "k", ""}, *incr[] = {"INCR", "n"};
    assert_command(buf, n, &pos, watch, ARRAY_LEN(watch));
    assert_command(buf, n, &pos, check, ARRAY_LEN(check));
    assert_command(buf, n, &pos, multi, ARRAY_LEN(multi));
    assert_command(buf, n, &pos, set, ARRAY_LEN(set));
    assert_command(buf, n, &pos, incr, ARRAY_LEN(incr));
    assert_command(buf, n, &pos, exec, ARRAY_LEN(exec));
    assert_int_equal(pos, n);

    /* Too small a buffer: the needed length, nothing past cap. */
    memset(buf, '#', sizeof(buf));
    assert_int_equal(fence_encode_txn(enc, lay, 2, buf, 10),
                     fence_encode_txn(enc, lay, 2, NULL, 0));
    assert_int_equal(buf[10], '#');

    /* With owners: the same lock and token under two owners (a grant repeated after a failover)
     * are not the same locks; WATCH takes the marks alone, the check the lock keys too. */
    const struct fence_owner own[2] = {{"fencegate:lock:", 15, "u:1", 3},
                                       {"fencegate:lock:", 15, "u:2", 3}};
    const int who[3] = {0, 0, 1};
    off = 0;
    for (int i = 0; i < 3; i++) {
        d[1].owner = &own[who[i]];
        size_t m = fence_encode_write(sha, &d[1], argv[1], lens[1], argc[1], enc + off,
                                      sizeof(enc) - off, &lay[i]);
        fence_layout_shift(&lay[i], off);
        off += m;
    }
    assert_true(fence_same_locks(enc, &lay[0], enc, &lay[1]));
    assert_false(fence_same_locks(enc, &lay[0], enc, &lay[2]));
    n = fence_encode_txn(enc, lay, 2, buf, sizeof(buf));
    pos = 0;
    const char *check_own[] = {"EVAL",
                               fence_txn_check_script(),
                               "2",
                               "fencegate:hwm:{a}",
                               "fencegate:lock:{a}",
                               "1",
                               "u:1",
                               "7",
                               "a"};
    assert_command(buf, n, &pos, watch, ARRAY_LEN(watch));
    assert_command(buf, n, &pos, check_own, ARRAY_LEN(check_own));
    assert_command(buf, n, &pos, multi, ARRAY_LEN(multi));
    assert_command(buf, n, &pos, incr, ARRAY_LEN(incr));
    assert_command(buf, n, &pos, incr, ARRAY_LEN(incr));
    assert_command(buf, n, &pos, exec, ARRAY_LEN(exec));
    assert_int_equal(pos, n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_glob_table),
        cmocka_unit_test(test_glob_no_blowup),
        cmocka_unit_test(test_template_expansion),
        cmocka_unit_test(test_template_rejected),
        cmocka_unit_test(test_rules_order),
        cmocka_unit_test(test_hash_tag),
        cmocka_unit_test(test_lock_overflow),
        cmocka_unit_test(test_decide_table),
        cmocka_unit_test(test_decide_overlong_lock),
        cmocka_unit_test(test_sha1_vectors),
        cmocka_unit_test(test_hwm_key),
        cmocka_unit_test(test_encode_write),
        cmocka_unit_test(test_encode_write_db),
        cmocka_unit_test(test_encode_write_token_zero_and_no_locks),
        cmocka_unit_test(test_encode_group),
        cmocka_unit_test(test_encode_txn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
