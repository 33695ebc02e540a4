/* Socket helpers of the collectives (see net.h). Plain POSIX sockets: the data plane needs
 * non-blocking descriptors it drives itself from poll() on its own thread, which an event-loop
 * library (libuv) would take over, so these few wrappers are written here.
 */
#include "collectives/net.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/err.h"

int ddp__net_nonblock(int fd, int on)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0) return -errno;
    fl = on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
    return fcntl(fd, F_SETFL, fl) < 0 ? -errno : 0;
}

int ddp__net_parse(const char *addr, char *host, size_t hostlen, int *port)
{
    if (!addr) return DDP_EINVAL;
    const char *colon = strrchr(addr, ':');
    if (!colon) return DDP_EINVAL;
    const char *h = addr;
    size_t hl = (size_t)(colon - addr);
    if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
        h++;
        hl -= 2;
    }
    if (hl >= hostlen) return DDP_EINVAL;
    memcpy(host, h, hl);
    host[hl] = 0;
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end || end == colon + 1 || p < 0 || p > 65535) return DDP_EINVAL;
    *port = (int)p;
    return 0;
}

static int resolve(const char *host, int port, int passive, struct addrinfo **res)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = passive ? AI_PASSIVE : 0};
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host && *host ? host : NULL, ps, &hints, res);
    return rc ? DDP_ENOTFOUND : 0;
}

int ddp__net_listen(const char *host, int port, int *port_out)
{
    struct addrinfo *res;
    int rc = resolve(host, port, 1, &res);
    if (rc < 0) return rc;
    int fd = -1;
    rc = DDP_ENOTFOUND;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            rc = -errno;
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 128) == 0) {
            rc = 0;
            break;
        }
        rc = -errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    if (fd < 0) return rc;
    if (port_out) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        getsockname(fd, (struct sockaddr *)&ss, &sl);
        *port_out = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                             : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    }
    return fd;
}

static int wait_fd(int fd, short ev, int64_t deadline_ns)
{
    for (;;) {
        int ms = -1;
        if (deadline_ns > 0) {
            int64_t left = deadline_ns - ddp_now_ns();
            if (left <= 0) return DDP_ETIMEDOUT;
            ms = (int)((left + 999999) / 1000000);
        }
        struct pollfd p = {.fd = fd, .events = ev};
        int n = poll(&p, 1, ms);
        if (n > 0) return 0;
        if (n < 0 && errno != EINTR) return -errno;
    }
}

int ddp__net_connect(const char *host, int port, int64_t deadline_ns)
{
    int rc = DDP_ETIMEDOUT;
    for (;;) {
        struct addrinfo *res;
        rc = resolve(host, port, 0, &res);
        if (rc < 0) return rc;
        for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
            int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
            if (fd < 0) {
                rc = -errno;
                continue;
            }
            if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0 && errno != EINPROGRESS) {
                rc = -errno;
                close(fd);
                continue;
            }
            int64_t d = ddp_now_ns() + 2000000000LL;
            if (deadline_ns > 0 && d > deadline_ns) d = deadline_ns;
            rc = wait_fd(fd, POLLOUT, d);
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (rc == 0) {
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
                rc = soerr ? -soerr : 0;
            }
            if (rc == 0) {
                freeaddrinfo(res);
                ddp__net_nonblock(fd, 0);
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                return fd;
            }
            close(fd);
        }
        freeaddrinfo(res);
        if (deadline_ns > 0 && ddp_now_ns() >= deadline_ns) return rc < 0 ? rc : DDP_ETIMEDOUT;
        struct timespec ts = {0, 50 * 1000000};
        nanosleep(&ts, NULL);
    }
}

int ddp__net_accept(int lfd, int64_t deadline_ns, char *peer, size_t peerlen)
{
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC);
        if (fd >= 0) {
            if (peer) {
                char h[64] = "?", s[16] = "?";
                getnameinfo((struct sockaddr *)&ss, sl, h, sizeof h, s, sizeof s,
                            NI_NUMERICHOST | NI_NUMERICSERV);
                snprintf(peer, peerlen, "%s:%s", h, s);
            }
            if (ss.ss_family != AF_UNIX) {
                int one = 1;
                setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            }
            return fd;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) return -errno;
        if (deadline_ns == 0) return -EAGAIN;
        int rc = wait_fd(lfd, POLLIN, deadline_ns);
        if (rc < 0) return rc == DDP_ETIMEDOUT ? -EAGAIN : rc;
    }
}

int ddp__net_send_all(int fd, const void *buf, size_t len, int64_t deadline_ns)
{
    const char *p = buf;
    while (len) {
        ssize_t w = send(fd, p, len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            len -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return errno == EPIPE || errno == ECONNRESET ? DDP_ECLOSED : -errno;
        int rc = wait_fd(fd, POLLOUT, deadline_ns);
        if (rc < 0) return rc;
    }
    return 0;
}

int ddp__net_recv_all(int fd, void *buf, size_t len, int64_t deadline_ns)
{
    char *p = buf;
    while (len) {
        ssize_t r = recv(fd, p, len, MSG_DONTWAIT);
        if (r > 0) {
            p += r;
            len -= (size_t)r;
            continue;
        }
        if (r == 0) return DDP_ECLOSED;
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return errno == ECONNRESET ? DDP_ECLOSED : -errno;
        int rc = wait_fd(fd, POLLIN, deadline_ns);
        if (rc < 0) return rc;
    }
    return 0;
}

int ddp__net_local_host(int fd, char *host, size_t len)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) return -errno;
    if (getnameinfo((struct sockaddr *)&ss, sl, host, (socklen_t)len, NULL, 0, NI_NUMERICHOST))
        return DDP_EINVAL;
    return 0;
}

int ddp__net_token_eq(const char *a, const char *b, size_t n)
{
    unsigned char d = 0;
    int ended_a = 0, ended_b = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ca = ended_a ? 0 : (unsigned char)a[i];
        unsigned char cb = ended_b ? 0 : (unsigned char)b[i];
        d |= ca ^ cb;
        if (!ca) ended_a = 1;
        if (!cb) ended_b = 1;
    }
    return d == 0;
}
