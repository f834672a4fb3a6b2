/* fuzz_etcdpb.c — libFuzzer target: every etcd response decoder and iterator stays inside its
 * input and keeps its promises, and what they decode re-encodes into well-formed requests. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "etcdpb.h"

#define FUZZ_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            abort();                                                                               \
    } while (0)

static const uint8_t *in_p;
static size_t in_n;

/* A slice a decoder returned lies inside the input. */
static void fuzz_inside(struct etcdpb_slice s)
{
    if (s.n == 0)
        return;
    FUZZ_CHECK(s.p >= in_p && s.n <= in_n && (size_t)(s.p - in_p) <= in_n - s.n);
}

static void fuzz_kv_inside(const struct etcdpb_kv *kv)
{
    fuzz_inside(kv->key);
    fuzz_inside(kv->value);
}

/* An independent reader for what the encoders wrote: one field at a time, aborting on anything
 * but a well-formed varint or length-delimited field (the only wire types requests use). */
struct fuzz_field {
    unsigned num, wt;
    uint64_t v;
    const uint8_t *p;
    size_t n;
};

static uint64_t fuzz_varint(const uint8_t *p, size_t n, size_t *off)
{
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 70; shift += 7) {
        FUZZ_CHECK(*off < n);
        v |= (uint64_t)(p[*off] & 0x7f) << shift;
        if (p[(*off)++] < 0x80)
            return v;
    }
    abort();
}

static int fuzz_next(const uint8_t *p, size_t n, size_t *off, struct fuzz_field *f)
{
    uint64_t tag;
    if (*off >= n)
        return 0;
    tag = fuzz_varint(p, n, off);
    f->num = (unsigned)(tag >> 3);
    f->wt = (unsigned)(tag & 7);
    f->v = 0;
    f->p = NULL;
    f->n = 0;
    FUZZ_CHECK(f->num > 0);
    if (f->wt == 0) {
        f->v = fuzz_varint(p, n, off);
    } else {
        FUZZ_CHECK(f->wt == 2);
        f->n = (size_t)fuzz_varint(p, n, off);
        FUZZ_CHECK(f->n <= n - *off);
        f->p = p + *off;
        *off += f->n;
    }
    return 1;
}

static void fuzz_walk(const uint8_t *p, size_t n)
{
    struct fuzz_field f;
    size_t off = 0;
    while (fuzz_next(p, n, &off, &f))
        ;
}

static int fuzz_slice_eq(const struct fuzz_field *f, struct etcdpb_slice s)
{
    return f->n == s.n && (s.n == 0 || memcmp(f->p, s.p, s.n) == 0);
}

/* Re-encodes a decoded kv as the requests a lock backend builds from one, and checks them. */
static void fuzz_reencode_kv(const struct etcdpb_kv *kv)
{
    struct etcdpb_buf b = {0};
    struct etcdpb_compare cmp = {
        .result = (int)((uint64_t)kv->version % 4),
        .target = (int)((uint64_t)kv->create_revision % 5),
        .key = kv->key,
        .range_end = kv->value,
        .number = kv->mod_revision,
        .value = kv->value,
    };
    struct etcdpb_op ops[3] = {
        {.kind = ETCDPB_OP_PUT,
         .u.put = {.key = kv->key, .value = kv->value, .lease = kv->lease, .prev_kv = 1}},
        {.kind = ETCDPB_OP_RANGE,
         .u.range = {.key = kv->key,
                     .range_end = kv->value,
                     .revision = kv->mod_revision,
                     .limit = kv->version,
                     .min_create_revision = kv->create_revision}},
        {.kind = ETCDPB_OP_DELETE, .u.del = {.key = kv->key, .range_end = kv->value}},
    };
    struct etcdpb_watch_create w = {.key = kv->key,
                                    .range_end = kv->value,
                                    .start_revision = kv->create_revision,
                                    .filters = (unsigned)kv->version & 3,
                                    .prev_kv = 1,
                                    .watch_id = kv->lease};
    struct fuzz_field f, op, g;
    size_t off = 0, nput = 0;

    FUZZ_CHECK(etcdpb_txn_req_encode(&b, &cmp, 1, ops, 3, &ops[2], 1) == 0);
    /* Top level: compare, three success ops, one failure op; the put carries the kv's bytes. */
    while (fuzz_next(b.p, b.len, &off, &f)) {
        size_t o2 = 0, o3 = 0;
        FUZZ_CHECK(f.wt == 2 && f.num >= 1 && f.num <= 3);
        if (f.num == 1) {
            fuzz_walk(f.p, f.n);
            continue;
        }
        FUZZ_CHECK(fuzz_next(f.p, f.n, &o2, &op) == 1 && o2 == f.n);
        FUZZ_CHECK(op.wt == 2 && op.num >= 1 && op.num <= 3);
        if (op.num != 2) {
            fuzz_walk(op.p, op.n);
            continue;
        }
        nput++;
        while (fuzz_next(op.p, op.n, &o3, &g)) {
            if (g.num == 1)
                FUZZ_CHECK(fuzz_slice_eq(&g, kv->key));
            if (g.num == 2)
                FUZZ_CHECK(fuzz_slice_eq(&g, kv->value));
            if (g.num == 3)
                FUZZ_CHECK((int64_t)g.v == kv->lease);
        }
    }
    FUZZ_CHECK(nput == 1);

    etcdpb_buf_reset(&b);
    FUZZ_CHECK(etcdpb_watch_create_encode(&b, &w) == 0);
    off = 0;
    FUZZ_CHECK(fuzz_next(b.p, b.len, &off, &f) == 1 && off == b.len && f.num == 1);
    fuzz_walk(f.p, f.n);
    etcdpb_buf_free(&b);
}

static void fuzz_range(const uint8_t *p, size_t n, int from_txn)
{
    struct etcdpb_range_resp r;
    struct etcdpb_kv kv;
    size_t off = 0, count = 0;
    int rc;

    if (etcdpb_range_resp_decode(p, n, &r) < 0) {
        FUZZ_CHECK(!from_txn && r.nkvs == 0 && r.raw.p == NULL && r.count == 0);
        return;
    }
    while ((rc = etcdpb_range_resp_next(&r, &off, &kv)) == 1) {
        fuzz_kv_inside(&kv);
        FUZZ_CHECK(off <= n);
        fuzz_reencode_kv(&kv);
        count++;
    }
    FUZZ_CHECK(rc == 0 && count == r.nkvs && off == n);
    off = n + 1;
    FUZZ_CHECK(etcdpb_range_resp_next(&r, &off, &kv) == -1);
}

static void fuzz_put(const uint8_t *p, size_t n, int from_txn)
{
    struct etcdpb_put_resp r;
    if (etcdpb_put_resp_decode(p, n, &r) < 0) {
        FUZZ_CHECK(!from_txn && r.has_prev_kv == 0 && r.prev_kv.key.p == NULL);
        return;
    }
    fuzz_kv_inside(&r.prev_kv);
    if (r.has_prev_kv)
        fuzz_reencode_kv(&r.prev_kv);
}

static void fuzz_delete(const uint8_t *p, size_t n, int from_txn)
{
    struct etcdpb_delete_resp r;
    FUZZ_CHECK(etcdpb_delete_resp_decode(p, n, &r) == 0 || !from_txn);
}

static void fuzz_txn(const uint8_t *p, size_t n)
{
    static struct etcdpb_txn_resp t;
    if (etcdpb_txn_resp_decode(p, n, &t) < 0) {
        FUZZ_CHECK(t.nresponses == 0);
        return;
    }
    FUZZ_CHECK(t.nresponses <= ETCDPB_TXN_MAX_OPS);
    for (size_t i = 0; i < t.nresponses; i++) {
        struct etcdpb_slice s = t.responses[i].body;
        fuzz_inside(s);
        switch (t.responses[i].kind) {
        case ETCDPB_OP_RANGE:
            fuzz_range(s.p, s.n, 1);
            break;
        case ETCDPB_OP_PUT:
            fuzz_put(s.p, s.n, 1);
            break;
        case ETCDPB_OP_DELETE:
            fuzz_delete(s.p, s.n, 1);
            break;
        default:
            abort();
        }
    }
}

static void fuzz_lease(const uint8_t *p, size_t n)
{
    struct etcdpb_lease_grant_resp g;
    struct etcdpb_lease_keepalive_resp k;
    struct etcdpb_header h;
    struct etcdpb_buf b = {0};

    if (etcdpb_lease_grant_resp_decode(p, n, &g) == 0) {
        struct fuzz_field f;
        size_t off = 0;
        fuzz_inside(g.error);
        FUZZ_CHECK(etcdpb_lease_grant_req_encode(&b, g.ttl, g.id) == 0);
        while (fuzz_next(b.p, b.len, &off, &f))
            FUZZ_CHECK((f.num == 1 && (int64_t)f.v == g.ttl) ||
                       (f.num == 2 && (int64_t)f.v == g.id));
        FUZZ_CHECK(etcdpb_lease_revoke_req_encode(&b, g.id) == 0);
    } else {
        FUZZ_CHECK(g.error.p == NULL && g.id == 0);
    }
    if (etcdpb_lease_keepalive_resp_decode(p, n, &k) == 0) {
        etcdpb_buf_reset(&b);
        FUZZ_CHECK(etcdpb_lease_keepalive_req_encode(&b, k.id) == 0);
        FUZZ_CHECK((k.id == 0) == (b.len == 0));
        fuzz_walk(b.p, b.len);
    }
    if (etcdpb_header_only_decode(p, n, &h) < 0)
        FUZZ_CHECK(h.revision == 0 && h.cluster_id == 0);
    etcdpb_buf_free(&b);
}

/* A decoded token goes back out as the password of an AuthenticateRequest, field for field. */
static void fuzz_auth(const uint8_t *p, size_t n)
{
    struct etcdpb_auth_resp a;
    struct etcdpb_buf b = {0};
    struct etcdpb_slice user = {(const uint8_t *)"u", 1};
    struct fuzz_field f;
    size_t off = 0;
    int seen = 0;

    if (etcdpb_auth_resp_decode(p, n, &a) < 0) {
        FUZZ_CHECK(a.token.p == NULL && a.token.n == 0);
        return;
    }
    fuzz_inside(a.token);
    FUZZ_CHECK(etcdpb_auth_req_encode(&b, user, a.token) == 0);
    while (fuzz_next(b.p, b.len, &off, &f)) {
        FUZZ_CHECK((f.num == 1 && fuzz_slice_eq(&f, user)) ||
                   (f.num == 2 && fuzz_slice_eq(&f, a.token)));
        seen += (int)f.num;
    }
    FUZZ_CHECK(seen == (a.token.n ? 3 : 1)); /* an empty token is not encoded at all */
    etcdpb_buf_free(&b);
}

static void fuzz_watch(const uint8_t *p, size_t n)
{
    struct etcdpb_watch_resp w;
    struct etcdpb_event ev;
    struct etcdpb_buf b = {0};
    size_t off = 0, count = 0;
    int rc;

    if (etcdpb_watch_resp_decode(p, n, &w) < 0) {
        FUZZ_CHECK(w.nevents == 0 && w.raw.p == NULL && w.cancel_reason.p == NULL);
        return;
    }
    fuzz_inside(w.cancel_reason);
    while ((rc = etcdpb_watch_resp_next(&w, &off, &ev)) == 1) {
        fuzz_kv_inside(&ev.kv);
        fuzz_kv_inside(&ev.prev_kv);
        fuzz_reencode_kv(&ev.kv);
        if (ev.has_prev_kv)
            fuzz_reencode_kv(&ev.prev_kv);
        count++;
    }
    FUZZ_CHECK(rc == 0 && count == w.nevents);
    FUZZ_CHECK(etcdpb_watch_cancel_encode(&b, w.watch_id) == 0);
    FUZZ_CHECK(etcdpb_watch_progress_encode(&b) == 0);
    fuzz_walk(b.p, b.len);
    etcdpb_buf_free(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *buf = malloc(size > 0 ? size : 1);

    if (buf == NULL)
        abort();
    memcpy(buf, data, size); /* exactly size bytes, so a read past the end traps */
    in_p = buf;
    in_n = size;
    fuzz_range(buf, size, 0);
    fuzz_put(buf, size, 0);
    fuzz_delete(buf, size, 0);
    fuzz_txn(buf, size);
    fuzz_lease(buf, size);
    fuzz_auth(buf, size);
    fuzz_watch(buf, size);
    free(buf);
    return 0;
}
