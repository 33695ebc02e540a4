/* LayerNorm over the last dimension, forward and backward (math in kernels/math/layernorm.h).
 *
 * forward   out[N,C] = (inp - mean) * rstd * weight + bias; mean[N], rstd[N] saved.
 *           inp fp32 (the residual stream); out of the activation type (rounded once).
 *           One warp per row (8 rows per 256-thread block), two passes over the row: the mean,
 *           then the sum of squared deviations, each reduced in a fixed order.
 * backward  dinp[N,C] += rstd (dnorm - mean(dnorm) - xhat mean(dnorm xhat)), dnorm = dout w;
 *           dweight[C] += sum_n dout xhat, dbias[C] += sum_n dout: norm_bwd.cu, in one pass.
 * residual_norm_fwd (LayerNorm; its RMSNorm half is rmsnorm.cu's):
 *           res[N,C] = a + b (fp32; res may alias a; b of the activation type), then out, mean
 *           and rstd as forward's from res, eps as given: one warp per row in forward's lanes
 *           and order, so the results are bitwise residual_fwd's followed by forward's. One
 *           pass reads a and b and writes res; a lane keeps its first RES_REG elements of the
 *           row in registers for the statistics and out (C <= 32 RES_REG: all of it) and reads
 *           the rest back from res, which it wrote itself (L2-hot).
 * The kernels are templates on the activation type T (ctx->prec).
 * Limits: N < 2^31 rows, any C >= 1 (backward: norm_bwd.cu's).
 */
#include "kernels/cuda/kcuda.cuh"
#include "kernels/math/layernorm.h"

#define ROWS_PER_BLOCK 8
#define RES_REG 32 /* residual_norm_fwd: row elements a lane keeps in registers */

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
        y[c] = ddp__act<T>::st(ddp_layernorm_y(x[c], m, r, weight[c], bias[c]));
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

/* layernorm_fwd_kernel's lanes, sums and per-element math on the row res = a + b. */
template <typename T>
static __global__ void residual_layernorm_kernel(float *res, T *out, float *mean, float *rstd,
                                                 const float *a, const T *b,
                                                 const float *weight, const float *bias, int N,
                                                 int C, float eps)
{
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= N) return;
    size_t off = (size_t)row * C;
    const float *xa = a + off;
    const T *xb = b + off;
    float *x = res + off; /* may be xa: each element is read before it is written */
    float xr[RES_REG];
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < RES_REG; k++) {
        int c = lane + 32 * k;
        if (c < C) {
            xr[k] = xa[c] + ddp__act<T>::ld(xb[c]);
            x[c] = xr[k];
            s += xr[k];
        }
    }
    for (int c = lane + 32 * RES_REG; c < C; c += 32) {
        float v = xa[c] + ddp__act<T>::ld(xb[c]);
        x[c] = v;
        s += v;
    }
    float m = ddp__warp_sum(s) / (float)C;
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < RES_REG; k++) {
        if (lane + 32 * k < C) {
            float d = xr[k] - m;
            ss += d * d;
        }
    }
    for (int c = lane + 32 * RES_REG; c < C; c += 32) {
        float d = x[c] - m;
        ss += d * d;
    }
    float r = ddp_layernorm_rstd_eps(ddp__warp_sum(ss), C, eps);
    T *y = out + off;
#pragma unroll
    for (int k = 0; k < RES_REG; k++) {
        int c = lane + 32 * k;
        if (c < C) y[c] = ddp__act<T>::st(ddp_layernorm_y(xr[k], m, r, weight[c], bias[c]));
    }
    for (int c = lane + 32 * RES_REG; c < C; c += 32)
        y[c] = ddp__act<T>::st(ddp_layernorm_y(x[c], m, r, weight[c], bias[c]));
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = r;
    }
}

void ddp__cuda_residual_norm_fwd(ddp_kctx_t *ctx, float *res, ddp_act_t *out, float *mean,
                                 float *rstd, const float *a, const ddp_act_t *b,
                                 const float *weight, const float *bias, int N, int C, float eps)
{
    if (!mean) {
        ddp__cuda_residual_rmsnorm_fwd(ctx, res, out, rstd, a, b, weight, N, C, eps);
        return;
    }
    if (N <= 0 || C <= 0 || ddp__cuda_enter(ctx)) return;
    unsigned grid = (unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
    DDP_ACT_DISPATCH(ctx->prec, T,
                     residual_layernorm_kernel<T><<<grid, 32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(
                         res, (T *)out, mean, rstd, a, (const T *)b, weight, bias, N, C, eps));
    ddp__cuda_launched(ctx, "residual_norm_fwd");
}
