/* The link module's private header: the types link.c (transport: frames, encryption, reading,
 * dialling and accepting, the node list) and link_auth.c (the handshake of auth.h, versions 1
 * and 2) share. No other file includes it. Loop thread only.
 */
#ifndef DDPD_LINK_INT_H
#define DDPD_LINK_INT_H

#include <sodium.h>
#include <stdint.h>
#include <uv.h>

#include "daemon/auth.h"
#include "daemon/link.h"
#include "daemon/peer_msg.h"

#define PEER_MAX_LINE (1u << 20)
#define AUTH_MAX_LINE 4096
#define SS_ABYTES crypto_secretstream_xchacha20poly1305_ABYTES
#define SS_HEADER crypto_secretstream_xchacha20poly1305_HEADERBYTES
#define DDPD_LINK_CAP_BOX "box" /* secretstream frames: the only capability v2 has */

typedef enum { L_CONNECTING, L_HELLO_SENT, L_WAIT_HELLO, L_WAIT_MAC, L_WAIT_OK, L_UP } lstate_t;
typedef crypto_secretstream_xchacha20poly1305_state ss_state_t;

typedef struct peer peer_t;

struct ddpd_link {
    uv_tcp_t tcp;
    uv_timer_t timer; /* the handshake's deadline, then pings and the idle limit */
    uv_connect_t conn;
    ddpd_t *d;
    ddpd_link_t *next;
    int peer; /* dialled links: index in cfg.peers; accepted: -1 */
    lstate_t state;
    int closing, open_handles;
    char remote[128]; /* address as seen */
    char ip[64];      /* an accepted link's remote address (the per-address cap) */
    char name[64];    /* node name the other side claims (proven once UP) */
    unsigned char n_mine[DDPD_AUTH_NONCEBYTES], n_theirs[DDPD_AUTH_NONCEBYTES];
    /* version 2 */
    int v2;     /* authenticated with v2: frames from the proof on */
    int framed; /* input is frames now (else lines) */
    ddpd_auth_transcript_t tr;
    unsigned char k_tx[32], k_rx[32];
    ss_state_t tx, rx;
    int tx_ready, rx_ready; /* our header sent / theirs received */
    uint64_t last_rx_ms, last_tx_ms;
    /* input not yet read: lines before the proof, frames after it */
    char *in;
    size_t in_len, in_cap;
};

struct peer {
    ddpd_t *d;
    ddpd_peer_cfg_t cfg;
    char name[64];
    ddpd_link_t *link; /* our dialled link, when UP */
    ddpd_link_t *dialing;
    int slots, free;
    uv_timer_t retry;
    uv_getaddrinfo_t gai;
    int resolving;
    int warned;
};

struct ddpd_links {
    ddpd_t *d;
    ddpd_link_handler_t h;
    unsigned char key[DDPD_AUTH_KEYBYTES];
    int have_key;
    uv_tcp_t listener;
    int listening;
    peer_t *peers;
    int n;
    ddpd_link_t *links;
    int closing;
    int refs; /* 1 while open + each link + (at close) the listener and the timers */
};

/* ---- link.c, for link_auth.c ---- */

/* Sends m (consumed): encrypted in a frame once this side's stream started (a v2 link after
 * ddpd__link_start_tx), else as a JSON line. */
void ddpd__link_send(ddpd_link_t *l, json_t *m);
/* Closes l (its handles; freed in their close callbacks). */
void ddpd__link_close(ddpd_link_t *l);
/* The link is authenticated: its timer now keeps it alive (v2) or does nothing (v1). */
void ddpd__link_up(ddpd_link_t *l);
/* Starts this side's encrypted direction under l->k_tx: its stream header as the first frame. */
void ddpd__link_start_tx(ddpd_link_t *l);
/* This node's {"t":"status"} message. */
json_t *ddpd__link_status_msg(ddpd_t *d);
/* The configured peer a dialled link is to, NULL for an accepted link. */
peer_t *ddpd__link_peer_of(ddpd_links_t *ls, ddpd_link_t *l);

/* ---- link_auth.c, for link.c ---- */

/* The handshake message m (of the kind ddpd__link_expected says, or REFUSED): answers it, and
 * brings the link up or closes it. */
void ddpd__link_auth(ddpd_link_t *l, const ddpd_pmsg_t *m);
/* What the link reads next: a handshake message, or DDPD_PMSG_ANY once it is up. */
ddpd_pmsg_kind_t ddpd__link_expected(const ddpd_link_t *l);
/* A message that is not what the link expects (why: the parser's reason): refused or closed. */
void ddpd__link_malformed(ddpd_link_t *l, const char *why);
/* The dialler's v2 link is up: the listener's first message decrypted (it took our proof). */
void ddpd__link_dialer_up(ddpd_link_t *l);

#endif
