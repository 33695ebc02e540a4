/* Pruning old run directories (see prune.h). */
#include "daemon/prune.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "daemon/store.h"

enum { PASS_MS = 3600 * 1000, MAX_DEPTH = 64 };

typedef struct prune {
    uv_timer_t timer;
    uv_work_t req;
    int busy, closing, handles;
    json_t *dirs; /* the pass's run directories (the work's) */
    int removed, failed;
} prune_t;

static int tree(int parentfd, const char *name, dev_t dev, int depth)
{
    int fd = openat(parentfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return -errno;
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_dev != dev || depth > MAX_DEPTH) {
        close(fd);
        return -EXDEV; /* another filesystem, or deeper than any run directory is */
    }
    DIR *dir = fdopendir(fd);
    if (!dir) {
        close(fd);
        return -errno;
    }
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        struct stat es;
        int r = fstatat(fd, e->d_name, &es, AT_SYMLINK_NOFOLLOW) != 0 ? -errno
                : S_ISDIR(es.st_mode) ? tree(fd, e->d_name, dev, depth + 1)
                : unlinkat(fd, e->d_name, 0) != 0 ? -errno
                                                   : 0;
        if (r && r != -ENOENT && !rc) rc = r;
    }
    closedir(dir);
    if (unlinkat(parentfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT && !rc) rc = -errno;
    return rc;
}

int ddpd_prune_tree(int parentfd, const char *name, dev_t dev) { return tree(parentfd, name, dev, 0); }

/* On the pool: each run directory, its parent (the daemon's base) opened by path. */
static void pass_work(uv_work_t *req)
{
    prune_t *p = req->data;
    size_t i;
    json_t *v;
    json_array_foreach(p->dirs, i, v) {
        const char *path = json_string_value(v);
        const char *slash = path ? strrchr(path, '/') : NULL;
        if (!slash || slash == path) continue;
        char parent[PATH_MAX];
        snprintf(parent, sizeof parent, "%.*s", (int)(slash - path), path);
        int pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        struct stat st;
        if (pfd < 0) continue;
        if (fstatat(pfd, slash + 1, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
            int rc = ddpd_prune_tree(pfd, slash + 1, st.st_dev);
            if (rc) p->failed++;
            else p->removed++;
        }
        close(pfd);
    }
}

static void pass_done(uv_work_t *req, int status)
{
    prune_t *p = req->data;
    (void)status;
    p->busy = 0;
    if (p->removed || p->failed)
        DDP_INFO("prune: removed %d run director%s of jobs ended over runs_keep_days ago%s",
                 p->removed, p->removed == 1 ? "y" : "ies",
                 p->failed ? "; some could not be removed in full" : "");
    json_decref(p->dirs);
    p->dirs = NULL;
    if (p->closing && p->handles == 0) free(p);
}

static void timer_cb(uv_timer_t *t)
{
    ddpd_t *d = t->data;
    prune_t *p = d->prune;
    if (p->busy) return;
    int64_t before = ddp_wall_ms() - (int64_t)(d->cfg.runs_keep_days * 86400e3);
    if (ddpd_store_ended_before(d->store, before, &p->dirs) != 0 || !json_array_size(p->dirs)) {
        json_decref(p->dirs);
        p->dirs = NULL;
        return;
    }
    p->removed = p->failed = 0;
    p->req.data = p;
    if (uv_queue_work(d->loop, &p->req, pass_work, pass_done) == 0) p->busy = 1;
}

void ddpd_prune_start(ddpd_t *d)
{
    if (d->cfg.runs_keep_days <= 0) return;
    prune_t *p = ddp_calloc(1, sizeof *p);
    if (!p) return;
    d->prune = p;
    uv_timer_init(d->loop, &p->timer);
    p->timer.data = d;
    p->handles = 1;
    uv_timer_start(&p->timer, timer_cb, 1000, PASS_MS);
}

static void timer_closed(uv_handle_t *h)
{
    ddpd_t *d = h->data;
    prune_t *p = d->prune;
    d->prune = NULL;
    p->handles = 0;
    if (!p->busy) free(p); /* else pass_done frees it */
}

void ddpd_prune_close(ddpd_t *d)
{
    prune_t *p = d->prune;
    if (!p || p->closing) return;
    p->closing = 1;
    uv_close((uv_handle_t *)&p->timer, timer_closed);
}
