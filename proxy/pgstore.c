/* pgstore.c — PostgreSQL stores: libpq's asynchronous API in pipeline mode on the event loop.
 *
 * Each store has a pool of connections. A connection is set up once: statement_timeout; the
 * schema the side table lives in (current_schema() of the fresh connection, so a batch's later
 * search_path or temporary table can never redirect the fence); the table, created there unless
 * it is there already; and the prepared statements, which name it fully qualified and call
 * pg_catalog's functions and operators explicitly.
 *
 * A batch runs in a transaction block that fencegate opens and closes itself, in one round trip
 * when all goes well:
 *   one pipeline ended by a Sync:
 *        BEGIN READ WRITE ISOLATION LEVEL READ COMMITTED (whatever the session's defaults say)
 *        A   set_config LOCAL: fencegate.batch := a random id of this batch, synchronous_commit
 *            := on, statement_timeout := the store's; and the lock's advisory lock, shared (class
 *            PG_ADVISORY_CLASS, key hashtext(lock)): batches of the same holder run side by
 *            side, while a raise by a newer holder's fence on acquire (which takes it exclusive)
 *            waits for them to commit, and batches starting meanwhile wait for the raise;
 *        F   the fence check, in a statement of its own so that its snapshot is taken with the
 *            advisory lock held: the lock's row must hold exactly T. Above T is stale (an error
 *            carrying the mark); missing or below T means the row was deleted or reset behind
 *            fencegate's back (or lost in a failover), refused too, and the lock is given up
 *            (lock_forfeit()) so that the next grant sets the row again (fence on acquire raised
 *            it to T before T was handed out, and marks only grow). A plain read: no row lock,
 *            nothing written;
 *        the application's statements;
 *        C   an error unless fencegate.batch still holds the id: a statement that ended the
 *            block (COMMIT got past the filter) took the LOCAL setting with it, so C fails and
 *            rolls back everything after that COMMIT. Inside a block, procedures and DO cannot
 *            COMMIT at all (PostgreSQL refuses), so this is a second line. C also sets the
 *            session's role back to the one it started with: a role set by set_config()
 *            outlives the batch;
 *        U   UNLISTEN *: a LISTEN reached through dynamic SQL never outlives the batch;
 *        COMMIT.
 * The first error skips everything up to the Sync, COMMIT included: nothing is committed, and the
 * block, left open (failed), is closed by a ROLLBACK in a second round trip after the client was
 * answered. An outcome is ambiguous only when the connection fails after the pipeline was sent
 * and before an error or COMMIT's answer came back (outcome_unknown). Results are rendered as
 * they arrive, up to PGSTORE_RESULT_MAX bytes; a batch whose results are larger is still
 * committed (COMMIT is in the pipeline) and answered 413 without them.
 *
 * Fence on acquire runs the same way: BEGIN, S (the settings and the advisory lock, exclusive),
 * R1 an upsert that raises the mark when it is below the token, R2 a read of the mark, COMMIT.
 *
 * libpq looks host names up with a blocking getaddrinfo() inside PQconnectStartParams() and
 * PQconnectPoll(), which would freeze the loop while a DNS server does not answer. So each new
 * connection first looks the URL's host names up off the loop (resolve.h), then hands libpq the
 * addresses as hostaddr beside host, which keeps the name for TLS verification and .pgpass. */
#include "pgstore.h"

#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "http.h"
#include "httpd.h"
#include "json.h"
#include "log.h"
#include "metrics.h"
#include "pgjson.h"
#include "pqlib.h"
#include "resolve.h"

#define PG_CONNECT_TIMEOUT_MS 3000 /* the lookup; then connect and set-up of one connection */
#define PG_BACKOFF_MIN_MS     100
#define PG_BACKOFF_MAX_MS     5000
/* A connection that read a result this large is made anew once idle: libpq keeps its input
 * buffer as large as the largest message it read, for as long as the connection lives. */
#define PG_RECYCLE_BYTES (4u << 20)
/* A round trip's client-side deadline: statement_timeout for each statement that may use it
 * up, + this. */
#define PG_DEADLINE_SLACK_MS 2000
#define PG_STALE_MARKER      "fencegate stale token"
#define PG_ESCAPE_MARKER     "fencegate: the batch ended the transaction fencegate began"
/* Goes into an SQL string literal: no quotes. */
#define PG_RESET_MARKER                                                                            \
    "fencegate: the fence row of this lock was deleted or lowered behind the back of fencegate; "  \
    "re-acquire the lock to raise it again"

/* Query indexes in round trip 1 of a batch (and of a fence job: R1, R2 at 2 and 3). */
#define PG_Q_BEGIN 0
#define PG_Q_F     2 /* the batch's fence check */
#define PG_NPRE    3 /* queries before the application's statements */
#define PG_Q_R1    2
#define PG_Q_R2    3
/* The class of fencegate's advisory locks (the two-int4 key space, which PostgreSQL keeps apart
 * from the one-bigint one); the other int4 is hashtext(lock name). 0x46454e43 = "FENC". */
#define PG_ADVISORY_CLASS "1178946883"
#define PG_Q_COMMIT       1000000 /* err_index of an error at COMMIT */

/* Where the table is: the first schema on the connection's search_path that has one (as an
 * unqualified name would resolve), else the first schema, where it is created; and the role the
 * session starts with (the URL's options or the login role's settings may name one). Sidecars whose
 * roles differ in search_path then still meet in a table that exists, and a schema named after
 * the role created later ("$user" comes first) does not split the marks. */
static const char pg_sql_schema[] =
    "SELECT (SELECT n.nspname FROM pg_catalog.unnest(pg_catalog.current_schemas(false)) "
    "WITH ORDINALITY AS p(s, i) JOIN pg_catalog.pg_namespace n ON n.nspname OPERATOR(pg_catalog.=) "
    "p.s JOIN pg_catalog.pg_class c ON c.relnamespace OPERATOR(pg_catalog.=) n.oid AND c.relname "
    "OPERATOR(pg_catalog.=) 'fencegate_fence' AND c.relkind OPERATOR(pg_catalog.=) 'r' "
    "ORDER BY p.i LIMIT 1), pg_catalog.current_schema(), pg_catalog.current_setting('role')";

/* Statements name the table as {T}: its quoted, schema-qualified name goes there. */
static const char pg_sql_create[] =
    "CREATE TABLE IF NOT EXISTS {T} (lock text PRIMARY KEY, token bigint NOT NULL)";

static const struct {
    const char *name, *sql;
    int nparams;
    Oid types[4];
} pg_prepared[] = {
    /* Transaction control prepared too: no parse and plan per batch. */
    {"fencegate_fence_begin", "BEGIN READ WRITE ISOLATION LEVEL READ COMMITTED", 0, {0, 0}},
    {"fencegate_fence_commit", "COMMIT", 0, {0, 0}},
    /* Settings of a fence job, and the lock's advisory lock, exclusive: a raise waits for the
     * batches checking the old mark to end, and batches starting meanwhile wait for it. */
    {"fencegate_fence_s",
     "SELECT pg_catalog.set_config('fencegate.batch', $1, true), "
     "pg_catalog.set_config('synchronous_commit', 'on', true), "
     "pg_catalog.set_config('statement_timeout', $2, true), "
     "pg_catalog.pg_advisory_xact_lock(" PG_ADVISORY_CLASS ", pg_catalog.hashtext($3))",
     3,
     {25, 25, 25}},
    /* A batch's settings, and the lock's advisory lock, shared: batches of the current holder run
     * side by side. Taken in its own statement, so that the check after it reads the mark with
     * a snapshot taken once the lock is held (READ COMMITTED). */
    {"fencegate_fence_a",
     "SELECT pg_catalog.set_config('fencegate.batch', $1, true), "
     "pg_catalog.set_config('synchronous_commit', 'on', true), "
     "pg_catalog.set_config('statement_timeout', $2, true), "
     "pg_catalog.pg_advisory_xact_lock_shared(" PG_ADVISORY_CLASS ", pg_catalog.hashtext($3))",
     3,
     {25, 25, 25}},
    /* A batch's fence check. The lock's row must hold exactly the token: fence on acquire raised
     * it to T before T was handed out and marks only grow, so above T is stale, and missing or
     * below T means the row was deleted or reset: refused. Every error branch refers to m, so
     * no branch is folded into an error at plan time. */
    {"fencegate_fence_f",
     "SELECT CASE WHEN m OPERATOR(pg_catalog.=) $2 THEN 0 "
     "WHEN m OPERATOR(pg_catalog.>) $2 THEN CAST('" PG_STALE_MARKER
     " ' OPERATOR(pg_catalog.||) $2 OPERATOR(pg_catalog.||) ' below mark ' "
     "OPERATOR(pg_catalog.||) m AS pg_catalog.int4) "
     "ELSE CAST('" PG_RESET_MARKER " (' OPERATOR(pg_catalog.||) COALESCE(CAST(m AS "
     "pg_catalog.text), 'missing') OPERATOR(pg_catalog.||) ')' AS pg_catalog.int4) END "
     "FROM (SELECT (SELECT token FROM {T} WHERE lock OPERATOR(pg_catalog.=) $1) AS m) AS s",
     2,
     {25, 20}},
    {"fencegate_fence_r1",
     "INSERT INTO {T} AS f (lock, token) VALUES ($1, $2) ON CONFLICT (lock) DO UPDATE SET "
     "token = EXCLUDED.token WHERE f.token OPERATOR(pg_catalog.<) EXCLUDED.token RETURNING token",
     2,
     {25, 20}},
    {"fencegate_fence_r2", "SELECT token FROM {T} WHERE lock OPERATOR(pg_catalog.=) $1", 1, {25}},
    /* The batch's last check; and the role set back to the one the session started with (a role
     * set at session level, by set_config(), would outlive the batch, for every client's later
     * batches). */
    {"fencegate_fence_c",
     "SELECT CASE WHEN pg_catalog.current_setting('fencegate.batch', true) "
     "OPERATOR(pg_catalog.=) $1 THEN 0 ELSE CAST('" PG_ESCAPE_MARKER
     " (' OPERATOR(pg_catalog.||) COALESCE(pg_catalog.current_setting("
     "'fencegate.batch', true), '') OPERATOR(pg_catalog.||) ')' AS pg_catalog.int4) END, "
     "pg_catalog.set_config('role', $2, false)",
     2,
     {25, 25}},
    /* Ends a LISTEN a batch reached through dynamic SQL before it takes effect at COMMIT: a
     * pooled connection left listening would keep every notification in libpq for its life. */
    {"fencegate_fence_u", "UNLISTEN *", 0, {0}},
};
#define PG_NPREPARED ((int)(sizeof(pg_prepared) / sizeof(pg_prepared[0])))

/* Settings the server reports (ParameterStatus) whose session-level change by a batch, through
 * set_config() (the filter refuses SET), would reach every client's later batches on the
 * connection: they run as another user, or read and show values otherwise. */
static const char *const pg_reported[] = {"session_authorization", "TimeZone", "DateStyle",
                                          "IntervalStyle", "standard_conforming_strings"};
#define PG_NREPORTED ((int)(sizeof(pg_reported) / sizeof(pg_reported[0])))

enum pc_state { PC_WAIT, PC_RESOLVING, PC_CONNECTING, PC_SETUP, PC_IDLE, PC_BUSY };

struct pg_job;
struct pg_conn;

#define PG_MAX_ADDRS 8 /* addresses of one host name handed to libpq, which tries each in turn */

/* The lookup of one of the URL's hosts for one connection. */
struct pc_lookup {
    struct pg_conn *c;
    struct resolve_req *req;     /* in flight */
    char addr[PG_MAX_ADDRS][64]; /* its numeric addresses, in the resolver's order */
    int naddrs;                  /* 0 when not a name, or not found */
};

struct pg_conn {
    struct pgstore *s;
    PGconn *pg;
    int fd;
    struct event *rev, *wev; /* rev is persistent while connected */
    struct event *timer;     /* backoff, connect deadline, batch deadline */
    enum pc_state state;
    int backoff_ms;
    int setup_stage; /* 1: settings and current_schema(); 2: the table and prepared statements */
    int setup_syncs; /* set-up segments of this stage still to complete */
    char *table;     /* the side table's quoted, schema-qualified name (malloc) */
    int create;      /* stage 2 creates the table: no schema on the search_path has one */
    struct pg_job *job;
    int phase;     /* PC_BUSY: 1 the batch (its statements and COMMIT), 2 a ROLLBACK after it */
    int qi;        /* the query whose results are being read */
    int in_query;  /* a result of query qi came; the NULL that ends it has not */
    int syncs;     /* Syncs sent and not yet answered */
    char err[256]; /* the first error of the set-up, or of the lookups */
    struct pc_lookup *lk; /* one per host of the URL when it names any (pgstore.hosts) */
    int lookups;          /* lookups in flight (PC_RESOLVING) */
    int recycle;          /* read a result of PG_RECYCLE_BYTES or more: closed once idle */
    char reported[PG_NREPORTED][128]; /* pg_reported once set up, as the server reported them */
    char role[128];                   /* current_setting('role') once connected */
};

struct pg_job {
    struct pgstore *s;
    struct pg_job *prev, *next; /* every live job of the store */
    struct pg_job *qnext;       /* the wait queue */
    int queued;
    int fence;             /* a fence-on-acquire job, not an HTTP one */
    struct httpd_req *req; /* NULL once its client is gone */
    struct pgjson_request rq;
    uint64_t token;
    char tokstr[24];
    char *name;                    /* fence job: the lock */
    struct lock_session_ref owner; /* HTTP job: the session holding the lock */
    lock_fence_done done;
    void *ctx;
    struct event *timer;
    struct pgjson_buf out; /* the rendered results, limited to PGSTORE_RESULT_MAX */
    int nres;
    char batch[40]; /* the random id fencegate.batch holds while the batch's block is open */
    int committed;  /* COMMIT answered COMMIT */
    int commit_qi;  /* the query index of the pipeline's COMMIT */
    int err_index;  /* query index of the first error, -1 */
    char sqlstate[6];
    char *errmsg;
    int raised;
    long long mark;
};

struct pgstore {
    struct pgstores *p;
    const struct cfg_store *cfg;
    struct event_base *base;
    struct pg_conn *conns;
    int nconns;
    long long timeout_ms;
    int queue_max;
    char timeout_str[24]; /* timeout_ms in decimal, for SET LOCAL statement_timeout */
    struct pg_job *jobs;
    struct pg_job *qhead, *qtail;
    int qlen;  /* queued HTTP batches (at most queue_max) */
    int fqlen; /* queued fence-on-acquire jobs (at most PGSTORE_FENCE_QUEUE_MAX) */
    int nlive; /* connections in PC_IDLE or PC_BUSY */
    /* The URL's hosts and ports, as libpq reads them, when a host is a name to look up before
     * each connection (nhosts 0 otherwise: only addresses and sockets, or hostaddr given). */
    char **hosts, **ports;
    int nhosts, nports; /* nports is 0, 1 (every host's) or nhosts */
    char *hostbuf, *portbuf;
    char last_error[512];
    char ready_msg[700];
};

struct pgstores {
    struct pgstore *st;
    int n;
};

static void pg_next_job(struct pgstore *s, struct pg_conn *c);
static void pg_job_done(struct pg_job *j);

/* ---- jobs ---------------------------------------------------------------------------------- */

/* How much of a lock name (len bytes of UTF-8) an answer shows: at most max bytes, cut between
 * characters (a character cut in two would make the answer invalid UTF-8, so invalid JSON). */
static int pg_name_len(const char *name, size_t len, size_t max)
{
    if (len <= max)
        return (int)len;
    while (max > 0 && ((unsigned char)name[max] & 0xC0) == 0x80)
        max--;
    return (int)max;
}

/* Frees j, whose client is answered (which freed its request) or gone. */
static void pg_job_free(struct pg_job *j)
{
    struct pgstore *s = j->s;

    if (j->prev)
        j->prev->next = j->next;
    else
        s->jobs = j->next;
    if (j->next)
        j->next->prev = j->prev;
    if (j->timer)
        event_free(j->timer);
    pgjson_request_free(&j->rq);
    pgjson_buf_free(&j->out);
    free(j->errmsg);
    free(j->name);
    free(j);
}

static void pg_unqueue(struct pg_job *j)
{
    struct pgstore *s = j->s;
    struct pg_job **pp, *prev = NULL;

    if (!j->queued)
        return;
    for (pp = &s->qhead; *pp; prev = *pp, pp = &(*pp)->qnext) {
        if (*pp == j) {
            *pp = j->qnext;
            break;
        }
    }
    if (s->qtail == j) /* the head leaves in O(1): a full queue of queue_max drains linearly */
        s->qtail = prev;
    j->qnext = NULL;
    j->queued = 0;
    if (j->fence)
        s->fqlen--;
    else
        s->qlen--;
}

/* Answers a job that did not run to its end (or ran into an error of fencegate's own) and frees
 * it. code/status go to the HTTP client; a fence job gets -1 with the message. */
static void pg_job_fail(struct pg_job *j, int status, const char *code, const char *msg)
{
    char text[900];

    pg_unqueue(j);
    snprintf(text, sizeof(text), "postgresql store '%s': %s", j->s->cfg->name, msg);
    if (j->fence) {
        j->done(j->ctx, -1, 0, text);
    } else if (j->req) {
        if (!strcmp(code, "pool_exhausted"))
            metrics_inc(&fg_metrics, M_PG_POOL_FULL, 1);
        else if (!strcmp(code, "store_unavailable") || !strcmp(code, "outcome_unknown"))
            metrics_inc(&fg_metrics, M_PG_UNAVAILABLE, 1);
        http_reply_error(j->req, status, code, text);
    }
    pg_job_free(j);
}

static void pg_on_job_timer(evutil_socket_t fd, short what, void *arg)
{
    struct pg_job *j = arg;
    char msg[160];

    /* Only queued jobs carry this timer; running ones are bounded by their connection's. */
    snprintf(msg, sizeof(msg), "no connection became free within %lld ms (pool of %d)",
             j->s->timeout_ms, j->s->nconns);
    pg_job_fail(j, 503, "pool_exhausted", msg);
}

/* The client went away (closed its connection, or it broke): a running batch carries on, its
 * outcome unanswered; a queued one leaves the queue at once, unsent, instead of holding its place
 * until its turn or its timeout (a client that gave up may send the batch again, and this one
 * must not run as well). */
static void pg_on_client_gone(void *arg)
{
    struct pg_job *j = arg;

    j->req = NULL;
    if (j->queued) {
        pg_unqueue(j);
        pg_job_free(j);
    }
}

/* ---- connections --------------------------------------------------------------------------- */

static void pc_quiet(void *arg, const char *message)
{
}

static void pc_events_free(struct pg_conn *c)
{
    if (c->rev)
        event_free(c->rev);
    if (c->wev)
        event_free(c->wev);
    c->rev = c->wev = NULL;
    c->fd = -1;
}

static void pc_on_read(evutil_socket_t fd, short what, void *arg);
static void pc_on_write(evutil_socket_t fd, short what, void *arg);

static void pc_cancel_lookups(struct pg_conn *c)
{
    for (int i = 0; c->lk && i < c->s->nhosts; i++) {
        resolve_cancel(c->lk[i].req);
        c->lk[i].req = NULL;
    }
    c->lookups = 0;
}

static int pc_events(struct pg_conn *c)
{
    int fd = pq.PQsocket(c->pg);

    if (fd == c->fd && c->rev)
        return 0;
    pc_events_free(c);
    if (fd < 0)
        return -1;
    c->rev = event_new(c->s->base, fd, EV_READ | EV_PERSIST, pc_on_read, c);
    c->wev = event_new(c->s->base, fd, EV_WRITE, pc_on_write, c);
    if (!c->rev || !c->wev) {
        pc_events_free(c);
        return -1;
    }
    c->fd = fd;
    return 0;
}

static void pc_timer(struct pg_conn *c, long long ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};

    evtimer_add(c->timer, &tv);
}

static void pg_update_live(struct pgstore *s)
{
    int n = 0;

    for (int i = 0; i < s->nconns; i++)
        if (s->conns[i].state == PC_IDLE || s->conns[i].state == PC_BUSY)
            n++;
    if (s->nlive > 0 && n == 0)
        log_warn("postgresql store '%s' is unreachable: %s", s->cfg->name, s->last_error);
    else if (s->nlive == 0 && n > 0)
        log_info("postgresql store '%s' is reachable", s->cfg->name);
    s->nlive = n;
    if (n == 0) {
        /* Nobody can serve the queue now: answer it rather than let it wait. */
        while (s->qhead)
            pg_job_fail(s->qhead, 503, "store_unavailable", s->last_error);
    }
}

/* Closes c's PostgreSQL connection (lookups, events, libpq, its side table's name): c waits
 * (PC_WAIT) for its timer to make it again. */
static void pc_disconnect(struct pg_conn *c)
{
    pc_cancel_lookups(c);
    pc_events_free(c);
    if (c->pg)
        pq.PQfinish(c->pg);
    c->pg = NULL;
    free(c->table);
    c->table = NULL;
    if (c->timer)
        evtimer_del(c->timer);
    c->state = PC_WAIT;
    c->syncs = 0;
}

/* Drops the connection and reconnects after a backoff. Its batch, if any, is answered 503:
 * outcome_unknown while its COMMIT may have run (no error and no answer to COMMIT yet),
 * store_unavailable when an error had already doomed it (the block dies with the connection, so
 * nothing was committed). */
static void pc_broken(struct pg_conn *c, const char *why)
{
    struct pgstore *s = c->s;
    struct pg_job *j = c->job;
    int phase = c->phase;
    char msg[700];
    size_t n;

    snprintf(s->last_error, sizeof(s->last_error), "%s", why && *why ? why : "connection lost");
    n = strlen(s->last_error);
    while (n > 0 && (s->last_error[n - 1] == '\n' || s->last_error[n - 1] == ' '))
        s->last_error[--n] = '\0';
    c->job = NULL;
    c->phase = 0;
    pc_disconnect(c);
    c->backoff_ms = c->backoff_ms ? c->backoff_ms * 2 : PG_BACKOFF_MIN_MS;
    if (c->backoff_ms > PG_BACKOFF_MAX_MS)
        c->backoff_ms = PG_BACKOFF_MAX_MS;
    pc_timer(c, c->backoff_ms / 2 + rand() % (c->backoff_ms / 2 + 1));
    if (j && j->committed) {
        pg_job_done(j); /* COMMIT was answered: committed, with every result read */
    } else if (j && phase == 1 && j->err_index < 0) {
        snprintf(msg, sizeof(msg),
                 "the connection failed after the batch and its COMMIT were sent (%s): it may or "
                 "may not have committed; read the data back before retrying",
                 s->last_error);
        pg_job_fail(j, 503, "outcome_unknown", msg);
    } else if (j) {
        snprintf(msg, sizeof(msg),
                 "the connection failed before the batch was committed (%s); it was rolled back: "
                 "nothing was committed",
                 s->last_error);
        pg_job_fail(j, 503, "store_unavailable", msg);
    }
    pg_update_live(s);
}

static int pc_flush(struct pg_conn *c)
{
    int rc = pq.PQflush(c->pg);

    if (rc < 0) {
        pc_broken(c, pq.PQerrorMessage(c->pg));
        return -1;
    }
    if (rc > 0)
        event_add(c->wev, NULL);
    return 0;
}

/* Connected, stage 1: the settings and the schema for the side table, each segment ended by a
 * Sync. */
static void pc_setup(struct pg_conn *c)
{
    char sql[96];
    int ok;

    pq.PQsetNoticeProcessor(c->pg, pc_quiet, NULL);
    if (pq.PQsetnonblocking(c->pg, 1) != 0 || pq.PQenterPipelineMode(c->pg) != 1) {
        pc_broken(c, pq.PQerrorMessage(c->pg));
        return;
    }
    snprintf(sql, sizeof(sql), "SET statement_timeout = %lld", c->s->timeout_ms);
    ok = pq.PQsendQueryParams(c->pg, sql, 0, NULL, NULL, NULL, NULL, 0) &&
         pq.PQpipelineSync(c->pg) &&
         pq.PQsendQueryParams(c->pg, pg_sql_schema, 0, NULL, NULL, NULL, NULL, 0) &&
         pq.PQpipelineSync(c->pg);
    if (!ok) {
        pc_broken(c, pq.PQerrorMessage(c->pg));
        return;
    }
    c->state = PC_SETUP;
    c->setup_stage = 1;
    c->setup_syncs = 2;
    c->syncs = 2;
    c->qi = 0;
    c->in_query = 0;
    c->err[0] = '\0';
    event_add(c->rev, NULL);
    pc_flush(c);
}

/* Stage 1's answer: the first schema on the search_path that has the table, else the first
 * schema (NULL when search_path names none); and the role the session started with. */
static void pc_setup_schema(struct pg_conn *c, const PGresult *r)
{
    int col = pq.PQntuples(r) == 1 && pq.PQnfields(r) == 3 && pq.PQgetisnull(r, 0, 0) ? 1 : 0;
    const char *schema =
        pq.PQntuples(r) == 1 && !pq.PQgetisnull(r, 0, col) ? pq.PQgetvalue(r, 0, col) : NULL;
    char *q;
    size_t n;

    if (pq.PQntuples(r) != 1 || pq.PQnfields(r) != 3 || pq.PQgetisnull(r, 0, 2) ||
        pq.PQgetlength(r, 0, 2) >= (int)sizeof(c->role)) {
        snprintf(c->err, sizeof(c->err), "setting up the connection: cannot read its role");
        return;
    }
    snprintf(c->role, sizeof(c->role), "%s", pq.PQgetvalue(r, 0, 2));
    if (!schema) {
        snprintf(c->err, sizeof(c->err),
                 "setting up the connection: no schema to create fencegate_fence in (the "
                 "connection's search_path names no existing schema)");
        return;
    }
    if (!strncmp(schema, "pg_temp", 7) || !strncmp(schema, "pg_toast_temp", 13)) {
        snprintf(c->err, sizeof(c->err),
                 "setting up the connection: the connection's first schema is temporary (%s); "
                 "fencegate_fence must live in a permanent one",
                 schema);
        return;
    }
    q = pq.PQescapeIdentifier(c->pg, schema, strlen(schema));
    if (!q) {
        snprintf(c->err, sizeof(c->err), "setting up the connection: cannot quote schema '%s'",
                 schema);
        return;
    }
    /* Only when no schema has it: CREATE TABLE IF NOT EXISTS needs CREATE on the schema even
     * when the table exists, which a role given only what the application needs lacks. */
    c->create = col == 1;
    n = strlen(q) + sizeof(".fencegate_fence");
    free(c->table);
    c->table = malloc(n);
    if (c->table)
        snprintf(c->table, n, "%s.fencegate_fence", q);
    else
        snprintf(c->err, sizeof(c->err), "setting up the connection: out of memory");
    pq.PQfreemem(q);
}

/* tmpl with its {T} (if any) replaced by table, into out[0..n). 0 when it does not fit. */
static int pg_fill(char *out, size_t n, const char *tmpl, const char *table)
{
    const char *t = strstr(tmpl, "{T}");
    int w;

    if (!t)
        w = snprintf(out, n, "%s", tmpl);
    else
        w = snprintf(out, n, "%.*s%s%s", (int)(t - tmpl), tmpl, table, t + 3);
    return w >= 0 && (size_t)w < n;
}

/* Stage 2: the table in that schema unless it is there (a failing CREATE must not undo the rest:
 * its own segment) and the prepared statements, which name it qualified. */
static void pc_setup2(struct pg_conn *c)
{
    char sql[1024];
    int ok = 1;

    if (c->create)
        ok = pg_fill(sql, sizeof(sql), pg_sql_create, c->table) &&
             pq.PQsendQueryParams(c->pg, sql, 0, NULL, NULL, NULL, NULL, 0) &&
             pq.PQpipelineSync(c->pg);
    for (int i = 0; ok && i < PG_NPREPARED; i++)
        ok = pg_fill(sql, sizeof(sql), pg_prepared[i].sql, c->table) &&
             pq.PQsendPrepare(c->pg, pg_prepared[i].name, sql, pg_prepared[i].nparams,
                              pg_prepared[i].types);
    if (!ok || !pq.PQpipelineSync(c->pg)) {
        pc_broken(c, pq.PQerrorMessage(c->pg));
        return;
    }
    c->setup_stage = 2;
    c->setup_syncs = c->create ? 2 : 1;
    c->syncs = c->setup_syncs;
    c->qi = 0;
    c->in_query = 0;
    pc_flush(c);
}

static void pc_poll(struct pg_conn *c)
{
    PostgresPollingStatusType st = pq.PQconnectPoll(c->pg);

    if (st == PGRES_POLLING_FAILED) {
        pc_broken(c, pq.PQerrorMessage(c->pg));
        return;
    }
    if (pc_events(c) < 0) {
        pc_broken(c, "cannot watch the connection's socket");
        return;
    }
    event_del(c->rev);
    event_del(c->wev);
    if (st == PGRES_POLLING_READING)
        event_add(c->rev, NULL);
    else if (st == PGRES_POLLING_WRITING)
        event_add(c->wev, NULL);
    else if (st == PGRES_POLLING_OK)
        pc_setup(c);
}

/* 1 when libpq would look host up: not empty, not a socket directory ('/', or '@' for an
 * abstract socket), not a numeric address. */
static int pg_is_name(const char *host)
{
    unsigned char a[sizeof(struct in6_addr)];

    return *host && *host != '/' && *host != '@' && inet_pton(AF_INET, host, a) != 1 &&
           inet_pton(AF_INET6, host, a) != 1;
}

/* Appends item to the comma-separated list out (k items so far). 0 when it does not fit. */
static int pg_list_add(char *out, size_t cap, int k, const char *item)
{
    size_t n = strlen(out);
    int w = snprintf(out + n, cap - n, "%s%s", k ? "," : "", item);

    return w >= 0 && (size_t)w < cap - n;
}

static void pc_connect(struct pg_conn *c)
{
    struct pgstore *s = c->s;
    /* After dbname, so that they win over the URL's: JSON is UTF-8 both ways; and the hosts
     * whose names were found, with their addresses. */
    const char *kw[] = {
        "application_name", "dbname", "client_encoding", "host", "hostaddr", "port", NULL};
    const char *val[] = {"fencegate", s->cfg->url.raw, "UTF8", NULL, NULL, NULL, NULL};
    size_t hcap = (strlen(s->cfg->url.raw) + 1) * PG_MAX_ADDRS,
           acap = (size_t)s->nhosts * PG_MAX_ADDRS * 64 + 1;
    char *host = NULL, *addr = NULL, *port = NULL;
    int k = 0, ok = 1;

    if (s->nhosts) {
        /* A name that was not found is left out, as libpq skips a host it cannot resolve. */
        host = calloc(1, hcap);
        addr = calloc(1, acap);
        port = calloc(1, hcap);
        ok = host && addr && port;
        /* A name with several addresses is listed once per address, as libpq would try them. */
        for (int i = 0; ok && i < s->nhosts; i++) {
            int name = pg_is_name(s->hosts[i]);
            for (int j = 0; ok && j < (name ? c->lk[i].naddrs : 1); j++) {
                ok = pg_list_add(host, hcap, k, s->hosts[i]) &&
                     pg_list_add(addr, acap, k, name ? c->lk[i].addr[j] : "") &&
                     (s->nports < 2 || pg_list_add(port, hcap, k, s->ports[i]));
                k++;
            }
        }
        if (!ok || k == 0) {
            free(host);
            free(addr);
            free(port);
            pc_broken(c, !ok ? "out of memory" : c->err);
            return;
        }
        val[3] = host;
        val[4] = addr;
        val[5] = s->nports > 1 ? port : NULL; /* NULL: the URL's port, for every host */
    }
    c->pg = pq.PQconnectStartParams(kw, val, 1);
    free(host);
    free(addr);
    free(port);
    if (!c->pg) {
        pc_broken(c, "out of memory");
        return;
    }
    if (pq.PQstatus(c->pg) == CONNECTION_BAD) {
        pc_broken(c, pq.PQerrorMessage(c->pg));
        return;
    }
    c->state = PC_CONNECTING;
    pc_timer(c, PG_CONNECT_TIMEOUT_MS);
    if (pc_events(c) < 0) {
        pc_broken(c, "cannot watch the connection's socket");
        return;
    }
    event_add(c->wev, NULL); /* "as if PQconnectPoll had returned PGRES_POLLING_WRITING" */
}

static void pc_resolved(const struct addrinfo *res, const char *err, void *arg)
{
    struct pc_lookup *lk = arg;
    struct pg_conn *c = lk->c;

    lk->req = NULL;
    for (const struct addrinfo *a = res; a && lk->naddrs < PG_MAX_ADDRS; a = a->ai_next) {
        resolve_numeric_host(a->ai_addr, lk->addr[lk->naddrs], sizeof(lk->addr[0]));
        lk->naddrs += lk->addr[lk->naddrs][0] != '\0';
    }
    if (!lk->naddrs && !c->err[0])
        snprintf(c->err, sizeof(c->err), "%s", err ? err : "cannot resolve the host");
    if (--c->lookups == 0)
        pc_connect(c);
}

/* A new connection: the URL's names are looked up again, as they may now name other addresses.
 * Connects at once when no host is a name. */
static void pc_start(struct pg_conn *c)
{
    struct pgstore *s = c->s;

    c->err[0] = '\0';
    for (int i = 0; i < s->nhosts; i++) {
        long port = s->nports ? strtol(s->ports[i < s->nports ? i : 0], NULL, 10) : 0;
        c->lk[i].naddrs = 0;
        if (!pg_is_name(s->hosts[i]))
            continue;
        c->lk[i].req =
            resolve_start(s->base, s->hosts[i], port > 0 && port < 65536 ? (int)port : 5432,
                          pc_resolved, &c->lk[i]);
        if (!c->lk[i].req) {
            pc_broken(c, "cannot resolve: out of memory or threads");
            return;
        }
        c->lookups++;
    }
    if (c->lookups == 0) {
        pc_connect(c);
        return;
    }
    c->state = PC_RESOLVING;
    pc_timer(c, PG_CONNECT_TIMEOUT_MS);
}

static void pc_on_timer(evutil_socket_t fd, short what, void *arg)
{
    struct pg_conn *c = arg;
    char msg[160];

    switch (c->state) {
    case PC_WAIT:
        pc_start(c);
        break;
    case PC_RESOLVING:
        snprintf(msg, sizeof(msg), "resolving timed out after %d ms", PG_CONNECT_TIMEOUT_MS);
        for (int i = 0; i < c->s->nhosts; i++) {
            if (c->lk[i].req) {
                snprintf(msg, sizeof(msg), "resolving '%.80s' timed out after %d ms",
                         c->s->hosts[i], PG_CONNECT_TIMEOUT_MS);
                break;
            }
        }
        pc_broken(c, msg);
        break;
    case PC_CONNECTING:
    case PC_SETUP:
        snprintf(msg, sizeof(msg), "no connection within %d ms", PG_CONNECT_TIMEOUT_MS);
        pc_broken(c, msg);
        break;
    case PC_BUSY:
        snprintf(msg, sizeof(msg), "no answer in time (statement_timeout %lld ms per statement)",
                 c->s->timeout_ms);
        pc_broken(c, msg);
        break;
    case PC_IDLE:
        break;
    }
}

static void pc_on_write(evutil_socket_t fd, short what, void *arg)
{
    struct pg_conn *c = arg;

    if (c->state == PC_CONNECTING)
        pc_poll(c);
    else if (c->pg)
        pc_flush(c);
}

/* ---- results ------------------------------------------------------------------------------- */

static const char *pg_col_name(void *arg, int col)
{
    return pq.PQfname(arg, col);
}

static unsigned pg_col_type(void *arg, int col)
{
    return pq.PQftype(arg, col);
}

static const char *pg_value(void *arg, int row, int col, size_t *n)
{
    if (pq.PQgetisnull(arg, row, col))
        return NULL;
    *n = (size_t)pq.PQgetlength(arg, row, col);
    return pq.PQgetvalue(arg, row, col);
}

static void pg_job_error(struct pg_job *j, int qi, const PGresult *r)
{
    const char *st = pq.PQresultErrorField(r, PG_DIAG_SQLSTATE);
    const char *msg = pq.PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY);

    if (j->err_index >= 0)
        return;
    j->err_index = qi;
    snprintf(j->sqlstate, sizeof(j->sqlstate), "%s", st ? st : "");
    j->errmsg = strdup(msg ? msg : pq.PQresultErrorMessage(r));
}

/* One result of query qi of the running batch (or of the set-up). */
static void pc_result(struct pg_conn *c, PGresult *r)
{
    struct pg_job *j = c->job;
    ExecStatusType st = pq.PQresultStatus(r);

    if (c->state == PC_SETUP) {
        if (st == PGRES_FATAL_ERROR && !c->err[0]) {
            const char *code = pq.PQresultErrorField(r, PG_DIAG_SQLSTATE);
            /* Two connections creating the side table at once: one loses, harmlessly. */
            if (!(c->setup_stage == 2 && c->create && c->setup_syncs == 2 && code &&
                  (!strcmp(code, "42P07") || !strcmp(code, "23505"))))
                snprintf(c->err, sizeof(c->err), "setting up the connection: %s",
                         pq.PQresultErrorMessage(r));
        } else if (st == PGRES_TUPLES_OK && c->setup_stage == 1 && c->setup_syncs == 1 &&
                   !c->err[0]) {
            pc_setup_schema(c, r);
        }
        return;
    }
    if (!j || c->phase != 1)
        return; /* a ROLLBACK's job was answered already */
    if (c->qi == j->commit_qi) {
        if (st == PGRES_FATAL_ERROR)
            pg_job_error(j, PG_Q_COMMIT, r);
        else if (st == PGRES_COMMAND_OK && !strcmp(pq.PQcmdStatus(r), "COMMIT"))
            j->committed = 1;
        return;
    }
    if (j->committed)
        return; /* an error after COMMIT answered (the server going away) changes nothing */
    if (st == PGRES_FATAL_ERROR) {
        pg_job_error(j, c->qi, r);
        return;
    }
    if (st == PGRES_PIPELINE_ABORTED || j->err_index >= 0)
        return;
    if (j->fence) {
        if (c->qi == PG_Q_R1 && pq.PQntuples(r) > 0)
            j->raised = 1;
        if (c->qi == PG_Q_R2 && pq.PQntuples(r) > 0)
            j->mark = strtoll(pq.PQgetvalue(r, 0, 0), NULL, 10);
        return;
    }
    if (c->qi >= PG_NPRE && c->qi < PG_NPRE + j->rq.nstmts && !j->out.failed) {
        /* Every statement gets a result, so results line up with statements. j->out stops at
         * its limit (PGSTORE_RESULT_MAX); then the rest is not rendered and the batch fails. */
        struct pgjson_result pr = {pq.PQcmdStatus(r), pq.PQnfields(r), pq.PQntuples(r), r,
                                   pg_col_name,       pg_col_type,     pg_value};
        if (j->nres++)
            pgjson_put(&j->out, ",", 1);
        pgjson_put_result(&j->out, &pr);
    }
}

/* The fence's stale error carries the mark: "... below mark 42". */
static long long pg_stale_mark(const char *msg)
{
    const char *m = msg ? strstr(msg, " below mark ") : NULL;

    return m ? strtoll(m + strlen(" below mark "), NULL, 10) : -1;
}

/* 1 when every result of the job came back fine. */
static int pg_job_ok(const struct pg_job *j)
{
    return j->err_index < 0 && !j->out.failed;
}

/* Answers a fence job: after COMMIT's answer, or (failed) before its ROLLBACK. */
static void pg_fence_done(struct pg_job *j)
{
    char text[900];

    if (j->err_index >= 0) {
        snprintf(text, sizeof(text),
                 "postgresql store '%s': raising the fence mark failed: %s (SQLSTATE %s)",
                 j->s->cfg->name, j->errmsg ? j->errmsg : "", j->sqlstate);
        j->done(j->ctx, -1, 0, text);
    } else if (!j->committed) {
        snprintf(text, sizeof(text),
                 "postgresql store '%s': raising the fence mark failed: the transaction did not "
                 "commit",
                 j->s->cfg->name);
        j->done(j->ctx, -1, 0, text);
    } else if (j->raised) {
        metrics_inc(&fg_metrics, M_PG_FENCE_RAISES, 1);
        j->done(j->ctx, 0, 0, NULL);
    } else {
        snprintf(text, sizeof(text),
                 "postgresql store '%s': its mark %lld is at or above the new token",
                 j->s->cfg->name, j->mark);
        j->done(j->ctx, 1, j->mark > 0 ? (uint64_t)j->mark : 0, text);
    }
    pg_job_free(j);
}

/* 1 when the batch's fence check found the row fence on acquire set to T gone or lower. */
static int pg_job_reset(const struct pg_job *j)
{
    return !j->committed && j->err_index == PG_Q_F && j->errmsg &&
           strstr(j->errmsg, PG_RESET_MARKER) != NULL;
}

/* 1 when the batch's fence check found the row above T: a newer grant raised it. */
static int pg_job_stale(const struct pg_job *j)
{
    return !j->committed && j->err_index == PG_Q_F && j->errmsg &&
           strstr(j->errmsg, PG_STALE_MARKER) != NULL;
}

/* Which of fencegate's own statements the batch's first error is in ("BEGIN", ...), or NULL when
 * it is in one of the batch's statements (or there is none). At COMMIT only a missing prepared
 * statement (26000) is fencegate's; a deferred constraint there is the batch's. */
static const char *pg_job_own_error(const struct pg_job *j)
{
    static const char *const pre[PG_NPRE] = {"BEGIN", "the settings and the advisory lock",
                                             "the fence check"};

    if (j->err_index >= 0 && j->err_index < PG_NPRE)
        return pre[j->err_index];
    if (j->err_index == PG_NPRE + j->rq.nstmts)
        return "the check after the statements";
    if (j->err_index == PG_NPRE + j->rq.nstmts + 1)
        return "UNLISTEN *";
    if (j->err_index == PG_Q_COMMIT && !strcmp(j->sqlstate, "26000"))
        return "COMMIT";
    return NULL;
}

/* Answers an HTTP batch: after COMMIT's answer, or (failed) before its ROLLBACK. */
static void pg_job_done(struct pg_job *j)
{
    struct pgjson_buf b = {0};
    char esc[PGJSON_MAX_LOCK * 6 + 1], text[2 * PGJSON_MAX_LOCK * 6 + 800];
    const char *name = j->s->cfg->name;
    int stale;

    if (j->fence) {
        pg_fence_done(j);
        return;
    }
    stale = pg_job_stale(j);
    if (stale || pg_job_reset(j)) {
        /* The row is above the token (a newer grant raised it: the lock is another's, whatever
         * the lease says), or gone or lower: the lock is given up, so that acquiring it again
         * yields a new token, which raises the row anew; whether or not the client still waits. */
        char why[200];
        snprintf(why, sizeof(why), "postgresql store '%s': its fence row is %s the token", name,
                 stale ? "above" : "gone or below");
        lock_forfeit(j->owner, j->rq.lock, j->rq.lock_len, j->token, why);
    }
    if (!j->req) {
        pg_job_free(j);
        return;
    }
    json_escape(esc, sizeof(esc), j->rq.lock);
    if (pg_job_ok(j) && j->committed) {
        metrics_inc(&fg_metrics, M_PG_COMMITTED, 1);
        pgjson_puts(&b, "{\"lock\":\"");
        pgjson_puts(&b, esc);
        pgjson_puts(&b, "\",\"token\":");
        pgjson_puts(&b, j->tokstr);
        pgjson_puts(&b, ",\"results\":[");
        pgjson_put(&b, j->out.p ? j->out.p : "", j->out.len);
        pgjson_puts(&b, "]}");
        if (b.failed)
            http_reply_error(j->req, 500, "internal",
                             "out of memory rendering the results (the batch was committed)");
        else
            http_reply_json(j->req, 200, b.p);
    } else if (j->committed && j->out.over) {
        metrics_inc(&fg_metrics, M_PG_COMMITTED, 1);
        snprintf(text, sizeof(text),
                 "{\"error\":\"result_too_large\",\"committed\":true,\"message\":\"postgresql "
                 "store '%s': the batch was committed, but its results are larger than %u bytes "
                 "of JSON and are not returned (select fewer rows or columns)\"}",
                 name, PGSTORE_RESULT_MAX);
        http_reply_json(j->req, 413, text);
    } else if (j->committed) {
        http_reply_error(j->req, 500, "internal",
                         "out of memory rendering the results (the batch was committed)");
    } else if (pg_job_ok(j)) {
        snprintf(text, sizeof(text),
                 "postgresql store '%s': COMMIT did not commit the batch; it was rolled back",
                 name);
        http_reply_error(j->req, 500, "internal", text);
    } else if (j->err_index < 0 || (j->err_index == PG_NPRE + j->rq.nstmts && j->errmsg &&
                                    strstr(j->errmsg, PG_ESCAPE_MARKER))) {
        /* Only reachable if a statement ended the block despite the filter. */
        snprintf(text, sizeof(text),
                 "postgresql store '%s': a statement of the batch ended fencegate's transaction "
                 "(a COMMIT or ROLLBACK the filter did not recognise); the statements after it "
                 "were rolled back, those before it may have been committed",
                 name);
        metrics_inc(&fg_metrics, M_PG_SQL_ERRORS, 1);
        http_reply_error(j->req, 500, "transaction_escaped", text);
    } else if (stale) {
        long long mark = pg_stale_mark(j->errmsg);
        metrics_inc(&fg_metrics, M_PG_STALE_REFUSED, 1);
        snprintf(text, sizeof(text),
                 "{\"error\":\"stale_token\",\"message\":\"lock %s: token %s is older than the "
                 "store's mark %lld (a newer holder exists); the batch was rolled back\","
                 "\"lock\":\"%s\",\"token\":%s,\"mark\":%lld}",
                 esc, j->tokstr, mark, esc, j->tokstr, mark);
        http_reply_json(j->req, 409, text);
    } else if (pg_job_reset(j)) {
        metrics_inc(&fg_metrics, M_PG_NOLOCK, 1);
        snprintf(text, sizeof(text),
                 "postgresql store '%s': the fence row of lock %.*s is gone or below token %s "
                 "(the row fence on acquire set was deleted, or lost in a failover), so a former "
                 "holder may have written since; the lock was given up and the batch rolled "
                 "back: acquire it again",
                 name, pg_name_len(j->rq.lock, j->rq.lock_len, 200), j->rq.lock, j->tokstr);
        http_reply_error(j->req, 409, "lock_lost", text);
    } else if (pg_job_own_error(j)) {
        snprintf(text, sizeof(text),
                 "postgresql store '%s': fencegate's own statement (%s) failed: %s "
                 "(SQLSTATE %s); nothing was committed",
                 name, pg_job_own_error(j), j->errmsg ? j->errmsg : "", j->sqlstate);
        metrics_inc(&fg_metrics, M_PG_UNAVAILABLE, 1);
        http_reply_error(j->req, 503, "store_unavailable", text);
    } else {
        char idx[48];
        metrics_inc(&fg_metrics, M_PG_SQL_ERRORS, 1);
        pgjson_puts(&b, "{\"error\":\"sql_error\",\"sqlstate\":");
        pgjson_put_str(&b, j->sqlstate, strlen(j->sqlstate));
        pgjson_puts(&b, ",\"message\":");
        pgjson_put_str(&b, j->errmsg ? j->errmsg : "", j->errmsg ? strlen(j->errmsg) : 0);
        if (j->err_index == PG_Q_COMMIT)
            snprintf(idx, sizeof(idx), ",\"statement\":null");
        else
            snprintf(idx, sizeof(idx), ",\"statement\":%d", j->err_index - PG_NPRE);
        pgjson_puts(&b, idx);
        pgjson_puts(&b, ",\"rolled_back\":true}");
        if (b.failed)
            http_reply_error(j->req, 500, "internal", "out of memory");
        else
            http_reply_json(j->req, 422, b.p);
    }
    pgjson_buf_free(&b);
    pg_job_free(j);
}

/* An idle connection that read a large result, or whose session a batch left in another
 * client_encoding, is closed and made again at once (PC_WAIT), which gives its input buffer back
 * or sets UTF8 again; the store counts as reachable meanwhile, and batches wait for a connection
 * as they do behind busy ones. */
static void pc_recycle(struct pg_conn *c, const char *why)
{
    log_debug("postgresql store '%s': %s; making the connection anew", c->s->cfg->name, why);
    c->recycle = 0;
    pc_disconnect(c);
    c->backoff_ms = 0;
    pc_timer(c, 0);
}

/* Setting i of pg_reported as the server last reported it, into out[0..n). */
static void pc_reported(struct pg_conn *c, int i, char *out, size_t n)
{
    const char *v = pq.PQparameterStatus(c->pg, pg_reported[i]);

    snprintf(out, n, "%s", v ? v : "");
}

/* The first setting a batch changed for the session (pg_reported, or client_encoding away from
 * UTF8), or NULL. */
static const char *pc_session_changed(struct pg_conn *c)
{
    const char *enc = pq.PQparameterStatus(c->pg, "client_encoding");
    char now[sizeof(c->reported[0])];

    if (!enc || strcmp(enc, "UTF8") != 0)
        return "client_encoding";
    for (int i = 0; i < PG_NREPORTED; i++) {
        pc_reported(c, i, now, sizeof(now));
        if (strcmp(now, c->reported[i]) != 0)
            return pg_reported[i];
    }
    return NULL;
}

/* An idle connection takes the next batch waiting, unless it is to be made anew first. A batch
 * can change its session's settings through set_config(), which the filter does not see: with
 * another client_encoding, later batches on it would store UTF-8 text garbled, and fence on
 * acquire would raise the row of a lock name so garbled, leaving the row a former holder checks
 * unraised; with another session user or pg_reported setting, every client's later batches would
 * run as that user, or read and show values otherwise. */
static void pc_next(struct pg_conn *c)
{
    const char *changed = c->recycle ? NULL : pc_session_changed(c);
    char why[96];

    if (c->recycle) {
        pc_recycle(c, "it read a large result; giving that memory back");
    } else if (changed) {
        snprintf(why, sizeof(why), "a batch changed its session's %s", changed);
        pc_recycle(c, why);
    } else {
        pg_next_job(c->s, c);
    }
}

/* The batch's pipeline answered: the outcome is known; answer it. A block left open (an error
 * skipped the COMMIT) is rolled back in a second round trip. */
static void pc_phase1_done(struct pg_conn *c)
{
    struct pg_job *j = c->job;
    int open = pq.PQtransactionStatus(c->pg) != PQTRANS_IDLE;
    /* fencegate_fence is gone (dropped, its schema dropped): only a connection's set-up creates
     * it, so without a new connection every batch and every fence on acquire would fail until
     * fencegate restarts, while /readyz says ready. The new table has no rows: batches are then
     * refused lock_lost and their locks given up, and the next grants set the rows again. */
    int table_gone = j && !strcmp(j->sqlstate, "42P01") &&
                     (j->err_index == PG_Q_F || (j->fence && j->err_index == PG_Q_R2));
    /* fencegate's prepared statements are gone: DEALLOCATE is not transactional, and dynamic SQL
     * (DO, a function) reaches it past the filter. Only a new connection prepares them again;
     * without one, every later batch and fence on acquire on this connection would fail. */
    int stmts_gone = j && !strcmp(j->sqlstate, "26000") && (j->fence || pg_job_own_error(j));

    c->job = NULL;
    if (j)
        pg_job_done(j);
    if (table_gone) {
        pc_broken(c, "fencegate_fence does not exist (dropped?); reconnecting, which creates it");
        return;
    }
    if (stmts_gone) {
        pc_broken(c, "fencegate's prepared statements were deallocated; reconnecting");
        return;
    }
    if (!open) {
        evtimer_del(c->timer);
        c->phase = 0;
        c->state = PC_IDLE;
        pc_next(c);
        return;
    }
    c->phase = 2;
    c->qi = 0;
    c->in_query = 0;
    if (!pq.PQsendQueryParams(c->pg, "ROLLBACK", 0, NULL, NULL, NULL, NULL, 0) ||
        !pq.PQpipelineSync(c->pg)) {
        pc_broken(c, pq.PQerrorMessage(c->pg));
        return;
    }
    c->syncs = 1;
    evtimer_del(c->timer);
    pc_timer(c, c->s->timeout_ms + PG_DEADLINE_SLACK_MS);
    pc_flush(c);
}

/* A Sync answered. */
static void pc_sync(struct pg_conn *c)
{
    struct pg_job *j = c->job;

    c->syncs--;
    c->qi = 0;
    c->in_query = 0;
    if (c->state == PC_SETUP) {
        if (--c->setup_syncs > 0)
            return;
        if (c->err[0]) {
            log_warn("postgresql store '%s': %s", c->s->cfg->name, c->err);
            pc_broken(c, c->err);
            return;
        }
        if (c->setup_stage == 1) {
            pc_setup2(c);
            return;
        }
        evtimer_del(c->timer);
        c->state = PC_IDLE;
        c->backoff_ms = 0;
        for (int i = 0; i < PG_NREPORTED; i++)
            pc_reported(c, i, c->reported[i], sizeof(c->reported[i]));
        pg_update_live(c->s);
        pg_next_job(c->s, c);
        return;
    }
    if (c->state != PC_BUSY || c->syncs > 0)
        return;
    if (c->phase == 1) {
        pc_phase1_done(c);
        return;
    }
    if (pq.PQtransactionStatus(c->pg) != PQTRANS_IDLE) {
        /* Cannot happen after COMMIT or ROLLBACK; closing the connection rolls back whatever is
         * open (a job still here is answered outcome_unknown). */
        pc_broken(c, "a transaction was still open after COMMIT or ROLLBACK");
        return;
    }
    evtimer_del(c->timer);
    c->job = NULL;
    c->phase = 0;
    c->state = PC_IDLE;
    if (j)
        pg_job_done(j);
    pc_next(c);
}

/* A statement started COPY: answer the batch (nothing was committed: the COMMIT behind it in the
 * round trip 1) and drop the connection. */
static void pc_copy(struct pg_conn *c)
{
    struct pg_job *j = c->job;
    char msg[200];

    if (j && c->phase == 1) {
        c->job = NULL;
        if (j->fence) {
            pg_job_fail(j, 503, "store_unavailable", "COPY in a fence job");
        } else {
            snprintf(msg, sizeof(msg),
                     "statement %d started COPY, which fencegate does not carry; the batch was "
                     "rolled back: nothing was committed",
                     c->qi - PG_NPRE);
            pg_job_fail(j, 400, "bad_request", msg);
        }
    }
    pc_broken(c, "a statement started COPY; connection dropped");
}

static void pc_on_read(evutil_socket_t fd, short what, void *arg)
{
    struct pg_conn *c = arg;
    char why[512];
    int lost;

    if (c->state == PC_CONNECTING) {
        pc_poll(c);
        return;
    }
    /* A lost connection still has what was read before it ended, and that is read first. A
     * server that ends a connection (pg_terminate_backend(), a shutdown) sends a FATAL error and
     * closes it a few ms later; an idle connection reads the error in one callback and the close
     * in the next one, and libpq only parses the error once a batch is sent. Read in between,
     * it is the answer to the batch's first statement, which proves that nothing was
     * committed; without it the batch would be answered outcome_unknown. */
    lost = !pq.PQconsumeInput(c->pg) || pq.PQstatus(c->pg) == CONNECTION_BAD;
    if (lost)
        snprintf(why, sizeof(why), "%s", pq.PQerrorMessage(c->pg));
    while (c->pg && c->syncs > 0 && !pq.PQisBusy(c->pg)) {
        PGresult *r = pq.PQgetResult(c->pg);
        ExecStatusType st;
        if (lost && r && pq.PQresultStatus(r) == PGRES_FATAL_ERROR &&
            !pq.PQresultErrorField(r, PG_DIAG_SQLSTATE)) {
            /* libpq's own report of the lost connection: no answer from the server. */
            pq.PQclear(r);
            break;
        }
        if (!r) {
            if (!c->in_query)
                break;
            c->in_query = 0;
            c->qi++;
            continue;
        }
        st = pq.PQresultStatus(r);
        if (st == PGRES_PIPELINE_SYNC) {
            pq.PQclear(r);
            pc_sync(c);
            continue;
        }
        if (st == PGRES_COPY_IN || st == PGRES_COPY_OUT || st == PGRES_COPY_BOTH) {
            /* libpq would return this result forever. The filter refuses COPY; should one get
             * through, drop the connection: before COMMIT that rolls the batch back. */
            pq.PQclear(r);
            pc_copy(c);
            return;
        }
        c->in_query = 1;
        pc_result(c, r);
        if (pq.PQresultMemorySize(r) >= PG_RECYCLE_BYTES)
            c->recycle = 1;
        pq.PQclear(r);
    }
    if (lost && c->pg)
        pc_broken(c, why);
}

/* ---- running batches ----------------------------------------------------------------------- */

/* A unique id for fencegate.batch: a random prefix drawn once per process, and a counter. It
 * only has to differ from every other batch's; a statement can read it anyway. */
static void pg_batch_id(char *out, size_t n)
{
    static uint64_t prefix, counter;

    if (prefix == 0 && getrandom(&prefix, sizeof(prefix), GRND_NONBLOCK) != (ssize_t)sizeof(prefix))
        prefix = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32) ^ (uint64_t)rand();
    snprintf(out, n, "%016" PRIx64 "%016" PRIx64, prefix, ++counter);
}

static void pc_run(struct pg_conn *c, struct pg_job *j)
{
    const char *fp[2] = {j->fence ? j->name : j->rq.lock, j->tokstr};
    const char *sp[3] = {j->batch, c->s->timeout_str, fp[0]};
    const char *cp[2] = {j->batch, c->role};
    int ok;

    c->job = j;
    c->state = PC_BUSY;
    c->phase = 1;
    c->qi = 0;
    c->in_query = 0;
    pg_batch_id(j->batch, sizeof(j->batch));
    ok = pq.PQsendQueryPrepared(c->pg, "fencegate_fence_begin", 0, NULL, NULL, NULL, 0);
    if (j->fence) {
        ok = ok && pq.PQsendQueryPrepared(c->pg, "fencegate_fence_s", 3, sp, NULL, NULL, 0) &&
             pq.PQsendQueryPrepared(c->pg, "fencegate_fence_r1", 2, fp, NULL, NULL, 0) &&
             pq.PQsendQueryPrepared(c->pg, "fencegate_fence_r2", 1, fp, NULL, NULL, 0);
        j->commit_qi = PG_Q_R2 + 1;
    } else {
        ok = ok && pq.PQsendQueryPrepared(c->pg, "fencegate_fence_a", 3, sp, NULL, NULL, 0) &&
             pq.PQsendQueryPrepared(c->pg, "fencegate_fence_f", 2, fp, NULL, NULL, 0);
        for (int i = 0; ok && i < j->rq.nstmts; i++)
            ok = pq.PQsendQueryParams(c->pg, j->rq.stmts[i].sql, j->rq.stmts[i].nparams, NULL,
                                      j->rq.stmts[i].params, NULL, NULL, 0);
        ok = ok && pq.PQsendQueryPrepared(c->pg, "fencegate_fence_c", 2, cp, NULL, NULL, 0) &&
             pq.PQsendQueryPrepared(c->pg, "fencegate_fence_u", 0, NULL, NULL, NULL, 0);
        j->commit_qi = PG_NPRE + j->rq.nstmts + 2;
    }
    ok = ok && pq.PQsendQueryPrepared(c->pg, "fencegate_fence_commit", 0, NULL, NULL, NULL, 0);
    if (!ok || !pq.PQpipelineSync(c->pg)) {
        /* No Sync went out: dropping the connection rolls back whatever was sent. */
        pc_broken(c, pq.PQerrorMessage(c->pg));
        return;
    }
    c->syncs = 1;
    /* statement_timeout bounds each statement, not the pipeline: a batch may use it up in its
     * advisory lock's wait and in each of its statements. A shorter deadline would drop the
     * connection of a batch that is still within its limits and answer it outcome_unknown, while
     * PostgreSQL, which has read the whole pipeline, goes on and commits it. */
    pc_timer(c, c->s->timeout_ms * (j->fence ? 1 : 1 + j->rq.nstmts) + PG_DEADLINE_SLACK_MS);
    pc_flush(c);
}

/* 1 when c can take a job: idle, and not a lost connection whose last results are being read
 * (pc_on_read() drops it once they are). */
static int pc_ready(struct pg_conn *c)
{
    return c->state == PC_IDLE && c->pg && pq.PQstatus(c->pg) == CONNECTION_OK;
}

static void pg_next_job(struct pgstore *s, struct pg_conn *c)
{
    while (pc_ready(c) && s->qhead) {
        struct pg_job *j = s->qhead;
        pg_unqueue(j);
        evtimer_del(j->timer);
        if (!j->fence && !lock_still_held(j->owner, j->rq.lock, j->rq.lock_len, j->token)) {
            /* Checked again now that it would be sent, as a new request would be: a lock
             * released or lost (renewal refused, lease over) while the batch waited must not
             * write, even where no newer holder has raised the mark yet. */
            char msg[200];
            snprintf(msg, sizeof(msg),
                     "lock %.*s was released or lost while the batch waited for a connection; "
                     "nothing was sent to the store",
                     pg_name_len(j->rq.lock, j->rq.lock_len, 100), j->rq.lock);
            metrics_inc(&fg_metrics, M_PG_NOLOCK, 1);
            pg_job_fail(j, 409, "lock_lost", msg);
            continue;
        }
        pc_run(c, j);
    }
}

/* Runs j on an idle connection, or queues it (fence jobs first), or answers it 503. */
static void pg_submit(struct pgstore *s, struct pg_job *j)
{
    struct timeval tv = {s->timeout_ms / 1000, (s->timeout_ms % 1000) * 1000};

    j->next = s->jobs;
    if (s->jobs)
        s->jobs->prev = j;
    s->jobs = j;
    for (int i = 0; i < s->nconns; i++) {
        if (pc_ready(&s->conns[i])) {
            pc_run(&s->conns[i], j);
            return;
        }
    }
    if (s->nlive == 0) {
        pg_job_fail(j, 503, "store_unavailable",
                    s->last_error[0] ? s->last_error : "not connected yet");
        return;
    }
    if (j->fence ? s->fqlen >= PGSTORE_FENCE_QUEUE_MAX : s->qlen >= s->queue_max) {
        char msg[160];
        snprintf(msg, sizeof(msg), "all %d connections are busy and %d %s already wait", s->nconns,
                 j->fence ? s->fqlen : s->qlen, j->fence ? "fence-on-acquire jobs" : "requests");
        pg_job_fail(j, 503, "pool_exhausted", msg);
        return;
    }
    j->timer = evtimer_new(s->base, pg_on_job_timer, j);
    if (!j->timer) {
        pg_job_fail(j, 503, "store_unavailable", "out of memory");
        return;
    }
    if (j->fence) {
        j->qnext = s->qhead;
        s->qhead = j;
        if (!s->qtail)
            s->qtail = j;
    } else {
        if (s->qtail)
            s->qtail->qnext = j;
        else
            s->qhead = j;
        s->qtail = j;
    }
    j->queued = 1;
    if (j->fence)
        s->fqlen++;
    else
        s->qlen++;
    evtimer_add(j->timer, &tv);
}

static struct pg_job *pg_job_new(struct pgstore *s, uint64_t token)
{
    struct pg_job *j = calloc(1, sizeof(*j));

    if (!j)
        return NULL;
    j->s = s;
    j->token = token;
    j->err_index = -1;
    j->mark = -1;
    j->out.limit = PGSTORE_RESULT_MAX;
    snprintf(j->tokstr, sizeof(j->tokstr), "%" PRIu64, token);
    return j;
}

void pgstore_fence_hook(void *arg, const char *name, uint64_t token, lock_fence_done done,
                        void *ctx)
{
    struct pgstore *s = arg;
    struct pg_job *j;

    if (token > (uint64_t)INT64_MAX) {
        done(ctx, -1, 0, "the token does not fit PostgreSQL's bigint");
        return;
    }
    j = pg_job_new(s, token);
    if (!j || !(j->name = strdup(name))) {
        free(j);
        done(ctx, -1, 0, "out of memory");
        return;
    }
    j->fence = 1;
    j->done = done;
    j->ctx = ctx;
    pg_submit(s, j);
}

/* ---- HTTP ---------------------------------------------------------------------------------- */

void pgstore_handle(void *arg, const struct cfg_store *store, const char *rest,
                    struct httpd_req *req, struct lock_session *sess)
{
    struct pgstores *p = arg;
    struct pgstore *s = NULL;
    struct evbuffer *in = httpd_req_body(req);
    size_t blen = evbuffer_get_length(in);
    char *body = blen ? (char *)evbuffer_pullup(in, (ev_ssize_t)blen) : NULL;
    char err[600], text[400];
    struct pgjson_request rq;
    struct pg_job *j;
    uint64_t token = 0;
    long long rem;
    int st, claim;

    for (int i = 0; i < p->n; i++)
        if (p->st[i].cfg == store)
            s = &p->st[i];
    if (!s) {
        http_reply_error(req, 404, "unknown_store", "not a postgresql store");
        return;
    }
    if (*rest) {
        http_reply_error(req, 404, "not_found", "use POST /v1/stores/{store}/sql");
        return;
    }
    if (httpd_req_method(req) != EVHTTP_REQ_POST) {
        evhttp_add_header(httpd_req_output_headers(req), "Allow", "POST");
        http_reply_error(req, 405, "method_not_allowed", "use POST /v1/stores/{store}/sql");
        return;
    }
    metrics_inc(&fg_metrics, M_PG_REQUESTS, 1);
    if (!sess) {
        metrics_inc(&fg_metrics, M_PG_UNAVAILABLE, 1);
        http_reply_error(req, 503, "unavailable", "the sidecar is shutting down");
        return;
    }
    if (pgjson_parse_request(body, blen, &rq, err, sizeof(err)) != FG_OK) {
        http_reply_error(req, 400, "bad_request", err);
        return;
    }
    st = lock_state(sess, rq.lock, rq.lock_len, &token, &rem);
    if (st != 1) {
        metrics_inc(&fg_metrics, M_PG_NOLOCK, 1);
        /* The name as it is: http_reply_error() escapes the message for JSON. */
        snprintf(text, sizeof(text),
                 "lock %.*s is %s by this sidecar; acquire it with POST /v1/locks/{name}; "
                 "nothing was sent to the store",
                 pg_name_len(rq.lock, rq.lock_len, 200), rq.lock,
                 st < 0 ? "lost (no longer held)" : "not held");
        http_reply_error(req, 409, "lock_lost", text);
        pgjson_request_free(&rq);
        return;
    }
    if ((claim = http_token_claim_ok(req, rq.lock, token)) != 1) {
        if (claim == 0)
            metrics_inc(&fg_metrics, M_PG_NOLOCK, 1);
        pgjson_request_free(&rq);
        return;
    }
    if (token > (uint64_t)INT64_MAX) {
        http_reply_error(req, 503, "store_unavailable",
                         "the token does not fit PostgreSQL's bigint; refused");
        pgjson_request_free(&rq);
        return;
    }
    j = pg_job_new(s, token);
    if (!j) {
        pgjson_request_free(&rq);
        http_reply_error(req, 503, "unavailable", "out of memory");
        return;
    }
    j->rq = rq;
    j->req = req;
    j->owner = lock_session_ref(sess);
    httpd_req_on_gone(req, pg_on_client_gone, j);
    pg_submit(s, j);
}

const char *pgstore_ready(void *arg)
{
    struct pgstores *p = arg;

    for (int i = 0; i < p->n; i++) {
        struct pgstore *s = &p->st[i];
        if (s->nlive == 0) {
            snprintf(s->ready_msg, sizeof(s->ready_msg), "postgresql store '%s' is unreachable: %s",
                     s->cfg->name, s->last_error[0] ? s->last_error : "connecting");
            return s->ready_msg;
        }
    }
    return NULL;
}

/* ---- life cycle ---------------------------------------------------------------------------- */

/* Splits a copy of the comma-separated list v into *items (pointers into *buf). Returns the
 * number of items, or -1 when out of memory. */
static int pg_split(const char *v, char **buf, char ***items)
{
    int n = 1, k = 0;

    for (const char *q = v; *q; q++)
        n += *q == ',';
    *buf = strdup(v);
    *items = calloc((size_t)n, sizeof(**items));
    if (!*buf || !*items)
        return -1;
    for (char *q = *buf, *e;; q = e + 1) {
        (*items)[k++] = q;
        e = strchr(q, ',');
        if (!e)
            break;
        *e = '\0';
    }
    return n;
}

/* Reads the URL's hosts and ports as libpq does (query parameters included), and keeps them when
 * a host is a name to look up before each connection. A URL that libpq cannot parse, or one that
 * gives hostaddr itself, or ports that do not match the hosts, is left to libpq, which then
 * reports the error or connects without a lookup. Returns -1 when out of memory. */
static int pg_read_hosts(struct pgstore *s)
{
    PQconninfoOption *o = pq.PQconninfoParse(s->cfg->url.raw, NULL);
    const char *host = NULL, *hostaddr = NULL, *port = NULL;
    int names = 0, rc = 0;

    for (PQconninfoOption *i = o; i && i->keyword; i++) {
        if (!strcmp(i->keyword, "host"))
            host = i->val;
        else if (!strcmp(i->keyword, "hostaddr"))
            hostaddr = i->val;
        else if (!strcmp(i->keyword, "port"))
            port = i->val;
    }
    if (host && *host && !(hostaddr && *hostaddr)) {
        s->nhosts = pg_split(host, &s->hostbuf, &s->hosts);
        s->nports = port && *port ? pg_split(port, &s->portbuf, &s->ports) : 0;
        if (s->nhosts < 0 || s->nports < 0)
            rc = -1;
        for (int i = 0; rc == 0 && i < s->nhosts; i++)
            names += pg_is_name(s->hosts[i]);
        if (rc == 0 && (names == 0 || (s->nports > 1 && s->nports != s->nhosts)))
            s->nhosts = s->nports = 0;
    }
    if (o)
        pq.PQconninfoFree(o);
    return rc;
}

struct pgstores *pgstores_new(struct event_base *base, const struct cfg *cfg)
{
    struct pgstores *p = calloc(1, sizeof(*p));
    int n = 0;

    if (!p)
        return NULL;
    for (int i = 0; i < cfg->nstores; i++)
        if (cfg->stores[i].url.kind == CFG_URL_POSTGRES)
            n++;
    p->st = calloc((size_t)(n ? n : 1), sizeof(*p->st));
    if (!p->st) {
        free(p);
        return NULL;
    }
    for (int i = 0; i < cfg->nstores; i++) {
        const struct cfg_store *cs = &cfg->stores[i];
        struct pgstore *s;
        if (cs->url.kind != CFG_URL_POSTGRES)
            continue;
        s = &p->st[p->n++];
        s->p = p;
        s->cfg = cs;
        s->base = base;
        s->nconns = cs->pool_size > 0 ? cs->pool_size : PGSTORE_POOL_SIZE;
        s->timeout_ms = cs->timeout_ms > 0 ? cs->timeout_ms : PGSTORE_TIMEOUT_MS;
        s->queue_max = cs->queue_max > 0 ? cs->queue_max : PGSTORE_QUEUE_MAX;
        snprintf(s->timeout_str, sizeof(s->timeout_str), "%lld", s->timeout_ms);
        snprintf(s->last_error, sizeof(s->last_error), "connecting");
        s->conns = calloc((size_t)s->nconns, sizeof(*s->conns));
        if (!s->conns || pg_read_hosts(s) < 0) {
            pgstores_free(p);
            return NULL;
        }
        for (int k = 0; k < s->nconns; k++) {
            struct pg_conn *c = &s->conns[k];
            c->s = s;
            c->fd = -1;
            c->state = PC_WAIT;
            c->timer = evtimer_new(base, pc_on_timer, c);
            if (s->nhosts && (c->lk = calloc((size_t)s->nhosts, sizeof(*c->lk))))
                for (int h = 0; h < s->nhosts; h++)
                    c->lk[h].c = c;
            if (!c->timer || (s->nhosts && !c->lk)) {
                pgstores_free(p);
                return NULL;
            }
            pc_timer(c, 0);
        }
    }
    return p;
}

int pgstores_count(const struct pgstores *p)
{
    return p ? p->n : 0;
}

struct pgstore *pgstores_get(struct pgstores *p, int i)
{
    return &p->st[i];
}

void pgstores_free(struct pgstores *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->n; i++) {
        struct pgstore *s = &p->st[i];
        for (int k = 0; s->conns && k < s->nconns; k++) {
            struct pg_conn *c = &s->conns[k];
            struct pg_job *j = c->job;
            c->job = NULL;
            pc_disconnect(c);
            free(c->lk);
            c->lk = NULL;
            if (c->timer)
                event_free(c->timer);
            c->timer = NULL;
            if (j)
                pg_job_fail(j, 503, "unavailable", "shutting down");
        }
        while (s->jobs)
            pg_job_fail(s->jobs, 503, "unavailable", "shutting down");
        free(s->conns);
        free(s->hosts);
        free(s->ports);
        free(s->hostbuf);
        free(s->portbuf);
    }
    free(p->st);
    free(p);
}
