/* The coordinator of an elastic job: forms generations from the workers that join it
 * (protocol: collectives/elastic_proto.h), evicts members that die or stop answering, admits
 * joiners at a step boundary, and ends the job when every member is done or when it stays below
 * ddp.min_workers for longer than ddp.rejoin_timeout_s.
 *
 * Rules, in one place:
 *  - The first generation forms when `world` members have joined, ranks ordered by the launcher's
 *    hint. Later ones form as soon as every connected member has asked to join and there are at
 *    least min_workers of them; survivors keep their relative order, joiners come after.
 *  - A member whose connection closes (a crash: the kernel closes it at once) or whose heartbeats
 *    stop for hb_timeout_s (a hang, SIGSTOP, a partition) is evicted: the others get "reform" and
 *    abort their communicator; an evicted process on this host is killed (SIGKILL) so it can never
 *    come back as a zombie of an old generation; each eviction is reported as an event so that a
 *    daemon can kill one on another host.
 *  - A new member while a generation runs gets the running members a "regroup": they finish the
 *    step and join again, so no step is interrupted for it.
 *  - The member with the highest completed step is the source of the state; when anyone is
 *    behind it, every member takes part in its broadcast before the next step.
 *  - A member's flight recorder dump (its collective timed out), or an eviction's kill, gets
 *    every other member asked for one; their diagnosis becomes a "flight" event.
 *  - Adopting (a daemon that restarted while the job ran): the running generation is taken over
 *    as it is once every one of its members has reconnected ("rejoin") -- nothing is
 *    interrupted. A member missing after hb_timeout_s, one that died, or a worker asking to join
 *    ends it instead: those that came back abort it and a new generation forms.
 * Loop thread only.
 */
#ifndef DDPD_COORD_H
#define DDPD_COORD_H

#include <jansson.h>
#include <uv.h>

#include "common/err.h"

typedef struct ddpd_coord ddpd_coord_t;

typedef struct ddpd_coord_cfg {
    const char *host;        /* listen address ("127.0.0.1", "0.0.0.0") */
    int port;                /* 0 = any free port (see ddpd_coord_port) */
    const char *token;       /* the job token every member must present */
    int world;               /* members of the first generation (ddp.workers) */
    int min_workers;         /* fewest members a generation may have */
    int max_workers;         /* most members; a joiner beyond is refused */
    double hb_timeout_s;     /* silence before a member is evicted (0 = 5 s) */
    double rejoin_timeout_s; /* how long the job waits below min_workers (0 = 60 s), and how
                                long a member redials a coordinator that went away */
    int adopt;               /* the job already runs: adopt its generation (see above) */
    unsigned long last_gen;  /* adopting: the newest generation the job is known to have had;
                                new ones are numbered above it */
    /* Called with each event (borrowed object): {"event":"generation",...}, {"event":"evict",...},
     * {"event":"adopted","gen":G,"size":N,"pids":[...]},
     * {"event":"flight","diagnosis":D,"after":W,"stuck":B,"ranks":N} (the members' flight
     * recorder dumps lined up: collectives/flight.h; each rank wrote its own file),
     * {"event":"done"} and {"event":"failed","why":...}; after "done" or "failed" the coordinator
     * does nothing more but can be closed. May be NULL. */
    void (*on_event)(void *arg, json_t *event);
    void *arg;
} ddpd_coord_cfg_t;

/* Listens and starts serving. On success *out is owned by the caller (ddpd_coord_close).
 * Errors: DDP_EINVAL (cfg), a libuv bind/listen error mapped to -errno, DDP_ENOMEM. */
int ddpd_coord_new(uv_loop_t *loop, const ddpd_coord_cfg_t *cfg, ddpd_coord_t **out,
                   ddp_errinfo_t *ei);
/* The port it listens on. */
int ddpd_coord_port(const ddpd_coord_t *c);
/* The current generation (0 before the first forms). */
unsigned long ddpd_coord_generation(const ddpd_coord_t *c);
/* Closes every connection and handle; the memory is freed once libuv has closed them (run the
 * loop). NULL-safe. */
void ddpd_coord_close(ddpd_coord_t *c);

#endif
