/* Mixed precision on the GPU: the run's activation type (set_precision) and the weights'
 * 16-bit copies that the products multiply (matmul.cu).
 *
 * Activations are already of the run's type (kernels.h), so the products read them as they
 * are; only the fp32 weights are rounded, to nearest even as the CPU does (kernels/math/lowp.h,
 * through to_act), once per set_precision, into one copy of set_weights' arena (a weight outside
 * it: a copy kept per weight pointer): 2 bytes per weight element more. adamw on the arena
 * writes the copy of what it updates in the same pass (pointwise.cu), so a trainer's step
 * converts nothing apart.
 */
#include "kernels/cuda/kcuda.cuh"
#include "kernels/weight_arena.h"

struct ddp__cuda_wcopy {
    const float *src;
    size_t n;
    void *copy; /* device, n 16-bit elements */
    int valid;  /* converted since the last set_precision */
};

/* Frees p (NULL: nothing) once the work queued on the stream, which may still read it, is done:
 * an explicit wait, not cudaFree's implicit one. Returns 0 or the error (recorded in ctx). */
static int free_after_stream(ddp_kctx_t *ctx, void *p, const char *what)
{
    if (!p) return 0;
    int rc = ddp__cuda_check(ctx, cudaStreamSynchronize(ctx->stream), "cudaStreamSynchronize");
    int rc2 = ddp__cuda_check(ctx, cudaFree(p), what);
    return rc ? rc : rc2;
}

cudaDataType_t ddp__cuda_lowp_type(const ddp_kctx_t *ctx)
{
    return ctx->prec == DDP_KPREC_BF16 ? CUDA_R_16BF : CUDA_R_16F;
}

/* The copy entry of w[0..n) (NULL: none yet). */
static struct ddp__cuda_wcopy *find_copy(ddp_kctx_t *ctx, const float *w, size_t n)
{
    for (int i = 0; i < ctx->n_wcopies; i++)
        if (ctx->wcopies[i].src == w && ctx->wcopies[i].n == n) return &ctx->wcopies[i];
    return NULL;
}

const void *ddp__cuda_lowp_weight(ddp_kctx_t *ctx, const float *w, size_t n)
{
    size_t off = 0; /* w's elements from the start of the copy */
    if (ddp__arena_slice(ctx->arena, ctx->arena_n, w, n, &off)) {
        w = ctx->arena;
        n = ctx->arena_n;
    }
    struct ddp__cuda_wcopy *c = find_copy(ctx, w, n);
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
        ddp__cuda_to_act(ctx, (ddp_act_t *)c->copy, w, n);
        c->valid = 1;
    }
    return (const char *)c->copy + off * 2;
}

void *ddp__cuda_lowp_kept(ddp_kctx_t *ctx, const float *param)
{
    if (ctx->prec == DDP_KPREC_FP32 || !ctx->arena || param != ctx->arena) return NULL;
    struct ddp__cuda_wcopy *c = find_copy(ctx, ctx->arena, ctx->arena_n);
    return c && c->valid ? c->copy : NULL;
}

/* Host-side state, as set_precision's: the copies dropped are freed after their readers. */
void ddp__cuda_set_weights(ddp_kctx_t *ctx, const float *w, size_t n)
{
    if (ddp__cuda_enter(ctx)) return;
    ddp__cuda_lowp_free(ctx);
    ctx->arena = w;
    ctx->arena_n = n;
}

void ddp__cuda_lowp_free(ddp_kctx_t *ctx)
{
    for (int i = 0; i < ctx->n_wcopies; i++)
        free_after_stream(ctx, ctx->wcopies[i].copy, "cudaFree(weight copy)");
    free(ctx->wcopies);
    ctx->wcopies = NULL;
    ctx->n_wcopies = ctx->cap_wcopies = 0;
}

/* Host-side state only: ops are launched in order on one stream, each with the type it was
 * queued under, so stream order keeps every op with its precision. */
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
    if (prec == DDP_KPREC_FP16 && major < 8) {
        *why = "16-bit attention (the flash kernels' mma.sync m16n8k16) needs compute capability "
               "8.0 or newer";
        return 0;
    }
    *why = "the GPU multiplies bf16/fp16 on tensor cores (cuBLASLt, fp32 accumulation)";
    return 1;
}
