/* Peer links: placeholder single-node implementation (multi-node comes next). */
#include "peer.h"

#include "daemon/job.h"

int ddpd_peers_start(ddpd_t *d, ddp_errinfo_t *ei) { (void)d; (void)ei; return 0; }
void ddpd_peers_close(ddpd_t *d) { (void)d; }
int ddpd_peers_count(ddpd_t *d) { (void)d; return 0; }
int ddpd_peers_up(ddpd_t *d, int i) { (void)d; (void)i; return 0; }
int ddpd_peers_slots(ddpd_t *d, int i) { (void)d; (void)i; return 0; }
int ddpd_peers_free(ddpd_t *d, int i) { (void)d; (void)i; return 0; }
const char *ddpd_peers_name(ddpd_t *d, int i) { (void)d; (void)i; return "?"; }
int ddpd_peers_launch(ddpd_t *d, int i, ddpd_job_t *j, const int *ranks, int n)
{ (void)d; (void)i; (void)j; (void)ranks; (void)n; return DDP_EPEER; }
void ddpd_peers_signal(ddpd_t *d, int i, int64_t job_id, int sig) { (void)d; (void)i; (void)job_id; (void)sig; }
json_t *ddpd_peers_nodes(ddpd_t *d)
{
    return json_pack("[{ss ss sb sb si si}]", "name", d->cfg.node_name, "addr", d->cfg.advertise,
                     "self", 1, "up", 1, "slots", d->cfg.slots, "free",
                     d->cfg.slots - d->slots_used);
}
int ddpd_peers_guest_ranks(ddpd_t *d) { (void)d; return 0; }
void ddpd_peers_announce(ddpd_t *d) { (void)d; }
