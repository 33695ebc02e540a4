/* The learning-rate schedule after warmup, and what a resume may change of it (docs/training.md
 * has the formulas; ddp_lr_at in optim/adamw.h is the one entry the trainer calls).
 *
 * `step` is 0-based throughout, as in ddp_lr_at: the update that completes step s + 1 uses the
 * rate at s (llm.c's convention). With N = train.steps and W = train.warmup:
 *
 *   wsd (warmup-stable-decay): D = train.decay_steps, or round(train.decay_frac x N) when 0;
 *   the decay starts at S = max(N - D, W) and, for S <= s, r = min(1, (s - S) / (N - S)) and
 *   lr = min_lr + f(r) (lr - min_lr), f = 1 - r (linear), 1 - sqrt(r) (1-sqrt), or
 *   (1 + cos(pi r)) / 2 (cosine). Before S the rate is train.lr.
 *
 * Resume (a cooldown forks from a stable-phase checkpoint by resuming with another
 * train.steps): ddp_schedule_resume compares the checkpoint's schedule (trainer.json's
 * "schedule" block) with the spec's. A wsd run moves its decay to the new S; when the resumed
 * step is already past that S the decay starts at the resumed step instead ("forked_at") and
 * ends at the new train.steps. A cosine run, or a change of schedule kind, is refused unless
 * train.allow_schedule_change. Pure functions; any thread.
 */
#ifndef DDP_WORKER_OPTIM_SCHEDULE_H
#define DDP_WORKER_OPTIM_SCHEDULE_H

#include "common/err.h"
#include "proto/spec.h"

/* The schedule's name as trainer.json and the logs write it: "cosine", "constant", "wsd". */
const char *ddp_schedule_name(ddp_schedule_t kind);
/* The kind named `name` into *kind; -1 for an unknown name. */
int ddp_schedule_parse(const char *name, ddp_schedule_t *kind);
/* The decay shape's name: "linear", "1-sqrt", "cosine". */
const char *ddp_decay_shape_name(ddp_decay_shape_t shape);

/* wsd: the step S at which the decay starts (the formula above; N when the decay is empty).
 * Other schedules: spec->steps. */
long ddp_schedule_decay_start(const ddp_spec_t *spec);

/* wsd: the multiplier f(r) of (lr - min_lr) for r in [0, 1] (r outside is clamped). */
double ddp_decay_factor(ddp_decay_shape_t shape, double r);

/* The rate after warmup at step `step` (ddp_lr_at's part for step >= warmup). */
double ddp_schedule_lr(const ddp_spec_t *spec, long step);

/* A checkpoint's schedule block, as trainer.json holds it (optional fields absent: 0). */
typedef struct ddp_schedule_saved {
    int present;         /* the checkpoint had a "schedule" block with "kind" and "steps" */
    ddp_schedule_t kind; /* "kind" (older builds wrote "constant" for any non-cosine) */
    long steps;          /* "steps" */
    long decay_start;    /* wsd: "decay_start", the step its decay started (0: absent) */
    long forked_at;      /* wsd: "forked_at", the resume that moved its decay (0: none) */
} ddp_schedule_saved_t;

/* What a resume decides. */
typedef struct ddp_schedule_resumed {
    int changed;      /* the spec's schedule differs from the checkpoint's */
    long forked_at;   /* wsd: the decay starts here instead of the spec's S (0: at S) */
    long decay_start; /* wsd: where the decay now starts (the log says so); else spec->steps */
} ddp_schedule_resumed_t;

/* The resume rule at step `step` of a checkpoint whose schedule was *saved, for the run's spec:
 * unchanged (same kind and steps, and for wsd the same decay start): *out keeps the
 * checkpoint's forked_at. Changed: wsd (from wsd) moves its decay (forked_at = step when step is
 * past the spec's S, else 0); constant takes the new steps; cosine, or another kind than the
 * checkpoint's, is refused unless spec->allow_schedule_change. Returns 0 or DDP_ESPEC with ei
 * naming the change and the flag. Pure. */
int ddp_schedule_resume(const ddp_spec_t *spec, const ddp_schedule_saved_t *saved, long step,
                        ddp_schedule_resumed_t *out, ddp_errinfo_t *ei);

/* Makes spec's wsd decay start at forked_at when that is past its own S (ddp_lr_at then decays
 * from forked_at to spec->steps): sets spec->decay_steps = steps - forked_at. Nothing for
 * another schedule, forked_at 0, or forked_at >= steps. */
void ddp_schedule_fork(ddp_spec_t *spec, long forked_at);

#endif
