/* injector.c — the admission webhook's HTTPS server: flags, TLS, routes, certificate reloads. */
#include "injector.h"

#include <errno.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/bufferevent_ssl.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "config.h"
#include "inject.h"
#include "log.h"

#define INJECTOR_MAX_HEADERS (64 * 1024)
#define INJECTOR_TIMEOUT_S   30
#define INJECTOR_RELOAD_S    10 /* how often the certificate and key files are checked */
#define INJECTOR_ERR_MAX     512
#define INJECTOR_DELAY_MAX   300 /* seconds of --shutdown-delay */

#define INJECTOR_USAGE                                                                             \
    "usage: fencegate injector --listen HOST:PORT --cert FILE --key FILE [--log-level L]\n"        \
    "                          [--shutdown-delay SECONDS]\n"                                       \
    "\n"                                                                                           \
    "Serves the mutating admission webhook over HTTPS: POST /mutate answers an\n"                  \
    "admission.k8s.io/v1 AdmissionReview, adding the fencegate sidecar to Pods annotated\n"        \
    "fencegate.io/inject: \"true\"; GET /healthz answers 200. The certificate (PEM, chain\n"       \
    "allowed) and key are re-read when their files change, and on SIGHUP.\n"                       \
    "\n"                                                                                           \
    "  --listen HOST:PORT   address to serve on, e.g. 0.0.0.0:8443\n"                              \
    "  --cert FILE          TLS certificate chain (PEM)\n"                                         \
    "  --key FILE           TLS private key (PEM)\n"                                               \
    "  --log-level L        error, warn, info or debug (default info)\n"                           \
    "  --shutdown-delay S   after SIGTERM, keep answering for S seconds (0..300, default 0),\n"    \
    "                       each reply with Connection: close, then exit; the API server\n"        \
    "                       and the Service's endpoints need a moment to stop sending here.\n"     \
    "                       A second SIGTERM or SIGINT exits at once.\n"                           \
    "\n"                                                                                           \
    "The injected sidecar (an empty variable counts as unset):\n"                                  \
    "  FENCEGATE_INJECT_IMAGE           image (default fencegate:" FG_VERSION ")\n"                \
    "  FENCEGATE_INJECT_CPU_REQUEST     default 50m\n"                                             \
    "  FENCEGATE_INJECT_MEMORY_REQUEST  default 16Mi\n"                                            \
    "  FENCEGATE_INJECT_CPU_LIMIT       default 500m\n"                                            \
    "  FENCEGATE_INJECT_MEMORY_LIMIT    default 64Mi\n"                                            \
    "  FENCEGATE_INJECT_BACKEND         the sidecar's FENCEGATE_BACKEND (default: unset)\n"        \
    "  FENCEGATE_INJECT_UPSTREAM        the sidecar's FENCEGATE_UPSTREAM (default: unset)\n"       \
    "  FENCEGATE_INJECT_GRACE_MS        the sidecar's FENCEGATE_SHUTDOWN_GRACE_MS (default "       \
    "10000)\n"                                                                                     \
    "  FENCEGATE_INJECT_BACKEND_PREFIX  the sidecar's FENCEGATE_BACKEND_PREFIX (default: unset)\n" \
    "  FENCEGATE_INJECT_SESSION_TTL_MS  the sidecar's FENCEGATE_SESSION_TTL_MS (default: unset)\n" \
    "  FENCEGATE_INJECT_LOG_LEVEL       the sidecar's FENCEGATE_LOG_LEVEL (default: unset)\n"      \
    "A pod annotated fencegate.io/config: NAME gets that ConfigMap's config.yaml instead of\n"     \
    "the backend, upstream, grace, prefix, session TTL and log level above;\n"                     \
    "fencegate.io/secret: NAME mounts that Secret at /etc/fencegate-secret in the sidecar;\n"      \
    "fencegate.io/app-health-url: URL (http://, \"\" for none) gives the sidecar\n"                \
    "FENCEGATE_APP_HEALTH_URL, its locks' health gate.\n"

/* Identity of a file's current contents, to notice a rotated certificate. */
struct injector_stamp {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
};

struct injector {
    struct event_base *base;
    struct evhttp *http;
    SSL_CTX *tls; /* new connections use this one; live ones keep theirs */
    const char *cert_path, *key_path;
    struct injector_stamp cert_stamp, key_stamp;
    struct inject_options opt;
    long delay_s;          /* --shutdown-delay */
    int draining;          /* SIGTERM seen: replies close their connections */
    struct event *ev_exit; /* ends the loop when the delay is over */
};

/* ---- Flags and environment ----------------------------------------------------------------- */

struct injector_flags {
    const char *listen, *cert, *key, *log_level, *shutdown_delay;
};

/* Reads argv[1..argc) into f. Returns 0, 1 for --help, or -1 after printing the error. */
static int injector_parse_flags(int argc, char **argv, struct injector_flags *f)
{
    static const char *const names[] = {"--listen", "--cert", "--key", "--log-level",
                                        "--shutdown-delay"};
    const char **slots[] = {&f->listen, &f->cert, &f->key, &f->log_level, &f->shutdown_delay};

    memset(f, 0, sizeof(*f));
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = NULL;
        int which = -1;
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            return 1;
        for (int k = 0; k < 5; k++) {
            size_t n = strlen(names[k]);
            if (!strcmp(a, names[k]) || (!strncmp(a, names[k], n) && a[n] == '=')) {
                which = k;
                val = a[n] == '=' ? a + n + 1 : NULL;
            }
        }
        if (which < 0) {
            fprintf(stderr,
                    "fencegate injector: unknown flag '%s' (see fencegate injector --help)\n", a);
            return -1;
        }
        if (val == NULL) {
            if (i + 1 >= argc) {
                fprintf(stderr, "fencegate injector: flag %s needs a value\n", names[which]);
                return -1;
            }
            val = argv[++i];
        }
        if (val[0] == '\0') {
            fprintf(stderr, "fencegate injector: flag %s: empty value\n", names[which]);
            return -1;
        }
        *slots[which] = val;
    }
    for (int k = 0; k < 3; k++) {
        if (*slots[k] == NULL) {
            fprintf(stderr,
                    "fencegate injector: flag %s is required (see fencegate injector "
                    "--help)\n",
                    names[k]);
            return -1;
        }
    }
    return 0;
}

/* FENCEGATE_INJECT_<name>, or def when unset or empty. */
static const char *injector_env(const char *name, const char *def)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : def;
}

/* Fills the sidecar options from the environment. Returns 0, or -1 after printing the error. */
static int injector_options(struct inject_options *opt)
{
    const char *grace = injector_env("FENCEGATE_INJECT_GRACE_MS", "10000");
    char err[INJECTOR_ERR_MAX];
    char *end;
    long long ms;

    memset(opt, 0, sizeof(*opt));
    opt->image = injector_env("FENCEGATE_INJECT_IMAGE", "fencegate:" FG_VERSION);
    opt->cpu_request = injector_env("FENCEGATE_INJECT_CPU_REQUEST", "50m");
    opt->memory_request = injector_env("FENCEGATE_INJECT_MEMORY_REQUEST", "16Mi");
    opt->cpu_limit = injector_env("FENCEGATE_INJECT_CPU_LIMIT", "500m");
    opt->memory_limit = injector_env("FENCEGATE_INJECT_MEMORY_LIMIT", "64Mi");
    opt->backend = injector_env("FENCEGATE_INJECT_BACKEND", NULL);
    opt->upstream = injector_env("FENCEGATE_INJECT_UPSTREAM", NULL);
    opt->backend_prefix = injector_env("FENCEGATE_INJECT_BACKEND_PREFIX", NULL);
    opt->session_ttl_ms = injector_env("FENCEGATE_INJECT_SESSION_TTL_MS", NULL);
    opt->log_level = injector_env("FENCEGATE_INJECT_LOG_LEVEL", NULL);
    errno = 0;
    ms = strtoll(grace, &end, 10);
    if (errno != 0 || *end != '\0' || grace[0] < '0' || grace[0] > '9' || ms > 600000) {
        fprintf(stderr,
                "fencegate injector: environment FENCEGATE_INJECT_GRACE_MS: '%.40s' is not a "
                "number of milliseconds in 0..600000\n",
                grace);
        return -1;
    }
    opt->grace_ms = ms;
    if (inject_options_check(opt, err, sizeof(err)) != FG_OK) {
        /* err starts with the option's field name: name the variable that set it instead. */
        static const char *const map[][2] = {
            {"image", "IMAGE"},
            {"cpu_request", "CPU_REQUEST"},
            {"memory_request", "MEMORY_REQUEST"},
            {"cpu_limit", "CPU_LIMIT"},
            {"memory_limit", "MEMORY_LIMIT"},
            {"backend", "BACKEND"},
            {"upstream", "UPSTREAM"},
            {"backend_prefix", "BACKEND_PREFIX"},
            {"session_ttl_ms", "SESSION_TTL_MS"},
            {"log_level", "LOG_LEVEL"},
            {"grace_ms", "GRACE_MS"},
        };
        const char *colon = strchr(err, ':');
        for (size_t i = 0; colon != NULL && i < sizeof(map) / sizeof(map[0]); i++) {
            if (strlen(map[i][0]) == (size_t)(colon - err) &&
                !strncmp(err, map[i][0], (size_t)(colon - err))) {
                fprintf(stderr, "fencegate injector: environment FENCEGATE_INJECT_%s%s\n",
                        map[i][1], colon);
                return -1;
            }
        }
        fprintf(stderr, "fencegate injector: environment FENCEGATE_INJECT_*: %s\n", err);
        return -1;
    }
    return 0;
}

/* ---- TLS ----------------------------------------------------------------------------------- */

/* Appends OpenSSL's queued errors (or "unknown error") to out, then clears the queue. */
static void injector_ssl_errors(char *out, size_t cap)
{
    unsigned long e;
    size_t used = 0;

    out[0] = '\0';
    while ((e = ERR_get_error()) != 0) {
        char one[256];
        int n;
        ERR_error_string_n(e, one, sizeof(one));
        n = snprintf(out + used, cap - used, "%s%s", used ? "; " : "", one);
        if (n < 0 || (size_t)n >= cap - used)
            break;
        used += (size_t)n;
    }
    ERR_clear_error();
    if (out[0] == '\0')
        snprintf(out, cap, "unknown error");
}

/* Reads a file's stamp. Returns 0, or -1 with errno. */
static int injector_stamp(const char *path, struct injector_stamp *s)
{
    struct stat st;

    if (stat(path, &st) < 0)
        return -1;
    memset(s, 0, sizeof(*s));
    s->dev = st.st_dev;
    s->ino = st.st_ino;
    s->size = st.st_size;
    s->mtime = st.st_mtim;
    return 0;
}

static int injector_stamp_same(const struct injector_stamp *a, const struct injector_stamp *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec;
}

/* Builds a server context from the PEM files. Returns it, or NULL with err naming the file. */
static SSL_CTX *injector_tls_new(const char *cert, const char *key, char *err, size_t errlen)
{
    char why[INJECTOR_ERR_MAX / 2];
    SSL_CTX *ctx;
    FILE *f;

    /* fopen() first: "No such file or directory" says more than OpenSSL's "system lib". */
    for (int k = 0; k < 2; k++) {
        const char *path = k == 0 ? cert : key;
        f = fopen(path, "rb");
        if (f == NULL) {
            snprintf(err, errlen, "cannot read %s file '%s': %s", k == 0 ? "certificate" : "key",
                     path, strerror(errno));
            return NULL;
        }
        fclose(f);
    }
    ERR_clear_error();
    ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == NULL) {
        injector_ssl_errors(why, sizeof(why));
        snprintf(err, errlen, "cannot create a TLS context: %s", why);
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    if (SSL_CTX_use_certificate_chain_file(ctx, cert) != 1) {
        injector_ssl_errors(why, sizeof(why));
        snprintf(err, errlen, "cannot load certificate file '%s' (PEM expected): %s", cert, why);
        SSL_CTX_free(ctx);
        return NULL;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, key, SSL_FILETYPE_PEM) != 1) {
        injector_ssl_errors(why, sizeof(why));
        snprintf(err, errlen, "cannot load key file '%s' (a PEM key matching the certificate): %s",
                 key, why);
        SSL_CTX_free(ctx);
        return NULL;
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
        injector_ssl_errors(why, sizeof(why));
        snprintf(err, errlen, "key file '%s' does not match certificate file '%s': %s", key, cert,
                 why);
        SSL_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

/* Re-reads the certificate and key when either file changed (or always, with force). A bad
 * pair is logged and the current one kept: the stamps are not updated, so the next check
 * tries again (a Secret update may briefly show a new certificate beside the old key). */
static void injector_reload(struct injector *inj, int force)
{
    struct injector_stamp cs, ks;
    char err[INJECTOR_ERR_MAX];
    SSL_CTX *ctx;

    if (injector_stamp(inj->cert_path, &cs) < 0 || injector_stamp(inj->key_path, &ks) < 0) {
        log_warn("injector: cannot stat certificate '%s' or key '%s': %s; keeping the current "
                 "pair",
                 inj->cert_path, inj->key_path, strerror(errno));
        return;
    }
    if (!force && injector_stamp_same(&cs, &inj->cert_stamp) &&
        injector_stamp_same(&ks, &inj->key_stamp))
        return;
    ctx = injector_tls_new(inj->cert_path, inj->key_path, err, sizeof(err));
    if (ctx == NULL) {
        log_warn("injector: %s; keeping the current certificate", err);
        return;
    }
    SSL_CTX_free(inj->tls); /* connections made with it hold their own reference */
    inj->tls = ctx;
    inj->cert_stamp = cs;
    inj->key_stamp = ks;
    log_info("injector: certificate '%s' and key '%s' loaded", inj->cert_path, inj->key_path);
}

static void injector_on_reload_timer(evutil_socket_t fd, short what, void *arg)
{
    injector_reload(arg, 0);
}

/* evhttp asks for each accepted connection's bufferevent: a TLS one in accepting state. */
static struct bufferevent *injector_bevcb(struct event_base *base, void *arg)
{
    struct injector *inj = arg;
    struct bufferevent *bev;
    SSL *ssl = SSL_new(inj->tls);

    if (ssl == NULL) {
        /* Out of memory. NULL makes evhttp use a plain socket: the API server's TLS handshake
         * then fails and it retries, which is all that can be done here. */
        ERR_clear_error();
        log_error("injector: SSL_new failed (out of memory?)");
        return NULL;
    }
    bev = bufferevent_openssl_socket_new(base, -1, ssl, BUFFEREVENT_SSL_ACCEPTING,
                                         BEV_OPT_CLOSE_ON_FREE | BEV_OPT_DEFER_CALLBACKS);
    if (bev == NULL) {
        SSL_free(ssl);
        return NULL;
    }
    /* A peer that closes without close_notify after its reply is not an error here. */
    bufferevent_openssl_set_allow_dirty_shutdown(bev, 1);
    return bev;
}

/* ---- Requests ------------------------------------------------------------------------------ */

/* Sends body (JSON) with code; a failed allocation becomes a bare 500. */
static void injector_reply(struct evhttp_request *req, int code, const char *reason,
                           const char *body, size_t len)
{
    struct evbuffer *b = evbuffer_new();

    if (b == NULL || evbuffer_add(b, body, len) != 0) {
        if (b != NULL)
            evbuffer_free(b);
        evhttp_send_error(req, 500, "out of memory");
        return;
    }
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", "application/json");
    evhttp_send_reply(req, code, reason, b);
    evbuffer_free(b);
}

static void injector_reply_lit(struct evhttp_request *req, int code, const char *reason,
                               const char *json)
{
    injector_reply(req, code, reason, json, strlen(json));
}

/* Whether the Content-Type names JSON: "application/json", any case, parameters allowed. */
static int injector_is_json(const char *ct)
{
    static const char want[] = "application/json";
    size_t n = sizeof(want) - 1;

    if (ct == NULL)
        return 0;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    if (strncasecmp(ct, want, n) != 0)
        return 0;
    ct += n;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    return *ct == '\0' || *ct == ';';
}

static void injector_peer(struct evhttp_request *req, char *out, size_t cap)
{
    struct evhttp_connection *c = evhttp_request_get_connection(req);
    char *addr = NULL;
    ev_uint16_t port = 0;

    snprintf(out, cap, "?");
    if (c != NULL) {
        evhttp_connection_get_peer(c, &addr, &port);
        if (addr != NULL)
            snprintf(out, cap, "%s:%u", addr, (unsigned)port);
    }
}

/* POST /mutate: one AdmissionReview in, its response out. */
static void injector_mutate(struct injector *inj, struct evhttp_request *req)
{
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    const char *ct = evhttp_find_header(evhttp_request_get_input_headers(req), "Content-Type");
    size_t len = evbuffer_get_length(in);
    struct inject_result res;
    char peer[80];
    const char *body;
    int rc;

    injector_peer(req, peer, sizeof(peer));
    if (!injector_is_json(ct)) {
        log_warn("injector: POST /mutate from %s with Content-Type '%.60s': 415", peer,
                 ct ? ct : "(none)");
        injector_reply_lit(req, 415, "Unsupported Media Type",
                           "{\"error\":\"Content-Type must be application/json\"}");
        return;
    }
    if (len > INJECT_MAX_BODY) { /* evhttp's own limit normally answers first */
        injector_reply_lit(req, 413, "Payload Too Large",
                           "{\"error\":\"the AdmissionReview is larger than 4194304 bytes\"}");
        return;
    }
    body = len > 0 ? (const char *)evbuffer_pullup(in, -1) : NULL;
    if (len > 0 && body == NULL) {
        evhttp_send_error(req, 500, "out of memory");
        return;
    }
    rc = inject_review(body, len, &inj->opt, &res);
    if (res.body == NULL) {
        log_error("injector: out of memory answering %s", peer);
        evhttp_send_error(req, 500, "out of memory");
        inject_result_free(&res);
        return;
    }
    switch (rc) {
    case FG_OK:
        injector_reply(req, 200, "OK", res.body, res.body_len);
        break;
    case FG_ERR_LIMIT:
        injector_reply(req, 413, "Payload Too Large", res.body, res.body_len);
        break;
    default:
        injector_reply(req, 400, "Bad Request", res.body, res.body_len);
        break;
    }
    switch (res.outcome) {
    case INJECT_PATCHED:
        log_info("injector: pod %s: sidecar injected", res.pod[0] ? res.pod : "(unnamed)");
        break;
    case INJECT_UNUSABLE:
        log_warn("injector: pod %s: allowed without the sidecar: %s",
                 res.pod[0] ? res.pod : "(unnamed)", res.message);
        break;
    case INJECT_ERROR:
        log_warn("injector: bad review from %s (%zu bytes): %s", peer, len, res.message);
        break;
    default:
        log_debug("injector: pod %s: nothing to inject (%s)", res.pod[0] ? res.pod : "(unnamed)",
                  res.outcome == INJECT_NOT_REQUESTED ? "not requested"
                  : res.outcome == INJECT_ALREADY     ? "already injected"
                                                      : "not a Pod creation");
        break;
    }
    inject_result_free(&res);
}

static void injector_on_request(struct evhttp_request *req, void *arg)
{
    struct injector *inj = arg;
    const struct evhttp_uri *uri = evhttp_request_get_evhttp_uri(req);
    const char *path = uri ? evhttp_uri_get_path(uri) : NULL;
    enum evhttp_cmd_type cmd = evhttp_request_get_command(req);
    struct evkeyvalq *out = evhttp_request_get_output_headers(req);

    if (path == NULL)
        path = "";
    /* Draining: answer, and have the client take its next request to another replica. */
    if (inj->draining)
        evhttp_add_header(out, "Connection", "close");
    if (!strcmp(path, "/healthz")) {
        if (cmd != EVHTTP_REQ_GET && cmd != EVHTTP_REQ_HEAD) {
            evhttp_add_header(out, "Allow", "GET, HEAD");
            injector_reply_lit(req, 405, "Method Not Allowed",
                               "{\"error\":\"/healthz takes GET\"}");
            return;
        }
        injector_reply_lit(req, 200, "OK", "{\"status\":\"ok\"}");
        return;
    }
    if (!strcmp(path, "/mutate")) {
        if (cmd != EVHTTP_REQ_POST) {
            evhttp_add_header(out, "Allow", "POST");
            injector_reply_lit(req, 405, "Method Not Allowed",
                               "{\"error\":\"/mutate takes POST\"}");
            return;
        }
        injector_mutate(inj, req);
        return;
    }
    injector_reply_lit(req, 404, "Not Found",
                       "{\"error\":\"no such path (the webhook is POST /mutate)\"}");
}

/* ---- Process ------------------------------------------------------------------------------- */

static void injector_on_exit_timer(evutil_socket_t fd, short what, void *arg)
{
    struct injector *inj = arg;

    log_info("injector: shutdown delay over; exiting");
    event_base_loopexit(inj->base, NULL);
}

/* The first SIGTERM or SIGINT starts the shutdown delay (the pod stays in the Service's
 * endpoints and in the API server's kept-alive connections for a moment, and a review refused
 * then fails a pod's creation under failurePolicy Fail); with no delay, or at the second
 * signal, the loop ends at once. */
static void injector_on_stop(evutil_socket_t sig, short what, void *arg)
{
    struct injector *inj = arg;
    const char *name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
    struct timeval delay = {inj->delay_s, 0};

    if (inj->draining || inj->delay_s == 0 || evtimer_add(inj->ev_exit, &delay) < 0) {
        log_info("injector: %s received; exiting", name);
        event_base_loopexit(inj->base, NULL);
        return;
    }
    inj->draining = 1;
    log_info("injector: %s received; answering for %ld more seconds, then exiting (a second "
             "signal exits now)",
             name, inj->delay_s);
}

static void injector_on_hup(evutil_socket_t sig, short what, void *arg)
{
    log_info("injector: SIGHUP received; reloading the certificate");
    injector_reload(arg, 1);
}

static int injector_log_level(const char *s, enum log_level *out)
{
    static const char *const names[] = {"error", "warn", "info", "debug"};

    for (int i = 0; i < 4; i++) {
        if (!strcmp(s, names[i])) {
            *out = (enum log_level)i;
            return 0;
        }
    }
    return -1;
}

int injector_main(int argc, char **argv)
{
    static struct injector inj;
    struct injector_flags f;
    struct cfg_addr addr;
    struct cfg_error cerr;
    enum log_level level = LOG_INFO;
    struct event *ev_term = NULL, *ev_int = NULL, *ev_hup = NULL, *ev_reload = NULL;
    struct timeval every = {INJECTOR_RELOAD_S, 0};
    char err[INJECTOR_ERR_MAX];
    int rc = injector_parse_flags(argc, argv, &f);

    if (rc != 0) {
        if (rc > 0)
            fputs(INJECTOR_USAGE, stdout);
        return rc > 0 ? 0 : 2;
    }
    if (cfg_parse_addr(f.listen, &addr, &cerr) != FG_OK) {
        fprintf(stderr, "fencegate injector: flag --listen: %s\n", cerr.msg);
        return 2;
    }
    if (f.log_level != NULL && injector_log_level(f.log_level, &level) < 0) {
        fprintf(stderr,
                "fencegate injector: flag --log-level: '%.40s' is not error, warn, info or "
                "debug\n",
                f.log_level);
        return 2;
    }
    if (f.shutdown_delay != NULL) {
        char *end;
        errno = 0;
        inj.delay_s = strtol(f.shutdown_delay, &end, 10);
        if (errno != 0 || *end != '\0' || f.shutdown_delay[0] < '0' || f.shutdown_delay[0] > '9' ||
            inj.delay_s > INJECTOR_DELAY_MAX) {
            fprintf(stderr,
                    "fencegate injector: flag --shutdown-delay: '%.40s' is not a number of "
                    "seconds in 0..%d\n",
                    f.shutdown_delay, INJECTOR_DELAY_MAX);
            return 2;
        }
    }
    log_set_level(level);
    if (injector_options(&inj.opt) < 0)
        return 2;
    inj.cert_path = f.cert;
    inj.key_path = f.key;
    if (injector_stamp(f.cert, &inj.cert_stamp) < 0 || injector_stamp(f.key, &inj.key_stamp) < 0)
        memset(&inj.cert_stamp, 0, sizeof(inj.cert_stamp)); /* injector_tls_new() says why */
    inj.tls = injector_tls_new(f.cert, f.key, err, sizeof(err));
    if (inj.tls == NULL) {
        fprintf(stderr, "fencegate injector: %s\n", err);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);

    rc = 1;
    inj.base = event_base_new();
    inj.http = inj.base ? evhttp_new(inj.base) : NULL;
    if (inj.http == NULL) {
        fprintf(stderr, "fencegate injector: cannot create the event loop\n");
        goto out;
    }
    evhttp_set_bevcb(inj.http, injector_bevcb, &inj);
    evhttp_set_gencb(inj.http, injector_on_request, &inj);
    evhttp_set_max_headers_size(inj.http, INJECTOR_MAX_HEADERS);
    evhttp_set_max_body_size(inj.http, INJECT_MAX_BODY);
    evhttp_set_timeout(inj.http, INJECTOR_TIMEOUT_S);
    /* Read an oversized body to its end before answering 413, so that the client, still
     * sending, sees the answer instead of a reset connection. */
    evhttp_set_flags(inj.http, EVHTTP_SERVER_LINGERING_CLOSE);
    /* Every method evhttp knows reaches the routes, which answer 405 with an Allow header. */
    evhttp_set_allowed_methods(inj.http, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
                                             EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE |
                                             EVHTTP_REQ_OPTIONS | EVHTTP_REQ_TRACE |
                                             EVHTTP_REQ_CONNECT | EVHTTP_REQ_PATCH);
    if (evhttp_bind_socket_with_handle(inj.http, addr.host, (ev_uint16_t)addr.port) == NULL) {
        fprintf(stderr, "fencegate injector: cannot listen on %s:%d: %s\n", addr.host, addr.port,
                strerror(errno));
        goto out;
    }
    ev_term = evsignal_new(inj.base, SIGTERM, injector_on_stop, &inj);
    ev_int = evsignal_new(inj.base, SIGINT, injector_on_stop, &inj);
    ev_hup = evsignal_new(inj.base, SIGHUP, injector_on_hup, &inj);
    ev_reload = event_new(inj.base, -1, EV_PERSIST, injector_on_reload_timer, &inj);
    inj.ev_exit = evtimer_new(inj.base, injector_on_exit_timer, &inj);
    if (!ev_term || !ev_int || !ev_hup || !ev_reload || !inj.ev_exit ||
        evsignal_add(ev_term, NULL) < 0 || evsignal_add(ev_int, NULL) < 0 ||
        evsignal_add(ev_hup, NULL) < 0 || evtimer_add(ev_reload, &every) < 0) {
        fprintf(stderr, "fencegate injector: cannot set up signals and timers\n");
        goto out;
    }
    log_info("fencegate %s injector: https %s:%d, sidecar image %s", FG_VERSION, addr.host,
             addr.port, inj.opt.image);
    event_base_dispatch(inj.base);
    log_info("injector: stopped");
    rc = 0;
out:
    if (ev_term)
        event_free(ev_term);
    if (ev_int)
        event_free(ev_int);
    if (ev_hup)
        event_free(ev_hup);
    if (ev_reload)
        event_free(ev_reload);
    if (inj.ev_exit)
        event_free(inj.ev_exit);
    if (inj.http)
        evhttp_free(inj.http);
    if (inj.base)
        event_base_free(inj.base);
    SSL_CTX_free(inj.tls);
    return rc;
}
