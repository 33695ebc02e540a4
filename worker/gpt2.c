/* GPT-2 layout, initialisation, forward and backward over the kernel backend.
 *
 * Invariants: m->params is in arena order (backward completion order, see gpt2.h); views are
 * computed from it, so the layout is written down exactly once (layout_tensors below).
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

/* Calls add(ctx, name, ndim, d0, d1, decay) for every tensor in arena order. The one place the
 * layout is defined. */
typedef void (*tensor_fn)(void *ctx, const char *name, int ndim, int d0, int d1, int decay);

static void layout_tensors(const ddp_model_cfg_t *cfg, tensor_fn add, void *ctx)
{
    int C = cfg->n_embd;
    char n[DDP_GPT2_NAME_MAX];
    add(ctx, "wte.weight", 2, cfg->vocab_size, C, 1);
    add(ctx, "ln_f.weight", 1, C, 0, 0);
    add(ctx, "ln_f.bias", 1, C, 0, 0);
    for (int l = cfg->n_layer - 1; l >= 0; l--) {
#define T_(suffix, ndim, d0, d1)                                                             \
    snprintf(n, sizeof n, "h.%d." suffix, l);                                                \
    add(ctx, n, ndim, d0, d1, ndim == 2)
        T_("mlp.c_proj.weight", 2, 4 * C, C);
        T_("mlp.c_proj.bias", 1, C, 0);
        T_("mlp.c_fc.weight", 2, C, 4 * C);
        T_("mlp.c_fc.bias", 1, 4 * C, 0);
        T_("ln_2.weight", 1, C, 0);
        T_("ln_2.bias", 1, C, 0);
        T_("attn.c_proj.weight", 2, C, C);
        T_("attn.c_proj.bias", 1, C, 0);
        T_("attn.c_attn.weight", 2, C, 3 * C);
        T_("attn.c_attn.bias", 1, 3 * C, 0);
        T_("ln_1.weight", 1, C, 0);
        T_("ln_1.bias", 1, C, 0);
#undef T_
    }
    add(ctx, "wpe.weight", 2, cfg->block_size, C, 1);
}

/* Tensors per block, and the tensors before the last block's first one (wte, ln_f x2). */
#define TENSORS_PER_BLOCK 12
#define TENSORS_BEFORE_BLOCKS 3

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

size_t ddp_gpt2_count_params(const ddp_model_cfg_t *cfg)
{
    layout_ctx_t c = {0};
    layout_tensors(cfg, add_tensor, &c);
    return c.offset;
}

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

/* Carves the activation arena; with base == NULL only counts floats. */
static size_t carve_acts(ddp_gpt2_acts_t *a, const ddp_model_cfg_t *cfg, float *base)
{
    size_t L = cfg->n_layer, C = cfg->n_embd, NH = cfg->n_head, V = cfg->vocab_size;
    size_t BT = (size_t)a->B * a->T, att = (size_t)a->B * NH * a->T * a->T;
    size_t off = 0;
#define CARVE(field, n)                                                                      \
    do {                                                                                     \
        a->field = base ? base + off : NULL;                                                 \
        off += ((n) + 15) & ~(size_t)15; /* 64-byte aligned tensors */                       \
    } while (0)
    CARVE(encoded, BT * C);
    CARVE(ln1, L * BT * C);
    CARVE(ln1_mean, L * BT);
    CARVE(ln1_rstd, L * BT);
    CARVE(qkv, L * BT * 3 * C);
    CARVE(atty, L * BT * C);
    CARVE(att, L * att);
    CARVE(res2, L * BT * C);
    CARVE(ln2, L * BT * C);
    CARVE(ln2_mean, L * BT);
    CARVE(ln2_rstd, L * BT);
    CARVE(fch, L * BT * 4 * C);
    CARVE(fch_gelu, L * BT * 4 * C);
    CARVE(res3, L * BT * C);
    CARVE(lnf, BT * C);
    CARVE(lnf_mean, BT);
    CARVE(lnf_rstd, BT);
    CARVE(logits, BT * V);
    CARVE(losses, BT);
    CARVE(dres, BT * C);
    CARVE(dc, BT * C);
    CARVE(dc2, BT * C);
    CARVE(dqkv, BT * 3 * C);
    CARVE(datt, att);
    CARVE(dfc, BT * 4 * C);
    CARVE(dfc2, BT * 4 * C);
    /* int32 token buffers share the float arena (same size, 4 bytes) */
    a->inputs = base ? (int32_t *)(base + off) : NULL;
    off += (BT + 15) & ~(size_t)15;
    a->targets = base ? (int32_t *)(base + off) : NULL;
    off += (BT + 15) & ~(size_t)15;
#undef CARVE
    return off;
}

int ddp_gpt2_init(ddp_gpt2_t *m, const ddp_model_cfg_t *cfg, ddp_kernels_t *k, int B, int T,
                  float *weights, float *grads)
{
    memset(m, 0, sizeof *m);
    DDP_CHECK(validate_cfg(cfg, B, T));
    m->cfg = *cfg;
    m->k = k;
    int rc = 0;
    layout_ctx_t c = {0};
    layout_tensors(cfg, add_tensor, &c);
    m->n_tensors = c.n;
    m->n_params = c.offset;
    m->params = ddp_calloc((size_t)c.n, sizeof *m->params);
    m->wv.h = ddp_calloc((size_t)cfg->n_layer, sizeof *m->wv.h);
    m->gv.h = ddp_calloc((size_t)cfg->n_layer, sizeof *m->gv.h);
    if (!m->params || !m->wv.h || !m->gv.h) {
        rc = DDP_ENOMEM;
        goto fail;
    }
    c = (layout_ctx_t){.out = m->params};
    layout_tensors(cfg, add_tensor, &c);

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
    size_t n_acts = carve_acts(&m->acts, cfg, NULL);
    DDP_CHECK_GOTO(ddp_k_alloc(k, (void **)&m->acts.base, n_acts * sizeof(float)), rc,
                   fail);
    carve_acts(&m->acts, cfg, m->acts.base);
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

int ddp_gpt2_forward(ddp_gpt2_t *m, const int32_t *inputs, const int32_t *targets, int B, int T,
                     float *loss)
{
    ddp_kernels_t *k = m->k;
    ddp_gpt2_acts_t *a = &m->acts;
    if (B < 1 || T < 1 || B > a->B || T > a->T) return DDP_EINVAL;
    int C = m->cfg.n_embd, NH = m->cfg.n_head, V = m->cfg.vocab_size, L = m->cfg.n_layer;
    size_t BT = (size_t)B * T;
    /* Per-layer strides use the allocated B x T, so a smaller batch leaves slack, never
     * overlap. */
    size_t sBTC = (size_t)a->B * a->T * C, sBT = (size_t)a->B * a->T;
    size_t sATT = (size_t)a->B * NH * a->T * a->T;
    for (size_t i = 0; i < BT; i++)
        if (inputs[i] < 0 || inputs[i] >= V || (targets && (targets[i] < 0 || targets[i] >= V)))
            return DDP_EINVAL;

    DDP_CHECK(ddp_k_memcpy_h2d(k, a->inputs, inputs, BT * sizeof(int32_t)));
    if (targets) DDP_CHECK(ddp_k_memcpy_h2d(k, a->targets, targets, BT * sizeof(int32_t)));

    DDP_K(k, encoder_fwd, a->encoded, a->inputs, m->wv.wte, m->wv.wpe, B, T, C);
    const float *x = a->encoded;
    for (int l = 0; l < L; l++) {
        int64_t tr = ddp_trace_begin();
        const ddp_gpt2_block_t *w = &m->wv.h[l];
        float *ln1 = a->ln1 + l * sBTC, *qkv = a->qkv + 3 * l * sBTC, *atty = a->atty + l * sBTC;
        float *res2 = a->res2 + l * sBTC, *ln2 = a->ln2 + l * sBTC, *res3 = a->res3 + l * sBTC;
        float *fch = a->fch + 4 * l * sBTC, *fchg = a->fch_gelu + 4 * l * sBTC;
        DDP_K(k, layernorm_fwd, ln1, a->ln1_mean + l * sBT, a->ln1_rstd + l * sBT, x, w->ln1w,
              w->ln1b, (int)BT, C);
        DDP_K(k, matmul_fwd, qkv, ln1, w->qkvw, w->qkvb, (int)BT, C, 3 * C, DDP_W_IN_OUT);
        DDP_K(k, attention_fwd, atty, a->att + l * sATT, qkv, B, T, C, NH);
        DDP_K(k, matmul_fwd, a->dc, atty, w->attprojw, w->attprojb, (int)BT, C, C, DDP_W_IN_OUT);
        DDP_K(k, residual_fwd, res2, x, a->dc, BT * C);
        DDP_K(k, layernorm_fwd, ln2, a->ln2_mean + l * sBT, a->ln2_rstd + l * sBT, res2, w->ln2w,
              w->ln2b, (int)BT, C);
        DDP_K(k, matmul_fwd, fch, ln2, w->fcw, w->fcb, (int)BT, C, 4 * C, DDP_W_IN_OUT);
        DDP_K(k, gelu_fwd, fchg, fch, BT * 4 * C);
        DDP_K(k, matmul_fwd, a->dc, fchg, w->fcprojw, w->fcprojb, (int)BT, 4 * C, C,
              DDP_W_IN_OUT);
        DDP_K(k, residual_fwd, res3, res2, a->dc, BT * C);
        x = res3;
        ddp_trace_end(DDP_TRACE_COMPUTE, tr, "forward h.%d", l);
    }
    int64_t tr = ddp_trace_begin();
    DDP_K(k, layernorm_fwd, a->lnf, a->lnf_mean, a->lnf_rstd, x, m->wv.lnfw, m->wv.lnfb, (int)BT,
          C);
    DDP_K(k, matmul_fwd, a->logits, a->lnf, m->wv.wte, NULL, (int)BT, C, V, DDP_W_OUT_IN);
    a->last_B = B;
    a->last_T = T;
    a->last_had_targets = targets != NULL;
    if (!targets) return ddp_k_sync(k);

    DDP_K(k, xent_fwd_bwd, a->losses, NULL, a->logits, a->targets, (int)BT, V, 0.0f);
    float *host_losses = ddp_malloc(BT * sizeof(float));
    if (!host_losses) return DDP_ENOMEM;
    int rc = ddp_k_memcpy_d2h(k, host_losses, a->losses, BT * sizeof(float));
    if (rc == 0) rc = ddp_k_sync(k);
    double sum = 0;
    for (size_t i = 0; i < BT; i++) sum += host_losses[i];
    free(host_losses);
    if (loss) *loss = (float)(sum / (double)BT);
    ddp_trace_end(DDP_TRACE_COMPUTE, tr, "forward ln_f, lm_head, loss");
    return rc;
}

int ddp_gpt2_backward(ddp_gpt2_t *m, ddp_gpt2_ready_fn ready, void *arg)
{
    ddp_kernels_t *k = m->k;
    ddp_gpt2_acts_t *a = &m->acts;
    if (!a->last_had_targets) return DDP_EINVAL;
    int B = a->last_B, T = a->last_T;
    int C = m->cfg.n_embd, NH = m->cfg.n_head, V = m->cfg.vocab_size, L = m->cfg.n_layer;
    size_t BT = (size_t)B * T;
    size_t sBTC = (size_t)a->B * a->T * C, sBT = (size_t)a->B * a->T;
    size_t sATT = (size_t)a->B * NH * a->T * a->T;
    const ddp_gpt2_views_t *gv = &m->gv;

    int64_t tr = ddp_trace_begin();
    DDP_CHECK(ddp_k_memset0(k, m->g, m->n_params * sizeof(float)));
    /* d(mean loss)/dlogits, written over the logits */
    DDP_K(k, xent_fwd_bwd, a->losses, a->logits, a->logits, a->targets, (int)BT, V,
          1.0f / (float)BT);
    DDP_CHECK(ddp_k_memset0(k, a->dc, BT * C * sizeof(float)));
    DDP_K(k, matmul_bwd, a->dc, gv->wte, NULL, a->logits, a->lnf, m->wv.wte, (int)BT, C, V,
          DDP_W_OUT_IN);
    /* wte's share from the LM head is complete: the largest tensor starts reducing first */
    size_t done = m->params[0].numel;
    if (ready) {
        DDP_CHECK(ddp_k_sync(k));
        ready(arg, done);
    }
    DDP_CHECK(ddp_k_memset0(k, a->dres, BT * C * sizeof(float)));
    const float *xlast = a->res3 + (L - 1) * sBTC;
    DDP_K(k, layernorm_bwd, a->dres, gv->lnfw, gv->lnfb, a->dc, xlast, m->wv.lnfw, a->lnf_mean,
          a->lnf_rstd, (int)BT, C);
    done = m->params[2].offset + m->params[2].numel;
    if (ready) {
        DDP_CHECK(ddp_k_sync(k));
        ready(arg, done);
    }
    ddp_trace_end(DDP_TRACE_COMPUTE, tr, "backward loss, lm_head, ln_f");

    for (int l = L - 1; l >= 0; l--) {
        tr = ddp_trace_begin();
        const ddp_gpt2_block_t *w = &m->wv.h[l], *g = &gv->h[l];
        const float *x = l ? a->res3 + (l - 1) * sBTC : a->encoded;
        float *ln1 = a->ln1 + l * sBTC, *qkv = a->qkv + 3 * l * sBTC, *atty = a->atty + l * sBTC;
        float *res2 = a->res2 + l * sBTC, *ln2 = a->ln2 + l * sBTC;
        float *fch = a->fch + 4 * l * sBTC, *fchg = a->fch_gelu + 4 * l * sBTC;

        /* MLP: res3 = res2 + fcproj(gelu(fc(ln2(res2)))) */
        DDP_CHECK(ddp_k_memset0(k, a->dfc, BT * 4 * C * sizeof(float)));
        DDP_K(k, matmul_bwd, a->dfc, g->fcprojw, g->fcprojb, a->dres, fchg, w->fcprojw, (int)BT,
              4 * C, C, DDP_W_IN_OUT);
        DDP_CHECK(ddp_k_memset0(k, a->dfc2, BT * 4 * C * sizeof(float)));
        DDP_K(k, gelu_bwd, a->dfc2, fch, a->dfc, BT * 4 * C);
        DDP_CHECK(ddp_k_memset0(k, a->dc, BT * C * sizeof(float)));
        DDP_K(k, matmul_bwd, a->dc, g->fcw, g->fcb, a->dfc2, ln2, w->fcw, (int)BT, C, 4 * C,
              DDP_W_IN_OUT);
        DDP_K(k, layernorm_bwd, a->dres, g->ln2w, g->ln2b, a->dc, res2, w->ln2w,
              a->ln2_mean + l * sBT, a->ln2_rstd + l * sBT, (int)BT, C);

        /* attention: res2 = x + attproj(attn(qkv(ln1(x)))) */
        DDP_CHECK(ddp_k_memset0(k, a->dc, BT * C * sizeof(float)));
        DDP_K(k, matmul_bwd, a->dc, g->attprojw, g->attprojb, a->dres, atty, w->attprojw,
              (int)BT, C, C, DDP_W_IN_OUT);
        DDP_CHECK(ddp_k_memset0(k, a->dqkv, BT * 3 * C * sizeof(float)));
        DDP_K(k, attention_bwd, a->dqkv, a->datt, a->dc, qkv, a->att + l * sATT, B, T, C, NH);
        DDP_CHECK(ddp_k_memset0(k, a->dc2, BT * C * sizeof(float)));
        DDP_K(k, matmul_bwd, a->dc2, g->qkvw, g->qkvb, a->dqkv, ln1, w->qkvw, (int)BT, C, 3 * C,
              DDP_W_IN_OUT);
        DDP_K(k, layernorm_bwd, a->dres, g->ln1w, g->ln1b, a->dc2, x, w->ln1w,
              a->ln1_mean + l * sBT, a->ln1_rstd + l * sBT, (int)BT, C);

        const ddp_param_desc_t *last =
            &m->params[TENSORS_BEFORE_BLOCKS + (L - l) * TENSORS_PER_BLOCK - 1];
        done = last->offset + last->numel;
        if (ready) {
            DDP_CHECK(ddp_k_sync(k));
            ready(arg, done);
        }
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
