/* LayerNorm pieces shared by the backends. A row of C values is normalised as
 * xhat = (x - mean) * rstd, rstd = 1 / sqrt(var + eps) with the biased variance; y = xhat w + b.
 * Backward of one row, given dnorm_i = dy_i w_i:
 *   dx_i = rstd (dnorm_i - mean(dnorm) - xhat_i mean(dnorm xhat)). */
#ifndef DDP_KERNELS_MATH_LAYERNORM_H
#define DDP_KERNELS_MATH_LAYERNORM_H

#include "hd.h"

#define DDP_LAYERNORM_EPS 1e-5f

/* rstd from the row's sum of squared deviations sum (x - mean)^2 over C elements, with eps. */
DDP_HD float ddp_layernorm_rstd_eps(float sum_sq_dev, int C, float eps)
{
    return 1.0f / sqrtf(sum_sq_dev / (float)C + eps);
}

/* The same with layernorm_fwd's eps (DDP_LAYERNORM_EPS). */
DDP_HD float ddp_layernorm_rstd(float sum_sq_dev, int C)
{
    return ddp_layernorm_rstd_eps(sum_sq_dev, C, DDP_LAYERNORM_EPS);
}

/* y_i from x_i, the row's mean and rstd, and the channel's weight and bias. */
DDP_HD float ddp_layernorm_y(float x, float mean, float rstd, float w, float b)
{
    return (x - mean) * rstd * w + b;
}

/* dx_i from dnorm_i, xhat_i and the row means of dnorm and dnorm*xhat. */
DDP_HD float ddp_layernorm_dx(float dnorm, float xhat, float mean_dnorm, float mean_dnorm_xhat,
                              float rstd)
{
    return rstd * (dnorm - mean_dnorm - xhat * mean_dnorm_xhat);
}

#endif
