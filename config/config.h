/* config.h — fencegate's configuration model: YAML file < FENCEGATE_* environment < flags. Pure. */
#ifndef FG_CONFIG_H
#define FG_CONFIG_H

#include <stddef.h>

#include "fg_error.h"

#define CFG_MAX_STORES  64
#define CFG_MAX_PROTECT 256
#define CFG_MAX_HOSTS   16
#define CFG_MAX_STR     1024 /* longest string value accepted anywhere */
#define CFG_MAX_PREFIX  200  /* longest backend.prefix: both lock backends' limit */

/* host:port as written by the user, split; host is a name or an IPv4/IPv6 literal (no brackets). */
struct cfg_addr {
    char host[256];
    int port; /* 1..65535 */
};

enum cfg_url_kind {
    CFG_URL_REDIS = 1,
    CFG_URL_ETCD,
    CFG_URL_POSTGRES,
    CFG_URL_HTTP,
};

/* A parsed URL. redis://[user[:password]@]host:port[/db];
 * etcd[s]://[user:password@]host:port[,host:port...];
 * postgresql://... (kept verbatim for libpq, host/port parsed for checks); http://host:port[/path].
 */
struct cfg_url {
    enum cfg_url_kind kind;
    char raw[CFG_MAX_STR];                /* the URL as given, its scheme in lower case */
    struct cfg_addr hosts[CFG_MAX_HOSTS]; /* etcd may list several; others have exactly one */
    int nhosts;
    int db;                 /* redis: database number, default 0 */
    char user[128];         /* redis ACL user, may be empty */
    char password[256];     /* redis password, may be empty */
    int tls;                /* etcds:// */
    char path[CFG_MAX_STR]; /* http: path prefix ("" or "/..."); postgres: database */
};

/* Where a value was set, so that checks made after every source was applied (cfg_finish()) can
 * still name it. */
enum cfg_from { CFG_FROM_DEFAULT = 0, CFG_FROM_FILE, CFG_FROM_ENV, CFG_FROM_FLAG };
struct cfg_origin {
    enum cfg_from from;
    int line, column; /* CFG_FROM_FILE: 1-based, in cfg.source */
};

struct cfg_store {
    char name[128];
    struct cfg_url url;   /* kind is REDIS, POSTGRES or HTTP */
    struct cfg_origin at; /* of its url: value */
    /* postgresql stores (0 = the default of pgstore.h): */
    int pool_size;        /* connections, 1..256 */
    long long timeout_ms; /* statement_timeout, 100..3600000 */
    int queue_max;        /* requests waiting for a connection, 1..100000 */
};

#define CFG_MAX_SETTINGS 32 /* room in cfg.origin; config.c checks its table fits */

struct cfg_protect {
    struct cfg_origin at;   /* of its store: value */
    char store[128];        /* names a store */
    char keys[CFG_MAX_STR]; /* glob: '*' matches any run, '?' one byte */
    char lock[CFG_MAX_STR]; /* lock name template; "$1".."$9" = what the n-th '*' matched,
                             * "$$" = '$' */
};

enum cfg_log_level { CFG_LOG_ERROR = 0, CFG_LOG_WARN, CFG_LOG_INFO, CFG_LOG_DEBUG };

struct cfg {
    struct cfg_addr listen_resp; /* default 127.0.0.1:6380 */
    struct cfg_addr listen_http; /* default 127.0.0.1:8380 */
    struct cfg_url upstream;     /* the RESP endpoint's upstream: --upstream, else the first redis
                                  * store, else redis://127.0.0.1:6379 */
    int upstream_multiplex;      /* default 1: unpinned clients share one upstream connection */
    int fenced_transactions;     /* default 1: pipelined fenced writes under one lock go as one
                                  * transaction (Redis 7+); 0: every fenced write is a script call */
    struct cfg_url backend;      /* default redis://127.0.0.1:6379 */
    char backend_prefix[256];    /* default "/fencegate/locks/" */
    /* etcds:// backends: PEM files (CA, client certificate and key) and the name the server's
     * certificate must carry; "" = unset (the system's CAs, no client certificate, each
     * endpoint's host). */
    char backend_tls_ca[CFG_MAX_STR], backend_tls_cert[CFG_MAX_STR], backend_tls_key[CFG_MAX_STR];
    char backend_tls_server_name[256];
    char backend_password_file[CFG_MAX_STR]; /* the backend's password, read at start; "" = unset */
    long long session_ttl_ms;                /* default 10000; 500..3600000 */
    struct cfg_store stores[CFG_MAX_STORES];
    int nstores; /* after cfg_finish(): the upstream is always a store */
    struct cfg_protect protect[CFG_MAX_PROTECT];
    int nprotect;
    /* limits: */
    int max_clients; /* default 10000; 1..1000000 */
    long long
        max_request_bytes; /* largest single request, default 512 MiB + 64 KiB; 1 KiB.. 4 GiB */
    long long
        max_pending_bytes; /* back-pressure watermark per direction, default 1 MiB; 4 KiB..1 GiB */
    long long max_args;    /* largest argument count, default 8388608 (8 Mi); 1..INT_MAX */
    long long shutdown_grace_ms; /* SIGTERM drain time, default 10000; 0..600000 */
    /* The application's health check (app_health): while it fails, locks held over HTTP are not
     * kept. kind 0 = off (the default). */
    struct cfg_url app_health_url;    /* http:// only */
    long long app_health_interval_ms; /* default 1000; 100..600000 */
    long long app_health_timeout_ms;  /* default 1000; 100..600000 */
    int app_health_failures;          /* failure_threshold, default 3; 1..1000 */
    enum cfg_log_level log_level;     /* default info */
    /* Bookkeeping for error messages: the config file's name as given to cfg_parse_yaml(), and
     * where each setting was last set (indexed by config.c's table of settings). */
    char source[CFG_MAX_STR];
    struct cfg_origin origin[CFG_MAX_SETTINGS];
};

/* An error that names where the bad value came from and the value itself. */
struct cfg_error {
    char msg[1024]; /* e.g. "fencegate.yaml:4:11: listen.resp: bad address '127.0.0.1:99999' (port
                     * must be 1..65535)"; "environment FENCEGATE_LISTEN_RESP: ..."; "flag --resp:
                     * ..." */
};

/* What cfg_parse_args() asked for besides configuration. */
enum cfg_action { CFG_RUN = 0, CFG_HELP, CFG_VERSION };

/* Fills cfg with the embedded defaults. */
void cfg_defaults(struct cfg *cfg);

/* The same for a cfg that is all zero bytes already (static storage, calloc()): only the fields
 * with a default are written, so the tables' unused room (most of a struct cfg's 1 MB) is never
 * touched and takes no memory. */
void cfg_defaults_zeroed(struct cfg *cfg);

/* Applies a YAML document (text, len bytes) to cfg. `source` names it in errors (a file path).
 * Unknown keys, wrong types, bad addresses/URLs and out-of-range numbers are errors that name
 * source:line:column, the key and the offending value. Returns FG_OK or FG_ERR_CONFIG. */
int cfg_parse_yaml(struct cfg *cfg, const char *text, size_t len, const char *source,
                   struct cfg_error *err) FG_MUST_CHECK;

/* Applies FENCEGATE_* variables from envp (NULL-terminated "NAME=value" strings). Unknown
 * FENCEGATE_ names are errors (a typo must not pass silently), except the variables Kubernetes
 * sets for a Service whose name starts with "fencegate" (FENCEGATE_*_SERVICE_HOST,
 * FENCEGATE_*_PORT_443_TCP, ...) and the ones the sidecar's clients read (FENCEGATE_HTTP,
 * FENCEGATE_RESP_ADDR, FENCEGATE_HTTP_ADDR), which are skipped. FENCEGATE_CONFIG is ignored here
 * (see cfg_config_path()). */
int cfg_apply_env(struct cfg *cfg, char *const envp[], struct cfg_error *err) FG_MUST_CHECK;

/* Applies command-line flags (argv[1..argc-1]); sets *action for --help/--version. --config is
 * accepted and ignored here (see cfg_config_path()). Unknown flags and missing values are errors.
 */
int cfg_apply_args(struct cfg *cfg, int argc, char *const argv[], enum cfg_action *action,
                   struct cfg_error *err) FG_MUST_CHECK;

/* The config file to read: --config from argv, else FENCEGATE_CONFIG from envp, else NULL. */
const char *cfg_config_path(int argc, char *const argv[], char *const envp[]);

/* Cross-field checks and derived values, after all sources were applied: protect rules name known
 * stores, store names are unique, the upstream becomes a store (named "redis" if no redis store
 * exists). Returns FG_OK or FG_ERR_CONFIG. */
int cfg_finish(struct cfg *cfg, struct cfg_error *err) FG_MUST_CHECK;

/* Parses "HOST:PORT", "[V6]:PORT", ":PORT" or "PORT" (the last two mean 127.0.0.1). */
int cfg_parse_addr(const char *s, struct cfg_addr *out, struct cfg_error *err) FG_MUST_CHECK;

/* Parses a URL of the kinds above. */
int cfg_parse_url(const char *s, struct cfg_url *out, struct cfg_error *err) FG_MUST_CHECK;

/* Writes url (as configured) into out (cap bytes, NUL-terminated, cut to fit) with its passwords
 * replaced by "***": the one in its user info (user:PASSWORD@; all of it in redis://PASSWORD@,
 * which Redis reads as a password) and the value of a "password" or "sslpassword" query parameter
 * (postgresql://...?password=PASSWORD). Logs and HTTP answers name stores by URL; credentials
 * must not appear in either. Returns out. */
const char *cfg_url_masked(char *out, size_t cap, const char *url);

/* Whether the lock backend is the Redis store itself: same port and database, and the same host,
 * as spelled (in any case) or, when same_host is given, as same_host(a, b) says (fencegate passes
 * net_same_host: localhost and 127.0.0.1 are one); the user does not matter. */
int cfg_store_is_backend(const struct cfg *cfg, int (*same_host)(const char *a, const char *b));

/* Writes into out (cap bytes) where the setting with YAML key `key` was set: "FILE:LINE:COLUMN: ",
 * "environment NAME: ", "flag --NAME: ", or "" for a default; for an error about it found outside
 * this module (a listen address in use, a password file read at start). Returns out. */
const char *cfg_where(const struct cfg *cfg, const char *key, char *out, size_t cap);

/* Writes into err "FILE:LINE:COLUMN: stores[i].url: bad URL '<its URL, passwords masked>': <why>",
 * for a check of a store's URL made outside this module (libpq's parser, say). When the URL holds
 * a password, why is cut before its first '"', where libpq quotes what it could not read. */
void cfg_store_url_error(const struct cfg *cfg, int i, const char *why, struct cfg_error *err);

/* Whether url reaches the Redis endpoint's upstream (after cfg_finish()): a redis:// URL with the
 * same port and database and the same host, as spelled in any case. The user does not matter:
 * the keys are the same. The protect rules of such a store are the Redis endpoint's; cfg_finish()
 * refuses rules on any other Redis store, which nothing would apply. */
int cfg_is_upstream(const struct cfg *cfg, const struct cfg_url *url);

/* The text printed by --help (the flags, env variables and file keys). */
const char *cfg_usage(void);

#endif
