/* metrics.jsonl teed to TensorBoard (see metrics_sink.h).
 *
 * The stream is a glibc cookie stream (fopencookie): the trainer keeps writing its lines with
 * fprintf + fflush, and each flush hands the bytes here, where they go to the file first and
 * then, line by line, through jansson to ddp_tb_scalars. Lines are small and one per step, so
 * parsing them again costs nothing next to a step.
 */
#include "worker/metrics_sink.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "worker/tb_events.h"

enum { MAX_LINE = 64 * 1024, MAX_VALUES = 64 };

/* metrics.jsonl key -> TensorBoard tag; keys not listed keep their name, "step"-like keys and
 * strings are not scalars */
static const struct {
    const char *key, *tag;
} TAGS[] = {
    {"loss", "loss/train"},
    {"val_loss", "loss/val"},
    {"lr", "train/lr"},
    {"grad_norm", "train/grad_norm"},
    {"loss_scale", "train/loss_scale"},
    {"tokens", "train/tokens"},
    {"tokens_per_s", "perf/tokens_per_s"},
    {"step_ms", "perf/step_ms"},
    {"compute_ms", "perf/compute_ms"},
    {"optim_ms", "perf/optim_ms"},
    {"wall_ms", "perf/wall_ms"},
    {"comm_ms", "comm/comm_ms"},
    {"exposed_comm_ms", "comm/exposed_ms"},
    {"hidden", "comm/hidden_fraction"},
    {"world", "ddp/world"},
    {"generation", "ddp/generation"},
};
static const char *const NOT_SCALARS[] = {"step", "steps"};

typedef struct sink {
    int fd;
    ddp_tb_t *tb; /* NULL once it failed */
    char *line;
    size_t len;
    int overlong; /* the line being gathered passed MAX_LINE: dropped */
} sink_t;

static const char *tag_of(const char *key)
{
    for (size_t i = 0; i < sizeof NOT_SCALARS / sizeof *NOT_SCALARS; i++)
        if (!strcmp(key, NOT_SCALARS[i])) return NULL;
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

/* One metrics line -> one event at its step. */
static void tee_line(sink_t *s, const char *line, size_t len)
{
    json_t *o = json_loadb(line, len, 0, NULL);
    json_t *st = json_object_get(o, "step");
    if (!json_is_object(o) || !json_is_integer(st)) {
        json_decref(o);
        return;
    }
    ddp_tb_scalar_t v[MAX_VALUES];
    int n = 0;
    const char *key;
    json_t *val;
    json_object_foreach(o, key, val) {
        const char *tag = tag_of(key);
        if (!tag || n == MAX_VALUES) continue;
        if (json_is_number(val))
            v[n++] = (ddp_tb_scalar_t){tag, (float)json_number_value(val)};
        else if (json_is_boolean(val))
            v[n++] = (ddp_tb_scalar_t){tag, json_is_true(val) ? 1.0f : 0.0f};
    }
    int rc = n ? ddp_tb_scalars(s->tb, (int64_t)json_integer_value(st), now_s(), v, n) : 0;
    if (rc) {
        DDP_WARN("tensorboard: writing %s failed (%s); no more events this run",
                 ddp_tb_path(s->tb), ddp_strerror(rc));
        ddp_tb_close(s->tb);
        s->tb = NULL;
    }
    json_decref(o);
}

static ssize_t sink_write(void *cookie, const char *buf, size_t size)
{
    sink_t *s = cookie;
    for (size_t off = 0; off < size;) {
        ssize_t w = write(s->fd, buf + off, size - off);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return off ? (ssize_t)off : -1;
        off += (size_t)w;
    }
    for (size_t i = 0; s->tb && i < size; i++) {
        if (buf[i] == '\n') {
            if (!s->overlong) tee_line(s, s->line, s->len);
            s->len = 0;
            s->overlong = 0;
        } else if (s->len < MAX_LINE) {
            s->line[s->len++] = buf[i];
        } else {
            s->overlong = 1;
        }
    }
    return (ssize_t)size;
}

static int sink_close(void *cookie)
{
    sink_t *s = cookie;
    int rc = close(s->fd);
    ddp_tb_close(s->tb);
    free(s->line);
    free(s);
    return rc;
}

FILE *ddp_metrics_open(const char *run_dir, const char *path)
{
    sink_t *s = ddp_calloc(1, sizeof *s);
    if (!s) return NULL;
    s->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (s->fd < 0) {
        int e = errno;
        free(s);
        errno = e;
        return NULL;
    }
    int rc = (s->line = ddp_malloc(MAX_LINE)) ? ddp_tb_open(run_dir, &s->tb) : DDP_ENOMEM;
    if (rc) DDP_WARN("tensorboard: cannot create an event file in %s/tb: %s", run_dir,
                     ddp_strerror(rc));
    cookie_io_functions_t io = {.write = sink_write, .close = sink_close};
    FILE *f = fopencookie(s, "a", io);
    if (!f) {
        int e = errno;
        sink_close(s);
        errno = e;
    }
    return f;
}
