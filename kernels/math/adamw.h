/* One AdamW element update (PyTorch's torch.optim.AdamW, decoupled weight decay).
 * `bc1` = 1 - beta1^t and `bc2` = 1 - beta2^t are computed once per step by the caller.
 * `g` is the already scaled gradient. Updates *p, *m, *v in place. */
#ifndef DDP_KERNELS_MATH_ADAMW_H
#define DDP_KERNELS_MATH_ADAMW_H

#include "hd.h"

DDP_HD void ddp_adamw_elem(float *p, float *m, float *v, float g, float lr, float beta1,
                           float beta2, float eps, float wd, float bc1, float bc2)
{
    float mm = beta1 * *m + (1.0f - beta1) * g;
    float vv = beta2 * *v + (1.0f - beta2) * g * g;
    *m = mm;
    *v = vv;
    float mhat = mm / bc1;
    float vhat = vv / bc2;
    /* PyTorch applies the decay first: p *= 1 - lr*wd, then the Adam step. */
    float pp = *p * (1.0f - lr * wd);
    *p = pp - lr * mhat / (sqrtf(vhat) + eps);
}

#endif
