/* One optimizer step of one rank (see trainer.h), as a sequence of named phases:
 *
 *   begin_step         the loss scale; an overlapped state transfer starts; test hooks
 *   forward_backward   every micro-step of this rank: forward, backward, the gradient summed
 *                      in micro-step order; the last backward starts the buckets' all-reduces
 *   finish_gradients   the all-reduces, the transfer and the embedding slots complete
 *   step_vote          the one small all-reduce that commits the step (with the checkpoints'
 *                      tallies on it); then the stragglers are named
 *   update             the gradient norm; AdamW (whole, or this rank's slices under ZeRO-1)
 *                      or, for a non-finite norm or a spike (sync/spikes.h), the update skipped
 *   account_step       the counters; end_step: the transfer finished, the coordinator told
 *
 * A failure before the vote leaves every rank at the previous step (to redo it); past it a
 * rank applies the update without waiting for the others, except in a ZeRO-1 step.
 */
#include "worker/trainer_int.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/test_hook.h"
#include "worker/sync/replicas.h"

/* Which of the step's micro-batches this rank computes: those g with g mod world = rank (the
 * world of the ranks that compute: all of them, except in a step that carries a state transfer,
 * sync/transfer.h); restarts the loader for them. world 0: none. */
int ddp__trainer_set_deal(ddp_trainer_t *t, int rank, int world)
{
    ddp_loader_stop(&t->data.loader);
    t->deal.rank = rank;
    t->deal.world = world;
    t->deal.accum = world > 0 ? ddp_loader_accum(t->deal.n_micro, rank, world) : 0;
    if (t->deal.accum > 1 && !t->deal.acc)
        DDP_CHECK(ddp_k_alloc(&t->k, (void **)&t->deal.acc, t->model.n_params * sizeof(float)));
    if (t->deal.accum == 0) return 0;
    if (t->spec.n_train > 1) { /* a mixture: from where the run is (pos.ext, position.h) */
        t->data.mix.at = t->pos.ext.mix;
        return ddp_loader_start_mix(&t->data.loader, &t->data.mix, t->spec.micro_batch, rank, world,
                                    t->deal.n_micro);
    }
    return ddp_loader_start(&t->data.loader, &t->data.train_set, t->spec.micro_batch, rank, world,
                            t->deal.n_micro);
}

int ddp_trainer_check_replicas(ddp_trainer_t *t, ddp_errinfo_t *ei)
{
    /* test hook: this rank's check may see a flipped bit */
    int flip =
        ddp_test_hook(DDP_HOOK_REPLICA_CHECK, t->pos.step, t->world.rank) ? t->world.rank : -1;
    return ddp_replicas_check(&t->world, &t->model, flip, ei);
}

/* Queues the transfers of the weights and both moments (sync/transfer.h). */
int ddp__trainer_start_transfer(ddp_trainer_t *t)
{
    float *arenas[] = {t->model.w, t->opt.m, t->opt.v};
    DDP_CHECK(ddp_world_after_compute(&t->world)); /* the last update wrote them */
    return ddp_transfer_start(&t->transfer, arenas, 3, t->model.n_params);
}

/* After a state transfer (pause: before the step; overlap: after the update of the step that
 * carried it): the receivers hold the job's state (checked against every replica), the deal is
 * the whole world's again, and the transfer is logged (rank 0: in metrics.jsonl, with the
 * receivers' mean time to the last byte). Collective. */
int ddp__trainer_finish_transfer(ddp_trainer_t *t, ddp_errinfo_t *ei)
{
    ddp_transfer_t *x = &t->transfer;
    DDP_CHECK(ddp_trainer_check_replicas(t, ei));
    float ms = x->receiving ? (float)(x->ms / x->n_receivers) : 0.0f;
    DDP_CHECK(ddp_world_allreduce(&t->world, &ms, 1, DDP_OP_SUM, ei));
    long state_step = x->overlap ? t->pos.step - 1 : t->pos.step; /* whose state travelled */
    if (x->receiving) {
        t->member.has_state = 1;
        /* new weights: drop their low-precision copies */
        DDP_K(&t->k, set_precision, t->loss_scale.prec);
        char during[64] = "while the other ranks waited";
        if (x->overlap)
            snprintf(during, sizeof during, "while the other ranks computed step %ld", t->pos.step);
        DDP_INFO("joined generation %llu as rank %d of %d: state of step %ld from rank %d "
                 "(%.1f MB in %.0f ms, %.0f MB/s), received %s",
                 (unsigned long long)t->member.gen.gen, t->world.rank, t->world.size, state_step,
                 x->first_root, x->bytes / 1e6, x->ms, x->bytes / 1e3 / (x->ms > 0 ? x->ms : 1),
                 during);
    }
    ddp_trainer_log_transfer(t, state_step, ms);
    int overlapped = x->overlap;
    ddp_transfer_clear(x);
    return overlapped ? ddp__trainer_set_deal(t, t->world.rank, t->world.size) : 0;
}

static void on_grads_ready(void *arg, size_t done)
{
    ddp_trainer_t *t = arg;
    ddp_reducer_ready(&t->reducer, done); /* an error is kept for ddp_reducer_finish */
}

/* A forward or backward pass failed: when its communicator did, the buckets already started are
 * waited for (they fail at once), so that nothing writes the gradient arena after the step
 * returns, and ei gets the communicator's reason. */
static int pass_failed(ddp_trainer_t *t, int rc, ddp_errinfo_t *ei)
{
    if (!ddp_world_failed(&t->world)) return rc;
    ddp_reducer_finish(&t->reducer, NULL, NULL);
    return ddp_errinfo_set(ei, ddp_coll_status(t->world.comm), "%s",
                           ddp_coll_last_error(t->world.comm));
}

/* A rank that receives the state in this step computes nothing: -0.0 in every gradient sum
 * leaves the holders' sums as they are (x + -0 = x, signed zeros and NaNs included), and the
 * embedding slots it does not own stay +0 as on any rank. */
static int contribute_nothing(ddp_trainer_t *t)
{
    size_t n = t->model.n_params;
    DDP_CHECK(ddp_emb_slots_clear(&t->emb_slots));
    DDP_CHECK(ddp_k_memset0(&t->k, t->model.g, n * sizeof(float)));
    ddp_k_scale(&t->k, t->model.g, -1.0f, n);
    ddp_reducer_begin(&t->reducer, NULL);
    return ddp_reducer_ready(&t->reducer, n);
}

/* Before the first micro-step: fp16's loss scale for this step, an overlapped transfer queued
 * ahead of the gradient buckets (on every rank), and a receiver's empty contribution. */
static int begin_step(ddp_trainer_t *t)
{
    long next = t->pos.step + 1;
    t->model.loss_scale = ddp_loss_scale_factor(&t->pos, t->world.rank); /* 1 unless fp16 */
    if (t->transfer.active) DDP_CHECK(ddp__trainer_start_transfer(t));
    if (t->deal.accum == 0) DDP_CHECK(contribute_nothing(t));
    /* DDP_TEST_HANG: in the job's first generation only, so that the step is redone, and a
     * replacement rejoins, without stopping again */
    if (t->member.gen.gen <= 1) ddp_test_hook(DDP_HOOK_STEP_BEGIN, next, t->world.rank);
    return 0;
}

/* This rank's micro-steps: forward, then backward. The earlier ones write a fresh gradient that
 * is summed into acc in micro-step order; in the last one each finished slice gets acc added
 * and starts its all-reduce (on_grads_ready). *loss_sum gets the micro-steps' losses. */
static int forward_backward(ddp_trainer_t *t, double *loss_sum, ddp_errinfo_t *ei)
{
    ddp_model_t *m = &t->model;
    ddp_kernels_t *k = &t->k;
    for (int micro = 0; micro < t->deal.accum; micro++) {
        const int32_t *inputs, *targets;
        DDP_CHECK(ddp_loader_next(&t->data.loader, t->pos.step, micro, &inputs, &targets, ei));
        float l = 0;
        int rc = ddp_model_forward(m, inputs, targets, t->spec.micro_batch, t->spec.seq_len);
        if (rc) return pass_failed(t, rc, ei);
        ddp_test_hook(DDP_HOOK_MICRO_STEP, t->pos.step + 1, t->member.first_rank); /* a slow rank */
        if (micro == 0) DDP_CHECK(ddp_emb_slots_clear(&t->emb_slots));
        if (micro < t->deal.accum - 1) {
            rc = ddp_model_backward(m, NULL, NULL, &l);
            if (rc) return pass_failed(t, rc, ei);
            *loss_sum += l;
            DDP_CHECK(
                ddp_emb_slots_keep(&t->emb_slots, micro * t->deal.world + t->deal.rank, inputs));
            if (micro == 0)
                DDP_CHECK(ddp_k_memcpy_d2d(k, t->deal.acc, m->g, m->n_params * sizeof(float)));
            else
                ddp_k_add(k, t->deal.acc, m->g, m->n_params);
            continue;
        }
        ddp_reducer_begin(&t->reducer, t->deal.accum > 1 ? t->deal.acc : NULL);
        rc = ddp_model_backward(m, on_grads_ready, t, &l);
        if (rc) return pass_failed(t, rc, ei);
        *loss_sum += l;
        DDP_CHECK(ddp_emb_slots_keep(&t->emb_slots, micro * t->deal.world + t->deal.rank, inputs));
    }
    return 0;
}

/* Waits until every rank's gradients arrived: the buckets' all-reduces, a transfer carried by
 * this step, and the embedding slots (summed and added to wte's gradient). */
static int finish_gradients(ddp_trainer_t *t, ddp_errinfo_t *ei)
{
    int rc = ddp_reducer_finish(&t->reducer, &t->last.comm, ei);
    if (!rc && t->transfer.active) rc = ddp_transfer_wait(&t->transfer, ei);
    if (!rc) rc = ddp_emb_slots_add(&t->emb_slots, ei);
    return rc;
}

/* The vote (sync/vote.h), with the checkpoints riding on it: their writers' checkpoint shards
 * durable / failed go in (ddp_saving_vote), and the sums settle a striped save (ddp_saving_tally),
 * so that a save needs no collective of its own. */
static int step_vote(ddp_trainer_t *t, ddp_ballot_t *b, ddp_errinfo_t *ei)
{
    ddp_saving_vote(t->saving, b->ckpt);
    DDP_CHECK(ddp_vote_cast(&t->vote, b, ei));
    return ddp_saving_tally(t->saving, b->ckpt, ei);
}

/* Names a rank whose forward and backward have been the slowest for a while (rank 0 logs it). */
static void note_stragglers(ddp_trainer_t *t, const float *rank_ms)
{
    int straggler = ddp_straggler_update(&t->stragglers, rank_ms);
    if (straggler >= 0 && t->world.rank == 0)
        DDP_WARN("step %ld: rank %d is a straggler: its forward and backward took %.1f ms, "
                 "%.0f%% above the median %.1f ms, for %d steps in a row",
                 t->pos.step + 1, straggler, t->stragglers.named_ms,
                 100.0 * (t->stragglers.named_ms / t->stragglers.median_ms - 1),
                 t->stragglers.median_ms, DDP_STRAGGLER_STEPS);
}

/* The global gradient norm from the sums of squares of this rank's parts (ZeRO-1: the other
 * blocks come from their owners; each block has one non-zero contributor, so the sum is exact). */
static int grad_norm(ddp_trainer_t *t, float grad_scale, double *norm, ddp_errinfo_t *ei)
{
    const ddp_reducer_t *r = &t->reducer;
    memset(t->reducer.norm_sums, 0, r->n_norm_blocks * sizeof *t->reducer.norm_sums);
    DDP_CHECK(ddp_grad_sumsq(&t->model, r->parts, r->n_buckets, t->reducer.norm_sums));
    if (t->zero1.on)
        DDP_CHECK(
            ddp_world_allreduce(&t->world, t->reducer.norm_sums, r->n_norm_blocks, DDP_OP_SUM, ei));
    *norm = ddp_grad_norm(t->reducer.norm_sums, r->n_norm_blocks, grad_scale);
    return 0;
}

/* After a non-finite gradient: names the first tensor that holds a NaN or Inf in this rank's
 * parts (ZeRO-1: in any rank's, from the tally of every rank's findings) and skips the update
 * (the data moves on). Fails after DDP_MAX_SKIPPED_STEPS such steps in a row. */
#define DDP_MAX_SKIPPED_STEPS 10

static int skip_nonfinite_step(ddp_trainer_t *t, double norm, ddp_errinfo_t *ei)
{
    const ddp_model_t *m = &t->model;
    const ddp_reducer_t *r = &t->reducer;
    float *bad = ddp_calloc((size_t)m->n_tensors, sizeof *bad);
    if (!bad) return DDP_ENOMEM;
    for (int j = 0; j < r->n_buckets; j++)
        for (int i = 0; i < m->n_tensors; i++) {
            size_t lo, hi;
            int found = 0;
            if (!ddp_part_of_tensor(m, &r->parts[j], i, &lo, &hi)) continue;
            ddp_k_nonfinite(&t->k, &found, m->g + lo, hi - lo);
            int rc = ddp_k_sync(&t->k);
            if (rc) {
                free(bad);
                return rc;
            }
            if (found) bad[i] = 1;
        }
    int rc = t->zero1.on ? ddp_world_allreduce(&t->world, bad, m->n_tensors, DDP_OP_SUM, ei) : 0;
    const char *name = "?";
    for (int i = m->n_tensors - 1; i >= 0; i--)
        if (bad[i] > 0) name = m->params[i].name;
    free(bad);
    if (rc) return rc;
    t->pos.skipped++;
    if (++t->skipped_in_a_row >= DDP_MAX_SKIPPED_STEPS)
        return ddp_errinfo_set(ei, DDP_ENUMERIC,
                               "step %ld: gradient norm %g (first non-finite tensor %s); %d steps "
                               "in a row were skipped, giving up",
                               t->pos.step + 1, norm, name, t->skipped_in_a_row);
    if (t->world.rank == 0)
        DDP_WARN("step %ld: gradient norm %g, first non-finite tensor %s: update skipped",
                 t->pos.step + 1, norm, name);
    return 0;
}

/* A spike (sync/spikes.h) skips the update: weights, moments and AdamW's t untouched, the data
 * moves on. Unlike a non-finite step it does not count toward DDP_MAX_SKIPPED_STEPS (a spike
 * is a finite step the run can go on from; the windows take in every value, so a lasting shift
 * becomes the new normal and stops skipping). */
static void skip_spike(ddp_trainer_t *t, ddp_skip_t why, double loss, double norm, double zl,
                       double zn)
{
    if (t->world.rank != 0) return;
    const ddp_spec_t *s = &t->spec;
    if (why == DDP_SKIP_LOSS)
        DDP_WARN("step %ld: loss %.4f is a spike (z %.2f > train.skip_loss_z %g over the last %d "
                 "steps): update skipped",
                 t->pos.step + 1, loss, zl, s->skip_loss_z, s->skip_window);
    else
        DDP_WARN("step %ld: gradient norm %g is a spike (z %.2f > train.skip_norm_z %g over the "
                 "last %d steps): update skipped",
                 t->pos.step + 1, norm, zn, s->skip_norm_z, s->skip_window);
}

/* AdamW over this rank's parts (a ZeRO-1 step: its slices, each all-gathered to every rank as
 * it is done, with the moments too when a save follows), and the checkpoints' CRCs of it. */
static int apply_update(ddp_trainer_t *t, double norm, float grad_scale,
                        const ddp_saving_update_t *u, ddp_errinfo_t *ei)
{
    const ddp_reducer_t *r = &t->reducer;
    double lr = ddp_lr_at(&t->spec, t->pos.step);
    ddp_zero1_part_fn on_part = ddp_zero1_update_begin(&t->zero1, u->save_follows);
    ddp_adamw_args_t args = {.lr = lr,
                             .grad_scale = grad_scale,
                             .norm = norm,
                             .parts = r->parts,
                             .n_parts = r->n_buckets,
                             .done = on_part,
                             .done_arg = &t->zero1,
                             .crc = u->crc};
    DDP_CHECK(ddp_adamw_step(&t->opt, &t->model, &t->spec, &args));
    DDP_CHECK(ddp_reducer_gather_wait(&t->reducer, ei));
    DDP_CHECK(ddp_saving_after_update(t->saving, t->pos.step + 1, u, ei));
    ddp_zero1_update_end(&t->zero1);
    t->skipped_in_a_row = 0;
    /* AdamW kept the weights' 16-bit copy (set_weights); a ZeRO-1 step's all-gather wrote the
     * other ranks' slices, whose copies are converted again */
    if (t->zero1.on) DDP_K(&t->k, set_precision, t->loss_scale.prec);
    return 0;
}

/* The gradient norm, then the update: applied when the norm is finite and neither the step's
 * loss nor the norm is a spike (train.skip_loss_z, skip_norm_z), else skipped (fp16: an
 * overflow, and the loss scale halves). The norm and the loss (after the vote) are the same on
 * every rank, so every rank decides alike. A snapshot of the arenas for a save must be done
 * before they change. */
static int update(ddp_trainer_t *t, double loss, double *norm, ddp_errinfo_t *ei)
{
    ddp_model_t *m = &t->model;
    float grad_scale = 1.0f / (float)t->deal.n_micro;
    if (t->loss_scale.enabled) grad_scale /= t->pos.loss_scale; /* unscaled in the norm and AdamW */
    if (ddp_test_hook(DDP_HOOK_GRADIENTS, t->pos.step + 1,
                      t->world.rank)) { /* poison one gradient */
        float nan = NAN;
        DDP_CHECK(ddp_k_memcpy_h2d(&t->k, m->g + m->params[3].offset, &nan, sizeof nan));
    }
    if (ddp_test_hook(DDP_HOOK_NORM_SPIKE, t->pos.step + 1, t->world.rank)) /* a gradient spike */
        ddp_k_scale(&t->k, m->g, 1000.0f, m->n_params);
    int64_t t0 = ddp_now_ns();
    DDP_CHECK(grad_norm(t, grad_scale, norm, ei));
    ddp_saving_update_t u;
    DDP_CHECK(ddp_saving_before_update(t->saving, t->pos.step + 1, &u, ei));
    ddp_loss_scale_update(&t->loss_scale, &t->pos, isfinite(*norm), t->world.rank == 0);
    double zl = NAN, zn = NAN;
    ddp_skip_t why = !isfinite(*norm) ? DDP_SKIP_NONFINITE
                     : ddp_spikes_on(&t->spec)
                         ? ddp_spikes_step(&t->pos.ext.spikes, &t->spec, loss, *norm, &zl, &zn)
                         : DDP_SKIP_NONE;
    t->last.skipped = why;
    if (why == DDP_SKIP_NONE)
        DDP_CHECK(apply_update(t, *norm, grad_scale, &u, ei));
    else if (why == DDP_SKIP_NONFINITE)
        DDP_CHECK(skip_nonfinite_step(t, *norm, ei));
    else
        skip_spike(t, why, loss, *norm, zl, zn);
    t->last.optim_ms = (double)(ddp_now_ns() - t0) / 1e6;
    return 0;
}

/* The step is done: the counters and what the vote decided for every rank. */
static void account_step(ddp_trainer_t *t, const ddp_ballot_t *v, double norm, float *loss)
{
    t->pos.step++;
    t->pos.tokens += (uint64_t)t->deal.n_micro * t->spec.micro_batch * t->spec.seq_len;
    if (t->spec.n_train > 1) /* the mixture's cursors (data/loader.h) */
        ddp_loader_mix_step(&t->data.mix, &t->pos.ext.mix,
                            (int64_t)t->deal.n_micro * t->spec.micro_batch, NULL, t->spec.train,
                            t->pos.step, t->world.rank == 0);
    *loss = (float)v->loss_sum / (float)t->deal.n_micro;
    t->stop.any = v->stop > 0;
    t->member.regroup = v->regroup > 0;
    t->pos.last_loss = *loss;
    t->pos.last_norm = norm;
    t->last.micro_ms =
        t->deal.accum > 0 ? t->last.compute_ms / t->deal.accum : 0; /* ddp_transfer_overlap_pays */
    t->last.world = t->world.size;
}

/* After the update: a transfer this step carried is finished (collective), the coordinator
 * learns the step, and the moments' residence is logged once (not after a gathering step). */
static int end_step(ddp_trainer_t *t, ddp_errinfo_t *ei)
{
    if (t->transfer.active) DDP_CHECK(ddp__trainer_finish_transfer(t, ei));
    if (t->member.elastic) ddp_elastic_set_step(t->member.elastic, t->pos.step);
    if (!t->memory.moments_logged && !ddp_zero1_gathered(&t->zero1)) {
        t->memory.moments_logged = 1;
        ddp_trainer_log_moments(t);
    }
    return 0;
}

int ddp_trainer_step(ddp_trainer_t *t, float *loss, ddp_errinfo_t *ei)
{
    int64_t t0 = ddp_now_ns();
    DDP_CHECK(begin_step(t));
    double loss_sum = 0;
    DDP_CHECK(forward_backward(t, &loss_sum, ei));
    int64_t t1 = ddp_now_ns();
    DDP_CHECK(finish_gradients(t, ei));
    t->last.compute_ms = (double)(t1 - t0) / 1e6;

    /* The step commits here: every rank's gradients arrived (the reducer and the embedding slots
     * are complete), and the vote carries the losses, whether any rank was asked to stop (all stop
     * together) or to regroup (all leave the generation after this step), and how many checkpoint
     * writers have their checkpoint shards durable / failed. Past it a rank applies the update
     * without talking to the others (an elastic world never splits it: no ZeRO-1), so a failure
     * before it leaves every survivor at the previous step, to redo the step. */
    ddp_ballot_t v = {.loss_sum = loss_sum,
                      .stop = t->stop.requested,
                      .regroup = t->member.elastic && ddp_elastic_regroup_wanted(t->member.elastic),
                      .compute_ms = t->last.compute_ms};
    /* DDP_TEST_LOSS_SPIKE: this rank's loss jumps; the vote's sum carries it to every rank */
    if (ddp_test_hook(DDP_HOOK_LOSS_SPIKE, t->pos.step + 1, t->world.rank)) v.loss_sum += 1000.0;
    DDP_CHECK(step_vote(t, &v, ei));
    note_stragglers(t, v.rank_ms);

    double norm = 0;
    float step_loss = (float)v.loss_sum / (float)t->deal.n_micro; /* account_step's */
    DDP_CHECK(update(t, step_loss, &norm, ei));
    account_step(t, &v, norm, loss);
    return end_step(t, ei);
}
