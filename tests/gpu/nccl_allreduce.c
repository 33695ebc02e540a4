/* NCCL all-reduce through the project's nccl backend (collectives/nccl.c, dlopen()ed by
 * ddp_coll_new), on GPU memory: odd and large counts, fp32 and bf16 sums checked against the
 * serial sum on the host, and the bus bandwidth of a 256 MiB fp32 all-reduce; then the in-place
 * reduce-scatter and all-gather of ZeRO-1 with equal slices (ncclReduceScatter / ncclAllGather)
 * and uneven ones (grouped ncclReduce / ncclBroadcast). One rank (a world
 * of one: the backend is still initialised and every operation goes through NCCL) or N ranks
 * started with the environment rendezvous (deploy/launch-local.sh style: DDP_RANK,
 * DDP_WORLD_SIZE, DDP_RDZV, DDP_JOB_TOKEN), one GPU per rank (DDP_LOCAL_RANK).
 * Built and run by tests/gpu.sh on a machine with a GPU; exit 0 when every check passes.
 */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/coll.h"
#include "common/clock.h"

#include "tests/gpu/cuda_check.h"

static uint16_t to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16); /* the values used are exact in bf16 */
}

static float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* One all-reduce of count elements; returns the number of wrong elements. */
static size_t check(ddp_coll_t *c, size_t count, ddp_dtype_t dt, int rank, int size)
{
    size_t es = dt == DDP_DT_F32 ? 4 : 2;
    void *h = malloc(count * es + 1), *d = NULL;
    for (size_t i = 0; i < count; i++) {
        float v = (float)(rank + 1) * (float)(i % 13);
        if (dt == DDP_DT_F32) ((float *)h)[i] = v;
        else ((uint16_t *)h)[i] = to_bf16(v);
    }
    CK(cudaMalloc(&d, count * es + 1));
    CK(cudaMemcpy(d, h, count * es, cudaMemcpyHostToDevice));
    ddp_coll_req_t *req;
    ddp_errinfo_t ei = {0};
    int rc = ddp_coll_allreduce(c, d, count, dt, DDP_OP_SUM, &req);
    if (rc == 0) rc = ddp_coll_wait(req, 0, &ei);
    if (rc) {
        fprintf(stderr, "allreduce of %zu: %s (%s)\n", count, ddp_strerror(rc), ei.msg);
        exit(1);
    }
    CK(cudaMemcpy(h, d, count * es, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    float ranks = (float)size * (float)(size + 1) / 2;
    for (size_t i = 0; i < count; i++) {
        float want = ranks * (float)(i % 13);
        float got = dt == DDP_DT_F32 ? ((float *)h)[i] : from_bf16(((uint16_t *)h)[i]);
        if (got != want) bad++;
    }
    CK(cudaFree(d));
    free(h);
    return bad;
}

/* A reduce-scatter then an all-gather of count fp32 elements; returns the wrong elements. */
static size_t check_slices(ddp_coll_t *c, size_t count, int rank, int size)
{
    float *h = malloc(count * 4 + 4), *d = NULL;
    for (size_t i = 0; i < count; i++) h[i] = (float)(rank + 1) * (float)(i % 13);
    CK(cudaMalloc((void **)&d, count * 4 + 4));
    CK(cudaMemcpy(d, h, count * 4, cudaMemcpyHostToDevice));
    ddp_coll_req_t *req;
    ddp_errinfo_t ei = {0};
    size_t lo, hi, bad = 0;
    ddp_coll_slice(count, size, rank, &lo, &hi);
    float ranks = (float)size * (float)(size + 1) / 2;
    for (int pass = 0; pass < 2; pass++) {
        int rc = pass ? ddp_coll_allgather(c, d, count, DDP_DT_F32, &req)
                      : ddp_coll_reduce_scatter(c, d, count, DDP_DT_F32, DDP_OP_SUM, &req);
        if (rc == 0) rc = ddp_coll_wait(req, 0, &ei);
        if (rc) {
            fprintf(stderr, "%s of %zu: %s (%s)\n", pass ? "all-gather" : "reduce-scatter", count,
                    ddp_strerror(rc), ei.msg);
            exit(1);
        }
        CK(cudaMemcpy(h, d, count * 4, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < count; i++) { /* the reduce-scatter leaves the rest as it was */
            float mine = pass || (i >= lo && i < hi) ? ranks : (float)(rank + 1);
            if (h[i] != mine * (float)(i % 13)) bad++;
        }
    }
    CK(cudaFree(d));
    free(h);
    return bad;
}

int main(void)
{
    const char *lr = getenv("DDP_LOCAL_RANK");
    int ndev = 0;
    CK(cudaGetDeviceCount(&ndev));
    int dev = lr ? atoi(lr) % (ndev ? ndev : 1) : 0;
    CK(cudaSetDevice(dev));
    ddp_coll_bootstrap_t *bs;
    ddp_errinfo_t ei = {0};
    int rc = getenv("DDP_WORLD_SIZE") ? ddp_coll_bootstrap_env(&bs, &ei)
                                      : ddp_coll_bootstrap_single(&bs, &ei);
    if (rc) {
        fprintf(stderr, "bootstrap: %s\n", ei.msg);
        return 1;
    }
    ddp_coll_opts_t o = {.backend = "nccl", .cuda_device = dev};
    ddp_coll_t *c;
    rc = ddp_coll_new(bs, &o, &c, &ei);
    ddp_coll_bootstrap_free(bs);
    if (rc) {
        fprintf(stderr, "nccl communicator: %s (%s)\n", ddp_strerror(rc), ei.msg);
        return 1;
    }
    int rank = ddp_coll_rank(c), size = ddp_coll_size(c);
    size_t counts[] = {1, 7, 1000003, 25u << 20};
    size_t bad = 0;
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        bad += check(c, counts[k], DDP_DT_F32, rank, size);
        if (counts[k] < (1u << 24)) bad += check(c, counts[k], DDP_DT_BF16, rank, size);
    }
    size_t slice_counts[] = {7, 2 * DDP_COLL_SLICE_ELEMS * (size_t)size,
                             DDP_COLL_SLICE_ELEMS * (size_t)size + 1000};
    size_t bad_slices = 0;
    for (size_t k = 0; k < sizeof slice_counts / sizeof slice_counts[0]; k++)
        bad_slices += check_slices(c, slice_counts[k], rank, size);
    if (rank == 0)
        printf("nccl reduce-scatter + all-gather: %zu wrong elements (equal and uneven slices)\n",
               bad_slices);
    bad += bad_slices;
    /* bus bandwidth: 256 MiB fp32, 5 timed after 2 warm-ups */
    size_t n = 64u << 20;
    void *d;
    CK(cudaMalloc(&d, n * 4));
    CK(cudaMemset(d, 0, n * 4));
    double best = 1e30;
    for (int it = 0; it < 7; it++) {
        ddp_coll_req_t *req;
        int64_t t0 = ddp_now_ns();
        rc = ddp_coll_allreduce(c, d, n, DDP_DT_F32, DDP_OP_SUM, &req);
        if (rc == 0) rc = ddp_coll_wait(req, 0, &ei);
        double s = (double)(ddp_now_ns() - t0) / 1e9;
        if (rc) {
            fprintf(stderr, "timed allreduce: %s\n", ei.msg);
            return 1;
        }
        if (it >= 2 && s < best) best = s;
    }
    CK(cudaFree(d));
    /* One rank moves nothing (NCCL returns an in-place sum at once): no bandwidth to state. */
    if (rank == 0 && size == 1)
        printf("nccl allreduce: 1 rank, backend %s, %zu wrong elements, 256 MiB fp32 in %.3f ms "
               "(one rank: no data moves, so no bus bandwidth)\n",
               ddp_coll_backend_name(c), bad, best * 1e3);
    else if (rank == 0)
        printf("nccl allreduce: %d ranks, backend %s, %zu wrong elements, 256 MiB fp32 in "
               "%.2f ms, bus bandwidth %.1f GB/s\n",
               size, ddp_coll_backend_name(c), bad, best * 1e3,
               2.0 * (size - 1) / size * (double)n * 4 / best / 1e9);
    ddp_coll_free(c);
    return bad ? 1 : 0;
}
