/* httphdr.c — which headers a forwarding proxy keeps, and the target path it sends. Pure. */
#include "httphdr.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *const httphdr_hop[] = {
    "Connection", "Keep-Alive",        "Proxy-Connection", "TE", "Trailer",
    "Trailers",   "Transfer-Encoding", "Upgrade",          NULL,
};

/* 1 when the comma-separated list `list` holds the token name (case-insensitive, spaces and tabs
 * around items ignored). */
static int httphdr_list_has(const char *list, const char *name)
{
    size_t nl = strlen(name);
    const char *p = list;

    while (*p) {
        const char *start, *end;
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        start = p;
        while (*p && *p != ',')
            p++;
        end = p;
        while (end > start && (end[-1] == ' ' || end[-1] == '\t'))
            end--;
        if ((size_t)(end - start) == nl && nl > 0 && strncasecmp(start, name, nl) == 0)
            return 1;
    }
    return 0;
}

int httphdr_is_hop_by_hop(const char *name, const char *connection)
{
    for (int i = 0; httphdr_hop[i]; i++)
        if (strcasecmp(name, httphdr_hop[i]) == 0)
            return 1;
    if (strncasecmp(name, "Proxy-", 6) == 0)
        return 1; /* Proxy-Authorization, Proxy-Authenticate, ...: meant for the sidecar hop */
    return connection && httphdr_list_has(connection, name);
}

int httphdr_drop_request(const char *name, const char *connection)
{
    static const char *const own[] = {"Host",       "Content-Length",   "Expect", "Fencing-Token",
                                      "Fence-Lock", "Fence-Timeout-Ms", NULL};

    for (int i = 0; own[i]; i++)
        if (strcasecmp(name, own[i]) == 0)
            return 1;
    return httphdr_is_hop_by_hop(name, connection);
}

/* The length of an encoded separator at s (before e) that some servers decode into one: %2f,
 * %5c (either case); 0 when there is none. */
static size_t httphdr_enc_sep(const char *s, const char *e)
{
    if (e - s < 3 || s[0] != '%')
        return 0;
    if ((s[1] == '2' && (s[2] == 'f' || s[2] == 'F')) ||
        (s[1] == '5' && (s[2] == 'c' || s[2] == 'C')))
        return 3;
    return 0;
}

/* 1 when the segment [s, e) holds a "." or ".." piece, literally or with %2e / %2E, as a store
 * might read it: servers differ, so a piece also ends at a backslash or an encoded '/' or '\'
 * (..%2f, a\..\b), and its ';' parameters are cut off (..;). */
static int httphdr_dot_segment(const char *s, const char *e)
{
    int dots = 0, other = 0;

    for (;;) {
        size_t sep = s == e ? 0 : *s == '\\' ? 1 : httphdr_enc_sep(s, e);

        if (s == e || sep > 0 || *s == ';') { /* the end of a piece */
            if (!other && (dots == 1 || dots == 2))
                return 1;
            if (s == e)
                return 0;
            if (*s == ';') { /* its parameters, to the next separator */
                while (s < e && *s != '\\' && httphdr_enc_sep(s, e) == 0)
                    s++;
                continue;
            }
            s += sep;
            dots = other = 0;
        } else if (*s == '.') {
            s++;
            dots++;
        } else if (e - s >= 3 && s[0] == '%' && s[1] == '2' && (s[2] == 'e' || s[2] == 'E')) {
            s += 3;
            dots++;
        } else {
            s++;
            other = 1;
        }
    }
}

int httphdr_target(char *out, size_t cap, const char *prefix, const char *rest, const char *query)
{
    const char *p = rest;
    int n;

    while (*p == '/') {
        const char *seg = p + 1, *end = strchr(seg, '/');
        if (!end)
            end = seg + strlen(seg);
        if (httphdr_dot_segment(seg, end))
            return -1;
        p = end;
    }
    n = snprintf(out, cap, "%s%s%s%s", prefix, *rest ? rest : (*prefix ? "" : "/"),
                 query ? "?" : "", query ? query : "");
    if (n < 0 || (size_t)n >= cap)
        return -2;
    return n;
}

static int httphdr_hex(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int httphdr_decode_path(char *out, size_t cap, const char *rest)
{
    size_t o = 0;

    if (cap == 0)
        return -2;
    for (const char *p = rest; *p; p++) {
        int c = (unsigned char)*p;
        if (c == '/' && p[1] == '/')
            return HTTPHDR_PATH_REFUSED; /* empty segment: many stores merge "//" into "/" */
        if (c == '%') {
            int hi = httphdr_hex(p[1]), lo = hi < 0 ? -1 : httphdr_hex(p[2]);
            if (lo < 0)
                return HTTPHDR_PATH_REFUSED; /* malformed: stores differ on what it means */
            c = hi * 16 + lo;
            if (c == '/' || c == '\0')
                return HTTPHDR_PATH_REFUSED;
            p += 2;
        }
        if (o + 1 >= cap)
            return -2;
        out[o++] = (char)c;
    }
    out[o] = '\0';
    return o > (size_t)INT_MAX ? -2 : (int)o;
}

void httphdr_host(char *out, size_t cap, const char *host, int port)
{
    int v6 = strchr(host, ':') != NULL, n;

    if (port == 80)
        n = snprintf(out, cap, v6 ? "[%s]" : "%s", host);
    else
        n = snprintf(out, cap, v6 ? "[%s]:%d" : "%s:%d", host, port);
    if (n < 0 || (size_t)n >= cap)
        out[0] = '\0';
}

int httphdr_parse_ms(const char *s, long long max, long long *out)
{
    char *end;
    long long v;

    if (!s || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0' || v <= 0 || v > max)
        return -1;
    *out = v;
    return 0;
}
