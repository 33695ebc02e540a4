/* A session of the control socket and what is sent on it: the state api.c (socket, framing,
 * dispatch) and methods.c (the method handlers and their streams) share, and the output side
 * (session.c) both use. Not for other modules. Loop thread only.
 */
#ifndef DDPD_SESSION_H
#define DDPD_SESSION_H

#include <jansson.h>
#include <limits.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "daemon/lines.h"

#include "daemon/ddpd.h"

typedef enum { DDPD_STREAM_LOGS, DDPD_STREAM_WATCH } ddpd_stream_kind_t;

/* A streaming request in progress (job.logs, job.watch): notifications until it ends with the
 * response to its request id. Plain memory; freed by ddpd__stream_end or with its session. */
typedef struct ddpd_stream {
    struct ddpd_stream *next;
    ddpd_stream_kind_t kind;
    json_t *req_id; /* owned reference */
    int64_t job;
    int rank, follow;
    int64_t off;
    uint32_t owner;     /* logs: the job's user, who must own the log */
    int refused;        /* logs: the log failed userfs.h's checks (said once) */
    char path[PATH_MAX]; /* logs: the job's run directory */
} ddpd_stream_t;

typedef struct ddpd_session {
    uv_pipe_t pipe;
    ddpd_t *d;
    struct ddpd_api *api;
    struct ddpd_session *next;
    uid_t uid;          /* SO_PEERCRED */
    gid_t gid;
    pid_t pid;
    uint32_t *groups;   /* SO_PEERGROUPS: the client's supplementary groups (owned) */
    int n_groups;
    int admin;          /* root or a member of admin_group: sees and cancels every job */
    ddpd_lines_t in;   /* partial request line */
    int closing;       /* uv_close called: send nothing more */
    int eof;           /* the client half-closed */
    int close_after;   /* close once pending writes are flushed */
    int pending;       /* uv_write requests in flight */
    int works;         /* requests being worked on off the loop (submit.c) */
    int gone;          /* closed while works ran: the last one frees it (ddpd__session_unref) */
    ddpd_stream_t *streams;
} ddpd_session_t;

struct ddpd_api {
    ddpd_t *d;
    uv_pipe_t listener;
    uv_timer_t tick; /* services log streams */
    ddpd_session_t *sessions;
    int n_sessions;
    int refs; /* freed when the listener, the tick and every session are closed */
    gid_t admin_gid; /* config admin_group, when have_admin_gid */
    int have_admin_gid;
};

/* Queues one line (takes ownership of `line`; NULL = out of memory, ignored). */
void ddpd__send(ddpd_session_t *s, char *line);
/* Sends an error response; data (stolen) may be NULL. */
void ddpd__send_error(ddpd_session_t *s, json_t *id, int code, json_t *data, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* Ends a stream with `result` (stolen) as the response to its request, and frees it. */
void ddpd__stream_end(ddpd_session_t *s, ddpd_stream_t *st, json_t *result);
/* Closes the session now (uv_close; it is freed in the close callback). */
void ddpd__session_close(ddpd_session_t *s);
/* Closes the session once what is queued is written, or now if it is idle. */
void ddpd__session_maybe_close(ddpd_session_t *s);
/* A work on the session's behalf (submit.c) begins / ends. A session closed meanwhile stays in
 * memory, answering nothing (closing is set), until its last work ends. */
void ddpd__session_ref(ddpd_session_t *s);
void ddpd__session_unref(ddpd_session_t *s);
/* Whether the session may see job `uid`'s job: its own, or the session is root's or an
 * admin's. */
int ddpd__session_may_see(const ddpd_session_t *s, uint32_t uid);

#endif
