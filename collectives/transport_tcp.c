/* TCP transport: one non-blocking connection per directed link, TCP_NODELAY, whole-slot writes.
 *
 * Forward direction (sender -> receiver): frames {u32 type, u32 len, i32 culprit, i32 code} then
 * len payload bytes; type DATA carries one slot, type ABORT says that rank `culprit` failed. The
 * reverse direction carries only ABORT frames, so the sender always polls for input: EOF there is
 * the receiver's death. The sender's slots are local buffers written straight to the socket (no
 * extra copy); the receiver reads each payload straight into a local slot that the ring reduces
 * from. A frame with a bad type or length from the peer closes the link (DDP_EPEER), never asserts.
 *
 * Caller memory (send_from, recv_post): a message may be written from the caller's buffer rather
 * than a slot, and read into a posted destination rather than a slot, which saves the ring a
 * memcpy on each side of the socket. A destination is taken when the message's header is complete
 * and only when the length matches the post exactly, so peer bytes never overrun caller memory.
 * detach() hands everything back to the slots, so a failed operation leaves no pointer behind.
 */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "collectives/net.h"
#include "collectives/transport.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"

enum { F_DATA = 0x44415441, F_ABORT = 0x41424f52 };

typedef struct {
    uint32_t type, len;
    int32_t culprit, code;
} frame_t;

typedef struct {
    ddp__xport_t pub;
    int fd;
    int nslots;
    char *slots;
    size_t *lens;
    char **ptr;          /* per slot: sender: the message's caller memory (NULL: the slot);
                          * receiver: the posted destination (NULL: the slot) */
    size_t *cap;         /* receiver: the posted length */
    char **at;           /* receiver: where the message lands (its slot or its destination) */
    uint64_t posted;     /* receiver: messages below this index have had their post */
    uint64_t head, tail; /* sender: committed / fully written; receiver: complete / released */
    size_t off;          /* bytes of the current frame moved (header included) */
    frame_t cur;         /* receiver: header being read */
    frame_t ctl;         /* sender: reverse control frame being read */
    size_t ctl_got;
    int ab, ab_culprit, ab_code;
    int dead; /* EOF or a socket error: the peer left */
} tcp_t;

static int take_abort(tcp_t *t, int *culprit, int *code)
{
    *culprit = t->ab_culprit;
    *code = t->ab_code;
    return DDP_EABORTED;
}

static char *slot(tcp_t *t, size_t i) { return t->slots + i * t->pub.slot_bytes; }

/* Sender: where message i's bytes are. */
static const char *src_of(tcp_t *t, size_t i) { return t->ptr[i] ? t->ptr[i] : slot(t, i); }

static int send_progress(tcp_t *t)
{
    while (t->tail < t->head) {
        size_t i = t->tail % (size_t)t->nslots;
        frame_t h = {.type = F_DATA, .len = (uint32_t)t->lens[i]};
        size_t total = sizeof h + t->lens[i];
        struct iovec iov[2];
        int n = 0;
        if (t->off < sizeof h) {
            iov[n++] = (struct iovec){(char *)&h + t->off, sizeof h - t->off};
            iov[n++] = (struct iovec){(char *)src_of(t, i), t->lens[i]};
        } else {
            iov[n++] = (struct iovec){(char *)src_of(t, i) + (t->off - sizeof h), total - t->off};
        }
        struct msghdr m = {.msg_iov = iov, .msg_iovlen = (size_t)n};
        ssize_t w = sendmsg(t->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
            return DDP_EPEER;
        }
        t->off += (size_t)w;
        if (t->off == total) {
            t->off = 0;
            t->tail++;
            atomic_fetch_add_explicit(&t->pub.sent, t->lens[i], memory_order_relaxed);
        }
    }
    return 0;
}

static int recv_progress(tcp_t *t)
{
    while (t->head - t->tail < (uint64_t)t->nslots && !t->ab) {
        size_t i = t->head % (size_t)t->nslots;
        ssize_t r;
        if (t->off < sizeof t->cur) {
            r = recv(t->fd, (char *)&t->cur + t->off, sizeof t->cur - t->off, MSG_DONTWAIT);
        } else {
            size_t done = t->off - sizeof t->cur;
            r = recv(t->fd, t->at[i] + done, t->cur.len - done, MSG_DONTWAIT);
        }
        if (r == 0) return DDP_EPEER;
        if (r < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
            return DDP_EPEER;
        }
        t->off += (size_t)r;
        if (t->off == sizeof t->cur) {
            if (t->cur.type == F_ABORT) {
                t->ab = 1;
                t->ab_culprit = t->cur.culprit;
                t->ab_code = t->cur.code;
                t->off = 0;
                return 0;
            }
            if (t->cur.type != F_DATA || t->cur.len > t->pub.slot_bytes) return DDP_EPEER;
            int to_dst = t->head < t->posted && t->ptr[i] && t->cur.len == t->cap[i];
            t->at[i] = to_dst ? t->ptr[i] : slot(t, i);
        }
        if (t->off >= sizeof t->cur && t->off == sizeof t->cur + t->cur.len) {
            t->lens[i] = t->cur.len;
            t->head++;
            t->off = 0;
        }
    }
    return 0;
}

static int tcp_progress(ddp__xport_t *x, int *culprit, int *code)
{
    tcp_t *t = (tcp_t *)x;
    int rc = t->dead ? DDP_EPEER : x->is_send ? send_progress(t) : recv_progress(t);
    if (t->ab) return take_abort(t, culprit, code);
    if (rc == DDP_EPEER) t->dead = 1;
    return rc;
}

static void *tcp_send_slot(ddp__xport_t *x)
{
    tcp_t *t = (tcp_t *)x;
    if (t->head - t->tail >= (uint64_t)t->nslots) return NULL;
    return t->slots + (t->head % (size_t)t->nslots) * x->slot_bytes;
}

static void tcp_send_commit(ddp__xport_t *x, size_t len)
{
    tcp_t *t = (tcp_t *)x;
    t->lens[t->head % (size_t)t->nslots] = len;
    t->ptr[t->head % (size_t)t->nslots] = NULL;
    t->head++;
    send_progress(t); /* errors surface on the next progress() */
}

static void tcp_send_from(ddp__xport_t *x, const void *p, size_t len)
{
    tcp_t *t = (tcp_t *)x;
    t->lens[t->head % (size_t)t->nslots] = len;
    t->ptr[t->head % (size_t)t->nslots] = (char *)p;
    t->head++;
    send_progress(t); /* errors surface on the next progress() */
}

static int tcp_recv_post(ddp__xport_t *x, void *dst, size_t len)
{
    tcp_t *t = (tcp_t *)x;
    uint64_t k = t->posted > t->tail ? t->posted : t->tail;
    if (k - t->tail >= (uint64_t)t->nslots) return -1;
    size_t i = k % (size_t)t->nslots;
    /* a message whose header is complete already has its place (a slot): the post is moot */
    if (k > t->head || (k == t->head && t->off < sizeof t->cur)) {
        t->ptr[i] = dst;
        t->cap[i] = len;
    }
    t->posted = k + 1;
    return 0;
}

static void tcp_detach(ddp__xport_t *x)
{
    tcp_t *t = (tcp_t *)x;
    size_t ns = (size_t)t->nslots;
    if (x->is_send) {
        for (uint64_t k = t->tail; k < t->head; k++) {
            size_t i = k % ns;
            if (t->ptr[i]) memcpy(slot(t, i), t->ptr[i], t->lens[i]);
        }
    } else {
        for (size_t i = 0; i < ns; i++) t->at[i] = slot(t, i);
        t->posted = t->tail;
    }
    memset(t->ptr, 0, ns * sizeof *t->ptr);
}

static const void *tcp_recv_slot(ddp__xport_t *x, size_t *len)
{
    tcp_t *t = (tcp_t *)x;
    if (t->tail >= t->head) return NULL;
    size_t i = t->tail % (size_t)t->nslots;
    *len = t->lens[i];
    return t->at[i];
}

static void tcp_recv_release(ddp__xport_t *x)
{
    tcp_t *t = (tcp_t *)x;
    t->ptr[t->tail % (size_t)t->nslots] = NULL;
    t->tail++;
}

static int tcp_pending(ddp__xport_t *x)
{
    tcp_t *t = (tcp_t *)x;
    return x->is_send ? (int)(t->head - t->tail) : 0;
}

static int tcp_pollfds(ddp__xport_t *x, struct pollfd *p, int want_send, int want_recv)
{
    tcp_t *t = (tcp_t *)x;
    short ev = 0;
    if (t->dead) {
        ev = 0;
    } else if (x->is_send) {
        ev = POLLIN;
        if (t->tail < t->head) ev |= POLLOUT;
    } else if (t->head - t->tail < (uint64_t)t->nslots) {
        ev = POLLIN;
    }
    p[0] = (struct pollfd){.fd = ev ? t->fd : -1, .events = ev};
    return 1;
}

static int tcp_after_poll(ddp__xport_t *x, const struct pollfd *p, int n, int *culprit,
                          int *code)
{
    tcp_t *t = (tcp_t *)x;
    if (x->is_send && (p[0].revents & (POLLIN | POLLHUP | POLLERR))) {
        for (;;) {
            ssize_t r = recv(t->fd, (char *)&t->ctl + t->ctl_got, sizeof t->ctl - t->ctl_got,
                             MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                t->dead = 1;
                return t->ab ? take_abort(t, culprit, code) : DDP_EPEER;
            }
            if (r < 0) break;
            t->ctl_got += (size_t)r;
            if (t->ctl_got == sizeof t->ctl) {
                t->ctl_got = 0;
                if (t->ctl.type != F_ABORT) return DDP_EPEER;
                t->ab = 1;
                t->ab_culprit = t->ctl.culprit;
                t->ab_code = t->ctl.code;
            }
        }
    }
    return tcp_progress(x, culprit, code);
}

static void tcp_notify_abort(ddp__xport_t *x, int culprit, int code)
{
    tcp_t *t = (tcp_t *)x;
    int64_t deadline = ddp_now_ns() + 200000000LL;
    if (x->is_send && t->off > 0) {
        /* finish the frame in flight so the abort frame starts on a boundary */
        size_t i = t->tail % (size_t)t->nslots;
        frame_t h = {.type = F_DATA, .len = (uint32_t)t->lens[i]};
        if (t->off < sizeof h &&
            ddp__net_send_all(t->fd, (char *)&h + t->off, sizeof h - t->off, deadline) < 0)
            return;
        size_t done = t->off > sizeof h ? t->off - sizeof h : 0;
        if (ddp__net_send_all(t->fd, src_of(t, i) + done, t->lens[i] - done, deadline) < 0)
            return;
        t->off = 0;
    }
    frame_t f = {.type = F_ABORT, .culprit = culprit, .code = code};
    ddp__net_send_all(t->fd, &f, sizeof f, deadline);
}

static void tcp_close(ddp__xport_t *x)
{
    tcp_t *t = (tcp_t *)x;
    close(t->fd);
    free(t->slots);
    free(t->lens);
    free(t->ptr);
    free(t->cap);
    free(t->at);
    free(t);
}

static const ddp__xport_ops_t tcp_ops = {
    .name = "tcp",
    .progress = tcp_progress,
    .send_slot = tcp_send_slot,
    .send_commit = tcp_send_commit,
    .recv_slot = tcp_recv_slot,
    .recv_release = tcp_recv_release,
    .send_from = tcp_send_from,
    .recv_post = tcp_recv_post,
    .detach = tcp_detach,
    .pending = tcp_pending,
    .pollfds = tcp_pollfds,
    .after_poll = tcp_after_poll,
    .notify_abort = tcp_notify_abort,
    .close = tcp_close,
};

int ddp__tcp_xport_new(int fd, int is_send, int peer, size_t slot_bytes, int nslots,
                       ddp__xport_t **out)
{
    tcp_t *t = ddp_calloc(1, sizeof *t);
    char *slots = ddp_aligned_alloc(4096, slot_bytes * (size_t)nslots);
    size_t *lens = ddp_calloc((size_t)nslots, sizeof *lens);
    char **ptr = ddp_calloc((size_t)nslots, sizeof *ptr);
    size_t *cap = ddp_calloc((size_t)nslots, sizeof *cap);
    char **at = ddp_calloc((size_t)nslots, sizeof *at);
    if (!t || !slots || !lens || !ptr || !cap || !at) {
        free(t);
        free(slots);
        free(lens);
        free(ptr);
        free(cap);
        free(at);
        return DDP_ENOMEM;
    }
    ddp__net_nonblock(fd, 1);
    t->pub.ops = &tcp_ops;
    t->pub.slot_bytes = slot_bytes;
    t->pub.peer = peer;
    t->pub.is_send = is_send;
    t->fd = fd;
    t->nslots = nslots;
    t->slots = slots;
    t->lens = lens;
    t->ptr = ptr;
    t->cap = cap;
    t->at = at;
    for (int i = 0; i < nslots; i++) at[i] = slot(t, (size_t)i);
    *out = &t->pub;
    return 0;
}
