/* The models' layouts (GPT-2 and the Llama family): the parameter arena's tensors in order, and
 * how the activation arena is carved into named tensors; both sizes without allocating.
 *
 * Kept apart from model/model.c (which runs the model) so that the memory budget (memory_budget.c),
 * which ddpctl links without the kernels' ops, counts exactly what the model allocates.
 * Invariants: the parameter layout is written down once (layout_tensors); every activation
 * tensor starts a multiple of 256 bytes after a 256-byte-aligned base (the 16-byte loads of
 * element-wise kernels, cuBLAS's preferred alignment); activation tensors are of the run's
 * precision (kernels.h, ddp_act_t), the rest fp32 or int32; per-layer tensors hold
 * n_layer slices, or one under DDP_RECOMPUTE_BLOCK (backward recomputes a block's forward into
 * that one slice), except res3, the blocks' outputs, which recomputation starts from.
 */
#include "worker/model/model.h"

#include <stdio.h>

/* Calls add(ctx, name, ndim, d0, d1, decay) for every tensor in arena order. The one place the
 * layout is defined. */
typedef void (*tensor_fn)(void *ctx, const char *name, int ndim, int d0, int d1, int decay);

#define T_(fmt, ndim, d0, d1)                                                                      \
    do {                                                                                           \
        snprintf(n, sizeof n, fmt, l);                                                             \
        add(ctx, n, ndim, d0, d1, ndim == 2);                                                      \
    } while (0)

static void layout_gpt2(const ddp_model_cfg_t *cfg, tensor_fn add, void *ctx)
{
    int C = cfg->n_embd;
    char n[DDP_MODEL_NAME_MAX];
    add(ctx, "wte.weight", 2, cfg->vocab_size, C, 1);
    add(ctx, "ln_f.weight", 1, C, 0, 0);
    add(ctx, "ln_f.bias", 1, C, 0, 0);
    for (int l = cfg->n_layer - 1; l >= 0; l--) {
        T_("h.%d.mlp.c_proj.weight", 2, 4 * C, C);
        T_("h.%d.mlp.c_proj.bias", 1, C, 0);
        T_("h.%d.mlp.c_fc.weight", 2, C, 4 * C);
        T_("h.%d.mlp.c_fc.bias", 1, 4 * C, 0);
        T_("h.%d.ln_2.weight", 1, C, 0);
        T_("h.%d.ln_2.bias", 1, C, 0);
        T_("h.%d.attn.c_proj.weight", 2, C, C);
        T_("h.%d.attn.c_proj.bias", 1, C, 0);
        T_("h.%d.attn.c_attn.weight", 2, C, 3 * C);
        T_("h.%d.attn.c_attn.bias", 1, 3 * C, 0);
        T_("h.%d.ln_1.weight", 1, C, 0);
        T_("h.%d.ln_1.bias", 1, C, 0);
    }
    add(ctx, "wpe.weight", 2, cfg->block_size, C, 1);
}

/* Hugging Face's LlamaForCausalLM / Qwen2ForCausalLM names, nn.Linear weights [out, in]. The
 * products that one matmul computes are adjacent: q, k, v (and their biases) make the [QKV, C]
 * weight of one product, gate and up the [2I, C] of another. An untied lm_head comes first
 * (the LM head's gradient is the first finished), the embedding last (its gradient is added
 * after the all-reduce, sync/emb_slots.c); tied, the embedding comes first as GPT-2's wte. */
static void layout_llama(const ddp_model_cfg_t *cfg, tensor_fn add, void *ctx)
{
    int C = cfg->n_embd, I = cfg->intermediate_size, KV = cfg->n_kv_head * (C / cfg->n_head);
    int V = cfg->vocab_size;
    char n[DDP_MODEL_NAME_MAX];
    add(ctx, cfg->tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", 2, V, C, 1);
    add(ctx, "model.norm.weight", 1, C, 0, 0);
    for (int l = cfg->n_layer - 1; l >= 0; l--) {
        T_("model.layers.%d.mlp.down_proj.weight", 2, C, I);
        T_("model.layers.%d.mlp.gate_proj.weight", 2, I, C);
        T_("model.layers.%d.mlp.up_proj.weight", 2, I, C);
        T_("model.layers.%d.post_attention_layernorm.weight", 1, C, 0);
        T_("model.layers.%d.self_attn.o_proj.weight", 2, C, C);
        T_("model.layers.%d.self_attn.q_proj.weight", 2, C, C);
        T_("model.layers.%d.self_attn.k_proj.weight", 2, KV, C);
        T_("model.layers.%d.self_attn.v_proj.weight", 2, KV, C);
        if (cfg->attention_bias) {
            T_("model.layers.%d.self_attn.q_proj.bias", 1, C, 0);
            T_("model.layers.%d.self_attn.k_proj.bias", 1, KV, 0);
            T_("model.layers.%d.self_attn.v_proj.bias", 1, KV, 0);
        }
        T_("model.layers.%d.input_layernorm.weight", 1, C, 0);
    }
    if (!cfg->tie_embeddings) add(ctx, "model.embed_tokens.weight", 2, V, C, 1);
}
#undef T_

static void layout_tensors(const ddp_model_cfg_t *cfg, tensor_fn add, void *ctx)
{
    if (cfg->arch == DDP_ARCH_LLAMA)
        layout_llama(cfg, add, ctx);
    else
        layout_gpt2(cfg, add, ctx);
}

typedef struct {
    ddp_param_desc_t *out; /* NULL: count only */
    int n;
    size_t offset;
} layout_ctx_t;

static void add_tensor(void *vctx, const char *name, int ndim, int d0, int d1, int decay)
{
    layout_ctx_t *c = vctx;
    size_t numel = (size_t)d0 * (size_t)(ndim == 2 ? d1 : 1);
    if (c->out) {
        ddp_param_desc_t *p = &c->out[c->n];
        snprintf(p->name, sizeof p->name, "%s", name);
        p->ndim = ndim;
        p->shape[0] = d0;
        p->shape[1] = ndim == 2 ? d1 : 0;
        p->offset = c->offset;
        p->numel = numel;
        p->decay = decay;
    }
    c->n++;
    c->offset += numel;
}

int ddp__model_layout(const ddp_model_cfg_t *cfg, ddp_param_desc_t *out, size_t *n_params)
{
    layout_ctx_t c = {.out = out};
    layout_tensors(cfg, add_tensor, &c);
    *n_params = c.offset;
    return c.n;
}

size_t ddp_model_count_params(const ddp_model_cfg_t *cfg)
{
    size_t n;
    ddp__model_layout(cfg, NULL, &n);
    return n;
}

ddp_model_dims_t ddp_model_dims(const ddp_model_cfg_t *cfg)
{
    int C = cfg->n_embd, NH = cfg->n_head, llama = cfg->arch == DDP_ARCH_LLAMA;
    int NKV = llama ? cfg->n_kv_head : NH;
    ddp_model_dims_t d = {.C = C, .NH = NH, .NKV = NKV, .hs = C / NH};
    d.QKV = C + 2 * NKV * d.hs;
    d.H = llama ? cfg->intermediate_size : 4 * C;
    d.FH = llama ? 2 * d.H : d.H;
    return d;
}

size_t ddp__model_carve_acts(ddp_model_acts_t *a, const ddp_model_cfg_t *cfg, void *base)
{
    ddp_model_dims_t d = ddp_model_dims(cfg);
    size_t L = cfg->n_layer, C = d.C, NH = d.NH, V = cfg->vocab_size;
    size_t QKV = d.QKV, H = d.H, FH = d.FH;
    int llama = cfg->arch == DDP_ARCH_LLAMA; /* RMSNorm: no means; SwiGLU: H != FH */
    size_t BT = (size_t)a->B * a->T;
    size_t LS = a->recompute == DDP_RECOMPUTE_BLOCK ? 1 : L; /* slices of a per-layer tensor */
    size_t act = ddp_act_bytes(a->prec), off = 0;
#define CARVE(field, n, esize)                                                                     \
    do {                                                                                           \
        a->field = base && (n) != 0 ? (void *)((char *)base + off) : NULL;                         \
        off += ((n) * (esize) + 255) & ~(size_t)255; /* 256-byte aligned tensors */                \
    } while (0)
#define F32(field, n) CARVE(field, n, sizeof(float))
#define ACT(field, n) CARVE(field, n, act)
    F32(encoded, BT * C);
    ACT(ln1, LS * BT * C);
    F32(ln1_mean, llama ? 0 : LS * BT);
    F32(ln1_rstd, LS * BT);
    ACT(qkv, LS * BT * QKV);
    ACT(atty, LS * BT * C);
    F32(lse, LS * BT * NH);
    F32(res2, LS * BT * C);
    ACT(ln2, LS * BT * C);
    F32(ln2_mean, llama ? 0 : LS * BT);
    F32(ln2_rstd, LS * BT);
    ACT(fch, LS * BT * FH);
    ACT(fch_gelu, LS * BT * H);
    F32(res3, L * BT * C);
    ACT(lnf, BT * C);
    F32(lnf_mean, llama ? 0 : BT);
    F32(lnf_rstd, BT);
    a->lm_rows = ddp_model_lm_rows(cfg, a->B, a->T, a->prec, a->gpu);
    ACT(logits, (size_t)a->lm_rows * ddp_logits_ld(V)); /* rows padded: kernels.h */
    F32(losses, BT);
    ACT(dlnf, BT * C);
    F32(dres, BT * C);
    ACT(dres_act, BT * C);
    ACT(dc, BT * C);
    ACT(dqkv, BT * QKV);
    ACT(dfc, BT * FH);
    ACT(dfch, FH == H ? 0 : BT * H);
    F32(rope, llama ? (size_t)a->T * d.hs : 0); /* [T, hs/2, 2] */
    CARVE(inputs, BT, sizeof(int32_t));
    CARVE(targets, BT, sizeof(int32_t));
#undef ACT
#undef F32
#undef CARVE
    return off;
}

/* The LM head's chunk of logits: about this many bytes. On a GPU each chunk's weight gradient
 * reads and writes the whole fp32 dwte (309 MB for GPT-2): with 64 MiB chunks (13 at B=8
 * T=1024 in bf16) that is 4 GB a step, about 1.5 ms of the H100's 41.5 (2026-11-27); 256 MiB
 * makes it 4 chunks, in a GPU's tens of GiB. A CPU's resident memory is scarcer, and its
 * products are tiled anyway. */
#define LM_CHUNK_BYTES ((size_t)64 << 20)
#define LM_CHUNK_BYTES_GPU ((size_t)256 << 20)

int ddp_model_lm_rows(const ddp_model_cfg_t *cfg, int B, int T, ddp_kprec_t prec, int gpu)
{
    size_t chunk = gpu ? LM_CHUNK_BYTES_GPU : LM_CHUNK_BYTES;
    size_t rows = chunk / ((size_t)cfg->vocab_size * ddp_act_bytes(prec)) / 64 * 64;
    if (rows < 64) rows = 64;
    if (rows < (size_t)B) rows = (size_t)B;
    size_t BT = (size_t)B * T;
    return (int)(rows < BT ? rows : BT);
}

size_t ddp_model_acts_bytes(const ddp_model_cfg_t *cfg, int B, int T, ddp_recompute_t recompute,
                            ddp_kprec_t prec, int gpu)
{
    ddp_model_acts_t a = {.B = B, .T = T, .recompute = recompute, .prec = prec, .gpu = gpu};
    return ddp__model_carve_acts(&a, cfg, NULL);
}
