/* Monotonic and wall-clock time. */
#ifndef DDP_COMMON_CLOCK_H
#define DDP_COMMON_CLOCK_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

/* Nanoseconds on CLOCK_MONOTONIC. */
static inline int64_t ddp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Seconds (fractional) on CLOCK_MONOTONIC. */
static inline double ddp_now_s(void) { return (double)ddp_now_ns() * 1e-9; }

/* CPU time (user + system) the calling thread has used, in nanoseconds. */
static inline int64_t ddp_thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Milliseconds since the Unix epoch. */
static inline int64_t ddp_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A duration for people: "1h02m", "3m20s", "45s" (rounded to the second; NaN or negative: "0s").
 * Writes buf (n bytes) and returns it. */
static inline const char *ddp_fmt_duration(double s, char *buf, size_t n)
{
    long t = isfinite(s) && s > 0 ? (long)(s + 0.5) : 0;
    if (t >= 3600)
        snprintf(buf, n, "%ldh%02ldm", t / 3600, (t % 3600) / 60);
    else if (t >= 60)
        snprintf(buf, n, "%ldm%02lds", t / 60, t % 60);
    else
        snprintf(buf, n, "%lds", t);
    return buf;
}

#endif
