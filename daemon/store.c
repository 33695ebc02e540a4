/* SQLite job store. Schema (version 2; version 1 lacked `runtime`, added on open):
 *   jobs(id, name, uid, state, reason, world, nodes, pgid, spec, run_dir, cwd, token,
 *        submitted_ms, started_ms, ended_ms, exit_code, step, steps, final_loss, runtime)
 *   runtime: what a restarted daemon needs to adopt the running job (JSON, see job.c)
 *   transitions(job_id, ts_ms, from_state, to_state, reason)
 * SQLite errors are logged with SQLite's message and returned as DDP_ESQL.
 */
#include "store.h"

#include <errno.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"

struct ddpd_store {
    sqlite3 *db;
};

static const char *schema =
    "PRAGMA journal_mode=WAL;"
    "PRAGMA synchronous=NORMAL;"
    "CREATE TABLE IF NOT EXISTS jobs("
    " id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, uid INTEGER NOT NULL,"
    " state TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', world INTEGER NOT NULL,"
    " nodes TEXT NOT NULL DEFAULT '', pgid INTEGER NOT NULL DEFAULT 0, spec TEXT NOT NULL,"
    " run_dir TEXT NOT NULL, cwd TEXT NOT NULL, token TEXT NOT NULL,"
    " submitted_ms INTEGER NOT NULL, started_ms INTEGER, ended_ms INTEGER,"
    " exit_code INTEGER, step INTEGER, steps INTEGER, final_loss REAL,"
    " runtime TEXT NOT NULL DEFAULT '');"
    "CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);"
    "CREATE TABLE IF NOT EXISTS transitions("
    " job_id INTEGER NOT NULL, ts_ms INTEGER NOT NULL, from_state TEXT NOT NULL,"
    " to_state TEXT NOT NULL, reason TEXT NOT NULL);"
    "CREATE INDEX IF NOT EXISTS transitions_job ON transitions(job_id);";

/* The schema's version in the file (0: a new file). */
static int user_version(ddpd_store_t *s)
{
    sqlite3_stmt *st;
    int v = -1;
    if (sqlite3_prepare_v2(s->db, "PRAGMA user_version", -1, &st, NULL) != SQLITE_OK) return -1;
    if (sqlite3_step(st) == SQLITE_ROW) v = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    return v;
}

static int sql_err(ddpd_store_t *s, const char *what)
{
    DDP_ERROR("store: %s: %s", what, sqlite3_errmsg(s->db));
    return DDP_ESQL;
}

int ddpd_store_open(ddpd_store_t **out, const char *dir)
{
    *out = NULL;
    if (mkdir(dir, 0750) != 0 && errno != EEXIST) {
        int rc = -errno;
        DDP_ERROR("store: cannot create %s: %s", dir, strerror(errno));
        return rc;
    }
    ddpd_store_t *s = ddp_calloc(1, sizeof *s);
    if (!s) return DDP_ENOMEM;
    char path[4096];
    snprintf(path, sizeof path, "%s/ddpd.db", dir);
    if (sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
        SQLITE_OK) {
        int rc = sql_err(s, path);
        ddpd_store_close(s);
        return rc;
    }
    sqlite3_busy_timeout(s->db, 2000);
    char *msg = NULL;
    int v = user_version(s);
    const char *upgrade = v == 1 ? "ALTER TABLE jobs ADD COLUMN runtime TEXT NOT NULL DEFAULT '';"
                                   "PRAGMA user_version=2;"
                                 : "PRAGMA user_version=2;";
    if (v < 0 || v > 2 || sqlite3_exec(s->db, schema, NULL, NULL, &msg) != SQLITE_OK ||
        sqlite3_exec(s->db, upgrade, NULL, NULL, &msg) != SQLITE_OK) {
        if (v > 2) DDP_ERROR("store: %s is schema version %d, newer than this ddpd's 2", path, v);
        else DDP_ERROR("store: schema: %s", msg ? msg : sqlite3_errmsg(s->db));
        sqlite3_free(msg);
        ddpd_store_close(s);
        return DDP_ESQL;
    }
    *out = s;
    return 0;
}

int ddpd_store_open_readonly(ddpd_store_t **out, const char *dir)
{
    *out = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/ddpd.db", dir);
    /* SQLite would report a missing file as SQLITE_CANTOPEN, which reads as a fault */
    if (access(path, F_OK) != 0) return -errno;
    ddpd_store_t *s = ddp_calloc(1, sizeof *s);
    if (!s) return DDP_ENOMEM;
    if (sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        int rc = sql_err(s, path);
        ddpd_store_close(s);
        return rc;
    }
    sqlite3_busy_timeout(s->db, 2000); /* a live daemon may be writing */
    /* version 1 lacks only `runtime`, which no reader reads */
    int v = user_version(s);
    if (v < 1 || v > 2) {
        if (v > 2) DDP_ERROR("store: %s is schema version %d, newer than this ddpd's 2", path, v);
        else DDP_ERROR("store: %s is not a ddpd job store (%s)", path, sqlite3_errmsg(s->db));
        ddpd_store_close(s);
        return DDP_ESQL;
    }
    *out = s;
    return 0;
}

void ddpd_store_close(ddpd_store_t *s)
{
    if (!s) return;
    sqlite3_close(s->db);
    free(s);
}

static int prep(ddpd_store_t *s, const char *sql, sqlite3_stmt **st)
{
    if (sqlite3_prepare_v2(s->db, sql, -1, st, NULL) != SQLITE_OK) return sql_err(s, sql);
    return 0;
}

static int step_done(ddpd_store_t *s, sqlite3_stmt *st, const char *what)
{
    int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : sql_err(s, what);
    sqlite3_finalize(st);
    return rc;
}

int ddpd_store_job_insert(ddpd_store_t *s, const ddpd_jobrec_t *r, int64_t *id)
{
    sqlite3_stmt *st;
    DDP_CHECK(prep(s,
                   "INSERT INTO jobs(name,uid,state,reason,world,spec,run_dir,cwd,token,"
                   "submitted_ms) VALUES(?,?,'queued','submitted',?,?,?,?,?,?)",
                   &st));
    sqlite3_bind_text(st, 1, r->name, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 2, r->uid);
    sqlite3_bind_int(st, 3, r->world);
    sqlite3_bind_text(st, 4, r->spec_json, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 5, r->run_dir ? r->run_dir : "", -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 6, r->cwd ? r->cwd : "", -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 7, r->token ? r->token : "", -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 8, r->submitted_ms);
    DDP_CHECK(step_done(s, st, "insert job"));
    *id = sqlite3_last_insert_rowid(s->db);
    DDP_CHECK(prep(s, "UPDATE jobs SET run_dir=run_dir||'/job-'||id WHERE id=?", &st));
    sqlite3_bind_int64(st, 1, *id);
    DDP_CHECK(step_done(s, st, "set run dir"));
    DDP_CHECK(prep(s, "INSERT INTO transitions VALUES(?,?,'','queued','submitted')", &st));
    sqlite3_bind_int64(st, 1, *id);
    sqlite3_bind_int64(st, 2, r->submitted_ms);
    return step_done(s, st, "insert transition");
}

int ddpd_store_job_transition(ddpd_store_t *s, int64_t id, const char *from, const char *to,
                              const char *reason, int64_t ts_ms)
{
    sqlite3_stmt *st;
    DDP_CHECK(prep(s, "INSERT INTO transitions VALUES(?,?,?,?,?)", &st));
    sqlite3_bind_int64(st, 1, id);
    sqlite3_bind_int64(st, 2, ts_ms);
    sqlite3_bind_text(st, 3, from, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 4, to, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 5, reason ? reason : "", -1, SQLITE_TRANSIENT);
    DDP_CHECK(step_done(s, st, "insert transition"));
    int terminal = !strcmp(to, "succeeded") || !strcmp(to, "failed") || !strcmp(to, "cancelled");
    const char *sql = !strcmp(to, "starting")
                          ? "UPDATE jobs SET state=?1,reason=?2,started_ms=?3 WHERE id=?4"
                      : terminal ? "UPDATE jobs SET state=?1,reason=?2,ended_ms=?3 WHERE id=?4"
                                 : "UPDATE jobs SET state=?1,reason=?2 WHERE id=?4";
    DDP_CHECK(prep(s, sql, &st));
    sqlite3_bind_text(st, 1, to, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, reason ? reason : "", -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 3, ts_ms);
    sqlite3_bind_int64(st, 4, id);
    return step_done(s, st, "update job state");
}

int ddpd_store_job_result(ddpd_store_t *s, int64_t id, int exit_code, long step, long steps,
                          double final_loss)
{
    sqlite3_stmt *st;
    DDP_CHECK(prep(s, "UPDATE jobs SET exit_code=?,step=?,steps=?,final_loss=? WHERE id=?", &st));
    sqlite3_bind_int(st, 1, exit_code);
    sqlite3_bind_int64(st, 2, step);
    sqlite3_bind_int64(st, 3, steps);
    if (isfinite(final_loss))
        sqlite3_bind_double(st, 4, final_loss);
    else
        sqlite3_bind_null(st, 4);
    sqlite3_bind_int64(st, 5, id);
    return step_done(s, st, "update job result");
}

int ddpd_store_job_runtime(ddpd_store_t *s, int64_t id, const char *runtime_json)
{
    sqlite3_stmt *st;
    DDP_CHECK(prep(s, "UPDATE jobs SET runtime=? WHERE id=?", &st));
    sqlite3_bind_text(st, 1, runtime_json, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 2, id);
    return step_done(s, st, "update job runtime");
}

int ddpd_store_job_placement(ddpd_store_t *s, int64_t id, const char *nodes, int pgid)
{
    sqlite3_stmt *st;
    DDP_CHECK(prep(s, "UPDATE jobs SET nodes=?,pgid=? WHERE id=?", &st));
    sqlite3_bind_text(st, 1, nodes, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(st, 2, pgid);
    sqlite3_bind_int64(st, 3, id);
    return step_done(s, st, "update job placement");
}

#define JOB_COLS                                                                              \
    "id,name,uid,state,reason,world,nodes,run_dir,submitted_ms,started_ms,ended_ms,exit_code," \
    "step,steps,final_loss,cwd,spec"

/* One row of JOB_COLS as an object; NULL columns are left out. */
static json_t *row_to_json(sqlite3_stmt *st, int with_spec)
{
    json_t *o = json_object();
    int n = with_spec ? 17 : 16;
    for (int i = 0; i < n; i++) {
        const char *col = sqlite3_column_name(st, i);
        switch (sqlite3_column_type(st, i)) {
        case SQLITE_INTEGER:
            json_object_set_new(o, col, json_integer(sqlite3_column_int64(st, i)));
            break;
        case SQLITE_FLOAT:
            json_object_set_new(o, col, json_real(sqlite3_column_double(st, i)));
            break;
        case SQLITE_TEXT: {
            const char *t = (const char *)sqlite3_column_text(st, i);
            json_t *v = NULL;
            if (!strcmp(col, "spec")) v = json_loads(t, 0, NULL);
            json_object_set_new(o, col, v ? v : json_string(t));
            break;
        }
        default: break;
        }
    }
    return o;
}

int ddpd_store_job_list(ddpd_store_t *s, const char *state, int limit, json_t **out)
{
    sqlite3_stmt *st;
    DDP_CHECK(prep(s,
                   "SELECT " JOB_COLS " FROM jobs WHERE (?1 IS NULL OR state=?1)"
                   " ORDER BY id DESC LIMIT ?2",
                   &st));
    if (state)
        sqlite3_bind_text(st, 1, state, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(st, 1);
    sqlite3_bind_int64(st, 2, limit > 0 ? limit : -1);
    json_t *arr = json_array();
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) json_array_append_new(arr, row_to_json(st, 0));
    sqlite3_finalize(st);
    if (r != SQLITE_DONE) {
        json_decref(arr);
        return sql_err(s, "list jobs");
    }
    *out = arr;
    return 0;
}

int ddpd_store_job_get(ddpd_store_t *s, int64_t id, int with_spec, json_t **out)
{
    sqlite3_stmt *st;
    DDP_CHECK(prep(s, "SELECT " JOB_COLS " FROM jobs WHERE id=?", &st));
    sqlite3_bind_int64(st, 1, id);
    int r = sqlite3_step(st);
    if (r != SQLITE_ROW) {
        sqlite3_finalize(st);
        return r == SQLITE_DONE ? DDP_ENOTFOUND : sql_err(s, "get job");
    }
    json_t *o = row_to_json(st, with_spec);
    sqlite3_finalize(st);
    if (prep(s, "SELECT ts_ms,from_state,to_state,reason FROM transitions WHERE job_id=?"
                " ORDER BY rowid",
             &st) != 0) {
        json_decref(o);
        return DDP_ESQL;
    }
    sqlite3_bind_int64(st, 1, id);
    json_t *tr = json_array();
    while (sqlite3_step(st) == SQLITE_ROW)
        json_array_append_new(tr, json_pack("{sI ss ss ss}", "ts_ms",
                                            (json_int_t)sqlite3_column_int64(st, 0), "from",
                                            (const char *)sqlite3_column_text(st, 1), "to",
                                            (const char *)sqlite3_column_text(st, 2), "reason",
                                            (const char *)sqlite3_column_text(st, 3)));
    sqlite3_finalize(st);
    json_object_set_new(o, "transitions", tr);
    *out = o;
    return 0;
}

int ddpd_store_job_counts(ddpd_store_t *s, json_t **out)
{
    sqlite3_stmt *st;
    DDP_CHECK(prep(s, "SELECT state,count(*) FROM jobs GROUP BY state", &st));
    json_t *o = json_object();
    while (sqlite3_step(st) == SQLITE_ROW)
        json_object_set_new(o, (const char *)sqlite3_column_text(st, 0),
                            json_integer(sqlite3_column_int64(st, 1)));
    sqlite3_finalize(st);
    *out = o;
    return 0;
}

int ddpd_store_unfinished(ddpd_store_t *s, json_t **live, json_t **queued)
{
    sqlite3_stmt *st;
    *live = json_array();
    *queued = json_array();
    DDP_CHECK(prep(s,
                   "SELECT id,state,token,pgid,spec,cwd,uid,run_dir,name,nodes,started_ms,runtime"
                   " FROM jobs WHERE state IN ('queued','starting','running') ORDER BY id",
                   &st));
    while (sqlite3_step(st) == SQLITE_ROW) {
        const char *state = (const char *)sqlite3_column_text(st, 1);
        json_t *o = json_pack("{sI ss ss si ss ss sI ss ss ss sI}", "id",
                              (json_int_t)sqlite3_column_int64(st, 0), "state", state, "token",
                              (const char *)sqlite3_column_text(st, 2), "pgid",
                              sqlite3_column_int(st, 3), "spec",
                              (const char *)sqlite3_column_text(st, 4), "cwd",
                              (const char *)sqlite3_column_text(st, 5), "uid",
                              (json_int_t)sqlite3_column_int64(st, 6), "run_dir",
                              (const char *)sqlite3_column_text(st, 7), "name",
                              (const char *)sqlite3_column_text(st, 8), "nodes",
                              (const char *)sqlite3_column_text(st, 9), "started_ms",
                              (json_int_t)sqlite3_column_int64(st, 10));
        json_t *rt = json_loads((const char *)sqlite3_column_text(st, 11), 0, NULL);
        if (json_is_object(rt)) json_object_set(o, "runtime", rt);
        json_decref(rt);
        json_array_append_new(!strcmp(state, "queued") ? *queued : *live, o);
    }
    sqlite3_finalize(st);
    return 0;
}
