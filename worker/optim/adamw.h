/* AdamW over the parameter arena, the learning-rate schedule, and global-norm clipping.
 *
 * The two moment arenas (m, v) have the parameter arena's layout. Weight decay applies to the
 * tensors whose descriptor says so (2-D tensors), decoupled as in torch.optim.AdamW. The
 * gradient arena holds a SUM (over micro-steps and ranks); `grad_scale` = 1/N turns it into
 * the average, and clipping multiplies it further, all fused into the update.
 */
#ifndef DDP_WORKER_OPTIM_ADAMW_H
#define DDP_WORKER_OPTIM_ADAMW_H

#include "proto/spec.h"
#include "worker/model/arena.h"
#include "worker/model/model.h"

/* The CRC32C (common/crc32c.h) of what one update wrote into one tensor: crc[0] of its
 * parameters, crc[1] exp_avg, crc[2] exp_avg_sq, each over the whole tensor with the elements
 * this update did not write taken as zero bytes, and `owned` the elements it wrote. They are the
 * tensor's real CRCs when owned == numel. A split update (a ZeRO-1 step) writes only this
 * rank's parts: ddp_adamw_crc_merge joins the ranks' values. A tensor whose pieces did not come
 * in arena order gets owned = DDP_ADAMW_CRC_BROKEN (never whole). */
typedef struct ddp_adamw_crc {
    uint32_t crc[3];
    size_t owned;
    size_t next; /* while the update runs: elements [0, next) of the tensor are folded in */
} ddp_adamw_crc_t;
#define DDP_ADAMW_CRC_BROKEN SIZE_MAX

/* Joins the values of two updates of disjoint parts of one tensor of numel elements into *into:
 * the CRC of a message that is the XOR of two (each zero where the other wrote) is the XOR of
 * their CRCs and of the CRC of numel x 4 zero bytes (the init/final inversions make the CRC affine,
 * not linear). Pure; any thread. */
void ddp_adamw_crc_merge(ddp_adamw_crc_t *into, const ddp_adamw_crc_t *other, size_t numel);

typedef struct ddp_adamw {
    float *m, *v; /* moment arenas (device), n_params floats each */
    int borrowed; /* m and v were the caller's (init's arguments) */
    size_t n;
    long t; /* updates taken; the next update uses t + 1 */
} ddp_adamw_t;

/* Sets up zeroed moments for model on its backend: m and v when given (zeroed, n_params floats
 * each, owned by the caller), else allocated here. */
int ddp_adamw_init(ddp_adamw_t *opt, const ddp_model_t *model, float *m, float *v);
/* Frees the moments this module allocated. NULL-safe. */
void ddp_adamw_close(ddp_adamw_t *opt, const ddp_model_t *model);

/* Learning rate at optimizer step `step` (0-based): linear warmup over spec->warmup steps to
 * spec->lr, then the schedule: constant, cosine decay to spec->min_lr at spec->steps, or wsd
 * (optim/schedule.h). */
double ddp_lr_at(const ddp_spec_t *spec, long step);

/* Whether tensor i of model has elements in part; if so they are [*lo, *hi) of the arena. */
int ddp_part_of_tensor(const ddp_model_t *model, const ddp_arena_part_t *part, int i, size_t *lo,
                       size_t *hi);

/* Sums of squares of the gradient over the parts: sums[p.block + j] for the j-th block of each
 * part (the other entries are left alone). */
int ddp_grad_sumsq(const ddp_model_t *model, const ddp_arena_part_t *parts, int n_parts,
                   float *sums);
/* The global L2 norm of the averaged gradient from every block's sum of squares:
 * sqrt(sum of sums[0..n) in order, in double) * grad_scale. */
double ddp_grad_norm(const float *sums, size_t n, float grad_scale);

/* What one update does. */
typedef struct ddp_adamw_args {
    double lr;
    float grad_scale; /* the gradient arena's sum -> the average (1/N; fp16: / loss scale) */
    double norm;      /* the averaged gradient's global norm (clipping) */
    const ddp_arena_part_t *parts; /* the arena's parts this rank updates */
    int n_parts;
    /* called with the index of each part once that part's parameters are final; NULL: none */
    int (*done)(void *arg, int part);
    void *done_arg;
    /* out, when not NULL (n_tensors entries; the CPU backend only): the CRC32C of what the
     * update wrote, computed by the kernel while the bytes are in cache */
    ddp_adamw_crc_t *crc;
} ddp_adamw_args_t;

/* One AdamW update of a->parts of the arena with learning rate a->lr; the gradient used is
 * grad * grad_scale * clip_coef, clip_coef = min(1, clip / norm) when spec->clip > 0. Returns 0,
 * DDP_ENOMEM, or the backend's or done's error. */
int ddp_adamw_step(ddp_adamw_t *opt, ddp_model_t *model, const ddp_spec_t *spec,
                   const ddp_adamw_args_t *a);

#endif
