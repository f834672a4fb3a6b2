/* grpc.c — a gRPC client over HTTP/2 (nghttp2 callbacks API, h2c prior knowledge) on libevent.
 *
 * Shape: one channel holds at most one connection (a bufferevent plus an nghttp2 session) and
 * the list of open calls. Bytes read go through nghttp2_session_mem_recv(); frames to write come
 * out of nghttp2_session_mem_send() in conn_flush().
 *
 * Re-entrancy: user callbacks run from inside nghttp2 callbacks, timers and the teardown, and may
 * start, cancel or send on calls, or call grpc_channel_failover(). So nothing that a callback can
 * trigger frees memory or drives the session directly:
 *   - a connection failure only marks the channel `dying`; the teardown runs from the channel's
 *     `work` event (never inside nghttp2_session_mem_recv());
 *   - writes are scheduled on the same event (nghttp2 forbids mem_send inside its callbacks);
 *   - an ended call moves to a graveyard and is freed from the work event once nghttp2 no longer
 *     knows its stream (its stream closed, its HEADERS were never sent, or the session is gone),
 *     so no pointer nghttp2 holds (stream user data, data source) ever dangles.
 */
#include "grpc.h"

#include <errno.h>
#include <fcntl.h>
#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/util.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "resolve.h"
#include "tlslib.h"

#define GRPC_MAX_ENDPOINTS     16
#define GRPC_CONN_WINDOW       (16 << 20)  /* connection receive window */
#define GRPC_STREAM_WINDOW     (4 << 20)   /* SETTINGS_INITIAL_WINDOW_SIZE */
#define GRPC_MAX_SEND_QUEUE    (16u << 20) /* queued request bytes per call */
#define GRPC_MAX_METADATA      32
#define GRPC_DRAIN_MS          10000 /* after a graceful GOAWAY, how long open calls may finish */
#define GRPC_PING_INTERVAL_MIN 5000
#define GRPC_WHY_MAX           1024
#define GRPC_CAUSE_MAX         600
#define GRPC_MSG_MAX           2048

enum grpc_state {
    GRPC_ST_BACKOFF,    /* no connection; the reconnect timer is armed */
    GRPC_ST_CONNECTING, /* the host's lookup (resolving != NULL), then the TCP connect */
    GRPC_ST_HANDSHAKE,  /* preface sent, waiting for the server's SETTINGS */
    GRPC_ST_READY,      /* calls can start */
    GRPC_ST_DRAINING,   /* GOAWAY (NO_ERROR) received: open calls may finish, no new ones */
};

struct grpc_call {
    struct grpc_channel *ch;
    struct grpc_call *prev, *next; /* open calls, or the graveyard (next only) */
    int32_t stream_id;
    int stream_live; /* nghttp2 may still reference this call */
    int dead;        /* ended or cancelled: no further callbacks */
    int cancelled;
    int send_closed; /* close_send() called */
    int deferred;    /* the data provider returned NGHTTP2_ERR_DEFERRED */
    struct grpc_call_cbs cbs;
    void *arg;
    char path[128];
    long long timeout_ms;
    long long deadline_us; /* monotonic; 0 = none */
    struct event *deadline;
    /* request bytes, framed, not yet handed to nghttp2 */
    uint8_t *sbuf;
    size_t slen, soff, scap;
    /* response */
    int http_status;
    int ct_ok;
    char ct[64];
    int has_status;
    int status;
    char *message; /* raw grpc-message */
    uint8_t prefix[5];
    size_t prefix_have;
    uint32_t mlen;
    uint8_t *rbuf;
    size_t rhave;
};

struct grpc_channel {
    struct event_base *base;
    struct grpc_endpoint eps[GRPC_MAX_ENDPOINTS];
    int neps, ep_idx;
    char ep_name[280];
    struct grpc_channel_opts opts;
    struct grpc_channel_cbs cbs;
    void *arg;

    enum grpc_state state;
    int dying;              /* a connection failure waits for the work event */
    int tearing;            /* nghttp2_session_del() running: its callbacks do nothing */
    int freeing;            /* grpc_channel_free(): no user callbacks */
    int force_now;          /* failover requested while disconnected: skip the backoff */
    char why[GRPC_WHY_MAX]; /* why the last connection or attempt ended; "" while connected */
    char goaway_cause[GRPC_CAUSE_MAX]; /* "GOAWAY <code>: <debug data>" */

    struct resolve_req *resolving; /* the current endpoint's lookup, before its connect */
    struct bufferevent *bev;
    struct evbuffer *out; /* one conn_flush()'s frames, written straight to the socket */
    nghttp2_session *sess;
    struct event *work;       /* deferred flush, teardown and reaping */
    struct event *conn_timer; /* connect timeout, then GOAWAY drain limit */
    struct event *retry;      /* reconnect after backoff */
    struct event *ping;       /* keepalive PING schedule and its ack timeout */
    long long backoff_cur;
    uint64_t rng;

    struct grpc_call *calls; /* open calls */
    int ncalls;
    struct grpc_call *grave; /* ended calls awaiting free */

    int ping_outstanding;
    long long ping_sent_at, last_ping_at;
    uint64_t pings_sent, pings_acked;

    char md_name[64]; /* grpc_channel_set_metadata(); "" when none */
    char md_value[GRPC_CHANNEL_MD_MAX];
    char md_except[128]; /* the path whose calls go without it */
};

static void conn_fail(struct grpc_channel *ch, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void conn_start(struct grpc_channel *ch);
static int tls_failure(struct grpc_channel *ch, char *out, size_t cap);

static long long mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static long long mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void timer_arm(struct event *ev, long long ms)
{
    if (ms < 0)
        ms = 0;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)((ms % 1000) * 1000)};
    evtimer_add(ev, &tv);
}

static void schedule_work(struct grpc_channel *ch)
{
    if (!ch->freeing)
        event_active(ch->work, EV_TIMEOUT, 0);
}

static uint64_t rng_next(struct grpc_channel *ch)
{
    uint64_t x = ch->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    ch->rng = x;
    return x;
}

/* ---- calls ---- */

static void call_unlink(struct grpc_call *c)
{
    struct grpc_channel *ch = c->ch;
    if (c->prev)
        c->prev->next = c->next;
    else
        ch->calls = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
    ch->ncalls--;
}

static void call_free(struct grpc_call *c)
{
    if (c->deadline)
        event_free(c->deadline);
    free(c->sbuf);
    free(c->rbuf);
    free(c->message);
    free(c);
}

/* Frees the graveyard's calls that nghttp2 no longer references. */
static void reap(struct grpc_channel *ch)
{
    struct grpc_call **pp = &ch->grave;
    while (*pp) {
        struct grpc_call *c = *pp;
        if (c->stream_live && ch->sess) {
            pp = &c->next;
            continue;
        }
        *pp = c->next;
        call_free(c);
    }
}

/* Ends a call once: it leaves the open list (no more callbacks), its stream is reset with
 * rst_code when rst_code >= 0 and the stream may still be open, and `end` runs unless the call
 * was cancelled or the channel is being freed. Memory is released later by reap(). */
static void call_finish(struct grpc_call *c, int status, const char *msg, int rst_code)
{
    struct grpc_channel *ch = c->ch;
    if (c->dead)
        return;
    c->dead = 1;
    call_unlink(c);
    evtimer_del(c->deadline);
    if (rst_code >= 0 && ch->sess && !ch->tearing && c->stream_live)
        nghttp2_submit_rst_stream(ch->sess, NGHTTP2_FLAG_NONE, c->stream_id, (uint32_t)rst_code);
    c->next = ch->grave;
    ch->grave = c;
    schedule_work(ch);
    if (ch->state == GRPC_ST_DRAINING && ch->ncalls == 0 && !ch->dying)
        conn_fail(ch, "%s", ch->goaway_cause);
    if (!c->cancelled && !ch->freeing && c->cbs.end)
        c->cbs.end(c->arg, c, status, msg ? msg : "");
}

static int hexval(int h)
{
    if (h >= '0' && h <= '9')
        return h - '0';
    if (h >= 'a' && h <= 'f')
        return h - 'a' + 10;
    if (h >= 'A' && h <= 'F')
        return h - 'A' + 10;
    return -1;
}

/* Percent-decodes grpc-message in place; a '%' not followed by two hex digits stays as is. */
static void percent_decode(char *s)
{
    char *w = s;
    for (const char *r = s; *r; r++) {
        int hi, lo;
        if (r[0] == '%' && (hi = hexval((unsigned char)r[1])) >= 0 &&
            (lo = hexval((unsigned char)r[2])) >= 0) {
            *w++ = (char)(hi * 16 + lo);
            r += 2;
        } else {
            *w++ = *r;
        }
    }
    *w = '\0';
}

/* A failure from the server once the call's own deadline has passed is reported as
 * DEADLINE_EXCEEDED: the server's deadline started later than ours, so it cannot have run out
 * first; only our timer was late (a busy loop). etcd would say UNKNOWN "context deadline
 * exceeded". Returns 1 when it ended the call. */
static int call_finish_if_late(struct grpc_call *c, int status, const char *server_msg, int rst)
{
    if (status == GRPC_STATUS_OK || c->deadline_us == 0 || mono_us() < c->deadline_us)
        return 0;
    char msg[GRPC_MSG_MAX];
    snprintf(msg, sizeof(msg), "deadline of %lld ms exceeded calling %s on %s (server: %.400s)",
             c->timeout_ms, c->path, c->ch->ep_name, server_msg);
    call_finish(c, GRPC_STATUS_DEADLINE_EXCEEDED, msg, rst);
    return 1;
}

/* The response ended (END_STREAM from the server): end the call with the trailers' status. */
static void call_finish_remote(struct grpc_call *c)
{
    struct grpc_channel *ch = c->ch;
    char msg[GRPC_MSG_MAX];
    /* The server is done; stop our side too if it is still open (a bidirectional stream). */
    int rst =
        nghttp2_session_get_stream_local_close(ch->sess, c->stream_id) == 1 ? -1 : NGHTTP2_CANCEL;
    if (c->prefix_have > 0) {
        snprintf(msg, sizeof(msg), "response from %s for %s ended inside a message", ch->ep_name,
                 c->path);
        call_finish(c, GRPC_STATUS_INTERNAL, msg, rst);
    } else if (!c->has_status) {
        snprintf(msg, sizeof(msg), "response from %s for %s ended without grpc-status", ch->ep_name,
                 c->path);
        call_finish(c, GRPC_STATUS_INTERNAL, msg, rst);
    } else {
        if (c->message)
            percent_decode(c->message);
        if (!call_finish_if_late(c, c->status, c->message ? c->message : "", rst))
            call_finish(c, c->status, c->message ? c->message : "", rst);
    }
}

static void deadline_cb(evutil_socket_t fd, short what, void *arg)
{
    struct grpc_call *c = arg;
    char msg[GRPC_MSG_MAX];
    snprintf(msg, sizeof(msg), "deadline of %lld ms exceeded calling %s on %s", c->timeout_ms,
             c->path, c->ch->ep_name);
    call_finish(c, GRPC_STATUS_DEADLINE_EXCEEDED, msg, NGHTTP2_CANCEL);
}

/* nghttp2 pulls request bytes from here; an empty queue defers until grpc_call_send(). */
static ssize_t data_read_cb(nghttp2_session *sess, int32_t stream_id, uint8_t *buf, size_t length,
                            uint32_t *data_flags, nghttp2_data_source *source, void *user_data)
{
    struct grpc_call *c = source->ptr;
    if (c->dead)
        return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE; /* resets the stream */
    size_t avail = c->slen - c->soff;
    if (avail == 0) {
        if (c->send_closed) {
            *data_flags |= NGHTTP2_DATA_FLAG_EOF;
            return 0;
        }
        c->deferred = 1;
        return NGHTTP2_ERR_DEFERRED;
    }
    size_t n = avail < length ? avail : length;
    memcpy(buf, c->sbuf + c->soff, n);
    c->soff += n;
    if (c->soff == c->slen) {
        c->soff = c->slen = 0;
        if (c->send_closed)
            *data_flags |= NGHTTP2_DATA_FLAG_EOF;
    }
    return (ssize_t)n;
}

/* ---- nghttp2 callbacks ---- */

static struct grpc_call *stream_call(struct grpc_channel *ch, int32_t stream_id)
{
    if (ch->tearing || ch->dying || ch->sess == NULL)
        return NULL;
    struct grpc_call *c = nghttp2_session_get_stream_user_data(ch->sess, stream_id);
    return c && !c->dead ? c : NULL;
}

static int on_header_cb(nghttp2_session *sess, const nghttp2_frame *frame, const uint8_t *name,
                        size_t namelen, const uint8_t *value, size_t valuelen, uint8_t flags,
                        void *user_data)
{
    struct grpc_channel *ch = user_data;
    if (frame->hd.type != NGHTTP2_HEADERS)
        return 0;
    struct grpc_call *c = stream_call(ch, frame->hd.stream_id);
    if (c == NULL)
        return 0;
    if (namelen == 7 && memcmp(name, ":status", 7) == 0) {
        int v = 0;
        for (size_t i = 0; i < valuelen && i < 3; i++)
            v = v * 10 + (value[i] >= '0' && value[i] <= '9' ? value[i] - '0' : 0);
        c->http_status = v;
    } else if (namelen == 12 && memcmp(name, "content-type", 12) == 0) {
        snprintf(c->ct, sizeof(c->ct), "%.*s", (int)valuelen, (const char *)value);
        c->ct_ok = valuelen >= 16 && memcmp(value, "application/grpc", 16) == 0 &&
                   (valuelen == 16 || value[16] == '+' || value[16] == ';');
    } else if (namelen == 11 && memcmp(name, "grpc-status", 11) == 0) {
        char tmp[16];
        char *end;
        snprintf(tmp, sizeof(tmp), "%.*s", (int)(valuelen < 15 ? valuelen : 15),
                 (const char *)value);
        errno = 0;
        long v = strtol(tmp, &end, 10);
        c->has_status = 1;
        if (errno || end == tmp || *end || v < 0 || v > 1000)
            c->status = GRPC_STATUS_UNKNOWN;
        else
            c->status = (int)v;
    } else if (namelen == 12 && memcmp(name, "grpc-message", 12) == 0) {
        free(c->message);
        c->message = malloc(valuelen + 1);
        if (c->message) {
            memcpy(c->message, value, valuelen);
            c->message[valuelen] = '\0';
        }
    }
    return 0;
}

static void on_response_headers(struct grpc_channel *ch, struct grpc_call *c, int end_stream)
{
    char msg[GRPC_MSG_MAX];
    int rst = end_stream ? -1 : NGHTTP2_CANCEL;
    if (c->http_status != 200) {
        snprintf(msg, sizeof(msg),
                 "HTTP status %d from %s for %s (expected 200; is this a gRPC server?)",
                 c->http_status, ch->ep_name, c->path);
        call_finish(c, GRPC_STATUS_INTERNAL, msg, rst);
    } else if (!c->ct_ok && !(end_stream && c->has_status)) {
        snprintf(msg, sizeof(msg), "content-type \"%s\" from %s for %s (expected application/grpc)",
                 c->ct, ch->ep_name, c->path);
        call_finish(c, GRPC_STATUS_INTERNAL, msg, rst);
    } else if (end_stream) {
        call_finish_remote(c); /* trailers-only response */
    }
}

static void ping_arm(struct grpc_channel *ch);

static void on_goaway(struct grpc_channel *ch, const nghttp2_goaway *ga)
{
    char dbg[128];
    size_t dl = ga->opaque_data_len < sizeof(dbg) - 1 ? ga->opaque_data_len : sizeof(dbg) - 1;
    for (size_t i = 0; i < dl; i++) {
        unsigned char b = ga->opaque_data[i];
        dbg[i] = b >= 0x20 && b < 0x7f ? (char)b : '?';
    }
    dbg[dl] = '\0';
    char msg[GRPC_MSG_MAX];
    snprintf(ch->goaway_cause, sizeof(ch->goaway_cause), "GOAWAY %s (%u)%s%s",
             nghttp2_http2_strerror(ga->error_code), ga->error_code, dl ? ": " : "", dbg);
    snprintf(msg, sizeof(msg), "%s: %s", ch->ep_name, ch->goaway_cause);
    /* Calls the server never processed end now; restart the scan after each callback. */
    for (;;) {
        struct grpc_call *c = ch->calls;
        while (c && c->stream_id <= ga->last_stream_id)
            c = c->next;
        if (c == NULL || ch->dying)
            break;
        call_finish(c, GRPC_STATUS_UNAVAILABLE, msg, -1);
    }
    if (ch->dying)
        return;
    if (ga->error_code != NGHTTP2_NO_ERROR || ch->ncalls == 0) {
        conn_fail(ch, "%s", ch->goaway_cause);
        return;
    }
    ch->state = GRPC_ST_DRAINING;
    timer_arm(ch->conn_timer, GRPC_DRAIN_MS);
}

static int on_frame_recv_cb(nghttp2_session *sess, const nghttp2_frame *frame, void *user_data)
{
    struct grpc_channel *ch = user_data;
    if (ch->tearing || ch->dying)
        return 0;
    switch (frame->hd.type) {
    case NGHTTP2_SETTINGS:
        if (!(frame->hd.flags & NGHTTP2_FLAG_ACK) && ch->state == GRPC_ST_HANDSHAKE) {
            ch->state = GRPC_ST_READY;
            ch->why[0] = '\0'; /* grpc_channel_last_error(): none while connected */
            evtimer_del(ch->conn_timer);
            ch->backoff_cur = ch->opts.backoff_min_ms;
            ch->last_ping_at = mono_ms();
            if (ch->cbs.up && !ch->freeing)
                ch->cbs.up(ch->arg, ch->ep_name);
        }
        break;
    case NGHTTP2_PING:
        if ((frame->hd.flags & NGHTTP2_FLAG_ACK) && ch->ping_outstanding) {
            ch->ping_outstanding = 0;
            ch->pings_acked++;
            evtimer_del(ch->ping);
            ping_arm(ch);
        }
        break;
    case NGHTTP2_GOAWAY:
        on_goaway(ch, &frame->goaway);
        break;
    case NGHTTP2_HEADERS: {
        struct grpc_call *c = stream_call(ch, frame->hd.stream_id);
        int end_stream = (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
        if (c == NULL)
            break;
        if (frame->headers.cat == NGHTTP2_HCAT_RESPONSE) {
            if (c->http_status >= 100 && c->http_status < 200) {
                c->http_status = 0; /* an interim response; the real one follows */
                break;
            }
            on_response_headers(ch, c, end_stream);
        } else if (end_stream) {
            call_finish_remote(c);
        }
        break;
    }
    case NGHTTP2_DATA: {
        struct grpc_call *c = stream_call(ch, frame->hd.stream_id);
        if (c && (frame->hd.flags & NGHTTP2_FLAG_END_STREAM))
            call_finish_remote(c);
        break;
    }
    default:
        break;
    }
    return 0;
}

/* Reassembles 5-byte-prefixed messages across DATA frames; several may share one chunk. */
static int on_data_chunk_recv_cb(nghttp2_session *sess, uint8_t flags, int32_t stream_id,
                                 const uint8_t *data, size_t len, void *user_data)
{
    struct grpc_channel *ch = user_data;
    struct grpc_call *c = stream_call(ch, stream_id);
    char msg[GRPC_MSG_MAX];
    while (c && !c->dead && len > 0) {
        if (c->prefix_have < 5) {
            size_t take = 5 - c->prefix_have < len ? 5 - c->prefix_have : len;
            memcpy(c->prefix + c->prefix_have, data, take);
            c->prefix_have += take;
            data += take;
            len -= take;
            if (c->prefix_have < 5)
                break;
            c->mlen = (uint32_t)c->prefix[1] << 24 | (uint32_t)c->prefix[2] << 16 |
                      (uint32_t)c->prefix[3] << 8 | c->prefix[4];
            c->rhave = 0;
            if (c->prefix[0] != 0) {
                snprintf(msg, sizeof(msg),
                         "compressed message from %s for %s (no compression was offered)",
                         ch->ep_name, c->path);
                call_finish(c, GRPC_STATUS_INTERNAL, msg, NGHTTP2_CANCEL);
                break;
            }
            if (c->mlen > GRPC_MAX_MESSAGE) {
                snprintf(msg, sizeof(msg),
                         "message of %u bytes from %s for %s exceeds the limit of %u bytes",
                         c->mlen, ch->ep_name, c->path, GRPC_MAX_MESSAGE);
                call_finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, msg, NGHTTP2_CANCEL);
                break;
            }
            if (c->mlen == 0) { /* an empty message may end the chunk */
                c->prefix_have = 0;
                if (c->cbs.message)
                    c->cbs.message(c->arg, c, (const uint8_t *)"", 0);
                continue;
            }
        }
        if (c->rhave == 0 && len >= c->mlen) {
            /* The whole message is in this chunk: hand it over without copying. */
            const uint8_t *m = data;
            size_t ml = c->mlen;
            data += ml;
            len -= ml;
            c->prefix_have = 0;
            if (c->cbs.message)
                c->cbs.message(c->arg, c, m, ml);
            continue;
        }
        if (c->rbuf == NULL) {
            c->rbuf = malloc(c->mlen);
            if (c->rbuf == NULL) {
                call_finish(c, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory", NGHTTP2_CANCEL);
                break;
            }
        }
        size_t take = c->mlen - c->rhave < len ? c->mlen - c->rhave : len;
        memcpy(c->rbuf + c->rhave, data, take);
        c->rhave += take;
        data += take;
        len -= take;
        if (c->rhave == c->mlen) {
            uint8_t *m = c->rbuf;
            c->rbuf = NULL;
            c->rhave = 0;
            c->prefix_have = 0;
            if (c->cbs.message)
                c->cbs.message(c->arg, c, m, c->mlen);
            free(m);
        }
    }
    return 0;
}

static struct grpc_call *find_call(struct grpc_call *list, int32_t stream_id)
{
    for (; list; list = list->next)
        if (list->stream_id == stream_id)
            return list;
    return NULL;
}

static int on_stream_close_cb(nghttp2_session *sess, int32_t stream_id, uint32_t error_code,
                              void *user_data)
{
    struct grpc_channel *ch = user_data;
    if (ch->tearing)
        return 0;
    struct grpc_call *c = nghttp2_session_get_stream_user_data(sess, stream_id);
    if (c == NULL)
        return 0;
    c->stream_live = 0;
    if (c->dead || ch->dying)
        return 0;
    char msg[GRPC_MSG_MAX];
    snprintf(msg, sizeof(msg), "stream of %s reset by %s: h2 error %s (%u)", c->path, ch->ep_name,
             nghttp2_http2_strerror(error_code), error_code);
    if (call_finish_if_late(c, GRPC_STATUS_CANCELLED, msg, -1))
        return 0;
    call_finish(c, error_code == NGHTTP2_CANCEL ? GRPC_STATUS_CANCELLED : GRPC_STATUS_UNAVAILABLE,
                msg, -1);
    return 0;
}

/* A request whose HEADERS were never sent (cancelled while queued, or refused locally). */
static int on_frame_not_send_cb(nghttp2_session *sess, const nghttp2_frame *frame, int lib_error,
                                void *user_data)
{
    struct grpc_channel *ch = user_data;
    if (ch->tearing || frame->hd.type != NGHTTP2_HEADERS)
        return 0;
    struct grpc_call *c = find_call(ch->grave, frame->hd.stream_id);
    if (c == NULL)
        c = find_call(ch->calls, frame->hd.stream_id);
    if (c == NULL)
        return 0;
    c->stream_live = 0;
    if (!c->dead && !ch->dying) {
        char msg[GRPC_MSG_MAX];
        snprintf(msg, sizeof(msg), "request %s to %s not sent: %s", c->path, ch->ep_name,
                 nghttp2_strerror(lib_error));
        call_finish(c, GRPC_STATUS_UNAVAILABLE, msg, -1);
    }
    return 0;
}

/* ---- PING keepalive ---- */

/* Arms the PING timer while calls are open: the next PING goes out ping_interval_ms after the
 * previous one (or after the connection came up); with none open no PING is scheduled. */
static void ping_arm(struct grpc_channel *ch)
{
    if (ch->state != GRPC_ST_READY && ch->state != GRPC_ST_DRAINING)
        return;
    if (ch->ncalls == 0 || ch->ping_outstanding || evtimer_pending(ch->ping, NULL))
        return;
    timer_arm(ch->ping, ch->last_ping_at + ch->opts.ping_interval_ms - mono_ms());
}

static void ping_cb(evutil_socket_t fd, short what, void *arg)
{
    struct grpc_channel *ch = arg;
    long long now = mono_ms();
    if (ch->sess == NULL || ch->dying)
        return;
    if (ch->ping_outstanding) {
        long long left = ch->ping_sent_at + ch->opts.ping_timeout_ms - now;
        if (left <= 0)
            conn_fail(ch, "PING not acknowledged within %lld ms", ch->opts.ping_timeout_ms);
        else
            timer_arm(ch->ping, left);
        return;
    }
    if (ch->ncalls == 0)
        return; /* idle: etcd counts PINGs without streams as abuse */
    long long left = ch->last_ping_at + ch->opts.ping_interval_ms - now;
    if (left > 0) {
        timer_arm(ch->ping, left);
        return;
    }
    if (nghttp2_submit_ping(ch->sess, NGHTTP2_FLAG_NONE, NULL) != 0) {
        conn_fail(ch, "cannot queue a PING (out of memory)");
        return;
    }
    ch->ping_outstanding = 1;
    ch->ping_sent_at = ch->last_ping_at = now;
    ch->pings_sent++;
    timer_arm(ch->ping, ch->opts.ping_timeout_ms);
    schedule_work(ch);
}

/* ---- connection ---- */

/* Writes what nghttp2 has queued. Never called from inside an nghttp2 callback.
 *
 * On a plain connection whose output is empty the frames go to the socket at once, in one
 * writev: a request then costs no round of the event loop (arming EV_WRITE, waking for it,
 * disarming it), which is most of a loopback acquire's own latency. What the socket does not
 * take, and every write on TLS or before the connection is up, goes through the bufferevent,
 * which also reports a write error. */
static void conn_flush(struct grpc_channel *ch)
{
    if (ch->sess == NULL || ch->dying)
        return;
    for (;;) {
        const uint8_t *d;
        ssize_t n = nghttp2_session_mem_send(ch->sess, &d);
        if (n < 0) {
            conn_fail(ch, "HTTP/2 send error: %s", nghttp2_strerror((int)n));
            return;
        }
        if (n == 0)
            break;
        if (evbuffer_add(ch->out, d, (size_t)n) != 0) {
            conn_fail(ch, "cannot buffer %zd bytes (out of memory)", n);
            return;
        }
    }
    if (evbuffer_get_length(ch->out) > 0) {
        if (!ch->opts.tls && ch->state != GRPC_ST_CONNECTING &&
            evbuffer_get_length(bufferevent_get_output(ch->bev)) == 0)
            evbuffer_write(ch->out, bufferevent_getfd(ch->bev)); /* -1: the bufferevent reports */
        if (evbuffer_get_length(ch->out) > 0 && bufferevent_write_buffer(ch->bev, ch->out) != 0) {
            conn_fail(ch, "cannot buffer %zu bytes (out of memory)", evbuffer_get_length(ch->out));
            return;
        }
    }
    if (!nghttp2_session_want_read(ch->sess) && !nghttp2_session_want_write(ch->sess))
        conn_fail(ch, "HTTP/2 session ended");
}

/* Marks the connection failed; the teardown runs from the work event, outside every nghttp2
 * callback and after the current user callback returns. The first cause is kept. */
static void conn_fail(struct grpc_channel *ch, const char *fmt, ...)
{
    if (ch->dying || ch->freeing || ch->state == GRPC_ST_BACKOFF)
        return;
    char cause[GRPC_CAUSE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cause, sizeof(cause), fmt, ap);
    va_end(ap);
    snprintf(ch->why, sizeof(ch->why), "%s: %s", ch->ep_name, cause);
    ch->dying = 1;
    schedule_work(ch);
}

static void conn_close(struct grpc_channel *ch)
{
    resolve_cancel(ch->resolving);
    ch->resolving = NULL;
    if (ch->sess) {
        ch->tearing = 1;
        nghttp2_session_del(ch->sess);
        ch->sess = NULL;
        ch->tearing = 0;
    }
    if (ch->bev) {
        bufferevent_free(ch->bev);
        ch->bev = NULL;
    }
    if (ch->out) /* frames of the old session */
        evbuffer_drain(ch->out, evbuffer_get_length(ch->out));
    evtimer_del(ch->conn_timer);
    evtimer_del(ch->ping);
    ch->ping_outstanding = 0;
    for (struct grpc_call *c = ch->grave; c; c = c->next)
        c->stream_live = 0;
}

static void ep_select(struct grpc_channel *ch, int idx)
{
    ch->ep_idx = idx % ch->neps;
    const struct grpc_endpoint *ep = &ch->eps[ch->ep_idx];
    if (strchr(ep->host, ':'))
        snprintf(ch->ep_name, sizeof(ch->ep_name), "[%s]:%d", ep->host, ep->port);
    else
        snprintf(ch->ep_name, sizeof(ch->ep_name), "%s:%d", ep->host, ep->port);
}

/* Drops the connection: open calls end UNAVAILABLE with ch->why, the next endpoint is chosen and
 * the reconnect scheduled, then `down` runs (for a connection that had come up). */
static void conn_teardown(struct grpc_channel *ch)
{
    char why[GRPC_WHY_MAX];
    int was_up = ch->state == GRPC_ST_READY || ch->state == GRPC_ST_DRAINING;
    snprintf(why, sizeof(why), "%s", ch->why);
    conn_close(ch);
    ch->state = GRPC_ST_BACKOFF;
    ch->dying = 0;
    while (ch->calls)
        call_finish(ch->calls, GRPC_STATUS_UNAVAILABLE, why, -1);
    ep_select(ch, ch->ep_idx + 1);
    long long delay;
    if (was_up) {
        ch->backoff_cur = ch->opts.backoff_min_ms;
        delay = (long long)(rng_next(ch) % (uint64_t)(ch->backoff_cur + 1));
    } else {
        delay =
            ch->backoff_cur / 2 + (long long)(rng_next(ch) % (uint64_t)(ch->backoff_cur / 2 + 1));
        ch->backoff_cur *= 2;
        if (ch->backoff_cur > ch->opts.backoff_max_ms)
            ch->backoff_cur = ch->opts.backoff_max_ms;
    }
    if (ch->force_now)
        delay = 0;
    ch->force_now = 0;
    timer_arm(ch->retry, delay);
    if (was_up && ch->cbs.down && !ch->freeing)
        ch->cbs.down(ch->arg, why);
}

static void work_cb(evutil_socket_t fd, short what, void *arg)
{
    struct grpc_channel *ch = arg;
    if (ch->dying)
        conn_teardown(ch);
    conn_flush(ch);
    if (ch->dying) /* the flush failed, or a callback of the teardown asked for failover */
        schedule_work(ch);
    reap(ch);
}

static void read_cb(struct bufferevent *bev, void *arg)
{
    struct grpc_channel *ch = arg;
    struct evbuffer *in = bufferevent_get_input(bev);
    while (!ch->dying && ch->sess && evbuffer_get_length(in) > 0) {
        struct evbuffer_iovec v;
        if (evbuffer_peek(in, -1, NULL, &v, 1) < 1)
            break;
        ssize_t n = nghttp2_session_mem_recv(ch->sess, v.iov_base, v.iov_len);
        if (n < 0) {
            conn_fail(ch, "HTTP/2 protocol error: %s", nghttp2_strerror((int)n));
            break;
        }
        evbuffer_drain(in, (size_t)n);
    }
    conn_flush(ch);
}

/* An errno that a failed TCP connection leaves (not a would-block left over from a read). */
static int tls_connect_errno(int err)
{
    return err == ECONNREFUSED || err == ECONNRESET || err == EHOSTUNREACH || err == ENETUNREACH ||
           err == ETIMEDOUT || err == ECONNABORTED;
}

static void event_cb(struct bufferevent *bev, short what, void *arg)
{
    struct grpc_channel *ch = arg;
    int err = EVUTIL_SOCKET_ERROR();
    if (what & BEV_EVENT_CONNECTED) {
        int one = 1;
        evutil_socket_t fd = bufferevent_getfd(bev);
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        if (ch->opts.tls) {
            const unsigned char *proto = NULL;
            unsigned int plen = 0;
            tls.SSL_get0_alpn_selected(tls.bufferevent_openssl_get_ssl(bev), &proto, &plen);
            if (plen != 2 || memcmp(proto, "h2", 2) != 0) {
                conn_fail(ch, "TLS: the server did not choose HTTP/2 (ALPN h2)");
                return;
            }
        }
        nghttp2_settings_entry iv[] = {
            {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
            {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, GRPC_STREAM_WINDOW},
            {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 0},
        };
        if (nghttp2_submit_settings(ch->sess, NGHTTP2_FLAG_NONE, iv, 3) != 0 ||
            nghttp2_session_set_local_window_size(ch->sess, NGHTTP2_FLAG_NONE, 0,
                                                  GRPC_CONN_WINDOW) != 0) {
            conn_fail(ch, "cannot start the HTTP/2 session (out of memory)");
            return;
        }
        ch->state = GRPC_ST_HANDSHAKE;
        bufferevent_enable(bev, EV_READ | EV_WRITE);
        conn_flush(ch);
        return;
    }
    char why[GRPC_CAUSE_MAX - 64];
    if (ch->opts.tls && (what & BEV_EVENT_ERROR) && tls_failure(ch, why, sizeof(why)))
        conn_fail(ch, "%s", why);
    else if ((what & BEV_EVENT_EOF) && ch->state == GRPC_ST_CONNECTING && ch->opts.tls &&
             tls_connect_errno(err))
        /* libevent's TLS bufferevent reports a refused or reset connection as EOF; errno still
         * says which */
        conn_fail(ch, "connect or TLS handshake failed: %s", evutil_socket_error_to_string(err));
    else if ((what & BEV_EVENT_EOF) && ch->state == GRPC_ST_CONNECTING && ch->opts.tls)
        conn_fail(ch, "connection closed during the TLS handshake");
    else if (what & BEV_EVENT_EOF)
        conn_fail(ch, "connection closed by the server");
    else if (ch->state == GRPC_ST_CONNECTING)
        conn_fail(ch, "connect failed: %s", evutil_socket_error_to_string(err));
    else
        conn_fail(ch, "connection error: %s", evutil_socket_error_to_string(err));
}

static void conn_timer_cb(evutil_socket_t fd, short what, void *arg)
{
    struct grpc_channel *ch = arg;
    if (ch->state == GRPC_ST_DRAINING)
        conn_fail(ch, "%s (open calls did not finish within %d ms)", ch->goaway_cause,
                  GRPC_DRAIN_MS);
    else if (ch->resolving)
        conn_fail(ch, "resolving '%s' timed out after %lld ms", ch->eps[ch->ep_idx].host,
                  ch->opts.connect_timeout_ms);
    else
        conn_fail(ch, "connect timed out after %lld ms", ch->opts.connect_timeout_ms);
}

/* ---- TLS ---- */

struct grpc_tls {
    SSL_CTX *ctx;
    char server_name[256]; /* "" = each endpoint's host */
};

/* The first queued OpenSSL error as text ("" when none), the queue cleared. */
static const char *tls_error(char *buf, size_t cap)
{
    unsigned long e = tls.ERR_get_error();

    buf[0] = '\0';
    if (e)
        tls.ERR_error_string_n(e, buf, cap);
    tls.ERR_clear_error();
    return buf;
}

struct grpc_tls *grpc_tls_new(const struct grpc_tls_opts *o, char *err, size_t errlen)
{
    static const unsigned char alpn[] = {2, 'h', '2'};
    struct grpc_tls *t;
    char why[256];
    int has_cert = o->cert_file && o->cert_file[0], has_key = o->key_file && o->key_file[0];

    if (has_cert != has_key) {
        snprintf(err, errlen, "TLS: a client certificate needs both a certificate and a key file");
        return NULL;
    }
    if (o->server_name && strlen(o->server_name) >= sizeof(t->server_name)) {
        snprintf(err, errlen, "TLS: server name too long");
        return NULL;
    }
    if (tlslib_load(err, errlen) != 0)
        return NULL;
    t = calloc(1, sizeof(*t));
    if (t == NULL || (t->ctx = tls.SSL_CTX_new(tls.TLS_client_method())) == NULL) {
        snprintf(err, errlen, "TLS: cannot create a context: %s", tls_error(why, sizeof(why)));
        free(t);
        return NULL;
    }
    snprintf(t->server_name, sizeof(t->server_name), "%s", o->server_name ? o->server_name : "");
    tls.SSL_CTX_ctrl(t->ctx, SSL_CTRL_SET_MIN_PROTO_VERSION, TLS1_2_VERSION, NULL);
    tls.SSL_CTX_set_verify(t->ctx, SSL_VERIFY_PEER, NULL);
    if (o->ca_file && o->ca_file[0]) {
        if (tls.SSL_CTX_load_verify_locations(t->ctx, o->ca_file, NULL) != 1) {
            snprintf(err, errlen, "TLS: cannot load CA file '%s': %s", o->ca_file,
                     tls_error(why, sizeof(why)));
            goto fail;
        }
    } else if (tls.SSL_CTX_set_default_verify_paths(t->ctx) != 1) {
        snprintf(err, errlen, "TLS: cannot load the system's CAs: %s", tls_error(why, sizeof(why)));
        goto fail;
    }
    if (has_cert) {
        if (tls.SSL_CTX_use_certificate_chain_file(t->ctx, o->cert_file) != 1) {
            snprintf(err, errlen, "TLS: cannot load certificate file '%s': %s", o->cert_file,
                     tls_error(why, sizeof(why)));
            goto fail;
        }
        if (tls.SSL_CTX_use_PrivateKey_file(t->ctx, o->key_file, SSL_FILETYPE_PEM) != 1 ||
            tls.SSL_CTX_check_private_key(t->ctx) != 1) {
            snprintf(err, errlen, "TLS: cannot use key file '%s' with '%s': %s", o->key_file,
                     o->cert_file, tls_error(why, sizeof(why)));
            goto fail;
        }
    }
    if (tls.SSL_CTX_set_alpn_protos(t->ctx, alpn, sizeof(alpn)) != 0) {
        snprintf(err, errlen, "TLS: cannot set ALPN: %s", tls_error(why, sizeof(why)));
        goto fail;
    }
    return t;
fail:
    grpc_tls_free(t);
    return NULL;
}

void grpc_tls_free(struct grpc_tls *t)
{
    if (t == NULL)
        return;
    if (t->ctx)
        tls.SSL_CTX_free(t->ctx);
    free(t);
}

/* An SSL for the current endpoint: SNI and the name checked against the certificate (a DNS name,
 * or an IP address, which must be in the certificate's IP SANs). NULL with err set. */
static SSL *tls_ssl_new(struct grpc_channel *ch, char *err, size_t errcap)
{
    const struct grpc_endpoint *ep = &ch->eps[ch->ep_idx];
    const char *name = ch->opts.tls->server_name[0] ? ch->opts.tls->server_name : ep->host;
    struct sockaddr_storage ss;
    char why[256];
    int is_ip = inet_pton(AF_INET, name, &ss) == 1 || inet_pton(AF_INET6, name, &ss) == 1;
    SSL *ssl = tls.SSL_new(ch->opts.tls->ctx);

    if (ssl == NULL) {
        snprintf(err, errcap, "TLS: %s", tls_error(why, sizeof(why)));
        return NULL;
    }
    if ((is_ip ? tls.X509_VERIFY_PARAM_set1_ip_asc(tls.SSL_get0_param(ssl), name)
               : tls.SSL_set1_host(ssl, name) &&
                     tls.SSL_ctrl(ssl, SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name,
                                  (void *)(uintptr_t)name)) != 1) {
        snprintf(err, errcap, "TLS: cannot check the server's name '%s': %s", name,
                 tls_error(why, sizeof(why)));
        tls.SSL_free(ssl);
        return NULL;
    }
    return ssl;
}

/* Why TLS failed, when OpenSSL says (its error, and the certificate check's): 1 with the text in
 * out, else 0 (a plain socket error). */
static int tls_failure(struct grpc_channel *ch, char *out, size_t cap)
{
    SSL *ssl = tls.bufferevent_openssl_get_ssl(ch->bev);
    unsigned long e = tls.bufferevent_get_openssl_error(ch->bev);
    long v = ssl && ch->state == GRPC_ST_CONNECTING ? tls.SSL_get_verify_result(ssl) : X509_V_OK;
    char why[256] = "";

    if (e == 0 && v == X509_V_OK)
        return 0;
    if (e)
        tls.ERR_error_string_n(e, why, sizeof(why));
    snprintf(out, cap, "TLS%s failed: %s%s%s", ch->state == GRPC_ST_CONNECTING ? " handshake" : "",
             why[0] ? why : "", v != X509_V_OK && why[0] ? ": " : "",
             v != X509_V_OK ? tls.X509_verify_cert_error_string(v) : "");
    return 1;
}

/* The transport seam: opens the byte stream to the current endpoint at address sa (plain TCP, or
 * TLS when the channel has a context; TLS checks the endpoint's name, not sa) and the nghttp2
 * session over it. Returns 0, or -1 with err set. */
static int conn_open(struct grpc_channel *ch, const struct sockaddr *sa, socklen_t sl, char *err,
                     size_t errcap)
{
    nghttp2_session_callbacks *cbs;
    if (nghttp2_session_callbacks_new(&cbs) != 0) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, on_frame_recv_cb);
    nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, on_data_chunk_recv_cb);
    nghttp2_session_callbacks_set_on_header_callback(cbs, on_header_cb);
    nghttp2_session_callbacks_set_on_stream_close_callback(cbs, on_stream_close_cb);
    nghttp2_session_callbacks_set_on_frame_not_send_callback(cbs, on_frame_not_send_cb);
    nghttp2_option *opt;
    if (nghttp2_option_new(&opt) != 0) {
        nghttp2_session_callbacks_del(cbs);
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    /* grpc-go's default; the server's SETTINGS replace it before any call starts. */
    nghttp2_option_set_peer_max_concurrent_streams(opt, 100);
    int rv = nghttp2_session_client_new2(&ch->sess, cbs, ch, opt);
    nghttp2_option_del(opt);
    nghttp2_session_callbacks_del(cbs);
    if (rv != 0) {
        ch->sess = NULL;
        snprintf(err, errcap, "cannot create the HTTP/2 session: %s", nghttp2_strerror(rv));
        return -1;
    }
    if (ch->opts.tls) {
        /* libevent makes the socket and starts the handshake once it is connected. */
        SSL *ssl = tls_ssl_new(ch, err, errcap);
        if (ssl == NULL)
            return -1;
        ch->bev = tls.bufferevent_openssl_socket_new(ch->base, -1, ssl, BUFFEREVENT_SSL_CONNECTING,
                                                     BEV_OPT_CLOSE_ON_FREE);
        if (ch->bev == NULL) {
            tls.SSL_free(ssl);
            snprintf(err, errcap, "out of memory");
            return -1;
        }
        tls.bufferevent_openssl_set_allow_dirty_shutdown(ch->bev, 1);
    } else {
        /* Close-on-exec, so a child process never holds the connection open. */
        int fd = socket(sa->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            int e = errno;
            snprintf(err, errcap, "socket: %s", strerror(e));
            return -1;
        }
        ch->bev = bufferevent_socket_new(ch->base, fd, BEV_OPT_CLOSE_ON_FREE);
        if (ch->bev == NULL) {
            close(fd);
            snprintf(err, errcap, "out of memory");
            return -1;
        }
    }
    bufferevent_setcb(ch->bev, read_cb, NULL, event_cb, ch);
    if (bufferevent_socket_connect(ch->bev, (struct sockaddr *)sa, (int)sl) != 0) {
        int e = EVUTIL_SOCKET_ERROR();
        snprintf(err, errcap, "connect failed: %s", evutil_socket_error_to_string(e));
        return -1;
    }
    if (ch->opts.tls) /* the socket libevent made */
        fcntl(bufferevent_getfd(ch->bev), F_SETFD, FD_CLOEXEC);
    return 0;
}

/* The current endpoint's lookup ended: connects to the address resolve_pick() chooses. */
static void conn_resolved(const struct addrinfo *res, const char *why, void *arg)
{
    struct grpc_channel *ch = arg;
    const struct addrinfo *a = resolve_pick(res);
    char err[GRPC_CAUSE_MAX];

    ch->resolving = NULL;
    if (ch->dying) /* failed meanwhile (failover); the teardown is scheduled */
        return;
    if (!a) {
        conn_fail(ch, "%s", why); /* "cannot resolve 'HOST': reason" */
        return;
    }
    if (conn_open(ch, a->ai_addr, a->ai_addrlen, err, sizeof(err)) != 0)
        conn_fail(ch, "%s", err);
}

/* A connection attempt: the endpoint's host is looked up off the loop (resolve.h; numeric
 * addresses need no lookup), then connected to. The connect timeout covers both. */
static void conn_start(struct grpc_channel *ch)
{
    const struct grpc_endpoint *ep = &ch->eps[ch->ep_idx];
    ch->state = GRPC_ST_CONNECTING;
    ch->dying = 0;
    timer_arm(ch->conn_timer, ch->opts.connect_timeout_ms);
    ch->resolving = resolve_start(ch->base, ep->host, ep->port, conn_resolved, ch);
    if (!ch->resolving)
        conn_fail(ch, "cannot resolve '%s': out of memory or threads", ep->host);
}

static void retry_cb(evutil_socket_t fd, short what, void *arg)
{
    struct grpc_channel *ch = arg;
    if (ch->state == GRPC_ST_BACKOFF)
        conn_start(ch);
}

/* ---- public API ---- */

static long long opt_or(long long v, long long dflt)
{
    return v > 0 ? v : dflt;
}

struct grpc_channel *grpc_channel_new(struct event_base *base, const struct grpc_endpoint *eps,
                                      int neps, const struct grpc_channel_opts *opts,
                                      const struct grpc_channel_cbs *cbs, void *arg)
{
    if (base == NULL || eps == NULL || neps < 1 || neps > GRPC_MAX_ENDPOINTS)
        return NULL;
    for (int i = 0; i < neps; i++)
        if (eps[i].host[0] == '\0' || eps[i].port < 1 || eps[i].port > 65535 ||
            memchr(eps[i].host, '\0', sizeof(eps[i].host)) == NULL)
            return NULL;
    struct grpc_channel *ch = calloc(1, sizeof(*ch));
    if (ch == NULL)
        return NULL;
    ch->base = base;
    ch->neps = neps;
    for (int i = 0; i < neps; i++) {
        ch->eps[i] = eps[i];
        ch->eps[i].host[sizeof(ch->eps[i].host) - 1] = '\0';
    }
    struct grpc_channel_opts o = {0};
    if (opts)
        o = *opts;
    ch->opts.tls = o.tls;
    ch->opts.connect_timeout_ms = opt_or(o.connect_timeout_ms, 2000);
    ch->opts.ping_interval_ms = opt_or(o.ping_interval_ms, 10000);
    if (ch->opts.ping_interval_ms < GRPC_PING_INTERVAL_MIN)
        ch->opts.ping_interval_ms = GRPC_PING_INTERVAL_MIN;
    ch->opts.ping_timeout_ms = opt_or(o.ping_timeout_ms, 5000);
    ch->opts.backoff_min_ms = opt_or(o.backoff_min_ms, 50);
    ch->opts.backoff_max_ms = opt_or(o.backoff_max_ms, 2000);
    if (ch->opts.backoff_max_ms < ch->opts.backoff_min_ms)
        ch->opts.backoff_max_ms = ch->opts.backoff_min_ms;
    ch->backoff_cur = ch->opts.backoff_min_ms;
    if (cbs)
        ch->cbs = *cbs;
    ch->arg = arg;
    ch->rng = (uint64_t)mono_ms() * 0x9E3779B97F4A7C15ull ^ (uint64_t)(uintptr_t)ch;
    if (ch->rng == 0)
        ch->rng = 1;
    ch->work = event_new(base, -1, 0, work_cb, ch);
    ch->conn_timer = evtimer_new(base, conn_timer_cb, ch);
    ch->retry = evtimer_new(base, retry_cb, ch);
    ch->ping = evtimer_new(base, ping_cb, ch);
    ch->out = evbuffer_new();
    if (!ch->work || !ch->conn_timer || !ch->retry || !ch->ping || !ch->out) {
        grpc_channel_free(ch);
        return NULL;
    }
    ep_select(ch, 0);
    conn_start(ch);
    return ch;
}

void grpc_channel_free(struct grpc_channel *ch)
{
    if (ch == NULL)
        return;
    ch->freeing = 1;
    conn_close(ch);
    while (ch->calls) {
        struct grpc_call *c = ch->calls;
        call_unlink(c);
        call_free(c);
    }
    while (ch->grave) {
        struct grpc_call *c = ch->grave;
        ch->grave = c->next;
        call_free(c);
    }
    if (ch->work)
        event_free(ch->work);
    if (ch->conn_timer)
        event_free(ch->conn_timer);
    if (ch->retry)
        event_free(ch->retry);
    if (ch->ping)
        event_free(ch->ping);
    if (ch->out)
        evbuffer_free(ch->out);
    free(ch);
}

int grpc_channel_ready(const struct grpc_channel *ch)
{
    return ch && ch->state == GRPC_ST_READY && !ch->dying && !ch->freeing;
}

const char *grpc_channel_endpoint(const struct grpc_channel *ch)
{
    return ch ? ch->ep_name : "";
}

const char *grpc_channel_last_error(const struct grpc_channel *ch)
{
    return ch ? ch->why : "";
}

void grpc_channel_failover(struct grpc_channel *ch, const char *why)
{
    if (ch == NULL || ch->freeing)
        return;
    if (ch->state == GRPC_ST_BACKOFF || ch->dying) {
        /* Already disconnected (or about to be): the next endpoint is tried without waiting. */
        ch->force_now = 1;
        if (ch->state == GRPC_ST_BACKOFF)
            timer_arm(ch->retry, 0);
        return;
    }
    ch->force_now = 1;
    conn_fail(ch, "failover: %s", why && why[0] ? why : "requested");
}

void grpc_channel_ping_counts(const struct grpc_channel *ch, uint64_t *sent, uint64_t *acked)
{
    if (sent)
        *sent = ch ? ch->pings_sent : 0;
    if (acked)
        *acked = ch ? ch->pings_acked : 0;
}

/* Formats grpc-timeout: at most 8 digits, in the finest unit that fits. */
static void format_timeout(long long ms, char *out, size_t cap)
{
    if (ms <= 99999999)
        snprintf(out, cap, "%lldm", ms);
    else if (ms / 1000 <= 99999999)
        snprintf(out, cap, "%lldS", (ms + 999) / 1000);
    else
        snprintf(out, cap, "%lldH", (ms / 3600000 + 1) > 99999999 ? 99999999LL : ms / 3600000 + 1);
}

static nghttp2_nv make_nv(const char *name, const char *value)
{
    nghttp2_nv nv = {(uint8_t *)(uintptr_t)name, (uint8_t *)(uintptr_t)value, strlen(name),
                     strlen(value), NGHTTP2_NV_FLAG_NONE};
    return nv;
}

static int metadata_ok(const struct grpc_metadata *m)
{
    if (m->name == NULL || m->value == NULL || m->name[0] == '\0' || m->name[0] == ':')
        return 0;
    for (const char *p = m->name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '_' ||
              *p == '.'))
            return 0;
    for (const char *p = m->value; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            return 0;
    return 1;
}

struct grpc_call *grpc_call_start(struct grpc_channel *ch, const char *path,
                                  const struct grpc_metadata *md, size_t nmd, long long timeout_ms,
                                  const struct grpc_call_cbs *cbs, void *arg)
{
    if (!grpc_channel_ready(ch) || path == NULL || path[0] != '/' || cbs == NULL ||
        nmd > GRPC_MAX_METADATA || (nmd > 0 && md == NULL) || timeout_ms < 0)
        return NULL;
    for (size_t i = 0; i < nmd; i++)
        if (!metadata_ok(&md[i]))
            return NULL;
    struct grpc_call *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->ch = ch;
    c->cbs = *cbs;
    c->arg = arg;
    c->timeout_ms = timeout_ms;
    snprintf(c->path, sizeof(c->path), "%s", path);
    c->deadline = evtimer_new(ch->base, deadline_cb, c);
    if (c->deadline == NULL) {
        free(c);
        return NULL;
    }
    char tmo[32];
    nghttp2_nv nv[9 + GRPC_MAX_METADATA];
    size_t n = 0;
    nv[n++] = make_nv(":method", "POST");
    nv[n++] = make_nv(":scheme", ch->opts.tls ? "https" : "http");
    nv[n++] = make_nv(":path", path);
    nv[n++] = make_nv(":authority", ch->ep_name);
    nv[n++] = make_nv("content-type", "application/grpc");
    nv[n++] = make_nv("te", "trailers");
    if (timeout_ms > 0) {
        format_timeout(timeout_ms, tmo, sizeof(tmo));
        nv[n++] = make_nv("grpc-timeout", tmo);
    }
    for (size_t i = 0; i < nmd; i++)
        nv[n++] = make_nv(md[i].name, md[i].value);
    if (ch->md_name[0] && strcmp(path, ch->md_except) != 0)
        nv[n++] = make_nv(ch->md_name, ch->md_value);
    nghttp2_data_provider prd;
    prd.source.ptr = c;
    prd.read_callback = data_read_cb;
    int32_t sid = nghttp2_submit_request(ch->sess, NULL, nv, n, &prd, c);
    if (sid < 0) {
        if (sid == NGHTTP2_ERR_STREAM_ID_NOT_AVAILABLE)
            conn_fail(ch, "HTTP/2 stream ids used up; reconnecting");
        call_free(c);
        return NULL;
    }
    c->stream_id = sid;
    c->stream_live = 1;
    c->next = ch->calls;
    if (ch->calls)
        ch->calls->prev = c;
    ch->calls = c;
    ch->ncalls++;
    if (timeout_ms > 0) {
        c->deadline_us = mono_us() + timeout_ms * 1000;
        timer_arm(c->deadline, timeout_ms);
    }
    ping_arm(ch);
    schedule_work(ch);
    return c;
}

int grpc_channel_set_metadata(struct grpc_channel *ch, const char *name, const char *value,
                              const char *except_path)
{
    struct grpc_metadata m = {name, value};

    if (ch == NULL || !metadata_ok(&m) || strlen(name) >= sizeof(ch->md_name) ||
        strlen(value) >= sizeof(ch->md_value) ||
        (except_path && strlen(except_path) >= sizeof(ch->md_except)))
        return -1;
    snprintf(ch->md_except, sizeof(ch->md_except), "%s", except_path ? except_path : "");
    snprintf(ch->md_name, sizeof(ch->md_name), "%s", name);
    snprintf(ch->md_value, sizeof(ch->md_value), "%s", value);
    return 0;
}

static void call_resume(struct grpc_call *c)
{
    if (c->deferred && c->ch->sess) {
        c->deferred = 0;
        nghttp2_session_resume_data(c->ch->sess, c->stream_id);
    }
    schedule_work(c->ch);
}

int grpc_call_send(struct grpc_call *call, const uint8_t *msg, size_t len)
{
    if (call == NULL || call->dead || call->send_closed || (len > 0 && msg == NULL) ||
        len > GRPC_MAX_MESSAGE)
        return -1;
    size_t need = call->slen + 5 + len;
    if (need > GRPC_MAX_SEND_QUEUE)
        return -1;
    if (call->soff > 0) {
        memmove(call->sbuf, call->sbuf + call->soff, call->slen - call->soff);
        call->slen -= call->soff;
        call->soff = 0;
        need = call->slen + 5 + len;
    }
    if (need > call->scap) {
        size_t cap = call->scap ? call->scap : 256;
        while (cap < need)
            cap *= 2;
        uint8_t *nb = realloc(call->sbuf, cap);
        if (nb == NULL)
            return -1;
        call->sbuf = nb;
        call->scap = cap;
    }
    uint8_t *p = call->sbuf + call->slen;
    p[0] = 0;
    p[1] = (uint8_t)(len >> 24);
    p[2] = (uint8_t)(len >> 16);
    p[3] = (uint8_t)(len >> 8);
    p[4] = (uint8_t)len;
    if (len > 0)
        memcpy(p + 5, msg, len);
    call->slen += 5 + len;
    call_resume(call);
    return 0;
}

int grpc_call_close_send(struct grpc_call *call)
{
    if (call == NULL || call->dead || call->send_closed)
        return -1;
    call->send_closed = 1;
    call_resume(call);
    return 0;
}

void grpc_call_cancel(struct grpc_call *call)
{
    if (call == NULL || call->dead)
        return;
    call->cancelled = 1;
    call_finish(call, GRPC_STATUS_CANCELLED, "cancelled", NGHTTP2_CANCEL);
}

struct grpc_call *grpc_unary(struct grpc_channel *ch, const char *path, const uint8_t *msg,
                             size_t len, long long timeout_ms, const struct grpc_call_cbs *cbs,
                             void *arg)
{
    struct grpc_call *c = grpc_call_start(ch, path, NULL, 0, timeout_ms, cbs, arg);
    if (c == NULL)
        return NULL;
    if (grpc_call_send(c, msg, len) != 0 || grpc_call_close_send(c) != 0) {
        grpc_call_cancel(c);
        return NULL;
    }
    return c;
}
