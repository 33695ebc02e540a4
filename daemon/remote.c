/* Remote ranks of multi-node jobs (see remote.h): the guests this node runs for coordinators,
 * and the messages that start, signal, kill and report them over the daemons' links (parsed by
 * peer_msg.c before they reach this file).
 * Invariant: a guest is freed when its ranks' handles are all closed; the module is freed at
 * close once no guest is left (or when the last one goes). Loop thread only.
 */
#include "daemon/remote.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


#include "common/alloc.h"
#include "common/clock.h"
#include "common/host.h"
#include "common/log.h"
#include "daemon/link.h"
#include "daemon/exec_rank.h"
#include "daemon/slots.h"
#include "daemon/spawn.h"
#include "daemon/userfs.h"
#include "proto/spec.h"

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
    json_t *start;    /* the start request, kept for guest.json: it owns st's strings */
    ddpd_pmsg_start_t st; /* the start request, parsed (its ranks are not kept) */
    uint32_t *groups;     /* the ranks' supplementary groups (owned) */
    int n_groups;
    int max_restarts; /* elastic: a rank that dies is spawned again this many times */
    int signalled;    /* the coordinator sent a signal: no restarts any more */
    int64_t orphan_ns; /* when its coordinator's link went (0: linked, or never was) */
    int detached;     /* left running for the next ddpd: its record stays */
    json_t *pending;  /* reports for the coordinator kept while its link is down */
};

struct ddpd_remote {
    ddpd_remote_reports_t reports;
    guest_t *guests;
    uv_timer_t orphans; /* ends guests whose coordinator stays away */
    int timer_open;
    int closing;
};

/* How long guest ranks outlive their coordinator's link: its daemon restarting comes back well
 * within this (and takes them back); one that does not is gone, and so is the job here. */
#define DDPD_GUEST_ORPHAN_S 60

static void remote_maybe_free(ddpd_t *d)
{
    ddpd_remote_t *rm = d->remote;
    if (rm && rm->closing && !rm->guests && !rm->timer_open) {
        free(rm);
        d->remote = NULL;
    }
}

/* Sends a report to the guest's coordinator, or keeps it until its link is back. */
static void guest_report(guest_t *g, json_t *m)
{
    if (g->link) {
        ddpd_link_send(g->link, m);
        return;
    }
    if (!g->pending) g->pending = json_array();
    json_array_append_new(g->pending, m);
}

/* The guest's record, <state_dir>/guests/<coordinator>-job-<N>.json: what a restarted daemon
 * needs to take its ranks back. The daemon's own directory, never the user's run directory
 * (whose owner could swap the file for one of their making, or a link). */
static void guest_record_path(const guest_t *g, char *path, size_t n)
{
    snprintf(path, n, "%.3800s/guests/%.63s-job-%lld.json", g->d->cfg.state_dir, g->coord,
             (long long)g->job);
}

static void guest_record(guest_t *g)
{
    json_t *procs = json_array();
    for (int i = 0; i < g->n; i++)
        json_array_append_new(procs, json_pack("{si si si si}", "rank", g->procs[i].rank,
                                               "local_rank", g->procs[i].local_rank, "pid",
                                               g->procs[i].pid, "restarts",
                                               g->procs[i].restarts));
    json_t *o = json_pack("{ss sI sO so}", "coord", g->coord, "job", (json_int_t)g->job, "start",
                          g->start, "procs", procs);
    char path[PATH_MAX + 32], tmp[PATH_MAX + 48];
    guest_record_path(g, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (!o || json_dump_file(o, tmp, JSON_COMPACT) != 0 || rename(tmp, path) != 0)
        DDP_WARN("guest ranks of job %lld: cannot record them in %s: a restarted daemon could "
                 "not take them back", (long long)g->job, path);
    json_decref(o);
}

/* ---- guests ---- */

static void guest_maybe_free(guest_t *g)
{
    if (!g->freeing || g->handles > 0) return;
    ddpd_t *d = g->d;
    if (!g->detached) { /* nothing of it runs any more: no daemon is to take it back */
        char path[PATH_MAX + 32];
        guest_record_path(g, path, sizeof path);
        unlink(path);
    }
    for (guest_t **pp = &d->remote->guests; *pp; pp = &(*pp)->next)
        if (*pp == g) {
            *pp = g->next;
            break;
        }
    json_decref(g->start);
    json_decref(g->pending);
    free(g->groups);
    free(g->procs);
    free(g);
    remote_maybe_free(d);
}

/* The launch description of a guest's ranks (strings borrowed from g->start). */
static void guest_launch(const guest_t *g, ddpd_launch_t *la)
{
    const ddpd_pmsg_start_t *s = &g->st;
    *la = (ddpd_launch_t){.worker_bin = g->d->cfg.worker_bin,
                          .spec_path = g->spec_path,
                          .run_dir = g->run_dir,
                          .cwd = s->cwd,
                          .rdzv = s->rdzv,
                          .token = s->token,
                          .job_id = g->job,
                          .world = s->world,
                          .local_world = g->n,
                          .threads = s->threads,
                          .elastic = s->elastic,
                          .uid = s->uid,
                          .gid = s->gid,
                          .groups = g->groups,
                          .n_groups = g->n_groups};
    ddpd_quota_t q; /* this node's caps on the files its ranks write */
    ddpd_config_quota(&g->d->cfg, s->uid, &q);
    la->log_bytes = q.log_bytes;
    la->metrics_bytes = q.metrics_bytes;
    la->tensorboard_bytes = q.tensorboard_bytes;
}

/* Keeps the parsed start request m in g (a reference to its root; not its ranks). Its groups
 * are g's: the request's, or the primary group alone from an older coordinator that sends
 * none. Returns 0 or DDP_ENOMEM. */
static int guest_keep_start(guest_t *g, const ddpd_pmsg_t *m)
{
    const ddpd_pmsg_start_t *s = &m->u.start;
    g->n_groups = s->has_groups ? s->n_groups : 1;
    g->groups = ddp_calloc((size_t)(g->n_groups ? g->n_groups : 1), sizeof *g->groups);
    if (!g->groups) return DDP_ENOMEM;
    if (s->has_groups && s->n_groups)
        memcpy(g->groups, s->groups, (size_t)s->n_groups * sizeof *g->groups);
    if (!s->has_groups) g->groups[0] = s->gid;
    g->start = json_incref(m->root);
    g->st = m->u.start;
    g->st.ranks = NULL;
    g->st.n_ranks = 0;
    g->st.groups = NULL;
    /* elastic: a rank that dies is spawned again, max_restarts times */
    g->max_restarts = g->st.elastic ? g->st.max_restarts : 0;
    return 0;
}

/* Reports that rank `rank` of g ended (code, sig) to its coordinator. */
static void report_exit(guest_t *g, int rank, int code, int sig)
{
    guest_report(g, json_pack("{ss sI si si si}", "t", "exit", "job", (json_int_t)g->job, "rank",
                              rank, "code", code, "sig", sig));
}

static void guest_exit(ddpd_proc_t *p)
{
    guest_t *g = p->data;
    g->live--;
    ddpd_slots_give(g->d, 1, "a guest rank");
    int code = (int)p->exit_status;
    DDP_INFO("guest rank %d of %s job %lld ended (code %d, signal %d)", p->rank, g->coord,
             (long long)g->job, code, p->term_signal);
    if ((code != 0 || p->term_signal || p->status_unknown) && code != 2 &&
        code != DDPD_EXEC_FAILED && !g->signalled &&
        !g->d->stopping && p->restarts < g->max_restarts) {
        p->respawn = 1; /* elastic: spawned again once closed (guest_closed); not reported */
        return;
    }
    report_exit(g, p->rank, p->status_unknown ? 1 : code, p->term_signal);
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
        ddpd_slots_take(g->d, 1, "a guest rank spawned again");
        g->d->n_worker_restarts++;
        DDP_WARN("guest rank %d of job %lld spawned again as pid %d (restart %d of %d)",
                 p->rank, (long long)g->job, p->pid, p->restarts, g->max_restarts);
        guest_record(g);
        return;
    }
    DDP_ERROR("guest rank %d of job %lld: %s", p->rank, (long long)g->job, why);
    report_exit(g, p->rank, 1, 0);
    if (g->live == 0) g->freeing = 1;
}

static void guest_closed(ddpd_proc_t *p)
{
    guest_t *g = p->data;
    if (p->respawn) guest_respawn(g, p);
    g->handles--;
    guest_maybe_free(g);
}

/* The coordinator's signal to its job's ranks here: SIGUSR2 asks each for a flight recorder dump
 * (ddpctl dump; only ranks that catch it, and the job goes on), any other ends them. */
static void guests_signal(ddpd_t *d, ddpd_link_t *l, int64_t job, int sig)
{
    for (guest_t *g = d->remote->guests; g; g = g->next)
        if (g->link == l && (job < 0 || g->job == job)) {
            if (sig == SIGUSR2) {
                int n = 0;
                for (int i = 0; i < g->n; i++) n += ddpd_proc_request(&g->procs[i], sig);
                DDP_INFO("job %lld: flight recorder dump requested of %d guest rank(s) here",
                         (long long)g->job, n);
                continue;
            }
            g->signalled = 1;
            for (int i = 0; i < g->n; i++) ddpd_proc_signal(&g->procs[i], sig);
        }
}

/* The coordinator's link went down (its daemon restarting, or gone): its ranks here train on
 * for DDPD_GUEST_ORPHAN_S, and are taken back when its link returns (guests_link_up). */
static void guests_lost_link(ddpd_t *d, ddpd_link_t *l)
{
    for (guest_t *g = d->remote->guests; g; g = g->next)
        if (g->link == l) {
            if (g->live > 0)
                DDP_WARN("coordinator %s of job %lld is gone: its %d rank(s) here wait up to %d s "
                         "for it to come back", g->coord, (long long)g->job, g->live,
                         DDPD_GUEST_ORPHAN_S);
            g->link = NULL;
            g->orphan_ns = ddp_now_ns();
        }
}

/* A coordinator's link is up: the guests it had (before its link dropped, or before this
 * daemon restarted) are its again; it hears which of their ranks still run, then the exits it
 * missed. */
static void guests_link_up(ddpd_t *d, ddpd_link_t *l)
{
    for (guest_t *g = d->remote->guests; g; g = g->next) {
        if (g->link || g->freeing || strcmp(g->coord, ddpd_link_name(l)) != 0) continue;
        g->link = l;
        g->orphan_ns = 0;
        json_t *ranks = json_array();
        for (int i = 0; i < g->n; i++)
            if (g->procs[i].alive) json_array_append_new(ranks, json_integer(g->procs[i].rank));
        DDP_INFO("coordinator %s is back: its %zu rank(s) of job %lld here are its again",
                 g->coord, json_array_size(ranks), (long long)g->job);
        ddpd_link_send(l, json_pack("{ss sI so}", "t", "adopted", "job", (json_int_t)g->job,
                                    "ranks", ranks));
        size_t i;
        json_t *m;
        json_array_foreach(g->pending, i, m) ddpd_link_send(l, json_incref(m));
        json_decref(g->pending);
        g->pending = NULL;
    }
}

/* Ends the ranks of guests whose coordinator stayed away too long. */
static void orphans_cb(uv_timer_t *t)
{
    ddpd_t *d = t->data;
    int64_t now = ddp_now_ns();
    for (guest_t *g = d->remote->guests; g; g = g->next) {
        if (!g->orphan_ns || now - g->orphan_ns < DDPD_GUEST_ORPHAN_S * 1000000000LL) continue;
        if (g->live > 0)
            DDP_WARN("coordinator %s of job %lld did not come back within %d s: ending its %d "
                     "rank(s) here", g->coord, (long long)g->job, DDPD_GUEST_ORPHAN_S, g->live);
        g->orphan_ns = 0;
        g->signalled = 1;
        for (int i = 0; i < g->n; i++) ddpd_proc_signal(&g->procs[i], SIGKILL);
    }
}

static void fail_start(ddpd_link_t *l, int64_t job, const char *why)
{
    DDP_WARN("cannot start ranks of job %lld for %s: %s", (long long)job, ddpd_link_name(l), why);
    ddpd_link_send(l, json_pack("{ss sI ss}", "t", "failed", "job", (json_int_t)job, "why", why));
}

/* A start request (peer_msg.c checked its fields: n in [1, 4096], at most world). */
static void on_start(ddpd_t *d, ddpd_link_t *l, const ddpd_pmsg_t *m)
{
    const ddpd_pmsg_start_t *s = &m->u.start;
    int64_t job = s->job;
    size_t n = (size_t)s->n_ranks;
    if ((int)n > ddpd_slots_free(d) || d->stopping) {
        char why[128];
        snprintf(why, sizeof why, "node %s has %d free slots, %zu asked", d->cfg.node_name,
                 ddpd_slots_free(d), n);
        fail_start(l, job, why);
        return;
    }
    if (s->uid == 0 && geteuid() == 0 && !d->cfg.peer_root_jobs) {
        fail_start(l, job, "a root daemon does not start ranks as root (uid 0) for a peer "
                           "(submit the job as a user, or set peer_root_jobs: allow on the node)");
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
    snprintf(g->run_dir, sizeof g->run_dir, "%.3000s/%.63s-job-%lld", d->cfg.run_dir,
             ddpd_link_name(l), (long long)job);
    g->next = d->remote->guests;
    d->remote->guests = g;
    char why[512] = "";
    int ok = guest_keep_start(g, m) == 0;
    if (!ok) snprintf(why, sizeof why, "out of memory");
    ok = ok && ddpd_rundir_make(g->run_dir, s->uid, s->gid, why, sizeof why) == 0;
    ok = ok && ddpd_write_spec(g->run_dir, s->spec, s->uid, s->gid, g->spec_path,
                               sizeof g->spec_path, why, sizeof why) == 0;
    ddpd_launch_t la;
    guest_launch(g, &la);
    for (size_t i = 0; i < n && ok; i++) {
        ddpd_proc_t *p = &g->procs[i];
        p->data = g;
        p->on_exit = guest_exit;
        p->on_close = guest_closed;
        int rc = ddpd_spawn_rank(d->loop, p, &la, s->ranks[i], (int)i, why, sizeof why);
        if (p->open) g->handles++;
        if (rc != 0) {
            ok = 0;
            break;
        }
        g->live++;
        ddpd_slots_take(d, 1, "a guest rank");
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
    guest_record(g);
    ddpd_link_send(l, json_pack("{ss sI si}", "t", "started", "job", (json_int_t)job, "n", (int)n));
    ddpd_peers_announce(d);
}

/* ---- messages ---- */

/* A parsed message on an authenticated link: requests from a coordinator on the links it
 * dialled to this node (peer < 0), reports from the peers this node coordinates on (peer >= 0);
 * one that arrives the wrong way is ignored. */
static void on_message(ddpd_t *d, ddpd_link_t *l, const ddpd_pmsg_t *m)
{
    const ddpd_remote_reports_t *rep = &d->remote->reports;
    int peer = ddpd_link_peer(l); /* >= 0: a peer this node coordinates jobs on */
    if (m->kind == DDPD_PMSG_START && peer < 0) {
        on_start(d, l, m);
    } else if (m->kind == DDPD_PMSG_KILL && peer < 0) {
        int64_t job = m->u.kill.job;
        int pid = m->u.kill.pid;
        char mine[160];
        ddp_host_id(mine, sizeof mine);
        for (guest_t *g = d->remote->guests; !strcmp(m->u.kill.host_id, mine) && g; g = g->next)
            if (g->link == l && g->job == job)
                for (int i = 0; i < g->n; i++)
                    if (g->procs[i].alive && g->procs[i].pid == pid) {
                        DDP_WARN("killing guest rank %d of job %lld (pid %d): its coordinator "
                                 "evicted it", g->procs[i].rank, (long long)job, pid);
                        ddpd_proc_signal(&g->procs[i], SIGKILL);
                    }
    } else if (m->kind == DDPD_PMSG_SIGNAL && peer < 0) {
        guests_signal(d, l, m->u.signal.job, m->u.signal.sig);
    } else if (m->kind == DDPD_PMSG_STARTED && peer >= 0) {
        rep->started(d, m->u.started.job, m->u.started.n);
    } else if (m->kind == DDPD_PMSG_FAILED && peer >= 0) {
        char why[300];
        snprintf(why, sizeof why, "node %s: %s", ddpd_peers_name(d, peer), m->u.failed.why);
        rep->failed(d, m->u.failed.job, why);
    } else if (m->kind == DDPD_PMSG_ADOPTED && peer >= 0) {
        rep->adopted(d, m->u.adopted.job, peer, m->u.adopted.ranks, m->u.adopted.n_ranks);
    } else if (m->kind == DDPD_PMSG_EXIT && peer >= 0) {
        rep->exited(d, m->u.exit.job, m->u.exit.rank, m->u.exit.code, m->u.exit.sig);
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

/* Takes back the ranks of one guest record (`where` names it in the log): alive ones are
 * watched again, dead ones are reported once their coordinator is back. They wait for it as
 * orphans. Returns 1 when the record was usable. */
static int adopt_guest(ddpd_t *d, json_t *rec, const char *where)
{
    json_t *procs = json_object_get(rec, "procs");
    const char *coord = json_string_value(json_object_get(rec, "coord"));
    json_int_t job = json_integer_value(json_object_get(rec, "job"));
    size_t n = json_array_size(procs);
    /* the start request it keeps is checked as when it arrived */
    ddpd_pmsg_t start;
    char why[256];
    if (ddpd_pmsg_from_json(json_incref(json_object_get(rec, "start")), DDPD_PMSG_ANY, &start,
                            why, sizeof why) == 0 &&
        (start.kind != DDPD_PMSG_START || start.u.start.job != job))
        snprintf(why, sizeof why, "not the start request of job %lld", (long long)job);
    if (!coord || !ddp_spec_name_ok(coord) || job < 0)
        snprintf(why, sizeof why, "no valid coordinator name and job id");
    guest_t *g = n && coord && ddp_spec_name_ok(coord) && start.kind == DDPD_PMSG_START &&
                         start.u.start.job == job
                     ? ddp_calloc(1, sizeof *g)
                     : NULL;
    if (g && (!(g->procs = ddp_calloc(n, sizeof *g->procs)) || guest_keep_start(g, &start))) {
        free(g->procs);
        free(g->groups);
        json_decref(g->start);
        free(g);
        g = NULL;
    }
    ddpd_pmsg_close(&start);
    if (!g) {
        if (n) DDP_WARN("%s: cannot take its ranks back: %s", where, why);
        return 0;
    }
    g->d = d;
    g->job = job;
    g->n = (int)n;
    g->orphan_ns = ddp_now_ns();
    snprintf(g->coord, sizeof g->coord, "%s", coord);
    snprintf(g->run_dir, sizeof g->run_dir, "%.3800s/%s-job-%lld", d->cfg.run_dir, coord,
             (long long)job);
    snprintf(g->spec_path, sizeof g->spec_path, "%s/job.json", g->run_dir);
    g->next = d->remote->guests;
    d->remote->guests = g;
    int alive = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *p = json_array_get(procs, i);
        ddpd_proc_t *pr = &g->procs[i];
        pr->data = g;
        pr->on_exit = guest_exit;
        pr->on_close = guest_closed;
        pr->restarts = (int)json_integer_value(json_object_get(p, "restarts"));
        int pid = (int)json_integer_value(json_object_get(p, "pid"));
        int rc = ddpd_adopt_rank(d->loop, pr, pid,
                                 (int)json_integer_value(json_object_get(p, "rank")),
                                 (int)json_integer_value(json_object_get(p, "local_rank")),
                                 g->st.token, g->run_dir, g->st.uid);
        if (pr->open) g->handles++;
        if (rc == 0) {
            alive++;
            g->live++;
            ddpd_slots_take(d, 1, "an adopted guest rank");
        }
    }
    DDP_INFO("took back %d of %zu guest rank(s) of %s's job %lld; they wait for %s's link",
             alive, n, coord, (long long)g->job, coord);
    if (g->live > 0) guest_record(g); /* where this daemon keeps it (an older one's moves) */
    /* the ones that ended meanwhile are reported, not spawned again: their coordinator has
     * counted them lost with this node and places them where it finds room */
    for (size_t i = 0; i < n; i++)
        if (!g->procs[i].open)
            report_exit(g, g->procs[i].rank,
                        g->procs[i].status_unknown ? 1 : (int)g->procs[i].exit_status, 0);
    if (g->live == 0) g->freeing = 1;
    guest_maybe_free(g);
    return 1;
}

/* An older ddpd's record, <run_dir>/<coord>-job-<N>/guest.json: in the user's directory, so
 * only a regular file of root's (the old daemon wrote it as root) that names the same
 * coordinator and job as the directory is believed; it is removed once read. */
static json_t *legacy_record(ddpd_t *d, const char *name)
{
    char dir[PATH_MAX], why[256];
    snprintf(dir, sizeof dir, "%.3800s/%.250s", d->cfg.run_dir, name);
    int dfd = ddpd_dir_open(dir, (uint32_t)-1, why, sizeof why);
    if (dfd < 0) return NULL;
    int fd = ddpd_userfile_open(dfd, "guest.json", 0, why, sizeof why);
    json_t *rec = NULL;
    if (fd >= 0) {
        FILE *f = fdopen(fd, "r");
        rec = f ? json_loadf(f, 0, NULL) : NULL;
        if (f) fclose(f);
        else close(fd);
        const char *coord = json_string_value(json_object_get(rec, "coord"));
        char want[PATH_MAX];
        snprintf(want, sizeof want, "%s-job-%lld", coord ? coord : "",
                 (long long)json_integer_value(json_object_get(rec, "job")));
        if (!coord || strcmp(want, name) != 0) {
            DDP_WARN("%s/guest.json: names another job than its directory: ignored", dir);
            json_decref(rec);
            rec = NULL;
        }
        unlinkat(dfd, "guest.json", 0);
    } else if (fd != -ENOENT) {
        DDP_WARN("%s: guest.json ignored: %s", dir, why);
    }
    close(dfd);
    return rec;
}

/* Takes back the guest ranks an earlier run of this daemon left running: the records in
 * <state_dir>/guests/, then an older ddpd's in the run directories. */
static void adopt_guests(ddpd_t *d)
{
    char gdir[PATH_MAX], path[PATH_MAX + 300];
    snprintf(gdir, sizeof gdir, "%.3800s/guests", d->cfg.state_dir);
    if (mkdir(gdir, 0700) != 0 && errno != EEXIST)
        DDP_WARN("cannot create %s: %s: guest ranks cannot be recorded", gdir, strerror(errno));
    DIR *dir = opendir(gdir);
    struct dirent *e;
    while (dir && (e = readdir(dir))) {
        size_t len = strlen(e->d_name);
        if (len < 6 || strcmp(e->d_name + len - 5, ".json") != 0) continue;
        snprintf(path, sizeof path, "%s/%s", gdir, e->d_name);
        json_t *rec = json_load_file(path, 0, NULL);
        if (!adopt_guest(d, rec, path)) unlink(path);
        json_decref(rec);
    }
    if (dir) closedir(dir);
    dir = opendir(d->cfg.run_dir);
    while (dir && (e = readdir(dir))) {
        if (!strstr(e->d_name, "-job-")) continue;
        json_t *rec = legacy_record(d, e->d_name);
        snprintf(path, sizeof path, "%s/%s/guest.json", d->cfg.run_dir, e->d_name);
        if (rec) adopt_guest(d, rec, path);
        json_decref(rec);
    }
    if (dir) closedir(dir);
}

int ddpd_remote_start(ddpd_t *d, const ddpd_remote_reports_t *reports, ddp_errinfo_t *ei)
{
    ddpd_remote_t *rm = ddp_calloc(1, sizeof *rm);
    if (!rm) return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    rm->reports = *reports;
    d->remote = rm;
    uv_timer_init(d->loop, &rm->orphans);
    rm->orphans.data = d;
    rm->timer_open = 1;
    uv_timer_start(&rm->orphans, orphans_cb, 1000, 1000);
    adopt_guests(d);
    ddpd_link_handler_t h = {.message = on_message, .up = guests_link_up, .down = on_down,
                             .nodes_changed = reports->nodes_changed};
    return ddpd_links_start(d, &h, ei);
}

static void orphans_closed(uv_handle_t *h)
{
    ddpd_t *d = h->data;
    d->remote->timer_open = 0;
    remote_maybe_free(d);
}

void ddpd_remote_close(ddpd_t *d)
{
    ddpd_links_close(d);
    if (!d->remote || d->remote->closing) return;
    d->remote->closing = 1;
    uv_close((uv_handle_t *)&d->remote->orphans, orphans_closed);
}

void ddpd_remote_detach_guests(ddpd_t *d)
{
    if (!d->remote) return;
    for (guest_t *g = d->remote->guests; g; g = g->next) {
        if (g->freeing) continue;
        if (g->live > 0)
            DDP_INFO("guest rank(s) of %s's job %lld left running; the next ddpd takes them back",
                     g->coord, (long long)g->job);
        guest_record(g);
        g->live = 0;
        g->freeing = 1;
        g->detached = 1;
        for (int i = 0; i < g->n; i++) ddpd_proc_release(&g->procs[i]);
    }
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
    json_t *groups = json_array(); /* as C ints, like the uid: the peer reads them back so */
    for (int k = 0; k < s->n_groups; k++)
        json_array_append_new(groups, json_integer((int)s->groups[k]));
    json_object_set_new(m, "groups", groups);
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
