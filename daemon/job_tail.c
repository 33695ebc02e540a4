/* The view of a running job from rank 0's metrics.jsonl (see job_tail.h). */
#include "daemon/job_tail.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"

static void tail_line(ddpd_job_t *j, const char *line, size_t len)
{
    json_t *o = json_loadb(line, len, 0, NULL);
    if (!json_is_object(o)) {
        json_decref(o);
        return;
    }
    const char *ev = json_string_value(json_object_get(o, "event"));
    if (ev && !strcmp(ev, "done")) {
        json_decref(j->done);
        j->done = o;
    } else if (!ev && j->last_step && json_object_get(o, "val_loss") &&
               !json_object_get(o, "loss")) {
        /* a validation line adds to its step's record (the loss and speed stay shown) */
        json_object_set(j->last_step, "val_loss", json_object_get(o, "val_loss"));
        json_decref(o);
    } else if (!ev && json_is_integer(json_object_get(o, "step"))) {
        if (!j->last_step && !j->first_step_ms) j->first_step_ms = ddp_wall_ms();
        json_decref(j->last_step);
        j->last_step = o;
    } else { /* other events (a new generation) are not a step's record */
        json_decref(o);
    }
}

int ddpd_job_tail_read(ddpd_job_t *j)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", j->run_dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char buf[65536];
    int got = 0;
    ssize_t n = pread(fd, buf, sizeof buf, j->metrics_off);
    close(fd);
    if (n <= 0) return 0;
    j->metrics_off += n;
    for (ssize_t i = 0; i < n; i++) {
        if (buf[i] == '\n') {
            tail_line(j, j->partial, j->partial_len);
            j->partial_len = 0;
            got = 1;
        } else if (j->partial_len < sizeof j->partial) {
            j->partial[j->partial_len++] = buf[i];
        }
    }
    return got;
}

void ddpd_job_tail_from_end(ddpd_job_t *j)
{
    char path[PATH_MAX + 32], buf[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", j->run_dir);
    struct stat st;
    if (stat(path, &st) != 0) return;
    j->metrics_off = st.st_size > 65536 ? st.st_size - 65536 : 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 && j->metrics_off > 0 ? pread(fd, buf, sizeof buf, j->metrics_off) : 0;
    if (fd >= 0) close(fd);
    for (ssize_t i = 0; i < n; i++) /* skip the first, partial, line */
        if (buf[i] == '\n') {
            j->metrics_off += i + 1;
            break;
        }
    while (ddpd_job_tail_read(j)) {
    }
}

json_t *ddpd_job_progress(const ddpd_job_t *j)
{
    json_t *o = json_pack("{sI ss ss ss si}", "id", (json_int_t)j->id, "name", j->name, "state",
                          ddpd_state_name(j->state), "reason", j->reason, "world", j->world);
    json_object_set_new(o, "steps", json_integer(j->steps));
    if (j->last_step) {
        json_t *m = j->last_step;
        json_object_set(o, "metrics", m);
        json_int_t step = json_integer_value(json_object_get(m, "step"));
        json_t *tot = json_object_get(m, "steps");
        long steps = json_is_integer(tot) ? (long)json_integer_value(tot) : j->steps;
        json_object_set_new(o, "step", json_integer(step));
        json_object_set_new(o, "steps", json_integer(steps));
        json_t *v;
        if ((v = json_object_get(m, "loss"))) json_object_set(o, "loss", v);
        if ((v = json_object_get(m, "tokens_per_s"))) json_object_set(o, "tokens_per_s", v);
        if ((v = json_object_get(m, "straggler"))) json_object_set(o, "straggler", v);
        double el = (double)(ddp_wall_ms() - j->first_step_ms) / 1000.0;
        json_t *sms = json_object_get(m, "step_ms");
        double per_step = json_is_number(sms) ? json_number_value(sms) / 1000.0 : 0;
        if (per_step <= 0 && step > 0) per_step = el / (double)step;
        if (steps > step && per_step > 0)
            json_object_set_new(o, "eta_s", json_real((double)(steps - step) * per_step));
    }
    if (j->done) json_object_set(o, "done", j->done);
    return o;
}

