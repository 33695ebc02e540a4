/* Lines over libuv streams (see lines.h). */
#include "daemon/lines.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"

int ddpd_lines_feed(ddpd_lines_t *l, const char *data, size_t n, size_t max_line,
                    ddpd_line_fn fn, void *arg)
{
    while (n) {
        const char *nl = memchr(data, '\n', n);
        size_t take = nl ? (size_t)(nl - data) : n;
        if (l->len + take > max_line) return DDP_EPROTO;
        if (l->len + take > l->cap) {
            size_t cap = l->cap ? l->cap : 4096;
            while (cap < l->len + take) cap *= 2;
            char *nb = ddp_realloc(l->buf, cap);
            if (!nb) return DDP_ENOMEM;
            l->buf = nb;
            l->cap = cap;
        }
        memcpy(l->buf + l->len, data, take);
        l->len += take;
        if (!nl) break;
        data += take + 1;
        n -= take + 1;
        size_t len = l->len;
        l->len = 0;
        if (fn(arg, l->buf, len)) return 1;
    }
    return 0;
}

void ddpd_lines_free(ddpd_lines_t *l)
{
    free(l->buf);
    memset(l, 0, sizeof *l);
}

typedef struct {
    uv_write_t req;
    char *data;
} wreq_t;

static void written(uv_write_t *r, int status)
{
    (void)status; /* a failed write shows as a read error on the same stream */
    wreq_t *w = (wreq_t *)r;
    free(w->data);
    free(w);
}

int ddpd_lines_send(uv_stream_t *stream, json_t *msg)
{
    char *s = json_dumps(msg, JSON_COMPACT);
    wreq_t *w = ddp_malloc(sizeof *w);
    if (!s || !w) {
        free(s);
        free(w);
        return UV_ENOMEM;
    }
    size_t n = strlen(s);
    s[n] = '\n'; /* json_dumps's NUL becomes the newline: the buffer is n + 1 bytes */
    w->data = s;
    uv_buf_t b = uv_buf_init(s, (unsigned)n + 1);
    int rc = uv_write(&w->req, stream, &b, 1, written);
    if (rc) {
        free(s);
        free(w);
    }
    return rc;
}

void ddpd_lines_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b)
{
    (void)h;
    (void)suggested;
    b->base = ddp_malloc(65536);
    b->len = b->base ? 65536 : 0;
}
