/* inject.h — the sidecar injector's decision: an AdmissionReview in, its response out. Pure. */
#ifndef FG_INJECT_H
#define FG_INJECT_H

#include <stddef.h>

#include "fg_error.h"

/* Declared limits. */
#define INJECT_MAX_BODY       (4 * 1024 * 1024) /* largest AdmissionReview read */
#define INJECT_MAX_RESPONSE   (1024 * 1024)     /* largest response written (never reached) */
#define INJECT_MAX_CONTAINERS 256  /* app containers patched; more is answered without a patch */
#define INJECT_MAX_UID        128  /* bytes of request.uid (Kubernetes sends a 36-byte UUID) */
#define INJECT_MAX_OPTION     1024 /* bytes of each string option */
#define INJECT_MAX_MESSAGE    512  /* bytes of inject_result.message, NUL included */
#define INJECT_MAX_POD        400  /* bytes of inject_result.pod, NUL included */
#define INJECT_MAX_APP_URL    1023 /* bytes of the fencegate.io/app-health-url value */

/* The pod annotations the injector reads and writes. */
#define INJECT_ANN_INJECT     "fencegate.io/inject" /* "true" asks for the sidecar */
#define INJECT_ANN_CONFIG     "fencegate.io/config" /* a ConfigMap holding config.yaml */
#define INJECT_ANN_SECRET     "fencegate.io/secret" /* a Secret for the files a config names */
#define INJECT_ANN_STATUS     "fencegate.io/status" /* "injected", written by the patch */
#define INJECT_ANN_APP_HEALTH "fencegate.io/app-health-url" /* the app's http:// health check */

/* The injected container and what it exposes. */
#define INJECT_CONTAINER   "fencegate"
#define INJECT_VOLUME      "fencegate-config"
#define INJECT_CONFIG_DIR  "/etc/fencegate"
#define INJECT_SECRET_VOL  "fencegate-secret"
#define INJECT_SECRET_DIR  "/etc/fencegate-secret" /* e.g. backend.password_file: .../password */
#define INJECT_RESP_PORT   6380
#define INJECT_HTTP_PORT   8380
#define INJECT_RUN_AS_USER 65532

/* Cluster-wide settings of the injected sidecar (the injector's FENCEGATE_INJECT_* variables).
 * Strings are NUL-terminated; NULL or "" leaves that setting out of the patch. */
struct inject_options {
    const char *image;          /* required */
    const char *cpu_request;    /* e.g. "50m" */
    const char *memory_request; /* e.g. "16Mi" */
    const char *cpu_limit;
    const char *memory_limit;
    const char *backend;        /* FENCEGATE_BACKEND of the sidecar */
    const char *upstream;       /* FENCEGATE_UPSTREAM of the sidecar */
    long long grace_ms;         /* FENCEGATE_SHUTDOWN_GRACE_MS; < 0 leaves it out */
    const char *backend_prefix; /* FENCEGATE_BACKEND_PREFIX: lock keys must agree fleet-wide */
    const char *session_ttl_ms; /* FENCEGATE_SESSION_TTL_MS, as text (the sidecar checks it) */
    const char *log_level;      /* FENCEGATE_LOG_LEVEL */
};

/* What inject_review() decided. */
enum inject_outcome {
    INJECT_ERROR = 0,     /* not an AdmissionReview with a uid: body is {"error": ...} */
    INJECT_PATCHED,       /* allowed, with a JSONPatch adding the sidecar */
    INJECT_NOT_REQUESTED, /* allowed as is: no fencegate.io/inject: "true" */
    INJECT_ALREADY,       /* allowed as is: an initContainer is named fencegate already */
    INJECT_IGNORED,       /* allowed as is: not the creation of a Pod */
    INJECT_UNUSABLE,      /* allowed as is, with status.message and a warning saying why */
};

struct inject_result {
    enum inject_outcome outcome;
    char *body;      /* malloc'd, NUL-terminated JSON to send; NULL only after FG_ERR_NOMEM */
    size_t body_len; /* bytes of body, the NUL not included */
    char message[INJECT_MAX_MESSAGE]; /* why there is no patch or what was wrong; "" if patched */
    char pod[INJECT_MAX_POD]; /* "namespace/name" for logs, printable ASCII; "" when unknown */
};

/* Checks options before serving: the image is set, every string is printable ASCII of at most
 * INJECT_MAX_OPTION bytes, grace_ms is at most 600000. Returns FG_OK, or FG_ERR_CONFIG with err
 * (errlen bytes, NUL-terminated) naming the bad setting as "image", "cpu_request", ... */
int inject_options_check(const struct inject_options *opt, char *err, size_t errlen) FG_MUST_CHECK;

/* Reads the admission.k8s.io/v1 AdmissionReview body[0..len) and writes its response into res
 * (which the caller frees with inject_result_free(), whatever the return).
 *
 * Returns FG_OK when the body is an AdmissionReview carrying a request.uid: res->body is then
 * the response AdmissionReview with the same uid (and apiVersion) and "allowed": true, plus a
 * base64 JSONPatch when res->outcome is INJECT_PATCHED. A review whose object cannot be used
 * (missing, not a Pod, wrong member types, too many containers, a bad fencegate.io/config,
 * fencegate.io/secret or fencegate.io/app-health-url value, an app container named fencegate, a
 * container that keeps running and declares containerPort 6380 or 8380, hostNetwork, nesting
 * deeper than the JSON reader allows) is still allowed, without a patch and with status.message =
 * res->message: a pod must never be refused because the injector could not read it, and its owner
 * sees the warning in kubectl's output.
 *
 * Returns FG_ERR_PROTO (not JSON, not an AdmissionReview, no usable request.uid: there is no
 * review to answer, so the HTTP layer replies 400) or FG_ERR_LIMIT (len > INJECT_MAX_BODY:
 * 413); res->body is then {"error": res->message}. Returns FG_ERR_NOMEM with res->body NULL.
 * opt must have passed inject_options_check(). body may be NULL when len is 0. */
int inject_review(const char *body, size_t len, const struct inject_options *opt,
                  struct inject_result *res) FG_MUST_CHECK;

/* Frees res->body and clears res. res may be NULL. */
void inject_result_free(struct inject_result *res);

#endif
