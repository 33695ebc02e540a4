/* Straggler detection: every rank's compute time of each step travels with the step's small
 * all-reduce (worker/step.c), and a rank whose compute stays >= 20% above the median for
 * DDP_STRAGGLER_STEPS steps in a row is named (log, metrics.jsonl, ddpctl status, Prometheus)
 * before it slows everyone for long. Pure bookkeeping; the caller's thread only.
 */
#ifndef DDP_WORKER_SYNC_STRAGGLER_H
#define DDP_WORKER_SYNC_STRAGGLER_H

#define DDP_STRAGGLER_RATIO 1.2 /* compute >= 1.2 x the median is slow */
#define DDP_STRAGGLER_STEPS 5   /* slow this many steps in a row: named */

typedef struct ddp_straggler {
    int n_ranks;      /* the length of the arrays: the world's size at init */
    int *slow;        /* [n_ranks]: steps in a row each rank was slow */
    int named;        /* the rank named now, -1 none */
    double named_ms;  /* its compute ms in the last step */
    double median_ms; /* the median of the last step */
} ddp_straggler_t;

/* For a world of n_ranks ranks; nothing named. Returns 0 or DDP_ENOMEM. */
int ddp_straggler_init(ddp_straggler_t *s, int n_ranks);
void ddp_straggler_close(ddp_straggler_t *s); /* NULL-safe */
/* With every rank's compute ms of one step ([n_ranks]): returns the rank that has just become the
 * named straggler (slow DDP_STRAGGLER_STEPS steps in a row), else -1. A named rank stays named
 * while it stays slow; s->named is -1 once it is not. The median is the lower one (with two
 * ranks, the faster), so one slow rank cannot raise it. */
int ddp_straggler_update(ddp_straggler_t *s, const float *compute_ms);

#endif
