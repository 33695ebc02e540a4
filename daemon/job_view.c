/* The live view of an active job (job.get, job.watch, the status page): its state and, from
 * the tail of metrics.jsonl, its step, loss, speed and time left. */
#include "daemon/job_view.h"

#include "common/clock.h"

json_t *ddpd_job_progress(const ddpd_job_t *j)
{
    json_t *o = json_pack("{sI ss ss ss si}", "id", (json_int_t)j->id, "name", j->name, "state",
                          ddpd_state_name(j->state), "reason", j->reason, "world", j->world);
    json_object_set_new(o, "steps", json_integer(j->steps));
    if (j->tail.last_step) {
        json_t *m = j->tail.last_step;
        json_object_set(o, "metrics", m);
        json_int_t step = json_integer_value(json_object_get(m, "step"));
        json_t *tot = json_object_get(m, "steps");
        long steps = json_is_integer(tot) ? (long)json_integer_value(tot) : j->steps;
        json_object_set_new(o, "step", json_integer(step));
        json_object_set_new(o, "steps", json_integer(steps));
        json_t *v;
        if ((v = json_object_get(m, "loss"))) json_object_set(o, "loss", v);
        if ((v = json_object_get(m, "tokens_per_s"))) json_object_set(o, "tokens_per_s", v);
        if ((v = json_object_get(m, "straggler"))) json_object_set(o, "straggler", v);
        double el = (double)(ddp_wall_ms() - j->tail.first_step_ms) / 1000.0;
        json_t *sms = json_object_get(m, "step_ms");
        double per_step = json_is_number(sms) ? json_number_value(sms) / 1000.0 : 0;
        if (per_step <= 0 && step > 0) per_step = el / (double)step;
        if (steps > step && per_step > 0)
            json_object_set_new(o, "eta_s", json_real((double)(steps - step) * per_step));
    }
    if (j->tail.done) json_object_set(o, "done", j->tail.done);
    return o;
}

