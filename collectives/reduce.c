/* Reduction kernels of the ring: fp32 and bf16 element-wise sums, optionally scaled (average).
 *
 * Written as plain loops over restrict pointers so gcc vectorises them, once per instruction set
 * (target_clones: AVX-512, AVX2 or the baseline SSE2, chosen at load time); a bf16 value is
 * widened to fp32, summed in fp32 and rounded back to nearest-even (NaN stays a quiet NaN). The
 * order of operands is fixed by the caller (the ring), so results are reproducible.
 */
#include <string.h>

#include "collectives/coll_impl.h"

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

#ifdef __SANITIZE_THREAD__
#define VECTOR_CLONES /* TSan's runtime is not up yet when ifunc resolvers run */
#else
#define VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif

VECTOR_CLONES static void reduce_f32(float *dst, const float *restrict a, const float *b,
                       size_t n, float scale)
{
    if (scale == 1.0f)
        for (size_t i = 0; i < n; i++) dst[i] = a[i] + b[i];
    else
        for (size_t i = 0; i < n; i++) dst[i] = (a[i] + b[i]) * scale;
}

VECTOR_CLONES static void reduce2_f32(float *dst, float *restrict dst2, const float *restrict a,
                        const float *b, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) {
        float v = (a[i] + b[i]) * scale;
        dst[i] = v;
        dst2[i] = v;
    }
}

static inline float bf(uint16_t h)
{
    union { uint32_t u; float f; } x = {.u = (uint32_t)h << 16};
    return x.f;
}

static inline uint16_t tobf(float f)
{
    union { uint32_t u; float f; } x = {.f = f};
    uint32_t u = x.u;
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)(((u & 0x7fffffffu) > 0x7f800000u) ? ((u >> 16) | 0x40u) : r);
}

VECTOR_CLONES static void reduce_bf16(uint16_t *dst, const uint16_t *restrict a,
                        const uint16_t *b, size_t n, float scale)
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

void ddp__scale(ddp_dtype_t dt, void *dst, size_t n, float scale)
{
    if (scale == 1.0f) return;
    if (dt == DDP_DT_F32) {
        float *d = dst;
        for (size_t i = 0; i < n; i++) d[i] *= scale;
    } else {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = tobf(bf(d[i]) * scale);
    }
}
