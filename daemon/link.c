/* Authenticated links between daemons (see link.h).
 *
 * Every daemon dials each configured peer (redialling every second) and accepts links on
 * cfg.listen. A link starts with the mutual HMAC exchange of auth.h; a link that fails it is
 * logged and closed. After that both sides send JSON lines; the listener sends the dialer
 * {"t":"status","node":N,"slots":S,"free":F} at once and on every change, which is how a
 * coordinator learns its peers' slots; every other message goes to the handler. Every line is
 * parsed by peer_msg.c first: one that is not the message the link's state expects closes it.
 * Invariant: a link is freed only in its close callback; the module is freed once its links,
 * listener and timers are all closed. Loop thread only.
 */
#include "daemon/link.h"

#include <netdb.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "daemon/auth.h"
#include "daemon/lines.h"
#include "daemon/peer_msg.h"
#include "daemon/slots.h"

#define PEER_MAX_LINE (1u << 20)

typedef enum { L_CONNECTING, L_HELLO_SENT, L_WAIT_HELLO, L_WAIT_MAC, L_WAIT_OK, L_UP } lstate_t;

typedef struct peer peer_t;

struct ddpd_link {
    uv_tcp_t tcp;
    uv_connect_t conn;
    ddpd_t *d;
    ddpd_link_t *next;
    int peer;       /* dialled links: index in cfg.peers; accepted: -1 */
    lstate_t state;
    int closing;
    char remote[128]; /* address as seen */
    char name[64];    /* node name the other side claims (proven once UP) */
    unsigned char n_mine[DDPD_AUTH_NONCEBYTES], n_theirs[DDPD_AUTH_NONCEBYTES];
    ddpd_lines_t in; /* the partial line */
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

static void link_close(ddpd_link_t *l);
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
    if (status < 0 && !l->closing) link_close(l);
}

static void send_msg(ddpd_link_t *l, json_t *m)
{
    if (!l || l->closing) {
        json_decref(m);
        return;
    }
    char *s = json_dumps(m, JSON_COMPACT);
    json_decref(m);
    if (!s) return;
    size_t n = strlen(s);
    s[n] = '\n';
    wreq_t *w = ddp_malloc(sizeof *w);
    if (!w) {
        free(s);
        return;
    }
    w->data = s;
    w->req.data = l;
    uv_buf_t b = uv_buf_init(s, (unsigned)n + 1);
    if (uv_write(&w->req, (uv_stream_t *)&l->tcp, &b, 1, wdone) != 0) {
        free(s);
        free(w);
        link_close(l);
    }
}

static peer_t *peer_of(ddpd_links_t *ls, ddpd_link_t *l)
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
    ddpd_links_t *ls = l->d->links;
    for (ddpd_link_t **pp = &ls->links; *pp; pp = &(*pp)->next)
        if (*pp == l) {
            *pp = l->next;
            break;
        }
    ddpd_lines_free(&l->in);
    free(l);
    links_unref(ls);
}

static void link_close(ddpd_link_t *l)
{
    if (l->closing) return;
    l->closing = 1;
    ddpd_t *d = l->d;
    ddpd_links_t *ls = d->links;
    peer_t *p = peer_of(ls, l);
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
}

static ddpd_link_t *link_new(ddpd_t *d, int peer)
{
    ddpd_link_t *l = ddp_calloc(1, sizeof *l);
    if (!l) return NULL;
    l->d = d;
    l->peer = peer;
    uv_tcp_init(d->loop, &l->tcp);
    l->tcp.data = l;
    uv_tcp_nodelay(&l->tcp, 1);
    l->next = d->links->links;
    d->links->links = l;
    d->links->refs++;
    return l;
}

/* ---- status ---- */

static json_t *status_msg(ddpd_t *d)
{
    return json_pack("{ss ss si si}", "t", "status", "node", d->cfg.node_name, "slots",
                     d->cfg.slots, "free", ddpd_slots_free(d));
}

void ddpd_peers_announce(ddpd_t *d)
{
    ddpd_links_t *ls = d->links;
    if (!ls) return;
    for (ddpd_link_t *l = ls->links; l; l = l->next)
        if (l->peer < 0 && l->state == L_UP) send_msg(l, status_msg(d));
}

/* ---- messages after authentication ---- */

static void on_message(ddpd_link_t *l, const ddpd_pmsg_t *m)
{
    ddpd_links_t *ls = l->d->links;
    peer_t *p = peer_of(ls, l);
    if (m->kind == DDPD_PMSG_STATUS && p) {
        int was = p->slots;
        p->slots = m->u.status.slots;
        p->free = m->u.status.free;
        if ((was != p->slots || p->free > 0) && ls->h.nodes_changed) ls->h.nodes_changed(l->d);
    } else if (m->kind != DDPD_PMSG_UNKNOWN && ls->h.message) {
        ls->h.message(l->d, l, m); /* a newer peer's kinds of message are not ours to read */
    }
}

/* ---- authentication ---- */

static void refuse(ddpd_link_t *l, const char *why)
{
    DDP_WARN("peer link from %s (claims '%s') refused: %s", l->remote,
             l->name[0] ? l->name : "?", why);
    send_msg(l, json_pack("{ss}", "error", "authentication failed"));
    link_close(l);
}

/* The dialer's handshake failed: said once per peer until a link to it is up again. */
static void dial_failed(ddpd_link_t *l, const char *why)
{
    peer_t *p = peer_of(l->d->links, l);
    if (p && !p->warned) DDP_WARN("peer %s: %s", p->cfg.addr, why);
    if (p) p->warned = 1;
    link_close(l);
}

/* What a link in state s reads next. */
static ddpd_pmsg_kind_t expected(lstate_t s)
{
    switch (s) {
    case L_WAIT_HELLO: return DDPD_PMSG_HELLO;
    case L_WAIT_MAC: return DDPD_PMSG_PROOF;
    case L_HELLO_SENT: return DDPD_PMSG_CHALLENGE;
    case L_WAIT_OK: return DDPD_PMSG_OK;
    default: return DDPD_PMSG_ANY;
    }
}

/* A line that is not the message expected (why: the parser's or the handshake's reason). */
static void malformed(ddpd_link_t *l, const char *why)
{
    switch (l->state) {
    case L_WAIT_HELLO:
    case L_WAIT_MAC: refuse(l, why); return;
    case L_HELLO_SENT:
    case L_WAIT_OK: dial_failed(l, why); return;
    default:
        DDP_WARN("peer link %s (%s): %s: closed", l->name, l->remote, why);
        link_close(l);
    }
}

/* One handshake message m, of the kind expected(l->state) or REFUSED. */
static void on_auth(ddpd_link_t *l, const ddpd_pmsg_t *m)
{
    ddpd_links_t *ls = l->d->links;
    char hex[2 * DDPD_AUTH_MACBYTES + 1], nhex[2 * DDPD_AUTH_NONCEBYTES + 1];
    unsigned char mac[DDPD_AUTH_MACBYTES];
    if (m->kind == DDPD_PMSG_REFUSED) {
        malformed(l, l->state == L_WAIT_OK ? "it refused us (wrong secret?)"
                                           : "it refused the handshake");
        return;
    }
    switch (l->state) {
    case L_WAIT_HELLO: /* listener: {"hello", "nonce"} */
        snprintf(l->name, sizeof l->name, "%s", m->u.hello.node);
        memcpy(l->n_theirs, m->u.hello.nonce, sizeof l->n_theirs);
        ddpd_auth_nonce(l->n_mine);
        ddpd_auth_mac(ls->key, "ddpd-server", l->n_theirs, l->n_mine, mac);
        ddpd_auth_to_hex(hex, mac, sizeof mac);
        ddpd_auth_to_hex(nhex, l->n_mine, sizeof l->n_mine);
        send_msg(l, json_pack("{ss ss ss}", "node", l->d->cfg.node_name, "nonce", nhex, "mac",
                              hex));
        l->state = L_WAIT_MAC;
        return;
    case L_WAIT_MAC: /* listener: {"mac"} proves the dialer knows the secret */
        if (!ddpd_auth_verify_hex(ls->key, "ddpd-client", l->n_mine, l->n_theirs,
                                  m->u.proof.mac)) {
            refuse(l, "wrong secret (HMAC mismatch)");
            return;
        }
        l->state = L_UP;
        DDP_INFO("peer %s (%s) authenticated (inbound)", l->name, l->remote);
        send_msg(l, json_pack("{sb ss}", "ok", 1, "node", l->d->cfg.node_name));
        if (ls->h.up) ls->h.up(l->d, l); /* before the slots: what already runs comes first */
        send_msg(l, status_msg(l->d));
        return;
    case L_HELLO_SENT: /* dialer: {"node","nonce","mac"} proves the listener knows it */
        memcpy(l->n_theirs, m->u.challenge.nonce, sizeof l->n_theirs);
        if (!ddpd_auth_verify_hex(ls->key, "ddpd-server", l->n_mine, l->n_theirs,
                                  m->u.challenge.mac)) {
            dial_failed(l, "it failed authentication (wrong secret?)");
            return;
        }
        snprintf(l->name, sizeof l->name, "%s", m->u.challenge.node);
        ddpd_auth_mac(ls->key, "ddpd-client", l->n_theirs, l->n_mine, mac);
        ddpd_auth_to_hex(hex, mac, sizeof mac);
        send_msg(l, json_pack("{ss}", "mac", hex));
        l->state = L_WAIT_OK;
        return;
    case L_WAIT_OK: {
        peer_t *p = peer_of(ls, l);
        if (!p) {
            link_close(l);
            return;
        }
        l->state = L_UP;
        p->dialing = NULL;
        p->link = l;
        p->warned = 0;
        snprintf(p->name, sizeof p->name, "%s", p->cfg.name[0] ? p->cfg.name : l->name);
        DDP_INFO("peer %s (%s) up", p->name, p->cfg.addr);
        return;
    }
    default: return;
    }
}

/* One line from the other side, parsed as what the link's state expects: a handshake message
 * before it is up, an authenticated one after; what does not parse closes the link. */
static int on_line(void *arg, const char *line, size_t len)
{
    ddpd_link_t *l = arg;
    ddpd_pmsg_kind_t expect = expected(l->state);
    ddpd_pmsg_t m;
    char why[256];
    if (ddpd_pmsg_parse(line, len, expect, &m, why, sizeof why) != 0) {
        malformed(l, why);
        return l->closing;
    }
    if (expect == DDPD_PMSG_ANY)
        on_message(l, &m);
    else
        on_auth(l, &m);
    ddpd_pmsg_close(&m);
    return l->closing;
}

static void p_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    ddpd_link_t *l = s->data;
    if (n < 0) {
        free(b->base);
        link_close(l);
        return;
    }
    size_t lim = l->state == L_UP ? PEER_MAX_LINE : 4096;
    if (!l->closing && ddpd_lines_feed(&l->in, b->base, (size_t)n, lim, on_line, l) < 0) {
        DDP_WARN("peer link %s: line over %zu bytes: closed", l->remote, lim);
        link_close(l);
    }
    free(b->base);
}

/* ---- dialling and accepting ---- */

static void on_connect(uv_connect_t *req, int status)
{
    ddpd_link_t *l = req->data;
    if (l->closing) return;
    if (status < 0) {
        link_close(l);
        return;
    }
    char nhex[2 * DDPD_AUTH_NONCEBYTES + 1];
    ddpd_auth_nonce(l->n_mine);
    ddpd_auth_to_hex(nhex, l->n_mine, sizeof l->n_mine);
    l->state = L_HELLO_SENT;
    uv_read_start((uv_stream_t *)&l->tcp, ddpd_lines_alloc, p_read);
    send_msg(l, json_pack("{ss ss}", "hello", l->d->cfg.node_name, "nonce", nhex));
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
    if (uv_tcp_connect(&l->conn, &l->tcp, res->ai_addr, on_connect) != 0) link_close(l);
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
        link_close(l);
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
    l->state = L_WAIT_HELLO;
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
        return ddp_errinfo_set(ei, rc, "cannot use the cluster secret %s: %s",
                               d->cfg.secret_file, rc == DDP_EINVAL ? "empty" : ddp_strerror(rc));
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
        link_close(l);
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
    json_array_append_new(arr, json_pack("{ss ss sb sb si si}", "name", d->cfg.node_name, "addr",
                                         d->cfg.listen[0] ? d->cfg.listen : d->cfg.advertise,
                                         "self", 1, "up", 1, "slots", d->cfg.slots, "free",
                                         ddpd_slots_free(d)));
    for (int i = 0; i < ddpd_peers_count(d); i++) {
        peer_t *p = &d->links->peers[i];
        json_array_append_new(arr, json_pack("{ss ss sb sb si si}", "name", p->name, "addr",
                                             p->cfg.addr, "self", 0, "up", p->link != NULL,
                                             "slots", p->slots, "free", p->free < 0 ? 0 : p->free));
    }
    return arr;
}


void ddpd_link_send(ddpd_link_t *l, json_t *m) { send_msg(l, m); }
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
