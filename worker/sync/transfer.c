/* Elastic: a live rank's state to the ranks that lack it, overlapped with a step (see
 * state_transfer.h). */
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "worker/sync/transfer.h"

/* Micro-batches the busiest of `world` ranks computes of n_micro (data.h's deal). */
static int busiest_share(int n_micro, int world) { return (n_micro + world - 1) / world; }

int ddp_transfer_overlap_pays(const ddp_transfer_header_t *h, double bytes, size_t grad_bytes,
                          int world, int receivers, int n_micro)
{
    if (h->micro_ms <= 0 || h->allreduce_ms <= 0 || h->allreduce_world < 2 || grad_bytes == 0 ||
        receivers >= world)
        return 0;
    double W = h->allreduce_world;
    double link_ms_per_byte = h->allreduce_ms / (2.0 * (W - 1) / W * (double)grad_bytes);
    double transfer_ms = bytes * link_ms_per_byte;
    int extra = busiest_share(n_micro, world - receivers) - busiest_share(n_micro, world);
    return transfer_ms > extra * h->micro_ms;
}

int ddp_transfer_plan(ddp_transfer_t *x, ddp_coll_t *comm, int source, int has_state, int mode,
                  size_t n, int n_micro, ddp_transfer_header_t *hdr, ddp_errinfo_t *ei)
{
    ddp_transfer_clear(x);
    x->world = ddp_coll_size(comm);
    x->rank = ddp_coll_rank(comm);
    ddp_transfer_header_t h = *hdr;
    ddp_coll_req_t *req;
    DDP_CHECK(ddp_coll_broadcast(comm, &h, sizeof h, source, &req));
    DDP_CHECK(ddp_coll_wait(req, 0, ei));
    /* who receives: a float per rank, 1 where the state is not the source's */
    float *behind = ddp_calloc((size_t)x->world, sizeof *behind);
    x->receivers = ddp_calloc((size_t)x->world, 1);
    if (!behind || !x->receivers) {
        free(behind);
        return DDP_ENOMEM;
    }
    behind[x->rank] = (!has_state || hdr->step != h.step) ? 1.0f : 0.0f;
    int rc = ddp_coll_allreduce(comm, behind, (size_t)x->world, DDP_DT_F32, DDP_OP_SUM, &req);
    if (rc == 0) rc = ddp_coll_wait(req, 0, ei);
    for (int r = 0; rc == 0 && r < x->world; r++) {
        x->receivers[r] = behind[r] > 0;
        x->n_receivers += x->receivers[r];
        if (!x->receivers[r] && r < x->rank) x->deal_rank++;
    }
    free(behind);
    if (rc) return rc;
    x->receiving = x->receivers[x->rank];
    x->deal_world = x->receiving ? 0 : x->world - x->n_receivers;
    if (x->receiving) x->deal_rank = 0;
    x->active = x->n_receivers > 0;
    /* the same inputs everywhere (the source's figures), so the same choice */
    x->overlap = mode == DDP_TRANSFER_OVERLAP ||
                 (mode == DDP_TRANSFER_AUTO &&
                  ddp_transfer_overlap_pays(&h, 3.0 * (double)(n * sizeof(float)), n * sizeof(float),
                                        x->world, x->n_receivers, n_micro));
    if (x->receiving) *hdr = h;
    return 0;
}

int ddp_transfer_start(ddp_transfer_t *x, ddp_coll_t *comm, float *const *arenas, int n_arenas,
                   size_t n)
{
    /* each run of consecutive receivers (in ring order) from the holder just before it: the
     * bytes cross one link, and ring order is the order every rank submits in */
    int W = x->world, first = 0;
    while (x->receivers[first]) first++; /* a holder: the source is one */
    unsigned char *run = ddp_calloc((size_t)W, 1);
    if (!run) return DDP_ENOMEM;
    x->t_start = ddp_now_ns();
    x->first_root = -1;
    int rc = 0;
    for (int d = 0; rc == 0 && d < W; d++) {
        int root = (first + d) % W, next = (root + 1) % W;
        if (x->receivers[root] || !x->receivers[next]) continue;
        memset(run, 0, (size_t)W);
        for (int r = next; x->receivers[r]; r = (r + 1) % W) run[r] = 1;
        if (x->first_root < 0) x->first_root = root;
        for (int a = 0; rc == 0 && a < n_arenas; a++) {
            if (x->n_reqs == DDP_TRANSFER_MAX_REQS) {
                rc = DDP_EINVAL;
                break;
            }
            void *buf = (x->rank == root || run[x->rank]) ? arenas[a] : NULL;
            rc = ddp_coll_transfer(comm, buf, n * sizeof(float), root, run, &x->reqs[x->n_reqs]);
            if (rc == 0) x->n_reqs++;
        }
        if (run[x->rank]) x->bytes = (double)n_arenas * (double)(n * sizeof(float));
    }
    free(run);
    return rc;
}

int ddp_transfer_wait(ddp_transfer_t *x, ddp_errinfo_t *ei)
{
    int rc = 0;
    int64_t last = x->t_start;
    for (int i = 0; i < x->n_reqs; i++) {
        int64_t end = 0;
        int one = ddp_coll_wait_timed(x->reqs[i], 0, NULL, &end, ei);
        x->reqs[i] = NULL;
        if (one && !rc) rc = one;
        if (end > last) last = end; /* when the communication thread finished it */
    }
    x->n_reqs = 0;
    x->ms = (double)(last - x->t_start) / 1e6;
    return rc;
}

void ddp_transfer_clear(ddp_transfer_t *x)
{
    for (int i = 0; i < x->n_reqs; i++) ddp_coll_wait(x->reqs[i], 0, NULL);
    free(x->receivers);
    memset(x, 0, sizeof *x);
}
