/* pgjson.h — the JSON side of PostgreSQL stores, with no server and no libpq: the body of
 * POST /v1/stores/{store}/sql into statements and text parameters, and query results into JSON.
 * Pure (no I/O, no globals).
 *
 * Request: {"lock":"L","statements":[{"sql":"...","params":[...]}, ...]}. Parameters become
 * text parameters: a string its (unescaped) text, a number its JSON text verbatim, true/false
 * "true"/"false", null SQL NULL, an object or array its JSON text verbatim (for json/jsonb).
 * Strings holding "\u0000" are refused (PostgreSQL text cannot hold NUL). */
#ifndef FG_PGJSON_H
#define FG_PGJSON_H

#include <stddef.h>
#include <stdint.h>

#include "fg_error.h"

#define PGJSON_MAX_STATEMENTS 1000  /* statements per request */
#define PGJSON_MAX_PARAMS     10000 /* parameters per statement (libpq allows 65535) */
#define PGJSON_MAX_LOCK       512   /* bytes of a lock name (LOCK_MAX_NAME) */

struct pgjson_stmt {
    const char *sql; /* NUL-terminated, non-empty */
    int nparams;
    const char **params; /* nparams entries; NULL = SQL NULL; NUL-terminated text otherwise */
};

struct pgjson_request {
    const char *lock; /* NUL-terminated, 1..PGJSON_MAX_LOCK bytes */
    size_t lock_len;
    struct pgjson_stmt *stmts;
    int nstmts;  /* >= 1 */
    char *arena; /* owns every string above */
};

/* Parses body[0..len). Returns FG_OK with *out filled (free it with pgjson_request_free()),
 * FG_ERR_PROTO (not JSON, wrong shape, a missing, unknown or duplicate key, a value of the wrong
 * type, a statement pgjson_refusal() refuses), FG_ERR_LIMIT (too many statements or parameters, a
 * lock name too long, nesting too deep) or FG_ERR_NOMEM. On error *out is empty and err says
 * what was wrong, e.g. `statements[1].params[0]: a string holding \u0000 cannot be a text
 * parameter`. */
int pgjson_parse_request(const char *body, size_t len, struct pgjson_request *out, char *err,
                         size_t errlen) FG_MUST_CHECK;
/* Frees what pgjson_parse_request() allocated; the struct is left empty. Safe twice. */
void pgjson_request_free(struct pgjson_request *r);

/* The transaction-control keyword sql starts with, upper-cased ("BEGIN", "START", "COMMIT",
 * "END", "ROLLBACK", "ABORT", "SAVEPOINT", "RELEASE", "PREPARE"), or NULL. Leading whitespace,
 * comments and empty statements are skipped as PostgreSQL's lexer does: "--" comments end at \n
 * or \r, block comments nest, and ";COMMIT" is one statement, COMMIT. */
const char *pgjson_txn_keyword(const char *sql);

/* Why sql may not run in a batch (an English phrase), or NULL when it may. Refused:
 * - empty statements (only whitespace, comments, ';'): they yield no result and would shift the
 *   results against the statements;
 * - transaction control (pgjson_txn_keyword()): it would end fencegate's transaction early;
 * - COPY: its data is not carried (and would stall the connection);
 * - LISTEN, UNLISTEN, DISCARD, DEALLOCATE, RESET, SET ROLE, SET SESSION AUTHORIZATION and every
 *   session-level SET: they change a pooled connection that other batches share (SET LOCAL,
 *   SET TRANSACTION and SET CONSTRAINTS end with the transaction and are allowed);
 * - any text that mentions fencegate_fence (case-insensitively): fencegate's own table.
 * This is a guard against mistakes, not a sandbox: functions can do what statements cannot, so
 * pgstore.c also checks that the batch ends in the transaction it began. */
const char *pgjson_refusal(const char *sql);

/* A growing output buffer. On allocation failure `failed` is set and later writes are dropped;
 * with a `limit` (bytes, 0 = none), a write that would pass it sets `over` and `failed`. */
struct pgjson_buf {
    char *p;
    size_t len, cap;
    size_t limit;
    int failed;
    int over;
};
void pgjson_buf_free(struct pgjson_buf *b);
void pgjson_put(struct pgjson_buf *b, const char *s, size_t n);
void pgjson_puts(struct pgjson_buf *b, const char *s);
/* s[0..n) as a JSON string, quotes included: '"', '\\' and control bytes escaped, invalid UTF-8
 * replaced by U+FFFD, so the output is always valid JSON. */
void pgjson_put_str(struct pgjson_buf *b, const char *s, size_t n);

/* PostgreSQL type OIDs the renderer knows. */
#define PGJSON_OID_BOOL    16
#define PGJSON_OID_INT8    20
#define PGJSON_OID_INT2    21
#define PGJSON_OID_INT4    23
#define PGJSON_OID_TEXT    25
#define PGJSON_OID_OID     26
#define PGJSON_OID_FLOAT4  700
#define PGJSON_OID_FLOAT8  701
#define PGJSON_OID_NUMERIC 1700

/* One value in text format: NULL -> null; bool "t"/"f" -> true/false; int2/int4/int8/oid/
 * float4/float8/numeric -> a JSON number when the text is one (NaN, Infinity stay strings);
 * everything else -> a JSON string. */
void pgjson_put_value(struct pgjson_buf *b, unsigned oid, const char *text, size_t n, int isnull);

/* The name of a built-in type ("int4", "text", ...), or NULL when not known here. */
const char *pgjson_type_name(unsigned oid);

/* Splits a command tag ("UPDATE 3", "INSERT 0 1", "CREATE TABLE") into the command (its length
 * in *cmdlen: "UPDATE", "INSERT", "CREATE TABLE") and the row count (-1 when the tag has none). */
void pgjson_command(const char *tag, size_t *cmdlen, long long *rows);

/* A result set as the renderer sees it; pgstore.c fills it from a PGresult. */
struct pgjson_result {
    const char *tag; /* the command tag, e.g. "SELECT 2" */
    int ncols, nrows;
    void *arg;
    const char *(*col_name)(void *arg, int col);
    unsigned (*col_type)(void *arg, int col);
    /* NULL for SQL NULL; else the text, its length in *n */
    const char *(*value)(void *arg, int row, int col, size_t *n);
};

/* Appends {"command":..,"rows_affected":..,"columns":[..],"types":[..],"rows":[[..],..]}.
 * rows_affected is null for commands without a count; types hold pgjson_type_name() or the OID
 * as a decimal string. */
void pgjson_put_result(struct pgjson_buf *b, const struct pgjson_result *r);

#endif
