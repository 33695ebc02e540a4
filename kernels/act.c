/* Activation tensors on the host: widening a copy of one to fp32 (kernels.h, ddp_act_to_f32),
 * for the few readers of activations outside the kernels (sampling's logits, tests). */
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
