/* Mixed precision on the CPU: matmul inputs rounded to bf16 or fp16 (kernels/math/lowp.h), then
 * multiplied by the fp32 sgemm of matmul.c -- exactly the low-precision product with fp32
 * accumulation, since products of rounded values are exact in fp32.
 *
 * Why emulation and no native bf16 kernel (measured on the 2-vCPU AMD EPYC (Zen 3, AVX2, no
 * AVX-512) this was written on; ../shared/research/cpu-gemm.md has a Zen 5 with AVX512_BF16):
 * oneDNN 2.6 (Debian's libdnnl) refuses a bf16 matmul on an AVX2-only CPU (dnnl_unimplemented),
 * and its fp32 matmul (gemm:jit) was no faster than ddpd's OpenBLAS tiles on GPT-2 124M's
 * shapes: one step's products (forward + backward, 12 layers + LM head), 2 threads, 3 rounds
 * alternating the libraries on a machine at load 7-10: CPU time 2.57 s (ddpd, OpenBLAS's
 * autodetected Zen kernels) vs 2.66 s (oneDNN) vs 2.48 s (OPENBLAS_CORETYPE=Haswell), medians,
 * +-6% between rounds; wall time too noisy there to rank them (ddpd/oneDNN 0.80-1.02 per
 * round). tests/bench/gemm_shapes.c measures it. So the CPU backend keeps OpenBLAS for every
 * precision and reports bf16 as not native (train.precision "auto" then picks fp32 on the CPU).
 * On this CPU OpenBLAS picks its real kernels without OPENBLAS_CORETYPE. A CPU with AVX512_BF16
 * or AMX would want oneDNN's bf16 brgemm (../shared/research/cpu-gemm.md: ~2x its fp32): not
 * built, since no such CPU was at hand to test it.
 *
 * Rounded weights are cached: one copy per weight pointer, filled on first use after
 * set_precision and reused by every product until the next set_precision (the trainer calls it
 * after each update), so each weight is converted once per step. The copies cost one more fp32
 * copy of the matrix weights. Rounding is element-wise in fixed chunks: thread-independent.
 */
#include "kernels/cpu/cpu.h"

#include <stdlib.h>

#include "common/alloc.h"
#include "common/err.h"
#include "kernels/math/lowp.h"

struct ddp__wcopy {
    const float *src;
    size_t n;
    float *copy;
    int valid; /* filled since the last set_precision */
};

typedef struct {
    float *out;
    const float *x;
    size_t n;
    ddp_kprec_t prec;
} round_args_t;

static void round_task(void *varg, long task)
{
    const round_args_t *a = varg;
    size_t lo = (size_t)task * DDP__CPU_CHUNK;
    size_t hi = lo + DDP__CPU_CHUNK < a->n ? lo + DDP__CPU_CHUNK : a->n;
    float *restrict o = a->out;
    const float *restrict x = a->x;
    if (a->prec == DDP_KPREC_BF16)
        for (size_t i = lo; i < hi; i++) o[i] = ddp_round_bf16(x[i]);
    else
        for (size_t i = lo; i < hi; i++) o[i] = ddp_round_fp16(x[i]);
}

static void round_into(ddp_kctx_t *ctx, float *out, const float *x, size_t n)
{
    round_args_t a = {.out = out, .x = x, .n = n, .prec = ctx->prec};
    ddp__pool_run(ctx->pool, ddp__ntasks(n, DDP__CPU_CHUNK), round_task, &a);
}

static void fail(ddp_kctx_t *ctx, int rc)
{
    if (!ctx->err) ctx->err = rc;
}

const float *ddp__cpu_lowp_input(ddp_kctx_t *ctx, int slot, const float *x, size_t n)
{
    if (n > ctx->lowp_in_n[slot]) {
        float *p = ddp_aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
        if (!p) {
            fail(ctx, DDP_ENOMEM);
            return NULL;
        }
        free(ctx->lowp_in[slot]);
        ctx->lowp_in[slot] = p;
        ctx->lowp_in_n[slot] = n;
    }
    round_into(ctx, ctx->lowp_in[slot], x, n);
    return ctx->lowp_in[slot];
}

const float *ddp__cpu_lowp_weight(ddp_kctx_t *ctx, const float *w, size_t n)
{
    struct ddp__wcopy *c = NULL;
    for (int i = 0; i < ctx->n_wcopies && !c; i++)
        if (ctx->wcopies[i].src == w && ctx->wcopies[i].n == n) c = &ctx->wcopies[i];
    if (!c) {
        if (ctx->n_wcopies == ctx->cap_wcopies) {
            int cap = ctx->cap_wcopies ? 2 * ctx->cap_wcopies : 64;
            struct ddp__wcopy *t = realloc(ctx->wcopies, (size_t)cap * sizeof *t);
            if (!t) {
                fail(ctx, DDP_ENOMEM);
                return NULL;
            }
            ctx->wcopies = t;
            ctx->cap_wcopies = cap;
        }
        float *p = ddp_aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
        if (!p) {
            fail(ctx, DDP_ENOMEM);
            return NULL;
        }
        c = &ctx->wcopies[ctx->n_wcopies++];
        *c = (struct ddp__wcopy){.src = w, .n = n, .copy = p, .valid = 0};
    }
    if (!c->valid) {
        round_into(ctx, c->copy, w, n);
        c->valid = 1;
    }
    return c->copy;
}

void ddp__cpu_lowp_free(ddp_kctx_t *ctx)
{
    for (int i = 0; i < ctx->n_wcopies; i++) free(ctx->wcopies[i].copy);
    free(ctx->wcopies);
    ctx->wcopies = NULL;
    ctx->n_wcopies = ctx->cap_wcopies = 0;
    for (int s = 0; s < 2; s++) {
        free(ctx->lowp_in[s]);
        ctx->lowp_in[s] = NULL;
        ctx->lowp_in_n[s] = 0;
    }
}

void ddp__cpu_set_precision(ddp_kctx_t *ctx, ddp_kprec_t prec)
{
    if (prec != DDP_KPREC_FP32 && prec != DDP_KPREC_BF16 && prec != DDP_KPREC_FP16) {
        fail(ctx, DDP_EINVAL);
        return;
    }
    if (prec != ctx->prec) ddp__cpu_lowp_free(ctx); /* copies of another precision */
    ctx->prec = prec;
    for (int i = 0; i < ctx->n_wcopies; i++) ctx->wcopies[i].valid = 0;
}

int ddp__cpu_prec_native(ddp_kctx_t *ctx, ddp_kprec_t prec, const char **why)
{
    if (prec == DDP_KPREC_FP32) {
        *why = "fp32 is the CPU's native precision";
        return 1;
    }
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx512bf16")) {
        *why = "this CPU has AVX512_BF16, but the CPU backend emulates bf16/fp16 products "
               "(inputs rounded, OpenBLAS sgemm): correct, not faster than fp32";
        return 0;
    }
#endif
    *why = "this CPU has no bf16 instructions (no AVX512_BF16/AMX); the CPU backend emulates "
           "bf16/fp16 products (inputs rounded, OpenBLAS sgemm): correct, not faster than fp32";
    return 0;
}
