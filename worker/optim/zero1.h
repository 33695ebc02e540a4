/* ZeRO-1's optimizer moments (ddp.shard_optimizer, sync/reducer.h's ZeRO-1 step): where each
 * rank's moment arenas live and when they are whole. The trainer holds one ddp_zero1_t.
 *
 * Each rank updates its slices (reducer.parts) of the parameter and moment arenas, which keep
 * the parameter arena's layout. Between saves only those slices are current and only they hold
 * memory: on the CPU the other pages are given back (ddp_mem_release) and read as zero; on a GPU
 * the arenas are reserved address ranges (ddp_k_reserve) of which only this rank's slices are
 * committed, and the rest is unmapped (ddp_k_decommit). Before a save every rank gathers every
 * slice (committing the range first on a GPU), which makes the moments whole again; the next
 * update gives the foreign slices back. The slices of other ranks before and after this rank's
 * in a bucket are given back as two ranges, each rounded inward to the backend's granule: up to
 * two granules per bucket stay (2 MiB each on a GPU, against 25 MiB buckets).
 *
 * Compute thread only.
 */
#ifndef DDP_WORKER_OPTIM_ZERO1_H
#define DDP_WORKER_OPTIM_ZERO1_H

#include "collectives/coll.h"
#include "common/err.h"
#include "kernels/kernels.h"
#include "worker/sync/reducer.h"
#include "worker/sync/world.h"

typedef struct ddp_zero1 {
    int on;            /* the optimizer step is split over the ranks (sync/reducer.h) */
    int whole;         /* every rank's moment arenas are current everywhere */
    int mid_update;    /* an update has begun and not completed on every rank */
    int gather;        /* this step's update also gathers the moments (a save follows) */
    int was_whole;     /* the moments were whole when the update in progress began */
    float *moments[2]; /* the moment arenas when the trainer provides them (else NULL) */
    /* borrowed from the trainer: the world from the start, the rest set by each attach */
    const ddp_world_t *world;
    ddp_reducer_t *reducer;
    float *weights; /* the parameter arena */
} ddp_zero1_t;

/* ddp_adamw_step's callback after each part it updated (arg: the ddp_zero1_t). */
typedef int (*ddp_zero1_part_fn)(void *arg, int part);

/* At each attach to a world (the trainer's): the reducer whose parts are this rank's slices, and
 * the parameter arena they are gathered into. */
void ddp_zero1_attach(ddp_zero1_t *z, ddp_reducer_t *reducer, float *weights);
/* Device memory (a GPU, or the simulated one), when the trainer splits the optimizer step (ZeRO-1)
 * over a communicator whose reduce-scatter takes device memory (nccl): reserves both moment arenas
 * of n floats and sets z->on. commit_whole (with checkpoints: a resume loads them whole and every
 * save gathers them) commits them at once; else nothing is committed until ddp_zero1_begin. Returns
 * 0 or the backend's error. */
int ddp_zero1_reserve_device(ddp_zero1_t *z, size_t n, int commit_whole, ddp_errinfo_t *ei);
/* After the reducer has cut this rank's parts: sets z->whole (1: every rank's arenas hold the
 * whole moments, zero or loaded; 0 after a reservation not committed whole: only this rank's
 * slices, committed here, zero). */
int ddp_zero1_begin(ddp_zero1_t *z, ddp_errinfo_t *ei);
/* ddp_adamw_step's callback in a ZeRO-1 step (arg: z): bucket b's part is updated; starts its
 * all-gather to every rank, and the moments' too when a save follows this step (z->gather). */
int ddp_zero1_on_part_updated(void *arg, int b);
/* Makes every rank's moment arenas whole before a checkpoint reads them; at once when the
 * update of a step whose save was planned already did. Collective. */
int ddp_zero1_gather(ddp_zero1_t *z, ddp_errinfo_t *ei);
/* Sharded step on one host, after a failure: makes this rank's moment arenas whole without the
 * other ranks, dead or alive, by reading their slices from their shared arenas, which this
 * process maps. Sound when the last update completed (every rank's slices of it were written
 * before the all-gather that completed it here). Returns 1 when the moments are whole (also when
 * they were), 0 when they cannot be (an update cut short, or ranks on other hosts). */
int ddp_zero1_from_peers(ddp_zero1_t *z);
/* Before a step's optimizer update; save_follows: a save of the step is planned, so a ZeRO-1
 * update also gathers the moments. Marks the moments mid-update (a rank's state is then part
 * this step, part the next, and an emergency save after a failure inside the update must refuse
 * them) and returns ddp_adamw_step's callback for its arg z: ddp_zero1_on_part_updated, or
 * NULL when the step is not split (no ZeRO-1). */
ddp_zero1_part_fn ddp_zero1_update_begin(ddp_zero1_t *z, int save_follows);
/* After that update completed here (its all-gathers waited for): the moments are whole when it
 * gathered them, else only this rank's slices are current, and the memory of the others is
 * given back when they were whole before. */
void ddp_zero1_update_end(ddp_zero1_t *z);
/* Whether the step is split (ZeRO-1) and this rank's moment arenas are whole now (before the first
 * update, or after an update that gathered them for a save). */
int ddp_zero1_gathered(const ddp_zero1_t *z);
/* After an update that left the moments in slices, when they were whole before: gives back the
 * memory of the moment arenas outside this rank's parts. */
void ddp_zero1_drop_foreign(ddp_zero1_t *z);

#endif
