/* The handshake of links between daemons (auth.h's versions 1 and 2; see link_int.h): the
 * listener's and the dialler's side, the refusals and their log lines, the downgrade checks and
 * the session keys. What comes after is link.c's. Loop thread only.
 */
#include <stdio.h>
#include <string.h>

#include "common/log.h"
#include "daemon/link_int.h"

static void refuse(ddpd_link_t *l, const char *why)
{
    DDP_WARN("peer link from %s (claims '%s') refused: %s", l->remote, l->name[0] ? l->name : "?",
             why);
    if (!l->v2) /* a v2 dialer reads frames once it sent its proof: it just sees the close */
        ddpd__link_send(l, json_pack("{ss}", "error", "authentication failed"));
    ddpd__link_close(l);
}

/* The dialer's handshake failed: said once per peer until a link to it is up again. */
static void dial_failed(ddpd_link_t *l, const char *why)
{
    peer_t *p = ddpd__link_peer_of(l->d->links, l);
    if (p && !p->warned) DDP_WARN("peer %s: %s", p->cfg.addr, why);
    if (p) p->warned = 1;
    ddpd__link_close(l);
}

ddpd_pmsg_kind_t ddpd__link_expected(const ddpd_link_t *l)
{
    switch (l->state) {
    case L_WAIT_HELLO: return DDPD_PMSG_HELLO;
    case L_WAIT_MAC: return DDPD_PMSG_PROOF;
    case L_HELLO_SENT: return DDPD_PMSG_CHALLENGE;
    case L_WAIT_OK: return DDPD_PMSG_OK;
    default: return DDPD_PMSG_ANY;
    }
}

/* A line that is not the message expected (why: the parser's or the handshake's reason). */
void ddpd__link_malformed(ddpd_link_t *l, const char *why)
{
    switch (l->state) {
    case L_WAIT_HELLO:
    case L_WAIT_MAC: refuse(l, why); return;
    case L_HELLO_SENT:
    case L_WAIT_OK: dial_failed(l, why); return;
    default:
        DDP_WARN("peer link %s (%s): %s: closed", l->name, l->remote, why);
        ddpd__link_close(l);
    }
}

/* Whether the comma-separated list `caps` holds `cap`. */
static int has_cap(const char *caps, const char *cap)
{
    size_t n = strlen(cap);
    for (const char *c = caps; *c;) {
        size_t len = strcspn(c, ",");
        if (len == n && !memcmp(c, cap, n)) return 1;
        c += len + (c[len] == ',');
    }
    return 0;
}

/* A v2 link's session keys, each side's tx being the other's rx. */
static void derive_keys(ddpd_link_t *l, int dialer)
{
    unsigned char d2l[32], l2d[32];
    ddpd_auth_session_keys(l->d->links->key, &l->tr, d2l, l2d);
    memcpy(l->k_tx, dialer ? d2l : l2d, 32);
    memcpy(l->k_rx, dialer ? l2d : d2l, 32);
    sodium_memzero(d2l, sizeof d2l);
    sodium_memzero(l2d, sizeof l2d);
    l->v2 = 1;
    l->framed = 1; /* the next bytes from the other side are frames */
}

/* The dialer's link to its peer is up (v1: the listener's OK; v2: its first message). */
void ddpd__link_dialer_up(ddpd_link_t *l)
{
    peer_t *p = ddpd__link_peer_of(l->d->links, l);
    if (!p) {
        ddpd__link_close(l);
        return;
    }
    ddpd__link_up(l);
    p->dialing = NULL;
    p->link = l;
    p->warned = 0;
    snprintf(p->name, sizeof p->name, "%s", p->cfg.name[0] ? p->cfg.name : l->name);
    DDP_INFO("peer %s (%s) up%s", p->name, p->cfg.addr,
             l->v2 ? ""
                   : " with the older protocol: its messages are not authenticated "
                     "(peer_auth: allow-legacy)");
}

/* A v1 hello (an older dialer, or a v2 one whose "v" a relay removed). */
static void legacy_hello(ddpd_link_t *l)
{
    ddpd_links_t *ls = l->d->links;
    if (ddpd_auth_is_v2_nonce(l->n_theirs)) {
        refuse(l, "a version-2 node's nonce in a version-1 hello: something on the way removed "
                  "its version (a downgrade attempt)");
        return;
    }
    if (!l->d->cfg.peer_legacy) {
        refuse(l, "it speaks the older peer protocol, whose messages are not authenticated; "
                  "this node refuses it (peer_auth: required): upgrade its ddpd, or set "
                  "peer_auth: allow-legacy here for the upgrade");
        return;
    }
    DDP_WARN("peer link from %s (%s): the older protocol, whose messages are not authenticated "
             "(peer_auth: allow-legacy)",
             l->name, l->remote);
    unsigned char mac[DDPD_AUTH_MACBYTES];
    char hex[2 * DDPD_AUTH_MACBYTES + 1], nhex[2 * DDPD_AUTH_NONCEBYTES + 1];
    ddpd_auth_nonce_v2(l->n_mine); /* the sentinel: a v2 dialer seeing it knows we speak v2 */
    ddpd_auth_mac(ls->key, "ddpd-server", l->n_theirs, l->n_mine, mac);
    ddpd_auth_to_hex(hex, mac, sizeof mac);
    ddpd_auth_to_hex(nhex, l->n_mine, sizeof l->n_mine);
    ddpd__link_send(
        l, json_pack("{ss ss ss}", "node", l->d->cfg.node_name, "nonce", nhex, "mac", hex));
    l->state = L_WAIT_MAC;
}

/* A v1 challenge (an older listener, or a v2 one answered for by a relay). */
static void legacy_challenge(ddpd_link_t *l, const ddpd_pmsg_t *m)
{
    ddpd_links_t *ls = l->d->links;
    if (ddpd_auth_is_v2_nonce(l->n_theirs)) {
        dial_failed(l, "it answered in the older protocol with a version-2 node's nonce: "
                       "something on the way changed the exchange (a downgrade attempt)");
        return;
    }
    if (!l->d->cfg.peer_legacy) {
        dial_failed(l, "it speaks the older peer protocol, whose messages are not "
                       "authenticated; this node refuses it (peer_auth: required): upgrade its "
                       "ddpd, or set peer_auth: allow-legacy here for the upgrade");
        return;
    }
    if (!ddpd_auth_verify_hex(ls->key, "ddpd-server", l->n_mine, l->n_theirs, m->u.challenge.mac)) {
        dial_failed(l, "it failed authentication (wrong secret?)");
        return;
    }
    unsigned char mac[DDPD_AUTH_MACBYTES];
    char hex[2 * DDPD_AUTH_MACBYTES + 1];
    snprintf(l->name, sizeof l->name, "%s", m->u.challenge.node);
    ddpd_auth_mac(ls->key, "ddpd-client", l->n_theirs, l->n_mine, mac);
    ddpd_auth_to_hex(hex, mac, sizeof mac);
    ddpd__link_send(l, json_pack("{ss}", "mac", hex));
    l->state = L_WAIT_OK;
}

/* One handshake message m, of the kind ddpd__link_expected(l) or REFUSED. */
void ddpd__link_auth(ddpd_link_t *l, const ddpd_pmsg_t *m)
{
    ddpd_links_t *ls = l->d->links;
    const char *me = l->d->cfg.node_name;
    char hex[2 * DDPD_AUTH_MACBYTES + 1], nhex[2 * DDPD_AUTH_NONCEBYTES + 1];
    unsigned char mac[DDPD_AUTH_MACBYTES];
    if (m->kind == DDPD_PMSG_REFUSED) {
        ddpd__link_malformed(l, l->state == L_WAIT_OK ? "it refused us (wrong secret?)"
                                                      : "it refused the handshake");
        return;
    }
    switch (l->state) {
    case L_WAIT_HELLO: /* listener: {"hello", "nonce"[, "v", "caps"]} */
        snprintf(l->name, sizeof l->name, "%s", m->u.hello.node);
        memcpy(l->n_theirs, m->u.hello.nonce, sizeof l->n_theirs);
        if (m->u.hello.v < 2 || !has_cap(m->u.hello.caps, DDPD_LINK_CAP_BOX)) {
            legacy_hello(l);
            return;
        }
        ddpd_auth_nonce_v2(l->n_mine);
        ddpd_auth_transcript(&l->tr, l->n_theirs, l->n_mine, l->name, me, m->u.hello.caps,
                             DDPD_LINK_CAP_BOX);
        ddpd_auth_mac_v2(ls->key, "server", &l->tr, mac);
        ddpd_auth_to_hex(hex, mac, sizeof mac);
        ddpd_auth_to_hex(nhex, l->n_mine, sizeof l->n_mine);
        ddpd__link_send(l, json_pack("{ss ss ss si ss}", "node", me, "nonce", nhex, "mac", hex, "v",
                                     2, "chosen", DDPD_LINK_CAP_BOX));
        l->v2 = 1;
        l->state = L_WAIT_MAC;
        return;
    case L_WAIT_MAC: /* listener: {"mac"} proves the dialer knows the secret */
        if (l->v2 ? !ddpd_auth_verify_v2_hex(ls->key, "client", &l->tr, m->u.proof.mac)
                  : !ddpd_auth_verify_hex(ls->key, "ddpd-client", l->n_mine, l->n_theirs,
                                          m->u.proof.mac)) {
            refuse(l, "wrong secret (HMAC mismatch)");
            return;
        }
        ddpd__link_up(l);
        DDP_INFO("peer %s (%s) authenticated (inbound%s)", l->name, l->remote,
                 l->v2 ? "" : ", the older protocol");
        if (l->v2) {
            derive_keys(l, 0);
            ddpd__link_start_tx(l);
        } else {
            ddpd__link_send(l, json_pack("{sb ss}", "ok", 1, "node", me));
        }
        if (ls->h.up) ls->h.up(l->d, l); /* before the slots: what already runs comes first */
        ddpd__link_send(l, ddpd__link_status_msg(l->d));
        return;
    case L_HELLO_SENT: /* dialer: {"node","nonce","mac"[,"v","chosen"]} proves the listener */
        memcpy(l->n_theirs, m->u.challenge.nonce, sizeof l->n_theirs);
        if (m->u.challenge.v < 2) {
            legacy_challenge(l, m);
            return;
        }
        if (strcmp(m->u.challenge.chosen, DDPD_LINK_CAP_BOX) != 0) {
            dial_failed(l, "it chose a capability this node did not offer");
            return;
        }
        ddpd_auth_transcript(&l->tr, l->n_mine, l->n_theirs, me, m->u.challenge.node,
                             DDPD_LINK_CAP_BOX, m->u.challenge.chosen);
        if (!ddpd_auth_verify_v2_hex(ls->key, "server", &l->tr, m->u.challenge.mac)) {
            dial_failed(l, "it failed authentication (wrong secret, or its name or version was "
                           "changed on the way)");
            return;
        }
        snprintf(l->name, sizeof l->name, "%s", m->u.challenge.node);
        ddpd_auth_mac_v2(ls->key, "client", &l->tr, mac);
        ddpd_auth_to_hex(hex, mac, sizeof mac);
        ddpd__link_send(l, json_pack("{ss}", "mac", hex));
        derive_keys(l, 1);
        ddpd__link_start_tx(l);
        l->state = L_WAIT_OK; /* up with the listener's first message (on_frame) */
        return;
    case L_WAIT_OK: /* dialer, v1: {"ok"} */ ddpd__link_dialer_up(l); return;
    default: return;
    }
}
