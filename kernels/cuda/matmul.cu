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
 * Limits: N, C, OC < 2^31 (cuBLAS ints).
 */
#include "kernels/cuda/kcuda.cuh"

static __global__ void bias_add_kernel(float *out, const float *bias, int OC, size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] += bias[i % (size_t)OC];
}

void ddp__cuda_matmul_fwd(ddp_kctx_t *ctx, float *out, const float *inp, const float *weight,
                          const float *bias, int N, int C, int OC, ddp_wlayout_t layout)
{
    if (N <= 0 || C <= 0 || OC <= 0 || ddp__cuda_enter(ctx)) return;
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s;
    if (layout == DDP_W_IN_OUT)
        s = cublasSgemm(ctx->blas, CUBLAS_OP_N, CUBLAS_OP_N, OC, N, C, &one, weight, OC, inp, C,
                        &zero, out, OC);
    else
        s = cublasSgemm(ctx->blas, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, weight, C, inp, C,
                        &zero, out, OC);
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
    const float one = 1.0f;
    cublasStatus_t s;
    if (dinp) {
        if (layout == DDP_W_IN_OUT) /* dinp^T[C,N] = W[C,OC] @ dout^T; W's view is [OC,C] */
            s = cublasSgemm(ctx->blas, CUBLAS_OP_T, CUBLAS_OP_N, C, N, OC, &one, weight, OC,
                            dout, OC, &one, dinp, C);
        else /* W[OC,C] is viewed as W^T[C,OC] */
            s = cublasSgemm(ctx->blas, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, weight, C,
                            dout, OC, &one, dinp, C);
        if (ddp__cublas_check(ctx, s, "matmul_bwd(dinp)")) return;
    }
    if (dweight) {
        if (layout == DDP_W_IN_OUT) /* dW^T[OC,C] += dout^T @ inp */
            s = cublasSgemm(ctx->blas, CUBLAS_OP_N, CUBLAS_OP_T, OC, C, N, &one, dout, OC, inp,
                            C, &one, dweight, OC);
        else /* dW^T[C,OC] += inp^T @ dout */
            s = cublasSgemm(ctx->blas, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, inp, C, dout,
                            OC, &one, dweight, C);
        if (ddp__cublas_check(ctx, s, "matmul_bwd(dweight)")) return;
    }
    if (dbias) {
        dout_value f = {dout, OC};
        ddp__colsum<1>(ctx, dbias, NULL, N, OC, f, "matmul_bwd(dbias)");
    }
}
