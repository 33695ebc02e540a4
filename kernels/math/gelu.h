/* GELU, tanh approximation (GPT-2's "gelu_new"), and its derivative, for every backend.
 * gelu(x) = 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2/pi).
 * tanh is ddp_tanhf_approx (kernels/math/fastexp.h), about 1e-7 from tanhf in absolute terms:
 * loops over it vectorise on the CPU, and the GPU computes the same bits instead of its own
 * tanhf (which differed from the CPU's by 8e-5 relative where gelu(x) is near 0, on an H200). */
#ifndef DDP_KERNELS_MATH_GELU_H
#define DDP_KERNELS_MATH_GELU_H

#include "fastexp.h"
#include "hd.h"

#define DDP_GELU_K 0.7978845608028654f /* sqrt(2/pi) */

DDP_HD float ddp_gelu(float x)
{
    float cube = 0.044715f * x * x * x;
    return 0.5f * x * (1.0f + ddp_tanhf_approx(DDP_GELU_K * (x + cube)));
}

/* d gelu / dx */
DDP_HD float ddp_gelu_grad(float x)
{
    float cube = 0.044715f * x * x * x;
    /* tanh and sech^2 from one e = exp(2u): sech^2 = 4e / (1+e)^2 has no cancellation where
     * 1 - tanh^2 would (|u| large). 2u is capped at 80 so that 4e stays finite while
     * (1+e)^2 overflows to Inf, giving the right limit sech^2 = 0 (tanh is 1 to float there). */
    float u2 = 2.0f * DDP_GELU_K * (x + cube);
    float e = ddp_expf_approx(u2 < 80.0f ? u2 : 80.0f);
    float th = 1.0f - 2.0f / (1.0f + e);
    float sech2 = 4.0f * e / ((1.0f + e) * (1.0f + e));
    return 0.5f * (1.0f + th) + 0.5f * x * sech2 * DDP_GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
}

#endif
