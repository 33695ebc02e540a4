/* Causal multi-head self-attention, forward and backward.
 *
 * qkv[B,T,3C]: per position q, k, v, each NH heads of hs = C/NH; out[B,T,C];
 * att[B,NH,T,T]: softmax probabilities, row t holds t2 <= t and zeros above.
 * One task per (b, head): it reads and writes only that head's slices, so tasks never share an
 * output element and every sum runs in a fixed order (thread-independent results).
 * Scores are scaled by 1/sqrt(hs). The softmax pieces come from kernels/math/softmax.h.
 */
#include "kernels/cpu/cpu.h"

#include <math.h>

#include "kernels/math/softmax.h"

#define ATT_LANES 8

typedef struct {
    float *out, *att, *dqkv, *datt;
    const float *qkv, *dout, *catt;
    int B, T, C, NH;
} att_args_t;

static float dot(const float *restrict a, const float *restrict b, int n)
{
    float acc[ATT_LANES] = {0};
    int i = 0;
    for (; i + ATT_LANES <= n; i += ATT_LANES)
        for (int j = 0; j < ATT_LANES; j++) acc[j] += a[i + j] * b[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += a[i] * b[i];
    float s = 0.0f;
    for (int j = 0; j < ATT_LANES; j++) s += acc[j];
    return s;
}

static void att_fwd_task(void *varg, long task)
{
    const att_args_t *a = varg;
    int T = a->T, C = a->C, NH = a->NH, hs = C / NH;
    int b = (int)(task / NH), h = (int)(task % NH);
    size_t C3 = (size_t)3 * C;
    const float *base = a->qkv + (size_t)b * T * C3 + (size_t)h * hs;
    float scale = 1.0f / sqrtf((float)hs);
    for (int t = 0; t < T; t++) {
        const float *q = base + t * C3;
        float *row = a->att + (((size_t)b * NH + h) * T + t) * T;
        float mx = -INFINITY;
        for (int t2 = 0; t2 <= t; t2++) {
            float s = dot(q, base + t2 * C3 + C, hs) * scale;
            row[t2] = s;
            mx = s > mx ? s : mx;
        }
        float sum = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) {
            row[t2] = ddp_softmax_exp(row[t2], mx);
            sum += row[t2];
        }
        float inv = 1.0f / sum;
        for (int t2 = 0; t2 <= t; t2++) row[t2] *= inv;
        for (int t2 = t + 1; t2 < T; t2++) row[t2] = 0.0f;
        float *restrict o = a->out + ((size_t)b * T + t) * C + (size_t)h * hs;
        for (int i = 0; i < hs; i++) o[i] = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) {
            const float *restrict v = base + t2 * C3 + 2 * C;
            float p = row[t2];
            for (int i = 0; i < hs; i++) o[i] += p * v[i];
        }
    }
}

void ddp__cpu_attention_fwd(ddp_kctx_t *ctx, float *out, float *att, const float *qkv, int B,
                            int T, int C, int NH)
{
    att_args_t a = {.out = out, .att = att, .qkv = qkv, .B = B, .T = T, .C = C, .NH = NH};
    ddp__pool_run(ctx->pool, (long)B * NH, att_fwd_task, &a);
}

static void att_bwd_task(void *varg, long task)
{
    const att_args_t *a = varg;
    int T = a->T, C = a->C, NH = a->NH, hs = C / NH;
    int b = (int)(task / NH), h = (int)(task % NH);
    size_t C3 = (size_t)3 * C;
    const float *base = a->qkv + (size_t)b * T * C3 + (size_t)h * hs;
    float *dbase = a->dqkv + (size_t)b * T * C3 + (size_t)h * hs;
    float scale = 1.0f / sqrtf((float)hs);
    for (int t = 0; t < T; t++) {
        const float *prow = a->catt + (((size_t)b * NH + h) * T + t) * T;
        float *drow = a->datt + (((size_t)b * NH + h) * T + t) * T;
        const float *restrict dout = a->dout + ((size_t)b * T + t) * C + (size_t)h * hs;
        /* out[t] = sum_t2 p[t2] v[t2]: dp[t2] = dout . v[t2], dv[t2] += p[t2] dout. */
        for (int t2 = 0; t2 <= t; t2++) {
            drow[t2] = dot(dout, base + t2 * C3 + 2 * C, hs);
            float *restrict dv = dbase + t2 * C3 + 2 * C;
            float p = prow[t2];
            for (int i = 0; i < hs; i++) dv[i] += p * dout[i];
        }
        for (int t2 = t + 1; t2 < T; t2++) drow[t2] = 0.0f;
        float pdp = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) pdp += prow[t2] * drow[t2];
        /* Softmax backward into the pre-softmax scores, then through s = q.k * scale. */
        const float *restrict q = base + t * C3;
        float *restrict dq = dbase + t * C3;
        for (int t2 = 0; t2 <= t; t2++) {
            float ds = ddp_softmax_bwd(prow[t2], drow[t2], pdp);
            drow[t2] = ds;
            ds *= scale;
            const float *restrict k = base + t2 * C3 + C;
            float *restrict dk = dbase + t2 * C3 + C;
            for (int i = 0; i < hs; i++) {
                dq[i] += ds * k[i];
                dk[i] += ds * q[i];
            }
        }
    }
}

void ddp__cpu_attention_bwd(ddp_kctx_t *ctx, float *dqkv, float *datt, const float *dout,
                            const float *qkv, const float *att, int B, int T, int C, int NH)
{
    att_args_t a = {.dqkv = dqkv, .datt = datt, .dout = dout, .qkv = qkv, .catt = att, .B = B,
                    .T = T, .C = C, .NH = NH};
    ddp__pool_run(ctx->pool, (long)B * NH, att_bwd_task, &a);
}
