/* Timeline trace (see trace.h). Spans go to one growing array under a mutex: they are recorded
 * only during the few traced steps, a few hundred per step, so the lock is never contended long
 * enough to matter, and untraced steps never take it. The file is written with stdio. */
#include "common/trace.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/err.h"
#include "common/log.h"

atomic_int ddp__trace_on;

typedef struct {
    int64_t t0, t1;
    int lane;
    char name[56];
} span_t;

static struct {
    pthread_mutex_t mu;
    int open, rank;
    size_t written; /* spans in the file written, 0 = none yet */
    long lo, hi;
    char path[4200];
    span_t *spans;
    size_t n, cap;
    long step;      /* the step running, 0 before the first */
    int64_t step_t0; /* its start, while traced */
    int64_t wall_minus_mono; /* ns: wall clock = monotonic + this */
    const char *note_key[8];
    long note_val[8];
    int n_notes;
} T = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int parse_steps(const char *s, long *lo, long *hi)
{
    char *end;
    errno = 0;
    *lo = strtol(s, &end, 10);
    if (end == s || errno) return DDP_EINVAL;
    *hi = *lo;
    if (*end == '-') {
        const char *p = end + 1;
        *hi = strtol(p, &end, 10);
        if (end == p || errno) return DDP_EINVAL;
    }
    return *end || *lo < 1 || *hi < *lo ? DDP_EINVAL : 0;
}

int ddp_trace_steps_valid(const char *steps)
{
    long lo, hi;
    return !steps || !*steps || parse_steps(steps, &lo, &hi) == 0;
}

int ddp_trace_open(const char *steps, const char *run_dir, int rank)
{
    if (!steps || !*steps) return 0;
    long lo, hi;
    if (parse_steps(steps, &lo, &hi)) return DDP_EINVAL;
    if (!run_dir) {
        DDP_WARN("trace: train.trace needs a run directory (--run-dir or DDP_RUN_DIR)");
        return 0;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%.4000s/trace", run_dir);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        DDP_WARN("trace: cannot create %s: %s (no trace)", dir, strerror(errno));
        return -errno;
    }
    struct timespec w, m;
    clock_gettime(CLOCK_REALTIME, &w);
    clock_gettime(CLOCK_MONOTONIC, &m);
    pthread_mutex_lock(&T.mu);
    T.open = 1;
    T.rank = rank;
    T.lo = lo;
    T.hi = hi;
    T.wall_minus_mono = ((int64_t)w.tv_sec - m.tv_sec) * 1000000000 + (w.tv_nsec - m.tv_nsec);
    snprintf(T.path, sizeof T.path, "%s/rank-%d.json", dir, rank);
    pthread_mutex_unlock(&T.mu);
    return 0;
}

void ddp_trace_note(const char *key, long value)
{
    pthread_mutex_lock(&T.mu);
    int i = 0;
    while (i < T.n_notes && strcmp(T.note_key[i], key)) i++;
    if (i < 8) {
        T.note_key[i] = key;
        T.note_val[i] = value;
        if (i == T.n_notes) T.n_notes++;
    }
    pthread_mutex_unlock(&T.mu);
}

/* Appends sp (caller holds the lock); a span that finds no memory is dropped: a trace with a
 * hole beats a failed run. */
static void push(const span_t *sp)
{
    if (T.n == T.cap) {
        size_t cap = T.cap ? 2 * T.cap : 1024;
        span_t *p = realloc(T.spans, cap * sizeof *p);
        if (!p) return;
        T.spans = p;
        T.cap = cap;
    }
    T.spans[T.n++] = *sp;
}

static void add_span(int lane, int64_t t0, int64_t t1, const char *fmt, va_list ap)
{
    span_t sp = {.t0 = t0, .t1 = t1 > t0 ? t1 : t0, .lane = lane};
    vsnprintf(sp.name, sizeof sp.name, fmt, ap);
    pthread_mutex_lock(&T.mu);
    push(&sp);
    pthread_mutex_unlock(&T.mu);
}

void ddp_trace_end(ddp_trace_lane_t lane, int64_t t0, const char *fmt, ...)
{
    if (!t0) return;
    int64_t t1 = ddp_now_ns();
    va_list ap;
    va_start(ap, fmt);
    add_span((int)lane, t0, t1, fmt, ap);
    va_end(ap);
}

void ddp_trace_span(ddp_trace_lane_t lane, int64_t t0, int64_t t1, const char *fmt, ...)
{
    if (!atomic_load_explicit(&ddp__trace_on, memory_order_relaxed) || t0 <= 0) return;
    va_list ap;
    va_start(ap, fmt);
    add_span((int)lane, t0, t1, fmt, ap);
    va_end(ap);
}

static void put_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f);
        if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

/* Writes the file (caller holds the lock). */
static void write_file(void)
{
    static const char *const lanes[] = {"", "compute", "communication", "data loader",
                                        "checkpoint writer"};
    T.written = T.n ? T.n : 1;
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp", T.path);
    FILE *f = fopen(tmp, "we");
    if (!f) {
        DDP_WARN("trace: cannot write %s: %s", tmp, strerror(errno));
        return;
    }
    fprintf(f, "{\"traceEvents\":[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,"
               "\"args\":{\"name\":\"rank %d\"}},\n"
               "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,"
               "\"args\":{\"sort_index\":%d}}",
            T.rank, T.rank, T.rank, T.rank);
    for (int l = 1; l <= 4; l++)
        fprintf(f, ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                   "\"args\":{\"name\":\"%s\"}}",
                T.rank, l, lanes[l]);
    for (size_t i = 0; i < T.n; i++) {
        const span_t *s = &T.spans[i];
        fputs(",\n{\"name\":", f);
        put_json_string(f, s->name);
        fprintf(f, ",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f}", T.rank,
                s->lane, (double)(s->t0 + T.wall_minus_mono) / 1e3,
                (double)(s->t1 - s->t0) / 1e3);
    }
    fprintf(f, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"rank\":%d,\"steps\":\"%ld-%ld\"",
            T.rank, T.lo, T.hi);
    for (int i = 0; i < T.n_notes; i++) fprintf(f, ",\"%s\":%ld", T.note_key[i], T.note_val[i]);
    fputs("}}\n", f);
    if (fclose(f) != 0 || rename(tmp, T.path) != 0) {
        DDP_WARN("trace: cannot write %s: %s", T.path, strerror(errno));
        return;
    }
    DDP_INFO("trace of steps %ld-%ld: %zu spans in %s", T.lo, T.hi, T.n, T.path);
}

/* Ends the running step's span (caller holds the lock). */
static void end_step(int64_t now)
{
    if (T.step_t0) {
        span_t sp = {.t0 = T.step_t0, .t1 = now, .lane = DDP_TRACE_COMPUTE};
        snprintf(sp.name, sizeof sp.name, "step %ld", T.step);
        T.step_t0 = 0;
        push(&sp);
    }
}

void ddp_trace_step(long step)
{
    if (!T.open) return;
    int64_t now = ddp_now_ns();
    pthread_mutex_lock(&T.mu);
    end_step(now);
    T.step = step;
    int on = step >= T.lo && step <= T.hi;
    if (on) T.step_t0 = now;
    atomic_store_explicit(&ddp__trace_on, on, memory_order_relaxed);
    if (step > T.hi && !T.written) write_file();
    pthread_mutex_unlock(&T.mu);
}

void ddp_trace_close(void)
{
    if (!T.open) return;
    atomic_store_explicit(&ddp__trace_on, 0, memory_order_relaxed);
    pthread_mutex_lock(&T.mu);
    end_step(ddp_now_ns());
    /* again when a span begun in the range ended after it (a checkpoint writer, a prefetch) */
    if (T.n && T.n != T.written) write_file();
    free(T.spans);
    T.spans = NULL;
    T.n = T.cap = 0;
    T.open = T.written = 0;
    T.n_notes = 0;
    T.step = 0;
    pthread_mutex_unlock(&T.mu);
}
