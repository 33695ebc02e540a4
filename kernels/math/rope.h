/* Rotary position embedding (Llama; Hugging Face's rotate_half pairing) for every backend.
 * Element i < hs/2 of a head is paired with element i + hs/2, and the pair (x0, x1) is rotated
 * by the angle whose cosine and sine the model's table gives for (position, i):
 *   forward   (x0 c - x1 s, x1 c + x0 s)
 *   backward  the inverse rotation, the same with s negated (the rotation is orthogonal, so
 *             its transpose is its inverse): the gradient is rotated back. */
#ifndef DDP_KERNELS_MATH_ROPE_H
#define DDP_KERNELS_MATH_ROPE_H

#include "hd.h"

/* (x0, x1) rotated by (c, s), into *y0, *y1 (which may be x0's and x1's storage: both inputs
 * are read first). Backward passes -s. */
DDP_HD void ddp_rope_rotate(float x0, float x1, float c, float s, float *y0, float *y1)
{
    float a = x0 * c - x1 * s, b = x1 * c + x0 * s;
    *y0 = a;
    *y1 = b;
}

#endif
