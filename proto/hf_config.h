/* Hugging Face GPT-2 config.json: the architecture of a model.init_from directory.
 *
 * Keys read (transformers' GPT2Config): n_layer, n_head, n_embd, vocab_size, n_positions (or
 * the older n_ctx) as block_size; model_type, when present, must be "gpt2", and n_inner, when
 * not null, must be 4 * n_embd (the only MLP width this model has). Everything else in the
 * file (dropouts, token ids, versions) is ignored.
 */
#ifndef DDP_PROTO_HF_CONFIG_H
#define DDP_PROTO_HF_CONFIG_H

#include "common/err.h"
#include "proto/spec.h"

/* Reads dir/config.json into *cfg. Returns 0; -ENOENT when there is no such file; DDP_ESPEC
 * when it is not a GPT-2 config (not JSON, a key missing or out of range, another model type);
 * ei names the file and the key. Any thread; blocking file I/O. */
int ddp_hf_config_read(const char *dir, ddp_model_cfg_t *cfg, ddp_errinfo_t *ei);

/* Completes a parsed spec whose model.init_from is set: with no preset or dimensions, the model
 * is init_from's config.json's (and train.seq_len, when not given, its block_size); with them,
 * each is checked against config.json when the directory has one (DDP_ESPEC, ei's path the
 * field: "model.n_embd" or "model.preset"). Then the rules that need the model (seq_len <=
 * block_size, global_batch_tokens a multiple of micro_batch x seq_len) are checked. Without
 * init_from it does nothing. Returns 0 or a negative code with ei set. Call it where
 * init_from's files are (the worker), once, before the model is built. */
int ddp_spec_resolve_model(ddp_spec_t *spec, ddp_errinfo_t *ei);

#endif
