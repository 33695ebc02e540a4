/* ZeRO-1's optimizer moments (see zero1.h). */
#include "worker/optim/zero1.h"

#include <string.h>

#include "common/alloc.h"

static int on_device(const ddp_zero1_t *z) { return !ddp_k_host_memory(z->world->k); }

static size_t bucket_begin(const ddp_reducer_t *r, int b) { return b ? r->bucket_end[b - 1] : 0; }

void ddp_zero1_attach(ddp_zero1_t *z, ddp_reducer_t *reducer, float *weights)
{
    z->reducer = reducer;
    z->weights = weights;
}

int ddp_zero1_reserve_device(ddp_zero1_t *z, size_t n, int commit_whole, ddp_errinfo_t *ei)
{
    for (int i = 0; i < 2; i++) {
        int rc = ddp_k_reserve(z->world->k, (void **)&z->moments[i], n * sizeof(float));
        if (rc == 0 && commit_whole)
            rc = ddp_k_commit(z->world->k, z->moments[i], n * sizeof(float));
        if (rc)
            return ddp_errinfo_set(ei, rc, "ddp.shard_optimizer: moment arena of %zu floats: %s", n,
                                   ddp_strerror(rc));
    }
    z->on = 1;
    z->whole = commit_whole;
    return 0;
}

int ddp_zero1_begin(ddp_zero1_t *z, ddp_errinfo_t *ei)
{
    if (!z->on || !on_device(z) || z->whole) {
        z->whole = 1;
        return 0;
    }
    const ddp_reducer_t *r = z->reducer;
    for (int i = 0; i < 2; i++)
        for (int b = 0; b < r->n_buckets; b++) {
            const ddp_arena_part_t *p = &r->parts[b];
            int rc = p->hi > p->lo ? ddp_k_commit(z->world->k, z->moments[i] + p->lo,
                                                  (p->hi - p->lo) * sizeof(float))
                                   : 0;
            if (rc)
                return ddp_errinfo_set(ei, rc,
                                       "ddp.shard_optimizer: this rank's slices of the "
                                       "moments: %s",
                                       ddp_strerror(rc));
        }
    return 0; /* z->whole stays 0: zero in this rank's slices, which are all it reads */
}

/* Before bucket b's moments are gathered into this rank's arenas: on a device, commits the
 * bucket's range (zero where new) and orders the gathers after that on the compute stream. */
static int commit_bucket(ddp_zero1_t *z, int b)
{
    if (!on_device(z)) return 0;
    const ddp_reducer_t *r = z->reducer;
    size_t begin = bucket_begin(r, b), len = r->bucket_end[b] - begin;
    for (int i = 0; i < 2; i++)
        DDP_CHECK(ddp_k_commit(z->world->k, z->moments[i] + begin, len * sizeof(float)));
    return ddp_world_after_compute(z->world);
}

int ddp_zero1_on_part_updated(void *arg, int b)
{
    ddp_zero1_t *z = arg;
    DDP_CHECK(ddp_reducer_gather(z->reducer, z->weights, b));
    if (!z->gather) return 0;
    /* a save follows this step: the moments travel beside the update instead of at the step
     * boundary */
    DDP_CHECK(commit_bucket(z, b));
    for (int i = 0; i < 2; i++) DDP_CHECK(ddp_reducer_gather(z->reducer, z->moments[i], b));
    return 0;
}

int ddp_zero1_gather(ddp_zero1_t *z, ddp_errinfo_t *ei)
{
    if (!z->on || z->whole) return 0;
    for (int b = 0; b < z->reducer->n_buckets; b++) {
        DDP_CHECK(commit_bucket(z, b));
        for (int i = 0; i < 2; i++) DDP_CHECK(ddp_reducer_gather(z->reducer, z->moments[i], b));
    }
    DDP_CHECK(ddp_reducer_gather_wait(z->reducer, ei));
    z->whole = 1;
    return 0;
}

int ddp_zero1_from_peers(ddp_zero1_t *z)
{
    if (!z->on || z->whole) return 1;
    if (z->mid_update || !z->world->comm) return 0;
    for (int i = 0; i < 2; i++)
        if (!ddp_coll_mem_shared(z->world->comm, z->moments[i])) return 0;
    const ddp_reducer_t *r = z->reducer;
    for (int i = 0; i < 2; i++)
        for (int b = 0; b < r->n_buckets; b++) {
            size_t begin = bucket_begin(r, b), len = r->bucket_end[b] - begin;
            for (int q = 0; q < z->world->size; q++) {
                size_t lo, hi;
                ddp_coll_slice(len, z->world->size, q, &lo, &hi);
                float *mine = z->moments[i] + begin + lo;
                if (q != z->world->rank && hi > lo)
                    memcpy(mine, ddp_coll_mem_peer(z->world->comm, mine, q),
                           (hi - lo) * sizeof(float));
            }
        }
    z->whole = 1;
    return 1;
}

static void give_back(ddp_zero1_t *z, float *p, size_t n)
{
    if (on_device(z))
        ddp_k_decommit(z->world->k, p, n * sizeof(float)); /* the gathers were waited for */
    else
        ddp_mem_release(p, n * sizeof(float));
}

/* They read as zero (CPU) or are unmapped (GPU) until the next gather overwrites them, and only
 * this rank's parts are read meanwhile; this is where ZeRO-1 saves its memory. On the CPU, private
 * memory only (ranks on different hosts): an arena shared with the peers of one host is a /dev/shm
 * segment reserved whole (collectives/shm_direct.c), where a peer writes during a gather and a full
 * /dev/shm must stay an error at start, not a SIGBUS at the next save. */
void ddp_zero1_drop_foreign(ddp_zero1_t *z)
{
    const ddp_reducer_t *r = z->reducer;
    for (int i = 0; i < 2; i++) {
        if (!on_device(z) && ddp_coll_mem_shared(z->world->comm, z->moments[i])) continue;
        for (int b = 0; b < r->n_buckets; b++) {
            size_t begin = bucket_begin(r, b), end = r->bucket_end[b];
            const ddp_arena_part_t *p = &r->parts[b];
            give_back(z, z->moments[i] + begin, p->lo - begin);
            give_back(z, z->moments[i] + p->hi, end - p->hi);
        }
    }
}

ddp_zero1_part_fn ddp_zero1_update_begin(ddp_zero1_t *z, int save_follows)
{
    z->gather = z->on && save_follows;
    z->was_whole = z->whole;
    if (z->on) z->whole = 0;
    z->mid_update = z->on;
    return z->on ? ddp_zero1_on_part_updated : NULL;
}

void ddp_zero1_update_end(ddp_zero1_t *z)
{
    if (z->on && z->was_whole && !z->gather) ddp_zero1_drop_foreign(z);
    z->whole = z->gather;
    z->mid_update = 0;
}

int ddp_zero1_gathered(const ddp_zero1_t *z) { return z->on && z->whole; }
