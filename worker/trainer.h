/* The training loop of one rank: data, forward/backward per micro-step, gradient
 * accumulation, clipping, AdamW, validation, logging, sampling.
 *
 * Gradient accumulation keeps the design's bitwise contract: each micro-step's backward
 * writes a fresh gradient arena; micro-steps 0..A-2 are summed into `acc` in order, and the last
 * micro-step's gradient is then added to it, so the arena holds g0 + g1 + ... in micro-step
 * order. The average is that sum times 1/(A W), applied inside the optimizer.
 *
 * Implemented by phase (trainer_int.h): setup.c (init, close), generation.c (joining and
 * leaving a world, planning a state transfer, the checkpoints' view), step.c (one step; the
 * deal, a transfer's start and finish, the replica check), validate.c, sample.c, step_log.c,
 * memory_check.c, run.c (the loop) and main.c (the program). Its parts live in folders: model/,
 * optim/, sync/, data/, observe/, budget/, saving/, checkpoint/ (a library of its own) and prep/
 * (ddp-prep).
 */
#ifndef DDP_WORKER_TRAINER_H
#define DDP_WORKER_TRAINER_H

#include <signal.h>
#include <stdio.h>

#include "collectives/coll.h"
#include "collectives/elastic.h"
#include "common/rng.h"
#include "kernels/kernels.h"
#include "proto/spec.h"
#include "worker/data/loader.h"
#include "worker/model/model.h"
#include "worker/optim/loss_scale.h"
#include "worker/observe/metrics_sink.h"
#include "worker/observe/mfu.h"
#include "worker/optim/adamw.h"
#include "worker/observe/profile.h"
#include "worker/sync/reducer.h"
#include "worker/data/run_tokenizer.h"
#include "worker/evaluate/score.h"
#include "worker/sync/transfer.h"
#include "worker/sync/world.h"
#include "worker/sync/position.h"
#include "worker/sync/vote.h"
#include "worker/sync/emb_slots.h"
#include "worker/sync/straggler.h"
#include "worker/saving/saving.h"
#include "worker/optim/zero1.h"

/* What the environment says about this rank, read once where the spec is loaded (worker/main.c's
 * read_env), never in the step. Zeros: one rank on this host, no elastic coordinator. (The test
 * hooks are read there too, into common/test_hook.h's table. The environment rendezvous,
 * DDP_RANK/DDP_WORLD_SIZE/DDP_RDZV, is read by its bootstrap, collectives/bootstrap_env.c.) */
typedef struct ddp_train_env {
    int local_rank;  /* DDP_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK or SLURM_LOCALID: the GPU */
    int local_world; /* DDP_LOCAL_WORLD_SIZE or OMPI_COMM_WORLD_LOCAL_SIZE; 0: unknown (1) */
    int elastic;     /* DDP_ELASTIC=1: the first generation comes from the coordinator at rdzv */
    /* The world a launcher gave (main.c's read_env says which variables): world_size 0 or 1 is
     * a world of one; else `rank` of world_size meet at rdzv, authenticated by job_token. */
    int world_size, rank;
    long generation;                    /* DDP_GENERATION: a relaunched world's number */
    const char *rdzv, *job_token;       /* host:port of rank 0's rendezvous; its token */
    const char *launcher;               /* "ddpd" or "torchrun" (the convention), for the log */
    int rank_hint;                      /* DDP_RANK (elastic: orders the first generation only) */
    double rdzv_timeout_s;              /* DDP_RDZV_TIMEOUT_S; 0: the default */
    char rdzv_buf[300], token_buf[320]; /* storage when rdzv and job_token are composed */
} ddp_train_env_t;

typedef struct ddp_train_opts {
    const char *run_dir;      /* metrics.jsonl goes here; NULL = none */
    const char *dump_weights; /* write the final parameter arena (raw fp32) here; NULL = no */
    const char *backend;      /* kernel backend name ("auto") */
    int quiet;                /* no step lines (tests) */
    int no_resume;            /* ignore checkpoints already in checkpoint.dir */
    long resume_step;         /* > 0: resume from exactly step-N; 0: the newest that verifies */
    long stop_at_step;        /* > 0: stop (and checkpoint) once this many steps are done */
    ddp_train_env_t env;      /* what the environment says (zeros: nothing) */
} ddp_train_opts_t;

/* Elastic membership (DDP_ELASTIC=1; zeros in a static world): the coordinator and the
 * generation this rank is in. */
typedef struct ddp_membership {
    ddp_elastic_t *elastic;  /* the coordinator's connection, else NULL */
    ddp_elastic_gen_t gen;   /* the generation this rank is in */
    ddp_coll_t *parent_comm; /* between generations: the last one's communicator, when the next
                              * can be formed by shrinking it (ddp_coll_shrinks), else NULL */
    uint64_t parent_gen;     /* its generation */
    int regroup;             /* some rank must leave the generation: all do after this step */
    int has_state;           /* the state here is the job's (not a joiner's fresh one) */
    int first_rank;          /* this process's rank in its first world (DDP_HOOK_MICRO_STEP) */
} ddp_membership_t;

/* The deal: which of a step's micro-batches this rank computes (step.c ddp__trainer_set_deal),
 * and where it sums their gradients. */
typedef struct ddp_deal {
    int n_micro;     /* micro-batches per optimizer step over all ranks (the global batch) */
    int rank, world; /* this rank's place among the ranks that compute the step (all of them,
                      * except in a step that carries a state transfer) */
    int accum;       /* micro-steps per optimizer step on this rank (its share of n_micro) */
    float *acc;      /* gradient sum of earlier micro-steps (device); NULL when accum == 1 */
} ddp_deal_t;

/* The run's data: the token shards, the loader's thread, data.tokenizer. */
typedef struct ddp_run_data {
    ddp_dataset_t train_set; /* data.train's one source (n_train 1) */
    /* data.val's sets (spec.val[i]); have_val: how many (0 without validation) */
    ddp_dataset_t val_sets[DDP_SPEC_MAX_SOURCES];
    int have_val;
    float val_losses[DDP_SPEC_MAX_SOURCES]; /* the last validation's, per set */
    /* data.train as a mixture of n_train > 1 sources (data/mixture.h): their sets and weights
     * (mix.at is set from pos.ext.mix whenever the loader starts) */
    ddp_dataset_t mix_sets[DDP_SPEC_MAX_SOURCES];
    ddp_loader_mix_t mix;
    ddp_loader_t loader;
    ddp_run_tokenizer_t *tokenizer; /* data.tokenizer, or NULL (data/run_tokenizer.h) */
} ddp_run_data_t;

/* The spec's `eval` tasks (evaluate.c): read and tokenized once at init (a bad row fails the
 * start), scored every `every` steps and after the last. */
typedef struct ddp_run_evals {
    int n;                                  /* spec.n_eval */
    ddp_mc_task_t task[DDP_SPEC_MAX_EVALS]; /* their rows, the first `limit` */
    ddp_mc_scorer_t scorer;                 /* on the trainer's model, seq_len tokens */
} ddp_run_evals_t;

/* What the trainer writes about its steps (rank 0; step_log.c). */
typedef struct ddp_step_log {
    ddp_metrics_sink_t *metrics; /* metrics.jsonl (+ TensorBoard), or NULL */
    long logged_step;            /* highest step written to metrics.jsonl */
    int64_t run_t0;              /* ddp_now_ns() when ddp_trainer_run started (wall_ms) */
    ddp_mfu_t mfu;               /* model FLOPs utilisation's count and peak (observe/mfu.h) */
} ddp_step_log_t;

typedef struct ddp_trainer {
    ddp_spec_t spec;
    ddp_train_opts_t opts;
    ddp_kernels_t k;         /* the kernel backend (k.device: this rank's GPU) */
    ddp_world_t world;       /* the ranks this one trains with now (sync/world.h) */
    ddp_membership_t member; /* elastic membership */
    ddp_position_t pos;      /* where the run is (sync/position.h) */
    ddp_step_times_t last;   /* what the last step cost */
    ddp_model_t model;
    ddp_adamw_t opt;
    ddp_loss_scale_t loss_scale; /* the precision and fp16's loss scale (optim/loss_scale.h) */
    ddp_zero1_t zero1;           /* ZeRO-1: the moments in slices (optim/zero1.h) */
    /* the arenas when the trainer provides them (collective memory, CPU): parameters only for
     * ddp.shard_optimizer (and the moments, in zero1), else NULL and the model allocates */
    float *weights, *grads;
    ddp_run_data_t data;
    ddp_run_evals_t evals; /* multiple-choice evaluation (evaluate.c) */
    ddp_deal_t deal;
    ddp_reducer_t reducer;      /* the gradient's buckets (sync/reducer.h) */
    ddp_emb_slots_t emb_slots;  /* the token embedding's gradient (sync/emb_slots.h) */
    ddp_vote_t vote;            /* the step's small all-reduce (sync/vote.h) */
    ddp_transfer_t transfer;    /* elastic: a state transfer planned (sync/transfer.h) */
    ddp_straggler_t stragglers; /* sync/straggler.h */
    ddp_saving_t *saving;       /* checkpoints (saving/saving.h); NULL without checkpoint.dir */
    struct {
        int requested; /* this rank was asked to stop (signal) */
        int any;       /* some rank was: every rank stops after this step */
    } stop;
    int skipped_in_a_row; /* updates skipped for a non-finite gradient, in a row */
    ddp_step_log_t log;
    ddp_profile_t profile; /* train.profile's window (observe/profile.h; run.c drives it) */
    struct {
        int64_t budget;     /* the memory budget's total for this rank (memory_check.c) */
        int moments_logged; /* ddp_trainer_log_moments ran */
    } memory;
} ddp_trainer_t;

/* Joins the world (MPI under mpirun; with DDP_ELASTIC=1 the first generation the coordinator at
 * DDP_RDZV forms; else DDP_RANK/DDP_WORLD_SIZE/DDP_RDZV/DDP_JOB_TOKEN; else a world of one),
 * opens the kernel backend, builds the model (rank 0's initial weights are broadcast to all, or
 * model.init_from's), the optimizer and the reducer, resumes from the newest verified checkpoint
 * in checkpoint.dir (unless opts says otherwise), opens the data and starts the loader. On
 * failure returns a negative code with ei describing it (which file, which field). */
int ddp_trainer_init(ddp_trainer_t *t, const ddp_spec_t *spec, const ddp_train_opts_t *opts,
                     ddp_errinfo_t *ei);
/* Elastic: leaves the current generation: stops the loader, releases the reducer, the
 * collective memory and the communicator; weights, moments, step and RNG stay. */
void ddp_trainer_leave_world(ddp_trainer_t *t);
/* Elastic: joins the next generation (blocking until the coordinator forms it) with the state
 * this rank holds, rebuilds what depends on the world (communicator, gradient arena, the deal of
 * micro-batches, reducer, loader, metrics file, checkpoint writer) and, when some rank is
 * behind, plans the state transfer that the next step carries (sync/transfer.h). *st gets
 * what each part cost. */
typedef struct ddp_regroup_stats {
    double form_ms;   /* waiting for the coordinator to form the generation */
    double comm_ms;   /* the new communicator's set-up */
    double attach_ms; /* collective memory, reducer, loader, checkpoint writer */
    double state_ms;  /* planning a state transfer (and, with ddp.state_transfer: pause, the
                       * transfer and the replica check) */
    int receivers;    /* ranks that took the source's state */
    int shrunk;       /* the communicator is the last generation's, shrunk (NCCL) */
} ddp_regroup_stats_t;
int ddp_trainer_join_world(ddp_trainer_t *t, ddp_regroup_stats_t *st, ddp_errinfo_t *ei);
/* Whether rc ended only the current generation: such a failure, in an elastic job that the
 * coordinator still runs. */
int ddp_trainer_generation_failed(ddp_trainer_t *t, int rc);
/* step_log.c: everything the trainer writes about its run (rank 0 to metrics.jsonl, through
 * observe/metrics_sink.h). One step's line (also metrics.jsonl, once per step even across
 * generations); a validation's loss; a new generation (what it cost); a state transfer (of the
 * state of state_step, ms to the receivers' last byte); the end of the run. */
void ddp_trainer_log_step(ddp_trainer_t *t, float loss, double ms);
void ddp_trainer_log_val(ddp_trainer_t *t, float val_loss);
void ddp_trainer_log_generation(ddp_trainer_t *t, const ddp_regroup_stats_t *st, double ms);
void ddp_trainer_log_transfer(ddp_trainer_t *t, long state_step, double ms);
void ddp_trainer_log_done(ddp_trainer_t *t);
/* Collective: every rank's parameters are bitwise rank 0's (sync/replicas.h), else
 * DDP_EMISMATCH naming where they differ. */
int ddp_trainer_check_replicas(ddp_trainer_t *t, ddp_errinfo_t *ei);

/* Runs optimizer steps until spec.steps or until *stop becomes nonzero (checked between
 * steps; may be set by a signal handler), saving checkpoints every checkpoint.every steps and
 * at the end (also when stopped). Elastic: a failed generation is left and the next joined,
 * redoing the interrupted step (worker/run.c). Returns 0 or the first error. */
int ddp_trainer_run(ddp_trainer_t *t, volatile sig_atomic_t *stop, ddp_errinfo_t *ei);
/* One optimizer step (all micro-steps). Sets *loss to the mean training loss. */
int ddp_trainer_step(ddp_trainer_t *t, float *loss, ddp_errinfo_t *ei);
/* Mean validation loss over spec.val_batches micro-batches, split over the ranks: of each of
 * data.val's sets into t->data.val_losses, *loss the first set's. */
int ddp_trainer_validate(ddp_trainer_t *t, float *loss, ddp_errinfo_t *ei);
/* evaluate.c: the spec's eval tasks. Reads every task and tokenizes each row with the run's
 * tokenizer (DDP_ESPEC naming the file, line and field for a bad one). Called by init once the
 * model exists. */
int ddp_trainer_eval_open(ddp_trainer_t *t, ddp_errinfo_t *ei);
void ddp_trainer_eval_close(ddp_trainer_t *t);
/* Scores the tasks due after this step (every `every` steps, and after the last), dealt over
 * the ranks, and logs each (step_log.c). A failure of the communication abandons the
 * evaluation (logged) and returns the error, which the loop treats as a validation's. Collective. */
int ddp_trainer_evaluate(ddp_trainer_t *t, ddp_errinfo_t *ei);
/* ddp-worker --eval: scores the JSONL task at task_path with the model in Hugging Face
 * directory dir (config.json, safetensors, and tokenizer.json when the vocabulary is not 256)
 * on the CPU kernels (backend NULL: "cpu"), limit rows (0: all), with delim between the context
 * and each choice (the harness's target_delimiter, " " by default), and prints a JSON line and a
 * line for a person to out; details (may be NULL) gets each example's log-likelihoods
 * (score.h). Returns 0, or an error with ei set. */
int ddp_trainer_eval_checkpoint(const char *task_path, const char *dir, long limit,
                                const char *delim, const char *backend, FILE *out, FILE *details,
                                ddp_errinfo_t *ei);
/* step_log.c: an eval record (metrics.jsonl, TensorBoard eval/<task>/...) and its log line. */
void ddp_trainer_log_eval(ddp_trainer_t *t, const char *task, const ddp_mc_result_t *r, double ms);
/* Samples n tokens after a start token with the trainer's rng and writes them to out: decoded
 * through data.tokenizer when there is one (starting from its BOS, when it names one; an id past
 * its vocabulary is written as "[id]"), else as bytes for vocab 256, else as token ids. The
 * start token without a tokenizer's BOS: newline for vocab 256, else vocab_size - 1. */
int ddp_trainer_sample(ddp_trainer_t *t, int n, FILE *out);
/* Frees everything. NULL-safe. */
void ddp_trainer_close(ddp_trainer_t *t);

/* memory_check.c: plans this rank's memory for the spec and the world (budget/memory_budget.h),
 * logs the plan (unless quiet) and fails with DDP_ESPEC and advice in ei when it cannot fit
 * train.memory_limit. Called by init before the model is allocated. */
int ddp_trainer_check_memory(ddp_trainer_t *t, ddp_errinfo_t *ei);
/* Logs this process's peak RSS beside the budget's total (unless quiet). */
void ddp_trainer_log_peak_memory(const ddp_trainer_t *t);
/* Logs how much of the optimizer's moments is resident in memory (mincore; the CPU only, unless
 * quiet): with a ZeRO-1 step, this rank's slices. Called after this process's first update that
 * did not gather them for a save. */
void ddp_trainer_log_moments(const ddp_trainer_t *t);

#endif
