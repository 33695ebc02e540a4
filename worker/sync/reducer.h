/* The reducer: bucketed all-reduce of the gradient arena, overlapped with backward.
 *
 * Buckets are contiguous slices of the gradient arena (which is in backward completion order):
 * the first is `first_bucket_mb`, the rest `bucket_mb`. Backward reports the finished prefix of
 * the arena (ddp_reducer_ready); each bucket inside it starts its all-reduce at once on the
 * communicator's thread, always in bucket order, so every rank submits the same sequence.
 * With accumulation, the sum of the earlier micro-steps (`acc`) is added into each slice just
 * before its bucket starts, so the all-reduce carries sum over micro-steps and ranks. On a GPU
 * that add is queued on the compute stream and the all-reduce on NCCL's: an event recorded
 * after the adds orders them (ddp_world_after_compute).
 * ddp_reducer_finish waits for every bucket and records, per bucket, when it became ready,
 * started and finished on the communication thread, from which the step's exposed
 * (not hidden) communication time is derived.
 *
 * ZeRO-1 (`zero1`: ddp.shard_optimizer where the communicator can, see worker/setup.c
 * alloc_arenas): each bucket is reduce-scattered instead, so this rank holds the reduced gradient
 * of its slice of every bucket (ddp_coll_slice), its `parts`; the optimizer updates those, and
 * ddp_reducer_gather copies their new values to every rank. Without it every part is a whole
 * bucket. Either way the parts carry the numbers of their gradient-norm blocks
 * (model/arena.h), counted from each bucket's beginning, so the norm's blocks are the same for
 * any world size.
 *
 * bf16 (ddp.grad_dtype, sync/grad_dtype.h): each bucket is narrowed to bf16 in place just before
 * its collective and widened back when it completed (ddp_reducer_finish), whole (ZeRO-1 too: the
 * parts outside this rank's then hold its own contribution, rounded, as fp32 leaves them its
 * own). A world of one rounds nothing.
 *
 * Threads: the compute thread calls everything; the all-reduces run on the communicator's own.
 */
#ifndef DDP_WORKER_SYNC_REDUCER_H
#define DDP_WORKER_SYNC_REDUCER_H

#include <stddef.h>
#include <stdint.h>

#include "collectives/coll.h"
#include "kernels/kernels.h"
#include "worker/model/arena.h"
#include "worker/sync/world.h"

typedef struct ddp_bucket_times {
    int64_t ready, start, end; /* monotonic ns */
} ddp_bucket_times_t;

typedef struct ddp_reducer {
    const ddp_world_t *world; /* the trainer's (borrowed): the ranks and the kernels */
    float *arena;             /* gradient arena (reduced in place) */
    size_t n;                 /* floats in it */
    int overlap;              /* 0: all buckets start after backward (ddp.overlap: false) */
    int zero1;                /* reduce-scatter (ZeRO-1) instead of all-reduce */
    int bf16;                 /* buckets travel as bf16 (grad_dtype.h); 0 in a world of one */
    float *scratch;           /* bf16 on device memory: host scratch of the largest bucket */
    int n_buckets;
    size_t *bucket_end;      /* [n_buckets]: bucket b is [end[b-1], end[b]) */
    ddp_arena_part_t *parts; /* [n_buckets]: what this rank updates of each bucket */
    size_t n_norm_blocks;    /* norm blocks over all buckets */
    float *norm_sums;        /* [n_norm_blocks]: the caller's gradient-norm blocks (host) */
    ddp_coll_req_t **reqs;
    ddp_coll_req_t **gathers; /* [3 * n_buckets]: gathers started, n_gathers of them */
    int n_gathers;
    ddp_bucket_times_t *times;
    /* per step */
    const float *acc;  /* added into the arena before reduction; NULL = none */
    size_t ready_upto; /* prefix of the arena reported final (and acc-added) */
    int next;          /* next bucket to submit */
    int narrowed;      /* bf16: buckets narrowed so far (>= next) */
    int ready_rc;      /* the first error of ddp_reducer_ready (backward's callback) */
    int64_t backward_end;
} ddp_reducer_t;

/* Per-step accounting, in milliseconds. */
typedef struct ddp_reducer_stats {
    double comm_ms;    /* time the communication thread spent on the step's buckets */
    double exposed_ms; /* time the step waited for them after backward ended */
    double hidden;     /* 1 - exposed / comm, in [0, 1] */
} ddp_reducer_stats_t;

/* How a reducer cuts and reduces an arena. */
typedef struct ddp_reducer_cfg {
    const ddp_world_t *world;          /* kept (not copied): a world of one reduces nothing */
    float *arena;                      /* the gradient arena, reduced in place */
    size_t n;                          /* floats in it */
    double first_bucket_mb, bucket_mb; /* ddp.first_bucket_mb, ddp.bucket_mb */
    int overlap;                       /* ddp.overlap */
    /* ZeRO-1: needs a communicator whose reduce-scatter takes the arena
     * (ddp_coll_slices_anywhere, or the arena in collective memory shared by every rank) */
    int zero1;
    int bf16; /* ddp.grad_dtype: bf16 (ignored in a world of one) */
} ddp_reducer_cfg_t;

/* Splits cfg's arena into buckets (and, for bf16 on device memory, allocates the host scratch).
 * Returns 0 or DDP_ENOMEM. */
int ddp_reducer_init(ddp_reducer_t *r, const ddp_reducer_cfg_t *cfg);
void ddp_reducer_close(ddp_reducer_t *r); /* NULL-safe */

/* Starts a step's reduction; acc (may be NULL) is added into each slice before it is sent. */
void ddp_reducer_begin(ddp_reducer_t *r, const float *acc);
/* Backward's callback: floats [0, done) of the arena are final. Starts every bucket that is
 * now complete (when overlapping). Returns 0 or the communicator's error (also kept, for
 * ddp_reducer_finish). */
int ddp_reducer_ready(ddp_reducer_t *r, size_t done);
/* After backward: starts what is left and waits for every bucket. Fills stats (may be NULL).
 * Returns 0 or the error, with ei naming the failed operation and rank, else the first error
 * of ddp_reducer_ready since ddp_reducer_begin. */
int ddp_reducer_finish(ddp_reducer_t *r, ddp_reducer_stats_t *stats, ddp_errinfo_t *ei);

/* Sharded step: starts copying this rank's part of bucket b of `arena` (an arena with the
 * gradient's layout in the same collective memory: parameters, moments) to every rank. At most
 * three arenas' gathers may be outstanding. */
int ddp_reducer_gather(ddp_reducer_t *r, float *arena, int b);
/* Waits for every gather started. Returns 0 or the error, with ei naming it. */
int ddp_reducer_gather_wait(ddp_reducer_t *r, ddp_errinfo_t *ei);

#endif
