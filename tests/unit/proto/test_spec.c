/* Unit tests of the job spec: presets, defaults, YAML/JSON equivalence, the JSON round trip,
 * every kind of rejection (with its field path, line, column and message), and the example jobs
 * in deploy/examples, and the reference (ddp_spec_reference) naming every field. Fixture files
 * are found through DDP_SOURCE_ROOT. */
#include <errno.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "common/alloc.h"
#include "proto/spec.h"

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
    assert_string_equal(s.train_glob, "data/train_*.bin");
    assert_string_equal(s.val_glob, "");
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
    snprintf(d.train_glob, sizeof d.train_glob, "data/train_*.bin");
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
    assert_string_equal(y.val_glob, "data/full/val_*.bin");
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
    assert_string_equal(s.train_glob, "data/shakespeare/train_*.bin");
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
         "must be one of cosine, constant; got linear"},
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_presets),        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_yaml_json_equal), cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_examples),       cmocka_unit_test(test_reject_fixtures),
        cmocka_unit_test(test_reject_inline),  cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_alloc_failures), cmocka_unit_test(test_warning),
        cmocka_unit_test(test_reference),
    };
    return cmocka_run_group_tests_name("spec", tests, NULL, NULL);
}
