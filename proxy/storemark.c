/* storemark.c — raises a lock's high-water mark in the Redis store before a token is handed out.
 *
 * "Fence on acquire": a paused former holder must be refused even before the new holder writes,
 * so the mark moves to the new token first. hiredis 0.14 has no command timeouts, so each call
 * carries its own timer; a call that timed out ignores its late reply. The store's host name is
 * looked up off the loop (resolve.h) before each connection; calls made meanwhile wait for it. */
#include "storemark.h"

#include <event2/event.h>
#include <hiredis/adapters/libevent.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "config.h"
#include "fence.h"
#include "log.h"
#include "resolve.h"

struct store_marks {
    struct event_base *base;
    char host[256];
    int port;
    char user[128], password[256];
    int db;
    long long timeout_ms;
    redisAsyncContext *ac;         /* NULL when disconnected */
    struct resolve_req *resolving; /* the host's lookup before a connection */
    struct event *flush;           /* writes this round's commands before the loop sleeps */
    struct sm_call *calls;         /* pending, for store_marks_free */
    uint64_t raised, regressions;
    char why[128]; /* why the last connection ended or failed, for the messages of its calls */
    long long answered_ms; /* when the connection last brought a reply */
    int prelude_left;      /* AUTH/SELECT answers still awaited: calls wait until none is */
};

struct sm_call {
    struct store_marks *m;
    struct sm_call *prev, *next;
    struct event *timer;
    lock_fence_done done;
    void *ctx;
    int finished; /* done() was called (timeout); the reply, when it comes, is ignored */
    int queued;   /* waits for a connection: not sent yet, so hiredis will not call back */
    long long made_ms;
    uint64_t token;
    int klen;
    char key[]; /* the mark's key */
};

static void sm_on_reply(redisAsyncContext *ac, void *reply, void *priv);
static void sm_fail_queued(struct store_marks *m, const char *why);

static void sm_unlink(struct sm_call *c)
{
    struct store_marks *m = c->m;

    if (!m)
        return;
    if (c->prev)
        c->prev->next = c->next;
    else
        m->calls = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->m = NULL;
}

static void sm_finish(struct sm_call *c, int status, uint64_t mark, const char *msg)
{
    if (c->finished)
        return;
    c->finished = 1;
    if (c->timer)
        evtimer_del(c->timer);
    c->done(c->ctx, status, mark, msg);
}

static void sm_on_disconnect(const redisAsyncContext *ac, int status)
{
    struct store_marks *m = ac->data;

    if (m && m->ac == ac) {
        m->ac = NULL; /* hiredis frees the context; pending callbacks get a NULL reply */
        snprintf(m->why, sizeof(m->why), "connection lost: %.100s",
                 ac->errstr[0] ? ac->errstr : "closed by the store");
        sm_fail_queued(m, m->why);
    }
}

static void sm_on_connect(const redisAsyncContext *ac, int status)
{
    struct store_marks *m = ac->data;

    if (status != REDIS_OK && m && m->ac == ac) {
        log_warn("store %s:%d: cannot connect to raise fence marks: %s", m->host, m->port,
                 ac->errstr);
        m->ac = NULL;
        snprintf(m->why, sizeof(m->why), "cannot connect: %.100s", ac->errstr);
        sm_fail_queued(m, m->why);
    }
}

/* hiredis writes a command only once the loop reports the socket writable: a wait for an event
 * that is already true, between a backend's answer and the token going out. Commands queued in
 * this round of the loop are written together at its end instead (hiredis's own write event,
 * armed and disarmed in the same round, then costs no system call: the base uses a changelist). */
static void sm_flush_cb(evutil_socket_t fd, short what, void *arg)
{
    struct store_marks *m = arg;

    if (m->ac && (m->ac->c.flags & REDIS_CONNECTED))
        redisAsyncHandleWrite(m->ac); /* a write error frees the context as its own event would */
}

/* Ends the connection with a reason for the messages of its calls, which fail: those sent are
 * called back with no reply, those queued at once. The next call connects afresh. */
static void sm_reset(struct store_marks *m, const char *why)
{
    redisAsyncContext *ac = m->ac;

    snprintf(m->why, sizeof(m->why), "%.120s", why);
    log_warn("store %s:%d: fence marks connection reset: %s", m->host, m->port, why);
    m->ac = NULL;
    redisAsyncFree(ac); /* from a hiredis callback, once it returns */
    sm_fail_queued(m, why);
}

/* Answers a call hiredis does not hold (queued, or refused by redisAsyncCommand) and frees it. */
static void sm_drop(struct sm_call *c, const char *msg)
{
    sm_finish(c, -1, 0, msg);
    sm_unlink(c);
    if (c->timer)
        event_free(c->timer);
    free(c);
}

/* Sends a queued call on the connection. */
static void sm_send(struct sm_call *c)
{
    struct store_marks *m = c->m;

    if (redisAsyncCommand(m->ac, sm_on_reply, c, "EVAL %s 1 %b %llu", fence_raise_script(), c->key,
                          (size_t)c->klen, (unsigned long long)c->token) != REDIS_OK) {
        char msg[300];
        snprintf(msg, sizeof(msg), "cannot send the fence mark to store %.100s:%d", m->host,
                 m->port);
        sm_drop(c, msg);
        return;
    }
    c->queued = 0;
    event_active(m->flush, EV_TIMEOUT, 0);
}

/* Sends the calls that waited for the connection. */
static void sm_send_queued(struct store_marks *m)
{
    struct sm_call *c, *next;

    for (c = m->calls; c; c = next) {
        next = c->next;
        if (c->queued)
            sm_send(c);
    }
}

/* The answer to AUTH or SELECT (priv names it). Calls are sent only once both are answered: a
 * raise sent behind a refused SELECT would run in database 0, where the store's fenced writes do
 * not look. A refusal ends the connection and fails its calls. */
static void sm_on_prelude(redisAsyncContext *ac, void *reply, void *priv)
{
    struct store_marks *m = ac->data;
    redisReply *r = reply;
    char why[128];

    if (!r || !m || m->ac != ac)
        return;
    m->answered_ms = clock_now_ms();
    if (r->type == REDIS_REPLY_ERROR) {
        snprintf(why, sizeof(why), "%s refused: %.*s", (const char *)priv,
                 (int)(r->len > 80 ? 80 : r->len), r->str);
        sm_reset(m, why);
    } else if (--m->prelude_left == 0) {
        sm_send_queued(m);
    }
}

/* Answers every queued call with "store HOST:PORT: why". */
static void sm_fail_queued(struct store_marks *m, const char *why)
{
    char msg[300];
    struct sm_call *c = m->calls, *next;

    snprintf(msg, sizeof(msg), "store %.100s:%d: %.150s, while raising the fence mark", m->host,
             m->port, why);
    for (; c; c = next) {
        next = c->next;
        if (c->queued)
            sm_drop(c, msg);
    }
}

static int sm_connect(struct store_marks *m, const char *addr)
{
    redisAsyncContext *ac = redisAsyncConnect(addr, m->port);

    if (!ac)
        return -1;
    if (ac->err) {
        redisAsyncFree(ac);
        return -1;
    }
    ac->data = m;
    if (redisLibeventAttach(ac, m->base) != REDIS_OK) {
        redisAsyncFree(ac);
        return -1;
    }
    redisAsyncSetConnectCallback(ac, sm_on_connect);
    redisAsyncSetDisconnectCallback(ac, sm_on_disconnect);
    if (m->password[0]) {
        if (m->user[0])
            redisAsyncCommand(ac, sm_on_prelude, "AUTH", "AUTH %s %s", m->user, m->password);
        else
            redisAsyncCommand(ac, sm_on_prelude, "AUTH", "AUTH %s", m->password);
    }
    if (m->db)
        redisAsyncCommand(ac, sm_on_prelude, "SELECT", "SELECT %d", m->db);
    m->prelude_left = (m->password[0] != '\0') + (m->db != 0);
    m->ac = ac;
    m->why[0] = '\0';
    return 0;
}

static void sm_on_reply(redisAsyncContext *ac, void *reply, void *priv)
{
    struct sm_call *c = priv;
    redisReply *r = reply;
    char msg[300];
    uint64_t mark;

    if (r && c->m)
        c->m->answered_ms = clock_now_ms();
    if (!c->finished) {
        struct store_marks *m = c->m;
        if (!r) {
            /* The store and why: the user must know which store to look at (a fence of
             * several stores fails as one). */
            if (m && m->why[0])
                snprintf(msg, sizeof(msg), "store %.100s:%d: %.80s, while raising the fence mark",
                         m->host, m->port, m->why);
            else if (m)
                snprintf(msg, sizeof(msg),
                         "store %.100s:%d: connection lost%s%.80s, while raising the "
                         "fence mark",
                         m->host, m->port, ac->errstr[0] ? ": " : "", ac->errstr);
            else
                snprintf(msg, sizeof(msg), "the store connection was closed");
            sm_finish(c, -1, 0, msg);
        } else if (r->type == REDIS_REPLY_INTEGER && r->integer == 0) {
            if (m)
                m->raised++;
            sm_finish(c, 0, 0, NULL);
        } else if (r->type == REDIS_REPLY_STRING && lock_token_parse(r->str, r->len, &mark) == 0 &&
                   mark > 0) {
            if (m)
                m->regressions++;
            snprintf(msg, sizeof(msg),
                     "the mark %" PRIu64 " in store %.100s:%d is at or above the new token", mark,
                     m ? m->host : "?", m ? m->port : 0);
            sm_finish(c, 1, mark, msg);
        } else {
            snprintf(msg, sizeof(msg), "store %.100s:%d refused the fence mark: %.*s",
                     m ? m->host : "?", m ? m->port : 0,
                     r->type == REDIS_REPLY_ERROR ? (int)r->len : 20,
                     r->type == REDIS_REPLY_ERROR ? r->str : "unexpected reply");
            sm_finish(c, -1, 0, msg);
        }
    }
    sm_unlink(c);
    if (c->timer)
        event_free(c->timer);
    free(c);
}

static void sm_on_timeout(evutil_socket_t fd, short what, void *arg)
{
    struct sm_call *c = arg;
    struct store_marks *m = c->m;
    /* Nothing came back on the connection since the call was made: a store that stopped
     * answering, or a network cut that TCP would sit out for many minutes. Calls would pile up
     * behind it; a new connection recovers as soon as the store is reachable again. */
    int silent = m && m->ac && m->answered_ms < c->made_ms;
    char msg[300], why[80];

    snprintf(msg, sizeof(msg),
             "store %.100s:%d did not answer within %lld ms while raising the fence mark%s",
             m ? m->host : "?", m ? m->port : 0, m ? m->timeout_ms : 0,
             m && m->resolving ? " (its name is still being looked up)" : "");
    snprintf(why, sizeof(why), "did not answer within %lld ms", m ? m->timeout_ms : 0);
    if (c->queued) {
        sm_drop(c, msg);
    } else if (!silent) {
        sm_finish(c, -1, 0, msg); /* the reply may still come; sm_on_reply frees the call then */
        return;
    }
    if (silent)
        sm_reset(m, why); /* calls a sent c back as failed, and frees it */
}

static void sm_resolved(const struct addrinfo *res, const char *err, void *arg)
{
    struct store_marks *m = arg;
    char addr[64];

    m->resolving = NULL;
    if (resolve_pick_host(res, addr, sizeof(addr)) < 0) {
        snprintf(m->why, sizeof(m->why), "%.120s", err);
        sm_fail_queued(m, err);
        return;
    }
    if (sm_connect(m, addr) < 0) {
        sm_fail_queued(m, "cannot connect");
        return;
    }
    if (m->prelude_left == 0)
        sm_send_queued(m);
}

void store_marks_hook(void *arg, const char *name, uint64_t token, lock_fence_done done, void *ctx)
{
    struct store_marks *m = arg;
    struct sm_call *c;
    char key[FENCE_MAX_LOCK + 64];
    int klen = fence_hwm_key(name, strlen(name), key, sizeof(key));
    struct timeval tv = {m->timeout_ms / 1000, (m->timeout_ms % 1000) * 1000};

    if (klen < 0) {
        done(ctx, -1, 0, "lock name too long for a fence mark");
        return;
    }
    c = calloc(1, sizeof(*c) + (size_t)klen);
    if (!c || !(c->timer = evtimer_new(m->base, sm_on_timeout, c))) {
        free(c);
        done(ctx, -1, 0, "out of memory");
        return;
    }
    c->m = m;
    c->done = done;
    c->ctx = ctx;
    c->token = token;
    c->klen = klen;
    c->made_ms = clock_now_ms();
    memcpy(c->key, key, (size_t)klen);
    c->next = m->calls;
    if (m->calls)
        m->calls->prev = c;
    m->calls = c;
    evtimer_add(c->timer, &tv); /* the deadline covers the lookup and the connect too */
    c->queued = 1;
    if (m->ac) {
        if (m->prelude_left == 0)
            sm_send(c);
        return; /* else sent once AUTH/SELECT are answered */
    }
    if (!m->resolving) {
        m->resolving = resolve_start(m->base, m->host, m->port, sm_resolved, m);
        if (!m->resolving)
            sm_fail_queued(m, "cannot resolve: out of memory or threads");
    }
}

struct store_marks *store_marks_new(struct event_base *base, const struct cfg_url *url,
                                    long long timeout_ms)
{
    struct store_marks *m = calloc(1, sizeof(*m));

    if (!m)
        return NULL;
    m->base = base;
    m->flush = event_new(base, -1, 0, sm_flush_cb, m);
    if (!m->flush) {
        free(m);
        return NULL;
    }
    snprintf(m->host, sizeof(m->host), "%s", url->hosts[0].host);
    m->port = url->hosts[0].port;
    snprintf(m->user, sizeof(m->user), "%s", url->user);
    snprintf(m->password, sizeof(m->password), "%s", url->password);
    m->db = url->db;
    m->timeout_ms = timeout_ms;
    return m;
}

void store_marks_free(struct store_marks *m)
{
    if (!m)
        return;
    resolve_cancel(m->resolving);
    while (m->calls) {
        struct sm_call *c = m->calls;
        if (c->queued) {
            sm_drop(c, "shutting down");
            continue;
        }
        sm_unlink(c);
        sm_finish(c, -1, 0, "shutting down");
    }
    if (m->ac) {
        redisAsyncContext *ac = m->ac;
        m->ac = NULL;
        ac->data = NULL;
        redisAsyncFree(ac); /* calls sm_on_reply(NULL) for each call, which frees it */
    }
    event_free(m->flush);
    free(m);
}

uint64_t store_marks_raised(const struct store_marks *m)
{
    return m->raised;
}

uint64_t store_marks_regressions(const struct store_marks *m)
{
    return m->regressions;
}
