/* Mixed precision on the GPU: matmul inputs converted to bf16 or fp16 (round to nearest even,
 * the CPU's rounding: kernels/math/lowp.h) and multiplied by cublasGemmEx on tensor cores with
 * fp32 accumulation and fp32 output (matmul.cu).
 *
 * Weights are converted once per set_precision (the trainer calls it after each update) into a
 * copy kept per weight pointer: 2 bytes per weight element more. Activations and gradients are
 * converted per product into two grow-only slots.
 * Limits: n < 2^31 * grid-stride (no practical limit).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/kcuda.cuh"
#include "kernels/math/lowp.h"

struct ddp__cuda_wcopy {
    const float *src;
    size_t n;
    void *copy; /* device, n 16-bit elements */
    int valid;  /* converted since the last set_precision */
};

static __global__ void to_bf16_kernel(uint16_t *out, const float *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = ddp_bf16_bits(x[i]);
}

static __global__ void to_fp16_kernel(__half *out, const float *x, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2half_rn(x[i]); /* round to nearest even; overflow gives Inf */
}

/* Frees p (NULL: nothing) once the work queued on the stream, which may still read it, is done:
 * an explicit wait, not cudaFree's implicit one. Returns 0 or the error (recorded in ctx). */
static int free_after_stream(ddp_kctx_t *ctx, void *p, const char *what)
{
    if (!p) return 0;
    int rc = ddp__cuda_check(ctx, cudaStreamSynchronize(ctx->stream), "cudaStreamSynchronize");
    int rc2 = ddp__cuda_check(ctx, cudaFree(p), what);
    return rc ? rc : rc2;
}

static void convert(ddp_kctx_t *ctx, void *out, const float *x, size_t n)
{
    if (ctx->prec == DDP_KPREC_BF16)
        to_bf16_kernel<<<ddp__grid(n, DDP_CUDA_BLOCK), DDP_CUDA_BLOCK, 0, ctx->stream>>>(
            (uint16_t *)out, x, n);
    else
        to_fp16_kernel<<<ddp__grid(n, DDP_CUDA_BLOCK), DDP_CUDA_BLOCK, 0, ctx->stream>>>(
            (__half *)out, x, n);
    ddp__cuda_launched(ctx, "matmul input conversion");
}

cudaDataType_t ddp__cuda_lowp_type(const ddp_kctx_t *ctx)
{
    return ctx->prec == DDP_KPREC_BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

const void *ddp__cuda_lowp_input(ddp_kctx_t *ctx, int slot, const float *x, size_t n)
{
    if (n > ctx->lowp_in_n[slot]) {
        void *p = NULL;
        if (free_after_stream(ctx, ctx->lowp_in[slot], "cudaFree(matmul inputs)")) return NULL;
        ctx->lowp_in[slot] = NULL;
        ctx->lowp_in_n[slot] = 0;
        if (ddp__cuda_check(ctx, cudaMalloc(&p, n * 2), "cudaMalloc(matmul inputs)")) return NULL;
        ctx->lowp_in[slot] = p;
        ctx->lowp_in_n[slot] = n;
    }
    convert(ctx, ctx->lowp_in[slot], x, n);
    return ctx->lowp_in[slot];
}

const void *ddp__cuda_lowp_weight(ddp_kctx_t *ctx, const float *w, size_t n)
{
    struct ddp__cuda_wcopy *c = NULL;
    for (int i = 0; i < ctx->n_wcopies && !c; i++)
        if (ctx->wcopies[i].src == w && ctx->wcopies[i].n == n) c = &ctx->wcopies[i];
    if (!c) {
        if (ctx->n_wcopies == ctx->cap_wcopies) {
            int cap = ctx->cap_wcopies ? 2 * ctx->cap_wcopies : 64;
            void *t = realloc(ctx->wcopies, (size_t)cap * sizeof *c);
            if (!t) {
                if (!ctx->err) ctx->err = DDP_ENOMEM;
                return NULL;
            }
            ctx->wcopies = (struct ddp__cuda_wcopy *)t;
            ctx->cap_wcopies = cap;
        }
        void *p = NULL;
        if (ddp__cuda_check(ctx, cudaMalloc(&p, n * 2), "cudaMalloc(weight copy)")) return NULL;
        c = &ctx->wcopies[ctx->n_wcopies++];
        c->src = w;
        c->n = n;
        c->copy = p;
        c->valid = 0;
    }
    if (!c->valid) {
        convert(ctx, c->copy, w, n);
        c->valid = 1;
    }
    return c->copy;
}

void ddp__cuda_lowp_free(ddp_kctx_t *ctx)
{
    for (int i = 0; i < ctx->n_wcopies; i++)
        free_after_stream(ctx, ctx->wcopies[i].copy, "cudaFree(weight copy)");
    free(ctx->wcopies);
    ctx->wcopies = NULL;
    ctx->n_wcopies = ctx->cap_wcopies = 0;
    for (int s = 0; s < 2; s++) {
        free_after_stream(ctx, ctx->lowp_in[s], "cudaFree(matmul inputs)");
        ctx->lowp_in[s] = NULL;
        ctx->lowp_in_n[s] = 0;
    }
}

/* Host-side state only: later conversions are queued after earlier products, so stream order
 * keeps each product with the precision it was queued under. */
void ddp__cuda_set_precision(ddp_kctx_t *ctx, ddp_kprec_t prec)
{
    if (prec != DDP_KPREC_FP32 && prec != DDP_KPREC_BF16 && prec != DDP_KPREC_FP16) {
        if (!ctx->err) ctx->err = DDP_EINVAL;
        return;
    }
    if (prec != ctx->prec) {
        if (ddp__cuda_enter(ctx)) return;
        ddp__cuda_lowp_free(ctx); /* copies of another type, freed after their readers */
    }
    ctx->prec = prec;
    for (int i = 0; i < ctx->n_wcopies; i++) ctx->wcopies[i].valid = 0;
}

int ddp__cuda_prec_native(ddp_kctx_t *ctx, ddp_kprec_t prec, const char **why)
{
    int major = 0;
    if (prec == DDP_KPREC_FP32) {
        *why = "fp32 is always native";
        return 1;
    }
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ctx->device) !=
        cudaSuccess) {
        cudaGetLastError();
        *why = "the GPU's compute capability could not be read";
        return 0;
    }
    if (prec == DDP_KPREC_BF16 && major < 8) {
        *why = "bf16 tensor cores need compute capability 8.0 or newer";
        return 0;
    }
    if (prec == DDP_KPREC_FP16 && major < 7) {
        *why = "fp16 tensor cores need compute capability 7.0 or newer";
        return 0;
    }
    *why = "the GPU multiplies bf16/fp16 on tensor cores (cublasGemmEx, fp32 accumulation)";
    return 1;
}
