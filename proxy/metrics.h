/* metrics.h — process-wide counters and latency histograms, rendered as Prometheus text. Pure. */
#ifndef FG_METRICS_H
#define FG_METRICS_H

#include <stddef.h>
#include <stdint.h>

/* Counters. Adding one means adding its name and help text in metrics.c. */
enum metric_counter {
    M_CONNECTIONS_ACCEPTED = 0, /* client connections accepted on the RESP endpoint */
    M_CONNECTIONS_REJECTED,     /* refused: max_clients reached */
    M_COMMANDS_FORWARDED,       /* commands sent to the upstream */
    M_COMMANDS_LOCAL,           /* commands answered by fencegate itself */
    M_PROTOCOL_ERRORS,          /* connections closed for a RESP protocol error */
    M_BYTES_FROM_CLIENTS,
    M_BYTES_TO_CLIENTS,
    M_BYTES_TO_UPSTREAM,
    M_BYTES_FROM_UPSTREAM,
    M_UPSTREAM_CONNECT_ERRORS, /* failed upstream connects */
    M_UPSTREAM_DROPS,          /* upstream connections lost while in use */
    M_UNAVAILABLE_REPLIES,     /* commands answered -UNAVAILABLE */
    M_CLIENTS_PINNED,          /* clients moved off the shared upstream connection to their own */
    M_HTTP_REQUESTS,
    M_LOCKS_ACQUIRED,     /* FENCE.ACQUIRE / POST /v1/locks granted */
    M_LOCKS_BUSY,         /* acquisitions refused: held by another after the wait */
    M_LOCKS_RELEASED,     /* released by the application or at session end */
    M_LOCKS_LOST,         /* renewal refused or late, lease ran out */
    M_LOCK_RENEWALS,      /* lock leases extended (from the lock client) */
    M_LOCK_RENEWAL_TRIPS, /* renewal round trips (one per session per TTL/3) */
    M_TOKEN_REPAIRS,      /* token counters raised past a store's mark */
    M_TOKEN_REGRESSIONS,  /* grants refused: a token not above a store's mark, not raisable */
    M_LOCK_BATCHES,       /* backend calls carrying several acquires/releases (from the client) */
    M_LOCK_BATCHED,       /* the acquires and releases they carried (from the lock client) */
    M_FENCED_WRITES,      /* fenced writes sent to Redis (scripts, or in a transaction) */
    M_FENCED_TXNS,        /* runs of pipelined fenced writes sent as one transaction */
    M_STALE_REFUSED,      /* fenced writes the store refused: token older than its mark */
    M_NOLOCK_REFUSED,     /* writes to protected keys without their lock */
    M_LOCKLOST_REFUSED,   /* writes under a lock the session lost */
    /* PostgreSQL stores (pgstore.c): */
    M_PG_REQUESTS,        /* POST /v1/stores/{postgresql store}/sql requests */
    M_PG_COMMITTED,       /* SQL batches committed */
    M_PG_STALE_REFUSED,   /* SQL batches rolled back: token older than the store's mark */
    M_PG_NOLOCK,          /* SQL batches refused before postgres: lock not held or lost */
    M_PG_SQL_ERRORS,      /* SQL batches rolled back by an SQL error */
    M_PG_UNAVAILABLE,     /* SQL batches answered 503: store unreachable or failing */
    M_PG_POOL_FULL,       /* SQL batches answered 503: no connection free in time */
    M_PG_FENCE_RAISES,    /* fence marks raised in postgresql stores on acquire */
    M_HSTORE_FORWARDED,   /* requests forwarded to HTTP stores */
    M_HSTORE_STALE,       /* HTTP store requests refused: a mark above the token */
    M_HSTORE_LOCKLOST,    /* HTTP store requests refused: the lock not held or lost */
    M_HSTORE_ERRORS,      /* HTTP store requests failed: unreachable, timed out, broken off */
    M_HSTORE_REUSED,      /* forwards sent on a kept-alive store connection */
    M_HSTORE_ABANDONED,   /* forwards given up because their client left first */
    M_APP_CHECKS,         /* the application's health checks (app_health) */
    M_APP_CHECK_FAILURES, /* ... that failed */
    M_COUNTER_MAX
};

/* Gauges. */
enum metric_gauge {
    G_CONNECTIONS_OPEN = 0,  /* client connections open now */
    G_UPSTREAM_UP,           /* 1 when the upstream answered the last health check */
    G_APP_HEALTHY,           /* 0 while the application's health check counts as failing */
    G_HTTP_CONNECTIONS_OPEN, /* connections to the HTTP endpoint open now */
    G_GAUGE_MAX
};

/* Histograms (latency in microseconds, fixed log-spaced buckets). */
enum metric_hist {
    H_COMMAND_LATENCY = 0, /* from forwarding a command to the end of its reply */
    H_LOCK_WAIT,           /* from FENCE.ACQUIRE to its answer */
    H_LOCK_HOLD,           /* from grant to release or loss */
    H_HIST_MAX
};

#define METRICS_BUCKETS 20

struct metrics {
    uint64_t counter[M_COUNTER_MAX];
    int64_t gauge[G_GAUGE_MAX];
    struct {
        uint64_t bucket[METRICS_BUCKETS]; /* non-cumulative counts per bucket; last is +Inf */
        uint64_t count;
        uint64_t sum_us;
    } hist[H_HIST_MAX];
};

/* The process's metrics (the one global of the program; modules that must stay pure do not use
 * it). */
extern struct metrics fg_metrics;

static inline void metrics_inc(struct metrics *m, enum metric_counter c, uint64_t n)
{
    m->counter[c] += n;
}

/* Records one observation of `us` microseconds. */
void metrics_observe(struct metrics *m, enum metric_hist h, uint64_t us);

/* Upper bound (us) of bucket i; UINT64_MAX for the last (+Inf). */
uint64_t metrics_bucket_bound(int i);

/* Renders everything in Prometheus text exposition format 0.0.4 into out (cap bytes). Returns the
 * length needed (like snprintf): if >= cap, the output was truncated; call again with more. */
size_t metrics_render(const struct metrics *m, char *out, size_t cap);

#endif
