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
#ifndef DDP_WORKER_STATE_TRANSFER_H
#define DDP_WORKER_STATE_TRANSFER_H

#include <stddef.h>
#include <stdint.h>

#include "collectives/coll.h"
#include "common/err.h"
#include "proto/spec.h"

/* The trainer's counters, as the source holds them, and the source's last step's figures that
 * decide between pause and overlap. */
typedef struct ddp_transfer_header {
    int64_t step, adam_t;
    uint64_t tokens, rng[4];
    int32_t skipped, loss_scale_clean;
    float last_loss, last_val_loss, loss_scale;
    double last_norm, last_step_ms;
    double micro_ms;     /* forward + backward of one micro-batch; 0: unknown */
    double allreduce_ms; /* the gradient's all-reduce (busy time), world allreduce_world */
    int32_t allreduce_world;
} ddp_transfer_header_t;

#define DDP_TRANSFER_MAX_REQS 48 /* arenas x runs of receivers */

typedef struct ddp_transfer {
    int active;       /* some rank receives */
    int overlap;      /* during the next step (else before it) */
    int receiving;    /* this rank receives (and computes nothing in that step) */
    int n_receivers;
    int deal_rank, deal_world; /* overlap: this rank's place among the ranks that compute the
                                * step (0, 0: a receiver computes nothing) */
    int first_root;   /* the holder that sends to the first run of receivers */
    int world, rank;
    unsigned char *receivers; /* [world] */
    ddp_coll_req_t *reqs[DDP_TRANSFER_MAX_REQS];
    int n_reqs;
    int64_t t_start;
    double bytes, ms; /* received (receivers), and the time to the last byte */
} ddp_transfer_t;

/* Whether overlapping pays, from the source's figures: the transfer of `bytes` (estimated from
 * the gradient all-reduce's time: a transfer crosses each link once, an all-reduce 2(W-1)/W
 * times) against the extra micro-batches the busiest holder computes when `receivers` of
 * `world` ranks sit out a step of n_micro. Unknown figures: pause. Pure. */
int ddp_transfer_overlap_pays(const ddp_transfer_header_t *h, double bytes, size_t grad_bytes,
                          int world, int receivers, int n_micro);
/* Collective, at the start of a generation in which some rank is behind the source: every rank
 * gets the source's counters, and a rank whose state is not the source's (has_state 0, or
 * another step) becomes a receiver: *hdr is replaced by the source's there (a holder's *hdr is
 * left as it is). x->overlap: mode (ddp.state_transfer), auto decided as
 * ddp_transfer_overlap_pays says for the n floats of 3 arenas; with overlap, x->deal_* is the next
 * step's deal. Returns 0 or the communicator's error. */
int ddp_transfer_plan(ddp_transfer_t *x, ddp_coll_t *comm, int source, int has_state, int mode,
                  size_t n, int n_micro, ddp_transfer_header_t *hdr, ddp_errinfo_t *ei);
/* Queues the transfers of n_arenas arenas of n floats each (in the same order on every rank).
 * On a GPU the caller first orders them after the update that wrote the arenas
 * (ddp_reducer_after_compute). Returns 0 or the error. */
int ddp_transfer_start(ddp_transfer_t *x, ddp_coll_t *comm, float *const *arenas, int n_arenas,
                   size_t n);
/* Waits for the transfers (x->ms: from start until the communication thread finished the last
 * one). Returns 0 or the error. */
int ddp_transfer_wait(ddp_transfer_t *x, ddp_errinfo_t *ei);
/* Ends the transfer (after the step): frees what plan allocated, keeps nothing active. */
void ddp_transfer_clear(ddp_transfer_t *x);

#endif
