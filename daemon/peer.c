/* Peer links between daemons, and guest ranks (ranks this node runs for a coordinator).
 *
 * Every daemon dials each configured peer (redialling every second) and accepts links on
 * cfg.listen. A link starts with the mutual HMAC exchange of auth.h; a link that fails it is
 * logged and closed. After that both sides send JSON lines:
 *   listener -> dialer   {"t":"status","node":N,"slots":S,"free":F}   (and on every change)
 *   dialer   -> listener {"t":"start","job":J,"name":..,"ranks":[..],"world":W,"rdzv":..,
 *                         "elastic":B (DDP_RDZV is the job's coordinator),"max_restarts":R,
 *                         "token":..,"spec":"<json>","cwd":..,"uid":U,"gid":G,"threads":T}
 *   listener -> dialer   {"t":"started","job":J,"n":K} | {"t":"failed","job":J,"why":..}
 *                        {"t":"exit","job":J,"rank":R,"code":C,"sig":S}
 *   dialer   -> listener {"t":"signal","job":J,"sig":SIG} | {"t":"kill","job":J,"pid":P,"host_id":H}
 * So a coordinator learns a peer's slots and drives its ranks over the link it dialled. When
 * a coordinator's link drops, its guest ranks here are ended; when a peer's link drops, the
 * coordinator fails the jobs that had ranks there.
 * Invariant: a link is freed only in its close callback; a guest is freed when its ranks'
 * handles are all closed. Loop thread only.
 */
#include "daemon/peer.h"

#include <errno.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/host.h"
#include "common/log.h"
#include "daemon/auth.h"
#include "daemon/job.h"
#include "daemon/lines.h"
#include "daemon/sched.h"
#include "daemon/spawn.h"

#define PEER_MAX_LINE (1u << 20)

typedef enum { L_CONNECTING, L_HELLO_SENT, L_WAIT_HELLO, L_WAIT_MAC, L_WAIT_OK, L_UP } lstate_t;

typedef struct link link_t;
typedef struct guest guest_t;

struct link {
    uv_tcp_t tcp;
    uv_connect_t conn;
    ddpd_t *d;
    link_t *next;
    int peer;       /* dialled links: index in cfg.peers; accepted: -1 */
    lstate_t state;
    int closing;
    char remote[128]; /* address as seen */
    char name[64];    /* node name the other side claims (proven once UP) */
    unsigned char n_mine[DDPD_AUTH_NONCEBYTES], n_theirs[DDPD_AUTH_NONCEBYTES];
    ddpd_lines_t in; /* the partial line */
};

struct guest {
    guest_t *next;
    ddpd_t *d;
    link_t *link; /* the coordinator's link; NULL once it dropped */
    char coord[64];
    int64_t job;
    int n;          /* ranks */
    int live;       /* still running */
    int handles;    /* open process handles */
    int freeing;
    ddpd_proc_t *procs;
    char run_dir[PATH_MAX];
    char spec_path[PATH_MAX + 16];
    json_t *start;    /* the start request (its strings are the launch's) */
    int max_restarts; /* elastic: a rank that dies is spawned again this many times */
    int signalled;    /* the coordinator sent a signal: no restarts any more */
};

typedef struct peer {
    ddpd_t *d;
    ddpd_peer_cfg_t cfg;
    char name[64];
    link_t *link; /* our dialled link, when UP */
    link_t *dialing;
    int slots, free;
    uv_timer_t retry;
    uv_getaddrinfo_t gai;
    int resolving;
    int warned;
} peer_t;

struct ddpd_peers {
    ddpd_t *d;
    unsigned char key[DDPD_AUTH_KEYBYTES];
    int have_key;
    uv_tcp_t listener;
    int listening;
    peer_t *peers;
    int n;
    link_t *links;
    guest_t *guests;
    int closing;
    int refs; /* 1 while open + each link + (at close) the listener and the timers */
};

static void link_close(link_t *l);
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
    link_t *l = r->data;
    free(w->data);
    free(w);
    if (status < 0 && !l->closing) link_close(l);
}

static void send_msg(link_t *l, json_t *m)
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

static peer_t *peer_of(ddpd_peers_t *ps, link_t *l)
{
    return l->peer >= 0 && l->peer < ps->n ? &ps->peers[l->peer] : NULL;
}

static void guests_lost_link(ddpd_peers_t *ps, link_t *l);

static void peers_unref(ddpd_peers_t *ps)
{
    if (--ps->refs > 0) return;
    ps->d->peers = NULL;
    for (guest_t *g = ps->guests, *next; g; g = next) { /* all handles are closed by now */
        next = g->next;
        free(g->procs);
        free(g);
    }
    free(ps->peers);
    free(ps);
}

static void link_closed(uv_handle_t *h)
{
    link_t *l = h->data;
    ddpd_peers_t *ps = l->d->peers;
    for (link_t **pp = &ps->links; *pp; pp = &(*pp)->next)
        if (*pp == l) {
            *pp = l->next;
            break;
        }
    ddpd_lines_free(&l->in);
    free(l);
    peers_unref(ps);
}

static void link_close(link_t *l)
{
    if (l->closing) return;
    l->closing = 1;
    ddpd_t *d = l->d;
    ddpd_peers_t *ps = d->peers;
    peer_t *p = peer_of(ps, l);
    if (p && p->link == l) {
        p->link = NULL;
        DDP_WARN("peer %s (%s): link down", p->name, p->cfg.addr);
        /* jobs with ranks there cannot go on (rejoin comes later) */
        for (ddpd_job_t *j = d->jobs; j; j = j->next) {
            if (ddpd_state_terminal(j->state) || !j->rank_node) continue;
            for (int r = 0; r < j->world; r++)
                if (j->rank_node[r] == l->peer + 1) {
                    char why[160];
                    snprintf(why, sizeof why, "lost the link to node %s, which ran rank %d",
                             p->name, r);
                    ddpd_job_remote_failed(d, j->id, why);
                    break;
                }
        }
    }
    if (!p && l->state == L_WAIT_MAC && !ps->closing)
        DDP_WARN("peer link from %s (claims '%s') refused: it dropped the authentication "
                 "(it could not verify our HMAC: wrong secret?)",
                 l->remote, l->name);
    if (p && p->dialing == l) p->dialing = NULL;
    if (p && !ps->closing) uv_timer_start(&p->retry, retry_cb, 1000, 0);
    guests_lost_link(ps, l);
    uv_close((uv_handle_t *)&l->tcp, link_closed);
}

static link_t *link_new(ddpd_t *d, int peer)
{
    link_t *l = ddp_calloc(1, sizeof *l);
    if (!l) return NULL;
    l->d = d;
    l->peer = peer;
    uv_tcp_init(d->loop, &l->tcp);
    l->tcp.data = l;
    uv_tcp_nodelay(&l->tcp, 1);
    l->next = d->peers->links;
    d->peers->links = l;
    d->peers->refs++;
    return l;
}

/* ---- status ---- */

static json_t *status_msg(ddpd_t *d)
{
    int free_slots = d->cfg.slots - d->slots_used;
    return json_pack("{ss ss si si}", "t", "status", "node", d->cfg.node_name, "slots",
                     d->cfg.slots, "free", free_slots < 0 ? 0 : free_slots);
}

void ddpd_peers_announce(ddpd_t *d)
{
    ddpd_peers_t *ps = d->peers;
    if (!ps) return;
    for (link_t *l = ps->links; l; l = l->next)
        if (l->peer < 0 && l->state == L_UP) send_msg(l, status_msg(d));
}

/* ---- guests ---- */

static void guest_maybe_free(guest_t *g)
{
    if (!g->freeing || g->handles > 0) return;
    ddpd_peers_t *ps = g->d->peers;
    if (!ps) return; /* freed with the peers module */
    for (guest_t **pp = &ps->guests; *pp; pp = &(*pp)->next)
        if (*pp == g) {
            *pp = g->next;
            break;
        }
    json_decref(g->start);
    free(g->procs);
    free(g);
}

/* The launch description of a guest's ranks (strings borrowed from g->start). */
static void guest_launch(const guest_t *g, ddpd_launch_t *la)
{
    const json_t *m = g->start;
    const char *cwd = json_string_value(json_object_get(m, "cwd"));
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = (int)json_integer_value(json_object_get(m, "threads"));
    *la = (ddpd_launch_t){
        .worker_bin = g->d->cfg.worker_bin,
        .spec_path = g->spec_path,
        .run_dir = g->run_dir,
        .cwd = cwd && access(cwd, X_OK) == 0 ? cwd : NULL,
        .rdzv = json_string_value(json_object_get(m, "rdzv")),
        .token = json_string_value(json_object_get(m, "token")),
        .job_id = g->job,
        .world = (int)json_integer_value(json_object_get(m, "world")),
        .local_world = g->n,
        .threads = threads > 0 ? threads : (int)(cores / g->n > 0 ? cores / g->n : 1),
        .as_user = 1,
        .elastic = json_is_true(json_object_get(m, "elastic")),
        .uid = (uid_t)json_integer_value(json_object_get(m, "uid")),
        .gid = (gid_t)json_integer_value(json_object_get(m, "gid"))};
}

static void guest_exit(ddpd_proc_t *p)
{
    guest_t *g = p->data;
    g->live--;
    g->d->slots_used--;
    int code = (int)p->exit_status;
    DDP_INFO("guest rank %d of %s job %lld ended (code %d, signal %d)", p->rank, g->coord,
             (long long)g->job, code, p->term_signal);
    if ((code != 0 || p->term_signal) && code != 2 && g->link && !g->signalled &&
        !g->d->stopping && p->restarts < g->max_restarts) {
        p->respawn = 1; /* elastic: spawned again once closed (guest_closed); not reported */
        return;
    }
    send_msg(g->link, json_pack("{ss sI si si si}", "t", "exit", "job", (json_int_t)g->job,
                                "rank", p->rank, "code", code, "sig", p->term_signal));
    if (g->live == 0) g->freeing = 1;
    ddpd_peers_announce(g->d);
}

/* Elastic: a guest rank that died is spawned again and rejoins the job's coordinator. */
static void guest_respawn(guest_t *g, ddpd_proc_t *p)
{
    p->respawn = 0;
    ddpd_launch_t la;
    guest_launch(g, &la);
    char why[512];
    p->restarts++;
    int rc = ddpd_spawn_rank(g->d->loop, p, &la, p->rank, p->local_rank, why, sizeof why);
    if (p->open) g->handles++;
    if (rc == 0) {
        g->live++;
        g->d->slots_used++;
        g->d->n_worker_restarts++;
        DDP_WARN("guest rank %d of job %lld spawned again as pid %d (restart %d of %d)",
                 p->rank, (long long)g->job, p->pid, p->restarts, g->max_restarts);
        return;
    }
    DDP_ERROR("guest rank %d of job %lld: %s", p->rank, (long long)g->job, why);
    send_msg(g->link, json_pack("{ss sI si si si}", "t", "exit", "job", (json_int_t)g->job,
                                "rank", p->rank, "code", 1, "sig", 0));
    if (g->live == 0) g->freeing = 1;
}

static void guest_closed(ddpd_proc_t *p)
{
    guest_t *g = p->data;
    if (p->respawn) guest_respawn(g, p);
    g->handles--;
    guest_maybe_free(g);
}

static void guests_signal(ddpd_peers_t *ps, link_t *l, int64_t job, int sig)
{
    for (guest_t *g = ps->guests; g; g = g->next)
        if (g->link == l && (job < 0 || g->job == job)) {
            g->signalled = 1;
            for (int i = 0; i < g->n; i++) ddpd_proc_signal(&g->procs[i], sig);
        }
}

static void guests_lost_link(ddpd_peers_t *ps, link_t *l)
{
    for (guest_t *g = ps->guests; g; g = g->next)
        if (g->link == l) {
            if (g->live > 0)
                DDP_WARN("coordinator %s of job %lld is gone: ending its %d ranks here", g->coord,
                         (long long)g->job, g->live);
            for (int i = 0; i < g->n; i++) ddpd_proc_signal(&g->procs[i], SIGKILL);
            g->link = NULL;
        }
}

static void fail_start(link_t *l, int64_t job, const char *why)
{
    DDP_WARN("cannot start ranks of job %lld for %s: %s", (long long)job, l->name, why);
    send_msg(l, json_pack("{ss sI ss}", "t", "failed", "job", (json_int_t)job, "why", why));
}

static void on_start(link_t *l, json_t *m)
{
    ddpd_t *d = l->d;
    int64_t job = json_integer_value(json_object_get(m, "job"));
    json_t *ranks = json_object_get(m, "ranks");
    const char *spec = json_string_value(json_object_get(m, "spec"));
    const char *rdzv = json_string_value(json_object_get(m, "rdzv"));
    const char *token = json_string_value(json_object_get(m, "token"));
    int world = (int)json_integer_value(json_object_get(m, "world"));
    size_t n = json_array_size(ranks);
    if (!spec || !rdzv || !token || n == 0 || n > 4096 || world < (int)n) {
        fail_start(l, job, "malformed start request");
        return;
    }
    if ((int)n > d->cfg.slots - d->slots_used || d->stopping) {
        char why[128];
        snprintf(why, sizeof why, "node %s has %d free slots, %zu asked", d->cfg.node_name,
                 d->cfg.slots - d->slots_used, n);
        fail_start(l, job, why);
        return;
    }
    guest_t *g = ddp_calloc(1, sizeof *g);
    if (!g || !(g->procs = ddp_calloc(n, sizeof *g->procs))) {
        free(g);
        fail_start(l, job, "out of memory");
        return;
    }
    g->d = d;
    g->link = l;
    g->job = job;
    g->n = (int)n;
    snprintf(g->coord, sizeof g->coord, "%s", l->name);
    snprintf(g->run_dir, sizeof g->run_dir, "%.3000s/%.60s-job-%lld", d->cfg.run_dir, l->name,
             (long long)job);
    g->next = d->peers->guests;
    d->peers->guests = g;
    mkdir(g->run_dir, 0750);
    uid_t uid = (uid_t)json_integer_value(json_object_get(m, "uid"));
    gid_t gid = (gid_t)json_integer_value(json_object_get(m, "gid"));
    if (geteuid() == 0 && uid != 0 && chown(g->run_dir, uid, gid) != 0)
        DDP_WARN("chown %s: %s", g->run_dir, strerror(errno));
    snprintf(g->spec_path, sizeof g->spec_path, "%s/job.json", g->run_dir);
    FILE *f = fopen(g->spec_path, "we");
    int ok = f && fputs(spec, f) >= 0;
    if (f) ok = (fclose(f) == 0) && ok;
    g->start = json_incref(m);
    g->max_restarts = json_is_true(json_object_get(m, "elastic"))
                          ? (int)json_integer_value(json_object_get(m, "max_restarts"))
                          : 0;
    ddpd_launch_t la;
    guest_launch(g, &la);
    char why[512] = "";
    if (!ok) snprintf(why, sizeof why, "cannot write %.200s", g->spec_path);
    for (size_t i = 0; i < n && ok; i++) {
        ddpd_proc_t *p = &g->procs[i];
        p->data = g;
        p->on_exit = guest_exit;
        p->on_close = guest_closed;
        int rc = ddpd_spawn_rank(d->loop, p, &la,
                                 (int)json_integer_value(json_array_get(ranks, i)), (int)i, why,
                                 sizeof why);
        if (p->open) g->handles++;
        if (rc != 0) {
            ok = 0;
            break;
        }
        g->live++;
        d->slots_used++;
    }
    if (!ok) {
        fail_start(l, job, why);
        for (int i = 0; i < g->n; i++) ddpd_proc_signal(&g->procs[i], SIGKILL);
        g->link = NULL; /* its exits are not reported: the coordinator counts them gone */
        if (g->live == 0) g->freeing = 1;
        guest_maybe_free(g);
        return;
    }
    DDP_INFO("started %zu ranks of job %lld for coordinator %s (run dir %s)", n, (long long)job,
             l->name, g->run_dir);
    send_msg(l, json_pack("{ss sI si}", "t", "started", "job", (json_int_t)job, "n", (int)n));
    ddpd_peers_announce(d);
}

/* ---- messages after authentication ---- */

static void on_message(link_t *l, json_t *m)
{
    ddpd_t *d = l->d;
    const char *t = json_string_value(json_object_get(m, "t"));
    if (!t) return;
    int64_t job = json_integer_value(json_object_get(m, "job"));
    peer_t *p = peer_of(d->peers, l);
    if (!strcmp(t, "status") && p) {
        int was = p->slots;
        p->slots = (int)json_integer_value(json_object_get(m, "slots"));
        p->free = (int)json_integer_value(json_object_get(m, "free"));
        if (was != p->slots || p->free > 0) ddpd_sched_kick(d);
    } else if (!strcmp(t, "start") && l->peer < 0) {
        on_start(l, m);
    } else if (!strcmp(t, "kill") && l->peer < 0) {
        int pid = (int)json_integer_value(json_object_get(m, "pid"));
        const char *hid = json_string_value(json_object_get(m, "host_id"));
        char mine[160];
        ddp_host_id(mine, sizeof mine);
        for (guest_t *g = d->peers->guests; hid && !strcmp(hid, mine) && g; g = g->next)
            if (g->link == l && g->job == job)
                for (int i = 0; i < g->n; i++)
                    if (g->procs[i].alive && g->procs[i].pid == pid) {
                        DDP_WARN("killing guest rank %d of job %lld (pid %d): its coordinator "
                                 "evicted it", g->procs[i].rank, (long long)job, pid);
                        ddpd_proc_signal(&g->procs[i], SIGKILL);
                    }
    } else if (!strcmp(t, "signal") && l->peer < 0) {
        guests_signal(d->peers, l, job, (int)json_integer_value(json_object_get(m, "sig")));
    } else if (!strcmp(t, "started") && p) {
        ddpd_job_remote_started(d, job, (int)json_integer_value(json_object_get(m, "n")));
    } else if (!strcmp(t, "failed") && p) {
        char why[300];
        snprintf(why, sizeof why, "node %s: %s", p->name,
                 json_string_value(json_object_get(m, "why")));
        ddpd_job_remote_failed(d, job, why);
    } else if (!strcmp(t, "exit") && p) {
        ddpd_job_remote_exit(d, job, (int)json_integer_value(json_object_get(m, "rank")),
                             (int)json_integer_value(json_object_get(m, "code")),
                             (int)json_integer_value(json_object_get(m, "sig")));
    }
}

/* ---- authentication ---- */

static void refuse(link_t *l, const char *why)
{
    DDP_WARN("peer link from %s (claims '%s') refused: %s", l->remote,
             l->name[0] ? l->name : "?", why);
    send_msg(l, json_pack("{ss}", "error", "authentication failed"));
    link_close(l);
}

static void on_auth(link_t *l, json_t *m)
{
    ddpd_peers_t *ps = l->d->peers;
    char hex[2 * DDPD_AUTH_MACBYTES + 1], nhex[2 * DDPD_AUTH_NONCEBYTES + 1];
    unsigned char mac[DDPD_AUTH_MACBYTES];
    switch (l->state) {
    case L_WAIT_HELLO: { /* listener: {"hello", "nonce"} */
        const char *name = json_string_value(json_object_get(m, "hello"));
        if (!name ||
            ddpd_auth_from_hex(l->n_theirs, sizeof l->n_theirs,
                               json_string_value(json_object_get(m, "nonce"))) != 0) {
            refuse(l, "malformed hello");
            return;
        }
        snprintf(l->name, sizeof l->name, "%s", name);
        ddpd_auth_nonce(l->n_mine);
        ddpd_auth_mac(ps->key, "ddpd-server", l->n_theirs, l->n_mine, mac);
        ddpd_auth_to_hex(hex, mac, sizeof mac);
        ddpd_auth_to_hex(nhex, l->n_mine, sizeof l->n_mine);
        send_msg(l, json_pack("{ss ss ss}", "node", l->d->cfg.node_name, "nonce", nhex, "mac",
                              hex));
        l->state = L_WAIT_MAC;
        return;
    }
    case L_WAIT_MAC: /* listener: {"mac"} proves the dialer knows the secret */
        if (!ddpd_auth_verify_hex(ps->key, "ddpd-client", l->n_mine, l->n_theirs,
                                  json_string_value(json_object_get(m, "mac")))) {
            refuse(l, "wrong secret (HMAC mismatch)");
            return;
        }
        l->state = L_UP;
        DDP_INFO("peer %s (%s) authenticated (inbound)", l->name, l->remote);
        send_msg(l, json_pack("{sb ss}", "ok", 1, "node", l->d->cfg.node_name));
        send_msg(l, status_msg(l->d));
        return;
    case L_HELLO_SENT: { /* dialer: {"node","nonce","mac"} proves the listener knows it */
        const char *name = json_string_value(json_object_get(m, "node"));
        if (!name ||
            ddpd_auth_from_hex(l->n_theirs, sizeof l->n_theirs,
                               json_string_value(json_object_get(m, "nonce"))) != 0 ||
            !ddpd_auth_verify_hex(ps->key, "ddpd-server", l->n_mine, l->n_theirs,
                                  json_string_value(json_object_get(m, "mac")))) {
            peer_t *p = peer_of(ps, l);
            if (p && !p->warned)
                DDP_WARN("peer %s: it failed authentication (wrong secret?)", p->cfg.addr);
            if (p) p->warned = 1;
            link_close(l);
            return;
        }
        snprintf(l->name, sizeof l->name, "%s", name);
        ddpd_auth_mac(ps->key, "ddpd-client", l->n_theirs, l->n_mine, mac);
        ddpd_auth_to_hex(hex, mac, sizeof mac);
        send_msg(l, json_pack("{ss}", "mac", hex));
        l->state = L_WAIT_OK;
        return;
    }
    case L_WAIT_OK: {
        peer_t *p = peer_of(ps, l);
        if (!json_is_true(json_object_get(m, "ok")) || !p) {
            if (p && !p->warned) DDP_WARN("peer %s refused us (wrong secret?)", p->cfg.addr);
            if (p) p->warned = 1;
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

static int on_line(void *arg, const char *line, size_t len)
{
    link_t *l = arg;
    json_t *m = json_loadb(line, len, 0, NULL);
    if (!json_is_object(m)) {
        json_decref(m);
        if (l->state != L_UP) refuse(l, "not a JSON object"); /* after auth: ignored */
        return l->closing;
    }
    if (l->state == L_UP)
        on_message(l, m);
    else
        on_auth(l, m);
    json_decref(m);
    return l->closing;
}

static void p_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    link_t *l = s->data;
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
    link_t *l = req->data;
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
    ddpd_peers_t *ps = d->peers;
    if (ps->closing || status < 0 || !res) {
        if (res) uv_freeaddrinfo(res);
        if (!ps->closing) uv_timer_start(&p->retry, retry_cb, 1000, 0);
        peers_unref(ps);
        return;
    }
    link_t *l = link_new(d, (int)(p - ps->peers));
    peers_unref(ps);
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
    if (d->peers->closing || p->link || p->dialing || p->resolving) return;
    char host[256], port[16];
    int pn;
    if (ddpd_split_hostport(p->cfg.addr, host, sizeof host, &pn) != 0) return;
    snprintf(port, sizeof port, "%d", pn);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    p->gai.data = p;
    p->resolving = 1;
    d->peers->refs++; /* the request holds the module until its callback */
    if (uv_getaddrinfo(d->loop, &p->gai, on_resolved, host, port, &hints) != 0) {
        p->resolving = 0;
        d->peers->refs--;
        uv_timer_start(&p->retry, retry_cb, 1000, 0);
    }
}

static void on_accept(uv_stream_t *server, int status)
{
    ddpd_t *d = server->data;
    if (status < 0) return;
    link_t *l = link_new(d, -1);
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

/* Local ranks started or ended: the peers hear of this node's free slots. */
static void job_changed(void *arg, ddpd_job_t *j, unsigned what)
{
    (void)j;
    if (what & DDPD_JOB_SLOTS) ddpd_peers_announce(arg);
}

int ddpd_peers_start(ddpd_t *d, ddp_errinfo_t *ei)
{
    ddpd_peers_t *ps = ddp_calloc(1, sizeof *ps);
    if (!ps) return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    ps->d = d;
    ps->refs = 1;
    d->peers = ps;
    ddpd_job_on_change(d, job_changed, d);
    if (!d->cfg.listen[0] && !d->cfg.n_peers) return 0;
    int rc = ddpd_auth_load_key(d->cfg.secret_file, ps->key);
    if (rc != 0)
        return ddp_errinfo_set(ei, rc, "cannot use the cluster secret %s: %s",
                               d->cfg.secret_file, rc == DDP_EINVAL ? "empty" : ddp_strerror(rc));
    ps->have_key = 1;
    if (d->cfg.listen[0]) {
        char host[256];
        int port;
        struct sockaddr_storage sa;
        ddpd_split_hostport(d->cfg.listen, host, sizeof host, &port);
        if (uv_ip4_addr(host, port, (struct sockaddr_in *)&sa) != 0 &&
            uv_ip6_addr(host, port, (struct sockaddr_in6 *)&sa) != 0)
            return ddp_errinfo_set(ei, DDP_EINVAL, "listen: bad address %s", d->cfg.listen);
        uv_tcp_init(d->loop, &ps->listener);
        ps->listener.data = d;
        ps->listening = 1;
        rc = uv_tcp_bind(&ps->listener, (struct sockaddr *)&sa, 0);
        if (rc == 0) rc = uv_listen((uv_stream_t *)&ps->listener, 64, on_accept);
        if (rc != 0)
            return ddp_errinfo_set(ei, DDP_EIO, "cannot listen on %s: %s", d->cfg.listen,
                                   uv_strerror(rc));
        DDP_INFO("peers: listening on %s", d->cfg.listen);
    }
    ps->peers = ddp_calloc((size_t)d->cfg.n_peers + 1, sizeof *ps->peers);
    if (!ps->peers) return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    ps->n = d->cfg.n_peers;
    for (int i = 0; i < ps->n; i++) {
        peer_t *p = &ps->peers[i];
        p->d = d;
        p->cfg = d->cfg.peers[i];
        snprintf(p->name, sizeof p->name, "%.63s", p->cfg.name[0] ? p->cfg.name : p->cfg.addr);
        uv_timer_init(d->loop, &p->retry);
        p->retry.data = d;
        dial(p);
    }
    return 0;
}

static void handle_freed(uv_handle_t *h) { peers_unref(h->data); }

void ddpd_peers_stop_guests(ddpd_t *d)
{
    if (!d->peers) return;
    for (guest_t *g = d->peers->guests; g; g = g->next)
        for (int i = 0; i < g->n; i++) ddpd_proc_signal(&g->procs[i], SIGTERM);
}

void ddpd_peers_close(ddpd_t *d)
{
    ddpd_peers_t *ps = d->peers;
    if (!ps || ps->closing) return;
    ps->closing = 1;
    for (link_t *l = ps->links, *next; l; l = next) {
        next = l->next;
        link_close(l);
    }
    if (ps->listening) {
        ps->refs++;
        ps->listener.data = ps;
        uv_close((uv_handle_t *)&ps->listener, handle_freed);
    }
    for (int i = 0; i < ps->n; i++) {
        ps->refs++;
        if (ps->peers[i].resolving) uv_cancel((uv_req_t *)&ps->peers[i].gai);
        ps->peers[i].retry.data = ps;
        uv_close((uv_handle_t *)&ps->peers[i].retry, handle_freed);
    }
    peers_unref(ps);
}

int ddpd_peers_count(ddpd_t *d) { return d->peers ? d->peers->n : 0; }

int ddpd_peers_up(ddpd_t *d, int i)
{
    return d->peers && i >= 0 && i < d->peers->n && d->peers->peers[i].link != NULL;
}

int ddpd_peers_slots(ddpd_t *d, int i) { return ddpd_peers_up(d, i) ? d->peers->peers[i].slots : 0; }
int ddpd_peers_free(ddpd_t *d, int i) { return ddpd_peers_up(d, i) ? d->peers->peers[i].free : 0; }

const char *ddpd_peers_name(ddpd_t *d, int i)
{
    return d->peers && i >= 0 && i < d->peers->n ? d->peers->peers[i].name : "?";
}

int ddpd_peers_launch(ddpd_t *d, int i, ddpd_job_t *j, const int *ranks, int n)
{
    if (!ddpd_peers_up(d, i)) return DDP_EPEER;
    peer_t *p = &d->peers->peers[i];
    json_t *rs = json_array();
    for (int k = 0; k < n; k++) json_array_append_new(rs, json_integer(ranks[k]));
    json_t *m = json_pack("{ss sI ss so si ss ss ss ss si si si sb si}", "t", "start", "job",
                          (json_int_t)j->id, "name", j->name, "ranks", rs, "world", j->world,
                          "rdzv", j->rdzv, "token", j->token, "spec", j->spec_json, "cwd",
                          j->cwd, "uid", (int)j->uid, "gid", (int)j->gid, "threads", j->threads,
                          "elastic", j->elastic, "max_restarts", j->max_restarts);
    if (!m) return DDP_ENOMEM;
    p->free -= n; /* until its next status */
    send_msg(p->link, m);
    return 0;
}

void ddpd_peers_kill(ddpd_t *d, int i, int64_t job_id, int pid, const char *host_id)
{
    if (!ddpd_peers_up(d, i)) return;
    send_msg(d->peers->peers[i].link, json_pack("{ss sI si ss}", "t", "kill", "job",
                                                (json_int_t)job_id, "pid", pid, "host_id",
                                                host_id ? host_id : ""));
}

void ddpd_peers_signal(ddpd_t *d, int i, int64_t job_id, int sig)
{
    if (!ddpd_peers_up(d, i)) return;
    send_msg(d->peers->peers[i].link,
             json_pack("{ss sI si}", "t", "signal", "job", (json_int_t)job_id, "sig", sig));
}

json_t *ddpd_peers_nodes(ddpd_t *d)
{
    int f = d->cfg.slots - d->slots_used;
    json_t *arr = json_array();
    json_array_append_new(arr, json_pack("{ss ss sb sb si si}", "name", d->cfg.node_name, "addr",
                                         d->cfg.listen[0] ? d->cfg.listen : d->cfg.advertise,
                                         "self", 1, "up", 1, "slots", d->cfg.slots, "free",
                                         f < 0 ? 0 : f));
    for (int i = 0; i < ddpd_peers_count(d); i++) {
        peer_t *p = &d->peers->peers[i];
        json_array_append_new(arr, json_pack("{ss ss sb sb si si}", "name", p->name, "addr",
                                             p->cfg.addr, "self", 0, "up", p->link != NULL,
                                             "slots", p->slots, "free", p->free < 0 ? 0 : p->free));
    }
    return arr;
}

int ddpd_peers_guest_ranks(ddpd_t *d)
{
    int n = 0;
    if (d->peers)
        for (guest_t *g = d->peers->guests; g; g = g->next) n += g->live;
    return n;
}
