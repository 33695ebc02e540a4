/* The token embedding's gradient slots (train_step.c calls them within its step).
 *
 * The token embedding's share of wte's gradient travels apart from the arena (model.h says
 * why): every micro-step of every rank leaves its tokens and embedding-output gradient in slot
 * g = micro * W + rank of t->emb (W and rank of the deal: train_generation.c's set_deal), its
 * global micro-batch index (other slots stay zero); the n_micro slots are summed over the ranks (a
 * gather: each slot has one non-zero contributor), and every rank adds all of them to the
 * reduced wte gradient in slot order. Slot order is the global micro-batch order, so this part
 * of the sum is the same at any world size. A slot holds B*T tokens (as floats: exact below
 * 2^24) and then B*T*C gradient values. Training thread.
 */
#include <stdlib.h>

#include "worker/sync/reducer.h"
#include "worker/trainer_int.h"

size_t ddp__trainer_emb_slot_floats(const ddp_trainer_t *t)
{
    size_t BT = (size_t)t->spec.micro_batch * t->spec.seq_len;
    return BT + BT * (size_t)t->model.cfg.n_embd;
}

int ddp__trainer_keep_embedding_grad(ddp_trainer_t *t, int micro, const int32_t *inputs)
{
    ddp_kernels_t *k = &t->k;
    size_t BT = (size_t)t->spec.micro_batch * t->spec.seq_len;
    size_t g = (size_t)(micro * t->deal_world + t->deal_rank);
    float *slot = t->emb + g * ddp__trainer_emb_slot_floats(t);
    /* the host's copy of the slot's tokens: a world of one reads them from here */
    float *tokens = t->emb_tokens_f + (t->world.comm ? 0 : g * BT);
    for (size_t i = 0; i < BT; i++) tokens[i] = (float)inputs[i];
    DDP_CHECK(ddp_k_memcpy_h2d(k, slot, tokens, BT * sizeof(float)));
    return ddp_k_memcpy_d2d(k, slot + BT, t->model.acts.dres,
                            BT * t->model.cfg.n_embd * sizeof(float));
}

int ddp__trainer_add_embedding_grads(ddp_trainer_t *t, ddp_errinfo_t *ei)
{
    ddp_kernels_t *k = &t->k;
    int B = t->spec.micro_batch, T = t->spec.seq_len;
    size_t BT = (size_t)B * T, n_slots = (size_t)t->n_micro;
    if (t->world.comm) {
        ddp_coll_req_t *req;
        /* the slots' copies are queued on the compute stream (issue 24, finding 1) */
        DDP_CHECK(ddp_world_after_compute(&t->world));
        DDP_CHECK(ddp_coll_allreduce(t->world.comm, t->emb, n_slots * ddp__trainer_emb_slot_floats(t), DDP_DT_F32,
                                     DDP_OP_SUM, &req));
        DDP_CHECK(ddp_coll_wait(req, 0, ei));
    }
    /* every slot's tokens to the host at once (one wait; a world of one has them already),
     * then each slot's backward queued behind its tokens' copy (memcpy_h2d reads them at the
     * call: the buffer is reused) */
    size_t slot_floats = ddp__trainer_emb_slot_floats(t);
    for (size_t g = 0; t->world.comm && g < n_slots; g++)
        DDP_CHECK(ddp_k_memcpy_d2h(k, t->emb_tokens_f + g * BT, t->emb + g * slot_floats,
                                   BT * sizeof(float)));
    for (size_t g = 0; g < n_slots; g++) {
        for (size_t i = 0; i < BT; i++) t->emb_tokens[i] = (int32_t)t->emb_tokens_f[g * BT + i];
        DDP_CHECK(ddp_k_memcpy_h2d(k, t->model.acts.inputs, t->emb_tokens,
                                   BT * sizeof(int32_t)));
        ddp_model_embed_backward(&t->model, t->model.acts.inputs, t->emb + g * slot_floats + BT,
                                 B, T);
    }
    return ddp_k_sync(k);
}
