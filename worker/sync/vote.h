/* The step's vote: the one small all-reduce that commits a step. Each rank puts in what it has
 * to tell the others, and every rank gets the sums:
 *   the losses of its micro-steps       (the step's mean loss)
 *   whether it was asked to stop        (every rank stops after this step)
 *   how many checkpoint writers have their checkpoint shards durable / failed
 *                                       (saving/saving.h: ddp_saving_vote, _tally; a striped
 *                                       save settles with no collective of its own)
 *   whether its coordinator wants a new generation (every rank leaves after this step)
 *   its forward and backward time       (one slot per rank: sync/straggler.h)
 * On the wire: n = 5 + world floats, [loss, stop, ckpt0, ckpt1, regroup, ms of rank 0..world-1],
 * the layout every build since the vote began uses (ranks of two builds may share a job).
 *
 * Training thread only.
 */
#ifndef DDP_WORKER_SYNC_VOTE_H
#define DDP_WORKER_SYNC_VOTE_H

#include <stddef.h>

#include "common/err.h"
#include "worker/sync/world.h"

/* One rank's ballot: its part before ddp_vote_cast, the sums over the ranks after. */
typedef struct ddp_ballot {
    double loss_sum;      /* the micro-steps' losses */
    int stop;             /* ranks that were asked to stop */
    float ckpt[2];        /* checkpoint writers' checkpoint shards durable / failed */
    int regroup;          /* ranks whose coordinator wants a new generation */
    double compute_ms;    /* in: this rank's forward and backward */
    const float *rank_ms; /* out: [world size], every rank's (valid until the next cast) */
} ddp_ballot_t;

typedef struct ddp_vote {
    const ddp_world_t *world; /* the attach's (borrowed) */
    float *buf;               /* [DDP_VOTE_FIXED + world size] */
} ddp_vote_t;

#define DDP_VOTE_FIXED 5 /* floats before the per-rank slots */

/* At each attach to a world: sizes the buffer for it. Returns 0 or DDP_ENOMEM. */
int ddp_vote_attach(ddp_vote_t *v, const ddp_world_t *world);
/* Collective: all-reduces b (this rank's part in, the sums out). Returns 0 or the
 * communicator's error, with ei naming it. */
int ddp_vote_cast(ddp_vote_t *v, ddp_ballot_t *b, ddp_errinfo_t *ei);
void ddp_vote_free(ddp_vote_t *v); /* NULL-safe */

#endif
