/* Placement: a strict FIFO queue with gang placement. The oldest queued job starts only when
 * all of its ranks can be placed at once (this node's free slots first, then peers' in config
 * order); nothing behind it jumps ahead, so a large job is never starved by small ones.
 * Loop thread only.
 */
#ifndef DDPD_SCHED_H
#define DDPD_SCHED_H

#include "daemon/ddpd.h"

/* Initialises the deferred-pass timer (closed by ddpd_sched_close). */
void ddpd_sched_init(ddpd_t *d);
void ddpd_sched_close(ddpd_t *d);
/* Asks for a scheduling pass at the next loop iteration (safe to call from any callback). */
void ddpd_sched_kick(ddpd_t *d);
/* Slots in the cluster as known now: this node's plus every connected peer's. */
int ddpd_sched_capacity(ddpd_t *d);

#endif
