/* SwiGLU (Llama's MLP), forward and backward; the per-element math is kernels/math/swiglu.h,
 * shared with the CUDA backend.
 *
 * inp[N,2H]: row n holds the gate product g = inp[n, 0:H], then the up product u = inp[n, H:2H];
 * out[N,H] = silu(g) u. Backward overwrites dinp[N,2H] (dg, then du) from dout[N,H].
 * Tasks are blocks of max(1, DDP__CPU_CHUNK / H) rows (a function of the shape only, so the
 * result does not depend on the thread count; each element is one task's).
 * Activations: in bf16/fp16 mode a task widens a row's inputs into its thread's scratch (bwd: 5H
 * floats, fwd 3H), runs the same loop and rounds its outputs once on store (cpu.h).
 */
#include "kernels/cpu/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "kernels/math/swiglu.h"

/* Flush-to-zero and denormals-are-zero on this thread for one task, restored after. Why: gcc
 * vectorises silu(g) = g / (1 + e^-g) by computing, for every lane, the value of each of
 * ddp_expf_approx's clamped regions too and blending; the region of -g > 88.4 has the constant
 * sigmoid 3.9e-39, a denormal, so every lane's speculative g x 3.9e-39 is a denormal product and
 * each vector takes a microcode assist: 6-7x slower than GELU over the same elements, a third
 * of a SmolLM2-135M step on the CPU. The blended-away lanes are the only denormals for
 * |g| < 88 (an actual silu(g) below 1.2e-38 in magnitude needs g in (-3e-38, 3e-38) or
 * g < -88.4), so results are those of the exact arithmetic but for denormal inputs and outputs,
 * which become 0. A no-op elsewhere than x86. */
typedef struct {
    unsigned csr;
} ftz_t;

static ftz_t ftz_begin(void)
{
    ftz_t f = {0};
#if defined(__x86_64__) || defined(__i386__)
    f.csr = _mm_getcsr();
    _mm_setcsr(f.csr | 0x8040); /* FTZ (bit 15) | DAZ (bit 6) */
#endif
    return f;
}

static void ftz_end(ftz_t f)
{
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr(f.csr);
#else
    (void)f;
#endif
}

typedef struct {
    ddp_act_t *out; /* out (fwd) or dinp (bwd) */
    const ddp_act_t *inp, *dout;
    int N, H, rows; /* rows per task */
    ddp_kprec_t prec;
    ddp__tscratch_t s;
} sw_args_t;

DDP_VECTOR_TASK(sw_fwd_task)
{
    const sw_args_t *a = varg;
    size_t H = (size_t)a->H;
    int lo = (int)task * a->rows, hi = lo + a->rows < a->N ? lo + a->rows : a->N;
    float *t = a->prec == DDP_KPREC_FP32 ? NULL : ddp__tscratch_mine(&a->s);
    ftz_t f = ftz_begin();
    for (int r = lo; r < hi; r++) {
        const float *restrict in = ddp__cpu_act_in(a->inp, (size_t)r * 2 * H, 2 * H, a->prec, t);
        float *restrict y = ddp__cpu_act_out(a->out, (size_t)r * H, a->prec, t ? t + 2 * H : NULL);
        for (size_t i = 0; i < H; i++) y[i] = ddp_swiglu(in[i], in[H + i]);
        ddp__cpu_act_store(a->out, (size_t)r * H, y, H, a->prec);
    }
    ftz_end(f);
}

DDP_VECTOR_TASK(sw_bwd_task)
{
    const sw_args_t *a = varg;
    size_t H = (size_t)a->H;
    int lo = (int)task * a->rows, hi = lo + a->rows < a->N ? lo + a->rows : a->N;
    float *t = a->prec == DDP_KPREC_FP32 ? NULL : ddp__tscratch_mine(&a->s);
    ftz_t f = ftz_begin();
    for (int r = lo; r < hi; r++) {
        const float *restrict in = ddp__cpu_act_in(a->inp, (size_t)r * 2 * H, 2 * H, a->prec, t);
        const float *restrict dy =
            ddp__cpu_act_in(a->dout, (size_t)r * H, H, a->prec, t ? t + 2 * H : NULL);
        float *restrict dx =
            ddp__cpu_act_out(a->out, (size_t)r * 2 * H, a->prec, t ? t + 3 * H : NULL);
        for (size_t i = 0; i < H; i++) ddp_swiglu_grad(in[i], in[H + i], dy[i], &dx[i], &dx[H + i]);
        ddp__cpu_act_store(a->out, (size_t)r * 2 * H, dx, 2 * H, a->prec);
    }
    ftz_end(f);
}

/* Runs fn over the rows, with `per` floats of scratch a row per thread in 16-bit mode. */
static void run(ddp_kctx_t *ctx, sw_args_t *a, size_t per, ddp__task_fn fn)
{
    a->prec = ctx->prec;
    a->rows = a->H >= DDP__CPU_CHUNK ? 1 : DDP__CPU_CHUNK / a->H;
    if (a->prec != DDP_KPREC_FP32 && ddp__cpu_tscratch(ctx, &a->s, per * (size_t)a->H)) return;
    ddp__pool_run(ctx->pool, ddp__ntasks((size_t)a->N, (size_t)a->rows), fn, a);
}

void ddp__cpu_swiglu_fwd(ddp_kctx_t *ctx, ddp_act_t *out, const ddp_act_t *inp, int N, int H)
{
    sw_args_t a = {.out = out, .inp = inp, .N = N, .H = H};
    run(ctx, &a, 3, sw_fwd_task);
}

void ddp__cpu_swiglu_bwd(ddp_kctx_t *ctx, ddp_act_t *dinp, const ddp_act_t *inp,
                         const ddp_act_t *dout, int N, int H)
{
    sw_args_t a = {.out = dinp, .inp = inp, .dout = dout, .N = N, .H = H};
    run(ctx, &a, 5, sw_bwd_task);
}
