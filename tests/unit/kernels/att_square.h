/* Test-only: the T x T attention (att[B,NH,T,T] saved), the reference for flash attention. */
#ifndef DDP_TESTS_UNIT_KERNELS_ATT_SQUARE_H
#define DDP_TESTS_UNIT_KERNELS_ATT_SQUARE_H

/* out[B,T,C] and att[B,NH,T,T] (zeros above the diagonal) from qkv[B,T,3C]. */
void square_attention_fwd(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
/* dqkv[B,T,3C] += the gradient of dout[B,T,C]; datt[B,NH,T,T] is scratch. */
void square_attention_bwd(float *dqkv, float *datt, const float *dout, const float *qkv,
                          const float *att, int B, int T, int C, int NH);

/* Grouped-query attention on qkv[B,T,C + 2 NKV hs] through the functions above: K/V heads
 * repeated into a [B,T,3C] copy (Hugging Face's repeat_kv), and backward's dK, dV of the copy
 * summed back over each group: dqkv[B,T,C + 2 NKV hs] is overwritten. */
void square_gqa_fwd(float *out, float *att, const float *qkv, int B, int T, int C, int NH,
                    int NKV);
void square_gqa_bwd(float *dqkv, float *datt, const float *dout, const float *qkv,
                    const float *att, int B, int T, int C, int NH, int NKV);

#endif
