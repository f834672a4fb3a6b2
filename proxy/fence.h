/* fence.h — pure fencing decisions: which lock guards a key, whether a write may go, and the
 * server-side scripts that apply a write only if its token is not older than the store's mark. */
#ifndef FG_FENCE_H
#define FG_FENCE_H

#include <stddef.h>
#include <stdint.h>

#include "fg_error.h"

#define FENCE_MAX_LOCK  512 /* longest lock name a rule may produce */
#define FENCE_MAX_LOCKS 8   /* distinct locks one command may touch */
#define FENCE_HWM_PREFIX                                                                           \
    "fencegate:hwm:" /* store key of a lock's mark: prefix + "{" + lock + "}" */

/* One protect rule: keys matching glob (with '*' and '?') are guarded by the lock named by
 * template, where "$1".."$9" stand for what the n-th '*' matched. */
struct fence_rule {
    const char *glob;
    const char *lock_template;
};

struct fence_rules;

/* Compiles rules (copied). Returns NULL with *err = FG_ERR_CONFIG (a "$N" with no N-th '*') or
 * FG_ERR_NOMEM. n may be 0. */
struct fence_rules *fence_rules_new(const struct fence_rule *rules, size_t n, int *err);
void fence_rules_free(struct fence_rules *r); /* NULL is a no-op */

/* Which lock guards key (klen bytes, binary-safe). Rules are tried in order, then the hash-tag
 * rule (a key "a{L}b" is guarded by lock "L": the first '{' and the next '}' with something
 * between them, as Redis Cluster reads hash tags). Writes the lock name into lock (cap bytes, not
 * NUL-terminated) and returns its length; returns 0 when no rule claims the key; returns
 * FG_ERR_LIMIT if the name would not fit in cap. A rule whose name comes out empty does not claim
 * the key. Captures are leftmost-shortest: "a:*:b:*" on "a:x:b:y:b:z" gives $1 "x", $2 "y:b:z". */
int fence_lock_for_key(const struct fence_rules *r, const char *key, size_t klen, char *lock,
                       size_t cap);

/* The state of one lock in the connection's session, as the caller knows it. */
enum fence_lock_state { FENCE_NOT_HELD = 0, FENCE_HELD, FENCE_LOST };

/* Looks up a lock in the caller's session. */
typedef enum fence_lock_state (*fence_lookup_fn)(void *arg, const char *lock, size_t len,
                                                 uint64_t *token);

enum fence_verdict {
    FENCE_PASS = 0, /* not fenced: forward unchanged */
    FENCE_APPLY,    /* fence with the locks in the decision */
    FENCE_NOLOCK,   /* a protected key and the session does not hold its lock */
    FENCE_LOCKLOST, /* the session held the lock but lost it */
    FENCE_TOOMANY,  /* more than FENCE_MAX_LOCKS distinct locks */
};

struct fence_lock_ref {
    char name[FENCE_MAX_LOCK];
    size_t len;
    uint64_t token;
};

/* Whose locks a write runs under, when the lock backend is the store's own Redis. The scripts then
 * also require each lock's key there (key_prefix "{" lock "}", which the backend keeps holding its
 * holder's owner id while the lease lasts) to hold id: a write is applied only while the store
 * itself says this session holds the lock. Marks alone cannot tell two holders apart once a
 * failover lost a grant: the token counter and the marks went back with it, and the next holder
 * is granted the lost token again. */
struct fence_owner {
    const char *key_prefix; /* "<backend prefix>lock:" */
    size_t plen;
    const char *id; /* the session's owner id */
    size_t idlen;
};

struct fence_decision {
    enum fence_verdict verdict;
    const struct fence_owner *owner; /* APPLY: set by the caller; NULL checks the marks alone */
    struct fence_lock_ref locks[FENCE_MAX_LOCKS]; /* APPLY: the distinct locks to check */
    size_t nlocks;
    size_t key_index;                /* NOLOCK / LOCKLOST: the argv index of the key */
    struct fence_lock_ref offending; /* NOLOCK / LOCKLOST: the lock named in the error */
    size_t offending_full;           /* its whole length: over FENCE_MAX_LOCK, no lock's name */
};

/* Decides how a write with the given keys (argv indexes into argv/lens) is fenced. Each key is
 * mapped with fence_lock_for_key(); a key no rule claims is guarded by the session's only lock
 * when `only_lock` is non-NULL (the one-lock rule), else it is unprotected. A claimed key whose
 * lock the session holds → that lock joins the decision; lost → FENCE_LOCKLOST; not held →
 * FENCE_NOLOCK — except for a key claimed only by its hash tag, which a session that neither holds
 * nor lost that lock treats as unclaimed (tags also place keys in Cluster slots, and such keys
 * must keep working for connections that never use locks). A write with no keys at all (FLUSHDB,
 * SWAPDB, a script that declares none) is guarded by `only_lock` as an unclaimed key would be.
 * Nothing claimed and no only lock → FENCE_PASS. Never allocates. Keys are judged in order and the
 * first refusal wins; a lock name longer than FENCE_MAX_LOCK fails closed as FENCE_NOLOCK
 * (offending = its first FENCE_MAX_LOCK bytes); FENCE_TOOMANY also fills key_index and offending.
 */
void fence_decide(const struct fence_rules *r, const char *const *argv, const size_t *lens,
                  const size_t *key_idx, size_t nkeys, const struct fence_lock_ref *only_lock,
                  fence_lookup_fn lookup, void *lookup_arg, struct fence_decision *out);

/* The script that applies one fenced write (Lua, for EVAL/EVALSHA/SCRIPT LOAD): KEYS are the marks
 * of the locks, then (with an owner) their lock keys; ARGV = nlocks, the owner id ("" for none),
 * tokens..., lock names..., then the command and its arguments. It refuses with "STALE lock L
 * token T < high-water mark H (a newer holder exists; re-acquire)" when any token is older than
 * its mark, with "LOCKLOST lock L (token T) is above its high-water mark H: ..." when a mark is
 * below its token or missing (the mark fence on acquire set is gone: the lock must be given up),
 * with "LOCKLOST lock L (token T) is not held in the store: ..." when a lock key does not hold the
 * owner id, else returns the command's own reply (errors included, unchanged). Marks are never
 * raised by writes: fence on acquire raised them to the token. */
const char *fence_write_script(void);

/* Whether Redis answers "nothing" to this write with a null array (RESP2 "*-1"): LPOP or RPOP
 * with a count, LMPOP, ZMPOP, XREADGROUP. A script turns it into a null bulk string ("$-1"), so
 * the reply of its fenced form is turned back. */
int fence_null_is_array(const char *const *argv, const size_t *lens, size_t argc);

/* The script that applies fenced writes pipelined back to back, in one call: KEYS are the marks
 * of every write, in order; ARGV = the number of writes, then for each the count of its
 * arguments and the write script's ARGV. Each write is judged and applied on its own, in order,
 * as fence_write_script() would; the reply is an array of their replies. */
const char *fence_group_script(void);

/* The script run on acquire: KEYS[1] = the mark, ARGV[1] = token. Raises the mark to the token and
 * returns 0 when the token is above it; returns the mark when it is >= the token (the token
 * counter went backwards: the caller repairs it). */
const char *fence_raise_script(void);

/* The check run before a transaction with fenced writes: KEYS and ARGV as the write script's, up to
 * the lock names. Returns 0 when every token equals its mark (and every lock key holds the owner),
 * else the STALE (LOCKLOST) error, ending "the transaction was not applied". Raises nothing. */
const char *fence_check_script(void);

/* Lowercase hex SHA-1 of a script (41 bytes with the NUL), as SCRIPT LOAD returns it. */
void fence_script_sha(const char *script, char out[41]);

/* The mark's key for lock: FENCE_HWM_PREFIX "{" lock "}", not NUL-terminated. Returns its length,
 * or FG_ERR_LIMIT. */
int fence_hwm_key(const char *lock, size_t len, char *out, size_t cap);

/* Where the parts of a fence_encode_write() request lie, as byte offsets into it (or into a
 * buffer of several, once the caller has added the request's own offset to each). */
struct fence_layout {
    size_t start;     /* the request: [start, end) */
    size_t keys_off;  /* the KEYS' bulk strings: [keys_off, argv_off) */
    size_t marks_end; /* the marks: [keys_off, marks_end); lock keys (with an owner) after */
    size_t argv_off;  /* ARGV's: [argv_off, end); its (n, owner, tokens, names) end at cmd_off */
    size_t cmd_off;   /* the command's own arguments: [cmd_off, end), argc of them */
    size_t end;
    size_t nlocks, nkeys, nargv, argc;
};

/* Moves every offset of l by `by` bytes (the request was copied `by` bytes further on). */
void fence_layout_shift(struct fence_layout *l, size_t by);

/* Encodes "EVALSHA <sha> <nkeys> <marks...> [<lock keys...>] <nlocks> <owner> <tokens...>
 * <names...> <argv...>" (lock keys and owner from d->owner; "" as the owner without one) as a RESP
 * multibulk into out (cap bytes). Returns the length, or the length needed if > cap (nothing
 * useful written), like snprintf. Fills *lay when lay is not NULL. */
size_t fence_encode_write(const char sha[41], const struct fence_decision *d,
                          const char *const *argv, const size_t *lens, size_t argc, char *out,
                          size_t cap, struct fence_layout *lay);

/* "EVAL <script> <nkeys> <keys...> <nlocks> <owner> <tokens...> <names...> <argv...>": one of the
 * scripts above by its body, over d's locks; returns the length as fence_encode_write() does. */
size_t fence_encode_eval(const char *script, const struct fence_decision *d,
                         const char *const *argv, const size_t *lens, size_t argc, char *out,
                         size_t cap);

/* The write script for a connection whose database (cmd_db) is not the marks' (mark_db): the
 * marks are judged and raised in mark_db, the command runs in cmd_db. Encoded as
 * "EVAL <body> <nkeys> <keys...> <mark_db> <cmd_db> <nlocks> <owner> <tokens...> <names...>
 * <argv...>", returning the length as fence_encode_write() does. */
const char *fence_write_db_script(void);
size_t fence_encode_write_db(unsigned mark_db, unsigned cmd_db, const struct fence_decision *d,
                             const char *const *argv, const size_t *lens, size_t argc, char *out,
                             size_t cap);

/* Encodes k fence_encode_write() requests, laid out in reqs as lay[0..k) says, as one call of
 * fence_group_script(): EVALSHA with sha, or EVAL with the script's body when sha is NULL.
 * Returns the length, or the length needed if > cap, like snprintf. */
size_t fence_encode_group(const char sha[41], const char *reqs, const struct fence_layout *lay,
                          size_t k, char *out, size_t cap);

/* Whether two fence_encode_write() requests (a in ra, b in rb) are fenced by the same locks and
 * tokens, for the same owner. */
int fence_same_locks(const char *ra, const struct fence_layout *a, const char *rb,
                     const struct fence_layout *b);

/* Writes under the same locks (fence_same_locks()) arriving back to back, as one pipelined
 * transaction in place of script calls, so Redis runs them natively:
 *   WATCH <marks>; EVAL <check> ...; MULTI; <the k commands>; EXEC
 * (the lock keys are checked, not watched: every renewal touches them, and a new holder's grant
 * raises the mark anyway)
 * The check (fence_txn_check_script(), always sent with its body: a missing script must not skip
 * it) refuses with the error the write script would give, and then touches the mark it refused
 * on, so EXEC answers nil and nothing is applied; a newer holder raising a mark before EXEC does
 * the same. Nothing raises a mark: each equals its token, as the check found. Replies: +OK, the
 * check's (:0 or the refusal), +OK, k times +QUEUED (or a refusal of that command), then EXEC's:
 * an array answering the k writes, or nil. Redis 7 ends the
 * transaction even when it refuses EXEC itself (-BUSY: a script past its time limit); Redis 6.0
 * leaves the connection inside MULTI then, so this needs Redis 7. Returns the length, or the
 * length needed if > cap, like snprintf. */
size_t fence_encode_txn(const char *reqs, const struct fence_layout *lay, size_t k, char *out,
                        size_t cap);
const char *fence_txn_check_script(void);

#endif
