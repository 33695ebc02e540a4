/* AdamW, schedule and clipping (see adamw.h). */
#include "worker/optim/adamw.h"
#include "worker/optim/schedule.h"

#include <math.h>
#include <stdlib.h>

#include "common/alloc.h"
#include "common/crc32c.h"
#include "common/trace.h"

int ddp_adamw_init(ddp_adamw_t *opt, const ddp_model_t *model, float *m, float *v)
{
    ddp_kernels_t *k = model->k;
    size_t bytes = model->n_params * sizeof(float);
    *opt = (ddp_adamw_t){.m = m, .v = v, .borrowed = m != NULL, .n = model->n_params};
    if (opt->borrowed) return 0;
    int rc = ddp_k_alloc(k, (void **)&opt->m, bytes);
    if (rc == 0) rc = ddp_k_alloc(k, (void **)&opt->v, bytes);
    if (rc) ddp_adamw_close(opt, model);
    return rc;
}

void ddp_adamw_close(ddp_adamw_t *opt, const ddp_model_t *model)
{
    if (!opt || !model || !model->k) return;
    if (!opt->borrowed) {
        ddp_k_free(model->k, opt->m);
        ddp_k_free(model->k, opt->v);
    }
    opt->m = opt->v = NULL;
}

double ddp_lr_at(const ddp_spec_t *spec, long step)
{
    if (spec->warmup > 0 && step < spec->warmup)
        return spec->lr * (double)(step + 1) / (double)spec->warmup;
    return ddp_schedule_lr(spec, step); /* optim/schedule.h */
}

int ddp_part_of_tensor(const ddp_model_t *model, const ddp_arena_part_t *part, int i, size_t *lo,
                       size_t *hi)
{
    const ddp_param_desc_t *p = &model->params[i];
    *lo = p->offset > part->lo ? p->offset : part->lo;
    *hi = p->offset + p->numel < part->hi ? p->offset + p->numel : part->hi;
    return *lo < *hi;
}

int ddp_grad_sumsq(const ddp_model_t *model, const ddp_arena_part_t *parts, int n_parts,
                   float *sums)
{
    ddp_kernels_t *k = model->k;
    ddp_krange_t *ranges = ddp_malloc((size_t)(n_parts > 0 ? n_parts : 1) * sizeof *ranges);
    if (!ranges) return DDP_ENOMEM;
    for (int i = 0; i < n_parts; i++) { /* an empty part: no blocks */
        size_t hi = parts[i].hi > parts[i].lo ? parts[i].hi : parts[i].lo;
        ranges[i] = (ddp_krange_t){parts[i].lo, hi, parts[i].block};
    }
    ddp_k_sumsq_blocks(k, sums, model->g, ranges, n_parts, DDP_NORM_BLOCK); /* one launch */
    free(ranges);
    return ddp_k_sync(k);
}

double ddp_grad_norm(const float *sums, size_t n, float grad_scale)
{
    double total = 0;
    for (size_t j = 0; j < n; j++) total += (double)sums[j];
    return sqrt(total) * (double)grad_scale;
}

/* CRC32C of n zero bytes: the shift of an all-ones register, inverted (see ddp_crc32c_combine). */
static uint32_t crc_of_zeros(uint64_t n) { return ddp_crc32c_combine(~0u, ~0u, n); }

/* Extends c's CRCs with zeros up to element `to` of the tensor. */
static void fold_zeros(ddp_adamw_crc_t *c, size_t to)
{
    if (to <= c->next) return;
    uint64_t bytes = (uint64_t)(to - c->next) * sizeof(float);
    uint32_t z = crc_of_zeros(bytes);
    for (int a = 0; a < 3; a++) c->crc[a] = ddp_crc32c_combine(c->crc[a], z, bytes);
    c->next = to;
}

/* Extends tensor i's CRCs by the piece [lo, hi) of the arena from the kernel's per-chunk CRCs
 * (zeros before it, where another rank's part lies). */
static void fold_piece_crc(const ddp_model_t *model, int i, size_t lo, size_t hi,
                           const uint32_t *chunk, ddp_adamw_crc_t *out)
{
    ddp_adamw_crc_t *c = &out[i];
    size_t at = lo - model->params[i].offset;
    if (c->owned == DDP_ADAMW_CRC_BROKEN || at < c->next) {
        c->owned = DDP_ADAMW_CRC_BROKEN;
        return;
    }
    fold_zeros(c, at);
    for (size_t x = lo, j = 0; x < hi; x += DDP_ADAMW_CRC_CHUNK, j++) {
        size_t len = hi - x < DDP_ADAMW_CRC_CHUNK ? hi - x : DDP_ADAMW_CRC_CHUNK;
        for (int a = 0; a < 3; a++)
            c->crc[a] = ddp_crc32c_combine(c->crc[a], chunk[3 * j + a], len * sizeof(float));
    }
    c->next = hi - model->params[i].offset;
    c->owned += hi - lo;
}

void ddp_adamw_crc_merge(ddp_adamw_crc_t *into, const ddp_adamw_crc_t *other, size_t numel)
{
    if (into->owned == DDP_ADAMW_CRC_BROKEN || other->owned == DDP_ADAMW_CRC_BROKEN) {
        into->owned = DDP_ADAMW_CRC_BROKEN;
        return;
    }
    uint32_t z = crc_of_zeros((uint64_t)numel * sizeof(float));
    for (int a = 0; a < 3; a++) into->crc[a] ^= other->crc[a] ^ z;
    into->owned += other->owned;
}

/* Each tensor's piece inside each part, with that tensor's weight decay, in part order. */
typedef struct pieces {
    ddp_kadamw_range_t *range; /* [n] */
    int *tensor;               /* [n]: the tensor of each piece */
    int *part_end;             /* [n_parts]: the pieces up to each part's last */
    int n;
    size_t chunks; /* the CRC chunks of them all */
} pieces_t;

static void free_pieces(pieces_t *pc)
{
    free(pc->range);
    free(pc->tensor);
    free(pc->part_end);
}

/* Returns 0 or DDP_ENOMEM (free_pieces either way). */
static int cut_pieces(const ddp_model_t *model, const ddp_spec_t *spec, const ddp_adamw_args_t *a,
                      pieces_t *pc)
{
    size_t parts = (size_t)(a->n_parts > 0 ? a->n_parts : 1);
    size_t most = parts * (size_t)model->n_tensors;
    *pc = (pieces_t){.range = ddp_malloc(most * sizeof *pc->range),
                     .tensor = ddp_malloc(most * sizeof *pc->tensor),
                     .part_end = ddp_malloc(parts * sizeof *pc->part_end)};
    if (!pc->range || !pc->tensor || !pc->part_end) return DDP_ENOMEM;
    for (int j = 0; j < a->n_parts; j++) {
        for (int i = 0; i < model->n_tensors; i++) {
            size_t lo, hi;
            if (!ddp_part_of_tensor(model, &a->parts[j], i, &lo, &hi)) continue;
            float wd = model->params[i].decay ? (float)spec->weight_decay : 0.0f;
            pc->range[pc->n] = (ddp_kadamw_range_t){lo, hi, wd};
            pc->tensor[pc->n++] = i;
            pc->chunks += (hi - lo + DDP_ADAMW_CRC_CHUNK - 1) / DDP_ADAMW_CRC_CHUNK;
        }
        pc->part_end[j] = pc->n;
    }
    return 0;
}

int ddp_adamw_step(ddp_adamw_t *opt, ddp_model_t *model, const ddp_spec_t *spec,
                   const ddp_adamw_args_t *a)
{
    ddp_kernels_t *k = model->k;
    ddp_adamw_crc_t *crc = a->crc;
    int64_t tr = ddp_trace_begin();
    double clip_coef = 1.0;
    if (spec->clip > 0 && a->norm > spec->clip) clip_coef = spec->clip / (a->norm + 1e-6);
    float scale = (float)((double)a->grad_scale * clip_coef);
    pieces_t pc;
    uint32_t *chunk = NULL; /* the kernel's CRCs: 3 per chunk of every piece, in piece order */
    int rc = cut_pieces(model, spec, a, &pc);
    if (rc == 0 && crc) {
        for (int i = 0; i < model->n_tensors; i++) crc[i] = (ddp_adamw_crc_t){{0, 0, 0}, 0, 0};
        if (!(chunk = ddp_malloc((3 * pc.chunks + 1) * sizeof *chunk))) rc = DDP_ENOMEM;
    }
    if (rc == 0) opt->t++;
    /* one call (one launch on a GPU) for every piece; with `done`, one per part, each part
     * handed on as soon as it is final */
    uint32_t *at = chunk; /* this call's CRCs (NULL: none wanted) */
    for (int j = 0, q = 0; rc == 0 && j < (a->done ? a->n_parts : 1); j++) {
        int end = a->done ? pc.part_end[j] : pc.n;
        ddp_k_adamw(k, model->w, model->g, opt->m, opt->v, pc.range + q, end - q, (float)a->lr,
                    (float)spec->beta1, (float)spec->beta2, (float)spec->eps, scale, (int)opt->t,
                    (uint32_t *)at);
        for (; q < end; q++) {
            if (!chunk) continue;
            fold_piece_crc(model, pc.tensor[q], pc.range[q].lo, pc.range[q].hi, at, crc);
            at += 3 * ((pc.range[q].hi - pc.range[q].lo + DDP_ADAMW_CRC_CHUNK - 1) /
                       DDP_ADAMW_CRC_CHUNK);
        }
        if (a->done) {
            rc = ddp_k_sync(k);
            if (rc == 0) rc = a->done(a->done_arg, j);
        }
    }
    for (int i = 0; rc == 0 && crc && i < model->n_tensors; i++) /* zeros after our last piece */
        if (crc[i].owned != DDP_ADAMW_CRC_BROKEN) fold_zeros(&crc[i], model->params[i].numel);
    free(chunk);
    free_pieces(&pc);
    if (!rc) rc = ddp_k_sync(k);
    ddp_trace_end(DDP_TRACE_COMPUTE, tr, "optimizer (AdamW%s)",
                  a->n_parts && a->done ? ", sharded" : "");
    return rc;
}
