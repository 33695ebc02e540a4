/* LayerNorm over the last dimension, forward and backward (math in kernels/math/layernorm.h).
 *
 * forward   out[N,C] = (inp - mean) * rstd * weight + bias; mean[N], rstd[N] saved.
 *           inp fp32 (the residual stream); out of the activation type (rounded once).
 *           One warp per row (8 rows per 256-thread block), two passes over the row: the mean,
 *           then the sum of squared deviations, each reduced in a fixed order.
 * backward  dinp[N,C] += rstd (dnorm - mean(dnorm) - xhat mean(dnorm xhat)), dnorm = dout w:
 *           dout of the activation type, dinp fp32 (the residual stream's gradient); one warp
 *           per row. dweight[C] += sum_n dout xhat, dbias[C] += sum_n dout in the same pass:
 *           each warp adds its rows' terms to its own [2][C] sums in shared memory, the block
 *           adds its warps' in order into a partial [2][C] of the chunk of rows it owns, and
 *           kcuda.cuh's colsum stage 2 adds the chunks in order (scratch: <= 256 * 2 * C
 *           floats). So dout and inp are read once (twice for the row's two sums, the second
 *           from cache) where a separate column sum read them again: 14 of 20 bytes an element.
 *           Rows 16-byte aligned with C % 4 == 0 go 4 elements a load.
 * residual_norm_fwd (LayerNorm; its RMSNorm half is rmsnorm.cu's):
 *           res[N,C] = a + b (fp32; res may alias a; b of the activation type), then out, mean
 *           and rstd as forward's from res, eps as given: one warp per row in forward's lanes
 *           and order, so the results are bitwise residual_fwd's followed by forward's. One
 *           pass reads a and b and writes res; a lane keeps its first RES_REG elements of the
 *           row in registers for the statistics and out (C <= 32 RES_REG: all of it) and reads
 *           the rest back from res, which it wrote itself (L2-hot).
 * The kernels are templates on the activation type T (ctx->prec).
 * Limits: N < 2^31 rows, any C >= 1 (backward: C <= 20,480, its sums' shared memory).
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

#define LNB_SMEM_MAX (160 * 1024) /* backward: a block's [warps][2][C] sums at most */
#define LNB_ROWS_PER_WARP 4         /* backward: a block's rows per warp, at least */
#define LNB_CHUNKS 256              /* backward: row chunks (blocks) at most */

/* Warps of a backward block: 8, or fewer where their sums would pass LNB_SMEM_MAX; 0 when one
 * warp's do not fit. */
static int lnb_warps(int C)
{
    for (int w = 8; w >= 1; w >>= 1)
        if ((size_t)w * 2 * C * sizeof(float) <= LNB_SMEM_MAX) return w;
    return 0;
}

/* Block b owns rows [b rows, (b+1) rows), a warp every warps-th of them; dinp (if not NULL)
 * gets each row's gradient, partial (if not NULL) [b][2][C] the block's dweight and dbias
 * sums. VEC elements a load (rows and pointers aligned to VEC elements, C % VEC == 0). */
template <typename T, int VEC>
static __global__ void layernorm_bwd_kernel(float *dinp, float *partial, const T *dout,
                                            const float *inp, const float *weight,
                                            const float *mean, const float *rstd, int N, int C,
                                            int rows)
{
    extern __shared__ float sums[]; /* [warps][2][C]: each warp's dweight and dbias terms */
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    float *dw = sums + (size_t)warp * 2 * C, *db = dw + C;
    const float zero[VEC] = {};
    if (partial)
        for (int c = lane * VEC; c < C; c += 32 * VEC) {
            ddp__stv<VEC>(dw + c, zero);
            ddp__stv<VEC>(db + c, zero);
        }
    int n1 = min(N, (int)blockIdx.x * rows + rows);
    for (int row = (int)blockIdx.x * rows + warp; row < n1; row += warps) {
        const float *x = inp + (size_t)row * C;
        const T *dy = dout + (size_t)row * C;
        float m = mean[row], r = rstd[row];
        float sd = 0.0f, sdx = 0.0f;
        for (int c = lane * VEC; c < C; c += 32 * VEC) {
            float y[VEC], xv[VEC], w[VEC];
            ddp__ldv<VEC>(y, dy + c);
            ddp__ldv<VEC>(xv, x + c);
            ddp__ldv<VEC>(w, weight + c);
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                float dnorm = y[k] * w[k];
                sd += dnorm;
                sdx += dnorm * (xv[k] - m) * r;
            }
        }
        float mean_d = ddp__warp_sum(sd) / (float)C;
        float mean_dx = ddp__warp_sum(sdx) / (float)C;
        float *dx = dinp ? dinp + (size_t)row * C : NULL;
        for (int c = lane * VEC; c < C; c += 32 * VEC) {
            float y[VEC], xv[VEC], w[VEC], xhat[VEC];
            ddp__ldv<VEC>(y, dy + c);
            ddp__ldv<VEC>(xv, x + c);
            ddp__ldv<VEC>(w, weight + c);
#pragma unroll
            for (int k = 0; k < VEC; k++) xhat[k] = (xv[k] - m) * r;
            if (dx) {
                float d[VEC];
                ddp__ldv<VEC>(d, dx + c);
#pragma unroll
                for (int k = 0; k < VEC; k++)
                    d[k] += ddp_layernorm_dx(y[k] * w[k], xhat[k], mean_d, mean_dx, r);
                ddp__stv<VEC>(dx + c, d);
            }
            if (partial) {
                float a[VEC], b[VEC];
                ddp__ldv<VEC>(a, dw + c);
                ddp__ldv<VEC>(b, db + c);
#pragma unroll
                for (int k = 0; k < VEC; k++) {
                    a[k] += y[k] * xhat[k];
                    b[k] += y[k];
                }
                ddp__stv<VEC>(dw + c, a);
                ddp__stv<VEC>(db + c, b);
            }
        }
    }
    if (!partial) return;
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float sw = 0.0f, sb = 0.0f;
        for (int w = 0; w < warps; w++) {
            sw += sums[(size_t)w * 2 * C + c];
            sb += sums[(size_t)w * 2 * C + C + c];
        }
        partial[(size_t)blockIdx.x * 2 * C + c] = sw;
        partial[(size_t)blockIdx.x * 2 * C + C + c] = sb;
    }
}

template <typename T>
static void layernorm_bwd(ddp_kctx_t *ctx, float *dinp, float *dweight, float *dbias,
                          const T *dout, const float *inp, const float *weight,
                          const float *mean, const float *rstd, int N, int C)
{
    int warps = lnb_warps(C);
    if (!warps) {
        DDP_ERROR("cuda: layernorm_bwd: C = %d is over the backward's limit of %zu", C,
                  LNB_SMEM_MAX / (2 * sizeof(float)));
        if (!ctx->err) ctx->err = DDP_EINVAL;
        return;
    }
    /* the chunking depends on N and C only: the same sums in the same order on every run */
    int rows = warps * LNB_ROWS_PER_WARP, floor = (N + LNB_CHUNKS - 1) / LNB_CHUNKS;
    if (rows < floor) rows = floor;
    int chunks = (N + rows - 1) / rows;
    float *partial = NULL;
    if ((dweight || dbias) &&
        ddp__cuda_scratch(ctx, (size_t)chunks * 2 * C * sizeof(float), (void **)&partial))
        return;
    size_t smem = partial ? (size_t)warps * 2 * C * sizeof(float) : 0;
    int wide = C % 4 == 0 && ddp__aligned(dout, 4 * sizeof(T)) && ddp__aligned(inp, 16) &&
               ddp__aligned(weight, 16) && (!dinp || ddp__aligned(dinp, 16));
    auto kernel = wide ? layernorm_bwd_kernel<T, 4> : layernorm_bwd_kernel<T, 1>;
    if (smem > 48 * 1024 &&
        ddp__cuda_check(ctx,
                        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem),
                        "layernorm_bwd"))
        return;
    kernel<<<(unsigned)chunks, 32 * warps, smem, ctx->stream>>>(dinp, partial, dout, inp, weight,
                                                                 mean, rstd, N, C, rows);
    if (ddp__cuda_launched(ctx, "layernorm_bwd") || !partial) return;
    ddp__colsum_stage2<2><<<(unsigned)((C + 255) / 256), 256, 0, ctx->stream>>>(
        dweight, dbias, partial, chunks, C);
    ddp__cuda_launched(ctx, "layernorm_bwd(dweight)");
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
