/* The nccl backend (GPU), built as the module ddp_coll_nccl.so and dlopen()ed by coll.c, so one
 * binary runs with and without CUDA. Plain C against the CUDA runtime and NCCL headers.
 *
 * Init: rank 0's ncclUniqueId is allgathered through the bootstrap; ncclCommInitRankConfig with
 * blocking = 0, then ncclCommGetAsyncError is polled until the communicator is ready or the
 * deadline passes. Operations are enqueued on the stream (opts.cuda_stream, or the backend's own)
 * at submit; completion is a CUDA event. Waits poll the event and ncclCommGetAsyncError with
 * 50 us sleeps (never a spin), and call ncclCommAbort on an NCCL error or an expired deadline.
 * NCCL cannot say which rank is missing: the message names the operation and the rank set.
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

typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;
    int own_stream;
    int aborted;
} nccl_impl_t;

/* ddp__coll_fail's twin: this module is dlopen()ed and links nothing from the executable (any
 * program may load it, exported symbols or not), so it records the first error itself, and
 * also aborts the NCCL communicator, which ddp__coll_fail knows nothing of. */
static int fail(ddp_coll_t *c, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(ddp_coll_t *c, int rc, const char *fmt, ...)
{
    pthread_mutex_lock(&c->mu);
    int first = atomic_load(&c->err) == 0;
    if (first) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->errmsg, sizeof c->errmsg, fmt, ap);
        va_end(ap);
        atomic_store(&c->err, rc);
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (first) {
        DDP_ERROR("collectives (nccl, rank %d of %d): %s", c->rank, c->size, c->errmsg);
        nccl_impl_t *m = c->impl;
        if (m && m->comm && !m->aborted) {
            m->aborted = 1;
            ncclCommAbort(m->comm);
        }
    }
    return atomic_load(&c->err);
}

static const char *desc(const ddp_coll_req_t *q, char *buf, size_t len)
{
    snprintf(buf, len, "%s #%llu (%zu bytes)", q->kind == DDP__REQ_BCAST ? "broadcast" : "allreduce",
             (unsigned long long)q->seq, q->bytes);
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

/* Polls the communicator until it is no longer in progress. */
static int settle(ddp_coll_t *c, nccl_impl_t *m, int64_t deadline, const char *what)
{
    for (;;) {
        ncclResult_t st = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(m->comm, &st);
        if (r != ncclSuccess) st = r;
        if (st == ncclSuccess) return 0;
        if (st != ncclInProgress)
            return fail(c, DDP_ENCCL, "%s: %s (%s)", what, ncclGetErrorString(st),
                        ncclGetLastError(m->comm));
        if (ddp_now_ns() > deadline)
            return fail(c, DDP_ETIMEDOUT, "%s: not complete within the deadline (ranks 0..%d)", what,
                        c->size - 1);
        nap();
    }
}

static int nccl_init(ddp_coll_t *c, ddp_coll_bootstrap_t *bs, const ddp_coll_opts_t *opts,
                     ddp_errinfo_t *ei)
{
    int dev = opts ? opts->cuda_device : 0;
    cudaError_t ce = cudaSetDevice(dev);
    if (ce != cudaSuccess)
        return ddp_errinfo_set(ei, DDP_ECUDA, "cudaSetDevice(%d): %s", dev, cudaGetErrorString(ce));
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (bs->rank == 0) {
        ncclResult_t r = ncclGetUniqueId(&id);
        if (r != ncclSuccess)
            return ddp_errinfo_set(ei, DDP_ENCCL, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    }
    ncclUniqueId *all = ddp_malloc(sizeof id * (size_t)bs->size);
    if (!all) return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    int64_t deadline = ddp_now_ns() + (int64_t)(c->timeout_s * 2e9);
    int rc = bs->ops->allgather(bs, &id, sizeof id, all, deadline, ei);
    if (rc < 0) {
        free(all);
        return rc;
    }
    id = all[0];
    free(all);
    nccl_impl_t *m = ddp_calloc(1, sizeof *m);
    if (!m) return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    if (opts && opts->cuda_stream) {
        m->stream = (cudaStream_t)opts->cuda_stream;
    } else {
        ce = cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking);
        if (ce != cudaSuccess) {
            free(m);
            return ddp_errinfo_set(ei, DDP_ECUDA, "cudaStreamCreate: %s", cudaGetErrorString(ce));
        }
        m->own_stream = 1;
    }
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    c->impl = m;
    ncclResult_t r = ncclCommInitRankConfig(&m->comm, bs->size, id, bs->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        rc = ddp_errinfo_set(ei, DDP_ENCCL, "ncclCommInitRankConfig: %s", ncclGetErrorString(r));
    } else {
        rc = settle(c, m, deadline, "ncclCommInitRankConfig");
        if (rc < 0) ddp_errinfo_set(ei, rc, "%s", c->errmsg);
    }
    if (rc < 0) {
        if (m->comm && !m->aborted) ncclCommAbort(m->comm);
        if (m->own_stream) cudaStreamDestroy(m->stream);
        free(m);
        c->impl = NULL;
        return rc;
    }
    c->transport = "nccl";
    return 0;
}

static int nccl_submit(ddp_coll_t *c, ddp_coll_req_t *q)
{
    nccl_impl_t *m = c->impl;
    cudaEvent_t ev;
    if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) return DDP_ECUDA;
    ncclResult_t r;
    if (q->kind == DDP__REQ_BCAST)
        r = ncclBroadcast(q->buf, q->buf, q->bytes, ncclUint8, q->root, m->comm, m->stream);
    else
        r = ncclAllReduce(q->buf, q->buf, q->count, q->dt == DDP_DT_F32 ? ncclFloat32 : ncclBfloat16,
                          q->op == DDP_OP_AVG ? ncclAvg : ncclSum, m->comm, m->stream);
    char d[96];
    if (r != ncclSuccess && r != ncclInProgress) {
        cudaEventDestroy(ev);
        return fail(c, DDP_ENCCL, "%s: %s", desc(q, d, sizeof d), ncclGetErrorString(r));
    }
    int64_t deadline = ddp_now_ns() + auto_timeout_ns(c, q->bytes);
    if (r == ncclInProgress && settle(c, m, deadline, desc(q, d, sizeof d)) < 0) {
        cudaEventDestroy(ev);
        return atomic_load(&c->err);
    }
    cudaEventRecord(ev, m->stream);
    q->impl = ev;
    q->t_start = ddp_now_ns();
    return 0;
}

static int nccl_test(ddp_coll_t *c, ddp_coll_req_t *q)
{
    if (atomic_load(&q->done)) return 1;
    cudaError_t e = cudaEventQuery((cudaEvent_t)q->impl);
    if (e == cudaErrorNotReady) return 0;
    cudaEventDestroy((cudaEvent_t)q->impl);
    q->impl = NULL;
    int rc = e == cudaSuccess ? 0 : DDP_ECUDA;
    q->rc = rc;
    atomic_store(&q->done, 1);
    return 1;
}

static int nccl_wait(ddp_coll_t *c, ddp_coll_req_t *q, int64_t deadline_ns)
{
    nccl_impl_t *m = c->impl;
    if (!deadline_ns) deadline_ns = q->t_start + auto_timeout_ns(c, q->bytes);
    char d[96];
    while (!nccl_test(c, q)) {
        int err = atomic_load(&c->err);
        if (err) return err;
        ncclResult_t st = ncclSuccess;
        ncclCommGetAsyncError(m->comm, &st);
        if (st != ncclSuccess && st != ncclInProgress)
            return fail(c, DDP_ENCCL, "%s: %s (%s)", desc(q, d, sizeof d), ncclGetErrorString(st),
                        ncclGetLastError(m->comm));
        if (ddp_now_ns() > deadline_ns)
            return fail(c, DDP_ETIMEDOUT, "%s: a rank among 0..%d did not arrive within the "
                        "deadline (NCCL does not say which)", desc(q, d, sizeof d), c->size - 1);
        nap();
    }
    if (q->rc == 0) note_bw(c, q->bytes, ddp_now_ns() - q->t_start);
    return q->rc;
}

static void nccl_abort(ddp_coll_t *c)
{
    nccl_impl_t *m = c->impl;
    if (m && m->comm && !m->aborted) {
        m->aborted = 1;
        ncclCommAbort(m->comm);
    }
}

static void nccl_free(ddp_coll_t *c)
{
    nccl_impl_t *m = c->impl;
    if (!m) return;
    for (ddp_coll_req_t *q = c->outstanding; q; q = q->unext)
        if (q->impl) {
            cudaEventDestroy((cudaEvent_t)q->impl);
            q->impl = NULL;
        }
    if (!m->aborted) {
        if (atomic_load(&c->err))
            ncclCommAbort(m->comm);
        else
            ncclCommDestroy(m->comm);
    }
    if (m->own_stream) cudaStreamDestroy(m->stream);
    free(m);
    c->impl = NULL;
}

const ddp_coll_ops_t ddp_coll_nccl_ops = {
    .name = "nccl",
    .probe = nccl_probe,
    .init = nccl_init,
    .submit = nccl_submit,
    .wait = nccl_wait,
    .test = nccl_test,
    .abort = nccl_abort,
    .free = nccl_free,
};
