/* Trainer <-> checkpoint glue, in process on the CPU backend (one cmocka group):
 * save then resume gives bitwise identical parameters, moments, RNG, step, tokens and data
 * cursor; model.init_from takes weights only; config.json is Hugging Face's GPT-2 config; a
 * named step that does not exist is an error; --no-resume ignores checkpoints. */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/hf_config.h"
#include "worker/saving/saving.h"
#include "worker/trainer.h"
#include "wc_testutil.h"



static void init_trainer(ddp_trainer_t *t, const ddp_spec_t *spec, ddp_train_opts_t *o)
{
    ddp_errinfo_t ei;
    ddp_errinfo_clear(&ei);
    o->backend = "cpu";
    o->quiet = 1;
    int rc = ddp_trainer_init(t, spec, o, &ei);
    if (rc) fprintf(stderr, "# trainer: %s\n", ei.msg);
    assert_int_equal(rc, 0);
}

static json_t *read_json(const char *path)
{
    json_error_t e;
    json_t *o = json_load_file(path, 0, &e);
    if (!o) fprintf(stderr, "# %s: %s\n", path, e.text);
    assert_non_null(o);
    return o;
}

static void test_round_trip(void **state)
{
    (void)state;
    ddp_spec_t spec;
    assert_int_equal(wc_spec(&spec, dir, "gpt2-tiny", 2, 16, 3, 1), 0);
    ddp_trainer_t a, b;
    ddp_train_opts_t oa = {0}, ob = {0};
    ddp_errinfo_t ei;
    ddp_errinfo_clear(&ei);
    oa.no_resume = 1;
    init_trainer(&a, &spec, &oa);
    for (int i = 0; i < 7; i++) ddp_rng_next(&a.pos.rng); /* an RNG state the seed does not give */
    assert_int_equal(ddp_trainer_run(&a, NULL, &ei), 0);
    assert_int_equal(a.pos.step, 3);
    init_trainer(&b, &spec, &ob);
    size_t bytes = a.model.n_params * sizeof(float);
    assert_int_equal(b.pos.step, 3);
    assert_int_equal(b.pos.tokens, a.pos.tokens);
    assert_int_equal(b.opt.t, a.opt.t);
    assert_memory_equal(b.pos.rng.s, a.pos.rng.s, sizeof a.pos.rng.s);
    assert_memory_equal(b.model.w, a.model.w, bytes);
    assert_memory_equal(b.opt.m, a.opt.m, bytes);
    assert_memory_equal(b.opt.v, a.opt.v, bytes);
    /* the data cursor: next global sample = step x sequences per global batch */
    char path[1200];
    snprintf(path, sizeof path, "%s/ck/step-00000003/trainer.json", dir);
    json_t *tj = read_json(path);
    json_t *data = json_object_get(tj, "data");
    assert_int_equal(json_integer_value(json_object_get(data, "cursor")), 3 * 2);
    assert_int_equal(json_integer_value(json_object_get(tj, "step")), 3);
    json_decref(tj);
    /* both continue identically */
    float la = 0, lb = 0;
    assert_int_equal(ddp_trainer_step(&a, &la, &ei), 0);
    assert_int_equal(ddp_trainer_step(&b, &lb, &ei), 0);
    assert_memory_equal(&la, &lb, sizeof la);
    assert_memory_equal(b.model.w, a.model.w, bytes);
    ddp_trainer_close(&a);
    ddp_trainer_close(&b);
}

static void test_init_from_and_no_resume(void **state)
{
    (void)state;
    ddp_spec_t spec;
    assert_int_equal(wc_spec(&spec, dir, "gpt2-tiny", 2, 16, 3, 1), 0);
    ddp_trainer_t a, c, d;
    ddp_train_opts_t oa = {0}, oc = {0}, od = {.no_resume = 1};
    init_trainer(&a, &spec, &oa); /* resumes step 3 (saved by the round trip) */
    assert_int_equal(a.pos.step, 3);
    ddp_spec_t s2;
    assert_int_equal(wc_spec(&s2, dir, "gpt2-tiny", 2, 16, 3, 0), 0);
    snprintf(s2.init_from, sizeof s2.init_from, "%s/ck/step-00000003", dir);
    init_trainer(&c, &s2, &oc);
    assert_int_equal(c.pos.step, 0);
    assert_int_equal(c.opt.t, 0);
    assert_memory_equal(c.model.w, a.model.w, a.model.n_params * sizeof(float));
    init_trainer(&d, &spec, &od);
    assert_int_equal(d.pos.step, 0);
    assert_memory_not_equal(d.model.w, a.model.w, a.model.n_params * sizeof(float));
    ddp_trainer_close(&a);
    ddp_trainer_close(&c);
    ddp_trainer_close(&d);
}

static void test_named_step(void **state)
{
    (void)state;
    ddp_spec_t spec;
    assert_int_equal(wc_spec(&spec, dir, "gpt2-tiny", 2, 16, 3, 1), 0);
    ddp_trainer_t t;
    ddp_train_opts_t o = {.backend = "cpu", .quiet = 1, .resume_step = 2};
    ddp_errinfo_t ei;
    ddp_errinfo_clear(&ei);
    int rc = ddp_trainer_init(&t, &spec, &o, &ei);
    fprintf(stderr, "# --resume-step 2: %s\n", ei.msg);
    assert_int_not_equal(rc, 0);
    o.resume_step = 3;
    init_trainer(&t, &spec, &o);
    assert_int_equal(t.pos.step, 3);
    ddp_trainer_close(&t);
}

static void test_config_json(void **state)
{
    (void)state;
    ddp_model_cfg_t cfg = {.n_layer = 12, .n_head = 12, .n_embd = 768, .vocab_size = 50257,
                           .block_size = 1024};
    char *text = ddp_hf_config_json(&cfg);
    assert_non_null(text);
    json_t *o = json_loads(text, 0, NULL);
    assert_non_null(o);
    assert_string_equal(json_string_value(json_object_get(o, "model_type")), "gpt2");
    assert_string_equal(json_string_value(json_array_get(json_object_get(o, "architectures"), 0)),
                        "GPT2LMHeadModel");
    assert_string_equal(json_string_value(json_object_get(o, "activation_function")), "gelu_new");
    assert_int_equal(json_integer_value(json_object_get(o, "n_positions")), 1024);
    assert_int_equal(json_integer_value(json_object_get(o, "n_ctx")), 1024);
    assert_int_equal(json_integer_value(json_object_get(o, "eos_token_id")), 50256);
    assert_true(json_is_true(json_object_get(o, "tie_word_embeddings")));
    assert_true(json_real_value(json_object_get(o, "layer_norm_epsilon")) == 1e-5);
    json_decref(o);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_init_from_and_no_resume),
        cmocka_unit_test(test_named_step),
        cmocka_unit_test(test_config_json),
    };
    return cmocka_run_group_tests_name("worker_ckpt", tests, wc_setup, wc_teardown);
}
