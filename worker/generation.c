/* Joining and leaving a generation (see trainer.h): the communicator, everything that depends on
 * the world (collective memory, the deal of micro-batches, the reducer, the metrics file), and
 * the state transfer that brings a rank without the job's state up to date: planned on joining,
 * started by a step (overlap) or at once (pause), finished after it (step.c).
 *
 * A static world passes here once, from ddp_trainer_init; an elastic one at each new generation
 * (worker/run.c leaves the failed one and joins the next).
 */
#include "worker/trainer_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "worker/optim/schedule.h"
#include "common/log.h"
#include "common/test_hook.h"
#include "worker/observe/metrics_sink.h" /* metrics.jsonl teed to TensorBoard */

/* Rank 0 keeps RUN_DIR/metrics.jsonl open; a rank that is no longer rank 0 closes it. An elastic
 * rank 0 goes on after the file's last step line, also when it kept the file open: another rank
 * 0 may have written lines while this rank sat out a generation. */
static int open_metrics(ddp_trainer_t *t)
{
    if (t->world.rank != 0 && t->log.metrics) {
        ddp_metrics_sink_close(t->log.metrics);
        t->log.metrics = NULL;
    }
    if (!t->opts.run_dir || t->world.rank != 0) return 0;
    char path[1100];
    snprintf(path, sizeof path, "%s/metrics.jsonl", t->opts.run_dir);
    /* every step has one line even when a step is redone */
    if (t->member.elastic) t->log.logged_step = ddp_metrics_sink_last_step(path);
    if (t->log.metrics) return 0;
    if (mkdir(t->opts.run_dir, 0755) != 0 && errno != EEXIST) {
        DDP_ERROR("cannot create the run directory %s: %s", t->opts.run_dir, strerror(errno));
        return -errno;
    }
    int rc = ddp_metrics_sink_open(t->opts.run_dir, path, &t->log.metrics); /* + RUN_DIR/tb/ */
    if (rc) DDP_ERROR("cannot open %s: %s", path, ddp_strerror(rc));
    return rc;
}

/* A step no line was written for: rank 0 died between completing it and logging it, or the
 * step committed on some ranks and not on others (a failure struck during its vote) and this
 * rank 0 took the source's state of it (in this generation's transfer, or as a new process
 * joining). Its line comes from the step's figures, which every rank holds (loss and norm are
 * global) or received with the state. Only the step right after the file's last line: a run
 * resumed from a checkpoint into a directory without those lines writes none for the steps
 * before it. */
void ddp__trainer_log_missed_step(ddp_trainer_t *t)
{
    if (t->log.metrics && t->pos.step > 0 && t->pos.step == t->log.logged_step + 1)
        ddp_trainer_log_step(t, t->pos.last_loss, t->last.ms);
}

/* The collectives' view of the kernels' memory (ddp_coll_device_t), for a host-memory backend
 * (ring, mpi) over GPU buffers: copies on the training thread's context, which is the
 * communicator's caller thread too. The copy back is complete when it returns. */
static int coll_on_device(void *k, const void *p, size_t bytes)
{
    return ddp_k_on_device(k, p, bytes);
}

static int coll_d2h(void *k, void *dst, const void *src, size_t bytes)
{
    return ddp_k_memcpy_d2h(k, dst, src, bytes);
}

static int coll_h2d(void *k, void *dst, const void *src, size_t bytes)
{
    int rc = ddp_k_memcpy_h2d(k, dst, src, bytes);
    return rc ? rc : ddp_k_sync(k);
}

/* Forms the communicator of bs (none in a world of one); bs is freed. */
int ddp__trainer_open_comm(ddp_trainer_t *t, ddp_coll_bootstrap_t *bs, ddp_errinfo_t *ei)
{
    t->world.rank = bs->rank;
    t->world.size = bs->size;
    t->world.generation = t->member.gen.gen;
    int rc = 0;
    if (bs->size > 1) {
        /* auto: NCCL when the kernels run on a GPU, our ring on the CPU */
        const char *backend = t->spec.backend;
        if (!strcmp(backend, "auto")) backend = ddp_k_coll_backend(&t->k);
        /* NCCL runs on this rank's GPU (cuda_device), not device 0; the survivors of a
         * generation shrink its communicator rather than forming one afresh */
        const ddp_elastic_gen_t *g = &t->member.gen;
        /* ring and mpi over GPU memory stage it through the host (two ranks on one GPU,
         * which NCCL refuses) */
        ddp_coll_device_t dev = {&t->k, coll_on_device, coll_d2h, coll_h2d};
        ddp_coll_opts_t copts = {.backend = backend,
                                 .cuda_device = t->k.device,
                                 .parent = g->kept_from && g->kept_from == t->member.parent_gen
                                               ? t->member.parent_comm
                                               : NULL,
                                 .parent_ranks = g->kept_from ? g->kept : NULL,
                                 .device = ddp_k_host_memory(&t->k) ? NULL : &dev};
        int gpus = ddp_k_gpu_memory(&t->k) ? ddp_k_devices(&t->k) : 0;
        if (gpus > 0 && t->opts.env.local_world > gpus && !strcmp(backend, "nccl"))
            rc = ddp_errinfo_set(ei, DDP_EINVAL,
                                 "ddp.backend: %d local ranks share %d GPU%s, and NCCL cannot run "
                                 "two ranks on one GPU; ddp.backend: ring runs them (their GPU "
                                 "buffers staged through host memory)",
                                 t->opts.env.local_world, gpus, gpus == 1 ? "" : "s");
        else
            rc = ddp_coll_new(bs, &copts, &t->world.comm, ei);
    }
    ddp_coll_free(t->member.parent_comm);
    t->member.parent_comm = NULL;
    ddp_coll_bootstrap_free(bs);
    if (rc == 0 && t->member.elastic) ddp_elastic_watch(t->member.elastic, t->world.comm);
    ddp_log_set_rank(t->world.size > 1 ? t->world.rank : -1);
    return rc;
}

static int gather_moments(void *arg, ddp_errinfo_t *ei) { return ddp_zero1_gather(arg, ei); }

/* What the checkpoints see of the trainer (saving/saving.h): given at start, and again at
 * each change of the world. */
void ddp__trainer_checkpoint_view(ddp_trainer_t *t, ddp_saving_run_t *v)
{
    *v = (ddp_saving_run_t){.spec = &t->spec,
                            .k = &t->k,
                            .device = t->k.device,
                            .model = &t->model,
                            .opt = &t->opt,
                            .stop_at_step = t->opts.stop_at_step,
                            .local_world = t->opts.env.local_world,
                            .n_micro = t->deal.n_micro,
                            .world = &t->world,
                            .accum = t->deal.accum,
                            .zero1 = t->zero1.on,
                            .gather_moments = gather_moments,
                            .gather_arg = &t->zero1,
                            .tokenizer_json = t->data.tokenizer ? t->data.tokenizer->json : NULL,
                            .tokenizer_config_json =
                                t->data.tokenizer ? t->data.tokenizer->config_json : NULL,
                            .ids = t->data.tokenizer ? &t->data.tokenizer->ids : NULL};
}

/* Everything that depends on the world, once the communicator exists: the gradient arena in a
 * generation's collective memory, this rank's share of the micro-batches, the embedding slots,
 * the reducer, the loader and (rank 0) the metrics file. Undone by ddp_trainer_leave_world. */
int ddp__trainer_attach_world(ddp_trainer_t *t, ddp_errinfo_t *ei)
{
    const ddp_spec_t *s = &t->spec;
    size_t bytes = t->model.n_params * sizeof(float);
    if (ddp_world_uses_coll_mem(&t->world) && !t->grads) {
        DDP_CHECK(ddp_world_alloc_reduced(&t->world, bytes, &t->grads, ei));
        DDP_CHECK(ddp_model_set_grads(&t->model, t->grads));
    } else if (!ddp_world_uses_coll_mem(&t->world) && t->model.borrowed_g && !t->grads) {
        DDP_CHECK(ddp_model_set_grads(&t->model, NULL)); /* a world of one: the model's own */
    }
    DDP_CHECK(ddp_emb_slots_attach(&t->emb_slots, &t->world, &t->model, s->micro_batch, s->seq_len,
                                   t->deal.n_micro, ei));
    ddp_reducer_cfg_t rcfg = {.world = &t->world,
                              .arena = t->model.g,
                              .n = t->model.n_params,
                              .first_bucket_mb = s->first_bucket_mb,
                              .bucket_mb = s->bucket_mb,
                              .overlap = s->overlap,
                              .zero1 = t->zero1.on,
                              .bf16 = s->grad_dtype == DDP_GRAD_BF16};
    DDP_CHECK(ddp_reducer_init(&t->reducer, &rcfg));
    ddp_zero1_attach(&t->zero1, &t->reducer, t->model.w);
    DDP_CHECK(ddp__trainer_set_deal(t, t->world.rank, t->world.size));
    DDP_CHECK(ddp_vote_attach(&t->vote, &t->world));
    DDP_CHECK(ddp_straggler_init(&t->stragglers, t->world.size));
    return open_metrics(t);
}

void ddp_trainer_leave_world(ddp_trainer_t *t)
{
    if (t->member.elastic) ddp_elastic_watch(t->member.elastic, NULL);
    ddp_transfer_clear(&t->transfer); /* its requests go with the communicator */
    ddp_loader_stop(&t->data.loader);
    ddp_reducer_close(&t->reducer);
    ddp_emb_slots_detach(&t->emb_slots);
    if (t->grads)
        ddp_world_free_reduced(&t->world, t->grads); /* the model's is replaced on attach */
    t->grads = NULL;
    ddp_coll_free(t->member.parent_comm);
    t->member.parent_comm = NULL;
    if (ddp_coll_shrinks(t->world.comm)) { /* open_comm frees it, shrunk or not */
        t->member.parent_comm = t->world.comm;
        t->member.parent_gen = t->member.gen.gen;
    } else {
        ddp_coll_free(t->world.comm);
    }
    t->world.comm = NULL;
}

/* Some rank is behind the source (the coordinator says so): the ranks that lack the state take
 * the source's counters now, and its weights and moments either now or during the next step,
 * which the others then compute among themselves (sync/transfer.h). */
int ddp__trainer_plan_transfer(ddp_trainer_t *t, int *receivers, ddp_errinfo_t *ei)
{
    ddp_transfer_t *x = &t->transfer;
    ddp_transfer_cfg_t cfg = {.world = &t->world,
                              .source = t->member.gen.source,
                              /* a state of another history at the same step
                               * (the coordinator compares generations) is none */
                              .has_state = t->member.has_state && !t->member.gen.receive,
                              .mode = t->spec.state_transfer,
                              .n = t->model.n_params,
                              .n_micro = t->deal.n_micro,
                              .extended = ddp_position_extended(&t->spec),
                              .pos = &t->pos,
                              .adam_t = &t->opt.t,
                              .last = &t->last};
    DDP_CHECK(ddp_transfer_plan(x, &cfg, ei));
    ddp_schedule_fork(&t->spec, t->pos.ext.decay_forked_at); /* a receiver: the source's decay */
    *receivers = x->n_receivers;
    if (!x->active) return 0;
    /* a receiver holds the job's state once the arenas arrived (pause) or after the step's
     * update (overlap) */
    if (x->receiving) t->member.has_state = 0;
    if (x->overlap) return ddp__trainer_set_deal(t, x->deal_rank, x->deal_world);
    /* a receiver's loader started before its position came: a data mixture's loader starts
     * from the position (pos.ext), so it starts again from the one received */
    if (x->receiving && cfg.extended)
        DDP_CHECK(ddp__trainer_set_deal(t, t->deal.rank, t->deal.world));
    DDP_CHECK(ddp__trainer_start_transfer(t));
    DDP_CHECK(ddp_transfer_wait(x, ei));
    return ddp__trainer_finish_transfer(t, ei);
}

int ddp_trainer_generation_failed(ddp_trainer_t *t, int rc)
{
    return t->member.elastic && !ddp_elastic_lost(t->member.elastic, NULL) &&
           ddp_world_comm_error(&t->world, rc);
}

int ddp_trainer_join_world(ddp_trainer_t *t, ddp_regroup_stats_t *st, ddp_errinfo_t *ei)
{
    ddp_coll_bootstrap_t *bs;
    memset(st, 0, sizeof *st);
    int64_t t0 = ddp_now_ns();
    /* a rank still waiting for its first state has none to offer */
    DDP_CHECK(ddp_elastic_join(t->member.elastic, t->member.has_state ? t->pos.step : -1,
                               &t->member.gen, &bs, ei));
    int64_t t1 = ddp_now_ns();
    DDP_CHECK(ddp__trainer_open_comm(t, bs, ei));
    if (t->deal.n_micro < t->world.size)
        return ddp_errinfo_set(ei, DDP_ESPEC,
                               "generation %llu has %d ranks but a step has only "
                               "%d micro-batches",
                               (unsigned long long)t->member.gen.gen, t->world.size,
                               t->deal.n_micro);
    int64_t t2 = ddp_now_ns();
    st->shrunk = ddp_coll_shrunk(t->world.comm);
    DDP_CHECK(ddp__trainer_attach_world(t, ei));
    ddp_saving_run_t view;
    ddp__trainer_checkpoint_view(t, &view);
    DDP_CHECK(ddp_saving_regroup(t->saving, &view, ei));
    int64_t t3 = ddp_now_ns();
    st->form_ms = (double)(t1 - t0) / 1e6;
    st->comm_ms = (double)(t2 - t1) / 1e6;
    st->attach_ms = (double)(t3 - t2) / 1e6;
    if (t->member.gen.sync) DDP_CHECK(ddp__trainer_plan_transfer(t, &st->receivers, ei));
    st->state_ms = (double)(ddp_now_ns() - t3) / 1e6;
    ddp__trainer_log_missed_step(t);
    return 0;
}
