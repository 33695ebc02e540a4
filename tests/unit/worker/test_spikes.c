/* Spike skipping's detector (worker/sync/spikes.c) against a double-precision transcription of
 * llm.c's llmc/outlier_detector.h (running sums, population variance, the new value in first):
 * no z until the window is full, the same z after, |z| <= sqrt(window - 1), one-sided
 * decisions (the loss tested first), non-finite values kept out, and a window copied mid-run
 * (a checkpoint, a state transfer) going on exactly as the original. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "worker/sync/spikes.h"

/* |a - b| <= tol in double (cmocka's assert_float_equal rounds to float), printing both */
#define assert_near(a, b, tol)                                                                     \
    do {                                                                                           \
        double a_ = (a), b_ = (b);                                                                 \
        if (!(fabs(a_ - b_) <= (tol)))                                                             \
            fail_msg("%s = %.17g, expected %.17g (tolerance %g)", #a, a_, b_, (double)(tol));      \
    } while (0)

/* llm.c's OutlierDetector with its window as a parameter. */
typedef struct llmc_det {
    double buffer[DDP_SPEC_MAX_SKIP_WINDOW];
    int count, index, size;
    double sum, sum_sq;
} llmc_det_t;

static double llmc_update(llmc_det_t *d, double x)
{
    if (d->count < d->size) {
        d->buffer[d->count++] = x;
        d->sum += x;
        d->sum_sq += x * x;
        return NAN;
    }
    double old = d->buffer[d->index];
    d->sum -= old;
    d->sum_sq -= old * old;
    d->buffer[d->index] = x;
    d->sum += x;
    d->sum_sq += x * x;
    d->index = (d->index + 1) % d->size;
    double mean = d->sum / d->size, var = d->sum_sq / d->size - mean * mean;
    double sd = sqrt(var);
    if (sd == 0.0) return 0.0;
    return (x - mean) / sd;
}

/* llm.c's definition without its running sums: the window's mean and population variance
 * afresh, in long double, after the new value entered (the exact reference). */
static double exact_z(const llmc_det_t *d, double x)
{
    long double sum = 0, ss = 0;
    for (int i = 0; i < d->size; i++) sum += d->buffer[i];
    long double mean = sum / d->size;
    for (int i = 0; i < d->size; i++) ss += (d->buffer[i] - mean) * (d->buffer[i] - mean);
    long double sd = sqrtl(ss / d->size);
    return sd == 0 ? 0.0 : (double)((x - mean) / sd);
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double uniform(void) /* xorshift64*, in [0, 1) */
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (double)((rng * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
}

/* A loss-like series: a slow decline with noise and a spike every 97 values. */
static double series(int i)
{
    double x = 4.0 - 0.001 * i + 0.05 * (uniform() - 0.5);
    return i % 97 == 96 ? x * 3 : x;
}

static void test_matches_llmc(void **state)
{
    (void)state;
    const int sizes[] = {2, 5, 16, 128};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        int n = sizes[k];
        static llmc_det_t ref;
        static ddp_spike_window_t w;
        memset(&ref, 0, sizeof ref);
        memset(&w, 0, sizeof w);
        ref.size = n;
        for (int i = 0; i < 2000; i++) {
            double x = series(i);
            double want = llmc_update(&ref, x), got = ddp_spike_push(&w, n, x);
            if (i < n) { /* the first n values fill the window: no z, as llm.c */
                if (!isnan(got)) fail_msg("window %d value %d: z %g before full", n, i, got);
                continue;
            }
            /* the definition, exactly; and llm.c's own numbers where its running sums hold
             * (a window of 2 or 5 nearly equal values cancels in sum_sq/n - mean^2: its z
             * drifts, to 0.93 where the exact one is 1) */
            double exact = exact_z(&ref, x);
            if (!(fabs(got - exact) <= 1e-9 * (1 + fabs(exact))))
                fail_msg("window %d value %d: z %.15g, exact %.15g", n, i, got, exact);
            if (n >= 16 && !(fabs(got - want) <= 1e-3 * (1 + fabs(want))))
                fail_msg("window %d value %d: z %.12g, llm.c %.12g", n, i, got, want);
            if (fabs(got) > sqrt(n - 1.0) * (1 + 1e-9)) /* rounding only */
                fail_msg("window %d value %d: |z| %.17g > sqrt(%d)", n, i, got, n - 1);
        }
    }
}

/* The bound is reached by one outlier in a flat window: z = sqrt(n - 1) exactly (in exact
 * arithmetic); a flat window gives 0. */
static void test_bound(void **state)
{
    (void)state;
    static ddp_spike_window_t w;
    memset(&w, 0, sizeof w);
    for (int i = 0; i < 64; i++) assert_true(isnan(ddp_spike_push(&w, 64, 1.0)));
    assert_near(ddp_spike_push(&w, 64, 1.0), 0.0, 0); /* zero spread */
    double z = ddp_spike_push(&w, 64, 1000.0);
    assert_near(z, sqrt(63.0), 1e-9);
    assert_true(z <= sqrt(63.0) * (1 + 1e-12));
}

static void test_decisions(void **state)
{
    (void)state;
    ddp_spec_t spec;
    ddp_spec_defaults(&spec);
    spec.skip_window = 8;
    spec.skip_loss_z = 2.0;
    spec.skip_norm_z = 2.0;
    static ddp_spikes_t s;
    memset(&s, 0, sizeof s);
    double zl, zn;
    /* no skipping until full, even for a huge value (the 8th fills the window) */
    for (int i = 0; i < 7; i++)
        assert_int_equal(ddp_spikes_step(&s, &spec, 3.0 + 0.01 * (i % 2), 1.0, &zl, &zn),
                         DDP_SKIP_NONE);
    assert_int_equal(ddp_spikes_step(&s, &spec, 100.0, 100.0, &zl, &zn), DDP_SKIP_NONE);
    assert_true(isnan(zl) && isnan(zn));
    for (int i = 0; i < 8; i++) ddp_spikes_step(&s, &spec, 3.0 + 0.01 * (i % 2), 1.0, NULL, NULL);
    /* a dip far below the mean never skips (one-sided) */
    assert_int_equal(ddp_spikes_step(&s, &spec, 0.1, 1.0, &zl, &zn), DDP_SKIP_NONE);
    assert_true(zl < -2.0);
    for (int i = 0; i < 8; i++) ddp_spikes_step(&s, &spec, 3.0 + 0.01 * (i % 2), 1.0, NULL, NULL);
    /* both spike: the loss is named (tested first); then the norm alone */
    assert_int_equal(ddp_spikes_step(&s, &spec, 30.0, 50.0, &zl, &zn), DDP_SKIP_LOSS);
    assert_true(zl > 2.0 && zn > 2.0);
    for (int i = 0; i < 8; i++) ddp_spikes_step(&s, &spec, 3.0 + 0.01 * (i % 2), 1.0, NULL, NULL);
    assert_int_equal(ddp_spikes_step(&s, &spec, 3.0, 50.0, &zl, &zn), DDP_SKIP_NORM);
    assert_int_equal(s.skipped_loss, 1);
    assert_int_equal(s.skipped_norm, 1);
    /* a threshold of 0 is off */
    for (int i = 0; i < 8; i++) ddp_spikes_step(&s, &spec, 3.0 + 0.01 * (i % 2), 1.0, NULL, NULL);
    spec.skip_loss_z = 0;
    assert_int_equal(ddp_spikes_step(&s, &spec, 30.0, 1.0, &zl, &zn), DDP_SKIP_NONE);
    assert_true(zl > 2.0);
    /* a non-finite value enters no window and decides nothing */
    ddp_spike_window_t before = s.loss;
    assert_int_equal(ddp_spikes_step(&s, &spec, 3.0, NAN, &zl, &zn), DDP_SKIP_NONE);
    assert_true(isnan(zl) && isnan(zn));
    assert_memory_equal(&before, &s.loss, sizeof before);
    assert_string_equal(ddp_skip_name(DDP_SKIP_LOSS), "loss");
    assert_string_equal(ddp_skip_name(DDP_SKIP_NORM), "norm");
    assert_string_equal(ddp_skip_name(DDP_SKIP_NONFINITE), "nonfinite");
    assert_null(ddp_skip_name(DDP_SKIP_NONE));
}

/* A window copied mid-run (what a checkpoint or the state transfer carries) goes on exactly as
 * the window it was copied from: z depends on the window's bytes alone. */
static void test_copy_continues_exactly(void **state)
{
    (void)state;
    static ddp_spike_window_t a, b;
    memset(&a, 0, sizeof a);
    for (int i = 0; i < 300; i++) ddp_spike_push(&a, 128, series(i));
    b = a;
    for (int i = 300; i < 700; i++) {
        double x = series(i);
        double za = ddp_spike_push(&a, 128, x), zb = ddp_spike_push(&b, 128, x);
        assert_memory_equal(&za, &zb, sizeof za);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_llmc),
        cmocka_unit_test(test_bound),
        cmocka_unit_test(test_decisions),
        cmocka_unit_test(test_copy_continues_exactly),
    };
    return cmocka_run_group_tests_name("spikes", tests, NULL, NULL);
}
