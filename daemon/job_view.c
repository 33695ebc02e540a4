/* What the rest of the daemon reads of a job: job.h's accessors, and the live view of an
 * active job (job.get, job.watch, the status page) with, from the tail of metrics.jsonl, its
 * step, loss, speed and time left. Part of the job module (job_int.h): it reads the fields and
 * writes none.
 */
#include "daemon/job_view.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>

#include "common/clock.h"
#include "daemon/job_int.h"

ddpd_job_t *ddpd_job_first(ddpd_t *d) { return d->jobs; }
ddpd_job_t *ddpd_job_next(const ddpd_job_t *j) { return j->next; }
int64_t ddpd_job_id(const ddpd_job_t *j) { return j->id; }
const char *ddpd_job_name(const ddpd_job_t *j) { return j->name; }
ddpd_state_t ddpd_job_state(const ddpd_job_t *j) { return j->state; }
int ddpd_job_world(const ddpd_job_t *j) { return j->world; }
uint32_t ddpd_job_uid(const ddpd_job_t *j) { return j->uid; }
const char *ddpd_job_run_dir(const ddpd_job_t *j) { return j->run_dir; }
const char *ddpd_job_warning(const ddpd_job_t *j) { return j->warning; }
int ddpd_job_local_ranks(const ddpd_job_t *j) { return j->n_local; }
int ddpd_job_coordinated(const ddpd_job_t *j) { return j->coord != NULL; }

int ddpd_job_signal_local(ddpd_job_t *j, int sig)
{
    int n = 0;
    for (int i = 0; i < j->n_local; i++)
        n += ddpd_proc_request(&j->procs[i], sig);
    return n;
}

int64_t ddpd_job_submitted_ms(const ddpd_job_t *j) { return j->submitted_ms; }

int ddpd_job_queued_of(ddpd_t *d, uint32_t uid)
{
    int n = 0;
    for (const ddpd_job_t *j = d->jobs; j; j = j->next) n += ddpd_job_waiting(j) && j->uid == uid;
    return n;
}

int ddpd_job_ranks_of(ddpd_t *d, uint32_t uid)
{
    int n = 0;
    for (const ddpd_job_t *j = d->jobs; j; j = j->next)
        if (j->uid == uid && !j->freeing && j->state != DDPD_QUEUED &&
            !ddpd_state_terminal(j->state))
            n += j->world;
    return n;
}

int ddpd_job_rank_peer(const ddpd_job_t *j, int rank)
{
    if (!j->rank_node || rank < 0 || rank >= j->world) return -1;
    return j->rank_node[rank] > 0 ? j->rank_node[rank] - 1 : -1;
}

int ddpd_job_waiting(const ddpd_job_t *j) { return j->state == DDPD_QUEUED && !j->freeing; }

int ddpd_job_lost_ranks(const ddpd_job_t *j, int *ranks)
{
    if (j->state != DDPD_RUNNING || j->freeing || j->n_unplaced <= 0) return 0;
    if (!ranks) return j->n_unplaced;
    int n = 0;
    for (int r = 0; r < j->world; r++)
        if (j->rank_node[r] < 0) ranks[n++] = r;
    return n;
}

int ddpd_job_generation(const ddpd_job_t *j, unsigned long *gen)
{
    if (!j->coord || ddpd_state_terminal(j->state)) return 0;
    *gen = j->generation;
    return 1;
}

const ddp_metrics_rec_t *ddpd_job_last_step(const ddpd_job_t *j)
{
    return j->tail.has_last ? &j->tail.last_step : NULL;
}

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
        if ((v = json_object_get(m, "mfu"))) json_object_set(o, "mfu", v);
        if ((v = json_object_get(m, "straggler"))) json_object_set(o, "straggler", v);
        if ((v = json_object_get(m, "skips"))) json_object_set(o, "skips", v); /* skipped updates */
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

