/* Element-wise ops over whole arenas: AdamW (with an optional CRC32C of its outputs, and the
 * weights' 16-bit copy kept current), sums of squares, add, scale, non-finite check.
 *
 * Each op cuts [0, n) into tasks of DDP__CPU_CHUNK elements (sumsq_blocks: of whole blocks), so
 * the work and, for the reductions, the partial sums are the same whatever the thread count.
 * The loops are written so that gcc vectorises them, in the CPU's widest vectors (DDP_VECTOR_FN).
 */
#include "kernels/cpu/cpu.h"

#include <math.h>
#include <string.h>

#include "common/crc32c.h"
#include "kernels/math/adamw.h"

/* ---- AdamW ---- */

_Static_assert(DDP__CPU_CHUNK == DDP_ADAMW_CRC_CHUNK, "one adamw task is one CRC chunk");

typedef struct {
    float *param, *m, *v;
    const float *grad;
    size_t n;
    float lr, beta1, beta2, eps, wd, grad_scale, bc1, bc2;
    uint32_t *crc; /* NULL, or 3 per task */
    const ddp_kctx_t *ctx;
    void *copy;    /* NULL, or the arena's 16-bit copy, kept current (lowp.c) */
    size_t copy_lo; /* this range's first element in it */
} adamw_args_t;

/* The update of elements [lo, hi); the per-element math is the CUDA kernel's
 * (kernels/math/adamw.h). */
DDP_VECTOR_FN(adamw_range, (const adamw_args_t *a, size_t lo, size_t hi), (a, lo, hi))
{
    float *restrict p = a->param;
    float *restrict m = a->m;
    float *restrict v = a->v;
    const float *restrict g = a->grad;
    for (size_t i = lo; i < hi; i++)
        ddp_adamw_elem(&p[i], &m[i], &v[i], g[i] * a->grad_scale, a->lr, a->beta1, a->beta2,
                       a->eps, a->wd, a->bc1, a->bc2);
}

/* Elements per block of an update that checksums what it writes: the block's 3 x 2 KiB of
 * outputs are still in L1 when the three crc32 chains read them, and the chains run in the
 * shadow of the next block's loads (see ddp_crc32c_update3). */
#define ADAMW_CRC_BLOCK 512

static void adamw_task(void *varg, long task)
{
    const adamw_args_t *a = varg;
    size_t lo = (size_t)task * DDP__CPU_CHUNK;
    size_t hi = lo + DDP__CPU_CHUNK < a->n ? lo + DDP__CPU_CHUNK : a->n;
    if (!a->crc) {
        adamw_range(a, lo, hi);
        /* the weights' 16-bit copy of the chunk, while the chunk is still in cache */
        if (a->copy) ddp__cpu_lowp_round(a->ctx, a->copy, a->copy_lo + lo, a->param + lo, hi - lo);
        return;
    }
    uint32_t crc[3] = {0, 0, 0};
    for (size_t b = lo; b < hi; b += ADAMW_CRC_BLOCK) {
        size_t e = b + ADAMW_CRC_BLOCK < hi ? b + ADAMW_CRC_BLOCK : hi;
        adamw_range(a, b, e);
        const void *out[3] = {a->param + b, a->m + b, a->v + b};
        ddp_crc32c_update3(crc, out, (e - b) * sizeof(float));
        if (a->copy) ddp__cpu_lowp_round(a->ctx, a->copy, a->copy_lo + b, a->param + b, e - b);
    }
    memcpy(&a->crc[3 * task], crc, sizeof crc);
}

void ddp__cpu_adamw(ddp_kctx_t *ctx, float *param, const float *grad, float *m, float *v,
                    const ddp_kadamw_range_t *ranges, int nranges, float lr, float beta1,
                    float beta2, float eps, float grad_scale, int t, uint32_t *crc)
{
    /* The bias corrections in double, as PyTorch computes them (Python floats). */
    float bc1 = (float)(1.0 - pow((double)beta1, (double)t));
    float bc2 = (float)(1.0 - pow((double)beta2, (double)t));
    void *copy = ddp__cpu_lowp_kept(ctx, param);
    for (int r = 0; r < nranges; r++) { /* tasks cut from each range's start: its CRC chunks */
        size_t lo = ranges[r].lo, n = ranges[r].hi - lo;
        adamw_args_t a = {
            .crc = crc, .param = param + lo, .m = m + lo, .v = v + lo, .grad = grad + lo,
            .n = n, .lr = lr, .beta1 = beta1, .beta2 = beta2, .eps = eps, .wd = ranges[r].wd,
            .grad_scale = grad_scale, .bc1 = bc1, .bc2 = bc2, .ctx = ctx, .copy = copy,
            .copy_lo = lo,
        };
        ddp__pool_run(ctx->pool, ddp__ntasks(n, DDP__CPU_CHUNK), adamw_task, &a);
        if (crc) crc += 3 * ddp__ntasks(n, DDP__CPU_CHUNK);
    }
}

/* ---- sums of squares of blocks ---- */

#define SUMSQ_LANES 8

typedef struct {
    float *out;
    const float *x;
    size_t n, block, per_task; /* blocks per task */
} sumsq_args_t;

/* SUMSQ_LANES floats and doubles as gcc vectors: the partial sums stay in registers (as an
 * array, gcc kept them on the stack: a store and a load in every iteration's chain, 10 GB/s). */
typedef float sumsq_vf __attribute__((vector_size(SUMSQ_LANES * sizeof(float))));
typedef double sumsq_vd __attribute__((vector_size(SUMSQ_LANES * sizeof(double))));

/* sum x[i]^2 over [lo, hi) in double, SUMSQ_LANES interleaved partial sums added at the end */
DDP_VECTOR_INLINE double sumsq(const float *restrict x, size_t lo, size_t hi)
{
    sumsq_vd lanes = {0};
    size_t i = lo;
    for (; i + SUMSQ_LANES <= hi; i += SUMSQ_LANES) {
        sumsq_vf f;
        memcpy(&f, x + i, sizeof f);
        sumsq_vd d = __builtin_convertvector(f, sumsq_vd);
        lanes += d * d;
    }
    double acc[SUMSQ_LANES];
    memcpy(acc, &lanes, sizeof acc);
    for (int j = 0; i < hi; i++, j++) acc[j] += (double)x[i] * (double)x[i];
    double s = 0.0;
    for (int j = 0; j < SUMSQ_LANES; j++) s += acc[j];
    return s;
}

DDP_VECTOR_TASK(sumsq_task)
{
    const sumsq_args_t *a = varg;
    size_t nb = (a->n + a->block - 1) / a->block;
    size_t first = (size_t)task * a->per_task;
    size_t end = first + a->per_task < nb ? first + a->per_task : nb;
    for (size_t j = first; j < end; j++) {
        size_t lo = j * a->block, hi = lo + a->block < a->n ? lo + a->block : a->n;
        a->out[j] = (float)sumsq(a->x, lo, hi);
    }
}

void ddp__cpu_sumsq_blocks(ddp_kctx_t *ctx, float *out, const float *x,
                           const ddp_krange_t *ranges, int nranges, size_t block)
{
    for (int r = 0; r < nranges && block > 0; r++) {
        size_t n = ranges[r].hi - ranges[r].lo;
        if (n == 0) continue;
        sumsq_args_t a = {.out = out + ranges[r].out, .x = x + ranges[r].lo, .n = n,
                          .block = block,
                          .per_task = block >= DDP__CPU_CHUNK ? 1 : DDP__CPU_CHUNK / block};
        size_t nb = (n + block - 1) / block;
        ddp__pool_run(ctx->pool, (long)((nb + a.per_task - 1) / a.per_task), sumsq_task, &a);
    }
}

/* ---- add, scale ---- */

typedef struct {
    float *y;
    const float *x;
    float s;
    size_t n;
} axpy_args_t;

DDP_VECTOR_TASK(add_task)
{
    const axpy_args_t *a = varg;
    size_t lo = (size_t)task * DDP__CPU_CHUNK;
    size_t hi = lo + DDP__CPU_CHUNK < a->n ? lo + DDP__CPU_CHUNK : a->n;
    float *restrict y = a->y;
    const float *restrict x = a->x;
    for (size_t i = lo; i < hi; i++) y[i] += x[i];
}

void ddp__cpu_add(ddp_kctx_t *ctx, float *y, const float *x, size_t n)
{
    axpy_args_t a = {.y = y, .x = x, .n = n};
    ddp__pool_run(ctx->pool, ddp__ntasks(n, DDP__CPU_CHUNK), add_task, &a);
}

DDP_VECTOR_TASK(scale_task)
{
    const axpy_args_t *a = varg;
    size_t lo = (size_t)task * DDP__CPU_CHUNK;
    size_t hi = lo + DDP__CPU_CHUNK < a->n ? lo + DDP__CPU_CHUNK : a->n;
    float *restrict y = a->y;
    for (size_t i = lo; i < hi; i++) y[i] *= a->s;
}

void ddp__cpu_scale(ddp_kctx_t *ctx, float *x, float s, size_t n)
{
    axpy_args_t a = {.y = x, .s = s, .n = n};
    ddp__pool_run(ctx->pool, ddp__ntasks(n, DDP__CPU_CHUNK), scale_task, &a);
}

/* ---- non-finite check ---- */

typedef struct {
    const float *x;
    size_t n;
    int found; /* written as 1 by any task that finds one; a benign same-value race */
} nonfinite_args_t;

DDP_VECTOR_TASK(nonfinite_task)
{
    nonfinite_args_t *a = varg;
    size_t lo = (size_t)task * DDP__CPU_CHUNK;
    size_t hi = lo + DDP__CPU_CHUNK < a->n ? lo + DDP__CPU_CHUNK : a->n;
    const float *restrict x = a->x;
    uint32_t bad = 0;
    for (size_t i = lo; i < hi; i++) {
        uint32_t u;
        memcpy(&u, &x[i], sizeof(u));
        /* NaN or Inf: all exponent bits set. Branch-free so that it vectorises. */
        bad |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
    }
    if (bad) __atomic_store_n(&a->found, 1, __ATOMIC_RELAXED);
}

void ddp__cpu_nonfinite(ddp_kctx_t *ctx, int *out, const float *x, size_t n)
{
    nonfinite_args_t a = {.x = x, .n = n, .found = 0};
    ddp__pool_run(ctx->pool, ddp__ntasks(n, DDP__CPU_CHUNK), nonfinite_task, &a);
    *out = __atomic_load_n(&a.found, __ATOMIC_RELAXED);
}
