/* Job lifecycle on the coordinating node. Invariants:
 *  - j->handles counts open uv handles (two timers from creation, plus one per spawned local
 *    rank until its close callback); a job is freed only when it is terminal and handles == 0,
 *    from a close callback (a safe point: nothing up the stack holds the pointer).
 *  - slots are taken when local ranks are spawned and given back when each one ends.
 *  - every state change goes through set_state (store + watchers + log).
 */
#include "job.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "daemon/api.h"
#include "daemon/coord.h"
#include "daemon/peer.h"
#include "daemon/sched.h"
#include "proto/spec.h"

static const char *const state_names[] = {"queued",    "starting", "running",
                                          "succeeded", "failed",   "cancelled"};

const char *ddpd_state_name(ddpd_state_t s) { return state_names[s]; }
int ddpd_state_terminal(ddpd_state_t s) { return s >= DDPD_SUCCEEDED; }

ddpd_job_t *ddpd_job_find(ddpd_t *d, int64_t id)
{
    for (ddpd_job_t *j = d->jobs; j; j = j->next)
        if (j->id == id) return j;
    return NULL;
}

static void job_free(ddpd_job_t *j)
{
    ddpd_t *d = j->d;
    for (ddpd_job_t **pp = &d->jobs; *pp; pp = &(*pp)->next)
        if (*pp == j) {
            *pp = j->next;
            break;
        }
    json_decref(j->last_step);
    json_decref(j->done);
    free(j->spec_json);
    free(j->rank_node);
    free(j->procs);
    free(j);
}

void ddpd_job_free(ddpd_job_t *j) { job_free(j); }

static void handle_closed(ddpd_job_t *j)
{
    if (--j->handles == 0 && j->freeing) job_free(j);
}

static void timer_closed(uv_handle_t *h) { handle_closed(h->data); }

static void set_state(ddpd_job_t *j, ddpd_state_t to, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_state(ddpd_job_t *j, ddpd_state_t to, const char *fmt, ...)
{
    ddpd_state_t from = j->state;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->reason, sizeof j->reason, fmt, ap);
    va_end(ap);
    j->state = to;
    ddpd_store_job_transition(j->d->store, j->id, ddpd_state_name(from), ddpd_state_name(to),
                              j->reason, ddp_wall_ms());
    DDP_INFO("job %lld (%s): %s -> %s: %s", (long long)j->id, j->name, ddpd_state_name(from),
             ddpd_state_name(to), j->reason);
    ddpd_api_job_event(j->d, j);
}

/* ---- metrics.jsonl tail ---- */

static void tail_line(ddpd_job_t *j, const char *line, size_t len)
{
    json_t *o = json_loadb(line, len, 0, NULL);
    if (!json_is_object(o)) {
        json_decref(o);
        return;
    }
    const char *ev = json_string_value(json_object_get(o, "event"));
    if (ev && !strcmp(ev, "done")) {
        json_decref(j->done);
        j->done = o;
    } else if (!ev && j->last_step && json_object_get(o, "val_loss") &&
               !json_object_get(o, "loss")) {
        /* a validation line adds to its step's record (the loss and speed stay shown) */
        json_object_set(j->last_step, "val_loss", json_object_get(o, "val_loss"));
        json_decref(o);
    } else if (!ev && json_is_integer(json_object_get(o, "step"))) {
        if (!j->last_step) j->first_step_ms = ddp_wall_ms();
        json_decref(j->last_step);
        j->last_step = o;
    } else { /* other events (a new generation) are not a step's record */
        json_decref(o);
    }
}

/* Reads what rank 0 appended since the last call (bounded per call). Returns 1 if anything
 * new was parsed. */
static int tail_read(ddpd_job_t *j)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", j->run_dir);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char buf[65536];
    int got = 0;
    ssize_t n = pread(fd, buf, sizeof buf, j->metrics_off);
    close(fd);
    if (n <= 0) return 0;
    j->metrics_off += n;
    for (ssize_t i = 0; i < n; i++) {
        if (buf[i] == '\n') {
            tail_line(j, j->partial, j->partial_len);
            j->partial_len = 0;
            got = 1;
        } else if (j->partial_len < sizeof j->partial) {
            j->partial[j->partial_len++] = buf[i];
        }
    }
    return got;
}

static void close_handles(ddpd_job_t *j)
{
    uv_close((uv_handle_t *)&j->tail_timer, timer_closed);
    uv_close((uv_handle_t *)&j->kill_timer, timer_closed);
    uv_close((uv_handle_t *)&j->run_watch, timer_closed);
}

static void fs_cb(uv_fs_event_t *h, const char *name, int events, int status)
{
    ddpd_job_t *j = h->data;
    (void)events;
    if (status == 0 && name && !strcmp(name, "metrics.jsonl") && tail_read(j))
        ddpd_api_job_event(j->d, j);
}

static void tail_cb(uv_timer_t *t)
{
    ddpd_job_t *j = t->data;
    if (tail_read(j)) ddpd_api_job_event(j->d, j);
}

json_t *ddpd_job_progress(const ddpd_job_t *j)
{
    json_t *o = json_pack("{sI ss ss ss si}", "id", (json_int_t)j->id, "name", j->name, "state",
                          ddpd_state_name(j->state), "reason", j->reason, "world", j->world);
    json_object_set_new(o, "steps", json_integer(j->steps));
    if (j->last_step) {
        json_t *m = j->last_step;
        json_object_set(o, "metrics", m);
        json_int_t step = json_integer_value(json_object_get(m, "step"));
        json_t *tot = json_object_get(m, "steps");
        long steps = json_is_integer(tot) ? (long)json_integer_value(tot) : j->steps;
        json_object_set_new(o, "step", json_integer(step));
        json_object_set_new(o, "steps", json_integer(steps));
        json_t *v;
        if ((v = json_object_get(m, "loss"))) json_object_set(o, "loss", v);
        if ((v = json_object_get(m, "tokens_per_s"))) json_object_set(o, "tokens_per_s", v);
        if ((v = json_object_get(m, "straggler"))) json_object_set(o, "straggler", v);
        double el = (double)(ddp_wall_ms() - j->first_step_ms) / 1000.0;
        json_t *sms = json_object_get(m, "step_ms");
        double per_step = json_is_number(sms) ? json_number_value(sms) / 1000.0 : 0;
        if (per_step <= 0 && step > 0) per_step = el / (double)step;
        if (steps > step && per_step > 0)
            json_object_set_new(o, "eta_s", json_real((double)(steps - step) * per_step));
    }
    if (j->done) json_object_set(o, "done", j->done);
    return o;
}

/* ---- ending ---- */

static void finish(ddpd_job_t *j)
{
    ddpd_t *d = j->d;
    if (ddpd_state_terminal(j->state)) return;
    tail_read(j);
    uv_timer_stop(&j->tail_timer);
    uv_timer_stop(&j->kill_timer);
    int code = -1;
    if (j->n_local && j->procs[0].rank == 0 && !j->procs[0].alive)
        code = j->procs[0].term_signal ? 128 + j->procs[0].term_signal
                                       : (int)j->procs[0].exit_status;
    long step = j->last_step ? (long)json_integer_value(json_object_get(j->last_step, "step")) : 0;
    json_t *fl = j->done ? json_object_get(j->done, "final_loss") : NULL;
    if (!fl && j->last_step) fl = json_object_get(j->last_step, "loss");
    json_t *tot = j->last_step ? json_object_get(j->last_step, "steps") : NULL;
    if (json_is_integer(tot)) j->steps = (long)json_integer_value(tot);
    ddpd_store_job_result(d->store, j->id, code, step, j->steps,
                          json_is_number(fl) ? json_number_value(fl) : NAN);
    if (j->coord && !j->done && !j->fail_why[0] && !j->cancel_requested) {
        snprintf(j->fail_why, sizeof j->fail_why,
                 "every rank ended before the job completed (generation %lu)", j->generation);
        j->fail_rank = j->world;
    }
    ddpd_coord_close(j->coord);
    j->coord = NULL;
    if (j->cancel_requested) {
        d->n_finished[2]++;
        set_state(j, DDPD_CANCELLED, "cancelled by uid %u", j->cancel_uid);
    } else if (j->fail_rank >= 0 || j->fail_why[0]) {
        d->n_finished[1]++;
        set_state(j, DDPD_FAILED, "%s", j->fail_why);
    } else {
        d->n_finished[0]++;
        set_state(j, DDPD_SUCCEEDED, "all %d ranks exited 0", j->world);
    }
    j->freeing = 1;
    close_handles(j);
    ddpd_sched_kick(d);
}

static void maybe_finish(ddpd_job_t *j)
{
    if (j->live_local == 0 && j->live_remote == 0 && j->pending_restarts == 0 &&
        j->state != DDPD_QUEUED)
        finish(j);
}

static void kill_cb(uv_timer_t *t)
{
    ddpd_job_t *j = t->data;
    DDP_WARN("job %lld: ranks still alive %.0fs after SIGTERM: SIGKILL", (long long)j->id,
             j->d->cfg.grace_s);
    for (int i = 0; i < j->n_local; i++) ddpd_proc_signal(&j->procs[i], SIGKILL);
    for (int i = 0; i < ddpd_peers_count(j->d); i++)
        ddpd_peers_signal(j->d, i, j->id, SIGKILL);
}

/* SIGTERM to every rank, SIGKILL after the grace period. */
static void terminate(ddpd_job_t *j)
{
    if (j->signalled) return;
    j->signalled = 1;
    for (int i = 0; i < j->n_local; i++) ddpd_proc_signal(&j->procs[i], SIGTERM);
    int peers_used = 0;
    for (int r = 0; r < j->world && j->rank_node; r++)
        if (j->rank_node[r] > 0) peers_used = 1;
    if (peers_used)
        for (int i = 0; i < ddpd_peers_count(j->d); i++)
            ddpd_peers_signal(j->d, i, j->id, SIGTERM);
    uv_timer_start(&j->kill_timer, kill_cb, (uint64_t)(j->d->cfg.grace_s * 1000), 0);
}

static void rank_failed(ddpd_job_t *j, int rank, int code, int sig)
{
    if (j->cancel_requested || j->fail_rank >= 0) return;
    j->fail_rank = rank;
    if (sig)
        snprintf(j->fail_why, sizeof j->fail_why, "rank %d killed by signal %d (%s)", rank, sig,
                 strsignal(sig));
    else
        snprintf(j->fail_why, sizeof j->fail_why, "rank %d exited with code %d (see rank-%d.log)",
                 rank, code, rank);
    DDP_WARN("job %lld: %s; stopping the other ranks", (long long)j->id, j->fail_why);
    terminate(j);
}

/* The launch description of this job's local ranks. */
static void launch_of(ddpd_job_t *j, ddpd_launch_t *l)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int n_local = 0;
    for (int r = 0; r < j->world; r++) n_local += j->rank_node[r] == 0;
    *l = (ddpd_launch_t){.worker_bin = j->d->cfg.worker_bin,
                         .spec_path = j->spec_path,
                         .run_dir = j->run_dir,
                         .cwd = j->cwd[0] && access(j->cwd, X_OK) == 0 ? j->cwd : NULL,
                         .rdzv = j->rdzv,
                         .token = j->token,
                         .job_id = j->id,
                         .world = j->world,
                         .local_world = n_local,
                         .threads = j->threads > 0 ? j->threads
                                    : (int)(cores / n_local > 0 ? cores / n_local : 1),
                         .as_user = 1,
                         .elastic = j->elastic,
                         .uid = j->uid,
                         .gid = j->gid};
}

/* Elastic: whether a local rank that ended with code/sig is spawned again to rejoin. Not after
 * our own signal, a cancel, the coordinator's verdict, a bad spec (exit 2), or its last restart. */
static int restart_wanted(ddpd_job_t *j, const ddpd_proc_t *p, int code)
{
    return j->coord && !j->signalled && !j->cancel_requested && !j->fail_why[0] && code != 2 &&
           p->restarts < j->max_restarts;
}

static void proc_exit(ddpd_proc_t *p)
{
    ddpd_job_t *j = p->data;
    j->live_local--;
    j->d->slots_used--;
    j->slots_held--;
    ddpd_peers_announce(j->d);
    if (p->term_signal || p->exit_status != 0) {
        /* 143 after our own SIGTERM is the worker's clean cancel */
        int ours = j->signalled && (p->exit_status == 143 || p->term_signal == SIGTERM ||
                                    p->term_signal == SIGKILL);
        if (!ours && restart_wanted(j, p, (int)p->exit_status)) {
            p->respawn = 1; /* once its handle is closed (proc_closed) */
            j->pending_restarts++;
        } else if (!ours && j->coord) {
            /* the coordinator goes on without it while min_workers remain, or fails the job */
            DDP_WARN("job %lld: rank %d ended (code %d, signal %d) and is not restarted "
                     "(%d of ddp.max_restarts = %d used)", (long long)j->id, p->rank,
                     (int)p->exit_status, p->term_signal, p->restarts, j->max_restarts);
        } else if (!ours) {
            rank_failed(j, p->rank, (int)p->exit_status, p->term_signal);
        }
    }
    maybe_finish(j);
}

/* Spawns an elastic job's local rank again: it joins the coordinator as a new member and
 * receives the state from a live rank. */
static void respawn(ddpd_job_t *j, ddpd_proc_t *p)
{
    p->respawn = 0;
    j->pending_restarts--;
    if (j->signalled || j->fail_why[0] || ddpd_state_terminal(j->state)) return;
    ddpd_launch_t l;
    launch_of(j, &l);
    char why[512];
    int code = (int)p->exit_status, sig = p->term_signal;
    p->restarts++;
    int rc = ddpd_spawn_rank(j->d->loop, p, &l, p->rank, p->local_rank, why, sizeof why);
    if (p->open) j->handles++;
    if (rc) {
        DDP_ERROR("job %lld: cannot spawn rank %d again: %s", (long long)j->id, p->rank, why);
        return;
    }
    j->live_local++;
    j->slots_held++;
    j->d->slots_used++;
    j->restarts++;
    j->d->n_worker_restarts++;
    DDP_WARN("job %lld: rank %d ended (code %d, signal %d): spawned again as pid %d, restart %d "
             "of %d; it rejoins the running job", (long long)j->id, p->rank, code, sig, p->pid,
             p->restarts, j->max_restarts);
}

static void proc_closed(ddpd_proc_t *p)
{
    ddpd_job_t *j = p->data;
    if (p->respawn) respawn(j, p);
    handle_closed(j);
    if (j->pending_restarts == 0) maybe_finish(j);
}

/* Events of an elastic job's coordinator. */
static void coord_event(void *arg, json_t *ev)
{
    ddpd_job_t *j = arg;
    const char *what = json_string_value(json_object_get(ev, "event"));
    const char *why = json_string_value(json_object_get(ev, "why"));
    if (!what || ddpd_state_terminal(j->state)) return;
    if (!strcmp(what, "generation")) {
        j->generation = (unsigned long)json_integer_value(json_object_get(ev, "gen"));
        int size = (int)json_integer_value(json_object_get(ev, "size"));
        if (j->generation > 1 && j->state == DDPD_RUNNING)
            set_state(j, DDPD_RUNNING, "generation %lu: %d of %d ranks (cause: %.300s)",
                      j->generation, size, j->world, why ? why : "?");
    } else if (!strcmp(what, "evict") && json_is_true(json_object_get(ev, "kill"))) {
        /* a silent rank: kill it here (the coordinator does on its own host) */
        int pid = (int)json_integer_value(json_object_get(ev, "pid")), here = 0;
        for (int i = 0; i < j->n_local; i++)
            if (j->procs[i].alive && j->procs[i].pid == pid) {
                ddpd_proc_signal(&j->procs[i], SIGKILL);
                here = 1;
            }
        for (int i = 0; !here && i < ddpd_peers_count(j->d); i++)
            ddpd_peers_kill(j->d, i, j->id, pid, /* the peer that runs it kills it */
                            json_string_value(json_object_get(ev, "host_id")));
    } else if (!strcmp(what, "done")) {
        /* every member trained to the end: ranks elsewhere that the coordinator evicted (a
         * partition: their daemon may never report them) are no longer this job's */
        j->live_remote = 0;
        maybe_finish(j);
    } else if (!strcmp(what, "failed")) {
        if (!j->fail_why[0]) {
            snprintf(j->fail_why, sizeof j->fail_why, "%.500s",
                     why ? why : "the coordinator failed");
            j->fail_rank = j->world;
        }
        terminate(j);
    }
}

void ddpd_job_remote_exit(ddpd_t *d, int64_t job_id, int rank, int code, int sig)
{
    ddpd_job_t *j = ddpd_job_find(d, job_id);
    if (!j || ddpd_state_terminal(j->state) || j->live_remote <= 0) return;
    j->live_remote--;
    if (code != 0 || sig) {
        int ours = j->signalled && (code == 143 || sig == SIGTERM || sig == SIGKILL);
        if (!ours && !j->coord) rank_failed(j, rank, code, sig); /* elastic: the coordinator's */
    }
    maybe_finish(j);
}

void ddpd_job_remote_failed(ddpd_t *d, int64_t job_id, const char *why)
{
    ddpd_job_t *j = ddpd_job_find(d, job_id);
    if (!j || ddpd_state_terminal(j->state)) return;
    if (j->coord && j->state == DDPD_RUNNING) {
        /* elastic: the ranks there may still train (their coordinator is here), or are gone and
         * the coordinator evicts them; either way the job goes on while it can */
        DDP_WARN("job %lld: %s; the job goes on with the ranks its coordinator has",
                 (long long)j->id, why);
        j->live_remote = 0;
        maybe_finish(j);
        return;
    }
    if (!j->fail_why[0] && !j->cancel_requested) {
        snprintf(j->fail_why, sizeof j->fail_why, "%s", why);
        j->fail_rank = j->fail_rank >= 0 ? j->fail_rank : j->world;
    }
    /* the peer's ranks are gone or never started: stop counting them */
    int remote = 0;
    for (int r = 0; r < j->world; r++) remote += j->rank_node[r] > 0;
    (void)remote;
    j->live_remote = 0;
    terminate(j);
    maybe_finish(j);
}

void ddpd_job_remote_started(ddpd_t *d, int64_t job_id, int n_ranks)
{
    ddpd_job_t *j = ddpd_job_find(d, job_id);
    if (!j || j->state != DDPD_STARTING) return;
    (void)n_ranks;
    if (--j->pending_acks == 0 && j->live_local == j->n_local)
        set_state(j, DDPD_RUNNING, "all %d ranks started", j->world);
}

/* ---- acceptance ---- */

/* What the daemon keeps of a validated spec. */
static void take_spec(ddpd_job_t *j, const ddp_spec_t *spec)
{
    j->world = spec->workers < 1 ? 1 : spec->workers;
    j->threads = spec->threads;
    j->steps = spec->steps;
    j->elastic = !strcmp(spec->restart, "on-failure");
    j->min_workers = spec->min_workers < j->world ? spec->min_workers : j->world;
    j->max_restarts = spec->max_restarts;
    j->hb_timeout_s = spec->heartbeat_timeout_s;
    j->rejoin_timeout_s = spec->rejoin_timeout_s;
}

static int job_new(ddpd_t *d, ddpd_job_t **out)
{
    ddpd_job_t *j = ddp_calloc(1, sizeof *j);
    if (!j) return DDP_ENOMEM;
    j->d = d;
    j->fail_rank = -1;
    uv_timer_init(d->loop, &j->kill_timer);
    uv_timer_init(d->loop, &j->tail_timer);
    uv_fs_event_init(d->loop, &j->run_watch);
    j->kill_timer.data = j->tail_timer.data = j->run_watch.data = j;
    j->handles = 3;
    *out = j;
    return 0;
}

static void job_link(ddpd_t *d, ddpd_job_t *j)
{
    ddpd_job_t **pp = &d->jobs;
    while (*pp) pp = &(*pp)->next;
    *pp = j;
}

/* A job that never got linked or started: close its timers and free at the close callback. */
static void job_discard(ddpd_job_t *j)
{
    j->freeing = 1;
    j->state = DDPD_FAILED;
    job_link(j->d, j); /* job_free unlinks */
    close_handles(j);
}

static void make_run_dir(ddpd_job_t *j)
{
    if (mkdir(j->run_dir, 0750) != 0 && errno != EEXIST)
        DDP_WARN("job %lld: mkdir %s: %s", (long long)j->id, j->run_dir, strerror(errno));
    if (geteuid() == 0 && j->uid != 0 && chown(j->run_dir, j->uid, j->gid) != 0)
        DDP_WARN("job %lld: chown %s: %s", (long long)j->id, j->run_dir, strerror(errno));
}

int ddpd_job_submit(ddpd_t *d, const ddpd_submit_t *sub, ddpd_job_t **out, ddp_errinfo_t *ei)
{
    *out = NULL;
    if (d->stopping) return ddp_errinfo_set(ei, DDP_EABORTED, "the daemon is shutting down");
    ddp_spec_t *spec = ddp_malloc(sizeof *spec);
    if (!spec) return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    int rc = ddp_spec_parse(spec, sub->spec_text, sub->spec_len, sub->origin, ei);
    if (rc != 0) {
        free(spec);
        return rc;
    }
    if (sub->workers > 0) {
        /* --workers N sets the job's size; the elastic range follows it where it must */
        spec->workers = sub->workers;
        if (spec->max_workers < spec->workers) spec->max_workers = spec->workers;
        if (spec->min_workers > spec->workers) spec->min_workers = spec->workers;
    }
    if (sub->name && *sub->name) snprintf(spec->name, sizeof spec->name, "%s", sub->name);
    if (spec->workers < 1) spec->workers = 1;
    int cap = ddpd_sched_capacity(d);
    if (spec->workers > cap) {
        rc = ddp_errinfo_set(ei, DDP_EBUSY,
                             "the job needs %d ranks but the cluster has %d slots (this node "
                             "%d); lower ddp.workers or add slots/peers",
                             spec->workers, cap, d->cfg.slots);
        ddp_errinfo_path(ei, "ddp.workers");
        free(spec);
        return rc;
    }
    ddpd_job_t *j;
    if ((rc = job_new(d, &j)) != 0) {
        free(spec);
        return ddp_errinfo_set(ei, rc, "out of memory");
    }
    j->spec_json = ddp_spec_to_json(spec);
    snprintf(j->name, sizeof j->name, "%s", spec->name[0] ? spec->name : "job");
    take_spec(j, spec);
    free(spec);
    j->uid = sub->uid;
    j->gid = sub->gid;
    snprintf(j->cwd, sizeof j->cwd, "%s", sub->cwd ? sub->cwd : "");
    ddpd_random_hex(j->token, 32);
    j->submitted_ms = ddp_wall_ms();
    ddpd_jobrec_t rec = {.name = j->name,
                         .uid = j->uid,
                         .world = j->world,
                         .spec_json = j->spec_json ? j->spec_json : "{}",
                         .run_dir = d->cfg.run_dir,
                         .cwd = j->cwd,
                         .token = j->token,
                         .submitted_ms = j->submitted_ms};
    if (!j->spec_json || (rc = ddpd_store_job_insert(d->store, &rec, &j->id)) != 0) {
        rc = rc ? rc : DDP_ENOMEM;
        ddp_errinfo_set(ei, rc, "cannot record the job: %s", ddp_strerror(rc));
        job_discard(j);
        return rc;
    }
    snprintf(j->run_dir, sizeof j->run_dir, "%.4000s/job-%lld", d->cfg.run_dir, (long long)j->id);
    make_run_dir(j);
    snprintf(j->reason, sizeof j->reason, "submitted");
    j->state = DDPD_QUEUED;
    job_link(d, j);
    d->n_submitted++;
    DDP_INFO("job %lld (%s): queued, %d ranks, uid %u", (long long)j->id, j->name, j->world,
             j->uid);
    ddpd_sched_kick(d);
    *out = j;
    return 0;
}

int ddpd_job_requeue(ddpd_t *d, json_t *row)
{
    ddpd_job_t *j;
    DDP_CHECK(job_new(d, &j));
    const char *spec_text = json_string_value(json_object_get(row, "spec"));
    ddp_spec_t *spec = ddp_malloc(sizeof *spec);
    ddp_errinfo_t ei;
    if (!spec || !spec_text ||
        ddp_spec_parse(spec, spec_text, strlen(spec_text), "<stored>", &ei) != 0) {
        free(spec);
        j->id = json_integer_value(json_object_get(row, "id"));
        ddpd_store_job_transition(d->store, j->id, "queued", "failed",
                                  "stored spec no longer valid", ddp_wall_ms());
        job_discard(j);
        return DDP_ESPEC;
    }
    j->spec_json = ddp_strdup(spec_text);
    take_spec(j, spec);
    free(spec);
    j->id = json_integer_value(json_object_get(row, "id"));
    j->uid = (uint32_t)json_integer_value(json_object_get(row, "uid"));
    j->gid = j->uid;
    snprintf(j->name, sizeof j->name, "%s", json_string_value(json_object_get(row, "name")));
    snprintf(j->cwd, sizeof j->cwd, "%s", json_string_value(json_object_get(row, "cwd")));
    snprintf(j->run_dir, sizeof j->run_dir, "%s",
             json_string_value(json_object_get(row, "run_dir")));
    snprintf(j->token, sizeof j->token, "%s", json_string_value(json_object_get(row, "token")));
    snprintf(j->reason, sizeof j->reason, "re-queued after a daemon restart");
    j->submitted_ms = ddp_wall_ms();
    j->state = DDPD_QUEUED;
    make_run_dir(j);
    job_link(d, j);
    ddpd_sched_kick(d);
    return 0;
}

/* ---- start ---- */

/* A free TCP port on this host for rank 0's rendezvous listener. The worker binds it moments
 * later; the window is small and a clash shows as a clear worker error. */
static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return -errno;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t al = sizeof a;
    int port = -1;
    if (bind(s, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(s, (struct sockaddr *)&a, &al) == 0)
        port = ntohs(a.sin_port);
    close(s);
    return port;
}

static int write_spec(ddpd_job_t *j)
{
    snprintf(j->spec_path, sizeof j->spec_path, "%s/job.json", j->run_dir);
    FILE *f = fopen(j->spec_path, "we");
    if (!f) return -errno;
    int ok = fputs(j->spec_json, f) >= 0 && fputc('\n', f) != EOF;
    ok = (fclose(f) == 0) && ok;
    return ok ? 0 : DDP_EIO;
}

void ddpd_job_start(ddpd_job_t *j, int *rank_node)
{
    ddpd_t *d = j->d;
    j->rank_node = rank_node;
    j->started_ms = ddp_wall_ms();
    int n_local = 0;
    for (int r = 0; r < j->world; r++) n_local += rank_node[r] == 0;

    /* where: "node:ranks" for each node */
    char where[1024] = "";
    size_t wl = 0;
    for (int n = 0; n <= ddpd_peers_count(d); n++) {
        int cnt = 0, first = -1, last = -1;
        for (int r = 0; r < j->world; r++)
            if (rank_node[r] == n) {
                cnt++;
                if (first < 0) first = r;
                last = r;
            }
        if (!cnt) continue;
        wl += (size_t)snprintf(where + wl, wl < sizeof where ? sizeof where - wl : 0,
                               "%s%s:%d-%d", wl ? "," : "",
                               n == 0 ? d->cfg.node_name : ddpd_peers_name(d, n - 1), first,
                               last);
        if (wl >= sizeof where) wl = sizeof where - 1;
    }
    if (j->elastic) {
        /* the coordinator listens on every address: ranks on peers dial the advertised one */
        ddpd_coord_cfg_t cc = {.host = "0.0.0.0", .token = j->token, .world = j->world,
                               .min_workers = j->min_workers, .max_workers = j->world,
                               .hb_timeout_s = j->hb_timeout_s,
                               .rejoin_timeout_s = j->rejoin_timeout_s,
                               .on_event = coord_event, .arg = j};
        ddp_errinfo_t ei;
        ddp_errinfo_clear(&ei);
        if (ddpd_coord_new(d->loop, &cc, &j->coord, &ei) != 0) {
            snprintf(j->fail_why, sizeof j->fail_why, "%.300s", ei.msg);
            set_state(j, DDPD_STARTING, "placed on %s", where);
            maybe_finish(j);
            return;
        }
        snprintf(j->rdzv, sizeof j->rdzv, "%s:%d", d->cfg.advertise, ddpd_coord_port(j->coord));
    } else {
        int port = free_port();
        snprintf(j->rdzv, sizeof j->rdzv, "%s:%d", d->cfg.advertise, port > 0 ? port : 29500);
    }
    set_state(j, DDPD_STARTING, "placed on %s, %s %s", where,
              j->elastic ? "elastic, coordinator" : "rendezvous", j->rdzv);

    int rc = write_spec(j);
    if (rc != 0) {
        snprintf(j->fail_why, sizeof j->fail_why, "cannot write %.150s: %.60s", j->spec_path,
                 ddp_strerror(rc));
        maybe_finish(j);
        return;
    }
    tail_read(j); /* skip what an earlier run (re-queue) left */
    /* inotify shows each line at once; the timer is the fallback (NFS, no inotify) */
    uv_fs_event_start(&j->run_watch, fs_cb, j->run_dir, 0);
    uv_timer_start(&j->tail_timer, tail_cb, 500, 500);

    j->procs = ddp_calloc(n_local ? (size_t)n_local : 1, sizeof *j->procs);
    if (!j->procs) {
        snprintf(j->fail_why, sizeof j->fail_why, "out of memory");
        maybe_finish(j);
        return;
    }
    ddpd_launch_t l;
    launch_of(j, &l);
    for (int r = 0, k = 0; r < j->world && !j->fail_why[0]; r++) {
        if (rank_node[r] != 0) continue;
        ddpd_proc_t *p = &j->procs[k];
        p->data = j;
        p->on_exit = proc_exit;
        p->on_close = proc_closed;
        char why[512];
        rc = ddpd_spawn_rank(d->loop, p, &l, r, k, why, sizeof why);
        if (p->open) j->handles++;
        k++;
        j->n_local = k;
        if (rc != 0) {
            DDP_ERROR("job %lld: %s", (long long)j->id, why);
            snprintf(j->fail_why, sizeof j->fail_why, "%.250s", why);
            j->fail_rank = r;
            break;
        }
        j->live_local++;
        j->slots_held++;
        d->slots_used++;
    }
    if (j->n_local && j->procs[0].pid)
        ddpd_store_job_placement(d->store, j->id, where, j->procs[0].pid);
    else
        ddpd_store_job_placement(d->store, j->id, where, 0);
    if (j->fail_why[0]) {
        terminate(j);
        maybe_finish(j);
        return;
    }
    /* remote ranks */
    for (int n = 1; n <= ddpd_peers_count(d); n++) {
        int ranks[1024], cnt = 0;
        for (int r = 0; r < j->world && cnt < 1024; r++)
            if (rank_node[r] == n) ranks[cnt++] = r;
        if (!cnt) continue;
        j->live_remote += cnt;
        j->pending_acks++;
        if (ddpd_peers_launch(d, n - 1, j, ranks, cnt) != 0) {
            ddpd_job_remote_failed(d, j->id, "a peer disconnected before its ranks started");
            return;
        }
    }
    ddpd_peers_announce(d);
    if (j->pending_acks == 0) set_state(j, DDPD_RUNNING, "all %d ranks started", j->world);
}

/* ---- cancel / stop ---- */

int ddpd_job_cancel(ddpd_job_t *j, uint32_t uid)
{
    if (uid != 0 && uid != j->uid) return DDP_EPERM;
    if (ddpd_state_terminal(j->state)) return DDP_EINVAL;
    if (j->cancel_requested) return 0;
    j->cancel_requested = 1;
    j->cancel_uid = uid;
    if (j->state == DDPD_QUEUED) {
        set_state(j, DDPD_CANCELLED, "cancelled by uid %u before it started", uid);
        j->d->n_finished[2]++;
        j->freeing = 1;
        close_handles(j);
        ddpd_sched_kick(j->d);
        return 0;
    }
    DDP_INFO("job %lld: cancel by uid %u: SIGTERM to its ranks", (long long)j->id, uid);
    terminate(j);
    maybe_finish(j);
    return 0;
}

int ddpd_job_stop_all(ddpd_t *d, const char *reason)
{
    int busy = 0;
    for (ddpd_job_t *j = d->jobs, *next; j; j = next) {
        next = j->next;
        if (ddpd_state_terminal(j->state)) continue;
        if (j->state == DDPD_QUEUED) continue; /* stays queued in the store; re-queued at start */
        if (!j->fail_why[0] && !j->cancel_requested)
            snprintf(j->fail_why, sizeof j->fail_why, "%s", reason);
        terminate(j);
        busy++;
    }
    return busy;
}

void ddpd_job_close_idle(ddpd_t *d)
{
    for (ddpd_job_t *j = d->jobs, *next; j; j = next) {
        next = j->next;
        if (j->freeing || j->live_local > 0) continue;
        j->freeing = 1;
        close_handles(j);
    }
}
