/* The TCP rendezvous's hello (bootstrap_env.c): the bytes a rank sends rank 0 to join a job,
 * and rank 0's verdict on them, as pure functions (no socket, no bootstrap state), so that the
 * check can be tested and fuzzed on its own.
 *
 *   hello {magic "DDPRDZV1", u32 rank, u32 size, u64 generation, char token[128]}
 * in host byte order (all ranks of a job run on one architecture). Thread-safe.
 */
#ifndef DDP_COLL_RDZV_HELLO_H
#define DDP_COLL_RDZV_HELLO_H

#include <stddef.h>
#include <stdint.h>

#define DDP_RDZV_HELLO_MAGIC "DDPRDZV1"
#define DDP_RDZV_TOKEN_BYTES 128

typedef struct {
    char magic[8];
    uint32_t rank, size;
    uint64_t generation;
    char token[DDP_RDZV_TOKEN_BYTES]; /* NUL-padded */
} ddp__rdzv_hello_t;

/* What rank 0 expects of a hello. */
typedef struct {
    const char *token; /* the job's token (shorter than DDP_RDZV_TOKEN_BYTES) */
    int size;          /* the world size */
    uint64_t generation;
    const int *fds;    /* size entries: fds[r] >= 0 when rank r has joined (fds[0] is ignored);
                        * NULL: none has */
} ddp__rdzv_expect_t;

/* The verdict on the bytes received so far. */
typedef struct {
    int rank;        /* > 0: accepted as this rank; 0: too few bytes yet; < 0: refused */
    const char *why; /* refused: a static reason for the log line */
    uint32_t claimed_rank;       /* what the hello claims (0 until those bytes arrived) */
    uint64_t claimed_generation;
} ddp__rdzv_verdict_t;

/* Fills h with the hello of `rank` of a world of `size` at `generation` (token is copied,
 * truncated to DDP_RDZV_TOKEN_BYTES - 1 bytes). */
void ddp__rdzv_hello_make(ddp__rdzv_hello_t *h, int rank, int size, uint64_t generation,
                          const char *token);

/* Judges the first len bytes of a connection's hello against e: refused as garbage as soon as
 * the 8-byte magic is wrong, accepted or refused once sizeof(ddp__rdzv_hello_t) bytes are in,
 * refused when there are more than that; otherwise (a partial hello) v->rank is 0. The token is
 * compared in constant time, and before the generation, size and rank, so a stranger learns
 * nothing of them. Returns v->rank. */
int ddp__rdzv_hello_check(const void *bytes, size_t len, const ddp__rdzv_expect_t *e,
                          ddp__rdzv_verdict_t *v);

#endif
