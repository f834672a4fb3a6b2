/* grpc.h — a small gRPC client over HTTP/2 (nghttp2) on a libevent loop: one channel over several
 * endpoints, one connection at a time (h2c with prior knowledge, or TLS: grpc_tls_new()), unary
 * calls and long-lived bidirectional streams multiplexed on it.
 *
 * Framing: every message is the gRPC 5-byte prefix (compressed flag 0, 32-bit big-endian length)
 * and the bytes. A call ends with the `grpc-status` / `grpc-message` trailers (also as a
 * trailers-only response, i.e. in the response HEADERS with END_STREAM). Messages larger than
 * GRPC_MAX_MESSAGE end the call with GRPC_STATUS_RESOURCE_EXHAUSTED.
 *
 * Etiquette (etcd answers GOAWAY "too_many_pings" otherwise): HTTP/2 PINGs are sent only while at
 * least one call is open and never more often than opts.ping_interval_ms (>= 5000); a PING not
 * acknowledged within opts.ping_timeout_ms kills the connection.
 *
 * Connection loss (EOF, reset, GOAWAY, PING timeout, connect failure or timeout): every open call
 * ends with GRPC_STATUS_UNAVAILABLE and a message naming the endpoint and the cause; the channel
 * then reconnects with exponential backoff and jitter (opts.backoff_min_ms doubling up to
 * opts.backoff_max_ms), moving to the next endpoint on each failure. grpc_channel_failover() makes
 * the same move on request (e.g. the member has no leader).
 *
 * Every callback runs on the loop. A callback may start, cancel or send on any call, and may call
 * grpc_channel_failover(); it must not free the channel. */
#ifndef FG_GRPC_H
#define FG_GRPC_H

#include <stddef.h>
#include <stdint.h>

struct event_base;
struct grpc_channel;
struct grpc_call;

#define GRPC_MAX_MESSAGE (4u << 20) /* 4 MiB, gRPC's default receive limit */

/* gRPC status codes used here (the others pass through as numbers). */
enum {
    GRPC_STATUS_OK = 0,
    GRPC_STATUS_CANCELLED = 1,
    GRPC_STATUS_UNKNOWN = 2,
    GRPC_STATUS_INVALID_ARGUMENT = 3,
    GRPC_STATUS_DEADLINE_EXCEEDED = 4,
    GRPC_STATUS_NOT_FOUND = 5,
    GRPC_STATUS_PERMISSION_DENIED = 7,
    GRPC_STATUS_FAILED_PRECONDITION = 9,
    GRPC_STATUS_OUT_OF_RANGE = 11,
    GRPC_STATUS_RESOURCE_EXHAUSTED = 8,
    GRPC_STATUS_INTERNAL = 13,
    GRPC_STATUS_UNAVAILABLE = 14,
    GRPC_STATUS_UNAUTHENTICATED = 16,
};

/* A numeric address is used as is; a host name is looked up again at each connection attempt, on
 * a worker thread (resolve.h), so a slow name service never stalls the loop; the connect timeout
 * covers the lookup. TLS checks the host name (or server_name), never the address. */
struct grpc_endpoint {
    char host[256]; /* name or IPv4/IPv6 literal, without brackets */
    int port;
};

/* TLS for a channel, as etcdctl's --cacert, --cert and --key. */
struct grpc_tls_opts {
    const char *ca_file;     /* PEM; NULL or "": the system's certificate authorities */
    const char *cert_file;   /* client certificate chain (PEM), with key_file; NULL or "": none */
    const char *key_file;    /* its private key (PEM) */
    const char *server_name; /* the name the server's certificate must carry (and SNI); NULL or
                              * "": each endpoint's host (a DNS name or an IP address) */
};
struct grpc_tls;
/* Loads libssl (tlslib.h) and the files: a context for any number of channels. TLS 1.2 or later,
 * the server's certificate verified against the CAs and the name, ALPN "h2". NULL with the reason
 * in err (a library missing, a file unreadable or not PEM, a key that does not match). */
struct grpc_tls *grpc_tls_new(const struct grpc_tls_opts *o, char *err, size_t errlen);
/* Frees t once no channel uses it. NULL is a no-op. */
void grpc_tls_free(struct grpc_tls *t);

struct grpc_channel_opts {
    struct grpc_tls *tls;         /* NULL: h2c with prior knowledge; else TLS with ALPN h2 */
    long long connect_timeout_ms; /* default 2000 */
    long long ping_interval_ms;   /* default 10000; values under 5000 are raised to 5000 */
    long long ping_timeout_ms;    /* default 5000 */
    long long backoff_min_ms;     /* default 50 */
    long long backoff_max_ms;     /* default 2000 */
};

struct grpc_channel_cbs {
    /* The channel has a working connection (after the HTTP/2 preface and SETTINGS exchange). */
    void (*up)(void *arg, const char *endpoint);
    /* The connection was lost; every open call has already ended. `why` names endpoint and
     * cause. Only for a connection that had come `up`; failed attempts just move on. */
    void (*down)(void *arg, const char *why);
};

/* Creates a channel and starts connecting to eps[0]. eps is copied; neps 1..16. opts may be NULL
 * for defaults (and a field <= 0 takes its default). Returns NULL when out of memory, given no
 * endpoint or more than 16, or an endpoint with an empty host or a port outside 1..65535. */
struct grpc_channel *grpc_channel_new(struct event_base *base, const struct grpc_endpoint *eps,
                                      int neps, const struct grpc_channel_opts *opts,
                                      const struct grpc_channel_cbs *cbs, void *arg);
/* Closes the connection and frees the channel. Open calls are dropped without callbacks. NULL is a
 * no-op. */
void grpc_channel_free(struct grpc_channel *ch);
/* 1 when connected (calls can be started), else 0. */
int grpc_channel_ready(const struct grpc_channel *ch);
/* "host:port" of the endpoint in use or being tried. */
const char *grpc_channel_endpoint(const struct grpc_channel *ch);
/* Why the last connection, or the last attempt, ended ("host:port: cause"); "" while connected
 * and before any failure. */
const char *grpc_channel_last_error(const struct grpc_channel *ch);
/* Drops the current connection (open calls end with GRPC_STATUS_UNAVAILABLE and `why`) and moves
 * on to the next endpoint without waiting for the backoff of a healthy channel. */
void grpc_channel_failover(struct grpc_channel *ch, const char *why);
/* Keepalive PINGs sent and acknowledged over the channel's life (all connections); for tests and
 * metrics. Either pointer may be NULL. */
void grpc_channel_ping_counts(const struct grpc_channel *ch, uint64_t *sent, uint64_t *acked);

/* One metadata entry (a request header); names lowercase. */
struct grpc_metadata {
    const char *name, *value;
};

#define GRPC_CHANNEL_MD_MAX 2048 /* bytes of the channel metadata's value */
/* Sets the one metadata entry sent with every call started from now on (an auth token, say),
 * except calls of except_path (may be NULL; the call that obtains a token must not carry a stale
 * one). Calls already started keep what they were sent with. Returns 0, or -1 when the name or
 * value is not valid metadata or the value is GRPC_CHANNEL_MD_MAX or longer. */
int grpc_channel_set_metadata(struct grpc_channel *ch, const char *name, const char *value,
                              const char *except_path);

struct grpc_call_cbs {
    /* One complete response message (the 5-byte prefix removed); msg is valid during the call. */
    void (*message)(void *arg, struct grpc_call *call, const uint8_t *msg, size_t len);
    /* Exactly once per call that was not cancelled: status GRPC_STATUS_OK, a status from the
     * server with its grpc-message (percent-decoded, "" when absent), or a local status:
     * GRPC_STATUS_DEADLINE_EXCEEDED (timeout_ms ran out), GRPC_STATUS_UNAVAILABLE (connection
     * lost), GRPC_STATUS_RESOURCE_EXHAUSTED (message too large), GRPC_STATUS_INTERNAL (protocol
     * error, e.g. a response that is not application/grpc, or an HTTP status other than 200).
     * The call is freed after this returns. */
    void (*end)(void *arg, struct grpc_call *call, int status, const char *message);
};

/* Starts a call of `path` (e.g. "/etcdserverpb.KV/Txn") with extra metadata md[0..nmd). The
 * call times out after timeout_ms (0 = no deadline; streams). Returns NULL when the channel is
 * not ready or out of memory; the caller treats that as unavailable. */
struct grpc_call *grpc_call_start(struct grpc_channel *ch, const char *path,
                                  const struct grpc_metadata *md, size_t nmd, long long timeout_ms,
                                  const struct grpc_call_cbs *cbs, void *arg);
/* Queues one request message (framed here; the bytes are copied). Returns 0, or -1 when the call
 * has ended or is half-closed already, the message is larger than GRPC_MAX_MESSAGE, more than
 * 16 MiB are queued unsent, or out of memory. */
int grpc_call_send(struct grpc_call *call, const uint8_t *msg, size_t len);
/* Half-closes the request side (END_STREAM after what is queued). */
int grpc_call_close_send(struct grpc_call *call);
/* Cancels the call (RST_STREAM CANCEL); no callback of it runs after this. */
void grpc_call_cancel(struct grpc_call *call);

/* A unary call: start + send + close_send. NULL as grpc_call_start(). */
struct grpc_call *grpc_unary(struct grpc_channel *ch, const char *path, const uint8_t *msg,
                             size_t len, long long timeout_ms, const struct grpc_call_cbs *cbs,
                             void *arg);

#endif
