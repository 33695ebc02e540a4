/* job.submit: the spec is read and parsed off the loop thread, then the job is accepted on it.
 *
 *   job.submit {spec: string|object | path: string, cwd?, name?, workers?, origin?}
 *                 -> {id, name, state, world, run_dir}      errors 1001 1005 1006 1007 1008 1010
 *
 * Why off the loop: a spec is whatever a user sends (up to a 1 MiB request line), and a path
 * names whatever a submitter points at; neither may hold the one thread that serves every
 * client, peer and worker. The parse runs on libuv's thread pool, which also resolves the peers'
 * addresses (uv_getaddrinfo): so at most MAX_PARSING parses run at once and the rest wait here,
 * in order, at most MAX_WAITING of them (then 1010, "try again"), so the pool always has threads
 * for the peers. The parser applies its limits while it parses (proto/spec_tree.c), so one parse
 * is bounded in time too.
 * A path is read only for root or the daemon's own user (the daemon would read what the
 * submitter may not), checked before anything is opened; it is opened O_NONBLOCK (a FIFO does
 * not wait for a writer) and must be a regular file of at most DDPD_MAX_LINE bytes.
 * Loop thread, but for the work callback.
 */
#include "daemon/submit.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/log.h"
#include "daemon/job.h"
#include "daemon/rpc.h"
#include "daemon/sched.h"
#include "proto/spec.h"

enum { MAX_PARSING = 2, MAX_WAITING = 64 };

typedef struct submit {
    uv_work_t req;
    struct submit *next; /* the waiting line */
    ddpd_session_t *s;   /* referenced (ddpd__session_ref) until done */
    json_t *id;          /* the request's id (owned) */
    char *path;          /* a spec file to read (owned), or NULL */
    char *text;          /* the spec text (owned): given, or read from path */
    size_t len;
    char *name, *cwd; /* params (owned, may be NULL) */
    int workers;
    char origin[PATH_MAX + 8];
    /* the work's results */
    int rc;
    ddp_spec_t spec;
    ddp_errinfo_t ei;
} submit_t;

static struct {
    submit_t *head, **tail;
    int parsing, waiting;
} line = {NULL, &line.head, 0, 0};

static void submit_free(submit_t *w)
{
    json_decref(w->id);
    free(w->path);
    free(w->text);
    free(w->name);
    free(w->cwd);
    free(w);
}

/* Reads a spec file the way a root daemon must: no FIFO wait, a regular file, bounded. */
static int read_spec_file(submit_t *w)
{
    int fd = open(w->path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) return -errno;
    struct stat st;
    int rc = fstat(fd, &st) != 0                 ? -errno
             : !S_ISREG(st.st_mode)              ? -EINVAL
             : st.st_size > (off_t)DDPD_MAX_LINE ? -EFBIG
                                                 : 0;
    char *buf = rc == 0 ? ddp_malloc((size_t)st.st_size + 1) : NULL;
    if (rc == 0 && !buf) rc = DDP_ENOMEM;
    size_t got = 0;
    while (rc == 0 && got < (size_t)st.st_size) {
        ssize_t n = pread(fd, buf + got, (size_t)st.st_size - got, (off_t)got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            rc = n < 0 ? -errno : -EIO;
            break;
        }
        got += (size_t)n;
    }
    close(fd);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[got] = '\0';
    w->text = buf;
    w->len = got;
    return 0;
}

/* On a pool thread: read (a path) and parse. */
static void parse_work(uv_work_t *req)
{
    submit_t *w = req->data;
    ddp_errinfo_clear(&w->ei);
    if (w->path && (w->rc = read_spec_file(w)) != 0) return;
    w->rc = ddp_spec_parse(&w->spec, w->text, w->len, w->origin, &w->ei);
}

static void start_next(uv_loop_t *loop);

/* The error reply of a failed submission (rc, ei). */
static void reply_error(ddpd_session_t *s, submit_t *w, int rc)
{
    if (w->path && rc == w->rc && !w->text) { /* the file could not be read */
        const char *why = rc == -EINVAL  ? "not a regular file"
                          : rc == -EFBIG ? "larger than a request may be (1 MiB)"
                                         : ddp_strerror(rc);
        ddpd__send_error(s, w->id, DDPD_RPC_SPEC_IO, json_pack("{ss}", "path", w->path),
                         "cannot read spec %s: %s", w->path, why);
        return;
    }
    json_t *data = json_pack("{ss ss si si}", "path", w->ei.path, "origin", w->origin, "line",
                             w->ei.line, "column", w->ei.column);
    int code = rc == DDP_ESPEC      ? DDPD_RPC_BAD_SPEC
               : rc == DDP_EBUSY    ? DDPD_RPC_NO_CAPACITY
               : rc == DDP_EABORTED ? DDPD_RPC_STOPPING
               : rc == DDP_ESQL     ? DDPD_RPC_STORE
               : rc == DDP_EQUOTA   ? DDPD_RPC_QUOTA
                                    : DDPD_RPC_BAD_SPEC;
    if (code == DDPD_RPC_BAD_SPEC && rc != DDP_ESPEC)
        json_object_set_new(data, "error", json_string(ddp_err_name(rc)));
    char where[1024];
    /* a spec error reads as ddp-worker prints it: the spec's name first, then the field */
    ddpd__send_error(s, w->id, code, data, "%s",
                     rc == DDP_ESPEC ? ddp_spec_errstr(&w->ei, w->origin, where, sizeof where)
                                     : ddp_errinfo_str(&w->ei, where, sizeof where));
}

/* Back on the loop: accept the job (or say why not). */
static void parse_done(uv_work_t *req, int status)
{
    submit_t *w = req->data;
    ddpd_session_t *s = w->s;
    ddpd_t *d = s->d;
    line.parsing--;
    int rc = status == UV_ECANCELED ? DDP_EABORTED : w->rc;
    if (rc == 0 && s->closing) rc = DDP_EABORTED; /* nobody to answer: nothing is queued */
    if (rc == 0) {
        ddpd_submit_t sub = {.spec = &w->spec,
                             .name = w->name,
                             .cwd = w->cwd,
                             .workers = w->workers,
                             .capacity = ddpd_sched_capacity(d),
                             .uid = s->uid,
                             .gid = s->gid,
                             .groups = s->groups,
                             .n_groups = s->n_groups};
        ddpd_job_t *j = NULL;
        rc = ddpd_job_submit(d, &sub, &j, &w->ei);
        if (rc == 0) {
            json_t *res = json_pack("{sI ss ss si ss}", "id", (json_int_t)ddpd_job_id(j), "name",
                                    ddpd_job_name(j), "state", ddpd_state_name(ddpd_job_state(j)),
                                    "world", ddpd_job_world(j), "run_dir", ddpd_job_run_dir(j));
            if (ddpd_job_warning(j)[0])
                json_object_set_new(res, "warning", json_string(ddpd_job_warning(j)));
            if (w->id)
                ddpd__send(s, ddpd_rpc_result(w->id, res));
            else
                json_decref(res);
        }
    }
    if (rc != 0 && !s->closing) reply_error(s, w, rc);
    ddpd__session_unref(s); /* may free a session that closed meanwhile */
    submit_free(w);
    start_next(d->loop);
}

static void start_next(uv_loop_t *loop)
{
    while (line.head && line.parsing < MAX_PARSING) {
        submit_t *w = line.head;
        line.head = w->next;
        if (!line.head) line.tail = &line.head;
        line.waiting--;
        line.parsing++;
        w->req.data = w;
        if (uv_queue_work(loop, &w->req, parse_work, parse_done) != 0) {
            w->rc = DDP_ENOMEM;
            parse_done(&w->req, 0);
        }
    }
}

static char *dup_or_null(const char *s) { return s ? ddp_strdup(s) : NULL; }

void ddpd__submit(ddpd_session_t *s, json_t *id, const char *path, const char *cwd,
                  const char *name, const char *origin, int workers, json_t *spec)
{
    if (line.waiting >= MAX_WAITING) {
        ddpd__send_error(s, id, DDPD_RPC_QUOTA, NULL,
                         "%d submissions are waiting to be read already; try again in a moment",
                         line.waiting);
        return;
    }
    /* the daemon may read what the submitter cannot: a path only from root or its own user */
    if (path && s->uid != 0 && s->uid != geteuid()) {
        ddpd__send_error(s, id, DDPD_RPC_SPEC_IO, json_pack("{ss}", "path", path),
                         "send the spec text (params.spec) instead of a path when the daemon "
                         "runs as another user");
        return;
    }
    submit_t *w = ddp_calloc(1, sizeof *w);
    if (!w) {
        ddpd__send_error(s, id, DDPD_RPC_INTERNAL, NULL, "out of memory");
        return;
    }
    w->s = s;
    w->id = id ? json_incref(id) : NULL;
    w->workers = workers;
    w->name = dup_or_null(name);
    w->cwd = dup_or_null(cwd);
    int ok = (!name || w->name) && (!cwd || w->cwd);
    if (path) {
        char full[PATH_MAX * 2 + 2];
        snprintf(full, sizeof full, "%s%s%s", path[0] == '/' || !cwd ? "" : cwd,
                 path[0] == '/' || !cwd ? "" : "/", path);
        w->path = ddp_strdup(full);
        ok = ok && w->path;
        snprintf(w->origin, sizeof w->origin, "%s", path);
    } else {
        snprintf(w->origin, sizeof w->origin, "%s", origin && *origin ? origin : "<inline>");
        if (json_is_string(spec)) {
            w->len = json_string_length(spec);
            w->text = ddp_malloc(w->len + 1);
            if (w->text) {
                memcpy(w->text, json_string_value(spec), w->len);
                w->text[w->len] = '\0';
            }
        } else {
            w->text = json_dumps(spec, JSON_COMPACT);
            w->len = w->text ? strlen(w->text) : 0;
        }
        ok = ok && w->text;
    }
    if (!ok) {
        submit_free(w);
        ddpd__send_error(s, id, DDPD_RPC_INTERNAL, NULL, "out of memory");
        return;
    }
    ddpd__session_ref(s);
    *line.tail = w;
    line.tail = &w->next;
    line.waiting++;
    start_next(s->d->loop);
}
