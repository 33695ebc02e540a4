/* The rendezvous hello and rank 0's check of it (see rdzv_hello.h). The bytes are copied
 * into a struct before any field is read: a socket buffer has no alignment to rely on.
 */
#include "collectives/rdzv_hello.h"

#include <stdio.h>
#include <string.h>

#include "collectives/net.h"

void ddp__rdzv_hello_make(ddp__rdzv_hello_t *h, int rank, int size, uint64_t generation,
                          const char *token)
{
    memset(h, 0, sizeof *h);
    memcpy(h->magic, DDP_RDZV_HELLO_MAGIC, sizeof h->magic);
    h->rank = (uint32_t)rank;
    h->size = (uint32_t)size;
    h->generation = generation;
    snprintf(h->token, sizeof h->token, "%s", token ? token : "");
}

int ddp__rdzv_hello_check(const void *bytes, size_t len, const ddp__rdzv_expect_t *e,
                          ddp__rdzv_verdict_t *v)
{
    ddp__rdzv_hello_t h;
    memset(&h, 0, sizeof h);
    memcpy(&h, bytes, len < sizeof h ? len : sizeof h);
    *v = (ddp__rdzv_verdict_t){.rank = 0};
    if (len >= offsetof(ddp__rdzv_hello_t, size)) v->claimed_rank = h.rank;
    if (len >= offsetof(ddp__rdzv_hello_t, token)) v->claimed_generation = h.generation;
    if (len >= sizeof h.magic && memcmp(h.magic, DDP_RDZV_HELLO_MAGIC, sizeof h.magic) != 0)
        v->why = "not a ddpd rendezvous hello (garbage bytes)";
    else if (len < sizeof h)
        return 0; /* wait for the rest */
    else if (len > sizeof h)
        v->why = "more bytes than a hello";
    else if (!ddp__net_token_eq(h.token, e->token, sizeof h.token))
        v->why = "wrong job token";
    else if (h.generation != e->generation)
        v->why = "wrong generation";
    else if ((int64_t)h.size != (int64_t)e->size)
        v->why = "wrong world size";
    else if (h.rank < 1 || (int64_t)h.rank >= (int64_t)e->size)
        v->why = "rank out of range";
    else if (e->fds && e->fds[h.rank] >= 0)
        v->why = "rank already joined";
    v->rank = v->why ? -1 : (int)h.rank;
    return v->rank;
}
