/* Linear layers: fp32 runs with cuBLAS (cublasSgemm; TF32 only when the context enabled it),
 * bf16/fp16 runs with cuBLASLt on the 16-bit activations as they are.
 *
 * Row-major tensors are handed to column-major cuBLAS as their transposes: a row-major [R, K]
 * matrix is a column-major [K, R] one with leading dimension K.
 *
 * forward   out[N,OC] = inp[N,C] @ W (+ bias[OC]); out's (and backward's dout's) rows ldo >= OC
 *           elements apart (the LM head's padded logits: aligned rows for the tensor cores)
 *             DDP_W_IN_OUT  W[C,OC]:  out^T = W^T-view @ inp^T   gemm(N, N, OC, N, C)
 *             DDP_W_OUT_IN  W[OC,C]:  out^T = W-view^T @ inp^T   gemm(T, N, OC, N, C)
 * backward  dinp[N,C] = dout @ W^T           (beta = 0: overwritten)
 *           dweight   += inp^T @ dout in W's layout (beta = 1, fp32)
 *           dbias[OC] += colsum(dout)        in 16-bit runs by dweight's product, through
 *                                            cuBLASLt's BGRADA/BGRADB epilogue (into scratch,
 *                                            then added), else the deterministic two-stage
 *                                            column sum (kcuda.cuh)
 * fp32 runs: cublasSgemm; the bias by fwd_epilogue_kernel in place (out += bias).
 * 16-bit runs (ctx->prec bf16/fp16): cublasLtMatmul with A, B of the 16-bit type (the weight's
 * copy from lowp.cu, the activations directly), CUBLAS_COMPUTE_32F (fp32 accumulation on tensor
 * cores), D = out / dinp of the 16-bit type (rounded once, from fp32) or dweight (fp32, C = D,
 * beta 1). The forward's bias is added in fp32 before that one rounding:
 *   - by CUBLASLT_EPILOGUE_BIAS with the bias of D's type (the bias's 16-bit copy, made with
 *     the weights' copies by lowp.cu), as cublasLt.h documents it and PyTorch and llm.c use it:
 *     the product's fp32 sum plus the bias rounded to 16 bits, then rounded once (the CPU
 *     rounds the bias alike, kernels/cpu/matmul.c). An fp32 bias
 *     (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = CUDA_R_32F) would be exact, but CUDA 13's
 *     cuBLASLt on an H100 refused it with INVALID_VALUE (2026-11-27);
 *   - else (any failure of that epilogue's try, remembered in ctx->lt_bias16) the product goes
 *     to fp32 scratch [N, OC] and fwd_epilogue_kernel adds the fp32 bias and rounds: 10 more
 *     bytes an output element, half the forward's speed at GPT-2's shapes on that H100.
 * Shapes cuBLASLt has no algorithm for go to cublasGemmEx (same types, same single rounding).
 * Split-K reductions are limited to CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE (partial sums in
 * fp32): the OUTPUT_TYPE and INPLACE schemes would sum partial products in the 16-bit output
 * type, rounding more than once. Alignment preferences are the pointers' real alignment, so
 * no algorithm assumes more than it gets. A product is deterministic: one algorithm per shape,
 * types and alignment (the heuristic's first, asked once per context and kept), no atomics.
 * GELU (matmul_gelu_fwd, matmul_dgelu_bwd; 16-bit runs): cuBLASLt's GELU_AUX_BIAS epilogue
 * writes the product plus bias rounded (pre, its aux output) and gelu of the same fp32 value
 * rounded (out); DGELU multiplies the input gradient's fp32 product by gelu'(pre) before its
 * rounding. Probed like the bias epilogue (ctx->lt_gelu[2], ctx->lt_dgelu); the fallback is
 * the product in fp32 scratch and a kernel over kernels/math/gelu.h doing the same arithmetic.
 * cuBLASLt's own GELU (tanh form, as GPT-2's) may differ from gelu.h in the last bits: the
 * self-test holds it to the bf16 tolerance. fp32 runs: the plain product, then gelu_fwd/bwd.
 * Limits: N, C, OC < 2^31 (cuBLAS ints).
 */
#include <string.h>

#include "kernels/cuda/kcuda.cuh"
#include "kernels/math/gelu.h"

/* The forward's epilogue by a kernel, after an fp32 product acc [N, OC] (rows lda apart; acc
 * may be out: fp32, in place, lda = ldo): with v = acc + round(bias) (bias may be NULL; rounded
 * to T as the epilogue's 16-bit copy is, fp32: unchanged), out = round(v) and, where gelu is
 * not NULL, gelu = round(gelu(v)) (the GELU_AUX_BIAS epilogue's arithmetic); out's and gelu's
 * rows ldo apart. */
template <typename T>
static __global__ void fwd_epilogue_kernel(T *out, T *gelu, int ldo, const float *acc, int lda,
                                           const float *bias, int OC, size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / (size_t)OC, c = i - n * (size_t)OC;
        float v = acc[n * lda + c];
        if (bias) v += ddp__act<T>::ld(ddp__act<T>::st(bias[c]));
        out[n * ldo + c] = ddp__act<T>::st(v);
        if (gelu) gelu[n * ldo + c] = ddp__act<T>::st(ddp_gelu(v));
    }
}

static void fwd_epilogue(ddp_kctx_t *ctx, void *out, void *gelu, int ldo, const float *acc,
                         int lda, const float *bias, int N, int OC)
{
    size_t total = (size_t)N * OC;
    DDP_ACT_DISPATCH(ctx->prec, T,
                     fwd_epilogue_kernel<T><<<ddp__grid(total, DDP_CUDA_BLOCK), DDP_CUDA_BLOCK, 0,
                                              ctx->stream>>>((T *)out, (T *)gelu, ldo, acc, lda,
                                                             bias, OC, total));
    ddp__cuda_launched(ctx, gelu ? "matmul_gelu_fwd(gelu)" : "matmul_fwd(bias)");
}

/* The largest power of two (<= 256) that divides p's address. */
static uint32_t align_of(const void *p)
{
    uint32_t a = 256;
    while (a > 1 && !ddp__aligned(p, a)) a >>= 1;
    return a;
}

/* One product in cuBLAS's column-major terms: D[m,n] = op(A) op(B) + beta D, A and B of the
 * 16-bit type, D of type dt (16-bit or fp32), fp32 accumulation, with the optional epilogues
 * below (lt_run). Returns CUBLAS_STATUS_NOT_SUPPORTED, without recording it, when cuBLASLt
 * offers no algorithm (the caller may fall back); any other failure is recorded in ctx. */
struct lt_gemm {
    cublasOperation_t ta, tb;
    int m, n, k;
    const void *A;
    int lda;
    const void *B;
    int ldb;
    float beta;
    void *D;
    cudaDataType_t dt;
    int ldd;
    /* the optional epilogues (none by default) */
    const void *bias = nullptr; /* the bias's 16-bit copy */
    float *bgrad = nullptr;     /* the BGRADA (bgrad_b 0) or BGRADB (1) epilogue's output: the
                                   sums over k of A's rows (D's rows) or of B's columns (D's
                                   columns): a weight gradient's product gives dout's column
                                   sums, the bias gradient */
    int bgrad_b = 0;
    int gelu = 0;               /* LT_GELU: GELU_AUX(_BIAS), D = gelu(product + bias) and aux =
                                   product + bias; LT_DGELU: DGELU, D = product * gelu'(aux) */
    void *aux = nullptr;        /* D's shape and type, columns aux_ld apart */
    int aux_ld = 0;
};

enum { LT_GELU = 1, LT_DGELU = 2 };

/* What the heuristic's answer depends on (all else is fixed per context: the compute type,
 * the workspace, the reduction schemes). 32-bit fields only: no padding, so memcmp compares. */
struct lt_key {
    int32_t ta, tb, m, n, k, lda, ldb, ldd, t16, dt, bias, bgrad, gelu, aux_ld;
    uint32_t al_a, al_b, al_d, al_aux;
};

/* The heuristic's first algorithm per key, asked once: a query costs tens of microseconds on
 * the host and a step runs about a hundred products of a dozen shapes. Full: the oldest entry
 * makes room (the same key asks again and gets the same answer). */
#define LT_PLANS 64
struct ddp__lt_plans {
    struct {
        lt_key key;
        cublasLtMatmulAlgo_t algo;
        int found; /* 0: cuBLASLt offers no algorithm for this key */
    } e[LT_PLANS];
    int n, next;
};

/* The index of key's cached entry, or -1 with *slot where to keep a new one (-1 when the cache
 * cannot be allocated: the query is then made every time). */
static int lt_plan_find(ddp_kctx_t *ctx, const lt_key *key, int *slot)
{
    *slot = -1;
    if (!ctx->lt_plans && !(ctx->lt_plans = (ddp__lt_plans *)calloc(1, sizeof(ddp__lt_plans))))
        return -1;
    ddp__lt_plans *p = ctx->lt_plans;
    for (int i = 0; i < p->n; i++)
        if (!memcmp(&p->e[i].key, key, sizeof *key)) return i;
    *slot = p->n < LT_PLANS ? p->n++ : p->next;
    if (p->n == LT_PLANS && *slot == p->next) p->next = (p->next + 1) % LT_PLANS;
    return -1;
}

/* probe: a failure is returned without being recorded (an epilogue's first try,
 * lt_run_epilogue, whose caller answers it by falling back). */
static cublasStatus_t lt_run(ddp_kctx_t *ctx, const lt_gemm *g, const char *what, int probe)
{
    cudaDataType_t t16 = ddp__cuda_lowp_type(ctx);
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, ld = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    cublasStatus_t s;
    if (!ctx->lt_ws &&
        ddp__cuda_check(ctx, cudaMalloc(&ctx->lt_ws, DDP_CUDA_LT_WS), "cudaMalloc(cublasLt)"))
        return CUBLAS_STATUS_ALLOC_FAILED;
    int32_t ta = g->ta, tb = g->tb;
    uint64_t ws = DDP_CUDA_LT_WS;
    uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    uint32_t al_a = align_of(g->A), al_b = align_of(g->B), al_d = align_of(g->D);
    cublasLtMatmulHeuristicResult_t h;
    memset(&h, 0, sizeof h);
    int found = 0;
    const float one = 1.0f;
    const char *stage = ""; /* the call that failed, for the log */
    /* each step runs only while the previous ones succeeded */
#define LT_TRY(call)                                                                               \
    (s == CUBLAS_STATUS_SUCCESS && (stage = #call, s = (call)) == CUBLAS_STATUS_SUCCESS)
    s = CUBLAS_STATUS_SUCCESS;
    LT_TRY(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (g->bias || g->bgrad || g->gelu) { /* vector and aux of D's type, the default */
        uint32_t epi = g->gelu == LT_DGELU ? CUBLASLT_EPILOGUE_DGELU
                       : g->gelu           ? (g->bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                                      : CUBLASLT_EPILOGUE_GELU_AUX)
                       : g->bias           ? CUBLASLT_EPILOGUE_BIAS
                       : g->bgrad_b        ? CUBLASLT_EPILOGUE_BGRADB
                                           : CUBLASLT_EPILOGUE_BGRADA;
        const void *vec = g->bias ? g->bias : (const void *)g->bgrad;
        int64_t aux_ld = g->aux_ld;
        LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        if (vec)
            LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &vec,
                                                  sizeof vec));
        if (g->gelu) {
            LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                  &g->aux, sizeof g->aux));
            LT_TRY(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                  &aux_ld, sizeof aux_ld));
        }
    }
    LT_TRY(cublasLtMatrixLayoutCreate(&la, t16, g->ta == CUBLAS_OP_N ? g->m : g->k,
                                      g->ta == CUBLAS_OP_N ? g->k : g->m, g->lda));
    LT_TRY(cublasLtMatrixLayoutCreate(&lb, t16, g->tb == CUBLAS_OP_N ? g->k : g->n,
                                      g->tb == CUBLAS_OP_N ? g->n : g->k, g->ldb));
    LT_TRY(cublasLtMatrixLayoutCreate(&ld, g->dt, g->m, g->n, g->ldd));
    LT_TRY(cublasLtMatmulPreferenceCreate(&pref));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &ws, sizeof ws));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                &scheme, sizeof scheme));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                &al_a, sizeof al_a));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                &al_b, sizeof al_b));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                &al_d, sizeof al_d));
    LT_TRY(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                &al_d, sizeof al_d));
    lt_key key = {ta, tb, g->m, g->n, g->k, g->lda, g->ldb, g->ldd, (int32_t)t16, (int32_t)g->dt,
                  g->bias != NULL, g->bgrad ? 1 + g->bgrad_b : 0, g->gelu, g->aux_ld,
                  al_a, al_b, al_d, g->aux ? align_of(g->aux) : 0};
    int slot, hit = lt_plan_find(ctx, &key, &slot);
    if (hit >= 0) {
        found = ctx->lt_plans->e[hit].found;
        h.algo = ctx->lt_plans->e[hit].algo;
    } else {
        LT_TRY(cublasLtMatmulAlgoGetHeuristic(ctx->lt, op, la, lb, ld, ld, pref, 1, &h, &found));
        if (s == CUBLAS_STATUS_NOT_SUPPORTED) { /* the heuristic's "no algorithm" as a status */
            s = CUBLAS_STATUS_SUCCESS;
            found = 0;
        }
        if (s == CUBLAS_STATUS_SUCCESS && slot >= 0) { /* kept, "none" too: asked once */
            ctx->lt_plans->e[slot].key = key;
            ctx->lt_plans->e[slot].algo = h.algo;
            ctx->lt_plans->e[slot].found = found;
        }
    }
    if (s == CUBLAS_STATUS_SUCCESS && found == 0) s = CUBLAS_STATUS_NOT_SUPPORTED;
    int asked = s == CUBLAS_STATUS_SUCCESS; /* an algorithm was found: a failure now is an error */
    LT_TRY(cublasLtMatmul(ctx->lt, op, &one, g->A, la, g->B, lb, &g->beta, g->D, ld, g->D, ld,
                          &h.algo, ctx->lt_ws, DDP_CUDA_LT_WS, ctx->stream));
#undef LT_TRY
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (ld) cublasLtMatrixLayoutDestroy(ld);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
    if (s == CUBLAS_STATUS_SUCCESS || (s == CUBLAS_STATUS_NOT_SUPPORTED && !asked)) return s;
    if (probe) {
        DDP_INFO("cuda: %s: %.40s: %s", what, stage, cublasGetStatusName(s));
    } else {
        DDP_ERROR("cuda: %s: %.40s failed (m %d n %d k %d, ld %d %d %d, bias %d)", what, stage,
                  g->m, g->n, g->k, g->lda, g->ldb, g->ldd, g->bias != NULL);
        ddp__cublas_check(ctx, s, what);
    }
    /* NOT_SUPPORTED tells callers "no algorithm, take another way"; cublasLtMatmul refusing
     * the algorithm it was given is a failure like any other (the log has its real status) */
    return s == CUBLAS_STATUS_NOT_SUPPORTED ? CUBLAS_STATUS_EXECUTION_FAILED : s;
}

/* Runs g (no bias). Where cuBLASLt offers no algorithm (leading dimensions or pointers that
 * no kernel of it takes, such as an odd vocabulary's logits), cublasGemmEx runs the same
 * product (16-bit A and B, fp32 accumulation, D rounded once): slower, never refused. */
static int lt_gemm_run(ddp_kctx_t *ctx, const lt_gemm *g, const char *what)
{
    cublasStatus_t s = lt_run(ctx, g, what, 0);
    if (s == CUBLAS_STATUS_NOT_SUPPORTED) {
        DDP_DEBUG("cuda: %s: no cuBLASLt algorithm for m %d n %d k %d (ld %d %d %d): "
                  "cublasGemmEx instead", what, g->m, g->n, g->k, g->lda, g->ldb, g->ldd);
        cudaDataType_t t16 = ddp__cuda_lowp_type(ctx);
        const float one = 1.0f;
        return ddp__cublas_check(ctx,
                                 cublasGemmEx(ctx->blas, g->ta, g->tb, g->m, g->n, g->k, &one,
                                              g->A, t16, g->lda, g->B, t16, g->ldb, &g->beta,
                                              g->D, g->dt, g->ldd, CUBLAS_COMPUTE_32F,
                                              CUBLAS_GEMM_DEFAULT),
                                 what);
    }
    return s == CUBLAS_STATUS_SUCCESS ? 0 : DDP_ECUDA;
}

/* fp32 C = op(A) @ op(B) + beta C (fp32 runs). */
static int sgemm(ddp_kctx_t *ctx, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                 int k, const void *A, int lda, const void *B, int ldb, float beta, void *C,
                 int ldc, const char *what)
{
    const float one = 1.0f;
    return ddp__cublas_check(ctx,
                             cublasSgemm(ctx->blas, ta, tb, m, n, k, &one, (const float *)A, lda,
                                         (const float *)B, ldb, &beta, (float *)C, ldc),
                             what);
}

/* Runs g, whose epilogue cuBLASLt may refuse, under the context's record of that epilogue
 * (*state: 0 untried, 1 worked, -1 refused). A shape it offers no algorithm for takes the
 * fallback alone (the plan cache remembers the answer). Until the epilogue has run once, a
 * failure is a probe's: it turns the epilogue off for the context (logged, with what the caller
 * does instead); after that, a failure is an error. Returns 1 when g ran, 0 when the caller
 * must take its fallback, -1 on an error (recorded). */
static int lt_run_epilogue(ddp_kctx_t *ctx, const lt_gemm *g, int *state, const char *what,
                           const char *fallback)
{
    if (*state < 0) return 0;
    cublasStatus_t s = lt_run(ctx, g, what, *state == 0);
    if (s == CUBLAS_STATUS_SUCCESS) {
        *state = 1;
        return 1;
    }
    if (s == CUBLAS_STATUS_NOT_SUPPORTED) return 0;
    if (*state == 1) return -1;
    DDP_INFO("cuda: %s: cuBLASLt refused the epilogue (%s); %s", what, cublasGetStatusName(s),
             fallback);
    *state = -1;
    return 0;
}

/* out = inp @ W's view in cuBLAS's terms (out^T[OC,N], rows ldo apart), a 16-bit run's. */
static lt_gemm fwd_product(ddp_kctx_t *ctx, void *out, const void *inp, const void *W, int N,
                           int C, int OC, int ldo, ddp_wlayout_t layout)
{
    int io = layout == DDP_W_IN_OUT;
    return {.ta = io ? CUBLAS_OP_N : CUBLAS_OP_T, .tb = CUBLAS_OP_N, .m = OC, .n = N, .k = C,
            .A = W, .lda = io ? OC : C, .B = inp, .ldb = C, .beta = 0.0f, .D = out,
            .dt = ddp__cuda_lowp_type(ctx), .ldd = ldo};
}

/* dinp = dout @ W^T in cuBLAS's terms: IN_OUT: dinp^T[C,N] = W[C,OC] @ dout^T, W's view is
 * [OC,C]; OUT_IN: W[OC,C] is viewed as W^T[C,OC]. */
static lt_gemm dinp_product(ddp_kctx_t *ctx, void *dinp, const void *dout, const void *W, int N,
                            int C, int OC, int ldo, ddp_wlayout_t layout)
{
    int io = layout == DDP_W_IN_OUT;
    return {.ta = io ? CUBLAS_OP_T : CUBLAS_OP_N, .tb = CUBLAS_OP_N, .m = C, .n = N, .k = OC,
            .A = W, .lda = io ? OC : C, .B = dout, .ldb = ldo, .beta = 0.0f, .D = dinp,
            .dt = ddp__cuda_lowp_type(ctx), .ldd = C};
}

/* Queues the forward product g (a 16-bit run's, D = out) with its epilogue: out = round(g +
 * bias), bias fp32 [OC] or NULL, and where gelu is not NULL, gelu = round(gelu(g + bias)) from
 * the same fp32 sum (out is then its pre-activation, rows OC apart). cuBLASLt's BIAS or
 * GELU_AUX(_BIAS) epilogue with the bias's 16-bit copy, each probed (ctx->lt_bias16,
 * ctx->lt_gelu), else the product into fp32 scratch and fwd_epilogue. */
static void lt_fwd(ddp_kctx_t *ctx, lt_gemm g, const float *bias, void *gelu, int N, int OC)
{
    const char *what = gelu ? "matmul_gelu_fwd" : "matmul_fwd";
    if (!bias && !gelu) {
        lt_gemm_run(ctx, &g, what);
        return;
    }
    int *state = gelu ? &ctx->lt_gelu[bias != NULL] : &ctx->lt_bias16;
    const void *bias16 = NULL;
    if (bias && !(bias16 = ddp__cuda_lowp_weight(ctx, bias, (size_t)OC))) return;
    /* GELU's aux ld: a multiple of 8. The bias: 16-byte aligned, since cuBLASLt takes the
     * vector's alignment for granted (a kernel it picked for an aligned bias faults on another,
     * as PyTorch found: its pull request 194497) and a slice of the weights' arena copy at an
     * odd offset (C % 8 != 0) is not */
    if (*state >= 0 && (!gelu || OC % 8 == 0) && (!bias16 || ddp__aligned(bias16, 16))) {
        lt_gemm e = g;
        e.bias = bias16;
        if (gelu) {
            e.gelu = LT_GELU;
            e.aux = g.D;
            e.aux_ld = g.ldd;
            e.D = gelu;
        }
        if (lt_run_epilogue(ctx, &e, state, what,
                            gelu ? "gelu is applied by a kernel after an fp32 product"
                                 : "the bias is added by a kernel after an fp32 product"))
            return; /* ran, or failed (recorded) */
    }
    void *out = g.D;
    int ldo = g.ldd;
    float *acc;
    if (ddp__cuda_scratch(ctx, (size_t)N * OC * sizeof(float), (void **)&acc)) return;
    g.D = acc;
    g.dt = CUDA_R_32F;
    g.ldd = OC;
    if (lt_gemm_run(ctx, &g, what)) return;
    fwd_epilogue(ctx, out, gelu, ldo, acc, OC, bias, N, OC);
}

void ddp__cuda_matmul_fwd(ddp_kctx_t *ctx, ddp_act_t *out, const ddp_act_t *inp,
                          const float *weight, const float *bias, int N, int C, int OC, int ldo,
                          ddp_wlayout_t layout)
{
    if (N <= 0 || C <= 0 || OC <= 0 || ddp__cuda_enter(ctx)) return;
    if (ctx->prec == DDP_KPREC_FP32) {
        int io = layout == DDP_W_IN_OUT;
        if (sgemm(ctx, io ? CUBLAS_OP_N : CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, weight,
                  io ? OC : C, inp, C, 0.0f, out, ldo, "matmul_fwd"))
            return;
        if (bias) fwd_epilogue(ctx, out, NULL, ldo, (const float *)out, ldo, bias, N, OC);
        return;
    }
    const void *W = ddp__cuda_lowp_weight(ctx, weight, (size_t)C * OC);
    if (W) lt_fwd(ctx, fwd_product(ctx, out, inp, W, N, C, OC, ldo, layout), bias, NULL, N, OC);
}

/* dpre = round(acc * gelu'(pre)) over n elements: the DGELU epilogue's arithmetic. */
template <typename T>
static __global__ void dgelu_round_kernel(T *dpre, const float *acc, const T *pre, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dpre[i] = ddp__act<T>::st(acc[i] * ddp_gelu_grad(ddp__act<T>::ld(pre[i])));
}

void ddp__cuda_matmul_gelu_fwd(ddp_kctx_t *ctx, ddp_act_t *out, ddp_act_t *pre,
                               const ddp_act_t *inp, const float *weight, const float *bias,
                               int N, int C, int OC, ddp_wlayout_t layout)
{
    if (N <= 0 || C <= 0 || OC <= 0 || ddp__cuda_enter(ctx)) return;
    if (ctx->prec == DDP_KPREC_FP32) {
        ddp__cuda_matmul_fwd(ctx, pre, inp, weight, bias, N, C, OC, OC, layout);
        ddp__cuda_gelu_fwd(ctx, out, pre, (size_t)N * OC);
        return;
    }
    const void *W = ddp__cuda_lowp_weight(ctx, weight, (size_t)C * OC);
    if (W) lt_fwd(ctx, fwd_product(ctx, pre, inp, W, N, C, OC, OC, layout), bias, out, N, OC);
}

void ddp__cuda_matmul_dgelu_bwd(ddp_kctx_t *ctx, ddp_act_t *dpre, float *dweight, float *dbias,
                                const ddp_act_t *dout, const ddp_act_t *inp,
                                const ddp_act_t *pre, const float *weight, int N, int C, int OC,
                                ddp_wlayout_t layout)
{
    if (N <= 0 || C <= 0 || OC <= 0 || ddp__cuda_enter(ctx)) return;
    if (ctx->prec == DDP_KPREC_FP32) {
        ddp__cuda_matmul_bwd(ctx, dpre, dweight, dbias, dout, inp, weight, N, C, OC, OC, layout);
        ddp__cuda_gelu_bwd(ctx, dpre, pre, dpre, (size_t)N * C);
        return;
    }
    const void *W = ddp__cuda_lowp_weight(ctx, weight, (size_t)C * OC);
    if (!W) return;
    lt_gemm g = dinp_product(ctx, dpre, dout, W, N, C, OC, OC, layout);
    int ran = 0;
    if (ctx->lt_dgelu >= 0 && C % 8 == 0) { /* the aux's ld: a multiple of 8 */
        lt_gemm e = g;
        e.gelu = LT_DGELU;
        e.aux = (void *)pre; /* read only: DGELU's aux is an input */
        e.aux_ld = C;
        ran = lt_run_epilogue(ctx, &e, &ctx->lt_dgelu, "matmul_dgelu_bwd",
                              "gelu' is applied by a kernel after an fp32 product");
        if (ran < 0) return;
    }
    if (!ran) {
        float *acc;
        if (ddp__cuda_scratch(ctx, (size_t)N * C * sizeof(float), (void **)&acc)) return;
        g.D = acc;
        g.dt = CUDA_R_32F;
        if (lt_gemm_run(ctx, &g, "matmul_dgelu_bwd")) return;
        size_t n = (size_t)N * C;
        DDP_ACT_DISPATCH(ctx->prec, T,
                         dgelu_round_kernel<T><<<ddp__grid(n, DDP_CUDA_BLOCK), DDP_CUDA_BLOCK, 0,
                                                 ctx->stream>>>((T *)dpre, acc, (const T *)pre,
                                                                n));
        if (ddp__cuda_launched(ctx, "matmul_dgelu_bwd(gelu')")) return;
    }
    ddp__cuda_matmul_bwd(ctx, NULL, dweight, dbias, dout, inp, weight, N, C, OC, OC, layout);
}

/* Runs the weight gradient's product g with the BGRADA (dout is A, bgrad_b 0) or BGRADB (dout
 * is B) epilogue, whose sums of dout over the rows go to scratch and are then added into
 * dbias[OC]: 1 when it ran (or failed, the error recorded), 0 when the caller must run g and
 * the column sum instead (lt_run_epilogue, ctx->lt_bgrad[bgrad_b]). It saves reading dout
 * again for the column sum (matmul_bwd's dbias read 1.4 GB a step of GPT-2 124M at B=8
 * T=1024). */
static int lt_dweight_bgrad(ddp_kctx_t *ctx, lt_gemm g, float *dbias, int OC, int bgrad_b)
{
    if (ddp__cuda_scratch(ctx, (size_t)OC * sizeof(float), (void **)&g.bgrad)) return 1;
    g.bgrad_b = bgrad_b;
    int ran = lt_run_epilogue(ctx, &g, &ctx->lt_bgrad[bgrad_b], "matmul_bwd(dweight)",
                              "dbias is a column sum of its own");
    if (ran > 0) ddp__cuda_add(ctx, dbias, g.bgrad, (size_t)OC);
    return ran != 0;
}

template <typename T> struct dout_value {
    const T *dout;
    int ldo;
    __device__ void operator()(int n, int c, float v[1]) const
    {
        v[0] = ddp__act<T>::ld(dout[(size_t)n * ldo + c]);
    }
};

void ddp__cuda_matmul_bwd(ddp_kctx_t *ctx, ddp_act_t *dinp, float *dweight, float *dbias,
                          const ddp_act_t *dout, const ddp_act_t *inp, const float *weight, int N,
                          int C, int OC, int ldo, ddp_wlayout_t layout)
{
    if (N <= 0 || C <= 0 || OC <= 0 || ddp__cuda_enter(ctx)) return;
    int fp32 = ctx->prec == DDP_KPREC_FP32;
    if (dinp) {
        /* dinp_product's mapping; fp32 runs it on cublasSgemm */
        cublasOperation_t ta = layout == DDP_W_IN_OUT ? CUBLAS_OP_T : CUBLAS_OP_N;
        int lda = layout == DDP_W_IN_OUT ? OC : C;
        const char *what = "matmul_bwd(dinp)";
        if (fp32) {
            if (sgemm(ctx, ta, CUBLAS_OP_N, C, N, OC, weight, lda, dout, ldo, 0.0f, dinp, C, what))
                return;
        } else {
            const void *W = ddp__cuda_lowp_weight(ctx, weight, (size_t)C * OC);
            if (!W) return;
            lt_gemm g = dinp_product(ctx, dinp, dout, W, N, C, OC, ldo, layout);
            if (lt_gemm_run(ctx, &g, what)) return;
        }
    }
    if (dweight) {
        /* IN_OUT: dW^T[OC,C] += dout^T @ inp; OUT_IN: dW^T[C,OC] += inp^T @ dout */
        int in_out = layout == DDP_W_IN_OUT;
        const void *A = in_out ? (const void *)dout : (const void *)inp;
        const void *B = in_out ? (const void *)inp : (const void *)dout;
        int m = in_out ? OC : C, n = in_out ? C : OC;
        int lda = in_out ? ldo : C, ldb = in_out ? C : ldo;
        const char *what = "matmul_bwd(dweight)";
        if (fp32) {
            if (sgemm(ctx, CUBLAS_OP_N, CUBLAS_OP_T, m, n, N, A, lda, B, ldb, 1.0f, dweight, m,
                      what))
                return;
        } else {
            lt_gemm g = {.ta = CUBLAS_OP_N, .tb = CUBLAS_OP_T, .m = m, .n = n, .k = N, .A = A,
                         .lda = lda, .B = B, .ldb = ldb, .beta = 1.0f, .D = dweight,
                         .dt = CUDA_R_32F, .ldd = m};
            if (dbias && ctx->lt_bgrad[!in_out] >= 0 &&
                lt_dweight_bgrad(ctx, g, dbias, OC, !in_out))
                return; /* dbias too (or an error, recorded) */
            if (lt_gemm_run(ctx, &g, what)) return;
        }
    }
    if (dbias)
        DDP_ACT_DISPATCH(ctx->prec, T, {
            dout_value<T> f = {(const T *)dout, ldo};
            ddp__colsum<1>(ctx, dbias, NULL, N, OC, f, "matmul_bwd(dbias)");
        });
}
