/* Causal multi-head self-attention, forward and backward, straight on the qkv layout.
 *
 * qkv[B,T,3C]: q, k, v of head h at offsets h*hs, C + h*hs, 2C + h*hs of each position
 * (hs = C/NH), so each head's Q, K, V is a [T, hs] matrix with row stride 3C and every product
 * is a batched cuBLAS gemm over the B*NH heads (pointer arrays built on the device, no
 * permuted copies). scale = 1/sqrt(hs).
 *
 * forward   att[b,h] = softmax_causal(scale Q K^T)   gemm into att, then one warp per row
 *                                                    (max, sum of exps, p; zero above t)
 *           out[b,t,h*hs:] = att[b,h] @ V            gemm, written with row stride C
 * backward  dV   += att^T @ dout
 *           datt  = dout @ V^T                       (datt is scratch)
 *           dpre  = scale * att (datt - rowsum(att datt))   one warp per row, in place in datt
 *           dQ   += dpre @ K,   dK += dpre^T @ Q
 * Scratch: 9 * B*NH pointers. Limits: B*NH*T < 2^31 rows; T*T per head must fit in memory
 * (att is [B,NH,T,T] by the interface).
 */
#include "kernels/cuda/kcuda.cuh"
#include "kernels/math/softmax.h"

#define ROWS_PER_BLOCK 8

/* ptr[a * BH + j] for a = 0.. : Q, K, V, then `extra` arrays: base_e + j * stride_e, or, for
 * the [B,T,C]-shaped ones (stride_e == 0), base_e + b*T*C + h*hs. */
struct ptr_args {
    const float *qkv; /* Q, K, V come from here; dQ, dK, dV from dqkv when non-NULL */
    float *dqkv;
    float *bt[2];     /* [B,T,C] tensors (out / dout), NULL when absent */
    float *bhtt[2];   /* [B,NH,T,T] tensors (att, datt), NULL when absent */
};

static __global__ void fill_ptrs_kernel(float **ptr, ptr_args a, int B, int T, int C, int NH)
{
    int BH = B * NH;
    int hs = C / NH;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < BH; j += gridDim.x * blockDim.x) {
        int b = j / NH, h = j % NH;
        size_t qoff = (size_t)b * T * 3 * C + (size_t)h * hs;
        size_t ooff = (size_t)b * T * C + (size_t)h * hs;
        size_t aoff = (size_t)j * T * T;
        int k = 0;
        for (int w = 0; w < 3; w++) ptr[(k++) * BH + j] = (float *)a.qkv + qoff + (size_t)w * C;
        if (a.dqkv)
            for (int w = 0; w < 3; w++) ptr[(k++) * BH + j] = a.dqkv + qoff + (size_t)w * C;
        for (int w = 0; w < 2; w++)
            if (a.bt[w]) ptr[(k++) * BH + j] = a.bt[w] + ooff;
        for (int w = 0; w < 2; w++)
            if (a.bhtt[w]) ptr[(k++) * BH + j] = a.bhtt[w] + aoff;
    }
}

/* Builds the pointer arrays in scratch; *ptrs receives them (array a at ptrs + a*B*NH). */
static int fill_ptrs(ddp_kctx_t *ctx, float ***ptrs, int narrays, const ptr_args *a, int B, int T,
                     int C, int NH)
{
    size_t BH = (size_t)B * NH;
    void *p;
    DDP_CHECK(ddp__cuda_scratch(ctx, (size_t)narrays * BH * sizeof(float *), &p));
    fill_ptrs_kernel<<<ddp__grid(BH, DDP_CUDA_BLOCK), DDP_CUDA_BLOCK, 0, ctx->stream>>>(
        (float **)p, *a, B, T, C, NH);
    DDP_CHECK(ddp__cuda_launched(ctx, "attention(pointers)"));
    *ptrs = (float **)p;
    return 0;
}

/* Row r of [B*NH*T, T] holds scale*q.k; becomes the causal softmax (zeros above t). */
static __global__ void softmax_fwd_kernel(float *att, int rows, int T)
{
    int r = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    int t = r % T;
    float *x = att + (size_t)r * T;
    float mx = -INFINITY;
    for (int t2 = lane; t2 <= t; t2 += 32) mx = fmaxf(mx, x[t2]);
    mx = ddp__warp_max(mx);
    float s = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += 32) s += ddp_softmax_exp(x[t2], mx);
    float inv = 1.0f / ddp__warp_sum(s);
    for (int t2 = lane; t2 < T; t2 += 32) x[t2] = t2 <= t ? ddp_softmax_exp(x[t2], mx) * inv : 0.0f;
}

/* datt (row r) becomes scale * dpre; zeros above t. */
static __global__ void softmax_bwd_kernel(float *datt, const float *att, int rows, int T,
                                          float scale)
{
    int r = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    int t = r % T;
    float *dp = datt + (size_t)r * T;
    const float *p = att + (size_t)r * T;
    float dot = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += 32) dot += p[t2] * dp[t2];
    dot = ddp__warp_sum(dot);
    for (int t2 = lane; t2 < T; t2 += 32)
        dp[t2] = t2 <= t ? scale * ddp_softmax_bwd(p[t2], dp[t2], dot) : 0.0f;
}

static int gemm_batched(ddp_kctx_t *ctx, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                        int k, float alpha, float **A, int lda, float **Bm, int ldb, float beta,
                        float **Cm, int ldc, int batch, const char *what)
{
    return ddp__cublas_check(ctx,
                             cublasSgemmBatched(ctx->blas, ta, tb, m, n, k, &alpha, A, lda, Bm,
                                                ldb, &beta, Cm, ldc, batch),
                             what);
}

void ddp__cuda_attention_fwd(ddp_kctx_t *ctx, float *out, float *att, const float *qkv, int B,
                             int T, int C, int NH)
{
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0 || ddp__cuda_enter(ctx)) return;
    int BH = B * NH, hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    ptr_args a = {qkv, NULL, {out, NULL}, {att, NULL}};
    float **p;
    if (fill_ptrs(ctx, &p, 5, &a, B, T, C, NH)) return;
    float **Q = p, **K = p + BH, **V = p + 2 * BH, **O = p + 3 * BH, **A = p + 4 * BH;
    /* att^T (col-major) = K Q^T, i.e. att[t][t2] = scale q_t . k_t2 */
    if (gemm_batched(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, scale, K, C3, Q, C3, 0.0f, A, T, BH,
                     "attention_fwd(qk)"))
        return;
    int rows = BH * T;
    softmax_fwd_kernel<<<(unsigned)((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK),
                         32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(att, rows, T);
    if (ddp__cuda_launched(ctx, "attention_fwd(softmax)")) return;
    /* out^T = V^T att^T */
    gemm_batched(ctx, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, V, C3, A, T, 0.0f, O, C, BH,
                 "attention_fwd(av)");
}

void ddp__cuda_attention_bwd(ddp_kctx_t *ctx, float *dqkv, float *datt, const float *dout,
                             const float *qkv, const float *att, int B, int T, int C, int NH)
{
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0 || ddp__cuda_enter(ctx)) return;
    int BH = B * NH, hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    ptr_args a = {qkv, dqkv, {(float *)dout, NULL}, {(float *)att, datt}};
    float **p;
    if (fill_ptrs(ctx, &p, 9, &a, B, T, C, NH)) return;
    float **Q = p, **K = p + BH, **V = p + 2 * BH;
    float **dQ = p + 3 * BH, **dK = p + 4 * BH, **dV = p + 5 * BH;
    float **dO = p + 6 * BH, **A = p + 7 * BH, **dA = p + 8 * BH;
    /* dV^T += dout^T att */
    if (gemm_batched(ctx, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, dO, C, A, T, 1.0f, dV, C3, BH,
                     "attention_bwd(dv)"))
        return;
    /* datt^T = V dout^T */
    if (gemm_batched(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, 1.0f, V, C3, dO, C, 0.0f, dA, T, BH,
                     "attention_bwd(datt)"))
        return;
    int rows = BH * T;
    softmax_bwd_kernel<<<(unsigned)((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK),
                         32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(datt, att, rows, T, scale);
    if (ddp__cuda_launched(ctx, "attention_bwd(softmax)")) return;
    /* dQ^T += K^T dpre^T */
    if (gemm_batched(ctx, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, K, C3, dA, T, 1.0f, dQ, C3, BH,
                     "attention_bwd(dq)"))
        return;
    /* dK^T += Q^T dpre */
    gemm_batched(ctx, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, Q, C3, dA, T, 1.0f, dK, C3, BH,
                 "attention_bwd(dk)");
}
