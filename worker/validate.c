/* Validation (see trainer.h): the mean loss over spec.val_batches held-out micro-batches, split
 * over the ranks, of each of data.val's sets (a plain string: one). Collective. */
#include "worker/trainer_int.h"

#include <stdlib.h>

#include "common/alloc.h"

/* The mean loss of one set over spec.val_batches micro-batches. Collective. */
static int validate_set(ddp_trainer_t *t, const ddp_dataset_t *set, float *loss, ddp_errinfo_t *ei)
{
    int B = t->spec.micro_batch, T = t->spec.seq_len;
    size_t n = (size_t)B * T;
    int32_t *in = ddp_malloc(n * sizeof *in), *tg = ddp_malloc(n * sizeof *tg);
    int rc = (in && tg) ? 0 : DDP_ENOMEM;
    /* rank r evaluates batches r, r + W, ...; the sums and counts are then added up */
    float sums[2] = {0, 0};
    for (int b = t->world.rank; rc == 0 && b < t->spec.val_batches; b += t->world.size) {
        float l = 0;
        rc = ddp_dataset_fill(set, (uint64_t)b * B, B, 0, in, tg, ei);
        if (rc == 0) rc = ddp_model_evaluate(&t->model, in, tg, B, T, &l);
        sums[0] += l;
        sums[1] += 1;
    }
    free(in);
    free(tg);
    if (rc == 0) rc = ddp_world_allreduce(&t->world, sums, 2, DDP_OP_SUM, ei);
    if (rc == 0) *loss = sums[0] / (sums[1] > 0 ? sums[1] : 1);
    return rc;
}

int ddp_trainer_validate(ddp_trainer_t *t, float *loss, ddp_errinfo_t *ei)
{
    for (int i = 0; i < t->data.have_val; i++)
        DDP_CHECK(validate_set(t, &t->data.val_sets[i], &t->data.val_losses[i], ei));
    *loss = t->pos.last_val_loss = t->data.val_losses[0];
    return 0;
}
