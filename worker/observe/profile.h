/* train.profile: the per-op profile of a few training steps, for ddpd's users (what PyTorch's
 * autograd profiler tells them) and for a short GPU session deciding where the time goes.
 *
 * The trainer profiles steps [W + 1, W + N] of this process's run after W = 2 warm-up steps
 * (counted from the step it resumed at; a shorter run profiles the steps it has, keeping at
 * least one, with fewer warm-up steps when it must). A kernels profile window (kernels.h,
 * ddp_k_profile_start) is open from the first of them to the last and paused between them, so
 * the step line and any validation or checkpoint at a step boundary are not in it; on a GPU
 * the marks are read once, when it closes. The profile never changes a result.
 *
 * Then every rank writes its table to the log (stderr), to RUN_DIR/profile-rank<R>.txt (a plain
 * aligned table sorted by total time, a total row, the time not in any op, the host's waits in
 * syncs) and to RUN_DIR/profile-rank<R>.json (the same figures, machine-readable). A step that
 * an elastic job redoes after a failure inside the window is counted with its first try (the
 * window pauses at the failure, so the regroup is not in it).
 * Thread: the training thread.
 */
#ifndef DDP_WORKER_OBSERVE_PROFILE_H
#define DDP_WORKER_OBSERVE_PROFILE_H

#include <jansson.h>
#include <stdio.h>

#include "common/err.h"
#include "kernels/kernels.h"

#define DDP_PROFILE_WARMUP 2 /* steps before the profiled ones */

typedef struct ddp_profile {
    long from, to; /* the profiled optimizer steps, 1-based, inclusive; to < from: none */
    long warmup;   /* steps this run does before `from` */
    long asked;    /* train.profile */
    int open;      /* the kernels' window is open */
    double comm_ms, exposed_ms; /* the reducer's figures, summed over the profiled steps */
    double step_ms;             /* the profiled steps' wall time as the step lines give it */
} ddp_profile_t;

/* What a report says besides the kernels' figures. */
typedef struct ddp_profile_info {
    int rank;            /* the files' name and the header's */
    const char *backend; /* the kernel backend's name */
    long from, to, warmup, asked;
    double comm_ms, exposed_ms, step_ms; /* as in ddp_profile_t */
} ddp_profile_info_t;

/* Plans the window for train.profile = n in a run that has completed `done` steps and stops
 * after step `end`: *p gets from, to and warmup (none when n is 0 or no step is left). Pure. */
void ddp_profile_plan(ddp_profile_t *p, long n, long done, long end);

/* Before step `step` (1-based): opens the window at the first profiled step, resumes it at the
 * others (also when a failed step is redone). Returns 0 or the kernels' error. */
int ddp_profile_before_step(ddp_profile_t *p, ddp_kernels_t *k, long step);

/* After step `step` completed in step_ms with the reducer's comm_ms and exposed_ms: pauses the
 * window, and after the last profiled step closes it and reports (ddp_profile_report with
 * run_dir, rank, the backend's name). Returns 0 or the kernels' error (the wait at the close);
 * a file that cannot be written is a warning (the table is in the log), not the run's end. */
int ddp_profile_after_step(ddp_profile_t *p, ddp_kernels_t *k, long step, double step_ms,
                           double comm_ms, double exposed_ms, const char *run_dir, int rank);

/* The table of r as text (ends with a newline). */
void ddp_profile_write_text(FILE *f, const ddp_kprof_report_t *r, const ddp_profile_info_t *in);
/* The same figures as a JSON object (new reference; NULL when out of memory). */
json_t *ddp_profile_json(const ddp_kprof_report_t *r, const ddp_profile_info_t *in);

/* Logs the table (one line per row) and, when run_dir is not NULL, writes
 * run_dir/profile-rank<R>.txt and .json. Returns 0 or -errno (ei names the file). */
int ddp_profile_report(const ddp_kprof_report_t *r, const ddp_profile_info_t *in,
                       const char *run_dir, ddp_errinfo_t *ei);

#endif
