/* httpmsg.h — HTTP/1.1 message framing (RFC 9112), pure: parses a request's or a response's head
 * and decodes a chunked body from bytes the caller holds. No sockets, no libevent, no allocation;
 * every result is a slice into the caller's buffer. */
#ifndef FG_HTTPMSG_H
#define FG_HTTPMSG_H

#include <stddef.h>
#include <stdint.h>

#define HTTPMSG_MAX_HEADERS    100   /* header fields in one head */
#define HTTPMSG_MAX_METHOD     32    /* bytes of a method token */
#define HTTPMSG_MAX_CHUNK_LINE 4096  /* bytes of a chunk-size line, extensions included */
#define HTTPMSG_MAX_TRAILERS   16384 /* bytes of a chunked body's trailer section */

struct httpmsg_slice {
    const char *p;
    size_t n;
};

struct httpmsg_header {
    struct httpmsg_slice name;  /* as sent (compare case-insensitively) */
    struct httpmsg_slice value; /* leading and trailing spaces and tabs removed */
};

/* How the body after a head is framed. */
enum httpmsg_body {
    HTTPMSG_BODY_NONE,    /* no body (a request with neither Content-Length nor chunked; a
                           * response to HEAD, 1xx, 204 or 304) */
    HTTPMSG_BODY_LENGTH,  /* exactly `length` bytes (Content-Length; 0 is reported as NONE) */
    HTTPMSG_BODY_CHUNKED, /* Transfer-Encoding: chunked; decode with httpmsg_chunked_feed() */
    HTTPMSG_BODY_CLOSE,   /* responses only: the body is everything until the connection closes */
};

struct httpmsg_request {
    struct httpmsg_slice method; /* a token, e.g. "GET" */
    struct httpmsg_slice target; /* the request-target as sent, e.g. "/v1/locks?x=1" */
    int minor;                   /* HTTP/1.<minor>: 0 or 1 */
    struct httpmsg_header headers[HTTPMSG_MAX_HEADERS];
    size_t nheaders;
    enum httpmsg_body body;
    uint64_t length;     /* HTTPMSG_BODY_LENGTH: the body's bytes */
    int keep_alive;      /* the connection may carry another request after this one: HTTP/1.1
                          * without "Connection: close", or HTTP/1.0 with "keep-alive" */
    int expect_continue; /* "Expect: 100-continue" was sent */
};

/* Parses the head (request line, header fields, blank line) of a request at the start of
 * buf[0..len). Empty lines before the request line are skipped (RFC 9112 §2.2); lines may end in
 * CRLF or a bare LF. max is the most bytes the head may take.
 *
 * Returns the head's length in bytes, blank line included (the body starts there), with *req
 * filled; 0 when the head is not complete yet and len < max (read more and call again with the
 * whole buffer); or -1 when the request must be refused: *status is the status to answer with (400
 * malformed, 431 head over max or over HTTPMSG_MAX_HEADERS fields, 501 a transfer coding other
 * than chunked, 505 a version other than HTTP/1.0 and 1.1) and err (errcap bytes, NUL-terminated)
 * says what was wrong, for the client. Refused: a malformed request line; a method that is not a
 * token or is over HTTPMSG_MAX_METHOD bytes; a field name that is not a token or has whitespace
 * before its colon; obsolete line folding; a CR not followed by LF, or a NUL, anywhere; a
 * Content-Length that is not a decimal number below 2^63, or sent twice with different values;
 * both Transfer-Encoding and Content-Length; a Transfer-Encoding whose last coding is not chunked.
 */
long httpmsg_parse_request(const char *buf, size_t len, size_t max, struct httpmsg_request *req,
                           int *status, char *err, size_t errcap);

struct httpmsg_response {
    int minor;                   /* HTTP/1.<minor>: 0 or 1 */
    int status;                  /* 100..999 (three digits) */
    struct httpmsg_slice reason; /* the reason phrase, possibly empty */
    struct httpmsg_header headers[HTTPMSG_MAX_HEADERS];
    size_t nheaders;
    enum httpmsg_body body;
    uint64_t length; /* HTTPMSG_BODY_LENGTH: the body's bytes */
    int keep_alive;  /* the connection may carry another request after this response */
};

/* Parses the head (status line, header fields, blank line) of a response at the start of
 * buf[0..len), for a client: head_request is 1 when the request was HEAD. Lines may end in CRLF or
 * a bare LF; an empty line before the status line is refused (only servers skip those, RFC 9112
 * §2.2: here one means the previous response's framing was wrong). max is the most bytes the head
 * may take. Header fields follow exactly the rules and limits of httpmsg_parse_request().
 *
 * Returns the head's length in bytes, blank line included (the body starts there), with *res
 * filled; 0 when the head is not complete yet and len < max (read more and call again with the
 * whole buffer); or -1 when the response cannot be read (answer 502), with err (errcap bytes,
 * NUL-terminated) saying why. Refused: a status line other than HTTP/1.0 or HTTP/1.1, SP, three
 * digits 100..999, then SP and a reason phrase (possibly empty) or the line end (a missing reason
 * is accepted, RFC 9112 §4); bytes that cannot start "HTTP/", before the line is complete; a head
 * over max bytes or over HTTPMSG_MAX_HEADERS fields; a field refused as for a request; and, when
 * the framing below uses them, a Transfer-Encoding with chunked more than once or with no codings,
 * or a Content-Length that is not a decimal number below 2^63 or sent twice with different values.
 *
 * The body (RFC 9112 §6.3), in this order: NONE for a HEAD request, 1xx, 204 and 304, whatever the
 * fields say; with Transfer-Encoding (any Content-Length ignored), CHUNKED when chunked is the last
 * coding of all the Transfer-Encoding fields, else CLOSE; with Content-Length, LENGTH, or NONE for
 * 0; else CLOSE. keep_alive: HTTP/1.1 unless Connection lists "close", HTTP/1.0 only when it lists
 * "keep-alive" and not "close"; but always 0 for CLOSE, for 101, with both Transfer-Encoding and
 * Content-Length (a smuggling attempt, perhaps), and with Transfer-Encoding in HTTP/1.0 (RFC 9112
 * §6.1). */
long httpmsg_parse_response(const char *buf, size_t len, size_t max, int head_request,
                            struct httpmsg_response *res, char *err, size_t errcap);

/* 1 when the header named name (case-insensitive) is in req; *value is then its first value. */
int httpmsg_find(const struct httpmsg_request *req, const char *name, struct httpmsg_slice *value);

/* The state of a chunked body being decoded; zero it with httpmsg_chunked_init(). Its layout is
 * here so that callers can embed it. */
struct httpmsg_chunked {
    int state;
    uint64_t left;   /* bytes of the current chunk's data still to come */
    size_t line;     /* bytes of the current chunk-size or trailer line seen */
    size_t trailers; /* bytes of the trailer section seen */
    int digits;      /* hex digits of the current chunk size */
    int cr;          /* the last byte was a CR */
};

void httpmsg_chunked_init(struct httpmsg_chunked *c);

/* Decodes the chunked body in buf[0..len), which continues where the last call stopped. Consumes
 * framing up to the next run of data and that run (as much of it as buf holds), or up to the end
 * of the body. Returns the bytes consumed (0 only when len is 0, or when the body was done
 * already), with *data_off and *data_len the run of body data found in them (*data_len 0 if none)
 * and *done 1 once the last chunk and the trailer section are consumed (then nothing after them is
 * consumed; trailers are skipped, not returned). Call again with the rest of buf until it is used
 * up or *done. Returns -1 with err set for a malformed body: a chunk size that is not hexadecimal
 * or is 2^60 or more, a chunk-size line over HTTPMSG_MAX_CHUNK_LINE bytes, data not followed by
 * CRLF, a trailer section over HTTPMSG_MAX_TRAILERS bytes, a CR not followed by LF, a NUL in a
 * chunk-size or trailer line. */
long httpmsg_chunked_feed(struct httpmsg_chunked *c, const char *buf, size_t len, size_t *data_off,
                          size_t *data_len, int *done, char *err, size_t errcap);

#endif
