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

/* The "mixture" object for s (the spec names the sources and their weights); NULL when s has
 * none or on ENOMEM. New reference. */
json_t *ddp__mixture_json(const ddp_spec_t *spec, const ddp_mixture_state_t *s);

/* Sets *s for a resume at sample `at` from the checkpoint's "data" object (may be NULL) by the
 * rules above; logs when `log`. path names the checkpoint in messages. Returns 0 or DDP_EFORMAT
 * (a malformed "mixture", naming the key). */
int ddp__mixture_resume(const ddp_spec_t *spec, json_t *data, int64_t at, ddp_mixture_state_t *s,
                        const char *path, int log, ddp_errinfo_t *ei);

#endif
