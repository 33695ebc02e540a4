/* A worker's side of elastic training: its connection to the job's coordinator
 * (elastic_proto.h), generations, and the bootstrap each generation's communicator is formed from.
 *
 *     ddp_elastic_t *e;  ddp_elastic_gen_t g;  ddp_coll_bootstrap_t *bs;  ddp_coll_t *comm;
 *     ddp_elastic_connect("10.0.0.1:29400", token, hint, &e, &ei);
 *     for (;;) {                                   // one iteration per generation
 *         ddp_elastic_join(e, step, &g, &bs, &ei);  // blocks until the generation forms
 *         ddp_coll_new(bs, &opts, &comm, &ei);  ddp_coll_bootstrap_free(bs);
 *         ddp_elastic_watch(e, comm);               // a "reform" aborts comm from now on
 *         ... train; a failed collective or ddp_elastic_regroup_wanted() ends the generation ...
 *         ddp_elastic_watch(e, NULL);  ddp_coll_free(comm);
 *     }
 *     ddp_elastic_done(e, step);  ddp_elastic_free(e);
 *
 * A thread of the connection reads the coordinator's messages and sends a heartbeat every
 * DDP_ELASTIC_HB_MS, so a worker busy in a long step stays a member, and a stopped or hung
 * process (no heartbeats) is evicted. When the connection breaks the worker can no longer be a
 * member: the watched communicator is aborted and every later call fails with DDP_EPEER --
 * unless the coordinator comes back (its daemon restarted): a member redials it for the
 * "reconnect_s" of its last generation, training on, and rejoins (elastic_proto.h).
 * Threads: one caller thread; the connection's thread is internal.
 */
#ifndef DDP_COLLECTIVES_ELASTIC_H
#define DDP_COLLECTIVES_ELASTIC_H

#include <stdint.h>

#include "collectives/coll.h"

typedef struct ddp_elastic ddp_elastic_t;

#define DDP_ELASTIC_KEPT_MAX 256

typedef struct ddp_elastic_gen {
    uint64_t gen;
    int rank, size;
    int source;    /* rank whose state is newest */
    int sync;      /* 1: someone is behind the source; every rank joins its broadcast */
    long step;     /* the source's completed steps (-1: nobody holds state yet) */
    int receive;   /* 1: this rank's state is not the source's even at the same step (it comes
                    * from an older generation, whose step the others redid): it receives */
    char why[256]; /* why this generation formed ("start", "rank 2 (pid 7) died ...") */
    /* when every member was a member of the generation before (kept_from, else 0): each rank's
     * rank there, for ddp_coll_opts_t.parent_ranks (up to DDP_ELASTIC_KEPT_MAX ranks) */
    uint64_t kept_from;
    int kept[DDP_ELASTIC_KEPT_MAX];
} ddp_elastic_gen_t;

/* Connects to the coordinator at addr ("host:port"), retrying until timeout_s (0 = 60 s), and
 * starts the connection's thread. hint orders the first generation (the launcher's rank). */
int ddp_elastic_connect(const char *addr, const char *token, int hint, double timeout_s,
                        ddp_elastic_t **out, ddp_errinfo_t *ei);
/* Asks for a place in the next generation with `step` optimizer steps completed in this
 * process's memory (-1: none), and blocks until it forms. On success *bs is a bootstrap for
 * ddp_coll_new (owned by the caller) whose allgathers go through the coordinator. Errors:
 * DDP_EABORTED (the coordinator ended the job or evicted this worker: ei has its reason),
 * DDP_ECLOSED (the job finished before this worker was admitted: nothing left to do),
 * DDP_EPEER (the connection broke). */
int ddp_elastic_join(ddp_elastic_t *e, long step, ddp_elastic_gen_t *gen,
                     ddp_coll_bootstrap_t **bs, ddp_errinfo_t *ei);
/* The communicator that a "reform" of the current generation aborts at once (NULL: none).
 * Set it after ddp_coll_new and clear it before ddp_coll_free. */
void ddp_elastic_watch(ddp_elastic_t *e, ddp_coll_t *comm);
/* The completed steps this worker reports with its heartbeats. */
void ddp_elastic_set_step(ddp_elastic_t *e, long step);
/* 1 when the current generation should end at the next step boundary (a joiner waits) or has
 * ended already (reform, exit, lost connection). */
int ddp_elastic_regroup_wanted(ddp_elastic_t *e);
/* 1 once the coordinator ended the job or the connection broke (why: its reason). */
int ddp_elastic_lost(ddp_elastic_t *e, const char **why);
/* Tells the coordinator this worker trained to the end (it leaves without a regroup). Returns 0
 * (a coordinator that is away learns of the end from its daemon). */
int ddp_elastic_done(ddp_elastic_t *e, long step);
/* Closes the connection and joins its thread. NULL-safe. */
void ddp_elastic_free(ddp_elastic_t *e);

#endif
