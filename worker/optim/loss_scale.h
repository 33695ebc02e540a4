/* Mixed precision in the trainer: choosing train.precision's meaning on this backend, and fp16's
 * dynamic loss scaling.
 *
 * The kernels do the arithmetic (kernels.h set_precision: matmul inputs rounded, fp32
 * accumulation, fp32 master weights and AdamW); this module decides which precision a run gets
 * and keeps the loss scale:
 * - bf16 and fp32 runs have scale 1 and never skip a step for it.
 * - fp16: the loss gradient is multiplied by the scale (initially 2^16) so that small gradients
 *   survive fp16's range; the trainer divides it out in the gradient norm's pass and AdamW's
 *   grad_scale (no extra pass over the gradients). A non-finite gradient norm is an overflow:
 *   the update is skipped and the scale halves; after `interval` clean steps in a row it doubles.
 *   The norm is the same on every rank (it comes from the all-reduced gradients, or the
 *   all-reduced sums under ZeRO-1), so every rank skips and rescales alike, and the scale stays
 *   identical everywhere without a message of its own.
 * Test hook DDP_HOOK_LOSS_SCALE (common/test_hook.h, DDP_TEST_OVERFLOW="S:R"): rank R's loss
 * gradient is infinite at step S (1-based), as an fp16 overflow on one rank would make it.
 */
#ifndef DDP_WORKER_OPTIM_LOSS_SCALE_H
#define DDP_WORKER_OPTIM_LOSS_SCALE_H

#include "kernels/kernels.h"
#include "proto/spec.h"
#include "worker/sync/position.h"

#define DDP_LOSS_SCALE_INIT 65536.0f /* 2^16, PyTorch GradScaler's default */

/* The scaler's settings and counts; the scale itself and its clean steps are part of the run's
 * position (sync/position.h: pos->loss_scale, pos->loss_scale_clean), which checkpoints and the
 * state transfer carry. */
typedef struct ddp_loss_scale {
    ddp_kprec_t prec; /* train.precision as resolved on this backend (ddp_prec_select) */
    int enabled;      /* fp16 */
    long interval;    /* clean steps before the scale doubles */
    long overflows;   /* steps skipped for an overflow on this rank's watch */
} ddp_loss_scale_t;

/* Resolves `asked` (AUTO: bf16 where backend k multiplies it natively, else fp32) into *out,
 * sets it on k (set_precision), and when `log` says so prints the choice and why. Returns 0. */
int ddp_prec_select(ddp_kernels_t *k, ddp_precision_t asked, int log, ddp_kprec_t *out);

/* The name of a precision ("fp32", "bf16", "fp16"). */
const char *ddp_prec_name(ddp_kprec_t prec);

/* Starts the scaler for precision prec (enabled for fp16) with growth after `interval` clean
 * steps, once pos is known (after a resume): fp16 keeps a resumed scale (finite, positive and
 * not 1: a checkpoint of another precision has 1) and else starts at DDP_LOSS_SCALE_INIT; any
 * other precision has scale 1. */
void ddp_loss_scale_init(ddp_loss_scale_t *ls, ddp_kprec_t prec, long interval,
                         ddp_position_t *pos);

/* The factor on the loss gradient of the step after pos on `rank`: the scale, or Inf where the
 * test hook DDP_HOOK_LOSS_SCALE says so. */
float ddp_loss_scale_factor(const ddp_position_t *pos, int rank);

/* After the gradient norm of the step after pos: `finite` = whether it is. Returns 1 when the
 * update must be skipped for an overflow (the scale has halved), else 0 (the scale may have
 * doubled). A disabled scaler returns 0 and changes nothing. `log` prints what changed. */
int ddp_loss_scale_update(ddp_loss_scale_t *ls, ddp_position_t *pos, int finite, int log);

#endif
