/* test_resolve.c — host names resolved off the loop: results, failures, a stalled name service
 * that does not stop the loop, shared lookups and cancellation.
 *
 * A name service that stalls: gai_gate.h ("slow.test" waits behind a gate, "missing.test" does
 * not exist). */
#include <dlfcn.h>
#include <event2/event.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "../gai_gate.h"
#include "resolve.h"

struct outcome {
    int calls, order;
    int family, port;
    char host[64];
    char err[300];
    struct resolve_req *cancel_in_cb; /* a request this callback cancels */
};

static int next_order;

static void record(const struct addrinfo *res, const char *err, void *arg)
{
    struct outcome *o = arg;

    o->calls++;
    o->order = ++next_order;
    snprintf(o->err, sizeof(o->err), "%s", err);
    if (res) {
        const struct addrinfo *a = resolve_pick(res);
        o->family = a->ai_family;
        o->port = a->ai_family == AF_INET
                      ? ntohs(((const struct sockaddr_in *)(const void *)a->ai_addr)->sin_port)
                      : ntohs(((const struct sockaddr_in6 *)(const void *)a->ai_addr)->sin6_port);
        assert_int_equal(resolve_pick_host(res, o->host, sizeof(o->host)), 0);
    }
    if (o->cancel_in_cb)
        resolve_cancel(o->cancel_in_cb);
}

/* Runs the loop until *calls reaches want or 5 s pass. */
static void run_until(struct event_base *base, const int *calls, int want)
{
    for (int i = 0; i < 500 && *calls < want; i++) {
        struct timeval tv = {0, 10000};
        event_base_loopexit(base, &tv);
        event_base_dispatch(base);
    }
}

static void run_ms(struct event_base *base, int ms)
{
    struct timeval tv = {0, ms * 1000};
    event_base_loopexit(base, &tv);
    event_base_dispatch(base);
}

static void wait_slow_calls(int want)
{
    for (int i = 0; i < 500 && slow_calls_now() < want; i++)
        nanosleep(&(struct timespec){0, 10000000}, NULL);
}

static void test_numeric_addresses_answer_on_the_next_turn(void **state)
{
    struct event_base *base = event_base_new();
    struct outcome v4 = {0}, v6 = {0};

    (void)state;
    assert_non_null(resolve_start(base, "127.0.0.1", 6379, record, &v4));
    assert_non_null(resolve_start(base, "::1", 2379, record, &v6));
    assert_int_equal(v4.calls, 0); /* never from inside resolve_start() */
    run_until(base, &v6.calls, 1);
    assert_int_equal(v4.calls, 1);
    assert_int_equal(v4.family, AF_INET);
    assert_int_equal(v4.port, 6379);
    assert_string_equal(v4.host, "127.0.0.1");
    assert_int_equal(v6.calls, 1);
    assert_int_equal(v6.family, AF_INET6);
    assert_int_equal(v6.port, 2379);
    assert_string_equal(v6.host, "::1");
    assert_string_equal(v6.err, "");
    event_base_free(base);
}

static void test_a_name_resolves_on_a_worker(void **state)
{
    struct event_base *base = event_base_new();
    struct outcome o = {0};

    (void)state;
    assert_non_null(resolve_start(base, "slow.test", 80, record, &o));
    assert_int_equal(o.calls, 0);
    run_until(base, &o.calls, 1);
    assert_int_equal(o.calls, 1);
    assert_string_equal(o.host, "127.0.0.1");
    assert_int_equal(o.port, 80);
    event_base_free(base);
}

static void test_an_unknown_name_fails_with_its_name(void **state)
{
    struct event_base *base = event_base_new();
    struct outcome o = {0};

    (void)state;
    assert_non_null(resolve_start(base, "missing.test", 80, record, &o));
    run_until(base, &o.calls, 1);
    assert_int_equal(o.calls, 1);
    assert_int_equal(o.family, 0);
    assert_non_null(strstr(o.err, "cannot resolve 'missing.test'"));
    assert_int_equal(resolve_pick_host(NULL, o.host, sizeof(o.host)), -1);
    assert_string_equal(o.host, "");
    event_base_free(base);
}

static int ticks;
static void tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    (void)arg;
    ticks++;
}

static void test_a_stalled_lookup_leaves_the_loop_running(void **state)
{
    struct event_base *base = event_base_new();
    struct event *t = event_new(base, -1, EV_PERSIST, tick, NULL);
    struct timeval ms10 = {0, 10000};
    struct outcome o = {0};

    (void)state;
    gate(1);
    event_add(t, &ms10);
    ticks = 0;
    assert_non_null(resolve_start(base, "slow.test", 1, record, &o));
    run_until(base, &ticks, 20); /* 200 ms of a loop that keeps turning */
    assert_true(ticks >= 20);
    assert_int_equal(o.calls, 0);
    gate(0);
    run_until(base, &o.calls, 1);
    assert_int_equal(o.calls, 1);
    assert_string_equal(o.host, "127.0.0.1");
    event_free(t);
    event_base_free(base);
}

static void test_requests_for_one_name_share_a_lookup(void **state)
{
    struct event_base *base = event_base_new();
    struct outcome a = {0}, b = {0}, c = {0}, other_port = {0};
    int before = slow_calls_now();

    (void)state;
    gate(1);
    assert_non_null(resolve_start(base, "slow.test", 2, record, &a));
    assert_non_null(resolve_start(base, "slow.test", 2, record, &b));
    assert_non_null(resolve_start(base, "slow.test", 2, record, &c));
    assert_non_null(resolve_start(base, "slow.test", 3, record, &other_port));
    wait_slow_calls(before + 2);
    nanosleep(&(struct timespec){0, 50000000}, NULL);
    assert_int_equal(slow_calls_now(), before + 2); /* one per host and port */
    gate(0);
    run_until(base, &other_port.calls, 1);
    run_until(base, &c.calls, 1);
    assert_int_equal(a.calls + b.calls + c.calls, 3);
    assert_true(a.order < b.order && b.order < c.order);
    assert_int_equal(c.port, 2);
    assert_int_equal(other_port.port, 3);
    event_base_free(base);
}

static void test_a_cancelled_request_is_not_called_back(void **state)
{
    struct event_base *base = event_base_new();
    struct outcome kept = {0}, dropped = {0}, alone = {0}, numeric = {0};
    struct resolve_req *r;

    (void)state;
    gate(1);
    r = resolve_start(base, "slow.test", 4, record, &dropped);
    assert_non_null(resolve_start(base, "slow.test", 4, record, &kept));
    resolve_cancel(r);
    /* The only request of a lookup a worker is running: orphaned, freed by the worker. */
    r = resolve_start(base, "slow.test", 5, record, &alone);
    resolve_cancel(r);
    resolve_cancel(resolve_start(base, "127.0.0.1", 6, record, &numeric));
    gate(0);
    run_until(base, &kept.calls, 1);
    assert_int_equal(kept.calls, 1);
    run_ms(base, 100); /* for anything late */
    assert_int_equal(dropped.calls, 0);
    assert_int_equal(alone.calls, 0);
    assert_int_equal(numeric.calls, 0);
    event_base_free(base);
}

static void test_a_request_adopts_a_lookup_whose_requests_all_went(void **state)
{
    struct event_base *base = event_base_new();
    struct outcome gone = {0}, adopter = {0}, other = {0};
    int before = slow_calls_now();
    struct resolve_req *r;

    (void)state;
    gate(1);
    r = resolve_start(base, "slow.test", 8, record, &gone);
    wait_slow_calls(before + 1); /* a worker is in getaddrinfo() */
    resolve_cancel(r);
    /* An attempt after a timeout joins the stalled lookup instead of starting one more. */
    assert_non_null(resolve_start(base, "slow.test", 8, record, &adopter));
    assert_non_null(resolve_start(base, "slow.test", 9, record, &other));
    wait_slow_calls(before + 2);
    nanosleep(&(struct timespec){0, 50000000}, NULL);
    assert_int_equal(slow_calls_now(), before + 2);
    gate(0);
    run_until(base, &adopter.calls, 1);
    run_until(base, &other.calls, 1);
    assert_int_equal(adopter.calls, 1);
    assert_string_equal(adopter.host, "127.0.0.1");
    assert_int_equal(adopter.port, 8);
    assert_int_equal(other.calls, 1);
    assert_int_equal(gone.calls, 0);
    event_base_free(base);
}

static void test_a_callback_may_cancel_a_sibling_and_start_anew(void **state)
{
    struct event_base *base = event_base_new();
    struct outcome first = {0}, second = {0}, again = {0};
    int before;

    (void)state;
    gate(1);
    assert_non_null(resolve_start(base, "slow.test", 7, record, &first));
    first.cancel_in_cb = resolve_start(base, "slow.test", 7, record, &second);
    assert_non_null(first.cancel_in_cb);
    gate(0);
    run_until(base, &first.calls, 1);
    assert_int_equal(first.calls, 1);
    assert_int_equal(second.calls, 0);
    /* The finished lookup is not shared any more: a new request resolves afresh. */
    before = slow_calls_now();
    assert_non_null(resolve_start(base, "slow.test", 7, record, &again));
    run_until(base, &again.calls, 1);
    assert_int_equal(again.calls, 1);
    assert_int_equal(slow_calls_now(), before + 1);
    event_base_free(base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_numeric_addresses_answer_on_the_next_turn),
        cmocka_unit_test(test_a_name_resolves_on_a_worker),
        cmocka_unit_test(test_an_unknown_name_fails_with_its_name),
        cmocka_unit_test(test_a_stalled_lookup_leaves_the_loop_running),
        cmocka_unit_test(test_requests_for_one_name_share_a_lookup),
        cmocka_unit_test(test_a_cancelled_request_is_not_called_back),
        cmocka_unit_test(test_a_request_adopts_a_lookup_whose_requests_all_went),
        cmocka_unit_test(test_a_callback_may_cancel_a_sibling_and_start_anew),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
