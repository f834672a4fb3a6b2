/* fencing.c — lock commands (FENCE.*) on the RESP endpoint and the fencing of writes.
 *
 * A connection is a lock session. A write is fenced when a protect rule, a hash tag, or the
 * one-lock rule ties one of its keys to a lock; it then travels as one server-side script that
 * checks the lock's high-water mark in the store and applies the write only if the token is not
 * older (fence.c). When fencegate cannot prove a write current it refuses it: it never sends a
 * fenced write unfenced. */
#include "fencing.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "clock.h"
#include "cmdtable.h"
#include "config.h"
#include "fence.h"
#include "lock.h"
#include "log.h"
#include "metrics.h"
#include "upstream.h"

#define FENCING_STACK_ARGS 64

/* When each lock of a connection was granted, for the hold-time histogram. */
struct fencing_held {
    struct fencing_held *next;
    uint64_t t0_us;
    size_t len;
    char name[];
};

static struct fencing_held **held_list(struct client *c)
{
    return &c->held;
}

static void held_end(struct client *c, const char *name, size_t len)
{
    for (struct fencing_held **p = held_list(c); *p; p = &(*p)->next) {
        struct fencing_held *h = *p;
        if (h->len == len && memcmp(h->name, name, len) == 0) {
            metrics_observe(&fg_metrics, H_LOCK_HOLD, clock_now_us() - h->t0_us);
            *p = h->next;
            free(h);
            return;
        }
    }
}

static void held_begin(struct client *c, const char *name, size_t len)
{
    struct fencing_held *h;

    for (h = *held_list(c); h; h = h->next)
        if (h->len == len && memcmp(h->name, name, len) == 0)
            return; /* re-acquired while held: same grant */
    h = malloc(sizeof(*h) + len);
    if (!h)
        return;
    h->t0_us = clock_now_us();
    h->len = len;
    memcpy(h->name, name, len);
    h->next = *held_list(c);
    *held_list(c) = h;
}

/* ---- FENCE.* -----------------------------------------------------------------------------------
 */

static void fencing_on_lost(void *arg, const char *name, uint64_t token, const char *why)
{
    struct client *c = arg;

    metrics_inc(&fg_metrics, M_LOCKS_LOST, 1);
    held_end(c, name, strlen(name));
    log_warn("client %" PRIu64 " %s: lock %s (token %" PRIu64 ") lost: %s", c->id, c->peer, name,
             token, why);
}

static int fencing_session(struct client *c)
{
    if (c->sess)
        return 0;
    c->sess = lock_session_new(c->srv->locks, c->srv->cfg->session_ttl_ms, fencing_on_lost, c);
    if (!c->sess)
        return -1;
    if (c->srv->owner_prefix) {
        lock_owner(c->sess, c->owner_id, sizeof(c->owner_id));
        c->owner.key_prefix = c->srv->owner_prefix;
        c->owner.plen = strlen(c->owner.key_prefix);
        c->owner.id = c->owner_id;
        c->owner.idlen = strlen(c->owner_id);
    }
    return 0;
}

/* The FENCE.ACQUIRE still waiting for its answer (there is at most one: it is a barrier). */
static struct op *fencing_pending(struct client *c)
{
    for (size_t i = 0; i < c->ops_count; i++) {
        struct op *o = op_at(c, i);
        if (o->kind == OP_LOCAL && !o->reply)
            return o;
    }
    return NULL;
}

static void fencing_fill(struct client *c, const char *fmt, ...) FG_PRINTF(2, 3);

/* Sets the pending op's reply and lets the pipeline move on. */
static void fencing_fill(struct client *c, const char *fmt, ...)
{
    struct op *o = fencing_pending(c);
    char buf[1024];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(buf, sizeof(buf) - 2, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    if ((size_t)n > sizeof(buf) - 3)
        n = (int)sizeof(buf) - 3;
    for (int i = 1; i < n; i++)
        if (buf[i] == '\r' || buf[i] == '\n')
            buf[i] = ' ';
    buf[n++] = '\r';
    buf[n++] = '\n';
    if (o) {
        o->reply = malloc((size_t)n);
        if (!o->reply) {
            c->dead = 1;
            return;
        }
        memcpy(o->reply, buf, (size_t)n);
        o->reply_len = (size_t)n;
    }
    cl_unblock(c);
    ops_emit_ready(c);
}

struct acquire_ctx {
    struct client *c;
    size_t len;
    char name[];
};

static void fencing_on_acquired(void *arg, int status, uint64_t token, const char *msg)
{
    struct acquire_ctx *a = arg;
    struct client *c = a->c;
    int len = (int)a->len;

    metrics_observe(&fg_metrics, H_LOCK_WAIT, clock_now_us() - c->wait_t0_us);
    switch (status) {
    case LOCK_OK:
        metrics_inc(&fg_metrics, M_LOCKS_ACQUIRED, 1);
        held_begin(c, a->name, a->len);
        fencing_fill(c, ":%" PRIu64, token);
        break;
    case LOCK_BUSY:
        metrics_inc(&fg_metrics, M_LOCKS_BUSY, 1);
        if (msg)
            fencing_fill(c, "-LOCKED %s", msg);
        else
            fencing_fill(c, "-LOCKED lock %.*s is held by another holder", len, a->name);
        break;
    case LOCK_INVALID:
        fencing_fill(c, "-ERR %s", msg ? msg : "invalid lock request");
        break;
    default:
        /* msg names what failed: the backend ("redis HOST:PORT is unreachable ...", "etcd ...")
         * or the store a fence on acquire could not raise ("... store HOST:PORT: ..."). */
        fencing_fill(c, "-UNAVAILABLE %s (lock %.*s not acquired; retry)",
                     msg ? msg : "lock backend unreachable", len, a->name);
        break;
    }
    free(a);
    if (!c->processing)
        cl_update(c);
}

static int fencing_parse_ms(const char *p, size_t n, long long min, long long max, long long *out)
{
    long long v = 0;

    if (n == 0 || n > 12)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9')
            return -1;
        v = v * 10 + (p[i] - '0');
    }
    if (v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

#define ARG(i)  (m + r->argv[i].off)
#define ALEN(i) (r->argv[i].len)

static void fencing_acquire(struct client *c, const char *m, const struct resp_request *r)
{
    long long ttl = 0, wait = 0;
    unsigned flags = 0;
    struct acquire_ctx *a;
    struct op *o;

    if (r->argc < 2) {
        cl_reply_error(c, "ERR wrong number of arguments for 'fence.acquire' command");
        return;
    }
    if (ALEN(1) == 0 || ALEN(1) > LOCK_MAX_NAME) {
        cl_reply_error(c, "ERR lock name must be 1..%d bytes", LOCK_MAX_NAME);
        return;
    }
    for (size_t i = 2; i < r->argc; i++) {
        if (name_is(ARG(i), ALEN(i), "norenew")) {
            flags |= LOCK_NORENEW;
        } else if (name_is(ARG(i), ALEN(i), "ttl") && i + 1 < r->argc) {
            if (fencing_parse_ms(ARG(i + 1), ALEN(i + 1), LOCK_MIN_TTL_MS, LOCK_MAX_TTL_MS, &ttl) <
                0) {
                cl_reply_error(c, "ERR TTL must be an integer number of milliseconds in %d..%d",
                               LOCK_MIN_TTL_MS, LOCK_MAX_TTL_MS);
                return;
            }
            i++;
        } else if (name_is(ARG(i), ALEN(i), "wait") && i + 1 < r->argc) {
            if (fencing_parse_ms(ARG(i + 1), ALEN(i + 1), 0, 86400000, &wait) < 0) {
                cl_reply_error(c, "ERR WAIT must be an integer number of milliseconds in "
                                  "0..86400000");
                return;
            }
            i++;
        } else {
            cl_reply_error(c,
                           "ERR syntax error at '%.*s' (FENCE.ACQUIRE name [TTL ms] [WAIT ms] "
                           "[NORENEW])",
                           (int)(ALEN(i) > 64 ? 64 : ALEN(i)), ARG(i));
            return;
        }
    }
    if (c->sess && lock_count(c->sess) >= LOCK_SESSION_MAX_HELD &&
        lock_state(c->sess, ARG(1), ALEN(1), NULL, NULL) != 1) { /* held: its token, no more */
        cl_reply_error(c,
                       "ERR this connection holds %d locks, the most one session may hold; "
                       "release some first",
                       LOCK_SESSION_MAX_HELD);
        return;
    }
    if (fencing_session(c) < 0 || !(a = malloc(sizeof(*a) + ALEN(1) + 1))) {
        c->dead = 1;
        return;
    }
    a->c = c;
    a->len = ALEN(1);
    memcpy(a->name, ARG(1), a->len);
    a->name[a->len] = '\0';
    o = op_push(c, OP_LOCAL); /* answered by fencing_on_acquired */
    if (!o) {
        free(a);
        c->dead = 1;
        return;
    }
    c->blocked = 1; /* writes after it in the pipeline must see the lock */
    c->wait_t0_us = clock_now_us();
    if (lock_acquire(c->sess, a->name, a->len, ttl, wait, flags, fencing_on_acquired, a) < 0) {
        free(a);
        fencing_fill(c,
                     "-UNAVAILABLE lock backend: cannot queue the request (lock %.*s not "
                     "acquired; retry)",
                     (int)ALEN(1), ARG(1));
    }
}

static void fencing_on_released(void *arg, int status, const char *msg)
{
    struct client *c = arg;

    if (status == LOCK_UNAVAILABLE)
        log_warn("client %" PRIu64 " %s: release: %s (the backend deletes the key once it can; "
                 "at worst its lease runs out)",
                 c->id, c->peer, msg ? msg : "backend error");
    fencing_fill(c, status == LOCK_NOT_HELD ? ":0" : ":1"); /* NOT_HELD: a newer holder's key */
    if (!c->processing)
        cl_update(c);
}

/* Answers once the backend has let go, so "1" means another holder can take the lock now. The
 * lock stops fencing writes of this connection at once. */
static void fencing_release(struct client *c, const char *m, const struct resp_request *r)
{
    uint64_t token;
    long long rem;

    if (r->argc != 2) {
        cl_reply_error(c, "ERR wrong number of arguments for 'fence.release' command");
        return;
    }
    if (!c->sess || lock_state(c->sess, ARG(1), ALEN(1), &token, &rem) != 1) {
        /* A lost lock is not held either; forget it so it stops refusing writes. */
        if (c->sess)
            (void)lock_release(c->sess, ARG(1), ALEN(1), NULL, NULL);
        cl_reply_local(c, ":0\r\n", 4);
        return;
    }
    held_end(c, ARG(1), ALEN(1));
    metrics_inc(&fg_metrics, M_LOCKS_RELEASED, 1);
    if (!op_push(c, OP_LOCAL)) {
        c->dead = 1;
        return;
    }
    c->blocked = 1;
    if (lock_release(c->sess, ARG(1), ALEN(1), fencing_on_released, c) < 0)
        fencing_fill(c, ":1");
}

static void fencing_token(struct client *c, const char *m, const struct resp_request *r)
{
    uint64_t token;
    long long rem;
    char buf[32];
    int n;

    if (r->argc != 2) {
        cl_reply_error(c, "ERR wrong number of arguments for 'fence.token' command");
        return;
    }
    if (!c->sess || lock_state(c->sess, ARG(1), ALEN(1), &token, &rem) != 1) {
        cl_reply_local(c, "$-1\r\n", 5);
        return;
    }
    n = snprintf(buf, sizeof(buf), ":%" PRIu64 "\r\n", token);
    cl_reply_local(c, buf, (size_t)n);
}

struct locks_out {
    struct buf b;
    size_t n;
    int failed;
};

static void fencing_locks_one(void *arg, const char *name, size_t len, int state, uint64_t token,
                              long long remaining_ms)
{
    struct locks_out *o = arg;
    char head[160];
    int n = snprintf(head, sizeof(head), "*4\r\n$%zu\r\n", len);

    if (buf_append(&o->b, head, (size_t)n) != FG_OK || buf_append(&o->b, name, len) != FG_OK) {
        o->failed = 1;
        return;
    }
    /* "held" and "lost" are both 4 bytes long. */
    n = snprintf(head, sizeof(head), "\r\n:%" PRIu64 "\r\n:%lld\r\n$4\r\n%s\r\n", token,
                 state == 1 ? remaining_ms : 0, state == 1 ? "held" : "lost");
    if (buf_append(&o->b, head, (size_t)n) != FG_OK)
        o->failed = 1;
    o->n++;
}

/* FENCE.LOCKS → one [name, token, remaining ms, "held"|"lost"] array per lock. */
static void fencing_locks(struct client *c, const struct resp_request *r)
{
    struct locks_out o = {{0}, 0, 0};
    char head[32];
    int n;

    if (r->argc != 1) {
        cl_reply_error(c, "ERR wrong number of arguments for 'fence.locks' command");
        return;
    }
    if (c->sess)
        lock_foreach(c->sess, fencing_locks_one, &o);
    n = snprintf(head, sizeof(head), "*%zu\r\n", o.n);
    if (o.failed || buf_reserve(&o.b, (size_t)n) != FG_OK) {
        buf_free(&o.b);
        c->dead = 1;
        return;
    }
    /* The header goes first: build it in front of the elements. */
    memmove(o.b.data + o.b.start + n, buf_head(&o.b), buf_len(&o.b));
    memcpy(o.b.data + o.b.start, head, (size_t)n);
    o.b.end += (size_t)n;
    cl_reply_local(c, buf_head(&o.b), buf_len(&o.b));
    buf_free(&o.b);
}

int fencing_is_command(const char *name, size_t nlen)
{
    return name_is(name, nlen, "fence.acquire") || name_is(name, nlen, "fence.release") ||
           name_is(name, nlen, "fence.token") || name_is(name, nlen, "fence.locks");
}

enum req_action fencing_command(struct client *c, const char *m, const struct resp_request *r)
{
    const char *name = m + r->argv[0].off;
    size_t nlen = r->argv[0].len;

    if (!fencing_is_command(name, nlen))
        return REQ_FORWARD;
    if (c->in_multi) {
        cl_reply_error(c, "ERR %.*s cannot be used inside MULTI", (int)nlen, name);
        return REQ_SKIP;
    }
    if (name_is(name, nlen, "fence.acquire"))
        fencing_acquire(c, m, r);
    else if (name_is(name, nlen, "fence.release") && c->ops_count > 0)
        return REQ_IDLE; /* after the writes sent before it: the store may check the lock key */
    else if (name_is(name, nlen, "fence.release"))
        fencing_release(c, m, r);
    else if (name_is(name, nlen, "fence.token"))
        fencing_token(c, m, r);
    else
        fencing_locks(c, r);
    return REQ_SKIP;
}

/* The EVAL form of an encoded "EVALSHA <sha> ..." request: writes into head the array header
 * and "EVAL <body length>" (cap >= 64), and returns how many bytes of enc to skip before the rest
 * of the arguments; the script body and CRLF go between. Returns 0 when enc is not such a request.
 */
static size_t fencing_eval_form(const char *enc, size_t len, char *head, size_t *hlen)
{
    static const char sha_head[] = "$7\r\nEVALSHA\r\n$40\r\n";
    const char *p = memchr(enc, '\n', len);
    size_t skip;
    int hn;

    if (!p)
        return 0;
    skip = (size_t)(p - enc) + 1 + sizeof(sha_head) - 1 + 40 + 2;
    if (skip > len)
        return 0;
    hn = snprintf(head, 64, "%.*s$4\r\nEVAL\r\n$%zu\r\n", (int)(p - enc + 1), enc,
                  strlen(fence_write_script()));
    *hlen = (size_t)hn;
    return skip;
}

struct fencing_txn;
static void fencing_txn_add(struct client *c, const struct fence_decision *d, const char *enc,
                            size_t len, int as_is);
static void fencing_script_alone(struct client *c, const struct fence_decision *d, const char *m,
                                 size_t len, struct span *sp);
static void fencing_txn_run(struct client *c, struct fencing_txn *t, struct span *sp);

/* ---- fenced writes ----------------------------------------------------------------------------
 */

/* EVAL, EVALSHA and FCALL: COMMAND does not flag them as writes (a script declares that only
 * when it runs), yet they may write. Their _RO forms are flagged readonly and Redis holds them to
 * it. */
static int fencing_is_script(const char *name, size_t n)
{
    return name_is(name, n, "eval") || name_is(name, n, "evalsha") || name_is(name, n, "fcall");
}

/* Whether a command COMMAND flags "blocking" may block. XREADGROUP without BLOCK never waits
 * and runs inside a script just as it does outside. */
static int fencing_may_block(const char *m, const struct resp_request *r)
{
    return !name_is(ARG(0), ALEN(0), "xreadgroup") || xread_blocks(m, r);
}

#define FENCING_MALFORMED (-2) /* Redis refuses the call before it runs: it gets Redis's error */

/* Keys of commands whose key positions depend on their arguments (COMMAND flags them
 * "movablekeys"). Returns the number of keys, FENCING_MALFORMED when the arguments that place
 * them are malformed (Redis parses numkeys strictly: whatever fails here fails there), or -1
 * when fencegate cannot tell. */
static long fencing_movable_keys(const char *m, const struct resp_request *r, size_t *idx,
                                 size_t max)
{
    const char *name = ARG(0);
    size_t nlen = ALEN(0), argc = r->argc, n = 0, first = 0, numkeys_at = 0;
    long long numkeys;

    if (name_is(name, nlen, "zunionstore") || name_is(name, nlen, "zinterstore") ||
        name_is(name, nlen, "zdiffstore")) {
        if (argc < 2)
            return -1;
        idx[n++] = 1;
        numkeys_at = 2;
    } else if (name_is(name, nlen, "lmpop") || name_is(name, nlen, "zmpop")) {
        numkeys_at = 1;
    } else if (name_is(name, nlen, "blmpop") || name_is(name, nlen, "bzmpop")) {
        numkeys_at = 2;
    } else if (name_is(name, nlen, "xreadgroup")) {
        /* Options up to STREAMS, then as many keys as IDs, scanned as Redis does */
        size_t i = 1, half;
        for (; i < argc; i++) {
            if (name_is(ARG(i), ALEN(i), "block") || name_is(ARG(i), ALEN(i), "count"))
                i++;
            else if (name_is(ARG(i), ALEN(i), "group"))
                i += 2;
            else if (!name_is(ARG(i), ALEN(i), "noack"))
                break;
        }
        if (i >= argc || !name_is(ARG(i), ALEN(i), "streams") || (argc - i - 1) % 2 != 0 ||
            argc - i - 1 == 0)
            return FENCING_MALFORMED;
        half = (argc - i - 1) / 2;
        if (half > max)
            return -1;
        for (size_t k = 0; k < half; k++)
            idx[n++] = i + 1 + k;
        return (long)n;
    } else if (name_is(name, nlen, "migrate")) {
        /* MIGRATE host port key|"" db timeout [COPY] [REPLACE] [AUTH pw] [AUTH2 user pw]
         * [KEYS key...]: with an empty key argument, the keys follow KEYS */
        if (argc < 6)
            return -1;
        if (ALEN(3) > 0) {
            idx[n++] = 3;
            return (long)n;
        }
        for (size_t i = 6; i < argc; i++) {
            if (name_is(ARG(i), ALEN(i), "auth"))
                i++;
            else if (name_is(ARG(i), ALEN(i), "auth2"))
                i += 2;
            else if (name_is(ARG(i), ALEN(i), "keys")) {
                if (argc - i - 1 > max)
                    return -1;
                for (size_t k = i + 1; k < argc; k++)
                    idx[n++] = k;
                break;
            }
        }
        return (long)n;
    } else if (fencing_is_script(name, nlen)) {
        numkeys_at = 2; /* the keys it declares; one that writes others escapes, as in Cluster */
    } else if (name_is(name, nlen, "sort")) {
        if (argc < 2)
            return -1;
        idx[n++] = 1;
        for (size_t i = 2; i + 1 < argc; i++)
            if (name_is(ARG(i), ALEN(i), "store") && n < max)
                idx[n++] = i + 1;
        return (long)n;
    } else if (name_is(name, nlen, "georadius") || name_is(name, nlen, "georadiusbymember")) {
        if (argc < 2)
            return -1;
        idx[n++] = 1;
        for (size_t i = 2; i + 1 < argc; i++)
            if ((name_is(ARG(i), ALEN(i), "store") || name_is(ARG(i), ALEN(i), "storedist")) &&
                n < max)
                idx[n++] = i + 1;
        return (long)n;
    } else {
        return -1; /* a command this list does not know: not fenceable here */
    }
    if (argc <= numkeys_at ||
        fencing_parse_ms(ARG(numkeys_at), ALEN(numkeys_at), 0, (long long)max, &numkeys) < 0)
        return FENCING_MALFORMED;
    first = numkeys_at + 1;
    if (first + (size_t)numkeys > argc)
        return FENCING_MALFORMED;
    for (long long k = 0; k < numkeys && n < max; k++)
        idx[n++] = first + (size_t)k;
    return (long)n;
}

static enum fence_lock_state fencing_lookup(void *arg, const char *lock, size_t len,
                                            uint64_t *token)
{
    struct client *c = arg;
    long long rem;
    int st;

    if (!c->sess)
        return FENCE_NOT_HELD;
    st = lock_state(c->sess, lock, len, token, &rem);
    return st == 1 ? FENCE_HELD : st < 0 ? FENCE_LOST : FENCE_NOT_HELD;
}

struct only_ctx {
    size_t n;
    struct fence_lock_ref ref;
    int state;
};

static void fencing_only_one(void *arg, const char *name, size_t len, int state, uint64_t token,
                             long long remaining_ms)
{
    struct only_ctx *o = arg;

    if (o->n++ == 0 && len <= sizeof(o->ref.name)) {
        memcpy(o->ref.name, name, len);
        o->ref.len = len;
        o->ref.token = token;
        o->state = state;
    }
}

/* The session's locks, counted into o; the first one kept, for the one-lock rule. Sets only the
 * small fields: a name is copied with its length. */
static size_t fencing_only(struct client *c, struct only_ctx *o)
{
    o->n = 0;
    o->ref.len = 0;
    o->ref.token = 0;
    o->state = 0;
    if (c->sess)
        lock_foreach(c->sess, fencing_only_one, o);
    return o->n;
}

/* The held lock a store's refusal is about: "STALE lock L token T < high-water mark H ..." or
 * "LOCKLOST lock L (token T) is above its high-water mark H: ...". Redis turns CR and LF into
 * spaces in an error reply, so the name is matched with that in mind; a name may hold any other
 * byte, even that very phrase, so the longest name that matches wins (a shorter one can match only
 * as a prefix of the text, never the whole lock's part of it). */
struct fencing_refusal {
    const char *r;
    size_t n;
    const char *head, *tok, *tail; /* the text around the name and the token's digits */
    const char *name;              /* the session's own copy; NULL: none matched */
    size_t len;
    uint64_t token;
};

static void fencing_refusal_one(void *arg, const char *name, size_t len, int state, uint64_t token,
                                long long remaining_ms)
{
    struct fencing_refusal *a = arg;
    const char *p = a->r;
    char tok[48];
    size_t hl = strlen(a->head), tl = strlen(a->tail);
    size_t kl = (size_t)snprintf(tok, sizeof(tok), "%s%" PRIu64, a->tok, token);

    if (state != 1 || (a->name && a->len >= len) || a->n < hl + len + kl + tl)
        return;
    if (memcmp(p, a->head, hl) != 0)
        return;
    for (size_t i = 0; i < len; i++) {
        char b = name[i], t = p[hl + i];
        if (t != b && !(t == ' ' && (b == '\r' || b == '\n')))
            return;
    }
    if (memcmp(p + hl + len, tok, kl) == 0 && memcmp(p + hl + len + kl, a->tail, tl) == 0) {
        a->name = name;
        a->len = len;
        a->token = token;
    }
}

/* Counts a refusal by the store (a reply, or an error's text without its '-') and gives the lock
 * up when the refusal proves the token is not current: a mark above the token (STALE: a newer
 * holder was granted the lock) or below it or missing (LOCKLOST: only a new grant sets a new
 * mark). A refusal that names no lock the session holds under that token (fence_owner: a lock
 * key that does not name the session) has the session renew at once, so that a lost lock is
 * reported lost. */
static void fencing_store_refusal(struct client *c, const char *r, size_t n)
{
    struct fencing_refusal a = {r, n, "STALE lock ", " token ", " < high-water mark", NULL, 0, 0};
    char why[320];
    size_t wl;

    if (n > 0 && r[0] == '-') {
        a.r = ++r;
        a.n = --n;
    }
    if (n > 5 && memcmp(r, "STALE", 5) == 0) {
        metrics_inc(&fg_metrics, M_STALE_REFUSED, 1);
    } else if (n > 8 && memcmp(r, "LOCKLOST", 8) == 0) {
        metrics_inc(&fg_metrics, M_LOCKLOST_REFUSED, 1);
        a.head = "LOCKLOST lock ";
        a.tok = " (token ";
        a.tail = ") is above its high-water mark";
    } else {
        return;
    }
    if (!c->sess)
        return;
    lock_foreach(c->sess, fencing_refusal_one, &a);
    if (!a.name) {
        lock_session_renew_soon(c->sess);
        return;
    }
    wl = n >= 2 && r[n - 2] == '\r' ? n - 2 : n;
    snprintf(why, sizeof(why), "the store refused a write: %.*s", (int)(wl > 280 ? 280 : wl), r);
    lock_forfeit(lock_session_ref(c->sess), a.name, a.len, a.token, why);
}

/* Whom the store holds the locks of c's fenced writes to (fence_owner), or NULL when the store is
 * not the lock backend's Redis. */
static const struct fence_owner *fencing_owner(const struct client *c)
{
    return c->owner.id ? &c->owner : NULL;
}

static void fencing_refuse_lost(struct client *c, const struct fence_lock_ref *l)
{
    metrics_inc(&fg_metrics, M_LOCKLOST_REFUSED, 1);
    cl_reply_error(c,
                   "LOCKLOST lock %.*s (token %" PRIu64
                   ") was lost; the write was not sent (re-acquire with FENCE.ACQUIRE)",
                   (int)l->len, l->name, l->token);
}

/* Sends the fenced form of the request: EVALSHA of the write script, preceded on a fresh
 * upstream connection by SCRIPT LOAD (pipelined: Redis runs them in order). Inside a held-back
 * MULTI it joins the block instead (fencing_txn_add). */
static void fencing_send(struct client *c, const struct fence_decision *d, const char *const *argv,
                         const size_t *lens, size_t argc, struct span *sp)
{
    static const char load_head[] = "*3\r\n$6\r\nSCRIPT\r\n$4\r\nLOAD\r\n";
    const char *body = fence_write_script();
    unsigned sdb = (unsigned)c->srv->cfg->upstream.db, cdb = (unsigned)c->db;
    int other_db = sdb != cdb; /* sent with its script's body: rare, and needs no script cache */
    struct fence_layout lay;
    char first[512]; /* most writes fit: encoded once, then copied (twice when they do not) */
    size_t need = other_db
                      ? fence_encode_write_db(sdb, cdb, d, argv, lens, argc, first, sizeof(first))
                      : fence_encode_write(c->srv->write_sha, d, argv, lens, argc, first,
                                           sizeof(first), &lay);
    char *out = malloc(need + 1);
    struct op *o;

    if (!out) {
        c->dead = 1;
        return;
    }
    if (need < sizeof(first))
        memcpy(out, first, need);
    else if (other_db)
        fence_encode_write_db(sdb, cdb, d, argv, lens, argc, out, need + 1);
    else
        fence_encode_write(c->srv->write_sha, d, argv, lens, argc, out, need + 1, &lay);
    if (c->txn) {
        fencing_txn_add(c, d, out, need, other_db);
        free(out);
        return;
    }
    span_flush(c, sp, 1);
    if (other_db) {
        up_send(c, out, need);
        free(out);
        out = NULL; /* an EVAL: no NOSCRIPT to send it again for */
    } else {
        if (!up_script_loaded(c)) {
            char len[32];
            int ln = snprintf(len, sizeof(len), "$%zu\r\n", strlen(body));
            up_send(c, load_head, sizeof(load_head) - 1);
            up_send(c, len, (size_t)ln);
            up_send(c, body, strlen(body));
            up_send(c, "\r\n", 2);
            o = op_push(c, OP_HIDDEN);
            if (!o) {
                free(out);
                c->dead = 1;
                return;
            }
            o->flags |= OPF_SCRIPT_LOAD;
            up_set_script_loaded(c, 1);
        }
        up_send_fenced(c, out, need, &lay);
    }
    o = op_push(c, OP_FORWARD);
    if (!o) {
        free(out);
        c->dead = 1;
        return;
    }
    o->flags |= OPF_FENCED | (fence_null_is_array(argv, lens, argc) ? OPF_NULL_ARRAY : 0);
    o->t0_us = batch_now();
    o->reply = out; /* kept to send again after a NOSCRIPT */
    o->reply_len = out ? need : 0;
    metrics_inc(&fg_metrics, M_FENCED_WRITES, 1);
}

/* A key fencegate keeps in the store: a mark, or with the locks in the store's Redis a lock key
 * or token counter (the backend's prefix, "<prefix>lock:" less "lock:"). A client's write to one
 * could lower a mark, or free or forge a lock. */
static int fencing_reserved(const struct client *c, const char *k, size_t n)
{
    static const char hwm[] = FENCE_HWM_PREFIX;
    size_t bl = c->srv->backend_plen;

    return (n >= sizeof(hwm) - 1 && memcmp(k, hwm, sizeof(hwm) - 1) == 0) ||
           (bl && n >= bl && memcmp(k, c->srv->owner_prefix, bl) == 0);
}

/* Redis's own answer to a command it does not know, arguments and all, then `more`. */
static void fencing_unknown(struct client *c, const char *m, const struct resp_request *r,
                            const char *more)
{
    char args[160];
    size_t al = 0;

    for (size_t i = 1; i < r->argc && al < 128; i++) {
        int n = snprintf(args + al, sizeof(args) - al, "'%.*s' ",
                         (int)(ALEN(i) < 128 - al ? ALEN(i) : 128 - al), ARG(i));
        if (n < 0 || (size_t)n >= sizeof(args) - al)
            break;
        al += (size_t)n;
    }
    args[al] = '\0';
    cl_reply_error(c, "ERR unknown command '%.*s', with args beginning with: %s%s",
                   (int)(ALEN(0) > 128 ? 128 : ALEN(0)), ARG(0), args, more);
}

enum req_action fencing_write(struct client *c, const char *m, const struct resp_request *r,
                              struct span *sp)
{
    const struct cmd_table *t;
    const struct cmd_info *ci;
    size_t key_stack[FENCING_STACK_ARGS], *keys = key_stack;
    const char *argv_stack[FENCING_STACK_ARGS], **argv = argv_stack;
    size_t lens_stack[FENCING_STACK_ARGS], *lens = lens_stack;
    struct only_ctx only;
    struct fence_decision d;
    enum req_action act = REQ_SKIP;
    long nkeys;

    if (fencing_only(c, &only) == 0 && !c->srv->rules)
        return REQ_FORWARD; /* nothing to fence: the plain proxy path */
    t = upstream_commands(c->srv->up);
    if (!t) {
        cl_reply_error(c, "UNAVAILABLE fencegate has not read the upstream's COMMAND table yet, "
                          "so it cannot tell writes apart; refused (retry shortly)");
        return REQ_SKIP;
    }
    if (r->has_quoted) { /* Redis unquotes "SET" or "\x53ET"; the table lookup would not */
        cl_reply_error(c, "ERR fencegate cannot fence an inline command with quotes; send it as "
                          "a RESP array");
        return REQ_SKIP;
    }
    ci = cmd_lookup(t, ARG(0), ALEN(0), r->argc > 1 ? ARG(1) : NULL, r->argc > 1 ? ALEN(1) : 0);
    if (!ci) { /* a renamed command, a module's loaded since: it may write; fail closed */
        fencing_unknown(c, m, r,
                        "(fencegate does not know it, so it cannot tell what it writes; refused "
                        "while writes are fenced)");
        return REQ_SKIP;
    }
    if (!(ci->flags & CMD_WRITE || fencing_is_script(ARG(0), ALEN(0))))
        return REQ_FORWARD;
    if ((ci->arity > 0 && r->argc != (size_t)ci->arity) ||
        (ci->arity < 0 && r->argc < (size_t)-ci->arity))
        return REQ_FORWARD;             /* Redis refuses it before it runs, in its own words */
    if (r->argc > FENCING_STACK_ARGS) { /* every key is judged: an index per argument */
        keys = malloc(r->argc * sizeof(*keys));
        argv = malloc(r->argc * sizeof(*argv));
        lens = malloc(r->argc * sizeof(*lens));
        if (!keys || !argv || !lens) {
            c->dead = 1;
            goto out;
        }
    }
    if (ci->flags & CMD_MOVABLEKEYS) {
        nkeys = fencing_movable_keys(m, r, keys, r->argc);
        if (nkeys == FENCING_MALFORMED) {
            act = REQ_FORWARD;
            goto out;
        }
        if (nkeys < 0) {
            cl_reply_error(c,
                           "ERR fencegate cannot tell which keys '%.*s' writes, so it cannot "
                           "fence it; refused, not sent",
                           (int)(ALEN(0) > 64 ? 64 : ALEN(0)), ARG(0));
            goto out;
        }
    } else {
        nkeys = (long)cmd_keys(ci, r->argc, keys,
                               r->argc < FENCING_STACK_ARGS ? FENCING_STACK_ARGS : r->argc);
    }
    for (size_t i = 0; i < r->argc; i++) {
        argv[i] = ARG(i);
        lens[i] = ALEN(i);
    }
    for (long i = 0; i < nkeys; i++) {
        if (fencing_reserved(c, ARG(keys[i]), ALEN(keys[i]))) {
            cl_reply_error(c,
                           "ERR key '%.*s' is fencegate's own (a fence mark or a lock's key); "
                           "clients may not write it",
                           (int)(ALEN(keys[i]) > 128 ? 128 : ALEN(keys[i])), ARG(keys[i]));
            goto out;
        }
    }
    fence_decide(c->srv->rules, argv, lens, keys, (size_t)nkeys, only.n == 1 ? &only.ref : NULL,
                 fencing_lookup, c, &d);
    if (d.verdict == FENCE_APPLY) {
        d.owner = fencing_owner(c);
        /* Re-check every lock now: a lease may have run out without its timer having fired yet
         * (a process frozen and resumed). */
        for (size_t i = 0; i < d.nlocks; i++) {
            uint64_t now_token;
            if (fencing_lookup(c, d.locks[i].name, d.locks[i].len, &now_token) != FENCE_HELD) {
                fencing_refuse_lost(c, &d.locks[i]);
                goto out;
            }
        }
        if (c->db < 0) {
            cl_reply_error(c, "ERR fencegate cannot tell this connection's database after a "
                              "SELECT inside MULTI, so it cannot fence the write; refused, not "
                              "sent (SELECT the database again)");
            goto out;
        }
        if (fencing_is_script(ARG(0), ALEN(0))) {
            if (c->txn)
                fencing_txn_add(c, &d, m, r->len, 1); /* checked with the block at EXEC */
            else if (c->in_multi || c->client_watched)
                cl_reply_error(c,
                               "ERR fencegate cannot fence a script ('%.*s' under lock %.*s) "
                               "while the connection %s; refused, not sent",
                               (int)ALEN(0), ARG(0), (int)d.locks[0].len, d.locks[0].name,
                               c->in_multi ? "is in a MULTI begun before it held a lock"
                                           : "WATCHes keys (UNWATCH, or run it in the MULTI)");
            else
                fencing_script_alone(c, &d, m, r->len, sp);
            goto out;
        }
        if ((ci->flags & CMD_NOSCRIPT) || ((ci->flags & CMD_BLOCKING) && fencing_may_block(m, r))) {
            cl_reply_error(c,
                           "ERR fencegate cannot fence '%.*s': it cannot run inside a script; "
                           "refused, not sent%s",
                           (int)(ALEN(0) > 64 ? 64 : ALEN(0)), ARG(0),
                           ci->flags & CMD_BLOCKING ? " (use its non-blocking form)" : "");
            goto out;
        }
        fencing_send(c, &d, argv, lens, r->argc, sp);
        goto out;
    }
    switch (d.verdict) {
    case FENCE_PASS:
        act = REQ_FORWARD;
        break;
    case FENCE_NOLOCK:
        metrics_inc(&fg_metrics, M_NOLOCK_REFUSED, 1);
        if (d.offending_full > d.offending.len || memchr(d.offending.name, '\0', d.offending.len))
            cl_reply_error(c,
                           "ERR key %.*s maps to a lock name no lock can have (%zu bytes%s; a "
                           "lock name is 1..%d bytes without NUL bytes), so the write cannot be "
                           "fenced; not sent (change the protect rule's lock pattern)",
                           (int)(lens[d.key_index] > 200 ? 200 : lens[d.key_index]),
                           argv[d.key_index], d.offending_full,
                           d.offending_full > d.offending.len ? "" : ", with a NUL byte",
                           LOCK_MAX_NAME);
        else
            cl_reply_error(c,
                           "NOLOCK key %.*s is protected by lock %.*s (FENCE.ACQUIRE %.*s first); "
                           "not sent",
                           (int)(lens[d.key_index] > 200 ? 200 : lens[d.key_index]),
                           argv[d.key_index], (int)d.offending.len, d.offending.name,
                           (int)d.offending.len, d.offending.name);
        break;
    case FENCE_LOCKLOST:
        fencing_refuse_lost(c, &d.offending);
        break;
    default:
        cl_reply_error(c, "ERR fencegate fences writes under at most %d locks; refused, not sent",
                       FENCE_MAX_LOCKS);
        break;
    }
out:
    if (keys != key_stack)
        free(keys);
    if (argv != argv_stack)
        free(argv);
    if (lens != lens_stack)
        free(lens);
    return act;
}

/* ---- transactions ------------------------------------------------------------------------------
 */

/* A MULTI block held back until EXEC. Sent as: WATCH <marks>; a check that every token is still
 * current; then MULTI, the commands (fenced ones as scripts), EXEC. A mark that moves after the
 * check makes EXEC fail as a whole, so the block is applied all-or-nothing against the fence. */
struct fencing_txn {
    struct buf cmds; /* the commands, as they will be sent */
    size_t count;
    int dirty;      /* a command was refused: EXEC answers EXECABORT, as Redis does */
    int fenced_now; /* the request being queued went in as a fenced script */
    struct fence_lock_ref locks[FENCE_MAX_LOCKS];
    size_t nlocks;
    struct buf multi, exec; /* MULTI and EXEC as the client spelled them (MONITOR shows them) */
    int db;                 /* the connection's database at MULTI, where the block starts */
    int unwrap; /* a script sent alone as a block of one: EXEC's reply is unwrapped for it */
    int silent; /* its EXEC (or the script) came under CLIENT REPLY OFF / SKIP */
};

static void fencing_txn_free(struct fencing_txn *t)
{
    if (!t)
        return;
    buf_free(&t->cmds);
    buf_free(&t->multi);
    buf_free(&t->exec);
    free(t);
}

static void fencing_txn_add(struct client *c, const struct fence_decision *d, const char *enc,
                            size_t len, int as_is)
{
    struct fencing_txn *t = c->txn;
    const char *body = fence_write_script();
    char head[64];
    size_t hn = 0, skip = as_is ? 0 : fencing_eval_form(enc, len, head, &hn);

    /* "EVALSHA <sha>" becomes "EVAL <body>": nothing may be loaded in the middle of a MULTI. An
     * EVAL (as_is) goes as it is. */
    if ((!as_is && (skip == 0 || buf_append(&t->cmds, head, hn) != FG_OK ||
                    buf_append(&t->cmds, body, strlen(body)) != FG_OK ||
                    buf_append(&t->cmds, "\r\n", 2) != FG_OK)) ||
        buf_append(&t->cmds, enc + skip, len - skip) != FG_OK) {
        c->dead = 1;
        return;
    }
    for (size_t i = 0; i < d->nlocks; i++) {
        size_t j;
        for (j = 0; j < t->nlocks; j++)
            if (t->locks[j].len == d->locks[i].len &&
                memcmp(t->locks[j].name, d->locks[i].name, d->locks[i].len) == 0)
                break;
        if (j == t->nlocks) {
            if (t->nlocks == FENCE_MAX_LOCKS) {
                t->dirty = 1;
                cl_reply_error(c, "ERR fencegate fences a transaction under at most %d locks",
                               FENCE_MAX_LOCKS);
                return;
            }
            t->locks[t->nlocks++] = d->locks[i];
        }
    }
    t->fenced_now = 1;
    metrics_inc(&fg_metrics, M_FENCED_WRITES, 1);
}

int fencing_active(struct client *c)
{
    struct only_ctx only;

    return c->srv->rules || fencing_only(c, &only) > 0;
}

void fencing_txn_drop(struct client *c)
{
    fencing_txn_free(c->txn);
    c->txn = NULL;
    c->in_multi = 0;
}

int fencing_txn_begin(struct client *c, const char *m, size_t len)
{
    c->txn = calloc(1, sizeof(*c->txn));
    if (!c->txn || buf_append(&c->txn->multi, m, len) != FG_OK) {
        c->dead = 1;
        return -1;
    }
    c->txn->db = c->db;
    cl_reply_local(c, "+OK\r\n", 5);
    return 0;
}

/* Appends one argument per RESP array element. */
static int fencing_put(struct buf *b, const char *p, size_t n)
{
    char head[32];
    int hn = snprintf(head, sizeof(head), "$%zu\r\n", n);

    if (buf_append(b, head, (size_t)hn) != FG_OK || buf_append(b, p, n) != FG_OK ||
        buf_append(b, "\r\n", 2) != FG_OK)
        return -1;
    return 0;
}

static int fencing_put_count(struct buf *b, size_t n)
{
    char head[32];
    int hn = snprintf(head, sizeof(head), "*%zu\r\n", n);

    return buf_append(b, head, (size_t)hn) == FG_OK ? 0 : -1;
}

/* "EVAL <script> ..." (fence_encode_eval()) over the block's locks. */
static int fencing_put_script(struct client *c, struct buf *b, const char *script,
                              const struct fencing_txn *t)
{
    struct fence_decision d;
    size_t need;

    d.nlocks = t->nlocks;
    memcpy(d.locks, t->locks, t->nlocks * sizeof(t->locks[0]));
    d.owner = fencing_owner(c);
    need = fence_encode_eval(script, &d, NULL, NULL, 0, NULL, 0);
    if (buf_reserve(b, need + 1) != FG_OK)
        return -1;
    fence_encode_eval(script, &d, NULL, NULL, 0, b->data + b->end, need + 1);
    b->end += need;
    return 0;
}

/* Sends MULTI, the commands and EXEC; the application sees only EXEC's reply. */
static void fencing_txn_commit(struct client *c, struct fencing_txn *t)
{
    static const char multi[] = "*1\r\n$5\r\nMULTI\r\n", exec[] = "*1\r\n$4\r\nEXEC\r\n";
    struct op *o;

    if (buf_len(&t->multi))
        up_send(c, buf_head(&t->multi), buf_len(&t->multi));
    else
        up_send(c, multi, sizeof(multi) - 1);
    up_send(c, buf_head(&t->cmds), buf_len(&t->cmds));
    if (buf_len(&t->exec))
        up_send(c, buf_head(&t->exec), buf_len(&t->exec));
    else
        up_send(c, exec, sizeof(exec) - 1);
    for (size_t i = 0; i < t->count + 1; i++) {
        o = op_push(c, OP_HIDDEN);
        if (!o) {
            c->dead = 1;
            return;
        }
        o->flags |= OPF_TXN_QUEUED;
    }
    o = op_push(c, OP_FORWARD);
    if (!o) {
        c->dead = 1;
        return;
    }
    o->t0_us = batch_now();
    o->txn_exec = t->nlocks > 0 && !c->client_watched;
    if (t->unwrap)
        o->flags |= OPF_UNWRAP;
    if (t->silent) /* pushed once the check passed, after the requests that followed */
        o->flags |= OPF_SILENT;
}

/* A block that ends without reaching EXEC upstream (DISCARD, EXECABORT, a lost lock) must
 * forget the application's WATCHes, as Redis does at the end of any transaction. */
static void fencing_unwatch(struct client *c, struct span *sp)
{
    static const char unwatch[] = "*1\r\n$7\r\nUNWATCH\r\n";

    if (!c->client_watched)
        return;
    span_flush(c, sp, 1);
    up_send(c, unwatch, sizeof(unwatch) - 1);
    if (!op_push(c, OP_HIDDEN))
        c->dead = 1;
    c->client_watched = 0;
}

enum req_action fencing_txn_queue(struct client *c, const char *m, const struct resp_request *r,
                                  struct span *sp)
{
    struct fencing_txn *t = c->txn;
    const char *name = ARG(0);
    size_t nlen = ALEN(0);
    const struct cmd_table *tab = upstream_commands(c->srv->up);
    const struct cmd_info *ci;
    enum req_action act;

    if (name_is(name, nlen, "discard")) {
        fencing_txn_free(t);
        c->txn = NULL;
        c->in_multi = 0;
        fencing_unwatch(c, sp);
        cl_reply_local(c, "+OK\r\n", 5);
        return REQ_SKIP;
    }
    if (name_is(name, nlen, "exec")) {
        if (buf_append(&t->exec, m, r->len) != FG_OK) {
            c->dead = 1;
            return REQ_SKIP;
        }
        fencing_txn_exec(c, sp);
        return REQ_SKIP;
    }
    if (name_is(name, nlen, "multi")) {
        cl_reply_error(c, "ERR MULTI calls can not be nested");
        return REQ_SKIP;
    }
    if (name_is(name, nlen, "watch")) { /* refused at once, and the block stays good */
        cl_reply_error(c, "ERR WATCH inside MULTI is not allowed");
        return REQ_SKIP;
    }
    if (tab) {
        ci = cmd_lookup(tab, name, nlen, NULL, 0);
        if (!ci) {
            t->dirty = 1;
            fencing_unknown(c, m, r, "");
            return REQ_SKIP;
        }
        if ((ci->arity > 0 && r->argc != (size_t)ci->arity) ||
            (ci->arity < 0 && r->argc < (size_t)-ci->arity)) {
            t->dirty = 1;
            cl_reply_error(c, "ERR wrong number of arguments for '%s' command", ci->name);
            return REQ_SKIP;
        }
        if (ci->flags & CMD_NO_MULTI) {
            t->dirty = 1;
            cl_reply_error(c, "ERR Command not allowed inside a transaction");
            return REQ_SKIP;
        }
        if (name_is(name, nlen, "hello")) { /* would change how the replies fencegate pairs look */
            t->dirty = 1;
            cl_reply_error(c, "ERR fencegate does not run HELLO inside a MULTI block while writes "
                              "are fenced; send it before MULTI");
            return REQ_SKIP;
        }
    }
    t->fenced_now = 0;
    act = fencing_write(c, m, r, sp);
    if (c->dead)
        return REQ_SKIP;
    if (act == REQ_FORWARD) {
        if (buf_append(&t->cmds, m, r->len) != FG_OK) {
            c->dead = 1;
            return REQ_SKIP;
        }
    } else if (!t->fenced_now) {
        t->dirty = 1; /* refused (NOLOCK, LOCKLOST, ...): the reply says why */
        return REQ_SKIP;
    }
    if (buf_len(&t->cmds) > (size_t)c->srv->cfg->max_request_bytes) {
        t->dirty = 1;
        cl_reply_error(c, "ERR transaction larger than max_request_bytes; it will be discarded");
        return REQ_SKIP;
    }
    t->count++;
    cl_reply_local(c, "+QUEUED\r\n", 9);
    return REQ_SKIP;
}

/* Appends "SELECT db" to b, with a hidden op for its reply, unless the connection is in db
 * already (`now`). */
static int fencing_select(struct client *c, struct buf *b, int db, int now)
{
    char num[16];

    if (db == now)
        return 0;
    snprintf(num, sizeof(num), "%d", db);
    if (fencing_put_count(b, 2) < 0 || fencing_put(b, "SELECT", 6) < 0 ||
        fencing_put(b, num, strlen(num)) < 0 || !op_push(c, OP_HIDDEN))
        return -1;
    return 0;
}

void fencing_txn_exec(struct client *c, struct span *sp)
{
    struct fencing_txn *t = c->txn;

    c->txn = NULL;
    c->in_multi = 0;
    if (t->dirty) {
        fencing_unwatch(c, sp);
        cl_reply_error(c, "EXECABORT Transaction discarded because of previous errors.");
        fencing_txn_free(t);
        return;
    }
    fencing_txn_run(c, t, sp);
}

/* A script under fenced locks, outside MULTI: sent as a block of its own, WATCHed and checked
 * like any fenced block, and answered with its own reply (OPF_UNWRAP). A script cannot run
 * inside the fence script, so this is how it is fenced; it checks the marks and does not raise
 * them (fence on acquire already did). */
static void fencing_script_alone(struct client *c, const struct fence_decision *d, const char *m,
                                 size_t len, struct span *sp)
{
    struct fencing_txn *t = calloc(1, sizeof(*t));

    if (!t || buf_append(&t->cmds, m, len) != FG_OK) {
        fencing_txn_free(t);
        c->dead = 1;
        return;
    }
    t->count = 1;
    t->db = c->db;
    t->unwrap = 1;
    t->nlocks = d->nlocks;
    memcpy(t->locks, d->locks, d->nlocks * sizeof(d->locks[0]));
    metrics_inc(&fg_metrics, M_FENCED_WRITES, 1);
    fencing_txn_run(c, t, sp);
}

static void fencing_txn_run(struct client *c, struct fencing_txn *t, struct span *sp)
{
    struct buf b = {0};
    char key[FENCE_MAX_LOCK + 64];
    struct op *o;
    /* No wait for the check, unless the application WATCHes keys of its own: a nil EXEC must then
     * still tell it that its own keys moved, not that the check refused (sent apart, below). */
    int ok = 0, piped = !c->client_watched && up_txn_ok(c);

    t->silent = c->silent_cmd;
    /* A lease that ran out while the block was queued (or the sidecar was frozen) refuses it
     * here, as it refuses a single write. */
    for (size_t i = 0; i < t->nlocks; i++) {
        uint64_t now_token;
        if (fencing_lookup(c, t->locks[i].name, t->locks[i].len, &now_token) != FENCE_HELD) {
            fencing_unwatch(c, sp);
            fencing_refuse_lost(c, &t->locks[i]);
            fencing_txn_free(t);
            return;
        }
    }
    span_flush(c, sp, 1);
    if (t->nlocks == 0) {
        fencing_txn_commit(c, t);
        fencing_txn_free(t);
        c->client_watched = 0;
        return;
    }
    /* WATCH <marks>, then the check script over them, in the marks' database. */
    if (fencing_select(c, &b, c->srv->cfg->upstream.db, t->db) < 0 ||
        fencing_put_count(&b, 1 + t->nlocks) < 0 || fencing_put(&b, "WATCH", 5) < 0)
        goto out;
    for (size_t i = 0; i < t->nlocks; i++) {
        int kl = fence_hwm_key(t->locks[i].name, t->locks[i].len, key, sizeof(key));
        if (kl < 0 || fencing_put(&b, key, (size_t)kl) < 0)
            goto out;
    }
    if (fencing_put_script(c, &b, piped ? fence_txn_check_script() : fence_check_script(), t) < 0)
        goto out;
    up_send(c, buf_head(&b), buf_len(&b));
    if (!op_push(c, OP_HIDDEN)) /* WATCH's +OK */
        goto out;
    if (piped) {
        /* As a pipelined transaction (fence_encode_txn()): the check touches a mark it refuses,
         * so EXEC applies nothing, and its refusal (kept as txn_err) answers the nil EXEC. */
        o = op_push(c, OP_HIDDEN);
        if (!o)
            goto out;
        o->flags |= OPF_TXN_QUEUED;
        buf_consume(&b, buf_len(&b));
        if (fencing_select(c, &b, t->db, c->srv->cfg->upstream.db) < 0)
            goto out;
        up_send(c, buf_head(&b), buf_len(&b));
        fencing_txn_commit(c, t);
        c->client_watched = 0;
        ok = 1;
        goto out;
    }
    o = op_push(c, OP_FORWARD);
    if (!o)
        goto out;
    o->flags |= OPF_TXN_CHECK | OPF_BARRIER;
    o->t0_us = batch_now();
    c->blocked = 1;
    c->txn_checking = t;
    t = NULL;
    ok = 1;
out:
    buf_free(&b);
    fencing_txn_free(t);
    if (!ok)
        c->dead = 1;
}

int fencing_txn_checked(struct client *c, const char *r, size_t n)
{
    struct fencing_txn *t = c->txn_checking;
    static const char unwatch[] = "*1\r\n$7\r\nUNWATCH\r\n";
    int committed = 0;

    c->txn_checking = NULL;
    if (!t)
        return 0;
    if (t->db != c->srv->cfg->upstream.db) { /* back where the block starts */
        struct buf b = {0};
        if (fencing_select(c, &b, t->db, c->srv->cfg->upstream.db) < 0)
            c->dead = 1;
        up_send(c, buf_head(&b), buf_len(&b));
        buf_free(&b);
    }
    if (n >= 3 && r[0] == ':' && r[1] == '0') {
        fencing_txn_commit(c, t);
        committed = 1;
    } else {
        fencing_store_refusal(c, r, n);
        up_send(c, unwatch, sizeof(unwatch) - 1);
        if (!op_push(c, OP_HIDDEN))
            c->dead = 1;
    }
    c->client_watched = 0;
    fencing_txn_free(t);
    return committed;
}

int fencing_noscript(struct client *c, struct op *o)
{
    const char *body = fence_write_script();
    char head[64];
    size_t hn = 0, skip;

    up_set_script_loaded(c, 0);
    /* Later requests already ran, sending this one again would reorder them: those with a reply
     * have an op, a RESP3 (un)subscribe (answered by pushes only) leaves push_barrier. */
    if (c->ops_count != 1 || c->push_barrier || !o->reply)
        return 0;
    skip = fencing_eval_form(o->reply, o->reply_len, head, &hn);
    if (skip == 0)
        return 0;
    log_info("client %" PRIu64 " %s: the fence script was flushed from the upstream; sending the "
             "write again with the script's body",
             c->id, c->peer);
    up_send(c, head, hn);
    up_send(c, body, strlen(body));
    up_send(c, "\r\n", 2);
    up_send(c, o->reply + skip, o->reply_len - skip);
    up_expect_again(c);
    free(o->reply);
    o->reply = NULL; /* a second NOSCRIPT cannot happen with EVAL */
    return 1;
}

void fencing_on_reply(struct client *c, const char *r, size_t n)
{
    fencing_store_refusal(c, r, n);
}

void fencing_close(struct client *c)
{
    struct fencing_held *h;

    while ((h = *held_list(c)) != NULL) {
        metrics_inc(&fg_metrics, M_LOCKS_RELEASED, 1);
        held_end(c, h->name, h->len);
    }
    lock_session_free(c->sess);
    c->sess = NULL;
    fencing_txn_free(c->txn);
    fencing_txn_free(c->txn_checking);
    c->txn = c->txn_checking = NULL;
    free(c->txn_err);
    c->txn_err = NULL;
}
