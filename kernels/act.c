/* Activation tensors in host memory, to and from fp32 (kernels.h): the CPU backend's stores,
 * and the few readers and writers of activations outside the kernels (sampling's logits, the
 * self-test, tests). The loops are kept plain so that gcc vectorises them. */
#include "kernels/kernels.h"

#include <string.h>

#include "kernels/math/lowp.h"

void ddp_act_to_f32(float *dst, const void *src, size_t n, ddp_kprec_t prec)
{
    const uint16_t *h = src;
    if (prec == DDP_KPREC_FP32)
        memcpy(dst, src, n * sizeof(float));
    else if (prec == DDP_KPREC_BF16)
        for (size_t i = 0; i < n; i++) dst[i] = ddp_bf16_f32(h[i]);
    else
        for (size_t i = 0; i < n; i++) dst[i] = ddp_fp16_f32(h[i]);
}

void ddp_act_from_f32(void *dst, const float *src, size_t n, ddp_kprec_t prec)
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
