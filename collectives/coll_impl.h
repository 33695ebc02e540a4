/* Internals shared by the collectives files (never included outside collectives/).
 *
 * struct ddp_coll is the backend-independent part of a communicator: identity, the first error
 * (set once, then immutable), the caller's list of requests not yet waited for, and the mutex +
 * condition variable that waiters sleep on. The engine (engine.c) is the communication thread and
 * FIFO queue used by the CPU backends (ring, mpi).
 */
#ifndef DDP_COLLECTIVES_COLL_IMPL_H
#define DDP_COLLECTIVES_COLL_IMPL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#include "collectives/coll.h"

enum { DDP__REQ_ALLREDUCE = 1, DDP__REQ_BCAST = 2, DDP__REQ_REDUCE_SCATTER = 3, DDP__REQ_ALLGATHER = 4 };

/* Which part of the buffer each rank of a communicator owns in a reduce-scatter, an all-gather and
 * the all-reduce's schedule: by default ddp_coll_slice(count, size, rank). A step of the two-level
 * all-reduce (hier.c) runs on a sub-communicator but slices the buffer as the world does: rank s
 * of the sub-communicator owns the world's slices idx[s * pieces + k], k < pieces, each one
 * ddp_coll_slice(count, world, idx[...]). */
typedef struct ddp__slicing {
    int world;      /* the number of slices the buffer is cut into */
    int pieces;     /* slices per rank */
    const int *idx; /* [size * pieces] */
} ddp__slicing_t;

struct ddp_coll_req {
    ddp_coll_t *comm;
    uint64_t seq;          /* 1, 2, ... per communicator, per kind-independent submission */
    int kind;
    void *buf;
    size_t count;          /* elements, or bytes (broadcast) */
    size_t bytes;
    ddp_dtype_t dt;
    ddp_redop_t op;
    int root;
    int span;              /* broadcast: the data goes from root to the next `span` ranks along the
                            * ring (size - 1: everyone; less: ddp_coll_transfer) */
    int keep;              /* broadcast: this rank writes the data into buf (root: 0) */
    int partial;           /* broadcast: some rank other than root does not keep it (the same on
                            * every rank) */
    int barrier;           /* an allreduce of one float that only synchronises (ddp_coll_barrier) */
    _Atomic int done;      /* set by the completing thread under comm->mu */
    int rc;
    int64_t t_start, t_end; /* ns, comm thread */
    ddp_coll_req_t *qnext;  /* engine queue */
    ddp_coll_req_t *unext, *uprev; /* caller's outstanding list */
    void *impl;             /* backend's per-request state */
    void *staged;           /* the caller's device buffer while buf is its host copy (coll.c),
                             * else NULL */
    uint64_t flight;        /* its flight recorder record (flight.h), 0 none */
    const ddp__slicing_t *slicing; /* a step of a two-level operation: its slices; NULL: the
                                    * communicator's own (ddp_coll_slice) */
    int avg_n;              /* DDP_OP_AVG divides by this; 0: by the communicator's size */
};

/* One allocation of ddp_coll_mem_alloc. */
typedef struct ddp__mem {
    struct ddp__mem *next;
    uint64_t id;        /* 0, 1, ... in allocation order: the same on every rank */
    char *base;         /* this rank's mapping */
    size_t bytes, map_bytes;
    char **peer;        /* [size]: every rank's memory mapped here (peer[rank] == base); NULL when
                         * not shared */
} ddp__mem_t;

/* The allocation holding [p, p + bytes), or NULL. Caller's thread. */
ddp__mem_t *ddp__mem_find(const ddp_coll_t *c, const void *p, size_t bytes);

struct ddp_coll {
    const ddp_coll_ops_t *ops;
    int rank, size;
    uint64_t generation;
    char token[128];
    void *impl;
    const char *transport;
    double timeout_s;       /* floor of automatic deadlines */
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* CLOCK_MONOTONIC; broadcast on completion and on failure */
    _Atomic int err;        /* first error, 0 while healthy */
    char errmsg[512];       /* written once, before err is published */
    _Atomic int waiting_on; /* rank the comm thread currently waits for, -1 none */
    _Atomic uint64_t running_seq; /* sequence number of the operation in progress */
    uint64_t next_seq;      /* caller thread */
    ddp_coll_req_t *outstanding; /* caller thread: submitted, not yet waited for */
    _Atomic uint64_t bw_bits;    /* double, bytes/s of the last large operation */
    void *module;           /* dlopen handle of the nccl module, closed after free */
    int shrinks, shrunk;    /* set by the backend's init: see ddp_coll_shrinks/ddp_coll_shrunk */
    ddp__mem_t *mems;       /* caller thread: ddp_coll_mem_alloc's allocations */
    ddp_coll_device_t device; /* host-memory backends: how to stage device buffers (on_device
                               * NULL: none are staged) */
    void **orphans;           /* host copies of failed staged requests, which the stopped
                               * communication thread may still have been writing: freed by
                               * ddp_coll_free, after it stops */
    size_t n_orphans;
    uint64_t next_mem_id;   /* caller thread */
    int next_tag;           /* caller thread: the next operation's bucket (ddp_coll_tag_next) */
    int flight_dumped;      /* caller thread: a timeout's flight dump was written */
    /* A sub-communicator of the two-level all-reduce (hier.c) runs steps of its parent's
     * operations: world_rank[r] is rank r's rank in the parent, which names ranks in its messages
     * and travels in its abort notes (so every rank names the same culprit); NULL for a world,
     * whose numbering is its own. Its operations are not in the flight recorder (the parent's
     * are). port_index: DDP_DATA_PORT + port_index is this rank's data port (a world: its rank). */
    int *world_rank;
    int port_index;
    char algo[64];          /* ddp_coll_algorithm ("" = the backend's name) */
};

/* Rank r of c as its world numbers it (r itself unless c is a sub-communicator); -1 stays -1. */
static inline int ddp__world_rank(const ddp_coll_t *c, int r)
{
    return c->world_rank && r >= 0 && r < c->size ? c->world_rank[r] : r;
}

/* The first-error rule of every backend, written once as a header body because the NCCL module
 * is dlopen()ed and links nothing of the executable's: keeps rc and the message of fmt/ap as
 * c's error when it has none yet, wakes every waiter; returns 1 for the first error, else 0.
 * Any thread. */
static inline int ddp__coll_keep_first(ddp_coll_t *c, int rc, const char *fmt, va_list ap)
{
    pthread_mutex_lock(&c->mu);
    int first = atomic_load(&c->err) == 0;
    if (first) {
        vsnprintf(c->errmsg, sizeof c->errmsg, fmt, ap);
        atomic_store(&c->err, rc);
    }
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    return first;
}

/* Records c's first error (later calls are ignored), wakes every waiter, and calls ops->abort once.
 * Returns the error in force (which may be an earlier one). Any thread. */
int ddp__coll_fail(ddp_coll_t *c, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Marks req done with rc and wakes waiters. Any thread. */
void ddp__coll_complete(ddp_coll_t *c, ddp_coll_req_t *req, int rc);
/* Describes req for messages: "allreduce #12 (26214400 bytes)". */
const char *ddp__req_desc(const ddp_coll_req_t *req, char *buf, size_t len);
/* Sleeps on c->cv until req is done or deadline_ns (0 = forever). Returns 1 done, 0 expired. */
int ddp__coll_sleep_until_done(ddp_coll_t *c, ddp_coll_req_t *req, int64_t deadline_ns);
/* The automatic deadline's length for an operation of `bytes`: max(floor, 8 * bytes / bw). */
int64_t ddp__coll_auto_timeout_ns(ddp_coll_t *c, size_t bytes);
/* Records a measured bandwidth sample. */
void ddp__coll_note_bw(ddp_coll_t *c, size_t bytes, int64_t ns);
/* Fills the common part of c from a bootstrap-like identity. */
void ddp__coll_init_common(ddp_coll_t *c, int rank, int size, uint64_t gen, const char *token,
                           const ddp_coll_opts_t *opts);
/* Allocates a zeroed communicator with its mutex/condvar; NULL on ENOMEM. */
ddp_coll_t *ddp__coll_alloc(void);
/* Forms a sub-communicator of the two-level all-reduce from a bootstrap cut out of the world's
 * (hier.c): as ddp_coll_new with backend "ring", with world_rank (bs->size entries, copied) and
 * the data port index set before the links are made, so that setup errors name world ranks. */
int ddp__coll_new_sub(ddp_coll_bootstrap_t *bs, const ddp_coll_opts_t *opts, const int *world_rank,
                      int port_index, ddp_coll_t **out, ddp_errinfo_t *ei);
/* Submits a step of a two-level operation on sub-communicator c: as ddp_coll_allreduce,
 * _reduce_scatter or _allgather (kind), with the world's slicing and AVG's divisor (0: c's size).
 * Communication thread of c's parent (c's only driver). */
int ddp__coll_submit_step(ddp_coll_t *c, int kind, void *buf, size_t count, ddp_dtype_t dt,
                          ddp_redop_t op, const ddp__slicing_t *slicing, int avg_n,
                          ddp_coll_req_t **req);
/* Sets b->local_rank from every rank's host id (one allgather through b). */
int ddp__bootstrap_learn_hosts(ddp_coll_bootstrap_t *b, int64_t deadline, ddp_errinfo_t *ei);

/* ---- engine: the communication thread of the CPU backends ---------------------------------- */

typedef struct ddp__engine ddp__engine_t;
/* Runs one request to completion on the comm thread: returns 0 or an error (after having called
 * ddp__coll_fail with the named message). Called with req == NULL once after a failure so the
 * backend can tell its peers (on the comm thread, where its transports live). */
typedef int (*ddp__engine_run_fn)(ddp_coll_t *c, ddp_coll_req_t *req);

/* Starts the thread. Returns 0 or -errno / DDP_ENOMEM. Caller's thread. */
int ddp__engine_start(ddp__engine_t **out, ddp_coll_t *c, ddp__engine_run_fn run);
/* Appends req to the queue and wakes the thread (an eventfd write). Caller's thread. */
void ddp__engine_submit(ddp__engine_t *e, ddp_coll_req_t *req);
/* The eventfd the comm thread should also poll (readable on submit, abort and stop). */
int ddp__engine_wakefd(ddp__engine_t *e);
/* Drains the wake eventfd (comm thread). */
void ddp__engine_drain(ddp__engine_t *e);
/* Wakes the comm thread (any thread). */
void ddp__engine_wake(ddp__engine_t *e);
/* True once stop was requested. */
int ddp__engine_stopping(ddp__engine_t *e);
/* Stops and joins the thread; queued requests fail with the communicator's error or EABORTED. */
void ddp__engine_stop(ddp__engine_t *e);

/* Generic wait for engine backends: sleeps until done; on expiry fails c with ETIMEDOUT naming
 * c->waiting_on. */
int ddp__engine_wait(ddp_coll_t *c, ddp_coll_req_t *req, int64_t deadline_ns);

/* ---- reduction kernels (reduce.c) ---------------------------------------------------------- */

/* dst[i] = a[i] + b[i] (then * scale when scale != 1); also written to dst2 when not NULL.
 * bf16: converted to fp32, added, scaled, rounded to nearest even. */
void ddp__reduce(ddp_dtype_t dt, void *dst, void *dst2, const void *a, const void *b, size_t n,
                 float scale);
/* In-place dst[i] *= scale. */
void ddp__scale(ddp_dtype_t dt, void *dst, size_t n, float scale);
float ddp__bf16_to_f32(uint16_t h);
uint16_t ddp__f32_to_bf16(float f);

#endif
