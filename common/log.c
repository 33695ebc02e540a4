/* Line-atomic logging to stderr. Any thread may log: the level and the rank are read and set
 * atomically (the first logs of a process may come from several threads at once, each reading
 * DDP_LOG_LEVEL; they agree on the value). */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

static int min_level = -1;
static int log_rank = -1;

static int level_from_env(void)
{
    const char *s = getenv("DDP_LOG_LEVEL");
    if (!s) return DDP_LOG_INFO;
    if (!strcasecmp(s, "debug")) return DDP_LOG_DEBUG;
    if (!strcasecmp(s, "warn")) return DDP_LOG_WARN;
    if (!strcasecmp(s, "error")) return DDP_LOG_ERROR;
    return DDP_LOG_INFO;
}

void ddp_log_set_level(ddp_log_level_t level)
{
    __atomic_store_n(&min_level, (int)level, __ATOMIC_RELAXED);
}

void ddp_log_set_rank(int rank) { __atomic_store_n(&log_rank, rank, __ATOMIC_RELAXED); }

void ddp_log(ddp_log_level_t level, const char *fmt, ...)
{
    int min = __atomic_load_n(&min_level, __ATOMIC_RELAXED);
    if (min < 0) {
        min = level_from_env();
        __atomic_store_n(&min_level, min, __ATOMIC_RELAXED);
    }
    if ((int)level < min) return;
    static const char *const names[] = {"debug", "info", "warn", "error"};
    char line[2048];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    int n = (int)strftime(line, sizeof line, "%H:%M:%S", &tm);
    n += snprintf(line + n, sizeof line - n, ".%03ld %-5s ", ts.tv_nsec / 1000000, names[level]);
    int rank = __atomic_load_n(&log_rank, __ATOMIC_RELAXED);
    if (rank >= 0) n += snprintf(line + n, sizeof line - n, "[rank %d] ", rank);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - n, fmt, ap);
    va_end(ap);
    n = (m < 0 || n + m >= (int)sizeof line - 1) ? (int)sizeof line - 2 : n + m;
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}
