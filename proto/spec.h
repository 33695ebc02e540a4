/* The job spec: what a job trains, on what data, how, and where it checkpoints.
 *
 * Parsed from YAML (libyaml) or JSON (jansson; a document whose first non-space byte is '{')
 * and validated before anything starts. Every rejected spec fills a ddp_errinfo_t with the
 * field path ("train.lr"), the line and column where the parser knows them, and a message that
 * says what is allowed. Unknown keys are errors. Defaults are applied by the parser, so a
 * parsed spec is complete. World-size divisibility of global_batch_tokens is checked by the
 * worker, which knows the world.
 *
 * Every field, its type, default, allowed values and meaning: docs/spec.md, which
 * ddp_spec_reference below generates from the field table in spec.c (`ddp-worker
 * --spec-reference`; a unit test keeps the two equal). Add a field there, not here.
 */
#ifndef DDP_PROTO_SPEC_H
#define DDP_PROTO_SPEC_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/err.h"

/* The model's architecture family. */
typedef enum {
    DDP_ARCH_GPT2 = 0,  /* LayerNorm, learned positions, GELU MLP, biases, tied LM head */
    DDP_ARCH_LLAMA = 1, /* RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention, no
                         * biases (but Qwen2's q/k/v), tied or untied LM head */
} ddp_arch_t;

/* A model's shape: what Hugging Face's config.json says (proto/hf_config.h reads and writes
 * it). The fields after block_size are the Llama family's and stay zero for GPT-2, so a GPT-2
 * shape is {n_layer, n_head, n_embd, vocab_size, block_size}. */
typedef struct ddp_model_cfg {
    int n_layer, n_head, n_embd;
    int vocab_size; /* tokens the model can emit */
    int block_size; /* max sequence length (GPT-2's wpe rows; Llama's max_position_embeddings) */
    ddp_arch_t arch;
    int n_kv_head;         /* key/value heads (grouped-query attention), divides n_head */
    int intermediate_size; /* the SwiGLU MLP's hidden width */
    int tie_embeddings;    /* 1: the LM head is the token embedding (lm_head.weight absent) */
    int attention_bias;    /* 1: q/k/v projections have biases (Qwen2) */
    double norm_eps;       /* RMSNorm's epsilon (rms_norm_eps) */
    double rope_theta;     /* RoPE's base */
    /* Llama 3's RoPE scaling (rope_scaling.rope_type "llama3"); rope_factor 0 = none */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max; /* original_max_position_embeddings */
    int qwen2;             /* 1: written back as model_type "qwen2" (Qwen2ForCausalLM) */
} ddp_model_cfg_t;

typedef enum { DDP_SCHED_COSINE = 0, DDP_SCHED_CONSTANT = 1, DDP_SCHED_WSD = 2 } ddp_schedule_t;
/* The shape of a warmup-stable-decay schedule's decay (train.decay_shape). */
typedef enum { DDP_DECAY_LINEAR = 0, DDP_DECAY_1_SQRT = 1, DDP_DECAY_COSINE = 2 } ddp_decay_shape_t;

#define DDP_SPEC_MAX_SOURCES 8        /* entries of data.train or data.val */
#define DDP_SPEC_MAX_EVALS 8          /* entries of eval */
#define DDP_SPEC_MAX_SKIP_WINDOW 4096 /* train.skip_window */

/* One source of token shards: an entry of data.train (a mixture) or data.val. */
typedef struct ddp_data_source {
    char name[64];   /* ddp_spec_name_ok, unique in its list; "" in the plain-string form */
    char glob[1024]; /* glob of token shards */
    double weight;   /* > 0, not normalised (data.val: 1); 1 in the plain-string form */
} ddp_data_source_t;

/* One multiple-choice evaluation task: an entry of eval. */
typedef struct ddp_eval_task {
    char name[64];   /* ddp_spec_name_ok, unique */
    char path[1024]; /* a JSONL file of multiple-choice rows */
    long every;      /* steps between evaluations; 0 = only after the last step (always then too) */
    long limit;      /* examples scored: the first `limit` of the file; 0 = all */
    char target_delimiter[16]; /* between the context and each choice (the harness's; " ") */
} ddp_eval_task_t;
/* The values are kernels/kernels.h's ddp_kprec_t's; AUTO is resolved by the worker. */
typedef enum {
    DDP_PREC_FP32 = 0,
    DDP_PREC_BF16 = 1,
    DDP_PREC_FP16 = 2,
    DDP_PREC_AUTO = 3,
} ddp_precision_t;
/* What backward recomputes instead of keeping: nothing, or each block's forward (only the
 * blocks' inputs are kept). */
typedef enum { DDP_RECOMPUTE_NONE = 0, DDP_RECOMPUTE_BLOCK = 1 } ddp_recompute_t;
/* How a rank that lacks the state gets it (elastic; worker/state_transfer.h). */
typedef enum {
    DDP_TRANSFER_AUTO = 0,
    DDP_TRANSFER_OVERLAP = 1,
    DDP_TRANSFER_PAUSE = 2
} ddp_state_transfer_t;
/* The type the gradient buckets travel in (ddp.grad_dtype; worker/sync/grad_dtype.h). */
typedef enum { DDP_GRAD_FP32 = 0, DDP_GRAD_BF16 = 1 } ddp_grad_dtype_t;

typedef struct ddp_spec {
    char name[128];

    /* model */
    char preset[32];        /* "" when given by dimensions or init_from */
    ddp_model_cfg_t model;  /* from the preset or the dimensions; all zero when only init_from
                             * is given, until ddp_spec_resolve_model (proto/hf_config.h) reads
                             * its config.json (and then seq_len 0 becomes block_size) */
    char init_from[1024];   /* "" or a directory of Hugging Face safetensors (GPT-2 or Llama) */
    char config[1024];      /* "" or a Hugging Face config.json (or its directory): the model */

    /* data: glob patterns of token shards; each list is a string (one source, listed 0, written
     * back as a string) or a list of named sources (listed 1) */
    int n_train;                                   /* >= 1 */
    ddp_data_source_t train[DDP_SPEC_MAX_SOURCES]; /* a mixture when n_train > 1 */
    int train_listed;
    int n_val;                                     /* 0 = no validation */
    ddp_data_source_t val[DDP_SPEC_MAX_SOURCES];
    int val_listed;
    char tokenizer[1024]; /* "" or a Hugging Face tokenizer.json (worker/run_tokenizer.h) */

    /* train */
    long steps;               /* optimizer steps; >= 1 */
    int micro_batch;          /* sequences per rank per micro-step (B); >= 1 */
    int seq_len;              /* T; 1..block_size */
    long global_batch_tokens; /* tokens per optimizer step over all ranks; 0 = micro_batch*seq_len*world */
    double lr, min_lr;        /* min_lr default lr/10 */
    long warmup;              /* linear warmup steps */
    ddp_schedule_t schedule;
    long decay_steps;              /* wsd: steps of the decay; 0 = decay_frac x steps */
    double decay_frac;             /* wsd: the decay's share of steps, (0, 1] */
    ddp_decay_shape_t decay_shape; /* wsd: the decay's shape */
    int allow_schedule_change;     /* bool: a resume may change a cosine run's steps */
    double skip_loss_z, skip_norm_z; /* spike skipping's z-score thresholds; 0 = off */
    int skip_window;                 /* spike skipping's window of steps */
    double weight_decay, beta1, beta2, eps, clip; /* clip 0 = off */
    ddp_precision_t precision;                   /* matmul inputs; AUTO until the worker picks */
    long loss_scale_interval;                    /* fp16: clean steps before the scale doubles */
    uint64_t seed;
    int threads;       /* compute threads per rank; 0 = cores / local ranks */
    long val_every;    /* 0 = never */
    int val_batches;   /* micro-batches per validation */
    int sample_tokens; /* tokens sampled at the end; 0 = none */
    long log_every;    /* step lines every N steps */
    char trace[32];    /* steps to trace, "N" or "N-M" (common/trace.h); "" = none */
    long profile;      /* steps profiled per op after 2 warm-up ones (worker/profile.h); 0 = off */
    ddp_recompute_t recompute; /* activation recomputation in backward */
    int64_t memory_limit;      /* bytes a rank may use; 0 = the device's (GPU, cgroup or RAM) */

    /* ddp */
    double bucket_mb, first_bucket_mb;
    int workers, min_workers, max_workers;
    char backend[16]; /* "auto", "ring", "nccl", "mpi" */
    int overlap;      /* bool */
    int shard_optimizer; /* bool */
    long check_every; /* replica checksum comparison; 0 = never */
    char restart[16];  /* "never", "on-failure": a dead rank is restarted and rejoins (elastic) */
    int max_restarts;  /* restarts per rank */
    double rejoin_timeout_s;    /* below min_workers: how long the job waits for replacements */
    double heartbeat_timeout_s; /* silence after which a rank is evicted */
    ddp_state_transfer_t state_transfer; /* a joiner's state: overlapped, paused for, or auto */
    ddp_grad_dtype_t grad_dtype; /* the buckets' all-reduce in fp32 or bf16 */

    /* eval: multiple-choice tasks scored during the run */
    int n_eval;
    ddp_eval_task_t eval[DDP_SPEC_MAX_EVALS];

    /* checkpoint */
    char ckpt_dir[1024]; /* "" = no checkpoints */
    long ckpt_every;     /* steps; 0 = only at the end */
    int keep_last;
    int writers;
    double shard_mb; /* decimal MB */

    /* limits: caps on the files a rank writes, in bytes; 0 = no cap. The worker caps each at
     * the smaller of this and the daemon's per-user limit (DDP_LIMIT_*, worker/main.c). */
    int64_t log_bytes;         /* each rank's log, RUN_DIR/rank-R.log (common/log.h) */
    int64_t metrics_bytes;     /* rank 0's RUN_DIR/metrics.jsonl (worker/metrics_sink.h) */
    int64_t tensorboard_bytes; /* the event files of RUN_DIR/tb/ together (worker/tb_events.h) */
} ddp_spec_t;

/* Fills spec with every default (no data, gpt2-tiny model). */
void ddp_spec_defaults(ddp_spec_t *spec);

/* Parses and validates a spec from a buffer (YAML or JSON, detected). `origin` names it in
 * errors (a path or "<inline>"). Returns 0, or DDP_ESPEC with ei filled. */
int ddp_spec_parse(ddp_spec_t *spec, const char *text, size_t len, const char *origin,
                   ddp_errinfo_t *ei);
/* Reads and parses a spec file. Relative data/checkpoint paths stay relative to the caller's
 * working directory. Returns 0, -errno for an unreadable file, or DDP_ESPEC. */
int ddp_spec_load(ddp_spec_t *spec, const char *path, ddp_errinfo_t *ei);

/* A size in bytes: "<number>[ ]<unit>" with unit B, kB/KB (10^3), KiB/k/K, MB, MiB/M, GB,
 * GiB/G, TB, TiB/T, or none (bytes): "8GiB", "1.5 GB", "123456". Returns 0 with *out, or
 * DDP_EINVAL. */
int ddp_spec_parse_bytes(const char *text, int64_t *out);

/* 1 when s is a valid job name, else 0: 1 to 127 bytes (it fits ddp_spec_t's name) of ASCII
 * letters, digits, '-', '_' and '.', not starting with '-' or '.', so that it can name a file or
 * directory (never "." or "..", never a path) and never reads as a command-line option. The spec's
 * `name` is checked with it, and so are the daemons' node names. s NULL: 0. Pure; any thread.
 * Inline: the peer protocol's parser (and its fuzz harness) use it without the spec parser. */
static inline int ddp_spec_name_ok(const char *s)
{
    if (!s || *s == '-' || *s == '.') return 0;
    size_t n = 0;
    for (; s[n] && n < sizeof((ddp_spec_t *)0)->name; n++) /* stops at 128: too long */
        if (!((s[n] >= 'a' && s[n] <= 'z') || (s[n] >= 'A' && s[n] <= 'Z') ||
              (s[n] >= '0' && s[n] <= '9') || s[n] == '-' || s[n] == '_' || s[n] == '.'))
            return 0;
    return n > 0 && n < sizeof((ddp_spec_t *)0)->name;
}

/* Model dimensions of a named preset; DDP_ENOTFOUND for an unknown name.
 * gpt2-tiny, gpt2-mini, gpt2-124M, gpt2-355M, gpt2-774M, gpt2-1558M. */
int ddp_spec_preset(const char *name, ddp_model_cfg_t *out);

/* A spec that is valid but whose settings do less than they seem to: writes one sentence to
 * buf (always NUL-terminated) and returns 1, else returns 0 (buf ""). Today: ddp.min_workers
 * below ddp.workers with ddp.restart: never, where a rank's death ends the job (min_workers
 * counts only for restart: on-failure). Any thread. */
int ddp_spec_warning(const ddp_spec_t *s, char *buf, size_t len);

/* Formats a spec error for a person, compiler-style: "job.yaml:4:7: train.lr: must be ...".
 * `origin` is the file (or "<inline>"); parts that are unknown are left out. Returns buf. */
const char *ddp_spec_errstr(const ddp_errinfo_t *ei, const char *origin, char *buf, size_t len);

/* Serialises spec as a JSON object (for trainer.json and the daemon); caller frees. */
char *ddp_spec_to_json(const ddp_spec_t *spec);

/* Writes the reference of every spec field as Markdown (docs/spec.md) to out: per section a
 * table of field, type, default, allowed values and meaning, then the presets, the rules
 * between fields and how values are read; generated from the field table, and the same bytes on
 * every machine. Returns 0, DDP_EINVAL when a field of the table lacks its doc string (nothing is
 * written), or DDP_EIO when writing to out failed. Any thread. */
int ddp_spec_reference(FILE *out);

#endif
