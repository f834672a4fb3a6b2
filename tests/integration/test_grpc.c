/* test_grpc.c — the gRPC transport (lockclient/grpc.c) against real etcd processes this test
 * starts on free loopback ports (and kills at the end, also when a test fails or the process
 * dies). Requests are hand-encoded protobuf, so the test does not depend on the etcd codec. */
#include <dlfcn.h>
#include <errno.h>
#include <event2/event.h>
#include <fcntl.h>
#include <ftw.h>
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

#include "grpc.h"

#define TEST_MAX_ETCD        4
#define STATUS_UNIMPLEMENTED 12

/* ---- etcd processes ---- */

struct etcd_proc {
    pid_t pid;
    int cport, pport;
    char dir[64];
};

static struct etcd_proc *g_procs[TEST_MAX_ETCD];

/* Runs argv with stdio on /dev/null; returns its exit status, or -1 when it did not finish within
 * timeout_ms (it is killed then). */
static int run_cmd(char *const argv[], int timeout_ms)
{
    setenv("ETCDCTL_API", "3", 1); /* etcdctl 3.4's default too; said for clarity */
    pid_t pid = spawn_server(argv, NULL);
    if (pid < 0)
        return -1;
    int64_t end = now_ms() + timeout_ms;
    int st;
    while (now_ms() < end) {
        pid_t w = waitpid(pid, &st, WNOHANG);
        if (w == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        sleep_ms(10);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

static int etcd_wait_up(struct etcd_proc *p, int timeout_ms)
{
    char ep[64];
    snprintf(ep, sizeof(ep), "--endpoints=127.0.0.1:%d", p->cport);
    char *argv[] = {"etcdctl", ep,  "--dial-timeout=1s", "--command-timeout=1s", "endpoint",
                    "health",  NULL};
    int64_t end = now_ms() + timeout_ms;
    while (now_ms() < end) {
        if (run_cmd(argv, 3000) == 0)
            return 1;
        sleep_ms(50);
    }
    return 0;
}

static void etcd_kill(struct etcd_proc *p)
{
    proc_kill(&p->pid);
}

/* Starts etcd on p's ports (free ones when 0) with its data in p->dir (a new temp dir when
 * empty); waits until it is healthy. */
static int etcd_start(struct etcd_proc *p)
{
    char name[32], curl[64], purl[64], cluster[96], log[128];
    if (p->dir[0] == '\0') {
        snprintf(p->dir, sizeof(p->dir), "/tmp/fg-grpc-XXXXXX");
        if (mkdtemp(p->dir) == NULL)
            return 0;
    }
    if (p->cport == 0)
        p->cport = free_port();
    if (p->pport == 0)
        p->pport = free_port();
    if (p->cport <= 0 || p->pport <= 0 || p->cport == p->pport)
        return 0;
    snprintf(name, sizeof(name), "n%d", p->cport);
    snprintf(curl, sizeof(curl), "http://127.0.0.1:%d", p->cport);
    snprintf(purl, sizeof(purl), "http://127.0.0.1:%d", p->pport);
    snprintf(cluster, sizeof(cluster), "%s=%s", name, purl);
    snprintf(log, sizeof(log), "%s/etcd.log", p->dir);
    char *argv[] = {"etcd",   "--name",
                    name,     "--data-dir",
                    p->dir,   "--listen-client-urls",
                    curl,     "--advertise-client-urls",
                    curl,     "--listen-peer-urls",
                    purl,     "--initial-advertise-peer-urls",
                    purl,     "--initial-cluster",
                    cluster,  "--initial-cluster-state",
                    "new",    "--logger",
                    "zap",    "--log-outputs",
                    "stderr", NULL};
    pid_t pid = spawn_server(argv, log);
    if (pid < 0)
        return 0;
    p->pid = pid;
    for (int i = 0; i < TEST_MAX_ETCD; i++) {
        if (g_procs[i] == p)
            break;
        if (g_procs[i] == NULL) {
            g_procs[i] = p;
            break;
        }
    }
    if (!etcd_wait_up(p, 20000)) {
        etcd_kill(p);
        return 0;
    }
    return 1;
}

static void etcd_destroy(struct etcd_proc *p)
{
    etcd_kill(p);
    if (p->dir[0])
        rm_tree(p->dir);
    p->dir[0] = '\0';
    for (int i = 0; i < TEST_MAX_ETCD; i++)
        if (g_procs[i] == p)
            g_procs[i] = NULL;
}

static struct etcd_proc g_etcd; /* shared by the tests that do not kill their server */

/* ---- loop, channel and call helpers ---- */

static struct event_base *g_base;
static struct grpc_channel *g_ch;

static struct event *g_tick; /* a 10 ms heartbeat, so EVLOOP_ONCE returns to check the clock */

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

struct chan_state {
    int ups, downs;
    char up_ep[300];
    char down_why[1024];
};

static void on_up(void *arg, const char *ep)
{
    struct chan_state *s = arg;
    s->ups++;
    snprintf(s->up_ep, sizeof(s->up_ep), "%s", ep);
}

static void on_down(void *arg, const char *why)
{
    struct chan_state *s = arg;
    s->downs++;
    snprintf(s->down_why, sizeof(s->down_why), "%s", why);
}

static const struct grpc_channel_cbs g_chan_cbs = {on_up, on_down};

static struct grpc_endpoint ep_of(int port)
{
    struct grpc_endpoint e;
    memset(&e, 0, sizeof(e));
    snprintf(e.host, sizeof(e.host), "127.0.0.1");
    e.port = port;
    return e;
}

/* A channel to the given ports, connected (or NULL). */
static struct grpc_channel *chan_new(const int *ports, int n, const struct grpc_channel_opts *o,
                                     struct chan_state *s)
{
    struct grpc_endpoint eps[4];
    for (int i = 0; i < n; i++)
        eps[i] = ep_of(ports[i]);
    struct grpc_channel *ch = grpc_channel_new(g_base, eps, n, o, &g_chan_cbs, s);
    if (ch == NULL)
        return NULL;
    if (!run_until(&s->ups, 1, 10000)) {
        grpc_channel_free(ch);
        return NULL;
    }
    return ch;
}

struct result {
    int ended;
    int status;
    char msg[1024];
    int nmsgs;
    uint8_t last[8192];
    size_t lastlen;
    int after_cancel; /* callbacks seen after the test cancelled the call */
    int cancelled;
};

static void res_message(void *arg, struct grpc_call *call, const uint8_t *msg, size_t len)
{
    struct result *r = arg;
    if (r->cancelled)
        r->after_cancel++;
    r->nmsgs++;
    r->lastlen = len < sizeof(r->last) ? len : sizeof(r->last);
    memcpy(r->last, msg, r->lastlen);
}

static void res_end(void *arg, struct grpc_call *call, int status, const char *message)
{
    struct result *r = arg;
    if (r->cancelled)
        r->after_cancel++;
    r->ended++;
    r->status = status;
    snprintf(r->msg, sizeof(r->msg), "%s", message);
}

static const struct grpc_call_cbs g_res_cbs = {res_message, res_end};

/* ---- hand-encoded protobuf ---- */

static size_t pb_varint(uint8_t *b, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        b[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    b[n++] = (uint8_t)v;
    return n;
}

static size_t pb_field_varint(uint8_t *b, int field, uint64_t v)
{
    size_t n = pb_varint(b, (uint64_t)field << 3);
    return n + pb_varint(b + n, v);
}

static size_t pb_field_bytes(uint8_t *b, int field, const void *d, size_t len)
{
    size_t n = pb_varint(b, (uint64_t)field << 3 | 2);
    n += pb_varint(b + n, len);
    memcpy(b + n, d, len);
    return n + len;
}

static int pb_read_varint(const uint8_t *b, size_t len, size_t *off, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; shift < 64 && *off < len; shift += 7) {
        uint8_t c = b[(*off)++];
        *v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80))
            return 0;
    }
    return -1;
}

/* Finds the first top-level `field`: its varint value, or its bytes. Returns 1 when found. */
static int pb_find(const uint8_t *b, size_t len, int field, uint64_t *val, const uint8_t **data,
                   size_t *dlen)
{
    size_t off = 0;
    while (off < len) {
        uint64_t key, v;
        if (pb_read_varint(b, len, &off, &key) != 0)
            return 0;
        int wt = (int)(key & 7);
        if (wt == 0) {
            if (pb_read_varint(b, len, &off, &v) != 0)
                return 0;
            if ((int)(key >> 3) == field) {
                if (val)
                    *val = v;
                return 1;
            }
        } else if (wt == 2) {
            if (pb_read_varint(b, len, &off, &v) != 0 || v > len - off)
                return 0;
            if ((int)(key >> 3) == field) {
                if (data)
                    *data = b + off;
                if (dlen)
                    *dlen = (size_t)v;
                return 1;
            }
            off += (size_t)v;
        } else if (wt == 1) {
            off += 8;
        } else if (wt == 5) {
            off += 4;
        } else {
            return 0;
        }
    }
    return 0;
}

static size_t put_req(uint8_t *b, const char *key, const char *value)
{
    size_t n = pb_field_bytes(b, 1, key, strlen(key));
    return n + pb_field_bytes(b + n, 2, value, strlen(value));
}

/* Runs a unary call to completion; returns its status (-1 when it could not start or end). */
static int unary(struct grpc_channel *ch, const char *path, const uint8_t *req, size_t len,
                 struct result *r)
{
    memset(r, 0, sizeof(*r));
    if (grpc_unary(ch, path, req, len, 5000, &g_res_cbs, r) == NULL)
        return -1;
    if (!run_until(&r->ended, 1, 8000))
        return -1;
    return r->status;
}

static int do_put(struct grpc_channel *ch, const char *key, const char *value)
{
    uint8_t b[512];
    struct result r;
    return unary(ch, "/etcdserverpb.KV/Put", b, put_req(b, key, value), &r);
}

/* ---- fixtures ---- */

static int group_setup(void **state)
{
    signal(SIGPIPE, SIG_IGN);
    return etcd_start(&g_etcd) ? 0 : -1;
}

static int group_teardown(void **state)
{
    for (int i = 0; i < TEST_MAX_ETCD; i++)
        if (g_procs[i])
            etcd_destroy(g_procs[i]);
    return 0;
}

static int test_setup(void **state)
{
    struct timeval tv = {0, 10000};
    g_base = event_base_new();
    if (g_base == NULL)
        return -1;
    g_tick = event_new(g_base, -1, EV_PERSIST, tick_cb, NULL);
    return g_tick && event_add(g_tick, &tv) == 0 ? 0 : -1;
}

static int test_teardown(void **state)
{
    gate(0); /* in case a test failed while lookups stalled */
    if (g_etcd.pid > 0)
        kill(g_etcd.pid, SIGCONT); /* in case a test failed while it was frozen */
    grpc_channel_free(g_ch);
    g_ch = NULL;
    event_free(g_tick);
    g_tick = NULL;
    event_base_free(g_base);
    g_base = NULL;
    return 0;
}

static struct chan_state g_cs;

static void connect_shared(void)
{
    memset(&g_cs, 0, sizeof(g_cs));
    g_ch = chan_new(&g_etcd.cport, 1, NULL, &g_cs);
    assert_non_null(g_ch);
    assert_true(grpc_channel_ready(g_ch));
}

/* ---- tests ---- */

static void test_bad_arguments(void **state)
{
    struct grpc_endpoint ep = ep_of(g_etcd.cport);
    struct chan_state s = {0};
    assert_null(grpc_channel_new(g_base, &ep, 0, NULL, &g_chan_cbs, &s));
    assert_null(grpc_channel_new(g_base, NULL, 1, NULL, &g_chan_cbs, &s));
    struct grpc_endpoint bad_ep = ep_of(0);
    assert_null(grpc_channel_new(g_base, &bad_ep, 1, NULL, &g_chan_cbs, &s));
    bad_ep = ep_of(70000);
    assert_null(grpc_channel_new(g_base, &bad_ep, 1, NULL, &g_chan_cbs, &s));
    bad_ep = ep_of(g_etcd.cport);
    bad_ep.host[0] = '\0';
    assert_null(grpc_channel_new(g_base, &bad_ep, 1, NULL, &g_chan_cbs, &s));
    g_ch = grpc_channel_new(g_base, &ep, 1, NULL, &g_chan_cbs, &s);
    assert_non_null(g_ch);
    /* Not connected yet: calls are refused, not queued. */
    assert_false(grpc_channel_ready(g_ch));
    struct result r = {0};
    assert_null(grpc_unary(g_ch, "/etcdserverpb.KV/Range", NULL, 0, 1000, &g_res_cbs, &r));
    assert_true(run_until(&s.ups, 1, 5000));
    char want[64];
    snprintf(want, sizeof(want), "127.0.0.1:%d", g_etcd.cport);
    assert_string_equal(grpc_channel_endpoint(g_ch), want);
    assert_null(grpc_unary(g_ch, "no-slash", NULL, 0, 1000, &g_res_cbs, &r));
    struct grpc_metadata bad = {"Upper", "x"};
    assert_null(grpc_call_start(g_ch, "/etcdserverpb.KV/Range", &bad, 1, 0, &g_res_cbs, &r));
    struct grpc_metadata badv = {"x-a", "line\nbreak"};
    assert_null(grpc_call_start(g_ch, "/etcdserverpb.KV/Range", &badv, 1, 0, &g_res_cbs, &r));
    assert_int_equal(grpc_call_send(NULL, (const uint8_t *)"x", 1), -1);
    assert_int_equal(grpc_call_close_send(NULL), -1);
    grpc_call_cancel(NULL);
    grpc_channel_free(NULL);
    assert_int_equal(r.ended, 0);
}

static void test_put_then_range(void **state)
{
    connect_shared();
    char value[64];
    snprintf(value, sizeof(value), "v-%lld", (long long)now_ms());
    assert_int_equal(do_put(g_ch, "fg-test/a", value), GRPC_STATUS_OK);
    uint8_t b[128];
    struct result r;
    size_t n = pb_field_bytes(b, 1, "fg-test/a", 9);
    assert_int_equal(unary(g_ch, "/etcdserverpb.KV/Range", b, n, &r), GRPC_STATUS_OK);
    assert_int_equal(r.nmsgs, 1);
    assert_non_null(memmem(r.last, r.lastlen, value, strlen(value)));
    /* RangeResponse.count (field 4) is 1. */
    const uint8_t *kvs;
    size_t kvl;
    assert_true(pb_find(r.last, r.lastlen, 2, NULL, &kvs, &kvl));
    uint64_t count = 0;
    assert_true(pb_find(r.last, r.lastlen, 4, &count, NULL, NULL));
    assert_int_equal(count, 1);
    assert_int_equal(g_cs.downs, 0);
}

/* A loopback host name is resolved (getaddrinfo) and used. */
static void test_host_name(void **state)
{
    struct grpc_endpoint ep = ep_of(g_etcd.cport);
    snprintf(ep.host, sizeof(ep.host), "localhost");
    memset(&g_cs, 0, sizeof(g_cs));
    g_ch = grpc_channel_new(g_base, &ep, 1, NULL, &g_chan_cbs, &g_cs);
    assert_non_null(g_ch);
    assert_true(run_until(&g_cs.ups, 1, 5000));
    char want[64];
    snprintf(want, sizeof(want), "localhost:%d", g_etcd.cport);
    assert_string_equal(g_cs.up_ep, want);
    assert_int_equal(do_put(g_ch, "fg-test/by-name", "ok"), GRPC_STATUS_OK);
}

/* A host name whose lookup stalls: the channel is created at once and the loop keeps running;
 * the connect timeout gives the lookup up and says so; once the name service answers, the
 * channel connects. A channel freed while its lookup runs is never called back. */
static void test_stalled_lookup_leaves_the_loop_running(void **state)
{
    struct grpc_endpoint ep = ep_of(g_etcd.cport);
    struct grpc_channel_opts o = {
        .connect_timeout_ms = 300, .backoff_min_ms = 20, .backoff_max_ms = 100};
    snprintf(ep.host, sizeof(ep.host), "slow.test");
    gate(1);
    memset(&g_cs, 0, sizeof(g_cs));
    int64_t t0 = now_ms();
    g_ch = grpc_channel_new(g_base, &ep, 1, &o, &g_chan_cbs, &g_cs);
    assert_non_null(g_ch);
    assert_true(now_ms() - t0 < 100);
    assert_true(run_for_worst(g_base, 700) < 100);
    print_message("while stalled: %s\n", grpc_channel_last_error(g_ch));
    assert_non_null(
        strstr(grpc_channel_last_error(g_ch), "resolving 'slow.test' timed out after 300 ms"));
    assert_int_equal(g_cs.ups, 0);
    gate(0);
    assert_true(run_until(&g_cs.ups, 1, 5000));
    assert_int_equal(do_put(g_ch, "fg-test/by-slow-name", "ok"), GRPC_STATUS_OK);

    gate(1);
    struct chan_state cs = {0};
    struct grpc_channel *ch = grpc_channel_new(g_base, &ep, 1, &o, &g_chan_cbs, &cs);
    assert_non_null(ch);
    run_for(50);
    grpc_channel_free(ch);
    gate(0);
    run_for(200); /* the lookup ends with nobody waiting for it */
    assert_int_equal(cs.ups, 0);

    /* A name that does not resolve: the reason names the host. */
    snprintf(ep.host, sizeof(ep.host), "missing.test");
    ch = grpc_channel_new(g_base, &ep, 1, &o, &g_chan_cbs, &cs);
    assert_non_null(ch);
    run_for(300);
    print_message("unknown name: %s\n", grpc_channel_last_error(ch));
    assert_non_null(strstr(grpc_channel_last_error(ch), "cannot resolve"));
    assert_non_null(strstr(grpc_channel_last_error(ch), "missing.test"));
    grpc_channel_free(ch);
}

static void test_server_errors_keep_channel(void **state)
{
    connect_shared();
    struct result r;
    uint8_t b[64];
    size_t n = pb_field_bytes(b, 1, "k", 1);
    assert_int_equal(unary(g_ch, "/etcdserverpb.KV/NoSuchMethod", b, n, &r), STATUS_UNIMPLEMENTED);
    assert_true(strlen(r.msg) > 0);
    assert_non_null(strstr(r.msg, "NoSuchMethod"));
    assert_int_equal(unary(g_ch, "/nosuch.Service/Call", b, n, &r), STATUS_UNIMPLEMENTED);
    /* A length-delimited field whose length runs past the end: not a RangeRequest. */
    static const uint8_t garbage[] = {0x0a, 0xff, 0xff, 0xff, 0x0f, 0x01, 0x02};
    int st = unary(g_ch, "/etcdserverpb.KV/Range", garbage, sizeof(garbage), &r);
    print_message("garbage request: status %d \"%s\"\n", st, r.msg);
    assert_true(st > 0);
    assert_true(strlen(r.msg) > 0);
    /* The channel survived all three. */
    assert_true(grpc_channel_ready(g_ch));
    assert_int_equal(do_put(g_ch, "fg-test/after-errors", "ok"), GRPC_STATUS_OK);
    assert_int_equal(g_cs.downs, 0);
    assert_int_equal(g_cs.ups, 1);
}

static void test_lease_keepalive_stream(void **state)
{
    connect_shared();
    uint8_t b[64];
    struct result r;
    size_t n = pb_field_varint(b, 1, 30);
    assert_int_equal(unary(g_ch, "/etcdserverpb.Lease/LeaseGrant", b, n, &r), GRPC_STATUS_OK);
    uint64_t id = 0;
    assert_true(pb_find(r.last, r.lastlen, 2, &id, NULL, NULL));
    assert_true(id != 0);

    struct result ka = {0};
    struct grpc_metadata md = {"hasleader", "true"};
    struct grpc_call *c =
        grpc_call_start(g_ch, "/etcdserverpb.Lease/LeaseKeepAlive", &md, 1, 0, &g_res_cbs, &ka);
    assert_non_null(c);
    n = pb_field_varint(b, 1, id);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(grpc_call_send(c, b, n), 0);
        assert_true(run_until(&ka.nmsgs, i + 1, 3000));
        uint64_t rid = 0, ttl = 0;
        assert_true(pb_find(ka.last, ka.lastlen, 2, &rid, NULL, NULL));
        assert_true(pb_find(ka.last, ka.lastlen, 3, &ttl, NULL, NULL));
        assert_true(rid == id);
        assert_true(ttl > 0 && ttl <= 30);
        run_for(200);
    }
    assert_int_equal(ka.nmsgs, 3);
    assert_int_equal(ka.ended, 0);
    /* One more keepalive queued, then cancelled: no callback of the call runs any more. */
    assert_int_equal(grpc_call_send(c, b, n), 0);
    ka.cancelled = 1;
    grpc_call_cancel(c);
    run_for(500);
    assert_int_equal(ka.after_cancel, 0);
    assert_int_equal(do_put(g_ch, "fg-test/after-cancel", "ok"), GRPC_STATUS_OK);
}

static void test_watch_sees_put(void **state)
{
    connect_shared();
    uint8_t inner[64], b[128];
    size_t in = pb_field_bytes(inner, 1, "fg-test/w", 9);
    size_t n = pb_field_bytes(b, 1, inner, in);
    struct result w = {0};
    struct grpc_metadata md = {"hasleader", "true"};
    struct grpc_call *c =
        grpc_call_start(g_ch, "/etcdserverpb.Watch/Watch", &md, 1, 0, &g_res_cbs, &w);
    assert_non_null(c);
    assert_int_equal(grpc_call_send(c, b, n), 0);
    assert_true(run_until(&w.nmsgs, 1, 5000));
    uint64_t created = 0;
    assert_true(pb_find(w.last, w.lastlen, 3, &created, NULL, NULL));
    assert_int_equal(created, 1);

    char value[64];
    snprintf(value, sizeof(value), "watched-%lld", (long long)now_ms());
    assert_int_equal(do_put(g_ch, "fg-test/w", value), GRPC_STATUS_OK);
    assert_true(run_until(&w.nmsgs, 2, 5000));
    const uint8_t *ev;
    size_t evl;
    assert_true(pb_find(w.last, w.lastlen, 11, NULL, &ev, &evl)); /* events */
    assert_non_null(memmem(ev, evl, value, strlen(value)));
    assert_int_equal(w.ended, 0);
    w.cancelled = 1;
    grpc_call_cancel(c);
    run_for(200);
    assert_int_equal(w.after_cancel, 0);
}

static void test_deadline(void **state)
{
    connect_shared();
    uint8_t inner[64], b[128];
    size_t in = pb_field_bytes(inner, 1, "fg-test/never", 13);
    size_t n = pb_field_bytes(b, 1, inner, in);
    struct result w = {0};
    int64_t t0 = now_ms();
    struct grpc_call *c =
        grpc_call_start(g_ch, "/etcdserverpb.Watch/Watch", NULL, 0, 300, &g_res_cbs, &w);
    assert_non_null(c);
    assert_int_equal(grpc_call_send(c, b, n), 0);
    assert_true(run_until(&w.ended, 1, 3000));
    int64_t took = now_ms() - t0;
    print_message("deadline: \"%s\" after %lld ms\n", w.msg, (long long)took);
    assert_int_equal(w.status, GRPC_STATUS_DEADLINE_EXCEEDED);
    assert_true(took >= 290 && took < 1500);
    run_for(200);
    assert_int_equal(w.ended, 1);
    assert_int_equal(do_put(g_ch, "fg-test/after-deadline", "ok"), GRPC_STATUS_OK);
    assert_int_equal(g_cs.downs, 0);
}

/* The loop is blocked past the deadline, so the server's own deadline error (etcd: UNKNOWN
 * "context deadline exceeded") is read before the local timer runs: still DEADLINE_EXCEEDED. */
static void test_deadline_with_blocked_loop(void **state)
{
    connect_shared();
    uint8_t inner[64], b[128];
    size_t n = pb_field_bytes(b, 1, inner, pb_field_bytes(inner, 1, "fg-test/never", 13));
    struct result w = {0};
    struct grpc_call *c =
        grpc_call_start(g_ch, "/etcdserverpb.Watch/Watch", NULL, 0, 300, &g_res_cbs, &w);
    assert_non_null(c);
    assert_int_equal(grpc_call_send(c, b, n), 0);
    run_for(50); /* the request goes out */
    sleep_ms(900);
    assert_true(run_until(&w.ended, 1, 3000));
    print_message("deadline (blocked loop): \"%s\"\n", w.msg);
    assert_int_equal(w.status, GRPC_STATUS_DEADLINE_EXCEEDED);
    assert_non_null(strstr(w.msg, "deadline of 300 ms exceeded"));
    assert_int_equal(do_put(g_ch, "fg-test/after-deadline", "ok"), GRPC_STATUS_OK);
}

static void test_kill_and_restart(void **state)
{
    struct etcd_proc p;
    memset(&p, 0, sizeof(p));
    assert_true(etcd_start(&p));
    int closed = free_port();
    int ports[2] = {closed, p.cport};
    struct grpc_channel_opts o = {
        .connect_timeout_ms = 1000, .backoff_min_ms = 20, .backoff_max_ms = 200};
    struct chan_state s = {0};
    g_ch = chan_new(ports, 2, &o, &s);
    assert_non_null(g_ch);
    char want[64];
    snprintf(want, sizeof(want), "127.0.0.1:%d", p.cport);
    assert_string_equal(s.up_ep, want);
    assert_int_equal(s.downs, 0); /* the refused first endpoint never came up */

    uint8_t inner[64], b[128];
    size_t n = pb_field_bytes(b, 1, inner, pb_field_bytes(inner, 1, "fg-test/k", 9));
    struct result w = {0};
    struct grpc_call *c =
        grpc_call_start(g_ch, "/etcdserverpb.Watch/Watch", NULL, 0, 0, &g_res_cbs, &w);
    assert_non_null(c);
    assert_int_equal(grpc_call_send(c, b, n), 0);
    assert_true(run_until(&w.nmsgs, 1, 5000));

    etcd_kill(&p);
    assert_true(run_until(&w.ended, 1, 5000));
    assert_int_equal(w.status, GRPC_STATUS_UNAVAILABLE);
    assert_non_null(strstr(w.msg, want));
    assert_true(run_until(&s.downs, 1, 1000));
    assert_non_null(strstr(s.down_why, want));
    assert_false(grpc_channel_ready(g_ch));

    assert_true(etcd_start(&p)); /* same ports, same data */
    assert_true(run_until(&s.ups, 2, 15000));
    assert_string_equal(s.up_ep, want);
    assert_int_equal(do_put(g_ch, "fg-test/after-restart", "ok"), GRPC_STATUS_OK);
    grpc_channel_free(g_ch);
    g_ch = NULL;
    etcd_destroy(&p);
}

/* etcd stopping gracefully (SIGTERM; 3.4 closes the connection): the open stream ends
 * UNAVAILABLE naming the endpoint, `down` fires, and the channel takes no new calls. */
static void test_graceful_stop(void **state)
{
    struct etcd_proc p;
    memset(&p, 0, sizeof(p));
    assert_true(etcd_start(&p));
    struct chan_state s = {0};
    g_ch = chan_new(&p.cport, 1, NULL, &s);
    assert_non_null(g_ch);
    uint8_t inner[64], b[128];
    size_t n = pb_field_bytes(b, 1, inner, pb_field_bytes(inner, 1, "fg-test/g", 9));
    struct result w = {0};
    struct grpc_call *c =
        grpc_call_start(g_ch, "/etcdserverpb.Watch/Watch", NULL, 0, 0, &g_res_cbs, &w);
    assert_non_null(c);
    assert_int_equal(grpc_call_send(c, b, n), 0);
    assert_true(run_until(&w.nmsgs, 1, 5000));
    kill(p.pid, SIGTERM);
    assert_true(run_until(&w.ended, 1, 15000));
    print_message("graceful stop: call \"%s\"; down \"%s\"\n", w.msg, s.down_why);
    assert_int_equal(w.status, GRPC_STATUS_UNAVAILABLE);
    char want[64];
    snprintf(want, sizeof(want), "127.0.0.1:%d", p.cport);
    assert_non_null(strstr(w.msg, want));
    assert_true(run_until(&s.downs, 1, 2000));
    assert_false(grpc_channel_ready(g_ch));
    grpc_channel_free(g_ch);
    g_ch = NULL;
    etcd_destroy(&p);
}

static void test_failover(void **state)
{
    struct etcd_proc p2;
    memset(&p2, 0, sizeof(p2));
    assert_true(etcd_start(&p2));
    int ports[2] = {g_etcd.cport, p2.cport};
    struct chan_state s = {0};
    g_ch = chan_new(ports, 2, NULL, &s);
    assert_non_null(g_ch);
    char ep1[64], ep2[64];
    snprintf(ep1, sizeof(ep1), "127.0.0.1:%d", g_etcd.cport);
    snprintf(ep2, sizeof(ep2), "127.0.0.1:%d", p2.cport);
    assert_string_equal(s.up_ep, ep1);

    uint8_t inner[64], b[128];
    size_t n = pb_field_bytes(b, 1, inner, pb_field_bytes(inner, 1, "fg-test/f", 9));
    struct result w = {0};
    struct grpc_call *c =
        grpc_call_start(g_ch, "/etcdserverpb.Watch/Watch", NULL, 0, 0, &g_res_cbs, &w);
    assert_non_null(c);
    assert_int_equal(grpc_call_send(c, b, n), 0);
    assert_true(run_until(&w.nmsgs, 1, 5000));

    grpc_channel_failover(g_ch, "no leader (test)");
    assert_false(grpc_channel_ready(g_ch));
    assert_true(run_until(&w.ended, 1, 2000));
    assert_int_equal(w.status, GRPC_STATUS_UNAVAILABLE);
    assert_non_null(strstr(w.msg, ep1));
    assert_non_null(strstr(w.msg, "no leader (test)"));
    assert_int_equal(s.downs, 1);
    assert_true(run_until(&s.ups, 2, 3000));
    assert_string_equal(s.up_ep, ep2);
    assert_string_equal(grpc_channel_endpoint(g_ch), ep2);
    assert_int_equal(do_put(g_ch, "fg-test/on-second", "ok"), GRPC_STATUS_OK);
    /* And back to the first. */
    grpc_channel_failover(g_ch, "again");
    assert_true(run_until(&s.ups, 3, 3000));
    assert_string_equal(s.up_ep, ep1);
    grpc_channel_free(g_ch);
    g_ch = NULL;
    etcd_destroy(&p2);
}

/* Re-entrancy: callbacks that start, cancel and fail over from inside `message`, `end`, `down`. */
struct reent {
    struct grpc_call *victim;
    struct result victim_res;
    struct result chained;
    int chained_started;
    int failover_from_down;
    int ends;
    int down_calls_refused;
};

static struct reent g_re;

static void re_end(void *arg, struct grpc_call *call, int status, const char *message)
{
    uint8_t b[64];
    g_re.ends++;
    if (g_re.victim) {
        g_re.victim_res.cancelled = 1;
        grpc_call_cancel(g_re.victim); /* cancel another open call from inside `end` */
        g_re.victim = NULL;
    }
    size_t n = pb_field_bytes(b, 1, "fg-test/a", 9);
    if (!g_re.chained_started) {
        g_re.chained_started = 1;
        assert_non_null(
            grpc_unary(g_ch, "/etcdserverpb.KV/Range", b, n, 5000, &g_res_cbs, &g_re.chained));
    }
}

static void re_self_cancel_msg(void *arg, struct grpc_call *call, const uint8_t *m, size_t len)
{
    struct result *r = arg;
    r->nmsgs++;
    r->cancelled = 1;
    grpc_call_cancel(call); /* cancel the call from inside its own `message` */
}

static void re_down(void *arg, const char *why)
{
    struct chan_state *s = arg;
    s->downs++;
    struct result r = {0};
    if (grpc_unary(g_ch, "/etcdserverpb.KV/Range", NULL, 0, 1000, &g_res_cbs, &r) == NULL)
        g_re.down_calls_refused++;
    if (!g_re.failover_from_down) {
        g_re.failover_from_down = 1;
        grpc_channel_failover(g_ch, "from down");
    }
}

static void test_reentrancy(void **state)
{
    memset(&g_re, 0, sizeof(g_re));
    memset(&g_cs, 0, sizeof(g_cs));
    int ports[2] = {g_etcd.cport, g_etcd.cport}; /* the same server listed twice */
    struct grpc_channel_cbs cbs = {on_up, re_down};
    struct grpc_endpoint eps[2] = {ep_of(ports[0]), ep_of(ports[1])};
    g_ch = grpc_channel_new(g_base, eps, 2, NULL, &cbs, &g_cs);
    assert_non_null(g_ch);
    assert_true(run_until(&g_cs.ups, 1, 5000));

    uint8_t b[64];
    size_t n = pb_field_bytes(b, 1, "fg-test/a", 9);
    struct grpc_call_cbs ecbs = {NULL, re_end};
    g_re.victim = grpc_call_start(g_ch, "/etcdserverpb.Watch/Watch", NULL, 0, 0, &g_res_cbs,
                                  &g_re.victim_res);
    assert_non_null(g_re.victim);
    assert_non_null(grpc_unary(g_ch, "/etcdserverpb.KV/Range", b, n, 5000, &ecbs, NULL));
    assert_true(run_until(&g_re.chained.ended, 1, 5000));
    assert_int_equal(g_re.chained.status, GRPC_STATUS_OK);
    assert_int_equal(g_re.victim_res.after_cancel, 0);
    assert_int_equal(g_re.victim_res.ended, 0);

    struct result sc = {0};
    struct grpc_call_cbs sccbs = {re_self_cancel_msg, res_end};
    assert_non_null(grpc_unary(g_ch, "/etcdserverpb.KV/Range", b, n, 5000, &sccbs, &sc));
    assert_true(run_until(&sc.nmsgs, 1, 5000));
    run_for(200);
    assert_int_equal(sc.ended, 0); /* cancelled inside `message`: no `end` */

    /* A failover whose `down` fails over again and tries to start a call. */
    struct result w = {0};
    assert_non_null(grpc_call_start(g_ch, "/etcdserverpb.Watch/Watch", NULL, 0, 0, &g_res_cbs, &w));
    run_for(100);
    grpc_channel_failover(g_ch, "first");
    assert_true(run_until(&g_cs.ups, 2, 5000));
    assert_int_equal(w.ended, 1);
    assert_int_equal(w.status, GRPC_STATUS_UNAVAILABLE);
    assert_true(g_re.failover_from_down == 1);
    assert_true(g_re.down_calls_refused >= 1);
    assert_int_equal(do_put(g_ch, "fg-test/reent", "ok"), GRPC_STATUS_OK);
}

static void test_pings_keep_connection(void **state)
{
    struct grpc_channel_opts o = {.ping_interval_ms = 1000 /* raised to 5000 */,
                                  .ping_timeout_ms = 3000};
    memset(&g_cs, 0, sizeof(g_cs));
    g_ch = chan_new(&g_etcd.cport, 1, &o, &g_cs);
    assert_non_null(g_ch);
    uint64_t sent0, acked0, sent, acked;
    grpc_channel_ping_counts(g_ch, &sent0, &acked0);
    assert_true(sent0 == 0);

    uint8_t inner[64], b[128];
    size_t n = pb_field_bytes(b, 1, inner, pb_field_bytes(inner, 1, "fg-test/p", 9));
    struct result w = {0};
    struct grpc_metadata md = {"hasleader", "true"};
    struct grpc_call *c =
        grpc_call_start(g_ch, "/etcdserverpb.Watch/Watch", &md, 1, 0, &g_res_cbs, &w);
    assert_non_null(c);
    assert_int_equal(grpc_call_send(c, b, n), 0);
    run_for(12000);
    grpc_channel_ping_counts(g_ch, &sent, &acked);
    print_message("pings sent %llu acked %llu in 12 s\n", (unsigned long long)sent,
                  (unsigned long long)acked);
    if (w.ended || g_cs.downs)
        print_message("watch ended: %d \"%s\"; down: \"%s\"\n", w.status, w.msg, g_cs.down_why);
    assert_int_equal(w.ended, 0); /* no GOAWAY too_many_pings, no reset */
    assert_int_equal(g_cs.downs, 0);
    assert_true(sent >= 2 && sent <= 3); /* every 5 s, not every 1 s */
    assert_true(acked >= sent - 1);
    assert_int_equal(w.ended, 0); /* no GOAWAY too_many_pings, no reset */
    assert_int_equal(g_cs.downs, 0);
    assert_int_equal(g_cs.ups, 1);

    /* With no call open no PING is sent. */
    w.cancelled = 1;
    grpc_call_cancel(c);
    run_for(200);
    grpc_channel_ping_counts(g_ch, &sent0, NULL);
    run_for(6000);
    grpc_channel_ping_counts(g_ch, &sent, NULL);
    assert_true(sent == sent0);
    assert_int_equal(g_cs.downs, 0);
}

/* Collects whole messages (any size) and counts them. */
struct big {
    int nmsgs, ended, status;
    size_t total, maxlen;
    int found; /* messages that contained `needle` */
    const uint8_t *needle;
    size_t needlelen;
    char msg[1024];
};

static void big_message(void *arg, struct grpc_call *call, const uint8_t *m, size_t len)
{
    struct big *b = arg;
    b->nmsgs++;
    b->total += len;
    if (len > b->maxlen)
        b->maxlen = len;
    if (b->needle && memmem(m, len, b->needle, b->needlelen))
        b->found++;
}

static void big_end(void *arg, struct grpc_call *call, int status, const char *message)
{
    struct big *b = arg;
    b->ended++;
    b->status = status;
    snprintf(b->msg, sizeof(b->msg), "%s", message);
}

static const struct grpc_call_cbs g_big_cbs = {big_message, big_end};

static int put_big(const char *key, size_t vlen, uint8_t fill)
{
    uint8_t *v = malloc(vlen), *req = malloc(vlen + 64);
    assert_non_null(v);
    assert_non_null(req);
    memset(v, fill, vlen);
    size_t n = pb_field_bytes(req, 1, key, strlen(key));
    n += pb_field_bytes(req + n, 2, v, vlen);
    struct result r;
    int st = unary(g_ch, "/etcdserverpb.KV/Put", req, n, &r);
    free(v);
    free(req);
    return st;
}

/* Messages that span many DATA frames; a stream that carries far more than the flow-control
 * windows (4 MiB per stream, 16 MiB per connection); a response over GRPC_MAX_MESSAGE. */
static void test_large_messages_and_flow_control(void **state)
{
    connect_shared();
    /* 200 KB value: the Range response spans >= 13 DATA frames of 16 KiB. */
    static uint8_t needle[200000];
    memset(needle, 'q', sizeof(needle));
    assert_int_equal(put_big("fg-test/big", sizeof(needle), 'q'), GRPC_STATUS_OK);
    uint8_t b[128];
    size_t n = pb_field_bytes(b, 1, "fg-test/big", 11);
    struct big r = {.needle = needle, .needlelen = sizeof(needle)};
    assert_non_null(grpc_unary(g_ch, "/etcdserverpb.KV/Range", b, n, 5000, &g_big_cbs, &r));
    assert_true(run_until(&r.ended, 1, 5000));
    assert_int_equal(r.status, GRPC_STATUS_OK);
    assert_int_equal(r.nmsgs, 1);
    assert_int_equal(r.found, 1);

    /* A watch stream receives 24 events of 1 MiB: 24 MiB, only possible if consumed data is
     * acknowledged with WINDOW_UPDATE. */
    uint8_t inner[64];
    size_t in = pb_field_bytes(inner, 1, "fg-test/flow/", 13);
    in += pb_field_bytes(inner + in, 2, "fg-test/flow0", 13);
    n = pb_field_bytes(b, 1, inner, in);
    struct big w = {0};
    struct grpc_call *c =
        grpc_call_start(g_ch, "/etcdserverpb.Watch/Watch", NULL, 0, 0, &g_big_cbs, &w);
    assert_non_null(c);
    assert_int_equal(grpc_call_send(c, b, n), 0);
    assert_true(run_until(&w.nmsgs, 1, 5000)); /* created */
    for (int i = 0; i < 24; i++) {
        char key[64];
        snprintf(key, sizeof(key), "fg-test/flow/%d", i);
        assert_int_equal(put_big(key, 1 << 20, (uint8_t)('a' + i % 26)), GRPC_STATUS_OK);
    }
    assert_true(run_until(&w.nmsgs, 25, 20000));
    assert_true(w.total > (size_t)24 << 20);
    assert_int_equal(w.ended, 0);
    grpc_call_cancel(c);

    /* Three values of 1.4 MB in one Range response: over the 4 MiB receive limit. */
    for (int i = 0; i < 3; i++) {
        char key[64];
        snprintf(key, sizeof(key), "fg-test/huge/%d", i);
        assert_int_equal(put_big(key, 1400000, 'h'), GRPC_STATUS_OK);
    }
    n = pb_field_bytes(b, 1, "fg-test/huge/", 13);
    n += pb_field_bytes(b + n, 2, "fg-test/huge0", 13);
    struct big h = {0};
    assert_non_null(grpc_unary(g_ch, "/etcdserverpb.KV/Range", b, n, 10000, &g_big_cbs, &h));
    assert_true(run_until(&h.ended, 1, 10000));
    assert_int_equal(h.status, GRPC_STATUS_RESOURCE_EXHAUSTED);
    assert_int_equal(h.nmsgs, 0);
    assert_non_null(strstr(h.msg, "exceeds the limit"));
    assert_int_equal(do_put(g_ch, "fg-test/after-huge", "ok"), GRPC_STATUS_OK);
    assert_int_equal(g_cs.downs, 0);
}

/* A loopback listener that accepts TCP (the kernel's backlog) but never speaks HTTP/2: the
 * handshake must time out and the channel move on to the next endpoint. */
static void test_silent_endpoint_times_out(void **state)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(lfd >= 0);
    struct sockaddr_in a;
    socklen_t al = sizeof(a);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(lfd, 8), 0);
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&a, &al), 0);
    int ports[2] = {ntohs(a.sin_port), g_etcd.cport};
    struct grpc_channel_opts o = {.connect_timeout_ms = 300};
    memset(&g_cs, 0, sizeof(g_cs));
    int64_t t0 = now_ms();
    g_ch = chan_new(ports, 2, &o, &g_cs);
    int64_t took = now_ms() - t0;
    close(lfd);
    assert_non_null(g_ch);
    assert_true(took >= 290 && took < 3000);
    char want[64];
    snprintf(want, sizeof(want), "127.0.0.1:%d", g_etcd.cport);
    assert_string_equal(g_cs.up_ep, want);
    assert_int_equal(do_put(g_ch, "fg-test/after-silent", "ok"), GRPC_STATUS_OK);
}

/* A frozen server (SIGSTOP) stops answering PINGs: the open call ends UNAVAILABLE naming the
 * PING timeout, `down` fires, and the channel comes back once the server runs again. */
static void test_ping_timeout_kills_connection(void **state)
{
    struct grpc_channel_opts o = {.ping_interval_ms = 5000,
                                  .ping_timeout_ms = 1000,
                                  .backoff_min_ms = 20,
                                  .backoff_max_ms = 200};
    memset(&g_cs, 0, sizeof(g_cs));
    g_ch = chan_new(&g_etcd.cport, 1, &o, &g_cs);
    assert_non_null(g_ch);
    uint8_t inner[64], b[128];
    size_t n = pb_field_bytes(b, 1, inner, pb_field_bytes(inner, 1, "fg-test/z", 9));
    struct result w = {0};
    struct grpc_call *c =
        grpc_call_start(g_ch, "/etcdserverpb.Watch/Watch", NULL, 0, 0, &g_res_cbs, &w);
    assert_non_null(c);
    assert_int_equal(grpc_call_send(c, b, n), 0);
    assert_true(run_until(&w.nmsgs, 1, 5000));
    kill(g_etcd.pid, SIGSTOP);
    int64_t t0 = now_ms();
    int ended = run_until(&w.ended, 1, 9000);
    int64_t took = now_ms() - t0;
    kill(g_etcd.pid, SIGCONT);
    assert_true(ended);
    assert_int_equal(w.status, GRPC_STATUS_UNAVAILABLE);
    assert_non_null(strstr(w.msg, "PING not acknowledged within 1000 ms"));
    assert_true(took >= 5500 && took < 8000); /* interval 5 s + timeout 1 s */
    assert_int_equal(g_cs.downs, 1);
    assert_true(run_until(&g_cs.ups, 2, 10000));
    assert_int_equal(do_put(g_ch, "fg-test/after-freeze", "ok"), GRPC_STATUS_OK);
}

#define MANY 1000

static void test_many_concurrent_unary(void **state)
{
    connect_shared();
    static struct result rs[MANY];
    memset(rs, 0, sizeof(rs));
    uint8_t b[64];
    size_t n = pb_field_bytes(b, 1, "fg-test/a", 9);
    for (int i = 0; i < MANY; i++)
        assert_non_null(
            grpc_unary(g_ch, "/etcdserverpb.KV/Range", b, n, 20000, &g_res_cbs, &rs[i]));
    int64_t end = now_ms() + 30000;
    int done = 0;
    while (done < MANY && now_ms() < end) {
        event_base_loop(g_base, EVLOOP_ONCE);
        done = 0;
        for (int i = 0; i < MANY; i++)
            done += rs[i].ended;
    }
    int ok = 0;
    for (int i = 0; i < MANY; i++)
        ok += rs[i].ended == 1 && rs[i].status == GRPC_STATUS_OK && rs[i].nmsgs == 1;
    assert_int_equal(ok, MANY);
    assert_int_equal(g_cs.downs, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_bad_arguments, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_put_then_range, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_host_name, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_stalled_lookup_leaves_the_loop_running, test_setup,
                                        test_teardown),
        cmocka_unit_test_setup_teardown(test_server_errors_keep_channel, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_lease_keepalive_stream, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_watch_sees_put, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_deadline, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_deadline_with_blocked_loop, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_kill_and_restart, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_graceful_stop, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_failover, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_reentrancy, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_pings_keep_connection, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_many_concurrent_unary, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_large_messages_and_flow_control, test_setup,
                                        test_teardown),
        cmocka_unit_test_setup_teardown(test_silent_endpoint_times_out, test_setup, test_teardown),
        cmocka_unit_test_setup_teardown(test_ping_timeout_kills_connection, test_setup,
                                        test_teardown),
    };
    const char *filter = getenv("FG_TEST_FILTER"); /* e.g. "test_pings*" */
    if (filter && filter[0])
        cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
