/* Spike skipping (train.skip_loss_z, train.skip_norm_z over train.skip_window): llm.c's outlier
 * detector (llmc/outlier_detector.h), made exact across resumes and rejoins.
 *
 * A window holds the last `size` values of a series (the step's global loss after the vote, and
 * the reduced gradient norm: the same on every rank, so every rank decides alike). A new value
 * enters the window first, evicting the oldest once it is full; z = (x - mean) / sd over the
 * window, x included, with the POPULATION variance; no z (NaN) until the window was full before
 * the value entered (the first `size` values only fill it). So |z| <= sqrt(size - 1). Only a
 * spike above the mean skips (z > threshold: one-sided); the loss is tested first.
 *
 * Differences from llm.c, on purpose: the mean and variance are computed afresh over the window
 * in slot order (two passes, in double) instead of llm.c's running sums, so z depends only on the
 * window's contents, which checkpoints and the state transfer carry (a resumed run skips exactly
 * as an uninterrupted one); a non-finite value never enters a window (its step is skipped by the
 * non-finite rule, and one NaN would poison llm.c's sums for good).
 *
 * The windows are plain bytes (they travel in sync/position.h's ddp_position_ext_t). Pure
 * functions; any thread.
 */
#ifndef DDP_WORKER_SYNC_SPIKES_H
#define DDP_WORKER_SYNC_SPIKES_H

#include <stdint.h>

#include "proto/spec.h"

typedef struct ddp_spike_window {
    int32_t count; /* values held, up to the window's size */
    int32_t index; /* once full: the slot the next value replaces (the oldest) */
    double values[DDP_SPEC_MAX_SKIP_WINDOW];
} ddp_spike_window_t;

/* Why a step's update was skipped. */
typedef enum ddp_skip {
    DDP_SKIP_NONE = 0,
    DDP_SKIP_NONFINITE, /* a non-finite gradient norm (step.c) */
    DDP_SKIP_LOSS,      /* the loss's z above train.skip_loss_z */
    DDP_SKIP_NORM,      /* the gradient norm's z above train.skip_norm_z */
} ddp_skip_t;

/* Both windows, and how many updates each rule skipped (the run's totals). */
typedef struct ddp_spikes {
    ddp_spike_window_t loss, norm;
    int64_t skipped_loss, skipped_norm;
} ddp_spikes_t;

/* 1 when the spec skips spikes (either threshold > 0). */
static inline int ddp_spikes_on(const ddp_spec_t *spec)
{
    return spec->skip_loss_z > 0 || spec->skip_norm_z > 0;
}

/* Enters x into w, a window of `size` (2..DDP_SPEC_MAX_SKIP_WINDOW) values, and returns x's z,
 * or NaN while the window was not full before x entered (or x is not finite: it does not enter).
 * A window of zero spread gives z = 0. */
double ddp_spike_push(ddp_spike_window_t *w, int size, double x);

/* The step's decision: enters loss and norm into their windows (both, whatever is decided) and
 * returns DDP_SKIP_LOSS when the loss's z exceeds spec->skip_loss_z (> 0), else DDP_SKIP_NORM when
 * the norm's exceeds spec->skip_norm_z (> 0), else DDP_SKIP_NONE, counting a skip in s. *z_loss
 * and *z_norm (when not NULL) get the z values. A non-finite norm or loss enters no window and
 * decides nothing (DDP_SKIP_NONE: the non-finite rule skips that step). */
ddp_skip_t ddp_spikes_step(ddp_spikes_t *s, const ddp_spec_t *spec, double loss, double norm,
                           double *z_loss, double *z_norm);

/* "nonfinite", "loss", "norm", or NULL for DDP_SKIP_NONE: the metrics' "skipped" value. */
const char *ddp_skip_name(ddp_skip_t why);

#endif
