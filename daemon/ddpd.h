/* The daemon's state: one ddpd_t per process, owned by main and reached by every module.
 *
 * Threading: everything here is touched by the loop thread only.
 * Lifetime: modules that own libuv handles close them in their *_close function; main runs the
 * loop until every handle's close callback has run, then frees the rest.
 */
#ifndef DDPD_DDPD_H
#define DDPD_DDPD_H

#include <stdint.h>
#include <uv.h>

#include "daemon/config.h"
#include "daemon/store.h"

#define DDPD_VERSION "0.1.0"

typedef struct ddpd_job ddpd_job_t;
typedef struct ddpd_api ddpd_api_t;
typedef struct ddpd_http ddpd_http_t;
typedef struct ddpd_links ddpd_links_t;
typedef struct ddpd_remote ddpd_remote_t;
typedef struct prune ddpd_prune_t;

/* Told that job j changed; `what` is a mask of DDPD_JOB_STATE (a transition), DDPD_JOB_PROGRESS
 * (a new metrics line) and DDPD_JOB_SLOTS (local ranks started or ended). See job.h. */
typedef void (*ddpd_job_change_fn)(void *arg, ddpd_job_t *j, unsigned what);
#define DDPD_JOB_STATE 1u
#define DDPD_JOB_PROGRESS 2u
#define DDPD_JOB_SLOTS 4u
#define DDPD_MAX_JOB_WATCHERS 4

typedef struct ddpd {
    uv_loop_t *loop;
    ddpd_config_t cfg;
    ddpd_store_t *store;
    ddpd_api_t *api;
    ddpd_http_t *http;
    ddpd_links_t *links;   /* link.h */
    ddpd_remote_t *remote; /* remote.h */

    ddpd_job_t *jobs;      /* jobs this node coordinates that are not freed, in id order: the
                              job module's; others iterate with ddpd_job_first/next */
    struct {
        ddpd_job_change_fn fn;
        void *arg;
    } job_watchers[DDPD_MAX_JOB_WATCHERS]; /* ddpd_job_on_change */
    int n_job_watchers;
    int slots__used;       /* local slots held by running ranks (own jobs and peers' ranks):
                              slots.c alone writes it; read it with ddpd_slots_used */
    uv_timer_t sched_timer; /* deferred scheduling pass (a safe point) */
    uv_timer_t store_timer; /* writes the store's kept records once there is room */
    ddpd_prune_t *prune;   /* prune.h (NULL unless runs_keep_days) */
    uv_signal_t sig_term, sig_int;
    uv_timer_t stop_timer;
    int stopping;          /* shutdown started: no new jobs, jobs are being ended */
    int64_t start_ms;

    /* counters for /metrics */
    uint64_t n_submitted, n_requests, n_request_errors, n_finished[3];
    uint64_t n_worker_restarts; /* elastic jobs' ranks spawned again */
    uint64_t n_store_errors;    /* job records the store failed to write (logged each time) */
} ddpd_t;

#endif
