/* 16-bit activation tensors on the CPU backend: the round-on-store contract of every op.
 *
 * Under bf16 and fp16 with the emulated products (DDP_CPU_BF16=emulate; fp16 always is), each
 * op's 16-bit outputs must be BITWISE the same op run in fp32 on the widened inputs (the weights
 * and bias of a product rounded to the precision), its outputs then rounded once, but for
 * attention's out and dqkv (held to bounds: its section says why); its fp32 outputs (LayerNorm's
 * statistics and gradients, lse, losses, dweight, dbias, the residual) bitwise the fp32 op's.
 * The 16-bit context has 2 threads and the fp32 one 3, so this also checks that neither result
 * depends on the thread count. Activation gradients that the ops overwrite
 * (matmul's, GELU's and SwiGLU's dinp, attention's dqkv) are filled with garbage (NaN bits)
 * first: none may show. The Llama ops (RMSNorm, RoPE, SwiGLU) run on a 1-thread 16-bit context
 * as well: the same bits; so does the residual add fused with each norm, which is also bitwise
 * residual_fwd followed by the norm on each context, with res aliasing a or not. Native bf16
 * products (oneDNN, where the CPU has bf16 instructions) are checked against the emulated ones
 * within a stated bound, and bitwise across thread counts.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <stdio.h>

#include "kernels/kernels.h"
#include "kernels/math/lowp.h"
#include "kref.h"

typedef struct {
    ddp_kernels_t lp, ref; /* the 16-bit context (2 threads), the fp32 one (3 threads) */
    ddp_kprec_t p;
    krng_t r;
} pair_t;

static void open_pair(pair_t *c, ddp_kprec_t p, int emulate, uint64_t seed)
{
    if (emulate) setenv("DDP_CPU_BF16", "emulate", 1); /* read by set_precision */
    assert_int_equal(ddp_kernels_open(&c->lp, "cpu", 0, 2), 0);
    assert_int_equal(ddp_kernels_open(&c->ref, "cpu", 0, 3), 0);
    DDP_K(&c->lp, set_precision, p);
    unsetenv("DDP_CPU_BF16");
    c->p = p;
    c->r = (krng_t){seed};
}

static void close_pair(pair_t *c)
{
    assert_int_equal(ddp_k_sync(&c->lp), 0);
    assert_int_equal(ddp_k_sync(&c->ref), 0);
    ddp_kernels_close(&c->lp);
    ddp_kernels_close(&c->ref);
}

static float *rnd(pair_t *c, size_t n, double lo, double hi)
{
    float *x = kcalloc(n, sizeof(float));
    kfill(&c->r, x, n, lo, hi);
    return x;
}

/* n 16-bit elements of garbage (NaN bits): an output the op must overwrite. */
static void *garbage(size_t n)
{
    void *x = kcalloc(n, 2);
    memset(x, 0xff, n * 2);
    return x;
}

static uint16_t bits(float x, ddp_kprec_t p)
{
    return p == DDP_KPREC_BF16 ? ddp_bf16_bits(x) : ddp_fp16_bits(x);
}

/* got (16-bit) == ref (fp32) rounded, bitwise. */
static void same_act(const char *what, const void *got, const float *ref, size_t n, ddp_kprec_t p)
{
    const uint16_t *g = got;
    for (size_t i = 0; i < n; i++)
        if (g[i] != bits(ref[i], p))
            fail_msg("%s[%zu]: 0x%04x, want 0x%04x (the fp32 op's %.9g rounded)", what, i, g[i],
                     bits(ref[i], p), (double)ref[i]);
}

static void same_f32(const char *what, const float *got, const float *ref, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &ref[i], sizeof(float)))
            fail_msg("%s[%zu]: %.9g, want %.9g (bitwise)", what, i, (double)got[i],
                     (double)ref[i]);
}

/* ---- matmul ---- */

typedef struct {
    int N, C, OC;
    ddp_wlayout_t layout;
    int bias;
} mm_shape_t;

static const mm_shape_t MM_SHAPES[] = {
    {37, 29, 53, DDP_W_IN_OUT, 1},
    {64, 48, 200, DDP_W_OUT_IN, 0},
    {300, 40, 700, DDP_W_IN_OUT, 1}, /* several tiles each way */
    {16, 32, 9000, DDP_W_OUT_IN, 1}, /* split-K dinp */
};

/* The results of one forward + backward of ctx on shape s: out, dinp (16-bit), dw, db. */
typedef struct {
    void *out, *dinp;
    float *dw, *db;
} mm_res_t;

static void mm_run(ddp_kernels_t *k, const mm_shape_t *s, const void *inp, const float *w,
                   const float *b, const void *dout, const float *dw0, const float *db0,
                   size_t act, mm_res_t *res)
{
    size_t ni = (size_t)s->N * s->C, nw = (size_t)s->C * s->OC, no = (size_t)s->N * s->OC;
    res->out = garbage(no * act / 2);
    res->dinp = garbage(ni * act / 2);
    res->dw = kcalloc(nw, 4), res->db = kcalloc((size_t)s->OC, 4);
    memcpy(res->dw, dw0, nw * 4), memcpy(res->db, db0, (size_t)s->OC * 4);
    DDP_K(k, matmul_fwd, res->out, inp, w, s->bias ? b : NULL, s->N, s->C, s->OC, s->OC, s->layout);
    DDP_K(k, matmul_bwd, res->dinp, res->dw, res->db, dout, inp, w, s->N, s->C, s->OC, s->OC,
          s->layout);
    assert_int_equal(ddp_k_sync(k), 0);
}

static void mm_free(mm_res_t *r) { free(r->out), free(r->dinp), free(r->dw), free(r->db); }

/* |a - b| <= tol_rel max(|a|, |b|) + tol_abs for each element (printing both). */
static void close_to(const char *what, const float *a, const float *b, size_t n, double tol_rel,
                     const double *tol_abs)
{
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]), m = fmax(fabs(a[i]), fabs(b[i]));
        if (!(d <= tol_rel * m + tol_abs[i]))
            fail_msg("%s[%zu]: native %.9g, emulated %.9g (bound %.3g)", what, i, (double)a[i],
                     (double)b[i], tol_rel * m + tol_abs[i]);
    }
}

/* sum over k < K of |x[k sx] y[k sy]| (the scale of a dot product's rounding error) */
static double abs_dot(const float *x, size_t sx, const float *y, size_t sy, int K)
{
    double s = 0.0;
    for (int k = 0; k < K; k++) s += fabs((double)x[k * sx] * y[k * sy]);
    return s;
}

/* Native bf16 against the emulated result em on the same inputs: each fp32 sum within twice fp32
 * accumulation's bound (K + 2) 2^-24 sum|terms| of the other (both are within it of the exact
 * value), and a 16-bit output within that plus two bf16 roundings (2^-7 relative). */
static void check_native(const mm_shape_t *s, const float *rin, const float *rw, const float *b,
                         const float *rdout, const mm_res_t *nat, const mm_res_t *em)
{
    int N = s->N, C = s->C, OC = s->OC, io = s->layout == DDP_W_IN_OUT;
    size_t wc = io ? (size_t)OC : 1, wo = io ? 1 : (size_t)C; /* W(c, o) = rw[c wc + o wo] */
    size_t ni = (size_t)N * C, nw = (size_t)C * OC, no = (size_t)N * OC;
    double *tol = kcalloc(no > nw ? (no > ni ? no : ni) : (nw > ni ? nw : ni), sizeof(double));
    float *a = kcalloc(no > ni ? no : ni, 4), *e = kcalloc(no > ni ? no : ni, 4);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++)
            tol[(size_t)n * OC + o] =
                2 * (C + 2) * 0x1p-24 *
                (abs_dot(rin + (size_t)n * C, 1, rw + o * wo, wc, C) + (s->bias ? fabs(b[o]) : 0));
    ddp_act_to_f32(a, nat->out, no, DDP_KPREC_BF16), ddp_act_to_f32(e, em->out, no, DDP_KPREC_BF16);
    close_to("native out", a, e, no, 0x1p-7, tol);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            tol[(size_t)n * C + c] =
                2 * (OC + 2) * 0x1p-24 * abs_dot(rdout + (size_t)n * OC, 1, rw + c * wc, wo, OC);
    ddp_act_to_f32(a, nat->dinp, ni, DDP_KPREC_BF16);
    ddp_act_to_f32(e, em->dinp, ni, DDP_KPREC_BF16);
    close_to("native dinp", a, e, ni, 0x1p-7, tol);
    for (int c = 0; c < C; c++)
        for (int o = 0; o < OC; o++) /* + |dw0| = 1: the accumulation's own rounding */
            tol[c * wc + o * wo] =
                2 * (N + 3) * 0x1p-24 * (abs_dot(rin + c, (size_t)C, rdout + o, (size_t)OC, N) + 1);
    close_to("native dweight", nat->dw, em->dw, nw, 0, tol);
    same_f32("native dbias", nat->db, em->db, (size_t)OC); /* not a product: the same code */
    free(tol), free(a), free(e);
}

static void check_matmul(ddp_kprec_t p)
{
    const char *why;
    int native = p == DDP_KPREC_BF16 && ddp_kernels_cpu_bf16(&why);
    for (size_t i = 0; i < sizeof MM_SHAPES / sizeof *MM_SHAPES; i++) {
        const mm_shape_t *s = &MM_SHAPES[i];
        pair_t c;
        open_pair(&c, p, 1, 100 + i);
        size_t ni = (size_t)s->N * s->C, nw = (size_t)s->C * s->OC, no = (size_t)s->N * s->OC;
        float *inp = rnd(&c, ni, -1, 1), *w = rnd(&c, nw, -1, 1);
        float *b = rnd(&c, (size_t)s->OC, -1, 1);
        float *dout = rnd(&c, no, -1, 1), *dw0 = rnd(&c, nw, -1, 1);
        float *db0 = rnd(&c, (size_t)s->OC, -1, 1);
        float *rin = kround(inp, ni, p), *rw = kround(w, nw, p), *rdout = kround(dout, no, p);
        float *rb = kround(b, (size_t)s->OC, p); /* the bias is rounded like the weights */
        void *inp16 = kact(inp, ni, p), *dout16 = kact(dout, no, p);
        mm_res_t lo, ref;
        mm_run(&c.lp, s, inp16, w, b, dout16, dw0, db0, 2, &lo);
        mm_run(&c.ref, s, rin, rw, rb, rdout, dw0, db0, 4, &ref);
        same_act("matmul out", lo.out, ref.out, no, p);
        same_act("matmul dinp", lo.dinp, ref.dinp, ni, p);
        same_f32("matmul dweight", lo.dw, ref.dw, nw);
        same_f32("matmul dbias", lo.db, ref.db, (size_t)s->OC);
        if (native) { /* the same inputs on the native products, 2 and 3 threads */
            ddp_kernels_t k[2];
            mm_res_t nat[2];
            for (int j = 0; j < 2; j++) {
                assert_int_equal(ddp_kernels_open(&k[j], "cpu", 0, 2 + j), 0);
                DDP_K(&k[j], set_precision, p);
                mm_run(&k[j], s, inp16, w, b, dout16, dw0, db0, 2, &nat[j]);
                ddp_kernels_close(&k[j]);
            }
            check_native(s, rin, rw, rb, rdout, &nat[0], &lo);
            assert_memory_equal(nat[0].out, nat[1].out, no * 2);
            assert_memory_equal(nat[0].dinp, nat[1].dinp, ni * 2);
            assert_memory_equal(nat[0].dw, nat[1].dw, nw * 4);
            mm_free(&nat[0]), mm_free(&nat[1]);
        }
        mm_free(&lo), mm_free(&ref);
        free(inp), free(w), free(b), free(rb), free(dout), free(dw0), free(db0), free(rin);
        free(rw);
        free(rdout), free(inp16), free(dout16);
        close_pair(&c);
    }
    if (!native && p == DDP_KPREC_BF16) printf("# native bf16 not checked: %s\n", why);
}

static void test_matmul_bf16(void **state) { check_matmul(DDP_KPREC_BF16); }
static void test_matmul_fp16(void **state) { check_matmul(DDP_KPREC_FP16); }

/* The GELU products on the same shapes (the last one's dinp by split K): matmul_gelu_fwd's pre
 * is matmul_fwd's out, its out the fp32 op's gelu_fwd of the fp32 product, rounded once (not of
 * pre); matmul_dgelu_bwd's dpre is the fp32 matmul_bwd's dinp through gelu_bwd at the widened
 * pre, rounded once; dweight and dbias are matmul_bwd's. */
static void check_matmul_gelu(ddp_kprec_t p)
{
    for (size_t i = 0; i < sizeof MM_SHAPES / sizeof *MM_SHAPES; i++) {
        const mm_shape_t *s = &MM_SHAPES[i];
        pair_t c;
        open_pair(&c, p, 1, 150 + i);
        int N = s->N, C = s->C, OC = s->OC;
        size_t ni = (size_t)N * C, nw = (size_t)C * OC, no = (size_t)N * OC;
        float *inp = rnd(&c, ni, -1, 1), *w = rnd(&c, nw, -1, 1), *b = rnd(&c, (size_t)OC, -1, 1);
        float *dout = rnd(&c, no, -1, 1), *pre = rnd(&c, ni, -3, 3), *g0 = rnd(&c, nw + OC, -1, 1);
        float *rin = kround(inp, ni, p), *rw = kround(w, nw, p), *rb = kround(b, (size_t)OC, p);
        float *rdout = kround(dout, no, p), *rpre = kround(pre, ni, p);
        void *inp16 = kact(inp, ni, p), *dout16 = kact(dout, no, p), *pre16 = kact(pre, ni, p);
        void *out16 = garbage(no), *z16 = garbage(no), *dpre16 = garbage(ni);
        float *z32 = kcalloc(no, 4), *out32 = kcalloc(no, 4), *dinp32 = kcalloc(ni, 4);
        float *dpre32 = kcalloc(ni, 4), *g[2];
        const float *bias = s->bias ? b : NULL, *rbias = s->bias ? rb : NULL;
        for (int j = 0; j < 2; j++) g[j] = kcalloc(nw + OC, 4), memcpy(g[j], g0, (nw + OC) * 4);
        float *db[2] = {s->bias ? g[0] + nw : NULL, s->bias ? g[1] + nw : NULL};
        DDP_K(&c.lp, matmul_gelu_fwd, out16, z16, inp16, w, bias, N, C, OC, s->layout);
        DDP_K(&c.lp, matmul_dgelu_bwd, dpre16, g[0], db[0], dout16, inp16, pre16, w, N, C, OC,
              s->layout);
        DDP_K(&c.ref, matmul_fwd, (ddp_act_t *)z32, (ddp_act_t *)rin, rw, rbias, N, C, OC, OC,
              s->layout);
        DDP_K(&c.ref, gelu_fwd, (ddp_act_t *)out32, (ddp_act_t *)z32, no);
        DDP_K(&c.ref, matmul_bwd, (ddp_act_t *)dinp32, g[1], db[1], (ddp_act_t *)rdout,
              (ddp_act_t *)rin, rw, N, C, OC, OC, s->layout);
        DDP_K(&c.ref, gelu_bwd, (ddp_act_t *)dpre32, (ddp_act_t *)rpre, (ddp_act_t *)dinp32, ni);
        assert_int_equal(ddp_k_sync(&c.lp) | ddp_k_sync(&c.ref), 0);
        same_act("matmul_gelu pre", z16, z32, no, p);
        same_act("matmul_gelu out", out16, out32, no, p);
        same_act("matmul_dgelu dpre", dpre16, dpre32, ni, p);
        same_f32("matmul_dgelu dweight, dbias", g[0], g[1], nw + OC);
        free(inp), free(w), free(b), free(dout), free(pre), free(g0), free(rin), free(rw);
        free(rb), free(rdout), free(rpre), free(inp16), free(dout16), free(pre16), free(out16);
        free(z16), free(dpre16), free(z32), free(out32), free(dinp32), free(dpre32);
        free(g[0]), free(g[1]);
        close_pair(&c);
    }
}

static void test_matmul_gelu_bf16(void **state) { check_matmul_gelu(DDP_KPREC_BF16); }
static void test_matmul_gelu_fp16(void **state) { check_matmul_gelu(DDP_KPREC_FP16); }

/* ---- layernorm ---- */

static void check_layernorm(ddp_kprec_t p, int N, int C)
{
    pair_t c;
    open_pair(&c, p, 1, 200 + (uint64_t)C);
    size_t n = (size_t)N * C;
    float *inp = rnd(&c, n, -2, 3), *w = rnd(&c, (size_t)C, 0.5, 1.5);
    float *b = rnd(&c, (size_t)C, -0.5, 0.5), *dout = rnd(&c, n, -1, 1);
    float *g0 = rnd(&c, n + 2 * (size_t)C, -1, 1); /* dinp, dweight, dbias before: += */
    float *m[2], *rs[2], *g[2];
    void *out16 = garbage(n), *dout16 = kact(dout, n, p), *dinp16 = garbage(n);
    float *out32 = kcalloc(n, 4), *rdout = kround(dout, n, p);
    for (int j = 0; j < 2; j++) {
        m[j] = kcalloc((size_t)N, 4), rs[j] = kcalloc((size_t)N, 4);
        g[j] = kcalloc(n + 2 * (size_t)C, 4);
        memcpy(g[j], g0, (n + 2 * (size_t)C) * 4);
    }
    DDP_K(&c.lp, layernorm_fwd, out16, m[0], rs[0], inp, w, b, N, C);
    DDP_K(&c.ref, layernorm_fwd, (ddp_act_t *)out32, m[1], rs[1], inp, w, b, N, C);
    /* the 16-bit side also rounds its new dinp: to_act's bits of the fp32 op's */
    DDP_K(&c.lp, layernorm_bwd, g[0], dinp16, g[0] + n, g[0] + n + C, dout16, inp, w, m[0], rs[0],
          N, C);
    DDP_K(&c.ref, layernorm_bwd, g[1], NULL, g[1] + n, g[1] + n + C, (ddp_act_t *)rdout, inp, w,
          m[1], rs[1], N, C);
    assert_int_equal(ddp_k_sync(&c.lp) | ddp_k_sync(&c.ref), 0);
    same_act("layernorm out", out16, out32, n, p);
    same_f32("layernorm mean", m[0], m[1], (size_t)N);
    same_f32("layernorm rstd", rs[0], rs[1], (size_t)N);
    same_f32("layernorm dinp, dweight, dbias", g[0], g[1], n + 2 * (size_t)C);
    same_act("layernorm dinp_act", dinp16, g[1], n, p);
    for (int j = 0; j < 2; j++) free(m[j]), free(rs[j]), free(g[j]);
    free(inp), free(w), free(b), free(dout), free(g0), free(out16), free(dout16), free(out32);
    free(dinp16);
    free(rdout);
    close_pair(&c);
}

/* ---- attention ---- */

/* A 16-bit run's attention rounds P and dS to the activation type before their products, as
 * FlashAttention and the GPU's kernel do (kernels/cpu/attention.c), so it is not the fp32 op
 * rounded and is held to bounds instead:
 * - lse bitwise the fp32 op's on the widened inputs (it comes before any rounding);
 * - out[t] = sum_j P_j v_j moves by at most u sum_j P_j |v_j| <= u max|v| with P's rounding
 *   (u = 2^-9 for bf16, 2^-12 for fp16: the unit roundoff), and by u |out| with its own: within
 *   2 u (max|v| + |ref|) of the fp32 op's;
 * - dqkv, sums of dS_j k_j, dS_j q_j and P_j dout_j with one factor rounded, within
 *   ATT_DQKV_U u (|ref| + max|ref|) of the fp32 op's (max over the whole tensor: dS's rows sum
 *   to zero, so a sum can cancel far below its terms; the largest error seen over these shapes
 *   and both types was 1.0 u (|ref| + max|ref|), the bound has a margin of 2);
 * - bitwise the same on 2 and 3 threads; where the CPU multiplies bf16 natively, native and
 *   emulated products within two bf16 roundings (2^-7) plus 2^-20 of the tensor's largest value
 *   (the fp32 sums' order differs). */
#define ATT_DQKV_U 2.0

static double unit_roundoff(ddp_kprec_t p) { return p == DDP_KPREC_BF16 ? 0x1p-9 : 0x1p-12; }

static double max_abs(const float *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

/* got (16-bit) against ref (fp32): |got - ref| <= rel |ref| + abs_tol for each element. */
static void near_act(const char *what, const void *got, const float *ref, size_t n, ddp_kprec_t p,
                     double rel, double abs_tol)
{
    float *g = kcalloc(n, 4);
    ddp_act_to_f32(g, got, n, p);
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)g[i] - ref[i]), bound = rel * fabs(ref[i]) + abs_tol;
        if (!(d <= bound))
            fail_msg("%s[%zu]: %.9g, the fp32 op's %.9g (bound %.3g)", what, i, (double)g[i],
                     (double)ref[i], bound);
    }
    free(g);
}

/* One forward and backward of k (16-bit) into out16, lse, dqkv16. */
static void att_run(ddp_kernels_t *k, const void *qkv16, const void *dout16, void *out16,
                    float *lse, void *dqkv16, int B, int T, int C, int NH, int NKV)
{
    DDP_K(k, attention_fwd, out16, lse, qkv16, B, T, C, NH, NKV);
    DDP_K(k, attention_bwd, dqkv16, dout16, qkv16, out16, lse, B, T, C, NH, NKV);
    assert_int_equal(ddp_k_sync(k), 0);
}

static void check_attention(ddp_kprec_t p, int B, int T, int C, int NH, int NKV)
{
    pair_t c;
    open_pair(&c, p, 1, 300 + (uint64_t)T);
    int hs = C / NH;
    size_t QKV = (size_t)C + 2 * (size_t)NKV * hs;
    size_t nq = (size_t)B * T * QKV, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = rnd(&c, nq, -2, 2), *dout = rnd(&c, no, -1, 1);
    void *qkv16 = kact(qkv, nq, p), *dout16 = kact(dout, no, p);
    void *out16 = garbage(no), *dqkv16 = garbage(nq);
    float *rqkv = kround(qkv, nq, p), *rdout = kround(dout, no, p), *out32 = kcalloc(no, 4);
    float *dqkv32 = kcalloc(nq, 4), *lse16 = kcalloc(nl, 4), *lse32 = kcalloc(nl, 4);
    float *wout = kcalloc(no, 4);
    att_run(&c.lp, qkv16, dout16, out16, lse16, dqkv16, B, T, C, NH, NKV);
    DDP_K(&c.ref, attention_fwd, (ddp_act_t *)out32, lse32, (ddp_act_t *)rqkv, B, T, C, NH, NKV);
    assert_int_equal(ddp_k_sync(&c.ref), 0);
    same_f32("attention lse", lse16, lse32, nl);
    double u = unit_roundoff(p), vmax = 0;
    for (size_t i = 0; i < (size_t)B * T; i++) /* the values: the last NKV hs of each row */
        vmax = fmax(vmax, max_abs(rqkv + i * QKV + C + (size_t)NKV * hs, (size_t)NKV * hs));
    near_act("attention out", out16, out32, no, p, 2 * u, 2 * u * vmax);
    /* backward reads forward's out as stored: the reference gets it widened */
    ddp_act_to_f32(wout, out16, no, p);
    DDP_K(&c.ref, attention_bwd, (ddp_act_t *)dqkv32, (ddp_act_t *)rdout, (ddp_act_t *)rqkv,
          (ddp_act_t *)wout, lse32, B, T, C, NH, NKV);
    assert_int_equal(ddp_k_sync(&c.ref), 0);
    near_act("attention dqkv", dqkv16, dqkv32, nq, p, ATT_DQKV_U * u,
             ATT_DQKV_U * u * max_abs(dqkv32, nq));
    /* 3 threads, and the native products */
    void *o3 = garbage(no), *dq3 = garbage(nq);
    float *l3 = kcalloc(nl, 4);
    ddp_kernels_t k;
    assert_int_equal(ddp_kernels_open(&k, "cpu", 0, 3), 0);
    setenv("DDP_CPU_BF16", "emulate", 1);
    DDP_K(&k, set_precision, p);
    unsetenv("DDP_CPU_BF16");
    att_run(&k, qkv16, dout16, o3, l3, dq3, B, T, C, NH, NKV);
    ddp_kernels_close(&k);
    assert_memory_equal(o3, out16, no * 2);
    assert_memory_equal(dq3, dqkv16, nq * 2);
    const char *why;
    if (p == DDP_KPREC_BF16 && ddp_kernels_cpu_bf16(&why)) {
        assert_int_equal(ddp_kernels_open(&k, "cpu", 0, 2), 0);
        DDP_K(&k, set_precision, p);
        att_run(&k, qkv16, dout16, o3, l3, dq3, B, T, C, NH, NKV);
        ddp_kernels_close(&k);
        float *a = kcalloc(nq, 4), *e = kcalloc(nq, 4);
        double *tol = kcalloc(nq, sizeof(double));
        ddp_act_to_f32(a, o3, no, p), ddp_act_to_f32(e, out16, no, p);
        double m = max_abs(e, no);
        for (size_t i = 0; i < no; i++) tol[i] = 0x1p-20 * m;
        close_to("attention out", a, e, no, 0x1p-7, tol);
        ddp_act_to_f32(a, dq3, nq, p), ddp_act_to_f32(e, dqkv16, nq, p);
        m = max_abs(e, nq);
        for (size_t i = 0; i < nq; i++) tol[i] = 0x1p-20 * m;
        close_to("attention dqkv", a, e, nq, 0x1p-7, tol);
        free(a), free(e), free(tol);
    }
    free(o3), free(dq3), free(l3);
    free(qkv), free(dout), free(qkv16), free(dout16), free(out16), free(dqkv16), free(rqkv);
    free(rdout), free(out32), free(dqkv32), free(lse16), free(lse32), free(wout);
    close_pair(&c);
}

/* ---- GELU, residual, to_act ---- */

static void check_pointwise(ddp_kprec_t p)
{
    pair_t c;
    open_pair(&c, p, 1, 400);
    size_t n = 100003; /* several tasks and a remainder */
    float *x = rnd(&c, n, -6, 6), *dout = rnd(&c, n, -1, 1), *a = rnd(&c, n, -1, 1);
    x[0] = 0.0f, x[1] = -20.0f, x[2] = 20.0f, x[3] = 70000.0f, x[4] = 1e-30f;
    void *x16 = kact(x, n, p), *dout16 = kact(dout, n, p), *y16 = garbage(n), *d16 = garbage(n);
    float *rx = kround(x, n, p), *rdout = kround(dout, n, p), *y32 = kcalloc(n, 4);
    float *d32 = kcalloc(n, 4), *res16 = kcalloc(n, 4), *res32 = kcalloc(n, 4);
    DDP_K(&c.lp, gelu_fwd, y16, x16, n);
    DDP_K(&c.ref, gelu_fwd, (ddp_act_t *)y32, (ddp_act_t *)rx, n);
    DDP_K(&c.lp, gelu_bwd, d16, x16, dout16, n);
    DDP_K(&c.ref, gelu_bwd, (ddp_act_t *)d32, (ddp_act_t *)rx, (ddp_act_t *)rdout, n);
    DDP_K(&c.lp, residual_fwd, res16, a, x16, n);
    DDP_K(&c.ref, residual_fwd, res32, a, (ddp_act_t *)rx, n);
    assert_int_equal(ddp_k_sync(&c.lp) | ddp_k_sync(&c.ref), 0);
    same_act("gelu out", y16, y32, n, p);
    same_act("gelu dinp", d16, d32, n, p);
    same_f32("residual out", res16, res32, n);
    /* in place: dinp aliasing dout gives the same bits; the residual's out aliasing a too */
    DDP_K(&c.lp, gelu_bwd, dout16, x16, dout16, n);
    DDP_K(&c.lp, residual_fwd, a, a, x16, n);
    assert_int_equal(ddp_k_sync(&c.lp), 0);
    assert_memory_equal(dout16, d16, n * 2);
    same_f32("residual out (in place)", a, res16, n);
    /* to_act: the fp32 values rounded once, edge values included */
    float edge[] = {65504.0f, 65519.99f, 65520.0f, -1e6f, 0x1p-25f, 3 * 0x1p-26f, -0.0f,
                    1.0f + 0x1p-8f, 3.4e38f, INFINITY, NAN};
    memcpy(x + 10, edge, sizeof edge);
    DDP_K(&c.lp, to_act, y16, x, n);
    assert_int_equal(ddp_k_sync(&c.lp), 0);
    same_act("to_act", y16, x, n, p);
    free(x), free(dout), free(a), free(x16), free(dout16), free(y16), free(d16), free(rx);
    free(rdout), free(y32), free(d32), free(res16), free(res32);
    close_pair(&c);
}

/* ---- softmax + cross-entropy ---- */

static void check_xent(ddp_kprec_t p, int N, int V)
{
    pair_t c;
    open_pair(&c, p, 1, 500 + (uint64_t)V);
    size_t n = (size_t)N * V;
    int32_t *tg = kcalloc((size_t)N, sizeof *tg);
    for (int i = 0; i < N; i++) tg[i] = (int32_t)krng_below(&c.r, (uint32_t)V);
    tg[N - 1] = V - 1;
    float *x = rnd(&c, n, -4, 4);
    x[3] = 60.0f;
    void *x16 = kact(x, n, p), *d16 = garbage(n);
    float *rx = kround(x, n, p), *d32 = kcalloc(n, 4), *l16 = kcalloc((size_t)N, 4);
    float *l32 = kcalloc((size_t)N, 4), *l2 = kcalloc((size_t)N, 4);
    float dloss = 1.0f / 3.0f;
    DDP_K(&c.lp, xent_fwd_bwd, l16, d16, x16, tg, N, V, V, dloss);
    DDP_K(&c.ref, xent_fwd_bwd, l32, (ddp_act_t *)d32, (ddp_act_t *)rx, tg, N, V, V, dloss);
    assert_int_equal(ddp_k_sync(&c.lp) | ddp_k_sync(&c.ref), 0);
    same_f32("xent losses", l16, l32, (size_t)N);
    same_act("xent dlogits", d16, d32, n, p);
    DDP_K(&c.lp, xent_fwd_bwd, l2, NULL, x16, tg, N, V, V, dloss); /* losses only */
    DDP_K(&c.lp, xent_fwd_bwd, l2, x16, x16, tg, N, V, V, dloss);  /* in place */
    assert_int_equal(ddp_k_sync(&c.lp), 0);
    same_f32("xent losses (in place)", l2, l16, (size_t)N);
    assert_memory_equal(x16, d16, n * 2);
    free(tg), free(x), free(x16), free(d16), free(rx), free(d32), free(l16), free(l32), free(l2);
    close_pair(&c);
}

/* ---- the Llama ops: RMSNorm, RoPE, SwiGLU ----
 * Each runs on the 16-bit context (2 threads), on a second 16-bit context of 1 thread (the same
 * bits) and as the fp32 op on the widened inputs (3 threads; its outputs rounded once). */

static void open_lp1(ddp_kernels_t *k, ddp_kprec_t p)
{
    setenv("DDP_CPU_BF16", "emulate", 1);
    assert_int_equal(ddp_kernels_open(k, "cpu", 0, 1), 0);
    DDP_K(k, set_precision, p);
    unsetenv("DDP_CPU_BF16");
}

static void check_rmsnorm(ddp_kprec_t p, int N, int C)
{
    pair_t c;
    ddp_kernels_t one;
    open_pair(&c, p, 1, 600 + (uint64_t)C);
    open_lp1(&one, p);
    size_t n = (size_t)N * C;
    float *inp = rnd(&c, n, -2, 3), *w = rnd(&c, (size_t)C, 0.5, 1.5), *dout = rnd(&c, n, -1, 1);
    float *g0 = rnd(&c, n + (size_t)C, -1, 1); /* dinp, dweight before: += */
    void *out16[2] = {garbage(n), garbage(n)}, *dout16 = kact(dout, n, p);
    void *dinp16[2] = {garbage(n), garbage(n)}; /* the 16-bit sides' new dinp, rounded */
    float *out32 = kcalloc(n, 4), *rdout = kround(dout, n, p), *rs[3], *g[3];
    ddp_kernels_t *k[3] = {&c.lp, &one, &c.ref};
    for (int j = 0; j < 3; j++) {
        rs[j] = kcalloc((size_t)N, 4), g[j] = kcalloc(n + (size_t)C, 4);
        memcpy(g[j], g0, (n + (size_t)C) * 4);
        void *o = j < 2 ? out16[j] : (void *)out32, *d = j < 2 ? dout16 : (void *)rdout;
        DDP_K(k[j], rmsnorm_fwd, o, rs[j], inp, w, N, C, 1e-6f);
        DDP_K(k[j], rmsnorm_bwd, g[j], j < 2 ? dinp16[j] : NULL, g[j] + n, d, inp, w, rs[j], N,
              C);
        assert_int_equal(ddp_k_sync(k[j]), 0);
    }
    same_act("rmsnorm out", out16[0], out32, n, p);
    assert_memory_equal(out16[0], out16[1], n * 2);
    for (int j = 0; j < 2; j++) {
        same_f32("rmsnorm rstd", rs[j], rs[2], (size_t)N);
        same_f32("rmsnorm dinp, dweight", g[j], g[2], n + (size_t)C);
        same_act("rmsnorm dinp_act", dinp16[j], g[2], n, p);
        free(dinp16[j]);
    }
    for (int j = 0; j < 3; j++) free(rs[j]), free(g[j]);
    free(inp), free(w), free(dout), free(g0), free(out16[0]), free(out16[1]), free(dout16);
    free(out32), free(rdout);
    ddp_kernels_close(&one);
    close_pair(&c);
}

/* ---- the residual add fused with the norm ---- */

/* The fused op's results on one context. */
typedef struct {
    float *res, *mean, *rstd;
    void *out; /* of the context's activation type */
} rn_out_t;

/* residual_norm_fwd on k (activations of `act` bytes; rms: RMSNorm, else LayerNorm) into *o,
 * checked bitwise against k's residual_fwd followed by its norm, and against itself with res
 * aliasing (a copy of) a. */
static void rn_run(ddp_kernels_t *k, int rms, const float *a, const void *b, const float *w,
                   const float *bias, int N, int C, size_t act, rn_out_t *o)
{
    size_t n = (size_t)N * C, ob = n * act;
    float eps = rms ? 1e-6f : 1e-5f, *res2 = kcalloc(n, 4), *al = kcalloc(n, 4);
    float *m2 = kcalloc((size_t)N, 4), *r2 = kcalloc((size_t)N, 4);
    float *m3 = kcalloc((size_t)N, 4), *r3 = kcalloc((size_t)N, 4);
    void *out2 = garbage(ob / 2), *out3 = garbage(ob / 2);
    *o = (rn_out_t){kcalloc(n, 4), kcalloc((size_t)N, 4), kcalloc((size_t)N, 4), garbage(ob / 2)};
    memcpy(al, a, n * 4);
    DDP_K(k, residual_fwd, res2, a, b, n);
    if (rms)
        DDP_K(k, rmsnorm_fwd, out2, r2, res2, w, N, C, eps);
    else
        DDP_K(k, layernorm_fwd, out2, m2, r2, res2, w, bias, N, C);
    DDP_K(k, residual_norm_fwd, o->res, o->out, rms ? NULL : o->mean, o->rstd, a, b, w,
          rms ? NULL : bias, N, C, eps);
    DDP_K(k, residual_norm_fwd, al, out3, rms ? NULL : m3, r3, al, b, w, rms ? NULL : bias, N, C,
          eps);
    assert_int_equal(ddp_k_sync(k), 0);
    same_f32("fused res", o->res, res2, n);
    same_f32("fused mean", o->mean, m2, (size_t)N);
    same_f32("fused rstd", o->rstd, r2, (size_t)N);
    assert_memory_equal(o->out, out2, ob);
    same_f32("fused res (aliasing a)", al, res2, n);
    same_f32("fused mean (aliasing a)", m3, m2, (size_t)N);
    same_f32("fused rstd (aliasing a)", r3, r2, (size_t)N);
    assert_memory_equal(out3, out2, ob);
    free(res2), free(al), free(m2), free(r2), free(m3), free(r3), free(out2), free(out3);
}

/* The fused op on 16-bit contexts of 2 and 1 threads and the fp32 one (3 threads) on the
 * widened b: each bitwise its own two calls (rn_run), and the three alike: res, mean and rstd
 * bitwise, out the fp32 one's rounded once. */
static void check_residual_norm(ddp_kprec_t p, int N, int C, int rms)
{
    pair_t c;
    ddp_kernels_t one;
    open_pair(&c, p, 1, 900 + (uint64_t)C);
    open_lp1(&one, p);
    size_t n = (size_t)N * C;
    float *a = rnd(&c, n, -2, 3), *b = rnd(&c, n, -1, 1), *w = rnd(&c, (size_t)C, 0.5, 1.5);
    float *bias = rnd(&c, (size_t)C, -0.5, 0.5), *rb = kround(b, n, p);
    void *b16 = kact(b, n, p);
    rn_out_t o[3];
    rn_run(&c.lp, rms, a, b16, w, bias, N, C, 2, &o[0]);
    rn_run(&one, rms, a, b16, w, bias, N, C, 2, &o[1]);
    rn_run(&c.ref, rms, a, rb, w, bias, N, C, 4, &o[2]);
    same_act("fused out", o[0].out, o[2].out, n, p);
    assert_memory_equal(o[0].out, o[1].out, n * 2);
    for (int j = 0; j < 2; j++) {
        same_f32("fused res (16-bit b)", o[j].res, o[2].res, n);
        same_f32("fused mean (16-bit b)", o[j].mean, o[2].mean, (size_t)N);
        same_f32("fused rstd (16-bit b)", o[j].rstd, o[2].rstd, (size_t)N);
    }
    for (int j = 0; j < 3; j++) free(o[j].res), free(o[j].mean), free(o[j].rstd), free(o[j].out);
    free(a), free(b), free(w), free(bias), free(rb), free(b16);
    ddp_kernels_close(&one);
    close_pair(&c);
}

static void check_rope(ddp_kprec_t p, int B, int T, int NH, int NKV, int hs)
{
    pair_t c;
    ddp_kernels_t one;
    open_pair(&c, p, 1, 700 + (uint64_t)hs);
    open_lp1(&one, p);
    size_t n = (size_t)B * T * (size_t)(NH + 2 * NKV) * hs;
    float *x = rnd(&c, n, -3, 3), *tab = rnd(&c, (size_t)T * hs, -1, 1); /* any table */
    void *x16[2] = {kact(x, n, p), kact(x, n, p)};
    float *x32 = kround(x, n, p);
    ddp_kernels_t *k[3] = {&c.lp, &one, &c.ref};
    for (int dir = 0; dir < 2; dir++) { /* forward, then backward on its result */
        for (int j = 0; j < 3; j++) {
            void *o = j < 2 ? x16[j] : (void *)x32;
            if (dir == 0)
                DDP_K(k[j], rope_fwd, o, tab, B, T, NH, NKV, hs);
            else
                DDP_K(k[j], rope_bwd, o, tab, B, T, NH, NKV, hs);
            assert_int_equal(ddp_k_sync(k[j]), 0);
        }
        same_act(dir ? "rope_bwd" : "rope_fwd", x16[0], x32, n, p);
        assert_memory_equal(x16[0], x16[1], n * 2);
        ddp_act_to_f32(x32, x16[0], n, p); /* the next op's input: as stored */
    }
    free(x), free(tab), free(x16[0]), free(x16[1]), free(x32);
    ddp_kernels_close(&one);
    close_pair(&c);
}

static void check_swiglu(ddp_kprec_t p, int N, int H)
{
    pair_t c;
    ddp_kernels_t one;
    open_pair(&c, p, 1, 800 + (uint64_t)H);
    open_lp1(&one, p);
    size_t n = (size_t)N * H;
    float *x = rnd(&c, 2 * n, -8, 8), *dout = rnd(&c, n, -1, 1);
    x[0] = -100.0f, x[1] = 100.0f, x[2] = 0.0f;
    void *x16 = kact(x, 2 * n, p), *dout16 = kact(dout, n, p);
    void *y16[2] = {garbage(n), garbage(n)}, *d16[2] = {garbage(2 * n), garbage(2 * n)};
    float *rx = kround(x, 2 * n, p), *rdout = kround(dout, n, p);
    float *y32 = kcalloc(n, 4), *d32 = kcalloc(2 * n, 4);
    ddp_kernels_t *k[3] = {&c.lp, &one, &c.ref};
    for (int j = 0; j < 3; j++) {
        void *y = j < 2 ? y16[j] : (void *)y32, *d = j < 2 ? d16[j] : (void *)d32;
        void *in = j < 2 ? x16 : (void *)rx, *dy = j < 2 ? dout16 : (void *)rdout;
        DDP_K(k[j], swiglu_fwd, y, in, N, H);
        DDP_K(k[j], swiglu_bwd, d, in, dy, N, H);
        assert_int_equal(ddp_k_sync(k[j]), 0);
    }
    same_act("swiglu out", y16[0], y32, n, p);
    same_act("swiglu dinp", d16[0], d32, 2 * n, p);
    assert_memory_equal(y16[0], y16[1], n * 2);
    assert_memory_equal(d16[0], d16[1], 2 * n * 2);
    free(x), free(dout), free(x16), free(dout16), free(y16[0]), free(y16[1]), free(d16[0]);
    free(d16[1]), free(rx), free(rdout), free(y32), free(d32);
    ddp_kernels_close(&one);
    close_pair(&c);
}

static void check_llama(ddp_kprec_t p)
{
    check_rmsnorm(p, 3, 7);
    check_rmsnorm(p, 37, 131); /* crosses the row and column blocks */
    check_residual_norm(p, 3, 7, 1);
    check_residual_norm(p, 37, 131, 1);
    check_rope(p, 2, 9, 6, 2, 10);
    check_rope(p, 3, 70, 9, 3, 64); /* several tasks of rows */
    check_swiglu(p, 7, 37);
    check_swiglu(p, 3, 40000); /* a row longer than a task's chunk */
    check_swiglu(p, 40, 1536);
}

static void test_llama_bf16(void **state) { check_llama(DDP_KPREC_BF16); }
static void test_llama_fp16(void **state) { check_llama(DDP_KPREC_FP16); }

static void check_others(ddp_kprec_t p)
{
    check_layernorm(p, 3, 7);
    check_layernorm(p, 37, 131); /* crosses the row and column blocks */
    check_residual_norm(p, 3, 7, 0);
    check_residual_norm(p, 37, 131, 0);
    check_attention(p, 2, 7, 12, 3, 3);
    check_attention(p, 1, 300, 16, 2, 2); /* three row blocks, the last partial */
    check_attention(p, 2, 65, 128, 2, 2); /* hs = 64 */
    check_attention(p, 2, 65, 96, 6, 3);  /* grouped-query: groups of 2 */
    check_attention(p, 1, 63, 72, 9, 3);  /* groups of 3 (SmolLM2's 9 heads on 3) */
    check_attention(p, 1, 130, 64, 4, 1); /* one K/V head for all, two row blocks */
    check_pointwise(p);
    check_xent(p, 5, 1003);
    check_xent(p, 2, 50257); /* GPT-2's vocabulary: a long row */
}

static void test_ops_bf16(void **state) { check_others(DDP_KPREC_BF16); }
static void test_ops_fp16(void **state) { check_others(DDP_KPREC_FP16); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_bf16),
        cmocka_unit_test(test_matmul_fp16),
        cmocka_unit_test(test_matmul_gelu_bf16),
        cmocka_unit_test(test_matmul_gelu_fp16),
        cmocka_unit_test(test_ops_bf16),
        cmocka_unit_test(test_ops_fp16),
        cmocka_unit_test(test_llama_bf16),
        cmocka_unit_test(test_llama_fp16),
    };
    return cmocka_run_group_tests_name("kernels_act16", tests, NULL, NULL);
}
