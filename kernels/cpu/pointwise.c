/* Point-wise activation ops: GELU (tanh form) forward and backward, and the residual add.
 *
 * Shapes: flat arrays of n elements; tasks of DDP__CPU_CHUNK elements each. The per-element math
 * is kernels/math/gelu.h, shared with the CUDA backend.
 */
#include "kernels/cpu/cpu.h"

#include <string.h>

#include "kernels/math/gelu.h"

typedef struct {
    float *out;
    const float *a, *b;
    size_t n;
} pw_args_t;

static void chunk_range(size_t n, long task, size_t *lo, size_t *hi)
{
    *lo = (size_t)task * DDP__CPU_CHUNK;
    *hi = *lo + DDP__CPU_CHUNK < n ? *lo + DDP__CPU_CHUNK : n;
}

static void gelu_fwd_task(void *varg, long task)
{
    const pw_args_t *p = varg;
    size_t lo, hi;
    chunk_range(p->n, task, &lo, &hi);
    float *restrict out = p->out;
    const float *restrict inp = p->a;
    for (size_t i = lo; i < hi; i++) out[i] = ddp_gelu(inp[i]);
}

void ddp__cpu_gelu_fwd(ddp_kctx_t *ctx, ddp_act_t *out, const ddp_act_t *inp, size_t n)
{
    pw_args_t p = {.out = (float *)out, .a = (const float *)inp, .n = n};
    ddp__pool_run(ctx->pool, ddp__ntasks(n, DDP__CPU_CHUNK), gelu_fwd_task, &p);
}

static void gelu_bwd_task(void *varg, long task)
{
    const pw_args_t *p = varg;
    size_t lo, hi;
    chunk_range(p->n, task, &lo, &hi);
    float *dinp = p->out; /* may alias dout */
    const float *restrict inp = p->a;
    const float *dout = p->b;
    for (size_t i = lo; i < hi; i++) dinp[i] = ddp_gelu_grad(inp[i]) * dout[i];
}

void ddp__cpu_gelu_bwd(ddp_kctx_t *ctx, ddp_act_t *dinp, const ddp_act_t *inp,
                       const ddp_act_t *dout, size_t n)
{
    pw_args_t p = {.out = (float *)dinp, .a = (const float *)inp, .b = (const float *)dout,
                   .n = n};
    ddp__pool_run(ctx->pool, ddp__ntasks(n, DDP__CPU_CHUNK), gelu_bwd_task, &p);
}

static void residual_task(void *varg, long task)
{
    const pw_args_t *p = varg;
    size_t lo, hi;
    chunk_range(p->n, task, &lo, &hi);
    /* out may alias a or b, so no restrict here: each element is read before it is written. */
    for (size_t i = lo; i < hi; i++) p->out[i] = p->a[i] + p->b[i];
}

void ddp__cpu_residual_fwd(ddp_kctx_t *ctx, float *out, const float *a, const ddp_act_t *b,
                           size_t n)
{
    pw_args_t p = {.out = out, .a = a, .b = (const float *)b, .n = n};
    ddp__pool_run(ctx->pool, ddp__ntasks(n, DDP__CPU_CHUNK), residual_task, &p);
}

void ddp__cpu_to_act(ddp_kctx_t *ctx, ddp_act_t *out, const float *inp, size_t n)
{
    if (n) memmove(out, inp, n * sizeof(float)); /* fp32 only, for now */
}
