/* Checkpoints of a training run: what a ddpd checkpoint of a GPT-2 run holds, when it is saved,
 * how a run resumes from one, and the emergency save of a failed run (the files themselves:
 * worker/checkpoint/).
 *
 * It knows the trainer only through a narrow view, ddp_saving_run_t (the spec, the kernels,
 * the model's and the optimizer's arenas, the world), and the trainer's position passed to each
 * call (ddp_position_t): it never includes worker/trainer.h. Resuming returns a result,
 * ddp_saving_resume_t, that the trainer applies to itself.
 *
 * Contents: the parameter arena under Hugging Face GPT-2 names and shapes, AdamW's moments as
 * "exp_avg.<name>" / "exp_avg_sq.<name>", a Hugging Face config.json and generation_config.json
 * (so `transformers` loads the directory as it is; with data.tokenizer also its tokenizer.json and
 * tokenizer_config.json, so AutoTokenizer does too) and trainer.json: step, tokens seen, schedule
 * position, AdamW's update count, the RNG's four words (hex strings: no precision lost), the data
 * cursor (next global sample index = step x sequences per global batch), world size, accumulation,
 * and the spec.
 *
 * Saving without stalling: parameters and moments change only inside ddp_adamw_step (every path
 * that writes them -- the update with its clipping, the skipped NaN update, resume, the initial
 * broadcast -- runs before a save starts or after ddp_saving_before_update). On the CPU backend the
 * arenas themselves are the snapshot until the next update: a save starts the writer at the step
 * boundary with nothing copied (ddp_ckpt_save_live), the writer writes the checkpoint shards
 * straight from the arenas (O_DIRECT) while the NEXT step runs forward and backward, and that
 * step's ddp_saving_before_update freezes it: whatever the writer has not read yet is copied into
 * the host snapshot (usually nothing) and the writer goes on from there. On a GPU the snapshot is a
 * device-to-host copy, taken by a helper thread beside the next step when a core is idle (else at
 * the boundary) and joined in ddp_saving_before_update. Either way that is the only place training
 * waits for a save within a step (logged).
 * With checkpoint.writers W > 1 (ranks < min(W, world) write stripes), completion is agreed on
 * by piggybacking two numbers on the per-step all-reduce the trainer does anyway
 * (ddp_saving_vote / ddp_saving_tally): once every writer reports its checkpoint shards durable,
 * rank 0 commits; a save that is still pending when the next is due (or at the end) is settled
 * blocking, and the log says so.
 *
 * Resume: every rank finds the newest verified checkpoint (or the one named), loads it tensor by
 * tensor from mapped files into its arenas and returns step, tokens, AdamW's t and the RNG for
 * the trainer to restore, so the continuation is bitwise identical to an uninterrupted run of
 * the same world size. A
 * different world size keeps the global batch (the accumulation changes) and the data order.
 *
 * Threads: every function is called on the training thread.
 */
#ifndef DDP_WORKER_SAVING_SAVING_H
#define DDP_WORKER_SAVING_SAVING_H

#include <stdint.h>

#include "collectives/coll.h"
#include "common/err.h"
#include "kernels/kernels.h"
#include "proto/hf_config.h" /* ddp_hf_ids_t */
#include "proto/spec.h"
#include "worker/model/model.h"
#include "worker/optim/adamw.h"
#include "worker/sync/position.h"
#include "worker/sync/world.h"

typedef struct ddp_saving ddp_saving_t; /* a run's checkpoints; NULL without checkpoint.dir */

/* What the checkpoints of a run see of the trainer. The pointers are the trainer's and outlive
 * the ddp_saving_t; the world's fields change with each generation (ddp_saving_regroup). */
typedef struct ddp_saving_run {
    const ddp_spec_t *spec; /* the run's spec (with the adopted global batch) */
    ddp_kernels_t *k;       /* the arenas' backend: copies, and host_memory */
    int device;             /* k's device: the checkpoint helper opens a context of its own there */
    ddp_model_t *model;     /* the parameter arena and its tensor table */
    ddp_adamw_t *opt;       /* the moments and AdamW's update count */
    long stop_at_step;      /* --stop-at-step (0: none): a save is planned there */
    int local_world;        /* ranks on this host (whether a core is spare for a snapshot) */
    int n_micro;            /* micro-batches per step over all ranks (the global batch) */
    const ddp_world_t *world; /* the trainer's: it changes with each generation */
    int accum;                /* this rank's micro-steps per step */
    int zero1; /* ZeRO-1: the optimizer step is split over the ranks (moments in slices) */
    /* Makes every rank's moments whole before a save reads them (collective; a ZeRO-1 step
     * leaves each rank with its own slices current). NULL when never needed. */
    int (*gather_moments)(void *arg, ddp_errinfo_t *ei);
    void *gather_arg;
    /* data.tokenizer: every checkpoint carries these texts beside config.json (NULL: none), and
     * its config.json and generation_config.json name ids's BOS and EOS (NULL: the model's) */
    const char *tokenizer_json, *tokenizer_config_json;
    const ddp_hf_ids_t *ids;
} ddp_saving_run_t;

/* Statistics of the checkpoints of this run (for logs and the benchmark). */
typedef struct ddp_saving_stats {
    long saves;              /* saves started */
    double boundary_ms;      /* training-thread time at the step boundaries that started a save */
    double wait_ms;          /* time updates waited for a snapshot to finish (the overlap's miss) */
    double last_wait_ms;     /* of the last save */
    double settle_ms;        /* time spent settling striped saves (all-reduce + commit) */
    double last_snapshot_ms; /* helper thread's copy time of the last save */
} ddp_saving_stats_t;

/* Early in ddp_trainer_init (after joining the world, before the batch split): with
 * spec->ckpt_dir, makes *out and, unless no_resume, finds the checkpoint to resume from
 * (resume_step > 0: exactly that step; else the newest that verifies, logging any newer one
 * skipped with its reason); *out is NULL without checkpoint.dir. *global_batch_tokens gets the
 * checkpoint's global batch when the spec leaves it at 0 (the trainer adopts it, so the global
 * batch stays the same on a different world size), else 0. The world is for the logs.
 * Returns 0 (also when there is nothing to resume), DDP_ENOTFOUND for a named step that is
 * missing or broken, or a read error. */
int ddp_saving_prepare(const ddp_spec_t *spec, const ddp_world_t *world, int no_resume,
                       long resume_step, ddp_saving_t **out, long *global_batch_tokens,
                       ddp_errinfo_t *ei);

/* After the model and the optimizer exist (c may be NULL): loads the checkpoint found by
 * ddp_saving_prepare into the parameters and moments of run, AdamW's update count into run->opt
 * and the position it saved into *pos (step, tokens, RNG, loss scale, last loss: NaN when it
 * has none), and sets *resumed; else, with model.init_from, loads those weights only (*resumed
 * 0, the caller still broadcasts, *pos untouched). Then, with checkpoints, keeps a copy of run,
 * creates the saver on the writing ranks and reserves its snapshot. Returns 0, DDP_ESPEC
 * (checkpoint of another model), DDP_EFORMAT, -errno. */
int ddp_saving_start(ddp_saving_t *c, const ddp_saving_run_t *run, ddp_position_t *pos,
                     int *resumed, ddp_errinfo_t *ei);

/* Elastic, when the world changed (run: the new one): completes a save this rank is writing
 * (before a state broadcast may change the arenas), abandons a striped save of the old
 * generation, and makes the savers of the ranks that write in the new one. Returns 0 or the new
 * saver's error. NULL-safe. */
int ddp_saving_regroup(ddp_saving_t *c, const ddp_saving_run_t *run, ddp_errinfo_t *ei);

/* What a step's optimizer update does for the checkpoints (ddp_saving_before_update fills it). */
typedef struct ddp_saving_update {
    int save_follows;     /* a save of this step is planned (ddp_saving_planned) */
    ddp_adamw_crc_t *crc; /* where ddp_adamw_step puts the CRC32C of what it writes, or NULL */
} ddp_saving_update_t;

/* Inside the step that completes step `next`, just before the optimizer update: joins a running
 * snapshot helper (the parameters must not change under it), timing and logging any wait, and fills
 * *u: whether a save of `next` is planned, and the CRC array when that save is planned, the arenas
 * are host memory and this rank writes checkpoint shards or takes part in a ZeRO-1 update (the save
 * then need not read the arenas for its checksums); NULL otherwise (every rank of a ZeRO-1 update
 * gets the same answer). Returns the helper's error (the snapshot failed: the save is dropped and
 * logged, training goes on: returns 0). NULL-safe (*u zeroed). */
int ddp_saving_before_update(ddp_saving_t *c, long next, ddp_saving_update_t *u, ddp_errinfo_t *ei);
/* After that update completed (all ranks), when it was not skipped: with u->crc, a ZeRO-1
 * update's CRCs are merged over the ranks (one small all-reduce) and the save of step `next` may
 * use them. Returns 0, DDP_ENOMEM or the all-reduce's error; 0 without u->crc. */
int ddp_saving_after_update(ddp_saving_t *c, long next, const ddp_saving_update_t *u,
                            ddp_errinfo_t *ei);

/* Fills vals[0] (this rank's striped checkpoint shards are durable) and vals[1] (they failed)
 * for the per-step all-reduce; zeros when no striped save is pending. NULL-safe. */
void ddp_saving_vote(ddp_saving_t *c, float vals[2]);
/* With the all-reduced sums of the votes: when every writer reported, rank 0 commits (or, when
 * one failed, the save is abandoned with a warning). Returns 0 or the commit's error (logged;
 * training goes on, so 0 unless the error is fatal). NULL-safe. */
int ddp_saving_tally(ddp_saving_t *c, const float sums[2], ddp_errinfo_t *ei);

/* Whether a save of `step` is planned (every checkpoint.every steps, the last step, the step of
 * --stop-at-step). A save after a stop signal is not: it is known only once the step is done.
 * 0 for NULL. */
int ddp_saving_planned(const ddp_saving_t *c, long step);

/* After each completed step (all ranks; any_stop: every rank stops after it): starts a save of
 * pos when one is due (every checkpoint.every steps). Returns 0 or an error that stops training
 * (bad state, no memory). NULL-safe. */
int ddp_saving_after_step(ddp_saving_t *c, const ddp_position_t *pos, int any_stop,
                          ddp_errinfo_t *ei);

/* At the end of training (steps done, or stopped by a signal: all ranks together): saves pos
 * unless it was just saved, waits for it to be durable and committed. Returns 0 or the save's
 * error. NULL-safe. */
int ddp_saving_finish(ddp_saving_t *c, const ddp_position_t *pos, int any_stop, ddp_errinfo_t *ei);

/* After a failure that ends the run (a static world lost a rank, or an elastic job failed):
 * saves pos, the last completed step, from this rank's memory, so a relaunch loses no completed
 * step. The survivors take turns (an flock on checkpoint.dir/.emergency.lock), and each writes
 * only a step newer than every one saved there: replicas are equal at a step, but survivors may
 * differ by one step when the failure struck as the step committed on some ranks. Nothing is
 * written without checkpoints. Needs no communication. moments_whole: a ZeRO-1 run's moment
 * arenas are current everywhere. Returns 0 or the save's error (DDP_ENOTSUP for a split
 * optimizer state). */
int ddp_saving_emergency_save(ddp_saving_t *c, const ddp_position_t *pos, int moments_whole,
                              ddp_errinfo_t *ei);

/* Copies the statistics (zeros without checkpoints). */
void ddp_saving_get_stats(const ddp_saving_t *c, ddp_saving_stats_t *out);

/* Joins any helper, waits for the writer, frees. NULL-safe. */
void ddp_saving_free(ddp_saving_t *c);

#endif
