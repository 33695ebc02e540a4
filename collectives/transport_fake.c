/* The in-process fake transport: a world of n ranks that are threads of one process, joined by
 * in-memory links (one heap segment and two eventfds per directed link), for unit tests of the
 * ring and of its callers (the reducer). It reuses the shared-memory slot protocol over heap
 * memory, so the ring code under test is the production code; it has no death detection (threads
 * do not die alone). A per-chunk delay (opts.chunk_delay_us) makes it an
 * artificially slow transport.
 */
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "collectives/ring.h"
#include "common/alloc.h"

struct ddp_coll_fake_world {
    int n;
    size_t slot_bytes;
    void **seg;    /* seg[i]: link i -> i+1 */
    int (*efd)[2]; /* [data, space] per link */
};

int ddp_coll_fake_world_new(int n, ddp_coll_fake_world_t **out)
{
    if (n < 1 || !out) return DDP_EINVAL;
    ddp_coll_fake_world_t *w = ddp_calloc(1, sizeof *w);
    if (!w) return DDP_ENOMEM;
    w->n = n;
    w->slot_bytes = ddp__ring_slot_bytes(NULL);
    w->seg = ddp_calloc((size_t)n, sizeof *w->seg);
    w->efd = ddp_calloc((size_t)n, sizeof *w->efd);
    if (!w->seg || !w->efd) {
        ddp_coll_fake_world_free(w);
        return DDP_ENOMEM;
    }
    for (int i = 0; i < n; i++) w->efd[i][0] = w->efd[i][1] = -1;
    for (int i = 0; i < n && n > 1; i++) {
        size_t len = ddp__shm_seg_bytes(w->slot_bytes, DDP__RING_NSLOTS);
        w->seg[i] = ddp_aligned_alloc(4096, len);
        w->efd[i][0] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        w->efd[i][1] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (!w->seg[i] || w->efd[i][0] < 0 || w->efd[i][1] < 0) {
            ddp_coll_fake_world_free(w);
            return DDP_ENOMEM;
        }
        ddp__shm_seg_init(w->seg[i], w->slot_bytes, DDP__RING_NSLOTS);
    }
    *out = w;
    return 0;
}

int ddp_coll_new_fake(ddp_coll_fake_world_t *w, int rank, const ddp_coll_opts_t *opts,
                      ddp_coll_t **out)
{
    if (!w || !out || rank < 0 || rank >= w->n) return DDP_EINVAL;
    ddp_coll_t *c = ddp__coll_alloc();
    if (!c) return DDP_ENOMEM;
    c->ops = &ddp_coll_ring_ops;
    ddp__coll_init_common(c, rank, w->n, 0, "fake", opts);
    ddp__xport_t *sx = NULL, *rx = NULL;
    int rc = 0;
    if (w->n > 1) {
        int next = (rank + 1) % w->n, prev = (rank + w->n - 1) % w->n;
        rc = ddp__shm_xport_new_mem(w->seg[rank], w->efd[rank][0], w->efd[rank][1], 1, next,
                                    "fake", &sx);
        if (rc == 0)
            rc = ddp__shm_xport_new_mem(w->seg[prev], w->efd[prev][0], w->efd[prev][1], 0, prev,
                                        "fake", &rx);
    }
    if (rc == 0) rc = ddp__ring_start(c, sx, rx, opts, w->slot_bytes);
    if (rc < 0) {
        if (sx) sx->ops->close(sx);
        if (rx) rx->ops->close(rx);
        ddp_coll_free(c);
        return rc;
    }
    c->transport = w->n > 1 ? "fake" : "self";
    snprintf(c->algo, sizeof c->algo, "%s", w->n > 1 ? "flat ring" : "single");
    *out = c;
    return 0;
}

void ddp_coll_fake_world_free(ddp_coll_fake_world_t *w)
{
    if (!w) return;
    for (int i = 0; i < w->n; i++) {
        if (w->seg) free(w->seg[i]);
        if (w->efd) {
            if (w->efd[i][0] >= 0) close(w->efd[i][0]);
            if (w->efd[i][1] >= 0) close(w->efd[i][1]);
        }
    }
    free(w->seg);
    free(w->efd);
    free(w);
}
