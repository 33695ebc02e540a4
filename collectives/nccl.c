/* The nccl backend (GPU), built as the module ddp_coll_nccl.so and dlopen()ed by coll.c, so one
 * binary runs with and without CUDA. Plain C against the CUDA runtime and NCCL headers.
 *
 * The same file is compiled a second time against a simulated CUDA runtime and NCCL
 * (tests/sim/, over tests/sim/simdev.h) into the tests' "sim" module ddp_coll_sim.so, so that
 * the tests run this code on the CPU: DDP_COLL_NCCL_OPS names the ops table then.
 *
 * Init: the device is opts.cuda_device (the caller's GPU, never a default 0); rank 0's
 * ncclUniqueId is allgathered through the bootstrap; ncclCommInitRankConfig with blocking = 0,
 * then ncclCommGetAsyncError is polled until the communicator is ready or the deadline passes.
 * The next generation's communicator, when it keeps some of the ranks of this one and adds none
 * (opts.parent), is this one shrunk instead: ncclCommShrink, no rendezvous, where every rank can
 * (one allgather of a flag decides it for all).
 * Operations are enqueued on the stream (opts.cuda_stream, or the backend's own) at submit;
 * completion is a CUDA event. Waits poll the event and ncclCommGetAsyncError with 50 us sleeps
 * (never a spin), and end the communicator on an NCCL error or an expired deadline: revoked
 * (NCCL >= 2.28: in-flight operations stop, and it stays to be shrunk) or else aborted. NCCL
 * cannot say which rank is missing: the message names the operation and the rank set.
 *
 * Invariants
 * - Ordering: an operation runs after the work that ddp_coll_wait_event() named (a
 *   cudaStreamWaitEvent on this backend's stream); nothing else orders it after the caller's
 *   compute stream.
 * - Host buffers: NCCL reads and writes device memory only. A buffer that is not device memory
 *   of this communicator's device (a host float on the stack, a header struct, a small table)
 *   is staged: copied into pinned memory and then device memory at submit, reduced there, and
 *   copied back into the caller's buffer when the request is seen complete (test/wait). Staged
 *   requests share a grow-only staging area of STAGE_MAX bytes at most; a larger host buffer is
 *   refused (DDP_EINVAL). So every small collective of the trainer works unchanged.
 * - Kinds: all-reduce, broadcast (a transfer to some ranks is a broadcast in chunks, see
 *   enqueue_op), and in-place reduce-scatter and all-gather over ddp_coll_slice's slices:
 *   ncclReduceScatter / ncclAllGather where the slices are equal, else a group of one
 *   ncclReduce / ncclBroadcast per rank's slice (NCCL has no uneven variants).
 * - Abort from any thread: every call that uses the NCCL communicator holds m->lock, and
 *   ncclCommAbort runs under it too, so no thread is inside ncclCommGetAsyncError or
 *   ncclAllReduce when the communicator is freed; afterwards m->comm is NULL and every path
 *   checks it (and m->revoked, which retires it the same way without freeing it). Calls on a
 *   nonblocking communicator return at once, so the lock is held briefly.
 * - Teardown has a deadline: ncclCommFinalize, then ncclCommGetAsyncError is polled until it
 *   completes or max(timeout floor) passes; on expiry or error the communicator is aborted
 *   instead (a dead peer never lets a finalize or a destroy finish).
 * - Every CUDA call's result is checked; a failure fails the request or the communicator.
 *
 * This file must not depend on the rest of the collectives library (the module links only
 * common/): it records errors into struct ddp_coll itself, the same way coll.c does.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "collectives/coll_impl.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

#ifndef DDP_COLL_NCCL_OPS
#define DDP_COLL_NCCL_OPS ddp_coll_nccl_ops
#define DDP_COLL_NCCL_NAME "nccl"
#endif

#define STAGE_MAX ((size_t)64 << 20) /* bytes of host buffers in flight at once */
#define STAGE_ALIGN 256

typedef struct {
    pthread_mutex_t lock; /* guards comm (see the invariants) */
    ncclComm_t comm;      /* NULL once aborted or destroyed */
    int device;
    cudaStream_t stream;
    int own_stream;
    /* staging of host buffers: pinned host and device memory of `stage_cap` bytes each */
    void *stage_host, *stage_dev;
    size_t stage_cap, stage_used;
    int staged_inflight; /* staged requests not yet completed; the area resets at 0 */
    void *relay;         /* RELAY_BYTES of device memory: a transfer's chunks, on the ranks
                          * that only pass them on (ddp_coll_transfer) */
    int revoked;         /* comm was revoked after a failure: kept only to be shrunk */
} nccl_impl_t;

#define RELAY_BYTES ((size_t)4 << 20)

/* A request's backend state. */
typedef struct {
    cudaEvent_t ev;
    void *host;   /* the caller's buffer when staged, else NULL */
    size_t off;   /* its place in the staging area */
} nccl_req_t;

/* NCCL >= 2.28 can revoke a failed communicator (its operations stop, the communicator stays)
 * and shrink it into the next generation's without a new rendezvous. The two are declared weak
 * so that the module still loads on an older libnccl at run time, where they resolve to NULL and
 * every generation forms afresh. */
#if defined(DDP_SIM_NCCL)
static int can_revoke(void) { return 1; }
#elif NCCL_VERSION_CODE >= 22800
#pragma weak ncclCommRevoke
#pragma weak ncclCommShrink
static int can_revoke(void) { return ncclCommRevoke != NULL && ncclCommShrink != NULL; }
#else
static int can_revoke(void) { return 0; }
#define ncclCommRevoke(comm, flags) ncclInvalidUsage
#define ncclCommShrink(comm, ex, n, out, cfg, flags) ncclInvalidUsage
#define NCCL_SHRINK_DEFAULT 0
#define NCCL_SHRINK_ABORT 1
#endif

/* Aborts the NCCL communicator once, from any thread. */
static void abort_comm(nccl_impl_t *m)
{
    pthread_mutex_lock(&m->lock);
    if (m->comm) {
        ncclCommAbort(m->comm);
        m->comm = NULL;
    }
    pthread_mutex_unlock(&m->lock);
}

/* Ends the use of the NCCL communicator after a failure, once, from any thread: revoked where it
 * can be shrunk into the next generation's (ddp_coll_opts_t.parent), else aborted. */
static void stop_comm(nccl_impl_t *m)
{
    pthread_mutex_lock(&m->lock);
    if (m->comm && !m->revoked) {
        ncclResult_t r = can_revoke() ? ncclCommRevoke(m->comm, 0) : ncclInvalidUsage;
        if (r == ncclSuccess || r == ncclInProgress) {
            m->revoked = 1;
        } else {
            ncclCommAbort(m->comm);
            m->comm = NULL;
        }
    }
    pthread_mutex_unlock(&m->lock);
}

/* ddp__coll_fail's twin: this module is dlopen()ed and links nothing from the executable (any
 * program may load it, exported symbols or not), so it keeps the first error through the
 * header's ddp__coll_keep_first, and also aborts the NCCL communicator. Never called with
 * m->lock held. */
static int fail(ddp_coll_t *c, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(ddp_coll_t *c, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int first = ddp__coll_keep_first(c, rc, fmt, ap);
    va_end(ap);
    if (first) {
        DDP_ERROR("collectives (" DDP_COLL_NCCL_NAME ", rank %d of %d): %s", c->rank, c->size,
                  c->errmsg);
        if (c->impl) stop_comm(c->impl);
    }
    return atomic_load(&c->err);
}

static const char *desc(const ddp_coll_req_t *q, char *buf, size_t len)
{
    snprintf(buf, len, "%s #%llu (%zu bytes)",
             q->kind == DDP__REQ_BCAST ? "broadcast" : "allreduce", (unsigned long long)q->seq,
             q->bytes);
    return buf;
}

/* Local copies of coll.c's deadline helpers: the module must not need symbols of the executable. */
static int64_t auto_timeout_ns(ddp_coll_t *c, size_t bytes)
{
    uint64_t bits = atomic_load(&c->bw_bits);
    double bw;
    memcpy(&bw, &bits, sizeof bw);
    if (bw <= 0) bw = 1e9; /* before any measurement */
    double t = 8.0 * (double)bytes / bw;
    if (t < c->timeout_s) t = c->timeout_s;
    return (int64_t)(t * 1e9);
}

static void note_bw(ddp_coll_t *c, size_t bytes, int64_t ns)
{
    if (bytes < (1u << 20) || ns <= 0) return;
    double bw = (double)bytes / ((double)ns * 1e-9);
    uint64_t bits;
    memcpy(&bits, &bw, sizeof bits);
    atomic_store(&c->bw_bits, bits);
}

static void nap(void)
{
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
}

static int nccl_probe(void)
{
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0 ? 20 : 0;
}

/* The communicator's asynchronous state under the lock: ncclSuccess, ncclInProgress or an
 * error; *gone = 1 when it was aborted or revoked (by another thread, perhaps). */
static ncclResult_t async_state(nccl_impl_t *m, int *gone, char *last, size_t len)
{
    ncclResult_t st = ncclSuccess;
    pthread_mutex_lock(&m->lock);
    *gone = m->comm == NULL || m->revoked;
    if (!*gone) {
        ncclResult_t r = ncclCommGetAsyncError(m->comm, &st);
        if (r != ncclSuccess) st = r;
        if (st != ncclSuccess && st != ncclInProgress && last)
            snprintf(last, len, "%s", ncclGetLastError(m->comm));
    }
    pthread_mutex_unlock(&m->lock);
    return st;
}

/* Polls the communicator until it is no longer in progress. */
static int settle(ddp_coll_t *c, nccl_impl_t *m, int64_t deadline, const char *what)
{
    for (;;) {
        int gone;
        char last[256] = "";
        ncclResult_t st = async_state(m, &gone, last, sizeof last);
        if (gone) return atomic_load(&c->err) ? atomic_load(&c->err) : DDP_EABORTED;
        if (st == ncclSuccess) return 0;
        if (st != ncclInProgress)
            return fail(c, DDP_ENCCL, "%s: %s (%s)", what, ncclGetErrorString(st), last);
        if (ddp_now_ns() > deadline)
            return fail(c, DDP_ETIMEDOUT, "%s: not complete within the deadline (ranks 0..%d)",
                        what, c->size - 1);
        nap();
    }
}

static void release_impl(nccl_impl_t *m)
{
    if (m->stage_host) cudaFreeHost(m->stage_host);
    if (m->stage_dev) cudaFree(m->stage_dev);
    if (m->relay) cudaFree(m->relay);
    if (m->own_stream) cudaStreamDestroy(m->stream);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

/* Whether this rank can form the new communicator by shrinking o->parent (ddp_coll_opts_t): the
 * library can, the parent is this backend's, still there and quiescent (a revoked one settles
 * once its operations have stopped), and the new ranks are some of its ranks in their order, this
 * one among them. */
static int can_shrink(const ddp_coll_t *c, const ddp_coll_bootstrap_t *bs,
                      const ddp_coll_opts_t *o)
{
    const ddp_coll_t *p = o->parent;
    const int *pr = o->parent_ranks;
    if (!p || p->ops != c->ops || !p->shrinks || !p->impl || bs->size >= p->size ||
        pr[bs->rank] != p->rank)
        return 0;
    for (int r = 0; r < bs->size; r++)
        if (pr[r] < 0 || pr[r] >= p->size || (r > 0 && pr[r] <= pr[r - 1])) return 0;
    nccl_impl_t *pm = p->impl;
    int64_t deadline = ddp_now_ns() + (int64_t)(c->timeout_s * 1e9);
    for (;;) {
        ncclResult_t st = ncclInternalError;
        pthread_mutex_lock(&pm->lock);
        if (pm->comm && ncclCommGetAsyncError(pm->comm, &st) != ncclSuccess) st = ncclInternalError;
        pthread_mutex_unlock(&pm->lock);
        if (st == ncclSuccess) return 1;
        if (st != ncclInProgress || ddp_now_ns() > deadline) return 0;
        nap();
    }
}

/* Starts the shrink of o->parent into *out, leaving out the parent ranks that o->parent_ranks
 * does not name (NCCL numbers the rest in order, as the new ranks are). */
static ncclResult_t shrink_parent(const ddp_coll_bootstrap_t *bs, const ddp_coll_opts_t *o,
                                  ncclConfig_t *cfg, ncclComm_t *out)
{
    const ddp_coll_t *p = o->parent;
    nccl_impl_t *pm = p->impl;
    int n = p->size - bs->size, k = 0;
    int *excluded = ddp_malloc((size_t)n * sizeof *excluded);
    if (!excluded) return ncclSystemError;
    for (int q = 0, r = 0; q < p->size; q++) {
        if (r < bs->size && o->parent_ranks[r] == q)
            r++;
        else
            excluded[k++] = q;
    }
    pthread_mutex_lock(&pm->lock);
    ncclResult_t res = pm->comm ? ncclCommShrink(pm->comm, excluded, n, out, cfg,
                                                 pm->revoked ? NCCL_SHRINK_DEFAULT
                                                             : NCCL_SHRINK_ABORT)
                                : ncclInvalidUsage;
    pthread_mutex_unlock(&pm->lock);
    free(excluded);
    return res;
}

/* Whether every rank can shrink the parent (one allgather of a flag); 0 without parent_ranks,
 * which every rank gives or none. */
static int all_shrink(ddp_coll_t *c, ddp_coll_bootstrap_t *bs, const ddp_coll_opts_t *o,
                      int64_t deadline, ddp_errinfo_t *ei)
{
    if (!o || !o->parent_ranks) return 0;
    int32_t mine = can_shrink(c, bs, o), *all = ddp_malloc(sizeof mine * (size_t)bs->size);
    if (!all) return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    int rc = bs->ops->allgather(bs, &mine, sizeof mine, all, deadline, ei);
    for (int r = 0; rc == 0 && r < bs->size; r++) mine &= all[r];
    free(all);
    return rc < 0 ? rc : mine;
}

/* Rank 0's ncclUniqueId, allgathered through the bootstrap. */
static int unique_id(ddp_coll_bootstrap_t *bs, ncclUniqueId *id, int64_t deadline,
                     ddp_errinfo_t *ei)
{
    memset(id, 0, sizeof *id);
    if (bs->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(id);
        if (r != ncclSuccess)
            return ddp_errinfo_set(ei, DDP_ENCCL, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    }
    ncclUniqueId *all = ddp_malloc(sizeof *id * (size_t)bs->size);
    if (!all) return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    int rc = bs->ops->allgather(bs, id, sizeof *id, all, deadline, ei);
    if (rc == 0) *id = all[0];
    free(all);
    return rc < 0 ? rc : 0;
}

static int nccl_init(ddp_coll_t *c, ddp_coll_bootstrap_t *bs, const ddp_coll_opts_t *opts,
                     ddp_errinfo_t *ei)
{
    int dev = opts ? opts->cuda_device : 0;
    cudaError_t ce = cudaSetDevice(dev);
    if (ce != cudaSuccess)
        return ddp_errinfo_set(ei, DDP_ECUDA, "cudaSetDevice(%d): %s", dev, cudaGetErrorString(ce));
    int64_t deadline = ddp_now_ns() + (int64_t)(c->timeout_s * 2e9);
    ncclUniqueId id;
    int shrink = all_shrink(c, bs, opts, deadline, ei);
    int rc = shrink < 0 ? shrink : shrink ? 0 : unique_id(bs, &id, deadline, ei);
    if (rc < 0) return rc;
    nccl_impl_t *m = ddp_calloc(1, sizeof *m);
    if (!m) return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    pthread_mutex_init(&m->lock, NULL);
    m->device = dev;
    if (opts && opts->cuda_stream) {
        m->stream = (cudaStream_t)opts->cuda_stream;
    } else {
        ce = cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking);
        if (ce != cudaSuccess) {
            release_impl(m);
            return ddp_errinfo_set(ei, DDP_ECUDA, "cudaStreamCreate: %s", cudaGetErrorString(ce));
        }
        m->own_stream = 1;
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    c->impl = m;
    ncclComm_t comm = NULL;
    const char *how = shrink ? "ncclCommShrink" : "ncclCommInitRankConfig";
    ncclResult_t r = shrink ? shrink_parent(bs, opts, &cfg, &comm)
                            : ncclCommInitRankConfig(&comm, bs->size, id, bs->rank, &cfg);
    m->comm = comm;
    if (r != ncclSuccess && r != ncclInProgress) {
        rc = ddp_errinfo_set(ei, DDP_ENCCL, "%s: %s", how, ncclGetErrorString(r));
    } else {
        rc = settle(c, m, deadline, how);
        if (rc < 0) ddp_errinfo_set(ei, rc, "%s", c->errmsg);
    }
    if (rc < 0) {
        abort_comm(m);
        release_impl(m);
        c->impl = NULL;
        return rc;
    }
    if (shrink) abort_comm(opts->parent->impl); /* it lives on as this one */
    c->transport = "nccl";
    c->shrunk = shrink;
    c->shrinks = can_revoke();
    return 0;
}

/* Where p lies: 1 device memory of m's device (what NCCL may be given), 0 host memory (to be
 * staged), -1 device memory of another device (refused: neither usable nor readable here),
 * with that device in *other. */
static int on_device(nccl_impl_t *m, const void *p, size_t bytes, int *other)
{
    if (!bytes) return 1;
    struct cudaPointerAttributes a;
    memset(&a, 0, sizeof a);
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError(); /* plain host memory on old runtimes: not sticky */
        return 0;
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) return 0;
    *other = a.device;
    return a.device == m->device ? 1 : -1;
}

/* Reserves `bytes` of the staging area for a host buffer; DDP_EINVAL when it cannot hold them. */
static int stage_reserve(ddp_coll_t *c, nccl_impl_t *m, size_t bytes, size_t *off)
{
    size_t need = (bytes + STAGE_ALIGN - 1) / STAGE_ALIGN * STAGE_ALIGN;
    if (m->staged_inflight == 0) m->stage_used = 0;
    if (m->stage_used + need > STAGE_MAX)
        return DDP_EINVAL; /* the caller's buffer must be device memory */
    if (m->stage_used + need > m->stage_cap) {
        if (m->staged_inflight) return DDP_EINVAL; /* cannot move the area under requests */
        size_t cap = m->stage_cap ? m->stage_cap : 65536;
        while (cap < need) cap *= 2;
        if (cap > STAGE_MAX) cap = STAGE_MAX;
        if (m->stage_host) cudaFreeHost(m->stage_host);
        if (m->stage_dev) cudaFree(m->stage_dev);
        m->stage_host = m->stage_dev = NULL;
        m->stage_cap = 0;
        cudaError_t e = cudaSetDevice(m->device); /* the caller's thread may be elsewhere */
        if (e == cudaSuccess) e = cudaMallocHost(&m->stage_host, cap);
        if (e == cudaSuccess) e = cudaMalloc(&m->stage_dev, cap);
        if (e != cudaSuccess) {
            fail(c, DDP_ECUDA, "staging area of %zu bytes: %s", cap, cudaGetErrorString(e));
            return DDP_ECUDA;
        }
        m->stage_cap = cap;
    }
    *off = m->stage_used;
    m->stage_used += need;
    return 0;
}

/* Queues q's reduce-scatter or all-gather on buf (device memory); under m->lock. */
static ncclResult_t enqueue_slices(ddp_coll_t *c, nccl_impl_t *m, ddp_coll_req_t *q, void *buf)
{
    ncclDataType_t t = q->dt == DDP_DT_F32 ? ncclFloat32 : ncclBfloat16;
    ncclRedOp_t op = q->op == DDP_OP_AVG ? ncclAvg : ncclSum;
    size_t es = ddp_dtype_size(q->dt), lo, hi;
    int scatter = q->kind == DDP__REQ_REDUCE_SCATTER;
    ddp_coll_slice(q->count, c->size, 0, &lo, &hi);
    if (hi * (size_t)c->size == q->count) { /* equal slices: in place as NCCL defines it */
        char *mine = (char *)buf + (size_t)c->rank * hi * es;
        return scatter ? ncclReduceScatter(buf, mine, hi, t, op, m->comm, m->stream)
                       : ncclAllGather(mine, buf, hi, t, m->comm, m->stream);
    }
    ncclResult_t r = ncclGroupStart();
    for (int q_rank = 0; r == ncclSuccess && q_rank < c->size; q_rank++) {
        ddp_coll_slice(q->count, c->size, q_rank, &lo, &hi);
        char *p = (char *)buf + lo * es;
        if (hi > lo)
            r = scatter ? ncclReduce(p, p, hi - lo, t, op, q_rank, m->comm, m->stream)
                        : ncclBroadcast(p, p, hi - lo, t, q_rank, m->comm, m->stream);
    }
    ncclResult_t e = ncclGroupEnd();
    return r != ncclSuccess ? r : e;
}

/* Queues the NCCL call of q on buf (device memory); under m->lock. */
static ncclResult_t enqueue_op(ddp_coll_t *c, nccl_impl_t *m, ddp_coll_req_t *q, void *buf)
{
    if (q->kind == DDP__REQ_REDUCE_SCATTER || q->kind == DDP__REQ_ALLGATHER)
        return enqueue_slices(c, m, q, buf);
    if (q->kind == DDP__REQ_BCAST && !q->partial)
        return ncclBroadcast(buf, buf, q->bytes, ncclUint8, q->root, m->comm, m->stream);
    if (q->kind == DDP__REQ_BCAST) {
        /* a transfer to some ranks: NCCL has no relay that skips a rank's buffer, so every rank
         * takes part in broadcasts of RELAY_BYTES chunks (one group) and a rank that does not
         * keep the data receives it into its relay buffer. */
        ncclResult_t r = ncclGroupStart();
        for (size_t off = 0; r == ncclSuccess && off < q->bytes; off += RELAY_BYTES) {
            size_t n = q->bytes - off < RELAY_BYTES ? q->bytes - off : RELAY_BYTES;
            char *p = (q->keep || c->rank == q->root) ? (char *)buf + off : m->relay;
            r = ncclBroadcast(p, p, n, ncclUint8, q->root, m->comm, m->stream);
        }
        ncclResult_t e = ncclGroupEnd();
        return r != ncclSuccess ? r : e;
    }
    return ncclAllReduce(buf, buf, q->count, q->dt == DDP_DT_F32 ? ncclFloat32 : ncclBfloat16,
                         q->op == DDP_OP_AVG ? ncclAvg : ncclSum, m->comm, m->stream);
}

static int nccl_submit(ddp_coll_t *c, ddp_coll_req_t *q)
{
    nccl_impl_t *m = c->impl;
    char d[96];
    if (q->kind == DDP__REQ_BCAST && q->partial && !q->keep && c->rank != q->root && !m->relay) {
        cudaError_t e = cudaSetDevice(m->device); /* the caller's thread may be elsewhere */
        if (e == cudaSuccess) e = cudaMalloc(&m->relay, RELAY_BYTES);
        if (e != cudaSuccess) {
            m->relay = NULL;
            return fail(c, DDP_ECUDA, "relay buffer of %zu bytes: %s", RELAY_BYTES,
                        cudaGetErrorString(e));
        }
    }
    nccl_req_t *r = ddp_calloc(1, sizeof *r);
    if (!r) return DDP_ENOMEM;
    void *buf = q->buf;
    int passes_on = q->kind == DDP__REQ_BCAST && !q->keep && c->rank != q->root; /* no buf */
    int other = -1, where = passes_on ? 1 : on_device(m, q->buf, q->bytes, &other);
    if (where < 0) {
        DDP_ERROR("collectives (" DDP_COLL_NCCL_NAME "): %s: the buffer is memory of device %d, "
                  "the communicator's device is %d (opts.cuda_device)",
                  desc(q, d, sizeof d), other, m->device);
        free(r);
        return DDP_EINVAL;
    }
    if (where == 0) {
        int rc = stage_reserve(c, m, q->bytes, &r->off);
        if (rc < 0) {
            if (rc == DDP_EINVAL)
                DDP_ERROR("collectives (" DDP_COLL_NCCL_NAME "): %s: a host buffer of %zu bytes "
                          "(at most %zu are staged through device memory; pass device memory)",
                          desc(q, d, sizeof d), q->bytes, (size_t)STAGE_MAX);
            free(r);
            return rc;
        }
        r->host = q->buf;
        buf = (char *)m->stage_dev + r->off;
        memcpy((char *)m->stage_host + r->off, q->buf, q->bytes);
        cudaError_t e = cudaMemcpyAsync(buf, (char *)m->stage_host + r->off, q->bytes,
                                        cudaMemcpyHostToDevice, m->stream);
        if (e != cudaSuccess) {
            free(r);
            return fail(c, DDP_ECUDA, "%s: staging copy: %s", desc(q, d, sizeof d),
                        cudaGetErrorString(e));
        }
    }
    cudaError_t ce = cudaEventCreateWithFlags(&r->ev, cudaEventDisableTiming);
    if (ce != cudaSuccess) {
        free(r);
        return fail(c, DDP_ECUDA, "%s: cudaEventCreate: %s", desc(q, d, sizeof d),
                    cudaGetErrorString(ce));
    }
    char last[256] = "";
    pthread_mutex_lock(&m->lock);
    int gone = m->comm == NULL || m->revoked;
    ncclResult_t nr = gone ? ncclSuccess : enqueue_op(c, m, q, buf);
    if (!gone && nr != ncclSuccess && nr != ncclInProgress)
        snprintf(last, sizeof last, "%s", ncclGetLastError(m->comm));
    pthread_mutex_unlock(&m->lock);
    int rc = 0;
    if (gone) {
        rc = atomic_load(&c->err) ? atomic_load(&c->err) : DDP_EABORTED;
    } else if (nr != ncclSuccess && nr != ncclInProgress) {
        rc = fail(c, DDP_ENCCL, "%s: %s (%s)", desc(q, d, sizeof d), ncclGetErrorString(nr), last);
    } else if (nr == ncclInProgress) {
        rc = settle(c, m, ddp_now_ns() + auto_timeout_ns(c, q->bytes), desc(q, d, sizeof d));
    }
    if (rc == 0 && r->host) {
        ce = cudaMemcpyAsync((char *)m->stage_host + r->off, buf, q->bytes, cudaMemcpyDeviceToHost,
                             m->stream);
        if (ce != cudaSuccess)
            rc = fail(c, DDP_ECUDA, "%s: staging copy back: %s", desc(q, d, sizeof d),
                      cudaGetErrorString(ce));
    }
    if (rc == 0) {
        ce = cudaEventRecord(r->ev, m->stream);
        if (ce != cudaSuccess)
            rc = fail(c, DDP_ECUDA, "%s: cudaEventRecord: %s", desc(q, d, sizeof d),
                      cudaGetErrorString(ce));
    }
    if (rc < 0) {
        cudaEventDestroy(r->ev);
        free(r);
        return rc;
    }
    if (r->host) m->staged_inflight++;
    q->impl = r;
    q->t_start = ddp_now_ns();
    return 0;
}

/* Marks q done with rc and releases its backend state (copying a staged result back). */
static void finish(nccl_impl_t *m, ddp_coll_req_t *q, int rc)
{
    nccl_req_t *r = q->impl;
    if (r) {
        if (r->host) {
            if (rc == 0) memcpy(r->host, (char *)m->stage_host + r->off, q->bytes);
            m->staged_inflight--;
        }
        cudaEventDestroy(r->ev);
        free(r);
        q->impl = NULL;
    }
    q->rc = rc;
    q->t_end = ddp_now_ns();
    atomic_store(&q->done, 1);
}

static int nccl_test(ddp_coll_t *c, ddp_coll_req_t *q)
{
    if (atomic_load(&q->done)) return 1;
    nccl_req_t *r = q->impl;
    cudaError_t e = cudaEventQuery(r->ev);
    if (e == cudaErrorNotReady) return 0;
    int rc = 0;
    char d[96];
    if (e != cudaSuccess) {
        rc = fail(c, DDP_ECUDA, "%s: cudaEventQuery: %s", desc(q, d, sizeof d),
                  cudaGetErrorString(e));
    } else if (atomic_load(&c->err)) {
        rc = atomic_load(&c->err); /* the stream went on after an abort or an NCCL error */
    } else {
        int gone;
        char last[256] = "";
        ncclResult_t st = async_state(c->impl, &gone, last, sizeof last);
        if (gone)
            rc = DDP_EABORTED;
        else if (st != ncclSuccess && st != ncclInProgress)
            rc = fail(c, DDP_ENCCL, "%s: %s (%s)", desc(q, d, sizeof d), ncclGetErrorString(st),
                      last);
    }
    finish(c->impl, q, rc);
    return 1;
}

static int nccl_wait(ddp_coll_t *c, ddp_coll_req_t *q, int64_t deadline_ns)
{
    nccl_impl_t *m = c->impl;
    if (!deadline_ns) deadline_ns = q->t_start + auto_timeout_ns(c, q->bytes);
    char d[96];
    while (!nccl_test(c, q)) {
        int err = atomic_load(&c->err);
        if (!err) {
            int gone;
            char last[256] = "";
            ncclResult_t st = async_state(m, &gone, last, sizeof last);
            if (gone) err = DDP_EABORTED;
            else if (st != ncclSuccess && st != ncclInProgress)
                err = fail(c, DDP_ENCCL, "%s: %s (%s)", desc(q, d, sizeof d),
                           ncclGetErrorString(st), last);
            else if (ddp_now_ns() > deadline_ns)
                err = fail(c, DDP_ETIMEDOUT, "%s: a rank among 0..%d did not arrive within the "
                           "deadline (NCCL does not say which)", desc(q, d, sizeof d), c->size - 1);
        }
        if (err) {
            finish(m, q, atomic_load(&c->err) ? atomic_load(&c->err) : err);
            return q->rc;
        }
        nap();
    }
    if (q->rc == 0) note_bw(c, q->bytes, ddp_now_ns() - q->t_start);
    return q->rc;
}

static int nccl_wait_event(ddp_coll_t *c, void *event)
{
    nccl_impl_t *m = c->impl;
    cudaError_t e = cudaStreamWaitEvent(m->stream, (cudaEvent_t)event, 0);
    if (e != cudaSuccess)
        return fail(c, DDP_ECUDA, "cudaStreamWaitEvent: %s", cudaGetErrorString(e));
    return 0;
}

static void nccl_abort(ddp_coll_t *c)
{
    if (c->impl) stop_comm(c->impl);
}

/* Ends a healthy communicator within the deadline: finalize and poll, else abort. */
static void finalize(ddp_coll_t *c, nccl_impl_t *m)
{
    pthread_mutex_lock(&m->lock);
    ncclResult_t r = m->comm ? ncclCommFinalize(m->comm) : ncclSuccess;
    pthread_mutex_unlock(&m->lock);
    int64_t deadline = ddp_now_ns() + (int64_t)(c->timeout_s * 1e9);
    for (;;) {
        int gone = 0;
        ncclResult_t st =
            r == ncclSuccess || r == ncclInProgress ? async_state(m, &gone, NULL, 0) : r;
        if (gone) return;
        if (st == ncclSuccess) break;
        if (st != ncclInProgress || ddp_now_ns() > deadline) {
            DDP_WARN("collectives (" DDP_COLL_NCCL_NAME ", rank %d of %d): finalize %s: "
                     "aborting the communicator",
                     c->rank, c->size,
                     st != ncclInProgress ? ncclGetErrorString(st) : "did not complete in time");
            abort_comm(m);
            return;
        }
        nap();
    }
    pthread_mutex_lock(&m->lock);
    if (m->comm) ncclCommDestroy(m->comm); /* finalized: frees local resources only */
    m->comm = NULL;
    pthread_mutex_unlock(&m->lock);
}

static void nccl_free(ddp_coll_t *c)
{
    nccl_impl_t *m = c->impl;
    if (!m) return;
    if (atomic_load(&c->err))
        abort_comm(m);
    else
        finalize(c, m);
    for (ddp_coll_req_t *q = c->outstanding; q; q = q->unext)
        if (q->impl) finish(m, q, DDP_EABORTED);
    if (cudaStreamSynchronize(m->stream) != cudaSuccess) cudaGetLastError();
    release_impl(m);
    c->impl = NULL;
}

const ddp_coll_ops_t DDP_COLL_NCCL_OPS = {
    .name = DDP_COLL_NCCL_NAME,
    .slices_anywhere = 1,
    .probe = nccl_probe,
    .init = nccl_init,
    .submit = nccl_submit,
    .wait = nccl_wait,
    .test = nccl_test,
    .wait_event = nccl_wait_event,
    .abort = nccl_abort,
    .free = nccl_free,
};
