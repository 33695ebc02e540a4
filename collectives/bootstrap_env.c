/* Bootstraps without MPI: the TCP rendezvous (configured explicitly or from the environment) and
 * the world of one.
 *
 * Rendezvous protocol (host byte order; all ranks of a job run on one architecture):
 *   rank k -> rank 0   hello {magic "DDPRDZV1", u32 rank, u32 size, u64 generation, token[128]}
 *                      (rdzv_hello.h: its layout and rank 0's check of it)
 *   rank 0 -> rank k   reply {magic "DDPRDZOK", i32 status}     (sent only to accepted ranks)
 * then allgathers as star exchanges through rank 0: every rank sends {u64 len, bytes}, rank 0
 * answers with all contributions in rank order. Rank 0 serves many half-open connections at once
 * from one poll() loop, each with a 2 s handshake deadline, so a foreign, malformed or stalled
 * connection is refused with a log line without delaying the others.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "collectives/coll_impl.h"
#include "collectives/net.h"
#include "collectives/rdzv_hello.h"
#include "common/host.h"
#include "common/test_hook.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

#define REPLY_MAGIC "DDPRDZOK"
#define HANDSHAKE_NS 2000000000LL
#define MAX_PENDING 64

typedef struct {
    char magic[8];
    int32_t status;
} reply_t;

typedef struct {
    ddp_coll_bootstrap_t pub;
    int *fds;   /* rank 0: fd per rank (fds[0] = -1); others: fds[0] = connection to rank 0 */
} tcp_bs_t;

static void tcp_free(ddp_coll_bootstrap_t *b)
{
    tcp_bs_t *t = (tcp_bs_t *)b;
    if (t->fds)
        for (int i = 0; i < b->size; i++)
            if (t->fds[i] >= 0) close(t->fds[i]);
    free(t->fds);
    free(t);
}

static int tcp_allgather(ddp_coll_bootstrap_t *b, const void *mine, size_t len, void *all,
                         int64_t deadline_ns, ddp_errinfo_t *ei)
{
    tcp_bs_t *t = (tcp_bs_t *)b;
    if (!deadline_ns) deadline_ns = ddp_now_ns() + 60000000000LL;
    char *out = all;
    memcpy(out + (size_t)b->rank * len, mine, len);
    uint64_t l64 = len;
    if (b->rank != 0) {
        int rc = ddp__net_send_all(t->fds[0], &l64, sizeof l64, deadline_ns);
        if (rc == 0) rc = ddp__net_send_all(t->fds[0], mine, len, deadline_ns);
        if (rc == 0) rc = ddp__net_recv_all(t->fds[0], all, (size_t)b->size * len, deadline_ns);
        if (rc < 0)
            return ddp_errinfo_set(ei, rc == DDP_ETIMEDOUT ? rc : DDP_EPEER,
                                   "bootstrap allgather: rank 0 %s",
                                   rc == DDP_ETIMEDOUT ? "did not answer before the deadline"
                                                       : "closed the connection");
        return 0;
    }
    for (int r = 1; r < b->size; r++) {
        uint64_t got = 0;
        int rc = ddp__net_recv_all(t->fds[r], &got, sizeof got, deadline_ns);
        if (rc == 0 && got != l64) rc = DDP_EPROTO;
        if (rc == 0) rc = ddp__net_recv_all(t->fds[r], out + (size_t)r * len, len, deadline_ns);
        if (rc < 0)
            return ddp_errinfo_set(ei, rc == DDP_ETIMEDOUT ? rc : DDP_EPEER,
                                   "bootstrap allgather: rank %d did not arrive (%s)", r,
                                   ddp_strerror(rc));
    }
    for (int r = 1; r < b->size; r++) {
        int rc = ddp__net_send_all(t->fds[r], all, (size_t)b->size * len, deadline_ns);
        if (rc < 0)
            return ddp_errinfo_set(ei, DDP_EPEER, "bootstrap allgather: rank %d left (%s)", r,
                                   ddp_strerror(rc));
    }
    return 0;
}

static const ddp_coll_bootstrap_ops_t tcp_bs_ops = {
    .name = "tcp-rendezvous",
    .allgather = tcp_allgather,
    .free = tcp_free,
};

typedef struct {
    int fd;
    int64_t deadline;
    size_t got;
    ddp__rdzv_hello_t h;
    char peer[80];
} pending_t;

/* Judges the hello bytes p has received (rdzv_hello.c); returns the rank to accept, 0 to wait
 * for more bytes, or -1 (refused) with a log line. */
static int check_hello(const tcp_bs_t *t, const pending_t *p)
{
    const ddp_coll_bootstrap_t *b = &t->pub;
    ddp__rdzv_expect_t e = {.token = b->token, .size = b->size, .generation = b->generation,
                            .fds = t->fds};
    ddp__rdzv_verdict_t v;
    if (ddp__rdzv_hello_check(&p->h, p->got, &e, &v) < 0)
        DDP_WARN("rendezvous: refused connection from %s: %s (claimed rank %u, generation %llu)",
                 p->peer, v.why, v.claimed_rank, (unsigned long long)v.claimed_generation);
    return v.rank;
}

static int serve_root(tcp_bs_t *t, int lfd, int64_t deadline, ddp_errinfo_t *ei)
{
    ddp_coll_bootstrap_t *b = &t->pub;
    pending_t pend[MAX_PENDING];
    int np = 0, joined = 1;
    while (joined < b->size) {
        int64_t now = ddp_now_ns();
        if (now >= deadline) break;
        for (int i = 0; i < np; i++) {
            if (now >= pend[i].deadline) {
                DDP_WARN("rendezvous: refused connection from %s: incomplete hello (%zu of %zu "
                         "bytes) within 2 s", pend[i].peer, pend[i].got, sizeof(ddp__rdzv_hello_t));
                close(pend[i].fd);
                pend[i--] = pend[--np];
            }
        }
        struct pollfd pf[MAX_PENDING + 1];
        pf[0] = (struct pollfd){.fd = lfd, .events = POLLIN};
        int64_t next = deadline;
        for (int i = 0; i < np; i++) {
            pf[i + 1] = (struct pollfd){.fd = pend[i].fd, .events = POLLIN};
            if (pend[i].deadline < next) next = pend[i].deadline;
        }
        int ms = (int)((next - now + 999999) / 1000000);
        if (poll(pf, (nfds_t)np + 1, ms < 1 ? 1 : ms) <= 0) continue;
        for (int i = np - 1; i >= 0; i--) {
            if (!pf[i + 1].revents) continue;
            pending_t *p = &pend[i];
            ssize_t r = recv(p->fd, (char *)&p->h + p->got, sizeof p->h - p->got, MSG_DONTWAIT);
            int drop = 0;
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                DDP_WARN("rendezvous: connection from %s closed after %zu bytes of hello",
                         p->peer, p->got);
                drop = 1;
            } else if (r > 0) {
                p->got += (size_t)r;
                int rk = check_hello(t, p); /* garbage is refused after its first 8 bytes */
                if (rk < 0) {
                    drop = 1;
                } else if (rk > 0) {
                    reply_t rep = {.magic = REPLY_MAGIC, .status = 0};
                    if (ddp__net_send_all(p->fd, &rep, sizeof rep, p->deadline) == 0) {
                        t->fds[rk] = p->fd;
                        joined++;
                        if (!b->data_host[0])
                            ddp__net_local_host(p->fd, b->data_host, sizeof b->data_host);
                        pend[i] = pend[--np];
                        continue;
                    }
                    drop = 1;
                }
            }
            if (drop) {
                close(p->fd);
                pend[i] = pend[--np];
            }
        }
        if (pf[0].revents && np < MAX_PENDING) {
            pending_t *p = &pend[np];
            int fd = ddp__net_accept(lfd, 0, p->peer, sizeof p->peer);
            if (fd >= 0) {
                ddp__net_nonblock(fd, 1);
                p->fd = fd;
                p->got = 0;
                p->deadline = ddp_now_ns() + HANDSHAKE_NS;
                np++;
            }
        }
    }
    for (int i = 0; i < np; i++) {
        DDP_WARN("rendezvous: refused connection from %s: incomplete hello (%zu of %zu bytes) when "
                 "the rendezvous closed", pend[i].peer, pend[i].got, sizeof(ddp__rdzv_hello_t));
        close(pend[i].fd);
    }
    if (joined < b->size) {
        char missing[256] = "";
        size_t off = 0;
        for (int r = 1; r < b->size && off < sizeof missing - 8; r++)
            if (t->fds[r] < 0)
                off += (size_t)snprintf(missing + off, sizeof missing - off, "%s%d",
                                        off ? ", " : "", r);
        return ddp_errinfo_set(ei, DDP_ETIMEDOUT, "rendezvous: rank(s) %s did not arrive before "
                               "the deadline", missing);
    }
    for (int r = 1; r < b->size; r++) ddp__net_nonblock(t->fds[r], 0);
    return 0;
}

static int join_root(tcp_bs_t *t, const char *host, int port, int64_t deadline,
                     ddp_errinfo_t *ei)
{
    ddp_coll_bootstrap_t *b = &t->pub;
    int fd = ddp__net_connect(host, port, deadline);
    if (fd < 0)
        return ddp_errinfo_set(ei, fd == DDP_ETIMEDOUT ? fd : DDP_EPEER,
                               "rendezvous: cannot reach rank 0 at %s:%d (%s)", host, port,
                               ddp_strerror(fd));
    t->fds[0] = fd;
    ddp__rdzv_hello_t h;
    ddp__rdzv_hello_make(&h, b->rank, b->size, b->generation, b->token);
    reply_t rep;
    int rc = ddp__net_send_all(fd, &h, sizeof h, deadline);
    if (rc == 0) rc = ddp__net_recv_all(fd, &rep, sizeof rep, deadline);
    if (rc == 0 && (memcmp(rep.magic, REPLY_MAGIC, 8) || rep.status)) rc = DDP_EPROTO;
    if (rc < 0)
        return ddp_errinfo_set(ei, rc == DDP_ECLOSED ? DDP_EAUTH : rc,
                               "rendezvous: rank 0 at %s:%d refused or dropped rank %d (%s; wrong "
                               "token or generation?)", host, port, b->rank, ddp_strerror(rc));
    ddp__net_local_host(fd, b->data_host, sizeof b->data_host);
    return 0;
}

int ddp__bootstrap_learn_hosts(ddp_coll_bootstrap_t *b, int64_t deadline, ddp_errinfo_t *ei)
{
    int fake = ddp_test_hook(DDP_HOOK_HOST, 0, b->rank); /* DDP_TEST_HOST_OF_RANK */
    if (fake) {
        size_t used = strlen(b->host_id);
        snprintf(b->host_id + used, sizeof b->host_id - used, "/test-host-%d", fake - 1);
    }
    size_t n = (size_t)b->size;
    char *ids = ddp_malloc(n * sizeof b->host_id);
    if (!ids) return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    int rc = b->ops->allgather(b, b->host_id, sizeof b->host_id, ids, deadline, ei);
    if (rc == 0) {
        b->local_rank = 0;
        for (int r = 0; r < b->rank; r++)
            if (!strcmp(ids + (size_t)r * sizeof b->host_id, b->host_id)) b->local_rank++;
    }
    free(ids);
    return rc;
}

int ddp_coll_bootstrap_tcp(const ddp_coll_rdzv_cfg_t *cfg, ddp_coll_bootstrap_t **out,
                           ddp_errinfo_t *ei)
{
    if (!cfg || !out || cfg->size < 1 || cfg->rank < 0 || cfg->rank >= cfg->size || !cfg->token ||
        !*cfg->token || strlen(cfg->token) >= 128)
        return ddp_errinfo_set(ei, DDP_EINVAL, "rendezvous: invalid rank/size/token");
    *out = NULL;
    char host[256];
    int port = 0;
    if (cfg->size > 1 && (!cfg->addr || ddp__net_parse(cfg->addr, host, sizeof host, &port) < 0))
        return ddp_errinfo_set(ei, DDP_EINVAL, "rendezvous address '%s' is not host:port",
                               cfg->addr ? cfg->addr : "(null)");
    tcp_bs_t *t = ddp_calloc(1, sizeof *t);
    int *fds = ddp_malloc(sizeof(int) * (size_t)cfg->size);
    if (!t || !fds) {
        free(t);
        free(fds);
        return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    }
    for (int i = 0; i < cfg->size; i++) fds[i] = -1;
    t->fds = fds;
    ddp_coll_bootstrap_t *b = &t->pub;
    b->ops = &tcp_bs_ops;
    b->rank = cfg->rank;
    b->size = cfg->size;
    b->generation = cfg->generation;
    snprintf(b->token, sizeof b->token, "%s", cfg->token);
    ddp_host_id(b->host_id, sizeof b->host_id);
    b->local_rank = cfg->rank;
    int64_t deadline = ddp_now_ns() + (int64_t)((cfg->timeout_s > 0 ? cfg->timeout_s : 60) * 1e9);
    int rc = 0;
    if (cfg->size == 1) {
        snprintf(b->data_host, sizeof b->data_host, "127.0.0.1");
    } else if (cfg->rank == 0) {
        int lfd = ddp__net_listen(host, port, NULL);
        if (lfd < 0) {
            rc = ddp_errinfo_set(ei, lfd, "rendezvous: cannot listen at %s (%s)", cfg->addr,
                                 ddp_strerror(lfd));
        } else {
            if (strcmp(host, "0.0.0.0") && strcmp(host, "::") && strcmp(host, "") &&
                strchr(host, '.') && strlen(host) < sizeof b->data_host)
                snprintf(b->data_host, sizeof b->data_host, "%s", host);
            rc = serve_root(t, lfd, deadline, ei);
            close(lfd);
        }
    } else {
        rc = join_root(t, host, port, deadline, ei);
    }
    if (rc == 0 && cfg->size > 1) rc = ddp__bootstrap_learn_hosts(b, deadline, ei);
    if (rc < 0) {
        tcp_free(b);
        return rc;
    }
    *out = b;
    return 0;
}

static int env_int(const char *name, long lo, long hi, long dflt, long *v, ddp_errinfo_t *ei)
{
    const char *s = getenv(name);
    if (!s || !*s) {
        *v = dflt;
        return dflt < lo ? ddp_errinfo_set(ei, DDP_EINVAL, "%s is not set", name) : 0;
    }
    char *end;
    long x = strtol(s, &end, 10);
    if (*end || x < lo || x > hi)
        return ddp_errinfo_set(ei, DDP_EINVAL, "%s='%s' is not an integer in [%ld, %ld]", name, s,
                               lo, hi);
    *v = x;
    return 0;
}

int ddp_coll_bootstrap_env(ddp_coll_bootstrap_t **out, ddp_errinfo_t *ei)
{
    if (!out) return DDP_EINVAL;
    long size = 1, rank = 0, gen = 0;
    DDP_CHECK(env_int("DDP_WORLD_SIZE", 1, 1 << 20, 1, &size, ei));
    if (size == 1) return ddp_coll_bootstrap_single(out, ei);
    DDP_CHECK(env_int("DDP_RANK", 0, size - 1, -1, &rank, ei));
    DDP_CHECK(env_int("DDP_GENERATION", 0, 1L << 62, 0, &gen, ei));
    const char *addr = getenv("DDP_RDZV");
    const char *token = getenv("DDP_JOB_TOKEN");
    if (!addr || !*addr) return ddp_errinfo_set(ei, DDP_EINVAL, "DDP_RDZV (host:port) is not set");
    if (!token || !*token) return ddp_errinfo_set(ei, DDP_EINVAL, "DDP_JOB_TOKEN is not set");
    const char *ts = getenv("DDP_RDZV_TIMEOUT_S");
    ddp_coll_rdzv_cfg_t cfg = {.rank = (int)rank, .size = (int)size, .addr = addr,
                               .token = token, .generation = (uint64_t)gen,
                               .timeout_s = ts ? atof(ts) : 0};
    return ddp_coll_bootstrap_tcp(&cfg, out, ei);
}

static int single_allgather(ddp_coll_bootstrap_t *b, const void *mine, size_t len, void *all,
                            int64_t deadline_ns, ddp_errinfo_t *ei)
{
    memcpy(all, mine, len);
    return 0;
}

static void single_free(ddp_coll_bootstrap_t *b) { free(b); }

static const ddp_coll_bootstrap_ops_t single_ops = {
    .name = "single",
    .allgather = single_allgather,
    .free = single_free,
};

int ddp_coll_bootstrap_single(ddp_coll_bootstrap_t **out, ddp_errinfo_t *ei)
{
    if (!out) return DDP_EINVAL;
    ddp_coll_bootstrap_t *b = ddp_calloc(1, sizeof *b);
    if (!b) return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    b->ops = &single_ops;
    b->size = 1;
    const char *tok = getenv("DDP_JOB_TOKEN");
    snprintf(b->token, sizeof b->token, "%s", tok && *tok ? tok : "single");
    snprintf(b->data_host, sizeof b->data_host, "127.0.0.1");
    ddp_host_id(b->host_id, sizeof b->host_id);
    *out = b;
    return 0;
}

void ddp_coll_bootstrap_free(ddp_coll_bootstrap_t *bs)
{
    if (bs) bs->ops->free(bs);
}

int ddp_coll_under_mpi(void)
{
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK") ||
           getenv("MPI_LOCALNRANKS");
}
