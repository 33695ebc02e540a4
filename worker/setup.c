/* Setting the trainer up and tearing it down (see trainer.h): the kernels, the first world, the
 * arenas, the model, the optimizer, a resumed checkpoint, the data; and what the checkpoints see
 * of the trainer. Joining the world itself is generation.c's.
 */
#include "worker/trainer_int.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/trace.h"                /* train.trace */
#include "common/vector_isa.h"           /* the CPU's loops, named in the model line */
#include "proto/hf_config.h"             /* init_from: ddp_spec_resolve_model */
#include "worker/budget/memory_budget.h" /* train.threads default */
#include "worker/observe/metrics_sink.h"
#include "worker/optim/schedule.h" /* a wsd decay moved by a resume */

/* The first generation's bootstrap: MPI under mpirun; the coordinator's with DDP_ELASTIC=1
 * (t->member.gen says whether it joins a job that already trains); else the environment rendezvous
 * (a world of one when DDP_WORLD_SIZE is unset). */
static int first_bootstrap(ddp_trainer_t *t, ddp_coll_bootstrap_t **bs, ddp_errinfo_t *ei)
{
    const ddp_train_env_t *env = &t->opts.env;
    if (ddp_coll_under_mpi()) return ddp_coll_bootstrap_mpi(bs, ei);
    if (!env->elastic && env->world_size <= 1) return ddp_coll_bootstrap_single(bs, ei);
    if (!env->elastic) {
        if (!env->rdzv || !*env->rdzv)
            return ddp_errinfo_set(ei, DDP_EINVAL,
                                   "a world of %d ranks (%s) without a "
                                   "rendezvous address: DDP_RDZV (host:port) is not set",
                                   env->world_size, env->launcher);
        if (!env->job_token || !*env->job_token)
            return ddp_errinfo_set(ei, DDP_EINVAL, "DDP_JOB_TOKEN is not set");
        ddp_coll_rdzv_cfg_t cfg = {.rank = env->rank,
                                   .size = env->world_size,
                                   .addr = env->rdzv,
                                   .token = env->job_token,
                                   .generation = (uint64_t)env->generation,
                                   .timeout_s = env->rdzv_timeout_s};
        return ddp_coll_bootstrap_tcp(&cfg, bs, ei);
    }
    DDP_CHECK(ddp_elastic_connect(env->rdzv, env->job_token, env->rank_hint, env->rdzv_timeout_s,
                                  &t->member.elastic, ei));
    return ddp_elastic_join(t->member.elastic, -1, &t->member.gen, bs, ei);
}

/* The arenas that collectives read and write in place: the gradient's in collective memory on the
 * CPU; with ddp.shard_optimizer also the parameters' and moments', and the optimizer step is split
 * (ZeRO-1, sync/reducer.h) when the communicator can reduce-scatter and all-gather them: the ring
 * over any transport, the others where all four are shared by every rank. A rank writes only its
 * slices of the moments, and private collective memory (between hosts) is mapped on demand, so
 * there the rest of the moment arenas costs no memory until a checkpoint gathers them. On a GPU the
 * model keeps its own arenas and only the moments are the trainer's (optim/zero1.h). */
/* The model's `interrupted` callback (arg: the world): a failed communicator stops the pass
 * between blocks (the failure is known at once, from a dead peer's link or the coordinator's
 * notice), and the step with it. */
static int comm_failed(void *arg) { return ddp_world_failed(arg); }

static int alloc_arenas(ddp_trainer_t *t, ddp_errinfo_t *ei)
{
    size_t n = ddp_model_count_params(&t->spec.model), bytes = n * sizeof(float);
    if (!ddp_world_uses_coll_mem(&t->world)) { /* device memory: the model's arenas, our moments */
        if (!t->world.comm || !t->spec.shard_optimizer || t->member.elastic ||
            !ddp_coll_slices_anywhere(t->world.comm))
            return 0;
        return ddp_zero1_reserve_device(&t->zero1, n, t->saving != NULL, ei);
    }
    DDP_CHECK(ddp_world_alloc_reduced(&t->world, bytes, &t->grads, ei));
    /* elastic: a generation's collective memory goes with it, so the state a survivor keeps
     * lives in the kernels' memory, and the update is not split (a failure inside a ZeRO-1
     * update would leave the ranks with different parameters) */
    if (!t->spec.shard_optimizer || t->member.elastic) return 0;
    DDP_CHECK(ddp_world_alloc_reduced(&t->world, bytes, &t->weights, ei));
    DDP_CHECK(ddp_world_alloc_reduced(&t->world, bytes, &t->zero1.moments[0], ei));
    DDP_CHECK(ddp_world_alloc_reduced(&t->world, bytes, &t->zero1.moments[1], ei));
    t->zero1.on = ddp_coll_slices_anywhere(t->world.comm) ||
                  (ddp_coll_mem_shared(t->world.comm, t->grads) &&
                   ddp_coll_mem_shared(t->world.comm, t->weights) &&
                   ddp_coll_mem_shared(t->world.comm, t->zero1.moments[0]) &&
                   ddp_coll_mem_shared(t->world.comm, t->zero1.moments[1]));
    return 0;
}

/* Rank 0 copies data.tokenizer into the run directory (creating it). */
static int save_tokenizer(ddp_trainer_t *t, ddp_errinfo_t *ei)
{
    if (!t->data.tokenizer || !t->opts.run_dir || t->world.rank != 0) return 0;
    if (mkdir(t->opts.run_dir, 0755) != 0 && errno != EEXIST)
        return ddp_errinfo_set(ei, -errno, "cannot create the run directory %s: %s",
                               t->opts.run_dir, strerror(errno));
    return ddp_run_tokenizer_save(t->data.tokenizer, t->opts.run_dir, ei);
}

/* Makes every replica identical by construction: rank 0's initial weights go to everyone. */
static int broadcast_weights(ddp_trainer_t *t, ddp_errinfo_t *ei)
{
    if (!t->world.comm) return 0;
    ddp_coll_req_t *req;
    /* after the weights' initial copy, which memcpy_h2d may have left queued */
    DDP_CHECK(ddp_world_after_compute(&t->world));
    DDP_CHECK(
        ddp_coll_broadcast(t->world.comm, t->model.w, t->model.n_params * sizeof(float), 0, &req));
    return ddp_coll_wait(req, 0, ei);
}

/* Global micro-batches per step from train.global_batch_tokens (or one per rank). A static
 * world must divide them evenly (so every rank does the same work); an elastic one deals them
 * unevenly when it must, so that the global batch survives any change of the world. */
static int global_micro_batches(ddp_trainer_t *t, ddp_errinfo_t *ei)
{
    const ddp_spec_t *s = &t->spec;
    int world = t->world.size;
    long per_pass = (long)s->micro_batch * s->seq_len;
    long gbt = s->global_batch_tokens ? s->global_batch_tokens : per_pass * world;
    long unit = t->member.elastic ? per_pass : per_pass * world;
    if (gbt % unit == 0 && gbt / per_pass >= world) {
        t->deal.n_micro = (int)(gbt / per_pass);
        t->deal.accum = ddp_loader_accum(t->deal.n_micro, t->world.rank, world);
        return 0;
    }
    char sizes[256] = "";
    size_t used = 0;
    for (long w = 1; w <= gbt / per_pass && used < sizeof sizes - 16; w++)
        if ((gbt / per_pass) % w == 0 && gbt % per_pass == 0)
            used +=
                (size_t)snprintf(sizes + used, sizeof sizes - used, "%s%ld", used ? ", " : "", w);
    return ddp_errinfo_set(ei, DDP_ESPEC,
                           "train.global_batch_tokens: %ld tokens cannot be split over %d "
                           "rank(s) of micro_batch x seq_len = %d x %d; world sizes that "
                           "divide it: %s",
                           gbt, world, s->micro_batch, s->seq_len, used ? sizes : "none");
}

/* Opens data.train's sources (one: train_set, as always; a list of more: the mixture's sets,
 * whose position starts at this step's sample unless a checkpoint or a state transfer brought
 * one) and data.val's sets. */
static int open_data(ddp_trainer_t *t, ddp_errinfo_t *ei)
{
    const ddp_spec_t *s = &t->spec;
    ddp_run_data_t *d = &t->data;
    if (s->n_train <= 1)
        DDP_CHECK(ddp_dataset_open(&d->train_set, s->train[0].glob, s->seq_len, s->model.vocab_size,
                                   s->seed, ei));
    for (int i = 0; s->n_train > 1 && i < s->n_train; i++) /* errors name the glob or file */
        DDP_CHECK(ddp_dataset_open(&d->mix_sets[i], s->train[i].glob, s->seq_len,
                                   s->model.vocab_size, s->seed, ei));
    if (s->n_train > 1) {
        double w[DDP_SPEC_MAX_SOURCES];
        for (int i = 0; i < s->n_train; i++) w[i] = s->train[i].weight;
        if (ddp_mixture_init(&d->mix.m, w, s->n_train))
            return ddp_errinfo_set(ei, DDP_ESPEC, "data.train: weights must be > 0");
        d->mix.sets = d->mix_sets;
        ddp_mixture_state_t *at = &t->pos.ext.mix;
        if (at->n == 0) { /* a new run (or a checkpoint without cursors: saving.c said so) */
            ddp_mixture_state_init(at, s->n_train);
            at->at = at->base_seq = (int64_t)t->pos.step * t->deal.n_micro * s->micro_batch;
        }
    }
    for (int i = 0; s->val_every > 0 && i < s->n_val; i++) {
        DDP_CHECK(ddp_dataset_open(&d->val_sets[i], s->val[i].glob, s->seq_len, s->model.vocab_size,
                                   s->seed, ei));
        d->have_val = i + 1;
    }
    return 0;
}

int ddp_trainer_init(ddp_trainer_t *t, const ddp_spec_t *spec, const ddp_train_opts_t *opts,
                     ddp_errinfo_t *ei)
{
    memset(t, 0, sizeof *t);
    t->spec = *spec;
    t->opts = *opts;
    t->log.logged_step = -1;
    t->stragglers.named = -1;
    const ddp_spec_t *s = &t->spec;
    int rc = 0;
    DDP_CHECK_GOTO(ddp_spec_resolve_model(&t->spec, ei), rc, fail); /* init_from */
    DDP_CHECK_GOTO(
        ddp_run_tokenizer_open(s->tokenizer, s->model.vocab_size, &t->data.tokenizer, ei), rc,
        fail);
    int threads = s->threads > 0 ? s->threads : ddp_mem_threads(t->opts.env.local_world);
    /* one GPU per local rank (the launcher's local rank picks it, round-robin when the ranks
     * outnumber the GPUs; ignored on the CPU) */
    rc = ddp_kernels_open(&t->k, opts->backend ? opts->backend : "auto", t->opts.env.local_rank,
                          threads);
    if (rc) {
        ddp_errinfo_set(ei, rc, "kernel backend '%s': %s", opts->backend, ddp_strerror(rc));
        goto fail;
    }
    t->world.k = &t->k;
    t->zero1.world = &t->world;
    ddp_coll_bootstrap_t *bs = NULL;
    DDP_CHECK_GOTO(first_bootstrap(t, &bs, ei), rc, fail);
    rc = ddp__trainer_open_comm(t, bs, ei);
    while (rc && ddp_trainer_generation_failed(t, rc)) { /* it ended as it formed: the next */
        ddp_coll_free(t->world.comm);
        t->world.comm = NULL;
        if (ei) ddp_errinfo_clear(ei);
        rc = ddp_elastic_join(t->member.elastic, -1, &t->member.gen, &bs, ei);
        if (rc == 0) rc = ddp__trainer_open_comm(t, bs, ei);
    }
    if (rc) goto fail;
    ddp_trace_open(s->trace, t->opts.run_dir, t->world.rank); /* train.trace */
    DDP_CHECK_GOTO(save_tokenizer(t, ei), rc, fail);
    t->member.first_rank = t->world.rank; /* the slow rank's test hook names it */
    int world = t->world.size;
    /* a joiner of a job that trains already gets its state from a live member, not from disk */
    int joins_live = t->member.elastic && t->member.gen.step >= 0;
    if (joins_live) t->opts.no_resume = 1;
    ddp_prec_select(&t->k, s->precision, t->world.rank == 0 && !t->opts.quiet, &t->loss_scale.prec);
    /* MFU's peak, before the model takes the memory (a product's buffers, freed again) */
    ddp_mfu_init(&t->log.mfu, &t->k, t->loss_scale.prec, &s->model,
                 ddp_model_count_params(&s->model), s->seq_len);
    if (t->world.rank == 0 && !t->opts.quiet)
        DDP_INFO("MFU: 6 N + 6 L C T = %.5g MFLOP per token; peak %.3g TFLOP/s per rank, %s",
                 t->log.mfu.flops_per_token / 1e6, t->log.mfu.peak / 1e12, t->log.mfu.peak_what);
    long adopt_gbt = 0; /* the checkpoint's global batch, when the spec leaves it open */
    DDP_CHECK_GOTO(ddp_saving_prepare(&t->spec, &t->world, t->opts.no_resume, t->opts.resume_step,
                                      &t->saving, &adopt_gbt, ei),
                   rc, fail);
    if (adopt_gbt > 0) t->spec.global_batch_tokens = adopt_gbt;
    DDP_CHECK_GOTO(global_micro_batches(t, ei), rc, fail);
    DDP_CHECK_GOTO(ddp_trainer_check_memory(t, ei), rc, fail); /* before step 1 */

    DDP_CHECK_GOTO(alloc_arenas(t, ei), rc, fail);
    DDP_CHECK_GOTO(ddp_model_init_with(&t->model, &s->model, &t->k, s->micro_batch, s->seq_len,
                                       t->weights, t->grads, s->recompute),
                   rc, fail);
    /* the products' 16-bit weights: one copy of the whole arena, which the update keeps */
    DDP_K(&t->k, set_weights, t->model.w, t->model.n_params);
    ddp_rng_seed(&t->pos.rng, s->seed);
    /* a live joiner's weights come from a live rank: drawing them (a third of a second for
     * gpt2-mini) would only keep the others waiting in the first collective of attach_world */
    if (!joins_live) DDP_CHECK_GOTO(ddp_model_init_weights(&t->model, &t->pos.rng), rc, fail);
    DDP_CHECK_GOTO(ddp_trainer_eval_open(t, ei), rc, fail); /* the spec's eval tasks */
    t->model.interrupted = comm_failed; /* a failed step stops at once */
    t->model.interrupted_arg = &t->world;
    DDP_CHECK_GOTO(ddp_adamw_init(&t->opt, &t->model, t->zero1.moments[0], t->zero1.moments[1]), rc,
                   fail);
    ddp_saving_run_t view;
    ddp__trainer_checkpoint_view(t, &view);
    int resumed; /* every rank loaded the same checkpoint: nothing to broadcast */
    DDP_CHECK_GOTO(ddp_saving_start(t->saving, &view, &t->pos, &resumed, ei), rc, fail);
    ddp_loss_scale_init(&t->loss_scale, t->loss_scale.prec, s->loss_scale_interval, &t->pos);
    ddp_schedule_fork(&t->spec, t->pos.ext.decay_forked_at); /* resumed past the decay's start */
    if (t->spec.schedule == DDP_SCHED_WSD && t->world.rank == 0)
        DDP_INFO("schedule: wsd, lr %g after %ld warmup steps, decay (%s, to min_lr %g) from step "
                 "%ld to %ld",
                 t->spec.lr, t->spec.warmup, ddp_decay_shape_name(t->spec.decay_shape),
                 t->spec.min_lr, ddp_schedule_decay_start(&t->spec), t->spec.steps);
    if (!resumed && !joins_live) DDP_CHECK_GOTO(broadcast_weights(t, ei), rc, fail);
    DDP_CHECK_GOTO(open_data(t, ei), rc, fail);
    DDP_CHECK_GOTO(ddp__trainer_attach_world(t, ei), rc, fail);
    /* the moments are equal everywhere now (zero, or loaded); the first update keeps only this
     * rank's slices of them (ddp_zero1_drop_foreign) */
    DDP_CHECK_GOTO(ddp_zero1_begin(&t->zero1, ei), rc, fail);
    t->member.has_state = !joins_live;
    if (t->member.elastic && t->member.gen.sync) {
        int receivers;
        rc = ddp__trainer_plan_transfer(t, &receivers, ei);
        while (rc && ddp_trainer_generation_failed(t, rc)) { /* a member died meanwhile */
            if (ei) ddp_errinfo_clear(ei);
            ddp_trainer_leave_world(t);
            ddp_regroup_stats_t st;
            rc = ddp_trainer_join_world(t, &st, ei);
        }
        if (rc) goto fail;
    }
    if (t->member.elastic) ddp__trainer_log_missed_step(t); /* a new process as rank 0 */
    int cpu = !strcmp(ddp_k_name(&t->k), "cpu");
    if (t->world.rank == 0 && !opts->quiet)
        DDP_INFO("model %d layers, %d heads, %d channels, vocab %d: %.2fM parameters; "
                 "%s kernels%s%s%s, %d threads; %d rank(s)%s%s%s x %d micro-step(s) x %d x %d "
                 "tokens%s%s%s",
                 s->model.n_layer, s->model.n_head, s->model.n_embd, s->model.vocab_size,
                 (double)t->model.n_params / 1e6, ddp_k_name(&t->k), cpu ? " with " : "",
                 cpu ? ddp_cpu_isa_name(ddp_cpu_isa()) : "", cpu ? " loops" : "", threads, world,
                 t->world.comm ? " over " : "",
                 t->world.comm ? ddp_coll_transport_name(t->world.comm) : "",
                 !ddp_coll_mem_shared(t->world.comm, t->grads)
                     ? (t->zero1.on ? " (optimizer step sharded)" : "")
                 : t->zero1.on ? " (gradients in shared memory, optimizer step sharded)"
                               : " (gradients in shared memory)",
                 t->deal.accum, s->micro_batch, s->seq_len,
                 t->world.comm ? "; all-reduce " : "",
                 t->world.comm ? ddp_coll_algorithm(t->world.comm) : "",
                 t->member.elastic ? "; elastic (generation 1 of the coordinator's)" : "");
    else if (!opts->quiet)
        DDP_INFO("joined: rank %d of %d, %s kernels, %d threads, ring to the next rank over %s, "
                 "all-reduce %s",
                 t->world.rank, world, ddp_k_name(&t->k), threads,
                 t->world.comm ? ddp_coll_transport_name(t->world.comm) : "-",
                 t->world.comm ? ddp_coll_algorithm(t->world.comm) : "-");
    char warning[256];
    if (t->world.rank == 0 && ddp_spec_warning(s, warning, sizeof warning)) DDP_WARN("%s", warning);
    return 0;
fail:
    if (ei && !ei->msg[0]) ddp_errinfo_set(ei, rc, "trainer: %s", ddp_strerror(rc));
    ddp_trainer_close(t);
    return rc;
}

void ddp_trainer_close(ddp_trainer_t *t)
{
    if (!t) return;
    ddp_saving_free(t->saving);
    t->saving = NULL;
    ddp_loader_stop(&t->data.loader);
    ddp_dataset_close(&t->data.train_set);
    for (int i = 0; i < DDP_SPEC_MAX_SOURCES; i++) {
        ddp_dataset_close(&t->data.val_sets[i]);
        ddp_dataset_close(&t->data.mix_sets[i]);
    }
    ddp_trainer_eval_close(t);
    ddp_reducer_close(&t->reducer);
    if (t->k.ops) {
        ddp_k_free(&t->k, t->deal.acc);
        ddp_emb_slots_detach(&t->emb_slots);
        ddp_adamw_close(&t->opt, &t->model);
        ddp_model_close(&t->model);
        DDP_K(&t->k, set_weights, NULL, 0); /* the backend's copy goes before its arena */
        float *arenas[] = {t->weights, t->grads, t->zero1.moments[0], t->zero1.moments[1]};
        for (int i = 0; i < 4; i++)
            if (arenas[i]) ddp_world_free_reduced(&t->world, arenas[i]);
    }
    ddp_kernels_close(&t->k);
    ddp_transfer_clear(&t->transfer);
    ddp_coll_free(t->world.comm);
    ddp_coll_free(t->member.parent_comm);
    ddp_elastic_free(t->member.elastic);
    ddp_vote_free(&t->vote);
    ddp_straggler_close(&t->stragglers);
    ddp_metrics_sink_close(t->log.metrics);
    ddp_trace_close(); /* train.trace */
    ddp_run_tokenizer_free(t->data.tokenizer);
    memset(t, 0, sizeof *t);
}
