/* The T x T attention that ddpd ran before flash attention, kept as a test-only reference:
 * forward saves the whole [B,NH,T,T] probability tensor, backward reads it and a [B,NH,T,T]
 * scratch. fp32, single-threaded sgemms per head, the softmax in expf; the flash op must agree
 * with it to fp32 rounding on any shape.
 */
#include "att_square.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void square_attention_fwd(float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs, *k = q + C, *v = q + 2 * C;
            float *p = att + ((size_t)b * NH + h) * T * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, k, C3,
                        0.0f, p, T);
            for (int t = 0; t < T; t++) {
                float *row = p + (size_t)t * T, mx = -INFINITY, sum = 0.0f;
                for (int i = 0; i <= t; i++) mx = fmaxf(mx, row[i]);
                for (int i = 0; i <= t; i++) sum += (row[i] = expf(row[i] - mx));
                for (int i = 0; i < T; i++) row[i] = i <= t ? row[i] / sum : 0.0f;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, p, T, v, C3,
                        0.0f, out + (size_t)b * T * C + (size_t)h * hs, C);
        }
}

void square_attention_bwd(float *dqkv, float *datt, const float *dout, const float *qkv,
                          const float *att, int B, int T, int C, int NH)
{
    int hs = C / NH, C3 = 3 * C;
    float scale = 1.0f / sqrtf((float)hs);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            size_t qo = (size_t)b * T * C3 + (size_t)h * hs;
            const float *q = qkv + qo, *k = q + C, *v = q + 2 * C;
            float *dq = dqkv + qo, *dk = dq + C, *dv = dq + 2 * C;
            const float *p = att + ((size_t)b * NH + h) * T * T;
            float *ds = datt + ((size_t)b * NH + h) * T * T;
            const float *dob = dout + (size_t)b * T * C + (size_t)h * hs;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dob, C, v, C3,
                        0.0f, ds, T);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, p, T, dob, C,
                        1.0f, dv, C3);
            for (int t = 0; t < T; t++) {
                const float *prow = p + (size_t)t * T;
                float *row = ds + (size_t)t * T, dot = 0.0f;
                for (int i = 0; i <= t; i++) dot += prow[i] * row[i];
                for (int i = 0; i < T; i++) row[i] = i <= t ? prow[i] * (row[i] - dot) : 0.0f;
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, scale, ds, T, k, C3,
                        1.0f, dq, C3);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, scale, ds, T, q, C3,
                        1.0f, dk, C3);
        }
}

/* qkv[B,T,C + 2 NKV hs] with its K/V heads repeated: [B,T,3C] (caller frees). */
static float *repeat_kv(const float *qkv, int B, int T, int C, int NH, int NKV)
{
    int hs = C / NH, G = NH / NKV;
    size_t QKV = (size_t)C + 2 * (size_t)NKV * hs;
    float *x = calloc((size_t)B * T * 3 * C, sizeof(float));
    if (!x) abort();
    for (size_t r = 0; r < (size_t)B * T; r++) {
        const float *src = qkv + r * QKV;
        float *dst = x + r * 3 * C;
        memcpy(dst, src, (size_t)C * sizeof(float));
        for (int h = 0; h < NH; h++) {
            memcpy(dst + C + h * hs, src + C + (h / G) * hs, (size_t)hs * sizeof(float));
            memcpy(dst + 2 * C + h * hs, src + C + (NKV + h / G) * hs, (size_t)hs * sizeof(float));
        }
    }
    return x;
}

void square_gqa_fwd(float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                    int NKV)
{
    float *x = repeat_kv(qkv, B, T, C, NH, NKV);
    square_attention_fwd(out, att, x, B, T, C, NH);
    free(x);
}

void square_gqa_bwd(float *dqkv, float *datt, const float *dout, const float *qkv,
                    const float *att, int B, int T, int C, int NH, int NKV)
{
    int hs = C / NH, G = NH / NKV;
    size_t QKV = (size_t)C + 2 * (size_t)NKV * hs;
    float *x = repeat_kv(qkv, B, T, C, NH, NKV);
    float *dx = calloc((size_t)B * T * 3 * C, sizeof(float));
    if (!dx) abort();
    square_attention_bwd(dx, datt, dout, x, att, B, T, C, NH);
    for (size_t r = 0; r < (size_t)B * T; r++) {
        const float *src = dx + r * 3 * C;
        float *dst = dqkv + r * QKV;
        memcpy(dst, src, (size_t)C * sizeof(float));
        memset(dst + C, 0, 2 * (size_t)NKV * hs * sizeof(float));
        for (int h = 0; h < NH; h++) /* ascending within each group */
            for (int i = 0; i < hs; i++) {
                dst[C + (h / G) * hs + i] += src[C + h * hs + i];
                dst[C + (NKV + h / G) * hs + i] += src[2 * C + h * hs + i];
            }
    }
    free(x);
    free(dx);
}
