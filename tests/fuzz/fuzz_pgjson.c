/* fuzz_pgjson.c — libFuzzer target: the SQL request parser keeps its promises on any input, and
 * whatever it returns renders back to valid JSON through the result renderer. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "pgjson.h"

static void fuzz_assert_json(const struct pgjson_buf *b)
{
    struct json_reader r;
    struct json_token t;

    if (b->failed)
        return;
    json_reader_init(&r, b->p, b->len);
    do {
        if (json_next(&r, &t) != FG_OK)
            abort();
    } while (t.type != JSON_END);
}

static const struct pgjson_stmt *fuzz_stmt;

static const char *fuzz_name(void *arg, int col)
{
    return fuzz_stmt->sql;
}

static unsigned fuzz_type(void *arg, int col)
{
    static const unsigned oids[] = {PGJSON_OID_BOOL,   PGJSON_OID_INT4, PGJSON_OID_NUMERIC,
                                    PGJSON_OID_FLOAT8, PGJSON_OID_TEXT, 1234};
    return oids[col % 6];
}

static const char *fuzz_value(void *arg, int row, int col, size_t *n)
{
    const char *v = fuzz_stmt->params[col];

    if (v)
        *n = strlen(v);
    return v;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct pgjson_request rq;
    char err[300];
    int rc = pgjson_parse_request((const char *)data, size, &rq, err, sizeof(err));
    struct pgjson_buf b = {0};

    if (strlen(err) >= sizeof(err))
        abort();
    if (rc != FG_OK) {
        if (!err[0] || rq.nstmts != 0 || rq.lock)
            abort();
        return 0;
    }
    if (!rq.lock || rq.lock_len == 0 || rq.lock_len > PGJSON_MAX_LOCK ||
        strlen(rq.lock) != rq.lock_len || rq.nstmts < 1 || rq.nstmts > PGJSON_MAX_STATEMENTS)
        abort();
    pgjson_puts(&b, "[");
    for (int i = 0; i < rq.nstmts; i++) {
        const struct pgjson_stmt *st = &rq.stmts[i];
        struct pgjson_result r = {st->sql, st->nparams, 1, NULL, fuzz_name, fuzz_type, fuzz_value};
        if (!st->sql[0] || pgjson_txn_keyword(st->sql) || pgjson_refusal(st->sql) ||
            st->nparams > PGJSON_MAX_PARAMS)
            abort();
        fuzz_stmt = st;
        if (i)
            pgjson_puts(&b, ",");
        pgjson_put_result(&b, &r);
    }
    pgjson_puts(&b, "]");
    fuzz_assert_json(&b);
    pgjson_buf_free(&b);
    pgjson_request_free(&rq);
    return 0;
}
