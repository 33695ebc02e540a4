/* Monotonic and wall-clock time. */
#ifndef DDP_COMMON_CLOCK_H
#define DDP_COMMON_CLOCK_H

#include <stdint.h>
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

#endif
