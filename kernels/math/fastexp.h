/* exp and tanh written with arithmetic and bit operations only, so that a compiler vectorises
 * loops over them (glibc's expf/tanhf are scalar calls; GPUs have fast hardware versions).
 *
 * ddp_expf_approx: Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2, Cephes' degree-7
 * polynomial for e^r, and 2^n built in the exponent bits. Relative error about 2 ulp over
 * [-87.3, 88.3]; inputs are clamped to that range, so it never returns Inf, NaN or a denormal
 * (exp of a very negative x is ~1e-38 instead of 0). A NaN input gives a NaN-free finite value
 * (callers feed it finite values).
 * ddp_tanhf_approx: 1 - 2 / (1 + e^{2u}), absolute error about 1e-7 (relative error is larger
 * near 0, where only the absolute error matters to GELU).
 */
#ifndef DDP_KERNELS_MATH_FASTEXP_H
#define DDP_KERNELS_MATH_FASTEXP_H

#include "hd.h"

#include <string.h>

DDP_HD float ddp__bits_to_float(int i)
{
#ifdef __CUDA_ARCH__
    return __int_as_float(i);
#else
    float f;
    memcpy(&f, &i, sizeof(f));
    return f;
#endif
}

DDP_HD float ddp_expf_approx(float x)
{
    const float hi = 88.3762626647949f, lo = -87.3365447504f;
    x = x > hi ? hi : x;
    x = x < lo ? lo : x;
    /* n = round(x / ln2) by the 1.5 * 2^23 trick (exact for |n| < 2^22). */
    const float shifter = 12582912.0f;
    float nf = (x * 1.44269504088896341f + shifter) - shifter;
    float r = x - nf * 0.693359375f;  /* ln2 high part (exact product) */
    r = r - nf * -2.12194440e-4f;     /* ln2 low part */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    return p * ddp__bits_to_float(((int)nf + 127) << 23);
}

DDP_HD float ddp_tanhf_approx(float u) { return 1.0f - 2.0f / (1.0f + ddp_expf_approx(2.0f * u)); }

#endif
