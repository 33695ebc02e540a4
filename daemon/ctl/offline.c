/* ddpctl's read-only commands when no daemon answers (see ctl.h): a job's record, the job list
 * and a rank's log, read from the daemon's SQLite store and the job's run directory.
 *
 * Why: `ddpctl run`'s embedded daemon goes away with the run, and a stopped ddpd leaves its
 * history behind; what ended is in the store (state, reason, transitions, run_dir) and the run
 * directory (metrics.jsonl, trace/, rank-R.log), so reading it needs no daemon. The store is
 * opened read-only (ddpd_store_open_readonly) and each read is one SQLite transaction, so a
 * daemon that starts meanwhile and writes it is not disturbed. Whatever changes a job (submit,
 * cancel) or follows a live one (watch, logs -f) still needs the daemon: main.c says so.
 */

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/err.h"
#include "daemon/ctl/ctl.h"
#include "daemon/store.h"

/* Opens w's store and says that it is read instead of the daemon (`what`: "job 2"). */
static int store_open(const ddpctl_where_t *w, const char *what, ddpd_store_t **s)
{
    int rc = ddpd_store_open_readonly(s, w->state_dir);
    if (rc == -ENOENT) {
        fprintf(stderr,
                "ddpctl: no daemon at %s, and no job store at %s/ddpd.db (start ddpd, "
                "or name the daemon's --socket or its --state-dir)\n",
                w->socket, w->state_dir);
        return CTL_UNAVAILABLE;
    }
    if (rc == -EACCES) {
        fprintf(stderr,
                "ddpctl: no daemon at %s, and the job store at %s/ddpd.db is readable by its "
                "daemon's user only (it holds every job's token): ask the daemon once it runs, "
                "or read it as that user\n",
                w->socket, w->state_dir);
        return CTL_UNAVAILABLE;
    }
    if (rc) {
        fprintf(stderr,
                "ddpctl: no daemon at %s, and the job store at %s/ddpd.db cannot be "
                "read: %s\n",
                w->socket, w->state_dir, ddp_strerror(rc));
        return CTL_UNAVAILABLE;
    }
    fprintf(stderr, "ddpctl: no daemon at %s; reading %s from the store at %s/ddpd.db\n", w->socket,
            what, w->state_dir);
    return 0;
}

int ddpctl_store_job(const ddpctl_where_t *w, long long id, json_t **job)
{
    char what[48];
    snprintf(what, sizeof what, "job %lld", id);
    ddpd_store_t *s;
    int rc = store_open(w, what, &s);
    if (rc) return rc;
    rc = ddpd_store_job_get(s, id, 1, job);
    ddpd_store_close(s);
    if (rc == DDP_ENOTFOUND) {
        fprintf(stderr, "ddpctl: no job %lld in the store at %s/ddpd.db\n", id, w->state_dir);
        return CTL_JOB_FAILED;
    }
    if (rc) {
        fprintf(stderr, "ddpctl: reading job %lld from the store: %s\n", id, ddp_strerror(rc));
        return CTL_ERROR;
    }
    /* a daemon that stopped (SIGTERM, a crash) leaves its jobs as they were: they may train on,
     * and the next ddpd adopts them; the record is as new as that daemon left it */
    const char *st = json_string_value(json_object_get(*job, "state"));
    if (st && (!strcmp(st, "queued") || !strcmp(st, "starting") || !strcmp(st, "running")))
        fprintf(stderr,
                "ddpctl: job %lld was %s when its daemon stopped; a ddpd started on "
                "this store adopts it\n",
                id, st);
    return 0;
}

int ddpctl_store_jobs(const ddpctl_where_t *w, const char *state, int limit, json_t **jobs)
{
    ddpd_store_t *s;
    int rc = store_open(w, "the job list", &s);
    if (rc) return rc;
    rc = ddpd_store_job_list(s, state, -1, limit, jobs);
    ddpd_store_close(s);
    if (rc) {
        fprintf(stderr, "ddpctl: reading the job list from the store: %s\n", ddp_strerror(rc));
        return CTL_ERROR;
    }
    return 0;
}

int ddpctl_store_logs(const ddpctl_where_t *w, long long id, int rank)
{
    json_t *job;
    int rc = ddpctl_store_job(w, id, &job);
    if (rc) return rc;
    int world = (int)json_integer_value(json_object_get(job, "world"));
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/rank-%d.log",
             json_string_value(json_object_get(job, "run_dir")) ?: "", rank);
    json_decref(job);
    if (rank < 0 || rank >= world) {
        fprintf(stderr, "ddpctl: job %lld has ranks 0..%d; no rank %d\n", id, world - 1, rank);
        return CTL_USAGE;
    }
    FILE *f = fopen(path, "re");
    if (!f) {
        fprintf(stderr,
                "ddpctl: cannot read %s: %s (a rank that ran on a peer keeps its log "
                "in that node's run directory)\n",
                path, strerror(errno));
        return CTL_ERROR;
    }
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, n, stdout);
    rc = ferror(f) ? CTL_ERROR : 0;
    if (rc) fprintf(stderr, "ddpctl: reading %s failed\n", path);
    fclose(f);
    return rc;
}

int ddpctl_connect_or_store(ddpd_client_t *c, const ddpctl_where_t *w)
{
    int rc = ddpd_client_connect(c, w->socket);
    if (ddpctl_no_daemon(rc)) return 1;
    if (rc) {
        fprintf(stderr, "ddpctl: cannot reach the daemon at %s: %s\n", w->socket, strerror(-rc));
        return CTL_UNAVAILABLE;
    }
    return 0;
}

int ddpctl_job_get(const ddpctl_where_t *w, long long id, json_t **job)
{
    *job = NULL;
    ddpd_client_t c;
    int rc = ddpctl_connect_or_store(&c, w);
    if (rc == 1) return ddpctl_store_job(w, id, job);
    if (rc) return rc;
    json_t *err = NULL;
    rc = ddpd_client_call(&c, "job.get", json_pack("{sI}", "id", (json_int_t)id), job, &err, 60000);
    ddpd_client_close(&c);
    if (rc == 1) {
        ddpctl_print_error(err);
        json_decref(err);
        return CTL_JOB_FAILED;
    }
    if (rc < 0) {
        fprintf(stderr, "ddpctl: job.get: %s\n", strerror(-rc));
        return CTL_ERROR;
    }
    return 0;
}
