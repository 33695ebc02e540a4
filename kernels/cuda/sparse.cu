/* The CUDA backend's sparse arenas (kernels.h: reserve, commit, decommit) over the driver's
 * virtual memory management.
 *
 * - A reservation is an address range from cuMemAddressReserve, aligned to the granule (the
 *   driver's minimum for pinned memory of the context's device, 2 MiB on current GPUs) and
 *   rounded up to whole granules. Granule i is mapped to a physical allocation of its own
 *   (cuMemCreate + cuMemMap + cuMemSetAccess, read/write for the device) or to nothing:
 *   cuMemUnmap only takes whole mappings, so one per granule lets decommit give back any of
 *   them. The handle is released as soon as it is mapped; the mapping then holds the only
 *   reference, and cuMemUnmap frees the memory. So a reservation needs only a flag per granule.
 * - Newly mapped granules are zeroed by cudaMemsetAsync on the compute stream, then commit waits
 *   for the stream, as alloc does: any stream (NCCL's) may use the memory when commit returns.
 *   Decommit waits for the compute stream too (as free), so only other streams' work is the
 *   caller's to order.
 * - The driver's functions come through cudaGetDriverEntryPointByVersion rather than a link to
 *   libcuda: the module must still load where no driver is installed (CI, hosts without a GPU),
 *   so that the loader and the probe can say the backend is unusable; a dependency on
 *   libcuda.so.1 would make dlopen() itself fail there. They are looked up at the first
 *   reservation of a context, so contexts that never reserve pay nothing.
 * - The context lists its reservations (ctx->sparse) so that free tells one from a cudaMalloc
 *   pointer; close releases those still held.
 * Threads: as the rest of the context (one caller thread).
 */
#include <cuda.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/cuda/kcuda.cuh"

/* The driver functions used, by name (each looked up as of CUDA 12.0's ABI). */
#define DRIVER_FNS(X)                                                                        \
    X(cuMemAddressReserve)                                                                   \
    X(cuMemAddressFree)                                                                      \
    X(cuMemCreate)                                                                           \
    X(cuMemRelease)                                                                          \
    X(cuMemMap)                                                                              \
    X(cuMemUnmap)                                                                            \
    X(cuMemSetAccess)                                                                        \
    X(cuMemGetAllocationGranularity)                                                         \
    X(cuDeviceGet)                                                                           \
    X(cuDeviceGetAttribute)                                                                  \
    X(cuGetErrorName)
#define DRIVER_ABI 12000

typedef struct resv {
    struct resv *next;
    CUdeviceptr base;
    size_t bytes;           /* as reserved (granule i ends at bytes at most) */
    size_t n;               /* granules */
    unsigned char *mapped;  /* [n] */
} resv_t;

struct ddp__cuda_sparse {
#define FN_FIELD(f) decltype(&::f) f;
    DRIVER_FNS(FN_FIELD)
#undef FN_FIELD
    size_t granule; /* 0: the device or driver cannot (reserve says DDP_ENOTSUP) */
    resv_t *list;
};

typedef struct ddp__cuda_sparse sparse_t;

/* Logs a failed driver call; returns 0, DDP_ENOMEM or DDP_ECUDA. Not kept in ctx->err: the
 * callers decide (a failed commit, like a failed alloc, leaves the context usable). */
static int cu_check(const sparse_t *v, CUresult r, const char *what)
{
    if (r == CUDA_SUCCESS) return 0;
    const char *name = NULL;
    if (v->cuGetErrorName(r, &name) != CUDA_SUCCESS || !name) name = "unknown error";
    DDP_ERROR("cuda: %s: %s (%d)", what, name, (int)r);
    return r == CUDA_ERROR_OUT_OF_MEMORY ? DDP_ENOMEM : DDP_ECUDA;
}

static int resolve(const char *name, void **fn)
{
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    cudaError_t e = cudaGetDriverEntryPointByVersion(name, fn, DRIVER_ABI, cudaEnableDefault,
                                                     &found);
    if (e == cudaSuccess && found == cudaDriverEntryPointSuccess && *fn) return 0;
    cudaGetLastError();
    DDP_WARN("cuda: the driver has no %s (%s): no sparse arenas", name, cudaGetErrorString(e));
    return -1;
}

/* The context's driver functions and granule, looked up on first use; NULL when unusable. */
static sparse_t *vmm(ddp_kctx_t *ctx)
{
    sparse_t *v = ctx->sparse;
    if (v) return v->granule ? v : NULL;
    if (!(v = ctx->sparse = (sparse_t *)calloc(1, sizeof(*v)))) return NULL;
#define RESOLVE(f)                                                                           \
    if (resolve(#f, (void **)&v->f)) return NULL;
    DRIVER_FNS(RESOLVE)
#undef RESOLVE
    CUdevice dev;
    int supported = 0;
    if (v->cuDeviceGet(&dev, ctx->device) != CUDA_SUCCESS ||
        v->cuDeviceGetAttribute(&supported,
                                CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                dev) != CUDA_SUCCESS ||
        !supported) {
        DDP_WARN("cuda: device %d has no virtual memory management: no sparse arenas",
                 ctx->device);
        return NULL;
    }
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ctx->device;
    size_t g = 0;
    if (cu_check(v, v->cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                 "cuMemGetAllocationGranularity") == 0 &&
        g && !(g & (g - 1)))
        v->granule = g;
    return v->granule ? v : NULL;
}

size_t ddp__cuda_commit_granule(ddp_kctx_t *ctx)
{
    if (ddp__cuda_enter(ctx)) return 0;
    sparse_t *v = vmm(ctx);
    return v ? v->granule : 0;
}

int ddp__cuda_reserve(ddp_kctx_t *ctx, void **out, size_t bytes)
{
    *out = NULL;
    if (bytes == 0) return 0;
    DDP_CHECK(ddp__cuda_enter(ctx));
    sparse_t *v = vmm(ctx);
    if (!v) return DDP_ENOTSUP;
    size_t g = v->granule, n = bytes / g + (bytes % g != 0);
    resv_t *r = (resv_t *)calloc(1, sizeof(*r));
    unsigned char *mapped = (unsigned char *)calloc(n, 1);
    CUdeviceptr base = 0;
    int rc = r && mapped ? 0 : DDP_ENOMEM;
    if (rc == 0)
        rc = cu_check(v, v->cuMemAddressReserve(&base, n * g, g, 0, 0), "cuMemAddressReserve");
    if (rc) {
        free(r);
        free(mapped);
        return rc;
    }
    *r = resv_t{v->list, base, bytes, n, mapped};
    v->list = r;
    *out = (void *)(uintptr_t)base;
    return 0;
}

/* The reservation holding all of [p, p + bytes), or NULL. */
static resv_t *resv_of(ddp_kctx_t *ctx, const void *p, size_t bytes)
{
    CUdeviceptr a = (CUdeviceptr)(uintptr_t)p;
    for (resv_t *r = ctx->sparse ? ctx->sparse->list : NULL; r; r = r->next)
        if (a >= r->base && a < r->base + r->bytes)
            return bytes <= r->base + r->bytes - a ? r : NULL;
    return NULL;
}

/* Maps granule i of r to new memory and queues its zeroing on the compute stream. */
static int map_granule(ddp_kctx_t *ctx, sparse_t *v, resv_t *r, size_t i)
{
    size_t g = v->granule;
    CUdeviceptr at = r->base + i * g;
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ctx->device;
    CUmemAccessDesc access = {};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CUmemGenericAllocationHandle h;
    DDP_CHECK(cu_check(v, v->cuMemCreate(&h, g, &prop, 0), "cuMemCreate"));
    int rc = cu_check(v, v->cuMemMap(at, g, 0, h, 0), "cuMemMap");
    v->cuMemRelease(h); /* the mapping keeps the memory alive until cuMemUnmap */
    if (rc) return rc;
    rc = cu_check(v, v->cuMemSetAccess(at, g, &access, 1), "cuMemSetAccess");
    if (rc == 0)
        rc = ddp__cuda_check(ctx, cudaMemsetAsync((void *)(uintptr_t)at, 0, g, ctx->stream),
                             "cudaMemsetAsync");
    if (rc) {
        v->cuMemUnmap(at, g);
        return rc;
    }
    r->mapped[i] = 1;
    return 0;
}

int ddp__cuda_commit(ddp_kctx_t *ctx, void *p, size_t bytes)
{
    if (bytes == 0) return 0;
    resv_t *r = resv_of(ctx, p, bytes);
    if (!r) return DDP_EINVAL;
    DDP_CHECK(ddp__cuda_enter(ctx));
    sparse_t *v = ctx->sparse;
    size_t g = v->granule, off = (size_t)((CUdeviceptr)(uintptr_t)p - r->base);
    int rc = 0, zeroing = 0;
    for (size_t i = off / g; i * g < off + bytes && rc == 0; i++)
        if (!r->mapped[i]) {
            rc = map_granule(ctx, v, r, i);
            zeroing |= rc == 0;
        }
    /* On a failure the granules mapped so far stay committed (zeroed): a retry maps the rest. */
    if (zeroing) {
        int w = ddp__cuda_check(ctx, cudaStreamSynchronize(ctx->stream), "cudaStreamSynchronize");
        if (rc == 0) rc = w;
    }
    return rc;
}

void ddp__cuda_decommit(ddp_kctx_t *ctx, void *p, size_t bytes)
{
    if (bytes == 0) return;
    resv_t *r = resv_of(ctx, p, bytes);
    if (!r) {
        DDP_ERROR("cuda: decommit of [%p, +%zu), which is not inside one reservation", p, bytes);
        if (ctx->err == 0) ctx->err = DDP_EINVAL;
        return;
    }
    if (ddp__cuda_enter(ctx)) return;
    ddp__cuda_check(ctx, cudaStreamSynchronize(ctx->stream), "cudaStreamSynchronize");
    sparse_t *v = ctx->sparse;
    size_t g = v->granule, off = (size_t)((CUdeviceptr)(uintptr_t)p - r->base);
    size_t end = off + bytes == r->bytes ? r->n * g : off + bytes; /* the last ends with r */
    for (size_t i = off / g + (off % g != 0); (i + 1) * g <= end; i++) {
        if (!r->mapped[i]) continue;
        int rc = cu_check(v, v->cuMemUnmap(r->base + i * g, g), "cuMemUnmap");
        if (rc && ctx->err == 0) ctx->err = rc;
        if (rc == 0) r->mapped[i] = 0;
    }
}

/* Unmaps every granule of r, then frees its address range and r. After a failed unmap the
 * range is left reserved: the driver refuses to free a range that still has a mapping. */
static void release(ddp_kctx_t *ctx, sparse_t *v, resv_t *r)
{
    size_t g = v->granule;
    int rc = 0;
    for (size_t i = 0; i < r->n && rc == 0; i++)
        if (r->mapped[i]) rc = cu_check(v, v->cuMemUnmap(r->base + i * g, g), "cuMemUnmap");
    if (rc == 0) rc = cu_check(v, v->cuMemAddressFree(r->base, r->n * g), "cuMemAddressFree");
    if (rc && ctx->err == 0) ctx->err = rc;
    free(r->mapped);
    free(r);
}

int ddp__cuda_sparse_free(ddp_kctx_t *ctx, void *p)
{
    sparse_t *v = ctx->sparse;
    for (resv_t **pr = v ? &v->list : NULL; pr && *pr; pr = &(*pr)->next)
        if ((*pr)->base == (CUdeviceptr)(uintptr_t)p) {
            resv_t *r = *pr;
            *pr = r->next;
            release(ctx, v, r);
            return 1;
        }
    return 0;
}

void ddp__cuda_sparse_close(ddp_kctx_t *ctx)
{
    sparse_t *v = ctx->sparse;
    if (!v) return;
    while (v->list) ddp__cuda_sparse_free(ctx, (void *)(uintptr_t)v->list->base);
    free(v);
    ctx->sparse = NULL;
}
