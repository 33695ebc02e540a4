/* A simulated CUDA runtime: the subset that collectives/nccl.c uses, over simdev.h here.
 *
 * collectives/nccl.c is compiled a second time with this folder first on the include path, so
 * `#include <cuda_runtime_api.h>` and `#include <nccl.h>` find these files; every name maps to a
 * ddp_sim_ symbol (sim_runtime.c), so nothing here can be mistaken for the real runtime by the
 * dynamic linker. Streams are simdev streams, events simdev events (the "sim" kernel backend's
 * record_event gives one), device memory simdev memory of the thread's current device
 * (cudaSetDevice, per thread as in CUDA). Test hooks: DDP_SIM_FAIL=cudaEventRecord or
 * cudaEventQuery makes every such call fail (cudaErrorLaunchFailure).
 */
#ifndef DDP_TESTS_SIM_CUDA_RUNTIME_API_H
#define DDP_TESTS_SIM_CUDA_RUNTIME_API_H

#include <stddef.h>

#include "tests/sim/simdev.h"

typedef enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchFailure = 719,
} cudaError_t;

typedef ddp_simdev_stream_t *cudaStream_t;
typedef ddp_simdev_event_t *cudaEvent_t;

enum cudaMemoryType {
    cudaMemoryTypeUnregistered = 0,
    cudaMemoryTypeHost = 1,
    cudaMemoryTypeDevice = 2,
    cudaMemoryTypeManaged = 3,
};
struct cudaPointerAttributes {
    enum cudaMemoryType type;
    int device;
    void *devicePointer, *hostPointer;
};
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
};
#define cudaStreamNonBlocking 0x01
#define cudaEventDisableTiming 0x02

#define cudaGetDeviceCount ddp_sim_cudaGetDeviceCount
#define cudaSetDevice ddp_sim_cudaSetDevice
#define cudaGetErrorString ddp_sim_cudaGetErrorString
#define cudaGetLastError ddp_sim_cudaGetLastError
#define cudaStreamCreateWithFlags ddp_sim_cudaStreamCreateWithFlags
#define cudaStreamDestroy ddp_sim_cudaStreamDestroy
#define cudaStreamSynchronize ddp_sim_cudaStreamSynchronize
#define cudaStreamWaitEvent ddp_sim_cudaStreamWaitEvent
#define cudaEventCreateWithFlags ddp_sim_cudaEventCreateWithFlags
#define cudaEventRecord ddp_sim_cudaEventRecord
#define cudaEventQuery ddp_sim_cudaEventQuery
#define cudaEventDestroy ddp_sim_cudaEventDestroy
#define cudaPointerGetAttributes ddp_sim_cudaPointerGetAttributes
#define cudaMalloc ddp_sim_cudaMalloc
#define cudaFree ddp_sim_cudaFree
#define cudaMallocHost ddp_sim_cudaMallocHost
#define cudaFreeHost ddp_sim_cudaFreeHost
#define cudaMemcpyAsync ddp_sim_cudaMemcpyAsync

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaSetDevice(int dev);
const char *cudaGetErrorString(cudaError_t e);
cudaError_t cudaGetLastError(void);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned flags);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned flags);
cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s);
cudaError_t cudaEventQuery(cudaEvent_t ev);
cudaError_t cudaEventDestroy(cudaEvent_t ev);
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p);
cudaError_t cudaMalloc(void **p, size_t bytes);
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t bytes);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                            cudaStream_t s);

#endif
