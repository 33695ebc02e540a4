/* The tail of rank 0's metrics.jsonl (see job_tail.h). */
#include "daemon/job_tail.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "daemon/userfs.h"

static void tail_line(ddpd_tail_t *t, const char *line, size_t len)
{
    ddp_metrics_rec_t r;
    if (ddp_metrics_parse(line, len, &r, NULL) != 0) return; /* not a line (yet) */
    if (r.kind == DDP_METRICS_DONE) {
        t->done = r;
        t->has_done = 1;
    } else if (r.kind == DDP_METRICS_VAL && t->has_last) {
        /* a validation line adds to its step's record (the loss and speed stay shown) */
        t->last_step.val_loss = r.val_loss;
        t->last_step.has |= DDP_MF(VAL_LOSS);
    } else if (r.kind == DDP_METRICS_STEP || r.kind == DDP_METRICS_VAL) {
        if (!t->has_last && !t->first_step_ms) t->first_step_ms = ddp_wall_ms();
        t->last_step = r;
        t->has_last = 1;
    } /* other events (a new generation) are not a step's record */
}

int ddpd_tail_read(ddpd_tail_t *t, const char *run_dir, uint32_t owner)
{
    char why[256];
    int fd = ddpd_userfile_open_in(run_dir, "metrics.jsonl", owner, why, sizeof why);
    if (fd < 0) return 0;
    char buf[65536];
    int got = 0;
    ssize_t n = pread(fd, buf, sizeof buf, t->off);
    close(fd);
    if (n <= 0) return 0;
    t->off += n;
    for (ssize_t i = 0; i < n; i++) {
        if (buf[i] == '\n') {
            tail_line(t, t->partial, t->partial_len);
            t->partial_len = 0;
            got = 1;
        } else if (t->partial_len < sizeof t->partial) {
            t->partial[t->partial_len++] = buf[i];
        }
    }
    return got;
}

void ddpd_tail_from_end(ddpd_tail_t *t, const char *run_dir, uint32_t owner)
{
    char buf[4096], why[256];
    struct stat st;
    int fd = ddpd_userfile_open_in(run_dir, "metrics.jsonl", owner, why, sizeof why);
    if (fd < 0) return;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return;
    }
    t->off = st.st_size > 65536 ? st.st_size - 65536 : 0;
    ssize_t n = t->off > 0 ? pread(fd, buf, sizeof buf, t->off) : 0;
    close(fd);
    for (ssize_t i = 0; i < n; i++) /* skip the first, partial, line */
        if (buf[i] == '\n') {
            t->off += i + 1;
            break;
        }
    while (ddpd_tail_read(t, run_dir, owner)) {
    }
}

void ddpd_tail_close(ddpd_tail_t *t)
{
    t->has_last = t->has_done = 0;
}
