/* ddp.grad_dtype: bf16 gradient buckets (worker/sync/grad_dtype.h) through the reducer over a real
 * ring communicator whose ranks are threads (the fake transport).
 *  - narrowing and widening in place give each value's bf16 rounding bitwise, signed zeros, NaN,
 *    Inf, subnormals and ties to even included, for odd lengths;
 *  - on 3 ranks every rank ends with the same bits, two runs (with and without overlap) are
 *    bitwise equal, the sums are within the bound of W + (W - 1) roundings of the exact sum and
 *    not all equal to fp32's (the rounding happened), and ZeRO-1's reduce-scatter gives this
 *    rank's parts bitwise;
 *  - a rank that contributes -0.0 everywhere (the elastic joiner during an overlapped state
 *    transfer, worker/step.c) leaves the others' bf16 sum bitwise as without it;
 *  - a world of one rounds nothing.
 */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "collectives/coll.h"
#include "kernels/math/lowp.h"
#include "worker/sync/grad_dtype.h"
#include "worker/sync/reducer.h"

#define RANKS 3
#define N 300001 /* floats: odd, not a multiple of the ring's chunks or of the slices */

typedef struct {
    ddp_coll_fake_world_t *world;
    int rank, zero1, joiner; /* joiner: this rank contributes -0.0 everywhere */
    int overlap;             /* buckets start during "backward" (else all after it) */
    int rc;
    float *out;              /* [N] the reduced arena (the caller frees) */
    ddp_arena_part_t *parts; /* this rank's parts (the caller frees) */
    int n_parts;
} rank_job_t;

/* Rank q's gradient element i: mixed signs and magnitudes, exact zeros of both signs, values
 * that need rounding to bf16 */
static float value(int q, size_t i)
{
    uint32_t h = (uint32_t)(i * 2654435761u) ^ (uint32_t)(q * 40503u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    if (h % 17 == 0) return (h & 1) ? -0.0f : 0.0f;
    float mag = ldexpf(1.0f + (float)(h & 0xffff) / 65536.0f, (int)(h >> 16) % 24 - 12);
    return (h >> 31) ? -mag : mag;
}

static void *run_rank(void *arg)
{
    rank_job_t *j = arg;
    ddp_kernels_t k;
    ddp_coll_t *comm = NULL;
    ddp_reducer_t r;
    j->out = calloc(N, sizeof *j->out);
    ddp_coll_opts_t opts = {.chunk_bytes = 16 << 10};
    j->rc = ddp_kernels_open(&k, "cpu", 0, 1);
    if (!j->rc) j->rc = ddp_coll_new_fake(j->world, j->rank, &opts, &comm);
    ddp_world_t world = {.comm = comm, .rank = j->rank, .size = RANKS, .k = &k};
    ddp_reducer_cfg_t cfg = {.world = &world,
                             .arena = j->out,
                             .n = N,
                             .first_bucket_mb = 0.1,
                             .bucket_mb = 0.4,
                             .overlap = j->overlap,
                             .zero1 = j->zero1,
                             .bf16 = 1};
    if (!j->rc) j->rc = ddp_reducer_init(&r, &cfg);
    if (j->rc) return NULL;
    for (size_t i = 0; i < N; i++) j->out[i] = j->joiner ? -0.0f : value(j->rank, i);
    ddp_reducer_begin(&r, NULL);
    for (int s = 1; s <= 4 && !j->rc; s++) j->rc = ddp_reducer_ready(&r, (size_t)N * s / 4);
    if (!j->rc) j->rc = ddp_reducer_finish(&r, NULL, NULL);
    j->n_parts = r.n_buckets;
    j->parts = malloc((size_t)r.n_buckets * sizeof *j->parts);
    memcpy(j->parts, r.parts, (size_t)r.n_buckets * sizeof *j->parts);
    ddp_reducer_close(&r);
    ddp_coll_free(comm);
    ddp_kernels_close(&k);
    return NULL;
}

/* Runs the reducer on RANKS threads; jobs[q].out holds rank q's arena afterwards. */
static void run_world(rank_job_t *jobs, int zero1, int joiner, int overlap)
{
    ddp_coll_fake_world_t *w;
    assert_int_equal(ddp_coll_fake_world_new(RANKS, &w), 0);
    pthread_t th[RANKS];
    for (int q = 0; q < RANKS; q++) {
        jobs[q] = (rank_job_t){
            .world = w, .rank = q, .zero1 = zero1, .joiner = q == joiner, .overlap = overlap};
        assert_int_equal(pthread_create(&th[q], NULL, run_rank, &jobs[q]), 0);
    }
    for (int q = 0; q < RANKS; q++) pthread_join(th[q], NULL);
    ddp_coll_fake_world_free(w);
    for (int q = 0; q < RANKS; q++) assert_int_equal(jobs[q].rc, 0);
}

static void free_world(rank_job_t *jobs)
{
    for (int q = 0; q < RANKS; q++) {
        free(jobs[q].out);
        free(jobs[q].parts);
    }
}

static int same_bits(float a, float b) { return ddp_f32_bits(a) == ddp_f32_bits(b); }

static void test_narrow_widen_in_place(void **state)
{
    (void)state;
    const float special[] = {
        0.0f,    -0.0f,    INFINITY,       -INFINITY,      NAN,  1e-40f, -1e-40f,
        3.4e38f, -3.4e38f, 1.0f + 0x1p-8f, 1.0f + 0x3p-8f, 0.1f, -2.5f,  1.0f + 0x1p-7f + 0x1p-9f,
        65504.0f};
    size_t ns = sizeof special / sizeof *special, n = 1001;
    float *x = malloc(n * sizeof *x), *orig = malloc(n * sizeof *orig);
    for (size_t i = 0; i < n; i++) orig[i] = i < ns ? special[i] : value(1, i);
    memcpy(x, orig, n * sizeof *x);
    ddp_grad_narrow_host(x, n);
    const uint16_t *h = (const uint16_t *)x;
    for (size_t i = 0; i < n; i++)
        if (h[i] != ddp_bf16_bits(orig[i]))
            fail_msg("narrowed element %zu: 0x%04x, want 0x%04x (from %a)", i, h[i],
                     ddp_bf16_bits(orig[i]), (double)orig[i]);
    assert_int_equal(h[1], 0x8000);  /* -0.0 stays -0.0 */
    assert_int_equal(h[9], 0x3f80);  /* 1 + 2^-8: a tie, to even (1) */
    assert_int_equal(h[10], 0x3f82); /* 1 + 3 * 2^-8: a tie, to even (up) */
    ddp_grad_widen_host(x, n);
    for (size_t i = 0; i < n; i++) {
        float want = ddp_round_bf16(orig[i]);
        if (isnan(orig[i]) ? !isnan(x[i]) : !same_bits(x[i], want))
            fail_msg("widened element %zu: %a, want %a", i, (double)x[i], (double)want);
    }
    free(x);
    free(orig);
}

static void test_three_ranks_bitwise(void **state)
{
    (void)state;
    rank_job_t a[RANKS], b[RANKS], z[RANKS];
    run_world(a, 0, -1, 1);
    run_world(b, 0, -1, 0); /* the second run without overlap: the same sums */
    run_world(z, 1, -1, 1);
    size_t not_fp32 = 0;
    for (size_t i = 0; i < N; i++) {
        double exact = 0, mag = 0;
        float fp32 = 0;
        for (int q = 0; q < RANKS; q++) {
            exact += value(q, i);
            mag += fabs(value(q, i));
            fp32 += value(q, i);
        }
        float got = a[0].out[i];
        for (int q = 0; q < RANKS; q++) {
            if (!same_bits(a[q].out[i], got))
                fail_msg("element %zu: rank %d has %a, rank 0 %a", i, q, (double)a[q].out[i],
                         (double)got);
            if (!same_bits(b[q].out[i], got))
                fail_msg("element %zu, rank %d: the second run gave %a, the first %a", i, q,
                         (double)b[q].out[i], (double)got);
        }
        /* W input roundings and W - 1 partial sums', each within 2^-8 relative (bf16 keeps 8 bits) */
        double bound = mag * (2 * RANKS - 1) * 0x1p-8 * 1.01;
        if (fabs((double)got - exact) > bound)
            fail_msg("element %zu: %a is %g from the exact sum %g (bound %g)", i, (double)got,
                     fabs((double)got - exact), exact, bound);
        not_fp32 += !same_bits(got, fp32);
        assert_true(ddp_f32_bits(got) << 16 == 0); /* a bf16 value */
    }
    fprintf(stderr, "# %zu of %u sums differ from fp32's (rounded to bf16)\n", not_fp32, N);
    assert_true(not_fp32 > N / 2);
    /* ZeRO-1: this rank's parts are bitwise the all-reduce's */
    size_t checked = 0;
    for (int q = 0; q < RANKS; q++)
        for (int p = 0; p < z[q].n_parts; p++)
            for (size_t i = z[q].parts[p].lo; i < z[q].parts[p].hi; i++, checked++)
                if (!same_bits(z[q].out[i], a[q].out[i]))
                    fail_msg("ZeRO-1 rank %d element %zu: %a, the all-reduce %a", q, i,
                             (double)z[q].out[i], (double)a[q].out[i]);
    assert_int_equal(checked, N); /* the parts cover the arena once */
    free_world(a);
    free_world(b);
    free_world(z);
}

static void test_joiner_minus_zero_exact(void **state)
{
    (void)state;
    rank_job_t j[RANKS];
    run_world(j, 0, RANKS - 1, 1); /* the last rank is the joiner */
    for (size_t i = 0; i < N; i++) {
        /* the holders' bf16 sum, one rounding each and one of the sum: their order does not
         * matter with two, and the joiner's -0.0 adds nothing */
        float want = ddp_round_bf16(ddp_round_bf16(value(0, i)) + ddp_round_bf16(value(1, i)));
        for (int q = 0; q < RANKS; q++)
            if (!same_bits(j[q].out[i], want))
                fail_msg("element %zu, rank %d: %a, want the holders' %a (%a + %a)", i, q,
                         (double)j[q].out[i], (double)want, (double)value(0, i),
                         (double)value(1, i));
    }
    free_world(j);
}

static void test_world_of_one_rounds_nothing(void **state)
{
    (void)state;
    ddp_kernels_t k;
    assert_int_equal(ddp_kernels_open(&k, "cpu", 0, 1), 0);
    ddp_world_t one = {.rank = 0, .size = 1, .k = &k};
    float *g = malloc(N * sizeof *g);
    for (size_t i = 0; i < N; i++) g[i] = value(0, i);
    ddp_reducer_t r;
    ddp_reducer_cfg_t cfg = {
        .world = &one, .arena = g, .n = N, .first_bucket_mb = 0.1, .bucket_mb = 0.4, .bf16 = 1};
    assert_int_equal(ddp_reducer_init(&r, &cfg), 0);
    assert_int_equal(r.bf16, 0);
    ddp_reducer_begin(&r, NULL);
    assert_int_equal(ddp_reducer_ready(&r, N), 0);
    assert_int_equal(ddp_reducer_finish(&r, NULL, NULL), 0);
    for (size_t i = 0; i < N; i++)
        if (!same_bits(g[i], value(0, i)))
            fail_msg("element %zu: %a, want %a unchanged", i, (double)g[i], (double)value(0, i));
    ddp_reducer_close(&r);
    ddp_kernels_close(&k);
    free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_narrow_widen_in_place),
        cmocka_unit_test(test_three_ranks_bitwise),
        cmocka_unit_test(test_joiner_minus_zero_exact),
        cmocka_unit_test(test_world_of_one_rounds_nothing),
    };
    return cmocka_run_group_tests_name("grad_dtype", tests, NULL, NULL);
}
