/* Narrowing gradient buckets to bf16 in place and widening them back (see grad_dtype.h). */
#include "worker/sync/grad_dtype.h"

#include <string.h>

#include "common/err.h"
#include "kernels/math/lowp.h"

/* Element i's fp32 is read before bf16 i is written (bytes [2i, 2i+2), below 4i + 4 and below
 * every later fp32), so a forward pass is safe in place; memcpy keeps the aliasing defined. */
void ddp_grad_narrow_host(float *p, size_t n)
{
    unsigned char *b = (unsigned char *)p;
    for (size_t i = 0; i < n; i++) {
        float x;
        memcpy(&x, b + 4 * i, 4);
        uint16_t h = ddp_bf16_bits(x);
        memcpy(b + 2 * i, &h, 2);
    }
}

/* Backwards: when fp32 i is written (bytes [4i, 4i + 4)), the bf16 values not yet read are those
 * j < i, at bytes [2j, 2j + 2) with 2j + 2 <= 2i <= 4i: never overwritten before they are read. */
void ddp_grad_widen_host(float *p, size_t n)
{
    unsigned char *b = (unsigned char *)p;
    for (size_t i = n; i-- > 0;) {
        uint16_t h;
        memcpy(&h, b + 2 * i, 2);
        float x = ddp_bf16_f32(h);
        memcpy(b + 4 * i, &x, 4);
    }
}

int ddp_grad_narrow(ddp_kernels_t *k, float *p, size_t n, float *scratch)
{
    if (ddp_k_host_memory(k)) {
        ddp_grad_narrow_host(p, n);
        return 0;
    }
    DDP_CHECK(ddp_k_memcpy_d2h(k, scratch, p, n * sizeof(float)));
    ddp_grad_narrow_host(scratch, n);
    return ddp_k_memcpy_h2d(k, p, scratch, n * sizeof(uint16_t));
}

int ddp_grad_widen(ddp_kernels_t *k, float *p, size_t n, float *scratch)
{
    if (ddp_k_host_memory(k)) {
        ddp_grad_widen_host(p, n);
        return 0;
    }
    DDP_CHECK(ddp_k_memcpy_d2h(k, scratch, p, n * sizeof(uint16_t)));
    ddp_grad_widen_host(scratch, n);
    return ddp_k_memcpy_h2d(k, p, scratch, n * sizeof(float));
}
