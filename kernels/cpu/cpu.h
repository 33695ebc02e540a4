/* Internals of the CPU kernel backend: the context, the thread pool and the ops' prototypes.
 *
 * Invariants
 * - One context owns one pool of `threads` compute threads (the calling thread plus
 *   threads - 1 workers). Every op, BLAS included, runs its work as tasks on that pool;
 *   OpenBLAS itself is held at one thread, so nothing else computes and nothing spins.
 * - Work is cut into tasks by the shapes alone (fixed block sizes), never by the thread count,
 *   and every output element is computed by exactly one task in a fixed order: results are
 *   bitwise identical whatever `threads` is.
 * - Ops are synchronous: when one returns its outputs are written.
 * - Activation tensors (ddp_act_t) hold ctx->prec's type (kernels.h). Every op has one math
 *   path, in fp32: in fp32 mode it reads and writes the tensors in place; in bf16/fp16 mode it
 *   widens (exactly) the slice a task needs into that thread's scratch, runs the same code on
 *   it and rounds each 16-bit output once as it stores it (ddp__cpu_act_in/out/store). A 16-bit
 *   result is therefore bitwise the fp32 op's on the widened inputs, rounded, except
 *   attention's, which rounds P and dS before their products as FlashAttention does
 *   (attention.c).
 * Only the .c files of kernels/cpu include this header.
 */
#ifndef DDP_KERNELS_CPU_CPU_H
#define DDP_KERNELS_CPU_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "common/vector_isa.h"
#include "kernels/kernels.h"

/* Elements per task in the element-wise ops (a fixed size keeps results thread-independent). */
#define DDP__CPU_CHUNK 32768

/* ---- thread pool (pool.c) ---- */

typedef struct ddp__pool ddp__pool_t;
/* Runs task `task` (0 <= task < ntasks) of one parallel call. */
typedef void (*ddp__task_fn)(void *arg, long task);

/* Starts a pool of `threads` compute threads (>= 1; the caller of ddp__pool_run counts as one,
 * so threads - 1 workers are created). Returns 0, DDP_ENOMEM or -errno. */
int ddp__pool_new(ddp__pool_t **out, int threads);
/* Stops and joins the workers and frees the pool. NULL-safe. */
void ddp__pool_free(ddp__pool_t *pool);
/* Runs fn(arg, 0..ntasks-1) on the pool and returns when all tasks are done. The calling thread
 * takes tasks too. One caller at a time per pool (a context is used by one thread). */
void ddp__pool_run(ddp__pool_t *pool, long ntasks, ddp__task_fn fn, void *arg);
/* The pool's number of compute threads. */
int ddp__pool_threads(const ddp__pool_t *pool);
/* The calling thread's index in its pool: 1 .. threads - 1 for a worker, 0 for any other
 * thread (the one that calls ddp__pool_run). For per-thread state of a task. */
int ddp__pool_self(void);

/* ---- native bf16 products (bf16_gemm.c, oneDNN) ---- */

typedef struct ddp__bf16 ddp__bf16_t;
/* 1 when this build and CPU multiply bf16 natively, else 0; *why: a one-line static reason. */
int ddp__bf16_probe(const char **why);
/* A native bf16 product engine for a pool of `threads` threads. DDP_ENOTSUP where the probe
 * says no, DDP_ENOMEM, or the library's failure mapped. */
int ddp__bf16_new(ddp__bf16_t **out, int threads);
void ddp__bf16_free(ddp__bf16_t *b); /* NULL-safe */
/* One tile on the calling thread (a task of the pool that b was made for, or its caller):
 * C[m,n] = (accumulate ? C : 0) + op(A)[m,k] @ op(B)[k,n], row-major; op(A) = A[m,k] (lda) or,
 * with ta, A stored [k,m]; op(B) likewise [k,n] or, with tb, [n,k]. bf16 inputs (bits),
 * fp32 accumulation and C. Depends on the arguments only (not on the thread). A failure is kept
 * for ddp__bf16_take_error; C is then undefined. Threads may call it concurrently. */
void ddp__bf16_gemm(ddp__bf16_t *b, int ta, int tb, int m, int n, int k, const uint16_t *A,
                    int lda, const uint16_t *B, int ldb, int accumulate, float *C, int ldc);
/* The first failure of a tile since the last call (0: none), cleared. */
int ddp__bf16_take_error(ddp__bf16_t *b);
/* Between products (no tile running): empties the primitive cache once it holds more than a
 * few hundred shapes (each keeps its JIT code); they are made again when used. */
void ddp__bf16_trim(ddp__bf16_t *b);
/* An op's tasks that may run tiles of b (NULL: none) on ctx's pool: b trimmed before, a tile's
 * failure moved to ctx->err after (the products' and attention's one way to run). */
void ddp__bf16_run(ddp_kctx_t *ctx, ddp__bf16_t *b, long ntasks, ddp__task_fn fn, void *arg);

/* ---- the context ---- */

struct ddp_kctx {
    ddp__pool_t *pool;
    int threads;
    int err; /* first error of an op since the last sync (ops return nothing) */
    float *scratch; /* op scratch (matmul's split-K partial sums), grown on demand */
    size_t scratch_bytes;
    ddp_kprec_t prec;              /* the activation type (set_precision, lowp.c) */
    float *wide_in[2];             /* emulated products: this call's widened inputs (lowp.c) */
    size_t wide_in_bytes[2];       /* their capacities */
    struct ddp__wcopy *wcopies;    /* converted weights: the arena's, or one per pointer (lowp.c) */
    int n_wcopies, cap_wcopies;
    const float *arena;            /* set_weights' arena, n elements; NULL: none */
    size_t arena_n;
    ddp__bf16_t *bf16;             /* native bf16 products (bf16_gemm.c); NULL: emulated */
    int bf16_failed;               /* the native engine failed to start: emulate */
    struct ddp__cpu_resv *resv;    /* the sparse arenas reserved and not freed (backend.c) */
};

/* 1 when the products of the current precision run natively on bf16 (lowp.c's copies are then
 * bf16 bits, uint16_t), 0 when they run on sgemm (the copies are rounded floats). */
static inline int ddp__cpu_native(const ddp_kctx_t *ctx)
{
    return ctx->prec == DDP_KPREC_BF16 && ctx->bf16;
}

/* A scratch buffer of at least `bytes` owned by ctx (valid until the next call or close), or
 * NULL when it cannot be grown. Only the thread that calls the ops may call it. */
float *ddp__cpu_scratch(ddp_kctx_t *ctx, size_t bytes);

/* Per-thread scratch of one op: `per` floats for each pool thread (64-byte aligned slices). */
typedef struct {
    float *base;
    size_t per;
} ddp__tscratch_t;

/* Sets *s to `per` floats for each of ctx's threads, in ctx's scratch (so valid until the next
 * scratch request). 0, or DDP_ENOMEM (also kept in ctx->err). Only the ops' calling thread. */
int ddp__cpu_tscratch(ddp_kctx_t *ctx, ddp__tscratch_t *s, size_t per);
/* The calling pool thread's slice of s. */
static inline float *ddp__tscratch_mine(const ddp__tscratch_t *s)
{
    return s->base + (size_t)ddp__pool_self() * s->per;
}

/* Number of tasks of `chunk` elements that cover n. */
static inline long ddp__ntasks(size_t n, size_t chunk) { return (long)((n + chunk - 1) / chunk); }

/* ---- activation tensors and mixed precision (lowp.c) ---- */

/* Elements [i0, i0 + n) of activation tensor x as fp32: x's own memory in fp32 mode (no copy),
 * else widened (exactly) into tmp[0..n). */
DDP_VECTOR_INLINE const float *ddp__cpu_act_in(const ddp_act_t *x, size_t i0, size_t n,
                                               ddp_kprec_t prec, float *tmp)
{
    if (prec == DDP_KPREC_FP32) return (const float *)x + i0;
    ddp_act_to_f32(tmp, ddp_act_at(x, i0, prec), n, prec);
    return tmp;
}

/* Where an op computes elements [i0, ...) of activation tensor x in fp32 before
 * ddp__cpu_act_store: x's own memory in fp32 mode, else tmp. */
DDP_VECTOR_INLINE float *ddp__cpu_act_out(ddp_act_t *x, size_t i0, ddp_kprec_t prec, float *tmp)
{
    return prec == DDP_KPREC_FP32 ? (float *)x + i0 : tmp;
}

/* Elements [i0, i0 + n) of activation tensor x = src[0..n), each rounded once to prec (nothing
 * to do when src is already x's memory, fp32 mode's ddp__cpu_act_out). */
void ddp__cpu_act_store(ddp_act_t *x, size_t i0, const float *src, size_t n, ddp_kprec_t prec);
/* The residual add of residual_fwd and residual_norm_fwd: out[i0, i0 + n) = a + b over those
 * elements (fp32 a, out; b an activation tensor of type prec, widened into tmp[0..n) unless
 * fp32). out may alias a: each element is read before it is written. */
DDP_VECTOR_INLINE void ddp__cpu_residual(float *out, const float *a, const ddp_act_t *b, size_t i0,
                                         size_t n, ddp_kprec_t prec, float *tmp)
{
    const float *bw = ddp__cpu_act_in(b, i0, n, prec, tmp);
    for (size_t i = 0; i < n; i++) out[i0 + i] = a[i0 + i] + bw[i];
}

/* Activation tensor x[0..n) widened to fp32 for the emulated products (ddp__cpu_native is 0)
 * into slot `slot` (0 or 1) of ctx, valid until the next call with that slot; NULL (ctx->err
 * set) when it cannot be allocated. */
const float *ddp__cpu_widen_input(ddp_kctx_t *ctx, int slot, const ddp_act_t *x, size_t n);
/* Weight w[0..n) converted likewise: a slice of the arena's copy when set_weights' arena holds
 * it, else a copy kept per pointer, until the next set_precision. NULL (ctx->err set) when it
 * cannot be allocated. */
const void *ddp__cpu_lowp_weight(ddp_kctx_t *ctx, const float *w, size_t n);
/* The arena's copy when param is set_weights' arena and its copy is current (adamw then keeps
 * it so with ddp__cpu_lowp_round), else NULL. */
void *ddp__cpu_lowp_kept(ddp_kctx_t *ctx, const float *param);
/* copy's elements [i0, i0 + n) = x[0..n) converted as the products' weights are (bf16 bits or
 * rounded floats, by ctx's precision). Any thread. */
void ddp__cpu_lowp_round(const ddp_kctx_t *ctx, void *copy, size_t i0, const float *x, size_t n);
/* Frees the weight copies and the input slots (close). */
void ddp__cpu_lowp_free(ddp_kctx_t *ctx);
int ddp__cpu_prec_native(ddp_kctx_t *ctx, ddp_kprec_t prec, const char **why);

/* ---- ops: ddp__cpu_<op> for every op of kernels.h's DDP_KERNEL_OPS, one file per family
 * (encoder.c, norm.c, matmul.c, attention.c, rope.c, pointwise.c, swiglu.c, xent.c, vector.c;
 * set_precision in lowp.c) ---- */
#define DDP__CPU_OP(name, params) void ddp__cpu_##name DDP_KOP_CTX_PARAMS params;
DDP_KERNEL_OPS(DDP__CPU_OP)
#undef DDP__CPU_OP

#endif
