/* train.profile's plan and report (worker/observe/profile.h): which steps a run profiles, and the table
 * and JSON made of a kernels report (a synthetic one, so every figure is known). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>
#include <stdio.h>
#include <unistd.h>

#include "worker/observe/profile.h"

static void expect_plan(long n, long done, long end, long from, long to, long warmup)
{
    ddp_profile_t p;
    ddp_profile_plan(&p, n, done, end);
    if (p.from != from || p.to != to || (to >= from && p.warmup != warmup))
        fail_msg("plan(n %ld, done %ld, end %ld): steps %ld-%ld after %ld, want %ld-%ld after %ld",
                 n, done, end, p.from, p.to, p.warmup, from, to, warmup);
}

static void test_plan(void **state)
{
    expect_plan(2, 0, 5, 3, 4, 2);    /* 2 warm-up steps, then 2 */
    expect_plan(10, 0, 5, 3, 5, 2);   /* the run ends first: the steps it has */
    expect_plan(3, 4, 10, 7, 9, 2);   /* resumed after step 4 */
    expect_plan(2, 0, 2, 2, 2, 1);    /* 2 steps in all: 1 warm-up, 1 profiled */
    expect_plan(2, 0, 1, 1, 1, 0);    /* 1 step: profiled without a warm-up */
    expect_plan(0, 0, 100, 0, -1, 0); /* off */
    expect_plan(5, 7, 7, 0, -1, 0);   /* no step left */
}

/* A window of 2 steps, 10 ms wall: matmul_fwd 6 ms, sync 0 ms on the stream but 1 ms of
 * host wait, gelu_fwd 2 ms. */
static void report(ddp_kprof_report_t *r, ddp_profile_info_t *in)
{
    memset(r, 0, sizeof *r);
    r->wall_ms = 10;
    r->stream_marks = 1;
    r->op[DDP_KOP_matmul_fwd] = (ddp_kprof_stat_t){.calls = 4, .ms = 6, .host_ms = 0.5,
                                                   .bytes = 3e9, .flops = 6e12};
    r->op[DDP_KOP_gelu_fwd] = (ddp_kprof_stat_t){.calls = 2, .ms = 2, .host_ms = 0.1,
                                                 .bytes = 1e8};
    r->op[DDP_KOP_sync] = (ddp_kprof_stat_t){.calls = 3, .ms = 0, .host_ms = 1};
    *in = (ddp_profile_info_t){.rank = 1, .backend = "sim", .from = 3, .to = 4, .warmup = 2,
                               .asked = 2, .comm_ms = 4, .exposed_ms = 1, .step_ms = 10.2};
}

static void test_text(void **state)
{
    ddp_kprof_report_t r;
    ddp_profile_info_t in;
    report(&r, &in);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ddp_profile_write_text(f, &r, &in);
    fclose(f);
    const char *mm = strstr(text, "\nmatmul_fwd "), *ge = strstr(text, "\ngelu_fwd ");
    const char *sy = strstr(text, "\nsync "), *tot = strstr(text, "\ntotal ");
    if (!mm || !ge || !sy || !tot || !(mm < ge && ge < sy && sy < tot))
        fail_msg("rows missing or not sorted by time:\n%s", text);
    /* matmul_fwd: 4 calls, 6 ms, 60% of the window, 3000 MB, 6000 GFLOP, 500 GB/s, 1000
     * TFLOP/s */
    char want[200];
    snprintf(want, sizeof want, "%-16s %7s %10.3f %6.1f%% %10.3f %10s %9s %8s %8s", "matmul_fwd",
             "4", 6.0, 60.0, 0.5, "3000.00", "6000.000", "500.00", "1000.000");
    if (!strstr(text, want)) fail_msg("want the row\n%s\nin\n%s", want, text);
    if (!strstr(text, "rank 1, sim kernels: steps 3-4 (2 steps after 2 warm-up), 5.000 ms per "
                      "step"))
        fail_msg("header:\n%s", text);
    if (!strstr(text, "sync: 3 calls, the host waited 1.000 ms in them (10.0%)"))
        fail_msg("sync line:\n%s", text);
    double rest_ms = 0, rest_share = 0, rest_host = 0;
    const char *rest = strstr(text, "\n(not in any op)");
    if (!rest || sscanf(rest, "\n(not in any op) %lf %lf%% %lf", &rest_ms, &rest_share,
                        &rest_host) != 3 ||
        rest_ms != 2.0 || rest_share != 20.0 || rest_host != 8.4)
        fail_msg("want the time in no op: 2 ms, 20%%, 8.4 ms of the host's:\n%s", text);
    free(text);
}

static void test_json(void **state)
{
    ddp_kprof_report_t r;
    ddp_profile_info_t in;
    report(&r, &in);
    json_t *j = ddp_profile_json(&r, &in);
    assert_non_null(j);
    json_t *ops = json_object_get(j, "ops");
    assert_int_equal(json_array_size(ops), 3);
    json_t *mm = json_array_get(ops, 0);
    assert_string_equal(json_string_value(json_object_get(mm, "op")), "matmul_fwd");
    assert_int_equal(json_integer_value(json_object_get(mm, "calls")), 4);
    assert_true(json_real_value(json_object_get(mm, "tflop_per_s")) == 1000.0);
    assert_true(json_real_value(json_object_get(mm, "share")) == 0.6);
    json_t *sync = json_array_get(ops, 2);
    assert_true(json_is_null(json_object_get(sync, "bytes")));
    assert_true(json_real_value(json_object_get(j, "not_in_any_op_ms")) == 2.0);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "syncs"), "calls")),
                     3);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "steps"), "count")),
                     2);
    assert_true(json_real_value(json_object_get(j, "step_ms")) == 5.0);
    assert_true(json_is_null(json_object_get(j, "incomplete")));
    json_decref(j);
    r.err = DDP_ENOMEM; /* a mark was lost: the report says so */
    j = ddp_profile_json(&r, &in);
    assert_string_equal(json_string_value(json_object_get(j, "incomplete")),
                        ddp_strerror(DDP_ENOMEM));
    json_decref(j);
}

/* The trainer's side on the CPU backend: a 1-step run profiles step 1 without a warm-up, the
 * window opens before it and closes after it, and the files appear in the run directory; an
 * unwritable run directory is only a warning. */
static void test_window(void **state)
{
    char dir[] = "/tmp/ddp-test-profile-XXXXXX";
    assert_non_null(mkdtemp(dir));
    const char *dirs[] = {dir, "/proc/no-such-dir/run"};
    for (int d = 0; d < 2; d++) {
        ddp_kernels_t k;
        assert_int_equal(ddp_kernels_open(&k, "cpu", 0, 1), 0);
        ddp_profile_t p;
        ddp_profile_plan(&p, 3, 0, 1);
        assert_int_equal(p.from, 1);
        assert_int_equal(p.to, 1);
        float x[8] = {0};
        DDP_K(&k, scale, x, 2.0f, 8); /* before the window */
        assert_int_equal(ddp_profile_before_step(&p, &k, 1), 0);
        assert_int_equal(p.open, 1);
        DDP_K(&k, scale, x, 2.0f, 8);
        DDP_K(&k, add, x, x, 8);
        assert_int_equal(ddp_profile_after_step(&p, &k, 1, 1.0, 0, 0, dirs[d], 3), 0);
        assert_int_equal(p.open, 0);
        ddp_kernels_close(&k);
    }
    char path[200];
    snprintf(path, sizeof path, "%s/profile-rank3.json", dir);
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    if (!j) fail_msg("%s: %s", path, jerr.text);
    json_t *ops = json_object_get(j, "ops");
    assert_int_equal(json_array_size(ops), 2); /* scale and add, once each */
    for (size_t i = 0; i < 2; i++)
        assert_int_equal(json_integer_value(json_object_get(json_array_get(ops, i), "calls")), 1);
    assert_int_equal(json_integer_value(json_object_get(j, "rank")), 3);
    json_decref(j);
    snprintf(path, sizeof path, "%s/profile-rank3.txt", dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[300];
    assert_non_null(fgets(line, sizeof line, f));
    if (!strstr(line, "per-op profile, rank 3, cpu kernels: steps 1-1 (1 step after 0 warm-up; "
                      "the run has no more)"))
        fail_msg("header: %s", line);
    fclose(f);
    unlink(path);
    snprintf(path, sizeof path, "%s/profile-rank3.json", dir);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan),
        cmocka_unit_test(test_text),
        cmocka_unit_test(test_json),
        cmocka_unit_test(test_window),
    };
    return cmocka_run_group_tests_name("profile", tests, NULL, NULL);
}
