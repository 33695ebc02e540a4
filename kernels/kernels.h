/* The kernel backend interface: memory, streams and every op of the GPT-2 and Llama models,
 * forward and backward.
 *
 * One const ddp_kernels_ops_t per backend (kernels/cpu/backend.c, kernels/cuda/backend.cu, and
 * the test-only simulated GPU tests/sim/kernels_sim.c, opened only by its name "sim").
 * The CPU backend is linked into every binary; the CUDA backend is a shared module
 * (ddp_kernels_cuda.so) that ddp_kernels_open() dlopen()s, so one binary runs with and without a
 * GPU; the sim is a module too (ddp_kernels_sim.so), built for the tests and never installed.
 * Callers go through ddp_kernels_open/close and the front door below: one wrapper per member,
 * ddp_k_<member>(k, ...), that accepts an unopened k, checks the arguments and keeps the first
 * error for ddp_k_sync(); no caller touches `ops` or asks which backend it has (the table's
 * capability fields say what differs).
 *
 * Conventions for every op
 * - All pointers are device pointers of the backend (host memory for CPU).
 * - Tensors carry a dtype, by role: `float *` is always fp32; `ddp_act_t *` is an ACTIVATION
 *   tensor, whose elements are of the context's activation type (set_precision): fp32 in fp32
 *   runs, bf16 or fp16 in bf16/fp16 runs (autocast's numerics). 16-bit are the outputs of
 *   the norms, the products, attention, RoPE, GELU, SwiGLU, the logits, and the gradients of
 *   all of these. fp32 always: the residual stream and its gradient (a long sum of small
 *   updates, which 16 bits would round away), the norms' statistics, RoPE's table and
 *   attention's log-sum-exps (reused
 *   by backward, where an error would be amplified), the weights, their gradients and the
 *   optimizer's moments, the losses. Ops compute in fp32 and round once, on store.
 * - Shapes are row-major; B = batch, T = sequence, C = channels, NH = heads, V = vocab,
 *   N = rows (B*T). Comments give each tensor's shape.
 * - Forward ops overwrite their outputs. Backward ops OVERWRITE activation gradients (dinp of a
 *   product, GELU and attention: beta 0, no zeroing needed) and ACCUMULATE (+=) into fp32
 *   gradients: the residual stream's (LayerNorm's dinp) and the parameters' (dweight, dbias,
 *   the embeddings'), so a tensor used twice (the tied wte) sums both uses; the caller zeroes
 *   the gradient arena before each micro-step's backward.
 * - Ops are asynchronous on a GPU (queued on the context's compute stream) and synchronous on the
 *   CPU; ddp_k_sync() waits and returns the first error. Ops themselves return nothing.
 * - Linear layers store their weight as Hugging Face's Conv1D does, [in, out]; the tied LM head
 *   uses wte as [V, C], i.e. [out, in]: matmul takes the layout as a flag.
 * - Each backend decides its own threading: the CPU runs every op on one pool of
 *   `threads` workers that sleep (never spin) when idle.
 */
#ifndef DDP_KERNELS_KERNELS_H
#define DDP_KERNELS_KERNELS_H

#include <stddef.h>
#include <stdint.h>

typedef struct ddp_kctx ddp_kctx_t; /* a backend's context: device, streams, handles, pool */

/* Elements per CRC32C of the adamw op's optional checksums. */
#define DDP_ADAMW_CRC_CHUNK ((size_t)32768)

/* A run's precision (ddp_kernels_ops_t.set_precision): the type of activation tensors and of
 * the matrix products' inputs. The values are proto/spec.h's ddp_precision_t's. */
typedef enum {
    DDP_KPREC_FP32 = 0, /* fp32 activations and products */
    DDP_KPREC_BF16 = 1, /* bf16 activations (bits: an fp32's top half, rounded to nearest even);
                         * products of bf16 with fp32 accumulation */
    DDP_KPREC_FP16 = 2, /* IEEE fp16 activations (|x| >= 65520 becomes Inf: an overflow shows);
                         * products of fp16 with fp32 accumulation */
} ddp_kprec_t;

/* An activation tensor (see the conventions above): `n` elements of ddp_act_bytes(prec) each.
 * Incomplete on purpose, so that an fp32 tensor is not passed where an activation is expected
 * (or the reverse) without a cast; index it with ddp_act_at. */
typedef struct ddp_act ddp_act_t;

/* Bytes per activation element under prec: 4 (fp32) or 2. */
static inline size_t ddp_act_bytes(ddp_kprec_t prec) { return prec == DDP_KPREC_FP32 ? 4 : 2; }

/* Element i of activation tensor base under prec. */
static inline ddp_act_t *ddp_act_at(const ddp_act_t *base, size_t i, ddp_kprec_t prec)
{
    return (ddp_act_t *)((char *)base + i * ddp_act_bytes(prec));
}

/* n activation elements of type prec in host memory, widened to fp32 (exactly) into dst. */
void ddp_act_to_f32(float *dst, const void *src, size_t n, ddp_kprec_t prec);
/* n fp32 values src as activation elements of type prec into dst (host memory), each rounded
 * once to nearest even (fp16: 65520 and up become Inf); dst may be src in fp32. */
void ddp_act_from_f32(void *dst, const float *src, size_t n, ddp_kprec_t prec);

/* A range [lo, hi) of elements of an arena, whose results go to index `out` on (sumsq_blocks). */
typedef struct ddp_krange {
    size_t lo, hi, out;
} ddp_krange_t;

/* A range [lo, hi) of elements that AdamW updates with weight decay wd (adamw). */
typedef struct ddp_kadamw_range {
    size_t lo, hi;
    float wd;
} ddp_kadamw_range_t;

/* The row stride of the LM head's logits (matmul_fwd/bwd's ldo, xent_fwd_bwd's ld): V rounded
 * up to a multiple of 128 elements (GPT-2's 50,257 -> 50,304), so that every row of 16-bit
 * logits starts 256 bytes aligned and the GPU's products read and write them with the tensor
 * cores' aligned loads (a stride of 50,257 elements leaves rows 2-byte aligned). The weights,
 * their gradients and checkpoints keep V rows; only the logits' rows are padded, and no op
 * touches the padding. */
static inline int ddp_logits_ld(int V) { return (V + 127) / 128 * 128; }

typedef enum {
    DDP_W_IN_OUT = 0, /* weight[C][OC]: out = inp @ W    (HF Conv1D) */
    DDP_W_OUT_IN = 1, /* weight[OC][C]: out = inp @ W^T  (tied LM head: wte) */
} ddp_wlayout_t;

/* Every op of a backend, written once: X(name, (its parameters after the context)). From this
 * list follow the ops table's members (void (*name)(ddp_kctx_t *ctx, ...)), the front door's
 * wrappers ddp_k_<name>(ddp_kernels_t *k, ...), each backend's declarations (cpu.h: ddp__cpu_<name>,
 * kcuda.cuh: ddp__cuda_<name>, the sim's sim_<name>) and the profiler's op list. The members
 * that return a value (memory, copies, sync, marks, prec_native) are written out in the table. */
#define DDP_KERNEL_OPS(X)                                                                       \
    /* out[B,T,C] = wte[inp[b,t]] + wpe[t] (wpe NULL: no positions).  inp[B,T] token ids < V. */ \
    X(encoder_fwd, (float *out, const int32_t *inp, const float *wte, const float *wpe,         \
          int B, int T, int C))                                                                 \
    /* dwte[V,C] += scatter(dout), dwpe[T,C] += sum_b dout. Either output may be NULL: that     \
     * part is skipped (the trainer adds the embedding's share of dwte after the all-reduce). */\
    X(encoder_bwd, (float *dwte, float *dwpe, const float *dout, const int32_t *inp, int B,     \
          int T, int C))                                                                        \
    /* out[N,C] = (inp - mean) * rstd * weight + bias; saves mean[N], rstd[N]. eps = 1e-5.      \
     * inp is the residual stream (fp32); out feeds a product. */                               \
    X(layernorm_fwd, (ddp_act_t *out, float *mean, float *rstd, const float *inp,               \
          const float *weight, const float *bias, int N, int C))                                \
    /* dinp[N,C] += the gradient through the norm of dout (the residual stream's gradient);     \
     * dweight, dbias += theirs. dinp_act: NULL, or [N,C] = the new dinp rounded to the         \
     * activation type, bitwise to_act's, written in the same pass (the stream's gradient as   \
     * the next block's projection reads it; requires dinp). */                                \
    X(layernorm_bwd, (float *dinp, ddp_act_t *dinp_act, float *dweight, float *dbias,           \
          const ddp_act_t *dout, const float *inp, const float *weight, const float *mean,      \
          const float *rstd, int N, int C))                                                     \
    /* Mixed precision (autocast's rules): from this call on, activation tensors are of type    \
     * `prec` (the conventions above) and the products multiply `prec` inputs (the activations  \
     * and the weights rounded to prec) with fp32 accumulation; every op computes in fp32 and   \
     * rounds its 16-bit outputs once. A backend may keep a converted copy of each weight and   \
     * bias it has used: the copy is dropped by the next set_precision call, so the caller      \
     * calls it again after every write to the weights that adamw does not keep (a load, a      \
     * collective, an update of weights outside set_weights' arena) -- one conversion per       \
     * weight per write, not per product. Activations written under one precision are not       \
     * readable under another: a caller sets it before allocating them and keeps it.            \
     * Queued like an op on a GPU. Context starts at DDP_KPREC_FP32; with FP32 results are      \
     * bitwise those of a context that never had it called. */                                  \
    X(set_precision, (ddp_kprec_t prec))                                                        \
    /* The parameter arena: the weights and biases the products read lie in w[0, n) (NULL:     \
     * none declared). In 16-bit runs a backend keeps one converted copy of the whole arena     \
     * (converted in one pass when a product first needs it after set_precision) instead of one \
     * per weight, and adamw with param == w writes the copy of every element it updates, in   \
     * the same pass (autocast's weight cast fused into the optimizer): after an update of the  \
     * arena no set_precision is needed. Drops the copies held so far; results are bitwise     \
     * those of per-weight copies. Queued like an op on a GPU. */                               \
    X(set_weights, (const float *w, size_t n))                                                  \
    /* out[N,OC] = inp[N,C] @ W + bias[OC] (bias may be NULL), the bias added in fp32 before    \
     * the one rounding; in 16-bit runs the bias is first rounded to prec, as the weights are   \
     * (autocast's addmm). ldo >= OC: out's row stride in elements (OC, or the LM head's        \
     * ddp_logits_ld(V)); the elements of a row past OC are neither read nor written. */        \
    X(matmul_fwd, (ddp_act_t *out, const ddp_act_t *inp, const float *weight,                   \
          const float *bias, int N, int C, int OC, int ldo, ddp_wlayout_t layout))              \
    /* dinp[N,C] = dout @ W^T (overwritten); dweight += (layout's orientation of) inp^T @ dout; \
     * dbias[OC] += colsum(dout). dinp or dbias may be NULL (not needed). ldo >= OC: dout's row \
     * stride, as matmul_fwd's out. */                                                          \
    X(matmul_bwd, (ddp_act_t *dinp, float *dweight, float *dbias, const ddp_act_t *dout,        \
          const ddp_act_t *inp, const float *weight, int N, int C, int OC, int ldo,             \
          ddp_wlayout_t layout))                                                                \
    /* GPT-2's MLP up-projection and its GELU in one product: pre[N,OC] = inp @ W + bias, as    \
     * matmul_fwd writes it (rows OC apart), and out[N,OC] = gelu of the same fp32 sum, taken   \
     * before pre's rounding; in 16-bit runs each is rounded once (a GPU's cuBLASLt             \
     * GELU_AUX_BIAS epilogue). fp32: matmul_fwd into pre, then gelu_fwd. */                     \
    X(matmul_gelu_fwd, (ddp_act_t *out, ddp_act_t *pre, const ddp_act_t *inp,                   \
          const float *weight, const float *bias, int N, int C, int OC, ddp_wlayout_t layout))  \
    /* matmul_bwd of the product that reads matmul_gelu_fwd's out (inp), its input gradient     \
     * taken on through the GELU: dpre[N,C] = (dout @ W^T) * gelu'(pre), the product's fp32     \
     * sum times gelu'(pre) rounded once (cuBLASLt's DGELU epilogue); dweight, dbias as         \
     * matmul_bwd's (dbias may be NULL). Rows OC apart. fp32: matmul_bwd, then gelu_bwd. */      \
    X(matmul_dgelu_bwd, (ddp_act_t *dpre, float *dweight, float *dbias, const ddp_act_t *dout,  \
          const ddp_act_t *inp, const ddp_act_t *pre, const float *weight, int N, int C,        \
          int OC, ddp_wlayout_t layout))                                                        \
    /* Causal multi-head self-attention, flash-attention style: no [T,T] tensor outlives the op.\
     * Grouped-query: NH query heads share NKV key/value heads (NH % NKV == 0; NKV == NH is     \
     * plain multi-head attention), query head h reading K/V head h / (NH / NKV), as Hugging    \
     * Face's repeat_kv. qkv[B,T,QKV] with QKV = C + 2 NKV hs, hs = C / NH, holds per position  \
     * q [NH,hs], then k [NKV,hs], then v [NKV,hs]; out[B,T,C]; scale 1/sqrt(hs).               \
     * lse[B,NH,T] saves each row's log-sum-exp (natural log) of its scaled scores over the     \
     * positions t2 <= t: with qkv and out, all that backward needs. */                         \
    X(attention_fwd, (ddp_act_t *out, float *lse, const ddp_act_t *qkv, int B, int T,           \
          int C, int NH, int NKV))                                                              \
    /* dqkv[B,T,QKV] = the gradient through attention of dout[B,T,C] (overwritten), from        \
     * forward's qkv, out and lse (the probabilities are recomputed from them). A K/V head's    \
     * gradient sums its group's query heads in a fixed order (h ascending): deterministic. */   \
    X(attention_bwd, (ddp_act_t *dqkv, const ddp_act_t *dout, const ddp_act_t *qkv,             \
          const ddp_act_t *out, const float *lse, int B, int T, int C, int NH, int NKV))        \
    /* Rotary position embedding (Llama; Hugging Face's rotate_half pairing), in place on the   \
     * NH query and NKV key heads of qkv[B,T,(NH + 2 NKV) hs] (v untouched): at position t, for \
     * i < hs/2, with c = rope[t,i,0], s = rope[t,i,1] ([T, hs/2, 2] fp32, the model's table of \
     * cos and sin), (x[i], x[i + hs/2]) becomes (x[i] c - x[i + hs/2] s, x[i + hs/2] c +      \
     * x[i] s). hs even. */                                                                     \
    X(rope_fwd, (ddp_act_t *qkv, const float *rope, int B, int T, int NH, int NKV, int hs))     \
    /* The gradient through rope_fwd, in place on dqkv[B,T,(NH + 2 NKV) hs]: the inverse        \
     * rotation (s negated) of the q and k heads' gradients; v's untouched. */                  \
    X(rope_bwd, (ddp_act_t *dqkv, const float *rope, int B, int T, int NH, int NKV, int hs))    \
    /* RMSNorm (Llama): out[N,C] = inp * rstd * weight, saving rstd[N] = 1 / sqrt(mean(inp^2) + \
     * eps). inp is the residual stream (fp32); out feeds a product. */                         \
    X(rmsnorm_fwd, (ddp_act_t *out, float *rstd, const float *inp, const float *weight, int N,  \
          int C, float eps))                                                                    \
    /* dinp[N,C] += the gradient through the norm of dout (the residual stream's gradient);     \
     * dweight += its; dinp_act as layernorm_bwd's. */                                          \
    X(rmsnorm_bwd, (float *dinp, ddp_act_t *dinp_act, float *dweight, const ddp_act_t *dout,    \
          const float *inp, const float *weight, const float *rstd, int N, int C))              \
    /* SwiGLU (Llama's MLP): out[N,H] = silu(g) * u with g = inp[n, 0:H] (the gate product)     \
     * and u = inp[n, H:2H] (the up product), inp[N,2H]; silu(g) = g / (1 + exp(-g)). */        \
    X(swiglu_fwd, (ddp_act_t *out, const ddp_act_t *inp, int N, int H))                         \
    /* dinp[N,2H] = the gradient through swiglu_fwd of dout[N,H] (overwritten; dinp may not     \
     * alias inp). */                                                                           \
    X(swiglu_bwd, (ddp_act_t *dinp, const ddp_act_t *inp, const ddp_act_t *dout, int N, int H)) \
    /* out[n] = gelu_tanh(inp[n]); dinp[n] = gelu_tanh'(inp[n]) * dout[n] (overwritten; dinp    \
     * may alias dout). */                                                                      \
    X(gelu_fwd, (ddp_act_t *out, const ddp_act_t *inp, size_t n))                               \
    X(gelu_bwd, (ddp_act_t *dinp, const ddp_act_t *inp, const ddp_act_t *dout, size_t n))       \
    /* out[n] = a[n] + b[n]: a branch's output b added to the residual stream a (out may alias  \
     * a). */                                                                                   \
    X(residual_fwd, (float *out, const float *a, const ddp_act_t *b, size_t n))                 \
    /* The residual add fused with the norm that follows it, one pass over the rows:           \
     * res[N,C] = a + b (fp32, the residual stream; res may alias a, b a branch's output), then \
     * out[N,C] = the norm of res: mean == NULL selects RMSNorm (out = res * rstd * weight;     \
     * bias NULL), else LayerNorm (out = (res - mean) * rstd * weight + bias; saves mean[N]),   \
     * rstd[N] saved either way, eps as given (LayerNorm's layernorm_fwd uses 1e-5). Bitwise    \
     * residual_fwd then layernorm_fwd / rmsnorm_fwd on that res, on every backend. */         \
    X(residual_norm_fwd, (float *res, ddp_act_t *out, float *mean, float *rstd, const float *a, \
          const ddp_act_t *b, const float *weight, const float *bias, int N, int C, float eps)) \
    /* out[n] = inp[n] rounded to the activation type: the residual stream's gradient entering a\
     * product's backward (as autocast casts it). */                                            \
    X(to_act, (ddp_act_t *out, const float *inp, size_t n))                                     \
    /* Fused softmax + cross-entropy over logits[N,V], rows ld >= V elements apart (both       \
     * tensors; the elements past V are neither read nor written).                              \
     * losses[N] = -log softmax(logits)[target]; and when dlogits != NULL,                      \
     * dlogits[N,V] = (softmax(logits) - onehot(target)) * dloss (dlogits may alias logits:     \
     * the op then overwrites the logits). targets[N] < V. */                                   \
    X(xent_fwd_bwd, (float *losses, ddp_act_t *dlogits, const ddp_act_t *logits,                \
          const int32_t *targets, int N, int V, int ld, float dloss))                           \
    /* AdamW over ranges of the arenas in one call (one launch on a GPU), PyTorch's formulation \
     * with decoupled weight decay, for each element of each range r ([r.lo, r.hi) of param,    \
     * grad, m, v; ranges do not overlap):                                                      \
     * m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr (mhat/(sqrt(vhat)+eps) + r.wd p),    \
     * mhat = m/(1-b1^t), vhat = v/(1-b2^t); t >= 1. `grad_scale` multiplies g first            \
     * (averaging and clipping fused in). An element's result is the same whatever range holds  \
     * it. When param is set_weights' arena, the arena's 16-bit copy stays current (see there). \
     * crc: NULL, or (CPU backend only; others record DDP_ENOTSUP) for each range in order,     \
     * 3 x ceil((r.hi - r.lo) / DDP_ADAMW_CRC_CHUNK) entries: for chunk c of the range,         \
     * crc[3c], crc[3c + 1], crc[3c + 2] get the CRC32C (common/crc32c.h) of the bytes of param,\
     * m and v written for elements [r.lo + c x CHUNK, min(r.lo + (c + 1) x CHUNK, r.hi)), taken\
     * while they are still in cache, so a checkpoint of this update need not read them again. */\
    X(adamw, (float *param, const float *grad, float *m, float *v,                              \
          const ddp_kadamw_range_t *ranges, int nranges, float lr, float beta1,                 \
          float beta2, float eps, float grad_scale, int t, uint32_t *crc))                      \
    /* Vector helpers over the arenas. */                                                       \
    /* Sums of squares of consecutive blocks of several ranges of x (for the global gradient    \
     * norm: one pass and one wait for all the buckets): for range r and its j-th block,        \
     * out[r.out + j] = sum of x[i]^2 over [r.lo + j block, min(r.lo + (j + 1) block, r.hi)),   \
     * accumulated in double and rounded to float once; out is host memory. A block's result    \
     * depends only on its own elements (not on the ranges, the thread count or where the block \
     * lies), so a norm summed from blocks is the same however the buffer is split, e.g. over the\
     * ranks of a sharded step. Waits for the stream (a host result). */                        \
    X(sumsq_blocks, (float *out, const float *x, const ddp_krange_t *ranges, int nranges,       \
          size_t block))                                                                        \
    /* y[i] += x[i] */                                                                          \
    X(add, (float *y, const float *x, size_t n))                                                \
    /* x[i] *= s */                                                                             \
    X(scale, (float *x, float s, size_t n))                                                     \
    /* 1 if any x[i] is NaN or Inf (host out), else 0. */                                       \
    X(nonfinite, (int *out, const float *x, size_t n))

/* DDP_KERNEL_OPS' parameter lists with a leading context, or a leading opened backend. */
#define DDP_KOP_CTX_PARAMS(...) (ddp_kctx_t * ctx, __VA_ARGS__)
#define DDP_KOP_K_PARAMS(...) (ddp_kernels_t * k, __VA_ARGS__)
/* The ops table's member for one op. */
#define DDP_KOP_MEMBER(name, params) void(*name) DDP_KOP_CTX_PARAMS params;

typedef struct ddp_kernels_ops {
    const char *name; /* "cpu", "cuda", "sim" */
    /* The collectives backend that works on this backend's memory under ddp.backend "auto":
     * "ring" (host memory), "nccl" (CUDA device memory), "sim" (the simulated device). */
    const char *coll_backend;
    /* Capability: 1 when this backend's tensors are host memory that the host may read and write
     * directly (CPU): collective memory may back them, a checkpoint reads them in place. 0 for
     * device memory (CUDA, sim): only memcpy_* moves data in and out. */
    int host_memory;
    /* Capability: 1 when this backend's tensors live in a GPU's own memory (CUDA), which this
     * process's resident set and mincore() do not see and the memory budget plans apart; 0 when
     * they are pages of this process (CPU, and the sim's simulated device memory). */
    int gpu_memory;
    /* 0 = unusable here; higher wins. Cheap; no side effects beyond driver queries. */
    int (*probe)(void);
    /* Devices of this kind usable here (0 for the CPU backend). Cheap; no context needed. */
    int (*device_count)(void);
    /* The device's product name as its driver gives it ("NVIDIA H100 80GB HBM3"), read at init;
     * NULL member: a CPU, or a device without one. */
    const char *(*device_name)(ddp_kctx_t *ctx);

    /* Context on `device` (ignored by the CPU) with `threads` compute threads (0 = default). */
    int (*init)(ddp_kctx_t **out, int device, int threads);
    void (*close)(ddp_kctx_t *ctx); /* NULL-safe */

    int (*alloc)(ddp_kctx_t *ctx, void **out, size_t bytes); /* zero-filled */
    void (*free)(ddp_kctx_t *ctx, void *p);                   /* NULL-safe; reservations too */
    /* A sparse arena (ZeRO-1's sharded moments: the full layout, physical memory only in this
     * rank's slices); the wrappers below state the contract. Granule i of a reservation at r of
     * `bytes` is [r + i G, min(r + (i + 1) G, r + bytes)), G = commit_granule(ctx): cpu the
     * page, cuda the driver's minimum (2 MiB), sim 64 KiB. Only a GPU and the sim (which
     * reports the op as a hazard) fault on memory not committed; the CPU's reads zero until
     * written, and commit only checks the range. */
    int (*reserve)(ddp_kctx_t *ctx, void **out, size_t bytes);
    int (*commit)(ddp_kctx_t *ctx, void *p, size_t bytes);
    void (*decommit)(ddp_kctx_t *ctx, void *p, size_t bytes);
    size_t (*commit_granule)(ddp_kctx_t *ctx); /* a power of two; 0: reserve is DDP_ENOTSUP */
    /* 1 when [p, p + bytes) is device memory of this context's device (only memcpy_* reach
     * it), else 0: host memory, or anything the device does not know (CPU: always 0). Cheap (a
     * driver query); any thread. */
    int (*on_device)(ddp_kctx_t *ctx, const void *p, size_t bytes);
    /* Copies, ordered on the compute stream like ops. memcpy_h2d reads src before it returns
     * (the caller may reuse it at once) and QUEUES the device write, which another stream or
     * context sees only once ordered after it (sync, or record_event): the GPU stages it
     * through pinned memory so that the stream is not drained (a backend may also wait).
     * memcpy_d2h returns with dst written (it waits for the stream). memcpy_d2d is queued. */
    int (*memcpy_h2d)(ddp_kctx_t *ctx, void *dst, const void *src, size_t bytes);
    int (*memcpy_d2h)(ddp_kctx_t *ctx, void *dst, const void *src, size_t bytes);
    int (*memcpy_d2d)(ddp_kctx_t *ctx, void *dst, const void *src, size_t bytes);
    int (*memset0)(ddp_kctx_t *ctx, void *dst, size_t bytes);
    int (*sync)(ddp_kctx_t *ctx); /* waits for queued work; returns its first error */
    /* Records the context's ordering event after everything queued so far and sets *event to
     * it: a cudaEvent_t for CUDA (hand it to ddp_coll_wait_event before anything else touches
     * the buffers), NULL where ops are synchronous (CPU). The event belongs to ctx and is
     * recorded again by the next call: a consumer takes its dependency at once (as
     * cudaStreamWaitEvent does). Returns 0 or the error of recording it. */
    int (*record_event)(ddp_kctx_t *ctx, void **event);
    /* Profiling marks (train.profile; ddp_k_profile_start below). Optional as a set: a table
     * without them is profiled with the host's clock around each call (all three backends here
     * have them). A mark is a timestamp ordered on the compute stream, taken when the stream
     * reaches it: a cudaEvent_t with timing on CUDA, a host-clock read queued on the sim's
     * stream, the monotonic clock at the call on the CPU (whose ops are synchronous).
     * timer_mark records a new mark after everything queued so far, without waiting, and sets
     * *mark to it; the mark belongs to ctx and stays valid until timer_reset or close. Returns 0,
     * DDP_ENOMEM or the backend's error (logged). */
    int (*timer_mark)(ddp_kctx_t *ctx, void **mark);
    /* Milliseconds from mark a to mark b, b recorded after a, once both are reached (the caller
     * has synchronised since recording b): >= 0, or negative when the backend cannot tell
     * (logged). Reads nothing from the device beyond the marks. */
    double (*timer_elapsed_ms)(ddp_kctx_t *ctx, void *a, void *b);
    /* Forgets every mark (they become invalid) and keeps their storage for the next ones. The
     * caller has synchronised since the last mark. */
    void (*timer_reset)(ddp_kctx_t *ctx);

    DDP_KERNEL_OPS(DDP_KOP_MEMBER)
    /* 1 when this backend multiplies `prec` in hardware, faster than fp32 (bf16 on a GPU's
     * tensor cores, or on a CPU with AVX512_BF16/AMX), else 0 (a backend that emulates it by
     * rounding: correct, not faster). Writes a one-line reason (static string) to *why. For
     * train.precision "auto". */
    int (*prec_native)(ddp_kctx_t *, ddp_kprec_t prec, const char **why);
} ddp_kernels_ops_t;

/* An opened backend: ops plus context. Use it through the ddp_k_* wrappers below. */
typedef struct ddp_kernels {
    const ddp_kernels_ops_t *ops;
    ddp_kctx_t *ctx;
    void *module; /* dlopen handle, or NULL for the built-in CPU backend */
    int err;      /* first argument error a wrapper found (atomic access); ddp_k_sync returns it */
    ddp_kprec_t prec; /* the last ddp_k_set_precision's (the activation type); FP32 at open */
    int device;       /* the device the context runs on (ddp_kernels_open's, wrapped) */
    /* the profiler (kernels/kprof.c): NULL until the first ddp_k_profile_start, then kept until
     * ddp_kernels_close (atomic access: the checkpoint helper's wrappers read it) */
    struct ddp__kprof *prof;
} ddp_kernels_t;

/* The built-in CPU backend. */
extern const ddp_kernels_ops_t ddp_kernels_cpu;

/* Opens backend `name` ("cpu", "cuda", "sim", or "auto" = highest probe of cpu and cuda) into k,
 * on `device` modulo the backend's device count (k->device: with more local ranks than GPUs,
 * ranks share them round-robin; the CPU ignores it).
 * A backend other than the CPU is a module, ddp_kernels_<name>.so ("sim": the tests' simulated
 * GPU, found in the build tree through the tests' LD_LIBRARY_PATH), looked up beside the
 * executable, then in DDP_KERNELS_PATH, then through the dynamic linker. "auto" considers CUDA
 * only, and does not load its module on a host without an NVIDIA device node (/dev/nvidiactl,
 * /dev/nvidia0, WSL's /dev/dxg) unless DDP_KERNELS_PATH is set: its CUDA libraries would cost
 * ~150 MB of resident memory for nothing.
 * Returns DDP_ENODEV when the named backend is unusable here. */
int ddp_kernels_open(ddp_kernels_t *k, const char *name, int device, int threads);
/* Closes the context and unloads the module. NULL-safe. */
void ddp_kernels_close(ddp_kernels_t *k);

/* The front door: one wrapper per member of the ops table, in the table's order.
 * - NULL-safe: k may be NULL or not opened (closed, or its open failed): a fallible wrapper
 *   returns DDP_EINVAL, an op does nothing, ddp_k_free does nothing.
 * - Arguments are checked against the contract above (required pointers, positive sizes): an
 *   op with bad arguments is not run, it is logged, and its DDP_EINVAL is kept in k (the first
 *   one only) for ddp_k_sync(), as a GPU keeps an asynchronous error. Counts of 0 pass through.
 * - Thread: one thread uses a context at a time, as the backend's members (the training
 *   thread; the checkpoint helper thread opens a context of its own for its copies). */
const char *ddp_k_name(const ddp_kernels_t *k);         /* "cpu", "cuda", "sim"; "none" */
const char *ddp_k_coll_backend(const ddp_kernels_t *k); /* ddp.backend "auto" resolves to it */
int ddp_k_host_memory(const ddp_kernels_t *k);          /* the host_memory capability; 0 */
int ddp_k_gpu_memory(const ddp_kernels_t *k);           /* the gpu_memory capability; 0 */
int ddp_k_devices(const ddp_kernels_t *k);              /* the backend's device count; 0 */
const char *ddp_k_device_name(const ddp_kernels_t *k); /* the device's name; NULL: none (CPU) */

int ddp_k_alloc(ddp_kernels_t *k, void **out, size_t bytes); /* *out zero-filled, or NULL */
void ddp_k_free(ddp_kernels_t *k, void *p);                  /* NULL-safe (k and p) */
/* The sparse arena (see the table). Thread: the one that allocs and frees. */
/* *out = an address range of `bytes` with nothing committed (NULL for 0 bytes); ddp_k_free
 * releases all of it, committed parts included. DDP_ENOTSUP where the device cannot. */
int ddp_k_reserve(ddp_kernels_t *k, void **out, size_t bytes);
/* Makes [p, p + bytes) of a reservation usable, rounded OUTWARD to the granule: granules not
 * committed before read zero, committed ones keep their contents (idempotent). Returns 0,
 * DDP_ENOMEM, DDP_EINVAL (not inside one reservation) or the backend's error. Synchronous:
 * any stream may use the range when it returns. */
int ddp_k_commit(ddp_kernels_t *k, void *p, size_t bytes);
/* Gives back the granules lying WHOLLY inside [p, p + bytes) (rounded INWARD; the last granule
 * ends with the reservation); granules partly outside stay committed with their contents. The
 * caller has synchronised with every op that used them; until committed again they are
 * unusable on a GPU (and read zero once they are). A range outside one reservation is logged
 * and its DDP_EINVAL kept for ddp_k_sync(). */
void ddp_k_decommit(ddp_kernels_t *k, void *p, size_t bytes);
/* The granule of commit/decommit (a power of two; 0 when k is not opened or cannot reserve):
 * slices cut at its multiples are given back whole. */
size_t ddp_k_commit_granule(ddp_kernels_t *k);
/* The on_device member: 1 when [p, p + bytes) is device memory of k's device, else 0 (also when
 * k is not opened or bytes is 0). Any thread. */
int ddp_k_on_device(ddp_kernels_t *k, const void *p, size_t bytes);
int ddp_k_memcpy_h2d(ddp_kernels_t *k, void *dst, const void *src, size_t bytes);
int ddp_k_memcpy_d2h(ddp_kernels_t *k, void *dst, const void *src, size_t bytes);
int ddp_k_memcpy_d2d(ddp_kernels_t *k, void *dst, const void *src, size_t bytes);
int ddp_k_memset0(ddp_kernels_t *k, void *dst, size_t bytes);
/* Waits for everything queued on k; returns the first error: a wrapper's argument error kept
 * in k (it stays: the context's work since then is suspect), else the backend's. */
int ddp_k_sync(ddp_kernels_t *k);
int ddp_k_record_event(ddp_kernels_t *k, void **event);

/* ddp_k_<op>(k, ...) for every op of DDP_KERNEL_OPS (set_precision: nothing when k is not
 * opened). */
#define DDP_KOP_WRAPPER(name, params) void ddp_k_##name DDP_KOP_K_PARAMS params;
DDP_KERNEL_OPS(DDP_KOP_WRAPPER)
/* The precision last set on k (its activation type); DDP_KPREC_FP32 when none was or k is not
 * opened. */
ddp_kprec_t ddp_k_precision(const ddp_kernels_t *k);
/* 1 when k multiplies prec natively; else 0 with *why (a static string). */
int ddp_k_prec_native(ddp_kernels_t *k, ddp_kprec_t prec, const char **why);

/* 1 when the CPU backend multiplies bf16 natively on this machine (a CPU with AVX512_BF16 or
 * AMX, libdnnl loadable, not forced off by DDP_CPU_BF16=emulate, the one setting read here),
 * else 0; *why: a one-line static reason. May load libdnnl. Any thread. */
int ddp_kernels_cpu_bf16(const char **why);

/* Floats of the largest output tile the CPU backend's products cut an R x Cc output into: in a
 * 16-bit run each thread computes a tile in fp32 scratch before rounding it (the memory
 * budget counts it). Pure arithmetic on the shape; any thread. */
size_t ddp_kernels_cpu_tile_floats(int R, int Cc);

/* DDP_K(k, gelu_fwd, out, inp, n) is ddp_k_gelu_fwd(k, out, inp, n): the spelling of the
 * forward and backward passes and the kernel tests. */
#define DDP_K(k, op, ...) ddp_k_##op((k), __VA_ARGS__)

/* ---- Per-op profiling (train.profile; kernels/kprof.c) ----
 *
 * While a profile window is open, every front-door wrapper listed in DDP_KOPS (the copies, sync
 * and every op; X(name, params) like DDP_KERNEL_OPS) that runs its backend call on the thread
 * that opened the window brackets that call with two timing marks (the table's timer_mark;
 * other threads' calls pass untimed) and charges the op with one
 * call, the host time spent in the call, and the bytes and FLOPs its shapes imply (below).
 * Marks are read only when the window closes: one synchronisation, never one per op. With no
 * window open a wrapper costs one load and one branch. Results are unchanged: the profiler
 * only reads clocks.
 *
 * Bytes count every tensor the op reads plus every one it writes, activations at the context's
 * precision and the rest as fp32 (an accumulated gradient, +=, counts twice: read and write); a
 * copy counts its bytes once (memcpy_d2d twice: read and write). FLOPs are counted for the products only: matmul 2 N C OC forward, 4 N C OC
 * backward (2 N C OC without dinp); causal attention 2 B NH T^2 hs forward (the half square,
 * two products; hs = C / NH) and 2.5 times that backward. 0 = not counted. */
#define DDP_KOPS(X)                                                                          \
    X(memcpy_h2d, ()) X(memcpy_d2h, ()) X(memcpy_d2d, ()) X(memset0, ()) X(sync, ())          \
    DDP_KERNEL_OPS(X)

typedef enum {
#define DDP_KOP_ENUM(op, params) DDP_KOP_##op,
    DDP_KOPS(DDP_KOP_ENUM)
#undef DDP_KOP_ENUM
    DDP_KOP_COUNT
} ddp_kop_t;

/* The op's name as in the ops table ("matmul_fwd"); "?" out of range. */
const char *ddp_kop_name(ddp_kop_t op);

/* One op's totals over a window. */
typedef struct ddp_kprof_stat {
    long calls;
    double ms;      /* on the compute stream: the sum over calls of (end mark - start mark) */
    double host_ms; /* wall time the calling thread spent in the calls: a GPU's launch cost, or
                     * the wait of sync and of the calls that block (copies to or from the
                     * host, sumsq_blocks, nonfinite) */
    double bytes;   /* bytes moved (see above); 0 = not known */
    double flops;   /* floating-point operations; 0 = not counted */
} ddp_kprof_stat_t;

typedef struct ddp_kprof_report {
    ddp_kprof_stat_t op[DDP_KOP_COUNT];
    double wall_ms;   /* host clock while the window recorded, from the synchronisation at
                       * ddp_k_profile_start to the one at ddp_k_profile_stop, pauses left out */
    int stream_marks; /* 1: ms from the backend's marks; 0: from the host clock (no marks) */
    int err;          /* 0, or the first error of a mark or of the window's memory: some calls
                       * then lack their stream time (counted all the same) */
} ddp_kprof_report_t;

/* Opens a profile window on k for the calling thread: waits for the work queued so far (so the
 * window starts with an idle stream), then records every call until ddp_k_profile_stop.
 * Returns 0, DDP_EINVAL (k not opened, or a window already open on k or on this thread: a
 * thread has one at a time), DDP_ENOMEM, or the error the wait returned (as ddp_k_sync would,
 * which it replaces). Thread: the training thread; pause, resume and stop on the same one. */
int ddp_k_profile_start(ddp_kernels_t *k);
/* Stops recording (between profiled steps) without waiting; the host time until
 * ddp_k_profile_resume is left out of wall_ms. On a GPU, kernels queued before the pause may
 * still run during it: their marks are counted as they are. No-op without an open window. */
void ddp_k_profile_pause(ddp_kernels_t *k);
void ddp_k_profile_resume(ddp_kernels_t *k);
/* Closes the window: waits for the queued work once, reads every mark and fills *out (zeroed
 * first; may be NULL). Returns 0, DDP_EINVAL (no window open), or the error of the wait (as
 * ddp_k_sync would); a mark's error only makes the report incomplete (out->err, logged). A
 * window of more than 65536 calls reads its marks every 65536 calls, with one synchronisation
 * each time (an error there is kept for ddp_k_sync). */
int ddp_k_profile_stop(ddp_kernels_t *k, ddp_kprof_report_t *out);

/* Runs every op of every backend usable here against the CPU backend on random inputs and
 * prints one line per op and backend (max abs and relative error, pass/fail) to stdout.
 * Returns 0 when all pass, 1 when one fails, 2 when no backend other than the CPU is usable
 * (the report then says so). Used by `ddp-worker --selftest`. */
int ddp_kernels_selftest(void);

/* The symbol a kernel module exports: returns its ops table. */
typedef const ddp_kernels_ops_t *(*ddp_kernels_module_fn)(void);
#define DDP_KERNELS_MODULE_SYMBOL "ddp_kernels_module"

#endif
