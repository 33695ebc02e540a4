/* Checkpoint directory helpers: step directory names, listing, flat removal, mkdir -p, small
 * file reads, stale temporary directories, the `latest` link. */
#include "checkpoint_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/file.h"
#include "common/log.h"

int64_t ddp__ckpt_parse_step(const char *name)
{
    if (strncmp(name, "step-", 5) != 0) return -1;
    const char *p = name + 5;
    if (!*p || strlen(p) > 18) return -1;
    int64_t v = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

int ddp__ckpt_list_steps(const char *dir, int64_t **steps, size_t *n)
{
    *steps = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : -errno;
    size_t cap = 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t s = ddp__ckpt_parse_step(e->d_name);
        if (s < 0) continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode))
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            int64_t *p = ddp_realloc(*steps, cap * sizeof *p);
            if (!p) {
                rc = DDP_ENOMEM;
                break;
            }
            *steps = p;
        }
        (*steps)[(*n)++] = s;
    }
    closedir(d);
    if (rc < 0) {
        free(*steps);
        *steps = NULL;
        *n = 0;
        return rc;
    }
    if (*n) qsort(*steps, *n, sizeof **steps, cmp_i64);
    return 0;
}

int ddp__ckpt_rmdir(const char *dir, const char *name)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    DIR *d = opendir(path);
    if (!d) return errno == ENOENT ? 0 : -errno;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (unlinkat(dirfd(d), e->d_name, 0) < 0 && errno != ENOENT && rc == 0) rc = -errno;
    }
    closedir(d);
    if (rmdir(path) < 0 && errno != ENOENT && rc == 0) rc = -errno;
    return rc;
}

int ddp__ckpt_mkdirs(const char *path, ddp_errinfo_t *ei)
{
    char buf[PATH_MAX];
    if ((size_t)snprintf(buf, sizeof buf, "%s", path) >= sizeof buf)
        return ddp_errinfo_set(ei, DDP_EINVAL, "%s: path too long", path);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (mkdir(buf, 0755) < 0 && errno != EEXIST) {
                int rc = -errno;
                ddp_errinfo_set(ei, rc, "%s: mkdir: %s", buf, strerror(errno));
                ddp_errinfo_path(ei, "%s", buf);
                return rc;
            }
            *p = c;
            if (!c) break;
        }
    }
    return 0;
}

int ddp__ckpt_read_text(const char *path, size_t max, char **out, ddp_errinfo_t *ei)
{
    int rc = ddp_file_read(path, max, out, NULL);
    if (rc == -EFBIG) {
        rc = ddp_errinfo_set(ei, DDP_EFORMAT, "%s: more than %zu bytes", path, max);
    } else if (rc == DDP_ENOMEM) {
        ddp_errinfo_set(ei, rc, "%s: out of memory", path);
    } else if (rc) {
        ddp_errinfo_set(ei, rc, "%s: cannot read: %s", path, strerror(-rc));
        ddp_errinfo_path(ei, "%s", path);
    }
    return rc;
}

void ddp__ckpt_remove_stale_tmp(const char *dir, int64_t below)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char names[64][FILE_NAME_MAX];
    int n = 0;
    while ((e = readdir(d)) && n < 64) {
        long long st;
        char tail[8];
        if (sscanf(e->d_name, ".step-%lld.%7s", &st, tail) == 2 &&
            (!strcmp(tail, "tmp") || !strcmp(tail, "old")) && (below < 0 || st < below) &&
            strlen(e->d_name) < FILE_NAME_MAX)
            snprintf(names[n++], FILE_NAME_MAX, "%s", e->d_name);
    }
    closedir(d);
    for (int i = 0; i < n; i++) {
        /* .step-N.old without a step-N: a committed step-N that a commit moved aside and then
         * failed (or crashed) to replace; it goes back rather than away */
        char step_name[FILE_NAME_MAX], from[PATH_MAX], to[PATH_MAX];
        long long st = -1;
        struct stat sb;
        size_t len = strlen(names[i]);
        if (len > 4 && !strcmp(names[i] + len - 4, ".old") &&
            sscanf(names[i], ".step-%lld.", &st) == 1) {
            snprintf(step_name, sizeof step_name, DDP__CKPT_STEP_FMT, st);
            snprintf(from, sizeof from, "%s/%s", dir, names[i]);
            snprintf(to, sizeof to, "%s/%s", dir, step_name);
            if (lstat(to, &sb) < 0 && errno == ENOENT && rename(from, to) == 0) {
                DDP_WARN("checkpoint: restored %s from %s (a commit that replaced it did not "
                         "finish)",
                         to, names[i]);
                continue;
            }
        }
        DDP_INFO("checkpoint: removing %s/%s (left by an interrupted or failed save)", dir,
                 names[i]);
        int rc = ddp__ckpt_rmdir(dir, names[i]);
        if (rc < 0) DDP_WARN("checkpoint: cannot remove %s/%s: %s", dir, names[i], strerror(-rc));
    }
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/.latest.tmp", dir);
    (void)unlink(p);
}

int ddp__ckpt_swap_latest(const char *dir, const char *target, ddp_errinfo_t *ei)
{
    char tmpl[PATH_MAX], latest[PATH_MAX];
    snprintf(tmpl, sizeof tmpl, "%s/.latest.tmp", dir);
    snprintf(latest, sizeof latest, "%s/latest", dir);
    (void)unlink(tmpl);
    if (symlink(target, tmpl) < 0 || rename(tmpl, latest) < 0) {
        int rc = -errno;
        return ddp_errinfo_set(ei, rc, "%s: cannot point at %s: %s", latest, target,
                               strerror(errno));
    }
    return 0;
}
