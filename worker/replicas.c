/* Replica checksum comparison (see replicas.h). */
#include "replicas.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

uint64_t ddp_tensor_hash(const float *x, size_t n)
{
    const unsigned char *p = (const unsigned char *)x;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n * sizeof(float); i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

int ddp_replicas_check(ddp_coll_t *comm, const ddp_gpt2_t *model, int flip_rank,
                       ddp_errinfo_t *ei)
{
    int rank = ddp_coll_rank(comm), world = ddp_coll_size(comm), n = model->n_tensors;
    ddp_kernels_t *k = model->k;
    uint64_t *mine = ddp_calloc((size_t)n, sizeof *mine);
    uint64_t *root = ddp_calloc((size_t)n, sizeof *root);
    float *host = ddp_malloc(model->n_params * sizeof(float));
    /* verdict[r] = 1 + index of rank r's first differing tensor, 0 when it agrees */
    float *verdict = ddp_calloc((size_t)world, sizeof *verdict);
    int rc = (mine && root && host && verdict) ? 0 : DDP_ENOMEM;
    if (rc == 0) rc = ddp_k_memcpy_d2h(k, host, model->w, model->n_params * sizeof(float));
    if (rc == 0) rc = ddp_k_sync(k);
    /* Test hook: the named rank hashes a copy with one flipped bit, as if its replica drifted. */
    if (rc == 0 && flip_rank == rank) ((uint32_t *)host)[0] ^= 1u;
    for (int i = 0; rc == 0 && i < n; i++)
        mine[i] = ddp_tensor_hash(host + model->params[i].offset, model->params[i].numel);
    if (rc == 0) {
        memcpy(root, mine, (size_t)n * sizeof *root);
        ddp_coll_req_t *req;
        rc = ddp_coll_broadcast(comm, root, (size_t)n * sizeof *root, 0, &req);
        if (rc == 0) rc = ddp_coll_wait(req, 0, ei);
    }
    if (rc == 0) {
        for (int i = 0; i < n; i++)
            if (mine[i] != root[i]) {
                verdict[rank] = (float)(i + 1);
                break;
            }
        ddp_coll_req_t *req;
        rc = ddp_coll_allreduce(comm, verdict, (size_t)world, DDP_DT_F32, DDP_OP_SUM, &req);
        if (rc == 0) rc = ddp_coll_wait(req, 0, ei);
    }
    if (rc == 0) {
        char ranks[256] = "";
        size_t used = 0;
        int first = -1;
        for (int r = 0; r < world; r++)
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
