/* trainer.json's schedule block and spike windows (see trainer_ext.h). */
#include "worker/saving/trainer_ext.h"

#include <math.h>
#include <string.h>

#include "common/log.h"
#include "worker/optim/adamw.h"
#include "worker/optim/schedule.h"

json_t *ddp__trainer_ext_schedule(const ddp_spec_t *sp, const ddp_position_t *pos)
{
    long step = pos->step;
    /* the keys every earlier build wrote, in their order */
    json_t *o =
        json_pack("{s:I, s:f, s:f, s:I, s:I, s:s, s:f, s:f}", "step", (json_int_t)step,
                  "lr_at_step", ddp_lr_at(sp, step), "lr_last", ddp_lr_at(sp, step ? step - 1 : 0),
                  "warmup", (json_int_t)sp->warmup, "steps", (json_int_t)sp->steps, "kind",
                  ddp_schedule_name(sp->schedule), "lr", sp->lr, "min_lr", sp->min_lr);
    if (!o || sp->schedule != DDP_SCHED_WSD) return o;
    long start = ddp_schedule_decay_start(sp);
    json_t *w = json_pack("{s:I, s:I, s:s, s:I}", "decay_start", (json_int_t)start, "decay_steps",
                          (json_int_t)(sp->steps - start), "decay_shape",
                          ddp_decay_shape_name(sp->decay_shape), "forked_at",
                          (json_int_t)pos->ext.decay_forked_at);
    if (!w || json_object_update(o, w) != 0) {
        json_decref(w);
        json_decref(o);
        return NULL;
    }
    json_decref(w);
    return o;
}

static json_t *window_json(const ddp_spike_window_t *w)
{
    json_t *values = json_array();
    for (int i = 0; values && i < w->count; i++)
        if (json_array_append_new(values, json_real(w->values[i])) != 0) {
            json_decref(values);
            return NULL;
        }
    return values ? json_pack("{s:i, s:i, s:o}", "count", (int)w->count, "index", (int)w->index,
                              "values", values)
                  : NULL;
}

json_t *ddp__trainer_ext_spikes(const ddp_spec_t *spec, const ddp_position_t *pos)
{
    const ddp_spikes_t *s = &pos->ext.spikes;
    if (!ddp_spikes_on(spec) && pos->skipped == 0 && s->skipped_loss == 0 && s->skipped_norm == 0)
        return NULL;
    return json_pack("{s:i, s:I, s:I, s:I, s:o*, s:o*}", "window", spec->skip_window,
                     "skipped_nonfinite", (json_int_t)pos->skipped, "skipped_loss",
                     (json_int_t)s->skipped_loss, "skipped_norm", (json_int_t)s->skipped_norm,
                     "loss", window_json(&s->loss), "norm", window_json(&s->norm));
}

static json_int_t get_int(json_t *o, const char *key, json_int_t dflt)
{
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? json_integer_value(v) : dflt;
}

/* One saved window into w (a window of `size`); a malformed one is an error. */
static int read_window(json_t *o, int size, ddp_spike_window_t *w, const char *path,
                       const char *name, ddp_errinfo_t *ei)
{
    json_t *values = json_object_get(o, "values");
    json_int_t count = get_int(o, "count", -1), index = get_int(o, "index", -1);
    if (!json_is_array(values) || count < 0 || count > size || index < 0 ||
        index >= (count < size ? size : count) || json_array_size(values) != (size_t)count)
        return ddp_errinfo_set(ei, DDP_EFORMAT,
                               "%s/trainer.json: spikes.%s is not a window of %d values", path,
                               name, size);
    memset(w, 0, sizeof *w);
    for (size_t i = 0; i < (size_t)count; i++) {
        json_t *v = json_array_get(values, i);
        if (!json_is_number(v) || !isfinite(json_number_value(v)))
            return ddp_errinfo_set(ei, DDP_EFORMAT,
                                   "%s/trainer.json: spikes.%s.values[%zu] is "
                                   "not a finite number",
                                   path, name, i);
        w->values[i] = json_number_value(v);
    }
    w->count = (int32_t)count;
    w->index = (int32_t)index;
    return 0;
}

static int read_spikes(const ddp_spec_t *spec, json_t *o, const char *path, int log,
                       ddp_position_t *pos, ddp_errinfo_t *ei)
{
    json_t *sk = json_object_get(o, "spikes");
    if (!json_is_object(sk)) return 0; /* an older trainer.json, or no skipping */
    ddp_spikes_t *s = &pos->ext.spikes;
    memset(s, 0, sizeof *s);
    pos->skipped = (int)get_int(sk, "skipped_nonfinite", 0);
    s->skipped_loss = get_int(sk, "skipped_loss", 0);
    s->skipped_norm = get_int(sk, "skipped_norm", 0);
    if (!ddp_spikes_on(spec)) return 0;
    json_int_t window = get_int(sk, "window", 0);
    if (window != spec->skip_window) {
        if (log)
            DDP_INFO("checkpoint %s: train.skip_window changed from %lld to %d: the spike "
                     "windows start empty (no skipping for %d steps)",
                     path, (long long)window, spec->skip_window, spec->skip_window);
        return 0;
    }
    DDP_CHECK(
        read_window(json_object_get(sk, "loss"), spec->skip_window, &s->loss, path, "loss", ei));
    return read_window(json_object_get(sk, "norm"), spec->skip_window, &s->norm, path, "norm", ei);
}

/* ddp.grad_dtype may change at a resume: it is the precision the gradients travel in, not
 * state (a checkpoint holds fp32 weights and moments either way); the change is logged. The saved
 * spec names it only when it was bf16 (a quiet field at its default, or an older build). */
static void note_grad_dtype(const ddp_spec_t *spec, json_t *o, long step, int log)
{
    json_t *ddp = json_object_get(json_object_get(o, "spec"), "ddp");
    const char *was = json_string_value(json_object_get(ddp, "grad_dtype"));
    const char *now = spec->grad_dtype == DDP_GRAD_BF16 ? "bf16" : "fp32";
    if (!was) was = "fp32";
    if (log && strcmp(was, now) != 0)
        DDP_INFO("ddp.grad_dtype: resumed at step %ld with the gradients all-reduced in %s, the "
                 "checkpoint's run in %s (their communication precision, not state: allowed)",
                 step, now, was);
}

int ddp__trainer_ext_read(const ddp_spec_t *spec, json_t *o, const char *path, int log,
                          ddp_position_t *pos, ddp_errinfo_t *ei)
{
    json_t *sch = json_object_get(o, "schedule");
    ddp_schedule_saved_t saved = {0};
    const char *kind = json_string_value(json_object_get(sch, "kind"));
    if (kind && ddp_schedule_parse(kind, &saved.kind) == 0 && get_int(sch, "steps", 0) > 0) {
        saved.present = 1;
        saved.steps = (long)get_int(sch, "steps", 0);
        saved.decay_start = (long)get_int(sch, "decay_start", 0);
        saved.forked_at = (long)get_int(sch, "forked_at", 0);
    }
    ddp_schedule_resumed_t r;
    ddp_errinfo_t sei;
    ddp_errinfo_clear(&sei);
    if (ddp_schedule_resume(spec, &saved, pos->step, &r, &sei) != 0) {
        if (ei) *ei = sei;
        return DDP_ESPEC;
    }
    pos->ext.decay_forked_at = r.forked_at;
    if (log && r.changed && spec->schedule == DDP_SCHED_WSD)
        DDP_INFO("schedule: train.steps %ld (the checkpoint's %ld): the wsd decay (%s, to "
                 "min_lr %g) now starts at step %ld%s and ends at step %ld",
                 spec->steps, saved.steps, ddp_decay_shape_name(spec->decay_shape), spec->min_lr,
                 r.decay_start,
                 r.forked_at ? ", the resumed step, which is past the spec's decay start" : "",
                 spec->steps);
    json_t *was = json_object_get(sch, "lr_at_step");
    if (log && r.forked_at && json_is_number(was) && json_number_value(was) < spec->lr * 0.999)
        DDP_WARN("schedule: the checkpoint of step %ld was in its decay already (lr %g): the new "
                 "decay starts again from train.lr %g",
                 pos->step, json_number_value(was), spec->lr);
    if (log && r.changed && spec->schedule != DDP_SCHED_WSD)
        DDP_WARN("schedule: resumed at step %ld with the %s schedule over train.steps %ld where "
                 "the checkpoint's was %s over %ld (train.allow_schedule_change)",
                 pos->step, ddp_schedule_name(spec->schedule), spec->steps,
                 ddp_schedule_name(saved.kind), saved.steps);
    note_grad_dtype(spec, o, pos->step, log);
    return read_spikes(spec, o, path, log, pos, ei);
}
