/* RMSNorm pieces shared by the backends (Llama). A row of C values is normalised as
 * xhat = x * rstd, rstd = 1 / sqrt(mean(x^2) + eps); y = xhat w (no mean, no bias).
 * Backward of one row, given dnorm_i = dy_i w_i (rstd depends on every x_j):
 *   dx_i = rstd (dnorm_i - xhat_i mean(dnorm xhat)). */
#ifndef DDP_KERNELS_MATH_RMSNORM_H
#define DDP_KERNELS_MATH_RMSNORM_H

#include "hd.h"

/* rstd from the row's sum of squares over C elements. */
DDP_HD float ddp_rmsnorm_rstd(float sum_sq, int C, float eps)
{
    return 1.0f / sqrtf(sum_sq / (float)C + eps);
}

/* y_i from x_i, the row's rstd and the channel's weight. */
DDP_HD float ddp_rmsnorm_y(float x, float rstd, float w) { return x * rstd * w; }

/* dx_i from dnorm_i, xhat_i and the row mean of dnorm*xhat. */
DDP_HD float ddp_rmsnorm_dx(float dnorm, float xhat, float mean_dnorm_xhat, float rstd)
{
    return rstd * (dnorm - xhat * mean_dnorm_xhat);
}

#endif
