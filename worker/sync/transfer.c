/* Elastic: a live rank's state to the ranks that lack it, overlapped with a step (see
 * transfer.h). */
#include <stddef.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "worker/sync/transfer.h"

/* The source's counters and figures on the wire: the layout ranks of every build since the
 * state transfer began send and expect (an elastic job may mix builds across an upgrade). */
typedef struct transfer_header {
    int64_t step, adam_t;
    uint64_t tokens, rng[4];
    int32_t skipped, loss_scale_clean;
    float last_loss, last_val_loss, loss_scale;
    double last_norm, last_step_ms;
    double micro_ms;     /* forward + backward of one micro-batch; 0: unknown */
    double allreduce_ms; /* the gradient's all-reduce (busy time), world allreduce_world */
    int32_t allreduce_world;
} transfer_header_t;
_Static_assert(sizeof(transfer_header_t) == 120 && offsetof(transfer_header_t, last_loss) == 64 &&
                   offsetof(transfer_header_t, last_norm) == 80 &&
                   offsetof(transfer_header_t, allreduce_world) == 112,
               "the state transfer's header is a wire format");

static transfer_header_t header_of(const ddp_transfer_cfg_t *c)
{
    const ddp_position_t *p = c->pos;
    transfer_header_t h = {.step = p->step,
                           .adam_t = *c->adam_t,
                           .tokens = p->tokens,
                           .skipped = p->skipped,
                           .loss_scale_clean = (int32_t)p->loss_scale_clean,
                           .last_loss = p->last_loss,
                           .last_val_loss = p->last_val_loss,
                           .loss_scale = p->loss_scale,
                           .last_norm = p->last_norm,
                           .last_step_ms = c->last->ms,
                           .micro_ms = c->last->micro_ms,
                           .allreduce_ms = c->last->comm.comm_ms,
                           .allreduce_world = c->last->world};
    memcpy(h.rng, p->rng.s, sizeof h.rng);
    return h;
}

static void apply_header(const ddp_transfer_cfg_t *c, const transfer_header_t *h)
{
    ddp_position_t *p = c->pos;
    *p = (ddp_position_t){.step = h->step,
                          .tokens = h->tokens,
                          .skipped = h->skipped,
                          .loss_scale_clean = h->loss_scale_clean,
                          .last_loss = h->last_loss,
                          .last_val_loss = h->last_val_loss,
                          .loss_scale = h->loss_scale,
                          .last_norm = h->last_norm};
    memcpy(p->rng.s, h->rng, sizeof h->rng);
    *c->adam_t = h->adam_t;
    c->last->ms = h->last_step_ms;
}

/* Micro-batches the busiest of `world` ranks computes of n_micro (data/loader.h's deal). */
static int busiest_share(int n_micro, int world) { return (n_micro + world - 1) / world; }

int ddp_transfer_overlap_pays(const ddp_step_times_t *source, double bytes, size_t grad_bytes,
                              int world, int receivers, int n_micro)
{
    if (source->micro_ms <= 0 || source->comm.comm_ms <= 0 || source->world < 2 ||
        grad_bytes == 0 || receivers >= world)
        return 0;
    double W = source->world;
    double link_ms_per_byte = source->comm.comm_ms / (2.0 * (W - 1) / W * (double)grad_bytes);
    double transfer_ms = bytes * link_ms_per_byte;
    int extra = busiest_share(n_micro, world - receivers) - busiest_share(n_micro, world);
    return transfer_ms > extra * source->micro_ms;
}

int ddp_transfer_plan(ddp_transfer_t *x, const ddp_transfer_cfg_t *cfg, ddp_errinfo_t *ei)
{
    ddp_transfer_clear(x);
    const ddp_world_t *w = cfg->world;
    x->world = w;
    transfer_header_t h = header_of(cfg);
    ddp_coll_req_t *req;
    DDP_CHECK(ddp_coll_broadcast(w->comm, &h, sizeof h, cfg->source, &req));
    DDP_CHECK(ddp_coll_wait(req, 0, ei));
    /* the extension after it, only when the spec has one (position.h): the source's */
    ddp_position_ext_t ext = cfg->pos->ext;
    if (cfg->extended) {
        DDP_CHECK(ddp_coll_broadcast(w->comm, &ext, sizeof ext, cfg->source, &req));
        DDP_CHECK(ddp_coll_wait(req, 0, ei));
    }
    /* who receives: a float per rank, 1 where the state is not the source's */
    float *behind = ddp_calloc((size_t)w->size, sizeof *behind);
    x->receivers = ddp_calloc((size_t)w->size, 1);
    if (!behind || !x->receivers) {
        free(behind);
        return DDP_ENOMEM;
    }
    behind[w->rank] = (!cfg->has_state || cfg->pos->step != h.step) ? 1.0f : 0.0f;
    int rc = ddp_world_allreduce(w, behind, (size_t)w->size, DDP_OP_SUM, ei);
    for (int r = 0; rc == 0 && r < w->size; r++) {
        x->receivers[r] = behind[r] > 0;
        x->n_receivers += x->receivers[r];
        if (!x->receivers[r] && r < w->rank) x->deal_rank++;
    }
    free(behind);
    if (rc) return rc;
    x->receiving = x->receivers[w->rank];
    x->deal_world = x->receiving ? 0 : w->size - x->n_receivers;
    if (x->receiving) x->deal_rank = 0;
    x->active = x->n_receivers > 0;
    /* the same inputs everywhere (the source's figures), so the same choice */
    ddp_step_times_t source = {
        .micro_ms = h.micro_ms, .world = h.allreduce_world, .comm.comm_ms = h.allreduce_ms};
    size_t bytes = cfg->n * sizeof(float);
    x->overlap = cfg->mode == DDP_TRANSFER_OVERLAP ||
                 (cfg->mode == DDP_TRANSFER_AUTO &&
                  ddp_transfer_overlap_pays(&source, 3.0 * (double)bytes, bytes, w->size,
                                            x->n_receivers, cfg->n_micro));
    if (x->receiving) {
        apply_header(cfg, &h);
        cfg->pos->ext = ext;
    }
    return 0;
}

int ddp_transfer_start(ddp_transfer_t *x, float *const *arenas, int n_arenas, size_t n)
{
    ddp_coll_t *comm = x->world->comm;
    int rank = x->world->rank;
    /* each run of consecutive receivers (in ring order) from the holder just before it: the
     * bytes cross one link, and ring order is the order every rank submits in */
    int W = x->world->size, first = 0;
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
            void *buf = (rank == root || run[rank]) ? arenas[a] : NULL;
            rc = ddp_coll_transfer(comm, buf, n * sizeof(float), root, run, &x->reqs[x->n_reqs]);
            if (rc == 0) x->n_reqs++;
        }
        if (run[rank]) x->bytes = (double)n_arenas * (double)(n * sizeof(float));
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
