/* Unit tests of the CPU kernel backend and the backend loader.
 *
 * Every op's forward is compared with a double-precision reference (kref.c); every backward with
 * central finite differences of loss = sum(out * w) computed in double on that reference, with
 * the gradient outputs pre-filled with random values so that the contract is checked too:
 * fp32 gradients (dweight, dbias, LayerNorm's dinp, the embeddings') accumulate (+=), activation
 * gradients (matmul's and GELU's dinp, attention's dqkv) are overwritten.
 * Shapes are odd and cross the backend's block sizes. Outputs are bitwise identical for 1, 2 and
 * 3 threads. The loader is tested with a fake module (fake/) found through $DDP_KERNELS_PATH.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>

#include "common/crc32c.h"
#include "common/err.h"
#include "kernels/kernels.h"
#include "att_square.h"
#include "kref.h"
#include "ktests.h"

static ddp_kernels_t K; /* the CPU backend with 2 threads, opened in the group setup */

#define RTOL 1e-4
#define AFRAC 2e-5

static float *fdup(const float *x, size_t n)
{
    float *y = kcalloc(n, sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

static double *dalloc(size_t n) { return kcalloc(n, sizeof(double)); }
static float *falloc(size_t n) { return kcalloc(n, sizeof(float)); }

static double *dof(const float *x, size_t n)
{
    double *d = dalloc(n);
    ktod(d, x, n);
    return d;
}

/* ------------------------------------------------------------------------------------------ */
/* encoder */

typedef struct {
    double *wte, *wpe, *w, *out;
    const int32_t *inp;
    int B, T, C;
} enc_loss_t;

static double enc_loss(void *arg)
{
    enc_loss_t *e = arg;
    ref_encoder(e->out, e->inp, e->wte, e->wpe, e->B, e->T, e->C);
    return kdot(e->out, e->w, (size_t)e->B * e->T * e->C);
}

static void test_encoder(void **state)
{
    krng_t r = {1};
    int B = 3, T = 6, C = 130, V = 11;
    size_t n = (size_t)B * T * C;
    int32_t inp[18];
    for (int i = 0; i < B * T; i++) inp[i] = (int32_t)krng_below(&r, (uint32_t)V);
    inp[5] = inp[0]; /* a repeated token: its gradient sums both uses */
    float *wte = falloc((size_t)V * C), *wpe = falloc((size_t)T * C), *out = falloc(n);
    kfill(&r, wte, (size_t)V * C, -1, 1);
    kfill(&r, wpe, (size_t)T * C, -1, 1);
    DDP_K(&K, encoder_fwd, out, inp, wte, wpe, B, T, C);
    enc_loss_t e = {.wte = dof(wte, (size_t)V * C), .wpe = dof(wpe, (size_t)T * C),
                    .out = dalloc(n), .inp = inp, .B = B, .T = T, .C = C};
    ref_encoder(e.out, inp, e.wte, e.wpe, B, T, C);
    assert_int_equal(kclose("encoder out", out, e.out, n, 1e-6, 0), 0);

    float *dout = falloc(n), *dwte = falloc((size_t)V * C), *dwpe = falloc((size_t)T * C);
    kfill(&r, dout, n, -1, 1);
    kfill(&r, dwte, (size_t)V * C, -1, 1);
    kfill(&r, dwpe, (size_t)T * C, -1, 1);
    float *dwte0 = fdup(dwte, (size_t)V * C), *dwpe0 = fdup(dwpe, (size_t)T * C);
    DDP_K(&K, encoder_bwd, dwte, dwpe, dout, inp, B, T, C);
    e.w = dof(dout, n);
    assert_int_equal(kfd_check("encoder dwte", enc_loss, &e, e.wte, (size_t)V * C, dwte, dwte0,
                               4000, &r, RTOL, AFRAC), 0);
    assert_int_equal(kfd_check("encoder dwpe", enc_loss, &e, e.wpe, (size_t)T * C, dwpe, dwpe0,
                               4000, &r, RTOL, AFRAC), 0);
    free(wte), free(wpe), free(out), free(dout), free(dwte), free(dwpe), free(dwte0), free(dwpe0);
    free(e.wte), free(e.wpe), free(e.out), free(e.w);
}

/* ------------------------------------------------------------------------------------------ */
/* layernorm */

typedef struct {
    double *inp, *w, *b, *wt, *out;
    int N, C;
} ln_loss_t;

static double ln_loss(void *arg)
{
    ln_loss_t *l = arg;
    ref_layernorm(l->out, NULL, NULL, l->inp, l->w, l->b, l->N, l->C);
    return kdot(l->out, l->wt, (size_t)l->N * l->C);
}

static void check_layernorm(int N, int C, size_t max_checks)
{
    krng_t r = {2};
    size_t n = (size_t)N * C;
    float *inp = falloc(n), *w = falloc((size_t)C), *b = falloc((size_t)C), *out = falloc(n);
    float *mean = falloc((size_t)N), *rstd = falloc((size_t)N);
    kfill(&r, inp, n, -2, 3);
    kfill(&r, w, (size_t)C, 0.5, 1.5);
    kfill(&r, b, (size_t)C, -0.5, 0.5);
    DDP_K(&K, layernorm_fwd, KA(out), mean, rstd, inp, w, b, N, C);
    ln_loss_t l = {.inp = dof(inp, n), .w = dof(w, (size_t)C), .b = dof(b, (size_t)C),
                   .out = dalloc(n), .N = N, .C = C};
    double *rm = dalloc((size_t)N), *rr = dalloc((size_t)N);
    ref_layernorm(l.out, rm, rr, l.inp, l.w, l.b, N, C);
    assert_int_equal(kclose("layernorm out", out, l.out, n, RTOL, AFRAC), 0);
    assert_int_equal(kclose("layernorm mean", mean, rm, (size_t)N, RTOL, AFRAC), 0);
    assert_int_equal(kclose("layernorm rstd", rstd, rr, (size_t)N, RTOL, 0), 0);

    float *dout = falloc(n), *dinp = falloc(n), *dw = falloc((size_t)C), *db = falloc((size_t)C);
    kfill(&r, dout, n, -1, 1);
    kfill(&r, dinp, n, -1, 1);
    kfill(&r, dw, (size_t)C, -1, 1);
    kfill(&r, db, (size_t)C, -1, 1);
    float *dinp0 = fdup(dinp, n), *dw0 = fdup(dw, (size_t)C), *db0 = fdup(db, (size_t)C);
    float *dinpa = falloc(n); /* fp32: the activation copy of the new dinp is dinp itself */
    DDP_K(&K, layernorm_bwd, dinp, KA(dinpa), dw, db, KA(dout), inp, w, mean, rstd, N, C);
    assert_memory_equal(dinpa, dinp, n * sizeof(float));
    free(dinpa);
    l.wt = dof(dout, n);
    assert_int_equal(kfd_check("layernorm dinp", ln_loss, &l, l.inp, n, dinp, dinp0, max_checks,
                               &r, RTOL, AFRAC), 0);
    assert_int_equal(kfd_check("layernorm dweight", ln_loss, &l, l.w, (size_t)C, dw, dw0,
                               max_checks, &r, RTOL, AFRAC), 0);
    assert_int_equal(kfd_check("layernorm dbias", ln_loss, &l, l.b, (size_t)C, db, db0,
                               max_checks, &r, RTOL, AFRAC), 0);
    free(inp), free(w), free(b), free(out), free(mean), free(rstd), free(dout), free(dinp);
    free(dw), free(db), free(dinp0), free(dw0), free(db0), free(rm), free(rr);
    free(l.inp), free(l.w), free(l.b), free(l.out), free(l.wt);
}

static void test_layernorm(void **state)
{
    check_layernorm(3, 7, 1000);   /* smaller than every block */
    check_layernorm(37, 131, 300); /* crosses the row and column blocks */
}

/* ------------------------------------------------------------------------------------------ */
/* matmul */

typedef struct {
    double *inp, *w, *bias, *wt, *out;
    int N, C, OC;
    ddp_wlayout_t layout;
} mm_loss_t;

static double mm_loss(void *arg)
{
    mm_loss_t *m = arg;
    ref_matmul(m->out, m->inp, m->w, m->bias, m->N, m->C, m->OC, m->layout);
    return kdot(m->out, m->wt, (size_t)m->N * m->OC);
}

static void check_matmul(int N, int C, int OC, ddp_wlayout_t layout, int with_bias,
                         size_t max_checks)
{
    krng_t r = {3u + (uint64_t)N * 7 + (uint64_t)layout};
    size_t ni = (size_t)N * C, nw = (size_t)C * OC, no = (size_t)N * OC;
    float *inp = falloc(ni), *w = falloc(nw), *bias = falloc((size_t)OC), *out = falloc(no);
    kfill(&r, inp, ni, -1, 1);
    kfill(&r, w, nw, -1, 1);
    kfill(&r, bias, (size_t)OC, -1, 1);
    float *fb = with_bias ? bias : NULL;
    DDP_K(&K, matmul_fwd, KA(out), KA(inp), w, fb, N, C, OC, OC, layout);
    mm_loss_t m = {.inp = dof(inp, ni), .w = dof(w, nw), .bias = dof(bias, (size_t)OC),
                   .out = dalloc(no), .N = N, .C = C, .OC = OC, .layout = layout};
    double *mb = m.bias;
    if (!with_bias) m.bias = NULL;
    ref_matmul(m.out, m.inp, m.w, m.bias, N, C, OC, layout);
    assert_int_equal(kclose("matmul out", out, m.out, no, RTOL, AFRAC), 0);

    float *dout = falloc(no), *dinp = falloc(ni), *dw = falloc(nw), *db = falloc((size_t)OC);
    kfill(&r, dout, no, -1, 1);
    kfill(&r, dinp, ni, -1, 1);
    kfill(&r, dw, nw, -1, 1);
    kfill(&r, db, (size_t)OC, -1, 1);
    float *dw0 = fdup(dw, nw), *db0 = fdup(db, (size_t)OC);
    DDP_K(&K, matmul_bwd, KA(dinp), dw, db, KA(dout), KA(inp), w, N, C, OC, OC, layout);
    m.wt = dof(dout, no);
    m.bias = mb;
    /* dinp overwritten: the garbage it held does not show */
    assert_int_equal(kfd_check("matmul dinp", mm_loss, &m, m.inp, ni, dinp, NULL, max_checks,
                               &r, RTOL, AFRAC), 0);
    assert_int_equal(kfd_check("matmul dweight", mm_loss, &m, m.w, nw, dw, dw0, max_checks, &r,
                               RTOL, AFRAC), 0);
    assert_int_equal(kfd_check("matmul dbias", mm_loss, &m, m.bias, (size_t)OC, db, db0,
                               max_checks, &r, RTOL, AFRAC), 0);

    /* dinp and dbias may be NULL: dweight comes out the same, bit for bit. */
    float *dw2 = fdup(dw0, nw);
    DDP_K(&K, matmul_bwd, NULL, dw2, NULL, KA(dout), KA(inp), w, N, C, OC, OC, layout);
    assert_memory_equal(dw2, dw, nw * sizeof(float));
    free(inp), free(w), free(bias), free(out), free(dout), free(dinp), free(dw), free(db);
    free(dw0), free(db0), free(dw2);
    free(m.inp), free(m.w), free(mb), free(m.out), free(m.wt);
}

static void test_matmul(void **state)
{
    for (int layout = 0; layout < 2; layout++) {
        check_matmul(7, 9, 13, (ddp_wlayout_t)layout, 1, 10000);
        check_matmul(67, 37, 150, (ddp_wlayout_t)layout, 1, 60);
        check_matmul(67, 37, 150, (ddp_wlayout_t)layout, 0, 30);
        check_matmul(130, 90, 1100, (ddp_wlayout_t)layout, 1, 12); /* many tiles */
        check_matmul(5, 16, 4999, (ddp_wlayout_t)layout, 0, 12);   /* LM-head-like */
        check_matmul(5, 16, 9001, (ddp_wlayout_t)layout, 1, 12);   /* dinp by split K */
    }
}

/* The LM head's padded logits (kernels.h's ddp_logits_ld): matmul and xent on rows ld > V apart
 * give the unpadded run's results bitwise and neither write nor read the padding, which holds
 * NaN bits (a read would show in every result). Both layouts, with a bias (dbias reads dout's
 * rows too), with and without dinp's split K, in each precision; bf16 emulated and native. */
static void check_logits_stride(ddp_kprec_t p, int emulate, int N, int C, int V,
                                ddp_wlayout_t layout)
{
    if (emulate) setenv("DDP_CPU_BF16", "emulate", 1); /* read by set_precision */
    ddp_kernels_t k;
    assert_int_equal(ddp_kernels_open(&k, "cpu", 0, 2), 0);
    DDP_K(&k, set_precision, p);
    unsetenv("DDP_CPU_BF16");
    size_t e = ddp_act_bytes(p), ld = (size_t)ddp_logits_ld(V);
    assert_true(ld > (size_t)V);
    krng_t r = {11u + (uint64_t)V};
    float *inpf = falloc((size_t)N * C), *w = falloc((size_t)V * C), *bias = falloc((size_t)V);
    kfill(&r, inpf, (size_t)N * C, -1, 1);
    kfill(&r, w, (size_t)V * C, -1, 1);
    kfill(&r, bias, (size_t)V, -1, 1);
    void *inp = kact(inpf, (size_t)N * C, p);
    int32_t *tg = kcalloc((size_t)N, sizeof(int32_t));
    for (int n = 0; n < N; n++) tg[n] = (int32_t)krng_below(&r, (uint32_t)V);
    unsigned char *lg[2] = {kcalloc((size_t)N * V, e), kcalloc((size_t)N * ld, e)};
    memset(lg[1], 0xff, (size_t)N * ld * e);
    float *loss[2], *dw[2], *db[2];
    unsigned char *dinp[2];
    for (int i = 0; i < 2; i++) {
        int ldi = i ? (int)ld : V;
        loss[i] = falloc((size_t)N), dw[i] = falloc((size_t)V * C), db[i] = falloc((size_t)V);
        dinp[i] = kcalloc((size_t)N * C, e);
        DDP_K(&k, matmul_fwd, (ddp_act_t *)lg[i], inp, w, bias, N, C, V, ldi, layout);
        DDP_K(&k, xent_fwd_bwd, loss[i], (ddp_act_t *)lg[i], (ddp_act_t *)lg[i], tg, N, V, ldi,
              1.0f / (float)N);
        DDP_K(&k, matmul_bwd, (ddp_act_t *)dinp[i], dw[i], db[i], (ddp_act_t *)lg[i], inp, w, N,
              C, V, ldi, layout);
    }
    assert_int_equal(ddp_k_sync(&k), 0);
    for (int n = 0; n < N; n++) {
        assert_memory_equal(lg[0] + (size_t)n * V * e, lg[1] + (size_t)n * ld * e, V * e);
        for (size_t j = (size_t)V * e; j < ld * e; j++)
            if (lg[1][(size_t)n * ld * e + j] != 0xff)
                fail_msg("row %d: padding byte %zu written (prec %d, V %d)", n, j, (int)p, V);
    }
    assert_memory_equal(loss[0], loss[1], (size_t)N * sizeof(float));
    assert_memory_equal(dinp[0], dinp[1], (size_t)N * C * e);
    assert_memory_equal(dw[0], dw[1], (size_t)V * C * sizeof(float));
    assert_memory_equal(db[0], db[1], (size_t)V * sizeof(float));
    for (int i = 0; i < 2; i++) free(lg[i]), free(loss[i]), free(dw[i]), free(db[i]), free(dinp[i]);
    free(inpf), free(w), free(bias), free(inp), free(tg);
    ddp_kernels_close(&k);
}

static void test_logits_stride(void **state)
{
    const char *why;
    int native = ddp_kernels_cpu_bf16(&why);
    for (int layout = 0; layout < 2; layout++)
        for (int v = 0; v < 2; v++) {
            int V = v ? 9001 : 300; /* 9001: dinp by split K */
            ddp_wlayout_t l = (ddp_wlayout_t)layout;
            check_logits_stride(DDP_KPREC_FP32, 0, 5, 16, V, l);
            check_logits_stride(DDP_KPREC_BF16, 1, 5, 16, V, l);
            if (native) check_logits_stride(DDP_KPREC_BF16, 0, 5, 16, V, l);
            check_logits_stride(DDP_KPREC_FP16, 0, 5, 16, V, l);
        }
}

/* ------------------------------------------------------------------------------------------ */
/* attention */

typedef struct {
    double *qkv, *wt, *out;
    int B, T, C, NH, NKV;
} att_loss_t;

static double att_loss(void *arg)
{
    att_loss_t *a = arg;
    ref_attention(a->out, NULL, a->qkv, a->B, a->T, a->C, a->NH, a->NKV);
    return kdot(a->out, a->wt, (size_t)a->B * a->T * a->C);
}

/* qkv's elements: NH query heads and NKV key and value heads a position */
static size_t qkv_n(int B, int T, int C, int NH, int NKV)
{
    return (size_t)B * T * ((size_t)C + 2 * (size_t)NKV * (C / NH));
}

static void check_attention(int B, int T, int C, int NH, int NKV, size_t max_checks)
{
    krng_t r = {4u + (uint64_t)T + 100u * (uint64_t)NKV};
    size_t nq = qkv_n(B, T, C, NH, NKV), no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = falloc(nq), *out = falloc(no), *lse = falloc(nl);
    kfill(&r, qkv, nq, -1.5, 1.5);
    memset(lse, 0xff, nl * sizeof(float)); /* NaNs: every element must be written */
    DDP_K(&K, attention_fwd, KA(out), lse, KA(qkv), B, T, C, NH, NKV);
    att_loss_t a = {.qkv = dof(qkv, nq), .out = dalloc(no), .B = B, .T = T, .C = C, .NH = NH,
                    .NKV = NKV};
    double *rlse = dalloc(nl);
    ref_attention(a.out, rlse, a.qkv, B, T, C, NH, NKV);
    assert_int_equal(kclose("attention out", out, a.out, no, RTOL, AFRAC), 0);
    assert_int_equal(kclose("attention lse", lse, rlse, nl, RTOL, AFRAC), 0);

    float *dout = falloc(no), *dqkv = falloc(nq);
    kfill(&r, dout, no, -1, 1);
    kfill(&r, dqkv, nq, -1, 1);
    DDP_K(&K, attention_bwd, KA(dqkv), KA(dout), KA(qkv), KA(out), lse, B, T, C, NH, NKV);
    a.wt = dof(dout, no);
    /* dqkv overwritten: the garbage it held does not show */
    assert_int_equal(kfd_check("attention dqkv", att_loss, &a, a.qkv, nq, dqkv, NULL,
                               max_checks, &r, RTOL, AFRAC), 0);
    free(qkv), free(out), free(lse), free(dout), free(dqkv);
    free(a.qkv), free(a.out), free(a.wt), free(rlse);
}

static void test_attention(void **state)
{
    check_attention(2, 7, 12, 3, 3, 10000); /* hs = 4: below the vector width */
    check_attention(1, 33, 40, 5, 5, 400);  /* hs = 8 */
    check_attention(2, 9, 36, 2, 2, 400);   /* hs = 18: a remainder after 8 lanes */
    check_attention(1, 300, 16, 2, 2, 200); /* three causal row blocks, the last one partial */
    /* grouped-query: groups of 2, 3 (SmolLM2's 9 heads on 3), 4 and all heads on one K/V */
    check_attention(2, 7, 16, 4, 2, 10000);
    check_attention(1, 65, 72, 9, 3, 600);
    check_attention(2, 9, 32, 4, 1, 3000);
    check_attention(1, 130, 64, 8, 2, 400);
}

/* Flash attention against the T x T attention it replaced (att_square.c), in fp32, on T below,
 * at and above the row block and on a long context, with up to 48 heads of a batch; grouped
 * queries against that reference on K/V heads repeated (repeat_kv). */
static void check_flash_square(int B, int T, int C, int NH, int NKV)
{
    krng_t r = {40u + (uint64_t)T + 1000u * (uint64_t)NKV};
    size_t nq = qkv_n(B, T, C, NH, NKV), no = (size_t)B * T * C, na = (size_t)B * NH * T * T;
    float *qkv = falloc(nq), *out = falloc(no), *lse = falloc((size_t)B * NH * T);
    float *sq_out = falloc(no), *att = falloc(na), *dout = falloc(no);
    float *dqkv = falloc(nq), *sq_dqkv = falloc(nq);
    kfill(&r, qkv, nq, -2, 2);
    kfill(&r, dout, no, -1, 1);
    kfill(&r, dqkv, nq, -1, 1); /* overwritten; the T x T reference sums from zero */
    DDP_K(&K, attention_fwd, KA(out), lse, KA(qkv), B, T, C, NH, NKV);
    DDP_K(&K, attention_bwd, KA(dqkv), KA(dout), KA(qkv), KA(out), lse, B, T, C, NH, NKV);
    assert_int_equal(ddp_k_sync(&K), 0);
    square_gqa_fwd(sq_out, att, qkv, B, T, C, NH, NKV);
    float *datt = falloc(na);
    square_gqa_bwd(sq_dqkv, datt, dout, qkv, att, B, T, C, NH, NKV);
    free(datt);
    double *ro = dof(sq_out, no), *rd = dof(sq_dqkv, nq);
    char what[80];
    snprintf(what, sizeof what, "flash vs T x T out, T=%d B*NH=%d NH/NKV=%d", T, B * NH, NH / NKV);
    assert_int_equal(kclose(what, out, ro, no, 1e-4, 1e-5), 0);
    snprintf(what, sizeof what, "flash vs T x T dqkv, T=%d B*NH=%d NH/NKV=%d", T, B * NH,
             NH / NKV);
    assert_int_equal(kclose(what, dqkv, rd, nq, 1e-4, 1e-5), 0);
    free(qkv), free(out), free(lse), free(sq_out), free(att), free(dout), free(dqkv);
    free(sq_dqkv), free(ro), free(rd);
}

static void test_attention_flash_vs_square(void **state)
{
    static const int T[] = {1, 63, 64, 65, 1000};
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
        check_flash_square(4, T[i], 96, 12, 12); /* B*NH = 48, hs = 8 */
    check_flash_square(1, 129, 256, 4, 4);       /* hs = 64 */
    /* groups of 1, 2, 3 and 4 query heads a K/V head, odd T */
    static const int Tg[] = {1, 63, 65};
    for (size_t i = 0; i < sizeof Tg / sizeof Tg[0]; i++)
        for (int g = 1; g <= 4; g++) check_flash_square(2, Tg[i], 12 * 16, 12, 12 / g);
    check_flash_square(1, 200, 9 * 64, 9, 3); /* SmolLM2-135M's heads, two row blocks */
}

/* ------------------------------------------------------------------------------------------ */
/* GELU, residual */

static void test_gelu(void **state)
{
    krng_t r = {5};
    size_t n = 100003; /* several tasks and a remainder */
    float *x = falloc(n), *y = falloc(n), *dout = falloc(n), *dinp = falloc(n);
    kfill(&r, x, n, -6, 6);
    x[0] = 0.0f, x[1] = -20.0f, x[2] = 20.0f;
    kfill(&r, dout, n, -1, 1);
    kfill(&r, dinp, n, -1, 1); /* overwritten */
    DDP_K(&K, gelu_fwd, KA(y), KA(x), n);
    DDP_K(&K, gelu_bwd, KA(dinp), KA(x), KA(dout), n);
    double *ry = dalloc(n), *rg = dalloc(n);
    for (size_t i = 0; i < n; i++) {
        double xi = x[i], h = 1e-6 * fmax(1.0, fabs(xi));
        ry[i] = ref_gelu(xi);
        rg[i] = (double)dout[i] * (ref_gelu(xi + h) - ref_gelu(xi - h)) / (2 * h);
    }
    assert_int_equal(kclose("gelu out", y, ry, n, 1e-5, 1e-6), 0);
    assert_int_equal(kclose("gelu dinp (finite differences)", dinp, rg, n, 1e-4, 1e-5), 0);
    /* in place (dinp aliasing dout): the same bits */
    DDP_K(&K, gelu_bwd, KA(dout), KA(x), KA(dout), n);
    assert_memory_equal(dout, dinp, n * sizeof(float));
    free(x), free(y), free(dout), free(dinp), free(ry), free(rg);
}

static void test_residual(void **state)
{
    krng_t r = {6};
    size_t n = 70001;
    float *a = falloc(n), *b = falloc(n), *out = falloc(n);
    kfill(&r, a, n, -1, 1);
    kfill(&r, b, n, -1, 1);
    double *ref = dalloc(n);
    for (size_t i = 0; i < n; i++) ref[i] = (double)a[i] + (double)b[i];
    DDP_K(&K, residual_fwd, out, a, KA(b), n);
    assert_int_equal(kclose("residual out", out, ref, n, 1e-7, 0), 0);
    DDP_K(&K, residual_fwd, a, a, KA(b), n); /* out aliasing a */
    assert_memory_equal(a, out, n * sizeof(float));
    free(a), free(b), free(out), free(ref);
}

/* ------------------------------------------------------------------------------------------ */
/* softmax + cross-entropy */

typedef struct {
    double *logits, *losses;
    const int32_t *targets;
    int N, V;
    double dloss;
} xent_loss_t;

static double xent_loss(void *arg)
{
    xent_loss_t *x = arg;
    ref_xent(x->losses, x->logits, x->targets, x->N, x->V);
    double s = 0.0;
    for (int n = 0; n < x->N; n++) s += x->losses[n];
    return s * x->dloss;
}

static void test_xent(void **state)
{
    krng_t r = {7};
    int N = 5, V = 1003;
    size_t n = (size_t)N * V;
    int32_t targets[5];
    for (int i = 0; i < N; i++) targets[i] = (int32_t)krng_below(&r, (uint32_t)V);
    targets[4] = V - 1;
    float *logits = falloc(n), *dl = falloc(n), *losses = falloc((size_t)N);
    float *losses2 = falloc((size_t)N);
    kfill(&r, logits, n, -4, 4);
    logits[3] = 60.0f; /* a large logit: the max subtraction must keep it finite */
    float dloss = 1.0f / 3.0f;
    memset(dl, 0xff, n * sizeof(float)); /* overwritten, not accumulated */
    DDP_K(&K, xent_fwd_bwd, losses, KA(dl), KA(logits), targets, N, V, V, dloss);
    xent_loss_t x = {.logits = dof(logits, n), .losses = dalloc((size_t)N), .targets = targets,
                     .N = N, .V = V, .dloss = dloss};
    double *rl = dalloc((size_t)N);
    ref_xent(rl, x.logits, targets, N, V);
    assert_int_equal(kclose("xent losses", losses, rl, (size_t)N, 1e-5, 0), 0);
    assert_int_equal(kfd_check("xent dlogits", xent_loss, &x, x.logits, n, dl, NULL, 1500, &r,
                               RTOL, AFRAC), 0);
    /* Without dlogits: the same losses. In place (dlogits == logits): the same gradient. */
    DDP_K(&K, xent_fwd_bwd, losses2, NULL, KA(logits), targets, N, V, V, dloss);
    assert_memory_equal(losses2, losses, (size_t)N * sizeof(float));
    DDP_K(&K, xent_fwd_bwd, losses2, KA(logits), KA(logits), targets, N, V, V, dloss);
    assert_memory_equal(losses2, losses, (size_t)N * sizeof(float));
    assert_memory_equal(logits, dl, n * sizeof(float));
    free(logits), free(dl), free(losses), free(losses2), free(x.logits), free(x.losses), free(rl);
}

/* ------------------------------------------------------------------------------------------ */
/* AdamW and the vector helpers */

static void test_adamw(void **state)
{
    krng_t r = {8};
    size_t n = 70001;
    float *p = falloc(n), *g = falloc(n), *m = falloc(n), *v = falloc(n);
    kfill(&r, p, n, -1, 1);
    double *rp = dof(p, n), *rm = dalloc(n), *rv = dalloc(n);
    float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    /* two ranges in one call, the first with weight decay: CRC chunks count from each start */
    const size_t n1 = 40000;
    ddp_kadamw_range_t ranges[2] = {{0, n1, wd}, {n1, n, 0.0f}};
    size_t chunks0 = (n1 + DDP_ADAMW_CRC_CHUNK - 1) / DDP_ADAMW_CRC_CHUNK;
    size_t chunks = chunks0 + (n - n1 + DDP_ADAMW_CRC_CHUNK - 1) / DDP_ADAMW_CRC_CHUNK;
    uint32_t *crc = calloc(3 * chunks, sizeof *crc);
    for (int t = 1; t <= 5; t++) {
        kfill(&r, g, n, -2, 2);
        if (t == 3) g[7] = 0.0f;
        /* the checksums on odd steps: they must not change what is computed (checked below
         * against the reference on every step) and must be those of the bytes written */
        DDP_K(&K, adamw, p, g, m, v, ranges, 2, lr, b1, b2, eps, gs, t, t % 2 ? crc : NULL);
        for (size_t c = 0; t % 2 && c < chunks; c++) {
            size_t base = c < chunks0 ? 0 : n1, end = c < chunks0 ? n1 : n;
            size_t lo = base + (c < chunks0 ? c : c - chunks0) * DDP_ADAMW_CRC_CHUNK;
            size_t len = end - lo < DDP_ADAMW_CRC_CHUNK ? end - lo : DDP_ADAMW_CRC_CHUNK;
            const float *out[3] = {p, m, v};
            for (int k = 0; k < 3; k++)
                assert_int_equal(crc[3 * c + k], ddp__crc32c_sw(0, out[k] + lo, len * 4));
        }
        /* torch.optim.AdamW (single tensor, not capturable), in double. */
        double bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
        double step = (double)lr / bc1;
        for (size_t i = 0; i < n; i++) {
            double gi = (double)g[i] * gs;
            rp[i] *= 1.0 - (double)lr * (i < n1 ? wd : 0.0f);
            rm[i] += (gi - rm[i]) * (1.0 - b1);
            rv[i] = rv[i] * b2 + (1.0 - b2) * gi * gi;
            double denom = sqrt(rv[i]) / sqrt(bc2) + eps;
            rp[i] -= step * rm[i] / denom;
        }
        assert_int_equal(kclose("adamw m", m, rm, n, 1e-5, 1e-6), 0);
        assert_int_equal(kclose("adamw v", v, rv, n, 1e-5, 1e-6), 0);
        assert_int_equal(kclose("adamw param", p, rp, n, 1e-5, 1e-6), 0);
    }
    free(p), free(g), free(m), free(v), free(rp), free(rm), free(rv), free(crc);
}

static void test_vector(void **state)
{
    krng_t r = {9};
    size_t n = 3 * 32768 + 5;
    float *x = falloc(n), *y = falloc(n), *y0 = falloc(n);
    kfill(&r, x, n, -3, 3);
    kfill(&r, y, n, -3, 3);
    memcpy(y0, y, n * sizeof(float));
    /* sums of squares of blocks: against a double reference, and the same for a block
     * whatever its place in the buffer */
    const size_t block = 1000, nb = (n + block - 1) / block;
    float *ss = falloc(nb), *ss_shifted = falloc(nb), *ss_two = falloc(nb + 1);
    ddp_krange_t all = {0, n, 0}, shifted = {7 * block, n, 0}, none = {0, 0, 0};
    DDP_K(&K, sumsq_blocks, ss, x, &all, 1, block);
    for (size_t j = 0; j < nb; j++) {
        double want = 0.0;
        for (size_t i = j * block; i < n && i < (j + 1) * block; i++) want += (double)x[i] * x[i];
        if (!(fabs(ss[j] - want) <= 1e-7 * want))
            fail_msg("sumsq_blocks[%zu]: got %.9g, want %.17g", j, ss[j], want);
    }
    DDP_K(&K, sumsq_blocks, ss_shifted, x, &shifted, 1, block);
    assert_memory_equal(ss_shifted, ss + 7, (nb - 7) * sizeof(float));
    /* two ranges in one call, the second's results first: each block as in its own call */
    ddp_krange_t two[2] = {{7 * block, n, 0}, {0, 3 * block + 17, nb - 7}};
    DDP_K(&K, sumsq_blocks, ss_two, x, two, 2, block);
    assert_memory_equal(ss_two, ss + 7, (nb - 7) * sizeof(float));
    assert_memory_equal(ss_two + nb - 7, ss, 3 * sizeof(float));
    ss[0] = -1.0f;
    DDP_K(&K, sumsq_blocks, ss, x, &none, 1, block);
    assert_true(ss[0] == -1.0f);
    free(ss);
    free(ss_shifted);
    free(ss_two);

    DDP_K(&K, add, y, x, n);
    for (size_t i = 0; i < n; i++)
        if (y[i] != y0[i] + x[i]) fail_msg("add[%zu]: got %.9g, want %.9g", i, y[i], y0[i] + x[i]);
    DDP_K(&K, scale, y, 0.25f, n);
    for (size_t i = 0; i < n; i++)
        if (y[i] != (y0[i] + x[i]) * 0.25f)
            fail_msg("scale[%zu]: got %.9g, want %.9g", i, y[i], (y0[i] + x[i]) * 0.25f);

    int bad = -1;
    DDP_K(&K, nonfinite, &bad, x, n);
    assert_int_equal(bad, 0);
    size_t where[3] = {n - 1, n / 2, 0};
    float vals[3] = {NAN, INFINITY, -INFINITY};
    for (int k = 0; k < 3; k++) {
        float keep = x[where[k]];
        x[where[k]] = vals[k];
        DDP_K(&K, nonfinite, &bad, x, n);
        assert_int_equal(bad, 1);
        x[where[k]] = keep;
    }
    x[5] = 3.4e38f; /* large but finite */
    DDP_K(&K, nonfinite, &bad, x, n);
    assert_int_equal(bad, 0);
    free(x), free(y), free(y0);
}

/* ------------------------------------------------------------------------------------------ */
/* fp32 gradients accumulate: a second call adds the same gradient again; activation gradients
 * are overwritten: a second call gives the same bits */

static void check_twice(const char *what, const float *g1, const float *g2, size_t n)
{
    double *ref = dalloc(n);
    for (size_t i = 0; i < n; i++) ref[i] = 2.0 * g1[i];
    assert_int_equal(kclose(what, g2, ref, n, 1e-5, 1e-6), 0);
    free(ref);
}

static void check_once(const char *what, const float *g1, const float *g2, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&g1[i], &g2[i], sizeof(float)) != 0)
            fail_msg("%s[%zu]: %.9g after two calls, %.9g after one", what, i, (double)g2[i],
                     (double)g1[i]);
}

static void test_accumulate(void **state)
{
    krng_t r = {10};
    int B = 2, T = 9, C = 24, NH = 3, OC = 40, V = 13, N = B * T;
    size_t nx = (size_t)N * C, nq = (size_t)N * 3 * C;
    float *x = falloc(nq), *w = falloc((size_t)C * OC), *dout = falloc((size_t)N * OC);
    kfill(&r, x, nq, -1, 1);
    kfill(&r, w, (size_t)C * OC, -1, 1);
    kfill(&r, dout, (size_t)N * OC, -1, 1);
    float *g[2][3];
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 3; j++) g[k][j] = falloc((size_t)V * OC * 4 + nq);
    int32_t inp[18];
    for (int i = 0; i < N; i++) inp[i] = (int32_t)krng_below(&r, (uint32_t)V);
    float *mean = falloc((size_t)N), *rstd = falloc((size_t)N), *tmp = falloc(nq);
    float *lse = falloc((size_t)B * NH * T);
    DDP_K(&K, layernorm_fwd, KA(tmp), mean, rstd, x, w, w, N, C);
    DDP_K(&K, attention_fwd, KA(tmp), lse, KA(x), B, T, C, NH, NH);
    for (int k = 0; k < 2; k++) {
        for (int rep = 0; rep <= k; rep++) {
            DDP_K(&K, matmul_bwd, KA(g[k][0]), g[k][1], g[k][2], KA(dout), KA(x), w, N, C, OC, OC,
                  DDP_W_IN_OUT);
        }
    }
    check_once("matmul dinp twice", g[0][0], g[1][0], nx);
    check_twice("matmul dweight twice", g[0][1], g[1][1], (size_t)C * OC);
    check_twice("matmul dbias twice", g[0][2], g[1][2], (size_t)OC);
    for (int k = 0; k < 2; k++) {
        for (int j = 0; j < 3; j++) memset(g[k][j], 0, ((size_t)V * OC * 4 + nq) * sizeof(float));
        for (int rep = 0; rep <= k; rep++) {
            DDP_K(&K, layernorm_bwd, g[k][0], NULL, g[k][1], g[k][2], KA(dout), x, w, mean, rstd, N,
                  C);
        }
    }
    check_twice("layernorm dinp twice", g[0][0], g[1][0], nx);
    check_twice("layernorm dweight twice", g[0][1], g[1][1], (size_t)C);
    check_twice("layernorm dbias twice", g[0][2], g[1][2], (size_t)C);
    for (int k = 0; k < 2; k++) {
        for (int j = 0; j < 3; j++) memset(g[k][j], 0, ((size_t)V * OC * 4 + nq) * sizeof(float));
        for (int rep = 0; rep <= k; rep++) {
            DDP_K(&K, encoder_bwd, g[k][0], g[k][1], dout, inp, B, T, C);
            DDP_K(&K, attention_bwd, KA(g[k][2]), KA(dout), KA(x), KA(tmp), lse, B, T, C, NH,
                  NH);
            DDP_K(&K, gelu_bwd, KA(g[k][2] + nq), KA(x), KA(dout), (size_t)N * C);
        }
    }
    check_twice("encoder dwte twice", g[0][0], g[1][0], (size_t)V * C);
    check_twice("encoder dwpe twice", g[0][1], g[1][1], (size_t)T * C);
    check_once("attention dqkv twice", g[0][2], g[1][2], nq);
    check_once("gelu dinp twice", g[0][2] + nq, g[1][2] + nq, (size_t)N * C);
    for (int k = 0; k < 2; k++)
        for (int j = 0; j < 3; j++) free(g[k][j]);
    free(x), free(w), free(dout), free(mean), free(rstd), free(tmp), free(lse);
}

static int group_setup(void **state)
{
    return ddp_kernels_open(&K, "cpu", 0, 2) == 0 ? 0 : -1;
}

static int group_teardown(void **state)
{
    ddp_kernels_close(&K);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open),         cmocka_unit_test(test_memory),
        cmocka_unit_test(test_encoder),      cmocka_unit_test(test_layernorm),
        cmocka_unit_test(test_matmul),       cmocka_unit_test(test_logits_stride),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_attention_flash_vs_square),
        cmocka_unit_test(test_rmsnorm),      cmocka_unit_test(test_rope),
        cmocka_unit_test(test_swiglu),       cmocka_unit_test(test_residual_norm),
        cmocka_unit_test(test_llama_front_door),
        cmocka_unit_test(test_gelu),         cmocka_unit_test(test_residual),
        cmocka_unit_test(test_xent),         cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_vector),       cmocka_unit_test(test_accumulate),
        cmocka_unit_test(test_threads),      cmocka_unit_test(test_front_door),
        cmocka_unit_test(test_sparse_cpu),   cmocka_unit_test(test_sparse_sim),
        cmocka_unit_test(test_sparse_sim_hazards),
        cmocka_unit_test(test_profile_cpu),  cmocka_unit_test(test_profile_sim),
        cmocka_unit_test(test_profile_edges),
#ifdef DDP_TEST_CUDA_MODULE
        cmocka_unit_test(test_sparse_cuda),
#endif
    };
    return cmocka_run_group_tests_name("kernels", tests, group_setup, group_teardown);
}
