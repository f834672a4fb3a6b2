/* log.c — leveled log lines on stderr: "2026-11-25T21:50:00.123Z info  message". */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <sys/time.h>
#include <time.h>

static enum log_level log_max = LOG_INFO;

void log_set_level(enum log_level level)
{
    log_max = level;
}

int log_enabled(enum log_level level)
{
    return level <= log_max;
}

/* Formats one whole line and writes it with a single fwrite, so lines never interleave. */
void log_write(enum log_level level, const char *fmt, ...)
{
    static const char *names[] = {"error", "warn ", "info ", "debug"};
    char line[2048];
    struct timeval tv;
    struct tm tm;
    size_t n;
    int m;
    va_list ap;

    if (!log_enabled(level))
        return;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    n = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
    m = snprintf(line + n, sizeof(line) - n, ".%03dZ %s ", (int)(tv.tv_usec / 1000), names[level]);
    if (m > 0)
        n += (size_t)m;
    va_start(ap, fmt);
    m = vsnprintf(line + n, sizeof(line) - n - 1, fmt, ap);
    va_end(ap);
    if (m > 0)
        n += (size_t)m < sizeof(line) - n - 1 ? (size_t)m : sizeof(line) - n - 2;
    line[n++] = '\n';
    fwrite(line, 1, n, stderr);
}
