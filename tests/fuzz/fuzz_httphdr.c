/* fuzz_httphdr.c — libFuzzer target: the HTTP store's path and header helpers keep their promises
 * on any input. The input is split at NUL bytes into up to four strings (a path, a prefix, a
 * query, a header value); every helper runs on them and its result is checked against what
 * httphdr.h says it returns. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "httphdr.h"

#define FUZZ_ARGS 4

/* 1 when rest (a raw path, "" or "/...") has a piece that is "." or "..": what httphdr_target
 * must refuse. Written apart from httphdr.c, by decoding: in each segment %2e is a '.', %2f a
 * '/' and %5c a '\\' (as some stores decode them), a piece ends at '/' or '\\', and a ';' starts
 * the piece's parameters, which do not count. */
static int fuzz_has_dot_segment(const char *rest)
{
    const char *p = rest;

    while (*p == '/') {
        size_t dots = 0, other = 0;
        int params = 0;
        for (p++;; p++) {
            char c = *p;
            if (c == '%' && p[1] == '2' && (p[2] == 'e' || p[2] == 'E'))
                c = '.', p += 2;
            else if (c == '%' && p[1] == '2' && (p[2] == 'f' || p[2] == 'F'))
                c = '\\', p += 2;
            else if (c == '%' && p[1] == '5' && (p[2] == 'c' || p[2] == 'C'))
                c = '\\', p += 2;
            if (c == '\0' || c == '/' || c == '\\') { /* a piece ends */
                if (other == 0 && (dots == 1 || dots == 2))
                    return 1;
                dots = other = 0;
                params = 0;
                if (c != '\\')
                    break; /* the segment ends */
            } else if (c == ';') {
                if (other == 0 && (dots == 1 || dots == 2))
                    return 1;
                params = 1;
            } else if (!params) {
                if (c == '.')
                    dots++;
                else
                    other++;
            }
        }
    }
    return 0;
}

static void fuzz_decode(const char *rest, size_t cap)
{
    char out[256];
    int n = httphdr_decode_path(out, cap, rest);

    if (n >= 0) {
        /* decoded, NUL-terminated, no NUL inside, no empty segment, fits */
        if ((size_t)n >= cap || out[n] != '\0' || strlen(out) != (size_t)n)
            abort();
        if (strstr(out, "//") != NULL)
            abort();
        /* decoding never lengthens a path */
        if ((size_t)n > strlen(rest))
            abort();
    } else if (n != HTTPHDR_PATH_REFUSED && n != -2) {
        abort();
    }
}

static void fuzz_target(const char *prefix, const char *rest, const char *query, size_t cap)
{
    char out[512];
    int n = httphdr_target(out, cap, prefix, rest, query);

    if (n == -1) {
        if (!fuzz_has_dot_segment(rest))
            abort();
        return;
    }
    if (fuzz_has_dot_segment(rest))
        abort(); /* a dot segment went through */
    if (n == -2)
        return;
    if (n < 0 || (size_t)n >= cap || strlen(out) != (size_t)n)
        abort();
    if (strncmp(out, prefix, strlen(prefix)) != 0)
        abort(); /* the store's prefix comes first */
    if (out[0] == '\0')
        abort(); /* an empty target is not a request line */
}

static void fuzz_ms(const char *s)
{
    long long v = -1;

    if (httphdr_parse_ms(s, 3600000, &v) == 0 && (v <= 0 || v > 3600000))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size + 1);
    const char *arg[FUZZ_ARGS] = {"", "", "", ""};
    size_t nargs = 0, cap;

    if (buf == NULL || size == 0) {
        free(buf);
        return 0;
    }
    memcpy(buf, data, size);
    buf[size] = '\0';
    cap = 1 + data[0] % 255; /* output buffers of every size, tight ones included */
    for (char *p = buf + 1; nargs < FUZZ_ARGS && p <= buf + size; p += strlen(p) + 1)
        arg[nargs++] = p;

    fuzz_decode(arg[0], cap);
    fuzz_target(arg[1], arg[0], nargs > 2 ? arg[2] : NULL, cap + 256);
    fuzz_ms(arg[3]);
    (void)httphdr_is_hop_by_hop(arg[1], arg[3]);
    (void)httphdr_drop_request(arg[3], arg[1]);
    free(buf);
    return 0;
}
