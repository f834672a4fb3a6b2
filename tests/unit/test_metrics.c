/* test_metrics.c — unit tests of histogram bucketing and the Prometheus text rendering. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "metrics.h"

#define RENDER_CAP (64 * 1024)

static char *render_all(const struct metrics *m)
{
    char *buf = malloc(RENDER_CAP);
    assert_non_null(buf);
    size_t n = metrics_render(m, buf, RENDER_CAP);
    assert_true(n > 0 && n < RENDER_CAP);
    assert_int_equal(strlen(buf), n);
    return buf;
}

/* Fails unless text holds a line exactly equal to line. */
static void assert_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        if (len == n && memcmp(p, line, n) == 0)
            return;
        p += len + (nl ? 1 : 0);
    }
    fail_msg("line not found: %s", line);
}

static void test_bucket_bounds(void **state)
{
    (void)state;
    assert_int_equal(metrics_bucket_bound(0), 50);
    assert_int_equal(metrics_bucket_bound(1), 100);
    assert_int_equal(metrics_bucket_bound(2), 200);
    assert_int_equal(metrics_bucket_bound(14), 819200);
    assert_true(metrics_bucket_bound(METRICS_BUCKETS - 1) == UINT64_MAX);
    assert_true(metrics_bucket_bound(-1) == UINT64_MAX);
    assert_true(metrics_bucket_bound(METRICS_BUCKETS) == UINT64_MAX);
    for (int i = 1; i < METRICS_BUCKETS; i++)
        assert_true(metrics_bucket_bound(i) > metrics_bucket_bound(i - 1));
}

static void test_observe_edges(void **state)
{
    (void)state;
    struct metrics m;
    memset(&m, 0, sizeof(m));
    /* A value equal to a bound belongs to that bucket ("le"); one more goes to the next. */
    metrics_observe(&m, H_COMMAND_LATENCY, 0);
    metrics_observe(&m, H_COMMAND_LATENCY, 50);
    metrics_observe(&m, H_COMMAND_LATENCY, 51);
    metrics_observe(&m, H_COMMAND_LATENCY, 100);
    metrics_observe(&m, H_COMMAND_LATENCY, 101);
    metrics_observe(&m, H_COMMAND_LATENCY, 819200);
    metrics_observe(&m, H_COMMAND_LATENCY, 819201);
    metrics_observe(&m, H_COMMAND_LATENCY, 10000000);
    uint64_t want[METRICS_BUCKETS] = {0};
    want[0] = 2, want[1] = 2, want[2] = 1, want[14] = 1, want[15] = 1, want[18] = 1;
    for (int i = 0; i < METRICS_BUCKETS; i++)
        assert_int_equal(m.hist[H_COMMAND_LATENCY].bucket[i], want[i]);
    assert_int_equal(m.hist[H_COMMAND_LATENCY].count, 8);
    assert_int_equal(m.hist[H_COMMAND_LATENCY].sum_us,
                     0 + 50 + 51 + 100 + 101 + 819200 + 819201 + 10000000);

    /* Each bound lands in its own bucket, bound + 1 in the next. */
    for (int i = 0; i < METRICS_BUCKETS - 1; i++) {
        memset(&m, 0, sizeof(m));
        metrics_observe(&m, H_COMMAND_LATENCY, metrics_bucket_bound(i));
        metrics_observe(&m, H_COMMAND_LATENCY, metrics_bucket_bound(i) + 1);
        assert_int_equal(m.hist[H_COMMAND_LATENCY].bucket[i], 1);
        assert_int_equal(m.hist[H_COMMAND_LATENCY].bucket[i + 1], 1);
    }

    /* An unknown histogram id changes nothing. */
    memset(&m, 0, sizeof(m));
    metrics_observe(&m, (enum metric_hist)H_HIST_MAX, 10);
    struct metrics zero;
    memset(&zero, 0, sizeof(zero));
    assert_memory_equal(&m, &zero, sizeof(m));
}

static void test_render_values(void **state)
{
    (void)state;
    struct metrics m;
    memset(&m, 0, sizeof(m));
    metrics_inc(&m, M_CONNECTIONS_ACCEPTED, 3);
    metrics_inc(&m, M_COMMANDS_FORWARDED, 1000);
    metrics_inc(&m, M_BYTES_FROM_CLIENTS, 18446744073709551615ull);
    metrics_inc(&m, M_UPSTREAM_CONNECT_ERRORS, 2);
    m.gauge[G_CONNECTIONS_OPEN] = 7;
    m.gauge[G_UPSTREAM_UP] = -1; /* gauges are signed */
    metrics_observe(&m, H_COMMAND_LATENCY, 40);
    metrics_observe(&m, H_COMMAND_LATENCY, 50);
    metrics_observe(&m, H_COMMAND_LATENCY, 150);
    metrics_observe(&m, H_COMMAND_LATENCY, 1000000);
    metrics_observe(&m, H_COMMAND_LATENCY, 5);

    char *t = render_all(&m);
    assert_line(t, "# HELP fencegate_connections_accepted_total Client connections accepted on the "
                   "RESP endpoint.");
    assert_line(t, "# TYPE fencegate_connections_accepted_total counter");
    assert_line(t, "fencegate_connections_accepted_total 3");
    assert_line(t, "fencegate_commands_forwarded_total 1000");
    assert_line(t, "fencegate_bytes_from_clients_total 18446744073709551615");
    assert_line(t, "fencegate_upstream_connect_errors_total 2");
    assert_line(t, "fencegate_http_requests_total 0");
    assert_line(t, "# TYPE fencegate_connections_open gauge");
    assert_line(t, "fencegate_connections_open 7");
    assert_line(t, "# TYPE fencegate_upstream_up gauge");
    assert_line(t, "fencegate_upstream_up -1");
    assert_line(t, "# TYPE fencegate_command_latency_seconds histogram");
    /* Cumulative: 40, 50, 5 are <= 50 us; 150 is <= 200 us; 1 s is above 0.8192 s. */
    assert_line(t, "fencegate_command_latency_seconds_bucket{le=\"0.00005\"} 3");
    assert_line(t, "fencegate_command_latency_seconds_bucket{le=\"0.0001\"} 3");
    assert_line(t, "fencegate_command_latency_seconds_bucket{le=\"0.0002\"} 4");
    assert_line(t, "fencegate_command_latency_seconds_bucket{le=\"0.0004\"} 4");
    assert_line(t, "fencegate_command_latency_seconds_bucket{le=\"0.8192\"} 4");
    assert_line(t, "fencegate_command_latency_seconds_bucket{le=\"+Inf\"} 5");
    assert_line(t, "fencegate_command_latency_seconds_sum 1.000245");
    assert_line(t, "fencegate_command_latency_seconds_count 5");
    free(t);

    /* Sums render exactly, whatever their digits. */
    memset(&m, 0, sizeof(m));
    metrics_observe(&m, H_COMMAND_LATENCY, 2000000);
    t = render_all(&m);
    assert_line(t, "fencegate_command_latency_seconds_sum 2");
    free(t);
    memset(&m, 0, sizeof(m));
    metrics_observe(&m, H_COMMAND_LATENCY, 7);
    t = render_all(&m);
    assert_line(t, "fencegate_command_latency_seconds_sum 0.000007");
    assert_line(t, "fencegate_command_latency_seconds_count 1");
    free(t);
}

static int valid_name(const char *s, size_t n)
{
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
                 (i > 0 && c >= '0' && c <= '9');
        if (!ok)
            return 0;
    }
    return 1;
}

static int valid_value(const char *s, size_t n)
{
    char tmp[64];
    if (n == 0 || n >= sizeof(tmp))
        return 0;
    memcpy(tmp, s, n);
    tmp[n] = '\0';
    if (strcmp(tmp, "+Inf") == 0 || strcmp(tmp, "-Inf") == 0 || strcmp(tmp, "NaN") == 0)
        return 1;
    char *end = NULL;
    (void)strtod(tmp, &end);
    return end == tmp + n;
}

/* Checks `{name="value",...}`; returns the bytes consumed or 0 when malformed. */
static size_t valid_labels(const char *s, size_t n)
{
    size_t i = 1;
    if (n == 0 || s[0] != '{')
        return 0;
    for (;;) {
        size_t start = i;
        while (i < n && s[i] != '=')
            i++;
        if (i >= n || !valid_name(s + start, i - start) || i + 1 >= n || s[i + 1] != '"')
            return 0;
        i += 2;
        while (i < n && s[i] != '"') {
            if (s[i] == '\\')
                i++;
            i++;
        }
        if (i >= n)
            return 0;
        i++; /* closing quote */
        if (i < n && s[i] == ',') {
            i++;
            continue;
        }
        if (i < n && s[i] == '}')
            return i + 1;
        return 0;
    }
}

/* A strict reading of the text exposition format 0.0.4: comment lines are well-formed HELP/TYPE,
 * and every sample belongs to the family last TYPE'd. Returns the number of families. */
static int check_exposition(const char *text, int *counters, int *gauges, int *hists)
{
    char family[128] = "";
    char type[16] = "";
    int families = 0;
    size_t total = strlen(text);
    assert_true(total > 0 && text[total - 1] == '\n');
    for (const char *p = text; *p;) {
        const char *nl = strchr(p, '\n');
        assert_non_null(nl);
        size_t len = (size_t)(nl - p);
        assert_true(len > 0);
        if (p[0] == '#') {
            if (len > 7 && memcmp(p, "# HELP ", 7) == 0) {
                const char *sp = memchr(p + 7, ' ', len - 7);
                assert_non_null(sp);
                assert_true(valid_name(p + 7, (size_t)(sp - (p + 7))));
                assert_true(sp + 1 < nl); /* help text is not empty */
            } else if (len > 7 && memcmp(p, "# TYPE ", 7) == 0) {
                const char *sp = memchr(p + 7, ' ', len - 7);
                assert_non_null(sp);
                size_t nlen = (size_t)(sp - (p + 7));
                assert_true(valid_name(p + 7, nlen) && nlen < sizeof(family));
                memcpy(family, p + 7, nlen);
                family[nlen] = '\0';
                size_t tlen = (size_t)(nl - (sp + 1));
                assert_true(tlen < sizeof(type));
                memcpy(type, sp + 1, tlen);
                type[tlen] = '\0';
                assert_true(strncmp(family, "fencegate_", 10) == 0);
                size_t fl = strlen(family);
                if (strcmp(type, "counter") == 0) {
                    (*counters)++;
                    assert_true(fl > 6 && strcmp(family + fl - 6, "_total") == 0);
                } else if (strcmp(type, "gauge") == 0) {
                    (*gauges)++;
                    assert_false(fl > 6 && strcmp(family + fl - 6, "_total") == 0);
                } else if (strcmp(type, "histogram") == 0) {
                    (*hists)++;
                } else {
                    fail_msg("unexpected type %s", type);
                }
                families++;
            } else {
                fail_msg("stray comment line");
            }
        } else {
            size_t i = 0;
            while (i < len && p[i] != '{' && p[i] != ' ')
                i++;
            assert_true(valid_name(p, i));
            assert_true(family[0] != '\0');
            size_t fl = strlen(family);
            int ok = (i == fl && memcmp(p, family, fl) == 0);
            if (strcmp(type, "histogram") == 0) {
                ok = 0;
                static const char *const sfx[] = {"_bucket", "_sum", "_count"};
                for (int k = 0; k < 3; k++) {
                    size_t sl = strlen(sfx[k]);
                    if (i == fl + sl && memcmp(p, family, fl) == 0 &&
                        memcmp(p + fl, sfx[k], sl) == 0)
                        ok = 1;
                }
                /* Buckets and only buckets carry the le label. */
                assert_int_equal(p[i] == '{', i == fl + 7);
            }
            assert_true(ok);
            if (p[i] == '{') {
                size_t used = valid_labels(p + i, len - i);
                assert_true(used > 0);
                i += used;
            }
            assert_true(i < len && p[i] == ' ');
            i++;
            assert_true(valid_value(p + i, len - i));
        }
        p = nl + 1;
    }
    return families;
}

static void test_render_format(void **state)
{
    (void)state;
    struct metrics m;
    memset(&m, 0, sizeof(m));
    for (int c = 0; c < M_COUNTER_MAX; c++)
        metrics_inc(&m, (enum metric_counter)c, (uint64_t)c * 11 + 1);
    m.gauge[G_CONNECTIONS_OPEN] = 42;
    m.gauge[G_UPSTREAM_UP] = 1;
    for (uint64_t us = 1; us < 4000000; us = us * 3 + 7)
        metrics_observe(&m, H_COMMAND_LATENCY, us);

    char *t = render_all(&m);
    int counters = 0, gauges = 0, hists = 0;
    int families = check_exposition(t, &counters, &gauges, &hists);
    assert_int_equal(counters, M_COUNTER_MAX); /* every counter has a name */
    assert_int_equal(gauges, G_GAUGE_MAX);
    assert_int_equal(hists, H_HIST_MAX);
    assert_int_equal(families, M_COUNTER_MAX + G_GAUGE_MAX + H_HIST_MAX);

    /* Bucket bounds rise, cumulative counts never fall, and +Inf equals _count. */
    const char *needle = "fencegate_command_latency_seconds_bucket{le=\"";
    double prev_le = -1;
    unsigned long long prev = 0, last = 0;
    int buckets = 0;
    for (const char *p = strstr(t, needle); p; p = strstr(p + 1, needle)) {
        const char *le = p + strlen(needle);
        double bound = strncmp(le, "+Inf", 4) == 0 ? 1e300 : strtod(le, NULL);
        assert_true(bound > prev_le);
        prev_le = bound;
        const char *v = strstr(le, "} ");
        assert_non_null(v);
        last = strtoull(v + 2, NULL, 10);
        assert_true(last >= prev);
        prev = last;
        buckets++;
    }
    assert_int_equal(buckets, METRICS_BUCKETS);
    assert_int_equal(last, m.hist[H_COMMAND_LATENCY].count);
    char want[128];
    snprintf(want, sizeof(want), "fencegate_command_latency_seconds_count %llu",
             (unsigned long long)m.hist[H_COMMAND_LATENCY].count);
    assert_line(t, want);
    free(t);

    /* All-zero metrics render a valid exposition too. */
    memset(&m, 0, sizeof(m));
    t = render_all(&m);
    counters = gauges = hists = 0;
    check_exposition(t, &counters, &gauges, &hists);
    assert_line(t, "fencegate_command_latency_seconds_bucket{le=\"+Inf\"} 0");
    assert_line(t, "fencegate_command_latency_seconds_sum 0");
    free(t);
}

static void test_render_truncation(void **state)
{
    (void)state;
    struct metrics m;
    memset(&m, 0, sizeof(m));
    metrics_inc(&m, M_COMMANDS_FORWARDED, 123456789);
    metrics_observe(&m, H_COMMAND_LATENCY, 333);
    char *full = render_all(&m);
    size_t need = strlen(full);
    assert_int_equal(metrics_render(&m, NULL, 0), need);

    char *buf = malloc(need + 16);
    assert_non_null(buf);
    for (size_t cap = 0; cap <= need + 2; cap++) {
        memset(buf, 0xA5, need + 16);
        size_t n = metrics_render(&m, buf, cap);
        assert_int_equal(n, need);
        for (size_t i = cap; i < need + 16; i++)
            assert_int_equal((unsigned char)buf[i], 0xA5); /* nothing written past cap */
        if (cap > 0) {
            size_t keep = cap - 1 < need ? cap - 1 : need;
            assert_memory_equal(buf, full, keep);
            assert_int_equal(buf[keep], '\0');
        }
    }
    free(buf);
    free(full);
}

static void test_global(void **state)
{
    (void)state;
    /* The process-wide instance starts at zero and is a normal struct metrics. */
    struct metrics zero;
    memset(&zero, 0, sizeof(zero));
    assert_memory_equal(&fg_metrics, &zero, sizeof(zero));
    metrics_inc(&fg_metrics, M_HTTP_REQUESTS, 1);
    metrics_observe(&fg_metrics, H_COMMAND_LATENCY, 60);
    char *t = render_all(&fg_metrics);
    assert_line(t, "fencegate_http_requests_total 1");
    assert_line(t, "fencegate_command_latency_seconds_bucket{le=\"0.0001\"} 1");
    free(t);
    memset(&fg_metrics, 0, sizeof(fg_metrics));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bucket_bounds),     cmocka_unit_test(test_observe_edges),
        cmocka_unit_test(test_render_values),     cmocka_unit_test(test_render_format),
        cmocka_unit_test(test_render_truncation), cmocka_unit_test(test_global),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
