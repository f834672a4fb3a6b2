/* pgjson.c — request parsing and result rendering for PostgreSQL stores (see pgjson.h). */
#include "pgjson.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "json.h"

/* ---- request ------------------------------------------------------------------------------- */

struct pgj_parse {
    struct json_reader r;
    const char *body;
    char *arena;
    size_t used, cap;
    char *err;
    size_t errlen;
};

static int pgj_fail(struct pgj_parse *p, int rc, const char *fmt, ...) FG_PRINTF(3, 4);

static int pgj_fail(struct pgj_parse *p, int rc, const char *fmt, ...)
{
    va_list ap;

    if (p->errlen) {
        va_start(ap, fmt);
        vsnprintf(p->err, p->errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* The reader's own error (bad JSON, too deep). */
static int pgj_json_fail(struct pgj_parse *p, int rc)
{
    return pgj_fail(p, rc, "body is not valid JSON: %s", json_reader_error(&p->r));
}

static int pgj_next(struct pgj_parse *p, struct json_token *t)
{
    int rc = json_next(&p->r, t);

    return rc == FG_OK ? FG_OK : pgj_json_fail(p, rc);
}

static const char *pgj_type_word(enum json_type t)
{
    switch (t) {
    case JSON_OBJECT_BEGIN:
        return "an object";
    case JSON_ARRAY_BEGIN:
        return "an array";
    case JSON_STRING:
        return "a string";
    case JSON_NUMBER:
        return "a number";
    case JSON_TRUE:
    case JSON_FALSE:
        return "a boolean";
    case JSON_NULL:
        return "null";
    default:
        return "something else";
    }
}

/* Copies n raw bytes into the arena, NUL-terminated. The arena is sized so this always fits. */
static const char *pgj_copy(struct pgj_parse *p, const char *s, size_t n)
{
    char *d = p->arena + p->used;

    memcpy(d, s, n);
    d[n] = '\0';
    p->used += n + 1;
    return d;
}

/* Unescapes a string token into the arena. Returns NULL when it decodes to a NUL byte. */
static const char *pgj_string(struct pgj_parse *p, const struct json_token *t, size_t *outlen)
{
    char *d = p->arena + p->used;
    size_t n = 0;

    if (json_unescape(t->ptr, t->len, d, p->cap - p->used, &n) != FG_OK)
        return NULL;
    if (memchr(d, '\0', n))
        return NULL;
    p->used += n + 1;
    if (outlen)
        *outlen = n;
    return d;
}

/* One parameter value; t is its first token. */
static int pgj_param(struct pgj_parse *p, const struct json_token *t, const char *where,
                     const char **out)
{
    struct json_token e;
    int rc;

    switch (t->type) {
    case JSON_STRING:
        *out = pgj_string(p, t, NULL);
        if (!*out)
            return pgj_fail(p, FG_ERR_PROTO,
                            "%s: a string holding \\u0000 cannot be a text parameter", where);
        return FG_OK;
    case JSON_NUMBER:
        *out = pgj_copy(p, t->ptr, t->len);
        return FG_OK;
    case JSON_TRUE:
        *out = "true";
        return FG_OK;
    case JSON_FALSE:
        *out = "false";
        return FG_OK;
    case JSON_NULL:
        *out = NULL;
        return FG_OK;
    case JSON_OBJECT_BEGIN:
    case JSON_ARRAY_BEGIN:
        /* Its JSON text verbatim: read up to the matching end token. */
        for (;;) {
            rc = pgj_next(p, &e);
            if (rc)
                return rc;
            if ((e.type == JSON_OBJECT_END || e.type == JSON_ARRAY_END) && e.depth == t->depth)
                break;
        }
        *out = pgj_copy(p, p->body + t->off, e.off + 1 - t->off);
        return FG_OK;
    default:
        return pgj_fail(p, FG_ERR_PROTO, "%s: unexpected token", where);
    }
}

static int pgj_params(struct pgj_parse *p, struct pgjson_stmt *st, int si)
{
    struct json_token t;
    char where[64];
    int cap = 0, rc;

    for (;;) {
        rc = pgj_next(p, &t);
        if (rc)
            return rc;
        if (t.type == JSON_ARRAY_END)
            return FG_OK;
        if (st->nparams >= PGJSON_MAX_PARAMS)
            return pgj_fail(p, FG_ERR_LIMIT, "statements[%d].params: more than %d parameters", si,
                            PGJSON_MAX_PARAMS);
        if (st->nparams == cap) {
            int ncap = cap ? cap * 2 : 8;
            const char **np = realloc(st->params, (size_t)ncap * sizeof(*np));
            if (!np)
                return pgj_fail(p, FG_ERR_NOMEM, "out of memory");
            st->params = np;
            cap = ncap;
        }
        snprintf(where, sizeof(where), "statements[%d].params[%d]", si, st->nparams);
        rc = pgj_param(p, &t, where, &st->params[st->nparams]);
        if (rc)
            return rc;
        st->nparams++;
    }
}

/* One statement object; its '{' was read. */
static int pgj_statement(struct pgj_parse *p, struct pgjson_stmt *st, int si)
{
    struct json_token t;
    const char *why;
    int have_sql = 0, have_params = 0, rc;
    size_t n = 0;

    for (;;) {
        rc = pgj_next(p, &t);
        if (rc)
            return rc;
        if (t.type == JSON_OBJECT_END)
            break;
        if (json_string_equals(&t, "sql")) {
            if (have_sql++)
                return pgj_fail(p, FG_ERR_PROTO, "statements[%d]: duplicate key \"sql\"", si);
            rc = pgj_next(p, &t);
            if (rc)
                return rc;
            if (t.type != JSON_STRING)
                return pgj_fail(p, FG_ERR_PROTO, "statements[%d].sql: expected a string, got %s",
                                si, pgj_type_word(t.type));
            st->sql = pgj_string(p, &t, &n);
            if (!st->sql)
                return pgj_fail(p, FG_ERR_PROTO, "statements[%d].sql: holds a \\u0000 character",
                                si);
        } else if (json_string_equals(&t, "params")) {
            if (have_params++)
                return pgj_fail(p, FG_ERR_PROTO, "statements[%d]: duplicate key \"params\"", si);
            rc = pgj_next(p, &t);
            if (rc)
                return rc;
            if (t.type != JSON_ARRAY_BEGIN)
                return pgj_fail(p, FG_ERR_PROTO, "statements[%d].params: expected an array, got %s",
                                si, pgj_type_word(t.type));
            rc = pgj_params(p, st, si);
            if (rc)
                return rc;
        } else {
            char key[64];
            size_t kl = 0;
            if (json_unescape(t.ptr, t.len > 60 ? 60 : t.len, key, sizeof(key), &kl) != FG_OK)
                snprintf(key, sizeof(key), "?");
            return pgj_fail(p, FG_ERR_PROTO,
                            "statements[%d]: unknown key \"%s\" (expected \"sql\" and optional "
                            "\"params\")",
                            si, key);
        }
    }
    if (!have_sql)
        return pgj_fail(p, FG_ERR_PROTO, "statements[%d]: missing \"sql\"", si);
    why = pgjson_refusal(st->sql);
    if (why) {
        const char *kw = pgjson_txn_keyword(st->sql);
        if (kw)
            return pgj_fail(p, FG_ERR_PROTO,
                            "statements[%d].sql: %s is not allowed: fencegate runs the whole batch "
                            "as one transaction of its own",
                            si, kw);
        return pgj_fail(p, FG_ERR_PROTO, "statements[%d].sql: %s", si, why);
    }
    return FG_OK;
}

static int pgj_statements(struct pgj_parse *p, struct pgjson_request *out)
{
    struct json_token t;
    int cap = 0, rc;

    for (;;) {
        rc = pgj_next(p, &t);
        if (rc)
            return rc;
        if (t.type == JSON_ARRAY_END)
            break;
        if (t.type != JSON_OBJECT_BEGIN)
            return pgj_fail(p, FG_ERR_PROTO,
                            "statements[%d]: expected an object {\"sql\", \"params\"}, got %s",
                            out->nstmts, pgj_type_word(t.type));
        if (out->nstmts >= PGJSON_MAX_STATEMENTS)
            return pgj_fail(p, FG_ERR_LIMIT, "statements: more than %d statements",
                            PGJSON_MAX_STATEMENTS);
        if (out->nstmts == cap) {
            int ncap = cap ? cap * 2 : 4;
            struct pgjson_stmt *ns = realloc(out->stmts, (size_t)ncap * sizeof(*ns));
            if (!ns)
                return pgj_fail(p, FG_ERR_NOMEM, "out of memory");
            out->stmts = ns;
            cap = ncap;
        }
        memset(&out->stmts[out->nstmts], 0, sizeof(out->stmts[0]));
        out->nstmts++;
        rc = pgj_statement(p, &out->stmts[out->nstmts - 1], out->nstmts - 1);
        if (rc)
            return rc;
    }
    if (out->nstmts == 0)
        return pgj_fail(p, FG_ERR_PROTO, "statements: expected at least one statement");
    return FG_OK;
}

static int pgj_request(struct pgj_parse *p, struct pgjson_request *out)
{
    struct json_token t;
    int have_lock = 0, have_stmts = 0, rc;

    rc = pgj_next(p, &t);
    if (rc)
        return rc;
    if (t.type != JSON_OBJECT_BEGIN)
        return pgj_fail(p, FG_ERR_PROTO,
                        "body: expected an object {\"lock\", \"statements\"}, got %s",
                        pgj_type_word(t.type));
    for (;;) {
        rc = pgj_next(p, &t);
        if (rc)
            return rc;
        if (t.type == JSON_OBJECT_END)
            break;
        if (json_string_equals(&t, "lock")) {
            if (have_lock++)
                return pgj_fail(p, FG_ERR_PROTO, "duplicate key \"lock\"");
            rc = pgj_next(p, &t);
            if (rc)
                return rc;
            if (t.type != JSON_STRING)
                return pgj_fail(p, FG_ERR_PROTO, "lock: expected a string, got %s",
                                pgj_type_word(t.type));
            out->lock = pgj_string(p, &t, &out->lock_len);
            if (!out->lock)
                return pgj_fail(p, FG_ERR_PROTO, "lock: holds a \\u0000 character");
            if (out->lock_len == 0)
                return pgj_fail(p, FG_ERR_PROTO, "lock: must not be empty");
            if (out->lock_len > PGJSON_MAX_LOCK)
                return pgj_fail(p, FG_ERR_LIMIT, "lock: longer than %d bytes", PGJSON_MAX_LOCK);
        } else if (json_string_equals(&t, "statements")) {
            if (have_stmts++)
                return pgj_fail(p, FG_ERR_PROTO, "duplicate key \"statements\"");
            rc = pgj_next(p, &t);
            if (rc)
                return rc;
            if (t.type != JSON_ARRAY_BEGIN)
                return pgj_fail(p, FG_ERR_PROTO, "statements: expected an array, got %s",
                                pgj_type_word(t.type));
            rc = pgj_statements(p, out);
            if (rc)
                return rc;
        } else {
            char key[64];
            size_t kl = 0;
            if (json_unescape(t.ptr, t.len > 60 ? 60 : t.len, key, sizeof(key), &kl) != FG_OK)
                snprintf(key, sizeof(key), "?");
            return pgj_fail(p, FG_ERR_PROTO,
                            "unknown key \"%s\" (expected \"lock\" and \"statements\")", key);
        }
    }
    rc = pgj_next(p, &t);
    if (rc)
        return rc;
    if (!have_lock)
        return pgj_fail(p, FG_ERR_PROTO,
                        "missing \"lock\" (the lock whose token fences the batch)");
    if (!have_stmts)
        return pgj_fail(p, FG_ERR_PROTO, "missing \"statements\"");
    return FG_OK;
}

int pgjson_parse_request(const char *body, size_t len, struct pgjson_request *out, char *err,
                         size_t errlen)
{
    struct pgj_parse p;
    int rc;

    memset(out, 0, sizeof(*out));
    if (errlen)
        err[0] = '\0';
    memset(&p, 0, sizeof(p));
    p.err = err;
    p.errlen = errlen;
    if (len == 0 || !body)
        return pgj_fail(&p, FG_ERR_PROTO, "empty body: expected {\"lock\", \"statements\"}");
    /* Every string lands in the arena with its NUL; decoded text is never longer than its
     * source, and each value takes at least one source byte, so 2 * len + 1 bytes suffice. */
    p.cap = 2 * len + 1;
    p.arena = malloc(p.cap);
    if (!p.arena)
        return pgj_fail(&p, FG_ERR_NOMEM, "out of memory");
    p.body = body;
    json_reader_init(&p.r, body, len);
    out->arena = p.arena;
    rc = pgj_request(&p, out);
    if (rc != FG_OK)
        pgjson_request_free(out);
    return rc;
}

void pgjson_request_free(struct pgjson_request *r)
{
    for (int i = 0; i < r->nstmts; i++)
        free(r->stmts[i].params);
    free(r->stmts);
    free(r->arena);
    memset(r, 0, sizeof(*r));
}

/* Skips whitespace, SQL comments and empty statements as PostgreSQL's lexer does: "--" comments
 * end at \n or \r, block comments nest, and a ';' before a statement only ends an empty one.
 * An unterminated block comment runs to the end (PostgreSQL refuses it anyway). */
static const char *pgj_skip_space(const char *s, int semicolons)
{
    for (;;) {
        while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r' || *s == '\f' || *s == '\v' ||
               (semicolons && *s == ';'))
            s++;
        if (s[0] == '-' && s[1] == '-') {
            while (*s && *s != '\n' && *s != '\r')
                s++;
        } else if (s[0] == '/' && s[1] == '*') {
            int depth = 1;
            s += 2;
            while (*s && depth > 0) {
                if (s[0] == '/' && s[1] == '*') {
                    depth++;
                    s += 2;
                } else if (s[0] == '*' && s[1] == '/') {
                    depth--;
                    s += 2;
                } else {
                    s++;
                }
            }
        } else {
            return s;
        }
    }
}

/* The keyword (identifier-like word) at s: its length, 0 when s does not start one. */
static size_t pgj_word(const char *s)
{
    size_t n = 0;

    while ((s[n] >= 'a' && s[n] <= 'z') || (s[n] >= 'A' && s[n] <= 'Z') || s[n] == '_' ||
           (n > 0 && ((s[n] >= '0' && s[n] <= '9') || s[n] == '$')) || (unsigned char)s[n] >= 0x80)
        n++;
    return n;
}

/* 1 when the word s[0..n) is kw (upper case), ignoring case. */
static int pgj_is(const char *s, size_t n, const char *kw)
{
    return strlen(kw) == n && strncasecmp(s, kw, n) == 0;
}

/* The word after the one at s[0..n), past whitespace and comments; its length in *len. */
static const char *pgj_next_word(const char *s, size_t n, size_t *len)
{
    s = pgj_skip_space(s + n, 0);
    *len = pgj_word(s);
    return s;
}

const char *pgjson_txn_keyword(const char *sql)
{
    static const char *const kw[] = {"BEGIN", "START",     "COMMIT",  "END",     "ROLLBACK",
                                     "ABORT", "SAVEPOINT", "RELEASE", "PREPARE", NULL};
    const char *s = pgj_skip_space(sql, 1);
    size_t n = pgj_word(s);

    for (int i = 0; kw[i]; i++)
        if (pgj_is(s, n, kw[i]))
            return kw[i];
    return NULL;
}

/* 1 when s (case-insensitively) contains the fence table's name, which is also the prefix of
 * fencegate's prepared statements; 2 when it has a Unicode-escaped identifier (U&"..."), which
 * could spell that name without these letters. */
static int pgj_mentions_fence(const char *s)
{
    static const char name[] = "fencegate_fence";

    for (; *s; s++) {
        if (strncasecmp(s, name, sizeof(name) - 1) == 0)
            return 1;
        if ((s[0] == 'U' || s[0] == 'u') && s[1] == '&' && s[2] == '"')
            return 2;
    }
    return 0;
}

const char *pgjson_refusal(const char *sql)
{
    static const char *const session[] = {"LISTEN", "UNLISTEN", "DISCARD", "DEALLOCATE", NULL};
    const char *s = pgj_skip_space(sql, 1), *w2, *w3;
    size_t n, n2, n3;

    if (!*s)
        return "empty statement (nothing but whitespace, comments or ';')";
    switch (pgj_mentions_fence(sql)) {
    case 1:
        return "fencegate_fence is fencegate's own table (and the prefix of its prepared "
               "statements); statements may not mention it";
    case 2:
        return "Unicode-escaped identifiers (U&\"...\") are not allowed: they could name "
               "fencegate_fence without spelling it";
    }
    n = pgj_word(s);
    if (pgjson_txn_keyword(s))
        return "transaction control (BEGIN, COMMIT, ROLLBACK, SAVEPOINT, PREPARE, ...) is not "
               "allowed: fencegate runs the whole batch as one transaction of its own";
    if (pgj_is(s, n, "COPY"))
        return "COPY is not allowed: fencegate does not carry COPY data";
    if (pgj_is(s, n, "EXECUTE"))
        return "EXECUTE is not allowed: the prepared statements of a pooled connection are "
               "fencegate's own";
    for (int i = 0; session[i]; i++)
        if (pgj_is(s, n, session[i]))
            return "LISTEN, UNLISTEN, DISCARD and DEALLOCATE are not allowed: they change the "
                   "state of a pooled connection that other batches share";
    if (pgj_is(s, n, "RESET"))
        return "RESET is not allowed: it changes the session of a pooled connection that other "
               "batches share (SET LOCAL settings end with the batch anyway)";
    if (pgj_is(s, n, "SET")) {
        w2 = pgj_next_word(s, n, &n2);
        /* Transaction-scoped forms end with the batch's transaction. */
        if (pgj_is(w2, n2, "LOCAL") || pgj_is(w2, n2, "TRANSACTION") ||
            pgj_is(w2, n2, "CONSTRAINTS"))
            return NULL;
        w3 = pgj_next_word(w2, n2, &n3);
        if (pgj_is(w2, n2, "ROLE") ||
            (pgj_is(w2, n2, "SESSION") && pgj_is(w3, n3, "AUTHORIZATION")))
            return "SET ROLE and SET SESSION AUTHORIZATION are not allowed: they change the role "
                   "of a pooled connection that other batches share";
        return "a session-level SET is not allowed: it outlives the batch on a pooled connection "
               "that other batches share; use SET LOCAL";
    }
    return NULL;
}

/* ---- output -------------------------------------------------------------------------------- */

void pgjson_buf_free(struct pgjson_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

void pgjson_put(struct pgjson_buf *b, const char *s, size_t n)
{
    if (b->failed)
        return;
    if (b->limit && n > b->limit - (b->len < b->limit ? b->len : b->limit)) {
        b->over = 1;
        b->failed = 1;
        return;
    }
    if (b->len + n + 1 > b->cap) {
        size_t ncap = b->cap ? b->cap : 256;
        char *np;
        while (ncap < b->len + n + 1)
            ncap *= 2;
        np = realloc(b->p, ncap);
        if (!np) {
            b->failed = 1;
            return;
        }
        b->p = np;
        b->cap = ncap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void pgjson_puts(struct pgjson_buf *b, const char *s)
{
    pgjson_put(b, s, strlen(s));
}

/* Length of the valid UTF-8 sequence at s (n bytes left), or 0 when it is not one. */
static size_t pgj_utf8_len(const unsigned char *s, size_t n)
{
    size_t need;
    unsigned cp;

    if (s[0] < 0x80)
        return 1;
    if (s[0] >= 0xc2 && s[0] <= 0xdf) {
        need = 2;
        cp = s[0] & 0x1f;
    } else if (s[0] >= 0xe0 && s[0] <= 0xef) {
        need = 3;
        cp = s[0] & 0x0f;
    } else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
        need = 4;
        cp = s[0] & 0x07;
    } else {
        return 0;
    }
    if (n < need)
        return 0;
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((need == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (need == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return 0;
    return need;
}

void pgjson_put_str(struct pgjson_buf *b, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;
    char esc[8];

    pgjson_put(b, "\"", 1);
    while (i < n) {
        size_t l = pgj_utf8_len(u + i, n - i);
        if (l > 0 && u[i] >= 0x20 && u[i] != '"' && u[i] != '\\') {
            i += l;
            run += l;
            continue;
        }
        pgjson_put(b, s + i - run, run);
        run = 0;
        if (l == 0) {
            pgjson_put(b, "\xef\xbf\xbd", 3); /* U+FFFD for a byte that is not UTF-8 */
        } else if (u[i] == '"' || u[i] == '\\') {
            esc[0] = '\\';
            esc[1] = (char)u[i];
            pgjson_put(b, esc, 2);
        } else {
            snprintf(esc, sizeof(esc), "\\u%04x", u[i]);
            pgjson_put(b, esc, 6);
        }
        i++;
    }
    pgjson_put(b, s + i - run, run);
    pgjson_put(b, "\"", 1);
}

/* 1 when s[0..n) is a number per the JSON grammar. */
static int pgj_is_json_number(const char *s, size_t n)
{
    size_t i = 0, d;

    if (i < n && s[i] == '-')
        i++;
    if (i < n && s[i] == '0') {
        i++;
    } else {
        d = i;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
        if (i == d || s[d] == '0')
            return 0;
    }
    if (i < n && s[i] == '.') {
        d = ++i;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
        if (i == d)
            return 0;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        d = i;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
        if (i == d)
            return 0;
    }
    return i == n && n > 0;
}

void pgjson_put_value(struct pgjson_buf *b, unsigned oid, const char *text, size_t n, int isnull)
{
    if (isnull || !text) {
        pgjson_put(b, "null", 4);
        return;
    }
    switch (oid) {
    case PGJSON_OID_BOOL:
        if (n == 1 && (text[0] == 't' || text[0] == 'f')) {
            pgjson_puts(b, text[0] == 't' ? "true" : "false");
            return;
        }
        break;
    case PGJSON_OID_INT2:
    case PGJSON_OID_INT4:
    case PGJSON_OID_INT8:
    case PGJSON_OID_OID:
    case PGJSON_OID_FLOAT4:
    case PGJSON_OID_FLOAT8:
    case PGJSON_OID_NUMERIC:
        if (pgj_is_json_number(text, n)) {
            pgjson_put(b, text, n);
            return;
        }
        break;
    default:
        break;
    }
    pgjson_put_str(b, text, n);
}

const char *pgjson_type_name(unsigned oid)
{
    static const struct {
        unsigned oid;
        const char *name;
    } types[] = {
        {16, "bool"},        {17, "bytea"},         {18, "char"},       {19, "name"},
        {20, "int8"},        {21, "int2"},          {23, "int4"},       {25, "text"},
        {26, "oid"},         {114, "json"},         {700, "float4"},    {701, "float8"},
        {1042, "bpchar"},    {1043, "varchar"},     {1082, "date"},     {1083, "time"},
        {1114, "timestamp"}, {1184, "timestamptz"}, {1186, "interval"}, {1700, "numeric"},
        {2950, "uuid"},      {3802, "jsonb"},       {2278, "void"},     {705, "unknown"},
    };

    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (types[i].oid == oid)
            return types[i].name;
    return NULL;
}

void pgjson_command(const char *tag, size_t *cmdlen, long long *rows)
{
    size_t n = strlen(tag), end = n;

    *rows = -1;
    /* Strip trailing " <digits>" words; the last one is the row count. */
    for (;;) {
        size_t i = end;
        while (i > 0 && tag[i - 1] >= '0' && tag[i - 1] <= '9')
            i--;
        if (i == end || i == 0 || tag[i - 1] != ' ')
            break;
        if (*rows < 0 && end - i <= 18) {
            long long v = 0;
            for (size_t k = i; k < end; k++)
                v = v * 10 + (tag[k] - '0');
            *rows = v;
        }
        end = i - 1;
    }
    *cmdlen = end;
}

void pgjson_put_result(struct pgjson_buf *b, const struct pgjson_result *r)
{
    size_t cmdlen;
    long long rows;
    char num[32];

    pgjson_command(r->tag ? r->tag : "", &cmdlen, &rows);
    pgjson_puts(b, "{\"command\":");
    pgjson_put_str(b, r->tag ? r->tag : "", cmdlen);
    if (rows >= 0) {
        snprintf(num, sizeof(num), "%lld", rows);
        pgjson_puts(b, ",\"rows_affected\":");
        pgjson_puts(b, num);
    } else {
        pgjson_puts(b, ",\"rows_affected\":null");
    }
    pgjson_puts(b, ",\"columns\":[");
    for (int c = 0; c < r->ncols; c++) {
        const char *nm = r->col_name(r->arg, c);
        if (c)
            pgjson_put(b, ",", 1);
        pgjson_put_str(b, nm ? nm : "", nm ? strlen(nm) : 0);
    }
    pgjson_puts(b, "],\"types\":[");
    for (int c = 0; c < r->ncols; c++) {
        unsigned oid = r->col_type(r->arg, c);
        const char *tn = pgjson_type_name(oid);
        if (c)
            pgjson_put(b, ",", 1);
        if (!tn) {
            snprintf(num, sizeof(num), "%u", oid);
            tn = num;
        }
        pgjson_put_str(b, tn, strlen(tn));
    }
    pgjson_puts(b, "],\"rows\":[");
    for (int i = 0; i < r->nrows && !b->failed; i++) {
        pgjson_puts(b, i ? ",[" : "[");
        for (int c = 0; c < r->ncols; c++) {
            size_t n = 0;
            const char *v = r->value(r->arg, i, c, &n);
            if (c)
                pgjson_put(b, ",", 1);
            pgjson_put_value(b, r->col_type(r->arg, c), v, n, v == NULL);
        }
        pgjson_put(b, "]", 1);
    }
    pgjson_puts(b, "]}");
}
