/* The gradient buckets' communication type (ddp.grad_dtype): fp32, or bf16 for half the bytes.
 *
 * In bf16 each bucket is narrowed IN PLACE before its all-reduce (or ZeRO-1's reduce-scatter):
 * its len fp32 values become len bf16 values (round to nearest even, the bits of
 * kernels/math/lowp.h's ddp_bf16_bits) in the first half of the bucket's own memory, which the
 * collective then reduces as DDP_DT_BF16, and widened back in place (exactly) when it completed.
 * No staging memory: the buffer the collective reads is the gradient arena's own (collective
 * memory shared by the ranks of one host, at the same offset on every rank, as the one-pass
 * all-reduce and a reduce-scatter there require). The second half of a narrowed bucket holds
 * stale fp32 bytes until the widening overwrites it; nothing reads a bucket in between.
 *
 * Rounding: a value is rounded once on the way in; the ring (and the one-pass shared-memory
 * all-reduce) add in bf16 and round each partial sum, so with W ranks a sum sees W roundings of
 * its inputs and W-1 of its partial sums, in an order fixed by the ring (two runs are bitwise
 * equal; a reduce-scatter is bitwise the all-reduce there). Signed zeros and NaN survive:
 * bf16(-0.0) = -0.0 and x + -0.0 = x, so a contribution of -0.0 leaves a sum's bits as they are.
 *
 * Device memory (a GPU, the simulated one): the bucket is copied to a host scratch buffer,
 * converted there and copied back (memcpy_d2h waits for the compute stream; memcpy_h2d is
 * queued behind it and reads its source at the call), so one scratch of the largest bucket
 * serves every bucket. Correct, not fast: a device kernel would do it in the stream.
 *
 * Compute thread only.
 */
#ifndef DDP_WORKER_SYNC_GRAD_DTYPE_H
#define DDP_WORKER_SYNC_GRAD_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

/* Host memory: the n floats at p become n bf16 values at p's start (each rounded once). */
void ddp_grad_narrow_host(float *p, size_t n);
/* Host memory: the n bf16 values at p's start become n floats at p (exact). */
void ddp_grad_widen_host(float *p, size_t n);

/* The same on the kernels' memory (host, or device through scratch, a host buffer of n floats
 * at least; NULL on host memory). Returns 0 or the kernels' error. */
int ddp_grad_narrow(ddp_kernels_t *k, float *p, size_t n, float *scratch);
int ddp_grad_widen(ddp_kernels_t *k, float *p, size_t n, float *scratch);

#endif
