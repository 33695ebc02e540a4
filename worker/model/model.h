/* The model on a parameter arena: GPT-2 and the Llama family (Llama, SmolLM2, TinyLlama, Qwen2):
 * layout, initialisation, forward and backward.
 *
 * All parameters live in one allocation of the kernel backend; gradients live in a second with
 * the same layout (and AdamW's moments in two more, see optim/adamw.h). The layout is in BACKWARD
 * COMPLETION ORDER, so the gradients that backward finishes first come first. GPT-2:
 *
 *   wte.weight                  (first: the tied LM head's gradient is finished first)
 *   ln_f.{weight,bias}
 *   h.{L-1..0}.{mlp.c_proj.weight, mlp.c_proj.bias, mlp.c_fc.weight, mlp.c_fc.bias,
 *               ln_2.weight, ln_2.bias, attn.c_proj.weight, attn.c_proj.bias,
 *               attn.c_attn.weight, attn.c_attn.bias, ln_1.weight, ln_1.bias}
 *   wpe.weight
 *
 * and the Llama family's in budget/model_layout.c (lm_head or the tied embedding first, the blocks
 * from the last, an untied embedding last), so every gradient bucket is one contiguous slice
 * and backward can report a growing finished prefix (ddp_model_backward's `ready` callback)
 * that the reducer all-reduces in place. Tensor names and shapes are Hugging Face's: GPT-2's
 * Conv1D weights [in, out], Llama's nn.Linear weights [out, in].
 */
#ifndef DDP_WORKER_MODEL_MODEL_H
#define DDP_WORKER_MODEL_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/rng.h"
#include "kernels/kernels.h"
#include "proto/spec.h"

#define DDP_MODEL_NAME_MAX 64

/* One parameter tensor: a view into any arena with the model's layout. */
typedef struct ddp_param_desc {
    char name[DDP_MODEL_NAME_MAX]; /* "h.3.attn.c_attn.weight", "model.norm.weight" */
    int ndim;
    int shape[2];
    size_t offset; /* in floats from the arena's start */
    size_t numel;
    int decay; /* weight decay applies: 2-D tensors */
} ddp_param_desc_t;

/* A model's widths (ddp_model_dims): C channels in NH query heads of hs, NKV key/value heads;
 * the attention's input projection is QKV = C + 2 NKV hs wide; the MLP's first product FH wide
 * and its hidden activation H (GPT-2: 4C and 4C; Llama: gate and up 2I, and I). */
typedef struct ddp_model_dims {
    int C, NH, NKV, hs, QKV, FH, H;
} ddp_model_dims_t;

/* Pointers to one block's tensors inside an arena; NULL where the architecture has none (a
 * Llama has no biases but Qwen2's qkvb, and RMSNorm no ln*b). Weights of one product are
 * adjacent in the arena: qkvw is q's, k's and v's ([C,QKV] GPT-2, [QKV,C] Llama), fcw gate's
 * and up's ([2I,C]). */
typedef struct ddp_model_block {
    float *ln1w, *ln1b;         /* [C] */
    float *qkvw, *qkvb;         /* [C,QKV] or [QKV,C]; [QKV] */
    float *attprojw, *attprojb; /* [C,C], [C] */
    float *ln2w, *ln2b;         /* [C] */
    float *fcw, *fcb;           /* [C,FH] or [FH,C]; [FH] */
    float *fcprojw, *fcprojb;   /* [H,C] or [C,H]; [C] */
} ddp_model_block_t;

/* Pointers to every tensor of one arena (parameters or gradients). */
typedef struct ddp_model_views {
    float *wte;           /* [V,C] the token embedding */
    float *lm_head;       /* [V,C] the LM head: wte when tied */
    float *wpe;           /* [block_size,C]; NULL: no learned positions (Llama) */
    float *lnfw, *lnfb;   /* [C]; lnfb NULL for RMSNorm */
    ddp_model_block_t *h; /* [n_layer] */
} ddp_model_views_t;

/* Activations for micro-batches of B sequences of up to T tokens. [L,...] tensors hold one
 * slice per layer, or a single slice under DDP_RECOMPUTE_BLOCK (res3 always has L).
 * ddp_act_t tensors are of the run's precision (kernels.h: 16-bit in bf16/fp16 runs); the
 * residual stream (encoded, res2, res3) and its gradient (dres), the norms' statistics, the
 * log-sum-exps and the losses stay fp32 (autocast's numerics; why, in kernels.h). */
typedef struct ddp_model_acts {
    int B, T;
    ddp_recompute_t recompute;
    ddp_kprec_t prec; /* the activations' type: the kernels' precision at init */
    int gpu;          /* in a GPU's memory: the LM head's chunks are larger (ddp_model_lm_rows) */
    void *base;       /* one allocation */
    float *encoded;   /* [B,T,C] */
    ddp_act_t *ln1;   /* [L,B,T,C] */
    float *ln1_mean, *ln1_rstd; /* [L,B,T] x2 (RMSNorm: no mean, NULL) */
    ddp_act_t *qkv;             /* [L,B,T,QKV] (after RoPE in a Llama) */
    ddp_act_t *atty;            /* [L,B,T,C] */
    float *lse;                 /* [L,B,NH,T] attention's row log-sum-exps */
    float *res2;                /* [L,B,T,C] */
    ddp_act_t *ln2;             /* [L,B,T,C] */
    float *ln2_mean, *ln2_rstd; /* [L,B,T] x2 */
    ddp_act_t *fch;             /* [L,B,T,FH] the MLP's first product (Llama: gate | up) */
    ddp_act_t *fch_gelu;        /* [L,B,T,H] its activation (GELU, or SwiGLU) */
    float *res3;                /* [L,B,T,C] */
    ddp_act_t *lnf;             /* [B,T,C] */
    float *lnf_mean, *lnf_rstd; /* [B,T] x2 */
    ddp_act_t *logits; /* [lm_rows,V], rows ddp_logits_ld(V) apart: a chunk of the LM head */
    float *losses;     /* [B,T] */
    ddp_act_t *dlnf;   /* [B,T,C] gradient of ln_f's output (the LM head's) */
    int lm_rows;       /* rows of the LM head per chunk (ddp_model_lm_rows) */
    /* backward scratch, reused by every layer; also dc in forward (the projections' outputs) */
    float *dres;               /* [B,T,C] gradient of the residual stream */
    ddp_act_t *dres_act;       /* [B,T,C] dres in the activations' type (a projection's dout) */
    ddp_act_t *dc;             /* [B,T,C] */
    ddp_act_t *dqkv;           /* [B,T,QKV] */
    ddp_act_t *dfc;            /* [B,T,FH] */
    ddp_act_t *dfch;           /* [B,T,H] SwiGLU's output gradient (NULL where H == FH) */
    float *rope;               /* [T, hs/2, 2] RoPE's cos and sin by position (NULL for GPT-2) */
    int32_t *inputs, *targets; /* [B,T] on the device */
    int last_B, last_T;        /* shape of the last forward */
    int last_train;            /* the last pass was ddp_model_forward: backward may follow */
} ddp_model_acts_t;

typedef struct ddp_model {
    ddp_model_cfg_t cfg;
    ddp_kernels_t *k;         /* borrowed */
    ddp_param_desc_t *params; /* [n_tensors], in arena order */
    int n_tensors;
    size_t n_params;            /* floats in an arena */
    float *w;                   /* parameter arena (device) */
    float *g;                   /* gradient arena (device) */
    int borrowed_w, borrowed_g; /* w / g were the caller's (init's arguments) */
    ddp_model_views_t wv, gv;   /* views into w and g */
    ddp_model_dims_t d;         /* ddp_model_dims(&cfg) */
    ddp_wlayout_t wlayout;      /* the blocks' weights: [in, out] (GPT-2) or [out, in] (Llama) */
    size_t *block_end; /* [n_layer] arena offset where block l's tensors end: its gradients are
                        * final after its backward */
    size_t lnf_end;    /* ... where the final norm's end */
    ddp_model_acts_t acts;
    float loss_scale; /* backward's gradient is of loss_scale x mean loss (fp16); init: 1 */
    /* asked between blocks of forward and backward (may be NULL): nonzero stops the pass, which
     * returns DDP_EABORTED. The trainer stops a step whose communicator has failed at once,
     * instead of computing to its next collective to learn of it. */
    int (*interrupted)(void *arg);
    void *interrupted_arg;
} ddp_model_t;

/* Called by backward each time a prefix of the gradient arena is final: floats
 * [0, done) will not be written again in this backward. */
typedef void (*ddp_model_ready_fn)(void *arg, size_t done);

/* Builds the layout and allocates the parameter and gradient arenas (zeroed) and activations
 * for B x T on backend k (borrowed; must outlive the model), in k's precision now
 * (ddp_k_precision: set it first; forward refuses to run under another). weights, grads: zeroed
 * arenas of ddp_model_count_params(cfg) floats that the caller owns (the trainer passes
 * collective memory, which the collectives read and write in place), or NULL to allocate that
 * one with k. Returns 0, DDP_EINVAL for an impossible configuration, or an allocation error. */
int ddp_model_init(ddp_model_t *m, const ddp_model_cfg_t *cfg, ddp_kernels_t *k, int B, int T,
                   float *weights, float *grads);
/* ddp_model_init with activation recomputation: DDP_RECOMPUTE_BLOCK keeps only each block's
 * input and output (res3) across the forward, and backward recomputes the block's forward
 * before its backward: one more forward of the blocks for a much smaller activation arena, with
 * gradients bitwise equal to DDP_RECOMPUTE_NONE's. */
int ddp_model_init_with(ddp_model_t *m, const ddp_model_cfg_t *cfg, ddp_kernels_t *k, int B, int T,
                        float *weights, float *grads, ddp_recompute_t recompute);
/* Frees everything init allocated. NULL-safe. */
void ddp_model_close(ddp_model_t *m);
/* Moves the gradients to a caller-owned arena of n_params floats (a new generation's collective
 * memory), or with grads NULL to one the model allocates; the previous arena, if the model
 * allocated it, is freed. Gradients are not kept. Returns 0 or an allocation error. */
int ddp_model_set_grads(ddp_model_t *m, float *grads);

/* cfg's widths (no allocation). */
ddp_model_dims_t ddp_model_dims(const ddp_model_cfg_t *cfg);
/* Number of floats in an arena for cfg (no allocation). */
size_t ddp_model_count_params(const ddp_model_cfg_t *cfg);
/* Bytes of the activation arena for B x T under `recompute` and precision prec, in a GPU's
 * memory or not (no allocation; budget/model_layout.c, which links without the kernels' ops). */
size_t ddp_model_acts_bytes(const ddp_model_cfg_t *cfg, int B, int T, ddp_recompute_t recompute,
                            ddp_kprec_t prec, int gpu);
/* Fills out (n_tensors entries; NULL: only counts) with the parameter layout, sets *n_params to the
 * floats of an arena, returns the number of tensors. Internal (model.c, budget/model_layout.c). */
int ddp__model_layout(const ddp_model_cfg_t *cfg, ddp_param_desc_t *out, size_t *n_params);
/* Carves a's arena at base from a->B, a->T, a->recompute, a->prec, a->gpu (base NULL: only counts);
 * returns its size in bytes. Internal to model.c and budget/model_layout.c. */
size_t ddp__model_carve_acts(ddp_model_acts_t *a, const ddp_model_cfg_t *cfg, void *base);

/* Initialisation from rng: weights N(0, 0.02), residual projections (GPT-2's attn.c_proj and
 * mlp.c_proj, Llama's o_proj and down_proj) N(0, 0.02/sqrt(2 L)), biases 0, norm weights 1.
 * Draws on the host in arena order, so the result depends on the seed only. */
int ddp_model_init_weights(ddp_model_t *m, ddp_rng_t *rng);

/* The descriptor named `name` (HF name; GPT-2's with or without a "transformer." prefix), or
 * NULL. */
const ddp_param_desc_t *ddp_model_find(const ddp_model_t *m, const char *name);

/* Rows of the LM head and loss computed at once: a chunk of logits [rows, V] in precision prec is
 * the only one that exists (about 64 MiB, 256 MiB on a GPU: budget/model_layout.c says why), never
 * [B*T, V]. At least 64 and at least B (ddp_model_next_logits' rows), at most B*T. */
int ddp_model_lm_rows(const ddp_model_cfg_t *cfg, int B, int T, ddp_kprec_t prec, int gpu);

/* A training micro-step's forward on inputs[B,T] and targets[B,T] (host int32; B <= acts.B,
 * T <= acts.T): the blocks, then the LM head and the loss chunk by chunk, each chunk's
 * backward at once (dlogits written over the chunk's logits): the gradient arena is zeroed and
 * gets the LM head's share of wte, and acts.dlnf the gradient of ln_f's output, for
 * ddp_model_backward. The gradient is of loss_scale x the mean loss, which the backward reads
 * (nothing here waits for the device: the inputs' copies are queued). Returns 0, DDP_EINVAL
 * (bad tokens, shape or no targets), DDP_EABORTED (interrupted) or a backend error. */
int ddp_model_forward(ddp_model_t *m, const int32_t *inputs, const int32_t *targets, int B, int T);

/* Forward only, for validation: the mean loss over inputs[B,T] and targets[B,T] in *loss (the
 * LM head chunk by chunk, no gradient). Leaves the gradient arena as it is. Returns as forward
 * (DDP_EINVAL without targets). */
int ddp_model_evaluate(ddp_model_t *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                       float *loss);

/* Forward only, for scoring (worker/evaluate/): each position's loss, -log p(targets[b,t] |
 * inputs[b, 0..t]) in natural log, into host losses[B*T] (row-major; the copy waits for the
 * device). Leaves the gradient arena as it is. Returns as evaluate (DDP_EINVAL without targets
 * or losses). */
int ddp_model_losses(ddp_model_t *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                     float *losses);

/* Forward only, for sampling: acts.logits rows 0..B-1 (ddp_logits_ld(V) apart) get the logits
 * [B, V] at position pos < T of each sequence (activations: ddp_act_to_f32 widens a host copy).
 * Attention is causal, so the positions after pos change nothing but the bits of the products'
 * tiling: a sampler may pad a short context to a length it has run before, and each product
 * keeps a shape it has seen (new shapes cost a primitive each on the CPU's bf16 path).
 * Returns as forward. */
int ddp_model_next_logits(ddp_model_t *m, const int32_t *inputs, int B, int T, int pos);

/* Backward of the last ddp_model_forward (DDP_EINVAL after an evaluate): completes
 * d(loss_scale x mean loss)/dw in the gradient arena, except the token embedding's share of
 * wte, calling ready(arg, done) as each prefix of the arena is final in the queued work (ready
 * may be NULL): on a GPU the ops that write it may still be running, so a consumer orders its
 * own work after them (ddp_k_record_event; the reducer does) rather than the host waiting per
 * block. One sync at the end, after which the forward's mean loss (unscaled) goes to *loss
 * (may be NULL). The embedding-output gradient is left in acts.dres and the tokens in
 * acts.inputs for ddp_model_embed_backward. Returns 0 or a backend error. */
int ddp_model_backward(ddp_model_t *m, ddp_model_ready_fn ready, void *arg, float *loss);

/* Adds the token embedding's share of wte's gradient to the gradient arena: for each position,
 * row inputs[b,t] of wte's gradient += dres[b,t,:] (device pointers; after a backward,
 * acts.inputs and acts.dres). Asynchronous on a GPU like every op. */
void ddp_model_embed_backward(ddp_model_t *m, const int32_t *inputs, const float *dres, int B,
                              int T);

#endif
