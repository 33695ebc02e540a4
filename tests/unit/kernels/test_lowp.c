/* Mixed precision in the kernels: the bf16/fp16 conversions of kernels/math/lowp.h (against
 * known values, exhaustively over every 16-bit pattern, and against gcc's _Float16 and an
 * independent bf16 reference on edge and random floats), and the CPU backend's bf16 products
 * where a test needs more than test_act16.c's round-on-store contract: many shapes on the native
 * path, the weight copies kept until set_precision, and the choice of the native path. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "kernels/kernels.h"
#include "kernels/math/lowp.h"
#include "tests/unit/proc_status.h"

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

/* fp16 bits <-> fp32, all 65536 patterns: exact widening as gcc's _Float16 does it, and back to
 * the same bits (NaNs stay NaNs of the same sign, quiet). */
static void test_fp16_exhaustive(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        _Float16 g;
        uint16_t hb = (uint16_t)h;
        memcpy(&g, &hb, 2);
        float want = (float)g, got = ddp_fp16_f32(hb);
        int nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        if (nan ? !isnan(got) || signbit(got) != signbit(want)
                : ddp_f32_bits(got) != ddp_f32_bits(want))
            fail_msg("fp16 0x%04x: ddp_fp16_f32 %a, _Float16 %a", h, (double)got, (double)want);
        uint16_t back = ddp_fp16_bits(got);
        if (nan ? (back & 0xfe00) != (h & 0x8000) + 0x7e00 : back != h)
            fail_msg("fp16 0x%04x: back to 0x%04x", h, back);
    }
}

/* bf16 bits <-> fp32, all 65536 patterns: the top half of the fp32, and back. */
static void test_bf16_exhaustive(void **state)
{
    (void)state;
    for (uint32_t b = 0; b < 65536; b++) {
        float got = ddp_bf16_f32((uint16_t)b);
        if (ddp_f32_bits(got) != b << 16) fail_msg("bf16 0x%04x: %a", b, (double)got);
        int nan = (b & 0x7f80) == 0x7f80 && (b & 0x7f);
        uint16_t back = ddp_bf16_bits(got);
        if (nan ? (back & 0xffc0) != (b & 0x8000) + 0x7fc0 || !(back & 0x7f) : back != b)
            fail_msg("bf16 0x%04x: back to 0x%04x", b, back);
    }
}

/* An independent bf16 rounding: the nearer of the two bf16 neighbours of x (by truncation and one
 * ulp up, compared in double), ties to the even one. Finite x only. */
static uint16_t ref_bf16(float x)
{
    uint32_t u = ddp_f32_bits(x), lo = u & 0xffff0000u, hi = lo + 0x10000u;
    /* one step above the largest finite bf16 is Inf, standing for 2^128 here */
    double hv = (hi & 0x7fffffffu) == 0x7f800000u ? copysign(0x1p128, x) : ddp_bits_f32(hi);
    double dl = fabs((double)x - ddp_bits_f32(lo)), dh = fabs(hv - x);
    uint32_t pick = dl < dh ? lo : dh < dl ? hi : ((lo >> 16) & 1 ? hi : lo);
    return (uint16_t)(pick >> 16);
}

/* Conversions of edge and random floats against gcc's _Float16 (fp16) and ref_bf16 (bf16). */
static void test_conversions_edges(void **state)
{
    (void)state;
    float edge[] = {0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e6f,
                    0x1p-14f, 0x1p-24f, 0x1p-25f, 3 * 0x1p-26f, 0x1p-25f + 0x1p-40f, 1e-30f,
                    0x1.ffep-15f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 1.0f + 0x1p-8f,
                    3.4e38f, -3.4e38f, 0x1.fefffep127f, 0x1.ff0000p127f, 1e-45f, 1.17549435e-38f,
                    INFINITY, -INFINITY, NAN, -NAN};
    uint64_t seed = 99;
    for (size_t i = 0; i < sizeof edge / sizeof *edge + 1000000; i++) {
        float x;
        if (i < sizeof edge / sizeof *edge) {
            x = edge[i];
        } else { /* random bit patterns: every exponent, subnormals, NaNs */
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t u = (uint32_t)(seed >> 32);
            x = ddp_bits_f32(u);
        }
        _Float16 g = (_Float16)x;
        uint16_t want;
        memcpy(&want, &g, 2);
        uint16_t got = ddp_fp16_bits(x);
        if (isnan(x) ? (got & 0x7e00) != 0x7e00 || (got ^ want) & 0x8000 : got != want)
            fail_msg("fp16 of %a: 0x%04x, _Float16 0x%04x", (double)x, got, want);
        if (isnan(x) || isinf(x)) {
            uint16_t b = ddp_bf16_bits(x);
            if (isinf(x) ? b != (ddp_f32_bits(x) >> 16) : (b & 0x7fc0) != 0x7fc0)
                fail_msg("bf16 of %a: 0x%04x", (double)x, b);
            continue;
        }
        if (ddp_bf16_bits(x) != ref_bf16(x))
            fail_msg("bf16 of %a: 0x%04x, reference 0x%04x", (double)x, ddp_bf16_bits(x),
                     ref_bf16(x));
    }
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

/* got = bias + sum_k x[k sx] y[k sy] (k < K) of rounded inputs, stored as bf16: within fp32
 * accumulation's error bound whatever the order of the additions plus the one rounding on
 * store: |got - exact| <= (K + 2) u sum|terms| + 2^-8 |exact| + tiny (u = 2^-24), the exact
 * value in double. */
static void assert_dot(float got, const float *x, size_t sx, const float *y, size_t sy, int K,
                       double bias, const char *what, size_t i)
{
    double exact = bias, abssum = fabs(bias);
    for (int k = 0; k < K; k++) {
        double t = (double)x[k * sx] * y[k * sy];
        exact += t, abssum += fabs(t);
    }
    double tol = (K + 2) * 0x1p-24 * abssum + 0x1p-8 * fabs(exact) + 1e-30;
    if (!(fabs((double)got - exact) <= tol))
        fail_msg("%s[%zu]: %.9g, exact %.9g, bound %.3g", what, i, got, exact, tol);
}

/* A new row count per product, as sampling's growing context gives: more shapes than the native
 * path keeps primitives for (it empties its cache between products); every product completes
 * and stays within the bound, the first shape, made again, gives the same bits, and the memory
 * of the primitives it let go is given back: the resident set stops growing once the cache
 * has filled (it grew 14 MiB over the last 500 shapes while oneDNN kept a cache of its own). */
static void test_many_shapes(void **state)
{
    (void)state;
    ddp_kernels_t k;
    assert_int_equal(ddp_kernels_open(&k, "cpu", 0, 2), 0);
    enum { NMAX = 1000, C = 16, OCMAX = 80 };
    uint64_t seed = 7;
    float *inp = randv((size_t)NMAX * C, &seed), *w = randv((size_t)C * OCMAX, &seed);
    float *b = calloc(OCMAX, 4);
    uint16_t *out = calloc((size_t)NMAX * OCMAX, 2), *first = calloc(OCMAX, 2);
    uint16_t *inp16 = calloc((size_t)NMAX * C, 2);
    float *rin = rounded(inp, (size_t)NMAX * C, DDP_KPREC_BF16);
    float *rw = rounded(w, (size_t)C * OCMAX, DDP_KPREC_BF16);
    for (size_t i = 0; i < (size_t)NMAX * C; i++) inp16[i] = ddp_bf16_bits(inp[i]);
    DDP_K(&k, set_precision, DDP_KPREC_BF16);
    long rss_half = 0;
    for (int n = 1; n <= NMAX; n++) {
        int OC = 8 + n % 10 * 8; /* ten widths: over a thousand tile shapes in all */
        DDP_K(&k, matmul_fwd, KA(out), KA(inp16), w, b, n, C, OC, OC, DDP_W_IN_OUT);
        assert_int_equal(ddp_k_sync(&k), 0);
        if (n == 1) memcpy(first, out, (size_t)OC * 2);
        if (n == NMAX / 2) rss_half = proc_status_kib("VmRSS");
        for (int o = 0; o < OC; o++) /* the last row, the one this n added */
            assert_dot(ddp_bf16_f32(out[(size_t)(n - 1) * OC + o]), rin + (size_t)(n - 1) * C, 1,
                       rw + o, (size_t)OC, C, 0, "out", (size_t)o);
    }
    long rss_end = proc_status_kib("VmRSS");
    assert_true(rss_half >= 0 && rss_end >= 0);
    long grew = rss_end - rss_half;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    /* a sanitizer's allocator keeps freed blocks resident (ASan's quarantine): normal builds only */
    (void)grew;
#else
    if (grew > 6 << 10)
        fail_msg("the resident set grew %ld KiB over the last %d shapes", grew, NMAX / 2);
#endif
    DDP_K(&k, matmul_fwd, KA(out), KA(inp16), w, b, 1, C, 16, 16, DDP_W_IN_OUT);
    assert_int_equal(ddp_k_sync(&k), 0);
    assert_memory_equal(out, first, 16 * 2);
    free(inp), free(w), free(b), free(out), free(first), free(rin), free(rw), free(inp16);
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
    uint16_t inp[2] = {ddp_bf16_bits(1.0f), ddp_bf16_bits(1.0f)}, out[1];
    float w[2] = {1.0f, 2.0f};
    DDP_K(&k, set_precision, DDP_KPREC_BF16);
    DDP_K(&k, matmul_fwd, KA(out), KA(inp), w, NULL, 1, 2, 1, 1, DDP_W_IN_OUT);
    assert_true(ddp_bf16_f32(out[0]) == 3.0f);
    w[1] = 5.0f;
    DDP_K(&k, matmul_fwd, KA(out), KA(inp), w, NULL, 1, 2, 1, 1, DDP_W_IN_OUT);
    assert_true(ddp_bf16_f32(out[0]) == 3.0f); /* the cached copy */
    DDP_K(&k, set_precision, DDP_KPREC_BF16);
    DDP_K(&k, matmul_fwd, KA(out), KA(inp), w, NULL, 1, 2, 1, 1, DDP_W_IN_OUT);
    assert_true(ddp_bf16_f32(out[0]) == 6.0f);
    /* fp16 overflow shows as Inf: finite inputs whose product exceeds 65504 */
    DDP_K(&k, set_precision, DDP_KPREC_FP16);
    inp[0] = inp[1] = ddp_fp16_bits(60000.0f);
    DDP_K(&k, matmul_fwd, KA(out), KA(inp), w, NULL, 1, 2, 1, 1, DDP_W_IN_OUT);
    assert_int_equal(out[0], 0x7c00);
    DDP_K(&k, set_precision, (ddp_kprec_t)7); /* not a precision: an error at sync */
    assert_int_equal(ddp_k_sync(&k), DDP_EINVAL);
    ddp_kernels_close(&k);
}

/* A device buffer of n floats holding x (or zeros). */
static float *dev_floats(ddp_kernels_t *k, const float *x, size_t n)
{
    float *d = NULL;
    assert_int_equal(ddp_k_alloc(k, (void **)&d, n * sizeof(float)), 0);
    if (x)
        assert_int_equal(ddp_k_memcpy_h2d(k, d, x, n * sizeof(float)), 0);
    else
        assert_int_equal(ddp_k_memset0(k, d, n * sizeof(float)), 0);
    return d;
}

/* The product out = inp @ W + b, with W and b read from the arena w_host at `off`, on a context
 * that converts the weights afresh (the reference for a kept copy). */
static void fresh_product(ddp_kprec_t prec, const float *w_host, size_t n, size_t off,
                          const uint16_t *inp, int N, int C, int OC, uint16_t *out)
{
    ddp_kernels_t k;
    assert_int_equal(ddp_kernels_open(&k, "cpu", 0, 1), 0);
    DDP_K(&k, set_precision, prec);
    (void)n;
    DDP_K(&k, matmul_fwd, KA(out), KA(inp), w_host + off, w_host + off + (size_t)C * OC, N, C,
          OC, OC, DDP_W_IN_OUT);
    assert_int_equal(ddp_k_sync(&k), 0);
    ddp_kernels_close(&k);
}

/* set_weights' arena: the products read one 16-bit copy of it, and adamw on the arena keeps
 * that copy current without set_precision -- a whole update, an update of part of it (a
 * sharded step's slice), with and without the CPU's CRCs -- while a write by other means still
 * needs set_precision. Each product after an update equals a fresh conversion's bit for bit and
 * differs from the product before it (the update moved the weights). On the CPU (native bf16
 * where this CPU has it, and emulated), in fp16, and on the simulated GPU. */
static void arena_case(const char *be, ddp_kprec_t prec)
{
    enum { N = 5, C = 24, OC = 40, OFF = 6 };
    const size_t nw = (size_t)C * OC, n = OFF + nw + OC + 10; /* weights among other tensors */
    ddp_kernels_t k;
    assert_int_equal(ddp_kernels_open(&k, be, 0, 2), 0);
    uint64_t seed = 11;
    float *w0 = randv(n, &seed), *g = randv(n, &seed), *in = randv((size_t)N * C, &seed);
    float *w = malloc(n * sizeof *w);
    uint16_t inp[N * C], before[N * OC], after[N * OC], want[N * OC];
    for (int i = 0; i < N * C; i++)
        inp[i] = prec == DDP_KPREC_BF16 ? ddp_bf16_bits(in[i]) : ddp_fp16_bits(in[i]);
    float *dw = dev_floats(&k, w0, n), *dg = dev_floats(&k, g, n);
    float *dm = dev_floats(&k, NULL, n), *dv = dev_floats(&k, NULL, n);
    uint16_t *dinp = NULL, *dout = NULL;
    assert_int_equal(ddp_k_alloc(&k, (void **)&dinp, sizeof inp), 0);
    assert_int_equal(ddp_k_alloc(&k, (void **)&dout, sizeof before), 0);
    assert_int_equal(ddp_k_memcpy_h2d(&k, dinp, inp, sizeof inp), 0);
    DDP_K(&k, set_precision, prec);
    DDP_K(&k, set_weights, dw, n);
    uint32_t crc[3 * 4];
    /* the update's ranges: all of it (twice: the second time with CRCs on the CPU), then only
     * a part that cuts the weight matrix, leaving the bias as it was */
    ddp_kadamw_range_t all[2] = {{0, OFF + nw / 2, 0.1f}, {OFF + nw / 2, n, 0.0f}};
    ddp_kadamw_range_t part[1] = {{OFF + 7, OFF + nw - 9, 0.1f}};
    for (int round = 0; round < 4; round++) {
        DDP_K(&k, matmul_fwd, KA(dout), KA(dinp), dw + OFF, dw + OFF + nw, N, C, OC, OC,
              DDP_W_IN_OUT);
        assert_int_equal(ddp_k_memcpy_d2h(&k, before, dout, sizeof before), 0);
        if (round < 3) {
            int whole = round < 2;
            uint32_t *c = round == 1 && !strcmp(be, "cpu") ? crc : NULL;
            DDP_K(&k, adamw, dw, dg, dm, dv, whole ? all : part, whole ? 2 : 1, 0.05f, 0.9f,
                  0.95f, 1e-8f, 1.0f, round + 1, c);
        } else { /* another write, as a collective's: the copy is refreshed by set_precision */
            for (size_t i = 0; i < n; i++) w[i] = -w0[i];
            assert_int_equal(ddp_k_memcpy_h2d(&k, dw, w, n * sizeof *w), 0);
            DDP_K(&k, set_precision, prec);
        }
        DDP_K(&k, matmul_fwd, KA(dout), KA(dinp), dw + OFF, dw + OFF + nw, N, C, OC, OC,
              DDP_W_IN_OUT);
        assert_int_equal(ddp_k_memcpy_d2h(&k, after, dout, sizeof after), 0);
        assert_int_equal(ddp_k_memcpy_d2h(&k, w, dw, n * sizeof *w), 0);
        assert_int_equal(ddp_k_sync(&k), 0);
        fresh_product(prec, w, n, OFF, inp, N, C, OC, want);
        if (memcmp(after, want, sizeof want))
            fail_msg("%s %s, round %d: the product after the update read a stale weight copy", be,
                     prec == DDP_KPREC_BF16 ? "bf16" : "fp16", round);
        assert_memory_not_equal(after, before, sizeof before);
    }
    free(w0), free(g), free(in), free(w);
    float *bufs[] = {dw, dg, dm, dv, (float *)dinp, (float *)dout};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) ddp_k_free(&k, bufs[i]);
    ddp_kernels_close(&k);
}

static void test_arena_copy_kept(void **state)
{
    (void)state;
    arena_case("cpu", DDP_KPREC_BF16);
    arena_case("cpu", DDP_KPREC_FP16);
    arena_case("sim", DDP_KPREC_BF16);
    setenv("DDP_CPU_BF16", "emulate", 1); /* the rounded-float copies */
    arena_case("cpu", DDP_KPREC_BF16);
    unsetenv("DDP_CPU_BF16");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_bf16),
        cmocka_unit_test(test_round_fp16),
        cmocka_unit_test(test_fp16_exhaustive),
        cmocka_unit_test(test_bf16_exhaustive),
        cmocka_unit_test(test_conversions_edges),
        cmocka_unit_test(test_native_choice),
        cmocka_unit_test(test_many_shapes),
        cmocka_unit_test(test_weight_copy_refresh),
        cmocka_unit_test(test_arena_copy_kept),
    };
    return cmocka_run_group_tests_name("kernels_lowp", tests, NULL, NULL);
}
