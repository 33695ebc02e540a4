/* Fused softmax + cross-entropy over the rows of logits[N,V], ld elements apart
 * (kernels/math/softmax.h).
 *
 * losses[n] = log(sum_j exp(x_j - max)) - (x_target - max)
 * dlogits[n,j] = (p_j - [j == target]) * dloss, when dlogits != NULL.
 * One 512-thread block per row, three passes over the row (max, sum of exps, gradient), each
 * reduced in a fixed order. dlogits may alias logits: a thread overwrites only the elements it
 * has just read, and the target logit is read before the first barrier.
 * logits and dlogits are of the activation type T (ctx->prec; the kernel is a template on it),
 * widened to fp32 on load, dlogits rounded once on store; losses fp32.
 * Limits: N < 2^31 rows (one block each), targets in [0, V).
 */
#include "kernels/cuda/kcuda.cuh"
#include "kernels/math/softmax.h"

#define XENT_BLOCK 512

template <typename T>
static __global__ void xent_kernel(float *losses, T *dlogits, const T *logits,
                                   const int32_t *targets, int V, int ld, float dloss)
{
    __shared__ float sh[32];
    int row = blockIdx.x;
    const T *x = logits + (size_t)row * ld;
    int target = targets[row];
    float x_t = ddp__act<T>::ld(x[target]); /* before any thread may overwrite the row */
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, ddp__act<T>::ld(x[j]));
    mx = ddp__block_max(mx, sh);
    float s = 0.0f;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        s += ddp_softmax_exp(ddp__act<T>::ld(x[j]), mx);
    s = ddp__block_sum(s, sh);
    if (threadIdx.x == 0) losses[row] = ddp_xent_loss(x_t, mx, s);
    if (!dlogits) return;
    float inv = 1.0f / s;
    T *d = dlogits + (size_t)row * ld;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        d[j] = ddp__act<T>::st(
            ddp_xent_grad(ddp_softmax_exp(ddp__act<T>::ld(x[j]), mx) * inv, j == target, dloss));
}

void ddp__cuda_xent_fwd_bwd(ddp_kctx_t *ctx, float *losses, ddp_act_t *dlogits,
                            const ddp_act_t *logits, const int32_t *targets, int N, int V, int ld,
                            float dloss)
{
    if (N <= 0 || V <= 0 || ddp__cuda_enter(ctx)) return;
    DDP_ACT_DISPATCH(ctx->prec, T,
                     xent_kernel<T><<<(unsigned)N, XENT_BLOCK, 0, ctx->stream>>>(
                         losses, (T *)dlogits, (const T *)logits, targets, V, ld, dloss));
    ddp__cuda_launched(ctx, "xent_fwd_bwd");
}
