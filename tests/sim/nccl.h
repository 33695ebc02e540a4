/* A simulated NCCL: the subset that collectives/nccl.c uses (see cuda_runtime_api.h here).
 *
 * A communicator is an inner "ring" communicator of the collectives library, formed by a TCP
 * rendezvous at the address that rank 0's ncclGetUniqueId put in the id (127.0.0.1, a free
 * port). Operations are queued on the caller's simulated stream and run inner all-reduces or
 * broadcasts there; they check that the buffer is device memory of the communicator's device
 * (the device current when it was created) and declare the buffer to the simulator, which
 * reports a hazard with queued work of other streams: such an operation is refused
 * (ncclInvalidUsage, the hazard as ncclGetLastError) rather than raced, where a GPU would give
 * wrong sums silently. Semantics kept from NCCL: nonblocking
 * communicators (blocking = 0) return ncclInProgress and are polled with
 * ncclCommGetAsyncError; ncclCommAbort frees the communicator; ncclCommFinalize completes only
 * when every rank finalizes; ncclCommDestroy of a communicator that was not finalized waits for
 * every rank, without a deadline, as a real one can hang on a dead peer.
 * Misuse that NCCL would punish with a crash or a hang is counted as a violation and logged
 * (sim.h here): a call on a communicator after ncclCommAbort/Destroy, and
 * ncclCommAbort while another thread is inside a call on the same communicator. Test hook:
 * DDP_SIM_NCCL_CALL_US=N makes every call stay N us inside (so such races show).
 */
#ifndef DDP_TESTS_SIM_NCCL_H
#define DDP_TESTS_SIM_NCCL_H

#include <stddef.h>

#include "cuda_runtime_api.h"

#define DDP_SIM_NCCL 1 /* what collectives/nccl.c is compiled against */
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
} ncclResult_t;

typedef enum { ncclUint8 = 1, ncclFloat32 = 7, ncclBfloat16 = 9 } ncclDataType_t;
typedef enum { ncclSum = 0, ncclAvg = 4 } ncclRedOp_t;
typedef struct ddp_sim_nccl_comm *ncclComm_t;
typedef struct {
    char internal[128];
} ncclUniqueId;
typedef struct {
    int blocking;
} ncclConfig_t;
#define NCCL_CONFIG_INITIALIZER {1}

#define ncclGetUniqueId ddp_sim_ncclGetUniqueId
#define ncclCommInitRankConfig ddp_sim_ncclCommInitRankConfig
#define ncclCommGetAsyncError ddp_sim_ncclCommGetAsyncError
#define ncclGetErrorString ddp_sim_ncclGetErrorString
#define ncclGetLastError ddp_sim_ncclGetLastError
#define ncclAllReduce ddp_sim_ncclAllReduce
#define ncclReduce ddp_sim_ncclReduce
#define ncclReduceScatter ddp_sim_ncclReduceScatter
#define ncclAllGather ddp_sim_ncclAllGather
#define ncclBroadcast ddp_sim_ncclBroadcast
#define ncclGroupStart ddp_sim_ncclGroupStart
#define ncclGroupEnd ddp_sim_ncclGroupEnd
#define ncclCommAbort ddp_sim_ncclCommAbort
#define ncclCommFinalize ddp_sim_ncclCommFinalize
#define ncclCommDestroy ddp_sim_ncclCommDestroy
#define ncclCommRevoke ddp_sim_ncclCommRevoke
#define ncclCommShrink ddp_sim_ncclCommShrink

/* Writes "127.0.0.1:PORT" (a port free a moment ago) into id: rank 0's rendezvous. */
ncclResult_t ncclGetUniqueId(ncclUniqueId *id);
/* A communicator on the calling thread's current device, formed by a thread (TCP rendezvous at
 * id, then an inner ring communicator). blocking = 0: returns ncclInProgress at once (poll
 * ncclCommGetAsyncError); else waits and returns the outcome. *comm is set either way. */
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *cfg);
/* *state: ncclInProgress, ncclSuccess or the first error of the communicator. */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *state);
const char *ncclGetErrorString(ncclResult_t r);
/* The communicator's last error message (thread-local copy, valid until the next call). */
const char *ncclGetLastError(ncclComm_t comm);
/* In place only (send == recv). Queues the inner all-reduce (broadcast: count bytes of
 * ncclUint8) on stream after the checks described above; the error is then the return value
 * and ncclGetLastError; a failure while it runs becomes the communicator's async error. */
ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t dt,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t dt,
                           int root, ncclComm_t comm, cudaStream_t stream);
/* In place only (send == recv): root's buffer gets the reduction, the others' are only read.
 * Runs as an inner all-reduce of a copy, kept at the root. */
ncclResult_t ncclReduce(const void *send, void *recv, size_t count, ncclDataType_t dt,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
/* In place only, as NCCL defines it: recv == send + rank * recvcount elements. Runs as an inner
 * all-reduce of a copy of the whole send buffer (so the slice is bitwise what ncclAllReduce of
 * that buffer gives), of which recv keeps its slice; the rest of send is left as it was. */
ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, ncclDataType_t dt,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
/* In place only: send == recv + rank * sendcount elements. Runs as one inner broadcast per
 * rank's slice, from that rank. */
ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t dt,
                           ncclComm_t comm, cudaStream_t stream);
/* A group only batches calls on a GPU; here each call is queued as it is made, in order, so
 * both return ncclSuccess. */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);
/* Aborts the inner communicator (peers are told), waits for the queued operations, frees comm.
 * A violation when another thread is inside a call on comm, or comm is gone. */
ncclResult_t ncclCommAbort(ncclComm_t comm);
/* Starts a barrier of every rank on a thread: ncclInProgress until it completes. */
ncclResult_t ncclCommFinalize(ncclComm_t comm);
/* Frees comm; without a finalize first, waits for every rank's destroy with no deadline. */
ncclResult_t ncclCommDestroy(ncclComm_t comm);
/* Stops comm's operations (the inner communicator is aborted; peers are told) and keeps it for a
 * shrink: its state is ncclInProgress until its queued operations have ended, then ncclSuccess.
 * An operation or a finalize on a revoked communicator is a violation (NCCL: invalid). */
ncclResult_t ncclCommRevoke(ncclComm_t comm, int flags);
/* A communicator of parent's ranks less the `n` in `excluded`, numbered in order, formed like an
 * init (nonblocking per cfg) at a rendezvous that parent's ranks agreed on when it formed (each
 * picked a free port then; the lowest kept rank's is used). Violations: a revoked parent that is
 * not quiescent yet, a healthy one with queued operations and NCCL_SHRINK_DEFAULT, an excluded
 * rank calling it. NCCL_SHRINK_ABORT on a healthy parent aborts its inner communicator first. */
ncclResult_t ncclCommShrink(ncclComm_t parent, int *excluded, int n, ncclComm_t *out,
                            ncclConfig_t *cfg, int flags);

#endif
