/* fg_error.h — the error codes shared by every fencegate module. */
#ifndef FG_ERROR_H
#define FG_ERROR_H

/* Functions return FG_OK (0) or one of these negative codes; counts travel in out-parameters. */
enum fg_err {
    FG_OK = 0,
    FG_ERR_NOMEM = -1,    /* allocation failed */
    FG_ERR_PROTO = -2,    /* malformed input from a peer */
    FG_ERR_LIMIT = -3,    /* a declared limit was exceeded */
    FG_ERR_CONFIG = -4,   /* invalid configuration */
    FG_ERR_IO = -5,       /* system call failed; errno was captured by the caller */
    FG_ERR_UNAVAIL = -6,  /* a server we depend on is unreachable */
    FG_ERR_NOTFOUND = -7, /* the thing asked for does not exist */
    FG_ERR_AGAIN = -8,    /* not complete yet; call again with more input */
};

#if defined(__GNUC__)
#define FG_MUST_CHECK   __attribute__((warn_unused_result))
#define FG_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define FG_MUST_CHECK
#define FG_PRINTF(a, b)
#endif

/* A short human-readable name of an error code ("out of memory", ...); never NULL. */
const char *fg_strerror(int err);

#endif
