/* The simulated CUDA runtime and NCCL of the "sim" collectives backend (see nccl.h and
 * cuda_runtime_api.h in this folder for what they promise).
 *
 * Invariants
 * - A communicator is live from ncclCommInitRankConfig until ncclCommAbort/Destroy; `live`
 *   lists them, and a call on anything else is a violation, never a crash.
 * - comm->queued counts its operations still on a stream; abort and destroy wait for them (they
 *   end fast once the inner communicator is aborted), so no stream op outlives its comm.
 * - comm->state is written by the init/finalize threads and stream ops, read by callers:
 *   under g.mu.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "collectives/coll.h"
#include "tests/sim/nccl.h"
#include "tests/sim/sim.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

#define SIM_DEVICES 8

static __thread int cur_dev;
static _Atomic int calls_in_flight; /* over every communicator */

/* ---- CUDA runtime ---- */

static int failing(const char *fn)
{
    const char *f = getenv("DDP_SIM_FAIL");
    return f && strcmp(f, fn) == 0;
}

int ddp_sim_current_device(void) { return cur_dev; }

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = SIM_DEVICES;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev)
{
    if (dev < 0 || dev >= SIM_DEVICES) return cudaErrorInvalidDevice;
    cur_dev = dev;
    return cudaSuccess;
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered (simulated)";
    case cudaErrorLaunchFailure: return "unspecified launch failure (simulated)";
    }
    return "unknown error";
}

cudaError_t cudaGetLastError(void) { return cudaSuccess; }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    char name[32];
    snprintf(name, sizeof name, "nccl(dev %d)", cur_dev);
    return ddp_simdev_stream_new(cur_dev, name, s) ? cudaErrorMemoryAllocation : cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    ddp_simdev_stream_free(s);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    ddp_simdev_stream_sync(s);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned flags)
{
    if (!s || !ev) return cudaErrorInvalidResourceHandle;
    ddp_simdev_stream_wait_event(s, ev);
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned flags)
{
    *ev = calloc(1, sizeof **ev);
    if (!*ev) return cudaErrorMemoryAllocation;
    (*ev)->stream = -1;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s)
{
    if (failing("cudaEventRecord")) return cudaErrorLaunchFailure;
    ddp_simdev_event_record(ev, s);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t ev)
{
    if (failing("cudaEventQuery")) return cudaErrorLaunchFailure;
    return ddp_simdev_event_query(ev) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventDestroy(cudaEvent_t ev)
{
    free(ev);
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p)
{
    int dev = ddp_simdev_device_of(p, 1);
    memset(a, 0, sizeof *a);
    a->device = dev >= 0 ? dev : -2;
    a->type = dev >= 0 ? cudaMemoryTypeDevice
                       : dev == DDP_SIMDEV_PINNED ? cudaMemoryTypeHost : cudaMemoryTypeUnregistered;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes)
{
    return ddp_simdev_alloc(cur_dev, bytes, p) ? cudaErrorMemoryAllocation : cudaSuccess;
}

cudaError_t cudaFree(void *p)
{
    ddp_simdev_free(p);
    return cudaSuccess;
}

cudaError_t cudaMallocHost(void **p, size_t bytes)
{
    return ddp_simdev_alloc(DDP_SIMDEV_PINNED, bytes, p) ? cudaErrorMemoryAllocation
                                                         : cudaSuccess;
}

cudaError_t cudaFreeHost(void *p)
{
    ddp_simdev_free(p);
    return cudaSuccess;
}

typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
} copy_t;

static void run_copy(void *arg)
{
    copy_t *c = arg;
    memmove(c->dst, c->src, c->bytes);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t s)
{
    if (!bytes) return cudaSuccess;
    copy_t *c = malloc(sizeof *c);
    if (!c) return cudaErrorMemoryAllocation;
    *c = (copy_t){dst, src, bytes};
    int dh = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyHostToHost;
    int sh = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyHostToHost;
    ddp_simdev_access_t acc[] = {
        {dst, bytes, DDP_SIMDEV_W | (dh ? DDP_SIMDEV_HOSTSIDE : 0)},
        {src, bytes, DDP_SIMDEV_R | (sh ? DDP_SIMDEV_HOSTSIDE : 0)},
    };
    int rc = ddp_simdev_launch(s, "cudaMemcpyAsync", run_copy, c, acc, 2);
    return rc == 0 ? cudaSuccess : rc == DDP_EHAZARD ? cudaErrorIllegalAddress
                                                     : cudaErrorMemoryAllocation;
}

/* ---- NCCL ---- */

struct ddp_sim_nccl_comm {
    struct ddp_sim_nccl_comm *next; /* live list */
    int rank, size, device;
    char addr[128];
    ddp_coll_t *inner;
    ncclResult_t state;
    char last[400];
    int finalized;
    int revoked;
    int *ports;          /* each rank's port for a shrink's rendezvous (size entries) */
    int queued;          /* operations on a stream, not yet done */
    _Atomic int in_call; /* threads inside a call on this communicator */
    pthread_t worker;    /* init, then finalize */
    int have_worker;
};

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct ddp_sim_nccl_comm *live;
    uint64_t violations;
    char last[400];
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void violation(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&g.mu);
    vsnprintf(g.last, sizeof g.last, fmt, ap);
    g.violations++;
    DDP_ERROR("sim nccl: violation: %s", g.last);
    pthread_mutex_unlock(&g.mu);
    va_end(ap);
}

uint64_t ddp_sim_nccl_violations(void)
{
    pthread_mutex_lock(&g.mu);
    uint64_t n = g.violations;
    pthread_mutex_unlock(&g.mu);
    return n;
}

void ddp_sim_nccl_last_violation(char *buf, size_t len)
{
    pthread_mutex_lock(&g.mu);
    snprintf(buf, len, "%s", g.last);
    pthread_mutex_unlock(&g.mu);
}

/* Enters a call on comm: 1 when comm is live (then leave() must follow), 0 (a violation). */
static int enter(ncclComm_t comm, const char *fn)
{
    pthread_mutex_lock(&g.mu);
    struct ddp_sim_nccl_comm *c = g.live;
    while (c && c != comm) c = c->next;
    if (c) {
        atomic_fetch_add(&c->in_call, 1);
        atomic_fetch_add(&calls_in_flight, 1);
    }
    pthread_mutex_unlock(&g.mu);
    if (!c) {
        violation("%s on communicator %p, which was aborted or destroyed (or never existed)", fn,
                  (void *)comm);
        return 0;
    }
    const char *us = getenv("DDP_SIM_NCCL_CALL_US");
    if (us && atol(us) > 0) {
        struct timespec ts = {atol(us) / 1000000, (atol(us) % 1000000) * 1000};
        nanosleep(&ts, NULL);
    }
    return 1;
}

static void leave(ncclComm_t comm)
{
    atomic_fetch_sub(&comm->in_call, 1);
    atomic_fetch_sub(&calls_in_flight, 1);
}

int ddp_sim_nccl_calls_in_flight(void) { return atomic_load(&calls_in_flight); }

static void set_state(ncclComm_t comm, ncclResult_t st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_state(ncclComm_t comm, ncclResult_t st, const char *fmt, ...)
{
    pthread_mutex_lock(&g.mu);
    if (comm->state == ncclSuccess || comm->state == ncclInProgress) {
        comm->state = st;
        if (fmt) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(comm->last, sizeof comm->last, fmt, ap);
            va_end(ap);
        }
    }
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
}

/* A loopback port that was free a moment ago (a rendezvous listens there later), or -1. */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    int ok = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
             getsockname(fd, (struct sockaddr *)&sa, &len) == 0;
    if (fd >= 0) close(fd);
    return ok ? ntohs(sa.sin_port) : -1;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    memset(id, 0, sizeof *id);
    int port = free_port();
    if (port < 0) return ncclSystemError;
    snprintf(id->internal, sizeof id->internal, "127.0.0.1:%d", port);
    return ncclSuccess;
}

static double inner_timeout(void)
{
    const char *t = getenv("DDP_SIM_NCCL_TIMEOUT_S");
    return t && atof(t) > 0 ? atof(t) : 600.0; /* NCCL itself waits for ever */
}

static void *init_main(void *arg)
{
    ncclComm_t comm = arg;
    ddp_coll_rdzv_cfg_t cfg = {.rank = comm->rank, .size = comm->size, .addr = comm->addr,
                               .token = "sim-nccl", .timeout_s = 60};
    ddp_coll_bootstrap_t *bs = NULL;
    ddp_errinfo_t ei = {0};
    ddp_coll_opts_t opts = {.backend = "ring", .timeout_s = inner_timeout()};
    int rc = ddp_coll_bootstrap_tcp(&cfg, &bs, &ei);
    ddp_coll_t *inner = NULL;
    int port = free_port(), *ports = calloc((size_t)comm->size, sizeof *ports);
    if (rc == 0 && !ports) rc = ddp_errinfo_set(&ei, DDP_ENOMEM, "out of memory");
    if (rc == 0) /* where a shrink's rendezvous may listen */
        rc = bs->ops->allgather(bs, &port, sizeof port, ports,
                                ddp_now_ns() + (int64_t)(cfg.timeout_s * 1e9), &ei);
    if (rc == 0) rc = ddp_coll_new(bs, &opts, &inner, &ei);
    ddp_coll_bootstrap_free(bs);
    pthread_mutex_lock(&g.mu);
    comm->inner = inner;
    comm->ports = ports;
    pthread_mutex_unlock(&g.mu);
    if (rc)
        set_state(comm, ncclSystemError, "init: %s", ei.msg);
    else
        set_state(comm, ncclSuccess, NULL);
    return NULL;
}

/* A communicator formed by a thread at the rendezvous addr (see ncclCommInitRankConfig). */
static ncclResult_t start_comm(ncclComm_t *out, int nranks, const char *addr, int rank,
                               ncclConfig_t *cfg)
{
    *out = NULL;
    ncclComm_t comm = calloc(1, sizeof *comm);
    if (!comm) return ncclSystemError;
    comm->rank = rank;
    comm->size = nranks;
    comm->device = cur_dev;
    comm->state = ncclInProgress;
    snprintf(comm->addr, sizeof comm->addr, "%s", addr);
    if (pthread_create(&comm->worker, NULL, init_main, comm) != 0) {
        free(comm);
        return ncclSystemError;
    }
    comm->have_worker = 1;
    pthread_mutex_lock(&g.mu);
    comm->next = g.live;
    g.live = comm;
    pthread_mutex_unlock(&g.mu);
    *out = comm;
    if (cfg && !cfg->blocking) return ncclInProgress;
    pthread_join(comm->worker, NULL);
    comm->have_worker = 0;
    return comm->state;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *out, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *cfg)
{
    return start_comm(out, nranks, id.internal, rank, cfg);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state)
{
    if (!enter(comm, "ncclCommGetAsyncError")) return ncclInvalidArgument;
    pthread_mutex_lock(&g.mu);
    *state = !comm->revoked ? comm->state : comm->queued ? ncclInProgress : ncclSuccess;
    pthread_mutex_unlock(&g.mu);
    leave(comm);
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r)
{
    static const char *const s[] = {"no error", "unhandled cuda error", "unhandled system error",
                                    "internal error", "invalid argument", "invalid usage",
                                    "remote process exited or there was a network error",
                                    "NCCL operation in progress"};
    return r >= 0 && r <= ncclInProgress ? s[r] : "unknown result code";
}

const char *ncclGetLastError(ncclComm_t comm)
{
    static __thread char buf[400];
    if (!enter(comm, "ncclGetLastError")) return "communicator is gone";
    pthread_mutex_lock(&g.mu);
    snprintf(buf, sizeof buf, "%s", comm->last);
    pthread_mutex_unlock(&g.mu);
    leave(comm);
    return buf;
}

enum { OP_ALLREDUCE, OP_BCAST, OP_REDUCE, OP_REDUCE_SCATTER, OP_ALLGATHER };

typedef struct {
    ncclComm_t comm;
    int kind;
    void *buf;    /* the whole buffer the operation reads and writes */
    size_t count; /* its elements (OP_BCAST: bytes) */
    size_t slice; /* OP_REDUCE_SCATTER, OP_ALLGATHER: elements per rank */
    ddp_dtype_t dt;
    ddp_redop_t op;
    int root; /* OP_BCAST, OP_REDUCE */
} nop_t;

/* rc of the submit that set *req (read after it: arguments have no evaluation order) */
static int wait_inner(int rc, ddp_coll_req_t **req, ddp_errinfo_t *ei)
{
    return rc ? rc : ddp_coll_wait(*req, 0, ei);
}

/* An inner all-reduce of a copy of buf[0..count), of which [keep_lo, keep_hi) is written back. */
static int reduce_copy(nop_t *o, size_t keep_lo, size_t keep_hi, ddp_errinfo_t *ei)
{
    size_t es = ddp_dtype_size(o->dt);
    void *tmp = malloc(o->count > 0 ? o->count * es : 1);
    if (!tmp) return DDP_ENOMEM;
    memcpy(tmp, o->buf, o->count * es);
    ddp_coll_req_t *req = NULL;
    int rc = wait_inner(ddp_coll_allreduce(o->comm->inner, tmp, o->count, o->dt, o->op, &req),
                        &req, ei);
    if (rc == 0)
        memcpy((char *)o->buf + keep_lo * es, (char *)tmp + keep_lo * es,
               (keep_hi - keep_lo) * es);
    free(tmp);
    return rc;
}

static void run_op(void *arg)
{
    nop_t *o = arg;
    ncclComm_t comm = o->comm;
    ddp_coll_req_t *req = NULL;
    ddp_errinfo_t ei = {0};
    size_t es = ddp_dtype_size(o->dt), r = (size_t)comm->rank;
    int rc = 0;
    switch (o->kind) {
    case OP_ALLREDUCE:
        rc = wait_inner(ddp_coll_allreduce(comm->inner, o->buf, o->count, o->dt, o->op, &req),
                        &req, &ei);
        break;
    case OP_BCAST:
        rc = wait_inner(ddp_coll_broadcast(comm->inner, o->buf, o->count, o->root, &req), &req,
                        &ei);
        break;
    case OP_REDUCE:
        rc = reduce_copy(o, 0, o->root == comm->rank ? o->count : 0, &ei);
        break;
    case OP_REDUCE_SCATTER:
        rc = reduce_copy(o, r * o->slice, (r + 1) * o->slice, &ei);
        break;
    case OP_ALLGATHER:
        for (int q = 0; rc == 0 && q < comm->size; q++)
            rc = wait_inner(ddp_coll_broadcast(comm->inner, (char *)o->buf + q * o->slice * es,
                                               o->slice * es, q, &req),
                            &req, &ei);
        break;
    }
    if (rc) set_state(comm, ncclRemoteError, "%s", ei.msg[0] ? ei.msg : ddp_strerror(rc));
    pthread_mutex_lock(&g.mu);
    comm->queued--;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
}

/* Whether send and recv have fn's in-place layout (o->slice elements of es bytes per rank);
 * sets o->buf and o->count (the whole buffer) from it. After enter(): comm is live. */
static int in_place(nop_t *o, const void *send, void *recv, size_t es)
{
    const char *s = send, *r = recv;
    size_t mine = (size_t)o->comm->rank * o->slice * es;
    if (o->kind == OP_REDUCE_SCATTER || o->kind == OP_ALLGATHER)
        o->count = o->slice * (size_t)o->comm->size;
    o->buf = o->kind == OP_REDUCE_SCATTER ? (void *)s : recv;
    return o->kind == OP_REDUCE_SCATTER ? r == s + mine
           : o->kind == OP_ALLGATHER    ? s == r + mine
                                        : s == r;
}

/* Checks and queues o on stream, or frees it. */
static ncclResult_t enqueue(const char *fn, nop_t *o, const void *send, void *recv,
                            cudaStream_t stream)
{
    ncclComm_t comm = o->comm;
    if (!enter(comm, fn)) {
        free(o);
        return ncclInvalidArgument;
    }
    size_t es = o->kind == OP_BCAST ? 1 : ddp_dtype_size(o->dt);
    int layout_ok = in_place(o, send, recv, es);
    size_t bytes = o->count * es;
    ncclResult_t r = ncclSuccess;
    pthread_mutex_lock(&g.mu);
    ncclResult_t st = comm->state;
    int revoked = comm->revoked;
    pthread_mutex_unlock(&g.mu);
    int dev = ddp_simdev_device_of(o->buf, bytes);
    if (revoked) {
        violation("%s on communicator %p after ncclCommRevoke", fn, (void *)comm);
        r = ncclInvalidUsage;
    } else if (st != ncclSuccess) {
        r = st == ncclInProgress ? ncclInvalidUsage : st;
    } else if (!layout_ok) {
        r = ncclInvalidArgument; /* the backend works in place only */
    } else if (dev != comm->device || ddp_simdev_stream_device(stream) != comm->device) {
        char what[32];
        snprintf(what, sizeof what, "memory of device %d", dev);
        snprintf(comm->last, sizeof comm->last,
                 "%s: buffer %p (%zu bytes) is %s and the stream's device is %d, but the "
                 "communicator is on device %d: NCCL needs device memory of its own GPU (on a "
                 "GPU this is an illegal memory access)",
                 fn, o->buf, bytes,
                 dev >= 0 ? what : dev == DDP_SIMDEV_PINNED ? "pinned host memory" : "host memory",
                 ddp_simdev_stream_device(stream), comm->device);
        DDP_ERROR("sim nccl: %s", comm->last);
        r = ncclInvalidArgument;
    }
    /* a root that only sends reads its buffer (its compute may read it meanwhile) */
    int reads_only = o->root == comm->rank ? o->kind == OP_BCAST
                                           : o->kind == OP_REDUCE;
    ddp_simdev_access_t acc = {o->buf, bytes, reads_only ? DDP_SIMDEV_R : DDP_SIMDEV_RW};
    if (r == ncclSuccess && ddp_simdev_check(stream, fn, &acc, 1) == DDP_EHAZARD) {
        /* on a GPU: wrong sums, silently; here the operation is refused, not raced */
        char h[400];
        ddp_simdev_last_hazard(h, sizeof h);
        set_state(comm, ncclInvalidUsage, "%s", h);
        r = ncclInvalidUsage;
    }
    if (r == ncclSuccess) {
        pthread_mutex_lock(&g.mu);
        comm->queued++;
        pthread_mutex_unlock(&g.mu);
        ddp_simdev_launch(stream, fn, run_op, o, &acc, 1); /* checked just above */
    } else {
        free(o);
    }
    leave(comm);
    return r;
}

/* count: elements (OP_BCAST: of dt, ncclUint8 or a float type); slice: per rank. */
static ncclResult_t queue(const char *fn, ncclComm_t comm, int kind, const void *send, void *recv,
                          size_t count, size_t slice, ncclDataType_t dt, ncclRedOp_t op, int root,
                          cudaStream_t stream)
{
    nop_t *o = malloc(sizeof *o);
    if (!o) return ncclSystemError;
    ddp_dtype_t t = dt == ncclBfloat16 ? DDP_DT_BF16 : DDP_DT_F32;
    if (kind == OP_BCAST) count *= dt == ncclUint8 ? 1 : ddp_dtype_size(t); /* bytes */
    *o = (nop_t){comm, kind, recv, count, slice, t, op == ncclAvg ? DDP_OP_AVG : DDP_OP_SUM, root};
    return enqueue(fn, o, send, recv, stream);
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t dt,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    return queue("ncclAllReduce", comm, OP_ALLREDUCE, send, recv, count, 0, dt, op, -1, stream);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t dt,
                           int root, ncclComm_t comm, cudaStream_t stream)
{
    return queue("ncclBroadcast", comm, OP_BCAST, send, recv, count, 0, dt, ncclSum,
                 root >= 0 ? root : 0, stream);
}

ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t dt,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    return queue("ncclReduce", comm, OP_REDUCE, send, recv, count, 0, dt, op, root, stream);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, ncclDataType_t dt,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    return queue("ncclReduceScatter", comm, OP_REDUCE_SCATTER, send, recv, 0, recvcount, dt, op,
                 -1, stream);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t dt,
                           ncclComm_t comm, cudaStream_t stream)
{
    return queue("ncclAllGather", comm, OP_ALLGATHER, send, recv, 0, sendcount, dt, ncclSum, -1,
                 stream);
}

ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }

/* Unlinks comm from the live list; 0 when it was not there (a violation). */
static int unlink_comm(ncclComm_t comm, const char *fn)
{
    pthread_mutex_lock(&g.mu);
    struct ddp_sim_nccl_comm **pc = &g.live;
    while (*pc && *pc != comm) pc = &(*pc)->next;
    int found = *pc != NULL;
    if (found) *pc = comm->next;
    pthread_mutex_unlock(&g.mu);
    if (!found)
        violation("%s on communicator %p, which was aborted or destroyed", fn, (void *)comm);
    return found;
}

/* Waits for comm's queued operations and worker, then frees it with its inner communicator. */
static void release(ncclComm_t comm)
{
    if (comm->have_worker) pthread_join(comm->worker, NULL);
    pthread_mutex_lock(&g.mu);
    while (comm->queued > 0) pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    ddp_coll_free(comm->inner);
    free(comm->ports);
    free(comm);
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm) return ncclSuccess;
    if (!unlink_comm(comm, "ncclCommAbort")) return ncclInvalidArgument;
    int busy = atomic_load(&comm->in_call);
    if (busy)
        violation("ncclCommAbort frees communicator %p while %d other thread(s) are inside a call "
                  "on it", (void *)comm, busy);
    pthread_mutex_lock(&g.mu);
    ddp_coll_t *inner = comm->inner;
    pthread_mutex_unlock(&g.mu);
    if (inner) ddp_coll_abort(inner, DDP_EABORTED, "ncclCommAbort");
    set_state(comm, ncclRemoteError, "aborted");
    if (comm->have_worker) { /* an init still connecting: it fails at its own deadline */
        pthread_join(comm->worker, NULL);
        comm->have_worker = 0;
        pthread_mutex_lock(&g.mu);
        inner = comm->inner;
        pthread_mutex_unlock(&g.mu);
        if (inner) ddp_coll_abort(inner, DDP_EABORTED, "ncclCommAbort");
    }
    release(comm);
    return ncclSuccess;
}

static void *finalize_main(void *arg)
{
    ncclComm_t comm = arg;
    ddp_errinfo_t ei = {0};
    int rc = ddp_coll_barrier(comm->inner, 0, &ei); /* every rank finalizes */
    pthread_mutex_lock(&g.mu);
    comm->finalized = rc == 0;
    pthread_mutex_unlock(&g.mu);
    if (rc)
        set_state(comm, ncclRemoteError, "finalize: %s", ei.msg);
    else {
        pthread_mutex_lock(&g.mu);
        comm->state = ncclSuccess;
        pthread_cond_broadcast(&g.cv);
        pthread_mutex_unlock(&g.mu);
    }
    return NULL;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    if (!enter(comm, "ncclCommFinalize")) return ncclInvalidArgument;
    ncclResult_t r = ncclInProgress;
    pthread_mutex_lock(&g.mu);
    int ready = comm->state == ncclSuccess && comm->inner;
    int revoked = comm->revoked;
    pthread_mutex_unlock(&g.mu);
    if (revoked) {
        violation("ncclCommFinalize on communicator %p after ncclCommRevoke", (void *)comm);
        leave(comm);
        return ncclInvalidUsage;
    }
    if (ready && comm->have_worker) { /* the finished init */
        pthread_join(comm->worker, NULL);
        comm->have_worker = 0;
    }
    pthread_mutex_lock(&g.mu);
    if (!ready || comm->state != ncclSuccess)
        r = ncclInvalidUsage;
    else
        comm->state = ncclInProgress;
    pthread_mutex_unlock(&g.mu);
    if (r == ncclInProgress) {
        if (pthread_create(&comm->worker, NULL, finalize_main, comm) == 0)
            comm->have_worker = 1;
        else
            r = ncclSystemError;
    }
    leave(comm);
    return r;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm) return ncclSuccess;
    if (!unlink_comm(comm, "ncclCommDestroy")) return ncclInvalidArgument;
    if (comm->have_worker) {
        pthread_join(comm->worker, NULL);
        comm->have_worker = 0;
    }
    if (!comm->finalized && comm->inner) {
        /* not finalized: wait for every rank, without a deadline (a dead peer hangs it) */
        ddp_coll_barrier(comm->inner, INT64_MAX, NULL);
    }
    release(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommRevoke(ncclComm_t comm, int flags)
{
    if (!enter(comm, "ncclCommRevoke")) return ncclInvalidArgument;
    if (flags != 0) {
        leave(comm);
        return ncclInvalidArgument;
    }
    pthread_mutex_lock(&g.mu);
    comm->revoked = 1;
    ddp_coll_t *inner = comm->inner;
    pthread_mutex_unlock(&g.mu);
    if (inner) ddp_coll_abort(inner, DDP_EABORTED, "ncclCommRevoke"); /* its operations end */
    leave(comm);
    return ncclSuccess;
}

static int listed(const int *list, int n, int x)
{
    for (int i = 0; i < n; i++)
        if (list[i] == x) return 1;
    return 0;
}

ncclResult_t ncclCommShrink(ncclComm_t parent, int *excluded, int n, ncclComm_t *out,
                            ncclConfig_t *cfg, int flags)
{
    *out = NULL;
    if (!enter(parent, "ncclCommShrink")) return ncclInvalidArgument;
    pthread_mutex_lock(&g.mu);
    int queued = parent->queued, revoked = parent->revoked, size = parent->size;
    int rank = parent->rank, *ports = parent->ports;
    ddp_coll_t *inner = parent->inner;
    pthread_mutex_unlock(&g.mu);
    ncclResult_t r = ncclSuccess;
    int below = 0, root = 0;
    for (int i = 0; i < n; i++) {
        if (excluded[i] < 0 || excluded[i] >= size || excluded[i] == rank) r = ncclInvalidArgument;
        below += excluded[i] < rank;
    }
    while (root < size && listed(excluded, n, root)) root++; /* the new rank 0 */
    if (r != ncclSuccess || n <= 0 || n >= size || !ports) {
        violation("ncclCommShrink of communicator %p (rank %d of %d) excluding %d rank(s): "
                  "invalid arguments, or a rank it excludes calls it", (void *)parent, rank, size,
                  n);
        r = ncclInvalidArgument;
    } else if (revoked && queued) {
        violation("ncclCommShrink of revoked communicator %p before it is quiescent (%d "
                  "operation(s) queued): poll ncclCommGetAsyncError until ncclSuccess first",
                  (void *)parent, queued);
        r = ncclInvalidUsage;
    } else if (!revoked && queued && flags != NCCL_SHRINK_ABORT) {
        violation("ncclCommShrink of communicator %p with %d operation(s) in flight and "
                  "NCCL_SHRINK_DEFAULT (it would hang on them)", (void *)parent, queued);
        r = ncclInvalidUsage;
    }
    if (r == ncclSuccess && !revoked && flags == NCCL_SHRINK_ABORT && inner)
        ddp_coll_abort(inner, DDP_EABORTED, "ncclCommShrink(NCCL_SHRINK_ABORT)");
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", r == ncclSuccess ? ports[root] : 0);
    leave(parent);
    if (r != ncclSuccess) return r;
    return start_comm(out, size - n, addr, rank - below, cfg);
}
