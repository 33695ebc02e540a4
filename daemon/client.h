/* A blocking JSON-RPC client for the control socket (ddpctl, tests, benchmarks). Not for the
 * daemon's loop. One client per thread.
 */
#ifndef DDPD_CLIENT_H
#define DDPD_CLIENT_H

#include <jansson.h>
#include <stddef.h>

typedef struct ddpd_client {
    int fd;
    char *buf;
    size_t len, cap;
    long next_id;
} ddpd_client_t;

/* The system daemon's socket (deploy/ddpd.service's RuntimeDirectory). */
#define DDPD_SYSTEM_SOCKET "/run/ddpd/ddpd.sock"

/* Where a daemon listens unless told otherwise (the same rule for ddpd and its clients):
 * DDPD_SYSTEM_SOCKET for root, else $XDG_RUNTIME_DIR/ddpd.sock, else /tmp/ddpd-<uid>.sock.
 * ddpctl of a user with no such socket talks to the system daemon's (ctl/main.c). */
void ddpd_default_socket_path(char *buf, size_t n);

/* Where a daemon keeps its job store and run directories unless told otherwise (ddpd's default,
 * so that of `ddpctl run`'s embedded daemon, and where ddpctl reads a job when no daemon
 * answers): $DDPD_STATE_DIR, else /var/lib/ddpd for root, else $XDG_STATE_HOME/ddpd, else
 * $HOME/.local/state/ddpd. */
void ddpd_default_state_dir(char *buf, size_t n);

/* How long ddpd_client_connect keeps retrying a refused or full socket (milliseconds). */
#define DDPD_CLIENT_RETRY_MS 1000

/* Connects to the Unix socket at path, retrying EAGAIN (the listener's backlog is full) and
 * ECONNREFUSED (nobody listens yet, or a stale socket file) with backoff for up to
 * DDPD_CLIENT_RETRY_MS. Returns 0 or -errno (ENOENT at once when there is no socket file).
 * Blocking; any thread, one client per thread. */
int ddpd_client_connect(ddpd_client_t *c, const char *path);
/* Closes. Safe on a zeroed or closed client. */
void ddpd_client_close(ddpd_client_t *c);
/* Sends one request; params is stolen (NULL = none). *id gets the request id. 0 or -errno
 * (-EMSGSIZE: the line would be over DDPD_MAX_LINE, which the daemon refuses; nothing sent). */
int ddpd_client_send(ddpd_client_t *c, const char *method, json_t *params, long *id);
/* Sends raw bytes (tests). 0 or -errno. */
int ddpd_client_send_raw(ddpd_client_t *c, const void *data, size_t len);
/* Receives one message (response or notification). timeout_ms < 0 waits forever.
 * Returns 0, -ETIMEDOUT, -ECONNRESET on EOF, -EPROTO for a line that is not JSON. */
int ddpd_client_recv(ddpd_client_t *c, json_t **msg, int timeout_ms);
/* Sends and waits for the response to it, skipping notifications. On a JSON-RPC error returns
 * 1 and sets *error (new ref); on success 0 and *result (new ref). Negative on I/O errors. */
int ddpd_client_call(ddpd_client_t *c, const char *method, json_t *params, json_t **result,
                     json_t **error, int timeout_ms);

#endif
