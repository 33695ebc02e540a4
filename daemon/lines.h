/* Lines over a libuv stream: the framing every daemon connection uses (one JSON object per line:
 * the control API, peer links, the elastic coordinator). Feeding bytes in and writing objects
 * out; no policy. Loop thread only.
 */
#ifndef DDPD_LINES_H
#define DDPD_LINES_H

#include <jansson.h>
#include <stddef.h>
#include <uv.h>

/* The partial line of one connection. Zero-initialise; ddpd_lines_free releases it. */
typedef struct ddpd_lines {
    char *buf;
    size_t len, cap;
} ddpd_lines_t;

/* Called for each complete line (without its newline; borrowed until the call returns).
 * Returns nonzero to stop feeding (the connection is being closed). */
typedef int (*ddpd_line_fn)(void *arg, const char *line, size_t len);

/* Appends n bytes, calling fn for every line they complete. Returns 0, 1 when fn asked to stop,
 * or DDP_EPROTO when a line grows past max_line bytes (the rest is not read) or DDP_ENOMEM. */
int ddpd_lines_feed(ddpd_lines_t *l, const char *data, size_t n, size_t max_line,
                    ddpd_line_fn fn, void *arg);
void ddpd_lines_free(ddpd_lines_t *l);

/* Writes msg as one line to stream (takes a reference of nothing: msg stays the caller's).
 * Returns 0 or a libuv error (the caller closes the stream). */
int ddpd_lines_send(uv_stream_t *stream, json_t *msg);

/* An alloc_cb for uv_read_start: 64 KiB from the heap (the read callback frees it). */
void ddpd_lines_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b);

#endif
