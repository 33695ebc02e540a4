/* A step's line: the log (rank 0, every log_every steps) and metrics.jsonl (see train.h). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "worker/train.h"

void ddp_trainer_log_step(ddp_trainer_t *t, float loss, double ms)
{
    const ddp_spec_t *s = &t->spec;
    const ddp_reducer_stats_t *c = &t->comm_stats;
    double tok = (double)t->n_micro * s->micro_batch * s->seq_len;
    double tps = tok / (ms / 1000.0);
    double lr = ddp_lr_at(s, t->step - 1);
    t->last_step_ms = ms;
    char world[80] = "";
    if (t->elastic)
        snprintf(world, sizeof world, " | world %d, gen %llu", t->opts.world,
                 (unsigned long long)t->gen.gen);
    if (t->lscale.enabled) /* fp16 */
        snprintf(world + strlen(world), sizeof world - strlen(world), " | scale %g",
                 t->lscale.scale);
    if (t->opts.rank == 0 && !t->opts.quiet &&
        (t->step % s->log_every == 0 || t->step == s->steps)) {
        if (t->comm)
            DDP_INFO("step %5ld/%ld | loss %.4f | lr %.2e | norm %.3f | %8.0f tok/s | %7.1f ms | "
                     "compute %.1f ms | comm %.1f ms, exposed %.1f ms, %.0f%% hidden%s",
                     t->step, s->steps, loss, lr, t->last_norm, tps, ms, t->compute_ms,
                     c->comm_ms, c->exposed_ms, 100.0 * c->hidden, world);
        else
            DDP_INFO("step %5ld/%ld | loss %.4f | lr %.2e | norm %.3f | %8.0f tok/s | %7.1f ms%s",
                     t->step, s->steps, loss, lr, t->last_norm, tps, ms, world);
    }
    if (t->metrics && t->step > t->logged_step) {
        char norm[32] = "null"; /* a skipped step's norm is not finite: not a JSON number */
        if (isfinite(t->last_norm)) snprintf(norm, sizeof norm, "%.6g", t->last_norm);
        fprintf(t->metrics,
                "{\"step\":%ld,\"steps\":%ld,\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%s,"
                "\"tokens_per_s\":%.1f,\"step_ms\":%.2f,\"compute_ms\":%.2f,\"comm_ms\":%.2f,"
                "\"exposed_comm_ms\":%.2f,\"hidden\":%.4f,\"optim_ms\":%.2f,\"tokens\":%llu,"
                "\"world\":%d,\"generation\":%llu,\"straggler\":%d,\"loss_scale\":%g,"
                "\"wall_ms\":%.1f}\n",
                t->step, s->steps, loss, lr, norm, tps, ms, t->compute_ms, c->comm_ms,
                c->exposed_ms, c->hidden, t->optim_ms, (unsigned long long)t->tokens, t->opts.world,
                (unsigned long long)t->gen.gen, t->stragglers.named, t->lscale.scale,
                (double)(ddp_now_ns() - t->run_t0) / 1e6);
        fflush(t->metrics);
        t->logged_step = t->step;
    }
}
