/* A control-socket session's output: queued writes, error responses, the end of a stream, and
 * closing once everything queued is written (see session.h). Loop thread only.
 */
#include "daemon/session.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "daemon/rpc.h"

typedef struct write_req {
    uv_write_t req;
    ddpd_session_t *s;
    char *line;
} write_req_t;

static void session_free(ddpd_session_t *s)
{
    ddpd_api_t *api = s->api;
    free(s->groups);
    free(s);
    if (--api->refs == 0) free(api);
}

static void session_closed(uv_handle_t *h)
{
    ddpd_session_t *s = h->data;
    ddpd_api_t *api = s->api;
    for (ddpd_session_t **pp = &api->sessions; *pp; pp = &(*pp)->next)
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    api->n_sessions--;
    while (s->streams) {
        ddpd_stream_t *st = s->streams;
        s->streams = st->next;
        json_decref(st->req_id);
        free(st);
    }
    ddpd_lines_free(&s->in);
    if (s->works > 0) s->gone = 1; /* a work still points here: the last one frees it */
    else session_free(s);
}

void ddpd__session_ref(ddpd_session_t *s) { s->works++; }

void ddpd__session_unref(ddpd_session_t *s)
{
    if (--s->works == 0 && s->gone) session_free(s);
}

int ddpd__session_may_see(const ddpd_session_t *s, uint32_t uid)
{
    return s->admin || s->uid == uid;
}

void ddpd__session_close(ddpd_session_t *s)
{
    if (s->closing) return;
    s->closing = 1;
    uv_close((uv_handle_t *)&s->pipe, session_closed);
}

void ddpd__session_maybe_close(ddpd_session_t *s)
{
    if (s->closing || s->pending) return;
    if (s->close_after || (s->eof && !s->streams)) ddpd__session_close(s);
}

static void write_done(uv_write_t *req, int status)
{
    write_req_t *w = (write_req_t *)req;
    ddpd_session_t *s = w->s;
    free(w->line);
    free(w);
    s->pending--;
    if (status < 0 && !s->closing) {
        DDP_DEBUG("api: write to pid %d failed: %s", (int)s->pid, uv_strerror(status));
        s->close_after = 1;
    }
    ddpd__session_maybe_close(s);
}

void ddpd__send(ddpd_session_t *s, char *line)
{
    if (!line) return;
    if (s->closing) {
        free(line);
        return;
    }
    write_req_t *w = ddp_malloc(sizeof *w);
    if (!w) {
        free(line);
        s->close_after = 1;
        ddpd__session_maybe_close(s);
        return;
    }
    w->s = s;
    w->line = line;
    uv_buf_t b = uv_buf_init(line, (unsigned)strlen(line));
    int rc = uv_write(&w->req, (uv_stream_t *)&s->pipe, &b, 1, write_done);
    if (rc < 0) {
        free(line);
        free(w);
        ddpd__session_close(s);
        return;
    }
    s->pending++;
}

void ddpd__send_error(ddpd_session_t *s, json_t *id, int code, json_t *data, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    s->d->n_request_errors++;
    ddpd__send(s, ddpd_rpc_error(id, code, msg, data));
}

void ddpd__stream_end(ddpd_session_t *s, ddpd_stream_t *st, json_t *result)
{
    for (ddpd_stream_t **pp = &s->streams; *pp; pp = &(*pp)->next)
        if (*pp == st) {
            *pp = st->next;
            break;
        }
    if (!json_is_null(st->req_id))
        ddpd__send(s, ddpd_rpc_result(st->req_id, result));
    else
        json_decref(result);
    json_decref(st->req_id);
    free(st);
    ddpd__session_maybe_close(s);
}

