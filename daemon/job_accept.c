/* Jobs come into being here: submitted (the spec validated, stored and queued), re-queued
 * after a daemon restart, or adopted running after one (their ranks trained on meanwhile).
 * One of the job module's three files (see job_int.h): admission, apart from the lifecycle in
 * job.c, whose internals it builds on; nothing in job.c calls back here.
 * Loop thread only.
 */
#include "daemon/job_int.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "daemon/coord.h"
#include "daemon/exec_rank.h"
#include "daemon/slots.h"
#include "daemon/userfs.h"
#include "proto/spec.h"

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

/* The job's run directory, the user's and private (userfs.h: never through a link). A job
 * whose directory cannot be made fails when it starts (job.json cannot be written there). */
static void make_run_dir(ddpd_job_t *j)
{
    char why[512];
    if (ddpd_rundir_make(j->run_dir, j->uid, j->gid, why, sizeof why) != 0)
        DDP_WARN("job %lld: %s", (long long)j->id, why);
}

static int set_groups(ddpd_job_t *j, const uint32_t *groups, int n)
{
    j->groups = n ? ddp_malloc((size_t)n * sizeof *groups) : NULL;
    if (n && !j->groups) return DDP_ENOMEM;
    if (n) memcpy(j->groups, groups, (size_t)n * sizeof *groups);
    j->n_groups = n;
    return 0;
}

int ddpd_job_submit(ddpd_t *d, const ddpd_submit_t *sub, ddpd_job_t **out, ddp_errinfo_t *ei)
{
    *out = NULL;
    if (d->stopping) return ddp_errinfo_set(ei, DDP_EABORTED, "the daemon is shutting down");
    ddp_spec_t *spec = sub->spec;
    if (sub->n_groups > DDPD_MAX_GROUPS)
        return ddp_errinfo_set(ei, DDP_EQUOTA, "uid %u has %d supplementary groups; ddpd runs "
                               "jobs with at most %d", sub->uid, sub->n_groups, DDPD_MAX_GROUPS);
    ddpd_quota_t q;
    ddpd_config_quota(&d->cfg, sub->uid, &q);
    int queued = ddpd_job_queued_of(d, sub->uid);
    if (q.queued_jobs > 0 && queued >= q.queued_jobs)
        return ddp_errinfo_set(ei, DDP_EQUOTA, "uid %u already has %d job(s) queued here, its "
                               "quota (quotas.queued_jobs in ddpd.yaml); wait for some to start "
                               "or cancel some", sub->uid, queued);
    if (ddpd_store_full(d->store))
        return ddp_errinfo_set(ei, DDP_ESQL, "the filesystem of the state directory %s is full: "
                               "no new job is taken until it has room (running jobs go on and "
                               "their records are kept)", d->cfg.state_dir);
    if (sub->workers > 0) {
        /* --workers N sets the job's size; the elastic range follows it where it must */
        spec->workers = sub->workers;
        if (spec->max_workers < spec->workers) spec->max_workers = spec->workers;
        if (spec->min_workers > spec->workers) spec->min_workers = spec->workers;
    }
    if (sub->name && *sub->name) snprintf(spec->name, sizeof spec->name, "%s", sub->name);
    if (spec->workers < 1) spec->workers = 1;
    int cap = sub->capacity, rc;
    if (q.running_ranks > 0 && spec->workers > q.running_ranks) {
        rc = ddp_errinfo_set(ei, DDP_EQUOTA, "the job needs %d ranks, more than uid %u may run at "
                             "once here (quotas.running_ranks = %ld)", spec->workers, sub->uid,
                             q.running_ranks);
        ddp_errinfo_path(ei, "ddp.workers");
        return rc;
    }
    if (spec->workers > cap) {
        rc = ddp_errinfo_set(ei, DDP_EBUSY,
                             "the job needs %d ranks but the cluster has %d slots (this node "
                             "%d); lower ddp.workers or add slots/peers",
                             spec->workers, cap, d->cfg.slots);
        ddp_errinfo_path(ei, "ddp.workers");
        return rc;
    }
    ddpd_job_t *j;
    if ((rc = ddpd__job_new(d, &j)) != 0) return ddp_errinfo_set(ei, rc, "out of memory");
    j->spec_json = ddp_spec_to_json(spec);
    snprintf(j->name, sizeof j->name, "%s", spec->name[0] ? spec->name : "job");
    take_spec(j, spec);
    if (ddp_spec_warning(spec, j->warning, sizeof j->warning))
        DDP_WARN("job %lld (%s): %s", (long long)j->id, j->name, j->warning);
    j->uid = sub->uid;
    j->gid = sub->gid;
    snprintf(j->cwd, sizeof j->cwd, "%s", sub->cwd ? sub->cwd : "");
    ddpd_random_hex(j->token, 32);
    j->submitted_ms = ddp_wall_ms();
    ddpd_jobrec_t rec = {.name = j->name,
                         .uid = j->uid,
                         .gid = j->gid,
                         .groups = sub->groups,
                         .n_groups = sub->n_groups,
                         .world = j->world,
                         .spec_json = j->spec_json ? j->spec_json : "{}",
                         .run_dir = d->cfg.run_dir,
                         .cwd = j->cwd,
                         .token = j->token,
                         .submitted_ms = j->submitted_ms};
    if (!j->spec_json || set_groups(j, sub->groups, sub->n_groups) != 0 ||
        (rc = ddpd_store_job_insert(d->store, &rec, &j->id)) != 0) {
        rc = rc ? rc : DDP_ENOMEM;
        if (rc == -ENOSPC)
            rc = ddp_errinfo_set(ei, DDP_ESQL, "the filesystem of the state directory %s is full: "
                                 "no new job is taken until it has room", d->cfg.state_dir);
        else
            ddp_errinfo_set(ei, rc, "cannot record the job: %s (see the daemon's log)",
                            ddp_strerror(rc));
        ddpd__job_discard(j);
        return rc;
    }
    snprintf(j->run_dir, sizeof j->run_dir, "%.4000s/job-%lld", d->cfg.run_dir, (long long)j->id);
    make_run_dir(j);
    snprintf(j->reason, sizeof j->reason, "submitted");
    j->state = DDPD_QUEUED;
    ddpd__job_link(d, j);
    d->n_submitted++;
    DDP_INFO("job %lld (%s): queued, %d ranks, uid %u", (long long)j->id, j->name, j->world,
             j->uid);
    ddpd__job_notify(j, DDPD_JOB_STATE);
    *out = j;
    return 0;
}

/* The user a stored job runs as: its uid, with the gid and groups the store recorded. A row of
 * an older ddpd has none: they come from the user database (the uid's passwd entry, then
 * getgrouplist), never gid = uid. NSS may be slow: this runs at start-up, before the daemon
 * serves anyone. Returns 0 or DDP_EPERM with why filled. */
static int stored_creds(ddpd_job_t *j, json_t *row, char *why, size_t whylen)
{
    j->uid = (uint32_t)json_integer_value(json_object_get(row, "uid"));
    json_t *gid = json_object_get(row, "gid"), *groups = json_object_get(row, "groups");
    if (json_is_integer(gid) && json_is_array(groups)) {
        j->gid = (uint32_t)json_integer_value(gid);
        size_t n = json_array_size(groups), i;
        json_t *g;
        if (n > DDPD_MAX_GROUPS || !(j->groups = ddp_calloc(n ? n : 1, sizeof *j->groups)))
            return snprintf(why, whylen, "its recorded groups cannot be used"), DDP_EPERM;
        json_array_foreach(groups, i, g) j->groups[i] = (uint32_t)json_integer_value(g);
        j->n_groups = (int)n;
        return 0;
    }
    struct passwd *pw = getpwuid(j->uid);
    if (!pw) {
        snprintf(why, whylen, "uid %u has no passwd entry, and an older ddpd stored the job "
                 "without its groups: its ranks cannot be started as that user", j->uid);
        return DDP_EPERM;
    }
    j->gid = pw->pw_gid;
    int n = 64;
    gid_t *g = NULL;
    for (int tries = 0; tries < 4; tries++) {
        gid_t *ng = ddp_realloc(g, (size_t)n * sizeof *g);
        if (!ng) break;
        g = ng;
        int want = n;
        if (getgrouplist(pw->pw_name, pw->pw_gid, g, &want) >= 0) {
            n = want;
            j->groups = ddp_calloc((size_t)(n ? n : 1), sizeof *j->groups);
            for (int i = 0; j->groups && i < n; i++) j->groups[i] = g[i];
            j->n_groups = j->groups ? n : 0;
            free(g);
            return j->groups && n <= DDPD_MAX_GROUPS ? 0 : DDP_EPERM;
        }
        n = want > n ? want : n * 2;
    }
    free(g);
    snprintf(why, whylen, "the groups of uid %u cannot be read", j->uid);
    return DDP_EPERM;
}

/* A stored name that an older ddpd took unchecked (params.name) is not used as it is. */
static void stored_name(ddpd_job_t *j, json_t *row)
{
    const char *name = json_string_value(json_object_get(row, "name"));
    if (name && ddp_spec_name_ok(name)) {
        snprintf(j->name, sizeof j->name, "%s", name);
        return;
    }
    snprintf(j->name, sizeof j->name, "job");
    DDP_WARN("job %lld: its stored name is not a valid job name; it is shown as 'job'",
             (long long)j->id);
}

int ddpd_job_requeue(ddpd_t *d, json_t *row)
{
    ddpd_job_t *j;
    DDP_CHECK(ddpd__job_new(d, &j));
    const char *spec_text = json_string_value(json_object_get(row, "spec"));
    ddp_spec_t *spec = ddp_malloc(sizeof *spec);
    ddp_errinfo_t ei;
    if (!spec || !spec_text ||
        ddp_spec_parse(spec, spec_text, strlen(spec_text), "<stored>", &ei) != 0) {
        free(spec);
        j->id = json_integer_value(json_object_get(row, "id"));
        int rc = ddpd_store_job_transition(d->store, j->id, "queued", "failed",
                                           "stored spec no longer valid", ddp_wall_ms());
        ddpd__job_check_stored(j, rc, "failure");
        ddpd__job_discard(j);
        return DDP_ESPEC;
    }
    j->spec_json = ddp_strdup(spec_text);
    take_spec(j, spec);
    free(spec);
    j->id = json_integer_value(json_object_get(row, "id"));
    char why[400];
    if (stored_creds(j, row, why, sizeof why) != 0) {
        int rc = ddpd_store_job_transition(d->store, j->id, "queued", "failed", why,
                                           ddp_wall_ms());
        ddpd__job_check_stored(j, rc, "failure");
        DDP_WARN("job %lld: not re-queued: %s", (long long)j->id, why);
        ddpd__job_discard(j);
        return DDP_EPERM;
    }
    stored_name(j, row);
    snprintf(j->cwd, sizeof j->cwd, "%s", json_string_value(json_object_get(row, "cwd")));
    snprintf(j->run_dir, sizeof j->run_dir, "%s",
             json_string_value(json_object_get(row, "run_dir")));
    snprintf(j->token, sizeof j->token, "%s", json_string_value(json_object_get(row, "token")));
    snprintf(j->reason, sizeof j->reason, "re-queued after a daemon restart");
    j->submitted_ms = ddp_wall_ms();
    j->state = DDPD_QUEUED;
    make_run_dir(j);
    ddpd__job_link(d, j);
    ddpd__job_notify(j, DDPD_JOB_STATE);
    return 0;
}

static int adopt_fail(char *why, size_t whylen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int adopt_fail(char *why, size_t whylen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, whylen, fmt, ap);
    va_end(ap);
    return DDP_EINVAL;
}

int ddpd_job_adopt(ddpd_t *d, json_t *row, char *why, size_t whylen)
{
    json_t *rt = json_object_get(row, "runtime");
    json_t *procs = json_object_get(rt, "procs"), *nodes = json_object_get(rt, "rank_node");
    const char *rdzv = json_string_value(json_object_get(rt, "rdzv"));
    const char *spec_text = json_string_value(json_object_get(row, "spec"));
    if (!json_is_array(procs) || !json_is_array(nodes) || !rdzv || !spec_text)
        return adopt_fail(why, whylen, "no record of its ranks to adopt them from");
    ddp_spec_t *spec = ddp_malloc(sizeof *spec);
    ddp_errinfo_t ei;
    if (!spec || ddp_spec_parse(spec, spec_text, strlen(spec_text), "<stored>", &ei) != 0) {
        free(spec);
        return adopt_fail(why, whylen, "its stored spec no longer parses");
    }
    ddpd_job_t *j;
    int rc = ddpd__job_new(d, &j);
    if (rc) {
        free(spec);
        return adopt_fail(why, whylen, "out of memory");
    }
    take_spec(j, spec);
    free(spec);
    size_t i;
    json_t *v;
    int remote = 0;
    json_array_foreach(nodes, i, v) remote += json_integer_value(v) != 0;
    if (remote && !j->elastic) {
        ddpd__job_discard(j);
        return adopt_fail(why, whylen, "it has ranks on peer daemons, and only an elastic job "
                          "(ddp.restart: on-failure) is adopted across daemons");
    }
    j->spec_json = ddp_strdup(spec_text);
    j->id = json_integer_value(json_object_get(row, "id"));
    if (stored_creds(j, row, why, whylen) != 0) {
        ddpd__job_discard(j);
        return DDP_EPERM;
    }
    stored_name(j, row);
    snprintf(j->cwd, sizeof j->cwd, "%s", json_string_value(json_object_get(row, "cwd")));
    snprintf(j->run_dir, sizeof j->run_dir, "%s",
             json_string_value(json_object_get(row, "run_dir")));
    snprintf(j->token, sizeof j->token, "%s", json_string_value(json_object_get(row, "token")));
    snprintf(j->spec_path, sizeof j->spec_path, "%s/job.json", j->run_dir);
    snprintf(j->rdzv, sizeof j->rdzv, "%s", rdzv);
    j->state = strcmp(json_string_value(json_object_get(row, "state")), "starting")
                   ? DDPD_RUNNING : DDPD_STARTING;
    j->submitted_ms = j->started_ms = json_integer_value(json_object_get(row, "started_ms"));
    j->tail.first_step_ms = json_integer_value(json_object_get(rt, "first_step_ms"));
    j->restarts = (int)json_integer_value(json_object_get(rt, "restarts"));
    j->generation = (unsigned long)json_integer_value(json_object_get(rt, "generation"));
    j->rank_node = ddp_calloc((size_t)j->world, sizeof *j->rank_node);
    j->remote_alive = ddp_calloc((size_t)j->world, 1);
    j->procs = ddp_calloc((size_t)j->world, sizeof *j->procs);
    if (!j->spec_json || !j->rank_node || !j->remote_alive || !j->procs ||
        json_array_size(procs) > (size_t)j->world || json_array_size(nodes) != (size_t)j->world) {
        ddpd__job_discard(j);
        return adopt_fail(why, whylen, "out of memory");
    }
    if (j->elastic) {
        const char *colon = strrchr(rdzv, ':');
        ddpd_coord_cfg_t cc = {.host = "0.0.0.0", .port = colon ? atoi(colon + 1) : 0,
                               .token = j->token, .world = j->world,
                               .min_workers = j->min_workers, .max_workers = j->world,
                               .hb_timeout_s = j->hb_timeout_s,
                               .rejoin_timeout_s = j->rejoin_timeout_s, .adopt = 1,
                               .last_gen = j->generation,
                               .on_event = ddpd__job_coord_event, .arg = j};
        ddp_errinfo_clear(&ei);
        if (cc.port <= 0 || ddpd_coord_new(d->loop, &cc, &j->coord, &ei) != 0) {
            ddpd__job_discard(j);
            return adopt_fail(why, whylen, "its coordinator cannot listen on %s again: %.200s",
                              rdzv, ei.msg);
        }
    }
    /* ranks on peers wait for their daemons to say they still run them (ddpd_job_remote_adopted,
     * the first thing on a link), else for a place like ranks lost with a node */
    json_array_foreach(nodes, i, v) if (json_integer_value(v) != 0)
    {
        j->rank_node[i] = -1;
        j->n_unplaced++;
    }
    ddpd__job_link(d, j);
    ddpd_tail_from_end(&j->tail, j->run_dir, j->uid);
    ddpd__job_watch_run_dir(j);
    int alive = 0;
    json_array_foreach(procs, i, v)
    {
        ddpd_proc_t *p = &j->procs[j->n_local++];
        ddpd__job_proc_init(j, p);
        p->restarts = (int)json_integer_value(json_object_get(v, "restarts"));
        rc = ddpd_adopt_rank(d->loop, p, (int)json_integer_value(json_object_get(v, "pid")),
                             (int)json_integer_value(json_object_get(v, "rank")),
                             (int)json_integer_value(json_object_get(v, "local_rank")), j->token,
                             j->run_dir, j->uid);
        if (p->open) j->handles++;
        if (rc == 0) {
            alive++;
            j->live_local++;
            ddpd_slots_take(d, 1, "an adopted job's rank");
        }
    }
    ddpd__job_set_state(j, DDPD_RUNNING,
                        "adopted after a daemon restart: %d of %d local rank(s) still running%s",
                        alive, j->n_local,
                        j->n_unplaced ? "; the ranks on peers are taken back from their daemons "
                                        "or placed again"
                        : j->elastic  ? "; the coordinator waits for them"
                                      : "");
    /* ranks that ended unwatched: those killed (no exit status) first, as the likelier cause of
     * the others' errors, so that a failed job names them */
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < j->n_local; k++) {
            ddpd_proc_t *p = &j->procs[k];
            if (!p->alive && !p->open && p->status_unknown == !pass)
                ddpd__job_ended_unwatched(j, p);
        }
    ddpd__job_save_runtime(j);
    ddpd__job_notify(j, DDPD_JOB_SLOTS);
    ddpd__job_maybe_finish(j);
    return 0;
}
