/* GPT-2 on the CPU backend against the PyTorch reference (tests/fixtures/gpt2_tiny.*):
 * logits and loss of one forward, every parameter's gradient after one backward, and the
 * losses and final weights of 10 AdamW steps with clipping; the same 10 steps in bf16 and fp16
 * (with loss scaling) against PyTorch autocast (tests/fixtures/gpt2_prec.json). Also: the layout
 * is in backward completion order and backward's ready prefixes only grow. */
#include <jansson.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/crc32c.h"
#include "worker/model/model.h"
#include "worker/optim/loss_scale.h"
#include "worker/optim/adamw.h"
#include "ref_fixture.h"

typedef struct {
    ref_fixture_t ref;
    ddp_kernels_t k;
    ddp_model_t m;
    ddp_model_cfg_t cfg;
    int B, T;
} fixture_t;

static const void *tensor(fixture_t *fx, const char *name, size_t *numel)
{
    return ref_tensor(&fx->ref, name, numel);
}

static int cfg_int(fixture_t *fx, const char *key) { return (int)ref_num(&fx->ref, key); }

static double cfg_num(fixture_t *fx, const char *key) { return ref_num(&fx->ref, key); }

/* The backend's first error since the last sync. */
static int ddp_kernels_sync_err(fixture_t *fx) { return fx->k.ops->sync(fx->k.ctx); }

/* Loads init.* into the model's parameter arena. */
static void load_weights(fixture_t *fx, const char *prefix);

/* The fixture's model again, with activations of precision prec (the kernels' precision at
 * init fixes their type) and the initial weights. */
static void set_model_precision(fixture_t *fx, ddp_kprec_t prec)
{
    DDP_K(&fx->k, set_precision, prec);
    ddp_model_close(&fx->m);
    assert_int_equal(ddp_model_init(&fx->m, &fx->cfg, &fx->k, fx->B, fx->T, NULL, NULL), 0);
    assert_int_equal(fx->m.acts.prec, prec);
    load_weights(fx, "init.");
}

/* Loads init.* into the model's parameter arena. */
static void load_weights(fixture_t *fx, const char *prefix)
{
    float *host = calloc(fx->m.n_params, sizeof(float));
    for (int i = 0; i < fx->m.n_tensors; i++) {
        const ddp_param_desc_t *p = &fx->m.params[i];
        char name[96];
        snprintf(name, sizeof name, "%s%s", prefix, p->name);
        size_t n;
        const float *src = tensor(fx, name, &n);
        assert_int_equal(n, p->numel);
        memcpy(host + p->offset, src, n * sizeof(float));
    }
    assert_int_equal(fx->k.ops->memcpy_h2d(fx->k.ctx, fx->m.w, host, fx->m.n_params * 4), 0);
    free(host);
}

static int setup(void **state)
{
    fixture_t *fx = calloc(1, sizeof *fx);
    if (ref_open(&fx->ref, "tests/fixtures/gpt2_tiny.json", "tests/fixtures/gpt2_tiny.bin"))
        return -1;
    fx->cfg = (ddp_model_cfg_t){.n_layer = cfg_int(fx, "n_layer"),
                                .n_head = cfg_int(fx, "n_head"),
                                .n_embd = cfg_int(fx, "n_embd"),
                                .vocab_size = cfg_int(fx, "vocab_size"),
                                .block_size = cfg_int(fx, "block_size")};
    fx->B = cfg_int(fx, "B");
    fx->T = cfg_int(fx, "T");
    if (ddp_kernels_open(&fx->k, "cpu", 0, 2)) return -1;
    if (ddp_model_init(&fx->m, &fx->cfg, &fx->k, fx->B, fx->T, NULL, NULL)) return -1;
    load_weights(fx, "init.");
    *state = fx;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *fx = *state;
    ddp_model_close(&fx->m);
    ddp_kernels_close(&fx->k);
    ref_close(&fx->ref);
    free(fx);
    return 0;
}

/* Batch s of the fixture's token table as inputs and targets. */
static void batch(fixture_t *fx, int s, int32_t *in, int32_t *tg)
{
    const int32_t *tok = tensor(fx, "tokens", NULL);
    int T1 = fx->T + 1;
    for (int b = 0; b < fx->B; b++)
        for (int t = 0; t < fx->T; t++) {
            in[b * fx->T + t] = tok[((size_t)s * fx->B + b) * T1 + t];
            tg[b * fx->T + t] = tok[((size_t)s * fx->B + b) * T1 + t + 1];
        }
}


/* Interrupts the pass at the (after)-th question (counting from 1). */
typedef struct {
    int asked, after;
} interrupt_t;

static int interrupt_after(void *arg)
{
    interrupt_t *i = arg;
    return ++i->asked >= i->after;
}

/* model.interrupted stops forward and backward between blocks with DDP_EABORTED, and a pass
 * that is never interrupted asks once per block. */
static void test_interrupted_pass_stops(void **state)
{
    fixture_t *fx = *state;
    size_t n = (size_t)fx->B * fx->T;
    int32_t *in = malloc(n * 4), *tg = malloc(n * 4);
    batch(fx, 0, in, tg);
    float loss;
    interrupt_t never = {0, 1 << 30}, first = {0, 1}, second = {0, 2};
    fx->m.interrupted = interrupt_after;
    fx->m.interrupted_arg = &never;
    assert_int_equal(ddp_model_forward(&fx->m, in, tg, fx->B, fx->T), 0);
    assert_int_equal(ddp_model_backward(&fx->m, NULL, NULL, &loss), 0);
    assert_int_equal(never.asked, 2 * fx->cfg.n_layer);
    fx->m.interrupted_arg = &first;
    assert_int_equal(ddp_model_forward(&fx->m, in, tg, fx->B, fx->T), DDP_EABORTED);
    assert_int_equal(first.asked, 1);
    fx->m.interrupted_arg = &never;
    assert_int_equal(ddp_model_forward(&fx->m, in, tg, fx->B, fx->T), 0);
    fx->m.interrupted_arg = &second;
    assert_int_equal(ddp_model_backward(&fx->m, NULL, NULL, &loss), DDP_EABORTED);
    assert_int_equal(second.asked, 2);
    fx->m.interrupted = NULL;
    free(in);
    free(tg);
}

/* The LM head in chunks (GPT-2's vocabulary: 320 rows per chunk, so 400 rows take two): the
 * loss, wte's gradient from the head and ln_f's output gradient equal those of the whole
 * [B*T, V] product, computed here with the same ops; evaluate gives the same loss and leaves
 * the gradients alone (and refuses no targets); next_logits' rows (padded to ddp_logits_ld(V))
 * are the whole product's at the last position, and at an earlier one with the tokens after it
 * replaced; backward after an evaluate is refused. */
static void test_lm_head_chunks(void **state)
{
    ddp_model_cfg_t cfg = {.n_layer = 1, .n_head = 2, .n_embd = 16, .vocab_size = 50257,
                           .block_size = 200};
    int B = 2, T = 200, C = cfg.n_embd, V = cfg.vocab_size, N = B * T;
    ddp_kernels_t k;
    assert_int_equal(ddp_kernels_open(&k, "cpu", 0, 2), 0);
    ddp_model_t m;
    assert_int_equal(ddp_model_init(&m, &cfg, &k, B, T, NULL, NULL), 0);
    assert_int_equal(m.acts.lm_rows, 320);
    /* the chunk is about 64 MiB of logits (256 MiB on a GPU), in rows of 64, at most B*T */
    assert_int_equal(ddp_model_lm_rows(&cfg, 8, 1024, DDP_KPREC_BF16, 0), 640);
    assert_int_equal(ddp_model_lm_rows(&cfg, 8, 1024, DDP_KPREC_BF16, 1), 2624);
    assert_int_equal(ddp_model_lm_rows(&cfg, 8, 1024, DDP_KPREC_FP32, 1), 1280);
    assert_int_equal(ddp_model_lm_rows(&cfg, 1, 1000, DDP_KPREC_BF16, 1), 1000);
    ddp_rng_t rng;
    ddp_rng_seed(&rng, 3);
    assert_int_equal(ddp_model_init_weights(&m, &rng), 0);
    int32_t *in = malloc((size_t)N * 4), *tg = malloc((size_t)N * 4);
    for (int i = 0; i < N; i++) {
        in[i] = (int32_t)(ddp_rng_next(&rng) % (uint64_t)V);
        tg[i] = (int32_t)(ddp_rng_next(&rng) % (uint64_t)V);
    }
    float eval_loss;
    assert_int_equal(ddp_model_forward(&m, in, tg, B, T), 0);
    float *train_losses = malloc((size_t)N * 4); /* the rows' losses (host memory: the CPU) */
    memcpy(train_losses, m.acts.losses, (size_t)N * 4);

    /* the whole product, from the same ln_f output */
    size_t nl = (size_t)N * V;
    float *logits = malloc(nl * 4), *losses = malloc((size_t)N * 4);
    float *dwte = calloc((size_t)V * C, 4), *dlnf = calloc((size_t)N * C, 4);
    ddp_act_t *lg = (ddp_act_t *)logits; /* an fp32 run: activations are floats */
    DDP_K(&k, matmul_fwd, lg, m.acts.lnf, m.wv.wte, NULL, N, C, V, V, DDP_W_OUT_IN);
    DDP_K(&k, xent_fwd_bwd, losses, lg, lg, tg, N, V, V, 1.0f / (float)N);
    DDP_K(&k, matmul_bwd, (ddp_act_t *)dlnf, dwte, NULL, lg, m.acts.lnf, m.wv.wte, N, C, V, V,
          DDP_W_OUT_IN);
    double sum = 0;
    for (int i = 0; i < N; i++) sum += losses[i];
    assert_memory_equal(train_losses, losses, (size_t)N * 4);
    assert_true(ref_rel_norm_err(m.gv.wte, dwte, (size_t)V * C) < 1e-6);
    assert_true(ref_rel_norm_err((const float *)m.acts.dlnf, dlnf, (size_t)N * C) < 1e-6);

    float *g = malloc(m.n_params * 4);
    memcpy(g, m.g, m.n_params * 4);
    assert_int_equal(ddp_model_evaluate(&m, in, tg, B, T, &eval_loss), 0);
    assert_float_equal(eval_loss, sum / N, 1e-6 * fabs(sum / N));
    assert_memory_equal(g, m.g, m.n_params * 4);
    assert_int_equal(ddp_model_backward(&m, NULL, NULL, NULL), DDP_EINVAL);
    assert_int_equal(ddp_model_evaluate(&m, in, NULL, B, T, NULL), DDP_EINVAL);
    assert_int_equal(ddp_model_next_logits(&m, in, B, T, T - 1), 0);
    /* the whole product again (xent wrote dlogits over it) */
    DDP_K(&k, matmul_fwd, lg, m.acts.lnf, m.wv.wte, NULL, N, C, V, V, DDP_W_OUT_IN);
    for (int b = 0; b < B; b++)
        assert_true(ref_rel_norm_err((const float *)m.acts.logits + (size_t)b * ddp_logits_ld(V),
                                 logits + ((size_t)b * T + T - 1) * V, (size_t)V) < 1e-6);
    /* an earlier position, the rest of each sequence replaced by padding: causal attention
     * ignores it */
    int pos = T / 3;
    int32_t *padded = malloc((size_t)N * sizeof *padded);
    for (int i = 0; i < N; i++) padded[i] = i % T > pos ? 0 : in[i];
    assert_int_equal(ddp_model_next_logits(&m, padded, B, T, pos), 0);
    free(padded);
    for (int b = 0; b < B; b++)
        assert_true(ref_rel_norm_err((const float *)m.acts.logits + (size_t)b * ddp_logits_ld(V),
                                 logits + ((size_t)b * T + pos) * V, (size_t)V) < 1e-6);
    assert_int_equal(ddp_model_next_logits(&m, in, B, T, T), DDP_EINVAL);
    assert_int_equal(ddp_model_forward(&m, in, NULL, B, T), DDP_EINVAL);
    free(in), free(tg), free(logits), free(losses), free(dwte), free(dlnf), free(g);
    free(train_losses);
    ddp_model_close(&m);
    ddp_kernels_close(&k);
}

/* One micro-step (forward + backward) of a small GPT-2 on `backend` under the profiler: the
 * counts of syncs and copies each way, and the loss. */
typedef struct {
    long sync, h2d, d2h;
    float loss;
} micro_step_t;

static micro_step_t profiled_micro_step(const char *backend)
{
    ddp_model_cfg_t cfg = {.n_layer = 2, .n_head = 2, .n_embd = 32, .vocab_size = 300,
                           .block_size = 16};
    int B = 2, T = 16, N = B * T;
    int32_t in[32], tg[32];
    for (int i = 0; i < N; i++) in[i] = (i * 7) % 300, tg[i] = (i * 13 + 1) % 300;
    micro_step_t out = {-1, -1, -1, NAN};
    ddp_kernels_t k;
    if (ddp_kernels_open(&k, backend, 0, 1)) return out;
    ddp_model_t m;
    ddp_rng_t rng;
    ddp_rng_seed(&rng, 5);
    ddp_kprof_report_t r;
    if (ddp_model_init(&m, &cfg, &k, B, T, NULL, NULL) == 0) {
        if (ddp_model_init_weights(&m, &rng) == 0 && ddp_k_profile_start(&k) == 0 &&
            ddp_model_forward(&m, in, tg, B, T) == 0 &&
            ddp_model_backward(&m, NULL, NULL, &out.loss) == 0 &&
            ddp_k_profile_stop(&k, &r) == 0)
            out = (micro_step_t){r.op[DDP_KOP_sync].calls, r.op[DDP_KOP_memcpy_h2d].calls,
                                 r.op[DDP_KOP_memcpy_d2h].calls, out.loss};
        ddp_model_close(&m);
    }
    ddp_kernels_close(&k);
    return out;
}

/* A training micro-step waits for the device once: forward queues everything (its inputs'
 * copies included, which memcpy_h2d queues), and backward syncs at its end and then reads the
 * rows' losses, the one copy to the host. Counted by the profiler on the CPU and on the
 * simulated GPU, whose copies and waits are the CUDA backend's; the loss is the CPU's, bitwise.
 * The sim runs in a child process: once its module is unloaded, LeakSanitizer's scan at exit
 * can trip over the module's thread-local storage (a crash after every test passed, seen in
 * half the runs of the ASan build), so it never loads into this one. */
static void test_micro_step_waits_once(void **state)
{
    micro_step_t got[2];
    got[0] = profiled_micro_step("cpu");
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        micro_step_t sim = profiled_micro_step("sim");
        _exit(write(fd[1], &sim, sizeof sim) == (ssize_t)sizeof sim ? 0 : 1);
    }
    close(fd[1]);
    assert_int_equal(read(fd[0], &got[1], sizeof got[1]), (ssize_t)sizeof got[1]);
    close(fd[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    for (int b = 0; b < 2; b++) {
        fprintf(stderr, "%s: sync %ld, memcpy_h2d %ld, memcpy_d2h %ld\n", b ? "sim" : "cpu",
                got[b].sync, got[b].h2d, got[b].d2h);
        assert_int_equal(got[b].sync, 1);
        assert_int_equal(got[b].d2h, 1);
        assert_int_equal(got[b].h2d, 2); /* inputs, targets */
    }
    assert_memory_equal(&got[0].loss, &got[1].loss, sizeof(float));
}

static void test_layout_is_backward_order(void **state)
{
    fixture_t *fx = *state;
    const ddp_model_t *m = &fx->m;
    assert_string_equal(m->params[0].name, "wte.weight");
    assert_string_equal(m->params[1].name, "ln_f.weight");
    assert_string_equal(m->params[3].name, "h.1.mlp.c_proj.weight");
    assert_string_equal(m->params[m->n_tensors - 1].name, "wpe.weight");
    assert_string_equal(m->params[m->n_tensors - 2].name, "h.0.ln_1.bias");
    size_t off = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        assert_int_equal(m->params[i].offset, off);
        off += m->params[i].numel;
    }
    assert_int_equal(off, m->n_params);
    assert_int_equal(ddp_model_count_params(&fx->cfg), m->n_params);
    assert_non_null(ddp_model_find(m, "transformer.h.0.attn.c_attn.weight"));
    assert_int_equal(ddp_model_find(m, "h.0.attn.c_attn.weight")->shape[1], 3 * fx->cfg.n_embd);
}

static void test_forward_matches_pytorch(void **state)
{
    fixture_t *fx = *state;
    size_t n = (size_t)fx->B * fx->T;
    int32_t *in = malloc(n * 4), *tg = malloc(n * 4);
    batch(fx, 0, in, tg);
    float loss = 0;
    assert_int_equal(ddp_model_forward(&fx->m, in, tg, fx->B, fx->T), 0);
    assert_int_equal(ddp_model_backward(&fx->m, NULL, NULL, &loss), 0); /* it reads the loss */
    float ref = *(const float *)tensor(fx, "loss", NULL);
    double rel = fabs((double)loss - ref) / fabs(ref);
    fprintf(stderr, "loss %.7f reference %.7f rel err %.2e\n", loss, ref, rel);
    assert_true(rel < 1e-5);
    size_t nl;
    const float *ref_logits = tensor(fx, "logits", &nl);
    assert_int_equal(nl, n * fx->cfg.vocab_size);
    /* the LM head keeps one chunk of logits: the whole [B*T, V] from ln_f's output here */
    float *logits = malloc(nl * sizeof(float));
    DDP_K(fx->m.k, matmul_fwd, (ddp_act_t *)logits, fx->m.acts.lnf, fx->m.wv.wte, NULL, (int)n, fx->cfg.n_embd,
          fx->cfg.vocab_size, fx->cfg.vocab_size, DDP_W_OUT_IN);
    assert_int_equal(ddp_k_sync(fx->m.k), 0);
    double err = ref_rel_norm_err(logits, ref_logits, nl);
    free(logits);
    fprintf(stderr, "logits rel norm err %.2e\n", err);
    assert_true(err < 1e-5);
    free(in);
    free(tg);
}

typedef struct {
    size_t last;
    int calls, shrank;
} ready_log_t;

static void on_ready(void *arg, size_t done)
{
    ready_log_t *r = arg;
    if (done < r->last) r->shrank = 1;
    r->last = done;
    r->calls++;
}

static void test_backward_matches_pytorch(void **state)
{
    fixture_t *fx = *state;
    size_t n = (size_t)fx->B * fx->T;
    int32_t *in = malloc(n * 4), *tg = malloc(n * 4);
    batch(fx, 0, in, tg);
    float loss;
    assert_int_equal(ddp_model_forward(&fx->m, in, tg, fx->B, fx->T), 0);
    ready_log_t r = {0};
    assert_int_equal(ddp_model_backward(&fx->m, on_ready, &r, &loss), 0);
    assert_false(r.shrank);
    assert_int_equal(r.last, fx->m.n_params);
    assert_int_equal(r.calls, fx->cfg.n_layer + 3); /* LM head, ln_f, each block, embedding */
    ddp_model_embed_backward(&fx->m, fx->m.acts.inputs, fx->m.acts.dres, fx->B, fx->T);
    double worst = 0;
    for (int i = 0; i < fx->m.n_tensors; i++) {
        const ddp_param_desc_t *p = &fx->m.params[i];
        char name[96];
        snprintf(name, sizeof name, "grad.%s", p->name);
        const float *ref = tensor(fx, name, NULL);
        double err = ref_rel_norm_err(fx->m.g + p->offset, ref, p->numel);
        if (err > 1e-4) fprintf(stderr, "%s: rel norm err %.2e\n", p->name, err);
        assert_true(err < 1e-4);
        worst = err > worst ? err : worst;
    }
    fprintf(stderr, "worst gradient rel norm err %.2e over %d tensors\n", worst,
                  fx->m.n_tensors);
    free(in);
    free(tg);
}

/* The fixture's initial weights, fresh moments and the default spec. */
static void adamw_setup(fixture_t *fx, ddp_adamw_t *opt, ddp_spec_t *spec)
{
    load_weights(fx, "init.");
    assert_int_equal(ddp_adamw_init(opt, &fx->m, NULL, NULL), 0);
    ddp_spec_defaults(spec);
}

/* The fixture's AdamW settings at a constant learning rate, as PyTorch ran them. */
static void fixture_hyperparameters(fixture_t *fx, ddp_spec_t *spec)
{
    spec->lr = spec->min_lr = cfg_num(fx, "lr");
    spec->warmup = 0;
    spec->schedule = DDP_SCHED_CONSTANT;
    spec->beta1 = cfg_num(fx, "beta1");
    spec->beta2 = cfg_num(fx, "beta2");
    spec->eps = cfg_num(fx, "eps");
    spec->weight_decay = cfg_num(fx, "weight_decay");
    spec->clip = cfg_num(fx, "clip");
}

static void test_adamw_steps_match_pytorch(void **state)
{
    fixture_t *fx = *state;
    ddp_adamw_t opt;
    ddp_spec_t spec;
    adamw_setup(fx, &opt, &spec);
    fixture_hyperparameters(fx, &spec);
    size_t n = (size_t)fx->B * fx->T;
    int32_t *in = malloc(n * 4), *tg = malloc(n * 4);
    const float *ref_losses = tensor(fx, "adamw_losses", NULL);
    int steps = cfg_int(fx, "steps");
    /* the whole arena as one part (what one rank without buckets updates) */
    const ddp_arena_part_t whole = {0, fx->m.n_params, 0};
    size_t nb = (fx->m.n_params + DDP_NORM_BLOCK - 1) / DDP_NORM_BLOCK;
    float *sums = calloc(nb, sizeof *sums);
    for (int s = 0; s < steps; s++) {
        batch(fx, s, in, tg);
        float loss;
        assert_int_equal(ddp_model_forward(&fx->m, in, tg, fx->B, fx->T), 0);
        assert_int_equal(ddp_model_backward(&fx->m, NULL, NULL, &loss), 0);
        ddp_model_embed_backward(&fx->m, fx->m.acts.inputs, fx->m.acts.dres, fx->B, fx->T);
        assert_int_equal(ddp_grad_sumsq(&fx->m, &whole, 1, sums), 0);
        double norm = ddp_grad_norm(sums, nb, 1.0f);
        assert_int_equal(ddp_adamw_step(&opt, &fx->m, &spec,
                                        &(ddp_adamw_args_t){.lr = spec.lr,
                                                            .grad_scale = 1.0f,
                                                            .norm = norm,
                                                            .parts = &whole,
                                                            .n_parts = 1}),
                         0);
        double rel = fabs((double)loss - ref_losses[s]) / fabs(ref_losses[s]);
        fprintf(stderr, "step %d loss %.7f reference %.7f rel %.1e\n", s, loss, ref_losses[s],
                      rel);
        assert_true(rel < 1e-5);
    }
    for (int i = 0; i < fx->m.n_tensors; i++) {
        const ddp_param_desc_t *p = &fx->m.params[i];
        char name[96];
        snprintf(name, sizeof name, "final.%s", p->name);
        double err = ref_rel_norm_err(fx->m.w + p->offset, tensor(fx, name, NULL), p->numel);
        /* 1e-4, not 1e-5: the key part of c_attn.bias has an exactly-zero gradient in exact
         * arithmetic (softmax ignores a constant added to every key), so Adam amplifies
         * rounding noise there into lr-sized steps on both sides. */
        if (err > 1e-5) fprintf(stderr, "%s: final weights rel err %.2e\n", p->name, err);
        assert_true(err < 1e-4);
    }
    ddp_adamw_close(&opt, &fx->m);
    free(sums);
    free(in);
    free(tg);
}

/* The 10 AdamW steps of the fixture in precision `prec` on the CPU (inputs of every matmul
 * rounded, fp32 accumulation: native bf16 where the CPU has it, else emulated), with
 * worker/optim/loss_scale.c's scaler as the trainer uses it; the loss before each step goes to
 * losses[]. Returns the steps skipped. */
static int train_steps(fixture_t *fx, ddp_kprec_t prec, float *losses, int steps)
{
    ddp_adamw_t opt;
    ddp_spec_t spec;
    set_model_precision(fx, prec);
    adamw_setup(fx, &opt, &spec);
    fixture_hyperparameters(fx, &spec);
    ddp_loss_scale_t ls;
    ddp_position_t pos = {0};
    ddp_loss_scale_init(&ls, prec, 2000, &pos);
    size_t n = (size_t)fx->B * fx->T;
    int32_t *in = malloc(n * 4), *tg = malloc(n * 4);
    const ddp_arena_part_t whole = {0, fx->m.n_params, 0};
    size_t nb = (fx->m.n_params + DDP_NORM_BLOCK - 1) / DDP_NORM_BLOCK;
    float *sums = calloc(nb, sizeof *sums);
    int skipped = 0;
    for (int s = 0; s < steps; s++) {
        batch(fx, s, in, tg);
        pos.step = s;
        fx->m.loss_scale = ddp_loss_scale_factor(&pos, 0);
        assert_int_equal(ddp_model_forward(&fx->m, in, tg, fx->B, fx->T), 0);
        assert_int_equal(ddp_model_backward(&fx->m, NULL, NULL, &losses[s]), 0);
        ddp_model_embed_backward(&fx->m, fx->m.acts.inputs, fx->m.acts.dres, fx->B, fx->T);
        assert_int_equal(ddp_grad_sumsq(&fx->m, &whole, 1, sums), 0);
        float grad_scale = 1.0f / pos.loss_scale;
        double norm = ddp_grad_norm(sums, nb, grad_scale);
        if (ddp_loss_scale_update(&ls, &pos, isfinite(norm), 0)) {
            skipped++;
            continue;
        }
        assert_int_equal(ddp_adamw_step(&opt, &fx->m, &spec,
                                        &(ddp_adamw_args_t){.lr = spec.lr,
                                                            .grad_scale = grad_scale,
                                                            .norm = norm,
                                                            .parts = &whole,
                                                            .n_parts = 1}),
                         0);
        DDP_K(&fx->k, set_precision, prec); /* the weights changed */
    }
    assert_int_equal(ddp_kernels_sync_err(fx), 0);
    fx->m.loss_scale = 1.0f;
    ddp_adamw_close(&opt, &fx->m);
    set_model_precision(fx, DDP_KPREC_FP32);
    free(sums);
    free(in);
    free(tg);
    return skipped;
}

/* bf16 and fp16 training against PyTorch's fp32 and autocast runs: every step's loss is within
 * autocast's own largest distance from fp32 (bf16: 5.8e-4, fp16: 1.3e-4 with PyTorch 2.15) of
 * PyTorch's fp32 loss -- ddpd's rounding costs no more than autocast's -- and within twice that
 * of autocast's loss (two runs rounded independently, each within it of fp32: measured 5.1e-4
 * native bf16, 6.3e-4 emulated, 5.1e-5 fp16); and not bitwise the fp32 run (it rounded). */
static void test_mixed_precision_matches_autocast(void **state)
{
    fixture_t *fx = *state;
    const char *root = getenv("DDP_SOURCE_ROOT");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/gpt2_prec.json", root ? root : ".");
    json_error_t err;
    json_t *ref = json_load_file(path, 0, &err);
    assert_non_null(ref);
    json_t *all = json_object_get(ref, "losses");
    json_t *fp32 = json_object_get(all, "fp32");
    int steps = (int)json_array_size(fp32);
    assert_int_equal(steps, cfg_int(fx, "steps"));
    float ours32[16], ours[16];
    assert_true(steps <= 16);
    train_steps(fx, DDP_KPREC_FP32, ours32, steps);
    const ddp_kprec_t precs[2] = {DDP_KPREC_BF16, DDP_KPREC_FP16};
    for (int p = 0; p < 2; p++) {
        const char *name = ddp_prec_name(precs[p]);
        json_t *amp = json_object_get(all, name);
        double bound = 0, worst = 0;
        for (int s = 0; s < steps; s++) {
            double d = fabs(json_number_value(json_array_get(amp, (size_t)s)) -
                            json_number_value(json_array_get(fp32, (size_t)s)));
            bound = d > bound ? d : bound;
        }
        assert_int_equal(train_steps(fx, precs[p], ours, steps), 0);
        int differs = 0;
        double worst32 = 0;
        for (int s = 0; s < steps; s++) {
            double d = fabs(ours[s] - json_number_value(json_array_get(amp, (size_t)s)));
            double d32 = fabs(ours[s] - json_number_value(json_array_get(fp32, (size_t)s)));
            worst32 = d32 > worst32 ? d32 : worst32;
            worst = d > worst ? d : worst;
            differs |= ours[s] != ours32[s];
            if (d32 > bound)
                fail_msg("%s step %d: loss %.7f, PyTorch fp32 %.7f: |diff| %.2e > %.2e "
                         "(PyTorch's autocast-vs-fp32 distance)",
                         name, s, ours[s], json_number_value(json_array_get(fp32, (size_t)s)),
                         d32, bound);
            if (d > 2 * bound)
                fail_msg("%s step %d: loss %.7f, PyTorch autocast %.7f: |diff| %.2e > 2 x %.2e",
                         name, s, ours[s], json_number_value(json_array_get(amp, (size_t)s)), d,
                         bound);
        }
        fprintf(stderr,
                "%s: max |ddpd - fp32| %.2e, |ddpd - autocast| %.2e; autocast-fp32 %.2e\n",
                name, worst32, worst, bound);
        assert_true(differs);
    }
    json_decref(ref);
}

/* fp16 overflow: an infinite loss gradient skips the update and halves the scale; a run whose
 * scale doubles after 2 clean steps goes 65536, 131072, ... */
static void test_loss_scaler(void **state)
{
    (void)state;
    ddp_loss_scale_t ls;
    ddp_position_t pos = {0};
    ddp_loss_scale_init(&ls, DDP_KPREC_BF16, 2, &pos);
    assert_int_equal(ls.enabled, 0);
    assert_true(pos.loss_scale == 1.0f);
    assert_int_equal(ddp_loss_scale_update(&ls, &pos, 0, 0), 0); /* bf16: nothing to do */
    ddp_loss_scale_init(&ls, DDP_KPREC_FP16, 2, &pos);           /* 1 is no fp16 scale: it starts */
    assert_true(pos.loss_scale == 65536.0f);
    int finite[] = {1, 1, 0, 1, 0, 1}, skips[] = {0, 0, 1, 0, 1, 0};
    float after[] = {65536.0f, 131072.0f, 65536.0f, 65536.0f, 32768.0f, 32768.0f};
    for (int i = 0; i < 6; i++) { /* overflow: skip, halve; then the clean count restarts */
        assert_int_equal(ddp_loss_scale_update(&ls, &pos, finite[i], 0), skips[i]);
        assert_true(pos.loss_scale == after[i]);
        if (!finite[i]) assert_int_equal(pos.loss_scale_clean, 0);
    }
    pos.loss_scale = 1024.0f; /* a resumed fp16 scale goes on; a bf16 run ignores it */
    ddp_loss_scale_init(&ls, DDP_KPREC_FP16, 2, &pos);
    assert_true(pos.loss_scale == 1024.0f);
    ddp_loss_scale_init(&ls, DDP_KPREC_BF16, 2, &pos);
    assert_true(pos.loss_scale == 1.0f);
    ddp_loss_scale_init(&ls, DDP_KPREC_FP16, 2, &pos);
    for (int i = 0; i < 2; i++) ddp_loss_scale_update(&ls, &pos, 0, 0);
    assert_int_equal(ls.overflows, 2);
}

/* train.precision auto on the CPU backend: bf16 where the CPU multiplies it natively
 * (AVX512_BF16 or AMX, with oneDNN in the build), else fp32 -- the emulation is not faster. */
static void test_auto_on_cpu(void **state)
{
    fixture_t *fx = *state;
    ddp_kprec_t p = DDP_KPREC_FP16;
    assert_int_equal(ddp_prec_select(&fx->k, DDP_PREC_AUTO, 0, &p), 0);
    const char *why = NULL;
    int native = fx->k.ops->prec_native(fx->k.ctx, DDP_KPREC_BF16, &why);
    assert_non_null(why);
    const char *force = getenv("DDP_CPU_BF16");
#if defined(__x86_64__) && defined(DDP_HAVE_DNNL)
    if (!(force && !strcmp(force, "emulate")))
        assert_int_equal(native, __builtin_cpu_supports("avx512bf16") ? 1 : 0);
#endif
    if (force && !strcmp(force, "emulate")) assert_int_equal(native, 0);
    assert_int_equal(p, native ? DDP_KPREC_BF16 : DDP_KPREC_FP32);
    assert_int_equal(fx->k.ops->prec_native(fx->k.ctx, DDP_KPREC_FP32, &why), 1);
    DDP_K(&fx->k, set_precision, DDP_KPREC_FP32);
}

/* Whether crc[i] is whole and equals the table CRC32C of tensor i's parameters and moments. */
static int crc_matches(const fixture_t *fx, const ddp_adamw_t *opt, const ddp_adamw_crc_t *crc,
                       int i)
{
    const ddp_param_desc_t *p = &fx->m.params[i];
    const float *arena[3] = {fx->m.w, opt->m, opt->v};
    if (crc[i].owned != p->numel) return 0;
    for (int a = 0; a < 3; a++)
        if (crc[i].crc[a] != ddp__crc32c_sw(0, arena[a] + p->offset, p->numel * sizeof(float))) {
            fprintf(stderr, "%s: arena %d: CRC %08x, bytes %08x\n", p->name, a, crc[i].crc[a],
                    ddp__crc32c_sw(0, arena[a] + p->offset, p->numel * sizeof(float)));
            return 0;
        }
    return 1;
}

/* The CRC32C an update computes of what it wrote: for the whole arena as one part, for three
 * parts in arena order (cuts inside tensors, as a sharded step makes), for the same parts in
 * reverse order (a tensor cut in two is marked broken instead of getting a wrong CRC), and split
 * over two "ranks" (two updates of disjoint parts) whose values ddp_adamw_crc_merge joins. */
static void test_adamw_crc(void **state)
{
    fixture_t *fx = *state;
    ddp_adamw_t opt;
    ddp_spec_t spec;
    adamw_setup(fx, &opt, &spec);
    size_t n = (size_t)fx->B * fx->T, np = fx->m.n_params;
    int nt = fx->m.n_tensors;
    int32_t *in = malloc(n * 4), *tg = malloc(n * 4);
    ddp_adamw_crc_t *crc = calloc((size_t)nt, sizeof *crc);
    batch(fx, 0, in, tg);
    float loss;
    assert_int_equal(ddp_model_forward(&fx->m, in, tg, fx->B, fx->T), 0);
    assert_int_equal(ddp_model_backward(&fx->m, NULL, NULL, &loss), 0);
    const ddp_arena_part_t whole = {0, np, 0};
    assert_int_equal(ddp_adamw_step(&opt, &fx->m, &spec,
                                    &(ddp_adamw_args_t){.lr = 1e-3,
                                                        .grad_scale = 1.0f,
                                                        .norm = 1.0,
                                                        .parts = &whole,
                                                        .n_parts = 1,
                                                        .crc = crc}),
                     0);
    for (int i = 0; i < nt; i++) assert_true(crc_matches(fx, &opt, crc, i));

    size_t cut1 = np / 3 + 7, cut2 = 2 * np / 3 + 11;
    const ddp_arena_part_t parts[3] = {{0, cut1, 0}, {cut1, cut2, 0}, {cut2, np, 0}};
    const ddp_arena_part_t reversed[3] = {parts[2], parts[1], parts[0]};
    for (int order = 0; order < 2; order++) {
        assert_int_equal(ddp_adamw_step(&opt, &fx->m, &spec,
                                        &(ddp_adamw_args_t){.lr = 1e-3,
                                                            .grad_scale = 1.0f,
                                                            .norm = 1.0,
                                                            .parts = order ? reversed : parts,
                                                            .n_parts = 3,
                                                            .crc = crc}),
                         0);
        int cut_tensors = 0;
        for (int i = 0; i < nt; i++) {
            const ddp_param_desc_t *p = &fx->m.params[i];
            int is_cut = (p->offset < cut1 && cut1 < p->offset + p->numel) ||
                         (p->offset < cut2 && cut2 < p->offset + p->numel);
            cut_tensors += is_cut;
            if (order && is_cut)
                assert_true(crc[i].owned == DDP_ADAMW_CRC_BROKEN);
            else
                assert_true(crc_matches(fx, &opt, crc, i));
        }
        assert_int_equal(cut_tensors, 2);
    }

    /* rank 0 updates the outer thirds, rank 1 the middle one; each alone has whole CRCs only for
     * the tensors inside its parts, merged they have every tensor's */
    ddp_adamw_crc_t *crc1 = calloc((size_t)nt, sizeof *crc1);
    const ddp_arena_part_t outer[2] = {parts[0], parts[2]};
    assert_int_equal(ddp_adamw_step(&opt, &fx->m, &spec,
                                    &(ddp_adamw_args_t){.lr = 1e-3,
                                                        .grad_scale = 1.0f,
                                                        .norm = 1.0,
                                                        .parts = outer,
                                                        .n_parts = 2,
                                                        .crc = crc}),
                     0);
    assert_int_equal(ddp_adamw_step(&opt, &fx->m, &spec,
                                    &(ddp_adamw_args_t){.lr = 1e-3,
                                                        .grad_scale = 1.0f,
                                                        .norm = 1.0,
                                                        .parts = &parts[1],
                                                        .n_parts = 1,
                                                        .crc = crc1}),
                     0);
    int whole_alone = 0;
    for (int i = 0; i < nt; i++) {
        whole_alone += crc_matches(fx, &opt, crc, i) + crc_matches(fx, &opt, crc1, i);
        ddp_adamw_crc_merge(&crc[i], &crc1[i], fx->m.params[i].numel);
        assert_true(crc_matches(fx, &opt, crc, i));
    }
    assert_int_equal(whole_alone, nt - 2);
    ddp_adamw_close(&opt, &fx->m);
    free(crc1);
    free(crc);
    free(in);
    free(tg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_is_backward_order),
        cmocka_unit_test(test_interrupted_pass_stops),
        cmocka_unit_test(test_forward_matches_pytorch),
        cmocka_unit_test(test_lm_head_chunks),
        cmocka_unit_test(test_micro_step_waits_once),
        cmocka_unit_test(test_backward_matches_pytorch),
        cmocka_unit_test(test_adamw_steps_match_pytorch),
        cmocka_unit_test(test_adamw_crc),
        cmocka_unit_test(test_mixed_precision_matches_autocast),
        cmocka_unit_test(test_loss_scaler),
        cmocka_unit_test(test_auto_on_cpu),
    };
    return cmocka_run_group_tests_name("gpt2", tests, setup, teardown);
}
