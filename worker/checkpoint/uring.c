/* io_uring writes from registered memory (see uring.h). */
#include "uring.h"

#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"

#define MAX_BUF ((uintptr_t)1 << 30) /* the kernel's limit on one registered buffer */
#define PAGE ((uintptr_t)4096)

struct ddp__uring {
    struct io_uring ring;
    struct iovec *bufs; /* what is registered: the regions, page-rounded, in pieces <= 1 GiB */
    int n_bufs;
    struct iovec *asked; /* the regions as last asked for */
    int n_asked;
};

int ddp__uring_new(ddp__uring_t **out)
{
    *out = NULL;
    ddp__uring_t *u = ddp_calloc(1, sizeof *u);
    if (!u) return DDP_ENOMEM;
    int rc = io_uring_queue_init(4, &u->ring, 0);
    if (rc < 0) {
        free(u);
        return rc;
    }
    *out = u;
    return 0;
}

/* The whole pages region r touches: [*lo, *hi). */
static void page_span(const struct iovec *r, uintptr_t *lo, uintptr_t *hi)
{
    *lo = (uintptr_t)r->iov_base & ~(PAGE - 1);
    *hi = ((uintptr_t)r->iov_base + r->iov_len + PAGE - 1) & ~(PAGE - 1);
}

static void unregister(ddp__uring_t *u)
{
    if (u->n_bufs) io_uring_unregister_buffers(&u->ring);
    free(u->bufs);
    free(u->asked);
    u->bufs = u->asked = NULL;
    u->n_bufs = u->n_asked = 0;
}

void ddp__uring_free(ddp__uring_t *u)
{
    if (!u) return;
    unregister(u);
    io_uring_queue_exit(&u->ring);
    free(u);
}

int ddp__uring_register(ddp__uring_t *u, const struct iovec *regions, int n)
{
    if (n > 0 && n == u->n_asked && !memcmp(regions, u->asked, (size_t)n * sizeof *regions))
        return 0;
    unregister(u);
    size_t pieces = 0;
    for (int i = 0; i < n; i++) {
        uintptr_t lo, hi;
        page_span(&regions[i], &lo, &hi);
        pieces += (hi - lo + MAX_BUF - 1) / MAX_BUF;
    }
    if (pieces == 0 || pieces > 1024) return -EINVAL; /* UIO_MAXIOV */
    struct iovec *bufs = ddp_calloc(pieces, sizeof *bufs);
    struct iovec *asked = ddp_malloc((size_t)n * sizeof *asked);
    if (!bufs || !asked) {
        free(bufs);
        free(asked);
        return -ENOMEM;
    }
    size_t k = 0;
    for (int i = 0; i < n; i++) {
        uintptr_t lo, hi;
        page_span(&regions[i], &lo, &hi);
        for (uintptr_t a = lo; a < hi; a += MAX_BUF)
            bufs[k++] = (struct iovec){(void *)a, (size_t)(hi - a < MAX_BUF ? hi - a : MAX_BUF)};
    }
    int rc = io_uring_register_buffers(&u->ring, bufs, (unsigned)pieces);
    if (rc < 0) {
        free(bufs);
        free(asked);
        return rc;
    }
    memcpy(asked, regions, (size_t)n * sizeof *asked);
    u->bufs = bufs;
    u->n_bufs = (int)pieces;
    u->asked = asked;
    u->n_asked = n;
    return 0;
}

ssize_t ddp__uring_pwrite(ddp__uring_t *u, int fd, const void *p, size_t n, uint64_t off)
{
    uintptr_t c = (uintptr_t)p;
    for (int i = 0; i < u->n_bufs; i++) {
        uintptr_t b = (uintptr_t)u->bufs[i].iov_base, e = b + u->bufs[i].iov_len;
        if (c < b || c >= e) continue;
        if (n > e - c) n = (size_t)(e - c);
        struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
        if (!sqe) return -EBUSY; /* cannot happen: one write at a time on a ring of 4 */
        io_uring_prep_write_fixed(sqe, fd, p, (unsigned)n, off, i);
        int rc = io_uring_submit(&u->ring);
        if (rc < 0) return rc;
        struct io_uring_cqe *cqe;
        do rc = io_uring_wait_cqe(&u->ring, &cqe);
        while (rc == -EINTR);
        if (rc < 0) return rc;
        ssize_t res = cqe->res;
        io_uring_cqe_seen(&u->ring, cqe);
        return res;
    }
    return -ENOENT;
}
