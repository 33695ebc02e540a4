/* The training loop: generations, and steps within them (see trainer.h).
 *
 * A static world (mpirun, the environment rendezvous, a world of one) is one generation: any
 * failure ends the run. An elastic world (DDP_ELASTIC=1) goes on after a failed collective or a
 * coordinator's notice: the rank leaves the generation, keeping weights, moments, step and RNG
 * in memory, joins the next one the coordinator forms, and redoes the step that was
 * interrupted. ddp_trainer_step commits a step with one small all-reduce before the update, so a
 * failure leaves every survivor at the same step, except when it strikes after that all-reduce
 * (then the coordinator picks the rank with the newest step as the source and the others take
 * its state). Each generation change is logged and written to metrics.jsonl by rank 0.
 * train.profile's window (observe/profile.h) is opened, paused and closed around the steps here.
 */
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "common/trace.h"
#include "common/log.h"
#include "worker/trainer.h"
#include "worker/saving/saving.h"

/* The run ends with a lost rank: the last completed step is saved from memory first (under
 * mpirun the survivors get SIGTERM and this runs inside the grace before SIGKILL). A ZeRO-1
 * run can do so on one host, where every rank's slices of the moments are readable. */
static int end_with_failure(ddp_trainer_t *t, int rc, ddp_errinfo_t *ei)
{
    if (!ddp_world_comm_error(&t->world, rc) || !t->member.has_state)
        return rc; /* a receiver has none */
    ddp_errinfo_t sei;
    ddp_errinfo_clear(&sei);
    /* ZeRO-1 on one host: the dead rank's slices of the moments are still in its shared
     * memory, which this process maps */
    int whole = t->saving && ddp_zero1_from_peers(&t->zero1);
    if (ddp_saving_emergency_save(t->saving, &t->pos, whole, &sei) != 0) {
        char msg[1024];
        DDP_ERROR("%s", ddp_errinfo_str(&sei, msg, sizeof msg));
    }
    return rc;
}

/* Generations that may end in a row before a step completes: failures of rank after rank (each
 * may die max_restarts times) are legitimate; the same error every time is not. */
#define DDP_MAX_STALLED_GENERATIONS 50

/* One step and the work at its boundary: the step line, the replica check, validation and a
 * checkpoint when due. */
static int step_and_boundary(ddp_trainer_t *t, ddp_errinfo_t *ei)
{
    const ddp_spec_t *s = &t->spec;
    DDP_CHECK(ddp_profile_before_step(&t->profile, &t->k, t->pos.step + 1));
    int64_t t0 = ddp_now_ns();
    float loss = 0;
    int rc = ddp_trainer_step(t, &loss, ei);
    if (rc) {
        ddp_k_profile_pause(&t->k); /* a regroup's work stays out of the window */
        return rc;
    }
    double ms = (double)(ddp_now_ns() - t0) / 1e6;
    /* the window pauses before the step's line (and closes after the last profiled step) */
    DDP_CHECK(ddp_profile_after_step(&t->profile, &t->k, t->pos.step, ms, t->last.comm.comm_ms,
                                     t->last.comm.exposed_ms, t->opts.run_dir, t->world.rank));
    ddp_trainer_log_step(t, loss, ms);
    /* limits.log_bytes also covers what libraries and stdio wrote straight to fds 1 and 2, which
     * ddp_log cannot count: one fstat a step (common/log.h) */
    ddp_log_check_limit();
    if (t->world.comm && s->check_every > 0 && t->pos.step % s->check_every == 0)
        DDP_CHECK(ddp_trainer_check_replicas(t, ei));
    if (t->data.have_val && (t->pos.step % s->val_every == 0 || t->pos.step == s->steps)) {
        float vl = 0;
        DDP_CHECK(ddp_trainer_validate(t, &vl, ei));
        ddp_trainer_log_val(t, vl);
    }
    if (t->evals.n) DDP_CHECK(ddp_trainer_evaluate(t, ei)); /* multiple-choice tasks */
    return ddp_saving_after_step(t->saving, &t->pos, t->stop.any, ei);
}

/* Leaves the current generation and joins the next (blocking until it forms). */
static int next_generation(ddp_trainer_t *t, const char *cause, ddp_errinfo_t *ei)
{
    int64_t t0 = ddp_now_ns();
    unsigned long long old_gen = (unsigned long long)t->member.gen.gen;
    int old_world = t->world.size;
    DDP_WARN("generation %llu ends at step %ld: %s", old_gen, t->pos.step, cause);
    ddp_trainer_leave_world(t);
    ddp_regroup_stats_t st;
    DDP_CHECK(ddp_trainer_join_world(t, &st, ei));
    double ms = (double)(ddp_now_ns() - t0) / 1e6;
    DDP_INFO("generation %llu: rank %d of %d (was %d ranks), resuming after step %ld; formed "
             "in %.0f ms%s (cause: %s)",
             (unsigned long long)t->member.gen.gen, t->world.rank, t->world.size, old_world,
             t->pos.step, ms, st.shrunk ? ", its communicator the last one shrunk" : "",
             t->member.gen.why);
    if (t->transfer.active) /* overlapped (a pause's transfer is over by now) */
        DDP_INFO("generation %llu: %d rank(s) take the state of step %ld from rank %d during "
                 "step %ld; this rank %s",
                 (unsigned long long)t->member.gen.gen, t->transfer.n_receivers, t->pos.step,
                 t->member.gen.source, t->pos.step + 1,
                 t->transfer.receiving ? "receives it" : "computes the step");
    ddp_trainer_log_generation(t, &st, ms);
    return 0;
}

int ddp_trainer_run(ddp_trainer_t *t, volatile sig_atomic_t *stop, ddp_errinfo_t *ei)
{
    const ddp_spec_t *s = &t->spec;
    long stop_at = t->opts.stop_at_step > 0 ? t->opts.stop_at_step : s->steps;
    t->log.run_t0 = ddp_now_ns();
    int stalled = 0; /* generations ended in a row without a completed step */
    ddp_profile_plan(&t->profile, s->profile, t->pos.step, stop_at < s->steps ? stop_at : s->steps);
    if (s->profile > 0 && t->world.rank == 0 && !t->opts.quiet) {
        if (t->profile.to >= t->profile.from)
            DDP_INFO("profile: steps %ld-%ld per op, after %ld warm-up step(s)",
                     t->profile.from, t->profile.to, t->profile.warmup);
        else
            DDP_INFO("profile: no step left to profile");
    }
    if (t->member.elastic) ddp_elastic_set_step(t->member.elastic, t->pos.step);
    while (t->pos.step < s->steps && t->pos.step < stop_at && !t->stop.any) {
        ddp_trace_step(t->pos.step + 1); /* train.trace */
        t->stop.requested = stop && *stop;
        int rc = step_and_boundary(t, ei);
        if (rc == 0 && t->member.regroup && t->pos.step < s->steps && !t->stop.any)
            rc = next_generation(t, "regroup at the step boundary", ei);
        if (rc == 0) stalled = 0;
        /* also a failure while the next generation forms */
        while (rc && ddp_trainer_generation_failed(t, rc)) {
            char cause[1100];
            snprintf(cause, sizeof cause, "%s", ei && ei->msg[0] ? ei->msg : ddp_strerror(rc));
            if (ei) ddp_errinfo_clear(ei);
            if (++stalled > DDP_MAX_STALLED_GENERATIONS) {
                /* the same failure every time (a bug, not a lost rank): stop going round */
                rc = ddp_errinfo_set(ei, rc, "no step completed in %d generations in a row; the "
                                     "last failure: %s", DDP_MAX_STALLED_GENERATIONS, cause);
                break;
            }
            rc = next_generation(t, cause, ei);
        }
        if (rc) {
            const char *why;
            if (t->member.elastic && ddp_elastic_lost(t->member.elastic, &why)) {
                rc = ddp_errinfo_set(ei, DDP_EABORTED, "%s", why);
            }
            return end_with_failure(t, rc, ei);
        }
    }
    DDP_CHECK(ddp_saving_finish(t->saving, &t->pos, t->stop.any, ei));
    if (t->member.elastic) {
        /* the coordinator closes once everyone is done */
        ddp_elastic_watch(t->member.elastic, NULL);
        DDP_CHECK(ddp_elastic_done(t->member.elastic, t->pos.step));
    }
    return 0;
}
