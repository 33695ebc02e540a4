/* Softmax and cross-entropy pieces. A row is normalised against its maximum for stability:
 * p_i = exp(x_i - max) / sum_j exp(x_j - max); loss = log(sum) - (x_t - max). */
#ifndef DDP_KERNELS_MATH_SOFTMAX_H
#define DDP_KERNELS_MATH_SOFTMAX_H

#include "fastexp.h"
#include "hd.h"

/* exp(x - max) for one element of a row. */
DDP_HD float ddp_softmax_exp(float x, float row_max) { return expf(x - row_max); }

/* The same on ddp_expf_approx (about 2 ulp; loops over it vectorise on the CPU). */
DDP_HD float ddp_softmax_exp_approx(float x, float row_max)
{
    return ddp_expf_approx(x - row_max);
}

/* Cross-entropy of the row whose target logit is x_t, from its max and sum of exponentials. */
DDP_HD float ddp_xent_loss(float x_t, float row_max, float sum_exp)
{
    return logf(sum_exp) - (x_t - row_max);
}

/* d loss / d x_i = (p_i - [i == t]) * dloss. */
DDP_HD float ddp_xent_grad(float p_i, int is_target, float dloss)
{
    return (p_i - (is_target ? 1.0f : 0.0f)) * dloss;
}

/* Attention softmax backward for one element: dpre_i = p_i (dp_i - sum_j p_j dp_j). */
DDP_HD float ddp_softmax_bwd(float p_i, float dp_i, float dot_p_dp) { return p_i * (dp_i - dot_p_dp); }

#endif
