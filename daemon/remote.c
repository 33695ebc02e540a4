/* Remote ranks of multi-node jobs (see remote.h): the guests this node runs for coordinators,
 * and the messages that start, signal, kill and report them over the daemons' links.
 * Invariant: a guest is freed when its ranks' handles are all closed; the module is freed at
 * close once no guest is left (or when the last one goes). Loop thread only.
 */
#include "daemon/remote.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/host.h"
#include "common/log.h"
#include "daemon/link.h"
#include "daemon/spawn.h"

typedef struct guest guest_t;

struct guest {
    guest_t *next;
    ddpd_t *d;
    ddpd_link_t *link; /* the coordinator's link; NULL once it dropped */
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

struct ddpd_remote {
    ddpd_remote_reports_t reports;
    guest_t *guests;
    int closing;
};

static void remote_maybe_free(ddpd_t *d)
{
    ddpd_remote_t *rm = d->remote;
    if (rm && rm->closing && !rm->guests) {
        free(rm);
        d->remote = NULL;
    }
}

/* ---- guests ---- */

static void guest_maybe_free(guest_t *g)
{
    if (!g->freeing || g->handles > 0) return;
    ddpd_t *d = g->d;
    for (guest_t **pp = &d->remote->guests; *pp; pp = &(*pp)->next)
        if (*pp == g) {
            *pp = g->next;
            break;
        }
    json_decref(g->start);
    free(g->procs);
    free(g);
    remote_maybe_free(d);
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
    ddpd_link_send(g->link, json_pack("{ss sI si si si}", "t", "exit", "job", (json_int_t)g->job,
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
    ddpd_link_send(g->link, json_pack("{ss sI si si si}", "t", "exit", "job", (json_int_t)g->job,
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

static void guests_signal(ddpd_t *d, ddpd_link_t *l, int64_t job, int sig)
{
    for (guest_t *g = d->remote->guests; g; g = g->next)
        if (g->link == l && (job < 0 || g->job == job)) {
            g->signalled = 1;
            for (int i = 0; i < g->n; i++) ddpd_proc_signal(&g->procs[i], sig);
        }
}

static void guests_lost_link(ddpd_t *d, ddpd_link_t *l)
{
    for (guest_t *g = d->remote->guests; g; g = g->next)
        if (g->link == l) {
            if (g->live > 0)
                DDP_WARN("coordinator %s of job %lld is gone: ending its %d ranks here", g->coord,
                         (long long)g->job, g->live);
            for (int i = 0; i < g->n; i++) ddpd_proc_signal(&g->procs[i], SIGKILL);
            g->link = NULL;
        }
}

static void fail_start(ddpd_link_t *l, int64_t job, const char *why)
{
    DDP_WARN("cannot start ranks of job %lld for %s: %s", (long long)job, ddpd_link_name(l), why);
    ddpd_link_send(l, json_pack("{ss sI ss}", "t", "failed", "job", (json_int_t)job, "why", why));
}

static void on_start(ddpd_t *d, ddpd_link_t *l, json_t *m)
{
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
    snprintf(g->coord, sizeof g->coord, "%s", ddpd_link_name(l));
    snprintf(g->run_dir, sizeof g->run_dir, "%.3000s/%.60s-job-%lld", d->cfg.run_dir,
             ddpd_link_name(l), (long long)job);
    g->next = d->remote->guests;
    d->remote->guests = g;
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
             ddpd_link_name(l), g->run_dir);
    ddpd_link_send(l, json_pack("{ss sI si}", "t", "started", "job", (json_int_t)job, "n", (int)n));
    ddpd_peers_announce(d);
}

/* ---- messages ---- */

static void on_message(ddpd_t *d, ddpd_link_t *l, json_t *m)
{
    const ddpd_remote_reports_t *rep = &d->remote->reports;
    const char *t = json_string_value(json_object_get(m, "t"));
    if (!t) return;
    int64_t job = json_integer_value(json_object_get(m, "job"));
    int peer = ddpd_link_peer(l); /* >= 0: a peer this node coordinates jobs on */
    if (!strcmp(t, "start") && peer < 0) {
        on_start(d, l, m);
    } else if (!strcmp(t, "kill") && peer < 0) {
        int pid = (int)json_integer_value(json_object_get(m, "pid"));
        const char *hid = json_string_value(json_object_get(m, "host_id"));
        char mine[160];
        ddp_host_id(mine, sizeof mine);
        for (guest_t *g = d->remote->guests; hid && !strcmp(hid, mine) && g; g = g->next)
            if (g->link == l && g->job == job)
                for (int i = 0; i < g->n; i++)
                    if (g->procs[i].alive && g->procs[i].pid == pid) {
                        DDP_WARN("killing guest rank %d of job %lld (pid %d): its coordinator "
                                 "evicted it", g->procs[i].rank, (long long)job, pid);
                        ddpd_proc_signal(&g->procs[i], SIGKILL);
                    }
    } else if (!strcmp(t, "signal") && peer < 0) {
        guests_signal(d, l, job, (int)json_integer_value(json_object_get(m, "sig")));
    } else if (!strcmp(t, "started") && peer >= 0) {
        rep->started(d, job, (int)json_integer_value(json_object_get(m, "n")));
    } else if (!strcmp(t, "failed") && peer >= 0) {
        char why[300];
        snprintf(why, sizeof why, "node %s: %s", ddpd_peers_name(d, peer),
                 json_string_value(json_object_get(m, "why")));
        rep->failed(d, job, why);
    } else if (!strcmp(t, "exit") && peer >= 0) {
        rep->exited(d, job, (int)json_integer_value(json_object_get(m, "rank")),
                    (int)json_integer_value(json_object_get(m, "code")),
                    (int)json_integer_value(json_object_get(m, "sig")));
    }
}

/* A link went down: a peer's (its ranks of our jobs are lost) or a coordinator's (the ranks it
 * started here end). */
static void on_down(ddpd_t *d, ddpd_link_t *l)
{
    int peer = ddpd_link_peer(l);
    if (peer >= 0) d->remote->reports.node_down(d, peer);
    guests_lost_link(d, l);
}

int ddpd_remote_start(ddpd_t *d, const ddpd_remote_reports_t *reports, ddp_errinfo_t *ei)
{
    ddpd_remote_t *rm = ddp_calloc(1, sizeof *rm);
    if (!rm) return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    rm->reports = *reports;
    d->remote = rm;
    ddpd_link_handler_t h = {.message = on_message, .down = on_down,
                             .nodes_changed = reports->nodes_changed};
    return ddpd_links_start(d, &h, ei);
}

void ddpd_remote_close(ddpd_t *d)
{
    ddpd_links_close(d);
    if (!d->remote) return;
    d->remote->closing = 1;
    remote_maybe_free(d);
}



void ddpd_remote_stop_guests(ddpd_t *d)
{
    if (!d->remote) return;
    for (guest_t *g = d->remote->guests; g; g = g->next)
        for (int i = 0; i < g->n; i++) ddpd_proc_signal(&g->procs[i], SIGTERM);
}

int ddpd_remote_launch(ddpd_t *d, int i, const ddpd_remote_start_t *s)
{
    ddpd_link_t *l = ddpd_links_to(d, i);
    if (!l) return DDP_EPEER;
    json_t *rs = json_array();
    for (int k = 0; k < s->n; k++) json_array_append_new(rs, json_integer(s->ranks[k]));
    json_t *m = json_pack("{ss sI ss so si ss ss ss ss si si si sb si}", "t", "start", "job",
                          (json_int_t)s->job, "name", s->name, "ranks", rs, "world", s->world,
                          "rdzv", s->rdzv, "token", s->token, "spec", s->spec_json, "cwd",
                          s->cwd, "uid", (int)s->uid, "gid", (int)s->gid, "threads", s->threads,
                          "elastic", s->elastic, "max_restarts", s->max_restarts);
    if (!m) return DDP_ENOMEM;
    ddpd_links_sent_ranks(d, i, s->n);
    ddpd_link_send(l, m);
    return 0;
}

void ddpd_remote_kill(ddpd_t *d, int i, int64_t job_id, int pid, const char *host_id)
{
    ddpd_link_t *l = ddpd_links_to(d, i);
    if (l) ddpd_link_send(l, json_pack("{ss sI si ss}", "t", "kill", "job",
                                         (json_int_t)job_id, "pid", pid, "host_id",
                                         host_id ? host_id : ""));
}

void ddpd_remote_signal(ddpd_t *d, int i, int64_t job_id, int sig)
{
    ddpd_link_t *l = ddpd_links_to(d, i);
    if (l) ddpd_link_send(l, json_pack("{ss sI si}", "t", "signal", "job", (json_int_t)job_id,
                                       "sig", sig));
}

int ddpd_remote_guest_ranks(ddpd_t *d)
{
    int n = 0;
    if (d->remote)
        for (guest_t *g = d->remote->guests; g; g = g->next) n += g->live;
    return n;
}
