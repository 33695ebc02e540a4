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
#include "daemon/job_tail.h"
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
    char warning[256]; /* ddp_spec_warning's sentence for its spec ("": none) */
    uint32_t uid, gid;
    ddpd_state_t state;
    char reason[512];
    int world, threads;
    long steps; /* from the spec */
    char *spec_json;
    char run_dir[PATH_MAX], cwd[PATH_MAX], spec_path[PATH_MAX + 16];
    char token[65], rdzv[300];
    int64_t submitted_ms, started_ms;

    int *rank_node;   /* per rank: 0 = this node, i+1 = peer i, -1 = lost with its node (an
                         elastic job's rank waiting for a place, see ddpd_job_place) */
    unsigned char *remote_alive; /* per rank: runs on a peer and has not been reported ended */
    ddpd_proc_t *procs; /* local ranks (room for `world`: replacements may come here) */
    int n_local;
    int n_unplaced;   /* ranks with rank_node -1 */
    int live_local;   /* local ranks still running */
    int live_remote;  /* remote ranks not yet reported ended */
    int pending_acks; /* peers that have not yet confirmed their ranks started */
    int fail_rank;    /* first rank that failed, -1 */
    char fail_why[512];
    int cancel_requested;
    uint32_t cancel_uid;
    int signalled;    /* SIGTERM sent to the ranks */
    int slots_held;   /* local slots this job holds (slots.h) */

    uv_timer_t kill_timer, tail_timer;
    uv_fs_event_t run_watch; /* inotify on run_dir: metrics.jsonl lines show at once */
    int handles;      /* open uv handles (timers + processes) */
    int freeing;
    int detached;     /* the daemon stops and leaves the job running (ddpd_job_detach_all) */

    ddpd_tail_t tail; /* rank 0's metrics.jsonl */

    /* elastic jobs (ddp.restart: on-failure): a coordinator on this daemon's loop forms the
     * generations; a local rank that dies is spawned again (up to max_restarts times each) and
     * rejoins; the job fails only when the coordinator says so (below min_workers too long) */
    struct ddpd_coord *coord;
    int elastic, min_workers, max_restarts;
    double hb_timeout_s, rejoin_timeout_s;
    unsigned long generation;
    int restarts;         /* local ranks spawned again */
    int pending_restarts; /* local ranks that exited and are to be spawned again */
};

/* Subscribes fn to every change of every job (see ddpd_job_change_fn): the API's watchers, the
 * scheduler and the peers' slot announcements learn of jobs this way, so that jobs know none
 * of them. At most DDPD_MAX_JOB_WATCHERS subscribers (a programmer error past that). */
void ddpd_job_on_change(ddpd_t *d, ddpd_job_change_fn fn, void *arg);

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
    int capacity;      /* slots in the cluster: a job that needs more is refused */
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
/* The link to peer `peer` went down. A static job with ranks there fails; an elastic one goes
 * on with the ranks it has (its coordinator evicts the lost ones) and the lost ranks wait for a
 * place (rank_node -1) until a node has free slots (ddpd_job_place). */
void ddpd_job_node_down(ddpd_t *d, int peer);
/* Places n of an elastic job's lost ranks again on `node` (0: this one, i+1: peer i): spawned
 * here or started there, they join the job's coordinator as new members and receive the state
 * from a live rank. Returns how many were placed. */
int ddpd_job_place(ddpd_job_t *j, int node, const int *ranks, int n);
/* A peer whose link came back still runs these ranks of the job (its daemon or this one
 * restarted): the ones still waiting for a place are the job's again there. */
void ddpd_job_remote_adopted(ddpd_t *d, int64_t job_id, int peer, const int *ranks, int n);
/* A peer acknowledged that all its ranks of the job are started. */
void ddpd_job_remote_started(ddpd_t *d, int64_t job_id, int n_ranks);


/* Daemon stop that keeps jobs (a restart, an upgrade): every running job is left to train on,
 * with what a restarted daemon needs to adopt it recorded in the store; its handles are closed
 * and nothing is signalled. */
void ddpd_job_detach_all(ddpd_t *d);

/* Daemon start: takes over a job an earlier run of the daemon left running (a row of
 * ddpd_store_unfinished): its live local ranks are watched again, the ones that ended meanwhile
 * are counted (an elastic job spawns them again), an elastic job's coordinator listens on the
 * same port again and adopts the running generation, and the metrics tail goes on. Returns 0,
 * or an error with why filled (no runtime record, ranks on peer daemons, the coordinator's port
 * taken); the caller then fails the job. */
int ddpd_job_adopt(ddpd_t *d, json_t *row, char *why, size_t whylen);

/* Shutdown, after ranks are gone: closes the handles of jobs that have no processes (queued
 * ones stay queued in the store and are re-queued at the next start). */
void ddpd_job_close_idle(ddpd_t *d);
/* Unlinks j from d->jobs and frees it; its handles must be closed (after the loop ran out). */
void ddpd_job_free(ddpd_job_t *j);

#endif
