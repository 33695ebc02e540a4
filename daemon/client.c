/* Blocking control-socket client (see client.h). */
#include "client.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "daemon/rpc.h"

/* One connect attempt: 0 with c->fd set, or -errno. */
static int connect_once(ddpd_client_t *c, const struct sockaddr_un *a)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    if (connect(fd, (const struct sockaddr *)a, sizeof *a) != 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    c->fd = fd;
    return 0;
}

int ddpd_client_connect(ddpd_client_t *c, const char *path)
{
    memset(c, 0, sizeof *c);
    c->fd = -1;
    c->next_id = 1;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof a.sun_path) return -ENAMETOOLONG;
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    /* A full backlog (EAGAIN) or a listener between bind and listen (ECONNREFUSED) is brief:
     * retry with doubling waits, 1 ms up to 100 ms, for at most DDPD_CLIENT_RETRY_MS. */
    int64_t deadline = ddp_now_ns() + (int64_t)DDPD_CLIENT_RETRY_MS * 1000000;
    long wait_us = 1000;
    for (;;) {
        int rc = connect_once(c, &a);
        if (rc != -EAGAIN && rc != -ECONNREFUSED && rc != -EINTR) return rc;
        if (ddp_now_ns() + wait_us * 1000 > deadline) return rc;
        struct timespec ts = {.tv_sec = wait_us / 1000000, .tv_nsec = (wait_us % 1000000) * 1000};
        nanosleep(&ts, NULL);
        wait_us = wait_us * 2 > 100000 ? 100000 : wait_us * 2;
    }
}

void ddpd_client_close(ddpd_client_t *c)
{
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    free(c->buf);
    c->buf = NULL;
    c->len = c->cap = 0;
}

int ddpd_client_send_raw(ddpd_client_t *c, const void *data, size_t len)
{
    const char *p = data;
    while (len) {
        ssize_t n = send(c->fd, p, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int ddpd_client_send(ddpd_client_t *c, const char *method, json_t *params, long *id)
{
    long rid = c->next_id++;
    json_t *o = json_pack("{ss sI ss}", "jsonrpc", "2.0", "id", (json_int_t)rid, "method", method);
    if (params) json_object_set_new(o, "params", params);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) return -ENOMEM;
    size_t n = strlen(s);
    if (n > DDPD_MAX_LINE) { /* the daemon would refuse it and close the connection */
        free(s);
        return -EMSGSIZE;
    }
    s[n] = '\n'; /* replaces the NUL: the buffer is sent by length */
    int rc = ddpd_client_send_raw(c, s, n + 1);
    free(s);
    if (id) *id = rid;
    return rc;
}

int ddpd_client_recv(ddpd_client_t *c, json_t **msg, int timeout_ms)
{
    int64_t deadline = timeout_ms < 0 ? -1 : ddp_now_ns() + (int64_t)timeout_ms * 1000000;
    for (;;) {
        char *nl = c->len ? memchr(c->buf, '\n', c->len) : NULL;
        if (nl) {
            size_t l = (size_t)(nl - c->buf);
            /* a log's bytes may hold NUL (a byte-level model's sample): "\u0000" in a string */
            json_t *o = json_loadb(c->buf, l, JSON_ALLOW_NUL, NULL);
            memmove(c->buf, nl + 1, c->len - l - 1);
            c->len -= l + 1;
            if (!o) return -EPROTO;
            *msg = o;
            return 0;
        }
        int wait = -1;
        if (deadline >= 0) {
            int64_t left = deadline - ddp_now_ns();
            if (left <= 0) return -ETIMEDOUT;
            wait = (int)(left / 1000000) + 1;
        }
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        int pr = poll(&pfd, 1, wait);
        if (pr < 0 && errno == EINTR) return -EINTR;
        if (pr < 0) return -errno;
        if (pr == 0) continue;
        if (c->cap - c->len < 65536) {
            size_t cap = c->cap ? c->cap * 2 : 131072;
            char *nb = ddp_realloc(c->buf, cap);
            if (!nb) return -ENOMEM;
            c->buf = nb;
            c->cap = cap;
        }
        ssize_t n = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
        if (n < 0) {
            if (errno == EINTR) return -EINTR;
            return -errno;
        }
        if (n == 0) return -ECONNRESET;
        c->len += (size_t)n;
    }
}

int ddpd_client_call(ddpd_client_t *c, const char *method, json_t *params, json_t **result,
                     json_t **error, int timeout_ms)
{
    long id;
    *result = NULL;
    if (error) *error = NULL;
    int rc = ddpd_client_send(c, method, params, &id);
    if (rc) return rc;
    for (;;) {
        json_t *m;
        rc = ddpd_client_recv(c, &m, timeout_ms);
        if (rc) return rc;
        json_t *mid = json_object_get(m, "id");
        if (json_is_integer(mid) && json_integer_value(mid) == id) {
            json_t *e = json_object_get(m, "error");
            if (e) {
                if (error) *error = json_incref(e);
                json_decref(m);
                return 1;
            }
            *result = json_incref(json_object_get(m, "result"));
            json_decref(m);
            return 0;
        }
        json_decref(m);
    }
}

void ddpd_default_socket_path(char *buf, size_t n)
{
    const char *xrt = getenv("XDG_RUNTIME_DIR");
    if (geteuid() == 0)
        snprintf(buf, n, "%s", DDPD_SYSTEM_SOCKET);
    else if (xrt && *xrt)
        snprintf(buf, n, "%s/ddpd.sock", xrt);
    else
        snprintf(buf, n, "/tmp/ddpd-%u.sock", (unsigned)geteuid());
}

void ddpd_default_state_dir(char *buf, size_t n)
{
    const char *sd = getenv("DDPD_STATE_DIR"), *xs = getenv("XDG_STATE_HOME");
    const char *home = getenv("HOME");
    if (sd && *sd)
        snprintf(buf, n, "%s", sd);
    else if (geteuid() == 0)
        snprintf(buf, n, "/var/lib/ddpd");
    else if (xs && *xs)
        snprintf(buf, n, "%s/ddpd", xs);
    else
        snprintf(buf, n, "%s/.local/state/ddpd", home ? home : "/tmp");
}
