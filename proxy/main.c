/* main.c — fencegate's entry point: configuration, listeners, signals, the event loop. */
#include <errno.h>
#include <event2/event.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "fence.h"
#include "fencehooks.h"
#include "heap.h"
#include "http.h"
#include "httpd.h"
#include "httpstore.h"
#include "lock.h"
#include "log.h"
#include "net.h"
#include "pgstore.h"
#include "pqlib.h"
#include "server.h"
#include "storemark.h"
#include "upstream.h"

#define MAIN_MAX_CONFIG_BYTES (1024 * 1024)

extern char **environ;

struct main_ctx {
    struct event_base *base;
    struct cfg *cfg;
    struct server *srv;
    struct http_api *http;
    struct event *grace;
    int stopping;
    int draining; /* endpoints (RESP, HTTP) whose connections have not all closed yet */
};

/* Reads a whole config file into a NUL-terminated heap buffer. Returns NULL with err set. The
 * file is read to its end, not to the size stat() reports: a pipe (`--config <(...)`, a FIFO)
 * or a /proc file says 0 and still has content. */
static char *main_read_file(const char *path, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    size_t cap = 4096, n = 0;
    char *text;

    if (!f) {
        snprintf(err, errlen, "cannot read config file '%s': %s", path, strerror(errno));
        return NULL;
    }
    text = malloc(cap);
    while (text) {
        n += fread(text + n, 1, cap - 1 - n, f);
        if (ferror(f) || feof(f))
            break;
        if (n > MAIN_MAX_CONFIG_BYTES) {
            snprintf(err, errlen, "config file '%s' is larger than %d bytes", path,
                     MAIN_MAX_CONFIG_BYTES);
            free(text);
            fclose(f);
            return NULL;
        }
        if (n + 1 == cap) {
            char *grown = realloc(text, cap * 2);

            if (!grown) {
                free(text);
                text = NULL;
                break;
            }
            text = grown;
            cap *= 2;
        }
    }
    if (!text) {
        snprintf(err, errlen, "out of memory");
    } else if (ferror(f)) {
        snprintf(err, errlen, "cannot read config file '%s': %s", path, strerror(errno));
        free(text);
        text = NULL;
    } else if (n > MAIN_MAX_CONFIG_BYTES) {
        snprintf(err, errlen, "config file '%s' is larger than %d bytes", path,
                 MAIN_MAX_CONFIG_BYTES);
        free(text);
        text = NULL;
    } else {
        text[n] = '\0';
        *len = n;
    }
    fclose(f);
    return text;
}

/* Builds the configuration: defaults < file < environment < flags. Returns 0, 1 when the
 * process should exit 0 (--help, --version), or -1 after printing the error. */
static int main_configure(struct cfg *cfg, int argc, char **argv)
{
    struct cfg_error err;
    enum cfg_action action = CFG_RUN;
    const char *path;
    char msg[512];

    /* --help and --version answer even when the configuration is broken. */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(cfg_usage(), stdout);
            return 1;
        }
        if (!strcmp(argv[i], "--version") || !strcmp(argv[i], "-V")) {
            printf("fencegate %s\n", FG_VERSION);
            return 1;
        }
    }
    cfg_defaults_zeroed(cfg); /* main()'s static cfg */
    path = cfg_config_path(argc, argv, environ);
    if (path) {
        size_t len = 0;
        char *text = main_read_file(path, &len, msg, sizeof(msg));
        int rc;
        if (!text) {
            fprintf(stderr, "fencegate: %s\n", msg);
            return -1;
        }
        rc = cfg_parse_yaml(cfg, text, len, path, &err);
        free(text);
        if (rc != FG_OK)
            goto bad;
    }
    if (cfg_apply_env(cfg, environ, &err) != FG_OK)
        goto bad;
    if (cfg_apply_args(cfg, argc, argv, &action, &err) != FG_OK)
        goto bad;
    if (cfg_finish(cfg, &err) != FG_OK)
        goto bad;
    return 0;
bad:
    fprintf(stderr, "fencegate: %s\n", err.msg);
    return -1;
}

/* Time left after the last connection closed for release commands to reach the lock backend. */
#define MAIN_FLUSH_MS 300

/* One endpoint's connections are all closed; once both are, the loop ends. */
static void main_on_drained(void *arg)
{
    struct main_ctx *m = arg;
    struct timeval tv = {0, MAIN_FLUSH_MS * 1000};

    if (--m->draining > 0)
        return;
    log_info("all connections drained; exiting");
    event_base_loopexit(m->base, &tv);
}

static void main_on_grace(evutil_socket_t fd, short what, void *arg)
{
    struct main_ctx *m = arg;

    log_warn("shutdown grace period (%lld ms) over with %d connection(s) still busy; closing them",
             m->cfg->shutdown_grace_ms, server_client_count(m->srv) + http_conn_count(m->http));
    /* The drain is done: main_on_drained leaves time for releases. */
    server_close_all(m->srv);
    http_close_all(m->http);
}

static void main_on_signal(evutil_socket_t sig, short what, void *arg)
{
    struct main_ctx *m = arg;
    struct timeval tv;

    if (m->stopping) {
        log_warn("second signal: exiting now");
        event_base_loopexit(m->base, NULL);
        return;
    }
    m->stopping = 1;
    log_info("%s received: no new connections; draining %d Redis and %d HTTP connection(s)",
             sig == SIGTERM ? "SIGTERM" : "SIGINT", server_client_count(m->srv),
             http_conn_count(m->http));
    tv.tv_sec = m->cfg->shutdown_grace_ms / 1000;
    tv.tv_usec = (m->cfg->shutdown_grace_ms % 1000) * 1000;
    m->grace = evtimer_new(m->base, main_on_grace, m);
    if (m->grace)
        evtimer_add(m->grace, &tv);
    /* Best effort: leases end by themselves, and fencing keeps a late writer out either way. */
    http_release_all(m->http);
    m->draining = 2;
    http_drain(m->http, main_on_drained, m);
    server_drain(m->srv, main_on_drained, m);
}

/* SIGHUP (a closed terminal, or a habit from daemons that reload on it) is ignored, as Redis
 * ignores it: its default action would end the sidecar without releasing anything. */
static void main_on_hup(evutil_socket_t sig, short what, void *arg)
{
    (void)sig;
    (void)what;
    (void)arg;
    log_warn("SIGHUP received and ignored: fencegate does not reload its configuration; restart "
             "it to apply a change (SIGTERM stops it gracefully)");
}

static void main_lock_warn(void *arg, const char *msg)
{
    (void)arg;
    log_warn("lock backend: %s", msg);
}

/* Reads a password file (a mounted Secret, say): its bytes without one trailing newline. Returns
 * 0, or -1 with the reason in err (unreadable, empty, too long, a NUL inside). */
static int main_read_password(const char *path, char *out, size_t cap, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    size_t n;

    if (!f) {
        snprintf(err, errlen, "cannot read '%.300s': %s", path, strerror(errno));
        return -1;
    }
    n = fread(out, 1, cap, f);
    fclose(f);
    if (n > 0 && out[n - 1] == '\n')
        n--;
    if (n > 0 && out[n - 1] == '\r')
        n--;
    if (n == 0 || n >= cap || memchr(out, '\0', n)) {
        snprintf(err, errlen, "'%.300s' must hold a password of 1..%zu bytes (no NUL)", path,
                 cap - 1);
        return -1;
    }
    out[n] = '\0';
    return 0;
}

/* Has libpq's parser read a PostgreSQL store's URL, which libpq otherwise reads only when it
 * connects: a parameter it does not know, a bad %-escape or a broken address would start the
 * sidecar with a store that fails every request. (Values, such as sslmode's, are still checked
 * at connect only.) Returns 0, or -1 after printing the error. */
static int main_check_pg_url(const struct cfg *cfg, int i)
{
    char *why = NULL;
    PQconninfoOption *o = pq.PQconninfoParse(cfg->stores[i].url.raw, &why);
    struct cfg_error e;

    if (o) {
        pq.PQconninfoFree(o);
        return 0;
    }
    cfg_store_url_error(cfg, i, why ? why : "libpq cannot read it (out of memory?)", &e);
    if (why)
        pq.PQfreemem(why);
    fprintf(stderr, "fencegate: %s\n", e.msg);
    return -1;
}

static const char *main_url_shown(const struct cfg_url *u)
{
    /* A URL with a password is not logged verbatim. */
    return strchr(u->raw, '@') ? "(url with credentials)" : u->raw;
}

/* `fencegate injector ...` runs the admission webhook, a separate program next to this one: the
 * sidecar itself stays free of TLS libraries (they would double its idle memory; libpq, which
 * loads its own, is loaded only for PostgreSQL stores: pqlib.h). */
static int main_exec_injector(char **argv)
{
    char self[4096], path[4200];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    char *slash;

    if (n <= 0) {
        fprintf(stderr, "fencegate: cannot find my own path: %s\n", strerror(errno));
        return 1;
    }
    self[n] = '\0';
    slash = strrchr(self, '/');
    if (slash)
        *slash = '\0';
    snprintf(path, sizeof(path), "%s/fencegate-injector", slash ? self : ".");
    argv[1] = path; /* the injector sees argv = {path, flags...} */
    execv(path, argv + 1);
    fprintf(stderr, "fencegate: cannot run %s: %s\n", path, strerror(errno));
    return 1;
}

/* The event loop. With epoll, changes to a descriptor's events within one turn of the loop go to
 * the kernel as one epoll_ctl at the end of it (evhttp turns reading and writing on and off
 * around every request). libevent warns against this only for descriptors cloned with dup(),
 * which fencegate does not use. */
static struct event_base *fg_event_base_new(void)
{
    struct event_config *ec = event_config_new();
    struct event_base *base;

    if (!ec)
        return NULL;
    event_config_set_flag(ec, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
    base = event_base_new_with_config(ec);
    event_config_free(ec);
    return base;
}

/* Descriptors fencegate needs for `clients` clients, `per` each (one for the client, two once it
 * is pinned to an upstream connection of its own), with the HTTP endpoint's connections and a
 * margin for the listeners, the event loop, the lock backend, the stores and the shared
 * connection. */
static rlim_t main_fds_for(int clients, int per)
{
    return (rlim_t)clients * (rlim_t)per + HTTPD_MAX_CONNS + 128;
}

/* Raises the soft descriptor limit toward what max_clients pinned clients need, up to the hard
 * limit, as Redis does for its maxclients: a login shell's 1024 runs out at about 500 clients,
 * far below the default max_clients. Warns when the limit stays short even of one descriptor
 * per client. */
static void main_raise_fd_limit(const struct cfg *cfg)
{
    struct rlimit rl;
    rlim_t want = main_fds_for(cfg->max_clients, 2), was;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= want)
        return;
    was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want ? want : rl.rlim_max;
    if (rl.rlim_cur > was && setrlimit(RLIMIT_NOFILE, &rl) != 0)
        rl.rlim_cur = was;
    if (rl.rlim_cur > was)
        log_info("descriptor limit raised from %llu to %llu (max_clients %d may need %llu)",
                 (unsigned long long)was, (unsigned long long)rl.rlim_cur, cfg->max_clients,
                 (unsigned long long)want);
    if (rl.rlim_cur < main_fds_for(cfg->max_clients, 1))
        log_warn("the descriptor limit is %llu (hard limit %llu), short of what max_clients %d "
                 "needs (%llu, or %llu once every client is pinned): past it, accepting pauses; "
                 "raise ulimit -n, or lower max_clients",
                 (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max, cfg->max_clients,
                 (unsigned long long)main_fds_for(cfg->max_clients, 1), (unsigned long long)want);
}

int main(int argc, char **argv)
{
    static struct cfg cfg;
    static struct fencehooks hooks;
    struct main_ctx m;
    struct upstream *up;
    struct http_api *http;
    struct heap_keeper *heap;
    struct lock_client *locks;
    struct store_marks *marks = NULL; /* the store's fence hook, when the backend is elsewhere */
    struct pgstores *pg;
    struct httpstore *hstores;
    struct lock_options lopt;
    struct event *sigterm, *sigint, *sighup;
    int same_redis, resp_fd, http_fd;
    char err[512], where[CFG_MAX_STR + 32];
    int rc;

    if (argc > 1 && strcmp(argv[1], "injector") == 0)
        return main_exec_injector(argv);
    rc = main_configure(&cfg, argc, argv);
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    log_set_level((enum log_level)cfg.log_level);
    memset(&lopt, 0, sizeof(lopt));
    if (cfg.backend_password_file[0] &&
        main_read_password(cfg.backend_password_file, lopt.password, sizeof(lopt.password), err,
                           sizeof(err)) != 0) {
        fprintf(stderr, "fencegate: %sbackend.password_file: %s\n",
                cfg_where(&cfg, "backend.password_file", where, sizeof(where)), err);
        return 2;
    }
    /* PostgreSQL stores load libpq now (pqlib.h): a missing one is a configuration error, found
     * before anything connects or listens. Without such a store libpq is never loaded. */
    for (int i = 0; i < cfg.nstores; i++) {
        if (cfg.stores[i].url.kind != CFG_URL_POSTGRES)
            continue;
        if (pqlib_load(err, sizeof(err)) != 0) {
            fprintf(stderr, "fencegate: store '%s': %s\n", cfg.stores[i].name, err);
            return 2;
        }
        if (main_check_pg_url(&cfg, i) != 0)
            return 2;
    }
    /* Both addresses are bound before either listens: one that cannot be had (in use, not an
     * address of this host) stops start-up with nothing ever accepting a connection. */
    resp_fd = net_bind(cfg.listen_resp.host, cfg.listen_resp.port, err, sizeof(err));
    if (resp_fd < 0) {
        fprintf(stderr, "fencegate: %sRESP listener: %s\n",
                cfg_where(&cfg, "listen.resp", where, sizeof(where)), err);
        return 1;
    }
    http_fd = net_bind(cfg.listen_http.host, cfg.listen_http.port, err, sizeof(err));
    if (http_fd < 0) {
        fprintf(stderr, "fencegate: %sHTTP listener: %s\n",
                cfg_where(&cfg, "listen.http", where, sizeof(where)), err);
        close(resp_fd);
        return 1;
    }
    if (net_bound_overlap(resp_fd, http_fd)) {
        fprintf(stderr,
                "fencegate: %sHTTP listener: cannot listen on %s:%d: the RESP listener (%s:%d) is "
                "bound to that address; give them different ports\n",
                cfg_where(&cfg, "listen.http", where, sizeof(where)), cfg.listen_http.host,
                cfg.listen_http.port, cfg.listen_resp.host, cfg.listen_resp.port);
        close(resp_fd);
        close(http_fd);
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    signal(SIGHUP, SIG_IGN); /* until its handler below logs it */
    srand((unsigned)getpid() ^ (unsigned)time(NULL));
    main_raise_fd_limit(&cfg);

    memset(&m, 0, sizeof(m));
    m.cfg = &cfg;
    m.base = fg_event_base_new();
    if (!m.base) {
        fprintf(stderr, "fencegate: cannot create the event loop\n");
        return 1;
    }
    up = upstream_new(m.base, &cfg.upstream, err, sizeof(err));
    if (!up) {
        fprintf(stderr, "fencegate: upstream: %s\n", err);
        return 1;
    }
    /* Fence on acquire: every token is first raised in every store (fencehooks.h), here the
     * Redis store the RESP endpoint fronts; when that is the lock backend's own Redis (spelled
     * alike, or two names of one address), the acquire script raises its mark itself
     * (lock_options.mark_prefix), and fenced writes check its lock keys (server_new). */
    same_redis = cfg_store_is_backend(&cfg, NULL); /* spelled alike: no resolver needed */
    if (!same_redis && cfg_store_is_backend(&cfg, net_same_host)) {
        same_redis = 1;
        log_info("upstream %s and lock backend %s are one Redis (one address): fenced writes "
                 "check its lock keys",
                 main_url_shown(&cfg.upstream), main_url_shown(&cfg.backend));
    }
    if (same_redis) {
        snprintf(lopt.mark_prefix, sizeof(lopt.mark_prefix), "%s", FENCE_HWM_PREFIX);
    } else {
        marks = store_marks_new(m.base, &cfg.upstream, 2000);
        if (!marks || fencehooks_add(&hooks, store_marks_hook, marks) != 0) {
            fprintf(stderr, "fencegate: %s\n",
                    marks ? "too many stores to fence" : "out of memory");
            return 2;
        }
    }
    /* ... and every PostgreSQL store's fencegate_fence row (pgstore.h). */
    pg = pgstores_new(m.base, &cfg);
    if (!pg) {
        fprintf(stderr, "fencegate: out of memory\n");
        return 1;
    }
    for (int i = 0; i < pgstores_count(pg); i++) {
        if (fencehooks_add(&hooks, pgstore_fence_hook, pgstores_get(pg, i)) != 0) {
            fprintf(stderr, "fencegate: too many stores to fence\n");
            return 2;
        }
    }
    /* HTTP stores: their marks live in the lock backend (httpstore.h). */
    hstores = httpstore_new(m.base, &cfg, NULL);
    if (!hstores || fencehooks_add(&hooks, httpstore_fence_hook, hstores) != 0) {
        fprintf(stderr, "fencegate: HTTP stores: %s\n",
                hstores ? "too many stores to fence" : "out of memory");
        return 2;
    }
    snprintf(lopt.tls_ca_file, sizeof(lopt.tls_ca_file), "%s", cfg.backend_tls_ca);
    snprintf(lopt.tls_cert_file, sizeof(lopt.tls_cert_file), "%s", cfg.backend_tls_cert);
    snprintf(lopt.tls_key_file, sizeof(lopt.tls_key_file), "%s", cfg.backend_tls_key);
    snprintf(lopt.tls_server_name, sizeof(lopt.tls_server_name), "%s", cfg.backend_tls_server_name);
    lopt.fence = fencehooks_run;
    lopt.warn = main_lock_warn;
    lopt.fence_arg = &hooks;
    if (cfg.backend.kind == CFG_URL_ETCD) /* the Redis backend keeps its own key layout */
        snprintf(lopt.prefix, sizeof(lopt.prefix), "%s", cfg.backend_prefix);
    locks = lock_client_new(m.base, cfg.backend.raw, &lopt, err, sizeof(err));
    if (!locks) {
        fprintf(stderr, "fencegate: lock backend %s: %s\n", main_url_shown(&cfg.backend), err);
        httpstore_free(hstores);
        pgstores_free(pg);
        store_marks_free(marks);
        upstream_free(up);
        event_base_free(m.base);
        close(resp_fd);
        close(http_fd);
        return 2; /* a backend this build cannot use (TLS files, say) is a configuration error */
    }
    httpstore_set_lock_client(hstores, locks);
    m.srv = server_new(m.base, &cfg, resp_fd, up, locks, same_redis, err, sizeof(err));
    if (!m.srv) {
        fprintf(stderr, "fencegate: RESP listener: %s\n", err);
        return 1;
    }
    http = http_new(m.base, &cfg, http_fd, up, locks, err, sizeof(err));
    if (!http) {
        fprintf(stderr, "fencegate: HTTP listener: %s\n", err);
        server_free(m.srv);
        return 1;
    }
    m.http = http;
    if ((pgstores_count(pg) > 0 &&
         (http_route_stores(http, CFG_URL_POSTGRES, "sql", pgstore_handle, pg, 0) != 0 ||
          http_add_ready_check(http, pgstore_ready, pg) != 0)) ||
        http_route_stores(http, CFG_URL_HTTP, "http", httpstore_handle, hstores, 1) != 0) {
        fprintf(stderr, "fencegate: HTTP listener: too many store routes\n");
        return 1;
    }
    sigterm = evsignal_new(m.base, SIGTERM, main_on_signal, &m);
    sigint = evsignal_new(m.base, SIGINT, main_on_signal, &m);
    sighup = evsignal_new(m.base, SIGHUP, main_on_hup, NULL);
    evsignal_add(sigterm, NULL);
    evsignal_add(sigint, NULL);
    evsignal_add(sighup, NULL);
    heap = heap_keeper_new(m.base);
    if (!heap)
        log_warn("out of memory: freed memory goes back to the system at once (glibc's default)");

    log_info("fencegate %s: resp %s:%d, http %s:%d, upstream %s, backend %s", FG_VERSION,
             cfg.listen_resp.host, cfg.listen_resp.port, cfg.listen_http.host, cfg.listen_http.port,
             upstream_name(up), main_url_shown(&cfg.backend));
    event_base_dispatch(m.base);

    server_free(m.srv);
    http_free(http);
    lock_client_free(locks);
    httpstore_free(hstores); /* after the lock client: no mark answers come after it */
    pgstores_free(pg);
    store_marks_free(marks);
    upstream_free(up);
    event_free(sigterm);
    event_free(sigint);
    event_free(sighup);
    heap_keeper_free(heap);
    if (m.grace)
        event_free(m.grace);
    event_base_free(m.base);
    log_info("stopped");
    return 0;
}
