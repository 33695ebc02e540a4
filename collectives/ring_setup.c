/* Ring links from a bootstrap: each rank listens (TCP on its data address, and an abstract Unix
 * socket for shared memory), the addresses are allgathered, each rank connects to the next rank
 * and accepts the previous one.
 *
 * Transport per link: shared memory when both ranks have the same host id (boot id, hostname and
 * network namespace) unless TCP is forced (opts.transport = "tcp" or DDP_COLL_TRANSPORT=tcp),
 * TCP otherwise. Order: connect + hello to next, accept + validate + ack the previous, then wait
 * for next's ack; no rank waits on an ack before it has acked its own predecessor, so the ring
 * cannot deadlock. A connection that is foreign (wrong token or generation, garbage, unexpected
 * rank) or stalls for 2 s in its hello is refused with a log line and accepting goes on. The
 * listeners close once the links exist. DDP_DATA_PORT=P pins rank r's TCP data port to P + r
 * (and, with the two-level all-reduce, its sub-communicators' to P + W + r and P + 2 W + r).
 * Then the ring decides whether it runs the all-reduce in two levels (hier.c), from the host ids
 * allgathered here.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "collectives/net.h"
#include "collectives/ring.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

#define HANDSHAKE_NS 2000000000LL

typedef struct {
    char host_id[160];
    char tcp_host[64];
    int32_t port;
    char unix_name[60];
} addr_t;

size_t ddp__ring_slot_bytes(const ddp_coll_opts_t *opts)
{
    size_t b = opts && opts->chunk_bytes ? opts->chunk_bytes : 0;
    const char *kb = getenv("DDP_COLL_CHUNK_KB");
    if (!b && kb && *kb) b = (size_t)atol(kb) * 1024;
    if (!b) b = 512 * 1024;
    if (b < 4096) b = 4096;
    if (b > (64u << 20)) b = 64u << 20;
    return b & ~(size_t)63;
}

static int unix_listen(char *name, size_t len, const ddp_coll_t *c)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -errno;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(name, len, "ddp-coll.%d.%llu.%d.%llx", (int)getpid(),
             (unsigned long long)c->generation, c->rank, (unsigned long long)ddp_now_ns());
    memcpy(a.sun_path + 1, name, strlen(name));
    socklen_t sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name));
    if (bind(fd, (struct sockaddr *)&a, sl) < 0 || listen(fd, 64) < 0) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    return fd;
}

static int unix_connect(const char *name)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    size_t n = strlen(name);
    if (n > sizeof a.sun_path - 2) n = sizeof a.sun_path - 2;
    memcpy(a.sun_path + 1, name, n);
    socklen_t sl = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
    if (connect(fd, (struct sockaddr *)&a, sl) < 0) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    return fd;
}

static const char *hello_problem(const ddp_coll_t *c, const ddp__link_hello_t *h, int prev)
{
    if (memcmp(h->magic, DDP__LINK_MAGIC, 8)) return "not a ddpd data hello (garbage bytes)";
    if (!ddp__net_token_eq(h->token, c->token, sizeof h->token)) return "wrong job token";
    if (h->generation != c->generation) return "wrong generation";
    if ((int)h->to_rank != c->rank || (int)h->from_rank != prev) return "unexpected rank";
    return NULL;
}

/* Accepts the previous rank's link on either listener. */
static int accept_prev(ddp_coll_t *c, int tfd, int ufd, int prev, int use_shm, size_t slot_bytes,
                       int64_t deadline, ddp__xport_t **out, int *afd, ddp_errinfo_t *ei)
{
    for (;;) {
        int64_t left = deadline - ddp_now_ns();
        if (left <= 0)
            return ddp_errinfo_set(ei, DDP_ETIMEDOUT, "ring setup: rank %d did not connect to "
                                   "rank %d before the deadline", ddp__world_rank(c, prev),
                                   ddp__world_rank(c, c->rank));
        struct pollfd p[2] = {{.fd = tfd, .events = POLLIN}, {.fd = ufd, .events = POLLIN}};
        if (poll(p, 2, (int)(left / 1000000) + 1) <= 0) continue;
        for (int i = 0; i < 2; i++) {
            if (!p[i].revents) continue;
            char peer[96] = "local process";
            int fd = ddp__net_accept(p[i].fd, 0, i == 0 ? peer : NULL, sizeof peer);
            if (fd < 0) continue;
            int64_t hd = ddp_now_ns() + HANDSHAKE_NS;
            ddp__link_hello_t h;
            memset(&h, 0, sizeof h);
            int rc, fds[3] = {-1, -1, -1};
            if (i == 1)
                rc = ddp__shm_xport_recv_hello(fd, hd, &h, fds);
            else
                rc = ddp__net_recv_all(fd, &h, sizeof h, hd);
            const char *why = rc == DDP_ETIMEDOUT ? "incomplete hello within 2 s"
                              : rc < 0            ? (rc == DDP_EPROTO ? "malformed hello"
                                                                      : "closed during hello")
                                                  : hello_problem(c, &h, prev);
            if (!why && (i == 1) != use_shm) why = "wrong transport";
            if (!why && i == 0 && h.slot_bytes != slot_bytes) why = "slot size differs";
            if (why) {
                DDP_WARN("ring setup (rank %d, generation %llu): refused data connection from %s: "
                         "%s", c->rank, (unsigned long long)c->generation, peer, why);
                for (int k = 0; k < 3; k++)
                    if (fds[k] >= 0) close(fds[k]);
                close(fd);
                continue;
            }
            if (i == 1)
                rc = ddp__shm_xport_new_recv(fd, prev, &h, fds, out);
            else
                rc = ddp__tcp_xport_new(fd, 0, prev, slot_bytes, DDP__RING_NSLOTS, out);
            if (rc < 0) {
                for (int k = 0; k < 3; k++)
                    if (fds[k] >= 0) close(fds[k]);
                close(fd);
                return ddp_errinfo_set(ei, rc, "ring setup: link from rank %d: %s",
                                       ddp__world_rank(c, prev), ddp_strerror(rc));
            }
            *afd = fd;
            return 0;
        }
    }
}

int ddp__ring_init(ddp_coll_t *c, ddp_coll_bootstrap_t *bs, const ddp_coll_opts_t *opts,
                   ddp_errinfo_t *ei)
{
    size_t slot = ddp__ring_slot_bytes(opts);
    DDP_CHECK(ddp__hier_check_algo(opts, ei)); /* in a world of one too: a typo is caught early */
    if (c->size == 1) {
        c->transport = "self";
        snprintf(c->algo, sizeof c->algo, "single");
        return ddp__ring_start(c, NULL, NULL, opts, slot);
    }
    const char *tp = opts && opts->transport ? opts->transport : getenv("DDP_COLL_TRANSPORT");
    int force_tcp = tp && !strcmp(tp, "tcp");
    int64_t deadline = ddp_now_ns() + 60000000000LL;
    int rc = 0, tfd = -1, ufd = -1, nfd = -1, pfd = -1;
    ddp__xport_t *sx = NULL, *rx = NULL;
    addr_t *all = ddp_calloc((size_t)c->size, sizeof *all);
    addr_t me;
    memset(&me, 0, sizeof me);
    if (!all) return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    const char *pb = getenv("DDP_DATA_PORT");
    int port = pb && *pb ? atoi(pb) + c->port_index : 0;
    tfd = ddp__net_listen(bs->data_host, port, &me.port);
    if (tfd < 0) {
        rc = ddp_errinfo_set(ei, tfd, "ring setup: cannot listen on %s:%d (%s)", bs->data_host,
                             port, ddp_strerror(tfd));
        goto out;
    }
    ufd = unix_listen(me.unix_name, sizeof me.unix_name, c);
    if (ufd < 0) {
        rc = ddp_errinfo_set(ei, ufd, "ring setup: unix socket: %s", ddp_strerror(ufd));
        goto out;
    }
    snprintf(me.host_id, sizeof me.host_id, "%s", bs->host_id);
    snprintf(me.tcp_host, sizeof me.tcp_host, "%s", bs->data_host[0] ? bs->data_host : "127.0.0.1");
    DDP_CHECK_GOTO(bs->ops->allgather(bs, &me, sizeof me, all, deadline, ei), rc, out);
    int next = (c->rank + 1) % c->size, prev = (c->rank + c->size - 1) % c->size;
    int shm_next = !force_tcp && !strcmp(all[next].host_id, me.host_id);
    int shm_prev = !force_tcp && !strcmp(all[prev].host_id, me.host_id);
    ddp__link_hello_t h = {.magic = DDP__LINK_MAGIC, .from_rank = (uint32_t)c->rank,
                           .to_rank = (uint32_t)next, .generation = c->generation,
                           .nslots = DDP__RING_NSLOTS, .slot_bytes = (uint32_t)slot};
    memcpy(h.token, c->token, sizeof h.token);
    if (shm_next) {
        nfd = unix_connect(all[next].unix_name);
        if (nfd >= 0) {
            rc = ddp__shm_xport_new_send(nfd, next, slot, DDP__RING_NSLOTS, &h, &sx);
            if (rc < 0) {
                close(nfd);
                nfd = -1;
            }
        } else {
            rc = nfd;
        }
    } else {
        nfd = ddp__net_connect(all[next].tcp_host, all[next].port, deadline);
        if (nfd >= 0) {
            rc = ddp__net_send_all(nfd, &h, sizeof h, deadline);
            if (rc == 0) rc = ddp__tcp_xport_new(nfd, 1, next, slot, DDP__RING_NSLOTS, &sx);
            if (rc < 0) {
                close(nfd);
                nfd = -1;
            }
        } else {
            rc = nfd;
        }
    }
    if (rc < 0) {
        rc = ddp_errinfo_set(ei, DDP_EPEER, "ring setup: cannot connect to rank %d (%s at %s): %s",
                             ddp__world_rank(c, next), shm_next ? "shm" : "tcp",
                             shm_next ? all[next].unix_name : all[next].tcp_host,
                             ddp_strerror(rc));
        goto out;
    }
    DDP_CHECK_GOTO(accept_prev(c, tfd, ufd, prev, shm_prev, slot, deadline, &rx, &pfd, ei), rc,
                   out);
    char ack = 'K';
    ddp__net_nonblock(pfd, 0);
    if (ddp__net_send_all(pfd, &ack, 1, deadline) < 0) {
        rc = ddp_errinfo_set(ei, DDP_EPEER, "ring setup: rank %d left during setup",
                             ddp__world_rank(c, prev));
        goto out;
    }
    ack = 0;
    rc = ddp__net_recv_all(nfd, &ack, 1, deadline);
    if (rc < 0 || ack != 'K') {
        rc = ddp_errinfo_set(ei, rc == DDP_ETIMEDOUT ? rc : DDP_EPEER,
                             "ring setup: rank %d did not accept rank %d's link (%s)",
                             ddp__world_rank(c, next), ddp__world_rank(c, c->rank),
                             rc < 0 ? ddp_strerror(rc) : "bad ack");
        goto out;
    }
    ddp__net_nonblock(pfd, 1);
    ddp__net_nonblock(nfd, 1);
    c->transport = shm_next ? "shm" : "tcp";
    rc = ddp__ring_start(c, sx, rx, opts, slot);
    if (rc < 0) {
        ddp_errinfo_set(ei, rc, "ring setup: cannot start the communication thread");
        goto out;
    }
    sx = rx = NULL;
    ddp__ring_t *R = c->impl;
    R->all_local = !force_tcp;
    for (int q = 0; q < c->size; q++)
        if (strcmp(all[q].host_id, me.host_id)) R->all_local = 0;
    snprintf(R->shm_prefix, sizeof R->shm_prefix, "/%s", all[0].unix_name);
    rc = ddp__hier_start(c, R, bs, opts, all[0].host_id, sizeof *all, force_tcp, ei);
    if (rc < 0) {
        ddp_coll_ring_ops.free(c); /* the ring's thread and links */
        goto out;
    }
    DDP_DEBUG("ring ready: rank %d -> %d over %s, %d <- %d over %s", c->rank, next,
              shm_next ? "shm" : "tcp", c->rank, prev, shm_prev ? "shm" : "tcp");
out:
    if (sx) sx->ops->close(sx); /* owns nfd */
    if (rx) rx->ops->close(rx); /* owns pfd */
    if (tfd >= 0) close(tfd);
    if (ufd >= 0) close(ufd);
    free(all);
    return rc;
}
