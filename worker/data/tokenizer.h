/* Byte-level BPE as Hugging Face's `tokenizers` defines it (GPT-2, Llama 3, Qwen2), read from a
 * tokenizer.json, for ddp-prep.
 *
 * Encoding a UTF-8 text: added tokens are cut out first (leftmost-longest; those with
 * "normalized": false before those with true, as `tokenizers` does), every stretch between them
 * is split by the pre-tokenizer's regular expression (PCRE2, Unicode properties) into pieces,
 * and each piece's bytes are merged by rank (lowest rank first, leftmost first) from one symbol
 * per byte. Decoding concatenates each id's bytes. Ids are uint32.
 *
 * Accepted tokenizer.json shapes (anything else is refused with an error naming the field):
 *   model:         {"type": "BPE" (or absent with "merges"), "vocab": {...}, "merges": ["a b"
 *                  or ["a", "b"], ...], "dropout": null, "continuing_subword_prefix" and
 *                  "end_of_word_suffix": null or "", "byte_fallback": false, "ignore_merges":
 *                  any, "unk_token": null or a vocab entry, "fuse_unk": false}
 *   normalizer:    null, or NFC ({"type": "NFC"}, or a Sequence holding just that; Qwen2's),
 *                  through utf8proc; added tokens with "normalized": true match the NFC text
 *   pre_tokenizer: {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true} (GPT-2's
 *                  regex), or {"type": "Sequence", "pretokenizers": [{"type": "Split",
 *                  "pattern": {"Regex": R} or {"String": S}, "behavior": "Isolated", "invert":
 *                  false}, {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]}
 *                  (Llama 3, Qwen2)
 *   added_tokens:  entries with "single_word", "lstrip" and "rstrip" false
 *   decoder, post_processor, truncation, padding: ignored (ddp-prep adds BOS/EOS itself).
 *
 * Threads: a loaded ddp_tok_t is read-only and shared; each thread encodes with its own
 * ddp_tok_enc_t (its word cache and regex match state).
 */
#ifndef DDP_WORKER_DATA_TOKENIZER_H
#define DDP_WORKER_DATA_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

typedef struct ddp_tok ddp_tok_t;
typedef struct ddp_tok_enc ddp_tok_enc_t;

/* A growable id array; zero-initialise, free with free(ids). */
typedef struct ddp_tok_ids {
    uint32_t *ids;
    size_t len, cap;
} ddp_tok_ids_t;

/* Loads a tokenizer.json. Returns 0, -errno (cannot read), DDP_EFORMAT (bad JSON or a refused
 * shape: ei->msg names the field, e.g. "normalizer.type: NFKC is not implemented"), DDP_ENOMEM.
 * The caller frees *out with ddp_tok_free. */
int ddp_tok_load(const char *path, ddp_tok_t **out, ddp_errinfo_t *ei);
void ddp_tok_free(ddp_tok_t *t); /* NULL-safe */

/* 1 + the highest id of the vocabulary and the added tokens. */
uint32_t ddp_tok_vocab_size(const ddp_tok_t *t);

/* 1 when some added token holds a line break (so a cut at a line start could split it). */
int ddp_tok_added_has_newline(const ddp_tok_t *t);

/* The id of a token given by its text: an added token's content, or the bytes a vocabulary
 * entry stands for ("<|endoftext|>", " the"). Returns 0 or DDP_ENOTFOUND. */
int ddp_tok_find(const ddp_tok_t *t, const char *content, uint32_t *id);

/* A per-thread encoder of t (t must outlive it). Returns 0 or DDP_ENOMEM. */
int ddp_tok_enc_new(const ddp_tok_t *t, ddp_tok_enc_t **out);
void ddp_tok_enc_free(ddp_tok_enc_t *e); /* NULL-safe */

/* Appends the ids of text[0, len) to out. The text must be valid UTF-8 (check it with
 * ddp_tok_utf8_check first). Returns 0, DDP_ENOMEM, DDP_EINVAL (one piece of 2 GiB or more),
 * or DDP_EIO (PCRE2 failed to match, e.g. its match limit). */
int ddp_tok_encode(ddp_tok_enc_t *e, const char *text, size_t len, ddp_tok_ids_t *out);

/* The offset of the first byte of p[0, len) that does not start a valid UTF-8 sequence
 * (overlong forms, surrogates and values past U+10FFFF are invalid; a sequence cut by the end
 * is invalid), or len when all of it is valid. */
size_t ddp_tok_utf8_check(const unsigned char *p, size_t len);

/* The bytes of ids[0, n) into a new buffer (*out, NUL-terminated, caller frees; *out_len
 * excludes the NUL). Returns 0, DDP_EINVAL (an id outside the vocabulary; *out_len is then its
 * index), or DDP_ENOMEM. */
int ddp_tok_decode(const ddp_tok_t *t, const uint32_t *ids, size_t n, char **out, size_t *out_len);

#endif
