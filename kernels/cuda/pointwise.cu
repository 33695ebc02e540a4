/* Elementwise ops: GELU (kernels/math/gelu.h), residual add, y += x, x *= s, and AdamW
 * (kernels/math/adamw.h).
 *
 * gelu_fwd   out[n] = gelu(inp[n])
 * gelu_bwd   dinp[n] += gelu'(inp[n]) * dout[n]
 * residual   out[n] = a[n] + b[n]            (out may alias a or b)
 * add        y[n] += x[n]
 * scale      x[n] *= s
 * adamw      param, m, v updated in place from grad * grad_scale; the bias corrections
 *            1 - beta^t are computed once on the host, in double.
 * All are grid-stride loops over a size_t n with 256-thread blocks and at most
 * DDP_CUDA_MAX_GRID blocks; n == 0 queues nothing.
 */
#include "kernels/cuda/kcuda.cuh"
#include "kernels/math/adamw.h"
#include "kernels/math/gelu.h"

#define GRID_STRIDE(i, n)                                                                     \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);                   \
         i += (size_t)gridDim.x * blockDim.x)

#define LAUNCH(kernel, n, what, ...)                                                          \
    do {                                                                                      \
        if ((n) == 0 || ddp__cuda_enter(ctx)) return;                                         \
        kernel<<<ddp__grid((n), DDP_CUDA_BLOCK), DDP_CUDA_BLOCK, 0, ctx->stream>>>(          \
            __VA_ARGS__);                                                                     \
        ddp__cuda_launched(ctx, what);                                                        \
    } while (0)

static __global__ void gelu_fwd_kernel(float *out, const float *inp, size_t n)
{
    GRID_STRIDE(i, n) out[i] = ddp_gelu(inp[i]);
}

void ddp__cuda_gelu_fwd(ddp_kctx_t *ctx, float *out, const float *inp, size_t n)
{
    LAUNCH(gelu_fwd_kernel, n, "gelu_fwd", out, inp, n);
}

static __global__ void gelu_bwd_kernel(float *dinp, const float *inp, const float *dout, size_t n)
{
    GRID_STRIDE(i, n) dinp[i] += ddp_gelu_grad(inp[i]) * dout[i];
}

void ddp__cuda_gelu_bwd(ddp_kctx_t *ctx, float *dinp, const float *inp, const float *dout,
                        size_t n)
{
    LAUNCH(gelu_bwd_kernel, n, "gelu_bwd", dinp, inp, dout, n);
}

static __global__ void residual_kernel(float *out, const float *a, const float *b, size_t n)
{
    GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

void ddp__cuda_residual_fwd(ddp_kctx_t *ctx, float *out, const float *a, const float *b, size_t n)
{
    LAUNCH(residual_kernel, n, "residual_fwd", out, a, b, n);
}

static __global__ void add_kernel(float *y, const float *x, size_t n)
{
    GRID_STRIDE(i, n) y[i] += x[i];
}

void ddp__cuda_add(ddp_kctx_t *ctx, float *y, const float *x, size_t n)
{
    LAUNCH(add_kernel, n, "add", y, x, n);
}

static __global__ void scale_kernel(float *x, float s, size_t n)
{
    GRID_STRIDE(i, n) x[i] *= s;
}

void ddp__cuda_scale(ddp_kctx_t *ctx, float *x, float s, size_t n)
{
    LAUNCH(scale_kernel, n, "scale", x, s, n);
}

/* AdamW in one launch over every range: the ranges are cut on the host into tiles of at most
 * ADAMW_TILE elements, one thread block each (a small tensor is one tile; the largest, many). */
#define ADAMW_TILE 65536

struct adamw_tile {
    size_t lo, hi;
    float wd;
};

static __global__ void adamw_kernel(float *param, const float *grad, float *m, float *v,
                                    const adamw_tile *tiles, float lr, float beta1, float beta2,
                                    float eps, float grad_scale, float bc1, float bc2)
{
    adamw_tile tl = tiles[blockIdx.x];
    for (size_t i = tl.lo + threadIdx.x; i < tl.hi; i += blockDim.x) {
        float p = param[i], mm = m[i], vv = v[i];
        ddp_adamw_elem(&p, &mm, &vv, grad[i] * grad_scale, lr, beta1, beta2, eps, tl.wd, bc1,
                       bc2);
        param[i] = p;
        m[i] = mm;
        v[i] = vv;
    }
}

void ddp__cuda_adamw(ddp_kctx_t *ctx, float *param, const float *grad, float *m, float *v,
                     const ddp_kadamw_range_t *ranges, int nranges, float lr, float beta1,
                     float beta2, float eps, float grad_scale, int t, uint32_t *crc)
{
    if (crc) { /* host-side checksums of device memory are not offered (kernels.h) */
        DDP_ERROR("cuda: adamw: CRC32C of the outputs is a CPU-backend feature");
        if (!ctx->err) ctx->err = DDP_ENOTSUP;
        return;
    }
    size_t ntiles = 0;
    for (int r = 0; r < nranges; r++)
        ntiles += (ranges[r].hi - ranges[r].lo + ADAMW_TILE - 1) / ADAMW_TILE;
    if (ntiles == 0 || ddp__cuda_enter(ctx)) return;
    adamw_tile *tiles = (adamw_tile *)malloc(ntiles * sizeof *tiles);
    if (!tiles) {
        if (!ctx->err) ctx->err = DDP_ENOMEM;
        return;
    }
    size_t k = 0;
    for (int r = 0; r < nranges; r++)
        for (size_t lo = ranges[r].lo; lo < ranges[r].hi; lo += ADAMW_TILE)
            tiles[k++] = {lo, lo + ADAMW_TILE < ranges[r].hi ? lo + ADAMW_TILE : ranges[r].hi,
                          ranges[r].wd};
    /* In double, as PyTorch (and the CPU backend) compute them. */
    float bc1 = (float)(1.0 - pow((double)beta1, (double)t));
    float bc2 = (float)(1.0 - pow((double)beta2, (double)t));
    void *dev;
    /* the table goes through the scratch; cudaMemcpyAsync from pageable memory has read it
     * when it returns, so it is freed at once */
    if (ddp__cuda_scratch(ctx, ntiles * sizeof *tiles, &dev) == 0 &&
        ddp__cuda_check(ctx, cudaMemcpyAsync(dev, tiles, ntiles * sizeof *tiles,
                                             cudaMemcpyHostToDevice, ctx->stream),
                        "adamw(tiles)") == 0) {
        adamw_kernel<<<(unsigned)ntiles, DDP_CUDA_BLOCK, 0, ctx->stream>>>(
            param, grad, m, v, (const adamw_tile *)dev, lr, beta1, beta2, eps, grad_scale, bc1,
            bc2);
        ddp__cuda_launched(ctx, "adamw");
    }
    free(tiles);
}
