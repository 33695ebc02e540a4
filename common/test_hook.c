/* Test hooks (see test_hook.h). */
#include "common/test_hook.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"

static ddp_test_hooks_t hooks; /* zeros until ddp_test_hooks_set: every hook off */

void ddp_test_hooks_set(const ddp_test_hooks_t *h)
{
    hooks = h ? *h : (ddp_test_hooks_t){0};
}

/* Sleeps ns nanoseconds, resuming after a signal. */
static void sleep_ns(long long ns)
{
    if (ns <= 0) return;
    struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {}
}

int ddp_test_hook(ddp_hook_point_t point, long step, int rank)
{
    const ddp_test_hooks_t *h = &hooks;
    switch (point) {
    case DDP_HOOK_STEP_BEGIN:
        if (h->hang_step <= 0 || h->hang_step != step || h->hang_rank != rank) return 0;
        DDP_WARN("test hook: rank %d hangs as step %ld begins (DDP_TEST_HANG)", rank, step);
        for (;;) pause();
    case DDP_HOOK_MICRO_STEP:
        if (h->slow_us > 0 && h->slow_rank == rank) sleep_ns(h->slow_us * 1000LL);
        return 0;
    case DDP_HOOK_GRADIENTS:
        return h->nan_step > 0 && h->nan_step == step;
    case DDP_HOOK_LOSS_SCALE:
        return h->overflow_step > 0 && h->overflow_step == step && h->overflow_rank == rank;
    case DDP_HOOK_REPLICA_CHECK:
        return h->flip && h->flip_rank == rank;
    case DDP_HOOK_CKPT_SHARD:
        sleep_ns(h->ckpt_shard_delay_ms * 1000000LL);
        return 0;
    case DDP_HOOK_RING_SEND:
        sleep_ns(h->ring_send_delay_us * 1000LL);
        return 0;
    case DDP_HOOK_LOSS_SPIKE:
        return h->loss_spike_step > 0 && h->loss_spike_step == step && h->loss_spike_rank == rank;
    case DDP_HOOK_NORM_SPIKE: return h->norm_spike_step > 0 && h->norm_spike_step == step;
    case DDP_HOOK_HOST: {
        const char *p = h->host_of_rank;
        for (int r = 0; *p && r < rank; r++) p += strcspn(p, ",") + (p[strcspn(p, ",")] == ',');
        return *p ? 1 + atoi(p) : 0;
    }
    case DDP_HOOK_EVAL:
        if (h->eval_hang_step <= 0 || h->eval_hang_step != step || h->eval_hang_rank != rank)
            return 0;
        DDP_WARN("test hook: rank %d hangs as the evaluation after step %ld begins "
                 "(DDP_TEST_EVAL_HANG)",
                 rank, step);
        for (;;) pause();
    }
    return 0;
}
