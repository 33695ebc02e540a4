/* The step loop of one rank (see train.h). */
#include "train.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/trace.h" /* train.trace */
#include "proto/hf_config.h"    /* init_from config.json */
#include "worker/memory_budget.h" /* train.threads default */
#include "worker/metrics_sink.h" /* metrics.jsonl teed to TensorBoard */
#include "worker/replicas.h"
#include "worker/train_checkpoint.h"

/* The step's vote: what each rank tells the others in the one small all-reduce that commits a
 * step, summed over the ranks. step_vote packs it into t->vote's floats (in the order below,
 * then one slot per rank for its compute time) and unpacks the sums: the one place that knows
 * the positions. */
typedef struct {
    double loss_sum;     /* the micro-steps' losses */
    int stop;            /* ranks that were asked to stop: every rank stops after this step */
    float ckpt[2];       /* checkpoint writers' shards durable / failed (ddp_tckpt_vote) */
    int regroup;         /* ranks whose coordinator wants a new generation: all leave */
    const float *rank_ms; /* [world]: each rank's forward and backward (stragglers) */
} step_vote_t;

enum { VOTE_LOSS, VOTE_STOP, VOTE_CKPT, VOTE_REGROUP = VOTE_CKPT + 2, VOTE_RANKS };

/* Rank 0 keeps RUN_DIR/metrics.jsonl open; a rank that is no longer rank 0 closes it. */
static int open_metrics(ddp_trainer_t *t)
{
    if (t->opts.rank != 0 && t->metrics) {
        ddp_metrics_sink_close(t->metrics);
        t->metrics = NULL;
    }
    if (!t->opts.run_dir || t->opts.rank != 0 || t->metrics) return 0;
    if (mkdir(t->opts.run_dir, 0755) != 0 && errno != EEXIST) {
        DDP_ERROR("cannot create the run directory %s: %s", t->opts.run_dir, strerror(errno));
        return -errno;
    }
    char path[1100];
    snprintf(path, sizeof path, "%s/metrics.jsonl", t->opts.run_dir);
    /* a new rank 0 of a later generation goes on after the last step line, so that every step
     * has one line even when a step is redone */
    if (t->elastic) t->logged_step = ddp_metrics_sink_last_step(path);
    int rc = ddp_metrics_sink_open(t->opts.run_dir, path, &t->metrics); /* + RUN_DIR/tb/ */
    if (rc) DDP_ERROR("cannot open %s: %s", path, ddp_strerror(rc));
    return rc;
}

/* The first generation's bootstrap: MPI under mpirun; the coordinator's with DDP_ELASTIC=1 (t->gen
 * says whether it joins a job that already trains); else the environment rendezvous (a world of
 * one when DDP_WORLD_SIZE is unset). */
static int first_bootstrap(ddp_trainer_t *t, ddp_coll_bootstrap_t **bs, ddp_errinfo_t *ei)
{
    const ddp_train_env_t *env = &t->opts.env;
    if (ddp_coll_under_mpi()) return ddp_coll_bootstrap_mpi(bs, ei);
    if (!env->elastic && env->world_size <= 1) return ddp_coll_bootstrap_single(bs, ei);
    if (!env->elastic) {
        if (!env->rdzv || !*env->rdzv)
            return ddp_errinfo_set(ei, DDP_EINVAL, "a world of %d ranks (%s) without a "
                                   "rendezvous address: DDP_RDZV (host:port) is not set",
                                   env->world_size, env->launcher);
        if (!env->job_token || !*env->job_token)
            return ddp_errinfo_set(ei, DDP_EINVAL, "DDP_JOB_TOKEN is not set");
        ddp_coll_rdzv_cfg_t cfg = {.rank = env->rank, .size = env->world_size,
                                   .addr = env->rdzv, .token = env->job_token,
                                   .generation = (uint64_t)env->generation,
                                   .timeout_s = env->rdzv_timeout_s};
        return ddp_coll_bootstrap_tcp(&cfg, bs, ei);
    }
    DDP_CHECK(ddp_elastic_connect(env->rdzv, env->job_token, env->rank_hint, env->rdzv_timeout_s,
                                  &t->elastic, ei));
    return ddp_elastic_join(t->elastic, -1, &t->gen, bs, ei);
}

/* Forms the communicator of bs (none in a world of one); bs is freed. */
static int open_comm(ddp_trainer_t *t, ddp_coll_bootstrap_t *bs, ddp_errinfo_t *ei)
{
    t->opts.rank = bs->rank;
    t->opts.world = bs->size;
    int rc = 0;
    if (bs->size > 1) {
        /* auto: NCCL when the kernels run on a GPU, our ring on the CPU */
        const char *backend = t->spec.backend;
        if (!strcmp(backend, "auto")) backend = ddp_k_coll_backend(&t->k);
        /* NCCL runs on this rank's GPU, not device 0 (issue 24, finding 3); the survivors of a
         * generation shrink its communicator rather than forming one afresh */
        const ddp_elastic_gen_t *g = &t->gen;
        ddp_coll_opts_t copts = {
            .backend = backend, .cuda_device = t->device,
            .parent = g->kept_from && g->kept_from == t->parent_gen ? t->parent_comm : NULL,
            .parent_ranks = g->kept_from ? g->kept : NULL};
        rc = ddp_coll_new(bs, &copts, &t->comm, ei);
    }
    ddp_coll_free(t->parent_comm);
    t->parent_comm = NULL;
    ddp_coll_bootstrap_free(bs);
    if (rc == 0 && t->elastic) ddp_elastic_watch(t->elastic, t->comm);
    ddp_log_set_rank(t->opts.world > 1 ? t->opts.rank : -1);
    return rc;
}

/* Buffers that are all-reduced in place: collective memory on the CPU (shared by the ranks of one
 * host, where the all-reduce reads and writes every rank's copy directly instead of streaming it
 * through the ring: see ddp_coll_mem_alloc), the kernels' memory otherwise (device memory for
 * NCCL). *out is zeroed. */
static int uses_coll_mem(const ddp_trainer_t *t) { return t->comm && ddp_k_host_memory(&t->k); }

static int alloc_reduced(ddp_trainer_t *t, size_t bytes, float **out, ddp_errinfo_t *ei)
{
    if (uses_coll_mem(t)) return ddp_coll_mem_alloc(t->comm, bytes, (void **)out, ei);
    DDP_CHECK(ddp_k_alloc(&t->k, (void **)out, bytes));
    return ddp_k_memset0(&t->k, *out, bytes);
}

static void free_reduced(ddp_trainer_t *t, float *p)
{
    if (uses_coll_mem(t))
        ddp_coll_mem_free(t->comm, p);
    else
        ddp_k_free(&t->k, p);
}

/* The arenas that collectives read and write in place: the gradient's in collective memory on
 * the CPU; with ddp.shard_optimizer also the parameters' and moments', and the optimizer step is
 * sharded (reducer.h) when the communicator can reduce-scatter and all-gather them: the ring
 * over any transport, the others where all four are shared by every rank. A rank writes only its
 * slices of the moments, and private collective memory (between hosts) is mapped on demand, so
 * there the rest of the moment arenas costs no memory until a checkpoint gathers them. On a GPU
 * the model keeps its own arenas and only the moments are the trainer's (train_sharded.h). */
static int alloc_arenas(ddp_trainer_t *t, ddp_errinfo_t *ei)
{
    size_t n = ddp_gpt2_count_params(&t->spec.model), bytes = n * sizeof(float);
    if (!uses_coll_mem(t)) { /* device memory: the model's arenas, the trainer's moments */
        if (!t->comm || !t->spec.shard_optimizer || t->elastic ||
            !ddp_coll_slices_anywhere(t->comm))
            return 0;
        return ddp_sharded_reserve_device(&t->zero, n, t->ckpt != NULL, ei);
    }
    DDP_CHECK(alloc_reduced(t, bytes, &t->grads, ei));
    /* elastic: a generation's collective memory goes with it, so the state a survivor keeps
     * lives in the kernels' memory, and the update is not sharded (a failure inside a sharded
     * update would leave the ranks with different parameters) */
    if (!t->spec.shard_optimizer || t->elastic) return 0;
    DDP_CHECK(alloc_reduced(t, bytes, &t->weights, ei));
    DDP_CHECK(alloc_reduced(t, bytes, &t->zero.moments[0], ei));
    DDP_CHECK(alloc_reduced(t, bytes, &t->zero.moments[1], ei));
    t->zero.on = ddp_coll_slices_anywhere(t->comm) ||
                 (ddp_coll_mem_shared(t->comm, t->grads) &&
                  ddp_coll_mem_shared(t->comm, t->weights) &&
                  ddp_coll_mem_shared(t->comm, t->zero.moments[0]) &&
                  ddp_coll_mem_shared(t->comm, t->zero.moments[1]));
    return 0;
}

static int gather_moments(void *arg, ddp_errinfo_t *ei) { return ddp_sharded_gather(arg, ei); }

/* What the checkpoints see of the trainer (train_checkpoint.h): given at start, and again at
 * each change of the world. */
static void checkpoint_view(ddp_trainer_t *t, ddp_tckpt_run_t *v)
{
    *v = (ddp_tckpt_run_t){.spec = &t->spec, .k = &t->k, .device = t->device,
                           .model = &t->model, .opt = &t->opt,
                           .stop_at_step = t->opts.stop_at_step,
                           .local_world = t->opts.env.local_world, .n_micro = t->n_micro,
                           .comm = t->comm, .rank = t->opts.rank, .world = t->opts.world,
                           .accum = t->accum, .sharded = t->zero.on,
                           .gather_moments = gather_moments, .gather_arg = &t->zero};
}

void ddp_trainer_position(const ddp_trainer_t *t, ddp_tckpt_pos_t *pos)
{
    *pos = (ddp_tckpt_pos_t){.step = t->step, .tokens = t->tokens, .last_loss = t->last_loss,
                             .loss_scale = t->lscale.scale, .loss_scale_clean = t->lscale.clean};
    memcpy(pos->rng, t->rng.s, sizeof pos->rng);
}

int ddp_trainer_check_replicas(ddp_trainer_t *t, ddp_errinfo_t *ei)
{
    /* test hook DDP_TEST_REPLICA_FLIP_RANK: that rank's check sees a flipped bit */
    int flip = t->opts.env.flip ? t->opts.env.flip_rank : -1;
    return ddp_replicas_check(t->comm, &t->model, flip, ei);
}

/* Makes every replica identical by construction: rank 0's initial weights go to everyone. */
static int broadcast_weights(ddp_trainer_t *t, ddp_errinfo_t *ei)
{
    if (!t->comm) return 0;
    ddp_coll_req_t *req;
    DDP_CHECK(ddp_coll_broadcast(t->comm, t->model.w, t->model.n_params * sizeof(float), 0,
                                 &req));
    return ddp_coll_wait(req, 0, ei);
}

/* Global micro-batches per step from train.global_batch_tokens (or one per rank). A static
 * world must divide them evenly (so every rank does the same work); an elastic one deals them
 * unevenly when it must, so that the global batch survives any change of the world. */
static int global_micro_batches(ddp_trainer_t *t, ddp_errinfo_t *ei)
{
    const ddp_spec_t *s = &t->spec;
    int world = t->opts.world;
    long per_pass = (long)s->micro_batch * s->seq_len;
    long gbt = s->global_batch_tokens ? s->global_batch_tokens : per_pass * world;
    long unit = t->elastic ? per_pass : per_pass * world;
    if (gbt % unit == 0 && gbt / per_pass >= world) {
        t->n_micro = (int)(gbt / per_pass);
        t->accum = ddp_loader_accum(t->n_micro, t->opts.rank, world);
        return 0;
    }
    char sizes[256] = "";
    size_t used = 0;
    for (long w = 1; w <= gbt / per_pass && used < sizeof sizes - 16; w++)
        if ((gbt / per_pass) % w == 0 && gbt % per_pass == 0)
            used += (size_t)snprintf(sizes + used, sizeof sizes - used, "%s%ld", used ? ", " : "",
                                     w);
    return ddp_errinfo_set(ei, DDP_ESPEC,
                           "train.global_batch_tokens: %ld tokens cannot be split over %d "
                           "rank(s) of micro_batch x seq_len = %d x %d; world sizes that "
                           "divide it: %s",
                           gbt, world, s->micro_batch, s->seq_len, used ? sizes : "none");
}

/* Which of the step's micro-batches this rank computes: those g with g mod world = rank (the
 * world of the ranks that compute: all of them, except in a step that carries a state transfer,
 * state_transfer.h); restarts the loader for them. world 0: none. */
static int set_deal(ddp_trainer_t *t, int rank, int world)
{
    ddp_loader_stop(&t->loader);
    t->deal_rank = rank;
    t->deal_world = world;
    t->accum = world > 0 ? ddp_loader_accum(t->n_micro, rank, world) : 0;
    if (t->accum > 1 && !t->acc)
        DDP_CHECK(ddp_k_alloc(&t->k, (void **)&t->acc, t->model.n_params * sizeof(float)));
    if (t->accum == 0) return 0;
    return ddp_loader_start(&t->loader, &t->train_set, t->spec.micro_batch, rank, world,
                            t->n_micro);
}

/* Everything that depends on the world, once the communicator exists: the gradient arena in a
 * generation's collective memory, this rank's share of the micro-batches, the embedding slots,
 * the reducer, the loader and (rank 0) the metrics file. Undone by ddp_trainer_leave_world. */
static int attach_world(ddp_trainer_t *t, ddp_errinfo_t *ei)
{
    const ddp_spec_t *s = &t->spec;
    size_t bytes = t->model.n_params * sizeof(float);
    if (uses_coll_mem(t) && !t->grads) {
        DDP_CHECK(alloc_reduced(t, bytes, &t->grads, ei));
        DDP_CHECK(ddp_gpt2_set_grads(&t->model, t->grads));
    } else if (!uses_coll_mem(t) && t->model.borrowed_g && !t->grads) {
        DDP_CHECK(ddp_gpt2_set_grads(&t->model, NULL)); /* a world of one: the model's own */
    }
    t->emb_bytes = (size_t)t->n_micro * ddp__trainer_emb_slot_floats(t) * sizeof(float);
    DDP_CHECK(alloc_reduced(t, t->emb_bytes, &t->emb, ei));
    DDP_CHECK(ddp_reducer_init(&t->reducer, t->comm, &t->k, t->model.g, t->model.n_params,
                               s->first_bucket_mb, s->bucket_mb, s->overlap, t->zero.on));
    t->zero.comm = t->comm;
    t->zero.reducer = &t->reducer;
    t->zero.weights = t->model.w;
    t->zero.rank = t->opts.rank;
    t->zero.world = t->opts.world;
    t->norm_sums = ddp_calloc(t->reducer.n_norm_blocks, sizeof *t->norm_sums);
    if (!t->norm_sums) return DDP_ENOMEM;
    DDP_CHECK(set_deal(t, t->opts.rank, t->opts.world));
    free(t->vote);
    t->vote = ddp_calloc(VOTE_RANKS + (size_t)t->opts.world, sizeof *t->vote);
    if (!t->vote) return DDP_ENOMEM;
    DDP_CHECK(ddp_straggler_init(&t->stragglers, t->opts.world));
    return open_metrics(t);
}

void ddp_trainer_leave_world(ddp_trainer_t *t)
{
    if (t->elastic) ddp_elastic_watch(t->elastic, NULL);
    ddp_xfer_clear(&t->xfer); /* its requests go with the communicator */
    ddp_loader_stop(&t->loader);
    ddp_reducer_close(&t->reducer);
    free(t->norm_sums);
    t->norm_sums = NULL;
    if (t->emb) free_reduced(t, t->emb);
    t->emb = NULL;
    if (t->grads) free_reduced(t, t->grads); /* the model's pointer is replaced on attach */
    t->grads = NULL;
    ddp_coll_free(t->parent_comm);
    t->parent_comm = NULL;
    if (ddp_coll_shrinks(t->comm)) { /* open_comm frees it, shrunk or not */
        t->parent_comm = t->comm;
        t->parent_gen = t->gen.gen;
    } else {
        ddp_coll_free(t->comm);
    }
    t->comm = NULL;
}

/* The model asks between blocks: a failed communicator stops the pass (the failure is known at
 * once, from a dead peer's link or the coordinator's notice), and the step with it. */
static int comm_failed_now(void *arg)
{
    const ddp_trainer_t *t = arg;
    return t->comm && ddp_coll_status(t->comm) != 0;
}

/* The trainer's counters for a state transfer (state_transfer.h), and back. */
static ddp_xfer_header_t header_of(const ddp_trainer_t *t)
{
    ddp_xfer_header_t h = {.step = t->step, .adam_t = t->opt.t, .tokens = t->tokens,
                           .skipped = t->skipped_steps, .last_loss = t->last_loss,
                           .last_val_loss = t->last_val_loss, .last_norm = t->last_norm,
                           .last_step_ms = t->last_step_ms, .loss_scale = t->lscale.scale,
                           .loss_scale_clean = t->lscale.clean, .micro_ms = t->last_micro_ms,
                           .allreduce_ms = t->comm_stats.comm_ms,
                           .allreduce_world = t->last_step_world};
    memcpy(h.rng, t->rng.s, sizeof h.rng);
    return h;
}

static void apply_header(ddp_trainer_t *t, const ddp_xfer_header_t *h)
{
    t->step = h->step;
    t->opt.t = h->adam_t;
    t->tokens = h->tokens;
    t->skipped_steps = h->skipped;
    t->last_loss = h->last_loss;
    t->last_val_loss = h->last_val_loss;
    t->last_norm = h->last_norm;
    t->last_step_ms = h->last_step_ms;
    t->lscale.scale = h->loss_scale;
    t->lscale.clean = h->loss_scale_clean;
    memcpy(t->rng.s, h->rng, sizeof h->rng);
}

static int finish_transfer(ddp_trainer_t *t, ddp_errinfo_t *ei);

/* Queues the transfers of the weights and both moments (state_transfer.h). */
static int start_transfer(ddp_trainer_t *t)
{
    float *arenas[] = {t->model.w, t->opt.m, t->opt.v};
    DDP_CHECK(ddp_reducer_after_compute(t->comm, &t->k)); /* the last update wrote them */
    return ddp_xfer_start(&t->xfer, t->comm, arenas, 3, t->model.n_params);
}

/* Some rank is behind the source (the coordinator says so): the ranks that lack the state take
 * the source's counters now, and its weights and moments either now or during the next step,
 * which the others then compute among themselves (state_transfer.h). */
static int plan_transfer(ddp_trainer_t *t, int *receivers, ddp_errinfo_t *ei)
{
    ddp_xfer_t *x = &t->xfer;
    ddp_xfer_header_t h = header_of(t);
    DDP_CHECK(ddp_xfer_plan(x, t->comm, t->gen.source, t->has_state, t->spec.state_transfer,
                            t->model.n_params, t->n_micro, &h, ei));
    *receivers = x->n_receivers;
    if (!x->active) return 0;
    if (x->receiving) {
        apply_header(t, &h);
        t->has_state = 0; /* until the arenas arrived (pause) or the step's update (overlap) */
    }
    if (x->overlap) return set_deal(t, x->deal_rank, x->deal_world);
    DDP_CHECK(start_transfer(t));
    DDP_CHECK(ddp_xfer_wait(x, ei));
    return finish_transfer(t, ei);
}

int ddp_trainer_comm_failed(const ddp_trainer_t *t, int rc)
{
    return rc == DDP_EPEER || rc == DDP_ETIMEDOUT || rc == DDP_EABORTED || rc == DDP_ECLOSED ||
           (t->comm && ddp_coll_status(t->comm) != 0);
}

int ddp_trainer_generation_failed(ddp_trainer_t *t, int rc)
{
    return t->elastic && !ddp_elastic_lost(t->elastic, NULL) && ddp_trainer_comm_failed(t, rc);
}

int ddp_trainer_join_world(ddp_trainer_t *t, ddp_regroup_stats_t *st, ddp_errinfo_t *ei)
{
    ddp_coll_bootstrap_t *bs;
    memset(st, 0, sizeof *st);
    int64_t t0 = ddp_now_ns();
    /* a rank still waiting for its first state has none to offer */
    DDP_CHECK(ddp_elastic_join(t->elastic, t->has_state ? t->step : -1, &t->gen, &bs, ei));
    int64_t t1 = ddp_now_ns();
    DDP_CHECK(open_comm(t, bs, ei));
    if (t->n_micro < t->opts.world)
        return ddp_errinfo_set(ei, DDP_ESPEC, "generation %llu has %d ranks but a step has only "
                               "%d micro-batches", (unsigned long long)t->gen.gen, t->opts.world,
                               t->n_micro);
    int64_t t2 = ddp_now_ns();
    st->shrunk = ddp_coll_shrunk(t->comm);
    DDP_CHECK(attach_world(t, ei));
    ddp_tckpt_run_t view;
    checkpoint_view(t, &view);
    DDP_CHECK(ddp_tckpt_regroup(t->ckpt, &view, ei));
    int64_t t3 = ddp_now_ns();
    st->form_ms = (double)(t1 - t0) / 1e6;
    st->comm_ms = (double)(t2 - t1) / 1e6;
    st->attach_ms = (double)(t3 - t2) / 1e6;
    if (t->gen.sync) DDP_CHECK(plan_transfer(t, &st->receivers, ei));
    st->state_ms = (double)(ddp_now_ns() - t3) / 1e6;
    /* a step no line was written for: the old rank 0 died between completing it and logging
     * it, or the source completed a step this rank did not (a failure struck between the
     * step's commit on some ranks and on others); its line comes from the step's figures,
     * which every rank holds (loss and norm are global) or received with the state */
    if (t->metrics && t->step > 0 && t->step > t->logged_step)
        ddp_trainer_log_step(t, t->last_loss, t->last_step_ms);
    return 0;
}

int ddp_trainer_init(ddp_trainer_t *t, const ddp_spec_t *spec, const ddp_train_opts_t *opts,
                     ddp_errinfo_t *ei)
{
    memset(t, 0, sizeof *t);
    t->spec = *spec;
    t->opts = *opts;
    t->logged_step = -1;
    t->stragglers.named = -1;
    const ddp_spec_t *s = &t->spec;
    int rc = 0;
    DDP_CHECK_GOTO(ddp_spec_resolve_model(&t->spec, ei), rc, fail); /* init_from */
    int threads = s->threads > 0 ? s->threads : ddp_mem_threads(t->opts.env.local_world);
    /* one GPU per local rank (the launcher's local rank picks it; ignored on the CPU) */
    t->device = t->opts.env.local_rank;
    rc = ddp_kernels_open(&t->k, opts->backend ? opts->backend : "auto", t->device, threads);
    if (rc) {
        ddp_errinfo_set(ei, rc, "kernel backend '%s': %s", opts->backend, ddp_strerror(rc));
        goto fail;
    }
    t->zero.k = &t->k;
    ddp_coll_bootstrap_t *bs = NULL;
    DDP_CHECK_GOTO(first_bootstrap(t, &bs, ei), rc, fail);
    rc = open_comm(t, bs, ei);
    while (rc && ddp_trainer_generation_failed(t, rc)) { /* it ended as it formed: the next */
        ddp_coll_free(t->comm);
        t->comm = NULL;
        if (ei) ddp_errinfo_clear(ei);
        rc = ddp_elastic_join(t->elastic, -1, &t->gen, &bs, ei);
        if (rc == 0) rc = open_comm(t, bs, ei);
    }
    if (rc) goto fail;
    ddp_trace_open(s->trace, t->opts.run_dir, t->opts.rank); /* train.trace */
    if (t->opts.env.slow_rank == t->opts.rank) t->slow_us = t->opts.env.slow_us; /* test hook */
    int world = t->opts.world;
    /* a joiner of a job that trains already gets its state from a live member, not from disk */
    int joins_live = t->elastic && t->gen.step >= 0;
    if (joins_live) t->opts.no_resume = 1;
    ddp_prec_select(&t->k, s->precision, t->opts.rank == 0 && !t->opts.quiet, &t->prec);
    ddp_lscale_init(&t->lscale, t->prec, s->loss_scale_interval); /* a resume restores it */
    t->lscale.test_step = t->opts.env.overflow_step; /* test hook: DDP_TEST_OVERFLOW */
    t->lscale.test_rank = t->opts.env.overflow_rank;
    long adopt_gbt = 0; /* the checkpoint's global batch, when the spec leaves it open */
    DDP_CHECK_GOTO(ddp_tckpt_prepare(&t->spec, t->opts.rank, world, t->opts.no_resume,
                                     t->opts.resume_step, &t->ckpt, &adopt_gbt, ei),
                   rc, fail);
    if (adopt_gbt > 0) t->spec.global_batch_tokens = adopt_gbt;
    DDP_CHECK_GOTO(global_micro_batches(t, ei), rc, fail);
    DDP_CHECK_GOTO(ddp_trainer_check_memory(t, ei), rc, fail); /* before step 1 */

    DDP_CHECK_GOTO(alloc_arenas(t, ei), rc, fail);
    DDP_CHECK_GOTO(ddp_gpt2_init_with(&t->model, &s->model, &t->k, s->micro_batch, s->seq_len,
                                      t->weights, t->grads, s->recompute),
                   rc, fail);
    ddp_rng_seed(&t->rng, s->seed);
    /* a live joiner's weights come from a live rank: drawing them (a third of a second for
     * gpt2-mini) would only keep the others waiting in the first collective of attach_world */
    if (!joins_live) DDP_CHECK_GOTO(ddp_gpt2_init_weights(&t->model, &t->rng), rc, fail);
    t->model.interrupted = comm_failed_now; /* a failed step stops at once */
    t->model.interrupted_arg = t;
    DDP_CHECK_GOTO(ddp_adamw_init(&t->opt, &t->model, t->zero.moments[0], t->zero.moments[1]),
                   rc, fail);
    ddp_tckpt_run_t view;
    checkpoint_view(t, &view);
    ddp_tckpt_resume_t res; /* every rank loaded the same checkpoint: nothing to broadcast */
    DDP_CHECK_GOTO(ddp_tckpt_start(t->ckpt, &view, &res, ei), rc, fail);
    if (res.resumed) {
        t->step = res.step;
        t->tokens = res.tokens;
        t->opt.t = res.adam_t;
        memcpy(t->rng.s, res.rng, sizeof t->rng.s);
        /* fp16: the scale goes on; a checkpoint of another precision has 1 */
        if (t->lscale.enabled && isfinite(res.loss_scale) && res.loss_scale > 0 &&
            res.loss_scale != 1.0) {
            t->lscale.scale = (float)res.loss_scale;
            t->lscale.clean = res.loss_scale_clean;
        }
    }
    if (!res.resumed && !joins_live) DDP_CHECK_GOTO(broadcast_weights(t, ei), rc, fail);
    t->emb_tokens_f = ddp_malloc((size_t)s->micro_batch * s->seq_len * sizeof(float));
    t->emb_tokens = ddp_malloc((size_t)s->micro_batch * s->seq_len * sizeof(int32_t));
    if (!t->emb_tokens_f || !t->emb_tokens) {
        rc = DDP_ENOMEM;
        goto fail;
    }
    DDP_CHECK_GOTO(ddp_dataset_open(&t->train_set, s->train_glob, s->seq_len,
                                    s->model.vocab_size, s->seed, ei),
                   rc, fail);
    if (s->val_glob[0] && s->val_every > 0) {
        DDP_CHECK_GOTO(ddp_dataset_open(&t->val_set, s->val_glob, s->seq_len,
                                        s->model.vocab_size, s->seed, ei),
                       rc, fail);
        t->have_val = 1;
    }
    DDP_CHECK_GOTO(attach_world(t, ei), rc, fail);
    /* the moments are equal everywhere now (zero, or loaded); the first update keeps only this
     * rank's slices of them (ddp_sharded_drop_foreign) */
    DDP_CHECK_GOTO(ddp_sharded_begin(&t->zero, ei), rc, fail);
    t->has_state = !joins_live;
    if (t->elastic && t->gen.sync) {
        int receivers;
        rc = plan_transfer(t, &receivers, ei);
        while (rc && ddp_trainer_generation_failed(t, rc)) { /* a member died meanwhile */
            if (ei) ddp_errinfo_clear(ei);
            ddp_trainer_leave_world(t);
            ddp_regroup_stats_t st;
            rc = ddp_trainer_join_world(t, &st, ei);
        }
        if (rc) goto fail;
    }
    if (t->opts.rank == 0 && !opts->quiet)
        DDP_INFO("model %d layers, %d heads, %d channels, vocab %d: %.2fM parameters; "
                 "%s kernels, %d threads; %d rank(s)%s%s%s x %d micro-step(s) x %d x %d tokens%s",
                 s->model.n_layer, s->model.n_head, s->model.n_embd, s->model.vocab_size,
                 (double)t->model.n_params / 1e6, ddp_k_name(&t->k), threads, world,
                 t->comm ? " over " : "", t->comm ? ddp_coll_transport_name(t->comm) : "",
                 !ddp_coll_mem_shared(t->comm, t->grads)
                     ? (t->zero.on ? " (optimizer step sharded)" : "")
                 : t->zero.on ? " (gradients in shared memory, optimizer step sharded)"
                              : " (gradients in shared memory)",
                 t->accum, s->micro_batch, s->seq_len,
                 t->elastic ? "; elastic (generation 1 of the coordinator's)" : "");
    else if (!opts->quiet)
        DDP_INFO("joined: rank %d of %d, %s kernels, %d threads, ring to the next rank over %s",
                 t->opts.rank, world, ddp_k_name(&t->k), threads,
                 t->comm ? ddp_coll_transport_name(t->comm) : "-");
    char warning[256];
    if (t->opts.rank == 0 && ddp_spec_warning(s, warning, sizeof warning))
        DDP_WARN("%s", warning);
    return 0;
fail:
    if (ei && !ei->msg[0]) ddp_errinfo_set(ei, rc, "trainer: %s", ddp_strerror(rc));
    ddp_trainer_close(t);
    return rc;
}

void ddp_trainer_close(ddp_trainer_t *t)
{
    if (!t) return;
    ddp_tckpt_free(t->ckpt);
    t->ckpt = NULL;
    ddp_loader_stop(&t->loader);
    ddp_dataset_close(&t->train_set);
    ddp_dataset_close(&t->val_set);
    ddp_reducer_close(&t->reducer);
    if (t->k.ops) {
        ddp_k_free(&t->k, t->acc);
        if (t->emb) free_reduced(t, t->emb);
        ddp_adamw_close(&t->opt, &t->model);
        ddp_gpt2_close(&t->model);
        float *arenas[] = {t->weights, t->grads, t->zero.moments[0], t->zero.moments[1]};
        for (int i = 0; i < 4; i++)
            if (arenas[i]) free_reduced(t, arenas[i]);
    }
    ddp_kernels_close(&t->k);
    ddp_xfer_clear(&t->xfer);
    ddp_coll_free(t->comm);
    ddp_coll_free(t->parent_comm);
    ddp_elastic_free(t->elastic);
    free(t->emb_tokens_f);
    free(t->emb_tokens);
    free(t->norm_sums);
    free(t->vote);
    ddp_straggler_close(&t->stragglers);
    ddp_metrics_sink_close(t->metrics);
    ddp_trace_close(); /* train.trace */
    memset(t, 0, sizeof *t);
}

static void on_grads_ready(void *arg, size_t done)
{
    ddp_trainer_t *t = arg;
    int rc = ddp_reducer_ready(&t->reducer, done);
    if (rc && !t->ready_rc) t->ready_rc = rc;
}

/* Reduces small per-step values over the ranks with op (in place; callers sum). */
static int allreduce_small(ddp_trainer_t *t, float *vals, int n, ddp_redop_t op,
                           ddp_errinfo_t *ei)
{
    if (!t->comm) return 0;
    ddp_coll_req_t *req;
    DDP_CHECK(ddp_coll_allreduce(t->comm, vals, (size_t)n, DDP_DT_F32, op, &req));
    return ddp_coll_wait(req, 0, ei);
}

/* The global gradient norm from the sums of squares of this rank's parts (sharded: the other
 * blocks come from their owners; each block has one non-zero contributor, so the sum is exact). */
static int grad_norm(ddp_trainer_t *t, float grad_scale, double *norm, ddp_errinfo_t *ei)
{
    const ddp_reducer_t *r = &t->reducer;
    memset(t->norm_sums, 0, r->n_norm_blocks * sizeof *t->norm_sums);
    DDP_CHECK(ddp_grad_sumsq(&t->model, r->parts, r->n_buckets, t->norm_sums));
    if (t->zero.on)
        DDP_CHECK(allreduce_small(t, t->norm_sums, (int)r->n_norm_blocks, DDP_OP_SUM, ei));
    *norm = ddp_grad_norm(t->norm_sums, r->n_norm_blocks, grad_scale);
    return 0;
}

/* After a non-finite gradient: names the first tensor that holds a NaN or Inf in this rank's
 * parts (sharded: in any rank's, from the tally of every rank's findings) and skips the update
 * (the data moves on). Fails after DDP_MAX_SKIPPED_STEPS such steps in a row. */
#define DDP_MAX_SKIPPED_STEPS 10

static int skip_nonfinite_step(ddp_trainer_t *t, double norm, ddp_errinfo_t *ei)
{
    const ddp_gpt2_t *m = &t->model;
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
    int rc = t->zero.on ? allreduce_small(t, bad, m->n_tensors, DDP_OP_SUM, ei) : 0;
    const char *name = "?";
    for (int i = m->n_tensors - 1; i >= 0; i--)
        if (bad[i] > 0) name = m->params[i].name;
    free(bad);
    if (rc) return rc;
    t->skipped_steps++;
    if (++t->skipped_in_a_row >= DDP_MAX_SKIPPED_STEPS)
        return ddp_errinfo_set(ei, DDP_ENUMERIC,
                               "step %ld: gradient norm %g (first non-finite tensor %s); %d steps "
                               "in a row were skipped, giving up",
                               t->step + 1, norm, name, t->skipped_in_a_row);
    if (t->opts.rank == 0)
        DDP_WARN("step %ld: gradient norm %g, first non-finite tensor %s: update skipped",
                 t->step + 1, norm, name);
    return 0;
}

/* A forward or backward pass failed: when its communicator did, the buckets already started are
 * waited for (they fail at once), so that nothing writes the gradient arena after the step
 * returns, and ei gets the communicator's reason. */
static int pass_failed(ddp_trainer_t *t, int rc, ddp_errinfo_t *ei)
{
    if (!comm_failed_now(t)) return rc;
    ddp_reducer_finish(&t->reducer, NULL, NULL);
    return ddp_errinfo_set(ei, ddp_coll_status(t->comm), "%s", ddp_coll_last_error(t->comm));
}

/* A rank that receives the state in this step computes nothing: -0.0 in every gradient sum
 * leaves the holders' sums as they are (x + -0 = x, signed zeros and NaNs included), and the
 * embedding slots it does not own stay +0 as on any rank. */
static int contribute_nothing(ddp_trainer_t *t)
{
    size_t n = t->model.n_params;
    DDP_CHECK(ddp_k_memset0(&t->k, t->emb, t->emb_bytes));
    DDP_CHECK(ddp_k_memset0(&t->k, t->model.g, n * sizeof(float)));
    ddp_k_scale(&t->k, t->model.g, -1.0f, n);
    ddp_reducer_begin(&t->reducer, NULL);
    return ddp_reducer_ready(&t->reducer, n);
}

/* After a state transfer (pause: before the step; overlap: after the update of the step that
 * carried it): the receivers hold the job's state (checked against every replica), the deal is
 * the whole world's again, and the transfer is logged (rank 0: in metrics.jsonl, with the
 * receivers' mean time to the last byte). Collective. */
static int finish_transfer(ddp_trainer_t *t, ddp_errinfo_t *ei)
{
    ddp_xfer_t *x = &t->xfer;
    DDP_CHECK(ddp_trainer_check_replicas(t, ei));
    float ms = x->receiving ? (float)(x->ms / x->n_receivers) : 0.0f;
    DDP_CHECK(allreduce_small(t, &ms, 1, DDP_OP_SUM, ei));
    long state_step = x->overlap ? t->step - 1 : t->step; /* whose state travelled */
    if (x->receiving) {
        t->has_state = 1;
        DDP_K(&t->k, set_precision, t->prec); /* new weights: drop their low-precision copies */
        char during[64] = "while the other ranks waited";
        if (x->overlap) snprintf(during, sizeof during, "while the other ranks computed step %ld",
                                 t->step);
        DDP_INFO("joined generation %llu as rank %d of %d: state of step %ld from rank %d "
                 "(%.1f MB in %.0f ms, %.0f MB/s), received %s", (unsigned long long)t->gen.gen,
                 t->opts.rank, t->opts.world, state_step, x->first_root, x->bytes / 1e6, x->ms,
                 x->bytes / 1e3 / (x->ms > 0 ? x->ms : 1), during);
    }
    if (t->metrics) {
        double mb = 3.0 * (double)t->model.n_params * sizeof(float) / 1e6;
        ddp_metrics_rec_t r;
        ddp_metrics_init(&r, DDP_METRICS_TRANSFER);
        r.generation = (int64_t)t->gen.gen;
        r.step = state_step;
        snprintf(r.mode, sizeof r.mode, "%s", x->overlap ? "overlap" : "pause");
        r.receivers = x->n_receivers;
        r.source = x->first_root;
        r.mb = mb;
        r.ms = ms;
        r.mb_per_s = mb * 1e3 / (ms > 0 ? ms : 1);
        ddp_metrics_sink_write(t->metrics, &r);
    }
    int overlapped = x->overlap;
    ddp_xfer_clear(x);
    return overlapped ? set_deal(t, t->opts.rank, t->opts.world) : 0;
}

/* All-reduces v (this rank's part in, the sums out; v->rank_ms then points at every rank's
 * compute time, this rank's being t->compute_ms). */
static int step_vote(ddp_trainer_t *t, step_vote_t *v, ddp_errinfo_t *ei)
{
    float *f = t->vote;
    memset(f, 0, (VOTE_RANKS + (size_t)t->opts.world) * sizeof *f);
    f[VOTE_LOSS] = (float)v->loss_sum;
    f[VOTE_STOP] = (float)v->stop;
    f[VOTE_CKPT] = v->ckpt[0];
    f[VOTE_CKPT + 1] = v->ckpt[1];
    f[VOTE_REGROUP] = (float)v->regroup;
    f[VOTE_RANKS + t->opts.rank] = (float)t->compute_ms;
    DDP_CHECK(allreduce_small(t, f, VOTE_RANKS + t->opts.world, DDP_OP_SUM, ei));
    v->loss_sum = f[VOTE_LOSS];
    v->stop = (int)f[VOTE_STOP];
    v->ckpt[0] = f[VOTE_CKPT];
    v->ckpt[1] = f[VOTE_CKPT + 1];
    v->regroup = (int)f[VOTE_REGROUP];
    v->rank_ms = f + VOTE_RANKS;
    return 0;
}

int ddp_trainer_step(ddp_trainer_t *t, float *loss, ddp_errinfo_t *ei)
{
    ddp_gpt2_t *m = &t->model;
    ddp_kernels_t *k = &t->k;
    size_t bytes = m->n_params * sizeof(float);
    double loss_sum = 0;
    int64_t t0 = ddp_now_ns();
    m->loss_scale = ddp_lscale_factor(&t->lscale, t->step + 1, t->opts.rank); /* 1 unless fp16 */
    /* overlapped: queued ahead of the gradient buckets, on every rank */
    if (t->xfer.active) DDP_CHECK(start_transfer(t));
    if (t->accum == 0) DDP_CHECK(contribute_nothing(t));
    if (t->opts.env.hang_step == t->step + 1 && t->opts.env.hang_rank == t->opts.rank) {
        DDP_WARN("test hook: rank %d hangs as step %ld begins (DDP_TEST_HANG)", t->opts.rank,
                 t->step + 1);
        for (;;) pause();
    }
    for (int micro = 0; micro < t->accum; micro++) {
        const int32_t *inputs, *targets;
        int last = micro == t->accum - 1;
        DDP_CHECK(ddp_loader_next(&t->loader, t->step, micro, &inputs, &targets, ei));
        float l = 0;
        int rc = ddp_gpt2_forward(m, inputs, targets, t->spec.micro_batch, t->spec.seq_len, &l);
        if (rc) return pass_failed(t, rc, ei);
        loss_sum += l;
        if (t->slow_us) usleep((useconds_t)t->slow_us); /* test hook: a slow rank */
        if (micro == 0) DDP_CHECK(ddp_k_memset0(k, t->emb, t->emb_bytes));
        if (!last) {
            /* earlier micro-steps: fresh gradient, summed into acc in micro-step order */
            rc = ddp_gpt2_backward(m, NULL, NULL);
            if (rc) return pass_failed(t, rc, ei);
            DDP_CHECK(ddp__trainer_keep_embedding_grad(t, micro, inputs));
            if (micro == 0) DDP_CHECK(ddp_k_memcpy_d2d(k, t->acc, m->g, bytes));
            else ddp_k_add(k, t->acc, m->g, m->n_params);
            continue;
        }
        /* the last micro-step: each finished slice gets acc added and starts its all-reduce */
        ddp_reducer_begin(&t->reducer, t->accum > 1 ? t->acc : NULL);
        t->ready_rc = 0;
        rc = ddp_gpt2_backward(m, on_grads_ready, t);
        if (rc) return pass_failed(t, rc, ei);
        DDP_CHECK(ddp__trainer_keep_embedding_grad(t, micro, inputs));
    }
    int64_t t1 = ddp_now_ns();
    int rc = ddp_reducer_finish(&t->reducer, &t->comm_stats, ei);
    if (!rc) rc = t->ready_rc;
    if (!rc && t->xfer.active) rc = ddp_xfer_wait(&t->xfer, ei);
    if (!rc) rc = ddp__trainer_add_embedding_grads(t, ei);
    if (rc) return rc;
    t->compute_ms = (double)(t1 - t0) / 1e6;

    /* The step commits here: every rank's gradients arrived (the reducer and the embedding
     * slots are complete), and the vote carries the losses, whether any rank was asked to stop
     * (all stop together) or to regroup (all leave the generation after this step), and how
     * many checkpoint writers have their shards durable / failed. Past it a rank applies the
     * update without talking to the others (the elastic world never shards it), so a failure
     * before it leaves every survivor at the previous step, to redo the step. */
    step_vote_t v = {.loss_sum = loss_sum, .stop = t->stop_requested,
                     .regroup = t->elastic && ddp_elastic_regroup_wanted(t->elastic)};
    ddp_tckpt_vote(t->ckpt, v.ckpt);
    DDP_CHECK(step_vote(t, &v, ei));
    DDP_CHECK(ddp_tckpt_tally(t->ckpt, v.ckpt, ei));
    int straggler = ddp_straggler_update(&t->stragglers, v.rank_ms);
    if (straggler >= 0 && t->opts.rank == 0)
        DDP_WARN("step %ld: rank %d is a straggler: its forward and backward took %.1f ms, "
                 "%.0f%% above the median %.1f ms, for %d steps in a row", t->step + 1,
                 straggler, t->stragglers.named_ms,
                 100.0 * (t->stragglers.named_ms / t->stragglers.median_ms - 1),
                 t->stragglers.median_ms, DDP_STRAGGLER_STEPS);

    float grad_scale = 1.0f / (float)t->n_micro;
    if (t->lscale.enabled) grad_scale /= t->lscale.scale; /* unscaled in the norm and AdamW */
    if (t->opts.env.nan_step == t->step + 1) { /* test hook: poison one gradient */
        float nan = NAN;
        DDP_CHECK(ddp_k_memcpy_h2d(k, m->g + m->params[3].offset, &nan, sizeof nan));
    }
    double norm = 0;
    int64_t t2 = ddp_now_ns();
    DDP_CHECK(grad_norm(t, grad_scale, &norm, ei));
    double lr = ddp_lr_at(&t->spec, t->step);
    /* a snapshot of the arenas must be done */
    DDP_CHECK(ddp_tckpt_before_update(t->ckpt, t->step + 1, ei));
    /* fp16: a non-finite norm is an overflow (halve the scale); equal on every rank */
    ddp_lscale_update(&t->lscale, isfinite(norm), t->step + 1, t->opts.rank == 0);
    if (isfinite(norm)) {
        const ddp_reducer_t *r = &t->reducer;
        ddp_sharded_t *z = &t->zero;
        z->gather = z->on && ddp_tckpt_planned(t->ckpt, t->step + 1);
        /* a save of this step is planned */
        ddp_adamw_crc_t *crc = ddp_tckpt_update_crcs(t->ckpt, t->step + 1);
        /* mid-update, a sharded rank's state is part this step, part the next: an emergency
         * save after a failure here must refuse it (it refuses moments that are not whole) */
        int was_whole = z->whole;
        if (z->on) z->whole = 0;
        z->mid_update = z->on;
        DDP_CHECK(ddp_adamw_step(&t->opt, m, &t->spec, lr, grad_scale, norm, r->parts,
                                 r->n_buckets, z->on ? ddp_sharded_on_part_updated : NULL, z, crc));
        DDP_CHECK(ddp_reducer_gather_wait(&t->reducer, ei));
        if (crc) DDP_CHECK(ddp_tckpt_after_update(t->ckpt, t->step + 1, ei));
        if (z->on && was_whole && !z->gather) ddp_sharded_drop_foreign(z);
        z->whole = z->gather;
        z->mid_update = 0;
        t->skipped_in_a_row = 0;
        DDP_K(k, set_precision, t->prec); /* new weights: drop their low-precision copies */
    } else {
        /* every rank has the same norm, so every rank skips this update alike */
        DDP_CHECK(skip_nonfinite_step(t, norm, ei));
    }
    t->optim_ms = (double)(ddp_now_ns() - t2) / 1e6;
    t->step++;
    t->tokens += (uint64_t)t->n_micro * t->spec.micro_batch * t->spec.seq_len;
    *loss = (float)v.loss_sum / (float)t->n_micro;
    t->any_stop = v.stop > 0;
    t->regroup = v.regroup > 0;
    t->last_loss = *loss;
    t->last_norm = norm;
    t->last_micro_ms = t->accum > 0 ? t->compute_ms / t->accum : 0; /* ddp_xfer_overlap_pays */
    t->last_step_world = t->opts.world;
    if (t->xfer.active) DDP_CHECK(finish_transfer(t, ei));
    if (t->elastic) ddp_elastic_set_step(t->elastic, t->step);
    if (!t->moments_logged && !(t->zero.on && t->zero.whole)) { /* not a gathering step */
        t->moments_logged = 1;
        ddp_trainer_log_moments(t);
    }
    return 0;
}

int ddp_trainer_validate(ddp_trainer_t *t, float *loss, ddp_errinfo_t *ei)
{
    int B = t->spec.micro_batch, T = t->spec.seq_len;
    size_t n = (size_t)B * T;
    int32_t *in = ddp_malloc(n * sizeof *in), *tg = ddp_malloc(n * sizeof *tg);
    int rc = (in && tg) ? 0 : DDP_ENOMEM;
    /* rank r evaluates batches r, r + W, ...; the sums and counts are then added up */
    float sums[2] = {0, 0};
    for (int b = t->opts.rank; rc == 0 && b < t->spec.val_batches; b += t->opts.world) {
        float l = 0;
        rc = ddp_dataset_fill(&t->val_set, (uint64_t)b * B, B, 0, in, tg, ei);
        if (rc == 0) rc = ddp_gpt2_evaluate(&t->model, in, tg, B, T, &l);
        sums[0] += l;
        sums[1] += 1;
    }
    free(in);
    free(tg);
    if (rc == 0) rc = allreduce_small(t, sums, 2, DDP_OP_SUM, ei);
    if (rc == 0) *loss = t->last_val_loss = sums[0] / (sums[1] > 0 ? sums[1] : 1);
    return rc;
}
