/* SwiGLU (Llama's MLP) and its derivative, for every backend: out = silu(g) u for the gate
 * product g and the up product u, silu(g) = g sigmoid(g) = g / (1 + e^-g).
 *   d out / d g = u sigmoid(g) (1 + g (1 - sigmoid(g))),   d out / d u = silu(g).
 * e^-g is ddp_expf_approx (kernels/math/fastexp.h, about 2 ulp), so that the CPU's loops
 * vectorise and the GPU computes the same bits; its clamp keeps every value finite (for
 * g < -88, silu(g) is about g e^-88 instead of g e^g: both round to -0 or a denormal's size). */
#ifndef DDP_KERNELS_MATH_SWIGLU_H
#define DDP_KERNELS_MATH_SWIGLU_H

#include "fastexp.h"
#include "hd.h"

DDP_HD float ddp_sigmoid(float g) { return 1.0f / (1.0f + ddp_expf_approx(-g)); }

/* silu(g) u */
DDP_HD float ddp_swiglu(float g, float u) { return g * ddp_sigmoid(g) * u; }

/* The gradients of swiglu(g, u) times dout: *dg and *du. */
DDP_HD void ddp_swiglu_grad(float g, float u, float dout, float *dg, float *du)
{
    float s = ddp_sigmoid(g);
    *dg = dout * u * (s * (1.0f + g * (1.0f - s)));
    *du = dout * (g * s);
}

#endif
