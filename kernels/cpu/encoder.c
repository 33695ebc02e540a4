/* Token + position embedding, forward and backward.
 *
 * Forward: out[B,T,C] = wte[inp[b,t]] + wpe[t] (wpe NULL: wte's row alone); tasks are blocks
 * of rows (b,t).
 * Backward: dwte[V,C] += scatter(dout), dwpe[T,C] += sum_b dout; either may be NULL (skipped).
 * Two positions may hold the same token, so rows of dwte are not owned by one (b,t): tasks own
 * blocks of columns instead and walk every (b,t) in order, so each dwte/dwpe element is summed
 * by one task in a fixed order.
 */
#include "kernels/cpu/cpu.h"

#define ENC_ROWS 64  /* rows per forward task */
#define ENC_COLS 128 /* columns per backward task */

typedef struct {
    float *out, *dwte, *dwpe;
    const float *wte, *wpe, *dout;
    const int32_t *inp;
    int B, T, C;
} enc_args_t;

DDP_VECTOR_TASK(enc_fwd_task)
{
    const enc_args_t *a = varg;
    long lo = task * ENC_ROWS, hi = lo + ENC_ROWS;
    if (hi > (long)a->B * a->T) hi = (long)a->B * a->T;
    for (long r = lo; r < hi; r++) {
        int t = (int)(r % a->T);
        float *restrict o = a->out + r * a->C;
        const float *restrict te = a->wte + (size_t)a->inp[r] * a->C;
        if (!a->wpe) { /* no positions (Llama: RoPE in attention instead) */
            for (int c = 0; c < a->C; c++) o[c] = te[c];
            continue;
        }
        const float *restrict pe = a->wpe + (size_t)t * a->C;
        for (int c = 0; c < a->C; c++) o[c] = te[c] + pe[c];
    }
}

void ddp__cpu_encoder_fwd(ddp_kctx_t *ctx, float *out, const int32_t *inp, const float *wte,
                          const float *wpe, int B, int T, int C)
{
    enc_args_t a = {.out = out, .inp = inp, .wte = wte, .wpe = wpe, .B = B, .T = T, .C = C};
    ddp__pool_run(ctx->pool, ddp__ntasks((size_t)B * T, ENC_ROWS), enc_fwd_task, &a);
}

DDP_VECTOR_TASK(enc_bwd_task)
{
    const enc_args_t *a = varg;
    int c0 = (int)task * ENC_COLS;
    int c1 = c0 + ENC_COLS < a->C ? c0 + ENC_COLS : a->C;
    for (int b = 0; b < a->B; b++)
        for (int t = 0; t < a->T; t++) {
            size_t r = (size_t)b * a->T + t;
            const float *restrict d = a->dout + r * a->C;
            if (a->dwte) {
                float *restrict te = a->dwte + (size_t)a->inp[r] * a->C;
                for (int c = c0; c < c1; c++) te[c] += d[c];
            }
            if (a->dwpe) {
                float *restrict pe = a->dwpe + (size_t)t * a->C;
                for (int c = c0; c < c1; c++) pe[c] += d[c];
            }
        }
}

void ddp__cpu_encoder_bwd(ddp_kctx_t *ctx, float *dwte, float *dwpe, const float *dout,
                          const int32_t *inp, int B, int T, int C)
{
    enc_args_t a = {.dwte = dwte, .dwpe = dwpe, .dout = dout, .inp = inp, .B = B, .T = T, .C = C};
    ddp__pool_run(ctx->pool, ddp__ntasks((size_t)C, ENC_COLS), enc_bwd_task, &a);
}
