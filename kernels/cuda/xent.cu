/* Fused softmax + cross-entropy over the rows of logits[N,V], ld elements apart
 * (kernels/math/softmax.h).
 *
 * losses[n] = log(sum_j exp(x_j - max)) - (x_target - max)
 * dlogits[n,j] = (p_j - [j == target]) * dloss, when dlogits != NULL.
 * One 512-thread block per row, two passes over it: the first finds the row's max and its sum
 * of exponentials at once (online: each thread's sum is rescaled when its max grows, then the
 * threads' (max, sum) pairs are combined in a fixed order), the second writes the gradient. The
 * LM head's bf16 logits are 100 KB a row; the old three passes of 2-byte loads moved them at a
 * fifth of an H100's bandwidth (2026-11-27). Rows whose pointers and ld allow it are read and
 * written 16 bytes at a time (VEC elements), the last V % VEC elements one by one.
 * dlogits may alias logits: a thread overwrites only the elements it has just read, the second
 * pass starts after the block's reductions (barriers), and the target logit is read first.
 * logits and dlogits are of the activation type T (ctx->prec; the kernel is a template on it),
 * widened to fp32 on load, dlogits rounded once on store; losses fp32.
 * Limits: N < 2^31 rows (one block each), targets in [0, V).
 */
#include "kernels/cuda/kcuda.cuh"
#include "kernels/math/softmax.h"

#define XENT_BLOCK 512

/* Folds the values v[0..n) into the running (max m, sum s of exp(x - m)). Values of -inf (an
 * fp16 logit beyond 65504) add exp(-inf) = 0; folded while m is still -inf they would add
 * exp(-inf - -inf) = NaN, so a group of them is skipped. */
template <int N>
static __device__ __forceinline__ void online_add(float &m, float &s, const float (&v)[N])
{
    float vm = v[0];
#pragma unroll
    for (int k = 1; k < N; k++) vm = fmaxf(vm, v[k]);
    if (vm == -INFINITY) return;
    if (vm > m) {
        s *= ddp_softmax_exp(m, vm);
        m = vm;
    }
#pragma unroll
    for (int k = 0; k < N; k++) s += ddp_softmax_exp(v[k], m);
}

template <typename T, int VEC>
static __global__ void __launch_bounds__(XENT_BLOCK)
    xent_kernel(float *losses, T *dlogits, const T *logits, const int32_t *targets, int V, int ld,
                float dloss)
{
    __shared__ float sh[32];
    int row = blockIdx.x, nvec = V / VEC;
    const T *x = logits + (size_t)row * ld;
    int target = targets[row];
    float x_t = ddp__act<T>::ld(x[target]); /* before any thread may overwrite the row */
    float m = -INFINITY, s = 0.0f;
#pragma unroll 2
    for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
        float v[VEC];
        ddp__ldv<VEC>(v, x + (size_t)i * VEC);
        online_add(m, s, v);
    }
    for (int j = nvec * VEC + threadIdx.x; j < V; j += blockDim.x) {
        float v[1] = {ddp__act<T>::ld(x[j])};
        online_add(m, s, v);
    }
    float mx = ddp__block_max(m, sh);
    s = ddp__block_sum(s * ddp_softmax_exp(m, mx), sh); /* a thread with no element adds 0 */
    if (threadIdx.x == 0) losses[row] = ddp_xent_loss(x_t, mx, s);
    if (!dlogits) return;
    float inv = 1.0f / s;
    T *d = dlogits + (size_t)row * ld;
#pragma unroll 2
    for (int i = threadIdx.x; i < nvec; i += blockDim.x) {
        float v[VEC];
        ddp__ldv<VEC>(v, x + (size_t)i * VEC);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            v[k] = ddp_xent_grad(ddp_softmax_exp(v[k], mx) * inv, i * VEC + k == target, dloss);
        ddp__stv<VEC>(d + (size_t)i * VEC, v);
    }
    for (int j = nvec * VEC + threadIdx.x; j < V; j += blockDim.x)
        d[j] = ddp__act<T>::st(
            ddp_xent_grad(ddp_softmax_exp(ddp__act<T>::ld(x[j]), mx) * inv, j == target, dloss));
}

void ddp__cuda_xent_fwd_bwd(ddp_kctx_t *ctx, float *losses, ddp_act_t *dlogits,
                            const ddp_act_t *logits, const int32_t *targets, int N, int V, int ld,
                            float dloss)
{
    if (N <= 0 || V <= 0 || ddp__cuda_enter(ctx)) return;
    DDP_ACT_DISPATCH(ctx->prec, T, {
        constexpr int VEC = 16 / sizeof(T);
        int wide = ddp__aligned(logits, 16) && (!dlogits || ddp__aligned(dlogits, 16)) &&
                   (size_t)ld * sizeof(T) % 16 == 0;
        if (wide)
            xent_kernel<T, VEC><<<(unsigned)N, XENT_BLOCK, 0, ctx->stream>>>(
                losses, (T *)dlogits, (const T *)logits, targets, V, ld, dloss);
        else
            xent_kernel<T, 1><<<(unsigned)N, XENT_BLOCK, 0, ctx->stream>>>(
                losses, (T *)dlogits, (const T *)logits, targets, V, ld, dloss);
    });
    ddp__cuda_launched(ctx, "xent_fwd_bwd");
}
