/* Making a save visible: rank 0 merges the writers' manifests, checks every file, and renames
 * the finished temporary directory into step-N (durably: the manifest, the directory, the
 * rename, `latest`, each fsynced in that order), then prunes to keep_last, retiring the newest
 * pruned directory for the next save to write over. A crash at any point leaves the old state
 * or the new one (see checkpoint.c's invariants). Discarding a failed save: its temporary
 * directory is removed at once, never a committed step-N or `latest`.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/file.h"
#include "common/log.h"
#include "manifest_internal.h"
#include "checkpoint_impl.h"

/* Every file rank 0 expects in the finished directory: the shards, config.json, trainer.json,
 * the indexes of sharded kinds, and the further texts of the state. */
static int expected_files(const ddp_ckpt_saver_t *s, const ddp_manifest_t *m, ddp_errinfo_t *ei,
                          const char *tmp)
{
    const char *extra[] = {"config.json", "trainer.json", "model.safetensors.index.json",
                           "optim.safetensors.index.json"};
    int need[4] = {1, 1, s->n_model_shards > 1, s->n_shards - s->n_model_shards > 1};
    for (size_t i = 0; i < s->n_shards + 4 + s->n_texts; i++) {
        size_t x = i - s->n_shards; /* past the shards: extra[], then the further texts */
        const char *f = i < s->n_shards ? s->shards[i].file
                        : x < 4         ? extra[x]
                                        : s->texts[x - 4].name;
        if (i >= s->n_shards && x < 4 && !need[x]) continue;
        const ddp_manifest_entry_t *e = ddp_manifest_find(m, f);
        char path[PATH_MAX];
        struct stat st;
        snprintf(path, sizeof path, "%s/%s", tmp, f);
        if (!e)
            return ddp_errinfo_set(ei, DDP_EFORMAT,
                                   "checkpoint step %lld: %s was not reported by its writer "
                                   "(rank %zu)",
                                   (long long)s->step, f,
                                   i < s->n_shards ? i % (size_t)s->o.writers : 0);
        if (stat(path, &st) < 0 || (uint64_t)st.st_size != e->size)
            return ddp_errinfo_set(ei, DDP_EFORMAT, "checkpoint: %s is missing or not %llu bytes",
                                   path, (unsigned long long)e->size);
    }
    return 0;
}


/* Retires dir/name into RECYCLE (replacing the one there) for the next save to overwrite. */
static int recycle_dir(ddp_ckpt_saver_t *s, const char *name)
{
    char from[PATH_MAX], to[PATH_MAX];
    snprintf(from, sizeof from, "%s/%s", s->dir, name);
    snprintf(to, sizeof to, "%s/" RECYCLE, s->dir);
    int rc = ddp__ckpt_rmdir(s->dir, RECYCLE);
    if (rc == 0 && rename(from, to) < 0) rc = -errno;
    return rc;
}

static void prune(ddp_ckpt_saver_t *s)
{
    ddp__ckpt_remove_stale_tmp(s->dir, s->step);
    if (s->o.keep_last <= 0) return;
    int64_t *steps;
    size_t n;
    if (ddp__ckpt_list_steps(s->dir, &steps, &n) < 0) return;
    size_t keep = (size_t)s->o.keep_last;
    for (size_t i = 0; n > keep && i < n - keep; i++) {
        if (steps[i] == s->step) continue;
        char name[FILE_NAME_MAX];
        snprintf(name, sizeof name, DDP__CKPT_STEP_FMT, (long long)steps[i]);
        bool recycle = s->recycle && i + 1 == n - keep; /* the newest of those retired */
        if (recycle && recycle_dir(s, name) < 0) recycle = false;
        int rc = recycle ? 0 : ddp__ckpt_rmdir(s->dir, name);
        if (rc < 0)
            DDP_WARN("checkpoint: cannot remove %s/%s: %s", s->dir, name, ddp_strerror(rc));
        else
            DDP_INFO("checkpoint: %s %s/%s (keep_last %d)",
                     recycle ? "retired, for the next save to write over:" : "removed", s->dir,
                     name, s->o.keep_last);
    }
    free(steps);
}

int ddp__ckpt_commit(ddp_ckpt_saver_t *s, ddp_errinfo_t *ei)
{
    char tmp[DIR_MAX], final[PATH_MAX], old[PATH_MAX], name[FILE_NAME_MAX];
    ddp__ckpt_tmp_path(s, tmp, sizeof tmp);
    snprintf(name, sizeof name, DDP__CKPT_STEP_FMT, (long long)s->step);
    snprintf(final, sizeof final, "%s/%s", s->dir, name);
    ddp_manifest_t m;
    ddp_manifest_init(&m, s->step);
    int rc = 0;
    for (size_t i = 0; i < s->mine.n; i++)
        DDP_CHECK_GOTO(ddp_manifest_add(&m, s->mine.e[i].name, s->mine.e[i].size,
                                        s->mine.e[i].crc32c),
                       rc, nomem);
    for (int r = 1; r < s->o.writers; r++) {
        char part[PATH_MAX];
        ddp_manifest_t pm;
        snprintf(part, sizeof part, "%s/" DDP__CKPT_PART_FMT, tmp, r);
        rc = ddp_manifest_read(part, &pm, ei);
        if (rc == -ENOENT)
            rc = ddp_errinfo_set(ei, DDP_EFORMAT,
                                 "checkpoint step %lld: %s missing: rank %d did not report its "
                                 "shards",
                                 (long long)s->step, part, r);
        if (rc == 0 && pm.step != s->step) {
            rc = ddp_errinfo_set(ei, DDP_EFORMAT, "%s: for step %lld, not %lld", part,
                                 (long long)pm.step, (long long)s->step);
        }
        for (size_t i = 0; rc == 0 && i < pm.n; i++)
            rc = ddp_manifest_add(&m, pm.e[i].name, pm.e[i].size, pm.e[i].crc32c);
        ddp_manifest_close(&pm);
        if (rc == DDP_ENOMEM) goto nomem;
        if (rc < 0) goto out;
    }
    DDP_CHECK_GOTO(expected_files(s, &m, ei, tmp), rc, out);
    for (int r = 1; r < s->o.writers; r++) {
        char part[PATH_MAX];
        snprintf(part, sizeof part, "%s/" DDP__CKPT_PART_FMT, tmp, r);
        (void)unlink(part);
    }
    DDP_CHECK_GOTO(ddp_manifest_write(&m, tmp, DDP_MANIFEST_NAME, 1, ei), rc, out);
    /* A step directory of the same number (a save repeated after resuming from an older one)
     * is moved aside first: rename(2) does not replace a non-empty directory. */
    snprintf(old, sizeof old, "%s/.step-%08lld.old", s->dir, (long long)s->step);
    struct stat st;
    int replaced = 0;
    if (lstat(final, &st) == 0) {
        (void)ddp__ckpt_rmdir(s->dir, strrchr(old, '/') + 1);
        if (rename(final, old) < 0) {
            rc = -errno;
            ddp_errinfo_set(ei, rc, "%s: cannot move aside: %s", final, strerror(errno));
            goto out;
        }
        replaced = 1;
    }
    if (rename(tmp, final) < 0) {
        rc = -errno;
        ddp_errinfo_set(ei, rc, "%s: cannot rename to %s: %s", tmp, final, strerror(errno));
        /* the step moved aside is a committed checkpoint: it goes back (else the stale-tmp
         * sweep finds it as .old without a step-N and restores it then) */
        if (replaced && rename(old, final) < 0)
            DDP_WARN("checkpoint: cannot move %s back to %s: %s", old, final, strerror(errno));
        goto out;
    }
    DDP_CHECK_GOTO(ddp__fsync_path(s->dir, ei), rc, out);
    DDP_CHECK_GOTO(ddp__ckpt_swap_latest(s->dir, name, ei), rc, out);
    DDP_CHECK_GOTO(ddp__fsync_path(s->dir, ei), rc, out);
    if (replaced) (void)ddp__ckpt_rmdir(s->dir, strrchr(old, '/') + 1);
    s->committed = 1;
    prune(s);
    goto out;
nomem:
    rc = ddp_errinfo_set(ei, DDP_ENOMEM, "checkpoint: out of memory");
out:
    ddp_manifest_close(&m);
    return rc;
}

/* Unlinks dir fd d's `name`, keeping the first failure other than ENOENT (a file the failed
 * save never got to) in *rc. */
static void unlink_in(int d, const char *name, int *rc)
{
    if (unlinkat(d, name, 0) < 0 && errno != ENOENT && *rc == 0) *rc = -errno;
}

/* Unlinks from tmp the files this rank writes in a striped save (as write_mine plans them);
 * returns 0 or the first -errno. */
static int remove_own_files(const ddp_ckpt_saver_t *s, const char *tmp)
{
    static const char *const rank0[] = {"model.safetensors.index.json",
                                        "optim.safetensors.index.json", "config.json",
                                        "trainer.json"};
    int d = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d < 0) return errno == ENOENT ? 0 : -errno;
    int rc = 0;
    for (size_t i = 0; i < s->n_shards; i++)
        if ((int)(i % (size_t)s->o.writers) == s->o.rank) unlink_in(d, s->shards[i].file, &rc);
    if (s->o.rank == 0) {
        for (size_t i = 0; i < sizeof rank0 / sizeof *rank0; i++) unlink_in(d, rank0[i], &rc);
        for (size_t i = 0; i < s->n_texts; i++) unlink_in(d, s->texts[i].name, &rc);
    }
    char part[FILE_NAME_MAX];
    snprintf(part, sizeof part, DDP__CKPT_PART_FMT, s->o.rank);
    unlink_in(d, part, &rc);
    close(d);
    return rc;
}

int ddp__ckpt_discard(ddp_ckpt_saver_t *s, bool whole)
{
    char tmp[DIR_MAX];
    ddp__ckpt_tmp_path(s, tmp, sizeof tmp);
    const char *name = strrchr(tmp, '/') + 1;
    s->cleanup[0] = 0;
    struct stat st;
    if (lstat(tmp, &st) < 0 && errno == ENOENT) return 0; /* nothing written, or committed */
    int rc = whole ? ddp__ckpt_rmdir(s->dir, name) : remove_own_files(s, tmp);
    if (rc < 0)
        snprintf(s->cleanup, sizeof s->cleanup,
                 "could not remove its partial %s (%s): the next save removes it before writing",
                 name, strerror(-rc));
    else
        snprintf(s->cleanup, sizeof s->cleanup, "%s %s",
                 whole ? "removed its partial" : "removed this rank's files from its partial",
                 name);
    return rc;
}

int ddp_ckpt_commit(ddp_ckpt_saver_t *s, ddp_errinfo_t *ei)
{
    if (s->o.rank != 0)
        return ddp_errinfo_set(ei, DDP_EINVAL, "checkpoint: only rank 0 commits");
    int rc = ddp_ckpt_wait(s, ei);
    if (rc < 0) return rc;
    if (s->committed) return 0; /* writers == 1: the thread committed */
    if (s->written_step < 0 || s->written_step != s->step)
        return ddp_errinfo_set(ei, DDP_EINVAL, "checkpoint: nothing written to commit");
    int64_t t0 = ddp_now_ns();
    rc = ddp__ckpt_commit(s, ei);
    if (rc == 0)
        DDP_INFO("checkpoint step %lld committed by rank 0 in %.1f ms (%d writers)",
                 (long long)s->step, (double)(ddp_now_ns() - t0) * 1e-6, s->o.writers);
    /* every writer is done (the caller's barrier): the whole directory can go; the caller logs
     * the error, this says what became of the files */
    if (rc < 0 && ddp__ckpt_discard(s, true) == 0 && s->cleanup[0])
        DDP_INFO("checkpoint step %lld in %s: %s", (long long)s->step, s->dir, s->cleanup);
    else if (rc < 0 && s->cleanup[0])
        DDP_WARN("checkpoint step %lld in %s: %s", (long long)s->step, s->dir, s->cleanup);
    return rc;
}
