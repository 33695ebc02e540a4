/* Bursts on the control socket: a real ddpd gets 1,000 connections opened at once (all
 * connect() calls made before any request is sent, none of them retried), then a request on
 * every one of them, and every one must be answered. With the old backlog of 128 the
 * non-blocking connects past the backlog fail with EAGAIN while the daemon is busy accepting.
 * Also: the listener's backlog as the kernel reports it (ss) is net.core.somaxconn; 4 processes
 * × 250 clients through ddpd_client_connect at once are all answered; and the client retries a
 * refused socket for DDPD_CLIENT_RETRY_MS before giving up. DDPD_BURST_N sets the count.
 * Skips (77) only where 1,100 descriptors cannot be had.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "daemon/client.h"
#include "tests/integration/harness.h"

static const char REQ[] = "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"daemon.status\"}\n";

static int somaxconn(void)
{
    int v = -1;
    FILE *f = fopen("/proc/sys/net/core/somaxconn", "re");
    if (f) {
        if (fscanf(f, "%d", &v) != 1) v = -1;
        fclose(f);
    }
    return v;
}

/* The listen backlog ss reports for the socket path (its Send-Q column), or -1. */
static int ss_backlog(const char *path)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "ss -xlH 2>/dev/null | grep -F ' %s ' | awk '{print $4}'", path);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    int v = -1;
    if (fscanf(p, "%d", &v) != 1) v = -1;
    pclose(p);
    return v;
}

/* Waits until every fd in fds has a complete response line containing "result" (deadline
 * 120 s). Returns how many were answered. */
static int read_all(int *fds, int n)
{
    struct pollfd *pf = calloc((size_t)n, sizeof *pf);
    char(*buf)[512] = calloc((size_t)n, sizeof *buf);
    size_t *len = calloc((size_t)n, sizeof *len);
    int answered = 0, open_n = 0;
    for (int i = 0; i < n; i++) {
        pf[i].fd = fds[i];
        pf[i].events = POLLIN;
        if (fds[i] >= 0) open_n++;
    }
    int64_t deadline = ddp_now_ns() + 120LL * 1000000000;
    while (open_n > 0 && ddp_now_ns() < deadline) {
        if (poll(pf, (nfds_t)n, 1000) < 0 && errno != EINTR) break;
        for (int i = 0; i < n; i++) {
            if (pf[i].fd < 0 || !(pf[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
            ssize_t r = recv(pf[i].fd, buf[i] + len[i], sizeof buf[i] - 1 - len[i], 0);
            if (r > 0) len[i] += (size_t)r;
            buf[i][len[i]] = 0;
            int done = r <= 0 || memchr(buf[i], '\n', len[i]) || len[i] == sizeof buf[i] - 1;
            if (!done) continue;
            if (strstr(buf[i], "\"result\"") && strstr(buf[i], "\"id\":7")) answered++;
            pf[i].fd = -1;
            open_n--;
        }
    }
    free(pf);
    free(buf);
    free(len);
    return answered;
}

/* Child: n clients through ddpd_client_connect at once, a request on each, all answers read.
 * Exits 0 when all were answered. */
static void client_burst(const char *path, int n)
{
    int *fds = calloc((size_t)n, sizeof *fds);
    ddpd_client_t c;
    for (int i = 0; i < n; i++) {
        fds[i] = ddpd_client_connect(&c, path) == 0 ? c.fd : -1;
    }
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0 && send(fds[i], REQ, sizeof REQ - 1, MSG_NOSIGNAL) < 0) {
            close(fds[i]);
            fds[i] = -1;
        }
    int ok = read_all(fds, n);
    _exit(ok == n ? 0 : 1);
}

int main(void)
{
    int n = getenv("DDPD_BURST_N") ? atoi(getenv("DDPD_BURST_N")) : 1000;
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < (rlim_t)n + 100) {
        printf("1..0 # SKIP the fd hard limit (%llu) is below %d\n",
               (unsigned long long)rl.rlim_max, n + 100);
        return 77;
    }
    rl.rlim_cur = rl.rlim_max; /* ddpd inherits it and raises its own anyway */
    setrlimit(RLIMIT_NOFILE, &rl);

    ddpd_test_daemon_t D;
    if (ddpd_test_start(&D, NULL) != 0) {
        tap_ok(0, "ddpd starts");
        return tap_done();
    }
    int max = somaxconn();
    int bl = ss_backlog(D.socket);
    if (bl >= 0)
        tap_ok(bl == max, "listen backlog is net.core.somaxconn: ss says %d, somaxconn %d", bl,
               max);
    else
        printf("# ss unavailable: backlog not read back\n");

    /* 1: n raw non-blocking connects at once, no retry. */
    int *fds = calloc((size_t)n, sizeof *fds);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    if (strlen(D.socket) >= sizeof a.sun_path) {
        tap_ok(0, "socket path fits sun_path: %s", D.socket);
        ddpd_test_stop(&D);
        return tap_done();
    }
    memcpy(a.sun_path, D.socket, strlen(D.socket) + 1);
    int connected = 0, eagain = 0, other = 0;
    int64_t t0 = ddp_now_ns();
    for (int i = 0; i < n; i++) {
        fds[i] = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fds[i] >= 0 && connect(fds[i], (struct sockaddr *)&a, sizeof a) == 0) {
            connected++;
            continue;
        }
        if (errno == EAGAIN) eagain++;
        else other++;
        if (fds[i] >= 0) close(fds[i]);
        fds[i] = -1;
    }
    double conn_ms = (double)(ddp_now_ns() - t0) / 1e6;
    tap_ok(connected == n, "%d of %d non-blocking connects made at once succeed (EAGAIN %d, "
           "other errors %d; %.1f ms)", connected, n, eagain, other, conn_ms);
    int sent = 0;
    for (int i = 0; i < n; i++) {
        if (fds[i] < 0) continue;
        /* the socket is non-blocking but the request is far below the socket buffer */
        if (send(fds[i], REQ, sizeof REQ - 1, MSG_NOSIGNAL) == (ssize_t)(sizeof REQ - 1)) sent++;
    }
    tap_ok(sent == connected, "a request sent on each (%d)", sent);
    t0 = ddp_now_ns();
    int answered = read_all(fds, n);
    tap_ok(answered == n, "%d of %d answered (%.0f ms)", answered, n,
           (double)(ddp_now_ns() - t0) / 1e6);
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0) close(fds[i]);
    free(fds);

    /* 2: 4 processes × n/4 clients through the client library, at once. */
    pid_t kids[4];
    for (int k = 0; k < 4; k++) {
        kids[k] = fork();
        if (kids[k] == 0) client_burst(D.socket, n / 4);
    }
    int kids_ok = 0;
    for (int k = 0; k < 4; k++) {
        int st;
        if (kids[k] > 0 && waitpid(kids[k], &st, 0) == kids[k] && WIFEXITED(st) &&
            WEXITSTATUS(st) == 0)
            kids_ok++;
    }
    tap_ok(kids_ok == 4, "4 processes x %d ddpd_client_connect clients at once: %d of 4 had "
           "every request answered", n / 4, kids_ok);

    ddpd_client_t c;
    tap_ok(ddpd_client_connect(&c, D.socket) == 0, "the daemon still answers a new client");
    json_t *res = NULL;
    tap_ok(ddpd_client_call(&c, "daemon.status", NULL, &res, NULL, 10000) == 0 && res,
           "daemon.status after the bursts");
    json_decref(res);
    ddpd_client_close(&c);
    int st = ddpd_test_stop(&D);
    tap_ok(WIFEXITED(st) && WEXITSTATUS(st) == 0, "ddpd exits 0 on SIGTERM (status 0x%x)", st);

    /* 3: a socket file nobody listens on: refused, retried for the window, then the error. */
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un b = {.sun_family = AF_UNIX};
    snprintf(b.sun_path, sizeof b.sun_path, "/tmp/ddpd-burst-%d.sock", (int)getpid());
    unlink(b.sun_path);
    int bound = lfd >= 0 && bind(lfd, (struct sockaddr *)&b, sizeof b) == 0; /* no listen() */
    t0 = ddp_now_ns();
    int rc = bound ? ddpd_client_connect(&c, b.sun_path) : -1;
    double waited = (double)(ddp_now_ns() - t0) / 1e6;
    tap_ok(rc == -ECONNREFUSED && waited >= DDPD_CLIENT_RETRY_MS * 0.8 &&
               waited < DDPD_CLIENT_RETRY_MS * 10.0,
           "a refused socket is retried for about %d ms, then ECONNREFUSED (rc %d after %.0f ms)",
           DDPD_CLIENT_RETRY_MS, rc, waited);
    ddpd_client_close(&c);
    if (lfd >= 0) close(lfd);
    unlink(b.sun_path);
    return tap_done();
}
