/* The ring backend's fast path on one host: collective memory shared by every rank, and a
 * single-pass all-reduce over it.
 *
 * Memory (ddp_coll_mem_alloc on a communicator whose ranks all share this host): each rank creates
 * a POSIX shared-memory segment (shm_open, mode 0600, named after the communicator; its pages
 * reserved with posix_fallocate, so a full /dev/shm is an error now rather than a SIGBUS later),
 * everyone maps everyone's segment, and each rank unlinks its own name once all have mapped it, so
 * nothing outlives the processes (a crash inside that window can leave a name in /dev/shm). The
 * first allocation also maps one control page per rank the same way. When any rank cannot create
 * or map a segment (a small or separate /dev/shm, for example), all ranks agree by a vote to keep
 * the memory private, and operations take the ring's usual path.
 *
 * All-reduce of a buffer inside shared memory (the same offset on every rank):
 *   1. each rank publishes what it reduces and that its buffer is final (its control word), and
 *      waits for every other rank's;
 *   2. rank r sums slice r of the buffer from every rank's memory, in rank order, through a small
 *      cache-resident block, and writes the sum (scaled for an average) into every rank's memory;
 *   3. it publishes again and waits for everyone, so no rank reads its buffer before every slice
 *      has landed there.
 * Each element is read once and written once per rank: about half the memory traffic of the ring
 * through slots, and two synchronisations instead of 2 (n-1) messages. A reduce-scatter is the
 * same with step 2 writing into this rank's memory only; an all-gather's step 2 copies this
 * rank's slice from its memory into every other rank's. The summation order is
 * fixed (rank 0, 1, ...), so results are bitwise reproducible; for two ranks they equal the
 * ring's (addition commutes).
 *
 * Waiting spins (yielding the core) for a few microseconds, as ranks usually arrive close
 * together, then sleeps on a futex of the peer's control word with a short timeout, checking the
 * communicator's error, the deadline and the ring's links: a dead neighbour hangs up its Unix
 * socket, and aborts travel around the ring as link notes. A rank that never arrives is named.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <linux/futex.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "collectives/flight.h"
#include "collectives/ring.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

#define NAP_NS 2000000LL       /* futex sleeps are this short: links and deadline are checked */
#define BLOCK_BYTES (16 << 10) /* the cache-resident block a slice is summed through */

/* One rank's control page. `phase` counts the synchronisations this rank has passed; peers read
 * it and sleep on it. */
typedef struct {
    _Alignas(64) _Atomic uint32_t phase;
    _Atomic uint32_t sleepers;         /* peers in FUTEX_WAIT on phase */
    uint64_t mem_id, offset, count, kind; /* the operation this rank is in (checked by peers) */
} ctl_t;

typedef struct ddp__direct {
    ctl_t **ctl;    /* [size]: every rank's control page mapped here */
    uint32_t phase; /* comm thread: this rank's synchronisations so far */
    void *block;    /* BLOCK_BYTES, comm thread */
} ddp__direct_t;

static void seg_name(char *out, size_t len, const ddp__ring_t *R, int rank, const char *what)
{
    snprintf(out, len, "%s.r%d.%s", R->shm_prefix, rank, what);
}

static void *map_fd(int fd, size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Creates and maps this rank's segment `what`; NULL with a warning. */
static void *create_seg(const ddp__ring_t *R, int rank, const char *what, size_t bytes)
{
    char name[128];
    seg_name(name, sizeof name, R, rank, what);
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    /* reserve the pages now: a /dev/shm smaller than the buffer (containers often have 64 MB)
     * must fail here, not as SIGBUS on first touch */
    int err = fd < 0 ? errno : posix_fallocate(fd, 0, (off_t)bytes);
    void *p = err == 0 ? map_fd(fd, bytes) : NULL;
    if (!p) {
        DDP_WARN("collectives: cannot create shared memory %s (%zu bytes): %s; collective memory "
                 "stays private", name, bytes, strerror(err ? err : errno));
        if (fd >= 0) shm_unlink(name);
    }
    if (fd >= 0) close(fd);
    return p;
}

/* Maps rank's segment `what`, which must be `bytes` long; NULL with a warning. */
static void *open_seg(const ddp__ring_t *R, int rank, const char *what, size_t bytes)
{
    char name[128];
    seg_name(name, sizeof name, R, rank, what);
    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    struct stat st;
    void *p = NULL;
    if (fd >= 0 && fstat(fd, &st) == 0 && (size_t)st.st_size == bytes) p = map_fd(fd, bytes);
    if (!p)
        DDP_WARN("collectives: cannot map rank %d's shared memory %s (%s); collective memory stays "
                 "private", rank, name, fd < 0 ? strerror(errno) : "wrong size or mapping failed");
    if (fd >= 0) close(fd);
    return p;
}

static void unlink_seg(const ddp__ring_t *R, int rank, const char *what)
{
    char name[128];
    seg_name(name, sizeof name, R, rank, what);
    shm_unlink(name);
}

/* Unmaps a segment per rank (skipping `keep`, -1 none) and frees the array. */
static void unmap_all(void **at, int size, int keep, size_t bytes)
{
    if (!at) return;
    for (int q = 0; q < size; q++)
        if (q != keep && at[q]) munmap(at[q], bytes);
    free(at);
}

/* Every rank votes; 1 when all voted yes. */
static int all_agree(ddp_coll_t *c, int yes, int *agreed, ddp_errinfo_t *ei)
{
    float v = yes ? 1.0f : 0.0f;
    ddp_coll_req_t *req;
    DDP_CHECK(ddp_coll_allreduce(c, &v, 1, DDP_DT_F32, DDP_OP_SUM, &req));
    DDP_CHECK(ddp_coll_wait(req, 0, ei));
    *agreed = v == (float)c->size;
    return 0;
}

/* Creates this rank's segments (data, and on the first allocation the control page), votes,
 * maps everyone's, votes again, unlinks its names. On success *data (and *ctl when with_ctl) are
 * every rank's mappings; otherwise both are NULL and nothing stays mapped. */
static int share(ddp_coll_t *c, ddp__ring_t *R, size_t bytes, const char *what, int with_ctl,
                 void ***data, void ***ctl, ddp_errinfo_t *ei)
{
    const int n = c->size, me = c->rank;
    void **d = ddp_calloc((size_t)n, sizeof *d), **k = ddp_calloc((size_t)n, sizeof *k);
    int ok = d && k && (d[me] = create_seg(R, me, what, bytes)) &&
             (!with_ctl || (k[me] = create_seg(R, me, "ctl", 4096)));
    int rc = all_agree(c, ok, &ok, ei);
    for (int q = 0; rc == 0 && ok && q < n; q++) {
        if (q == me) continue;
        if (!(d[q] = open_seg(R, q, what, bytes))) ok = 0;
        if (with_ctl && ok && !(k[q] = open_seg(R, q, "ctl", 4096))) ok = 0;
    }
    if (rc == 0 && ok) rc = all_agree(c, ok, &ok, ei);
    if (d && d[me]) unlink_seg(R, me, what);
    if (k && k[me]) unlink_seg(R, me, "ctl");
    if (rc == 0 && ok) {
        *data = d;
        *ctl = with_ctl ? k : NULL;
        if (!with_ctl) free(k);
        return 0;
    }
    unmap_all(d, n, -1, bytes);
    unmap_all(k, n, -1, 4096);
    *data = *ctl = NULL;
    return rc;
}

int ddp__direct_mem_map(ddp_coll_t *c, ddp__mem_t *m, ddp_errinfo_t *ei)
{
    ddp__ring_t *R = c->impl;
    const int first = m->id == 0;
    if (!R->all_local || (!first && !R->direct)) return 0; /* plain memory */
    char what[32];
    snprintf(what, sizeof what, "m%llu", (unsigned long long)m->id);
    void **data, **ctl;
    DDP_CHECK(share(c, R, m->map_bytes, what, first, &data, &ctl, ei));
    if (!data) return 0; /* plain memory */
    if (first) {
        ddp__direct_t *d = ddp_calloc(1, sizeof *d);
        void *block = ddp_aligned_alloc(64, BLOCK_BYTES);
        if (!d || !block) {
            free(d);
            free(block);
            unmap_all(data, c->size, -1, m->map_bytes);
            unmap_all(ctl, c->size, -1, 4096);
            return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
        }
        d->ctl = (ctl_t **)ctl;
        d->block = block;
        R->direct = d;
    }
    m->base = data[c->rank];
    m->peer = (char **)data;
    return 0;
}

void ddp__direct_mem_unmap(ddp_coll_t *c, ddp__mem_t *m)
{
    if (m->peer) unmap_all((void **)m->peer, c->size, c->rank, m->map_bytes); /* not m->base */
    m->peer = NULL;
}

void ddp__direct_free(ddp__ring_t *R, int size)
{
    ddp__direct_t *d = R->direct;
    if (!d) return;
    unmap_all((void **)d->ctl, size, -1, 4096);
    free(d->block);
    free(d);
    R->direct = NULL;
}

/* ---- synchronisation ------------------------------------------------------------------------ */

static int reached(ctl_t *p, uint32_t phase)
{
    return (int32_t)(atomic_load(&p->phase) - phase) >= 0;
}

static void publish(ctl_t *me, uint32_t phase)
{
    atomic_store(&me->phase, phase);
    if (atomic_load(&me->sleepers))
        syscall(SYS_futex, &me->phase, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Waits until rank `peer` has passed `phase`. */
static int wait_for(ddp__ring_t *R, ddp_coll_t *c, ddp_coll_req_t *q, int peer, uint32_t phase,
                    int64_t deadline)
{
    ctl_t *p = R->direct->ctl[peer];
    int64_t spin_end = ddp_now_ns() + DDP__SPIN_NS;
    /* yield, not pause: the rank awaited may be runnable on this very core */
    while (!reached(p, phase) && ddp_now_ns() < spin_end) sched_yield();
    const int who = ddp__world_rank(c, peer); /* as ring.c names ranks */
    atomic_store(&c->waiting_on, who);
    if (q) ddp_flight_waiting(q->flight, who);
    while (!reached(p, phase)) {
        DDP_CHECK(ddp__ring_check_links(R, c, q, 0));
        if (R->dead[0] || R->dead[1]) {
            /* a neighbour left; fine only if everything it owed us had arrived */
            if (reached(p, phase)) break;
            return ddp__ring_check_links(R, c, q, 1);
        }
        if (ddp_now_ns() >= deadline) {
            char d[96];
            R->culprit = who;
            return ddp__coll_fail(c, DDP_ETIMEDOUT, "%s: rank %d did not arrive within %.1f s",
                                  ddp__req_desc(q, d, sizeof d), who,
                                  (double)(ddp_now_ns() - q->t_start) * 1e-9);
        }
        atomic_fetch_add(&p->sleepers, 1);
        uint32_t v = atomic_load(&p->phase);
        if ((int32_t)(v - phase) < 0) {
            struct timespec ts = {0, NAP_NS};
            syscall(SYS_futex, &p->phase, FUTEX_WAIT, v, &ts, NULL, 0);
        }
        atomic_fetch_sub(&p->sleepers, 1);
    }
    return 0;
}

/* Passes one synchronisation: publishes this rank's arrival and waits for everyone's. */
static int sync_all(ddp__ring_t *R, ddp_coll_t *c, ddp_coll_req_t *q, int64_t deadline)
{
    ddp__direct_t *d = R->direct;
    uint32_t phase = ++d->phase;
    publish(d->ctl[c->rank], phase);
    for (int k = 1; k < c->size; k++)
        DDP_CHECK(wait_for(R, c, q, (c->rank + k) % c->size, phase, deadline));
    return 0;
}

/* ---- the operations ------------------------------------------------------------------------ */

/* All-reduce, reduce-scatter and all-gather of a buffer in shared memory (q->kind). */
int ddp__direct_run(ddp__ring_t *R, ddp_coll_t *c, ddp_coll_req_t *q, int64_t deadline)
{
    if (q->barrier) return sync_all(R, c, q, deadline);
    ddp__direct_t *d = R->direct;
    const ddp__mem_t *m = q->impl;
    const int n = c->size;
    const size_t es = ddp_dtype_size(q->dt), off = (size_t)((char *)q->buf - m->base);
    ctl_t *me = d->ctl[c->rank];
    me->mem_id = m->id;
    me->offset = off;
    me->count = q->count;
    me->kind = ((uint64_t)q->kind << 8) | (uint64_t)q->dt;
    DDP_CHECK(sync_all(R, c, q, deadline));
    for (int p = 0; p < n; p++) {
        const ctl_t *o = d->ctl[p];
        if (o->mem_id != m->id || o->offset != off || o->count != q->count ||
            o->kind != me->kind) {
            char dd[96];
            const int who = ddp__world_rank(c, p), self = ddp__world_rank(c, c->rank);
            R->culprit = who;
            return ddp__coll_fail(c, DDP_EPROTO, "%s: rank %d runs operation %llu on %llu elements "
                                  "at offset %llu of shared allocation %llu, rank %d %llu on %zu "
                                  "at %zu of %llu", ddp__req_desc(q, dd, sizeof dd), who,
                                  (unsigned long long)o->kind, (unsigned long long)o->count,
                                  (unsigned long long)o->offset, (unsigned long long)o->mem_id,
                                  self, (unsigned long long)me->kind, q->count, off,
                                  (unsigned long long)m->id);
        }
    }
    /* slice boundaries on DDP_COLL_SLICE_ELEMS elements: no two ranks write the same cache line */
    size_t lo, hi;
    ddp_coll_slice(q->count, n, c->rank, &lo, &hi);
    const size_t blk = BLOCK_BYTES / es;
    if (q->kind == DDP__REQ_ALLGATHER) {
        for (int p = 0; p < n; p++)
            if (p != c->rank && hi > lo)
                memcpy(m->peer[p] + off + lo * es, m->base + off + lo * es, (hi - lo) * es);
        return sync_all(R, c, q, deadline);
    }
    /* an all-reduce writes the sum into every rank's memory, a reduce-scatter into this one's */
    const int first = q->kind == DDP__REQ_ALLREDUCE ? 0 : c->rank;
    const int last = q->kind == DDP__REQ_ALLREDUCE ? n - 1 : c->rank;
    const float scale = q->op == DDP_OP_AVG ? 1.0f / (float)(q->avg_n ? q->avg_n : n) : 1.0f;
    for (size_t i = lo; i < hi; i += blk) {
        size_t len = hi - i < blk ? hi - i : blk;
        size_t at = off + i * es;
        ddp__reduce(q->dt, d->block, NULL, m->peer[0] + at, m->peer[1] + at, len,
                    n == 2 ? scale : 1.0f);
        for (int p = 2; p < n; p++)
            ddp__reduce(q->dt, d->block, NULL, m->peer[p] + at, d->block, len,
                        p == n - 1 ? scale : 1.0f);
        for (int p = first; p <= last; p++) memcpy(m->peer[p] + at, d->block, len * es);
    }
    return sync_all(R, c, q, deadline);
}
