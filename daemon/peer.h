/* Peer daemons: authenticated TCP links (auth.h) to the daemons in the config, the node list,
 * and the remote half of multi-node jobs (starting, signalling and reporting ranks that a
 * coordinating daemon placed here). Messages are JSON objects, one per line.
 * Loop thread only.
 */
#ifndef DDPD_PEER_H
#define DDPD_PEER_H

#include <jansson.h>

#include "common/err.h"
#include "daemon/ddpd.h"

/* Loads the secret, starts the listener (if cfg.listen) and dials every configured peer
 * (retrying every second). Returns 0 or an error with ei filled. */
int ddpd_peers_start(ddpd_t *d, ddp_errinfo_t *ei);
/* Closes every link and the listener; kills ranks run for peers. NULL-safe. */
void ddpd_peers_close(ddpd_t *d);

int ddpd_peers_count(ddpd_t *d);
/* Peer i is connected and authenticated. */
int ddpd_peers_up(ddpd_t *d, int i);
/* Slots peer i announced, and how many of them are free now. */
int ddpd_peers_slots(ddpd_t *d, int i);
int ddpd_peers_free(ddpd_t *d, int i);
const char *ddpd_peers_name(ddpd_t *d, int i);

/* Asks peer i to start `n` ranks of job j. Replies come back as ddpd_job_remote_started,
 * ddpd_job_remote_exit and ddpd_job_remote_failed. Returns 0 or DDP_EPEER (not connected). */
int ddpd_peers_launch(ddpd_t *d, int i, ddpd_job_t *j, const int *ranks, int n);
/* Asks peer i to signal its ranks of a job. */
void ddpd_peers_signal(ddpd_t *d, int i, int64_t job_id, int sig);
/* Elastic: asks peer i to SIGKILL the process `pid` among its ranks of job_id when host_id (as
 * common/host.h makes it) is its own (a rank the job's coordinator evicted for silence; its
 * daemon kills it so that it cannot come back). */
void ddpd_peers_kill(ddpd_t *d, int i, int64_t job_id, int pid, const char *host_id);

/* New array describing this node and every peer (for node.list). */
json_t *ddpd_peers_nodes(ddpd_t *d);
/* Daemon shutdown: SIGTERM to every guest rank (they report their exits as usual). */
void ddpd_peers_stop_guests(ddpd_t *d);
/* Ranks this node runs for other coordinators (still alive). */
int ddpd_peers_guest_ranks(ddpd_t *d);
/* This node's slot count changed or was used: tell the peers (free slots). */
void ddpd_peers_announce(ddpd_t *d);

#endif
