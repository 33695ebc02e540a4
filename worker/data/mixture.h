/* A weighted data mixture (data.train as a list of sources): which source each sample of the run
 * comes from, as a pure function of the weights and the per-source counts, so that every rank
 * computes the same assignment of a whole global batch and the samples of a step do not depend on
 * the world size.
 *
 * The assignment is Tijdeman's chairman-assignment rule (R. Tijdeman, "The chairman assignment
 * problem", Discrete Math. 32, 1980), a deadline variant of Megatron's largest-deficit greedy
 * (build_blending_indices). With K sources of normalised weights w_d, counting from the sample
 * base_seq where the weights took effect (t = j - base_seq + 1 samples so far, including j, and
 * c_d = count_d - base_d drawn since then), sample j goes to the source with the smallest
 * deadline (c_d + q) / w_d among those with w_d t - c_d >= 1 - q, where q = 1 - 1/(2K - 2) (ties:
 * the lowest index). Tijdeman proves that then, at every prefix,
 *
 *     |count_d - base_d - w_d (j - base_seq)| <= 1 - 1/(2K - 2)  (< 1; 1/2 for K = 2)
 *
 * for every source, whatever the weights. Megatron's greedy (argmax w_d max(i, 1) - c_d) only
 * bounds the surplus: with K > 2 a source may fall behind by more than one sequence (-1.96
 * measured; the (i + 1) variant still -1.25), which is why it is not used. tests/unit/worker/
 * test_mixture.c measures the bound at every prefix of 10,000 samples for K = 2..8.
 *
 * Weights changed on resume continue from the saved counts (ddp_mixture_rebase): nothing drawn
 * is drawn again, nothing is skipped, and the bound holds again from the new base.
 * Pure functions on caller-owned memory; any thread.
 */
#ifndef DDP_WORKER_DATA_MIXTURE_H
#define DDP_WORKER_DATA_MIXTURE_H

#include <stdint.h>

#include "common/err.h"
#include "proto/spec.h"

#define DDP_MIXTURE_MAX DDP_SPEC_MAX_SOURCES

/* The weights, normalised to sum 1. */
typedef struct ddp_mixture {
    int n;
    double w[DDP_MIXTURE_MAX];
} ddp_mixture_t;

/* Where a mixture is: plain bytes (no pointers), so that it travels in the state transfer
 * (sync/position.h) and is saved in trainer.json (saving/saving.c). All zero: no mixture. */
typedef struct ddp_mixture_state {
    int32_t n;                      /* sources; 0: no mixture */
    int32_t reserved;               /* zero */
    int64_t at;                     /* the global sample index the counts are at */
    int64_t base_seq;               /* the sample where the weights took effect (0, or a resume) */
    int64_t count[DDP_MIXTURE_MAX]; /* sequences drawn from each source in samples [0, at) */
    int64_t base[DDP_MIXTURE_MAX];  /* count at base_seq */
} ddp_mixture_state_t;

/* Normalises n (1..DDP_MIXTURE_MAX) weights, each > 0 and finite, into *m. Returns 0 or
 * DDP_EINVAL. */
int ddp_mixture_init(ddp_mixture_t *m, const double *weights, int n);

/* A state of n sources at sample 0. */
void ddp_mixture_state_init(ddp_mixture_state_t *s, int n);

/* The source of sample s->at (see above). s->n must be m->n. */
int ddp_mixture_pick(const ddp_mixture_t *m, const ddp_mixture_state_t *s);

/* Assigns the `count` samples from s->at on and advances s past them: src[i] gets the source of
 * sample s->at + i and k[i] its index within that source (count_d before the draw: the k-th
 * sequence of source d), drawn[d] += the samples each source got. src, k, drawn may be NULL. */
void ddp_mixture_draw(const ddp_mixture_t *m, ddp_mixture_state_t *s, int64_t count, int *src,
                      uint64_t *k, int64_t *drawn);

/* New weights take effect at s->at: base_seq = at, base = count. */
void ddp_mixture_rebase(ddp_mixture_state_t *s);

/* Moves s to sample `to` (>= s->base_seq): forward by drawing, backward by replaying from the
 * base (O((to - base_seq) K)). */
void ddp_mixture_seek(const ddp_mixture_t *m, ddp_mixture_state_t *s, int64_t to);

#endif
