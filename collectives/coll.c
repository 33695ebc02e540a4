/* The public collectives API: argument validation, backend choice, error recording, requests.
 *
 * Callers never reach a backend's ops directly: every ddp_coll_* wrapper checks its arguments and
 * the communicator's state first. The first error of a communicator is kept (code + message) and
 * every later operation fails with it, so all ranks report the same cause. The nccl backend lives
 * in a module (ddp_coll_nccl.so) found in $DDP_COLL_PATH or beside the executable and dlopen()ed;
 * so does the tests' "sim" backend (ddp_coll_sim.so, tests/sim/, never installed), which keeps
 * the simulated GPU out of the production libraries.
 */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "collectives/coll_impl.h"
#include "collectives/flight.h"
#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"

ddp_coll_t *ddp__coll_alloc(void)
{
    ddp_coll_t *c = ddp_calloc(1, sizeof *c);
    if (!c) return NULL;
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    atomic_store(&c->waiting_on, -1);
    c->transport = "none";
    c->next_tag = -1;
    return c;
}

static double env_double(const char *name, double dflt)
{
    const char *s = getenv(name);
    if (!s || !*s) return dflt;
    char *end;
    double v = strtod(s, &end);
    return (*end || v <= 0) ? dflt : v;
}

void ddp__coll_init_common(ddp_coll_t *c, int rank, int size, uint64_t gen, const char *token,
                           const ddp_coll_opts_t *opts)
{
    c->rank = rank;
    c->size = size;
    c->generation = gen;
    snprintf(c->token, sizeof c->token, "%s", token ? token : "");
    c->timeout_s = (opts && opts->timeout_s > 0) ? opts->timeout_s
                                                 : env_double("DDP_COLL_TIMEOUT_S", 30.0);
    if (opts && opts->device && c->ops->host_memory) c->device = *opts->device;
}

int ddp__coll_fail(ddp_coll_t *c, int rc, const char *fmt, ...)
{
    if (rc >= 0) rc = DDP_EABORTED;
    va_list ap;
    va_start(ap, fmt);
    int first = ddp__coll_keep_first(c, rc, fmt, ap);
    va_end(ap);
    if (first) {
        if (c->world_rank) /* a step's failure: its parent logs the operation's */
            DDP_DEBUG("collectives (sub-communicator of world rank %d, rank %d of %d): %s: %s",
                      ddp__world_rank(c, c->rank), c->rank, c->size, ddp_err_name(rc),
                      c->errmsg);
        else
            DDP_ERROR("collectives (%s, generation %llu, rank %d of %d): %s: %s", c->ops->name,
                      (unsigned long long)c->generation, c->rank, c->size, ddp_err_name(rc),
                      c->errmsg);
        if (c->ops->abort) c->ops->abort(c);
    }
    return atomic_load(&c->err);
}

void ddp__coll_complete(ddp_coll_t *c, ddp_coll_req_t *req, int rc)
{
    pthread_mutex_lock(&c->mu);
    req->rc = rc;
    atomic_store(&req->done, 1);
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

const char *ddp__req_desc(const ddp_coll_req_t *req, char *buf, size_t len)
{
    static const char *const names[] = {[DDP__REQ_ALLREDUCE] = "allreduce",
                                         [DDP__REQ_REDUCE_SCATTER] = "reduce-scatter",
                                         [DDP__REQ_ALLGATHER] = "allgather"};
    if (req->kind == DDP__REQ_BCAST)
        snprintf(buf, len, "broadcast #%llu (%zu bytes from rank %d)",
                 (unsigned long long)req->seq, req->bytes, req->root);
    else
        snprintf(buf, len, "%s #%llu (%zu bytes)", names[req->kind],
                 (unsigned long long)req->seq, req->bytes);
    return buf;
}

int ddp__coll_sleep_until_done(ddp_coll_t *c, ddp_coll_req_t *req, int64_t deadline_ns)
{
    if (atomic_load(&req->done)) return 1;
    pthread_mutex_lock(&c->mu);
    while (!atomic_load(&req->done)) {
        if (deadline_ns <= 0) {
            pthread_cond_wait(&c->cv, &c->mu);
            continue;
        }
        if (ddp_now_ns() >= deadline_ns) break;
        struct timespec ts = {.tv_sec = deadline_ns / 1000000000,
                              .tv_nsec = deadline_ns % 1000000000};
        pthread_cond_timedwait(&c->cv, &c->mu, &ts);
    }
    int done = atomic_load(&req->done);
    pthread_mutex_unlock(&c->mu);
    return done;
}

int64_t ddp__coll_auto_timeout_ns(ddp_coll_t *c, size_t bytes)
{
    uint64_t bits = atomic_load(&c->bw_bits);
    double bw;
    memcpy(&bw, &bits, sizeof bw);
    if (bw <= 0) bw = 50e6; /* before any measurement: a slow network */
    double t = 8.0 * (double)bytes / bw;
    if (t < c->timeout_s) t = c->timeout_s;
    return (int64_t)(t * 1e9);
}

void ddp__coll_note_bw(ddp_coll_t *c, size_t bytes, int64_t ns)
{
    if (bytes < (1u << 20) || ns <= 0) return; /* small operations measure latency */
    double bw = (double)bytes / ((double)ns * 1e-9);
    uint64_t bits;
    memcpy(&bits, &bw, sizeof bits);
    atomic_store(&c->bw_bits, bits);
}

double ddp_coll_bandwidth(const ddp_coll_t *c)
{
    uint64_t bits = atomic_load(&((ddp_coll_t *)c)->bw_bits);
    double bw;
    memcpy(&bw, &bits, sizeof bw);
    return bw;
}

/* ---- backend choice ------------------------------------------------------------------------ */

/* The backends that live in modules: ddp_coll_<name>.so, exporting ddp_coll_<name>_ops. A
 * module, once loaded, stays for the life of the process (communicators keep its ops). */
static struct {
    const char *name;
    void *handle;
} modules[] = {{"nccl", NULL}, {"sim", NULL}};
static pthread_mutex_t modules_lock = PTHREAD_MUTEX_INITIALIZER;

/* Looks for ddp_coll_<name>.so in each directory of $DDP_COLL_PATH (colon-separated), then beside
 * the executable, then through the dynamic linker's path; NULL when none loads. */
static void *open_module(const char *name)
{
    char file[64], path[PATH_MAX + 64];
    snprintf(file, sizeof file, "ddp_coll_%s.so", name);
    void *h = NULL;
    const char *dirs = getenv("DDP_COLL_PATH");
    for (const char *p = dirs ? dirs : ""; *p && !h; p += *p == ':') {
        size_t n = strcspn(p, ":");
        if (n > 0 && n < PATH_MAX) {
            snprintf(path, sizeof path, "%.*s/%s", (int)n, p, file);
            h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        }
        p += n;
    }
    if (!h) {
        ssize_t n = readlink("/proc/self/exe", path, PATH_MAX - 1);
        if (n > 0) {
            path[n] = 0;
            char *slash = strrchr(path, '/');
            if (slash) {
                strcpy(slash + 1, file);
                h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            }
        }
    }
    if (!h) h = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    return h;
}

/* The ops of module backend `name`, loaded on first use (any thread); NULL when not found. */
static const ddp_coll_ops_t *load_module(const char *name)
{
    const ddp_coll_ops_t *ops = NULL;
    pthread_mutex_lock(&modules_lock);
    for (size_t i = 0; i < sizeof modules / sizeof modules[0]; i++) {
        if (strcmp(name, modules[i].name)) continue;
        if (!modules[i].handle) modules[i].handle = open_module(name);
        if (modules[i].handle) {
            char sym[64];
            snprintf(sym, sizeof sym, "ddp_coll_%s_ops", name);
            ops = dlsym(modules[i].handle, sym);
        }
    }
    pthread_mutex_unlock(&modules_lock);
    return ops;
}

static const ddp_coll_ops_t *find_backend(const char *name)
{
    if (!strcmp(name, "ring")) return &ddp_coll_ring_ops;
    if (!strcmp(name, "mpi")) return &ddp_coll_mpi_ops;
    return load_module(name);
}

/* 1 when `name` is a backend that lives in a module. */
static int is_module(const char *name)
{
    for (size_t i = 0; i < sizeof modules / sizeof modules[0]; i++)
        if (!strcmp(name, modules[i].name)) return 1;
    return 0;
}

/* Allocates a communicator of ops from bs and runs the backend's init; world_rank (copied) and
 * port_index as in struct ddp_coll (NULL, bs->rank: a world). */
static int form(ddp_coll_bootstrap_t *bs, const ddp_coll_opts_t *opts, const ddp_coll_ops_t *ops,
                const int *world_rank, int port_index, ddp_coll_t **out, ddp_errinfo_t *ei)
{
    ddp_coll_t *c = ddp__coll_alloc();
    if (!c) return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    c->ops = ops;
    c->port_index = port_index;
    if (world_rank) {
        c->flight_dumped = 1; /* a step's timeout is its parent's to dump */
        c->world_rank = ddp_malloc(sizeof *c->world_rank * (size_t)bs->size);
        if (c->world_rank) memcpy(c->world_rank, world_rank, sizeof *world_rank * (size_t)bs->size);
    }
    ddp__coll_init_common(c, bs->rank, bs->size, bs->generation, bs->token, opts);
    int rc = world_rank && !c->world_rank ? ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory")
                                          : ops->init(c, bs, opts, ei);
    if (rc < 0) {
        pthread_cond_destroy(&c->cv);
        pthread_mutex_destroy(&c->mu);
        free(c->world_rank);
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

int ddp__coll_new_sub(ddp_coll_bootstrap_t *bs, const ddp_coll_opts_t *opts, const int *world_rank,
                      int port_index, ddp_coll_t **out, ddp_errinfo_t *ei)
{
    *out = NULL;
    return form(bs, opts, &ddp_coll_ring_ops, world_rank, port_index, out, ei);
}

int ddp_coll_new(ddp_coll_bootstrap_t *bs, const ddp_coll_opts_t *opts, ddp_coll_t **out,
                 ddp_errinfo_t *ei)
{
    if (!bs || !out || bs->size < 1 || bs->rank < 0 || bs->rank >= bs->size)
        return ddp_errinfo_set(ei, DDP_EINVAL, "ddp_coll_new: invalid bootstrap or output");
    *out = NULL;
    const char *name = (opts && opts->backend && *opts->backend) ? opts->backend : "auto";
    const ddp_coll_ops_t *ops;
    if (!strcmp(name, "auto")) {
        ops = &ddp_coll_ring_ops; /* CPU default; the worker asks for "nccl" on GPUs */
    } else {
        ops = find_backend(name);
        if (!ops && !is_module(name))
            return ddp_errinfo_set(ei, DDP_EINVAL,
                                   "collectives backend '%s' is unknown (ring, mpi, nccl, sim)",
                                   name);
        if (!ops)
            return ddp_errinfo_set(ei, DDP_ENODEV,
                                   "collectives backend '%s' is not available: ddp_coll_%s.so "
                                   "not found (DDP_COLL_PATH)",
                                   name, name);
    }
    if (ops->probe && ops->probe() <= 0)
        return ddp_errinfo_set(ei, ops == &ddp_coll_mpi_ops ? DDP_ENOTSUP : DDP_ENODEV,
                               "collectives backend '%s' is not usable here", ops->name);
    return form(bs, opts, ops, NULL, bs->rank, out, ei);
}

/* ---- device buffers on a host-memory backend (ddp_coll_device_t) -------------------------- */

/* The bytes [*lo, *hi) of r's buffer that the operation reads (in) or writes (!in) on this
 * rank: all of it, but a reduce-scatter writes and an all-gather reads only this rank's slice,
 * and a broadcast reads only at its root and writes only where it is kept. */
static void staged_range(const ddp_coll_t *c, const ddp_coll_req_t *r, int in, size_t *lo,
                         size_t *hi)
{
    *lo = 0;
    *hi = r->bytes;
    if (r->kind == DDP__REQ_BCAST) {
        if (in ? c->rank != r->root : !r->keep) *hi = 0;
    } else if ((r->kind == DDP__REQ_REDUCE_SCATTER && !in) ||
               (r->kind == DDP__REQ_ALLGATHER && in)) {
        size_t slo, shi, es = ddp_dtype_size(r->dt);
        ddp_coll_slice(r->count, c->size, c->rank, &slo, &shi);
        *lo = slo * es;
        *hi = shi * es;
    }
}

/* At submit: when r's buffer is device memory, r->buf becomes a host copy of the part the
 * operation reads (r->staged keeps the device buffer). 0, DDP_ENOMEM or the copy's error. */
static int stage_in(ddp_coll_t *c, ddp_coll_req_t *r)
{
    if (!c->device.on_device || !r->buf || !r->bytes ||
        !c->device.on_device(c->device.arg, r->buf, r->bytes))
        return 0;
    char *host = ddp_malloc(r->bytes);
    if (!host) return DDP_ENOMEM;
    size_t lo, hi;
    staged_range(c, r, 1, &lo, &hi);
    int rc = hi > lo ? c->device.d2h(c->device.arg, host + lo, (char *)r->buf + lo, hi - lo) : 0;
    if (rc) {
        free(host);
        return rc;
    }
    r->staged = r->buf;
    r->buf = host;
    return 0;
}

/* When r is waited for, with result rc: after a success the part the operation wrote goes back
 * to the device buffer and the host copy is freed; after a failure (an abort: the communication
 * thread may not be done with it yet) the copy waits for ddp_coll_free. Returns rc or the
 * copy's error. */
static int stage_out(ddp_coll_req_t *r, int rc)
{
    if (!r->staged) return rc;
    ddp_coll_t *c = r->comm;
    size_t lo, hi;
    staged_range(c, r, 0, &lo, &hi);
    if (rc >= 0 && hi > lo) {
        int copy = c->device.h2d(c->device.arg, (char *)r->staged + lo, (char *)r->buf + lo,
                                 hi - lo);
        if (copy) rc = copy;
    }
    void **more = rc >= 0 ? NULL : realloc(c->orphans, (c->n_orphans + 1) * sizeof *more);
    if (more) {
        c->orphans = more;
        c->orphans[c->n_orphans++] = r->buf;
    } else if (rc >= 0) {
        free(r->buf);
    } /* else out of memory after a failure: left to the process, never freed under a writer */
    r->buf = r->staged;
    r->staged = NULL;
    return rc;
}

/* Frees a request that was never queued, or is done with (its host copy too). */
static void free_req(ddp_coll_req_t *r)
{
    if (r->staged) free(r->buf);
    free(r);
}

/* ---- wrappers ------------------------------------------------------------------------------ */

static int submit(ddp_coll_t *c, ddp_coll_req_t *r, ddp_coll_req_t **req)
{
    static const char *const kinds[] = {[DDP__REQ_ALLREDUCE] = "allreduce",
                                        [DDP__REQ_BCAST] = "broadcast",
                                        [DDP__REQ_REDUCE_SCATTER] = "reduce-scatter",
                                        [DDP__REQ_ALLGATHER] = "allgather"};
    r->comm = c;
    r->seq = ++c->next_seq;
    if (!c->world_rank) /* a sub-communicator's steps belong to its parent's record */
        r->flight = ddp_flight_queued(c->generation, r->seq, c->rank, c->size,
                                      r->barrier ? "barrier" : kinds[r->kind], r->bytes,
                                      c->next_tag);
    c->next_tag = -1;
    int rc = atomic_load(&c->err);
    if (!rc) rc = stage_in(c, r);
    if (rc) {
        ddp_flight_finished(r->flight, rc);
        free_req(r);
        return rc;
    }
    r->unext = c->outstanding;
    if (c->outstanding) c->outstanding->uprev = r;
    c->outstanding = r;
    rc = c->ops->submit(c, r);
    if (rc < 0) {
        ddp_flight_finished(r->flight, rc);
        c->outstanding = r->unext;
        if (r->unext) r->unext->uprev = NULL;
        free_req(r);
        return rc;
    }
    *req = r;
    return 0;
}

/* A zeroed request of `kind` (*req = NULL until submitted); NULL when out of memory. */
static ddp_coll_req_t *new_req(int kind, void *buf, size_t count, size_t bytes,
                               ddp_coll_req_t **req)
{
    *req = NULL;
    ddp_coll_req_t *r = ddp_calloc(1, sizeof *r);
    if (!r) return NULL;
    r->kind = kind;
    r->buf = buf;
    r->count = count;
    r->bytes = bytes;
    return r;
}

/* Submits an element-wise operation of `kind` (allreduce, reduce-scatter, allgather), over
 * `slicing` (NULL: the communicator's) and AVG's divisor avg_n (0: the communicator's size). */
static int elementwise_sliced(ddp_coll_t *c, int kind, void *buf, size_t count, ddp_dtype_t dt,
                              ddp_redop_t op, int barrier, const ddp__slicing_t *slicing,
                              int avg_n, ddp_coll_req_t **req)
{
    if (!c || !req || (count && !buf) || (dt != DDP_DT_F32 && dt != DDP_DT_BF16) ||
        (op != DDP_OP_SUM && op != DDP_OP_AVG) || count > SIZE_MAX / 4)
        return DDP_EINVAL;
    size_t bytes = count * ddp_dtype_size(dt);
    if (kind != DDP__REQ_ALLREDUCE && c->size > 1 && count && !c->ops->slices_anywhere) {
        /* slices live in every rank's memory at once: only the shared single pass has them */
        const ddp__mem_t *m = ddp__mem_find(c, buf, bytes);
        if (!m || !m->peer) return DDP_ENOTSUP;
    }
    ddp_coll_req_t *r = new_req(kind, buf, count, bytes, req);
    if (!r) return DDP_ENOMEM;
    r->barrier = barrier;
    r->dt = dt;
    r->op = op;
    r->slicing = slicing;
    r->avg_n = avg_n;
    return submit(c, r, req);
}

static int elementwise(ddp_coll_t *c, int kind, void *buf, size_t count, ddp_dtype_t dt,
                       ddp_redop_t op, int barrier, ddp_coll_req_t **req)
{
    return elementwise_sliced(c, kind, buf, count, dt, op, barrier, NULL, 0, req);
}

int ddp__coll_submit_step(ddp_coll_t *c, int kind, void *buf, size_t count, ddp_dtype_t dt,
                          ddp_redop_t op, const ddp__slicing_t *slicing, int avg_n,
                          ddp_coll_req_t **req)
{
    return elementwise_sliced(c, kind, buf, count, dt, op, 0, slicing, avg_n, req);
}

int ddp_coll_allreduce(ddp_coll_t *c, void *buf, size_t count, ddp_dtype_t dt, ddp_redop_t op,
                       ddp_coll_req_t **req)
{
    return elementwise(c, DDP__REQ_ALLREDUCE, buf, count, dt, op, 0, req);
}

int ddp_coll_reduce_scatter(ddp_coll_t *c, void *buf, size_t count, ddp_dtype_t dt,
                            ddp_redop_t op, ddp_coll_req_t **req)
{
    return elementwise(c, DDP__REQ_REDUCE_SCATTER, buf, count, dt, op, 0, req);
}

int ddp_coll_allgather(ddp_coll_t *c, void *buf, size_t count, ddp_dtype_t dt,
                       ddp_coll_req_t **req)
{
    return elementwise(c, DDP__REQ_ALLGATHER, buf, count, dt, DDP_OP_SUM, 0, req);
}

void ddp_coll_tag_next(ddp_coll_t *c, int bucket)
{
    if (c) c->next_tag = bucket;
}

int ddp_coll_slices_anywhere(const ddp_coll_t *c) { return c && c->ops->slices_anywhere; }

int ddp_coll_broadcast(ddp_coll_t *c, void *buf, size_t bytes, int root, ddp_coll_req_t **req)
{
    return ddp_coll_transfer(c, buf, bytes, root, NULL, req);
}

int ddp_coll_transfer(ddp_coll_t *c, void *buf, size_t bytes, int root,
                      const unsigned char *receivers, ddp_coll_req_t **req)
{
    if (!c || !req || root < 0 || root >= c->size) return DDP_EINVAL;
    int span = c->size - 1, keep = c->rank != root, partial = 0;
    if (receivers) { /* the ring distance from root to its last receiver */
        span = 0;
        for (int d = 1; d < c->size; d++) {
            if (receivers[(root + d) % c->size]) span = d;
            else partial = 1;
        }
        keep = c->rank != root && receivers[c->rank];
    }
    if (bytes && !buf && (keep || c->rank == root)) return DDP_EINVAL;
    ddp_coll_req_t *r = new_req(DDP__REQ_BCAST, buf, bytes, bytes, req);
    if (!r) return DDP_ENOMEM;
    r->root = root;
    r->span = span;
    r->keep = keep;
    r->partial = partial;
    return submit(c, r, req);
}

int ddp_coll_wait_event(ddp_coll_t *c, void *event)
{
    if (!c) return DDP_EINVAL;
    if (!event) return 0;
    int err = atomic_load(&c->err);
    if (err) return err;
    if (c->device.on_device) return 0; /* staging's copy at submit waits for the device */
    if (!c->ops->wait_event) return DDP_ENOTSUP;
    return c->ops->wait_event(c, event);
}

int ddp_coll_test(ddp_coll_req_t *req, int *done)
{
    if (!req || !done) return DDP_EINVAL;
    ddp_coll_t *c = req->comm;
    *done = atomic_load(&req->done) || (c->ops->test && c->ops->test(c, req) > 0);
    return *done ? req->rc : 0;
}

static void release(ddp_coll_req_t *r)
{
    ddp_coll_t *c = r->comm;
    if (r->uprev)
        r->uprev->unext = r->unext;
    else
        c->outstanding = r->unext;
    if (r->unext) r->unext->uprev = r->uprev;
    free_req(r);
}

static int fill_ei(ddp_coll_t *c, int rc, ddp_errinfo_t *ei)
{
    if (rc < 0 && ei) {
        if (atomic_load(&c->err))
            ddp_errinfo_set(ei, rc, "%s", c->errmsg);
        else
            ddp_errinfo_set(ei, rc, "%s", ddp_strerror(rc));
    }
    return rc;
}

int ddp_coll_wait_timed(ddp_coll_req_t *req, int64_t deadline_ns, int64_t *start_ns,
                        int64_t *end_ns, ddp_errinfo_t *ei)
{
    if (!req) return 0;
    ddp_coll_t *c = req->comm;
    int rc = c->ops->wait(c, req, deadline_ns);
    if (rc > 0) rc = 0;
    ddp_flight_finished(req->flight, rc); /* the engine's backends have recorded it already */
    if (rc == DDP_ETIMEDOUT && !c->flight_dumped) {
        /* this thread saw the deadline pass: it is not the stuck one */
        c->flight_dumped = 1;
        json_decref(ddp_flight_dump("timeout"));
    }
    rc = stage_out(req, rc);
    if (start_ns) *start_ns = req->t_start;
    if (end_ns) *end_ns = req->t_end;
    release(req);
    return fill_ei(c, rc, ei);
}

int ddp_coll_wait(ddp_coll_req_t *req, int64_t deadline_ns, ddp_errinfo_t *ei)
{
    return ddp_coll_wait_timed(req, deadline_ns, NULL, NULL, ei);
}

int ddp_coll_wait_all(ddp_coll_t *c, int64_t deadline_ns, ddp_errinfo_t *ei)
{
    if (!c) return DDP_EINVAL;
    int first = 0;
    /* outstanding is newest first; wait oldest first */
    while (c->outstanding) {
        ddp_coll_req_t *r = c->outstanding;
        while (r->unext) r = r->unext;
        int rc = ddp_coll_wait(r, deadline_ns, NULL);
        if (rc < 0 && !first) first = rc;
    }
    return fill_ei(c, first, ei);
}

int ddp_coll_barrier(ddp_coll_t *c, int64_t deadline_ns, ddp_errinfo_t *ei)
{
    if (!c) return DDP_EINVAL;
    float one = 1.0f; /* backends without a barrier of their own sum it */
    ddp_coll_req_t *r;
    int rc = elementwise(c, DDP__REQ_ALLREDUCE, &one, 1, DDP_DT_F32, DDP_OP_SUM, 1, &r);
    if (rc < 0) return fill_ei(c, rc, ei);
    return ddp_coll_wait(r, deadline_ns, ei);
}

void ddp_coll_abort(ddp_coll_t *c, int rc, const char *why)
{
    if (!c) return;
    ddp__coll_fail(c, rc ? rc : DDP_EABORTED, "%s", why && *why ? why : "aborted by the caller");
}

const char *ddp_coll_last_error(const ddp_coll_t *c)
{
    if (!c || !atomic_load(&((ddp_coll_t *)c)->err)) return "";
    return c->errmsg;
}

int ddp_coll_status(const ddp_coll_t *c) { return c ? atomic_load(&((ddp_coll_t *)c)->err) : 0; }

/* ---- memory for collective buffers ------------------------------------------------------- */

int ddp_coll_mem_alloc(ddp_coll_t *c, size_t bytes, void **out, ddp_errinfo_t *ei)
{
    if (!c || !out) return ddp_errinfo_set(ei, DDP_EINVAL, "ddp_coll_mem_alloc: no output");
    *out = NULL;
    int err = atomic_load(&c->err);
    if (err) return fill_ei(c, err, ei);
    ddp__mem_t *m = ddp_calloc(1, sizeof *m);
    if (!m) return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    long page = sysconf(_SC_PAGESIZE);
    m->id = c->next_mem_id++;
    m->bytes = bytes;
    m->map_bytes = ((bytes ? bytes : 1) + (size_t)page - 1) & ~((size_t)page - 1);
    int rc = c->ops->mem_map ? c->ops->mem_map(c, m, ei) : 0;
    if (rc == 0 && !m->base) { /* not shared: plain memory */
        void *p = mmap(NULL, m->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                       -1, 0);
        if (p == MAP_FAILED)
            rc = ddp_errinfo_set(ei, DDP_ENOMEM, "cannot map %zu bytes: %s", m->map_bytes,
                                 strerror(errno));
        else
            m->base = p;
    }
    if (rc < 0) {
        free(m);
        return rc;
    }
    m->next = c->mems;
    c->mems = m;
    *out = m->base;
    return 0;
}

static void mem_release(ddp_coll_t *c, ddp__mem_t *m)
{
    if (c->ops->mem_unmap) c->ops->mem_unmap(c, m);
    munmap(m->base, m->map_bytes);
    free(m);
}

void ddp_coll_mem_free(ddp_coll_t *c, void *p)
{
    if (!c || !p) return;
    for (ddp__mem_t **pm = &c->mems; *pm; pm = &(*pm)->next) {
        if ((*pm)->base != p) continue;
        ddp__mem_t *m = *pm;
        *pm = m->next;
        mem_release(c, m);
        return;
    }
    DDP_ERROR("ddp_coll_mem_free: %p is not memory of this communicator", p);
}

ddp__mem_t *ddp__mem_find(const ddp_coll_t *c, const void *p, size_t bytes)
{
    const char *b = p;
    for (ddp__mem_t *m = c->mems; m; m = m->next)
        if (b >= m->base && b <= m->base + m->bytes && bytes <= (size_t)(m->base + m->bytes - b))
            return m;
    return NULL;
}

int ddp_coll_mem_shared(const ddp_coll_t *c, const void *p)
{
    const ddp__mem_t *m = c && p ? ddp__mem_find(c, p, 0) : NULL;
    return m && m->peer;
}

const void *ddp_coll_mem_peer(const ddp_coll_t *c, const void *p, int rank)
{
    const ddp__mem_t *m = c && p && rank >= 0 && rank < c->size ? ddp__mem_find(c, p, 0) : NULL;
    if (!m || !m->peer) return NULL;
    return m->peer[rank] + ((const char *)p - m->base);
}

void ddp_coll_free(ddp_coll_t *c)
{
    if (!c) return;
    if (c->ops->free) c->ops->free(c); /* stops the comm thread; completes queued requests */
    while (c->outstanding) {
        ddp_flight_finished(c->outstanding->flight, DDP_EABORTED); /* never waited for */
        release(c->outstanding);
    }
    for (size_t i = 0; i < c->n_orphans; i++) free(c->orphans[i]);
    free(c->orphans);
    while (c->mems) {
        ddp__mem_t *m = c->mems;
        c->mems = m->next;
        mem_release(c, m);
    }
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c->world_rank);
    free(c);
}

int ddp_coll_rank(const ddp_coll_t *c) { return c ? c->rank : -1; }
int ddp_coll_size(const ddp_coll_t *c) { return c ? c->size : 0; }
uint64_t ddp_coll_generation(const ddp_coll_t *c) { return c ? c->generation : 0; }
const char *ddp_coll_backend_name(const ddp_coll_t *c) { return c ? c->ops->name : "none"; }
const char *ddp_coll_transport_name(const ddp_coll_t *c) { return c ? c->transport : "none"; }
const char *ddp_coll_algorithm(const ddp_coll_t *c)
{
    return !c ? "none" : c->algo[0] ? c->algo : c->ops->name;
}
uint64_t ddp_coll_net_bytes_sent(const ddp_coll_t *c)
{
    return c && c->ops->net_bytes ? c->ops->net_bytes(c) : 0;
}
int ddp_coll_shrinks(const ddp_coll_t *c) { return c && c->shrinks; }
int ddp_coll_shrunk(const ddp_coll_t *c) { return c && c->shrunk; }
