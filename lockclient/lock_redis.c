/* lock_redis.c — the Redis lock backend: SET NX PX + INCR in one script, owner-checked renewals
 * batched per session, owner-checked release that wakes waiters over pub/sub; hiredis + libevent.
 */
#include "lock_backend.h"

#include <inttypes.h>
#include <event2/event.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <hiredis/adapters/libevent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "resolve.h"

#define RD_DEFAULT_PORT   6379
#define RD_BACKOFF_MIN_MS 100
#define RD_BACKOFF_MAX_MS 5000
#define RD_RETRY_MIN_MS   50   /* a waiter re-tries after a random 50..200 ms ... */
#define RD_RETRY_MAX_MS   200  /* ... or the holder's remaining lease, if shorter */
#define RD_MAX_DROPS      4096 /* unsent fire-and-forget releases kept while disconnected */
#define RD_DROP_SENDS     4    /* sends of a fire-and-forget release whose replies were lost */
#define RD_MAX_PREFIX     200
#define RD_SHA_LEN        40
#define RD_MAX_DB         1000000
#define RD_MAX_HANDSHAKE  8
#define RD_WARN_MS        30000 /* a lock connection that keeps failing is logged this seldom */

enum rd_script { RD_ACQUIRE, RD_RENEW, RD_RELEASE, RD_REPAIR, RD_MARK, RD_CHECK, RD_NSCRIPTS };

/* The scripts. Keys of one lock share the hash tag {name}, so they live in one cluster slot. */
static const char *const rd_scripts[RD_NSCRIPTS] = {
    /* acquire. KEYS: lock, counter[, mark]. ARGV: owner, ttl. Returns {1, "token", repaired} or
     * {0, holder's pttl}. A key that already holds our owner (a grant whose reply was lost, or a
     * lease this session was told is lost) is granted again with a new token. With a mark (the
     * high-water mark of a store in this Redis) the token is raised past it when the counter
     * is not (a counter lost in a failover: repaired = 1) and the mark is set to the token.
     * Compared and returned as decimal strings: Lua numbers are doubles, inexact beyond 2^53
     * (INCR's reply, made a Lua number, would be rounded). */
    "local mark = KEYS[3] and redis.call('GET', KEYS[3])\n"
    "if mark and not string.match(mark, '^%d+$') then\n"
    "  return redis.error_reply('ERR the high-water mark ' .. KEYS[3] .. ' is not a number')\n"
    "end\n"
    "local function grant()\n"
    "  local cur, repaired = redis.call('GET', KEYS[2]) or '0', 0\n"
    "  if mark and (#mark > #cur or (#mark == #cur and mark > cur)) then\n"
    "    redis.call('SET', KEYS[2], mark)\n"
    "    repaired = 1\n"
    "  end\n"
    "  redis.call('INCR', KEYS[2])\n"
    "  local t = redis.call('GET', KEYS[2])\n"
    "  if KEYS[3] then redis.call('SET', KEYS[3], t) end\n"
    "  return {1, t, repaired}\n"
    "end\n"
    "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then\n"
    "  return grant()\n"
    "end\n"
    "if redis.call('GET', KEYS[1]) == ARGV[1] then\n"
    "  redis.call('PEXPIRE', KEYS[1], ARGV[2])\n"
    "  return grant()\n"
    "end\n"
    "return {0, redis.call('PTTL', KEYS[1])}\n",
    /* renew. KEYS: locks. ARGV: owner, then the ttl of each key. Returns 1/0 per key. */
    "local r = {}\n"
    "for i, k in ipairs(KEYS) do\n"
    "  if redis.call('GET', k) == ARGV[1] then\n"
    "    redis.call('PEXPIRE', k, ARGV[i + 1])\n"
    "    r[i] = 1\n"
    "  else\n"
    "    r[i] = 0\n"
    "  end\n"
    "end\n"
    "return r\n",
    /* release. KEYS: locks. ARGV: owner, lock key prefix, channel prefix. Returns how many were
     * ours and deleted; each one is announced on its channel, best effort: an ACL user without
     * that channel (Redis 7 gives new users none) must not see its release, already done by the
     * DEL, answered as an error; waiters then find the lock free by their retry. */
    "local n = 0\n"
    "for _, k in ipairs(KEYS) do\n"
    "  if redis.call('GET', k) == ARGV[1] then\n"
    "    redis.call('DEL', k)\n"
    "    redis.pcall('PUBLISH', ARGV[3] .. string.sub(k, #ARGV[2] + 1), 'released')\n"
    "    n = n + 1\n"
    "  end\n"
    "end\n"
    "return n\n",
    /* repair. KEYS: lock, counter. ARGV: owner, minimum. If the lock is ours, counter :=
     * max(counter, minimum) + 1 and returns it as a string (compared and returned as decimal
     * strings: exact beyond 2^53); else -1. */
    "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end\n"
    "local cur = redis.call('GET', KEYS[2]) or '0'\n"
    "local min = ARGV[2]\n"
    "if #cur < #min or (#cur == #min and cur < min) then\n"
    "  redis.call('SET', KEYS[2], min)\n"
    "end\n"
    "redis.call('INCR', KEYS[2])\n"
    "return redis.call('GET', KEYS[2])\n",
    /* mark. KEYS: mark[, lock]. ARGV: token[, owner]. A mark above the token: {0, mark}. Else,
     * with a lock key that does not hold the owner: {2, "0"}. Else raises the mark to the token
     * and returns {1, token}; nothing changes otherwise. Compared as decimal strings (length,
     * then bytes): Lua numbers are doubles, inexact beyond 2^53, and tokens go up to 2^63-1. */
    "local cur = redis.call('GET', KEYS[1])\n"
    "local t = ARGV[1]\n"
    "if cur and (#cur > #t or (#cur == #t and cur > t)) then return {0, cur} end\n"
    "if KEYS[2] and redis.call('GET', KEYS[2]) ~= ARGV[2] then return {2, '0'} end\n"
    "redis.call('SET', KEYS[1], t)\n"
    "return {1, t}\n",
    /* check. KEYS: locks. ARGV: owner. Returns 1/0 per key: whether it still holds the owner
     * (leases untouched: for locks that must not be renewed). */
    "local r = {}\n"
    "for i, k in ipairs(KEYS) do\n"
    "  r[i] = redis.call('GET', k) == ARGV[1] and 1 or 0\n"
    "end\n"
    "return r\n",
};

/* AUTH, SELECT and one SCRIPT LOAD per script must fit the handshake's record. */
_Static_assert(2 + RD_NSCRIPTS <= RD_MAX_HANDSHAKE, "RD_MAX_HANDSHAKE is too small");

/* RD_CONNECTING: the host's lookup (resolving), then the connect and handshake (ac). */
enum rd_conn_state { RD_DOWN, RD_CONNECTING, RD_READY };
enum rd_hs_step { RD_HS_AUTH, RD_HS_SELECT, RD_HS_LOAD }; /* RD_HS_LOAD + script index */

struct rd_client;

/* One hiredis connection with its reconnect backoff and handshake. */
struct rd_conn {
    struct rd_client *rc;
    redisAsyncContext *ac;
    struct resolve_req *resolving; /* the host's lookup before a connect; NULL when none */
    enum rd_conn_state state;
    struct event *timer; /* reconnect backoff while DOWN, the deadline of lookup, connect and
                          * handshake while CONNECTING */
    int backoff_ms;
    int64_t started_ms; /* when the last connection attempt began */
    int woken;          /* a call asked for that attempt (rd_conn_wake) */
    int is_sub;
    int hs[RD_MAX_HANDSHAKE];
    int hs_sent, hs_done;
};

enum rd_call_kind {
    RD_CALL_ACQUIRE,
    RD_CALL_RENEW,
    RD_CALL_RELEASE,
    RD_CALL_DROP,
    RD_CALL_REPAIR,
    RD_CALL_MARK,
    RD_CALL_CHECK
};

struct rd_wait;

/* One script call. Until sent it waits in rc's list for a connection; once sent, hiredis holds it
 * (privdata) until the reply or the context's end, and it is freed there. */
struct rd_call {
    struct rd_call *prev, *next;
    struct rd_client *rc;
    struct event *timer; /* op_timeout */
    long long wait_ms;   /* how long it may wait for a connection: op_timeout, or less */
    enum rd_call_kind kind;
    enum rd_script script;
    unsigned sent : 1, timed_out : 1, retried : 1, overflow : 1, sends : 3;
    redisAsyncContext *ac;  /* the context it was sent on */
    struct lock_req *req;   /* ACQUIRE, RELEASE, REPAIR; NULL once cancelled */
    struct lock_session *s; /* RENEW, CHECK; NULL once the session is gone */
    struct rd_wait *wl;     /* ACQUIRE */
    int64_t sent_ms;
    int argc, maxargs;
    const char **argv;
    size_t *argvlen;
    uint64_t *tokens;     /* RENEW, CHECK: the token of each key when sent */
    lock_mark_cb mark_cb; /* MARK */
    void *mark_arg;
    uint64_t holder_id; /* MARK with a holder check: its session id (ids start at 1) */
    char *text;
    size_t textlen, textcap;
    char owner[LOCK_OWNER_MAX];
};

/* The acquires of one name queued in this client, FIFO; only the head talks to Redis, so callers
 * of one client do not starve each other and a release wakes exactly one of them. */
struct rd_wait {
    struct lock_hnode node;
    struct rd_client *rc;
    struct lock_req *head, *tail;
    size_t count;
    struct event *timer; /* the head's next retry */
    unsigned inflight : 1, kick : 1, subscribed : 1, want_sub : 1;
    char name[];
};

struct rd_client {
    struct lock_client *lc;
    char host[256];
    int port;
    char user[256];
    char pass[256];
    int have_auth;
    int db;
    char where[300]; /* "redis HOST:PORT", for messages */
    char last_error[256];
    char down_why[LOCK_MSG_MAX]; /* rd_op_not_ready()'s answer */
    char sha[RD_NSCRIPTS][RD_SHA_LEN + 1];
    size_t plen;           /* strlen(prefix) */
    char lock_prefix[300]; /* <prefix>lock: */
    char chan_prefix[300]; /* <prefix>released: */
    struct rd_conn main, sub;
    struct event *flush; /* writes the round's commands on main before the loop sleeps */
    struct rd_call *calls_head, *calls_tail;
    size_t unsent_drops;
    struct lock_map waits; /* struct rd_wait by name */
    int closing;
    int64_t warned_ms; /* a failure was logged then, and no call has succeeded since (0: no) */
};

static void rd_reply_cb(redisAsyncContext *ac, void *r, void *privdata);
static void rd_wait_attempt(struct rd_wait *wl);
static void rd_drop_owner(struct rd_client *rc, const char *name, size_t len, const char *owner);

static struct rd_client *rd_of(const struct lock_client *c)
{
    return c->impl;
}

/* ---- connections ---- */

static void rd_conn_backoff(struct rd_conn *cn)
{
    int ms = cn->backoff_ms;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    if (!cn->woken) /* an attempt a call asked for does not lengthen the backoff */
        cn->backoff_ms = ms * 2 > RD_BACKOFF_MAX_MS ? RD_BACKOFF_MAX_MS : ms * 2;
    cn->woken = 0;
    evtimer_add(cn->timer, &tv);
}

/* The lock connection failed (why): tells lock_options.warn at once, then at most once per
 * RD_WARN_MS until a call succeeds again, so that a Redis that stays away (or keeps refusing:
 * a wrong password, a replica) is in the log without a line per reconnect. */
static void rd_warn_down(struct rd_conn *cn, const char *why)
{
    struct rd_client *rc = cn->rc;
    struct lock_client *c = rc->lc;
    char msg[LOCK_MSG_MAX];

    if (cn->is_sub || why == NULL || c->opt.warn == NULL ||
        !lock_warn_due(&rc->warned_ms, RD_WARN_MS))
        return;
    lock_fmt(msg, sizeof(msg), "%s: %s (acquisitions fail until it answers again)", rc->where, why);
    c->opt.warn(c->opt.warn_arg, msg);
}

/* ac of cn is gone or going (hiredis frees it, or the caller does right after): every call sent
 * on it fails through its NULL reply, new calls wait for the next connection. Idempotent. */
static void rd_conn_lost(struct rd_conn *cn, const redisAsyncContext *ac, const char *why)
{
    struct rd_client *rc = cn->rc;
    if (ac == NULL || cn->ac != ac)
        return;
    cn->ac = NULL;
    cn->state = RD_DOWN;
    if (why)
        lock_fmt(rc->last_error, sizeof(rc->last_error), "%s", why);
    rc->lc->stats.backend_errors++;
    rd_warn_down(cn, why);
    if (cn->is_sub) {
        size_t b = 0;
        struct lock_hnode *it = NULL, *n;
        while ((n = lock_map_next(&rc->waits, &b, &it)) != NULL)
            ((struct rd_wait *)(void *)n)->subscribed = 0;
    }
    evtimer_del(cn->timer);
    rd_conn_backoff(cn);
}

/* Drops cn's connection ourselves (handshake error or timeout, a call timed out). */
static void rd_conn_drop(struct rd_conn *cn, const char *why)
{
    redisAsyncContext *ac = cn->ac;
    if (ac == NULL)
        return;
    rd_conn_lost(cn, ac, why);
    redisAsyncFree(ac); /* deferred by hiredis when called from one of its callbacks */
}

static void rd_call_send(struct rd_call *k);
static void rd_call_arm(struct rd_call *k);
static void rd_conn_start(struct rd_conn *cn);
static void rd_check_fixed(struct lock_session *s);

static void rd_main_ready(struct rd_client *rc)
{
    struct rd_conn *cn = &rc->main;
    cn->state = RD_READY;
    cn->backoff_ms = RD_BACKOFF_MIN_MS;
    cn->woken = 0;
    evtimer_del(cn->timer);
    /* In order: the releases of grants whose replies were lost go before any new acquire. */
    for (struct rd_call *k = rc->calls_head, *next; k && cn->state == RD_READY; k = next) {
        next = k->next;
        if (!k->sent)
            rd_call_send(k);
    }
    /* Redis is back: the subscriber need not wait out its own (longer) backoff. */
    if (rc->sub.state == RD_DOWN) {
        evtimer_del(rc->sub.timer);
        rd_conn_start(&rc->sub);
    }
    lock_backend_up(rc->lc);
    for (struct lock_session *s = rc->lc->sessions; s && cn->state == RD_READY; s = s->next)
        rd_check_fixed(s);
}

static void rd_handshake_cb(redisAsyncContext *ac, void *r, void *privdata)
{
    struct rd_conn *cn = privdata;
    struct rd_client *rc = cn->rc;
    redisReply *reply = r;
    if (rc->closing)
        return;
    if (reply == NULL) {
        rd_conn_lost(cn, ac, "connection closed during the handshake");
        return;
    }
    if (ac != cn->ac || cn->hs_done >= cn->hs_sent)
        return;
    int step = cn->hs[cn->hs_done++];
    if (reply->type == REDIS_REPLY_ERROR) {
        char why[256];
        lock_fmt(why, sizeof(why), "%s failed: %s",
                 step == RD_HS_AUTH     ? "AUTH"
                 : step == RD_HS_SELECT ? "SELECT"
                                        : "SCRIPT LOAD",
                 reply->str);
        rd_conn_drop(cn, why);
        return;
    }
    if (step >= RD_HS_LOAD && reply->type == REDIS_REPLY_STRING && reply->len == RD_SHA_LEN)
        memcpy(rc->sha[step - RD_HS_LOAD], reply->str, RD_SHA_LEN + 1);
    if (cn->hs_done == cn->hs_sent && !cn->is_sub && cn->state == RD_CONNECTING)
        rd_main_ready(rc);
}

static void rd_sub_cb(redisAsyncContext *ac, void *r, void *privdata);

static void rd_subscribe(struct rd_wait *wl)
{
    struct rd_client *rc = wl->rc;
    struct rd_conn *sc = &rc->sub;
    char ch[300 + LOCK_MAX_NAME + 4];
    if (wl->subscribed || sc->state != RD_READY)
        return;
    int n = snprintf(ch, sizeof(ch), "%s{%.*s}", rc->chan_prefix, (int)wl->node.len, wl->name);
    if (n < 0 || (size_t)n >= sizeof(ch))
        return;
    if (redisAsyncCommand(sc->ac, rd_sub_cb, rc, "SUBSCRIBE %b", ch, (size_t)n) == REDIS_OK)
        wl->subscribed = 1;
}

static void rd_unsubscribe(struct rd_wait *wl)
{
    struct rd_client *rc = wl->rc;
    struct rd_conn *sc = &rc->sub;
    char ch[300 + LOCK_MAX_NAME + 4];
    if (!wl->subscribed || sc->state != RD_READY)
        return;
    wl->subscribed = 0;
    int n = snprintf(ch, sizeof(ch), "%s{%.*s}", rc->chan_prefix, (int)wl->node.len, wl->name);
    if (n > 0 && (size_t)n < sizeof(ch))
        (void)redisAsyncCommand(sc->ac, NULL, NULL, "UNSUBSCRIBE %b", ch, (size_t)n);
}

static void rd_on_connect(const redisAsyncContext *ac, int status)
{
    struct rd_conn *cn = ac->data;
    if (cn == NULL || cn->rc->closing || status == REDIS_OK)
        return;
    char why[256];
    lock_fmt(why, sizeof(why), "connect failed: %s", ac->errstr ? ac->errstr : "unknown error");
    rd_conn_lost(cn, ac, why); /* hiredis frees ac after this returns */
}

static void rd_on_disconnect(const redisAsyncContext *ac, int status)
{
    struct rd_conn *cn = ac->data;
    if (cn == NULL || cn->rc->closing)
        return;
    char why[256];
    lock_fmt(why, sizeof(why), "connection closed%s%s", ac->errstr ? ": " : "",
             ac->errstr ? ac->errstr : "");
    rd_conn_lost(cn, ac, why);
}

/* An attempt of cn failed before it had a connection: DOWN, and the next one after the backoff. */
static void rd_conn_failed(struct rd_conn *cn, const char *why, int count)
{
    struct rd_client *rc = cn->rc;
    cn->state = RD_DOWN;
    lock_fmt(rc->last_error, sizeof(rc->last_error), "%s", why);
    if (count)
        rc->lc->stats.backend_errors++;
    rd_warn_down(cn, why);
    evtimer_del(cn->timer);
    rd_conn_backoff(cn);
}

/* Opens cn's connection to addr (numeric) and queues its handshake: AUTH, SELECT and SCRIPT LOAD
 * for the lock connection (ready when all succeeded), AUTH and the standing subscription for the
 * subscriber (usable at once: what it buffers is sent on connect). */
static void rd_conn_open(struct rd_conn *cn, const char *addr)
{
    struct rd_client *rc = cn->rc;
    redisAsyncContext *ac = redisAsyncConnect(addr, rc->port);
    char why[256];
    if (ac == NULL || ac->err) {
        lock_fmt(why, sizeof(why), "connect failed: %s",
                 ac && ac->errstr ? ac->errstr : "out of memory");
        if (ac)
            redisAsyncFree(ac);
        rd_conn_failed(cn, why, 0);
        return;
    }
    if (redisLibeventAttach(ac, rc->lc->base) != REDIS_OK) {
        redisAsyncFree(ac);
        rd_conn_failed(cn, "connect failed: out of memory", 0);
        return;
    }
    ac->data = cn;
    redisAsyncSetConnectCallback(ac, rd_on_connect);
    redisAsyncSetDisconnectCallback(ac, rd_on_disconnect);
    (void)redisEnableKeepAlive(&ac->c);
    cn->ac = ac;
    cn->hs_sent = cn->hs_done = 0;
    if (rc->have_auth) {
        int rv = rc->user[0]
                     ? redisAsyncCommand(ac, rd_handshake_cb, cn, "AUTH %s %s", rc->user, rc->pass)
                     : redisAsyncCommand(ac, rd_handshake_cb, cn, "AUTH %s", rc->pass);
        if (rv == REDIS_OK)
            cn->hs[cn->hs_sent++] = RD_HS_AUTH;
    }
    if (cn->is_sub) {
        char ch[400];
        lock_fmt(ch, sizeof(ch), "%sclient:%s", rc->chan_prefix, rc->lc->uid);
        /* A standing subscription keeps the count above zero, so that hiredis never leaves
         * subscribed mode while per-lock SUBSCRIBE / UNSUBSCRIBE are in flight. */
        (void)redisAsyncCommand(ac, rd_sub_cb, rc, "SUBSCRIBE %s", ch);
        cn->state = RD_READY; /* its backoff is reset by the first subscription confirmed */
        evtimer_del(cn->timer);
        size_t b = 0;
        struct lock_hnode *it = NULL, *n;
        while ((n = lock_map_next(&rc->waits, &b, &it)) != NULL) {
            struct rd_wait *wl = (struct rd_wait *)(void *)n;
            if (wl->want_sub)
                rd_subscribe(wl);
        }
        return;
    }
    if (rc->db != 0 && redisAsyncCommand(ac, rd_handshake_cb, cn, "SELECT %d", rc->db) == REDIS_OK)
        cn->hs[cn->hs_sent++] = RD_HS_SELECT;
    for (int i = 0; i < RD_NSCRIPTS; i++)
        if (redisAsyncCommand(ac, rd_handshake_cb, cn, "SCRIPT LOAD %s", rd_scripts[i]) == REDIS_OK)
            cn->hs[cn->hs_sent++] = RD_HS_LOAD + i;
}

static void rd_conn_resolved(const struct addrinfo *res, const char *why, void *arg)
{
    struct rd_conn *cn = arg;
    char addr[64];

    cn->resolving = NULL;
    if (resolve_pick_host(res, addr, sizeof(addr)) < 0) {
        rd_conn_failed(cn, why, 1);
        return;
    }
    rd_conn_open(cn, addr);
}

/* Starts a connection attempt of cn: the host is looked up on a worker thread (resolve.h), so a
 * name service that stalls never stalls the loop, then connected to. Calls wait for it as for any
 * connect; op_timeout bounds the lookup, connect and handshake together. */
static void rd_conn_start(struct rd_conn *cn)
{
    struct rd_client *rc = cn->rc;
    long long to = rc->lc->opt.op_timeout_ms;
    struct timeval tv = {(time_t)(to / 1000), (suseconds_t)((to % 1000) * 1000)};
    cn->started_ms = lock_now_ms();
    cn->state = RD_CONNECTING;
    evtimer_add(cn->timer, &tv);
    /* Looked up again at each attempt: the name may point elsewhere after a failover. */
    cn->resolving = resolve_start(rc->lc->base, rc->host, rc->port, rd_conn_resolved, cn);
    if (cn->resolving == NULL)
        rd_conn_failed(cn, "cannot resolve: out of memory or threads", 1);
}

/* A call needs the connection while it waits out a backoff: try again now, unless an attempt
 * began less than RD_BACKOFF_MIN_MS ago (calls against a dead Redis retry no faster than that). */
static void rd_conn_wake(struct rd_conn *cn)
{
    if (cn->state != RD_DOWN || lock_now_ms() - cn->started_ms < RD_BACKOFF_MIN_MS)
        return;
    evtimer_del(cn->timer);
    cn->woken = 1;
    rd_conn_start(cn);
}

static void rd_conn_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct rd_conn *cn = arg;
    char why[128];
    if (cn->state == RD_DOWN) {
        rd_conn_start(cn);
    } else if (cn->resolving) {
        resolve_cancel(cn->resolving);
        cn->resolving = NULL;
        lock_fmt(why, sizeof(why), "resolving '%.60s' timed out after %lld ms", cn->rc->host,
                 cn->rc->lc->opt.op_timeout_ms);
        rd_conn_failed(cn, why, 1);
    } else if (cn->state == RD_CONNECTING) {
        lock_fmt(why, sizeof(why), "no handshake reply within %lld ms",
                 cn->rc->lc->opt.op_timeout_ms);
        rd_conn_drop(cn, why);
    }
}

/* ---- calls ---- */

static struct rd_call *rd_call_new(struct rd_client *rc, enum rd_call_kind kind,
                                   enum rd_script script, int maxargs, size_t ntokens,
                                   size_t textcap)
{
    size_t sz = sizeof(struct rd_call) + (size_t)maxargs * (sizeof(char *) + sizeof(size_t)) +
                ntokens * sizeof(uint64_t) + textcap;
    struct rd_call *k = calloc(1, sz);
    if (k == NULL)
        return NULL;
    char *p = (char *)(k + 1);
    k->argv = (const char **)(void *)p;
    p += (size_t)maxargs * sizeof(char *);
    k->argvlen = (size_t *)(void *)p;
    p += (size_t)maxargs * sizeof(size_t);
    k->tokens = ntokens ? (uint64_t *)(void *)p : NULL;
    p += ntokens * sizeof(uint64_t);
    k->text = p;
    k->textcap = textcap;
    k->maxargs = maxargs;
    k->rc = rc;
    k->kind = kind;
    k->script = script;
    return k;
}

/* Appends one argument made of up to three pieces. Sets overflow instead of writing past the
 * declared capacity. */
static void rd_arg3(struct rd_call *k, const char *a, size_t al, const char *b, size_t bl,
                    const char *c, size_t cl)
{
    size_t n = al + bl + cl;
    if (k->argc >= k->maxargs || k->textlen + n + 1 > k->textcap) {
        k->overflow = 1;
        return;
    }
    char *p = k->text + k->textlen;
    memcpy(p, a, al);
    if (bl)
        memcpy(p + al, b, bl);
    if (cl)
        memcpy(p + al + bl, c, cl);
    p[n] = '\0';
    k->argv[k->argc] = p;
    k->argvlen[k->argc] = n;
    k->argc++;
    k->textlen += n + 1;
}

static void rd_arg(struct rd_call *k, const char *s)
{
    rd_arg3(k, s, strlen(s), NULL, 0, NULL, 0);
}

static void rd_arg_ll(struct rd_call *k, long long v)
{
    char b[32];
    lock_fmt(b, sizeof(b), "%lld", v);
    rd_arg(k, b);
}

/* "<prefix><kind>{<name>}" */
static void rd_arg_key(struct rd_call *k, const char *kind, const char *name, size_t len)
{
    char head[300];
    lock_fmt(head, sizeof(head), "%s%s{", k->rc->lc->opt.prefix, kind);
    rd_arg3(k, head, strlen(head), name, len, "}", 1);
}

/* Bytes an argument list of nkeys lock keys with these name bytes, and extra, needs. */
static size_t rd_text_cap(const struct rd_client *rc, size_t nkeys, size_t namebytes, size_t extra)
{
    return 64 + nkeys * (rc->plen + 16) + namebytes + extra;
}

/* The lock name inside the i-th key (argv[3 + i] = "<prefix>lock:{name}"). */
static const char *rd_key_name(const struct rd_call *k, int i, size_t *len)
{
    size_t skip = k->rc->plen + 6;
    *len = k->argvlen[3 + i] - skip - 1;
    return k->argv[3 + i] + skip;
}

static void rd_call_link(struct rd_client *rc, struct rd_call *k)
{
    k->next = NULL;
    k->prev = rc->calls_tail;
    if (rc->calls_tail)
        rc->calls_tail->next = k;
    else
        rc->calls_head = k;
    rc->calls_tail = k;
}

static void rd_call_free(struct rd_call *k)
{
    struct rd_client *rc = k->rc;
    if (k->prev)
        k->prev->next = k->next;
    else
        rc->calls_head = k->next;
    if (k->next)
        k->next->prev = k->prev;
    else
        rc->calls_tail = k->prev;
    if (k->kind == RD_CALL_DROP && !k->sent)
        rc->unsent_drops--;
    if (k->timer)
        event_free(k->timer);
    free(k);
}

static void rd_call_timeout_cb(evutil_socket_t fd, short what, void *arg);

static void rd_call_arm_ms(struct rd_call *k, long long to)
{
    struct timeval tv = {(time_t)(to / 1000), (suseconds_t)((to % 1000) * 1000)};
    k->wait_ms = to;
    if (k->timer == NULL)
        k->timer = evtimer_new(k->rc->lc->base, rd_call_timeout_cb, k);
    if (k->timer)
        evtimer_add(k->timer, &tv);
}

static void rd_call_arm(struct rd_call *k)
{
    rd_call_arm_ms(k, k->rc->lc->opt.op_timeout_ms);
}

/* hiredis writes a command only once the loop reports the socket writable, a wait for an event
 * that is already true. The commands sent in one round of the loop are written together at its
 * end instead; hiredis's write event, armed and disarmed in that round, costs no system call (the
 * base of fencegate uses a changelist). A write error ends the connection as hiredis's own write
 * event would. */
static void rd_flush_cb(evutil_socket_t fd, short what, void *arg)
{
    struct rd_client *rc = arg;
    if (rc->main.state == RD_READY && rc->main.ac)
        redisAsyncHandleWrite(rc->main.ac);
}

static void rd_call_send(struct rd_call *k)
{
    struct rd_client *rc = k->rc;
    struct rd_conn *m = &rc->main;
    if (m->state != RD_READY || k->sent)
        return;
    if (k->script == RD_RELEASE) {
        /* Releases go with the script's body, never answered NOSCRIPT: one sent again after
         * NOSCRIPT would run behind the calls pipelined after it, and if one of them granted
         * the same lock to the same owner anew (the acquire script cached again meanwhile, by
         * another call's retry), the release would delete that grant's key. */
        k->argv[0] = "EVAL";
        k->argvlen[0] = 4;
        k->argv[1] = rd_scripts[RD_RELEASE];
        k->argvlen[1] = strlen(rd_scripts[RD_RELEASE]);
    } else {
        k->argv[1] = rc->sha[k->script];
        k->argvlen[1] = RD_SHA_LEN;
    }
    redisAsyncContext *ac = m->ac;
    if (redisAsyncCommandArgv(ac, rd_reply_cb, k, k->argc, k->argv, k->argvlen) != REDIS_OK) {
        if (ac->c.flags & (REDIS_DISCONNECTING | REDIS_FREEING))
            rd_conn_lost(m, ac, "the connection is closing"); /* hiredis frees it */
        else
            rd_conn_drop(m, "the connection refused a command (out of memory?)");
        return;
    }
    event_active(rc->flush, EV_TIMEOUT, 0);
    k->sent = 1;
    k->sends++;
    k->ac = ac;
    k->sent_ms = lock_now_ms();
    if (k->kind == RD_CALL_DROP) {
        rc->unsent_drops--;
        rd_call_arm(k); /* queued releases wait for a connection however long it takes */
    } else if (k->wait_ms < rc->lc->opt.op_timeout_ms) {
        rd_call_arm(k); /* it waited less for the connection; its reply gets the full time */
    }
}

/* Queues k and sends it if the connection is ready; every call but a fire-and-forget release
 * has op_timeout from now, including the time spent waiting for a connection. */
static void rd_call_submit(struct rd_call *k)
{
    struct rd_client *rc = k->rc;
    rd_call_link(rc, k);
    if (k->kind == RD_CALL_DROP)
        rc->unsent_drops++;
    else
        rd_call_arm(k);
    rd_call_send(k);
}

/* Starts an EVALSHA argument list: EVALSHA, the sha (set when sent), numkeys. */
static struct rd_call *rd_call_begin(struct rd_client *rc, enum rd_call_kind kind,
                                     enum rd_script script, int nkeys, int nargs, size_t ntokens,
                                     size_t textcap)
{
    struct rd_call *k = rd_call_new(rc, kind, script, 3 + nkeys + nargs, ntokens, textcap);
    if (k == NULL)
        return NULL;
    rd_arg(k, "EVALSHA");
    rd_arg(k, "");
    rd_arg_ll(k, nkeys);
    return k;
}

/* ---- waiting for a lock ---- */

static void rd_wait_timer_cb(evutil_socket_t fd, short what, void *arg);

static struct rd_wait *rd_wait_get(struct rd_client *rc, const char *name, size_t len)
{
    struct lock_hnode *n = lock_map_find(&rc->waits, name, len);
    if (n)
        return (struct rd_wait *)(void *)n;
    struct rd_wait *wl = calloc(1, sizeof(*wl) + len + 1);
    if (wl == NULL)
        return NULL;
    wl->rc = rc;
    memcpy(wl->name, name, len);
    wl->timer = evtimer_new(rc->lc->base, rd_wait_timer_cb, wl);
    lock_hnode_init(&wl->node, wl->name, len);
    if (wl->timer == NULL || lock_map_insert(&rc->waits, &wl->node) != 0) {
        if (wl->timer)
            event_free(wl->timer);
        free(wl);
        return NULL;
    }
    return wl;
}

/* Frees wl once nobody waits and nothing is in flight for it. */
static void rd_wait_maybe_free(struct rd_wait *wl)
{
    if (wl->head || wl->inflight)
        return;
    rd_unsubscribe(wl);
    lock_map_remove(&wl->rc->waits, &wl->node);
    event_free(wl->timer);
    free(wl);
}

static void rd_wait_append(struct rd_wait *wl, struct lock_req *r)
{
    r->b_next = NULL;
    r->b_wait = wl;
    if (wl->tail)
        wl->tail->b_next = r;
    else
        wl->head = r;
    wl->tail = r;
    wl->count++;
}

static void rd_wait_remove(struct rd_wait *wl, struct lock_req *r)
{
    struct lock_req *prev = NULL;
    for (struct lock_req *q = wl->head; q; prev = q, q = q->b_next) {
        if (q != r)
            continue;
        if (prev)
            prev->b_next = r->b_next;
        else
            wl->head = r->b_next;
        if (wl->tail == r)
            wl->tail = prev;
        wl->count--;
        break;
    }
    r->b_next = NULL;
    r->b_wait = NULL;
}

static void rd_busy(struct lock_req *r, int64_t now, long long pttl)
{
    char msg[LOCK_MSG_MAX];
    if (pttl > 0)
        lock_fmt(msg, sizeof(msg),
                 "lock %s is held by another owner (waited %lld ms; its lease ends in %lld ms "
                 "unless renewed)",
                 r->name, (long long)(now - r->start_ms), pttl);
    else
        lock_fmt(msg, sizeof(msg), "lock %s is held by another owner (waited %lld ms)", r->name,
                 (long long)(now - r->start_ms));
    lock_req_finish(r, LOCK_BUSY, 0, msg);
}

/* Ends, as BUSY, every queued request behind the head whose wait ran out. */
static void rd_wait_sweep(struct rd_wait *wl, int64_t now, long long pttl)
{
    struct lock_req *q = wl->head ? wl->head->b_next : NULL;
    while (q) {
        struct lock_req *next = q->b_next;
        if (q->deadline_ms <= now) {
            rd_wait_remove(wl, q);
            rd_busy(q, now, pttl);
        }
        q = next;
    }
}

/* The head was told the lock is held: retry after min(holder's pttl, 50..200 ms random), or
 * earlier at a waiter's deadline, or at once when a release is announced. */
static void rd_wait_sleep(struct rd_wait *wl, long long pttl)
{
    int64_t now = lock_now_ms();
    int64_t d = RD_RETRY_MIN_MS +
                (int64_t)(lock_random(wl->rc->lc) % (RD_RETRY_MAX_MS - RD_RETRY_MIN_MS + 1));
    if (pttl >= 0 && pttl < d)
        d = pttl;
    for (struct lock_req *q = wl->head; q; q = q->b_next)
        if (q->deadline_ms - now < d)
            d = q->deadline_ms - now;
    if (d < 1)
        d = 1;
    struct timeval tv = {(time_t)(d / 1000), (suseconds_t)((d % 1000) * 1000)};
    evtimer_add(wl->timer, &tv);
}

static struct rd_call *rd_acquire_call(struct rd_client *rc, struct lock_req *r)
{
    const char *mp = rc->lc->opt.mark_prefix;
    int nkeys = mp[0] ? 3 : 2;
    struct rd_call *k =
        rd_call_begin(rc, RD_CALL_ACQUIRE, RD_ACQUIRE, nkeys, 2, 0,
                      rd_text_cap(rc, 3, 3 * r->len, LOCK_OWNER_MAX + 32 + strlen(mp)));
    if (k == NULL)
        return NULL;
    lock_owner(r->s, k->owner, sizeof(k->owner));
    rd_arg_key(k, "lock:", r->name, r->len);
    rd_arg_key(k, "token:", r->name, r->len);
    if (nkeys == 3) {
        char head[sizeof(rc->lc->opt.mark_prefix) + 1];
        lock_fmt(head, sizeof(head), "%s{", mp);
        rd_arg3(k, head, strlen(head), r->name, r->len, "}", 1);
    }
    rd_arg(k, k->owner);
    rd_arg_ll(k, r->ttl_ms);
    if (k->overflow) {
        free(k);
        return NULL;
    }
    return k;
}

/* Sends the head's attempt, unless one is in flight. Requests that cannot even be sent end with
 * LOCK_UNAVAILABLE and the next one tries. Frees wl when it empties. */
static void rd_wait_attempt(struct rd_wait *wl)
{
    char msg[LOCK_MSG_MAX];
    if (wl->inflight)
        return;
    evtimer_del(wl->timer);
    while (wl->head) {
        struct lock_req *r = wl->head;
        struct rd_call *k = rd_acquire_call(wl->rc, r);
        if (k == NULL) {
            rd_wait_remove(wl, r);
            lock_fmt(msg, sizeof(msg), "out of memory acquiring lock %s", r->name);
            lock_req_finish(r, LOCK_UNAVAILABLE, 0, msg);
            continue;
        }
        k->req = r;
        k->wl = wl;
        r->b_call = k;
        wl->inflight = 1;
        wl->kick = 0;
        rd_call_submit(k);
        if (!k->sent) {
            /* Not connected: try to reconnect now (when between attempts), and wait for the
             * connection no longer than the caller waits for the lock (but as long as one
             * attempt may take on a live network), so a try-once acquire against a dead or
             * unreachable Redis answers soon. */
            long long left = r->deadline_ms - lock_now_ms();
            rd_conn_wake(&wl->rc->main);
            if (left < RD_BACKOFF_MIN_MS)
                left = RD_BACKOFF_MIN_MS;
            if (left < k->wait_ms)
                rd_call_arm_ms(k, left);
        }
        return;
    }
    rd_wait_maybe_free(wl);
}

static void rd_wait_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct rd_wait *wl = arg;
    rd_wait_sweep(wl, lock_now_ms(), -1);
    rd_wait_attempt(wl);
}

/* A release of wl's lock was announced: the head retries now (or right after its attempt in
 * flight, if that one finds the lock still held). */
static void rd_wait_kick(struct rd_wait *wl)
{
    if (wl->head == NULL)
        return;
    if (wl->inflight) {
        wl->kick = 1;
        return;
    }
    rd_wait_attempt(wl);
}

static void rd_sub_cb(redisAsyncContext *ac, void *r, void *privdata)
{
    struct rd_client *rc = privdata;
    redisReply *reply = r;
    if (rc->closing)
        return;
    if (reply == NULL) {
        rd_conn_lost(&rc->sub, ac, "subscriber connection closed");
        return;
    }
    if (ac != rc->sub.ac || reply->type != REDIS_REPLY_ARRAY || reply->elements < 3)
        return;
    redisReply *kind = reply->element[0], *ch = reply->element[1];
    /* Only a subscription Redis confirmed proves the connection works: one that AUTH or the
     * SUBSCRIBE itself fails (an ACL user without channels: Redis answers an error and hiredis
     * closes the connection) backs off to RD_BACKOFF_MAX_MS instead of reconnecting ten times a
     * second for as long as the client lives. */
    if (kind->type == REDIS_REPLY_STRING && strcmp(kind->str, "subscribe") == 0)
        rc->sub.backoff_ms = RD_BACKOFF_MIN_MS;
    if (kind->type != REDIS_REPLY_STRING || strcmp(kind->str, "message") != 0 ||
        ch->type != REDIS_REPLY_STRING)
        return;
    size_t pl = strlen(rc->chan_prefix);
    if (ch->len < pl + 2 || memcmp(ch->str, rc->chan_prefix, pl) != 0 || ch->str[pl] != '{' ||
        ch->str[ch->len - 1] != '}')
        return;
    struct lock_hnode *n = lock_map_find(&rc->waits, ch->str + pl + 1, ch->len - pl - 2);
    if (n)
        rd_wait_kick((struct rd_wait *)(void *)n);
}

/* The reply (or its absence: reply NULL, unknown = the script may have run) of an acquire. */
static void rd_acquire_outcome(struct rd_call *k, const redisReply *reply, const char *errmsg,
                               int unknown)
{
    struct rd_client *rc = k->rc;
    struct rd_wait *wl = k->wl;
    struct lock_req *r = k->req;
    char msg[LOCK_MSG_MAX];
    int64_t now = lock_now_ms();
    wl->inflight = 0;
    if (r)
        r->b_call = NULL;
    if (reply && reply->type == REDIS_REPLY_ARRAY &&
        (reply->elements == 2 || reply->elements == 3) &&
        reply->element[0]->type == REDIS_REPLY_INTEGER) {
        const redisReply *e = reply->element[1];
        long long v = e->type == REDIS_REPLY_INTEGER ? e->integer : 0;
        uint64_t t = 0;
        if (reply->element[0]->integer == 1 &&
            (e->type != REDIS_REPLY_STRING || lock_token_parse(e->str, e->len, &t) < 0 || t == 0))
            unknown = 1; /* granted, with a token that cannot be read: give it back */
        else if (reply->element[0]->integer == 1) {
            if (reply->elements == 3 && reply->element[2]->type == REDIS_REPLY_INTEGER &&
                reply->element[2]->integer == 1) { /* the counter was raised past the mark */
                size_t len;
                const char *name = rd_key_name(k, 0, &len);
                lock_note_repair(rc->lc, name, len, 0, t);
            }
            if (r && now - k->sent_ms >= r->ttl_ms && now < r->deadline_ms) {
                /* Redis held the call back (CLIENT PAUSE, a long script) past the lease, which
                 * counts from the send: the grant is of no use. The wait has time left, so ask
                 * again: the key is ours, and the script grants it anew with a new token. */
                rd_wait_attempt(wl);
                return;
            }
            if (r) {
                rd_wait_remove(wl, r);
                lock_granted(r, t, k->sent_ms);
            } else { /* the session is gone: give the lock back */
                size_t len;
                const char *name = rd_key_name(k, 0, &len);
                rd_drop_owner(rc, name, len, k->owner);
            }
            rd_wait_attempt(wl);
            return;
        }
        if (reply->element[0]->integer == 0 && e->type == REDIS_REPLY_INTEGER) {
            if (r && now >= r->deadline_ms) {
                rd_wait_remove(wl, r);
                rd_busy(r, now, v);
            }
            rd_wait_sweep(wl, now, v);
            if (wl->head == NULL)
                rd_wait_maybe_free(wl);
            else if (wl->kick || r == NULL || wl->head != r)
                rd_wait_attempt(wl);
            else
                rd_wait_sleep(wl, v);
            return;
        }
    }
    if (errmsg == NULL) {
        lock_fmt(msg, sizeof(msg), "unexpected reply from %s to the acquire script", rc->where);
        errmsg = msg;
        rc->lc->stats.backend_errors++;
    }
    if (unknown) { /* the script may have run: release what it may have granted */
        size_t len;
        const char *name = rd_key_name(k, 0, &len);
        rd_drop_owner(rc, name, len, k->owner);
    }
    if (r && reply == NULL && k->sent && now < r->deadline_ms) {
        /* The attempt went down with its connection (reset after op_timeout, killed, a
         * failover) while its WAIT has time left: it stays at the head and tries again, on the
         * next connection, behind the release just queued of what it may have been granted.
         * An attempt that never went out (Redis unreachable) fails at once, as before. */
        rd_wait_attempt(wl);
        return;
    }
    if (r) {
        rd_wait_remove(wl, r);
        lock_req_finish(r, LOCK_UNAVAILABLE, 0, errmsg);
    }
    rd_wait_attempt(wl);
}

/* ---- call results ---- */

/* The reply of a mark script: {1, token} raised, {0, mark} refused, {2, "0"} the holder does not
 * hold the lock. A mark that is not a decimal number in range proves nothing, so it fails closed.
 * argv: EVALSHA sha numkeys mark [lock] token [owner]. */
static void rd_mark_outcome(struct rd_call *k, const redisReply *reply)
{
    struct rd_client *rc = k->rc;
    char msg[LOCK_MSG_MAX];
    const char *token = k->argv[k->holder_id ? 5 : 4];
    uint64_t v;
    if (k->holder_id && reply->type == REDIS_REPLY_ARRAY && reply->elements == 2 &&
        reply->element[0]->type == REDIS_REPLY_INTEGER && reply->element[0]->integer == 2) {
        size_t nlen;
        const char *name = rd_key_name(k, 1, &nlen);
        lock_fmt(msg, sizeof(msg),
                 "lock %.*s (token %s) is not held by this session in %s: another holder has "
                 "it, or its lease ran out there (a failover that lost the grant?)",
                 (int)nlen, name, token, rc->where);
        lock_holder_lost(rc->lc, k->holder_id);
        lock_mark_done(rc->lc, k->mark_cb, k->mark_arg, LOCK_LOST, 0, msg);
        return;
    }
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 2 &&
        reply->element[0]->type == REDIS_REPLY_INTEGER &&
        reply->element[1]->type == REDIS_REPLY_STRING &&
        lock_token_parse(reply->element[1]->str, reply->element[1]->len, &v) == 0) {
        if (reply->element[0]->integer == 1) {
            lock_mark_done(rc->lc, k->mark_cb, k->mark_arg, LOCK_OK, v, NULL);
        } else {
            lock_fmt(msg, sizeof(msg), "the mark in %s is %" PRIu64 ", above token %s", rc->where,
                     v, token);
            lock_mark_done(rc->lc, k->mark_cb, k->mark_arg, LOCK_STALE, v, msg);
        }
        return;
    }
    rc->lc->stats.backend_errors++;
    lock_fmt(msg, sizeof(msg),
             "unexpected reply from %s to the mark script (does %.*s hold a number?)", rc->where,
             (int)k->argvlen[3], k->argv[3]);
    lock_mark_done(rc->lc, k->mark_cb, k->mark_arg, LOCK_UNAVAILABLE, 0, msg);
}

/* A release k that failed may not have run (never sent, lost with its connection, refused): the
 * lock has already left its session, so nothing would free the key before its lease ran out and
 * every other owner would wait that long. It goes out again as an owner-checked release, fire and
 * forget, behind what is queued now. Not while the session holds or is acquiring that name again:
 * the key under its owner id is then the new grant's (the acquire script grants a key we own
 * again). A session that is gone acquires nothing more under its owner id. */
static void rd_release_again(struct rd_call *k)
{
    size_t len;
    const char *name = rd_key_name(k, 0, &len);
    const struct lock_session *s = k->req ? k->req->s : NULL;
    if (s && lock_map_find(&s->locks, name, len) != NULL)
        return;
    for (const struct lock_req *q = s ? s->reqs : NULL; q; q = q->s_next)
        if (q->kind == LOCK_REQ_ACQUIRE && q->len == len && memcmp(q->name, name, len) == 0)
            return;
    rd_drop_owner(k->rc, name, len, k->owner);
}

/* Ends k without a usable reply. unknown: it was sent and may have run. */
static void rd_call_fail(struct rd_call *k, const char *msg, int unknown)
{
    switch (k->kind) {
    case RD_CALL_ACQUIRE:
        rd_acquire_outcome(k, NULL, msg, unknown);
        break;
    case RD_CALL_RENEW:
        if (k->s)
            lock_renew_done(k->s);
        break;
    case RD_CALL_RELEASE:
        rd_release_again(k);
        if (k->req)
            lock_req_finish(k->req, LOCK_UNAVAILABLE, 0, msg);
        break;
    case RD_CALL_REPAIR:
        if (k->req)
            lock_repaired(k->req, LOCK_UNAVAILABLE, 0, msg);
        break;
    case RD_CALL_MARK:
        lock_mark_done(k->rc->lc, k->mark_cb, k->mark_arg, LOCK_UNAVAILABLE, 0, msg);
        break;
    case RD_CALL_DROP:
    case RD_CALL_CHECK:
        break;
    }
}

static void rd_call_done(struct rd_call *k, const redisReply *reply)
{
    char msg[LOCK_MSG_MAX];
    struct rd_client *rc = k->rc;
    switch (k->kind) {
    case RD_CALL_ACQUIRE:
        rd_acquire_outcome(k, reply, NULL, 0);
        break;
    case RD_CALL_RENEW:
        if (k->s == NULL)
            break;
        if (reply->type == REDIS_REPLY_ARRAY && reply->elements == (size_t)(k->argc - 4) / 2) {
            for (size_t i = 0; i < reply->elements; i++) {
                size_t len;
                const char *name = rd_key_name(k, (int)i, &len);
                int held = reply->element[i]->type == REDIS_REPLY_INTEGER &&
                           reply->element[i]->integer == 1;
                lock_renew_result(k->s, name, len, k->tokens[i], k->sent_ms, held);
            }
        } else {
            rc->lc->stats.backend_errors++;
        }
        lock_renew_done(k->s);
        break;
    case RD_CALL_RELEASE:
        if (k->req == NULL)
            break;
        if (reply->type == REDIS_REPLY_INTEGER && reply->integer == 1) {
            lock_req_finish(k->req, LOCK_OK, 0, NULL);
        } else if (reply->type == REDIS_REPLY_INTEGER) {
            lock_fmt(msg, sizeof(msg),
                     "lock %s was no longer held in %s (its lease ran out or another owner "
                     "took it)",
                     k->req->name, rc->where);
            lock_req_finish(k->req, LOCK_NOT_HELD, 0, msg);
        } else {
            lock_fmt(msg, sizeof(msg), "unexpected reply from %s to the release of lock %s",
                     rc->where, k->req->name);
            lock_req_finish(k->req, LOCK_UNAVAILABLE, 0, msg);
        }
        break;
    case RD_CALL_REPAIR: {
        uint64_t t = 0;
        if (k->req == NULL)
            break;
        if (reply->type == REDIS_REPLY_STRING &&
            lock_token_parse(reply->str, reply->len, &t) == 0 && t > 0) {
            lock_repaired(k->req, LOCK_OK, t, NULL);
        } else {
            lock_fmt(msg, sizeof(msg),
                     "lock %s is no longer held by this session: its lease ran out while its "
                     "token was being repaired",
                     k->req->name);
            lock_repaired(k->req, LOCK_UNAVAILABLE, 0, msg);
        }
        break;
    }
    case RD_CALL_MARK:
        rd_mark_outcome(k, reply);
        break;
    case RD_CALL_CHECK:
        /* Only a key that is gone says something; one still ours leaves the lease as it was. */
        if (k->s == NULL || reply->type != REDIS_REPLY_ARRAY ||
            reply->elements != (size_t)(k->argc - 4))
            break;
        for (size_t i = 0; i < reply->elements; i++) {
            size_t len;
            const char *name = rd_key_name(k, (int)i, &len);
            if (reply->element[i]->type == REDIS_REPLY_INTEGER && reply->element[i]->integer == 0)
                lock_renew_result(k->s, name, len, k->tokens[i], k->sent_ms, 0);
        }
        break;
    case RD_CALL_DROP:
        break;
    }
}

/* A fire-and-forget release k lost its connection before it was answered: it may not have run,
 * and its keys would keep every other owner waiting until their leases ran out (such releases
 * free a closed session's keys, a grant whose reply was lost, a lock given up). It keeps its
 * place in the queue, so it still goes before any later acquire under its owner id, and is
 * sent again on the next connection: at most RD_DROP_SENDS times in all, so a Redis that
 * answers handshakes but never these (writes paused for good) does not keep it alive forever.
 * Returns 1 when k was kept. */
static int rd_drop_again(struct rd_call *k)
{
    if (k->sends >= RD_DROP_SENDS || k->rc->unsent_drops >= RD_MAX_DROPS)
        return 0;
    k->sent = 0;
    k->timed_out = 0;
    k->retried = 0;
    k->ac = NULL;
    k->rc->unsent_drops++;
    rd_call_send(k);
    return 1;
}

/* Whether reply is the error of a replica refusing a write (-READONLY) or, with
 * replica-serve-stale-data off, anything (-MASTERDOWN): the script did not run. */
static int rd_is_replica_error(const redisReply *reply)
{
    return reply->type == REDIS_REPLY_ERROR && reply->str &&
           (strncmp(reply->str, "READONLY ", 9) == 0 ||
            strncmp(reply->str, "MASTERDOWN ", 11) == 0);
}

static void rd_reply_cb(redisAsyncContext *ac, void *r, void *privdata)
{
    struct rd_call *k = privdata;
    struct rd_client *rc = k->rc;
    redisReply *reply = r;
    char msg[LOCK_MSG_MAX];
    if (rc->closing) {
        rd_call_free(k);
        return;
    }
    if (reply == NULL)
        rd_conn_lost(&rc->main, ac, ac->errstr && ac->errstr[0] ? ac->errstr : "connection closed");
    if (k->timer)
        evtimer_del(k->timer);
    if (reply && reply->type == REDIS_REPLY_ERROR && strncmp(reply->str, "NOSCRIPT", 8) == 0 &&
        !k->retried && ac == rc->main.ac) {
        /* Redis lost its script cache (restart, failover, SCRIPT FLUSH): load it, retry once. */
        k->retried = 1;
        (void)redisAsyncCommand(ac, NULL, NULL, "SCRIPT LOAD %s", rd_scripts[k->script]);
        if (redisAsyncCommandArgv(ac, rd_reply_cb, k, k->argc, k->argv, k->argvlen) == REDIS_OK) {
            event_active(rc->flush, EV_TIMEOUT, 0);
            rd_call_arm(k);
            return;
        }
    }
    int replica = reply && rd_is_replica_error(reply);
    if (replica) {
        /* The server is a replica now (a failover demoted it) and nothing ran. Behind a name or
         * an address that now leads to the new primary, only a new connection gets there: this
         * one would be refused for as long as it lasts. */
        char why[200];
        lock_fmt(why, sizeof(why), "it is a replica now (%.120s); connecting again", reply->str);
        lock_fmt(msg, sizeof(msg), "%s: %s", rc->where, why);
        if (ac == rc->main.ac)
            rd_conn_drop(&rc->main, why); /* counted as a backend error */
        else
            rc->lc->stats.backend_errors++;
    }
    if (k->kind == RD_CALL_DROP && (reply == NULL || k->timed_out || replica) && rd_drop_again(k))
        return;
    if (replica && k->kind == RD_CALL_ACQUIRE) {
        rd_acquire_outcome(k, NULL, msg, 0); /* tries again on the next connection if it may */
    } else if (replica) {
        rd_call_fail(k, msg, 0);
    } else if (k->timed_out) {
        lock_fmt(msg, sizeof(msg), "no reply from %s within %lld ms", rc->where,
                 rc->lc->opt.op_timeout_ms);
        rd_call_fail(k, msg, 1);
    } else if (reply == NULL) {
        lock_fmt(msg, sizeof(msg), "lost the connection to %s (%s)", rc->where,
                 rc->last_error[0] ? rc->last_error : "closed");
        rd_call_fail(k, msg, 1);
    } else if (reply->type == REDIS_REPLY_ERROR) {
        rc->lc->stats.backend_errors++;
        lock_fmt(msg, sizeof(msg), "%s answered an error: %s", rc->where, reply->str);
        rd_call_fail(k, msg, 0);
    } else {
        rc->warned_ms = 0; /* it answers: a later failure is news again */
        rd_call_done(k, reply);
    }
    rd_call_free(k);
}

static void rd_call_timeout_cb(evutil_socket_t fd, short what, void *arg)
{
    struct rd_call *k = arg;
    struct rd_client *rc = k->rc;
    char msg[LOCK_MSG_MAX];
    if (!k->sent) {
        lock_fmt(msg, sizeof(msg), "%s is unreachable (%s%s); gave up after %lld ms", rc->where,
                 rc->last_error[0] ? rc->last_error : "not connected yet",
                 rc->main.resolving ? "; its name is still being looked up" : "", k->wait_ms);
        rc->lc->stats.backend_errors++;
        rd_call_fail(k, msg, 0);
        rd_call_free(k);
        return;
    }
    /* Replies come in order, so nothing sent after k has been answered either: the connection
     * is stuck. Reset it; every call on it fails through its NULL reply, k with this reason. */
    k->timed_out = 1;
    if (k->ac == rc->main.ac) {
        char why[128];
        lock_fmt(why, sizeof(why), "no reply within %lld ms", rc->lc->opt.op_timeout_ms);
        rd_conn_drop(&rc->main, why);
    }
}

/* ---- ops ---- */

static void rd_drop_keys(struct rd_client *rc, const char *owner, struct lock_session *s,
                         const char *name, size_t len)
{
    size_t nkeys = 0, bytes = 0, b = 0;
    struct lock_hnode *it = NULL, *n;
    if (s) {
        while ((n = lock_map_next(&s->locks, &b, &it)) != NULL) {
            nkeys++;
            bytes += n->len;
        }
    } else {
        nkeys = 1;
        bytes = len;
    }
    if (nkeys == 0)
        return;
    if (rc->unsent_drops >= RD_MAX_DROPS && rc->main.state != RD_READY)
        return; /* the leases run out by themselves */
    struct rd_call *k = rd_call_begin(rc, RD_CALL_DROP, RD_RELEASE, (int)nkeys, 3, 0,
                                      rd_text_cap(rc, nkeys + 2, bytes, LOCK_OWNER_MAX + 64));
    if (k == NULL)
        return;
    lock_fmt(k->owner, sizeof(k->owner), "%s", owner);
    if (s) {
        b = 0;
        it = NULL;
        while ((n = lock_map_next(&s->locks, &b, &it)) != NULL)
            rd_arg_key(k, "lock:", n->name, n->len);
    } else {
        rd_arg_key(k, "lock:", name, len);
    }
    rd_arg(k, k->owner);
    rd_arg(k, rc->lock_prefix);
    rd_arg(k, rc->chan_prefix);
    if (k->overflow) {
        free(k);
        return;
    }
    rd_call_submit(k);
}

static void rd_drop_owner(struct rd_client *rc, const char *name, size_t len, const char *owner)
{
    rd_drop_keys(rc, owner, NULL, name, len);
}

static void rd_op_drop(struct lock_session *s, const char *name, size_t len)
{
    char owner[LOCK_OWNER_MAX];
    lock_owner(s, owner, sizeof(owner));
    rd_drop_keys(rd_of(s->c), owner, NULL, name, len);
}

static void rd_op_close_session(struct lock_session *s)
{
    struct rd_client *rc = rd_of(s->c);
    char owner[LOCK_OWNER_MAX];
    for (struct rd_call *k = rc->calls_head; k; k = k->next)
        if (k->s == s)
            k->s = NULL;
    lock_owner(s, owner, sizeof(owner));
    rd_drop_keys(rc, owner, s, NULL, 0);
}

static void rd_op_acquire(struct lock_req *r)
{
    struct rd_client *rc = rd_of(r->s->c);
    char msg[LOCK_MSG_MAX];
    struct rd_wait *wl = rd_wait_get(rc, r->name, r->len);
    if (wl == NULL) {
        lock_fmt(msg, sizeof(msg), "out of memory acquiring lock %s", r->name);
        lock_req_finish(r, LOCK_UNAVAILABLE, 0, msg);
        return;
    }
    if (r->deadline_ms <= r->start_ms && wl->head && !wl->inflight) {
        /* Try-once while others of this client wait their turn: they are ahead of it. */
        lock_fmt(msg, sizeof(msg),
                 "lock %s is held by another owner (%zu earlier callers of this client are "
                 "waiting for it)",
                 r->name, wl->count);
        lock_req_finish(r, LOCK_BUSY, 0, msg);
        return;
    }
    rd_wait_append(wl, r);
    if (r->deadline_ms > r->start_ms) {
        wl->want_sub = 1;
        rd_subscribe(wl);
    }
    if (wl->head == r)
        rd_wait_attempt(wl);
}

static void rd_op_release(struct lock_req *r)
{
    struct rd_client *rc = rd_of(r->s->c);
    char msg[LOCK_MSG_MAX];
    struct rd_call *k = rd_call_begin(rc, RD_CALL_RELEASE, RD_RELEASE, 1, 3, 0,
                                      rd_text_cap(rc, 3, r->len, LOCK_OWNER_MAX + 64));
    if (k) {
        lock_owner(r->s, k->owner, sizeof(k->owner));
        rd_arg_key(k, "lock:", r->name, r->len);
        rd_arg(k, k->owner);
        rd_arg(k, rc->lock_prefix);
        rd_arg(k, rc->chan_prefix);
        if (k->overflow) {
            free(k);
            k = NULL;
        }
    }
    if (k == NULL) {
        lock_fmt(msg, sizeof(msg), "out of memory releasing lock %s", r->name);
        lock_req_finish(r, LOCK_UNAVAILABLE, 0, msg);
        return;
    }
    k->req = r;
    r->b_call = k;
    rd_call_submit(k);
}

static void rd_op_cancel(struct lock_req *r)
{
    struct rd_call *k = r->b_call;
    struct rd_wait *wl = r->b_wait;
    if (k) {
        k->req = NULL;
        r->b_call = NULL;
    }
    if (wl) {
        rd_wait_remove(wl, r);
        rd_wait_maybe_free(wl);
    }
}

static void rd_op_renew(struct lock_session *s, int64_t now_ms)
{
    struct rd_client *rc = rd_of(s->c);
    size_t nkeys = 0, bytes = 0, b = 0, i = 0;
    struct lock_hnode *it = NULL, *n;
    while ((n = lock_map_next(&s->locks, &b, &it)) != NULL) {
        struct lock_entry *e = (struct lock_entry *)(void *)n;
        if ((e->state == LOCK_ENTRY_HELD || e->state == LOCK_ENTRY_FENCING) &&
            !(e->flags & LOCK_NORENEW)) {
            nkeys++;
            bytes += n->len;
        }
    }
    struct rd_call *k = NULL;
    if (nkeys > 0)
        k = rd_call_begin(rc, RD_CALL_RENEW, RD_RENEW, (int)nkeys, 1 + (int)nkeys, nkeys,
                          rd_text_cap(rc, nkeys, bytes, LOCK_OWNER_MAX + 24 * nkeys));
    if (k == NULL) {
        lock_renew_done(s);
        return;
    }
    lock_owner(s, k->owner, sizeof(k->owner));
    b = 0;
    it = NULL;
    while ((n = lock_map_next(&s->locks, &b, &it)) != NULL) {
        struct lock_entry *e = (struct lock_entry *)(void *)n;
        if ((e->state == LOCK_ENTRY_HELD || e->state == LOCK_ENTRY_FENCING) &&
            !(e->flags & LOCK_NORENEW)) {
            rd_arg_key(k, "lock:", e->name, n->len);
            k->tokens[i++] = e->token;
        }
    }
    rd_arg(k, k->owner);
    b = 0;
    it = NULL;
    while ((n = lock_map_next(&s->locks, &b, &it)) != NULL) {
        struct lock_entry *e = (struct lock_entry *)(void *)n;
        if ((e->state == LOCK_ENTRY_HELD || e->state == LOCK_ENTRY_FENCING) &&
            !(e->flags & LOCK_NORENEW))
            rd_arg_ll(k, e->ttl_ms);
    }
    if (k->overflow) {
        free(k);
        lock_renew_done(s);
        return;
    }
    k->s = s;
    rd_call_submit(k);
}

/* The fixed-lease (LOCK_NORENEW) locks of s, which no renewal asks about: after a reconnect one
 * owner-checked GET each, so that a lock Redis no longer has (it came back empty, or failed over
 * to a replica that missed the grant) is reported lost now rather than at the end of its lease. */
static void rd_check_fixed(struct lock_session *s)
{
    struct rd_client *rc = rd_of(s->c);
    size_t nkeys = 0, bytes = 0, b = 0, i = 0;
    struct lock_hnode *it = NULL, *n;
    while ((n = lock_map_next(&s->locks, &b, &it)) != NULL) {
        struct lock_entry *e = (struct lock_entry *)(void *)n;
        if (e->state != LOCK_ENTRY_LOST && (e->flags & LOCK_NORENEW)) {
            nkeys++;
            bytes += n->len;
        }
    }
    if (nkeys == 0)
        return;
    struct rd_call *k = rd_call_begin(rc, RD_CALL_CHECK, RD_CHECK, (int)nkeys, 1, nkeys,
                                      rd_text_cap(rc, nkeys, bytes, LOCK_OWNER_MAX + 8));
    if (k == NULL)
        return;
    b = 0;
    it = NULL;
    while ((n = lock_map_next(&s->locks, &b, &it)) != NULL) {
        struct lock_entry *e = (struct lock_entry *)(void *)n;
        if (e->state != LOCK_ENTRY_LOST && (e->flags & LOCK_NORENEW)) {
            rd_arg_key(k, "lock:", e->name, n->len);
            k->tokens[i++] = e->token;
        }
    }
    lock_owner(s, k->owner, sizeof(k->owner));
    rd_arg(k, k->owner);
    if (k->overflow) {
        free(k);
        return;
    }
    k->s = s;
    rd_call_submit(k);
}

static void rd_op_repair(struct lock_req *r, uint64_t repaired_min)
{
    struct rd_client *rc = rd_of(r->s->c);
    char msg[LOCK_MSG_MAX];
    struct rd_call *k = rd_call_begin(rc, RD_CALL_REPAIR, RD_REPAIR, 2, 2, 0,
                                      rd_text_cap(rc, 2, 2 * r->len, LOCK_OWNER_MAX + 32));
    if (k) {
        lock_owner(r->s, k->owner, sizeof(k->owner));
        rd_arg_key(k, "lock:", r->name, r->len);
        rd_arg_key(k, "token:", r->name, r->len);
        rd_arg(k, k->owner);
        char num[32];
        lock_fmt(num, sizeof(num), "%llu", (unsigned long long)repaired_min);
        rd_arg(k, num);
        if (k->overflow) {
            free(k);
            k = NULL;
        }
    }
    if (k == NULL) {
        lock_fmt(msg, sizeof(msg), "out of memory repairing the token of lock %s", r->name);
        lock_repaired(r, LOCK_UNAVAILABLE, 0, msg);
        return;
    }
    k->req = r;
    r->b_call = k;
    rd_call_submit(k);
}

static void rd_op_mark_raise(struct lock_client *c, const char *key, size_t len, uint64_t token,
                             const struct lock_session *holder, const char *name, size_t nlen,
                             lock_mark_cb cb, void *arg)
{
    struct rd_client *rc = rd_of(c);
    char num[32];
    int with = holder != NULL;
    struct rd_call *k = rd_call_begin(rc, RD_CALL_MARK, RD_MARK, 1 + with, 1 + with, 0,
                                      rd_text_cap(rc, 2, len + nlen, sizeof(num) + LOCK_OWNER_MAX));
    if (k) {
        rd_arg_key(k, "mark:", key, len);
        if (with) {
            rd_arg_key(k, "lock:", name, nlen);
            lock_owner(holder, k->owner, sizeof(k->owner));
            k->holder_id = holder->id;
        }
        lock_fmt(num, sizeof(num), "%llu", (unsigned long long)token);
        rd_arg(k, num);
        if (with)
            rd_arg(k, k->owner);
        if (k->overflow) {
            free(k);
            k = NULL;
        }
    }
    if (k == NULL) {
        lock_mark_done(c, cb, arg, LOCK_UNAVAILABLE, 0, "out of memory raising a mark");
        return;
    }
    k->mark_cb = cb;
    k->mark_arg = arg;
    rd_call_submit(k);
}

static const char *rd_op_not_ready(const struct lock_client *c)
{
    struct rd_client *rc = rd_of(c);

    if (rc->main.state == RD_READY)
        return NULL;
    lock_fmt(rc->down_why, sizeof(rc->down_why), "%s is not connected (%s%s)", rc->where,
             rc->last_error[0] ? rc->last_error : "not connected yet",
             rc->main.resolving ? "; its name is being looked up" : "");
    return rc->down_why;
}

/* Parses a decimal in [lo, hi] (0 <= lo <= hi <= INT_MAX) from s (n bytes). Returns 0 or -1. */
static int rd_parse_num(const char *s, size_t n, long lo, long hi, int *out)
{
    uint64_t v;
    if (lock_token_parse(s, n, &v) != 0 || v < (uint64_t)lo || v > (uint64_t)hi)
        return -1;
    *out = (int)v;
    return 0;
}

/* redis://[[user]:password@]host[:port][/db] (userinfo without ':' is a password, as redis-cli
 * reads it). Returns 0, or -1 with the reason in err. */
static int rd_parse_url(struct rd_client *rc, const char *url, char *err, size_t errlen)
{
    const char *p = lock_url_userinfo(url + strlen("redis://"), 0, rc->user, sizeof(rc->user),
                                      rc->pass, sizeof(rc->pass), &rc->have_auth);
    if (p == NULL) {
        lock_fmt(err, errlen, "redis URL: bad %%-escape, or a user name or password too long");
        return -1;
    }
    if (rc->lc->opt.password[0]) { /* given apart from the URL: it wins */
        lock_fmt(rc->pass, sizeof(rc->pass), "%s", rc->lc->opt.password);
        rc->have_auth = 1;
    }
    const char *end = p + strcspn(p, "/?#");
    rc->port = RD_DEFAULT_PORT;
    const char *hend, *portp = NULL;
    if (*p == '[') {
        const char *rb = memchr(p, ']', (size_t)(end - p));
        if (rb == NULL) {
            lock_fmt(err, errlen, "redis URL '%.200s': unterminated '[' in the host", url);
            return -1;
        }
        hend = rb;
        p++;
        if (rb + 1 < end) {
            if (rb[1] != ':') {
                lock_fmt(err, errlen, "redis URL '%.200s': junk after ']'", url);
                return -1;
            }
            portp = rb + 2;
        }
    } else {
        const char *colon = memchr(p, ':', (size_t)(end - p));
        hend = colon ? colon : end;
        portp = colon ? colon + 1 : NULL;
    }
    size_t hl = (size_t)(hend - p);
    if (hl == 0 || hl >= sizeof(rc->host)) {
        lock_fmt(err, errlen, "redis URL '%.200s': missing or too long host", url);
        return -1;
    }
    memcpy(rc->host, p, hl);
    rc->host[hl] = '\0';
    if (portp && rd_parse_num(portp, (size_t)(end - portp), 1, 65535, &rc->port) != 0) {
        lock_fmt(err, errlen, "redis URL '%.200s': port must be 1..65535", url);
        return -1;
    }
    if (*end == '?' || *end == '#') {
        lock_fmt(err, errlen, "redis URL '%.200s': query parameters are not supported", url);
        return -1;
    }
    if (*end == '/' && end[1] != '\0' &&
        rd_parse_num(end + 1, strlen(end + 1), 0, RD_MAX_DB, &rc->db) != 0) {
        lock_fmt(err, errlen, "redis URL '%.200s': the database must be a number after '/'", url);
        return -1;
    }
    return 0;
}

static int rd_op_open(struct lock_client *c, const char *url, char *err, size_t errlen)
{
    const char *prefix = c->opt.prefix;
    size_t plen = strlen(prefix);
    if (plen > RD_MAX_PREFIX || strpbrk(prefix, "{}") != NULL) {
        lock_fmt(err, errlen,
                 "lock prefix '%.60s' must be at most %d bytes without '{' or '}' (braces would "
                 "split a lock's keys across cluster slots)",
                 prefix, RD_MAX_PREFIX);
        return -1;
    }
    struct rd_client *rc = calloc(1, sizeof(*rc));
    if (rc == NULL) {
        lock_fmt(err, errlen, "lock client: out of memory");
        return -1;
    }
    rc->lc = c;
    if (rd_parse_url(rc, url, err, errlen) != 0) {
        free(rc);
        return -1;
    }
    rc->plen = plen;
    lock_fmt(rc->lock_prefix, sizeof(rc->lock_prefix), "%slock:", prefix);
    lock_fmt(rc->chan_prefix, sizeof(rc->chan_prefix), "%sreleased:", prefix);
    lock_fmt(rc->where, sizeof(rc->where), "redis %s:%d", rc->host, rc->port);
    struct rd_conn *conns[2] = {&rc->main, &rc->sub};
    for (int i = 0; i < 2; i++) {
        conns[i]->rc = rc;
        conns[i]->is_sub = i;
        conns[i]->backoff_ms = 0; /* the first connect is immediate */
        conns[i]->timer = evtimer_new(c->base, rd_conn_timer_cb, conns[i]);
    }
    rc->flush = event_new(c->base, -1, 0, rd_flush_cb, rc);
    if (rc->main.timer == NULL || rc->sub.timer == NULL || rc->flush == NULL) {
        if (rc->main.timer)
            event_free(rc->main.timer);
        if (rc->sub.timer)
            event_free(rc->sub.timer);
        if (rc->flush)
            event_free(rc->flush);
        free(rc);
        lock_fmt(err, errlen, "lock client: out of memory");
        return -1;
    }
    c->impl = rc;
    rd_conn_backoff(&rc->main);
    rd_conn_backoff(&rc->sub);
    rc->main.backoff_ms = rc->sub.backoff_ms = RD_BACKOFF_MIN_MS;
    return 0;
}

/* Writes what hiredis buffered for ac without waiting (best effort, non-blocking socket). */
static void rd_flush(redisAsyncContext *ac)
{
    int done = 0;
    for (int i = 0; i < 16 && !done; i++)
        if (redisBufferWrite(&ac->c, &done) == REDIS_ERR)
            break;
}

static void rd_op_close(struct lock_client *c)
{
    struct rd_client *rc = rd_of(c);
    if (rc->main.state == RD_READY)
        rd_flush(rc->main.ac);
    rc->closing = 1;
    struct rd_conn *conns[2] = {&rc->main, &rc->sub};
    for (int i = 0; i < 2; i++) {
        redisAsyncContext *ac = conns[i]->ac;
        conns[i]->ac = NULL;
        resolve_cancel(conns[i]->resolving);
        if (ac)
            redisAsyncFree(ac); /* sent calls come back with NULL replies and free themselves */
        event_free(conns[i]->timer);
    }
    event_free(rc->flush);
    while (rc->calls_head)
        rd_call_free(rc->calls_head);
    size_t b = 0;
    struct lock_hnode *it = NULL, *n;
    while ((n = lock_map_next(&rc->waits, &b, &it)) != NULL) {
        struct rd_wait *wl = (struct rd_wait *)(void *)n;
        event_free(wl->timer);
        free(wl);
    }
    lock_map_clear(&rc->waits);
    free(rc);
}

const struct lock_backend_ops lock_redis_ops = {
    .scheme = "redis",
    .default_prefix = "fencegate:",
    .open = rd_op_open,
    .close = rd_op_close,
    .not_ready = rd_op_not_ready,
    .acquire = rd_op_acquire,
    .release = rd_op_release,
    .cancel = rd_op_cancel,
    .renew = rd_op_renew,
    .drop = rd_op_drop,
    .close_session = rd_op_close_session,
    .repair = rd_op_repair,
    .mark_raise = rd_op_mark_raise,
};

const char *lock_client_redis_lock_prefix(const struct lock_client *c)
{
    return c->ops == &lock_redis_ops ? ((const struct rd_client *)c->impl)->lock_prefix : NULL;
}
