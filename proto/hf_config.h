/* Hugging Face config.json, both ways: the architecture of a model.config file or a
 * model.init_from directory, and the config.json every checkpoint carries.
 *
 * GPT-2 (model_type "gpt2", or none): n_layer, n_head, n_embd, vocab_size, n_positions (or the
 * older n_ctx) as block_size; n_inner, when not null, must be 4 * n_embd.
 * The Llama family (model_type "llama", and "qwen2" with its q/k/v biases): hidden_size,
 * intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads (default:
 * num_attention_heads), rms_norm_eps, rope_theta and rope_scaling (none, "default" or Llama 3's
 * "llama3"; transformers 5's rope_parameters likewise), tie_word_embeddings, vocab_size,
 * max_position_embeddings as block_size. What such a config enables that ddpd does not
 * implement is refused with the key's name (another rope_type, a sliding window that is on,
 * Llama's attention_bias or mlp_bias, a head_dim other than hidden_size / heads, an activation
 * other than silu, another model_type); keys present but off pass, and the rest of the file
 * (dropouts, token ids, dtype, versions) is ignored.
 */
#ifndef DDP_PROTO_HF_CONFIG_H
#define DDP_PROTO_HF_CONFIG_H

#include <stddef.h>

#include "common/err.h"
#include "proto/spec.h"

/* Reads the config.json at `path` (a file, or a directory holding config.json) into *cfg.
 * Returns 0; -ENOENT when there is no such file; DDP_ESPEC when it is not a config ddpd can
 * train (not JSON, a key missing, out of range or not implemented); ei names the file and the
 * key. Any thread; blocking file I/O. */
int ddp_hf_config_read(const char *path, ddp_model_cfg_t *cfg, ddp_errinfo_t *ei);

/* Parses config.json's text (`name` for messages) as ddp_hf_config_read does. */
int ddp_hf_config_parse(const char *text, const char *name, ddp_model_cfg_t *cfg,
                        ddp_errinfo_t *ei);

/* The special tokens config.json and generation_config.json name: ids, -1 for none. */
typedef struct ddp_hf_ids {
    long bos, eos;
} ddp_hf_ids_t;

/* The ids a model names when no tokenizer says otherwise: GPT-2's end of text for both (newline
 * at vocab 256, else vocab_size - 1, which is GPT-2's <|endoftext|> at 50257); a byte-level
 * (vocab 256) Llama's newline for both; none for another Llama. */
ddp_hf_ids_t ddp_hf_default_ids(const ddp_model_cfg_t *cfg);

/* config.json for cfg, as transformers writes it for GPT2LMHeadModel, LlamaForCausalLM or
 * Qwen2ForCausalLM (ddp_malloc'd text; NULL when out of memory): from_pretrained builds the same
 * model from it, and ddp_hf_config_parse gives cfg back. bos_token_id and eos_token_id are
 * ids's (NULL: ddp_hf_default_ids), each left out when -1. */
char *ddp_hf_config_json_ids(const ddp_model_cfg_t *cfg, const ddp_hf_ids_t *ids);
/* ddp_hf_config_json_ids(cfg, NULL). */
char *ddp_hf_config_json(const ddp_model_cfg_t *cfg);

/* generation_config.json as transformers writes it beside config.json: {"_from_model_config":
 * true, "bos_token_id": .., "eos_token_id": .., "transformers_version": "4.46.0"}, each id left
 * out when -1 (ids NULL: ddp_hf_default_ids(cfg)). ddp_malloc'd text; NULL when out of memory. */
char *ddp_hf_generation_config_json(const ddp_model_cfg_t *cfg, const ddp_hf_ids_t *ids);

/* 0 when a and b are the same model; else 1, with `what` (n bytes) saying which config.json key
 * differs and its two values ("num_key_value_heads is 3 and 2"). */
int ddp_hf_config_diff(const ddp_model_cfg_t *a, const ddp_model_cfg_t *b, char *what, size_t n);

/* Completes a parsed spec whose model comes from files: with model.config, the model is that
 * config.json's; with model.init_from and no preset, dimensions or model.config, init_from's
 * config.json's (and train.seq_len, when not given, its block_size); otherwise each source is
 * checked against init_from's config.json when the directory has one (DDP_ESPEC, ei's path the
 * field that disagrees). Then the rules that need the model (seq_len <= block_size,
 * global_batch_tokens a multiple of micro_batch x seq_len) are checked. Without init_from and
 * model.config it does nothing. Returns 0 or a negative code with ei set. Call it where the
 * files are (the worker), once, before the model is built. */
int ddp_spec_resolve_model(ddp_spec_t *spec, ddp_errinfo_t *ei);

#endif
