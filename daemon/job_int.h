/* The job state machine's internals (job.c), for the file that creates jobs (job_accept.c).
 * Loop thread only.
 */
#ifndef DDPD_JOB_INT_H
#define DDPD_JOB_INT_H

#include "daemon/job.h"

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
