/* AdamW, schedule and clipping (see optim.h). */
#include "optim.h"

#include <math.h>

int ddp_adamw_init(ddp_adamw_t *opt, const ddp_gpt2_t *model)
{
    ddp_kernels_t *k = model->k;
    size_t bytes = model->n_params * sizeof(float);
    opt->m = opt->v = NULL;
    opt->n = model->n_params;
    opt->t = 0;
    int rc = k->ops->alloc(k->ctx, (void **)&opt->m, bytes);
    if (rc == 0) rc = k->ops->alloc(k->ctx, (void **)&opt->v, bytes);
    if (rc) ddp_adamw_close(opt, model);
    return rc;
}

void ddp_adamw_close(ddp_adamw_t *opt, const ddp_gpt2_t *model)
{
    if (!opt || !model || !model->k) return;
    model->k->ops->free(model->k->ctx, opt->m);
    model->k->ops->free(model->k->ctx, opt->v);
    opt->m = opt->v = NULL;
}

double ddp_lr_at(const ddp_spec_t *spec, long step)
{
    if (spec->warmup > 0 && step < spec->warmup)
        return spec->lr * (double)(step + 1) / (double)spec->warmup;
    if (spec->schedule == DDP_SCHED_CONSTANT || spec->steps <= spec->warmup) return spec->lr;
    double progress = (double)(step - spec->warmup) / (double)(spec->steps - spec->warmup);
    if (progress > 1.0) progress = 1.0;
    double coeff = 0.5 * (1.0 + cos(M_PI * progress));
    return spec->min_lr + coeff * (spec->lr - spec->min_lr);
}

int ddp_grad_norm(const ddp_gpt2_t *model, float grad_scale, double *norm)
{
    ddp_kernels_t *k = model->k;
    double total = 0;
    for (int i = 0; i < model->n_tensors; i++) {
        const ddp_param_desc_t *p = &model->params[i];
        double s = 0;
        DDP_K(k, sumsq, &s, model->g + p->offset, p->numel);
        total += s;
    }
    DDP_CHECK(k->ops->sync(k->ctx));
    *norm = sqrt(total) * (double)grad_scale;
    return 0;
}

int ddp_adamw_step(ddp_adamw_t *opt, ddp_gpt2_t *model, const ddp_spec_t *spec, double lr,
                   float grad_scale, double norm)
{
    ddp_kernels_t *k = model->k;
    double clip_coef = 1.0;
    if (spec->clip > 0 && norm > spec->clip) clip_coef = spec->clip / (norm + 1e-6);
    float scale = (float)((double)grad_scale * clip_coef);
    opt->t++;
    for (int i = 0; i < model->n_tensors; i++) {
        const ddp_param_desc_t *p = &model->params[i];
        float wd = p->decay ? (float)spec->weight_decay : 0.0f;
        DDP_K(k, adamw, model->w + p->offset, model->g + p->offset, opt->m + p->offset,
              opt->v + p->offset, p->numel, (float)lr, (float)spec->beta1, (float)spec->beta2,
              (float)spec->eps, wd, scale, (int)opt->t);
    }
    return k->ops->sync(k->ctx);
}
