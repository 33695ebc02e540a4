/* The memory budget of one rank: what a job's spec will allocate, before anything is allocated.
 *
 * Every rank prints it at start (ddp_trainer_init) and a job that cannot fit train.memory_limit
 * fails there, before step 1, naming what to change and by how much each change helps;
 * `ddpctl plan SPEC` prints the same estimate without running. The figures follow the
 * allocations of the trainer (worker/setup.c, sync/emb_slots.c), the model (model/model.c,
 * model_layout.c: the activation count is the model's own), the optimizer (optim/adamw.c,
 * optim/zero1.c), the CPU kernels' scratch (kernels/cpu/matmul.c), the collectives' memory
 * (collectives/shm_direct.c) and the checkpoint saver (saving/saving.c,
 * checkpoint/checkpoint.c), plus a measured constant for the process itself
 * (code, libraries, thread stacks, BLAS buffers). What it predicts is the peak resident set
 * (VmHWM; ru_maxrss too where the process was not forked from a larger one): shared memory
 * counts on a rank once that rank has touched its pages. Pure functions of their arguments:
 * any thread; links without the kernels' ops.
 */
#ifndef DDP_WORKER_BUDGET_MEMORY_BUDGET_H
#define DDP_WORKER_BUDGET_MEMORY_BUDGET_H

#include <stddef.h>
#include <stdint.h>

#include "proto/spec.h"

/* One rank's estimate, in bytes. Ranks differ: a rank that writes checkpoint shards holds a
 * snapshot that the others do not. */
typedef struct ddp_mem_budget {
    /* what it assumes */
    int world;      /* ranks */
    int rank;       /* the rank it is for */
    int writer;     /* this rank writes checkpoint shards (rank < checkpoint.writers) */
    int shared;     /* the ranks share one host's memory: each maps the others' arenas (all
                     * ranks local; a ring forced onto TCP, DDP_COLL_TRANSPORT=tcp, keeps its
                     * memory private, which a plan cannot see: it then over-counts) */
    int accum;      /* micro-steps per optimizer step on this rank */
    int n_micro;    /* micro-batches per step over all ranks */
    int B, T;       /* micro-batch */
    int on_gpu;     /* device memory (CUDA) rather than host memory */
    int act_bytes;  /* bytes of an activation element: 4 in fp32, 2 in bf16/fp16 runs */
    int lowp_bytes; /* bytes of an element of a matrix weight's converted copy: 0 in fp32, 2
                     * for bf16/fp16 on a GPU or native bf16 on a CPU, 4 when the CPU emulates
                     * (which also widens the products' 16-bit inputs to fp32) */
    int zero1;      /* ZeRO-1: the moments split over the ranks (shard_optimizer, world > 1) */
    int flash;   /* a GPU's attention runs the flash kernels (no [B,NH,T,T] scratch) */
    int threads; /* the CPU kernels' threads (train.threads, else cores / local ranks) */
    ddp_recompute_t recompute;
    /* what it counts */
    int64_t n_params;              /* floats of one arena */
    int64_t params, grads;         /* the parameter and gradient arenas */
    int64_t moments;               /* AdamW's m and v: this rank's share (÷ world under ZeRO-1) */
    int64_t accum_buf;             /* the sum of earlier micro-steps' gradients (accum > 1) */
    int64_t emb;                   /* the token embedding's gradient slots (sync/emb_slots.c) */
    int64_t acts;                  /* activations at B x T under `recompute` */
    int64_t acts_none, acts_block; /* activations at B x T without and with recomputation */
    int64_t workspace;             /* kernels' scratch, host staging, the ring's slots */
    int64_t peers;                 /* the other ranks' shared arenas that this rank reads and writes
                                    * (shared: the all-reduce's and all-gather's slices) */
    int64_t checkpoint;            /* a save: ZeRO-1's moments gathered whole, and on a writing
                                    * rank its snapshot of the state (host; CPU) */
    int64_t runtime;               /* the process itself (host) or the CUDA context (device) */
    int64_t extra;                 /* the caller's own (see ddp_mem_budget_plan), in workspace */
    int64_t total;
    int64_t limit;       /* train.memory_limit, or the device's */
    char limit_from[48]; /* where limit came from: "train.memory_limit", "RAM", ... */
    int max_B;           /* the largest micro_batch that fits at T (0: none does) */
    int max_B_block;     /* the same with train.recompute: block */
} ddp_mem_budget_t;

/* Where a rank computes, for ddp_mem_budget_plan's `where`. */
enum {
    DDP_MEM_CPU = 0,      /* the CPU backend, bf16 emulated (auto: fp32) */
    DDP_MEM_GPU = 1,      /* a GPU */
    DDP_MEM_CPU_BF16 = 2, /* the CPU backend on a CPU that multiplies bf16 natively (auto: bf16;
                           * the oneDNN runtime is loaded) */
};

/* Estimates the memory of rank `rank` for spec s at `world` ranks, `local` of them on this host
 * (the host's memory is shared by them), on a GPU with device_bytes of memory (where ==
 * DDP_MEM_GPU) or on the CPU. The ranks below checkpoint.writers need the most (their snapshot).
 * extra: bytes the caller will also hold, counted as workspace (the worker's host copy of the
 * parameters for --dump-weights on the CPU). limit: s->memory_limit when set, else device_bytes on
 * a GPU, else this host's cgroup limit or RAM divided by `local`. Returns 0, or DDP_EINVAL for a
 * spec without a model. */
int ddp_mem_budget_plan(const ddp_spec_t *s, int world, int local, int rank, int where,
                        int64_t device_bytes, int64_t extra, ddp_mem_budget_t *b);

/* The budget as lines of text for a person ("memory budget of rank 0 (...):\n  parameters ..."),
 * into buf (always NUL-terminated). Returns buf. */
const char *ddp_mem_budget_format(const ddp_mem_budget_t *b, char *buf, size_t len);

/* Whether the budget fits its limit (1) or not (0). When not, buf gets one paragraph that says
 * by how much it is over and what would help, each with its saving: a smaller micro_batch with
 * more accumulation, train.recompute: block, train.precision, ddp.shard_optimizer. */
int ddp_mem_budget_fits(const ddp_mem_budget_t *b, const ddp_spec_t *s, char *buf, size_t len);

/* This host's memory available to one process tree: the cgroup's memory.max when set, else
 * the RAM; *from says which ("cgroup", "RAM"). */
int64_t ddp_mem_host_limit(const char **from);

/* The CPU kernels' threads per rank when train.threads is 0: this host's cores divided among
 * its `local` ranks, at least 1. Any thread. */
int ddp_mem_threads(int local);

/* "1.50 GiB", "37.2 MiB", "512 B" into buf. Returns buf. */
const char *ddp_mem_fmt(int64_t bytes, char *buf, size_t len);

#endif
