/* fg_error.c — human-readable names for the shared fencegate error codes. */
#include "fg_error.h"

/* Returns a static, NUL-terminated description of err (never NULL): callers put it straight into
 * log lines and error replies, so an unknown code still yields a usable string. */
const char *fg_strerror(int err)
{
    switch (err) {
    case FG_OK:
        return "success";
    case FG_ERR_NOMEM:
        return "out of memory";
    case FG_ERR_PROTO:
        return "protocol error";
    case FG_ERR_LIMIT:
        return "limit exceeded";
    case FG_ERR_CONFIG:
        return "invalid configuration";
    case FG_ERR_IO:
        return "I/O error";
    case FG_ERR_UNAVAIL:
        return "service unavailable";
    case FG_ERR_NOTFOUND:
        return "not found";
    case FG_ERR_AGAIN:
        return "try again";
    default:
        return "unknown error";
    }
}
