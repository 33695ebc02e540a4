/* metrics.jsonl into arrays (see series.h). */
#include "daemon/series.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"

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

static int add_line(ddpd_series_t *s, const char *line, size_t len)
{
    json_t *o = json_loadb(line, len, 0, NULL);
    json_t *st = json_object_get(o, "step"), *v;
    int rc = 0;
    if (!json_is_integer(st)) goto out;
    long step = (long)json_integer_value(st);
    if (json_is_number(v = json_object_get(o, "loss"))) {
        /* long and double are both 8 bytes here, so one element size serves all four */
        _Static_assert(sizeof(long) == sizeof(double), "series arrays share an element size");
        void **arrays[] = {(void **)&s->step, (void **)&s->loss, (void **)&s->tps,
                           (void **)&s->gen};
        if ((rc = reserve(arrays, 4, sizeof(double), &s->cap, s->n + 1))) goto out;
        json_t *t = json_object_get(o, "tokens_per_s"), *g = json_object_get(o, "generation");
        s->step[s->n] = step;
        s->loss[s->n] = json_number_value(v);
        s->tps[s->n] = json_is_number(t) ? json_number_value(t) : NAN;
        s->gen[s->n] = json_is_integer(g) ? (long)json_integer_value(g) : -1;
        s->n++;
    }
    if (json_is_number(v = json_object_get(o, "val_loss"))) {
        void **arrays[] = {(void **)&s->val_step, (void **)&s->val_loss};
        if ((rc = reserve(arrays, 2, sizeof(double), &s->cap_val, s->n_val + 1))) goto out;
        s->val_step[s->n_val] = step;
        s->val_loss[s->n_val] = json_number_value(v);
        s->n_val++;
    }
out:
    json_decref(o);
    return rc;
}

int ddpd_series_read(const char *path, off_t tail, ddpd_series_t *s)
{
    memset(s, 0, sizeof *s);
    FILE *f = fopen(path, "re");
    if (!f) return -errno;
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
    free(s->gen);
    free(s->val_step);
    free(s->val_loss);
    memset(s, 0, sizeof *s);
}
