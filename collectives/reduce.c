/* Reduction kernels of the ring: fp32 and bf16 element-wise sums, optionally scaled (average).
 *
 * Written as plain loops over restrict pointers so gcc vectorises them, in the CPU's widest
 * vectors (DDP_VECTOR_FN: AVX-512, AVX2 or the baseline SSE2, the same bits); a bf16 value is
 * widened to fp32, summed in fp32 and rounded back to nearest-even (NaN stays a quiet NaN). The
 * order of operands is fixed by the caller (the ring), so results are reproducible.
 */
#include <string.h>

#include "collectives/coll_impl.h"
#include "common/vector_isa.h"

float ddp__bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t ddp__f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

DDP_VECTOR_FN(reduce_f32,
              (float *dst, const float *restrict a, const float *b, size_t n, float scale),
              (dst, a, b, n, scale))
{
    if (scale == 1.0f)
        for (size_t i = 0; i < n; i++) dst[i] = a[i] + b[i];
    else
        for (size_t i = 0; i < n; i++) dst[i] = (a[i] + b[i]) * scale;
}

DDP_VECTOR_FN(reduce2_f32,
              (float *dst, float *restrict dst2, const float *restrict a, const float *b, size_t n,
               float scale),
              (dst, dst2, a, b, n, scale))
{
    for (size_t i = 0; i < n; i++) {
        float v = (a[i] + b[i]) * scale;
        dst[i] = v;
        dst2[i] = v;
    }
}

DDP_VECTOR_INLINE float bf(uint16_t h)
{
    union { uint32_t u; float f; } x = {.u = (uint32_t)h << 16};
    return x.f;
}

DDP_VECTOR_INLINE uint16_t tobf(float f)
{
    union { uint32_t u; float f; } x = {.f = f};
    uint32_t u = x.u;
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)(((u & 0x7fffffffu) > 0x7f800000u) ? ((u >> 16) | 0x40u) : r);
}

DDP_VECTOR_FN(reduce_bf16,
              (uint16_t *dst, const uint16_t *restrict a, const uint16_t *b, size_t n,
               float scale),
              (dst, a, b, n, scale))
{
    for (size_t i = 0; i < n; i++) dst[i] = tobf((bf(a[i]) + bf(b[i])) * scale);
}

void ddp__reduce(ddp_dtype_t dt, void *dst, void *dst2, const void *a, const void *b, size_t n,
                 float scale)
{
    if (dt == DDP_DT_F32) {
        if (dst2)
            reduce2_f32(dst, dst2, a, b, n, scale);
        else
            reduce_f32(dst, a, b, n, scale);
    } else {
        reduce_bf16(dst, a, b, n, scale);
        if (dst2) memcpy(dst2, dst, n * 2);
    }
}

DDP_VECTOR_FN(scale_in_place, (ddp_dtype_t dt, void *dst, size_t n, float scale),
              (dt, dst, n, scale))
{
    if (dt == DDP_DT_F32) {
        float *d = dst;
        for (size_t i = 0; i < n; i++) d[i] *= scale;
    } else {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = tobf(bf(d[i]) * scale);
    }
}

void ddp__scale(ddp_dtype_t dt, void *dst, size_t n, float scale)
{
    if (scale != 1.0f) scale_in_place(dt, dst, n, scale);
}
