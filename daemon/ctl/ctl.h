/* ddpctl, the client of ddpd: its commands (one file each: main.c dispatches and holds the job
 * commands; plan.c, plot.c, trace.c; watch.c follows a job) and what they share, the exit codes
 * and the printing of a daemon's error. */
#ifndef DDPD_CTL_CTL_H
#define DDPD_CTL_CTL_H

#include <jansson.h>
#include <stddef.h>

#include "daemon/client.h"

/* ddpctl's exit codes (sysexits.h's for usage, unavailable and internal errors). */
enum { CTL_OK = 0, CTL_JOB_FAILED = 1, CTL_JOB_CANCELLED = 2, CTL_USAGE = 64,
       CTL_UNAVAILABLE = 69, CTL_ERROR = 70 };

/* Prints a JSON-RPC error object to stderr as "ddpctl: message (code N)" plus its data. */
void ddpctl_print_error(json_t *err);

/* ---- watch.c ---- */
/* Follows job `id` on c (job.watch) until it ends, drawing a live line on a terminal and
 * plain lines otherwise (or JSON lines with as_json). Sends job.cancel on the first SIGINT when
 * cancel_on_int is set. Returns CTL_OK / CTL_JOB_FAILED / CTL_JOB_CANCELLED, or CTL_ERROR. */
int ddpctl_follow(ddpd_client_t *c, const char *socket_path, long long id, int as_json,
                  int cancel_on_int);

/* ---- plan.c: `ddpctl plan`, a job spec's memory budget per rank, without running it ---- */
/* ddpctl plan SPEC [--workers N] [--local N] [--gpu BYTES]: loads SPEC and prints the budget
 * rank 0 would print at start (worker/memory_budget.h) for N ranks (default ddp.workers),
 * `local` of them on one host (default all), on the CPU or on GPUs of BYTES ("80GiB") each,
 * then the total of the ranks that write no checkpoint shard where it is smaller, and the
 * advice when rank 0's does not fit (rank 0 writes shards: it needs the most). Returns CTL_OK
 * when it fits, CTL_JOB_FAILED when it does not, CTL_USAGE for a bad spec or arguments. */
int ddpctl_plan(int argc, char **argv);

/* ---- plot.c: `ddpctl plot`, a run's loss curves as an SVG or PNG picture (gnuplot) ---- */
/* ddpctl plot JOB [-o FILE.svg|FILE.png] [--log]. JOB is a job id (its run directory comes from
 * the daemon at socket_path: job.get), a run directory, or a metrics.jsonl. Draws training and
 * validation loss against step (--log: log-scale loss axis) over tokens/s, with a dashed line
 * where the generation changes, by writing a gnuplot script and its data into a temporary
 * directory and running `gnuplot` on them. Returns a ddpctl exit code (CTL_*). */
int ddpctl_plot(int argc, char **argv, const char *socket_path);

/* JOB as ddpctl plot and trace take it: an existing path is returned as it is (*is_file when it
 * is not a directory); a job id is asked of the daemon (job.get) for its run directory. title
 * gets a label ("job 7 (name)" or the path). Returns 0 or a ddpctl exit code, having printed
 * why. */
int ddpctl_run_dir(const char *job, const char *socket_path, char *path, size_t len,
                   int *is_file, char *title, size_t tlen);

/* ---- trace.c: `ddpctl trace`, the ranks' timeline traces merged into one Chrome trace ---- */
/* ddpctl trace JOB|RUN_DIR [-o FILE.json]: reads RUN_DIR/trace/rank-*.json (train.trace) and
 * writes one trace-event file with a process row per rank (default job-N-trace.json or
 * trace.json). Returns a ddpctl exit code (CTL_*). */
int ddpctl_trace(int argc, char **argv, const char *socket_path);

#endif
