/* lock.h — fencegate's lock client: sessions of leased locks with fencing tokens, on an event loop.
 *
 * A session is one owner (a RESP connection, or the sidecar itself for HTTP locks). Its locks are
 * renewed together: one round trip per session every TTL/3, however many locks it holds. A lock
 * that cannot be renewed in time is reported lost at once. Tokens of a lock strictly increase
 * across holders, sessions, processes and backend failover (see lock_acquire()).
 *
 * The backend is chosen by URL scheme (redis://, etcd://); callers never see which one they have.
 * All callbacks run on the event loop passed to lock_client_new(). */
#ifndef FG_LOCK_H
#define FG_LOCK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" { /* a C++ application links the C library */
#endif

struct event_base;
struct lock_client;
struct lock_session;

#define LOCK_MAX_NAME 512 /* longest lock name, bytes */

enum lock_status {
    LOCK_OK = 0,
    LOCK_BUSY = 1,        /* held by another owner when the wait ran out */
    LOCK_UNAVAILABLE = 2, /* the backend could not be reached or answered an error */
    LOCK_NOT_HELD = 3,    /* release of a lock this session does not hold */
    LOCK_CANCELLED = 4,   /* the session was closed while the call was pending */
    LOCK_INVALID = 5,     /* bad arguments (empty or too long name, ttl out of range) */
    LOCK_STALE = 6,       /* lock_mark_raise(): a mark above the token */
    LOCK_LOST = 7,        /* lock_mark_raise_held(): the backend does not hold the lock for s */
};

enum lock_flag {
    LOCK_NORENEW = 1 << 0, /* a fixed lease of ttl_ms, never renewed */
};

/* acquire: status LOCK_OK with the token and the lease, or an error status with a message. */
typedef void (*lock_acquire_cb)(void *arg, int status, uint64_t token, const char *msg);
/* release: LOCK_OK, LOCK_NOT_HELD, LOCK_UNAVAILABLE (the backend deletes the key once it can;
 * at worst its lease runs out). */
typedef void (*lock_release_cb)(void *arg, int status, const char *msg);
/* A held lock was lost (renewal refused or late, lease ran out, backend lost it). */
typedef void (*lock_lost_cb)(void *arg, const char *name, uint64_t token, const char *why);

/* Hooks the owner of a client may set: called for every grant before it is reported, so the
 * caller can raise high-water marks in its stores ("fence on acquire"). The hook calls done(ctx,
 * status, repaired_min) when finished: status 0 = proceed; status > 0 = the stores hold a mark
 * >= token: the client must raise the lock's token above repaired_min and call the hook again;
 * status < 0 = fail the acquisition (the lock is released, the caller gets LOCK_UNAVAILABLE). */
typedef void (*lock_fence_done)(void *ctx, int status, uint64_t repaired_min, const char *msg);
typedef void (*lock_fence_hook)(void *arg, const char *name, uint64_t token, lock_fence_done done,
                                void *ctx);

struct lock_options {
    char prefix[256];        /* key prefix; default per backend ("fencegate:" for Redis) */
    long long op_timeout_ms; /* every backend call times out after this; default 2000 */
    lock_fence_hook fence;   /* may be NULL */
    void *fence_arg;
    /* Redis backend only, may be empty: a store in the backend's own Redis keeps lock L's
     * high-water mark at <mark_prefix>{L}. The acquire script then raises that mark to the new
     * token itself (first raising the token counter past a mark at or above it, counted as a
     * token repair), so that store needs no fence hook and an acquisition no extra round trip. */
    char mark_prefix[64];
    /* Told of notable events worth a log line (a token repaired past a store's mark); may be
     * NULL. Unlike the other callbacks it runs inside the library (while a backend's answer is
     * handled), so it must only log: it must not free the client or a session. */
    void (*warn)(void *arg, const char *msg);
    void *warn_arg;
    /* etcds:// only: PEM files as etcdctl's --cacert, --cert and --key (empty: the system's CAs,
     * no client certificate), and the name the server's certificate must carry (empty: each
     * endpoint's host). */
    char tls_ca_file[1024], tls_cert_file[1024], tls_key_file[1024], tls_server_name[256];
    /* The backend's password when not in the URL (read by the caller, e.g. from a mounted
     * Secret); it replaces the URL's. etcd takes the user from the URL: etcd://user@host. */
    char password[256];
};

/* Creates a client for url ("redis://host:port[/db]" with optional user:password@, or
 * "etcd://[user:password@]host:port[,host:port...]", or etcds:// for TLS). opt may be NULL for
 * defaults. Connects in the background.
 * Returns NULL with a reason in err (unknown scheme, bad URL, out of memory). */
struct lock_client *lock_client_new(struct event_base *base, const char *url,
                                    const struct lock_options *opt, char *err, size_t errlen);
/* Closes every session (no callbacks) and the connection. NULL is a no-op. */
void lock_client_free(struct lock_client *c);
/* 1 while the backend connection is up. */
int lock_client_ready(const struct lock_client *c);
/* NULL while the backend connection is up, else why not (valid until the next call into c). */
const char *lock_client_not_ready(const struct lock_client *c);

/* A lease's bounds, in milliseconds: session leases and a lock's own TTL. */
#define LOCK_MIN_TTL_MS 500
#define LOCK_MAX_TTL_MS 3600000

/* Opens a session whose locks without their own TTL get a lease of ttl_ms (500..3600000). lost
 * is called for each lock the session loses. Returns NULL when out of memory or ttl_ms is out of
 * range. */
struct lock_session *lock_session_new(struct lock_client *c, long long ttl_ms, lock_lost_cb lost,
                                      void *arg);
/* Releases every lock of the session (best effort: leases expire anyway), cancels pending calls
 * without calling their callbacks, and frees it. NULL is a no-op. */
void lock_session_free(struct lock_session *s);

/* Acquires name (len bytes). ttl_ms 0 = the session's lease; wait_ms 0 = try once, < 0 = wait
 * without limit. Calls cb exactly once (unless the session is freed first). Acquiring a lock the
 * session already holds reports LOCK_OK with the token it has. Returns 0, or -1 when the call
 * could not even be queued (cb is then not called). */
int lock_acquire(struct lock_session *s, const char *name, size_t len, long long ttl_ms,
                 long long wait_ms, unsigned flags, lock_acquire_cb cb, void *arg);

/* Releases name. Calls cb (which may be NULL) exactly once (unless the session is freed first); the
 * lock is dropped from the session at once, so writes under it are refused from now on. Returns 0
 * or -1. */
int lock_release(struct lock_session *s, const char *name, size_t len, lock_release_cb cb,
                 void *arg);

/* Gives up every lock the session holds, as if each had been lost: the lost callback runs for
 * each (with why), writes under them are refused from now on (lock_state() says -1), and the
 * backend is asked to free their keys so that other owners get them without waiting for the
 * leases. Acquisitions in flight are not affected. NULL is a no-op. */
void lock_session_lose_all(struct lock_session *s, const char *why);

/* A reference to a session that may be freed before it is used (an answer that comes after a
 * round trip): lock_forfeit() finds the session only while it exists. */
struct lock_session_ref {
    struct lock_client *c;
    uint64_t id;
};
struct lock_session_ref lock_session_ref(const struct lock_session *s);

/* Gives up name, held by ref's session with token, as if it had been lost (why): the lost callback
 * runs, writes under it are refused from now on, the backend is asked to free its key, and the
 * next lock_acquire() of name gets a new token. For a caller whose store can no longer prove the
 * token current (the mark raised when it was granted is gone). Returns 1 when the session (still
 * there) held name with that token, else 0 (nothing changes). */
int lock_forfeit(struct lock_session_ref ref, const char *name, size_t len, uint64_t token,
                 const char *why);

/* 1 when ref's session (still there) holds name with token and its lease has not run out, else
 * 0: for a caller that learned, after a round trip, that token is current at the store. */
int lock_still_held(struct lock_session_ref ref, const char *name, size_t len, uint64_t token);

/* Local state of name in the session: 1 held (token, remaining lease in ms), 0 not held, -1 lost
 * (token of the lost lock). Never blocks. */
int lock_state(const struct lock_session *s, const char *name, size_t len, uint64_t *token,
               long long *remaining_ms);

/* Calls fn for each lock the session holds or has lost (state as in lock_state()). */
void lock_foreach(const struct lock_session *s,
                  void (*fn)(void *arg, const char *name, size_t len, int state, uint64_t token,
                             long long remaining_ms),
                  void *arg);
/* Number of locks held (not lost). */
size_t lock_count(const struct lock_session *s);
/* The most locks a caller should let one session hold: a session's renewal covers all of its
 * locks in one backend call, whose cost grows with their number. The Redis endpoint (per
 * connection) and the HTTP API (the sidecar's one session) refuse an acquisition past it. */
#define LOCK_SESSION_MAX_HELD 10000

/* High-water marks held by the lock backend itself, for stores that cannot keep one (plain HTTP
 * services). A mark is one number per key, never lowered and never expired. */
#define LOCK_MAX_MARK_KEY 1024 /* longest mark key, bytes */

/* mark_raise: LOCK_OK (the mark was <= token and is now == token), LOCK_STALE (the mark is above
 * the token and stays; `mark` holds it), LOCK_UNAVAILABLE (backend down, error or timeout: the
 * caller must treat the token as unproven), LOCK_INVALID (bad key or token). msg explains any
 * status but LOCK_OK ("" then). */
typedef void (*lock_mark_cb)(void *arg, int status, uint64_t mark, const char *msg);

/* Atomically checks and raises the mark of key (len bytes, 1..LOCK_MAX_MARK_KEY, no NUL) to token
 * (1..2^63-1): raised when mark <= token (equal passes), refused when mark > token. cb runs exactly
 * once, from the event loop (never inside this call), unless the client is freed first. Returns 0,
 * or -1 when the call could not even be queued (cb is then not called). */
int lock_mark_raise(struct lock_client *c, const char *key, size_t len, uint64_t token,
                    lock_mark_cb cb, void *arg);

/* lock_mark_raise() on s's client for a write under lock `name` that s holds with token. Where the
 * backend keeps the lock where the mark is (Redis), the same atomic step also requires the lock
 * to be held by s: otherwise nothing changes, cb gets LOCK_LOST and s renews at once (so the lock
 * is reported lost). A Redis failover that lost a grant hands its token out again; the holder is
 * what tells the two apart. With etcd tokens never repeat, and the mark alone decides. */
int lock_mark_raise_held(struct lock_session *s, const char *name, const char *key, size_t len,
                         uint64_t token, lock_mark_cb cb, void *arg);

/* Renews s's locks now rather than at the next tick (none while a renewal is in flight or the
 * backend is down; then as soon as it can): for a caller that learned the backend may no longer
 * hold one of them, so that a lost lock is reported lost without waiting for the tick. */
void lock_session_renew_soon(struct lock_session *s);

/* The owner id of s, "<client uid>:<session number>" (under LOCK_OWNER_MAX bytes with its NUL):
 * what the backend's lock keys hold while s holds them. */
#define LOCK_OWNER_MAX 64
void lock_owner(const struct lock_session *s, char *out, size_t cap);

/* The Redis backend's lock key prefix ("<prefix>lock:"): lock L's key is that and "{L}", and holds
 * its holder's owner id while the lease lasts. NULL with another backend. */
const char *lock_client_redis_lock_prefix(const struct lock_client *c);

/* Parses a token (or a high-water mark) as a backend or a store spells it: 1..19 decimal digits
 * and nothing else, at most INT64_MAX. 0 and *out set, or -1. Lua numbers are doubles, inexact
 * beyond 2^53, so the scripts hand tokens back as strings. */
int lock_token_parse(const char *s, size_t n, uint64_t *out);

/* Counters since start, for metrics. */
struct lock_stats {
    uint64_t acquired, busy, released, renewals, renewal_round_trips, lost, token_repairs,
        backend_errors;
    uint64_t backend_batches; /* backend calls that carried several acquires/releases (etcd) */
    uint64_t backend_batched; /* the acquires and releases those carried */
    /* grants refused because the token was not above a store's mark and could not be raised
     * past it (etcd: revisions went back, e.g. restored from an old snapshot) */
    uint64_t token_regressions;
};
void lock_client_stats(const struct lock_client *c, struct lock_stats *out);

#ifdef __cplusplus
}
#endif

#endif
