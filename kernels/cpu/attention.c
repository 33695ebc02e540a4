/* Causal multi-head self-attention, forward and backward, flash-attention style: the op keeps
 * no [T,T] tensor. Forward saves the output and each row's log-sum-exp; backward recomputes
 * the probabilities from them, block by block.
 *
 * qkv[B,T,3C]: per position q, k, v, each NH heads of hs = C/NH; out[B,T,C]; lse[B,NH,T].
 * One task per (b, head): it reads and writes only that head's slices, so tasks never share an
 * output element, and its products are single-threaded sgemms of fixed shapes, so every sum
 * runs in a fixed order (thread-independent results).
 * Causal blocks: a task walks the rows in blocks of ATT_ROWS; block [r0, r1) multiplies only
 * the columns < r1 (the ones its rows can see), which skips most of the masked upper triangle:
 * at T = 1024 the products do 56% of the full square's work. A block's scores live in a
 * per-thread scratch of ATT_ROWS x T floats (two in backward: P and dS), so the op's memory is
 * 2 x threads x ATT_ROWS x T floats, not B x NH x T x T. The CPU does not tile the columns
 * further (the GPU's kernel does): the whole causal width of a block is one sgemm, which is
 * what keeps the products fast, and a row's softmax then needs no running rescale.
 * Each block's contributions to dK and dV are added in block order, a fixed order.
 * Scores are scaled by 1/sqrt(hs). The softmax pieces come from kernels/math/softmax.h; exp is
 * ddp_expf_approx (about 2 ulp), whose loops vectorise where glibc's expf is a call per element
 * (half of a 1024-token context's attention forward went to it otherwise).
 */
#include "kernels/cpu/cpu.h"

#include <cblas.h>
#include <math.h>

#include "common/err.h"
#include "kernels/math/softmax.h"

#define ATT_ROWS 128 /* rows of a causal block */
#define LANES 16     /* partial sums of a row, added in lane order: vectorisable, and fixed */

/* sum of x[0..n) * (y ? y : 1)[0..n) over LANES partial sums (a fixed order that depends on n
 * only) */
static float lane_dot(const float *restrict x, const float *restrict y, int n)
{
    float acc[LANES] = {0};
    int i = 0;
    if (y)
        for (; i + LANES <= n; i += LANES)
            for (int j = 0; j < LANES; j++) acc[j] += x[i + j] * y[i + j];
    else
        for (; i + LANES <= n; i += LANES)
            for (int j = 0; j < LANES; j++) acc[j] += x[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += y ? x[i] * y[i] : x[i];
    float s = 0.0f;
    for (int j = 0; j < LANES; j++) s += acc[j];
    return s;
}

/* max of x[0..n), n >= 1 (order-free: lanes only let it vectorise) */
static float lane_max(const float *restrict x, int n)
{
    float acc[LANES];
    for (int j = 0; j < LANES; j++) acc[j] = x[0];
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
    for (int j = 0; i < n; i++, j++) acc[j] = x[i] > acc[j] ? x[i] : acc[j];
    float m = acc[0];
    for (int j = 1; j < LANES; j++) m = acc[j] > m ? acc[j] : m;
    return m;
}

typedef struct {
    float *out, *lse, *dqkv;
    const float *qkv, *dout, *cout, *clse;
    int B, T, C, NH;
    float *scratch; /* `per_thread` floats for each pool thread */
    size_t per_thread;
} att_args_t;

/* The calling thread's share of a->scratch. */
static float *thread_scratch(const att_args_t *a)
{
    return a->scratch + (size_t)ddp__pool_self() * a->per_thread;
}

/* Block [r0, r1)'s scores scale Q K^T over the columns < r1 into s[rb, r1]. */
static void block_scores(float *s, const float *q, const float *k, int r0, int r1, int hs,
                         int C3)
{
    float scale = 1.0f / sqrtf((float)hs);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1, hs, scale,
                q + (size_t)r0 * C3, C3, k, C3, 0.0f, s, r1);
}

static void att_fwd_task(void *varg, long task)
{
    const att_args_t *a = varg;
    int T = a->T, C = a->C, NH = a->NH, hs = C / NH;
    int b = (int)(task / NH), h = (int)(task % NH);
    int C3 = 3 * C;
    const float *q = a->qkv + (size_t)b * T * C3 + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
    float *lse = a->lse + ((size_t)b * NH + h) * T;
    float *out = a->out + (size_t)b * T * C + (size_t)h * hs;
    float *p = thread_scratch(a); /* [rb, r1] scores, then probabilities */
    for (int r0 = 0; r0 < T; r0 += ATT_ROWS) {
        int r1 = r0 + ATT_ROWS < T ? r0 + ATT_ROWS : T, rb = r1 - r0;
        block_scores(p, q, k, r0, r1, hs, C3);
        for (int t = r0; t < r1; t++) {
            float *restrict row = p + (size_t)(t - r0) * r1;
            int n = t + 1;
            float mx = lane_max(row, n);
            for (int i = 0; i < n; i++) row[i] = ddp_softmax_exp_approx(row[i], mx);
            float sum = lane_dot(row, NULL, n), inv = 1.0f / sum;
            for (int i = 0; i < n; i++) row[i] *= inv;
            for (int i = n; i < r1; i++) row[i] = 0.0f;
            lse[t] = mx + logf(sum);
        }
        /* out = P V over columns < r1 */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rb, hs, r1, 1.0f, p, r1, v, C3,
                    0.0f, out + (size_t)r0 * C, C);
    }
}

/* Gives a `blocks` score blocks of ATT_ROWS x T floats on each pool thread, in ctx's scratch;
 * 0, or DDP_ENOMEM (also kept in ctx->err). */
static int att_scratch(ddp_kctx_t *ctx, att_args_t *a, int blocks)
{
    size_t rows = a->T < ATT_ROWS ? (size_t)a->T : ATT_ROWS;
    a->per_thread = (size_t)blocks * rows * (size_t)a->T;
    a->scratch = ddp__cpu_scratch(ctx, (size_t)ctx->threads * a->per_thread * sizeof(float));
    if (a->scratch) return 0;
    if (!ctx->err) ctx->err = DDP_ENOMEM;
    return DDP_ENOMEM;
}

void ddp__cpu_attention_fwd(ddp_kctx_t *ctx, ddp_act_t *out, float *lse, const ddp_act_t *qkv,
                            int B, int T, int C, int NH)
{
    att_args_t a = {.out = (float *)out, .lse = lse, .qkv = (const float *)qkv, .B = B, .T = T, .C = C, .NH = NH};
    if (att_scratch(ctx, &a, 1)) return;
    ddp__pool_run(ctx->pool, (long)B * NH, att_fwd_task, &a);
}

static void att_bwd_task(void *varg, long task)
{
    const att_args_t *a = varg;
    int T = a->T, C = a->C, NH = a->NH, hs = C / NH;
    int b = (int)(task / NH), h = (int)(task % NH);
    int C3 = 3 * C;
    const float *q = a->qkv + (size_t)b * T * C3 + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
    float *dq = a->dqkv + (size_t)b * T * C3 + (size_t)h * hs, *dk = dq + C, *dv = dq + 2 * C;
    const float *lse = a->clse + ((size_t)b * NH + h) * T;
    const float *dout = a->dout + (size_t)b * T * C + (size_t)h * hs;
    const float *out = a->cout + (size_t)b * T * C + (size_t)h * hs;
    float *p = thread_scratch(a), *ds = p + a->per_thread / 2; /* [rb, r1] each */
    float scale = 1.0f / sqrtf((float)hs);
    /* dqkv is overwritten: dK and dV sum over the row blocks from zero; dQ's rows are written
     * once each (beta 0 below) */
    for (int t = 0; t < T; t++)
        for (int i = 0; i < hs; i++) dk[(size_t)t * C3 + i] = dv[(size_t)t * C3 + i] = 0.0f;
    for (int r0 = 0; r0 < T; r0 += ATT_ROWS) {
        int r1 = r0 + ATT_ROWS < T ? r0 + ATT_ROWS : T, rb = r1 - r0;
        const float *dob = dout + (size_t)r0 * C;
        /* P = exp(scores - lse) again, zero above the diagonal */
        block_scores(p, q, k, r0, r1, hs, C3);
        for (int t = r0; t < r1; t++) {
            float *restrict row = p + (size_t)(t - r0) * r1;
            for (int i = 0; i <= t; i++) row[i] = ddp_softmax_exp_approx(row[i], lse[t]);
            for (int i = t + 1; i < r1; i++) row[i] = 0.0f;
        }
        /* out = P V:  dP = dO V^T,  dV += P^T dO (columns < r1) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rb, r1, hs, 1.0f, dob, C, v, C3,
                    0.0f, ds, r1);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, hs, rb, 1.0f, p, r1, dob, C,
                    1.0f, dv, C3);
        /* softmax backward, in place: dS = P (dP - D), D = dO . O = sum(P dP) for the row */
        for (int t = r0; t < r1; t++) {
            const float *restrict prow = p + (size_t)(t - r0) * r1;
            float *restrict row = ds + (size_t)(t - r0) * r1;
            float d = lane_dot(dout + (size_t)t * C, out + (size_t)t * C, hs);
            for (int i = 0; i <= t; i++) row[i] = ddp_softmax_bwd(prow[i], row[i], d);
            for (int i = t + 1; i < r1; i++) row[i] = 0.0f;
        }
        /* scores = scale Q K^T:  dQ += scale dS K,  dK += scale dS^T Q (columns < r1) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rb, hs, r1, scale, ds, r1, k, C3,
                    0.0f, dq + (size_t)r0 * C3, C3);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, hs, rb, scale, ds, r1,
                    q + (size_t)r0 * C3, C3, 1.0f, dk, C3);
    }
}

void ddp__cpu_attention_bwd(ddp_kctx_t *ctx, ddp_act_t *dqkv, const ddp_act_t *dout,
                            const ddp_act_t *qkv, const ddp_act_t *out, const float *lse, int B,
                            int T, int C, int NH)
{
    att_args_t a = {.dqkv = (float *)dqkv, .dout = (const float *)dout, .qkv = (const float *)qkv,
                    .cout = (const float *)out, .clse = lse, .B = B,
                    .T = T, .C = C, .NH = NH};
    if (att_scratch(ctx, &a, 2)) return;
    ddp__pool_run(ctx->pool, (long)B * NH, att_bwd_task, &a);
}
