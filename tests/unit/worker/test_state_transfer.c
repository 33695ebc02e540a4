/* The choice between pausing for a joiner's state and overlapping it with a step
 * (ddp_transfer_overlap_pays): the transfer's time, estimated from the gradient all-reduce, against
 * the busiest holder's extra micro-batches. The transfer itself runs with real processes in
 * tests/integration/test_elastic.sh (both modes) and test_ddp_sim.sh (NCCL's chunks). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "worker/sync/transfer.h"

#define MB (1000.0 * 1000.0)

/* 4 ranks whose 100 MB gradient all-reduce took 150 ms: a link carries 150 MB in 150 ms, so the
 * 300 MB of weights and moments take 300 ms. */
static ddp_step_times_t figures(double micro_ms)
{
    return (ddp_step_times_t){.micro_ms = micro_ms, .comm.comm_ms = 150, .world = 4};
}

static void test_overlap_when_the_transfer_outlasts_the_lost_share(void **state)
{
    (void)state;
    ddp_step_times_t h = figures(250);
    /* 8 micro-batches: 2 per rank at 4, 3 for the busiest of 3: one extra, 250 ms < 300 ms */
    assert_true(ddp_transfer_overlap_pays(&h, 300 * MB, (size_t)(100 * MB), 4, 1, 8));
    h.micro_ms = 350; /* 350 ms > 300 ms: pause */
    assert_false(ddp_transfer_overlap_pays(&h, 300 * MB, (size_t)(100 * MB), 4, 1, 8));
}

static void test_no_extra_work_always_overlaps(void **state)
{
    (void)state;
    ddp_step_times_t h = figures(10000);
    /* 9 micro-batches: 3 for the busiest of 4 and of 3 alike: overlapping costs nothing */
    assert_true(ddp_transfer_overlap_pays(&h, 300 * MB, (size_t)(100 * MB), 4, 1, 9));
}

static void test_many_ranks_favour_overlap(void **state)
{
    (void)state;
    /* 64 ranks, 64 micro-batches: the busiest holder of 63 takes 2 instead of 1 */
    ddp_step_times_t h = {.micro_ms = 200, .comm.comm_ms = 200, .world = 64};
    assert_true(ddp_transfer_overlap_pays(&h, 300 * MB, (size_t)(100 * MB), 64, 1, 64));
    /* 640 micro-batches: 10 -> 11, one extra again */
    assert_true(ddp_transfer_overlap_pays(&h, 300 * MB, (size_t)(100 * MB), 64, 1, 640));
}

static void test_unknown_figures_pause(void **state)
{
    (void)state;
    ddp_step_times_t none = {0};
    assert_false(ddp_transfer_overlap_pays(&none, 300 * MB, (size_t)(100 * MB), 4, 1, 8));
    ddp_step_times_t alone = figures(1); /* the source trained alone: no all-reduce */
    alone.world = 1;
    assert_false(ddp_transfer_overlap_pays(&alone, 300 * MB, (size_t)(100 * MB), 4, 1, 8));
    ddp_step_times_t h = figures(1); /* nobody would be left to compute */
    assert_false(ddp_transfer_overlap_pays(&h, 300 * MB, (size_t)(100 * MB), 2, 2, 8));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_overlap_when_the_transfer_outlasts_the_lost_share),
        cmocka_unit_test(test_no_extra_work_always_overlaps),
        cmocka_unit_test(test_many_ranks_favour_overlap),
        cmocka_unit_test(test_unknown_figures_pause),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
