/* metrics.c — counter names, histogram buckets and the Prometheus text rendering of the metrics. */
#include "metrics.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>

#include "fg_error.h"

/* The process-wide instance declared in metrics.h; zero at start like any static. */
struct metrics fg_metrics;

/* Bucket 0 ends at 50 us and each next bound doubles, so 19 finite bounds reach 13.1 s; the
 * 20th bucket is +Inf. Integer microseconds keep the rendered bounds exact decimals. */
#define METRICS_FIRST_BOUND_US 50u

struct metrics_desc {
    const char *name;
    const char *help;
};

static const struct metrics_desc metrics_counters[M_COUNTER_MAX] = {
    [M_CONNECTIONS_ACCEPTED] = {"fencegate_connections_accepted_total",
                                "Client connections accepted on the RESP endpoint."},
    [M_CONNECTIONS_REJECTED] = {"fencegate_connections_rejected_total",
                                "Client connections refused because max_clients was reached."},
    [M_COMMANDS_FORWARDED] = {"fencegate_commands_forwarded_total",
                              "Commands forwarded to the upstream Redis."},
    [M_COMMANDS_LOCAL] = {"fencegate_commands_local_total",
                          "Commands answered by fencegate itself."},
    [M_PROTOCOL_ERRORS] = {"fencegate_protocol_errors_total",
                           "Client connections closed for a RESP protocol error."},
    [M_BYTES_FROM_CLIENTS] = {"fencegate_bytes_from_clients_total",
                              "Bytes read from client connections."},
    [M_BYTES_TO_CLIENTS] = {"fencegate_bytes_to_clients_total",
                            "Bytes written to client connections."},
    [M_BYTES_TO_UPSTREAM] = {"fencegate_bytes_to_upstream_total",
                             "Bytes written to upstream connections."},
    [M_BYTES_FROM_UPSTREAM] = {"fencegate_bytes_from_upstream_total",
                               "Bytes read from upstream connections."},
    [M_UPSTREAM_CONNECT_ERRORS] = {"fencegate_upstream_connect_errors_total",
                                   "Failed attempts to connect to the upstream Redis."},
    [M_UPSTREAM_DROPS] = {"fencegate_upstream_drops_total",
                          "Upstream connections lost while in use."},
    [M_UNAVAILABLE_REPLIES] = {"fencegate_unavailable_replies_total",
                               "Commands answered with -UNAVAILABLE."},
    [M_CLIENTS_PINNED] = {"fencegate_clients_pinned_total",
                          "Client connections that left the shared upstream connection for one of "
                          "their own (their first command that keeps state on its connection)."},
    [M_HTTP_REQUESTS] = {"fencegate_http_requests_total", "Requests served on the HTTP endpoint."},
    [M_LOCKS_ACQUIRED] = {"fencegate_locks_acquired_total", "Lock acquisitions granted."},
    [M_LOCKS_BUSY] = {"fencegate_locks_busy_total",
                      "Lock acquisitions refused: held by another holder after the wait."},
    [M_LOCKS_RELEASED] = {"fencegate_locks_released_total",
                          "Locks released by the application or when its session ended."},
    [M_LOCKS_LOST] = {"fencegate_locks_lost_total",
                      "Locks lost: renewal refused or late, or the lease ran out."},
    [M_LOCK_RENEWALS] = {"fencegate_lock_renewals_total", "Lock leases extended."},
    [M_LOCK_RENEWAL_TRIPS] =
        {"fencegate_lock_renewal_round_trips_total",
         "Renewal round trips to the lock backend (one per session per TTL/3)."},
    [M_TOKEN_REPAIRS] = {"fencegate_token_repairs_total",
                         "Token counters raised past a store's high-water mark."},
    [M_TOKEN_REGRESSIONS] = {"fencegate_token_regressions_total",
                             "Grants refused because their token was not above a store's "
                             "high-water mark and could not be raised past it (etcd restored "
                             "from an old snapshot, say)."},
    [M_LOCK_BATCHES] = {"fencegate_lock_backend_batches_total",
                        "Lock backend calls that carried several acquisitions or releases at once "
                        "(etcd Txns)."},
    [M_LOCK_BATCHED] = {"fencegate_lock_backend_batched_total",
                        "Acquisitions and releases sent to the lock backend in such shared calls."},
    [M_FENCED_WRITES] = {"fencegate_fenced_writes_total",
                         "Fenced writes sent to Redis: as scripts, or in a fenced transaction."},
    [M_FENCED_TXNS] = {"fencegate_fenced_transactions_total",
                       "Runs of pipelined fenced writes sent to Redis as one transaction."},
    [M_STALE_REFUSED] =
        {"fencegate_stale_writes_refused_total",
         "Fenced writes refused by the store: token older than its high-water mark."},
    [M_NOLOCK_REFUSED] = {"fencegate_nolock_refused_total",
                          "Writes to protected keys from connections without their lock."},
    [M_LOCKLOST_REFUSED] = {"fencegate_locklost_refused_total",
                            "Writes refused because the connection had lost their lock."},
    [M_PG_REQUESTS] = {"fencegate_pg_requests_total",
                       "SQL batch requests to PostgreSQL stores (POST /v1/stores/{store}/sql)."},
    [M_PG_COMMITTED] = {"fencegate_pg_committed_total", "SQL batches committed."},
    [M_PG_STALE_REFUSED] = {"fencegate_pg_stale_refused_total",
                            "SQL batches rolled back: token older than the store's fence mark."},
    [M_PG_NOLOCK] = {"fencegate_pg_locklost_refused_total",
                     "SQL batches refused before reaching PostgreSQL: lock not held."},
    [M_PG_SQL_ERRORS] = {"fencegate_pg_sql_errors_total",
                         "SQL batches rolled back by an SQL error."},
    [M_PG_UNAVAILABLE] = {"fencegate_pg_unavailable_total",
                          "SQL batches answered 503: the store was unreachable or failing."},
    [M_PG_POOL_FULL] = {"fencegate_pg_pool_exhausted_total",
                        "SQL batches answered 503: no pooled connection became free."},
    [M_PG_FENCE_RAISES] = {"fencegate_pg_fence_raises_total",
                           "Fence marks raised in PostgreSQL stores when a lock was granted."},
    [M_HSTORE_FORWARDED] = {"fencegate_http_store_forwarded_total",
                            "Requests forwarded to HTTP stores."},
    [M_HSTORE_STALE] = {"fencegate_http_store_stale_refused_total",
                        "HTTP store requests refused: the backend's mark is above the token."},
    [M_HSTORE_LOCKLOST] = {"fencegate_http_store_locklost_refused_total",
                           "HTTP store requests refused: their lock is not held or was lost."},
    [M_HSTORE_ERRORS] = {"fencegate_http_store_errors_total",
                         "HTTP store requests that failed: unreachable, timed out or broken."},
    [M_HSTORE_REUSED] = {"fencegate_http_store_connections_reused_total",
                         "Requests forwarded on a kept-alive HTTP store connection."},
    [M_HSTORE_ABANDONED] = {"fencegate_http_store_abandoned_total",
                            "HTTP store requests given up because their client left before the "
                            "answer was through (the store may have applied those sent)."},
    [M_APP_CHECKS] = {"fencegate_app_health_checks_total",
                      "Health checks of the application (app_health.url)."},
    [M_APP_CHECK_FAILURES] = {"fencegate_app_health_check_failures_total",
                              "Health checks of the application that failed."},
};

static const struct metrics_desc metrics_gauges[G_GAUGE_MAX] = {
    [G_CONNECTIONS_OPEN] = {"fencegate_connections_open", "Client connections open now."},
    [G_UPSTREAM_UP] = {"fencegate_upstream_up",
                       "1 when the upstream Redis answered the last health check, else 0."},
    [G_APP_HEALTHY] = {"fencegate_app_healthy",
                       "0 while the application's health check counts as failing (HTTP locks are "
                       "given up), else 1 (also when none is configured)."},
    [G_HTTP_CONNECTIONS_OPEN] = {"fencegate_http_connections_open",
                                 "Connections to the HTTP endpoint open now."},
};

static const struct metrics_desc metrics_hists[H_HIST_MAX] = {
    [H_COMMAND_LATENCY] = {"fencegate_command_latency_seconds",
                           "Time from forwarding a command to the end of its reply."},
    [H_LOCK_WAIT] = {"fencegate_lock_wait_seconds",
                     "Time from an acquisition request to its answer."},
    [H_LOCK_HOLD] = {"fencegate_lock_hold_seconds",
                     "Time a lock was held, from grant to release or loss."},
};

/* Bounded appender: writes what fits, counts everything, like snprintf across many calls. */
struct metrics_out {
    char *buf;
    size_t cap;
    size_t len; /* bytes the full output needs so far */
};

static void metrics_put(struct metrics_out *o, const char *fmt, ...) FG_PRINTF(2, 3);

static void metrics_put(struct metrics_out *o, const char *fmt, ...)
{
    char *dst = NULL;
    size_t room = 0;
    if (o->len < o->cap) {
        dst = o->buf + o->len;
        room = o->cap - o->len;
    }
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(dst, room, fmt, ap);
    va_end(ap);
    if (n > 0)
        o->len += (size_t)n;
}

/* Formats us microseconds as seconds with no rounding: 50 -> "0.00005", 2500000 -> "2.5". */
static void metrics_put_seconds(struct metrics_out *o, uint64_t us)
{
    uint64_t whole = us / 1000000u;
    uint64_t frac = us % 1000000u;
    if (frac == 0) {
        metrics_put(o, "%" PRIu64, whole);
        return;
    }
    int digits = 6;
    while (frac % 10u == 0) {
        frac /= 10u;
        digits--;
    }
    metrics_put(o, "%" PRIu64 ".%0*" PRIu64, whole, digits, frac);
}

static void metrics_put_family(struct metrics_out *o, const struct metrics_desc *d,
                               const char *type)
{
    metrics_put(o, "# HELP %s %s\n# TYPE %s %s\n", d->name, d->help, d->name, type);
}

/* Returns the upper bound of bucket i in microseconds: 50 us doubled i times, UINT64_MAX for the
 * last bucket (+Inf) and for any i out of range. */
uint64_t metrics_bucket_bound(int i)
{
    if (i < 0 || i >= METRICS_BUCKETS - 1)
        return UINT64_MAX;
    return (uint64_t)METRICS_FIRST_BOUND_US << i;
}

/* Counts one observation in the first bucket whose bound is >= us (Prometheus's "le"), and adds it
 * to the sum. An unknown histogram id is ignored. */
void metrics_observe(struct metrics *m, enum metric_hist h, uint64_t us)
{
    if (m == NULL || (unsigned)h >= H_HIST_MAX)
        return;
    int i = 0;
    while (i < METRICS_BUCKETS - 1 && us > metrics_bucket_bound(i))
        i++;
    m->hist[h].bucket[i]++;
    m->hist[h].count++;
    m->hist[h].sum_us += us;
}

/* Renders every counter, gauge and histogram, each with its # HELP and # TYPE lines. Writes at
 * most cap bytes and, when cap > 0, always NUL-terminates within them. Returns the length the
 * full text needs without the NUL (so a result >= cap means it was truncated). */
size_t metrics_render(const struct metrics *m, char *out, size_t cap)
{
    struct metrics_out o = {out, out ? cap : 0, 0};
    if (o.cap > 0)
        out[0] = '\0';
    if (m == NULL)
        return 0;

    /* A name left out of the tables above is skipped rather than printed as "(null)". */
    for (int c = 0; c < M_COUNTER_MAX; c++) {
        if (metrics_counters[c].name == NULL)
            continue;
        metrics_put_family(&o, &metrics_counters[c], "counter");
        metrics_put(&o, "%s %" PRIu64 "\n", metrics_counters[c].name, m->counter[c]);
    }
    for (int g = 0; g < G_GAUGE_MAX; g++) {
        if (metrics_gauges[g].name == NULL)
            continue;
        metrics_put_family(&o, &metrics_gauges[g], "gauge");
        metrics_put(&o, "%s %" PRId64 "\n", metrics_gauges[g].name, m->gauge[g]);
    }
    for (int h = 0; h < H_HIST_MAX; h++) {
        const char *name = metrics_hists[h].name;
        if (name == NULL)
            continue;
        metrics_put_family(&o, &metrics_hists[h], "histogram");
        uint64_t cumulative = 0;
        for (int i = 0; i < METRICS_BUCKETS; i++) {
            cumulative += m->hist[h].bucket[i];
            if (i == METRICS_BUCKETS - 1) {
                metrics_put(&o, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, cumulative);
                break;
            }
            metrics_put(&o, "%s_bucket{le=\"", name);
            metrics_put_seconds(&o, metrics_bucket_bound(i));
            metrics_put(&o, "\"} %" PRIu64 "\n", cumulative);
        }
        metrics_put(&o, "%s_sum ", name);
        metrics_put_seconds(&o, m->hist[h].sum_us);
        metrics_put(&o, "\n%s_count %" PRIu64 "\n", name, m->hist[h].count);
    }
    return o.len;
}
