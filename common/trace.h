/* Timeline trace of chosen steps, as Chrome trace-event JSON (Perfetto, chrome://tracing).
 *
 * One tracer per process (a rank), like the logger: ddp_trace_open once where the spec is known
 * (train.trace: "10-12"), ddp_trace_step at the start of every step; spans are recorded only
 * while the current step is in the range, so outside it a span costs one relaxed atomic load.
 * Each span lies on a lane (a Chrome "thread" row): compute, communication, data loading,
 * checkpoint writer. A span begun in a traced step is kept when it ends later (a checkpoint
 * write). When the last traced step ends the rank writes its file, and once more at
 * ddp_trace_close if spans were added since: RUN_DIR/trace/rank-R.json, {"traceEvents": [...],
 * "otherData": {...}} with pid = rank and timestamps in microseconds of the wall clock (so ranks
 * on several hosts line up as well as their clocks do).
 *
 * Thread-safe: spans may be recorded from any thread (the loader and checkpoint writer threads
 * record their own). On a GPU the compute spans measure the host's side of asynchronous kernels.
 */
#ifndef DDP_COMMON_TRACE_H
#define DDP_COMMON_TRACE_H

#include <stdatomic.h>
#include <stdint.h>

#include "common/clock.h"

typedef enum {
    DDP_TRACE_COMPUTE = 1, /* the training thread: forward, backward, optimizer, waits */
    DDP_TRACE_COMM = 2,    /* each bucket's collective on the communication thread */
    DDP_TRACE_DATA = 3,    /* the data loader thread */
    DDP_TRACE_CKPT = 4,    /* the checkpoint writer thread */
} ddp_trace_lane_t;

extern atomic_int ddp__trace_on;

/* Parses steps ("N" or "N-M", 1 <= N <= M; "" = no trace: returns 0 and traces nothing) and
 * prepares to write run_dir/trace/rank-<rank>.json (the folder is created; a NULL run_dir
 * traces nothing, with a warning). Returns 0, DDP_EINVAL (bad steps), -errno (mkdir). Call
 * once, before the first step. */
int ddp_trace_open(const char *steps, const char *run_dir, int rank);

/* Checks that steps is "", "N" or "N-M" with 1 <= N <= M. Pure. */
int ddp_trace_steps_valid(const char *steps);

/* The step about to run (1-based; optimizer steps): turns recording on inside the range, ends
 * the previous step's span, and writes the file once the range is over. Training thread. */
void ddp_trace_step(long step);

/* Adds a number to the file's otherData ("buckets": 7); at most 8 keys (static strings). */
void ddp_trace_note(const char *key, long value);

/* The start of a span: the monotonic clock when recording, else 0 (then ddp_trace_end does
 * nothing). Any thread. */
static inline int64_t ddp_trace_begin(void)
{
    return atomic_load_explicit(&ddp__trace_on, memory_order_relaxed) ? ddp_now_ns() : 0;
}

/* Records the span [t0, now] named by fmt on lane (nothing when t0 is 0). Any thread. */
void ddp_trace_end(ddp_trace_lane_t lane, int64_t t0, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Records [t0, t1] (monotonic ns, t1 >= t0 > 0) when recording. Any thread. */
void ddp_trace_span(ddp_trace_lane_t lane, int64_t t0, int64_t t1, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Writes the file if steps were traced and it is not written yet, and frees everything. */
void ddp_trace_close(void);

#endif
