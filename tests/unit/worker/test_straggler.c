/* Straggler detection's bookkeeping (worker/sync/straggler.c): a rank >= 20% above the median for
 * DDP_STRAGGLER_STEPS steps in a row is named once, stays named while slow, and is cleared when it
 * catches up; one slow rank of two cannot hide behind the median. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "worker/sync/straggler.h"

static void test_named_after_steps_in_a_row(void **state)
{
    (void)state;
    ddp_straggler_t s = {.named = -1};
    assert_int_equal(ddp_straggler_init(&s, 4), 0);
    const float even[4] = {100, 101, 99, 100}, slow2[4] = {100, 101, 130, 100};
    for (int i = 0; i < DDP_STRAGGLER_STEPS - 1; i++)
        assert_int_equal(ddp_straggler_update(&s, slow2), -1); /* not yet */
    assert_int_equal(ddp_straggler_update(&s, even), -1);      /* the run of slow steps breaks */
    for (int i = 0; i < DDP_STRAGGLER_STEPS - 1; i++)
        assert_int_equal(ddp_straggler_update(&s, slow2), -1);
    assert_int_equal(ddp_straggler_update(&s, slow2), 2); /* the 5th in a row: named */
    assert_int_equal(s.named, 2);
    assert_true(s.named_ms == 130 && s.median_ms == 100);
    assert_int_equal(ddp_straggler_update(&s, slow2), -1); /* named once, stays named */
    assert_int_equal(s.named, 2);
    assert_int_equal(ddp_straggler_update(&s, even), -1); /* caught up: cleared */
    assert_int_equal(s.named, -1);
    ddp_straggler_close(&s);
}

static void test_two_ranks_and_threshold(void **state)
{
    (void)state;
    ddp_straggler_t s = {.named = -1};
    assert_int_equal(ddp_straggler_init(&s, 2), 0);
    const float fast_slow[2] = {100, 125}, close[2] = {100, 115};
    int named = -1;
    for (int i = 0; i < DDP_STRAGGLER_STEPS; i++) named = ddp_straggler_update(&s, fast_slow);
    assert_int_equal(named, 1); /* the lower median: the slow one of two is still seen */
    ddp_straggler_close(&s);
    assert_int_equal(ddp_straggler_init(&s, 2), 0);
    for (int i = 0; i < 3 * DDP_STRAGGLER_STEPS; i++)
        assert_int_equal(ddp_straggler_update(&s, close), -1); /* 15% is within the noise */
    ddp_straggler_close(&s);
    assert_int_equal(ddp_straggler_init(&s, 1), 0);
    const float one[1] = {500};
    for (int i = 0; i < 2 * DDP_STRAGGLER_STEPS; i++)
        assert_int_equal(ddp_straggler_update(&s, one), -1); /* a world of one has none */
    ddp_straggler_close(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_named_after_steps_in_a_row),
        cmocka_unit_test(test_two_ranks_and_threshold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
