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
    _Atomic int culprit; /* rank blamed for the failure, in the world's numbering
                          * (ddp__world_rank), -1 none; the comm thread writes it, an abort
                          * from another thread reads it */
    int dead[2];    /* peer gone on [send, recv] link (comm thread) */
    int grace;      /* the current operation's deadline was extended once */
    int all_local;  /* every rank on this host and shared memory allowed (shm_direct.c) */
    char shm_prefix[64];          /* names of this communicator's shared segments */
    struct ddp__direct *direct;   /* control pages once memory is shared; NULL before */
    struct ddp__hier *hier;       /* the two-level all-reduce's sub-communicators (hier.c);
                                   * NULL: every operation runs on this ring */
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

/* hier.c: the two-level all-reduce (coll.h). ddp__hier_start decides from every rank's host
 * id (ids: size strings `stride` bytes apart, as the ring's setup allgathered them) whether c
 * runs its all-reduce, reduce-scatter and all-gather in two levels, and if so forms the two
 * sub-communicators from bs and sets R->hier and c->algo; collective (every rank decides alike).
 * ddp__hier_run runs one such operation on c's communication thread; ddp__hier_abort fails the
 * sub-communicators (any thread; culprit: the world rank blamed, -1 none); ddp__hier_free
 * releases them after c's thread has stopped (NULL-safe); ddp__hier_net_bytes sums their TCP
 * counters (NULL: 0). */
int ddp__hier_start(ddp_coll_t *c, ddp__ring_t *R, ddp_coll_bootstrap_t *bs,
                    const ddp_coll_opts_t *opts, const char *ids, size_t stride, int force_tcp,
                    ddp_errinfo_t *ei);
/* DDP_EINVAL naming the setting when opts.algo or DDP_COLL_ALGO is not an algorithm, else 0. */
int ddp__hier_check_algo(const ddp_coll_opts_t *opts, ddp_errinfo_t *ei);
int ddp__hier_run(struct ddp__hier *h, ddp_coll_t *c, ddp_coll_req_t *q);
void ddp__hier_abort(struct ddp__hier *h, ddp_coll_t *c, int culprit);
void ddp__hier_free(struct ddp__hier *h);
uint64_t ddp__hier_net_bytes(const struct ddp__hier *h);

#endif
