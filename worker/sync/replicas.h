/* Replica consistency: every rank must hold bitwise the same parameters.
 *
 * Each rank hashes every parameter tensor; rank 0's hashes are broadcast; each rank compares
 * and the verdicts are summed over the ranks, so every rank learns which ranks differ and the
 * first tensor where they do, and all stop with the same error.
 */
#ifndef DDP_WORKER_SYNC_REPLICAS_H
#define DDP_WORKER_SYNC_REPLICAS_H

#include "worker/model/model.h"
#include "worker/sync/world.h"

/* Collective (a world of several ranks). Returns 0 when all replicas agree, DDP_EMISMATCH with ei
 * naming the ranks and the first differing tensor when not, or a communication error.
 * flip_rank: a test hook (DDP_TEST_REPLICA_FLIP_RANK): that rank hashes its parameters with one
 * bit flipped; -1 none. */
int ddp_replicas_check(const ddp_world_t *world, const ddp_model_t *model, int flip_rank,
                       ddp_errinfo_t *ei);

/* CRC32C over the bytes of one tensor (host memory), widened: a drifted replica matches by
 * chance with probability 2^-32 per tensor. */
uint64_t ddp_tensor_hash(const float *x, size_t n);

#endif
