/* LayerNorm pieces shared by the backends. A row of C values is normalised as
 * xhat = (x - mean) * rstd, rstd = 1 / sqrt(var + eps) with the biased variance; y = xhat w + b.
 * Backward of one row, given dnorm_i = dy_i w_i:
 *   dx_i = rstd (dnorm_i - mean(dnorm) - xhat_i mean(dnorm xhat)). */
#ifndef DDP_KERNELS_MATH_LAYERNORM_H
#define DDP_KERNELS_MATH_LAYERNORM_H

#include "hd.h"

#define DDP_LAYERNORM_EPS 1e-5f

/* rstd from the row's sums: sum x and sum (x - mean)^2 over C elements. */
DDP_HD float ddp_layernorm_rstd(float sum_sq_dev, int C)
{
    return 1.0f / sqrtf(sum_sq_dev / (float)C + DDP_LAYERNORM_EPS);
}

/* dx_i from dnorm_i, xhat_i and the row means of dnorm and dnorm*xhat. */
DDP_HD float ddp_layernorm_dx(float dnorm, float xhat, float mean_dnorm, float mean_dnorm_xhat,
                              float rstd)
{
    return rstd * (dnorm - mean_dnorm - xhat * mean_dnorm_xhat);
}

#endif
