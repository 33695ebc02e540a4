/* The matrix products of one GPT-2 124M bf16 training step at B=8 T=1024 on cuBLASLt, set up
 * exactly as kernels/cuda/matmul.cu's lt_run sets them up (bf16 A and B, fp32 accumulation,
 * the outputs' types, the bias epilogue with a bf16 bias and the biased layers' weight
 * gradients with the BGRADA epilogue, the MLP's GELU in the fc product's epilogue
 * (GELU_AUX_BIAS) and its gradient in the fc proj dinp's (DGELU), reduction schemes limited
 * to the compute type, alignments from the pointers, 32 MiB of workspace), each timed with the
 * algorithm ddpd takes (the heuristic's first) and with every other one the heuristic offers
 * (up to 16): how much a better choice of algorithm could give, shape by shape and for the
 * step. Random operands (never zeros), CUDA events around each of 20 runs after 3 warm-ups,
 * medians. Rows marked "(alt)" show the same product without the GELU (what the step ran
 * before) and are not counted in the step; a GELU epilogue that cuBLASLt refuses is reported
 * on its row ("refused") and the run goes on. tests/gpu/gemm_shapes.py times the same products
 * in PyTorch on the same GPU.
 * Built where the CUDA kernels are; run by tests/gpu/session.sh (part `gemm`).
 *
 *   gemm_shapes [N tokens (8192)] [LM head rows a chunk (2624)]
 */
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/gpu/cuda_check.h"

#define LK(x)                                                                                  \
    do {                                                                                       \
        cublasStatus_t s_ = (x);                                                               \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                     \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cublasGetStatusName(s_)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

#define WS ((size_t)32 << 20)
#define ALGOS 16
#define REPS 20
#define WARMUP 3

typedef struct {
    const char *name;
    int per_step; /* calls in one step */
    cublasOperation_t ta, tb;
    int m, n, k, lda, ldb, ldd;
    int fp32_out; /* D fp32 with beta 1 (a weight gradient), else bf16 with beta 0 */
    int bias;     /* the BIAS epilogue (a bf16 bias) */
    int bgrad;    /* the BGRADA epilogue (the bias gradient, fp32) */
    int gelu;     /* 1: GELU_AUX_BIAS (with bias 1), 2: DGELU; a bf16 aux of D's shape */
    int alt;      /* shown, not counted in the step */
} prod_t;

static uint16_t bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

/* A device buffer of n bf16 (or fp32) random values in [-1, 1). */
static void *rnd(size_t n, int fp32, uint64_t *s)
{
    size_t es = fp32 ? 4 : 2;
    char *h = malloc(n * es);
    for (size_t i = 0; i < n; i++) {
        *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
        float v = (float)((*s >> 40) * (1.0 / 8388608.0)) - 1.0f;
        if (fp32)
            memcpy(h + 4 * i, &v, 4);
        else {
            uint16_t b = bf16(v);
            memcpy(h + 2 * i, &b, 2);
        }
    }
    void *d;
    CK(cudaMalloc(&d, n * es));
    CK(cudaMemcpy(d, h, n * es, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median ms of REPS runs of algo. */
static float time_algo(cublasLtHandle_t lt, cublasLtMatmulDesc_t op, const void *A,
                       cublasLtMatrixLayout_t la, const void *B, cublasLtMatrixLayout_t lb,
                       float beta, void *D, cublasLtMatrixLayout_t ld,
                       const cublasLtMatmulAlgo_t *algo, void *ws, cudaStream_t st)
{
    const float one = 1.0f;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float ms[REPS];
    for (int r = -WARMUP; r < REPS; r++) {
        CK(cudaEventRecord(e0, st));
        cublasStatus_t s =
            cublasLtMatmul(lt, op, &one, A, la, B, lb, &beta, D, ld, D, ld, algo, ws, WS, st);
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        if (s != CUBLAS_STATUS_SUCCESS) return -1.0f;
        if (r >= 0) CK(cudaEventElapsedTime(&ms[r], e0, e1));
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    qsort(ms, REPS, sizeof ms[0], cmp_float);
    return ms[REPS / 2];
}

int main(int argc, char **argv)
{
    int N = argc > 1 ? atoi(argv[1]) : 8192, R = argc > 2 ? atoi(argv[2]) : 2624;
    const int C = 768, QKV = 2304, FH = 3072, V = 50257, LDV = 50304;
    int lm_chunks = (N + R - 1) / R, last = N - (lm_chunks - 1) * R;
    const cublasOperation_t Nn = CUBLAS_OP_N, Tt = CUBLAS_OP_T;
    /* model.c's products in matmul.cu's column-major terms (its header gives the mapping) */
    prod_t p[] = {
        {"qkv fwd", 12, Nn, Nn, QKV, N, C, QKV, C, QKV, 0, 1, 0, 0, 0},
        {"attn proj fwd", 12, Nn, Nn, C, N, C, C, C, C, 0, 1, 0, 0, 0},
        {"fc fwd +gelu", 12, Nn, Nn, FH, N, C, FH, C, FH, 0, 1, 0, 1, 0},
        {"fc fwd (alt)", 12, Nn, Nn, FH, N, C, FH, C, FH, 0, 1, 0, 0, 1},
        {"fc proj fwd", 12, Nn, Nn, C, N, FH, C, FH, C, 0, 1, 0, 0, 0},
        {"lm head fwd", lm_chunks - 1, Tt, Nn, V, R, C, C, C, LDV, 0, 0, 0, 0, 0},
        {"lm head fwd (last)", 1, Tt, Nn, V, last, C, C, C, LDV, 0, 0, 0, 0, 0},
        {"qkv dinp", 12, Tt, Nn, C, N, QKV, QKV, QKV, C, 0, 0, 0, 0, 0},
        {"attn proj dinp", 12, Tt, Nn, C, N, C, C, C, C, 0, 0, 0, 0, 0},
        {"fc dinp", 12, Tt, Nn, C, N, FH, FH, FH, C, 0, 0, 0, 0, 0},
        {"fc proj dinp +dgelu", 12, Tt, Nn, FH, N, C, C, C, FH, 0, 0, 0, 2, 0},
        {"fc proj dinp (alt)", 12, Tt, Nn, FH, N, C, C, C, FH, 0, 0, 0, 0, 1},
        {"lm head dinp", lm_chunks - 1, Nn, Nn, C, R, V, C, LDV, C, 0, 0, 0, 0, 0},
        {"lm head dinp (last)", 1, Nn, Nn, C, last, V, C, LDV, C, 0, 0, 0, 0, 0},
        {"qkv dweight", 12, Nn, Tt, QKV, C, N, QKV, C, QKV, 1, 0, 1, 0, 0},
        {"attn proj dweight", 12, Nn, Tt, C, C, N, C, C, C, 1, 0, 1, 0, 0},
        {"fc dweight", 12, Nn, Tt, FH, C, N, FH, C, FH, 1, 0, 1, 0, 0},
        {"fc proj dweight", 12, Nn, Tt, C, FH, N, C, FH, C, 1, 0, 1, 0, 0},
        {"lm head dweight", lm_chunks - 1, Nn, Tt, C, V, R, C, LDV, C, 1, 0, 0, 0, 0},
        {"lm head dweight (last)", 1, Nn, Tt, C, V, last, C, LDV, C, 1, 0, 0, 0, 0},
    };
    int np = (int)(sizeof p / sizeof p[0]);
    cublasLtHandle_t lt;
    LK(cublasLtCreate(&lt));
    cudaStream_t st;
    CK(cudaStreamCreate(&st));
    void *ws;
    CK(cudaMalloc(&ws, WS));
    uint64_t seed = 42;
    double step_first = 0, step_best = 0, flops_step = 0;
    printf("%-22s %6s %6s %6s %5s %9s %9s %6s %4s %8s\n", "product", "m", "n", "k", "calls",
           "first ms", "best ms", "best#", "of", "TFLOP/s");
    for (int i = 0; i < np; i++) {
        prod_t *q = &p[i];
        if (q->per_step <= 0 || q->n <= 0) continue;
        size_t na = (size_t)q->lda * (q->ta == Nn ? q->k : q->m);
        size_t nb = (size_t)q->ldb * (q->tb == Nn ? q->n : q->k);
        size_t nd = (size_t)q->ldd * q->n;
        void *A = rnd(na, 0, &seed), *B = rnd(nb, 0, &seed), *D = rnd(nd, q->fp32_out, &seed);
        void *bias = q->bias ? rnd((size_t)q->m, 0, &seed) : q->bgrad ? rnd((size_t)q->m, 1, &seed)
                                                                     : NULL;
        cudaDataType_t dt = q->fp32_out ? CUDA_R_32F : CUDA_R_16BF;
        float beta = q->fp32_out ? 1.0f : 0.0f;
        cublasLtMatmulDesc_t op;
        LK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        int32_t ta = q->ta, tb = q->tb;
        LK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
        LK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
        void *aux = q->gelu ? rnd(nd, 0, &seed) : NULL;
        /* a GELU row's epilogue may be refused: reported on its row, the others go on */
        cublasStatus_t refused = CUBLAS_STATUS_SUCCESS;
#define EPI(x)                                                                                 \
    do {                                                                                       \
        cublasStatus_t e_ = (x);                                                               \
        if (!q->gelu) LK(e_);                                                                  \
        if (refused == CUBLAS_STATUS_SUCCESS) refused = e_;                                    \
    } while (0)
        if (bias || aux) { /* matmul.cu's: the bias, or dout's column sums (dout is A here) */
            uint32_t epi = q->gelu == 2 ? CUBLASLT_EPILOGUE_DGELU
                           : q->gelu    ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                           : q->bias    ? CUBLASLT_EPILOGUE_BIAS
                                        : CUBLASLT_EPILOGUE_BGRADA;
            int64_t aux_ld = q->ldd;
            EPI(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                               sizeof epi));
            if (bias)
                EPI(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                   sizeof bias));
            if (aux) {
                EPI(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                   &aux, sizeof aux));
                EPI(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                                                   &aux_ld, sizeof aux_ld));
            }
        }
        cublasLtMatrixLayout_t la, lb, ld;
        LK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, q->ta == Nn ? q->m : q->k,
                                      q->ta == Nn ? q->k : q->m, q->lda));
        LK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, q->tb == Nn ? q->k : q->n,
                                      q->tb == Nn ? q->n : q->k, q->ldb));
        LK(cublasLtMatrixLayoutCreate(&ld, dt, q->m, q->n, q->ldd));
        cublasLtMatmulPreference_t pref;
        LK(cublasLtMatmulPreferenceCreate(&pref));
        uint64_t wsb = WS;
        uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE, al = 256;
        LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                &wsb, sizeof wsb));
        LK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                &scheme, sizeof scheme));
        cublasLtMatmulPreferenceAttributes_t als[] = {
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
        for (int a = 0; a < 4; a++)
            LK(cublasLtMatmulPreferenceSetAttribute(pref, als[a], &al, sizeof al));
        cublasLtMatmulHeuristicResult_t h[ALGOS];
        int found = 0;
        if (refused == CUBLAS_STATUS_SUCCESS)
            EPI(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, ld, ld, pref, ALGOS, h, &found));
#undef EPI
        if (refused != CUBLAS_STATUS_SUCCESS) {
            printf("%-22s refused: %s\n", q->name, cublasGetStatusName(refused));
            found = 0;
        }
        float first = -1, best = -1;
        int best_i = -1;
        for (int j = 0; j < found; j++) {
            if (h[j].state != CUBLAS_STATUS_SUCCESS || h[j].workspaceSize > WS) continue;
            float ms = time_algo(lt, op, A, la, B, lb, beta, D, ld, &h[j].algo, ws, st);
            if (j == 0) first = ms;
            if (ms > 0 && (best < 0 || ms < best)) best = ms, best_i = j;
        }
        double fl = 2.0 * q->m * q->n * (double)q->k;
        printf("%-22s %6d %6d %6d %5d %9.4f %9.4f %6d %4d %8.1f\n", q->name, q->m, q->n, q->k,
               q->per_step, first, best, best_i, found, first > 0 ? fl / (first * 1e9) : 0.0);
        int counted = q->alt ? 0 : q->per_step;
        if (first > 0) step_first += counted * first;
        if (best > 0) step_best += counted * best;
        flops_step += counted * fl;
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(la);
        cublasLtMatrixLayoutDestroy(lb);
        cublasLtMatrixLayoutDestroy(ld);
        cublasLtMatmulDescDestroy(op);
        CK(cudaFree(A));
        CK(cudaFree(B));
        CK(cudaFree(D));
        if (bias) CK(cudaFree(bias));
        if (aux) CK(cudaFree(aux));
    }
    printf("step (N %d, LM head rows %d): %.1f GFLOP; the heuristic's first %.3f ms "
           "(%.0f TFLOP/s), the best of up to %d %.3f ms (%.0f TFLOP/s)\n",
           N, R, flops_step / 1e9, step_first, flops_step / (step_first * 1e9), ALGOS,
           step_best, flops_step / (step_best * 1e9));
    return 0;
}
