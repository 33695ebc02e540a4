/* LayerNorm over the last dimension, forward and backward (math in kernels/math/layernorm.h).
 *
 * forward   out[N,C] = (inp - mean) * rstd * weight + bias; mean[N], rstd[N] saved.
 *           inp fp32 (the residual stream); out of the activation type (rounded once).
 *           One warp per row (8 rows per 256-thread block), two passes over the row: the mean,
 *           then the sum of squared deviations, each reduced in a fixed order.
 * backward  dinp[N,C] += rstd (dnorm - mean(dnorm) - xhat mean(dnorm xhat)), dnorm = dout w:
 *           dout of the activation type, dinp fp32 (the residual stream's gradient); one warp
 *           per row. dweight[C] += sum_n dout xhat, dbias[C] += sum_n dout: the
 *           deterministic two-stage column sum of kcuda.cuh (scratch: <= 64 * 2 * C floats).
 * The kernels are templates on the activation type T (ctx->prec).
 * Limits: N < 2^31 rows, any C >= 1.
 */
#include "kernels/cuda/kcuda.cuh"
#include "kernels/math/layernorm.h"

#define ROWS_PER_BLOCK 8

template <typename T>
static __global__ void layernorm_fwd_kernel(T *out, float *mean, float *rstd, const float *inp,
                                            const float *weight, const float *bias, int N, int C)
{
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C;
    float s = 0.0f;
    for (int c = lane; c < C; c += 32) s += x[c];
    float m = ddp__warp_sum(s) / (float)C;
    float ss = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float d = x[c] - m;
        ss += d * d;
    }
    float r = ddp_layernorm_rstd(ddp__warp_sum(ss), C);
    T *y = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32)
        y[c] = ddp__act<T>::st((x[c] - m) * r * weight[c] + bias[c]);
    if (lane == 0) {
        if (mean) mean[row] = m;
        if (rstd) rstd[row] = r;
    }
}

void ddp__cuda_layernorm_fwd(ddp_kctx_t *ctx, ddp_act_t *out, float *mean, float *rstd,
                             const float *inp, const float *weight, const float *bias, int N,
                             int C)
{
    if (N <= 0 || C <= 0 || ddp__cuda_enter(ctx)) return;
    unsigned grid = (unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
    DDP_ACT_DISPATCH(ctx->prec, T,
                     layernorm_fwd_kernel<T><<<grid, 32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(
                         (T *)out, mean, rstd, inp, weight, bias, N, C));
    ddp__cuda_launched(ctx, "layernorm_fwd");
}

template <typename T>
static __global__ void layernorm_dinp_kernel(float *dinp, const T *dout, const float *inp,
                                             const float *weight, const float *mean,
                                             const float *rstd, int N, int C)
{
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C;
    const T *dy = dout + (size_t)row * C;
    float m = mean[row], r = rstd[row];
    float sd = 0.0f, sdx = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float dnorm = ddp__act<T>::ld(dy[c]) * weight[c];
        sd += dnorm;
        sdx += dnorm * (x[c] - m) * r;
    }
    float mean_d = ddp__warp_sum(sd) / (float)C;
    float mean_dx = ddp__warp_sum(sdx) / (float)C;
    float *dx = dinp + (size_t)row * C;
    for (int c = lane; c < C; c += 32)
        dx[c] += ddp_layernorm_dx(ddp__act<T>::ld(dy[c]) * weight[c], (x[c] - m) * r, mean_d,
                                  mean_dx, r);
}

/* v[0] = dout * xhat (for dweight), v[1] = dout (for dbias). */
template <typename T> struct layernorm_dwb {
    const T *dout;
    const float *inp, *mean, *rstd;
    int C;
    __device__ void operator()(int n, int c, float v[2]) const
    {
        size_t i = (size_t)n * C + c;
        float dy = ddp__act<T>::ld(dout[i]);
        v[0] = dy * (inp[i] - mean[n]) * rstd[n];
        v[1] = dy;
    }
};

template <typename T>
static void layernorm_bwd(ddp_kctx_t *ctx, float *dinp, float *dweight, float *dbias,
                          const T *dout, const float *inp, const float *weight,
                          const float *mean, const float *rstd, int N, int C)
{
    if (dinp) {
        unsigned grid = (unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
        layernorm_dinp_kernel<T><<<grid, 32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(
            dinp, dout, inp, weight, mean, rstd, N, C);
        if (ddp__cuda_launched(ctx, "layernorm_bwd(dinp)")) return;
    }
    if (dweight || dbias) {
        layernorm_dwb<T> f = {dout, inp, mean, rstd, C};
        ddp__colsum<2>(ctx, dweight, dbias, N, C, f, "layernorm_bwd(dweight)");
    }
}

void ddp__cuda_layernorm_bwd(ddp_kctx_t *ctx, float *dinp, float *dweight, float *dbias,
                             const ddp_act_t *dout, const float *inp, const float *weight,
                             const float *mean, const float *rstd, int N, int C)
{
    if (N <= 0 || C <= 0 || ddp__cuda_enter(ctx)) return;
    DDP_ACT_DISPATCH(ctx->prec, T,
                     layernorm_bwd<T>(ctx, dinp, dweight, dbias, (const T *)dout, inp, weight,
                                      mean, rstd, N, C));
}
