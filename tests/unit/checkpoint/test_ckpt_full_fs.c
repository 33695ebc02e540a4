/* worker/checkpoint on a file system that fills up: a save that fails with ENOSPC leaves nothing
 * behind, the last completed checkpoint stays intact and loadable, and once space is freed the
 * next save (and every one after it) succeeds.
 *
 * The file system is a real one: a tmpfs sized to hold two checkpoints and a little more, mounted
 * in a private mount namespace of this process (nothing outside it sees the mount). Needs root
 * (CAP_SYS_ADMIN); where it is not root or may not mount, the binary prints why and exits 77
 * (meson's skip). The same failure at every write point, without root:
 * test_ckpt_write_faults.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cmocka.h>

#include "ckpt_testutil.h"
#include "worker/checkpoint/checkpoint.h"

static const char *TRAINER = "{\"step\": 1}";
static char mnt[PATH_MAX]; /* the tmpfs */
static uint64_t fs_bytes;  /* its size */
static tstate_t ts[2];     /* alternate steps save different contents */

static int save_and_wait(ddp_ckpt_saver_t *s, int64_t step, ddp_errinfo_t *ei)
{
    ddp_ckpt_state_t st = tu_state(&ts[step % 2], step, TRAINER);
    ddp_errinfo_clear(ei);
    int rc = ddp_ckpt_save(s, &st, ei);
    return rc < 0 ? rc : ddp_ckpt_wait(s, ei);
}

static uint64_t free_bytes(const char *path)
{
    struct statvfs v;
    assert_int_equal(statvfs(path, &v), 0);
    return (uint64_t)v.f_bavail * v.f_frsize;
}

/* The newest verified checkpoint under dir is `step`, `latest` names it, and it loads bitwise. */
static void assert_resumes_from(const char *dir, int64_t step)
{
    ddp_ckpt_found_t f;
    ddp_errinfo_t ei;
    assert_int_equal(ddp_ckpt_find(dir, -1, &f, &ei), 0);
    assert_int_equal(f.step, step);
    char link[PATH_MAX], target[64], want[64];
    snprintf(link, sizeof link, "%s/latest", dir);
    ssize_t n = readlink(link, target, sizeof target - 1);
    assert_true(n > 0);
    target[n] = 0;
    snprintf(want, sizeof want, "step-%08lld", (long long)step);
    assert_string_equal(target, want);
    tstate_t out;
    tu_like(&out, &ts[step % 2]);
    ddp_ckpt_load_t req = {.model = out.model, .n_model = out.n_model};
    assert_int_equal(ddp_ckpt_load(f.path, &req, &ei), 0);
    assert_int_equal(req.step, step);
    free(req.config_json);
    free(req.trainer_json);
    for (size_t i = 0; i < out.n_model; i++)
        if (memcmp(out.model[i].data, ts[step % 2].model[i].data, out.model[i].nbytes))
            fail_msg("step %lld: tensor %s differs", (long long)step, out.model[i].name);
    tu_free(&out);
}

/* Step 1 fits; a ballast file then leaves half a checkpoint free, so step 2 fails with ENOSPC.
 * With the ballast deleted there is room for one checkpoint more, but not for one beside what
 * a failed save kept: step 3 succeeds only if step 2 left nothing. Steps 4 and 5 show it stays
 * so (keep_last 1: each commit retires the one before into .recycle/, which the next one
 * overwrites). */
static void test_enospc_then_space_freed(void **state)
{
    char dir[PATH_MAX + 8], ballast[PATH_MAX + 16], stale[1024];
    snprintf(dir, sizeof dir, "%s/ckpt", mnt);
    snprintf(ballast, sizeof ballast, "%s/ballast", mnt);
    ddp_ckpt_opts_t o = {.dir = dir, .keep_last = 1};
    ddp_ckpt_saver_t *s;
    ddp_errinfo_t ei;
    assert_int_equal(ddp_ckpt_saver_new(&o, &s, &ei), 0);
    assert_int_equal(save_and_wait(s, 1, &ei), 0);
    assert_resumes_from(dir, 1);

    /* leave half a checkpoint's room */
    uint64_t fill = free_bytes(mnt) - ts[0].bytes / 2;
    int fd = open(ballast, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    assert_true(fd >= 0);
    static char zeros[1 << 16];
    for (uint64_t left = fill; left;) {
        size_t k = left < sizeof zeros ? (size_t)left : sizeof zeros;
        ssize_t w = write(fd, zeros, k);
        assert_true(w > 0);
        left -= (uint64_t)w;
    }
    close(fd);
    print_message("# tmpfs %llu KB, checkpoint %llu KB, %llu KB free before step 2\n",
                  (unsigned long long)fs_bytes >> 10, (unsigned long long)ts[0].bytes >> 10,
                  (unsigned long long)free_bytes(mnt) >> 10);

    int saved = tu_capture_begin();
    int rc = save_and_wait(s, 2, &ei);
    char *log = tu_capture_end(saved);
    assert_int_equal(rc, -ENOSPC);
    assert_non_null(strstr(ei.msg, strerror(ENOSPC)));
    /* one error line names the step, the directory and the cause */
    const char *line;
    assert_int_equal(tu_error_lines(log, &line), 1);
    assert_non_null(strstr(line, "checkpoint step 2"));
    assert_non_null(strstr(line, dir));
    assert_non_null(strstr(line, strerror(ENOSPC)));
    free(log);
    assert_resumes_from(dir, 1); /* the last completed checkpoint is untouched */

    assert_int_equal(unlink(ballast), 0);
    rc = save_and_wait(s, 3, &ei);
    if (rc < 0)
        fail_msg("step 3 after space was freed: rc %d (%s): %s; %llu KB free; left in %s: %s", rc,
                 ddp_err_name(rc), ei.msg, (unsigned long long)free_bytes(mnt) >> 10, dir,
                 tu_stale_entries(dir, stale, sizeof stale) ? stale : "nothing stale");
    assert_int_equal(tu_stale_entries(dir, stale, sizeof stale), 0);
    assert_resumes_from(dir, 3);
    for (int64_t step = 4; step <= 5; step++) {
        assert_int_equal(save_and_wait(s, step, &ei), 0);
        assert_resumes_from(dir, step);
    }
    ddp_ckpt_saver_free(s);
    assert_int_equal(tu_stale_entries(dir, stale, sizeof stale), 0);
}

/* A private mount namespace with a tmpfs of `bytes` at a new directory; 0, or -1 with the
 * reason printed (the caller skips). */
static int mount_tmpfs(uint64_t bytes)
{
    if (geteuid() != 0) {
        fprintf(stderr, "checkpoint_full_fs: skipped: mounting a tmpfs needs root\n");
        return -1;
    }
    /* before any thread exists: unshare(CLONE_NEWNS) refuses a process whose threads share it */
    if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) {
        fprintf(stderr, "checkpoint_full_fs: skipped: no private mount namespace: %s\n",
                strerror(errno));
        return -1;
    }
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(mnt, sizeof mnt, "%s/ddp-ckpt-full-XXXXXX", base);
    if (!mkdtemp(mnt)) {
        fprintf(stderr, "checkpoint_full_fs: skipped: mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    char opts[64];
    snprintf(opts, sizeof opts, "size=%lluk,mode=0755", (unsigned long long)(bytes >> 10));
    if (mount("tmpfs", mnt, "tmpfs", MS_NOSUID | MS_NODEV, opts) < 0) {
        fprintf(stderr, "checkpoint_full_fs: skipped: mount -t tmpfs -o %s %s: %s\n", opts, mnt,
                strerror(errno));
        rmdir(mnt);
        return -1;
    }
    return 0;
}

int main(void)
{
    /* ~0.9 MB of model (no optimizer, one shard): two checkpoints and a quarter fit in ~2 MiB;
     * the files beside the shard take a page each */
    tu_make(&ts[0], 256, 64, 64, 4, 0, 1);
    tu_make(&ts[1], 256, 64, 64, 4, 0, 2);
    fs_bytes = (2 * ts[0].bytes + ts[0].bytes / 4 + 4095) / 4096 * 4096;
    if (mount_tmpfs(fs_bytes) < 0) {
        tu_free(&ts[0]);
        tu_free(&ts[1]);
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_enospc_then_space_freed),
    };
    int rc = cmocka_run_group_tests_name("checkpoint_full_fs", tests, NULL, NULL);
    umount2(mnt, MNT_DETACH);
    rmdir(mnt);
    tu_free(&ts[0]);
    tu_free(&ts[1]);
    return rc;
}
