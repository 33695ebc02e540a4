/* Loading a gpt2-mini checkpoint raises peak RSS by less than 10% of the checkpoint's size
 * (one cmocka group). Each measurement runs in a fresh child process and reports VmHWM from
 * /proc/self/status: (1) train one step and save; (2) build the same trainer without resuming
 * and train one step; (3) build it resuming from the checkpoint and train one step. The arenas
 * fill in at first use (zero pages on demand), so each run trains a step and saves, as (1)
 * did, before it is measured: (3) - (2) is what loading costs in peak memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "worker/trainer.h"
#include "tests/unit/proc_status.h"
#include "wc_testutil.h"


/* mode 0: train 1 step and checkpoint; 1: the same again; 2: resume and train step 2. Runs in
 * a child; returns the child's VmHWM (kB), or -1. */
static long run_child(int mode)
{
    int fds[2];
    if (pipe(fds)) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        ddp_spec_t spec;
        ddp_trainer_t t;
        ddp_train_opts_t o = {.backend = "cpu", .quiet = 1, .no_resume = mode != 2,
                               .stop_at_step = mode == 2 ? 2 : 1};
        ddp_errinfo_t ei;
        ddp_errinfo_clear(&ei);
        long out[2] = {-1, -1};
        if (wc_spec(&spec, dir, "gpt2-mini", 1, 16, 2, 1) == 0 &&
            ddp_trainer_init(&t, &spec, &o, &ei) == 0) {
            int resumed = t.pos.step == 1;
            int rc = ddp_trainer_run(&t, NULL, &ei);
            if (rc == 0 && (mode != 2 || resumed)) {
                out[0] = proc_status_kib("VmHWM");
                out[1] = proc_status_kib("VmRSS");
            }
            ddp_trainer_close(&t);
        } else {
            fprintf(stderr, "# child %d: %s\n", mode, ei.msg);
        }
        if (write(fds[1], out, sizeof out) != sizeof out) _exit(1);
        _exit(0);
    }
    close(fds[1]);
    long out[2] = {-1, -1};
    if (read(fds[0], out, sizeof out) != sizeof out) out[0] = -1;
    close(fds[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    return out[0];
}

static void test_load_peak_rss(void **state)
{
    (void)state;
    assert_true(run_child(0) > 0);
    char path[1200];
    long ckpt_bytes = 0;
    const char *files[] = {"model.safetensors", "optim.safetensors"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/ck/step-00000001/%s", dir, files[i]);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        fseek(f, 0, SEEK_END);
        ckpt_bytes += ftell(f);
        fclose(f);
    }
    long fresh = run_child(1), resumed = run_child(2);
    long extra_kb = resumed - fresh, limit_kb = ckpt_bytes / 1024 / 10;
    fprintf(stderr,
            "# checkpoint %.1f MB; peak RSS %.1f MB fresh, %.1f MB resuming: +%.1f MB "
            "(limit %.1f MB = 10%%)\n",
            ckpt_bytes / 1e6, fresh / 1024.0, resumed / 1024.0, extra_kb / 1024.0,
            limit_kb / 1024.0);
    assert_true(fresh > 0);
    assert_true(resumed > 0);
    assert_in_range(extra_kb < 0 ? 0 : extra_kb, 0, limit_kb);
}


int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_load_peak_rss)};
    return cmocka_run_group_tests_name("worker_ckpt_rss", tests, wc_setup, wc_teardown);
}
