/* Thread-count independence: every op of the CPU backend, run on the same inputs with contexts
 * of 1, 2 and 3 threads, must give bitwise identical outputs, in fp32 and with 16-bit
 * activations (bf16 emulated and native where the CPU has it, fp16). Shapes are chosen so that
 * every op is cut into several tasks, with remainders. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <stdio.h>

#include "kernels/kernels.h"
#include "kref.h"
#include "ktests.h"

#define MAX_OUTS 64

typedef struct {
    float *buf[MAX_OUTS];
    size_t len[MAX_OUTS];
    const char *name[MAX_OUTS];
    int n;
} outs_t;

static float *keep(outs_t *o, const char *name, const float *x, size_t n)
{
    assert_true(o->n < MAX_OUTS);
    float *c = kcalloc(n, sizeof(float));
    memcpy(c, x, n * sizeof(float));
    o->buf[o->n] = c;
    o->len[o->n] = n;
    o->name[o->n] = name;
    o->n++;
    return c;
}

static float *rnd(krng_t *r, size_t n, double lo, double hi)
{
    float *x = kcalloc(n, sizeof(float));
    kfill(r, x, n, lo, hi);
    return x;
}

static void run_matmul(ddp_kernels_t *k, outs_t *o, krng_t *r, int N, int C, int OC,
                       ddp_wlayout_t layout)
{
    float *inp = rnd(r, (size_t)N * C, -1, 1), *w = rnd(r, (size_t)C * OC, -1, 1);
    float *bias = rnd(r, (size_t)OC, -1, 1), *dout = rnd(r, (size_t)N * OC, -1, 1);
    float *out = kcalloc((size_t)N * OC, sizeof(float));
    float *dinp = kcalloc((size_t)N * C, sizeof(float)), *dw = kcalloc((size_t)C * OC, 4);
    float *db = kcalloc((size_t)OC, sizeof(float));
    DDP_K(k, matmul_fwd, KA(out), KA(inp), w, bias, N, C, OC, OC, layout);
    DDP_K(k, matmul_bwd, KA(dinp), dw, db, KA(dout), KA(inp), w, N, C, OC, OC, layout);
    keep(o, "matmul out", out, (size_t)N * OC);
    keep(o, "matmul dinp", dinp, (size_t)N * C);
    keep(o, "matmul dweight", dw, (size_t)C * OC);
    keep(o, "matmul dbias", db, (size_t)OC);
    free(inp), free(w), free(bias), free(dout), free(out), free(dinp), free(dw), free(db);
}

static void run_all(ddp_kernels_t *k, outs_t *o)
{
    krng_t r = {42};
    run_matmul(k, o, &r, 130, 90, 1100, DDP_W_IN_OUT);
    run_matmul(k, o, &r, 20, 48, 5000, DDP_W_OUT_IN);
    run_matmul(k, o, &r, 300, 70, 64, DDP_W_IN_OUT);
    run_matmul(k, o, &r, 7, 24, 9001, DDP_W_OUT_IN); /* dinp by split K */
    run_matmul(k, o, &r, 7, 24, 9001, DDP_W_IN_OUT);

    int N = 100, C = 300;
    size_t n = (size_t)N * C;
    float *x = rnd(&r, n, -2, 2), *w = rnd(&r, (size_t)C, 0, 2), *b = rnd(&r, (size_t)C, -1, 1);
    float *y = kcalloc(n, 4), *mean = kcalloc((size_t)N, 4), *rstd = kcalloc((size_t)N, 4);
    float *dy = rnd(&r, n, -1, 1), *dx = kcalloc(n, 4), *dw = kcalloc((size_t)C, 4);
    float *db = kcalloc((size_t)C, 4);
    DDP_K(k, layernorm_fwd, KA(y), mean, rstd, x, w, b, N, C);
    DDP_K(k, layernorm_bwd, dx, NULL, dw, db, KA(dy), x, w, mean, rstd, N, C);
    keep(o, "layernorm out", y, n);
    keep(o, "layernorm dinp", dx, n);
    keep(o, "layernorm dweight", dw, (size_t)C);
    keep(o, "layernorm dbias", db, (size_t)C);
    /* the residual add fused with each norm; res aliasing a for the RMSNorm */
    float *res = kcalloc(n, 4);
    DDP_K(k, residual_norm_fwd, res, KA(y), mean, rstd, x, KA(dy), w, b, N, C, 1e-5f);
    keep(o, "residual_norm (layernorm) res", res, n);
    keep(o, "residual_norm (layernorm) out", y, n);
    keep(o, "residual_norm (layernorm) mean", mean, (size_t)N);
    keep(o, "residual_norm (layernorm) rstd", rstd, (size_t)N);
    memcpy(res, dx, n * 4);
    DDP_K(k, residual_norm_fwd, res, KA(y), NULL, rstd, res, KA(dy), w, NULL, N, C, 1e-6f);
    keep(o, "residual_norm (rmsnorm, in place) res", res, n);
    keep(o, "residual_norm (rmsnorm, in place) out", y, n);
    keep(o, "residual_norm (rmsnorm, in place) rstd", rstd, (size_t)N);
    free(res);

    /* encoder: B*T = 100 rows of C = 300 */
    int32_t inp[100];
    for (int i = 0; i < 100; i++) inp[i] = (int32_t)krng_below(&r, 50);
    float *wte = rnd(&r, (size_t)50 * C, -1, 1), *wpe = rnd(&r, (size_t)20 * C, -1, 1);
    float *dwte = kcalloc((size_t)50 * C, 4), *dwpe = kcalloc((size_t)20 * C, 4);
    DDP_K(k, encoder_fwd, y, inp, wte, wpe, 5, 20, C);
    DDP_K(k, encoder_bwd, dwte, dwpe, dy, inp, 5, 20, C);
    keep(o, "encoder out", y, n);
    keep(o, "encoder dwte", dwte, (size_t)50 * C);
    keep(o, "encoder dwpe", dwpe, (size_t)20 * C);

    /* attention: B=2, T=20, C=48, NH=4 */
    size_t nq = 2 * 20 * 3 * 48, nlse = 2 * 4 * 20;
    float *qkv = rnd(&r, nq, -1, 1), *lse = kcalloc(nlse, 4);
    float *dqkv = kcalloc(nq, 4);
    DDP_K(k, attention_fwd, KA(y), lse, KA(qkv), 2, 20, 48, 4, 4);
    keep(o, "attention out", y, 2 * 20 * 48);
    keep(o, "attention lse", lse, nlse);
    DDP_K(k, attention_bwd, KA(dqkv), KA(dy), KA(qkv), KA(y), lse, 2, 20, 48, 4, 4);
    keep(o, "attention dqkv", dqkv, nq);

    /* the Llama ops (RMSNorm over N=100 rows of C=300; RoPE and grouped-query attention on
     * qkv [2,20,(6 + 2*2) 8] in y's room; SwiGLU over 100 rows of 2*150) */
    DDP_K(k, rmsnorm_fwd, KA(y), rstd, x, w, N, C, 1e-5f);
    keep(o, "rmsnorm out", y, n);
    memset(dw, 0, (size_t)C * 4);
    DDP_K(k, rmsnorm_bwd, dx, NULL, dw, KA(dy), x, w, rstd, N, C);
    keep(o, "rmsnorm dinp", dx, n);
    keep(o, "rmsnorm dweight", dw, (size_t)C);
    size_t ng = 2 * 20 * 80;
    float *tab = rnd(&r, 20 * 8, -1, 1), *gq = rnd(&r, ng, -1, 1), *lg = kcalloc(2 * 6 * 20, 4);
    DDP_K(k, rope_fwd, KA(gq), tab, 2, 20, 6, 2, 8);
    keep(o, "rope_fwd", gq, ng);
    DDP_K(k, attention_fwd, KA(y), lg, KA(gq), 2, 20, 48, 6, 2);
    keep(o, "gqa attention out", y, 2 * 20 * 48);
    keep(o, "gqa attention lse", lg, 2 * 6 * 20);
    DDP_K(k, attention_bwd, KA(dx), KA(dy), KA(gq), KA(y), lg, 2, 20, 48, 6, 2);
    keep(o, "gqa attention dqkv", dx, ng);
    DDP_K(k, rope_bwd, KA(dx), tab, 2, 20, 6, 2, 8);
    keep(o, "rope_bwd", dx, ng);
    DDP_K(k, swiglu_fwd, KA(y), KA(x), 100, 150);
    keep(o, "swiglu out", y, 100 * 150);
    DDP_K(k, swiglu_bwd, KA(dx), KA(x), KA(dy), 100, 150);
    keep(o, "swiglu dinp", dx, n);
    free(tab), free(gq), free(lg);

    /* xent: N=9, V=5000 */
    size_t nl = 9 * 5000;
    float *logits = rnd(&r, nl, -5, 5), *dl = kcalloc(nl, 4), *losses = kcalloc(9, 4);
    int32_t tg[9];
    for (int i = 0; i < 9; i++) tg[i] = (int32_t)krng_below(&r, 5000);
    DDP_K(k, xent_fwd_bwd, losses, KA(dl), KA(logits), tg, 9, 5000, 5000, 0.25f);
    keep(o, "xent losses", losses, 9);
    keep(o, "xent dlogits", dl, nl);

    /* element-wise ops over 200003 elements */
    size_t ne = 200003;
    float *a = rnd(&r, ne, -3, 3), *g = rnd(&r, ne, -1, 1), *e = kcalloc(ne, 4);
    float *m = kcalloc(ne, 4), *v = kcalloc(ne, 4), *p = rnd(&r, ne, -1, 1);
    DDP_K(k, gelu_fwd, KA(e), KA(a), ne);
    keep(o, "gelu out", e, ne);
    DDP_K(k, gelu_bwd, KA(e), KA(a), KA(g), ne);
    keep(o, "gelu dinp", e, ne);
    DDP_K(k, residual_fwd, e, e, KA(a), ne);
    keep(o, "residual out", e, ne);
    uint32_t crc[3 * 7]; /* ceil(ne / DDP_ADAMW_CRC_CHUNK) chunks */
    ddp_kadamw_range_t whole = {0, ne, 0.1f};
    for (int t = 1; t <= 2; t++)
        DDP_K(k, adamw, p, g, m, v, &whole, 1, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.7f, t, crc);
    keep(o, "adamw crc", (const float *)crc, 3 * 7); /* compared bytewise */
    keep(o, "adamw param", p, ne);
    keep(o, "adamw m", m, ne);
    keep(o, "adamw v", v, ne);
    DDP_K(k, add, e, g, ne);
    DDP_K(k, scale, e, 0.3f, ne);
    keep(o, "add+scale", e, ne);
    float ss[8]; /* ne / 8 rounded up: 8 blocks, the last shorter */
    ddp_krange_t all = {0, ne, 0};
    DDP_K(k, sumsq_blocks, ss, a, &all, 1, (ne + 7) / 8);
    keep(o, "sumsq_blocks", ss, 8);

    free(x), free(w), free(b), free(y), free(mean), free(rstd), free(dy), free(dx), free(dw);
    free(db), free(wte), free(wpe), free(dwte), free(dwpe), free(qkv), free(lse);
    free(dqkv), free(logits), free(dl), free(losses), free(a), free(g), free(e), free(m), free(v);
    free(p);
}

/* 16-bit outputs of n elements, kept as floats (the buffers hold n floats, zeroed). */
static void keep16(outs_t *o, const char *name, const void *x, size_t n)
{
    keep(o, name, x, (n + 1) / 2);
}

/* The ops with activation tensors, on 16-bit activations of k's precision p. */
static void run_act16(ddp_kernels_t *k, outs_t *o, ddp_kprec_t p)
{
    krng_t r = {43};
    int N = 130, C = 90, OC = 1100;
    float *x = rnd(&r, (size_t)N * OC, -1, 1), *w = rnd(&r, (size_t)C * 9001, -1, 1);
    float *b = rnd(&r, (size_t)OC, -1, 1);
    void *a = kact(x, (size_t)N * OC, p), *a2 = kact(x + 7, (size_t)N * C, p);
    float *out = kcalloc((size_t)N * OC, 4), *dinp = kcalloc((size_t)N * OC, 4);
    float *dw = kcalloc((size_t)C * 9001, 4), *db = kcalloc((size_t)OC, 4);
    DDP_K(k, matmul_fwd, KA(out), a2, w, b, N, C, OC, OC, DDP_W_IN_OUT);
    keep16(o, "matmul out", out, (size_t)N * OC);
    DDP_K(k, matmul_bwd, KA(dinp), dw, db, a, a2, w, N, C, OC, OC, DDP_W_IN_OUT);
    keep16(o, "matmul dinp", dinp, (size_t)N * C);
    keep(o, "matmul dweight", dw, (size_t)C * OC);
    keep(o, "matmul dbias", db, (size_t)OC);
    /* split K */
    DDP_K(k, matmul_bwd, KA(dinp), dw, NULL, a, a2, w, 7, C, 9001, 9001, DDP_W_OUT_IN);
    keep16(o, "matmul dinp (split K)", dinp, (size_t)7 * C);
    keep(o, "matmul dweight (split K)", dw, (size_t)C * 9001);
    float *mean = kcalloc((size_t)N, 4), *rstd = kcalloc((size_t)N, 4);
    DDP_K(k, layernorm_fwd, KA(out), mean, rstd, x, w, b, N, C);
    keep16(o, "layernorm out", out, (size_t)N * C);
    DDP_K(k, layernorm_bwd, dinp, NULL, dw, db, a, x, w, mean, rstd, N, C);
    keep(o, "layernorm dinp", dinp, (size_t)N * C);
    keep(o, "layernorm dweight, dbias", dw, (size_t)C);
    DDP_K(k, rmsnorm_fwd, KA(out), rstd, x, w, N, C, 1e-5f);
    keep16(o, "rmsnorm out", out, (size_t)N * C);
    keep(o, "rmsnorm rstd", rstd, (size_t)N);
    DDP_K(k, rmsnorm_bwd, dinp, NULL, dw, a, x, w, rstd, N, C);
    keep(o, "rmsnorm dinp", dinp, (size_t)N * C);
    keep(o, "rmsnorm dweight", dw, (size_t)C);
    /* the residual add fused with each norm (b = a's elements); res aliasing a for the RMSNorm */
    float *res = kcalloc((size_t)N * C, 4);
    DDP_K(k, residual_norm_fwd, res, KA(out), mean, rstd, x, a, w, b, N, C, 1e-5f);
    keep(o, "residual_norm (layernorm) res", res, (size_t)N * C);
    keep16(o, "residual_norm (layernorm) out", out, (size_t)N * C);
    keep(o, "residual_norm (layernorm) mean", mean, (size_t)N);
    keep(o, "residual_norm (layernorm) rstd", rstd, (size_t)N);
    memcpy(res, x + 11, (size_t)N * C * 4);
    DDP_K(k, residual_norm_fwd, res, KA(out), NULL, rstd, res, a, w, NULL, N, C, 1e-6f);
    keep(o, "residual_norm (rmsnorm, in place) res", res, (size_t)N * C);
    keep16(o, "residual_norm (rmsnorm, in place) out", out, (size_t)N * C);
    keep(o, "residual_norm (rmsnorm, in place) rstd", rstd, (size_t)N);
    free(res);
    /* RoPE and grouped-query attention on a's first 2*130*(9 + 2*3)*8 elements as qkv: NH = 9,
     * NKV = 3, hs = 8; SwiGLU over 130 rows of 2*500 */
    float *tab = rnd(&r, 130 * 8, -1, 1), *lg = kcalloc(2 * 9 * 130, 4);
    size_t ng = 2 * 130 * 120;
    void *g = kact(x, ng, p);
    DDP_K(k, rope_fwd, g, tab, 2, 130, 9, 3, 8);
    keep16(o, "rope_fwd", g, ng);
    DDP_K(k, attention_fwd, KA(out), lg, g, 2, 130, 72, 9, 3);
    keep16(o, "gqa attention out", out, 2 * 130 * 72);
    keep(o, "gqa attention lse", lg, 2 * 9 * 130);
    DDP_K(k, attention_bwd, KA(dinp), a, g, KA(out), lg, 2, 130, 72, 9, 3);
    DDP_K(k, rope_bwd, KA(dinp), tab, 2, 130, 9, 3, 8);
    keep16(o, "gqa attention dqkv, rope_bwd", dinp, ng);
    DDP_K(k, swiglu_fwd, KA(out), a, 130, 500);
    keep16(o, "swiglu out", out, 130 * 500);
    DDP_K(k, swiglu_bwd, KA(dinp), a, a, 130, 500);
    keep16(o, "swiglu dinp", dinp, 130 * 1000);
    free(tab), free(lg), free(g);
    /* attention: B=2, T=130, C=48, NH=4 (a = qkv [2,130,144], and dout [2,130,48]) */
    float *lse = kcalloc(2 * 4 * 130, 4);
    DDP_K(k, attention_fwd, KA(out), lse, a, 2, 130, 48, 4, 4);
    keep16(o, "attention out", out, 2 * 130 * 48);
    keep(o, "attention lse", lse, 2 * 4 * 130);
    DDP_K(k, attention_bwd, KA(dinp), a, a, KA(out), lse, 2, 130, 48, 4, 4);
    keep16(o, "attention dqkv", dinp, 2 * 130 * 144);
    size_t ne = (size_t)N * OC;
    DDP_K(k, gelu_fwd, KA(out), a, ne);
    keep16(o, "gelu out", out, ne);
    DDP_K(k, gelu_bwd, KA(out), a, KA(out), ne);
    keep16(o, "gelu dinp", out, ne);
    DDP_K(k, residual_fwd, dinp, x, a, ne);
    keep(o, "residual out", dinp, ne);
    DDP_K(k, to_act, KA(out), x, ne);
    keep16(o, "to_act", out, ne);
    int32_t tg[26];
    for (int i = 0; i < 26; i++) tg[i] = (int32_t)krng_below(&r, 5000);
    DDP_K(k, xent_fwd_bwd, lse, KA(out), a, tg, 26, 5000, 5000, 0.25f);
    keep(o, "xent losses", lse, 26);
    keep16(o, "xent dlogits", out, (size_t)26 * 5000);
    free(x), free(w), free(b), free(a), free(a2), free(out), free(dinp), free(dw), free(db);
    free(mean), free(rstd), free(lse);
}

/* Each mode's outputs with 1, 2 and 3 threads: bitwise the same. */
static void check_threads(ddp_kprec_t p, int emulate)
{
    outs_t ref = {0};
    for (int threads = 1; threads <= 3; threads++) {
        ddp_kernels_t k;
        if (emulate) setenv("DDP_CPU_BF16", "emulate", 1); /* read by set_precision */
        assert_int_equal(ddp_kernels_open(&k, "cpu", 0, threads), 0);
        DDP_K(&k, set_precision, p);
        unsetenv("DDP_CPU_BF16");
        outs_t o = {0};
        if (p == DDP_KPREC_FP32)
            run_all(&k, &o);
        else
            run_act16(&k, &o, p);
        assert_int_equal(k.ops->sync(k.ctx), 0);
        ddp_kernels_close(&k);
        if (threads == 1) {
            ref = o;
            continue;
        }
        assert_int_equal(o.n, ref.n);
        for (int i = 0; i < o.n; i++) {
            for (size_t j = 0; j < o.len[i]; j++)
                if (memcmp(&o.buf[i][j], &ref.buf[i][j], sizeof(float)) != 0)
                    fail_msg("%s[%zu] (precision %d) with %d threads: %.9g, with 1 thread: %.9g",
                             o.name[i], j, (int)p, threads, (double)o.buf[i][j],
                             (double)ref.buf[i][j]);
            free(o.buf[i]);
        }
    }
    for (int i = 0; i < ref.n; i++) free(ref.buf[i]);
}

void test_threads(void **state)
{
    const char *why;
    check_threads(DDP_KPREC_FP32, 0);
    check_threads(DDP_KPREC_BF16, 1);
    check_threads(DDP_KPREC_FP16, 0);
    if (ddp_kernels_cpu_bf16(&why))
        check_threads(DDP_KPREC_BF16, 0);
    else
        printf("# native bf16 not checked: %s\n", why);
}
