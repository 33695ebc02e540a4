/* Token shards in llm.c's format, so llm.c's preprocessing scripts feed ddpd unchanged.
 *
 *   header: 256 x int32 little-endian; [0] = magic, [1] = version, [2] = number of tokens;
 *           the rest zero. Two labels, as llm.c's dev/data/data_common.py defines them:
 *             20240520, version 1: GPT-2's, uint16 tokens (vocabularies up to 65,536);
 *             20240801, version 7: Llama 3's, uint32 tokens (any vocabulary).
 *   body:   little-endian tokens of that width, exactly [2] of them (no trailing bytes).
 *
 * A reader opens the file read-only and validates the header against the file size; every error
 * names the file and what is wrong (bad magic with the value found, unsupported version,
 * truncated body with expected and actual sizes) and the byte offset.
 */
#ifndef DDP_PROTO_SHARD_H
#define DDP_PROTO_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define DDP_SHARD_MAGIC 20240520 /* uint16 tokens */
#define DDP_SHARD_VERSION 1
#define DDP_SHARD32_MAGIC 20240801 /* uint32 tokens (llm.c's "llama-3") */
#define DDP_SHARD32_VERSION 7
#define DDP_SHARD_HEADER_INTS 256
#define DDP_SHARD_HEADER_BYTES (DDP_SHARD_HEADER_INTS * 4)

typedef struct ddp_shard {
    int fd;          /* open read-only while path[0] != 0 */
    int token_bytes; /* 2 or 4 */
    size_t n_tokens;
    char path[1024];
} ddp_shard_t;

/* Reads tokens [first, first + n) of an open shard (either width) into out, widened; first + n
 * <= n_tokens; safe from several threads. Returns 0, or -errno / DDP_EFORMAT (the file shrank
 * since it was opened) with ei naming the file and the byte offset. */
int ddp_shard_read(const ddp_shard_t *s, size_t first, size_t n, uint32_t *out, ddp_errinfo_t *ei);

/* Opens and validates a shard of either width. Returns 0, -errno, or DDP_EFORMAT with ei naming
 * the file and the byte offset. */
int ddp_shard_open(ddp_shard_t *s, const char *path, ddp_errinfo_t *ei);
/* Closes. NULL-safe; safe on a zeroed struct. */
void ddp_shard_close(ddp_shard_t *s);

/* Writes tokens as a 16-bit shard: to `path`.tmp, fsync, rename. Returns 0 or -errno. */
int ddp_shard_write(const char *path, const uint16_t *tokens, size_t n_tokens);
/* The same as a 32-bit (Llama 3 label) shard. Returns 0, -errno, or DDP_EINVAL (too many). */
int ddp_shard_write32(const char *path, const uint32_t *tokens, size_t n_tokens);

/* Expands a glob into a sorted list of paths; caller frees with ddp_shard_glob_free.
 * Returns 0, or DDP_ENOTFOUND (ei says the pattern) when nothing matches. */
int ddp_shard_glob(const char *pattern, char ***paths, size_t *count, ddp_errinfo_t *ei);
void ddp_shard_glob_free(char **paths, size_t count);

#endif
