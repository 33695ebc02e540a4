/* Checkpoint saving: host snapshot, shard plan, writer thread, striped parts, atomic commit,
 * `latest`, pruning. Loading lives in checkpoint_load.c. See checkpoint.h for the layout.
 *
 * Invariants:
 * - The writer thread reads the snapshot, or (a live save, ddp_ckpt_save_live) the caller's
 *   tensors themselves until the caller freezes them. The training thread does not touch the
 *   snapshot, the plan or `mine` while a writer thread exists (it joins it first), so they need
 *   no lock; `done` and the live-source fields under `mu` are what both threads touch while it
 *   runs.
 * - Live saves: the writer consumes this rank's shards in ascending stream offset; it reads the
 *   caller's memory only for a chunk it claimed (`inflight`) while `live`, and records how far
 *   it got (`consumed`). ddp_ckpt_freeze waits for the chunk in flight, copies every byte of
 *   this rank's shards at or after `consumed` into the snapshot at its stream offset and clears
 *   `live`, all under `mu`; from then on the writer reads the snapshot. So every byte is read
 *   either before the freeze from the tensors, or after it from a copy made at the freeze:
 *   the file holds the values of the save's step.
 * - Nothing becomes visible as step-N/ before every file in it and its manifest are durable:
 *   files are fsynced, then MANIFEST.json, then the tmp directory, then the rename, then the
 *   parent. A crash at any point leaves either the old state or the new one, plus a .tmp
 *   directory that the next saver (rank 0) or commit removes.
 */
#include "checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint_internal.h"
#include "checkpoint_impl.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/crc32c.h"
#include "common/file.h"
#include "common/log.h"
#include "common/test_hook.h" /* DDP_TEST_CKPT_SHARD_DELAY_MS */
#include "common/trace.h"
#include "dio.h"
#include "uring.h"
#include "manifest.h"
#include "manifest_internal.h"

static const char *const st_meta[] = {"format", "pt"};

char *ddp_ckpt_optim_name(char *buf, size_t len, const char *moment, const char *param)
{
    if ((size_t)snprintf(buf, len, "%s.%s", moment, param) >= len) return NULL;
    return buf;
}

static void *default_alloc(size_t n, void *ctx)
{
    return ddp_alloc_big(n);
}

static void default_free(void *p, void *ctx) { free(p); }

static int copy_bytes(const ddp_ckpt_opts_t *o, void *dst, const void *src, size_t n)
{
    if (o->copy) return o->copy(dst, src, n, o->copy_ctx);
    memcpy(dst, src, n);
    return 0;
}

/* Removes stale .step-*.tmp directories (all, or those of steps below `below`) and .latest.tmp. */

int ddp_ckpt_saver_new(const ddp_ckpt_opts_t *o, ddp_ckpt_saver_t **out, ddp_errinfo_t *ei)
{
    *out = NULL;
    if (!o || !o->dir || !o->dir[0] || strlen(o->dir) >= DIR_MAX - 64)
        return ddp_errinfo_set(ei, DDP_EINVAL, "checkpoint: no directory given, or too long");
    if (o->writers > 1 && (o->rank < 0))
        return ddp_errinfo_set(ei, DDP_EINVAL, "checkpoint: rank %d invalid", o->rank);
    if ((o->host_alloc == NULL) != (o->host_free == NULL))
        return ddp_errinfo_set(ei, DDP_EINVAL, "checkpoint: host_alloc and host_free go together");
    ddp_ckpt_saver_t *s = ddp_calloc(1, sizeof *s);
    if (!s) return ddp_errinfo_set(ei, DDP_ENOMEM, "checkpoint: out of memory");
    s->o = *o;
    if (s->o.writers <= 0) s->o.writers = 1;
    if (!s->o.host_alloc) {
        s->o.host_alloc = default_alloc;
        s->o.host_free = default_free;
    }
    double mb = o->shard_mb > 0 ? o->shard_mb : DDP_CKPT_DEFAULT_SHARD_MB;
    s->shard_bytes = (uint64_t)(mb * 1e6);
    if (s->shard_bytes == 0) s->shard_bytes = 1;
    s->stats.step = -1;
    s->written_step = -1;
    const char *d = getenv("DDP_CKPT_DIRECT");
    s->direct = !(d && !strcmp(d, "0"));
    d = getenv("DDP_CKPT_RECYCLE");
    s->recycle = o->keep_last > 0 && !(d && !strcmp(d, "0"));
    d = getenv("DDP_CKPT_URING");
    if (s->direct && !(d && !strcmp(d, "0"))) {
        int rc = ddp__uring_new(&s->ring);
        if (rc < 0)
            DDP_DEBUG("checkpoint: no io_uring (%s): writing with pwrite(2)", ddp_strerror(rc));
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->dir = ddp_strdup(o->dir);
    if (!s->dir) {
        free(s);
        return ddp_errinfo_set(ei, DDP_ENOMEM, "checkpoint: out of memory");
    }
    s->o.dir = s->dir;
    int rc = ddp__ckpt_mkdirs(s->dir, ei);
    if (rc < 0) {
        ddp_ckpt_saver_free(s);
        return rc;
    }
    if (s->o.rank == 0) ddp__ckpt_remove_stale_tmp(s->dir, -1);
    *out = s;
    return 0;
}

static void free_texts(ddp_ckpt_saver_t *s)
{
    for (size_t i = 0; i < s->n_texts; i++) {
        free(s->texts[i].name);
        free(s->texts[i].text);
    }
    free(s->texts);
    s->texts = NULL;
    s->n_texts = 0;
}

static void join_writer(ddp_ckpt_saver_t *s)
{
    if (!s->running) return;
    pthread_join(s->th, NULL);
    s->running = 0;
    s->live = 0;
    s->stats.saves++;
    if (s->result < 0) {
        char buf[800];
        const ddp_errinfo_t *e = &s->result_ei;
        s->stats.failures++;
        /* one line: the step, the directory, the cause (its message names the file already, or
         * the path is added) and what became of the partial directory */
        DDP_ERROR("checkpoint step %lld in %s failed: %s (%s%sthe last completed checkpoint is "
                  "untouched)",
                  (long long)s->step, s->dir,
                  e->path[0] && !strstr(e->msg, e->path) ? ddp_errinfo_str(e, buf, sizeof buf)
                                                         : e->msg,
                  s->cleanup, s->cleanup[0] ? "; " : "");
    }
}

void ddp_ckpt_saver_free(ddp_ckpt_saver_t *s)
{
    if (!s) return;
    join_writer(s);
    if (s->o.rank == 0) (void)ddp__ckpt_rmdir(s->dir, RECYCLE); /* no save left to reuse it */
    if (s->snap) s->o.host_free(s->snap, s->o.alloc_ctx);
    free(s->t);
    free(s->src);
    free(s->names);
    free(s->shards);
    free(s->config);
    free(s->trainer);
    free_texts(s);
    ddp_manifest_close(&s->mine);
    ddp__uring_free(s->ring);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->dir);
    free(s);
}

int ddp_ckpt_saver_reserve(ddp_ckpt_saver_t *s, size_t bytes, ddp_errinfo_t *ei)
{
    if (s->running) join_writer(s);
    if (s->snap && s->snap_cap >= bytes) return 0;
    if (s->snap) s->o.host_free(s->snap, s->o.alloc_ctx);
    s->snap_cap = 0;
    s->snap = s->o.host_alloc(bytes ? bytes : 1, s->o.alloc_ctx);
    if (!s->snap)
        return ddp_errinfo_set(ei, DDP_ENOMEM, "checkpoint: cannot allocate a %zu-byte snapshot",
                               bytes);
    s->snap_cap = bytes;
    memset(s->snap, 0, bytes); /* fault every page in now, not in the first save's stall */
    return 0;
}

bool ddp_ckpt_busy(ddp_ckpt_saver_t *s)
{
    return s->running && !atomic_load_explicit(&s->done, memory_order_acquire);
}

int ddp_ckpt_wait(ddp_ckpt_saver_t *s, ddp_errinfo_t *ei)
{
    join_writer(s);
    int rc = s->result;
    if (rc < 0 && ei) *ei = s->result_ei;
    s->result = 0;
    return rc;
}

void ddp_ckpt_saver_stats(ddp_ckpt_saver_t *s, ddp_ckpt_stats_t *out) { *out = s->stats; }

/* ---------------------------------------------------------------- snapshot */

static int cmp_str_ptr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int check_tensors(const ddp_ckpt_state_t *st, ddp_errinfo_t *ei)
{
    size_t n = st->n_model + st->n_optim;
    for (size_t i = 0; i < n; i++) {
        const ddp_ckpt_tensor_t *t = i < st->n_model ? &st->model[i] : &st->optim[i - st->n_model];
        uint64_t nb;
        if (!t->name || !t->name[0] || strlen(t->name) > 1000 || !strcmp(t->name, "__metadata__"))
            return ddp_errinfo_set(ei, DDP_EINVAL, "checkpoint: tensor %zu has no valid name", i);
        if (ddp_st_tensor_bytes(t->dtype, t->ndim, t->shape, &nb) < 0 || nb != t->nbytes)
            return ddp_errinfo_set(ei, DDP_EINVAL,
                                   "checkpoint: tensor '%s': dtype and shape do not give its %llu "
                                   "bytes",
                                   t->name, (unsigned long long)t->nbytes);
        if (nb && !t->data)
            return ddp_errinfo_set(ei, DDP_EINVAL, "checkpoint: tensor '%s' has no data", t->name);
    }
    const char **names = ddp_malloc((n ? n : 1) * sizeof *names);
    if (!names) return ddp_errinfo_set(ei, DDP_ENOMEM, "checkpoint: out of memory");
    for (size_t i = 0; i < n; i++)
        names[i] = i < st->n_model ? st->model[i].name : st->optim[i - st->n_model].name;
    qsort(names, n, sizeof *names, cmp_str_ptr);
    int rc = 0;
    for (size_t i = 1; i < n && rc == 0; i++)
        if (!strcmp(names[i - 1], names[i]))
            rc = ddp_errinfo_set(ei, DDP_EINVAL, "checkpoint: tensor name '%s' given twice",
                                 names[i]);
    free(names);
    return rc;
}

static int check_json(const char *what, const char *text, ddp_errinfo_t *ei)
{
    if (!text) return ddp_errinfo_set(ei, DDP_EINVAL, "checkpoint: no %s given", what);
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    if (!j && json_error_code(&je) == json_error_out_of_memory)
        return ddp_errinfo_set(ei, DDP_ENOMEM, "checkpoint: out of memory parsing %s", what);
    if (!j)
        return ddp_errinfo_set(ei, DDP_EINVAL, "checkpoint: %s is not valid JSON (line %d: %s)",
                               what, je.line, je.text);
    json_decref(j);
    return 0;
}

/* The state's further texts: each present, with a plain ".json" name that is not the saver's
 * own and not given twice. */
static int check_texts(const ddp_ckpt_state_t *st, ddp_errinfo_t *ei)
{
    if (st->n_texts && !st->texts)
        return ddp_errinfo_set(ei, DDP_EINVAL, "checkpoint: %zu texts without a list",
                               st->n_texts);
    for (size_t i = 0; i < st->n_texts; i++) {
        const char *nm = st->texts[i].name;
        size_t len = nm ? strlen(nm) : 0;
        if (len < 6 || len > 200 || nm[0] == '.' || strchr(nm, '/') ||
            strcmp(nm + len - 5, ".json") || !strcmp(nm, "config.json") ||
            !strcmp(nm, "trainer.json") || !strcmp(nm, DDP_MANIFEST_NAME) ||
            strstr(nm, ".safetensors.index.json"))
            return ddp_errinfo_set(ei, DDP_EINVAL, "checkpoint: text %zu: '%s' is not a name "
                                   "for a further text file", i, nm ? nm : "(null)");
        if (!st->texts[i].text)
            return ddp_errinfo_set(ei, DDP_EINVAL, "checkpoint: no text given for %s", nm);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(st->texts[j].name, nm))
                return ddp_errinfo_set(ei, DDP_EINVAL, "checkpoint: text '%s' given twice", nm);
    }
    return 0;
}

/* Copies the state's further texts (rank 0 only: the others do not write them). */
static int copy_texts(ddp_ckpt_saver_t *s, const ddp_ckpt_state_t *st)
{
    free_texts(s);
    if (s->o.rank != 0 || !st->n_texts) return 0;
    s->texts = ddp_calloc(st->n_texts, sizeof *s->texts);
    if (!s->texts) return DDP_ENOMEM;
    s->n_texts = st->n_texts;
    for (size_t i = 0; i < st->n_texts; i++) {
        s->texts[i].name = ddp_strdup(st->texts[i].name);
        s->texts[i].text = ddp_strdup(st->texts[i].text);
        if (!s->texts[i].name || !s->texts[i].text) return DDP_ENOMEM;
    }
    return 0;
}

/* Greedy plan: a new shard when the next tensor would pass shard_bytes; never split. */
static int plan_kind(ddp_ckpt_saver_t *s, int optim, size_t first, size_t count, size_t *cap)
{
    size_t start = s->n_shards;
    uint64_t cur = 0;
    for (size_t i = first; i < first + count; i++) {
        uint64_t nb = s->t[i].nbytes;
        if (s->n_shards == start || (cur > 0 && cur + nb > s->shard_bytes)) {
            if (s->n_shards == *cap) {
                size_t c = *cap ? 2 * *cap : 8;
                shard_t *p = ddp_realloc(s->shards, c * sizeof *p);
                if (!p) return DDP_ENOMEM;
                s->shards = p;
                *cap = c;
            }
            shard_t *sh = &s->shards[s->n_shards++];
            memset(sh, 0, sizeof *sh);
            sh->optim = optim;
            sh->first = i;
            cur = 0;
        }
        shard_t *sh = &s->shards[s->n_shards - 1];
        sh->count++;
        sh->bytes += nb;
        cur += nb;
    }
    size_t k = s->n_shards - start;
    const char *base = optim ? "optim" : "model";
    for (size_t i = 0; i < k; i++) {
        shard_t *sh = &s->shards[start + i];
        if (k == 1)
            snprintf(sh->file, sizeof sh->file, "%s.safetensors", base);
        else
            snprintf(sh->file, sizeof sh->file, "%s-%05zu-of-%05zu.safetensors", base, i + 1, k);
    }
    return 0;
}

/* Everything of a save but the copy: waits for the previous save, checks the state, takes the
 * names and texts, lays the tensors out in the snapshot (allocating it if needed), records
 * where each tensor's bytes are, and plans the shards. */
static int prepare(ddp_ckpt_saver_t *s, const ddp_ckpt_state_t *st, int64_t *t_waited,
                   ddp_errinfo_t *ei)
{
    if (!st || st->step < 0 || !st->n_model || !st->model || (st->n_optim && !st->optim))
        return ddp_errinfo_set(ei, DDP_EINVAL, "checkpoint: bad state (step, model list)");
    if (s->running) {
        if (ddp_ckpt_busy(s))
            DDP_WARN("checkpoint step %lld is still being written; step %lld waits for it",
                     (long long)s->step, (long long)st->step);
        join_writer(s);
    }
    *t_waited = ddp_now_ns();
    DDP_CHECK(check_tensors(st, ei));
    DDP_CHECK(check_json("config.json", st->config_json, ei));
    DDP_CHECK(check_json("trainer.json", st->trainer_json, ei));
    DDP_CHECK(check_texts(st, ei));

    s->have_snapshot = 0;
    s->committed = 0;
    s->live = 0;
    size_t n = st->n_model + st->n_optim;
    uint64_t total = 0, name_bytes = 0;
    for (size_t i = 0; i < n; i++) {
        const ddp_ckpt_tensor_t *t = i < st->n_model ? &st->model[i] : &st->optim[i - st->n_model];
        total += t->nbytes;
        name_bytes += strlen(t->name) + 1;
    }
    if (total > SIZE_MAX / 2)
        return ddp_errinfo_set(ei, DDP_EINVAL, "checkpoint: state too large");
    if (!s->snap || s->snap_cap < total) {
        if (s->snap) s->o.host_free(s->snap, s->o.alloc_ctx);
        s->snap_cap = 0;
        s->snap = s->o.host_alloc(total ? total : 1, s->o.alloc_ctx);
        if (!s->snap)
            return ddp_errinfo_set(ei, DDP_ENOMEM, "checkpoint: cannot allocate a %llu-byte "
                                                   "snapshot", (unsigned long long)total);
        s->snap_cap = total;
    }
    free(s->t);
    free(s->src);
    free(s->names);
    free(s->config);
    free(s->trainer);
    s->config = s->trainer = s->names = NULL;
    s->n_t = s->n_shards = 0;
    s->t = ddp_calloc(n, sizeof *s->t);
    s->src = ddp_calloc(n, sizeof *s->src);
    s->names = ddp_malloc(name_bytes);
    s->config = ddp_strdup(st->config_json);
    s->trainer = ddp_strdup(st->trainer_json);
    if (!s->t || !s->src || !s->names || !s->config || !s->trainer || copy_texts(s, st) < 0)
        return ddp_errinfo_set(ei, DDP_ENOMEM, "checkpoint: out of memory");
    uint64_t off = 0;
    char *np = s->names;
    for (size_t i = 0; i < n; i++) {
        const ddp_ckpt_tensor_t *t = i < st->n_model ? &st->model[i] : &st->optim[i - st->n_model];
        ddp_st_tensor_t *d = &s->t[i];
        size_t nl = strlen(t->name) + 1;
        memcpy(np, t->name, nl);
        d->name = np;
        np += nl;
        d->dtype = t->dtype;
        d->ndim = t->ndim;
        memcpy(d->shape, t->shape, sizeof d->shape);
        d->nbytes = t->nbytes;
        d->data = s->snap + off;
        s->src[i] = (tsrc_t){.src = t->data, .off = off, .run_end = off + t->nbytes,
                             .crc = t->crc_known ? t->crc32c : 0, .crc_known = t->crc_known};
        off += t->nbytes;
    }
    /* contiguous runs of the caller's memory, so a write may span tensors (an arena) */
    for (size_t i = n - 1, next = n; i < n; i--) {
        if (!s->t[i].nbytes) continue;
        if (next < n && s->src[i].src + s->t[i].nbytes == s->src[next].src)
            s->src[i].run_end = s->src[next].run_end;
        next = i;
    }
    s->n_t = n;
    s->n_model = st->n_model;
    size_t cap = 0;
    free(s->shards);
    s->shards = NULL;
    if (plan_kind(s, 0, 0, st->n_model, &cap) < 0)
        return ddp_errinfo_set(ei, DDP_ENOMEM, "checkpoint: out of memory");
    s->n_model_shards = s->n_shards;
    if (st->n_optim && plan_kind(s, 1, st->n_model, st->n_optim, &cap) < 0)
        return ddp_errinfo_set(ei, DDP_ENOMEM, "checkpoint: out of memory");
    s->step = st->step;
    s->stats.step = st->step;
    s->stats.freeze_s = 0;
    s->stats.freeze_bytes = 0;
    return 0;
}

int ddp_ckpt_snapshot(ddp_ckpt_saver_t *s, const ddp_ckpt_state_t *st, ddp_errinfo_t *ei)
{
    int64_t t0 = ddp_now_ns(), t1;
    DDP_CHECK(prepare(s, st, &t1, ei));
    uint64_t total = 0;
    for (size_t i = 0; i < s->n_t; i++) {
        uint64_t nb = s->t[i].nbytes;
        if (nb) {
            int rc = copy_bytes(&s->o, s->snap + s->src[i].off, s->src[i].src, (size_t)nb);
            if (rc < 0)
                return ddp_errinfo_set(ei, rc, "checkpoint: copying tensor '%s' failed: %s",
                                       s->t[i].name, ddp_strerror(rc));
        }
        total += nb;
    }
    s->have_snapshot = 1;
    int64_t t2 = ddp_now_ns();
    s->stats.wait_s = (double)(t1 - t0) * 1e-9;
    s->stats.snapshot_s = (double)(t2 - t0) * 1e-9;
    DDP_DEBUG("checkpoint step %lld: snapshot of %.1f MB in %.1f ms", (long long)st->step,
              (double)total / 1e6, (double)(t2 - t1) * 1e-6);
    return 0;
}

int ddp_ckpt_save_live(ddp_ckpt_saver_t *s, const ddp_ckpt_state_t *st, ddp_errinfo_t *ei)
{
    if (s->o.rank >= s->o.writers) return 0;
    if (s->o.copy)
        return ddp_errinfo_set(ei, DDP_EINVAL, "checkpoint: a live save needs host tensors");
    int64_t t0 = ddp_now_ns(), t1;
    DDP_CHECK(prepare(s, st, &t1, ei));
    s->have_snapshot = 1;
    s->live = 1;
    s->inflight = 0;
    s->consumed = 0;
    s->stats.wait_s = (double)(t1 - t0) * 1e-9;
    s->stats.snapshot_s = (double)(ddp_now_ns() - t0) * 1e-9;
    int rc = ddp_ckpt_write_async(s, ei);
    if (rc) s->live = 0;
    return rc;
}

/* The tensor holding stream offset `pos` (a non-empty one), searching from `*i` on. */
static size_t tensor_at(const ddp_ckpt_saver_t *s, uint64_t pos, size_t *i)
{
    while (*i < s->n_t && (!s->t[*i].nbytes || s->src[*i].off + s->t[*i].nbytes <= pos)) (*i)++;
    DDP_ASSERT(*i < s->n_t && s->src[*i].off <= pos);
    return *i;
}

int ddp_ckpt_freeze(ddp_ckpt_saver_t *s, uint64_t *copied_out, ddp_errinfo_t *ei)
{
    if (copied_out) *copied_out = 0;
    if (!s->running) return 0;
    int64_t t0 = ddp_now_ns();
    uint64_t copied = 0;
    pthread_mutex_lock(&s->mu);
    while (s->inflight) pthread_cond_wait(&s->cv, &s->mu);
    if (s->live) {
        size_t i = 0;
        for (size_t k = 0; k < s->n_shards; k++) {
            if ((int)(k % (size_t)s->o.writers) != s->o.rank) continue;
            const shard_t *sh = &s->shards[k];
            uint64_t b = s->src[sh->first].off + sh->bytes;
            uint64_t x = s->src[sh->first].off > s->consumed ? s->src[sh->first].off
                                                             : s->consumed;
            while (x < b) {
                size_t j = tensor_at(s, x, &i);
                uint64_t e = s->src[j].off + s->t[j].nbytes;
                if (e > b) e = b;
                memcpy(s->snap + x, s->src[j].src + (x - s->src[j].off), (size_t)(e - x));
                copied += e - x;
                x = e;
            }
        }
        s->live = 0;
    }
    pthread_mutex_unlock(&s->mu);
    s->stats.freeze_s = (double)(ddp_now_ns() - t0) * 1e-9;
    s->stats.freeze_bytes = copied;
    if (copied_out) *copied_out = copied;
    (void)ei;
    return 0;
}

/* ---------------------------------------------------------------- writing */

void ddp__ckpt_tmp_path(const ddp_ckpt_saver_t *s, char *buf, size_t len)
{
    snprintf(buf, len, "%s/" DDP__CKPT_TMP_FMT, s->dir, (long long)s->step);
}

/* The source of the next chunk of stream bytes [pos, end): the caller's memory while the save
 * is live (claimed: returns 1, release it after the write), else the snapshot (returns 0). */
static int claim(ddp_ckpt_saver_t *s, uint64_t pos, uint64_t end, size_t *cursor,
                 const unsigned char **p, size_t *len)
{
    uint64_t lim = end - pos < WRITE_CHUNK ? end : pos + WRITE_CHUNK;
    pthread_mutex_lock(&s->mu);
    int live = s->live;
    if (live) {
        size_t i = tensor_at(s, pos, cursor);
        *p = s->src[i].src + (pos - s->src[i].off);
        if (s->src[i].run_end < lim) lim = s->src[i].run_end;
        s->inflight = 1;
    } else {
        *p = s->snap + pos;
    }
    pthread_mutex_unlock(&s->mu);
    *len = (size_t)(lim - pos);
    return live;
}

static void release(ddp_ckpt_saver_t *s, uint64_t consumed)
{
    pthread_mutex_lock(&s->mu);
    s->consumed = consumed;
    s->inflight = 0;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* Extends the CRC32C of the tensors without a known one over the stream bytes [pos, pos + len)
 * at p, just written (and, for a live chunk, still claimed). */
static void checksum_chunk(ddp_ckpt_saver_t *s, uint64_t pos, const unsigned char *p, size_t len,
                           size_t *cursor)
{
    for (uint64_t x = pos, end = pos + len; x < end;) {
        size_t j = tensor_at(s, x, cursor);
        tsrc_t *t = &s->src[j];
        uint64_t e = t->off + s->t[j].nbytes < end ? t->off + s->t[j].nbytes : end;
        if (!t->crc_known) {
            t->crc = ddp_crc32c_update(t->crc, p + (x - pos), (size_t)(e - x));
            s->stats.crc_bytes += e - x;
        }
        x = e;
    }
}

/* True when no other open file, in any process, refers to fd's file: neither a descriptor nor a
 * mapping (a reader of the retired checkpoint), since a write lease is granted only then
 * (fcntl(2)). The lease is dropped at once; an open that broke it in between would signal
 * SIGURG (ignored) to this process instead of SIGIO (which kills). */
static bool sole_opener(int fd)
{
    if (fcntl(fd, F_SETSIG, SIGURG) < 0 || fcntl(fd, F_SETLEASE, F_WRLCK) < 0) return false;
    (void)fcntl(fd, F_SETLEASE, F_UNLCK);
    return true;
}

/* Moves RECYCLE/<file> into tmp for write_shard to overwrite in place, unless something still
 * has it open (it is then left to be deleted, which its reader does not notice). Overwriting
 * spares what a new file costs where it hurts training: ext4 allocating 1.5 GB of blocks and
 * converting unwritten extents, and the discards of deleting the old one on a `discard` mount.
 * Returns whether the file moved. */
static bool take_recycled(const ddp_ckpt_saver_t *s, const char *tmp, const char *file)
{
    char from[PATH_MAX], to[PATH_MAX];
    snprintf(from, sizeof from, "%s/" RECYCLE "/%s", s->dir, file);
    snprintf(to, sizeof to, "%s/%s", tmp, file);
    int fd = open(from, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return false;
    bool sole = sole_opener(fd);
    close(fd);
    return sole && rename(from, to) == 0;
}

/* One shard: header padded so the data starts DATA_ALIGN-aligned, then the data straight from
 * its source (O_DIRECT where possible), fsync. Its CRC32C is the header's followed by each
 * tensor's (combined: common/crc32c.h), computed on the way where the caller did not give it. */
static int write_shard(ddp_ckpt_saver_t *s, const shard_t *sh, const char *tmp,
                       uint64_t *bytes, ddp_errinfo_t *ei)
{
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", tmp, sh->file);
    ddp__dio_t d;
    bool reuse = s->recycle && take_recycled(s, tmp, sh->file);
    DDP_CHECK(ddp__dio_open(&d, path, s->direct, reuse, s->ring, ei));
    s->stats.reused_bytes += d.old_size;
    char *hdr = NULL;
    size_t hlen = 0;
    int rc = ddp_st_header_build_aligned(&s->t[sh->first], sh->count, st_meta, 1, DATA_ALIGN,
                                         &hdr, &hlen, ei);
    uint32_t crc = rc == 0 ? ddp_crc32c_update(0, hdr, hlen) : 0;
    if (rc == 0) rc = ddp__dio_write(&d, hdr, hlen, ei);
    free(hdr);
    uint64_t pos = s->src[sh->first].off, end = pos + sh->bytes;
    size_t cursor = sh->first, crc_cursor = sh->first;
    while (rc == 0 && pos < end) {
        const unsigned char *p;
        size_t len;
        int live = claim(s, pos, end, &cursor, &p, &len);
        rc = ddp__dio_write(&d, p, len, ei);
        if (rc == 0) checksum_chunk(s, pos, p, len, &crc_cursor);
        pos += len;
        if (live) release(s, pos);
    }
    for (size_t i = sh->first; i < sh->first + sh->count; i++)
        crc = ddp_crc32c_combine(crc, s->src[i].crc, s->t[i].nbytes);
    s->stats.direct_bytes += d.direct_bytes;
    s->stats.fixed_bytes += d.fixed_bytes;
    rc = ddp__dio_close(&d, rc, ei);
    if (rc == 0) {
        rc = ddp_manifest_add(&s->mine, sh->file, d.size, crc);
        if (rc < 0) ddp_errinfo_set(ei, rc, "checkpoint: out of memory");
        *bytes += d.size;
    }
    return rc;
}

/* model.safetensors.index.json / optim.safetensors.index.json, as Hugging Face writes them. */
static int write_index(ddp_ckpt_saver_t *s, int optim, const char *tmp, uint64_t *bytes,
                       ddp_errinfo_t *ei)
{
    size_t a = optim ? s->n_model_shards : 0, b = optim ? s->n_shards : s->n_model_shards;
    if (b - a < 2) return 0;
    const char *name = optim ? "optim.safetensors.index.json" : "model.safetensors.index.json";
    int rc = 0;
    uint64_t total = 0;
    char *text = NULL;
    json_t *wm = json_object();
    json_t *root = NULL;
    if (!wm) goto nomem;
    for (size_t k = a; k < b; k++) {
        const shard_t *sh = &s->shards[k];
        total += sh->bytes;
        for (size_t i = sh->first; i < sh->first + sh->count; i++)
            if (json_object_set_new(wm, s->t[i].name, json_string(sh->file)) < 0) goto nomem;
    }
    root = json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)total, "weight_map",
                     wm);
    if (!root) goto nomem;
    text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (!text) goto nomem;
    uint32_t crc = 0;
    size_t len = strlen(text);
    text[len] = '\n';
    rc = ddp__write_durable(tmp, name, text, len + 1, &crc, ei);
    if (rc == 0) rc = ddp_manifest_add(&s->mine, name, len + 1, crc);
    if (rc == 0) *bytes += len + 1;
    goto out;
nomem:
    rc = ddp_errinfo_set(ei, DDP_ENOMEM, "checkpoint: out of memory writing %s", name);
out:
    free(text);
    json_decref(wm);
    json_decref(root);
    return rc;
}

static int write_text(ddp_ckpt_saver_t *s, const char *tmp, const char *name, const char *text,
                      uint64_t *bytes, ddp_errinfo_t *ei)
{
    uint32_t crc = 0;
    size_t len = strlen(text);
    DDP_CHECK(ddp__write_durable(tmp, name, text, len, &crc, ei));
    *bytes += len;
    int rc = ddp_manifest_add(&s->mine, name, len, crc);
    return rc < 0 ? ddp_errinfo_set(ei, rc, "checkpoint: out of memory") : 0;
}

static int write_mine(ddp_ckpt_saver_t *s, uint64_t *bytes, ddp_errinfo_t *ei)
{
    char tmp[DIR_MAX];
    ddp__ckpt_tmp_path(s, tmp, sizeof tmp);
    ddp_manifest_close(&s->mine);
    ddp_manifest_init(&s->mine, s->step);
    /* What failed saves could not remove (and crashed ones left) goes before this save needs
     * the space: on a full file system it is what makes room. Rank 0 only, as in the commit:
     * no writer is still at an older step once rank 0 starts a new one. */
    if (s->o.rank == 0) ddp__ckpt_remove_stale_tmp(s->dir, s->step);
    if (s->o.writers == 1) {
        /* Sole writer: whatever is there is from a crashed attempt at this step. */
        int rc = ddp__ckpt_rmdir(s->dir, strrchr(tmp, '/') + 1);
        if (rc < 0) return ddp_errinfo_set(ei, rc, "%s: cannot remove: %s", tmp, ddp_strerror(rc));
    }
    DDP_CHECK(ddp__ckpt_mkdirs(tmp, ei));
    int wrote = 0;
    for (size_t i = 0; i < s->n_shards; i++) {
        if ((int)(i % (size_t)s->o.writers) != s->o.rank) continue;
        if (wrote) ddp_test_hook(DDP_HOOK_CKPT_SHARD, (long)s->step, s->o.rank);
        DDP_CHECK(write_shard(s, &s->shards[i], tmp, bytes, ei));
        wrote = 1;
    }
    if (s->o.rank == 0) {
        DDP_CHECK(write_index(s, 0, tmp, bytes, ei));
        DDP_CHECK(write_index(s, 1, tmp, bytes, ei));
        DDP_CHECK(write_text(s, tmp, "config.json", s->config, bytes, ei));
        DDP_CHECK(write_text(s, tmp, "trainer.json", s->trainer, bytes, ei));
        for (size_t i = 0; i < s->n_texts; i++)
            DDP_CHECK(write_text(s, tmp, s->texts[i].name, s->texts[i].text, bytes, ei));
    }
    if (s->o.writers > 1) {
        char part[FILE_NAME_MAX];
        snprintf(part, sizeof part, DDP__CKPT_PART_FMT, s->o.rank);
        DDP_CHECK(ddp_manifest_write(&s->mine, tmp, part, 1, ei));
    }
    return 0;
}

/* Registers the memory this save's shards are read from with the ring: the caller's contiguous
 * runs in a live save, else the snapshot (a no-op when they are registered already). Where that
 * is refused the ring is dropped and the writes use pwrite(2). Writer thread. */
static void register_sources(ddp_ckpt_saver_t *s)
{
    if (!s->ring) return;
    struct iovec *r = ddp_malloc((s->n_t ? s->n_t : 1) * sizeof *r);
    int n = 0, rc = DDP_ENOMEM;
    pthread_mutex_lock(&s->mu);
    int live = s->live;
    pthread_mutex_unlock(&s->mu);
    uint64_t bytes = 0, last_end = UINT64_MAX;
    for (size_t i = 0; r && live && i < s->n_t; i++) {
        const tsrc_t *t = &s->src[i];
        if (!s->t[i].nbytes || t->run_end == last_end) continue;
        r[n++] = (struct iovec){(void *)t->src, (size_t)(t->run_end - t->off)};
        bytes += t->run_end - t->off;
        last_end = t->run_end;
    }
    if (r && !live) {
        r[n++] = (struct iovec){s->snap, s->snap_cap};
        bytes = s->snap_cap;
    }
    if (r) rc = ddp__uring_register(s->ring, r, n);
    free(r);
    if (rc < 0) {
        DDP_INFO("checkpoint: io_uring cannot register the %.0f MB the shards are written from "
                 "(%s): writing with pwrite(2), which pins the pages for every write (raise "
                 "RLIMIT_MEMLOCK, e.g. LimitMEMLOCK=infinity, to avoid that)",
                 (double)bytes / 1e6, ddp_strerror(rc));
        ddp__uring_free(s->ring);
        s->ring = NULL;
    }
}

static void *writer_main(void *arg)
{
    ddp_ckpt_saver_t *s = arg;
    /* Writing is background work: where the compute threads already use every core it must
     * not take their time, so the writer runs at a lower priority (Linux applies nice per
     * thread). Measured on 2 busy cores with GPT-2 124M: at nice 10 the writer reads the
     * 1.5 GB of arenas within the next step; SCHED_IDLE starved it (0.4-0.8 GB read by the
     * update, 120-190 ms of copying there). */
    if (setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10) != 0)
        DDP_DEBUG("checkpoint writer: setpriority: %s", strerror(errno));
    int64_t t0 = ddp_now_ns(), trace_t0 = ddp_trace_begin(); /* a traced step's save */
    int64_t cpu0 = ddp_thread_cpu_ns();
    register_sources(s);
    uint64_t bytes = 0;
    ddp_errinfo_clear(&s->result_ei);
    int rc = write_mine(s, &bytes, &s->result_ei);
    if (rc == 0) s->written_step = s->step;
    if (rc == 0 && s->o.writers == 1) rc = ddp__ckpt_commit(s, &s->result_ei);
    s->cleanup[0] = 0;
    if (rc < 0) (void)ddp__ckpt_discard(s, s->o.writers == 1); /* reported by join_writer */
    double dt = (double)(ddp_now_ns() - t0) * 1e-9;
    ddp_trace_end(DDP_TRACE_CKPT, trace_t0, "checkpoint step %lld: write%s",
                  (long long)s->step, rc == 0 && s->o.writers == 1 ? " + commit" : "");
    s->result = rc;
    s->stats.write_s = dt;
    s->stats.write_cpu_s = (double)(ddp_thread_cpu_ns() - cpu0) * 1e-9;
    s->stats.bytes = bytes;
    if (rc == 0)
        DDP_INFO("checkpoint step %lld: %s%.1f MB in %.2f s (%.0f MB/s, writer CPU %.0f ms, "
                 "%.1f MB checksummed by the writer, %.1f MB written over retired files)%s",
                 (long long)s->step, s->o.writers > 1 ? "this rank's shards, " : "",
                 (double)bytes / 1e6, dt, dt > 0 ? (double)bytes / 1e6 / dt : 0.0,
                 s->stats.write_cpu_s * 1e3, (double)s->stats.crc_bytes / 1e6,
                 (double)s->stats.reused_bytes / 1e6, s->o.writers == 1 ? ", committed" : "");
    atomic_store_explicit(&s->done, 1, memory_order_release);
    return NULL;
}

int ddp_ckpt_write_async(ddp_ckpt_saver_t *s, ddp_errinfo_t *ei)
{
    if (s->running) join_writer(s);
    if (!s->have_snapshot)
        return ddp_errinfo_set(ei, DDP_EINVAL, "checkpoint: write without a snapshot");
    s->have_snapshot = 0;
    s->result = 0;
    s->written_step = -1;
    s->stats.direct_bytes = 0;
    s->stats.fixed_bytes = 0;
    s->stats.crc_bytes = 0;
    s->stats.reused_bytes = 0;
    atomic_store(&s->done, 0);
    int rc = pthread_create(&s->th, NULL, writer_main, s);
    if (rc != 0)
        return ddp_errinfo_set(ei, -rc, "checkpoint: cannot start the writer thread: %s",
                               strerror(rc));
    s->running = 1;
    return 0;
}

int ddp_ckpt_save(ddp_ckpt_saver_t *s, const ddp_ckpt_state_t *st, ddp_errinfo_t *ei)
{
    if (s->o.rank >= s->o.writers) return 0;
    DDP_CHECK(ddp_ckpt_snapshot(s, st, ei));
    return ddp_ckpt_write_async(s, ei);
}
