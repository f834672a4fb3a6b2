/* clock.h — the monotonic clock, read the same way by every module of the sidecar. */
#ifndef FG_CLOCK_H
#define FG_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Microseconds of CLOCK_MONOTONIC. */
static inline uint64_t clock_now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* Milliseconds of CLOCK_MONOTONIC. */
static inline long long clock_now_ms(void)
{
    return (long long)(clock_now_us() / 1000u);
}

#endif
