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
#include <stdint.h>

#include "common/err.h"
#include "daemon/ddpd.h"
#include "proto/metrics.h"

typedef enum {
    DDPD_QUEUED,
    DDPD_STARTING,
    DDPD_RUNNING,
    DDPD_SUCCEEDED,
    DDPD_FAILED,
    DDPD_CANCELLED,
} ddpd_state_t;

/* ---- what the rest of the daemon reads of a job (job_view.c) ----
 * The job itself is the job module's (job.c, job_accept.c, job_view.c; job_int.h); other
 * files hold a ddpd_job_t * only between a lookup and the end of their callback: a job is
 * freed at a safe point once it is terminal and its handles are closed. */

/* The jobs not yet freed, in id order: for (j = ddpd_job_first(d); j; j = ddpd_job_next(j)).
 * A job is freed only at a safe point (a close callback), so the body may start, cancel or end
 * j and still step to the next one. */
ddpd_job_t *ddpd_job_first(ddpd_t *d);
ddpd_job_t *ddpd_job_next(const ddpd_job_t *j);

int64_t ddpd_job_id(const ddpd_job_t *j);
const char *ddpd_job_name(const ddpd_job_t *j);
ddpd_state_t ddpd_job_state(const ddpd_job_t *j);
int ddpd_job_world(const ddpd_job_t *j);    /* ranks */
uint32_t ddpd_job_uid(const ddpd_job_t *j); /* the submitter: who may cancel it */
const char *ddpd_job_run_dir(const ddpd_job_t *j);
/* Sends sig to each live rank of j on this node that has a handler for it (the process, not its
 * group: SIGUSR2 asks a rank for its flight recorder dump, collectives/flight.h; a rank that does
 * not catch it is left alone rather than ended). Returns how many were signalled. */
int ddpd_job_signal_local(ddpd_job_t *j, int sig);
/* Sends sig to the job's ranks on other nodes, through their daemons (SIGUSR2: a dump request,
 * only to ranks that catch it). Returns how many of the job's ranks run elsewhere. */
int ddpd_job_signal_peers(ddpd_job_t *j, int sig);
/* 1 when the job's coordinator runs on this daemon (an elastic job): it gathers every rank's
 * flight recorder dump and writes the diagnosis. */
int ddpd_job_coordinated(const ddpd_job_t *j);
/* Ranks of j placed on this node (live or not). */
int ddpd_job_local_ranks(const ddpd_job_t *j);
/* ddp_spec_warning's sentence for its spec, "" when none. */
const char *ddpd_job_warning(const ddpd_job_t *j);

/* The peer (an index for link.h's ddpd_peers_*) that runs `rank`, or -1 when it runs here,
 * waits for a place, the job is not started or rank is not one of its ranks. */
int ddpd_job_rank_peer(const ddpd_job_t *j, int rank);

/* For the scheduler: whether j waits in the queue for a place (queued and not being
 * discarded), and the ranks of a running elastic job that lost their node and wait for a place
 * again (written to `ranks`, room for ddpd_job_world(j), when not NULL; returns how many; 0
 * for any other job). */
int ddpd_job_waiting(const ddpd_job_t *j);
int ddpd_job_lost_ranks(const ddpd_job_t *j, int *ranks);

/* An elastic job's generation (its coordinator's count of re-formed groups): returns 1 with
 * *gen set while the job is active and has a coordinator here, else 0. */
int ddpd_job_generation(const ddpd_job_t *j, unsigned long *gen);
/* Rank 0's last step record from metrics.jsonl, NULL before the first one. */
const ddp_metrics_rec_t *ddpd_job_last_step(const ddpd_job_t *j);

/* Shutdown: whether any job still has ranks the daemon must wait for (local ones alive, or
 * remote ones of a job not finished). */
int ddpd_job_busy(ddpd_t *d);
/* Shutdown on a second signal: SIGKILL to every local rank of every job, at once. */
void ddpd_job_kill_all(ddpd_t *d);

/* Subscribes fn to every change of every job (see ddpd_job_change_fn): the API's watchers, the
 * scheduler and the peers' slot announcements learn of jobs this way, so that jobs know none
 * of them. At most DDPD_MAX_JOB_WATCHERS subscribers (a programmer error past that). */
void ddpd_job_on_change(ddpd_t *d, ddpd_job_change_fn fn, void *arg);

const char *ddpd_state_name(ddpd_state_t s);
int ddpd_state_terminal(ddpd_state_t s);

/* What a client asked for, its spec already parsed and validated (submit.c parses it off the
 * loop thread). */
typedef struct ddpd_submit {
    struct ddp_spec *spec; /* the caller's; the job takes what it needs (see take_spec) */
    const char *name;  /* override (a valid job name: ddp_spec_name_ok) or NULL */
    const char *cwd;   /* submitter's directory or NULL */
    int workers;       /* override (> 0) or 0 */
    int capacity;      /* slots in the cluster: a job that needs more is refused */
    uint32_t uid, gid;
    const uint32_t *groups; /* the submitter's supplementary groups (copied) */
    int n_groups;
} ddpd_submit_t;

/* Stores and queues the job, and kicks the scheduler. Returns 0 with *out set, DDP_EBUSY (more
 * ranks than the cluster has slots; ei says so), DDP_EQUOTA (the user's queued-jobs quota),
 * DDP_EABORTED (shutting down), DDP_ESQL (the store cannot record it; ei says why) or another
 * error. */
int ddpd_job_submit(ddpd_t *d, const ddpd_submit_t *sub, ddpd_job_t **out, ddp_errinfo_t *ei);

/* Jobs of uid waiting in the queue, and ranks of uid's started jobs that are not over. */
int ddpd_job_queued_of(ddpd_t *d, uint32_t uid);
int ddpd_job_ranks_of(ddpd_t *d, uint32_t uid);
/* When the job was submitted (wall clock, ms): the scheduler's age. */
int64_t ddpd_job_submitted_ms(const ddpd_job_t *j);

/* Re-queues a job found queued in the store at start-up. */
int ddpd_job_requeue(ddpd_t *d, json_t *row);

/* The active job with this id, or NULL. */
ddpd_job_t *ddpd_job_find(ddpd_t *d, int64_t id);

/* Starts a placed job: writes job.json, spawns local ranks, asks peers for theirs.
 * rank_node (length world; ownership moves to the job) says where each rank runs. */
void ddpd_job_start(ddpd_job_t *j, int *rank_node);

/* Cancel by `uid` (recorded; whether uid may cancel it is the caller's to decide): a queued job
 * ends at once; a running one gets SIGTERM, then SIGKILL after the grace period. Returns 0 or
 * DDP_EINVAL (finished). */
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
/* Frees every job left; their handles must be closed (after the loop ran out). */
void ddpd_job_free_all(ddpd_t *d);

#endif
