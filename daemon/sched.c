/* Fair gang placement (see sched.h). The pass runs from a zero-delay timer so callers in the
 * middle of a job transition never re-enter the scheduler. */
#include "sched.h"

#include <stdlib.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "daemon/job.h"
#include "daemon/link.h"
#include "daemon/slots.h"

int ddpd_sched_capacity(ddpd_t *d)
{
    int cap = d->cfg.slots;
    for (int i = 0; i < ddpd_peers_count(d); i++)
        if (ddpd_peers_up(d, i)) cap += ddpd_peers_slots(d, i);
    return cap;
}

/* Fills rank_node for a job of `world` ranks, or returns 0 if it does not fit now. Rank 0
 * always runs here (it hosts the rendezvous and writes metrics.jsonl). */
static int place(ddpd_t *d, int world, int *rank_node)
{
    int local_free = ddpd_slots_free(d);
    if (local_free < 1) return 0;
    int r = 0;
    for (; r < world && local_free > 0; r++, local_free--) rank_node[r] = 0;
    for (int i = 0; r < world && i < ddpd_peers_count(d); i++) {
        if (!ddpd_peers_up(d, i)) continue;
        for (int f = ddpd_peers_free(d, i); r < world && f > 0; r++, f--) rank_node[r] = i + 1;
    }
    return r == world;
}

/* Elastic jobs' ranks lost with their node get a place again, here first, then on any peer
 * with free slots; running jobs come before queued ones. */
static void replace_lost(ddpd_t *d)
{
    for (ddpd_job_t *j = ddpd_job_first(d); j; j = ddpd_job_next(j)) {
        if (ddpd_job_lost_ranks(j, NULL) <= 0) continue;
        int *ranks = ddp_calloc((size_t)ddpd_job_world(j), sizeof *ranks);
        if (!ranks) return;
        int n = ddpd_job_lost_ranks(j, ranks);
        int done = 0, local_free = ddpd_slots_free(d);
        if (local_free > 0)
            done += ddpd_job_place(j, 0, ranks, local_free < n ? local_free : n);
        for (int i = 0; done < n && i < ddpd_peers_count(d); i++) {
            int f = ddpd_peers_free(d, i);
            if (f > 0) done += ddpd_job_place(j, i + 1, ranks + done, f < n - done ? f : n - done);
        }
        free(ranks);
    }
}

/* The running_ranks quota lets uid's started ranks grow by n. */
static int within_quota(ddpd_t *d, uint32_t uid, int n)
{
    ddpd_quota_t q;
    ddpd_config_quota(&d->cfg, uid, &q);
    return q.running_ranks <= 0 || ddpd_job_ranks_of(d, uid) + n <= q.running_ranks;
}

/* When each user's last job started here (round-robin among users whose started ranks are
 * equal, e.g. none: one who started nothing lately goes before one who just did). A small table
 * of the most recent users; one that falls out counts as never. */
enum { TURN_USERS = 256 };
static struct {
    uint32_t uid;
    int64_t ms;
} turns[TURN_USERS];

static int64_t last_turn(uint32_t uid)
{
    for (int i = 0; i < TURN_USERS; i++)
        if (turns[i].ms && turns[i].uid == uid) return turns[i].ms;
    return 0;
}

static void take_turn(uint32_t uid, int64_t now)
{
    int slot = 0;
    for (int i = 0; i < TURN_USERS; i++) {
        if (turns[i].ms && turns[i].uid == uid) {
            slot = i;
            break;
        }
        if (turns[i].ms < turns[slot].ms) slot = i; /* the oldest (or an empty) entry */
    }
    turns[slot].uid = uid;
    turns[slot].ms = now;
}

/* Starts j if all its ranks fit now; returns 1 when it started. */
static int try_start(ddpd_t *d, ddpd_job_t *j)
{
    int *rank_node = ddp_calloc((size_t)ddpd_job_world(j), sizeof *rank_node);
    if (!rank_node) return 0;
    if (!place(d, ddpd_job_world(j), rank_node)) {
        free(rank_node);
        return 0;
    }
    take_turn(ddpd_job_uid(j), ddp_wall_ms());
    ddpd_job_start(j, rank_node);
    return 1;
}

/* The waiting job to consider next among those not yet tried: the user with the fewest started
 * ranks first, then the one whose turn is longest ago, then the oldest submission. */
static ddpd_job_t *next_fair(ddpd_t *d, ddpd_job_t **tried, int n_tried)
{
    ddpd_job_t *best = NULL;
    int best_ranks = 0;
    int64_t best_turn = 0;
    for (ddpd_job_t *j = ddpd_job_first(d); j; j = ddpd_job_next(j)) {
        if (!ddpd_job_waiting(j)) continue;
        int seen = 0;
        for (int i = 0; i < n_tried && !seen; i++) seen = tried[i] == j;
        if (seen || !within_quota(d, ddpd_job_uid(j), ddpd_job_world(j))) continue;
        int ranks = ddpd_job_ranks_of(d, ddpd_job_uid(j));
        int64_t turn = last_turn(ddpd_job_uid(j));
        if (!best || ranks < best_ranks || (ranks == best_ranks && turn < best_turn) ||
            (ranks == best_ranks && turn == best_turn &&
             ddpd_job_submitted_ms(j) < ddpd_job_submitted_ms(best))) {
            best = j;
            best_ranks = ranks;
            best_turn = turn;
        }
    }
    return best;
}

static void pass(uv_timer_t *t)
{
    ddpd_t *d = t->data;
    if (d->stopping) return;
    replace_lost(d);
    /* a job waiting longer than reserve_after_s holds the queue until it starts */
    ddpd_job_t *oldest = NULL;
    for (ddpd_job_t *j = ddpd_job_first(d); j; j = ddpd_job_next(j))
        if (ddpd_job_waiting(j) && within_quota(d, ddpd_job_uid(j), ddpd_job_world(j)) &&
            (!oldest || ddpd_job_submitted_ms(j) < ddpd_job_submitted_ms(oldest)))
            oldest = j;
    if (oldest &&
        ddp_wall_ms() - ddpd_job_submitted_ms(oldest) >= (int64_t)(d->cfg.reserve_after_s * 1000) &&
        !try_start(d, oldest))
        return;
    int n = 0, cap = 0;
    for (ddpd_job_t *j = ddpd_job_first(d); j; j = ddpd_job_next(j)) cap += ddpd_job_waiting(j);
    ddpd_job_t **tried = ddp_calloc((size_t)cap + 1, sizeof *tried);
    if (!tried) return;
    for (ddpd_job_t *j; n < cap && (j = next_fair(d, tried, n));) {
        tried[n++] = j;
        try_start(d, j); /* one that does not fit is passed over (see sched.h) */
    }
    free(tried);
}

/* A job was queued or ended, or ranks started or ended: slots may have changed hands. */
static void job_changed(void *arg, ddpd_job_t *j, unsigned what)
{
    (void)j;
    if (what & (DDPD_JOB_STATE | DDPD_JOB_SLOTS)) ddpd_sched_kick(arg);
}

void ddpd_sched_init(ddpd_t *d)
{
    uv_timer_init(d->loop, &d->sched_timer);
    d->sched_timer.data = d;
    ddpd_job_on_change(d, job_changed, d);
}

void ddpd_sched_close(ddpd_t *d) { uv_close((uv_handle_t *)&d->sched_timer, NULL); }

void ddpd_sched_kick(ddpd_t *d)
{
    /* then every 5 s: a job's age can make it the reserved one with nothing else changing */
    if (!uv_is_closing((uv_handle_t *)&d->sched_timer))
        uv_timer_start(&d->sched_timer, pass, 0, 5000);
}
