/* Elastic: the state a rank takes from a live one when it starts a generation without the job's
 * state (a joiner, or a survivor that missed the source's last step), overlapped with the other
 * ranks' next step.
 *
 * The coordinator names a source (the member with the newest step) when some member is behind.
 * At the generation's start every rank takes the source's counters (a small broadcast) and
 * learns which ranks receive (a small all-reduce): ddp_transfer_plan. The weights and moments then
 * travel to the receivers (ddp_transfer_start): on the ring, one transfer per run of consecutive
 * receivers, from the holder just before it, so the bytes cross one link and no holder's buffer
 * is written. Either the ranks wait for them before the next step (pause), or they travel
 * during it (overlap): the ranks that hold the state compute that step on the micro-batches
 * dealt among them alone, and the transfers, queued before the step's gradient buckets, run
 * during their forward pass. A receiver computes nothing in that step: it adds -0.0 to every
 * gradient sum (x + -0 = x, so the holders' sum is unchanged), receives the step's averaged
 * gradient like everyone, and applies the same update to the state it received. It is then the
 * holders' replica bit for bit, which the replica check after the step confirms.
 *
 * Overlap hides the transfer but takes the receivers' share of one step from the holders; on
 * many ranks that share is small and the transfer is long (TorchFT's healing makes the same
 * trade), on a few ranks sharing cores the transfer is shorter than the share. ddp.state_transfer
 * chooses; auto takes the cheaper by the source's own last step (ddp_transfer_overlap_pays).
 *
 * Threads: the compute thread calls everything.
 */
#ifndef DDP_WORKER_SYNC_TRANSFER_H
#define DDP_WORKER_SYNC_TRANSFER_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "proto/spec.h"
#include "worker/sync/position.h"
#include "worker/sync/world.h"

#define DDP_TRANSFER_MAX_REQS 48 /* arenas x runs of receivers */

typedef struct ddp_transfer {
    int active;    /* some rank receives */
    int overlap;   /* during the next step (else before it) */
    int receiving; /* this rank receives (and computes nothing in that step) */
    int n_receivers;
    int deal_rank, deal_world; /* overlap: this rank's place among the ranks that compute the
                                * step (0, 0: a receiver computes nothing) */
    int first_root;            /* the holder that sends to the first run of receivers */
    const ddp_world_t *world;  /* the plan's (borrowed) */
    unsigned char *receivers;  /* [world->size] */
    ddp_coll_req_t *reqs[DDP_TRANSFER_MAX_REQS];
    int n_reqs;
    int64_t t_start;
    double bytes, ms; /* received (receivers), and the time to the last byte */
} ddp_transfer_t;

/* What a transfer is planned from. */
typedef struct ddp_transfer_cfg {
    const ddp_world_t *world; /* kept until ddp_transfer_clear */
    int source;               /* the rank whose state is the job's (the coordinator names it) */
    int has_state;            /* this rank holds the job's state (a joiner: 0) */
    int mode;                 /* ddp.state_transfer: DDP_TRANSFER_PAUSE, _OVERLAP or _AUTO */
    size_t n;                 /* floats in each of the 3 arenas (weights, both moments) */
    int n_micro;              /* micro-batches per step over all ranks */
    int extended;             /* ddp_position_extended(spec): pos->ext travels too */
    /* this rank's position, AdamW's update count and last step's times: the source's travel,
     * and a receiver's are replaced by them (of the times, only ms) */
    ddp_position_t *pos;
    long *adam_t;
    ddp_step_times_t *last;
} ddp_transfer_cfg_t;

/* Whether overlapping pays, from the source's last step: the transfer of `bytes` (estimated
 * from the gradient all-reduce's time: a transfer crosses each link once, an all-reduce
 * 2(W-1)/W times) against the extra micro-batches the busiest holder computes when `receivers`
 * of `world` ranks sit out a step of n_micro. Unknown figures: pause. Pure. */
int ddp_transfer_overlap_pays(const ddp_step_times_t *source, double bytes, size_t grad_bytes,
                              int world, int receivers, int n_micro);
/* Collective, at the start of a generation in which some rank is behind the source: every rank
 * gets the source's counters (one small broadcast of a fixed header), and a rank whose state is
 * not the source's (has_state 0, or another step) becomes a receiver: cfg's pos, adam_t and
 * last take the source's there. x->overlap: cfg->mode, auto decided as
 * ddp_transfer_overlap_pays says; with overlap, x->deal_* is the next step's deal. Returns 0
 * or the communicator's error. */
int ddp_transfer_plan(ddp_transfer_t *x, const ddp_transfer_cfg_t *cfg, ddp_errinfo_t *ei);
/* Queues the transfers of n_arenas arenas of n floats each (in the same order on every rank).
 * On a GPU the caller first orders them after the update that wrote the arenas
 * (ddp_world_after_compute). Returns 0 or the error. */
int ddp_transfer_start(ddp_transfer_t *x, float *const *arenas, int n_arenas, size_t n);
/* Waits for the transfers (x->ms: from start until the communication thread finished the last
 * one). Returns 0 or the error. */
int ddp_transfer_wait(ddp_transfer_t *x, ddp_errinfo_t *ei);
/* Ends the transfer (after the step): frees what plan allocated, keeps nothing active. */
void ddp_transfer_clear(ddp_transfer_t *x);

#endif
