/* Line-atomic logging to stderr. Any thread may log: the level and the rank are read and set
 * atomically (the first logs of a process may come from several threads at once, each reading
 * DDP_LOG_LEVEL; they agree on the value).
 *
 * The cap (log.h): without one, ddp_log takes no lock. With one, the check "does this line fit"
 * and its write(2) happen under one mutex, so two threads cannot both fit a line into the last
 * bytes and no line lands after the closing line; the count itself is an atomic so that
 * ddp_log_check_limit and a closed log are read without the lock. Why fds 1 and 2 are redirected
 * rather than ddp_log just going quiet: libraries (OpenBLAS, oneDNN, CUDA) and stdio write to
 * them directly, and a job's log must not grow past its cap through them either.
 */
#include "log.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int min_level = -1;
static int log_rank = -1;

/* the cap: cap_bytes and cap_source change only under cap_lock (and before threads log) */
static pthread_mutex_t cap_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t cap_bytes;   /* 0: none */
static uint64_t cap_used;    /* atomic: bytes in the log so far, as far as we know */
static int cap_closed;       /* atomic: the closing line is written, fds 1 and 2 go nowhere */
static int cap_regular;      /* stderr was a regular file: its size is the truth */
static char cap_source[128]; /* where the cap comes from, for the closing line */

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

/* "12:34:56.789 info  [rank 1] " into line; returns its length. */
static int prefix(char *line, size_t size, ddp_log_level_t level)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    int n = (int)strftime(line, size, "%H:%M:%S", &tm);
    n += snprintf(line + n, size - n, ".%03ld %-5s ", ts.tv_nsec / 1000000, names[level]);
    int rank = __atomic_load_n(&log_rank, __ATOMIC_RELAXED);
    if (rank >= 0) n += snprintf(line + n, size - n, "[rank %d] ", rank);
    return n;
}

/* Under cap_lock: writes the closing line (unless `quiet`) and sends fds 2 and 1 to /dev/null. */
static void close_log_locked(int quiet)
{
    if (!quiet) {
        char line[400];
        int n = prefix(line, sizeof line, DDP_LOG_WARN);
        n += snprintf(line + n, sizeof line - n,
                      "log cap of %llu bytes reached (%s): further output of this rank is "
                      "discarded\n", (unsigned long long)cap_bytes, cap_source);
        if (n > (int)sizeof line - 1) n = (int)sizeof line - 1;
        ssize_t w = write(STDERR_FILENO, line, (size_t)n);
        if (w > 0) __atomic_add_fetch(&cap_used, (uint64_t)w, __ATOMIC_RELAXED);
    }
    /* fd 1 too when it is the log (ddpd opens one file for both) or a pipe or terminal of the
     * launcher's (mpirun, srun): library output goes there as well. A stdout the user sent to a
     * file of its own is not the log and keeps its output. */
    struct stat o, e;
    int same = fstat(STDOUT_FILENO, &o) == 0 &&
               (!S_ISREG(o.st_mode) ||
                (fstat(STDERR_FILENO, &e) == 0 && o.st_dev == e.st_dev && o.st_ino == e.st_ino));
    int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        dup2(fd, STDERR_FILENO);
        if (same) dup2(fd, STDOUT_FILENO);
        close(fd);
    }
    __atomic_store_n(&cap_closed, 1, __ATOMIC_RELEASE);
}

void ddp_log_set_limit(uint64_t bytes, const char *source)
{
    pthread_mutex_lock(&cap_lock);
    struct stat st;
    cap_regular = fstat(STDERR_FILENO, &st) == 0 && S_ISREG(st.st_mode);
    __atomic_store_n(&cap_used, cap_regular ? (uint64_t)st.st_size : 0, __ATOMIC_RELAXED);
    __atomic_store_n(&cap_closed, 0, __ATOMIC_RELAXED);
    snprintf(cap_source, sizeof cap_source, "%s", source && *source ? source : "a cap");
    __atomic_store_n(&cap_bytes, bytes, __ATOMIC_RELEASE);
    /* full already: the earlier process that filled it wrote the closing line */
    if (bytes && __atomic_load_n(&cap_used, __ATOMIC_RELAXED) > bytes) close_log_locked(1);
    pthread_mutex_unlock(&cap_lock);
}

int ddp_log_check_limit(void)
{
    if (!__atomic_load_n(&cap_bytes, __ATOMIC_ACQUIRE)) return 0;
    if (__atomic_load_n(&cap_closed, __ATOMIC_ACQUIRE)) return 1;
    struct stat st;
    if (!cap_regular || fstat(STDERR_FILENO, &st) != 0 || !S_ISREG(st.st_mode)) return 0;
    pthread_mutex_lock(&cap_lock);
    if (!cap_closed) {
        if ((uint64_t)st.st_size > __atomic_load_n(&cap_used, __ATOMIC_RELAXED))
            __atomic_store_n(&cap_used, (uint64_t)st.st_size, __ATOMIC_RELAXED);
        if (__atomic_load_n(&cap_used, __ATOMIC_RELAXED) >= cap_bytes) close_log_locked(0);
    }
    pthread_mutex_unlock(&cap_lock);
    return __atomic_load_n(&cap_closed, __ATOMIC_ACQUIRE) ? 1 : 0;
}

/* One line under the cap: written whole if it fits, else the log is closed. */
static void write_capped(const char *line, size_t n)
{
    if (__atomic_load_n(&cap_closed, __ATOMIC_ACQUIRE)) return;
    pthread_mutex_lock(&cap_lock);
    if (!cap_closed) {
        if (__atomic_load_n(&cap_used, __ATOMIC_RELAXED) + n <= cap_bytes) {
            ssize_t w = write(STDERR_FILENO, line, n);
            if (w > 0) __atomic_add_fetch(&cap_used, (uint64_t)w, __ATOMIC_RELAXED);
        } else {
            close_log_locked(0);
        }
    }
    pthread_mutex_unlock(&cap_lock);
}

void ddp_log(ddp_log_level_t level, const char *fmt, ...)
{
    int min = __atomic_load_n(&min_level, __ATOMIC_RELAXED);
    if (min < 0) {
        min = level_from_env();
        __atomic_store_n(&min_level, min, __ATOMIC_RELAXED);
    }
    if ((int)level < min) return;
    char line[2048];
    int n = prefix(line, sizeof line, level);
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - n, fmt, ap);
    va_end(ap);
    n = (m < 0 || n + m >= (int)sizeof line - 1) ? (int)sizeof line - 2 : n + m;
    line[n++] = '\n';
    if (__atomic_load_n(&cap_bytes, __ATOMIC_ACQUIRE)) {
        write_capped(line, (size_t)n);
        return;
    }
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}
