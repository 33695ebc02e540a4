/* Causal multi-head self-attention, forward and backward.
 *
 * qkv[B,T,3C]: per position q, k, v, each NH heads of hs = C/NH; out[B,T,C];
 * att[B,NH,T,T]: softmax probabilities, row t holds t2 <= t and zeros above.
 * One task per (b, head): it reads and writes only that head's slices, so tasks never share an
 * output element, and its products are single-threaded sgemms of fixed shapes, so every sum
 * runs in a fixed order (thread-independent results).
 * Causal blocks: a task walks the rows in blocks of ATT_ROWS; block [r0, r1) multiplies only
 * the columns < r1 (the ones its rows can see), which skips most of the masked upper triangle:
 * at T = 1024 the products do 56% of the full square's work. Each block's contributions to dK
 * and dV are added in block order, a fixed order.
 * Scores are scaled by 1/sqrt(hs). The softmax pieces come from kernels/math/softmax.h.
 */
#include "kernels/cpu/cpu.h"

#include <cblas.h>
#include <math.h>

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

/* row[0..n) <- softmax(row[0..n)), row[n..T) <- 0. exp is ddp_expf_approx (about 2 ulp),
 * whose loop vectorises, where glibc's expf is a call per element: a 1024-token context spends
 * about half of its attention forward outside the products otherwise. */
static void softmax_row(float *restrict row, int n, int T)
{
    float mx = lane_max(row, n);
    for (int i = 0; i < n; i++) row[i] = ddp_softmax_exp_approx(row[i], mx);
    float inv = 1.0f / lane_dot(row, NULL, n);
    for (int i = 0; i < n; i++) row[i] *= inv;
    for (int i = n; i < T; i++) row[i] = 0.0f;
}

typedef struct {
    float *out, *att, *dqkv, *datt;
    const float *qkv, *dout, *catt;
    int B, T, C, NH;
} att_args_t;

/* The products of one head are small sgemms (single-threaded inside a task) over causal row
 * blocks: block [r0, r1) computes the scores of columns < r1; of those, the ones above the
 * diagonal are masked to exactly zero after the scores and stay zero through backward, so they
 * add nothing. Columns >= r1 of the block's rows are written as zeros. */
static void att_fwd_task(void *varg, long task)
{
    const att_args_t *a = varg;
    int T = a->T, C = a->C, NH = a->NH, hs = C / NH;
    int b = (int)(task / NH), h = (int)(task % NH);
    int C3 = 3 * C;
    const float *q = a->qkv + (size_t)b * T * C3 + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
    float *att = a->att + ((size_t)b * NH + h) * T * T;
    float *out = a->out + (size_t)b * T * C + (size_t)h * hs;
    float scale = 1.0f / sqrtf((float)hs);
    for (int r0 = 0; r0 < T; r0 += ATT_ROWS) {
        int r1 = r0 + ATT_ROWS < T ? r0 + ATT_ROWS : T, rb = r1 - r0;
        float *blk = att + (size_t)r0 * T;
        /* scores = scale * Q K^T, columns < r1 */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rb, r1, hs, scale,
                    q + (size_t)r0 * C3, C3, k, C3, 0.0f, blk, T);
        for (int t = r0; t < r1; t++) softmax_row(att + (size_t)t * T, t + 1, T);
        /* out = P V over columns < r1 */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rb, hs, r1, 1.0f, blk, T, v, C3,
                    0.0f, out + (size_t)r0 * C, C);
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
    int C3 = 3 * C;
    const float *q = a->qkv + (size_t)b * T * C3 + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
    float *dq = a->dqkv + (size_t)b * T * C3 + (size_t)h * hs, *dk = dq + C, *dv = dq + 2 * C;
    const float *p = a->catt + ((size_t)b * NH + h) * T * T;
    float *ds = a->datt + ((size_t)b * NH + h) * T * T;
    const float *dout = a->dout + (size_t)b * T * C + (size_t)h * hs;
    float scale = 1.0f / sqrtf((float)hs);
    for (int r0 = 0; r0 < T; r0 += ATT_ROWS) {
        int r1 = r0 + ATT_ROWS < T ? r0 + ATT_ROWS : T, rb = r1 - r0;
        const float *pb = p + (size_t)r0 * T, *dob = dout + (size_t)r0 * C;
        float *dsb = ds + (size_t)r0 * T;
        /* out = P V:  dP = dO V^T,  dV += P^T dO (columns < r1) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rb, r1, hs, 1.0f, dob, C, v, C3,
                    0.0f, dsb, T);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, hs, rb, 1.0f, pb, T, dob, C,
                    1.0f, dv, C3);
        /* softmax backward, row by row, in place: dS = P (dP - sum(P dP)); zero where P is */
        for (int t = r0; t < r1; t++) {
            const float *restrict prow = p + (size_t)t * T;
            float *restrict row = ds + (size_t)t * T;
            float pdp = lane_dot(prow, row, t + 1);
            for (int t2 = 0; t2 <= t; t2++) row[t2] = ddp_softmax_bwd(prow[t2], row[t2], pdp);
            for (int t2 = t + 1; t2 < T; t2++) row[t2] = 0.0f;
        }
        /* scores = scale Q K^T:  dQ += scale dS K,  dK += scale dS^T Q (columns < r1) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rb, hs, r1, scale, dsb, T, k, C3,
                    1.0f, dq + (size_t)r0 * C3, C3);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, hs, rb, scale, dsb, T,
                    q + (size_t)r0 * C3, C3, 1.0f, dk, C3);
    }
}

void ddp__cpu_attention_bwd(ddp_kctx_t *ctx, float *dqkv, float *datt, const float *dout,
                            const float *qkv, const float *att, int B, int T, int C, int NH)
{
    att_args_t a = {.dqkv = dqkv, .datt = datt, .dout = dout, .qkv = qkv, .catt = att, .B = B,
                    .T = T, .C = C, .NH = NH};
    ddp__pool_run(ctx->pool, (long)B * NH, att_bwd_task, &a);
}
