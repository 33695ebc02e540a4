/* Authenticated links between daemons (see link.h).
 *
 * Every daemon dials each configured peer (redialling every second) and accepts links on
 * cfg.listen. A link starts with the mutual authentication of auth.h, in JSON lines; a link
 * that fails it is logged and closed. Version 2 (both sides this ddpd): from the dialer's proof
 * on, each direction is a stream of frames (a 4-byte big-endian length, then the bytes): first
 * that direction's secretstream header, then each message as one secretstream
 * (XChaCha20-Poly1305) message under the direction's session key, so every message is
 * encrypted, authenticated, and cannot be replayed, reordered, dropped or moved to another link
 * without the receiver seeing it (and closing the link). Version 1 (an older peer, only under
 * peer_auth: allow-legacy): JSON lines in clear after the HMAC exchange, as that ddpd speaks.
 * After authentication the listener sends the dialer {"t":"status","node":N,"slots":S,"free":F}
 * at once and on every change, which is how a coordinator learns its peers' slots; every other
 * message goes to the handler. Every message is parsed by peer_msg.c first: one that is not what
 * the link's state expects closes it.
 * Bounds: a link has HANDSHAKE_MS to authenticate; a v2 link that has sent nothing for PING_MS
 * sends a ping, and one that has heard nothing for IDLE_MS is closed (a v1 peer sends no pings:
 * its links have no idle limit); at most max_peer_links_per_addr unauthenticated links come
 * from one address, and MAX_UNAUTH in all.
 * Invariant: a link is freed only in its close callback (its TCP handle and its timer both
 * closed); the module is freed once its links, listener and timers are all closed. Loop thread
 * only.
 */
#include "daemon/link_int.h"

#include <netdb.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "daemon/lines.h"
#include "daemon/slots.h"

enum { HANDSHAKE_MS = 10000, PING_MS = 15000, IDLE_MS = 60000, MAX_UNAUTH = 256 };

static void dial(peer_t *p);
static void retry_cb(uv_timer_t *t);

/* ---- link plumbing ---- */

typedef struct {
    uv_write_t req;
    char *data;
} wreq_t;

static void wdone(uv_write_t *r, int status)
{
    wreq_t *w = (wreq_t *)r;
    ddpd_link_t *l = r->data;
    free(w->data);
    free(w);
    if (status < 0 && !l->closing) ddpd__link_close(l);
}

/* Writes data[0..n) (ownership moves) to l. */
static void send_bytes(ddpd_link_t *l, char *data, size_t n)
{
    wreq_t *w = ddp_malloc(sizeof *w);
    if (!w) {
        free(data);
        ddpd__link_close(l);
        return;
    }
    w->data = data;
    w->req.data = l;
    uv_buf_t b = uv_buf_init(data, (unsigned)n);
    if (uv_write(&w->req, (uv_stream_t *)&l->tcp, &b, 1, wdone) != 0) {
        free(data);
        free(w);
        ddpd__link_close(l);
        return;
    }
    l->last_tx_ms = uv_now(l->d->loop);
}

/* One frame: a 4-byte big-endian length, then `n` bytes (in the same buffer, taken). */
static void send_frame(ddpd_link_t *l, unsigned char *frame, size_t n)
{
    frame[0] = (unsigned char)(n >> 24);
    frame[1] = (unsigned char)(n >> 16);
    frame[2] = (unsigned char)(n >> 8);
    frame[3] = (unsigned char)n;
    send_bytes(l, (char *)frame, n + 4);
}

/* Sends m (consumed): encrypted in a frame on an authenticated v2 link, a JSON line before that
 * (the handshake) and on a v1 link. */
void ddpd__link_send(ddpd_link_t *l, json_t *m)
{
    if (!l || l->closing) {
        json_decref(m);
        return;
    }
    char *s = json_dumps(m, JSON_COMPACT);
    json_decref(m);
    if (!s) return;
    size_t n = strlen(s);
    if (!l->tx_ready) {
        s[n] = '\n'; /* json_dumps's NUL: the buffer holds n + 1 bytes */
        send_bytes(l, s, n + 1);
        return;
    }
    unsigned char *f = ddp_malloc(4 + n + SS_ABYTES);
    if (!f) {
        free(s);
        ddpd__link_close(l);
        return;
    }
    unsigned long long clen = 0;
    crypto_secretstream_xchacha20poly1305_push(&l->tx, f + 4, &clen, (unsigned char *)s, n, NULL, 0,
                                               crypto_secretstream_xchacha20poly1305_TAG_MESSAGE);
    free(s);
    send_frame(l, f, (size_t)clen);
}

/* Starts this side's encrypted direction: its secretstream header as the first frame. */
void ddpd__link_start_tx(ddpd_link_t *l)
{
    unsigned char *f = ddp_malloc(4 + SS_HEADER);
    if (!f) {
        ddpd__link_close(l);
        return;
    }
    crypto_secretstream_xchacha20poly1305_init_push(&l->tx, f + 4, l->k_tx);
    sodium_memzero(l->k_tx, sizeof l->k_tx);
    send_frame(l, f, SS_HEADER);
    l->tx_ready = 1;
}

peer_t *ddpd__link_peer_of(ddpd_links_t *ls, ddpd_link_t *l)
{
    return l->peer >= 0 && l->peer < ls->n ? &ls->peers[l->peer] : NULL;
}

static void links_unref(ddpd_links_t *ls)
{
    if (--ls->refs > 0) return;
    ls->d->links = NULL;
    free(ls->peers);
    free(ls);
}

static void link_closed(uv_handle_t *h)
{
    ddpd_link_t *l = h->data;
    if (--l->open_handles > 0) return;
    ddpd_links_t *ls = l->d->links;
    for (ddpd_link_t **pp = &ls->links; *pp; pp = &(*pp)->next)
        if (*pp == l) {
            *pp = l->next;
            break;
        }
    sodium_memzero(&l->tx, sizeof l->tx);
    sodium_memzero(&l->rx, sizeof l->rx);
    sodium_memzero(l->k_tx, sizeof l->k_tx);
    sodium_memzero(l->k_rx, sizeof l->k_rx);
    free(l->in);
    free(l);
    links_unref(ls);
}

void ddpd__link_close(ddpd_link_t *l)
{
    if (l->closing) return;
    l->closing = 1;
    ddpd_t *d = l->d;
    ddpd_links_t *ls = d->links;
    peer_t *p = ddpd__link_peer_of(ls, l);
    if (p && p->link == l) {
        p->link = NULL;
        DDP_WARN("peer %s (%s): link down", p->name, p->cfg.addr);
    }
    if (l->state == L_UP && !ls->closing && ls->h.down) ls->h.down(d, l);
    if (!p && l->state == L_WAIT_MAC && !ls->closing)
        DDP_WARN("peer link from %s (claims '%s') refused: it dropped the authentication "
                 "(it could not verify our HMAC: wrong secret?)",
                 l->remote, l->name);
    if (p && p->dialing == l) p->dialing = NULL;
    if (p && !ls->closing) uv_timer_start(&p->retry, retry_cb, 1000, 0);
    uv_close((uv_handle_t *)&l->tcp, link_closed);
    uv_close((uv_handle_t *)&l->timer, link_closed);
}

/* The link's timer: the handshake's deadline until it is up; then, on a v2 link, a ping after
 * PING_MS of our silence and the end after IDLE_MS of theirs. */
static void timer_cb(uv_timer_t *t)
{
    ddpd_link_t *l = t->data;
    uint64_t now = uv_now(l->d->loop);
    if (l->state != L_UP) {
        DDP_WARN("peer link %s%s%s: not authenticated within %d s: closed", l->remote,
                 l->name[0] ? " claiming " : "", l->name, HANDSHAKE_MS / 1000);
        ddpd__link_close(l);
        return;
    }
    if (!l->v2) return; /* a v1 peer sends no pings */
    if (now - l->last_rx_ms >= IDLE_MS) {
        DDP_WARN("peer link %s (%s): nothing heard for %d s: closed", l->name, l->remote,
                 IDLE_MS / 1000);
        ddpd__link_close(l);
        return;
    }
    if (now - l->last_tx_ms >= PING_MS) ddpd__link_send(l, json_pack("{ss}", "t", "ping"));
}

static ddpd_link_t *link_new(ddpd_t *d, int peer)
{
    ddpd_link_t *l = ddp_calloc(1, sizeof *l);
    if (!l) return NULL;
    l->d = d;
    l->peer = peer;
    uv_tcp_init(d->loop, &l->tcp);
    uv_timer_init(d->loop, &l->timer);
    l->tcp.data = l->timer.data = l;
    l->open_handles = 2;
    uv_tcp_nodelay(&l->tcp, 1);
    l->next = d->links->links;
    d->links->links = l;
    d->links->refs++;
    l->last_rx_ms = l->last_tx_ms = uv_now(d->loop);
    uv_timer_start(&l->timer, timer_cb, HANDSHAKE_MS, 0);
    return l;
}

/* The link is authenticated: its timer now keeps it alive (v2) or does nothing (v1). */
void ddpd__link_up(ddpd_link_t *l)
{
    l->state = L_UP;
    l->last_rx_ms = uv_now(l->d->loop);
    if (l->v2)
        uv_timer_start(&l->timer, timer_cb, 1000, 1000);
    else
        uv_timer_stop(&l->timer);
}

/* ---- status ---- */

json_t *ddpd__link_status_msg(ddpd_t *d)
{
    return json_pack("{ss ss si si}", "t", "status", "node", d->cfg.node_name, "slots",
                     d->cfg.slots, "free", ddpd_slots_free(d));
}

void ddpd_peers_announce(ddpd_t *d)
{
    ddpd_links_t *ls = d->links;
    if (!ls) return;
    for (ddpd_link_t *l = ls->links; l; l = l->next)
        if (l->peer < 0 && l->state == L_UP) ddpd__link_send(l, ddpd__link_status_msg(d));
}

/* ---- messages after authentication ---- */

static void on_message(ddpd_link_t *l, const ddpd_pmsg_t *m)
{
    ddpd_links_t *ls = l->d->links;
    peer_t *p = ddpd__link_peer_of(ls, l);
    if (m->kind == DDPD_PMSG_PING) return; /* it kept the link alive: that is all */
    if (m->kind == DDPD_PMSG_STATUS && p) {
        int was = p->slots;
        p->slots = m->u.status.slots;
        p->free = m->u.status.free;
        if ((was != p->slots || p->free > 0) && ls->h.nodes_changed) ls->h.nodes_changed(l->d);
    } else if (m->kind != DDPD_PMSG_UNKNOWN && ls->h.message) {
        ls->h.message(l->d, l, m); /* a newer peer's kinds of message are not ours to read */
    }
}

/* One message's text (a line, or a frame's plaintext), parsed as what the link's state
 * expects: a handshake message before it is up, an authenticated one after; what does not parse
 * closes the link. */
static void on_text(ddpd_link_t *l, const char *text, size_t len)
{
    ddpd_pmsg_kind_t expect = ddpd__link_expected(l);
    ddpd_pmsg_t m;
    char why[256];
    if (ddpd_pmsg_parse(text, len, expect, &m, why, sizeof why) != 0) {
        ddpd__link_malformed(l, why);
        return;
    }
    if (expect == DDPD_PMSG_ANY)
        on_message(l, &m);
    else
        ddpd__link_auth(l, &m);
    ddpd_pmsg_close(&m);
}

/* One frame of a v2 link: the other side's stream header, then its messages. A frame that does
 * not decrypt and verify as the next message of the stream closes the link. */
static void on_frame(ddpd_link_t *l, const unsigned char *f, size_t n)
{
    if (!l->rx_ready) {
        int bad = n != SS_HEADER ||
                  crypto_secretstream_xchacha20poly1305_init_pull(&l->rx, f, l->k_rx) != 0;
        sodium_memzero(l->k_rx, sizeof l->k_rx);
        if (bad)
            ddpd__link_malformed(l, "its stream header is not one");
        else
            l->rx_ready = 1;
        return;
    }
    unsigned char *m = n >= SS_ABYTES ? ddp_malloc(n - SS_ABYTES + 1) : NULL;
    unsigned long long mlen = 0;
    unsigned char tag = 0;
    if (!m ||
        crypto_secretstream_xchacha20poly1305_pull(&l->rx, m, &mlen, &tag, f, n, NULL, 0) != 0) {
        free(m);
        DDP_WARN("peer link %s (%s): a message failed authentication (forged, replayed, "
                 "reordered or cut): closed",
                 l->name[0] ? l->name : "?", l->remote);
        ddpd__link_close(l);
        return;
    }
    if (tag == crypto_secretstream_xchacha20poly1305_TAG_FINAL) {
        free(m);
        ddpd__link_close(l);
        return;
    }
    if (l->state == L_WAIT_OK) ddpd__link_dialer_up(l); /* the listener took our proof */
    if (!l->closing) on_text(l, (const char *)m, (size_t)mlen);
    free(m);
}

/* What arrived: appended to the unread input, then read as lines (the handshake, a v1 link) or
 * frames (a v2 link from the proof on) while whole ones are there. A line or a frame over its
 * limit closes the link before it is buffered further. */
static void p_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    ddpd_link_t *l = s->data;
    if (n < 0 || l->closing) {
        free(b->base);
        if (n < 0) ddpd__link_close(l);
        return;
    }
    if (l->in_len + (size_t)n > l->in_cap) {
        size_t cap = l->in_cap ? l->in_cap : 65536;
        while (cap < l->in_len + (size_t)n) cap *= 2;
        char *nb = ddp_realloc(l->in, cap);
        if (!nb) {
            free(b->base);
            ddpd__link_close(l);
            return;
        }
        l->in = nb;
        l->in_cap = cap;
    }
    memcpy(l->in + l->in_len, b->base, (size_t)n);
    l->in_len += (size_t)n;
    free(b->base);
    l->last_rx_ms = uv_now(l->d->loop);
    size_t off = 0;
    while (!l->closing) {
        size_t left = l->in_len - off;
        if (!l->framed) {
            size_t lim = l->state == L_UP ? PEER_MAX_LINE : AUTH_MAX_LINE;
            char *nl = memchr(l->in + off, '\n', left);
            size_t len = nl ? (size_t)(nl - (l->in + off)) : left;
            if (len > lim) {
                DDP_WARN("peer link %s: a line over %zu bytes: closed", l->remote, lim);
                ddpd__link_close(l);
            }
            if (!nl || l->closing) break;
            on_text(l, l->in + off, len);
            off += len + 1;
        } else {
            if (left < 4) break;
            const unsigned char *h = (const unsigned char *)l->in + off;
            size_t len = (size_t)h[0] << 24 | (size_t)h[1] << 16 | (size_t)h[2] << 8 | h[3];
            if (len > PEER_MAX_LINE + SS_ABYTES) {
                DDP_WARN("peer link %s: a frame of %zu bytes, over the limit: closed", l->remote,
                         len);
                ddpd__link_close(l);
                break;
            }
            if (left < 4 + len) break;
            on_frame(l, h + 4, len);
            off += 4 + len;
        }
    }
    memmove(l->in, l->in + off, l->in_len - off);
    l->in_len -= off;
}

/* ---- dialling and accepting ---- */

static void on_connect(uv_connect_t *req, int status)
{
    ddpd_link_t *l = req->data;
    if (l->closing) return;
    if (status < 0) {
        ddpd__link_close(l);
        return;
    }
    char nhex[2 * DDPD_AUTH_NONCEBYTES + 1];
    ddpd_auth_nonce_v2(l->n_mine);
    ddpd_auth_to_hex(nhex, l->n_mine, sizeof l->n_mine);
    l->state = L_HELLO_SENT;
    uv_read_start((uv_stream_t *)&l->tcp, ddpd_lines_alloc, p_read);
    ddpd__link_send(l, json_pack("{ss ss si s[s]}", "hello", l->d->cfg.node_name, "nonce", nhex,
                                 "v", 2, "caps", DDPD_LINK_CAP_BOX));
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    peer_t *p = req->data;
    p->resolving = 0;
    ddpd_t *d = p->d;
    ddpd_links_t *ls = d->links;
    if (ls->closing || status < 0 || !res) {
        if (res) uv_freeaddrinfo(res);
        if (!ls->closing) uv_timer_start(&p->retry, retry_cb, 1000, 0);
        links_unref(ls);
        return;
    }
    ddpd_link_t *l = link_new(d, (int)(p - ls->peers));
    links_unref(ls);
    if (!l) {
        uv_freeaddrinfo(res);
        return;
    }
    snprintf(l->remote, sizeof l->remote, "%.120s", p->cfg.addr);
    l->state = L_CONNECTING;
    l->conn.data = l;
    p->dialing = l;
    if (uv_tcp_connect(&l->conn, &l->tcp, res->ai_addr, on_connect) != 0) ddpd__link_close(l);
    uv_freeaddrinfo(res);
}

static void retry_cb(uv_timer_t *t) { dial((peer_t *)((char *)t - offsetof(peer_t, retry))); }

/* Resolves and connects to peer p unless a link is up or on its way. */
static void dial(peer_t *p)
{
    ddpd_t *d = p->d;
    if (d->links->closing || p->link || p->dialing || p->resolving) return;
    char host[256], port[16];
    int pn;
    if (ddpd_split_hostport(p->cfg.addr, host, sizeof host, &pn) != 0) return;
    snprintf(port, sizeof port, "%d", pn);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    p->gai.data = p;
    p->resolving = 1;
    d->links->refs++; /* the request holds the module until its callback */
    if (uv_getaddrinfo(d->loop, &p->gai, on_resolved, host, port, &hints) != 0) {
        p->resolving = 0;
        d->links->refs--;
        uv_timer_start(&p->retry, retry_cb, 1000, 0);
    }
}

static void on_accept(uv_stream_t *server, int status)
{
    ddpd_t *d = server->data;
    if (status < 0) return;
    ddpd_link_t *l = link_new(d, -1);
    if (!l) return;
    if (uv_accept(server, (uv_stream_t *)&l->tcp) != 0) {
        ddpd__link_close(l);
        return;
    }
    struct sockaddr_storage sa;
    int sl = sizeof sa;
    char ip[64] = "?";
    if (uv_tcp_getpeername(&l->tcp, (struct sockaddr *)&sa, &sl) == 0) {
        if (sa.ss_family == AF_INET)
            uv_ip4_name((struct sockaddr_in *)&sa, ip, sizeof ip);
        else
            uv_ip6_name((struct sockaddr_in6 *)&sa, ip, sizeof ip);
    }
    snprintf(l->remote, sizeof l->remote, "%s", ip);
    snprintf(l->ip, sizeof l->ip, "%s", ip);
    l->state = L_WAIT_HELLO;
    /* unauthenticated links from one address, and in all, are bounded */
    int same = 0, unauth = 0;
    for (ddpd_link_t *o = d->links->links; o; o = o->next) {
        if (o == l || o->closing || o->peer >= 0 || o->state == L_UP) continue;
        unauth++;
        same += !strcmp(o->ip, l->ip);
    }
    if (same >= d->cfg.max_peer_links_per_addr || unauth >= MAX_UNAUTH) {
        DDP_WARN("peer link from %s refused: %d unauthenticated links from it already "
                 "(max_peer_links_per_addr), %d in all",
                 ip, same, unauth);
        ddpd__link_close(l);
        return;
    }
    uv_read_start((uv_stream_t *)&l->tcp, ddpd_lines_alloc, p_read);
}

/* ---- public ---- */

int ddpd_links_start(ddpd_t *d, const ddpd_link_handler_t *h, ddp_errinfo_t *ei)
{
    ddpd_links_t *ls = ddp_calloc(1, sizeof *ls);
    if (!ls) return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    ls->d = d;
    ls->h = *h;
    ls->refs = 1;
    d->links = ls;
    if (!d->cfg.listen[0] && !d->cfg.n_peers) return 0;
    int rc = ddpd_auth_load_key(d->cfg.secret_file, ls->key);
    if (rc != 0)
        return ddp_errinfo_set(ei, rc, "cannot use the cluster secret %s: %s", d->cfg.secret_file,
                               rc == DDP_EINVAL  ? "empty"
                               : rc == DDP_EPERM ? "others may read it, or it is not root's "
                                                   "(chmod 600, chown root)"
                                                 : ddp_strerror(rc));
    ls->have_key = 1;
    if (d->cfg.listen[0]) {
        char host[256];
        int port;
        struct sockaddr_storage sa;
        ddpd_split_hostport(d->cfg.listen, host, sizeof host, &port);
        if (uv_ip4_addr(host, port, (struct sockaddr_in *)&sa) != 0 &&
            uv_ip6_addr(host, port, (struct sockaddr_in6 *)&sa) != 0)
            return ddp_errinfo_set(ei, DDP_EINVAL, "listen: bad address %s", d->cfg.listen);
        uv_tcp_init(d->loop, &ls->listener);
        ls->listener.data = d;
        ls->listening = 1;
        rc = uv_tcp_bind(&ls->listener, (struct sockaddr *)&sa, 0);
        if (rc == 0) rc = uv_listen((uv_stream_t *)&ls->listener, 64, on_accept);
        if (rc != 0)
            return ddp_errinfo_set(ei, DDP_EIO, "cannot listen on %s: %s", d->cfg.listen,
                                   uv_strerror(rc));
        DDP_INFO("peers: listening on %s", d->cfg.listen);
    }
    ls->peers = ddp_calloc((size_t)d->cfg.n_peers + 1, sizeof *ls->peers);
    if (!ls->peers) return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    ls->n = d->cfg.n_peers;
    for (int i = 0; i < ls->n; i++) {
        peer_t *p = &ls->peers[i];
        p->d = d;
        p->cfg = d->cfg.peers[i];
        snprintf(p->name, sizeof p->name, "%.63s", p->cfg.name[0] ? p->cfg.name : p->cfg.addr);
        uv_timer_init(d->loop, &p->retry);
        p->retry.data = d;
        dial(p);
    }
    return 0;
}

static void handle_freed(uv_handle_t *h) { links_unref(h->data); }

void ddpd_links_close(ddpd_t *d)
{
    ddpd_links_t *ls = d->links;
    if (!ls || ls->closing) return;
    ls->closing = 1;
    for (ddpd_link_t *l = ls->links, *next; l; l = next) {
        next = l->next;
        ddpd__link_close(l);
    }
    if (ls->listening) {
        ls->refs++;
        ls->listener.data = ls;
        uv_close((uv_handle_t *)&ls->listener, handle_freed);
    }
    for (int i = 0; i < ls->n; i++) {
        ls->refs++;
        if (ls->peers[i].resolving) uv_cancel((uv_req_t *)&ls->peers[i].gai);
        ls->peers[i].retry.data = ls;
        uv_close((uv_handle_t *)&ls->peers[i].retry, handle_freed);
    }
    links_unref(ls);
}

int ddpd_peers_count(ddpd_t *d) { return d->links ? d->links->n : 0; }

int ddpd_peers_up(ddpd_t *d, int i)
{
    return d->links && i >= 0 && i < d->links->n && d->links->peers[i].link != NULL;
}

int ddpd_peers_slots(ddpd_t *d, int i)
{
    return ddpd_peers_up(d, i) ? d->links->peers[i].slots : 0;
}
int ddpd_peers_free(ddpd_t *d, int i) { return ddpd_peers_up(d, i) ? d->links->peers[i].free : 0; }

const char *ddpd_peers_name(ddpd_t *d, int i)
{
    return d->links && i >= 0 && i < d->links->n ? d->links->peers[i].name : "?";
}

json_t *ddpd_peers_nodes(ddpd_t *d)
{
    json_t *arr = json_array();
    json_array_append_new(arr,
                          json_pack("{ss ss sb sb si si}", "name", d->cfg.node_name, "addr",
                                    d->cfg.listen[0] ? d->cfg.listen : d->cfg.advertise, "self", 1,
                                    "up", 1, "slots", d->cfg.slots, "free", ddpd_slots_free(d)));
    for (int i = 0; i < ddpd_peers_count(d); i++) {
        peer_t *p = &d->links->peers[i];
        json_array_append_new(arr, json_pack("{ss ss sb sb si si}", "name", p->name, "addr",
                                             p->cfg.addr, "self", 0, "up", p->link != NULL, "slots",
                                             p->slots, "free", p->free < 0 ? 0 : p->free));
    }
    return arr;
}

void ddpd_link_send(ddpd_link_t *l, json_t *m) { ddpd__link_send(l, m); }
const char *ddpd_link_name(const ddpd_link_t *l) { return l->name; }
int ddpd_link_peer(const ddpd_link_t *l) { return l->peer; }

ddpd_link_t *ddpd_links_to(ddpd_t *d, int i)
{
    return ddpd_peers_up(d, i) ? d->links->peers[i].link : NULL;
}

void ddpd_links_sent_ranks(ddpd_t *d, int i, int n)
{
    if (ddpd_peers_up(d, i)) d->links->peers[i].free -= n; /* until its next status */
}
