/* lock.c — the lock client's public API: sessions, their lock tables and renewal timers, the
 * fence-on-acquire protocol, and deferred user callbacks; backends plug in through lock_backend.h.
 */
#include "lock_backend.h"

#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum lock_note_kind {
    LOCK_NOTE_ACQUIRE,
    LOCK_NOTE_RELEASE,
    LOCK_NOTE_LOST,
    LOCK_NOTE_HOOK,
    LOCK_NOTE_MARK
};

/* A user callback waiting to run from the client's dispatch event, so that no user code ever runs
 * inside the library's own loops (a callback may free its session or the client). */
struct lock_note {
    struct lock_note *next;
    struct lock_session *s;
    enum lock_note_kind kind;
    int status;
    uint64_t token;
    lock_acquire_cb acquire_cb;
    lock_release_cb release_cb;
    lock_lost_cb lost_cb;
    lock_mark_cb mark_cb; /* MARK: token holds the mark */
    void *arg;
    struct lock_req *req; /* HOOK */
    size_t name_len;      /* LOST: text holds the name, a NUL, then the reason */
    char text[];
};

static const struct lock_backend_ops *const lock_backends[] = {&lock_redis_ops, &lock_etcd_ops};

int64_t lock_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int lock_warn_due(int64_t *last_ms, int64_t every_ms)
{
    int64_t now = lock_now_ms();

    if (*last_ms != 0 && now - *last_ms < every_ms)
        return 0;
    *last_ms = now != 0 ? now : 1;
    return 1;
}

/* Decodes %XX escapes of src (n bytes) into out (cap bytes). Returns 0, or -1 if it does not fit
 * or an escape is malformed. */
static int lock_pct_decode(const char *src, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = src[i];
        if (ch == '%') {
            unsigned v = 0;
            if (i + 2 >= n)
                return -1;
            for (int j = 1; j <= 2; j++) {
                char h = src[i + (size_t)j];
                v <<= 4;
                if (h >= '0' && h <= '9')
                    v |= (unsigned)(h - '0');
                else if (h >= 'a' && h <= 'f')
                    v |= (unsigned)(h - 'a' + 10);
                else if (h >= 'A' && h <= 'F')
                    v |= (unsigned)(h - 'A' + 10);
                else
                    return -1;
            }
            ch = (char)v;
            i += 2;
        }
        if (o + 1 >= cap || ch == '\0')
            return -1;
        out[o++] = ch;
    }
    out[o] = '\0';
    return 0;
}

const char *lock_url_userinfo(const char *p, int bare_is_user, char *user, size_t ucap, char *pass,
                              size_t pcap, int *have)
{
    const char *at = strrchr(p, '@');

    user[0] = pass[0] = '\0';
    *have = 0;
    if (at == NULL)
        return p;
    const char *colon = memchr(p, ':', (size_t)(at - p));
    if (colon == NULL && bare_is_user) {
        if (lock_pct_decode(p, (size_t)(at - p), user, ucap) != 0)
            return NULL;
    } else {
        const char *pw = colon ? colon + 1 : p;
        if ((colon && lock_pct_decode(p, (size_t)(colon - p), user, ucap) != 0) ||
            lock_pct_decode(pw, (size_t)(at - pw), pass, pcap) != 0)
            return NULL;
    }
    *have = 1;
    return at + 1;
}

void lock_fmt(char *out, size_t cap, const char *fmt, ...)
{
    va_list ap;
    if (cap == 0)
        return;
    va_start(ap, fmt);
    if (vsnprintf(out, cap, fmt, ap) < 0)
        out[0] = '\0';
    va_end(ap);
}

void lock_note_repair(struct lock_client *c, const char *name, size_t len, int reissued,
                      uint64_t token)
{
    char msg[LOCK_MSG_MAX];

    c->stats.token_repairs++;
    if (c->opt.warn == NULL)
        return;
    lock_fmt(msg, sizeof(msg),
             "lock %.*s: the token counter was not above a store's high-water mark (a counter "
             "lost, e.g. in a failover); raised it past the mark: token %llu%s",
             (int)(len > 200 ? 200 : len), name, (unsigned long long)token,
             reissued ? " (reissued)" : "");
    c->opt.warn(c->opt.warn_arg, msg);
}

/* Counts a token refused for not being above a store's mark (a backend that went back in time:
 * an etcd restored from an old snapshot, or started anew) and tells the owner's warn callback:
 * at once, then at most once per LOCK_REGRESSION_WARN_MS with the count since, since every
 * acquisition is refused until the backend's tokens pass the marks. */
static void lock_note_regression(struct lock_client *c, const char *msg)
{
    char line[LOCK_MSG_MAX + 128];

    c->stats.token_regressions++;
    if (c->opt.warn == NULL)
        return;
    if (!lock_warn_due(&c->regress_warned_ms, LOCK_REGRESSION_WARN_MS)) {
        c->regress_unsaid++;
        return;
    }
    if (c->regress_unsaid > 0)
        lock_fmt(line, sizeof(line),
                 "%s (the backend's tokens went back; %llu more since the "
                 "last such line)",
                 msg, (unsigned long long)c->regress_unsaid);
    else
        lock_fmt(line, sizeof(line),
                 "%s (the backend's tokens went back: restored from an old "
                 "snapshot, or its data lost?)",
                 msg);
    c->regress_unsaid = 0;
    c->opt.warn(c->opt.warn_arg, line);
}

int lock_token_parse(const char *s, size_t n, uint64_t *out)
{
    uint64_t v = 0;

    if (n == 0 || n > 19)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (uint64_t)(s[i] - '0'); /* 19 digits cannot overflow 64 bits */
    }
    if (v > INT64_MAX)
        return -1;
    *out = v;
    return 0;
}

uint64_t lock_random(struct lock_client *c)
{
    uint64_t x = c->rng; /* xorshift64* */
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    c->rng = x;
    return x * 2685821657736338717ull;
}

void lock_owner(const struct lock_session *s, char *out, size_t cap)
{
    lock_fmt(out, cap, "%s:%llu", s->c->uid, (unsigned long long)s->id);
}

/* ---- name hash table ---- */

static uint32_t lock_hash(const char *name, size_t len)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)name[i];
        h *= 16777619u;
    }
    return h;
}

void lock_hnode_init(struct lock_hnode *n, const char *name, size_t len)
{
    n->hnext = NULL;
    n->name = name;
    n->len = (uint32_t)len;
    n->hash = lock_hash(name, len);
}

struct lock_hnode *lock_map_find(const struct lock_map *m, const char *name, size_t len)
{
    if (m->nbuckets == 0)
        return NULL;
    uint32_t h = lock_hash(name, len);
    for (struct lock_hnode *n = m->buckets[h & (m->nbuckets - 1)]; n; n = n->hnext)
        if (n->hash == h && n->len == len && memcmp(n->name, name, len) == 0)
            return n;
    return NULL;
}

/* Doubles the bucket array (8 at first). Keeps the old one when out of memory. */
static void lock_map_grow(struct lock_map *m)
{
    size_t nb = m->nbuckets ? m->nbuckets * 2 : 8;
    struct lock_hnode **b = calloc(nb, sizeof(*b));
    if (b == NULL)
        return;
    for (size_t i = 0; i < m->nbuckets; i++) {
        struct lock_hnode *n = m->buckets[i];
        while (n) {
            struct lock_hnode *next = n->hnext;
            size_t j = n->hash & (nb - 1);
            n->hnext = b[j];
            b[j] = n;
            n = next;
        }
    }
    free(m->buckets);
    m->buckets = b;
    m->nbuckets = nb;
}

int lock_map_insert(struct lock_map *m, struct lock_hnode *n)
{
    if (m->count >= m->nbuckets)
        lock_map_grow(m);
    if (m->nbuckets == 0)
        return -1;
    size_t j = n->hash & (m->nbuckets - 1);
    n->hnext = m->buckets[j];
    m->buckets[j] = n;
    m->count++;
    return 0;
}

void lock_map_remove(struct lock_map *m, struct lock_hnode *n)
{
    if (m->nbuckets == 0)
        return;
    for (struct lock_hnode **p = &m->buckets[n->hash & (m->nbuckets - 1)]; *p; p = &(*p)->hnext) {
        if (*p == n) {
            *p = n->hnext;
            n->hnext = NULL;
            m->count--;
            return;
        }
    }
}

struct lock_hnode *lock_map_next(const struct lock_map *m, size_t *bucket, struct lock_hnode **node)
{
    /* *node holds the node to return next (saved before the caller could remove the current). */
    while (*node == NULL) {
        if (*bucket >= m->nbuckets)
            return NULL;
        *node = m->buckets[(*bucket)++];
    }
    struct lock_hnode *n = *node;
    *node = n->hnext;
    return n;
}

void lock_map_clear(struct lock_map *m)
{
    free(m->buckets);
    m->buckets = NULL;
    m->nbuckets = 0;
    m->count = 0;
}

#define LOCK_ENTRY_OF(n) ((struct lock_entry *)(void *)(n))

static struct lock_entry *lock_entry_find(const struct lock_session *s, const char *name,
                                          size_t len)
{
    struct lock_hnode *n = lock_map_find(&s->locks, name, len);
    return n ? LOCK_ENTRY_OF(n) : NULL;
}

static void lock_entry_remove(struct lock_session *s, struct lock_entry *e)
{
    lock_map_remove(&s->locks, &e->node);
    free(e);
}

/* ---- deferred callbacks ---- */

static struct lock_note *lock_note_new(struct lock_session *s, enum lock_note_kind kind,
                                       size_t textlen)
{
    struct lock_note *n = calloc(1, sizeof(*n) + textlen + 1);
    if (n == NULL)
        return NULL;
    n->s = s;
    n->kind = kind;
    return n;
}

static void lock_note_push(struct lock_client *c, struct lock_note *n)
{
    if (c->notes_tail)
        c->notes_tail->next = n;
    else
        c->notes_head = n;
    c->notes_tail = n;
    if (!c->dispatching)
        event_active(c->dispatch_ev, EV_TIMEOUT, 1);
}

/* Queues the result of an acquire (kind ACQUIRE) or a release (kind RELEASE) and counts it. */
static void lock_note_result(struct lock_session *s, const struct lock_req *r, int status,
                             uint64_t token, const char *msg)
{
    struct lock_client *c = s->c;
    if (r->kind == LOCK_REQ_ACQUIRE) {
        if (status == LOCK_OK)
            c->stats.acquired++;
        else if (status == LOCK_BUSY)
            c->stats.busy++;
        if (r->acquire_cb == NULL)
            return;
    } else {
        if (status == LOCK_OK)
            c->stats.released++;
        if (r->release_cb == NULL)
            return;
    }
    if (msg == NULL)
        msg = "";
    size_t ml = strlen(msg);
    struct lock_note *n =
        lock_note_new(s, r->kind == LOCK_REQ_ACQUIRE ? LOCK_NOTE_ACQUIRE : LOCK_NOTE_RELEASE, ml);
    if (n == NULL)
        return; /* out of memory: the one case where a callback is lost */
    n->status = status;
    n->token = token;
    n->acquire_cb = r->acquire_cb;
    n->release_cb = r->release_cb;
    n->arg = r->arg;
    memcpy(n->text, msg, ml);
    lock_note_push(c, n);
}

/* Queues a result that needs no request (invalid arguments, already held, not held). */
static void lock_note_direct(struct lock_session *s, enum lock_req_kind kind, lock_acquire_cb acb,
                             lock_release_cb rcb, void *arg, int status, uint64_t token,
                             const char *msg)
{
    struct lock_req r;
    memset(&r, 0, sizeof(r));
    r.kind = kind;
    r.acquire_cb = acb;
    r.release_cb = rcb;
    r.arg = arg;
    lock_note_result(s, &r, status, token, msg);
}

/* Marks e lost. From the loop (never from inside the backend, which may be reporting this), the
 * backend is then asked to free the lock's key, which may still exist even though this session
 * can no longer count on it (a renewal confirmed too late, a lease the server rounds up); left
 * there, it would keep every other owner waiting. Then the session's lost callback runs. */
static void lock_mark_lost(struct lock_session *s, struct lock_entry *e, const char *why)
{
    e->state = LOCK_ENTRY_LOST;
    s->c->stats.lost++;
    size_t wl = strlen(why);
    struct lock_note *n = lock_note_new(s, LOCK_NOTE_LOST, e->node.len + 1 + wl);
    if (n == NULL)
        return;
    n->lost_cb = s->lost;
    n->arg = s->lost_arg;
    n->token = e->token;
    n->name_len = e->node.len;
    memcpy(n->text, e->name, e->node.len);
    memcpy(n->text + e->node.len + 1, why, wl);
    lock_note_push(s->c, n);
}

static void lock_fence_done_cb(void *ctx, int status, uint64_t repaired_min, const char *msg);

/* Frees the backend's key of a lock lost with token, unless the session has taken the name again
 * (an entry with another token, or an acquisition in flight, may own that key now). */
static void lock_lost_drop(struct lock_session *s, const char *name, size_t len, uint64_t token)
{
    struct lock_entry *e = lock_entry_find(s, name, len);
    if (e && (e->state != LOCK_ENTRY_LOST || e->token != token))
        return;
    for (struct lock_req *r = s->reqs; r; r = r->s_next)
        if (r->kind == LOCK_REQ_ACQUIRE && r->len == len && memcmp(r->name, name, len) == 0)
            return;
    s->c->ops->drop(s, name, len);
}

static void lock_note_run(struct lock_client *c, struct lock_note *n)
{
    switch (n->kind) {
    case LOCK_NOTE_ACQUIRE:
        n->acquire_cb(n->arg, n->status, n->token, n->text);
        break;
    case LOCK_NOTE_RELEASE:
        if (n->release_cb) /* a caller that does not care may pass NULL */
            n->release_cb(n->arg, n->status, n->text);
        break;
    case LOCK_NOTE_LOST:
        lock_lost_drop(n->s, n->text, n->name_len, n->token);
        if (n->lost_cb)
            n->lost_cb(n->arg, n->text, n->token, n->text + n->name_len + 1);
        break;
    case LOCK_NOTE_HOOK: {
        struct lock_req *r = n->req;
        r->phase = LOCK_REQ_IN_HOOK;
        c->opt.fence(c->opt.fence_arg, r->name, r->token, lock_fence_done_cb, r);
        break;
    }
    case LOCK_NOTE_MARK:
        n->mark_cb(n->arg, n->status, n->token, n->text);
        break;
    }
}

static void lock_client_destroy(struct lock_client *c);

static void lock_dispatch_cb(evutil_socket_t fd, short what, void *arg)
{
    struct lock_client *c = arg;
    c->dispatching = 1;
    while (!c->free_pending && c->notes_head) {
        struct lock_note *n = c->notes_head;
        c->notes_head = n->next;
        if (c->notes_head == NULL)
            c->notes_tail = NULL;
        lock_note_run(c, n);
        free(n);
    }
    c->dispatching = 0;
    if (c->free_pending)
        lock_client_destroy(c);
}

/* Drops the queued callbacks of s (it is being freed: no callbacks after that). */
static void lock_notes_purge(struct lock_client *c, const struct lock_session *s)
{
    struct lock_note **p = &c->notes_head;
    c->notes_tail = NULL;
    while (*p) {
        struct lock_note *n = *p;
        if (n->s == s) {
            *p = n->next;
            free(n);
        } else {
            c->notes_tail = n;
            p = &n->next;
        }
    }
}

/* ---- requests ---- */

static struct lock_req *lock_req_new(struct lock_session *s, enum lock_req_kind kind,
                                     const char *name, size_t len)
{
    struct lock_req *r = calloc(1, sizeof(*r) + len + 1);
    if (r == NULL)
        return NULL;
    r->s = s;
    r->kind = kind;
    r->phase = LOCK_REQ_BACKEND;
    r->len = (uint32_t)len;
    memcpy(r->name, name, len);
    return r;
}

static void lock_req_link(struct lock_session *s, struct lock_req *r)
{
    r->s_prev = NULL;
    r->s_next = s->reqs;
    if (s->reqs)
        s->reqs->s_prev = r;
    s->reqs = r;
}

static void lock_req_unlink(struct lock_session *s, struct lock_req *r)
{
    if (r->s_prev)
        r->s_prev->s_next = r->s_next;
    else if (s->reqs == r)
        s->reqs = r->s_next;
    if (r->s_next)
        r->s_next->s_prev = r->s_prev;
    r->s_prev = r->s_next = NULL;
}

static void lock_req_free(struct lock_req *r)
{
    while (r) {
        struct lock_req *j = r->joined;
        free(r->gone);
        free(r);
        r = j;
    }
}

void lock_req_finish(struct lock_req *r, int status, uint64_t token, const char *msg)
{
    struct lock_session *s = r->s;
    if (s) {
        lock_req_unlink(s, r);
        for (struct lock_req *q = r; q; q = q->joined)
            lock_note_result(s, q, status, token, msg);
    }
    lock_req_free(r);
}

/* ---- renewal and expiry timer ---- */

static int lock_renewable(const struct lock_entry *e)
{
    return (e->state == LOCK_ENTRY_HELD || e->state == LOCK_ENTRY_FENCING) &&
           !(e->flags & LOCK_NORENEW);
}

/* Lowers the session's timer bounds (sched_earliest, sched_min_ttl) to take e in. */
static void lock_session_note(struct lock_session *s, const struct lock_entry *e)
{
    if (e->state == LOCK_ENTRY_HELD && e->expiry_ms < s->sched_earliest)
        s->sched_earliest = e->expiry_ms;
    if (lock_renewable(e) && (s->sched_min_ttl == 0 || e->ttl_ms < s->sched_min_ttl))
        s->sched_min_ttl = e->ttl_ms;
}

/* Makes the timer bounds exact: one pass over the session's locks. */
static void lock_session_scan(struct lock_session *s)
{
    size_t b = 0;
    struct lock_hnode *it = NULL, *n;
    s->sched_earliest = INT64_MAX;
    s->sched_min_ttl = 0;
    while ((n = lock_map_next(&s->locks, &b, &it)) != NULL)
        lock_session_note(s, LOCK_ENTRY_OF(n));
}

/* Arms the session's single timer at the next renewal or the earliest expiry, whichever is
 * first. A renewal that is due while one is in flight or the backend is down waits for
 * lock_renew_done() / lock_backend_up() instead of spinning. */
static void lock_session_schedule(struct lock_session *s)
{
    struct lock_client *c = s->c;
    int64_t now = lock_now_ms(), at = s->sched_earliest;
    if (s->sched_min_ttl == 0) {
        s->next_renew_ms = INT64_MAX;
    } else if (s->next_renew_ms > now) {
        if (s->next_renew_ms < at)
            at = s->next_renew_ms;
    } else if (!s->renew_inflight && !c->ops->not_ready(c)) {
        at = now;
    }
    if (at == INT64_MAX) {
        evtimer_del(s->timer);
        return;
    }
    int64_t d = at > now ? at - now : 0;
    struct timeval tv = {(time_t)(d / 1000), (suseconds_t)((d % 1000) * 1000)};
    evtimer_add(s->timer, &tv);
}

static void lock_session_tick(evutil_socket_t fd, short what, void *arg)
{
    struct lock_session *s = arg;
    struct lock_client *c = s->c;
    int64_t now = lock_now_ms();
    int32_t min_ttl;
    char why[160];
    size_t b = 0;
    struct lock_hnode *it = NULL, *n;
    while ((n = lock_map_next(&s->locks, &b, &it)) != NULL) {
        struct lock_entry *e = LOCK_ENTRY_OF(n);
        if (e->state != LOCK_ENTRY_HELD || e->expiry_ms > now)
            continue;
        if (e->flags & LOCK_NORENEW)
            lock_fmt(why, sizeof(why), "its fixed lease of %ld ms ran out", (long)e->ttl_ms);
        else
            lock_fmt(why, sizeof(why),
                     "its lease of %ld ms ran out before the backend confirmed a renewal",
                     (long)e->ttl_ms);
        lock_mark_lost(s, e, why);
    }
    lock_session_scan(s);
    min_ttl = s->sched_min_ttl;
    if (min_ttl > 0 && s->next_renew_ms <= now && !s->renew_inflight && !c->ops->not_ready(c)) {
        /* Fixed rate, not fixed delay: ticks stay ttl/3 apart however late the timer runs. */
        s->renew_inflight = 1;
        s->next_renew_ms += min_ttl / 3;
        if (s->next_renew_ms <= now)
            s->next_renew_ms = now + min_ttl / 3;
        c->stats.renewal_round_trips++;
        c->ops->renew(s, now);
    }
    lock_session_schedule(s);
}

void lock_session_renew_soon(struct lock_session *s)
{
    int64_t now = lock_now_ms();

    if (s->next_renew_ms <= now)
        return; /* one is due already: a burst of calls costs one renewal, and no scans */
    s->next_renew_ms = now;
    lock_session_schedule(s);
}

/* The backend says e, granted and in its fence on acquire, is no longer the session's (why; NULL
 * when only its lease ran out): the fence's completion fails the acquisition and names the first
 * such reason (lock_fence_settle()). */
static void lock_fencing_gone(struct lock_session *s, struct lock_entry *e, const char *why)
{
    e->expiry_ms = INT64_MIN;
    if (why == NULL)
        return;
    for (struct lock_req *r = s->reqs; r; r = r->s_next)
        if (r->kind == LOCK_REQ_ACQUIRE && r->phase != LOCK_REQ_BACKEND && r->token == e->token &&
            r->len == e->node.len && memcmp(r->name, e->name, r->len) == 0) {
            if (r->gone == NULL)
                r->gone = strdup(why); /* NULL: the generic reason is given */
            return;
        }
}

void lock_renew_result(struct lock_session *s, const char *name, size_t len, uint64_t token,
                       int64_t sent_ms, int held)
{
    struct lock_entry *e = lock_entry_find(s, name, len);
    if (e == NULL || e->token != token || e->state == LOCK_ENTRY_LOST)
        return;
    int64_t now = lock_now_ms();
    if (held && now < e->expiry_ms) {
        if (sent_ms + e->ttl_ms > e->expiry_ms)
            e->expiry_ms = sent_ms + e->ttl_ms;
        s->c->stats.renewals++;
        return;
    }
    if (e->state == LOCK_ENTRY_FENCING) {
        lock_fencing_gone(s, e,
                          held ? NULL
                               : "the backend refused its renewal: the lock key is gone or has "
                                 "another owner");
        return;
    }
    if (held) {
        lock_mark_lost(s, e, "the renewal was confirmed after the local lease had run out");
    } else {
        lock_mark_lost(s, e,
                       "the backend refused the renewal: the lock key is gone or has another "
                       "owner");
    }
}

void lock_held_gone(struct lock_session *s, const char *name, size_t len, uint64_t token,
                    const char *why)
{
    struct lock_entry *e = lock_entry_find(s, name, len);
    if (e == NULL || e->token != token || e->state == LOCK_ENTRY_LOST)
        return;
    if (e->state == LOCK_ENTRY_FENCING) {
        lock_fencing_gone(s, e, why);
        return;
    }
    lock_mark_lost(s, e, why);
}

void lock_renew_done(struct lock_session *s)
{
    s->renew_inflight = 0;
    lock_session_schedule(s);
}

void lock_backend_up(struct lock_client *c)
{
    /* Renew at once after a reconnect: the server may have restarted or failed over, and a lock
     * whose key is gone should be reported lost now rather than at the next tick. */
    int64_t now = lock_now_ms();
    for (struct lock_session *s = c->sessions; s; s = s->next) {
        if (s->next_renew_ms != INT64_MAX && s->next_renew_ms > now)
            s->next_renew_ms = now;
        lock_session_schedule(s);
    }
}

/* ---- grants and the fence hook ---- */

/* Ends a grant that cannot be reported: forgets and releases the lock, reports msg. */
static void lock_fence_fail(struct lock_req *r, struct lock_entry *e, const char *msg)
{
    struct lock_session *s = r->s;
    if (e) {
        lock_entry_remove(s, e);
        s->c->ops->drop(s, r->name, r->len);
        lock_session_schedule(s);
    }
    lock_req_finish(r, LOCK_UNAVAILABLE, 0, msg);
}

/* The fence hook (if any) accepted r's token: the lock is held from now on. */
static void lock_fence_settle(struct lock_req *r, struct lock_entry *e)
{
    char msg[LOCK_MSG_MAX];
    if (e->expiry_ms == INT64_MIN && r->gone) {
        lock_fmt(msg, sizeof(msg),
                 "lock %s was granted (token %llu) but was lost before it could be reported: %s; "
                 "retry",
                 r->name, (unsigned long long)r->token, r->gone);
        lock_fence_fail(r, e, msg);
        return;
    }
    if (lock_now_ms() >= e->expiry_ms) {
        lock_fmt(msg, sizeof(msg),
                 "lock %s was granted (token %llu) but its lease ran out before it could be "
                 "reported; retry",
                 r->name, (unsigned long long)r->token);
        lock_fence_fail(r, e, msg);
        return;
    }
    e->state = LOCK_ENTRY_HELD;
    lock_session_note(r->s, e);
    lock_session_schedule(r->s); /* its expiry now counts for the timer */
    lock_req_finish(r, LOCK_OK, r->token, NULL);
}

static struct lock_entry *lock_fencing_entry(struct lock_req *r)
{
    struct lock_entry *e = lock_entry_find(r->s, r->name, r->len);
    if (e && e->state == LOCK_ENTRY_FENCING && e->token == r->token)
        return e;
    return NULL;
}

void lock_granted(struct lock_req *r, uint64_t token, int64_t sent_ms)
{
    struct lock_session *s = r->s;
    struct lock_client *c = s->c;
    struct lock_entry *e = lock_entry_find(s, r->name, r->len);
    char msg[LOCK_MSG_MAX];
    if (e)
        lock_entry_remove(s, e); /* a lost entry of the same name */
    e = calloc(1, sizeof(*e) + r->len + 1);
    if (e) {
        memcpy(e->name, r->name, r->len);
        lock_hnode_init(&e->node, e->name, r->len);
        if (lock_map_insert(&s->locks, &e->node) != 0) {
            free(e);
            e = NULL;
        }
    }
    r->token = token;
    if (e == NULL) {
        c->ops->drop(s, r->name, r->len);
        lock_fmt(msg, sizeof(msg), "out of memory recording lock %s", r->name);
        lock_req_finish(r, LOCK_UNAVAILABLE, 0, msg);
        return;
    }
    e->token = token;
    e->ttl_ms = r->ttl_ms;
    e->flags = (uint8_t)r->flags;
    e->state = LOCK_ENTRY_FENCING;
    e->expiry_ms = sent_ms + r->ttl_ms;
    lock_session_note(s, e);
    if (lock_renewable(e) && sent_ms + r->ttl_ms / 3 < s->next_renew_ms)
        s->next_renew_ms = sent_ms + r->ttl_ms / 3;
    lock_session_schedule(s);
    if (c->opt.fence == NULL) {
        lock_fence_settle(r, e);
        return;
    }
    struct lock_note *n = lock_note_new(s, LOCK_NOTE_HOOK, 0);
    if (n == NULL) {
        lock_fmt(msg, sizeof(msg), "out of memory fencing lock %s", r->name);
        lock_fence_fail(r, e, msg);
        return;
    }
    n->req = r;
    r->phase = LOCK_REQ_HOOK_DUE;
    lock_note_push(c, n);
}

static void lock_fence_done_cb(void *ctx, int status, uint64_t repaired_min, const char *hmsg)
{
    struct lock_req *r = ctx;
    char msg[LOCK_MSG_MAX];
    if (r->s == NULL) { /* the session was freed while the hook ran */
        lock_req_free(r);
        return;
    }
    if (r->phase != LOCK_REQ_IN_HOOK)
        return; /* done() called twice */
    struct lock_client *c = r->s->c;
    struct lock_entry *e = lock_fencing_entry(r);
    if (e == NULL) {
        lock_fmt(msg, sizeof(msg), "lock %s was lost while its fence hook ran", r->name);
        lock_fence_fail(r, NULL, msg);
        return;
    }
    if (status == 0) {
        lock_fence_settle(r, e);
    } else if (status < 0) {
        lock_fmt(msg, sizeof(msg), "fence on acquire of lock %s (token %llu) failed: %s", r->name,
                 (unsigned long long)r->token, hmsg ? hmsg : "(no reason given)");
        lock_fence_fail(r, e, msg);
    } else if (c->ops->repair == NULL || r->fence_rounds >= LOCK_MAX_FENCE_ROUNDS) {
        lock_fmt(msg, sizeof(msg),
                 "lock %s: token %llu is not above the stores' mark %llu and %s; refusing it",
                 r->name, (unsigned long long)r->token, (unsigned long long)repaired_min,
                 c->ops->repair ? "repairs did not converge" : "this backend cannot repair");
        lock_note_regression(c, msg);
        lock_fence_fail(r, e, msg);
    } else {
        r->fence_rounds++;
        r->phase = LOCK_REQ_REPAIR;
        c->ops->repair(r, repaired_min);
    }
}

void lock_repaired(struct lock_req *r, int status, uint64_t token, const char *msg)
{
    r->b_call = NULL;
    if (r->s == NULL) {
        lock_req_free(r);
        return;
    }
    struct lock_entry *e = lock_fencing_entry(r);
    if (status != LOCK_OK || e == NULL) {
        lock_fence_fail(r, e, msg ? msg : "lock lost while its token was repaired");
        return;
    }
    struct lock_note *n = lock_note_new(r->s, LOCK_NOTE_HOOK, 0);
    if (n == NULL) {
        lock_fence_fail(r, e, "out of memory fencing a lock");
        return;
    }
    lock_note_repair(r->s->c, r->name, r->len, 1, token);
    e->token = token;
    r->token = token;
    n->req = r;
    r->phase = LOCK_REQ_HOOK_DUE;
    lock_note_push(r->s->c, n);
}

/* ---- public API ---- */

/* Fills uid with 32 hex digits and *seed with 64 more bits from /dev/urandom. Returns 0, or -1
 * with errno set. */
static int lock_random_uid(char *uid, uint64_t *seed)
{
    unsigned char b[16 + sizeof(*seed)];
    size_t got = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    while (got < sizeof(b)) {
        ssize_t n = read(fd, b + got, sizeof(b) - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            close(fd);
            errno = e;
            return -1;
        }
        got += (size_t)n;
    }
    close(fd);
    for (size_t i = 0; i < 16; i++)
        lock_fmt(uid + 2 * i, 3, "%02x", b[i]);
    memcpy(seed, b + 16, sizeof(*seed));
    return 0;
}

/* Whether url's scheme (its first n bytes) is s; s may be NULL. */
static int lock_scheme_is(const char *url, size_t n, const char *s)
{
    return s && strlen(s) == n && strncmp(url, s, n) == 0;
}

struct lock_client *lock_client_new(struct event_base *base, const char *url,
                                    const struct lock_options *opt, char *err, size_t errlen)
{
    const struct lock_backend_ops *ops = NULL;
    uint64_t seed;
    if (base == NULL || url == NULL) {
        lock_fmt(err, errlen, "lock client: missing event base or backend URL");
        return NULL;
    }
    size_t ul = strcspn(url, ":");
    for (size_t i = 0; i < sizeof(lock_backends) / sizeof(lock_backends[0]); i++)
        if (strncmp(url + ul, "://", 3) == 0 &&
            (lock_scheme_is(url, ul, lock_backends[i]->scheme) ||
             lock_scheme_is(url, ul, lock_backends[i]->tls_scheme)))
            ops = lock_backends[i];
    if (ops == NULL) {
        lock_fmt(err, errlen,
                 "lock backend URL '%.*s...': unknown scheme (use redis://, etcd:// or etcds://)",
                 (int)(ul > 40 ? 40 : ul), url);
        return NULL;
    }
    struct lock_client *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        lock_fmt(err, errlen, "lock client: out of memory");
        return NULL;
    }
    c->ops = ops;
    c->base = base;
    if (opt)
        c->opt = *opt;
    c->opt.prefix[sizeof(c->opt.prefix) - 1] = '\0';
    c->opt.mark_prefix[sizeof(c->opt.mark_prefix) - 1] = '\0';
    if (c->opt.prefix[0] == '\0')
        lock_fmt(c->opt.prefix, sizeof(c->opt.prefix), "%s", ops->default_prefix);
    if (c->opt.op_timeout_ms <= 0)
        c->opt.op_timeout_ms = LOCK_DEFAULT_OP_TIMEOUT_MS;
    if (lock_random_uid(c->uid, &seed) != 0) {
        lock_fmt(err, errlen, "lock client: cannot read /dev/urandom: %s", strerror(errno));
        free(c);
        return NULL;
    }
    c->rng = seed ? seed : 0x9e3779b97f4a7c15ull;
    c->dispatch_ev = event_new(base, -1, 0, lock_dispatch_cb, c);
    if (c->dispatch_ev == NULL) {
        lock_fmt(err, errlen, "lock client: out of memory");
        free(c);
        return NULL;
    }
    if (ops->open(c, url, err, errlen) != 0) {
        event_free(c->dispatch_ev);
        free(c);
        return NULL;
    }
    return c;
}

static void lock_client_destroy(struct lock_client *c)
{
    while (c->sessions)
        lock_session_free(c->sessions);
    c->ops->close(c);
    while (c->notes_head) {
        struct lock_note *n = c->notes_head;
        c->notes_head = n->next;
        free(n);
    }
    event_free(c->dispatch_ev);
    free(c);
}

void lock_client_free(struct lock_client *c)
{
    if (c == NULL)
        return;
    if (c->dispatching) { /* called from one of our callbacks: finish after it returns */
        c->free_pending = 1;
        return;
    }
    lock_client_destroy(c);
}

int lock_client_ready(const struct lock_client *c)
{
    return lock_client_not_ready(c) == NULL;
}

const char *lock_client_not_ready(const struct lock_client *c)
{
    if (!c || c->free_pending)
        return "the lock client is closing";
    return c->ops->not_ready(c);
}

struct lock_session *lock_session_new(struct lock_client *c, long long ttl_ms, lock_lost_cb lost,
                                      void *arg)
{
    if (c == NULL || c->free_pending || ttl_ms < LOCK_MIN_TTL_MS || ttl_ms > LOCK_MAX_TTL_MS)
        return NULL;
    struct lock_session *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return NULL;
    s->timer = evtimer_new(c->base, lock_session_tick, s);
    if (s->timer == NULL) {
        free(s);
        return NULL;
    }
    s->c = c;
    s->id = ++c->next_session_id;
    s->ttl_ms = (int32_t)ttl_ms;
    s->lost = lost;
    s->lost_arg = arg;
    s->next_renew_ms = INT64_MAX;
    s->sched_earliest = INT64_MAX;
    s->next = c->sessions;
    if (c->sessions)
        c->sessions->prev = s;
    c->sessions = s;
    return s;
}

void lock_session_free(struct lock_session *s)
{
    if (s == NULL)
        return;
    struct lock_client *c = s->c;
    lock_notes_purge(c, s);
    while (s->reqs) {
        struct lock_req *r = s->reqs;
        lock_req_unlink(s, r);
        switch (r->phase) {
        case LOCK_REQ_BACKEND:
        case LOCK_REQ_REPAIR:
            c->ops->cancel(r);
            lock_req_free(r);
            break;
        case LOCK_REQ_HOOK_DUE: /* its note is purged */
            lock_req_free(r);
            break;
        case LOCK_REQ_IN_HOOK: /* the hook owns it until done(); the joined go now */
            lock_req_free(r->joined);
            r->joined = NULL;
            r->s = NULL;
            break;
        }
    }
    c->ops->close_session(s);
    size_t b = 0;
    struct lock_hnode *it = NULL, *n;
    while ((n = lock_map_next(&s->locks, &b, &it)) != NULL)
        free(LOCK_ENTRY_OF(n));
    lock_map_clear(&s->locks);
    event_free(s->timer);
    if (s->prev)
        s->prev->next = s->next;
    else
        c->sessions = s->next;
    if (s->next)
        s->next->prev = s->prev;
    free(s);
}

/* Checks a name and returns 1, or queues LOCK_INVALID and returns 0. */
static int lock_check_name(struct lock_session *s, enum lock_req_kind kind, const char *name,
                           size_t len, lock_acquire_cb acb, lock_release_cb rcb, void *arg)
{
    char msg[LOCK_MSG_MAX];
    if (name != NULL && len > 0 && len <= LOCK_MAX_NAME && memchr(name, '\0', len) == NULL)
        return 1;
    lock_fmt(msg, sizeof(msg),
             "invalid lock name: it must be 1..%d bytes without NUL bytes (got %zu bytes)",
             LOCK_MAX_NAME, name ? len : 0);
    lock_note_direct(s, kind, acb, rcb, arg, LOCK_INVALID, 0, msg);
    return 0;
}

int lock_acquire(struct lock_session *s, const char *name, size_t len, long long ttl_ms,
                 long long wait_ms, unsigned flags, lock_acquire_cb cb, void *arg)
{
    char msg[LOCK_MSG_MAX];
    if (s == NULL || cb == NULL || s->c->free_pending)
        return -1;
    if (!lock_check_name(s, LOCK_REQ_ACQUIRE, name, len, cb, NULL, arg))
        return 0;
    if (ttl_ms != 0 && (ttl_ms < LOCK_MIN_TTL_MS || ttl_ms > LOCK_MAX_TTL_MS)) {
        lock_fmt(msg, sizeof(msg),
                 "lock %.*s: ttl_ms %lld out of range (%d..%d, or 0 for the session's lease)",
                 (int)len, name, ttl_ms, LOCK_MIN_TTL_MS, LOCK_MAX_TTL_MS);
        lock_note_direct(s, LOCK_REQ_ACQUIRE, cb, NULL, arg, LOCK_INVALID, 0, msg);
        return 0;
    }
    if (flags & ~(unsigned)LOCK_NORENEW) {
        lock_fmt(msg, sizeof(msg), "lock %.*s: unknown flags 0x%x", (int)len, name, flags);
        lock_note_direct(s, LOCK_REQ_ACQUIRE, cb, NULL, arg, LOCK_INVALID, 0, msg);
        return 0;
    }
    int64_t now = lock_now_ms();
    struct lock_entry *e = lock_entry_find(s, name, len);
    if (e && e->state == LOCK_ENTRY_HELD && now < e->expiry_ms) {
        lock_note_direct(s, LOCK_REQ_ACQUIRE, cb, NULL, arg, LOCK_OK, e->token, NULL);
        return 0;
    }
    if (e && e->state != LOCK_ENTRY_FENCING) {
        if (e->state == LOCK_ENTRY_HELD) /* expired, the timer has not said so yet */
            lock_mark_lost(s, e, "its lease ran out before the backend confirmed a renewal");
        lock_entry_remove(s, e);
    }
    struct lock_req *r = lock_req_new(s, LOCK_REQ_ACQUIRE, name, len);
    if (r == NULL)
        return -1;
    r->acquire_cb = cb;
    r->arg = arg;
    r->ttl_ms = (int32_t)(ttl_ms ? ttl_ms : s->ttl_ms);
    r->flags = flags;
    r->start_ms = now;
    if (wait_ms < 0 || wait_ms > INT64_MAX / 4)
        r->deadline_ms = INT64_MAX;
    else
        r->deadline_ms = now + wait_ms;
    /* One acquire per name and session at a time: a second one shares the first's outcome. */
    for (struct lock_req *p = s->reqs; p; p = p->s_next) {
        if (p->kind == LOCK_REQ_ACQUIRE && p->len == len && memcmp(p->name, name, len) == 0) {
            r->joined = p->joined;
            p->joined = r;
            return 0;
        }
    }
    lock_req_link(s, r);
    s->c->ops->acquire(r);
    return 0;
}

int lock_release(struct lock_session *s, const char *name, size_t len, lock_release_cb cb,
                 void *arg)
{
    char msg[LOCK_MSG_MAX];
    if (s == NULL || s->c->free_pending)
        return -1;
    if (!lock_check_name(s, LOCK_REQ_RELEASE, name, len, NULL, cb, arg))
        return 0;
    struct lock_entry *e = lock_entry_find(s, name, len);
    if (e == NULL || e->state == LOCK_ENTRY_FENCING) {
        lock_fmt(msg, sizeof(msg), "lock %.*s is not held by this session", (int)len, name);
        lock_note_direct(s, LOCK_REQ_RELEASE, NULL, cb, arg, LOCK_NOT_HELD, 0, msg);
        return 0;
    }
    if (e->state == LOCK_ENTRY_LOST || lock_now_ms() >= e->expiry_ms) {
        lock_fmt(msg, sizeof(msg), "lock %.*s was lost before this release (token %llu)", (int)len,
                 name, (unsigned long long)e->token);
        lock_entry_remove(s, e);
        s->c->ops->drop(s, name, len); /* the key may still be ours: free it sooner */
        lock_note_direct(s, LOCK_REQ_RELEASE, NULL, cb, arg, LOCK_NOT_HELD, 0, msg);
        return 0;
    }
    struct lock_req *r = lock_req_new(s, LOCK_REQ_RELEASE, name, len);
    if (r == NULL)
        return -1;
    r->release_cb = cb;
    r->arg = arg;
    r->token = e->token;
    lock_entry_remove(s, e);
    lock_req_link(s, r);
    s->c->ops->release(r);
    return 0;
}

void lock_session_lose_all(struct lock_session *s, const char *why)
{
    size_t b = 0;
    struct lock_hnode *it = NULL, *n;
    if (s == NULL)
        return;
    while ((n = lock_map_next(&s->locks, &b, &it)) != NULL) {
        struct lock_entry *e = LOCK_ENTRY_OF(n);
        if (e->state == LOCK_ENTRY_HELD)
            lock_mark_lost(s, e, why);
    }
    lock_session_schedule(s);
}

/* c's session numbered id, or NULL when it was freed (ids are never reused). */
static struct lock_session *lock_session_by_id(struct lock_client *c, uint64_t id)
{
    struct lock_session *s = c ? c->sessions : NULL;
    while (s && s->id != id)
        s = s->next;
    return s;
}

struct lock_session_ref lock_session_ref(const struct lock_session *s)
{
    struct lock_session_ref r = {s ? s->c : NULL, s ? s->id : 0};
    return r;
}

int lock_forfeit(struct lock_session_ref ref, const char *name, size_t len, uint64_t token,
                 const char *why)
{
    struct lock_session *s = lock_session_by_id(ref.c, ref.id);
    struct lock_entry *e = s && name ? lock_entry_find(s, name, len) : NULL;
    if (e == NULL || e->state != LOCK_ENTRY_HELD || e->token != token)
        return 0;
    lock_mark_lost(s, e, why);
    lock_session_schedule(s);
    return 1;
}

int lock_still_held(struct lock_session_ref ref, const char *name, size_t len, uint64_t token)
{
    const struct lock_session *s = lock_session_by_id(ref.c, ref.id);
    uint64_t t = 0;
    return s && name && lock_state(s, name, len, &t, NULL) == 1 && t == token;
}

int lock_state(const struct lock_session *s, const char *name, size_t len, uint64_t *token,
               long long *remaining_ms)
{
    struct lock_entry *e = s && name ? lock_entry_find(s, name, len) : NULL;
    if (token)
        *token = 0;
    if (remaining_ms)
        *remaining_ms = 0;
    if (e == NULL || e->state == LOCK_ENTRY_FENCING)
        return 0;
    if (token)
        *token = e->token;
    if (e->state == LOCK_ENTRY_LOST)
        return -1;
    /* The clock decides, not the timer: a process that was frozen past its lease must not
     * believe it still holds the lock when it resumes, before any timer had a chance to run. */
    int64_t left = e->expiry_ms - lock_now_ms();
    if (left <= 0)
        return -1;
    if (remaining_ms)
        *remaining_ms = left;
    return 1;
}

void lock_foreach(const struct lock_session *s,
                  void (*fn)(void *arg, const char *name, size_t len, int state, uint64_t token,
                             long long remaining_ms),
                  void *arg)
{
    /* Runs for every command of a connection with a session (fencing.c): a session that holds
     * nothing costs no clock read, and the walk stops at the last entry, however many buckets
     * the map grew to once. */
    if (s == NULL || fn == NULL || s->locks.count == 0)
        return;
    int64_t now = lock_now_ms();
    size_t b = 0, left = s->locks.count;
    struct lock_hnode *it = NULL, *n;
    while (left > 0 && (n = lock_map_next(&s->locks, &b, &it)) != NULL) {
        struct lock_entry *e = LOCK_ENTRY_OF(n);
        left--;
        if (e->state == LOCK_ENTRY_FENCING)
            continue;
        if (e->state == LOCK_ENTRY_HELD && e->expiry_ms > now)
            fn(arg, e->name, e->node.len, 1, e->token, e->expiry_ms - now);
        else
            fn(arg, e->name, e->node.len, -1, e->token, 0);
    }
}

size_t lock_count(const struct lock_session *s)
{
    size_t count = 0, b = 0;
    struct lock_hnode *it = NULL, *n;
    if (s == NULL)
        return 0;
    int64_t now = lock_now_ms();
    while ((n = lock_map_next(&s->locks, &b, &it)) != NULL) {
        struct lock_entry *e = LOCK_ENTRY_OF(n);
        if (e->state == LOCK_ENTRY_HELD && e->expiry_ms > now)
            count++;
    }
    return count;
}

/* ---- high-water marks in the backend ---- */

void lock_mark_done(struct lock_client *c, lock_mark_cb cb, void *arg, int status, uint64_t mark,
                    const char *msg)
{
    if (msg == NULL)
        msg = "";
    size_t ml = strlen(msg);
    /* No session: a mark belongs to the client, and session teardown never purges it. */
    struct lock_note *n = lock_note_new(NULL, LOCK_NOTE_MARK, ml);
    if (n == NULL)
        return; /* out of memory: as for the other notes, the one case where a callback is lost */
    n->status = status;
    n->token = mark;
    n->mark_cb = cb;
    n->arg = arg;
    memcpy(n->text, msg, ml);
    lock_note_push(c, n);
}

static int lock_mark_raise_as(struct lock_client *c, const struct lock_session *holder,
                              const char *name, const char *key, size_t len, uint64_t token,
                              lock_mark_cb cb, void *arg)
{
    char msg[LOCK_MSG_MAX];
    size_t nlen = name ? strnlen(name, LOCK_MAX_NAME + 1) : 0;
    if (c == NULL || cb == NULL || c->free_pending)
        return -1;
    if (key == NULL || len == 0 || len > LOCK_MAX_MARK_KEY || memchr(key, '\0', len) != NULL) {
        lock_fmt(msg, sizeof(msg),
                 "invalid mark key: it must be 1..%d bytes without NUL bytes (got %zu bytes)",
                 LOCK_MAX_MARK_KEY, key ? len : 0);
        lock_mark_done(c, cb, arg, LOCK_INVALID, 0, msg);
        return 0;
    }
    if (token == 0 || token > (uint64_t)INT64_MAX) {
        lock_fmt(msg, sizeof(msg), "mark %.*s: token %llu out of range (1..2^63-1)", (int)len, key,
                 (unsigned long long)token);
        lock_mark_done(c, cb, arg, LOCK_INVALID, 0, msg);
        return 0;
    }
    if (holder && (nlen == 0 || nlen > LOCK_MAX_NAME)) {
        lock_fmt(msg, sizeof(msg), "invalid lock name: it must be 1..%d bytes", LOCK_MAX_NAME);
        lock_mark_done(c, cb, arg, LOCK_INVALID, 0, msg);
        return 0;
    }
    if (c->ops->mark_raise == NULL) {
        lock_fmt(msg, sizeof(msg), "the %s lock backend cannot hold marks", c->ops->scheme);
        lock_mark_done(c, cb, arg, LOCK_UNAVAILABLE, 0, msg);
        return 0;
    }
    c->ops->mark_raise(c, key, len, token, holder, name, nlen, cb, arg);
    return 0;
}

int lock_mark_raise(struct lock_client *c, const char *key, size_t len, uint64_t token,
                    lock_mark_cb cb, void *arg)
{
    return lock_mark_raise_as(c, NULL, NULL, key, len, token, cb, arg);
}

int lock_mark_raise_held(struct lock_session *s, const char *name, const char *key, size_t len,
                         uint64_t token, lock_mark_cb cb, void *arg)
{
    return s ? lock_mark_raise_as(s->c, s, name, key, len, token, cb, arg) : -1;
}

void lock_holder_lost(struct lock_client *c, uint64_t session_id)
{
    struct lock_session *s = lock_session_by_id(c, session_id);
    if (s)
        lock_session_renew_soon(s);
}

void lock_client_stats(const struct lock_client *c, struct lock_stats *out)
{
    if (out == NULL)
        return;
    if (c == NULL) {
        memset(out, 0, sizeof(*out));
        return;
    }
    *out = c->stats;
}
