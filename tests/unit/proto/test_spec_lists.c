/* Unit tests of the spec's list fields (data.train and data.val as a string or a list of named
 * sources, eval's tasks) and of the schedule and spike-skipping fields: what each form parses
 * to, the JSON round trip (a string stays a string; fields an older build does not know are
 * left out at their defaults), and every rejection with its path, line and column. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "proto/spec.h"

static int parse(ddp_spec_t *s, const char *text, ddp_errinfo_t *ei)
{
    return ddp_spec_parse(s, text, strlen(text), "<test>", ei);
}

/* Parses text, writes it as JSON, parses that: the two structs are the same; returns the JSON
 * (caller frees). */
static char *round_trip(const char *text, ddp_spec_t *s)
{
    ddp_spec_t r;
    ddp_errinfo_t ei;
    if (parse(s, text, &ei)) fail_msg("%s: %s: %s", text, ei.path, ei.msg);
    char *json = ddp_spec_to_json(s);
    assert_non_null(json);
    if (parse(&r, json, &ei)) fail_msg("round trip: %s: %s\n%s", ei.path, ei.msg, json);
    if (memcmp(s, &r, sizeof r)) fail_msg("round trip changed the spec:\n%s", json);
    return json;
}

static void test_string_form(void **state)
{
    (void)state;
    ddp_spec_t s;
    char *json = round_trip("data: {train: \"a/*.bin\", val: \"v/*.bin\"}", &s);
    assert_int_equal(s.n_train, 1);
    assert_int_equal(s.train_listed, 0);
    assert_string_equal(s.train[0].glob, "a/*.bin");
    assert_string_equal(s.train[0].name, "");
    assert_true(s.train[0].weight == 1);
    assert_int_equal(s.n_val, 1);
    assert_string_equal(s.val[0].glob, "v/*.bin");
    /* written back as strings */
    assert_non_null(strstr(json, "\"train\": \"a/*.bin\""));
    assert_non_null(strstr(json, "\"val\": \"v/*.bin\""));
    free(json);
    /* "" = no validation */
    json = round_trip("data: {train: x, val: \"\"}", &s);
    assert_int_equal(s.n_val, 0);
    free(json);
}

static void test_list_form(void **state)
{
    (void)state;
    ddp_spec_t s;
    char *json = round_trip("data:\n"
                            "  train:\n"
                            "    - {name: web, path: \"web/train_*.bin\", weight: 0.7}\n"
                            "    - {name: code, path: \"code/train_*.bin\", weight: 0.3}\n"
                            "  val: [{name: web, path: \"web/val_*.bin\"}]\n",
                            &s);
    assert_int_equal(s.n_train, 2);
    assert_int_equal(s.train_listed, 1);
    assert_string_equal(s.train[1].name, "code");
    assert_string_equal(s.train[1].glob, "code/train_*.bin");
    assert_true(s.train[0].weight == 0.7 && s.train[1].weight == 0.3);
    assert_int_equal(s.n_val, 1);
    assert_int_equal(s.val_listed, 1);
    assert_string_equal(s.val[0].name, "web");
    assert_non_null(strstr(json, "\"name\": \"code\""));
    free(json);
    /* a list of one stays a list; weight defaults to 1 */
    json = round_trip("data: {train: [{name: a, path: x}]}", &s);
    assert_int_equal(s.n_train, 1);
    assert_int_equal(s.train_listed, 1);
    assert_true(s.train[0].weight == 1);
    assert_non_null(strstr(json, "\"train\": ["));
    free(json);
    /* JSON documents give the same */
    ddp_spec_t j;
    ddp_errinfo_t ei;
    assert_int_equal(parse(&j, "{\"data\": {\"train\": [{\"name\": \"a\", \"path\": \"x\"}]}}",
                           &ei), 0);
    assert_memory_equal(&j, &s, sizeof s);
}

static void test_eval(void **state)
{
    (void)state;
    ddp_spec_t s;
    char *json = round_trip("data: {train: x}\n"
                            "eval:\n"
                            "  - {name: hellaswag, path: hs.jsonl, every: 100, limit: 500}\n"
                            "  - {name: shakespeare, path: sh.jsonl}\n",
                            &s);
    assert_int_equal(s.n_eval, 2);
    assert_string_equal(s.eval[0].name, "hellaswag");
    assert_string_equal(s.eval[0].path, "hs.jsonl");
    assert_int_equal(s.eval[0].every, 100);
    assert_int_equal(s.eval[0].limit, 500);
    assert_int_equal(s.eval[1].every, 0);
    assert_int_equal(s.eval[1].limit, 0);
    assert_string_equal(s.eval[0].target_delimiter, " "); /* the harness's default */
    assert_non_null(strstr(json, "\"eval\": ["));
    assert_null(strstr(json, "target_delimiter")); /* at its default: left out (older builds) */
    free(json);
    /* another target_delimiter, the empty one included, is kept and written back */
    json = round_trip("data: {train: x}\n"
                      "eval: [{name: a, path: a.jsonl, target_delimiter: \"\"},\n"
                      "       {name: b, path: b.jsonl, target_delimiter: \" => \"}]\n",
                      &s);
    assert_string_equal(s.eval[0].target_delimiter, "");
    assert_string_equal(s.eval[1].target_delimiter, " => ");
    assert_non_null(strstr(json, "\"target_delimiter\": \"\""));
    assert_non_null(strstr(json, "\"target_delimiter\": \" => \""));
    free(json);
    /* none: left out of the JSON (an older build refuses the key) */
    json = round_trip("data: {train: x}\neval: []", &s);
    assert_int_equal(s.n_eval, 0);
    assert_null(strstr(json, "eval"));
    free(json);
}

static void test_schedule_and_skipping(void **state)
{
    (void)state;
    ddp_spec_t s;
    char *json = round_trip("data: {train: x}\ntrain: {steps: 100}", &s);
    assert_int_equal(s.schedule, DDP_SCHED_COSINE);
    assert_true(fabs(s.min_lr - 6e-5) < 1e-18);
    assert_int_equal(s.skip_window, 128);
    assert_true(s.decay_frac == 0.2);
    assert_int_equal(s.decay_shape, DDP_DECAY_1_SQRT);
    /* fields an older build does not know are left out at their defaults */
    static const char *const quiet[] = {"decay_steps", "decay_frac", "decay_shape",
                                        "allow_schedule_change", "skip_loss_z", "skip_norm_z",
                                        "skip_window", "limits"};
    for (size_t i = 0; i < sizeof quiet / sizeof quiet[0]; i++)
        if (strstr(json, quiet[i])) fail_msg("%s written at its default:\n%s", quiet[i], json);
    free(json);
    /* wsd: min_lr defaults to 0; the decay by steps or by fraction; set fields are written */
    json = round_trip("data: {train: x}\ntrain: {steps: 100, schedule: wsd, decay_steps: 30, "
                      "decay_shape: linear, skip_loss_z: 5, skip_norm_z: 6.5, skip_window: 64, "
                      "allow_schedule_change: true}",
                      &s);
    assert_int_equal(s.schedule, DDP_SCHED_WSD);
    assert_true(s.min_lr == 0);
    assert_int_equal(s.decay_steps, 30);
    assert_int_equal(s.decay_shape, DDP_DECAY_LINEAR);
    assert_true(s.skip_loss_z == 5 && s.skip_norm_z == 6.5);
    assert_int_equal(s.skip_window, 64);
    assert_int_equal(s.allow_schedule_change, 1);
    assert_non_null(strstr(json, "\"decay_steps\": 30"));
    assert_non_null(strstr(json, "\"skip_window\": 64"));
    free(json);
    /* by fraction, decay_steps stays 0 (the fraction of whatever train.steps is) */
    json = round_trip("data: {train: x}\ntrain: {steps: 100, schedule: wsd, decay_frac: 0.1}", &s);
    assert_int_equal(s.decay_steps, 0);
    assert_true(s.decay_frac == 0.1);
    free(json);
    /* the largest threshold a window can reach, just below it, is accepted */
    json = round_trip("data: {train: x}\ntrain: {skip_window: 5, skip_loss_z: 1.99}", &s);
    free(json);
}

typedef struct bad {
    const char *text, *path;
    int line, column;
    const char *msg;
} bad_t;

/* ddp.grad_dtype: fp32 by default and then left out of the JSON; bf16 written; others refused */
static void test_grad_dtype(void **state)
{
    (void)state;
    ddp_spec_t s;
    ddp_errinfo_t ei;
    char *json = round_trip("data: {train: x}", &s);
    assert_int_equal(s.grad_dtype, DDP_GRAD_FP32);
    if (strstr(json, "grad_dtype")) fail_msg("grad_dtype written at its default:\n%s", json);
    free(json);
    json = round_trip("data: {train: x}\nddp: {grad_dtype: bf16}", &s);
    assert_int_equal(s.grad_dtype, DDP_GRAD_BF16);
    assert_non_null(strstr(json, "\"grad_dtype\": \"bf16\""));
    free(json);
    assert_int_not_equal(parse(&s, "data: {train: x}\nddp: {grad_dtype: fp16}", &ei), 0);
    assert_string_equal(ei.path, "ddp.grad_dtype");
}

static void test_rejects(void **state)
{
    (void)state;
#define D "data: {train: x}\n"
    static const bad_t bad[] = {
        {"{\"data\": {\"train\": true}}", "data.train", 1, 20,
         "must be a string or a list of mappings (name, path, weight), got true"},
        {"data: {train: {name: a}}", "data.train", 1, 15, "got a mapping"},
        {"data: {train: []}", "data.train", 1, 15, "must not be empty"},
        {"data:\n  train:\n    - {name: a, path: x}\n    - 3\n", "data.train[1]", 4, 7,
         "must be a mapping of name, path, weight, got 3"},
        {"data:\n  train:\n    - {name: a, path: x, wieght: 2}\n", "data.train[0].wieght", 3,
         26, "unknown key; allowed here: name, path, weight"},
        {"data: {train: [{name: a}]}", "data.train[0]", 1, 16, "needs `path`"},
        {"data: {train: [{path: x}]}", "data.train[0]", 1, 16, "needs `name`"},
        {"data: {train: [{name: a, path: \"\"}]}", "data.train[0].path", 1, 32,
         "must not be empty"},
        {"data: {train: [{name: a, path: x}, {name: a, path: y}]}", "data.train[1].name", 1,
         43, "\"a\" is the name of entry 0 too"},
        {"data: {train: [{name: ../a, path: x}]}", "data.train[0].name", 1, 23,
         "must use only letters"},
        {"data: {train: [{name: a, path: x, weight: 0}]}", "data.train[0].weight", 1, 43,
         "must be a number > 0"},
        {"data: {train: [{name: a, path: x, weight: -1}]}", "data.train[0].weight", 1, 43,
         "must be a number > 0"},
        {"data: {train: [{name: a, path: x}], val: [{name: v, path: y, weight: 2}]}",
         "data.val[0].weight", 1, 62, "unknown key; allowed here: name, path"},
        {"data: {train: [{name: a, path: x}, {name: b, path: x}, {name: c, path: x}, "
         "{name: d, path: x}, {name: e, path: x}, {name: f, path: x}, {name: g, path: x}, "
         "{name: h, path: x}, {name: i, path: x}]}",
         "data.train", 1, 15, "must have at most 8 entries, got 9"},
        {"{\"data\": {\"train\": \"x\"},\n \"eval\": [{\"name\": \"a\", \"path\": \"b\",\n"
         "   \"every\": \"soon\"}]}",
         "eval[0].every", 3, 13, "must be an integer >= 0, got \"soon\""},
        {D "eval: {name: a, path: b}", "eval", 2, 7, "must be a list of mappings"},
        {D "eval: [{path: b}]", "eval[0]", 2, 8, "needs `name`"},
        {D "eval: [{name: a, path: b, every: -1}]", "eval[0].every", 2, 34,
         "must be an integer >= 0"},
        {D "eval: [{name: a, path: b, limt: 1}]", "eval[0].limt", 2, 27, "unknown key"},
        {D "eval: [{name: a, path: b, target_delimiter: \"0123456789abcdef\"}]",
         "eval[0].target_delimiter", 2, 45, "at most 15 bytes"},
        {D "train: {decay_steps: 10}", "train.decay_steps", 2, 22,
         "applies only to train.schedule: wsd (the schedule is cosine)"},
        {D "train: {schedule: constant, decay_shape: linear}", "train.decay_shape", 2, 42,
         "applies only to train.schedule: wsd"},
        {D "train: {schedule: wsd, decay_steps: 10, decay_frac: 0.5}", "train.decay_frac", 2,
         53, "not both"},
        {D "train: {steps: 100, warmup: 90, schedule: wsd, decay_steps: 20}",
         "train.decay_steps", 2, 61, "more than the 10 after the warmup"},
        {D "train: {steps: 4, schedule: wsd, decay_frac: 0.1}", "train.decay_frac", 2, 46,
         "a decay of 0 steps"},
        {D "train: {schedule: wsd, decay_shape: exp}", "train.decay_shape", 2, 37,
         "must be one of linear, 1-sqrt, cosine"},
        {D "train: {skip_loss_z: 11.3}", "train.skip_loss_z", 2, 22,
         "must be below sqrt(train.skip_window - 1) = 11.27"},
        {D "train: {skip_window: 5, skip_norm_z: 2}", "train.skip_norm_z", 2, 38,
         "it could never skip"},
        {D "train: {skip_window: 1}", "train.skip_window", 2, 22, "in 2..4096"},
        {D "train: {skip_loss_z: -1}", "train.skip_loss_z", 2, 22, ">= 0"},
    };
#undef D
    size_t failed = 0;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ddp_spec_t s;
        ddp_errinfo_t ei;
        const bad_t *b = &bad[i];
        int rc = parse(&s, b->text, &ei);
        if (rc != DDP_ESPEC) {
            print_error("accepted (rc %d): %s\n", rc, b->text);
            failed++;
        } else if (strcmp(ei.path, b->path) || !strstr(ei.msg, b->msg) || ei.line != b->line ||
                   ei.column != b->column) {
            print_error("for %s\n  got  %s:%d:%d: %s\n  want %s:%d:%d: ...%s...\n", b->text,
                        ei.path, ei.line, ei.column, ei.msg, b->path, b->line, b->column,
                        b->msg);
            failed++;
        }
    }
    assert_int_equal(failed, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_string_form), cmocka_unit_test(test_list_form),
        cmocka_unit_test(test_eval),        cmocka_unit_test(test_schedule_and_skipping),
        cmocka_unit_test(test_rejects),     cmocka_unit_test(test_grad_dtype),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
