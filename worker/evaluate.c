/* Multiple-choice evaluation in the trainer (see trainer.h): the spec's `eval` tasks, read and
 * tokenized once at init, scored with the trainer's model every `every` steps and after the
 * last, dealt over the ranks (evaluate/score.h); and ddp-worker --eval, the same scorer alone on
 * a checkpoint. Neither the loader, the trainer's RNG nor the gradient arena is touched, so the
 * run's weights are bitwise those of the run without evaluation. Collective. */
#include "worker/trainer_int.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/test_hook.h"
#include "proto/hf_config.h"
#include "worker/checkpoint/checkpoint.h"

_Static_assert(sizeof(((ddp_eval_task_t *)0)->target_delimiter) == DDP_MC_MAX_DELIM,
               "a spec's target_delimiter fits a task's");

/* Reads task path (limit rows) and tokenizes every choice once, so a bad row fails now with its
 * file, line and field rather than at step N. */
static int open_task(ddp_mc_scorer_t *sc, ddp_mc_task_t *task, const char *path, long limit,
                     const char *delim, ddp_errinfo_t *ei)
{
    DDP_CHECK(ddp_mc_task_load(task, path, limit, delim, ei));
    for (size_t e = 0; e < task->n; e++)
        for (int i = 0; i < task->ex[e].n_choices; i++)
            DDP_CHECK(ddp_mc_tokenize(sc, &task->ex[e], i, task->delim, path, ei));
    return 0;
}

/* The BOS the run's tokenizer adds (none without one: bytes). */
static int run_bos(const ddp_run_tokenizer_t *rt, long *bos, ddp_errinfo_t *ei)
{
    *bos = -1;
    return rt ? ddp_mc_tokenizer_bos(rt->json, rt->tok, bos, ei) : 0;
}

int ddp_trainer_eval_open(ddp_trainer_t *t, ddp_errinfo_t *ei)
{
    const ddp_spec_t *s = &t->spec;
    ddp_run_evals_t *ev = &t->evals;
    if (s->n_eval == 0) return 0;
    long bos;
    int rc = run_bos(t->data.tokenizer, &bos, ei);
    const ddp_tok_t *tok = t->data.tokenizer ? t->data.tokenizer->tok : NULL;
    if (rc == 0) rc = ddp_mc_scorer_init(&ev->scorer, &t->model, tok, bos, s->seq_len, ei);
    for (int i = 0; rc == 0 && i < s->n_eval; i++) {
        ev->n = i + 1; /* close frees what was read, also after an error */
        rc = open_task(&ev->scorer, &ev->task[i], s->eval[i].path, s->eval[i].limit,
                       s->eval[i].target_delimiter, ei);
        if (rc == 0 && t->world.rank == 0 && !t->opts.quiet)
            DDP_INFO("eval %s: %zu examples from %s%s", s->eval[i].name, ev->task[i].n,
                     s->eval[i].path, bos >= 0 ? " (BOS first, as the tokenizer adds it)" : "");
    }
    if (rc == DDP_EFORMAT || rc == DDP_EINVAL || (rc < 0 && rc > -1000)) /* -errno: unreadable */
        rc = DDP_ESPEC; /* the spec names a task that cannot be scored: exit code 2 */
    return rc;
}

void ddp_trainer_eval_close(ddp_trainer_t *t)
{
    for (int i = 0; i < t->evals.n; i++) ddp_mc_task_close(&t->evals.task[i]);
    ddp_mc_scorer_close(&t->evals.scorer);
    t->evals.n = 0;
}

int ddp_trainer_evaluate(ddp_trainer_t *t, ddp_errinfo_t *ei)
{
    const ddp_spec_t *s = &t->spec;
    for (int i = 0; i < t->evals.n; i++) {
        const ddp_eval_task_t *et = &s->eval[i];
        int due = t->pos.step == s->steps || (et->every > 0 && t->pos.step % et->every == 0);
        if (!due) continue;
        if (t->member.gen.gen <= 1) ddp_test_hook(DDP_HOOK_EVAL, t->pos.step, t->world.rank);
        int64_t t0 = ddp_now_ns();
        ddp_mc_result_t r;
        int rc = ddp_mc_evaluate(&t->evals.scorer, &t->evals.task[i], et->path, &t->world, &r, ei);
        if (rc) {
            DDP_WARN("eval %s at step %ld abandoned: %s", et->name, t->pos.step,
                     ei && ei->msg[0] ? ei->msg : ddp_strerror(rc));
            return rc;
        }
        ddp_trainer_log_eval(t, et->name, &r, (double)(ddp_now_ns() - t0) / 1e6);
    }
    return 0;
}

static int copy_h2d(void *dst, const void *src, size_t n, void *ctx)
{
    ddp_kernels_t *k = ctx;
    int rc = ddp_k_memcpy_h2d(k, dst, src, n);
    return rc ? rc : ddp_k_sync(k);
}

/* The model's weights from dir (model.init_from's loader). */
static int load_weights(ddp_model_t *m, ddp_kernels_t *k, const char *dir, ddp_errinfo_t *ei)
{
    size_t n = (size_t)m->n_tensors;
    ddp_ckpt_tensor_t *list = ddp_calloc(n, sizeof *list);
    if (!list) return DDP_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const ddp_param_desc_t *p = &m->params[i];
        list[i] = (ddp_ckpt_tensor_t){.name = p->name,
                                      .dtype = DDP_ST_F32,
                                      .ndim = p->ndim,
                                      .shape = {p->shape[0], p->shape[1]},
                                      .nbytes = p->numel * sizeof(float),
                                      .data = m->w + p->offset};
    }
    int rc = ddp_ckpt_init_from(dir, list, n, ddp_k_host_memory(k) ? NULL : copy_h2d, k, ei);
    free(list);
    return rc;
}

/* Rows of one forward in ddp-worker --eval: HellaSwag's four choices at once. */
#define EVAL_ROWS 4

int ddp_trainer_eval_checkpoint(const char *task_path, const char *dir, long limit,
                                const char *delim, const char *backend, FILE *out, FILE *details,
                                ddp_errinfo_t *ei)
{
    if (strlen(delim) >= DDP_MC_MAX_DELIM)
        return ddp_errinfo_set(ei, DDP_EINVAL, "--eval-delimiter: at most %d bytes, got %zu",
                               DDP_MC_MAX_DELIM - 1, strlen(delim));
    ddp_spec_t spec;
    ddp_spec_defaults(&spec);
    memset(&spec.model, 0, sizeof spec.model);
    spec.preset[0] = 0;
    spec.seq_len = 0; /* the model's block_size */
    spec.global_batch_tokens = 0;
    snprintf(spec.init_from, sizeof spec.init_from, "%s", dir);
    DDP_CHECK(ddp_spec_resolve_model(&spec, ei));
    char tok_path[1100];
    struct stat st;
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", dir);
    ddp_run_tokenizer_t *rt = NULL;
    ddp_kernels_t k;
    memset(&k, 0, sizeof k);
    ddp_model_t m;
    memset(&m, 0, sizeof m);
    ddp_mc_scorer_t sc;
    memset(&sc, 0, sizeof sc);
    ddp_mc_task_t task;
    memset(&task, 0, sizeof task);
    int have_k = 0, have_m = 0;
    long bos = -1;
    int rc = 0;
    if (stat(tok_path, &st) == 0)
        DDP_CHECK_GOTO(ddp_run_tokenizer_open(tok_path, spec.model.vocab_size, &rt, ei), rc, out);
    DDP_CHECK_GOTO(run_bos(rt, &bos, ei), rc, out);
    rc = ddp_kernels_open(&k, backend ? backend : "cpu", 0, 0);
    if (rc) {
        ddp_errinfo_set(ei, rc, "kernel backend '%s': %s", backend ? backend : "cpu",
                        ddp_strerror(rc));
        goto out;
    }
    have_k = 1;
    DDP_K(&k, set_precision, DDP_KPREC_FP32);
    DDP_CHECK_GOTO(ddp_model_init(&m, &spec.model, &k, EVAL_ROWS, spec.seq_len, NULL, NULL), rc,
                   out);
    have_m = 1;
    DDP_CHECK_GOTO(load_weights(&m, &k, dir, ei), rc, out);
    DDP_K(&k, set_weights, m.w, m.n_params);
    DDP_CHECK_GOTO(ddp_mc_scorer_init(&sc, &m, rt ? rt->tok : NULL, bos, spec.seq_len, ei), rc,
                   out);
    DDP_CHECK_GOTO(open_task(&sc, &task, task_path, limit, delim, ei), rc, out);
    sc.details = details;
    int64_t t0 = ddp_now_ns();
    ddp_mc_result_t r;
    DDP_CHECK_GOTO(ddp_mc_evaluate(&sc, &task, task_path, NULL, &r, ei), rc, out);
    double s = (double)(ddp_now_ns() - t0) / 1e9, n = r.n > 0 ? (double)r.n : 1;
    json_t *j = json_pack("{s:s,s:s,s:I,s:f,s:f,s:f,s:i,s:I,s:I,s:f}", "task", task_path, "model",
                          dir, "examples", (json_int_t)r.n, "acc", r.acc / n, "acc_norm",
                          r.acc_norm / n, "acc_tok", r.acc_tok / n, "seq_len", spec.seq_len, "bos",
                          (json_int_t)bos, "tokens", (json_int_t)r.tokens, "seconds", s);
    char *line = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(10)) : NULL;
    json_decref(j);
    if (!line) {
        rc = DDP_ENOMEM;
        goto out;
    }
    fprintf(out, "%s\n", line);
    free(line);
    fprintf(out, "%s: %ld examples: acc %.4f, acc_norm %.4f, acc_tok %.4f (%.0f tokens/s)\n",
            task_path, r.n, r.acc / n, r.acc_norm / n, r.acc_tok / n, (double)r.tokens / s);
out:
    ddp_mc_task_close(&task);
    ddp_mc_scorer_close(&sc);
    if (have_m) ddp_model_close(&m);
    if (have_k) ddp_kernels_close(&k);
    ddp_run_tokenizer_free(rt);
    return rc;
}
