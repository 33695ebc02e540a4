/* Writing the model's parameters as one Hugging Face GPT-2 safetensors file (the --dump-weights
 * option, and what tests compare tensor by tensor). */
#ifndef DDP_WORKER_MODEL_EXPORT_H
#define DDP_WORKER_MODEL_EXPORT_H

#include "common/err.h"
#include "worker/model/model.h"

/* Copies the parameter arena to the host and writes it to `path` with HF names and shapes,
 * fsynced. Returns 0 or a negative error with ei naming the file. */
int ddp_model_export(const ddp_model_t *m, const char *path, ddp_errinfo_t *ei);

#endif
