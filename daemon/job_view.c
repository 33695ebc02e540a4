/* The live view of an active job (job.get, job.watch, the status page): its state and, from
 * the tail of metrics.jsonl, its step, loss, speed and time left. */
#include "daemon/job_view.h"

#include <math.h>

#include "common/clock.h"

json_t *ddpd_job_progress(const ddpd_job_t *j)
{
    json_t *o = json_pack("{sI ss ss ss si}", "id", (json_int_t)j->id, "name", j->name, "state",
                          ddpd_state_name(j->state), "reason", j->reason, "world", j->world);
    json_object_set_new(o, "steps", json_integer(j->steps));
    if (j->tail.has_last) {
        const ddp_metrics_rec_t *r = &j->tail.last_step;
        json_t *m = ddp_metrics_to_json(r); /* the line as the file holds it */
        json_object_set_new(o, "metrics", m);
        json_int_t step = r->step;
        long steps = (r->has & DDP_MF(STEPS)) ? (long)r->steps : j->steps;
        json_object_set_new(o, "step", json_integer(step));
        json_object_set_new(o, "steps", json_integer(steps));
        json_t *v;
        if ((v = json_object_get(m, "loss"))) json_object_set(o, "loss", v);
        if ((v = json_object_get(m, "tokens_per_s"))) json_object_set(o, "tokens_per_s", v);
        if ((v = json_object_get(m, "straggler"))) json_object_set(o, "straggler", v);
        double el = (double)(ddp_wall_ms() - j->tail.first_step_ms) / 1000.0;
        double per_step =
            (r->has & DDP_MF(STEP_MS)) && isfinite(r->step_ms) ? r->step_ms / 1000.0 : 0;
        if (per_step <= 0 && step > 0) per_step = el / (double)step;
        if (steps > step && per_step > 0)
            json_object_set_new(o, "eta_s", json_real((double)(steps - step) * per_step));
    }
    if (j->tail.has_done) json_object_set_new(o, "done", ddp_metrics_to_json(&j->tail.done));
    return o;
}

