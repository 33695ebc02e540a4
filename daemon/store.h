/* The job store: jobs, their state transitions and results in SQLite (WAL) in the state dir.
 *
 * The store is the record of history: `job.list`/`job.get` read from it, so what a person sees
 * after a restart is what was there before. Calls are synchronous; each is one small indexed
 * statement on a local file (WAL, synchronous=NORMAL), which is short enough for the loop thread.
 * The file holds every job's token and spec: it is root's and 0600 (its -wal and -shm too),
 * fixed on open for a file an older ddpd left 0644.
 * A full filesystem: new jobs are refused (ddpd_store_job_insert fails, ddpd_store_full says
 * why), while what happens to the jobs already accepted (a cancel, an end) is still recorded: a
 * reserve file in the state directory is given up to make room, and a record that still cannot
 * be written is kept in memory, in order, and written by ddpd_store_retry once there is room.
 * Loop thread only (a read-only handle: its one thread).
 */
#ifndef DDPD_STORE_H
#define DDPD_STORE_H

#include <jansson.h>
#include <stdint.h>

typedef struct ddpd_store ddpd_store_t;

/* What is known of a job when it is accepted. */
typedef struct ddpd_jobrec {
    const char *name;
    uint32_t uid, gid;
    const uint32_t *groups; /* the submitter's supplementary groups */
    int n_groups;
    int world;
    const char *spec_json;
    const char *run_dir; /* the base: the job's dir is <run_dir>/job-<id> */
    const char *cwd;
    const char *token;
    int64_t submitted_ms;
} ddpd_jobrec_t;

/* Opens (creating) `dir`/ddpd.db. Returns 0 or DDP_ESQL / -errno; *out is NULL on error. */
int ddpd_store_open(ddpd_store_t **out, const char *dir);
/* Opens `dir`/ddpd.db read-only, for a reader beside (or after) the daemon that writes it:
 * ddpctl when no daemon answers. Creates and changes nothing but SQLite's WAL index. Returns 0,
 * -ENOENT when there is no store there, or DDP_ESQL (not a store this ddpd reads); *out is NULL
 * on error. Any thread; the handle is for one thread. */
int ddpd_store_open_readonly(ddpd_store_t **out, const char *dir);
/* Closes. NULL-safe. */
void ddpd_store_close(ddpd_store_t *s);

/* Inserts a queued job and its first transition; *id receives the new id. Returns 0, -ENOSPC
 * (the filesystem is full, or records are kept: ddpd_store_full), or DDP_ESQL. */
int ddpd_store_job_insert(ddpd_store_t *s, const ddpd_jobrec_t *rec, int64_t *id);
/* Records a transition and updates the job row (state, reason; started/ended time as fits). */
int ddpd_store_job_transition(ddpd_store_t *s, int64_t id, const char *from, const char *to,
                              const char *reason, int64_t ts_ms);
/* Records results: exit code (or -1), step reached, total steps, final loss (NaN = none). */
int ddpd_store_job_result(ddpd_store_t *s, int64_t id, int exit_code, long step, long steps,
                          double final_loss);
/* Records what a restarted daemon needs to adopt the running job (a JSON object's text). */
int ddpd_store_job_runtime(ddpd_store_t *s, int64_t id, const char *runtime_json);
/* Records where the job runs ("a:0-1,b:2-3") and rank 0's process group (for orphan cleanup). */
int ddpd_store_job_placement(ddpd_store_t *s, int64_t id, const char *nodes, int pgid);

/* New array of job objects, newest first; `state` filters when non-NULL, `uid` when >= 0;
 * limit <= 0 = all. */
int ddpd_store_job_list(ddpd_store_t *s, const char *state, int64_t uid, int limit, json_t **out);
/* New job object with "transitions" (and "spec" when with_spec); DDP_ENOTFOUND if absent. */
int ddpd_store_job_get(ddpd_store_t *s, int64_t id, int with_spec, json_t **out);
/* Counts jobs per state into a new object {"queued":n,...}. */
int ddpd_store_job_counts(ddpd_store_t *s, json_t **out);

/* The jobs a daemon that stopped left unfinished, in two new arrays of objects (id, state,
 * token, pgid, spec, cwd, uid, run_dir, name, nodes, started_ms; "gid" and "groups" (an array)
 * when recorded, which an older ddpd did not; "runtime" when recorded): *live those it left
 * starting or running, *queued those still queued. */
int ddpd_store_unfinished(ddpd_store_t *s, json_t **live, json_t **queued);

/* The run directories (a new array of strings) of jobs that ended before ts_ms (prune.h). */
int ddpd_store_ended_before(ddpd_store_t *s, int64_t ts_ms, json_t **run_dirs);

/* Writes the records kept while the filesystem was full, in order. Returns how many are still
 * kept (0: the store is up to date). */
int ddpd_store_retry(ddpd_store_t *s);
/* 1 while records are kept (the filesystem is full: no new job can be recorded). */
int ddpd_store_full(const ddpd_store_t *s);

#endif
