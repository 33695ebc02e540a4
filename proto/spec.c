/* The job spec: defaults, the field table, and validation of YAML and JSON documents.
 *
 * One table (FIELDS) lists every leaf field with its path, type, place in ddp_spec_t and
 * allowed range. The document (YAML or JSON, read into the tree of spec_tree.h) is walked
 * against it: unknown keys, wrong types and values out of range are rejected with the field
 * path, the line and column of the offending key or value, and a message that says what is
 * allowed ("must be an integer >= 1, got -2"). Then defaults that depend on other fields are
 * applied (min_lr = lr/10, seq_len = block_size, min/max_workers = workers) and the rules that
 * tie fields together are checked. ddp_spec_to_json (spec_out.c) writes the same table back,
 * so a spec round-trips through JSON to an identical struct.
 *
 * This file holds the defaults, the table, the walk of the document and the parse state with its
 * errors. Converting one value is spec_value.c's, a list field (a sequence of mappings) is
 * spec_list.c's, and the defaults and rules after the walk are spec_rules.c's; the four share
 * the second half of proto/spec_int.h.
 *
 * JSON positions: jansson does not record where a value is. When a JSON spec is rejected for a
 * field, the text is read once more with libyaml (JSON is YAML flow syntax) only to find the
 * line and column of that field; if that fails they are 0.
 *
 * The table also documents every field (its meaning, and its default where that depends on
 * other fields): spec_out.c writes the reference, docs/spec.md, from it (proto/spec_int.h).
 */
#include "proto/spec.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/file.h"
#include "proto/spec_int.h"
#include "proto/spec_tree.h"

#define SPEC_MAX_BYTES (4 << 20)

/* ---- defaults ------------------------------------------------------------------------------ */

void ddp_spec_defaults(ddp_spec_t *s)
{
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "job");
    snprintf(s->preset, sizeof s->preset, "gpt2-tiny");
    ddp_spec_preset("gpt2-tiny", &s->model);
    s->steps = 1000;
    s->micro_batch = 8;
    s->seq_len = s->model.block_size;
    s->global_batch_tokens = 0;
    s->lr = 6e-4;
    s->min_lr = s->lr / 10;
    s->warmup = 0;
    s->schedule = DDP_SCHED_COSINE;
    s->decay_frac = 0.2;
    s->decay_shape = DDP_DECAY_1_SQRT;
    s->skip_window = 128;
    s->weight_decay = 0.1;
    s->beta1 = 0.9;
    s->beta2 = 0.95;
    s->eps = 1e-8;
    s->clip = 1.0;
    s->precision = DDP_PREC_AUTO;
    s->loss_scale_interval = 2000;
    s->seed = 1337;
    s->threads = 0;
    s->val_every = 100;
    s->val_batches = 8;
    s->sample_tokens = 200;
    s->log_every = 1;
    s->bucket_mb = 25;
    s->first_bucket_mb = 1;
    s->workers = 1;
    s->min_workers = 1;
    s->max_workers = 1;
    snprintf(s->backend, sizeof s->backend, "auto");
    snprintf(s->restart, sizeof s->restart, "never");
    s->max_restarts = 3;
    s->rejoin_timeout_s = 60;
    s->heartbeat_timeout_s = 5;
    s->overlap = 1;
    s->shard_optimizer = 1;
    s->check_every = 100;
    s->ckpt_every = 0;
    s->keep_last = 3;
    s->writers = 1;
    s->shard_mb = 5000;
}

/* ---- the field table ----------------------------------------------------------------------- */

typedef ddp__sfield_t field_t;
#define NO_MAX DDP__SPEC_NO_MAX
/* A row, by designated initializers (later members of ddp__sfield_t default to 0): path, the
 * member of ddp_spec_t, range or choices, and the doc string (the reference's "meaning"). The _D
 * forms add the default in words, for a default that depends on other fields. */
#define ROW(p, t, m, ...)                                                                      \
    {.path = p, .type = t, .off = offsetof(ddp_spec_t, m),                                    \
     .size = sizeof(((ddp_spec_t *)0)->m), __VA_ARGS__}
#define F_INT_D(p, m, lo_, hi_, d, doc_)                                                       \
    ROW(p, DDP__FT_INT, m, .lo = lo_, .hi = hi_, .dflt = d, .doc = doc_)
#define F_INT(p, m, lo, hi, doc) F_INT_D(p, m, lo, hi, NULL, doc)
#define F_NUM_D(p, m, lo_, hi_, lo_o, hi_o, d, doc_)                                           \
    ROW(p, DDP__FT_NUM, m, .lo = lo_, .hi = hi_, .lo_open = lo_o, .hi_open = hi_o, .dflt = d,  \
        .doc = doc_)
#define F_NUM(p, m, lo, hi, lo_open, hi_open, doc)                                           \
    F_NUM_D(p, m, lo, hi, lo_open, hi_open, NULL, doc)
#define F_BOOL(p, m, doc_) ROW(p, DDP__FT_BOOL, m, .doc = doc_)
#define F_STR_D(p, m, d, doc_) ROW(p, DDP__FT_STR, m, .dflt = d, .doc = doc_)
#define F_STR(p, m, doc) F_STR_D(p, m, NULL, doc)
#define F_ENUM(p, m, ch, doc_) ROW(p, DDP__FT_ENUM, m, .choices = ch, .doc = doc_)
#define F_CHOICE(p, m, ch, doc_) ROW(p, DDP__FT_CHOICE, m, .choices = ch, .doc = doc_)
#define F_OTHER(p, type, m, doc_) ROW(p, type, m, .doc = doc_)
/* A list field: its items are described by `list` */
#define F_LIST(p, m, list_, d, doc_) ROW(p, DDP__FT_LIST, m, .list = &list_, .dflt = d, .doc = doc_)
/* A field that older builds do not know: left out of the JSON at its default (spec_int.h) */
#define QUIET(...) ROW(__VA_ARGS__, .quiet = true)
/* A key of a list's item (a struct of type t) */
#define IROW(k, t_, t, m, ...)                                                                 \
    {.path = k, .type = t_, .off = offsetof(t, m), .size = sizeof(((t *)0)->m), __VA_ARGS__}
#define I_STR(t, k, m, doc_) IROW(k, DDP__FT_STR, t, m, .required = true, .doc = doc_)
#define I_INT(t, k, m, doc_) IROW(k, DDP__FT_INT, t, m, .hi = NO_MAX, .doc = doc_)

static const char *const SCHEDULES[] = {"cosine", "constant", "wsd", NULL};
/* in ddp_decay_shape_t's order */
static const char *const DECAY_SHAPES[] = {"linear", "1-sqrt", "cosine", NULL};
/* in ddp_precision_t's order */
static const char *const PRECISIONS[] = {"fp32", "bf16", "fp16", "auto", NULL};
static const char *const BACKENDS[] = {"auto", "ring", "nccl", "mpi", NULL};
static const char *const RESTARTS[] = {"never", "on-failure", NULL};
static const char *const RECOMPUTES[] = {"none", "block", NULL};
/* in ddp_state_transfer_t's order */
static const char *const STATE_TRANSFERS[] = {"auto", "overlap", "pause", NULL};
/* in ddp_grad_dtype_t's order */
static const char *const GRAD_DTYPES[] = {"fp32", "bf16", NULL};
static const char *const SECTIONS[] = {"name", "model",      "data",   "train", "eval",
                                       "ddp",  "checkpoint", "limits", NULL};

/* ---- the lists' items ---- */

#define NAME_DOC(what)                                                                         \
    "the " what "'s name: letters, digits, `-`, `_` and `.`, not starting with `-` or `.`; "   \
    "unique in the list"
static const field_t TRAIN_ITEM[] = {
    I_STR(ddp_data_source_t, "name", name, NAME_DOC("source") "; metrics count its tokens under it"),
    I_STR(ddp_data_source_t, "path", glob, "glob of the source's token shards"),
    IROW("weight", DDP__FT_NUM, ddp_data_source_t, weight, .hi = 1e9, .lo_open = true,
         .doc = "the source's share of the sequences, relative to the others' weights (`1`)"),
};
static const field_t VAL_ITEM[] = {
    I_STR(ddp_data_source_t, "name", name, NAME_DOC("set") "; its loss is `val_loss/<name>`"),
    I_STR(ddp_data_source_t, "path", glob, "glob of the set's token shards"),
};
static const field_t EVAL_ITEM[] = {
    I_STR(ddp_eval_task_t, "name", name, NAME_DOC("task") "; its scores are `eval/<name>/...`"),
    I_STR(ddp_eval_task_t, "path", path,
          "a JSONL file of multiple-choice rows, HellaSwag's or `{context, choices, label}` "
          "([evaluation.md](evaluation.md))"),
    I_INT(ddp_eval_task_t, "every", every,
          "steps between evaluations; `0` = only after the last step, when every task runs"),
    I_INT(ddp_eval_task_t, "limit", limit, "examples scored, the file's first ones; `0` = all"),
    IROW("target_delimiter", DDP__FT_STR, ddp_eval_task_t, target_delimiter, .quiet = true,
         .doc = "put between the context and each choice, as lm-evaluation-harness's task "
                "option of that name; `\"\"` for choices that are whole lines after a context "
                "that ends in a line break"),
};
static const ddp_data_source_t SOURCE_DEFAULTS = {.weight = 1};
static const ddp_eval_task_t EVAL_DEFAULTS = {.every = 0, .target_delimiter = " "};
static const ddp__slist_t TRAIN_LIST = {TRAIN_ITEM, 3, sizeof(ddp_data_source_t),
                                        DDP_SPEC_MAX_SOURCES, offsetof(ddp_spec_t, n_train),
                                        "path", offsetof(ddp_spec_t, train_listed),
                                        &SOURCE_DEFAULTS};
static const ddp__slist_t VAL_LIST = {VAL_ITEM, 2, sizeof(ddp_data_source_t),
                                      DDP_SPEC_MAX_SOURCES, offsetof(ddp_spec_t, n_val), "path",
                                      offsetof(ddp_spec_t, val_listed), &SOURCE_DEFAULTS};
static const ddp__slist_t EVAL_LIST = {EVAL_ITEM, 5, sizeof(ddp_eval_task_t), DDP_SPEC_MAX_EVALS,
                                       offsetof(ddp_spec_t, n_eval), NULL, 0, &EVAL_DEFAULTS};

const ddp__sfield_t ddp__spec_fields[] = {
    F_STR("name", name,
          "the job's name: letters, digits, `-`, `_` and `.`, not starting with `-` or `.`"),
    F_OTHER("model.preset", DDP__FT_PRESET, preset,
            "a model size by name (see Presets), or instead all five dimensions below"),
    F_STR("model.init_from", init_from,
          "a directory of Hugging Face safetensors (GPT-2, Llama or Qwen2; `model.safetensors` "
          "or a sharded `model.safetensors.index.json`) to start from; its `config.json` gives "
          "the model when no preset, dimensions or `model.config` do, and given ones are "
          "checked against it; `\"\"` = random initial weights"),
    F_STR("model.config", config,
          "a Hugging Face `config.json` (or its directory) that gives the model: GPT-2, Llama "
          "(`LlamaForCausalLM`) or Qwen2, random initial weights unless `model.init_from`; "
          "what ddpd does not implement is refused by key; `\"\"` = none"),
    F_INT_D("model.n_layer", model.n_layer, 1, 1000, "the preset's", "transformer blocks"),
    F_INT_D("model.n_head", model.n_head, 1, 1024, "the preset's", "attention heads"),
    F_INT_D("model.n_embd", model.n_embd, 1, 65536, "the preset's",
            "channels, divisible by `n_head`"),
    F_INT_D("model.vocab_size", model.vocab_size, 1, 1 << 20, "the preset's",
            "tokens the model can emit"),
    F_INT_D("model.block_size", model.block_size, 1, 1 << 20, "the preset's",
            "the longest sequence (rows of the position embedding)"),
    F_LIST("data.train", train, TRAIN_LIST, "required",
           "glob of the training token shards (llm.c's format, as `ddp-prep` writes them), or "
           "a mixture: a list of sources `[{name, path, weight}]`, each sequence of a step drawn "
           "by a deterministic rule that keeps every source within one sequence of its share, "
           "each source with its own cursor "
           "([running.md](running.md#data-mixtures))"),
    F_LIST("data.val", val, VAL_LIST, "`\"\"`",
           "glob of the validation shards, or a list of named sets `[{name, path}]`; `\"\"` = no "
           "validation"),
    F_STR("data.tokenizer", tokenizer,
          "a Hugging Face `tokenizer.json` (byte-level BPE, as `ddp-prep --tokenizer` takes) "
          "whose vocabulary fits `model.vocab_size`: copied into the run directory and every "
          "checkpoint (with the `tokenizer_config.json` beside it), its BOS and EOS named in "
          "their `config.json` and `generation_config.json`, and the sample decoded through "
          "it; `\"\"` = none"),
    F_INT("train.steps", steps, 1, NO_MAX, "optimizer steps"),
    F_INT("train.micro_batch", micro_batch, 1, 1 << 20,
          "sequences per rank per micro-step (B)"),
    F_INT_D("train.seq_len", seq_len, 1, 1 << 20, "`model.block_size`",
            "tokens per sequence (T), at most `model.block_size`"),
    F_INT("train.global_batch_tokens", global_batch_tokens, 0, NO_MAX,
          "tokens per optimizer step over all ranks, a multiple of B x T; 0 = B x T x world. "
          "Gradient accumulation makes up the rest, so the global batch is the same at any "
          "world size that divides it (the worker checks that the world does)"),
    F_NUM("train.lr", lr, 0, 10, true, false, "peak learning rate"),
    F_NUM_D("train.min_lr", min_lr, 0, 10, false, false, "`train.lr` / 10 (`wsd`: 0)",
            "final learning rate of the cosine and wsd schedules, at most `train.lr`"),
    F_INT("train.warmup", warmup, 0, NO_MAX,
          "steps of linear warmup from 0 to `lr`, fewer than `train.steps`"),
    F_ENUM("train.schedule", schedule, SCHEDULES,
           "the learning rate after warmup: `cosine` decays to `min_lr` at the last step, "
           "`constant` stays at `lr`, `wsd` (warmup-stable-decay) stays at `lr` and then decays "
           "to `min_lr` over the last `decay_steps` ([training.md](training.md#schedules))"),
    QUIET("train.decay_steps", DDP__FT_INT, decay_steps, .hi = NO_MAX,
          .doc =
                "`wsd`: steps of the decay, at the end of `train.steps`; 0 = `decay_frac` x "
                "`steps`"),
    QUIET("train.decay_frac", DDP__FT_NUM, decay_frac, .hi = 1, .lo_open = true,
          .doc =
                "`wsd`: the decay's share of `train.steps` (rounded), when `decay_steps` is 0"),
    QUIET("train.decay_shape", DDP__FT_ENUM, decay_shape, .choices = DECAY_SHAPES,
          .doc =
                 "`wsd`: the decay from `lr` to `min_lr`: `linear`, `1-sqrt` (Hagele et al. "
                 "2024) or `cosine`"),
    QUIET("train.allow_schedule_change", DDP__FT_BOOL, allow_schedule_change,
          .doc = "a resume may change a `cosine` run's `train.steps`, which reshapes the rest "
                 "of its curve, or change the schedule's kind (a `wsd` run's decay always moves "
                 "with `steps`; a `constant` one has no curve)"),
    QUIET("train.skip_loss_z", DDP__FT_NUM, skip_loss_z, .hi = NO_MAX,
          .doc =
                "spike skipping: a step whose loss is this many standard deviations above the "
                "mean of the last `skip_window` steps' is not applied; 0 = off"),
    QUIET("train.skip_norm_z", DDP__FT_NUM, skip_norm_z, .hi = NO_MAX,
          .doc =
                "spike skipping: the same for the gradient norm; 0 = off"),
    QUIET("train.skip_window", DDP__FT_INT, skip_window, .lo = 2, .hi = DDP_SPEC_MAX_SKIP_WINDOW,
          .doc =
                "steps in spike skipping's window (no step is skipped before it is full); a "
                "z-score cannot exceed sqrt(skip_window - 1)"),
    F_NUM("train.weight_decay", weight_decay, 0, NO_MAX, false, false,
          "AdamW's decoupled weight decay, on matrices (2-D tensors) only"),
    {.path = "train.betas", .type = DDP__FT_PAIR, .off = offsetof(ddp_spec_t, beta1),
     .size = 2 * sizeof(double), .hi = 1, .hi_open = true,
     .doc = "AdamW's betas as `[beta1, beta2]`, or give `beta1` and `beta2`"},
    F_NUM("train.beta1", beta1, 0, 1, false, true, "AdamW's first-moment decay"),
    F_NUM("train.beta2", beta2, 0, 1, false, true, "AdamW's second-moment decay"),
    F_NUM("train.eps", eps, 0, 1, true, false, "AdamW's epsilon"),
    F_NUM("train.clip", clip, 0, NO_MAX, false, false,
          "the global gradient norm is clipped to this; 0 = off"),
    F_ENUM("train.precision", precision, PRECISIONS,
           "the inputs of every matrix product: `bf16` and `fp16` round them and accumulate in "
           "fp32 (autocast's rules; fp16 adds dynamic loss scaling); `auto` = bf16 where the "
           "backend multiplies it natively (a GPU of compute capability 8.0 or newer, a CPU "
           "with AVX512_BF16 or AMX), else fp32; the choice and its reason are logged"),
    F_INT("train.loss_scale_interval", loss_scale_interval, 1, NO_MAX,
          "fp16: clean steps before the loss scale doubles"),
    F_OTHER("train.seed", DDP__FT_SEED, seed,
            "seed of the initialisation, the data order and sampling"),
    F_INT("train.threads", threads, 0, 4096,
          "compute threads per rank; 0 = the host's cores / its local ranks"),
    F_INT("train.val_every", val_every, 0, NO_MAX, "steps between validations; 0 = never"),
    F_INT("train.val_batches", val_batches, 1, 1 << 20, "micro-batches per validation"),
    F_INT("train.sample_tokens", sample_tokens, 0, 1 << 20,
          "tokens sampled from the model at the end; 0 = none"),
    F_INT("train.log_every", log_every, 1, NO_MAX, "a step line every N steps"),
    F_STR("train.trace", trace,
          "steps to trace, `\"N\"` or `\"N-M\"`: a Chrome/Perfetto timeline of each rank in "
          "`RUN_DIR/trace/rank-R.json` (`ddpctl trace` merges them); `\"\"` = none"),
    F_INT("train.profile", profile, 0, NO_MAX,
          "a per-op profile of N steps after 2 warm-up steps (fewer when the run is shorter): "
          "each rank's table of op, calls, ms, share of the step, bytes, FLOPs, GB/s and "
          "TFLOP/s in its log and in `RUN_DIR/profile-rank<R>.txt` and `.json` (timed by CUDA "
          "events on a GPU, by the clock on the CPU); 0 = off"),
    F_ENUM("train.recompute", recompute, RECOMPUTES,
           "`block`: keep only each transformer block's input through the forward and run the "
           "block's forward again inside backward (activation checkpointing); the gradients "
           "are bitwise those of `none`"),
    F_OTHER("train.memory_limit", DDP__FT_BYTES, memory_limit,
            "memory one rank may use, checked before step 1; 0 = the GPU's memory, or on the "
            "CPU the cgroup's `memory.max` or the RAM, divided among the host's ranks"),
    F_LIST("eval", eval, EVAL_LIST, "`[]`",
           "multiple-choice tasks scored during the run, a list `[{name, path, every, limit}]`: "
           "accuracy by summed log-likelihood (`acc`), by it per character (`acc_norm`) and by "
           "mean loss per token (`acc_tok`), as lm-evaluation-harness and llm.c define them "
           "([evaluation.md](evaluation.md))"),
    F_NUM("ddp.bucket_mb", bucket_mb, 0, 65536, true, false, "gradient bucket size, MiB"),
    F_NUM("ddp.first_bucket_mb", first_bucket_mb, 0, 65536, true, false,
          "the first (small) bucket's size, MiB, at most `bucket_mb`"),
    F_INT("ddp.workers", workers, 1, 65536, "ranks"),
    F_INT_D("ddp.min_workers", min_workers, 1, 65536, "`ddp.workers`",
            "the fewest ranks an elastic job goes on with, at most `workers`"),
    F_INT_D("ddp.max_workers", max_workers, 1, 65536, "`ddp.workers`",
            "the most ranks an elastic job admits, at least `workers`"),
    F_CHOICE("ddp.backend", backend, BACKENDS,
             "collectives: `auto` = `nccl` on a GPU, `ring` on the CPU (shared memory within a "
             "host, TCP between hosts); `mpi` under mpirun. `ring` or `mpi` on a GPU stage its "
             "buffers through host memory: slower, for more ranks than GPUs (NCCL refuses two "
             "ranks on one GPU)"),
    F_BOOL("ddp.overlap", overlap,
           "all-reduce each bucket during backward (`false`: after it, for comparison)"),
    F_BOOL("ddp.shard_optimizer", shard_optimizer,
           "ZeRO-1: the gradients are reduce-scattered, each rank updates its slices of the "
           "parameters and moments (between hosts it keeps only those moments in memory) and an "
           "all-gather copies the new parameters to every rank; bitwise the same weights. Over "
           "the ring (TCP or shared memory) and NCCL; not over MPI or in an elastic job"),
    F_INT("ddp.check_every", check_every, 0, NO_MAX,
          "steps between replica checksum comparisons; 0 = never"),
    F_CHOICE("ddp.restart", restart, RESTARTS,
             "`on-failure`: elastic: a dead or hung rank is evicted, spawned again and rejoins "
             "from a live rank ([elastic.md](elastic.md))"),
    F_INT("ddp.max_restarts", max_restarts, 0, 1000000, "times each rank is spawned again"),
    F_NUM("ddp.rejoin_timeout_s", rejoin_timeout_s, 0, 1e6, true, false,
          "seconds a job below `min_workers` waits for replacements, and a rank redials a "
          "coordinator that went away"),
    F_NUM("ddp.heartbeat_timeout_s", heartbeat_timeout_s, 0, 3600, true, false,
          "seconds of silence before a rank (or the coordinator) is given up"),
    F_ENUM("ddp.state_transfer", state_transfer, STATE_TRANSFERS,
           "how a rejoining rank gets the state: `overlap` (streamed during the others' next "
           "step, which they compute without it), `pause` (they wait for it), `auto` (the "
           "cheaper, estimated from the source's last step)"),
    QUIET("ddp.grad_dtype", DDP__FT_ENUM, grad_dtype, .choices = GRAD_DTYPES,
          .doc = "the type the gradient buckets are all-reduced (or reduce-scattered) in: `bf16` "
                 "rounds them before and widens them after, half the bytes; the vote and the "
                 "norm stay fp32, one rank rounds nothing, a resume may change it "
                 "([precision.md](precision.md))"),
    F_STR("checkpoint.dir", ckpt_dir, "where checkpoints go; `\"\"` = none"),
    F_INT("checkpoint.every", ckpt_every, 0, NO_MAX,
          "steps between saves (needs `dir`); 0 = only at the end"),
    F_INT("checkpoint.keep_last", keep_last, 0, 1000000,
          "checkpoints kept; 0 = all. The newest one dropped stays as a hidden `.recycle/` "
          "until the next save writes over its files (removed when the run ends)"),
    F_INT("checkpoint.writers", writers, 1, 65536,
          "ranks that write shards (striped), at most `ddp.max_workers`"),
    F_NUM("checkpoint.shard_mb", shard_mb, 0, 1e9, true, false,
          "safetensors shard size, decimal MB"),
    QUIET("limits.log_bytes", DDP__FT_BYTES, log_bytes,
          .doc =
            "cap on each rank's log (`rank-R.log`): past it one closing line is written and the "
            "rank's further output is discarded; 0 = none; a daemon's per-user limit lowers it"),
    QUIET("limits.metrics_bytes", DDP__FT_BYTES, metrics_bytes,
          .doc =
            "cap on `metrics.jsonl`: no line is written past it (one warning in the log; "
            "training goes on); 0 = none; a daemon's per-user limit lowers it"),
    QUIET("limits.tensorboard_bytes", DDP__FT_BYTES, tensorboard_bytes,
          .doc =
            "cap on the TensorBoard event files in `RUN_DIR/tb/` together: no event is written "
            "past it (one warning); 0 = none; a daemon's per-user limit lowers it"),
};
#define N_FIELDS (sizeof ddp__spec_fields / sizeof ddp__spec_fields[0])
const size_t ddp__spec_n_fields = N_FIELDS;
static const field_t *const FIELDS = ddp__spec_fields;
_Static_assert(N_FIELDS <= DDP__SPEC_MAX_FIELDS, "raise DDP__SPEC_MAX_FIELDS in spec_int.h");

int ddp__spec_field_index(const char *path)
{
    for (size_t i = 0; i < N_FIELDS; i++)
        if (!strcmp(FIELDS[i].path, path)) return (int)i;
    DDP_ASSERT(!"unknown field path");
    return -1;
}

/* ---- parse state and errors ---------------------------------------------------------------- */

typedef ddp__spec_pstate_t pstate_t;

int ddp__spec_field_error(pstate_t *ps, const char *path, int line, int column, const char *fmt,
                          ...)
{
    if (!ps->ei) return DDP_ESPEC;
    ddp_errinfo_clear(ps->ei);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ps->ei->msg, sizeof ps->ei->msg, fmt, ap);
    va_end(ap);
    ddp_errinfo_path(ps->ei, "%s", path);
    ps->ei->line = line;
    ps->ei->column = column;
    return DDP_ESPEC;
}

/* How a value is shown in a message: strings quoted, containers by kind. */
const char *ddp__spec_repr(const ddp__snode_t *n, char *buf, size_t len)
{
    if (n->kind == DDP__SN_MAP) return "a mapping";
    if (n->kind == DDP__SN_SEQ) return "a sequence";
    if (n->stype == DDP__SC_STRING) {
        snprintf(buf, len, "\"%.60s\"%s", n->text, strlen(n->text) > 60 ? "..." : "");
        return buf;
    }
    if (n->stype == DDP__SC_NULL) return "null (no value)";
    snprintf(buf, len, "%.60s%s", n->text, strlen(n->text) > 60 ? "..." : "");
    return buf;
}

void ddp__spec_list_choices(const char *const *ch, char *buf, size_t len)
{
    size_t n = 0;
    buf[0] = '\0';
    for (size_t i = 0; ch[i] && n < len; i++)
        n += snprintf(buf + n, len - n, "%s%s", i ? ", " : "", ch[i]);
}

/* Converts and stores the value of FIELDS[i], remembering where it was given. */
static int set_field(pstate_t *ps, int i, const ddp__snode_t *n)
{
    ps->set[i] = true;
    ps->line[i] = n->line;
    ps->column[i] = n->column;
    return ddp__spec_convert(ps, &FIELDS[i], FIELDS[i].path, (char *)ps->spec + FIELDS[i].off, n);
}

/* ---- walking the document ------------------------------------------------------------------ */

static int unknown_key(pstate_t *ps, const char *section, const ddp__sentry_t *e)
{
    char allowed[512];
    size_t k = 0, plen = section ? strlen(section) : 0;
    allowed[0] = '\0';
    if (!section) {
        ddp__spec_list_choices(SECTIONS, allowed, sizeof allowed);
    } else {
        for (size_t i = 0; i < N_FIELDS; i++)
            if (!strncmp(FIELDS[i].path, section, plen) && FIELDS[i].path[plen] == '.')
                k += snprintf(allowed + k, sizeof allowed - k, "%s%s", k ? ", " : "",
                              FIELDS[i].path + plen + 1);
    }
    char path[200];
    snprintf(path, sizeof path, "%s%s%.100s", section ? section : "", section ? "." : "",
             e->key);
    return ddp__spec_field_error(ps, path, e->key_line, e->key_column,
                                 "unknown key; allowed here: %s", allowed);
}

static int walk_section(pstate_t *ps, const char *section, const ddp__sentry_t *se)
{
    const ddp__snode_t *m = se->val;
    char rb[96];
    if (m->kind == DDP__SN_SCALAR && m->stype == DDP__SC_NULL) return 0; /* `train:` alone */
    if (m->kind != DDP__SN_MAP)
        return ddp__spec_field_error(ps, section, m->line, m->column,
                                     "must be a mapping of keys, got %s",
                                     ddp__spec_repr(m, rb, sizeof rb));
    for (size_t j = 0; j < m->n; j++) {
        const ddp__sentry_t *e = &m->entries[j];
        char path[200];
        snprintf(path, sizeof path, "%s.%.100s", section, e->key);
        int idx = -1;
        for (size_t i = 0; i < N_FIELDS; i++)
            if (!strcmp(FIELDS[i].path, path)) idx = (int)i;
        if (idx < 0) return unknown_key(ps, section, e);
        DDP_CHECK(set_field(ps, idx, e->val));
    }
    return 0;
}

static int walk(pstate_t *ps, const ddp__snode_t *root)
{
    char rb[96];
    if (!root)
        return ddp__spec_field_error(
            ps, "data.train", 0, 0,
            "is required (the spec is empty): a glob of token shards such as "
            "data/train_*.bin");
    if (root->kind != DDP__SN_MAP)
        return ddp__spec_field_error(
            ps, ps->origin, root->line, root->column,
            "a spec must be a mapping (name, model, data, train, eval, ddp, "
            "checkpoint, limits), got %s",
            ddp__spec_repr(root, rb, sizeof rb));
    for (size_t j = 0; j < root->n; j++) {
        const ddp__sentry_t *e = &root->entries[j];
        int k = 0;
        while (SECTIONS[k] && strcmp(e->key, SECTIONS[k])) k++;
        if (!SECTIONS[k]) return unknown_key(ps, NULL, e);
        if (!strcmp(e->key, "name") || !strcmp(e->key, "eval")) /* the top-level fields */
            DDP_CHECK(set_field(ps, ddp__spec_field_index(e->key), e->val));
        else
            DDP_CHECK(walk_section(ps, e->key, e));
    }
    return 0;
}

/* ---- entry points -------------------------------------------------------------------------- */

static bool is_json(const char *text, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r') continue;
        return text[i] == '{';
    }
    return false;
}

/* JSON: find the line/column of the failed field by reading the text as YAML (see top). */
static void json_locate(const char *text, size_t len, ddp_errinfo_t *ei)
{
    if (!ei || ei->line || !ei->path[0]) return;
    ddp__stree_t yt;
    if (ddp__stree_yaml(&yt, text, len, "", NULL) == 0) {
        const ddp__sentry_t *e = ddp__stree_find(yt.root, ei->path);
        /* unknown keys point at the key, other errors at the value */
        if (e && !strncmp(ei->msg, "unknown key", 11)) {
            ei->line = e->key_line;
            ei->column = e->key_column;
        } else if (e) {
            ei->line = e->val->line;
            ei->column = e->val->column;
        }
    }
    ddp__stree_free(&yt);
}

int ddp_spec_parse(ddp_spec_t *spec, const char *text, size_t len, const char *origin,
                   ddp_errinfo_t *ei)
{
    if (!origin) origin = "<inline>";
    ddp__stree_t tree;
    bool json = is_json(text, len);
    int rc = json ? ddp__stree_json(&tree, text, len, origin, ei)
                  : ddp__stree_yaml(&tree, text, len, origin, ei);
    if (rc) return rc;

    pstate_t *ps = ddp_calloc(1, sizeof *ps);
    if (!ps) {
        ddp__stree_free(&tree);
        return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory parsing the spec");
    }
    ps->spec = spec;
    ps->ei = ei;
    ps->origin = origin;
    ddp_spec_defaults(spec);
    rc = walk(ps, tree.root);
    if (!rc) rc = ddp__spec_finish(ps, tree.root);
    ddp__stree_free(&tree);
    free(ps);
    if (rc && json) json_locate(text, len, ei);
    return rc;
}

int ddp_spec_load(ddp_spec_t *spec, const char *path, ddp_errinfo_t *ei)
{
    struct stat st;
    char *buf = NULL;
    size_t len = 0;
    int rc = stat(path, &st) == 0 && !S_ISREG(st.st_mode)
                 ? -EFBIG /* the same rule as a file too big */
                 : ddp_file_read(path, SPEC_MAX_BYTES, &buf, &len);
    if (rc == -EFBIG) {
        rc = ddp_errinfo_set(ei, DDP_ESPEC, "a spec must be a regular file of at most %d bytes",
                             SPEC_MAX_BYTES);
    } else if (rc == DDP_ENOMEM) {
        ddp_errinfo_set(ei, rc, "out of memory reading the spec");
    } else if (rc) {
        ddp_errinfo_set(ei, rc, "cannot read the spec: %s", strerror(-rc));
    } else {
        rc = ddp_spec_parse(spec, buf, len, path, ei);
    }
    if (rc && ei && !ei->path[0]) ddp_errinfo_path(ei, "%s", path);
    free(buf);
    return rc;
}

const char *ddp_spec_errstr(const ddp_errinfo_t *ei, const char *origin, char *buf, size_t len)
{
    if (!len) return buf;
    if (!origin) origin = "<inline>";
    bool field = ei->path[0] && strcmp(ei->path, origin) != 0;
    if (ei->line > 0)
        snprintf(buf, len, "%s:%d:%d: %s%s%s", origin, ei->line, ei->column,
                 field ? ei->path : "", field ? ": " : "", ei->msg);
    else
        snprintf(buf, len, "%s: %s%s%s", origin, field ? ei->path : "", field ? ": " : "",
                 ei->msg);
    return buf;
}

int ddp_spec_warning(const ddp_spec_t *s, char *buf, size_t len)
{
    if (len) buf[0] = '\0';
    if (s->min_workers < s->workers && !strcmp(s->restart, "never")) {
        snprintf(buf, len,
                 "ddp.min_workers (%d) is below ddp.workers (%d) but ddp.restart is never: a "
                 "rank's death fails the job; set ddp.restart: on-failure to go on with at "
                 "least %d", s->min_workers, s->workers, s->min_workers);
        return 1;
    }
    return 0;
}
