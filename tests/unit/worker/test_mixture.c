/* The mixture's assignment (worker/data/mixture.h): every source stays within 1 - 1/(2K - 2)
 * sequences of its share at every prefix of 10,000 samples, for K = 2..8 and weightings drawn
 * uniform, skewed and with one dominant source; a source's k-th draw is its sequence k (no
 * repeat, no gap); new weights on a rebase keep the counts and hold the bound from the base;
 * seeking back replays the same assignment; bad weights are refused. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "worker/data/mixture.h"

#define PREFIX 10000

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double uniform(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) * (1.0 / 9007199254740992.0);
}

/* Draws PREFIX samples one at a time from s and returns the largest |count_d - base_d -
 * w_d (j - base_seq)| over every prefix and source; checks that each source's k runs 0, 1, ... */
static double worst_deviation(const ddp_mixture_t *m, ddp_mixture_state_t *s, int64_t n)
{
    double worst = 0;
    int64_t next_k[DDP_MIXTURE_MAX];
    memcpy(next_k, s->count, sizeof next_k);
    for (int64_t i = 0; i < n; i++) {
        int src;
        uint64_t k;
        ddp_mixture_draw(m, s, 1, &src, &k, NULL);
        assert_in_range(src, 0, m->n - 1);
        assert_int_equal(k, next_k[src]);
        next_k[src]++;
        double since = (double)(s->at - s->base_seq);
        for (int d = 0; d < m->n; d++) {
            double dev = fabs((double)(s->count[d] - s->base[d]) - m->w[d] * since);
            if (dev > worst) worst = dev;
        }
    }
    return worst;
}

static void random_weights(double *w, int K, int kind)
{
    for (int d = 0; d < K; d++) {
        double u = uniform();
        w[d] = kind == 0   ? u + 1e-3
               : kind == 1 ? pow(u, 4) + 1e-4
                           : (d == 0 ? 1.0 : 1e-2 * u + 1e-4);
    }
}

static void test_bound_every_prefix(void **state)
{
    (void)state;
    for (int K = 2; K <= DDP_MIXTURE_MAX; K++) {
        double bound = 1.0 - 1.0 / (2.0 * K - 2.0), measured = 0;
        for (int trial = 0; trial < 60; trial++) {
            double w[DDP_MIXTURE_MAX];
            random_weights(w, K, trial % 3);
            ddp_mixture_t m;
            assert_int_equal(ddp_mixture_init(&m, w, K), 0);
            ddp_mixture_state_t s;
            ddp_mixture_state_init(&s, K);
            double dev = worst_deviation(&m, &s, PREFIX);
            if (dev > bound + 1e-9)
                fail_msg("K=%d trial %d: deviation %.6f > bound %.6f", K, trial, dev, bound);
            if (dev > measured) measured = dev;
        }
        fprintf(stderr,
                "# K=%d: worst |deviation| %.4f over 60 weightings x %d samples (bound %.4f)\n", K,
                measured, PREFIX, bound);
    }
}

static void test_known_sequences(void **state)
{
    (void)state;
    ddp_mixture_t m;
    ddp_mixture_state_t s;
    int src[8];
    double half[2] = {1, 1};
    assert_int_equal(ddp_mixture_init(&m, half, 2), 0);
    ddp_mixture_state_init(&s, 2);
    ddp_mixture_draw(&m, &s, 8, src, NULL, NULL);
    for (int i = 0; i < 8; i++) assert_int_equal(src[i], i % 2);
    /* 1:3 -> one in four from source 0 */
    double quarter[2] = {1, 3};
    int64_t drawn[2] = {0, 0};
    assert_int_equal(ddp_mixture_init(&m, quarter, 2), 0);
    ddp_mixture_state_init(&s, 2);
    ddp_mixture_draw(&m, &s, 400, NULL, NULL, drawn);
    assert_int_equal(drawn[0], 100);
    assert_int_equal(drawn[1], 300);
    assert_int_equal(s.at, 400);
}

/* Weights change at 4,321: every source's k goes on from its count (nothing repeated or
 * skipped), and from the new base the new weights hold the bound again. */
static void test_rebase_keeps_counts(void **state)
{
    (void)state;
    double w1[3] = {0.7, 0.2, 0.1}, w2[3] = {0.1, 0.3, 0.6};
    ddp_mixture_t m1, m2;
    assert_int_equal(ddp_mixture_init(&m1, w1, 3), 0);
    assert_int_equal(ddp_mixture_init(&m2, w2, 3), 0);
    ddp_mixture_state_t s;
    ddp_mixture_state_init(&s, 3);
    assert_true(worst_deviation(&m1, &s, 4321) <= 0.75 + 1e-9);
    int64_t before[3];
    memcpy(before, s.count, sizeof before);
    ddp_mixture_rebase(&s);
    assert_int_equal(s.base_seq, 4321);
    double dev = worst_deviation(&m2, &s, PREFIX); /* checks k continues from before[] */
    assert_true(dev <= 0.75 + 1e-9);
    int64_t total = 0;
    for (int d = 0; d < 3; d++) {
        total += s.count[d];
        assert_true(s.count[d] >= before[d]);
        double share = (double)(s.count[d] - before[d]) / PREFIX;
        assert_true(fabs(share - m2.w[d]) < 1e-3);
    }
    assert_int_equal(total, 4321 + PREFIX);
}

/* Seeking back (a step redone) replays from the base: the same counts as drawing forward. */
static void test_seek_back_replays(void **state)
{
    (void)state;
    double w[4] = {3, 1, 1, 2};
    ddp_mixture_t m;
    assert_int_equal(ddp_mixture_init(&m, w, 4), 0);
    ddp_mixture_state_t a, b;
    ddp_mixture_state_init(&a, 4);
    ddp_mixture_draw(&m, &a, 100, NULL, NULL, NULL);
    ddp_mixture_rebase(&a);
    ddp_mixture_draw(&m, &a, 777, NULL, NULL, NULL);
    b = a;
    ddp_mixture_seek(&m, &b, 500); /* back */
    assert_int_equal(b.at, 500);
    ddp_mixture_seek(&m, &b, 877); /* forward again */
    assert_memory_equal(&a, &b, sizeof a);
}

static void test_bad_weights_refused(void **state)
{
    (void)state;
    ddp_mixture_t m;
    double zero[2] = {1, 0}, neg[2] = {1, -1}, inf[2] = {1, INFINITY};
    assert_int_equal(ddp_mixture_init(&m, zero, 2), DDP_EINVAL);
    assert_int_equal(ddp_mixture_init(&m, neg, 2), DDP_EINVAL);
    assert_int_equal(ddp_mixture_init(&m, inf, 2), DDP_EINVAL);
    assert_int_equal(ddp_mixture_init(&m, zero, 0), DDP_EINVAL);
    assert_int_equal(ddp_mixture_init(&m, zero, DDP_MIXTURE_MAX + 1), DDP_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bound_every_prefix),  cmocka_unit_test(test_known_sequences),
        cmocka_unit_test(test_rebase_keeps_counts), cmocka_unit_test(test_seek_back_replays),
        cmocka_unit_test(test_bad_weights_refused),
    };
    return cmocka_run_group_tests_name("mixture", tests, NULL, NULL);
}
