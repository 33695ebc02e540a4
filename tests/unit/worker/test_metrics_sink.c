/* Unit tests of rank 0's metrics sink (worker/observe/metrics_sink.h): each record appends exactly the
 * codec's line and a newline to metrics.jsonl, a TensorBoard event file appears beside it, an
 * existing file is appended to, and the last step line is read back through the codec past
 * lines it cannot read (a torn last line, an old writer's nan). TensorBoard's side is checked
 * end to end by tests/observe/test_tensorboard.sh with TensorBoard's own reader.
 *
 * The caps (limits.*): metrics.jsonl and the event files stop before their cap with whole lines
 * and whole records only, counting what an earlier process left, with one warning each and no
 * error for the trainer; and the log's cap (common/log.h), which these warnings go through:
 * under threads the file holds whole lines, at most the cap plus one closing line, which ends
 * it; output written straight to the fds is cut at the next ddp_log_check_limit; a file already
 * full stays as it is. (A real run under the log's cap: test_log_cap.sh.)
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/crc32c.h"
#include "common/log.h"
#include "worker/observe/metrics_sink.h"
#include "worker/observe/tb_events.h"

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

/* ---- capturing what this process logs ---------------------------------------------------- */

static int saved_out = -1, saved_err = -1;

/* Sends fds 1 and 2 to file (one open file, as ddpd does for a rank), appending. */
static void capture(const char *file)
{
    fflush(stdout);
    fflush(stderr);
    saved_out = dup(1);
    saved_err = dup(2);
    int fd = open(file, O_WRONLY | O_CREAT | O_APPEND, 0644);
    assert_true(fd >= 0 && saved_out >= 0 && saved_err >= 0);
    dup2(fd, 1);
    dup2(fd, 2);
    close(fd);
}

/* Gives fds 1 and 2 back and lifts the log's cap. */
static void release(void)
{
    ddp_log_set_limit(0, NULL);
    dup2(saved_out, 1);
    dup2(saved_err, 2);
    close(saved_out);
    close(saved_err);
}

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++) n++;
    return n;
}

static long file_size(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 ? (long)st.st_size : -1;
}

/* The sizes of dir/tb's event files together, each checked to hold whole TFRecords (length,
 * masked CRC of it, payload, masked CRC of that) up to its end; *files gets how many. */
static long tb_bytes_checked(int *files)
{
    char tb[160], f[600];
    snprintf(tb, sizeof tb, "%s/tb", dir);
    DIR *d = opendir(tb);
    assert_non_null(d);
    struct dirent *e;
    long sum = 0;
    *files = 0;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, "events.out.tfevents.", 20)) continue;
        snprintf(f, sizeof f, "%s/%s", tb, e->d_name);
        FILE *fp = fopen(f, "rb");
        assert_non_null(fp);
        static unsigned char buf[1 << 16];
        size_t n = fread(buf, 1, sizeof buf, fp), off = 0;
        fclose(fp);
        while (off < n) {
            uint64_t len = 0;
            uint32_t c1, c2;
            assert_true(off + 12 <= n);
            memcpy(&len, buf + off, 8);
            memcpy(&c1, buf + off + 8, 4);
            assert_int_equal(c1, ddp__tb_mask_crc(ddp_crc32c_update(0, buf + off, 8)));
            assert_true(off + 16 + len <= n);
            memcpy(&c2, buf + off + 12 + len, 4);
            assert_int_equal(c2, ddp__tb_mask_crc(ddp_crc32c_update(0, buf + off + 12, len)));
            off += 16 + len;
        }
        assert_int_equal(off, n);
        sum += (long)n;
        (*files)++;
    }
    closedir(d);
    return sum;
}

/* metrics.jsonl under a cap of three and a half lines: three whole lines, one warning, no error
 * for the trainer; TensorBoard (no cap) goes on; a second sink on the full file adds nothing. */
static void test_metrics_cap(void **state)
{
    (void)state;
    char line[DDP_METRICS_LINE_MAX], logf[160];
    ddp_metrics_rec_t r = step_line(1);
    size_t len = 0;
    assert_int_equal(ddp_metrics_format(&r, line, sizeof line, &len), 0);
    uint64_t cap = 3 * (len + 1) + (len + 1) / 2; /* step lines 1..9 are all as long */
    ddp_metrics_caps_t caps = {.metrics_bytes = cap};
    snprintf(caps.metrics_from, sizeof caps.metrics_from, "limits.metrics_bytes");
    ddp_metrics_sink_set_caps(&caps);
    snprintf(logf, sizeof logf, "%s/rank-0.log", dir);

    capture(logf);
    ddp_metrics_sink_t *s;
    int rc_open = ddp_metrics_sink_open(dir, path, &s), rcs[9];
    for (int i = 0; i < 9; i++) {
        r = step_line(i + 1);
        rcs[i] = ddp_metrics_sink_write(s, &r);
    }
    ddp_metrics_sink_close(s);
    long before = file_size(path);
    int rc_again = ddp_metrics_sink_open(dir, path, &s), rc_w = ddp_metrics_sink_write(s, &r);
    ddp_metrics_sink_close(s);
    release();
    ddp_metrics_sink_set_caps(NULL);

    assert_int_equal(rc_open, 0);
    for (int i = 0; i < 9; i++) assert_int_equal(rcs[i], 0);
    assert_int_equal(rc_again, 0);
    assert_int_equal(rc_w, 0);
    const char *text = slurp(path);
    long size = (long)strlen(text);
    if (size > (long)cap || size != 3 * (long)(len + 1))
        fail_msg("metrics.jsonl is %ld bytes, cap %llu, want 3 lines of %zu", size,
                 (unsigned long long)cap, len + 1);
    assert_int_equal(file_size(path), before); /* the second sink counted the file's size */
    for (const char *p = text; *p;) { /* whole lines the codec reads */
        const char *nl = strchr(p, '\n');
        assert_non_null(nl);
        ddp_metrics_rec_t back;
        assert_int_equal(ddp_metrics_parse(p, (size_t)(nl - p), &back, NULL), 0);
        p = nl + 1;
    }
    int files;
    assert_true(tb_bytes_checked(&files) > 0); /* the tee went on */
    const char *log = slurp(logf);
    char want[300];
    snprintf(want, sizeof want, "the cap of %llu bytes (limits.metrics_bytes) is reached: %s",
             (unsigned long long)cap, path);
    if (count(log, want) != 1) /* once a process, not again by the sink reopened */
        fail_msg("want the warning \"%s\" once, log:\n%s", want, log);
    assert_int_equal(count(log, "metrics.jsonl: "), 1);
}

/* The event files under a cap: whole records only, at most the cap over the directory's files
 * (an earlier run's included), one warning; metrics.jsonl (no cap) gets every line; a sink
 * opened on a directory at its cap creates no file. */
static void test_tensorboard_cap(void **state)
{
    (void)state;
    char logf[160];
    snprintf(logf, sizeof logf, "%s/rank-0.log", dir);
    ddp_metrics_sink_t *s;
    assert_int_equal(ddp_metrics_sink_open(dir, path, &s), 0); /* an earlier run, no cap */
    ddp_metrics_rec_t r = step_line(1);
    assert_int_equal(ddp_metrics_sink_write(s, &r), 0);
    ddp_metrics_sink_close(s);
    int files;
    long earlier = tb_bytes_checked(&files);
    assert_int_equal(files, 1);

    uint64_t cap = (uint64_t)earlier * 5 / 2; /* room for the new file and about a record */
    ddp_metrics_caps_t caps = {.tensorboard_bytes = cap};
    snprintf(caps.tensorboard_from, sizeof caps.tensorboard_from, "the daemon's per-user limit");
    ddp_metrics_sink_set_caps(&caps);
    capture(logf);
    int rc_open = ddp_metrics_sink_open(dir, path, &s), rcs[20];
    for (int i = 0; i < 20; i++) {
        r = step_line(i + 2);
        rcs[i] = ddp_metrics_sink_write(s, &r);
    }
    ddp_metrics_sink_close(s);
    int files_full;
    long full = tb_bytes_checked(&files_full);
    caps.tensorboard_bytes = (uint64_t)full; /* the directory is at its cap exactly */
    ddp_metrics_sink_set_caps(&caps);
    int rc_full = ddp_metrics_sink_open(dir, path, &s);
    assert_true(rc_full == 0 && ddp_metrics_sink_write(s, &r) == 0);
    ddp_metrics_sink_close(s);
    release();
    ddp_metrics_sink_set_caps(NULL);

    assert_int_equal(rc_open, 0);
    for (int i = 0; i < 20; i++) assert_int_equal(rcs[i], 0);
    assert_int_equal(files_full, 2);
    if (full > (long)cap || full <= earlier)
        fail_msg("event files: %ld bytes, cap %llu, earlier %ld", full, (unsigned long long)cap,
                 earlier);
    long after = tb_bytes_checked(&files);
    assert_int_equal(files, 2); /* no new file in a full directory */
    assert_int_equal(after, full);
    assert_int_equal(count(slurp(path), "\n"), 1 + 20 + 1); /* every metrics line */
    const char *log = slurp(logf);
    char want[200];
    snprintf(want, sizeof want, "the cap of %llu bytes on the event files (the daemon's per-user "
             "limit) is reached", (unsigned long long)cap);
    if (count(log, want) != 1) fail_msg("want \"%s\" once, log:\n%s", want, log);
    if (count(log, "are at their cap") != 1) fail_msg("log:\n%s", log); /* new caps: a warning */
}

/* ---- the log's cap ------------------------------------------------------------------------- */

static void *log_lines(void *arg)
{
    for (int k = 0; k < 200; k++) DDP_WARN("thread %d line %d ends here", (int)(intptr_t)arg, k);
    return NULL;
}

static void test_log_cap(void **state)
{
    (void)state;
    char logf[160];
    const uint64_t cap = 4000;
    const char *closing = "log cap of 4000 bytes reached (limits.log_bytes): further output of "
                          "this rank is discarded\n";
    snprintf(logf, sizeof logf, "%s/rank-1.log", dir);

    /* four threads at once: whole lines, the closing line once and last */
    FILE *f = fopen(logf, "w");
    fputs("an earlier process wrote this\n", f);
    fclose(f);
    capture(logf);
    ddp_log_set_limit(cap, "limits.log_bytes");
    pthread_t th[4];
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, log_lines, (void *)(intptr_t)i);
    for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
    ssize_t w = write(1, "stdout after the cap\n", 21); /* fd 1 is the same file: gone too */
    (void)w;
    int closed = ddp_log_check_limit();
    release();
    assert_int_equal(closed, 1);
    const char *text = slurp(logf);
    long size = (long)strlen(text), close_len = 0;
    const char *last = strrchr(text, '\n');
    assert_non_null(last);
    while (last > text && last[-1] != '\n') last--;
    close_len = (long)strlen(last);
    if (size > (long)cap + close_len || !strstr(last, closing) || count(text, closing) != 1)
        fail_msg("log of %ld bytes (cap %llu, closing line %ld):\n%s", size,
                 (unsigned long long)cap, close_len, text);
    assert_true(size > (long)cap - 200); /* it filled up to the cap */
    assert_int_equal(count(text, "stdout after the cap"), 0);
    assert_true(!strncmp(text, "an earlier process wrote this\n", 30));
    int lines = count(text, "\n");
    if (count(text, " ends here\n") != lines - 2) fail_msg("torn lines:\n%s", text);

    /* output straight to fd 2 (a library's) is cut at the next check */
    f = fopen(logf, "w");
    fclose(f);
    capture(logf);
    ddp_log_set_limit(cap, "limits.log_bytes");
    DDP_WARN("before");
    int open_before = ddp_log_check_limit();
    static char blob[5000];
    memset(blob, 'x', sizeof blob - 1);
    blob[sizeof blob - 1] = '\n';
    w = write(2, blob, sizeof blob);
    int closed_now = ddp_log_check_limit();
    DDP_WARN("after");
    w = write(2, blob, sizeof blob);
    release();
    text = slurp(logf);
    assert_int_equal(open_before, 0);
    assert_int_equal(closed_now, 1);
    assert_int_equal(count(text, closing), 1);
    assert_int_equal(count(text, "after"), 0);
    assert_int_equal(file_size(logf), (long)(strlen(text)));
    assert_true(file_size(logf) < 4000 + 5000 + 200);

    /* a file past its cap already (an earlier process closed it) gets nothing more */
    long full = file_size(logf);
    capture(logf);
    ddp_log_set_limit(cap, "limits.log_bytes");
    DDP_ERROR("a new process");
    closed = ddp_log_check_limit();
    release();
    assert_int_equal(closed, 1);
    assert_int_equal(file_size(logf), full);
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
        cmocka_unit_test_setup_teardown(test_metrics_cap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tensorboard_cap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_log_cap, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
