/* The learning-rate schedule (worker/optim/schedule.c, through ddp_lr_at): wsd against the
 * formulas of docs/training.md and against llm.c's get_learning_rate_wsd (decay from 0.8 N,
 * 1-sqrt, to min_lr), the cosine kept as it was, and the resume rule (a changed train.steps:
 * refused for cosine unless allowed, a wsd decay moved, or started at a step already past it). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>
#include <cmocka.h>

#include "worker/optim/adamw.h"
#include "worker/optim/schedule.h"

/* |a - b| <= tol in double (cmocka's assert_float_equal rounds to float), printing both */
#define assert_near(a, b, tol)                                                                     \
    do {                                                                                           \
        double a_ = (a), b_ = (b);                                                                 \
        if (!(fabs(a_ - b_) <= (tol)))                                                             \
            fail_msg("%s = %.17g, expected %.17g (tolerance %g)", #a, a_, b_, (double)(tol));      \
    } while (0)

static ddp_spec_t wsd(long steps, long warmup, ddp_decay_shape_t shape)
{
    ddp_spec_t s;
    ddp_spec_defaults(&s);
    s.lr = 1e-3;
    s.min_lr = 0;
    s.steps = steps;
    s.warmup = warmup;
    s.schedule = DDP_SCHED_WSD;
    s.decay_frac = 0.2;
    s.decay_steps = 0;
    s.decay_shape = shape;
    return s;
}

/* llm.c's llmc/schedulers.h get_learning_rate_wsd, transcribed (its float arithmetic kept):
 * step 0-based, N = train_num_batches, min_lr = max_lr * final_learning_rate_frac. */
static float llmc_wsd(long step, long n, long warmup, float max_lr, float frac)
{
    int decay_point = (int)(0.8f * n);
    float min_lr = max_lr * frac;
    if (step < warmup) return max_lr * ((float)(step + 1)) / warmup;
    if (step < decay_point) return max_lr;
    float r = ((float)(step - decay_point)) / (n - decay_point);
    return min_lr + (1.0f - sqrtf(r)) * (max_lr - min_lr);
}

static void test_wsd_matches_llmc(void **state)
{
    (void)state;
    const long ns[] = {100, 1000, 250, 5000};
    const float fracs[] = {0.0f, 0.1f};
    for (size_t i = 0; i < sizeof ns / sizeof *ns; i++)
        for (size_t j = 0; j < 2; j++) {
            ddp_spec_t s = wsd(ns[i], 10, DDP_DECAY_1_SQRT);
            s.min_lr = (double)(1e-3f * fracs[j]);
            s.lr = (double)1e-3f;
            /* ddpd's start is N - round(0.2 N); llm.c's (int)(0.8f N): the same for these N */
            assert_int_equal(ddp_schedule_decay_start(&s), (long)(int)(0.8f * ns[i]));
            for (long step = 0; step < ns[i]; step++) {
                double want = llmc_wsd(step, ns[i], 10, 1e-3f, fracs[j]);
                double got = ddp_lr_at(&s, step);
                if (fabs(got - want) > 1e-6 * 1e-3) /* float tolerance, relative to max_lr */
                    fail_msg("N %ld frac %g step %ld: ddpd %.9g, llm.c %.9g", ns[i],
                             (double)fracs[j], step, got, want);
            }
        }
}

/* The formulas of docs/training.md, point by point. */
static void test_wsd_formulas(void **state)
{
    (void)state;
    ddp_spec_t s = wsd(100, 10, DDP_DECAY_LINEAR);
    s.min_lr = 1e-4;
    assert_int_equal(ddp_schedule_decay_start(&s), 80);
    assert_near(ddp_lr_at(&s, 0), 1e-4, 1e-15);                /* warmup (step + 1) / W */
    assert_near(ddp_lr_at(&s, 9), 1e-3, 1e-15);                /* the last warmup step: lr */
    assert_near(ddp_lr_at(&s, 79), 1e-3, 1e-15);               /* stable */
    assert_near(ddp_lr_at(&s, 80), 1e-3, 1e-15);               /* r = 0 */
    assert_near(ddp_lr_at(&s, 90), 1e-4 + 0.5 * 9e-4, 1e-15);  /* r = 1/2 */
    assert_near(ddp_lr_at(&s, 99), 1e-4 + 0.05 * 9e-4, 1e-15); /* r = 19/20 */
    assert_near(ddp_lr_at(&s, 100), 1e-4, 1e-15);              /* r = 1: min_lr */
    assert_near(ddp_lr_at(&s, 150), 1e-4, 1e-15);              /* clamped */
    s.decay_shape = DDP_DECAY_1_SQRT;
    assert_near(ddp_lr_at(&s, 85), 1e-4 + 0.5 * 9e-4, 1e-15); /* r = 1/4: 1 - 1/2 */
    s.decay_shape = DDP_DECAY_COSINE;
    assert_near(ddp_lr_at(&s, 90), 1e-4 + 0.5 * 9e-4, 1e-15); /* (1 + cos(pi/2)) / 2 */
    assert_near(ddp_lr_at(&s, 85), 1e-4 + 0.5 * (1 + cos(M_PI / 4)) * 9e-4, 1e-15);
    /* decay_steps wins over decay_frac; round(frac x N); never before the warmup ends */
    s.decay_steps = 30;
    assert_int_equal(ddp_schedule_decay_start(&s), 70);
    s.decay_steps = 0;
    s.steps = 7; /* round(1.4) = 1 */
    s.warmup = 0;
    assert_int_equal(ddp_schedule_decay_start(&s), 6);
    s.steps = 100;
    s.warmup = 90;
    assert_int_equal(ddp_schedule_decay_start(&s), 90);
    s.decay_frac = 1.0;
    s.warmup = 0;
    assert_int_equal(ddp_schedule_decay_start(&s), 0); /* all decay */
    assert_near(ddp_lr_at(&s, 0), 1e-3, 1e-15);
}

/* The cosine schedule is the formula it always was (bitwise: the same expression). */
static void test_cosine_unchanged(void **state)
{
    (void)state;
    ddp_spec_t s;
    ddp_spec_defaults(&s);
    s.lr = 1e-3;
    s.min_lr = 1e-4;
    s.warmup = 10;
    s.steps = 110;
    for (long step = 10; step <= 120; step++) {
        double p = (double)(step - 10) / 100.0;
        if (p > 1.0) p = 1.0;
        double want = 1e-4 + 0.5 * (1.0 + cos(M_PI * p)) * (1e-3 - 1e-4);
        assert_true(ddp_lr_at(&s, step) == want);
    }
}

static ddp_schedule_saved_t saved_of(ddp_schedule_t kind, long steps, long start, long forked)
{
    return (ddp_schedule_saved_t){
        .present = 1, .kind = kind, .steps = steps, .decay_start = start, .forked_at = forked};
}

static void test_resume_cosine_refused(void **state)
{
    (void)state;
    ddp_spec_t s;
    ddp_spec_defaults(&s);
    s.steps = 200;
    ddp_schedule_saved_t sv = saved_of(DDP_SCHED_COSINE, 100, 0, 0);
    ddp_schedule_resumed_t r;
    ddp_errinfo_t ei;
    ddp_errinfo_clear(&ei);
    assert_int_equal(ddp_schedule_resume(&s, &sv, 50, &r, &ei), DDP_ESPEC);
    assert_non_null(strstr(ei.msg, "train.steps changed from 100 to 200 under the cosine"));
    assert_non_null(strstr(ei.msg, "train.allow_schedule_change=true"));
    s.allow_schedule_change = 1;
    assert_int_equal(ddp_schedule_resume(&s, &sv, 50, &r, &ei), 0);
    assert_int_equal(r.changed, 1);
    s.allow_schedule_change = 0;
    s.steps = 100; /* unchanged: fine */
    assert_int_equal(ddp_schedule_resume(&s, &sv, 50, &r, &ei), 0);
    assert_int_equal(r.changed, 0);
    /* another kind is refused too, naming both */
    s.schedule = DDP_SCHED_WSD;
    ddp_errinfo_clear(&ei);
    assert_int_equal(ddp_schedule_resume(&s, &sv, 50, &r, &ei), DDP_ESPEC);
    assert_non_null(strstr(ei.msg, "schedule is cosine (train.steps 100) and this spec's is wsd"));
    /* constant takes another steps silently; an old trainer.json (no block) is not checked */
    s.schedule = DDP_SCHED_CONSTANT;
    sv = saved_of(DDP_SCHED_CONSTANT, 100, 0, 0);
    s.steps = 300;
    assert_int_equal(ddp_schedule_resume(&s, &sv, 50, &r, &ei), 0);
    sv.present = 0;
    s.schedule = DDP_SCHED_COSINE;
    assert_int_equal(ddp_schedule_resume(&s, &sv, 50, &r, &ei), 0);
}

/* A cooldown forks from a stable-phase checkpoint: the decay moves to the new steps; a step
 * already past the new start decays from there to the new end; a later resume of the forked
 * run (same spec) keeps where it started. */
static void test_resume_wsd_moves_decay(void **state)
{
    (void)state;
    ddp_schedule_resumed_t r;
    ddp_errinfo_t ei;
    ddp_errinfo_clear(&ei);
    /* trained with steps 1000 (start 800), stopped at 300; resumed with steps 500: start 400 */
    ddp_spec_t s = wsd(500, 10, DDP_DECAY_1_SQRT);
    ddp_schedule_saved_t sv = saved_of(DDP_SCHED_WSD, 1000, 800, 0);
    assert_int_equal(ddp_schedule_resume(&s, &sv, 300, &r, &ei), 0);
    assert_true(r.changed && r.forked_at == 0 && r.decay_start == 400);
    /* resumed at 450 with steps 500: past 400, so the decay runs from 450 to 500 */
    assert_int_equal(ddp_schedule_resume(&s, &sv, 450, &r, &ei), 0);
    assert_true(r.changed && r.forked_at == 450 && r.decay_start == 450);
    ddp_spec_t f = s;
    ddp_schedule_fork(&f, r.forked_at);
    assert_int_equal(ddp_schedule_decay_start(&f), 450);
    assert_near(ddp_lr_at(&f, 449), 1e-3, 1e-15);
    assert_near(ddp_lr_at(&f, 450), 1e-3, 1e-15);
    assert_near(ddp_lr_at(&f, 475), 1e-3 * (1 - sqrt(0.5)), 1e-15);
    assert_near(ddp_lr_at(&f, 500), 0, 1e-15);
    /* the forked run's checkpoint at 470 (start 450, forked_at 450) resumed with the same
     * spec keeps the decay where it was */
    sv = saved_of(DDP_SCHED_WSD, 500, 450, 450);
    assert_int_equal(ddp_schedule_resume(&s, &sv, 470, &r, &ei), 0);
    assert_true(!r.changed && r.forked_at == 450 && r.decay_start == 450);
    /* an unforked run resumed unchanged: nothing moves */
    sv = saved_of(DDP_SCHED_WSD, 500, 400, 0);
    assert_int_equal(ddp_schedule_resume(&s, &sv, 450, &r, &ei), 0);
    assert_true(!r.changed && r.forked_at == 0 && r.decay_start == 400);
    /* the same steps but another decay_frac is a change too */
    s.decay_frac = 0.1;
    assert_int_equal(ddp_schedule_resume(&s, &sv, 300, &r, &ei), 0);
    assert_true(r.changed && r.forked_at == 0 && r.decay_start == 450);
    /* fork is a no-op where it would move nothing */
    ddp_spec_t g = wsd(500, 10, DDP_DECAY_1_SQRT);
    ddp_schedule_fork(&g, 100);
    assert_int_equal(g.decay_steps, 0);
    ddp_schedule_fork(&g, 500);
    assert_int_equal(g.decay_steps, 0);
}

static void test_names(void **state)
{
    (void)state;
    ddp_schedule_t k;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(ddp_schedule_parse(ddp_schedule_name((ddp_schedule_t)i), &k), 0);
        assert_int_equal(k, i);
    }
    assert_int_equal(ddp_schedule_parse("linear", &k), -1);
    assert_string_equal(ddp_decay_shape_name(DDP_DECAY_1_SQRT), "1-sqrt");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wsd_matches_llmc),       cmocka_unit_test(test_wsd_formulas),
        cmocka_unit_test(test_cosine_unchanged),       cmocka_unit_test(test_resume_cosine_refused),
        cmocka_unit_test(test_resume_wsd_moves_decay), cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests_name("schedule", tests, NULL, NULL);
}
