/* test_inject.c — unit tests of the admission review reader and the sidecar JSONPatch it writes. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "inject.h"
#include "json.h"

#define FIXTURE_MAX (1024 * 1024)
#define DOC_MAX     (256 * 1024)
#define VAL_MAX     (64 * 1024)

/* ---- Helpers ------------------------------------------------------------------------------- */

struct fixture {
    char *data; /* exactly len bytes, so that AddressSanitizer traps a read past the end */
    size_t len;
};

static struct fixture load_fixture(const char *name)
{
    char path[1024];
    char *tmp = malloc(FIXTURE_MAX);
    struct fixture fx;
    FILE *f;
    int n = snprintf(path, sizeof(path), "%s/admission/%s", FG_FIXTURES, name);

    assert_true(n > 0 && (size_t)n < sizeof(path));
    assert_non_null(tmp);
    f = fopen(path, "rb");
    assert_non_null(f);
    fx.len = fread(tmp, 1, FIXTURE_MAX, f);
    assert_true(feof(f));
    fclose(f);
    assert_true(fx.len > 0);
    fx.data = malloc(fx.len);
    assert_non_null(fx.data);
    memcpy(fx.data, tmp, fx.len);
    free(tmp);
    return fx;
}

/* The options the injector's defaults give, plus a backend and an upstream. */
static const struct inject_options full_opts = {
    .image = "fencegate:test",
    .cpu_request = "50m",
    .memory_request = "16Mi",
    .cpu_limit = "500m",
    .memory_limit = "64Mi",
    .backend = "etcd://etcd-0.etcd:2379",
    .upstream = "redis://redis.shop:6379",
    .grace_ms = 15000,
};

/* A document built with printf-style formatting (heap, exactly its length). */
static struct fixture mkdoc(const char *fmt, ...) FG_PRINTF(1, 2);
static struct fixture mkdoc(const char *fmt, ...)
{
    char *buf = malloc(DOC_MAX);
    struct fixture fx;
    va_list ap;
    int n;

    assert_non_null(buf);
    va_start(ap, fmt);
    n = vsnprintf(buf, DOC_MAX, fmt, ap);
    va_end(ap);
    assert_true(n > 0 && n < DOC_MAX);
    fx.len = (size_t)n;
    fx.data = malloc(fx.len);
    assert_non_null(fx.data);
    memcpy(fx.data, buf, fx.len);
    free(buf);
    return fx;
}

/* A CREATE review of a pod with the given annotations object and spec object. */
#define POD_REVIEW(ann, spec)                                                                      \
    "{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\",\"request\":{"           \
    "\"uid\":\"u-1\",\"kind\":{\"group\":\"\",\"version\":\"v1\",\"kind\":\"Pod\"},"               \
    "\"operation\":\"CREATE\",\"namespace\":\"ns\",\"object\":{\"apiVersion\":\"v1\","             \
    "\"kind\":\"Pod\",\"metadata\":{\"name\":\"p\",\"annotations\":" ann "},\"spec\":" spec "}}}"
#define ANN_ON   "{\"fencegate.io/inject\":\"true\"}"
#define SPEC_ONE "{\"containers\":[{\"name\":\"app\",\"image\":\"app:1\"}]}"

/* Finds the value at path ("a.b.0.c": members and array indexes) in doc. Returns its type
 * (JSON_NONE when absent); out receives the decoded text of a string, else the raw JSON text
 * of the value (whole containers included). The document must be valid JSON. */
static enum json_type jget(const char *doc, size_t len, const char *path, char *out, size_t cap)
{
    struct json_reader r;
    struct json_token t, k;
    const char *seg = path;
    size_t outlen = 0;

    json_reader_init(&r, doc, len);
    assert_int_equal(json_next(&r, &t), FG_OK);
    while (seg != NULL && *seg != '\0') {
        const char *dot = strchr(seg, '.');
        size_t sl = dot ? (size_t)(dot - seg) : strlen(seg);
        char name[128];
        int found = 0;

        assert_true(sl < sizeof(name));
        memcpy(name, seg, sl);
        name[sl] = '\0';
        seg = dot ? dot + 1 : NULL;
        if (t.type == JSON_OBJECT_BEGIN) {
            for (;;) {
                assert_int_equal(json_next(&r, &k), FG_OK);
                if (k.type == JSON_OBJECT_END)
                    break;
                if (json_string_equals(&k, name)) {
                    assert_int_equal(json_next(&r, &t), FG_OK);
                    found = 1;
                    break;
                }
                assert_int_equal(json_skip(&r, &k), FG_OK);
            }
        } else if (t.type == JSON_ARRAY_BEGIN) {
            char *end;
            unsigned long want = strtoul(name, &end, 10);
            assert_true(*end == '\0');
            for (unsigned long i = 0;; i++) {
                assert_int_equal(json_next(&r, &t), FG_OK);
                if (t.type == JSON_ARRAY_END)
                    break;
                if (i == want) {
                    found = 1;
                    break;
                }
                assert_int_equal(json_skip(&r, &t), FG_OK);
            }
        }
        if (!found) {
            if (cap > 0)
                out[0] = '\0';
            return JSON_NONE;
        }
    }
    if (t.type == JSON_STRING) {
        assert_int_equal(json_unescape(t.ptr, t.len, out, cap, &outlen), FG_OK);
    } else if (t.type == JSON_OBJECT_BEGIN || t.type == JSON_ARRAY_BEGIN) {
        size_t start = t.off;
        assert_int_equal(json_skip(&r, &t), FG_OK);
        assert_true(r.pos - start < cap);
        memcpy(out, doc + start, r.pos - start);
        out[r.pos - start] = '\0';
    } else {
        assert_true(t.len < cap);
        memcpy(out, t.ptr, t.len);
        out[t.len] = '\0';
    }
    return t.type;
}

/* Asserts that the string at path is want. */
static void expect_str(const char *doc, size_t len, const char *path, const char *want)
{
    static char got[VAL_MAX];
    enum json_type type = jget(doc, len, path, got, sizeof(got));
    if (type != JSON_STRING)
        fail_msg("%s: expected the string \"%s\", found type %d", path, want, (int)type);
    assert_string_equal(got, want);
}

/* Asserts that the non-string value at path has exactly the JSON text want. */
static void expect_raw(const char *doc, size_t len, const char *path, const char *want)
{
    static char got[VAL_MAX];
    enum json_type type = jget(doc, len, path, got, sizeof(got));
    if (type == JSON_NONE || type == JSON_STRING)
        fail_msg("%s: expected %s, found type %d", path, want, (int)type);
    assert_string_equal(got, want);
}

static void expect_absent(const char *doc, size_t len, const char *path)
{
    static char got[VAL_MAX];
    assert_int_equal(jget(doc, len, path, got, sizeof(got)), JSON_NONE);
}

/* The number of elements of the array at path. */
static size_t array_len(const char *doc, size_t len, const char *path)
{
    static char got[VAL_MAX * 4];
    struct json_reader r;
    struct json_token t;
    size_t n = 0;

    assert_int_equal(jget(doc, len, path, got, sizeof(got)), JSON_ARRAY_BEGIN);
    json_reader_init(&r, got, strlen(got));
    assert_int_equal(json_next(&r, &t), FG_OK);
    for (;;) {
        assert_int_equal(json_next(&r, &t), FG_OK);
        if (t.type == JSON_ARRAY_END)
            return n;
        assert_int_equal(json_skip(&r, &t), FG_OK);
        n++;
    }
}

/* Asserts that doc[0..len) is one valid JSON document. */
static void expect_valid_json(const char *doc, size_t len)
{
    struct json_reader r;
    struct json_token t;

    json_reader_init(&r, doc, len);
    do {
        if (json_next(&r, &t) != FG_OK)
            fail_msg("invalid JSON in the output: %s\n%.*s", json_reader_error(&r), (int)len, doc);
    } while (t.type != JSON_END);
}

static int b64val(char c)
{
    const char *a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    const char *p = strchr(a, c);
    return c != '\0' && p != NULL ? (int)(p - a) : -1;
}

/* Decodes padded standard base64; fails the test on any invalid character or length. */
static char *b64decode(const char *s, size_t *outlen)
{
    size_t n = strlen(s), o = 0;
    char *out = malloc(n / 4 * 3 + 1);

    assert_non_null(out);
    assert_int_equal(n % 4, 0);
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        for (int k = 0; k < 4; k++) {
            v[k] = s[i + k] == '=' ? 0 : b64val(s[i + k]);
            assert_true(v[k] >= 0);
            if (s[i + k] == '=')
                assert_true(i + 4 == n && k >= 2);
        }
        unsigned long x = (unsigned long)v[0] << 18 | (unsigned long)v[1] << 12 |
                          (unsigned long)v[2] << 6 | (unsigned long)v[3];
        out[o++] = (char)(x >> 16);
        if (s[i + 2] != '=')
            out[o++] = (char)(x >> 8 & 0xff);
        if (s[i + 3] != '=')
            out[o++] = (char)(x & 0xff);
    }
    out[o] = '\0';
    *outlen = o;
    return out;
}

/* Runs inject_review on fx, checks the return code and that the body is valid JSON. */
static void review(const struct fixture *fx, const struct inject_options *opt, int want_rc,
                   struct inject_result *res)
{
    int rc = inject_review(fx->data, fx->len, opt, res);
    if (rc != want_rc)
        fail_msg("inject_review returned %d, expected %d; message: %s", rc, want_rc, res->message);
    assert_non_null(res->body);
    assert_int_equal(strlen(res->body), res->body_len);
    assert_true(res->body_len <= INJECT_MAX_RESPONSE);
    expect_valid_json(res->body, res->body_len);
    if (rc != FG_OK) {
        assert_int_equal(res->outcome, INJECT_ERROR);
        expect_str(res->body, res->body_len, "error", res->message);
        assert_true(res->message[0] != '\0');
    }
}

/* Checks the envelope of an FG_OK answer: same uid, allowed, and a patch exactly when patched.
 * Returns the decoded patch (NULL when there is none); the caller frees it. */
static char *answer(const struct inject_result *res, const char *uid, size_t *plen)
{
    static char got[INJECT_MAX_RESPONSE];
    const char *b = res->body;
    size_t n = res->body_len;

    expect_str(b, n, "apiVersion", "admission.k8s.io/v1");
    expect_str(b, n, "kind", "AdmissionReview");
    expect_str(b, n, "response.uid", uid);
    expect_raw(b, n, "response.allowed", "true");
    if (res->outcome != INJECT_PATCHED) {
        expect_absent(b, n, "response.patch");
        expect_absent(b, n, "response.patchType");
        if (res->message[0] != '\0') {
            expect_str(b, n, "response.status.message", res->message);
            expect_str(b, n, "response.warnings.0", res->message);
        } else {
            expect_absent(b, n, "response.status");
            expect_absent(b, n, "response.warnings");
        }
        return NULL;
    }
    assert_string_equal(res->message, "");
    expect_absent(b, n, "response.status");
    expect_str(b, n, "response.patchType", "JSONPatch");
    assert_int_equal(jget(b, n, "response.patch", got, sizeof(got)), JSON_STRING);
    char *patch = b64decode(got, plen);
    expect_valid_json(patch, *plen);
    return patch;
}

static void expect_op(const char *p, size_t n, int i, const char *path)
{
    char at[64];
    snprintf(at, sizeof(at), "%d.op", i);
    expect_str(p, n, at, "add");
    snprintf(at, sizeof(at), "%d.path", i);
    expect_str(p, n, at, path);
}

/* Checks the parts of the sidecar container at prefix (e.g. "0.value.0") every pod gets. */
static void expect_sidecar(const char *p, size_t n, const char *prefix, const char *image)
{
    static const char *const strs[][2] = {
        {"name", "fencegate"},
        {"restartPolicy", "Always"},
        {"env.0.name", "FENCEGATE_LISTEN_HTTP"},
        {"env.0.value", "0.0.0.0:8380"},
        {"ports.0.protocol", "TCP"},
        {"startupProbe.httpGet.path", "/readyz"},
        {"readinessProbe.httpGet.path", "/readyz"},
        {"livenessProbe.httpGet.path", "/healthz"},
        {"securityContext.capabilities.drop.0", "ALL"},
        {"securityContext.seccompProfile.type", "RuntimeDefault"},
    };
    static const char *const raws[][2] = {
        {"ports.0.containerPort", "6380"},
        {"ports.1.containerPort", "8380"},
        {"startupProbe.httpGet.port", "8380"},
        {"startupProbe.periodSeconds", "1"},
        {"startupProbe.failureThreshold", "60"},
        {"readinessProbe.httpGet.port", "8380"},
        {"livenessProbe.httpGet.port", "8380"},
        {"securityContext.runAsNonRoot", "true"},
        {"securityContext.runAsUser", "65532"},
        {"securityContext.readOnlyRootFilesystem", "true"},
        {"securityContext.allowPrivilegeEscalation", "false"},
    };
    char at[160];

    snprintf(at, sizeof(at), "%s.image", prefix);
    expect_str(p, n, at, image);
    for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++) {
        snprintf(at, sizeof(at), "%s.%s", prefix, strs[i][0]);
        expect_str(p, n, at, strs[i][1]);
    }
    for (size_t i = 0; i < sizeof(raws) / sizeof(raws[0]); i++) {
        snprintf(at, sizeof(at), "%s.%s", prefix, raws[i][0]);
        expect_raw(p, n, at, raws[i][1]);
    }
    snprintf(at, sizeof(at), "%s.ports", prefix);
    assert_int_equal(array_len(p, n, at), 2);
    snprintf(at, sizeof(at), "%s.securityContext.capabilities.drop", prefix);
    assert_int_equal(array_len(p, n, at), 1);
}

/* The two variables an app container gets, as one "add" value (an array or one object). */
#define ENV_RESP "{\"name\":\"FENCEGATE_RESP_ADDR\",\"value\":\"127.0.0.1:6380\"}"
#define ENV_HTTP "{\"name\":\"FENCEGATE_HTTP_ADDR\",\"value\":\"127.0.0.1:8380\"}"

/* ---- Fixtures: pods that get the sidecar --------------------------------------------------- */

static void test_annotated_pod(void **state)
{
    struct fixture fx = load_fixture("annotated.json");
    struct inject_result res;
    size_t n;
    char *p;

    review(&fx, &full_opts, FG_OK, &res);
    assert_int_equal(res.outcome, INJECT_PATCHED);
    assert_string_equal(res.pod, "shop/orders-7c9d5b8f6d-*");
    p = answer(&res, "705ab4f5-6393-11e8-b7cc-42010a800002", &n);
    assert_int_equal(array_len(p, n, ""), 3);

    /* No initContainers yet: the list is created holding the sidecar alone. */
    expect_op(p, n, 0, "/spec/initContainers");
    assert_int_equal(array_len(p, n, "0.value"), 1);
    expect_sidecar(p, n, "0.value.0", "fencegate:test");
    expect_absent(p, n, "0.value.0.args");
    expect_absent(p, n, "0.value.0.volumeMounts");
    assert_int_equal(array_len(p, n, "0.value.0.env"), 4);
    expect_str(p, n, "0.value.0.env.1.name", "FENCEGATE_BACKEND");
    expect_str(p, n, "0.value.0.env.1.value", "etcd://etcd-0.etcd:2379");
    expect_str(p, n, "0.value.0.env.2.name", "FENCEGATE_UPSTREAM");
    expect_str(p, n, "0.value.0.env.2.value", "redis://redis.shop:6379");
    expect_str(p, n, "0.value.0.env.3.name", "FENCEGATE_SHUTDOWN_GRACE_MS");
    expect_str(p, n, "0.value.0.env.3.value", "15000");
    expect_raw(p, n, "0.value.0.resources",
               "{\"requests\":{\"cpu\":\"50m\",\"memory\":\"16Mi\"},"
               "\"limits\":{\"cpu\":\"500m\",\"memory\":\"64Mi\"}}");

    /* The app container had no env: it is created with both addresses. */
    expect_op(p, n, 1, "/spec/containers/0/env");
    expect_raw(p, n, "1.value", "[" ENV_RESP "," ENV_HTTP "]");

    /* The annotation, with '/' escaped as ~1 in the pointer. */
    expect_op(p, n, 2, "/metadata/annotations/fencegate.io~1status");
    expect_str(p, n, "2.value", "injected");
    free(p);
    inject_result_free(&res);
    free(fx.data);
}

static void test_annotated_pod_with_config(void **state)
{
    struct fixture fx = load_fixture("annotated_config.json");
    struct inject_result res;
    size_t n;
    char *p;

    review(&fx, &full_opts, FG_OK, &res);
    assert_int_equal(res.outcome, INJECT_PATCHED);
    p = answer(&res, "1f6c2b8a-3d4e-4f5a-8b9c-0d1e2f3a4b5c", &n);
    assert_int_equal(array_len(p, n, ""), 4);
    expect_op(p, n, 0, "/spec/initContainers");
    expect_sidecar(p, n, "0.value.0", "fencegate:test");
    expect_raw(p, n, "0.value.0.args", "[\"--config\",\"/etc/fencegate/config.yaml\"]");
    expect_raw(p, n, "0.value.0.volumeMounts",
               "[{\"name\":\"fencegate-config\",\"mountPath\":\"/etc/fencegate\","
               "\"readOnly\":true}]");
    /* The pod's own file decides the backend, upstream and grace: only the probe address. */
    assert_int_equal(array_len(p, n, "0.value.0.env"), 1);
    /* The pod has volumes: ours is appended. */
    expect_op(p, n, 1, "/spec/volumes/-");
    expect_raw(p, n, "1.value",
               "{\"name\":\"fencegate-config\",\"configMap\":{\"name\":\"orders-fencegate\"}}");
    expect_op(p, n, 2, "/spec/containers/0/env");
    expect_op(p, n, 3, "/metadata/annotations/fencegate.io~1status");
    free(p);
    inject_result_free(&res);
    free(fx.data);
}

/* A Secret beside the ConfigMap, in a pod without volumes: the first volume creates the list,
 * the second is appended to it; the sidecar mounts both read-only. */
static void test_annotated_pod_with_config_and_secret(void **state)
{
    static const char doc[] =
        POD_REVIEW("{\"fencegate.io/inject\":\"true\",\"fencegate.io/config\":\"cfg\","
                   "\"fencegate.io/secret\":\"etcd-creds\"}",
                   "{\"containers\":[{\"name\":\"a\"}]}");
    struct fixture fx = {(char *)doc, sizeof(doc) - 1};
    struct inject_result res;
    size_t n;
    char *p;

    review(&fx, &full_opts, FG_OK, &res);
    assert_int_equal(res.outcome, INJECT_PATCHED);
    p = answer(&res, "u-1", &n);
    expect_raw(p, n, "0.value.0.volumeMounts",
               "[{\"name\":\"fencegate-config\",\"mountPath\":\"/etc/fencegate\","
               "\"readOnly\":true},{\"name\":\"fencegate-secret\",\"mountPath\":"
               "\"/etc/fencegate-secret\",\"readOnly\":true}]");
    expect_op(p, n, 1, "/spec/volumes");
    expect_raw(p, n, "1.value",
               "[{\"name\":\"fencegate-config\",\"configMap\":{\"name\":\"cfg\"}}]");
    expect_op(p, n, 2, "/spec/volumes/-");
    expect_raw(p, n, "2.value",
               "{\"name\":\"fencegate-secret\",\"secret\":{\"secretName\":\"etcd-creds\"}}");
    free(p);
    inject_result_free(&res);
}

/* The value of the sidecar's variable name (at prefix, e.g. "0.value.0"), or NULL when the
 * sidecar does not have it; fails on a duplicate. The result is overwritten by the next call. */
static const char *sidecar_env(const char *p, size_t n, const char *prefix, const char *name)
{
    static char value[VAL_MAX];
    char at[160], got[256];
    size_t count;
    int found = 0;

    snprintf(at, sizeof(at), "%s.env", prefix);
    count = array_len(p, n, at);
    for (size_t i = 0; i < count; i++) {
        snprintf(at, sizeof(at), "%s.env.%zu.name", prefix, i);
        assert_int_equal(jget(p, n, at, got, sizeof(got)), JSON_STRING);
        if (strcmp(got, name) != 0)
            continue;
        assert_false(found);
        found = 1;
        snprintf(at, sizeof(at), "%s.env.%zu.value", prefix, i);
        assert_int_equal(jget(p, n, at, value, sizeof(value)), JSON_STRING);
    }
    return found ? value : NULL;
}

/* The chart's sidecar.backend.prefix, sessionTtlMs and logLevel reach a pod without a ConfigMap
 * too: without them, pods with and pods without the fencegate.io/config annotation took the
 * same lock under different backend keys (and counters), so both could hold it at once. With
 * a ConfigMap the pod's file decides, as for the backend URL. */
static void test_backend_prefix_ttl_and_log_level(void **state)
{
    struct inject_options opt = full_opts;
    struct fixture fx = mkdoc(POD_REVIEW(ANN_ON, SPEC_ONE));
    struct fixture fc = mkdoc(
        POD_REVIEW("{\"fencegate.io/inject\":\"true\",\"fencegate.io/config\":\"cfg\"}", SPEC_ONE));
    struct inject_result res;
    const char *v;
    size_t n;
    char *p;

    opt.backend_prefix = "/shop/locks/";
    opt.session_ttl_ms = "15000";
    opt.log_level = "debug";
    review(&fx, &opt, FG_OK, &res);
    assert_int_equal(res.outcome, INJECT_PATCHED);
    p = answer(&res, "u-1", &n);
    v = sidecar_env(p, n, "0.value.0", "FENCEGATE_BACKEND_PREFIX");
    assert_non_null(v);
    assert_string_equal(v, "/shop/locks/");
    v = sidecar_env(p, n, "0.value.0", "FENCEGATE_SESSION_TTL_MS");
    assert_non_null(v);
    assert_string_equal(v, "15000");
    v = sidecar_env(p, n, "0.value.0", "FENCEGATE_LOG_LEVEL");
    assert_non_null(v);
    assert_string_equal(v, "debug");
    free(p);
    inject_result_free(&res);

    review(&fc, &opt, FG_OK, &res);
    assert_int_equal(res.outcome, INJECT_PATCHED);
    p = answer(&res, "u-1", &n);
    assert_null(sidecar_env(p, n, "0.value.0", "FENCEGATE_BACKEND_PREFIX"));
    assert_null(sidecar_env(p, n, "0.value.0", "FENCEGATE_SESSION_TTL_MS"));
    assert_null(sidecar_env(p, n, "0.value.0", "FENCEGATE_LOG_LEVEL"));
    free(p);
    inject_result_free(&res);

    /* Unset (NULL or ""): left out, the sidecar's defaults apply. */
    review(&fx, &full_opts, FG_OK, &res);
    p = answer(&res, "u-1", &n);
    assert_null(sidecar_env(p, n, "0.value.0", "FENCEGATE_BACKEND_PREFIX"));
    assert_null(sidecar_env(p, n, "0.value.0", "FENCEGATE_SESSION_TTL_MS"));
    assert_null(sidecar_env(p, n, "0.value.0", "FENCEGATE_LOG_LEVEL"));
    free(p);
    inject_result_free(&res);
    free(fx.data);
    free(fc.data);
}

/* A review of a pod with ann (the annotations object) and one app container, patched. Returns
 * the decoded patch; the caller frees it. */
static char *patched(const char *ann, size_t *n)
{
    struct fixture fx = mkdoc(POD_REVIEW("%s", SPEC_ONE), ann);
    struct inject_result res;
    char *p;

    review(&fx, &full_opts, FG_OK, &res);
    if (res.outcome != INJECT_PATCHED)
        fail_msg("outcome %d, expected a patch; message: %s", (int)res.outcome, res.message);
    p = answer(&res, "u-1", n);
    inject_result_free(&res);
    free(fx.data);
    return p;
}

/* fencegate.io/app-health-url becomes the sidecar's FENCEGATE_APP_HEALTH_URL, exactly, after
 * the other variables; with a ConfigMap too (the pod's annotation overrides the file's
 * app_health.url). Absent or "": no variable. */
static void test_app_health_url(void **state)
{
    static const char *const ok[] = {"http://[::1]:8080/healthz", "http://app",
                                     "http://app.shop.svc:8080", "http://app/a@b:c/"};
    static char longest[INJECT_MAX_APP_URL + 1];
    static char ann[2 * INJECT_MAX_APP_URL];
    size_t n;
    char *p;

    p = patched("{\"fencegate.io/inject\":\"true\","
                "\"fencegate.io/app-health-url\":\"http://127.0.0.1:8080/healthz\"}",
                &n);
    expect_sidecar(p, n, "0.value.0", "fencegate:test");
    assert_int_equal(array_len(p, n, "0.value.0.env"), 5);
    expect_str(p, n, "0.value.0.env.4.name", "FENCEGATE_APP_HEALTH_URL");
    expect_str(p, n, "0.value.0.env.4.value", "http://127.0.0.1:8080/healthz");
    expect_str(p, n, "0.value.0.env.1.name", "FENCEGATE_BACKEND");
    /* The app containers get only the two addresses. */
    expect_raw(p, n, "1.value", "[" ENV_RESP "," ENV_HTTP "]");
    free(p);

    /* With the pod's own ConfigMap: the probe address and the URL. JSON escapes are decoded
     * and the value written back escaped. */
    p = patched(
        "{\"fencegate.io/app-health-url\":\"http:\\/\\/app:8080\\/ready\\u002dnow\\\"1\\\"\","
        "\"fencegate.io/inject\":\"true\",\"fencegate.io/config\":\"cfg\"}",
        &n);
    assert_int_equal(array_len(p, n, "0.value.0.env"), 2);
    expect_str(p, n, "0.value.0.env.0.name", "FENCEGATE_LISTEN_HTTP");
    expect_str(p, n, "0.value.0.env.1.name", "FENCEGATE_APP_HEALTH_URL");
    expect_str(p, n, "0.value.0.env.1.value", "http://app:8080/ready-now\"1\"");
    expect_raw(p, n, "0.value.0.args", "[\"--config\",\"/etc/fencegate/config.yaml\"]");
    free(p);

    /* The longest value accepted. */
    memcpy(longest, "http://app/", 11);
    memset(longest + 11, 'x', INJECT_MAX_APP_URL - 11);
    longest[INJECT_MAX_APP_URL] = '\0';
    snprintf(ann, sizeof(ann),
             "{\"fencegate.io/inject\":\"true\",\"fencegate.io/app-health-url\":\"%s\"}", longest);
    p = patched(ann, &n);
    assert_string_equal(sidecar_env(p, n, "0.value.0", "FENCEGATE_APP_HEALTH_URL"), longest);
    free(p);

    /* Other shapes fencegate accepts: IPv6, no path, no port, '@' and ':' in the path. */
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        snprintf(ann, sizeof(ann),
                 "{\"fencegate.io/inject\":\"true\",\"fencegate.io/app-health-url\":\"%s\"}",
                 ok[i]);
        p = patched(ann, &n);
        assert_string_equal(sidecar_env(p, n, "0.value.0", "FENCEGATE_APP_HEALTH_URL"), ok[i]);
        free(p);
    }

    /* Absent, or empty (no health gate): no variable. */
    p = patched(ANN_ON, &n);
    assert_null(sidecar_env(p, n, "0.value.0", "FENCEGATE_APP_HEALTH_URL"));
    assert_int_equal(array_len(p, n, "0.value.0.env"), 4);
    free(p);
    p = patched("{\"fencegate.io/inject\":\"true\",\"fencegate.io/app-health-url\":\"\"}", &n);
    assert_null(sidecar_env(p, n, "0.value.0", "FENCEGATE_APP_HEALTH_URL"));
    assert_int_equal(array_len(p, n, "0.value.0.env"), 4);
    free(p);
    p = patched("{\"fencegate.io/inject\":\"true\",\"fencegate.io/config\":\"cfg\","
                "\"fencegate.io/app-health-url\":\"\"}",
                &n);
    assert_int_equal(array_len(p, n, "0.value.0.env"), 1);
    free(p);
}

/* A value that cannot be the sidecar's URL: allowed without the sidecar, as a bad
 * fencegate.io/config is, with a message naming the annotation and showing the value. */
static void test_app_health_url_invalid(void **state)
{
    static const struct {
        const char *value, *message;
    } cases[] = {
        {"https://127.0.0.1:8443/healthz",
         "\"https://127.0.0.1:8443/healthz\": not an http:// URL"},
        {"HTTP://app/healthz", "\"HTTP://app/healthz\": not an http:// URL"},
        {"healthz", "\"healthz\": not an http:// URL"},
        {"/healthz", "\"/healthz\": not an http:// URL"},
        {"127.0.0.1:8080", "\"127.0.0.1:8080\": not an http:// URL"},
        {"http:/app/healthz", "\"http:/app/healthz\": not an http:// URL"},
        {"http://app/health check", "\"http://app/health check\": byte 17 is 0x20"},
        {" http://app/healthz", "\" http://app/healthz\": not an http:// URL"},
        {"http://app/healthz ", "\"http://app/healthz \": byte 18 is 0x20"},
        {"http://app/\\t", "\"http://app/\\x09\": byte 11 is 0x09"},
        {"http://app/\\u007f", "\"http://app/\\x7F\": byte 11 is 0x7F"},
        {"http://app/\\u00e9", "\"http://app/\\xC3\\xA9\": byte 11 is 0xC3"},
        {"http://", "\"http://\": no host"},
        {"http:///healthz", "\"http:///healthz\": no host"},
        {"http://:8080/healthz", "\"http://:8080/healthz\": no host"},
        {"http://?x", "\"http://?x\": no host"},
        {"http://user@app/healthz", "\"http://user@app/healthz\": user info (USER@) is not"},
        {"http://app/healthz?full=1", "\"http://app/healthz?full=1\": query strings and"},
        {"http://app/healthz#x", "\"http://app/healthz#x\": query strings and fragments"},
        {"http://app?x", "\"http://app?x\": query strings and fragments are not supported"},
    };
    static char longer[INJECT_MAX_APP_URL + 2];
    char ann[4096], doc[8192];

    memcpy(longer, "http://app/", 11);
    memset(longer + 11, 'x', INJECT_MAX_APP_URL + 1 - 11);
    longer[INJECT_MAX_APP_URL + 1] = '\0';
    for (size_t i = 0; i <= sizeof(cases) / sizeof(cases[0]); i++) {
        int last = i == sizeof(cases) / sizeof(cases[0]);
        const char *value = last ? longer : cases[i].value;
        const char *want = last ? "\"(too long)\": longer than 1023 bytes" : cases[i].message;
        struct inject_result res;
        struct fixture fx;
        size_t n;
        int len = snprintf(ann, sizeof(ann),
                           "{\"fencegate.io/inject\":\"true\",\"fencegate.io/app-health-url\":"
                           "\"%s\"}",
                           value);
        assert_true(len > 0 && (size_t)len < sizeof(ann));
        len = snprintf(doc, sizeof(doc), POD_REVIEW("%s", SPEC_ONE), ann);
        assert_true(len > 0 && (size_t)len < sizeof(doc));
        fx.data = doc;
        fx.len = (size_t)len;
        review(&fx, &full_opts, FG_OK, &res);
        if (res.outcome != INJECT_UNUSABLE ||
            strstr(res.message, "annotation fencegate.io/app-health-url is ") == NULL ||
            strstr(res.message, want) == NULL || strstr(res.message, "no sidecar injected") == NULL)
            fail_msg("case %zu: outcome %d, message \"%s\" (expected \"%s\")", i, (int)res.outcome,
                     res.message, want);
        assert_null(answer(&res, "u-1", &n));
        inject_result_free(&res);
    }
}

static void test_existing_env_and_init_containers(void **state)
{
    struct fixture fx = load_fixture("existing_env_init.json");
    struct inject_result res;
    size_t n;
    char *p;

    review(&fx, &full_opts, FG_OK, &res);
    assert_int_equal(res.outcome, INJECT_PATCHED);
    p = answer(&res, "c0ffee00-1111-4222-8333-444455556666", &n);
    assert_int_equal(array_len(p, n, ""), 6);
    /* initContainers exists: the sidecar goes after "migrate". */
    expect_op(p, n, 0, "/spec/initContainers/-");
    expect_sidecar(p, n, "0.value", "fencegate:test");
    /* Container 0 has env: both variables appended. */
    expect_op(p, n, 1, "/spec/containers/0/env/-");
    expect_raw(p, n, "1.value", ENV_RESP);
    expect_op(p, n, 2, "/spec/containers/0/env/-");
    expect_raw(p, n, "2.value", ENV_HTTP);
    /* Container 1 sets FENCEGATE_HTTP_ADDR itself: its value stands, only RESP is added. */
    expect_op(p, n, 3, "/spec/containers/1/env/-");
    expect_raw(p, n, "3.value", ENV_RESP);
    /* Container 2 has no env. */
    expect_op(p, n, 4, "/spec/containers/2/env");
    expect_raw(p, n, "4.value", "[" ENV_RESP "," ENV_HTTP "]");
    expect_op(p, n, 5, "/metadata/annotations/fencegate.io~1status");
    free(p);
    inject_result_free(&res);
    free(fx.data);
}

/* ---- Fixtures: pods and reviews left alone ------------------------------------------------- */

static void expect_no_patch(const char *fixture, const char *uid, enum inject_outcome outcome,
                            const char *in_message)
{
    struct fixture fx = load_fixture(fixture);
    struct inject_result res;
    size_t n;

    review(&fx, &full_opts, FG_OK, &res);
    if (res.outcome != outcome)
        fail_msg("%s: outcome %d, expected %d (%s)", fixture, (int)res.outcome, (int)outcome,
                 res.message);
    assert_null(answer(&res, uid, &n));
    if (in_message == NULL)
        assert_string_equal(res.message, "");
    else if (strstr(res.message, in_message) == NULL)
        fail_msg("%s: message \"%s\" lacks \"%s\"", fixture, res.message, in_message);
    inject_result_free(&res);
    free(fx.data);
}

static void test_already_injected(void **state)
{
    expect_no_patch("already_injected.json", "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee", INJECT_ALREADY,
                    NULL);
    /* An app container named fencegate is not the sidecar: injecting would clash on the name,
     * and the pod that asked for the sidecar runs without it, so its owner is told. */
    expect_no_patch("named_fencegate.json", "abababab-bbbb-4ccc-8ddd-eeeeeeeeeeee", INJECT_UNUSABLE,
                    "spec.containers[1] is named fencegate");
}

/* Whether a pod has the sidecar is read from its init containers, not from the status
 * annotation: a pod carrying fencegate.io/status: injected (a template copied from a running
 * pod) but no sidecar is injected, and the patch's add sets the annotation again. */
static void test_status_annotation_without_sidecar(void **state)
{
    struct fixture fx = mkdoc(POD_REVIEW(
        "{\"fencegate.io/inject\":\"true\",\"fencegate.io/status\":\"injected\"}", SPEC_ONE));
    struct inject_result res;
    size_t n;
    char *p;

    review(&fx, &full_opts, FG_OK, &res);
    if (res.outcome != INJECT_PATCHED)
        fail_msg("outcome %d, expected a patch (%s)", (int)res.outcome, res.message);
    p = answer(&res, "u-1", &n);
    expect_op(p, n, 0, "/spec/initContainers");
    expect_sidecar(p, n, "0.value.0", "fencegate:test");
    expect_op(p, n, 2, "/metadata/annotations/fencegate.io~1status");
    free(p);
    inject_result_free(&res);
    free(fx.data);
}

/* The sidecar listens on 6380 and 8380 in the pod's network namespace: a container that
 * declares one of them (an app container, or a native sidecar that keeps running beside it)
 * would leave the sidecar unable to bind, its startup probe failing and the app never started.
 * A hostNetwork pod would put the lock API on the node's address (and two such pods on one
 * node clash). Both are answered without the sidecar and with a warning. */
static void test_port_clashes(void **state)
{
    static const struct {
        const char *spec, *message;
    } bad[] = {
        {"{\"containers\":[{\"name\":\"a\",\"ports\":[{\"containerPort\":8080},"
         "{\"containerPort\":8380,\"protocol\":\"TCP\"}]}]}",
         "spec.containers[0] declares containerPort 8380"},
        {"{\"containers\":[{\"name\":\"a\"},{\"ports\":[{\"containerPort\":6380}],"
         "\"name\":\"redis\"}]}",
         "spec.containers[1] declares containerPort 6380"},
        {"{\"initContainers\":[{\"name\":\"proxy\",\"ports\":[{\"containerPort\":6380}],"
         "\"restartPolicy\":\"Always\"}],\"containers\":[{\"name\":\"a\"}]}",
         "spec.initContainers[0] declares containerPort 6380"},
        {"{\"hostNetwork\":true,\"containers\":[{\"name\":\"a\"}]}", "hostNetwork pod"},
    };
    /* A plain init container has exited before the sidecar starts: no clash. Nor is a
     * hostPort of 8380 mapped to another container port, nor hostNetwork: false. */
    static const char *const good[] = {
        "{\"initContainers\":[{\"name\":\"migrate\",\"ports\":[{\"containerPort\":6380}]}],"
        "\"containers\":[{\"name\":\"a\"}]}",
        "{\"containers\":[{\"name\":\"a\",\"ports\":[{\"containerPort\":80,"
        "\"hostPort\":8380}]}]}",
        "{\"hostNetwork\":false,\"containers\":[{\"name\":\"a\",\"ports\":[]}]}",
    };
    char doc[4096];

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]) + sizeof(good) / sizeof(good[0]); i++) {
        int is_bad = i < sizeof(bad) / sizeof(bad[0]);
        const char *spec = is_bad ? bad[i].spec : good[i - sizeof(bad) / sizeof(bad[0])];
        struct inject_result res;
        struct fixture fx;
        size_t n;
        char *p;
        int len = snprintf(doc, sizeof(doc), POD_REVIEW(ANN_ON, "%s"), spec);
        assert_true(len > 0 && (size_t)len < sizeof(doc));
        fx.data = doc;
        fx.len = (size_t)len;
        review(&fx, &full_opts, FG_OK, &res);
        if (is_bad &&
            (res.outcome != INJECT_UNUSABLE || strstr(res.message, bad[i].message) == NULL ||
             strstr(res.message, "no sidecar injected") == NULL))
            fail_msg("case %zu: outcome %d, message \"%s\" (expected \"%s\")", i, (int)res.outcome,
                     res.message, bad[i].message);
        if (!is_bad && res.outcome != INJECT_PATCHED)
            fail_msg("case %zu: outcome %d (%s), expected a patch", i, (int)res.outcome,
                     res.message);
        p = answer(&res, "u-1", &n);
        free(p);
        inject_result_free(&res);
    }
}

static void test_not_requested(void **state)
{
    expect_no_patch("unannotated.json", "0d4b1c2a-9e8f-4a7b-b6c5-d4e3f2a1b0c9",
                    INJECT_NOT_REQUESTED, NULL);
    expect_no_patch("annotated_false.json", "0d4b1c2a-9e8f-4a7b-b6c5-d4e3f2a1b0ca",
                    INJECT_NOT_REQUESTED, NULL);
    /* Neither true nor false: allowed, and the owner is told why nothing happened. */
    expect_no_patch("annotated_yes.json", "0d4b1c2a-9e8f-4a7b-b6c5-d4e3f2a1b0cb", INJECT_UNUSABLE,
                    "fencegate.io/inject is \"yes\"");
}

static void test_not_a_pod_creation(void **state)
{
    expect_no_patch("delete.json", "de1e7e00-0000-4000-8000-000000000001", INJECT_IGNORED, NULL);
    expect_no_patch("deployment.json", "d3d3d3d3-0000-4000-8000-000000000002", INJECT_IGNORED,
                    "this is apps/Deployment");
    expect_no_patch("object_missing.json", "0b0b0b0b-0000-4000-8000-000000000003", INJECT_UNUSABLE,
                    "request.object is missing");
}

/* ---- Fixtures: not a review ---------------------------------------------------------------- */

static void expect_error(const struct fixture *fx, int want_rc, const char *in_message)
{
    struct inject_result res;

    review(fx, &full_opts, want_rc, &res);
    if (strstr(res.message, in_message) == NULL)
        fail_msg("message \"%s\" lacks \"%s\"", res.message, in_message);
    inject_result_free(&res);
}

static void test_garbage_truncated_no_uid(void **state)
{
    struct fixture g = load_fixture("garbage.txt");
    struct fixture t = load_fixture("truncated.json");
    struct fixture u = load_fixture("no_uid.json");
    struct fixture empty = {NULL, 0};

    expect_error(&g, FG_ERR_PROTO, "invalid JSON: ");
    expect_error(&t, FG_ERR_PROTO, "invalid JSON: unexpected end of input");
    expect_error(&u, FG_ERR_PROTO, "request.uid: missing");
    expect_error(&empty, FG_ERR_PROTO, "invalid JSON: empty document");
    free(g.data);
    free(t.data);
    free(u.data);
}

/* Every strict prefix of a valid review is an error, never a crash or a patch. */
static void test_every_prefix_is_an_error(void **state)
{
    struct fixture fx = load_fixture("existing_env_init.json");
    size_t end = fx.len;

    while (end > 0 && (fx.data[end - 1] == '\n' || fx.data[end - 1] == ' '))
        end--;
    for (size_t cut = 0; cut < end; cut++) {
        struct inject_result res;
        char *p = malloc(cut > 0 ? cut : 1);
        assert_non_null(p);
        memcpy(p, fx.data, cut);
        assert_int_equal(inject_review(p, cut, &full_opts, &res), FG_ERR_PROTO);
        assert_int_equal(res.outcome, INJECT_ERROR);
        assert_non_null(res.body);
        inject_result_free(&res);
        free(p);
    }
    free(fx.data);
}

static void test_huge_input(void **state)
{
    static const char head[] = "{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":"
                               "\"AdmissionReview\",\"request\":{\"uid\":\"big\",\"kind\":{"
                               "\"group\":\"\",\"kind\":\"Pod\"},\"operation\":\"CREATE\","
                               "\"object\":{\"metadata\":{\"annotations\":{\"fencegate.io/"
                               "inject\":\"true\",\"note\":\"";
    static const char tail[] = "\"}},\"spec\":{\"containers\":[{\"name\":\"a\"}]}}}}";
    size_t big = 3 * 1024 * 1024;
    struct fixture fx;
    struct inject_result res;
    size_t n;
    char *p;

    /* Over the limit: refused before any reading, whatever it holds. */
    fx.len = INJECT_MAX_BODY + 1;
    fx.data = malloc(fx.len);
    assert_non_null(fx.data);
    memset(fx.data, ' ', fx.len);
    expect_error(&fx, FG_ERR_LIMIT, "the limit is 4194304 bytes");
    free(fx.data);

    /* 3 MiB of annotation text is read through and the pod is injected. */
    fx.len = sizeof(head) - 1 + big + sizeof(tail) - 1;
    fx.data = malloc(fx.len);
    assert_non_null(fx.data);
    memcpy(fx.data, head, sizeof(head) - 1);
    memset(fx.data + sizeof(head) - 1, 'x', big);
    memcpy(fx.data + sizeof(head) - 1 + big, tail, sizeof(tail) - 1);
    review(&fx, &full_opts, FG_OK, &res);
    assert_int_equal(res.outcome, INJECT_PATCHED);
    p = answer(&res, "big", &n);
    assert_int_equal(array_len(p, n, ""), 3);
    free(p);
    inject_result_free(&res);
    free(fx.data);
}

/* ---- Built reviews ------------------------------------------------------------------------- */

/* The largest patch: every container, every option and the health check URL at their longest.
 * It must fit the declared response limit, which is why inject_review() never answers
 * FG_ERR_LIMIT for a valid pod. */
static void test_many_containers(void **state)
{
    static char longval[INJECT_MAX_OPTION + 1];
    static char longurl[INJECT_MAX_APP_URL + 1];
    static char ann[3 * INJECT_MAX_APP_URL];
    struct inject_options opt;
    struct inject_result res;
    char *doc = malloc(DOC_MAX);
    size_t used;
    struct fixture fx;
    size_t n;
    char *p;

    memset(longval, '"', INJECT_MAX_OPTION); /* each byte doubles when escaped */
    longval[INJECT_MAX_OPTION] = '\0';
    opt = (struct inject_options){longval, longval, longval, longval, longval, longval,
                                  longval, 600000,  longval, longval, longval};
    char err[200];
    assert_int_equal(inject_options_check(&opt, err, sizeof(err)), FG_OK);
    /* The URL too: '"' is printable ASCII, escaped both in the review and in the patch. */
    used = (size_t)snprintf(ann, sizeof(ann),
                            "{\"fencegate.io/inject\":\"true\",\"fencegate.io/app-health-url\":"
                            "\"http://a/");
    memcpy(longurl, "http://a/", 9);
    for (size_t i = 9; i < INJECT_MAX_APP_URL; i++) {
        longurl[i] = '"';
        memcpy(ann + used, "\\\"", 2);
        used += 2;
    }
    longurl[INJECT_MAX_APP_URL] = '\0';
    memcpy(ann + used, "\"}", 3);
    for (int count = INJECT_MAX_CONTAINERS; count <= INJECT_MAX_CONTAINERS + 1; count++) {
        assert_non_null(doc);
        used = (size_t)snprintf(
            doc, DOC_MAX,
            "{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\",\"request\":{"
            "\"uid\":\"many\",\"kind\":{\"group\":\"\",\"kind\":\"Pod\"},\"operation\":"
            "\"CREATE\",\"object\":{\"metadata\":{\"annotations\":%s},\"spec\":{"
            "\"containers\":[",
            ann);
        for (int i = 0; i < count; i++)
            used += (size_t)snprintf(doc + used, DOC_MAX - used, "%s{\"name\":\"c%d\"}",
                                     i ? "," : "", i);
        used += (size_t)snprintf(doc + used, DOC_MAX - used, "]}}}}");
        assert_true(used < DOC_MAX);
        fx.data = doc;
        fx.len = used;
        review(&fx, &opt, FG_OK, &res);
        if (count == INJECT_MAX_CONTAINERS) {
            assert_int_equal(res.outcome, INJECT_PATCHED);
            p = answer(&res, "many", &n);
            assert_int_equal(array_len(p, n, ""), INJECT_MAX_CONTAINERS + 2);
            expect_op(p, n, INJECT_MAX_CONTAINERS, "/spec/containers/255/env");
            expect_str(p, n, "0.value.0.image", longval);
            assert_string_equal(sidecar_env(p, n, "0.value.0", "FENCEGATE_APP_HEALTH_URL"),
                                longurl);
            free(p);
        } else {
            assert_int_equal(res.outcome, INJECT_UNUSABLE);
            assert_null(answer(&res, "many", &n));
            assert_non_null(strstr(res.message, "257 containers"));
        }
        inject_result_free(&res);
    }
    free(doc);
}

/* Member order does not matter: the object may come before the uid, kind at the end. */
static void test_member_order(void **state)
{
    struct fixture fx = mkdoc(
        "{\"request\":{\"object\":{\"spec\":%s,\"metadata\":{\"annotations\":%s}},"
        "\"operation\":\"CREATE\",\"kind\":{\"kind\":\"Pod\",\"group\":\"\"},\"uid\":\"late\"},"
        "\"kind\":\"AdmissionReview\",\"apiVersion\":\"admission.k8s.io/v1\"}",
        SPEC_ONE, ANN_ON);
    struct inject_result res;
    size_t n;
    char *p;

    review(&fx, &full_opts, FG_OK, &res);
    assert_int_equal(res.outcome, INJECT_PATCHED);
    p = answer(&res, "late", &n);
    assert_int_equal(array_len(p, n, ""), 3);
    free(p);
    inject_result_free(&res);
    free(fx.data);
}

/* The uid is echoed exactly, escapes and all; odd uids are errors. */
static void test_uid(void **state)
{
    struct fixture fx = mkdoc("{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":"
                              "\"AdmissionReview\",\"request\":{\"uid\":\"a\\\"b\\\\c\\u00e9"
                              "\\u0001\\/\",\"operation\":\"DELETE\",\"object\":null}}");
    struct inject_result res;
    char longuid[INJECT_MAX_UID + 2];
    size_t n;

    review(&fx, &full_opts, FG_OK, &res);
    assert_int_equal(res.outcome, INJECT_IGNORED);
    assert_null(answer(&res, "a\"b\\c\xc3\xa9\x01/", &n));
    inject_result_free(&res);
    free(fx.data);

    memset(longuid, 'u', sizeof(longuid) - 1);
    longuid[sizeof(longuid) - 1] = '\0';
    fx = mkdoc("{\"request\":{\"uid\":\"%s\",\"operation\":\"CREATE\"}}", longuid);
    expect_error(&fx, FG_ERR_PROTO, "longer than 128 bytes");
    free(fx.data);
    longuid[INJECT_MAX_UID] = '\0'; /* exactly the limit is fine */
    fx = mkdoc("{\"request\":{\"uid\":\"%s\",\"operation\":\"DELETE\"}}", longuid);
    review(&fx, &full_opts, FG_OK, &res);
    inject_result_free(&res);
    free(fx.data);

    fx = mkdoc("{\"request\":{\"uid\":42,\"operation\":\"CREATE\"}}");
    expect_error(&fx, FG_ERR_PROTO, "request.uid: expected a string");
    free(fx.data);
    fx = mkdoc("{\"request\":{\"uid\":\"\",\"operation\":\"CREATE\"}}");
    expect_error(&fx, FG_ERR_PROTO, "request.uid: empty");
    free(fx.data);
    fx = mkdoc("{\"request\":{\"uid\":\"a\",\"uid\":\"b\"}}");
    expect_error(&fx, FG_ERR_PROTO, "request.uid appears twice");
    free(fx.data);
    fx = mkdoc("[{\"request\":{\"uid\":\"a\"}}]");
    expect_error(&fx, FG_ERR_PROTO, "expected an AdmissionReview object");
    free(fx.data);
    fx = mkdoc("{\"kind\":\"AdmissionReview\"}");
    expect_error(&fx, FG_ERR_PROTO, "request is missing");
    free(fx.data);
}

static void test_review_versions(void **state)
{
    struct fixture fx = mkdoc("{\"apiVersion\":\"admission.k8s.io/v1beta1\",\"kind\":"
                              "\"AdmissionReview\",\"request\":{\"uid\":\"b1\",\"operation\":"
                              "\"DELETE\"}}");
    struct inject_result res;

    review(&fx, &full_opts, FG_OK, &res);
    expect_str(res.body, res.body_len, "apiVersion", "admission.k8s.io/v1beta1");
    expect_str(res.body, res.body_len, "response.uid", "b1");
    inject_result_free(&res);
    free(fx.data);

    fx = mkdoc("{\"apiVersion\":\"admission.k8s.io/v2\",\"request\":{\"uid\":\"x\"}}");
    expect_error(&fx, FG_ERR_PROTO, "apiVersion is \"admission.k8s.io/v2\"");
    free(fx.data);
    fx = mkdoc("{\"kind\":\"TokenReview\",\"request\":{\"uid\":\"x\"}}");
    expect_error(&fx, FG_ERR_PROTO, "kind is \"TokenReview\"");
    free(fx.data);
}

/* A review whose pod cannot be used is allowed with a message; nothing is patched. */
static void test_unusable_pods(void **state)
{
    static const struct {
        const char *ann, *spec, *message;
    } cases[] = {
        {"{\"fencegate.io/inject\":\"true\",\"fencegate.io/inject\":\"true\"}", SPEC_ONE,
         "has \"fencegate.io/inject\" twice"},
        {"{\"fencegate.io/inject\":true}", SPEC_ONE, "expected a string, got a number or boolean"},
        {"[\"fencegate.io/inject\"]", SPEC_ONE, "metadata.annotations: expected an object"},
        {ANN_ON, "{\"containers\":[{\"name\":\"a\",\"env\":\"x\"}]}",
         "spec.containers[0].env: expected an array, got a string"},
        {ANN_ON, "{\"containers\":[]}", "no spec.containers"},
        {ANN_ON, "{\"initContainers\":[]}", "no spec.containers"},
        {ANN_ON, "{\"containers\":{}}", "spec.containers: expected an array"},
        {ANN_ON, "{\"containers\":[\"a\"]}", "spec.containers[0]: expected an object"},
        {ANN_ON, "[]", "request.object.spec: expected an object"},
        {"{\"fencegate.io/inject\":\"true\",\"fencegate.io/config\":\"Bad_Name\"}", SPEC_ONE,
         "fencegate.io/config is \"Bad_Name\", not a ConfigMap name"},
        {"{\"fencegate.io/inject\":\"true\",\"fencegate.io/config\":\"-x\"}", SPEC_ONE,
         "not a ConfigMap name"},
        {"{\"fencegate.io/inject\":\"true\",\"fencegate.io/config\":\"cfg\"}",
         "{\"volumes\":[{\"name\":\"fencegate-config\",\"emptyDir\":{}}],"
         "\"containers\":[{\"name\":\"a\"}]}",
         "already has a volume named fencegate-config"},
        {"{\"fencegate.io/inject\":\"trueeeeeeeeeeeeeeeeeeeee\"}", SPEC_ONE, "is \"(too long)\""},
        {"{\"fencegate.io/inject\":\"true\",\"fencegate.io/secret\":\"A\"}", SPEC_ONE,
         "fencegate.io/secret is \"A\", not a Secret name"},
        {"{\"fencegate.io/inject\":\"true\",\"fencegate.io/secret\":\"s\"}",
         "{\"volumes\":[{\"name\":\"fencegate-secret\",\"emptyDir\":{}}],"
         "\"containers\":[{\"name\":\"a\"}]}",
         "already has a volume named fencegate-secret"},
        {"{\"fencegate.io/inject\":\"true\",\"fencegate.io/app-health-url\":\"http://a/\","
         "\"fencegate.io/app-health-url\":\"http://b/\"}",
         SPEC_ONE, "has \"fencegate.io/app-health-url\" twice"},
        {"{\"fencegate.io/inject\":\"true\",\"fencegate.io/app-health-url\":8080}", SPEC_ONE,
         "annotation fencegate.io/app-health-url: expected a string"},
    };
    char doc[4096];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct inject_result res;
        struct fixture fx;
        size_t n;
        int len = snprintf(doc, sizeof(doc), POD_REVIEW("%s", "%s"), cases[i].ann, cases[i].spec);
        assert_true(len > 0 && (size_t)len < sizeof(doc));
        fx.data = doc;
        fx.len = (size_t)len;
        review(&fx, &full_opts, FG_OK, &res);
        if (res.outcome != INJECT_UNUSABLE || strstr(res.message, cases[i].message) == NULL)
            fail_msg("case %zu: outcome %d, message \"%s\" (expected \"%s\")", i, (int)res.outcome,
                     res.message, cases[i].message);
        assert_null(answer(&res, "u-1", &n));
        inject_result_free(&res);
    }
}

static void test_operations_and_subresources(void **state)
{
    static const char *const reqs[] = {
        "\"operation\":\"UPDATE\"",
        "\"operation\":\"CONNECT\"",
        "\"operation\":\"CREATE\",\"subResource\":\"binding\"",
    };
    char doc[4096];

    for (size_t i = 0; i < sizeof(reqs) / sizeof(reqs[0]); i++) {
        struct inject_result res;
        struct fixture fx;
        size_t n;
        int len = snprintf(doc, sizeof(doc),
                           "{\"request\":{\"uid\":\"op\",%s,\"object\":{\"metadata\":{"
                           "\"annotations\":" ANN_ON "},\"spec\":" SPEC_ONE "}}}",
                           reqs[i]);
        fx.data = doc;
        fx.len = (size_t)len;
        review(&fx, &full_opts, FG_OK, &res);
        assert_int_equal(res.outcome, INJECT_IGNORED);
        assert_null(answer(&res, "op", &n));
        inject_result_free(&res);
    }
}

/* null members are treated as absent: env and initContainers are created whole. */
static void test_null_members(void **state)
{
    struct fixture fx = mkdoc(POD_REVIEW(
        ANN_ON, "{\"initContainers\":null,\"volumes\":null,\"containers\":[{\"name\":\"a\","
                "\"env\":null}]}"));
    struct inject_result res;
    size_t n;
    char *p;

    review(&fx, &full_opts, FG_OK, &res);
    assert_int_equal(res.outcome, INJECT_PATCHED);
    p = answer(&res, "u-1", &n);
    expect_op(p, n, 0, "/spec/initContainers");
    expect_op(p, n, 1, "/spec/containers/0/env");
    expect_raw(p, n, "1.value", "[" ENV_RESP "," ENV_HTTP "]");
    free(p);
    inject_result_free(&res);
    free(fx.data);
}

static void test_nesting_limit(void **state)
{
    char deep[2 * JSON_MAX_DEPTH + 8];
    struct fixture fx;
    struct inject_result res;
    size_t n;

    memset(deep, '[', JSON_MAX_DEPTH);
    memset(deep + JSON_MAX_DEPTH, ']', JSON_MAX_DEPTH);
    deep[2 * JSON_MAX_DEPTH] = '\0';
    /* The uid was read before the deep part: allowed, with the reason. */
    fx = mkdoc("{\"request\":{\"uid\":\"d\",\"operation\":\"CREATE\",\"object\":{"
               "\"metadata\":{\"annotations\":" ANN_ON "},\"spec\":{\"x\":%s}}}}",
               deep);
    review(&fx, &full_opts, FG_OK, &res);
    assert_int_equal(res.outcome, INJECT_UNUSABLE);
    assert_non_null(strstr(res.message, "nested deeper than 32 levels"));
    assert_null(answer(&res, "d", &n));
    inject_result_free(&res);
    free(fx.data);
    /* The uid comes after it: there is nothing to answer. */
    fx = mkdoc("{\"x\":%s,\"request\":{\"uid\":\"d\"}}", deep);
    expect_error(&fx, FG_ERR_PROTO, "request.uid: missing");
    free(fx.data);
}

/* Unset options leave their parts out; option text is escaped in the JSON. */
static void test_options(void **state)
{
    struct inject_options opt = {.image = "reg.example/fg:1\"x\\y", .grace_ms = -1};
    struct fixture fx = mkdoc(POD_REVIEW(ANN_ON, SPEC_ONE));
    struct inject_result res;
    char err[200];
    size_t n;
    char *p;

    assert_int_equal(inject_options_check(&opt, err, sizeof(err)), FG_OK);
    review(&fx, &opt, FG_OK, &res);
    p = answer(&res, "u-1", &n);
    expect_str(p, n, "0.value.0.image", "reg.example/fg:1\"x\\y");
    assert_int_equal(array_len(p, n, "0.value.0.env"), 1);
    expect_absent(p, n, "0.value.0.resources");
    free(p);
    inject_result_free(&res);

    opt = (struct inject_options){.image = "i", .cpu_limit = "1", .grace_ms = 0};
    review(&fx, &opt, FG_OK, &res);
    p = answer(&res, "u-1", &n);
    expect_raw(p, n, "0.value.0.resources", "{\"limits\":{\"cpu\":\"1\"}}");
    expect_str(p, n, "0.value.0.env.1.value", "0");
    free(p);
    inject_result_free(&res);
    free(fx.data);

    opt = (struct inject_options){.image = "", .grace_ms = -1};
    assert_int_equal(inject_options_check(&opt, err, sizeof(err)), FG_ERR_CONFIG);
    assert_non_null(strstr(err, "image: must be set"));
    opt = (struct inject_options){.image = "a b", .grace_ms = -1};
    assert_int_equal(inject_options_check(&opt, err, sizeof(err)), FG_ERR_CONFIG);
    assert_non_null(strstr(err, "image: byte 1 is 0x20"));
    opt = (struct inject_options){.image = "a", .backend = "redis://\n", .grace_ms = -1};
    assert_int_equal(inject_options_check(&opt, err, sizeof(err)), FG_ERR_CONFIG);
    assert_non_null(strstr(err, "backend: byte 8 is 0x0A"));
    opt = (struct inject_options){.image = "a", .grace_ms = 600001};
    assert_int_equal(inject_options_check(&opt, err, sizeof(err)), FG_ERR_CONFIG);
    assert_non_null(strstr(err, "grace_ms"));
}

static void test_result_free_null(void **state)
{
    struct inject_result res;

    inject_result_free(NULL);
    memset(&res, 0, sizeof(res));
    inject_result_free(&res);
    assert_null(res.body);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_annotated_pod),
        cmocka_unit_test(test_annotated_pod_with_config),
        cmocka_unit_test(test_annotated_pod_with_config_and_secret),
        cmocka_unit_test(test_app_health_url),
        cmocka_unit_test(test_backend_prefix_ttl_and_log_level),
        cmocka_unit_test(test_app_health_url_invalid),
        cmocka_unit_test(test_existing_env_and_init_containers),
        cmocka_unit_test(test_already_injected),
        cmocka_unit_test(test_status_annotation_without_sidecar),
        cmocka_unit_test(test_port_clashes),
        cmocka_unit_test(test_not_requested),
        cmocka_unit_test(test_not_a_pod_creation),
        cmocka_unit_test(test_garbage_truncated_no_uid),
        cmocka_unit_test(test_every_prefix_is_an_error),
        cmocka_unit_test(test_huge_input),
        cmocka_unit_test(test_many_containers),
        cmocka_unit_test(test_member_order),
        cmocka_unit_test(test_uid),
        cmocka_unit_test(test_review_versions),
        cmocka_unit_test(test_unusable_pods),
        cmocka_unit_test(test_operations_and_subresources),
        cmocka_unit_test(test_null_members),
        cmocka_unit_test(test_nesting_limit),
        cmocka_unit_test(test_options),
        cmocka_unit_test(test_result_free_null),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
