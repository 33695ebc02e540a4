/* Internals of the ring backend shared by ring.c (algorithms), ring_setup.c (links from a
 * bootstrap) and transport_fake.c (links between threads). Never included outside collectives/.
 */
#ifndef DDP_COLLECTIVES_RING_H
#define DDP_COLLECTIVES_RING_H

#include "collectives/coll_impl.h"
#include "collectives/transport.h"

typedef struct ddp__ring {
    ddp__engine_t *eng;
    ddp__xport_t *send, *recv; /* to the next rank, from the previous one; NULL for size 1 */
    size_t slot_bytes;
    int delay_us;   /* test hook: sleep before each chunk sent */
    int culprit;    /* rank blamed for the failure, -1 none (comm thread) */
    int dead[2];    /* peer gone on [send, recv] link (comm thread) */
    int grace;      /* the current operation's deadline was extended once */
    int all_local;  /* every rank on this host and shared memory allowed (shm_direct.c) */
    char shm_prefix[64];          /* names of this communicator's shared segments */
    struct ddp__direct *direct;   /* control pages once memory is shared; NULL before */
} ddp__ring_t;

/* Default slot geometry: DDP_COLL_CHUNK_KB (or opts->chunk_bytes) and the slot count. */
size_t ddp__ring_slot_bytes(const ddp_coll_opts_t *opts);
#define DDP__RING_NSLOTS 8
/* How long the comm thread polls (yielding the core) before it sleeps on a link or a peer. */
#define DDP__SPIN_NS 50000LL

/* ops->init of the ring: listeners, address allgather, links to the neighbours. */
int ddp__ring_init(ddp_coll_t *c, ddp_coll_bootstrap_t *bs, const ddp_coll_opts_t *opts,
                   ddp_errinfo_t *ei);
/* Takes ownership of the links (NULL, NULL for a world of one) and starts the comm thread.
 * On failure the links are still the caller's. */
int ddp__ring_start(ddp_coll_t *c, ddp__xport_t *send, ddp__xport_t *recv,
                    const ddp_coll_opts_t *opts, size_t slot_bytes);

/* Comm thread, without blocking: handles news on the links (abort notes, hangups). A hung-up link
 * is remembered in R->dead; with fail_on_hangup it is named as the failure. Returns 0 or the
 * error in force. */
int ddp__ring_check_links(ddp__ring_t *R, ddp_coll_t *c, ddp_coll_req_t *q, int fail_on_hangup);

/* shm_direct.c: ops->mem_map/mem_unmap of the ring, the single-pass all-reduce, reduce-scatter and
 * all-gather over shared memory (q->impl is the ddp__mem_t holding q->buf; a barrier is one
 * synchronisation), and the release of the control pages. */
int ddp__direct_mem_map(ddp_coll_t *c, ddp__mem_t *m, ddp_errinfo_t *ei);
void ddp__direct_mem_unmap(ddp_coll_t *c, ddp__mem_t *m);
int ddp__direct_run(ddp__ring_t *R, ddp_coll_t *c, ddp_coll_req_t *q, int64_t deadline);
void ddp__direct_free(ddp__ring_t *R, int size);

#endif
