/* client.h — the objects the RESP endpoint's modules share: a client connection, its queue of
 * pending operations, and the server. Internal to proxy/; server.c owns the I/O, fencing.c the
 * lock commands and fenced writes. */
#ifndef FG_CLIENT_H
#define FG_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <strings.h>

#include "buf.h"
#include "fence.h"
#include "lock.h"
#include "resp.h"

struct event;
struct event_base;
struct cfg;
struct upstream;
struct lock_client;
struct lock_session;
struct fence_rules;
struct fencing_held;
struct fencing_txn;
struct ulink;

#define SRV_ACCEPT_PAUSE_MS 100 /* accept pause when out of descriptors */
#define SRV_READ_CHUNK      65536
#define SRV_MAX_OPS         65536 /* pipelined commands awaiting replies before we stop reading */
/* A client on the shared upstream connection with this many replies due pins before it sends
 * more: deep pipelines get a connection of their own, where back-pressure reaches Redis. */
#define SRV_SHARED_MAX_OPS 32
/* A request with more arguments (or more bytes than max_pending_bytes) pins: Redis 6 closes the
 * connection on a request of more than 2^20 arguments, Redis 7 on a bulk over its
 * proto-max-bulk-len, and that must end only the sender's connection. A big request would also
 * hold up everybody's behind it. */
#define SRV_SHARED_MAX_ARGS (1024 * 1024)
/* Fenced writes that reach the shared connection back to back travel as one script call of at
 * most this many writes and bytes: Redis runs one script instead of one per write. */
#define SRV_GROUP_MAX_WRITES 64
#define SRV_GROUP_MAX_BYTES  (64 * 1024)
/* The shared connection has at most SRV_DUE_BYTES of replies due, by their recent mean size, and
 * never fewer than SRV_DUE_MIN replies (lk_account()). */
#define SRV_DUE_BYTES (1024 * 1024)
#define SRV_DUE_MIN   16
/* At least this many of them in a row under the same locks go as one pipelined transaction
 * (fence_encode_txn()) instead: Redis runs the writes natively, with one small script to check
 * the marks. It answers with this many replies more than there are writes. */
#define SRV_TXN_MIN_WRITES    2
#define SRV_TXN_EXTRA_REPLIES 4

enum op_kind {
    OP_FORWARD = 0, /* a client command sent upstream; its replies go back to the client */
    OP_LOCAL,       /* a reply fencegate produces itself (ready when reply != NULL) */
    OP_HIDDEN,      /* a command of our own (AUTH/SELECT prelude); its reply is swallowed */
};

enum op_flag {
    OPF_BARRIER = 1 << 0,       /* stop parsing requests until this op's reply arrived */
    OPF_HELLO = 1 << 1,         /* the reply tells the protocol version (RESP2 '*' / RESP3 '%') */
    OPF_RESET = 1 << 2,         /* RESET: protocol back to RESP2, modes cleared */
    OPF_ENTER_PUBSUB = 1 << 3,  /* RESP2 SUBSCRIBE: after its first reply, replies are unpaired */
    OPF_ENTER_MONITOR = 1 << 4, /* MONITOR: after +OK, the stream is unpaired for good */
    OPF_FENCED = 1 << 5,        /* a fenced write (EVALSHA); `reply` keeps its bytes for NOSCRIPT */
    OPF_PRELUDE = 1 << 6,       /* OP_HIDDEN AUTH/SELECT: an error means the upstream is unusable */
    OPF_TXN_CHECK = 1 << 7,     /* the fence check before a transaction: it decides the commit */
    OPF_ENTER_REPLICA = 1 << 8, /* SYNC / PSYNC: its reply starts a replication stream */
    OPF_SILENT = 1 << 9,        /* CLIENT REPLY OFF / SKIP: its reply is read and dropped */
    OPF_UNWRAP = 1 << 10,       /* EXEC of a script sent alone: answered with the script's reply */
    OPF_TXN_QUEUED = 1 << 11,   /* OP_HIDDEN MULTI/QUEUED of a held-back block: an error is kept */
    OPF_SCRIPT_LOAD = 1 << 12,  /* OP_HIDDEN SCRIPT LOAD of the fence script: an error (-BUSY)
                                   means it is not loaded after all */
    OPF_SELECT = 1 << 13,       /* SELECT n: an error means the database stayed (out of range) */
    OPF_NULL_ARRAY = 1 << 14,   /* a fenced write whose null reply is "*-1" (its script's: "$-1") */
    OPF_MAY_END = 1 << 15,      /* SHUTDOWN, CLIENT KILL: Redis may close the connection on purpose,
                                   without a reply (SHUTDOWN) or after it (a kill of itself) */
};

struct op {
    uint16_t flags;
    uint8_t kind;
    uint8_t txn_exec : 1; /* EXEC of a fenced transaction: a null reply means a mark moved */
    uint8_t txn_run : 7;  /* > 0: this fenced write and the txn_run - 1 after it went as one
                             pipelined transaction (fence_encode_txn()) on a pinned connection */
    uint32_t nreplies;    /* replies still expected (UNSUBSCRIBE a b c expects three) */
    uint64_t t0_us;       /* when it was forwarded, for the latency histogram */
    char *reply;          /* OP_LOCAL: the reply; OPF_FENCED: the request sent */
    size_t reply_len;
};

enum up_state { U_DOWN = 0, U_CONNECTING, U_READY };

/* How replies are paired with requests. */
enum conn_mode {
    MODE_NORMAL = 0, /* one op per request */
    MODE_PUBSUB,  /* RESP2 subscribed: replies flow unpaired until a barrier PING says otherwise */
    MODE_MONITOR, /* MONITOR: everything flows unpaired until the connection ends */
    /* SYNC / PSYNC answered: the upstream's bytes flow as they are (an RDB payload is not RESP)
     * until the connection ends; the client, a replica, may send only REPLCONF. */
    MODE_REPLICA,
};

struct span {
    const char *p;
    size_t n;
};

struct client {
    struct server *srv;
    struct client *prev, *next;
    uint64_t id;
    char peer[64];

    int fd;
    struct event *rev, *wev;
    int rev_on, wev_on;
    struct buf in;  /* unparsed request bytes */
    struct buf out; /* bytes for the client */
    struct resp_parser *parser;

    int ufd;
    enum up_state ustate;
    struct event *urev, *uwev;
    int urev_on, uwev_on;
    struct buf uin;  /* reply bytes scanned but not yet handled */
    struct buf uout; /* bytes for the upstream */
    struct resp_scanner scan;
    size_t rscan_off;   /* bytes at the head of uin already scanned */
    int reply_partial;  /* part of the current reply already went to the client */
    char down_why[256]; /* why the upstream was unreachable for this connection */
    int uwrite_errno;   /* a write to the upstream failed so: dropped at the next cl_update() */

    struct op *ops; /* ring buffer */
    size_t ops_head, ops_count, ops_cap;

    enum conn_mode mode;
    unsigned blocked : 1;       /* a barrier op is in flight: parsing waits */
    unsigned stalled : 1;       /* parsing stopped with whole requests left in `in` */
    unsigned closing : 1;       /* close once `out` is written; read nothing more */
    unsigned quit_sent : 1;     /* QUIT forwarded, or the end passed on: the upstream will close */
    unsigned end_expected : 1;  /* the last reply was a CLIENT KILL's: it may have killed us */
    unsigned rd_eof : 1;        /* the client ended its side: answer what it sent, then close */
    unsigned reply_off : 1;     /* CLIENT REPLY OFF (fencegate's own: Redis always replies) */
    unsigned skip_next : 1;     /* CLIENT REPLY SKIP */
    unsigned silent_cmd : 1;    /* the request being classified gets OPF_SILENT ops */
    unsigned in_multi : 1;      /* between MULTI and EXEC/DISCARD */
    unsigned resp3 : 1;         /* HELLO 3 succeeded */
    unsigned sub_resp3 : 1;     /* subscribed in RESP3 (maybe still): HELLO 2 enters pub/sub */
    unsigned marker_wait : 1;   /* pub/sub barrier PING in flight */
    unsigned push_barrier : 1;  /* RESP3 (un)subscribe's pushes may be due: a reply of our own
                                 * waits for a PING sent behind them (req_forward_pushes) */
    unsigned pass_once : 1;     /* forward the held request as is (still subscribed) */
    unsigned monitor_reset : 1; /* RESET sent in monitor mode: parsing waits for its +RESET */
    unsigned dead : 1;
    unsigned processing : 1;    /* inside req_process: callbacks must not re-enter it */
    unsigned script_loaded : 1; /* the fence script was loaded on this upstream connection */
    unsigned pinned : 1;        /* has (or is about to get) an upstream connection of its own */
    unsigned pin_pending : 1;   /* pins at its next request, once no reply is due to it */
    unsigned slow_reader : 1;   /* left max_pending_bytes of replies unread: pins next time */
    unsigned wait_idle : 1;     /* parsing waits until no reply is due (REQ_IDLE) */
    unsigned used_shared : 1;   /* sent commands on the shared connection: a WAIT must see them */
    uint32_t shared_pending;    /* replies still due to it on the shared upstream connection */
    int db;        /* its database as SELECT and RESET set it; -1 unknown (a SELECT in MULTI) */
    int db_before; /* before the last SELECT, which is op number select_op */
    uint64_t select_op;
    char marker[48];
    size_t marker_len;

    struct lock_session *sess; /* created by the first FENCE.ACQUIRE */
    /* With the store as lock backend (server.owner_prefix): whom the store holds this session's
     * locks to, the id in owner_id; owner.id is NULL otherwise. Set with the session. */
    struct fence_owner owner;
    char owner_id[LOCK_OWNER_MAX];
    uint64_t wait_t0_us;              /* when the pending FENCE.ACQUIRE started */
    struct fencing_held *held;        /* when each lock was granted (fencing.c) */
    struct fencing_txn *txn;          /* a MULTI held back until EXEC, to fence it as a whole */
    struct fencing_txn *txn_checking; /* its check is in flight */
    char *txn_err; /* the first error Redis gave a held-back block's queued command: EXEC's */
    unsigned client_watched : 1; /* the application's own WATCH is active */

    uint64_t ops_pushed; /* ops ever pushed: names an op while it is queued */
    struct srv_run *run; /* pinned: fenced writes under the same locks not sent yet (or NULL) */
    size_t txn_seen;     /* pinned: replies of the transaction at the head scanned so far */
};

struct server {
    struct event_base *base;
    const struct cfg *cfg;
    struct upstream *up;
    int lfd;
    struct event *lev;
    struct event *accept_timer; /* resumes accepting after running out of descriptors */
    int accept_held;            /* not accepting until the upstream's first probe has an outcome */
    struct client *clients;
    int nclients;
    uint64_t next_id;
    struct resp_limits lim;
    int draining;
    void (*drained)(void *arg);
    void *drained_arg;

    struct ulink
        *shared; /* the upstream connection unpinned clients share (NULL: multiplexing off) */

    struct lock_client *locks; /* the lock backend */
    struct fence_rules *rules; /* protect rules for the upstream store */
    char write_sha[41];        /* SHA-1 of fence_write_script() */
    char group_sha[41];        /* SHA-1 of fence_group_script() */
    /* The store is the lock backend's Redis: the lock keys' prefix there, and the scripts check
     * that each lock's key holds the session's owner id (fence_owner); NULL: marks alone. */
    const char *owner_prefix;
    size_t backend_plen; /* the backend's own key prefix: owner_prefix without "lock:"; 0: none */
    unsigned no_txn : 1; /* the upstream broke a pipelined transaction's rules: scripts only */
};

/* What to do with one request. */
enum req_action {
    REQ_FORWARD, /* send its bytes upstream unchanged */
    REQ_SKIP,    /* handled (answered, or sent in another form) */
    REQ_HOLD,    /* not now: parsing stops before it */
    REQ_IDLE,    /* not before every reply due on the upstream connection is in */
};

/* ---- shared by server.c and fencing.c ---------------------------------------------------- */

/* The clock at the start of the batch of requests or replies being handled (microseconds). */
uint64_t batch_now(void);
/* 1 when the n bytes at p equal lit, ignoring ASCII case. Inline, so that strlen of a literal
 * is folded. */
static inline int name_is(const char *p, size_t n, const char *lit)
{
    size_t l = strlen(lit);

    return n == l && strncasecmp(p, lit, l) == 0;
}

/* Whether an XREAD / XREADGROUP request m has BLOCK among its options (before STREAMS). Redis 7
 * flags both "blocking" always; only BLOCK makes them wait. */
static inline int xread_blocks(const char *m, const struct resp_request *r)
{
    for (size_t i = 1; i < r->argc && !name_is(m + r->argv[i].off, r->argv[i].len, "streams"); i++)
        if (name_is(m + r->argv[i].off, r->argv[i].len, "block"))
            return 1;
    return 0;
}

/* Appends an op to the client's queue; NULL when out of memory (the client is then dead). */
struct op *op_push(struct client *c, enum op_kind kind);
struct op *op_at(struct client *c, size_t i);
/* Sends every ready local reply now at the head of the queue. */
void ops_emit_ready(struct client *c);
/* Queues a reply of fencegate's own, in pipeline order (copied). */
void cl_reply_local(struct client *c, const char *p, size_t n);
/* Queues "-<text>\r\n" built from a printf format; CR/LF in it become spaces. */
void cl_reply_error(struct client *c, const char *fmt, ...) FG_PRINTF(2, 3);
/* Sends bytes to the client's upstream connection, its own or the shared one (queued while it
 * connects). */
void up_send(struct client *c, const char *p, size_t n);
/* Sends a fenced write (fence_encode_write()'s request, laid out as lay says): on the shared
 * connection it may join the writes sent just before it in one script call. */
struct fence_layout;
void up_send_fenced(struct client *c, const char *p, size_t n, const struct fence_layout *lay);
/* Whether fenced writes may go as pipelined transactions (fenced_transactions, Redis 7). */
int up_txn_ok(const struct client *c);
/* Tells the shared connection that one more reply is due to c, for a request sent again without
 * a new op (NOSCRIPT); a no-op for a pinned client. */
void up_expect_again(struct client *c);
/* Whether the fence script is loaded on the client's upstream connection; and setting it. */
int up_script_loaded(const struct client *c);
void up_set_script_loaded(struct client *c, int loaded);
/* Contiguous ranges of the input, forwarded with one write. */
void span_flush(struct client *c, struct span *s, int to_upstream);
void span_add(struct client *c, struct span *s, const char *p, size_t n, int to_upstream);
/* Lets requests held back by a barrier flow again. */
void cl_unblock(struct client *c);
/* Re-evaluates the connection after an event; may close and free it. */
void cl_update(struct client *c);

#endif
