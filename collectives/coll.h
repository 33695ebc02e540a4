/* Collectives: communicators, bootstraps and the backend vtable.
 *
 * A communicator (ddp_coll_t) is a fixed group of `size` ranks that run collectives together.
 * It carries the job token and a generation number; a communicator of an older generation never
 * talks to a newer one (connections present both). It is formed from a bootstrap (how ranks find
 * each other): the environment rendezvous (DDP_RANK, DDP_WORLD_SIZE, DDP_RDZV, DDP_JOB_TOKEN),
 * MPI under mpirun, or a world of one.
 *
 * Backends: "ring" (CPU; shared memory between processes of one host, TCP between hosts),
 * "mpi" (CPU; MPI_Iallreduce, when built with MPI), "nccl" (GPU; a dlopen()ed module), "sim"
 * (tests only: nccl.c itself over a simulated CUDA runtime and NCCL, on the "sim" kernel
 * backend's simulated device memory; a dlopen()ed module built in tests/sim/, never installed;
 * see tests/sim/simdev.h and docs/gpu.md).
 * nccl and sim need device memory of opts.cuda_device; host buffers are staged (nccl.c).
 *
 * Typical use by the reducer (CPU):
 *
 *     ddp_coll_bootstrap_t *bs;  ddp_coll_t *comm;  ddp_errinfo_t ei;
 *     DDP_CHECK(ddp_coll_bootstrap_env(&bs, &ei));          // or _single(), _mpi()
 *     DDP_CHECK(ddp_coll_new(bs, NULL, &comm, &ei));         // NULL opts = defaults ("auto")
 *     ddp_coll_bootstrap_free(bs);                           // comm no longer needs it
 *     for each bucket b (in the same order on every rank):
 *         ddp_coll_allreduce(comm, grads + off[b], n[b], DDP_DT_F32, DDP_OP_AVG, &req[b]);
 *     ... keep computing; the communication thread runs the buckets in submission order ...
 *     rc = ddp_coll_wait_all(comm, 0, &ei);                 // 0 = automatic deadline
 *     if (rc < 0) { log ei.msg ("allreduce #12 (26214400 bytes): rank 3 ..."); re-form. }
 *
 * Deadlines are absolute CLOCK_MONOTONIC nanoseconds (ddp_now_ns() + ...). 0 means automatic:
 * each operation, once it starts on the communication thread, must finish within
 * max(floor, k * bytes / measured bandwidth) (floor: opts.timeout_s or DDP_COLL_TIMEOUT_S, default
 * 30 s; k = 8). When a deadline expires or a peer dies, the communicator is aborted: every pending
 * and later operation fails with the same code and message (DDP_ETIMEDOUT, DDP_EPEER or
 * DDP_EABORTED), the message names the operation and the rank(s) that did not arrive, and the only
 * thing left to do is ddp_coll_free() and forming a new communicator (next generation).
 *
 * Threads: one communicator is driven by one caller thread (submit, test, wait, free, memory),
 * except ddp_coll_abort() and ddp_coll_last_error(), which any thread may call. Callers sleep on a
 * condition variable (futex); the communication thread sleeps in poll() on eventfds and sockets,
 * or, on the shared-memory fast path, spins for a few microseconds before sleeping on a futex.
 *
 * Buffers from ddp_coll_mem_alloc() are the fast path on one host: see there.
 *
 * Two-level all-reduce (ring backend, collectives/hier.c): with H > 1 hosts of R > 1 ranks each
 * (the same R everywhere; a host's ranks contiguous in rank order or not), the ring runs an
 * all-reduce as a reduce-scatter among the ranks of each host (shared memory), an all-reduce of
 * each rank's 1/R part among the ranks of the same local index on every host (TCP), and an
 * all-gather within each host. Each host then sends 2 (H-1)/H of the buffer to other hosts
 * instead of the flat ring's 2 (W-1)/W or more (W = H R ranks): 1.0 against 1.5 buffers for 2 x 2.
 * It is chosen under opts.algo "auto" for exactly that topology and nowhere else: one rank per
 * host, one host, hosts of different sizes and forced TCP keep the flat ring (forced TCP is the
 * setting for measuring the ring itself). Reduce-scatter and all-gather run in two levels too and
 * leave the same slices (ddp_coll_slice) as the flat ring; broadcast, transfer and barrier stay on
 * the flat ring, which a two-level communicator keeps beside its two sub-communicators. Sums are
 * bitwise reproducible for a fixed topology, but not equal to the flat ring's (another order).
 *
 * Test hooks (documented here because the reducer's tests use them):
 *  - opts.chunk_delay_us = N (or DDP_COLL_DELAY_US=N in ddp-worker's environment, which reaches
 *    the ring as a test hook, common/test_hook.h): the ring sleeps N microseconds on its
 *    communication thread before each chunk it sends: an artificially slow transport, on any
 *    transport (the sleep is on the comm thread, so compute threads are unaffected).
 *  - DDP_COLL_TRANSPORT=tcp (or opts.transport = "tcp"): use TCP even between local processes.
 *  - DDP_COLL_ALGO=flat (or opts.algo = "flat"): the flat ring where the two-level all-reduce
 *    would be chosen, for comparison; it must be the same on every rank, like the transport.
 *  - DDP_TEST_HOST_OF_RANK=0,0,1,1 (a test hook, common/test_hook.h; ddp-worker reads it, a
 *    unit test installs it): rank r pretends to run on host number entry r (appended to its host
 *    id), so one machine can stand for several hosts: TCP between them, shared memory within.
 *  - ddp_coll_fake_world_new() + ddp_coll_new_fake(): a ring communicator whose ranks are threads
 *    of one process joined by in-memory links (no sockets, no bootstrap).
 *  - DDP_COLL_CHUNK_KB: ring chunk (slot) size in KiB (default 512).
 */
#ifndef DDP_COLLECTIVES_COLL_H
#define DDP_COLLECTIVES_COLL_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

typedef enum { DDP_DT_F32 = 0, DDP_DT_BF16 = 1 } ddp_dtype_t;
typedef enum { DDP_OP_SUM = 0, DDP_OP_AVG = 1 } ddp_redop_t;

/* Bytes per element of dt (4 or 2). */
static inline size_t ddp_dtype_size(ddp_dtype_t dt) { return dt == DDP_DT_BF16 ? 2 : 4; }

typedef struct ddp_coll ddp_coll_t;
typedef struct ddp_coll_req ddp_coll_req_t;
typedef struct ddp_coll_bootstrap ddp_coll_bootstrap_t;
typedef struct ddp_coll_fake_world ddp_coll_fake_world_t;

/* ---- Bootstrap ------------------------------------------------------------------------------ */

/* A bootstrap's view of the world and its one primitive: an allgather of small blobs. Backends
 * use it during ddp_coll_new() only. */
typedef struct ddp_coll_bootstrap_ops {
    const char *name;
    /* Every rank contributes `len` bytes (the same len everywhere); `all` receives size * len bytes
     * in rank order. Blocks until done or deadline_ns (absolute; 0 = 60 s). */
    int (*allgather)(ddp_coll_bootstrap_t *bs, const void *mine, size_t len, void *all,
                     int64_t deadline_ns, ddp_errinfo_t *ei);
    void (*free)(ddp_coll_bootstrap_t *bs);
} ddp_coll_bootstrap_ops_t;

struct ddp_coll_bootstrap {
    const ddp_coll_bootstrap_ops_t *ops;
    int rank, size;
    uint64_t generation;
    char token[128];     /* the job token (NUL-terminated); presented on every connection */
    char data_host[64];  /* numeric address this rank's data listeners bind to ("" = any) */
    char host_id[160];   /* boot id + hostname; equal ids share memory */
    int local_rank;      /* position among ranks with the same host id, -1 unknown */
};

/* Explicit configuration of the TCP rendezvous (what the environment bootstrap reads). */
typedef struct ddp_coll_rdzv_cfg {
    int rank, size;
    const char *addr;   /* "host:port" of rank 0's rendezvous listener */
    const char *token;  /* job token; required, <= 127 bytes */
    uint64_t generation;
    double timeout_s;   /* how long to wait for everyone (0 = 60 s) */
} ddp_coll_rdzv_cfg_t;

/* TCP rendezvous: rank 0 listens at cfg->addr and accepts size-1 ranks presenting the token and
 * generation; connections that are foreign, malformed or stall (2 s handshake deadline) are
 * refused with a log line and the rendezvous goes on. Everyone learns everyone's data address and
 * host id. On success *out is a new bootstrap owned by the caller (ddp_coll_bootstrap_free).
 * Blocks up to cfg->timeout_s. Any thread. */
int ddp_coll_bootstrap_tcp(const ddp_coll_rdzv_cfg_t *cfg, ddp_coll_bootstrap_t **out,
                           ddp_errinfo_t *ei);
/* The same configured from DDP_RANK, DDP_WORLD_SIZE, DDP_RDZV=host:port, DDP_JOB_TOKEN and
 * optionally DDP_GENERATION and DDP_RDZV_TIMEOUT_S. A world of one when DDP_WORLD_SIZE is unset
 * or 1. DDP_EINVAL with a message naming the variable when one is missing or malformed. */
int ddp_coll_bootstrap_env(ddp_coll_bootstrap_t **out, ddp_errinfo_t *ei);
/* A world of one (rank 0 of 1). */
int ddp_coll_bootstrap_single(ddp_coll_bootstrap_t **out, ddp_errinfo_t *ei);
/* Under mpirun: ranks from MPI_COMM_WORLD (MPI_Init_thread if needed; MPI is finalized at exit by
 * the caller or atexit), host ids from MPI_Comm_split_type(SHARED). DDP_ENOTSUP when built
 * without MPI. Main thread only. */
int ddp_coll_bootstrap_mpi(ddp_coll_bootstrap_t **out, ddp_errinfo_t *ei);
/* True when this process looks launched by mpirun/srun with MPI (OMPI_COMM_WORLD_SIZE, PMI_*). */
int ddp_coll_under_mpi(void);
/* Releases the bootstrap (closes its sockets). NULL-safe. */
void ddp_coll_bootstrap_free(ddp_coll_bootstrap_t *bs);

/* ---- Communicators -------------------------------------------------------------------------- */

/* Device memory for the backends that read and write buffers with the CPU (ring, mpi: their
 * ops table's host_memory), given by the caller whose buffers may be GPU memory. A buffer that
 * on_device says is device memory is staged, as nccl stages host memory: the part of it the
 * operation reads is copied to a host buffer at submit (d2h: it waits for the device work queued
 * before, which therefore needs no ddp_coll_wait_event), the operation runs there, and the part
 * it writes is copied back when the request is waited for (h2d, complete before ddp_coll_wait
 * returns). Slower than NCCL (the copies do not overlap anything): it is for ranks that NCCL
 * cannot run, such as two on one GPU. Calls come from the communicator's caller thread. */
typedef struct ddp_coll_device {
    void *arg;
    int (*on_device)(void *arg, const void *p, size_t bytes);
    int (*d2h)(void *arg, void *dst, const void *src, size_t bytes);
    int (*h2d)(void *arg, void *dst, const void *src, size_t bytes);
} ddp_coll_device_t;

typedef struct ddp_coll_opts {
    const char *backend;   /* "auto" (default: ring on CPU), "ring", "mpi", "nccl" */
    const char *transport; /* ring: "auto" (shm within a host, tcp across), "tcp" */
    /* ring: the all-reduce's algorithm: "auto" (two-level where it sends fewer bytes across
     * hosts, see above), "flat" (one ring over every rank, for comparison), "two-level" (where the
     * topology allows it, else flat with a warning); NULL: DDP_COLL_ALGO, else "auto" */
    const char *algo;
    size_t chunk_bytes;    /* ring slot size; 0 = DDP_COLL_CHUNK_KB or 512 KiB */
    int chunk_delay_us;    /* test hook, see above; 0 = the DDP_HOOK_RING_SEND hook's */
    double timeout_s;      /* floor of automatic deadlines; 0 = DDP_COLL_TIMEOUT_S or 30 s */
    int cuda_device;       /* nccl, sim: the rank's device ordinal (its buffers' device) */
    void *cuda_stream;     /* nccl: cudaStream_t to run on (NULL = the backend's own stream) */
    /* nccl: the previous generation's communicator (NULL: none) and, for each rank of the new
     * one, its rank there (size entries, or NULL when some rank is new). When every rank has one
     * that ddp_coll_shrinks() and was its member, the new communicator is the old one shrunk
     * (ncclCommShrink: no new rendezvous, no new connections); otherwise it is formed afresh.
     * The caller still frees parent, after ddp_coll_new. The other backends ignore both. */
    ddp_coll_t *parent;
    const int *parent_ranks;
    /* ring, mpi: how to stage device memory (see ddp_coll_device_t; copied); NULL: every buffer
     * is host memory. The device backends ignore it. */
    const ddp_coll_device_t *device;
} ddp_coll_opts_t;

/* Forms a communicator of bs->size ranks with the chosen backend. Collective: every rank of the
 * bootstrap must call it. On success *out is owned by the caller (ddp_coll_free); the bootstrap
 * may be freed afterwards. Errors: DDP_ENODEV (backend not available, e.g. no NCCL module),
 * DDP_ETIMEDOUT / DDP_EPEER (a rank did not connect; ei names it), DDP_EINVAL. Caller's thread. */
int ddp_coll_new(ddp_coll_bootstrap_t *bs, const ddp_coll_opts_t *opts, ddp_coll_t **out,
                 ddp_errinfo_t *ei);

/* Starts an in-place all-reduce of buf[0..count) on every rank (same count, dtype and op, same
 * submission order everywhere). buf must stay valid and untouched until the request completes.
 * Cheap: it queues the request and wakes the communication thread; operations complete in
 * submission order. count 0 is allowed. *req is owned by the caller until ddp_coll_wait (which
 * releases it). Errors: DDP_EINVAL, or the communicator's error if it has failed. */
int ddp_coll_allreduce(ddp_coll_t *c, void *buf, size_t count, ddp_dtype_t dt, ddp_redop_t op,
                       ddp_coll_req_t **req);
/* How reduce-scatter and all-gather split a buffer of `count` elements over `size` ranks: rank
 * `rank` owns [*lo, *hi). Slices are consecutive in rank order, start at multiples of
 * DDP_COLL_SLICE_ELEMS elements (so a caller can keep per-block results that do not depend on the
 * number of ranks), and trailing ones may be empty. The single-pass all-reduce splits its work
 * the same way. Pure; any thread. */
#define DDP_COLL_SLICE_ELEMS ((size_t)16384)
static inline void ddp_coll_slice(size_t count, int size, int rank, size_t *lo, size_t *hi)
{
    size_t n = size > 0 ? (size_t)size : 1;
    size_t blocks = (count + DDP_COLL_SLICE_ELEMS - 1) / DDP_COLL_SLICE_ELEMS;
    size_t per = (blocks + n - 1) / n * DDP_COLL_SLICE_ELEMS;
    size_t a = per * (size_t)rank, b = a + per;
    *lo = a < count ? a : count;
    *hi = b < count ? b : count;
}
/* Starts an in-place reduce-scatter: when it completes, this rank's slice of buf (ddp_coll_slice)
 * holds the reduction over every rank's buf; the rest of this rank's buf is left as it was. On
 * the ring it is bitwise what an all-reduce of the same buffer gives there; over NCCL the sum
 * order is NCCL's, which may differ from its all-reduce's with more than two ranks. The ring and
 * nccl take any memory (of the communicator's device, for nccl); over the other backends, with
 * more than one rank, buf must lie in collective memory shared by every rank
 * (ddp_coll_mem_shared; same offset of the same allocation everywhere): DDP_ENOTSUP otherwise
 * (ddp_coll_slices_anywhere says which). Otherwise as ddp_coll_allreduce. */
int ddp_coll_reduce_scatter(ddp_coll_t *c, void *buf, size_t count, ddp_dtype_t dt,
                            ddp_redop_t op, ddp_coll_req_t **req);
/* Starts an in-place all-gather: when it completes, every rank's buf holds each rank's slice
 * (ddp_coll_slice) of that rank's buf. Same conditions as ddp_coll_reduce_scatter. */
int ddp_coll_allgather(ddp_coll_t *c, void *buf, size_t count, ddp_dtype_t dt,
                       ddp_coll_req_t **req);
/* Names the bucket of the next operation submitted on c (its flight recorder record's "bucket",
 * collectives/flight.h); the name lasts for that one operation. Caller's thread. */
void ddp_coll_tag_next(ddp_coll_t *c, int bucket);
/* Whether c's reduce-scatter and all-gather take any memory (1), or only collective memory
 * shared by every rank (0). Any thread. */
int ddp_coll_slices_anywhere(const ddp_coll_t *c);
/* Starts a broadcast of buf[0..bytes) from rank root to all ranks (in submission order). */
int ddp_coll_broadcast(ddp_coll_t *c, void *buf, size_t bytes, int root, ddp_coll_req_t **req);
/* Starts a copy of root's buf[0..bytes) into the buf of each rank r with receivers[r] != 0
 * (`size` entries, the same on every rank; root's own is ignored; NULL: every rank, which is
 * ddp_coll_broadcast). Every rank submits it, in the same order as its other operations. The
 * other ranks never touch their buf, which may be NULL there: on the ring the data travels from
 * root to the last receiver and the ranks between forward it from their slots, the ranks past
 * the last receiver do nothing; NCCL broadcasts it in chunks that such ranks receive into a
 * scratch buffer. This is how a live rank sends its state to a joiner (worker/state_transfer.c)
 * while the other ranks keep computing with theirs. MPI: DDP_ENOTSUP unless receivers is NULL. */
int ddp_coll_transfer(ddp_coll_t *c, void *buf, size_t bytes, int root,
                      const unsigned char *receivers, ddp_coll_req_t **req);
/* Orders the operations submitted after this call after `event`: a device event of the kernel
 * backend whose memory the buffers are (ddp_kernels_ops_t.record_event: a cudaEvent_t recorded
 * on the compute stream for CUDA, a simulated one for "sim"). Backends whose operations run on a
 * device stream (nccl, sim) make that stream wait for the event (cudaStreamWaitEvent) without
 * blocking the caller; a buffer written by queued device work must not be handed to a
 * collective without this. NULL (the CPU backend's synchronous ops) orders nothing and returns
 * 0. A non-NULL event on a backend without device streams (ring, mpi) is DDP_ENOTSUP, unless it
 * stages device memory (opts.device), whose copies already wait for the device. The event is read
 * at the call: its owner may record it again right after. Caller's thread. */
int ddp_coll_wait_event(ddp_coll_t *c, void *event);
/* *done = 1 if req has completed (successfully or not), without blocking. Returns 0, or the
 * request's error once done. A staged device buffer (opts.device) gets its result only in
 * ddp_coll_wait. */
int ddp_coll_test(ddp_coll_req_t *req, int *done);
/* Waits for req until deadline_ns (absolute monotonic ns; 0 = automatic), then releases it.
 * Returns 0 or the error; on error ei (may be NULL) gets the named message. An expired deadline
 * aborts the communicator (DDP_ETIMEDOUT naming the rank waited for). NULL req returns 0. */
int ddp_coll_wait(ddp_coll_req_t *req, int64_t deadline_ns, ddp_errinfo_t *ei);
/* ddp_coll_wait that also reports when the operation ran on the communication thread (absolute
 * monotonic ns; 0 when it never started). start_ns/end_ns may be NULL. */
int ddp_coll_wait_timed(ddp_coll_req_t *req, int64_t deadline_ns, int64_t *start_ns,
                        int64_t *end_ns, ddp_errinfo_t *ei);
/* Waits for and releases every request of c not yet waited for. */
int ddp_coll_wait_all(ddp_coll_t *c, int64_t deadline_ns, ddp_errinfo_t *ei);
/* Blocks until every rank has entered the barrier, or deadline_ns. */
int ddp_coll_barrier(ddp_coll_t *c, int64_t deadline_ns, ddp_errinfo_t *ei);
/* Aborts c from any thread: pending and later operations fail with rc (DDP_EABORTED if 0) and
 * `why`; peers are told (best effort) so they fail fast too. Idempotent; the first error stays. */
void ddp_coll_abort(ddp_coll_t *c, int rc, const char *why);
/* The first error's message ("" while healthy). Valid until ddp_coll_free. Any thread. */
const char *ddp_coll_last_error(const ddp_coll_t *c);
/* 0 while healthy, else the first error code. Any thread. */
int ddp_coll_status(const ddp_coll_t *c);
/* Releases c: stops its thread, closes connections, unmaps segments, frees requests not waited
 * for. Pending operations are aborted first. NULL-safe. Caller's thread. */
void ddp_coll_free(ddp_coll_t *c);

/* Accessors. */
int ddp_coll_rank(const ddp_coll_t *c);
int ddp_coll_size(const ddp_coll_t *c);
uint64_t ddp_coll_generation(const ddp_coll_t *c);
const char *ddp_coll_backend_name(const ddp_coll_t *c);
/* The ring's transport to the next rank: "shm", "tcp", "fake", "self" (or the backend name). */
const char *ddp_coll_transport_name(const ddp_coll_t *c);
/* How the all-reduce runs: "flat ring", "two-level (H hosts x R ranks)" (see above), "single";
 * the backend's name for backends that choose for themselves (nccl, mpi). Any thread. */
const char *ddp_coll_algorithm(const ddp_coll_t *c);
/* Payload bytes this rank has written to its TCP data links since c was formed (a two-level
 * communicator's links of every level): what crosses hosts when TCP is not forced. 0 for
 * backends that do not count. Any thread. */
uint64_t ddp_coll_net_bytes_sent(const ddp_coll_t *c);
/* Measured bus bandwidth of the last large all-reduce in bytes/s (0 if none yet). */
double ddp_coll_bandwidth(const ddp_coll_t *c);
/* 1 when the next generation's communicator can be formed from c (opts.parent; NCCL >= 2.28,
 * which revokes a failed communicator instead of aborting it), so c is worth keeping until then.
 * ddp_coll_shrunk: 1 when c was formed that way. */
int ddp_coll_shrinks(const ddp_coll_t *c);
int ddp_coll_shrunk(const ddp_coll_t *c);

/* ---- Memory for collective buffers -------------------------------------------------------- */

/* Allocates `bytes` of zeroed, page-aligned host memory meant for collective buffers. Collective:
 * every rank calls it with the same bytes, in the same order. On the ring backend, when every rank
 * runs on this host (and TCP is not forced), the memory is shared with the other ranks, and an
 * all-reduce whose buffer lies inside it runs in one pass without the ring's slots: rank r sums
 * the r-th 1/n of the buffer straight from every rank's memory, in rank order, and writes the sum
 * into every rank's memory (half the memory traffic of the ring, two synchronisations instead of
 * 2 (n-1) messages; bitwise reproducible). The buffer must then lie at the same offset of the same
 * allocation on every rank. Elsewhere (other backends, several hosts, no shared /dev/shm) it is
 * plain memory and operations take the usual path. Errors: DDP_ENOMEM, or the communicator's.
 * Caller's thread. */
int ddp_coll_mem_alloc(ddp_coll_t *c, size_t bytes, void **out, ddp_errinfo_t *ei);
/* Releases memory from ddp_coll_mem_alloc (not collective; no operation may still use it).
 * NULL-safe. Caller's thread. */
void ddp_coll_mem_free(ddp_coll_t *c, void *p);
/* 1 when p lies in memory from ddp_coll_mem_alloc that is shared with every rank, else 0. */
int ddp_coll_mem_shared(const ddp_coll_t *c, const void *p);
/* p's place in rank's copy of the same shared allocation, as this process maps it; NULL when p
 * is not in memory shared with every rank. The mapping is this process's own, so it stays
 * readable after that rank's process has ended: how the survivors of a sharded step read a dead
 * rank's slices (worker/train_sharded.c ddp_sharded_from_peers). Caller's thread. */
const void *ddp_coll_mem_peer(const ddp_coll_t *c, const void *p, int rank);

/* ---- In-process fake world (tests) ---------------------------------------------------------- */

/* A world of n ranks that are threads of this process, joined by in-memory links. */
int ddp_coll_fake_world_new(int n, ddp_coll_fake_world_t **out);
/* Rank `rank`'s ring communicator over the fake world. Each rank calls it from its own thread;
 * it does not wait for the others. opts as for ddp_coll_new (chunk_delay_us is honoured). */
int ddp_coll_new_fake(ddp_coll_fake_world_t *w, int rank, const ddp_coll_opts_t *opts,
                      ddp_coll_t **out);
/* Frees the world after every communicator on it is freed. A world serves one communicator per
 * rank (its links keep their counters): make a new world for the next set. NULL-safe. */
void ddp_coll_fake_world_free(ddp_coll_fake_world_t *w);

/* ---- Backend vtable ------------------------------------------------------------------------- */

struct ddp__mem; /* an allocation of ddp_coll_mem_alloc (coll_impl.h) */

/* One instance per backend, const, designated initialisers. Callers use the ddp_coll_* wrappers,
 * which validate arguments, never these members. */
typedef struct ddp_coll_ops {
    const char *name;
    /* 0 = unusable here; higher wins under "auto". */
    int (*probe)(void);
    /* 1: reduce-scatter and all-gather work on any memory; 0: only on collective memory shared
     * by every rank (the single pass over it) */
    int slices_anywhere;
    /* 1: buffers are host memory that the CPU reads and writes (ring, mpi); device memory is
     * staged through ddp_coll_opts_t.device */
    int host_memory;
    /* Fills c->impl (and c->transport) from the bootstrap; collective. */
    int (*init)(ddp_coll_t *c, ddp_coll_bootstrap_t *bs, const ddp_coll_opts_t *opts,
                ddp_errinfo_t *ei);
    /* Queues req (kind, buf, count... filled in by the wrapper). Must not block. */
    int (*submit)(ddp_coll_t *c, ddp_coll_req_t *req);
    /* Blocks until req is done or deadline_ns; returns req's result (and aborts c on expiry). */
    int (*wait)(ddp_coll_t *c, ddp_coll_req_t *req, int64_t deadline_ns);
    /* Nonblocking completion check: 1 done, 0 not yet. */
    int (*test)(ddp_coll_t *c, ddp_coll_req_t *req);
    /* Optional: makes later operations wait for a device event (ddp_coll_wait_event). */
    int (*wait_event)(ddp_coll_t *c, void *event);
    /* Tells the peers and wakes every waiter; called once, with c's error already recorded.
     * Any thread, also while the caller's thread is inside submit, test or wait. */
    void (*abort)(ddp_coll_t *c);
    /* Releases c->impl. */
    void (*free)(ddp_coll_t *c);
    /* Optional; collective: maps m->map_bytes of memory shared with every rank, setting m->base
     * and m->peer, or leaves m->base NULL for plain anonymous memory (mapped by the caller). The
     * caller unmaps m->base; mem_unmap releases the rest (the peers' mappings). */
    int (*mem_map)(ddp_coll_t *c, struct ddp__mem *m, ddp_errinfo_t *ei);
    void (*mem_unmap)(ddp_coll_t *c, struct ddp__mem *m);
    /* Optional: payload bytes written to TCP links so far (ddp_coll_net_bytes_sent). Any thread. */
    uint64_t (*net_bytes)(const ddp_coll_t *c);
} ddp_coll_ops_t;

extern const ddp_coll_ops_t ddp_coll_ring_ops;
extern const ddp_coll_ops_t ddp_coll_mpi_ops; /* probe() returns 0 when built without MPI */

#endif
