/* lock_etcd.c — the etcd v3 lock backend (the correctness tier).
 *
 * The algorithm is etcd's own concurrency mutex, so `etcdctl lock PREFIX/NAME` and fencegate
 * exclude each other:
 *   - every session has a lease per lease length its locks ask for (usually one), kept alive over
 *     the client's single LeaseKeepAlive stream every ttl/3: one message renews every lock on it.
 *     A NORENEW lock gets a lease of its own that is never kept alive;
 *   - acquiring NAME puts the key PREFIX NAME "/" <lease id in hex> under that lease in a Txn
 *     guarded by create_revision == 0; the token is the key's create_revision;
 *   - the owner is the key under PREFIX NAME "/" with the lowest create_revision; a waiter watches
 *     only the deletion of the key just before its own (FIFO, no herd), then looks again in one
 *     Txn that also reads its own key: it reports ownership only if that key still exists (the
 *     check etcd 3.4's mutex lacks, etcd issue 11456);
 *   - release deletes the key only while its create_revision is still the token;
 *   - every held key is watched, so a key deleted or overwritten behind the session's back makes
 *     its lock lost at once (see "the watch on held keys").
 * Acquire and release Txns that start in the same turn of the event loop go to etcd as one Txn
 * (see "Txns sent as one" below): one Raft proposal for many locks. Two Txns of one lock never
 * share one, so every key of a lock still has a create_revision of its own.
 * A lock name that extends another with '/' (a and a/b) queues behind the other's holders, as with
 * etcd's mutex; safety is unaffected.
 *
 * A key left behind (a cancelled wait, a call whose outcome is unknown) is deleted by a guarded
 * "orphan" delete, retried after reconnects. A create whose outcome is unknown has no revision to
 * guard with, so its name is "dirty" in the session: the unguarded clean-up runs before any new
 * acquisition of that name in the session may start. etcd may still apply that create after the
 * clean-up (it was proposed before the call was given up, or is still on its way): the key would
 * then stand at the head of the name's queue with no holder, and keep every other owner waiting
 * for as long as the session lives. So the clean-up runs again 1, 2, 4, 8, 16 and 32 s later,
 * each time the session neither holds, acquires nor releases the name (a create of its own would
 * adopt such a key). Revoking the leases at session close deletes whatever is left.
 *
 * With etcd://user:password@..., every new connection first calls Auth/Authenticate; calls start
 * once it answered, each carrying the token as "token" metadata. A unary call refused for its
 * token (expired, or revoked) was refused before anything happened, so it is sent once more after
 * a new Authenticate; the watch stream, which keeps the token it was opened with, is reopened. */
#include <event2/event.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "etcdpb.h"
#include "grpc.h"
#include "lock_backend.h"

#define ED_DEFAULT_PORT  2379
#define ED_MAX_PREFIX    200
#define ED_MAX_ORPHANS   4096
#define ED_MAX_RESTARTS  4   /* re-creations of a waiter's key before giving up */
#define ED_RETRY_MS      100 /* a paused waiter looks again after this */
#define ED_LEASE_HEX_MAX 17
#define ED_BATCH_MAX     16   /* acquire/release Txns sent as one (etcd's --max-txn-ops >= 32) */
#define ED_TXQ_MAX       256  /* Txns waiting for the end of the loop turn; more go alone */
#define ED_DIRTY_AGAIN   6    /* clean-ups of a dirty name after the first, 1 s apart doubling */
#define ED_SWEEP_PAGE    1000 /* keys per Range when a restored etcd's keys are swept */

/* A completion's status when the call never reached etcd (not a gRPC status). */
#define ED_NOT_SENT (-1)

#define ED_PATH_TXN       "/etcdserverpb.KV/Txn"
#define ED_PATH_RANGE     "/etcdserverpb.KV/Range"
#define ED_PATH_GRANT     "/etcdserverpb.Lease/LeaseGrant"
#define ED_PATH_REVOKE    "/etcdserverpb.Lease/LeaseRevoke"
#define ED_PATH_KEEPALIVE "/etcdserverpb.Lease/LeaseKeepAlive"
#define ED_PATH_WATCH     "/etcdserverpb.Watch/Watch"
#define ED_PATH_AUTH      "/etcdserverpb.Auth/Authenticate"

#define ED_AUTH_RETRY_MAX_MS 8000  /* failed authentications are retried, backing off to this */
#define ED_WARN_MS           30000 /* a failure to connect or authenticate is logged this seldom */

static const struct grpc_metadata ed_hasleader[] = {{"hasleader", "true"}};

enum ed_lease_state { ED_LEASE_GRANTING, ED_LEASE_LIVE, ED_LEASE_LOST };

struct ed_client;
struct ed_sess;
struct ed_acq;
struct ed_rpc;

struct ed_lease {
    struct lock_hnode node;       /* by hex id in ec->leases while live */
    struct ed_lease *prev, *next; /* the session's leases */
    struct ed_client *ec;
    struct ed_sess *es;
    int64_t id;
    int32_t ttl_ms;
    int norenew;
    int in_map;
    enum ed_lease_state state;
    int refs;               /* held locks and acquisitions on it (NORENEW leases end at 0) */
    struct ed_acq *waiting; /* acquisitions waiting for the grant */
    int64_t confirmed_ms;   /* send time of the last grant or keepalive the server confirmed */
    int64_t ka_sent_ms;     /* the keepalive in flight: when it was sent; else 0 */
    int64_t grant_sent_ms;
    struct event *timer; /* keepalive ticks (renewable leases) */
    struct ed_rpc *grant;
    char hex[ED_LEASE_HEX_MAX];
};

/* Where the watch on a held key stands (see "the watch on held keys"). */
enum ed_hw {
    ED_HW_NONE,    /* to be watched from wrev (just granted: on ec->young) */
    ED_HW_PENDING, /* its watch create is sent, not answered yet */
    ED_HW_ACTIVE,  /* watched: watch_id, and in ec->hwatch */
    ED_HW_CHECK,   /* to be watched again: read with a Range first, then watched from there */
    ED_HW_GONE,    /* no longer watched (reported lost, or on its way out) */
};

struct ed_check;

/* A lock the backend granted to a session. */
struct ed_held {
    struct lock_hnode node;
    struct lock_hnode wnode; /* by watch id (wid) in ec->hwatch while ED_HW_ACTIVE */
    struct ed_sess *es;
    struct ed_lease *lease;
    int64_t rev;
    int64_t wrev; /* its watch starts (again) from this revision: nothing before it is unseen */
    int64_t watch_id;
    struct ed_wpend *wpend;
    struct ed_check *check; /* the re-check in flight, which has it at check->h[check_idx] */
    size_t check_idx;
    enum ed_hw hw;
    int key_gone; /* etcd has no key of it any more: nothing to delete when it is dropped */
    int young;    /* on ec->young until watch_at_ms */
    struct ed_held *yprev, *ynext;
    int64_t watch_at_ms;
    char wid[ED_LEASE_HEX_MAX];
    size_t keylen;
    char key[]; /* the name is the tail of the key */
};

/* A name of the session whose key may exist with an unknown revision (see the file comment).
 * While a clean-up is due or in flight it is in es->dirty, and acquisitions of the name wait
 * for it; between clean-ups it is on es->idle until next_ms. */
struct ed_dirty {
    struct lock_hnode node;
    struct ed_sess *es;
    struct ed_rpc *call;
    struct ed_acq *waiting;
    struct ed_dirty *inext; /* es->idle */
    int again;              /* clean-ups after the first, so far */
    int64_t next_ms;
    size_t keylen;
    char *name;
    char key[];
};

struct ed_sess {
    struct lock_session *s;
    struct ed_lease *leases;
    struct lock_map held;    /* struct ed_held by name */
    struct lock_map dirty;   /* struct ed_dirty by name */
    struct ed_dirty *idle;   /* dirty names between clean-ups */
    int hw_due;              /* a held key is ED_HW_NONE or ED_HW_CHECK */
    struct ed_check *checks; /* re-checks in flight */
};

/* A re-check of held keys of one session whose watch could not resume: one Txn of Ranges. */
struct ed_check {
    struct ed_check *next; /* es->checks */
    struct ed_sess *es;
    struct ed_rpc *call;
    size_t n;
    struct ed_held *h[ETCDPB_TXN_MAX_OPS]; /* NULL once forgotten */
};

enum ed_acq_phase {
    ED_ACQ_LEASE,  /* waiting for the lease, or for the clean-up of a dirty name */
    ED_ACQ_CREATE, /* the create Txn is in flight */
    ED_ACQ_FIND,   /* the predecessor / own-key Txn is in flight */
    ED_ACQ_WATCH,  /* watching the predecessor's deletion */
    ED_ACQ_PAUSED, /* a look failed or the connection is down: look again later */
};

struct ed_wpend;

/* An acquisition the backend owns (r->b_call). */
struct ed_acq {
    struct ed_acq *prev, *next; /* ec->acqs */
    struct ed_acq *lnext;       /* a lease's or a dirty name's waiting list */
    struct ed_client *ec;
    struct lock_req *r;
    struct ed_lease *lease; /* a reference, once chosen */
    enum ed_acq_phase phase;
    int64_t rev;   /* our key's create_revision, 0 while unknown */
    int seen_pred; /* another owner was ahead of us at some point */
    int restarts;
    struct ed_rpc *call;
    int64_t watch_id; /* -1 = none */
    struct ed_wpend *wpend;
    struct ed_dirty *dq; /* the dirty name whose clean-up it waits for */
    struct event *deadline, *retry;
    size_t pfxlen, keylen;
    char key[]; /* prefix name "/" hex */
};

typedef void (*ed_done_fn)(void *arg, int status, const char *err, const uint8_t *p, size_t n);

/* One unary call; the first response message is kept for the completion. */
struct ed_rpc {
    struct ed_rpc *prev, *next;
    struct ed_client *ec;
    struct grpc_call *call;
    ed_done_fn fn;
    void *arg;
    uint8_t *resp;
    size_t resp_len;
    int have_resp;
    /* With authentication: the request, to send again once if refused for its token. */
    const char *path;
    uint8_t *req;
    size_t req_len;
    int retried; /* sent again already, or waiting to be */
    int waiting; /* refused for its token: no call now, sent again after the next Authenticate */
    /* A Txn that may go as part of one (ed_txn_start()): req holds its compares (clen bytes),
     * its success ops (slen bytes, nsuccess ops), its failure ops (the rest of req_len), then
     * locklen bytes naming its lock. */
    int queued;             /* in ec->txq: not sent yet */
    struct ed_batch *batch; /* sent as part of this Txn, at m[slot] */
    size_t slot, clen, slen, nsuccess, locklen;
};

/* Txns sent as one: the members' compares, then their success ops, in m[] order. */
struct ed_batch {
    struct ed_client *ec;
    size_t n;
    struct {
        struct ed_rpc *k; /* NULL once cancelled or answered */
        size_t nsuccess;
    } m[ED_BATCH_MAX];
};

/* A key to delete while its create_revision is rev. */
struct ed_orphan {
    struct ed_orphan *next;
    struct ed_client *ec;
    struct ed_rpc *call;
    int64_t rev;
    size_t len;
    char key[];
};

/* A mark raise in flight (lock_mark_raise()). */
struct ed_mark {
    struct ed_mark *prev, *next;
    struct ed_client *ec;
    struct ed_rpc *call;
    lock_mark_cb cb;
    void *arg;
    uint64_t token;
};

/* A watch create sent and not yet answered (answers come in order): of a waiter (a) or of a held
 * key (h); both NULL once cancelled. */
struct ed_wpend {
    struct ed_wpend *next;
    struct ed_acq *a;
    struct ed_held *h;
};

struct ed_client {
    struct lock_client *c;
    struct grpc_channel *ch;
    struct ed_rpc *rpcs;
    struct ed_acq *acqs;
    struct lock_map leases; /* struct ed_lease by hex id */
    struct grpc_call *ka;
    struct grpc_call *watch;
    struct ed_wpend *wp_head, *wp_tail;
    struct lock_map hwatch; /* struct ed_held (wnode) by watch id, hex */
    int hw_due;             /* a session has hw_due set */
    struct event *hwkick;   /* ed_hw_service() at the end of the loop turn */
    int64_t hw_warned_ms;   /* a held key that could not be watched was logged then (0: never) */
    int64_t back_warned_ms; /* etcd's revisions going back were logged then (0: never) */
    /* etcd's revisions going back (see "a restored etcd"). */
    int64_t rev_seen;     /* the highest revision etcd answered on earlier connections */
    int64_t rev_conn;     /* the highest it answered on this one */
    int sweep_due;        /* the sweep is to run (again) */
    struct ed_rpc *sweep; /* its Range in flight */
    char *sweep_from;     /* the key its next page starts at (NULL: the prefix) */
    size_t sweep_from_len;
    struct ed_held *young_head, *young_tail; /* held keys not watched yet, oldest grant first */
    struct event *youngev;                   /* fires when the oldest of them is due */
    struct ed_orphan *orphans;
    size_t norphans;
    struct ed_mark *marks;
    size_t ndirty;         /* dirty names over all sessions, idle ones included */
    struct event *maint;   /* retries orphan deletes and dirty-name clean-ups every second */
    struct event *txflush; /* sends ec->txq at the end of the loop turn */
    struct ed_rpc *txq[ED_TXQ_MAX]; /* Txns to send, in the order they started */
    size_t ntxq;
    size_t batch_max; /* members per Txn sent as one: ED_BATCH_MAX, halved when etcd refuses
                       * one for its size (1: every Txn alone) */
    size_t check_max; /* Ranges per re-check of held keys: ETCDPB_TXN_MAX_OPS, halved likewise */
    struct etcdpb_buf out;
    char mark_prefix[ED_MAX_PREFIX + 16];
    /* Authentication (see the file comment). */
    int have_auth;
    int authed;          /* calls may start on this connection (authenticated, or no auth) */
    int up_done;         /* ed_ready_up() ran for this connection */
    struct ed_rpc *auth; /* the Authenticate call in flight */
    int64_t auth_next_ms, auth_backoff_ms, watch_refresh_ms;
    char user[128], pass[256];
    char why[LOCK_MSG_MAX]; /* the last authentication failure, while it lasts */
    struct grpc_tls *tls;   /* etcds:// */
    char down_why[LOCK_MSG_MAX];
    int64_t warned_ms; /* a failure was logged then, and etcd has not been ready since (0: no) */
};

static void ed_acq_start(struct ed_acq *a);
static void ed_acq_pause(struct ed_acq *a);
static void ed_acq_look(struct ed_acq *a);
static void ed_acq_restart(struct ed_acq *a, const char *why);
static void ed_lease_unref(struct ed_lease *l);
static void ed_orphans_flush(struct ed_client *ec);
static void ed_dirty_clean(struct ed_dirty *d);
static void ed_held_unwatch(struct ed_held *h);
static void ed_held_watch(struct ed_held *h);
static void ed_hw_service(struct ed_client *ec);
static void ed_hw_kick(struct ed_client *ec);
static int ed_kv_txn_decode(const uint8_t *p, size_t n, struct etcdpb_txn_resp *t, size_t want);

static struct ed_client *ed_of(const struct lock_client *c)
{
    return c->impl;
}

static struct etcdpb_slice ed_s(const void *p, size_t n)
{
    struct etcdpb_slice s = {p, n};
    return s;
}

/* The range_end selecting every key that starts with p[0..n): p with its last byte below 0xff
 * incremented (out has room for n bytes). Returns its length. */
static size_t ed_prefix_end(const char *p, size_t n, char *out)
{
    memcpy(out, p, n);
    while (n > 0) {
        if ((unsigned char)out[n - 1] < 0xff) {
            out[n - 1] = (char)((unsigned char)out[n - 1] + 1);
            return n;
        }
        n--;
    }
    out[0] = '\0';
    return 1;
}

/* ---- unary calls ---- */

static void ed_rpc_unlink(struct ed_rpc *k)
{
    if (k->prev)
        k->prev->next = k->next;
    else
        k->ec->rpcs = k->next;
    if (k->next)
        k->next->prev = k->prev;
}

static void ed_rpc_msg(void *arg, struct grpc_call *call, const uint8_t *msg, size_t len)
{
    struct ed_rpc *k = arg;
    (void)call;
    if (k->have_resp)
        return;
    k->resp = malloc(len ? len : 1);
    if (k->resp == NULL)
        return;
    memcpy(k->resp, msg, len);
    k->resp_len = len;
    k->have_resp = 1;
}

/* A failure that means this member cannot serve us: move to another endpoint. */
static void ed_maybe_failover(struct ed_client *ec, int status, const char *err)
{
    char why[300];
    if (status != GRPC_STATUS_DEADLINE_EXCEEDED && !strstr(err, "no leader") &&
        !strstr(err, "leader changed") && !strstr(err, "not capable") &&
        !strstr(err, "request timed out"))
        return;
    lock_fmt(why, sizeof(why), "etcd %s: %s", grpc_channel_endpoint(ec->ch),
             status == GRPC_STATUS_DEADLINE_EXCEEDED ? "a call timed out" : err);
    grpc_channel_failover(ec->ch, why);
}

static void ed_auth_send(struct ed_client *ec);
static void ed_batch_done(void *arg, int status, const char *err, const uint8_t *p, size_t n);
static void ed_batch_split(struct ed_rpc *k);

static void ed_rpc_end(void *arg, struct grpc_call *call, int status, const char *message)
{
    struct ed_rpc *k = arg;
    struct ed_client *ec = k->ec;
    char err[LOCK_MSG_MAX];
    (void)call;
    if (status == GRPC_STATUS_UNAUTHENTICATED && ec->have_auth && k->fn == ed_batch_done) {
        ed_batch_split(k); /* each member waits for the new token alone */
        ed_auth_send(ec);
        return;
    }
    if (status == GRPC_STATUS_UNAUTHENTICATED && ec->have_auth && k->req && !k->retried) {
        /* Refused for its token before anything was done: again, with a new one. */
        k->call = NULL;
        k->retried = k->waiting = 1;
        free(k->resp);
        k->resp = NULL;
        k->have_resp = 0;
        ed_auth_send(ec);
        return;
    }
    ed_rpc_unlink(k);
    if (status == GRPC_STATUS_OK && !k->have_resp) {
        status = GRPC_STATUS_INTERNAL;
        message = "the server ended the call without a response";
    }
    if (status == GRPC_STATUS_OK) {
        struct etcdpb_header hd;
        if (etcdpb_header_only_decode(k->resp, k->resp_len, &hd) == 0 && hd.revision > ec->rev_conn)
            ec->rev_conn = hd.revision;
    }
    if (status != GRPC_STATUS_OK) {
        ec->c->stats.backend_errors++;
        lock_fmt(err, sizeof(err), "etcd %s: %s%s(grpc status %d)", grpc_channel_endpoint(ec->ch),
                 message ? message : "", message && *message ? " " : "", status);
    }
    k->fn(k->arg, status, status == GRPC_STATUS_OK ? "" : err, k->resp, k->resp_len);
    free(k->resp);
    free(k->req);
    free(k);
    if (status != GRPC_STATUS_OK)
        ed_maybe_failover(ec, status, message ? message : "");
}

static const struct grpc_call_cbs ed_rpc_cbs = {ed_rpc_msg, ed_rpc_end};

/* 1 when calls can start: connected, and authenticated if etcd wants that. */
static int ed_ready(const struct ed_client *ec)
{
    return grpc_channel_ready(ec->ch) && ec->authed;
}

/* Why calls cannot start, for error messages. */
static const char *ed_not_ready(struct ed_client *ec)
{
    const char *last = grpc_channel_last_error(ec->ch);

    if (ec->why[0])
        return ec->why;
    if (!last[0])
        lock_fmt(ec->down_why, sizeof(ec->down_why), "etcd %s is not connected",
                 grpc_channel_endpoint(ec->ch));
    else /* last names the endpoint */
        lock_fmt(ec->down_why, sizeof(ec->down_why), "etcd is not connected (%s)", last);
    return ec->down_why;
}

static void ed_rpc_link(struct ed_rpc *k)
{
    struct ed_client *ec = k->ec;
    k->prev = NULL;
    k->next = ec->rpcs;
    if (ec->rpcs)
        ec->rpcs->prev = k;
    ec->rpcs = k;
}

/* Starts a unary call of the message in ec->out on the connection, authenticated or not. NULL
 * when not connected or out of memory. */
static struct ed_rpc *ed_rpc_begin(struct ed_client *ec, const char *path, ed_done_fn fn, void *arg)
{
    if (ec->out.oom || !grpc_channel_ready(ec->ch))
        return NULL;
    struct ed_rpc *k = calloc(1, sizeof(*k));
    if (k == NULL)
        return NULL;
    k->ec = ec;
    k->fn = fn;
    k->arg = arg;
    k->path = path;
    if (ec->have_auth && strcmp(path, ED_PATH_AUTH) != 0 &&
        (k->req = malloc(ec->out.len ? ec->out.len : 1)) != NULL) {
        memcpy(k->req, ec->out.p, ec->out.len);
        k->req_len = ec->out.len;
    }
    k->call =
        grpc_unary(ec->ch, path, ec->out.p, ec->out.len, ec->c->opt.op_timeout_ms, &ed_rpc_cbs, k);
    if (k->call == NULL) {
        free(k->req);
        free(k);
        return NULL;
    }
    ed_rpc_link(k);
    return k;
}

/* Starts a unary call of the message in ec->out. NULL when not ready or out of memory. */
static struct ed_rpc *ed_rpc_start(struct ed_client *ec, const char *path, ed_done_fn fn, void *arg)
{
    return ed_ready(ec) ? ed_rpc_begin(ec, path, fn, arg) : NULL;
}

/* Cancels k (NULL is a no-op): its completion never runs. A batch's own call is cancelled only
 * when the client closes, which cancels its members too. */
static void ed_rpc_cancel(struct ed_rpc *k)
{
    if (k == NULL)
        return;
    if (k->queued) {
        struct ed_client *ec = k->ec;
        size_t i = 0;
        while (i < ec->ntxq && ec->txq[i] != k)
            i++;
        if (i < ec->ntxq) {
            memmove(ec->txq + i, ec->txq + i + 1, (ec->ntxq - i - 1) * sizeof(ec->txq[0]));
            ec->ntxq--;
        }
    }
    if (k->batch)
        k->batch->m[k->slot].k = NULL;
    if (k->fn == ed_batch_done) {
        struct ed_batch *b = k->arg;
        for (size_t i = 0; i < b->n; i++)
            if (b->m[i].k)
                b->m[i].k->batch = NULL;
        free(b);
    }
    ed_rpc_unlink(k);
    grpc_call_cancel(k->call);
    free(k->resp);
    free(k->req);
    free(k);
}

/* A Txn deleting key when its create_revision is rev (rev 0: when it exists). */
static void ed_delete_ops(const char *key, size_t len, int64_t rev, struct etcdpb_compare *cmp,
                          struct etcdpb_op *op)
{
    memset(cmp, 0, sizeof(*cmp));
    memset(op, 0, sizeof(*op));
    cmp->result = rev ? ETCDPB_CMP_EQUAL : ETCDPB_CMP_GREATER;
    cmp->target = ETCDPB_TARGET_CREATE;
    cmp->key = ed_s(key, len);
    cmp->number = rev;
    op->kind = ETCDPB_OP_DELETE;
    op->u.del.key = ed_s(key, len);
}

static int ed_encode_delete(struct ed_client *ec, const char *key, size_t len, int64_t rev)
{
    struct etcdpb_compare cmp;
    struct etcdpb_op op;
    ed_delete_ops(key, len, rev, &cmp, &op);
    etcdpb_buf_reset(&ec->out);
    return etcdpb_txn_req_encode(&ec->out, &cmp, 1, &op, 1, NULL, 0);
}

/* ---- Txns sent as one ----
 *
 * A busy etcd's write rate is bounded by its Raft proposals, not by their size, so the acquire
 * and release Txns that start in one turn of the event loop go as one Txn: every member's
 * compares, then every member's success ops, no failure ops. When every compare holds, each
 * member's callback gets a TxnResponse of its own: the shared header (so the same revision) and
 * its own op responses (etcdpb_txn_resp_slice_encode()). When one does not, nothing was applied,
 * and each member goes again alone, with its failure ops. Two members of one lock never share a
 * Txn: their keys would share a create_revision, by which the mutex orders its waiters. Nor do
 * members of a and a/b, whose keys meet in the range a's mutex reads. */

/* Sends k's kept request (k->req) as a call of its own: a Txn that waited or went as part of
 * one, or a call refused for its token; etcd applied none of them. When it cannot start, k ends
 * now with ED_NOT_SENT. */
static void ed_rpc_send_kept(struct ed_rpc *k)
{
    struct ed_client *ec = k->ec;
    char err[LOCK_MSG_MAX];
    k->batch = NULL;
    k->call = ed_ready(ec) ? grpc_unary(ec->ch, k->path, k->req, k->req_len,
                                        ec->c->opt.op_timeout_ms, &ed_rpc_cbs, k)
                           : NULL;
    if (k->call)
        return;
    lock_fmt(err, sizeof(err), "%s", ed_not_ready(ec));
    ed_rpc_unlink(k);
    k->fn(k->arg, ED_NOT_SENT, err, NULL, 0);
    free(k->req);
    free(k);
}

/* A shared Txn refused for its token: each live member becomes a call of its own, waiting for
 * the new token (ed_rpc_resend_waiting()), so a member cancelled meanwhile is never sent. */
static void ed_batch_split(struct ed_rpc *k)
{
    struct ed_batch *b = k->arg;
    for (size_t i = 0; i < b->n; i++) {
        struct ed_rpc *m = b->m[i].k;
        if (m == NULL)
            continue;
        m->batch = NULL;
        m->retried = m->waiting = 1; /* a second refusal is its answer */
    }
    b->n = 0;
    k->call = NULL;   /* it has ended */
    ed_rpc_cancel(k); /* unlinks and frees it, and b */
}

/* etcd refused the Txn before applying any of it, for a reason a member may have alone (a lease
 * gone, too many ops, a key outside the user's permission): each goes again alone. */
static int ed_refused_whole(int status)
{
    return status == GRPC_STATUS_INVALID_ARGUMENT || status == GRPC_STATUS_NOT_FOUND ||
           status == GRPC_STATUS_PERMISSION_DENIED || status == GRPC_STATUS_FAILED_PRECONDITION ||
           status == GRPC_STATUS_OUT_OF_RANGE;
}

static void ed_batch_done(void *arg, int status, const char *err, const uint8_t *p, size_t n)
{
    struct ed_batch *b = arg;
    struct ed_client *ec = b->ec;
    struct etcdpb_txn_resp *t = malloc(sizeof(*t)); /* a callback may start anything */
    struct etcdpb_buf one = {0};
    size_t total = 0, off = 0;
    for (size_t i = 0; i < b->n; i++)
        total += b->m[i].nsuccess;
    int ok = status == GRPC_STATUS_OK && t && etcdpb_txn_resp_decode(p, n, t) == 0 &&
             (!t->succeeded || t->nresponses == total);
    int again = (ok && !t->succeeded) || ed_refused_whole(status);
    if (status != GRPC_STATUS_OK && strstr(err, "too many operations") && ec->batch_max > 1)
        ec->batch_max = b->n / 2 > 1 ? b->n / 2 : 1; /* etcd's --max-txn-ops is below ours */
    if (status == GRPC_STATUS_OK && !ok)
        err = t ? "malformed response to Txns sent as one" : "out of memory";
    for (size_t i = 0; i < b->n; off += b->m[i].nsuccess, i++) {
        struct ed_rpc *k = b->m[i].k;
        if (k == NULL)
            continue; /* cancelled */
        b->m[i].k = NULL;
        k->batch = NULL;
        if (again) {
            ed_rpc_send_kept(k);
            continue;
        }
        ed_rpc_unlink(k);
        etcdpb_buf_reset(&one);
        if (!ok)
            k->fn(k->arg, status != GRPC_STATUS_OK ? status : GRPC_STATUS_INTERNAL, err, NULL, 0);
        else if (etcdpb_txn_resp_slice_encode(&one, t, off, b->m[i].nsuccess) != 0)
            k->fn(k->arg, GRPC_STATUS_INTERNAL, "could not split a Txn response", NULL, 0);
        else
            k->fn(k->arg, GRPC_STATUS_OK, "", one.p, one.len);
        free(k->req);
        free(k);
    }
    etcdpb_buf_free(&one);
    free(t);
    free(b);
}

/* 1 when a member of b is of k's lock, or of a lock whose keys k's lock's range covers or the
 * other way round (a and a/b: "prefix/a/" begins "prefix/a/b/"). */
static int ed_batch_has_lock(const struct ed_batch *b, const struct ed_rpc *k)
{
    const uint8_t *lock = k->req + k->req_len;
    for (size_t i = 0; i < b->n; i++) {
        const struct ed_rpc *o = b->m[i].k;
        size_t n = o->locklen < k->locklen ? o->locklen : k->locklen;
        if (memcmp(o->req + o->req_len, lock, n) == 0)
            return 1;
    }
    return 0;
}

/* Sends b's members as one Txn, or alone when there is one or the Txn cannot start. */
static void ed_batch_send(struct ed_client *ec, struct ed_batch *b)
{
    struct ed_rpc *call = NULL;
    if (b->n > 1) {
        etcdpb_buf_reset(&ec->out);
        for (size_t i = 0; i < b->n; i++)
            etcdpb_buf_append(&ec->out, b->m[i].k->req, b->m[i].k->clen);
        for (size_t i = 0; i < b->n; i++)
            etcdpb_buf_append(&ec->out, b->m[i].k->req + b->m[i].k->clen, b->m[i].k->slen);
        call = ed_rpc_start(ec, ED_PATH_TXN, ed_batch_done, b); /* NULL when out.oom */
    }
    for (size_t i = 0; i < b->n; i++) {
        b->m[i].k->batch = b;
        b->m[i].k->slot = i;
    }
    if (call) {
        ec->c->stats.backend_batches++;
        ec->c->stats.backend_batched += b->n;
        return;
    }
    for (size_t i = 0; i < b->n; i++) { /* a callback may cancel a later member */
        struct ed_rpc *k = b->m[i].k;
        b->m[i].k = NULL;
        if (k)
            ed_rpc_send_kept(k);
    }
    free(b);
}

static void ed_txq_flush(evutil_socket_t fd, short what, void *arg)
{
    struct ed_client *ec = arg;
    (void)fd;
    (void)what;
    while (ec->ntxq > 0) {
        struct ed_batch *b = calloc(1, sizeof(*b));
        size_t ops = 0, keep = 0;
        if (b == NULL) {
            struct ed_rpc *k = ec->txq[0];
            memmove(ec->txq, ec->txq + 1, --ec->ntxq * sizeof(ec->txq[0]));
            k->queued = 0;
            ed_rpc_send_kept(k);
            continue;
        }
        b->ec = ec;
        for (size_t i = 0; i < ec->ntxq; i++) { /* in order; a second Txn of a lock waits */
            struct ed_rpc *k = ec->txq[i];
            if (b->n < ec->batch_max && ops + k->nsuccess <= ETCDPB_TXN_MAX_OPS &&
                !ed_batch_has_lock(b, k)) {
                k->queued = 0;
                b->m[b->n].k = k;
                b->m[b->n++].nsuccess = k->nsuccess;
                ops += k->nsuccess;
            } else {
                ec->txq[keep++] = k;
            }
        }
        ec->ntxq = keep;
        ed_batch_send(ec, b);
    }
}

/* Starts a Txn for the lock whose keys begin with lock[0..locklen): queued until the end of the
 * loop turn, to go as one with others (above). NULL when etcd is not ready or out of memory;
 * fn then never runs. */
static struct ed_rpc *ed_txn_start(struct ed_client *ec, const char *lock, size_t locklen,
                                   const struct etcdpb_compare *cmp, size_t ncmp,
                                   const struct etcdpb_op *success, size_t nsuccess,
                                   const struct etcdpb_op *failure, size_t nfailure, ed_done_fn fn,
                                   void *arg)
{
    size_t clen, slen;
    etcdpb_buf_reset(&ec->out);
    if (etcdpb_txn_req_encode(&ec->out, cmp, ncmp, NULL, 0, NULL, 0) != 0)
        return NULL;
    clen = ec->out.len;
    if (etcdpb_txn_req_encode(&ec->out, NULL, 0, success, nsuccess, NULL, 0) != 0)
        return NULL;
    slen = ec->out.len - clen;
    if (etcdpb_txn_req_encode(&ec->out, NULL, 0, NULL, 0, failure, nfailure) != 0)
        return NULL;
    if (ec->batch_max < 2 || ec->ntxq == ED_TXQ_MAX)
        return ed_rpc_start(ec, ED_PATH_TXN, fn, arg);
    if (!ed_ready(ec))
        return NULL;
    struct ed_rpc *k = calloc(1, sizeof(*k));
    uint8_t *req = k ? malloc(ec->out.len + locklen) : NULL;
    if (req == NULL) {
        free(k);
        return NULL;
    }
    memcpy(req, ec->out.p, ec->out.len);
    memcpy(req + ec->out.len, lock, locklen);
    k->ec = ec;
    k->fn = fn;
    k->arg = arg;
    k->path = ED_PATH_TXN;
    k->req = req;
    k->req_len = ec->out.len;
    k->clen = clen;
    k->slen = slen;
    k->nsuccess = nsuccess;
    k->locklen = locklen;
    k->queued = 1;
    ed_rpc_link(k);
    ec->txq[ec->ntxq++] = k;
    if (ec->ntxq == 1)
        event_active(ec->txflush, EV_TIMEOUT, 0);
    return k;
}

/* ---- orphan deletes ---- */

static void ed_orphan_unlink(struct ed_orphan *o)
{
    struct ed_client *ec = o->ec;
    for (struct ed_orphan **p = &ec->orphans; *p; p = &(*p)->next) {
        if (*p == o) {
            *p = o->next;
            ec->norphans--;
            return;
        }
    }
}

static void ed_orphan_done(void *arg, int status, const char *err, const uint8_t *p, size_t n)
{
    struct ed_orphan *o = arg;
    (void)err;
    (void)p;
    (void)n;
    o->call = NULL;
    if (status == GRPC_STATUS_OK) {
        ed_orphan_unlink(o);
        free(o);
    }
}

static void ed_orphans_flush(struct ed_client *ec)
{
    for (struct ed_orphan *o = ec->orphans; o; o = o->next) {
        if (o->call || ed_encode_delete(ec, o->key, o->len, o->rev) != 0)
            continue;
        o->call = ed_rpc_start(ec, ED_PATH_TXN, ed_orphan_done, o);
        if (o->call == NULL)
            return;
    }
}

/* Deletes key while its create_revision is rev (> 0): now if connected, else after a connect. */
static void ed_orphan(struct ed_client *ec, const char *key, size_t len, int64_t rev)
{
    if (rev <= 0 || ec->norphans >= ED_MAX_ORPHANS)
        return; /* the lease's end removes it */
    struct ed_orphan *o = calloc(1, sizeof(*o) + len);
    if (o == NULL)
        return;
    o->ec = ec;
    o->rev = rev;
    o->len = len;
    memcpy(o->key, key, len);
    o->next = ec->orphans;
    ec->orphans = o;
    ec->norphans++;
    ed_orphans_flush(ec);
}

/* ---- sessions ---- */

static struct ed_sess *ed_sess_get(struct lock_session *s)
{
    if (s->b_sess == NULL) {
        struct ed_sess *es = calloc(1, sizeof(*es));
        if (es == NULL)
            return NULL;
        es->s = s;
        s->b_sess = es;
    }
    return s->b_sess;
}

static struct ed_held *ed_held_find(struct ed_sess *es, const char *name, size_t len)
{
    return (struct ed_held *)(void *)lock_map_find(&es->held, name, len);
}

/* Frees a held record that is out of the session's map (a release in flight keeps it there:
 * the session may take the name again before the answer comes) and drops its lease reference. */
static void ed_held_drop_record(struct ed_held *h)
{
    struct ed_lease *l = h->lease;
    ed_held_unwatch(h);
    free(h);
    ed_lease_unref(l);
}

static void ed_held_forget(struct ed_sess *es, struct ed_held *h)
{
    lock_map_remove(&es->held, &h->node);
    ed_held_drop_record(h);
}

/* ---- leases ---- */

static void ed_lease_tick(evutil_socket_t fd, short what, void *arg);

static void ed_lease_arm(struct ed_lease *l, int64_t delay_ms)
{
    struct timeval tv = {(time_t)(delay_ms / 1000), (suseconds_t)((delay_ms % 1000) * 1000)};
    if (l->timer)
        evtimer_add(l->timer, &tv);
}

static void ed_lease_revoke_done(void *arg, int status, const char *err, const uint8_t *p, size_t n)
{
    (void)arg;
    (void)status;
    (void)err;
    (void)p;
    (void)n;
}

/* Frees l (revoking it on the server when granted: its keys go with it). */
static void ed_lease_free(struct ed_lease *l)
{
    struct ed_client *ec = l->ec;
    if (l->state != ED_LEASE_GRANTING && l->id != 0 &&
        etcdpb_lease_revoke_req_encode((etcdpb_buf_reset(&ec->out), &ec->out), l->id) == 0)
        ed_rpc_start(ec, ED_PATH_REVOKE, ed_lease_revoke_done, NULL);
    ed_rpc_cancel(l->grant);
    if (l->in_map)
        lock_map_remove(&ec->leases, &l->node);
    if (l->es) {
        if (l->prev)
            l->prev->next = l->next;
        else
            l->es->leases = l->next;
        if (l->next)
            l->next->prev = l->prev;
    }
    if (l->timer)
        event_free(l->timer);
    free(l);
}

/* Drops a reference. A NORENEW lease ends with its last reference; a session's lease lives as
 * long as the session (so acquiring again costs no grant), unless it is lost. */
static void ed_lease_unref(struct ed_lease *l)
{
    if (l == NULL)
        return;
    if (--l->refs > 0)
        return;
    if (l->norenew || l->state == ED_LEASE_LOST || l->es == NULL)
        ed_lease_free(l);
}

/* Fails every acquisition waiting for l's grant. */
static void ed_acq_fail(struct ed_acq *a, int status, const char *msg);

static void ed_lease_granted(void *arg, int status, const char *err, const uint8_t *p, size_t n)
{
    struct ed_lease *l = arg;
    struct ed_client *ec = l->ec;
    struct etcdpb_lease_grant_resp g;
    char msg[LOCK_MSG_MAX];
    l->grant = NULL;
    if (status == GRPC_STATUS_OK && etcdpb_lease_grant_resp_decode(p, n, &g) == 0 &&
        g.error.n == 0 && g.id > 0 && g.ttl > 0) {
        l->id = g.id;
        lock_fmt(l->hex, sizeof(l->hex), "%" PRIx64, (uint64_t)g.id);
        lock_hnode_init(&l->node, l->hex, strlen(l->hex));
        l->in_map = lock_map_insert(&ec->leases, &l->node) == 0;
        l->state = ED_LEASE_LIVE;
        l->confirmed_ms = l->grant_sent_ms;
        if (!l->norenew)
            ed_lease_arm(l, l->ttl_ms / 3);
    } else {
        l->state = ED_LEASE_LOST;
        if (status == GRPC_STATUS_OK)
            lock_fmt(msg, sizeof(msg), "etcd refused a lease: %.*s",
                     (int)(g.error.n > 200 ? 200 : g.error.n), g.error.p ? (char *)g.error.p : "");
        else
            lock_fmt(msg, sizeof(msg), "etcd lease grant failed: %s", err);
    }
    /* Every waiter holds a reference, so l outlives this loop. */
    l->refs++;
    while (l->waiting) {
        struct ed_acq *a = l->waiting;
        l->waiting = a->lnext;
        a->lnext = NULL;
        if (l->state == ED_LEASE_LIVE)
            ed_acq_start(a);
        else
            ed_acq_fail(a, LOCK_UNAVAILABLE, msg);
    }
    ed_lease_unref(l);
}

/* A lease (with a reference taken) for an acquisition of ttl_ms: the session's live or granting
 * one of that length, or a new one. NULL when not connected or out of memory. */
static struct ed_lease *ed_lease_for(struct ed_sess *es, int32_t ttl_ms, int norenew)
{
    struct ed_client *ec = ed_of(es->s->c);
    struct ed_lease *l;
    if (!norenew)
        for (l = es->leases; l; l = l->next)
            if (!l->norenew && l->ttl_ms == ttl_ms && l->state != ED_LEASE_LOST) {
                l->refs++;
                return l;
            }
    l = calloc(1, sizeof(*l));
    if (l == NULL)
        return NULL;
    l->ec = ec;
    l->es = es;
    l->ttl_ms = ttl_ms;
    l->norenew = norenew;
    l->state = ED_LEASE_GRANTING;
    if (!norenew && (l->timer = evtimer_new(ec->c->base, ed_lease_tick, l)) == NULL) {
        free(l);
        return NULL;
    }
    etcdpb_buf_reset(&ec->out);
    /* etcd counts leases in seconds: round up, so the server never drops it before we do. */
    if (etcdpb_lease_grant_req_encode(&ec->out, (ttl_ms + 999) / 1000, 0) != 0)
        ec->out.oom = 1;
    l->grant_sent_ms = lock_now_ms();
    l->grant = ed_rpc_start(ec, ED_PATH_GRANT, ed_lease_granted, l);
    if (l->grant == NULL) {
        if (l->timer)
            event_free(l->timer);
        free(l);
        return NULL;
    }
    l->next = es->leases;
    if (es->leases)
        es->leases->prev = l;
    es->leases = l;
    l->refs = 1;
    return l;
}

/* l is gone on the server: every lock on it is lost at once, every waiter on it starts over. */
static void ed_lease_lost(struct ed_lease *l, const char *why)
{
    struct ed_client *ec = l->ec;
    if (l->state == ED_LEASE_LOST)
        return;
    l->state = ED_LEASE_LOST;
    if (l->in_map) {
        lock_map_remove(&ec->leases, &l->node);
        l->in_map = 0;
    }
    if (l->timer)
        evtimer_del(l->timer);
    l->refs++;
    if (l->es) {
        size_t b = 0;
        struct lock_hnode *it = NULL, *n;
        while ((n = lock_map_next(&l->es->held, &b, &it)) != NULL) {
            struct ed_held *h = (struct ed_held *)(void *)n;
            if (h->lease == l)
                lock_renew_result(l->es->s, h->node.name, h->node.len, (uint64_t)h->rev,
                                  l->confirmed_ms, 0);
        }
    }
    for (struct ed_acq *a = ec->acqs, *next; a; a = next) {
        next = a->next;
        if (a->lease == l && a->phase != ED_ACQ_LEASE)
            ed_acq_restart(a, why);
    }
    ed_lease_unref(l);
}

/* ---- the keepalive stream ---- */

static void ed_ka_msg(void *arg, struct grpc_call *call, const uint8_t *msg, size_t len)
{
    struct ed_client *ec = arg;
    struct etcdpb_lease_keepalive_resp k;
    char hex[ED_LEASE_HEX_MAX], why[128];
    (void)call;
    if (etcdpb_lease_keepalive_resp_decode(msg, len, &k) != 0 || k.id <= 0)
        return;
    lock_fmt(hex, sizeof(hex), "%" PRIx64, (uint64_t)k.id);
    struct ed_lease *l = (struct ed_lease *)(void *)lock_map_find(&ec->leases, hex, strlen(hex));
    if (l == NULL || l->ka_sent_ms == 0)
        return;
    int64_t sent = l->ka_sent_ms;
    l->ka_sent_ms = 0;
    if (k.ttl <= 0) {
        lock_fmt(why, sizeof(why), "etcd says its lease %s has expired", l->hex);
        ed_lease_lost(l, why);
        return;
    }
    l->confirmed_ms = sent;
    if (l->es == NULL)
        return;
    size_t b = 0;
    struct lock_hnode *it = NULL, *n;
    while ((n = lock_map_next(&l->es->held, &b, &it)) != NULL) {
        struct ed_held *h = (struct ed_held *)(void *)n;
        if (h->lease == l)
            lock_renew_result(l->es->s, h->node.name, h->node.len, (uint64_t)h->rev, sent, 1);
    }
}

static void ed_ka_end(void *arg, struct grpc_call *call, int status, const char *message)
{
    struct ed_client *ec = arg;
    (void)call;
    ec->ka = NULL;
    /* The answers in flight are lost with the stream; the next tick sends again. */
    size_t b = 0;
    struct lock_hnode *it = NULL, *n;
    while ((n = lock_map_next(&ec->leases, &b, &it)) != NULL)
        ((struct ed_lease *)(void *)n)->ka_sent_ms = 0;
    if (status != GRPC_STATUS_OK)
        ec->c->stats.backend_errors++;
    if (status == GRPC_STATUS_UNAUTHENTICATED)
        ed_auth_send(ec); /* the next tick opens a stream with the new token */
    ed_maybe_failover(ec, status, message ? message : "");
}

static const struct grpc_call_cbs ed_ka_cbs = {ed_ka_msg, ed_ka_end};

static void ed_lease_keepalive(struct ed_lease *l)
{
    struct ed_client *ec = l->ec;
    int64_t now = lock_now_ms();
    if (l->norenew || l->state != ED_LEASE_LIVE || !ed_ready(ec))
        return; /* a NORENEW lease is a fixed lease: never extended */
    if (l->ka_sent_ms != 0 && now - l->ka_sent_ms < ec->c->opt.op_timeout_ms)
        return; /* still waiting for the last answer */
    if (l->ka_sent_ms != 0 && ec->ka) {
        /* No answer in time: the stream is stuck; a new one replaces it, and every answer that
         * was due on the old one is given up, as when a stream ends. */
        size_t b = 0;
        struct lock_hnode *it = NULL, *n;
        grpc_call_cancel(ec->ka);
        ec->ka = NULL;
        while ((n = lock_map_next(&ec->leases, &b, &it)) != NULL)
            ((struct ed_lease *)(void *)n)->ka_sent_ms = 0;
    }
    if (ec->ka == NULL)
        ec->ka = grpc_call_start(ec->ch, ED_PATH_KEEPALIVE, ed_hasleader, 1, 0, &ed_ka_cbs, ec);
    etcdpb_buf_reset(&ec->out);
    if (ec->ka == NULL || etcdpb_lease_keepalive_req_encode(&ec->out, l->id) != 0 ||
        grpc_call_send(ec->ka, ec->out.p, ec->out.len) != 0)
        return;
    l->ka_sent_ms = now;
}

static void ed_lease_tick(evutil_socket_t fd, short what, void *arg)
{
    struct ed_lease *l = arg;
    (void)fd;
    (void)what;
    ed_lease_keepalive(l);
    ed_lease_arm(l, l->ttl_ms / 3);
}

/* ---- the watch stream ----
 *
 * One Watch stream per client carries every watch: a waiter's on its predecessor's key, and one
 * per held key (below). etcd answers creates in the order they were sent (ec->wp_head). */

static void ed_watch_cancel_id(struct ed_client *ec, int64_t id)
{
    etcdpb_buf_reset(&ec->out);
    if (ec->watch && etcdpb_watch_cancel_encode(&ec->out, id) == 0)
        grpc_call_send(ec->watch, ec->out.p, ec->out.len);
}

/* Ends, on etcd's side, a watch that is over for fencegate. A watch etcd ended by compaction
 * (compact_revision set, although marked canceled) is still kept by etcd, and counted among its
 * watchers, until the client cancels it (3.4 frees it only then): one is left behind for the
 * stream's life otherwise. One etcd cancelled for another reason is gone already. */
static void ed_watch_over(struct ed_client *ec, int64_t id, const struct etcdpb_watch_resp *w)
{
    if (!w->canceled || w->compact_revision > 0)
        ed_watch_cancel_id(ec, id);
}

static const struct grpc_call_cbs ed_watch_cbs;

/* Sends a create watching key[0..len) from revision `from` on, on the stream (opened if need
 * be). Returns its place among the creates awaiting an answer (the caller sets its a or h), or
 * NULL when etcd is not ready, the stream refused it, or out of memory. */
static struct ed_wpend *ed_watch_create(struct ed_client *ec, const void *key, size_t len,
                                        int64_t from, unsigned filters)
{
    struct etcdpb_watch_create wc;
    struct ed_wpend *wp;
    if (!ed_ready(ec))
        return NULL;
    if (ec->watch == NULL)
        ec->watch = grpc_call_start(ec->ch, ED_PATH_WATCH, ed_hasleader, 1, 0, &ed_watch_cbs, ec);
    if (ec->watch == NULL || (wp = calloc(1, sizeof(*wp))) == NULL)
        return NULL;
    memset(&wc, 0, sizeof(wc));
    wc.key = ed_s(key, len);
    wc.start_revision = from;
    wc.filters = filters;
    etcdpb_buf_reset(&ec->out);
    if (etcdpb_watch_create_encode(&ec->out, &wc) != 0 ||
        grpc_call_send(ec->watch, ec->out.p, ec->out.len) != 0) {
        free(wp);
        return NULL;
    }
    if (ec->wp_tail)
        ec->wp_tail->next = wp;
    else
        ec->wp_head = wp;
    ec->wp_tail = wp;
    return wp;
}

/* Stops a's watch (or its pending create). */
static void ed_acq_unwatch(struct ed_acq *a)
{
    if (a->wpend) {
        a->wpend->a = NULL;
        a->wpend = NULL;
    }
    if (a->watch_id >= 0) {
        ed_watch_cancel_id(a->ec, a->watch_id);
        a->watch_id = -1;
    }
}

static struct ed_acq *ed_acq_by_watch(struct ed_client *ec, int64_t id)
{
    for (struct ed_acq *a = ec->acqs; a; a = a->next)
        if (a->watch_id == id)
            return a;
    return NULL;
}

/* ---- the watch on held keys ----
 *
 * A keepalive proves the lease, not the keys on it: a key deleted (`etcdctl del`) or put anew
 * behind the session's back would stay "held" until released. So every held key is watched, one
 * watcher per key on the client's one stream (a sidecar hears of its own keys only, not of every
 * lock under the prefix), set up ED_WATCH_AFTER_MS after the grant (a lock released sooner costs
 * no watcher) and starting from the revision after its creation, so nothing in between is missed.
 * A DELETE, or a PUT that leaves the key with another create_revision or another lease, makes
 * the lock lost at once, as a refused renewal does. A watch that has to be set up again (the
 * stream or the connection broke, or was replaced for a new token; etcd compacted past the watch,
 * or refused it) never resumes from an old revision, which would have etcd replay its whole
 * history since: the session's keys are read again with one Txn of Ranges (up to 128 keys each,
 * fewer once etcd refused that many: its --max-txn-ops), and watched from after that read. While
 * a key cannot be watched (etcd unreachable, the watch refused) nothing is lost for that alone:
 * the lease's keepalive still decides, it is tried again every second, and the failure is
 * logged. */

#define ED_HW_WARN_MS     30000 /* a key that cannot be watched is logged at most this often */
#define ED_WATCH_AFTER_MS 100   /* a held key is watched this long after its grant */

static void ed_hw_warn(struct ed_client *ec, const char *fmt, ...) LOCK_PRINTF(2, 3);
static void ed_hw_warn(struct ed_client *ec, const char *fmt, ...)
{
    char msg[LOCK_MSG_MAX];
    va_list ap;
    if (!ec->c->opt.warn || !lock_warn_due(&ec->hw_warned_ms, ED_HW_WARN_MS))
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ec->c->opt.warn(ec->c->opt.warn_arg, msg);
}

/* h needs its watch set up (NONE) or its key read first (CHECK): at the next ed_hw_service(). */
static void ed_hw_due(struct ed_held *h, enum ed_hw st)
{
    h->hw = st;
    h->es->hw_due = 1;
    h->lease->ec->hw_due = 1;
}

static void ed_hw_kick(struct ed_client *ec)
{
    if (ec->hwkick)
        event_active(ec->hwkick, EV_TIMEOUT, 0);
}

/* Takes h off the list of keys whose watch starts later, if it is there. */
static void ed_held_unyoung(struct ed_held *h)
{
    struct ed_client *ec = h->lease->ec;
    if (!h->young)
        return;
    if (h->yprev)
        h->yprev->ynext = h->ynext;
    else
        ec->young_head = h->ynext;
    if (h->ynext)
        h->ynext->yprev = h->yprev;
    else
        ec->young_tail = h->yprev;
    h->yprev = h->ynext = NULL;
    h->young = 0;
}

static void ed_young_arm(struct ed_client *ec, int64_t now)
{
    int64_t d = ec->young_head ? ec->young_head->watch_at_ms - now : 0;
    struct timeval tv = {0, (suseconds_t)((d > 0 ? d : 0) * 1000)};
    if (ec->young_head && ec->youngev)
        evtimer_add(ec->youngev, &tv);
}

/* A key just granted is watched ED_WATCH_AFTER_MS later, from the revision after its creation:
 * a lock released sooner (a short job, a benchmark's cycle) never costs etcd a watcher, and a
 * change in between is still seen, when the watch starts. */
static void ed_held_watch_later(struct ed_held *h)
{
    struct ed_client *ec = h->lease->ec;
    int64_t now = lock_now_ms();
    h->hw = ED_HW_NONE;
    h->watch_at_ms = now + ED_WATCH_AFTER_MS;
    h->young = 1;
    h->ynext = NULL;
    h->yprev = ec->young_tail;
    if (ec->young_tail)
        ec->young_tail->ynext = h;
    else
        ec->young_head = h;
    ec->young_tail = h;
    if (h->yprev == NULL)
        ed_young_arm(ec, now);
}

static void ed_young_cb(evutil_socket_t fd, short what, void *arg)
{
    struct ed_client *ec = arg;
    int64_t now = lock_now_ms();
    (void)fd;
    (void)what;
    while (ec->young_head && ec->young_head->watch_at_ms <= now)
        ed_held_watch(ec->young_head); /* takes it off the list */
    ed_young_arm(ec, now);
}

/* Stops h's watch, its pending create and its re-check: h is no longer watched. */
static void ed_held_unwatch(struct ed_held *h)
{
    struct ed_client *ec = h->lease->ec;
    ed_held_unyoung(h);
    if (h->wpend) {
        h->wpend->h = NULL;
        h->wpend = NULL;
    }
    if (h->hw == ED_HW_ACTIVE) {
        lock_map_remove(&ec->hwatch, &h->wnode);
        ed_watch_cancel_id(ec, h->watch_id);
    }
    if (h->check) {
        h->check->h[h->check_idx] = NULL;
        h->check = NULL;
    }
    h->watch_id = -1;
    h->hw = ED_HW_GONE;
}

/* Watches h's key from h->wrev on, or leaves it due for the next try. */
static void ed_held_watch(struct ed_held *h)
{
    struct ed_client *ec = h->lease->ec;
    ed_held_unyoung(h);
    struct ed_wpend *wp = ed_watch_create(ec, h->key, h->keylen, h->wrev, 0);
    if (wp == NULL) {
        ed_hw_due(h, ED_HW_CHECK);
        if (ed_ready(ec))
            ed_hw_warn(ec,
                       "etcd %s: lock key %.*s could not be watched (the watch stream refused "
                       "it); tried again every second, its lease's keepalive still decides",
                       grpc_channel_endpoint(ec->ch), (int)(h->keylen > 300 ? 300 : h->keylen),
                       h->key);
        return;
    }
    wp->h = h;
    h->wpend = wp;
    h->hw = ED_HW_PENDING;
}

/* etcd says h's lock is no longer the session's: reported lost as a refused renewal is. */
static void ed_held_lost(struct ed_held *h, int key_gone, const char *fmt, ...) LOCK_PRINTF(3, 4);
static void ed_held_lost(struct ed_held *h, int key_gone, const char *fmt, ...)
{
    char why[LOCK_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    ed_held_unwatch(h);
    h->key_gone = key_gone;
    lock_held_gone(h->es->s, h->node.name, h->node.len, (uint64_t)h->rev, why);
}

/* What etcd shows of h's key (kv, NULL when it has none) says about h's lock; how it was seen. */
static int ed_held_judge(struct ed_held *h, const struct etcdpb_kv *kv, const char *seen)
{
    if (kv == NULL) {
        ed_held_lost(h, 1, "its key is gone from etcd (%s)", seen);
        return 0;
    }
    if (kv->create_revision != h->rev) {
        ed_held_lost(h, 1, "its key was deleted in etcd and created again at revision %lld (%s)",
                     (long long)kv->create_revision, seen);
        return 0;
    }
    if (kv->lease != h->lease->id) {
        ed_held_lost(h, 0,
                     "its key was overwritten in etcd at revision %lld and is no longer on the "
                     "session's lease %s (%s)",
                     (long long)kv->mod_revision, h->lease->hex, seen);
        return 0;
    }
    return 1;
}

/* The answer to h's watch create. */
static void ed_held_created(struct ed_client *ec, struct ed_held *h,
                            const struct etcdpb_watch_resp *w)
{
    h->wpend = NULL;
    if (w->canceled && w->compact_revision == 0) {
        /* Refused ("permission denied": with authentication, the stream's token may have
         * expired): a new token and stream; the key is watched again within a second. */
        if (ec->have_auth && lock_now_ms() - ec->watch_refresh_ms >= 5000) {
            ec->watch_refresh_ms = lock_now_ms();
            ed_auth_send(ec);
        }
        ed_hw_due(h, ED_HW_CHECK);
        ed_hw_warn(ec,
                   "etcd %s refused to watch lock key %.*s: %.*s; tried again every second, its "
                   "lease's keepalive still decides",
                   grpc_channel_endpoint(ec->ch), (int)(h->keylen > 300 ? 300 : h->keylen), h->key,
                   (int)(w->cancel_reason.n > 200 ? 200 : w->cancel_reason.n),
                   w->cancel_reason.p ? (const char *)w->cancel_reason.p : "");
        return;
    }
    if (w->canceled) { /* compacted past wrev: read the key instead */
        ed_watch_over(ec, w->watch_id, w);
        ed_hw_due(h, ED_HW_CHECK);
        ed_hw_kick(ec);
        return;
    }
    h->watch_id = w->watch_id;
    lock_fmt(h->wid, sizeof(h->wid), "%" PRIx64, (uint64_t)w->watch_id);
    lock_hnode_init(&h->wnode, h->wid, strlen(h->wid));
    if (lock_map_insert(&ec->hwatch, &h->wnode) != 0) {
        ed_watch_cancel_id(ec, w->watch_id);
        h->watch_id = -1;
        ed_hw_due(h, ED_HW_CHECK);
        return;
    }
    h->hw = ED_HW_ACTIVE;
}

/* Events (or the end) of a held key's watch; ignored when the id is not one. */
static void ed_held_watch_msg(struct ed_client *ec, const struct etcdpb_watch_resp *w)
{
    char wid[ED_LEASE_HEX_MAX];
    struct etcdpb_event ev;
    size_t off = 0;
    lock_fmt(wid, sizeof(wid), "%" PRIx64, (uint64_t)w->watch_id);
    struct lock_hnode *n = lock_map_find(&ec->hwatch, wid, strlen(wid));
    if (n == NULL)
        return; /* cancelled meanwhile (a release's own delete, say) */
    struct ed_held *h = (struct ed_held *)(void *)((char *)n - offsetof(struct ed_held, wnode));
    while (etcdpb_watch_resp_next(w, &off, &ev) == 1) {
        if (ev.kv.mod_revision >= h->wrev)
            h->wrev = ev.kv.mod_revision + 1;
        if (ev.type == ETCDPB_EVENT_DELETE) {
            ed_held_lost(h, 1, "its key was deleted in etcd at revision %lld (its watch saw it)",
                         (long long)ev.kv.mod_revision);
            return;
        }
        if (!ed_held_judge(h, &ev.kv, "its watch saw it"))
            return;
    }
    if (w->canceled || w->compact_revision > 0) {
        ed_watch_over(ec, h->watch_id, w);
        lock_map_remove(&ec->hwatch, &h->wnode);
        h->watch_id = -1;
        ed_hw_due(h, ED_HW_CHECK);
        ed_hw_kick(ec);
    }
}

static void ed_check_free(struct ed_check *k)
{
    for (struct ed_check **p = &k->es->checks; *p; p = &(*p)->next)
        if (*p == k) {
            *p = k->next;
            break;
        }
    for (size_t i = 0; i < k->n; i++)
        if (k->h[i])
            k->h[i]->check = NULL;
    free(k);
}

/* ---- a restored etcd ----
 *
 * An etcd restored from an older snapshot (or one started anew without its data) goes back in
 * revisions, and brings back the snapshot's keys with their leases. A session that is still alive
 * keeps those leases alive, so a key its lock had since released, or one of an acquisition given
 * up since, would head its lock's queue held by nobody, and keep every other owner waiting for as
 * long as the session lives. So every new connection reads one key (a linearizable read, whose
 * revision can only be below one etcd answered before if its history went back); when etcd went
 * back, the sweep reads every key under the prefix (keys only, ED_SWEEP_PAGE per Range) and
 * deletes, guarded by its create_revision, each key on one of the client's leases that its session
 * neither holds under that revision nor is acquiring on that lease or cleaning up. Held keys are
 * read again anyway after a reconnect (see "the watch on held keys"). */

static void ed_sweep_done(void *arg, int status, const char *err, const uint8_t *p, size_t n);

/* Sends the sweep's next page, if it is due and can go; else ed_maint_cb() tries again. */
static void ed_sweep_send(struct ed_client *ec)
{
    const char *prefix = ec->c->opt.prefix;
    size_t plen = strlen(prefix);
    char end[ED_MAX_PREFIX + 1];
    struct etcdpb_range_req q;
    if (ec->sweep || !ec->sweep_due || !ed_ready(ec))
        return;
    memset(&q, 0, sizeof(q));
    q.key = ec->sweep_from ? ed_s(ec->sweep_from, ec->sweep_from_len) : ed_s(prefix, plen);
    q.range_end = ed_s(end, ed_prefix_end(prefix, plen, end));
    q.limit = ED_SWEEP_PAGE;
    q.keys_only = 1;
    etcdpb_buf_reset(&ec->out);
    if (etcdpb_range_req_encode(&ec->out, &q) == 0)
        ec->sweep = ed_rpc_start(ec, ED_PATH_RANGE, ed_sweep_done, ec);
}

/* A key the sweep found (PREFIX NAME "/" HEX): deleted, guarded by its create_revision, when it
 * is on the client's lease HEX and its session neither holds NAME under that revision nor is
 * acquiring it on that lease or cleaning up that key (those take care of their own key). An
 * acquisition of NAME on another lease (another TTL, or NORENEW) has another key, and would wait
 * behind this one. */
static void ed_sweep_key(struct ed_client *ec, const struct etcdpb_kv *kv)
{
    size_t plen = strlen(ec->c->opt.prefix), i = kv->key.n;
    const char *key = (const char *)kv->key.p;
    while (i > plen && key[i - 1] != '/')
        i--;
    if (i <= plen + 1 || kv->lease == 0 || i == kv->key.n)
        return;
    struct ed_lease *l =
        (struct ed_lease *)(void *)lock_map_find(&ec->leases, key + i, kv->key.n - i);
    if (l == NULL || l->id != kv->lease || l->es == NULL)
        return;
    const char *name = key + plen;
    size_t nlen = i - 1 - plen;
    struct ed_held *h = ed_held_find(l->es, name, nlen);
    const struct ed_dirty *d =
        (const struct ed_dirty *)(const void *)lock_map_find(&l->es->dirty, name, nlen);
    if ((h && h->rev == kv->create_revision) ||
        (d && d->keylen == kv->key.n && memcmp(d->key, key, d->keylen) == 0))
        return;
    for (struct ed_acq *a = ec->acqs; a; a = a->next)
        if (a->r && a->r->s == l->es->s && a->lease == l && a->r->len == nlen &&
            memcmp(a->r->name, name, nlen) == 0)
            return;
    ed_orphan(ec, key, kv->key.n, kv->create_revision);
}

static void ed_sweep_done(void *arg, int status, const char *err, const uint8_t *p, size_t n)
{
    struct ed_client *ec = arg;
    struct etcdpb_range_resp q;
    struct etcdpb_kv kv;
    size_t off = 0, last_len = 0;
    const uint8_t *last = NULL;
    (void)err;
    ec->sweep = NULL;
    if (status != GRPC_STATUS_OK || etcdpb_range_resp_decode(p, n, &q) != 0)
        return; /* still due: tried again within a second */
    while (etcdpb_range_resp_next(&q, &off, &kv) == 1) {
        ed_sweep_key(ec, &kv);
        last = kv.key.p;
        last_len = kv.key.n;
    }
    free(ec->sweep_from);
    ec->sweep_from = NULL;
    if (q.more && last) { /* the next page starts right after the last key */
        if ((ec->sweep_from = malloc(last_len + 1)) == NULL)
            return; /* still due: from the start again */
        memcpy(ec->sweep_from, last, last_len);
        ec->sweep_from[last_len] = '\0';
        ec->sweep_from_len = last_len + 1;
        ed_sweep_send(ec);
        return;
    }
    ec->sweep_due = 0;
}

/* etcd answered revision `to`, below `from`, a revision it had answered before: it lost history.
 * Logged at most once per ED_HW_WARN_MS; the sweep runs. Keys it still shows as a session's stay
 * held (their tokens are still the stores' marks); new tokens may be below the marks, and fence
 * on acquire refuses those. */
static void ed_went_back(struct ed_client *ec, int64_t from, int64_t to)
{
    char msg[LOCK_MSG_MAX];
    ec->rev_seen = ec->rev_conn; /* what this connection answered is the history from now on */
    if (!ec->sweep_due) {
        ec->sweep_due = 1;
        free(ec->sweep_from);
        ec->sweep_from = NULL;
        ed_sweep_send(ec);
    }
    if (!ec->c->opt.warn || !lock_warn_due(&ec->back_warned_ms, ED_HW_WARN_MS))
        return;
    lock_fmt(msg, sizeof(msg),
             "etcd %s: its revisions went back from %lld to %lld (restored from an older "
             "snapshot, or started anew without its data?); held keys it still shows as the "
             "session's stay held and are watched from there, keys of this sidecar's leases "
             "that no lock holds are deleted, and new tokens below the stores' marks are refused",
             grpc_channel_endpoint(ec->ch), (long long)from, (long long)to);
    ec->c->opt.warn(ec->c->opt.warn_arg, msg);
}

static void ed_probe_done(void *arg, int status, const char *err, const uint8_t *p, size_t n)
{
    struct ed_client *ec = arg;
    struct etcdpb_range_resp q;
    (void)err;
    if (status == GRPC_STATUS_OK && etcdpb_range_resp_decode(p, n, &q) == 0 &&
        q.header.revision > 0 && q.header.revision < ec->rev_seen)
        ed_went_back(ec, ec->rev_seen, q.header.revision);
}

/* On a new connection: one linearizable read, to compare etcd's revision with those it answered
 * on earlier connections. */
static void ed_probe_send(struct ed_client *ec)
{
    const char *prefix = ec->c->opt.prefix;
    struct etcdpb_range_req q;
    if (ec->rev_seen == 0)
        return; /* nothing answered before */
    memset(&q, 0, sizeof(q));
    q.key = ed_s(prefix, strlen(prefix));
    q.keys_only = 1;
    q.count_only = 1;
    etcdpb_buf_reset(&ec->out);
    if (etcdpb_range_req_encode(&ec->out, &q) == 0)
        (void)ed_rpc_start(ec, ED_PATH_RANGE, ed_probe_done, ec);
}

static void ed_check_done(void *arg, int status, const char *err, const uint8_t *p, size_t n)
{
    struct ed_check *k = arg;
    struct ed_client *ec = ed_of(k->es->s->c);
    static struct etcdpb_txn_resp t; /* one loop thread; too large for the stack */
    struct etcdpb_range_resp q;
    struct etcdpb_kv kv;
    int64_t rev, back_from = 0;
    k->call = NULL;
    if (status != GRPC_STATUS_OK && strstr(err, "too many operations") && k->n > 1) {
        /* etcd's --max-txn-ops is below k->n: its keys go again at once, in smaller Txns */
        if (ec->check_max > k->n / 2)
            ec->check_max = k->n / 2;
        for (size_t i = 0; i < k->n; i++)
            if (k->h[i])
                ed_hw_due(k->h[i], ED_HW_CHECK);
        ed_check_free(k);
        ed_hw_kick(ec);
        return;
    }
    if (status != GRPC_STATUS_OK || ed_kv_txn_decode(p, n, &t, k->n) != 0) {
        ed_hw_warn(ec,
                   "lock keys whose watch ended could not be read again: %s; tried again every "
                   "second, their lease's keepalive still decides",
                   status == GRPC_STATUS_OK ? "malformed Txn response" : err);
        for (size_t i = 0; i < k->n; i++)
            if (k->h[i])
                ed_hw_due(k->h[i], ED_HW_CHECK);
        ed_check_free(k);
        return;
    }
    rev = t.header.revision;
    for (size_t i = 0; i < k->n; i++) {
        struct ed_held *h = k->h[i];
        size_t off = 0;
        if (h == NULL)
            continue;
        k->h[i] = NULL;
        h->check = NULL;
        if (etcdpb_range_resp_decode(t.responses[i].body.p, t.responses[i].body.n, &q) != 0) {
            ed_hw_due(h, ED_HW_CHECK);
            continue;
        }
        int have = etcdpb_range_resp_next(&q, &off, &kv) == 1;
        if (!ed_held_judge(h, have ? &kv : NULL, "read again after its watch ended"))
            continue;
        /* The read shows the key at rev: the watch starts right after it, also when that is
         * below where the watch had reached (etcd's revisions went back: from wrev on, it
         * would miss a change etcd makes at a revision it hands out a second time). */
        if (h->wrev - 1 > rev && h->wrev - 1 > back_from)
            back_from = h->wrev - 1;
        h->wrev = rev + 1;
        ed_held_watch(h);
    }
    ed_check_free(k);
    if (back_from > 0)
        ed_went_back(ec, back_from, rev);
}

/* Sends k (its keys' Ranges in one Txn); when it cannot go, its keys stay due. */
static void ed_check_send(struct ed_client *ec, struct ed_check *k)
{
    struct etcdpb_op ops[ETCDPB_TXN_MAX_OPS];
    memset(ops, 0, sizeof(ops));
    for (size_t i = 0; i < k->n; i++) {
        ops[i].kind = ETCDPB_OP_RANGE;
        ops[i].u.range.key = ed_s(k->h[i]->key, k->h[i]->keylen);
        ops[i].u.range.keys_only = 1;
    }
    etcdpb_buf_reset(&ec->out);
    if (etcdpb_txn_req_encode(&ec->out, NULL, 0, ops, k->n, NULL, 0) == 0 &&
        (k->call = ed_rpc_start(ec, ED_PATH_TXN, ed_check_done, k)) != NULL)
        return;
    for (size_t i = 0; i < k->n; i++)
        ed_hw_due(k->h[i], ED_HW_CHECK);
    ed_check_free(k);
}

/* Watches the held keys that are due, reading first those whose watch could not resume. */
static void ed_hw_service(struct ed_client *ec)
{
    if (!ec->hw_due || !ed_ready(ec))
        return;
    ec->hw_due = 0;
    for (struct lock_session *s = ec->c->sessions; s; s = s->next) {
        struct ed_sess *es = s->b_sess;
        struct ed_check *k = NULL;
        size_t b = 0;
        struct lock_hnode *it = NULL, *n;
        if (es == NULL || !es->hw_due)
            continue;
        es->hw_due = 0;
        while ((n = lock_map_next(&es->held, &b, &it)) != NULL) {
            struct ed_held *h = (struct ed_held *)(void *)n;
            if (h->hw == ED_HW_NONE) {
                if (!h->young) /* else its own time comes */
                    ed_held_watch(h);
                continue;
            }
            if (h->hw != ED_HW_CHECK || h->check)
                continue;
            if (k && k->n >= ec->check_max) {
                ed_check_send(ec, k);
                k = NULL;
            }
            if (k == NULL && (k = calloc(1, sizeof(*k))) != NULL) {
                k->es = es;
                k->next = es->checks;
                es->checks = k;
            }
            if (k == NULL) {
                ed_hw_due(h, ED_HW_CHECK);
                continue;
            }
            h->check = k;
            h->check_idx = k->n;
            k->h[k->n++] = h;
        }
        if (k)
            ed_check_send(ec, k);
    }
}

static void ed_hw_kick_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    ed_hw_service(arg);
}

/* ---- watch answers ---- */

static void ed_watch_msg(void *arg, struct grpc_call *call, const uint8_t *msg, size_t len)
{
    struct ed_client *ec = arg;
    struct etcdpb_watch_resp w;
    struct etcdpb_event ev;
    struct ed_acq *a;
    size_t off = 0;
    int deleted = 0;
    (void)call;
    if (etcdpb_watch_resp_decode(msg, len, &w) != 0)
        return;
    if (w.created) {
        struct ed_wpend *wp = ec->wp_head;
        if (wp == NULL)
            return;
        ec->wp_head = wp->next;
        if (ec->wp_head == NULL)
            ec->wp_tail = NULL;
        a = wp->a;
        struct ed_held *h = wp->h;
        free(wp);
        if (h) {
            ed_held_created(ec, h, &w);
            return;
        }
        if (a == NULL) { /* cancelled meanwhile */
            ed_watch_over(ec, w.watch_id, &w);
            return;
        }
        a->wpend = NULL;
        if (w.canceled && w.compact_revision == 0 && w.cancel_reason.n > 0) {
            /* Refused ("permission denied": with authentication, the stream's token may have
             * expired): a new token and stream, then look again. */
            if (ec->have_auth && lock_now_ms() - ec->watch_refresh_ms >= 5000) {
                ec->watch_refresh_ms = lock_now_ms();
                ed_auth_send(ec);
            }
            ed_acq_pause(a);
            return;
        }
        if (w.canceled) { /* e.g. compacted: look at the current state instead */
            ed_watch_over(ec, w.watch_id, &w);
            ed_acq_look(a);
            return;
        }
        a->watch_id = w.watch_id;
    }
    a = ed_acq_by_watch(ec, w.watch_id);
    if (a == NULL) {
        ed_held_watch_msg(ec, &w);
        return;
    }
    while (etcdpb_watch_resp_next(&w, &off, &ev) == 1)
        if (ev.type == ETCDPB_EVENT_DELETE)
            deleted = 1;
    if (w.canceled || deleted || w.compact_revision > 0) {
        ed_watch_over(ec, a->watch_id, &w);
        a->watch_id = -1;
        ed_acq_look(a);
    }
}

/* The watch stream is gone: its pending creates are forgotten and every watching acquisition
 * pauses, to look again and watch on a new stream; held keys are read again, then watched. */
static void ed_watch_reset(struct ed_client *ec)
{
    ec->watch = NULL;
    while (ec->wp_head) {
        struct ed_wpend *wp = ec->wp_head;
        ec->wp_head = wp->next;
        if (wp->a)
            wp->a->wpend = NULL;
        if (wp->h)
            wp->h->wpend = NULL;
        free(wp);
    }
    ec->wp_tail = NULL;
    for (struct ed_acq *a = ec->acqs; a; a = a->next) {
        if (a->phase == ED_ACQ_WATCH) {
            a->watch_id = -1;
            ed_acq_pause(a);
        }
    }
    for (struct lock_session *s = ec->c->sessions; s; s = s->next) {
        struct ed_sess *es = s->b_sess;
        size_t b = 0;
        struct lock_hnode *it = NULL, *n;
        while (es && (n = lock_map_next(&es->held, &b, &it)) != NULL) {
            struct ed_held *h = (struct ed_held *)(void *)n;
            if (h->hw != ED_HW_PENDING && h->hw != ED_HW_ACTIVE)
                continue;
            if (h->hw == ED_HW_ACTIVE)
                lock_map_remove(&ec->hwatch, &h->wnode);
            h->watch_id = -1;
            ed_hw_due(h, ED_HW_CHECK);
        }
    }
}

static void ed_watch_end(void *arg, struct grpc_call *call, int status, const char *message)
{
    struct ed_client *ec = arg;
    (void)call;
    ed_watch_reset(ec);
    if (status != GRPC_STATUS_OK)
        ec->c->stats.backend_errors++;
    if (status == GRPC_STATUS_UNAUTHENTICATED)
        ed_auth_send(ec);
    ed_maybe_failover(ec, status, message ? message : "");
}

static const struct grpc_call_cbs ed_watch_cbs = {ed_watch_msg, ed_watch_end};

/* Watches the deletion of pred from revision `from` on. Returns 0, or -1 when not connected. */
static int ed_acq_watch(struct ed_acq *a, const uint8_t *pred, size_t plen, int64_t from)
{
    struct ed_wpend *wp = ed_watch_create(a->ec, pred, plen, from, ETCDPB_FILTER_NOPUT);
    if (wp == NULL)
        return -1;
    wp->a = a;
    a->wpend = wp;
    a->phase = ED_ACQ_WATCH;
    return 0;
}

/* ---- acquisitions ---- */

static void ed_acq_free(struct ed_acq *a)
{
    struct ed_client *ec = a->ec;
    ed_rpc_cancel(a->call);
    ed_acq_unwatch(a);
    if (a->deadline)
        event_free(a->deadline);
    if (a->retry)
        event_free(a->retry);
    if (a->prev)
        a->prev->next = a->next;
    else
        ec->acqs = a->next;
    if (a->next)
        a->next->prev = a->prev;
    if (a->r)
        a->r->b_call = NULL;
    if (a->dq) {
        for (struct ed_acq **p = &a->dq->waiting; *p; p = &(*p)->lnext)
            if (*p == a) {
                *p = a->lnext;
                break;
            }
    } else if (a->phase == ED_ACQ_LEASE && a->lease) { /* on the lease's waiting list */
        for (struct ed_acq **p = &a->lease->waiting; *p; p = &(*p)->lnext)
            if (*p == a) {
                *p = a->lnext;
                break;
            }
    }
    ed_lease_unref(a->lease);
    free(a);
}

/* Removes a's key if it may exist: guarded by its revision when known, else through the
 * session's dirty-name clean-up. */
static void ed_acq_drop_key(struct ed_acq *a)
{
    struct ed_client *ec = a->ec;
    if (a->rev > 0) {
        ed_orphan(ec, a->key, a->keylen, a->rev);
        return;
    }
    if (a->phase != ED_ACQ_CREATE || (a->call && a->call->queued) || a->r == NULL ||
        a->r->s == NULL)
        return; /* nothing created, or nothing sent yet */
    struct ed_sess *es = a->r->s->b_sess;
    const char *name = a->key + strlen(ec->c->opt.prefix);
    size_t nlen = a->pfxlen - strlen(ec->c->opt.prefix) - 1;
    if (es == NULL || lock_map_find(&es->dirty, name, nlen))
        return;
    struct ed_dirty *d = calloc(1, sizeof(*d) + a->keylen + 1);
    if (d == NULL)
        return;
    d->es = es;
    d->keylen = a->keylen;
    memcpy(d->key, a->key, a->keylen);
    d->name = d->key + (name - a->key);
    lock_hnode_init(&d->node, d->name, nlen);
    if (lock_map_insert(&es->dirty, &d->node) != 0) {
        free(d);
        return;
    }
    ec->ndirty++;
    ed_dirty_clean(d);
}

static void ed_acq_fail(struct ed_acq *a, int status, const char *msg)
{
    struct lock_req *r = a->r;
    ed_acq_drop_key(a);
    ed_acq_free(a);
    if (r)
        lock_req_finish(r, status, 0, msg);
}

/* a owns the lock: hand it to lock.c. */
static void ed_acq_own(struct ed_acq *a)
{
    struct lock_req *r = a->r;
    struct ed_sess *es = r->s->b_sess;
    struct ed_lease *l = a->lease;
    int64_t now = lock_now_ms();
    if (now - l->confirmed_ms >= r->ttl_ms && now < r->deadline_ms) {
        /* etcd held the calls back (a stall) past the lease's length: its last confirmation is
         * too old for the grant to count. The wait has time left and our key heads the queue,
         * so nobody else gets the lock meanwhile: have the lease confirmed, then look again (a
         * lease that ran out in etcd took the key with it, and the acquisition starts over). A
         * fixed lease is never extended: it starts over on a new one. */
        if (l->norenew) {
            ed_acq_restart(a, "its fixed lease ran out while etcd held the acquisition back");
            return;
        }
        ed_lease_keepalive(l);
        ed_acq_pause(a);
        return;
    }
    struct ed_held *h = calloc(1, sizeof(*h) + a->keylen + 1);
    char msg[LOCK_MSG_MAX];
    if (h == NULL) {
        lock_fmt(msg, sizeof(msg), "out of memory recording lock %s", r->name);
        ed_acq_fail(a, LOCK_UNAVAILABLE, msg);
        return;
    }
    h->es = es;
    h->lease = l;
    h->rev = a->rev;
    h->wrev = a->rev + 1; /* every change after its creation */
    h->watch_id = -1;
    h->hw = ED_HW_GONE;
    h->keylen = a->keylen;
    memcpy(h->key, a->key, a->keylen);
    lock_hnode_init(&h->node, h->key + strlen(a->ec->c->opt.prefix), r->len);
    struct ed_held *old = ed_held_find(es, r->name, r->len);
    if (old)
        ed_held_forget(es, old);
    if (lock_map_insert(&es->held, &h->node) != 0) {
        free(h);
        lock_fmt(msg, sizeof(msg), "out of memory recording lock %s", r->name);
        ed_acq_fail(a, LOCK_UNAVAILABLE, msg);
        return;
    }
    a->lease = NULL; /* the reference moves to h */
    a->rev = 0;
    ed_held_watch_later(h);
    int64_t since = l->confirmed_ms;
    ed_acq_free(a);
    /* The lease is only known to last from its last confirmed grant or keepalive. */
    lock_granted(r, (uint64_t)h->rev, since);
}

/* Not the owner on a try-once, or the wait ran out. */
static void ed_acq_busy(struct ed_acq *a)
{
    struct lock_req *r = a->r;
    char msg[LOCK_MSG_MAX];
    int64_t waited = lock_now_ms() - r->start_ms;
    if (a->seen_pred)
        lock_fmt(msg, sizeof(msg), "lock %s is held by another owner (waited %lld ms)", r->name,
                 (long long)waited);
    else
        lock_fmt(msg, sizeof(msg), "lock %s: etcd did not answer within the wait (%lld ms)",
                 r->name, (long long)waited);
    ed_acq_fail(a, a->seen_pred ? LOCK_BUSY : LOCK_UNAVAILABLE, msg);
}

static void ed_acq_deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    ed_acq_busy(arg);
}

static void ed_acq_retry_cb(evutil_socket_t fd, short what, void *arg)
{
    struct ed_acq *a = arg;
    (void)fd;
    (void)what;
    if (a->phase != ED_ACQ_PAUSED)
        return; /* it moved on meanwhile */
    if (ed_ready(a->ec))
        ed_acq_look(a);
    /* else: the channel's up callback looks again */
}

/* Looks again later (a call failed or the watch stream ended). */
static void ed_acq_pause(struct ed_acq *a)
{
    struct timeval tv = {0, ED_RETRY_MS * 1000};
    a->phase = ED_ACQ_PAUSED;
    if (a->retry == NULL)
        a->retry = evtimer_new(a->ec->c->base, ed_acq_retry_cb, a);
    if (a->retry)
        evtimer_add(a->retry, &tv);
}

/* The key is gone while we waited (the lease ended, or someone deleted it): start over on a
 * live lease, a bounded number of times. */
static void ed_acq_restart(struct ed_acq *a, const char *why)
{
    char msg[LOCK_MSG_MAX];
    struct lock_req *r = a->r;
    ed_rpc_cancel(a->call);
    a->call = NULL;
    ed_acq_unwatch(a);
    if (a->retry)
        evtimer_del(a->retry);
    if (r == NULL || r->s == NULL || ++a->restarts > ED_MAX_RESTARTS) {
        lock_fmt(msg, sizeof(msg), "lock %s: gave up waiting: %s", r ? r->name : "?", why);
        ed_acq_fail(a, LOCK_UNAVAILABLE, msg);
        return;
    }
    a->rev = 0;
    ed_lease_unref(a->lease);
    a->lease = NULL;
    a->phase = ED_ACQ_LEASE;
    struct ed_lease *l = ed_lease_for(r->s->b_sess, r->ttl_ms, (r->flags & LOCK_NORENEW) != 0);
    if (l == NULL) {
        lock_fmt(msg, sizeof(msg), "lock %s: %s; etcd is not reachable to start over", r->name,
                 why);
        ed_acq_fail(a, LOCK_UNAVAILABLE, msg);
        return;
    }
    a->lease = l;
    if (l->state == ED_LEASE_LIVE) {
        ed_acq_start(a);
    } else {
        a->lnext = l->waiting;
        l->waiting = a;
    }
}

static int ed_kv_txn_decode(const uint8_t *p, size_t n, struct etcdpb_txn_resp *t, size_t want)
{
    return etcdpb_txn_resp_decode(p, n, t) == 0 && t->nresponses >= want ? 0 : -1;
}

static void ed_acq_looked(void *arg, int status, const char *err, const uint8_t *p, size_t n)
{
    struct ed_acq *a = arg;
    static struct etcdpb_txn_resp t; /* one loop thread; too large for the stack */
    struct etcdpb_range_resp pred, own;
    struct etcdpb_kv kv;
    size_t off = 0;
    a->call = NULL;
    if (status != GRPC_STATUS_OK || ed_kv_txn_decode(p, n, &t, 2) != 0 ||
        etcdpb_range_resp_decode(t.responses[0].body.p, t.responses[0].body.n, &pred) != 0 ||
        etcdpb_range_resp_decode(t.responses[1].body.p, t.responses[1].body.n, &own) != 0) {
        (void)err;
        ed_acq_pause(a);
        return;
    }
    if (own.nkvs == 0 || etcdpb_range_resp_next(&own, &off, &kv) != 1 ||
        kv.create_revision != a->rev) {
        a->rev = 0; /* it is gone: nothing to delete */
        ed_acq_restart(a, "its queue key disappeared while it waited (lease expired or deleted)");
        return;
    }
    off = 0;
    if (pred.nkvs == 0 || etcdpb_range_resp_next(&pred, &off, &kv) != 1) {
        ed_acq_own(a);
        return;
    }
    a->seen_pred = 1;
    if (a->r->deadline_ms <= a->r->start_ms) {
        ed_acq_busy(a);
        return;
    }
    if (ed_acq_watch(a, kv.key.p, kv.key.n, pred.header.revision + 1) != 0)
        ed_acq_pause(a);
}

/* One Txn: the newest key created before ours, and our own key. */
static void ed_acq_look(struct ed_acq *a)
{
    struct ed_client *ec = a->ec;
    struct etcdpb_op ops[2];
    char end[LOCK_MAX_NAME + 512];
    memset(ops, 0, sizeof(ops));
    a->phase = ED_ACQ_FIND;
    ops[0].kind = ETCDPB_OP_RANGE;
    ops[0].u.range.key = ed_s(a->key, a->pfxlen);
    ops[0].u.range.range_end = ed_s(end, ed_prefix_end(a->key, a->pfxlen, end));
    ops[0].u.range.sort_order = ETCDPB_SORT_DESCEND;
    ops[0].u.range.sort_target = ETCDPB_SORT_CREATE;
    ops[0].u.range.max_create_revision = a->rev - 1;
    ops[0].u.range.limit = 1;
    ops[0].u.range.keys_only = 1;
    ops[1].kind = ETCDPB_OP_RANGE;
    ops[1].u.range.key = ed_s(a->key, a->keylen);
    ops[1].u.range.keys_only = 1;
    etcdpb_buf_reset(&ec->out);
    if (etcdpb_txn_req_encode(&ec->out, NULL, 0, ops, 2, NULL, 0) != 0 ||
        (a->call = ed_rpc_start(ec, ED_PATH_TXN, ed_acq_looked, a)) == NULL)
        ed_acq_pause(a);
}

static void ed_acq_created(void *arg, int status, const char *err, const uint8_t *p, size_t n)
{
    struct ed_acq *a = arg;
    static struct etcdpb_txn_resp t;
    struct etcdpb_range_resp q;
    struct etcdpb_kv kv;
    char msg[LOCK_MSG_MAX];
    size_t off = 0;
    a->call = NULL;
    if (status == ED_NOT_SENT) {
        lock_fmt(msg, sizeof(msg), "lock %s: %s", a->r->name, err);
        a->phase = ED_ACQ_LEASE; /* nothing was sent: the name is not dirty */
        ed_acq_fail(a, LOCK_UNAVAILABLE, msg);
        return;
    }
    if (status != GRPC_STATUS_OK || ed_kv_txn_decode(p, n, &t, 1) != 0) {
        if (status == GRPC_STATUS_OK)
            err = "malformed Txn response";
        if (strstr(err, "requested lease not found")) {
            ed_lease_lost(a->lease, "etcd no longer has the session's lease");
            return; /* restarted */
        }
        lock_fmt(msg, sizeof(msg), "acquiring lock %s: %s", a->r->name, err);
        ed_acq_fail(a, LOCK_UNAVAILABLE, msg); /* the outcome is unknown: the name is dirty */
        return;
    }
    if (!t.succeeded) { /* a key of ours was left over: the Txn deleted it; create again */
        if (++a->restarts > ED_MAX_RESTARTS) {
            lock_fmt(msg, sizeof(msg), "acquiring lock %s: its key keeps reappearing", a->r->name);
            a->phase = ED_ACQ_LEASE;
            ed_acq_fail(a, LOCK_UNAVAILABLE, msg);
            return;
        }
        ed_acq_start(a);
        return;
    }
    a->rev = t.header.revision;
    if (t.nresponses < 2 ||
        etcdpb_range_resp_decode(t.responses[1].body.p, t.responses[1].body.n, &q) != 0 ||
        etcdpb_range_resp_next(&q, &off, &kv) != 1 || kv.create_revision != a->rev) {
        ed_acq_look(a); /* unexpected shape: ask plainly */
        return;
    }
    if (etcdpb_range_resp_next(&q, &off, &kv) != 1) {
        ed_acq_own(a); /* ours is the only key */
        return;
    }
    a->seen_pred = 1;
    if (a->r->deadline_ms <= a->r->start_ms) {
        ed_acq_busy(a);
        return;
    }
    if (ed_acq_watch(a, kv.key.p, kv.key.n, q.header.revision + 1) != 0)
        ed_acq_pause(a);
}

/* Puts our key (if absent) and reads the two newest keys of the lock in one Txn: when ours is
 * the only one we own the lock, else the other is our predecessor. A key of ours left over from
 * an earlier attempt is deleted instead, and the Txn is sent again. */
static void ed_acq_start(struct ed_acq *a)
{
    struct ed_client *ec = a->ec;
    struct lock_req *r = a->r;
    struct etcdpb_compare cmp;
    struct etcdpb_op ok[2], fail;
    char end[LOCK_MAX_NAME + 512], msg[LOCK_MSG_MAX];
    const char *prefix = ec->c->opt.prefix;
    size_t plen = strlen(prefix);
    memcpy(a->key, prefix, plen);
    memcpy(a->key + plen, r->name, r->len);
    a->key[plen + r->len] = '/';
    a->pfxlen = plen + r->len + 1;
    size_t hl = strlen(a->lease->hex);
    memcpy(a->key + a->pfxlen, a->lease->hex, hl + 1);
    a->keylen = a->pfxlen + hl;
    memset(&cmp, 0, sizeof(cmp));
    memset(ok, 0, sizeof(ok));
    memset(&fail, 0, sizeof(fail));
    cmp.result = ETCDPB_CMP_EQUAL;
    cmp.target = ETCDPB_TARGET_CREATE;
    cmp.key = ed_s(a->key, a->keylen);
    ok[0].kind = ETCDPB_OP_PUT;
    ok[0].u.put.key = cmp.key;
    ok[0].u.put.lease = a->lease->id;
    ok[1].kind = ETCDPB_OP_RANGE;
    ok[1].u.range.key = ed_s(a->key, a->pfxlen);
    ok[1].u.range.range_end = ed_s(end, ed_prefix_end(a->key, a->pfxlen, end));
    ok[1].u.range.sort_order = ETCDPB_SORT_DESCEND;
    ok[1].u.range.sort_target = ETCDPB_SORT_CREATE;
    ok[1].u.range.limit = 2;
    ok[1].u.range.keys_only = 1;
    fail.kind = ETCDPB_OP_DELETE;
    fail.u.del.key = cmp.key;
    a->phase = ED_ACQ_CREATE;
    a->rev = 0;
    a->call = ed_txn_start(ec, a->key, a->pfxlen, &cmp, 1, ok, 2, &fail, 1, ed_acq_created, a);
    if (a->call == NULL) {
        lock_fmt(msg, sizeof(msg), "lock %s: %s", r->name, ed_not_ready(ec));
        a->phase = ED_ACQ_LEASE; /* nothing was sent */
        ed_acq_fail(a, LOCK_UNAVAILABLE, msg);
    }
}

/* ---- dirty names ---- */

/* Frees d, which is in es->dirty (idle: on es->idle, unlinked by the caller). */
static void ed_dirty_free(struct ed_dirty *d, int idle)
{
    ed_of(d->es->s->c)->ndirty--;
    if (!idle)
        lock_map_remove(&d->es->dirty, &d->node);
    ed_rpc_cancel(d->call);
    free(d);
}

/* A clean-up of d succeeded: d leaves es->dirty, to wait on es->idle for the next one, or goes. */
static void ed_dirty_rest(struct ed_dirty *d)
{
    if (d->again >= ED_DIRTY_AGAIN) {
        ed_dirty_free(d, 0);
        return;
    }
    lock_map_remove(&d->es->dirty, &d->node);
    d->next_ms = lock_now_ms() + (1000LL << d->again);
    d->again++;
    d->inext = d->es->idle;
    d->es->idle = d;
}

/* 1 when the session holds the name (lost ones included), or acquires or releases it. */
static int ed_sess_uses(const struct ed_sess *es, const char *name, size_t len)
{
    if (lock_map_find(&es->held, name, len) || lock_map_find(&es->s->locks, name, len))
        return 1;
    for (const struct lock_req *r = es->s->reqs; r; r = r->s_next)
        if (r->len == len && memcmp(r->name, name, len) == 0)
            return 1;
    return 0;
}

static void ed_dirty_clean(struct ed_dirty *d);

/* Cleans up again the idle dirty names whose time has come, unless the session holds or waits
 * for the name then (it is tried again a second later). A name made dirty again meanwhile has a
 * record of its own in es->dirty: the idle one goes. */
static void ed_dirty_wake(struct ed_sess *es, int64_t now)
{
    for (struct ed_dirty **p = &es->idle; *p;) {
        struct ed_dirty *d = *p;
        if (d->next_ms > now) {
            p = &d->inext;
            continue;
        }
        if (ed_sess_uses(es, d->name, d->node.len)) {
            d->next_ms = now + 1000;
            p = &d->inext;
            continue;
        }
        *p = d->inext;
        d->inext = NULL;
        if (lock_map_find(&es->dirty, d->name, d->node.len) ||
            lock_map_insert(&es->dirty, &d->node) != 0) {
            ed_dirty_free(d, 1);
            continue;
        }
        ed_dirty_clean(d);
    }
}

static void ed_dirty_done(void *arg, int status, const char *err, const uint8_t *p, size_t n)
{
    struct ed_dirty *d = arg;
    (void)err;
    (void)p;
    (void)n;
    d->call = NULL;
    if (status != GRPC_STATUS_OK)
        return; /* retried after the next connect */
    struct ed_acq *w = d->waiting;
    d->waiting = NULL;
    ed_dirty_rest(d);
    while (w) {
        struct ed_acq *a = w;
        w = a->lnext;
        a->lnext = NULL;
        a->dq = NULL;
        a->phase = ED_ACQ_LEASE;
        if (a->lease->state == ED_LEASE_LIVE) {
            ed_acq_start(a);
        } else if (a->lease->state == ED_LEASE_GRANTING) {
            a->lnext = a->lease->waiting;
            a->lease->waiting = a;
        } else {
            a->phase = ED_ACQ_PAUSED;
            ed_acq_restart(a, "the session's lease was lost");
        }
    }
}

static void ed_dirty_clean(struct ed_dirty *d)
{
    struct ed_client *ec = ed_of(d->es->s->c);
    if (d->call == NULL && ed_encode_delete(ec, d->key, d->keylen, 0) == 0)
        d->call = ed_rpc_start(ec, ED_PATH_TXN, ed_dirty_done, d);
}

/* ---- backend operations ---- */

static void ed_op_acquire(struct lock_req *r)
{
    struct lock_client *c = r->s->c;
    struct ed_client *ec = ed_of(c);
    struct ed_sess *es = ed_sess_get(r->s);
    char msg[LOCK_MSG_MAX];
    size_t cap = strlen(c->opt.prefix) + r->len + 1 + ED_LEASE_HEX_MAX + 1;
    struct ed_acq *a = es ? calloc(1, sizeof(*a) + cap) : NULL;
    if (a == NULL) {
        lock_fmt(msg, sizeof(msg), "out of memory acquiring lock %s", r->name);
        lock_req_finish(r, LOCK_UNAVAILABLE, 0, msg);
        return;
    }
    a->ec = ec;
    a->r = r;
    a->watch_id = -1;
    a->phase = ED_ACQ_LEASE;
    r->b_call = a;
    a->next = ec->acqs;
    if (ec->acqs)
        ec->acqs->prev = a;
    ec->acqs = a;
    if (r->deadline_ms != INT64_MAX && r->deadline_ms > r->start_ms) {
        int64_t d = r->deadline_ms - lock_now_ms();
        struct timeval tv = {(time_t)(d > 0 ? d / 1000 : 0),
                             (suseconds_t)(d > 0 ? (d % 1000) * 1000 : 0)};
        a->deadline = evtimer_new(c->base, ed_acq_deadline_cb, a);
        if (a->deadline)
            evtimer_add(a->deadline, &tv);
    }
    a->lease = ed_lease_for(es, r->ttl_ms, (r->flags & LOCK_NORENEW) != 0);
    if (a->lease == NULL) {
        lock_fmt(msg, sizeof(msg), "lock %s: %s", r->name, ed_not_ready(ec));
        ed_acq_fail(a, LOCK_UNAVAILABLE, msg);
        return;
    }
    struct ed_dirty *d = (struct ed_dirty *)(void *)lock_map_find(&es->dirty, r->name, r->len);
    if (d) { /* an earlier attempt's key may exist: clean it up first */
        a->lnext = d->waiting;
        d->waiting = a;
        a->dq = d;
        ed_dirty_clean(d);
        return;
    }
    if (a->lease->state == ED_LEASE_LIVE) {
        ed_acq_start(a);
    } else {
        a->lnext = a->lease->waiting;
        a->lease->waiting = a;
    }
}

static void ed_op_cancel(struct lock_req *r)
{
    struct ed_acq *a = r->b_call;
    if (a == NULL)
        return;
    if (r->kind == LOCK_REQ_RELEASE) { /* b_call is the Txn in flight, b_wait the record */
        struct ed_held *h = r->b_wait;
        ed_rpc_cancel(r->b_call);
        r->b_call = NULL;
        r->b_wait = NULL;
        ed_orphan(ed_of(r->s->c), h->key, h->keylen, h->rev);
        ed_held_drop_record(h);
        return;
    }
    ed_acq_drop_key(a);
    a->r = NULL;
    r->b_call = NULL;
    ed_acq_free(a);
}

static void ed_release_done(void *arg, int status, const char *err, const uint8_t *p, size_t n)
{
    struct lock_req *r = arg;
    static struct etcdpb_txn_resp t;
    char msg[LOCK_MSG_MAX];
    struct ed_held *h = r->b_wait;
    r->b_call = NULL;
    r->b_wait = NULL;
    if (status != GRPC_STATUS_OK || ed_kv_txn_decode(p, n, &t, 0) != 0) {
        ed_orphan(ed_of(r->s->c), h->key, h->keylen, h->rev);
        ed_held_drop_record(h);
        lock_fmt(msg, sizeof(msg), "releasing lock %s: %s", r->name,
                 status == GRPC_STATUS_OK ? "malformed Txn response" : err);
        lock_req_finish(r, LOCK_UNAVAILABLE, 0, msg);
        return;
    }
    ed_held_drop_record(h);
    if (t.succeeded) {
        lock_req_finish(r, LOCK_OK, 0, NULL);
    } else {
        lock_fmt(msg, sizeof(msg), "lock %s was no longer held (its key was gone)", r->name);
        lock_req_finish(r, LOCK_NOT_HELD, 0, msg);
    }
}

static void ed_op_release(struct lock_req *r)
{
    struct ed_client *ec = ed_of(r->s->c);
    struct ed_sess *es = r->s->b_sess;
    struct ed_held *h = es ? ed_held_find(es, r->name, r->len) : NULL;
    char msg[LOCK_MSG_MAX];
    if (h == NULL) {
        lock_fmt(msg, sizeof(msg), "lock %s is not held by this session", r->name);
        lock_req_finish(r, LOCK_NOT_HELD, 0, msg);
        return;
    }
    struct etcdpb_compare cmp;
    struct etcdpb_op del;
    size_t locklen = h->keylen;
    while (locklen > 0 && h->key[locklen - 1] != '/')
        locklen--; /* the lock's keys: prefix name "/" */
    lock_map_remove(&es->held, &h->node);
    ed_held_unwatch(h); /* its own delete is no news */
    ed_delete_ops(h->key, h->keylen, h->rev, &cmp, &del);
    if ((r->b_call = ed_txn_start(ec, h->key, locklen, &cmp, 1, &del, 1, NULL, 0, ed_release_done,
                                  r)) == NULL) {
        ed_orphan(ec, h->key, h->keylen, h->rev);
        ed_held_drop_record(h);
        lock_fmt(msg, sizeof(msg),
                 "releasing lock %s: etcd is not connected (the key is deleted after "
                 "reconnecting, or with the lease)",
                 r->name);
        lock_req_finish(r, LOCK_UNAVAILABLE, 0, msg);
        return;
    }
    r->b_wait = h;
}

static void ed_op_drop(struct lock_session *s, const char *name, size_t len)
{
    struct ed_sess *es = s->b_sess;
    struct ed_held *h = es ? ed_held_find(es, name, len) : NULL;
    if (h == NULL)
        return;
    if (!h->key_gone)
        ed_orphan(ed_of(s->c), h->key, h->keylen, h->rev);
    ed_held_forget(es, h);
}

static void ed_op_close_session(struct lock_session *s)
{
    struct ed_sess *es = s->b_sess;
    if (es == NULL)
        return;
    size_t b = 0;
    struct lock_hnode *it = NULL, *n;
    while (es->checks) {
        ed_rpc_cancel(es->checks->call);
        ed_check_free(es->checks);
    }
    while ((n = lock_map_next(&es->held, &b, &it)) != NULL) {
        struct ed_held *h = (struct ed_held *)(void *)n;
        lock_map_remove(&es->held, n);
        ed_held_unwatch(h);
        h->lease->refs--;
        free(h);
    }
    lock_map_clear(&es->held);
    b = 0;
    it = NULL;
    while ((n = lock_map_next(&es->dirty, &b, &it)) != NULL)
        ed_dirty_free((struct ed_dirty *)(void *)n, 0);
    lock_map_clear(&es->dirty);
    while (es->idle) {
        struct ed_dirty *d = es->idle;
        es->idle = d->inext;
        ed_dirty_free(d, 1);
    }
    /* Revoking the leases deletes every key left, queue positions included. */
    while (es->leases) {
        struct ed_lease *l = es->leases;
        es->leases = l->next;
        l->es = NULL;
        l->prev = l->next = NULL;
        ed_lease_free(l);
    }
    free(es);
    s->b_sess = NULL;
}

/* Renewal is the leases' own keepalive; a session's round trip only reports what the last
 * confirmed keepalive of each lease established. */
static void ed_op_renew(struct lock_session *s, int64_t now_ms)
{
    struct ed_sess *es = s->b_sess;
    (void)now_ms;
    if (es) {
        size_t b = 0;
        struct lock_hnode *it = NULL, *n;
        while ((n = lock_map_next(&es->held, &b, &it)) != NULL) {
            struct ed_held *h = (struct ed_held *)(void *)n;
            if (!h->lease->norenew)
                lock_renew_result(s, h->node.name, h->node.len, (uint64_t)h->rev,
                                  h->lease->confirmed_ms, h->lease->state == ED_LEASE_LIVE);
        }
    }
    lock_renew_done(s);
}

static const char *ed_op_not_ready(const struct lock_client *c)
{
    struct ed_client *ec = ed_of(c);
    return ed_ready(ec) ? NULL : ed_not_ready(ec);
}

/* ---- high-water marks kept in etcd (lock_mark_raise) ---- */

#define ED_MARK_DIGITS 20 /* marks are zero-padded decimals, so etcd's byte order is numeric */

static void ed_mark_free(struct ed_mark *k)
{
    if (k->prev)
        k->prev->next = k->next;
    else
        k->ec->marks = k->next;
    if (k->next)
        k->next->prev = k->prev;
    free(k);
}

static void ed_mark_done(void *arg, int status, const char *err, const uint8_t *p, size_t n)
{
    struct ed_mark *k = arg;
    struct lock_client *c = k->ec->c;
    static struct etcdpb_txn_resp t;
    struct etcdpb_range_resp q;
    struct etcdpb_kv kv;
    char msg[LOCK_MSG_MAX], num[ED_MARK_DIGITS + 1];
    size_t off = 0;
    lock_mark_cb cb = k->cb;
    void *cbarg = k->arg;
    uint64_t token = k->token;
    ed_mark_free(k);
    if (status != GRPC_STATUS_OK || ed_kv_txn_decode(p, n, &t, 1) != 0) {
        lock_fmt(msg, sizeof(msg), "raising a mark in etcd: %s",
                 status == GRPC_STATUS_OK ? "malformed Txn response" : err);
        lock_mark_done(c, cb, cbarg, LOCK_UNAVAILABLE, 0, msg);
        return;
    }
    if (!t.succeeded) { /* the compare "mark > token" failed: the put ran */
        lock_mark_done(c, cb, cbarg, LOCK_OK, token, NULL);
        return;
    }
    uint64_t mark = 0;
    int ok = etcdpb_range_resp_decode(t.responses[0].body.p, t.responses[0].body.n, &q) == 0 &&
             etcdpb_range_resp_next(&q, &off, &kv) == 1 && kv.value.n > 0 &&
             kv.value.n <= ED_MARK_DIGITS;
    for (size_t i = 0; ok && i < kv.value.n; i++) {
        ok = kv.value.p[i] >= '0' && kv.value.p[i] <= '9' && mark <= (UINT64_MAX - 9) / 10;
        mark = mark * 10 + (uint64_t)(kv.value.p[i] - '0');
    }
    if (!ok) {
        lock_fmt(msg, sizeof(msg), "a mark in etcd does not hold a number: refusing");
        c->stats.backend_errors++;
        lock_mark_done(c, cb, cbarg, LOCK_UNAVAILABLE, 0, msg);
        return;
    }
    lock_fmt(num, sizeof(num), "%llu", (unsigned long long)mark);
    lock_fmt(msg, sizeof(msg), "the mark in etcd is %s, above token %llu", num,
             (unsigned long long)token);
    lock_mark_done(c, cb, cbarg, LOCK_STALE, mark, msg);
}

/* One Txn: if mark > token then read it (stale) else put token. A missing key fails a value
 * compare in etcd, so the first raise puts. No holder check: a token is its key's create_revision,
 * never handed out twice, and a newer holder's fence on acquire raised the mark above it. */
static void ed_op_mark_raise(struct lock_client *c, const char *key, size_t len, uint64_t token,
                             const struct lock_session *holder, const char *name, size_t nlen,
                             lock_mark_cb cb, void *arg)
{
    (void)holder;
    (void)name;
    (void)nlen;
    struct ed_client *ec = ed_of(c);
    size_t plen = strlen(ec->mark_prefix);
    char *full = malloc(plen + len), num[ED_MARK_DIGITS + 1];
    struct ed_mark *k = full ? calloc(1, sizeof(*k)) : NULL;
    struct etcdpb_compare cmp;
    struct etcdpb_op ok, put;
    if (k == NULL) {
        free(full);
        lock_mark_done(c, cb, arg, LOCK_UNAVAILABLE, 0, "out of memory raising a mark");
        return;
    }
    memcpy(full, ec->mark_prefix, plen);
    memcpy(full + plen, key, len);
    lock_fmt(num, sizeof(num), "%0*llu", ED_MARK_DIGITS, (unsigned long long)token);
    memset(&cmp, 0, sizeof(cmp));
    memset(&ok, 0, sizeof(ok));
    memset(&put, 0, sizeof(put));
    cmp.result = ETCDPB_CMP_GREATER;
    cmp.target = ETCDPB_TARGET_VALUE;
    cmp.key = ed_s(full, plen + len);
    cmp.value = ed_s(num, ED_MARK_DIGITS);
    ok.kind = ETCDPB_OP_RANGE;
    ok.u.range.key = cmp.key;
    put.kind = ETCDPB_OP_PUT;
    put.u.put.key = cmp.key;
    put.u.put.value = cmp.value;
    k->ec = ec;
    k->cb = cb;
    k->arg = arg;
    k->token = token;
    etcdpb_buf_reset(&ec->out);
    int enc = etcdpb_txn_req_encode(&ec->out, &cmp, 1, &ok, 1, &put, 1);
    free(full);
    k->next = ec->marks;
    if (ec->marks)
        ec->marks->prev = k;
    ec->marks = k;
    if (enc != 0 || (k->call = ed_rpc_start(ec, ED_PATH_TXN, ed_mark_done, k)) == NULL) {
        ed_mark_free(k);
        lock_mark_done(c, cb, arg, LOCK_UNAVAILABLE, 0,
                       "etcd is not connected: the mark cannot be checked");
    }
}

/* Logs why etcd cannot be used (a refused connection, a TLS handshake, a failed login): at once
 * after a time ready, then at most once per ED_WARN_MS while it lasts. */
static void ed_warn(struct ed_client *ec, const char *msg)
{
    if (ec->c->opt.warn && lock_warn_due(&ec->warned_ms, ED_WARN_MS))
        ec->c->opt.warn(ec->c->opt.warn_arg, msg);
}

/* Every second: ready again ends a warned spell; a connection that keeps failing is logged. */
static void ed_warn_down(struct ed_client *ec)
{
    const char *last = grpc_channel_last_error(ec->ch);

    if (ed_ready(ec))
        ec->warned_ms = 0;
    else if (!grpc_channel_ready(ec->ch) && last[0])
        ed_warn(ec, last);
}

/* ---- authentication ---- */

static void ed_ready_up(struct ed_client *ec);

/* Takes the first call waiting for a new token off the waiting state; NULL when none. */
static struct ed_rpc *ed_rpc_next_waiting(struct ed_client *ec)
{
    for (struct ed_rpc *k = ec->rpcs; k; k = k->next)
        if (k->waiting) {
            k->waiting = 0;
            return k;
        }
    return NULL;
}

/* Ends every call waiting for a new token with status and why. */
static void ed_rpc_fail_waiting(struct ed_client *ec, int status, const char *why)
{
    struct ed_rpc *k;
    char err[LOCK_MSG_MAX];

    lock_fmt(err, sizeof(err), "%s", why);
    while ((k = ed_rpc_next_waiting(ec)) != NULL) {
        ed_rpc_unlink(k);
        k->fn(k->arg, status, err, NULL, 0);
        free(k->req);
        free(k);
    }
}

/* Sends every call waiting for a new token again (once: a second refusal is its answer). */
static void ed_rpc_resend_waiting(struct ed_client *ec)
{
    struct ed_rpc *k;

    while ((k = ed_rpc_next_waiting(ec)) != NULL)
        ed_rpc_send_kept(k);
}

static void ed_auth_done(void *arg, int status, const char *err, const uint8_t *p, size_t n)
{
    struct ed_client *ec = arg;
    struct etcdpb_auth_resp a;
    char token[GRPC_CHANNEL_MD_MAX];
    int64_t now = lock_now_ms();

    ec->auth = NULL;
    if (status == GRPC_STATUS_OK && etcdpb_auth_resp_decode(p, n, &a) == 0 && a.token.n > 0 &&
        a.token.n < sizeof(token)) {
        memcpy(token, a.token.p, a.token.n);
        token[a.token.n] = '\0';
        if (grpc_channel_set_metadata(ec->ch, "token", token, ED_PATH_AUTH) == 0) {
            ec->why[0] = '\0';
            ec->auth_backoff_ms = 0;
            ec->authed = 1;
            if (!ec->up_done) {
                ed_ready_up(ec);
            } else if (ec->watch) { /* it holds the old token: a new stream, new watches */
                struct grpc_call *w = ec->watch;
                ed_watch_reset(ec);
                grpc_call_cancel(w);
            }
            ed_hw_kick(ec);
            ed_rpc_resend_waiting(ec);
            return;
        }
    }
    if (status == GRPC_STATUS_UNAVAILABLE && !grpc_channel_ready(ec->ch))
        return; /* the connection went; the next one authenticates again */
    lock_fmt(ec->why, sizeof(ec->why), "etcd %s: authentication as '%s' failed: %s",
             grpc_channel_endpoint(ec->ch), ec->user,
             status != GRPC_STATUS_OK ? err : "etcd sent no usable token");
    ec->authed = 0;
    ec->auth_backoff_ms = ec->auth_backoff_ms ? ec->auth_backoff_ms * 2 : 1000;
    if (ec->auth_backoff_ms > ED_AUTH_RETRY_MAX_MS)
        ec->auth_backoff_ms = ED_AUTH_RETRY_MAX_MS;
    ec->auth_next_ms = now + ec->auth_backoff_ms;
    ed_warn(ec, ec->why);
    ed_rpc_fail_waiting(ec, GRPC_STATUS_UNAUTHENTICATED, ec->why);
}

/* Asks etcd for a token on the current connection (Auth/Authenticate), unless there are no
 * credentials or one is on its way already. */
static void ed_auth_send(struct ed_client *ec)
{
    struct etcdpb_slice user = ed_s(ec->user, strlen(ec->user));
    struct etcdpb_slice pass = ed_s(ec->pass, strlen(ec->pass));

    if (!ec->have_auth || ec->auth)
        return;
    etcdpb_buf_reset(&ec->out);
    if (etcdpb_auth_req_encode(&ec->out, user, pass) == 0)
        ec->auth = ed_rpc_begin(ec, ED_PATH_AUTH, ed_auth_done, ec);
}

/* ---- the channel ---- */

/* Clean-ups that failed (or found etcd unreachable) are tried again every second: a key left
 * under a live session lease would keep other owners waiting for as long as the session lives. */
static void ed_maint_cb(evutil_socket_t fd, short what, void *arg)
{
    struct ed_client *ec = arg;
    (void)fd;
    (void)what;
    if (grpc_channel_ready(ec->ch) && !ec->authed && lock_now_ms() >= ec->auth_next_ms)
        ed_auth_send(ec);
    ed_warn_down(ec);
    if (!ed_ready(ec))
        return;
    ed_hw_service(ec);
    ed_sweep_send(ec);
    if (ec->norphans > 0)
        ed_orphans_flush(ec);
    if (ec->ndirty == 0)
        return;
    int64_t now = lock_now_ms();
    for (struct lock_session *s = ec->c->sessions; s; s = s->next) {
        struct ed_sess *es = s->b_sess;
        size_t b = 0;
        struct lock_hnode *it = NULL, *n;
        while (es && (n = lock_map_next(&es->dirty, &b, &it)) != NULL)
            ed_dirty_clean((struct ed_dirty *)(void *)n);
        if (es)
            ed_dirty_wake(es, now);
    }
}

/* The connection is up and, with authentication, authenticated. */
static void ed_ready_up(struct ed_client *ec)
{
    ec->up_done = 1;
    ed_probe_send(ec); /* did etcd go back in revisions? */
    ed_sweep_send(ec); /* one that was due when the last connection went */
    ed_orphans_flush(ec);
    /* Leases first: a keepalive now tells whether they survived a failover. */
    size_t b = 0;
    struct lock_hnode *it = NULL, *n;
    while ((n = lock_map_next(&ec->leases, &b, &it)) != NULL)
        ed_lease_keepalive((struct ed_lease *)(void *)n);
    ed_hw_service(ec); /* held keys whose watch broke with the last connection */
    for (struct lock_session *s = ec->c->sessions; s; s = s->next) {
        struct ed_sess *es = s->b_sess;
        if (es == NULL)
            continue;
        b = 0;
        it = NULL;
        while ((n = lock_map_next(&es->dirty, &b, &it)) != NULL)
            ed_dirty_clean((struct ed_dirty *)(void *)n);
    }
    for (struct ed_acq *a = ec->acqs; a; a = a->next)
        if (a->phase == ED_ACQ_PAUSED && a->rev > 0) {
            if (a->retry)
                evtimer_del(a->retry);
            ed_acq_look(a);
        }
    lock_backend_up(ec->c);
}

static void ed_channel_up(void *arg, const char *endpoint)
{
    struct ed_client *ec = arg;
    (void)endpoint;
    if (ec->rev_conn > ec->rev_seen)
        ec->rev_seen = ec->rev_conn;
    ec->rev_conn = 0;
    ec->up_done = 0;
    ec->authed = !ec->have_auth;
    if (ec->have_auth) {
        ec->auth_backoff_ms = 0;
        ed_auth_send(ec);
    } else {
        ed_ready_up(ec);
    }
}

static void ed_channel_down(void *arg, const char *why)
{
    struct ed_client *ec = arg;
    ec->c->stats.backend_errors++;
    ec->authed = ec->up_done = 0;
    ed_rpc_fail_waiting(ec, GRPC_STATUS_UNAVAILABLE, why);
}

static const struct grpc_channel_cbs ed_channel_cbs = {ed_channel_up, ed_channel_down};

/* One "host:port" (or "[v6]:port", or a host alone) of n bytes into e. */
static int ed_parse_endpoint(const char *p, size_t n, struct grpc_endpoint *e)
{
    const char *end = p + n, *hend, *portp = NULL;
    if (n > 0 && *p == '[') {
        const char *rb = memchr(p, ']', n);
        if (rb == NULL || (rb + 1 < end && rb[1] != ':'))
            return -1;
        hend = rb;
        portp = rb + 1 < end ? rb + 2 : NULL;
        p++;
    } else {
        const char *colon = memchr(p, ':', n);
        hend = colon ? colon : end;
        portp = colon ? colon + 1 : NULL;
    }
    size_t hl = (size_t)(hend - p);
    if (hl == 0 || hl >= sizeof(e->host))
        return -1;
    memcpy(e->host, p, hl);
    e->host[hl] = '\0';
    e->port = ED_DEFAULT_PORT;
    if (portp) {
        long v = portp < end && end - portp <= 5 ? 0 : -1;
        for (const char *q = portp; v >= 0 && q < end; q++)
            v = (*q >= '0' && *q <= '9') ? v * 10 + (*q - '0') : -1;
        if (v < 1 || v > 65535)
            return -1;
        e->port = (int)v;
    }
    return 0;
}

/* etcd[s]://[user[:password]@]host:port[,host:port...][/] into eps and ec's credentials (a
 * password given apart, opt.password, wins over the URL's). Messages name the URL without its
 * user info. */
static int ed_parse_url(struct ed_client *ec, const struct lock_options *opt, const char *url,
                        struct grpc_endpoint *eps, int *neps, char *err, size_t errlen)
{
    const char *p = lock_url_userinfo(strstr(url, "://") + 3, 1, ec->user, sizeof(ec->user),
                                      ec->pass, sizeof(ec->pass), &ec->have_auth);
    if (p && opt->password[0])
        lock_fmt(ec->pass, sizeof(ec->pass), "%s", opt->password);
    if (p == NULL || (ec->have_auth && (!ec->user[0] || !ec->pass[0])) ||
        (!ec->have_auth && opt->password[0])) {
        lock_fmt(err, errlen,
                 "etcd URL: credentials must be user:password@, or user@ with the password "
                 "given apart (%%XX escapes allowed)");
        return -1;
    }
    url = p; /* from here on, messages show the hosts only */
    size_t total = strcspn(p, "/?#");
    if (p[total] != '\0' && strcmp(p + total, "/") != 0) {
        lock_fmt(err, errlen,
                 "etcd URL '%.200s': only etcd[s]://[user:password@]host:port[,host:port...] is "
                 "supported",
                 url);
        return -1;
    }
    *neps = 0;
    for (const char *end = p + total; p <= end;) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        size_t n = comma ? (size_t)(comma - p) : (size_t)(end - p);
        if (*neps >= 16) {
            lock_fmt(err, errlen, "etcd URL '%.200s': at most 16 endpoints", url);
            return -1;
        }
        if (ed_parse_endpoint(p, n, &eps[*neps]) != 0) {
            lock_fmt(err, errlen,
                     "etcd URL '%.200s': bad endpoint '%.*s' (want host:port, port 1..65535)", url,
                     (int)(n > 100 ? 100 : n), p);
            return -1;
        }
        (*neps)++;
        if (comma == NULL)
            break;
        p = comma + 1;
    }
    return 0;
}

static int ed_op_open(struct lock_client *c, const char *url, char *err, size_t errlen)
{
    struct grpc_endpoint eps[16];
    int neps = 0;
    const char *prefix = c->opt.prefix;
    size_t plen = strlen(prefix);
    if (plen == 0 || plen > ED_MAX_PREFIX) {
        lock_fmt(err, errlen, "lock prefix '%.60s' must be 1..%d bytes", prefix, ED_MAX_PREFIX);
        return -1;
    }
    struct ed_client *ec = calloc(1, sizeof(*ec));
    if (ec == NULL) {
        lock_fmt(err, errlen, "lock client: out of memory");
        return -1;
    }
    if (ed_parse_url(ec, &c->opt, url, eps, &neps, err, errlen) != 0) {
        free(ec);
        return -1;
    }
    struct grpc_channel_opts copts = {0};
    if (strncmp(url, "etcds://", 8) == 0) {
        struct grpc_tls_opts t = {c->opt.tls_ca_file, c->opt.tls_cert_file, c->opt.tls_key_file,
                                  c->opt.tls_server_name};
        char why[LOCK_MSG_MAX];
        if ((ec->tls = grpc_tls_new(&t, why, sizeof(why))) == NULL) {
            lock_fmt(err, errlen, "etcd backend: %s", why);
            free(ec);
            return -1;
        }
        copts.tls = ec->tls;
    }
    ec->c = c;
    c->impl = ec;
    /* Marks of stores that cannot keep their own live next to the locks: /x/locks/ -> /x/marks/ */
    size_t cut = plen;
    while (cut > 0 && prefix[cut - 1] == '/')
        cut--;
    while (cut > 0 && prefix[cut - 1] != '/')
        cut--;
    lock_fmt(ec->mark_prefix, sizeof(ec->mark_prefix), "%.*smarks/", (int)cut, prefix);
    ec->batch_max = ED_BATCH_MAX;
    ec->check_max = ETCDPB_TXN_MAX_OPS;
    ec->maint = event_new(c->base, -1, EV_PERSIST, ed_maint_cb, ec);
    ec->txflush = event_new(c->base, -1, 0, ed_txq_flush, ec);
    ec->hwkick = event_new(c->base, -1, 0, ed_hw_kick_cb, ec);
    ec->youngev = evtimer_new(c->base, ed_young_cb, ec);
    ec->ch = ec->maint && ec->txflush && ec->hwkick && ec->youngev
                 ? grpc_channel_new(c->base, eps, neps, &copts, &ed_channel_cbs, ec)
                 : NULL;
    if (ec->ch == NULL) {
        if (ec->maint)
            event_free(ec->maint);
        if (ec->txflush)
            event_free(ec->txflush);
        if (ec->hwkick)
            event_free(ec->hwkick);
        if (ec->youngev)
            event_free(ec->youngev);
        grpc_tls_free(ec->tls);
        lock_fmt(err, errlen, "lock client: out of memory");
        free(ec);
        c->impl = NULL;
        return -1;
    }
    struct timeval second = {1, 0};
    event_add(ec->maint, &second);
    return 0;
}

static void ed_op_close(struct lock_client *c)
{
    struct ed_client *ec = ed_of(c);
    if (ec == NULL)
        return;
    while (ec->acqs) {
        struct ed_acq *a = ec->acqs;
        if (a->r)
            a->r->b_call = NULL;
        a->r = NULL;
        ed_acq_free(a);
    }
    while (ec->rpcs)
        ed_rpc_cancel(ec->rpcs);
    while (ec->marks)
        ed_mark_free(ec->marks); /* no answers after the client closes */
    while (ec->orphans) {
        struct ed_orphan *o = ec->orphans;
        ec->orphans = o->next;
        free(o);
    }
    while (ec->wp_head) {
        struct ed_wpend *wp = ec->wp_head;
        ec->wp_head = wp->next;
        free(wp);
    }
    size_t b = 0;
    struct lock_hnode *it = NULL, *n;
    while ((n = lock_map_next(&ec->leases, &b, &it)) != NULL) {
        struct ed_lease *l = (struct ed_lease *)(void *)n;
        lock_map_remove(&ec->leases, n);
        if (l->timer)
            event_free(l->timer);
        free(l);
    }
    lock_map_clear(&ec->leases);
    grpc_channel_free(ec->ch);
    grpc_tls_free(ec->tls);
    event_free(ec->maint);
    event_free(ec->txflush);
    event_free(ec->hwkick);
    event_free(ec->youngev);
    lock_map_clear(&ec->hwatch); /* empty: every session closed first */
    free(ec->sweep_from);
    etcdpb_buf_free(&ec->out);
    free(ec);
    c->impl = NULL;
}

const struct lock_backend_ops lock_etcd_ops = {
    .scheme = "etcd",
    .tls_scheme = "etcds",
    .default_prefix = "/fencegate/locks/",
    .open = ed_op_open,
    .close = ed_op_close,
    .not_ready = ed_op_not_ready,
    .acquire = ed_op_acquire,
    .release = ed_op_release,
    .cancel = ed_op_cancel,
    .renew = ed_op_renew,
    .drop = ed_op_drop,
    .close_session = ed_op_close_session,
    .repair = NULL,
    .mark_raise = ed_op_mark_raise,
};
