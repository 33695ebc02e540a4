/* SQLite job store. Schema (version 2; version 1 lacked `runtime`, added on open):
 *   jobs(id, name, uid, state, reason, world, nodes, pgid, spec, run_dir, cwd, token,
 *        submitted_ms, started_ms, ended_ms, exit_code, step, steps, final_loss, runtime,
 *        gid, groups)
 *   runtime: what a restarted daemon needs to adopt the running job (JSON, see job.c)
 *   gid, groups: the submitter's primary and supplementary groups (groups: a JSON array), NULL
 *     in rows an older ddpd wrote. Added on open as nullable columns *without* a new
 *     user_version, so that an older ddpd still opens the file (it names its columns).
 *   transitions(job_id, ts_ms, from_state, to_state, reason)
 * SQLite errors are logged with SQLite's message and returned as DDP_ESQL.
 */
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"

/* A write that found no room, kept to be written later (ddpd_store_retry). */
typedef struct kept_val {
    char type; /* 'i' integer, 'd' real, 't' text (owned), 'n' null */
    int64_t i;
    double d;
    char *t;
} kept_val_t;

typedef struct kept {
    struct kept *next;
    const char *sql; /* a string literal of this file */
    int n;
    kept_val_t v[6];
} kept_t;

struct ddpd_store {
    sqlite3 *db;
    char reserve[PATH_MAX]; /* the reserve file ("" for a read-only handle) */
    kept_t *kept, **kept_tail;
    int n_kept;
};

/* The reserve: space held in the state directory's filesystem and given up when it is full, so
 * that the records of jobs already running (a cancel, an end) still fit. */
#define RESERVE_BYTES (2 << 20)

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

/* Makes `path` 0600 (created so when absent: SQLite gives -wal and -shm the database file's
 * mode). Returns 0 or -errno. */
static int private_file(const char *path, int create)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | (create ? O_CREAT : 0), 0600);
    if (fd < 0) return errno == ENOENT && !create ? 0 : -errno;
    int rc = fchmod(fd, 0600) == 0 ? 0 : -errno;
    close(fd);
    return rc;
}

/* The reserve file, made when absent (best effort: a filesystem already full has none). */
static void make_reserve(ddpd_store_t *s)
{
    int fd = open(s->reserve, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return; /* there already, or no room */
    int rc = posix_fallocate(fd, 0, RESERVE_BYTES);
    close(fd);
    if (rc != 0) unlink(s->reserve);
}

/* Gives the reserve up; returns 1 when there was one. */
static int give_reserve(ddpd_store_t *s)
{
    if (!s->reserve[0] || unlink(s->reserve) != 0) return 0;
    DDP_WARN("store: the filesystem of %s is full: its reserve of %d MiB is given up so that the "
             "running jobs' records fit; no new job is taken until there is room",
             s->reserve, RESERVE_BYTES >> 20);
    return 1;
}

/* The columns a newer ddpd added, when the file lacks them (nullable: see the header). */
static int add_columns(ddpd_store_t *s)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(s->db, "SELECT gid, groups FROM jobs LIMIT 0", -1, &st, NULL) ==
        SQLITE_OK) {
        sqlite3_finalize(st);
        return 0;
    }
    char *msg = NULL;
    if (sqlite3_exec(s->db, "ALTER TABLE jobs ADD COLUMN gid INTEGER;"
                            "ALTER TABLE jobs ADD COLUMN groups TEXT;",
                     NULL, NULL, &msg) != SQLITE_OK) {
        DDP_ERROR("store: adding the gid and groups columns: %s", msg ? msg : "?");
        sqlite3_free(msg);
        return DDP_ESQL;
    }
    return 0;
}

int ddpd_store_open(ddpd_store_t **out, const char *dir)
{
    *out = NULL;
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        int rc = -errno;
        DDP_ERROR("store: cannot create %s: %s", dir, strerror(errno));
        return rc;
    }
    ddpd_store_t *s = ddp_calloc(1, sizeof *s);
    if (!s) return DDP_ENOMEM;
    s->kept_tail = &s->kept;
    char path[PATH_MAX], side[PATH_MAX + 8];
    snprintf(path, sizeof path, "%s/ddpd.db", dir);
    snprintf(s->reserve, sizeof s->reserve, "%s/.ddpd-reserve", dir);
    /* the tokens and specs of every job: root's alone, also a file an older ddpd made 0644 */
    int prc = private_file(path, 1);
    for (int i = 0; prc == 0 && i < 2; i++) {
        snprintf(side, sizeof side, "%s%s", path, i ? "-shm" : "-wal");
        prc = private_file(side, 0);
    }
    if (prc != 0) {
        DDP_ERROR("store: cannot make %s private (0600): %s", path, strerror(-prc));
        free(s);
        return prc;
    }
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
    if (add_columns(s) != 0) {
        ddpd_store_close(s);
        return DDP_ESQL;
    }
    make_reserve(s);
    *out = s;
    return 0;
}

int ddpd_store_open_readonly(ddpd_store_t **out, const char *dir)
{
    *out = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/ddpd.db", dir);
    /* SQLite would report a missing or unreadable file as SQLITE_CANTOPEN, which reads as a
     * fault (a root daemon's store is root's alone: -EACCES for anyone else) */
    if (access(path, R_OK) != 0) return -errno;
    ddpd_store_t *s = ddp_calloc(1, sizeof *s);
    if (!s) return DDP_ENOMEM;
    s->kept_tail = &s->kept;
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

static void kept_free(kept_t *k)
{
    for (int i = 0; i < k->n; i++) free(k->v[i].t);
    free(k);
}

void ddpd_store_close(ddpd_store_t *s)
{
    if (!s) return;
    if (s->n_kept)
        DDP_ERROR("store: %d record(s) could not be written (the filesystem stayed full): the "
                  "history misses them", s->n_kept);
    while (s->kept) {
        kept_t *k = s->kept;
        s->kept = k->next;
        kept_free(k);
    }
    sqlite3_close(s->db);
    free(s);
}

static int prep(ddpd_store_t *s, const char *sql, sqlite3_stmt **st)
{
    if (sqlite3_prepare_v2(s->db, sql, -1, st, NULL) != SQLITE_OK) return sql_err(s, sql);
    return 0;
}

/* Steps st to its end: 0, -ENOSPC when the filesystem is full (SQLITE_FULL), or DDP_ESQL. */
static int step_done(ddpd_store_t *s, sqlite3_stmt *st, const char *what)
{
    int rc = sqlite3_step(st) == SQLITE_DONE ? 0 : sql_err(s, what);
    if (rc && (sqlite3_errcode(s->db) & 0xff) == SQLITE_FULL) rc = -ENOSPC;
    sqlite3_finalize(st);
    return rc;
}

/* Runs one statement with values v[0..n); returns SQLite's result code (SQLITE_DONE: done). */
static int run(ddpd_store_t *s, const char *sql, const kept_val_t *v, int n)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(s->db, sql, -1, &st, NULL) != SQLITE_OK) return sqlite3_errcode(s->db);
    for (int i = 0; i < n; i++) {
        if (v[i].type == 'i') sqlite3_bind_int64(st, i + 1, v[i].i);
        else if (v[i].type == 'd') sqlite3_bind_double(st, i + 1, v[i].d);
        else if (v[i].type == 't') sqlite3_bind_text(st, i + 1, v[i].t, -1, SQLITE_TRANSIENT);
        else sqlite3_bind_null(st, i + 1);
    }
    int rc = sqlite3_step(st);
    if (rc != SQLITE_DONE) rc = sqlite3_errcode(s->db);
    sqlite3_finalize(st);
    return rc;
}

/* No room (or no way to write now): worth keeping and trying again. */
static int no_room(int code)
{
    code &= 0xff;
    return code == SQLITE_FULL || code == SQLITE_IOERR || code == SQLITE_BUSY;
}

/* Writes a record of a job already accepted: at once, or after giving up the reserve, or kept
 * in order for ddpd_store_retry. Returns 0 (written or kept) or DDP_ESQL / DDP_ENOMEM. */
static int write_record(ddpd_store_t *s, const char *what, const char *sql, const kept_val_t *v,
                        int n)
{
    if (!s->kept) {
        int code = run(s, sql, v, n);
        if (code == SQLITE_DONE) return 0;
        if (!no_room(code)) return sql_err(s, what);
        if (give_reserve(s) && run(s, sql, v, n) == SQLITE_DONE) return 0;
    }
    kept_t *k = ddp_calloc(1, sizeof *k);
    if (!k) return DDP_ENOMEM;
    k->sql = sql;
    k->n = n;
    for (int i = 0; i < n; i++) {
        k->v[i] = v[i];
        k->v[i].t = v[i].type == 't' ? ddp_strdup(v[i].t) : NULL;
        if (v[i].type == 't' && !k->v[i].t) {
            kept_free(k);
            return DDP_ENOMEM;
        }
    }
    *s->kept_tail = k;
    s->kept_tail = &k->next;
    if (s->n_kept++ == 0)
        DDP_ERROR("store: cannot write a %s (%s): kept in memory, in order, until the state "
                  "directory's filesystem has room", what, sqlite3_errmsg(s->db));
    return 0;
}

int ddpd_store_retry(ddpd_store_t *s)
{
    while (s->kept) {
        kept_t *k = s->kept;
        int code = run(s, k->sql, k->v, k->n);
        if (code != SQLITE_DONE && no_room(code)) break;
        if (code != SQLITE_DONE) /* it can never be written: say so and go on */
            DDP_ERROR("store: a kept record cannot be written: %s", sqlite3_errmsg(s->db));
        s->kept = k->next;
        kept_free(k);
        if (--s->n_kept == 0) {
            s->kept_tail = &s->kept;
            DDP_INFO("store: every kept record is written; new jobs are taken again");
        }
    }
    if (!s->kept && s->reserve[0]) make_reserve(s);
    return s->n_kept;
}

int ddpd_store_full(const ddpd_store_t *s) { return s->n_kept > 0; }

#define I(x) {.type = 'i', .i = (int64_t)(x)}
#define T(x) {.type = (x) ? 't' : 'n', .t = (char *)(x)}

/* groups as a JSON array's text (caller frees); NULL on out of memory. */
static char *groups_text(const uint32_t *g, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) json_array_append_new(a, json_integer(g[i]));
    char *t = a ? json_dumps(a, JSON_COMPACT) : NULL;
    json_decref(a);
    return t;
}

int ddpd_store_job_insert(ddpd_store_t *s, const ddpd_jobrec_t *r, int64_t *id)
{
    if (s->kept) return -ENOSPC; /* no room: see ddpd_store_full */
    sqlite3_stmt *st;
    char *groups = groups_text(r->groups, r->n_groups);
    if (!groups) return DDP_ENOMEM;
    int rc = prep(s,
                  "INSERT INTO jobs(name,uid,state,reason,world,spec,run_dir,cwd,token,"
                  "submitted_ms,gid,groups) VALUES(?,?,'queued','submitted',?,?,?,?,?,?,?,?)",
                  &st);
    if (rc) {
        free(groups);
        return rc;
    }
    sqlite3_bind_text(st, 1, r->name, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 2, r->uid);
    sqlite3_bind_int(st, 3, r->world);
    sqlite3_bind_text(st, 4, r->spec_json, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 5, r->run_dir ? r->run_dir : "", -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 6, r->cwd ? r->cwd : "", -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 7, r->token ? r->token : "", -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 8, r->submitted_ms);
    sqlite3_bind_int64(st, 9, r->gid);
    sqlite3_bind_text(st, 10, groups, -1, SQLITE_TRANSIENT);
    free(groups);
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
    const kept_val_t tr[] = {I(id), I(ts_ms), T(from), T(to), T(reason ? reason : "")};
    DDP_CHECK(write_record(s, "transition", "INSERT INTO transitions VALUES(?,?,?,?,?)", tr, 5));
    int terminal = !strcmp(to, "succeeded") || !strcmp(to, "failed") || !strcmp(to, "cancelled");
    const char *sql = !strcmp(to, "starting")
                          ? "UPDATE jobs SET state=?1,reason=?2,started_ms=?3 WHERE id=?4"
                      : terminal ? "UPDATE jobs SET state=?1,reason=?2,ended_ms=?3 WHERE id=?4"
                                 : "UPDATE jobs SET state=?1,reason=?2 WHERE id=?4";
    const kept_val_t up[] = {T(to), T(reason ? reason : ""), I(ts_ms), I(id)};
    return write_record(s, "job state", sql, up, 4);
}

int ddpd_store_job_result(ddpd_store_t *s, int64_t id, int exit_code, long step, long steps,
                          double final_loss)
{
    kept_val_t v[] = {I(exit_code), I(step), I(steps), {.type = 'n'}, I(id)};
    if (isfinite(final_loss)) v[3] = (kept_val_t){.type = 'd', .d = final_loss};
    return write_record(s, "job result",
                        "UPDATE jobs SET exit_code=?,step=?,steps=?,final_loss=? WHERE id=?", v, 5);
}

int ddpd_store_job_runtime(ddpd_store_t *s, int64_t id, const char *runtime_json)
{
    const kept_val_t v[] = {T(runtime_json), I(id)};
    return write_record(s, "job runtime", "UPDATE jobs SET runtime=? WHERE id=?", v, 2);
}

int ddpd_store_job_placement(ddpd_store_t *s, int64_t id, const char *nodes, int pgid)
{
    const kept_val_t v[] = {T(nodes), I(pgid), I(id)};
    return write_record(s, "job placement", "UPDATE jobs SET nodes=?,pgid=? WHERE id=?", v, 3);
}

#undef I
#undef T

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

int ddpd_store_job_list(ddpd_store_t *s, const char *state, int64_t uid, int limit, json_t **out)
{
    sqlite3_stmt *st;
    DDP_CHECK(prep(s,
                   "SELECT " JOB_COLS " FROM jobs WHERE (?1 IS NULL OR state=?1)"
                   " AND (?3 < 0 OR uid=?3) ORDER BY id DESC LIMIT ?2",
                   &st));
    if (state)
        sqlite3_bind_text(st, 1, state, -1, SQLITE_TRANSIENT);
    else
        sqlite3_bind_null(st, 1);
    sqlite3_bind_int64(st, 2, limit > 0 ? limit : -1);
    sqlite3_bind_int64(st, 3, uid);
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
                   "SELECT id,state,token,pgid,spec,cwd,uid,run_dir,name,nodes,started_ms,runtime,"
                   "gid,groups FROM jobs WHERE state IN ('queued','starting','running')"
                   " ORDER BY id",
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
        if (sqlite3_column_type(st, 12) == SQLITE_INTEGER)
            json_object_set_new(o, "gid", json_integer(sqlite3_column_int64(st, 12)));
        json_t *groups = sqlite3_column_type(st, 13) == SQLITE_TEXT
                             ? json_loads((const char *)sqlite3_column_text(st, 13), 0, NULL)
                             : NULL;
        if (json_is_array(groups)) json_object_set(o, "groups", groups);
        json_decref(groups);
        json_array_append_new(!strcmp(state, "queued") ? *queued : *live, o);
    }
    sqlite3_finalize(st);
    return 0;
}

int ddpd_store_ended_before(ddpd_store_t *s, int64_t ts_ms, json_t **run_dirs)
{
    sqlite3_stmt *st;
    *run_dirs = NULL;
    DDP_CHECK(prep(s, "SELECT run_dir FROM jobs WHERE ended_ms IS NOT NULL AND ended_ms < ?"
                      " AND state IN ('succeeded','failed','cancelled')", &st));
    sqlite3_bind_int64(st, 1, ts_ms);
    json_t *arr = json_array();
    while (sqlite3_step(st) == SQLITE_ROW)
        json_array_append_new(arr, json_string((const char *)sqlite3_column_text(st, 0)));
    sqlite3_finalize(st);
    *run_dirs = arr;
    return 0;
}
