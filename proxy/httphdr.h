/* httphdr.h — pure helpers for forwarding HTTP requests to a store: which headers are hop-by-hop,
 * the upstream target, and header values fencegate reads. No sockets, no libevent. */
#ifndef FG_HTTPHDR_H
#define FG_HTTPHDR_H

#include <stddef.h>

#define HTTPHDR_MAX_TARGET 8192 /* longest forwarded path + query, bytes */

/* 1 when a header named `name` must not be forwarded (either direction): the hop-by-hop headers
 * of RFC 9110 §7.6.1 (Connection, Keep-Alive, Proxy-*, TE, Trailer, Transfer-Encoding, Upgrade)
 * and every header that `connection` (the message's Connection value, may be NULL) names.
 * Names compare case-insensitively. */
int httphdr_is_hop_by_hop(const char *name, const char *connection);

/* 1 when a request header named `name` is replaced or dropped by fencegate before forwarding:
 * hop-by-hop ones, Host (rewritten for the store), Content-Length (recomputed), Expect (answered
 * here), Fencing-Token and Fence-Lock (set from the lock, never trusted from the client) and
 * Fence-Timeout-Ms (read here). */
int httphdr_drop_request(const char *name, const char *connection);

/* Writes "<prefix><rest or "/">[?query]" into out. prefix is the store URL's path ("" or
 * "/..."), rest the raw path after /http ("" or "/..."), query NULL or the raw query. Refuses
 * rest with a "." or ".." segment (also %2e-encoded, or ending at a '\\', %2f or %5c, or before
 * ';' parameters, as some servers read them), which could climb out of the prefix.
 * Returns the length, -1 for a dot segment, -2 when it does not fit in cap. */
int httphdr_target(char *out, size_t cap, const char *prefix, const char *rest, const char *query);

/* The path as a store reads it, for matching protect rules: rest (the raw path after /http, ""
 * or "/...") percent-decoded into out (cap bytes, NUL-terminated; may hold any byte but NUL).
 * Refuses what a store could read as another path than the one decoded here: an encoded '/'
 * (%2F), an encoded NUL (%00), a '%' not followed by two hex digits, and an empty segment ("//").
 * Returns the decoded length, HTTPHDR_PATH_REFUSED for those, or -2 when it does not fit. */
#define HTTPHDR_PATH_REFUSED (-1)
int httphdr_decode_path(char *out, size_t cap, const char *rest);

/* Parses a positive decimal number of milliseconds, at most max. Returns 0 with *out set, or -1
 * (empty, not a number, 0, above max, trailing bytes). */
int httphdr_parse_ms(const char *s, long long max, long long *out);

/* The Host header for host and port (RFC 9110 7.2): "db", "db:8080", "[fd00::7]:8080"; the port
 * left out when it is 80. An IPv6 literal (it has a ':') is bracketed. Writes "" when it does not
 * fit in out. */
void httphdr_host(char *out, size_t cap, const char *host, int port);

#endif
