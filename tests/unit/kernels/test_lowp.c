/* Mixed precision in the kernels: the bf16/fp16 rounding of kernels/math/lowp.h against known
 * values, and the CPU backend's matmul in bf16/fp16 both ways it runs:
 * - emulated (fp16; bf16 without AVX512_BF16 or with DDP_CPU_BF16=emulate): equal to its fp32
 *   matmul on inputs rounded beforehand, bitwise (the same sgemm tiles on the same values);
 * - native bf16 (oneDNN, where the CPU has bf16 instructions): each output within fp32
 *   accumulation's error bound of the exact product of the rounded inputs (computed in double),
 *   and bitwise the same for any thread count;
 * with the converted weights refreshed by set_precision. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "kernels/kernels.h"
#include "kernels/math/lowp.h"

#define KA(x) ((ddp_act_t *)(x))

static void test_round_bf16(void **state)
{
    (void)state;
    assert_true(ddp_round_bf16(1.0f) == 1.0f);
    /* 1 + 2^-8 is halfway between bf16's 1 and 1 + 2^-7: ties to even (1) */
    assert_true(ddp_round_bf16(1.0f + 0x1p-8f) == 1.0f);
    assert_true(ddp_round_bf16(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f);
    assert_true(ddp_round_bf16(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f); /* tie, odd: up */
    assert_true(ddp_round_bf16(-3.0f) == -3.0f);
    assert_true(isinf(ddp_round_bf16(3.4e38f)));
    assert_true(isnan(ddp_round_bf16(NAN)));
    assert_true(isinf(ddp_round_bf16(INFINITY)));
    assert_int_equal(ddp_bf16_bits(1.0f), 0x3f80);
}

static void test_round_fp16(void **state)
{
    (void)state;
    assert_true(ddp_round_fp16(1.0f) == 1.0f);
    assert_true(ddp_round_fp16(1.0f + 0x1p-11f) == 1.0f); /* tie to even */
    assert_true(ddp_round_fp16(1.0f + 3 * 0x1p-11f) == 1.0f + 0x1p-9f);
    assert_true(ddp_round_fp16(65504.0f) == 65504.0f); /* largest finite */
    assert_true(ddp_round_fp16(65519.0f) == 65504.0f);
    assert_true(isinf(ddp_round_fp16(65520.0f)) && ddp_round_fp16(65520.0f) > 0);
    assert_true(isinf(ddp_round_fp16(-1e6f)) && ddp_round_fp16(-1e6f) < 0);
    assert_true(ddp_round_fp16(0x1p-14f) == 0x1p-14f);           /* smallest normal */
    assert_true(ddp_round_fp16(0x1p-24f) == 0x1p-24f);           /* smallest subnormal */
    assert_true(ddp_round_fp16(3 * 0x1p-26f) == 0x1p-24f);       /* 0.75 quantum: up */
    assert_true(ddp_round_fp16(0x1p-25f) == 0.0f);               /* tie to even: 0 */
    assert_true(ddp_round_fp16(-5 * 0x1p-25f) == -2 * 0x1p-24f); /* 2.5 quanta: tie to 2 */
    assert_true(isnan(ddp_round_fp16(NAN)));
}

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / 16777216.0f * 4.0f - 2.0f;
}

static float *randv(size_t n, uint64_t *seed)
{
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = frand(seed);
    return v;
}

static float *rounded(const float *x, size_t n, ddp_kprec_t p)
{
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++)
        v[i] = p == DDP_KPREC_BF16 ? ddp_round_bf16(x[i]) : ddp_round_fp16(x[i]);
    return v;
}

static void assert_same(const float *a, const float *b, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            fail_msg("%s[%zu]: %.9g, expected %.9g", what, i, a[i], b[i]);
}

/* got = bias + sum_k x[k sx] y[k sy] (k < K) of rounded inputs, within fp32 accumulation's error
 * bound whatever the order of the additions: |got - exact| <= (K + 2) u sum|terms| + tiny
 * (u = 2^-24), the exact value in double. */
static void assert_dot(float got, const float *x, size_t sx, const float *y, size_t sy, int K,
                       double bias, const char *what, size_t i)
{
    double exact = bias, abssum = fabs(bias);
    for (int k = 0; k < K; k++) {
        double t = (double)x[k * sx] * y[k * sy];
        exact += t, abssum += fabs(t);
    }
    double tol = (K + 2) * 0x1p-24 * abssum + 1e-30;
    if (!(fabs((double)got - exact) <= tol))
        fail_msg("%s[%zu]: %.9g, exact %.9g, bound %.3g", what, i, got, exact, tol);
}

/* out, dinp and dweight of the rounded inputs, each within the bound of the exact product.
 * W(c, o) is rw[c OC + o] (IN_OUT) or rw[o C + c] (OUT_IN). */
static void check_bounds(const float *out, const float *di, const float *dw, const float *rin,
                         const float *rw, const float *rdout, const float *b, int N, int C,
                         int OC, ddp_wlayout_t layout)
{
    int in_out = layout == DDP_W_IN_OUT;
    size_t wc = in_out ? (size_t)OC : 1, wo = in_out ? 1 : (size_t)C; /* W's strides */
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++)
            assert_dot(out[(size_t)n * OC + o], rin + (size_t)n * C, 1, rw + o * wo, wc, C, b[o],
                       "out", (size_t)n * OC + o);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            assert_dot(di[(size_t)n * C + c], rdout + (size_t)n * OC, 1, rw + c * wc, wo, OC, 0,
                       "dinp", (size_t)n * C + c);
    for (int c = 0; c < C; c++)
        for (int o = 0; o < OC; o++) {
            size_t i = c * wc + o * wo;
            assert_dot(dw[i], rin + c, (size_t)C, rdout + o, (size_t)OC, N, 0, "dweight", i);
        }
}

/* One forward and backward at precision p against fp32 on rounded inputs, both layouts:
 * bitwise when `native` is 0, within the bound when 1. With `twin` (a context of another thread
 * count, same path) the results must be bitwise the same there too. */
static void check_matmul(ddp_kernels_t *k, ddp_kernels_t *twin, ddp_kprec_t p, int native,
                         int N, int C, int OC, ddp_wlayout_t layout)
{
    uint64_t seed = 42 + (uint64_t)N * 7 + (uint64_t)OC;
    size_t nin = (size_t)N * C, nw = (size_t)C * OC, nout = (size_t)N * OC;
    float *inp = randv(nin, &seed), *w = randv(nw, &seed), *b = randv((size_t)OC, &seed);
    float *dout = randv(nout, &seed);
    float *rin = rounded(inp, nin, p), *rw = rounded(w, nw, p), *rdout = rounded(dout, nout, p);
    float *out = calloc(nout, 4), *ref = calloc(nout, 4);
    float *di = calloc(nin, 4), *dw = calloc(nw, 4), *db = calloc((size_t)OC, 4);
    float *rdi = calloc(nin, 4), *rdw = calloc(nw, 4), *rdb = calloc((size_t)OC, 4);
    float *scratch = calloc(nw, 4); /* dweight is required; this call wants dbias only */

    DDP_K(k, set_precision, p);
    DDP_K(k, matmul_fwd, KA(out), KA(inp), w, b, N, C, OC, layout);
    DDP_K(k, matmul_bwd, KA(di), dw, db, KA(dout), KA(inp), w, N, C, OC, layout);
    assert_int_equal(ddp_k_sync(k), 0);
    DDP_K(k, set_precision, DDP_KPREC_FP32);
    DDP_K(k, matmul_fwd, KA(ref), KA(rin), rw, b, N, C, OC, layout);
    /* dbias comes from the fp32 dout: give the reference dbias its own call */
    DDP_K(k, matmul_bwd, KA(rdi), rdw, NULL, KA(rdout), KA(rin), rw, N, C, OC, layout);
    DDP_K(k, matmul_bwd, NULL, scratch, rdb, KA(dout), KA(rin), rw, N, C, OC, layout);
    assert_int_equal(ddp_k_sync(k), 0);
    assert_same(db, rdb, (size_t)OC, "dbias");
    if (native) {
        check_bounds(out, di, dw, rin, rw, rdout, b, N, C, OC, layout);
    } else {
        assert_same(out, ref, nout, "out");
        assert_same(di, rdi, nin, "dinp");
        assert_same(dw, rdw, nw, "dweight");
    }
    if (twin) { /* the same products on another thread count: bitwise */
        memset(ref, 0, nout * 4), memset(rdi, 0, nin * 4), memset(rdw, 0, nw * 4);
        memset(rdb, 0, (size_t)OC * 4);
        DDP_K(twin, set_precision, p);
        DDP_K(twin, matmul_fwd, KA(ref), KA(inp), w, b, N, C, OC, layout);
        DDP_K(twin, matmul_bwd, KA(rdi), rdw, rdb, KA(dout), KA(inp), w, N, C, OC, layout);
        assert_int_equal(ddp_k_sync(twin), 0);
        assert_same(ref, out, nout, "out (threads)");
        assert_same(rdi, di, nin, "dinp (threads)");
        assert_same(rdw, dw, nw, "dweight (threads)");
    }
    free(inp), free(w), free(b), free(dout), free(rin), free(rw), free(rdout);
    free(out), free(ref), free(di), free(dw), free(db), free(rdi), free(rdw), free(rdb);
    free(scratch);
}

/* Every product shape class at precision p, with `emulate` forcing the emulated bf16. */
static void check_shapes(ddp_kprec_t p, int emulate)
{
    if (emulate) setenv("DDP_CPU_BF16", "emulate", 1); /* read by set_precision, prec_native */
    ddp_kernels_t k, twin;
    assert_int_equal(ddp_kernels_open(&k, "cpu", 0, 2), 0);
    assert_int_equal(ddp_kernels_open(&twin, "cpu", 0, 3), 0);
    const char *why;
    int native = ddp_k_prec_native(&k, p, &why);
    assert_false(emulate && native);
    check_matmul(&k, &twin, p, native, 37, 29, 53, DDP_W_IN_OUT);
    check_matmul(&k, &twin, p, native, 64, 48, 200, DDP_W_OUT_IN);
    check_matmul(&k, &twin, p, native, 300, 40, 700, DDP_W_IN_OUT); /* several tiles each way */
    check_matmul(&k, &twin, p, native, 16, 32, 9000, DDP_W_OUT_IN); /* split-K dinp */
    ddp_kernels_close(&twin);
    ddp_kernels_close(&k);
    unsetenv("DDP_CPU_BF16");
}

static void test_cpu_matmul_lowp(void **state)
{
    (void)state;
    check_shapes(DDP_KPREC_BF16, 0); /* native where the CPU has bf16 instructions */
    check_shapes(DDP_KPREC_BF16, 1); /* the fallback, forced */
    check_shapes(DDP_KPREC_FP16, 0);
}

/* A new row count per product, as sampling's growing context gives: more shapes than the native
 * path keeps primitives for (it empties its cache between products); every product completes
 * and stays within the bound, and the first shape, made again, gives the same bits. */
static void test_many_shapes(void **state)
{
    (void)state;
    ddp_kernels_t k;
    assert_int_equal(ddp_kernels_open(&k, "cpu", 0, 2), 0);
    enum { NMAX = 1000, C = 16, OCMAX = 80 };
    uint64_t seed = 7;
    float *inp = randv((size_t)NMAX * C, &seed), *w = randv((size_t)C * OCMAX, &seed);
    float *b = calloc(OCMAX, 4), *out = calloc((size_t)NMAX * OCMAX, 4);
    float *first = calloc(OCMAX, 4);
    float *rin = rounded(inp, (size_t)NMAX * C, DDP_KPREC_BF16);
    float *rw = rounded(w, (size_t)C * OCMAX, DDP_KPREC_BF16);
    DDP_K(&k, set_precision, DDP_KPREC_BF16);
    for (int n = 1; n <= NMAX; n++) {
        int OC = 8 + n % 10 * 8; /* ten widths: over a thousand tile shapes in all */
        DDP_K(&k, matmul_fwd, KA(out), KA(inp), w, b, n, C, OC, DDP_W_IN_OUT);
        assert_int_equal(ddp_k_sync(&k), 0);
        if (n == 1) memcpy(first, out, (size_t)OC * 4);
        for (int o = 0; o < OC; o++) /* the last row, the one this n added */
            assert_dot(out[(size_t)(n - 1) * OC + o], rin + (size_t)(n - 1) * C, 1, rw + o,
                       (size_t)OC, C, 0, "out", (size_t)o);
    }
    DDP_K(&k, matmul_fwd, KA(out), KA(inp), w, b, 1, C, 16, DDP_W_IN_OUT);
    assert_int_equal(ddp_k_sync(&k), 0);
    assert_same(out, first, 16, "out (n = 1 again)");
    free(inp), free(w), free(b), free(out), free(first), free(rin), free(rw);
    ddp_kernels_close(&k);
}

/* Whether bf16 is native follows the CPU's flags (and this build having oneDNN); forced off by
 * DDP_CPU_BF16=emulate. */
static void test_native_choice(void **state)
{
    (void)state;
    ddp_kernels_t k;
    assert_int_equal(ddp_kernels_open(&k, "cpu", 0, 1), 0);
    const char *why = NULL;
    int native = ddp_k_prec_native(&k, DDP_KPREC_BF16, &why);
    assert_non_null(why);
#if defined(__x86_64__) && defined(DDP_HAVE_DNNL)
    assert_int_equal(native, __builtin_cpu_supports("avx512bf16") ? 1 : 0);
#else
    assert_int_equal(native, 0);
#endif
    assert_int_equal(ddp_k_prec_native(&k, DDP_KPREC_FP16, &why), 0);
    ddp_kernels_close(&k);
    setenv("DDP_CPU_BF16", "emulate", 1);
    assert_int_equal(ddp_kernels_open(&k, "cpu", 0, 1), 0);
    assert_int_equal(ddp_k_prec_native(&k, DDP_KPREC_BF16, &why), 0);
    assert_non_null(strstr(why, "DDP_CPU_BF16=emulate"));
    assert_int_equal(ddp_kernels_cpu_bf16(&why), 0);
    ddp_kernels_close(&k);
    unsetenv("DDP_CPU_BF16");
    assert_int_equal(ddp_kernels_cpu_bf16(&why), native);
}

/* The converted weight is kept until set_precision: a weight written without it keeps its old
 * copy (the contract in kernels.h), and after set_precision the product sees the new values. */
static void test_weight_copy_refresh(void **state)
{
    (void)state;
    ddp_kernels_t k;
    assert_int_equal(ddp_kernels_open(&k, "cpu", 0, 1), 0);
    float inp[2] = {1.0f, 1.0f}, w[2] = {1.0f, 2.0f}, out[1];
    DDP_K(&k, set_precision, DDP_KPREC_BF16);
    DDP_K(&k, matmul_fwd, KA(out), KA(inp), w, NULL, 1, 2, 1, DDP_W_IN_OUT);
    assert_true(out[0] == 3.0f);
    w[1] = 5.0f;
    DDP_K(&k, matmul_fwd, KA(out), KA(inp), w, NULL, 1, 2, 1, DDP_W_IN_OUT);
    assert_true(out[0] == 3.0f); /* the cached copy */
    DDP_K(&k, set_precision, DDP_KPREC_BF16);
    DDP_K(&k, matmul_fwd, KA(out), KA(inp), w, NULL, 1, 2, 1, DDP_W_IN_OUT);
    assert_true(out[0] == 6.0f);
    /* fp16 overflow shows as Inf in the product */
    DDP_K(&k, set_precision, DDP_KPREC_FP16);
    inp[0] = 70000.0f;
    DDP_K(&k, matmul_fwd, KA(out), KA(inp), w, NULL, 1, 2, 1, DDP_W_IN_OUT);
    assert_true(isinf(out[0]));
    DDP_K(&k, set_precision, (ddp_kprec_t)7); /* not a precision: an error at sync */
    assert_int_equal(ddp_k_sync(&k), DDP_EINVAL);
    ddp_kernels_close(&k);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_bf16),
        cmocka_unit_test(test_round_fp16),
        cmocka_unit_test(test_cpu_matmul_lowp),
        cmocka_unit_test(test_native_choice),
        cmocka_unit_test(test_many_shapes),
        cmocka_unit_test(test_weight_copy_refresh),
    };
    return cmocka_run_group_tests_name("kernels_lowp", tests, NULL, NULL);
}
