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
 * Causal blocks: the products skip most of the masked upper triangle. Query rows go in blocks
 * of TB (causal_block: a quarter of T in multiples of 64, at least 128; T <= 128 is one
 * block): query block [r0, r1) meets keys [0, r1) only (the scores, P V, dP, dQ), and key block
 * [c0, c1) queries [c0, T) only (dV, dK), so at T = 1024 the products do 62.5% of the square's
 * work and the row kernels touch the same part (row t: columns below its block's end, zeros
 * past t). Every product still overwrites its output (beta 0), each element once.
 * Scratch: B*NH*T*T floats forward, twice that backward (plus 2*B*NH*T*hs when G > 1), plus
 * pointer arrays: 11 * blocks * B*NH pointers at most.
 * Limits: B*NH*T < 2^31 rows.
 */
#include "kernels/cuda/kcuda.cuh"
#include "kernels/math/softmax.h"

#define ROWS_PER_BLOCK 8

/* Query rows per causal block at T (the header): a quarter of T in multiples of 64, >= 128. */
static int causal_block(int T)
{
    int tb = (T / 4 + 63) / 64 * 64;
    return tb < 128 ? 128 : tb;
}

/* The end of row t's block: the columns it meets. */
static __device__ __forceinline__ int block_end(int t, int tb, int T)
{
    return min(T, (t / tb + 1) * tb);
}

/* The product's operands, as pointer arrays of the B*NH query heads j = b*NH + h: Q, K, V, then
 * dQ, dK, dV, then the [B,T,C]-shaped tensors (base + b*T*C + h*hs), then the [B,NH,T,T] ones
 * (base + j*T*T), each once per causal block i with its rows from i*TB on (ptrs: the arrays
 * counted in that order, a = 0..), then the [B,NH,T,T] ones again from row and column i*TB
 * (the diagonal block: the key-block products' P and dS). */
struct ptr_args {
    const float *qkv; /* Q, K, V come from here; dQ, dK, dV from dqkv when non-NULL */
    float *dqkv;
    float *dkv_sep;   /* G > 1: dK, dV of each query head, [2][B,NH,T,hs] in scratch */
    float *bt[2];     /* [B,T,C] tensors (out / dout), NULL when absent */
    float *bhtt[2];   /* [B,NH,T,T] tensors (P, dP in scratch), NULL when absent */
};

/* ptr[(a * nb + i) * BH + j]: array a's pointer of head j for block i (above). */
static __global__ void fill_ptrs_kernel(float **ptr, ptr_args a, int B, int T, int C, int NH,
                                        int NKV, int tb, int nb)
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
        float *base[11];
        size_t ld[11];
        int k = 0;
        for (int w = 0; w < 3; w++) base[k] = (float *)a.qkv + off[w], ld[k++] = QKV;
        if (a.dqkv) {
            base[k] = a.dqkv + off[0], ld[k++] = QKV;
            for (int w = 1; w < 3; w++) {
                base[k] = a.dkv_sep ? a.dkv_sep + ((size_t)(w - 1) * BH + j) * T * hs
                                    : a.dqkv + off[w];
                ld[k++] = a.dkv_sep ? (size_t)hs : QKV;
            }
        }
        for (int w = 0; w < 2; w++)
            if (a.bt[w]) base[k] = a.bt[w] + (size_t)b * T * C + (size_t)h * hs, ld[k++] = C;
        int sq = k;
        for (int w = 0; w < 2; w++)
            if (a.bhtt[w]) base[k] = a.bhtt[w] + (size_t)j * T * T, ld[k++] = T;
        int n = k;
        for (int w = sq; w < n; w++) base[k] = base[w], ld[k++] = (size_t)T + 1; /* diagonal */
        for (int w = 0; w < k; w++)
            for (int i = 0; i < nb; i++)
                ptr[((size_t)w * nb + i) * BH + j] = base[w] + (size_t)i * tb * ld[w];
    }
}

/* The pointer arrays of one op (fill_ptrs_kernel's): arr(x, a, i) is array a for block i. */
struct ptr_arrays {
    float **p;
    int nb, BH;
};
static float **arr(const ptr_arrays *x, int a, int i)
{
    return x->p + ((size_t)a * x->nb + i) * x->BH;
}

/* Carves ctx's scratch into `nsq` [B,NH,T,T] float tensors, (backward with G > 1) the
 * [2][B,NH,T,hs] of each query head's dK and dV, and the pointer arrays of `narrays` operands
 * (nsq of them the [B,NH,T,T] ones, which also get their diagonal arrays) for each causal
 * block; fills a->bhtt and a->dkv_sep, and builds the arrays. Each piece 256-byte aligned: the
 * pointer arrays need 8 (an odd B*NH*T*T would leave them misaligned: an illegal address on
 * the GPU), the tensors 16 for cuBLAS's fast kernels. */
static int attention_scratch(ddp_kctx_t *ctx, ptr_arrays *out, int narrays, int nsq, ptr_args *a,
                             int B, int T, int C, int NH, int NKV)
{
#define SCRATCH_PIECE(bytes) (((bytes) + 255) & ~(size_t)255)
    int tb = causal_block(T), nb = (T + tb - 1) / tb;
    size_t BH = (size_t)B * NH, sq = SCRATCH_PIECE(BH * T * T * sizeof(float));
    size_t sep = a->dqkv && NKV != NH
                     ? SCRATCH_PIECE(2 * BH * T * (size_t)(C / NH) * sizeof(float))
                     : 0;
#undef SCRATCH_PIECE
    size_t npointers = (size_t)(narrays + nsq) * nb * BH;
    char *p;
    DDP_CHECK(ddp__cuda_scratch(ctx, nsq * sq + sep + npointers * sizeof(float *), (void **)&p));
    for (int i = 0; i < nsq; i++) a->bhtt[i] = (float *)(p + i * sq);
    a->dkv_sep = sep ? (float *)(p + nsq * sq) : NULL;
    float **arrays = (float **)(p + nsq * sq + sep);
    fill_ptrs_kernel<<<ddp__grid(BH, DDP_CUDA_BLOCK), DDP_CUDA_BLOCK, 0, ctx->stream>>>(
        arrays, *a, B, T, C, NH, NKV, tb, nb);
    DDP_CHECK(ddp__cuda_launched(ctx, "attention(pointers)"));
    *out = ptr_arrays{arrays, nb, (int)BH};
    return 0;
}

/* Row r of [B*NH*T, T] holds scale*q.k below its block's end; becomes the causal softmax
 * (zeros above t, to the block's end), and lse[r] its log-sum-exp. */
static __global__ void softmax_fwd_kernel(float *att, float *lse, int rows, int T, int tb)
{
    int r = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    int t = r % T, end = block_end(t, tb, T);
    float *x = att + (size_t)r * T;
    float mx = -INFINITY;
    for (int t2 = lane; t2 <= t; t2 += 32) mx = fmaxf(mx, x[t2]);
    mx = ddp__warp_max(mx);
    float s = 0.0f;
    for (int t2 = lane; t2 <= t; t2 += 32) s += ddp_softmax_exp(x[t2], mx);
    s = ddp__warp_sum(s);
    float inv = 1.0f / s;
    for (int t2 = lane; t2 < end; t2 += 32)
        x[t2] = t2 <= t ? ddp_softmax_exp(x[t2], mx) * inv : 0.0f;
    if (lane == 0) lse[r] = mx + logf(s);
}

/* Row r of [B*NH*T, T] holds scale*q.k below its block's end; becomes P = exp(x - lse[r])
 * (zeros above t, to the block's end). */
static __global__ void softmax_again_kernel(float *att, const float *lse, int rows, int T, int tb)
{
    int r = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    int t = r % T, end = block_end(t, tb, T);
    float *x = att + (size_t)r * T;
    float l = lse[r];
    for (int t2 = lane; t2 < end; t2 += 32) x[t2] = t2 <= t ? ddp_softmax_exp(x[t2], l) : 0.0f;
}

/* dP (row r = (b, h, t)) becomes dS = scale * P (dP - D), D = dout[b,t,h] . out[b,t,h]; zeros
 * above t, to the block's end. */
static __global__ void softmax_bwd_kernel(float *dp, const float *p, const float *dout,
                                          const float *out, int rows, int T, int C, int NH,
                                          float scale, int tb)
{
    int r = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (r >= rows) return;
    int t = r % T, bh = r / T, b = bh / NH, h = bh % NH, hs = C / NH, end = block_end(t, tb, T);
    size_t o = ((size_t)b * T + t) * C + (size_t)h * hs;
    float d = 0.0f;
    for (int i = lane; i < hs; i += 32) d += dout[o + i] * out[o + i];
    d = ddp__warp_sum(d);
    float *dpr = dp + (size_t)r * T;
    const float *pr = p + (size_t)r * T;
    for (int t2 = lane; t2 < end; t2 += 32)
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

static unsigned row_blocks(int rows)
{
    return (unsigned)((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
}

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

/* The general path on fp32 tensors, causal block by causal block (the header): query block i
 * has rows [i tb, r1) (n of them) and meets keys [0, r1); key block j has keys [c0, c0 + kw) and
 * meets queries [c0, T). */
#define QUERY_BLOCK(i) int r1 = min(T, ((i) + 1) * tb), n = r1 - (i) * tb
#define KEY_BLOCK(j) int c0 = (j) * tb, kw = min(T, c0 + tb) - c0

static void general_fwd(ddp_kctx_t *ctx, float *out, float *lse, const float *qkv, int B, int T,
                        int C, int NH, int NKV)
{
    int BH = B * NH, hs = C / NH, QKV = C + 2 * NKV * hs, tb = causal_block(T);
    float scale = 1.0f / sqrtf((float)hs);
    ptr_args a = {qkv, NULL, NULL, {out, NULL}, {NULL, NULL}};
    ptr_arrays x;
    if (attention_scratch(ctx, &x, 5, 1, &a, B, T, C, NH, NKV)) return;
    enum { Q, K, V, O, S };
    for (int i = 0; i < x.nb; i++) { /* S^T (col-major) = K Q^T: S[t][t2] = scale q_t . k_t2 */
        QUERY_BLOCK(i);
        if (gemm_batched(ctx, CUBLAS_OP_T, CUBLAS_OP_N, r1, n, hs, scale, arr(&x, K, 0), QKV,
                         arr(&x, Q, i), QKV, 0.0f, arr(&x, S, i), T, BH, "attention_fwd(qk)"))
            return;
    }
    int rows = BH * T;
    softmax_fwd_kernel<<<row_blocks(rows), 32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(a.bhtt[0], lse,
                                                                                 rows, T, tb);
    if (ddp__cuda_launched(ctx, "attention_fwd(softmax)")) return;
    for (int i = 0; i < x.nb; i++) { /* out^T = V^T P^T */
        QUERY_BLOCK(i);
        if (gemm_batched(ctx, CUBLAS_OP_N, CUBLAS_OP_N, hs, n, r1, 1.0f, arr(&x, V, 0), QKV,
                         arr(&x, S, i), T, 0.0f, arr(&x, O, i), C, BH, "attention_fwd(pv)"))
            return;
    }
}

static void general_bwd(ddp_kctx_t *ctx, float *dqkv, const float *dout, const float *qkv,
                        const float *out, const float *lse, int B, int T, int C, int NH, int NKV)
{
    int BH = B * NH, hs = C / NH, QKV = C + 2 * NKV * hs, tb = causal_block(T);
    float scale = 1.0f / sqrtf((float)hs);
    ptr_args a = {qkv, dqkv, NULL, {(float *)dout, NULL}, {NULL, NULL}};
    ptr_arrays x;
    if (attention_scratch(ctx, &x, 9, 2, &a, B, T, C, NH, NKV)) return;
    enum { Q, K, V, DQ, DK, DV, DO, P, DP, P_DIAG, DP_DIAG };
    int rows = BH * T, ldkv = a.dkv_sep ? hs : QKV; /* dK, dV: per query head when G > 1 */
    for (int i = 0; i < x.nb; i++) { /* P again: S^T = K Q^T, then exp(S - lse) */
        QUERY_BLOCK(i);
        if (gemm_batched(ctx, CUBLAS_OP_T, CUBLAS_OP_N, r1, n, hs, scale, arr(&x, K, 0), QKV,
                         arr(&x, Q, i), QKV, 0.0f, arr(&x, P, i), T, BH, "attention_bwd(qk)"))
            return;
    }
    softmax_again_kernel<<<row_blocks(rows), 32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(
        a.bhtt[0], lse, rows, T, tb);
    if (ddp__cuda_launched(ctx, "attention_bwd(p)")) return;
    for (int j = 0; j < x.nb; j++) { /* dV^T = dout^T P */
        KEY_BLOCK(j);
        if (gemm_batched(ctx, CUBLAS_OP_N, CUBLAS_OP_T, hs, kw, T - c0, 1.0f, arr(&x, DO, j), C,
                         arr(&x, P_DIAG, j), T, 0.0f, arr(&x, DV, j), ldkv, BH,
                         "attention_bwd(dv)"))
            return;
    }
    for (int i = 0; i < x.nb; i++) { /* dP^T = V dout^T */
        QUERY_BLOCK(i);
        if (gemm_batched(ctx, CUBLAS_OP_T, CUBLAS_OP_N, r1, n, hs, 1.0f, arr(&x, V, 0), QKV,
                         arr(&x, DO, i), C, 0.0f, arr(&x, DP, i), T, BH, "attention_bwd(dp)"))
            return;
    }
    softmax_bwd_kernel<<<row_blocks(rows), 32 * ROWS_PER_BLOCK, 0, ctx->stream>>>(
        a.bhtt[1], a.bhtt[0], dout, out, rows, T, C, NH, scale, tb);
    if (ddp__cuda_launched(ctx, "attention_bwd(softmax)")) return;
    for (int i = 0; i < x.nb; i++) { /* dQ^T = K^T dS^T */
        QUERY_BLOCK(i);
        if (gemm_batched(ctx, CUBLAS_OP_N, CUBLAS_OP_N, hs, n, r1, 1.0f, arr(&x, K, 0), QKV,
                         arr(&x, DP, i), T, 0.0f, arr(&x, DQ, i), QKV, BH, "attention_bwd(dq)"))
            return;
    }
    for (int j = 0; j < x.nb; j++) { /* dK^T = Q^T dS */
        KEY_BLOCK(j);
        if (gemm_batched(ctx, CUBLAS_OP_N, CUBLAS_OP_T, hs, kw, T - c0, 1.0f, arr(&x, Q, j), QKV,
                         arr(&x, DP_DIAG, j), T, 0.0f, arr(&x, DK, j), ldkv, BH,
                         "attention_bwd(dk)"))
            return;
    }
    if (!a.dkv_sep) return;
    size_t total = (size_t)B * T * 2 * NKV * hs;
    group_sum_kernel<<<ddp__grid(total, DDP_CUDA_BLOCK), DDP_CUDA_BLOCK, 0, ctx->stream>>>(
        dqkv, a.dkv_sep, B, T, NH, NKV, hs);
    ddp__cuda_launched(ctx, "attention_bwd(group sums)");
}

#undef QUERY_BLOCK
#undef KEY_BLOCK

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
