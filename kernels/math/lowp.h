/* Rounding fp32 to the matrix products' low-precision inputs (bf16, fp16), written once for the
 * CPU (gcc) and CUDA (nvcc).
 *
 * Each function returns the fp32 value of the nearest bf16 / fp16 number (round to nearest,
 * ties to even), so that a product of two rounded values is exact in fp32 (8 x 8 or 11 x 11
 * significand bits fit in 24) and an fp32 GEMM over rounded inputs is the low-precision product
 * with fp32 accumulation, up to the order of the additions.
 * - bf16: fp32's exponent range; NaN stays NaN (quiet), values beyond bf16's largest round to Inf.
 * - fp16: |x| >= 65520 becomes Inf (65504 is fp16's largest finite value), which is how an fp16
 *   overflow shows (the loss scaler looks for it); magnitudes below 2^-14 are rounded to
 *   multiples of 2^-24 (fp16's subnormals), those below 2^-25 to zero.
 */
#ifndef DDP_KERNELS_MATH_LOWP_H
#define DDP_KERNELS_MATH_LOWP_H

#include <stdint.h>
#include <string.h>

#include "kernels/math/hd.h"

DDP_HD uint32_t ddp_f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

DDP_HD float ddp_bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* x rounded to bf16 (the top 16 bits of an fp32), as fp32. */
DDP_HD float ddp_round_bf16(float x)
{
    uint32_t u = ddp_f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return ddp_bits_f32(u | 0x00400000u); /* NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return ddp_bits_f32(u & 0xffff0000u);
}

/* x's bf16 bits (round to nearest even). */
DDP_HD uint16_t ddp_bf16_bits(float x) { return (uint16_t)(ddp_f32_bits(ddp_round_bf16(x)) >> 16); }

/* x rounded to fp16 (1 sign, 5 exponent, 10 significand bits), as fp32. */
DDP_HD float ddp_round_fp16(float x)
{
    uint32_t u = ddp_f32_bits(x);
    uint32_t sign = u & 0x80000000u, a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return x;                         /* Inf, NaN */
    if (a < 0x38800000u) {                                  /* below 2^-14: fp16 subnormal */
        /* 0.5 + |x| rounds |x| to a multiple of ulp(0.5) = 2^-24, ties to even */
        float r = (ddp_bits_f32(a) + 0.5f) - 0.5f; /* exact subtraction; no -ffast-math */
        return ddp_bits_f32(ddp_f32_bits(r) | sign);
    }
    a += 0xfffu + ((a >> 13) & 1u); /* drop 13 of 23 significand bits, ties to even */
    a &= ~0x1fffu;
    if (a >= 0x47800000u) a = 0x7f800000u; /* 65520 and up: overflow */
    return ddp_bits_f32(a | sign);
}

/* The fp32 value of bf16 bits b (exact). */
DDP_HD float ddp_bf16_f32(uint16_t b) { return ddp_bits_f32((uint32_t)b << 16); }

/* x's IEEE fp16 bits, rounded as ddp_round_fp16 (to nearest even; 65520 and up: Inf). */
DDP_HD uint16_t ddp_fp16_bits(float x)
{
    uint32_t u = ddp_f32_bits(ddp_round_fp16(x));
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN (quiet) */
    if (a == 0x7f800000u) return (uint16_t)(sign | 0x7c00u); /* Inf */
    if (a < 0x38800000u) /* subnormal (or zero): a multiple of 2^-24, exact */
        return (uint16_t)(sign | (uint16_t)(ddp_bits_f32(a) * 16777216.0f));
    return (uint16_t)(sign | ((a - 0x38000000u) >> 13)); /* rebias 127 -> 15 */
}

/* The fp32 value of IEEE fp16 bits h (exact). */
DDP_HD float ddp_fp16_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, f = h & 0x3ffu;
    if (e == 0) { /* zero or subnormal: f x 2^-24 */
        float v = (float)f * (1.0f / 16777216.0f);
        return ddp_bits_f32(ddp_f32_bits(v) | sign);
    }
    if (e == 31) return ddp_bits_f32(sign | 0x7f800000u | (f << 13) | (f ? 0x00400000u : 0));
    return ddp_bits_f32(sign | ((e + 112u) << 23) | (f << 13));
}

#endif
