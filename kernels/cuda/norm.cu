/* The two norms over the last dimension, LayerNorm (GPT-2) and RMSNorm (Llama), forward (alone
 * or fused with the residual add before it) and backward (math in kernels/math/layernorm.h and
 * rmsnorm.h, shared with the CPU).
 *
 * forward   LayerNorm: out[N,C] = (inp - mean) rstd weight + bias, mean[N] and rstd[N] saved
 *           (either may be NULL: not wanted), eps 1e-5; RMSNorm: out = inp rstd weight, rstd[N]
 *           saved, eps as given. inp fp32 (the residual stream); out of the activation type,
 *           rounded once. residual_norm_fwd: res[N,C] = a + b first (fp32; res may alias a; b of
 *           the activation type), then the norm of res (mean NULL selects RMSNorm).
 *           One kernel for all of them: a warp a row, 8 rows a 256-thread block; a lane keeps its
 *           first 32 elements of the row in registers (C <= 1024: all of it) and reads the rest
 *           again (from res, which it wrote itself: L2-hot); LayerNorm reduces the sum, then the
 *           sum of squared deviations, RMSNorm the sum of squares, each in a fixed order (a
 *           lane's elements in order, then the warp's xor butterfly). The plain forward is the
 *           same code with no b, so residual_norm_fwd is bitwise residual_fwd followed by the
 *           forward on every shape, as kernels.h promises.
 * backward  LayerNorm: dinp[N,C] += rstd (dnorm - mean(dnorm) - xhat mean(dnorm xhat)), xhat =
 *           (x - mean) rstd; dweight[C] += sum_n dout xhat, dbias[C] += sum_n dout.
 *           RMSNorm (mean NULL): dinp += rstd (dnorm - xhat mean(dnorm xhat)), xhat = x rstd;
 *           dweight += sum_n dout xhat (no bias). dnorm = dout w; dout of the activation type,
 *           inp and dinp fp32 (the residual stream and its gradient); dinp, dweight and dbias
 *           may each be NULL (not wanted); dinp_act (NULL: not wanted) gets the new dinp
 *           rounded to the activation type as the row is stored (to_act's rounding, without
 *           another pass over the fp32 gradient).
 *           A warp a row (its two row sums, then its gradient), and the column sums in the same
 *           pass: each warp adds its rows' dout xhat and dout to sums of its own in shared
 *           memory ([2][C]), a block adds its warps' sums in order into a partial of the chunk of
 *           rows it owns, and kcuda.cuh's colsum stage 2 adds the chunks in order into dweight
 *           and dbias (scratch: at most NB_CHUNKS * 2 * C floats). So dout and inp come from
 *           memory once (the second read of a row, for its gradient, from cache), where a
 *           separate column sum read them again: on an H100 LayerNorm's backward took 1.8 ms of
 *           a 41.5 ms GPT-2 124M step at 1.2 TB/s that way (2026-11-27). The chunking depends
 *           on N and C only, so every sum has the same order on every run.
 * The kernels are templates on the activation type T (ctx->prec), the norm, and V, the elements
 * a lane moves at a time: 4 (16-byte fp32 accesses) when C % 4 == 0 and every row pointer is
 * aligned to it, else 1; the order of every sum depends only on C and V. residual_norm_fwd
 * takes the forward's V (from res, weight, bias, out) and loads a and b 4 at a time only when
 * they are aligned too (VL), so that its order is the forward's whatever their alignment.
 * Limits: N < 2^31 rows, any C >= 1; backward C <= the device's opt-in shared memory / 8 bytes
 * (a warp's sums in shared memory: 29,056 on sm_90, 20,864 on sm_80, 12,672 on sm_86/89; a
 * larger C is refused with DDP_EINVAL).
 */
#include "kernels/cuda/kcuda.cuh"
#include "kernels/math/layernorm.h"
#include "kernels/math/rmsnorm.h"

#define ROWS_PER_BLOCK 8

/* ---- Forward ---- */

/* x[0..V) = p[0..V) widened: one access with VL (p aligned to V elements), else V. */
template <int V, bool VL, typename E>
static __device__ __forceinline__ void ld_elems(float (&x)[V], const E *p)
{
    if (VL) {
        ddp__ldv<V>(x, p);
    } else {
#pragma unroll
        for (int k = 0; k < V; k++) x[k] = ddp__act<E>::ld(p[k]);
    }
}

/* y[0..V) = the norm of x[0..V) (weights w, LayerNorm's bias b, mean m, rstd r), rounded. */
template <typename T, int V, bool LN>
static __device__ __forceinline__ void store_y(T *y, const float (&x)[V], const float *w,
                                               const float *b, float m, float r)
{
    float wv[V], o[V];
    ddp__ldv<V>(wv, w);
    if (LN) {
        float bv[V];
        ddp__ldv<V>(bv, b);
#pragma unroll
        for (int j = 0; j < V; j++) o[j] = ddp_layernorm_y(x[j], m, r, wv[j], bv[j]);
    } else {
#pragma unroll
        for (int j = 0; j < V; j++) o[j] = ddp_rmsnorm_y(x[j], r, wv[j]);
    }
    ddp__stv<V>(y, o);
}

/* Row x of C elements: x = a + b (stored to res) when b is not NULL, else x = a (res unused);
 * then the norm (LN: LayerNorm with bias and mean, else RMSNorm) into out, and the row's mean
 * (LN, where not NULL) and rstd (where not NULL). A lane keeps its first KR accesses of V
 * elements in registers. */
template <typename T, int V, bool VL, bool LN>
static __global__ void norm_fwd_kernel(float *res, T *out, float *mean, float *rstd,
                                       const float *a, const T *b, const float *weight,
                                       const float *bias, int N, int C, float eps)
{
    constexpr int KR = 32 / V;
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= N) return;
    size_t off = (size_t)row * C;
    const float *xa = a + off;
    const T *xb = b ? b + off : NULL;
    /* where the row is read back from: res (written here) or the input itself; res may be xa:
     * each element is read before it is written */
    const float *x = b ? res + off : xa;
    float xr[KR][V];
    float s = 0.0f; /* LN: the sum, RMSNorm: the sum of squares */
#pragma unroll
    for (int k = 0; k < KR; k++) {
        int c = (lane + 32 * k) * V;
        if (c < C) {
            ld_elems<V, VL>(xr[k], xa + c);
            if (xb) {
                float bv[V];
                ld_elems<V, VL>(bv, xb + c);
#pragma unroll
                for (int j = 0; j < V; j++) xr[k][j] += bv[j];
                ddp__stv<V>(res + off + c, xr[k]);
            }
#pragma unroll
            for (int j = 0; j < V; j++) s += LN ? xr[k][j] : xr[k][j] * xr[k][j];
        }
    }
    for (int c = (lane + 32 * KR) * V; c < C; c += 32 * V) {
        float xv[V];
        ld_elems<V, VL>(xv, xa + c);
        if (xb) {
            float bv[V];
            ld_elems<V, VL>(bv, xb + c);
#pragma unroll
            for (int j = 0; j < V; j++) xv[j] += bv[j];
            ddp__stv<V>(res + off + c, xv);
        }
#pragma unroll
        for (int j = 0; j < V; j++) s += LN ? xv[j] : xv[j] * xv[j];
    }
    float m = 0.0f, r;
    if (LN) {
        m = ddp__warp_sum(s) / (float)C;
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < KR; k++)
            if ((lane + 32 * k) * V < C)
#pragma unroll
                for (int j = 0; j < V; j++) ss += (xr[k][j] - m) * (xr[k][j] - m);
        for (int c = (lane + 32 * KR) * V; c < C; c += 32 * V) {
            float xv[V];
            ddp__ldv<V>(xv, x + c);
#pragma unroll
            for (int j = 0; j < V; j++) ss += (xv[j] - m) * (xv[j] - m);
        }
        r = ddp_layernorm_rstd_eps(ddp__warp_sum(ss), C, eps);
    } else {
        r = ddp_rmsnorm_rstd(ddp__warp_sum(s), C, eps);
    }
    T *y = out + off;
#pragma unroll
    for (int k = 0; k < KR; k++) {
        int c = (lane + 32 * k) * V;
        if (c < C) store_y<T, V, LN>(y + c, xr[k], weight + c, LN ? bias + c : NULL, m, r);
    }
    for (int c = (lane + 32 * KR) * V; c < C; c += 32 * V) {
        float xv[V];
        ddp__ldv<V>(xv, x + c);
        store_y<T, V, LN>(y + c, xv, weight + c, LN ? bias + c : NULL, m, r);
    }
    if (lane == 0) {
        if (LN && mean) mean[row] = m;
        if (rstd) rstd[row] = r;
    }
}

/* 1 when rows of C elements starting at each of the fp32 pointers f (NULL ones ignored) and at
 * the activation pointer act allow 4-element accesses. */
static int vec4(int C, const float *const f[4], const void *act, size_t act_bytes)
{
    if (C % 4) return 0;
    for (int i = 0; i < 4; i++)
        if (f[i] && !ddp__aligned(f[i], 16)) return 0;
    return ddp__aligned(act, 4 * act_bytes);
}

/* Queues norm_fwd_kernel: V from the forward's own pointers (the row read back, weight, bias,
 * out), VL from a and b (residual_norm_fwd) where they differ from them. */
template <typename T, bool LN>
static void norm_fwd(ddp_kctx_t *ctx, float *res, T *out, float *mean, float *rstd,
                     const float *a, const T *b, const float *weight, const float *bias, int N,
                     int C, float eps, const char *what)
{
    unsigned grid = (unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
    const float *f[4] = {b ? res : a, weight, LN ? bias : NULL, NULL};
    const float *fab[4] = {a, NULL, NULL, NULL};
    int v = vec4(C, f, out, sizeof(T)), vl = v && (!b || vec4(C, fab, b, sizeof(T)));
    if (!v)
        norm_fwd_kernel<T, 1, false, LN><<<grid, 32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(
            res, out, mean, rstd, a, b, weight, bias, N, C, eps);
    else if (vl)
        norm_fwd_kernel<T, 4, true, LN><<<grid, 32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(
            res, out, mean, rstd, a, b, weight, bias, N, C, eps);
    else
        norm_fwd_kernel<T, 4, false, LN><<<grid, 32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(
            res, out, mean, rstd, a, b, weight, bias, N, C, eps);
    ddp__cuda_launched(ctx, what);
}

void ddp__cuda_layernorm_fwd(ddp_kctx_t *ctx, ddp_act_t *out, float *mean, float *rstd,
                             const float *inp, const float *weight, const float *bias, int N,
                             int C)
{
    if (N <= 0 || C <= 0 || ddp__cuda_enter(ctx)) return;
    DDP_ACT_DISPATCH(ctx->prec, T,
                     norm_fwd<T, true>(ctx, NULL, (T *)out, mean, rstd, inp, (const T *)NULL,
                                       weight, bias, N, C, DDP_LAYERNORM_EPS, "layernorm_fwd"));
}

void ddp__cuda_rmsnorm_fwd(ddp_kctx_t *ctx, ddp_act_t *out, float *rstd, const float *inp,
                           const float *weight, int N, int C, float eps)
{
    if (N <= 0 || C <= 0 || ddp__cuda_enter(ctx)) return;
    DDP_ACT_DISPATCH(ctx->prec, T,
                     norm_fwd<T, false>(ctx, NULL, (T *)out, NULL, rstd, inp, (const T *)NULL,
                                        weight, NULL, N, C, eps, "rmsnorm_fwd"));
}

void ddp__cuda_residual_norm_fwd(ddp_kctx_t *ctx, float *res, ddp_act_t *out, float *mean,
                                 float *rstd, const float *a, const ddp_act_t *b,
                                 const float *weight, const float *bias, int N, int C, float eps)
{
    if (N <= 0 || C <= 0 || ddp__cuda_enter(ctx)) return;
    if (mean)
        DDP_ACT_DISPATCH(ctx->prec, T,
                         norm_fwd<T, true>(ctx, res, (T *)out, mean, rstd, a, (const T *)b,
                                           weight, bias, N, C, eps, "residual_norm_fwd"));
    else
        DDP_ACT_DISPATCH(ctx->prec, T,
                         norm_fwd<T, false>(ctx, res, (T *)out, NULL, rstd, a, (const T *)b,
                                            weight, NULL, N, C, eps, "residual_norm_fwd"));
}

/* ---- Backward ---- */

#define NB_ROWS_PER_WARP 4 /* a block's rows per warp, at least */
#define NB_CHUNKS 256      /* row chunks (blocks) at most */

/* Warps of a block: 8, or fewer where their [warps][2][C] sums would pass the shared memory a
 * block may opt into on this device (227 KB on sm_90, 163 on sm_80, 99 on sm_86/89); 0 when one
 * warp's do not fit. */
static int nb_warps(int C, size_t smem_max)
{
    for (int w = 8; w >= 1; w >>= 1)
        if ((size_t)w * 2 * C * sizeof(float) <= smem_max) return w;
    return 0;
}

/* Block b owns rows [b rows, (b+1) rows), a warp every warps-th of them; dinp (if not NULL)
 * gets each row's gradient (and dinp_act, if not NULL, the new dinp rounded to T), partial
 * (if not NULL) [b][2][C] the block's sums of dout xhat and dout. LN: LayerNorm (mean[N]),
 * else RMSNorm. VEC elements a load (C % VEC == 0, every row aligned to VEC elements). */
template <typename T, int VEC, bool LN>
static __global__ void norm_bwd_kernel(float *dinp, T *dinp_act, float *partial, const T *dout,
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
        T *dxa = dinp_act ? dinp_act + (size_t)row * C : NULL;
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
                if (dxa) ddp__stv<VEC>(dxa + c, d); /* to_act's rounding */
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
static void norm_bwd(ddp_kctx_t *ctx, float *dinp, T *dinp_act, float *dweight, float *dbias,
                     const T *dout, const float *inp, const float *weight, const float *mean,
                     const float *rstd, int N, int C, const char *what)
{
    int warps = nb_warps(C, ctx->smem_optin);
    if (!warps) {
        DDP_ERROR("cuda: %s: C = %d is over the backward's limit of %zu", what, C,
                  ctx->smem_optin / (2 * sizeof(float)));
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
    /* dinp_act does not choose the width (the width orders the row sums, so it would change
     * dinp's bits): one that the wide stores cannot take is rounded by to_act afterwards */
    T *dxa = wide && !ddp__aligned(dinp_act, 4 * sizeof(T)) ? NULL : dinp_act;
    auto kernel = wide ? norm_bwd_kernel<T, 4, LN> : norm_bwd_kernel<T, 1, LN>;
    if (smem > 48 * 1024 &&
        ddp__cuda_check(ctx,
                        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem),
                        what))
        return;
    kernel<<<(unsigned)chunks, 32 * warps, smem, ctx->stream>>>(dinp, dxa, partial, dout, inp,
                                                                 weight, mean, rstd, N, C, rows);
    if (ddp__cuda_launched(ctx, what)) return;
    if (dinp_act && !dxa) ddp__cuda_to_act(ctx, (ddp_act_t *)dinp_act, dinp, (size_t)N * C);
    if (!partial) return;
    ddp__colsum_stage2<2><<<(unsigned)((C + 255) / 256), 256, 0, ctx->stream>>>(
        dweight, dbias, partial, chunks, C);
    ddp__cuda_launched(ctx, what);
}

void ddp__cuda_layernorm_bwd(ddp_kctx_t *ctx, float *dinp, ddp_act_t *dinp_act, float *dweight,
                             float *dbias, const ddp_act_t *dout, const float *inp,
                             const float *weight, const float *mean, const float *rstd, int N,
                             int C)
{
    if (N <= 0 || C <= 0 || ddp__cuda_enter(ctx)) return;
    DDP_ACT_DISPATCH(ctx->prec, T,
                     norm_bwd<T, true>(ctx, dinp, (T *)dinp_act, dweight, dbias, (const T *)dout,
                                       inp, weight, mean, rstd, N, C, "layernorm_bwd"));
}

void ddp__cuda_rmsnorm_bwd(ddp_kctx_t *ctx, float *dinp, ddp_act_t *dinp_act, float *dweight,
                           const ddp_act_t *dout, const float *inp, const float *weight,
                           const float *rstd, int N, int C)
{
    if (N <= 0 || C <= 0 || ddp__cuda_enter(ctx)) return;
    DDP_ACT_DISPATCH(ctx->prec, T,
                     norm_bwd<T, false>(ctx, dinp, (T *)dinp_act, dweight, NULL, (const T *)dout,
                                        inp, weight, NULL, rstd, N, C, "rmsnorm_bwd"));
}
