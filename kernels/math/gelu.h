/* GELU, tanh approximation (GPT-2's "gelu_new"), and its derivative.
 * gelu(x) = 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2/pi). */
#ifndef DDP_KERNELS_MATH_GELU_H
#define DDP_KERNELS_MATH_GELU_H

#include "hd.h"

#define DDP_GELU_K 0.7978845608028654f /* sqrt(2/pi) */

DDP_HD float ddp_gelu(float x)
{
    float cube = 0.044715f * x * x * x;
    return 0.5f * x * (1.0f + tanhf(DDP_GELU_K * (x + cube)));
}

/* d gelu / dx */
DDP_HD float ddp_gelu_grad(float x)
{
    float cube = 0.044715f * x * x * x;
    float th = tanhf(DDP_GELU_K * (x + cube));
    float sech2 = 1.0f - th * th;
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * DDP_GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
}

#endif
