/* A simulated GPU for tests: device memory, streams, events, and a checker of their ordering.
 *
 * The "sim" kernel backend (kernels_sim.c here) and the simulated CUDA runtime and NCCL that
 * collectives/nccl.c is compiled against for the "sim" collectives backend (sim_runtime.c,
 * nccl.h, cuda_runtime_api.h here) are built on it, so the GPU's hazards fail on the CPU:
 *
 * - Device memory comes from its own allocator and is tagged with its device id. Between ops it
 *   is mapped PROT_NONE: the host touching it (instead of going through a copy op) faults.
 *   While any op runs, all of it is readable and writable (mprotect is per process), so the
 *   protection catches host accesses between ops, which is where a host loop would make them.
 * - A stream is a thread with a FIFO queue: an op is queued by ddp_simdev_launch and runs later
 *   (DDP_SIM_DELAY_US=N delays every op by N us on purpose), in order on its stream; streams run
 *   concurrently.
 * - Ordering is tracked with vector clocks, independently of how the threads happened to run,
 *   so a missing dependency is reported every time, not only when the race shows: an op
 *   launched on stream S that reads or writes bytes that a queued op of another stream S'
 *   writes (or writes bytes that one reads) is a hazard unless S is known to run after that op:
 *   through an event recorded on S' after it and waited for on S (ddp_simdev_stream_wait_event),
 *   or because the host had seen it complete (stream sync, event query) before launching.
 *   A hazard is logged naming both ops, counted (ddp_simdev_hazards) and returned as
 *   DDP_EHAZARD by the launch; the op still runs, as it would on a GPU.
 * - Every access an op declares must lie in device memory of its stream's device, except those
 *   marked DDP_SIMDEV_HOST (the host side of a copy), which must not be device memory.
 * - A reservation (ddp_simdev_reserve) is device memory cut into granules that are committed
 *   and decommitted one by one, as the CUDA driver maps physical memory into a reserved
 *   address range: an op that declares an access to a granule not committed is a hazard (a
 *   GPU faults on the unmapped address), and so is a decommit of a granule that an op the
 *   host does not know complete still uses.
 *
 * Threads: every function may be called from any thread; one mutex guards the state.
 * Test-only, and out of the production libraries (tests/sim/meson.build): this file and
 * sim_runtime.c form libddp_sim.so, the ONE simulated device of a process, which both "sim"
 * modules (ddp_kernels_sim.so, ddp_coll_sim.so) and the tests that ask it about hazards link,
 * so the checker sees the compute stream and the NCCL stream together.
 */
#ifndef DDP_TESTS_SIM_SIMDEV_H
#define DDP_TESTS_SIM_SIMDEV_H

#include <stddef.h>
#include <stdint.h>

#define DDP_SIMDEV_MAX_STREAMS 64
#define DDP_SIMDEV_PINNED (-3) /* "device" of pinned host memory (ddp_simdev_alloc) */
#define DDP_SIMDEV_HOST (-1)   /* what ddp_simdev_device_of says of any other host memory */

typedef struct ddp_simdev_stream ddp_simdev_stream_t;

/* An event: the point of one stream after the ops queued before its record. */
typedef struct ddp_simdev_event {
    int stream; /* -1 while never recorded (waiting for it orders nothing, queries say done) */
    uint64_t seq;
    uint64_t clock[DDP_SIMDEV_MAX_STREAMS];
} ddp_simdev_event_t;

enum { DDP_SIMDEV_R = 1, DDP_SIMDEV_W = 2, DDP_SIMDEV_RW = 3, DDP_SIMDEV_HOSTSIDE = 4 };

/* One range an op reads and/or writes. */
typedef struct ddp_simdev_access {
    const void *p;
    size_t bytes;
    int mode; /* DDP_SIMDEV_R / W / RW, | DDP_SIMDEV_HOSTSIDE for host memory */
} ddp_simdev_access_t;

/* Zero-filled memory of `device` (>= 0), or pinned host memory (DDP_SIMDEV_PINNED, never
 * protected). Returns 0, DDP_ENOMEM or DDP_EINVAL. */
int ddp_simdev_alloc(int device, size_t bytes, void **out);
/* Frees memory of ddp_simdev_alloc; the caller has synchronised with every op that uses it.
 * NULL-safe; other pointers are logged and ignored. */
void ddp_simdev_free(void *p);
/* An address range of `bytes` of device memory of `device` (>= 0) cut into granules of
 * `granule` bytes (a power of two, a multiple of the page size) counted from its start, the
 * last one ending with the range; none committed. ddp_simdev_free releases it all.
 * Returns 0, DDP_ENOMEM or DDP_EINVAL. */
int ddp_simdev_reserve(int device, size_t bytes, size_t granule, void **out);
/* Commits every granule that [p, p + bytes) touches: those not committed before read zero,
 * the others keep their contents. Returns 0, or DDP_EINVAL when the range does not lie inside
 * one reservation. */
int ddp_simdev_commit(const void *p, size_t bytes);
/* Decommits the granules lying wholly inside [p, p + bytes) and gives their pages back; the
 * others keep their contents. Returns 0, DDP_EINVAL (logged) when the range does not lie
 * inside one reservation, or DDP_EHAZARD (logged and counted) when an op that the host does not
 * know complete accesses one of them (it is decommitted all the same). */
int ddp_simdev_decommit(const void *p, size_t bytes);
/* The device of [p, p + bytes): its id, DDP_SIMDEV_PINNED, DDP_SIMDEV_HOST for memory the
 * simulator does not own, or -2 when the range starts in an allocation and leaves it. */
int ddp_simdev_device_of(const void *p, size_t bytes);
/* The end of the allocation holding p (for ops whose extent the arguments do not give), or p. */
const void *ddp_simdev_end_of(const void *p);

/* A stream of `device` named `name` (for messages). Returns 0, DDP_ENOMEM, DDP_EBUSY (all
 * DDP_SIMDEV_MAX_STREAMS in use) or -errno. */
int ddp_simdev_stream_new(int device, const char *name, ddp_simdev_stream_t **out);
/* Waits for the stream's ops, stops its thread, frees it. NULL-safe. */
void ddp_simdev_stream_free(ddp_simdev_stream_t *s);
int ddp_simdev_stream_device(const ddp_simdev_stream_t *s);

typedef void (*ddp_simdev_fn)(void *arg);
/* Queues fn(arg) on s, then free(arg) (the stream takes ownership of arg, which must come from
 * malloc). `what` names the op in messages (a static string). acc[0..nacc) are the ranges it
 * reads and writes. Returns 0, or DDP_EHAZARD after logging a hazard or a range on the wrong
 * device (the op is queued all the same), or DDP_ENOMEM (then fn does not run). */
int ddp_simdev_launch(ddp_simdev_stream_t *s, const char *what, ddp_simdev_fn fn, void *arg,
                      const ddp_simdev_access_t *acc, int nacc);
/* The checks of ddp_simdev_launch without queuing anything: 0, or DDP_EHAZARD (logged and
 * counted). For callers that refuse an op rather than let it race. */
int ddp_simdev_check(ddp_simdev_stream_t *s, const char *what, const ddp_simdev_access_t *acc,
                     int nacc);
/* Blocks until every op queued on s so far has run; the host then knows them complete. */
void ddp_simdev_stream_sync(ddp_simdev_stream_t *s);
/* Records ev on s after the ops queued so far (cudaEventRecord). */
void ddp_simdev_event_record(ddp_simdev_event_t *ev, ddp_simdev_stream_t *s);
/* Makes later ops of s wait for ev (cudaStreamWaitEvent), without blocking the caller; ev is
 * read now. */
void ddp_simdev_stream_wait_event(ddp_simdev_stream_t *s, const ddp_simdev_event_t *ev);
/* 1 when the ops before ev have run (the host then knows them complete), else 0. */
int ddp_simdev_event_query(const ddp_simdev_event_t *ev);

/* Hazards reported since the process started, and the last one's message ("" if none). */
uint64_t ddp_simdev_hazards(void);
void ddp_simdev_last_hazard(char *buf, size_t len);

#endif
