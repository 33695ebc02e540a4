/* Reductions whose result goes to the host: sumsq (for the global gradient norm) and nonfinite.
 *
 * sumsq      *out = sum x[i]^2, accumulated in double. Stage 1: G = min(ceil(n / 2048), 1024)
 *            blocks of 256 threads, grid-stride, each block's sum in a fixed order into
 *            red[block]; stage 2: one block adds red[0..G) in order into red[G'] (G' = 1024).
 *            G depends only on n, so the result is bitwise reproducible for a given n.
 * nonfinite  *out = 1 if any x[i] is NaN or Inf, else 0 (a device flag, cleared first).
 * Both wait for the stream (the result is a host value) and copy through ctx's pinned buffer.
 * On a CUDA error *out is NaN (sumsq) or 1 (nonfinite), so a caller never trusts a bad value.
 */
#include "kernels/cuda/kcuda.cuh"

#define RED_THREADS 256

static __global__ void sumsq_stage1(double *red, const float *x, size_t n)
{
    __shared__ double sh[32];
    double s = 0.0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        double v = (double)x[i];
        s += v * v;
    }
    s = ddp__block_sum(s, sh);
    if (threadIdx.x == 0) red[blockIdx.x] = s;
}

static __global__ void sumsq_stage2(double *red, int parts)
{
    __shared__ double sh[32];
    double s = 0.0;
    for (int i = threadIdx.x; i < parts; i += blockDim.x) s += red[i];
    s = ddp__block_sum(s, sh);
    if (threadIdx.x == 0) red[DDP_CUDA_RED_BLOCKS] = s;
}

/* Copies `bytes` from device `src` to the pinned buffer and waits. */
static int fetch(ddp_kctx_t *ctx, const void *src, size_t bytes, const char *what)
{
    DDP_CHECK(ddp__cuda_check(ctx, cudaMemcpyAsync(ctx->pinned, src, bytes,
                                                   cudaMemcpyDeviceToHost, ctx->stream),
                              what));
    return ddp__cuda_check(ctx, cudaStreamSynchronize(ctx->stream), what);
}

void ddp__cuda_sumsq(ddp_kctx_t *ctx, double *out, const float *x, size_t n)
{
    *out = 0.0;
    if (n == 0) return;
    *out = NAN;
    if (ddp__cuda_enter(ctx)) return;
    size_t g = (n + 2047) / 2048;
    int parts = g > DDP_CUDA_RED_BLOCKS ? DDP_CUDA_RED_BLOCKS : (int)g;
    sumsq_stage1<<<(unsigned)parts, RED_THREADS, 0, ctx->stream>>>(ctx->red, x, n);
    if (ddp__cuda_launched(ctx, "sumsq")) return;
    sumsq_stage2<<<1, 1024, 0, ctx->stream>>>(ctx->red, parts);
    if (ddp__cuda_launched(ctx, "sumsq")) return;
    if (fetch(ctx, ctx->red + DDP_CUDA_RED_BLOCKS, sizeof(double), "sumsq")) return;
    *out = *(const double *)ctx->pinned;
}

static __global__ void nonfinite_kernel(int *flag, const float *x, size_t n)
{
    int bad = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        bad |= !isfinite(x[i]);
    if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

void ddp__cuda_nonfinite(ddp_kctx_t *ctx, int *out, const float *x, size_t n)
{
    *out = 0;
    if (n == 0) return;
    *out = 1;
    if (ddp__cuda_enter(ctx)) return;
    if (ddp__cuda_check(ctx, cudaMemsetAsync(ctx->flag, 0, sizeof(int), ctx->stream),
                        "nonfinite"))
        return;
    nonfinite_kernel<<<ddp__grid(n, DDP_CUDA_BLOCK), DDP_CUDA_BLOCK, 0, ctx->stream>>>(ctx->flag,
                                                                                     x, n);
    if (ddp__cuda_launched(ctx, "nonfinite")) return;
    if (fetch(ctx, ctx->flag, sizeof(int), "nonfinite")) return;
    *out = *(const int *)ctx->pinned != 0;
}
