/* Choosing the precision and fp16's dynamic loss scaling (loss_scale.h). */
#include "worker/optim/loss_scale.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/test_hook.h"

_Static_assert((int)DDP_PREC_FP32 == (int)DDP_KPREC_FP32 &&
                   (int)DDP_PREC_BF16 == (int)DDP_KPREC_BF16 &&
                   (int)DDP_PREC_FP16 == (int)DDP_KPREC_FP16,
               "the spec's precisions are the kernels'");

const char *ddp_prec_name(ddp_kprec_t prec)
{
    return prec == DDP_KPREC_BF16 ? "bf16" : prec == DDP_KPREC_FP16 ? "fp16" : "fp32";
}

int ddp_prec_select(ddp_kernels_t *k, ddp_precision_t asked, int log, ddp_kprec_t *out)
{
    const char *why = "";
    ddp_kprec_t p;
    if (asked == DDP_PREC_AUTO) {
        int native = ddp_k_prec_native(k, DDP_KPREC_BF16, &why);
        p = native ? DDP_KPREC_BF16 : DDP_KPREC_FP32;
        if (log)
            DDP_INFO("precision: auto -> %s on backend %s: %s", ddp_prec_name(p), ddp_k_name(k),
                     why);
    } else {
        p = (ddp_kprec_t)asked;
        int native = ddp_k_prec_native(k, p, &why);
        if (log)
            DDP_INFO("precision: %s (train.precision) on backend %s%s%s", ddp_prec_name(p),
                     ddp_k_name(k), native ? "" : ": ", native ? "" : why);
    }
    ddp_k_set_precision(k, p);
    *out = p;
    return 0;
}

void ddp_loss_scale_init(ddp_loss_scale_t *ls, ddp_kprec_t prec, long interval, ddp_position_t *pos)
{
    memset(ls, 0, sizeof *ls);
    ls->prec = prec;
    ls->enabled = prec == DDP_KPREC_FP16;
    ls->interval = interval > 0 ? interval : 2000;
    float s = pos->loss_scale;
    if (ls->enabled && isfinite(s) && s > 0 && s != 1.0f) return; /* resumed */
    pos->loss_scale = ls->enabled ? DDP_LOSS_SCALE_INIT : 1.0f;
    pos->loss_scale_clean = 0;
}

float ddp_loss_scale_factor(const ddp_position_t *pos, int rank)
{
    if (ddp_test_hook(DDP_HOOK_LOSS_SCALE, pos->step + 1, rank)) return INFINITY;
    return pos->loss_scale;
}

int ddp_loss_scale_update(ddp_loss_scale_t *ls, ddp_position_t *pos, int finite, int log)
{
    if (!ls->enabled) return 0;
    long step = pos->step + 1;
    if (!finite) {
        float old = pos->loss_scale;
        pos->loss_scale = old * 0.5f > 1.0f / 65536 ? old * 0.5f : old; /* floor at 2^-16 */
        pos->loss_scale_clean = 0;
        ls->overflows++;
        if (log)
            DDP_WARN("step %ld: fp16 overflow (non-finite gradient): update skipped, loss scale "
                     "%g -> %g",
                     step, old, pos->loss_scale);
        return 1;
    }
    if (++pos->loss_scale_clean >= ls->interval) {
        float old = pos->loss_scale;
        if (old * 2.0f <= 16777216.0f) pos->loss_scale = old * 2.0f; /* cap at 2^24 */
        pos->loss_scale_clean = 0;
        if (log && pos->loss_scale != old)
            DDP_INFO("step %ld: %ld clean fp16 steps: loss scale %g -> %g", step, ls->interval, old,
                     pos->loss_scale);
    }
    return 0;
}
