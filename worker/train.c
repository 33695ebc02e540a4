/* The step loop of one rank (see train.h). */
#include "train.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

/* Token a sample starts from: newline for byte-level models, <|endoftext|> for GPT-2's BPE. */
static int32_t start_token(const ddp_model_cfg_t *cfg)
{
    return cfg->vocab_size == 256 ? '\n' : cfg->vocab_size - 1;
}

static int open_metrics(ddp_trainer_t *t)
{
    if (!t->opts.run_dir || t->opts.rank != 0) return 0;
    char path[1100];
    snprintf(path, sizeof path, "%s/metrics.jsonl", t->opts.run_dir);
    t->metrics = fopen(path, "a");
    if (!t->metrics) {
        DDP_ERROR("cannot open %s: %s", path, strerror(errno));
        return -errno;
    }
    return 0;
}

int ddp_trainer_init(ddp_trainer_t *t, const ddp_spec_t *spec, const ddp_train_opts_t *opts,
                     ddp_errinfo_t *ei)
{
    memset(t, 0, sizeof *t);
    t->spec = *spec;
    t->opts = *opts;
    const ddp_spec_t *s = &t->spec;
    int rc = 0;

    long per_pass = (long)s->micro_batch * s->seq_len * opts->world;
    long gbt = s->global_batch_tokens ? s->global_batch_tokens : per_pass;
    if (gbt % per_pass) {
        return ddp_errinfo_set(ei, DDP_ESPEC,
                               "train.global_batch_tokens: %ld is not a multiple of micro_batch "
                               "x seq_len x world size = %d x %d x %d",
                               gbt, s->micro_batch, s->seq_len, opts->world);
    }
    t->accum = (int)(gbt / per_pass);

    int threads = s->threads > 0 ? s->threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    rc = ddp_kernels_open(&t->k, opts->backend ? opts->backend : "auto", 0, threads);
    if (rc) return ddp_errinfo_set(ei, rc, "kernel backend '%s': %s", opts->backend,
                                   ddp_strerror(rc));
    DDP_CHECK_GOTO(ddp_gpt2_init(&t->model, &s->model, &t->k, s->micro_batch, s->seq_len), rc,
                   fail);
    ddp_rng_seed(&t->rng, s->seed);
    DDP_CHECK_GOTO(ddp_gpt2_init_weights(&t->model, &t->rng), rc, fail);
    DDP_CHECK_GOTO(ddp_adamw_init(&t->opt, &t->model), rc, fail);
    if (t->accum > 1)
        DDP_CHECK_GOTO(t->k.ops->alloc(t->k.ctx, (void **)&t->acc,
                                       t->model.n_params * sizeof(float)),
                       rc, fail);

    DDP_CHECK_GOTO(ddp_dataset_open(&t->train_set, s->train_glob, s->seq_len,
                                    s->model.vocab_size, s->seed, ei),
                   rc, fail);
    if (s->val_glob[0] && s->val_every > 0) {
        DDP_CHECK_GOTO(ddp_dataset_open(&t->val_set, s->val_glob, s->seq_len,
                                        s->model.vocab_size, s->seed, ei),
                       rc, fail);
        t->have_val = 1;
    }
    DDP_CHECK_GOTO(ddp_loader_start(&t->loader, &t->train_set, s->micro_batch, opts->rank,
                                    opts->world, t->accum),
                   rc, fail);
    DDP_CHECK_GOTO(open_metrics(t), rc, fail);
    if (opts->rank == 0 && !opts->quiet)
        DDP_INFO("model %d layers, %d heads, %d channels, vocab %d: %.2fM parameters; "
                 "%s backend, %d threads; %d rank(s) x %d micro-step(s) x %d x %d tokens",
                 s->model.n_layer, s->model.n_head, s->model.n_embd, s->model.vocab_size,
                 (double)t->model.n_params / 1e6, t->k.ops->name, threads, opts->world,
                 t->accum, s->micro_batch, s->seq_len);
    return 0;
fail:
    if (ei && !ei->msg[0]) ddp_errinfo_set(ei, rc, "trainer: %s", ddp_strerror(rc));
    ddp_trainer_close(t);
    return rc;
}

void ddp_trainer_close(ddp_trainer_t *t)
{
    if (!t) return;
    ddp_loader_stop(&t->loader);
    ddp_dataset_close(&t->train_set);
    ddp_dataset_close(&t->val_set);
    if (t->k.ops) {
        t->k.ops->free(t->k.ctx, t->acc);
        ddp_adamw_close(&t->opt, &t->model);
        ddp_gpt2_close(&t->model);
    }
    ddp_kernels_close(&t->k);
    if (t->metrics) fclose(t->metrics);
    memset(t, 0, sizeof *t);
}

int ddp_trainer_step(ddp_trainer_t *t, float *loss, ddp_errinfo_t *ei)
{
    ddp_gpt2_t *m = &t->model;
    ddp_kernels_t *k = &t->k;
    size_t bytes = m->n_params * sizeof(float);
    double loss_sum = 0;
    for (int micro = 0; micro < t->accum; micro++) {
        const int32_t *inputs, *targets;
        DDP_CHECK(ddp_loader_next(&t->loader, t->step, micro, &inputs, &targets, ei));
        float l = 0;
        DDP_CHECK(ddp_gpt2_forward(m, inputs, targets, t->spec.micro_batch, t->spec.seq_len, &l));
        loss_sum += l;
        DDP_CHECK(ddp_gpt2_backward(m, NULL, NULL));
        if (t->accum == 1) break;
        if (micro == 0) DDP_CHECK(k->ops->memcpy_d2d(k->ctx, t->acc, m->g, bytes));
        else if (micro < t->accum - 1) DDP_K(k, add, t->acc, m->g, m->n_params);
        else DDP_K(k, add, m->g, t->acc, m->n_params); /* g = g_last + (g0 + ... ) */
    }
    float grad_scale = 1.0f / (float)(t->accum * t->opts.world);
    double norm = 0;
    DDP_CHECK(ddp_grad_norm(m, grad_scale, &norm));
    if (!isfinite(norm))
        return ddp_errinfo_set(ei, DDP_ENUMERIC, "step %ld: gradient norm is %f", t->step + 1,
                               norm);
    double lr = ddp_lr_at(&t->spec, t->step);
    DDP_CHECK(ddp_adamw_step(&t->opt, m, &t->spec, lr, grad_scale, norm));
    t->step++;
    t->tokens += (uint64_t)t->accum * t->opts.world * t->spec.micro_batch * t->spec.seq_len;
    *loss = (float)(loss_sum / t->accum);
    t->last_loss = *loss;
    t->last_norm = norm;
    return 0;
}

int ddp_trainer_validate(ddp_trainer_t *t, float *loss)
{
    int B = t->spec.micro_batch, T = t->spec.seq_len;
    size_t n = (size_t)B * T;
    int32_t *in = ddp_malloc(n * sizeof *in), *tg = ddp_malloc(n * sizeof *tg);
    int rc = (in && tg) ? 0 : DDP_ENOMEM;
    double sum = 0;
    for (int b = 0; rc == 0 && b < t->spec.val_batches; b++) {
        float l = 0;
        rc = ddp_dataset_fill(&t->val_set, (uint64_t)b * B, B, 0, in, tg, NULL);
        if (rc == 0) rc = ddp_gpt2_forward(&t->model, in, tg, B, T, &l);
        sum += l;
    }
    free(in);
    free(tg);
    if (rc == 0) *loss = t->last_val_loss = (float)(sum / t->spec.val_batches);
    return rc;
}

/* Draws a token from the softmax of logits[V] with the trainer's rng. */
static int32_t draw(ddp_rng_t *rng, const float *logits, int V)
{
    float max = logits[0];
    for (int i = 1; i < V; i++) max = logits[i] > max ? logits[i] : max;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)(logits[i] - max));
    double u = ddp_rng_uniform(rng) * sum, c = 0;
    for (int i = 0; i < V; i++) {
        c += exp((double)(logits[i] - max));
        if (u < c) return i;
    }
    return V - 1;
}

int ddp_trainer_sample(ddp_trainer_t *t, int n, FILE *out)
{
    ddp_gpt2_t *m = &t->model;
    int T = t->spec.seq_len, V = m->cfg.vocab_size;
    int32_t *ctx = ddp_calloc((size_t)n + 1, sizeof *ctx);
    float *row = ddp_malloc((size_t)V * sizeof *row);
    int rc = (ctx && row) ? 0 : DDP_ENOMEM;
    ctx[0] = start_token(&m->cfg);
    for (int i = 1; rc == 0 && i <= n; i++) {
        int len = i < T ? i : T;
        const int32_t *window = ctx + (i - len);
        rc = ddp_gpt2_forward(m, window, NULL, 1, len, NULL);
        if (rc == 0)
            rc = m->k->ops->memcpy_d2h(m->k->ctx, row, m->acts.logits + (size_t)(len - 1) * V,
                                       (size_t)V * sizeof *row);
        if (rc == 0) rc = m->k->ops->sync(m->k->ctx);
        if (rc) break;
        ctx[i] = draw(&t->rng, row, V);
        if (V == 256) fputc(ctx[i], out);
        else fprintf(out, "%d ", ctx[i]);
    }
    fputc('\n', out);
    fflush(out);
    free(ctx);
    free(row);
    return rc;
}

static void log_step(ddp_trainer_t *t, float loss, double ms)
{
    const ddp_spec_t *s = &t->spec;
    double tok = (double)t->accum * t->opts.world * s->micro_batch * s->seq_len;
    double tps = tok / (ms / 1000.0);
    double lr = ddp_lr_at(s, t->step - 1);
    if (!t->opts.quiet && (t->step % s->log_every == 0 || t->step == s->steps))
        DDP_INFO("step %5ld/%ld | loss %.4f | lr %.2e | norm %.3f | %8.0f tok/s | %7.1f ms",
                 t->step, s->steps, loss, lr, t->last_norm, tps, ms);
    if (t->metrics) {
        fprintf(t->metrics,
                "{\"step\":%ld,\"steps\":%ld,\"loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%.6g,"
                "\"tokens_per_s\":%.1f,\"step_ms\":%.2f,\"tokens\":%llu}\n",
                t->step, s->steps, loss, lr, t->last_norm, tps, ms,
                (unsigned long long)t->tokens);
        fflush(t->metrics);
    }
}

int ddp_trainer_run(ddp_trainer_t *t, volatile sig_atomic_t *stop, ddp_errinfo_t *ei)
{
    const ddp_spec_t *s = &t->spec;
    while (t->step < s->steps && !(stop && *stop)) {
        int64_t t0 = ddp_now_ns();
        float loss = 0;
        DDP_CHECK(ddp_trainer_step(t, &loss, ei));
        log_step(t, loss, (double)(ddp_now_ns() - t0) / 1e6);
        if (t->have_val && (t->step % s->val_every == 0 || t->step == s->steps)) {
            float vl = 0;
            DDP_CHECK(ddp_trainer_validate(t, &vl));
            if (t->opts.rank == 0 && !t->opts.quiet)
                DDP_INFO("step %5ld/%ld | val loss %.4f", t->step, s->steps, vl);
            if (t->metrics) {
                fprintf(t->metrics, "{\"step\":%ld,\"val_loss\":%.6f}\n", t->step, vl);
                fflush(t->metrics);
            }
        }
    }
    return 0;
}
