/* Jobs this node coordinates: acceptance, the state machine, their local ranks, the tail of
 * rank 0's metrics.jsonl, cancel (SIGTERM, then SIGKILL after the grace period) and the record
 * in the store.
 *
 * States: queued → starting → running → succeeded | failed | cancelled; every transition has
 * a reason and is stored. A ddpd_job_t lives in d->jobs from acceptance until it is terminal
 * and all its handles are closed; then it is freed at a safe point (a close callback).
 * Loop thread only.
 */
#ifndef DDPD_JOB_H
#define DDPD_JOB_H

#include <jansson.h>
#include <limits.h>
#include <stdint.h>
#include <uv.h>

#include "common/err.h"
#include "daemon/ddpd.h"
#include "daemon/spawn.h"

typedef enum {
    DDPD_QUEUED,
    DDPD_STARTING,
    DDPD_RUNNING,
    DDPD_SUCCEEDED,
    DDPD_FAILED,
    DDPD_CANCELLED,
} ddpd_state_t;

struct ddpd_job {
    ddpd_job_t *next;
    ddpd_t *d;
    int64_t id;
    char name[128];
    uint32_t uid, gid;
    ddpd_state_t state;
    char reason[512];
    int world, threads;
    long steps; /* from the spec */
    char *spec_json;
    char run_dir[PATH_MAX], cwd[PATH_MAX], spec_path[PATH_MAX + 16];
    char token[65], rdzv[300];
    int64_t submitted_ms, started_ms, first_step_ms;

    int *rank_node;   /* per rank: 0 = this node, i+1 = peer i */
    ddpd_proc_t *procs; /* local ranks */
    int n_local;
    int live_local;   /* local ranks still running */
    int live_remote;  /* remote ranks not yet reported ended */
    int pending_acks; /* peers that have not yet confirmed their ranks started */
    int fail_rank;    /* first rank that failed, -1 */
    char fail_why[512];
    int cancel_requested;
    uint32_t cancel_uid;
    int signalled;    /* SIGTERM sent to the ranks */
    int slots_held;   /* local slots accounted in d->slots_used */

    uv_timer_t kill_timer, tail_timer;
    uv_fs_event_t run_watch; /* inotify on run_dir: metrics.jsonl lines show at once */
    int handles;      /* open uv handles (timers + processes) */
    int freeing;

    int64_t metrics_off;
    char partial[8192];
    size_t partial_len;
    json_t *last_step; /* last {"step":...} object of metrics.jsonl */

    /* elastic jobs (ddp.restart: on-failure): a coordinator on this daemon's loop forms the
     * generations; a local rank that dies is spawned again (up to max_restarts times each) and
     * rejoins; the job fails only when the coordinator says so (below min_workers too long) */
    struct ddpd_coord *coord;
    int elastic, min_workers, max_restarts;
    double hb_timeout_s, rejoin_timeout_s;
    unsigned long generation;
    int restarts;         /* local ranks spawned again */
    int pending_restarts; /* local ranks that exited and are to be spawned again */
    json_t *done;      /* the {"event":"done"} object */
};

const char *ddpd_state_name(ddpd_state_t s);
int ddpd_state_terminal(ddpd_state_t s);

/* What a client asked for. spec_text is the YAML/JSON text; origin names it in errors. */
typedef struct ddpd_submit {
    const char *spec_text;
    size_t spec_len;
    const char *origin;
    const char *name;  /* override or NULL */
    const char *cwd;   /* submitter's directory or NULL */
    int workers;       /* override (> 0) or 0 */
    uint32_t uid, gid;
} ddpd_submit_t;

/* Validates the spec (ei gets field path, line and column), stores and queues the job, and
 * kicks the scheduler. Returns 0 with *out set, DDP_ESPEC, DDP_EBUSY (more ranks than the
 * cluster has slots; ei says so), DDP_EABORTED (shutting down) or another error. */
int ddpd_job_submit(ddpd_t *d, const ddpd_submit_t *sub, ddpd_job_t **out, ddp_errinfo_t *ei);

/* Re-queues a job found queued in the store at start-up. */
int ddpd_job_requeue(ddpd_t *d, json_t *row);

/* The active job with this id, or NULL. */
ddpd_job_t *ddpd_job_find(ddpd_t *d, int64_t id);

/* Starts a placed job: writes job.json, spawns local ranks, asks peers for theirs.
 * rank_node (length world; ownership moves to the job) says where each rank runs. */
void ddpd_job_start(ddpd_job_t *j, int *rank_node);

/* Cancel by `uid`: a queued job ends at once; a running one gets SIGTERM, then SIGKILL after
 * the grace period. Returns 0, DDP_EPERM (not the owner or root) or DDP_EINVAL (finished). */
int ddpd_job_cancel(ddpd_job_t *j, uint32_t uid);

/* Ends every active job (daemon shutdown): queued ones fail at once, running ones get SIGTERM.
 * Returns how many still have processes. */
int ddpd_job_stop_all(ddpd_t *d, const char *reason);

/* A remote rank ended (peer report), or a peer could not start/keep its ranks. */
void ddpd_job_remote_exit(ddpd_t *d, int64_t job_id, int rank, int code, int sig);
void ddpd_job_remote_failed(ddpd_t *d, int64_t job_id, const char *why);
/* A peer acknowledged that all its ranks of the job are started. */
void ddpd_job_remote_started(ddpd_t *d, int64_t job_id, int n_ranks);

/* Live view of an active job for job.get/job.watch (new object; state, progress, eta_s). */
json_t *ddpd_job_progress(const ddpd_job_t *j);


/* Shutdown, after ranks are gone: closes the handles of jobs that have no processes (queued
 * ones stay queued in the store and are re-queued at the next start). */
void ddpd_job_close_idle(ddpd_t *d);
/* Unlinks j from d->jobs and frees it; its handles must be closed (after the loop ran out). */
void ddpd_job_free(ddpd_job_t *j);

#endif
