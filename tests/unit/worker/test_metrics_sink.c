/* Unit tests of rank 0's metrics sink (worker/metrics_sink.h): each record appends exactly the
 * codec's line and a newline to metrics.jsonl, a TensorBoard event file appears beside it, an
 * existing file is appended to, and the last step line is read back through the codec past
 * lines it cannot read (a torn last line, an old writer's nan). TensorBoard's side is checked
 * end to end by tests/observe/test_tensorboard.sh with TensorBoard's own reader.
 */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "worker/metrics_sink.h"

static char dir[64], path[128];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/ddp-test-sink.XXXXXX");
    if (!mkdtemp(dir)) return -1;
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static char *slurp(const char *p)
{
    FILE *f = fopen(p, "r");
    assert_non_null(f);
    static char buf[65536];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static ddp_metrics_rec_t step_line(long step)
{
    ddp_metrics_rec_t r;
    ddp_metrics_init(&r, DDP_METRICS_STEP);
    r.step = step;
    r.steps = 10;
    r.loss = 2.0 + 0.125 * (double)step;
    r.lr = 6e-4;
    r.grad_norm = 1.5;
    r.world = 2;
    r.straggler = -1;
    r.loss_scale = 1;
    return r;
}

static void test_lines_and_last_step(void **state)
{
    (void)state;
    assert_int_equal(ddp_metrics_sink_last_step(path), -1); /* no file yet */
    ddp_metrics_sink_t *s;
    assert_int_equal(ddp_metrics_sink_open(dir, path, &s), 0);
    ddp_metrics_rec_t recs[4] = {step_line(1), step_line(2), {0}, step_line(3)};
    ddp_metrics_init(&recs[2], DDP_METRICS_GENERATION);
    recs[2].step = 2;
    snprintf(recs[2].cause, sizeof recs[2].cause, "rank 1 \"died\"\n");
    char want[8192] = "", line[DDP_METRICS_LINE_MAX];
    for (int i = 0; i < 4; i++) {
        assert_int_equal(ddp_metrics_sink_write(s, &recs[i]), 0);
        assert_int_equal(ddp_metrics_format(&recs[i], line, sizeof line, NULL), 0);
        strcat(want, line);
        strcat(want, "\n");
    }
    assert_int_equal(ddp_metrics_sink_write(NULL, &recs[0]), 0); /* no sink: nothing */
    ddp_metrics_sink_close(s);
    ddp_metrics_sink_close(NULL);
    assert_string_equal(slurp(path), want);
    assert_int_equal(ddp_metrics_sink_last_step(path), 3);

    /* one event file beside it */
    char tb[160];
    snprintf(tb, sizeof tb, "%s/tb", dir);
    DIR *d = opendir(tb);
    assert_non_null(d);
    struct dirent *e;
    int events = 0;
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, "events.out.tfevents.", 20)) events++;
    closedir(d);
    assert_int_equal(events, 1);

    /* a reopened sink appends; a later step line, then lines the codec cannot read */
    assert_int_equal(ddp_metrics_sink_open(dir, path, &s), 0);
    ddp_metrics_rec_t later = step_line(7);
    assert_int_equal(ddp_metrics_sink_write(s, &later), 0);
    ddp_metrics_sink_close(s);
    FILE *f = fopen(path, "a");
    fputs("{\"step\":9,\"steps\":10,\"loss\":nan}\n{\"step\":8,\"steps\":10,\"lo", f);
    fclose(f);
    assert_int_equal(ddp_metrics_sink_last_step(path), 7);
    assert_non_null(strstr(slurp(path), want)); /* the first lines are still there */
}

static void test_open_fails(void **state)
{
    (void)state;
    ddp_metrics_sink_t *s = (ddp_metrics_sink_t *)1;
    char bad[160];
    snprintf(bad, sizeof bad, "%s/no/such/dir/metrics.jsonl", dir);
    assert_int_equal(ddp_metrics_sink_open(dir, bad, &s), -ENOENT);
    assert_null(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_lines_and_last_step, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_fails, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
