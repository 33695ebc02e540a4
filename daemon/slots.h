/* The node's rank slots: how many of the configured `slots` (ddpd.yaml) local ranks hold now,
 * counting this node's own jobs' ranks and the ranks it runs for peers (guests) alike.
 *
 * This module is the count's only writer: a rank takes its slot when it is spawned or adopted
 * and gives it back when it ends. Everything else — the scheduler's placement, a peer's start
 * request, the slots announced to peers, daemon.status, /metrics and the status page — reads
 * it through ddpd_slots_used/ddpd_slots_free, so every one of them sees the same number.
 *
 * Invariant: 0 <= used <= the configured slots, checked on every change. used can exceed them
 * when ranks that already run are counted (adopted by a daemon restarted with fewer slots), or
 * when an elastic rank is spawned again after its slot went to another rank meanwhile: that is
 * logged, and no new rank starts here until enough end. A give below zero is a bookkeeping bug:
 * it is logged and the count stays at zero.
 * Loop thread only.
 */
#ifndef DDPD_SLOTS_H
#define DDPD_SLOTS_H

#include "daemon/ddpd.h"

/* n (>= 1) local ranks started (spawned, spawned again or adopted) for `who` (a short phrase
 * for the log, e.g. "a job's rank"): they hold n more slots. Never refuses: the caller decided that
 * they run (ddpd_slots_free, or ranks already running that a restarted daemon adopted). */
void ddpd_slots_take(ddpd_t *d, int n, const char *who);

/* n (>= 1) of `who`'s local ranks ended: their slots are free again. */
void ddpd_slots_give(ddpd_t *d, int n, const char *who);

/* Slots held by local ranks now. */
int ddpd_slots_used(const ddpd_t *d);

/* Slots a new rank may take now: the configured slots less the used ones, 0 when more are used
 * than configured. */
int ddpd_slots_free(const ddpd_t *d);

#endif
