/* worker/checkpoint under failing writes: fail the k-th write (or fsync) of a save, k = 1, 2, ...
 * until one save gets through, and after each failure check that the save returned the injected
 * error, left no .step-*.tmp behind, did not touch the last completed checkpoint (it still
 * resumes, bitwise), and that the next save succeeds. Then: a failure whose own clean-up fails
 * too (the save after it clears the leftover before it writes anything); a repeated step whose
 * commit cannot rename (the committed step it was to replace is kept); striped writers (a
 * failed writer removes its own files, a failed commit the whole directory).
 *
 * The faults come from this binary's own write(2), pwrite64(2), fsync(2), fdatasync(2),
 * unlinkat(2), rmdir(2) and rename(2), which the linker binds ahead of the C library's for the
 * checkpoint code (a static library here): while armed they fail calls on files under the
 * test's directory and pass everything else (the log on stderr included) to the kernel.
 * io_uring writes do not come through them, so the test turns io_uring off. The same failure
 * on a real full file system: test_ckpt_full_fs.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmocka.h>
#include <dirent.h>

#include "ckpt_testutil.h"
#include "worker/checkpoint/checkpoint.h"

/* ---------------------------------------------------------------- the faults */

enum { F_WRITE, F_SYNC };
static char fault_dir[PATH_MAX];
static size_t fault_dir_len;
static atomic_int armed = -1; /* F_WRITE, F_SYNC, or -1 */
static atomic_long fail_at;   /* fail the fail_at-th call of the armed kind */
static atomic_long seen;      /* calls of the armed kind under fault_dir so far */
static atomic_int fail_errno;
static atomic_bool fired;
static atomic_int removal_errno;    /* non-zero: removals under fault_dir fail with it */
static atomic_bool fail_tmp_rename; /* the commit's rename of .step-N.tmp fails (EIO) */
static atomic_bool fail_old_rename; /* so does any rename of a .step-N.old */

static bool under_fault_dir(const char *path)
{
    return fault_dir_len && !strncmp(path, fault_dir, fault_dir_len) &&
           (path[fault_dir_len] == '/' || path[fault_dir_len] == 0);
}

static bool fd_under_fault_dir(int fd)
{
    char link[64], target[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n <= 0) return false;
    target[n] = 0;
    return under_fault_dir(target);
}

/* Whether this call (of `kind`, on fd) is the one to fail; sets errno when it is. */
static bool inject(int kind, int fd)
{
    if (atomic_load(&armed) != kind || !fd_under_fault_dir(fd)) return false;
    if (atomic_fetch_add(&seen, 1) + 1 != atomic_load(&fail_at)) return false;
    atomic_store(&fired, true);
    errno = atomic_load(&fail_errno);
    return true;
}

ssize_t write(int fd, const void *p, size_t n)
{
    return inject(F_WRITE, fd) ? -1 : syscall(SYS_write, fd, p, n);
}

ssize_t pwrite64(int fd, const void *p, size_t n, off_t off)
{
    return inject(F_WRITE, fd) ? -1 : syscall(SYS_pwrite64, fd, p, n, off);
}

int fsync(int fd) { return inject(F_SYNC, fd) ? -1 : (int)syscall(SYS_fsync, fd); }

int fdatasync(int fd) { return inject(F_SYNC, fd) ? -1 : (int)syscall(SYS_fdatasync, fd); }

static bool refuse_removal(int dirfd, const char *path)
{
    int e = atomic_load(&removal_errno);
    if (!e) return false;
    bool under = path[0] == '/' ? under_fault_dir(path) : fd_under_fault_dir(dirfd);
    if (under) errno = e;
    return under;
}

int unlinkat(int dirfd, const char *path, int flags)
{
    return refuse_removal(dirfd, path) ? -1 : (int)syscall(SYS_unlinkat, dirfd, path, flags);
}

int rmdir(const char *path)
{
    return refuse_removal(AT_FDCWD, path)
               ? -1
               : (int)syscall(SYS_unlinkat, AT_FDCWD, path, AT_REMOVEDIR);
}

static bool ends_with(const char *s, const char *tail)
{
    size_t a = strlen(s), b = strlen(tail);
    return a >= b && !strcmp(s + a - b, tail);
}

int rename(const char *from, const char *to)
{
    const char *base = strrchr(from, '/') ? strrchr(from, '/') + 1 : from;
    if (under_fault_dir(from) && !strncmp(base, ".step-", 6) &&
        ((atomic_load(&fail_tmp_rename) && ends_with(base, ".tmp")) ||
         (atomic_load(&fail_old_rename) && ends_with(base, ".old")))) {
        errno = EIO;
        return -1;
    }
    return renameat(AT_FDCWD, from, AT_FDCWD, to);
}

static void arm(int kind, long k, int err)
{
    atomic_store(&seen, 0);
    atomic_store(&fail_at, k);
    atomic_store(&fail_errno, err);
    atomic_store(&fired, false);
    atomic_store(&armed, kind);
}

/* Disarms; returns whether the armed call failed. */
static bool disarm(void)
{
    atomic_store(&armed, -1);
    return atomic_load(&fired);
}

/* ---------------------------------------------------------------- helpers */

static const char *TRAINER = "{\"step\": 1}";
static tstate_t ts[2]; /* odd and even steps save different contents */

/* Saves ts[which] as `step` and waits for it. */
static int save_as(ddp_ckpt_saver_t *s, int64_t step, int which, ddp_errinfo_t *ei)
{
    ddp_ckpt_text_t gen = {"generation_config.json", "{\"do_sample\": false}"};
    ddp_ckpt_state_t st = tu_state(&ts[which], step, TRAINER);
    st.texts = &gen;
    st.n_texts = 1;
    ddp_errinfo_clear(ei);
    int rc = ddp_ckpt_save(s, &st, ei);
    return rc < 0 ? rc : ddp_ckpt_wait(s, ei);
}

static int save_and_wait(ddp_ckpt_saver_t *s, int64_t step, ddp_errinfo_t *ei)
{
    return save_as(s, step, (int)(step % 2), ei);
}

/* The newest verified checkpoint under dir is `step`, `latest` names a checkpoint that verifies,
 * and `step` loads bitwise. */
static void assert_resumes_from(const char *dir, int64_t step)
{
    ddp_ckpt_found_t f;
    ddp_errinfo_t ei;
    assert_int_equal(ddp_ckpt_find(dir, -1, &f, &ei), 0);
    assert_int_equal(f.step, step);
    char latest[PATH_MAX];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    assert_int_equal(ddp_ckpt_verify(latest, &ei), 0);
    const tstate_t *ref = &ts[step % 2];
    tstate_t out;
    tu_like(&out, ref);
    ddp_ckpt_load_t req = {
        .model = out.model, .n_model = out.n_model, .optim = out.optim, .n_optim = out.n_optim};
    assert_int_equal(ddp_ckpt_load(f.path, &req, &ei), 0);
    assert_int_equal(req.step, step);
    free(req.config_json);
    free(req.trainer_json);
    tu_assert_same_state(&out, ref);
    tu_free(&out);
}

static void assert_nothing_stale(const char *dir, const char *when)
{
    char stale[1024];
    if (tu_stale_entries(dir, stale, sizeof stale))
        fail_msg("%s: left in %s: %s", when, dir, stale);
}

/* The log between tu_capture_begin and _end has one error line, and it names the step, the
 * directory and the cause (and `also`, when not NULL). */
static void assert_one_error_line(char *log, int64_t step, const char *dir, int err,
                                  const char *also)
{
    const char *line;
    assert_int_equal(tu_error_lines(log, &line), 1);
    char want[64];
    snprintf(want, sizeof want, "checkpoint step %lld ", (long long)step);
    if (!strstr(line, want) || !strstr(line, dir) || !strstr(line, strerror(err)) ||
        (also && !strstr(line, also)))
        fail_msg("the error line does not name step %lld, %s, \"%s\"%s%s: %s", (long long)step, dir,
                 strerror(err), also ? " and " : "", also ? also : "", line);
}

/* A saver over a fresh directory, keep_last 1, small shards (several shards and an index per
 * kind: many write points), with two checkpoints done, so that .recycle/ holds the older one
 * and the saves under test write over retired files. */
static ddp_ckpt_saver_t *start(char **dir)
{
    *dir = tu_tmpdir();
    snprintf(fault_dir, sizeof fault_dir, "%s", *dir);
    fault_dir_len = strlen(fault_dir);
    ddp_ckpt_opts_t o = {.dir = *dir, .shard_mb = 0.006, .keep_last = 1};
    ddp_ckpt_saver_t *s;
    ddp_errinfo_t ei;
    assert_int_equal(ddp_ckpt_saver_new(&o, &s, &ei), 0);
    for (int64_t step = 1; step <= 2; step++) assert_int_equal(save_and_wait(s, step, &ei), 0);
    assert_resumes_from(*dir, 2);
    return s;
}

static void finish(ddp_ckpt_saver_t *s, char *dir)
{
    ddp_ckpt_saver_free(s);
    assert_nothing_stale(dir, "after the saver was freed");
    fault_dir_len = 0;
    tu_rmrf(dir);
    free(dir);
}

/* ---------------------------------------------------------------- tests */

/* Fails the k-th call of `kind` with `err` in a save, for k = 1, 2, ... until a save gets
 * through; after each failure the next save (nothing injected) must succeed. */
static void each_point(int kind, int err)
{
    char *dir;
    ddp_ckpt_saver_t *s = start(&dir);
    ddp_errinfo_t ei;
    int64_t good = 2, step = 3;
    long k;
    bool through = false;
    for (k = 1; k <= 2000 && !through; k++) {
        arm(kind, k, err);
        int saved = k == 1 ? tu_capture_begin() : -1;
        int rc = save_and_wait(s, step, &ei);
        char *log = saved >= 0 ? tu_capture_end(saved) : NULL;
        if (!disarm()) {
            assert_int_equal(rc, 0);
            free(log);
            through = true;
            break;
        }
        if (rc != -err)
            fail_msg("%s %ld failed with %s; the save returned %d (%s): %s",
                     kind == F_WRITE ? "write" : "fsync", k, strerror(err), rc, ddp_err_name(rc),
                     ei.msg);
        if (log) assert_one_error_line(log, step, dir, err, NULL);
        free(log);
        char when[96];
        snprintf(when, sizeof when, "after %s %ld of step %lld failed",
                 kind == F_WRITE ? "write" : "fsync", k, (long long)step);
        assert_nothing_stale(dir, when);
        /* an fsync of the parent after the rename may fail: the step is then complete */
        ddp_ckpt_found_t f;
        assert_int_equal(ddp_ckpt_find(dir, -1, &f, &ei), 0);
        if (kind == F_SYNC && f.step == step) good = step;
        assert_resumes_from(dir, good);
        assert_int_equal(save_and_wait(s, step + 1, &ei), 0);
        assert_nothing_stale(dir, "after the next save");
        assert_resumes_from(dir, step + 1);
        good = step + 1;
        step += 2;
    }
    assert_true(through);
    print_message("# %ld %s failures (%s), one at each point of a save: each clean, each "
                  "followed by a good save\n",
                  k - 1, kind == F_WRITE ? "write" : "fsync", strerror(err));
    finish(s, dir);
}

static void test_enospc_at_each_write(void **state) { each_point(F_WRITE, ENOSPC); }

static void test_edquot_at_each_write(void **state) { each_point(F_WRITE, EDQUOT); }

static void test_eio_at_each_fsync(void **state) { each_point(F_SYNC, EIO); }

/* The failed save cannot remove its .tmp either: the error says so (naming the removal's
 * cause), and the next save removes it before writing (a save failing at its first write shows
 * that), so a full disk does not stay full of failed attempts. */
static void test_cleanup_fails_too(void **state)
{
    char *dir, tmp[64];
    ddp_ckpt_saver_t *s = start(&dir);
    ddp_errinfo_t ei;
    atomic_store(&removal_errno, EIO);
    arm(F_WRITE, 3, ENOSPC);
    int saved = tu_capture_begin();
    int rc = save_and_wait(s, 3, &ei);
    char *log = tu_capture_end(saved);
    assert_true(disarm());
    atomic_store(&removal_errno, 0);
    assert_int_equal(rc, -ENOSPC);
    assert_one_error_line(log, 3, dir, ENOSPC, strerror(EIO));
    snprintf(tmp, sizeof tmp, ".step-%08d.tmp", 3);
    free(log);
    char stale[1024];
    assert_int_equal(tu_stale_entries(dir, stale, sizeof stale), 1);
    assert_string_equal(stale, tmp);
    assert_resumes_from(dir, 2);

    arm(F_WRITE, 1, ENOSPC);
    assert_int_equal(save_and_wait(s, 4, &ei), -ENOSPC);
    assert_true(disarm());
    assert_nothing_stale(dir, "after a save failed at its first write");
    assert_resumes_from(dir, 2);
    assert_int_equal(save_and_wait(s, 5, &ei), 0);
    assert_resumes_from(dir, 5);
    finish(s, dir);
}

static bool exists(const char *dir, const char *name)
{
    char path[PATH_MAX];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return lstat(path, &st) == 0;
}

/* Saving a step again (after resuming from an older one) moves the committed step-N aside to
 * .step-N.old before renaming the new one in. When that rename fails, step-N goes back; when
 * moving it back fails too, the next sweep (here a new saver's) renames .step-N.old back to
 * step-N rather than deleting it: a committed checkpoint is never lost to a failed save. */
static void test_same_step_rename_fails(void **state)
{
    char *dir;
    ddp_ckpt_saver_t *s = start(&dir); /* step-2 holds ts[0] */
    ddp_errinfo_t ei;
    atomic_store(&fail_tmp_rename, true);
    assert_int_equal(save_as(s, 2, 1, &ei), -EIO);
    atomic_store(&fail_tmp_rename, false);
    assert_resumes_from(dir, 2);
    assert_false(exists(dir, ".step-00000002.old"));
    assert_nothing_stale(dir, "after the rename failed");

    atomic_store(&fail_tmp_rename, true);
    atomic_store(&fail_old_rename, true);
    assert_int_equal(save_as(s, 2, 1, &ei), -EIO);
    atomic_store(&fail_tmp_rename, false);
    atomic_store(&fail_old_rename, false);
    assert_true(exists(dir, ".step-00000002.old"));
    assert_false(exists(dir, "step-00000002"));
    ddp_ckpt_saver_free(s);
    ddp_ckpt_opts_t o = {.dir = dir, .shard_mb = 0.006, .keep_last = 1};
    assert_int_equal(ddp_ckpt_saver_new(&o, &s, &ei), 0);
    assert_false(exists(dir, ".step-00000002.old"));
    assert_resumes_from(dir, 2);
    assert_int_equal(save_as(s, 2, 1, &ei), 0); /* and the repeated save goes through now */
    assert_false(exists(dir, ".step-00000002.old"));
    ddp_ckpt_found_t f;
    assert_int_equal(ddp_ckpt_find(dir, -1, &f, &ei), 0);
    assert_int_equal(f.step, 2);
    finish(s, dir);
}

/* Files of dir/sub whose names end in `tail` (0 when sub is missing). */
static int count_files(const char *dir, const char *sub, const char *tail)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, sub);
    DIR *d = opendir(path);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) n += e->d_name[0] != '.' && ends_with(e->d_name, tail);
    if (d) closedir(d);
    return n;
}

/* Striped writers (two savers in this process): a writer whose write fails removes only its own
 * files (the other rank may still be writing its own); rank 0's next save removes what is
 * left of the failed step before writing; a commit that fails removes the whole directory
 * (every writer is done by then). */
static void test_striped_failures(void **state)
{
    char *dir = tu_tmpdir();
    snprintf(fault_dir, sizeof fault_dir, "%s", dir);
    fault_dir_len = strlen(fault_dir);
    ddp_ckpt_saver_t *s[2];
    ddp_errinfo_t ei;
    for (int r = 0; r < 2; r++) {
        ddp_ckpt_opts_t o = {.dir = dir, .shard_mb = 0.006, .writers = 2, .rank = r};
        assert_int_equal(ddp_ckpt_saver_new(&o, &s[r], &ei), 0);
    }
    for (int r = 0; r < 2; r++) assert_int_equal(save_as(s[r], 1, 1, &ei), 0);
    assert_int_equal(ddp_ckpt_commit(s[0], &ei), 0);
    assert_resumes_from(dir, 1);

    /* rank 1 fails at its second write; rank 0 writes its part */
    arm(F_WRITE, 2, ENOSPC);
    assert_int_equal(save_as(s[1], 2, 0, &ei), -ENOSPC);
    assert_true(disarm());
    assert_int_equal(save_as(s[0], 2, 0, &ei), 0);
    int shards = count_files(dir, ".step-00000002.tmp", ".safetensors");
    assert_true(shards > 0); /* rank 0's */
    assert_int_equal(count_files(dir, ".step-00000002.tmp", ".part-00001.json"), 0);
    char name[64];
    for (int i = 1; i < 3; i++) { /* rank 1 writes every second shard: none is left */
        snprintf(name, sizeof name, ".step-00000002.tmp/model-%05d-of-00004.safetensors", 2 * i);
        assert_false(exists(dir, name));
    }
    /* ... the step is not committed (the writers' vote); the next one goes through */
    for (int r = 0; r < 2; r++) assert_int_equal(save_as(s[r], 3, 1, &ei), 0);
    assert_false(exists(dir, ".step-00000002.tmp"));
    assert_int_equal(ddp_ckpt_commit(s[0], &ei), 0);
    assert_resumes_from(dir, 3);
    assert_nothing_stale(dir, "after a striped save following a failed one");

    /* the commit's first write is the manifest's */
    for (int r = 0; r < 2; r++) assert_int_equal(save_as(s[r], 4, 0, &ei), 0);
    arm(F_WRITE, 1, ENOSPC);
    assert_int_equal(ddp_ckpt_commit(s[0], &ei), -ENOSPC);
    assert_true(disarm());
    assert_nothing_stale(dir, "after a failed commit");
    assert_resumes_from(dir, 3);
    for (int r = 0; r < 2; r++) assert_int_equal(save_as(s[r], 5, 1, &ei), 0);
    assert_int_equal(ddp_ckpt_commit(s[0], &ei), 0);
    assert_resumes_from(dir, 5);
    for (int r = 0; r < 2; r++) ddp_ckpt_saver_free(s[r]);
    fault_dir_len = 0;
    tu_rmrf(dir);
    free(dir);
}

int main(void)
{
    setenv("DDP_CKPT_URING", "0", 1); /* its writes bypass write(2)/pwrite(2) */
    tu_make(&ts[0], 64, 16, 16, 1, 1, 1);
    tu_make(&ts[1], 64, 16, 16, 1, 1, 2);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_enospc_at_each_write),   cmocka_unit_test(test_edquot_at_each_write),
        cmocka_unit_test(test_eio_at_each_fsync),      cmocka_unit_test(test_cleanup_fails_too),
        cmocka_unit_test(test_same_step_rename_fails), cmocka_unit_test(test_striped_failures),
    };
    int rc = cmocka_run_group_tests_name("checkpoint_write_faults", tests, NULL, NULL);
    tu_free(&ts[0]);
    tu_free(&ts[1]);
    return rc;
}
