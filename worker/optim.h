/* AdamW over the parameter arena, the learning-rate schedule, and global-norm clipping.
 *
 * The two moment arenas (m, v) have the parameter arena's layout. Weight decay applies to the
 * tensors whose descriptor says so (2-D tensors), decoupled as in torch.optim.AdamW. The
 * gradient arena holds a SUM (over micro-steps and ranks); `grad_scale` = 1/N turns it into
 * the average, and clipping multiplies it further, all fused into the update.
 */
#ifndef DDP_WORKER_OPTIM_H
#define DDP_WORKER_OPTIM_H

#include "proto/spec.h"
#include "worker/gpt2.h"

typedef struct ddp_adamw {
    float *m, *v; /* moment arenas (device), n_params floats each */
    size_t n;
    long t; /* updates taken; the next update uses t + 1 */
} ddp_adamw_t;

/* Allocates zeroed moments for model m on its backend. */
int ddp_adamw_init(ddp_adamw_t *opt, const ddp_gpt2_t *model);
/* Frees the moments. NULL-safe. */
void ddp_adamw_close(ddp_adamw_t *opt, const ddp_gpt2_t *model);

/* Learning rate at optimizer step `step` (0-based): linear warmup over spec->warmup steps to
 * spec->lr, then constant or cosine decay to spec->min_lr at spec->steps. */
double ddp_lr_at(const ddp_spec_t *spec, long step);

/* Global L2 norm of the averaged gradient: sqrt(sum g^2) * grad_scale, summed in double per
 * tensor in arena order (deterministic). */
int ddp_grad_norm(const ddp_gpt2_t *model, float grad_scale, double *norm);

/* One AdamW update of every tensor with learning rate lr; the gradient used is
 * grad * grad_scale * clip_coef, clip_coef = min(1, clip / norm) when clip > 0. */
int ddp_adamw_step(ddp_adamw_t *opt, ddp_gpt2_t *model, const ddp_spec_t *spec, double lr,
                   float grad_scale, double norm);

#endif
