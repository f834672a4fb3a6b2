/* etcdpb.c — the hand-written protobuf codec for fencegate's etcd v3 messages (see etcdpb.h). */
#include "etcdpb.h"

#include <stdlib.h>
#include <string.h>

/* Wire types. Groups (3, 4) and the unassigned 6 and 7 are rejected. */
enum {
    PB_VARINT = 0,
    PB_FIXED64 = 1,
    PB_LEN = 2,
    PB_FIXED32 = 5,
};

#define PB_MAX_FIELD  536870911u /* 2^29 - 1, protobuf's largest field number */
#define PB_VARINT_MAX 10         /* bytes in the longest varint (a 64-bit value) */

/* ---- Output buffer -------------------------------------------------------------------------- */

void etcdpb_buf_free(struct etcdpb_buf *b)
{
    if (b == NULL)
        return;
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    b->oom = 0;
}

void etcdpb_buf_reset(struct etcdpb_buf *b)
{
    b->len = 0;
    b->oom = 0;
}

/* Makes room for `need` more bytes; 0, or -1 (and oom set) when that cannot be had. */
static int buf_reserve(struct etcdpb_buf *b, size_t need)
{
    size_t cap;
    uint8_t *p;

    if (b->oom)
        return -1;
    if (b->cap - b->len >= need)
        return 0;
    if (b->len > SIZE_MAX / 2 || need > SIZE_MAX / 2 - b->len) {
        b->oom = 1;
        return -1;
    }
    cap = b->cap > 0 ? b->cap : 64;
    while (cap - b->len < need)
        cap *= 2;
    p = realloc(b->p, cap);
    if (p == NULL) {
        b->oom = 1;
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static void put_bytes(struct etcdpb_buf *b, const void *p, size_t n)
{
    if (n == 0 || buf_reserve(b, n) < 0)
        return;
    memcpy(b->p + b->len, p, n);
    b->len += n;
}

int etcdpb_buf_append(struct etcdpb_buf *b, const void *p, size_t n)
{
    put_bytes(b, p, n);
    return b->oom ? -1 : 0;
}

static size_t varint_size(uint64_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* Writes v into out (at least PB_VARINT_MAX bytes); returns the length. */
static size_t varint_write(uint8_t *out, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        out[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    out[n++] = (uint8_t)v;
    return n;
}

static void put_varint(struct etcdpb_buf *b, uint64_t v)
{
    uint8_t tmp[PB_VARINT_MAX];
    put_bytes(b, tmp, varint_write(tmp, v));
}

static void put_tag(struct etcdpb_buf *b, unsigned field, unsigned wt)
{
    put_varint(b, ((uint64_t)field << 3) | wt);
}

/* A varint field written even when 0 (oneof members). Negative numbers are their 64-bit two's
 * complement, so ten bytes, as protobuf does for int64 and for negative int32/enum values. */
static void put_int_always(struct etcdpb_buf *b, unsigned field, int64_t v)
{
    put_tag(b, field, PB_VARINT);
    put_varint(b, (uint64_t)v);
}

/* A proto3 scalar: omitted when 0. */
static void put_int(struct etcdpb_buf *b, unsigned field, int64_t v)
{
    if (v != 0)
        put_int_always(b, field, v);
}

static void put_bool(struct etcdpb_buf *b, unsigned field, int v)
{
    if (v)
        put_int_always(b, field, 1);
}

static void put_slice_always(struct etcdpb_buf *b, unsigned field, struct etcdpb_slice s)
{
    put_tag(b, field, PB_LEN);
    put_varint(b, s.n);
    put_bytes(b, s.p, s.n);
}

static void put_slice(struct etcdpb_buf *b, unsigned field, struct etcdpb_slice s)
{
    if (s.n > 0)
        put_slice_always(b, field, s);
}

/* A nested message: the tag and a one-byte length placeholder now, the child next, and
 * nested_end() then widens the placeholder if the child needs a longer length. Each byte moves at
 * most once per enclosing level (at most three here), so encoding stays linear. Returns the
 * offset of the placeholder. */
static size_t nested_begin(struct etcdpb_buf *b, unsigned field)
{
    size_t mark;
    put_tag(b, field, PB_LEN);
    mark = b->len;
    put_bytes(b, "", 1);
    return mark;
}

static void nested_end(struct etcdpb_buf *b, size_t mark)
{
    size_t body, extra;

    if (b->oom)
        return;
    body = b->len - mark - 1;
    extra = varint_size(body) - 1;
    if (extra > 0) {
        if (buf_reserve(b, extra) < 0)
            return;
        memmove(b->p + mark + 1 + extra, b->p + mark + 1, body);
        b->len += extra;
    }
    varint_write(b->p + mark, body);
}

/* Ends an encoder: 0, or -1 with the buffer cut back to where the message began when the
 * encoder failed (out of memory or a bad argument), so a failed encode appends nothing. */
static int enc_finish(struct etcdpb_buf *b, size_t start, int bad)
{
    if (b->oom || bad) {
        if (b->len > start)
            b->len = start;
        return -1;
    }
    return 0;
}

/* A slice the encoders may read: empty, or with a pointer. */
static int slice_ok(struct etcdpb_slice s)
{
    return s.n == 0 || s.p != NULL;
}

static int range_fields(struct etcdpb_buf *b, const struct etcdpb_range_req *r)
{
    if (!slice_ok(r->key) || !slice_ok(r->range_end))
        return -1;
    put_slice(b, 1, r->key);
    put_slice(b, 2, r->range_end);
    put_int(b, 3, r->limit);
    put_int(b, 4, r->revision);
    put_int(b, 5, r->sort_order);
    put_int(b, 6, r->sort_target);
    put_bool(b, 7, r->serializable);
    put_bool(b, 8, r->keys_only);
    put_bool(b, 9, r->count_only);
    put_int(b, 10, r->min_mod_revision);
    put_int(b, 11, r->max_mod_revision);
    put_int(b, 12, r->min_create_revision);
    put_int(b, 13, r->max_create_revision);
    return 0;
}

static int put_fields(struct etcdpb_buf *b, const struct etcdpb_put_req *r)
{
    if (!slice_ok(r->key) || !slice_ok(r->value))
        return -1;
    put_slice(b, 1, r->key);
    put_slice(b, 2, r->value);
    put_int(b, 3, r->lease);
    put_bool(b, 4, r->prev_kv);
    return 0;
}

static int delete_fields(struct etcdpb_buf *b, const struct etcdpb_delete_req *r)
{
    if (!slice_ok(r->key) || !slice_ok(r->range_end))
        return -1;
    put_slice(b, 1, r->key);
    put_slice(b, 2, r->range_end);
    put_bool(b, 3, r->prev_kv);
    return 0;
}

int etcdpb_range_req_encode(struct etcdpb_buf *b, const struct etcdpb_range_req *r)
{
    size_t start = b->len;
    return enc_finish(b, start, range_fields(b, r));
}

int etcdpb_put_req_encode(struct etcdpb_buf *b, const struct etcdpb_put_req *r)
{
    size_t start = b->len;
    return enc_finish(b, start, put_fields(b, r));
}

int etcdpb_delete_req_encode(struct etcdpb_buf *b, const struct etcdpb_delete_req *r)
{
    size_t start = b->len;
    return enc_finish(b, start, delete_fields(b, r));
}

/* Compare: the operand always goes into the oneof member matching the target, even when it is 0
 * or empty, because etcd reads the operand from whichever member is set. */
static int compare_fields(struct etcdpb_buf *b, const struct etcdpb_compare *c)
{
    static const unsigned operand_field[] = {
        [ETCDPB_TARGET_VERSION] = 4, [ETCDPB_TARGET_CREATE] = 5, [ETCDPB_TARGET_MOD] = 6,
        [ETCDPB_TARGET_VALUE] = 7,   [ETCDPB_TARGET_LEASE] = 8,
    };

    if (c->target < ETCDPB_TARGET_VERSION || c->target > ETCDPB_TARGET_LEASE)
        return -1;
    if (!slice_ok(c->key) || !slice_ok(c->range_end) || !slice_ok(c->value))
        return -1;
    put_int(b, 1, c->result);
    put_int(b, 2, c->target);
    put_slice(b, 3, c->key);
    if (c->target == ETCDPB_TARGET_VALUE)
        put_slice_always(b, operand_field[c->target], c->value);
    else
        put_int_always(b, operand_field[c->target], c->number);
    put_slice(b, 64, c->range_end);
    return 0;
}

/* RequestOp{request_range | request_put | request_delete_range}. */
static int op_fields(struct etcdpb_buf *b, const struct etcdpb_op *op)
{
    size_t mark;
    int rc;

    switch (op->kind) {
    case ETCDPB_OP_RANGE:
        mark = nested_begin(b, 1);
        rc = range_fields(b, &op->u.range);
        break;
    case ETCDPB_OP_PUT:
        mark = nested_begin(b, 2);
        rc = put_fields(b, &op->u.put);
        break;
    case ETCDPB_OP_DELETE:
        mark = nested_begin(b, 3);
        rc = delete_fields(b, &op->u.del);
        break;
    default:
        return -1;
    }
    nested_end(b, mark);
    return rc;
}

static int ops_fields(struct etcdpb_buf *b, unsigned field, const struct etcdpb_op *ops, size_t n)
{
    for (size_t i = 0; i < n && !b->oom; i++) {
        size_t mark = nested_begin(b, field);
        int rc = op_fields(b, &ops[i]);
        nested_end(b, mark);
        if (rc < 0)
            return -1;
    }
    return 0;
}

int etcdpb_txn_req_encode(struct etcdpb_buf *b, const struct etcdpb_compare *cmp, size_t ncmp,
                          const struct etcdpb_op *success, size_t nsuccess,
                          const struct etcdpb_op *failure, size_t nfailure)
{
    size_t start = b->len;
    int bad = 0;

    if (ncmp > ETCDPB_TXN_MAX_OPS || nsuccess > ETCDPB_TXN_MAX_OPS || nfailure > ETCDPB_TXN_MAX_OPS)
        return enc_finish(b, start, 1);
    if ((ncmp > 0 && cmp == NULL) || (nsuccess > 0 && success == NULL) ||
        (nfailure > 0 && failure == NULL))
        return enc_finish(b, start, 1);
    for (size_t i = 0; i < ncmp && !bad && !b->oom; i++) {
        size_t mark = nested_begin(b, 1);
        bad = compare_fields(b, &cmp[i]) < 0;
        nested_end(b, mark);
    }
    if (!bad)
        bad = ops_fields(b, 2, success, nsuccess) < 0;
    if (!bad)
        bad = ops_fields(b, 3, failure, nfailure) < 0;
    return enc_finish(b, start, bad);
}

int etcdpb_txn_resp_slice_encode(struct etcdpb_buf *b, const struct etcdpb_txn_resp *t, size_t from,
                                 size_t count)
{
    size_t start = b->len, mark;

    if (from > t->nresponses || count > t->nresponses - from)
        return enc_finish(b, start, 1);
    mark = nested_begin(b, 1);
    put_int(b, 1, (int64_t)t->header.cluster_id);
    put_int(b, 2, (int64_t)t->header.member_id);
    put_int(b, 3, t->header.revision);
    put_int(b, 4, (int64_t)t->header.raft_term);
    nested_end(b, mark);
    put_bool(b, 2, t->succeeded);
    for (size_t i = from; i < from + count; i++) {
        mark = nested_begin(b, 3);
        put_slice_always(b, (unsigned)t->responses[i].kind, t->responses[i].body);
        nested_end(b, mark);
    }
    return enc_finish(b, start, 0);
}

int etcdpb_lease_grant_req_encode(struct etcdpb_buf *b, int64_t ttl_s, int64_t id)
{
    size_t start = b->len;
    put_int(b, 1, ttl_s);
    put_int(b, 2, id);
    return enc_finish(b, start, 0);
}

int etcdpb_auth_req_encode(struct etcdpb_buf *b, struct etcdpb_slice name,
                           struct etcdpb_slice password)
{
    size_t start = b->len;

    if (!slice_ok(name) || !slice_ok(password))
        return enc_finish(b, start, 1);
    put_slice(b, 1, name);
    put_slice(b, 2, password);
    return enc_finish(b, start, 0);
}

int etcdpb_lease_revoke_req_encode(struct etcdpb_buf *b, int64_t id)
{
    size_t start = b->len;
    put_int(b, 1, id);
    return enc_finish(b, start, 0);
}

int etcdpb_lease_keepalive_req_encode(struct etcdpb_buf *b, int64_t id)
{
    size_t start = b->len;
    put_int(b, 1, id);
    return enc_finish(b, start, 0);
}

int etcdpb_watch_create_encode(struct etcdpb_buf *b, const struct etcdpb_watch_create *w)
{
    size_t start = b->len, mark;
    unsigned known = ETCDPB_FILTER_NOPUT | ETCDPB_FILTER_NODELETE;

    if ((w->filters & ~known) != 0 || !slice_ok(w->key) || !slice_ok(w->range_end))
        return enc_finish(b, start, 1);
    mark = nested_begin(b, 1);
    put_slice(b, 1, w->key);
    put_slice(b, 2, w->range_end);
    put_int(b, 3, w->start_revision);
    put_bool(b, 4, w->progress_notify);
    if (w->filters != 0) {
        /* repeated FilterType, packed: NOPUT = 0, NODELETE = 1. */
        uint8_t vals[2];
        size_t nv = 0;
        if (w->filters & ETCDPB_FILTER_NOPUT)
            vals[nv++] = 0;
        if (w->filters & ETCDPB_FILTER_NODELETE)
            vals[nv++] = 1;
        put_tag(b, 5, PB_LEN);
        put_varint(b, nv);
        put_bytes(b, vals, nv);
    }
    put_bool(b, 6, w->prev_kv);
    put_int(b, 7, w->watch_id);
    nested_end(b, mark);
    return enc_finish(b, start, 0);
}

int etcdpb_watch_cancel_encode(struct etcdpb_buf *b, int64_t watch_id)
{
    size_t start = b->len, mark;
    mark = nested_begin(b, 2);
    put_int(b, 1, watch_id);
    nested_end(b, mark);
    return enc_finish(b, start, 0);
}

int etcdpb_watch_progress_encode(struct etcdpb_buf *b)
{
    size_t start = b->len, mark;
    mark = nested_begin(b, 3);
    nested_end(b, mark);
    return enc_finish(b, start, 0);
}

/* ---- Decoding ------------------------------------------------------------------------------- */

/* A cursor over one message. Every read checks against n, so nothing reads past the end. */
struct pb_reader {
    const uint8_t *p;
    size_t n, off;
};

/* One field as read: its number and wire type, and its value (varint, or the bytes of a
 * length-delimited field; fixed32/64 are skipped and leave both zero). */
struct pb_field {
    uint32_t num;
    unsigned wt;
    uint64_t v;
    struct etcdpb_slice s;
};

static int read_varint(struct pb_reader *r, uint64_t *out)
{
    uint64_t v = 0;

    for (unsigned i = 0; i < PB_VARINT_MAX; i++) {
        uint8_t c;
        if (r->off >= r->n)
            return -1;
        c = r->p[r->off++];
        if (i == PB_VARINT_MAX - 1 && c > 1)
            return -1; /* more than 64 bits, or more than ten bytes */
        v |= (uint64_t)(c & 0x7f) << (7 * i);
        if (c < 0x80) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

/* Reads the next field. Returns 1 with *f filled, 0 at the end of the message, -1 when the bytes
 * are malformed. */
static int read_field(struct pb_reader *r, struct pb_field *f)
{
    uint64_t tag, len;

    if (r->off >= r->n)
        return 0;
    if (read_varint(r, &tag) < 0)
        return -1;
    if ((tag >> 3) == 0 || (tag >> 3) > PB_MAX_FIELD)
        return -1;
    f->num = (uint32_t)(tag >> 3);
    f->wt = (unsigned)(tag & 7);
    f->v = 0;
    f->s.p = NULL;
    f->s.n = 0;
    switch (f->wt) {
    case PB_VARINT:
        return read_varint(r, &f->v) < 0 ? -1 : 1;
    case PB_FIXED64:
    case PB_FIXED32: {
        size_t w = f->wt == PB_FIXED64 ? 8 : 4;
        if (r->n - r->off < w)
            return -1;
        r->off += w;
        return 1;
    }
    case PB_LEN:
        if (read_varint(r, &len) < 0 || len > r->n - r->off)
            return -1;
        f->s.p = r->p + r->off;
        f->s.n = (size_t)len;
        r->off += (size_t)len;
        return 1;
    default:
        return -1; /* groups and wire types 6, 7 */
    }
}

static int64_t as_int64(uint64_t v)
{
    return v > (uint64_t)INT64_MAX ? -(int64_t)(~v) - 1 : (int64_t)v;
}

/* An enum or int32 as sent: the low 32 bits, sign-extended (a negative int32 arrives as a
 * ten-byte varint). */
static int as_int32(uint64_t v)
{
    uint32_t u = (uint32_t)v;
    return u > (uint32_t)INT32_MAX ? -(int)(~u) - 1 : (int)u;
}

/* Field readers for known fields: the wire type must be the declared one. */
static int want_varint(const struct pb_field *f, int64_t *out)
{
    if (f->wt != PB_VARINT)
        return -1;
    *out = as_int64(f->v);
    return 0;
}

static int want_uint(const struct pb_field *f, uint64_t *out)
{
    if (f->wt != PB_VARINT)
        return -1;
    *out = f->v;
    return 0;
}

static int want_bool(const struct pb_field *f, int *out)
{
    if (f->wt != PB_VARINT)
        return -1;
    *out = f->v != 0;
    return 0;
}

static int want_enum(const struct pb_field *f, int *out)
{
    if (f->wt != PB_VARINT)
        return -1;
    *out = as_int32(f->v);
    return 0;
}

static int want_bytes(const struct pb_field *f, struct etcdpb_slice *out)
{
    if (f->wt != PB_LEN)
        return -1;
    *out = f->s;
    return 0;
}

/* Reads one field into the struct at out. Returns 0, or -1 when the field is malformed (a known
 * field of the wrong wire type, a bad embedded message). Unknown fields are skipped (0). */
typedef int (*pb_field_fn)(const struct pb_field *f, void *out);

/* Reads every field of the message s into out with fn; embedded messages repeated on the wire
 * are merged, as protobuf does. Returns 0, or -1 when malformed. */
static int pb_walk(struct etcdpb_slice s, pb_field_fn fn, void *out)
{
    struct pb_reader r = {s.p, s.n, 0};
    struct pb_field f;
    int rc;

    if (s.p == NULL && s.n > 0)
        return -1;
    while ((rc = read_field(&r, &f)) == 1)
        if (fn(&f, out) != 0)
            return -1;
    return rc;
}

/* A top-level decode: *out (size bytes) zeroed, filled from p[0..n), zeroed again on failure. */
static int pb_decode(const uint8_t *p, size_t n, pb_field_fn fn, void *out, size_t size)
{
    struct etcdpb_slice s = {p, n};

    memset(out, 0, size);
    if (pb_walk(s, fn, out) != 0) {
        memset(out, 0, size);
        return -1;
    }
    return 0;
}

/* An embedded message field (the wire type must be length-delimited), merged into out. */
static int pb_embedded(const struct pb_field *f, pb_field_fn fn, void *out)
{
    return f->wt == PB_LEN ? pb_walk(f->s, fn, out) : -1;
}

/* etcdserverpb.ResponseHeader */
static int header_fn(const struct pb_field *f, void *out)
{
    struct etcdpb_header *h = out;

    switch (f->num) {
    case 1:
        return want_uint(f, &h->cluster_id);
    case 2:
        return want_uint(f, &h->member_id);
    case 3:
        return want_varint(f, &h->revision);
    case 4:
        return want_uint(f, &h->raft_term);
    default:
        return 0;
    }
}

/* mvccpb.KeyValue */
static int kv_fn(const struct pb_field *f, void *out)
{
    struct etcdpb_kv *kv = out;

    switch (f->num) {
    case 1:
        return want_bytes(f, &kv->key);
    case 2:
        return want_varint(f, &kv->create_revision);
    case 3:
        return want_varint(f, &kv->mod_revision);
    case 4:
        return want_varint(f, &kv->version);
    case 5:
        return want_bytes(f, &kv->value);
    case 6:
        return want_varint(f, &kv->lease);
    default:
        return 0;
    }
}

/* Checks the shape of a KeyValue that is counted or skipped, not kept. */
static int kv_check(const struct pb_field *f)
{
    struct etcdpb_kv kv;

    memset(&kv, 0, sizeof(kv));
    return pb_embedded(f, kv_fn, &kv);
}

static int range_resp_fn(const struct pb_field *f, void *out)
{
    struct etcdpb_range_resp *r = out;

    switch (f->num) {
    case 1:
        return pb_embedded(f, header_fn, &r->header);
    case 2:
        r->nkvs++;
        return kv_check(f);
    case 3:
        return want_bool(f, &r->more);
    case 4:
        return want_varint(f, &r->count);
    default:
        return 0;
    }
}

int etcdpb_range_resp_decode(const uint8_t *p, size_t n, struct etcdpb_range_resp *out)
{
    if (pb_decode(p, n, range_resp_fn, out, sizeof(*out)) != 0)
        return -1;
    out->raw.p = p;
    out->raw.n = n;
    return 0;
}

/* The shared iterator: the next field `num` of raw from *off, merged into a zeroed *kv-like
 * target by `merge`. 1, 0 at the end, -1 when malformed. */
static int next_field(struct etcdpb_slice raw, size_t *off, uint32_t num, struct pb_field *out)
{
    struct pb_reader r = {raw.p, raw.n, 0};
    int rc;

    if (*off > raw.n || (raw.p == NULL && raw.n > 0))
        return -1;
    r.off = *off;
    while ((rc = read_field(&r, out)) == 1) {
        if (out->num == num) {
            *off = r.off;
            return 1;
        }
    }
    if (rc == 0)
        *off = r.off;
    return rc;
}

int etcdpb_range_resp_next(const struct etcdpb_range_resp *r, size_t *off, struct etcdpb_kv *kv)
{
    struct pb_field f;
    int rc = next_field(r->raw, off, 2, &f);

    memset(kv, 0, sizeof(*kv));
    if (rc != 1)
        return rc;
    if (pb_embedded(&f, kv_fn, kv) != 0) {
        memset(kv, 0, sizeof(*kv));
        return -1;
    }
    return 1;
}

static int put_resp_fn(const struct pb_field *f, void *out)
{
    struct etcdpb_put_resp *r = out;

    switch (f->num) {
    case 1:
        return pb_embedded(f, header_fn, &r->header);
    case 2:
        r->has_prev_kv = 1;
        return pb_embedded(f, kv_fn, &r->prev_kv);
    default:
        return 0;
    }
}

int etcdpb_put_resp_decode(const uint8_t *p, size_t n, struct etcdpb_put_resp *out)
{
    return pb_decode(p, n, put_resp_fn, out, sizeof(*out));
}

static int delete_resp_fn(const struct pb_field *f, void *out)
{
    struct etcdpb_delete_resp *r = out;

    switch (f->num) {
    case 1:
        return pb_embedded(f, header_fn, &r->header);
    case 2:
        return want_varint(f, &r->deleted);
    case 3:
        return kv_check(f); /* prev_kvs: checked for shape only; nothing reads them */
    default:
        return 0;
    }
}

int etcdpb_delete_resp_decode(const uint8_t *p, size_t n, struct etcdpb_delete_resp *out)
{
    return pb_decode(p, n, delete_resp_fn, out, sizeof(*out));
}

/* ResponseOp: the last member of the oneof that is present wins (protobuf's rule), its body is
 * checked with the decoder of its kind, and a nested Txn response or an empty ResponseOp is
 * malformed for us. */
static int response_op(struct etcdpb_slice s, int *kind, struct etcdpb_slice *body)
{
    struct pb_reader r = {s.p, s.n, 0};
    struct pb_field f;
    int rc;

    *kind = 0;
    while ((rc = read_field(&r, &f)) == 1) {
        if (f.num >= 1 && f.num <= 4 && f.wt != PB_LEN)
            return -1;
        if (f.num == 4)
            return -1; /* a Txn inside a Txn: fencegate never sends one */
        if (f.num >= 1 && f.num <= 3) {
            *kind = (int)f.num;
            *body = f.s;
        }
    }
    if (rc < 0 || *kind == 0)
        return -1;
    switch (*kind) {
    case ETCDPB_OP_RANGE: {
        struct etcdpb_range_resp rr;
        return etcdpb_range_resp_decode(body->p, body->n, &rr);
    }
    case ETCDPB_OP_PUT: {
        struct etcdpb_put_resp pr;
        return etcdpb_put_resp_decode(body->p, body->n, &pr);
    }
    default: {
        struct etcdpb_delete_resp dr;
        return etcdpb_delete_resp_decode(body->p, body->n, &dr);
    }
    }
}

static int txn_resp_fn(const struct pb_field *f, void *out)
{
    struct etcdpb_txn_resp *t = out;

    switch (f->num) {
    case 1:
        return pb_embedded(f, header_fn, &t->header);
    case 2:
        return want_bool(f, &t->succeeded);
    case 3:
        if (f->wt != PB_LEN || t->nresponses >= ETCDPB_TXN_MAX_OPS)
            return -1;
        t->nresponses++;
        return response_op(f->s, &t->responses[t->nresponses - 1].kind,
                           &t->responses[t->nresponses - 1].body);
    default:
        return 0;
    }
}

int etcdpb_txn_resp_decode(const uint8_t *p, size_t n, struct etcdpb_txn_resp *out)
{
    return pb_decode(p, n, txn_resp_fn, out, sizeof(*out));
}

static int lease_grant_resp_fn(const struct pb_field *f, void *out)
{
    struct etcdpb_lease_grant_resp *g = out;

    switch (f->num) {
    case 1:
        return pb_embedded(f, header_fn, &g->header);
    case 2:
        return want_varint(f, &g->id);
    case 3:
        return want_varint(f, &g->ttl);
    case 4:
        return want_bytes(f, &g->error);
    default:
        return 0;
    }
}

int etcdpb_lease_grant_resp_decode(const uint8_t *p, size_t n, struct etcdpb_lease_grant_resp *out)
{
    return pb_decode(p, n, lease_grant_resp_fn, out, sizeof(*out));
}

static int auth_resp_fn(const struct pb_field *f, void *out)
{
    struct etcdpb_auth_resp *a = out;

    switch (f->num) {
    case 1:
        return pb_embedded(f, header_fn, &a->header);
    case 2:
        return want_bytes(f, &a->token);
    default:
        return 0;
    }
}

int etcdpb_auth_resp_decode(const uint8_t *p, size_t n, struct etcdpb_auth_resp *out)
{
    return pb_decode(p, n, auth_resp_fn, out, sizeof(*out));
}

static int header_only_fn(const struct pb_field *f, void *out)
{
    return f->num == 1 ? pb_embedded(f, header_fn, out) : 0;
}

int etcdpb_header_only_decode(const uint8_t *p, size_t n, struct etcdpb_header *out)
{
    return pb_decode(p, n, header_only_fn, out, sizeof(*out));
}

static int keepalive_resp_fn(const struct pb_field *f, void *out)
{
    struct etcdpb_lease_keepalive_resp *k = out;

    switch (f->num) {
    case 1:
        return pb_embedded(f, header_fn, &k->header);
    case 2:
        return want_varint(f, &k->id);
    case 3:
        return want_varint(f, &k->ttl);
    default:
        return 0;
    }
}

int etcdpb_lease_keepalive_resp_decode(const uint8_t *p, size_t n,
                                       struct etcdpb_lease_keepalive_resp *out)
{
    return pb_decode(p, n, keepalive_resp_fn, out, sizeof(*out));
}

/* mvccpb.Event */
static int event_fn(const struct pb_field *f, void *out)
{
    struct etcdpb_event *ev = out;

    switch (f->num) {
    case 1:
        return want_enum(f, &ev->type);
    case 2:
        return pb_embedded(f, kv_fn, &ev->kv);
    case 3:
        ev->has_prev_kv = 1;
        return pb_embedded(f, kv_fn, &ev->prev_kv);
    default:
        return 0;
    }
}

static int watch_resp_fn(const struct pb_field *f, void *out)
{
    struct etcdpb_watch_resp *w = out;

    switch (f->num) {
    case 1:
        return pb_embedded(f, header_fn, &w->header);
    case 2:
        return want_varint(f, &w->watch_id);
    case 3:
        return want_bool(f, &w->created);
    case 4:
        return want_bool(f, &w->canceled);
    case 5:
        return want_varint(f, &w->compact_revision);
    case 6:
        return want_bytes(f, &w->cancel_reason);
    case 7:
        return want_bool(f, &w->fragment);
    case 11: {
        struct etcdpb_event ev;
        memset(&ev, 0, sizeof(ev));
        w->nevents++;
        return pb_embedded(f, event_fn, &ev);
    }
    default:
        return 0;
    }
}

int etcdpb_watch_resp_decode(const uint8_t *p, size_t n, struct etcdpb_watch_resp *out)
{
    if (pb_decode(p, n, watch_resp_fn, out, sizeof(*out)) != 0)
        return -1;
    out->raw.p = p;
    out->raw.n = n;
    return 0;
}

int etcdpb_watch_resp_next(const struct etcdpb_watch_resp *w, size_t *off, struct etcdpb_event *ev)
{
    struct pb_field f;
    int rc = next_field(w->raw, off, 11, &f);

    memset(ev, 0, sizeof(*ev));
    if (rc != 1)
        return rc;
    if (pb_embedded(&f, event_fn, ev) != 0) {
        memset(ev, 0, sizeof(*ev));
        return -1;
    }
    return 1;
}
