/* Rotary position embedding (Llama), forward and backward, in place on qkv's q and k heads;
 * the math is kernels/math/rope.h.
 *
 * qkv[B,T,(NH + 2 NKV) hs]: per position NH query heads, then NKV key heads, then NKV value
 * heads (untouched); rope[T, hs/2, 2] holds the table's cos and sin. Tasks are blocks of
 * ROPE_ROWS positions (b, t); every element belongs to one position, so no two tasks share one
 * and the result does not depend on the thread count. Backward is the same loop with the sine
 * negated (the inverse rotation).
 * Activations: in bf16/fp16 mode a task widens a position's (NH + NKV) hs rotated elements into
 * its thread's scratch, rotates them there and rounds them once on store (cpu.h).
 */
#include "kernels/cpu/cpu.h"

#include "kernels/math/rope.h"

#define ROPE_ROWS 64

typedef struct {
    ddp_act_t *qkv;
    const float *rope;
    int B, T, NH, NKV, hs;
    float sign; /* 1 forward, -1 backward */
    ddp_kprec_t prec;
    ddp__tscratch_t s; /* 16-bit: a position's q and k heads per thread */
} rope_args_t;

DDP_VECTOR_TASK(rope_task)
{
    const rope_args_t *a = varg;
    int hs = a->hs, half = hs / 2, heads = a->NH + a->NKV;
    size_t row = (size_t)(a->NH + 2 * a->NKV) * hs, n = (size_t)heads * hs;
    long BT = (long)a->B * a->T, lo = task * ROPE_ROWS;
    long hi = lo + ROPE_ROWS < BT ? lo + ROPE_ROWS : BT;
    float *tmp = a->prec == DDP_KPREC_FP32 ? NULL : ddp__tscratch_mine(&a->s);
    for (long r = lo; r < hi; r++) {
        const float *restrict cs = a->rope + (size_t)(r % a->T) * hs;
        float *x = ddp__cpu_act_out(a->qkv, (size_t)r * row, a->prec, tmp);
        if (tmp) ddp_act_to_f32(tmp, ddp_act_at(a->qkv, (size_t)r * row, a->prec), n, a->prec);
        for (int h = 0; h < heads; h++) {
            float *restrict x0 = x + (size_t)h * hs, *restrict x1 = x0 + half;
            for (int i = 0; i < half; i++)
                ddp_rope_rotate(x0[i], x1[i], cs[2 * i], a->sign * cs[2 * i + 1], &x0[i], &x1[i]);
        }
        ddp__cpu_act_store(a->qkv, (size_t)r * row, x, n, a->prec);
    }
}

static void rope(ddp_kctx_t *ctx, ddp_act_t *qkv, const float *table, int B, int T, int NH,
                 int NKV, int hs, float sign)
{
    rope_args_t a = {.qkv = qkv, .rope = table, .B = B, .T = T, .NH = NH, .NKV = NKV, .hs = hs,
                     .sign = sign, .prec = ctx->prec};
    if (a.prec != DDP_KPREC_FP32 &&
        ddp__cpu_tscratch(ctx, &a.s, (size_t)(NH + NKV) * (size_t)hs))
        return;
    ddp__pool_run(ctx->pool, ddp__ntasks((size_t)B * T, ROPE_ROWS), rope_task, &a);
}

void ddp__cpu_rope_fwd(ddp_kctx_t *ctx, ddp_act_t *qkv, const float *table, int B, int T, int NH,
                       int NKV, int hs)
{
    rope(ctx, qkv, table, B, T, NH, NKV, hs, 1.0f);
}

void ddp__cpu_rope_bwd(ddp_kctx_t *ctx, ddp_act_t *dqkv, const float *table, int B, int T,
                       int NH, int NKV, int hs)
{
    rope(ctx, dqkv, table, B, T, NH, NKV, hs, -1.0f);
}
