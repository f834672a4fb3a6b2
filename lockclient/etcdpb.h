/* etcdpb.h — a hand-written protobuf codec for the few etcd v3 messages fencegate uses (KV Range,
 * Put, DeleteRange, Txn; Lease Grant, Revoke, KeepAlive; Watch). Pure: no I/O, no event loop.
 *
 * Why hand-written: we need about twenty messages and a handful of fields each; decoding returns
 * slices into the caller's buffer (no per-message allocation, no generated trees to free), and the
 * whole codec is small enough to fuzz to the bottom. Field numbers follow etcd's rpc.proto and
 * kv.proto (etcd 3.4).
 *
 * Encoders append to an etcdpb_buf; one that fails appends nothing (the buffer is cut back to its
 * length on entry). Decoders read one complete message (the gRPC length prefix already removed),
 * skip unknown fields of wire types 0, 1, 2 and 5, and return 0, or -1 when the bytes are not a
 * well-formed message (truncated varint, length past the end, a group (wire types 3, 4) or wire
 * type 6 or 7, field number 0, a varint of more than 10 bytes or 64 bits, a known field with the
 * wrong wire type). On -1 the output struct is zeroed. Decoders never allocate and never read
 * past p + n. */
#ifndef FG_ETCDPB_H
#define FG_ETCDPB_H

#include <stddef.h>
#include <stdint.h>

#define ETCDPB_TXN_MAX_OPS 128 /* etcd's default --max-txn-ops */

/* A growable output buffer; zero-initialised is empty. After an allocation failure `oom` is set,
 * later appends are no-ops and the encoders return -1. */
struct etcdpb_buf {
    uint8_t *p;
    size_t len, cap;
    int oom;
};
void etcdpb_buf_free(struct etcdpb_buf *b);
void etcdpb_buf_reset(struct etcdpb_buf *b); /* len = 0, keeps the memory, clears oom */
/* Appends n raw bytes (encoded fields: messages of one type concatenate into one). -1 when out
 * of memory. */
int etcdpb_buf_append(struct etcdpb_buf *b, const void *p, size_t n);

/* Bytes inside a decoded message (not NUL-terminated). */
struct etcdpb_slice {
    const uint8_t *p;
    size_t n;
};

struct etcdpb_header {
    uint64_t cluster_id, member_id;
    int64_t revision;
    uint64_t raft_term;
};

struct etcdpb_kv {
    struct etcdpb_slice key, value;
    int64_t create_revision, mod_revision, version, lease;
};

/* ---- KV ---- */

enum etcdpb_sort_order { ETCDPB_SORT_NONE = 0, ETCDPB_SORT_ASCEND = 1, ETCDPB_SORT_DESCEND = 2 };
enum etcdpb_sort_target {
    ETCDPB_SORT_KEY = 0,
    ETCDPB_SORT_VERSION = 1,
    ETCDPB_SORT_CREATE = 2,
    ETCDPB_SORT_MOD = 3,
    ETCDPB_SORT_VALUE = 4,
};

/* Zero fields are omitted on the wire (proto3 defaults). */
struct etcdpb_range_req {
    struct etcdpb_slice key, range_end;
    int64_t limit, revision;
    int sort_order, sort_target;
    int serializable, keys_only, count_only;
    int64_t min_mod_revision, max_mod_revision, min_create_revision, max_create_revision;
};

struct etcdpb_put_req {
    struct etcdpb_slice key, value;
    int64_t lease;
    int prev_kv;
};

struct etcdpb_delete_req {
    struct etcdpb_slice key, range_end;
    int prev_kv;
};

/* Appends the message (without gRPC framing). Return 0, or -1 when out of memory or when a slice
 * has n > 0 and p == NULL. */
int etcdpb_range_req_encode(struct etcdpb_buf *b, const struct etcdpb_range_req *r);
int etcdpb_put_req_encode(struct etcdpb_buf *b, const struct etcdpb_put_req *r);
int etcdpb_delete_req_encode(struct etcdpb_buf *b, const struct etcdpb_delete_req *r);

/* RangeResponse. The kvs are read with etcdpb_range_resp_next(). */
struct etcdpb_range_resp {
    struct etcdpb_header header;
    size_t nkvs; /* how many kvs the message holds */
    int more;
    int64_t count;
    struct etcdpb_slice raw; /* the whole message, for iteration */
};
int etcdpb_range_resp_decode(const uint8_t *p, size_t n, struct etcdpb_range_resp *out);
/* Iterates the kvs: *off starts at 0; returns 1 with *kv filled, 0 at the end (-1 never happens
 * after a successful decode, but callers treat it as malformed). */
int etcdpb_range_resp_next(const struct etcdpb_range_resp *r, size_t *off, struct etcdpb_kv *kv);

struct etcdpb_put_resp {
    struct etcdpb_header header;
    int has_prev_kv;
    struct etcdpb_kv prev_kv;
};
int etcdpb_put_resp_decode(const uint8_t *p, size_t n, struct etcdpb_put_resp *out);

struct etcdpb_delete_resp {
    struct etcdpb_header header;
    int64_t deleted;
};
int etcdpb_delete_resp_decode(const uint8_t *p, size_t n, struct etcdpb_delete_resp *out);

/* ---- Txn ---- */

enum etcdpb_cmp_result {
    ETCDPB_CMP_EQUAL = 0,
    ETCDPB_CMP_GREATER = 1,
    ETCDPB_CMP_LESS = 2,
    ETCDPB_CMP_NOT_EQUAL = 3,
};
enum etcdpb_cmp_target {
    ETCDPB_TARGET_VERSION = 0,
    ETCDPB_TARGET_CREATE = 1,
    ETCDPB_TARGET_MOD = 2,
    ETCDPB_TARGET_VALUE = 3,
    ETCDPB_TARGET_LEASE = 4,
};

/* One Compare. For targets VERSION, CREATE, MOD and LEASE the operand is `number` (encoded in the
 * oneof field matching the target, even when 0); for VALUE it is `value`. */
struct etcdpb_compare {
    int result, target;
    struct etcdpb_slice key, range_end;
    int64_t number;
    struct etcdpb_slice value;
};

enum etcdpb_op_kind { ETCDPB_OP_RANGE = 1, ETCDPB_OP_PUT = 2, ETCDPB_OP_DELETE = 3 };

struct etcdpb_op {
    int kind; /* enum etcdpb_op_kind */
    union {
        struct etcdpb_range_req range;
        struct etcdpb_put_req put;
        struct etcdpb_delete_req del;
    } u;
};

/* TxnRequest: if every compare holds, `success` runs, else `failure`. Returns -1 when out of
 * memory, when a list is longer than ETCDPB_TXN_MAX_OPS, or for a compare target or op kind
 * outside its enum. */
int etcdpb_txn_req_encode(struct etcdpb_buf *b, const struct etcdpb_compare *cmp, size_t ncmp,
                          const struct etcdpb_op *success, size_t nsuccess,
                          const struct etcdpb_op *failure, size_t nfailure);

/* TxnResponse: which branch ran and the raw ResponseOp bodies in order; decode each body with the
 * decoder of its kind (etcdpb_range_resp_decode() ...): each body was checked with that decoder,
 * so that decode succeeds. More than ETCDPB_TXN_MAX_OPS responses, a nested Txn response or a
 * ResponseOp with no member set is malformed (-1). */
struct etcdpb_txn_resp {
    struct etcdpb_header header;
    int succeeded;
    size_t nresponses;
    struct {
        int kind; /* enum etcdpb_op_kind */
        struct etcdpb_slice body;
    } responses[ETCDPB_TXN_MAX_OPS];
};
int etcdpb_txn_resp_decode(const uint8_t *p, size_t n, struct etcdpb_txn_resp *out);
/* Encodes the TxnResponse that t would be with only its responses [from, from + count): the same
 * header and succeeded. Splits the response to Txns sent as one. -1 when out of memory or out of
 * range. */
int etcdpb_txn_resp_slice_encode(struct etcdpb_buf *b, const struct etcdpb_txn_resp *t, size_t from,
                                 size_t count);

/* ---- Lease ---- */

int etcdpb_lease_grant_req_encode(struct etcdpb_buf *b, int64_t ttl_s, int64_t id);
struct etcdpb_lease_grant_resp {
    struct etcdpb_header header;
    int64_t id, ttl;
    struct etcdpb_slice error; /* empty when granted */
};
int etcdpb_lease_grant_resp_decode(const uint8_t *p, size_t n, struct etcdpb_lease_grant_resp *out);

/* AuthenticateRequest {name, password}; AuthenticateResponse: the token for the "token"
 * metadata of later calls. */
int etcdpb_auth_req_encode(struct etcdpb_buf *b, struct etcdpb_slice name,
                           struct etcdpb_slice password);
struct etcdpb_auth_resp {
    struct etcdpb_header header;
    struct etcdpb_slice token;
};
int etcdpb_auth_resp_decode(const uint8_t *p, size_t n, struct etcdpb_auth_resp *out);

int etcdpb_lease_revoke_req_encode(struct etcdpb_buf *b, int64_t id);
/* LeaseRevokeResponse and any other response whose only field we read is the header. */
int etcdpb_header_only_decode(const uint8_t *p, size_t n, struct etcdpb_header *out);

int etcdpb_lease_keepalive_req_encode(struct etcdpb_buf *b, int64_t id);
struct etcdpb_lease_keepalive_resp {
    struct etcdpb_header header;
    int64_t id, ttl; /* ttl <= 0: the lease is gone */
};
int etcdpb_lease_keepalive_resp_decode(const uint8_t *p, size_t n,
                                       struct etcdpb_lease_keepalive_resp *out);

/* ---- Watch ---- */

enum etcdpb_watch_filter { ETCDPB_FILTER_NOPUT = 1, ETCDPB_FILTER_NODELETE = 2 }; /* bit flags */

struct etcdpb_watch_create {
    struct etcdpb_slice key, range_end;
    int64_t start_revision;
    int progress_notify;
    unsigned filters; /* enum etcdpb_watch_filter bits; encoded as the repeated enum field 5 */
    int prev_kv;
    int64_t watch_id; /* 0 = let the server choose */
};
/* WatchRequest{create_request}, WatchRequest{cancel_request}, WatchRequest{progress_request}.
 * 0, or -1 when out of memory (or, for create, a bad slice or filter bits other than the two). */
int etcdpb_watch_create_encode(struct etcdpb_buf *b, const struct etcdpb_watch_create *w);
int etcdpb_watch_cancel_encode(struct etcdpb_buf *b, int64_t watch_id);
int etcdpb_watch_progress_encode(struct etcdpb_buf *b);

enum etcdpb_event_type { ETCDPB_EVENT_PUT = 0, ETCDPB_EVENT_DELETE = 1 };

struct etcdpb_event {
    int type; /* enum etcdpb_event_type */
    struct etcdpb_kv kv;
    int has_prev_kv;
    struct etcdpb_kv prev_kv;
};

struct etcdpb_watch_resp {
    struct etcdpb_header header;
    int64_t watch_id;
    int created, canceled, fragment;
    int64_t compact_revision;
    struct etcdpb_slice cancel_reason;
    size_t nevents;
    struct etcdpb_slice raw; /* the whole message, for iteration */
};
int etcdpb_watch_resp_decode(const uint8_t *p, size_t n, struct etcdpb_watch_resp *out);
/* Iterates the events like etcdpb_range_resp_next(). */
int etcdpb_watch_resp_next(const struct etcdpb_watch_resp *w, size_t *off, struct etcdpb_event *ev);

#endif
