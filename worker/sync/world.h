/* The world: the ranks a rank trains with now (a generation, in an elastic job), as one handle
 * that every part which talks to the other ranks takes as `const ddp_world_t *` and keeps no
 * copy of. The trainer holds the one ddp_world_t and changes it in one place when a generation
 * changes (worker/generation.c).
 *
 * Besides who (communicator, rank, size, generation) it knows where buffers that are all-reduced
 * in place live (collective memory on the CPU, the kernels' memory on a GPU), and gives the one
 * helper for "all-reduce a few floats and wait" (the vote, the gradient norm of a ZeRO-1 step,
 * the checkpoints' settling, the replica check's verdict and the state transfer all use it).
 * Training thread only.
 */
#ifndef DDP_WORKER_SYNC_WORLD_H
#define DDP_WORKER_SYNC_WORLD_H

#include <stddef.h>
#include <stdint.h>

#include "collectives/coll.h"
#include "common/err.h"
#include "kernels/kernels.h"

typedef struct ddp_world {
    ddp_coll_t *comm;    /* NULL in a world of one */
    int rank, size;      /* 0 and 1 in a world of one */
    uint64_t generation; /* the elastic coordinator's count (0: a static world) */
    ddp_kernels_t *k;    /* the kernels whose memory the collectives read (borrowed) */
} ddp_world_t;

/* Reduces n floats over the ranks with op, in place, and waits (nothing in a world of one).
 * Returns 0 or the communicator's error, with ei naming it. */
int ddp_world_allreduce(const ddp_world_t *w, float *vals, size_t n, ddp_redop_t op,
                        ddp_errinfo_t *ei);
/* Whether the communicator has failed (a dead peer's link, the coordinator's notice). */
int ddp_world_failed(const ddp_world_t *w);
/* Whether rc is a failure of the communication (a rank died, a deadline passed, the generation
 * or the job was ended): the state this rank holds is sound. */
int ddp_world_comm_error(const ddp_world_t *w, int rc);
/* Orders the operations submitted to the communicator from now on after everything queued so
 * far on the kernels' compute stream (an event recorded there, waited for on the
 * communicator's): call it before a collective reads a buffer that queued device work writes.
 * Nothing to do on the CPU (synchronous ops) or in a world of one. Returns 0 or the error. */
int ddp_world_after_compute(const ddp_world_t *w);

/* Whether buffers all-reduced in place live in the communicator's collective memory (the CPU in
 * a world of several: shared by the ranks of one host, where the all-reduce reads and writes
 * every rank's copy directly: ddp_coll_mem_alloc), else in the kernels' memory. */
int ddp_world_uses_coll_mem(const ddp_world_t *w);
/* A zeroed buffer of `bytes` that is all-reduced in place (*out), and its release. Returns 0 or
 * the error. */
int ddp_world_alloc_reduced(const ddp_world_t *w, size_t bytes, float **out, ddp_errinfo_t *ei);
void ddp_world_free_reduced(const ddp_world_t *w, float *p);

#endif
