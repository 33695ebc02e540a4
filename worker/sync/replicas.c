/* Replica checksum comparison (see replicas.h). */
#include "worker/sync/replicas.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/crc32c.h"

/* CRC32C (common/crc32c.h: carry-less folding at tens of GB/s a core), not a byte-serial hash:
 * a joining rank checks every parameter before its first step, on the path that keeps it out of
 * service (FNV-1a over GPT-2 124M's 0.5 GB took about half a second of it). */
uint64_t ddp_tensor_hash(const float *x, size_t n)
{
    return ddp_crc32c_update(0, x, n * sizeof(float));
}

/* The hash of x[n] as if the lowest bit of its first float were flipped (the test hook), without
 * a copy of x. */
static uint64_t hash_flipped(const float *x, size_t n)
{
    uint32_t first;
    memcpy(&first, x, sizeof first);
    first ^= 1u;
    return ddp_crc32c_update(ddp_crc32c_update(0, &first, sizeof first), x + 1,
                             (n - 1) * sizeof(float));
}

int ddp_replicas_check(const ddp_world_t *world, const ddp_model_t *model, int flip_rank,
                       ddp_errinfo_t *ei)
{
    int rank = world->rank, n = model->n_tensors;
    ddp_kernels_t *k = model->k;
    uint64_t *mine = ddp_calloc((size_t)n, sizeof *mine);
    uint64_t *root = ddp_calloc((size_t)n, sizeof *root);
    /* host memory (the CPU) is hashed where it is: a copy would be a parameter arena more at
     * each check, the peak of a long run (the memory budget does not count it) */
    float *host = ddp_k_host_memory(k) ? NULL : ddp_malloc(model->n_params * sizeof(float));
    const float *w = ddp_k_host_memory(k) ? model->w : host;
    /* verdict[r] = 1 + index of rank r's first differing tensor, 0 when it agrees */
    float *verdict = ddp_calloc((size_t)world->size, sizeof *verdict);
    int rc = (mine && root && w && verdict) ? 0 : DDP_ENOMEM;
    if (rc == 0 && host) rc = ddp_k_memcpy_d2h(k, host, model->w, model->n_params * sizeof(float));
    if (rc == 0 && host) rc = ddp_k_sync(k);
    for (int i = 0; rc == 0 && i < n; i++) {
        const ddp_param_desc_t *p = &model->params[i];
        /* Test hook: the named rank hashes the arena's first float with one bit flipped, as if
         * its replica drifted. */
        mine[i] = flip_rank == rank && p->offset == 0 && p->numel
                      ? hash_flipped(w, p->numel)
                      : ddp_tensor_hash(w + p->offset, p->numel);
    }
    if (rc == 0) {
        memcpy(root, mine, (size_t)n * sizeof *root);
        ddp_coll_req_t *req;
        rc = ddp_coll_broadcast(world->comm, root, (size_t)n * sizeof *root, 0, &req);
        if (rc == 0) rc = ddp_coll_wait(req, 0, ei);
    }
    if (rc == 0) {
        for (int i = 0; i < n; i++)
            if (mine[i] != root[i]) {
                verdict[rank] = (float)(i + 1);
                break;
            }
        rc = ddp_world_allreduce(world, verdict, (size_t)world->size, DDP_OP_SUM, ei);
    }
    if (rc == 0) {
        char ranks[256] = "";
        size_t used = 0;
        int first = -1;
        for (int r = 0; r < world->size; r++)
            if (verdict[r] > 0) {
                used += (size_t)snprintf(ranks + used, sizeof ranks - used, "%s%d",
                                         used ? ", " : "", r);
                if (first < 0) first = (int)verdict[r] - 1;
                if (used >= sizeof ranks) break;
            }
        if (first >= 0)
            rc = ddp_errinfo_set(ei, DDP_EMISMATCH,
                                 "replicas differ: rank(s) %s hold different parameters than "
                                 "rank 0; first differing tensor %s",
                                 ranks, model->params[first].name);
    }
    free(mine);
    free(root);
    free(host);
    free(verdict);
    return rc;
}
