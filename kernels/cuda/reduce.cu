/* Reductions whose results go to the host: sumsq_blocks (for the global gradient norm) and
 * nonfinite.
 *
 * sumsq_blocks  out[j] = sum of x[i]^2 over block j, accumulated in double: one thread block of
 *               256 threads per data block (grid-stride beyond DDP_CUDA_MAX_GRID), each thread
 *               summing a fixed stride, then a fixed-order block sum; written to scratch as float
 *               and copied to the host. Bitwise reproducible, whatever n or the block's place.
 * nonfinite     *out = 1 if any x[i] is NaN or Inf, else 0 (a device flag, cleared first; copied
 *               through ctx's pinned buffer).
 * Both wait for the stream (the results are host values). On a CUDA error the results are NaN
 * (sumsq_blocks) or 1 (nonfinite), so a caller never trusts a bad value.
 */
#include "kernels/cuda/kcuda.cuh"

#define RED_THREADS 256

static __global__ void sumsq_blocks_kernel(float *out, const float *x, size_t n, size_t block,
                                           size_t nb)
{
    __shared__ double sh[32];
    for (size_t j = blockIdx.x; j < nb; j += gridDim.x) {
        size_t lo = j * block, hi = lo + block < n ? lo + block : n;
        double s = 0.0;
        for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
            double v = (double)x[i];
            s += v * v;
        }
        s = ddp__block_sum(s, sh); /* synchronises before reusing sh */
        if (threadIdx.x == 0) out[j] = (float)s;
    }
}

/* Copies `bytes` from device `src` to the pinned buffer and waits. */
static int fetch(ddp_kctx_t *ctx, const void *src, size_t bytes, const char *what)
{
    DDP_CHECK(ddp__cuda_check(ctx, cudaMemcpyAsync(ctx->pinned, src, bytes,
                                                   cudaMemcpyDeviceToHost, ctx->stream),
                              what));
    return ddp__cuda_check(ctx, cudaStreamSynchronize(ctx->stream), what);
}

void ddp__cuda_sumsq_blocks(ddp_kctx_t *ctx, float *out, const float *x, size_t n, size_t block)
{
    if (n == 0 || block == 0) return;
    size_t nb = (n + block - 1) / block;
    for (size_t j = 0; j < nb; j++) out[j] = NAN;
    float *dev;
    if (ddp__cuda_enter(ctx) || ddp__cuda_scratch(ctx, nb * sizeof(float), (void **)&dev)) return;
    unsigned grid = nb > DDP_CUDA_MAX_GRID ? DDP_CUDA_MAX_GRID : (unsigned)nb;
    sumsq_blocks_kernel<<<grid, RED_THREADS, 0, ctx->stream>>>(dev, x, n, block, nb);
    if (ddp__cuda_launched(ctx, "sumsq_blocks")) return;
    if (ddp__cuda_check(ctx, cudaMemcpyAsync(out, dev, nb * sizeof(float),
                                             cudaMemcpyDeviceToHost, ctx->stream),
                        "sumsq_blocks"))
        return;
    ddp__cuda_check(ctx, cudaStreamSynchronize(ctx->stream), "sumsq_blocks");
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
