/* Internals of the CUDA kernel backend, shared by its .cu files (never included outside
 * kernels/cuda/).
 *
 * - struct ddp_kctx: one context owns one device, one non-blocking compute stream, one cuBLAS
 *   handle bound to that stream and one cuBLASLt handle (16-bit products, matmul.cu), a
 *   grow-only scratch buffer for ops that need temporary device memory (sumsq_blocks' results
 *   among others), and a small fixed buffer for nonfinite's flag.
 * - Activation tensors (ddp_act_t, kernels.h) hold float, __nv_bfloat16 or __half by ctx->prec:
 *   kernels are templates on that type (ddp__act below), launched through DDP_ACT_DISPATCH.
 * - Errors: ops return nothing, so the first CUDA/cuBLAS error since the last sync is kept in
 *   ctx->err (and its original message logged); ddp_k_sync() returns it.
 * - Determinism: no op uses floating-point atomics; every reduction has a fixed order that
 *   depends only on the shapes, so a run is bitwise reproducible on a given device.
 * - Threads: a context is used by one thread at a time (the compute thread).
 */
#ifndef DDP_KERNELS_CUDA_KCUDA_CUH
#define DDP_KERNELS_CUDA_KCUDA_CUH

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* The project's C headers (their system includes come first, outside the C linkage block). */
extern "C" {
#include "common/err.h"
#include "common/log.h"
#include "kernels/kernels.h"
}
#include "kernels/math/lowp.h"

/* Threads per block of the plain elementwise kernels. */
#define DDP_CUDA_BLOCK 256
/* Cap on the grid of grid-stride kernels (they loop beyond it). */
#define DDP_CUDA_MAX_GRID 32768
/* memcpy_h2d's staging: buffers used in turn, and the largest copy staged (larger ones, such as
 * the weights at load, wait for the stream instead) */
#define DDP_CUDA_STAGES 8
#define DDP_CUDA_STAGE_MAX ((size_t)4 << 20)

struct ddp_kctx {
    int device;
    char device_name[256]; /* cudaDeviceProp.name ("" if it could not be read) */
    size_t smem_optin;   /* the device's dynamic shared memory a block may opt into, bytes */
    cudaStream_t stream; /* every op is queued here */
    cublasHandle_t blas; /* bound to `stream` */
    cublasLtHandle_t lt; /* 16-bit products (matmul.cu); the stream is given per call */
    void *lt_ws;         /* cuBLASLt's workspace, DDP_CUDA_LT_WS bytes, allocated on first use */
    int lt_bias16;       /* the bias epilogue: 0 untried, 1 worked, -1 refused (matmul.cu) */
    int lt_bgrad[2];     /* the BGRADA [0] and BGRADB [1] epilogues, likewise */
    int lt_gelu[2];      /* GELU_AUX [0] and GELU_AUX_BIAS [1], likewise */
    int lt_dgelu;        /* DGELU, likewise */
    struct ddp__lt_plans *lt_plans; /* the heuristic's algorithm per product shape (matmul.cu);
                                     * plain memory, freed with free() at close */
    int err;             /* first error since the last sync (DDP_ECUDA), else 0 */
    void *scratch;       /* grow-only temporary device memory, `scratch_bytes` long */
    size_t scratch_bytes;
    int *flag;    /* device [1]: nonfinite flag */
    void *pinned; /* pinned host [16 bytes]: staging for the nonfinite flag */
    cudaEvent_t order; /* record_event's event: collectives wait for it on their stream */
    ddp_kprec_t prec;  /* the activation type (set_precision, lowp.cu); ops launch in order */
    struct ddp__cuda_wcopy *wcopies; /* bf16/fp16 copies: the arena's, or per weight (lowp.cu) */
    int n_wcopies, cap_wcopies;
    const float *arena; /* set_weights' arena, arena_n elements; NULL: none */
    size_t arena_n;
    struct ddp__cuda_sparse *sparse; /* driver entry points and reservations (sparse.cu) */
    cudaEvent_t *marks; /* profiling marks (timing events): [n_marks], the first used_marks */
    int n_marks, used_marks; /* recorded since the last timer_reset; reused after it */
    /* memcpy_h2d's pinned staging buffers (backend.cu), used in turn: a copy from pageable
     * memory would drain the stream first, a copy from pinned memory does not */
    struct {
        void *buf;        /* pinned host [cap], or NULL */
        size_t cap;
        cudaEvent_t done; /* recorded after the buffer's last copy; NULL until then */
    } stage[DDP_CUDA_STAGES];
    int stage_next;
};

/* Records `e` as ctx's error when it is not cudaSuccess: logs "cuda: <what>: <message>" and
 * keeps the first error. Returns 0 or DDP_ECUDA. */
int ddp__cuda_check(ddp_kctx_t *ctx, cudaError_t e, const char *what);
/* The same for a cuBLAS status. */
int ddp__cublas_check(ddp_kctx_t *ctx, cublasStatus_t s, const char *what);
/* Checks that the kernel launched last on this thread started (cudaGetLastError). */
int ddp__cuda_launched(ddp_kctx_t *ctx, const char *what);
/* Makes ctx's device current on the calling thread (cheap when it already is). */
int ddp__cuda_enter(ddp_kctx_t *ctx);
/* Points *out at >= bytes of scratch device memory, valid until the next call on ctx.
 * Growing frees the old buffer, which waits for queued work (cudaFree synchronises). */
int ddp__cuda_scratch(ddp_kctx_t *ctx, size_t bytes, void **out);

/* The sparse arenas (sparse.cu): the ops table's reserve, commit, decommit, commit_granule. */
int ddp__cuda_reserve(ddp_kctx_t *ctx, void **out, size_t bytes);
int ddp__cuda_commit(ddp_kctx_t *ctx, void *p, size_t bytes);
void ddp__cuda_decommit(ddp_kctx_t *ctx, void *p, size_t bytes);
size_t ddp__cuda_commit_granule(ddp_kctx_t *ctx);
/* 1 when p is a reservation of ctx, which is then released; 0 for any other pointer. The
 * caller has waited for the compute stream. */
int ddp__cuda_sparse_free(ddp_kctx_t *ctx, void *p);
/* Releases the reservations still held (context close). */
void ddp__cuda_sparse_close(ddp_kctx_t *ctx);

/* cuBLASLt's workspace (the size NVIDIA suggests for Hopper; Ampere needs less). */
#define DDP_CUDA_LT_WS ((size_t)32 << 20)

/* ---- Activation types ----
 * ddp__act<T>::ld widens an element to fp32 (exact); ::st rounds an fp32 to T once, to nearest
 * even, bit for bit as kernels/math/lowp.h does on the CPU (fp16: |x| >= 65520 becomes Inf). */
template <typename T> struct ddp__act;
template <> struct ddp__act<float> {
    static __device__ __forceinline__ float ld(float x) { return x; }
    static __device__ __forceinline__ float st(float x) { return x; }
};
template <> struct ddp__act<__nv_bfloat16> {
    static __device__ __forceinline__ float ld(__nv_bfloat16 x) { return __bfloat162float(x); }
    static __device__ __forceinline__ __nv_bfloat16 st(float x)
    {
        return __ushort_as_bfloat16(ddp_bf16_bits(x));
    }
};
template <> struct ddp__act<__half> {
    static __device__ __forceinline__ float ld(__half x) { return __half2float(x); }
    static __device__ __forceinline__ __half st(float x)
    {
        return __ushort_as_half(ddp_fp16_bits(x));
    }
};

/* Runs the statements `...` with the typedef T naming ctx's activation type (prec). */
#define DDP_ACT_DISPATCH(prec, T, ...)                                                        \
    do {                                                                                      \
        if ((prec) == DDP_KPREC_BF16) {                                                       \
            typedef __nv_bfloat16 T;                                                          \
            __VA_ARGS__;                                                                      \
        } else if ((prec) == DDP_KPREC_FP16) {                                                \
            typedef __half T;                                                                 \
            __VA_ARGS__;                                                                      \
        } else {                                                                              \
            typedef float T;                                                                  \
            __VA_ARGS__;                                                                      \
        }                                                                                     \
    } while (0)

/* V consecutive elements of type E moved as one access (16 bytes for V * sizeof(E) = 16). */
template <int V, typename E> struct alignas(V * sizeof(E)) ddp__pack {
    E e[V];
};

/* x[0..V) = p[0..V) widened to fp32; p aligned to V elements. */
template <int V, typename E>
__device__ __forceinline__ void ddp__ldv(float (&x)[V], const E *p)
{
    ddp__pack<V, E> v = *reinterpret_cast<const ddp__pack<V, E> *>(p);
#pragma unroll
    for (int k = 0; k < V; k++) x[k] = ddp__act<E>::ld(v.e[k]);
}

/* p[0..V) = x[0..V) rounded to E; p aligned to V elements. */
template <int V, typename E>
__device__ __forceinline__ void ddp__stv(E *p, const float (&x)[V])
{
    ddp__pack<V, E> v;
#pragma unroll
    for (int k = 0; k < V; k++) v.e[k] = ddp__act<E>::st(x[k]);
    *reinterpret_cast<ddp__pack<V, E> *>(p) = v;
}

/* 1 when p is aligned to `bytes` (a power of two). */
static inline int ddp__aligned(const void *p, size_t bytes)
{
    return ((uintptr_t)p & (bytes - 1)) == 0;
}

/* Blocks for a grid-stride loop over n items, block threads each. */
static inline unsigned ddp__grid(size_t n, unsigned block)
{
    size_t g = (n + block - 1) / block;
    if (g > DDP_CUDA_MAX_GRID) g = DDP_CUDA_MAX_GRID;
    return g ? (unsigned)g : 1u;
}

/* ---- Deterministic reductions (fixed order; every lane gets lane 0's result) ---- */

template <typename T> __device__ __forceinline__ T ddp__warp_sum(T v)
{
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return __shfl_sync(0xffffffffu, v, 0);
}

__device__ __forceinline__ float ddp__warp_max(float v)
{
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return __shfl_sync(0xffffffffu, v, 0);
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); `sh` holds >= 32 T. Every thread
 * must call it; every thread gets the result. */
template <typename T> __device__ T ddp__block_sum(T v, T *sh)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = ddp__warp_sum(v);
    __syncthreads(); /* sh may still be read by a previous call */
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    T r = lane < nwarps ? sh[lane] : (T)0;
    return ddp__warp_sum(r);
}

__device__ __forceinline__ float ddp__block_max(float v, float *sh)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = ddp__warp_max(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    float r = lane < nwarps ? sh[lane] : -INFINITY;
    return ddp__warp_max(r);
}

/* ---- Column sums of a virtual [N, C] matrix, deterministic, two stages ----
 * F is a functor: __device__ void operator()(int n, int c, float v[NV]) const, giving NV values
 * of row n, column c. out_k[c] += sum_n v_k(n, c) for each non-NULL out_k. Stage 1 sums row
 * chunks into partials (block 32 columns x 16 row lanes, grid [ceil(C/32), chunks]); stage 2
 * adds the chunks in order. The chunking depends only on N. */
#define DDP_COLSUM_TY 16

template <int NV, typename F>
__global__ void ddp__colsum_stage1(float *partial, int N, int C, int rows_per_chunk, F f)
{
    __shared__ float sh[NV][DDP_COLSUM_TY][33];
    int tx = threadIdx.x, ty = threadIdx.y;
    int c = blockIdx.x * 32 + tx;
    int n0 = blockIdx.y * rows_per_chunk;
    int n1 = min(N, n0 + rows_per_chunk);
    float acc[NV];
    for (int k = 0; k < NV; k++) acc[k] = 0.0f;
    if (c < C) {
        for (int n = n0 + ty; n < n1; n += DDP_COLSUM_TY) {
            float v[NV];
            f(n, c, v);
            for (int k = 0; k < NV; k++) acc[k] += v[k];
        }
    }
    for (int k = 0; k < NV; k++) sh[k][ty][tx] = acc[k];
    __syncthreads();
    if (ty == 0 && c < C) {
        for (int k = 0; k < NV; k++) {
            float s = 0.0f;
            for (int y = 0; y < DDP_COLSUM_TY; y++) s += sh[k][y][tx];
            partial[((size_t)blockIdx.y * NV + k) * C + c] = s;
        }
    }
}

template <int NV>
__global__ void ddp__colsum_stage2(float *out0, float *out1, const float *partial, int chunks,
                                   int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int k = 0; k < NV; k++) {
        float *out = k == 0 ? out0 : out1;
        if (!out) continue;
        float s = 0.0f;
        for (int j = 0; j < chunks; j++) s += partial[((size_t)j * NV + k) * C + c];
        out[c] += s;
    }
}

/* Queues out0[c] += sum_n v_0(n,c) (and out1 with v_1 when NV == 2). Uses ctx's scratch. */
template <int NV, typename F>
static void ddp__colsum(ddp_kctx_t *ctx, float *out0, float *out1, int N, int C, F f,
                        const char *what)
{
    if (N <= 0 || C <= 0) return;
    int chunks = (N + 255) / 256;
    if (chunks > 64) chunks = 64;
    int rows = (N + chunks - 1) / chunks;
    chunks = (N + rows - 1) / rows;
    float *partial;
    if (ddp__cuda_scratch(ctx, (size_t)chunks * NV * C * sizeof(float), (void **)&partial))
        return;
    dim3 grid((unsigned)((C + 31) / 32), (unsigned)chunks), block(32, DDP_COLSUM_TY);
    ddp__colsum_stage1<NV, F><<<grid, block, 0, ctx->stream>>>(partial, N, C, rows, f);
    if (ddp__cuda_launched(ctx, what)) return;
    ddp__colsum_stage2<NV><<<(unsigned)((C + 255) / 256), 256, 0, ctx->stream>>>(
        out0, out1, partial, chunks, C);
    ddp__cuda_launched(ctx, what);
}

/* ---- The ops: ddp__cuda_<op> for every op of kernels.h's DDP_KERNEL_OPS, one family per file
 * (encoder.cu, norm.cu (LayerNorm and RMSNorm, with residual_norm_fwd), matmul.cu,
 * attention.cu, rope.cu, pointwise.cu (with swiglu, adamw, add, scale), xent.cu, reduce.cu
 * (sumsq_blocks, nonfinite); set_precision in lowp.cu) ---- */
#define DDP__CUDA_OP(name, params) void ddp__cuda_##name DDP_KOP_CTX_PARAMS params;
DDP_KERNEL_OPS(DDP__CUDA_OP)
#undef DDP__CUDA_OP

/* lowp.cu: the run's precision and the 16-bit weight copies */
/* The CUDA type of ctx->prec's 16-bit activations (CUDA_R_16BF or CUDA_R_16F). */
cudaDataType_t ddp__cuda_lowp_type(const ddp_kctx_t *ctx);
/* Weight w[0..n) rounded to ctx->prec (16-bit), converted once per set_precision: a slice of
 * the arena's copy when set_weights' arena holds it, else a copy kept per pointer; NULL (error
 * recorded) on failure. */
const void *ddp__cuda_lowp_weight(ddp_kctx_t *ctx, const float *w, size_t n);
/* The arena's copy when param is set_weights' arena and its copy is current (adamw then writes
 * it with the update), else NULL. */
void *ddp__cuda_lowp_kept(ddp_kctx_t *ctx, const float *param);
void ddp__cuda_lowp_free(ddp_kctx_t *ctx);
int ddp__cuda_prec_native(ddp_kctx_t *ctx, ddp_kprec_t prec, const char **why);

/* flash_attention.cu */
/* 1 when the tensor-core flash kernels take this shape and precision: ctx->prec is BF16 or FP16
 * and hs = C/NH is 32, 64 or 128. */
int ddp__cuda_flash_supported(const ddp_kctx_t *ctx, int C, int NH);
/* out[B,T,C] = causal softmax(scale Q K^T) V per query head, with NKV K/V heads (kernels.h's
 * attention_fwd: qkv[B,T,C + 2 NKV hs]); lse[B,NH,T] = natural-log log-sum-exp of row t's
 * scaled scores (over t2 <= t). qkv, out: ctx->prec's 16-bit type. Queued on ctx->stream;
 * errors recorded in ctx. */
void ddp__cuda_flash_fwd(ddp_kctx_t *ctx, void *out, float *lse, const void *qkv, int B, int T,
                         int C, int NH, int NKV);
/* dqkv[B,T,C + 2 NKV hs] = the gradient of out w.r.t. qkv given dout[B,T,C], forward's out and
 * lse (overwritten; 16-bit like qkv; a K/V head's gradient sums its group in a fixed order). */
void ddp__cuda_flash_bwd(ddp_kctx_t *ctx, void *dqkv, const void *dout, const void *qkv,
                         const void *out, const float *lse, int B, int T, int C, int NH,
                         int NKV);

/* pointwise.cu: out[n] = inp[n] (ctx->prec's type) widened to fp32, exactly (attention's
 * general path); to_act is also lowp.cu's weight conversion. */
void ddp__cuda_act_to_f32(ddp_kctx_t *ctx, float *out, const ddp_act_t *inp, size_t n);

#endif
