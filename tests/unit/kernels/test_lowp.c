/* Mixed precision in the kernels: the bf16/fp16 rounding of kernels/math/lowp.h against known
 * values, and the CPU backend's matmul in bf16/fp16, which must equal its fp32 matmul on inputs
 * rounded beforehand (bitwise: the same sgemm tiles run on the same rounded values), with the
 * converted weights refreshed by set_precision. */
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

/* One forward and backward at precision p vs fp32 on rounded inputs, both layouts. */
static void check_matmul(ddp_kernels_t *k, ddp_kprec_t p, int N, int C, int OC,
                         ddp_wlayout_t layout)
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
    DDP_K(k, matmul_fwd, out, inp, w, b, N, C, OC, layout);
    DDP_K(k, matmul_bwd, di, dw, db, dout, inp, w, N, C, OC, layout);
    assert_int_equal(ddp_k_sync(k), 0);
    DDP_K(k, set_precision, DDP_KPREC_FP32);
    DDP_K(k, matmul_fwd, ref, rin, rw, b, N, C, OC, layout);
    /* dbias comes from the fp32 dout: give the reference dbias its own call */
    DDP_K(k, matmul_bwd, rdi, rdw, NULL, rdout, rin, rw, N, C, OC, layout);
    DDP_K(k, matmul_bwd, NULL, scratch, rdb, dout, rin, rw, N, C, OC, layout);
    assert_int_equal(ddp_k_sync(k), 0);
    assert_same(out, ref, nout, "out");
    assert_same(di, rdi, nin, "dinp");
    assert_same(dw, rdw, nw, "dweight");
    assert_same(db, rdb, (size_t)OC, "dbias");
    free(inp), free(w), free(b), free(dout), free(rin), free(rw), free(rdout);
    free(out), free(ref), free(di), free(dw), free(db), free(rdi), free(rdw), free(rdb);
    free(scratch);
}

static void test_cpu_matmul_lowp(void **state)
{
    (void)state;
    ddp_kernels_t k;
    assert_int_equal(ddp_kernels_open(&k, "cpu", 0, 2), 0);
    const ddp_kprec_t precs[2] = {DDP_KPREC_BF16, DDP_KPREC_FP16};
    for (int p = 0; p < 2; p++) {
        check_matmul(&k, precs[p], 37, 29, 53, DDP_W_IN_OUT);
        check_matmul(&k, precs[p], 64, 48, 200, DDP_W_OUT_IN);
        check_matmul(&k, precs[p], 16, 32, 9000, DDP_W_OUT_IN); /* split-K dinp */
    }
    ddp_kernels_close(&k);
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
    DDP_K(&k, matmul_fwd, out, inp, w, NULL, 1, 2, 1, DDP_W_IN_OUT);
    assert_true(out[0] == 3.0f);
    w[1] = 5.0f;
    DDP_K(&k, matmul_fwd, out, inp, w, NULL, 1, 2, 1, DDP_W_IN_OUT);
    assert_true(out[0] == 3.0f); /* the cached copy */
    DDP_K(&k, set_precision, DDP_KPREC_BF16);
    DDP_K(&k, matmul_fwd, out, inp, w, NULL, 1, 2, 1, DDP_W_IN_OUT);
    assert_true(out[0] == 6.0f);
    /* fp16 overflow shows as Inf in the product */
    DDP_K(&k, set_precision, DDP_KPREC_FP16);
    inp[0] = 70000.0f;
    DDP_K(&k, matmul_fwd, out, inp, w, NULL, 1, 2, 1, DDP_W_IN_OUT);
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
        cmocka_unit_test(test_weight_copy_refresh),
    };
    return cmocka_run_group_tests_name("kernels_lowp", tests, NULL, NULL);
}
