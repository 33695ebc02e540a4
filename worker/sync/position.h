/* Where a run is, and what its last step cost: the state every rank of a world holds alike (the
 * step's vote and its all-reduced gradient keep it so), which checkpoints save and restore
 * (saving/saving.h: trainer.json) and the state transfer gives a rank that lacks it
 * (sync/transfer.h). The trainer holds one of each; nothing else keeps a copy.
 *
 * The data cursor is not here: it is derived from the step (step x sequences per global batch).
 * AdamW's update count is the optimizer's own (optim/adamw.h).
 *
 * What only some jobs need (a data mixture's per-source cursors, spike skipping's windows) is in
 * ddp_position_ext_t: the state transfer sends it as a second broadcast after its fixed header
 * only when the spec uses one of them (ddp_position_extended: both sides read the same spec), so
 * a job without them keeps the wire of older builds (an elastic job may mix builds).
 */
#ifndef DDP_WORKER_SYNC_POSITION_H
#define DDP_WORKER_SYNC_POSITION_H

#include <stdint.h>

#include "common/rng.h"
#include "proto/spec.h"
#include "worker/data/mixture.h"
#include "worker/sync/reducer.h"
#include "worker/sync/spikes.h"

/* The state of features a spec may leave off; all zero when it does. A plain struct (no
 * pointers): it travels as bytes between ranks of one build. */
typedef struct ddp_position_ext {
    int reserved; /* (the data mixture's and spike skipping's state join here) */
    /* ---- spike skipping and the wsd schedule (issue 48; sync/spikes.h, optim/schedule.h):
     * both z windows with the run's spike-skip totals, the non-finite skips (pos.skipped,
     * which trainer.json keeps under the same key), and a wsd decay moved by a resume (0: the
     * spec's own decay start). trainer.json: "spikes" and schedule.forked_at. */
    ddp_spikes_t spikes;
    long decay_forked_at;
    /* ---- end of spike skipping and wsd */
    /* ---- the data mixture (data.train a list of n_train > 1 sources; data/mixture.h): how many
     * sequences each source gave before sample step x G, and where the current weights took
     * effect. Advanced by every rank at the end of each step (the same for all). trainer.json:
     * data.mixture (saving/mixture_json.h). */
    ddp_mixture_state_t mix;
    /* ---- end of the data mixture */
} ddp_position_ext_t;

typedef struct ddp_position {
    long step;             /* optimizer steps completed */
    uint64_t tokens;       /* tokens trained on, all ranks */
    ddp_rng_t rng;         /* the trainer's RNG (sampling) */
    float loss_scale;      /* fp16's dynamic loss scale (1 otherwise; optim/loss_scale.h) */
    long loss_scale_clean; /* clean steps since it last changed */
    float last_loss;       /* the last step's mean training loss (NaN: resumed without one) */
    float last_val_loss;   /* the last validation's (0: none yet) */
    double last_norm;      /* the last step's gradient norm (after averaging, before clipping) */
    int skipped;           /* updates skipped for a non-finite gradient */
    ddp_position_ext_t ext; /* see above; zero unless ddp_position_extended */
} ddp_position_t;

/* 1 when the spec uses a feature whose state is in ddp_position_ext_t (the state transfer then
 * carries it), else 0. Pure. */
static inline int ddp_position_extended(const ddp_spec_t *spec)
{
    return ddp_spikes_on(spec) || spec->schedule == DDP_SCHED_WSD ||
           spec->n_train > 1; /* the data mixture */
}

/* What the last step cost on this rank. */
typedef struct ddp_step_times {
    double ms;                /* wall time of the step */
    double micro_ms;          /* forward + backward per micro-batch (0: computed none) */
    double compute_ms;        /* forward + backward, all micro-batches */
    double optim_ms;          /* gradient norm + optimizer update */
    int world;                /* the world it ran in */
    ddp_reducer_stats_t comm; /* its gradient all-reduce */
    ddp_skip_t skipped;       /* why its update was skipped (DDP_SKIP_NONE: applied) */
} ddp_step_times_t;

#endif
