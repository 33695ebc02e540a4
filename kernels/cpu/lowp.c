/* Mixed precision on the CPU: storing activation tensors (bf16/fp16 bits, rounded once), and
 * the matrix products' operands for matmul.c, which multiplies them one of two ways.
 * - Native bf16 (CPUs with AVX512_BF16 or AMX, oneDNN; bf16_gemm.c): the activations' bf16 bits
 *   are the operands as they are, the weights converted to bf16 bits (round to nearest even);
 *   products with fp32 accumulation in the CPU's bf16 dot-product instructions: about twice
 *   fp32's speed. `auto` picks it.
 * - Emulated (every other CPU, fp16 everywhere, or DDP_CPU_BF16=emulate): the activations
 *   widened to fp32 (exact) into an input slot, the weights rounded to the precision but kept as
 *   fp32 (kernels/math/lowp.h), then the fp32 sgemm -- exactly the low-precision product with
 *   fp32 accumulation, since products of 16-bit values are exact in fp32. Correct, not faster
 *   than fp32: oneDNN 2.6 (Debian) has no bf16 matmul on AVX2-only CPUs, and no fp16 matmul without AVX512_FP16; its fp32 was no faster than OpenBLAS's tiles
 *   (measured on a 2-vCPU AMD EPYC Zen 3, GPT-2 124M's products: 2.66 s of CPU time against
 *   2.48-2.57 s; tests/bench/gemm_shapes.c).
 * The two give the same products up to the order of the fp32 additions.
 *
 * Converted weights are cached: one copy of set_weights' arena (or, for a weight outside it, one
 * per weight pointer), filled on first use after set_precision and reused by every product until
 * the next set_precision. adamw on the arena writes the copy of what it updates in the same
 * pass (vector.c, through ddp__cpu_lowp_round), so a trainer's step converts nothing apart. The
 * copies cost half (bf16) or one (emulated) more fp32 copy of the weights; the emulated path's
 * input slots one fp32 copy of a product's inputs (the LM head's backward: dout [N, V] widened,
 * 4 N V bytes, a transient twice the 16-bit logits). Conversion is element-wise in fixed chunks:
 * thread-independent.
 */
#include "kernels/cpu/cpu.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "common/vector_isa.h"
#include "kernels/math/lowp.h"
#include "kernels/weight_arena.h"

struct ddp__wcopy {
    const float *src;
    size_t n;
    void *copy; /* n elements of elem_size(ctx) */
    int valid;  /* filled since the last set_precision */
};

typedef struct {
    const ddp_kctx_t *ctx;
    void *out;
    const void *x;
    size_t n;
    ddp_kprec_t prec;
} conv_args_t;

static size_t elem_size(const ddp_kctx_t *ctx)
{
    return ddp__cpu_native(ctx) ? sizeof(uint16_t) : sizeof(float);
}

/* x[0..n) into copy from element i0: bf16 bits (native products) or rounded floats. */
DDP_VECTOR_FN(round_copy,
              (void *copy, size_t i0, const float *x, size_t n, int bits, ddp_kprec_t prec),
              (copy, i0, x, n, bits, prec))
{
    uint16_t *restrict b = (uint16_t *)copy + i0;
    float *restrict o = (float *)copy + i0;
    if (bits)
        for (size_t i = 0; i < n; i++) b[i] = ddp_bf16_bits(x[i]);
    else if (prec == DDP_KPREC_BF16)
        for (size_t i = 0; i < n; i++) o[i] = ddp_round_bf16(x[i]);
    else
        for (size_t i = 0; i < n; i++) o[i] = ddp_round_fp16(x[i]);
}

void ddp__cpu_lowp_round(const ddp_kctx_t *ctx, void *copy, size_t i0, const float *x, size_t n)
{
    round_copy(copy, i0, x, n, ddp__cpu_native(ctx), ctx->prec);
}

void ddp__cpu_act_store(ddp_act_t *x, size_t i0, const float *src, size_t n, ddp_kprec_t prec)
{
    ddp_act_from_f32(ddp_act_at(x, i0, prec), src, n, prec);
}

static void chunk_of(size_t n, long task, size_t *lo, size_t *hi)
{
    *lo = (size_t)task * DDP__CPU_CHUNK;
    *hi = *lo + DDP__CPU_CHUNK < n ? *lo + DDP__CPU_CHUNK : n;
}

/* A weight's chunk: bf16 bits for the native products, else rounded floats. */
static void round_task(void *varg, long task)
{
    const conv_args_t *a = varg;
    size_t lo, hi;
    chunk_of(a->n, task, &lo, &hi);
    ddp__cpu_lowp_round(a->ctx, a->out, lo, (const float *)a->x + lo, hi - lo);
}

static void round_into(ddp_kctx_t *ctx, void *out, const float *x, size_t n)
{
    conv_args_t a = {.ctx = ctx, .out = out, .x = x, .n = n, .prec = ctx->prec};
    ddp__pool_run(ctx->pool, ddp__ntasks(n, DDP__CPU_CHUNK), round_task, &a);
}

static void widen_task(void *varg, long task)
{
    const conv_args_t *a = varg;
    size_t lo, hi;
    chunk_of(a->n, task, &lo, &hi);
    ddp_act_to_f32((float *)a->out + lo, ddp_act_at(a->x, lo, a->prec), hi - lo, a->prec);
}

static void fail(ddp_kctx_t *ctx, int rc)
{
    if (!ctx->err) ctx->err = rc;
}

const float *ddp__cpu_widen_input(ddp_kctx_t *ctx, int slot, const ddp_act_t *x, size_t n)
{
    size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    if (bytes > ctx->wide_in_bytes[slot]) {
        float *p = ddp_aligned_alloc(64, bytes);
        if (!p) {
            fail(ctx, DDP_ENOMEM);
            return NULL;
        }
        free(ctx->wide_in[slot]);
        ctx->wide_in[slot] = p;
        ctx->wide_in_bytes[slot] = bytes;
    }
    conv_args_t a = {.out = ctx->wide_in[slot], .x = x, .n = n, .prec = ctx->prec};
    ddp__pool_run(ctx->pool, ddp__ntasks(n, DDP__CPU_CHUNK), widen_task, &a);
    return ctx->wide_in[slot];
}

/* The copy entry of w[0..n) (NULL: none yet). */
static struct ddp__wcopy *find_copy(ddp_kctx_t *ctx, const float *w, size_t n)
{
    for (int i = 0; i < ctx->n_wcopies; i++)
        if (ctx->wcopies[i].src == w && ctx->wcopies[i].n == n) return &ctx->wcopies[i];
    return NULL;
}

const void *ddp__cpu_lowp_weight(ddp_kctx_t *ctx, const float *w, size_t n)
{
    size_t off = 0; /* w's elements from the start of the copy */
    if (ddp__arena_slice(ctx->arena, ctx->arena_n, w, n, &off)) {
        w = ctx->arena;
        n = ctx->arena_n;
    }
    struct ddp__wcopy *c = find_copy(ctx, w, n);
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
        void *p = ddp_aligned_alloc(64, (n * elem_size(ctx) + 63) / 64 * 64);
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
    return (const char *)c->copy + off * elem_size(ctx);
}

void *ddp__cpu_lowp_kept(ddp_kctx_t *ctx, const float *param)
{
    if (ctx->prec == DDP_KPREC_FP32 || !ctx->arena || param != ctx->arena) return NULL;
    struct ddp__wcopy *c = find_copy(ctx, ctx->arena, ctx->arena_n);
    return c && c->valid ? c->copy : NULL;
}

void ddp__cpu_set_weights(ddp_kctx_t *ctx, const float *w, size_t n)
{
    ddp__cpu_lowp_free(ctx);
    ctx->arena = w;
    ctx->arena_n = n;
}

void ddp__cpu_lowp_free(ddp_kctx_t *ctx)
{
    for (int i = 0; i < ctx->n_wcopies; i++) free(ctx->wcopies[i].copy);
    free(ctx->wcopies);
    ctx->wcopies = NULL;
    ctx->n_wcopies = ctx->cap_wcopies = 0;
    for (int s = 0; s < 2; s++) {
        free(ctx->wide_in[s]);
        ctx->wide_in[s] = NULL;
        ctx->wide_in_bytes[s] = 0;
    }
}

void ddp__cpu_set_precision(ddp_kctx_t *ctx, ddp_kprec_t prec)
{
    if (prec != DDP_KPREC_FP32 && prec != DDP_KPREC_BF16 && prec != DDP_KPREC_FP16) {
        fail(ctx, DDP_EINVAL);
        return;
    }
    const char *why;
    if (prec == DDP_KPREC_BF16 && !ctx->bf16 && !ctx->bf16_failed &&
        ddp_kernels_cpu_bf16(&why)) {
        int rc = ddp__bf16_new(&ctx->bf16, ctx->threads);
        if (rc < 0) {
            DDP_WARN("native bf16 products unavailable (%s): emulating them", ddp_strerror(rc));
            ctx->bf16_failed = 1;
        }
    }
    if (prec != ctx->prec) ddp__cpu_lowp_free(ctx); /* copies of another precision or kind */
    ctx->prec = prec;
    for (int i = 0; i < ctx->n_wcopies; i++) ctx->wcopies[i].valid = 0;
}

int ddp__cpu_prec_native(ddp_kctx_t *ctx, ddp_kprec_t prec, const char **why)
{
    if (prec == DDP_KPREC_FP32) {
        *why = "fp32 is the CPU's native precision";
        return 1;
    }
    if (prec == DDP_KPREC_FP16) {
        *why = "the CPU backend emulates fp16 products (inputs rounded, OpenBLAS sgemm): "
               "correct, not faster than fp32";
        return 0;
    }
    if (ctx->bf16_failed) {
        *why = "the native bf16 path failed to start (see the warning): bf16 products are "
               "emulated, correct but not faster than fp32";
        return 0;
    }
    return ddp_kernels_cpu_bf16(why);
}
