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
    char path[PATH_MAX + 32];
} ddpd_stream_t;

typedef struct ddpd_session {
    uv_pipe_t pipe;
    ddpd_t *d;
    struct ddpd_api *api;
    struct ddpd_session *next;
    uid_t uid;
    gid_t gid;
    pid_t pid;
    ddpd_lines_t in;   /* partial request line */
    int closing;       /* uv_close called: send nothing more */
    int eof;           /* the client half-closed */
    int close_after;   /* close once pending writes are flushed */
    int pending;       /* uv_write requests in flight */
    ddpd_stream_t *streams;
} ddpd_session_t;

struct ddpd_api {
    ddpd_t *d;
    uv_pipe_t listener;
    uv_timer_t tick; /* services log streams */
    ddpd_session_t *sessions;
    int n_sessions;
    int refs; /* freed when the listener, the tick and every session are closed */
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

#endif
