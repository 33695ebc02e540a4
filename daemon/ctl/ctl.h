/* ddpctl, the client of ddpd: its commands (one file each: main.c dispatches and holds the job
 * commands; plan.c, plot.c, trace.c; watch.c follows a job; offline.c reads the store when no
 * daemon answers) and what they share: where the daemon and its store are, the exit codes and
 * the printing of a daemon's error. */
#ifndef DDPD_CTL_CTL_H
#define DDPD_CTL_CTL_H

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stddef.h>

#include "daemon/client.h"

/* ddpctl's exit codes (sysexits.h's for usage, unavailable and internal errors). */
enum { CTL_OK = 0, CTL_JOB_FAILED = 1, CTL_JOB_CANCELLED = 2, CTL_USAGE = 64,
       CTL_UNAVAILABLE = 69, CTL_ERROR = 70 };

/* Where ddpctl finds a daemon, and that daemon's job store when none answers. */
typedef struct ddpctl_where {
    char socket[PATH_MAX];    /* --socket, else $DDPD_SOCKET, else ddpd_default_socket_path */
    char state_dir[PATH_MAX]; /* --state-dir, else ddpd_default_state_dir (as ddpd's) */
} ddpctl_where_t;

/* Whether ddpd_client_connect's error means that no daemon listens (no socket file, or one
 * nobody accepts on: a daemon that ended, as `ddpctl run`'s embedded one does), so that a
 * read-only command may read the store instead. Other errors (EACCES) are reported. */
static inline int ddpctl_no_daemon(int connect_rc)
{
    return connect_rc == -ENOENT || connect_rc == -ECONNREFUSED;
}

/* Prints a JSON-RPC error object to stderr as "ddpctl: message (code N)" plus its data. */
void ddpctl_print_error(json_t *err);

/* ---- watch.c ---- */
/* Follows job `id` on c (job.watch) until it ends, drawing a live line on a terminal and
 * plain lines otherwise (or JSON lines with as_json). Sends job.cancel on the first SIGINT when
 * cancel_on_int is set. Returns CTL_OK / CTL_JOB_FAILED / CTL_JOB_CANCELLED, or CTL_ERROR. */
int ddpctl_follow(ddpd_client_t *c, const char *socket_path, long long id, int as_json,
                  int cancel_on_int);

/* ---- offline.c: read-only commands when no daemon answers ---- */
/* Each of these is called after connecting to w->socket failed with ddpctl_no_daemon(): it opens
 * the store in w->state_dir read-only, says on stderr that it does ("ddpctl: no daemon at S;
 * reading job 2 from the store at P"), and returns 0 or a ddpctl exit code having printed why
 * (CTL_UNAVAILABLE: no store either; CTL_JOB_FAILED: no such job). */
/* Job id's record as job.get gives it (run_dir, name, state, transitions, spec; no progress);
 * *job is the caller's. Warns when the store says the job is unfinished: its daemon stopped. */
int ddpctl_store_job(const ddpctl_where_t *w, long long id, json_t **job);
/* The job list as job.list's "jobs" gives it (state filters when non-NULL; limit <= 0: all). */
int ddpctl_store_jobs(const ddpctl_where_t *w, const char *state, int limit, json_t **jobs);
/* Copies rank's log (RUN_DIR/rank-R.log) of job id to stdout. */
int ddpctl_store_logs(const ddpctl_where_t *w, long long id, int rank);

/* Connects c to the daemon at w->socket for a read-only command. Returns 0 (connected), 1 when
 * no daemon answers (the caller reads the store: the ddpctl_store_* above), or CTL_UNAVAILABLE
 * having said why (a socket that refuses this user, say). */
int ddpctl_connect_or_store(ddpd_client_t *c, const ddpctl_where_t *w);

/* Job id's record: job.get from the daemon at w->socket, or ddpctl_store_job when no daemon
 * answers. Returns 0 with *job (caller owns), or a ddpctl exit code having printed why. */
int ddpctl_job_get(const ddpctl_where_t *w, long long id, json_t **job);

/* ---- plan.c: `ddpctl plan`, a job spec's memory budget per rank, without running it ---- */
/* ddpctl plan SPEC [--workers N] [--local N] [--gpu BYTES]: loads SPEC and prints the budget
 * rank 0 would print at start (worker/memory_budget.h) for N ranks (default ddp.workers),
 * `local` of them on one host (default all), on the CPU or on GPUs of BYTES ("80GiB") each,
 * then the total of the ranks that write no checkpoint shard where it is smaller, and the
 * advice when rank 0's does not fit (rank 0 writes shards: it needs the most). Returns CTL_OK
 * when it fits, CTL_JOB_FAILED when it does not, CTL_USAGE for a bad spec or arguments. */
int ddpctl_plan(int argc, char **argv);

/* ---- plot.c: `ddpctl plot`, a run's loss curves as an SVG or PNG picture (gnuplot) ---- */
/* ddpctl plot JOB [-o FILE.svg|FILE.png] [--log]. JOB is a job id (its run directory comes
 * from ddpctl_job_get: the daemon, or its store), a run directory, or a metrics.jsonl. Draws
 * training and validation loss against step (--log: log-scale loss axis) over tokens/s, with a
 * dashed line where the generation changes, by writing a gnuplot script and its data into a
 * temporary directory and running `gnuplot` on them. Returns a ddpctl exit code (CTL_*). */
int ddpctl_plot(int argc, char **argv, const ddpctl_where_t *w);

/* JOB as ddpctl plot and trace take it: an existing path is returned as it is (*is_file when it
 * is not a directory); a job id's run directory comes from ddpctl_job_get. title gets a label
 * ("job 7 (name)" or the path). Returns 0 or a ddpctl exit code, having printed why. */
int ddpctl_run_dir(const char *job, const ddpctl_where_t *w, char *path, size_t len,
                   int *is_file, char *title, size_t tlen);

/* ---- dump.c: `ddpctl dump`, a running job's flight recorder dumps and their diagnosis ---- */
/* ddpctl dump ID [--timeout S]: job.dump (SIGUSR2 to the job's ranks on the daemon's node), then
 * waits up to S seconds (default 10) for their RUN_DIR/flight/rank-R.json, prints a line per
 * rank and the diagnosis (collectives/flight.h; --json: one object with the dumps), and writes
 * RUN_DIR/flight/diagnosis.txt. ddpctl dump RUN_DIR: the diagnosis of the dumps already in
 * RUN_DIR/flight (no daemon needed). Returns CTL_OK, or CTL_JOB_FAILED when no rank dumped. */
int ddpctl_dump(int argc, char **argv, const ddpctl_where_t *w, int as_json);

/* ---- trace.c: `ddpctl trace`, the ranks' timeline traces merged into one Chrome trace ---- */
/* ddpctl trace JOB|RUN_DIR [-o FILE.json]: reads RUN_DIR/trace/rank-*.json (train.trace) and
 * writes one trace-event file with a process row per rank (default job-N-trace.json or
 * trace.json). Returns a ddpctl exit code (CTL_*). */
int ddpctl_trace(int argc, char **argv, const ddpctl_where_t *w);

#endif
