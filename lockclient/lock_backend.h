/* lock_backend.h — internal: the lock backends' ops table and the client/session bookkeeping
 * (lock tables, pending calls, deferred callbacks) that lock.c keeps for every backend. */
#ifndef FG_LOCK_BACKEND_H
#define FG_LOCK_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "lock.h"

struct event;

#define LOCK_DEFAULT_OP_TIMEOUT_MS 2000
#define LOCK_MAX_FENCE_ROUNDS      3     /* hook calls after repairs before an acquire gives up */
#define LOCK_UID_LEN               32    /* hex digits of a client's random 128-bit id */
#define LOCK_MSG_MAX               512   /* longest message handed to a callback */
#define LOCK_REGRESSION_WARN_MS    10000 /* refused tokens are logged at most this often */

#if defined(__GNUC__)
#define LOCK_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define LOCK_PRINTF(a, b)
#endif

/* An intrusive hash-table node whose key (a name) lives in the struct that embeds it. */
struct lock_hnode {
    struct lock_hnode *hnext;
    const char *name;
    uint32_t len;
    uint32_t hash;
};

/* A chained hash table of lock_hnodes; zero-initialised is empty. Never owns the nodes. */
struct lock_map {
    struct lock_hnode **buckets;
    size_t nbuckets; /* 0 or a power of two */
    size_t count;
};

/* Sets n's key (name must stay valid while n is in a map). */
void lock_hnode_init(struct lock_hnode *n, const char *name, size_t len);
/* The node with this name, or NULL. */
struct lock_hnode *lock_map_find(const struct lock_map *m, const char *name, size_t len);
/* Adds n (its name must not be in m yet). Returns 0, or -1 when m has no buckets and none could
 * be allocated; without memory to grow a non-empty map, chains just lengthen. */
int lock_map_insert(struct lock_map *m, struct lock_hnode *n) __attribute__((warn_unused_result));
/* Removes n, which must be in m. */
void lock_map_remove(struct lock_map *m, struct lock_hnode *n);
/* Iteration: *bucket and *node start at 0 / NULL; returns the next node or NULL at the end. The
 * node returned may be removed before the next call. */
struct lock_hnode *lock_map_next(const struct lock_map *m, size_t *bucket,
                                 struct lock_hnode **node);
/* Frees the bucket array (not the nodes). */
void lock_map_clear(struct lock_map *m);

enum lock_entry_state {
    LOCK_ENTRY_FENCING = 0, /* granted by the backend, the fence hook has not finished */
    LOCK_ENTRY_HELD = 1,
    LOCK_ENTRY_LOST = 2,
};

/* One lock of a session: 48 bytes plus the name. */
struct lock_entry {
    struct lock_hnode node;
    uint64_t token;
    int64_t expiry_ms; /* monotonic; INT64_MIN when the backend said it is gone while fencing */
    int32_t ttl_ms;
    uint8_t state; /* enum lock_entry_state */
    uint8_t flags; /* enum lock_flag */
    char name[];   /* node.len bytes and a NUL */
};

enum lock_req_kind { LOCK_REQ_ACQUIRE, LOCK_REQ_RELEASE };
enum lock_req_phase {
    LOCK_REQ_BACKEND,  /* the backend owns it (waiting, in flight) */
    LOCK_REQ_HOOK_DUE, /* granted; a deferred call of the fence hook is queued */
    LOCK_REQ_IN_HOOK,  /* the fence hook runs; it owns the request until done() */
    LOCK_REQ_REPAIR,   /* the backend raises the token (ops->repair) */
};

/* A pending acquire or release. The backend may use the b_ fields while it owns the request. */
struct lock_req {
    struct lock_req *s_prev, *s_next; /* the session's pending requests */
    struct lock_req *joined;          /* same-session acquires of this name sharing the outcome */
    struct lock_session *s;           /* NULL once the session is gone */
    enum lock_req_kind kind;
    enum lock_req_phase phase;
    lock_acquire_cb acquire_cb;
    lock_release_cb release_cb;
    void *arg;
    int64_t start_ms;
    int64_t deadline_ms; /* INT64_MAX = wait without limit */
    int32_t ttl_ms;
    unsigned flags;
    int fence_rounds;
    uint64_t token; /* the granted token while fencing */
    char *gone;     /* while fencing: why the backend said the grant is gone (owned), or NULL */
    struct lock_req *b_next;
    void *b_wait;
    void *b_call;
    uint32_t len;
    char name[]; /* len bytes and a NUL */
};

struct lock_session {
    struct lock_session *prev, *next;
    struct lock_client *c;
    uint64_t id;
    int32_t ttl_ms;
    lock_lost_cb lost;
    void *lost_arg;
    struct lock_map locks; /* struct lock_entry by name */
    struct lock_req *reqs; /* pending requests */
    struct event *timer;   /* the only timer: next renewal or the earliest local expiry */
    int64_t next_renew_ms; /* INT64_MAX when nothing is renewable */
    /* What the timer is armed by: the earliest local expiry of a held lock (INT64_MAX: none) and
     * the shortest renewable lease (0: none). Exact after each tick's scan of the locks; between
     * ticks only lowered, by locks that come, so that a grant costs no scan (a release or a
     * renewal leaves them low: the timer then fires early, and that tick makes them exact). */
    int64_t sched_earliest;
    int32_t sched_min_ttl;
    int renew_inflight;
    void *b_sess; /* the backend's per-session state, if it keeps any */
};

struct lock_note;

struct lock_client {
    const struct lock_backend_ops *ops;
    void *impl; /* the backend's state */
    struct event_base *base;
    struct lock_options opt;
    char uid[LOCK_UID_LEN + 1];
    uint64_t rng; /* jitter state, seeded from /dev/urandom */
    uint64_t next_session_id;
    struct lock_session *sessions;
    struct lock_stats stats;
    struct lock_note *notes_head, *notes_tail; /* user callbacks, run from dispatch_ev */
    struct event *dispatch_ev;
    int dispatching;
    int free_pending;
    int64_t regress_warned_ms; /* a refused token was last logged then (0: never) */
    uint64_t regress_unsaid;   /* refused since, not logged */
};

/* A backend. Every entry point runs on the client's loop; none calls a user callback directly
 * (lock.c defers them), so a backend may report results from inside its own I/O callbacks. */
struct lock_backend_ops {
    const char *scheme;         /* URL scheme without "://" */
    const char *tls_scheme;     /* the same over TLS, or NULL */
    const char *default_prefix; /* used when lock_options.prefix is empty */
    /* Parses url, sets c->impl and starts connecting. Returns 0, or -1 with a reason in err. */
    int (*open)(struct lock_client *c, const char *url, char *err, size_t errlen);
    /* Sends what is buffered (best effort), drops the connections, frees c->impl. Every session is
     * already closed. */
    void (*close)(struct lock_client *c);
    /* NULL while calls can start, else why not (the backend's buffer, valid until its next call).
     */
    const char *(*not_ready)(const struct lock_client *c);
    /* Takes r (an acquire); ends with lock_granted() or lock_req_finish(), unless cancelled. */
    void (*acquire)(struct lock_req *r);
    /* Takes r (a release of a lock already dropped from the session); ends with
     * lock_req_finish(): LOCK_OK, LOCK_NOT_HELD or LOCK_UNAVAILABLE. */
    void (*release)(struct lock_req *r);
    /* Forgets r without a result (its session is closing); r is freed by the caller. A grant that
     * arrives later must be released by the backend. */
    void (*cancel)(struct lock_req *r);
    /* One round trip renewing every renewable lock of s (HELD or FENCING, no LOCK_NORENEW): for
     * each, lock_renew_result(); then lock_renew_done(), also on failure. */
    void (*renew)(struct lock_session *s, int64_t now_ms);
    /* Releases name for s's owner, fire and forget. */
    void (*drop)(struct lock_session *s, const char *name, size_t len);
    /* s is being freed: release all its locks in one call (fire and forget) and forget s. */
    void (*close_session)(struct lock_session *s);
    /* Raises r's token above repaired_min if r's lock is still held; ends with lock_repaired().
     * NULL when the backend cannot repair (the acquire then fails). */
    void (*repair)(struct lock_req *r, uint64_t repaired_min);
    /* Checks and raises the mark of key (already validated) to token in one atomic step; ends with
     * exactly one lock_mark_done(c, cb, arg, ...) unless the client closes first (then never).
     * With a holder (non-NULL), a backend that keeps lock `name` (validated) where the mark is
     * also requires the holder to hold it in that step (else LOCK_LOST, and lock_holder_lost()).
     * NULL when the backend cannot hold marks (lock_mark_raise() answers LOCK_UNAVAILABLE). */
    void (*mark_raise)(struct lock_client *c, const char *key, size_t len, uint64_t token,
                       const struct lock_session *holder, const char *name, size_t nlen,
                       lock_mark_cb cb, void *arg);
};

extern const struct lock_backend_ops lock_redis_ops;
extern const struct lock_backend_ops lock_etcd_ops;

/* Monotonic clock, milliseconds. */
int64_t lock_now_ms(void);
/* For a warning logged at most once per every_ms: 1 when *last_ms (when it was last logged; 0:
 * never, or news again) is that long ago, which sets it to now; else 0. */
int lock_warn_due(int64_t *last_ms, int64_t every_ms);
/* The user info at p (just past "scheme://"): everything before the last '@' of the URL, so a
 * password may hold '/', '?' or '#' unescaped (as config/ reads URLs). "user:password", or, with
 * no ':', a password alone (as redis-cli reads it) or, when bare_is_user, a user name (etcd);
 * %XX-decoded into user and pass; *have = 1 when there was an '@'. Returns where the host part
 * starts (p without an '@'), or NULL when an escape is malformed, decodes to NUL, or a part does
 * not fit. */
const char *lock_url_userinfo(const char *p, int bare_is_user, char *user, size_t ucap, char *pass,
                              size_t pcap, int *have);
/* A pseudo-random number for jitter (not for secrets). */
uint64_t lock_random(struct lock_client *c);

/* The backend granted r with token; sent_ms is when the granting call was sent (the lease is
 * counted from there). The backend no longer owns r. */
void lock_granted(struct lock_req *r, uint64_t token, int64_t sent_ms);
/* Ends r (and the acquires joined to it) with status; the backend no longer owns r. */
void lock_req_finish(struct lock_req *r, int status, uint64_t token, const char *msg);
/* Result of ops->repair: status LOCK_OK with the new token, or an error status and message. */
void lock_repaired(struct lock_req *r, int status, uint64_t token, const char *msg);
/* Result of one lock in a renewal round trip sent at sent_ms: held 1 = lease extended, 0 = the
 * backend no longer has it. Ignored unless s still has name with this token. */
void lock_renew_result(struct lock_session *s, const char *name, size_t len, uint64_t token,
                       int64_t sent_ms, int held);
/* The backend saw that s no longer holds name with token (its key was deleted or taken over),
 * outside a renewal: the lock is lost at once, as when a renewal is refused, with why as the
 * reason (copied); a grant still in its fence on acquire is not handed out, and its acquisition
 * fails naming why. Ignored unless s still holds name with this token. */
void lock_held_gone(struct lock_session *s, const char *name, size_t len, uint64_t token,
                    const char *why);
/* The renewal round trip of s ended (successfully or not). */
void lock_renew_done(struct lock_session *s);
/* Result of ops->mark_raise: LOCK_OK, LOCK_STALE with the mark, or LOCK_UNAVAILABLE with a
 * message. cb runs later, from the client's dispatch event. */
void lock_mark_done(struct lock_client *c, lock_mark_cb cb, void *arg, int status, uint64_t mark,
                    const char *msg);
/* The backend found that the session with this id (if it still exists) no longer holds a lock it
 * believes it holds: it renews at once, so the loss is reported. */
void lock_holder_lost(struct lock_client *c, uint64_t session_id);
/* The backend (re)connected: renewals that fell due while it was down are sent now. */
void lock_backend_up(struct lock_client *c);

/* snprintf that never fails: truncates, always NUL-terminates (cap > 0). */
void lock_fmt(char *out, size_t cap, const char *fmt, ...) LOCK_PRINTF(3, 4);
/* Counts a token repair of lock name (len bytes) and tells the owner's warn callback, if any;
 * reissued: a token had been granted and a new one replaces it. */
void lock_note_repair(struct lock_client *c, const char *name, size_t len, int reissued,
                      uint64_t token);

#endif
