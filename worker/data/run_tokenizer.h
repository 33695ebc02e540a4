/* data.tokenizer: the Hugging Face tokenizer.json a run names, loaded once at start.
 *
 * What the run does with it: refuses one that tokenizer.h cannot load, or whose
 * vocabulary is larger than the model's; rank 0 copies it into the run directory
 * (RUN_DIR/tokenizer.json, atomically); every checkpoint carries it beside config.json, with
 * the tokenizer_config.json found beside it (transformers' AutoTokenizer reads its special
 * tokens), and names its BOS and EOS in config.json and generation_config.json; the sample at
 * the end is decoded through it and starts from its BOS.
 *
 * BOS and EOS are those tokenizer_config.json names (bos_token / eos_token: a string, an object
 * with "content", or null for none). Without a tokenizer_config.json they are the well-known
 * special tokens the tokenizer has: <|begin_of_text|>, <s> or <|endoftext|> for BOS (the first
 * found), <|end_of_text|>, </s> or <|endoftext|> for EOS.
 *
 * Threads: loaded and freed by the training thread; read-only afterwards, shared.
 */
#ifndef DDP_WORKER_DATA_RUN_TOKENIZER_H
#define DDP_WORKER_DATA_RUN_TOKENIZER_H

#include <stddef.h>

#include "common/err.h"
#include "proto/hf_config.h"
#include "worker/data/tokenizer.h"

typedef struct ddp_run_tokenizer {
    ddp_tok_t *tok;
    char *json; /* tokenizer.json's bytes as read, NUL-terminated (it holds no NUL) */
    size_t json_len;
    char *config_json; /* the tokenizer_config.json beside it, likewise; NULL when none */
    size_t config_len;
    ddp_hf_ids_t ids; /* BOS and EOS; -1 for one not named */
} ddp_run_tokenizer_t;

/* Loads data.tokenizer `path` for a model of vocab_size tokens: *out is NULL for "" (no
 * tokenizer). Returns 0; DDP_ESPEC for a file that cannot be read or loaded, a vocabulary
 * larger than vocab_size, or a tokenizer_config.json beside it that is not JSON or names a
 * token the tokenizer lacks (ei: path "data.tokenizer", the message names the file and, for the
 * vocabulary, both sizes); DDP_ENOMEM. The caller frees *out with ddp_run_tokenizer_free. */
int ddp_run_tokenizer_open(const char *path, int vocab_size, ddp_run_tokenizer_t **out,
                           ddp_errinfo_t *ei);

/* Copies the tokenizer into directory dir (which must exist) as tokenizer.json, and
 * tokenizer_config.json when there is one: each written to a temporary file, fsynced, renamed
 * over the name, then dir fsynced, so a reader sees the whole file or none. Returns 0 or -errno
 * (ei names the file). */
int ddp_run_tokenizer_save(const ddp_run_tokenizer_t *rt, const char *dir, ddp_errinfo_t *ei);

/* NULL-safe. */
void ddp_run_tokenizer_free(ddp_run_tokenizer_t *rt);

#endif
