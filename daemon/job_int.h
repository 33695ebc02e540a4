/* The job module's private header: the job's fields and the state machine's internals.
 * The module is three files over one struct: job.c (the lifecycle: start, ranks, ending, a
 * daemon restart's detach), job_accept.c (how jobs come into being: submitted, re-queued,
 * adopted) and job_view.c (what the rest of the daemon reads: job.h's accessors and
 * job_view.h's live view). No other file includes this one.
 * Loop thread only.
 */
#ifndef DDPD_JOB_INT_H
#define DDPD_JOB_INT_H

#include <limits.h>
#include <stdint.h>
#include <uv.h>

#include "daemon/job.h"
#include "daemon/job_tail.h"
#include "daemon/spawn.h"

struct ddpd_job {
    ddpd_job_t *next;
    ddpd_t *d;
    int64_t id;
    char name[128];
    char warning[256]; /* ddp_spec_warning's sentence for its spec ("": none) */
    uint32_t uid, gid; /* the submitter: its ranks run as this user */
    uint32_t *groups;  /* and with these supplementary groups (owned) */
    int n_groups;
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

/* Unlinks j from d->jobs and frees it; its handles must be closed. */
void ddpd__job_free(ddpd_job_t *j);

/* A new job with its timers initialised (freed through ddpd__job_discard or the state machine).
 * Returns 0 or DDP_ENOMEM. */
int ddpd__job_new(ddpd_t *d, ddpd_job_t **out);
/* Appends j to d->jobs. */
void ddpd__job_link(ddpd_t *d, ddpd_job_t *j);
/* A job that never started: links it, closes its handles and frees it at their callbacks. */
void ddpd__job_discard(ddpd_job_t *j);
/* Tells the subscribers of ddpd_job_on_change. */
void ddpd__job_notify(ddpd_job_t *j, unsigned what);
/* A transition: stored, logged and notified. */
void ddpd__job_set_state(ddpd_job_t *j, ddpd_state_t to, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Logs and counts a failed store write (rc != 0) naming what it lost. */
void ddpd__job_check_stored(ddpd_job_t *j, int rc, const char *what);
/* Follows metrics.jsonl in the run directory (inotify, and a timer as the fallback). */
void ddpd__job_watch_run_dir(ddpd_job_t *j);
/* Makes p one of j's local ranks (its exit and close callbacks). */
void ddpd__job_proc_init(ddpd_job_t *j, ddpd_proc_t *p);
/* The coordinator's event callback of an elastic job (arg: the job). */
void ddpd__job_coord_event(void *arg, json_t *ev);
/* A local rank found ended without the daemon watching (after a restart): handled as its exit
 * would have been (spawned again, or the job fails). */
void ddpd__job_ended_unwatched(ddpd_job_t *j, ddpd_proc_t *p);
/* Records what a restarted daemon needs to adopt the job. */
void ddpd__job_save_runtime(ddpd_job_t *j);
/* Finishes the job when nothing of it runs any more. */
void ddpd__job_maybe_finish(ddpd_job_t *j);

#endif
