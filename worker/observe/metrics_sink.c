/* metrics.jsonl teed to TensorBoard (see metrics_sink.h).
 *
 * The record is the source of both outputs: the codec writes its line, and ddp_metrics_values
 * gives the same fields in the same order with the values the line states (a real rounded to
 * its printed digits), so a scalar in TensorBoard equals the number in metrics.jsonl as a
 * float32, as tests/observe/tb_check.py checks.
 *
 * The caps are checked before a write, never after: a line that does not fit is not written,
 * so metrics.jsonl stays a file of whole lines (the daemon tails it while rank 0 writes).
 */
#include "worker/observe/metrics_sink.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "worker/observe/tb_events.h"

/* metrics.jsonl key -> TensorBoard tag; keys not listed keep their name, "step"-like keys and
 * strings are not scalars; an eval record's keys become eval/<task>/<key> (tee_record); a named
 * value "key/name" is tagged "<key's tag>/name" */
static const struct {
    const char *key, *tag;
} TAGS[] = {
    {"loss", "loss/train"},
    {"val_loss", "loss/val"},
    {"lr", "train/lr"},
    {"grad_norm", "train/grad_norm"},
    {"loss_scale", "train/loss_scale"},
    {"skips", "train/skipped_updates"}, /* spike and non-finite skips so far */
    {"tokens", "train/tokens"},
    {"tokens_per_s", "perf/tokens_per_s"},
    {"step_ms", "perf/step_ms"},
    {"compute_ms", "perf/compute_ms"},
    {"optim_ms", "perf/optim_ms"},
    {"wall_ms", "perf/wall_ms"},
    {"mfu", "perf/mfu"},
    {"comm_ms", "comm/comm_ms"},
    {"exposed_comm_ms", "comm/exposed_ms"},
    {"hidden", "comm/hidden_fraction"},
    {"world", "ddp/world"},
    {"generation", "ddp/generation"},
};

struct ddp_metrics_sink {
    int fd;
    ddp_tb_t *tb;     /* NULL once it failed */
    int write_failed; /* the file's write failure was logged */
    int capped;       /* a line did not fit under caps.metrics_bytes: no more are written */
    uint64_t bytes;   /* the file's size: at open, plus what this sink wrote */
    ddp_metrics_caps_t caps;
    char path[4200];
};

static ddp_metrics_caps_t default_caps; /* ddp_metrics_sink_set_caps: main thread, then read */
/* a cap reached is said once per process, also when a later generation opens a sink again */
static int warned_metrics, warned_tb;

void ddp_metrics_sink_set_caps(const ddp_metrics_caps_t *caps)
{
    memset(&default_caps, 0, sizeof default_caps);
    if (caps) default_caps = *caps;
    warned_metrics = warned_tb = 0;
}

static const char *tag_of(const char *key)
{
    for (size_t i = 0; i < sizeof TAGS / sizeof *TAGS; i++)
        if (!strcmp(key, TAGS[i].key)) return TAGS[i].tag;
    return key;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* One record -> one event at its step. */
static void tee_record(ddp_metrics_sink_t *s, const ddp_metrics_rec_t *r)
{
    if (!s->tb || !(r->has & DDP_MF(STEP))) return;
    ddp_metrics_value_t v[DDP_MF_COUNT];
    ddp_tb_scalar_t sc[DDP_MF_COUNT + DDP_METRICS_MAX_NAMED];
    char eval_tags[DDP_MF_COUNT][96]; /* an eval's tags name its task: eval/<task>/acc_norm */
    char named_tags[DDP_METRICS_MAX_NAMED][128];
    int n = 0, nv = ddp_metrics_values(r, v);
    for (int i = 0; i < nv; i++) {
        if (v[i].field == DDP_MF_STEP || v[i].field == DDP_MF_STEPS) continue;
        if (v[i].type == DDP_METRICS_STR || isnan(v[i].num)) continue; /* null: no number */
        const char *tag = tag_of(v[i].key);
        if (r->kind == DDP_METRICS_EVAL) {
            snprintf(eval_tags[n], sizeof eval_tags[n], "eval/%s/%s", r->task, v[i].key);
            tag = eval_tags[n];
        }
        sc[n++] = (ddp_tb_scalar_t){tag, (float)v[i].num};
    }
    /* named values: "val_loss/<set>" -> loss/val/<set>, "tokens/<source>" ->
     * train/tokens/<source> (the tags of their unnamed kin, the name after them) */
    for (int i = 0; i < r->n_named && i < DDP_METRICS_MAX_NAMED; i++) {
        const char *key = r->named[i].key, *slash = strchr(key, '/');
        if (!slash || isnan(r->named[i].num)) continue;
        char prefix[96];
        snprintf(prefix, sizeof prefix, "%.*s", (int)(slash - key), key);
        snprintf(named_tags[i], sizeof named_tags[i], "%s%s", tag_of(prefix), slash);
        double num = r->named[i].num; /* as the line states it (a real in %.6f) */
        if (!r->named[i].integer) {
            char text[400];
            snprintf(text, sizeof text, "%.6f", num);
            num = strtod(text, NULL);
        }
        sc[n++] = (ddp_tb_scalar_t){named_tags[i], (float)num};
    }
    int rc = n ? ddp_tb_scalars(s->tb, r->step, now_s(), sc, n) : 0;
    if (rc == -EFBIG) {
        if (!warned_tb++)
            DDP_WARN("tensorboard: the cap of %llu bytes on the event files (%s) is reached at "
                     "step %lld: no more events are written to %s this run; training goes on",
                     (unsigned long long)s->caps.tensorboard_bytes, s->caps.tensorboard_from,
                     (long long)r->step, ddp_tb_path(s->tb));
        ddp_tb_close(s->tb);
        s->tb = NULL;
    } else if (rc) {
        DDP_WARN("tensorboard: writing %s failed (%s); no more events this run", ddp_tb_path(s->tb),
                 ddp_strerror(rc));
        ddp_tb_close(s->tb);
        s->tb = NULL;
    }
}

int ddp_metrics_sink_write(ddp_metrics_sink_t *s, const ddp_metrics_rec_t *r)
{
    if (!s) return 0;
    char line[DDP_METRICS_LINE_MAX + 1];
    size_t len = 0;
    int rc = ddp_metrics_format(r, line, sizeof line - 1, &len);
    if (rc) {
        DDP_WARN("metrics.jsonl: a %s record cannot be written: %s", ddp_metrics_kind_name(r->kind),
                 ddp_strerror(rc));
        return rc;
    }
    line[len++] = '\n';
    uint64_t cap = s->caps.metrics_bytes;
    if (cap && !s->capped && s->bytes + len > cap) {
        s->capped = 1;
        if (!warned_metrics++)
            DDP_WARN("metrics.jsonl: the cap of %llu bytes (%s) is reached: %s ends at %llu bytes "
                     "(this %s line, of step %lld, and every later line are dropped); training "
                     "goes on",
                     (unsigned long long)cap, s->caps.metrics_from, s->path,
                     (unsigned long long)s->bytes, ddp_metrics_kind_name(r->kind),
                     (long long)r->step);
    }
    if (s->capped) {
        tee_record(s, r); /* TensorBoard has a cap of its own */
        return 0;
    }
    for (size_t off = 0; off < len;) {
        ssize_t w = write(s->fd, line + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
            rc = -errno;
            if (!s->write_failed)
                DDP_WARN("metrics.jsonl: write failed (%s); training goes on", strerror(errno));
            s->write_failed = 1;
            return rc;
        }
        off += (size_t)w;
        s->bytes += (uint64_t)w;
    }
    tee_record(s, r);
    return 0;
}

int ddp_metrics_sink_open(const char *run_dir, const char *path, ddp_metrics_sink_t **out)
{
    *out = NULL;
    ddp_metrics_sink_t *s = ddp_calloc(1, sizeof *s);
    if (!s) return DDP_ENOMEM;
    s->caps = default_caps;
    snprintf(s->path, sizeof s->path, "%s", path);
    s->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    struct stat st;
    if (s->fd < 0 || fstat(s->fd, &st) != 0) {
        int rc = -errno;
        if (s->fd >= 0) close(s->fd);
        free(s);
        return rc;
    }
    s->bytes = (uint64_t)st.st_size; /* a respawned rank 0 appends to the file */
    int rc = ddp_tb_open(run_dir, s->caps.tensorboard_bytes, &s->tb);
    if (rc == -EFBIG) {
        if (!warned_tb++)
            DDP_WARN("tensorboard: the event files in %s/tb are at their cap of %llu bytes (%s): "
                     "no events this run; training goes on",
                     run_dir, (unsigned long long)s->caps.tensorboard_bytes,
                     s->caps.tensorboard_from);
    } else if (rc) {
        DDP_WARN("tensorboard: cannot create an event file in %s/tb: %s", run_dir,
                 ddp_strerror(rc));
    }
    *out = s;
    return 0;
}

long ddp_metrics_sink_last_step(const char *path)
{
    long last = -1;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    while ((n = getline(&line, &cap, f)) > 0) {
        ddp_metrics_rec_t r;
        if (ddp_metrics_parse(line, (size_t)n, &r, NULL) == 0 && r.kind == DDP_METRICS_STEP &&
            r.step > last)
            last = (long)r.step;
    }
    free(line);
    fclose(f);
    return last;
}

void ddp_metrics_sink_close(ddp_metrics_sink_t *s)
{
    if (!s) return;
    close(s->fd);
    ddp_tb_close(s->tb);
    free(s);
}
