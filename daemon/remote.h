/* Ranks of multi-node jobs, over the daemons' links (link.h). A coordinating daemon starts,
 * signals and kills its jobs' ranks on peers; a peer runs them as *guest* ranks and reports
 * their exits. Messages (JSON lines on an authenticated link):
 *   coordinator -> peer  {"t":"start","job":J,"name":..,"ranks":[..],"world":W,"rdzv":..,
 *                         "elastic":B (DDP_RDZV is the job's coordinator),"max_restarts":R,
 *                         "token":..,"spec":"<json>","cwd":..,"uid":U,"gid":G,"threads":T}
 *                        {"t":"signal","job":J,"sig":SIG}
 *                        {"t":"kill","job":J,"pid":P,"host_id":H}
 *   peer -> coordinator  {"t":"started","job":J,"n":K} | {"t":"failed","job":J,"why":..}
 *                        {"t":"exit","job":J,"rank":R,"code":C,"sig":S}
 *                        {"t":"adopted","job":J,"ranks":[..]}  (first thing on a new link)
 * Daemons restart without ending ranks: when a coordinator's link drops, its guest ranks here
 * train on for DDPD_GUEST_ORPHAN_S (remote.c) and are its again when it links back ("adopted",
 * then the exits it missed); a peer daemon that restarts takes its guest ranks back from its
 * record in <state_dir>/guests/ (an older ddpd's <run_dir>/guest.json, root's, is read once and
 * moved there) and they wait for their coordinator the same way. Ranks run as the user the
 * start request names, with its groups (a coordinator of an older ddpd sends none: the primary
 * group alone); a request for uid 0 is refused by a root daemon unless ddpd.yaml says
 * `peer_root_jobs: allow`. When a peer's link
 * drops, the coordinator hears of it (reports.node_down). An elastic job's guest rank that
 * dies is spawned again here, up to max_restarts times, and rejoins the job's coordinator.
 * Loop thread only.
 */
#ifndef DDPD_REMOTE_H
#define DDPD_REMOTE_H

#include <stdint.h>

#include "common/err.h"
#include "daemon/ddpd.h"

/* What the peers report about this node's jobs, as calls (main wires them to job.h, so that
 * this module knows nothing of jobs). */
typedef struct ddpd_remote_reports {
    void (*started)(ddpd_t *d, int64_t job, int n_ranks); /* a peer started its ranks */
    void (*exited)(ddpd_t *d, int64_t job, int rank, int code, int sig);
    void (*failed)(ddpd_t *d, int64_t job, const char *why); /* could not start or keep them */
    /* a peer whose link came back still runs these ranks of the job */
    void (*adopted)(ddpd_t *d, int64_t job, int peer, const int *ranks, int n);
    void (*node_down)(ddpd_t *d, int peer);                   /* the link to peer went down */
    void (*nodes_changed)(ddpd_t *d);                         /* a peer's free slots changed */
} ddpd_remote_reports_t;

/* What a peer is asked to start (strings borrowed). */
typedef struct ddpd_remote_start {
    int64_t job;
    const char *name, *rdzv, *token, *spec_json, *cwd;
    const int *ranks;
    int n, world, threads, elastic, max_restarts;
    uint32_t uid, gid;
    const uint32_t *groups;
    int n_groups;
} ddpd_remote_start_t;

/* Starts the links (ddpd_links_start) with this module as their handler. Returns 0 or an
 * error with ei filled. */
int ddpd_remote_start(ddpd_t *d, const ddpd_remote_reports_t *reports, ddp_errinfo_t *ei);
/* Closes the links; the module goes once its last guest's handles are closed. NULL-safe. */
void ddpd_remote_close(ddpd_t *d);

/* Asks peer i to start s->n ranks; the answer comes as reports.started/exited/failed. Returns
 * 0 or DDP_EPEER (not connected). */
int ddpd_remote_launch(ddpd_t *d, int i, const ddpd_remote_start_t *s);
/* Asks peer i to signal its ranks of a job. */
void ddpd_remote_signal(ddpd_t *d, int i, int64_t job_id, int sig);
/* Elastic: asks peer i to SIGKILL the process `pid` among its ranks of job_id when host_id (as
 * common/host.h makes it) is its own (a rank the job's coordinator evicted for silence). */
void ddpd_remote_kill(ddpd_t *d, int i, int64_t job_id, int pid, const char *host_id);

/* Daemon stop that keeps jobs (SIGTERM): the guest ranks are recorded for the next ddpd and
 * left running, unwatched. */
void ddpd_remote_detach_guests(ddpd_t *d);
/* Daemon stop that ends jobs (SIGINT): SIGTERM to every guest rank (they report their exits as
 * usual). */
void ddpd_remote_stop_guests(ddpd_t *d);
/* Ranks this node runs for other coordinators (still alive). */
int ddpd_remote_guest_ranks(ddpd_t *d);

#endif
