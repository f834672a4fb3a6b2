/* test_lockclient_redis.c — the lock client against real redis-server processes this test starts
 * on free loopback ports (and kills at the end, also when a test fails or the process dies). */
#include <dlfcn.h>
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <ftw.h>
#include <hiredis/hiredis.h>
#include <malloc.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "../gai_gate.h"
#include "test_util.h"

#include "lock.h"

#define TEST_MAX_REDIS   4
#define TEST_MAX_CLIENTS 8
#define TEST_OP_TIMEOUT  500
#define TEST_PREFIX      "fencegate:"
#define RD_RETRY_SLACK   350 /* a sleeping waiter's next attempt comes within 200 ms */

#if defined(__SANITIZE_ADDRESS__)
#define TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#endif

/* ---- redis-server processes ---- */

struct redis_proc {
    pid_t pid;
    int port;
    char dir[64];
};

static struct redis_proc *g_procs[TEST_MAX_REDIS];

static redisContext *admin_connect(int port)
{
    struct timeval tv = {1, 0};
    redisContext *ctx = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (ctx == NULL)
        return NULL;
    if (ctx->err) {
        redisFree(ctx);
        return NULL;
    }
    tv.tv_sec = 2;
    redisSetTimeout(ctx, tv);
    return ctx;
}

/* Runs one command on a fresh admin connection; returns the reply (caller frees) or NULL. */
static redisReply *admin_v(int port, const char *fmt, va_list ap)
{
    redisContext *ctx = admin_connect(port);
    if (ctx == NULL)
        return NULL;
    redisReply *r = redisvCommand(ctx, fmt, ap);
    redisFree(ctx);
    return r;
}

/* An integer reply, -1 for nil, -1000 for no reply or an error. */
static long long admin_int(int port, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = admin_v(port, fmt, ap);
    va_end(ap);
    long long v = -1000;
    if (r && r->type == REDIS_REPLY_INTEGER)
        v = r->integer;
    else if (r && r->type == REDIS_REPLY_NIL)
        v = -1;
    else if (r && r->type == REDIS_REPLY_STRING)
        v = strtoll(r->str, NULL, 10);
    if (r)
        freeReplyObject(r);
    return v;
}

/* A string reply copied into out; returns 1, or 0 for nil / error. */
static int admin_str(int port, char *out, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = admin_v(port, fmt, ap);
    va_end(ap);
    int ok = 0;
    out[0] = '\0';
    if (r && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)) {
        snprintf(out, cap, "%s", r->str);
        ok = 1;
    }
    if (r)
        freeReplyObject(r);
    return ok;
}

static int redis_wait_up(int port, int timeout_ms)
{
    int64_t end = now_ms() + timeout_ms;
    while (now_ms() < end) {
        char pong[16];
        if (admin_str(port, pong, sizeof(pong), "PING") && strcmp(pong, "PONG") == 0)
            return 1;
        sleep_ms(20);
    }
    return 0;
}

/* Kills the server (SIGKILL, also when stopped) and reaps it. */
static void redis_kill(struct redis_proc *p)
{
    proc_kill(&p->pid);
}

/* Starts redis-server on p->port (a free one when 0) in p->dir (a new temp dir when empty). */
static int redis_start(struct redis_proc *p)
{
    char port[16], log[128];
    if (p->dir[0] == '\0') {
        snprintf(p->dir, sizeof(p->dir), "/tmp/fg-lockclient-XXXXXX");
        if (mkdtemp(p->dir) == NULL)
            return 0;
    }
    if (p->port == 0)
        p->port = free_port();
    if (p->port <= 0)
        return 0;
    snprintf(port, sizeof(port), "%d", p->port);
    snprintf(log, sizeof(log), "%s/redis.log", p->dir);
    char *argv[] = {
        "redis-server", "--save", "",      "--appendonly", "no",        "--bind", "127.0.0.1",
        "--port",       port,     "--dir", p->dir,         "--logfile", log,      NULL};
    pid_t pid = spawn_server(argv, NULL);
    if (pid < 0)
        return 0;
    p->pid = pid;
    for (int i = 0; i < TEST_MAX_REDIS; i++) {
        if (g_procs[i] == p)
            break;
        if (g_procs[i] == NULL) {
            g_procs[i] = p;
            break;
        }
    }
    if (!redis_wait_up(p->port, 5000)) {
        redis_kill(p);
        return 0;
    }
    return 1;
}

static void redis_destroy(struct redis_proc *p)
{
    redis_kill(p);
    if (p->dir[0])
        rm_tree(p->dir);
    p->dir[0] = '\0';
    for (int i = 0; i < TEST_MAX_REDIS; i++)
        if (g_procs[i] == p)
            g_procs[i] = NULL;
}

static void kill_all_redis(void)
{
    for (int i = 0; i < TEST_MAX_REDIS; i++)
        if (g_procs[i])
            redis_destroy(g_procs[i]);
}

static struct redis_proc g_redis; /* shared by the tests that do not kill their server */

/* ---- event loop and clients ---- */

static struct event_base *g_base;
static struct event *g_tick;
static struct lock_client *g_clients[TEST_MAX_CLIENTS];

static void tick_cb(evutil_socket_t fd, short what, void *arg)
{
}

static int run_until(const int *flag, int want, int timeout_ms)
{
    return loop_until(g_base, flag, want, timeout_ms);
}

static void run_for(int ms)
{
    loop_for(g_base, ms);
}

static int client_ready_flag(struct lock_client *c, int timeout_ms)
{
    int64_t end = now_ms() + timeout_ms;
    while (!lock_client_ready(c) && now_ms() < end)
        event_base_loop(g_base, EVLOOP_ONCE);
    return lock_client_ready(c);
}

static struct lock_client *client_new_url(const char *url, const struct lock_options *opt)
{
    char err[256];
    struct lock_options o;
    if (opt)
        o = *opt;
    else
        memset(&o, 0, sizeof(o));
    if (o.op_timeout_ms == 0)
        o.op_timeout_ms = TEST_OP_TIMEOUT;
    struct lock_client *c = lock_client_new(g_base, url, &o, err, sizeof(err));
    if (c == NULL) {
        print_error("lock_client_new(%s): %s\n", url, err);
        return NULL;
    }
    for (int i = 0; i < TEST_MAX_CLIENTS; i++) {
        if (g_clients[i] == NULL) {
            g_clients[i] = c;
            break;
        }
    }
    return c;
}

/* A client of redis on port, connected (or NULL). */
static struct lock_client *client_new(int port, const struct lock_options *opt)
{
    char url[64];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d", port);
    struct lock_client *c = client_new_url(url, opt);
    if (c && !client_ready_flag(c, 3000)) {
        print_error("client of port %d not ready\n", port);
        return NULL;
    }
    return c;
}

static void client_free(struct lock_client *c)
{
    for (int i = 0; i < TEST_MAX_CLIENTS; i++)
        if (g_clients[i] == c)
            g_clients[i] = NULL;
    lock_client_free(c);
}

/* ---- callbacks ---- */

struct acq {
    int done;
    int status;
    uint64_t token;
    int64_t at_ms;
    char msg[512];
};

static void acq_cb(void *arg, int status, uint64_t token, const char *msg)
{
    struct acq *a = arg;
    a->done++;
    a->status = status;
    a->token = token;
    a->at_ms = now_ms();
    snprintf(a->msg, sizeof(a->msg), "%s", msg ? msg : "(null)");
}

struct rel {
    int done;
    int status;
    char msg[512];
};

static void rel_cb(void *arg, int status, const char *msg)
{
    struct rel *r = arg;
    r->done++;
    r->status = status;
    snprintf(r->msg, sizeof(r->msg), "%s", msg ? msg : "(null)");
}

struct lost {
    int count;
    char name[LOCK_MAX_NAME + 1];
    uint64_t token;
    int64_t at_ms;
    char why[512];
};

static void lost_cb(void *arg, const char *name, uint64_t token, const char *why)
{
    struct lost *l = arg;
    l->count++;
    snprintf(l->name, sizeof(l->name), "%s", name);
    l->token = token;
    l->at_ms = now_ms();
    snprintf(l->why, sizeof(l->why), "%s", why);
}

/* Acquires name and runs the loop until the callback ran; returns the status (-1: no callback). */
static int acquire_sync(struct lock_session *s, const char *name, long long ttl, long long wait,
                        unsigned flags, struct acq *a)
{
    memset(a, 0, sizeof(*a));
    if (lock_acquire(s, name, strlen(name), ttl, wait, flags, acq_cb, a) != 0)
        return -2;
    int limit = (wait > 0 ? (int)wait : 0) + 3000;
    if (!run_until(&a->done, 1, limit))
        return -1;
    return a->status;
}

static int release_sync(struct lock_session *s, const char *name, struct rel *r)
{
    memset(r, 0, sizeof(*r));
    if (lock_release(s, name, strlen(name), rel_cb, r) != 0)
        return -2;
    if (!run_until(&r->done, 1, 3000))
        return -1;
    return r->status;
}

static long long key_exists(int port, const char *name)
{
    return admin_int(port, "EXISTS " TEST_PREFIX "lock:{%s}", name);
}

/* Subscribers of name's release channel. */
static long long numsub(int port, const char *name)
{
    char ch[128];
    snprintf(ch, sizeof(ch), TEST_PREFIX "released:{%s}", name);
    redisContext *ctx = admin_connect(port);
    if (ctx == NULL)
        return -1000;
    redisReply *r = redisCommand(ctx, "PUBSUB NUMSUB %s", ch);
    long long v = -1000;
    if (r && r->type == REDIS_REPLY_ARRAY && r->elements == 2 &&
        r->element[1]->type == REDIS_REPLY_INTEGER)
        v = r->element[1]->integer;
    if (r)
        freeReplyObject(r);
    redisFree(ctx);
    return v;
}

/* Waits (bounded) until the lock key of name exists (want 1) or not (want 0). */
static int wait_key(int port, const char *name, int want, int timeout_ms)
{
    int64_t end = now_ms() + timeout_ms;
    for (;;) {
        if (key_exists(port, name) == want)
            return 1;
        if (now_ms() >= end)
            return 0;
        run_for(10);
    }
}

/* ---- fixtures ---- */

static int group_setup(void **state)
{
    atexit(kill_all_redis);
    if (!redis_start(&g_redis)) {
        print_error("cannot start redis-server (is it on PATH?)\n");
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    kill_all_redis();
    return 0;
}

static int test_setup(void **state)
{
    g_base = event_base_new();
    if (g_base == NULL)
        return -1;
    /* A 5 ms heartbeat so that EVLOOP_ONCE always returns and every wait stays bounded. */
    g_tick = event_new(g_base, -1, EV_PERSIST, tick_cb, NULL);
    struct timeval tv = {0, 5000};
    event_add(g_tick, &tv);
    return 0;
}

static int test_teardown(void **state)
{
    gate(0); /* in case a test failed while lookups stalled */
    for (int i = 0; i < TEST_MAX_CLIENTS; i++) {
        if (g_clients[i]) {
            lock_client_free(g_clients[i]);
            g_clients[i] = NULL;
        }
    }
    event_free(g_tick);
    event_base_free(g_base);
    g_base = NULL;
    return 0;
}

/* ---- tests ---- */

static void test_invalid_arguments(void **state)
{
    char err[256];
    struct acq a;
    struct lock_options o;
    assert_null(lock_client_new(g_base, "etcd://127.0.0.1:99999", NULL, err, sizeof(err)));
    assert_non_null(strstr(err, "bad endpoint"));
    assert_null(lock_client_new(g_base, "etcd://127.0.0.1:2379/x", NULL, err, sizeof(err)));
    assert_non_null(strstr(err, "only etcd[s]://[user:password@]host:port"));
    /* A user needs a password, in the URL or in the options; no password is shown. */
    assert_null(lock_client_new(g_base, "etcd://u@127.0.0.1:2379", NULL, err, sizeof(err)));
    assert_non_null(strstr(err, "credentials must be user:password@"));
    assert_null(
        lock_client_new(g_base, "etcd://u:s3cr3t@127.0.0.1:2379/x", NULL, err, sizeof(err)));
    assert_null(strstr(err, "s3cr3t"));
    /* TLS files are loaded at once: a bad one fails the client with OpenSSL's reason. */
    memset(&o, 0, sizeof(o));
    snprintf(o.tls_ca_file, sizeof(o.tls_ca_file), "/nonexistent/ca.pem");
    assert_null(lock_client_new(g_base, "etcds://127.0.0.1:2379", &o, err, sizeof(err)));
    assert_non_null(strstr(err, "cannot load CA file '/nonexistent/ca.pem'"));
    struct lock_client *ec =
        lock_client_new(g_base, "etcd://127.0.0.1:1,127.0.0.1:2", NULL, err, sizeof(err));
    assert_non_null(ec); /* connects in the background */
    assert_int_equal(lock_client_ready(ec), 0);
    lock_client_free(ec);
    assert_null(lock_client_new(g_base, "http://127.0.0.1:1", NULL, err, sizeof(err)));
    assert_non_null(strstr(err, "scheme"));
    assert_null(lock_client_new(g_base, "redis://127.0.0.1:0", NULL, err, sizeof(err)));
    assert_non_null(strstr(err, "port"));
    assert_null(lock_client_new(g_base, "redis://127.0.0.1:6379/x", NULL, err, sizeof(err)));
    memset(&o, 0, sizeof(o));
    snprintf(o.prefix, sizeof(o.prefix), "bad{prefix}");
    assert_null(lock_client_new(g_base, "redis://127.0.0.1:6379", &o, err, sizeof(err)));
    assert_non_null(strstr(err, "prefix"));

    struct lock_client *c = client_new(g_redis.port, NULL);
    assert_non_null(c);
    assert_null(lock_session_new(c, 100, NULL, NULL));
    assert_null(lock_session_new(c, 3600001, NULL, NULL));
    struct lock_session *s = lock_session_new(c, 2000, NULL, NULL);
    assert_non_null(s);

    assert_int_equal(acquire_sync(s, "", 0, 0, 0, &a), LOCK_INVALID);
    assert_int_equal(acquire_sync(s, "inv1", 100, 0, 0, &a), LOCK_INVALID);
    assert_non_null(strstr(a.msg, "inv1"));
    char big[LOCK_MAX_NAME + 2];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    assert_int_equal(acquire_sync(s, big, 0, 0, 0, &a), LOCK_INVALID);
    big[LOCK_MAX_NAME] = '\0'; /* exactly the limit is fine */
    assert_int_equal(acquire_sync(s, big, 0, 0, 0, &a), LOCK_OK);

    struct rel r;
    assert_int_equal(release_sync(s, "never-taken", &r), LOCK_NOT_HELD);
    assert_non_null(strstr(r.msg, "never-taken"));
    assert_int_equal(lock_acquire(NULL, "x", 1, 0, 0, 0, acq_cb, &a), -1);
    client_free(c);

    /* Calls made before the client connected wait for the connection. */
    char url[64];
    snprintf(url, sizeof(url), "redis://127.0.0.1:%d", g_redis.port);
    c = client_new_url(url, NULL);
    assert_non_null(c);
    assert_false(lock_client_ready(c));
    s = lock_session_new(c, 2000, NULL, NULL);
    assert_int_equal(acquire_sync(s, "early-1", 0, 0, 0, &a), LOCK_OK);
    assert_true(lock_client_ready(c));
    client_free(c);
}

static void test_tokens_increase(void **state)
{
    struct acq a;
    struct rel r;
    uint64_t last = 0;
    const char *name = "tok-1";
    struct lock_client *c1 = client_new(g_redis.port, NULL);
    struct lock_client *c2 = client_new(g_redis.port, NULL);
    assert_non_null(c1);
    assert_non_null(c2);
    struct lock_session *s1 = lock_session_new(c1, 5000, NULL, NULL);
    struct lock_session *s2 = lock_session_new(c2, 5000, NULL, NULL);
    for (int i = 0; i < 100; i++) {
        assert_int_equal(acquire_sync(s1, name, 0, 0, 0, &a), LOCK_OK);
        assert_true(a.token > last);
        last = a.token;
        if (i == 0) { /* the key holds the owner id: 32 hex digits, ':', the session number */
            char owner[128];
            assert_true(admin_str(g_redis.port, owner, sizeof(owner),
                                  "GET " TEST_PREFIX "lock:{%s}", name));
            assert_int_equal(strlen(owner), 34);
            assert_int_equal(owner[32], ':');
            assert_int_equal(strspn(owner, "0123456789abcdef"), 32);
        }
        assert_int_equal(release_sync(s1, name, &r), LOCK_OK);
    }
    assert_int_equal(admin_int(g_redis.port, "GET " TEST_PREFIX "token:{%s}", name),
                     (long long)last);
    /* Two "sidecars" alternating. */
    for (int i = 0; i < 20; i++) {
        struct lock_session *s = i % 2 ? s1 : s2;
        assert_int_equal(acquire_sync(s, name, 0, 0, 0, &a), LOCK_OK);
        assert_true(a.token > last);
        last = a.token;
        assert_int_equal(release_sync(s, name, &r), LOCK_OK);
    }
    /* A sidecar restart: a new client with a new owner id. */
    char owner1[128], owner2[128];
    assert_int_equal(acquire_sync(s1, name, 0, 0, 0, &a), LOCK_OK);
    assert_true(a.token > last);
    last = a.token;
    assert_true(
        admin_str(g_redis.port, owner1, sizeof(owner1), "GET " TEST_PREFIX "lock:{%s}", name));
    client_free(c1);
    c1 = client_new(g_redis.port, NULL);
    assert_non_null(c1);
    s1 = lock_session_new(c1, 5000, NULL, NULL);
    assert_int_equal(acquire_sync(s1, name, 0, 0, 0, &a), LOCK_OK); /* freeing released it */
    assert_true(a.token > last);
    assert_true(
        admin_str(g_redis.port, owner2, sizeof(owner2), "GET " TEST_PREFIX "lock:{%s}", name));
    assert_string_not_equal(owner1, owner2);
    assert_memory_not_equal(owner1, owner2, 32);

    struct lock_stats st;
    lock_client_stats(c2, &st);
    assert_int_equal(st.acquired, 10);
    assert_int_equal(st.released, 10);
    client_free(c1);
    client_free(c2);
}

static void test_busy_and_reentrant(void **state)
{
    struct acq a, b;
    struct lock_client *c1 = client_new(g_redis.port, NULL);
    struct lock_client *c2 = client_new(g_redis.port, NULL);
    struct lock_session *s1 = lock_session_new(c1, 5000, NULL, NULL);
    struct lock_session *s2 = lock_session_new(c1, 5000, NULL, NULL);
    struct lock_session *s3 = lock_session_new(c2, 5000, NULL, NULL);
    assert_int_equal(acquire_sync(s1, "busy-1", 0, 0, 0, &a), LOCK_OK);
    uint64_t t = a.token;
    int64_t t0 = now_ms();
    assert_int_equal(acquire_sync(s2, "busy-1", 0, 0, 0, &b), LOCK_BUSY);
    assert_true(now_ms() - t0 < 200);
    assert_non_null(strstr(b.msg, "busy-1"));
    assert_int_equal(acquire_sync(s3, "busy-1", 0, 0, 0, &b), LOCK_BUSY);
    assert_non_null(strstr(b.msg, "busy-1"));
    /* The holder acquiring again gets its token, without a new grant. */
    assert_int_equal(acquire_sync(s1, "busy-1", 0, 0, 0, &b), LOCK_OK);
    assert_int_equal(b.token, t);
    /* Two acquires of one name in one session before any reply share one grant. */
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    assert_int_equal(lock_acquire(s2, "busy-2", 6, 0, 0, 0, acq_cb, &a), 0);
    assert_int_equal(lock_acquire(s2, "busy-2", 6, 0, 0, 0, acq_cb, &b), 0);
    assert_true(run_until(&b.done, 1, 2000));
    assert_true(run_until(&a.done, 1, 2000));
    assert_int_equal(a.status, LOCK_OK);
    assert_int_equal(b.status, LOCK_OK);
    assert_int_equal(a.token, b.token);
    uint64_t tok;
    long long rem;
    assert_int_equal(lock_state(s2, "busy-2", 6, &tok, &rem), 1);
    assert_int_equal(tok, a.token);
    assert_true(rem > 4000 && rem <= 5000);
    assert_int_equal(lock_count(s2), 1);
    assert_int_equal(lock_state(s3, "busy-2", 6, &tok, &rem), 0);
    struct lock_stats st;
    lock_client_stats(c2, &st);
    assert_int_equal(st.busy, 1);
    client_free(c1);
    client_free(c2);
}

/* A waiter is woken by the release announcement, not by its retry timer: its grant follows the
 * release within a few milliseconds every time, while a retry would come 50..200 ms later. */
static void test_waiter_woken_by_release(void **state)
{
    struct acq h, w;
    struct rel r;
    struct lock_client *ch = client_new(g_redis.port, NULL);
    struct lock_client *cw = client_new(g_redis.port, NULL);
    struct lock_session *sh = lock_session_new(ch, 10000, NULL, NULL);
    struct lock_session *sw = lock_session_new(cw, 10000, NULL, NULL);
    for (int round = 0; round < 5; round++) {
        assert_int_equal(acquire_sync(sh, "wake-1", 0, 0, 0, &h), LOCK_OK);
        memset(&w, 0, sizeof(w));
        assert_int_equal(lock_acquire(sw, "wake-1", 6, 0, 2000, 0, acq_cb, &w), 0);
        run_for(150 + 37 * round); /* the waiter is queued, subscribed and sleeping */
        assert_int_equal(w.done, 0);
        assert_int_equal(numsub(g_redis.port, "wake-1"), 1);
        memset(&r, 0, sizeof(r));
        int64_t t0 = now_ms();
        assert_int_equal(lock_release(sh, "wake-1", 6, rel_cb, &r), 0);
        assert_true(run_until(&w.done, 1, 2000));
        assert_int_equal(w.status, LOCK_OK);
        assert_true(w.token > h.token);
        int64_t latency = w.at_ms - t0;
        if (latency >= 30)
            print_error("round %d: granted %lld ms after the release\n", round, (long long)latency);
        assert_true(latency < 30);
        assert_true(run_until(&r.done, 1, 2000));
        assert_int_equal(r.status, LOCK_OK);
        assert_int_equal(release_sync(sw, "wake-1", &r), LOCK_OK);
        /* Nobody waits any more: the client unsubscribed. */
        int64_t end = now_ms() + 1000;
        while (numsub(g_redis.port, "wake-1") != 0 && now_ms() < end)
            run_for(10);
        assert_int_equal(numsub(g_redis.port, "wake-1"), 0);
    }
    client_free(ch);
    client_free(cw);
}

/* A Redis of the test's own with two clients on it, one session each (10 s leases), for the
 * tests that hold its writes back past op_timeout. Static in each test: redis_start() keeps the
 * address for the teardown. */
struct pair {
    struct redis_proc rp;
    struct lock_client *c, *other;
    struct lock_session *s, *so;
};

static void pair_start(struct pair *p)
{
    memset(p, 0, sizeof(*p));
    assert_true(redis_start(&p->rp));
    p->c = client_new(p->rp.port, NULL);
    p->other = client_new(p->rp.port, NULL);
    assert_non_null(p->c);
    assert_non_null(p->other);
    p->s = lock_session_new(p->c, 10000, NULL, NULL);
    p->so = lock_session_new(p->other, 10000, NULL, NULL);
}

/* Write commands, the lock scripts among them, wait 1.5 s: past op_timeout, so each client
 * resets a connection whose call is held back. */
static void pair_pause_writes(struct pair *p)
{
    char ok[16];
    assert_true(admin_str(p->rp.port, ok, sizeof(ok), "CLIENT PAUSE 1500 WRITE"));
}

static void pair_free(struct pair *p)
{
    client_free(p->c);
    client_free(p->other);
    redis_destroy(&p->rp);
}

/* A waiter whose attempt goes down with its connection (Redis holds writes back past
 * op_timeout, and the client resets the connection) goes on waiting while its WAIT has time
 * left, and gets the lock when the holder lets go; it was answered LOCK_UNAVAILABLE at once. */
static void test_waiter_survives_a_connection_reset(void **state)
{
    static struct pair p;
    struct acq h, w;
    struct rel r;
    pair_start(&p);
    assert_int_equal(acquire_sync(p.s, "wr-1", 0, 0, 0, &h), LOCK_OK);
    memset(&w, 0, sizeof(w));
    assert_int_equal(lock_acquire(p.so, "wr-1", 4, 0, 8000, 0, acq_cb, &w), 0);
    run_for(300); /* queued, trying every 50..200 ms */
    assert_int_equal(w.done, 0);
    pair_pause_writes(&p);
    run_for(1800); /* an attempt is held past op_timeout: its connection is reset */
    if (w.done)
        print_error("the waiter was answered %d: %s\n", w.status, w.msg);
    assert_int_equal(w.done, 0);
    assert_true(client_ready_flag(p.other, 3000));
    assert_int_equal(release_sync(p.s, "wr-1", &r), LOCK_OK);
    assert_true(run_until(&w.done, 1, 3000));
    assert_int_equal(w.status, LOCK_OK);
    assert_true(w.token > h.token);
    pair_free(&p);
}

static void test_waiters_fifo_and_deadline(void **state)
{
    struct acq h, w[3], late;
    struct rel r;
    struct lock_client *ch = client_new(g_redis.port, NULL);
    struct lock_client *cw = client_new(g_redis.port, NULL);
    struct lock_session *sh = lock_session_new(ch, 10000, NULL, NULL);
    struct lock_session *sw[3];
    assert_int_equal(acquire_sync(sh, "fifo-1", 0, 0, 0, &h), LOCK_OK);
    for (int i = 0; i < 3; i++) {
        sw[i] = lock_session_new(cw, 10000, NULL, NULL);
        memset(&w[i], 0, sizeof(w[i]));
        assert_int_equal(lock_acquire(sw[i], "fifo-1", 6, 0, 5000, 0, acq_cb, &w[i]), 0);
        run_for(20);
    }
    /* A try-once acquire behind queued waiters of the same client is BUSY at once. */
    assert_int_equal(acquire_sync(lock_session_new(cw, 1000, NULL, NULL), "fifo-1", 0, 0, 0, &late),
                     LOCK_BUSY);
    /* A waiter whose wait runs out gets BUSY at its deadline, naming the lock. */
    struct lock_session *sd = lock_session_new(cw, 10000, NULL, NULL);
    int64_t t0 = now_ms();
    assert_int_equal(acquire_sync(sd, "fifo-1", 0, 300, 0, &late), LOCK_BUSY);
    int64_t waited = late.at_ms - t0;
    assert_true(waited >= 295 && waited < 450);
    assert_non_null(strstr(late.msg, "fifo-1"));

    assert_int_equal(release_sync(sh, "fifo-1", &r), LOCK_OK);
    for (int i = 0; i < 3; i++) {
        assert_true(run_until(&w[i].done, 1, 2000));
        assert_int_equal(w[i].status, LOCK_OK);
        for (int j = i + 1; j < 3; j++)
            assert_int_equal(w[j].done, 0); /* in order: the later ones still wait */
        if (i > 0)
            assert_true(w[i].token > w[i - 1].token);
        run_for(30);
        assert_int_equal(release_sync(sw[i], "fifo-1", &r), LOCK_OK);
    }
    client_free(ch);
    client_free(cw);
}

static void test_norenew_lost_after_ttl(void **state)
{
    struct acq a;
    struct lost l;
    memset(&l, 0, sizeof(l));
    struct lock_client *c = client_new(g_redis.port, NULL);
    struct lock_session *s = lock_session_new(c, 5000, lost_cb, &l);
    struct lock_stats st0, st1;
    lock_client_stats(c, &st0);
    int64_t t0 = now_ms();
    assert_int_equal(acquire_sync(s, "norenew-1", 600, 0, LOCK_NORENEW, &a), LOCK_OK);
    run_for(300);
    assert_int_equal(lock_state(s, "norenew-1", 9, NULL, NULL), 1);
    assert_true(run_until(&l.count, 1, 1500));
    int64_t lived = l.at_ms - t0;
    assert_true(lived >= 590 && lived < 750);
    assert_string_equal(l.name, "norenew-1");
    assert_int_equal(l.token, a.token);
    uint64_t tok;
    assert_int_equal(lock_state(s, "norenew-1", 9, &tok, NULL), -1);
    assert_int_equal(tok, a.token);
    assert_int_equal(lock_count(s), 0);
    assert_true(wait_key(g_redis.port, "norenew-1", 0, 500));
    lock_client_stats(c, &st1);
    assert_int_equal(st1.renewals, st0.renewals);
    assert_int_equal(st1.renewal_round_trips, st0.renewal_round_trips);
    assert_int_equal(st1.lost, st0.lost + 1);
    /* Releasing a lost lock says so. */
    struct rel r;
    assert_int_equal(release_sync(s, "norenew-1", &r), LOCK_NOT_HELD);
    assert_int_equal(lock_state(s, "norenew-1", 9, NULL, NULL), 0);
    client_free(c);
}

static void test_renewed_lock_survives(void **state)
{
    struct acq a;
    struct lost l;
    memset(&l, 0, sizeof(l));
    struct lock_client *c = client_new(g_redis.port, NULL);
    struct lock_session *s = lock_session_new(c, 600, lost_cb, &l);
    assert_int_equal(acquire_sync(s, "renew-1", 0, 0, 0, &a), LOCK_OK);
    run_for(1800);
    long long rem;
    assert_int_equal(lock_state(s, "renew-1", 7, NULL, &rem), 1);
    assert_true(rem > 100 && rem <= 600);
    assert_int_equal(l.count, 0);
    assert_true(admin_int(g_redis.port, "PTTL " TEST_PREFIX "lock:{renew-1}") > 100);
    struct lock_stats st;
    lock_client_stats(c, &st);
    assert_true(st.renewals >= 7 && st.renewals <= 10);
    client_free(c);
}

static void test_renewals_batched_per_session(void **state)
{
    struct acq a[50];
    char name[32];
    struct lock_client *c = client_new(g_redis.port, NULL);
    struct lock_session *s = lock_session_new(c, 600, NULL, NULL);
    for (int i = 0; i < 50; i++) {
        snprintf(name, sizeof(name), "batch-%02d", i);
        memset(&a[i], 0, sizeof(a[i]));
        assert_int_equal(lock_acquire(s, name, strlen(name), 0, 0, 0, acq_cb, &a[i]), 0);
    }
    for (int i = 0; i < 50; i++) {
        assert_true(run_until(&a[i].done, 1, 3000));
        assert_int_equal(a[i].status, LOCK_OK);
    }
    struct lock_stats st0, st1;
    lock_client_stats(c, &st0);
    run_for(2000);
    lock_client_stats(c, &st1);
    uint64_t trips = st1.renewal_round_trips - st0.renewal_round_trips;
    uint64_t renewals = st1.renewals - st0.renewals;
    print_message("50 locks, ttl 600 ms, 2 s: %llu round trips, %llu renewals\n",
                  (unsigned long long)trips, (unsigned long long)renewals);
    assert_true(trips >= 9 && trips <= 11);
    assert_true(renewals >= 450 && renewals <= 550);
    assert_int_equal(lock_count(s), 50);
    client_free(c);
}

static void test_deleted_key_is_lost(void **state)
{
    struct acq a;
    struct lost l;
    memset(&l, 0, sizeof(l));
    struct lock_client *c = client_new(g_redis.port, NULL);
    struct lock_session *s = lock_session_new(c, 900, lost_cb, &l);
    assert_int_equal(acquire_sync(s, "del-1", 0, 0, 0, &a), LOCK_OK);
    assert_int_equal(acquire_sync(s, "del-2", 0, 0, 0, &a), LOCK_OK);
    run_for(100);
    assert_int_equal(admin_int(g_redis.port, "DEL " TEST_PREFIX "lock:{del-1}"), 1);
    int64_t t0 = now_ms();
    assert_true(run_until(&l.count, 1, 1000));
    assert_true(l.at_ms - t0 <= 400); /* at the next renewal (every 300 ms), not at expiry */
    assert_string_equal(l.name, "del-1");
    assert_non_null(strstr(l.why, "refused"));
    assert_int_equal(lock_state(s, "del-1", 5, NULL, NULL), -1);
    assert_int_equal(lock_state(s, "del-2", 5, NULL, NULL), 1);
    run_for(700);
    assert_int_equal(l.count, 1);
    assert_int_equal(lock_state(s, "del-2", 5, NULL, NULL), 1);
    /* Releasing a lock whose key someone else took over is NOT_HELD, and harmless. */
    char v[64];
    assert_true(admin_str(g_redis.port, v, sizeof(v), "SET " TEST_PREFIX "lock:{del-2} intruder"));
    struct rel r;
    assert_int_equal(release_sync(s, "del-2", &r), LOCK_NOT_HELD);
    assert_true(admin_str(g_redis.port, v, sizeof(v), "GET " TEST_PREFIX "lock:{del-2}"));
    assert_string_equal(v, "intruder");
    admin_int(g_redis.port, "DEL " TEST_PREFIX "lock:{del-2}");
    client_free(c);
}

/* Callbacks that free what called them: an acquire callback that frees the client while more
 * results are queued behind it (they are dropped, not run on freed memory), and a lost callback
 * that frees its session while the session's next loss is queued. */
struct freeing {
    int calls;
    struct lock_client *client;   /* freed by the first call, when set */
    struct lock_session *session; /* freed by the first call, when set */
};

static void freeing_acq_cb(void *arg, int status, uint64_t token, const char *msg)
{
    struct freeing *f = arg;
    (void)status;
    (void)token;
    (void)msg;
    if (f->calls++ == 0 && f->client)
        client_free(f->client);
}

static void freeing_lost_cb(void *arg, const char *name, uint64_t token, const char *why)
{
    struct freeing *f = arg;
    (void)name;
    (void)token;
    (void)why;
    if (f->calls++ == 0 && f->session)
        lock_session_free(f->session);
}

static void test_callbacks_may_free_their_session_or_client(void **state)
{
    struct acq a;
    struct freeing f;
    struct lock_client *c = client_new(g_redis.port, NULL);
    struct lock_session *s = lock_session_new(c, 5000, NULL, NULL);
    assert_int_equal(acquire_sync(s, "cbfree-1", 0, 0, 0, &a), LOCK_OK);
    /* Three answers queued at once (the lock is held: each is answered without the backend). */
    memset(&f, 0, sizeof(f));
    f.client = c;
    for (int i = 0; i < 3; i++)
        assert_int_equal(lock_acquire(s, "cbfree-1", 8, 0, 0, 0, freeing_acq_cb, &f), 0);
    run_for(50);
    assert_int_equal(f.calls, 1);
    /* Freeing the client released the lock. */
    assert_true(wait_key(g_redis.port, "cbfree-1", 0, 1000));

    c = client_new(g_redis.port, NULL);
    memset(&f, 0, sizeof(f));
    s = lock_session_new(c, 900, freeing_lost_cb, &f);
    f.session = s;
    assert_int_equal(acquire_sync(s, "cbfree-2", 0, 0, 0, &a), LOCK_OK);
    assert_int_equal(acquire_sync(s, "cbfree-3", 0, 0, 0, &a), LOCK_OK);
    admin_int(g_redis.port, "DEL " TEST_PREFIX "lock:{cbfree-2} " TEST_PREFIX "lock:{cbfree-3}");
    run_for(1200); /* the next renewal finds both gone: two losses in one turn */
    assert_int_equal(f.calls, 1);
    /* The client goes on serving other sessions. */
    struct lock_session *s2 = lock_session_new(c, 5000, NULL, NULL);
    assert_int_equal(acquire_sync(s2, "cbfree-2", 0, 0, 0, &a), LOCK_OK);
    client_free(c);
}

/* A caller that learns the key is gone (a store refused a write under it) has the session renew
 * at once, and the lock is reported lost long before the next tick. The key is named by
 * lock_client_redis_lock_prefix() and holds lock_owner(). */
static void test_renew_soon_finds_a_lost_key(void **state)
{
    struct acq a;
    struct lost l;
    char owner[LOCK_OWNER_MAX], v[LOCK_OWNER_MAX], cmd[256];
    memset(&l, 0, sizeof(l));
    struct lock_client *c = client_new(g_redis.port, NULL);
    struct lock_session *s = lock_session_new(c, 30000, lost_cb, &l); /* renews every 10 s */
    assert_int_equal(acquire_sync(s, "soon-1", 0, 0, 0, &a), LOCK_OK);
    assert_string_equal(lock_client_redis_lock_prefix(c), TEST_PREFIX "lock:");
    lock_owner(s, owner, sizeof(owner));
    snprintf(cmd, sizeof(cmd), "GET %s{soon-1}", lock_client_redis_lock_prefix(c));
    assert_true(admin_str(g_redis.port, v, sizeof(v), cmd));
    assert_string_equal(v, owner);
    lock_session_renew_soon(s); /* held: nothing changes */
    run_for(100);
    assert_int_equal(l.count, 0);
    assert_int_equal(admin_int(g_redis.port, "DEL " TEST_PREFIX "lock:{soon-1}"), 1);
    int64_t t0 = now_ms();
    lock_session_renew_soon(s);
    assert_true(run_until(&l.count, 1, 1000));
    assert_true(l.at_ms - t0 <= 200);
    assert_string_equal(l.name, "soon-1");
    assert_int_equal(lock_state(s, "soon-1", 6, NULL, NULL), -1);
    client_free(c);
}

struct hook {
    int calls;
    uint64_t mark;      /* the stores' high-water mark */
    uint64_t tokens[8]; /* tokens the hook saw */
    int fail;           /* report status < 0 */
    int defer;          /* keep done/ctx for the test to call */
    lock_fence_done done;
    void *ctx;
};

static void fence_hook(void *arg, const char *name, uint64_t token, lock_fence_done done, void *ctx)
{
    struct hook *h = arg;
    if (h->calls < 8)
        h->tokens[h->calls] = token;
    h->calls++;
    if (h->defer) {
        h->done = done;
        h->ctx = ctx;
        return;
    }
    if (h->fail) {
        done(ctx, -1, 0, "store ledger unreachable");
    } else if (token <= h->mark) {
        done(ctx, 1, h->mark, "stale");
    } else {
        h->mark = token;
        done(ctx, 0, 0, NULL);
    }
}

static void test_fence_hook_repairs_lost_counter(void **state)
{
    struct acq a;
    struct rel r;
    struct hook h;
    memset(&h, 0, sizeof(h));
    struct lock_options o;
    memset(&o, 0, sizeof(o));
    o.fence = fence_hook;
    o.fence_arg = &h;
    struct lock_client *c = client_new(g_redis.port, &o);
    struct lock_session *s = lock_session_new(c, 5000, NULL, NULL);
    assert_int_equal(acquire_sync(s, "fence-1", 0, 0, 0, &a), LOCK_OK);
    assert_int_equal(h.calls, 1);
    assert_int_equal(h.tokens[0], a.token);
    assert_int_equal(release_sync(s, "fence-1", &r), LOCK_OK);
    /* The counter is lost (failover, someone DEL'd it) while the stores remember 1000. */
    assert_int_equal(admin_int(g_redis.port, "DEL " TEST_PREFIX "token:{fence-1}"), 1);
    h.mark = 1000;
    h.calls = 0;
    assert_int_equal(acquire_sync(s, "fence-1", 0, 0, 0, &a), LOCK_OK);
    assert_int_equal(a.token, 1001);
    assert_int_equal(h.calls, 2);
    assert_int_equal(h.tokens[0], 1);
    assert_int_equal(h.tokens[1], 1001);
    assert_int_equal(admin_int(g_redis.port, "GET " TEST_PREFIX "token:{fence-1}"), 1001);
    struct lock_stats st;
    lock_client_stats(c, &st);
    assert_int_equal(st.token_repairs, 1);
    uint64_t tok;
    assert_int_equal(lock_state(s, "fence-1", 7, &tok, NULL), 1);
    assert_int_equal(tok, 1001);
    assert_int_equal(release_sync(s, "fence-1", &r), LOCK_OK);

    /* A hook that fails: the caller gets UNAVAILABLE with its reason and the key is released. */
    h.fail = 1;
    assert_int_equal(acquire_sync(s, "fence-1", 0, 0, 0, &a), LOCK_UNAVAILABLE);
    assert_non_null(strstr(a.msg, "store ledger unreachable"));
    assert_non_null(strstr(a.msg, "fence-1"));
    assert_int_equal(lock_state(s, "fence-1", 7, NULL, NULL), 0);
    assert_true(wait_key(g_redis.port, "fence-1", 0, 1000));

    /* A hook that answers later: nothing is reported before it does. */
    h.fail = 0;
    h.defer = 1;
    h.calls = 0;
    memset(&a, 0, sizeof(a));
    assert_int_equal(lock_acquire(s, "fence-2", 7, 0, 0, 0, acq_cb, &a), 0);
    assert_true(run_until(&h.calls, 1, 2000));
    run_for(100);
    assert_int_equal(a.done, 0);
    assert_int_equal(lock_state(s, "fence-2", 7, NULL, NULL), 0);
    h.done(h.ctx, 0, 0, NULL);
    assert_true(run_until(&a.done, 1, 1000));
    assert_int_equal(a.status, LOCK_OK);
    assert_int_equal(lock_state(s, "fence-2", 7, NULL, NULL), 1);

    /* A session freed while its hook runs: done() later is harmless, the lock is released. */
    struct lock_session *s2 = lock_session_new(c, 5000, NULL, NULL);
    h.calls = 0;
    memset(&a, 0, sizeof(a));
    assert_int_equal(lock_acquire(s2, "fence-3", 7, 0, 0, 0, acq_cb, &a), 0);
    assert_true(run_until(&h.calls, 1, 2000));
    assert_int_equal(key_exists(g_redis.port, "fence-3"), 1);
    lock_session_free(s2);
    h.done(h.ctx, 0, 0, NULL);
    run_for(100);
    assert_int_equal(a.done, 0);
    assert_true(wait_key(g_redis.port, "fence-3", 0, 1000));
    client_free(c);
}

/* Counters beyond 2^53, where a Lua number (a double) cannot tell neighbours apart: the acquire
 * and repair scripts hand tokens back exactly. */
static void test_tokens_beyond_2_53_are_exact(void **state)
{
    struct acq a;
    struct rel r;
    struct hook h;
    uint64_t v;
    memset(&h, 0, sizeof(h));
    struct lock_options o;
    memset(&o, 0, sizeof(o));
    o.fence = fence_hook;
    o.fence_arg = &h;
    struct lock_client *c = client_new(g_redis.port, &o);
    struct lock_session *s = lock_session_new(c, 5000, NULL, NULL);
    admin_int(g_redis.port, "SET " TEST_PREFIX "token:{big-1} 9007199254740992");
    assert_int_equal(acquire_sync(s, "big-1", 0, 0, 0, &a), LOCK_OK);
    assert_true(a.token == 9007199254740993ull);
    assert_true(h.tokens[0] == 9007199254740993ull);
    assert_int_equal(release_sync(s, "big-1", &r), LOCK_OK);
    /* A store's mark beyond the counter: repaired past it, exactly. */
    h.mark = 9007199254740995ull;
    h.calls = 0;
    assert_int_equal(acquire_sync(s, "big-1", 0, 0, 0, &a), LOCK_OK);
    assert_true(a.token == 9007199254740996ull);
    assert_int_equal(h.calls, 2);
    assert_int_equal(release_sync(s, "big-1", &r), LOCK_OK);
    client_free(c);

    assert_int_equal(lock_token_parse("0", 1, &v), 0);
    assert_true(v == 0);
    assert_int_equal(lock_token_parse("9223372036854775807", 19, &v), 0);
    assert_true(v == 9223372036854775807ull);
    assert_int_equal(lock_token_parse("9223372036854775808", 19, &v), -1);
    assert_int_equal(lock_token_parse("99999999999999999999", 20, &v), -1);
    assert_int_equal(lock_token_parse("", 0, &v), -1);
    assert_int_equal(lock_token_parse("-1", 2, &v), -1);
    assert_int_equal(lock_token_parse("12a", 3, &v), -1);
    assert_int_equal(lock_token_parse("1e5", 3, &v), -1);
}

static void test_session_free_releases(void **state)
{
    struct acq a, pending;
    struct lock_client *c1 = client_new(g_redis.port, NULL);
    struct lock_client *c2 = client_new(g_redis.port, NULL);
    struct lock_session *s1 = lock_session_new(c1, 10000, NULL, NULL);
    struct lock_session *s2 = lock_session_new(c2, 10000, NULL, NULL);
    struct lock_session *s3 = lock_session_new(c2, 10000, NULL, NULL);
    assert_int_equal(acquire_sync(s1, "free-1", 0, 0, 0, &a), LOCK_OK);
    assert_int_equal(acquire_sync(s1, "free-2", 0, 0, LOCK_NORENEW, &a), LOCK_OK);
    assert_int_equal(acquire_sync(s3, "free-3", 0, 0, 0, &a), LOCK_OK);
    memset(&pending, 0, sizeof(pending));
    assert_int_equal(lock_acquire(s1, "free-3", 6, 0, 5000, 0, acq_cb, &pending), 0);
    run_for(100);
    /* Another client (another connection: allow for the release to arrive first) gets them at
     * once, not after the 10 s lease. */
    lock_session_free(s1);
    int64_t t0 = now_ms();
    assert_int_equal(acquire_sync(s2, "free-1", 0, 1000, 0, &a), LOCK_OK);
    assert_int_equal(acquire_sync(s2, "free-2", 0, 1000, 0, &a), LOCK_OK);
    assert_true(now_ms() - t0 < 300);
    struct rel r;
    assert_int_equal(release_sync(s3, "free-3", &r), LOCK_OK);
    run_for(300);
    assert_int_equal(pending.done, 0); /* cancelled silently */
    assert_int_equal(key_exists(g_redis.port, "free-3"), 0);
    client_free(c1);
    /* Freeing a client releases its sessions' locks too. */
    struct lock_client *c3 = client_new(g_redis.port, NULL);
    struct lock_session *s4 = lock_session_new(c3, 10000, NULL, NULL);
    client_free(c2);
    t0 = now_ms();
    assert_int_equal(acquire_sync(s4, "free-1", 0, 1000, 0, &a), LOCK_OK);
    assert_true(now_ms() - t0 < 300);
    client_free(c3);
}

static void test_script_cache_flushed(void **state)
{
    struct acq a;
    struct lost l;
    memset(&l, 0, sizeof(l));
    struct lock_client *c = client_new(g_redis.port, NULL);
    struct lock_session *s = lock_session_new(c, 600, lost_cb, &l);
    assert_int_equal(acquire_sync(s, "flush-1", 0, 0, 0, &a), LOCK_OK);
    char ok[16];
    assert_true(admin_str(g_redis.port, ok, sizeof(ok), "SCRIPT FLUSH"));
    run_for(1000); /* renewals hit NOSCRIPT, reload, retry */
    assert_int_equal(l.count, 0);
    assert_int_equal(lock_state(s, "flush-1", 7, NULL, NULL), 1);
    assert_true(admin_str(g_redis.port, ok, sizeof(ok), "SCRIPT FLUSH"));
    assert_int_equal(acquire_sync(s, "flush-2", 0, 0, 0, &a), LOCK_OK);
    client_free(c);
}

/* A release and a new acquisition of one lock by one session, sent together (two HTTP clients
 * of one sidecar share its session) right after SCRIPT FLUSH, while only the acquire script is
 * cached again (another call's NOSCRIPT retry loaded it): the release must still run first. Were
 * it answered NOSCRIPT and sent again behind the grant, it would delete the grant's key, and the
 * session would hold a lock any other owner could take. */
static void test_script_flush_keeps_a_release_before_a_later_grant(void **state)
{
    struct acq a, again, other_a;
    struct rel r;
    struct lock_client *c = client_new(g_redis.port, NULL);
    struct lock_client *c2 = client_new(g_redis.port, NULL);
    struct lock_session *s = lock_session_new(c, 10000, NULL, NULL);
    struct lock_session *s2 = lock_session_new(c, 10000, NULL, NULL);
    struct lock_session *other = lock_session_new(c2, 10000, NULL, NULL);
    char ok[16];
    assert_int_equal(acquire_sync(s, "order-1", 0, 0, 0, &a), LOCK_OK);
    assert_true(admin_str(g_redis.port, ok, sizeof(ok), "SCRIPT FLUSH"));
    assert_int_equal(acquire_sync(s2, "order-2", 0, 0, 0, &other_a), LOCK_OK);
    memset(&r, 0, sizeof(r));
    memset(&again, 0, sizeof(again));
    assert_int_equal(lock_release(s, "order-1", 7, rel_cb, &r), 0);
    assert_int_equal(lock_acquire(s, "order-1", 7, 0, 0, 0, acq_cb, &again), 0);
    assert_true(run_until(&again.done, 1, 3000));
    assert_true(run_until(&r.done, 1, 3000));
    assert_int_equal(r.status, LOCK_OK);
    assert_int_equal(again.status, LOCK_OK);
    assert_true(again.token > a.token);
    run_for(100);
    assert_int_equal(lock_state(s, "order-1", 7, NULL, NULL), 1);
    assert_int_equal(key_exists(g_redis.port, "order-1"), 1);
    assert_int_equal(acquire_sync(other, "order-1", 0, 0, 0, &other_a), LOCK_BUSY);
    client_free(c2);
    client_free(c);
}

static void test_url_auth_and_db(void **state)
{
    struct acq a;
    char url[128], v[64];
    assert_true(
        admin_str(g_redis.port, v, sizeof(v), "ACL SETUSER fguser on >s3cr%%t ~* &* +@all"));
    snprintf(url, sizeof(url), "redis://fguser:s3cr%%25t@127.0.0.1:%d/3", g_redis.port);
    struct lock_client *c = client_new_url(url, NULL);
    assert_non_null(c);
    assert_true(client_ready_flag(c, 3000));
    struct lock_session *s = lock_session_new(c, 5000, NULL, NULL);
    assert_int_equal(acquire_sync(s, "auth-1", 0, 0, 0, &a), LOCK_OK);
    redisContext *ctx = admin_connect(g_redis.port);
    assert_non_null(ctx);
    redisReply *r = redisCommand(ctx, "SELECT 3");
    freeReplyObject(r);
    r = redisCommand(ctx, "EXISTS " TEST_PREFIX "lock:{auth-1}");
    assert_int_equal(r->integer, 1);
    freeReplyObject(r);
    redisFree(ctx);
    assert_int_equal(key_exists(g_redis.port, "auth-1"), 0); /* not in db 0 */
    client_free(c);

    snprintf(url, sizeof(url), "redis://fguser:wrong@127.0.0.1:%d", g_redis.port);
    c = client_new_url(url, NULL);
    assert_non_null(c);
    s = lock_session_new(c, 5000, NULL, NULL);
    assert_int_equal(acquire_sync(s, "auth-2", 0, 0, 0, &a), LOCK_UNAVAILABLE);
    assert_false(lock_client_ready(c));
    assert_non_null(strstr(a.msg, "AUTH"));
    client_free(c);
    admin_int(g_redis.port, "ACL DELUSER fguser");
}

/* A client logged in as a new ACL user with keys and commands but no pub/sub channels, as Redis 7
 * makes users by default (acl-pubsub-default resetchannels); ready. */
static struct lock_client *client_without_channels(const char *user)
{
    char url[128], v[64];
    assert_true(admin_str(g_redis.port, v, sizeof(v),
                          "ACL SETUSER %s on >pw ~* resetchannels +@all", user));
    snprintf(url, sizeof(url), "redis://%s:pw@127.0.0.1:%d", user, g_redis.port);
    struct lock_client *c = client_new_url(url, NULL);
    assert_non_null(c);
    assert_true(client_ready_flag(c, 3000));
    return c;
}

/* Redis 7 gives a new ACL user no pub/sub channels (acl-pubsub-default resetchannels): an
 * application's user made with keys and commands only. Its releases must still succeed (the
 * announcement is best effort; inside the script a refused PUBLISH came after the DEL and made
 * the release answer an error), and its waiters still get a freed lock, by their retry. */
static void test_acl_user_without_channels_releases(void **state)
{
    struct acq a, w;
    struct rel r;
    struct lock_client *c = client_without_channels("fgnochan");
    struct lock_session *s = lock_session_new(c, 5000, NULL, NULL);
    struct lock_session *sw = lock_session_new(c, 5000, NULL, NULL);
    for (int round = 0; round < 3; round++) {
        assert_int_equal(acquire_sync(s, "nochan", 0, 0, 0, &a), LOCK_OK);
        memset(&w, 0, sizeof(w));
        assert_int_equal(lock_acquire(sw, "nochan", 6, 0, 3000, 0, acq_cb, &w), 0);
        run_for(100);
        assert_int_equal(w.done, 0);
        int64_t t0 = now_ms();
        assert_int_equal(release_sync(s, "nochan", &r), LOCK_OK);
        assert_true(run_until(&w.done, 1, 1000));
        assert_int_equal(w.status, LOCK_OK);
        assert_true(w.at_ms - t0 <= RD_RETRY_SLACK);
        assert_int_equal(release_sync(sw, "nochan", &r), LOCK_OK);
    }
    client_free(c);
    assert_int_equal(admin_int(g_redis.port, "ACL DELUSER fgnochan"), 1);
}

/* A process frozen past its lease (here: not running the loop) must not think it holds the lock
 * when it resumes, even before any timer ran. */
static void test_frozen_process_sees_expiry(void **state)
{
    struct acq a;
    struct lost l;
    memset(&l, 0, sizeof(l));
    struct lock_client *c = client_new(g_redis.port, NULL);
    struct lock_session *s = lock_session_new(c, 600, lost_cb, &l);
    assert_int_equal(acquire_sync(s, "frozen-1", 0, 0, 0, &a), LOCK_OK);
    assert_int_equal(lock_state(s, "frozen-1", 8, NULL, NULL), 1);
    sleep_ms(700);
    assert_int_equal(lock_state(s, "frozen-1", 8, NULL, NULL), -1);
    assert_int_equal(lock_count(s), 0);
    assert_true(run_until(&l.count, 1, 1000));
    assert_string_equal(l.name, "frozen-1");
    /* The same session can take it again once Redis lets it go (or at once: the key is ours). */
    assert_int_equal(acquire_sync(s, "frozen-1", 0, 2000, 0, &a), LOCK_OK);
    assert_true(a.token > l.token);
    client_free(c);
}

static void test_memory_per_lock(void **state)
{
#ifdef TEST_ASAN
    skip();
#else
    enum { N = 2000 };
    static struct acq a[N];
    char name[64];
    struct lock_client *c = client_new(g_redis.port, NULL);
    struct lock_session *s = lock_session_new(c, 60000, NULL, NULL);
    run_for(50);
    struct mallinfo2 m0 = mallinfo2();
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof(name), "memory-test/lock-name-of-36-bytes-%04d", i);
        memset(&a[i], 0, sizeof(a[i]));
        assert_int_equal(lock_acquire(s, name, strlen(name), 0, 0, 0, acq_cb, &a[i]), 0);
    }
    for (int i = 0; i < N; i++) {
        assert_true(run_until(&a[i].done, 1, 5000));
        assert_int_equal(a[i].status, LOCK_OK);
    }
    run_for(50);
    struct mallinfo2 m1 = mallinfo2();
    long per = ((long)m1.uordblks - (long)m0.uordblks) / N;
    print_message("heap per held lock (name of %zu bytes): %ld bytes\n", strlen(name), per);
    assert_true(per > 0 && per <= 256);
    client_free(c);
#endif
}

static void test_redis_killed_and_restarted(void **state)
{
    static struct redis_proc rp;
    struct acq a, waiter, during, fresh;
    struct lost l1, l2;
    memset(&rp, 0, sizeof(rp));
    memset(&l1, 0, sizeof(l1));
    memset(&l2, 0, sizeof(l2));
    assert_true(redis_start(&rp));
    struct lock_client *c = client_new(rp.port, NULL);
    struct lock_client *other = client_new(rp.port, NULL);
    assert_non_null(c);
    assert_non_null(other);
    struct lock_session *s = lock_session_new(c, 1000, lost_cb, &l1);
    struct lock_session *slong = lock_session_new(c, 8000, lost_cb, &l2);
    struct lock_session *sw = lock_session_new(c, 1000, NULL, NULL);
    struct lock_session *so = lock_session_new(other, 10000, NULL, NULL);
    assert_int_equal(acquire_sync(s, "kill-1", 0, 0, 0, &a), LOCK_OK);
    assert_int_equal(acquire_sync(slong, "kill-long", 0, 0, 0, &a), LOCK_OK);
    assert_int_equal(acquire_sync(so, "kill-2", 0, 0, 0, &a), LOCK_OK);
    memset(&waiter, 0, sizeof(waiter));
    assert_int_equal(lock_acquire(sw, "kill-2", 6, 0, 10000, 0, acq_cb, &waiter), 0);
    run_for(500);
    assert_int_equal(waiter.done, 0);

    int64_t tk = now_ms();
    redis_kill(&rp);
    memset(&during, 0, sizeof(during));
    assert_int_equal(lock_acquire(sw, "kill-3", 6, 0, 0, 0, acq_cb, &during), 0);
    assert_true(run_until(&during.done, 1, 2000));
    assert_int_equal(during.status, LOCK_UNAVAILABLE);
    assert_true(during.at_ms - tk <= TEST_OP_TIMEOUT + 150);
    assert_non_null(strstr(during.msg, "redis 127.0.0.1"));
    assert_true(run_until(&waiter.done, 1, 2000));
    assert_int_equal(waiter.status, LOCK_UNAVAILABLE);
    assert_true(waiter.at_ms - tk <= TEST_OP_TIMEOUT + RD_RETRY_SLACK);
    assert_false(lock_client_ready(c));

    /* The held lock is lost at its local expiry: at most one lease after its last renewal. */
    assert_true(run_until(&l1.count, 1, 2000));
    int64_t after = l1.at_ms - tk;
    print_message("lost %lld ms after the kill (lease 1000 ms)\n", (long long)after);
    assert_true(after >= 600 && after <= 1100);
    assert_int_equal(lock_state(s, "kill-1", 6, NULL, NULL), -1);
    assert_int_equal(l2.count, 0); /* the long lease still runs */

    /* Back on the same port (empty: its keys are gone): reconnect, renewal finds kill-long
     * gone → lost before its lease ends; new acquires work. */
    assert_true(redis_start(&rp));
    assert_true(client_ready_flag(c, 8000));
    assert_true(run_until(&l2.count, 1, 3000));
    assert_non_null(strstr(l2.why, "refused"));
    assert_true(l2.at_ms - tk < 8000);
    assert_int_equal(acquire_sync(s, "kill-4", 0, 0, 0, &fresh), LOCK_OK);
    assert_true(fresh.token >= 1);
    assert_true(client_ready_flag(other, 8000));
    assert_int_equal(acquire_sync(so, "kill-5", 0, 0, 0, &fresh), LOCK_OK);
    client_free(c);
    client_free(other);
    redis_destroy(&rp);
}

/* A fixed-lease (LOCK_NORENEW) lock is never renewed, so nothing asked Redis about it after a
 * reconnect: when Redis came back empty (restarted without persistence), its holder was told it
 * held the lock for the rest of its lease while another owner could take it. After a reconnect
 * the client checks such locks too, and reports a vanished one lost at once. */
static void test_norenew_lock_lost_when_redis_comes_back_empty(void **state)
{
    static struct redis_proc rp;
    struct acq a, b;
    struct lost l;
    memset(&rp, 0, sizeof(rp));
    memset(&l, 0, sizeof(l));
    assert_true(redis_start(&rp));
    struct lock_client *c = client_new(rp.port, NULL);
    assert_non_null(c);
    struct lock_session *s = lock_session_new(c, 10000, lost_cb, &l);
    assert_int_equal(acquire_sync(s, "fixed-1", 10000, 0, LOCK_NORENEW, &a), LOCK_OK);
    assert_int_equal(acquire_sync(s, "fixed-2", 10000, 0, LOCK_NORENEW, &b), LOCK_OK);
    redis_kill(&rp);
    run_for(200);
    assert_true(redis_start(&rp)); /* the same port, empty */
    assert_true(client_ready_flag(c, 5000));
    int64_t t0 = now_ms();
    assert_true(run_until(&l.count, 2, 2000));
    assert_true(l.at_ms - t0 < 1000);
    assert_non_null(strstr(l.why, "gone"));
    assert_int_equal(lock_state(s, "fixed-1", 7, NULL, NULL), -1);
    assert_int_equal(lock_state(s, "fixed-2", 7, NULL, NULL), -1);
    /* One that Redis still has stays held (a reconnect alone is not a loss). */
    assert_int_equal(acquire_sync(s, "fixed-3", 10000, 0, LOCK_NORENEW, &a), LOCK_OK);
    assert_true(admin_int(rp.port, "CLIENT KILL TYPE normal") >= 1);
    run_for(300);
    assert_true(client_ready_flag(c, 5000));
    run_for(200);
    assert_int_equal(lock_state(s, "fixed-3", 7, NULL, NULL), 1);
    assert_int_equal(l.count, 2);
    client_free(c);
    redis_destroy(&rp);
}

/* Redis' host name is looked up off the loop: while the lookup stalls the loop keeps running, an
 * acquire waits for the connection as for any connect and is answered once, UNAVAILABLE within
 * op_timeout, naming the stalled lookup; once the name service answers, the client connects. A
 * client freed while its lookup runs is never called back. */
static void test_stalled_lookup_leaves_the_loop_running(void **state)
{
    char url[64];
    struct acq a, b;
    snprintf(url, sizeof(url), "redis://slow.test:%d", g_redis.port);
    gate(1);
    struct lock_client *c = client_new_url(url, NULL);
    assert_non_null(c);
    struct lock_session *s = lock_session_new(c, 5000, NULL, NULL);
    assert_non_null(s);
    memset(&a, 0, sizeof(a));
    int64_t t0 = now_ms();
    assert_int_equal(lock_acquire(s, "dns-1", 5, 0, 10000, 0, acq_cb, &a), 0);
    assert_true(run_for_worst(g_base, TEST_OP_TIMEOUT + 300) < 100);
    assert_int_equal(a.done, 1);
    assert_int_equal(a.status, LOCK_UNAVAILABLE);
    assert_true(a.at_ms - t0 <= TEST_OP_TIMEOUT + 100);
    print_message("while stalled: %s\n", a.msg);
    /* The call's deadline and the lookup's end together: whichever fires first, the message
     * names the lookup ("still being looked up", or the lookup's own timeout). */
    assert_true(strstr(a.msg, "slow.test") != NULL &&
                (strstr(a.msg, "looked up") || strstr(a.msg, "resolving 'slow.test' timed out")));
    assert_false(lock_client_ready(c));
    run_for(TEST_OP_TIMEOUT); /* a lookup gave up by now */
    assert_int_equal(acquire_sync(s, "dns-1", 0, 0, 0, &b), LOCK_UNAVAILABLE);
    assert_non_null(strstr(b.msg, "resolving 'slow.test' timed out after 500 ms"));

    gate(0);
    assert_true(client_ready_flag(c, 3000));
    assert_int_equal(acquire_sync(s, "dns-1", 0, 0, 0, &b), LOCK_OK);
    assert_int_equal(a.done, 1); /* the first acquire was answered once */
    struct rel r;
    assert_int_equal(release_sync(s, "dns-1", &r), LOCK_OK);

    gate(1);
    struct lock_client *c2 = client_new_url(url, NULL);
    assert_non_null(c2);
    run_for(50);
    client_free(c2);
    gate(0);
    run_for(200); /* the lookup ends with nobody waiting for it */
    client_free(c);
}

static void test_redis_stopped_times_out(void **state)
{
    static struct redis_proc rp;
    struct acq a, stuck, b;
    struct lost l;
    memset(&rp, 0, sizeof(rp));
    memset(&l, 0, sizeof(l));
    assert_true(redis_start(&rp));
    struct lock_client *c = client_new(rp.port, NULL);
    struct lock_client *other = client_new(rp.port, NULL);
    struct lock_session *s = lock_session_new(c, 1000, lost_cb, &l);
    struct lock_session *so = lock_session_new(other, 5000, NULL, NULL);
    assert_int_equal(acquire_sync(s, "stop-1", 0, 0, 0, &a), LOCK_OK);
    run_for(100);

    int64_t ts = now_ms();
    kill(rp.pid, SIGSTOP);
    memset(&stuck, 0, sizeof(stuck));
    assert_int_equal(lock_acquire(s, "stop-2", 6, 10000, 0, 0, acq_cb, &stuck), 0);
    assert_true(run_until(&stuck.done, 1, 2000));
    assert_int_equal(stuck.status, LOCK_UNAVAILABLE);
    int64_t waited = stuck.at_ms - ts;
    assert_true(waited >= TEST_OP_TIMEOUT - 20 && waited <= TEST_OP_TIMEOUT + 150);
    assert_non_null(strstr(stuck.msg, "no reply"));
    assert_true(run_until(&l.count, 1, 2000));
    assert_true(l.at_ms - ts <= 1100);
    run_for(300);
    kill(rp.pid, SIGCONT);

    /* The acquire that timed out runs once Redis resumes (its lease is 10 s); the client gives
     * it back as soon as it reconnects. */
    assert_true(client_ready_flag(c, 8000));
    assert_true(wait_key(rp.port, "stop-2", 0, 3000));
    assert_true(client_ready_flag(other, 8000));
    assert_int_equal(acquire_sync(so, "stop-2", 0, 0, 0, &b), LOCK_OK);
    assert_int_equal(acquire_sync(so, "stop-1", 0, 2000, 0, &b), LOCK_OK); /* lease ran out */
    client_free(c);
    client_free(other);
    redis_destroy(&rp);
}

/* Fire-and-forget releases (a session freed, a grant whose reply was lost, a lock given up) whose
 * connection is reset before they are answered (here Redis holds writes back past op_timeout)
 * go out again on the next connection: the keys do not stay held by nobody for their lease. */
static void test_lost_fire_and_forget_release_is_sent_again(void **state)
{
    static struct pair p;
    struct acq a, b;
    pair_start(&p);
    assert_int_equal(acquire_sync(p.s, "ff-1", 0, 0, 0, &a), LOCK_OK);
    assert_int_equal(acquire_sync(p.s, "ff-2", 0, 0, 0, &a), LOCK_OK);
    pair_pause_writes(&p);
    int64_t t0 = now_ms();
    lock_session_free(p.s); /* one release of both keys, held back past op_timeout */
    run_for(TEST_OP_TIMEOUT + 200);
    assert_int_equal(key_exists(p.rp.port, "ff-1"), 1);
    /* Redis answers again after 1.5 s; the keys go well before their 10 s lease ends. */
    assert_true(wait_key(p.rp.port, "ff-1", 0, 4000));
    assert_true(wait_key(p.rp.port, "ff-2", 0, 500));
    assert_true(now_ms() - t0 < 6000);
    assert_true(client_ready_flag(p.other, 3000));
    assert_int_equal(acquire_sync(p.so, "ff-1", 0, 0, 0, &b), LOCK_OK);
    pair_free(&p);
}

/* A release whose reply never comes (Redis holds it back: CLIENT PAUSE past op_timeout, and the
 * client then resets the connection, so Redis drops the command unrun) fails with
 * LOCK_UNAVAILABLE; its key must not stay held by nobody for the rest of its lease: the release
 * goes out again, owner-checked, on the next connection. */
static void test_release_without_reply_frees_the_key(void **state)
{
    static struct pair p;
    struct acq a, b;
    struct rel r;
    pair_start(&p);
    assert_int_equal(acquire_sync(p.s, "rel-lost", 0, 0, 0, &a), LOCK_OK);
    pair_pause_writes(&p);
    int64_t t0 = now_ms();
    assert_int_equal(release_sync(p.s, "rel-lost", &r), LOCK_UNAVAILABLE);
    assert_true(now_ms() - t0 <= TEST_OP_TIMEOUT + 300);
    assert_int_equal(lock_state(p.s, "rel-lost", 8, NULL, NULL), 0);
    /* Redis answers again after 1.5 s; the key is freed well before its 10 s lease ends. */
    assert_true(wait_key(p.rp.port, "rel-lost", 0, 4000));
    assert_true(now_ms() - t0 < 6000);
    assert_true(client_ready_flag(p.other, 3000));
    assert_int_equal(acquire_sync(p.so, "rel-lost", 0, 0, 0, &b), LOCK_OK);
    assert_true(b.token > a.token);
    pair_free(&p);
}

static long long conns_received(int port)
{
    char buf[8192];
    redisContext *ctx = admin_connect(port);
    if (ctx == NULL)
        return -1;
    redisReply *r = redisCommand(ctx, "INFO stats");
    long long v = -1;
    if (r && r->type == REDIS_REPLY_STRING) {
        snprintf(buf, sizeof(buf), "%s", r->str);
        char *p = strstr(buf, "total_connections_received:");
        if (p)
            v = strtoll(p + strlen("total_connections_received:"), NULL, 10);
    }
    if (r)
        freeReplyObject(r);
    redisFree(ctx);
    return v;
}

/* A subscriber connection that Redis refuses (an ACL user without pub/sub channels: SUBSCRIBE
 * answers an error and hiredis closes the connection) backs off as the lock connection does; it
 * reconnected every 100..200 ms, with AUTH, for as long as the client lived. */
static void test_refused_subscriber_backs_off(void **state)
{
    struct acq a;
    struct lock_client *c = client_without_channels("fgnochan2");
    run_for(300);
    long long before = conns_received(g_redis.port);
    run_for(3000);
    long long made = conns_received(g_redis.port) - before - 1; /* less the admin's own */
    print_message("connections made in 3 s: %lld\n", made);
    assert_true(made >= 0 && made <= 8);
    struct lock_session *s = lock_session_new(c, 5000, NULL, NULL);
    assert_int_equal(acquire_sync(s, "nochan-2", 0, 0, 0, &a), LOCK_OK);
    client_free(c);
    assert_int_equal(admin_int(g_redis.port, "ACL DELUSER fgnochan2"), 1);
}

/* ---- high-water marks in the backend (lock_mark_raise) ---- */

struct mark {
    int done;
    int status;
    uint64_t mark;
    int64_t at_ms;
    char msg[512];
};

static void mark_cb(void *arg, int status, uint64_t m, const char *msg)
{
    struct mark *k = arg;
    k->done++;
    k->status = status;
    k->mark = m;
    k->at_ms = now_ms();
    snprintf(k->msg, sizeof(k->msg), "%s", msg ? msg : "(null)");
}

/* Raises key's mark to token (with s: lock_mark_raise_held() for s's lock `name`) and runs the
 * loop until the callback ran; returns the status (-1: no callback within 3 s, -2: not queued).
 * The callback must never run inside the call. */
static int mark_sync_as(struct lock_client *c, struct lock_session *s, const char *name,
                        const char *key, uint64_t token, struct mark *k)
{
    memset(k, 0, sizeof(*k));
    if ((s ? lock_mark_raise_held(s, name, key, strlen(key), token, mark_cb, k)
           : lock_mark_raise(c, key, strlen(key), token, mark_cb, k)) != 0)
        return -2;
    if (k->done != 0)
        return -3;
    if (!run_until(&k->done, 1, 3000))
        return -1;
    return k->status;
}

static int mark_sync(struct lock_client *c, const char *key, uint64_t token, struct mark *k)
{
    return mark_sync_as(c, NULL, NULL, key, token, k);
}

static void test_mark_raise(void **state)
{
    struct mark k;
    char v[64];
    struct lock_client *c = client_new(g_redis.port, NULL);
    assert_non_null(c);
    admin_int(g_redis.port, "DEL " TEST_PREFIX "mark:{blobs/m1}");

    /* No mark yet: raised. Higher: raised. Equal: passes. Lower: refused with the mark. */
    assert_int_equal(mark_sync(c, "blobs/m1", 5, &k), LOCK_OK);
    assert_int_equal(k.mark, 5);
    assert_true(admin_str(g_redis.port, v, sizeof(v), "GET " TEST_PREFIX "mark:{blobs/m1}"));
    assert_string_equal(v, "5");
    assert_int_equal(mark_sync(c, "blobs/m1", 41, &k), LOCK_OK);
    assert_int_equal(mark_sync(c, "blobs/m1", 41, &k), LOCK_OK);
    assert_int_equal(mark_sync(c, "blobs/m1", 9, &k), LOCK_STALE); /* 9 > "41" as text */
    assert_int_equal(k.mark, 41);
    assert_non_null(strstr(k.msg, "41"));
    assert_true(admin_str(g_redis.port, v, sizeof(v), "GET " TEST_PREFIX "mark:{blobs/m1}"));
    assert_string_equal(v, "41");
    /* Keys are independent. */
    assert_int_equal(mark_sync(c, "blobs/m2", 3, &k), LOCK_OK);

    /* Near 2^63: exact, where Lua doubles could not tell these apart. */
    assert_int_equal(mark_sync(c, "big", 9007199254740993ull, &k), LOCK_OK);
    assert_int_equal(mark_sync(c, "big", 9007199254740992ull, &k), LOCK_STALE);
    assert_true(k.mark == 9007199254740993ull);
    assert_int_equal(mark_sync(c, "big", 9223372036854775806ull, &k), LOCK_OK);
    assert_int_equal(mark_sync(c, "big", 9223372036854775807ull, &k), LOCK_OK);
    assert_int_equal(mark_sync(c, "big", 9223372036854775806ull, &k), LOCK_STALE);
    assert_true(k.mark == 9223372036854775807ull);
    assert_true(admin_str(g_redis.port, v, sizeof(v), "GET " TEST_PREFIX "mark:{big}"));
    assert_string_equal(v, "9223372036854775807");

    /* Bad input, answered without the backend. */
    assert_int_equal(mark_sync(c, "", 5, &k), LOCK_INVALID);
    assert_non_null(strstr(k.msg, "mark key"));
    assert_int_equal(mark_sync(c, "big", 0, &k), LOCK_INVALID);
    assert_int_equal(mark_sync(c, "big", 9223372036854775808ull, &k), LOCK_INVALID);
    assert_non_null(strstr(k.msg, "out of range"));
    assert_int_equal(lock_mark_raise(c, "x", 1, 1, NULL, NULL), -1);

    /* A mark that is not a number proves nothing: fail closed, leave it alone. */
    admin_int(g_redis.port, "SET " TEST_PREFIX "mark:{junk} abc");
    assert_int_equal(mark_sync(c, "junk", 7, &k), LOCK_UNAVAILABLE);
    assert_true(admin_str(g_redis.port, v, sizeof(v), "GET " TEST_PREFIX "mark:{junk}"));
    assert_string_equal(v, "abc");

    /* Lost script cache: reloaded, and the raise still answers. */
    admin_int(g_redis.port, "SCRIPT FLUSH");
    assert_int_equal(mark_sync(c, "blobs/m1", 42, &k), LOCK_OK);
    client_free(c);
}

/* lock_mark_raise_held(): the mark moves only while the lock key names the session, in the same
 * script; otherwise LOCK_LOST, the mark unchanged, and the session reports the lock lost at once
 * (its next renewal is 10 s away). */
static void test_mark_raise_held(void **state)
{
    struct acq a;
    struct lost l;
    struct mark k;
    char v[64];
    memset(&l, 0, sizeof(l));
    struct lock_client *c = client_new(g_redis.port, NULL);
    struct lock_session *s = lock_session_new(c, 30000, lost_cb, &l);
    struct lock_session *o = lock_session_new(c, 30000, NULL, NULL);
    admin_int(g_redis.port, "DEL " TEST_PREFIX "mark:{svc/h1}");
    assert_int_equal(acquire_sync(s, "h1", 0, 0, 0, &a), LOCK_OK);

    assert_int_equal(mark_sync_as(c, s, "h1", "svc/h1", a.token, &k), LOCK_OK);
    assert_true(admin_str(g_redis.port, v, sizeof(v), "GET " TEST_PREFIX "mark:{svc/h1}"));
    assert_int_equal(strtoull(v, NULL, 10), a.token);
    /* Another session of the same client, with the very token: not its lock. */
    assert_int_equal(mark_sync_as(c, o, "h1", "svc/h1", a.token + 1, &k), LOCK_LOST);
    assert_non_null(strstr(k.msg, "h1"));
    assert_true(admin_str(g_redis.port, v, sizeof(v), "GET " TEST_PREFIX "mark:{svc/h1}"));
    assert_int_equal(strtoull(v, NULL, 10), a.token);
    /* The grant rolled back (key gone, as a failover to a lagging replica leaves it): refused,
     * and the session finds the lock lost without waiting for its renewal. */
    assert_int_equal(admin_int(g_redis.port, "DEL " TEST_PREFIX "lock:{h1}"), 1);
    int64_t t0 = now_ms();
    assert_int_equal(mark_sync_as(c, s, "h1", "svc/h1", a.token, &k), LOCK_LOST);
    assert_non_null(strstr(k.msg, "not held by this session"));
    assert_true(run_until(&l.count, 1, 1000));
    assert_true(l.at_ms - t0 <= 300);
    assert_int_equal(lock_state(s, "h1", 2, NULL, NULL), -1);
    /* Bad name: answered without the backend. */
    assert_int_equal(mark_sync_as(c, s, "", "svc/h1", 5, &k), LOCK_INVALID);
    assert_int_equal(lock_mark_raise_held(NULL, "h1", "svc/h1", 6, 5, mark_cb, &k), -1);
    client_free(c);
}

static void test_mark_backend_down(void **state)
{
    static struct redis_proc rp;
    struct mark k;
    memset(&rp, 0, sizeof(rp));
    assert_true(redis_start(&rp));
    struct lock_client *c = client_new(rp.port, NULL);
    assert_non_null(c);
    assert_int_equal(mark_sync(c, "down", 10, &k), LOCK_OK);

    /* Stopped: no reply within the op timeout. */
    int64_t t0 = now_ms();
    kill(rp.pid, SIGSTOP);
    assert_int_equal(mark_sync(c, "down", 11, &k), LOCK_UNAVAILABLE);
    assert_true(k.at_ms - t0 <= TEST_OP_TIMEOUT + 150);
    assert_non_null(strstr(k.msg, "no reply"));
    kill(rp.pid, SIGCONT);
    assert_true(client_ready_flag(c, 8000));
    assert_int_equal(mark_sync(c, "down", 12, &k), LOCK_OK);

    /* Killed: unavailable, never "raised". */
    t0 = now_ms();
    redis_kill(&rp);
    assert_int_equal(mark_sync(c, "down", 13, &k), LOCK_UNAVAILABLE);
    assert_true(k.at_ms - t0 <= TEST_OP_TIMEOUT + 150);
    client_free(c);
    redis_destroy(&rp);
}

/* Random acquires, releases and session churn over two clients: at no moment do two sessions
 * hold one lock, and the tokens of a lock only grow in the order the grants are reported. */
enum { SOAK_C = 2, SOAK_S = 4, SOAK_N = 5 };

struct soak_req {
    int pending;
    int ni;
};

static uint64_t soak_last[SOAK_N];
static int soak_bad_tokens, soak_grants, soak_busy, soak_errors;

static void soak_cb(void *arg, int status, uint64_t token, const char *msg)
{
    struct soak_req *q = arg;
    q->pending = 0;
    if (status == LOCK_OK) {
        if (token < soak_last[q->ni])
            soak_bad_tokens++;
        soak_last[q->ni] = token;
        soak_grants++;
    } else if (status == LOCK_BUSY) {
        soak_busy++;
    } else {
        print_error("soak: status %d: %s\n", status, msg);
        soak_errors++;
    }
}

static void test_random_operations_keep_exclusion(void **state)
{
    static struct soak_req req[SOAK_C][SOAK_S][SOAK_N];
    struct lock_client *c[SOAK_C];
    struct lock_session *s[SOAK_C][SOAK_S];
    char names[SOAK_N][16];
    unsigned seed = (unsigned)time(NULL);
    int overlaps = 0, frees = 0;
    print_message("soak seed %u\n", seed);
    srand(seed);
    memset(req, 0, sizeof(req));
    for (int n = 0; n < SOAK_N; n++)
        snprintf(names[n], sizeof(names[n]), "soak-%d", n);
    for (int i = 0; i < SOAK_C; i++) {
        c[i] = client_new(g_redis.port, NULL);
        assert_non_null(c[i]);
        for (int j = 0; j < SOAK_S; j++)
            s[i][j] = lock_session_new(c[i], 600, NULL, NULL);
    }
    int64_t end = now_ms() + 3000;
    while (now_ms() < end) {
        int ci = rand() % SOAK_C, si = rand() % SOAK_S, ni = rand() % SOAK_N, op = rand() % 40;
        struct soak_req *q = &req[ci][si][ni];
        if (op < 20 && !q->pending) {
            static const long long waits[] = {0, 0, 50, 300, 1000};
            q->pending = 1;
            q->ni = ni;
            assert_int_equal(lock_acquire(s[ci][si], names[ni], strlen(names[ni]),
                                          rand() % 2 ? 0 : 800, waits[rand() % 5],
                                          rand() % 4 ? 0 : LOCK_NORENEW, soak_cb, q),
                             0);
        } else if (op < 38) {
            assert_int_equal(lock_release(s[ci][si], names[ni], strlen(names[ni]), NULL, NULL), 0);
        } else if (op == 39) {
            lock_session_free(s[ci][si]); /* its pending acquires end silently */
            frees++;
            for (int n = 0; n < SOAK_N; n++)
                req[ci][si][n].pending = 0;
            s[ci][si] = lock_session_new(c[ci], 600, NULL, NULL);
        }
        event_base_loop(g_base, EVLOOP_ONCE);
        for (int n = 0; n < SOAK_N; n++) {
            int holders = 0;
            for (int i = 0; i < SOAK_C; i++)
                for (int j = 0; j < SOAK_S; j++)
                    holders += lock_state(s[i][j], names[n], strlen(names[n]), NULL, NULL) == 1;
            overlaps += holders > 1;
        }
    }
    print_message("soak: %d grants, %d busy, %d session frees\n", soak_grants, soak_busy, frees);
    assert_int_equal(overlaps, 0);
    assert_int_equal(soak_bad_tokens, 0);
    assert_int_equal(soak_errors, 0);
    assert_true(soak_grants > 100);
    for (int i = 0; i < SOAK_C; i++)
        client_free(c[i]);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_invalid_arguments, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_tokens_increase, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_stalled_lookup_leaves_the_loop_running, test_setup,
                                        test_teardown),
        cmocka_unit_test_setup_teardown(test_tokens_beyond_2_53_are_exact, test_setup,
                                        test_teardown),
        cmocka_unit_test_setup_teardown(test_busy_and_reentrant, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_waiter_woken_by_release, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_waiter_survives_a_connection_reset, test_setup,
                                        test_teardown),
        cmocka_unit_test_setup_teardown(test_waiters_fifo_and_deadline, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_norenew_lost_after_ttl, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_renewed_lock_survives, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_renewals_batched_per_session, test_setup,
                                        test_teardown),
        cmocka_unit_test_setup_teardown(test_deleted_key_is_lost, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_callbacks_may_free_their_session_or_client, test_setup,
                                        test_teardown),
        cmocka_unit_test_setup_teardown(test_renew_soon_finds_a_lost_key, test_setup,
                                        test_teardown),
        cmocka_unit_test_setup_teardown(test_fence_hook_repairs_lost_counter, test_setup,
                                        test_teardown),
        cmocka_unit_test_setup_teardown(test_session_free_releases, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_script_cache_flushed, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_script_flush_keeps_a_release_before_a_later_grant,
                                        test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_url_auth_and_db, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_acl_user_without_channels_releases, test_setup,
                                        test_teardown),
        cmocka_unit_test_setup_teardown(test_frozen_process_sees_expiry, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_memory_per_lock, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_random_operations_keep_exclusion, test_setup,
                                        test_teardown),
        cmocka_unit_test_setup_teardown(test_redis_killed_and_restarted, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_norenew_lock_lost_when_redis_comes_back_empty,
                                        test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_redis_stopped_times_out, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_lost_fire_and_forget_release_is_sent_again, test_setup,
                                        test_teardown),
        cmocka_unit_test_setup_teardown(test_release_without_reply_frees_the_key, test_setup,
                                        test_teardown),
        cmocka_unit_test_setup_teardown(test_refused_subscriber_backs_off, test_setup,
                                        test_teardown),
        cmocka_unit_test_setup_teardown(test_mark_raise, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_mark_raise_held, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_mark_backend_down, test_setup, test_teardown),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
