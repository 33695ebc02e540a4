/* Point-wise activation ops: GELU (tanh form) forward and backward, the residual add and the
 * rounding of an fp32 tensor to the activation type (to_act).
 *
 * Shapes: flat arrays of n elements; tasks of DDP__CPU_CHUNK elements each. The per-element math
 * is kernels/math/gelu.h, shared with the CUDA backend. In bf16/fp16 mode a task widens its
 * chunk of each activation input into its thread's scratch (two chunks per thread), runs the
 * same loop and rounds its output on store (cpu.h); fp32 mode reads and writes in place.
 */
#include "kernels/cpu/cpu.h"

#include <string.h>

#include "kernels/math/gelu.h"

typedef struct {
    void *out;
    const void *a, *b;
    size_t n;
    ddp_kprec_t prec;
    ddp__tscratch_t s; /* 16-bit: 2 chunks per thread */
} pw_args_t;

static void chunk_range(size_t n, long task, size_t *lo, size_t *hi)
{
    *lo = (size_t)task * DDP__CPU_CHUNK;
    *hi = *lo + DDP__CPU_CHUNK < n ? *lo + DDP__CPU_CHUNK : n;
}

/* The calling thread's two scratch chunks (NULL in fp32 mode, which needs none). */
static float *tmp(const pw_args_t *p)
{
    return p->prec == DDP_KPREC_FP32 ? NULL : ddp__tscratch_mine(&p->s);
}

/* Runs fn's tasks over n elements, with per-thread scratch in 16-bit mode. */
static void run(ddp_kctx_t *ctx, pw_args_t *p, ddp__task_fn fn)
{
    p->prec = ctx->prec;
    if (p->prec != DDP_KPREC_FP32 && ddp__cpu_tscratch(ctx, &p->s, 2 * (size_t)DDP__CPU_CHUNK))
        return;
    ddp__pool_run(ctx->pool, ddp__ntasks(p->n, DDP__CPU_CHUNK), fn, p);
}

DDP_VECTOR_TASK(gelu_fwd_task)
{
    const pw_args_t *p = varg;
    size_t lo, hi;
    chunk_range(p->n, task, &lo, &hi);
    size_t m = hi - lo;
    float *t = tmp(p);
    const float *restrict inp = ddp__cpu_act_in(p->a, lo, m, p->prec, t);
    float *restrict out = ddp__cpu_act_out(p->out, lo, p->prec, t ? t + DDP__CPU_CHUNK : NULL);
    for (size_t i = 0; i < m; i++) out[i] = ddp_gelu(inp[i]);
    ddp__cpu_act_store(p->out, lo, out, m, p->prec);
}

void ddp__cpu_gelu_fwd(ddp_kctx_t *ctx, ddp_act_t *out, const ddp_act_t *inp, size_t n)
{
    pw_args_t p = {.out = out, .a = inp, .n = n};
    run(ctx, &p, gelu_fwd_task);
}

DDP_VECTOR_TASK(gelu_bwd_task)
{
    const pw_args_t *p = varg;
    size_t lo, hi;
    chunk_range(p->n, task, &lo, &hi);
    size_t m = hi - lo;
    float *t = tmp(p);
    const float *restrict inp = ddp__cpu_act_in(p->a, lo, m, p->prec, t);
    /* dinp may alias dout (in place in 16-bit mode too: the chunk is read before it is stored) */
    const float *dout = ddp__cpu_act_in(p->b, lo, m, p->prec, t ? t + DDP__CPU_CHUNK : NULL);
    float *dinp = ddp__cpu_act_out(p->out, lo, p->prec, t ? t + DDP__CPU_CHUNK : NULL);
    for (size_t i = 0; i < m; i++) dinp[i] = ddp_gelu_grad(inp[i]) * dout[i];
    ddp__cpu_act_store(p->out, lo, dinp, m, p->prec);
}

void ddp__cpu_gelu_bwd(ddp_kctx_t *ctx, ddp_act_t *dinp, const ddp_act_t *inp,
                       const ddp_act_t *dout, size_t n)
{
    pw_args_t p = {.out = dinp, .a = inp, .b = dout, .n = n};
    run(ctx, &p, gelu_bwd_task);
}

DDP_VECTOR_TASK(residual_task)
{
    const pw_args_t *p = varg;
    size_t lo, hi;
    chunk_range(p->n, task, &lo, &hi);
    ddp__cpu_residual(p->out, p->a, p->b, lo, hi - lo, p->prec, tmp(p)); /* out may alias a */
}

void ddp__cpu_residual_fwd(ddp_kctx_t *ctx, float *out, const float *a, const ddp_act_t *b,
                           size_t n)
{
    pw_args_t p = {.out = out, .a = a, .b = b, .n = n};
    run(ctx, &p, residual_task);
}

DDP_VECTOR_TASK(to_act_task)
{
    const pw_args_t *p = varg;
    size_t lo, hi;
    chunk_range(p->n, task, &lo, &hi);
    ddp__cpu_act_store(p->out, lo, (const float *)p->a + lo, hi - lo, p->prec);
}

void ddp__cpu_to_act(ddp_kctx_t *ctx, ddp_act_t *out, const float *inp, size_t n)
{
    pw_args_t p = {.out = out, .a = inp, .n = n, .prec = ctx->prec};
    ddp__pool_run(ctx->pool, ddp__ntasks(n, DDP__CPU_CHUNK), to_act_task, &p);
}
