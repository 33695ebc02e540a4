/* The tiles flash_attention.cu's kernels are built of: 16-bit values packed for the tensor
 * cores and their product (mma.sync m16n8k16, fp32 accumulation), fragments loaded from
 * shared-memory tiles by ldmatrix, products of a warp's m-tiles by a tile, and the tiles staged
 * from global memory by cp.async. Device code only, included by flash_attention.cu (and inlined
 * with it by tests/unit/kernels_cuda/emu/transform.py, which runs both on the CPU emulator).
 */
#ifndef DDP_KERNELS_CUDA_FLASH_TILES_CUH
#define DDP_KERNELS_CUDA_FLASH_TILES_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

/* The tile geometry */
#define FA_BR 64       /* query rows of a block */
#define FA_BC 64       /* keys of a K/V tile */
#define FA_THREADS 128 /* 4 warps, 16 query rows (or keys) each */
#define FA_PAD 8       /* 16-bit elements of padding at the end of a shared-memory row */

/* ---- 16-bit types: packing and the tensor-core product ----
 *
 * mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}: D[16x8] = A[16x16] B[16x8] + C, one warp.
 * With g = lane >> 2 (groupID) and t = lane & 3 (thread in group), each lane holds:
 *   A (row-major 16x16), four 32-bit registers of two elements (low half = lower column):
 *     a[0] = A[g][2t, 2t+1]     a[1] = A[g+8][2t, 2t+1]
 *     a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
 *   B (16x8, "col": pairs run along k), two registers:
 *     b[0] = B[2t, 2t+1][g]     b[1] = B[2t+8, 2t+9][g]
 *   C, D (16x8 fp32): c[0], c[1] = C[g][2t, 2t+1];  c[2], c[3] = C[g+8][2t, 2t+1].
 * The register trick: the accumulators of two adjacent n-tiles 2kk, 2kk+1 of a 16x64 product
 * are, packed pairwise, the A operand of k-step kk of the next product:
 *   a[0] = pack(c_2kk[0], c_2kk[1])     a[1] = pack(c_2kk[2], c_2kk[3])
 *   a[2] = pack(c_2kk+1[0], c_2kk+1[1]) a[3] = pack(c_2kk+1[2], c_2kk+1[3])
 * (rows g / g+8, k = 16kk + 2t (+8): exactly the columns those accumulators hold). */
template <typename T16> struct fa_type;

template <> struct fa_type<__nv_bfloat16> {
    static __device__ __forceinline__ float to_float(__nv_bfloat16 x)
    {
        return __bfloat162float(x);
    }
    /* lo in bits 0..15, hi in 16..31; round to nearest even (as __float2bfloat16_rn) */
    static __device__ __forceinline__ uint32_t pack(float lo, float hi)
    {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        uint32_t u;
        memcpy(&u, &v, sizeof u);
        return u;
    }
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0,
                                               uint32_t b1)
    {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

template <> struct fa_type<__half> {
    static __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
    /* lo in bits 0..15, hi in 16..31; round to nearest even, overflow gives Inf */
    static __device__ __forceinline__ uint32_t pack(float lo, float hi)
    {
        __half2 v = __floats2half2_rn(lo, hi);
        uint32_t u;
        memcpy(&u, &v, sizeof u);
        return u;
    }
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0,
                                               uint32_t b1)
    {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
            "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

/* ---- Fragments from shared memory: ldmatrix ----
 *
 * ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 loads four 8x8 16-bit matrices; lanes
 * 8m..8m+7 give the addresses of rows 0..7 of matrix m (16 bytes each, 16-byte aligned), and
 * register r[m] of lane l receives, of matrix m:
 *   without .trans: M[l >> 2][2(l & 3)], M[l >> 2][2(l & 3) + 1]   (row g, columns 2t, 2t+1)
 *   with .trans:    M[2(l & 3)][l >> 2], M[2(l & 3) + 1][l >> 2]   (rows 2t, 2t+1, column g)
 * (first element in the low half). Tiles are row-major with row stride LD elements; LD*2 bytes is
 * a multiple of 16 and 4 (mod 32) words, so the 8 rows of a matrix fall in 8 distinct 4-bank
 * groups: no bank conflicts. The "memory" clobber orders them after the staging stores. */
static __device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void *p)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

static __device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const void *p)
{
    unsigned a = (unsigned)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

/* A operand: the 16x16 block of tile s at rows r0.., columns c0... Matrix m = rows r0 + 8(m&1),
 * columns c0 + 8(m>>1), so a[0] = (g, 2t), a[1] = (g+8, 2t), a[2] = (g, 2t+8), a[3] = (g+8,
 * 2t+8): the A layout above. */
template <int LD, typename T16>
static __device__ __forceinline__ void ld_a(uint32_t a[4], const T16 *s, int r0, int c0, int lane)
{
    ldsm_x4(a, s + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + c0 + (lane >> 4) * 8);
}

/* B operands of two n-tiles n0, n0+8 and k-step k0.. when the tile stores B transposed,
 * s[n][k] (K stored [key][d] for S = Q K^T: B[k = d][n = key] = K[key][d]). Matrix m = rows
 * n0 + 8(m>>1), columns k0 + 8(m&1); lane gets s[n0 + g][k0 + 2t, +1] = B[2t, 2t+1][g]:
 * b[0], b[1] = n-tile n0 (k 2t.., k 2t+8..), b[2], b[3] = n-tile n0 + 8. */
template <int LD, typename T16>
static __device__ __forceinline__ void ld_b(uint32_t b[4], const T16 *s, int n0, int k0, int lane)
{
    ldsm_x4(b, s + (n0 + (lane & 7) + (lane >> 4) * 8) * LD + k0 + ((lane >> 3) & 1) * 8);
}

/* B operands of two n-tiles n0, n0+8 and k-step k0.. when the tile stores B itself, s[k][n]
 * (V stored [key][d] for O = P V: B[k = key][n = d] = V[key][d]). With .trans, matrix m = rows
 * k0 + 8(m&1), columns n0 + 8(m>>1); lane gets s[k0 + 2t, +1][n0 + g] = B[2t, 2t+1][g]:
 * b[0], b[1] = n-tile n0 (k 2t.., k 2t+8..), b[2], b[3] = n-tile n0 + 8. */
template <int LD, typename T16>
static __device__ __forceinline__ void ld_bt(uint32_t b[4], const T16 *s, int k0, int n0, int lane)
{
    ldsm_x4_trans(b, s + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n0 + (lane >> 4) * 8);
}

/* For each of MT m-tiles, acc[mt][16 x 8*NT] += a[mt][16 x 16] times the k-step of a
 * 16 x 8*NT product whose B is stored as s[n][k] (ld_b), n-tiles from 0: each B fragment is
 * loaded once for the MT m-tiles. An m-tile's accumulators see the same sequence of products
 * whatever MT is. */
template <typename T16, int LD, int NT, int MT>
static __device__ __forceinline__ void mma_rows_b(float (*acc)[NT][4], const uint32_t (*a)[4],
                                                  const T16 *s, int k0, int lane)
{
#pragma unroll
    for (int np = 0; np < NT / 2; np++) {
        uint32_t bb[4];
        ld_b<LD>(bb, s, np * 16, k0, lane);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            fa_type<T16>::mma(acc[mt][2 * np], a[mt], bb[0], bb[1]);
            fa_type<T16>::mma(acc[mt][2 * np + 1], a[mt], bb[2], bb[3]);
        }
    }
}

/* The same when B is stored as s[k][n] (ld_bt), k-step k0. */
template <typename T16, int LD, int NT, int MT>
static __device__ __forceinline__ void mma_rows_bt(float (*acc)[NT][4], const uint32_t (*a)[4],
                                                   const T16 *s, int k0, int lane)
{
#pragma unroll
    for (int np = 0; np < NT / 2; np++) {
        uint32_t bb[4];
        ld_bt<LD>(bb, s, k0, np * 16, lane);
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            fa_type<T16>::mma(acc[mt][2 * np], a[mt], bb[0], bb[1]);
            fa_type<T16>::mma(acc[mt][2 * np + 1], a[mt], bb[2], bb[3]);
        }
    }
}

/* The A operand of k-step kk from the fp32 accumulators of n-tiles 2kk and 2kk+1 (the register
 * trick above). */
template <typename T16>
static __device__ __forceinline__ void acc_to_a(uint32_t a[4], const float (*c)[4], int kk)
{
    a[0] = fa_type<T16>::pack(c[2 * kk][0], c[2 * kk][1]);
    a[1] = fa_type<T16>::pack(c[2 * kk][2], c[2 * kk][3]);
    a[2] = fa_type<T16>::pack(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[3] = fa_type<T16>::pack(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

/* ---- Staging: cp.async, double-buffered ----
 *
 * Tiles go from global to shared memory by cp.async (sm_80+: no registers on the way, the
 * copy runs while the block computes). cp.async.cg moves 16 bytes through L2 only; with
 * src_bytes 0 it reads nothing and writes 16 zero bytes (rows >= T). A tile's copies are
 * committed as a group; cp.async.wait_group N waits until at most N of this thread's groups
 * are in flight, and the __syncthreads after it makes every thread's copies visible. Each
 * kernel keeps two buffers of the tiles it streams: tile j + 1's copies are issued right after
 * the barrier that starts tile j's work, which is also the barrier every warp passes after
 * its last read of tile j - 1, the buffer they overwrite. One barrier a tile. */
static __device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes)
{
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

/* 4 bytes (an fp32 row statistic); src_bytes 0 writes 0.0f */
static __device__ __forceinline__ void cp_async4(void *dst, const void *src, int src_bytes)
{
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}

static __device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int N> static __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Issues the copies of rows r0 .. r0+ROWS-1 (columns 0 .. HS-1) of a 16-bit matrix with row
 * stride ld into the tile dst[ROWS][HS + FA_PAD], as they are; rows >= T become zeros. Called
 * by the whole block; the caller commits. A lane moves 16 bytes (8 elements) a copy; a warp
 * reads 512 contiguous bytes at hs = 128 (two or four rows of 64 or 128 bytes at hs = 64, 32). */
template <typename T16, int HS, int ROWS = 64, int THREADS = FA_THREADS>
static __device__ __forceinline__ void stage(T16 *dst, const T16 *src, size_t ld, int r0, int T)
{
    constexpr int LD = HS + FA_PAD, CH = HS / 8; /* 16-byte chunks a row */
    static_assert(ROWS * CH % THREADS == 0, "whole steps");
    /* one copy at a time: unrolled, the address arithmetic costs the forward 30 registers */
#pragma unroll 1
    for (int idx = threadIdx.x; idx < ROWS * CH; idx += THREADS) {
        const int r = idx / CH, c = (idx % CH) * 8;
        const bool in = r0 + r < T;
        cp_async16(dst + r * LD + c, in ? src + (size_t)(r0 + r) * ld + c : src, in ? 16 : 0);
    }
}

/* Stores the fp32 pair (x, y) rounded to T16 at p (4-byte aligned: an even element). */
template <typename T16> static __device__ __forceinline__ void store2(T16 *p, float x, float y)
{
    *reinterpret_cast<uint32_t *>(p) = fa_type<T16>::pack(x, y);
}

#endif
