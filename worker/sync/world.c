/* The world (see world.h). */
#include "worker/sync/world.h"

int ddp_world_allreduce(const ddp_world_t *w, float *vals, size_t n, ddp_redop_t op,
                        ddp_errinfo_t *ei)
{
    if (!w->comm) return 0;
    ddp_coll_req_t *req;
    DDP_CHECK(ddp_coll_allreduce(w->comm, vals, n, DDP_DT_F32, op, &req));
    return ddp_coll_wait(req, 0, ei);
}

int ddp_world_failed(const ddp_world_t *w) { return w->comm && ddp_coll_status(w->comm) != 0; }

int ddp_world_comm_error(const ddp_world_t *w, int rc)
{
    return rc == DDP_EPEER || rc == DDP_ETIMEDOUT || rc == DDP_EABORTED || rc == DDP_ECLOSED ||
           ddp_world_failed(w);
}

int ddp_world_after_compute(const ddp_world_t *w)
{
    if (!w->comm) return 0;
    void *ev = NULL;
    DDP_CHECK(ddp_k_record_event(w->k, &ev));
    return ddp_coll_wait_event(w->comm, ev);
}

int ddp_world_uses_coll_mem(const ddp_world_t *w) { return w->comm && ddp_k_host_memory(w->k); }

int ddp_world_alloc_reduced(const ddp_world_t *w, size_t bytes, float **out, ddp_errinfo_t *ei)
{
    if (ddp_world_uses_coll_mem(w)) return ddp_coll_mem_alloc(w->comm, bytes, (void **)out, ei);
    DDP_CHECK(ddp_k_alloc(w->k, (void **)out, bytes));
    return ddp_k_memset0(w->k, *out, bytes);
}

void ddp_world_free_reduced(const ddp_world_t *w, float *p)
{
    if (ddp_world_uses_coll_mem(w))
        ddp_coll_mem_free(w->comm, p);
    else
        ddp_k_free(w->k, p);
}
