/* A bytes -> uint32 map for the tokenizer (see bytemap.h): open addressing with linear
 * probing, keys copied into one arena, the table kept at most half full.
 */
#include "worker/data/bytemap.h"

#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"

uint64_t ddp__hash_bytes(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

void ddp__bytemap_free(ddp__bytemap_t *m)
{
    free(m->slot_key);
    free(m->slot_val);
    free(m->keys);
    free(m->arena);
    memset(m, 0, sizeof *m);
}

int ddp__bytemap_init(ddp__bytemap_t *m, size_t expect)
{
    memset(m, 0, sizeof *m);
    size_t n = 64;
    while (n < expect * 2) n *= 2;
    m->n_slots = n;
    m->slot_key = ddp_calloc(n, sizeof *m->slot_key);
    m->slot_val = ddp_calloc(n, sizeof *m->slot_val);
    if (!m->slot_key || !m->slot_val) return DDP_ENOMEM;
    return 0;
}

/* The slot holding key, or the empty slot where it would go. */
static size_t bytemap_slot(const ddp__bytemap_t *m, const void *key, size_t len)
{
    size_t mask = m->n_slots - 1, i = (size_t)ddp__hash_bytes(key, len) & mask;
    for (;; i = (i + 1) & mask) {
        uint32_t k = m->slot_key[i];
        if (!k) return i;
        if (m->keys[k - 1].len == len && memcmp(m->arena + m->keys[k - 1].off, key, len) == 0)
            return i;
    }
}

uint32_t ddp__bytemap_get(const ddp__bytemap_t *m, const void *key, size_t len)
{
    size_t i = bytemap_slot(m, key, len);
    return m->slot_key[i] ? m->slot_val[i] : DDP__BYTEMAP_NONE;
}

static int bytemap_grow(ddp__bytemap_t *m)
{
    ddp__bytemap_t old = *m;
    size_t n = m->n_slots * 2;
    m->slot_key = ddp_calloc(n, sizeof *m->slot_key);
    m->slot_val = ddp_calloc(n, sizeof *m->slot_val);
    if (!m->slot_key || !m->slot_val) {
        free(m->slot_key);
        free(m->slot_val);
        m->slot_key = old.slot_key;
        m->slot_val = old.slot_val;
        return DDP_ENOMEM;
    }
    m->n_slots = n;
    for (size_t i = 0; i < old.n_slots; i++) {
        if (!old.slot_key[i]) continue;
        size_t kl;
        const char *kp = ddp__bytemap_key(m, old.slot_key[i], &kl);
        size_t j = bytemap_slot(m, kp, kl);
        m->slot_key[j] = old.slot_key[i];
        m->slot_val[j] = old.slot_val[i];
    }
    free(old.slot_key);
    free(old.slot_val);
    return 0;
}

/* Inserts or overwrites key -> val. */
int ddp__bytemap_put(ddp__bytemap_t *m, const void *key, size_t len, uint32_t val)
{
    size_t i = bytemap_slot(m, key, len);
    if (m->slot_key[i]) {
        m->slot_val[i] = val;
        return 0;
    }
    if ((m->count + 1) * 2 > m->n_slots) {
        DDP_CHECK(bytemap_grow(m));
        i = bytemap_slot(m, key, len);
    }
    if (m->n_keys == m->cap_keys) {
        size_t c = m->cap_keys ? m->cap_keys * 2 : 256;
        void *k = ddp_realloc(m->keys, c * sizeof *m->keys);
        if (!k) return DDP_ENOMEM;
        m->keys = k;
        m->cap_keys = c;
    }
    if (m->arena_len + len > m->arena_cap) {
        size_t c = m->arena_cap ? m->arena_cap : 4096;
        while (c < m->arena_len + len) c *= 2;
        char *a = ddp_realloc(m->arena, c);
        if (!a) return DDP_ENOMEM;
        m->arena = a;
        m->arena_cap = c;
    }
    memcpy(m->arena + m->arena_len, key, len);
    m->keys[m->n_keys].off = m->arena_len;
    m->keys[m->n_keys].len = len;
    m->arena_len += len;
    m->n_keys++;
    m->slot_key[i] = (uint32_t)m->n_keys;
    m->slot_val[i] = val;
    m->count++;
    return 0;
}
