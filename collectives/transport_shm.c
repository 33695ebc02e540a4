/* Shared-memory transport: one segment per directed link between two processes of one host.
 *
 * The sender creates the segment (a memfd) and two eventfds and passes them over a connected Unix
 * socket with SCM_RIGHTS; both sides close the memfd right after mapping, so nothing outlives the
 * processes. The Unix socket stays open for the link's lifetime: its hangup is how each side learns
 * that the other died (SIGKILL included), and it is polled beside the eventfds.
 *
 * Segment: a header (head = messages committed by the sender, tail = messages released by the
 * receiver, each on its own cache line; per-slot lengths; one abort mailbox per direction), then
 * nslots slots of slot_bytes, 4 KiB aligned. head/tail are single-writer counters published with
 * release stores; a message's bytes and length are written before head moves. Wake-ups: the sender
 * writes efd_data after each commit, the receiver writes efd_space after each release.
 *
 * The same code serves the in-process fake transport (transport_fake.c) over heap memory.
 */
#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "collectives/transport.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"

#define MAX_SLOTS 64

typedef struct {
    _Alignas(64) _Atomic uint64_t head;
    _Alignas(64) _Atomic uint64_t tail;
    _Alignas(64) _Atomic int ab_flag[2]; /* [0]: for the receiver, [1]: for the sender */
    int ab_culprit[2];
    int ab_code[2];
    uint32_t nslots, slot_bytes;
    uint64_t lens[MAX_SLOTS];
} seg_hdr_t;

#define DATA_OFF (((sizeof(seg_hdr_t)) + 4095) & ~(size_t)4095)

typedef struct {
    ddp__xport_t pub;
    seg_hdr_t *h;
    char *data;
    size_t map_len; /* 0: not ours to unmap (fake) */
    int efd_data, efd_space, usock;
    int own_efds;
    int dead; /* the Unix socket hung up: the peer left */
    uint64_t pos; /* sender: next head; receiver: next tail */
    const char *name;
} shm_t;

size_t ddp__shm_seg_bytes(size_t slot_bytes, int nslots)
{
    return DATA_OFF + slot_bytes * (size_t)nslots;
}

void ddp__shm_seg_init(void *seg, size_t slot_bytes, int nslots)
{
    seg_hdr_t *h = seg;
    memset(h, 0, sizeof *h);
    h->nslots = (uint32_t)nslots;
    h->slot_bytes = (uint32_t)slot_bytes;
}

static void kick(int efd)
{
    uint64_t one = 1;
    ssize_t w = write(efd, &one, sizeof one);
    (void)w;
}

static void drain(int efd)
{
    uint64_t v;
    ssize_t r = read(efd, &v, sizeof v);
    (void)r;
}

static int shm_progress(ddp__xport_t *x, int *culprit, int *code)
{
    shm_t *s = (shm_t *)x;
    int me = x->is_send ? 1 : 0;
    if (atomic_load_explicit(&s->h->ab_flag[me], memory_order_acquire)) {
        *culprit = s->h->ab_culprit[me];
        *code = s->h->ab_code[me];
        return DDP_EABORTED;
    }
    return s->dead ? DDP_EPEER : 0;
}

static void *shm_send_slot(ddp__xport_t *x)
{
    shm_t *s = (shm_t *)x;
    uint64_t tail = atomic_load_explicit(&s->h->tail, memory_order_acquire);
    if (s->pos - tail >= s->h->nslots) return NULL;
    return s->data + (s->pos % s->h->nslots) * (size_t)s->h->slot_bytes;
}

static void shm_send_commit(ddp__xport_t *x, size_t len)
{
    shm_t *s = (shm_t *)x;
    s->h->lens[s->pos % s->h->nslots] = len;
    s->pos++;
    atomic_store_explicit(&s->h->head, s->pos, memory_order_release);
    kick(s->efd_data);
}

static const void *shm_recv_slot(ddp__xport_t *x, size_t *len)
{
    shm_t *s = (shm_t *)x;
    uint64_t head = atomic_load_explicit(&s->h->head, memory_order_acquire);
    if (s->pos >= head) return NULL;
    size_t i = s->pos % s->h->nslots;
    *len = s->h->lens[i];
    if (*len > s->h->slot_bytes) *len = s->h->slot_bytes; /* never trust shared bytes */
    return s->data + i * (size_t)s->h->slot_bytes;
}

static void shm_recv_release(ddp__xport_t *x)
{
    shm_t *s = (shm_t *)x;
    s->pos++;
    atomic_store_explicit(&s->h->tail, s->pos, memory_order_release);
    kick(s->efd_space);
}

static int shm_pending(ddp__xport_t *x) { return 0; }

static int shm_pollfds(ddp__xport_t *x, struct pollfd *p, int want_send, int want_recv)
{
    shm_t *s = (shm_t *)x;
    int n = 0;
    p[n++] = (struct pollfd){.fd = x->is_send ? s->efd_space : s->efd_data, .events = POLLIN};
    if (s->usock >= 0 && !s->dead) p[n++] = (struct pollfd){.fd = s->usock, .events = POLLIN};
    return n;
}

static int shm_after_poll(ddp__xport_t *x, const struct pollfd *p, int n, int *culprit, int *code)
{
    shm_t *s = (shm_t *)x;
    for (int i = 0; i < n; i++) {
        if (!p[i].revents) continue;
        if (p[i].fd == s->usock) {
            char c;
            ssize_t r = recv(s->usock, &c, 1, MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR) ||
                (p[i].revents & (POLLHUP | POLLERR))) {
                s->dead = 1;
                return shm_progress(x, culprit, code); /* an abort note beats the hangup */
            }
        } else {
            drain(p[i].fd);
        }
    }
    return shm_progress(x, culprit, code);
}

static void shm_notify_abort(ddp__xport_t *x, int culprit, int code)
{
    shm_t *s = (shm_t *)x;
    int peer = x->is_send ? 0 : 1;
    s->h->ab_culprit[peer] = culprit;
    s->h->ab_code[peer] = code;
    atomic_store_explicit(&s->h->ab_flag[peer], 1, memory_order_release);
    kick(x->is_send ? s->efd_data : s->efd_space);
}

static void shm_close(ddp__xport_t *x)
{
    shm_t *s = (shm_t *)x;
    if (s->map_len) munmap(s->h, s->map_len);
    if (s->own_efds) {
        close(s->efd_data);
        close(s->efd_space);
    }
    if (s->usock >= 0) close(s->usock);
    free(s);
}

static const ddp__xport_ops_t shm_ops = {
    .name = "shm",
    .progress = shm_progress,
    .send_slot = shm_send_slot,
    .send_commit = shm_send_commit,
    .recv_slot = shm_recv_slot,
    .recv_release = shm_recv_release,
    .pending = shm_pending,
    .pollfds = shm_pollfds,
    .after_poll = shm_after_poll,
    .notify_abort = shm_notify_abort,
    .close = shm_close,
};

static shm_t *shm_alloc(int is_send, int peer)
{
    shm_t *s = ddp_calloc(1, sizeof *s);
    if (!s) return NULL;
    s->pub.ops = &shm_ops;
    s->pub.is_send = is_send;
    s->pub.peer = peer;
    s->usock = -1;
    s->efd_data = s->efd_space = -1;
    return s;
}

int ddp__shm_xport_new_mem(void *seg, int efd_data, int efd_space, int is_send, int peer,
                           const char *name, ddp__xport_t **out)
{
    shm_t *s = shm_alloc(is_send, peer);
    if (!s) return DDP_ENOMEM;
    s->h = seg;
    s->data = (char *)seg + DATA_OFF;
    s->efd_data = efd_data;
    s->efd_space = efd_space;
    s->pub.slot_bytes = s->h->slot_bytes;
    s->name = name;
    *out = &s->pub;
    return 0;
}

int ddp__shm_xport_new_send(int usock, int peer, size_t slot_bytes, int nslots,
                            const ddp__link_hello_t *hello, ddp__xport_t **out)
{
    if (nslots > MAX_SLOTS) nslots = MAX_SLOTS;
    size_t len = ddp__shm_seg_bytes(slot_bytes, nslots);
    int mfd = memfd_create("ddp-coll-shm", MFD_CLOEXEC);
    if (mfd < 0) return -errno;
    int rc = 0;
    shm_t *s = NULL;
    void *seg = MAP_FAILED;
    int e1 = -1, e2 = -1;
    if (ftruncate(mfd, (off_t)len) < 0) {
        rc = -errno;
        goto fail;
    }
    seg = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    if (seg == MAP_FAILED) {
        rc = -errno;
        goto fail;
    }
    ddp__shm_seg_init(seg, slot_bytes, nslots);
    e1 = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    e2 = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (e1 < 0 || e2 < 0) {
        rc = -errno;
        goto fail;
    }
    ddp__link_hello_t h = *hello;
    h.nslots = (uint32_t)nslots;
    h.slot_bytes = (uint32_t)slot_bytes;
    int fds[3] = {mfd, e1, e2};
    char cbuf[CMSG_SPACE(sizeof fds)];
    memset(cbuf, 0, sizeof cbuf);
    struct iovec iov = {.iov_base = &h, .iov_len = sizeof h};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                       .msg_controllen = sizeof cbuf};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(cm), fds, sizeof fds);
    if (sendmsg(usock, &m, MSG_NOSIGNAL) != (ssize_t)sizeof h) {
        rc = errno ? -errno : DDP_EIO;
        goto fail;
    }
    close(mfd);
    mfd = -1;
    s = shm_alloc(1, peer);
    if (!s) {
        rc = DDP_ENOMEM;
        goto fail;
    }
    s->h = seg;
    s->data = (char *)seg + DATA_OFF;
    s->map_len = len;
    s->efd_data = e1;
    s->efd_space = e2;
    s->own_efds = 1;
    s->usock = usock;
    s->pub.slot_bytes = slot_bytes;
    *out = &s->pub;
    return 0;
fail:
    if (seg != MAP_FAILED) munmap(seg, len);
    if (mfd >= 0) close(mfd);
    if (e1 >= 0) close(e1);
    if (e2 >= 0) close(e2);
    return rc;
}

int ddp__shm_xport_recv_hello(int usock, int64_t deadline_ns, ddp__link_hello_t *hello_out,
                              int fds_out[3])
{
    size_t got = 0;
    int nfds = 0;
    fds_out[0] = fds_out[1] = fds_out[2] = -1;
    while (got < sizeof *hello_out) {
        int64_t left = deadline_ns - ddp_now_ns();
        if (left <= 0) return DDP_ETIMEDOUT;
        struct pollfd p = {.fd = usock, .events = POLLIN};
        if (poll(&p, 1, (int)(left / 1000000) + 1) <= 0) continue;
        char cbuf[CMSG_SPACE(sizeof(int) * 3)];
        struct iovec iov = {.iov_base = (char *)hello_out + got,
                            .iov_len = sizeof *hello_out - got};
        struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
                           .msg_controllen = sizeof cbuf};
        ssize_t r = recvmsg(usock, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (r == 0) return DDP_ECLOSED;
        if (r < 0) {
            if (errno == EAGAIN || errno == EINTR) continue;
            return -errno;
        }
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm; cm = CMSG_NXTHDR(&m, cm)) {
            if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
            int n = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            int tmp[8];
            if (n > 8) n = 8;
            memcpy(tmp, CMSG_DATA(cm), sizeof(int) * (size_t)n);
            for (int i = 0; i < n; i++) {
                if (nfds < 3)
                    fds_out[nfds++] = tmp[i];
                else
                    close(tmp[i]);
            }
        }
        got += (size_t)r;
        if (got >= 8 && memcmp(hello_out->magic, DDP__LINK_MAGIC, 8) != 0) break;
    }
    if (got < sizeof *hello_out || memcmp(hello_out->magic, DDP__LINK_MAGIC, 8) != 0 ||
        nfds != 3) {
        for (int i = 0; i < 3; i++)
            if (fds_out[i] >= 0) close(fds_out[i]);
        fds_out[0] = fds_out[1] = fds_out[2] = -1;
        return DDP_EPROTO;
    }
    return 0;
}

int ddp__shm_xport_new_recv(int usock, int peer, const ddp__link_hello_t *hello,
                            const int fds[3], ddp__xport_t **out)
{
    if (hello->nslots < 1 || hello->nslots > MAX_SLOTS || hello->slot_bytes < 4096)
        return DDP_EPROTO;
    size_t len = ddp__shm_seg_bytes(hello->slot_bytes, (int)hello->nslots);
    void *seg = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0], 0);
    if (seg == MAP_FAILED) return -errno;
    seg_hdr_t *h = seg;
    if (h->nslots != hello->nslots || h->slot_bytes != hello->slot_bytes) {
        munmap(seg, len);
        return DDP_EPROTO;
    }
    shm_t *s = shm_alloc(0, peer);
    if (!s) {
        munmap(seg, len);
        return DDP_ENOMEM;
    }
    close(fds[0]);
    s->h = seg;
    s->data = (char *)seg + DATA_OFF;
    s->map_len = len;
    s->efd_data = fds[1];
    s->efd_space = fds[2];
    s->own_efds = 1;
    s->usock = usock;
    s->pub.slot_bytes = hello->slot_bytes;
    *out = &s->pub;
    return 0;
}
