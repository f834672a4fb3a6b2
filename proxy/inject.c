/* inject.c — reads an AdmissionReview for a Pod and writes its response with the sidecar patch. */
#include "inject.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

#define INJECT_SHOW_MAX   40 /* bytes of a user's value quoted in a message */
#define INJECT_SHOW_CAP   (INJECT_SHOW_MAX * 4 + 4) /* its rendering, "..." and NUL included */
#define INJECT_MAX_NOTE   160 /* bytes of a problem noted during the walk, NUL included */
#define INJECT_MAX_SHORT  64  /* decoded bytes kept of short strings (kinds, operations) */
#define INJECT_MAX_NAME   253 /* a Kubernetes object name (DNS-1123 subdomain) */
#define INJECT_MAX_INJECT 16  /* bytes kept of the fencegate.io/inject value */
#define INJECT_GRACE_MAX  600000

#define INJECT_ENV_RESP       "FENCEGATE_RESP_ADDR"
#define INJECT_ENV_HTTP       "FENCEGATE_HTTP_ADDR"
#define INJECT_ENV_APP_HEALTH "FENCEGATE_APP_HEALTH_URL" /* the sidecar's, from the annotation */

/* How a member looked in the review. */
enum inject_shape {
    INJECT_ABSENT = 0,
    INJECT_NULL,
    INJECT_OBJECT,
    INJECT_ARRAY,
    INJECT_STRING,
    INJECT_OTHER,
};

/* A decoded string member, kept up to a bound (at most INJECT_MAX_NAME bytes). */
struct inject_str {
    char text[INJECT_MAX_NAME + 1];
    size_t len;   /* decoded bytes; bound + 1 when too_long */
    int set;      /* the member was there, as a string */
    int too_long; /* longer than its bound: text is empty */
};

/* The one longer string kept, the fencegate.io/app-health-url value: as inject_str, bound
 * INJECT_MAX_APP_URL. */
struct inject_url {
    char text[INJECT_MAX_APP_URL + 1];
    size_t len;
    int set;
    int too_long;
};

/* Everything the walk over the review learnt; decided on only once the walk is complete. */
struct inject_walk {
    struct json_reader r;
    /* the review */
    int top_object;
    struct inject_str api_version, kind;
    enum inject_shape request;
    struct inject_str uid;
    enum inject_shape uid_shape;
    /* the request */
    int have_req_kind;
    struct inject_str req_group, req_kind, sub_resource, operation, req_namespace, req_name;
    enum inject_shape object;
    /* the pod */
    enum inject_shape annotations, spec, containers, init_containers, volumes;
    struct inject_str meta_name, meta_generate_name, meta_namespace;
    struct inject_str ann_inject, ann_config, ann_secret;
    struct inject_url ann_app_health;
    int has_sidecar; /* an initContainer is already named "fencegate": the sidecar */
    int app_named;   /* an app container is named "fencegate" (app_named_at: its index) */
    size_t app_named_at;
    int host_network;               /* spec.hostNetwork: true */
    char port_err[INJECT_MAX_NOTE]; /* a running container declares 6380 or 8380 */
    int volume_conflict;            /* a volume is already named "fencegate-config" */
    int secret_conflict;            /* ... or "fencegate-secret" */
    size_t ncontainers;             /* app containers seen (may exceed INJECT_MAX_CONTAINERS) */
    unsigned char env_shape[INJECT_MAX_CONTAINERS]; /* enum inject_shape of each env member */
    unsigned char env_has[INJECT_MAX_CONTAINERS];   /* bit 0: RESP_ADDR set, bit 1: HTTP_ADDR */
    /* the first problem found at each level ("" while none) */
    char review_err[INJECT_MAX_NOTE]; /* not a usable review: 400 */
    char ann_err[INJECT_MAX_NOTE];    /* the annotations cannot be read */
    char pod_err[INJECT_MAX_NOTE];    /* the rest of the pod cannot be read */
};

/* An output buffer that grows up to max; the first failure sticks. */
struct inject_out {
    char *data;
    size_t len, cap, max;
    int err;
};

/* ---- Output ------------------------------------------------------------------------------- */

static void inject_put(struct inject_out *o, const void *p, size_t n)
{
    if (o->err != FG_OK)
        return;
    if (n > o->max - o->len) {
        o->err = FG_ERR_LIMIT;
        return;
    }
    if (o->len + n + 1 > o->cap) {
        size_t cap = o->cap ? o->cap : 4096;
        char *d;
        while (cap < o->len + n + 1)
            cap *= 2;
        if (cap > o->max + 1)
            cap = o->max + 1;
        d = realloc(o->data, cap);
        if (d == NULL) {
            o->err = FG_ERR_NOMEM;
            return;
        }
        o->data = d;
        o->cap = cap;
    }
    memcpy(o->data + o->len, p, n);
    o->len += n;
    o->data[o->len] = '\0';
}

static void inject_puts(struct inject_out *o, const char *s)
{
    inject_put(o, s, strlen(s));
}

static void inject_put_int(struct inject_out *o, long long v)
{
    char tmp[32];
    int n = snprintf(tmp, sizeof(tmp), "%lld", v);
    if (n > 0 && (size_t)n < sizeof(tmp))
        inject_put(o, tmp, (size_t)n);
}

/* Writes s[0..n) as a JSON string: quotes, '"' and '\' backslashed, control bytes and DEL as
 * \u00XX. Other bytes pass as they are: they are valid UTF-8 decoded by the JSON reader, or
 * options inject_options_check() proved printable ASCII. */
static void inject_put_jstr(struct inject_out *o, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t run = 0;

    inject_put(o, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[6];
        size_t elen = 0;
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            elen = 2;
        } else if (c < 0x20 || c == 0x7f) {
            memcpy(esc, "\\u00", 4);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            elen = 6;
        }
        if (elen > 0) {
            inject_put(o, s + run, i - run);
            inject_put(o, esc, elen);
            run = i + 1;
        }
    }
    inject_put(o, s + run, n - run);
    inject_put(o, "\"", 1);
}

static void inject_put_jcstr(struct inject_out *o, const char *s)
{
    inject_put_jstr(o, s, strlen(s));
}

/* Appends the standard base64 (RFC 4648, padded) encoding of p[0..n). */
static void inject_put_base64(struct inject_out *o, const unsigned char *p, size_t n)
{
    static const char alphabet[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char chunk[256];
    size_t c = 0;

    for (size_t i = 0; i < n; i += 3) {
        unsigned long v = (unsigned long)p[i] << 16;
        size_t left = n - i;
        if (left > 1)
            v |= (unsigned long)p[i + 1] << 8;
        if (left > 2)
            v |= p[i + 2];
        chunk[c++] = alphabet[(v >> 18) & 63];
        chunk[c++] = alphabet[(v >> 12) & 63];
        chunk[c++] = left > 1 ? alphabet[(v >> 6) & 63] : '=';
        chunk[c++] = left > 2 ? alphabet[v & 63] : '=';
        if (c + 4 > sizeof(chunk)) {
            inject_put(o, chunk, c);
            c = 0;
        }
    }
    inject_put(o, chunk, c);
}

/* ---- Messages ----------------------------------------------------------------------------- */

/* Renders user text for a message: printable ASCII as is, anything else as \xNN, at most
 * INJECT_SHOW_MAX bytes of input followed by "..." when cut. */
static void inject_show(const char *s, size_t len, char *out, size_t cap)
{
    size_t o = 0;
    size_t n = len > INJECT_SHOW_MAX ? INJECT_SHOW_MAX : len;

    if (cap == 0)
        return;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char tmp[8];
        int k = c >= 0x20 && c < 0x7f ? snprintf(tmp, sizeof(tmp), "%c", c)
                                      : snprintf(tmp, sizeof(tmp), "\\x%02X", c);
        if (k < 0 || (size_t)k >= cap - o)
            break;
        memcpy(out + o, tmp, (size_t)k);
        o += (size_t)k;
    }
    if (n < len && cap - o > 3) {
        memcpy(out + o, "...", 3);
        o += 3;
    }
    out[o] = '\0';
}

/* Shows a kept string; one that did not fit its bound is shown as "(too long)". */
static void inject_show_str(const struct inject_str *s, char *out, size_t cap)
{
    if (s->too_long)
        snprintf(out, cap, "(%s)", "too long");
    else
        inject_show(s->text, s->len, out, cap);
}

/* Records the first problem in slot (INJECT_MAX_NOTE bytes); later ones are dropped. */
static void inject_note(char *slot, const char *fmt, ...) FG_PRINTF(2, 3);
static void inject_note(char *slot, const char *fmt, ...)
{
    va_list ap;

    if (slot[0] != '\0')
        return;
    va_start(ap, fmt);
    vsnprintf(slot, INJECT_MAX_NOTE, fmt, ap);
    va_end(ap);
}

/* ---- The walk ----------------------------------------------------------------------------- */

static enum inject_shape inject_shape_of(const struct json_token *t)
{
    switch (t->type) {
    case JSON_NULL:
        return INJECT_NULL;
    case JSON_OBJECT_BEGIN:
        return INJECT_OBJECT;
    case JSON_ARRAY_BEGIN:
        return INJECT_ARRAY;
    case JSON_STRING:
        return INJECT_STRING;
    default:
        return INJECT_OTHER;
    }
}

static const char *inject_shape_name(enum inject_shape s)
{
    static const char *const names[] = {"nothing",  "null",     "an object",
                                        "an array", "a string", "a number or boolean"};
    return names[s];
}

/* Decodes the string token t into text (bound + 1 bytes). Returns 1 with *len, or 0 when it is
 * longer than bound: text is then empty and *len is bound + 1. */
static int inject_decode(const struct json_token *t, char *text, size_t bound, size_t *len)
{
    size_t n = 0;

    if (t->len > bound * 6 + 6 || json_unescape(t->ptr, t->len, text, bound + 1, &n) != FG_OK) {
        text[0] = '\0';
        *len = bound + 1;
        return 0;
    }
    *len = n;
    return 1;
}

/* Keeps the string token t in *s, up to bound bytes (at most INJECT_MAX_NAME). */
static void inject_keep(struct inject_str *s, const struct json_token *t, size_t bound)
{
    s->set = 1;
    s->too_long = !inject_decode(t, s->text, bound, &s->len);
}

static int inject_str_is(const struct inject_str *s, const char *want)
{
    return s->set && s->len == strlen(want) && memcmp(s->text, want, s->len) == 0;
}

/* Reads the first token of the value after a member name into *t. */
static int inject_value(struct inject_walk *w, struct json_token *t)
{
    return json_next(&w->r, t);
}

/* Skips the value whose first token is t (a no-op for scalars). */
static int inject_skip(struct inject_walk *w, const struct json_token *t)
{
    return json_skip(&w->r, t);
}

/* Reads the next member name of the open object into *key; *done is set at the object's end. */
static int inject_member(struct inject_walk *w, struct json_token *key, int *done)
{
    int rc = json_next(&w->r, key);
    *done = rc == FG_OK && key->type == JSON_OBJECT_END;
    return rc;
}

/* Marks member bit in *seen; returns 1 when it was already there (a duplicate). */
static int inject_dup(unsigned *seen, unsigned bit)
{
    int dup = (*seen & bit) != 0;
    *seen |= bit;
    return dup;
}

/* A string member kept into *s; a value of another type is recorded in slot and skipped. */
static int inject_string_member(struct inject_walk *w, struct inject_str *s, size_t bound,
                                char *slot, const char *where)
{
    struct json_token v;
    int rc = inject_value(w, &v);

    if (rc != FG_OK)
        return rc;
    if (v.type == JSON_STRING) {
        inject_keep(s, &v, bound);
        return FG_OK;
    }
    if (v.type != JSON_NULL)
        inject_note(slot, "%s: expected a string, got %s", where,
                    inject_shape_name(inject_shape_of(&v)));
    return inject_skip(w, &v);
}

/* metadata.annotations: the five fencegate.io keys; other members are skipped. */
static int inject_walk_annotations(struct inject_walk *w)
{
    static const char *const keys[] = {INJECT_ANN_INJECT, INJECT_ANN_CONFIG, INJECT_ANN_STATUS,
                                       INJECT_ANN_SECRET, INJECT_ANN_APP_HEALTH};
    struct json_token k, v;
    unsigned seen = 0;
    int done, rc;

    while ((rc = inject_member(w, &k, &done)) == FG_OK && !done) {
        int which = -1;
        for (int i = 0; i < (int)(sizeof(keys) / sizeof(keys[0])); i++) {
            if (json_string_equals(&k, keys[i]))
                which = i;
        }
        rc = inject_value(w, &v);
        if (rc != FG_OK)
            return rc;
        if (which < 0) {
            rc = inject_skip(w, &v);
            if (rc != FG_OK)
                return rc;
            continue;
        }
        if (inject_dup(&seen, 1u << which))
            inject_note(w->ann_err, "metadata.annotations has \"%s\" twice", keys[which]);
        if (v.type != JSON_STRING) {
            inject_note(w->ann_err, "annotation %s: expected a string, got %s", keys[which],
                        inject_shape_name(inject_shape_of(&v)));
            rc = inject_skip(w, &v);
            if (rc != FG_OK)
                return rc;
            continue;
        }
        if (which == 0) {
            inject_keep(&w->ann_inject, &v, INJECT_MAX_INJECT);
        } else if (which == 1) {
            inject_keep(&w->ann_config, &v, INJECT_MAX_NAME);
        } else if (which == 3) {
            inject_keep(&w->ann_secret, &v, INJECT_MAX_NAME);
        } else if (which == 4) {
            struct inject_url *u = &w->ann_app_health;
            u->set = 1;
            u->too_long = !inject_decode(&v, u->text, INJECT_MAX_APP_URL, &u->len);
        }
        /* fencegate.io/status is read only to refuse a duplicate: whether the pod has the
         * sidecar is decided by its init containers. */
    }
    return rc;
}

/* request.object.metadata */
static int inject_walk_metadata(struct inject_walk *w)
{
    struct json_token k, v;
    unsigned seen = 0;
    int done, rc;

    while ((rc = inject_member(w, &k, &done)) == FG_OK && !done) {
        if (json_string_equals(&k, "annotations")) {
            rc = inject_value(w, &v);
            if (rc != FG_OK)
                return rc;
            if (inject_dup(&seen, 1))
                inject_note(w->ann_err, "metadata has \"annotations\" twice");
            w->annotations = inject_shape_of(&v);
            if (v.type == JSON_OBJECT_BEGIN) {
                rc = inject_walk_annotations(w);
            } else {
                if (v.type != JSON_NULL)
                    inject_note(w->ann_err, "metadata.annotations: expected an object, got %s",
                                inject_shape_name(w->annotations));
                rc = inject_skip(w, &v);
            }
        } else if (json_string_equals(&k, "name")) {
            rc = inject_string_member(w, &w->meta_name, INJECT_MAX_NAME, w->pod_err,
                                      "metadata.name");
        } else if (json_string_equals(&k, "generateName")) {
            rc = inject_string_member(w, &w->meta_generate_name, INJECT_MAX_NAME, w->pod_err,
                                      "metadata.generateName");
        } else if (json_string_equals(&k, "namespace")) {
            rc = inject_string_member(w, &w->meta_namespace, INJECT_MAX_NAME, w->pod_err,
                                      "metadata.namespace");
        } else {
            rc = json_skip(&w->r, &k);
        }
        if (rc != FG_OK)
            return rc;
    }
    return rc;
}

/* Calls fn with each member of each object of an open array (other elements are skipped), its
 * value read but not yet skipped. */
static int inject_walk_objects(struct inject_walk *w,
                               void (*fn)(struct inject_walk *w, const struct json_token *k,
                                          const struct json_token *v, void *arg),
                               void *arg)
{
    struct json_token t, k, v;
    int done, rc;

    for (;;) {
        rc = json_next(&w->r, &t);
        if (rc != FG_OK)
            return rc;
        if (t.type == JSON_ARRAY_END)
            return FG_OK;
        if (t.type != JSON_OBJECT_BEGIN) {
            rc = inject_skip(w, &t);
            if (rc != FG_OK)
                return rc;
            continue;
        }
        while ((rc = inject_member(w, &k, &done)) == FG_OK && !done) {
            rc = inject_value(w, &v);
            if (rc != FG_OK)
                return rc;
            fn(w, &k, &v, arg);
            rc = inject_skip(w, &v);
            if (rc != FG_OK)
                return rc;
        }
        if (rc != FG_OK)
            return rc;
    }
}

/* A member of one of a container's ports: the first containerPort that is one of the sidecar's
 * (6380, 8380) goes into *(long long *)arg. hostPort does not matter: the sidecar binds in the
 * pod's network namespace, where only containerPort is taken. */
static void inject_port_member(struct inject_walk *w, const struct json_token *k,
                               const struct json_token *v, void *arg)
{
    long long *clash = arg;
    int64_t port;

    (void)w;
    if (json_string_equals(k, "containerPort") && v->type == JSON_NUMBER &&
        json_number_int64(v, &port) == FG_OK &&
        (port == INJECT_RESP_PORT || port == INJECT_HTTP_PORT) && *clash == 0)
        *clash = (long long)port;
}

/* One element of spec.containers (app = 1, index i) or spec.initContainers (app = 0). */
static int inject_walk_container(struct inject_walk *w, int app, size_t i)
{
    const char *list = app ? "spec.containers" : "spec.initContainers";
    int track = app && i < INJECT_MAX_CONTAINERS;
    struct json_token k, v, ek, ev;
    unsigned seen = 0;
    long long clash = 0; /* a declared containerPort of the sidecar's */
    int always = 0;      /* restartPolicy: Always (a native sidecar: runs beside the app) */
    int done, rc;

    while ((rc = inject_member(w, &k, &done)) == FG_OK && !done) {
        int is_name = json_string_equals(&k, "name");
        int is_env = app && json_string_equals(&k, "env");
        rc = inject_value(w, &v);
        if (rc != FG_OK)
            return rc;
        if ((is_name || is_env) && inject_dup(&seen, is_name ? 1u : 2u))
            inject_note(w->pod_err, "%s[%zu] has \"%s\" twice", list, i, is_name ? "name" : "env");
        if (is_name && json_string_equals(&v, INJECT_CONTAINER)) {
            if (!app) {
                w->has_sidecar = 1;
            } else if (!w->app_named) {
                w->app_named = 1;
                w->app_named_at = i;
            }
        }
        if (json_string_equals(&k, "restartPolicy") && json_string_equals(&v, "Always"))
            always = 1;
        if (json_string_equals(&k, "ports") && v.type == JSON_ARRAY_BEGIN) {
            rc = inject_walk_objects(w, inject_port_member, &clash);
            if (rc != FG_OK)
                return rc;
            continue;
        }
        if (!is_env || v.type != JSON_ARRAY_BEGIN) {
            if (is_env) {
                if (track)
                    w->env_shape[i] = (unsigned char)inject_shape_of(&v);
                if (v.type != JSON_NULL)
                    inject_note(w->pod_err, "%s[%zu].env: expected an array, got %s", list, i,
                                inject_shape_name(inject_shape_of(&v)));
            }
            rc = inject_skip(w, &v);
            if (rc != FG_OK)
                return rc;
            continue;
        }
        if (track)
            w->env_shape[i] = INJECT_ARRAY;
        /* env: note which of our variables the container already sets itself. */
        for (;;) {
            rc = json_next(&w->r, &ev);
            if (rc != FG_OK)
                return rc;
            if (ev.type == JSON_ARRAY_END)
                break;
            if (ev.type != JSON_OBJECT_BEGIN) {
                rc = inject_skip(w, &ev);
                if (rc != FG_OK)
                    return rc;
                continue;
            }
            while ((rc = inject_member(w, &ek, &done)) == FG_OK && !done) {
                rc = inject_value(w, &v);
                if (rc != FG_OK)
                    return rc;
                if (track && json_string_equals(&ek, "name")) {
                    if (json_string_equals(&v, INJECT_ENV_RESP))
                        w->env_has[i] |= 1;
                    if (json_string_equals(&v, INJECT_ENV_HTTP))
                        w->env_has[i] |= 2;
                }
                rc = inject_skip(w, &v);
                if (rc != FG_OK)
                    return rc;
            }
            if (rc != FG_OK)
                return rc;
        }
    }
    /* A plain init container has exited before the sidecar (placed after it) starts. */
    if (rc == FG_OK && clash != 0 && (app || always))
        inject_note(w->port_err,
                    "%s[%zu] declares containerPort %lld, which the sidecar listens on (ports "
                    "%d and %d are the sidecar's)",
                    list, i, clash, INJECT_RESP_PORT, INJECT_HTTP_PORT);
    return rc;
}

/* spec.containers (app = 1) or spec.initContainers (app = 0); the array is open. */
static int inject_walk_containers(struct inject_walk *w, int app)
{
    struct json_token t;
    size_t i = 0;
    int rc;

    for (;;) {
        rc = json_next(&w->r, &t);
        if (rc != FG_OK)
            return rc;
        if (t.type == JSON_ARRAY_END)
            break;
        if (t.type == JSON_OBJECT_BEGIN) {
            rc = inject_walk_container(w, app, i);
        } else {
            inject_note(w->pod_err, "%s[%zu]: expected an object, got %s",
                        app ? "spec.containers" : "spec.initContainers", i,
                        inject_shape_name(inject_shape_of(&t)));
            rc = inject_skip(w, &t);
        }
        if (rc != FG_OK)
            return rc;
        i++;
    }
    if (app)
        w->ncontainers = i;
    return FG_OK;
}

/* A member of one of spec.volumes: only the names matter (ours must not be taken). */
static void inject_volume_member(struct inject_walk *w, const struct json_token *k,
                                 const struct json_token *v, void *arg)
{
    (void)arg;
    if (json_string_equals(k, "name") && json_string_equals(v, INJECT_VOLUME))
        w->volume_conflict = 1;
    if (json_string_equals(k, "name") && json_string_equals(v, INJECT_SECRET_VOL))
        w->secret_conflict = 1;
}

/* request.object.spec */
static int inject_walk_spec(struct inject_walk *w)
{
    static const char *const keys[] = {"containers", "initContainers", "volumes"};
    struct json_token k, v;
    unsigned seen = 0;
    int done, rc;

    while ((rc = inject_member(w, &k, &done)) == FG_OK && !done) {
        int which = -1;
        enum inject_shape *shape;
        for (int i = 0; i < 3; i++) {
            if (json_string_equals(&k, keys[i]))
                which = i;
        }
        if (which < 0) {
            if (!json_string_equals(&k, "hostNetwork")) {
                rc = json_skip(&w->r, &k);
            } else {
                rc = inject_value(w, &v);
                if (rc == FG_OK) {
                    w->host_network = v.type == JSON_TRUE;
                    rc = inject_skip(w, &v);
                }
            }
            if (rc != FG_OK)
                return rc;
            continue;
        }
        rc = inject_value(w, &v);
        if (rc != FG_OK)
            return rc;
        if (inject_dup(&seen, 1u << which))
            inject_note(w->pod_err, "spec has \"%s\" twice", keys[which]);
        shape = which == 0 ? &w->containers : which == 1 ? &w->init_containers : &w->volumes;
        *shape = inject_shape_of(&v);
        if (v.type == JSON_ARRAY_BEGIN) {
            rc = which == 2 ? inject_walk_objects(w, inject_volume_member, NULL)
                            : inject_walk_containers(w, which == 0);
        } else {
            if (v.type != JSON_NULL)
                inject_note(w->pod_err, "spec.%s: expected an array, got %s", keys[which],
                            inject_shape_name(*shape));
            rc = inject_skip(w, &v);
        }
        if (rc != FG_OK)
            return rc;
    }
    return rc;
}

/* request.object: a Pod (checked against request.kind later). */
static int inject_walk_pod(struct inject_walk *w)
{
    struct json_token k, v;
    unsigned seen = 0;
    int done, rc;

    while ((rc = inject_member(w, &k, &done)) == FG_OK && !done) {
        int is_meta = json_string_equals(&k, "metadata");
        if (!is_meta && !json_string_equals(&k, "spec")) {
            rc = json_skip(&w->r, &k);
            if (rc != FG_OK)
                return rc;
            continue;
        }
        rc = inject_value(w, &v);
        if (rc != FG_OK)
            return rc;
        if (inject_dup(&seen, is_meta ? 1u : 2u))
            inject_note(is_meta ? w->ann_err : w->pod_err, "request.object has \"%s\" twice",
                        is_meta ? "metadata" : "spec");
        if (!is_meta)
            w->spec = inject_shape_of(&v);
        if (v.type == JSON_OBJECT_BEGIN) {
            rc = is_meta ? inject_walk_metadata(w) : inject_walk_spec(w);
        } else {
            if (v.type != JSON_NULL)
                inject_note(is_meta ? w->ann_err : w->pod_err,
                            "request.object.%s: expected an object, got %s",
                            is_meta ? "metadata" : "spec", inject_shape_name(inject_shape_of(&v)));
            rc = inject_skip(w, &v);
        }
        if (rc != FG_OK)
            return rc;
    }
    return rc;
}

/* request.kind: {group, version, kind} */
static int inject_walk_req_kind(struct inject_walk *w)
{
    struct json_token k;
    int done, rc;

    w->have_req_kind = 1;
    while ((rc = inject_member(w, &k, &done)) == FG_OK && !done) {
        if (json_string_equals(&k, "group"))
            rc = inject_string_member(w, &w->req_group, INJECT_MAX_SHORT, w->pod_err,
                                      "request.kind.group");
        else if (json_string_equals(&k, "kind"))
            rc = inject_string_member(w, &w->req_kind, INJECT_MAX_SHORT, w->pod_err,
                                      "request.kind.kind");
        else
            rc = json_skip(&w->r, &k);
        if (rc != FG_OK)
            return rc;
    }
    return rc;
}

/* The AdmissionReview's request. */
static int inject_walk_request(struct inject_walk *w)
{
    struct json_token k, v;
    unsigned seen = 0;
    int done, rc;

    while ((rc = inject_member(w, &k, &done)) == FG_OK && !done) {
        if (json_string_equals(&k, "uid")) {
            rc = inject_value(w, &v);
            if (rc != FG_OK)
                return rc;
            if (inject_dup(&seen, 1))
                inject_note(w->review_err, "request.uid appears twice");
            w->uid_shape = inject_shape_of(&v);
            if (v.type == JSON_STRING)
                inject_keep(&w->uid, &v, INJECT_MAX_UID);
            rc = inject_skip(w, &v);
        } else if (json_string_equals(&k, "kind")) {
            rc = inject_value(w, &v);
            if (rc != FG_OK)
                return rc;
            if (inject_dup(&seen, 2))
                inject_note(w->pod_err, "request has \"kind\" twice");
            if (v.type == JSON_OBJECT_BEGIN) {
                rc = inject_walk_req_kind(w);
            } else {
                if (v.type != JSON_NULL)
                    inject_note(w->pod_err, "request.kind: expected an object, got %s",
                                inject_shape_name(inject_shape_of(&v)));
                rc = inject_skip(w, &v);
            }
        } else if (json_string_equals(&k, "object")) {
            rc = inject_value(w, &v);
            if (rc != FG_OK)
                return rc;
            if (inject_dup(&seen, 4))
                inject_note(w->pod_err, "request has \"object\" twice");
            w->object = inject_shape_of(&v);
            rc = v.type == JSON_OBJECT_BEGIN ? inject_walk_pod(w) : inject_skip(w, &v);
        } else if (json_string_equals(&k, "operation")) {
            rc = inject_string_member(w, &w->operation, INJECT_MAX_SHORT, w->pod_err,
                                      "request.operation");
        } else if (json_string_equals(&k, "subResource")) {
            rc = inject_string_member(w, &w->sub_resource, INJECT_MAX_SHORT, w->pod_err,
                                      "request.subResource");
        } else if (json_string_equals(&k, "namespace")) {
            rc = inject_string_member(w, &w->req_namespace, INJECT_MAX_NAME, w->pod_err,
                                      "request.namespace");
        } else if (json_string_equals(&k, "name")) {
            rc = inject_string_member(w, &w->req_name, INJECT_MAX_NAME, w->pod_err, "request.name");
        } else {
            rc = json_skip(&w->r, &k);
        }
        if (rc != FG_OK)
            return rc;
    }
    return rc;
}

/* The whole document: an AdmissionReview object, read to its end. */
static int inject_walk_review(struct inject_walk *w)
{
    struct json_token t, v;
    unsigned seen = 0;
    int done, rc;

    rc = json_next(&w->r, &t);
    if (rc != FG_OK)
        return rc;
    if (t.type != JSON_OBJECT_BEGIN) {
        /* Still read to the end, so that a syntax error is reported as such. */
        rc = inject_skip(w, &t);
        if (rc == FG_OK)
            rc = json_next(&w->r, &t);
        return rc;
    }
    w->top_object = 1;
    while ((rc = inject_member(w, &t, &done)) == FG_OK && !done) {
        if (json_string_equals(&t, "apiVersion")) {
            if (inject_dup(&seen, 1))
                inject_note(w->review_err, "apiVersion appears twice");
            rc = inject_string_member(w, &w->api_version, INJECT_MAX_SHORT, w->review_err,
                                      "apiVersion");
        } else if (json_string_equals(&t, "kind")) {
            if (inject_dup(&seen, 2))
                inject_note(w->review_err, "kind appears twice");
            rc = inject_string_member(w, &w->kind, INJECT_MAX_SHORT, w->review_err, "kind");
        } else if (json_string_equals(&t, "request")) {
            rc = inject_value(w, &v);
            if (rc != FG_OK)
                return rc;
            if (inject_dup(&seen, 4))
                inject_note(w->review_err, "request appears twice");
            w->request = inject_shape_of(&v);
            rc = v.type == JSON_OBJECT_BEGIN ? inject_walk_request(w) : inject_skip(w, &v);
        } else {
            rc = json_skip(&w->r, &t);
        }
        if (rc != FG_OK)
            return rc;
    }
    if (rc != FG_OK)
        return rc;
    rc = json_next(&w->r, &t); /* JSON_END, or trailing bytes */
    return rc;
}

/* ---- The decision ------------------------------------------------------------------------- */

/* A ConfigMap name must be a DNS-1123 subdomain: lower-case alphanumerics, '-' and '.', at most
 * 253 bytes, starting and ending with an alphanumeric. */
static int inject_valid_name(const struct inject_str *s)
{
    if (s->len == 0 || s->len > INJECT_MAX_NAME)
        return 0;
    for (size_t i = 0; i < s->len; i++) {
        char c = s->text[i];
        int alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
        if (!alnum && c != '-' && c != '.')
            return 0;
        if (!alnum && (i == 0 || i == s->len - 1))
            return 0;
    }
    return 1;
}

/* Fills res->pod with "namespace/name" for logs. */
static void inject_pod_label(const struct inject_walk *w, struct inject_result *res)
{
    const struct inject_str *ns =
        w->req_namespace.set && w->req_namespace.len > 0 ? &w->req_namespace : &w->meta_namespace;
    const struct inject_str *name =
        w->req_name.set && w->req_name.len > 0 ? &w->req_name : &w->meta_name;
    char sns[INJECT_SHOW_CAP], sname[INJECT_SHOW_CAP];
    int generated = 0;

    if (!(name->set && name->len > 0) && w->meta_generate_name.set) {
        name = &w->meta_generate_name;
        generated = 1;
    }
    if (!name->set && !ns->set)
        return;
    inject_show_str(ns, sns, sizeof(sns));
    inject_show_str(name, sname, sizeof(sname));
    snprintf(res->pod, sizeof(res->pod), "%s/%s%s", sns, sname, generated ? "*" : "");
}

/* An annotation (ann_name) naming a ConfigMap or Secret (kind) to mount as volume vol: 1 with
 * msg written when the name is not an object name or the pod has a volume of that name already
 * (conflict), else 0 (also when the annotation is absent). */
static int inject_mount_unusable(const struct inject_str *ann, const char *ann_name,
                                 const char *kind, const char *vol, int conflict, char *msg)
{
    char shown[INJECT_SHOW_CAP];

    if (!ann->set)
        return 0;
    if (!inject_valid_name(ann)) {
        inject_show_str(ann, shown, sizeof(shown));
        snprintf(msg, INJECT_MAX_MESSAGE,
                 "fencegate: annotation %s is \"%s\", not a %s name (lower-case letters, digits, "
                 "'-' and '.'); no sidecar injected",
                 ann_name, shown, kind);
        return 1;
    }
    if (conflict) {
        snprintf(msg, INJECT_MAX_MESSAGE,
                 "fencegate: the pod already has a volume named %s; rename it or drop annotation "
                 "%s; no sidecar injected",
                 vol, ann_name);
        return 1;
    }
    return 0;
}

/* Why the fencegate.io/app-health-url value cannot be the sidecar's FENCEGATE_APP_HEALTH_URL:
 * 1 with the reason in why (cap bytes), or 0 when it can. Accepted: http://HOST[:PORT][/PATH],
 * at most INJECT_MAX_APP_URL bytes of printable ASCII without spaces; like fencegate's own
 * http:// URLs, no user info, query string or fragment. The sidecar checks the host and port
 * when it starts; this catches the rest of what would stop it there. */
static int inject_url_unusable(const struct inject_url *url, char *why, size_t cap)
{
    static const char scheme[] = "http://";
    const size_t host = sizeof(scheme) - 1; /* where the host starts */
    size_t host_end = host;

    if (url->too_long) {
        snprintf(why, cap, "longer than %d bytes", INJECT_MAX_APP_URL);
        return 1;
    }
    if (url->len < host || memcmp(url->text, scheme, host) != 0) {
        snprintf(why, cap, "not an http:// URL");
        return 1;
    }
    for (size_t i = 0; i < url->len; i++) {
        unsigned char c = (unsigned char)url->text[i];
        if (c <= 0x20 || c >= 0x7f) {
            snprintf(why, cap, "byte %zu is 0x%02X", i, c);
            return 1;
        }
    }
    while (host_end < url->len && strchr("/?#", url->text[host_end]) == NULL)
        host_end++;
    if (host_end == host || url->text[host] == ':') {
        snprintf(why, cap, "no host");
        return 1;
    }
    if (memchr(url->text + host, '@', host_end - host) != NULL) {
        snprintf(why, cap, "user info (USER@) is not supported");
        return 1;
    }
    if (memchr(url->text, '?', url->len) != NULL || memchr(url->text, '#', url->len) != NULL) {
        snprintf(why, cap, "query strings and fragments are not supported");
        return 1;
    }
    return 0;
}

/* The fencegate.io/app-health-url annotation: 1 with msg written when its value is set and not
 * usable (inject_url_unusable()), else 0. Absent or "" (no health gate) is fine. */
static int inject_app_health_unusable(const struct inject_url *url, char *msg)
{
    char shown[INJECT_SHOW_CAP], why[64];

    if (!url->set || url->len == 0 || !inject_url_unusable(url, why, sizeof(why)))
        return 0;
    if (url->too_long)
        snprintf(shown, sizeof(shown), "(%s)", "too long");
    else
        inject_show(url->text, url->len, shown, sizeof(shown));
    snprintf(msg, INJECT_MAX_MESSAGE,
             "fencegate: annotation %s is \"%s\": %s; expected \"\" (no check) or "
             "http://HOST[:PORT][/PATH], at most %d bytes of printable ASCII without spaces; no "
             "sidecar injected",
             INJECT_ANN_APP_HEALTH, shown, why, INJECT_MAX_APP_URL);
    return 1;
}

/* Decides what to answer for a review that has a uid. Returns the outcome; message is filled
 * for the ones that are not routine. */
static enum inject_outcome inject_decide(const struct inject_walk *w, int walk_rc, char *msg)
{
    char shown[INJECT_SHOW_CAP], shown2[INJECT_SHOW_CAP];

    if (walk_rc == FG_ERR_LIMIT) {
        snprintf(msg, INJECT_MAX_MESSAGE,
                 "fencegate: the review is nested deeper than %d levels and was not read; "
                 "no sidecar injected",
                 JSON_MAX_DEPTH);
        return INJECT_UNUSABLE;
    }
    if (w->have_req_kind && !(inject_str_is(&w->req_kind, "Pod") &&
                              (!w->req_group.set || inject_str_is(&w->req_group, "")))) {
        inject_show_str(&w->req_group, shown, sizeof(shown));
        if (w->req_kind.set)
            inject_show_str(&w->req_kind, shown2, sizeof(shown2));
        else
            snprintf(shown2, sizeof(shown2), "(no kind)");
        snprintf(msg, INJECT_MAX_MESSAGE,
                 "fencegate: only Pods are injected, this is %s%s%s; check the webhook's rules",
                 shown, w->req_group.len > 0 ? "/" : "", shown2);
        return INJECT_IGNORED;
    }
    if (!w->operation.set) {
        snprintf(msg, INJECT_MAX_MESSAGE,
                 "fencegate: request.operation is missing; no sidecar injected");
        return INJECT_UNUSABLE;
    }
    if (!inject_str_is(&w->operation, "CREATE") || (w->sub_resource.set && w->sub_resource.len > 0))
        return INJECT_IGNORED;
    if (w->object != INJECT_OBJECT) {
        snprintf(msg, INJECT_MAX_MESSAGE,
                 "fencegate: request.object is %s, not a Pod; no sidecar injected",
                 w->object == INJECT_ABSENT ? "missing" : inject_shape_name(w->object));
        return INJECT_UNUSABLE;
    }
    if (w->ann_err[0] != '\0') {
        snprintf(msg, INJECT_MAX_MESSAGE, "fencegate: %s; no sidecar injected", w->ann_err);
        return INJECT_UNUSABLE;
    }
    if (!w->ann_inject.set || inject_str_is(&w->ann_inject, "false"))
        return INJECT_NOT_REQUESTED;
    if (!inject_str_is(&w->ann_inject, "true")) {
        inject_show_str(&w->ann_inject, shown, sizeof(shown));
        snprintf(msg, INJECT_MAX_MESSAGE,
                 "fencegate: annotation %s is \"%s\"; expected \"true\" or \"false\"; no sidecar "
                 "injected",
                 INJECT_ANN_INJECT, shown);
        return INJECT_UNUSABLE;
    }
    /* The sidecar itself, not the status annotation, says a pod has it: a pod whose template
     * carries the annotation (copied from a running pod) still gets the sidecar it asks for. */
    if (w->has_sidecar)
        return INJECT_ALREADY;
    if (w->pod_err[0] != '\0') {
        snprintf(msg, INJECT_MAX_MESSAGE, "fencegate: %s; no sidecar injected", w->pod_err);
        return INJECT_UNUSABLE;
    }
    if (w->spec != INJECT_OBJECT || w->containers != INJECT_ARRAY || w->ncontainers == 0) {
        snprintf(msg, INJECT_MAX_MESSAGE,
                 "fencegate: the pod has no spec.containers; no sidecar injected");
        return INJECT_UNUSABLE;
    }
    if (w->app_named) {
        snprintf(msg, INJECT_MAX_MESSAGE,
                 "fencegate: spec.containers[%zu] is named " INJECT_CONTAINER
                 ", the injected sidecar's name; rename it; no sidecar injected",
                 w->app_named_at);
        return INJECT_UNUSABLE;
    }
    if (w->host_network) {
        snprintf(msg, INJECT_MAX_MESSAGE,
                 "fencegate: a hostNetwork pod cannot have the sidecar (its HTTP lock API would "
                 "listen on the node's address, port %d, and two such pods on one node clash); "
                 "no sidecar injected",
                 INJECT_HTTP_PORT);
        return INJECT_UNUSABLE;
    }
    if (w->port_err[0] != '\0') {
        snprintf(msg, INJECT_MAX_MESSAGE, "fencegate: %s; no sidecar injected", w->port_err);
        return INJECT_UNUSABLE;
    }
    if (w->ncontainers > INJECT_MAX_CONTAINERS) {
        snprintf(msg, INJECT_MAX_MESSAGE,
                 "fencegate: the pod has %zu containers, more than the %d the injector patches; "
                 "no sidecar injected",
                 w->ncontainers, INJECT_MAX_CONTAINERS);
        return INJECT_UNUSABLE;
    }
    if (inject_mount_unusable(&w->ann_config, INJECT_ANN_CONFIG, "ConfigMap", INJECT_VOLUME,
                              w->volume_conflict, msg) ||
        inject_mount_unusable(&w->ann_secret, INJECT_ANN_SECRET, "Secret", INJECT_SECRET_VOL,
                              w->secret_conflict, msg) ||
        inject_app_health_unusable(&w->ann_app_health, msg))
        return INJECT_UNUSABLE;
    return INJECT_PATCHED;
}

/* ---- The patch ---------------------------------------------------------------------------- */

static void inject_put_env(struct inject_out *o, const char *name, const char *value, int *first)
{
    if (!*first)
        inject_put(o, ",", 1);
    *first = 0;
    inject_puts(o, "{\"name\":");
    inject_put_jcstr(o, name);
    inject_puts(o, ",\"value\":");
    inject_put_jcstr(o, value);
    inject_puts(o, "}");
}

static int inject_set(const char *s)
{
    return s != NULL && s[0] != '\0';
}

/* Writes a {"cpu":..,"memory":..} member named name when either is set. */
static void inject_put_quantities(struct inject_out *o, const char *name, const char *cpu,
                                  const char *memory, int *first)
{
    if (!inject_set(cpu) && !inject_set(memory))
        return;
    if (!*first)
        inject_put(o, ",", 1);
    *first = 0;
    inject_put_jcstr(o, name);
    inject_puts(o, ":{");
    if (inject_set(cpu)) {
        inject_puts(o, "\"cpu\":");
        inject_put_jcstr(o, cpu);
    }
    if (inject_set(memory)) {
        inject_puts(o, inject_set(cpu) ? ",\"memory\":" : "\"memory\":");
        inject_put_jcstr(o, memory);
    }
    inject_puts(o, "}");
}

static void inject_put_probe(struct inject_out *o, const char *name, const char *path, int period_s,
                             int failures)
{
    inject_puts(o, ",\"");
    inject_puts(o, name);
    inject_puts(o, "\":{\"httpGet\":{\"path\":\"");
    inject_puts(o, path);
    inject_puts(o, "\",\"port\":");
    inject_put_int(o, INJECT_HTTP_PORT);
    inject_puts(o, "},\"periodSeconds\":");
    inject_put_int(o, period_s);
    inject_puts(o, ",\"failureThreshold\":");
    inject_put_int(o, failures);
    inject_puts(o, "}");
}

/* The sidecar: a native sidecar (an initContainer that keeps running), so that it starts before
 * the app containers and stops after them. The startup probe holds the app containers back
 * until /readyz answers. A pod with its own ConfigMap gets no cluster-wide backend, upstream,
 * grace, prefix, session TTL or log level variables: the environment overrides the file, and the
 * pod's own file must win. The pod's own health check URL (app_health, NULL for none) is set with
 * or without a ConfigMap: it is the pod's word, overriding the file's app_health.url. */
static void inject_put_sidecar(struct inject_out *o, const struct inject_options *opt,
                               const struct inject_str *config, const struct inject_str *secret,
                               const struct inject_url *app_health)
{
    char addr[32];
    int first = 1;

    inject_puts(o, "{\"name\":\"" INJECT_CONTAINER "\",\"image\":");
    inject_put_jcstr(o, opt->image);
    inject_puts(o, ",\"restartPolicy\":\"Always\"");
    if (config != NULL)
        inject_puts(o, ",\"args\":[\"--config\",\"" INJECT_CONFIG_DIR "/config.yaml\"]");
    inject_puts(o, ",\"env\":[");
    snprintf(addr, sizeof(addr), "0.0.0.0:%d", INJECT_HTTP_PORT);
    inject_put_env(o, "FENCEGATE_LISTEN_HTTP", addr, &first);
    if (config == NULL) {
        if (inject_set(opt->backend))
            inject_put_env(o, "FENCEGATE_BACKEND", opt->backend, &first);
        if (inject_set(opt->upstream))
            inject_put_env(o, "FENCEGATE_UPSTREAM", opt->upstream, &first);
        if (opt->grace_ms >= 0) {
            char ms[32];
            snprintf(ms, sizeof(ms), "%lld", opt->grace_ms);
            inject_put_env(o, "FENCEGATE_SHUTDOWN_GRACE_MS", ms, &first);
        }
        if (inject_set(opt->backend_prefix))
            inject_put_env(o, "FENCEGATE_BACKEND_PREFIX", opt->backend_prefix, &first);
        if (inject_set(opt->session_ttl_ms))
            inject_put_env(o, "FENCEGATE_SESSION_TTL_MS", opt->session_ttl_ms, &first);
        if (inject_set(opt->log_level))
            inject_put_env(o, "FENCEGATE_LOG_LEVEL", opt->log_level, &first);
    }
    if (app_health != NULL)
        inject_put_env(o, INJECT_ENV_APP_HEALTH, app_health->text, &first);
    inject_puts(o, "],\"ports\":[{\"name\":\"fg-resp\",\"containerPort\":");
    inject_put_int(o, INJECT_RESP_PORT);
    inject_puts(o, ",\"protocol\":\"TCP\"},{\"name\":\"fg-http\",\"containerPort\":");
    inject_put_int(o, INJECT_HTTP_PORT);
    inject_puts(o, ",\"protocol\":\"TCP\"}]");
    inject_put_probe(o, "startupProbe", "/readyz", 1, 60);
    inject_put_probe(o, "readinessProbe", "/readyz", 5, 3);
    inject_put_probe(o, "livenessProbe", "/healthz", 10, 3);
    if (inject_set(opt->cpu_request) || inject_set(opt->memory_request) ||
        inject_set(opt->cpu_limit) || inject_set(opt->memory_limit)) {
        first = 1;
        inject_puts(o, ",\"resources\":{");
        inject_put_quantities(o, "requests", opt->cpu_request, opt->memory_request, &first);
        inject_put_quantities(o, "limits", opt->cpu_limit, opt->memory_limit, &first);
        inject_puts(o, "}");
    }
    inject_puts(o, ",\"securityContext\":{\"runAsNonRoot\":true,\"runAsUser\":");
    inject_put_int(o, INJECT_RUN_AS_USER);
    inject_puts(o, ",\"readOnlyRootFilesystem\":true,\"allowPrivilegeEscalation\":false,"
                   "\"capabilities\":{\"drop\":[\"ALL\"]},"
                   "\"seccompProfile\":{\"type\":\"RuntimeDefault\"}}");
    if (config != NULL || secret != NULL) {
        inject_puts(o, ",\"volumeMounts\":[");
        if (config != NULL)
            inject_puts(o, "{\"name\":\"" INJECT_VOLUME "\",\"mountPath\":\"" INJECT_CONFIG_DIR
                           "\",\"readOnly\":true}");
        if (secret != NULL) {
            inject_puts(o, config != NULL ? "," : "");
            inject_puts(o, "{\"name\":\"" INJECT_SECRET_VOL "\",\"mountPath\":\"" INJECT_SECRET_DIR
                           "\",\"readOnly\":true}");
        }
        inject_puts(o, "]");
    }
    inject_puts(o, "}");
}

/* Starts one "add" operation at path (already a JSON Pointer); the caller writes the value and
 * the closing '}'. */
static void inject_op(struct inject_out *o, int *first, const char *path)
{
    inject_puts(o, *first ? "{\"op\":\"add\",\"path\":" : ",{\"op\":\"add\",\"path\":");
    *first = 0;
    inject_put_jcstr(o, path);
    inject_puts(o, ",\"value\":");
}

/* The JSONPatch (RFC 6902). "add" to ".../-" needs an existing array and "add" to a missing
 * member creates it, so each list is either appended to or created whole. The sidecar goes
 * after any existing init containers, which may prepare the network it needs. */
static void inject_put_patch(struct inject_out *o, const struct inject_walk *w,
                             const struct inject_options *opt)
{
    const struct inject_str *config = w->ann_config.set ? &w->ann_config : NULL;
    const struct inject_str *secret = w->ann_secret.set ? &w->ann_secret : NULL;
    const struct inject_url *app_health =
        w->ann_app_health.set && w->ann_app_health.len > 0 ? &w->ann_app_health : NULL;
    int init_arr = w->init_containers == INJECT_ARRAY;
    int vol_arr = w->volumes == INJECT_ARRAY;
    char path[64];
    int first = 1;

    inject_puts(o, "[");
    inject_op(o, &first, init_arr ? "/spec/initContainers/-" : "/spec/initContainers");
    inject_puts(o, init_arr ? "" : "[");
    inject_put_sidecar(o, opt, config, secret, app_health);
    inject_puts(o, init_arr ? "}" : "]}");
    for (int k = 0; k < 2; k++) {
        const struct inject_str *src = k == 0 ? config : secret;
        if (src == NULL)
            continue;
        inject_op(o, &first, vol_arr ? "/spec/volumes/-" : "/spec/volumes");
        inject_puts(o, vol_arr ? "" : "[");
        if (k == 0)
            inject_puts(o, "{\"name\":\"" INJECT_VOLUME "\",\"configMap\":{\"name\":");
        else
            inject_puts(o, "{\"name\":\"" INJECT_SECRET_VOL "\",\"secret\":{\"secretName\":");
        inject_put_jstr(o, src->text, src->len);
        inject_puts(o, "}}");
        inject_puts(o, vol_arr ? "}" : "]}");
        vol_arr = 1; /* the list exists now */
    }
    for (size_t i = 0; i < w->ncontainers; i++) {
        static const char *const names[2] = {INJECT_ENV_RESP, INJECT_ENV_HTTP};
        static const int ports[2] = {INJECT_RESP_PORT, INJECT_HTTP_PORT};
        int arr = w->env_shape[i] == INJECT_ARRAY;
        int efirst = 1;
        if (!arr) {
            snprintf(path, sizeof(path), "/spec/containers/%zu/env", i);
            inject_op(o, &first, path);
            inject_puts(o, "[");
        }
        for (int k = 0; k < 2; k++) {
            char addr[32];
            if (w->env_has[i] & (1u << k))
                continue; /* the container set it itself: its value stands */
            if (arr) {
                snprintf(path, sizeof(path), "/spec/containers/%zu/env/-", i);
                inject_op(o, &first, path);
                efirst = 1;
            }
            snprintf(addr, sizeof(addr), "127.0.0.1:%d", ports[k]);
            inject_put_env(o, names[k], addr, &efirst);
            if (arr)
                inject_puts(o, "}");
        }
        if (!arr)
            inject_puts(o, "]}");
    }
    /* The annotation that asked for the sidecar lives in metadata.annotations, so that object
     * exists. '/' in a member name is "~1" in a JSON Pointer (RFC 6901). */
    inject_op(o, &first, "/metadata/annotations/fencegate.io~1status");
    inject_puts(o, "\"injected\"}]");
}

/* ---- Entry points ------------------------------------------------------------------------- */

/* Sets res to the error outcome with body {"error": message}. Returns code, or FG_ERR_NOMEM. */
static int inject_fail(struct inject_result *res, int code, const char *fmt, ...) FG_PRINTF(3, 4);
static int inject_fail(struct inject_result *res, int code, const char *fmt, ...)
{
    struct inject_out o = {NULL, 0, 0, INJECT_MAX_RESPONSE, FG_OK};
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(res->message, sizeof(res->message), fmt, ap);
    va_end(ap);
    res->outcome = INJECT_ERROR;
    inject_puts(&o, "{\"error\":");
    inject_put_jcstr(&o, res->message);
    inject_puts(&o, "}");
    if (o.err != FG_OK) {
        free(o.data);
        return FG_ERR_NOMEM;
    }
    res->body = o.data;
    res->body_len = o.len;
    return code;
}

int inject_options_check(const struct inject_options *opt, char *err, size_t errlen)
{
    const char *names[] = {"image",          "cpu_request", "memory_request", "cpu_limit",
                           "memory_limit",   "backend",     "upstream",       "backend_prefix",
                           "session_ttl_ms", "log_level"};
    const char *vals[] = {
        opt->image,   opt->cpu_request, opt->memory_request, opt->cpu_limit,      opt->memory_limit,
        opt->backend, opt->upstream,    opt->backend_prefix, opt->session_ttl_ms, opt->log_level};

    if (errlen > 0)
        err[0] = '\0';
    if (!inject_set(opt->image)) {
        snprintf(err, errlen, "image: must be set (the sidecar's container image)");
        return FG_ERR_CONFIG;
    }
    for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
        size_t n;
        if (vals[i] == NULL)
            continue;
        n = strlen(vals[i]);
        if (n > INJECT_MAX_OPTION) {
            snprintf(err, errlen, "%s: %zu bytes, longer than %d", names[i], n, INJECT_MAX_OPTION);
            return FG_ERR_CONFIG;
        }
        for (size_t k = 0; k < n; k++) {
            unsigned char c = (unsigned char)vals[i][k];
            if (c <= 0x20 || c >= 0x7f) {
                snprintf(err, errlen,
                         "%s: byte %zu is 0x%02X; only printable ASCII without "
                         "spaces is accepted",
                         names[i], k, c);
                return FG_ERR_CONFIG;
            }
        }
    }
    if (opt->grace_ms > INJECT_GRACE_MAX) {
        snprintf(err, errlen, "grace_ms: %lld is more than %d", opt->grace_ms, INJECT_GRACE_MAX);
        return FG_ERR_CONFIG;
    }
    return FG_OK;
}

/* Reads the review, decides, writes the answer; see inject.h. The walk reads the whole document
 * once and records what it meets; the decision is made afterwards, so member order does not
 * matter. */
int inject_review(const char *body, size_t len, const struct inject_options *opt,
                  struct inject_result *res)
{
    struct inject_walk *w;
    struct inject_out o = {NULL, 0, 0, INJECT_MAX_RESPONSE, FG_OK};
    struct inject_out patch = {NULL, 0, 0, INJECT_MAX_RESPONSE, FG_OK};
    enum inject_outcome outcome;
    char msg[INJECT_MAX_MESSAGE] = "";
    int rc;

    memset(res, 0, sizeof(*res));
    if (len > INJECT_MAX_BODY)
        return inject_fail(res, FG_ERR_LIMIT,
                           "the AdmissionReview is %zu bytes; the limit is %d bytes", len,
                           INJECT_MAX_BODY);
    w = calloc(1, sizeof(*w));
    if (w == NULL)
        return FG_ERR_NOMEM;
    json_reader_init(&w->r, body, len);
    rc = inject_walk_review(w);
    inject_pod_label(w, res);

    /* Without a uid there is no review to answer: these are HTTP errors. */
    if (rc == FG_ERR_PROTO) {
        rc = inject_fail(res, FG_ERR_PROTO, "invalid JSON: %s", json_reader_error(&w->r));
        goto out;
    }
    if (!w->top_object) {
        rc = inject_fail(res, FG_ERR_PROTO, "expected an AdmissionReview object");
        goto out;
    }
    if (w->kind.set && !inject_str_is(&w->kind, "AdmissionReview")) {
        char shown[INJECT_SHOW_CAP];
        inject_show_str(&w->kind, shown, sizeof(shown));
        rc = inject_fail(res, FG_ERR_PROTO, "kind is \"%s\", expected \"AdmissionReview\"", shown);
        goto out;
    }
    if (w->api_version.set && !inject_str_is(&w->api_version, "admission.k8s.io/v1") &&
        !inject_str_is(&w->api_version, "admission.k8s.io/v1beta1")) {
        char shown[INJECT_SHOW_CAP];
        inject_show_str(&w->api_version, shown, sizeof(shown));
        rc = inject_fail(res, FG_ERR_PROTO,
                         "apiVersion is \"%s\", expected \"admission.k8s.io/v1\"", shown);
        goto out;
    }
    if (w->review_err[0] != '\0') {
        rc = inject_fail(res, FG_ERR_PROTO, "%s", w->review_err);
        goto out;
    }
    if (w->request != INJECT_OBJECT && rc == FG_OK) {
        if (w->request == INJECT_ABSENT)
            rc = inject_fail(res, FG_ERR_PROTO, "request is missing");
        else
            rc = inject_fail(res, FG_ERR_PROTO, "request: expected an object, got %s",
                             inject_shape_name(w->request));
        goto out;
    }
    if (w->uid_shape != INJECT_STRING || w->uid.len == 0 || w->uid.len > INJECT_MAX_UID) {
        rc = inject_fail(res, FG_ERR_PROTO, "request.uid: %s",
                         w->uid_shape == INJECT_ABSENT   ? "missing"
                         : w->uid_shape != INJECT_STRING ? "expected a string"
                         : w->uid.len == 0               ? "empty"
                                                         : "longer than 128 bytes");
        goto out;
    }

    outcome = inject_decide(w, rc, msg);
    if (outcome == INJECT_PATCHED) {
        inject_put_patch(&patch, w, opt);
        if (patch.err != FG_OK) {
            rc = patch.err == FG_ERR_NOMEM
                     ? FG_ERR_NOMEM
                     : inject_fail(res, FG_ERR_LIMIT, "the patch is larger than %d bytes",
                                   INJECT_MAX_RESPONSE);
            goto out;
        }
    }
    inject_puts(&o, "{\"apiVersion\":");
    inject_put_jstr(&o, w->api_version.set ? w->api_version.text : "admission.k8s.io/v1",
                    w->api_version.set ? w->api_version.len : strlen("admission.k8s.io/v1"));
    inject_puts(&o, ",\"kind\":\"AdmissionReview\",\"response\":{\"uid\":");
    inject_put_jstr(&o, w->uid.text, w->uid.len);
    inject_puts(&o, ",\"allowed\":true");
    if (outcome == INJECT_PATCHED) {
        inject_puts(&o, ",\"patchType\":\"JSONPatch\",\"patch\":\"");
        inject_put_base64(&o, (const unsigned char *)patch.data, patch.len);
        inject_puts(&o, "\"");
    }
    if (msg[0] != '\0') {
        /* status.message for the API server's logs, a warning for the pod's owner. */
        inject_puts(&o, ",\"status\":{\"message\":");
        inject_put_jcstr(&o, msg);
        inject_puts(&o, "},\"warnings\":[");
        inject_put_jcstr(&o, msg);
        inject_puts(&o, "]");
    }
    inject_puts(&o, "}}");
    if (o.err != FG_OK) {
        rc = o.err == FG_ERR_NOMEM
                 ? FG_ERR_NOMEM
                 : inject_fail(res, FG_ERR_LIMIT, "the response is larger than %d bytes",
                               INJECT_MAX_RESPONSE);
        goto out;
    }
    res->outcome = outcome;
    snprintf(res->message, sizeof(res->message), "%s", msg);
    res->body = o.data;
    res->body_len = o.len;
    o.data = NULL;
    rc = FG_OK;
out:
    free(o.data);
    free(patch.data);
    free(w);
    return rc;
}

void inject_result_free(struct inject_result *res)
{
    if (res == NULL)
        return;
    free(res->body);
    memset(res, 0, sizeof(*res));
}
