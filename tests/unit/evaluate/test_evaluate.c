/* Unit tests of worker/evaluate/: HellaSwag's preprocess and Python's string rules it depends on,
 * the harness's token split and left truncation, BOS, argmax ties, and every bad-input error
 * (with its file, line and field). The scores against transformers: eval_reference.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/file.h"
#include "tests/unit/byte_symbol.h"
#include "worker/evaluate/score.h"
#include "worker/observe/metrics_sink.h"
#include "worker/evaluate/task.h"

static void expect_pre(const char *in, const char *want)
{
    char *got = ddp_mc_preprocess(in);
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
}

static void test_preprocess(void **state)
{
    (void)state;
    expect_pre("  plain text \n", "plain text"); /* strip first */
    expect_pre("[header] Foo", " Foo");          /* a tag at the start leaves a space */
    expect_pre("Foo [step] bar", "Foo bar");     /* "Foo  bar" -> one space */
    expect_pre("A [title] B", "A. B");           /* ". " then the double space */
    expect_pre("a [b] c [d] e", "a c e");        /* non-greedy: each tag alone */
    expect_pre("a [b\nc] d", "a [b\nc] d");      /* '.' does not match a line break */
    expect_pre("x [unclosed", "x [unclosed");
    expect_pre("a   b", "a  b"); /* one pass: three spaces -> two */
    expect_pre("a    b", "a  b");
    expect_pre("\xc2\xa0 nbsp strip \xe3\x80\x80", "nbsp strip"); /* Python's Unicode spaces */
    expect_pre("", "");
}

static void expect_cap(const char *in, const char *want)
{
    char *got = ddp_mc_capitalize(in);
    assert_non_null(got);
    assert_string_equal(got, want);
    free(got);
}

static void test_capitalize(void **state)
{
    (void)state;
    expect_cap("hELLO wORLD", "Hello world"); /* the rest lowered */
    expect_cap("then, THE man", "Then, the man");
    expect_cap("\xc3\xa9LAN", "\xc3\x89lan"); /* élan -> Élan */
    expect_cap("\xc7\x86x", "\xc7\x85x");     /* ǆ -> ǅ: title case, not upper (Ǆ) */
    expect_cap("", "");
    expect_cap("1ABC", "1abc");
}

static void test_codepoints_and_space(void **state)
{
    (void)state;
    assert_int_equal(ddp_mc_codepoints("hello"), 5);
    assert_int_equal(ddp_mc_codepoints("h\xc3\xa9llo"), 5);
    assert_int_equal(ddp_mc_codepoints("\xe6\x97\xa5\xe6\x9c\xac"), 2);
    assert_int_equal(ddp_mc_codepoints(" a"), 2); /* a leading space counts */
    assert_int_equal(ddp_mc_trailing_space("ab \n\t", 5), 3);
    assert_int_equal(ddp_mc_trailing_space("ab\xc2\xa0", 4), 2);
    assert_int_equal(ddp_mc_trailing_space("ab", 2), 0);
    assert_int_equal(ddp_mc_trailing_space("   ", 3), 3);
}

static void test_argmax_first(void **state)
{
    (void)state;
    double x[] = {-3, -1, -1, -2};
    assert_int_equal(ddp_mc_argmax(x, 4), 1);
    double y[] = {-1, -1};
    assert_int_equal(ddp_mc_argmax(y, 2), 0);
}

/* A scorer for tokenizing only: a model stand-in with B x T activations and 256 tokens. */
static ddp_model_t fake_model;

static void scorer(ddp_mc_scorer_t *s, int T, long bos)
{
    memset(&fake_model, 0, sizeof fake_model);
    fake_model.acts.B = 4;
    fake_model.acts.T = T;
    fake_model.cfg.vocab_size = 256;
    ddp_errinfo_t ei;
    assert_int_equal(ddp_mc_scorer_init(s, &fake_model, NULL, bos, T, &ei), 0);
}

static ddp_mc_example_t example(const char *ctx, const char *choice)
{
    static char *choices[1];
    choices[0] = (char *)choice;
    return (ddp_mc_example_t){
        .context = (char *)ctx, .choices = choices, .n_choices = 1, .line = 7};
}

static void expect_toks(const ddp_mc_scorer_t *s, const char *want, int n_cont)
{
    size_t n = strlen(want);
    assert_int_equal(s->len[0], (int)n);
    assert_int_equal(s->n_cont[0], n_cont);
    for (size_t i = 0; i < n; i++) assert_int_equal(s->toks[0][i], (unsigned char)want[i]);
}

static void test_token_split(void **state)
{
    (void)state;
    ddp_mc_scorer_t s;
    ddp_errinfo_t ei;
    scorer(&s, 16, -1);
    /* the context's trailing whitespace moves to the continuation: "abc" + "\n de" */
    ddp_mc_example_t ex = example("abc\n", "de");
    assert_int_equal(ddp_mc_tokenize(&s, &ex, 0, " ", "t.jsonl", &ei), 0);
    expect_toks(&s, "abc\n de", 4);
    ex = example("abc", "de");
    assert_int_equal(ddp_mc_tokenize(&s, &ex, 0, " ", "t.jsonl", &ei), 0);
    expect_toks(&s, "abc de", 3);
    /* another target_delimiter goes where " " went: none, for lines after a line break */
    ex = example("abc\n", "de");
    assert_int_equal(ddp_mc_tokenize(&s, &ex, 0, "", "t.jsonl", &ei), 0);
    expect_toks(&s, "abc\nde", 3);
    ex = example("abc", "de");
    assert_int_equal(ddp_mc_tokenize(&s, &ex, 0, " => ", "t.jsonl", &ei), 0);
    expect_toks(&s, "abc => de", 6);
    ddp_mc_scorer_close(&s);
}

static void test_truncation(void **state)
{
    (void)state;
    ddp_mc_scorer_t s;
    ddp_errinfo_t ei;
    scorer(&s, 8, -1);
    /* 10 + 3 tokens: the last T + 1 = 9 are kept, from the left the context goes */
    ddp_mc_example_t ex = example("0123456789", "xy");
    assert_int_equal(ddp_mc_tokenize(&s, &ex, 0, " ", "t.jsonl", &ei), 0);
    expect_toks(&s, "456789 xy", 3);
    /* a continuation of exactly T tokens keeps one context token */
    ex = example("0123456789", "abcdefg");
    assert_int_equal(ddp_mc_tokenize(&s, &ex, 0, " ", "t.jsonl", &ei), 0);
    expect_toks(&s, "9 abcdefg", 8);
    /* one more and nothing of the context is left: refused with the file, line and field */
    ex = example("0123456789", "abcdefgh");
    assert_int_equal(ddp_mc_tokenize(&s, &ex, 0, " ", "t.jsonl", &ei), DDP_EFORMAT);
    assert_string_equal(ei.path, "t.jsonl");
    assert_int_equal(ei.line, 7);
    assert_non_null(strstr(ei.msg, "context: nothing left after truncation to seq_len 8"));
    ddp_mc_scorer_close(&s);
}

static void test_bos(void **state)
{
    (void)state;
    ddp_mc_scorer_t s;
    ddp_errinfo_t ei;
    scorer(&s, 16, 1);
    ddp_mc_example_t ex = example("ab", "c");
    assert_int_equal(ddp_mc_tokenize(&s, &ex, 0, " ", "t.jsonl", &ei), 0);
    expect_toks(&s,
                "\x01"
                "ab c",
                2);
    ex = example("", "c"); /* BOS stands for an empty context */
    assert_int_equal(ddp_mc_tokenize(&s, &ex, 0, " ", "t.jsonl", &ei), 0);
    expect_toks(&s, "\x01 c", 2);
    ddp_mc_scorer_close(&s);
    scorer(&s, 16, -1);
    ex = example(" \n", "c"); /* all whitespace: nothing left of the context, no BOS */
    assert_int_equal(ddp_mc_tokenize(&s, &ex, 0, " ", "t.jsonl", &ei), DDP_EFORMAT);
    assert_non_null(strstr(ei.msg, "context: empty"));
    ddp_mc_scorer_close(&s);
    /* the tokenizer decides: no tokenizer, no BOS */
    long bos = 5;
    assert_int_equal(ddp_mc_tokenizer_bos(NULL, NULL, &bos, &ei), 0);
    assert_int_equal(bos, -1);
}

static void test_no_tokenizer_refused(void **state)
{
    (void)state;
    ddp_mc_scorer_t s;
    ddp_errinfo_t ei;
    memset(&fake_model, 0, sizeof fake_model);
    fake_model.acts.B = 1;
    fake_model.acts.T = 8;
    fake_model.cfg.vocab_size = 50257;
    assert_int_equal(ddp_mc_scorer_init(&s, &fake_model, NULL, -1, 8, &ei), DDP_EINVAL);
    assert_non_null(strstr(ei.msg, "needs a tokenizer"));
}

/* A byte-level BPE tokenizer.json text: the 256 bytes, "ab" = 256 (merge "a b"), the added
 * token "<s>" = 257, and `post` as its post_processor. Caller frees. */
static char *tokenizer_json(const char *post)
{
    size_t cap = 16384, n = 0;
    char *j = malloc(cap);
    assert_non_null(j);
    n += (size_t)snprintf(j + n, cap - n,
                          "{\"version\": \"1.0\", \"added_tokens\": [{\"id\": 257, \"content\": "
                          "\"<s>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
                          "\"normalized\": false, \"special\": true}], \"normalizer\": null, "
                          "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": "
                          "false, \"use_regex\": true}, \"post_processor\": %s, \"model\": "
                          "{\"type\": \"BPE\", \"vocab\": {",
                          post);
    for (int b = 0; b < 256; b++) {
        char sym[8];
        byte_symbol(b, sym);
        n += (size_t)snprintf(j + n, cap - n, "%s\"%s\": %d", b ? ", " : "", sym, b);
    }
    snprintf(j + n, cap - n, ", \"ab\": 256, \"<s>\": 257}, \"merges\": [\"a b\"]}}");
    return j;
}

static ddp_tok_t *load_tokenizer(const char *json)
{
    char path[] = "/tmp/ddp_eval_tok_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, json, strlen(json)), (ssize_t)strlen(json));
    close(fd);
    ddp_tok_t *t = NULL;
    ddp_errinfo_t ei;
    int rc = ddp_tok_load(path, &t, &ei);
    unlink(path);
    if (rc) fail_msg("tokenizer: %s", ei.msg);
    return t;
}

#define LLAMA_POST                                                                                 \
    "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", "        \
    "\"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}]}"

static void test_tokenizer_bos(void **state)
{
    (void)state;
    ddp_errinfo_t ei;
    long bos;
    struct {
        const char *post;
        long want;
    } cases[] = {
        {LLAMA_POST, 257}, /* Llama: TemplateProcessing starting with its BOS */
        {"{\"type\": \"Sequence\", \"processors\": [{\"type\": \"ByteLevel\"}, " LLAMA_POST "]}",
         257}, /* Llama 3: inside a Sequence */
        {"{\"type\": \"ByteLevel\", \"add_prefix_space\": false}", -1}, /* GPT-2 */
        {"null", -1},
        {"{\"type\": \"TemplateProcessing\", \"single\": [{\"Sequence\": {\"id\": \"A\"}}, "
         "{\"SpecialToken\": {\"id\": \"<s>\"}}]}",
         -1}, /* a special token after the text is no BOS */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *json = tokenizer_json(cases[i].post);
        ddp_tok_t *t = load_tokenizer(json);
        assert_int_equal(ddp_mc_tokenizer_bos(json, t, &bos, &ei), 0);
        assert_int_equal(bos, cases[i].want);
        if (i == 0) {
            /* BPE through the scorer: BOS on both encodings, the continuation the tail */
            ddp_mc_scorer_t s;
            memset(&fake_model, 0, sizeof fake_model);
            fake_model.acts.B = 4;
            fake_model.acts.T = 16;
            fake_model.cfg.vocab_size = 258;
            assert_int_equal(ddp_mc_scorer_init(&s, &fake_model, t, bos, 16, &ei), 0);
            ddp_mc_example_t ex = example("ab", "ab");
            assert_int_equal(ddp_mc_tokenize(&s, &ex, 0, " ", "t.jsonl", &ei), 0);
            assert_int_equal(s.len[0], 4);
            assert_int_equal(s.n_cont[0], 2);
            uint32_t want[] = {257, 256, ' ', 256};
            for (int k = 0; k < 4; k++) assert_int_equal(s.toks[0][k], want[k]);
            ddp_mc_scorer_close(&s);
        }
        ddp_tok_free(t);
        free(json);
    }
    /* a BOS the vocabulary lacks */
    char *json =
        tokenizer_json("{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": "
                       "{\"id\": \"<|begin_of_text|>\"}}]}");
    ddp_tok_t *t = load_tokenizer(json);
    assert_int_equal(ddp_mc_tokenizer_bos(json, t, &bos, &ei), DDP_EFORMAT);
    assert_non_null(strstr(ei.msg, "<|begin_of_text|>"));
    ddp_tok_free(t);
    free(json);
}

/* An eval record: its metrics.jsonl line, and TensorBoard tags named by its task. */
static void test_eval_record(void **state)
{
    (void)state;
    char dir[] = "/tmp/ddp_eval_rec_XXXXXX", path[128], cmd[160];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    ddp_metrics_sink_t *sink;
    assert_int_equal(ddp_metrics_sink_open(dir, path, &sink), 0);
    ddp_metrics_rec_t r;
    ddp_metrics_init(&r, DDP_METRICS_EVAL);
    r.step = 12;
    snprintf(r.task, sizeof r.task, "hellaswag");
    r.examples = 40;
    r.acc = 0.25;
    r.acc_norm = 0.3;
    r.acc_tok = 0.2;
    r.eval_ms = 5;
    r.tokens = 1024;
    assert_int_equal(ddp_metrics_sink_write(sink, &r), 0);
    ddp_metrics_sink_close(sink);
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(ddp_file_read(path, 1 << 20, &text, &len), 0);
    assert_string_equal(text,
                        "{\"event\":\"eval\",\"step\":12,\"task\":\"hellaswag\",\"examples\":40,"
                        "\"acc\":0.250000,\"acc_norm\":0.300000,\"acc_tok\":0.200000,"
                        "\"eval_ms\":5.0,\"tokens\":1024}\n");
    ddp_metrics_rec_t back;
    assert_int_equal(ddp_metrics_parse(text, len, &back, NULL), 0);
    assert_int_equal(back.kind, DDP_METRICS_EVAL);
    assert_string_equal(back.task, "hellaswag");
    free(text);
    /* the event file holds the tags as plain bytes */
    snprintf(cmd, sizeof cmd, "cat %s/tb/events.out.tfevents.* > %s/all.tb", dir, dir);
    assert_int_equal(system(cmd), 0);
    snprintf(path, sizeof path, "%s/all.tb", dir);
    assert_int_equal(ddp_file_read(path, 1 << 20, &text, &len), 0);
    const char *tags[] = {"eval/hellaswag/acc_norm", "eval/hellaswag/acc",
                          "eval/hellaswag/acc_tok"};
    for (size_t i = 0; i < 3; i++)
        if (!memmem(text, len, tags[i], strlen(tags[i]))) fail_msg("no tag %s", tags[i]);
    assert_null(memmem(text, len, "train/tokens", 12)); /* not a step's tag */
    free(text);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void parse_ok(const char *row, ddp_mc_example_t *ex)
{
    ddp_errinfo_t ei;
    int rc = ddp_mc_parse_row(row, strlen(row), "t.jsonl", 3, ex, &ei);
    if (rc) print_error("%s\n", ei.msg);
    assert_int_equal(rc, 0);
}

static void test_rows(void **state)
{
    (void)state;
    ddp_mc_example_t ex;
    parse_ok("{\"context\": \"Q:\", \"choices\": [\"a\", \"b\"], \"label\": 1, \"x\": 0}", &ex);
    assert_string_equal(ex.context, "Q:");
    assert_int_equal(ex.n_choices, 2);
    assert_string_equal(ex.choices[1], "b");
    assert_int_equal(ex.label, 1);
    assert_int_equal(ex.line, 3);
    ddp_mc_example_free(&ex);
    /* HellaSwag: the harness's query and choices; a digit-string label */
    parse_ok("{\"activity_label\": \"Removing ice from car\", \"ctx_a\": \"Then, the man "
             "writes over the snow  covering the window of a car.\", \"ctx_b\": \"then, THE man\","
             " \"endings\": [\"[header] Foo bar.\", \" x [title] y \"], \"label\": \"1\"}",
             &ex);
    assert_string_equal(ex.context, "Removing ice from car: Then, the man writes over the snow "
                                    "covering the window of a car. Then, the man");
    assert_string_equal(ex.choices[0], " Foo bar.");
    assert_string_equal(ex.choices[1], "x. y");
    assert_int_equal(ex.label, 1);
    ddp_mc_example_free(&ex);
    /* an empty ctx_b: the trailing space is stripped */
    parse_ok("{\"activity_label\": \"A\", \"ctx_a\": \"b\", \"ctx_b\": \"\", \"endings\": [\"c\"],"
             " \"label\": 0}",
             &ex);
    assert_string_equal(ex.context, "A: b");
    ddp_mc_example_free(&ex);
}

static void expect_bad(const char *row, const char *msg)
{
    ddp_mc_example_t ex;
    ddp_errinfo_t ei;
    int rc = ddp_mc_parse_row(row, strlen(row), "bad.jsonl", 12, &ex, &ei);
    assert_int_equal(rc, DDP_EFORMAT);
    assert_string_equal(ei.path, "bad.jsonl");
    assert_int_equal(ei.line, 12);
    if (!strstr(ei.msg, msg)) print_error("'%s' lacks '%s'\n", ei.msg, msg);
    assert_non_null(strstr(ei.msg, msg));
}

static void test_bad_rows(void **state)
{
    (void)state;
    expect_bad("{\"context\": \"q\", \"choices\": [\"a\"], ", "malformed JSON");
    expect_bad("[1, 2]", "expected a JSON object");
    expect_bad("{\"choices\": [\"a\"], \"label\": 0}", "context: missing");
    expect_bad("{\"context\": \"q\", \"label\": 0}", "choices: missing");
    expect_bad("{\"context\": \"q\", \"choices\": [\"a\"]}", "label: missing");
    expect_bad("{\"context\": \"q\", \"choices\": [\"a\", \"b\"], \"label\": 2}",
               "label: 2 is out of range for 2 choices");
    expect_bad("{\"context\": \"q\", \"choices\": [\"a\", \"b\"], \"label\": -1}",
               "label: -1 is out of range");
    expect_bad("{\"context\": \"q\", \"choices\": [\"a\"], \"label\": \"x\"}",
               "label: 'x' is not a digit string");
    expect_bad("{\"context\": \"q\", \"choices\": [\"a\"], \"label\": 0.5}", "label: expected");
    expect_bad("{\"context\": \"q\", \"choices\": [\"a\", \"\"], \"label\": 0}",
               "choices[1]: empty");
    expect_bad("{\"context\": \"q\", \"choices\": [], \"label\": 0}", "choices: expected a list");
    expect_bad("{\"context\": \"q\", \"choices\": [\"a\", 3], \"label\": 0}",
               "choices[1]: expected a string");
    expect_bad("{\"context\": 5, \"choices\": [\"a\"], \"label\": 0}",
               "context: expected a string");
    expect_bad("{\"activity_label\": \"A\", \"ctx_a\": \"b\", \"endings\": [\"c\"], \"label\": 0}",
               "ctx_b: missing");
    expect_bad("{\"activity_label\": \"A\", \"ctx_a\": \"b\", \"ctx_b\": \"c\", \"endings\": "
               "[\"[x]\"], \"label\": 0}",
               "endings[0]: empty after preprocessing");
}

static void test_task_file(void **state)
{
    (void)state;
    char path[] = "/tmp/ddp_eval_task_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const char *text = "{\"context\": \"a\", \"choices\": [\"b\"], \"label\": 0}\n"
                       "\n"
                       "{\"context\": \"c\", \"choices\": [\"d\", \"e\"], \"label\": \"1\"}\n"
                       "{\"context\": \"f\", \"choices\": [\"g\"], \"label\": 3}\n";
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    ddp_mc_task_t t;
    ddp_errinfo_t ei;
    assert_int_equal(ddp_mc_task_load(&t, path, 2, " ", &ei), 0); /* the limit stops before line 4 */
    assert_int_equal(t.n, 2);
    assert_int_equal(t.ex[1].line, 3);
    assert_int_equal(t.ex[1].label, 1);
    ddp_mc_task_close(&t);
    assert_int_equal(ddp_mc_task_load(&t, path, 0, " ", &ei), DDP_EFORMAT);
    assert_int_equal(ei.line, 4);
    assert_string_equal(ei.path, path);
    assert_non_null(strstr(ei.msg, "label: 3 is out of range for 1 choices"));
    ddp_mc_task_close(&t);
    unlink(path);
    assert_true(ddp_mc_task_load(&t, "/nonexistent/task.jsonl", 0, " ", &ei) < 0);
    assert_string_equal(ei.path, "/nonexistent/task.jsonl");
    ddp_mc_task_close(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_preprocess),
        cmocka_unit_test(test_capitalize),
        cmocka_unit_test(test_codepoints_and_space),
        cmocka_unit_test(test_argmax_first),
        cmocka_unit_test(test_token_split),
        cmocka_unit_test(test_truncation),
        cmocka_unit_test(test_bos),
        cmocka_unit_test(test_no_tokenizer_refused),
        cmocka_unit_test(test_rows),
        cmocka_unit_test(test_bad_rows),
        cmocka_unit_test(test_task_file),
        cmocka_unit_test(test_tokenizer_bos),
        cmocka_unit_test(test_eval_record),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
