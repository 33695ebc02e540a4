/* The control socket: listener, sessions, line framing and request validation.
 *
 * Framing: one JSON object per line. A line longer than DDPD_MAX_LINE (1 MiB) gets a -32600
 * error and the connection is closed once the error is written; other sessions are untouched.
 * A session that fails inside a callback is flagged (closing) and freed in its close callback,
 * never in the middle of dispatch. After the client half-closes, queued responses and running
 * streams still finish, then the session closes.
 * Bursts: the listener's backlog is the system's maximum (net.core.somaxconn), so a thousand
 * clients connecting at once queue in the kernel instead of getting EAGAIN; the fd limit is
 * raised to its hard limit for the same reason (one fd per session).
 * Who: each session carries its client's uid, gid and supplementary groups from the kernel
 * (SO_PEERCRED, SO_PEERGROUPS), never from the client. One uid holds at most
 * max_sessions_per_user sessions (root: no cap), so idle connections of one user cannot use up
 * the daemon's descriptors; the one over the cap is told so and closed.
 */
#include "daemon/api.h"
#include "daemon/lines.h"
#include "daemon/methods.h"
#include "daemon/session.h"

#include <errno.h>
#include <grp.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/file.h"
#include "common/log.h"
#include "daemon/job.h"
#include "daemon/rpc.h"

/* Validates the envelope of one request line (ddpd_rpc_parse_request) and dispatches it. */
static void handle_line(ddpd_session_t *s, const char *line, size_t len)
{
    ddpd_rpc_req_t req;
    char *err = NULL;
    int rc = ddpd_rpc_parse_request(line, len, &req, &err);
    if (rc == 1) return; /* blank line */
    s->d->n_requests++;
    if (rc < 0) {
        s->d->n_request_errors++;
        if (err) ddpd__send(s, err);
        else s->close_after = 1; /* out of memory: not even an error line */
        return;
    }
    ddpd__dispatch(s, req.id, req.method, req.params);
    json_decref(req.root);
}

static int on_line(void *arg, const char *line, size_t len)
{
    ddpd_session_t *s = arg;
    handle_line(s, line, len);
    return s->closing || s->close_after;
}

static void read_cb(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    ddpd_session_t *s = st->data;
    if (nread < 0) {
        free(buf->base);
        uv_read_stop(st);
        s->eof = 1;
        if (nread != UV_EOF) s->close_after = 1;
        ddpd__session_maybe_close(s);
        return;
    }
    if (!s->closing && !s->close_after &&
        ddpd_lines_feed(&s->in, buf->base, (size_t)nread, DDPD_MAX_LINE, on_line, s) < 0) {
        ddpd__send_error(s, NULL, DDPD_RPC_INVALID,
                         json_pack("{sI}", "limit", (json_int_t)DDPD_MAX_LINE),
                         "request line longer than %u bytes; closing the connection",
                         DDPD_MAX_LINE);
        DDP_WARN("api: pid %d uid %u sent a line over %u bytes: connection closed",
                 (int)s->pid, (unsigned)s->uid, DDPD_MAX_LINE);
        uv_read_stop(st);
        s->close_after = 1;
    }
    free(buf->base);
    ddpd__session_maybe_close(s);
}

/* The client's supplementary groups as the kernel captured them at connect (SO_PEERGROUPS,
 * Linux 4.13): *n of them in a new array. A kernel without it (ENOPROTOOPT) gives none. Returns
 * 0 or -errno. */
static int peer_groups(int fd, uint32_t **out, int *n)
{
    *out = NULL;
    *n = 0;
    socklen_t len = 32 * sizeof(gid_t);
    for (int tries = 0; tries < 2; tries++) {
        gid_t *g = ddp_malloc(len ? len : sizeof *g);
        if (!g) return -ENOMEM;
        socklen_t got = len;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &got) == 0) {
            *n = (int)(got / sizeof *g);
            *out = (uint32_t *)g; /* gid_t is a 32-bit unsigned here */
            return 0;
        }
        int e = errno;
        free(g);
        if (e == ENOPROTOOPT) return 0;
        if (e != ERANGE) return -e;
        len = got; /* the kernel said how much it needs */
    }
    return -ERANGE;
}

static int in_groups(const ddpd_session_t *s, gid_t gid)
{
    if (s->gid == gid) return 1;
    for (int i = 0; i < s->n_groups; i++)
        if (s->groups[i] == gid) return 1;
    return 0;
}

static int sessions_of(ddpd_api_t *api, uid_t uid)
{
    int n = 0;
    for (ddpd_session_t *s = api->sessions; s; s = s->next) n += !s->closing && s->uid == uid;
    return n;
}

static void on_connection(uv_stream_t *server, int status)
{
    ddpd_api_t *api = server->data;
    if (status < 0) {
        DDP_WARN("api: accept: %s", uv_strerror(status));
        return;
    }
    ddpd_session_t *s = ddp_calloc(1, sizeof *s);
    if (!s) return;
    s->d = api->d;
    s->api = api;
    api->refs++;
    uv_pipe_init(api->d->loop, &s->pipe, 0);
    s->pipe.data = s;
    s->next = api->sessions;
    api->sessions = s;
    api->n_sessions++;
    if (uv_accept(server, (uv_stream_t *)&s->pipe) != 0) {
        ddpd__session_close(s);
        return;
    }
    uv_os_fd_t fd;
    struct ucred cred;
    socklen_t cl = sizeof cred;
    if (uv_fileno((uv_handle_t *)&s->pipe, &fd) != 0 ||
        getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0) {
        DDP_WARN("api: no peer credentials: connection refused");
        ddpd__session_close(s);
        return;
    }
    _Static_assert(sizeof(gid_t) == sizeof(uint32_t), "gids are 32-bit");
    int rc = peer_groups(fd, &s->groups, &s->n_groups);
    if (rc != 0) {
        DDP_WARN("api: no supplementary groups of pid %d: %s: connection refused",
                 (int)cred.pid, strerror(-rc));
        ddpd__session_close(s);
        return;
    }
    s->pid = cred.pid;
    s->gid = cred.gid;
    int over = cred.uid != 0 && sessions_of(api, cred.uid) >= api->d->cfg.max_sessions_per_user;
    s->uid = cred.uid; /* counted from here on */
    s->admin = cred.uid == 0 || (api->have_admin_gid && in_groups(s, api->admin_gid));
    if (over) {
        DDP_WARN("api: uid %u has %d connections open, its limit (max_sessions_per_user): "
                 "one more refused", (unsigned)cred.uid, api->d->cfg.max_sessions_per_user);
        ddpd__send_error(s, NULL, DDPD_RPC_QUOTA, NULL,
                         "uid %u has %d connections open to this daemon, its limit "
                         "(max_sessions_per_user); close some", (unsigned)cred.uid,
                         api->d->cfg.max_sessions_per_user);
        s->close_after = 1;
        ddpd__session_maybe_close(s);
        return;
    }
    if (api->d->stopping) {
        ddpd__send_error(s, NULL, DDPD_RPC_STOPPING, NULL, "the daemon is shutting down");
        s->close_after = 1;
        return;
    }
    uv_read_start((uv_stream_t *)&s->pipe, ddpd_lines_alloc, read_cb);
}

static void tick_cb(uv_timer_t *t)
{
    ddpd_api_t *api = t->data;
    for (ddpd_session_t *s = api->sessions; s; s = s->next)
        if (!s->closing && s->streams) ddpd__service_logs(s);
}

/* A job changed state or reported a step: its watchers hear of it. */
static void job_changed(void *arg, ddpd_job_t *j, unsigned what)
{
    ddpd_t *d = arg;
    if (!d->api || !(what & (DDPD_JOB_STATE | DDPD_JOB_PROGRESS))) return;
    for (ddpd_session_t *s = d->api->sessions; s; s = s->next)
        if (!s->closing && s->streams) ddpd__watch_event(s, j);
}

/* The largest listen backlog the kernel grants: net.core.somaxconn, or 4096 (the default since
 * Linux 5.4) when it cannot be read. The kernel clamps larger values, so erring high is safe. */
static int max_backlog(void)
{
    int v = 0;
    FILE *f = fopen("/proc/sys/net/core/somaxconn", "re");
    if (f) {
        if (fscanf(f, "%d", &v) != 1) v = 0;
        fclose(f);
    }
    return v > 0 ? v : 4096;
}

/* mkdir -p for the socket's directory. */
static void make_parent(const char *path)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir) return;
    *slash = 0;
    for (char *p = dir + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(dir, 0755);
            *p = '/';
        }
    mkdir(dir, 0755);
}

/* A socket file that nobody answers on is stale (a daemon that died): remove it. A live one
 * means another daemon owns the path. */
static int check_stale(const char *path, ddp_errinfo_t *ei)
{
    struct stat sb;
    if (lstat(path, &sb) != 0) return 0;
    if (!S_ISSOCK(sb.st_mode))
        return ddp_errinfo_set(ei, DDP_EBUSY, "%s exists and is not a socket", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    int live = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0) close(fd);
    if (live) return ddp_errinfo_set(ei, DDP_EBUSY, "another ddpd is serving %s", path);
    unlink(path);
    return 0;
}

int ddpd_api_start(ddpd_t *d, ddp_errinfo_t *ei)
{
    const char *path = d->cfg.socket_path;
    if (strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path))
        return ddp_errinfo_set(ei, DDP_EINVAL, "socket path too long (%zu bytes): %s",
                               strlen(path), path);
    ddpd_api_t *api = ddp_calloc(1, sizeof *api);
    if (!api) return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    api->d = d;
    d->api = api;
    ddpd_job_on_change(d, job_changed, d);
    uv_timer_init(d->loop, &api->tick);
    api->tick.data = api;
    uv_pipe_init(d->loop, &api->listener, 0);
    api->listener.data = api;
    api->refs = 2; /* listener + tick; each session adds one */
    make_parent(path);
    DDP_CHECK(check_stale(path, ei));
    mode_t old = umask(0117); /* the socket file is created 0660 */
    int rc = uv_pipe_bind(&api->listener, path);
    umask(old);
    ddp_file_raise_fd_limit(); /* every session holds one descriptor */
    int backlog = max_backlog();
    if (rc == 0) rc = uv_listen((uv_stream_t *)&api->listener, backlog, on_connection);
    if (rc != 0)
        return ddp_errinfo_set(ei, DDP_EIO, "cannot listen on %s: %s", path, uv_strerror(rc));
    if (chmod(path, 0660) != 0) DDP_WARN("api: chmod %s: %s", path, strerror(errno));
    if (d->cfg.socket_group[0]) {
        struct group *g = getgrnam(d->cfg.socket_group);
        if (!g)
            DDP_WARN("api: socket_group '%s' does not exist", d->cfg.socket_group);
        else if (chown(path, (uid_t)-1, g->gr_gid) != 0)
            DDP_WARN("api: chown %s: %s", path, strerror(errno));
    }
    if (d->cfg.admin_group[0]) {
        struct group *g = getgrnam(d->cfg.admin_group);
        if (!g)
            return ddp_errinfo_set(ei, DDP_EINVAL, "admin_group '%s' does not exist",
                                   d->cfg.admin_group);
        api->admin_gid = g->gr_gid;
        api->have_admin_gid = 1;
    }
    uv_timer_start(&api->tick, tick_cb, 200, 200);
    DDP_DEBUG("api: listening on %s, backlog %d", path, backlog);
    return 0;
}

static void api_freed(uv_handle_t *h)
{
    ddpd_api_t *api = h->data;
    if (--api->refs == 0) free(api);
}

void ddpd_api_close(ddpd_t *d)
{
    ddpd_api_t *api = d->api;
    if (!api) return;
    d->api = NULL;
    for (ddpd_session_t *s = api->sessions; s; s = s->next) ddpd__session_close(s);
    unlink(d->cfg.socket_path);
    uv_close((uv_handle_t *)&api->listener, api_freed);
    uv_close((uv_handle_t *)&api->tick, api_freed);
}
