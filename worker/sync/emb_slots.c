/* The token embedding's gradient slots (see emb_slots.h). */
#include "worker/sync/emb_slots.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

int ddp_emb_slots_attach(ddp_emb_slots_t *e, const ddp_world_t *world, ddp_model_t *model, int B,
                         int T, int n_slots, ddp_errinfo_t *ei)
{
    ddp_emb_slots_detach(e);
    size_t BT = (size_t)B * T;
    size_t slot_floats = BT + BT * (size_t)model->cfg.n_embd;
    *e = (ddp_emb_slots_t){.world = world,
                           .model = model,
                           .B = B,
                           .T = T,
                           .n_slots = n_slots,
                           .slot_floats = slot_floats,
                           .bytes = (size_t)n_slots * slot_floats * sizeof(float)};
    e->tokens_f = ddp_malloc((size_t)n_slots * BT * sizeof(float));
    e->tokens = ddp_malloc(BT * sizeof(int32_t));
    if (!e->tokens_f || !e->tokens) return DDP_ENOMEM;
    return ddp_world_alloc_reduced(world, e->bytes, &e->slots, ei);
}

void ddp_emb_slots_detach(ddp_emb_slots_t *e)
{
    if (!e) return;
    if (e->slots) ddp_world_free_reduced(e->world, e->slots);
    free(e->tokens_f);
    free(e->tokens);
    memset(e, 0, sizeof *e);
}

int ddp_emb_slots_clear(ddp_emb_slots_t *e)
{
    return ddp_k_memset0(e->model->k, e->slots, e->bytes);
}

int ddp_emb_slots_keep(ddp_emb_slots_t *e, int slot, const int32_t *inputs)
{
    ddp_kernels_t *k = e->model->k;
    size_t BT = (size_t)e->B * e->T, g = (size_t)slot;
    float *dst = e->slots + g * e->slot_floats;
    /* the host's copy of the slot's tokens: a world of one reads them from here */
    float *tokens = e->tokens_f + (e->world->comm ? 0 : g * BT);
    for (size_t i = 0; i < BT; i++) tokens[i] = (float)inputs[i];
    DDP_CHECK(ddp_k_memcpy_h2d(k, dst, tokens, BT * sizeof(float)));
    return ddp_k_memcpy_d2d(k, dst + BT, e->model->acts.dres,
                            BT * e->model->cfg.n_embd * sizeof(float));
}

int ddp_emb_slots_add(ddp_emb_slots_t *e, ddp_errinfo_t *ei)
{
    ddp_model_t *m = e->model;
    ddp_kernels_t *k = m->k;
    size_t BT = (size_t)e->B * e->T, n = (size_t)e->n_slots;
    if (e->world->comm) {
        /* the slots' copies are queued on the compute stream: the all-reduce after them */
        DDP_CHECK(ddp_world_after_compute(e->world));
        DDP_CHECK(ddp_world_allreduce(e->world, e->slots, n * e->slot_floats, DDP_OP_SUM, ei));
    }
    /* every slot's tokens to the host at once (one wait; a world of one has them already),
     * then each slot's backward queued behind its tokens' copy (memcpy_h2d reads them at the
     * call: the buffer is reused) */
    for (size_t g = 0; e->world->comm && g < n; g++)
        DDP_CHECK(ddp_k_memcpy_d2h(k, e->tokens_f + g * BT, e->slots + g * e->slot_floats,
                                   BT * sizeof(float)));
    for (size_t g = 0; g < n; g++) {
        for (size_t i = 0; i < BT; i++) e->tokens[i] = (int32_t)e->tokens_f[g * BT + i];
        DDP_CHECK(ddp_k_memcpy_h2d(k, m->acts.inputs, e->tokens, BT * sizeof(int32_t)));
        ddp_model_embed_backward(m, m->acts.inputs, e->slots + g * e->slot_floats + BT, e->B, e->T);
    }
    return ddp_k_sync(k);
}
