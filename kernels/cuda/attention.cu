/* Causal multi-head self-attention with grouped-query heads, forward and backward, straight on
 * the qkv layout.
 *
 * Two paths behind one op:
 * - bf16/fp16 runs at the head sizes flash_attention.cu takes (ddp__cuda_flash_supported:
 *   hs = 32, 64 or 128, compute capability >= 8.0): its tensor-core kernels on the 16-bit
 *   tensors as they are; no [T,T] tensor at all.
 * - everything else, the general path: this file's batched cuBLAS products over one op's
 *   [B,NH,T,T] scores in the context's scratch (one layer's at a time, never kept across ops),
 *   fp32 throughout. In a 16-bit run it works on fp32 copies of its inputs, widened exactly
 *   into stream-ordered allocations, and rounds its outputs once (slower, any head size).
 * Both save only out and lse[B,NH,T] (the row's natural-log log-sum-exp of its scaled scores);
 * backward recomputes the probabilities P = exp(scores - lse).
 *
 * qkv[B,T,QKV], QKV = C + 2 NKV hs (hs = C/NH): query head h at offset h*hs of each position,
 * K/V head kvh at C + kvh*hs and C + NKV*hs + kvh*hs; query head h reads K/V head h / G, G =
 * NH/NKV (Hugging Face's repeat_kv, without the copy). So each query head's Q and its K, V are
 * [T, hs] matrices with row stride QKV and every product is a batched cuBLAS gemm over the B*NH
 * query heads (pointer arrays built on the device, no permuted copies: heads of a group point
 * at the same K, V). scale = 1/sqrt(hs).
 *
 * forward   S  = scale Q K^T                  gemm into scratch
 *           P  = softmax_causal(S), lse       one warp per row (zero above t)
 *           out[b,t,h*hs:] = P @ V            gemm, written with row stride C
 * backward  P  = exp(scale Q K^T - lse)       gemm, then one warp per row
 *           dV = P^T @ dout
 *           dP = dout @ V^T
 *           dS = scale * P (dP - D), D = dout . out     one warp per row, in place in dP
 *           dQ = dS @ K,   dK = dS^T @ Q      (dqkv overwritten: beta 0)
 *           With G > 1 each query head's dK and dV go to scratch [2][B,NH,T,hs] instead, and
 *           one kernel sums each group's G heads in ascending order into dqkv (no atomics).
 * Scratch: B*NH*T*T floats forward, twice that backward (plus 2*B*NH*T*hs when G > 1), plus
 * 9 * B*NH pointers.
 * Limits: B*NH*T < 2^31 rows.
 */
#include "kernels/cuda/kcuda.cuh"
#include "kernels/math/softmax.h"

#define ROWS_PER_BLOCK 8

/* ptr[a * BH + j] for a = 0.. and query head j = b*NH + h: Q, K, V, then dQ, dK, dV, then the
 * [B,T,C]-shaped tensors (base + b*T*C + h*hs), then the [B,NH,T,T] ones (base + j*T*T). */
struct ptr_args {
    const float *qkv; /* Q, K, V come from here; dQ, dK, dV from dqkv when non-NULL */
    float *dqkv;
    float *dkv_sep;   /* G > 1: dK, dV of each query head, [2][B,NH,T,hs] in scratch */
    float *bt[2];     /* [B,T,C] tensors (out / dout), NULL when absent */
    float *bhtt[2];   /* [B,NH,T,T] tensors (P, dP in scratch), NULL when absent */
};

static __global__ void fill_ptrs_kernel(float **ptr, ptr_args a, int B, int T, int C, int NH,
                                        int NKV)
{
    int BH = B * NH;
    int hs = C / NH, G = NH / NKV;
    size_t QKV = (size_t)C + 2 * (size_t)NKV * hs;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < BH; j += gridDim.x * blockDim.x) {
        int b = j / NH, h = j % NH;
        /* offsets of query head h and of its K and V heads in a [B,T,QKV] tensor */
        size_t off[3] = {(size_t)b * T * QKV + (size_t)h * hs,
                         (size_t)b * T * QKV + C + (size_t)(h / G) * hs,
                         (size_t)b * T * QKV + C + (size_t)(NKV + h / G) * hs};
        size_t ooff = (size_t)b * T * C + (size_t)h * hs;
        size_t aoff = (size_t)j * T * T;
        int k = 0;
        for (int w = 0; w < 3; w++) ptr[(k++) * BH + j] = (float *)a.qkv + off[w];
        if (a.dqkv) {
            ptr[(k++) * BH + j] = a.dqkv + off[0];
            for (int w = 1; w < 3; w++)
                ptr[(k++) * BH + j] = a.dkv_sep ? a.dkv_sep + ((size_t)(w - 1) * BH + j) * T * hs
                                                : a.dqkv + off[w];
        }
        for (int w = 0; w < 2; w++)
            if (a.bt[w]) ptr[(k++) * BH + j] = a.bt[w] + ooff;
        for (int w = 0; w < 2; w++)
            if (a.bhtt[w]) ptr[(k++) * BH + j] = a.bhtt[w] + aoff;
    }
}

/* Carves ctx's scratch into `nsq` [B,NH,T,T] float tensors, (backward with G > 1) the
 * [2][B,NH,T,hs] of each query head's dK and dV, and `narrays` pointer arrays (array a at
 * (*ptrs) + a*B*NH); fills a->bhtt and a->dkv_sep, and builds the arrays. */
static int attention_scratch(ddp_kctx_t *ctx, float ***ptrs, int narrays, int nsq, ptr_args *a,
                             int B, int T, int C, int NH, int NKV)
{
    /* each piece 256-byte aligned: the pointer arrays need 8 (an odd B*NH*T*T would leave them
     * misaligned: an illegal address on the GPU), the tensors 16 for cuBLAS's fast kernels */
#define SCRATCH_PIECE(bytes) (((bytes) + 255) & ~(size_t)255)
    size_t BH = (size_t)B * NH, sq = SCRATCH_PIECE(BH * T * T * sizeof(float));
    size_t sep = a->dqkv && NKV != NH
                     ? SCRATCH_PIECE(2 * BH * T * (size_t)(C / NH) * sizeof(float))
                     : 0;
#undef SCRATCH_PIECE
    char *p;
    DDP_CHECK(ddp__cuda_scratch(ctx, nsq * sq + sep + (size_t)narrays * BH * sizeof(float *),
                                (void **)&p));
    for (int i = 0; i < nsq; i++) a->bhtt[i] = (float *)(p + i * sq);
    a->dkv_sep = sep ? (float *)(p + nsq * sq) : NULL;
    float **arrays = (float **)(p + nsq * sq + sep);
    fill_ptrs_kernel<<<ddp__grid(BH, DDP_CUDA_BLOCK), DDP_CUDA_BLOCK, 0, ctx->stream>>>(
        arrays, *a, B, T, C, NH, NKV);
    DDP_CHECK(ddp__cuda_launched(ctx, "attention(pointers)"));
    *ptrs = arrays;
    return 0;
}

/* Row r of [B*NH*T, T] holds scale*q.k; becomes the causal softmax (zeros above t), and
 * lse[r] its log-sum-exp. */
static __global__ void softmax_fwd_kernel(float *att, float *lse, int rows, int T)
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
    s = ddp__warp_sum(s);
    float inv = 1.0f / s;
    for (int t2 = lane; t2 < T; t2 += 32) x[t2] = t2 <= t ? ddp_softmax_exp(x[t2], mx) * inv : 0.0f;
    if (lane == 0) lse[r] = mx + logf(s);
}

/* Row r of [B*NH*T, T] holds scale*q.k; becomes P = exp(x - lse[r]) (zeros above t). */
static __global__ void softmax_again_kernel(float *att, const float *lse, int rows, int T)
{
    int r = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    int t = r % T;
    float *x = att + (size_t)r * T;
    float l = lse[r];
    for (int t2 = lane; t2 < T; t2 += 32) x[t2] = t2 <= t ? ddp_softmax_exp(x[t2], l) : 0.0f;
}

/* dP (row r = (b, h, t)) becomes dS = scale * P (dP - D), D = dout[b,t,h] . out[b,t,h]; zeros
 * above t. */
static __global__ void softmax_bwd_kernel(float *dp, const float *p, const float *dout,
                                          const float *out, int rows, int T, int C, int NH,
                                          float scale)
{
    int r = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    int t = r % T, bh = r / T, b = bh / NH, h = bh % NH, hs = C / NH;
    size_t o = ((size_t)b * T + t) * C + (size_t)h * hs;
    float d = 0.0f;
    for (int i = lane; i < hs; i += 32) d += dout[o + i] * out[o + i];
    d = ddp__warp_sum(d);
    float *dpr = dp + (size_t)r * T;
    const float *pr = p + (size_t)r * T;
    for (int t2 = lane; t2 < T; t2 += 32)
        dpr[t2] = t2 <= t ? scale * ddp_softmax_bwd(pr[t2], dpr[t2], d) : 0.0f;
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

static unsigned row_blocks(int rows) { return (unsigned)((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK); }

/* 1 when the op goes to the flash kernels: a 16-bit run at a shape they take, on tensors (the
 * four of a, NULL ones ignored) whose rows they can read 16 bytes at a time. */
static int flash_path(const ddp_kctx_t *ctx, int C, int NH, const void *const a[4])
{
    if (ctx->prec == DDP_KPREC_FP32 || C % 8 || !ddp__cuda_flash_supported(ctx, C, NH)) return 0;
    for (int i = 0; i < 4; i++)
        if (a[i] && !ddp__aligned(a[i], 16)) return 0;
    return 1;
}

/* dK, dV of K/V head kvh = the sums of its G query heads' (from sep [2][B,NH,T,hs]), in
 * ascending order, written into dqkv[B,T,QKV] (overwritten). A thread an element. */
static __global__ void group_sum_kernel(float *dqkv, const float *sep, int B, int T, int NH,
                                        int NKV, int hs)
{
    int G = NH / NKV;
    size_t BH = (size_t)B * NH, kvw = (size_t)NKV * hs, QKV = (size_t)NH * hs + 2 * kvw;
    size_t total = (size_t)B * T * 2 * kvw;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t bt = e / (2 * kvw), col = e % (2 * kvw); /* col: k heads, then v heads */
        int part = (int)(col / kvw), kvh = (int)(col % kvw / hs), i = (int)(col % hs);
        int b = (int)(bt / T), t = (int)(bt % T);
        float s = 0.0f;
        for (int g = 0; g < G; g++) {
            size_t j = (size_t)b * NH + (size_t)kvh * G + g;
            s += sep[(((size_t)part * BH + j) * T + t) * hs + i];
        }
        dqkv[bt * QKV + (size_t)NH * hs + col] = s;
    }
}

/* The general path on fp32 tensors. */
static void general_fwd(ddp_kctx_t *ctx, float *out, float *lse, const float *qkv, int B, int T,
                        int C, int NH, int NKV)
{
    int BH = B * NH, hs = C / NH, QKV = C + 2 * NKV * hs;
    float scale = 1.0f / sqrtf((float)hs);
    ptr_args a = {qkv, NULL, NULL, {out, NULL}, {NULL, NULL}};
    float **p;
    if (attention_scratch(ctx, &p, 5, 1, &a, B, T, C, NH, NKV)) return;
    float **Q = p, **K = p + BH, **V = p + 2 * BH, **O = p + 3 * BH, **S = p + 4 * BH;
    /* S^T (col-major) = K Q^T, i.e. S[t][t2] = scale q_t . k_t2 */
    if (gemm_batched(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, scale, K, QKV, Q, QKV, 0.0f, S, T,
                     BH, "attention_fwd(qk)"))
        return;
    int rows = BH * T;
    softmax_fwd_kernel<<<row_blocks(rows), 32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(a.bhtt[0], lse,
                                                                                 rows, T);
    if (ddp__cuda_launched(ctx, "attention_fwd(softmax)")) return;
    /* out^T = V^T P^T */
    gemm_batched(ctx, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, V, QKV, S, T, 0.0f, O, C, BH,
                 "attention_fwd(pv)");
}

static void general_bwd(ddp_kctx_t *ctx, float *dqkv, const float *dout, const float *qkv,
                        const float *out, const float *lse, int B, int T, int C, int NH, int NKV)
{
    int BH = B * NH, hs = C / NH, QKV = C + 2 * NKV * hs;
    float scale = 1.0f / sqrtf((float)hs);
    ptr_args a = {qkv, dqkv, NULL, {(float *)dout, NULL}, {NULL, NULL}};
    float **p;
    if (attention_scratch(ctx, &p, 9, 2, &a, B, T, C, NH, NKV)) return;
    float **Q = p, **K = p + BH, **V = p + 2 * BH;
    float **dQ = p + 3 * BH, **dK = p + 4 * BH, **dV = p + 5 * BH;
    float **dO = p + 6 * BH, **P = p + 7 * BH, **dP = p + 8 * BH;
    int rows = BH * T, ldkv = a.dkv_sep ? hs : QKV; /* dK, dV: per query head when G > 1 */
    /* P again: S^T = K Q^T, then exp(S - lse) */
    if (gemm_batched(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, scale, K, QKV, Q, QKV, 0.0f, P, T,
                     BH, "attention_bwd(qk)"))
        return;
    softmax_again_kernel<<<row_blocks(rows), 32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(a.bhtt[0],
                                                                                   lse, rows, T);
    if (ddp__cuda_launched(ctx, "attention_bwd(p)")) return;
    /* dV^T = dout^T P */
    if (gemm_batched(ctx, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, dO, C, P, T, 0.0f, dV, ldkv,
                     BH, "attention_bwd(dv)"))
        return;
    /* dP^T = V dout^T */
    if (gemm_batched(ctx, CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, 1.0f, V, QKV, dO, C, 0.0f, dP, T, BH,
                     "attention_bwd(dp)"))
        return;
    softmax_bwd_kernel<<<row_blocks(rows), 32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(
        a.bhtt[1], a.bhtt[0], dout, out, rows, T, C, NH, scale);
    if (ddp__cuda_launched(ctx, "attention_bwd(softmax)")) return;
    /* dQ^T = K^T dS^T */
    if (gemm_batched(ctx, CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, 1.0f, K, QKV, dP, T, 0.0f, dQ, QKV,
                     BH, "attention_bwd(dq)"))
        return;
    /* dK^T = Q^T dS */
    if (gemm_batched(ctx, CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, 1.0f, Q, QKV, dP, T, 0.0f, dK, ldkv,
                     BH, "attention_bwd(dk)") ||
        !a.dkv_sep)
        return;
    size_t total = (size_t)B * T * 2 * NKV * hs;
    group_sum_kernel<<<ddp__grid(total, DDP_CUDA_BLOCK), DDP_CUDA_BLOCK, 0, ctx->stream>>>(
        dqkv, a.dkv_sep, B, T, NH, NKV, hs);
    ddp__cuda_launched(ctx, "attention_bwd(group sums)");
}

/* fp32 copies of a 16-bit run's tensors for the general path: n[i] floats each, in one
 * stream-ordered allocation (freed with wide_free, after the ops that use it, in stream order),
 * tensor i widened from src[i] when that is not NULL. 0, or -1 with the error recorded. */
static int wide_alloc(ddp_kctx_t *ctx, float **base, float **t, const size_t *n,
                      const ddp_act_t *const *src, int count)
{
    size_t total = 0;
    for (int i = 0; i < count; i++) total += (n[i] + 63) & ~(size_t)63; /* 256-byte aligned */
    if (ddp__cuda_check(ctx, cudaMallocAsync((void **)base, total * sizeof(float), ctx->stream),
                        "cudaMallocAsync(attention's fp32 copies)"))
        return -1;
    size_t off = 0;
    for (int i = 0; i < count; i++) {
        t[i] = *base + off;
        off += (n[i] + 63) & ~(size_t)63;
        if (src[i]) ddp__cuda_act_to_f32(ctx, t[i], src[i], n[i]);
    }
    return 0;
}

static void wide_free(ddp_kctx_t *ctx, float *base)
{
    ddp__cuda_check(ctx, cudaFreeAsync(base, ctx->stream), "cudaFreeAsync(attention's copies)");
}

void ddp__cuda_attention_fwd(ddp_kctx_t *ctx, ddp_act_t *out, float *lse, const ddp_act_t *qkv,
                             int B, int T, int C, int NH, int NKV)
{
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0 || NKV <= 0 || ddp__cuda_enter(ctx)) return;
    const void *const tensors[4] = {out, qkv, NULL, NULL};
    if (flash_path(ctx, C, NH, tensors)) {
        ddp__cuda_flash_fwd(ctx, out, lse, qkv, B, T, C, NH, NKV);
        return;
    }
    if (ctx->prec == DDP_KPREC_FP32) {
        general_fwd(ctx, (float *)out, lse, (const float *)qkv, B, T, C, NH, NKV);
        return;
    }
    size_t BTC = (size_t)B * T * C, nq = (size_t)B * T * (C + 2 * (size_t)NKV * (C / NH));
    size_t n[2] = {nq, BTC};
    const ddp_act_t *src[2] = {qkv, NULL};
    float *base, *w[2];
    if (wide_alloc(ctx, &base, w, n, src, 2)) return;
    general_fwd(ctx, w[1], lse, w[0], B, T, C, NH, NKV);
    ddp__cuda_to_act(ctx, out, w[1], BTC);
    wide_free(ctx, base);
}

void ddp__cuda_attention_bwd(ddp_kctx_t *ctx, ddp_act_t *dqkv, const ddp_act_t *dout,
                             const ddp_act_t *qkv, const ddp_act_t *out, const float *lse, int B,
                             int T, int C, int NH, int NKV)
{
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0 || NKV <= 0 || ddp__cuda_enter(ctx)) return;
    const void *const tensors[4] = {dqkv, dout, qkv, out};
    if (flash_path(ctx, C, NH, tensors)) {
        ddp__cuda_flash_bwd(ctx, dqkv, dout, qkv, out, lse, B, T, C, NH, NKV);
        return;
    }
    if (ctx->prec == DDP_KPREC_FP32) {
        general_bwd(ctx, (float *)dqkv, (const float *)dout, (const float *)qkv,
                    (const float *)out, lse, B, T, C, NH, NKV);
        return;
    }
    size_t BTC = (size_t)B * T * C, nq = (size_t)B * T * (C + 2 * (size_t)NKV * (C / NH));
    size_t n[4] = {nq, BTC, BTC, nq};
    const ddp_act_t *src[4] = {qkv, out, dout, NULL};
    float *base, *w[4];
    if (wide_alloc(ctx, &base, w, n, src, 4)) return;
    general_bwd(ctx, w[3], w[2], w[0], w[1], lse, B, T, C, NH, NKV);
    ddp__cuda_to_act(ctx, dqkv, w[3], nq);
    wide_free(ctx, base);
}
