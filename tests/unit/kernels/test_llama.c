/* The Llama family's ops on the CPU backend (RMSNorm, RoPE, SwiGLU; grouped-query attention is
 * tested with the other attention cases in test_kernels.c), in the manner of test_kernels.c:
 * each forward against a double-precision reference (kref.c), each backward against central
 * finite differences of loss = sum(out * w) computed in double on that reference, with fp32
 * gradients pre-filled (they accumulate: +=) and activation gradients filled with garbage
 * (they are overwritten). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <math.h>
#include <stdio.h>

#include "common/err.h"
#include "kernels/kernels.h"
#include "kref.h"
#include "ktests.h"

#define RTOL 1e-4
#define AFRAC 2e-5

/* The tests' CPU backend (2 threads), opened for each test. */
static ddp_kernels_t open_cpu(void)
{
    ddp_kernels_t k;
    assert_int_equal(ddp_kernels_open(&k, "cpu", 0, 2), 0);
    return k;
}

static double *dof(const float *x, size_t n)
{
    double *d = kcalloc(n, sizeof(double));
    ktod(d, x, n);
    return d;
}

static float *rnd(krng_t *r, size_t n, double lo, double hi)
{
    float *x = kcalloc(n, sizeof(float));
    kfill(r, x, n, lo, hi);
    return x;
}

static float *fdup(const float *x, size_t n)
{
    float *y = kcalloc(n, sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

/* ---- RMSNorm ---- */

typedef struct {
    double *inp, *w, *wt, *out, eps;
    int N, C;
} rms_loss_t;

static double rms_loss(void *arg)
{
    rms_loss_t *l = arg;
    ref_rmsnorm(l->out, NULL, l->inp, l->w, l->N, l->C, l->eps);
    return kdot(l->out, l->wt, (size_t)l->N * l->C);
}

static void check_rmsnorm(int N, int C, float eps, size_t max_checks)
{
    ddp_kernels_t K = open_cpu();
    krng_t r = {20u + (uint64_t)C};
    size_t n = (size_t)N * C;
    float *inp = rnd(&r, n, -2, 3), *w = rnd(&r, (size_t)C, 0.5, 1.5), *out = rnd(&r, n, -1, 1);
    float *rstd = kcalloc((size_t)N, 4);
    inp[0] = 40.0f; /* a large value: mean(x^2) is dominated by one element of row 0 */
    DDP_K(&K, rmsnorm_fwd, KA(out), rstd, inp, w, N, C, eps);
    rms_loss_t l = {.inp = dof(inp, n), .w = dof(w, (size_t)C), .out = kcalloc(n, 8),
                    .eps = eps, .N = N, .C = C};
    double *rr = kcalloc((size_t)N, 8);
    ref_rmsnorm(l.out, rr, l.inp, l.w, N, C, eps);
    assert_int_equal(kclose("rmsnorm out", out, l.out, n, 1e-5, 1e-6), 0);
    assert_int_equal(kclose("rmsnorm rstd", rstd, rr, (size_t)N, 1e-5, 0), 0);

    float *dout = rnd(&r, n, -1, 1), *dinp = rnd(&r, n, -1, 1), *dw = rnd(&r, (size_t)C, -1, 1);
    float *dinp0 = fdup(dinp, n), *dw0 = fdup(dw, (size_t)C);
    DDP_K(&K, rmsnorm_bwd, dinp, NULL, dw, KA(dout), inp, w, rstd, N, C);
    l.wt = dof(dout, n);
    assert_int_equal(kfd_check("rmsnorm dinp", rms_loss, &l, l.inp, n, dinp, dinp0, max_checks,
                               &r, RTOL, AFRAC), 0);
    assert_int_equal(kfd_check("rmsnorm dweight", rms_loss, &l, l.w, (size_t)C, dw, dw0,
                               max_checks, &r, RTOL, AFRAC), 0);
    /* a second call adds the same gradients again (+=) */
    float *g1 = kcalloc(n + (size_t)C, 4);
    for (size_t i = 0; i < n; i++) g1[i] = dinp[i] - dinp0[i];
    for (int c = 0; c < C; c++) g1[n + c] = dw[c] - dw0[c];
    DDP_K(&K, rmsnorm_bwd, dinp, NULL, dw, KA(dout), inp, w, rstd, N, C);
    double *twice = kcalloc(n + (size_t)C, 8);
    float *got = kcalloc(n + (size_t)C, 4);
    for (size_t i = 0; i < n + (size_t)C; i++) twice[i] = 2.0 * g1[i];
    for (size_t i = 0; i < n; i++) got[i] = dinp[i] - dinp0[i];
    for (int c = 0; c < C; c++) got[n + c] = dw[c] - dw0[c];
    assert_int_equal(kclose("rmsnorm dinp, dweight twice", got, twice, n + C, 1e-5, 1e-6), 0);
    assert_int_equal(ddp_k_sync(&K), 0);
    free(inp), free(w), free(out), free(rstd), free(dout), free(dinp), free(dw), free(dinp0);
    free(dw0), free(g1), free(twice), free(got), free(rr);
    free(l.inp), free(l.w), free(l.out), free(l.wt);
    ddp_kernels_close(&K);
}

void test_rmsnorm(void **state)
{
    check_rmsnorm(3, 7, 1e-5f, 1000);    /* smaller than every block */
    check_rmsnorm(37, 131, 1e-6f, 300);  /* crosses the row and column blocks */
    check_rmsnorm(20, 576, 1e-5f, 200);  /* SmolLM2-135M's width */
}

/* ---- RoPE ---- */

/* The table of Llama's rotary embedding (base 10000) for T positions of head size hs. */
static float *rope_table(int T, int hs)
{
    float *tab = kcalloc((size_t)T * hs, 4);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < hs / 2; i++) {
            double ang = t * pow(10000.0, -2.0 * i / hs);
            tab[((size_t)t * (hs / 2) + i) * 2] = (float)cos(ang);
            tab[((size_t)t * (hs / 2) + i) * 2 + 1] = (float)sin(ang);
        }
    return tab;
}

typedef struct {
    double *qkv, *rope, *wt, *out;
    int B, T, NH, NKV, hs;
} rope_loss_t;

static double rope_loss(void *arg)
{
    rope_loss_t *l = arg;
    size_t n = (size_t)l->B * l->T * (l->NH + 2 * l->NKV) * l->hs;
    memcpy(l->out, l->qkv, n * sizeof(double));
    ref_rope(l->out, l->rope, l->B, l->T, l->NH, l->NKV, l->hs);
    return kdot(l->out, l->wt, n);
}

static void check_rope(int B, int T, int NH, int NKV, int hs, size_t max_checks)
{
    ddp_kernels_t K = open_cpu();
    krng_t r = {30u + (uint64_t)hs};
    size_t row = (size_t)(NH + 2 * NKV) * hs, n = (size_t)B * T * row, qk = (size_t)(NH + NKV) * hs;
    float *x = rnd(&r, n, -2, 2), *tab = rope_table(T, hs), *x0 = fdup(x, n);
    DDP_K(&K, rope_fwd, KA(x), tab, B, T, NH, NKV, hs);
    rope_loss_t l = {.qkv = dof(x0, n), .rope = dof(tab, (size_t)T * hs), .out = kcalloc(n, 8),
                     .B = B, .T = T, .NH = NH, .NKV = NKV, .hs = hs};
    memcpy(l.out, l.qkv, n * sizeof(double));
    ref_rope(l.out, l.rope, B, T, NH, NKV, hs);
    assert_int_equal(kclose("rope_fwd qkv", x, l.out, n, 1e-6, 1e-7), 0);
    for (size_t p = 0; p < (size_t)B * T; p++) /* v: untouched, bit for bit */
        assert_memory_equal(x + p * row + qk, x0 + p * row + qk, (row - qk) * sizeof(float));

    /* backward: the gradient of sum(rope(x) * w) is rope_bwd(w), in place */
    float *g = rnd(&r, n, -1, 1);
    l.wt = dof(g, n);
    DDP_K(&K, rope_bwd, KA(g), tab, B, T, NH, NKV, hs);
    assert_int_equal(kfd_check("rope_bwd dqkv", rope_loss, &l, l.qkv, n, g, NULL, max_checks, &r,
                               RTOL, AFRAC), 0);
    /* the inverse: rope_bwd(rope_fwd(x)) is x again, within fp32 rounding */
    DDP_K(&K, rope_bwd, KA(x), tab, B, T, NH, NKV, hs);
    double *dx0 = dof(x0, n);
    assert_int_equal(kclose("rope_bwd(rope_fwd(x))", x, dx0, n, 1e-6, 1e-7), 0);
    for (size_t p = 0; p < (size_t)B * T; p++)
        assert_memory_equal(x + p * row + qk, x0 + p * row + qk, (row - qk) * sizeof(float));
    assert_int_equal(ddp_k_sync(&K), 0);
    free(x), free(tab), free(x0), free(g), free(dx0);
    free(l.qkv), free(l.rope), free(l.out), free(l.wt);
    ddp_kernels_close(&K);
}

void test_rope(void **state)
{
    check_rope(2, 9, 6, 2, 10, 10000);  /* hs/2 = 5: odd half; groups of 3 */
    check_rope(1, 33, 9, 3, 64, 2000);  /* SmolLM2-135M's heads */
    check_rope(3, 70, 4, 4, 2, 10000);  /* hs = 2; several tasks of rows */
    check_rope(1, 5, 2, 1, 128, 2000);  /* hs = 128 */
}

/* ---- SwiGLU ---- */

typedef struct {
    double *inp, *wt, *out;
    int N, H;
} sw_loss_t;

static double sw_loss(void *arg)
{
    sw_loss_t *l = arg;
    ref_swiglu(l->out, l->inp, l->N, l->H);
    return kdot(l->out, l->wt, (size_t)l->N * l->H);
}

static void check_swiglu(int N, int H, size_t max_checks)
{
    ddp_kernels_t K = open_cpu();
    krng_t r = {50u + (uint64_t)H};
    size_t n = (size_t)N * H;
    float *inp = rnd(&r, 2 * n, -8, 8), *out = kcalloc(n, 4);
    inp[0] = -100.0f, inp[1] = 100.0f, inp[2] = 0.0f; /* silu's tails and its zero */
    DDP_K(&K, swiglu_fwd, KA(out), KA(inp), N, H);
    sw_loss_t l = {.inp = dof(inp, 2 * n), .out = kcalloc(n, 8), .N = N, .H = H};
    ref_swiglu(l.out, l.inp, N, H);
    assert_int_equal(kclose("swiglu out", out, l.out, n, 1e-5, 1e-7), 0);
    float *dout = rnd(&r, n, -1, 1), *dinp = kcalloc(2 * n, 4);
    memset(dinp, 0xff, 2 * n * sizeof(float)); /* NaNs: overwritten, every element */
    DDP_K(&K, swiglu_bwd, KA(dinp), KA(inp), KA(dout), N, H);
    l.wt = dof(dout, n);
    assert_int_equal(kfd_check("swiglu dinp", sw_loss, &l, l.inp, 2 * n, dinp, NULL, max_checks,
                               &r, RTOL, AFRAC), 0);
    assert_int_equal(ddp_k_sync(&K), 0);
    free(inp), free(out), free(dout), free(dinp), free(l.inp), free(l.out), free(l.wt);
    ddp_kernels_close(&K);
}

void test_swiglu(void **state)
{
    check_swiglu(7, 37, 10000);
    /* element-wise: a few hundred sampled elements check the long shapes (each finite
     * difference evaluates the whole reference; 3,000 took a minute under TSan) */
    check_swiglu(3, 40000, 400);  /* a row longer than a task's chunk */
    check_swiglu(100, 1536, 400); /* SmolLM2-135M's MLP, several rows a task */
}

/* ---- the residual add fused with the norm ---- */

/* fp32 on contexts of 1, 2 and 3 threads: residual_norm_fwd with each norm is bitwise
 * residual_fwd followed by the norm, with res apart from a and aliasing (a copy of) a. */
static void check_residual_norm(int N, int C)
{
    krng_t r = {60u + (uint64_t)C};
    size_t n = (size_t)N * C, sz = (3 * n + 2 * (size_t)N) * 4;
    float *a = rnd(&r, n, -2, 3), *b = rnd(&r, n, -1, 1), *w = rnd(&r, (size_t)C, 0.5, 1.5);
    float *bias = rnd(&r, (size_t)C, -0.5, 0.5);
    /* each: res[n], out[n], a copy of a[n] (aliased), mean[N], rstd[N] */
    float *two = kcalloc(sz / 4, 4), *fused = kcalloc(sz / 4, 4), *alias = kcalloc(sz / 4, 4);
    for (int rms = 0; rms < 2; rms++)
        for (int threads = 1; threads <= 3; threads++) {
            ddp_kernels_t K;
            assert_int_equal(ddp_kernels_open(&K, "cpu", 0, threads), 0);
            float eps = rms ? 1e-6f : 1e-5f, *t = two, *f = fused, *al = alias + 2 * n;
            float *mt = t + 3 * n, *mf = f + 3 * n, *ma = alias + 3 * n;
            DDP_K(&K, residual_fwd, t, a, KA(b), n);
            if (rms)
                DDP_K(&K, rmsnorm_fwd, KA(t + n), mt + N, t, w, N, C, eps);
            else
                DDP_K(&K, layernorm_fwd, KA(t + n), mt, mt + N, t, w, bias, N, C);
            DDP_K(&K, residual_norm_fwd, f, KA(f + n), rms ? NULL : mf, mf + N, a, KA(b), w,
                  rms ? NULL : bias, N, C, eps);
            memcpy(al, a, n * 4);
            DDP_K(&K, residual_norm_fwd, al, KA(alias + n), rms ? NULL : ma, ma + N, al, KA(b), w,
                  rms ? NULL : bias, N, C, eps);
            assert_int_equal(ddp_k_sync(&K), 0);
            ddp_kernels_close(&K);
            memcpy(alias, al, n * 4); /* compared as res; its room as the others' */
            memset(al, 0, n * 4);
            if (memcmp(fused, two, sz) || memcmp(alias, two, sz))
                fail_msg("%s with %d threads: the fused op differs from its two calls (%s)",
                         rms ? "rmsnorm" : "layernorm", threads,
                         memcmp(fused, two, sz) ? "res apart" : "res aliasing a");
        }
    free(a), free(b), free(w), free(bias), free(two), free(fused), free(alias);
}

void test_residual_norm(void **state)
{
    check_residual_norm(3, 7);
    check_residual_norm(37, 131); /* several row tasks, the last partial */
    check_residual_norm(20, 576); /* SmolLM2-135M's width */
}

/* ---- front door ---- */

/* The contract's argument checks: each bad call is not run and DDP_EINVAL is kept. */
void test_llama_front_door(void **state)
{
    float buf[64] = {0}, keep = 7.0f;
    struct {
        const char *what;
        int kind;
    } bad[] = {{"NH not a multiple of NKV (fwd)", 0}, {"NH not a multiple of NKV (bwd)", 1},
               {"NKV = 0", 2},    {"odd hs", 3},  {"rope NULL table", 4},
               {"swiglu_bwd dinp aliasing inp", 5}, {"rmsnorm N = 0", 6},
               {"residual_norm bias without mean", 7}, {"residual_norm NULL b", 8},
               {"residual_norm C = 0", 9}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ddp_kernels_t K = open_cpu();
        buf[0] = keep;
        switch (bad[i].kind) {
        case 0: DDP_K(&K, attention_fwd, KA(buf), buf, KA(buf), 1, 1, 6, 3, 2); break;
        case 1: DDP_K(&K, attention_bwd, KA(buf), KA(buf), KA(buf), KA(buf), buf, 1, 1, 6, 3, 2);
            break;
        case 2: DDP_K(&K, attention_fwd, KA(buf), buf, KA(buf), 1, 1, 6, 3, 0); break;
        case 3: DDP_K(&K, rope_fwd, KA(buf), buf, 1, 1, 1, 1, 3); break;
        case 4: DDP_K(&K, rope_bwd, KA(buf), NULL, 1, 1, 1, 1, 4); break;
        case 5: DDP_K(&K, swiglu_bwd, KA(buf), KA(buf), KA(buf + 32), 1, 4); break;
        case 6: DDP_K(&K, rmsnorm_fwd, KA(buf), buf, buf, buf, 0, 4, 1e-5f); break;
        case 7: DDP_K(&K, residual_norm_fwd, buf, KA(buf + 8), NULL, buf + 16, buf, KA(buf + 20),
                      buf + 24, buf + 28, 1, 4, 1e-5f); break;
        case 8: DDP_K(&K, residual_norm_fwd, buf, KA(buf + 8), NULL, buf + 16, buf, NULL,
                      buf + 24, NULL, 1, 4, 1e-5f); break;
        case 9: DDP_K(&K, residual_norm_fwd, buf, KA(buf + 8), buf + 12, buf + 16, buf,
                      KA(buf + 20), buf + 24, buf + 28, 1, 0, 1e-5f); break;
        }
        if (buf[0] != keep) fail_msg("%s: the op ran", bad[i].what);
        if (ddp_k_sync(&K) != DDP_EINVAL) fail_msg("%s: no DDP_EINVAL kept", bad[i].what);
        ddp_kernels_close(&K);
    }
    /* valid: grouped-query attention, and the encoder without positions */
    ddp_kernels_t K = open_cpu();
    int32_t tok[2] = {1, 0};
    float wte[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[8];
    DDP_K(&K, encoder_fwd, out, tok, wte, NULL, 1, 2, 4);
    DDP_K(&K, attention_fwd, KA(buf), buf + 48, KA(buf + 16), 1, 1, 8, 4, 2);
    assert_int_equal(ddp_k_sync(&K), 0);
    for (int c = 0; c < 4; c++) {
        assert_true(out[c] == wte[4 + c]);
        assert_true(out[4 + c] == wte[c]);
    }
    ddp_kernels_close(&K);
}
