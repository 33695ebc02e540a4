/* Links between daemons: authenticated TCP connections (auth.h) to the peers in the config and
 * from them, and the node list they give (each peer's slots, announced by the peer itself).
 * Messages are JSON objects, one per line, parsed by peer_msg.h; once a link is authenticated,
 * every message but the slot announcement goes to the handler given at start (remote.c speaks
 * over it).
 * Loop thread only.
 */
#ifndef DDPD_LINK_H
#define DDPD_LINK_H

#include <jansson.h>

#include "common/err.h"
#include "daemon/ddpd.h"
#include "daemon/peer_msg.h"

typedef struct ddpd_link ddpd_link_t;

typedef struct ddpd_link_handler {
    /* a parsed message (borrowed; never a status or an UNKNOWN) on an authenticated link */
    void (*message)(ddpd_t *d, ddpd_link_t *l, const ddpd_pmsg_t *m);
    /* a link from another daemon (one that coordinates jobs here) is authenticated; what the
     * handler sends now arrives before this node's slot announcement */
    void (*up)(ddpd_t *d, ddpd_link_t *l);
    /* an authenticated link goes down (it is still valid during the call) */
    void (*down)(ddpd_t *d, ddpd_link_t *l);
    /* a peer's slots changed, or some became free */
    void (*nodes_changed)(ddpd_t *d);
} ddpd_link_handler_t;

/* Loads the secret, starts the listener (if cfg.listen) and dials every configured peer
 * (retrying every second). Returns 0 or an error with ei filled. */
int ddpd_links_start(ddpd_t *d, const ddpd_link_handler_t *h, ddp_errinfo_t *ei);
/* Closes every link, the listener and the timers; the memory goes once they are closed.
 * NULL-safe. */
void ddpd_links_close(ddpd_t *d);

/* Sends m (consumed) on l; a link that is closing drops it. */
void ddpd_link_send(ddpd_link_t *l, json_t *m);
/* The node name the other side proved. */
const char *ddpd_link_name(const ddpd_link_t *l);
/* For a link this daemon dialled, the peer's index in cfg.peers; -1 for one it accepted. */
int ddpd_link_peer(const ddpd_link_t *l);
/* The authenticated link dialled to peer i, or NULL. */
ddpd_link_t *ddpd_links_to(ddpd_t *d, int i);
/* n ranks were just asked of peer i: its free slots count them until its next announcement. */
void ddpd_links_sent_ranks(ddpd_t *d, int i, int n);

/* The node list. */
int ddpd_peers_count(ddpd_t *d);
/* Peer i is connected and authenticated. */
int ddpd_peers_up(ddpd_t *d, int i);
/* Slots peer i announced, and how many of them are free now. */
int ddpd_peers_slots(ddpd_t *d, int i);
int ddpd_peers_free(ddpd_t *d, int i);
const char *ddpd_peers_name(ddpd_t *d, int i);
/* New array describing this node and every peer (for node.list). */
json_t *ddpd_peers_nodes(ddpd_t *d);
/* This node's free slots changed: tell the peers that dialled it. */
void ddpd_peers_announce(ddpd_t *d);

#endif
