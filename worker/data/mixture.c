/* The mixture's assignment: Tijdeman's deadline rule (see mixture.h). */
#include "worker/data/mixture.h"

#include <math.h>
#include <string.h>

int ddp_mixture_init(ddp_mixture_t *m, const double *weights, int n)
{
    memset(m, 0, sizeof *m);
    if (n < 1 || n > DDP_MIXTURE_MAX) return DDP_EINVAL;
    double sum = 0;
    for (int d = 0; d < n; d++) {
        if (!(weights[d] > 0) || !isfinite(weights[d])) return DDP_EINVAL;
        sum += weights[d];
    }
    m->n = n;
    for (int d = 0; d < n; d++) m->w[d] = weights[d] / sum;
    return 0;
}

void ddp_mixture_state_init(ddp_mixture_state_t *s, int n)
{
    memset(s, 0, sizeof *s);
    s->n = n;
}

int ddp_mixture_pick(const ddp_mixture_t *m, const ddp_mixture_state_t *s)
{
    int K = m->n;
    if (K <= 1) return 0;
    /* t samples since the base, this one included; a source may be picked only when its surplus
     * after the pick stays <= q (w t - c >= 1 - q: the sum of w t - c over the sources is 1, so
     * some source qualifies); of those, the earliest deadline: the source whose deficit would
     * pass q first if it got nothing more, at time (c + q) / w */
    double t = (double)(s->at - s->base_seq + 1);
    double q = 1.0 - 1.0 / (2.0 * K - 2.0);
    int best = -1, most_behind = 0;
    double best_deadline = 0, behind = -INFINITY;
    for (int d = 0; d < K; d++) {
        double c = (double)(s->count[d] - s->base[d]);
        double owed = m->w[d] * t - c;
        if (owed > behind) {
            behind = owed;
            most_behind = d;
        }
        /* 1e-9: rounding must not leave the set empty where the exact sum says otherwise */
        if (owed < (1.0 - q) - 1e-9) continue;
        double deadline = (c + q) / m->w[d];
        if (best < 0 || deadline < best_deadline) {
            best = d;
            best_deadline = deadline;
        }
    }
    return best >= 0 ? best : most_behind; /* (only under rounding) the largest deficit */
}

void ddp_mixture_draw(const ddp_mixture_t *m, ddp_mixture_state_t *s, int64_t count, int *src,
                      uint64_t *k, int64_t *drawn)
{
    for (int64_t i = 0; i < count; i++) {
        int d = ddp_mixture_pick(m, s);
        if (src) src[i] = d;
        if (k) k[i] = (uint64_t)s->count[d];
        if (drawn) drawn[d]++;
        s->count[d]++;
        s->at++;
    }
}

void ddp_mixture_rebase(ddp_mixture_state_t *s)
{
    s->base_seq = s->at;
    memcpy(s->base, s->count, sizeof s->base);
}

void ddp_mixture_seek(const ddp_mixture_t *m, ddp_mixture_state_t *s, int64_t to)
{
    if (to < s->at) {
        s->at = s->base_seq;
        memcpy(s->count, s->base, sizeof s->count);
    }
    ddp_mixture_draw(m, s, to - s->at, NULL, NULL, NULL);
}
