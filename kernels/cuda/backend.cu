/* The CUDA kernel backend: its ops table, the module entry point, contexts and memory.
 *
 * Built as the shared module ddp_kernels_cuda.so, dlopen()ed by ddp_kernels_open("cuda");
 * the only exported symbol is ddp_kernels_module() (DDP_KERNELS_MODULE_SYMBOL).
 *
 * - probe: 0 when the runtime reports no device (cudaGetDeviceCount fails, e.g. with
 *   cudaErrorInsufficientDriver when no driver is installed, or finds none), 10 otherwise.
 * - A context: the device made current, a non-blocking stream, a cuBLAS handle on it and a
 *   cuBLASLt handle. fp32 matmuls are plain fp32 (DDP_CUDA_TF32=1 in the environment lets
 *   cuBLAS use TF32 tensor cores); bf16/fp16 runs multiply on tensor cores (matmul.cu).
 * - alloc: cudaMalloc, zero-filled when it returns; free waits for the queued ops first.
 *   Sparse arenas (reserve/commit/decommit) are sparse.cu's; free releases them too.
 *   memcpy_h2d/d2h return when the copy is complete (the host buffer may be reused at once);
 *   memcpy_d2d and memset0 are queued on the stream.
 * - Errors: every CUDA/cuBLAS failure is logged with its original message and mapped to
 *   DDP_ECUDA; ops keep the first one for ddp_k_sync().
 * - Profiling marks (timer_*): cudaEvents with timing, recorded on the compute stream, created
 *   on first need and reused after each timer_reset; close destroys them.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/kcuda.cuh"

int ddp__cuda_check(ddp_kctx_t *ctx, cudaError_t e, const char *what)
{
    if (e == cudaSuccess) return 0;
    DDP_ERROR("cuda: %s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
    if (ctx && ctx->err == 0) ctx->err = DDP_ECUDA;
    return DDP_ECUDA;
}

int ddp__cublas_check(ddp_kctx_t *ctx, cublasStatus_t s, const char *what)
{
    if (s == CUBLAS_STATUS_SUCCESS) return 0;
    DDP_ERROR("cublas: %s: %s (%s)", what, cublasGetStatusString(s), cublasGetStatusName(s));
    if (ctx && ctx->err == 0) ctx->err = DDP_ECUDA;
    return DDP_ECUDA;
}

int ddp__cuda_launched(ddp_kctx_t *ctx, const char *what)
{
    return ddp__cuda_check(ctx, cudaGetLastError(), what);
}

int ddp__cuda_enter(ddp_kctx_t *ctx)
{
    int cur = -1;
    cudaError_t e = cudaGetDevice(&cur);
    if (e == cudaSuccess && cur == ctx->device) return 0;
    return ddp__cuda_check(ctx, cudaSetDevice(ctx->device), "cudaSetDevice");
}

int ddp__cuda_scratch(ddp_kctx_t *ctx, size_t bytes, void **out)
{
    if (bytes <= ctx->scratch_bytes) {
        *out = ctx->scratch;
        return 0;
    }
    if (ctx->scratch) {
        /* Queued ops may still use the old buffer. */
        ddp__cuda_check(ctx, cudaStreamSynchronize(ctx->stream), "cudaStreamSynchronize");
        ddp__cuda_check(ctx, cudaFree(ctx->scratch), "cudaFree(scratch)");
        ctx->scratch = NULL;
        ctx->scratch_bytes = 0;
    }
    /* Round up so that a slowly growing size does not reallocate on every call. */
    size_t want = bytes + bytes / 4;
    void *p = NULL;
    int rc = ddp__cuda_check(ctx, cudaMalloc(&p, want), "cudaMalloc(scratch)");
    if (rc) return rc;
    ctx->scratch = p;
    ctx->scratch_bytes = want;
    *out = p;
    return 0;
}

static int cuda_probe(void)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        DDP_DEBUG("cuda: unusable: cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e),
                  cudaGetErrorName(e));
        cudaGetLastError(); /* clear it, so it does not surface in a later call */
        return 0;
    }
    if (n == 0) DDP_DEBUG("cuda: unusable: no CUDA device");
    return n > 0 ? 10 : 0;
}

static int cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

static void cuda_close(ddp_kctx_t *ctx)
{
    if (!ctx) return;
    cudaSetDevice(ctx->device);
    if (ctx->stream) cudaStreamSynchronize(ctx->stream);
    if (ctx->blas) cublasDestroy(ctx->blas);
    if (ctx->lt) cublasLtDestroy(ctx->lt);
    if (ctx->lt_ws) cudaFree(ctx->lt_ws);
    free(ctx->lt_plans);
    ddp__cuda_lowp_free(ctx);
    ddp__cuda_sparse_close(ctx);
    if (ctx->scratch) cudaFree(ctx->scratch);
    if (ctx->flag) cudaFree(ctx->flag);
    if (ctx->pinned) cudaFreeHost(ctx->pinned);
    if (ctx->order) cudaEventDestroy(ctx->order);
    for (int i = 0; i < DDP_CUDA_STAGES; i++) {
        if (ctx->stage[i].buf) cudaFreeHost(ctx->stage[i].buf);
        if (ctx->stage[i].done) cudaEventDestroy(ctx->stage[i].done);
    }
    for (int i = 0; i < ctx->n_marks; i++) cudaEventDestroy(ctx->marks[i]);
    free(ctx->marks);
    if (ctx->stream) cudaStreamDestroy(ctx->stream);
    free(ctx);
}

static int cuda_init(ddp_kctx_t **out, int device, int threads)
{
    (void)threads; /* the GPU decides its own parallelism */
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        if (e != cudaSuccess) {
            DDP_ERROR("cuda: cudaGetDeviceCount: %s (%s)", cudaGetErrorString(e),
                      cudaGetErrorName(e));
            cudaGetLastError();
        }
        return DDP_ENODEV;
    }
    if (device < 0 || device >= n) {
        DDP_ERROR("cuda: device %d does not exist (%d present)", device, n);
        return DDP_ENODEV;
    }
    ddp_kctx_t *ctx = (ddp_kctx_t *)calloc(1, sizeof(*ctx));
    if (!ctx) return DDP_ENOMEM;
    ctx->device = device;
    int rc = 0;
    DDP_CHECK_GOTO(ddp__cuda_check(ctx, cudaSetDevice(device), "cudaSetDevice"), rc, fail);
    {
        int optin = 0;
        DDP_CHECK_GOTO(ddp__cuda_check(ctx,
                                       cudaDeviceGetAttribute(
                                           &optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
                                       "cudaDeviceGetAttribute"),
                       rc, fail);
        ctx->smem_optin = (size_t)optin;
    }
    DDP_CHECK_GOTO(ddp__cuda_check(ctx,
                                   cudaStreamCreateWithFlags(&ctx->stream,
                                                             cudaStreamNonBlocking),
                                   "cudaStreamCreate"),
                   rc, fail);
    DDP_CHECK_GOTO(ddp__cublas_check(ctx, cublasCreate(&ctx->blas), "cublasCreate"), rc, fail);
    DDP_CHECK_GOTO(ddp__cublas_check(ctx, cublasSetStream(ctx->blas, ctx->stream),
                                     "cublasSetStream"),
                   rc, fail);
    DDP_CHECK_GOTO(ddp__cublas_check(ctx, cublasLtCreate(&ctx->lt), "cublasLtCreate"), rc, fail);
    {
        const char *tf32 = getenv("DDP_CUDA_TF32");
        cublasMath_t mode = (tf32 && strcmp(tf32, "1") == 0) ? CUBLAS_TF32_TENSOR_OP_MATH
                                                             : CUBLAS_DEFAULT_MATH;
        if (mode != CUBLAS_DEFAULT_MATH) DDP_INFO("cuda: TF32 matmuls enabled (DDP_CUDA_TF32)");
        DDP_CHECK_GOTO(ddp__cublas_check(ctx, cublasSetMathMode(ctx->blas, mode),
                                         "cublasSetMathMode"),
                       rc, fail);
    }
    DDP_CHECK_GOTO(ddp__cuda_check(ctx, cudaMalloc((void **)&ctx->flag, sizeof(int)),
                                   "cudaMalloc"),
                   rc, fail);
    DDP_CHECK_GOTO(ddp__cuda_check(ctx, cudaMallocHost(&ctx->pinned, 16), "cudaMallocHost"),
                   rc, fail);
    DDP_CHECK_GOTO(ddp__cuda_check(ctx, cudaEventCreateWithFlags(&ctx->order,
                                                                 cudaEventDisableTiming),
                                   "cudaEventCreate"),
                   rc, fail);
    {
        cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
            snprintf(ctx->device_name, sizeof ctx->device_name, "%s", prop.name);
            DDP_INFO("cuda: device %d: %s, sm_%d%d, %.1f GiB", device, prop.name, prop.major,
                     prop.minor, (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
        }
    }
    ctx->err = 0;
    *out = ctx;
    return 0;
fail:
    cuda_close(ctx);
    return rc;
}

static int cuda_alloc(ddp_kctx_t *ctx, void **out, size_t bytes)
{
    *out = NULL;
    if (bytes == 0) return 0;
    DDP_CHECK(ddp__cuda_enter(ctx));
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        cudaGetLastError(); /* an allocation failure is not sticky: keep ctx usable */
        DDP_ERROR("cuda: cudaMalloc(%zu bytes): %s", bytes, cudaGetErrorString(e));
        return e == cudaErrorMemoryAllocation ? DDP_ENOMEM : DDP_ECUDA;
    }
    /* Zeroed before returning, so that any stream (NCCL's too) may use the memory at once. */
    int rc = ddp__cuda_check(ctx, cudaMemsetAsync(p, 0, bytes, ctx->stream), "cudaMemsetAsync");
    if (rc == 0)
        rc = ddp__cuda_check(ctx, cudaStreamSynchronize(ctx->stream), "cudaStreamSynchronize");
    if (rc) {
        cudaFree(p);
        return rc;
    }
    *out = p;
    return 0;
}

static void cuda_free(ddp_kctx_t *ctx, void *p)
{
    if (!p) return;
    if (ddp__cuda_enter(ctx)) return;
    /* Queued ops may still use p (cudaFree alone does not promise to wait for them). */
    ddp__cuda_check(ctx, cudaStreamSynchronize(ctx->stream), "cudaStreamSynchronize");
    if (!ddp__cuda_sparse_free(ctx, p)) ddp__cuda_check(ctx, cudaFree(p), "cudaFree");
}

/* The driver's view of p (cudaPointerGetAttributes; the VMM arenas of sparse.cu are device
 * memory once mapped); bytes is not checked further. */
static int cuda_on_device(ddp_kctx_t *ctx, const void *p, size_t bytes)
{
    (void)bytes;
    struct cudaPointerAttributes a;
    memset(&a, 0, sizeof a);
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError(); /* plain host memory on old runtimes: not sticky */
        return 0;
    }
    return a.type == cudaMemoryTypeDevice && a.device == ctx->device;
}

static int cuda_copy(ddp_kctx_t *ctx, void *dst, const void *src, size_t bytes,
                     cudaMemcpyKind kind, int wait, const char *what)
{
    if (bytes == 0) return 0;
    DDP_CHECK(ddp__cuda_enter(ctx));
    DDP_CHECK(ddp__cuda_check(ctx, cudaMemcpyAsync(dst, src, bytes, kind, ctx->stream), what));
    if (wait) DDP_CHECK(ddp__cuda_check(ctx, cudaStreamSynchronize(ctx->stream), what));
    return 0;
}

/* Queues dst = src through the next staging buffer: src is copied into pinned memory at once, and
 * the device copy from there is ordered on the stream without draining it (a copy from pageable
 * memory synchronises the stream first: CUDA's API notes on memcpy behaviour). The buffer is
 * reused once its previous copy is done: STAGES copies later, long finished in a training step.
 * DDP_ENOMEM when pinned memory cannot be had (the caller copies the plain way). */
static int staged_h2d(ddp_kctx_t *ctx, void *dst, const void *src, size_t bytes)
{
    int i = ctx->stage_next;
    const char *what = "memcpy_h2d";
    if (ctx->stage[i].done)
        DDP_CHECK(ddp__cuda_check(ctx, cudaEventSynchronize(ctx->stage[i].done), what));
    else
        DDP_CHECK(ddp__cuda_check(ctx, cudaEventCreateWithFlags(&ctx->stage[i].done,
                                                                cudaEventDisableTiming),
                                  what));
    if (ctx->stage[i].cap < bytes) {
        size_t cap = (size_t)64 << 10;
        while (cap < bytes) cap *= 2;
        if (ctx->stage[i].buf) cudaFreeHost(ctx->stage[i].buf);
        ctx->stage[i].buf = NULL;
        ctx->stage[i].cap = 0;
        if (cudaMallocHost(&ctx->stage[i].buf, cap) != cudaSuccess) {
            cudaGetLastError(); /* not sticky: the plain copy goes on */
            ctx->stage[i].buf = NULL;
            return DDP_ENOMEM;
        }
        ctx->stage[i].cap = cap;
    }
    memcpy(ctx->stage[i].buf, src, bytes);
    DDP_CHECK(ddp__cuda_check(ctx, cudaMemcpyAsync(dst, ctx->stage[i].buf, bytes,
                                                   cudaMemcpyHostToDevice, ctx->stream),
                              what));
    DDP_CHECK(ddp__cuda_check(ctx, cudaEventRecord(ctx->stage[i].done, ctx->stream), what));
    ctx->stage_next = (i + 1) % DDP_CUDA_STAGES;
    return 0;
}

/* src is read before the call returns; the device write is queued (kernels.h): staged up to
 * DDP_CUDA_STAGE_MAX, else a plain copy and a wait. */
static int cuda_memcpy_h2d(ddp_kctx_t *ctx, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0) return 0;
    DDP_CHECK(ddp__cuda_enter(ctx));
    if (bytes <= DDP_CUDA_STAGE_MAX) {
        int rc = staged_h2d(ctx, dst, src, bytes);
        if (rc != DDP_ENOMEM) return rc;
    }
    return cuda_copy(ctx, dst, src, bytes, cudaMemcpyHostToDevice, 1, "memcpy_h2d");
}

static int cuda_memcpy_d2h(ddp_kctx_t *ctx, void *dst, const void *src, size_t bytes)
{
    return cuda_copy(ctx, dst, src, bytes, cudaMemcpyDeviceToHost, 1, "memcpy_d2h");
}

static int cuda_memcpy_d2d(ddp_kctx_t *ctx, void *dst, const void *src, size_t bytes)
{
    return cuda_copy(ctx, dst, src, bytes, cudaMemcpyDeviceToDevice, 0, "memcpy_d2d");
}

static int cuda_memset0(ddp_kctx_t *ctx, void *dst, size_t bytes)
{
    if (bytes == 0) return 0;
    DDP_CHECK(ddp__cuda_enter(ctx));
    return ddp__cuda_check(ctx, cudaMemsetAsync(dst, 0, bytes, ctx->stream), "memset0");
}

/* Waits for the stream; returns the first error of the queued ops (or of the wait), then
 * clears it. A sticky CUDA error (e.g. an illegal address) keeps failing later calls. */
static int cuda_sync(ddp_kctx_t *ctx)
{
    if (ddp__cuda_enter(ctx) == 0)
        ddp__cuda_check(ctx, cudaStreamSynchronize(ctx->stream), "cudaStreamSynchronize");
    int rc = ctx->err;
    ctx->err = 0;
    return rc;
}

/* The ordering event after everything queued so far on the compute stream (kernels.h). */
static int cuda_record_event(ddp_kctx_t *ctx, void **event)
{
    *event = NULL;
    DDP_CHECK(ddp__cuda_enter(ctx));
    DDP_CHECK(ddp__cuda_check(ctx, cudaEventRecord(ctx->order, ctx->stream), "cudaEventRecord"));
    *event = (void *)ctx->order;
    return 0;
}

/* A timing event recorded on the compute stream (kernels.h): the next unused one of the pool,
 * made when the pool is used up. */
static int cuda_timer_mark(ddp_kctx_t *ctx, void **mark)
{
    *mark = NULL;
    DDP_CHECK(ddp__cuda_enter(ctx));
    if (ctx->used_marks == ctx->n_marks) {
        int cap = ctx->n_marks ? 2 * ctx->n_marks : 256;
        cudaEvent_t *m = (cudaEvent_t *)realloc(ctx->marks, (size_t)cap * sizeof *m);
        if (!m) return DDP_ENOMEM;
        ctx->marks = m;
        for (; ctx->n_marks < cap; ctx->n_marks++)
            DDP_CHECK(ddp__cuda_check(ctx, cudaEventCreate(&m[ctx->n_marks]), "cudaEventCreate"));
    }
    cudaEvent_t ev = ctx->marks[ctx->used_marks];
    DDP_CHECK(ddp__cuda_check(ctx, cudaEventRecord(ev, ctx->stream), "cudaEventRecord"));
    ctx->used_marks++;
    *mark = (void *)ev;
    return 0;
}

static double cuda_timer_elapsed_ms(ddp_kctx_t *ctx, void *a, void *b)
{
    (void)ctx; /* the events hold their stream */
    float ms = 0;
    cudaError_t e = cudaEventElapsedTime(&ms, (cudaEvent_t)a, (cudaEvent_t)b);
    if (e != cudaSuccess) { /* the profile's loss only: not kept as the context's error */
        DDP_WARN("cuda: cudaEventElapsedTime: %s (%s)", cudaGetErrorString(e),
                 cudaGetErrorName(e));
        cudaGetLastError();
        return -1.0;
    }
    return (double)ms;
}

static void cuda_timer_reset(ddp_kctx_t *ctx) { ctx->used_marks = 0; }

static const char *cuda_device_name(ddp_kctx_t *ctx)
{
    return ctx->device_name[0] ? ctx->device_name : NULL;
}

static const ddp_kernels_ops_t cuda_ops = {
    .name = "cuda",
    .coll_backend = "nccl",
    .host_memory = 0,
    .gpu_memory = 1,
    .probe = cuda_probe,
    .device_count = cuda_device_count,
    .device_name = cuda_device_name,
    .init = cuda_init,
    .close = cuda_close,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .reserve = ddp__cuda_reserve,
    .commit = ddp__cuda_commit,
    .decommit = ddp__cuda_decommit,
    .commit_granule = ddp__cuda_commit_granule,
    .on_device = cuda_on_device,
    .memcpy_h2d = cuda_memcpy_h2d,
    .memcpy_d2h = cuda_memcpy_d2h,
    .memcpy_d2d = cuda_memcpy_d2d,
    .memset0 = cuda_memset0,
    .sync = cuda_sync,
    .record_event = cuda_record_event,
    .timer_mark = cuda_timer_mark,
    .timer_elapsed_ms = cuda_timer_elapsed_ms,
    .timer_reset = cuda_timer_reset,
#define CUDA_OP(name, params) .name = ddp__cuda_##name,
    DDP_KERNEL_OPS(CUDA_OP)
#undef CUDA_OP
    .prec_native = ddp__cuda_prec_native, /* C++: the members' order */
};

/* The module's entry point (DDP_KERNELS_MODULE_SYMBOL): returns the CUDA ops table, which
 * lives as long as the module is loaded. Any thread; no side effects. */
extern "C" __attribute__((visibility("default"))) const ddp_kernels_ops_t *ddp_kernels_module(void)
{
    return &cuda_ops;
}
