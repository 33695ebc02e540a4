/* The elastic job coordinator (see coord.h; the protocol: collectives/elastic_proto.h).
 *
 * Invariants: a member is in c->members from accept until its close callback, which frees it;
 * `rank` >= 0 only for members of the current generation while it runs; `waiting` members have
 * asked to join the next one. The coordinator is freed when its listener, its timer and every
 * member are closed.
 */
#include "daemon/coord.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/elastic_proto.h"
#include "collectives/flight.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/host.h"
#include "common/log.h"
#include "daemon/lines.h"

typedef enum { ADOPTING, FORMING, RUNNING, ENDED } phase_t;

typedef struct member member_t;
struct member {
    uv_tcp_t tcp;
    ddpd_coord_t *c;
    member_t *next;
    ddpd_lines_t in;
    int closing;
    int joined;   /* sent a valid join once */
    int waiting;  /* wants a place in the next generation */
    int done;     /* trained to the end */
    int rank;     /* in the running generation, else -1 */
    int hint;
    unsigned long rejoin_gen; /* adopting: the generation it says it runs in (0: a joiner) */
    int rejoin_size;
    long pid, step;
    unsigned long sgen; /* the generation its state is from ("sgen" of its join; 0: unknown) */
    char host_id[160];
    char peer[64];
    uint64_t seq; /* arrival order */
    int64_t last_heard_ns;
    json_t *ag;   /* this member's pending allgather contribution */
    json_t *flight; /* its flight recorder dump of the collection in progress (NULL: none yet) */
};

struct ddpd_coord {
    uv_loop_t *loop;
    ddpd_coord_cfg_t cfg;
    char token[128];
    char host_id[160];
    uv_tcp_t listener;
    uv_timer_t tick;
    int port;
    int handles; /* listener + timer + members still open */
    int closing;
    member_t *members;
    uint64_t next_seq;
    unsigned long gen;
    unsigned long max_sgen; /* the newest generation a member's state came from */
    phase_t phase;
    int formed_once;
    int regroup_sent;     /* the running members were asked to regroup at a boundary */
    int64_t below_min_ns; /* when the job fell below min_workers (0: it is not) */
    int64_t reform_ns;    /* when the running generation ended (detection -> formation) */
    int64_t last_hb_ns;   /* the coordinator's last heartbeat to its members */
    int64_t adopt_end_ns; /* adopting: when it gives up waiting for the members to come back */
    char why[256];        /* why the next generation forms */
    int done;             /* ENDED because every member finished (else the job failed) */
    char end_why[512];    /* ENDED: why */
    int64_t flight_end_ns; /* a collection of flight dumps runs until then (0: none runs) */
    char flight_why[256];  /* what started it */
};

static void emit(ddpd_coord_t *c, json_t *ev)
{
    if (c->cfg.on_event) c->cfg.on_event(c->cfg.arg, ev);
    json_decref(ev);
}

static void maybe_free(ddpd_coord_t *c)
{
    if (c->closing && c->handles == 0) free(c);
}

static void member_closed(uv_handle_t *h)
{
    member_t *m = h->data;
    ddpd_coord_t *c = m->c;
    member_t **pp = &c->members;
    while (*pp && *pp != m) pp = &(*pp)->next;
    if (*pp) *pp = m->next;
    ddpd_lines_free(&m->in);
    json_decref(m->ag);
    json_decref(m->flight);
    free(m);
    c->handles--;
    maybe_free(c);
}

static void send_to(member_t *m, json_t *msg)
{
    if (!m->closing && ddpd_lines_send((uv_stream_t *)&m->tcp, msg) != 0) {
        m->closing = 1;
        uv_close((uv_handle_t *)&m->tcp, member_closed);
    }
    json_decref(msg);
}

static int count(const ddpd_coord_t *c, int (*pred)(const member_t *))
{
    int n = 0;
    for (const member_t *m = c->members; m; m = m->next)
        if (!m->closing && pred(m)) n++;
    return n;
}

static int is_member(const member_t *m) { return m->joined && !m->done; }
static int is_waiting(const member_t *m) { return m->joined && !m->done && m->waiting; }
static int is_running(const member_t *m) { return m->rank >= 0; }
static int is_done(const member_t *m) { return m->done; }
static int is_any(const member_t *m) { return m != NULL; }
static int running_not_back(const member_t *m) { return m->rank >= 0 && !m->waiting; }
/* waiting without a state: a restarted or new rank */
static int is_fresh(const member_t *m) { return is_waiting(m) && m->step < 0; }

/* Sends msg (consumed) to every open member that pred accepts. */
static void send_all(ddpd_coord_t *c, json_t *msg, int (*pred)(const member_t *))
{
    for (member_t *m = c->members; m; m = m->next)
        if (!m->closing && pred(m)) send_to(m, json_incref(msg));
    json_decref(msg);
}

/* The job is over once some member finished and none is still training; a joiner still
 * waiting then is told so (it leaves with success: there is nothing left to do). */
static void check_done(ddpd_coord_t *c)
{
    if (c->phase == ENDED || count(c, is_done) == 0) return;
    long step = -1;
    for (const member_t *m = c->members; m; m = m->next) {
        if (m->closing) continue;
        if (m->joined && !m->done && m->rank >= 0) return; /* still training */
        if (m->done && m->step > step) step = m->step;
    }
    c->phase = ENDED;
    c->done = 1;
    snprintf(c->end_why, sizeof c->end_why, "the job is done");
    send_all(c, json_pack("{s:s, s:s, s:b}", "t", "exit", "why", "the job is done", "done", 1),
             is_member);
    DDP_INFO("coordinator: every member is done (step %ld)", step);
    emit(c, json_pack("{s:s, s:I}", "event", "done", "step", (json_int_t)step));
}

static void end_job(ddpd_coord_t *c, const char *why)
{
    c->phase = ENDED;
    snprintf(c->end_why, sizeof c->end_why, "%s", why);
    send_all(c, json_pack("{s:s, s:s}", "t", "exit", "why", why), is_any);
    DDP_ERROR("coordinator: the job failed: %s", why);
    emit(c, json_pack("{s:s, s:s}", "event", "failed", "why", why));
}

/* The running generation is over: everyone still in it aborts and joins again. */
static void end_generation(ddpd_coord_t *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void end_generation(ddpd_coord_t *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof c->why, fmt, ap);
    va_end(ap);
    if (c->phase != RUNNING) return;
    c->phase = FORMING;
    c->regroup_sent = 0;
    c->reform_ns = ddp_now_ns();
    DDP_INFO("coordinator: generation %lu ends: %s", c->gen, c->why);
    send_all(c, json_pack("{s:s, s:I, s:s}", "t", "reform", "gen", (json_int_t)c->gen, "why",
                          c->why), running_not_back);
}

static void abandon_adoption(ddpd_coord_t *c, const char *why);

/* ---- flight recorder dumps (collectives/flight.h) ------------------------------------------
 * A collection starts when a member sends a dump of its own (its collective timed out) or
 * before an eviction's kill: every other member is asked for one ("dump"), and once each live
 * member has answered, or after ddp.heartbeat_timeout_s, the dumps are lined up by
 * ddp_flight_diagnose and the diagnosis is logged and reported as an event. */

static int has_flight(const member_t *m) { return m->joined && !m->done && m->flight; }
static int wants_flight(const member_t *m) { return m->joined && !m->done && !m->flight; }

static void flight_finish(ddpd_coord_t *c)
{
    int n = count(c, has_flight), k = 0;
    json_t **dumps = ddp_calloc((size_t)n + 1, sizeof *dumps);
    char diag[1024];
    for (member_t *m = c->members; dumps && m; m = m->next)
        if (!m->closing && has_flight(m) && k < n) dumps[k++] = m->flight;
    int rc = dumps ? ddp_flight_diagnose(dumps, (size_t)k, diag, sizeof diag) : DDP_ENOMEM;
    if (rc == DDP_ENOMEM) snprintf(diag, sizeof diag, "out of memory");
    DDP_WARN("coordinator: flight recorder (%d dump(s), after: %s): %s", k, c->flight_why, diag);
    emit(c, json_pack("{s:s, s:s, s:s, s:b, s:i}", "event", "flight", "diagnosis", diag, "after",
                      c->flight_why, "stuck", rc == 1, "ranks", k));
    free(dumps);
    for (member_t *m = c->members; m; m = m->next) {
        json_decref(m->flight);
        m->flight = NULL;
    }
    c->flight_end_ns = 0;
}

/* Starts a collection (unless one runs): asks every member without a dump for one. */
static void flight_collect(ddpd_coord_t *c, const char *why)
{
    if (c->flight_end_ns) return;
    snprintf(c->flight_why, sizeof c->flight_why, "%s", why);
    /* the members' own deadline to answer: their connection thread dumps at once */
    c->flight_end_ns = ddp_now_ns() + (int64_t)(c->cfg.hb_timeout_s * 1e9);
    send_all(c, json_pack("{s:s, s:s}", "t", "dump", "why", why), wants_flight);
}

static void flight_check(ddpd_coord_t *c)
{
    if (c->flight_end_ns && (count(c, wants_flight) == 0 || ddp_now_ns() > c->flight_end_ns))
        flight_finish(c);
}

/* Removes m from the job: closes its connection and, with kill_it, kills the process on this host
 * so that it cannot act in a later generation (a daemon kills one elsewhere from the event). */
static void evict(ddpd_coord_t *c, member_t *m, const char *why, int kill_it)
{
    if (m->closing) return;
    int was_running = m->rank >= 0 && c->phase == RUNNING;
    int rank = m->rank;
    DDP_WARN("coordinator: evicting pid %ld on %s (rank %d of generation %lu): %s", m->pid,
             m->peer, m->rank, c->gen, why);
    if (kill_it && m->rank >= 0) { /* the others' dumps say what it left them waiting on */
        char w[256];
        snprintf(w, sizeof w, "evicting rank %d (pid %ld): %s", m->rank, m->pid, why);
        m->closing = 1; /* not asked itself */
        flight_collect(c, w);
        m->closing = 0;
    }
    /* a member that went silent may still run: kill it here (a closed connection is a process
     * that exited or is exiting, and cannot rejoin under its old membership anyway) */
    if (kill_it && m->joined && m->pid > 0 && !strcmp(m->host_id, c->host_id))
        kill((pid_t)m->pid, SIGKILL);
    emit(c, json_pack("{s:s, s:I, s:s, s:i, s:s, s:b}", "event", "evict", "pid", (json_int_t)m->pid,
                      "host_id", m->host_id, "rank", rank, "why", why, "kill", kill_it));
    m->closing = 1;
    m->rank = -1;
    uv_close((uv_handle_t *)&m->tcp, member_closed);
    if (was_running) end_generation(c, "rank %d (pid %ld) %s", rank, m->pid, why);
    if (c->phase == ADOPTING && m->rejoin_gen) {
        char w[256];
        snprintf(w, sizeof w, "rank %d (pid %ld) %s", rank, m->pid, why);
        abandon_adoption(c, w);
    }
    check_done(c);
}

static int by_order(const void *a, const void *b)
{
    const member_t *x = *(member_t *const *)a, *y = *(member_t *const *)b;
    /* survivors first by their old rank, then by the launcher's hint, then by arrival */
    int xr = x->rank >= 0 ? x->rank : 1 << 30, yr = y->rank >= 0 ? y->rank : 1 << 30;
    if (xr != yr) return xr < yr ? -1 : 1;
    if (x->hint != y->hint) return x->hint < y->hint ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* 1 when m holds the state of `step` from generation sgen (a fresh member holds none). */
static int same_state(const member_t *m, long step, unsigned long sgen)
{
    return m->step == step && (step < 0 || m->sgen == sgen);
}

/* Forms the next generation when the rules allow (coord.h). */
static void try_form(ddpd_coord_t *c)
{
    if (c->phase != FORMING) return;
    int members = count(c, is_member), waiting = count(c, is_waiting);
    if (waiting == 0 || waiting < members) return; /* someone has not asked yet */
    int need = c->formed_once ? c->cfg.min_workers : c->cfg.world;
    if (waiting < need) {
        if (c->formed_once && !c->below_min_ns) {
            c->below_min_ns = ddp_now_ns();
            DDP_WARN("coordinator: %d member(s), below ddp.min_workers = %d: waiting up to %.0f s "
                     "for replacements", waiting, need, c->cfg.rejoin_timeout_s);
        }
        return;
    }
    c->below_min_ns = 0;
    /* After a failure the survivors form a generation of their own and complete a step first;
     * a rank that has no state yet (restarted while they regrouped) is admitted at the boundary
     * after it, so that losing a rank never waits for a replacement's start and state transfer.
     * A planned regroup, or too few survivors, takes everyone at once. */
    int fresh = count(c, is_fresh);
    int defer = c->formed_once && !c->regroup_sent && fresh > 0 && waiting - fresh >= need;
    member_t **list = ddp_calloc((size_t)waiting, sizeof *list);
    if (!list) return; /* the next tick tries again */
    int n = 0;
    for (member_t *m = c->members; m; m = m->next)
        if (!m->closing && is_waiting(m) && !(defer && is_fresh(m))) list[n++] = m;
    qsort(list, (size_t)n, sizeof *list, by_order);
    /* the source: the most steps, then the newest generation's state (a rank late for a
     * generation that redid its last step holds the same step number with another history) */
    long top = -1;
    unsigned long top_sgen = 0;
    int source = 0, behind = 0;
    for (int r = 0; r < n; r++)
        if (list[r]->step > top || (list[r]->step == top && list[r]->sgen > top_sgen)) {
            top = list[r]->step;
            top_sgen = list[r]->sgen;
            source = r;
        }
    for (int r = 0; r < n; r++) behind += !same_state(list[r], top, top_sgen);
    /* above every generation a member's state came from (a coordinator that restarted counts
     * on from what its members say) */
    if (c->max_sgen > c->gen) c->gen = c->max_sgen;
    c->gen++;
    c->phase = RUNNING;
    c->formed_once = 1;
    c->regroup_sent = 0;
    const char *why = c->why[0] ? c->why : "start";
    double reform_ms = c->reform_ns ? (double)(ddp_now_ns() - c->reform_ns) / 1e6 : 0;
    json_t *ranks = json_array(), *kept = json_array(); /* old ranks, while all have one */
    for (int r = 0; r < n && kept; r++)
        if (list[r]->rank < 0 || json_array_append_new(kept, json_integer(list[r]->rank))) {
            json_decref(kept);
            kept = NULL;
        }
    for (member_t *m = c->members; m; m = m->next)
        if (defer && !m->closing && is_fresh(m)) m->rank = -1; /* not in this generation */
    for (int r = 0; r < n; r++) {
        member_t *m = list[r];
        m->rank = r;
        m->waiting = 0;
        json_decref(m->ag);
        m->ag = NULL;
        json_array_append_new(ranks, json_integer(m->pid));
        send_to(m, json_pack("{s:s, s:I, s:i, s:i, s:i, s:b, s:I, s:b, s:s, s:f, s:f, s:O*}",
                             "t", "gen", "gen", (json_int_t)c->gen, "rank", r, "size", n,
                             "source", source, "sync", behind > 0 && top >= 0, "step",
                             (json_int_t)top, "receive", !same_state(m, top, top_sgen), "why",
                             why, "hb_timeout_s", c->cfg.hb_timeout_s, "reconnect_s",
                             c->cfg.rejoin_timeout_s, "kept", kept));
    }
    json_decref(kept);
    DDP_INFO("coordinator: generation %lu formed: %d member(s), state from rank %d (step %ld)%s; "
             "cause: %s", c->gen, n, source, top, behind && top >= 0 ? ", synced" : "", why);
    emit(c, json_pack("{s:s, s:I, s:i, s:o, s:i, s:I, s:s, s:f}", "event", "generation", "gen",
                      (json_int_t)c->gen, "size", n, "pids", ranks, "source", source, "step",
                      (json_int_t)top, "why", why, "reform_ms", reform_ms));
    c->why[0] = 0;
    c->reform_ns = 0;
    free(list);
    if (defer) { /* the deferred ranks' turn comes at the first boundary */
        snprintf(c->why, sizeof c->why, "%d restarted rank(s) join", fresh);
        send_all(c, json_pack("{s:s, s:I, s:s}", "t", "regroup", "gen", (json_int_t)c->gen,
                              "why", c->why), is_running);
        c->regroup_sent = 1;
        c->reform_ns = ddp_now_ns();
    }
}

/* Answers an allgather once every member of the running generation has contributed. */
static void try_allgather(ddpd_coord_t *c)
{
    int n = count(c, is_running);
    for (member_t *m = c->members; m; m = m->next)
        if (!m->closing && m->rank >= 0 && !m->ag) return;
    if (n == 0) return;
    json_t *all = json_array();
    for (int r = 0; r < n; r++)
        for (member_t *m = c->members; m; m = m->next)
            if (!m->closing && m->rank == r) json_array_append(all, m->ag);
    json_t *msg = json_pack("{s:s, s:I, s:o}", "t", "ag", "gen", (json_int_t)c->gen, "all", all);
    for (member_t *m = c->members; m; m = m->next) {
        if (m->closing || m->rank < 0) continue;
        json_decref(m->ag);
        m->ag = NULL;
        send_to(m, json_incref(msg));
    }
    json_decref(msg);
}

/* Adopting: the running generation cannot be taken over (a member is missing, died, or lost its
 * generation while the coordinator was away). Every member that came back aborts its generation
 * and joins again; the next generation's number is above all of theirs. */
static void abandon_adoption(ddpd_coord_t *c, const char *why)
{
    if (c->phase != ADOPTING) return;
    c->phase = FORMING;
    c->reform_ns = ddp_now_ns();
    snprintf(c->why, sizeof c->why, "%s", why);
    DDP_WARN("coordinator: the running generation cannot be adopted: %s; forming a new one", why);
    for (member_t *m = c->members; m; m = m->next) {
        if (m->closing || !m->rejoin_gen) continue;
        if (m->rejoin_gen > c->gen) c->gen = m->rejoin_gen;
        send_to(m, json_pack("{s:s, s:I, s:s}", "t", "reform", "gen", (json_int_t)m->rejoin_gen,
                             "why", why));
        m->rejoin_gen = 0;
    }
}

/* Adopting: takes generation G over once all its members are back and nobody else waits. */
static void try_adopt(ddpd_coord_t *c)
{
    if (c->phase != ADOPTING) return;
    unsigned long g = 0;
    int size = 0, back = 0;
    for (const member_t *m = c->members; m; m = m->next)
        if (!m->closing && m->rejoin_gen > g) {
            g = m->rejoin_gen;
            size = m->rejoin_size;
        }
    uint64_t seen = 0; /* ranks of g that are back (a bit each) */
    for (const member_t *m = c->members; m; m = m->next) {
        if (m->closing || !m->joined || m->done) continue;
        if (m->rejoin_gen != g || m->rejoin_size != size || m->rank < 0 || m->rank >= size ||
            m->rank >= 64 || (seen >> m->rank & 1)) {
            abandon_adoption(c, "the members that came back do not form one generation");
            return;
        }
        seen |= 1ULL << m->rank;
        back++;
    }
    if (g == 0 || back < size) return;
    c->gen = g;
    c->phase = RUNNING;
    c->formed_once = 1;
    send_all(c, json_pack("{s:s, s:I}", "t", "adopted", "gen", (json_int_t)g), is_running);
    json_t *pids = json_array();
    for (int r = 0; r < size; r++)
        for (const member_t *m = c->members; m; m = m->next)
            if (!m->closing && m->rank == r) json_array_append_new(pids, json_integer(m->pid));
    DDP_INFO("coordinator: adopted the running generation %lu: all %d member(s) came back", g,
             size);
    emit(c, json_pack("{s:s, s:I, s:i, s:o}", "event", "adopted", "gen", (json_int_t)g, "size",
                      size, "pids", pids));
}

/* A member of a running generation came back after the coordinator restarted. */
static void on_rejoin(ddpd_coord_t *c, member_t *m, json_t *msg)
{
    m->joined = 1;
    m->waiting = 0;
    m->pid = (long)json_integer_value(json_object_get(msg, "pid"));
    m->hint = (int)json_integer_value(json_object_get(msg, "hint"));
    m->step = (long)json_integer_value(json_object_get(msg, "step"));
    const char *hid = json_string_value(json_object_get(msg, "host_id"));
    snprintf(m->host_id, sizeof m->host_id, "%s", hid ? hid : "");
    emit(c, json_pack("{s:s, s:I, s:I}", "event", "join", "pid", (json_int_t)m->pid, "step",
                      (json_int_t)m->step));
    unsigned long g = (unsigned long)json_integer_value(json_object_get(msg, "gen"));
    if (c->phase != ADOPTING) {
        /* too late to adopt its generation: it ends there and the member joins again */
        if (g > c->gen && c->phase != RUNNING) c->gen = g;
        send_to(m, json_pack("{s:s, s:I, s:s}", "t", "reform", "gen", (json_int_t)g, "why",
                             "its generation was not adopted by the restarted coordinator"));
        return;
    }
    m->rejoin_gen = g ? g : 1;
    m->rejoin_size = (int)json_integer_value(json_object_get(msg, "size"));
    m->rank = (int)json_integer_value(json_object_get(msg, "rank"));
    try_adopt(c);
}

static void on_join(ddpd_coord_t *c, member_t *m, json_t *msg)
{
    int fresh = !m->joined;
    if (c->phase == ENDED) { /* a rank started again after the end: it has nothing to do */
        send_to(m, json_pack("{s:s, s:s, s:b}", "t", "exit", "why", c->end_why, "done", c->done));
        return;
    }
    if (fresh && count(c, is_member) >= c->cfg.max_workers) {
        send_to(m, json_pack("{s:s, s:s}", "t", "exit", "why",
                             "the job already has ddp.max_workers members"));
        m->closing = 1;
        uv_close((uv_handle_t *)&m->tcp, member_closed);
        return;
    }
    m->joined = 1;
    m->waiting = 1;
    if (c->phase == ADOPTING) abandon_adoption(c, "a worker asked to join");
    m->pid = (long)json_integer_value(json_object_get(msg, "pid"));
    m->hint = (int)json_integer_value(json_object_get(msg, "hint"));
    m->step = (long)json_integer_value(json_object_get(msg, "step"));
    m->sgen = (unsigned long)json_integer_value(json_object_get(msg, "sgen"));
    if (m->sgen > c->max_sgen) c->max_sgen = m->sgen;
    const char *hid = json_string_value(json_object_get(msg, "host_id"));
    snprintf(m->host_id, sizeof m->host_id, "%s", hid ? hid : "");
    emit(c, json_pack("{s:s, s:I, s:I}", "event", "join", "pid", (json_int_t)m->pid, "step",
                      (json_int_t)m->step));
    if (c->phase == RUNNING) {
        if (m->rank >= 0 && !c->regroup_sent) {
            /* a member left the running generation by itself: it saw a failure */
            end_generation(c, "rank %d reported a failed collective", m->rank);
        } else if (m->rank < 0 && !c->regroup_sent) {
            /* a joiner: the running members finish their step and come back for it */
            snprintf(c->why, sizeof c->why, "pid %ld joins", m->pid);
            send_all(c, json_pack("{s:s, s:I, s:s}", "t", "regroup", "gen", (json_int_t)c->gen,
                                  "why", c->why), is_running);
            c->regroup_sent = 1;
            c->reform_ns = ddp_now_ns();
        }
        if (c->phase == RUNNING && c->regroup_sent) {
            int still = 0; /* running members not back yet */
            for (member_t *o = c->members; o; o = o->next)
                if (!o->closing && o->rank >= 0 && !o->waiting) still++;
            if (still == 0) c->phase = FORMING;
        }
    }
    try_form(c);
}

static int on_message(member_t *m, json_t *msg);

static int on_line(void *arg, const char *line, size_t len)
{
    member_t *m = arg;
    json_t *msg = json_loadb(line, len, 0, NULL);
    if (!json_is_object(msg)) {
        json_decref(msg);
        evict(m->c, m, "sent a line that is not a JSON object", 1);
        return 1;
    }
    int stop = on_message(m, msg);
    json_decref(msg);
    return stop;
}

static int on_message(member_t *m, json_t *msg)
{
    ddpd_coord_t *c = m->c;
    m->last_heard_ns = ddp_now_ns();
    const char *t = json_string_value(json_object_get(msg, "t"));
    if (!t) t = "";
    if (!m->joined && !strcmp(t, "hb")) return 0; /* its first heartbeat may precede its join */
    if (!m->joined && strcmp(t, "join") != 0 && strcmp(t, "rejoin") != 0) {
        evict(c, m, "spoke before joining", 0);
        return 1;
    }
    if (!strcmp(t, "join") || !strcmp(t, "rejoin")) {
        const char *token = json_string_value(json_object_get(msg, "token"));
        if (!token || strcmp(token, c->token) != 0) { /* the same refusal for both */
            DDP_WARN("coordinator: refused %s: wrong job token", m->peer);
            send_to(m, json_pack("{s:s, s:s}", "t", "exit", "why", "wrong job token"));
            evict(c, m, "presented a wrong job token", 0);
            return 1;
        }
        if (t[0] == 'j')
            on_join(c, m, msg);
        else
            on_rejoin(c, m, msg);
    } else if (!strcmp(t, "hb")) {
        json_t *s = json_object_get(msg, "step");
        if (json_is_integer(s)) m->step = (long)json_integer_value(s);
    } else if (!strcmp(t, "ag")) {
        json_int_t g = json_integer_value(json_object_get(msg, "gen"));
        json_t *data = json_object_get(msg, "data");
        if ((unsigned long)g != c->gen || m->rank < 0 || c->phase != RUNNING) return 0; /* stale */
        if (!json_is_string(data) || m->ag) {
            evict(c, m, "sent a malformed allgather", 1);
            return 1;
        }
        m->ag = json_incref(data);
        try_allgather(c);
    } else if (!strcmp(t, "flight")) {
        json_t *d = json_object_get(msg, "dump");
        if (!json_is_object(d)) return 0; /* not worth an eviction: the diagnosis lacks it */
        json_decref(m->flight);
        m->flight = json_incref(d);
        char w[256];
        snprintf(w, sizeof w, "rank %d (pid %ld) sent a flight recorder dump (%s)", m->rank,
                 m->pid, json_string_value(json_object_get(d, "trigger")) ?: "?");
        flight_collect(c, w);
        flight_check(c);
    } else if (!strcmp(t, "done")) {
        m->done = 1;
        m->step = (long)json_integer_value(json_object_get(msg, "step"));
        check_done(c);
    } else {
        evict(c, m, "sent an unknown message", 1);
        return 1;
    }
    return m->closing;
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    member_t *m = s->data;
    ddpd_coord_t *c = m->c;
    if (n < 0) {
        free(b->base);
        if (m->closing) return;
        if (m->done || !m->joined || c->phase == ENDED) {
            m->closing = 1; /* a finished member exits; a stranger went away */
            uv_close((uv_handle_t *)&m->tcp, member_closed);
        } else {
            evict(c, m, n == UV_EOF ? "died (its connection closed)" : "lost its connection", 0);
        }
        try_form(c);
        return;
    }
    if (n > 0 && ddpd_lines_feed(&m->in, b->base, (size_t)n, DDP_ELASTIC_MAX_LINE, on_line, m) < 0)
        evict(c, m, "sent a line that is too long", 1);
    free(b->base);
    if (c->phase == FORMING) try_form(c);
}

static void on_accept(uv_stream_t *server, int status)
{
    ddpd_coord_t *c = server->data;
    if (status < 0 || c->closing) return;
    member_t *m = ddp_calloc(1, sizeof *m);
    if (!m) return;
    m->c = c;
    m->rank = -1;
    m->step = -1;
    m->seq = c->next_seq++;
    m->last_heard_ns = ddp_now_ns();
    uv_tcp_init(c->loop, &m->tcp);
    m->tcp.data = m;
    c->handles++;
    m->next = c->members;
    c->members = m;
    if (uv_accept(server, (uv_stream_t *)&m->tcp) != 0) {
        m->closing = 1;
        uv_close((uv_handle_t *)&m->tcp, member_closed);
        return;
    }
    uv_tcp_nodelay(&m->tcp, 1);
    struct sockaddr_storage ss;
    int len = sizeof ss;
    if (uv_tcp_getpeername(&m->tcp, (struct sockaddr *)&ss, &len) == 0)
        uv_ip_name((struct sockaddr *)&ss, m->peer, sizeof m->peer);
    uv_read_start((uv_stream_t *)&m->tcp, ddpd_lines_alloc, on_read);
}

/* Evicts members that stopped answering and fails the job below min_workers for too long. */
static void on_tick(uv_timer_t *t)
{
    ddpd_coord_t *c = t->data;
    if (c->phase == ENDED) return;
    int64_t now = ddp_now_ns(), silence = (int64_t)(c->cfg.hb_timeout_s * 1e9);
    if (now - c->last_hb_ns >= DDP_ELASTIC_HB_MS * 1000000LL) {
        /* members hear from the coordinator too: one cut off from it stops by itself */
        c->last_hb_ns = now;
        send_all(c, json_pack("{s:s}", "t", "hb"), is_member);
    }
    for (member_t *m = c->members; m; m = m->next) {
        if (m->closing || m->done) continue;
        if (now - m->last_heard_ns > silence) {
            char why[96];
            snprintf(why, sizeof why, "stopped answering (no heartbeat for %.1f s)",
                     (double)(now - m->last_heard_ns) / 1e9);
            evict(c, m, why, 1);
        }
    }
    flight_check(c);
    if (c->phase == ADOPTING && now > c->adopt_end_ns)
        abandon_adoption(c, "not every member of the running generation came back within "
                            "ddp.heartbeat_timeout_s");
    if (c->below_min_ns && now - c->below_min_ns > (int64_t)(c->cfg.rejoin_timeout_s * 1e9)) {
        char why[512];
        snprintf(why, sizeof why,
                 "%d member(s) left, below ddp.min_workers = %d, and no replacement joined within "
                 "ddp.rejoin_timeout_s = %.0f s (last cause: %s)",
                 count(c, is_member), c->cfg.min_workers, c->cfg.rejoin_timeout_s, c->why);
        end_job(c, why);
        return;
    }
    try_form(c);
}

static void handle_closed(uv_handle_t *h)
{
    ddpd_coord_t *c = h->data;
    c->handles--;
    maybe_free(c);
}

int ddpd_coord_new(uv_loop_t *loop, const ddpd_coord_cfg_t *cfg, ddpd_coord_t **out,
                   ddp_errinfo_t *ei)
{
    if (!loop || !cfg || !cfg->token || strlen(cfg->token) >= 128 || cfg->world < 1 ||
        cfg->min_workers < 1 || cfg->min_workers > cfg->world || cfg->max_workers < cfg->world)
        return ddp_errinfo_set(ei, DDP_EINVAL,
                               "coordinator: need a token and 1 <= min_workers <= world <= "
                               "max_workers");
    ddpd_coord_t *c = ddp_calloc(1, sizeof *c);
    if (!c) return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    c->loop = loop;
    c->cfg = *cfg;
    if (c->cfg.hb_timeout_s <= 0) c->cfg.hb_timeout_s = 5;
    if (c->cfg.rejoin_timeout_s <= 0) c->cfg.rejoin_timeout_s = 60;
    snprintf(c->token, sizeof c->token, "%s", cfg->token);
    c->cfg.token = c->token;
    ddp_host_id(c->host_id, sizeof c->host_id);
    struct sockaddr_storage addr;
    const char *host = cfg->host && *cfg->host ? cfg->host : "0.0.0.0";
    int rc = strchr(host, ':') ? uv_ip6_addr(host, cfg->port, (struct sockaddr_in6 *)&addr)
                               : uv_ip4_addr(host, cfg->port, (struct sockaddr_in *)&addr);
    if (rc) {
        free(c);
        return ddp_errinfo_set(ei, DDP_EINVAL, "coordinator: bad listen address %s", host);
    }
    uv_tcp_init(loop, &c->listener);
    c->listener.data = c;
    c->handles++;
    rc = uv_tcp_bind(&c->listener, (struct sockaddr *)&addr, 0);
    if (rc == 0) rc = uv_listen((uv_stream_t *)&c->listener, SOMAXCONN, on_accept);
    if (rc) {
        c->closing = 1;
        uv_close((uv_handle_t *)&c->listener, handle_closed);
        return ddp_errinfo_set(ei, rc, "coordinator: cannot listen on %s:%d: %s", host, cfg->port,
                               uv_strerror(rc));
    }
    struct sockaddr_storage bound;
    int blen = sizeof bound;
    uv_tcp_getsockname(&c->listener, (struct sockaddr *)&bound, &blen);
    c->port = ntohs(((struct sockaddr_in *)&bound)->sin_port);
    uv_timer_init(loop, &c->tick);
    c->tick.data = c;
    c->handles++;
    if (cfg->adopt) {
        c->phase = ADOPTING;
        c->gen = cfg->last_gen;
        c->formed_once = 1;
        c->adopt_end_ns = ddp_now_ns() + (int64_t)(c->cfg.hb_timeout_s * 1e9);
    } else {
        c->phase = FORMING;
    }
    uv_timer_start(&c->tick, on_tick, 100, 100);
    *out = c;
    return 0;
}

int ddpd_coord_port(const ddpd_coord_t *c) { return c->port; }
unsigned long ddpd_coord_generation(const ddpd_coord_t *c) { return c->gen; }

void ddpd_coord_close(ddpd_coord_t *c)
{
    if (!c || c->closing) return;
    c->closing = 1;
    c->phase = ENDED;
    for (member_t *m = c->members; m; m = m->next)
        if (!m->closing) {
            m->closing = 1;
            uv_close((uv_handle_t *)&m->tcp, member_closed);
        }
    uv_close((uv_handle_t *)&c->listener, handle_closed);
    uv_close((uv_handle_t *)&c->tick, handle_closed);
}
