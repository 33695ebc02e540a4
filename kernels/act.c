/* Activation tensors in host memory, to and from fp32 (kernels.h): the CPU backend's stores,
 * and the few readers and writers of activations outside the kernels (sampling's logits, the
 * self-test, tests). The loops are kept plain so that gcc vectorises them, in the CPU's widest
 * vectors (common/vector_isa.h). */
#include "kernels/kernels.h"

#include <string.h>

#include "common/vector_isa.h"
#include "kernels/math/lowp.h"

DDP_VECTOR_FN(to_f32, (float *dst, const void *src, size_t n, ddp_kprec_t prec),
              (dst, src, n, prec))
{
    const uint16_t *restrict h = src;
    if (prec == DDP_KPREC_FP32)
        memcpy(dst, src, n * sizeof(float));
    else if (prec == DDP_KPREC_BF16)
        for (size_t i = 0; i < n; i++) dst[i] = ddp_bf16_f32(h[i]);
    else
        for (size_t i = 0; i < n; i++) dst[i] = ddp_fp16_f32(h[i]);
}

void ddp_act_to_f32(float *dst, const void *src, size_t n, ddp_kprec_t prec)
{
    to_f32(dst, src, n, prec);
}

DDP_VECTOR_FN(from_f32, (void *dst, const float *src, size_t n, ddp_kprec_t prec),
              (dst, src, n, prec))
{
    uint16_t *restrict h = dst;
    if (prec == DDP_KPREC_FP32) {
        if (dst != src) memcpy(dst, src, n * sizeof(float));
    } else if (prec == DDP_KPREC_BF16) {
        for (size_t i = 0; i < n; i++) h[i] = ddp_bf16_bits(src[i]);
    } else {
        for (size_t i = 0; i < n; i++) h[i] = ddp_fp16_bits(src[i]);
    }
}

void ddp_act_from_f32(void *dst, const float *src, size_t n, ddp_kprec_t prec)
{
    from_f32(dst, src, n, prec);
}
