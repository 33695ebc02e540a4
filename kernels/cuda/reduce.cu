/* Reductions whose results go to the host: sumsq_blocks (for the global gradient norm) and
 * nonfinite.
 *
 * sumsq_blocks  the blocks of every range in one launch: one thread block of 256 threads per
 *               data block (grid-stride beyond DDP_CUDA_MAX_GRID; a block finds its range in
 *               the table of the ranges' first blocks), each thread summing a fixed stride in
 *               double, then a fixed-order block sum; written to scratch as float, copied to
 *               the host in one copy and one wait. Bitwise reproducible, whatever the ranges or
 *               the block's place.
 * nonfinite     *out = 1 if any x[i] is NaN or Inf, else 0 (a device flag, cleared first; copied
 *               through ctx's pinned buffer).
 * Both wait for the stream (the results are host values). On a CUDA error the results are NaN
 * (sumsq_blocks) or 1 (nonfinite), so a caller never trusts a bad value.
 */
#include <string.h>

#include "kernels/cuda/kcuda.cuh"

#define RED_THREADS 256

/* One range on the device: its elements [lo, hi) and the index of its first block among all. */
struct sumsq_range {
    size_t lo, hi, first;
};

static __global__ void sumsq_blocks_kernel(float *out, const float *x, const sumsq_range *r,
                                           int nranges, size_t block, size_t nb)
{
    __shared__ double sh[32];
    for (size_t j = blockIdx.x; j < nb; j += gridDim.x) {
        int k = 0;
        while (k + 1 < nranges && r[k + 1].first <= j) k++;
        size_t lo = r[k].lo + (j - r[k].first) * block;
        size_t hi = lo + block < r[k].hi ? lo + block : r[k].hi;
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

void ddp__cuda_sumsq_blocks(ddp_kctx_t *ctx, float *out, const float *x,
                            const ddp_krange_t *ranges, int nranges, size_t block)
{
    if (nranges <= 0 || block == 0) return;
    sumsq_range *table = (sumsq_range *)malloc((size_t)nranges * sizeof *table);
    if (!table) {
        if (!ctx->err) ctx->err = DDP_ENOMEM;
        return;
    }
    size_t nb = 0;
    int used = 0;
    for (int r = 0; r < nranges; r++) {
        size_t n = ranges[r].hi - ranges[r].lo, b = (n + block - 1) / block;
        for (size_t j = 0; j < b; j++) out[ranges[r].out + j] = NAN;
        if (b) table[used++] = {ranges[r].lo, ranges[r].hi, nb};
        nb += b;
    }
    float *host = (float *)malloc((nb ? nb : 1) * sizeof *host);
    size_t tbytes = ((size_t)used * sizeof *table + 255) / 256 * 256;
    char *dev = NULL;
    if (!host) {
        if (!ctx->err) ctx->err = DDP_ENOMEM;
    } else if (nb > 0 && ddp__cuda_enter(ctx) == 0 &&
               ddp__cuda_scratch(ctx, tbytes + nb * sizeof(float), (void **)&dev) == 0 &&
               ddp__cuda_check(ctx, cudaMemcpyAsync(dev, table, (size_t)used * sizeof *table,
                                                    cudaMemcpyHostToDevice, ctx->stream),
                               "sumsq_blocks(ranges)") == 0) {
        float *res = (float *)(dev + tbytes);
        unsigned grid = nb > DDP_CUDA_MAX_GRID ? DDP_CUDA_MAX_GRID : (unsigned)nb;
        sumsq_blocks_kernel<<<grid, RED_THREADS, 0, ctx->stream>>>(
            res, x, (const sumsq_range *)dev, used, block, nb);
        if (ddp__cuda_launched(ctx, "sumsq_blocks") == 0 &&
            ddp__cuda_check(ctx, cudaMemcpyAsync(host, res, nb * sizeof(float),
                                                 cudaMemcpyDeviceToHost, ctx->stream),
                            "sumsq_blocks") == 0 &&
            ddp__cuda_check(ctx, cudaStreamSynchronize(ctx->stream), "sumsq_blocks") == 0) {
            /* the results in range order, to each range's place in out */
            for (int r = 0, k = 0; r < nranges; r++) {
                size_t b = (ranges[r].hi - ranges[r].lo + block - 1) / block;
                if (b) memcpy(out + ranges[r].out, host + table[k++].first, b * sizeof(float));
            }
        }
    }
    free(host);
    free(table);
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
