/* fuzz_inject.c — libFuzzer target: any body gets a bounded, valid JSON answer, and a patch is a
 * valid JSON array of "add" operations that a valid review asked for. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "inject.h"
#include "json.h"

static const struct inject_options fuzz_opts = {
    .image = "fencegate:fuzz",
    .cpu_request = "50m",
    .memory_request = "16Mi",
    .cpu_limit = "500m",
    .memory_limit = "64Mi",
    .backend = "etcd://e:2379",
    .upstream = "redis://r:6379",
    .grace_ms = 10000,
};

/* Reads doc to its end; returns the final status of the reader. */
static int fuzz_valid(const char *doc, size_t len)
{
    struct json_reader r;
    struct json_token t;
    int rc;

    json_reader_init(&r, doc, len);
    do {
        rc = json_next(&r, &t);
    } while (rc == FG_OK && t.type != JSON_END);
    return rc;
}

/* The string member name of the top-level object member `outer` (NULL: top level itself), as a
 * raw slice; NULL when absent. */
static const char *fuzz_member(const char *doc, size_t len, const char *outer, const char *name,
                               size_t *vlen, enum json_type *type)
{
    struct json_reader r;
    struct json_token t, k;
    int depth_ok = outer == NULL;

    json_reader_init(&r, doc, len);
    if (json_next(&r, &t) != FG_OK || t.type != JSON_OBJECT_BEGIN)
        return NULL;
    for (;;) {
        if (json_next(&r, &k) != FG_OK || k.type != JSON_KEY)
            return NULL;
        if (!depth_ok && json_string_equals(&k, outer)) {
            if (json_next(&r, &t) != FG_OK || t.type != JSON_OBJECT_BEGIN)
                return NULL;
            depth_ok = 1;
            continue;
        }
        if (depth_ok && json_string_equals(&k, name)) {
            if (json_next(&r, &t) != FG_OK)
                return NULL;
            *vlen = t.len;
            *type = t.type;
            return t.ptr;
        }
        if (json_skip(&r, &k) != FG_OK)
            return NULL;
    }
}

static int fuzz_b64(char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

/* Checks the base64 patch: it decodes, is valid JSON, an array whose elements all say "add". */
static void fuzz_check_patch(const char *b64, size_t n)
{
    char *p = malloc(n / 4 * 3 + 1);
    size_t o = 0;
    struct json_reader r;
    struct json_token t, k;

    if (p == NULL || n == 0 || n % 4 != 0)
        abort();
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        for (int j = 0; j < 4; j++) {
            v[j] = b64[i + j] == '=' ? 0 : fuzz_b64(b64[i + j]);
            if (v[j] < 0 || (b64[i + j] == '=' && (i + 4 != n || j < 2)))
                abort();
        }
        unsigned long x = (unsigned long)v[0] << 18 | (unsigned long)v[1] << 12 |
                          (unsigned long)v[2] << 6 | (unsigned long)v[3];
        p[o++] = (char)(x >> 16);
        if (b64[i + 2] != '=')
            p[o++] = (char)(x >> 8 & 0xff);
        if (b64[i + 3] != '=')
            p[o++] = (char)(x & 0xff);
    }
    if (fuzz_valid(p, o) != FG_OK)
        abort();
    json_reader_init(&r, p, o);
    if (json_next(&r, &t) != FG_OK || t.type != JSON_ARRAY_BEGIN)
        abort();
    for (;;) {
        if (json_next(&r, &t) != FG_OK)
            abort();
        if (t.type == JSON_ARRAY_END)
            break;
        if (t.type != JSON_OBJECT_BEGIN)
            abort();
        /* {"op":"add","path":...,"value":...} in that order */
        if (json_next(&r, &k) != FG_OK || !json_string_equals(&k, "op"))
            abort();
        if (json_next(&r, &k) != FG_OK || !json_string_equals(&k, "add"))
            abort();
        if (json_next(&r, &k) != FG_OK || !json_string_equals(&k, "path"))
            abort();
        if (json_next(&r, &k) != FG_OK || k.type != JSON_STRING || k.len == 0 || k.ptr[0] != '/')
            abort();
        if (json_next(&r, &k) != FG_OK || !json_string_equals(&k, "value"))
            abort();
        if (json_skip(&r, &k) != FG_OK || json_next(&r, &k) != FG_OK || k.type != JSON_OBJECT_END)
            abort();
    }
    free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct inject_result res;
    char *buf = malloc(size > 0 ? size : 1);
    int in_rc, rc;
    size_t vlen = 0;
    enum json_type type = JSON_NONE;
    const char *v;

    if (buf == NULL)
        abort();
    memcpy(buf, data, size); /* exactly size bytes, so that a read past the end traps */
    in_rc = fuzz_valid(buf, size);
    rc = inject_review(buf, size, &fuzz_opts, &res);

    if (rc != FG_OK && rc != FG_ERR_PROTO && rc != FG_ERR_LIMIT)
        abort();
    if (res.body == NULL || strlen(res.body) != res.body_len ||
        res.body_len > INJECT_MAX_RESPONSE || fuzz_valid(res.body, res.body_len) != FG_OK)
        abort();
    if (strlen(res.message) >= sizeof(res.message) || strlen(res.pod) >= sizeof(res.pod))
        abort();
    if (rc != FG_OK) {
        /* An error answer is {"error": message}. */
        if (res.outcome != INJECT_ERROR || res.message[0] == '\0' ||
            fuzz_member(res.body, res.body_len, NULL, "error", &vlen, &type) == NULL ||
            type != JSON_STRING)
            abort();
    } else {
        /* Only a document the reader accepts, or one too deep for it, gets a review answer. */
        if (in_rc != FG_OK && in_rc != FG_ERR_LIMIT)
            abort();
        if (res.outcome == INJECT_ERROR)
            abort();
        if (fuzz_member(res.body, res.body_len, "response", "uid", &vlen, &type) == NULL ||
            type != JSON_STRING || vlen == 0)
            abort();
        if (fuzz_member(res.body, res.body_len, "response", "allowed", &vlen, &type) == NULL ||
            type != JSON_TRUE)
            abort();
        v = fuzz_member(res.body, res.body_len, "response", "patch", &vlen, &type);
        if ((v != NULL) != (res.outcome == INJECT_PATCHED))
            abort();
        if (v != NULL) {
            if (type != JSON_STRING || in_rc != FG_OK || res.message[0] != '\0')
                abort();
            fuzz_check_patch(v, vlen);
        }
        if (res.outcome == INJECT_UNUSABLE && res.message[0] == '\0')
            abort();
    }
    inject_result_free(&res);
    free(buf);
    return 0;
}
