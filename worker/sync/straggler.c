/* Straggler detection (see straggler.h). */
#include "worker/sync/straggler.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"

int ddp_straggler_init(ddp_straggler_t *s, int n_ranks)
{
    ddp_straggler_close(s);
    s->slow = ddp_calloc((size_t)(n_ranks > 0 ? n_ranks : 1), sizeof *s->slow);
    if (!s->slow) return DDP_ENOMEM;
    s->n_ranks = n_ranks;
    s->named = -1;
    return 0;
}

void ddp_straggler_close(ddp_straggler_t *s)
{
    if (!s) return;
    free(s->slow);
    memset(s, 0, sizeof *s);
    s->named = -1;
}

static int by_value(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

int ddp_straggler_update(ddp_straggler_t *s, const float *compute_ms)
{
    if (s->n_ranks < 2) return -1;
    float sorted[64], *v = s->n_ranks <= 64 ? sorted : ddp_malloc((size_t)s->n_ranks * sizeof *v);
    if (!v) return -1;
    memcpy(v, compute_ms, (size_t)s->n_ranks * sizeof *v);
    qsort(v, (size_t)s->n_ranks, sizeof *v, by_value);
    double median = v[(s->n_ranks - 1) / 2];
    if (v != sorted) free(v);
    s->median_ms = median;
    int newly = -1, slowest = -1;
    for (int r = 0; r < s->n_ranks; r++) {
        int slow = median > 0 && compute_ms[r] >= DDP_STRAGGLER_RATIO * median;
        s->slow[r] = slow ? s->slow[r] + 1 : 0;
        if (s->slow[r] >= DDP_STRAGGLER_STEPS &&
            (slowest < 0 || compute_ms[r] > compute_ms[slowest]))
            slowest = r;
    }
    if (slowest >= 0 && slowest != s->named) newly = slowest;
    s->named = slowest;
    if (slowest >= 0) s->named_ms = compute_ms[slowest];
    return newly;
}
