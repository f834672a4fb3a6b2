/* resp.h — pure RESP codec: a resumable request parser and a streaming reply scanner (no I/O). */
#ifndef FG_RESP_H
#define FG_RESP_H

#include <stddef.h>
#include <stdint.h>

#include "fg_error.h"

/* Declared limits. The defaults mirror Redis 7 (proto-max-bulk-len 512 MB, 64 KB inline lines). */
#define RESP_DEFAULT_MAX_BULK   (512LL * 1024 * 1024)
#define RESP_DEFAULT_MAX_ARGS   (1024 * 1024 * 8)
#define RESP_DEFAULT_MAX_INLINE (64 * 1024)
/* Aggregates the reply scanner keeps open at once. Nesting through last elements costs nothing
 * (see resp_scan_reply), so this bounds only aggregates nested before their parents' ends. */
#define RESP_MAX_DEPTH 32
#define RESP_MAX_LINE  (64 * 1024) /* a header line ("*123\r\n") longer than this is an error */

struct resp_limits {
    long long max_bulk; /* largest bulk string in a request */
    size_t max_args;    /* largest multibulk count in a request */
    size_t max_inline;  /* longest inline request line */
};

/* A slice of the caller's buffer, as an offset from the start of the current message. */
struct resp_slice {
    size_t off;
    size_t len;
};

/* ---- Requests ---------------------------------------------------------------------------- */

/* One parsed request. argv points into the parser and stays valid until the next call to
 * resp_parse_request() or resp_parser_free(). Offsets are relative to the `buf` argument of
 * the call that returned RESP_DONE, which must point at the first byte of the message. */
struct resp_request {
    size_t argc;                   /* 0 for an empty request (blank line, "*0", "*-1") */
    const struct resp_slice *argv; /* argc entries */
    size_t len;                    /* bytes the message occupies, from buf[0] */
    int is_inline;                 /* 1: inline form; argv slices are raw tokens */
    int has_quoted;                /* 1: inline with quoted tokens; slices include the quotes */
};

enum resp_status {
    RESP_DONE = 0,     /* one whole message; its size is in ->len / *used */
    RESP_PARTIAL = 1,  /* need more bytes; call again with the same message start */
    RESP_INVALID = -2, /* protocol error; resp_parser_error() says what, like Redis would */
};

struct resp_parser;

/* Creates a parser with the given limits (NULL: the defaults). Returns NULL when out of memory. */
struct resp_parser *resp_parser_new(const struct resp_limits *lim);
/* Frees the parser; NULL is a no-op. */
void resp_parser_free(struct resp_parser *p);

/* Parses one request whose first byte is buf[0]; len bytes are available. Resumable: after
 * RESP_PARTIAL call again with the same message start (it may have moved in memory) and more
 * bytes; work already done is not repeated. Returns RESP_DONE (fills *out and resets the parser
 * for the next message), RESP_PARTIAL, or RESP_INVALID (the connection should be answered with
 * "-ERR <resp_parser_error()>" and closed). Nothing is allocated from a declared count: memory
 * grows only with bytes actually received. */
int resp_parse_request(struct resp_parser *p, const char *buf, size_t len,
                       struct resp_request *out) FG_MUST_CHECK;

/* After RESP_INVALID: Redis's wording, e.g. "Protocol error: invalid bulk length". */
const char *resp_parser_error(const struct resp_parser *p);

/* Forgets any partial message. */
void resp_parser_reset(struct resp_parser *p);

/* ---- Replies ----------------------------------------------------------------------------- */

/* A streaming scanner of RESP2 and RESP3 replies. It consumes bytes as it goes, so the caller may
 * forward and drop them before the reply is complete; only an unfinished header line must be
 * presented again. The struct is public so callers can embed it; initialise with
 * resp_scanner_init(). */
struct resp_scanner {
    int depth;                           /* open aggregates (last-element chains count once) */
    long long remaining[RESP_MAX_DEPTH]; /* elements still expected per open aggregate */
    unsigned char push[RESP_MAX_DEPTH];  /* the aggregate is a push inside another reply */
    long long bulk_left;                 /* payload bytes (+CRLF) still expected of a bulk */
    char top_type;                       /* first byte of the current top-level reply, 0 if none */
    size_t line_seen; /* bytes of an unfinished header line already searched for its CR */
};
/* A RESP3 attribute ("|n") annotates the element after it: the scanner treats it as an aggregate
 * of 2n + 1 elements, so the annotated element completes it. A top-level push ('>') is scanned
 * like any reply; telling pushes apart is the caller's business (s->top_type). A push inside
 * another reply (Redis 7.0 writes a keyspace event into the reply of a blocked command it serves
 * to a RESP3 client listening to such events) is scanned as part of it, not one of its elements,
 * so the reply passes as Redis wrote it. */

enum resp_scan_status {
    RESP_SCAN_DONE = 0,    /* a whole top-level reply ends at buf[*used - 1] */
    RESP_SCAN_MORE = 1,    /* all *used bytes belong to an unfinished reply; call again */
    RESP_SCAN_INVALID = -2 /* not RESP */
};

void resp_scanner_init(struct resp_scanner *s);

/* Scans from buf[0] (len bytes). Sets *used to the bytes consumed: on RESP_SCAN_DONE the end of
 * one complete top-level reply (the scanner is reset for the next, and s->top_type still names
 * the finished reply's type until the next call); on RESP_SCAN_MORE every byte that could be
 * consumed (an incomplete header line is left unconsumed and must be passed again). */
int resp_scan_reply(struct resp_scanner *s, const char *buf, size_t len,
                    size_t *used) FG_MUST_CHECK;

/* ---- Reading whole replies element by element (for small control replies) ------------------ */

/* One element header of a complete reply held in memory. */
struct resp_elem {
    char type;       /* '+', '-', ':', '$', '*', '%', '~', '>', '_', ',', '#', '=', '(', '!', '|' */
    long long count; /* aggregates: element count (maps: pairs * 2); -1 for a null aggregate */
    long long ival;  /* ':' integer; '#' 1/0 */
    const char *str; /* '+', '-', '$', '=', '!', ',', '(' : the payload (not NUL-terminated) */
    size_t len;      /* its length; bulk null: str == NULL */
};

/* Reads the element header at buf[0]. For an aggregate, *used covers only its header: the
 * children follow. For others, *used covers the whole element. Returns RESP_DONE, RESP_PARTIAL or
 * RESP_INVALID. */
int resp_read_elem(const char *buf, size_t len, struct resp_elem *e, size_t *used) FG_MUST_CHECK;

/* Skips one whole element (including children) at buf[0]; RESP_DONE with *used, or as above. */
int resp_skip_elem(const char *buf, size_t len, size_t *used) FG_MUST_CHECK;

/* ---- Encoding helpers -------------------------------------------------------------------- */

/* Writes "*<n>\r\n" or "$<n>\r\n"-style headers: returns bytes written into out (>= 32 bytes). */
size_t resp_write_header(char *out, char type, long long n);

#endif
