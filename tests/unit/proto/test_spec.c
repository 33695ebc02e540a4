/* Unit tests of the job spec: presets, defaults, YAML/JSON equivalence, the JSON round trip,
 * every kind of rejection (with its field path, line, column and message), and the example jobs
 * in deploy/examples, and the reference (ddp_spec_reference) naming every field; and the YAML
 * reader under it (proto/spec_tree.h): the tree it builds, its limits, and the time it takes to
 * refuse a hostile document. Fixture files are found through DDP_SOURCE_ROOT. */
#include <errno.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/alloc.h"
#include "proto/spec.h"
#include "proto/spec_tree.h"

static const char *src_path(const char *rel)
{
    static char buf[4096];
    const char *root = getenv("DDP_SOURCE_ROOT");
    snprintf(buf, sizeof buf, "%s/%s", root ? root : ".", rel);
    return buf;
}

static int parse(ddp_spec_t *s, const char *text, ddp_errinfo_t *ei)
{
    return ddp_spec_parse(s, text, strlen(text), "<test>", ei);
}

static void assert_spec_eq(const ddp_spec_t *a, const ddp_spec_t *b)
{
    if (memcmp(a, b, sizeof *a) != 0) {
        char *ja = ddp_spec_to_json(a), *jb = ddp_spec_to_json(b);
        print_error("specs differ:\n%s\n---\n%s\n", ja, jb);
        free(ja);
        free(jb);
        fail();
    }
}

static long long n_params(const ddp_model_cfg_t *m)
{
    long long C = m->n_embd;
    return (long long)m->vocab_size * C + (long long)m->block_size * C +
           (long long)m->n_layer * (12 * C * C + 13 * C) + 2 * C;
}

static void test_presets(void **state)
{
    static const struct {
        const char *name;
        int L, H, C, V, T;
        double lo, hi; /* parameters, millions */
    } want[] = {
        {"gpt2-tiny", 2, 4, 128, 256, 128, 0.2, 0.5},
        {"gpt2-mini", 6, 6, 384, 256, 256, 9.5, 11.5},
        {"gpt2-124M", 12, 12, 768, 50257, 1024, 123, 126},
        {"gpt2-355M", 24, 16, 1024, 50257, 1024, 350, 360},
        {"gpt2-774M", 36, 20, 1280, 50257, 1024, 770, 778},
        {"gpt2-1558M", 48, 25, 1600, 50257, 1024, 1550, 1565},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        ddp_model_cfg_t m;
        assert_int_equal(ddp_spec_preset(want[i].name, &m), 0);
        assert_int_equal(m.n_layer, want[i].L);
        assert_int_equal(m.n_head, want[i].H);
        assert_int_equal(m.n_embd, want[i].C);
        assert_int_equal(m.vocab_size, want[i].V);
        assert_int_equal(m.block_size, want[i].T);
        assert_int_equal(m.n_embd % m.n_head, 0);
        double p = (double)n_params(&m) / 1e6;
        if (p < want[i].lo || p > want[i].hi)
            fail_msg("%s: %.2fM parameters, want %.1f..%.1f", want[i].name, p, want[i].lo,
                     want[i].hi);

        /* the same preset through a spec, and back through JSON */
        char text[256];
        snprintf(text, sizeof text, "model: {preset: %s}\ndata: {train: x}\n", want[i].name);
        ddp_spec_t s, r;
        ddp_errinfo_t ei;
        assert_int_equal(parse(&s, text, &ei), 0);
        assert_string_equal(s.preset, want[i].name);
        assert_memory_equal(&s.model, &m, sizeof m);
        assert_int_equal(s.seq_len, m.block_size);
        char *json = ddp_spec_to_json(&s);
        assert_non_null(json);
        assert_int_equal(parse(&r, json, &ei), 0);
        free(json);
        assert_spec_eq(&s, &r);
    }
    ddp_model_cfg_t m;
    assert_int_equal(ddp_spec_preset("gpt2-huge", &m), DDP_ENOTFOUND);
    assert_int_equal(ddp_spec_preset(NULL, &m), DDP_ENOTFOUND);
}

static void test_defaults(void **state)
{
    ddp_spec_t s, d;
    ddp_errinfo_t ei;
    assert_int_equal(ddp_spec_load(&s, src_path("tests/fixtures/specs/good_minimal.yaml"), &ei),
                     0);
    assert_string_equal(s.name, "job");
    assert_string_equal(s.preset, "gpt2-tiny");
    assert_int_equal(s.model.n_layer, 2);
    assert_int_equal(s.n_train, 1);
    assert_int_equal(s.train_listed, 0);
    assert_string_equal(s.train[0].glob, "data/train_*.bin");
    assert_true(s.train[0].weight == 1);
    assert_int_equal(s.n_val, 0);
    assert_string_equal(s.tokenizer, ""); /* data.tokenizer: none */
    assert_string_equal(s.init_from, "");
    assert_int_equal(s.steps, 1000);
    assert_int_equal(s.micro_batch, 8);
    assert_int_equal(s.seq_len, 128); /* = block_size */
    assert_int_equal(s.global_batch_tokens, 0);
    assert_true(s.lr == 6e-4);
    assert_true(s.min_lr == 6e-4 / 10);
    assert_int_equal(s.warmup, 0);
    assert_int_equal(s.schedule, DDP_SCHED_COSINE);
    assert_true(s.weight_decay == 0.1);
    assert_true(s.beta1 == 0.9);
    assert_true(s.beta2 == 0.95);
    assert_true(s.eps == 1e-8);
    assert_true(s.clip == 1.0);
    assert_int_equal(s.precision, DDP_PREC_AUTO);
    assert_int_equal(s.loss_scale_interval, 2000);
    assert_int_equal(s.seed, 1337);
    assert_int_equal(s.threads, 0);
    assert_int_equal(s.val_every, 100);
    assert_int_equal(s.val_batches, 8);
    assert_int_equal(s.sample_tokens, 200);
    assert_int_equal(s.log_every, 1);
    assert_int_equal(s.profile, 0);
    assert_true(s.bucket_mb == 25);
    assert_true(s.first_bucket_mb == 1);
    assert_int_equal(s.workers, 1);
    assert_int_equal(s.min_workers, 1);
    assert_int_equal(s.max_workers, 1);
    assert_string_equal(s.backend, "auto");
    assert_int_equal(s.overlap, 1);
    assert_int_equal(s.shard_optimizer, 1);
    assert_int_equal(s.check_every, 100);
    assert_string_equal(s.ckpt_dir, "");
    assert_int_equal(s.ckpt_every, 0);
    assert_int_equal(s.keep_last, 3);
    assert_int_equal(s.writers, 1);
    assert_true(s.shard_mb == 5000);

    /* ddp_spec_defaults is the same but with no data */
    ddp_spec_defaults(&d);
    snprintf(d.train[0].glob, sizeof d.train[0].glob, "data/train_*.bin");
    d.train[0].weight = 1;
    d.n_train = 1;
    assert_spec_eq(&s, &d);

    /* dependent defaults: min_lr follows lr, min/max_workers follow workers */
    assert_int_equal(parse(&s, "data: {train: x}\ntrain: {lr: 1e-3}\nddp: {workers: 3}", &ei), 0);
    assert_true(s.min_lr == 1e-3 / 10);
    assert_int_equal(s.min_workers, 3);
    assert_int_equal(s.max_workers, 3);
    /* empty sections are allowed; YAML booleans; integers written with an exponent */
    assert_int_equal(parse(&s, "data: {train: x}\ntrain:\nddp: {overlap: off, shard_optimizer: no}\n"
                               "checkpoint: {shard_mb: 1e3}\n",
                           &ei), 0);
    assert_int_equal(s.overlap, 0);
    assert_int_equal(s.shard_optimizer, 0);
    assert_true(s.shard_mb == 1000);
    assert_int_equal(parse(&s, "data: {train: x}\ntrain: {steps: 1e3, global_batch_tokens: 0}",
                           &ei), 0);
    assert_int_equal(s.steps, 1000);
}

static void test_yaml_json_equal(void **state)
{
    ddp_spec_t y, j;
    ddp_errinfo_t ei;
    assert_int_equal(ddp_spec_load(&y, src_path("tests/fixtures/specs/good_full.yaml"), &ei), 0);
    assert_int_equal(ddp_spec_load(&j, src_path("tests/fixtures/specs/good_full.json"), &ei), 0);
    assert_spec_eq(&y, &j);
    assert_string_equal(y.name, "full-spec");
    assert_string_equal(y.preset, "");
    assert_int_equal(y.model.n_layer, 4);
    assert_int_equal(y.model.block_size, 256);
    assert_int_equal(y.n_val, 1);
    assert_string_equal(y.val[0].glob, "data/full/val_*.bin");
    assert_string_equal(y.tokenizer, "data/full/tokenizer.json");
    assert_int_equal(y.global_batch_tokens, 4096);
    assert_true(y.lr == 3e-4);
    assert_true(y.min_lr == 3e-5);
    assert_int_equal(y.schedule, DDP_SCHED_CONSTANT);
    assert_true(y.beta1 == 0.8);
    assert_true(y.beta2 == 0.99);
    assert_int_equal(y.precision, DDP_PREC_FP32);
    assert_int_equal(y.seed, 42);
    assert_int_equal(y.profile, 3);
    assert_true(y.first_bucket_mb == 0.5);
    assert_int_equal(y.min_workers, 2);
    assert_int_equal(y.max_workers, 6);
    assert_string_equal(y.backend, "ring");
    assert_int_equal(y.overlap, 0);
    assert_int_equal(y.check_every, 0);
    assert_string_equal(y.ckpt_dir, "runs/full/checkpoints");
    assert_int_equal(y.writers, 2);
    assert_true(y.shard_mb == 100);
}

static void test_round_trip(void **state)
{
    static const char *const files[] = {
        "tests/fixtures/specs/good_full.yaml",  "tests/fixtures/specs/good_minimal.yaml",
        "deploy/examples/shakespeare-tiny.yaml", "deploy/examples/shakespeare-mini.yaml",
        "deploy/examples/gpt2-124M.yaml", "deploy/examples/llama-tiny.yaml",
        "deploy/examples/shakespeare-recipe.yaml",
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        ddp_spec_t s, r;
        ddp_errinfo_t ei;
        int rc = ddp_spec_load(&s, src_path(files[i]), &ei);
        if (rc) fail_msg("%s: %s: %s", files[i], ei.path, ei.msg);
        char *json = ddp_spec_to_json(&s);
        assert_non_null(json);
        assert_int_equal(json[0], '{');
        rc = parse(&r, json, &ei);
        if (rc) fail_msg("%s round trip: %s: %s\n%s", files[i], ei.path, ei.msg, json);
        free(json);
        assert_spec_eq(&s, &r);
    }
    /* a seed beyond 32 bits and a spec with init_from survive too */
    ddp_spec_t s, r;
    ddp_errinfo_t ei;
    assert_int_equal(parse(&s, "model: {preset: gpt2-124M, init_from: hf/gpt2}\n"
                               "data: {train: x}\ntrain: {seed: 123456789012345}", &ei), 0);
    char *json = ddp_spec_to_json(&s);
    assert_int_equal(parse(&r, json, &ei), 0);
    free(json);
    assert_spec_eq(&s, &r);
    assert_int_equal(r.seed, 123456789012345ULL);
    assert_string_equal(r.init_from, "hf/gpt2");
    /* init_from alone: the model waits for its config.json (zeros, seq_len 0), and says so
     * again after the round trip (ddp_spec_resolve_model fills it in the worker) */
    assert_int_equal(parse(&s, "model: {init_from: hf/gpt2}\ndata: {train: x}", &ei), 0);
    assert_int_equal(s.model.n_layer, 0);
    assert_int_equal(s.seq_len, 0);
    assert_string_equal(s.preset, "");
    json = ddp_spec_to_json(&s);
    assert_int_equal(parse(&r, json, &ei), 0);
    free(json);
    assert_spec_eq(&s, &r);
}

static void test_examples(void **state)
{
    ddp_spec_t s;
    ddp_errinfo_t ei;
    assert_int_equal(ddp_spec_load(&s, src_path("deploy/examples/shakespeare-tiny.yaml"), &ei),
                     0);
    assert_string_equal(s.preset, "gpt2-tiny");
    assert_string_equal(s.train[0].glob, "data/shakespeare/train_*.bin");
    assert_int_equal(ddp_spec_load(&s, src_path("deploy/examples/shakespeare-mini.yaml"), &ei),
                     0);
    assert_string_equal(s.preset, "gpt2-mini");
    assert_int_equal(ddp_spec_load(&s, src_path("deploy/examples/gpt2-124M.yaml"), &ei), 0);
    assert_string_equal(s.preset, "gpt2-124M");
    assert_int_equal(s.global_batch_tokens, 524288);
    assert_true(s.min_lr == 0);
}

/* A rejected spec: code, field path, line, column and a piece of the message. */
typedef struct bad {
    const char *what; /* inline text, or a fixture file name when it ends in .yaml/.json */
    const char *path; /* NULL: the origin (a document-level error) */
    int line, column; /* -1: any value > 0 */
    const char *msg;
} bad_t;

static bool check_bad(const bad_t *b)
{
    ddp_spec_t s;
    ddp_errinfo_t ei;
    const char *origin = "<test>";
    size_t n = strlen(b->what);
    int rc;
    char rel[256], file[4096];
    if (n > 5 && (!strcmp(b->what + n - 5, ".yaml") || !strcmp(b->what + n - 5, ".json"))) {
        snprintf(rel, sizeof rel, "tests/fixtures/specs/%.200s", b->what);
        memcpy(file, src_path(rel), sizeof file);
        origin = file;
        rc = ddp_spec_load(&s, file, &ei);
    } else {
        rc = parse(&s, b->what, &ei);
    }
    if (rc != DDP_ESPEC) {
        print_error("accepted (rc %d): %s\n", rc, b->what);
        return false;
    }
    const char *want_path = b->path ? b->path : origin;
    if (strcmp(ei.path, want_path) || !strstr(ei.msg, b->msg) ||
        (b->line >= 0 && (ei.line != b->line || ei.column != b->column)) ||
        (b->line < 0 && (ei.line <= 0 || ei.column <= 0))) {
        print_error("for %s\n  got  %s:%d:%d: %s\n  want %s:%d:%d: ...%s...\n", b->what,
                    ei.path, ei.line, ei.column, ei.msg, want_path, b->line, b->column, b->msg);
        return false;
    }
    char buf[1024];
    ddp_spec_errstr(&ei, origin, buf, sizeof buf);
    assert_non_null(strstr(buf, ei.msg));
    assert_non_null(strstr(buf, origin));
    return true;
}

static void test_reject_fixtures(void **state)
{
    static const bad_t bad[] = {
        {"bad_unknown_top.yaml", "traning", 4, 1, "unknown key; allowed here: name, model"},
        {"bad_unknown_nested.yaml", "train.learning_rate", 5, 3, "allowed here: steps,"},
        {"bad_unknown_nested.json", "ddp.bucket", 3, 25, "unknown key; allowed here: bucket_mb"},
        {"bad_wrong_type.yaml", "train.steps", 4, 10, "must be an integer >= 1, got ten"},
        {"bad_wrong_type.json", "train.steps", 3, 22,
         "must be an integer >= 1, got \"10\""},
        {"bad_range.yaml", "train.micro_batch", 4, 16, "must be an integer >= 1, got -2"},
        {"bad_seq_len.yaml", "train.seq_len", 3, 18, "must be <= model.block_size (128), got 512"},
        {"bad_syntax.yaml", NULL, -1, -1, "invalid YAML"},
        {"bad_syntax.json", NULL, 3, 25, "invalid JSON"},
    };
    size_t failed = 0;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) failed += !check_bad(&bad[i]);
    assert_int_equal(failed, 0);
}

static void test_reject_inline(void **state)
{
#define D "data: {train: x}\n"
    static const bad_t bad[] = {
        /* types */
        {D "train: 5", "train", 2, 8, "must be a mapping of keys, got 5"},
        {D "train: {lr: fast}", "train.lr", 2, 13, "must be a number > 0 and <= 10, got fast"},
        {D "train: {steps: 12abc}", "train.steps", 2, 16, "got 12abc"},
        {D "train: {steps: 1.5}", "train.steps", 2, 16, "must be an integer >= 1, got 1.5"},
        {D "train: {steps: \"100\"}", "train.steps", 2, 16, "got \"100\""},
        {D "train: {steps: [1]}", "train.steps", 2, 16, "got a sequence"},
        {D "train: {lr: 0x10}", "train.lr", 2, 13, "got 0x10"},
        {D "train: {lr: .nan}", "train.lr", 2, 13, "got .nan"},
        {D "ddp: {overlap: maybe}", "ddp.overlap", 2, 16, "must be true or false, got maybe"},
        {D "train: {schedule: linear}", "train.schedule", 2, 19,
         "must be one of cosine, constant, wsd; got linear"},
        {D "train: {precision: fp8}", "train.precision", 2, 20, "fp32, bf16, fp16, auto"},
        {D "train: {loss_scale_interval: 0}", "train.loss_scale_interval", 2, 30, ">= 1"},
        {D "ddp: {backend: gloo}", "ddp.backend", 2, 16, "auto, ring, nccl, mpi"},
        {D "ddp: {state_transfer: lazy}", "ddp.state_transfer", 2, 23,
         "must be one of auto, overlap, pause; got lazy"},
        {D "model: {preset: gpt3}", "model.preset", 2, 17, "gpt2-tiny, gpt2-mini, gpt2-124M"},
        {D "name: [a]", "name", 2, 7, "must be a string"},
        {"data: {train: x, tokenizer: [a]}", "data.tokenizer", 1, 29, "must be a string"},
        {D "data: {val: y}", NULL, 2, 1, "duplicate key 'data'"},
        {"{\"data\": {\"train\": \"x\"}, \"data\": {}}", NULL, 1, 31, "duplicate object key"},
        /* ranges */
        {D "train: {lr: 0}", "train.lr", 2, 13, "must be a number > 0 and <= 10, got 0"},
        {D "train: {lr: -1e-3}", "train.lr", 2, 13, "got -1e-3"},
        {D "train: {beta2: 1}", "train.beta2", 2, 16, "must be a number >= 0 and < 1, got 1"},
        {D "train: {betas: [0.9]}", "train.betas", 2, 16, "sequence of two numbers"},
        {D "train: {betas: [0.9, -0.1]}", "train.betas", 2, 22, "entry 1 must be a number"},
        {D "train: {eps: 0}", "train.eps", 2, 14, "must be a number > 0 and <= 1, got 0"},
        {D "train: {micro_batch: 99999999999}", "train.micro_batch", 2, 22,
         "must be an integer <= 1048576"},
        {D "train: {seed: -1}", "train.seed", 2, 15, "must be an integer >= 0, got -1"},
        {D "train: {profile: -1}", "train.profile", 2, 18, "must be an integer >= 0, got -1"},
        {D "train: {profile: 2.5}", "train.profile", 2, 18, "got 2.5"},
        {D "model: {vocab_size: 2000000, n_layer: 1, n_head: 1, n_embd: 8, block_size: 8}",
         "model.vocab_size", 2, 21, "must be an integer <= 1048576, got 2000000"},
        {D "checkpoint: {shard_mb: 0}", "checkpoint.shard_mb", 2, 24, "> 0"},
        {D "name: my job", "name", 2, 7, "letters, digits"},
        {D "name:", "name", 2, 6, "must not be empty"},
        /* rules between fields */
        {D "train: {seq_len: 129}", "train.seq_len", 2, 18, "<= model.block_size (128)"},
        {D "train: {micro_batch: 2, seq_len: 64, global_batch_tokens: 1000}",
         "train.global_batch_tokens", 2, 59, "multiple of train.micro_batch * train.seq_len = 128"},
        {D "train: {lr: 1e-3, min_lr: 2e-3}", "train.min_lr", 2, 27, "<= train.lr"},
        {D "train: {steps: 10, warmup: 10}", "train.warmup", 2, 28, "< train.steps (10)"},
        {D "train: {betas: [0.9, 0.9], beta1: 0.8}", "train.betas", 2, 16, "not both"},
        {D "ddp: {workers: 2, min_workers: 3}", "ddp.min_workers", 2, 32, "<= ddp.workers (2)"},
        {D "ddp: {workers: 4, max_workers: 3}", "ddp.max_workers", 2, 32, ">= ddp.workers (4)"},
        {D "ddp: {bucket_mb: 2, first_bucket_mb: 4}", "ddp.first_bucket_mb", 2, 38,
         "<= ddp.bucket_mb"},
        {D "checkpoint: {every: 10}", "checkpoint.every", 2, 21, "needs checkpoint.dir"},
        {D "checkpoint: {dir: c, writers: 2}", "checkpoint.writers", 2, 31, "<= ddp.max_workers"},
        {D "model: {preset: gpt2-tiny, n_layer: 3}", "model.n_layer", 2, 37,
         "cannot be combined with model.preset"},
        {D "model: {n_layer: 2, n_head: 4, n_embd: 64, vocab_size: 256}", "model.block_size", 2,
         1, "is required when the model is given by dimensions"},
        {D "model: {n_layer: 2, n_head: 3, n_embd: 64, vocab_size: 256, block_size: 64}",
         "model.n_embd", 2, 40, "must be divisible by model.n_head (3), got 64"},
        {"train: {steps: 10}", "data.train", 0, 0, "is required"},
        {"data: {val: y}", "data.train", 1, 1, "is required"},
        {"", "data.train", 0, 0, "the spec is empty"},
        /* documents */
        {"- a\n- b\n", NULL, 1, 1, "a spec must be a mapping"},
        {"[1, 2]", NULL, 1, 1, "a spec must be a mapping"},
        {D "---\n" D, NULL, 3, 1, "found a second"},
        {"data: {train: x}\n\ttrain: 1\n", NULL, -1, -1, "invalid YAML"},
        {"{\"data\": }", NULL, 1, 10, "invalid JSON"},
        {"{data: {train: x}}", NULL, 1, 5, "invalid JSON"},
        {"{\"data\": {\"train\": \"x\"}, \"train\": {\"lr\": \"0.1\"}}", "train.lr", 1, 42,
         "got \"0.1\""},
        {"{\"data\": {\"train\": \"x\"}, \"ddp\": {\"overlap\": 1}}", "ddp.overlap", 1, 45,
         "must be true or false, got 1"},
        {"{\"data\": {\"train\": \"x\"},\n \"extra\": 1}", "extra", 2, 2, "unknown key"},
    };
#undef D
    size_t failed = 0;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) failed += !check_bad(&bad[i]);
    assert_int_equal(failed, 0);
}

static void test_load_errors(void **state)
{
    ddp_spec_t s;
    ddp_errinfo_t ei;
    const char *missing = src_path("tests/fixtures/specs/no-such-file.yaml");
    assert_int_equal(ddp_spec_load(&s, missing, &ei), -ENOENT);
    assert_string_equal(ei.path, missing);
    assert_non_null(strstr(ei.msg, "No such file"));
    assert_int_equal(ddp_spec_load(&s, src_path("tests/fixtures/specs"), &ei), DDP_ESPEC);
    assert_non_null(strstr(ei.msg, "regular file"));

    /* errstr: compiler-style, with and without a position */
    char buf[512];
    assert_int_equal(parse(&s, "data: {train: x}\ntrain: {lr: -1}", &ei), DDP_ESPEC);
    assert_string_equal(ddp_spec_errstr(&ei, "job.yaml", buf, sizeof buf),
                        "job.yaml:2:13: train.lr: must be a number > 0 and <= 10, got -1");
    assert_int_equal(parse(&s, "train: {}", &ei), DDP_ESPEC);
    ddp_spec_errstr(&ei, "job.yaml", buf, sizeof buf);
    assert_non_null(strstr(buf, "job.yaml: data.train: is required"));
}

/* Fail the k-th allocation, k = 1, 2, ... until parsing succeeds: every failure is a clean
 * DDP_ENOMEM (ASan checks that nothing leaks), and the final result equals an unfailed parse. */
static void test_alloc_failures(void **state)
{
    ddp_spec_t want, s;
    ddp_errinfo_t ei;
    const char *paths[] = {"tests/fixtures/specs/good_full.yaml",
                           "tests/fixtures/specs/good_full.json"};
    for (int f = 0; f < 2; f++) {
        assert_int_equal(ddp_spec_load(&want, src_path(paths[f]), &ei), 0);
        int rc = -1;
        long k;
        for (k = 1; k < 1000 && rc != 0; k++) {
            ddp_alloc_fail_at(k);
            rc = ddp_spec_load(&s, src_path(paths[f]), &ei);
            if (rc != 0 && rc != DDP_ENOMEM) fail_msg("k=%ld: rc %d (%s)", k, rc, ei.msg);
        }
        ddp_alloc_fail_at(0);
        assert_int_equal(rc, 0);
        assert_true(k > 2); /* at least one allocation was failed */
        assert_spec_eq(&s, &want);
    }
}

/* min_workers below workers warns only where it does nothing (restart: never). */
static void test_warning(void **state)
{
    ddp_spec_t s;
    ddp_errinfo_t ei;
    char w[256];
    const char *base = "model: {preset: gpt2-tiny}\ndata: {train: x}\n";
    char text[512];
    snprintf(text, sizeof text, "%sddp: {workers: 4, min_workers: 2}\n", base);
    assert_int_equal(parse(&s, text, &ei), 0);
    assert_int_equal(ddp_spec_warning(&s, w, sizeof w), 1);
    assert_non_null(strstr(w, "ddp.min_workers (2) is below ddp.workers (4)"));
    snprintf(text, sizeof text, "%sddp: {workers: 4, min_workers: 2, restart: on-failure}\n",
             base);
    assert_int_equal(parse(&s, text, &ei), 0);
    assert_int_equal(ddp_spec_warning(&s, w, sizeof w), 0);
    assert_string_equal(w, "");
    snprintf(text, sizeof text, "%sddp: {workers: 4}\n", base);
    assert_int_equal(parse(&s, text, &ei), 0);
    assert_int_equal(ddp_spec_warning(&s, w, sizeof w), 0);
}

/* The reference has a row for every field a spec serialises (and the model's dimensions, which a
 * preset's JSON leaves out), and reports a stream it cannot write. */
static void test_reference(void **state)
{
    (void)state;
    char *ref = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&ref, &len);
    assert_non_null(f);
    assert_int_equal(ddp_spec_reference(f), 0);
    fclose(f);
    ddp_spec_t s;
    ddp_spec_defaults(&s);
    char *text = ddp_spec_to_json(&s);
    json_t *root = json_loads(text, 0, NULL);
    assert_non_null(root);
    int rows = 0;
    const char *sec, *key;
    json_t *obj, *v;
    char row[160];
    json_object_foreach(root, sec, obj) {
        if (!json_is_object(obj)) {
            snprintf(row, sizeof row, "| `%s` |", sec);
            if (!strstr(ref, row)) fail_msg("no row %s in the reference", row);
            rows++;
            continue;
        }
        json_object_foreach(obj, key, v) {
            snprintf(row, sizeof row, "| `%s.%s` |", sec, key);
            if (!strstr(ref, row)) fail_msg("no row %s in the reference", row);
            rows++;
        }
    }
    static const char *const dims[] = {"n_layer", "n_head", "n_embd", "vocab_size", "block_size"};
    for (int d = 0; d < 5; d++) {
        snprintf(row, sizeof row, "| `model.%s` |", dims[d]);
        if (!strstr(ref, row)) fail_msg("no row %s in the reference", row);
    }
    assert_true(rows > 40);
    json_decref(root);
    free(text);
    free(ref);
    FILE *ro = fopen("/dev/null", "r");
    assert_non_null(ro);
    assert_int_equal(ddp_spec_reference(ro), DDP_EIO);
    fclose(ro);
}

/* ---- the YAML reader (proto/spec_tree.c) --------------------------------------------------- */

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The tree as one line: scalars as <style><line>:<column>"text" (P plain, S string, ~ null),
 * mappings as {<line>:<column> key@<line>:<column>=value ...}, sequences as [<line>:<column> ...].
 */
static void dump_node(const ddp__snode_t *n, char *buf, size_t cap)
{
    size_t len = strlen(buf);
    if (!n) {
        snprintf(buf + len, cap - len, "NULL");
        return;
    }
    if (n->kind == DDP__SN_SCALAR) {
        char st = n->stype == DDP__SC_PLAIN ? 'P' : n->stype == DDP__SC_STRING ? 'S'
                : n->stype == DDP__SC_NULL  ? '~' : '?';
        snprintf(buf + len, cap - len, "%c%d:%d\"%s\"", st, n->line, n->column, n->text);
        return;
    }
    int map = n->kind == DDP__SN_MAP;
    snprintf(buf + len, cap - len, "%c%d:%d", map ? '{' : '[', n->line, n->column);
    for (size_t i = 0; i < n->n; i++) {
        const ddp__sentry_t *e = &n->entries[i];
        len = strlen(buf);
        if (map)
            snprintf(buf + len, cap - len, " %s@%d:%d=", e->key, e->key_line, e->key_column);
        else
            snprintf(buf + len, cap - len, " ");
        dump_node(e->val, buf, cap);
    }
    len = strlen(buf);
    snprintf(buf + len, cap - len, "%c", map ? '}' : ']');
}

/* Reads text as YAML: the tree as dump_node writes it, or "E<line>:<column> <msg>" (the path must
 * be the origin). */
static const char *tree_of(const char *text, size_t len)
{
    static char buf[4096];
    ddp__stree_t t;
    ddp_errinfo_t ei;
    buf[0] = '\0';
    int rc = ddp__stree_yaml(&t, text, len, "<tree>", &ei);
    if (rc == 0) {
        dump_node(t.root, buf, sizeof buf);
    } else {
        snprintf(buf, sizeof buf, "E%d:%d %s%s", ei.line, ei.column, ei.msg,
                 rc != DDP_ESPEC ? " (not DDP_ESPEC)" : strcmp(ei.path, "<tree>") ? " (path)" : "");
    }
    ddp__stree_free(&t);
    return buf;
}

/* Every kind of node, style, null spelling, position and document error, as the reader gave them
 * when it used libyaml's document loader (the event reader must give the same), and two that
 * loader missed. */
static void test_yaml_tree(void **state)
{
    (void)state;
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"name: job\nlr: 1e-3\nq: 'quoted'\ndq: \"dq\"\n"
         "nulls: [~, null, Null, NULL, '', nul, \"\"]\nempty:\n? k\nseq:\n  - a\n  - {x: 1}\n"
         "  - |\n    lit\n",
         "{1:1 name@1:1=P1:7\"job\" lr@2:1=P2:5\"1e-3\" q@3:1=S3:4\"quoted\" dq@4:1=S4:5\"dq\" "
         "nulls@5:1=[5:8 ~5:9\"~\" ~5:12\"null\" ~5:18\"Null\" ~5:24\"NULL\" S5:30\"\" "
         "P5:34\"nul\" S5:39\"\"] empty@6:1=~6:7\"\" k@7:3=~8:1\"\" "
         "seq@8:1=[9:3 P9:5\"a\" {10:5 x@10:6=P10:9\"1\"} S11:5\"lit\n\"]}"},
        {"a:\n  b:\n    - c\n", "{1:1 a@1:1={2:3 b@2:3=[3:5 P3:7\"c\"]}}"},
        {"- [a, b]\n- x\n", "[1:1 [1:3 P1:4\"a\" P1:7\"b\"] P2:3\"x\"]"},
        /* JSON is YAML's flow style: spec.c reads JSON text here to find positions */
        {"{\"a\": [1, {\"b\": null}], \"c\": \"d\"}",
         "{1:1 a@1:2=[1:7 P1:8\"1\" {1:11 b@1:12=~1:17\"null\"}] c@1:25=S1:30\"d\"}"},
        {"a: !!str b", "{1:1 a@1:1=P1:4\"b\"}"}, /* tags are ignored */
        {"", "NULL"},
        {"# only a comment\n", "NULL"},
        {"---\n", "~2:1\"\""},
        {"a: 1\n...\n", "{1:1 a@1:1=P1:4\"1\"}"},
        {"{a: 1, a: 2}", "E1:8 duplicate key 'a'"},
        {"a:\n  x: 1\n  y: 2\n  x: 3\n", "E4:3 duplicate key 'x'"},
        {"{? [a]: b}", "E1:4 mapping keys must be scalars"},
        {"- \"\\0\"", "E1:3 NUL byte in a scalar"},
        {"a: 1\nb\n", "E3:1 invalid YAML: could not find expected ':' while scanning a simple key"},
        {"a: 1\n---\nb: 2\n", "E3:1 a spec is one YAML document; found a second"},
        {"a: 1\n---\n", "E3:1 a spec is one YAML document; found a second"},
        {"a: 1\n...\n---\n", "E4:1 a spec is one YAML document; found a second"},
        {"a: {b: 1}\n%YAML 1.1\n---\nc: 1\n", "E4:1 a spec is one YAML document; found a second"},
        /* two the loader let through: a second document that is not valid YAML, and junk
         * after the end of the first */
        {"a: 1\n--- [\n", "E2:5 a spec is one YAML document; found a second"},
        {"a: 1\n...\n]", "E3:1 invalid YAML: did not find expected <document start>"},
    };
    size_t failed = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *got = tree_of(cases[i].text, strlen(cases[i].text));
        if (strcmp(got, cases[i].want)) {
            print_error("for %s\n  got  %s\n  want %s\n", cases[i].text, got, cases[i].want);
            failed++;
        }
    }
    assert_int_equal(failed, 0);
}

/* Depth 16 (the root is 0) is the deepest node: a collection there must be empty. */
static void test_yaml_depth_limit(void **state)
{
    (void)state;
    char text[512], want[64];
    const char *got;
    /* 17 '[': the innermost, empty, is at depth 16; 18: the 18th is refused where it starts */
    for (int n = 17; n <= 18; n++) {
        memset(text, '[', (size_t)n);
        memset(text + n, ']', (size_t)n);
        got = tree_of(text, 2 * (size_t)n);
        if (n == 17) assert_true(got[0] == '[' && strstr(got, "[1:17]"));
        else assert_string_equal(got, "E1:18 document nested too deeply");
    }
    /* a scalar inside 16 '[' is at depth 16; inside 17 it is at 17 */
    for (int n = 16; n <= 17; n++) {
        memset(text, '[', (size_t)n);
        text[n] = 'x';
        memset(text + n + 1, ']', (size_t)n);
        got = tree_of(text, 2 * (size_t)n + 1);
        if (n == 16) assert_non_null(strstr(got, "[1:16 P1:17\"x\"]"));
        else assert_string_equal(got, "E1:18 document nested too deeply");
    }
    /* mappings: "a: " then n "{a: " then "{}": the "{}" is at depth n + 1, column 4 + 4n */
    for (int n = 15; n <= 16; n++) {
        size_t len = (size_t)snprintf(text, sizeof text, "a: ");
        for (int i = 0; i < n; i++) len += (size_t)snprintf(text + len, sizeof text - len, "{a: ");
        len += (size_t)snprintf(text + len, sizeof text - len, "{}");
        for (int i = 0; i < n; i++) text[len++] = '}';
        got = tree_of(text, len);
        snprintf(want, sizeof want, "{1:%d}", 4 + 4 * n);
        if (n == 15) assert_non_null(strstr(got, want));
        else assert_string_equal(got, "E1:68 document nested too deeply");
    }
    /* block style: 18 levels of "a:", the mapping at depth 17 starts on line 18, column 35 */
    size_t len = 0;
    for (int i = 0; i < 18; i++)
        len += (size_t)snprintf(text + len, sizeof text - len, "%*sa:\n", 2 * i, "");
    assert_string_equal(tree_of(text, len), "E18:35 document nested too deeply");
}

/* A hostile request line: libyaml's document loader took minutes on 300,000 nested '[' (its
 * work grows with the square of the depth) before the reader could check the depth. Refused at
 * the 18th level, at once. A safety bound, not a benchmark: it takes about 2 ms. */
static void test_yaml_deep_nesting_is_refused_at_once(void **state)
{
    (void)state;
    static const struct {
        const char *unit;
        int column;
    } cases[] = {{"[", 18}, {"{a: ", 69}};
    const size_t levels = 300000;
    for (size_t c = 0; c < 2; c++) {
        size_t u = strlen(cases[c].unit), len = levels * u;
        char *text = malloc(len);
        assert_non_null(text);
        for (size_t i = 0; i < levels; i++) memcpy(text + i * u, cases[c].unit, u);
        ddp__stree_t t;
        ddp_errinfo_t ei;
        double t0 = mono_s();
        int rc = ddp__stree_yaml(&t, text, len, "<test>", &ei);
        double dt = mono_s() - t0;
        if (rc != DDP_ESPEC || !strstr(ei.msg, "nested too deeply") || ei.line != 1 ||
            ei.column != cases[c].column || dt >= 1.0)
            fail_msg("%zu x '%s': rc %d %d:%d %s in %.3f s; want nesting refused at 1:%d < 1 s",
                     levels, cases[c].unit, rc, ei.line, ei.column, ei.msg, dt, cases[c].column);
        ddp__stree_free(&t);
        /* and through the spec parser, as the daemon reads a submitted job */
        ddp_spec_t s;
        if (c == 0) {
            t0 = mono_s();
            assert_int_equal(ddp_spec_parse(&s, text, len, "<test>", &ei), DDP_ESPEC);
            dt = mono_s() - t0;
            assert_string_equal(ei.path, "<test>");
            assert_non_null(strstr(ei.msg, "nested too deeply"));
            if (dt >= 1.0) fail_msg("ddp_spec_parse took %.3f s", dt);
        }
        free(text);
    }
}

/* Every key of a mapping is compared with the others: the loader-era reader compared each with
 * all before it, 12 s for 49,000 keys (480 KB). Also bounded by the node count (keys are nodes). */
static void test_yaml_many_keys(void **state)
{
    (void)state;
    const int keys = 49000;
    char *text = malloc((size_t)keys * 16 + 64);
    assert_non_null(text);
    size_t len = 0;
    for (int i = 0; i < keys; i++) len += (size_t)sprintf(text + len, "k%d: %d\n", i, i);
    ddp__stree_t t;
    ddp_errinfo_t ei;
    double t0 = mono_s();
    int rc = ddp__stree_yaml(&t, text, len, "<test>", &ei);
    double dt = mono_s() - t0;
    if (rc) fail_msg("rc %d: %s", rc, ei.msg);
    assert_int_equal(t.root->n, keys);
    assert_string_equal(t.root->entries[keys - 1].key, "k48999");
    assert_int_equal(t.root->entries[keys - 1].key_line, keys);
    ddp__stree_free(&t);
    if (dt >= 1.0) fail_msg("%d keys took %.3f s", keys, dt);
    /* a duplicate at the end is still found, at its own line */
    len += (size_t)sprintf(text + len, "k17: 0\n");
    t0 = mono_s();
    rc = ddp__stree_yaml(&t, text, len, "<test>", &ei);
    dt = mono_s() - t0;
    assert_int_equal(rc, DDP_ESPEC);
    assert_string_equal(ei.msg, "duplicate key 'k17'");
    assert_int_equal(ei.line, keys + 1);
    assert_int_equal(ei.column, 1);
    if (dt >= 1.0) fail_msg("%d keys and a duplicate took %.3f s", keys, dt);
    /* more nodes than the cap: 100,000 entries and the sequence itself */
    len = 0;
    text = realloc(text, 2 * 100000 + 8);
    assert_non_null(text);
    text[len++] = '[';
    for (int i = 0; i < 100000; i++) {
        text[len++] = '0';
        text[len++] = ',';
    }
    text[len - 1] = ']';
    assert_string_equal(tree_of(text, len),
                        "E1:200000 document too large (more than 100000 nodes)");
    free(text);
}

/* Anchors and aliases have no use in a job spec, and an alias is how a small document grows
 * into a huge tree (a "billion laughs"): both are refused where they appear. */
static void test_yaml_anchors_refused(void **state)
{
    (void)state;
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"a: &x 1\nb: *x", "E1:4 anchors and aliases are not allowed in a job spec"},
        {"a: 1\nb: *x", "E2:4 anchors and aliases are not allowed in a job spec"},
        {"a: &m {x: 1}", "E1:4 anchors and aliases are not allowed in a job spec"},
        {"a: &s [1]", "E1:4 anchors and aliases are not allowed in a job spec"},
        {"&k a: 1", "E1:1 anchors and aliases are not allowed in a job spec"},
        {"a: !!str &x b", "E1:4 anchors and aliases are not allowed in a job spec"},
        {"{a: 1, *x : 2}", "E1:8 anchors and aliases are not allowed in a job spec"},
        {"a:\n  - 1\n  - &y 2\n", "E3:5 anchors and aliases are not allowed in a job spec"},
        {"a: &r\n  b: 1\n", "E1:4 anchors and aliases are not allowed in a job spec"},
    };
    size_t failed = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *got = tree_of(cases[i].text, strlen(cases[i].text));
        if (strcmp(got, cases[i].want)) {
            print_error("for %s\n  got  %s\n  want %s\n", cases[i].text, got, cases[i].want);
            failed++;
        }
    }
    assert_int_equal(failed, 0);
    /* a billion laughs, through the spec parser */
    char text[2048];
    size_t len = (size_t)snprintf(text, sizeof text, "data: {train: x}\n"
                                                     "a: &a [lol, lol, lol, lol, lol, lol, lol]\n");
    for (char c = 'b'; c <= 'j'; c++)
        len += (size_t)snprintf(text + len, sizeof text - len,
                                "%c: &%c [*%c, *%c, *%c, *%c, *%c, *%c, *%c]\n", c, c, c - 1, c - 1,
                                c - 1, c - 1, c - 1, c - 1, c - 1);
    ddp_spec_t s;
    ddp_errinfo_t ei;
    assert_int_equal(ddp_spec_parse(&s, text, len, "<test>", &ei), DDP_ESPEC);
    assert_string_equal(ei.path, "<test>");
    assert_string_equal(ei.msg, "anchors and aliases are not allowed in a job spec");
    assert_int_equal(ei.line, 2);
    assert_int_equal(ei.column, 4);
}

/* Scalars are paths, names and numbers: one of 64 KiB is the most the reader copies. */
static void test_yaml_long_scalar(void **state)
{
    (void)state;
    const size_t cap = 64 * 1024;
    char *text = malloc(cap + 16);
    assert_non_null(text);
    for (int quoted = 0; quoted < 2; quoted++) {
        for (size_t n = cap; n <= cap + 1; n++) {
            size_t len = (size_t)sprintf(text, "a: %s", quoted ? "\"" : "");
            memset(text + len, 'x', n);
            len += n;
            if (quoted) text[len++] = '"';
            ddp__stree_t t;
            ddp_errinfo_t ei;
            int rc = ddp__stree_yaml(&t, text, len, "<test>", &ei);
            if (n == cap) {
                if (rc) fail_msg("%zu bytes: rc %d %s", n, rc, ei.msg);
                assert_int_equal(strlen(t.root->entries[0].val->text), n);
            } else {
                assert_int_equal(rc, DDP_ESPEC);
                assert_string_equal(ei.msg, "scalar longer than 65536 bytes");
                assert_int_equal(ei.line, 1);
                assert_int_equal(ei.column, 4);
            }
            ddp__stree_free(&t);
        }
    }
    free(text);
}

/* Fail the k-th allocation of the YAML reader, k = 1, 2, ... until it succeeds, on a document
 * that grows every buffer it has (the arena, the entries of open collections, the key set): each
 * failure is DDP_ENOMEM (ASan: no leak), and the last tree is the one an unfailed read gives. */
static void test_yaml_alloc_failures(void **state)
{
    (void)state;
    char text[8192], want[4096], got[4096] = "";
    size_t len = 0;
    for (int i = 0; i < 300; i++)
        len += (size_t)snprintf(text + len, sizeof text - len, "k%d: %d\n", i, i);
    len += (size_t)snprintf(text + len, sizeof text - len, "s: [");
    for (int i = 0; i < 100; i++)
        len += (size_t)snprintf(text + len, sizeof text - len, "[%d], ", i);
    len += (size_t)snprintf(text + len, sizeof text - len, "{a: x}]\n");
    snprintf(want, sizeof want, "%s", tree_of(text, len));
    assert_true(want[0] == '{');
    int rc = -1;
    long k;
    for (k = 1; k < 10000 && rc != 0; k++) {
        ddp__stree_t t;
        ddp_errinfo_t ei;
        ddp_alloc_fail_at(k);
        rc = ddp__stree_yaml(&t, text, len, "<test>", &ei);
        ddp_alloc_fail_at(0);
        if (rc != 0 && rc != DDP_ENOMEM) fail_msg("k=%ld: rc %d (%s)", k, rc, ei.msg);
        if (rc == 0) dump_node(t.root, got, sizeof got);
        ddp__stree_free(&t);
    }
    assert_int_equal(rc, 0);
    assert_true(k > 4); /* arena blocks, entries, key set: each failed once */
    assert_string_equal(got, want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_presets),        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_yaml_json_equal), cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_examples),       cmocka_unit_test(test_reject_fixtures),
        cmocka_unit_test(test_reject_inline),  cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_alloc_failures), cmocka_unit_test(test_warning),
        cmocka_unit_test(test_reference),
        /* the YAML reader */
        cmocka_unit_test(test_yaml_tree),
        cmocka_unit_test(test_yaml_depth_limit),
        cmocka_unit_test(test_yaml_many_keys),
        cmocka_unit_test(test_yaml_anchors_refused),
        cmocka_unit_test(test_yaml_long_scalar),
        cmocka_unit_test(test_yaml_alloc_failures),
        cmocka_unit_test(test_yaml_deep_nesting_is_refused_at_once),
    };
    return cmocka_run_group_tests_name("spec", tests, NULL, NULL);
}
