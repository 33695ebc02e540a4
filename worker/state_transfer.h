/* Elastic: the state a rank takes from a live one when it starts a generation without the job's
 * state (a joiner, or a survivor that missed the source's last step), overlapped with the other
 * ranks' next step.
 *
 * The coordinator names a source (the member with the newest step) when some member is behind.
 * At the generation's start every rank takes the source's counters (a small broadcast) and
 * learns which ranks receive (a small all-reduce): ddp_xfer_plan. In the generation's first
 * step, the ranks that hold the state train as usual on the micro-batches dealt among them
 * alone, while the weights and moments travel to the receivers (ddp_xfer_start): on the ring,
 * one transfer per run of consecutive receivers, from the holder just before it, so the bytes
 * cross one link and no holder's buffer is written. The transfers are queued before the step's
 * gradient buckets, so they run during the holders' forward pass. A receiver computes nothing in
 * that step: it adds -0.0 to every gradient sum (x + -0 = x, so the holders' sum is unchanged),
 * receives the step's averaged gradient like everyone, and applies the same update to the state
 * it received. It is then the holders' replica bit for bit, which the replica check after the
 * step confirms. The holders never stall for the transfer; the one place they can wait is their
 * first gradient bucket queued behind it.
 *
 * Threads: the compute thread calls everything.
 */
#ifndef DDP_WORKER_STATE_TRANSFER_H
#define DDP_WORKER_STATE_TRANSFER_H

#include <stddef.h>
#include <stdint.h>

#include "collectives/coll.h"
#include "common/err.h"

/* The trainer's counters, as the source holds them. */
typedef struct ddp_xfer_header {
    int64_t step, adam_t;
    uint64_t tokens, rng[4];
    int32_t skipped, loss_scale_clean;
    float last_loss, last_val_loss, loss_scale;
    double last_norm, last_step_ms;
} ddp_xfer_header_t;

#define DDP_XFER_MAX_REQS 48 /* arenas x runs of receivers */

typedef struct ddp_xfer {
    int active;       /* the next step carries the transfers */
    int receiving;    /* this rank receives (and computes nothing in that step) */
    int n_receivers;
    int deal_rank, deal_world; /* this rank's place among the ranks that compute that step */
    int first_root;   /* the holder that sends to the first run of receivers */
    int world, rank;
    unsigned char *receivers; /* [world] */
    ddp_coll_req_t *reqs[DDP_XFER_MAX_REQS];
    int n_reqs;
    int64_t t_start;
    double bytes, ms; /* received (receivers), and the time to the last byte */
} ddp_xfer_t;

/* Collective, at the start of a generation in which some rank is behind the source: every rank
 * gets the source's counters, and a rank whose state is not the source's (has_state 0, or
 * another step) becomes a receiver: *hdr is replaced by the source's there (a holder's *hdr is
 * left as it is). Sets the deal of the next step. Returns 0 or the communicator's error. */
int ddp_xfer_plan(ddp_xfer_t *x, ddp_coll_t *comm, int source, int has_state,
                  ddp_xfer_header_t *hdr, ddp_errinfo_t *ei);
/* Queues the transfers of n_arenas arenas of n floats each (in the same order on every rank).
 * On a GPU the caller first orders them after the update that wrote the arenas
 * (ddp_reducer_after_compute). Returns 0 or the error. */
int ddp_xfer_start(ddp_xfer_t *x, ddp_coll_t *comm, float *const *arenas, int n_arenas,
                   size_t n);
/* Waits for the transfers (x->ms: from start to the last one). Returns 0 or the error. */
int ddp_xfer_wait(ddp_xfer_t *x, ddp_errinfo_t *ei);
/* Ends the transfer (after the step): frees what plan allocated, keeps nothing active. */
void ddp_xfer_clear(ddp_xfer_t *x);

#endif
