/* The learning-rate schedule after warmup and the resume rule (see schedule.h). */
#include "worker/optim/schedule.h"

#include <math.h>
#include <string.h>

static const char *const KINDS[] = {
    [DDP_SCHED_COSINE] = "cosine", [DDP_SCHED_CONSTANT] = "constant", [DDP_SCHED_WSD] = "wsd"};
static const char *const SHAPES[] = {
    [DDP_DECAY_LINEAR] = "linear", [DDP_DECAY_1_SQRT] = "1-sqrt", [DDP_DECAY_COSINE] = "cosine"};

const char *ddp_schedule_name(ddp_schedule_t kind)
{
    return (unsigned)kind < sizeof KINDS / sizeof *KINDS ? KINDS[kind] : "?";
}

int ddp_schedule_parse(const char *name, ddp_schedule_t *kind)
{
    for (unsigned i = 0; i < sizeof KINDS / sizeof *KINDS; i++)
        if (name && strcmp(name, KINDS[i]) == 0) {
            *kind = (ddp_schedule_t)i;
            return 0;
        }
    return -1;
}

const char *ddp_decay_shape_name(ddp_decay_shape_t shape)
{
    return (unsigned)shape < sizeof SHAPES / sizeof *SHAPES ? SHAPES[shape] : "?";
}

long ddp_schedule_decay_start(const ddp_spec_t *spec)
{
    long n = spec->steps;
    if (spec->schedule != DDP_SCHED_WSD) return n;
    long d = spec->decay_steps > 0 ? spec->decay_steps : lround(spec->decay_frac * (double)n);
    if (d < 0) d = 0;
    if (d > n) d = n;
    long start = n - d;
    return start > spec->warmup ? start : (spec->warmup < n ? spec->warmup : n);
}

double ddp_decay_factor(ddp_decay_shape_t shape, double r)
{
    if (!(r > 0)) r = 0; /* NaN too */
    if (r > 1) r = 1;
    switch (shape) {
    case DDP_DECAY_LINEAR: return 1.0 - r;
    case DDP_DECAY_1_SQRT: return 1.0 - sqrt(r);
    case DDP_DECAY_COSINE: return 0.5 * (1.0 + cos(M_PI * r));
    }
    return 1.0;
}

double ddp_schedule_lr(const ddp_spec_t *spec, long step)
{
    if (spec->schedule == DDP_SCHED_CONSTANT) return spec->lr;
    if (spec->schedule == DDP_SCHED_WSD) {
        long start = ddp_schedule_decay_start(spec);
        if (step < start || start >= spec->steps) return spec->lr;
        double r = (double)(step - start) / (double)(spec->steps - start);
        return spec->min_lr + ddp_decay_factor(spec->decay_shape, r) * (spec->lr - spec->min_lr);
    }
    if (spec->steps <= spec->warmup) return spec->lr; /* cosine, as it always was */
    double progress = (double)(step - spec->warmup) / (double)(spec->steps - spec->warmup);
    if (progress > 1.0) progress = 1.0;
    double coeff = 0.5 * (1.0 + cos(M_PI * progress));
    return spec->min_lr + coeff * (spec->lr - spec->min_lr);
}

int ddp_schedule_resume(const ddp_spec_t *spec, const ddp_schedule_saved_t *saved, long step,
                        ddp_schedule_resumed_t *out, ddp_errinfo_t *ei)
{
    long own_start = ddp_schedule_decay_start(spec);
    *out = (ddp_schedule_resumed_t){.decay_start = own_start};
    if (!saved->present) return 0; /* an older trainer.json without one: nothing to compare */
    int same_kind = saved->kind == spec->schedule;
    if (same_kind && spec->schedule == DDP_SCHED_WSD && saved->steps == spec->steps) {
        /* the same decay unless the spec moved it (another decay_steps or decay_frac) */
        long kept = saved->forked_at > own_start ? saved->forked_at : own_start;
        if (saved->decay_start == 0 || kept == saved->decay_start) {
            out->forked_at = saved->forked_at > own_start ? saved->forked_at : 0;
            out->decay_start = kept;
            return 0;
        }
    } else if (same_kind && saved->steps == spec->steps) {
        return 0;
    }
    out->changed = 1;
    const char *was = ddp_schedule_name(saved->kind), *now = ddp_schedule_name(spec->schedule);
    if (!same_kind && !spec->allow_schedule_change)
        return ddp_errinfo_set(ei, DDP_ESPEC,
                               "resume at step %ld: the checkpoint's schedule is %s (train.steps "
                               "%ld) and this spec's is %s; a changed schedule is refused unless "
                               "--set train.allow_schedule_change=true",
                               step, was, saved->steps, now);
    if (spec->schedule == DDP_SCHED_COSINE && !spec->allow_schedule_change)
        return ddp_errinfo_set(ei, DDP_ESPEC,
                               "resume at step %ld: train.steps changed from %ld to %ld under the "
                               "cosine schedule, which would jump the learning rate (the cosine "
                               "is stretched over the new steps); refused unless --set "
                               "train.allow_schedule_change=true",
                               step, saved->steps, spec->steps);
    if (spec->schedule == DDP_SCHED_WSD && step > own_start && step < spec->steps) {
        out->forked_at = step; /* past the new start: the decay starts here */
        out->decay_start = step;
    }
    return 0;
}

void ddp_schedule_fork(ddp_spec_t *spec, long forked_at)
{
    if (spec->schedule != DDP_SCHED_WSD || forked_at <= 0 || forked_at >= spec->steps) return;
    if (forked_at <= ddp_schedule_decay_start(spec)) return;
    spec->decay_steps = spec->steps - forked_at;
}
