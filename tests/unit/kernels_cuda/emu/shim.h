/* A CPU emulation of the CUDA that kernels/cuda/flash_attention.cu uses, so that the kernel's
 * arithmetic, fragment layouts, masking and barriers are tested on hosts without a GPU.
 * transform.py turns the .cu into host C++ that includes this header instead of the CUDA ones.
 *
 * Thread model (shim.cpp): a launch runs its blocks one after another; each CUDA thread of a
 * block is a fiber (ucontext) of one host thread, scheduled cooperatively: a thread runs until
 * it reaches __syncthreads or a warp collective (shuffle, ldmatrix, mma.sync), and then the
 * first runnable thread in thread order (or in reverse order, emu_set_order) runs. So the first
 * warp runs ahead of the others as far as the barriers allow, into the next tile's staging: a
 * missing __syncthreads shows as another warp's reads of a tile being overwritten (or not yet
 * written: NaN), and as results that differ between the two orders. A deadlock (a barrier that
 * some thread never reaches, one that exited included) aborts with each thread's position.
 *   - Warp collectives take all 32 lanes (mask 0xffffffff, width 32; anything else aborts),
 *     every lane at the same operation; the last lane to arrive computes all lanes' results.
 *   - ldmatrix and mma.sync follow the PTX ISA's fragment tables, written out in shim.cpp
 *     independently of the kernel's own index math. mma.sync's products are exact and summed in
 *     double, then rounded to fp32 once: the tensor cores' own rounding is not modelled.
 *   - cp.async copies are checked (alignment, bounds, the zero-fill size) and land either when
 *     issued or at the cp.async.wait_group that covers them (emu_set_landing): landing at
 *     issue shows a copy into a buffer that another warp still reads (a missing barrier
 *     before the prefetch); landing at the wait shows a read of a tile that has not been waited
 *     for (the 0xff poison below, or the buffer's previous tile). A thread that exits with
 *     copies in flight aborts.
 *   - Dynamic shared memory is a heap block of exactly the launch's size, filled with 0xff bytes
 *     (NaN as bf16, fp16 and fp32), so a read of an unstaged element poisons the result and an
 *     access beyond the size is an ASan error; ldmatrix checks alignment and bounds itself.
 *   - A launch asking for more than 48 KB of dynamic shared memory without a prior
 *     cudaFuncSetAttribute for that kernel, or above 99 KB (the opt-in limit of sm_86/sm_89, the
 *     smallest of compute capability 8.x/9.0), fails as on the GPU.
 * Launches are synchronous; a stream is only a value. Single host thread: the emulator is not
 * thread-safe.
 */
#ifndef DDP_TESTS_KERNELS_CUDA_EMU_SHIM_H
#define DDP_TESTS_KERNELS_CUDA_EMU_SHIM_H

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

extern "C" {
#include "common/err.h"
#include "kernels/kernels.h"
}

/* ---- CUDA C++ qualifiers and built-in types ---- */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    constexpr dim3() = default;
    constexpr dim3(unsigned x_, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct __align__(16) uint4 { uint32_t x, y, z, w; };
static inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w)
{
    return {x, y, z, w};
}

/* The running thread's index (set by the scheduler before it resumes a thread) and the launch's
 * block index and shapes. */
extern dim3 threadIdx, blockIdx, blockDim, gridDim;

/* ---- 16-bit floating-point types (bit patterns; round to nearest even) ---- */
struct __nv_bfloat16 { uint16_t bits; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
struct __half { uint16_t bits; };
struct __half2 { __half x, y; };
static_assert(sizeof(__nv_bfloat162) == 4 && sizeof(__half2) == 4, "packed pairs");

/* float -> bf16 bits, round to nearest even; NaN stays a (quiet) NaN, overflow gives Inf. */
static inline uint16_t emu_f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float emu_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
/* float -> fp16 bits, round to nearest even, overflow gives Inf (the compiler's conversion). */
static inline uint16_t emu_f32_to_f16(float f)
{
    _Float16 h = (_Float16)f;
    uint16_t u;
    memcpy(&u, &h, sizeof u);
    return u;
}
static inline float emu_f16_to_f32(uint16_t u)
{
    _Float16 h;
    memcpy(&h, &u, sizeof h);
    return (float)h;
}
static inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi)
{
    return {{emu_f32_to_bf16(lo)}, {emu_f32_to_bf16(hi)}};
}
static inline __half2 __floats2half2_rn(float lo, float hi)
{
    return {{emu_f32_to_f16(lo)}, {emu_f32_to_f16(hi)}};
}
static inline float __bfloat162float(__nv_bfloat16 h) { return emu_bf16_to_f32(h.bits); }
static inline float __half2float(__half h) { return emu_f16_to_f32(h.bits); }

/* ---- Device functions (shim.cpp); "the calling thread" is the running emulated thread ---- */

/* Block-wide barrier: returns when every thread of the block has called it. */
void __syncthreads();
/* v of lane (this lane ^ lane_mask), resp. of lane src; mask must be 0xffffffff, width 32. */
float __shfl_xor_sync(unsigned mask, float v, int lane_mask, int width = 32);
float __shfl_sync(unsigned mask, float v, int src, int width = 32);
/* *p, which must be 16-byte aligned (the ld.global.nc.v4 the GPU would issue). */
uint4 __ldg(const uint4 *p);
/* The shared-window address of p (its offset in the block's dynamic shared memory); aborts when
 * p is not in it. */
size_t __cvta_generic_to_shared(const void *p);
/* The running block's dynamic shared memory (extern __shared__ arrays become this). */
unsigned char *emu_dynamic_smem();

/* ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 d, [addr]: a warp collective. */
void emu_ldmatrix_x4(uint32_t d[4], uint32_t addr, bool trans);

/* cp.async.{ca,cg}.shared.global [dst], [src], cp_size, src_bytes: the first src_bytes of
 * cp_size bytes from src (global), zeros after, to shared offset dst; commit_group closes the
 * calling thread's open group; wait_group n returns when at most n of its groups are in
 * flight. */
void emu_cp_async(uint32_t dst, const void *src, int cp_size, int src_bytes);
void emu_cp_async_commit();
void emu_cp_async_wait(int n);

enum emu_elem { EMU_BF16, EMU_F16 };
/* mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 d, a, b, c: a warp
 * collective; d may not alias c's storage (transform.py copies operands in and out). */
void emu_mma_m16n8k16(float d[4], const uint32_t a[4], const uint32_t b[2], const float c[4],
                      emu_elem type);

/* ---- Host side: the runtime API and kcuda.cuh's helpers that the kernel file calls ---- */
typedef void *cudaStream_t;
enum cudaError { cudaSuccess = 0, cudaErrorInvalidValue = 1 };
typedef cudaError cudaError_t;
enum cudaDeviceAttr { cudaDevAttrComputeCapabilityMajor = 75 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };

/* The emulated device's compute capability major (emu_set_cc_major; default 8). */
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device);
cudaError_t cudaGetLastError();
cudaError_t emu_func_set_attribute(const void *kernel, cudaFuncAttribute attr, int value);
template <typename K> cudaError_t cudaFuncSetAttribute(K *kernel, cudaFuncAttribute attr, int value)
{
    return emu_func_set_attribute(reinterpret_cast<const void *>(kernel), attr, value);
}

/* What the kernel file reads of the backend's context (the real one is in kcuda.cuh). */
struct ddp_kctx {
    int device;
    cudaStream_t stream;
    int err;       /* first error, as kcuda.cuh's */
    void *scratch; /* ddp__cuda_scratch's buffer: malloc'ed, exactly the last size that grew it */
    size_t scratch_bytes;
    ddp_kprec_t prec;
};

/* Logged errors go to stderr and are counted (emu_errors_logged). */
void emu_log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
#define DDP_ERROR(...) emu_log_error(__VA_ARGS__)

/* kcuda.cuh's contracts: record e (first error kept); check the last launch; enter an op
 * (0 = go on); grow-only scratch (the emulator's is host memory, NaN-filled when it grows). */
int ddp__cuda_check(ddp_kctx_t *ctx, cudaError_t e, const char *what);
int ddp__cuda_launched(ddp_kctx_t *ctx, const char *what);
int ddp__cuda_enter(ddp_kctx_t *ctx);
int ddp__cuda_scratch(ddp_kctx_t *ctx, size_t bytes, void **out);

/* The entry points of flash_attention.cu (declared as in kcuda.cuh). */
int ddp__cuda_flash_supported(const ddp_kctx_t *ctx, int C, int NH);
void ddp__cuda_flash_fwd(ddp_kctx_t *ctx, void *out, float *lse, const void *qkv, int B, int T,
                         int C, int NH, int NKV);
void ddp__cuda_flash_bwd(ddp_kctx_t *ctx, void *dqkv, const void *dout, const void *qkv,
                         const void *out, const float *lse, int B, int T, int C, int NH,
                         int NKV);

/* ---- Launches ---- */

/* Runs `body` as every thread of every block of grid x block, shared memory smem bytes; a
 * launch error (too much shared memory, a bad block size) is returned by the next
 * cudaGetLastError, as on the GPU. kernel identifies the function for its attributes. */
void emu_run_grid(const void *kernel, dim3 grid, dim3 block, size_t smem,
                  const std::function<void()> &body);

/* kernel<<<grid, block, smem, stream>>>(args...): each thread gets its own copy of the
 * arguments, converted to the kernel's parameter types as the call would. */
template <typename... P, typename... A>
void emu_launch(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                A... args)
{
    (void)stream;
    emu_run_grid(reinterpret_cast<const void *>(kernel), grid, block, smem,
                 [&] { kernel(args...); });
}

/* ---- Controls and counters for the harness ---- */
enum emu_order { EMU_ORDER_FORWARD, EMU_ORDER_REVERSE };
void emu_set_order(emu_order order);    /* which thread of a block runs first after a barrier */
enum emu_landing { EMU_LAND_AT_ISSUE, EMU_LAND_AT_WAIT };
void emu_set_landing(emu_landing when); /* when a cp.async copy reaches shared memory */
void emu_set_cc_major(int major);       /* cudaDeviceGetAttribute's answer */
long emu_errors_logged();               /* DDP_ERROR calls so far */
long emu_collectives();                 /* warp collectives and block barriers so far */
void emu_shutdown();                    /* frees the fibers' stacks (at the end of a run) */

#endif
