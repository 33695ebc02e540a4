/* The API's methods. Each handler validates its params (-32602 with data {path, expected}),
 * does its work and answers exactly once, either at once or, for the streaming methods, when
 * the stream ends.
 *
 *   job.submit  {spec: string|object | path: string, cwd?, name?, workers?, origin?}
 *                 -> {id, name, state, world, run_dir}  errors 1001 1005 1006 1007 1008 1010
 *                 origin names an inline spec in error messages (the file it was read from);
 *                 a spec error's message reads "ORIGIN:LINE:COLUMN: FIELD.PATH: what is wrong";
 *                 the params are checked here, the rest is submit.c's (off the loop)
 *   job.list    {state?, limit?}        -> {jobs: [...]}   (the caller's own; all for root and
 *                                                           admin_group)
 *   job.get     {id}                    -> job + transitions (+ progress)  errors 1002 1003
 *   job.cancel  {id}                    -> {id, state}                 errors 1002 1003 1004
 *   job.dump    {id}  -> {id, run_dir, signalled, local, world, since_ns}  errors 1003 1004
 *                 SIGUSR2 to the job's ranks on this node: each writes its flight recorder dump
 *   job.logs    {id, rank?=0, follow?=false, offset?=0}
 *                 notifications job.log {id, job, rank, data}; result {job, rank, bytes, end}
 *                                                                  errors 1002 1003 1009
 *   job.watch   {id}   notifications job.progress {id, job:{state, step, steps, loss,
 *                 tokens_per_s, eta_s, ...}}; result = the final job record  errors 1002 1003
 * 1003: another user's job; only its owner, root and admin_group see, follow or cancel it.
 *   stream.cancel {id} ends one of this connection's streams (result end: "cancelled")
 *   node.list   {}  -> {nodes: [{name, addr, self, up, slots, free}]}
 *   daemon.status {} -> {version, node, pid, uptime_s, slots, slots_used, jobs, ...}
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/methods.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "daemon/job.h"
#include "daemon/job_view.h"
#include "daemon/link.h"
#include "daemon/remote.h"
#include "daemon/rpc.h"
#include "daemon/sched.h"
#include "daemon/slots.h"
#include "daemon/submit.h"
#include "daemon/userfs.h"
#include "proto/spec.h"

/* ---- param helpers: each returns 0, or sends -32602 and returns -1 ---- */

static int bad_param(ddpd_session_t *s, json_t *id, const char *key, const char *expected)
{
    ddpd__send_error(s, id, DDPD_RPC_PARAMS,
                     json_pack("{ss ss}", "path", key, "expected", expected),
                     "params.%s must be %s", key, expected);
    return -1;
}

static int p_int(ddpd_session_t *s, json_t *id, json_t *params, const char *key, int required,
                 long long lo, long long hi, long long *out)
{
    json_t *v = params ? json_object_get(params, key) : NULL;
    if (!v || json_is_null(v)) {
        if (!required) return 0;
        char exp[96];
        snprintf(exp, sizeof exp, "an integer (required)");
        return bad_param(s, id, key, exp);
    }
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        char exp[96];
        snprintf(exp, sizeof exp, "an integer in %lld..%lld", lo, hi);
        return bad_param(s, id, key, exp);
    }
    *out = json_integer_value(v);
    return 0;
}

static int p_str(ddpd_session_t *s, json_t *id, json_t *params, const char *key,
                 const char **out)
{
    json_t *v = params ? json_object_get(params, key) : NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v)) return bad_param(s, id, key, "a string");
    *out = json_string_value(v);
    return 0;
}

static int p_bool(ddpd_session_t *s, json_t *id, json_t *params, const char *key, int *out)
{
    json_t *v = params ? json_object_get(params, key) : NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_boolean(v)) return bad_param(s, id, key, "true or false");
    *out = json_is_true(v);
    return 0;
}

static void reply(ddpd_session_t *s, json_t *id, json_t *result)
{
    if (id)
        ddpd__send(s, ddpd_rpc_result(id, result));
    else
        json_decref(result);
}

/* ---- job.submit (submit.c does the work) ---- */

static void m_submit(ddpd_session_t *s, json_t *id, json_t *params)
{
    const char *path = NULL, *cwd = NULL, *name = NULL, *spec_origin = NULL;
    long long workers = 0;
    if (p_str(s, id, params, "path", &path) || p_str(s, id, params, "cwd", &cwd) ||
        p_str(s, id, params, "name", &name) || p_str(s, id, params, "origin", &spec_origin) ||
        p_int(s, id, params, "workers", 0, 1, 4096, &workers))
        return;
    json_t *spec = params ? json_object_get(params, "spec") : NULL;
    if (spec && json_is_null(spec)) spec = NULL;
    if (spec && !json_is_string(spec) && !json_is_object(spec)) {
        bad_param(s, id, "spec", "a string (YAML or JSON text) or an object");
        return;
    }
    if (!!spec == !!path) {
        bad_param(s, id, spec ? "path" : "spec", "exactly one of spec and path");
        return;
    }
    if (cwd && (cwd[0] != '/' || strlen(cwd) >= PATH_MAX)) {
        bad_param(s, id, "cwd", "an absolute path");
        return;
    }
    /* the name becomes a word in the daemon's log, the status page and the run's records */
    if (name && *name && !ddp_spec_name_ok(name)) {
        bad_param(s, id, "name", "a job name: letters, digits, '-', '_' and '.', starting with a "
                                 "letter or digit, at most 127 bytes");
        return;
    }
    ddpd__submit(s, id, path, cwd, name, spec_origin, (int)workers, spec);
}

/* ---- job.list / job.get ---- */

static void add_live(ddpd_t *d, json_t *row)
{
    ddpd_job_t *j = ddpd_job_find(d, json_integer_value(json_object_get(row, "id")));
    if (!j || ddpd_state_terminal(ddpd_job_state(j))) return;
    json_t *p = ddpd_job_progress(j);
    json_t *v;
    if ((v = json_object_get(p, "step"))) json_object_set(row, "step", v);
    if ((v = json_object_get(p, "steps"))) json_object_set(row, "steps", v);
    if ((v = json_object_get(p, "loss"))) json_object_set(row, "loss", v);
    if ((v = json_object_get(p, "tokens_per_s"))) json_object_set(row, "tokens_per_s", v);
    if ((v = json_object_get(p, "eta_s"))) json_object_set(row, "eta_s", v);
    json_decref(p);
}

static const char *const states[] = {"queued", "starting", "running", "succeeded",
                                     "failed", "cancelled", NULL};

static void m_list(ddpd_session_t *s, json_t *id, json_t *params)
{
    const char *state = NULL;
    long long limit = 0;
    if (p_str(s, id, params, "state", &state) ||
        p_int(s, id, params, "limit", 0, 0, 1000000, &limit))
        return;
    if (state) {
        int ok = 0;
        for (int i = 0; states[i]; i++) ok |= !strcmp(states[i], state);
        if (!ok) {
            bad_param(s, id, "state", "one of queued, starting, running, succeeded, failed, "
                                      "cancelled");
            return;
        }
    }
    json_t *arr;
    /* a user sees their own jobs; root and the admin group see everyone's */
    if (ddpd_store_job_list(s->d->store, state, s->admin ? -1 : (int64_t)s->uid, (int)limit,
                            &arr) != 0) {
        ddpd__send_error(s, id, DDPD_RPC_STORE, NULL, "the job store failed (see daemon log)");
        return;
    }
    size_t i;
    json_t *row;
    json_array_foreach(arr, i, row) add_live(s->d, row);
    reply(s, id, json_pack("{so}", "jobs", arr));
}

/* Says that job jid is another user's (1003): its id exists (ids are sequential, so that is no
 * secret), but nothing of it is shown: not its name, owner, spec, paths or logs. */
static void not_yours(ddpd_session_t *s, json_t *id, long long jid)
{
    ddpd__send_error(s, id, DDPD_RPC_DENIED, json_pack("{sI}", "id", (json_int_t)jid),
                     "job %lld is another user's: only its owner, root and the members of "
                     "admin_group may see or cancel it", jid);
}

/* The store's record of job jid when the session may see it; otherwise the error is sent and
 * -1 returned. */
static int get_job_row(ddpd_session_t *s, json_t *id, long long jid, int with_spec, json_t **out)
{
    int rc = ddpd_store_job_get(s->d->store, jid, with_spec, out);
    if (rc == DDP_ENOTFOUND) {
        ddpd__send_error(s, id, DDPD_RPC_NOT_FOUND, json_pack("{sI}", "id", (json_int_t)jid),
                         "no job %lld", jid);
        return -1;
    }
    if (rc != 0) {
        ddpd__send_error(s, id, DDPD_RPC_STORE, NULL, "the job store failed (see daemon log)");
        return -1;
    }
    if (!ddpd__session_may_see(s, (uint32_t)json_integer_value(json_object_get(*out, "uid")))) {
        json_decref(*out);
        *out = NULL;
        not_yours(s, id, jid);
        return -1;
    }
    return 0;
}

static void m_get(ddpd_session_t *s, json_t *id, json_t *params)
{
    long long jid;
    if (p_int(s, id, params, "id", 1, 1, INT64_MAX, &jid)) return;
    json_t *row;
    if (get_job_row(s, id, jid, 1, &row)) return;
    ddpd_job_t *j = ddpd_job_find(s->d, jid);
    if (j && !ddpd_state_terminal(ddpd_job_state(j)))
        json_object_set_new(row, "progress", ddpd_job_progress(j));
    reply(s, id, row);
}

/* The job named by params' "id", for a method that acts on a running job (job.cancel, job.dump):
 * returns 0 with *jid and *live, the job when it runs on this node and this session may see it
 * (NULL when it has ended or is not here: the caller answers), or -1 with the error sent (a bad
 * id, another user's job). */
static int find_live_job(ddpd_session_t *s, json_t *id, json_t *params, long long *jid,
                         ddpd_job_t **live)
{
    *live = NULL;
    if (p_int(s, id, params, "id", 1, 1, INT64_MAX, jid)) return -1;
    ddpd_job_t *j = ddpd_job_find(s->d, *jid);
    if (j && !ddpd__session_may_see(s, ddpd_job_uid(j))) {
        not_yours(s, id, *jid);
        return -1;
    }
    if (j && !ddpd_state_terminal(ddpd_job_state(j))) *live = j;
    return 0;
}

static void m_cancel(ddpd_session_t *s, json_t *id, json_t *params)
{
    long long jid;
    ddpd_job_t *j;
    if (find_live_job(s, id, params, &jid, &j)) return;
    if (!j) {
        json_t *row;
        if (get_job_row(s, id, jid, 0, &row)) return;
        ddpd__send_error(s, id, DDPD_RPC_FINISHED,
                         json_pack("{sI sO}", "id", (json_int_t)jid, "state",
                                   json_object_get(row, "state")),
                         "job %lld already ended (%s)", jid,
                         json_string_value(json_object_get(row, "state")));
        json_decref(row);
        return;
    }
    ddpd_job_cancel(j, s->uid);
    reply(s, id,
          json_pack("{sI ss}", "id", (json_int_t)jid, "state", ddpd_state_name(ddpd_job_state(j))));
}

/* job.dump: every live rank of the job on this node gets SIGUSR2 and writes its flight recorder
 * dump to RUN_DIR/flight/rank-R.json from its dump thread (collectives/flight.h); the answer
 * says how many were asked and since when (CLOCK_MONOTONIC ns, this host's: each dump carries its
 * "now_ns"), so that the client waits for those files and diagnoses them (`ddpctl dump`). */
static void m_dump(ddpd_session_t *s, json_t *id, json_t *params)
{
    long long jid;
    ddpd_job_t *j;
    if (find_live_job(s, id, params, &jid, &j)) return;
    if (!j) {
        ddpd__send_error(s, id, DDPD_RPC_FINISHED, json_pack("{sI}", "id", (json_int_t)jid),
                         "job %lld is not running: its ranks cannot dump (the files of earlier "
                         "dumps stay in its run directory's flight/)", jid);
        return;
    }
    int64_t since = ddp_now_ns();
    int n = ddpd_job_signal_local(j, SIGUSR2);
    int remote = ddpd_job_signal_peers(j, SIGUSR2); /* they dump on their own hosts */
    DDP_INFO("job %lld: flight recorder dump requested of %d local rank(s) and %d elsewhere", jid,
             n, remote);
    reply(s, id, json_pack("{sI ss si si si si sb sI}", "id", (json_int_t)jid, "run_dir",
                           ddpd_job_run_dir(j), "signalled", n, "local", ddpd_job_local_ranks(j),
                           "remote", remote, "world", ddpd_job_world(j), "coordinated",
                           ddpd_job_coordinated(j), "since_ns", (json_int_t)since));
}

/* ---- streams ---- */

static ddpd_stream_t *stream_new(ddpd_session_t *s, json_t *id, ddpd_stream_kind_t kind,
                                 int64_t job)
{
    ddpd_stream_t *st = ddp_calloc(1, sizeof *st);
    if (!st) {
        ddpd__send_error(s, id, DDPD_RPC_INTERNAL, NULL, "out of memory");
        return NULL;
    }
    st->kind = kind;
    st->job = job;
    st->req_id = id ? json_incref(id) : json_null();
    st->next = s->streams;
    s->streams = st;
    return st;
}

static void m_logs(ddpd_session_t *s, json_t *id, json_t *params)
{
    long long jid, rank = 0, off = 0;
    int follow = 0;
    if (p_int(s, id, params, "id", 1, 1, INT64_MAX, &jid) ||
        p_int(s, id, params, "rank", 0, 0, 1 << 20, &rank) ||
        p_int(s, id, params, "offset", 0, 0, INT64_MAX, &off) ||
        p_bool(s, id, params, "follow", &follow))
        return;
    json_t *row;
    if (get_job_row(s, id, jid, 0, &row)) return;
    int world = (int)json_integer_value(json_object_get(row, "world"));
    char run_dir[PATH_MAX];
    snprintf(run_dir, sizeof run_dir, "%s", json_string_value(json_object_get(row, "run_dir")));
    uint32_t owner = (uint32_t)json_integer_value(json_object_get(row, "uid"));
    json_decref(row);
    if (rank >= world) {
        bad_param(s, id, "rank", "a rank of the job (0..world-1)");
        return;
    }
    ddpd_job_t *j = ddpd_job_find(s->d, jid);
    int peer = j ? ddpd_job_rank_peer(j, (int)rank) : -1;
    if (peer >= 0) {
        const char *node = ddpd_peers_name(s->d, peer);
        ddpd__send_error(s, id, DDPD_RPC_NO_LOG, json_pack("{ss}", "node", node),
                         "rank %lld runs on node %s; its log is in that node's run directory",
                         rank, node);
        return;
    }
    ddpd_stream_t *st = stream_new(s, id, DDPD_STREAM_LOGS, jid);
    if (!st) return;
    st->rank = (int)rank;
    st->follow = follow;
    st->off = off;
    st->owner = owner;
    snprintf(st->path, sizeof st->path, "%s", run_dir);
    ddpd__service_logs(s);
}

/* Reads what is new in each log stream (bounded per call so one big log cannot stall the loop
 * or fill memory: 256 KiB per stream per tick, and only while the client keeps up). The log is
 * opened as userfs.h says: a regular file of the job's user, never through a symlink or a FIFO
 * the user put in its place. */
void ddpd__service_logs(ddpd_session_t *s)
{
    for (ddpd_stream_t *st = s->streams, *next; st; st = next) {
        next = st->next;
        if (st->kind != DDPD_STREAM_LOGS || s->closing) continue;
        if (s->pipe.write_queue_size > (1u << 20)) continue;
        ddpd_job_t *j = ddpd_job_find(s->d, st->job);
        int active = j && !ddpd_state_terminal(ddpd_job_state(j));
        char name[32], why[256];
        snprintf(name, sizeof name, "rank-%d.log", st->rank);
        int fd = ddpd_userfile_open_in(st->path, name, st->owner, why, sizeof why);
        if (fd < 0 && fd != -ENOENT && !st->refused) {
            st->refused = 1;
            DDP_WARN("job %lld: its log not read: %s", (long long)st->job, why);
        }
        int eof = 1;
        if (fd >= 0) {
            char buf[65536];
            for (int k = 0; k < 4; k++) {
                ssize_t n = pread(fd, buf, sizeof buf, st->off);
                if (n <= 0) break;
                size_t held = 0;
                json_t *text = ddpd_rpc_text(buf, (size_t)n, n == (ssize_t)sizeof buf, &held);
                st->off += n - (ssize_t)held;
                if (!text) break;
                ddpd__send(s, ddpd_rpc_notify(
                                  "job.log", json_pack("{sO sI si so}", "id", st->req_id, "job",
                                                       (json_int_t)st->job, "rank", st->rank,
                                                       "data", text)));
                if (n < (ssize_t)sizeof buf) break;
                eof = 0;
            }
            close(fd);
        }
        if (!eof) continue;
        if (st->follow && active) continue;
        json_t *res = json_pack("{sI si sI ss}", "job", (json_int_t)st->job, "rank", st->rank,
                                "bytes", (json_int_t)st->off, "end",
                                st->follow ? "job_ended" : "eof");
        if (fd == -ENOENT) json_object_set_new(res, "missing", json_true());
        if (fd < 0 && fd != -ENOENT) json_object_set_new(res, "refused", json_string(why));
        ddpd__stream_end(s, st, res);
    }
}

static json_t *final_record(ddpd_t *d, int64_t jid)
{
    json_t *row = NULL;
    if (ddpd_store_job_get(d->store, jid, 0, &row) != 0) return json_pack("{sI}", "id", (json_int_t)jid);
    return row;
}

void ddpd__watch_event(ddpd_session_t *s, ddpd_job_t *j)
{
    for (ddpd_stream_t *st = s->streams, *next; st; st = next) {
        next = st->next;
        if (st->kind != DDPD_STREAM_WATCH || st->job != ddpd_job_id(j)) continue;
        ddpd__send(s, ddpd_rpc_notify("job.progress", json_pack("{sO so}", "id", st->req_id, "job",
                                                                ddpd_job_progress(j))));
        if (ddpd_state_terminal(ddpd_job_state(j)))
            ddpd__stream_end(s, st, final_record(s->d, ddpd_job_id(j)));
    }
}

static void m_watch(ddpd_session_t *s, json_t *id, json_t *params)
{
    long long jid;
    if (p_int(s, id, params, "id", 1, 1, INT64_MAX, &jid)) return;
    ddpd_job_t *j = ddpd_job_find(s->d, jid);
    if (!j || ddpd_state_terminal(ddpd_job_state(j))) {
        json_t *row;
        if (get_job_row(s, id, jid, 0, &row)) return;
        reply(s, id, row);
        return;
    }
    if (!ddpd__session_may_see(s, ddpd_job_uid(j))) {
        not_yours(s, id, jid);
        return;
    }
    ddpd_stream_t *st = stream_new(s, id, DDPD_STREAM_WATCH, jid);
    if (st) ddpd__watch_event(s, j);
}

static void m_stream_cancel(ddpd_session_t *s, json_t *id, json_t *params)
{
    json_t *sid = params ? json_object_get(params, "id") : NULL;
    if (!sid || (!json_is_integer(sid) && !json_is_string(sid))) {
        bad_param(s, id, "id", "the id of a streaming request on this connection");
        return;
    }
    for (ddpd_stream_t *st = s->streams; st; st = st->next)
        if (json_equal(st->req_id, sid)) {
            ddpd__stream_end(s, st, json_pack("{ss}", "end", "cancelled"));
            reply(s, id, json_pack("{sb}", "cancelled", 1));
            return;
        }
    reply(s, id, json_pack("{sb}", "cancelled", 0));
}

/* ---- node.list / daemon.status ---- */

static void m_nodes(ddpd_session_t *s, json_t *id, json_t *params)
{
    (void)params;
    reply(s, id, json_pack("{so}", "nodes", ddpd_peers_nodes(s->d)));
}

static void m_status(ddpd_session_t *s, json_t *id, json_t *params)
{
    (void)params;
    ddpd_t *d = s->d;
    json_t *counts = NULL;
    if (ddpd_store_job_counts(d->store, &counts) != 0) counts = json_object();
    int active = 0, queued = 0;
    for (ddpd_job_t *j = ddpd_job_first(d); j; j = ddpd_job_next(j)) {
        if (ddpd_state_terminal(ddpd_job_state(j))) continue;
        if (ddpd_job_state(j) == DDPD_QUEUED)
            queued++;
        else
            active++;
    }
    int up = 0;
    for (int i = 0; i < ddpd_peers_count(d); i++) up += ddpd_peers_up(d, i);
    json_t *o = json_pack(
        "{ss ss si sf ss ss ss ss ss si si si si si si so si si}", "version", DDPD_VERSION,
        "node", d->cfg.node_name, "pid", (int)getpid(), "uptime_s",
        (double)(ddp_wall_ms() - d->start_ms) / 1000.0, "socket", d->cfg.socket_path, "listen",
        d->cfg.listen, "state_dir", d->cfg.state_dir, "run_dir", d->cfg.run_dir, "worker_bin",
        d->cfg.worker_bin, "slots", d->cfg.slots, "slots_used", ddpd_slots_used(d), "capacity",
        ddpd_sched_capacity(d), "running", active, "queued", queued, "guest_ranks",
        ddpd_remote_guest_ranks(d), "jobs", counts, "peers", ddpd_peers_count(d), "peers_up", up);
    json_object_set_new(o, "sessions", json_integer(d->api ? d->api->n_sessions : 0));
    json_object_set_new(o, "stopping", json_boolean(d->stopping));
    reply(s, id, o);
}

typedef void (*handler_fn)(ddpd_session_t *s, json_t *id, json_t *params);

static const struct {
    const char *name;
    handler_fn fn;
} methods[] = {
    {"job.submit", m_submit}, {"job.list", m_list},       {"job.get", m_get},
    {"job.cancel", m_cancel}, {"job.logs", m_logs},       {"job.watch", m_watch},
    {"node.list", m_nodes},   {"daemon.status", m_status}, {"stream.cancel", m_stream_cancel},
    {"job.dump", m_dump},     {NULL, NULL}};

void ddpd__dispatch(ddpd_session_t *s, json_t *id, const char *method, json_t *params)
{
    for (int i = 0; methods[i].name; i++)
        if (!strcmp(methods[i].name, method)) {
            methods[i].fn(s, id, params);
            return;
        }
    char list[512] = "";
    size_t n = 0;
    for (int i = 0; methods[i].name; i++)
        n += (size_t)snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", methods[i].name);
    ddpd__send_error(s, id, DDPD_RPC_METHOD, json_pack("{ss}", "method", method),
                     "unknown method '%.100s'; known: %s", method, list);
}
