/* test_etcdpb.c — unit tests of the etcd v3 protobuf codec: golden request bytes, real etcd 3.4
 * responses (tests/unit/fixtures/etcd), malformed and truncated input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "etcdpb.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define SL(lit)      ((struct etcdpb_slice){(const uint8_t *)(lit), sizeof(lit) - 1})

/* The fixtures' cluster: one member, one lease (see fixtures/etcd/README.md). */
#define FX_CLUSTER_ID 0xd1cfaf999eb97a2aull
#define FX_MEMBER_ID  0xbdae9bbc11dd390dull
#define FX_LEASE_ID   0x390da2153d888706ll

/* ---- Helpers ------------------------------------------------------------------------------- */

/* A heap copy of exactly n bytes, so that AddressSanitizer traps any read past the end. */
static uint8_t *exact_copy(const uint8_t *s, size_t n)
{
    uint8_t *p = malloc(n > 0 ? n : 1);
    assert_non_null(p);
    if (n > 0)
        memcpy(p, s, n);
    return p;
}

static uint8_t *load_fixture(const char *name, size_t *n)
{
    char path[512];
    uint8_t tmp[4096];
    FILE *f;

    snprintf(path, sizeof(path), "%s/etcd/%s", FG_FIXTURES, name);
    f = fopen(path, "rb");
    if (f == NULL)
        fail_msg("cannot open fixture %s", path);
    *n = fread(tmp, 1, sizeof(tmp), f);
    assert_true(feof(f));
    fclose(f);
    return exact_copy(tmp, *n);
}

static void assert_slice(struct etcdpb_slice s, const char *want)
{
    size_t n = strlen(want);
    assert_int_equal(s.n, n);
    if (n > 0)
        assert_memory_equal(s.p, want, n);
}

static void assert_buf(const struct etcdpb_buf *b, const uint8_t *want, size_t n)
{
    assert_int_equal(b->oom, 0);
    assert_int_equal(b->len, n);
    if (n > 0)
        assert_memory_equal(b->p, want, n);
}

static void assert_fixture_header(const struct etcdpb_header *h, int64_t revision)
{
    assert_true(h->cluster_id == FX_CLUSTER_ID);
    assert_true(h->member_id == FX_MEMBER_ID);
    assert_true(h->revision == revision);
    assert_true(h->raft_term == 2);
}

/* A test-side protobuf field reader, written independently of the codec, for checking what the
 * encoders produce. Returns 1 with the field, 0 at the end; fails the test on malformed bytes. */
struct tfield {
    unsigned num, wt;
    uint64_t v;
    const uint8_t *p;
    size_t n;
};

static uint64_t t_varint(const uint8_t *p, size_t n, size_t *off)
{
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 64; shift += 7) {
        assert_true(*off < n);
        v |= (uint64_t)(p[*off] & 0x7f) << shift;
        if (p[(*off)++] < 0x80)
            return v;
    }
    fail_msg("varint too long");
    return 0;
}

static int t_next(const uint8_t *p, size_t n, size_t *off, struct tfield *f)
{
    uint64_t tag;
    if (*off >= n)
        return 0;
    tag = t_varint(p, n, off);
    f->num = (unsigned)(tag >> 3);
    f->wt = (unsigned)(tag & 7);
    f->v = 0;
    f->p = NULL;
    f->n = 0;
    if (f->wt == 0) {
        f->v = t_varint(p, n, off);
    } else if (f->wt == 2) {
        f->n = (size_t)t_varint(p, n, off);
        assert_true(f->n <= n - *off);
        f->p = p + *off;
        *off += f->n;
    } else {
        fail_msg("unexpected wire type %u", f->wt);
    }
    return 1;
}

/* ---- Golden request bytes ------------------------------------------------------------------ */

static void test_golden_range_req(void **state)
{
    struct etcdpb_buf b = {0};
    struct etcdpb_range_req r = {0};
    static const uint8_t want[] = {0x0a, 0x01, 'a', 0x12, 0x01, 'b', 0x18, 0x0a, 0x38, 0x01};
    static const uint8_t want_all[] = {
        0x0a, 0x01, 'k',  0x12, 0x01, 'l',  0x18, 0x02, 0x20, 0xff, 0xff, 0xff, 0xff,
        0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x28, 0x02, 0x30, 0x03, 0x38, 0x01, 0x40,
        0x01, 0x48, 0x01, 0x50, 0x04, 0x58, 0x05, 0x60, 0x06, 0x68, 0x96, 0x01,
    };
    (void)state;

    /* All defaults: proto3 sends nothing. */
    assert_int_equal(etcdpb_range_req_encode(&b, &r), 0);
    assert_int_equal(b.len, 0);

    r.key = SL("a");
    r.range_end = SL("b");
    r.limit = 10;
    r.serializable = 7; /* any non-zero is true, sent as 1 */
    assert_int_equal(etcdpb_range_req_encode(&b, &r), 0);
    assert_buf(&b, want, sizeof(want));

    /* Every field 1..13, a negative revision as ten bytes, a two-byte varint. */
    etcdpb_buf_reset(&b);
    r = (struct etcdpb_range_req){
        .key = SL("k"),
        .range_end = SL("l"),
        .limit = 2,
        .revision = -1,
        .sort_order = ETCDPB_SORT_DESCEND,
        .sort_target = ETCDPB_SORT_MOD,
        .serializable = 1,
        .keys_only = 1,
        .count_only = 1,
        .min_mod_revision = 4,
        .max_mod_revision = 5,
        .min_create_revision = 6,
        .max_create_revision = 150,
    };
    assert_int_equal(etcdpb_range_req_encode(&b, &r), 0);
    assert_buf(&b, want_all, sizeof(want_all));
    etcdpb_buf_free(&b);
    etcdpb_buf_free(&b); /* freeing twice is harmless */
}

static void test_golden_put_delete_req(void **state)
{
    struct etcdpb_buf b = {0};
    struct etcdpb_put_req p = {.key = SL("k"), .value = SL("v"), .lease = 0x10, .prev_kv = 1};
    struct etcdpb_delete_req d = {.key = SL("k"), .range_end = SL("l"), .prev_kv = 1};
    static const uint8_t want_put[] = {0x0a, 0x01, 'k', 0x12, 0x01, 'v', 0x18, 0x10, 0x20, 0x01};
    static const uint8_t want_del[] = {0x0a, 0x01, 'k', 0x12, 0x01, 'l', 0x18, 0x01};
    (void)state;

    assert_int_equal(etcdpb_put_req_encode(&b, &p), 0);
    assert_buf(&b, want_put, sizeof(want_put));
    etcdpb_buf_reset(&b);
    assert_int_equal(etcdpb_delete_req_encode(&b, &d), 0);
    assert_buf(&b, want_del, sizeof(want_del));
    etcdpb_buf_free(&b);
}

static void test_golden_txn_req(void **state)
{
    struct etcdpb_buf b = {0};
    /* "create the key if it does not exist": the operand 0 must be on the wire (field 5), or
     * etcd would see no target_union member at all. */
    struct etcdpb_compare cmp = {
        .result = ETCDPB_CMP_EQUAL, .target = ETCDPB_TARGET_CREATE, .key = SL("k"), .number = 0};
    struct etcdpb_op success = {.kind = ETCDPB_OP_PUT,
                                .u.put = {.key = SL("k"), .value = SL("v"), .lease = 0x10}};
    struct etcdpb_op failure = {.kind = ETCDPB_OP_RANGE, .u.range = {.key = SL("k")}};
    static const uint8_t want[] = {
        0x0a, 0x07, 0x10, 0x01, 0x1a, 0x01, 'k', 0x28, 0x00,                  /* compare */
        0x12, 0x0a, 0x12, 0x08, 0x0a, 0x01, 'k', 0x12, 0x01, 'v', 0x18, 0x10, /* success */
        0x1a, 0x05, 0x0a, 0x03, 0x0a, 0x01, 'k',                              /* failure */
    };
    (void)state;

    assert_int_equal(etcdpb_txn_req_encode(&b, &cmp, 1, &success, 1, &failure, 1), 0);
    assert_buf(&b, want, sizeof(want));
    etcdpb_buf_free(&b);
}

static void test_golden_compare_operands(void **state)
{
    struct etcdpb_buf b = {0};
    struct etcdpb_op del = {.kind = ETCDPB_OP_DELETE, .u.del = {.key = SL("k")}};
    struct {
        struct etcdpb_compare c;
        uint8_t want[16];
        size_t n;
    } cases[] = {
        /* version == 0 (field 4) */
        {{.target = ETCDPB_TARGET_VERSION, .key = SL("k")},
         {0x0a, 0x05, 0x1a, 0x01, 'k', 0x20, 0x00},
         7},
        /* mod_revision < 9 (field 6) */
        {{.result = ETCDPB_CMP_LESS, .target = ETCDPB_TARGET_MOD, .key = SL("k"), .number = 9},
         {0x0a, 0x09, 0x08, 0x02, 0x10, 0x02, 0x1a, 0x01, 'k', 0x30, 0x09},
         11},
        /* value == "" (field 7, present though empty) */
        {{.target = ETCDPB_TARGET_VALUE, .key = SL("k")},
         {0x0a, 0x07, 0x10, 0x03, 0x1a, 0x01, 'k', 0x3a, 0x00},
         9},
        /* lease != 0 (field 8) over [k, l): range_end is field 64, a two-byte tag */
        {{.result = ETCDPB_CMP_NOT_EQUAL,
          .target = ETCDPB_TARGET_LEASE,
          .key = SL("k"),
          .range_end = SL("l")},
         {0x0a, 0x0d, 0x08, 0x03, 0x10, 0x04, 0x1a, 0x01, 'k', 0x40, 0x00, 0x82, 0x04, 0x01, 'l'},
         15},
    };
    (void)state;

    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        static const uint8_t del_op[] = {0x12, 0x05, 0x1a, 0x03, 0x0a, 0x01, 'k'};
        uint8_t want[32];
        etcdpb_buf_reset(&b);
        assert_int_equal(etcdpb_txn_req_encode(&b, &cases[i].c, 1, &del, 1, NULL, 0), 0);
        memcpy(want, cases[i].want, cases[i].n);
        memcpy(want + cases[i].n, del_op, sizeof(del_op));
        assert_buf(&b, want, cases[i].n + sizeof(del_op));
    }
    etcdpb_buf_free(&b);
}

static void test_golden_lease(void **state)
{
    struct etcdpb_buf b = {0};
    static const uint8_t grant[] = {0x08, 0x0a};
    static const uint8_t grant_neg[] = {0x08, 0x0a, 0x10, 0xff, 0xff, 0xff, 0xff,
                                        0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    static const uint8_t id[] = {0x08, 0xb4, 0x24};
    (void)state;

    assert_int_equal(etcdpb_lease_grant_req_encode(&b, 10, 0), 0);
    assert_buf(&b, grant, sizeof(grant));
    etcdpb_buf_reset(&b);
    assert_int_equal(etcdpb_lease_grant_req_encode(&b, 10, -1), 0);
    assert_buf(&b, grant_neg, sizeof(grant_neg));
    etcdpb_buf_reset(&b);
    assert_int_equal(etcdpb_lease_revoke_req_encode(&b, 0x1234), 0);
    assert_buf(&b, id, sizeof(id));
    etcdpb_buf_reset(&b);
    assert_int_equal(etcdpb_lease_keepalive_req_encode(&b, 0x1234), 0);
    assert_buf(&b, id, sizeof(id));
    etcdpb_buf_free(&b);
}

static void test_golden_auth(void **state)
{
    struct etcdpb_buf b = {0};
    static const uint8_t req[] = {0x0a, 0x04, 'r', 'o', 'o', 't', 0x12, 0x02, 'p', 'w'};
    struct etcdpb_slice name = {(const uint8_t *)"root", 4}, pw = {(const uint8_t *)"pw", 2},
                        bad = {NULL, 3};
    (void)state;

    assert_int_equal(etcdpb_auth_req_encode(&b, name, pw), 0);
    assert_buf(&b, req, sizeof(req));
    etcdpb_buf_reset(&b);
    assert_int_not_equal(etcdpb_auth_req_encode(&b, name, bad), 0);
    etcdpb_buf_free(&b);
}

static void test_golden_watch(void **state)
{
    struct etcdpb_buf b = {0};
    struct etcdpb_watch_create w = {.key = SL("k"),
                                    .range_end = SL("l"),
                                    .start_revision = 5,
                                    .filters = ETCDPB_FILTER_NODELETE,
                                    .prev_kv = 1};
    static const uint8_t want[] = {0x0a, 0x0d, 0x0a, 0x01, 'k',  0x12, 0x01, 'l',
                                   0x18, 0x05, 0x2a, 0x01, 0x01, 0x30, 0x01};
    static const uint8_t want_all[] = {0x0a, 0x0b, 0x0a, 0x01, 'k',  0x20, 0x01,
                                       0x2a, 0x02, 0x00, 0x01, 0x38, 0x2a};
    static const uint8_t cancel0[] = {0x12, 0x00};
    static const uint8_t cancel5[] = {0x12, 0x02, 0x08, 0x05};
    static const uint8_t progress[] = {0x1a, 0x00};
    (void)state;

    assert_int_equal(etcdpb_watch_create_encode(&b, &w), 0);
    assert_buf(&b, want, sizeof(want));

    /* Both filters packed in one field (NOPUT = 0, NODELETE = 1), progress_notify, our own id. */
    etcdpb_buf_reset(&b);
    w = (struct etcdpb_watch_create){.key = SL("k"),
                                     .progress_notify = 1,
                                     .filters = ETCDPB_FILTER_NOPUT | ETCDPB_FILTER_NODELETE,
                                     .watch_id = 42};
    assert_int_equal(etcdpb_watch_create_encode(&b, &w), 0);
    assert_buf(&b, want_all, sizeof(want_all));

    /* The oneof member is sent even when the message inside is empty. */
    etcdpb_buf_reset(&b);
    assert_int_equal(etcdpb_watch_cancel_encode(&b, 0), 0);
    assert_buf(&b, cancel0, sizeof(cancel0));
    etcdpb_buf_reset(&b);
    assert_int_equal(etcdpb_watch_cancel_encode(&b, 5), 0);
    assert_buf(&b, cancel5, sizeof(cancel5));
    etcdpb_buf_reset(&b);
    assert_int_equal(etcdpb_watch_progress_encode(&b), 0);
    assert_buf(&b, progress, sizeof(progress));

    /* Unknown filter bits are refused and leave the buffer as it was. */
    w.filters = 4;
    assert_int_equal(etcdpb_watch_create_encode(&b, &w), -1);
    assert_buf(&b, progress, sizeof(progress));
    etcdpb_buf_free(&b);
}

/* ---- Encoder round trips and limits -------------------------------------------------------- */

/* Big values: nested lengths of one, two and three varint bytes; the test-side reader finds
 * every op's key and value where they belong. */
static void test_txn_roundtrip_large(void **state)
{
    static const size_t sizes[] = {0, 1, 100, 127, 128, 300, 16383, 16384, 70000};
    struct etcdpb_op ops[ETCDPB_TXN_MAX_OPS + 1];
    struct etcdpb_compare cmp = {.target = ETCDPB_TARGET_VALUE, .key = SL("c")};
    struct etcdpb_buf b = {0};
    uint8_t *val = malloc(70000);
    size_t off = 0, nops = 0;
    struct tfield f;
    (void)state;

    assert_non_null(val);
    for (size_t i = 0; i < 70000; i++)
        val[i] = (uint8_t)(i * 7);
    memset(ops, 0, sizeof(ops));
    for (size_t i = 0; i < ARRAY_LEN(sizes); i++) {
        ops[i].kind = ETCDPB_OP_PUT;
        ops[i].u.put.key = (struct etcdpb_slice){(const uint8_t *)"key", i % 3 + 1};
        ops[i].u.put.value = (struct etcdpb_slice){val, sizes[i]};
        ops[i].u.put.lease = -(int64_t)i;
    }
    cmp.value = (struct etcdpb_slice){val, 300};
    assert_int_equal(etcdpb_txn_req_encode(&b, &cmp, 1, ops, ARRAY_LEN(sizes), NULL, 0), 0);

    while (t_next(b.p, b.len, &off, &f)) {
        size_t o2 = 0, o3 = 0;
        struct tfield op, g;
        int64_t lease = 0;
        struct etcdpb_slice key = {0}, value = {0};
        assert_int_equal(f.wt, 2);
        if (f.num == 1) {
            size_t o = 0;
            int seen_value = 0;
            while (t_next(f.p, f.n, &o, &g)) {
                if (g.num == 7) {
                    assert_int_equal(g.n, 300);
                    assert_memory_equal(g.p, val, 300);
                    seen_value = 1;
                }
            }
            assert_true(seen_value);
            continue;
        }
        assert_int_equal(f.num, 2);
        assert_int_equal(t_next(f.p, f.n, &o2, &op), 1);
        assert_int_equal(op.num, 2); /* request_put */
        assert_int_equal(o2, f.n);
        while (t_next(op.p, op.n, &o3, &g)) {
            if (g.num == 1)
                key = (struct etcdpb_slice){g.p, g.n};
            else if (g.num == 2)
                value = (struct etcdpb_slice){g.p, g.n};
            else if (g.num == 3)
                lease = (int64_t)g.v;
        }
        assert_int_equal(key.n, nops % 3 + 1);
        assert_int_equal(value.n, sizes[nops]);
        if (value.n > 0)
            assert_memory_equal(value.p, val, value.n);
        assert_true(lease == -(int64_t)nops);
        nops++;
    }
    assert_int_equal(nops, ARRAY_LEN(sizes));
    etcdpb_buf_free(&b);
    free(val);
}

static void test_txn_limits_and_bad_args(void **state)
{
    struct etcdpb_op ops[ETCDPB_TXN_MAX_OPS + 1];
    struct etcdpb_compare cmps[ETCDPB_TXN_MAX_OPS + 1];
    struct etcdpb_buf b = {0};
    size_t before;
    (void)state;

    memset(cmps, 0, sizeof(cmps));
    for (size_t i = 0; i < ARRAY_LEN(ops); i++) {
        ops[i] = (struct etcdpb_op){.kind = ETCDPB_OP_DELETE, .u.del = {.key = SL("k")}};
        cmps[i].key = SL("k");
    }
    assert_int_equal(etcdpb_lease_grant_req_encode(&b, 5, 0), 0);
    before = b.len;

    /* 128 per list is etcd's limit; 129 in any list is refused and appends nothing. */
    assert_int_equal(etcdpb_txn_req_encode(&b, cmps, 128, ops, 128, ops, 128), 0);
    b.len = before;
    assert_int_equal(etcdpb_txn_req_encode(&b, cmps, 129, ops, 1, NULL, 0), -1);
    assert_int_equal(etcdpb_txn_req_encode(&b, cmps, 1, ops, 129, NULL, 0), -1);
    assert_int_equal(etcdpb_txn_req_encode(&b, cmps, 1, ops, 1, ops, 129), -1);
    assert_int_equal(b.len, before);

    /* A compare target or op kind outside its enum, a slice without bytes. */
    cmps[3].target = 5;
    assert_int_equal(etcdpb_txn_req_encode(&b, cmps, 4, ops, 1, NULL, 0), -1);
    cmps[3].target = -1;
    assert_int_equal(etcdpb_txn_req_encode(&b, cmps, 4, ops, 1, NULL, 0), -1);
    cmps[3].target = ETCDPB_TARGET_MOD;
    ops[2].kind = 4;
    assert_int_equal(etcdpb_txn_req_encode(&b, cmps, 4, ops, 3, NULL, 0), -1);
    ops[2].kind = ETCDPB_OP_PUT;
    ops[2].u.put = (struct etcdpb_put_req){.key = {NULL, 3}};
    assert_int_equal(etcdpb_txn_req_encode(&b, cmps, 4, ops, 3, NULL, 0), -1);
    assert_int_equal(etcdpb_txn_req_encode(&b, NULL, 1, NULL, 0, NULL, 0), -1);
    assert_int_equal(b.len, before);
    assert_int_equal(b.oom, 0);
    etcdpb_buf_free(&b);
}

/* After an allocation failure, encoders fail until etcdpb_buf_reset() clears it. */
static void test_buf_oom_flag(void **state)
{
    struct etcdpb_buf b = {0};
    static const uint8_t want[] = {0x08, 0x07};
    (void)state;

    b.oom = 1;
    assert_int_equal(etcdpb_lease_revoke_req_encode(&b, 7), -1);
    assert_int_equal(b.len, 0);
    etcdpb_buf_reset(&b);
    assert_int_equal(etcdpb_lease_revoke_req_encode(&b, 7), 0);
    assert_buf(&b, want, sizeof(want));
    etcdpb_buf_free(&b);
}

/* ---- Real etcd 3.4 responses --------------------------------------------------------------- */

static void test_fixture_range(void **state)
{
    size_t n, off = 0;
    uint8_t *p = load_fixture("range_kvs.bin", &n);
    struct etcdpb_range_resp r;
    struct etcdpb_kv kv;
    (void)state;

    assert_int_equal(etcdpb_range_resp_decode(p, n, &r), 0);
    assert_fixture_header(&r.header, 4);
    assert_int_equal(r.nkvs, 2);
    assert_int_equal(r.count, 2);
    assert_int_equal(r.more, 0);
    assert_int_equal(etcdpb_range_resp_next(&r, &off, &kv), 1);
    assert_slice(kv.key, "/fg/a");
    assert_slice(kv.value, "v1");
    assert_true(kv.create_revision == 2 && kv.mod_revision == 2 && kv.version == 1);
    assert_true(kv.lease == 0);
    assert_int_equal(etcdpb_range_resp_next(&r, &off, &kv), 1);
    assert_slice(kv.key, "/fg/b");
    assert_slice(kv.value, "hello2");
    assert_true(kv.create_revision == 3 && kv.mod_revision == 4 && kv.version == 2);
    assert_true(kv.lease == FX_LEASE_ID);
    assert_int_equal(etcdpb_range_resp_next(&r, &off, &kv), 0);
    assert_int_equal(etcdpb_range_resp_next(&r, &off, &kv), 0);
    off = n + 1;
    assert_int_equal(etcdpb_range_resp_next(&r, &off, &kv), -1);
    free(p);

    p = load_fixture("range_empty.bin", &n);
    off = 0;
    assert_int_equal(etcdpb_range_resp_decode(p, n, &r), 0);
    assert_int_equal(r.nkvs, 0);
    assert_int_equal(r.count, 0);
    assert_int_equal(etcdpb_range_resp_next(&r, &off, &kv), 0);
    free(p);
}

static void test_fixture_put_delete(void **state)
{
    size_t n;
    uint8_t *p = load_fixture("put_b_prev.bin", &n);
    struct etcdpb_put_resp pr;
    struct etcdpb_delete_resp dr;
    (void)state;

    assert_int_equal(etcdpb_put_resp_decode(p, n, &pr), 0);
    assert_fixture_header(&pr.header, 4);
    assert_int_equal(pr.has_prev_kv, 1);
    assert_slice(pr.prev_kv.key, "/fg/b");
    assert_slice(pr.prev_kv.value, "hello");
    assert_true(pr.prev_kv.lease == FX_LEASE_ID);
    free(p);

    p = load_fixture("put_a.bin", &n);
    assert_int_equal(etcdpb_put_resp_decode(p, n, &pr), 0);
    assert_fixture_header(&pr.header, 2);
    assert_int_equal(pr.has_prev_kv, 0);
    free(p);

    p = load_fixture("delete.bin", &n);
    assert_int_equal(etcdpb_delete_resp_decode(p, n, &dr), 0);
    assert_fixture_header(&dr.header, 6);
    assert_true(dr.deleted == 1);
    free(p);
}

static void test_fixture_txn(void **state)
{
    size_t n, off = 0;
    uint8_t *p = load_fixture("txn_failed.bin", &n);
    struct etcdpb_txn_resp t;
    struct etcdpb_range_resp rr;
    struct etcdpb_put_resp pr;
    struct etcdpb_delete_resp dr;
    struct etcdpb_kv kv;
    (void)state;

    /* create_revision(/fg/a) == 0 failed: the failure branch read /fg/a. */
    assert_int_equal(etcdpb_txn_resp_decode(p, n, &t), 0);
    assert_fixture_header(&t.header, 4);
    assert_int_equal(t.succeeded, 0);
    assert_int_equal(t.nresponses, 1);
    assert_int_equal(t.responses[0].kind, ETCDPB_OP_RANGE);
    assert_int_equal(etcdpb_range_resp_decode(t.responses[0].body.p, t.responses[0].body.n, &rr),
                     0);
    assert_int_equal(rr.count, 1);
    assert_int_equal(etcdpb_range_resp_next(&rr, &off, &kv), 1);
    assert_slice(kv.key, "/fg/a");
    assert_slice(kv.value, "v1");
    free(p);

    /* create_revision(/fg/new) == 0 held: put, range, delete ran. */
    p = load_fixture("txn_succeeded.bin", &n);
    assert_int_equal(etcdpb_txn_resp_decode(p, n, &t), 0);
    assert_fixture_header(&t.header, 5);
    assert_int_equal(t.succeeded, 1);
    assert_int_equal(t.nresponses, 3);
    assert_int_equal(t.responses[0].kind, ETCDPB_OP_PUT);
    assert_int_equal(etcdpb_put_resp_decode(t.responses[0].body.p, t.responses[0].body.n, &pr), 0);
    assert_true(pr.header.revision == 5);
    assert_int_equal(t.responses[1].kind, ETCDPB_OP_RANGE);
    assert_int_equal(etcdpb_range_resp_decode(t.responses[1].body.p, t.responses[1].body.n, &rr),
                     0);
    assert_int_equal(rr.nkvs, 1);
    assert_int_equal(t.responses[2].kind, ETCDPB_OP_DELETE);
    assert_int_equal(etcdpb_delete_resp_decode(t.responses[2].body.p, t.responses[2].body.n, &dr),
                     0);
    assert_true(dr.deleted == 1);
    free(p);
}

/* Txns sent as one (lock_etcd.c): the parts of a request concatenate, and the response splits
 * back into each Txn's own. */
static void test_txn_batch_parts(void **state)
{
    struct etcdpb_buf whole = {0}, parts = {0}, out = {0};
    struct etcdpb_compare cmp = {.result = ETCDPB_CMP_EQUAL,
                                 .target = ETCDPB_TARGET_CREATE,
                                 .key = {(const uint8_t *)"/fg/k", 5}};
    struct etcdpb_op ok[2], fail;
    size_t n;
    uint8_t *p;
    struct etcdpb_txn_resp *t = malloc(sizeof(*t)), *u = malloc(sizeof(*u));
    (void)state;

    assert_non_null(t);
    assert_non_null(u);
    memset(ok, 0, sizeof(ok));
    memset(&fail, 0, sizeof(fail));
    ok[0].kind = ETCDPB_OP_PUT;
    ok[0].u.put.key = cmp.key;
    ok[0].u.put.lease = 0x1234;
    ok[1].kind = ETCDPB_OP_RANGE;
    ok[1].u.range.key = cmp.key;
    fail.kind = ETCDPB_OP_DELETE;
    fail.u.del.key = cmp.key;
    assert_int_equal(etcdpb_txn_req_encode(&whole, &cmp, 1, ok, 2, &fail, 1), 0);
    assert_int_equal(etcdpb_txn_req_encode(&parts, &cmp, 1, NULL, 0, NULL, 0), 0);
    assert_int_equal(etcdpb_txn_req_encode(&parts, NULL, 0, ok, 2, NULL, 0), 0);
    assert_int_equal(etcdpb_txn_req_encode(&parts, NULL, 0, NULL, 0, &fail, 1), 0);
    assert_int_equal(parts.len, whole.len);
    assert_memory_equal(parts.p, whole.p, whole.len);
    assert_int_equal(etcdpb_buf_append(&parts, whole.p, whole.len), 0);
    assert_int_equal(parts.len, 2 * whole.len);

    /* put, range, delete at revision 5: split as [put, range] and [delete]. */
    p = load_fixture("txn_succeeded.bin", &n);
    assert_int_equal(etcdpb_txn_resp_decode(p, n, t), 0);
    assert_int_equal(etcdpb_txn_resp_slice_encode(&out, t, 0, 2), 0);
    assert_int_equal(etcdpb_txn_resp_decode(out.p, out.len, u), 0);
    assert_memory_equal(&u->header, &t->header, sizeof(t->header));
    assert_int_equal(u->succeeded, 1);
    assert_int_equal(u->nresponses, 2);
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(u->responses[i].kind, t->responses[i].kind);
        assert_int_equal(u->responses[i].body.n, t->responses[i].body.n);
        assert_memory_equal(u->responses[i].body.p, t->responses[i].body.p, t->responses[i].body.n);
    }
    etcdpb_buf_reset(&out);
    assert_int_equal(etcdpb_txn_resp_slice_encode(&out, t, 2, 1), 0);
    assert_int_equal(etcdpb_txn_resp_decode(out.p, out.len, u), 0);
    assert_true(u->header.revision == 5);
    assert_int_equal(u->nresponses, 1);
    assert_int_equal(u->responses[0].kind, ETCDPB_OP_DELETE);
    /* The whole response re-encodes to the same bytes etcd sent. */
    etcdpb_buf_reset(&out);
    assert_int_equal(etcdpb_txn_resp_slice_encode(&out, t, 0, 3), 0);
    assert_int_equal(out.len, n);
    assert_memory_equal(out.p, p, n);
    /* Out of range: -1, nothing appended. */
    etcdpb_buf_reset(&out);
    assert_int_equal(etcdpb_txn_resp_slice_encode(&out, t, 2, 2), -1);
    assert_int_equal(etcdpb_txn_resp_slice_encode(&out, t, 4, 0), -1);
    assert_int_equal(out.len, 0);
    free(p);
    free(t);
    free(u);
    etcdpb_buf_free(&whole);
    etcdpb_buf_free(&parts);
    etcdpb_buf_free(&out);
}

static void test_fixture_lease(void **state)
{
    size_t n;
    uint8_t *p = load_fixture("lease_grant.bin", &n);
    struct etcdpb_lease_grant_resp g;
    struct etcdpb_lease_keepalive_resp k;
    struct etcdpb_header h;
    (void)state;

    assert_int_equal(etcdpb_lease_grant_resp_decode(p, n, &g), 0);
    assert_fixture_header(&g.header, 1);
    assert_true(g.id == FX_LEASE_ID);
    assert_true(g.ttl == 60);
    assert_int_equal(g.error.n, 0);
    free(p);

    p = load_fixture("keepalive.bin", &n);
    assert_int_equal(etcdpb_lease_keepalive_resp_decode(p, n, &k), 0);
    assert_fixture_header(&k.header, 5);
    assert_true(k.id == FX_LEASE_ID && k.ttl == 60);
    free(p);

    /* After the revoke: etcd omits TTL, i.e. 0, "the lease is gone". */
    p = load_fixture("keepalive_gone.bin", &n);
    assert_int_equal(etcdpb_lease_keepalive_resp_decode(p, n, &k), 0);
    assert_true(k.id == FX_LEASE_ID && k.ttl <= 0);
    free(p);

    p = load_fixture("lease_revoke.bin", &n);
    assert_int_equal(etcdpb_header_only_decode(p, n, &h), 0);
    assert_fixture_header(&h, 6);
    free(p);
}

static void test_fixture_auth(void **state)
{
    size_t n;
    uint8_t *p = load_fixture("auth.bin", &n);
    struct etcdpb_auth_resp a;
    const char *dot;
    (void)state;

    assert_int_equal(etcdpb_auth_resp_decode(p, n, &a), 0);
    /* etcd's simple token: 16 random letters, '.', the auth revision */
    assert_int_equal(a.token.n, 19);
    dot = memchr(a.token.p, '.', a.token.n);
    assert_non_null(dot);
    assert_int_equal(dot - (const char *)a.token.p, 16);
    assert_memory_equal(dot, ".17", 3);
    free(p);
}

static void test_fixture_watch(void **state)
{
    size_t n, off = 0;
    uint8_t *p = load_fixture("watch_created.bin", &n);
    struct etcdpb_watch_resp w;
    struct etcdpb_event ev;
    (void)state;

    assert_int_equal(etcdpb_watch_resp_decode(p, n, &w), 0);
    assert_fixture_header(&w.header, 6);
    assert_int_equal(w.created, 1);
    assert_int_equal(w.canceled, 0);
    assert_true(w.watch_id == 0);
    assert_int_equal(w.nevents, 0);
    assert_int_equal(etcdpb_watch_resp_next(&w, &off, &ev), 0);
    free(p);

    p = load_fixture("watch_created_id42.bin", &n);
    assert_int_equal(etcdpb_watch_resp_decode(p, n, &w), 0);
    assert_int_equal(w.created, 1);
    assert_true(w.watch_id == 42);
    free(p);

    p = load_fixture("watch_delete_event.bin", &n);
    off = 0;
    assert_int_equal(etcdpb_watch_resp_decode(p, n, &w), 0);
    assert_int_equal(w.created, 0);
    assert_int_equal(w.nevents, 1);
    assert_int_equal(etcdpb_watch_resp_next(&w, &off, &ev), 1);
    assert_int_equal(ev.type, ETCDPB_EVENT_DELETE);
    assert_slice(ev.kv.key, "/fg/a");
    assert_true(ev.kv.mod_revision == 6);
    assert_int_equal(ev.kv.value.n, 0);
    assert_int_equal(ev.has_prev_kv, 1);
    assert_slice(ev.prev_kv.value, "v1");
    assert_true(ev.prev_kv.create_revision == 2);
    assert_int_equal(etcdpb_watch_resp_next(&w, &off, &ev), 0);
    free(p);

    /* A watch id the client chose (9) and a 300-byte prev_kv value: two-byte lengths. */
    p = load_fixture("watch_delete_prev_big.bin", &n);
    off = 0;
    assert_int_equal(etcdpb_watch_resp_decode(p, n, &w), 0);
    assert_true(w.watch_id == 9);
    assert_int_equal(etcdpb_watch_resp_next(&w, &off, &ev), 1);
    assert_int_equal(ev.type, ETCDPB_EVENT_DELETE);
    assert_slice(ev.kv.key, "/e2e/k");
    assert_int_equal(ev.prev_kv.value.n, 300);
    assert_int_equal(ev.prev_kv.value.p[0], 'z');
    assert_int_equal(ev.prev_kv.value.p[299], 'z');
    free(p);
}

/* ---- Malformed input ----------------------------------------------------------------------- */

/* Runs every decoder (and both iterators to the end) over p[0..n); returns how many accepted. */
static int decode_all(const uint8_t *p, size_t n)
{
    struct etcdpb_range_resp rr;
    struct etcdpb_put_resp pr;
    struct etcdpb_delete_resp dr;
    struct etcdpb_txn_resp *tr = malloc(sizeof(*tr));
    struct etcdpb_lease_grant_resp gr;
    struct etcdpb_lease_keepalive_resp kr;
    struct etcdpb_header h;
    struct etcdpb_auth_resp ar;
    struct etcdpb_watch_resp wr;
    struct etcdpb_kv kv;
    struct etcdpb_event ev;
    size_t off;
    int ok = 0, rc;

    assert_non_null(tr);
    if (etcdpb_range_resp_decode(p, n, &rr) == 0) {
        size_t count = 0;
        ok++;
        off = 0;
        while ((rc = etcdpb_range_resp_next(&rr, &off, &kv)) == 1)
            count++;
        assert_int_equal(rc, 0);
        assert_int_equal(count, rr.nkvs);
    }
    ok += etcdpb_put_resp_decode(p, n, &pr) == 0;
    ok += etcdpb_delete_resp_decode(p, n, &dr) == 0;
    if (etcdpb_txn_resp_decode(p, n, tr) == 0) {
        ok++;
        assert_true(tr->nresponses <= ETCDPB_TXN_MAX_OPS);
        for (size_t i = 0; i < tr->nresponses; i++) {
            const struct etcdpb_slice *s = &tr->responses[i].body;
            assert_true(s->n == 0 || (s->p >= p && s->p + s->n <= p + n));
            if (tr->responses[i].kind == ETCDPB_OP_RANGE)
                assert_int_equal(etcdpb_range_resp_decode(s->p, s->n, &rr), 0);
            else if (tr->responses[i].kind == ETCDPB_OP_PUT)
                assert_int_equal(etcdpb_put_resp_decode(s->p, s->n, &pr), 0);
            else
                assert_int_equal(etcdpb_delete_resp_decode(s->p, s->n, &dr), 0);
        }
    }
    ok += etcdpb_lease_grant_resp_decode(p, n, &gr) == 0;
    ok += etcdpb_lease_keepalive_resp_decode(p, n, &kr) == 0;
    ok += etcdpb_header_only_decode(p, n, &h) == 0;
    if (etcdpb_auth_resp_decode(p, n, &ar) == 0) {
        ok++;
        assert_true(ar.token.n == 0 || (ar.token.p >= p && ar.token.p + ar.token.n <= p + n));
    }
    if (etcdpb_watch_resp_decode(p, n, &wr) == 0) {
        size_t count = 0;
        ok++;
        off = 0;
        while ((rc = etcdpb_watch_resp_next(&wr, &off, &ev)) == 1)
            count++;
        assert_int_equal(rc, 0);
        assert_int_equal(count, wr.nevents);
    }
    free(tr);
    return ok;
}

/* Every prefix of every fixture, in a buffer of exactly its length: each decoder accepts it or
 * rejects it, never reading past the end (ASan builds trap that). A cut inside the leading
 * header is always rejected by the decoders that read the header. */
static void test_truncations(void **state)
{
    static const char *names[] = {
        "auth.bin",
        "delete.bin",
        "keepalive.bin",
        "keepalive_gone.bin",
        "lease_grant.bin",
        "lease_revoke.bin",
        "put_a.bin",
        "put_b.bin",
        "put_b_prev.bin",
        "range_empty.bin",
        "range_kvs.bin",
        "txn_failed.bin",
        "txn_succeeded.bin",
        "watch_created.bin",
        "watch_created_id42.bin",
        "watch_delete_event.bin",
        "watch_delete_prev_big.bin",
    };
    (void)state;

    for (size_t i = 0; i < ARRAY_LEN(names); i++) {
        size_t n;
        uint8_t *full = load_fixture(names[i], &n);
        struct etcdpb_header h;
        assert_true(decode_all(full, n) >= 1);
        for (size_t cut = 0; cut < n; cut++) {
            uint8_t *p = exact_copy(full, cut);
            decode_all(p, cut);
            /* Every fixture starts with a 28-byte header field (0x0a 0x1a ...). */
            if (cut > 0 && cut < 28)
                assert_int_equal(etcdpb_header_only_decode(p, cut, &h), -1);
            free(p);
        }
        free(full);
    }
}

static void test_unknown_fields_skipped(void **state)
{
    /* A RangeResponse with unknown fields of every skippable wire type at both levels: varint
     * field 99, fixed64 field 100, bytes field 101, fixed32 field 102, and in the kv field 20
     * (fixed64) and field 7 (bytes). */
    static const uint8_t msg[] = {
        0x98, 0x06, 0x81, 0x01,                                    /* 99: varint 129 */
        0x0a, 0x02, 0x18, 0x07,                                    /* header{revision 7} */
        0xa1, 0x06, 1,    2,    3,    4,    5,    6,   7,    8,    /* 100: fixed64 */
        0x12, 0x12, 0x0a, 0x01, 'k',  0xa1, 0x01, 0,   0,    0,    /* kv{key "k", 20: f64 */
        0,    0,    0,    0,    0,    0x3a, 0x01, 'x', 0x18, 0x03, /*   7: "x", mod 3} */
        0xaa, 0x06, 0x02, 0x0a, 0x00,                              /* 101: bytes */
        0xb5, 0x06, 1,    2,    3,    4,                           /* 102: fixed32 */
        0x20, 0x01,                                                /* count 1 */
    };
    uint8_t *p = exact_copy(msg, sizeof(msg));
    struct etcdpb_range_resp r;
    struct etcdpb_kv kv;
    size_t off = 0;
    (void)state;

    assert_int_equal(etcdpb_range_resp_decode(p, sizeof(msg), &r), 0);
    assert_true(r.header.revision == 7);
    assert_int_equal(r.nkvs, 1);
    assert_true(r.count == 1);
    assert_int_equal(etcdpb_range_resp_next(&r, &off, &kv), 1);
    assert_slice(kv.key, "k");
    assert_true(kv.mod_revision == 3);
    assert_int_equal(etcdpb_range_resp_next(&r, &off, &kv), 0);
    free(p);
}

struct bad_case {
    const char *what;
    uint8_t b[24];
    size_t n;
};

static void test_malformed_rejected(void **state)
{
    static const struct bad_case cases[] = {
        {"group start (wire type 3)", {0x9b, 0x06}, 2},
        {"group end (wire type 4)", {0x9c, 0x06}, 2},
        {"wire type 6", {0x9e, 0x06, 0x00}, 3},
        {"wire type 7", {0x9f, 0x06, 0x00}, 3},
        {"field number 0", {0x00, 0x01}, 2},
        {"truncated tag", {0x98}, 1},
        {"truncated varint", {0x98, 0x06, 0x81}, 3},
        {"truncated fixed64", {0xa1, 0x06, 1, 2, 3, 4, 5, 6, 7}, 9},
        {"truncated fixed32", {0xb5, 0x06, 1, 2, 3}, 5},
        {"length past the end", {0xaa, 0x06, 0x03, 0x00, 0x00}, 5},
        {"length of 2^63",
         {0xaa, 0x06, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01},
         12},
        {"varint of eleven bytes",
         {0x98, 0x06, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00},
         13},
        {"varint of more than 64 bits",
         {0x98, 0x06, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02},
         12},
        {"header sent as a varint", {0x08, 0x01}, 2},
        {"bad field inside the header", {0x0a, 0x02, 0x1b, 0x00}, 4},
        {"header length past its parent", {0x0a, 0x05, 0x18, 0x01}, 4},
    };
    (void)state;

    for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
        uint8_t *p = exact_copy(cases[i].b, cases[i].n);
        if (decode_all(p, cases[i].n) != 0)
            fail_msg("accepted: %s", cases[i].what);
        free(p);
    }
}

static void test_negative_int64_and_max_varint(void **state)
{
    /* LeaseGrantResponse{ID: -1, TTL: INT64_MIN}, then KeyValue{lease: INT64_MAX} in a put. */
    static const uint8_t grant[] = {
        0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        0x18, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01,
    };
    static const uint8_t put[] = {
        0x12, 0x0a, 0x30, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0x0a,
        0x0b, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
    };
    /* An enum that is negative on the wire (an Event type of -1). */
    static const uint8_t watch[] = {0x5a, 0x0b, 0x08, 0xff, 0xff, 0xff, 0xff,
                                    0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    struct etcdpb_lease_grant_resp g;
    struct etcdpb_put_resp pr;
    struct etcdpb_watch_resp w;
    struct etcdpb_event ev;
    size_t off = 0;
    uint8_t *p;
    (void)state;

    p = exact_copy(grant, sizeof(grant));
    assert_int_equal(etcdpb_lease_grant_resp_decode(p, sizeof(grant), &g), 0);
    assert_true(g.id == -1);
    assert_true(g.ttl == INT64_MIN);
    free(p);

    p = exact_copy(put, sizeof(put));
    assert_int_equal(etcdpb_put_resp_decode(p, sizeof(put), &pr), 0);
    assert_true(pr.prev_kv.lease == INT64_MAX);
    assert_true(pr.header.cluster_id == UINT64_MAX);
    free(p);

    p = exact_copy(watch, sizeof(watch));
    assert_int_equal(etcdpb_watch_resp_decode(p, sizeof(watch), &w), 0);
    assert_int_equal(etcdpb_watch_resp_next(&w, &off, &ev), 1);
    assert_int_equal(ev.type, -1);
    free(p);
}

/* Builds a TxnResponse of n ResponseOps, each `op` (bytes of one ResponseOp body). */
static uint8_t *txn_with(size_t n, const uint8_t *op, size_t oplen, size_t *len)
{
    uint8_t *p = malloc(2 + n * (2 + oplen));
    size_t o = 0;
    assert_non_null(p);
    p[o++] = 0x10; /* succeeded */
    p[o++] = 0x01;
    for (size_t i = 0; i < n; i++) {
        p[o++] = 0x1a;
        p[o++] = (uint8_t)oplen;
        if (oplen > 0)
            memcpy(p + o, op, oplen);
        o += oplen;
    }
    *len = o;
    return p;
}

static void test_txn_resp_limits(void **state)
{
    static const uint8_t put_op[] = {0x12, 0x00};
    static const uint8_t txn_op[] = {0x22, 0x00};
    static const uint8_t bad_body[] = {0x0a, 0x02, 0x0a, 0x05};
    static const uint8_t two_members[] = {0x22, 0x00, 0x1a, 0x02, 0x10, 0x03};
    struct etcdpb_txn_resp *t = malloc(sizeof(*t));
    size_t len;
    uint8_t *p;
    (void)state;

    assert_non_null(t);
    p = txn_with(ETCDPB_TXN_MAX_OPS, put_op, sizeof(put_op), &len);
    assert_int_equal(etcdpb_txn_resp_decode(p, len, t), 0);
    assert_int_equal(t->nresponses, ETCDPB_TXN_MAX_OPS);
    assert_int_equal(t->responses[127].kind, ETCDPB_OP_PUT);
    free(p);

    p = txn_with(ETCDPB_TXN_MAX_OPS + 1, put_op, sizeof(put_op), &len);
    assert_int_equal(etcdpb_txn_resp_decode(p, len, t), -1);
    assert_int_equal(t->nresponses, 0);
    free(p);

    p = txn_with(1, txn_op, sizeof(txn_op), &len); /* a nested Txn response */
    assert_int_equal(etcdpb_txn_resp_decode(p, len, t), -1);
    free(p);
    p = txn_with(1, NULL, 0, &len); /* a ResponseOp with nothing set */
    assert_int_equal(etcdpb_txn_resp_decode(p, len, t), -1);
    free(p);
    p = txn_with(1, bad_body, sizeof(bad_body), &len); /* a range body that is malformed */
    assert_int_equal(etcdpb_txn_resp_decode(p, len, t), -1);
    free(p);
    p = txn_with(1, two_members, sizeof(two_members), &len); /* a Txn member, then a delete */
    assert_int_equal(etcdpb_txn_resp_decode(p, len, t), -1);
    free(p);
    free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_range_req),
        cmocka_unit_test(test_golden_put_delete_req),
        cmocka_unit_test(test_golden_txn_req),
        cmocka_unit_test(test_golden_compare_operands),
        cmocka_unit_test(test_golden_lease),
        cmocka_unit_test(test_golden_auth),
        cmocka_unit_test(test_golden_watch),
        cmocka_unit_test(test_txn_roundtrip_large),
        cmocka_unit_test(test_txn_limits_and_bad_args),
        cmocka_unit_test(test_buf_oom_flag),
        cmocka_unit_test(test_fixture_range),
        cmocka_unit_test(test_fixture_put_delete),
        cmocka_unit_test(test_fixture_txn),
        cmocka_unit_test(test_fixture_lease),
        cmocka_unit_test(test_fixture_auth),
        cmocka_unit_test(test_fixture_watch),
        cmocka_unit_test(test_truncations),
        cmocka_unit_test(test_unknown_fields_skipped),
        cmocka_unit_test(test_malformed_rejected),
        cmocka_unit_test(test_negative_int64_and_max_varint),
        cmocka_unit_test(test_txn_resp_limits),
        cmocka_unit_test(test_txn_batch_parts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
