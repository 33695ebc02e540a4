/* Token shards in llm.c's format, so llm.c's preprocessing scripts feed ddpd unchanged.
 *
 *   header: 256 x int32 little-endian; [0] = 20240520 (magic), [1] = 1 (version),
 *           [2] = number of tokens; the rest zero.
 *   body:   uint16 little-endian tokens, exactly [2] of them (no trailing bytes).
 *
 * A reader maps the file read-only and validates the header against the file size; every error
 * names the file and what is wrong (bad magic with the value found, unsupported version,
 * truncated body with expected and actual sizes).
 */
#ifndef DDP_PROTO_SHARD_H
#define DDP_PROTO_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define DDP_SHARD_MAGIC 20240520
#define DDP_SHARD_VERSION 1
#define DDP_SHARD_HEADER_INTS 256
#define DDP_SHARD_HEADER_BYTES (DDP_SHARD_HEADER_INTS * 4)

typedef struct ddp_shard {
    const uint16_t *tokens; /* mapped, read-only */
    size_t n_tokens;
    void *map;
    size_t map_len;
    char path[1024];
} ddp_shard_t;

/* Maps and validates a shard. Returns 0, -errno, or DDP_EFORMAT with ei naming the file. */
int ddp_shard_open(ddp_shard_t *s, const char *path, ddp_errinfo_t *ei);
/* Unmaps. NULL-safe; safe on a zeroed struct. */
void ddp_shard_close(ddp_shard_t *s);

/* Writes tokens as a shard: to `path`.tmp, fsync, rename. Returns 0 or -errno. */
int ddp_shard_write(const char *path, const uint16_t *tokens, size_t n_tokens);

/* Expands a glob into a sorted list of paths; caller frees with ddp_shard_glob_free.
 * Returns 0, or DDP_ENOTFOUND (ei says the pattern) when nothing matches. */
int ddp_shard_glob(const char *pattern, char ***paths, size_t *count, ddp_errinfo_t *ei);
void ddp_shard_glob_free(char **paths, size_t count);

#endif
