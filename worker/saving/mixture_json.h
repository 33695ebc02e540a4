/* trainer.json's data.mixture: a data mixture's per-source cursors in a checkpoint, and what a
 * resume makes of them (saving.c calls these; internal to saving/).
 *
 *   "data": {"cursor": .., ..., "mixture": {"at": J, "base_seq": J0,
 *            "sources": [{"name": "web", "weight": 0.7, "count": N, "base": N0}, ...]}}
 *
 * Resume rules (data.train a list of n_train > 1 sources):
 * - the same sources, weights and order, at the same sample: the saved position as it is (the run
 *   goes on bitwise as if never stopped);
 * - anything else (weights changed, sources added, removed or reordered, the global batch
 *   changed): every source keeps its count, matched by name (nothing repeated, nothing skipped),
 *   and the weights take effect from the resume's sample (ddp_mixture_rebase); the old and new
 *   weights are logged. A source new to the list starts at its sequence 0 (logged); a source no
 *   longer in the list is dropped with a warning naming it and its count (listed again later, it
 *   would start over at 0);
 * - a checkpoint without cursors (a single-source run, an older build): every source starts at
 *   0 at the resume's sample (logged);
 * - data.train one source again after a mixture: that source continues at sample step x G of its
 *   own order, as a single-source run does (a warning names the dropped mixture).
 */
#ifndef DDP_WORKER_SAVING_MIXTURE_JSON_H
#define DDP_WORKER_SAVING_MIXTURE_JSON_H

#include <jansson.h>
#include <stdint.h>

#include "proto/spec.h"
#include "worker/data/mixture.h"
#include "worker/sync/position.h"

/* Adds data.mixture to trainer.json's object o for pos->ext.mix (the spec names the sources and
 * their weights); nothing when the run has no mixture (or on ENOMEM: the checkpoint then resumes
 * as one without cursors). */
void ddp__mixture_save(json_t *o, const ddp_spec_t *spec, const ddp_position_t *pos);

/* Sets pos->ext.mix for a resume at sample pos->step x G from the checkpoint's "data" object
 * (may be NULL) by the rules above; rank 0 logs. path names the checkpoint in messages. Returns
 * 0 or DDP_EFORMAT (a malformed "mixture", naming the key). */
int ddp__mixture_read(const ddp_spec_t *spec, json_t *data, long G, const char *path, int rank,
                      ddp_position_t *pos, ddp_errinfo_t *ei);

#endif
