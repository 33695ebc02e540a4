/* Where a weight lies in set_weights' arena (kernels.h): the lookup both backends' 16-bit weight
 * copies make (kernels/cpu/lowp.c, kernels/cuda/lowp.cu), written once. C and CUDA alike.
 */
#ifndef DDP_KERNELS_WEIGHT_ARENA_H
#define DDP_KERNELS_WEIGHT_ARENA_H

#include <stddef.h>
#include <stdint.h>

/* 1 with *off = w's offset in elements when w[0..n) lies inside arena[0..arena_n) (arena not
 * NULL), else 0. Compared as addresses: w may come from anywhere. */
static inline int ddp__arena_slice(const float *arena, size_t arena_n, const float *w, size_t n,
                                   size_t *off)
{
    uintptr_t base = (uintptr_t)arena, at = (uintptr_t)w;
    if (!arena || at < base || (at - base) / sizeof(float) + n > arena_n) return 0;
    *off = (at - base) / sizeof(float);
    return 1;
}

#endif
