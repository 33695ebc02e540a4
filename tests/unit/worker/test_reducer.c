/* The reducer over a real ring communicator whose ranks are threads (the fake transport) with an
 * artificially slow link: buckets start while "backward" is still producing gradients (none do
 * with ddp.overlap off), and the result is the exact sum (with the accumulator added in) on
 * every rank. How much faster overlap makes a step is a benchmark's question
 * (tests/bench/ddp_scaling.sh), not a unit test's: timed assertions flake on a loaded machine. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "collectives/coll.h"
#include "common/clock.h"
#include "worker/sync/reducer.h"

#define RANKS 2
#define N (3u << 18)      /* 3 MiB of floats: small, so even an instrumented (TSan) ring's
                           * copying stays well below its injected per-chunk delays */
#define SLICES 6          /* backward reports the arena in 6 growing prefixes */
#define COMPUTE_US 30000  /* "compute" per slice */
#define DELAY_US 8000     /* per chunk on the ring's thread */

typedef struct {
    ddp_coll_fake_world_t *world;
    int rank, overlap, use_acc;
    double step_ms;
    int started_early; /* buckets that started before backward ended */
    int n_buckets;
    int rc;
    int wrong; /* elements that differ from the expected sum */
} rank_job_t;

static float value(int rank, size_t i) { return (float)((i % 97) * 0.25 + rank); }

static void *run_rank(void *arg)
{
    rank_job_t *j = arg;
    ddp_kernels_t k;
    ddp_coll_t *comm = NULL;
    ddp_reducer_t r;
    float *arena = calloc(N, sizeof *arena), *acc = calloc(N, sizeof *acc);
    ddp_coll_opts_t opts = {.chunk_delay_us = DELAY_US, .chunk_bytes = 64 << 10};
    j->rc = ddp_kernels_open(&k, "cpu", 0, 1);
    if (!j->rc) j->rc = ddp_coll_new_fake(j->world, j->rank, &opts, &comm);
    ddp_world_t world = {.comm = comm, .rank = j->rank, .size = RANKS, .k = &k};
    ddp_reducer_cfg_t cfg = {.world = &world,
                             .arena = arena,
                             .n = N,
                             .first_bucket_mb = 0.25,
                             .bucket_mb = 0.5,
                             .overlap = j->overlap};
    if (!j->rc) j->rc = ddp_reducer_init(&r, &cfg);
    if (j->rc) return NULL;
    for (size_t i = 0; i < N; i++) acc[i] = 1.0f;

    int64_t t0 = ddp_now_ns();
    ddp_reducer_begin(&r, j->use_acc ? acc : NULL);
    for (int s = 1; s <= SLICES; s++) {
        size_t lo = (size_t)N * (s - 1) / SLICES, hi = (size_t)N * s / SLICES;
        for (size_t i = lo; i < hi; i++) arena[i] = value(j->rank, i);
        usleep(COMPUTE_US);
        j->rc = ddp_reducer_ready(&r, hi);
        if (j->rc) break;
    }
    ddp_reducer_stats_t st;
    if (!j->rc) j->rc = ddp_reducer_finish(&r, &st, NULL);
    j->step_ms = (double)(ddp_now_ns() - t0) / 1e6;
    j->n_buckets = r.n_buckets;
    for (int b = 0; b < r.n_buckets; b++) j->started_early += r.times[b].start < r.backward_end;
    for (size_t i = 0; i < N; i++) {
        float want = 0;
        for (int q = 0; q < RANKS; q++) want += value(q, i) + (j->use_acc ? 1.0f : 0.0f);
        j->wrong += arena[i] != want;
    }
    ddp_reducer_close(&r);
    ddp_coll_free(comm);
    ddp_kernels_close(&k);
    free(arena);
    free(acc);
    return NULL;
}

static void run_world(rank_job_t *jobs, int overlap, int use_acc)
{
    ddp_coll_fake_world_t *w;
    assert_int_equal(ddp_coll_fake_world_new(RANKS, &w), 0);
    pthread_t th[RANKS];
    for (int q = 0; q < RANKS; q++) {
        jobs[q] = (rank_job_t){.world = w, .rank = q, .overlap = overlap, .use_acc = use_acc};
        pthread_create(&th[q], NULL, run_rank, &jobs[q]);
    }
    for (int q = 0; q < RANKS; q++) pthread_join(th[q], NULL);
    ddp_coll_fake_world_free(w);
    for (int q = 0; q < RANKS; q++) {
        assert_int_equal(jobs[q].rc, 0);
        assert_int_equal(jobs[q].wrong, 0);
    }
}

static void test_buckets_split_arena(void **state)
{
    (void)state;
    ddp_reducer_t r;
    ddp_world_t one = {.rank = 0, .size = 1};
    ddp_reducer_cfg_t cfg = {
        .world = &one, .n = 1000000, .first_bucket_mb = 1.0, .bucket_mb = 2.0, .overlap = 1};
    assert_int_equal(ddp_reducer_init(&r, &cfg), 0);
    /* 1 MiB = 262144 floats, then 2 MiB = 524288: 262144, 786432, 1000000 */
    assert_int_equal(r.n_buckets, 3);
    assert_int_equal(r.bucket_end[0], 262144);
    assert_int_equal(r.bucket_end[1], 786432);
    assert_int_equal(r.bucket_end[2], 1000000);
    /* one rank updates whole buckets; norm blocks of 16384 floats restart at each bucket:
     * 16 + 32 + 14 (213568 floats: the last block short) */
    assert_int_equal(r.parts[1].lo, 262144);
    assert_int_equal(r.parts[1].hi, 786432);
    assert_int_equal(r.parts[1].block, 16);
    assert_int_equal(r.parts[2].block, 48);
    assert_int_equal(r.n_norm_blocks, 62);
    ddp_reducer_close(&r);
}

static void test_overlap_starts_buckets_during_backward(void **state)
{
    (void)state;
    rank_job_t with[RANKS], without[RANKS];
    run_world(with, 1, 0);
    run_world(without, 0, 0);
    for (int q = 0; q < RANKS; q++) {
        fprintf(stderr, "rank %d: %d of %d buckets started before backward ended; step %.1f ms "
                      "with overlap, %.1f ms without\n",
                      q, with[q].started_early, with[q].n_buckets, with[q].step_ms,
                      without[q].step_ms);
        assert_true(with[q].started_early >= with[q].n_buckets / 2);
        assert_int_equal(without[q].started_early, 0);
    }
}

static void test_accumulator_added_before_reduction(void **state)
{
    (void)state;
    rank_job_t jobs[RANKS];
    run_world(jobs, 1, 1); /* run_world checks every element against the expected sum */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_buckets_split_arena),
        cmocka_unit_test(test_overlap_starts_buckets_during_backward),
        cmocka_unit_test(test_accumulator_added_before_reduction),
    };
    return cmocka_run_group_tests_name("reducer", tests, NULL, NULL);
}
