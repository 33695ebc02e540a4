/* What the trainer writes about its run: a step's line in the log (rank 0, every log_every
 * steps), and every record of metrics.jsonl (rank 0: steps, validations, generations, state
 * transfers, the end; see trainer.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "worker/trainer.h"

void ddp_trainer_log_step(ddp_trainer_t *t, float loss, double ms)
{
    const ddp_spec_t *s = &t->spec;
    const ddp_reducer_stats_t *c = &t->last.comm;
    double tok = (double)t->deal.n_micro * s->micro_batch * s->seq_len;
    double tps = tok / (ms / 1000.0);
    double mfu = ddp_mfu_of(&t->log.mfu, tps / t->world.size); /* per rank */
    char mfu_text[24] = "";
    if (!isnan(mfu)) snprintf(mfu_text, sizeof mfu_text, " | MFU %4.1f%%", 100.0 * mfu);
    double lr = ddp_lr_at(s, t->pos.step - 1);
    t->last.ms = ms;
    char world[80] = "";
    if (t->member.elastic)
        snprintf(world, sizeof world, " | world %d, gen %llu", t->world.size,
                 (unsigned long long)t->member.gen.gen);
    if (t->loss_scale.enabled) /* fp16 */
        snprintf(world + strlen(world), sizeof world - strlen(world), " | scale %g",
                 t->pos.loss_scale);
    const char *skipped = ddp_skip_name(t->last.skipped); /* NULL: the update was applied */
    if (skipped)
        snprintf(world + strlen(world), sizeof world - strlen(world), " | skipped: %s", skipped);
    int64_t skips =
        t->pos.skipped + t->pos.ext.spikes.skipped_loss + t->pos.ext.spikes.skipped_norm;
    if (t->world.rank == 0 && !t->opts.quiet &&
        (t->pos.step % s->log_every == 0 || t->pos.step == s->steps)) {
        if (t->world.comm)
            DDP_INFO("step %5ld/%ld | loss %.4f | lr %.2e | norm %.3f | %8.0f tok/s%s | %7.1f ms | "
                     "compute %.1f ms | comm %.1f ms, exposed %.1f ms, %.0f%% hidden%s",
                     t->pos.step, s->steps, loss, lr, t->pos.last_norm, tps, mfu_text, ms,
                     t->last.compute_ms, c->comm_ms, c->exposed_ms, 100.0 * c->hidden, world);
        else
            DDP_INFO("step %5ld/%ld | loss %.4f | lr %.2e | norm %.3f | %8.0f tok/s%s | %7.1f ms%s",
                     t->pos.step, s->steps, loss, lr, t->pos.last_norm, tps, mfu_text, ms, world);
    }
    if (t->log.metrics && t->pos.step > t->log.logged_step) {
        /* a skipped step's norm (or a diverged loss) is not finite: the codec writes null */
        ddp_metrics_rec_t r;
        ddp_metrics_init(&r, DDP_METRICS_STEP);
        r.step = t->pos.step;
        r.steps = s->steps;
        r.loss = loss;
        r.lr = lr;
        r.grad_norm = t->pos.last_norm;
        r.tokens_per_s = tps;
        r.step_ms = ms;
        r.compute_ms = t->last.compute_ms;
        r.comm_ms = c->comm_ms;
        r.exposed_comm_ms = c->exposed_ms;
        r.hidden = c->hidden;
        r.optim_ms = t->last.optim_ms;
        r.tokens = (int64_t)t->pos.tokens;
        r.world = t->world.size;
        r.generation = (int64_t)t->member.gen.gen;
        r.straggler = t->stragglers.named;
        r.loss_scale = t->pos.loss_scale;
        r.wall_ms = (double)(ddp_now_ns() - t->log.run_t0) / 1e6;
        r.mfu = mfu;
        if (skipped) { /* optional fields, after the step line's own */
            snprintf(r.skipped, sizeof r.skipped, "%s", skipped);
            r.has |= DDP_MF(SKIPPED);
        }
        if (skips > 0) {
            r.skips = skips;
            r.has |= DDP_MF(SKIPS);
        }
        for (int d = 0; s->n_train > 1 && d < s->n_train; d++) /* a mixture: each source's tokens */
            ddp_metrics_add_named(&r, "tokens", s->train[d].name,
                                  (double)t->pos.ext.mix.count[d] * s->seq_len, true);
        ddp_metrics_sink_write(t->log.metrics, &r); /* a failed write is logged; training goes on */
        t->log.logged_step = t->pos.step;
    }
}

void ddp_trainer_log_val(ddp_trainer_t *t, float val_loss)
{
    const ddp_spec_t *s = &t->spec;
    char sets[600] = ""; /* a list's sets by name */
    for (int i = 0, at = 0; s->val_listed && i < t->data.have_val && at < (int)sizeof sets; i++)
        at += snprintf(sets + at, sizeof sets - (size_t)at, "%s%s %.4f", i ? ", " : " (",
                       s->val[i].name, t->data.val_losses[i]);
    if (sets[0]) strncat(sets, ")", sizeof sets - strlen(sets) - 1);
    if (t->world.rank == 0 && !t->opts.quiet)
        DDP_INFO("step %5ld/%ld | val loss %.4f%s", t->pos.step, t->spec.steps, val_loss, sets);
    if (!t->log.metrics) return;
    ddp_metrics_rec_t r;
    ddp_metrics_init(&r, DDP_METRICS_VAL);
    r.step = t->pos.step;
    r.val_loss = val_loss;
    for (int i = 0; s->val_listed && i < t->data.have_val; i++) /* val_loss/<set> */
        ddp_metrics_add_named(&r, "val_loss", s->val[i].name, t->data.val_losses[i], false);
    ddp_metrics_sink_write(t->log.metrics, &r);
}

void ddp_trainer_log_generation(ddp_trainer_t *t, const ddp_regroup_stats_t *st, double ms)
{
    if (!t->log.metrics) return;
    ddp_metrics_rec_t r;
    ddp_metrics_init(&r, DDP_METRICS_GENERATION);
    r.generation = (int64_t)t->member.gen.gen;
    r.world = t->world.size;
    r.step = t->pos.step;
    snprintf(r.cause, sizeof r.cause, "%s", t->member.gen.why); /* the codec escapes it */
    r.reconfig_ms = ms;
    r.form_ms = st->form_ms;
    r.comm_ms = st->comm_ms;
    r.attach_ms = st->attach_ms;
    r.state_ms = st->state_ms;
    r.receivers = st->receivers;
    r.source = t->member.gen.source;
    r.shrunk = st->shrunk;
    ddp_metrics_sink_write(t->log.metrics, &r);
}

void ddp_trainer_log_transfer(ddp_trainer_t *t, long state_step, double ms)
{
    if (!t->log.metrics) return;
    const ddp_transfer_t *x = &t->transfer;
    double mb = 3.0 * (double)t->model.n_params * sizeof(float) / 1e6;
    ddp_metrics_rec_t r;
    ddp_metrics_init(&r, DDP_METRICS_TRANSFER);
    r.generation = (int64_t)t->member.gen.gen;
    r.step = state_step;
    snprintf(r.mode, sizeof r.mode, "%s", x->overlap ? "overlap" : "pause");
    r.receivers = x->n_receivers;
    r.source = x->first_root;
    r.mb = mb;
    r.ms = ms;
    r.mb_per_s = mb * 1e3 / (ms > 0 ? ms : 1);
    ddp_metrics_sink_write(t->log.metrics, &r);
}

void ddp_trainer_log_done(ddp_trainer_t *t)
{
    if (!t->log.metrics) return;
    ddp_metrics_rec_t r;
    ddp_metrics_init(&r, DDP_METRICS_DONE);
    r.step = t->pos.step;
    r.final_loss = t->pos.last_loss;
    ddp_metrics_sink_write(t->log.metrics, &r);
}

void ddp_trainer_log_eval(ddp_trainer_t *t, const char *task, const ddp_mc_result_t *e, double ms)
{
    double n = e->n > 0 ? (double)e->n : 1;
    if (t->world.rank == 0 && !t->opts.quiet)
        DDP_INFO("step %5ld/%ld | eval %s: acc_norm %.4f, acc %.4f, acc_tok %.4f (%ld examples, "
                 "%.0f ms)",
                 t->pos.step, t->spec.steps, task, e->acc_norm / n, e->acc / n, e->acc_tok / n,
                 e->n, ms);
    if (!t->log.metrics) return;
    ddp_metrics_rec_t r;
    ddp_metrics_init(&r, DDP_METRICS_EVAL);
    r.step = t->pos.step;
    snprintf(r.task, sizeof r.task, "%s", task);
    r.examples = e->n;
    r.acc = e->acc / n;
    r.acc_norm = e->acc_norm / n;
    r.acc_tok = e->acc_tok / n;
    r.eval_ms = ms;
    r.tokens = e->tokens;
    ddp_metrics_sink_write(t->log.metrics, &r);
}
