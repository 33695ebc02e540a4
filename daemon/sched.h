/* Placement: gang placement of a queue ordered fairly among users. A job starts only when all
 * of its ranks can be placed at once (this node's free slots first, then peers' in config
 * order). Among the waiting jobs, the users whose started jobs hold the fewest ranks go first,
 * then (round-robin) the users whose last job started longest ago, each user's own jobs in
 * submission order; a job that does not fit now is passed over, so one user's queue of many
 * jobs cannot hold everyone else behind it. Against starvation: the oldest job that has waited
 * reserve_after_s (ddpd.yaml, default 600 s) holds the queue: until it starts nothing else
 * does, so a large gang gets the slots as small jobs end. A user's jobs wait while their
 * started ranks would pass quotas.running_ranks. Quotas hold per coordinating daemon.
 * Loop thread only.
 */
#ifndef DDPD_SCHED_H
#define DDPD_SCHED_H

#include "daemon/ddpd.h"

/* Initialises the deferred-pass timer (closed by ddpd_sched_close). */
void ddpd_sched_init(ddpd_t *d);
void ddpd_sched_close(ddpd_t *d);
/* Asks for a scheduling pass at the next loop iteration (safe to call from any callback); a
 * pass also runs every few seconds, for the queue's ages. */
void ddpd_sched_kick(ddpd_t *d);
/* Slots in the cluster as known now: this node's plus every connected peer's. */
int ddpd_sched_capacity(ddpd_t *d);

#endif
