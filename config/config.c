/* config.c — fencegate's configuration: YAML file, FENCEGATE_* environment, flags; validation. */
#include "config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <yaml.h>

/* Declared limits. A real config file is a few KiB; 256 rules of 2 KiB each stay well below this.
 */
#define CFG_YAML_MAX_BYTES (4u * 1024 * 1024)
#define CFG_SHOW_MAX       100 /* bytes of a value quoted in an error message; the rest is "..." */
#define CFG_SHOW_BUF       (CFG_SHOW_MAX * 4 + 8)
#define CFG_ADDR_MAX       300 /* longest "HOST:PORT" (a host name is at most 253 bytes) */
#define CFG_MAP_KEYS       12  /* most keys any one YAML mapping of the schema has */

#define CFG_STR2(x) #x
#define CFG_STR(x)  CFG_STR2(x)

#define CFG_SCHEMES "redis://, etcd://, etcds://, postgresql://, postgres:// or http://"

/* The settings that every source can set; stores and protect rules come from the file only. */
enum cfg_kind {
    CFG_K_ADDR,
    CFG_K_UPSTREAM,
    CFG_K_BACKEND,
    CFG_K_PREFIX,
    CFG_K_INT,
    CFG_K_LLONG,
    CFG_K_LOG,
    CFG_K_PATH,
    CFG_K_BOOL,
    CFG_K_FILE,  /* a readable file's path */
    CFG_K_NAME,  /* a host name for TLS */
    CFG_K_PROBE, /* an http:// URL, or empty for none */
};

struct cfg_setting {
    const char *key;  /* dotted YAML key; NULL when the file cannot set it */
    const char *env;  /* environment variable */
    const char *flag; /* long flag, without the leading "--" */
    enum cfg_kind kind;
    size_t off; /* of the field in struct cfg */
    long long min, max;
};

static const struct cfg_setting cfg_settings[] = {
    {"listen.resp", "FENCEGATE_LISTEN_RESP", "resp", CFG_K_ADDR, offsetof(struct cfg, listen_resp),
     0, 0},
    {"listen.http", "FENCEGATE_LISTEN_HTTP", "http", CFG_K_ADDR, offsetof(struct cfg, listen_http),
     0, 0},
    {"upstream", "FENCEGATE_UPSTREAM", "upstream", CFG_K_UPSTREAM, offsetof(struct cfg, upstream),
     0, 0},
    {"backend.url", "FENCEGATE_BACKEND", "backend", CFG_K_BACKEND, offsetof(struct cfg, backend), 0,
     0},
    {"backend.prefix", "FENCEGATE_BACKEND_PREFIX", "backend-prefix", CFG_K_PREFIX,
     offsetof(struct cfg, backend_prefix), 0, 0},
    {"backend.session_ttl_ms", "FENCEGATE_SESSION_TTL_MS", "session-ttl-ms", CFG_K_LLONG,
     offsetof(struct cfg, session_ttl_ms), 500, 3600000},
    {"backend.tls_ca_file", "FENCEGATE_BACKEND_TLS_CA_FILE", "backend-tls-ca-file", CFG_K_FILE,
     offsetof(struct cfg, backend_tls_ca), 0, 0},
    {"backend.tls_cert_file", "FENCEGATE_BACKEND_TLS_CERT_FILE", "backend-tls-cert-file",
     CFG_K_FILE, offsetof(struct cfg, backend_tls_cert), 0, 0},
    {"backend.tls_key_file", "FENCEGATE_BACKEND_TLS_KEY_FILE", "backend-tls-key-file", CFG_K_FILE,
     offsetof(struct cfg, backend_tls_key), 0, 0},
    {"backend.tls_server_name", "FENCEGATE_BACKEND_TLS_SERVER_NAME", "backend-tls-server-name",
     CFG_K_NAME, offsetof(struct cfg, backend_tls_server_name), 0, 0},
    {"backend.password_file", "FENCEGATE_BACKEND_PASSWORD_FILE", "backend-password-file",
     CFG_K_FILE, offsetof(struct cfg, backend_password_file), 0, 0},
    {"upstream_multiplex", "FENCEGATE_UPSTREAM_MULTIPLEX", "upstream-multiplex", CFG_K_BOOL,
     offsetof(struct cfg, upstream_multiplex), 0, 0},
    {"fenced_transactions", "FENCEGATE_FENCED_TRANSACTIONS", "fenced-transactions", CFG_K_BOOL,
     offsetof(struct cfg, fenced_transactions), 0, 0},
    {"limits.max_clients", "FENCEGATE_MAX_CLIENTS", "max-clients", CFG_K_INT,
     offsetof(struct cfg, max_clients), 1, 1000000},
    {"limits.max_request_bytes", "FENCEGATE_MAX_REQUEST_BYTES", "max-request-bytes", CFG_K_LLONG,
     offsetof(struct cfg, max_request_bytes), 1024, 4294967296LL},
    {"limits.max_pending_bytes", "FENCEGATE_MAX_PENDING_BYTES", "max-pending-bytes", CFG_K_LLONG,
     offsetof(struct cfg, max_pending_bytes), 4096, 1073741824LL},
    {"limits.max_args", "FENCEGATE_MAX_ARGS", "max-args", CFG_K_LLONG,
     offsetof(struct cfg, max_args), 1, INT_MAX},
    {"log.level", "FENCEGATE_LOG_LEVEL", "log-level", CFG_K_LOG, offsetof(struct cfg, log_level), 0,
     0},
    {"shutdown_grace_ms", "FENCEGATE_SHUTDOWN_GRACE_MS", "shutdown-grace-ms", CFG_K_LLONG,
     offsetof(struct cfg, shutdown_grace_ms), 0, 600000},
    {"app_health.url", "FENCEGATE_APP_HEALTH_URL", "app-health-url", CFG_K_PROBE,
     offsetof(struct cfg, app_health_url), 0, 0},
    {"app_health.interval_ms", "FENCEGATE_APP_HEALTH_INTERVAL_MS", "app-health-interval-ms",
     CFG_K_LLONG, offsetof(struct cfg, app_health_interval_ms), 100, 600000},
    {"app_health.timeout_ms", "FENCEGATE_APP_HEALTH_TIMEOUT_MS", "app-health-timeout-ms",
     CFG_K_LLONG, offsetof(struct cfg, app_health_timeout_ms), 100, 600000},
    {"app_health.failure_threshold", "FENCEGATE_APP_HEALTH_FAILURE_THRESHOLD",
     "app-health-failure-threshold", CFG_K_INT, offsetof(struct cfg, app_health_failures), 1, 1000},
    {NULL, "FENCEGATE_CONFIG", "config", CFG_K_PATH, 0, 0, 0},
};

#define CFG_NSETTINGS (sizeof cfg_settings / sizeof cfg_settings[0])

_Static_assert(CFG_NSETTINGS <= CFG_MAX_SETTINGS, "struct cfg.origin is too small");

static const char *const cfg_top_keys[] = {"listen",
                                           "upstream",
                                           "upstream_multiplex",
                                           "fenced_transactions",
                                           "backend",
                                           "stores",
                                           "protect",
                                           "limits",
                                           "log",
                                           "shutdown_grace_ms",
                                           "app_health",
                                           NULL};
static const char *const cfg_listen_keys[] = {"resp", "http", NULL};
static const char *const cfg_backend_keys[] = {
    "url",          "prefix",          "session_ttl_ms", "tls_ca_file", "tls_cert_file",
    "tls_key_file", "tls_server_name", "password_file",  NULL};
static const char *const cfg_limits_keys[] = {"max_clients", "max_request_bytes",
                                              "max_pending_bytes", "max_args", NULL};
static const char *const cfg_log_keys[] = {"level", NULL};
static const char *const cfg_app_health_keys[] = {"url", "interval_ms", "timeout_ms",
                                                  "failure_threshold", NULL};
static const char *const cfg_store_keys[] = {"name",       "url",       "pool_size",
                                             "timeout_ms", "queue_max", NULL};
static const char *const cfg_rule_keys[] = {"store", "keys", "lock", NULL};

enum { CFG_STORE_NAME, CFG_STORE_URL, CFG_STORE_POOL, CFG_STORE_TIMEOUT, CFG_STORE_QUEUE };
enum { CFG_RULE_STORE, CFG_RULE_KEYS, CFG_RULE_LOCK };

static const char *const cfg_log_names[] = {"error", "warn", "info", "debug"};
/* Pairs: the even ones mean true. */
static const char *const cfg_bool_names[] = {"true", "false", "on", "off", "yes", "no", "1", "0"};

/* ---- small helpers ------------------------------------------------------------------------ */

static int cfg_is_digit(int c)
{
    return c >= '0' && c <= '9';
}

static int cfg_is_alnum(int c)
{
    return cfg_is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

static const char *cfg_memrchr(const char *s, int c, size_t n)
{
    while (n > 0) {
        n--;
        if (s[n] == (char)c)
            return s + n;
    }
    return NULL;
}

/* Copies s[0..n) into dst (cap bytes) with a NUL; the callers have checked that it fits. */
static void cfg_copy(char *dst, size_t cap, const char *s, size_t n)
{
    if (cap == 0)
        return;
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, s, n);
    dst[n] = '\0';
}

static void cfg_errf(struct cfg_error *err, const char *fmt, ...) FG_PRINTF(2, 3);

static void cfg_errf(struct cfg_error *err, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    if (vsnprintf(err->msg, sizeof err->msg, fmt, ap) < 0)
        err->msg[0] = '\0';
    va_end(ap);
}

/* Puts a context ("flag --resp: ") in front of the message already in err. */
static void cfg_err_prefix(struct cfg_error *err, const char *fmt, ...) FG_PRINTF(2, 3);

static void cfg_err_prefix(struct cfg_error *err, const char *fmt, ...)
{
    char prefix[512];
    char out[sizeof err->msg];
    va_list ap;

    va_start(ap, fmt);
    if (vsnprintf(prefix, sizeof prefix, fmt, ap) < 0)
        prefix[0] = '\0';
    va_end(ap);
    if (snprintf(out, sizeof out, "%s%s", prefix, err->msg) < 0)
        return;
    memcpy(err->msg, out, sizeof out);
}

/* Renders s[0..n) for quoting in an error message: bytes outside printable ASCII become \xNN,
 * a quote or backslash is escaped, and anything past CFG_SHOW_MAX bytes becomes "...", so a
 * hostile value cannot forge or flood a log line. out must hold CFG_SHOW_BUF bytes. */
static const char *cfg_show(char *out, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;

    for (size_t i = 0; i < n && i < CFG_SHOW_MAX; i++) {
        unsigned char c = (unsigned char)s[i];

        if (c == '\\' || c == '\'') {
            out[o++] = '\\';
            out[o++] = (char)c;
        } else if (c >= 0x20 && c < 0x7f) {
            out[o++] = (char)c;
        } else {
            out[o++] = '\\';
            out[o++] = 'x';
            out[o++] = hex[c >> 4];
            out[o++] = hex[c & 15];
        }
    }
    if (n > CFG_SHOW_MAX) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o] = '\0';
    return out;
}

static const char *cfg_show_str(char *out, const char *s)
{
    return cfg_show(out, s, strnlen(s, CFG_SHOW_MAX + 1));
}

/* Like cfg_show_str() for a URL, with its passwords masked (cfg_url_masked()): error messages
 * end up in logs, credentials must not. */
static const char *cfg_show_url(char *out, const char *s)
{
    char masked[CFG_MAX_STR + 8];

    return cfg_show_str(out, cfg_url_masked(masked, sizeof masked, s));
}

/* ---- addresses ---------------------------------------------------------------------------- */

/* Strict dotted quad: four parts 0..255 without leading zeros (which some resolvers read as
 * octal). Returns 1 when s[0..n) is one. */
static int cfg_ipv4_ok(const char *s, size_t n)
{
    size_t i = 0;

    for (int part = 0; part < 4; part++) {
        size_t start = i;
        int v = 0;

        while (i < n && cfg_is_digit(s[i]) && i - start < 4)
            v = v * 10 + (s[i++] - '0');
        if (i == start || i - start > 3 || v > 255 || (i - start > 1 && s[start] == '0'))
            return 0;
        if (part < 3) {
            if (i >= n || s[i] != '.')
                return 0;
            i++;
        }
    }
    return i == n;
}

/* Checks a host name or IPv4 literal (IPv6 literals come bracketed and are checked elsewhere).
 * Returns NULL when it is fine, else why not. */
static const char *cfg_check_host(const char *h, size_t n)
{
    int numeric = 1;
    size_t label = 0;

    if (n == 0)
        return "empty host";
    if (n > 253)
        return "host name longer than 253 bytes";
    for (size_t i = 0; i < n; i++)
        if (!cfg_is_digit(h[i]) && h[i] != '.')
            numeric = 0;
    if (numeric)
        return cfg_ipv4_ok(h, n) ? NULL
                                 : "bad IPv4 address (four numbers 0..255, no leading zeros)";
    for (size_t i = 0; i < n; i++) {
        char c = h[i];

        if (c == ':')
            return "IPv6 addresses need brackets, e.g. [::1]:6380";
        if (c == '.') {
            if (label == 0 || h[i - 1] == '-')
                return "bad host name (empty label, or a label ending in '-')";
            label = 0;
            continue;
        }
        if (!cfg_is_alnum(c) && c != '-')
            return "bad host name (letters, digits, '-' and '.' only)";
        if (label == 0 && c == '-')
            return "bad host name (a label may not start with '-')";
        if (++label > 63)
            return "bad host name (a label is at most 63 bytes)";
    }
    if (label == 0 || h[n - 1] == '-')
        return "bad host name (empty label, or a label ending in '-')";
    return NULL;
}

static const char *cfg_port(const char *p, size_t n, int *port)
{
    long v = 0;

    if (n == 0)
        return "missing port after ':'";
    for (size_t i = 0; i < n; i++) {
        if (!cfg_is_digit(p[i]))
            return "port must be a number 1..65535";
        if (v <= 65535)
            v = v * 10 + (p[i] - '0');
    }
    if (v < 1 || v > 65535)
        return "port must be 1..65535";
    *port = (int)v;
    return NULL;
}

/* cfg_check_host() for a host to connect to or listen on, which may also be a fully qualified
 * name with its trailing dot ("redis.ns.svc.cluster.local.", as Kubernetes users write to skip
 * the search domains); the resolver takes it so. */
static const char *cfg_hostport_name(const char *h, size_t n)
{
    size_t i;

    if (n < 2 || h[n - 1] != '.' || h[n - 2] == '.')
        return cfg_check_host(h, n);
    for (i = 0; i + 1 < n && (cfg_is_digit(h[i]) || h[i] == '.'); i++)
        ;
    if (i + 1 == n) /* "1.2.3.4." is no IPv4 address */
        return "bad IPv4 address (four numbers 0..255, no leading zeros)";
    return cfg_check_host(h, n - 1);
}

/* Parses host[:port] or [v6][:port] in s[0..n). defport 0 means the port is required. Returns
 * NULL on success, else why it failed. */
static const char *cfg_hostport(const char *s, size_t n, int defport, struct cfg_addr *out)
{
    const char *host, *port = NULL, *why;
    size_t hlen, plen = 0;

    if (memchr(s, ',', n))
        return "one HOST:PORT only (lists separated by ',' are for etcd:// and postgresql:// URLs)";
    if (n > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', n);
        char v6[64];
        struct in6_addr a6;

        if (!close)
            return "missing ']' after IPv6 address";
        host = s + 1;
        hlen = (size_t)(close - host);
        if (hlen == 0)
            return "empty host";
        if (hlen >= sizeof v6)
            return "bad IPv6 address";
        memcpy(v6, host, hlen);
        v6[hlen] = '\0';
        if (inet_pton(AF_INET6, v6, &a6) != 1)
            return "bad IPv6 address";
        if (close + 1 < s + n) {
            if (close[1] != ':')
                return "unexpected text after ']' (expected ':PORT')";
            port = close + 2;
            plen = (size_t)(s + n - port);
        }
    } else {
        const char *colon = cfg_memrchr(s, ':', n);

        host = s;
        hlen = colon ? (size_t)(colon - s) : n;
        if (colon) {
            if (memchr(s, ':', hlen))
                return "IPv6 addresses need brackets, e.g. [::1]:6380";
            port = colon + 1;
            plen = n - hlen - 1;
        }
        why = cfg_hostport_name(host, hlen);
        if (why)
            return why;
    }
    if (port) {
        why = cfg_port(port, plen, &out->port);
        if (why)
            return why;
    } else if (defport == 0) {
        return "missing port (expected HOST:PORT)";
    } else {
        out->port = defport;
    }
    cfg_copy(out->host, sizeof out->host, host, hlen);
    return NULL;
}

/* Parses "HOST:PORT", "[V6]:PORT", ":PORT" or "PORT" into *out (untouched on error). Returns FG_OK,
 * or FG_ERR_CONFIG with "bad address '<s>': <why>" in err. */
int cfg_parse_addr(const char *s, struct cfg_addr *out, struct cfg_error *err)
{
    char shown[CFG_SHOW_BUF];
    struct cfg_addr a;
    const char *why;
    size_t n = strnlen(s, CFG_ADDR_MAX + 1);
    int digits = n > 0;

    memset(&a, 0, sizeof a);
    for (size_t i = 0; i < n; i++)
        if (!cfg_is_digit(s[i]))
            digits = 0;
    if (n == 0) {
        why = "empty (expected HOST:PORT, [IPv6]:PORT, :PORT or PORT)";
    } else if (n > CFG_ADDR_MAX) {
        why = "longer than " CFG_STR(CFG_ADDR_MAX) " bytes";
    } else if (digits || (s[0] == ':' && !memchr(s + 1, ':', n - 1))) {
        /* Only a port: listeners bind loopback unless told otherwise. */
        const char *p = s[0] == ':' ? s + 1 : s;

        why = cfg_port(p, n - (size_t)(p - s), &a.port);
        cfg_copy(a.host, sizeof a.host, "127.0.0.1", 9);
    } else {
        why = cfg_hostport(s, n, 0, &a);
    }
    if (why) {
        cfg_errf(err, "bad address '%s': %s", cfg_show(shown, s, n), why);
        return FG_ERR_CONFIG;
    }
    *out = a;
    return FG_OK;
}

/* Whether two listeners would take the same port: the same host, or the same port where one
 * binds every address (0.0.0.0, or :: which Linux also binds for IPv4). Host names are not
 * resolved here; two names for one address are found once both are bound (net_bound_overlap(),
 * main.c), before either listens. */
static int cfg_listeners_overlap(const struct cfg_addr *a, const struct cfg_addr *b)
{
    const struct cfg_addr *ab[2] = {a, b};

    if (a->port != b->port)
        return 0;
    if (strcasecmp(a->host, b->host) == 0)
        return 1;
    for (int i = 0; i < 2; i++) {
        struct in_addr v4;
        struct in6_addr v6;

        if (inet_pton(AF_INET, ab[i]->host, &v4) == 1 && v4.s_addr == htonl(INADDR_ANY))
            return 1;
        if (inet_pton(AF_INET6, ab[i]->host, &v6) == 1 && IN6_IS_ADDR_UNSPECIFIED(&v6))
            return 1;
    }
    return 0;
}

/* ---- URLs --------------------------------------------------------------------------------- */

static int cfg_hexval(int c)
{
    if (cfg_is_digit(c))
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Percent-decodes s[0..n) into out (cap bytes). Returns NULL or why it failed. */
static const char *cfg_pct_decode(const char *s, size_t n, char *out, size_t cap)
{
    size_t o = 0;

    for (size_t i = 0; i < n; i++) {
        int c = (unsigned char)s[i];

        if (c == '%') {
            int hi, lo;

            if (i + 2 >= n)
                return "bad %-escape in the user info (expected %XX)";
            hi = cfg_hexval((unsigned char)s[i + 1]);
            lo = cfg_hexval((unsigned char)s[i + 2]);
            if (hi < 0 || lo < 0)
                return "bad %-escape in the user info (expected %XX)";
            c = hi * 16 + lo;
            if (c == 0)
                return "%00 is not allowed in the user info";
            i += 2;
        }
        if (o + 1 >= cap)
            return "user name or password too long";
        out[o++] = (char)c;
    }
    out[o] = '\0';
    return NULL;
}

/* The end of the authority: the first of `stops` at or after p, or end. */
static const char *cfg_authority_end(const char *p, const char *end, const char *stops)
{
    while (p < end && !strchr(stops, *p))
        p++;
    return p;
}

static int cfg_scheme_is(const char *s, size_t n, const char *name)
{
    return strlen(name) == n && strncasecmp(s, name, n) == 0;
}

/* Appends s[0..n) to out (cap bytes) at *o, as much as fits with a NUL after it. */
static void cfg_mask_put(char *out, size_t cap, size_t *o, const char *s, size_t n)
{
    size_t room = cap - 1 - *o;

    if (n > room)
        n = room;
    memcpy(out + *o, s, n);
    *o += n;
    out[*o] = '\0';
}

/* 1 when the query parameter name k[0..n), percent-decoded, is one that libpq takes a secret
 * from: password, sslpassword (in any case; libpq itself refuses other spellings). */
static int cfg_mask_key(const char *k, size_t n)
{
    char name[16];

    if (cfg_pct_decode(k, n, name, sizeof name) != NULL)
        return 0;
    return strcasecmp(name, "password") == 0 || strcasecmp(name, "sslpassword") == 0;
}

const char *cfg_url_masked(char *out, size_t cap, const char *url)
{
    const char *end = url + strlen(url), *sep = strstr(url, "://"), *cur = url, *q;
    size_t o = 0;

    if (cap == 0)
        return out;
    out[0] = '\0';
    if (sep) {
        size_t sl = (size_t)(sep - url);
        int pg = cfg_scheme_is(url, sl, "postgresql") || cfg_scheme_is(url, sl, "postgres");
        int redis = cfg_scheme_is(url, sl, "redis") || cfg_scheme_is(url, sl, "rediss");
        const char *auth = sep + 3, *aend = pg ? cfg_authority_end(auth, end, "/?") : end;
        /* the user info ends where cfg_url_postgres() and cfg_url_redis() end it */
        const char *at = cfg_memrchr(auth, '@', (size_t)(aend - auth));
        const char *colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;

        if (colon && colon + 1 < at) { /* user:password@ */
            cfg_mask_put(out, cap, &o, url, (size_t)(colon + 1 - url));
            cfg_mask_put(out, cap, &o, "***", 3);
            cur = at;
        } else if (at && !colon && redis && at > auth) { /* redis://password@ */
            cfg_mask_put(out, cap, &o, url, (size_t)(auth - url));
            cfg_mask_put(out, cap, &o, "***", 3);
            cur = at;
        }
        q = strchr(at ? at + 1 : auth, '?');
    } else {
        q = strchr(url, '?');
    }
    if (!q) {
        cfg_mask_put(out, cap, &o, cur, (size_t)(end - cur));
        return out;
    }
    cfg_mask_put(out, cap, &o, cur, (size_t)(q + 1 - cur));
    for (cur = q + 1; cur < end;) { /* key=value&... */
        const char *amp = cfg_authority_end(cur, end, "&#");
        const char *eq = memchr(cur, '=', (size_t)(amp - cur));

        if (eq && cfg_mask_key(cur, (size_t)(eq - cur))) {
            cfg_mask_put(out, cap, &o, cur, (size_t)(eq + 1 - cur));
            cfg_mask_put(out, cap, &o, "***", 3);
        } else {
            cfg_mask_put(out, cap, &o, cur, (size_t)(amp - cur));
        }
        if (amp < end)
            cfg_mask_put(out, cap, &o, amp, 1);
        cur = amp + 1;
    }
    return out;
}

static const char *cfg_host_list(const char *p, const char *end, int defport, struct cfg_url *u)
{
    for (;;) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *e = comma ? comma : end;
        const char *why;

        if (u->nhosts >= CFG_MAX_HOSTS)
            return "more than " CFG_STR(CFG_MAX_HOSTS) " hosts";
        why = cfg_hostport(p, (size_t)(e - p), defport, &u->hosts[u->nhosts]);
        if (why)
            return why;
        u->nhosts++;
        if (!comma)
            return NULL;
        p = comma + 1;
    }
}

/* Decodes the user info p[0..at): "user:password", or a password alone (no ':'). */
static const char *cfg_userinfo(const char *p, const char *at, struct cfg_url *u)
{
    const char *colon = memchr(p, ':', (size_t)(at - p));
    const char *pstart = colon ? colon + 1 : p;
    const char *why =
        colon ? cfg_pct_decode(p, (size_t)(colon - p), u->user, sizeof u->user) : NULL;

    return why ? why
               : cfg_pct_decode(pstart, (size_t)(at - pstart), u->password, sizeof u->password);
}

/* redis://[[user]:password@]host[:port][/db]. The user info ends at the last '@', so a password
 * may hold '/', '?' or '#' without escaping. As redis-cli -u reads it (and the lock client too),
 * user info without ':' is a password, not a user name. */
static const char *cfg_url_redis(const char *p, const char *end, struct cfg_url *u)
{
    const char *at = cfg_memrchr(p, '@', (size_t)(end - p));
    const char *aend, *why;
    long long db = 0;

    if (at) {
        why = cfg_userinfo(p, at, u);
        if (why)
            return why;
        p = at + 1;
    }
    aend = cfg_authority_end(p, end, "/?#");
    why = cfg_hostport(p, (size_t)(aend - p), 6379, &u->hosts[0]);
    if (why)
        return why;
    u->nhosts = 1;
    if (aend == end)
        return NULL;
    if (*aend != '/' || cfg_authority_end(aend, end, "?#") != end)
        return "query strings and fragments are not supported in redis:// URLs";
    for (const char *d = aend + 1; d < end; d++) {
        if (!cfg_is_digit(*d))
            return "the database after '/' must be a number, e.g. redis://127.0.0.1:6379/0";
        db = db * 10 + (*d - '0');
        if (db > INT_MAX)
            return "database number out of range (0..2147483647)";
    }
    u->db = (int)db;
    return NULL;
}

/* etcd://[user[:password]@]host[:port][,host[:port]...]. As with redis://, the user info ends at
 * the last '@'; unlike redis://, user info without ':' is a user name (etcd's authentication
 * needs one), whose password then comes from backend.password_file (cfg_finish() checks). */
static const char *cfg_url_etcd(const char *p, const char *end, struct cfg_url *u)
{
    const char *at = cfg_memrchr(p, '@', (size_t)(end - p));
    const char *aend, *why;

    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));

        if (colon == p || at == p)
            return "etcd:// credentials must be user:password@ or user@ (a user name is needed)";
        why = colon ? cfg_userinfo(p, at, u)
                    : cfg_pct_decode(p, (size_t)(at - p), u->user, sizeof u->user);
        if (why)
            return why;
        p = at + 1;
    }
    aend = cfg_authority_end(p, end, "/?#");
    if (aend < end && (*aend != '/' || aend + 1 != end))
        return "etcd:// URLs take no path or query (set the key prefix with backend.prefix)";
    return cfg_host_list(p, aend, 2379, u);
}

/* postgresql://[user[:password]@]host[:port][,...][/database][?params]; raw goes to libpq, we
 * only check the hosts and keep the database name. */
static const char *cfg_url_postgres(const char *p, const char *end, struct cfg_url *u)
{
    const char *aend = cfg_authority_end(p, end, "/?");
    const char *at = cfg_memrchr(p, '@', (size_t)(aend - p));
    const char *why;

    if (at)
        p = at + 1;
    if (p == aend)
        return "empty host (fencegate connects over TCP: give host[:port])";
    why = cfg_host_list(p, aend, 5432, u);
    if (why)
        return why;
    if (aend < end && *aend == '/') {
        const char *dend = cfg_authority_end(aend + 1, end, "?");

        cfg_copy(u->path, sizeof u->path, aend + 1, (size_t)(dend - aend - 1));
    }
    return NULL;
}

/* http://host[:port][/path] */
static const char *cfg_url_http(const char *p, const char *end, struct cfg_url *u)
{
    const char *aend = cfg_authority_end(p, end, "/?#");
    const char *why;

    if (memchr(p, '@', (size_t)(aend - p)))
        return "credentials in http:// URLs are not supported";
    why = cfg_hostport(p, (size_t)(aend - p), 80, &u->hosts[0]);
    if (why)
        return why;
    u->nhosts = 1;
    if (aend < end) {
        if (*aend != '/' || cfg_authority_end(aend, end, "?#") != end)
            return "query strings and fragments are not supported in http:// URLs";
        cfg_copy(u->path, sizeof u->path, aend, (size_t)(end - aend));
    }
    return NULL;
}

static const char *cfg_url_any(const char *s, size_t n, struct cfg_url *u)
{
    const char *sep, *p, *end = s + n;
    size_t sl;

    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] <= 0x20 || s[i] == 0x7f)
            return "URLs may not contain spaces or control characters";
    sep = strstr(s, "://");
    if (!sep)
        return "missing scheme (expected " CFG_SCHEMES ")";
    sl = (size_t)(sep - s);
    p = sep + 3;
    if (cfg_scheme_is(s, sl, "redis")) {
        u->kind = CFG_URL_REDIS;
        return cfg_url_redis(p, end, u);
    }
    if (cfg_scheme_is(s, sl, "etcd") || cfg_scheme_is(s, sl, "etcds")) {
        u->kind = CFG_URL_ETCD;
        u->tls = sl == 5;
        return cfg_url_etcd(p, end, u);
    }
    if (cfg_scheme_is(s, sl, "postgresql") || cfg_scheme_is(s, sl, "postgres")) {
        u->kind = CFG_URL_POSTGRES;
        return cfg_url_postgres(p, end, u);
    }
    if (cfg_scheme_is(s, sl, "http")) {
        u->kind = CFG_URL_HTTP;
        return cfg_url_http(p, end, u);
    }
    if (cfg_scheme_is(s, sl, "https"))
        return "https:// is not supported yet (no TLS); use http://";
    if (cfg_scheme_is(s, sl, "rediss"))
        return "rediss:// is not supported yet (no TLS); use redis://";
    return "unknown scheme (expected " CFG_SCHEMES ")";
}

int cfg_store_is_backend(const struct cfg *cfg, int (*same_host)(const char *a, const char *b))
{
    const struct cfg_url *b = &cfg->backend, *u = &cfg->upstream;

    if (b->kind != CFG_URL_REDIS || u->kind != CFG_URL_REDIS || b->db != u->db ||
        b->hosts[0].port != u->hosts[0].port)
        return 0;
    return strcasecmp(b->hosts[0].host, u->hosts[0].host) == 0 ||
           (same_host && same_host(b->hosts[0].host, u->hosts[0].host));
}

/* Parses a redis://, etcd://, postgresql:// (or postgres://) or http:// URL into *out. The scheme
 * is read in any case and kept in out->raw in lower case, the only spelling the lock client and
 * libpq, which get raw, know. Returns FG_OK, or FG_ERR_CONFIG with "bad URL '<s>': <why>" in err
 * (a password shown as "***") and *out zeroed. */
int cfg_parse_url(const char *s, struct cfg_url *out, struct cfg_error *err)
{
    char shown[CFG_SHOW_BUF];
    const char *why;
    size_t n = strnlen(s, CFG_MAX_STR);

    memset(out, 0, sizeof *out);
    if (n == 0) {
        why = "empty (expected " CFG_SCHEMES ")";
    } else if (n >= CFG_MAX_STR) {
        why = "too long (at most 1023 bytes)";
    } else {
        cfg_copy(out->raw, sizeof out->raw, s, n);
        why = cfg_url_any(out->raw, n, out);
        for (char *p = out->raw; !why && *p != ':'; p++) /* a known scheme: letters only */
            if (*p >= 'A' && *p <= 'Z')
                *p = (char)(*p - 'A' + 'a');
    }
    if (why) {
        cfg_errf(err, "bad URL '%s': %s", cfg_show_url(shown, s), why);
        memset(out, 0, sizeof *out);
        return FG_ERR_CONFIG;
    }
    return FG_OK;
}

/* ---- values ------------------------------------------------------------------------------- */

/* A decimal integer in min..max: no sign but '-', no leading zeros (YAML 1.1 reads them as octal),
 * no suffixes or exponents. Returns FG_OK or FG_ERR_CONFIG with the reason in err. */
static int cfg_number(const char *s, long long min, long long max, long long *out,
                      struct cfg_error *err)
{
    char shown[CFG_SHOW_BUF];
    size_t n = strlen(s), i = s[0] == '-' ? 1 : 0;
    long long v = 0;
    int ok = i < n;

    for (size_t j = i; j < n; j++)
        if (!cfg_is_digit(s[j]))
            ok = 0;
    if (!ok) {
        cfg_errf(err, "bad number '%s': expected a decimal integer %lld..%lld",
                 cfg_show(shown, s, n), min, max);
        return FG_ERR_CONFIG;
    }
    if (n - i > 1 && s[i] == '0') {
        cfg_errf(err, "bad number '%s': leading zeros are not allowed (expected %lld..%lld)",
                 cfg_show(shown, s, n), min, max);
        return FG_ERR_CONFIG;
    }
    for (size_t j = i; j < n; j++) {
        int d = s[j] - '0';

        if (v > (LLONG_MAX - d) / 10) {
            ok = 0;
            break;
        }
        v = v * 10 + d;
    }
    if (i)
        v = -v;
    if (!ok || v < min || v > max) {
        cfg_errf(err, "number '%s' is out of range: must be %lld..%lld", cfg_show(shown, s, n), min,
                 max);
        return FG_ERR_CONFIG;
    }
    *out = v;
    return FG_OK;
}

/* Store names appear in HTTP paths and metrics labels, hence the narrow alphabet. */
static const char *cfg_check_name(const char *s)
{
    size_t n = strnlen(s, sizeof(((struct cfg_store *)0)->name));

    if (n == 0)
        return "empty name";
    if (n >= sizeof(((struct cfg_store *)0)->name))
        return "longer than 127 bytes";
    for (size_t i = 0; i < n; i++)
        if (!cfg_is_alnum(s[i]) && s[i] != '_' && s[i] != '.' && s[i] != '-')
            return "use letters, digits, '_', '.' and '-' only";
    return NULL;
}

/* Sets one setting from its text form. Errors carry the reason only; the caller says where. */
static int cfg_set(struct cfg *cfg, const struct cfg_setting *s, const char *val,
                   struct cfg_error *err)
{
    char shown[CFG_SHOW_BUF];
    char *field = (char *)cfg + s->off;
    struct cfg_url u;
    struct stat st;
    long long v;
    int rc;

    switch (s->kind) {
    case CFG_K_ADDR:
        return cfg_parse_addr(val, (struct cfg_addr *)(void *)field, err);
    case CFG_K_UPSTREAM:
    case CFG_K_BACKEND:
        rc = cfg_parse_url(val, &u, err);
        if (rc)
            return rc;
        if (s->kind == CFG_K_UPSTREAM && u.kind != CFG_URL_REDIS) {
            cfg_errf(err, "bad URL '%s': the upstream must be a redis:// URL",
                     cfg_show_url(shown, val));
            return FG_ERR_CONFIG;
        }
        if (s->kind == CFG_K_BACKEND && u.kind != CFG_URL_REDIS && u.kind != CFG_URL_ETCD) {
            cfg_errf(err, "bad URL '%s': the lock backend must be redis:// or etcd://",
                     cfg_show_url(shown, val));
            return FG_ERR_CONFIG;
        }
        memcpy(field, &u, sizeof u);
        return FG_OK;
    case CFG_K_PREFIX: {
        size_t n = strnlen(val, sizeof cfg->backend_prefix);

        if (n == 0) {
            cfg_errf(err, "empty prefix (expected e.g. /fencegate/locks/)");
            return FG_ERR_CONFIG;
        }
        if (n > CFG_MAX_PREFIX) {
            cfg_errf(err, "prefix '%s' is too long (at most %d bytes)", cfg_show_str(shown, val),
                     CFG_MAX_PREFIX);
            return FG_ERR_CONFIG;
        }
        for (size_t i = 0; i < n; i++) {
            if ((unsigned char)val[i] < 0x20 || val[i] == 0x7f) {
                cfg_errf(err, "prefix '%s' contains a control character", cfg_show(shown, val, n));
                return FG_ERR_CONFIG;
            }
        }
        cfg_copy(cfg->backend_prefix, sizeof cfg->backend_prefix, val, n);
        return FG_OK;
    }
    case CFG_K_INT:
    case CFG_K_LLONG:
        rc = cfg_number(val, s->min, s->max, &v, err);
        if (rc)
            return rc;
        if (s->kind == CFG_K_INT)
            *(int *)(void *)field = (int)v;
        else
            *(long long *)(void *)field = v;
        return FG_OK;
    case CFG_K_LOG:
        for (size_t i = 0; i < sizeof cfg_log_names / sizeof cfg_log_names[0]; i++) {
            if (strcasecmp(val, cfg_log_names[i]) == 0) {
                cfg->log_level = (enum cfg_log_level)i;
                return FG_OK;
            }
        }
        cfg_errf(err, "bad log level '%s': expected error, warn, info or debug",
                 cfg_show_str(shown, val));
        return FG_ERR_CONFIG;
    case CFG_K_PATH:
        return FG_OK;
    case CFG_K_FILE:
        if (val[0] == '\0' || strlen(val) >= CFG_MAX_STR) {
            cfg_errf(err, "bad file path '%s': empty or too long", cfg_show_str(shown, val));
            return FG_ERR_CONFIG;
        }
        if (access(val, R_OK) != 0) {
            cfg_errf(err, "cannot read file '%s': %s", cfg_show_str(shown, val), strerror(errno));
            return FG_ERR_CONFIG;
        }
        /* Readable, but a directory is no PEM or password file (a device or pipe may be). */
        if (stat(val, &st) == 0 && S_ISDIR(st.st_mode)) {
            cfg_errf(err, "cannot read file '%s': it is a directory", cfg_show_str(shown, val));
            return FG_ERR_CONFIG;
        }
        cfg_copy(field, CFG_MAX_STR, val, strlen(val));
        return FG_OK;
    case CFG_K_NAME:
        if (cfg_check_host(val, strlen(val)) != NULL) {
            cfg_errf(err, "bad host name '%s': %s", cfg_show_str(shown, val),
                     cfg_check_host(val, strlen(val)));
            return FG_ERR_CONFIG;
        }
        cfg_copy(field, sizeof cfg->backend_tls_server_name, val, strlen(val));
        return FG_OK;
    case CFG_K_PROBE:
        if (val[0] == '\0') {
            memset(field, 0, sizeof u);
            return FG_OK;
        }
        rc = cfg_parse_url(val, &u, err);
        if (rc)
            return rc;
        if (u.kind != CFG_URL_HTTP) {
            cfg_errf(err, "bad URL '%s': the health check must be an http:// URL",
                     cfg_show_url(shown, val));
            return FG_ERR_CONFIG;
        }
        memcpy(field, &u, sizeof u);
        return FG_OK;
    case CFG_K_BOOL:
        for (size_t i = 0; i < sizeof cfg_bool_names / sizeof cfg_bool_names[0]; i++) {
            if (strcasecmp(val, cfg_bool_names[i]) == 0) {
                *(int *)(void *)field = (int)(i % 2 == 0);
                return FG_OK;
            }
        }
        cfg_errf(err, "bad value '%s': expected true or false", cfg_show_str(shown, val));
        return FG_ERR_CONFIG;
    }
    return FG_OK;
}

static const char *cfg_expect(const struct cfg_setting *s)
{
    switch (s->kind) {
    case CFG_K_ADDR:
        return "an address HOST:PORT";
    case CFG_K_UPSTREAM:
        return "a redis:// URL";
    case CFG_K_BACKEND:
        return "a redis:// or etcd:// URL";
    case CFG_K_PREFIX:
        return "a key prefix";
    case CFG_K_INT:
    case CFG_K_LLONG:
        return "a number";
    case CFG_K_LOG:
        return "a log level (error, warn, info or debug)";
    case CFG_K_PATH:
    case CFG_K_FILE:
        return "a file path";
    case CFG_K_NAME:
        return "a host name";
    case CFG_K_PROBE:
        return "an http:// URL";
    case CFG_K_BOOL:
        return "true or false";
    }
    return "a value";
}

static const struct cfg_setting *cfg_find_key(const char *key)
{
    for (size_t i = 0; i < CFG_NSETTINGS; i++)
        if (cfg_settings[i].key && strcmp(cfg_settings[i].key, key) == 0)
            return &cfg_settings[i];
    return NULL;
}

/* Only '*' and '?' are special in a key pattern (fence.c). Redis's globs also have [classes]
 * and \\ escapes, which would match literally here and leave the keys a user meant unprotected.
 * Returns NULL when the pattern is fine, else why not. */
static const char *cfg_check_glob(const char *g)
{
    if (strpbrk(g, "[]"))
        return "'[' and ']' are not special here (only '*' and '?' are); to match a bracket, put "
               "'?' in its place";
    if (strchr(g, '\\'))
        return "'\\\\' escapes are not supported (only '*' and '?' are special); to match a "
               "'*', '?' or '\\\\', put '?' in its place";
    return NULL;
}

/* Checks that every "$N" in the lock template names a '*' of the glob; "$$" stands for a '$'
 * and names nothing, as fence.c reads it. Returns FG_OK or FG_ERR_CONFIG with the reason in err.
 */
static int cfg_check_rule(const struct cfg_protect *r, struct cfg_error *err)
{
    char shown[CFG_SHOW_BUF], shown2[CFG_SHOW_BUF];
    int stars = 0;

    if (r->keys[0] == '\0') {
        cfg_errf(err, "empty key pattern (expected a glob such as 'wallet:*')");
        return FG_ERR_CONFIG;
    }
    if (r->lock[0] == '\0') {
        cfg_errf(err, "empty lock name (expected a name such as 'wallet:$1')");
        return FG_ERR_CONFIG;
    }
    if (cfg_check_glob(r->keys)) {
        cfg_errf(err, "bad key pattern '%s': %s", cfg_show_str(shown, r->keys),
                 cfg_check_glob(r->keys));
        return FG_ERR_CONFIG;
    }
    for (const char *p = r->keys; *p; p++)
        stars += *p == '*';
    for (const char *p = r->lock; *p; p++) {
        int nth;

        if (*p == '$' && p[1] == '$') { /* "$$" is a '$' of the name (fence.c expands it so) */
            p++;
            continue;
        }
        if (*p != '$' || !cfg_is_digit(p[1]))
            continue;
        nth = p[1] - '0';
        if (nth == 0) {
            cfg_errf(err, "bad lock template '%s': there is no $0 (captures are $1..$9)",
                     cfg_show_str(shown, r->lock));
            return FG_ERR_CONFIG;
        }
        if (nth > stars) {
            cfg_errf(err,
                     "bad lock template '%s': $%d refers to '*' number %d, but keys '%s' has %d",
                     cfg_show_str(shown, r->lock), nth, nth, cfg_show_str(shown2, r->keys), stars);
            return FG_ERR_CONFIG;
        }
    }
    return FG_OK;
}

/* ---- YAML --------------------------------------------------------------------------------- */

struct cfg_yaml {
    yaml_parser_t parser;
    yaml_event_t ev; /* the current event, when have_ev */
    int have_ev;
    const char *src;
    const char *text;
    size_t len;
    struct cfg *cfg;
    struct cfg_error *err;
};

/* One mapping being walked: its dotted path, its allowed keys, and where each key was seen. */
struct cfg_map {
    const char *path;
    const char *const *keys;
    size_t line[CFG_MAP_KEYS]; /* 0: not seen yet; else the 1-based line */
};

static int yaml_fail(struct cfg_yaml *y, yaml_mark_t m, const char *fmt, ...) FG_PRINTF(3, 4);

static int yaml_fail(struct cfg_yaml *y, yaml_mark_t m, const char *fmt, ...)
{
    char body[sizeof y->err->msg];
    va_list ap;

    va_start(ap, fmt);
    if (vsnprintf(body, sizeof body, fmt, ap) < 0)
        body[0] = '\0';
    va_end(ap);
    cfg_errf(y->err, "%s:%zu:%zu: %s", y->src, m.line + 1, m.column + 1, body);
    return FG_ERR_CONFIG;
}

/* Reports the libyaml error as source:line:column. Reader errors (bad UTF-8, control bytes)
 * carry only a byte offset, so the position is recounted from the text. */
static int yaml_syntax(struct cfg_yaml *y)
{
    const yaml_parser_t *p = &y->parser;
    yaml_mark_t m = p->problem_mark;
    const char *problem = p->problem ? p->problem : "unknown error";
    const char *hint = "";
    char ctx[192] = "";

    if (p->error == YAML_MEMORY_ERROR) {
        cfg_errf(y->err, "%s: out of memory while parsing YAML", y->src);
        return FG_ERR_CONFIG;
    }
    if (p->error == YAML_READER_ERROR) {
        size_t end = p->problem_offset < y->len ? p->problem_offset : y->len;

        memset(&m, 0, sizeof m);
        for (size_t i = 0; i < end; i++) {
            unsigned char c = (unsigned char)y->text[i];

            if (c == '\n') {
                m.line++;
                m.column = 0;
            } else if ((c & 0xc0) != 0x80) {
                m.column++;
            }
        }
    }
    if (m.index < y->len && y->text[m.index] == '\t')
        hint = "; indent with spaces (YAML does not allow tabs here)";
    if (p->context &&
        snprintf(ctx, sizeof ctx, " (%s, from line %zu)", p->context, p->context_mark.line + 1) < 0)
        ctx[0] = '\0';
    return yaml_fail(y, m, "YAML syntax error: %s%s%s", problem, ctx, hint);
}

/* Moves to the next event. Anchors, aliases and tags are refused: a config file gains nothing
 * from them, and aliases make one value appear under several keys. */
static int yaml_next(struct cfg_yaml *y)
{
    char shown[CFG_SHOW_BUF];
    const yaml_event_t *e = &y->ev;
    const yaml_char_t *anchor = NULL, *tag = NULL;

    if (y->have_ev) {
        yaml_event_delete(&y->ev);
        y->have_ev = 0;
    }
    if (!yaml_parser_parse(&y->parser, &y->ev))
        return yaml_syntax(y);
    y->have_ev = 1;
    switch (e->type) {
    case YAML_ALIAS_EVENT:
        return yaml_fail(y, e->start_mark, "aliases ('*%s') are not supported; write the value out",
                         cfg_show_str(shown, (const char *)e->data.alias.anchor));
    case YAML_SCALAR_EVENT:
        anchor = e->data.scalar.anchor;
        tag = e->data.scalar.tag;
        break;
    case YAML_SEQUENCE_START_EVENT:
        anchor = e->data.sequence_start.anchor;
        tag = e->data.sequence_start.tag;
        break;
    case YAML_MAPPING_START_EVENT:
        anchor = e->data.mapping_start.anchor;
        tag = e->data.mapping_start.tag;
        break;
    default:
        break;
    }
    if (anchor)
        return yaml_fail(y, e->start_mark, "anchors ('&%s') are not supported; write the value out",
                         cfg_show_str(shown, (const char *)anchor));
    if (tag)
        return yaml_fail(y, e->start_mark, "tags ('%s') are not supported",
                         cfg_show_str(shown, (const char *)tag));
    return FG_OK;
}

/* A plain empty, "~" or "null" scalar: YAML's way of writing "no value". */
static int yaml_is_null(const yaml_event_t *e)
{
    const char *v = (const char *)e->data.scalar.value;
    size_t n;

    if (e->type != YAML_SCALAR_EVENT || e->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return 0;
    n = e->data.scalar.length;
    return n == 0 || (n == 1 && v[0] == '~') ||
           (n == 4 && (!memcmp(v, "null", 4) || !memcmp(v, "Null", 4) || !memcmp(v, "NULL", 4)));
}

/* Describes the current event for "expected X, got Y" messages. */
static const char *yaml_got(const yaml_event_t *e, char *out, size_t cap)
{
    char shown[CFG_SHOW_BUF];

    switch (e->type) {
    case YAML_MAPPING_START_EVENT:
        return "a mapping";
    case YAML_SEQUENCE_START_EVENT:
        return "a list";
    case YAML_SCALAR_EVENT:
        if (snprintf(out, cap, "'%s'",
                     cfg_show(shown, (const char *)e->data.scalar.value, e->data.scalar.length)) <
            0)
            return "a scalar";
        return out;
    default:
        return "something else";
    }
}

/* Copies the current scalar into out. Errors name `key` and say what was expected. */
static int yaml_scalar(struct cfg_yaml *y, const char *key, const char *expect, char *out,
                       size_t cap)
{
    char shown[CFG_SHOW_BUF], got[CFG_SHOW_BUF + 8];
    const yaml_event_t *e = &y->ev;
    const char *v;
    size_t n;

    if (e->type != YAML_SCALAR_EVENT)
        return yaml_fail(y, e->start_mark, "%s: expected %s, got %s", key, expect,
                         yaml_got(e, got, sizeof got));
    if (yaml_is_null(e))
        return yaml_fail(y, e->start_mark, "%s: missing value (expected %s)", key, expect);
    v = (const char *)e->data.scalar.value;
    n = e->data.scalar.length;
    if (memchr(v, '\0', n))
        return yaml_fail(y, e->start_mark, "%s: value '%s' contains a NUL byte", key,
                         cfg_show(shown, v, n));
    if (n >= cap)
        return yaml_fail(y, e->start_mark, "%s: value '%s' is too long (at most %zu bytes)", key,
                         cfg_show(shown, v, n), cap - 1);
    cfg_copy(out, cap, v, n);
    return FG_OK;
}

static void cfg_join(char *out, size_t cap, const char *const *names)
{
    size_t o = 0;

    out[0] = '\0';
    for (size_t i = 0; names[i]; i++) {
        int n = snprintf(out + o, cap - o, "%s%s", i ? ", " : "", names[i]);

        if (n < 0 || (size_t)n >= cap - o)
            return;
        o += (size_t)n;
    }
}

/* Reads the next key of the mapping being walked into *idx (its index in m->keys), or sets *idx to
 * -1 at the end of the mapping. Unknown and repeated keys are errors. */
static int yaml_map_key(struct cfg_yaml *y, struct cfg_map *m, int *idx)
{
    char shown[CFG_SHOW_BUF], got[CFG_SHOW_BUF + 8], list[256];
    const yaml_event_t *e = &y->ev;
    const char *k;
    size_t kn, i;
    int rc = yaml_next(y);

    if (rc)
        return rc;
    *idx = -1;
    if (e->type == YAML_MAPPING_END_EVENT)
        return FG_OK;
    cfg_join(list, sizeof list, m->keys);
    if (e->type != YAML_SCALAR_EVENT)
        return yaml_fail(y, e->start_mark, "%s%sexpected a key (one of: %s), got %s", m->path,
                         *m->path ? ": " : "", list, yaml_got(e, got, sizeof got));
    k = (const char *)e->data.scalar.value;
    kn = e->data.scalar.length;
    for (i = 0; m->keys[i]; i++)
        if (strlen(m->keys[i]) == kn && memcmp(m->keys[i], k, kn) == 0)
            break;
    if (!m->keys[i] || i >= CFG_MAP_KEYS)
        return yaml_fail(y, e->start_mark, "%s%sunknown key '%s' (expected one of: %s)", m->path,
                         *m->path ? ": " : "", cfg_show(shown, k, kn), list);
    if (m->line[i])
        return yaml_fail(y, e->start_mark, "%s%s%s: duplicate key (first given at line %zu)",
                         m->path, *m->path ? "." : "", m->keys[i], m->line[i]);
    m->line[i] = e->start_mark.line + 1;
    *idx = (int)i;
    return FG_OK;
}

/* Records that a value came from the file at mark m. */
static void cfg_mark(struct cfg_origin *o, yaml_mark_t m)
{
    o->from = CFG_FROM_FILE;
    o->line = m.line + 1 > INT_MAX ? INT_MAX : (int)(m.line + 1);
    o->column = m.column + 1 > INT_MAX ? INT_MAX : (int)(m.column + 1);
}

/* Applies the current scalar to setting s. */
static int yaml_setting(struct cfg_yaml *y, const struct cfg_setting *s)
{
    char val[CFG_MAX_STR];
    yaml_mark_t m = y->ev.start_mark;
    int rc = yaml_scalar(y, s->key, cfg_expect(s), val, sizeof val);

    if (rc)
        return rc;
    rc = cfg_set(y->cfg, s, val, y->err);
    if (rc) {
        cfg_err_prefix(y->err, "%s:%zu:%zu: %s: ", y->src, m.line + 1, m.column + 1, s->key);
        return rc;
    }
    cfg_mark(&y->cfg->origin[s - cfg_settings], m);
    return FG_OK;
}

/* listen, backend, limits, log: mappings of plain settings named "<name>.<key>". */
static int yaml_section(struct cfg_yaml *y, const char *name, const char *const *keys)
{
    char got[CFG_SHOW_BUF + 8], list[256], path[64];
    struct cfg_map m;
    int idx, rc;

    if (yaml_is_null(&y->ev))
        return FG_OK;
    if (y->ev.type != YAML_MAPPING_START_EVENT) {
        cfg_join(list, sizeof list, keys);
        return yaml_fail(y, y->ev.start_mark, "%s: expected a mapping of %s, got %s", name, list,
                         yaml_got(&y->ev, got, sizeof got));
    }
    memset(&m, 0, sizeof m);
    m.path = name;
    m.keys = keys;
    for (;;) {
        const struct cfg_setting *s;

        rc = yaml_map_key(y, &m, &idx);
        if (rc || idx < 0)
            return rc;
        if (snprintf(path, sizeof path, "%s.%s", name, keys[idx]) < 0)
            path[0] = '\0';
        s = cfg_find_key(path);
        rc = yaml_next(y);
        if (rc)
            return rc;
        if (!s)
            return yaml_fail(y, y->ev.start_mark, "%s: not a setting (internal error)", path);
        rc = yaml_setting(y, s);
        if (rc)
            return rc;
    }
}

/* One { name, url } entry of stores; the current event is its start. */
static int yaml_store(struct cfg_yaml *y, int i)
{
    char path[48], key[64], val[CFG_MAX_STR], shown[CFG_SHOW_BUF], got[CFG_SHOW_BUF + 8];
    yaml_mark_t start = y->ev.start_mark, vm;
    struct cfg_store *st;
    struct cfg_map m;
    const char *why;
    int idx, rc;

    if (snprintf(path, sizeof path, "stores[%d]", i) < 0)
        path[0] = '\0';
    if (i >= CFG_MAX_STORES)
        return yaml_fail(y, start, "%s: too many stores (at most %d)", path, CFG_MAX_STORES);
    if (y->ev.type != YAML_MAPPING_START_EVENT)
        return yaml_fail(y, start, "%s: expected a mapping { name, url }, got %s", path,
                         yaml_got(&y->ev, got, sizeof got));
    st = &y->cfg->stores[i];
    memset(st, 0, sizeof *st);
    memset(&m, 0, sizeof m);
    m.path = path;
    m.keys = cfg_store_keys;
    for (;;) {
        rc = yaml_map_key(y, &m, &idx);
        if (rc)
            return rc;
        if (idx < 0)
            break;
        if (snprintf(key, sizeof key, "%s.%s", path, cfg_store_keys[idx]) < 0)
            key[0] = '\0';
        rc = yaml_next(y);
        if (rc)
            return rc;
        vm = y->ev.start_mark;
        if (idx == CFG_STORE_NAME) {
            rc = yaml_scalar(y, key, "a store name", val, sizeof val);
            if (rc)
                return rc;
            why = cfg_check_name(val);
            if (why)
                return yaml_fail(y, vm, "%s: bad store name '%s': %s", key,
                                 cfg_show_str(shown, val), why);
            for (int j = 0; j < i; j++)
                if (strcmp(y->cfg->stores[j].name, val) == 0)
                    return yaml_fail(y, vm, "%s: duplicate store name '%s' (stores[%d] has it)",
                                     key, cfg_show_str(shown, val), j);
            cfg_copy(st->name, sizeof st->name, val, strlen(val));
        } else if (idx >= CFG_STORE_POOL) {
            /* postgresql stores: pool_size, timeout_ms, queue_max (pgstore.h) */
            static const long long lo[] = {1, 100, 1}, hi[] = {256, 3600000, 100000};
            long long v = 0;
            int k = idx - CFG_STORE_POOL;
            rc = yaml_scalar(y, key, "an integer", val, sizeof val);
            if (rc)
                return rc;
            rc = cfg_number(val, lo[k], hi[k], &v, y->err);
            if (rc) {
                cfg_err_prefix(y->err, "%s:%zu:%zu: %s: ", y->src, vm.line + 1, vm.column + 1, key);
                return rc;
            }
            if (idx == CFG_STORE_POOL)
                st->pool_size = (int)v;
            else if (idx == CFG_STORE_TIMEOUT)
                st->timeout_ms = v;
            else
                st->queue_max = (int)v;
        } else {
            cfg_mark(&st->at, vm);
            rc = yaml_scalar(y, key, "a redis://, postgresql:// or http:// URL", val, sizeof val);
            if (rc)
                return rc;
            rc = cfg_parse_url(val, &st->url, y->err);
            if (!rc && st->url.kind == CFG_URL_ETCD) {
                cfg_errf(y->err,
                         "bad URL '%s': a store must be redis://, postgresql://, postgres:// or "
                         "http://",
                         cfg_show_url(shown, val));
                rc = FG_ERR_CONFIG;
            }
            if (rc) {
                cfg_err_prefix(y->err, "%s:%zu:%zu: %s: ", y->src, vm.line + 1, vm.column + 1, key);
                return rc;
            }
        }
    }
    for (int k = CFG_STORE_NAME; k <= CFG_STORE_URL; k++)
        if (!m.line[k])
            return yaml_fail(y, start, "%s: missing '%s'", path, cfg_store_keys[k]);
    return FG_OK;
}

/* One { store, keys, lock } entry of protect; the current event is its start. */
static int yaml_rule(struct cfg_yaml *y, int i)
{
    char path[48], key[64], val[CFG_MAX_STR], shown[CFG_SHOW_BUF], got[CFG_SHOW_BUF + 8];
    yaml_mark_t start = y->ev.start_mark, vm, lock_mark;
    struct cfg_protect *r;
    struct cfg_map m;
    const char *why;
    int idx, rc;

    memset(&lock_mark, 0, sizeof lock_mark);
    if (snprintf(path, sizeof path, "protect[%d]", i) < 0)
        path[0] = '\0';
    if (i >= CFG_MAX_PROTECT)
        return yaml_fail(y, start, "%s: too many protect rules (at most %d)", path,
                         CFG_MAX_PROTECT);
    if (y->ev.type != YAML_MAPPING_START_EVENT)
        return yaml_fail(y, start, "%s: expected a mapping { store, keys, lock }, got %s", path,
                         yaml_got(&y->ev, got, sizeof got));
    r = &y->cfg->protect[i];
    memset(r, 0, sizeof *r);
    memset(&m, 0, sizeof m);
    m.path = path;
    m.keys = cfg_rule_keys;
    for (;;) {
        rc = yaml_map_key(y, &m, &idx);
        if (rc)
            return rc;
        if (idx < 0)
            break;
        if (snprintf(key, sizeof key, "%s.%s", path, cfg_rule_keys[idx]) < 0)
            key[0] = '\0';
        rc = yaml_next(y);
        if (rc)
            return rc;
        vm = y->ev.start_mark;
        switch (idx) {
        case CFG_RULE_STORE:
            rc = yaml_scalar(y, key, "a store name", val, sizeof val);
            if (rc)
                return rc;
            why = cfg_check_name(val);
            if (why)
                return yaml_fail(y, vm, "%s: bad store name '%s': %s", key,
                                 cfg_show_str(shown, val), why);
            cfg_copy(r->store, sizeof r->store, val, strlen(val));
            cfg_mark(&r->at, vm);
            break;
        case CFG_RULE_KEYS:
            rc = yaml_scalar(y, key, "a key glob such as 'wallet:*'", r->keys, sizeof r->keys);
            if (rc)
                return rc;
            if (!r->keys[0])
                return yaml_fail(y, vm,
                                 "%s: empty key pattern (expected a glob such as 'wallet:*')", key);
            why = cfg_check_glob(r->keys);
            if (why)
                return yaml_fail(y, vm, "%s: bad key pattern '%s': %s", key,
                                 cfg_show_str(shown, r->keys), why);
            break;
        default:
            rc = yaml_scalar(y, key, "a lock name such as 'wallet:$1'", r->lock, sizeof r->lock);
            if (rc)
                return rc;
            if (!r->lock[0])
                return yaml_fail(y, vm, "%s: empty lock name (expected a name such as 'wallet:$1')",
                                 key);
            lock_mark = vm;
            break;
        }
    }
    for (int k = CFG_RULE_STORE; k <= CFG_RULE_LOCK; k++)
        if (!m.line[k])
            return yaml_fail(y, start, "%s: missing '%s'", path, cfg_rule_keys[k]);
    rc = cfg_check_rule(r, y->err);
    if (rc)
        cfg_err_prefix(y->err, "%s:%zu:%zu: %s.lock: ", y->src, lock_mark.line + 1,
                       lock_mark.column + 1, path);
    return rc;
}

/* stores: and protect: lists. A list in the file replaces what was there before. */
static int yaml_list(struct cfg_yaml *y, const char *name, const char *what,
                     int (*item)(struct cfg_yaml *, int), int *count)
{
    char got[CFG_SHOW_BUF + 8];
    int rc;

    *count = 0;
    if (yaml_is_null(&y->ev))
        return FG_OK;
    if (y->ev.type != YAML_SEQUENCE_START_EVENT)
        return yaml_fail(y, y->ev.start_mark, "%s: expected a list of %s, got %s", name, what,
                         yaml_got(&y->ev, got, sizeof got));
    for (;;) {
        rc = yaml_next(y);
        if (rc)
            return rc;
        if (y->ev.type == YAML_SEQUENCE_END_EVENT)
            return FG_OK;
        rc = item(y, *count);
        if (rc)
            return rc;
        (*count)++;
    }
}

static int yaml_top(struct cfg_yaml *y)
{
    struct cfg_map m;
    int idx, rc;

    memset(&m, 0, sizeof m);
    m.path = "";
    m.keys = cfg_top_keys;
    for (;;) {
        const char *k;

        rc = yaml_map_key(y, &m, &idx);
        if (rc || idx < 0)
            return rc;
        k = cfg_top_keys[idx];
        rc = yaml_next(y);
        if (rc)
            return rc;
        if (strcmp(k, "listen") == 0)
            rc = yaml_section(y, k, cfg_listen_keys);
        else if (strcmp(k, "backend") == 0)
            rc = yaml_section(y, k, cfg_backend_keys);
        else if (strcmp(k, "limits") == 0)
            rc = yaml_section(y, k, cfg_limits_keys);
        else if (strcmp(k, "log") == 0)
            rc = yaml_section(y, k, cfg_log_keys);
        else if (strcmp(k, "app_health") == 0)
            rc = yaml_section(y, k, cfg_app_health_keys);
        else if (strcmp(k, "stores") == 0)
            rc = yaml_list(y, k, "{ name, url } mappings", yaml_store, &y->cfg->nstores);
        else if (strcmp(k, "protect") == 0)
            rc = yaml_list(y, k, "{ store, keys, lock } mappings", yaml_rule, &y->cfg->nprotect);
        else
            rc = yaml_setting(y, cfg_find_key(k));
        if (rc)
            return rc;
    }
}

static int yaml_stream(struct cfg_yaml *y)
{
    char got[CFG_SHOW_BUF + 8], list[256];
    int rc = yaml_next(y); /* stream start */

    if (rc)
        return rc;
    rc = yaml_next(y);
    if (rc || y->ev.type == YAML_STREAM_END_EVENT)
        return rc;
    rc = yaml_next(y); /* the root node, after the document start */
    if (rc)
        return rc;
    if (y->ev.type == YAML_MAPPING_START_EVENT) {
        rc = yaml_top(y);
    } else if (!yaml_is_null(&y->ev)) {
        cfg_join(list, sizeof list, cfg_top_keys);
        return yaml_fail(y, y->ev.start_mark, "the top level must be a mapping of %s, got %s", list,
                         yaml_got(&y->ev, got, sizeof got));
    }
    if (rc)
        return rc;
    rc = yaml_next(y); /* document end */
    if (rc)
        return rc;
    rc = yaml_next(y);
    if (rc)
        return rc;
    if (y->ev.type != YAML_STREAM_END_EVENT)
        return yaml_fail(y, y->ev.start_mark,
                         "a second YAML document; a config file holds exactly one");
    return FG_OK;
}

/* Applies a YAML document to cfg; see config.h. Settings the document names replace those in cfg,
 * and a stores: or protect: list replaces the whole list. On error cfg may be partly updated and
 * is meant to be discarded. Returns FG_OK or FG_ERR_CONFIG with the reason in err. */
int cfg_parse_yaml(struct cfg *cfg, const char *text, size_t len, const char *source,
                   struct cfg_error *err)
{
    struct cfg_yaml y;
    int rc;

    memset(&y, 0, sizeof y);
    y.src = source ? source : "<config>";
    y.text = text ? text : "";
    y.len = text ? len : 0;
    y.cfg = cfg;
    y.err = err;
    if (y.len > CFG_YAML_MAX_BYTES) {
        cfg_errf(err, "%s:1:1: the file is larger than %u bytes; is it the right file?", y.src,
                 CFG_YAML_MAX_BYTES);
        return FG_ERR_CONFIG;
    }
    cfg_copy(cfg->source, sizeof cfg->source, y.src, strnlen(y.src, sizeof cfg->source));
    if (!yaml_parser_initialize(&y.parser)) {
        cfg_errf(err, "%s: out of memory while parsing YAML", y.src);
        return FG_ERR_CONFIG;
    }
    yaml_parser_set_input_string(&y.parser, (const unsigned char *)y.text, y.len);
    rc = yaml_stream(&y);
    if (y.have_ev)
        yaml_event_delete(&y.ev);
    yaml_parser_delete(&y.parser);
    return rc;
}

/* ---- environment and flags ---------------------------------------------------------------- */

/* 1 for the variables the fencegate family defines for the sidecar's clients, not for the
 * sidecar: fencectl's FENCEGATE_HTTP and the addresses the injector gives application containers.
 * A shell or compose file that sets them for both must not stop the sidecar. */
static int cfg_client_var(const char *name, size_t n)
{
    static const char *const names[] = {"FENCEGATE_HTTP", "FENCEGATE_HTTP_ADDR",
                                        "FENCEGATE_RESP_ADDR"};

    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strlen(names[i]) == n && memcmp(names[i], name, n) == 0)
            return 1;
    return 0;
}

/* The edit distance between a[0..n) and b[0..m), both at most CFG_ENV_MAXN bytes. */
#define CFG_ENV_MAXN 64
static size_t cfg_edits(const char *a, size_t n, const char *b, size_t m)
{
    size_t row[CFG_ENV_MAXN + 1];

    for (size_t j = 0; j <= m; j++)
        row[j] = j;
    for (size_t i = 1; i <= n; i++) {
        size_t diag = row[0];

        row[0] = i;
        for (size_t j = 1; j <= m; j++) {
            size_t up = row[j], sub = diag + (a[i - 1] != b[j - 1]);
            size_t v = up + 1 < row[j - 1] + 1 ? up + 1 : row[j - 1] + 1;

            row[j] = sub < v ? sub : v;
            diag = up;
        }
    }
    return row[m];
}

/* The variable the sidecar reads that is nearest to name (at most 3 edits: a typo), or NULL. A
 * setting is also known by the names a user would make from its YAML key or its flag
 * (FENCEGATE_BACKEND_URL from backend.url, FENCEGATE_RESP from --resp), so those find its
 * variable too. */
static const char *cfg_closest_env(const char *name, size_t n)
{
    size_t best = 4;
    const char *found = NULL;

    if (n > CFG_ENV_MAXN)
        return NULL;
    for (size_t k = 0; k < CFG_NSETTINGS; k++) {
        const char *alias[] = {cfg_settings[k].env, cfg_settings[k].key, cfg_settings[k].flag};

        for (size_t a = 0; a < sizeof alias / sizeof alias[0]; a++) {
            char t[CFG_ENV_MAXN + 1];
            size_t m = 0, d;

            if (!alias[a])
                continue;
            if (a > 0) { /* "backend.session_ttl_ms" -> "FENCEGATE_BACKEND_SESSION_TTL_MS" */
                int w = snprintf(t, sizeof t, "FENCEGATE_%s", alias[a]);

                if (w < 0 || (size_t)w >= sizeof t)
                    continue;
                for (m = 0; t[m]; m++) {
                    if (t[m] == '.' || t[m] == '-')
                        t[m] = '_';
                    else if (t[m] >= 'a' && t[m] <= 'z')
                        t[m] = (char)(t[m] - 'a' + 'A');
                }
            } else {
                m = strnlen(alias[a], sizeof t);
                if (m >= sizeof t)
                    continue;
                memcpy(t, alias[a], m);
            }
            d = cfg_edits(name, n, t, m);
            if (d < best) {
                best = d;
                found = cfg_settings[k].env;
            }
        }
    }
    return found;
}

/* Whether name[0..n) (with value val) is a variable Kubernetes sets for a Service of the pod's
 * namespace (service links, on by default): a Service "fencegate-injector" gives every container
 * FENCEGATE_INJECTOR_SERVICE_HOST, _SERVICE_PORT, _SERVICE_PORT_<PORT NAME>, _PORT (a
 * tcp://, udp:// or sctp:// URL), _PORT_<N>_<PROTO> and that with _PROTO, _PORT or _ADDR. The
 * chart's own webhook Service is such a one, so these cannot be refused as typos. */
static int cfg_service_link(const char *name, size_t n, const char *val)
{
    static const char *const protos[] = {"_TCP", "_UDP", "_SCTP"};
    static const char *const tails[] = {"", "_PROTO", "_PORT", "_ADDR"};
    const char *end = name + n;

    for (const char *p = name; p < end; p++) {
        if ((size_t)(end - p) == 13 && memcmp(p, "_SERVICE_HOST", 13) == 0)
            return 1;
        if ((size_t)(end - p) >= 13 && memcmp(p, "_SERVICE_PORT", 13) == 0 &&
            ((size_t)(end - p) == 13 || (p[13] == '_' && (size_t)(end - p) > 14)))
            return 1;
        if ((size_t)(end - p) == 5 && memcmp(p, "_PORT", 5) == 0)
            return strncmp(val, "tcp://", 6) == 0 || strncmp(val, "udp://", 6) == 0 ||
                   strncmp(val, "sctp://", 7) == 0;
        if ((size_t)(end - p) > 6 && memcmp(p, "_PORT_", 6) == 0) {
            const char *q = p + 6;

            while (q < end && cfg_is_digit(*q))
                q++;
            if (q == p + 6)
                continue;
            for (size_t i = 0; i < sizeof protos / sizeof protos[0]; i++) {
                size_t pl = strlen(protos[i]);

                if ((size_t)(end - q) < pl || memcmp(q, protos[i], pl) != 0)
                    continue;
                for (size_t j = 0; j < sizeof tails / sizeof tails[0]; j++)
                    if ((size_t)(end - q - pl) == strlen(tails[j]) &&
                        memcmp(q + pl, tails[j], strlen(tails[j])) == 0)
                        return 1;
            }
        }
    }
    return 0;
}

/* Applies FENCEGATE_* variables; an empty value counts as unset (templated manifests often
 * render unset values as ""), and Kubernetes' service-link variables and the clients' ones are
 * skipped. Returns FG_OK
 * or FG_ERR_CONFIG with the reason in err. */
int cfg_apply_env(struct cfg *cfg, char *const envp[], struct cfg_error *err)
{
    static const size_t plen = sizeof "FENCEGATE_" - 1;

    if (!envp)
        return FG_OK;
    for (size_t i = 0; envp[i]; i++) {
        const char *e = envp[i], *eq = strchr(e, '=');
        const struct cfg_setting *s = NULL;
        size_t n;
        int rc;

        if (strncmp(e, "FENCEGATE_", plen) != 0 || !eq)
            continue;
        n = (size_t)(eq - e);
        for (size_t j = 0; j < CFG_NSETTINGS; j++)
            if (strlen(cfg_settings[j].env) == n && memcmp(cfg_settings[j].env, e, n) == 0)
                s = &cfg_settings[j];
        if (!s && cfg_service_link(e, n, eq + 1))
            continue;
        if (!s && cfg_client_var(e, n))
            continue;
        if (!s) {
            char shown[CFG_SHOW_BUF];
            const char *near = cfg_closest_env(e, n);

            cfg_errf(err,
                     "environment %s: unknown variable (%s%s%s'fencegate --help' lists the ones "
                     "it reads)",
                     cfg_show(shown, e, n), near ? "did you mean " : "", near ? near : "",
                     near ? "? " : "");
            return FG_ERR_CONFIG;
        }
        if (s->kind == CFG_K_PATH || eq[1] == '\0')
            continue;
        rc = cfg_set(cfg, s, eq + 1, err);
        if (rc) {
            cfg_err_prefix(err, "environment %s: ", s->env);
            return rc;
        }
        cfg->origin[s - cfg_settings].from = CFG_FROM_ENV;
    }
    return FG_OK;
}

static const struct cfg_setting *cfg_find_flag(const char *name, size_t n)
{
    for (size_t i = 0; i < CFG_NSETTINGS; i++)
        if (strlen(cfg_settings[i].flag) == n && memcmp(cfg_settings[i].flag, name, n) == 0)
            return &cfg_settings[i];
    return NULL;
}

/* A flag's value comes after '=' or as the next argument, unless that looks like another flag. */
static const char *cfg_flag_value(int argc, char *const argv[], int *i, const char *eq)
{
    if (eq)
        return eq + 1;
    if (*i + 1 < argc && argv[*i + 1] && strncmp(argv[*i + 1], "--", 2) != 0)
        return argv[++*i];
    return NULL;
}

/* Applies flags in order, so a later flag wins over an earlier one. Returns FG_OK (with *action
 * set to CFG_HELP or CFG_VERSION when asked, the rest of argv then unread) or FG_ERR_CONFIG with
 * the reason in err. */
int cfg_apply_args(struct cfg *cfg, int argc, char *const argv[], enum cfg_action *action,
                   struct cfg_error *err)
{
    char shown[CFG_SHOW_BUF];

    *action = CFG_RUN;
    for (int i = 1; i < argc && argv[i]; i++) {
        const char *a = argv[i], *name, *eq, *val;
        const struct cfg_setting *s;
        size_t n;
        int rc;

        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            *action = CFG_HELP;
            return FG_OK;
        }
        if (strcmp(a, "-V") == 0 || strcmp(a, "--version") == 0) {
            *action = CFG_VERSION;
            return FG_OK;
        }
        if (strcmp(a, "--") == 0) {
            if (i + 1 < argc && argv[i + 1]) {
                cfg_errf(err, "unexpected argument '%s' (fencegate takes only flags; see --help)",
                         cfg_show_str(shown, argv[i + 1]));
                return FG_ERR_CONFIG;
            }
            return FG_OK;
        }
        if (strncmp(a, "--", 2) != 0) {
            if (a[0] == '-' && a[1] != '\0')
                cfg_errf(err, "unknown flag '%s' (see --help)", cfg_show_str(shown, a));
            else
                cfg_errf(err, "unexpected argument '%s' (fencegate takes only flags; see --help)",
                         cfg_show_str(shown, a));
            return FG_ERR_CONFIG;
        }
        name = a + 2;
        eq = strchr(name, '=');
        n = eq ? (size_t)(eq - name) : strlen(name);
        if ((n == 4 && memcmp(name, "help", 4) == 0) ||
            (n == 7 && memcmp(name, "version", 7) == 0)) {
            cfg_errf(err, "flag --%.*s takes no value", (int)n, name);
            return FG_ERR_CONFIG;
        }
        s = cfg_find_flag(name, n);
        if (!s) {
            cfg_errf(err, "unknown flag '--%s' (see --help)", cfg_show(shown, name, n));
            return FG_ERR_CONFIG;
        }
        val = cfg_flag_value(argc, argv, &i, eq);
        if (!val || (s->kind == CFG_K_PATH && val[0] == '\0')) {
            cfg_errf(err, "flag --%s needs a value", s->flag);
            return FG_ERR_CONFIG;
        }
        rc = cfg_set(cfg, s, val, err);
        if (rc) {
            cfg_err_prefix(err, "flag --%s: ", s->flag);
            return rc;
        }
        cfg->origin[s - cfg_settings].from = CFG_FROM_FLAG;
    }
    return FG_OK;
}

/* Returns the last --config value in argv (the same one cfg_apply_args() would see), else a
 * non-empty FENCEGATE_CONFIG, else NULL. The pointer is into argv or envp. */
const char *cfg_config_path(int argc, char *const argv[], char *const envp[])
{
    const char *path = NULL;

    for (int i = 1; argv && i < argc && argv[i]; i++) {
        const char *a = argv[i], *eq, *val;
        const struct cfg_setting *s;

        if (strcmp(a, "--") == 0)
            break;
        if (strncmp(a, "--", 2) != 0)
            continue;
        eq = strchr(a + 2, '=');
        s = cfg_find_flag(a + 2, eq ? (size_t)(eq - a - 2) : strlen(a + 2));
        if (!s)
            continue;
        val = cfg_flag_value(argc, argv, &i, eq);
        if (s->kind == CFG_K_PATH && val && val[0])
            path = val;
    }
    if (path)
        return path;
    for (size_t i = 0; envp && envp[i]; i++)
        if (strncmp(envp[i], "FENCEGATE_CONFIG=", 17) == 0 && envp[i][17])
            return envp[i] + 17;
    return NULL;
}

/* ---- defaults, cross-field checks, usage ---------------------------------------------------- */

static void cfg_local_redis(struct cfg_url *u)
{
    static const char raw[] = "redis://127.0.0.1:6379";

    memset(u, 0, sizeof *u);
    u->kind = CFG_URL_REDIS;
    cfg_copy(u->raw, sizeof u->raw, raw, sizeof raw - 1);
    cfg_copy(u->hosts[0].host, sizeof u->hosts[0].host, "127.0.0.1", 9);
    u->hosts[0].port = 6379;
    u->nhosts = 1;
}

/* Fills cfg with the embedded defaults. The upstream is left unset (kind 0) so that cfg_finish()
 * can tell "not given" from "given" and pick the first redis store. */
void cfg_defaults(struct cfg *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg_defaults_zeroed(cfg);
}

void cfg_defaults_zeroed(struct cfg *cfg)
{
    static const char prefix[] = "/fencegate/locks/";

    cfg_copy(cfg->listen_resp.host, sizeof cfg->listen_resp.host, "127.0.0.1", 9);
    cfg->listen_resp.port = 6380;
    cfg_copy(cfg->listen_http.host, sizeof cfg->listen_http.host, "127.0.0.1", 9);
    cfg->listen_http.port = 8380;
    cfg_copy(cfg->backend_prefix, sizeof cfg->backend_prefix, prefix, sizeof prefix - 1);
    cfg->session_ttl_ms = 10000;
    cfg->max_clients = 10000;
    cfg->max_request_bytes = 512LL * 1024 * 1024 + 64 * 1024;
    cfg->max_pending_bytes = 1024 * 1024;
    cfg->upstream_multiplex = 1;
    cfg->fenced_transactions = 1;
    cfg->max_args = 8LL * 1024 * 1024;
    cfg->shutdown_grace_ms = 10000;
    cfg->log_level = CFG_LOG_INFO;
    cfg->app_health_interval_ms = 1000;
    cfg->app_health_timeout_ms = 1000;
    cfg->app_health_failures = 3;
}

/* Two redis URLs name the same store when they reach the same database as the same user. */
static int cfg_same_redis(const struct cfg_url *a, const struct cfg_url *b)
{
    return a->kind == CFG_URL_REDIS && b->kind == CFG_URL_REDIS && a->nhosts == 1 &&
           b->nhosts == 1 && strcasecmp(a->hosts[0].host, b->hosts[0].host) == 0 &&
           a->hosts[0].port == b->hosts[0].port && a->db == b->db && strcmp(a->user, b->user) == 0;
}

static int cfg_store_index(const struct cfg *cfg, const char *name)
{
    for (int i = 0; i < cfg->nstores; i++)
        if (strcmp(cfg->stores[i].name, name) == 0)
            return i;
    return -1;
}

/* Makes sure the upstream is a store, so fenced writes through the RESP endpoint have an HWM. */
static int cfg_finish_upstream(struct cfg *cfg, struct cfg_error *err)
{
    static const char *const names[] = {"redis", "redis-upstream"};
    char shown[CFG_SHOW_BUF];
    struct cfg_store *st;
    const char *name = NULL;

    if (cfg->upstream.kind == 0) {
        for (int i = 0; i < cfg->nstores && cfg->upstream.kind == 0; i++)
            if (cfg->stores[i].url.kind == CFG_URL_REDIS)
                cfg->upstream = cfg->stores[i].url;
        if (cfg->upstream.kind == 0)
            cfg_local_redis(&cfg->upstream);
    }
    if (cfg->upstream.kind != CFG_URL_REDIS) {
        cfg_errf(err, "upstream: bad URL '%s': the upstream must be a redis:// URL",
                 cfg_show_url(shown, cfg->upstream.raw));
        return FG_ERR_CONFIG;
    }
    for (int i = 0; i < cfg->nstores; i++)
        if (cfg_same_redis(&cfg->stores[i].url, &cfg->upstream))
            return FG_OK;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !name; i++)
        if (cfg_store_index(cfg, names[i]) < 0)
            name = names[i];
    if (!name) {
        cfg_errf(err,
                 "stores: the upstream '%s' needs a store entry, and the names 'redis' and "
                 "'redis-upstream' are taken; add { name: ..., url: ... } for it",
                 cfg_show_url(shown, cfg->upstream.raw));
        return FG_ERR_CONFIG;
    }
    if (cfg->nstores >= CFG_MAX_STORES) {
        cfg_errf(err, "stores: no room to add the upstream as a store (at most %d stores)",
                 CFG_MAX_STORES);
        return FG_ERR_CONFIG;
    }
    st = &cfg->stores[cfg->nstores++];
    memset(st, 0, sizeof *st);
    cfg_copy(st->name, sizeof st->name, name, strlen(name));
    st->url = cfg->upstream;
    return FG_OK;
}

/* Puts where a value was set in front of the message in err: "file:line:column: ",
 * "environment NAME: " or "flag --name: " (s names the setting; NULL for a protect rule, which
 * only the file sets); nothing for a default. */
static void cfg_err_at(const struct cfg *cfg, const struct cfg_origin *o,
                       const struct cfg_setting *s, struct cfg_error *err)
{
    if (o->from == CFG_FROM_FILE)
        cfg_err_prefix(err, "%s:%d:%d: ", cfg->source, o->line, o->column);
    else if (o->from == CFG_FROM_ENV && s)
        cfg_err_prefix(err, "environment %s: ", s->env);
    else if (o->from == CFG_FROM_FLAG && s)
        cfg_err_prefix(err, "flag --%s: ", s->flag);
}

/* cfg_err_at() for the setting with YAML key `key`. Returns FG_ERR_CONFIG. */
static int cfg_err_key(const struct cfg *cfg, const char *key, struct cfg_error *err)
{
    const struct cfg_setting *s = cfg_find_key(key);

    if (s)
        cfg_err_at(cfg, &cfg->origin[s - cfg_settings], s, err);
    return FG_ERR_CONFIG;
}

/* Whether the setting with YAML key `key` was given by any source. */
static int cfg_given(const struct cfg *cfg, const char *key)
{
    const struct cfg_setting *s = cfg_find_key(key);

    return s && cfg->origin[s - cfg_settings].from != CFG_FROM_DEFAULT;
}

const char *cfg_where(const struct cfg *cfg, const char *key, char *out, size_t cap)
{
    const struct cfg_setting *s = cfg_find_key(key);
    struct cfg_error e;

    e.msg[0] = '\0';
    if (s)
        cfg_err_at(cfg, &cfg->origin[s - cfg_settings], s, &e);
    cfg_copy(out, cap, e.msg, strlen(e.msg));
    return out;
}

void cfg_store_url_error(const struct cfg *cfg, int i, const char *why, struct cfg_error *err)
{
    char shown[CFG_SHOW_BUF], masked[CFG_MAX_STR + 8];
    const char *raw = cfg->stores[i].url.raw;
    size_t n = strcspn(why, "\n");

    if (strcmp(cfg_url_masked(masked, sizeof masked, raw), raw) != 0 && strchr(why, '"'))
        n = (size_t)(strchr(why, '"') - why);
    while (n > 0 && (why[n - 1] == ' ' || why[n - 1] == ':'))
        n--;
    cfg_errf(err, "stores[%d].url: bad URL '%s': %.*s", i, cfg_show_url(shown, raw),
             n > 300 ? 300 : (int)n, why);
    cfg_err_at(cfg, &cfg->stores[i].at, NULL, err);
}

int cfg_is_upstream(const struct cfg *cfg, const struct cfg_url *url)
{
    const struct cfg_url *u = &cfg->upstream;

    return url->kind == CFG_URL_REDIS && u->kind == CFG_URL_REDIS && url->db == u->db &&
           url->hosts[0].port == u->hosts[0].port &&
           strcasecmp(url->hosts[0].host, u->hosts[0].host) == 0;
}

/* Says in out where the upstream came from: "flag --upstream", "upstream, FILE:L:C", "the first
 * redis:// store, 'NAME'" or "the default". */
static const char *cfg_upstream_from(const struct cfg *cfg, char *out, size_t cap)
{
    const struct cfg_setting *s = cfg_find_key("upstream");
    const struct cfg_origin *o = &cfg->origin[s - cfg_settings];
    char shown[CFG_SHOW_BUF];
    int n = -1;

    if (o->from == CFG_FROM_FLAG)
        n = snprintf(out, cap, "flag --%s", s->flag);
    else if (o->from == CFG_FROM_ENV)
        n = snprintf(out, cap, "environment %s", s->env);
    else if (o->from == CFG_FROM_FILE)
        n = snprintf(out, cap, "upstream, %s:%d:%d", cfg_show_str(shown, cfg->source), o->line,
                     o->column);
    for (int i = 0; n < 0 && i < cfg->nstores; i++)
        if (cfg->stores[i].url.kind == CFG_URL_REDIS)
            n = snprintf(out, cap, "the first redis:// store, '%s'",
                         cfg_show_str(shown, cfg->stores[i].name));
    if (n < 0)
        snprintf(out, cap, "the default");
    return out;
}

/* Cross-field checks once every source was applied; see config.h. Returns FG_OK or FG_ERR_CONFIG
 * with the reason in err. */
int cfg_finish(struct cfg *cfg, struct cfg_error *err)
{
    char shown[CFG_SHOW_BUF], list[600];
    int rc;

    if (cfg->backend.kind == 0) { /* not given: the locks live in the upstream Redis */
        if (cfg->upstream.kind == 0 && cfg_finish_upstream(cfg, err) != FG_OK)
            return FG_ERR_CONFIG;
        cfg->backend = cfg->upstream;
    }
    if (cfg->backend.kind != CFG_URL_REDIS && cfg->backend.kind != CFG_URL_ETCD) {
        cfg_errf(err,
                 "backend.url: bad URL '%s': the lock backend must be redis://, etcd:// or "
                 "etcds://",
                 cfg_show_url(shown, cfg->backend.raw));
        return FG_ERR_CONFIG;
    }
    if (!cfg->backend.tls && (cfg->backend_tls_ca[0] || cfg->backend_tls_cert[0] ||
                              cfg->backend_tls_key[0] || cfg->backend_tls_server_name[0])) {
        const char *key = cfg->backend_tls_ca[0]     ? "backend.tls_ca_file"
                          : cfg->backend_tls_cert[0] ? "backend.tls_cert_file"
                          : cfg->backend_tls_key[0]  ? "backend.tls_key_file"
                                                     : "backend.tls_server_name";

        cfg_errf(err, "%s: TLS settings need an etcds:// backend URL, not '%s'", key,
                 cfg_show_url(shown, cfg->backend.raw));
        return cfg_err_key(cfg, key, err);
    }
    if (cfg->backend.kind == CFG_URL_ETCD && cfg->backend.user[0] && !cfg->backend.password[0] &&
        !cfg->backend_password_file[0]) {
        cfg_errf(err,
                 "backend.url: etcd user '%s' has no password: give user:password@ or "
                 "backend.password_file",
                 cfg_show_str(shown, cfg->backend.user));
        return cfg_err_key(cfg, "backend.url", err);
    }
    if (cfg->backend.kind == CFG_URL_ETCD && !cfg->backend.user[0] &&
        cfg->backend_password_file[0]) {
        cfg_errf(err, "backend.password_file: an etcd password needs a user in the URL "
                      "(etcd://USER@host:port)");
        return cfg_err_key(cfg, "backend.password_file", err);
    }
    if (!cfg->backend_tls_cert[0] != !cfg->backend_tls_key[0]) {
        cfg_errf(err, "backend.tls_cert_file and backend.tls_key_file: a client certificate "
                      "needs both");
        return cfg_err_key(
            cfg, cfg->backend_tls_cert[0] ? "backend.tls_cert_file" : "backend.tls_key_file", err);
    }
    if (cfg->backend_prefix[0] == '\0') {
        cfg_errf(err, "backend.prefix: empty prefix (expected e.g. /fencegate/locks/)");
        return FG_ERR_CONFIG;
    }
    if (cfg->backend.kind == CFG_URL_ETCD && cfg->backend_prefix[0] != '/') {
        cfg_errf(err,
                 "backend.prefix: bad prefix '%s': an etcd backend needs a prefix that starts "
                 "with '/', e.g. /fencegate/locks/",
                 cfg_show_str(shown, cfg->backend_prefix));
        return cfg_err_key(cfg, "backend.prefix", err);
    }
    if (cfg_listeners_overlap(&cfg->listen_resp, &cfg->listen_http)) {
        const char *key = cfg_given(cfg, "listen.http") ? "listen.http" : "listen.resp";
        char shown2[CFG_SHOW_BUF];

        if (strcasecmp(cfg->listen_resp.host, cfg->listen_http.host) == 0)
            cfg_errf(err, "%s: resp and http are both '%s:%d'; give them different ports", key,
                     cfg_show_str(shown, cfg->listen_resp.host), cfg->listen_resp.port);
        else
            cfg_errf(err,
                     "%s: resp '%s' and http '%s' share port %d, and an unspecified address "
                     "(0.0.0.0, ::) binds it on every address; give them different ports",
                     key, cfg_show_str(shown, cfg->listen_resp.host),
                     cfg_show_str(shown2, cfg->listen_http.host), cfg->listen_resp.port);
        return cfg_err_key(cfg, key, err);
    }
    for (int i = 0; i < cfg->nstores; i++) {
        const char *why = cfg_check_name(cfg->stores[i].name);

        if (why) {
            cfg_errf(err, "stores[%d].name: bad store name '%s': %s", i,
                     cfg_show_str(shown, cfg->stores[i].name), why);
            return FG_ERR_CONFIG;
        }
        if (cfg_store_index(cfg, cfg->stores[i].name) != i) {
            cfg_errf(err, "stores[%d].name: duplicate store name '%s'", i,
                     cfg_show_str(shown, cfg->stores[i].name));
            return FG_ERR_CONFIG;
        }
    }
    rc = cfg_finish_upstream(cfg, err);
    if (rc)
        return rc;
    for (int i = 0; i < cfg->nprotect; i++) {
        const struct cfg_protect *r = &cfg->protect[i];

        if (cfg_store_index(cfg, r->store) < 0) {
            size_t o = 0;

            list[0] = '\0';
            for (int j = 0; j < cfg->nstores; j++) {
                int w =
                    snprintf(list + o, sizeof list - o, "%s%s", j ? ", " : "", cfg->stores[j].name);

                if (w < 0 || (size_t)w >= sizeof list - o)
                    break;
                o += (size_t)w;
            }
            cfg_errf(err, "protect[%d].store: unknown store '%s' (known stores: %s)", i,
                     cfg_show_str(shown, r->store), list);
            cfg_err_at(cfg, &r->at, NULL, err);
            return FG_ERR_CONFIG;
        }
        if (cfg->stores[cfg_store_index(cfg, r->store)].url.kind == CFG_URL_POSTGRES) {
            cfg_errf(err,
                     "protect[%d].store: '%s' is a PostgreSQL store; SQL requests name their lock "
                     "in the body, so protect rules apply to Redis and HTTP stores only",
                     i, cfg_show_str(shown, r->store));
            cfg_err_at(cfg, &r->at, NULL, err);
            return FG_ERR_CONFIG;
        }
        /* The Redis endpoint is the only way to a Redis store, and it reaches the upstream only:
         * a rule on another Redis store would leave its keys unguarded without a word. */
        if (cfg->stores[cfg_store_index(cfg, r->store)].url.kind == CFG_URL_REDIS &&
            !cfg_is_upstream(cfg, &cfg->stores[cfg_store_index(cfg, r->store)].url)) {
            char from[300], shown2[CFG_SHOW_BUF], shown3[CFG_SHOW_BUF];

            cfg_errf(err,
                     "protect[%d].store: '%s' (%s) is not the Redis endpoint's upstream %s (%s): "
                     "a rule on a Redis store guards the writes sent through the Redis endpoint, "
                     "which all go to the upstream, so this one would guard nothing; give the "
                     "store the upstream's URL (host names are compared as written, not looked "
                     "up), or name the upstream's store",
                     i, cfg_show_str(shown, r->store),
                     cfg_show_url(shown2, cfg->stores[cfg_store_index(cfg, r->store)].url.raw),
                     cfg_show_url(shown3, cfg->upstream.raw),
                     cfg_upstream_from(cfg, from, sizeof from));
            cfg_err_at(cfg, &r->at, NULL, err);
            return FG_ERR_CONFIG;
        }
        rc = cfg_check_rule(r, err);
        if (rc) {
            cfg_err_prefix(err, "protect[%d].lock: ", i);
            return rc;
        }
    }
    return FG_OK;
}

/* The --help text: a static string, so the caller never frees it. */
const char *cfg_usage(void)
{
    return "usage: fencegate [--config FILE] [--resp HOST:PORT] [--http HOST:PORT]\n"
           "                 [--upstream redis://HOST:PORT] [--backend redis://HOST:PORT | "
           "etcd[s]://[USER[:PASSWORD]@]HOST:PORT[,HOST:PORT...]]\n"
           "       fencegate --version\n"
           "       fencegate injector --listen HOST:PORT --cert FILE --key FILE   (admission "
           "webhook; --help for more)\n"
           "\n"
           "Settings come from the config file, then FENCEGATE_* environment variables, then "
           "flags;\n"
           "each source overrides the one before. Flags take '--flag VALUE' or '--flag=VALUE'.\n"
           "An empty environment variable counts as unset; variables Kubernetes sets for a\n"
           "Service (FENCEGATE_*_SERVICE_HOST, FENCEGATE_*_PORT_443_TCP, ...) and those for\n"
           "clients (FENCEGATE_HTTP, FENCEGATE_RESP_ADDR, FENCEGATE_HTTP_ADDR) are ignored.\n"
           "\n"
           "  --config FILE             FENCEGATE_CONFIG             YAML config file (default: "
           "none)\n"
           "  --resp HOST:PORT          FENCEGATE_LISTEN_RESP        Redis endpoint (default "
           "127.0.0.1:6380)\n"
           "  --http HOST:PORT          FENCEGATE_LISTEN_HTTP        HTTP endpoint (default "
           "127.0.0.1:8380)\n"
           "  --upstream URL            FENCEGATE_UPSTREAM           redis:// behind the Redis "
           "endpoint (default: first redis store, else redis://127.0.0.1:6379)\n"
           "  --backend URL             FENCEGATE_BACKEND            lock backend, redis:// or "
           "etcd[s]://[USER[:PASSWORD]@]H:P[,H:P...] (etcds: TLS; default: the upstream)\n"
           "  --backend-prefix P        FENCEGATE_BACKEND_PREFIX     etcd lock key prefix (default "
           "/fencegate/locks/)\n"
           "  --backend-password-file F FENCEGATE_BACKEND_PASSWORD_FILE   the backend's password, "
           "read from F at start (instead of the URL's; etcd: with etcd://USER@...)\n"
           "  --backend-tls-ca-file F   FENCEGATE_BACKEND_TLS_CA_FILE     etcds:// only: CA "
           "certificates, PEM (default: the system's)\n"
           "  --backend-tls-cert-file F FENCEGATE_BACKEND_TLS_CERT_FILE   etcds:// only: client "
           "certificate, PEM (with the key file)\n"
           "  --backend-tls-key-file F  FENCEGATE_BACKEND_TLS_KEY_FILE    etcds:// only: its "
           "private key, PEM\n"
           "  --backend-tls-server-name N FENCEGATE_BACKEND_TLS_SERVER_NAME etcds:// only: name "
           "the server certificate must carry (default: each endpoint's host)\n"
           "  --session-ttl-ms N        FENCEGATE_SESSION_TTL_MS     session lease, 500..3600000 "
           "(default 10000)\n"
           "  --upstream-multiplex B    FENCEGATE_UPSTREAM_MULTIPLEX clients share one upstream "
           "connection until one needs its own, true or false (default true)\n"
           "  --fenced-transactions B   FENCEGATE_FENCED_TRANSACTIONS pipelined fenced writes "
           "under one lock go as one transaction (Redis 7+), true or false (default true; false: "
           "a script call each)\n"
           "  --max-clients N           FENCEGATE_MAX_CLIENTS        client connections, "
           "1..1000000 (default 10000)\n"
           "  --max-request-bytes N     FENCEGATE_MAX_REQUEST_BYTES  largest request, "
           "1024..4294967296 (default 536936448)\n"
           "  --max-pending-bytes N     FENCEGATE_MAX_PENDING_BYTES  back-pressure watermark, "
           "4096..1073741824 (default 1048576)\n"
           "  --max-args N              FENCEGATE_MAX_ARGS           arguments per command, "
           "1..2147483647 (default 8388608)\n"
           "  --log-level L             FENCEGATE_LOG_LEVEL          error, warn, info or debug "
           "(default info)\n"
           "  --shutdown-grace-ms N     FENCEGATE_SHUTDOWN_GRACE_MS  SIGTERM drain time, "
           "0..600000 (default 10000)\n"
           "  --app-health-url URL      FENCEGATE_APP_HEALTH_URL     the application's http:// "
           "health check: while it fails, locks held over HTTP are released (default: none)\n"
           "  --app-health-interval-ms N FENCEGATE_APP_HEALTH_INTERVAL_MS  time between checks, "
           "100..600000 (default 1000)\n"
           "  --app-health-timeout-ms N FENCEGATE_APP_HEALTH_TIMEOUT_MS   a check answered later "
           "fails, 100..600000 (default 1000)\n"
           "  --app-health-failure-threshold N FENCEGATE_APP_HEALTH_FAILURE_THRESHOLD  failed "
           "checks in a row that count as unhealthy, 1..1000 (default 3)\n"
           "  -h, --help                                             print this help and exit\n"
           "  -V, --version                                          print the version and exit\n"
           "\n"
           "Stores and protect rules are set in the config file only. Every key is shown, "
           "commented,\n"
           "in config/examples/ (minimal.yaml, redis.yaml, etcd.yaml).\n";
}
