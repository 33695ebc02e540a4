/* Linear layers with cuBLAS (fp32 cublasSgemm; TF32 only when the context enabled it).
 *
 * Row-major tensors are handed to column-major cuBLAS as their transposes: a row-major [R, K]
 * matrix is a column-major [K, R] one with leading dimension K.
 *
 * forward   out[N,OC] = inp[N,C] @ W (+ bias[OC])
 *             DDP_W_IN_OUT  W[C,OC]:  out^T = W^T-view @ inp^T   gemm(N, N, OC, N, C)
 *             DDP_W_OUT_IN  W[OC,C]:  out^T = W-view^T @ inp^T   gemm(T, N, OC, N, C)
 *           bias added by a grid-stride kernel over N*OC.
 * backward  dinp[N,C] += dout @ W^T         (beta = 1)
 *           dweight    += inp^T @ dout in W's layout (beta = 1)
 *           dbias[OC]  += colsum(dout)      deterministic two-stage column sum (kcuda.cuh)
 * Mixed precision (ctx->prec bf16/fp16, lowp.cu): the same products by cublasGemmEx on the
 * converted inputs (bf16 or fp16 A and B, fp32 C, CUBLAS_COMPUTE_32F: fp32 accumulation on
 * tensor cores); bias and dbias stay fp32 (dbias from the fp32 dout).
 * Limits: N, C, OC < 2^31 (cuBLAS ints).
 */
#include "kernels/cuda/kcuda.cuh"

static __global__ void bias_add_kernel(float *out, const float *bias, int OC, size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] += bias[i % (size_t)OC];
}

/* C = op(A) @ op(B) in cuBLAS's column-major terms, with fp32 or low-precision A and B. */
static cublasStatus_t gemm(ddp_kctx_t *ctx, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const void *A, int lda, const void *B, int ldb,
                           float beta, float *C, int ldc)
{
    const float one = 1.0f;
    if (ctx->prec == DDP_KPREC_FP32)
        return cublasSgemm(ctx->blas, ta, tb, m, n, k, &one, (const float *)A, lda,
                           (const float *)B, ldb, &beta, C, ldc);
    cudaDataType_t t = ddp__cuda_lowp_type(ctx);
    return cublasGemmEx(ctx->blas, ta, tb, m, n, k, &one, A, t, lda, B, t, ldb, &beta, C,
                        CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

void ddp__cuda_matmul_fwd(ddp_kctx_t *ctx, float *out, const float *inp, const float *weight,
                          const float *bias, int N, int C, int OC, ddp_wlayout_t layout)
{
    if (N <= 0 || C <= 0 || OC <= 0 || ddp__cuda_enter(ctx)) return;
    const void *A = weight, *B = inp;
    if (ctx->prec != DDP_KPREC_FP32) {
        A = ddp__cuda_lowp_weight(ctx, weight, (size_t)C * OC);
        B = ddp__cuda_lowp_input(ctx, 0, inp, (size_t)N * C);
        if (!A || !B) return;
    }
    cublasStatus_t s;
    if (layout == DDP_W_IN_OUT)
        s = gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_N, OC, N, C, A, OC, B, C, 0.0f, out, OC);
    else
        s = gemm(ctx, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, A, C, B, C, 0.0f, out, OC);
    if (ddp__cublas_check(ctx, s, "matmul_fwd")) return;
    if (bias) {
        size_t total = (size_t)N * OC;
        bias_add_kernel<<<ddp__grid(total, DDP_CUDA_BLOCK), DDP_CUDA_BLOCK, 0, ctx->stream>>>(
            out, bias, OC, total);
        ddp__cuda_launched(ctx, "matmul_fwd(bias)");
    }
}

struct dout_value {
    const float *dout;
    int OC;
    __device__ void operator()(int n, int c, float v[1]) const { v[0] = dout[(size_t)n * OC + c]; }
};

void ddp__cuda_matmul_bwd(ddp_kctx_t *ctx, float *dinp, float *dweight, float *dbias,
                          const float *dout, const float *inp, const float *weight, int N, int C,
                          int OC, ddp_wlayout_t layout)
{
    if (N <= 0 || C <= 0 || OC <= 0 || ddp__cuda_enter(ctx)) return;
    const void *W = weight, *D = dout, *X = inp;
    if (ctx->prec != DDP_KPREC_FP32) {
        D = ddp__cuda_lowp_input(ctx, 0, dout, (size_t)N * OC);
        if (dweight) X = ddp__cuda_lowp_input(ctx, 1, inp, (size_t)N * C);
        if (dinp) W = ddp__cuda_lowp_weight(ctx, weight, (size_t)C * OC);
        if (!D || !X || !W) return;
    }
    cublasStatus_t s;
    if (dinp) {
        if (layout == DDP_W_IN_OUT) /* dinp^T[C,N] = W[C,OC] @ dout^T; W's view is [OC,C] */
            s = gemm(ctx, CUBLAS_OP_T, CUBLAS_OP_N, C, N, OC, W, OC, D, OC, 1.0f, dinp, C);
        else /* W[OC,C] is viewed as W^T[C,OC] */
            s = gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, W, C, D, OC, 1.0f, dinp, C);
        if (ddp__cublas_check(ctx, s, "matmul_bwd(dinp)")) return;
    }
    if (dweight) {
        if (layout == DDP_W_IN_OUT) /* dW^T[OC,C] += dout^T @ inp */
            s = gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_T, OC, C, N, D, OC, X, C, 1.0f, dweight, OC);
        else /* dW^T[C,OC] += inp^T @ dout */
            s = gemm(ctx, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, X, C, D, OC, 1.0f, dweight, C);
        if (ddp__cublas_check(ctx, s, "matmul_bwd(dweight)")) return;
    }
    if (dbias) {
        dout_value f = {dout, OC};
        ddp__colsum<1>(ctx, dbias, NULL, N, OC, f, "matmul_bwd(dbias)");
    }
}
