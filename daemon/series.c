/* metrics.jsonl into arrays (see series.h), each line through the metrics codec. */
#include "daemon/series.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "proto/metrics.h"

/* Makes room for `need` elements in each of the arrays at ptrs[0..n) (all of capacity *cap and
 * element size `elem`); *cap is updated only when every realloc succeeded. */
static int reserve(void **ptrs[], int n, size_t elem, size_t *cap, size_t need)
{
    if (need <= *cap) return 0;
    size_t c = *cap ? *cap * 2 : 256;
    for (int i = 0; i < n; i++) {
        void *q = realloc(*ptrs[i], c * elem);
        if (!q) return DDP_ENOMEM;
        *ptrs[i] = q;
    }
    *cap = c;
    return 0;
}

/* r holds the field and it is a number (null is not) */
static int has_number(const ddp_metrics_rec_t *r, uint64_t bit, double v)
{
    return (r->has & bit) && !isnan(v);
}

static int add_line(ddpd_series_t *s, const char *line, size_t len)
{
    ddp_metrics_rec_t r;
    int rc = 0;
    if (ddp_metrics_parse(line, len, &r, NULL) != 0 || !(r.has & DDP_MF(STEP))) return 0;
    long step = (long)r.step;
    if (has_number(&r, DDP_MF(LOSS), r.loss)) {
        /* long and double are both 8 bytes here, so one element size serves all four */
        _Static_assert(sizeof(long) == sizeof(double), "series arrays share an element size");
        void **arrays[] = {(void **)&s->step, (void **)&s->loss, (void **)&s->tps,
                           (void **)&s->mfu, (void **)&s->gen};
        if ((rc = reserve(arrays, 5, sizeof(double), &s->cap, s->n + 1))) return rc;
        s->step[s->n] = step;
        s->loss[s->n] = r.loss;
        s->tps[s->n] = has_number(&r, DDP_MF(TOKENS_PER_S), r.tokens_per_s) ? r.tokens_per_s : NAN;
        s->mfu[s->n] = has_number(&r, DDP_MF(MFU), r.mfu) ? r.mfu : NAN;
        s->gen[s->n] = (r.has & DDP_MF(GENERATION)) ? (long)r.generation : -1;
        s->n++;
    }
    if (has_number(&r, DDP_MF(VAL_LOSS), r.val_loss)) {
        void **arrays[] = {(void **)&s->val_step, (void **)&s->val_loss};
        if ((rc = reserve(arrays, 2, sizeof(double), &s->cap_val, s->n_val + 1))) return rc;
        s->val_step[s->n_val] = step;
        s->val_loss[s->n_val] = r.val_loss;
        s->n_val++;
    }
    return 0;
}

int ddpd_series_read(const char *path, off_t tail, ddpd_series_t *s)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        memset(s, 0, sizeof *s);
        return -errno;
    }
    return ddpd_series_read_fd(fd, tail, s);
}

int ddpd_series_read_fd(int fd, off_t tail, ddpd_series_t *s)
{
    memset(s, 0, sizeof *s);
    FILE *f = fdopen(fd, "r");
    if (!f) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    int skip_first = 0;
    if (tail > 0 && fseeko(f, 0, SEEK_END) == 0) {
        skip_first = ftello(f) > tail;
        fseeko(f, skip_first ? -tail : 0, skip_first ? SEEK_END : SEEK_SET);
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0;
    while (rc == 0 && (len = getline(&line, &cap, f)) > 0) {
        if (skip_first) {
            skip_first = 0;
            continue;
        }
        if (line[len - 1] != '\n') break; /* being written */
        rc = add_line(s, line, (size_t)len);
    }
    free(line);
    fclose(f);
    if (rc) ddpd_series_free(s);
    return rc;
}

void ddpd_series_free(ddpd_series_t *s)
{
    if (!s) return;
    free(s->step);
    free(s->loss);
    free(s->tps);
    free(s->mfu);
    free(s->gen);
    free(s->val_step);
    free(s->val_loss);
    memset(s, 0, sizeof *s);
}
