/* trainer.json's schedule block and its "spikes" key (issue 48): what saving.c's trainer.json
 * writes of the learning-rate schedule and of spike skipping, and what a resume reads back.
 *
 * "schedule" keeps its keys (step, lr_at_step, lr_last, warmup, steps, kind) and format
 * "ddpd-trainer-1"; kind is now every schedule's own name (older builds wrote "constant" for any
 * non-cosine one), and lr, min_lr (and for wsd decay_start, decay_steps, decay_shape,
 * forked_at) follow. "spikes" (when spike skipping is on, or a step was skipped) holds both z
 * windows (window, and per series count, index and the values in slot order, written %.17g: they
 * read back bit for bit) and the run's skip counts. Every new field is optional on read: an
 * older trainer.json resumes as before (no schedule check without a kind, empty windows).
 * A resume may change ddp.grad_dtype (read from the saved spec; logged, never refused).
 *
 * Threads: the training thread (saving.c's callers).
 */
#ifndef DDP_WORKER_SAVING_TRAINER_EXT_H
#define DDP_WORKER_SAVING_TRAINER_EXT_H

#include <jansson.h>

#include "common/err.h"
#include "proto/spec.h"
#include "worker/sync/position.h"

/* The "schedule" object of trainer.json at pos (a new reference; NULL: out of memory). */
json_t *ddp__trainer_ext_schedule(const ddp_spec_t *spec, const ddp_position_t *pos);

/* The "spikes" object, or NULL when the spec skips no spikes and no update was skipped
 * (trainer.json then has no "spikes" key). */
json_t *ddp__trainer_ext_spikes(const ddp_spec_t *spec, const ddp_position_t *pos);

/* On resume, with trainer.json's object o (path names it in messages) and pos->step already
 * read: applies the schedule's resume rule (optim/schedule.h: a refused change returns DDP_ESPEC
 * with ei saying why and which flag allows it; a moved wsd decay sets pos->ext.decay_forked_at,
 * which the trainer applies to its spec with ddp_schedule_fork) and restores the spike windows
 * and skip counts into pos (windows of another train.skip_window start empty, logged). Rank 0
 * (log) logs what moved. Returns 0 or DDP_ESPEC. */
int ddp__trainer_ext_read(const ddp_spec_t *spec, json_t *o, const char *path, int log,
                          ddp_position_t *pos, ddp_errinfo_t *ei);

#endif
