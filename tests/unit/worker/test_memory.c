/* Activation recomputation and the memory budget.
 *
 * Recompute: a model under train.recompute block gives the same loss, gradients (every float of
 * the arena) and embedding-output gradient as one under none, bit for bit, on the CPU backend
 * and on the simulated GPU (the CUDA backend's semantics), also for a batch smaller than the
 * one allocated; and its activation arena is smaller.
 * Budget: its figures are the allocations' (parameter count, the model's activation count),
 * its parts add up to its total, the largest micro-batch it names fits and the next does not,
 * a job over its limit gets advice naming each remedy, and the spec fields parse.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/rng.h"
#include "worker/model/model.h"
#include "worker/budget/memory_budget.h"

static const ddp_model_cfg_t CFG = {.n_layer = 3, .n_head = 4, .n_embd = 64, .vocab_size = 96,
                                    .block_size = 32};

/* One forward + backward of a fresh model (seeded weights) on backend `name` under `r`, on a
 * batch B x T of an arena allocated for AB x AT; the gradient arena, loss and dres to host. */
static void run_model(const char *name, ddp_kprec_t prec, ddp_recompute_t r, int AB, int AT,
                      int B, int T, float *grads, float *loss, float *dres, size_t *acts_bytes)
{
    ddp_kernels_t k;
    if (ddp_kernels_open(&k, name, 0, 2)) fail_msg("backend %s does not open", name);
    DDP_K(&k, set_precision, prec);
    ddp_model_t m;
    assert_int_equal(ddp_model_init_with(&m, &CFG, &k, AB, AT, NULL, NULL, r), 0);
    ddp_model_acts_t copy = m.acts; /* counting sets the pointers to NULL */
    *acts_bytes = ddp__model_carve_acts(&copy, &CFG, NULL);
    ddp_rng_t rng;
    ddp_rng_seed(&rng, 7);
    assert_int_equal(ddp_model_init_weights(&m, &rng), 0);
    int32_t in[4 * 32], tg[4 * 32];
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)(ddp_rng_next(&rng) % (uint64_t)CFG.vocab_size);
        tg[i] = (int32_t)(ddp_rng_next(&rng) % (uint64_t)CFG.vocab_size);
    }
    assert_int_equal(ddp_model_forward(&m, in, tg, B, T), 0);
    assert_int_equal(ddp_model_backward(&m, NULL, NULL, loss), 0);
    assert_int_equal(k.ops->memcpy_d2h(k.ctx, grads, m.g, m.n_params * sizeof(float)), 0);
    assert_int_equal(k.ops->memcpy_d2h(k.ctx, dres, m.acts.dres,
                                       (size_t)B * T * CFG.n_embd * sizeof(float)),
                     0);
    assert_int_equal(k.ops->sync(k.ctx), 0);
    ddp_model_close(&m);
    ddp_kernels_close(&k);
}

static void check_bitwise(const char *backend, ddp_kprec_t prec, int AB, int AT, int B, int T)
{
    size_t n = ddp_model_count_params(&CFG), nd = (size_t)B * T * CFG.n_embd;
    float *g0 = calloc(n, 4), *g1 = calloc(n, 4), *d0 = calloc(nd, 4), *d1 = calloc(nd, 4);
    float l0 = 0, l1 = 1;
    size_t a0, a1;
    run_model(backend, prec, DDP_RECOMPUTE_NONE, AB, AT, B, T, g0, &l0, d0, &a0);
    run_model(backend, prec, DDP_RECOMPUTE_BLOCK, AB, AT, B, T, g1, &l1, d1, &a1);
    if (memcmp(&l0, &l1, sizeof l0)) fail_msg("%s: loss none %.9g, block %.9g", backend, l0, l1);
    for (size_t i = 0; i < n; i++)
        if (memcmp(&g0[i], &g1[i], 4))
            fail_msg("%s: gradient float %zu: none %.9g, block %.9g", backend, i, g0[i], g1[i]);
    for (size_t i = 0; i < nd; i++)
        if (memcmp(&d0[i], &d1[i], 4))
            fail_msg("%s: dres %zu: none %.9g, block %.9g", backend, i, d0[i], d1[i]);
    if (!(a1 < a0)) fail_msg("%s: activations block %zu bytes, none %zu", backend, a1, a0);
    assert_int_equal(a0, ddp_model_acts_bytes(&CFG, AB, AT, DDP_RECOMPUTE_NONE, prec, 0));
    assert_int_equal(a1, ddp_model_acts_bytes(&CFG, AB, AT, DDP_RECOMPUTE_BLOCK, prec, 0));
    free(g0);
    free(g1);
    free(d0);
    free(d1);
}

static void test_recompute_bitwise_cpu(void **state)
{
    (void)state;
    check_bitwise("cpu", DDP_KPREC_FP32, 2, 32, 2, 32);
    check_bitwise("cpu", DDP_KPREC_FP32, 4, 32, 3, 17); /* smaller than allocated: slack */
    check_bitwise("cpu", DDP_KPREC_BF16, 4, 32, 3, 17); /* 16-bit activations */
    check_bitwise("cpu", DDP_KPREC_FP16, 2, 32, 2, 32);
}

static void test_recompute_bitwise_sim(void **state)
{
    (void)state;
    check_bitwise("sim", DDP_KPREC_FP32, 2, 32, 2, 32);
    check_bitwise("sim", DDP_KPREC_BF16, 2, 32, 2, 32);
}

static ddp_spec_t spec_for(const char *yaml)
{
    ddp_spec_t s;
    ddp_errinfo_t ei;
    ddp_errinfo_clear(&ei);
    if (ddp_spec_parse(&s, yaml, strlen(yaml), "<test>", &ei))
        fail_msg("spec rejected: %s (%s)", ei.msg, ei.path);
    return s;
}

/* The lines of a budget add up to its total. */
static void check_parts(const ddp_mem_budget_t *b)
{
    int64_t sum = b->params + b->grads + b->moments + b->accum_buf + b->emb + b->acts +
                  b->workspace + b->peers + b->checkpoint + b->runtime;
    if (sum != b->total)
        fail_msg("rank %d of %d: parts add to %lld, total %lld", b->rank, b->world,
                 (long long)sum, (long long)b->total);
}

static void test_budget_figures(void **state)
{
    (void)state;
    ddp_spec_t s = spec_for("model: {preset: gpt2-mini}\ndata: {train: x}\n"
                            "train: {micro_batch: 4, seq_len: 256, memory_limit: 1GiB}\n");
    ddp_mem_budget_t b;
    assert_int_equal(ddp_mem_budget_plan(&s, 1, 1, 0, 0, 0, 0, &b), 0);
    assert_int_equal(b.params, (int64_t)ddp_model_count_params(&s.model) * 4);
    assert_int_equal(b.moments, 2 * b.params);
    assert_int_equal(b.acts,
                     (int64_t)ddp_model_acts_bytes(&s.model, 4, 256, 0, DDP_KPREC_FP32, 0));
    assert_int_equal(b.acts, b.acts_none);
    assert_true(b.acts_block < b.acts_none / 2);
    assert_int_equal(b.limit, (int64_t)1 << 30);
    check_parts(&b);
    char text[2048];
    ddp_mem_budget_format(&b, text, sizeof text);
    assert_non_null(strstr(text, "activations"));
    assert_non_null(strstr(text, "largest micro_batch that fits"));

    /* a bf16 run's activations are 16-bit, the residual stream's fp32: between half and
     * three quarters of fp32's */
    ddp_spec_t s16 = spec_for("model: {preset: gpt2-mini}\ndata: {train: x}\n"
                              "train: {micro_batch: 4, seq_len: 256, precision: bf16}\n");
    ddp_mem_budget_t b16;
    assert_int_equal(ddp_mem_budget_plan(&s16, 1, 1, 0, 0, 0, 0, &b16), 0);
    assert_int_equal(b16.acts,
                     (int64_t)ddp_model_acts_bytes(&s.model, 4, 256, 0, DDP_KPREC_BF16, 0));
    assert_true(b16.acts > b.acts / 2 && b16.acts < b.acts * 3 / 4);
    check_parts(&b16);

    /* sharded over 2 local ranks: moments halved; half of the other rank's gradients,
     * parameters and embedding slots are mapped here (shm_direct.c) */
    ddp_mem_budget_t b2;
    assert_int_equal(ddp_mem_budget_plan(&s, 2, 2, 0, 0, 0, 0, &b2), 0);
    assert_int_equal(b2.moments, b.params);
    assert_int_equal(b2.peers, (b2.grads + b2.params + b2.emb) / 2);
    check_parts(&b2);
    /* on two hosts nothing of the other rank is mapped */
    assert_int_equal(ddp_mem_budget_plan(&s, 2, 1, 0, 0, 0, 0, &b2), 0);
    assert_int_equal(b2.peers, 0);
    check_parts(&b2);

    /* checkpoints: a rank that writes shards holds the snapshot (3 arenas), the others only the
     * moments gathered for a save; on one host the writer also maps the slices of its own
     * moments that the other ranks gathered into them */
    ddp_spec_t sc = spec_for("model: {preset: gpt2-mini}\ndata: {train: x}\n"
                             "train: {micro_batch: 4, seq_len: 256, memory_limit: 1GiB}\n"
                             "checkpoint: {dir: /nonexistent}\n");
    ddp_mem_budget_t w, nw, one;
    assert_int_equal(ddp_mem_budget_plan(&sc, 2, 2, 0, 0, 0, 0, &w), 0);
    assert_int_equal(ddp_mem_budget_plan(&sc, 2, 2, 1, 0, 0, 0, &nw), 0);
    assert_true(w.writer && !nw.writer);
    assert_int_equal(nw.checkpoint, w.params); /* 2P - 2P/2 */
    if (w.checkpoint < 3 * w.params + 2 * nw.checkpoint)
        fail_msg("writer's checkpoint %lld < 3 arenas + 2 x %lld", (long long)w.checkpoint,
                 (long long)nw.checkpoint);
    assert_int_equal(w.total - nw.total, w.checkpoint - nw.checkpoint);
    check_parts(&w);
    check_parts(&nw);
    /* one rank: the snapshot only; writers: 2 makes both ranks writers */
    assert_int_equal(ddp_mem_budget_plan(&sc, 1, 1, 0, 0, 0, 0, &one), 0);
    assert_true(one.writer && one.checkpoint >= 3 * one.params);
    sc.writers = 2;
    assert_int_equal(ddp_mem_budget_plan(&sc, 2, 2, 1, 0, 0, 0, &nw), 0);
    assert_true(nw.writer);
    assert_int_equal(nw.checkpoint, w.checkpoint);

    /* a GPU (nccl): sharded, the moments / world, and with checkpoints the other ranks' slices
     * too (committed whole from the start, optim/zero1.c); no snapshot (host memory) */
    ddp_mem_budget_t g, gc;
    assert_int_equal(ddp_mem_budget_plan(&s, 2, 2, 0, DDP_MEM_GPU, (int64_t)8 << 30, 0, &g), 0);
    assert_int_equal(g.moments, g.params);
    assert_int_equal(g.checkpoint, 0);
    assert_int_equal(ddp_mem_budget_plan(&sc, 2, 2, 0, DDP_MEM_GPU, (int64_t)8 << 30, 0, &gc), 0);
    assert_int_equal(gc.moments, gc.params);
    assert_int_equal(gc.checkpoint, gc.params); /* 2P - 2P/2, the writer's snapshot aside */
    check_parts(&g);
    check_parts(&gc);

    /* the largest micro-batch named fits, and the next one up that divides the batch does not */
    s = spec_for("model: {preset: gpt2-mini}\ndata: {train: x}\n"
                 "train: {micro_batch: 4, seq_len: 256, global_batch_tokens: 16384, "
                 "memory_limit: 400MiB}\n");
    assert_int_equal(ddp_mem_budget_plan(&s, 1, 1, 0, 0, 0, 0, &b), 0);
    assert_true(b.max_B >= 1 && b.max_B < 64);
    assert_true(b.max_B_block >= b.max_B);
    ddp_spec_t s2 = s;
    s2.micro_batch = b.max_B;
    assert_int_equal(ddp_mem_budget_plan(&s2, 1, 1, 0, 0, 0, 0, &b2), 0);
    if (b2.total > b2.limit) fail_msg("micro_batch %d: %lld > limit", b.max_B, (long long)b2.total);
    int next = b.max_B * 2; /* 64 sequences a step: the next divisor */
    s2.micro_batch = next;
    assert_int_equal(ddp_mem_budget_plan(&s2, 1, 1, 0, 0, 0, 0, &b2), 0);
    if (b2.total <= b2.limit) fail_msg("micro_batch %d fits but was not named", next);
}

static void test_budget_advice(void **state)
{
    (void)state;
    ddp_spec_t s = spec_for("model: {preset: gpt2-mini}\ndata: {train: x}\n"
                            "train: {micro_batch: 8, seq_len: 256, memory_limit: 300MB}\n");
    ddp_mem_budget_t b;
    char advice[1024];
    assert_int_equal(ddp_mem_budget_plan(&s, 1, 1, 0, 0, 0, 0, &b), 0);
    assert_int_equal(b.limit, 300000000);
    assert_int_equal(ddp_mem_budget_fits(&b, &s, advice, sizeof advice), 0);
    const char *want[] = {"over", "train.micro_batch 1", "train.recompute: block saves",
                          "train.precision", "ddp.shard_optimizer"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!strstr(advice, want[i])) fail_msg("advice lacks \"%s\": %s", want[i], advice);
    s.memory_limit = (int64_t)8 << 30;
    assert_int_equal(ddp_mem_budget_plan(&s, 1, 1, 0, 0, 0, 0, &b), 0);
    assert_int_equal(ddp_mem_budget_fits(&b, &s, advice, sizeof advice), 1);
}

static void test_spec_fields(void **state)
{
    (void)state;
    ddp_spec_t s =
        spec_for("data: {train: x}\ntrain: {recompute: block, memory_limit: \"8GiB\"}\n");
    assert_int_equal(s.recompute, DDP_RECOMPUTE_BLOCK);
    assert_int_equal(s.memory_limit, (int64_t)8 << 30);
    s = spec_for("data: {train: x}\ntrain: {memory_limit: 123456}\n");
    assert_int_equal(s.memory_limit, 123456);
    assert_int_equal(s.recompute, DDP_RECOMPUTE_NONE);
    s = spec_for("data: {train: x}\ntrain: {memory_limit: 1.5 GB}\n");
    assert_int_equal(s.memory_limit, 1500000000);
    /* round trip through JSON */
    char *json = ddp_spec_to_json(&s);
    ddp_spec_t back = spec_for(json);
    free(json);
    assert_int_equal(back.memory_limit, s.memory_limit);
    const char *bad[] = {"data: {train: x}\ntrain: {recompute: layer}\n",
                         "data: {train: x}\ntrain: {memory_limit: 8 parsecs}\n",
                         "data: {train: x}\ntrain: {memory_limit: -1}\n"};
    const char *msg[] = {"must be one of none, block", "must be a size in bytes",
                         "must be a size in bytes"};
    for (int i = 0; i < 3; i++) {
        ddp_errinfo_t ei;
        ddp_errinfo_clear(&ei);
        ddp_spec_t x;
        assert_int_equal(ddp_spec_parse(&x, bad[i], strlen(bad[i]), "<test>", &ei), DDP_ESPEC);
        if (!strstr(ei.msg, msg[i]))
            fail_msg("spec %d: got \"%s\", want \"%s\"", i, ei.msg, msg[i]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recompute_bitwise_cpu),
        cmocka_unit_test(test_recompute_bitwise_sim),
        cmocka_unit_test(test_budget_figures),
        cmocka_unit_test(test_budget_advice),
        cmocka_unit_test(test_spec_fields),
    };
    return cmocka_run_group_tests_name("memory", tests, NULL, NULL);
}
