/* GPT-2 layout, initialisation, forward and backward over the kernel backend.
 *
 * Invariants: m->params is in arena order (backward completion order, see gpt2.h); views are
 * computed from it, so the layout is written down exactly once (gpt2_layout.c).
 * Backward reports the finished prefix of the arena after the LM head, ln_f and each block.
 */
#include "gpt2.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "common/trace.h"

/* Tensors per block, and the tensors before the last block's first one (wte, ln_f x2). */
#define TENSORS_PER_BLOCK 12
#define TENSORS_BEFORE_BLOCKS 3

/* Fills views for an arena at `base` from the descriptors. */
static void make_views(const ddp_gpt2_t *m, float *base, ddp_gpt2_views_t *v)
{
    const ddp_param_desc_t *p = m->params;
    int L = m->cfg.n_layer;
    v->wte = base + p[0].offset;
    v->lnfw = base + p[1].offset;
    v->lnfb = base + p[2].offset;
    for (int l = L - 1; l >= 0; l--) {
        const ddp_param_desc_t *q = &p[TENSORS_BEFORE_BLOCKS + (L - 1 - l) * TENSORS_PER_BLOCK];
        ddp_gpt2_block_t *b = &v->h[l];
        float **dst[TENSORS_PER_BLOCK] = {&b->fcprojw, &b->fcprojb, &b->fcw,  &b->fcb,
                                          &b->ln2w,    &b->ln2b,    &b->attprojw, &b->attprojb,
                                          &b->qkvw,    &b->qkvb,    &b->ln1w, &b->ln1b};
        for (int i = 0; i < TENSORS_PER_BLOCK; i++) *dst[i] = base + q[i].offset;
    }
    v->wpe = base + p[m->n_tensors - 1].offset;
}

static int validate_cfg(const ddp_model_cfg_t *cfg, int B, int T)
{
    if (cfg->n_layer < 1 || cfg->n_head < 1 || cfg->n_embd < 1 || cfg->vocab_size < 1 ||
        cfg->block_size < 1 || cfg->n_embd % cfg->n_head || B < 1 || T < 1 ||
        T > cfg->block_size) {
        DDP_ERROR("gpt2: invalid configuration (L=%d NH=%d C=%d V=%d block=%d B=%d T=%d)",
                  cfg->n_layer, cfg->n_head, cfg->n_embd, cfg->vocab_size, cfg->block_size, B,
                  T);
        return DDP_EINVAL;
    }
    return 0;
}

int ddp_gpt2_init(ddp_gpt2_t *m, const ddp_model_cfg_t *cfg, ddp_kernels_t *k, int B, int T,
                  float *weights, float *grads)
{
    return ddp_gpt2_init_with(m, cfg, k, B, T, weights, grads, DDP_RECOMPUTE_NONE);
}

int ddp_gpt2_init_with(ddp_gpt2_t *m, const ddp_model_cfg_t *cfg, ddp_kernels_t *k, int B,
                       int T, float *weights, float *grads, ddp_recompute_t recompute)
{
    memset(m, 0, sizeof *m);
    DDP_CHECK(validate_cfg(cfg, B, T));
    m->cfg = *cfg;
    m->k = k;
    m->loss_scale = 1.0f;
    int rc = 0;
    m->n_tensors = ddp__gpt2_layout(cfg, NULL, &m->n_params);
    m->params = ddp_calloc((size_t)m->n_tensors, sizeof *m->params);
    m->wv.h = ddp_calloc((size_t)cfg->n_layer, sizeof *m->wv.h);
    m->gv.h = ddp_calloc((size_t)cfg->n_layer, sizeof *m->gv.h);
    if (!m->params || !m->wv.h || !m->gv.h) {
        rc = DDP_ENOMEM;
        goto fail;
    }
    ddp__gpt2_layout(cfg, m->params, &m->n_params);

    m->w = weights;
    m->g = grads;
    m->borrowed_w = weights != NULL;
    m->borrowed_g = grads != NULL;
    if (!m->borrowed_w)
        DDP_CHECK_GOTO(ddp_k_alloc(k, (void **)&m->w, m->n_params * sizeof(float)), rc,
                       fail);
    if (!m->borrowed_g)
        DDP_CHECK_GOTO(ddp_k_alloc(k, (void **)&m->g, m->n_params * sizeof(float)), rc,
                       fail);
    make_views(m, m->w, &m->wv);
    make_views(m, m->g, &m->gv);

    m->acts.B = B;
    m->acts.T = T;
    m->acts.recompute = recompute;
    m->acts.prec = ddp_k_precision(k);
    size_t acts_bytes = ddp__gpt2_carve_acts(&m->acts, cfg, NULL);
    DDP_CHECK_GOTO(ddp_k_alloc(k, &m->acts.base, acts_bytes), rc, fail);
    ddp__gpt2_carve_acts(&m->acts, cfg, m->acts.base);
    return 0;
fail:
    ddp_gpt2_close(m);
    return rc;
}

void ddp_gpt2_close(ddp_gpt2_t *m)
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
    memset(m, 0, sizeof *m);
}

int ddp_gpt2_set_grads(ddp_gpt2_t *m, float *grads)
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

int ddp_gpt2_init_weights(ddp_gpt2_t *m, ddp_rng_t *rng)
{
    float *host = ddp_malloc(m->n_params * sizeof(float));
    if (!host) return DDP_ENOMEM;
    float proj_std = 0.02f / sqrtf(2.0f * (float)m->cfg.n_layer);
    for (int i = 0; i < m->n_tensors; i++) {
        const ddp_param_desc_t *p = &m->params[i];
        float *dst = host + p->offset;
        const char *leaf = strrchr(p->name, '.') + 1;
        int is_ln = strstr(p->name, "ln_") != NULL;
        if (!strcmp(leaf, "bias")) {
            memset(dst, 0, p->numel * sizeof(float));
        } else if (is_ln) {
            for (size_t j = 0; j < p->numel; j++) dst[j] = 1.0f;
        } else {
            float std = strstr(p->name, "c_proj.weight") ? proj_std : 0.02f;
            for (size_t j = 0; j < p->numel; j++) dst[j] = (float)ddp_rng_normal(rng) * std;
        }
    }
    int rc = ddp_k_memcpy_h2d(m->k, m->w, host, m->n_params * sizeof(float));
    free(host);
    return rc;
}

const ddp_param_desc_t *ddp_gpt2_find(const ddp_gpt2_t *m, const char *name)
{
    if (!strncmp(name, "transformer.", 12)) name += 12;
    for (int i = 0; i < m->n_tensors; i++)
        if (!strcmp(m->params[i].name, name)) return &m->params[i];
    return NULL;
}

/* Layer l's saved activations: slice l of each per-layer tensor, or under recompute the one
 * slice that every block's forward writes (see gpt2_layout.c). */
typedef struct {
    ddp_act_t *ln1, *qkv, *atty, *ln2, *fch, *fchg;
    float *ln1_mean, *ln1_rstd, *lse, *res2, *ln2_mean, *ln2_rstd;
} layer_acts_t;

static layer_acts_t layer_acts(const ddp_gpt2_t *m, int l)
{
    const ddp_gpt2_acts_t *a = &m->acts;
    ddp_kprec_t p = a->prec;
    /* strides use the allocated B x T, so a smaller batch leaves slack, never overlap */
    size_t s = a->recompute == DDP_RECOMPUTE_BLOCK ? 0 : (size_t)l;
    size_t BT = (size_t)a->B * a->T, C = (size_t)m->cfg.n_embd;
    size_t sBTC = s * BT * C, sBT = s * BT;
    return (layer_acts_t){
        .ln1 = ddp_act_at(a->ln1, sBTC, p), .qkv = ddp_act_at(a->qkv, 3 * sBTC, p),
        .atty = ddp_act_at(a->atty, sBTC, p), .ln2 = ddp_act_at(a->ln2, sBTC, p),
        .fch = ddp_act_at(a->fch, 4 * sBTC, p), .fchg = ddp_act_at(a->fch_gelu, 4 * sBTC, p),
        .ln1_mean = a->ln1_mean + sBT, .ln1_rstd = a->ln1_rstd + sBT,
        .lse = a->lse + sBT * m->cfg.n_head, .res2 = a->res2 + sBTC,
        .ln2_mean = a->ln2_mean + sBT, .ln2_rstd = a->ln2_rstd + sBT};
}

/* Block l's forward on its input x[B,T,C] into its saved activations (a->dc is scratch); with
 * out non-NULL also the MLP's projection and the residual: out[B,T,C] = the block's output.
 * Backward's recomputation passes out NULL: it needs neither. The same ops on the same inputs,
 * so a recomputed activation is bitwise the one the forward saw. */
static void block_forward(ddp_gpt2_t *m, int l, const float *x, float *out, int B, int T)
{
    ddp_kernels_t *k = m->k;
    ddp_act_t *dc = m->acts.dc;
    int C = m->cfg.n_embd, NH = m->cfg.n_head, BT = B * T;
    const ddp_gpt2_block_t *w = &m->wv.h[l];
    layer_acts_t s = layer_acts(m, l);
    DDP_K(k, layernorm_fwd, s.ln1, s.ln1_mean, s.ln1_rstd, x, w->ln1w, w->ln1b, BT, C);
    DDP_K(k, matmul_fwd, s.qkv, s.ln1, w->qkvw, w->qkvb, BT, C, 3 * C, DDP_W_IN_OUT);
    DDP_K(k, attention_fwd, s.atty, s.lse, s.qkv, B, T, C, NH, NH);
    DDP_K(k, matmul_fwd, dc, s.atty, w->attprojw, w->attprojb, BT, C, C, DDP_W_IN_OUT);
    DDP_K(k, residual_fwd, s.res2, x, dc, (size_t)BT * C);
    DDP_K(k, layernorm_fwd, s.ln2, s.ln2_mean, s.ln2_rstd, s.res2, w->ln2w, w->ln2b, BT, C);
    DDP_K(k, matmul_fwd, s.fch, s.ln2, w->fcw, w->fcb, BT, C, 4 * C, DDP_W_IN_OUT);
    DDP_K(k, gelu_fwd, s.fchg, s.fch, (size_t)BT * 4 * C);
    if (!out) return;
    DDP_K(k, matmul_fwd, dc, s.fchg, w->fcprojw, w->fcprojb, BT, 4 * C, C, DDP_W_IN_OUT);
    DDP_K(k, residual_fwd, out, s.res2, dc, (size_t)BT * C);
}

/* The blocks and ln_f on inputs[B,T] (checked against V, and targets too when given), which
 * are copied to the device with the targets. */
static int forward_blocks(ddp_gpt2_t *m, const int32_t *inputs, const int32_t *targets, int B,
                          int T)
{
    ddp_kernels_t *k = m->k;
    ddp_gpt2_acts_t *a = &m->acts;
    if (B < 1 || T < 1 || B > a->B || T > a->T) return DDP_EINVAL;
    if (ddp_k_precision(k) != a->prec) {
        DDP_ERROR("gpt2: the activations are %s-bit but the kernels' precision changed since",
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

    DDP_K(k, encoder_fwd, a->encoded, a->inputs, m->wv.wte, m->wv.wpe, B, T, C);
    const float *x = a->encoded;
    for (int l = 0; l < L; l++) {
        if (m->interrupted && m->interrupted(m->interrupted_arg)) return DDP_EABORTED;
        int64_t tr = ddp_trace_begin();
        float *res3 = a->res3 + l * sBTC;
        block_forward(m, l, x, res3, B, T);
        x = res3;
        ddp_trace_end(DDP_TRACE_COMPUTE, tr, "forward h.%d", l);
    }
    DDP_K(k, layernorm_fwd, a->lnf, a->lnf_mean, a->lnf_rstd, x, m->wv.lnfw, m->wv.lnfb, (int)BT,
          C);
    a->last_B = B;
    a->last_T = T;
    return 0;
}

/* The LM head and the loss over the BT rows of ln_f's output, a chunk of acts.lm_rows rows at a
 * time, in row order; with `train` each chunk's backward too: dlogits (over the logits) into
 * dlnf and the gradient arena's wte. Then the mean loss to *loss (one sync). */
static int lm_head_loss(ddp_gpt2_t *m, int train, float *loss)
{
    ddp_kernels_t *k = m->k;
    ddp_gpt2_acts_t *a = &m->acts;
    int C = m->cfg.n_embd, V = m->cfg.vocab_size;
    size_t BT = (size_t)a->last_B * a->last_T;
    float dloss = m->loss_scale / (float)BT;
    for (size_t r0 = 0; r0 < BT; r0 += (size_t)a->lm_rows) {
        int rows = (int)(BT - r0 < (size_t)a->lm_rows ? BT - r0 : (size_t)a->lm_rows);
        const ddp_act_t *lnf = ddp_act_at(a->lnf, r0 * C, a->prec);
        DDP_K(k, matmul_fwd, a->logits, lnf, m->wv.wte, NULL, rows, C, V, DDP_W_OUT_IN);
        DDP_K(k, xent_fwd_bwd, a->losses + r0, train ? a->logits : NULL, a->logits,
              a->targets + r0, rows, V, dloss);
        if (train)
            DDP_K(k, matmul_bwd, ddp_act_at(a->dlnf, r0 * C, a->prec), m->gv.wte, NULL,
                  a->logits, lnf, m->wv.wte, rows, C, V, DDP_W_OUT_IN);
    }
    float *host_losses = ddp_malloc(BT * sizeof(float));
    if (!host_losses) return DDP_ENOMEM;
    int rc = ddp_k_memcpy_d2h(k, host_losses, a->losses, BT * sizeof(float));
    if (rc == 0) rc = ddp_k_sync(k);
    double sum = 0;
    for (size_t i = 0; i < BT; i++) sum += host_losses[i];
    free(host_losses);
    if (loss) *loss = (float)(sum / (double)BT);
    return rc;
}

int ddp_gpt2_forward(ddp_gpt2_t *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                     float *loss)
{
    if (!targets) return DDP_EINVAL;
    DDP_CHECK(forward_blocks(m, inputs, targets, B, T));
    int64_t tr = ddp_trace_begin();
    /* the LM head's share of wte is the first gradient written: the arena starts at zero */
    DDP_CHECK(ddp_k_memset0(m->k, m->g, m->n_params * sizeof(float)));
    DDP_CHECK(lm_head_loss(m, 1, loss));
    m->acts.last_train = 1;
    ddp_trace_end(DDP_TRACE_COMPUTE, tr, "forward ln_f, lm_head, loss (and their backward)");
    return 0;
}

int ddp_gpt2_evaluate(ddp_gpt2_t *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                      float *loss)
{
    DDP_CHECK(forward_blocks(m, inputs, targets, B, T));
    ddp_gpt2_acts_t *a = &m->acts;
    if (targets) return lm_head_loss(m, 0, loss);
    /* each sequence's last position, gathered into dc (free after the blocks) */
    int C = m->cfg.n_embd;
    size_t row = (size_t)C * ddp_act_bytes(a->prec);
    for (int b = 0; b < B; b++)
        DDP_CHECK(ddp_k_memcpy_d2d(m->k, ddp_act_at(a->dc, (size_t)b * C, a->prec),
                                   ddp_act_at(a->lnf, ((size_t)b * T + T - 1) * C, a->prec),
                                   row));
    DDP_K(m->k, matmul_fwd, a->logits, a->dc, m->wv.wte, NULL, B, C, m->cfg.vocab_size,
          DDP_W_OUT_IN);
    return ddp_k_sync(m->k);
}

int ddp_gpt2_backward(ddp_gpt2_t *m, ddp_gpt2_ready_fn ready, void *arg)
{
    ddp_kernels_t *k = m->k;
    ddp_gpt2_acts_t *a = &m->acts;
    if (!a->last_train) return DDP_EINVAL;
    int B = a->last_B, T = a->last_T;
    int C = m->cfg.n_embd, NH = m->cfg.n_head, L = m->cfg.n_layer;
    size_t BT = (size_t)B * T;
    size_t sBTC = (size_t)a->B * a->T * C;
    const ddp_gpt2_views_t *gv = &m->gv;

    int64_t tr = ddp_trace_begin();
    /* wte's share from the LM head is complete (forward did it): the largest tensor starts
     * reducing first */
    size_t done = m->params[0].numel;
    if (ready) ready(arg, done);
    DDP_CHECK(ddp_k_memset0(k, a->dres, BT * C * sizeof(float)));
    const float *xlast = a->res3 + (L - 1) * sBTC;
    DDP_K(k, layernorm_bwd, a->dres, gv->lnfw, gv->lnfb, a->dlnf, xlast, m->wv.lnfw,
          a->lnf_mean, a->lnf_rstd, (int)BT, C);
    done = m->params[2].offset + m->params[2].numel;
    if (ready) ready(arg, done);
    ddp_trace_end(DDP_TRACE_COMPUTE, tr, "backward ln_f");

    for (int l = L - 1; l >= 0; l--) {
        if (m->interrupted && m->interrupted(m->interrupted_arg)) return DDP_EABORTED;
        tr = ddp_trace_begin();
        const ddp_gpt2_block_t *w = &m->wv.h[l], *g = &gv->h[l];
        const float *x = l ? a->res3 + (l - 1) * sBTC : a->encoded;
        /* recompute: the block's activations again, from its input (a->dc is free here) */
        if (a->recompute == DDP_RECOMPUTE_BLOCK) block_forward(m, l, x, NULL, B, T);
        layer_acts_t s = layer_acts(m, l);
        size_t BTC = BT * C;

        /* MLP: res3 = res2 + fcproj(gelu(fc(ln2(res2)))); the branch's gradient enters it in
         * the activations' type, as autocast casts it */
        DDP_K(k, to_act, a->dres_act, a->dres, BTC);
        DDP_K(k, matmul_bwd, a->dfc, g->fcprojw, g->fcprojb, a->dres_act, s.fchg, w->fcprojw,
              (int)BT, 4 * C, C, DDP_W_IN_OUT);
        DDP_K(k, gelu_bwd, a->dfc, s.fch, a->dfc, 4 * BTC);
        DDP_K(k, matmul_bwd, a->dc, g->fcw, g->fcb, a->dfc, s.ln2, w->fcw, (int)BT, C, 4 * C,
              DDP_W_IN_OUT);
        DDP_K(k, layernorm_bwd, a->dres, g->ln2w, g->ln2b, a->dc, s.res2, w->ln2w, s.ln2_mean,
              s.ln2_rstd, (int)BT, C);

        /* attention: res2 = x + attproj(attn(qkv(ln1(x)))) */
        DDP_K(k, to_act, a->dres_act, a->dres, BTC);
        DDP_K(k, matmul_bwd, a->dc, g->attprojw, g->attprojb, a->dres_act, s.atty, w->attprojw,
              (int)BT, C, C, DDP_W_IN_OUT);
        DDP_K(k, attention_bwd, a->dqkv, a->dc, s.qkv, s.atty, s.lse, B, T, C, NH, NH);
        DDP_K(k, matmul_bwd, a->dc, g->qkvw, g->qkvb, a->dqkv, s.ln1, w->qkvw, (int)BT, C, 3 * C,
              DDP_W_IN_OUT);
        DDP_K(k, layernorm_bwd, a->dres, g->ln1w, g->ln1b, a->dc, x, w->ln1w, s.ln1_mean,
              s.ln1_rstd, (int)BT, C);

        const ddp_param_desc_t *last =
            &m->params[TENSORS_BEFORE_BLOCKS + (L - l) * TENSORS_PER_BLOCK - 1];
        done = last->offset + last->numel;
        if (ready) ready(arg, done);
        ddp_trace_end(DDP_TRACE_COMPUTE, tr, "backward h.%d", l);
    }
    /* wpe only: the embedding's share of wte is added by ddp_gpt2_embed_backward */
    DDP_K(k, encoder_bwd, NULL, gv->wpe, a->dres, a->inputs, B, T, C);
    DDP_CHECK(ddp_k_sync(k));
    if (ready) ready(arg, m->n_params);
    return 0;
}

void ddp_gpt2_embed_backward(ddp_gpt2_t *m, const int32_t *inputs, const float *dres, int B,
                             int T)
{
    DDP_K(m->k, encoder_bwd, m->gv.wte, NULL, dres, inputs, B, T, m->cfg.n_embd);
}
