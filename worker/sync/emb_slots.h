/* The token embedding's gradient slots: wte's share of the gradient that comes from the token
 * embedding travels apart from the arena (model/model.h says why).
 *
 * Every micro-step of every rank leaves its tokens and embedding-output gradient in slot
 * g = micro * W + rank (W and rank of the deal, which an overlapped state transfer narrows: the
 * caller names the slot), its global micro-batch index; other slots stay zero. The n_micro slots
 * are summed over the ranks (a gather: each slot has one non-zero contributor), and every rank
 * adds all of them to the reduced wte gradient in slot order. Slot order is the global
 * micro-batch order, so this part of the sum is the same at any world size. A slot holds B*T
 * tokens (as floats: exact below 2^24) and then B*T*C gradient values.
 *
 * Training thread only.
 */
#ifndef DDP_WORKER_SYNC_EMB_SLOTS_H
#define DDP_WORKER_SYNC_EMB_SLOTS_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "worker/model/model.h"
#include "worker/sync/world.h"

typedef struct ddp_emb_slots {
    const ddp_world_t *world; /* the attach's (borrowed) */
    ddp_model_t *model;       /* whose wte gradient they add to (borrowed) */
    int B, T, n_slots;        /* micro-batch, sequence, slots (micro-batches per step) */
    size_t slot_floats;       /* B*T + B*T*C */
    size_t bytes;             /* of all the slots */
    float *slots;             /* all-reduced in place (ddp_world_alloc_reduced) */
    float *tokens_f;          /* host staging: every slot's tokens as floats (a world of one
                               * keeps its own there) */
    int32_t *tokens;          /* and one slot's as token ids */
} ddp_emb_slots_t;

/* At each attach to a world: n_slots zeroed slots for micro-batches of B x T tokens, where the
 * world reduces in place, and the staging. Returns 0 or the error. */
int ddp_emb_slots_attach(ddp_emb_slots_t *e, const ddp_world_t *world, ddp_model_t *model, int B,
                         int T, int n_slots, ddp_errinfo_t *ei);
/* Before leaving the world (while its collective memory exists); NULL-safe, idempotent. */
void ddp_emb_slots_detach(ddp_emb_slots_t *e);
/* Zeroes every slot (queued on the kernels' stream). */
int ddp_emb_slots_clear(ddp_emb_slots_t *e);
/* Slot `slot` gets a micro-step's tokens and the embedding output's gradient (acts.dres). */
int ddp_emb_slots_keep(ddp_emb_slots_t *e, int slot, const int32_t *inputs);
/* Collective: sums the slots over the ranks and adds each slot's share to wte's gradient, in
 * slot order. Returns 0 or the error, with ei naming it. */
int ddp_emb_slots_add(ddp_emb_slots_t *e, ddp_errinfo_t *ei);

#endif
