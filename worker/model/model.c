/* The model (GPT-2 and the Llama family): initialisation, forward and backward over the
 * kernel backend.
 *
 * Invariants: m->params is in arena order (backward completion order, see model.h); views are
 * computed from it by name, so the layout is written down exactly once (budget/model_layout.c).
 * Backward reports the finished prefix of the arena after the LM head, the final norm and each
 * block. The architectures differ in four places only: the norms, RoPE, the MLP's activation
 * and the weights' orientation; everything else is one code path.
 */
#include "worker/model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/trace.h"

/* Where each Hugging Face name goes in the views: a block's tensors by their name after the
 * block's prefix ("h.3." or "model.layers.3."), the others by their whole name. A product's
 * weights that follow the named one (k and v after q, up after gate) are not listed: they are
 * the rest of the same [out, in] matrix. */
#define SLOT(member) offsetof(ddp_model_block_t, member)
static const struct {
    const char *suffix;
    size_t slot;
} BLOCK_SLOTS[] = {
    {"ln_1.weight", SLOT(ln1w)},
    {"ln_1.bias", SLOT(ln1b)},
    {"attn.c_attn.weight", SLOT(qkvw)},
    {"attn.c_attn.bias", SLOT(qkvb)},
    {"attn.c_proj.weight", SLOT(attprojw)},
    {"attn.c_proj.bias", SLOT(attprojb)},
    {"ln_2.weight", SLOT(ln2w)},
    {"ln_2.bias", SLOT(ln2b)},
    {"mlp.c_fc.weight", SLOT(fcw)},
    {"mlp.c_fc.bias", SLOT(fcb)},
    {"mlp.c_proj.weight", SLOT(fcprojw)},
    {"mlp.c_proj.bias", SLOT(fcprojb)},
    {"input_layernorm.weight", SLOT(ln1w)},
    {"self_attn.q_proj.weight", SLOT(qkvw)},
    {"self_attn.q_proj.bias", SLOT(qkvb)},
    {"self_attn.o_proj.weight", SLOT(attprojw)},
    {"post_attention_layernorm.weight", SLOT(ln2w)},
    {"mlp.gate_proj.weight", SLOT(fcw)},
    {"mlp.down_proj.weight", SLOT(fcprojw)},
};
#undef SLOT
#define VIEW(member) offsetof(ddp_model_views_t, member)
static const struct {
    const char *name;
    size_t slot;
} TOP_SLOTS[] = {
    {"wte.weight", VIEW(wte)},
    {"wpe.weight", VIEW(wpe)},
    {"ln_f.weight", VIEW(lnfw)},
    {"ln_f.bias", VIEW(lnfb)},
    {"model.embed_tokens.weight", VIEW(wte)},
    {"model.norm.weight", VIEW(lnfw)},
    {"lm_head.weight", VIEW(lm_head)},
};
#undef VIEW
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* The block index of a block tensor's name, with *suffix after its prefix; -1 otherwise. */
static int block_of(const char *name, const char **suffix)
{
    int l, at = 0;
    if (sscanf(name, "h.%d.%n", &l, &at) == 1 && at) {
        *suffix = name + at;
        return l;
    }
    if (sscanf(name, "model.layers.%d.%n", &l, &at) == 1 && at) {
        *suffix = name + at;
        return l;
    }
    return -1;
}

/* Fills views for an arena at `base` from the descriptors (and, for the weights' arena, the
 * blocks' ends). */
static void make_views(ddp_model_t *m, float *base, ddp_model_views_t *v)
{
    ddp_model_block_t *h = v->h;
    memset(h, 0, (size_t)m->cfg.n_layer * sizeof *h);
    memset(v, 0, sizeof *v);
    v->h = h;
    for (int i = 0; i < m->n_tensors; i++) {
        const ddp_param_desc_t *p = &m->params[i];
        const char *suffix;
        int l = block_of(p->name, &suffix);
        size_t end = p->offset + p->numel;
        if (l >= 0) {
            if (end > m->block_end[l]) m->block_end[l] = end;
            for (size_t j = 0; j < N_OF(BLOCK_SLOTS); j++)
                if (!strcmp(suffix, BLOCK_SLOTS[j].suffix))
                    *(float **)((char *)&h[l] + BLOCK_SLOTS[j].slot) = base + p->offset;
            continue;
        }
        for (size_t j = 0; j < N_OF(TOP_SLOTS); j++) {
            if (strcmp(p->name, TOP_SLOTS[j].name)) continue;
            *(float **)((char *)v + TOP_SLOTS[j].slot) = base + p->offset;
            int norm = TOP_SLOTS[j].slot == offsetof(ddp_model_views_t, lnfw) ||
                       TOP_SLOTS[j].slot == offsetof(ddp_model_views_t, lnfb);
            if (norm && end > m->lnf_end) m->lnf_end = end;
        }
    }
    if (!v->lm_head) v->lm_head = v->wte; /* tied */
}

/* RoPE's table for positions 0..T-1 into host[T, hs/2, 2], as transformers computes it: the
 * inverse frequencies in fp32 (Llama 3's scaling applied to them), each angle the fp32 product
 * t x inv_freq, and its cos and sin (here in double, rounded once). */
static void rope_table(const ddp_model_cfg_t *c, int T, float *host)
{
    int hs = c->n_embd / c->n_head, half = hs / 2;
    for (int i = 0; i < half; i++) {
        float inv = 1.0f / powf((float)c->rope_theta, (float)(2 * i) / (float)hs);
        if (c->rope_factor > 0) { /* transformers' _compute_llama3_parameters */
            float old = (float)c->rope_original_max, factor = (float)c->rope_factor;
            float lo = (float)c->rope_low_freq_factor, hi = (float)c->rope_high_freq_factor;
            float wavelen = 2.0f * (float)M_PI / inv;
            if (wavelen > old / lo) {
                inv = inv / factor;
            } else if (!(wavelen < old / hi)) {
                float smooth = (old / wavelen - lo) / (hi - lo);
                inv = (1.0f - smooth) * inv / factor + smooth * inv;
            }
        }
        for (int t = 0; t < T; t++) {
            float angle = (float)t * inv;
            host[((size_t)t * half + i) * 2] = (float)cos((double)angle);
            host[((size_t)t * half + i) * 2 + 1] = (float)sin((double)angle);
        }
    }
}

static int validate_cfg(const ddp_model_cfg_t *cfg, int B, int T)
{
    int llama = cfg->arch == DDP_ARCH_LLAMA;
    if (cfg->n_layer < 1 || cfg->n_head < 1 || cfg->n_embd < 1 || cfg->vocab_size < 1 ||
        cfg->block_size < 1 || cfg->n_embd % cfg->n_head || B < 1 || T < 1 || T > cfg->block_size ||
        (llama &&
         (cfg->n_kv_head < 1 || cfg->n_head % cfg->n_kv_head || cfg->intermediate_size < 1 ||
          (cfg->n_embd / cfg->n_head) % 2 || !(cfg->norm_eps > 0) || !(cfg->rope_theta > 1)))) {
        DDP_ERROR("model: invalid configuration (L=%d NH=%d C=%d V=%d block=%d B=%d T=%d)",
                  cfg->n_layer, cfg->n_head, cfg->n_embd, cfg->vocab_size, cfg->block_size, B, T);
        return DDP_EINVAL;
    }
    return 0;
}

int ddp_model_init(ddp_model_t *m, const ddp_model_cfg_t *cfg, ddp_kernels_t *k, int B, int T,
                   float *weights, float *grads)
{
    return ddp_model_init_with(m, cfg, k, B, T, weights, grads, DDP_RECOMPUTE_NONE);
}

int ddp_model_init_with(ddp_model_t *m, const ddp_model_cfg_t *cfg, ddp_kernels_t *k, int B, int T,
                        float *weights, float *grads, ddp_recompute_t recompute)
{
    memset(m, 0, sizeof *m);
    DDP_CHECK(validate_cfg(cfg, B, T));
    m->cfg = *cfg;
    m->k = k;
    m->loss_scale = 1.0f;
    int rc = 0;
    m->n_tensors = ddp__model_layout(cfg, NULL, &m->n_params);
    m->params = ddp_calloc((size_t)m->n_tensors, sizeof *m->params);
    m->wv.h = ddp_calloc((size_t)cfg->n_layer, sizeof *m->wv.h);
    m->gv.h = ddp_calloc((size_t)cfg->n_layer, sizeof *m->gv.h);
    m->block_end = ddp_calloc((size_t)cfg->n_layer, sizeof *m->block_end);
    if (!m->params || !m->wv.h || !m->gv.h || !m->block_end) {
        rc = DDP_ENOMEM;
        goto fail;
    }
    ddp__model_layout(cfg, m->params, &m->n_params);
    m->d = ddp_model_dims(cfg);
    m->wlayout = cfg->arch == DDP_ARCH_LLAMA ? DDP_W_OUT_IN : DDP_W_IN_OUT;

    m->w = weights;
    m->g = grads;
    m->borrowed_w = weights != NULL;
    m->borrowed_g = grads != NULL;
    if (!m->borrowed_w)
        DDP_CHECK_GOTO(ddp_k_alloc(k, (void **)&m->w, m->n_params * sizeof(float)), rc, fail);
    if (!m->borrowed_g)
        DDP_CHECK_GOTO(ddp_k_alloc(k, (void **)&m->g, m->n_params * sizeof(float)), rc, fail);
    make_views(m, m->w, &m->wv);
    make_views(m, m->g, &m->gv);

    m->acts.B = B;
    m->acts.T = T;
    m->acts.recompute = recompute;
    m->acts.prec = ddp_k_precision(k);
    m->acts.gpu = ddp_k_gpu_memory(k);
    size_t acts_bytes = ddp__model_carve_acts(&m->acts, cfg, NULL);
    DDP_CHECK_GOTO(ddp_k_alloc(k, &m->acts.base, acts_bytes), rc, fail);
    ddp__model_carve_acts(&m->acts, cfg, m->acts.base);
    if (m->acts.rope) {
        size_t n = (size_t)T * m->d.hs;
        float *host = ddp_malloc(n * sizeof(float));
        if (!host) {
            rc = DDP_ENOMEM;
            goto fail;
        }
        rope_table(cfg, T, host);
        rc = ddp_k_memcpy_h2d(k, m->acts.rope, host, n * sizeof(float));
        if (rc == 0) rc = ddp_k_sync(k); /* host is freed next */
        free(host);
        if (rc) goto fail;
    }
    return 0;
fail:
    ddp_model_close(m);
    return rc;
}

void ddp_model_close(ddp_model_t *m)
{
    if (!m) return;
    if (m->k) {
        if (!m->borrowed_w) ddp_k_free(m->k, m->w);
        if (!m->borrowed_g) ddp_k_free(m->k, m->g);
        ddp_k_free(m->k, m->acts.base);
    }
    free(m->params);
    free(m->wv.h);
    free(m->gv.h);
    free(m->block_end);
    memset(m, 0, sizeof *m);
}

int ddp_model_set_grads(ddp_model_t *m, float *grads)
{
    float *own = NULL;
    if (!grads) {
        DDP_CHECK(ddp_k_alloc(m->k, (void **)&own, m->n_params * sizeof(float)));
        DDP_CHECK(ddp_k_memset0(m->k, own, m->n_params * sizeof(float)));
    }
    if (!m->borrowed_g) ddp_k_free(m->k, m->g);
    m->g = grads ? grads : own;
    m->borrowed_g = grads != NULL;
    make_views(m, m->g, &m->gv);
    return 0;
}

int ddp_model_init_weights(ddp_model_t *m, ddp_rng_t *rng)
{
    float *host = ddp_malloc(m->n_params * sizeof(float));
    if (!host) return DDP_ENOMEM;
    float proj_std = 0.02f / sqrtf(2.0f * (float)m->cfg.n_layer);
    for (int i = 0; i < m->n_tensors; i++) {
        const ddp_param_desc_t *p = &m->params[i];
        float *dst = host + p->offset;
        const char *leaf = strrchr(p->name, '.') + 1;
        int is_norm = p->ndim == 1 && strcmp(leaf, "bias"); /* the norms' weights */
        if (!strcmp(leaf, "bias")) {
            memset(dst, 0, p->numel * sizeof(float));
        } else if (is_norm) {
            for (size_t j = 0; j < p->numel; j++) dst[j] = 1.0f;
        } else {
            int residual = strstr(p->name, "c_proj.weight") || strstr(p->name, "o_proj.weight") ||
                           strstr(p->name, "down_proj.weight");
            float std = residual ? proj_std : 0.02f;
            for (size_t j = 0; j < p->numel; j++) dst[j] = (float)ddp_rng_normal(rng) * std;
        }
    }
    int rc = ddp_k_memcpy_h2d(m->k, m->w, host, m->n_params * sizeof(float));
    free(host);
    return rc;
}

const ddp_param_desc_t *ddp_model_find(const ddp_model_t *m, const char *name)
{
    if (!strncmp(name, "transformer.", 12)) name += 12;
    for (int i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->params[i].name, name)) return &m->params[i];
    return NULL;
}

/* Layer l's saved activations: slice l of each per-layer tensor, or under recompute the one
 * slice that every block's forward writes (see budget/model_layout.c). */
typedef struct {
    ddp_act_t *ln1, *qkv, *atty, *ln2, *fch, *fchg;
    float *ln1_mean, *ln1_rstd, *lse, *res2, *ln2_mean, *ln2_rstd;
} layer_acts_t;

static layer_acts_t layer_acts(const ddp_model_t *m, int l)
{
    const ddp_model_acts_t *a = &m->acts;
    const ddp_model_dims_t *d = &m->d;
    ddp_kprec_t p = a->prec;
    /* strides use the allocated B x T, so a smaller batch leaves slack, never overlap */
    size_t s = a->recompute == DDP_RECOMPUTE_BLOCK ? 0 : (size_t)l;
    size_t sBT = s * a->B * a->T, sBTC = sBT * d->C;
    return (layer_acts_t){.ln1 = ddp_act_at(a->ln1, sBTC, p),
                          .qkv = ddp_act_at(a->qkv, sBT * d->QKV, p),
                          .atty = ddp_act_at(a->atty, sBTC, p),
                          .ln2 = ddp_act_at(a->ln2, sBTC, p),
                          .fch = ddp_act_at(a->fch, sBT * d->FH, p),
                          .fchg = ddp_act_at(a->fch_gelu, sBT * d->H, p),
                          .ln1_mean = a->ln1_mean ? a->ln1_mean + sBT : NULL,
                          .ln1_rstd = a->ln1_rstd + sBT,
                          .lse = a->lse + sBT * d->NH,
                          .res2 = a->res2 + sBTC,
                          .ln2_mean = a->ln2_mean ? a->ln2_mean + sBT : NULL,
                          .ln2_rstd = a->ln2_rstd + sBT};
}

/* A norm's forward: LayerNorm (GPT-2) or RMSNorm (Llama; mean and bias unused). */
static void norm_forward(ddp_model_t *m, ddp_act_t *out, float *mean, float *rstd, const float *x,
                         const float *w, const float *bias, int N)
{
    if (m->cfg.arch == DDP_ARCH_LLAMA)
        DDP_K(m->k, rmsnorm_fwd, out, rstd, x, w, N, m->d.C, (float)m->cfg.norm_eps);
    else
        DDP_K(m->k, layernorm_fwd, out, mean, rstd, x, w, bias, N, m->d.C);
}

/* res = x + y (the residual stream plus a branch's output) and out = the norm of res, in one
 * pass: bitwise residual_fwd followed by norm_forward. GPT-2's LayerNorm has layernorm_fwd's
 * eps (1e-5). */
static void residual_norm_forward(ddp_model_t *m, float *res, ddp_act_t *out, float *mean,
                                  float *rstd, const float *x, const ddp_act_t *y, const float *w,
                                  const float *bias, int N)
{
    if (m->cfg.arch == DDP_ARCH_LLAMA)
        DDP_K(m->k, residual_norm_fwd, res, out, NULL, rstd, x, y, w, NULL, N, m->d.C,
              (float)m->cfg.norm_eps);
    else
        DDP_K(m->k, residual_norm_fwd, res, out, mean, rstd, x, y, w, bias, N, m->d.C, 1e-5f);
}

/* Its backward: dx += through the norm of dout; dw (and db) += theirs. */
/* dx += the norm's input gradient; dx_act (NULL: not wanted) = the new dx in the activations'
 * type, as the next projection's backward reads it (autocast casts the branch's gradient). */
static void norm_backward(ddp_model_t *m, float *dx, ddp_act_t *dx_act, float *dw, float *db,
                          const ddp_act_t *dout, const float *x, const float *w, const float *mean,
                          const float *rstd, int N)
{
    if (m->cfg.arch == DDP_ARCH_LLAMA)
        DDP_K(m->k, rmsnorm_bwd, dx, dx_act, dw, dout, x, w, rstd, N, m->d.C);
    else
        DDP_K(m->k, layernorm_bwd, dx, dx_act, dw, db, dout, x, w, mean, rstd, N, m->d.C);
}

/* Block l's forward on its input x[B,T,C] into its saved activations (a->dc is scratch); with
 * out non-NULL also the MLP's projection and the residual: out[B,T,C] = the block's output.
 * Backward's recomputation passes out NULL: it needs neither. The same ops on the same inputs,
 * so a recomputed activation is bitwise the one the forward saw. */
static void block_forward(ddp_model_t *m, int l, const float *x, float *out, int B, int T)
{
    ddp_kernels_t *k = m->k;
    ddp_act_t *dc = m->acts.dc;
    const ddp_model_dims_t *d = &m->d;
    int C = d->C, BT = B * T, llama = m->cfg.arch == DDP_ARCH_LLAMA;
    ddp_wlayout_t wl = m->wlayout;
    const ddp_model_block_t *w = &m->wv.h[l];
    layer_acts_t s = layer_acts(m, l);
    norm_forward(m, s.ln1, s.ln1_mean, s.ln1_rstd, x, w->ln1w, w->ln1b, BT);
    DDP_K(k, matmul_fwd, s.qkv, s.ln1, w->qkvw, w->qkvb, BT, C, d->QKV, d->QKV, wl);
    if (llama) DDP_K(k, rope_fwd, s.qkv, m->acts.rope, B, T, d->NH, d->NKV, d->hs);
    DDP_K(k, attention_fwd, s.atty, s.lse, s.qkv, B, T, C, d->NH, d->NKV);
    DDP_K(k, matmul_fwd, dc, s.atty, w->attprojw, w->attprojb, BT, C, C, C, wl);
    residual_norm_forward(m, s.res2, s.ln2, s.ln2_mean, s.ln2_rstd, x, dc, w->ln2w, w->ln2b, BT);
    if (llama) {
        DDP_K(k, matmul_fwd, s.fch, s.ln2, w->fcw, w->fcb, BT, C, d->FH, d->FH, wl);
        DDP_K(k, swiglu_fwd, s.fchg, s.fch, BT, d->H);
    } else { /* the GELU in the product's pass */
        DDP_K(k, matmul_gelu_fwd, s.fchg, s.fch, s.ln2, w->fcw, w->fcb, BT, C, d->FH, wl);
    }
    if (!out) return;
    DDP_K(k, matmul_fwd, dc, s.fchg, w->fcprojw, w->fcprojb, BT, d->H, C, C, wl);
    DDP_K(k, residual_fwd, out, s.res2, dc, (size_t)BT * C);
}

/* The blocks and ln_f on inputs[B,T] (checked against V, and targets too when given), which
 * are copied to the device with the targets. */
static int forward_blocks(ddp_model_t *m, const int32_t *inputs, const int32_t *targets, int B,
                          int T)
{
    ddp_kernels_t *k = m->k;
    ddp_model_acts_t *a = &m->acts;
    if (B < 1 || T < 1 || B > a->B || T > a->T) return DDP_EINVAL;
    if (ddp_k_precision(k) != a->prec) {
        DDP_ERROR("model: the activations are %s-bit but the kernels' precision changed since",
                  a->prec == DDP_KPREC_FP32 ? "32" : "16");
        return DDP_EINVAL;
    }
    int C = m->cfg.n_embd, V = m->cfg.vocab_size, L = m->cfg.n_layer;
    size_t BT = (size_t)B * T;
    size_t sBTC = (size_t)a->B * a->T * C; /* res3's layer stride: the allocated B x T */
    for (size_t i = 0; i < BT; i++)
        if (inputs[i] < 0 || inputs[i] >= V || (targets && (targets[i] < 0 || targets[i] >= V)))
            return DDP_EINVAL;
    a->last_train = 0;

    DDP_CHECK(ddp_k_memcpy_h2d(k, a->inputs, inputs, BT * sizeof(int32_t)));
    if (targets) DDP_CHECK(ddp_k_memcpy_h2d(k, a->targets, targets, BT * sizeof(int32_t)));

    DDP_K(k, encoder_fwd, a->encoded, a->inputs, m->wv.wte, m->wv.wpe, B, T, C); /* wpe: GPT-2 */
    const float *x = a->encoded;
    for (int l = 0; l < L; l++) {
        if (m->interrupted && m->interrupted(m->interrupted_arg)) return DDP_EABORTED;
        int64_t tr = ddp_trace_begin();
        float *res3 = a->res3 + l * sBTC;
        block_forward(m, l, x, res3, B, T);
        x = res3;
        ddp_trace_end(DDP_TRACE_COMPUTE, tr, "forward h.%d", l);
    }
    norm_forward(m, a->lnf, a->lnf_mean, a->lnf_rstd, x, m->wv.lnfw, m->wv.lnfb, (int)BT);
    a->last_B = B;
    a->last_T = T;
    return 0;
}

/* The LM head and the loss over the BT rows of ln_f's output, a chunk of acts.lm_rows rows at a
 * time, in row order, the rows' losses into acts.losses; with `train` each chunk's backward
 * too: dlogits (over the logits) into dlnf and the gradient arena's wte. Queued: nothing
 * waits. */
static void lm_head_loss(ddp_model_t *m, int train)
{
    ddp_kernels_t *k = m->k;
    ddp_model_acts_t *a = &m->acts;
    int C = m->cfg.n_embd, V = m->cfg.vocab_size, ld = ddp_logits_ld(V);
    size_t BT = (size_t)a->last_B * a->last_T;
    float dloss = m->loss_scale / (float)BT;
    for (size_t r0 = 0; r0 < BT; r0 += (size_t)a->lm_rows) {
        int rows = (int)(BT - r0 < (size_t)a->lm_rows ? BT - r0 : (size_t)a->lm_rows);
        const ddp_act_t *lnf = ddp_act_at(a->lnf, r0 * C, a->prec);
        DDP_K(k, matmul_fwd, a->logits, lnf, m->wv.lm_head, NULL, rows, C, V, ld, DDP_W_OUT_IN);
        DDP_K(k, xent_fwd_bwd, a->losses + r0, train ? a->logits : NULL, a->logits, a->targets + r0,
              rows, V, ld, dloss);
        if (train)
            DDP_K(k, matmul_bwd, ddp_act_at(a->dlnf, r0 * C, a->prec), m->gv.lm_head, NULL,
                  a->logits, lnf, m->wv.lm_head, rows, C, V, ld, DDP_W_OUT_IN);
    }
}

/* The mean of acts.losses' rows of the last pass, in row order in double, to *loss (may be
 * NULL): a copy to the host, which waits for the stream. */
static int read_loss(ddp_model_t *m, float *loss)
{
    ddp_kernels_t *k = m->k;
    ddp_model_acts_t *a = &m->acts;
    size_t BT = (size_t)a->last_B * a->last_T;
    float *host_losses = ddp_malloc(BT * sizeof(float));
    if (!host_losses) return DDP_ENOMEM;
    int rc = ddp_k_memcpy_d2h(k, host_losses, a->losses, BT * sizeof(float));
    double sum = 0;
    for (size_t i = 0; i < BT; i++) sum += host_losses[i];
    free(host_losses);
    if (loss) *loss = (float)(sum / (double)BT);
    return rc;
}

int ddp_model_forward(ddp_model_t *m, const int32_t *inputs, const int32_t *targets, int B, int T)
{
    if (!targets) return DDP_EINVAL;
    DDP_CHECK(forward_blocks(m, inputs, targets, B, T));
    int64_t tr = ddp_trace_begin();
    /* the LM head's share of wte is the first gradient written: the arena starts at zero */
    DDP_CHECK(ddp_k_memset0(m->k, m->g, m->n_params * sizeof(float)));
    lm_head_loss(m, 1);
    m->acts.last_train = 1;
    ddp_trace_end(DDP_TRACE_COMPUTE, tr, "forward ln_f, lm_head, loss (and their backward)");
    return 0;
}

int ddp_model_evaluate(ddp_model_t *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                       float *loss)
{
    if (!targets) return DDP_EINVAL;
    DDP_CHECK(forward_blocks(m, inputs, targets, B, T));
    lm_head_loss(m, 0);
    return read_loss(m, loss);
}

int ddp_model_losses(ddp_model_t *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                     float *losses)
{
    if (!targets || !losses) return DDP_EINVAL;
    DDP_CHECK(forward_blocks(m, inputs, targets, B, T));
    lm_head_loss(m, 0);
    return ddp_k_memcpy_d2h(m->k, losses, m->acts.losses, (size_t)B * T * sizeof(float));
}

int ddp_model_next_logits(ddp_model_t *m, const int32_t *inputs, int B, int T, int pos)
{
    if (pos < 0 || pos >= T) return DDP_EINVAL;
    DDP_CHECK(forward_blocks(m, inputs, NULL, B, T));
    ddp_model_acts_t *a = &m->acts;
    /* position pos of each sequence, gathered into dc (free after the blocks) */
    int C = m->cfg.n_embd;
    size_t row = (size_t)C * ddp_act_bytes(a->prec);
    for (int b = 0; b < B; b++)
        DDP_CHECK(ddp_k_memcpy_d2d(m->k, ddp_act_at(a->dc, (size_t)b * C, a->prec),
                                   ddp_act_at(a->lnf, ((size_t)b * T + pos) * C, a->prec), row));
    int V = m->cfg.vocab_size;
    DDP_K(m->k, matmul_fwd, a->logits, a->dc, m->wv.lm_head, NULL, B, C, V, ddp_logits_ld(V),
          DDP_W_OUT_IN);
    return ddp_k_sync(m->k);
}

int ddp_model_backward(ddp_model_t *m, ddp_model_ready_fn ready, void *arg, float *loss)
{
    ddp_kernels_t *k = m->k;
    ddp_model_acts_t *a = &m->acts;
    if (!a->last_train) return DDP_EINVAL;
    int B = a->last_B, T = a->last_T;
    const ddp_model_dims_t *d = &m->d;
    int C = d->C, L = m->cfg.n_layer, llama = m->cfg.arch == DDP_ARCH_LLAMA;
    ddp_wlayout_t wl = m->wlayout;
    size_t BT = (size_t)B * T;
    size_t sBTC = (size_t)a->B * a->T * C;
    const ddp_model_views_t *gv = &m->gv;

    int64_t tr = ddp_trace_begin();
    /* the LM head's gradient is complete (forward did it): the largest tensor starts reducing
     * first */
    size_t done = m->params[0].numel;
    if (ready) ready(arg, done);
    DDP_CHECK(ddp_k_memset0(k, a->dres, BT * C * sizeof(float)));
    const float *xlast = a->res3 + (L - 1) * sBTC;
    norm_backward(m, a->dres, a->dres_act, gv->lnfw, gv->lnfb, a->dlnf, xlast, m->wv.lnfw,
                  a->lnf_mean, a->lnf_rstd, (int)BT);
    if (ready) ready(arg, m->lnf_end);
    ddp_trace_end(DDP_TRACE_COMPUTE, tr, "backward ln_f");

    for (int l = L - 1; l >= 0; l--) {
        if (m->interrupted && m->interrupted(m->interrupted_arg)) return DDP_EABORTED;
        tr = ddp_trace_begin();
        const ddp_model_block_t *w = &m->wv.h[l], *g = &gv->h[l];
        const float *x = l ? a->res3 + (l - 1) * sBTC : a->encoded;
        /* recompute: the block's activations again, from its input (a->dc is free here) */
        if (a->recompute == DDP_RECOMPUTE_BLOCK) block_forward(m, l, x, NULL, B, T);
        layer_acts_t s = layer_acts(m, l);

        /* MLP: res3 = res2 + fcproj(act(fc(norm2(res2)))); the branch's gradient enters it in
         * the activations' type (dres_act, which the norm backward before wrote with dres) */
        if (llama) {
            DDP_K(k, matmul_bwd, a->dfch, g->fcprojw, g->fcprojb, a->dres_act, s.fchg, w->fcprojw,
                  (int)BT, d->H, C, C, wl);
            DDP_K(k, swiglu_bwd, a->dfc, s.fch, a->dfch, (int)BT, d->H);
        } else { /* the GELU's gradient in the product's pass */
            DDP_K(k, matmul_dgelu_bwd, a->dfc, g->fcprojw, g->fcprojb, a->dres_act, s.fchg, s.fch,
                  w->fcprojw, (int)BT, d->H, C, wl);
        }
        DDP_K(k, matmul_bwd, a->dc, g->fcw, g->fcb, a->dfc, s.ln2, w->fcw, (int)BT, C, d->FH, d->FH,
              wl);
        norm_backward(m, a->dres, a->dres_act, g->ln2w, g->ln2b, a->dc, s.res2, w->ln2w, s.ln2_mean,
                      s.ln2_rstd, (int)BT);

        /* attention: res2 = x + attproj(attn(rope(qkv(norm1(x))))) */
        DDP_K(k, matmul_bwd, a->dc, g->attprojw, g->attprojb, a->dres_act, s.atty, w->attprojw,
              (int)BT, C, C, C, wl);
        DDP_K(k, attention_bwd, a->dqkv, a->dc, s.qkv, s.atty, s.lse, B, T, C, d->NH, d->NKV);
        if (llama) DDP_K(k, rope_bwd, a->dqkv, a->rope, B, T, d->NH, d->NKV, d->hs);
        DDP_K(k, matmul_bwd, a->dc, g->qkvw, g->qkvb, a->dqkv, s.ln1, w->qkvw, (int)BT, C, d->QKV,
              d->QKV, wl);
        norm_backward(m, a->dres, l ? a->dres_act : NULL, g->ln1w, g->ln1b, a->dc, x, w->ln1w,
                      s.ln1_mean, s.ln1_rstd, (int)BT);

        if (ready) ready(arg, m->block_end[l]);
        ddp_trace_end(DDP_TRACE_COMPUTE, tr, "backward h.%d", l);
    }
    /* GPT-2's wpe; the embedding's share of wte is added by ddp_model_embed_backward */
    if (gv->wpe) DDP_K(k, encoder_bwd, NULL, gv->wpe, a->dres, a->inputs, B, T, C);
    DDP_CHECK(ddp_k_sync(k));
    if (ready) ready(arg, m->n_params);
    return read_loss(m, loss); /* the stream is idle: the copy does not stall it */
}

void ddp_model_embed_backward(ddp_model_t *m, const int32_t *inputs, const float *dres, int B,
                              int T)
{
    DDP_K(m->k, encoder_bwd, m->gv.wte, NULL, dres, inputs, B, T, m->cfg.n_embd);
}
