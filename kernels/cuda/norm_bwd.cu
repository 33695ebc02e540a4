/* The backward of both norms, LayerNorm (GPT-2) and RMSNorm (Llama), in one pass over the rows
 * (math in kernels/math/layernorm.h and rmsnorm.h; the forwards are layernorm.cu's and
 * rmsnorm.cu's).
 *
 *   LayerNorm: dinp[N,C] += rstd (dnorm - mean(dnorm) - xhat mean(dnorm xhat)), xhat = (x -
 *              mean) rstd; dweight[C] += sum_n dout xhat, dbias[C] += sum_n dout
 *   RMSNorm (mean NULL): dinp += rstd (dnorm - xhat mean(dnorm xhat)), xhat = x rstd;
 *              dweight += sum_n dout xhat (no bias)
 * with dnorm = dout w; dout of the activation type, inp and dinp fp32 (the residual stream and
 * its gradient). dinp, dweight and dbias may each be NULL (not wanted).
 *
 * One warp per row (its two row sums, then its gradient), and the column sums in the same
 * pass: each warp adds its rows' dout xhat and dout to sums of its own in shared memory
 * ([2][C]), a block adds its warps' sums in order into a partial of the chunk of rows it owns,
 * and kcuda.cuh's colsum stage 2 adds the chunks in order into dweight and dbias (scratch:
 * at most LNB_CHUNKS * 2 * C floats). So dout and inp come from memory once (the second read
 * of a row, for its gradient, from cache), where a separate column sum read them again: on an
 * H100 LayerNorm's backward took 1.8 ms of a 41.5 ms GPT-2 124M step at 1.2 TB/s that way
 * (2026-11-27). The chunking depends on N and C only, so every sum has the same order on every
 * run. Rows go 4 elements a load where C % 4 == 0 and every pointer allows it, else 1.
 * Limits: N < 2^31 rows, C <= 20,480 (a block's sums in shared memory; a larger C is refused
 * with DDP_EINVAL).
 */
#include "kernels/cuda/kcuda.cuh"
#include "kernels/math/layernorm.h"
#include "kernels/math/rmsnorm.h"

#define NB_SMEM_MAX (160 * 1024) /* a block's [warps][2][C] sums at most */
#define NB_ROWS_PER_WARP 4         /* a block's rows per warp, at least */
#define NB_CHUNKS 256              /* row chunks (blocks) at most */

/* Warps of a block: 8, or fewer where their sums would pass NB_SMEM_MAX; 0 when one warp's do
 * not fit. */
static int nb_warps(int C)
{
    for (int w = 8; w >= 1; w >>= 1)
        if ((size_t)w * 2 * C * sizeof(float) <= NB_SMEM_MAX) return w;
    return 0;
}

/* Block b owns rows [b rows, (b+1) rows), a warp every warps-th of them; dinp (if not NULL)
 * gets each row's gradient, partial (if not NULL) [b][2][C] the block's sums of dout xhat and
 * dout. LN: LayerNorm (mean[N]), else RMSNorm. VEC elements a load (C % VEC == 0, every row
 * aligned to VEC elements). */
template <typename T, int VEC, bool LN>
static __global__ void norm_bwd_kernel(float *dinp, float *partial, const T *dout,
                                       const float *inp, const float *weight, const float *mean,
                                       const float *rstd, int N, int C, int rows)
{
    extern __shared__ float sums[]; /* [warps][2][C]: each warp's sums */
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    float *sw = sums + (size_t)warp * 2 * C, *sb = sw + C;
    const float zero[VEC] = {};
    if (partial)
        for (int c = lane * VEC; c < C; c += 32 * VEC) {
            ddp__stv<VEC>(sw + c, zero);
            ddp__stv<VEC>(sb + c, zero);
        }
    int n1 = min(N, (int)blockIdx.x * rows + rows);
    for (int row = (int)blockIdx.x * rows + warp; row < n1; row += warps) {
        const float *x = inp + (size_t)row * C;
        const T *dy = dout + (size_t)row * C;
        float m = LN ? mean[row] : 0.0f, r = rstd[row];
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
                sdx += dnorm * ((xv[k] - m) * r);
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
                    d[k] += LN ? ddp_layernorm_dx(y[k] * w[k], xhat[k], mean_d, mean_dx, r)
                               : ddp_rmsnorm_dx(y[k] * w[k], xhat[k], mean_dx, r);
                ddp__stv<VEC>(dx + c, d);
            }
            if (partial) {
                float a[VEC], b[VEC];
                ddp__ldv<VEC>(a, sw + c);
                ddp__ldv<VEC>(b, sb + c);
#pragma unroll
                for (int k = 0; k < VEC; k++) {
                    a[k] += y[k] * xhat[k];
                    b[k] += y[k];
                }
                ddp__stv<VEC>(sw + c, a);
                ddp__stv<VEC>(sb + c, b);
            }
        }
    }
    if (!partial) return;
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float a = 0.0f, b = 0.0f;
        for (int w = 0; w < warps; w++) {
            a += sums[(size_t)w * 2 * C + c];
            b += sums[(size_t)w * 2 * C + C + c];
        }
        partial[(size_t)blockIdx.x * 2 * C + c] = a;
        partial[(size_t)blockIdx.x * 2 * C + C + c] = b;
    }
}

template <typename T, bool LN>
static void norm_bwd(ddp_kctx_t *ctx, float *dinp, float *dweight, float *dbias, const T *dout,
                     const float *inp, const float *weight, const float *mean, const float *rstd,
                     int N, int C, const char *what)
{
    int warps = nb_warps(C);
    if (!warps) {
        DDP_ERROR("cuda: %s: C = %d is over the backward's limit of %zu", what, C,
                  NB_SMEM_MAX / (2 * sizeof(float)));
        if (!ctx->err) ctx->err = DDP_EINVAL;
        return;
    }
    int rows = warps * NB_ROWS_PER_WARP, least = (N + NB_CHUNKS - 1) / NB_CHUNKS;
    if (rows < least) rows = least;
    int chunks = (N + rows - 1) / rows;
    float *partial = NULL;
    if ((dweight || dbias) &&
        ddp__cuda_scratch(ctx, (size_t)chunks * 2 * C * sizeof(float), (void **)&partial))
        return;
    size_t smem = partial ? (size_t)warps * 2 * C * sizeof(float) : 0;
    int wide = C % 4 == 0 && ddp__aligned(dout, 4 * sizeof(T)) && ddp__aligned(inp, 16) &&
               ddp__aligned(weight, 16) && (!dinp || ddp__aligned(dinp, 16));
    auto kernel = wide ? norm_bwd_kernel<T, 4, LN> : norm_bwd_kernel<T, 1, LN>;
    if (smem > 48 * 1024 &&
        ddp__cuda_check(ctx,
                        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem),
                        what))
        return;
    kernel<<<(unsigned)chunks, 32 * warps, smem, ctx->stream>>>(dinp, partial, dout, inp, weight,
                                                                 mean, rstd, N, C, rows);
    if (ddp__cuda_launched(ctx, what) || !partial) return;
    ddp__colsum_stage2<2><<<(unsigned)((C + 255) / 256), 256, 0, ctx->stream>>>(
        dweight, dbias, partial, chunks, C);
    ddp__cuda_launched(ctx, what);
}

void ddp__cuda_layernorm_bwd(ddp_kctx_t *ctx, float *dinp, float *dweight, float *dbias,
                             const ddp_act_t *dout, const float *inp, const float *weight,
                             const float *mean, const float *rstd, int N, int C)
{
    if (N <= 0 || C <= 0 || ddp__cuda_enter(ctx)) return;
    DDP_ACT_DISPATCH(ctx->prec, T,
                     norm_bwd<T, true>(ctx, dinp, dweight, dbias, (const T *)dout, inp, weight,
                                       mean, rstd, N, C, "layernorm_bwd"));
}

void ddp__cuda_rmsnorm_bwd(ddp_kctx_t *ctx, float *dinp, float *dweight, const ddp_act_t *dout,
                           const float *inp, const float *weight, const float *rstd, int N, int C)
{
    if (N <= 0 || C <= 0 || ddp__cuda_enter(ctx)) return;
    DDP_ACT_DISPATCH(ctx->prec, T,
                     norm_bwd<T, false>(ctx, dinp, dweight, NULL, (const T *)dout, inp, weight,
                                        NULL, rstd, N, C, "rmsnorm_bwd"));
}
