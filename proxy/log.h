/* log.h — leveled log lines on stderr, each carrying a timestamp and its context. */
#ifndef FG_LOG_H
#define FG_LOG_H

#include "fg_error.h"

enum log_level { LOG_ERROR = 0, LOG_WARN, LOG_INFO, LOG_DEBUG };

/* Sets the most verbose level written; lines above it are dropped. */
void log_set_level(enum log_level level);
int log_enabled(enum log_level level);
void log_write(enum log_level level, const char *fmt, ...) FG_PRINTF(2, 3);

#define log_error(...) log_write(LOG_ERROR, __VA_ARGS__)
#define log_warn(...)  log_write(LOG_WARN, __VA_ARGS__)
#define log_info(...)  log_write(LOG_INFO, __VA_ARGS__)
#define log_debug(...)                                                                             \
    do {                                                                                           \
        if (log_enabled(LOG_DEBUG))                                                                \
            log_write(LOG_DEBUG, __VA_ARGS__);                                                     \
    } while (0)

#endif
