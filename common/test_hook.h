/* Test hooks: fault injection and delays that the tests switch on from outside a production
 * binary (a NaN in one step's gradient, a rank that hangs, a slow link...), kept in one place.
 *
 * One process-wide table, ddp_test_hooks_t, is filled once where a program reads its
 * environment (ddp-worker: worker/main.c's read_env; a unit test: the test itself) and installed
 * with ddp_test_hooks_set before any thread consults it; it is read-only afterwards. The code
 * under test names the point it has reached with ddp_test_hook(point, step, rank), which acts
 * there (sleeps, or stops for good) or answers whether the caller must inject the fault. With no
 * table installed every hook is off, and a hook costs a load and a compare.
 *
 * Thread-safety: ddp_test_hook may be called from any thread (the ring's communication thread,
 * the checkpoint writer); ddp_test_hooks_set only while no other thread runs one.
 */
#ifndef DDP_COMMON_TEST_HOOK_H
#define DDP_COMMON_TEST_HOOK_H

/* Where a hook acts, with the variable that switches it on (zeros: off). */
typedef enum ddp_hook_point {
    /* DDP_TEST_HANG=S:R: rank R stops for good as step S begins (logged), for a test to kill
     * it there; in an elastic job, only in its first generation (the step is then redone, and
     * a replacement rejoins, without stopping again). Never returns when it fires. */
    DDP_HOOK_STEP_BEGIN,
    /* DDP_TEST_SLOW_RANK=R:US: rank R (its rank when training started) sleeps US microseconds
     * after each micro-step's forward. */
    DDP_HOOK_MICRO_STEP,
    /* DDP_TEST_NAN_STEP=N: 1 at step N: the caller puts a NaN in the step's gradient. */
    DDP_HOOK_GRADIENTS,
    /* DDP_TEST_OVERFLOW=S:R: 1 at step S on rank R: fp16's loss scale is infinite there, as an
     * overflow on one rank would make it. */
    DDP_HOOK_LOSS_SCALE,
    /* DDP_TEST_REPLICA_FLIP_RANK=R: 1 on rank R: its replica check sees a flipped bit. */
    DDP_HOOK_REPLICA_CHECK,
    /* DDP_TEST_CKPT_SHARD_DELAY_MS=MS: a checkpoint writer sleeps MS milliseconds after each
     * shard it wrote, before the next one, so that a test can kill a process mid-save. */
    DDP_HOOK_CKPT_SHARD,
    /* DDP_COLL_DELAY_US=US: the ring sleeps US microseconds before each chunk it sends (an
     * artificially slow link; on the communication thread, so compute is unaffected). */
    DDP_HOOK_RING_SEND,
    /* DDP_TEST_LOSS_SPIKE=S:R: 1 at step S on rank R: its loss sum gains 1000 before the step's
     * vote, so every rank sees the step's loss jump (spike skipping's test). */
    DDP_HOOK_LOSS_SPIKE,
    /* DDP_TEST_NORM_SPIKE=S: 1 at step S: the caller multiplies the reduced gradient by 1000 on
     * every rank (the gradient norm jumps alike everywhere). */
    DDP_HOOK_NORM_SPIKE,
    /* DDP_TEST_EVAL_HANG=S:R: rank R stops for good as the evaluation after step S begins
     * (logged), for a test to kill it there; only in an elastic job's first generation. Never
     * returns when it fires. */
    DDP_HOOK_EVAL,
    /* DDP_TEST_HOST_OF_RANK=H0,H1,...: rank r pretends to run on host number Hr (the
     * collectives' bootstraps append it to the host id), so that one machine stands for several
     * hosts in a test of the two-level all-reduce. Returns 1 + Hr, or 0 (off, or r past the
     * list). */
    DDP_HOOK_HOST,
} ddp_hook_point_t;

/* Every hook's setting; zeros: off. */
typedef struct ddp_test_hooks {
    long hang_step;         /* DDP_HOOK_STEP_BEGIN: step (1-based) and rank */
    int hang_rank;
    long slow_us;           /* DDP_HOOK_MICRO_STEP: the sleep, and the rank */
    int slow_rank;
    long nan_step;          /* DDP_HOOK_GRADIENTS: the step (1-based) */
    long overflow_step;     /* DDP_HOOK_LOSS_SCALE: step (1-based) and rank */
    int overflow_rank;
    int flip;               /* DDP_HOOK_REPLICA_CHECK: on, and the rank */
    int flip_rank;
    long ckpt_shard_delay_ms; /* DDP_HOOK_CKPT_SHARD */
    long ring_send_delay_us;  /* DDP_HOOK_RING_SEND */
    long loss_spike_step;     /* DDP_HOOK_LOSS_SPIKE: step (1-based) and rank */
    int loss_spike_rank;
    long norm_spike_step; /* DDP_HOOK_NORM_SPIKE: step (1-based) */
    long eval_hang_step;      /* DDP_HOOK_EVAL: step (1-based) and rank */
    int eval_hang_rank;
    char host_of_rank[256];   /* DDP_HOOK_HOST: comma-separated host numbers, "" off */
} ddp_test_hooks_t;

/* Installs a copy of *h (NULL: all off) as the process's hooks. */
void ddp_test_hooks_set(const ddp_test_hooks_t *h);

/* This process has reached `point` in step `step` (1-based; ignored where the point has none)
 * as rank `rank`. Delays sleep here and the hang never returns; returns 1 when the caller must
 * inject the point's fault (DDP_HOOK_GRADIENTS, _LOSS_SCALE, _REPLICA_CHECK, _LOSS_SPIKE,
 * _NORM_SPIKE), else 0. */
int ddp_test_hook(ddp_hook_point_t point, long step, int rank);

#endif
