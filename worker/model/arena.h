/* The parameter arena's parts: the slices of it that one rank updates, and the blocks its
 * gradient norm is summed over. A type of its own below the reducer (sync/, which cuts the
 * parts) and the optimizer (optim/, which updates them).
 */
#ifndef DDP_WORKER_MODEL_ARENA_H
#define DDP_WORKER_MODEL_ARENA_H

#include <stddef.h>

/* The gradient norm is summed from the sums of squares of blocks of DDP_NORM_BLOCK elements that
 * start at every bucket's beginning (sync/reducer.h): whichever rank computes a block, its sum
 * is the same, so the norm is the same for any number of ranks and any split of the update. */
#define DDP_NORM_BLOCK ((size_t)16384)

/* A part of the arena that this rank updates: [lo, hi), whose first DDP_NORM_BLOCK-element block
 * is norm block number `block`. */
typedef struct ddp_arena_part {
    size_t lo, hi, block;
} ddp_arena_part_t;

#endif
