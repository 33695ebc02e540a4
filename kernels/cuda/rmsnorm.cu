/* RMSNorm (Llama) over the last dimension, forward and backward (math in
 * kernels/math/rmsnorm.h; the structure is layernorm.cu's).
 *
 * forward   out[N,C] = inp * rstd * weight; rstd[N] saved, rstd = 1 / sqrt(mean(inp^2) + eps).
 *           inp fp32 (the residual stream); out of the activation type (rounded once).
 *           One warp per row (8 rows per 256-thread block); the sum of squares reduced in a
 *           fixed order (each lane's elements in order, then the warp's xor butterfly).
 * backward  dinp[N,C] += rstd (dnorm - xhat mean(dnorm xhat)), dnorm = dout w; dweight[C] +=
 *           sum_n dout xhat: norm_bwd.cu, in one pass (LayerNorm's backward too).
 * residual_norm_fwd's RMSNorm (mean NULL; the entry is layernorm.cu's):
 *           res[N,C] = a + b (fp32; res may alias a; b of the activation type), then out and
 *           rstd as forward's from res: forward's lanes, V and order, so the results are bitwise
 *           residual_fwd's followed by forward's. One pass reads a and b and writes res; a lane
 *           keeps its first 32 elements of the row in registers for rstd and out (C <= 1024:
 *           all of it) and reads the rest back from res, which it wrote itself (L2-hot).
 * The kernels are templates on the activation type T (ctx->prec) and on V, the elements a lane
 * moves at a time: 4 (16-byte fp32 accesses) when C % 4 == 0 and every row pointer is aligned
 * to it, else 1. Either way the order of every sum depends only on C and V. residual_norm_fwd
 * takes forward's V (from res, weight, out) and loads a and b 4 at a time only when they are
 * aligned too (VL), so that its order is forward's whatever their alignment.
 * Limits: N < 2^31 rows, any C >= 1.
 */
#include "kernels/cuda/kcuda.cuh"
#include "kernels/math/rmsnorm.h"

#define ROWS_PER_BLOCK 8

template <typename T, int V>
static __global__ void rmsnorm_fwd_kernel(T *out, float *rstd, const float *inp,
                                          const float *weight, int N, int C, float eps)
{
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C;
    float ss = 0.0f;
    for (int c = lane * V; c < C; c += 32 * V) {
        float xv[V];
        ddp__ldv<V>(xv, x + c);
#pragma unroll
        for (int k = 0; k < V; k++) ss += xv[k] * xv[k];
    }
    float r = ddp_rmsnorm_rstd(ddp__warp_sum(ss), C, eps);
    T *y = out + (size_t)row * C;
    for (int c = lane * V; c < C; c += 32 * V) {
        float xv[V], wv[V];
        ddp__ldv<V>(xv, x + c);
        ddp__ldv<V>(wv, weight + c);
#pragma unroll
        for (int k = 0; k < V; k++) xv[k] = ddp_rmsnorm_y(xv[k], r, wv[k]);
        ddp__stv<V>(y + c, xv);
    }
    if (lane == 0) rstd[row] = r;
}

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

/* rmsnorm_fwd_kernel's lanes, sums and per-element math on the row res = a + b; a lane keeps
 * its first KR accesses of V elements in registers. */
template <typename T, int V, bool VL>
static __global__ void residual_rmsnorm_kernel(float *res, T *out, float *rstd, const float *a,
                                               const T *b, const float *weight, int N, int C,
                                               float eps)
{
    constexpr int KR = 32 / V;
    int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (row >= N) return;
    size_t off = (size_t)row * C;
    const float *xa = a + off;
    const T *xb = b + off;
    float *x = res + off; /* may be xa: each element is read before it is written */
    float xr[KR][V];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < KR; k++) {
        int c = (lane + 32 * k) * V;
        if (c < C) {
            float bv[V];
            ld_elems<V, VL>(xr[k], xa + c);
            ld_elems<V, VL>(bv, xb + c);
#pragma unroll
            for (int j = 0; j < V; j++) {
                xr[k][j] += bv[j];
                ss += xr[k][j] * xr[k][j];
            }
            ddp__stv<V>(x + c, xr[k]);
        }
    }
    for (int c = (lane + 32 * KR) * V; c < C; c += 32 * V) {
        float xv[V], bv[V];
        ld_elems<V, VL>(xv, xa + c);
        ld_elems<V, VL>(bv, xb + c);
#pragma unroll
        for (int j = 0; j < V; j++) {
            xv[j] += bv[j];
            ss += xv[j] * xv[j];
        }
        ddp__stv<V>(x + c, xv);
    }
    float r = ddp_rmsnorm_rstd(ddp__warp_sum(ss), C, eps);
    T *y = out + off;
#pragma unroll
    for (int k = 0; k < KR; k++) {
        int c = (lane + 32 * k) * V;
        if (c < C) {
            float wv[V], o[V];
            ddp__ldv<V>(wv, weight + c);
#pragma unroll
            for (int j = 0; j < V; j++) o[j] = ddp_rmsnorm_y(xr[k][j], r, wv[j]);
            ddp__stv<V>(y + c, o);
        }
    }
    for (int c = (lane + 32 * KR) * V; c < C; c += 32 * V) {
        float xv[V], wv[V];
        ddp__ldv<V>(xv, x + c);
        ddp__ldv<V>(wv, weight + c);
#pragma unroll
        for (int j = 0; j < V; j++) xv[j] = ddp_rmsnorm_y(xv[j], r, wv[j]);
        ddp__stv<V>(y + c, xv);
    }
    if (lane == 0) rstd[row] = r;
}

/* 4 when rows of C elements starting at each pointer allow 4-element accesses: C % 4 == 0 and
 * every pointer aligned to 4 elements of its type (`act` bytes for the activation). */
static int vec4(int C, const float *const f[3], const void *a, size_t act)
{
    if (C % 4) return 0;
    for (int i = 0; i < 3; i++)
        if (f[i] && !ddp__aligned(f[i], 16)) return 0;
    return ddp__aligned(a, 4 * act);
}

void ddp__cuda_rmsnorm_fwd(ddp_kctx_t *ctx, ddp_act_t *out, float *rstd, const float *inp,
                           const float *weight, int N, int C, float eps)
{
    if (N <= 0 || C <= 0 || ddp__cuda_enter(ctx)) return;
    unsigned grid = (unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
    DDP_ACT_DISPATCH(ctx->prec, T, {
        const float *f[3] = {inp, weight, NULL};
        if (vec4(C, f, out, sizeof(T)))
            rmsnorm_fwd_kernel<T, 4><<<grid, 32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(
                (T *)out, rstd, inp, weight, N, C, eps);
        else
            rmsnorm_fwd_kernel<T, 1><<<grid, 32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(
                (T *)out, rstd, inp, weight, N, C, eps);
    });
    ddp__cuda_launched(ctx, "rmsnorm_fwd");
}

template <typename T>
static void residual_rmsnorm(ddp_kctx_t *ctx, float *res, T *out, float *rstd, const float *a,
                             const T *b, const float *weight, int N, int C, float eps)
{
    unsigned grid = (unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
    const float *f[3] = {res, weight, NULL}, *fab[3] = {a, NULL, NULL};
    if (!vec4(C, f, out, sizeof(T))) /* forward's V from its own pointers (inp = res) */
        residual_rmsnorm_kernel<T, 1, false><<<grid, 32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(
            res, out, rstd, a, b, weight, N, C, eps);
    else if (vec4(C, fab, b, sizeof(T)))
        residual_rmsnorm_kernel<T, 4, true><<<grid, 32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(
            res, out, rstd, a, b, weight, N, C, eps);
    else
        residual_rmsnorm_kernel<T, 4, false><<<grid, 32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(
            res, out, rstd, a, b, weight, N, C, eps);
    ddp__cuda_launched(ctx, "residual_norm_fwd");
}

void ddp__cuda_residual_rmsnorm_fwd(ddp_kctx_t *ctx, float *res, ddp_act_t *out, float *rstd,
                                    const float *a, const ddp_act_t *b, const float *weight,
                                    int N, int C, float eps)
{
    if (N <= 0 || C <= 0 || ddp__cuda_enter(ctx)) return;
    DDP_ACT_DISPATCH(ctx->prec, T,
                     residual_rmsnorm<T>(ctx, res, (T *)out, rstd, a, (const T *)b, weight, N, C,
                                         eps));
}
