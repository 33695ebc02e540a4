/* Parameters to one safetensors file (see export.h). */
#include "worker/model/export.h"

#include <stdlib.h>

#include "common/alloc.h"
#include "worker/checkpoint/safetensors.h"

int ddp_model_export(const ddp_model_t *m, const char *path, ddp_errinfo_t *ei)
{
    float *host = ddp_malloc(m->n_params * sizeof(float));
    ddp_st_tensor_t *t = ddp_calloc((size_t)m->n_tensors, sizeof *t);
    int rc = host && t ? 0 : DDP_ENOMEM;
    if (rc == 0) rc = ddp_k_memcpy_d2h(m->k, host, m->w, m->n_params * sizeof(float));
    if (rc == 0) rc = ddp_k_sync(m->k);
    for (int i = 0; rc == 0 && i < m->n_tensors; i++) {
        const ddp_param_desc_t *p = &m->params[i];
        t[i] = (ddp_st_tensor_t){.name = p->name,
                                 .dtype = DDP_ST_F32,
                                 .ndim = p->ndim,
                                 .shape = {p->shape[0], p->shape[1]},
                                 .data = host + p->offset,
                                 .nbytes = p->numel * sizeof(float)};
    }
    static const char *const meta[] = {"format", "pt"};
    if (rc == 0) rc = ddp_st_write_file(path, t, (size_t)m->n_tensors, meta, 1, ei);
    free(host);
    free(t);
    return rc;
}
