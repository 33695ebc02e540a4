/* Job lifecycle on the coordinating node: start, local and remote ranks, elastic restarts,
 * ending, cancel and a daemon restart's detach. One of the job module's three files (see
 * job_int.h): job_accept.c creates the jobs this file runs, job_view.c answers what others read.
 * Invariants:
 *  - j->handles counts open uv handles (two timers from creation, plus one per spawned local
 *    rank until its close callback); a job is freed only when it is terminal and handles == 0,
 *    from a close callback (a safe point: nothing up the stack holds the pointer).
 *  - slots are taken (slots.h) when local ranks are spawned and given back when each one ends.
 *  - every state change goes through set_state (store + watchers + log).
 */
#include "daemon/job_int.h"

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
#include "daemon/coord.h"
#include "daemon/exec_rank.h"
#include "daemon/job_tail.h"
#include "daemon/link.h"
#include "daemon/remote.h"
#include "daemon/slots.h"
#include "daemon/userfs.h"
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

void ddpd_job_on_change(ddpd_t *d, ddpd_job_change_fn fn, void *arg)
{
    DDP_ASSERT(d->n_job_watchers < DDPD_MAX_JOB_WATCHERS);
    d->job_watchers[d->n_job_watchers].fn = fn;
    d->job_watchers[d->n_job_watchers++].arg = arg;
}

void ddpd__job_notify(ddpd_job_t *j, unsigned what)
{
    for (int i = 0; i < j->d->n_job_watchers; i++)
        j->d->job_watchers[i].fn(j->d->job_watchers[i].arg, j, what);
}

/* A store write failed (the store logged SQLite's message): the job goes on, but its history
 * misses this record; say which, and count it (ddpd_store_errors_total). */
void ddpd__job_check_stored(ddpd_job_t *j, int rc, const char *what)
{
    if (rc == 0) return;
    j->d->n_store_errors++;
    DDP_ERROR("job %lld: the store did not record its %s (%s): `ddpctl status` will miss it",
              (long long)j->id, what, ddp_strerror(rc));
}

void ddpd__job_free(ddpd_job_t *j)
{
    ddpd_t *d = j->d;
    for (ddpd_job_t **pp = &d->jobs; *pp; pp = &(*pp)->next)
        if (*pp == j) {
            *pp = j->next;
            break;
        }
    ddpd_tail_close(&j->tail);
    free(j->groups);
    free(j->spec_json);
    free(j->rank_node);
    free(j->remote_alive);
    free(j->procs);
    free(j);
}

void ddpd_job_free_all(ddpd_t *d)
{
    while (d->jobs) ddpd__job_free(d->jobs);
}

/* Returns 1 when that was the last handle of a job being freed: j is gone. */
static int handle_closed(ddpd_job_t *j)
{
    if (--j->handles != 0 || !j->freeing) return 0;
    ddpd__job_free(j);
    return 1;
}

static void timer_closed(uv_handle_t *h) { handle_closed(h->data); }

void ddpd__job_set_state(ddpd_job_t *j, ddpd_state_t to, const char *fmt, ...)
{
    ddpd_state_t from = j->state;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->reason, sizeof j->reason, fmt, ap);
    va_end(ap);
    j->state = to;
    int rc = ddpd_store_job_transition(j->d->store, j->id, ddpd_state_name(from),
                                       ddpd_state_name(to), j->reason, ddp_wall_ms());
    ddpd__job_check_stored(j, rc, "transition");
    DDP_INFO("job %lld (%s): %s -> %s: %s", (long long)j->id, j->name, ddpd_state_name(from),
             ddpd_state_name(to), j->reason);
    ddpd__job_notify(j, DDPD_JOB_STATE);
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
    if (status == 0 && name && !strcmp(name, "metrics.jsonl") &&
        ddpd_tail_read(&j->tail, j->run_dir, j->uid))
        ddpd__job_notify(j, DDPD_JOB_PROGRESS);
}

static void tail_cb(uv_timer_t *t)
{
    ddpd_job_t *j = t->data;
    if (ddpd_tail_read(&j->tail, j->run_dir, j->uid)) ddpd__job_notify(j, DDPD_JOB_PROGRESS);
}

void ddpd__job_watch_run_dir(ddpd_job_t *j)
{
    /* inotify shows each line at once; the timer is the fallback (NFS, no inotify) */
    uv_fs_event_start(&j->run_watch, fs_cb, j->run_dir, 0);
    uv_timer_start(&j->tail_timer, tail_cb, 500, 500);
}

/* ---- ending ---- */

static void finish(ddpd_job_t *j)
{
    ddpd_t *d = j->d;
    if (ddpd_state_terminal(j->state)) return;
    ddpd_tail_read(&j->tail, j->run_dir, j->uid);
    uv_timer_stop(&j->tail_timer);
    uv_timer_stop(&j->kill_timer);
    int code = -1;
    if (j->n_local && j->procs[0].rank == 0 && !j->procs[0].alive)
        code = j->procs[0].term_signal ? 128 + j->procs[0].term_signal
                                       : (int)j->procs[0].exit_status;
    const ddp_metrics_rec_t *last = j->tail.has_last ? &j->tail.last_step : NULL;
    long step = last ? (long)last->step : 0;
    double fl = NAN; /* the done event's final loss, else the last step's */
    if (j->tail.has_done && (j->tail.done.has & DDP_MF(FINAL_LOSS))) fl = j->tail.done.final_loss;
    else if (last && (last->has & DDP_MF(LOSS))) fl = last->loss;
    if (last && (last->has & DDP_MF(STEPS))) j->steps = (long)last->steps;
    int rc = ddpd_store_job_result(d->store, j->id, code, step, j->steps, fl);
    ddpd__job_check_stored(j, rc, "result");
    if (j->coord && !j->tail.has_done && !j->fail_why[0] && !j->cancel_requested) {
        snprintf(j->fail_why, sizeof j->fail_why,
                 "every rank ended before the job completed (generation %lu)", j->generation);
        j->fail_rank = j->world;
    }
    ddpd_coord_close(j->coord);
    j->coord = NULL;
    if (j->cancel_requested) {
        d->n_finished[2]++;
        ddpd__job_set_state(j, DDPD_CANCELLED, "cancelled by uid %u", j->cancel_uid);
    } else if (j->fail_rank >= 0 || j->fail_why[0]) {
        d->n_finished[1]++;
        ddpd__job_set_state(j, DDPD_FAILED, "%s", j->fail_why);
    } else {
        d->n_finished[0]++;
        ddpd__job_set_state(j, DDPD_SUCCEEDED, "all %d ranks exited 0", j->world);
    }
    j->freeing = 1;
    close_handles(j);
}

void ddpd__job_maybe_finish(ddpd_job_t *j)
{
    if (j->detached) return; /* the daemon stops; the job goes on without it */
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
        ddpd_remote_signal(j->d, i, j->id, SIGKILL);
}

int ddpd_job_signal_peers(ddpd_job_t *j, int sig)
{
    int remote = 0;
    for (int r = 0; r < j->world && j->rank_node; r++) remote += j->rank_node[r] > 0;
    for (int i = 0; remote && i < ddpd_peers_count(j->d); i++)
        ddpd_remote_signal(j->d, i, j->id, sig);
    return remote;
}

/* SIGTERM to every rank, SIGKILL after the grace period. */
static void terminate(ddpd_job_t *j)
{
    if (j->signalled) return;
    j->signalled = 1;
    for (int i = 0; i < j->n_local; i++) ddpd_proc_signal(&j->procs[i], SIGTERM);
    ddpd_job_signal_peers(j, SIGTERM);
    uv_timer_start(&j->kill_timer, kill_cb, (uint64_t)(j->d->cfg.grace_s * 1000), 0);
}

static void rank_failed(ddpd_job_t *j, int rank, int code, int sig)
{
    if (j->cancel_requested || j->fail_rank >= 0) return;
    j->fail_rank = rank;
    if (sig)
        snprintf(j->fail_why, sizeof j->fail_why, "rank %d killed by signal %d (%s)", rank, sig,
                 strsignal(sig));
    else if (code < 0)
        snprintf(j->fail_why, sizeof j->fail_why, "rank %d ended without recording an exit "
                 "status (killed or crashed; see rank-%d.log)", rank, rank);
    else if (code == DDPD_EXEC_FAILED)
        snprintf(j->fail_why, sizeof j->fail_why, "rank %d could not be started as uid %u (its "
                 "log, its run directory or its working directory; see rank-%d.log, else the "
                 "daemon's log)", rank, j->uid, rank);
    else
        snprintf(j->fail_why, sizeof j->fail_why, "rank %d exited with code %d (see rank-%d.log)",
                 rank, code, rank);
    DDP_WARN("job %lld: %s; stopping the other ranks", (long long)j->id, j->fail_why);
    terminate(j);
}

/* The launch description of this job's local ranks. */
static void launch_of(ddpd_job_t *j, ddpd_launch_t *l)
{
    ddpd_quota_t q;
    ddpd_config_quota(&j->d->cfg, j->uid, &q);
    int n_local = 0;
    for (int r = 0; r < j->world; r++) n_local += j->rank_node[r] == 0;
    *l = (ddpd_launch_t){.worker_bin = j->d->cfg.worker_bin,
                         .spec_path = j->spec_path,
                         .run_dir = j->run_dir,
                         .cwd = j->cwd,
                         .rdzv = j->rdzv,
                         .token = j->token,
                         .job_id = j->id,
                         .world = j->world,
                         .local_world = n_local,
                         .threads = j->threads,
                         .elastic = j->elastic,
                         .uid = j->uid,
                         .gid = j->gid,
                         .groups = j->groups,
                         .n_groups = j->n_groups,
                         .log_bytes = q.log_bytes,
                         .metrics_bytes = q.metrics_bytes,
                         .tensorboard_bytes = q.tensorboard_bytes};
}

/* Elastic: whether a local rank that ended with code/sig is spawned again to rejoin. Not after
 * our own signal, a cancel, the coordinator's verdict, a bad spec (exit 2), a rank that could
 * not be started (DDPD_EXEC_FAILED), or its last restart. */
static int restart_wanted(ddpd_job_t *j, const ddpd_proc_t *p, int code)
{
    return j->coord && !j->signalled && !j->cancel_requested && !j->fail_why[0] && code != 2 &&
           code != DDPD_EXEC_FAILED && p->restarts < j->max_restarts;
}


static void proc_exit(ddpd_proc_t *p)
{
    ddpd_job_t *j = p->data;
    j->live_local--;
    ddpd_slots_give(j->d, 1, "a job's rank");
    ddpd__job_notify(j, DDPD_JOB_SLOTS);
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
    ddpd__job_maybe_finish(j);
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
    ddpd_slots_take(j->d, 1, "a job's rank spawned again");
    j->restarts++;
    j->d->n_worker_restarts++;
    DDP_WARN("job %lld: rank %d ended (code %d, signal %d): spawned again as pid %d, restart %d "
             "of %d; it rejoins the running job", (long long)j->id, p->rank, code, sig, p->pid,
             p->restarts, j->max_restarts);
    ddpd__job_save_runtime(j);
}

static void proc_closed(ddpd_proc_t *p)
{
    ddpd_job_t *j = p->data;
    if (p->respawn) respawn(j, p);
    if (handle_closed(j)) return; /* freed: nothing left to finish (ASan found the read) */
    if (j->pending_restarts == 0) ddpd__job_maybe_finish(j);
}

void ddpd__job_proc_init(ddpd_job_t *j, ddpd_proc_t *p)
{
    p->data = j;
    p->on_exit = proc_exit;
    p->on_close = proc_closed;
}

/* The coordinator's flight recorder diagnosis (coord.h) as RUN_DIR/flight/diagnosis.txt, where
 * the ranks wrote their dumps: a directory of the job's user, opened without following links
 * (userfs.h); the coordinator has logged the line already. */
static void write_diagnosis(ddpd_job_t *j, const char *diag)
{
    char dir[PATH_MAX + 16], why[256], text[1100];
    if (!diag) return;
    snprintf(dir, sizeof dir, "%s/flight", j->run_dir);
    int fd = ddpd_dir_open(dir, j->uid, why, sizeof why);
    int n = snprintf(text, sizeof text, "%s\n", diag);
    int rc = fd < 0 ? fd : ddpd_userfile_write(fd, "diagnosis.txt", text, (size_t)n, j->uid,
                                                j->gid, 0644, why, sizeof why);
    if (fd >= 0) close(fd);
    if (rc) DDP_WARN("job %lld: cannot write %s/diagnosis.txt: %s", (long long)j->id, dir, why);
}

/* Events of an elastic job's coordinator. */
void ddpd__job_coord_event(void *arg, json_t *ev)
{
    ddpd_job_t *j = arg;
    const char *what = json_string_value(json_object_get(ev, "event"));
    const char *why = json_string_value(json_object_get(ev, "why"));
    if (!what || ddpd_state_terminal(j->state)) return;
    if (!strcmp(what, "adopted")) {
        j->generation = (unsigned long)json_integer_value(json_object_get(ev, "gen"));
        ddpd__job_set_state(j, DDPD_RUNNING,
                            "the running generation %lu (%d ranks) was adopted: it goes on "
                            "without a pause", j->generation,
                            (int)json_integer_value(json_object_get(ev, "size")));
    } else if (!strcmp(what, "generation")) {
        j->generation = (unsigned long)json_integer_value(json_object_get(ev, "gen"));
        int size = (int)json_integer_value(json_object_get(ev, "size"));
        ddpd__job_save_runtime(j);
        if (j->generation > 1 && j->state == DDPD_RUNNING)
            ddpd__job_set_state(j, DDPD_RUNNING, "generation %lu: %d of %d ranks (cause: %.300s)",
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
            ddpd_remote_kill(j->d, i, j->id, pid, /* the peer that runs it kills it */
                            json_string_value(json_object_get(ev, "host_id")));
    } else if (!strcmp(what, "flight")) {
        write_diagnosis(j, json_string_value(json_object_get(ev, "diagnosis")));
    } else if (!strcmp(what, "done")) {
        /* every member trained to the end: ranks elsewhere that the coordinator evicted (a
         * partition: their daemon may never report them) are no longer this job's */
        j->live_remote = 0;
        ddpd__job_maybe_finish(j);
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
    if (rank >= 0 && rank < j->world && j->remote_alive) {
        if (!j->remote_alive[rank]) return; /* lost with its node already */
        j->remote_alive[rank] = 0;
    }
    j->live_remote--;
    if (code != 0 || sig) {
        int ours = j->signalled && (code == 143 || sig == SIGTERM || sig == SIGKILL);
        if (!ours && !j->coord) rank_failed(j, rank, code, sig); /* elastic: the coordinator's */
    }
    ddpd__job_maybe_finish(j);
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
        ddpd__job_maybe_finish(j);
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
    ddpd__job_maybe_finish(j);
}

void ddpd_job_node_down(ddpd_t *d, int peer)
{
    for (ddpd_job_t *j = d->jobs; j; j = j->next) {
        if (ddpd_state_terminal(j->state) || !j->rank_node) continue;
        int lost = 0, first = -1;
        for (int r = 0; r < j->world; r++)
            if (j->rank_node[r] == peer + 1) {
                if (first < 0) first = r;
                lost++;
            }
        if (!lost) continue;
        if (!j->elastic || j->state != DDPD_RUNNING || j->signalled) {
            char why[160];
            snprintf(why, sizeof why, "lost the link to node %s, which ran rank %d",
                     ddpd_peers_name(d, peer), first);
            ddpd_job_remote_failed(d, j->id, why);
            continue;
        }
        for (int r = 0; r < j->world; r++) {
            if (j->rank_node[r] != peer + 1) continue;
            j->rank_node[r] = -1;
            j->n_unplaced++;
            if (j->remote_alive[r]) {
                j->remote_alive[r] = 0;
                j->live_remote--;
            }
        }
        DDP_WARN("job %lld: node %s went down with %d rank(s): the job goes on with the others, "
                 "and they are placed again where a node has free slots", (long long)j->id,
                 ddpd_peers_name(d, peer), lost);
        ddpd__job_save_runtime(j);
        ddpd__job_notify(j, DDPD_JOB_SLOTS);
        ddpd__job_maybe_finish(j);
    }
}

void ddpd_job_remote_adopted(ddpd_t *d, int64_t job_id, int peer, const int *ranks, int n)
{
    ddpd_job_t *j = ddpd_job_find(d, job_id);
    if (!j || ddpd_state_terminal(j->state) || !j->rank_node) {
        /* the job ended (or was forgotten) while the link was down: its ranks there are no
         * one's, and nothing else would end them now that their coordinator is back */
        if (n > 0) {
            DDP_WARN("job %lld: node %s still runs %d of its rank(s), but the job is over: "
                     "they are killed", (long long)job_id, ddpd_peers_name(d, peer), n);
            ddpd_remote_signal(d, peer, job_id, SIGKILL);
        }
        return;
    }
    int back = 0;
    for (int k = 0; k < n; k++) {
        int r = ranks[k];
        if (r < 0 || r >= j->world || j->rank_node[r] != -1) continue; /* placed again already */
        j->rank_node[r] = peer + 1;
        j->remote_alive[r] = 1;
        j->live_remote++;
        j->n_unplaced--;
        back++;
    }
    if (!back) return;
    DDP_INFO("job %lld: node %s still runs %d of its rank(s): they are the job's again",
             (long long)j->id, ddpd_peers_name(d, peer), back);
    ddpd__job_save_runtime(j);
}

void ddpd_job_remote_started(ddpd_t *d, int64_t job_id, int n_ranks)
{
    ddpd_job_t *j = ddpd_job_find(d, job_id);
    if (!j || j->state != DDPD_STARTING) return;
    (void)n_ranks;
    if (--j->pending_acks == 0 && j->live_local == j->n_local)
        ddpd__job_set_state(j, DDPD_RUNNING, "all %d ranks started", j->world);
}

/* ---- acceptance ---- */

int ddpd__job_new(ddpd_t *d, ddpd_job_t **out)
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

void ddpd__job_link(ddpd_t *d, ddpd_job_t *j)
{
    ddpd_job_t **pp = &d->jobs;
    while (*pp) pp = &(*pp)->next;
    *pp = j;
}

/* A job that never got linked or started: close its timers and free at the close callback. */
void ddpd__job_discard(ddpd_job_t *j)
{
    j->freeing = 1;
    j->state = DDPD_FAILED;
    ddpd__job_link(j->d, j); /* ddpd__job_free unlinks */
    close_handles(j);
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


/* Spawns rank r here as the next local process (j->procs has room for every rank). */
static int spawn_local(ddpd_job_t *j, int r, char *why, size_t whylen)
{
    ddpd_launch_t l;
    j->rank_node[r] = 0;
    launch_of(j, &l);
    ddpd_proc_t *p = &j->procs[j->n_local];
    ddpd__job_proc_init(j, p);
    int rc = ddpd_spawn_rank(j->d->loop, p, &l, r, j->n_local, why, whylen);
    if (p->open) j->handles++;
    j->n_local++;
    if (rc != 0) return rc;
    j->live_local++;
    ddpd_slots_take(j->d, 1, "a job's rank");
    return 0;
}

/* Asks peer node-1 to start ranks[0..cnt) of j. */
static int launch_remote(ddpd_job_t *j, int node, const int *ranks, int cnt)
{
    ddpd_remote_start_t rs = {.job = j->id, .name = j->name, .rdzv = j->rdzv, .token = j->token,
                              .spec_json = j->spec_json, .cwd = j->cwd, .ranks = ranks, .n = cnt,
                              .world = j->world, .threads = j->threads, .elastic = j->elastic,
                              .max_restarts = j->max_restarts, .uid = j->uid, .gid = j->gid,
                              .groups = j->groups, .n_groups = j->n_groups};
    int rc = ddpd_remote_launch(j->d, node - 1, &rs);
    if (rc != 0) return rc;
    for (int k = 0; k < cnt; k++) {
        j->rank_node[ranks[k]] = node;
        j->remote_alive[ranks[k]] = 1;
    }
    j->live_remote += cnt;
    return 0;
}

int ddpd_job_place(ddpd_job_t *j, int node, const int *ranks, int n)
{
    int placed = 0;
    if (node == 0) {
        for (int k = 0; k < n && j->n_local < j->world; k++) {
            char why[512];
            if (spawn_local(j, ranks[k], why, sizeof why) != 0) {
                DDP_ERROR("job %lld: placing rank %d again: %s", (long long)j->id, ranks[k], why);
                j->rank_node[ranks[k]] = -1;
                break;
            }
            placed++;
        }
    } else if (launch_remote(j, node, ranks, n) == 0) {
        placed = n;
    }
    if (!placed) return 0;
    j->n_unplaced -= placed;
    j->restarts += placed;
    j->d->n_worker_restarts += (uint64_t)placed;
    DDP_WARN("job %lld: %d lost rank(s) placed again on %s, from rank %d; they join the running "
             "job", (long long)j->id, placed, node ? ddpd_peers_name(j->d, node - 1)
                                                   : j->d->cfg.node_name, ranks[0]);
    ddpd__job_save_runtime(j);
    ddpd__job_notify(j, DDPD_JOB_SLOTS);
    return placed;
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
                               .on_event = ddpd__job_coord_event, .arg = j};
        ddp_errinfo_t ei;
        ddp_errinfo_clear(&ei);
        if (ddpd_coord_new(d->loop, &cc, &j->coord, &ei) != 0) {
            snprintf(j->fail_why, sizeof j->fail_why, "%.300s", ei.msg);
            ddpd__job_set_state(j, DDPD_STARTING, "placed on %s", where);
            ddpd__job_maybe_finish(j);
            return;
        }
        snprintf(j->rdzv, sizeof j->rdzv, "%s:%d", d->cfg.advertise, ddpd_coord_port(j->coord));
    } else {
        int port = free_port();
        snprintf(j->rdzv, sizeof j->rdzv, "%s:%d", d->cfg.advertise, port > 0 ? port : 29500);
    }
    ddpd__job_set_state(j, DDPD_STARTING, "placed on %s, %s %s", where,
                        j->elastic ? "elastic, coordinator" : "rendezvous", j->rdzv);

    char why[512];
    int rc = ddpd_write_spec(j->run_dir, j->spec_json, j->uid, j->gid, j->spec_path,
                             sizeof j->spec_path, why, sizeof why);
    if (rc != 0) {
        snprintf(j->fail_why, sizeof j->fail_why, "cannot write the job's spec: %.400s", why);
        ddpd__job_maybe_finish(j);
        return;
    }
    ddpd_tail_read(&j->tail, j->run_dir, j->uid); /* skip what an earlier run (re-queue) left */
    ddpd__job_watch_run_dir(j);

    j->procs = ddp_calloc((size_t)j->world, sizeof *j->procs);
    j->remote_alive = ddp_calloc((size_t)j->world, 1);
    if (!j->procs || !j->remote_alive) {
        snprintf(j->fail_why, sizeof j->fail_why, "out of memory");
        ddpd__job_maybe_finish(j);
        return;
    }
    for (int r = 0; r < j->world && !j->fail_why[0]; r++) {
        if (rank_node[r] != 0) continue;
        if (spawn_local(j, r, why, sizeof why) != 0) {
            DDP_ERROR("job %lld: %s", (long long)j->id, why);
            snprintf(j->fail_why, sizeof j->fail_why, "%.250s", why);
            j->fail_rank = r;
        }
    }
    ddpd__job_check_stored(
        j, ddpd_store_job_placement(d->store, j->id, where, j->n_local ? j->procs[0].pid : 0),
        "placement");
    ddpd__job_save_runtime(j);
    if (j->fail_why[0]) {
        terminate(j);
        ddpd__job_maybe_finish(j);
        return;
    }
    /* remote ranks */
    for (int n = 1; n <= ddpd_peers_count(d); n++) {
        int ranks[1024], cnt = 0;
        for (int r = 0; r < j->world && cnt < 1024; r++)
            if (rank_node[r] == n) ranks[cnt++] = r;
        if (!cnt) continue;
        j->pending_acks++;
        if (launch_remote(j, n, ranks, cnt) != 0) {
            ddpd_job_remote_failed(d, j->id, "a peer disconnected before its ranks started");
            return;
        }
    }
    ddpd__job_notify(j, DDPD_JOB_SLOTS);
    if (j->pending_acks == 0)
        ddpd__job_set_state(j, DDPD_RUNNING, "all %d ranks started", j->world);
}

/* ---- cancel / stop ---- */

int ddpd_job_cancel(ddpd_job_t *j, uint32_t uid)
{
    if (ddpd_state_terminal(j->state)) return DDP_EINVAL;
    if (j->cancel_requested) return 0;
    j->cancel_requested = 1;
    j->cancel_uid = uid;
    if (j->state == DDPD_QUEUED) {
        ddpd__job_set_state(j, DDPD_CANCELLED, "cancelled by uid %u before it started", uid);
        j->d->n_finished[2]++;
        j->freeing = 1;
        close_handles(j);
        return 0;
    }
    DDP_INFO("job %lld: cancel by uid %u: SIGTERM to its ranks", (long long)j->id, uid);
    terminate(j);
    ddpd__job_maybe_finish(j);
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

int ddpd_job_busy(ddpd_t *d)
{
    for (ddpd_job_t *j = d->jobs; j; j = j->next)
        if (j->live_local > 0 || (j->live_remote > 0 && !ddpd_state_terminal(j->state)))
            return 1;
    return 0;
}

void ddpd_job_kill_all(ddpd_t *d)
{
    for (ddpd_job_t *j = d->jobs; j; j = j->next)
        for (int i = 0; i < j->n_local; i++) ddpd_proc_signal(&j->procs[i], SIGKILL);
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

/* ---- a daemon restart: detach, and adopt ---- */

/* Records what a restarted daemon needs to adopt the job (store column `runtime`). */
void ddpd__job_save_runtime(ddpd_job_t *j)
{
    json_t *procs = json_array(), *nodes = json_array();
    for (int i = 0; i < j->n_local; i++)
        json_array_append_new(procs, json_pack("{si si si si}", "rank", j->procs[i].rank,
                                               "local_rank", j->procs[i].local_rank, "pid",
                                               j->procs[i].pid, "restarts",
                                               j->procs[i].restarts));
    for (int r = 0; r < j->world && j->rank_node; r++)
        json_array_append_new(nodes, json_integer(j->rank_node[r]));
    json_t *o = json_pack("{ss so so si sI sI}", "rdzv", j->rdzv, "procs", procs, "rank_node",
                          nodes, "restarts", j->restarts, "first_step_ms",
                          (json_int_t)j->tail.first_step_ms, "generation",
                          (json_int_t)j->generation);
    char *text = json_dumps(o, JSON_COMPACT);
    ddpd__job_check_stored(j, text ? ddpd_store_job_runtime(j->d->store, j->id, text)
                                   : DDP_ENOMEM,
                           "runtime record (a restarted daemon could not adopt it)");
    free(text);
    json_decref(o);
}

void ddpd_job_detach_all(ddpd_t *d)
{
    for (ddpd_job_t *j = d->jobs; j; j = j->next) {
        if (j->freeing || ddpd_state_terminal(j->state) || j->state == DDPD_QUEUED) continue;
        DDP_INFO("job %lld (%s): left running (%d local rank(s)); the next ddpd adopts it",
                 (long long)j->id, j->name, j->live_local);
        ddpd__job_save_runtime(j);
        j->detached = 1;
        j->freeing = 1;
        j->live_local = 0;
        ddpd_coord_close(j->coord); /* its members redial the next daemon's coordinator */
        j->coord = NULL;
        for (int i = 0; i < j->n_local; i++) ddpd_proc_release(&j->procs[i]);
        close_handles(j);
    }
}

/* A local rank that ended while no daemon watched it: as if its exit had just been seen. */
void ddpd__job_ended_unwatched(ddpd_job_t *j, ddpd_proc_t *p)
{
    DDP_WARN("job %lld: rank %d (pid %d) ended while the daemon was away (%s %ld)",
             (long long)j->id, p->rank, p->pid, p->status_unknown ? "no exit status," : "code",
             p->status_unknown ? 0L : (long)p->exit_status);
    int failed = p->status_unknown || p->exit_status != 0;
    if (!failed) return;
    if (restart_wanted(j, p, (int)p->exit_status)) {
        j->pending_restarts++;
        respawn(j, p);
    } else if (!j->coord) {
        rank_failed(j, p->rank, (int)p->exit_status, 0);
    }
}

