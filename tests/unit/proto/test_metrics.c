/* Unit tests of the metrics record's codec (proto/metrics.h).
 *
 * The golden lines below are the bytes the hand-made fprintfs wrote before the codec existed
 * (worker/step_log.c, run.c, train.c, main.c at 4af32da), captured by running those format
 * strings on the same values; the codec must write them byte for byte from records filled the
 * way the writers now fill them. Then: parse(format(x)) == x, every older line still parses,
 * escaping, non-finite reals, and malformed lines (each a clear error, never a crash).
 */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "proto/metrics.h"

/* ---- the records, filled as the writers fill them ---- */

/* worker/step_log.c */
static ddp_metrics_rec_t step_rec(long step, long steps, float loss, double lr, double norm,
                                  double tps, double ms, double compute_ms, double comm_ms,
                                  double exposed_ms, double hidden, double optim_ms,
                                  unsigned long long tokens, int world, unsigned long long gen,
                                  int named, double scale, double wall, double mfu)
{
    ddp_metrics_rec_t r;
    ddp_metrics_init(&r, DDP_METRICS_STEP);
    r.step = step;
    r.steps = steps;
    r.loss = loss;
    r.lr = lr;
    r.grad_norm = norm;
    r.tokens_per_s = tps;
    r.step_ms = ms;
    r.compute_ms = compute_ms;
    r.comm_ms = comm_ms;
    r.exposed_comm_ms = exposed_ms;
    r.hidden = hidden;
    r.optim_ms = optim_ms;
    r.tokens = (int64_t)tokens;
    r.world = world;
    r.generation = (int64_t)gen;
    r.straggler = named;
    r.loss_scale = scale;
    r.wall_ms = wall;
    r.mfu = mfu;
    return r;
}

/* worker/run.c: the validation line */
static ddp_metrics_rec_t val_rec(long step, float vl)
{
    ddp_metrics_rec_t r;
    ddp_metrics_init(&r, DDP_METRICS_VAL);
    r.step = step;
    r.val_loss = vl;
    return r;
}

/* worker/run.c: a generation */
static ddp_metrics_rec_t gen_rec(unsigned long long gen, int world, long step, const char *why,
                                 double ms, double form, double comm, double attach, double state,
                                 int receivers, int source, int shrunk)
{
    ddp_metrics_rec_t r;
    ddp_metrics_init(&r, DDP_METRICS_GENERATION);
    r.generation = (int64_t)gen;
    r.world = world;
    r.step = step;
    snprintf(r.cause, sizeof r.cause, "%s", why);
    r.reconfig_ms = ms;
    r.form_ms = form;
    r.comm_ms = comm;
    r.attach_ms = attach;
    r.state_ms = state;
    r.receivers = receivers;
    r.source = source;
    r.shrunk = shrunk;
    return r;
}

/* worker/step.c: a state transfer */
static ddp_metrics_rec_t xfer_rec(unsigned long long gen, long state_step, int overlap,
                                  int n_recv, int first_root, size_t n_params, float ms)
{
    ddp_metrics_rec_t r;
    ddp_metrics_init(&r, DDP_METRICS_TRANSFER);
    double mb = 3.0 * (double)n_params * sizeof(float) / 1e6;
    r.generation = (int64_t)gen;
    r.step = state_step;
    snprintf(r.mode, sizeof r.mode, "%s", overlap ? "overlap" : "pause");
    r.receivers = n_recv;
    r.source = first_root;
    r.mb = mb;
    r.ms = ms;
    r.mb_per_s = mb * 1e3 / (ms > 0 ? ms : 1);
    return r;
}

/* worker/main.c */
static ddp_metrics_rec_t done_rec(long step, float final_loss)
{
    ddp_metrics_rec_t r;
    ddp_metrics_init(&r, DDP_METRICS_DONE);
    r.step = step;
    r.final_loss = final_loss;
    return r;
}

/* ---- helpers ---- */

static void assert_line(const ddp_metrics_rec_t *r, const char *want)
{
    char buf[DDP_METRICS_LINE_MAX];
    size_t n = 0;
    int rc = ddp_metrics_format(r, buf, sizeof buf, &n);
    if (rc != 0) fail_msg("format: %s", ddp_strerror(rc));
    if (strcmp(buf, want) != 0) fail_msg("line differs:\n got  %s\n want %s", buf, want);
    assert_int_equal(n, strlen(want));
}

static ddp_metrics_rec_t parse_ok(const char *line)
{
    ddp_metrics_rec_t r;
    ddp_errinfo_t ei;
    ddp_errinfo_clear(&ei);
    int rc = ddp_metrics_parse(line, strlen(line), &r, &ei);
    if (rc != 0) fail_msg("parse(%s): %s: %s", line, ddp_err_name(rc), ei.msg);
    return r;
}

/* a and b hold the same fields with the same values (bit for bit; NAN equals NAN) */
static void assert_rec_eq(const ddp_metrics_rec_t *a, const ddp_metrics_rec_t *b)
{
    char la[DDP_METRICS_LINE_MAX], lb[DDP_METRICS_LINE_MAX];
    ddp_metrics_format(a, la, sizeof la, NULL);
    ddp_metrics_format(b, lb, sizeof lb, NULL);
    if (a->kind != b->kind || a->has != b->has || strcmp(a->event, b->event) != 0)
        fail_msg("records differ: kind %d/%d has %#llx/%#llx event %s/%s\n%s\n%s", a->kind,
                 b->kind, (unsigned long long)a->has, (unsigned long long)b->has, a->event,
                 b->event, la, lb);
    /* every member, through a copy with NAN made one bit pattern */
    ddp_metrics_rec_t x = *a, y = *b;
    double *xs[] = {&x.loss, &x.lr, &x.grad_norm, &x.tokens_per_s, &x.step_ms, &x.compute_ms,
                    &x.comm_ms, &x.exposed_comm_ms, &x.hidden, &x.optim_ms, &x.loss_scale,
                    &x.wall_ms, &x.val_loss, &x.reconfig_ms, &x.form_ms, &x.attach_ms,
                    &x.state_ms, &x.mb, &x.ms, &x.mb_per_s, &x.final_loss};
    for (size_t i = 0; i < sizeof xs / sizeof *xs; i++) {
        double *py = (double *)((char *)&y + ((char *)xs[i] - (char *)&x));
        if (isnan(*xs[i]) && isnan(*py)) *xs[i] = *py = 0;
        if (memcmp(xs[i], py, sizeof(double)) != 0)
            fail_msg("field at offset %zu: %.17g != %.17g\n%s\n%s",
                     (size_t)((char *)xs[i] - (char *)&x), *xs[i], *py, la, lb);
    }
    int same = x.step == y.step && x.steps == y.steps && x.tokens == y.tokens &&
               x.world == y.world && x.generation == y.generation && x.straggler == y.straggler &&
               x.receivers == y.receivers && x.source == y.source && x.shrunk == y.shrunk &&
               !strcmp(x.cause, y.cause) && !strcmp(x.mode, y.mode);
    if (!same) fail_msg("records differ:\n%s\n%s", la, lb);
}

/* ---- the golden lines ---- */

static const char *const GOLDEN[] = {
    "{\"step\":1200,\"steps\":2000,\"loss\":3.281742,\"lr\":0.00059873,\"grad_norm\":1.02346,"
    "\"tokens_per_s\":45678.9,\"step_ms\":123.46,\"compute_ms\":100.12,\"comm_ms\":30.50,"
    "\"exposed_comm_ms\":5.25,\"hidden\":0.8279,\"optim_ms\":2.50,\"tokens\":78643200,"
    "\"world\":4,\"generation\":2,\"straggler\":-1,\"loss_scale\":1,\"wall_ms\":148148.1,"
    "\"mfu\":0.4123}",
    "{\"step\":1,\"steps\":10,\"loss\":10.987650,\"lr\":6e-05,\"grad_norm\":null,"
    "\"tokens_per_s\":0.0,\"step_ms\":0.00,\"compute_ms\":0.00,\"comm_ms\":0.00,"
    "\"exposed_comm_ms\":0.00,\"hidden\":0.0000,\"optim_ms\":0.00,\"tokens\":0,\"world\":1,"
    "\"generation\":0,\"straggler\":3,\"loss_scale\":65536,\"wall_ms\":0.1,\"mfu\":null}",
    "{\"step\":7,\"steps\":7,\"loss\":-0.000000,\"lr\":0,\"grad_norm\":1.23457e+07,"
    "\"tokens_per_s\":10000000.0,\"step_ms\":99999.99,\"compute_ms\":1.00,\"comm_ms\":2.00,"
    "\"exposed_comm_ms\":3.00,\"hidden\":1.0000,\"optim_ms\":0.12,"
    "\"tokens\":18446744073709551,\"world\":16,\"generation\":12,\"straggler\":15,"
    "\"loss_scale\":0.5,\"wall_ms\":0.0,\"mfu\":1.5000}",
    "{\"step\":8,\"steps\":9,\"loss\":0.500000,\"lr\":0.001,\"grad_norm\":null,"
    "\"tokens_per_s\":1.5,\"step_ms\":2.50,\"compute_ms\":3.50,\"comm_ms\":4.50,"
    "\"exposed_comm_ms\":5.50,\"hidden\":1.0000,\"optim_ms\":6.50,\"tokens\":1,\"world\":2,"
    "\"generation\":3,\"straggler\":1,\"loss_scale\":3.05176e-05,\"wall_ms\":123456789.2,"
    "\"mfu\":0.0000}",
    "{\"step\":300,\"val_loss\":2.718282}",
    "{\"step\":1,\"val_loss\":0.000000}",
    "{\"event\":\"generation\",\"generation\":3,\"world\":3,\"step\":41,"
    "\"cause\":\"rank 2 (pid 12345) died: exit status 1 \xe2\x80\x94 \xc3\xbcn\xc3\xaf" "c\xc3\xb6"
    "d\xc3\xa9 \xe2\x9c\x93\",\"reconfig_ms\":1234.6,\"form_ms\":1000.0,\"comm_ms\":200.1,"
    "\"attach_ms\":30.0,\"state_ms\":4.5,\"receivers\":1,\"source\":0,\"shrunk\":true}",
    "{\"event\":\"generation\",\"generation\":0,\"world\":1,\"step\":0,\"cause\":\"start\","
    "\"reconfig_ms\":0.0,\"form_ms\":0.0,\"comm_ms\":0.0,\"attach_ms\":0.0,\"state_ms\":0.0,"
    "\"receivers\":0,\"source\":-1,\"shrunk\":false}",
    "{\"event\":\"state_transfer\",\"generation\":4,\"step\":99,\"mode\":\"overlap\","
    "\"receivers\":2,\"source\":1,\"mb\":1493.28,\"ms\":812.2,\"mb_per_s\":1838.4}",
    "{\"event\":\"state_transfer\",\"generation\":1,\"step\":0,\"mode\":\"pause\","
    "\"receivers\":1,\"source\":0,\"mb\":0.04,\"ms\":0.0,\"mb_per_s\":36.0}",
    "{\"event\":\"done\",\"step\":2000,\"final_loss\":1.234568}",
};
#define N_GOLDEN (sizeof GOLDEN / sizeof *GOLDEN)

static void golden_recs(ddp_metrics_rec_t r[N_GOLDEN])
{
    r[0] = step_rec(1200, 2000, 3.2817421f, 0.00059873, 1.0234567, 45678.912, 123.456, 100.125,
                    30.5, 5.25, 0.82791, 2.5, 78643200ULL, 4, 2, -1, 1.0, 148148.14, 0.41234);
    r[1] = step_rec(1, 10, 10.98765f, 6e-05, NAN, 0.0, 0.004, 0, 0, 0, 0, 0, 0, 1, 0, 3, 65536.0,
                    0.05, NAN);
    r[2] = step_rec(7, 7, -0.0000001f, 0.0, 12345678.9, 1e7, 99999.995, 1, 2, 3, 1.0, 0.125,
                    18446744073709551ULL, 16, 12, 15, 0.5, 1e-3, 1.5);
    r[3] = step_rec(8, 9, 0.5f, 1e-3, INFINITY, 1.5, 2.5, 3.5, 4.5, 5.5, 0.99995, 6.5, 1, 2, 3, 1,
                    3.0517578125e-05, 123456789.25, 0.00004);
    r[4] = val_rec(300, 2.7182817f);
    r[5] = val_rec(1, 0.0f);
    r[6] = gen_rec(3, 3, 41, "rank 2 (pid 12345) died: exit status 1 \xe2\x80\x94 \xc3\xbcn"
                   "\xc3\xaf" "c\xc3\xb6" "d\xc3\xa9 \xe2\x9c\x93", 1234.56, 1000.04, 200.06, 30.0,
                   4.46, 1, 0, 1);
    r[7] = gen_rec(0, 1, 0, "start", 0.0, 0.0, 0.0, 0.0, 0.0, 0, -1, 0);
    r[8] = xfer_rec(4, 99, 1, 2, 1, 124439808, 812.25f);
    r[9] = xfer_rec(1, 0, 0, 1, 0, 3000, 0.0f);
    r[10] = done_rec(2000, 1.2345678f);
}

/* Every kind of line: the codec writes today's bytes; parsing them and writing again gives
 * them back. */
static void test_golden(void **state)
{
    (void)state;
    ddp_metrics_rec_t r[N_GOLDEN];
    golden_recs(r);
    for (size_t i = 0; i < N_GOLDEN; i++) {
        assert_line(&r[i], GOLDEN[i]);
        ddp_metrics_rec_t p = parse_ok(GOLDEN[i]);
        assert_int_equal(p.kind, r[i].kind);
        assert_int_equal(p.has, r[i].has);
        assert_line(&p, GOLDEN[i]);
    }
}

/* parse(format(x)) == x for values that the line's precision holds exactly, in every kind */
static void test_round_trip(void **state)
{
    (void)state;
    ddp_metrics_rec_t in[6], out;
    in[0] = step_rec(42, 100, 2.5, 0.0003, 0.75, 1234.5, 12.25, 10.5, 1.75, 0.25, 0.8125, 0.5,
                     1ULL << 40, 3, 7, 2, 32768, 5000.5, 0.375);
    in[1] = val_rec(42, 1.5f);
    in[2] = gen_rec(9, 2, 77, "a \"quoted\" cause\\with\nnewline\t\x01 \xc3\xbc\xe2\x82\xac",
                    1.5, 2.5, 3.5, 4.5, 5.5, 1, 0, 1);
    in[3] = xfer_rec(9, 77, 0, 1, 0, 0, 12.5f);
    in[4] = done_rec(100, 2.25f);
    in[5] = step_rec(1, 1, NAN, INFINITY, -INFINITY, NAN, 0, 0, 0, 0, 0, 0, 0, 1, 0, -1, NAN, 0,
                     NAN);
    for (size_t i = 0; i < sizeof in / sizeof *in; i++) {
        char buf[DDP_METRICS_LINE_MAX];
        size_t n;
        assert_int_equal(ddp_metrics_format(&in[i], buf, sizeof buf, &n), 0);
        assert_int_equal(ddp_metrics_parse(buf, n, &out, NULL), 0);
        if (i == 5) { /* non-finite reals are null, and read back as NAN */
            in[5].lr = in[5].grad_norm = NAN;
            assert_non_null(strstr(buf, "\"loss\":null,\"lr\":null,\"grad_norm\":null,"
                                        "\"tokens_per_s\":null,"));
            assert_non_null(strstr(buf, "\"loss_scale\":null,"));
        }
        assert_rec_eq(&in[i], &out);
    }
}

/* A skipped step (worker/step_log.c): the optional "skipped" and "skips" follow the step line's
 * own fields, and read back; a line without them is the line it always was. */
static void test_skipped_step(void **state)
{
    (void)state;
    ddp_metrics_rec_t r = step_rec(20, 24, 2.5, 0.0003, 0.75, 1234.5, 12.25, 10.5, 1.75, 0.25,
                                   0.8125, 0.5, 1ULL << 20, 2, 0, -1, 1, 500.5, 0.25);
    snprintf(r.skipped, sizeof r.skipped, "loss");
    r.skips = 3;
    r.has |= DDP_MF(SKIPPED) | DDP_MF(SKIPS);
    char buf[DDP_METRICS_LINE_MAX];
    size_t n;
    assert_int_equal(ddp_metrics_format(&r, buf, sizeof buf, &n), 0);
    assert_non_null(strstr(buf, "\"wall_ms\":500.5,\"mfu\":0.2500,\"skipped\":\"loss\",\"skips\":3}"));
    ddp_metrics_rec_t out;
    assert_int_equal(ddp_metrics_parse(buf, n, &out, NULL), 0);
    assert_rec_eq(&r, &out);
    assert_string_equal(out.skipped, "loss");
    assert_int_equal(out.skips, 3);
}

/* Strings: jansson's escapes for a quote, a backslash and control characters; UTF-8 kept as
 * it is; bytes that are not UTF-8 become '?', so the line always loads. */
static void test_strings(void **state)
{
    (void)state;
    ddp_metrics_rec_t r = gen_rec(1, 2, 3, "q\"b\\n\nt\tc\x01 \xc3\xbc/", 0, 0, 0, 0, 0, 0, 0, 0);
    char buf[DDP_METRICS_LINE_MAX];
    assert_int_equal(ddp_metrics_format(&r, buf, sizeof buf, NULL), 0);
    assert_non_null(strstr(buf, "\"cause\":\"q\\\"b\\\\n\\nt\\tc\\u0001 \xc3\xbc/\","));

    snprintf(r.cause, sizeof r.cause, "bad \xff utf8 \xc3 and \xed\xa0\x80 surrogate \xc3\xbc");
    assert_int_equal(ddp_metrics_format(&r, buf, sizeof buf, NULL), 0);
    assert_non_null(strstr(buf, "\"cause\":\"bad ? utf8 ? and ??? surrogate \xc3\xbc\""));
    ddp_metrics_rec_t p = parse_ok(buf);
    assert_string_equal(p.cause, "bad ? utf8 ? and ??? surrogate \xc3\xbc");

    /* a cause longer than the member: cut at a character boundary, never inside one */
    char line[1200] = "{\"event\":\"generation\",\"step\":1,\"cause\":\"";
    for (int i = 0; i < 300; i++) strcat(line, "\xc3\xbc");
    strcat(line, "\"}");
    p = parse_ok(line);
    assert_int_equal(strlen(p.cause), 254); /* 127 two-byte characters */

    /* a string member filled to its last byte without a NUL is written up to its size */
    memset(r.mode, 'x', sizeof r.mode);
    r.kind = DDP_METRICS_TRANSFER;
    r.has = DDP_MF(MODE);
    assert_int_equal(ddp_metrics_format(&r, buf, sizeof buf, NULL), 0);
    assert_string_equal(buf, "{\"event\":\"state_transfer\",\"mode\":\"xxxxxxxxxxxxxxxx\"}");
}

/* Lines older versions wrote (and the daemon tests' stand-in worker writes) still parse: fewer
 * fields, integers for reals, keys this version does not know, any key order and spacing, an
 * event without a step, an event this version does not know. */
static void test_older_lines(void **state)
{
    (void)state;
    /* c562bd2's step line */
    ddp_metrics_rec_t r = parse_ok("{\"step\":3,\"steps\":10,\"loss\":5.123456,\"lr\":0.0006,"
                                   "\"grad_norm\":1.5,\"tokens_per_s\":1000.0,\"step_ms\":50.00,"
                                   "\"tokens\":4096}\n");
    assert_int_equal(r.kind, DDP_METRICS_STEP);
    assert_int_equal(r.has, DDP_MF(STEP) | DDP_MF(STEPS) | DDP_MF(LOSS) | DDP_MF(LR) |
                                DDP_MF(GRAD_NORM) | DDP_MF(TOKENS_PER_S) | DDP_MF(STEP_MS) |
                                DDP_MF(TOKENS));
    assert_true(r.loss == 5.123456 && r.tokens == 4096);
    assert_line(&r, "{\"step\":3,\"steps\":10,\"loss\":5.123456,\"lr\":0.0006,"
                    "\"grad_norm\":1.5,\"tokens_per_s\":1000.0,\"step_ms\":50.00,"
                    "\"tokens\":4096}");
    /* tests/integration/fake-worker.sh: awk's numbers, integers where reals belong */
    r = parse_ok("{\"step\":2,\"steps\":6,\"loss\":1.66667,\"lr\":0.001,\"grad_norm\":1.0,"
                 "\"tokens_per_s\":1000,\"step_ms\":50}");
    assert_true(r.tokens_per_s == 1000 && r.step_ms == 50 && r.loss == 1.66667);
    r = parse_ok("{\"event\":\"done\",\"final_loss\":0.714286}");
    assert_int_equal(r.kind, DDP_METRICS_DONE);
    assert_int_equal(r.has, DDP_MF(FINAL_LOSS));
    /* 945c4fe's generation event: sync_mb and sync_ms are ignored */
    r = parse_ok("{\"event\":\"generation\",\"generation\":1,\"world\":2,\"step\":5,"
                 "\"cause\":\"rank 1 died\",\"reconfig_ms\":10.5,\"sync_mb\":1.25,"
                 "\"sync_ms\":3.0,\"source\":0}");
    assert_int_equal(r.kind, DDP_METRICS_GENERATION);
    assert_string_equal(r.cause, "rank 1 died");
    assert_int_equal(r.has, DDP_MF(GENERATION) | DDP_MF(WORLD) | DDP_MF(STEP) | DDP_MF(CAUSE) |
                                DDP_MF(RECONFIG_MS) | DDP_MF(SOURCE));
    /* Python's json.dumps (tests/observe/test_plot.sh rewrites lines so) */
    r = parse_ok("{\"loss\": 2.5, \"step\": 4, \"generation\": 1, \"whatever\": [1, {}]}");
    assert_int_equal(r.kind, DDP_METRICS_STEP);
    assert_true(r.step == 4 && r.loss == 2.5 && r.generation == 1);
    /* a newer writer's event */
    r = parse_ok("{\"event\":\"checkpoint\",\"step\":200,\"ms\":12.5,\"path\":\"x\"}");
    assert_int_equal(r.kind, DDP_METRICS_EVENT);
    assert_string_equal(r.event, "checkpoint");
    assert_line(&r, "{\"event\":\"checkpoint\",\"step\":200,\"ms\":12.5}");
    /* a step line with both losses is a step line; val_loss alone makes a validation */
    assert_int_equal(parse_ok("{\"step\":1,\"val_loss\":2,\"loss\":3}").kind, DDP_METRICS_STEP);
    assert_int_equal(parse_ok("{\"val_loss\":2,\"step\":1}").kind, DDP_METRICS_VAL);
    assert_int_equal(parse_ok("  {\"step\":1}  \n").kind, DDP_METRICS_STEP);
    /* a negative zero in a %g field is written as 0, which reads back the same (a "-0" would
     * read back as the integer 0 and format as "0": the line would change on a second pass);
     * in a fixed-point field "-0.000000" reads back as -0.0 */
    r = parse_ok("{\"step\":1,\"lr\":-0e65,\"loss\":-0.0}");
    assert_line(&r, "{\"step\":1,\"loss\":-0.000000,\"lr\":0}");
    ddp_metrics_rec_t again = parse_ok("{\"step\":1,\"loss\":-0.000000,\"lr\":0}");
    assert_line(&again, "{\"step\":1,\"loss\":-0.000000,\"lr\":0}");
}

/* Malformed lines: DDP_EFORMAT, a message naming what is wrong (and the key), *out zeroed. */
static void test_malformed(void **state)
{
    (void)state;
    static const struct {
        const char *line, *msg, *path;
    } bad[] = {
        {"", "not JSON", ""},
        {"\n", "not JSON", ""},
        {"{\"step\":1,\"loss\":nan}", "not JSON", ""}, /* an old writer's NaN loss */
        {"{\"step\":1", "not JSON", ""},
        {"{\"step\":1}{", "not JSON", ""},
        {"{\"step\":1,\"cause\":\"a\\u0000b\"}", "not JSON", ""},
        {"{\"step\":99999999999999999999}", "not JSON", ""},
        {"[1,2]", "an array where a JSON object belongs", ""},
        {"\"step\"", "a string where a JSON object belongs", ""},
        {"3", "an integer where a JSON object belongs", ""},
        {"null", "null where a JSON object belongs", ""},
        {"{}", "neither \"event\" nor \"step\"", ""},
        {"{\"loss\":1.5}", "neither \"event\" nor \"step\"", ""},
        {"{\"step\":\"7\"}", "\"step\" is a string, not an integer", "step"},
        {"{\"step\":7.5}", "\"step\" is a real number, not an integer", "step"},
        {"{\"step\":null}", "\"step\" is null, not an integer", "step"},
        {"{\"step\":1,\"loss\":\"x\"}", "\"loss\" is a string, not a number or null", "loss"},
        {"{\"step\":1,\"loss\":[1]}", "\"loss\" is an array, not a number or null", "loss"},
        {"{\"step\":1,\"loss\":true}", "\"loss\" is a boolean, not a number or null", "loss"},
        {"{\"event\":\"generation\",\"shrunk\":1}", "\"shrunk\" is an integer, not true or false",
         "shrunk"},
        {"{\"event\":\"generation\",\"cause\":{}}", "\"cause\" is an object, not a string",
         "cause"},
        {"{\"event\":7,\"step\":1}", "\"event\" is an integer, not a string", "event"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ddp_metrics_rec_t r;
        memset(&r, 0x5a, sizeof r);
        ddp_errinfo_t ei;
        ddp_errinfo_clear(&ei);
        int rc = ddp_metrics_parse(bad[i].line, strlen(bad[i].line), &r, &ei);
        if (rc != DDP_EFORMAT)
            fail_msg("%s: %s, want DDP_EFORMAT", bad[i].line, ddp_err_name(rc));
        if (strncmp(ei.msg, "metrics line: ", 14) != 0 || !strstr(ei.msg, bad[i].msg))
            fail_msg("%s: message \"%s\", want \"%s\"", bad[i].line, ei.msg, bad[i].msg);
        if (strcmp(ei.path, bad[i].path) != 0)
            fail_msg("%s: path \"%s\", want \"%s\"", bad[i].line, ei.path, bad[i].path);
        ddp_metrics_rec_t zero;
        memset(&zero, 0, sizeof zero);
        assert_memory_equal(&r, &zero, sizeof r);
    }
    /* a syntax error carries jansson's column */
    ddp_errinfo_t ei;
    ddp_metrics_rec_t r;
    assert_int_equal(ddp_metrics_parse("{\"step\":1,,}", 12, &r, &ei), DDP_EFORMAT);
    assert_int_equal(ei.column, 11);
    /* every strict prefix of every golden line is an error, never a crash; NULL ei is fine */
    for (size_t i = 0; i < N_GOLDEN; i++)
        for (size_t n = 0; n < strlen(GOLDEN[i]); n++)
            assert_int_equal(ddp_metrics_parse(GOLDEN[i], n, &r, NULL), DDP_EFORMAT);
    assert_int_equal(ddp_metrics_parse(NULL, 0, &r, NULL), DDP_EFORMAT);
}

/* A buffer too small gives DDP_EINVAL and no partial line; the largest record fits
 * DDP_METRICS_LINE_MAX. */
static void test_buffer(void **state)
{
    (void)state;
    ddp_metrics_rec_t r[N_GOLDEN];
    golden_recs(r);
    char buf[DDP_METRICS_LINE_MAX];
    for (size_t cap = 1; cap <= strlen(GOLDEN[0]); cap++) {
        memset(buf, 'z', sizeof buf);
        assert_int_equal(ddp_metrics_format(&r[0], buf, cap, NULL), DDP_EINVAL);
        assert_int_equal(buf[0], 0);
    }
    size_t n;
    assert_int_equal(ddp_metrics_format(&r[0], buf, strlen(GOLDEN[0]) + 1, &n), 0);
    assert_int_equal(n, strlen(GOLDEN[0]));
    assert_int_equal(ddp_metrics_format(&r[0], buf, 0, NULL), DDP_EINVAL);
    assert_int_equal(ddp_metrics_format(NULL, buf, sizeof buf, NULL), DDP_EINVAL);
    ddp_metrics_rec_t k = r[0];
    k.kind = DDP_METRICS_KINDS;
    assert_int_equal(ddp_metrics_format(&k, buf, sizeof buf, NULL), DDP_EINVAL);

    /* the longest line: every field, every real -DBL_MAX, strings of control characters */
    ddp_metrics_rec_t big;
    ddp_metrics_init(&big, DDP_METRICS_EVENT);
    big.has = ~UINT64_C(0) >> (64 - DDP_MF_COUNT);
    memset(big.event, 1, sizeof big.event - 1);
    memset(big.cause, 1, sizeof big.cause - 1);
    memset(big.mode, 1, sizeof big.mode - 1);
    double *reals[] = {&big.loss, &big.lr, &big.grad_norm, &big.tokens_per_s, &big.step_ms,
                       &big.compute_ms, &big.comm_ms, &big.exposed_comm_ms, &big.hidden,
                       &big.optim_ms, &big.loss_scale, &big.wall_ms, &big.val_loss,
                       &big.reconfig_ms, &big.form_ms, &big.attach_ms, &big.state_ms, &big.mb,
                       &big.ms, &big.mb_per_s, &big.final_loss, &big.mfu};
    for (size_t i = 0; i < sizeof reals / sizeof *reals; i++) *reals[i] = -DBL_MAX;
    big.lr = big.grad_norm = big.loss_scale = -1.79769e+308; /* %g: six digits */
    big.step = big.steps = big.tokens = big.world = big.generation = INT64_MIN;
    assert_int_equal(ddp_metrics_format(&big, buf, sizeof buf, &n), 0);
    ddp_metrics_rec_t back;
    assert_int_equal(ddp_metrics_parse(buf, n, &back, NULL), 0);
    assert_rec_eq(&big, &back);
}

/* Named values ("tokens/<source>", "val_loss/<set>"): written after the fields, integers as
 * integers and losses in %.6f, non-finite as null; read back from any key with a '/'; the
 * longest such line fits DDP_METRICS_LINE_MAX; the (DDP_METRICS_MAX_NAMED + 1)-th is refused. */
static void test_named_values(void **state)
{
    (void)state;
    ddp_metrics_rec_t r, back;
    ddp_metrics_init(&r, DDP_METRICS_VAL);
    r.step = 8;
    r.val_loss = 2.5;
    assert_int_equal(ddp_metrics_add_named(&r, "val_loss", "web", 2.5, false), 0);
    assert_int_equal(ddp_metrics_add_named(&r, "val_loss", "code", NAN, false), 0);
    assert_int_equal(ddp_metrics_add_named(&r, "tokens", "web", 4096, true), 0);
    char buf[DDP_METRICS_LINE_MAX];
    size_t n;
    assert_int_equal(ddp_metrics_format(&r, buf, sizeof buf, &n), 0);
    assert_string_equal(buf, "{\"step\":8,\"val_loss\":2.500000,\"val_loss/web\":2.500000,"
                             "\"val_loss/code\":null,\"tokens/web\":4096}");
    assert_int_equal(ddp_metrics_parse(buf, n, &back, NULL), 0);
    assert_int_equal(back.kind, DDP_METRICS_VAL);
    assert_int_equal(back.n_named, 3);
    assert_string_equal(back.named[0].key, "val_loss/web");
    assert_true(back.named[0].num == 2.5 && !back.named[0].integer);
    assert_true(isnan(back.named[1].num));
    assert_string_equal(back.named[2].key, "tokens/web");
    assert_true(back.named[2].num == 4096 && back.named[2].integer);
    /* a line without them (every older one) has none; a '/' key that is no number is skipped */
    const char *old_line = "{\"step\":3,\"val_loss\":1.000000,\"x/y\":\"s\"}";
    assert_int_equal(ddp_metrics_parse(old_line, strlen(old_line), &back, NULL), 0);
    assert_int_equal(back.n_named, 0);
    /* the longest: every slot, keys of control characters, -DBL_MAX */
    ddp_metrics_rec_t big;
    ddp_metrics_init(&big, DDP_METRICS_STEP);
    for (int i = 0; i < DDP_METRICS_MAX_NAMED; i++) {
        assert_int_equal(ddp_metrics_add_named(&big, "p", "q", -DBL_MAX, false), 0);
        memset(big.named[i].key, 1, sizeof big.named[i].key - 1);
    }
    assert_int_equal(ddp_metrics_add_named(&big, "p", "q", 1, true), DDP_EINVAL);
    assert_int_equal(ddp_metrics_format(&big, buf, sizeof buf, &n), 0);
}

/* values(): the line's fields in its order, reals as the line states them (what the
 * TensorBoard tee gets); to_json(): the line as a JSON object, a merged val_loss last. */
static void test_values_and_json(void **state)
{
    (void)state;
    ddp_metrics_rec_t r[N_GOLDEN];
    golden_recs(r);
    ddp_metrics_value_t v[DDP_MF_COUNT];
    int n = ddp_metrics_values(&r[0], v);
    assert_int_equal(n, 19);
    assert_string_equal(v[0].key, "step");
    assert_string_equal(v[2].key, "loss");
    assert_true(v[2].num == 3.281742); /* not the float 3.2817421f: the line's 6 decimals */
    assert_string_equal(v[17].key, "wall_ms");
    assert_true(v[17].num == 148148.1);
    n = ddp_metrics_values(&r[1], v);
    assert_string_equal(v[4].key, "grad_norm");
    assert_true(isnan(v[4].num));
    n = ddp_metrics_values(&r[6], v);
    assert_string_equal(v[3].key, "cause");
    assert_int_equal(v[3].type, DDP_METRICS_STR);
    assert_ptr_equal(v[3].str, r[6].cause);
    assert_int_equal(v[11].type, DDP_METRICS_BOOL);
    assert_true(v[11].num == 1.0);

    ddp_metrics_rec_t m = r[0];
    m.val_loss = 2.5;
    m.has |= DDP_MF(VAL_LOSS);
    json_t *o = ddp_metrics_to_json(&m);
    assert_non_null(o);
    /* jansson writes reals its own way: compare the keys' order and the values */
    const char *key, *last = NULL;
    json_t *val;
    int i = 0;
    static const char *const keys[] = {"step", "steps", "loss", "lr"};
    json_object_foreach(o, key, val) {
        if (i < 4) assert_string_equal(key, keys[i]);
        last = key;
        i++;
    }
    assert_int_equal(i, 20);
    assert_string_equal(last, "val_loss");
    assert_true(json_is_integer(json_object_get(o, "loss_scale"))); /* "1" in the line */
    assert_true(json_real_value(json_object_get(o, "loss")) == 3.281742);
    assert_true(json_real_value(json_object_get(o, "val_loss")) == 2.5);
    json_decref(o);
    char line[DDP_METRICS_LINE_MAX], want[DDP_METRICS_LINE_MAX];
    snprintf(want, sizeof want, "%.*s,\"val_loss\":2.500000}", (int)strlen(GOLDEN[0]) - 1,
             GOLDEN[0]);
    assert_int_equal(ddp_metrics_format(&m, line, sizeof line, NULL), 0);
    assert_string_equal(line, want);
    assert_string_equal(ddp_metrics_kind_name(DDP_METRICS_TRANSFER), "state_transfer");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden),          cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_strings),         cmocka_unit_test(test_older_lines),
        cmocka_unit_test(test_malformed),       cmocka_unit_test(test_buffer),
        cmocka_unit_test(test_values_and_json), cmocka_unit_test(test_skipped_step),
        cmocka_unit_test(test_named_values),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
