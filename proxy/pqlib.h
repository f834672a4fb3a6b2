/* pqlib.h — libpq, loaded at run time (dlopen) and only when the configuration has a PostgreSQL
 * store. libpq brings libssl, libcrypto, GnuTLS, Kerberos, LDAP and more, which more than double
 * the idle memory of a sidecar that never talks to PostgreSQL; so fencegate does not link it.
 *
 * pgstore.c calls libpq through the table `pq`: pq.PQclear(r), pq.PQgetvalue(r, i, j), ...
 * The types are libpq-fe.h's own (each member has the type of the function it stands for), so
 * the build still needs libpq's headers (Debian package libpq-dev). A direct call of a libpq
 * function fails to link. */
#ifndef FG_PQLIB_H
#define FG_PQLIB_H

#include <libpq-fe.h>
#include <stddef.h>

#define PQLIB_SONAME  "libpq.so.5"
#define PQLIB_PACKAGE "libpq5" /* the Debian package that installs PQLIB_SONAME */

/* Every libpq function pgstore.c calls, each once: the table's members and the symbols
 * pqlib_load() resolves. */
#define PQLIB_FUNCS(X)                                                                             \
    X(PQclear)                                                                                     \
    X(PQcmdStatus)                                                                                 \
    X(PQconnectPoll)                                                                               \
    X(PQconnectStartParams)                                                                        \
    X(PQconninfoFree)                                                                              \
    X(PQconninfoParse)                                                                             \
    X(PQconsumeInput)                                                                              \
    X(PQenterPipelineMode)                                                                         \
    X(PQerrorMessage)                                                                              \
    X(PQescapeIdentifier)                                                                          \
    X(PQfinish)                                                                                    \
    X(PQflush)                                                                                     \
    X(PQfname)                                                                                     \
    X(PQfreemem)                                                                                   \
    X(PQftype)                                                                                     \
    X(PQgetResult)                                                                                 \
    X(PQgetisnull)                                                                                 \
    X(PQgetlength)                                                                                 \
    X(PQgetvalue)                                                                                  \
    X(PQisBusy)                                                                                    \
    X(PQnfields)                                                                                   \
    X(PQparameterStatus)                                                                           \
    X(PQntuples)                                                                                   \
    X(PQpipelineSync)                                                                              \
    X(PQresultErrorField)                                                                          \
    X(PQresultErrorMessage)                                                                        \
    X(PQresultMemorySize)                                                                          \
    X(PQresultStatus)                                                                              \
    X(PQsendPrepare)                                                                               \
    X(PQsendQueryParams)                                                                           \
    X(PQsendQueryPrepared)                                                                         \
    X(PQsetNoticeProcessor)                                                                        \
    X(PQsetnonblocking)                                                                            \
    X(PQsocket)                                                                                    \
    X(PQstatus)                                                                                    \
    X(PQtransactionStatus)

struct pqlib {
#define PQLIB_MEMBER(name) __typeof__(name) *name;
    PQLIB_FUNCS(PQLIB_MEMBER)
#undef PQLIB_MEMBER
};

/* All NULL until pqlib_load() succeeds. */
extern struct pqlib pq;

/* Loads PQLIB_SONAME (RTLD_NOW | RTLD_LOCAL) and resolves every function of PQLIB_FUNCS into
 * `pq`. Returns 0, or -1 with err naming the library (and the symbol, when one is missing) and
 * dlerror()'s reason; `pq` then stays all NULL. Idempotent: once loaded, returns 0 at once. Not
 * thread-safe (fencegate loads it once, at start-up). */
int pqlib_load(char *err, size_t errlen);

#endif
