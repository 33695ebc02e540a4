/* The job spec after its fields are read: the defaults that depend on other fields, and the
 * rules that tie fields together (proto/spec_int.h).
 *
 * Defaults: seq_len = model.block_size, min_lr = lr / 10 (wsd: 0), min_workers and max_workers =
 * workers, applied only to fields the document left out. Rules: the name, the model from one
 * source (a preset, all five dimensions, or model.config; model.init_from alone leaves it to its
 * config.json), data.train given, the batch, the betas, the learning rate, the trace, the warmup
 * and the wsd decay, spike skipping's z-scores against its window, the elastic bounds and the
 * checkpoint's. An error names the field that breaks the rule, at its value's line and column
 * (a field left out: 0:0, or for a required one, its section's key).
 *
 * The reference lists these rules in words (spec_out.c, RULES): change both together.
 */
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "common/err.h"
#include "common/trace.h"
#include "proto/spec.h"
#include "proto/spec_int.h"
#include "proto/spec_tree.h"

typedef ddp__spec_pstate_t pstate_t;

/* Error about a field identified by its table index, at its value's mark (0 if defaulted). */
static int idx_error(pstate_t *ps, int i, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int idx_error(pstate_t *ps, int i, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return ddp__spec_field_error(ps, ddp__spec_fields[i].path, ps->set[i] ? ps->line[i] : 0,
                                 ps->set[i] ? ps->column[i] : 0, "%s", msg);
}

#define SET(path) ps->set[ddp__spec_field_index(path)]

/* The decay of a wsd schedule: its length given once, only for wsd, and between the warmup and
 * the end (decay_steps 0: decay_frac of train.steps, computed where it is used, so that a resume
 * with another train.steps keeps the fraction). */
static int finish_schedule(pstate_t *ps)
{
    ddp_spec_t *s = ps->spec;
    static const char *const WSD_ONLY[] = {"train.decay_steps", "train.decay_frac",
                                           "train.decay_shape"};
    if (s->schedule != DDP_SCHED_WSD) {
        for (int k = 0; k < 3; k++)
            if (SET(WSD_ONLY[k]))
                return idx_error(ps, ddp__spec_field_index(WSD_ONLY[k]),
                                 "applies only to train.schedule: wsd (the schedule is %s)",
                                 s->schedule == DDP_SCHED_COSINE ? "cosine" : "constant");
        return 0;
    }
    if (SET("train.decay_steps") && SET("train.decay_frac"))
        return idx_error(ps, ddp__spec_field_index("train.decay_frac"),
                         "give train.decay_steps or train.decay_frac, not both");
    long decay = s->decay_steps ? s->decay_steps : lround(s->decay_frac * (double)s->steps);
    int i = ddp__spec_field_index(s->decay_steps ? "train.decay_steps" : "train.decay_frac");
    if (decay < 1)
        return idx_error(ps, i, "gives a decay of %ld steps: it must be at least 1", decay);
    if (decay > s->steps - s->warmup)
        return idx_error(ps, i,
                         "gives a decay of %ld steps, more than the %ld after the warmup "
                         "(train.steps %ld - train.warmup %ld)",
                         decay, s->steps - s->warmup, s->steps, s->warmup);
    return 0;
}

int ddp__spec_finish(pstate_t *ps, const ddp__snode_t *root)
{
    ddp_spec_t *s = ps->spec;
    static const char *const DIMS[] = {"model.n_layer", "model.n_head", "model.n_embd",
                                       "model.vocab_size", "model.block_size"};
    int ndims = 0, first_dim = -1;
    for (int d = 0; d < 5; d++)
        if (SET(DIMS[d])) ndims++, first_dim = first_dim < 0 ? d : first_dim;

    /* name */
    if (!s->name[0]) return idx_error(ps, ddp__spec_field_index("name"), "must not be empty");
    if (!ddp_spec_name_ok(s->name))
        return idx_error(ps, ddp__spec_field_index("name"),
                         "must use only letters, digits, '-', '_' and '.', and not start with "
                         "'-' or '.', got \"%s\"", s->name);

    /* model: a preset, all five dimensions or model.config; init_from needs one of them or a
     * config.json of its own */
    int by_config = SET("model.config") && s->config[0];
    if (by_config && (SET("model.preset") || ndims))
        return idx_error(ps, ddp__spec_field_index("model.config"),
                         "cannot be combined with model.preset or the dimensions: the model is "
                         "the config's");
    if (SET("model.preset") && ndims)
        return idx_error(ps, ddp__spec_field_index(DIMS[first_dim]),
                         "cannot be combined with model.preset: give a preset or all of "
                         "n_layer, n_head, n_embd, vocab_size, block_size");
    if (!SET("model.preset") && ndims) {
        s->preset[0] = '\0';
        for (int d = 0; d < 5; d++) {
            if (SET(DIMS[d])) continue;
            const ddp__sentry_t *me = ddp__stree_find(root, "model");
            return ddp__spec_field_error(
                ps, DIMS[d], me ? me->key_line : 0, me ? me->key_column : 0,
                "is required when the model is given by dimensions (n_layer, "
                "n_head, n_embd, vocab_size, block_size)");
        }
        if (s->model.n_embd % s->model.n_head)
            return idx_error(ps, ddp__spec_field_index("model.n_embd"),
                             "must be divisible by model.n_head (%d), got %d", s->model.n_head,
                             s->model.n_embd);
    }
    /* init_from alone: the architecture is its config.json's, read where the files are (the
     * worker: ddp_spec_resolve_model, proto/hf_config.h); until then the model is all zeros
     * and seq_len 0 means "block_size" */
    int arch_later = by_config ||
                     (SET("model.init_from") && s->init_from[0] && !SET("model.preset") && !ndims);
    if (arch_later) {
        s->preset[0] = '\0';
        memset(&s->model, 0, sizeof s->model);
    }

    /* data */
    if (s->n_train == 0) {
        const ddp__sentry_t *de = ddp__stree_find(root, "data");
        int i = ddp__spec_field_index("data.train");
        if (ps->set[i]) return idx_error(ps, i, "must not be empty");
        return ddp__spec_field_error(
            ps, "data.train", de ? de->key_line : 0, de ? de->key_column : 0,
            "is required: a glob of token shards such as data/train_*.bin");
    }

    /* train */
    if (!SET("train.seq_len")) s->seq_len = s->model.block_size;
    if (!arch_later && s->seq_len > s->model.block_size)
        return idx_error(ps, ddp__spec_field_index("train.seq_len"),
                         "must be <= model.block_size (%d), got %d", s->model.block_size,
                         s->seq_len);
    long per = (long)s->micro_batch * s->seq_len;
    if (per && s->global_batch_tokens % per)
        return idx_error(ps, ddp__spec_field_index("train.global_batch_tokens"),
                         "must be 0 (one micro-batch per rank) or a multiple of "
                         "train.micro_batch * train.seq_len = %ld, got %ld",
                         per, s->global_batch_tokens);
    if (SET("train.betas") && (SET("train.beta1") || SET("train.beta2")))
        return idx_error(ps, ddp__spec_field_index("train.betas"),
                         "give betas or beta1/beta2, not both");
    if (!SET("train.min_lr")) s->min_lr = s->schedule == DDP_SCHED_WSD ? 0 : s->lr / 10;
    if (s->min_lr > s->lr)
        return idx_error(ps, ddp__spec_field_index("train.min_lr"),
                         "must be <= train.lr (%g), got %g", s->lr, s->min_lr);
    if (!ddp_trace_steps_valid(s->trace))
        return idx_error(ps, ddp__spec_field_index("train.trace"),
                         "must be \"N\" or \"N-M\" (steps to trace, 1 <= N <= M), got \"%s\"",
                         s->trace);
    if (s->warmup > 0 && s->warmup >= s->steps)
        return idx_error(ps, ddp__spec_field_index("train.warmup"),
                         "must be < train.steps (%ld), got %ld", s->steps, s->warmup);
    DDP_CHECK(finish_schedule(ps));
    static const char *const Z[] = {"train.skip_loss_z", "train.skip_norm_z"};
    double z_max = sqrt((double)s->skip_window - 1);
    for (int k = 0; k < 2; k++) {
        double z = k ? s->skip_norm_z : s->skip_loss_z;
        if (z > 0 && z >= z_max)
            return idx_error(ps, ddp__spec_field_index(Z[k]),
                             "must be below sqrt(train.skip_window - 1) = %.4g, the largest "
                             "z-score a window of %d can give (it could never skip), got %g",
                             z_max, s->skip_window, z);
    }

    /* ddp */
    if (!SET("ddp.min_workers")) s->min_workers = s->workers;
    if (!SET("ddp.max_workers")) s->max_workers = s->workers;
    if (s->min_workers > s->workers)
        return idx_error(ps, ddp__spec_field_index("ddp.min_workers"),
                         "must be <= ddp.workers (%d), got %d", s->workers, s->min_workers);
    if (s->max_workers < s->workers)
        return idx_error(ps, ddp__spec_field_index("ddp.max_workers"),
                         "must be >= ddp.workers (%d), got %d", s->workers, s->max_workers);
    if (s->first_bucket_mb > s->bucket_mb && SET("ddp.first_bucket_mb"))
        return idx_error(ps, ddp__spec_field_index("ddp.first_bucket_mb"),
                         "must be <= ddp.bucket_mb (%g), got %g", s->bucket_mb,
                         s->first_bucket_mb);

    /* checkpoint */
    if (SET("checkpoint.every") && s->ckpt_every > 0 && !s->ckpt_dir[0])
        return idx_error(ps, ddp__spec_field_index("checkpoint.every"),
                         "needs checkpoint.dir (where to write the checkpoints)");
    if (s->writers > s->max_workers)
        return idx_error(ps, ddp__spec_field_index("checkpoint.writers"),
                         "must be <= ddp.max_workers (%d), got %d", s->max_workers, s->writers);
    return 0;
}
