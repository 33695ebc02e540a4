/* A map from byte strings to uint32 (the tokenizer's vocabulary and word cache), and the hash
 * it uses. Keys are copied in; a second put overwrites the value. Not thread-safe: one owner at
 * a time. Internal to tokenizer.c.
 */
#ifndef DDP_WORKER_DATA_BYTEMAP_H
#define DDP_WORKER_DATA_BYTEMAP_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define DDP__BYTEMAP_NONE UINT32_MAX /* get's answer for a missing key */

typedef struct ddp__bytemap {
    uint32_t *slot_key; /* index into keys[] + 1; 0 = empty */
    uint32_t *slot_val;
    size_t n_slots, count;
    struct {
        size_t off, len;
    } * keys;
    size_t n_keys, cap_keys;
    char *arena;
    size_t arena_len, arena_cap;
} ddp__bytemap_t;

/* FNV-1a of p[0, n), its high bits folded in. */
uint64_t ddp__hash_bytes(const void *p, size_t n);
/* An empty map sized for about `expect` keys. Returns 0 or DDP_ENOMEM (free it still). */
int ddp__bytemap_init(ddp__bytemap_t *m, size_t expect);
/* Releases everything; the map is zeroed. */
void ddp__bytemap_free(ddp__bytemap_t *m);
/* Key number k's bytes (k: a slot_key value, from 1) and length. */
static inline const char *ddp__bytemap_key(const ddp__bytemap_t *m, uint32_t k, size_t *len)
{
    *len = m->keys[k - 1].len;
    return m->arena + m->keys[k - 1].off;
}
/* The value of key[0, len), or DDP__BYTEMAP_NONE. */
uint32_t ddp__bytemap_get(const ddp__bytemap_t *m, const void *key, size_t len);
/* Inserts or overwrites key -> val. Returns 0 or DDP_ENOMEM. */
int ddp__bytemap_put(ddp__bytemap_t *m, const void *key, size_t len, uint32_t val);

#endif
