/* Causal flash attention (FlashAttention-2 style) on bf16/fp16 tensor cores, forward and a
 * deterministic backward. Nothing of the [T, T] score matrix ever reaches global memory.
 *
 * Shapes (hs = C/NH in {32, 64, 128}; scale = 1/sqrt(hs); NKV K/V heads, NH % NKV == 0, group
 * = NH/NKV query heads a K/V head); the activations are of the run's 16-bit type T16 (bf16 for
 * ctx->prec BF16, fp16 for FP16), lse fp32:
 *   qkv[B,T,QKV]  QKV = C + 2 NKV hs: query head h at offset h*hs of a position, K/V head kvh at
 *                 C + kvh*hs and C + NKV*hs + kvh*hs; query head h reads K/V head h / group
 *   out[B,T,C]    softmax_causal(scale Q K^T) V per query head (head h at h*hs); dout alike
 *   lse[B,NH,T]   natural-log log-sum-exp of row t's scaled scores over t2 <= t
 *   dqkv[B,T,QKV] backward OVERWRITES it with dq, dk, dv (the activation gradients' contract)
 * Precision: tiles are copied into shared memory as they are (16-bit); products accumulate in
 * fp32 (mma.sync m16n8k16); softmax statistics, P's row sums, lse and D are fp32. P (forward)
 * and dS (backward) are rounded to T16 as the A operand of the second product; out, dq, dk, dv
 * are rounded to T16 once, on store (round to nearest even; fp16 overflow gives Inf).
 *
 * Tiles (their primitives in flash_tiles.cuh): BR = 64 query rows a block, BC = 64 keys a tile; the backward's blocks are 4 warps of
 * 16 rows (or keys), the forward's at hs <= 64 2 warps of 32 rows (two m-tiles a warp, each K
 * and V fragment loaded once for both; DDP_FA_FWD_ROWS=16 takes 4 warps of 16, the same
 * bits). Shared tiles are row-major [64][hs + 8] (the 16-byte pad keeps ldmatrix
 * conflict-free).
 * The tiles a block streams come by cp.async into two buffers: the next tile's copies run
 * while the block computes on the present one (see "Staging").
 *   forward  grid (B*NH, ceil(T/64)), heavy diagonal blocks first. Q lives in registers, K and V
 *            tiles j <= i stream through shared memory; S stays in registers and becomes the A
 *            operand of P V. 20/36/68 KB of shared memory for hs = 32/64/128.
 *   backward (1) D = rowsum(dout * out) [B,NH,T] into ctx scratch, a warp per row.
 *            (2) dK/dV kernel, grid (B*NKV, ceil(T/64)): a block owns 64 keys, loops over the
 *                queries q >= its first key in Q tiles of QB rows (64; 32 at hs = 128, for
 *                registers), in order; recomputes P^T = exp(scale K Q^T - lse) per warp
 *                (16 keys x QB queries) and accumulates dV += P^T dO, dK += dS^T Q.
 *                31/55/69 KB of shared memory.
 *            (3) dQ kernel, grid (B*NH, ceil(T/64)): a block owns 64 query rows, loops over the
 *                K/V tiles j <= i in order and accumulates dQ += dS K. 30/54/68 KB (hs = 128:
 *                one K/V buffer, fa_dq_buffers).
 *            No atomics; every output element is added by one thread after a fixed-order sum,
 *            so the backward is bitwise reproducible. Shared memory above 48 KB is opted into
 *            per launch (cudaFuncSetAttribute).
 * Grouped-query attention: Q and K/V are addressed separately (base, row stride, head), with
 * kv_head = q_head / group. The forward and dQ kernels take one query head a block, whatever
 * the group; the dK/dV kernel takes one K/V head a block and sums its group's query heads in
 * ascending order inside the block (their Q tiles one after another into the same
 * accumulators): no atomics, and the same order on every run. group = 1 is multi-head
 * attention, exactly the kernels' work before grouping. Every head size keeps its kernels.
 * Limits: ceil(T/64) <= 65535 (grid y), B*NH < 2^31; qkv, out, dout, dqkv 16-byte aligned;
 * compute capability >= 8.0. Registers: up to about 245 a thread (dK/dV at hs = 128; the
 * forward with two m-tiles at hs = 64, 230), none spilled; 128 threads a block (64 for the
 * forward with two m-tiles).
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <string.h>

#include "kernels/cuda/flash_tiles.cuh"
#include "kernels/cuda/kcuda.cuh"

/* The diagonal logic (tile i of queries meets tile i of keys) needs square tiles. */
static_assert(FA_BR == FA_BC, "query and key tiles must match");

static constexpr float FA_LOG2E = 1.4426950408889634f;
static constexpr float FA_LN2 = 0.6931471805599453f;

/* What a kernel reads and writes. Q, K, V (and dQ, dK, dV) are addressed by base pointer, row
 * stride and head: row t of query head h of batch b is q + (b*T + t)*ld_q + h*hs; K/V head kvh =
 * h / group at k, v + (b*T + t)*ld_kv + kvh*hs. The activations are T16 arrays (the kernel's
 * template type; void here so that one struct serves both types). */
struct fa_params {
    const void *q, *k, *v;    /* forward and backward inputs */
    void *dq, *dk, *dv;       /* backward outputs (overwritten), addressed like q, k, v */
    void *out;                /* forward output [B,T,ld_o] */
    const void *dout;         /* backward input [B,T,ld_o] */
    float *lse;               /* [B,NH,T]: written by the forward, read by the backward */
    const float *dsum;        /* [B,NH,T]: D = rowsum(dout * out), backward */
    size_t ld_q, ld_kv, ld_o; /* row strides, in elements */
    int T, NH, group;         /* NH query heads; `group` of them share a K/V head */
    float scale;              /* 1/sqrt(hs) */
    float sl2;                /* scale * log2(e): scores go to exp2 */
};

/* ---- Forward ----
 * Block (bh = b*NH + h, query tile i), heaviest (largest i) first. A warp owns MT m-tiles of
 * 16 query rows, 4 / MT warps a block (fa_fwd_rows: MT = 2 at hs <= 64, 230 registers at hs =
 * 64; 1 at hs = 128, where two would need about 300): m-tile mt of warp w holds rows
 * q0 + 16(MT w + mt) + g (accumulator elements 0, 1) and + 8 (elements 2, 3). Each B fragment of K or V loaded from
 * shared memory serves the warp's MT m-tiles: at hs <= 64 half the shared-memory reads a
 * product of 16 rows a warp needs, and two independent chains of products a warp. Per K/V
 * tile: S = Q K^T (16 MT x 64 a warp), scaled by scale*log2(e), masked above the diagonal on
 * tile i; the running max m and sum l per row (log2 domain), o rescaled by exp2(m_old -
 * m_new). Each lane sums only its own 16 columns of l; the 4 lanes of a row add theirs at the
 * end. Every row's arithmetic is that of the one-m-tile kernel. */
template <typename T16, int HS, int MT>
static __global__ void __launch_bounds__(FA_THREADS / MT) fa_fwd_kernel(fa_params p)
{
    extern __shared__ __align__(16) unsigned char fa_smem[];
    constexpr int LD = HS + FA_PAD, TILE = FA_BC * LD, THREADS = FA_THREADS / MT;
    T16 *sK = reinterpret_cast<T16 *>(fa_smem); /* [2][BC][LD]; buffer 1 first holds Q */
    T16 *sV = sK + 2 * TILE;                     /* [2][BC][LD] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int T = p.T, h = (int)(blockIdx.x % p.NH), b = (int)(blockIdx.x / p.NH);
    const int kvh = h / p.group;
    const int i = (int)(gridDim.y - 1 - blockIdx.y), q0 = i * FA_BR;
    const T16 *qg = static_cast<const T16 *>(p.q) + (size_t)b * T * p.ld_q + (size_t)h * HS;
    const T16 *kg = static_cast<const T16 *>(p.k) + (size_t)b * T * p.ld_kv + (size_t)kvh * HS;
    const T16 *vg = static_cast<const T16 *>(p.v) + (size_t)b * T * p.ld_kv + (size_t)kvh * HS;
    const int row0 = q0 + warp * 16 * MT + g; /* m-tile mt: row0 + 16 mt, and + 8 */

    stage<T16, HS, FA_BR, THREADS>(sK + TILE, qg, p.ld_q, q0, T);
    cp_async_commit();
    stage<T16, HS, FA_BC, THREADS>(sK, kg, p.ld_kv, 0, T);
    stage<T16, HS, FA_BC, THREADS>(sV, vg, p.ld_kv, 0, T);
    cp_async_commit();
    cp_async_wait<1>(); /* Q has landed; K/V tile 0 may still be on its way */
    __syncthreads();
    uint32_t qf[HS / 16][MT][4]; /* k-step ks of m-tile mt: qf[ks][mt] */
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int ks = 0; ks < HS / 16; ks++)
            ld_a<LD>(qf[ks][mt], sK + TILE, (warp * MT + mt) * 16, ks * 16, lane);

    float o[MT][HS / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < HS / 8; n++)
            o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
    float mx[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) mx[mt][0] = mx[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;

    for (int j = 0; j <= i; j++) {
        const int k0 = j * FA_BC;
        cp_async_wait<0>();
        __syncthreads(); /* tile j is in; every warp is done with tile j - 1 (and with Q) */
        if (j < i) {
            const int nb = ((j + 1) & 1) * TILE;
            stage<T16, HS, FA_BC, THREADS>(sK + nb, kg, p.ld_kv, k0 + FA_BC, T);
            stage<T16, HS, FA_BC, THREADS>(sV + nb, vg, p.ld_kv, k0 + FA_BC, T);
            cp_async_commit();
        }
        const T16 *cK = sK + (j & 1) * TILE, *cV = sV + (j & 1) * TILE;

        /* S = Q K^T: each pair of K n-tiles loaded once for the MT m-tiles */
        float s[MT][FA_BC / 8][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int n = 0; n < FA_BC / 8; n++)
                s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < HS / 16; ks++)
            mma_rows_b<T16, LD, FA_BC / 8, MT>(s, qf[ks], cK, ks * 16, lane);

#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const int rowm = row0 + 16 * mt;
            /* Scale into the log2 domain; on the diagonal tile (k0 == q0) mask key > row,
             * which also masks every key >= T of a row < T. Keys of tiles j < i are all < q0
             * < T. */
            float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int n = 0; n < FA_BC / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float x = s[mt][n][e] * p.sl2;
                    if (j == i && k0 + n * 8 + 2 * t + (e & 1) > rowm + (e >> 1) * 8)
                        x = -INFINITY;
                    s[mt][n][e] = x;
                    tmax[e >> 1] = fmaxf(tmax[e >> 1], x);
                }
#pragma unroll
            for (int r = 0; r < 2; r++) {
                /* the 4 lanes of a row (same g) are lanes 4g .. 4g+3 */
                tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 1));
                tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 2));
                float mnew = fmaxf(mx[mt][r], tmax[r]);
                /* A row with no key yet (mnew = -inf) keeps p = 0, alpha = 0, l = o = 0: no
                 * NaN. Causal rows always see key 0 on tile 0, so this is only a guard. */
                float muse = mnew == -INFINITY ? 0.0f : mnew;
                float alpha = exp2f(mx[mt][r] - muse); /* mx = -inf on the first tile: 0 */
                mx[mt][r] = mnew;
                float ls = 0.0f;
#pragma unroll
                for (int n = 0; n < FA_BC / 8; n++) {
                    float p0 = exp2f(s[mt][n][2 * r] - muse);
                    float p1 = exp2f(s[mt][n][2 * r + 1] - muse);
                    s[mt][n][2 * r] = p0;
                    s[mt][n][2 * r + 1] = p1;
                    ls += p0 + p1;
                }
                l[mt][r] = l[mt][r] * alpha + ls;
#pragma unroll
                for (int n = 0; n < HS / 8; n++) {
                    o[mt][n][2 * r] *= alpha;
                    o[mt][n][2 * r + 1] *= alpha;
                }
            }
        }

        /* o += P V: P's accumulators are the A operands (k = key); each pair of V n-tiles
         * loaded once for the MT m-tiles */
#pragma unroll
        for (int kk = 0; kk < FA_BC / 16; kk++) {
            uint32_t pa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) acc_to_a<T16>(pa[mt], s[mt], kk);
            mma_rows_bt<T16, LD, HS / 8, MT>(o, pa, cV, kk * 16, lane);
        }
    }

#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float lsum = l[mt][r] + __shfl_xor_sync(0xffffffffu, l[mt][r], 1);
            lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
            const int row = row0 + 16 * mt + r * 8;
            if (row >= T) continue; /* padding rows are never stored */
            const float inv = 1.0f / lsum; /* lsum >= 1: the row max contributes exp2(0) */
            T16 *op = static_cast<T16 *>(p.out) + ((size_t)b * T + row) * p.ld_o +
                      (size_t)h * HS + 2 * t;
#pragma unroll
            for (int n = 0; n < HS / 8; n++)
                store2(op + n * 8, o[mt][n][2 * r] * inv, o[mt][n][2 * r + 1] * inv);
            if (t == 0) p.lse[((size_t)b * p.NH + h) * T + row] = mx[mt][r] * FA_LN2 + logf(lsum);
        }
}

/* ---- Backward ---- */

/* D[r] = sum_c dout[row][c] * out[row][c] over a head's hs columns, r = (b*NH + h)*T + t, in
 * fp32 from the 16-bit tensors. HS/8 lanes a row (4, 8 or 16: a warp takes 8, 4 or 2 rows),
 * each with one 16-byte load of dout and of out and their 8 products summed in order, then the
 * row's lanes added by a fixed xor butterfly; the row's first lane stores. Where a warp a row
 * made 2-byte loads and left most of its lanes idle, this reads the two tensors at full width
 * (they are 16-byte aligned, and a head's hs elements start at a multiple of 8). */
template <typename T16, int HS>
static __global__ void fa_rowdot_kernel(float *d, const void *dout_v, const void *o_v, size_t ld_o,
                                        int T, int NH, long rows)
{
    constexpr int LPR = HS / 8;
    struct alignas(16) v8 {
        T16 e[8];
    };
    const int lane = threadIdx.x & 31;
    const long r = ((long)blockIdx.x * blockDim.x + threadIdx.x) / LPR;
    float s = 0.0f;
    if (r < rows) { /* every lane still joins the butterfly below */
        long bh = r / T;
        int t = (int)(r % T), h = (int)(bh % NH);
        size_t off = ((size_t)(bh / NH) * T + t) * ld_o + (size_t)h * HS + (size_t)(lane % LPR) * 8;
        v8 a = *reinterpret_cast<const v8 *>(static_cast<const T16 *>(dout_v) + off);
        v8 b = *reinterpret_cast<const v8 *>(static_cast<const T16 *>(o_v) + off);
#pragma unroll
        for (int k = 0; k < 8; k++)
            s += fa_type<T16>::to_float(a.e[k]) * fa_type<T16>::to_float(b.e[k]);
    }
#pragma unroll
    for (int m = LPR / 2; m > 0; m >>= 1) s += __shfl_xor_sync(0xffffffffu, s, m);
    if (r < rows && lane % LPR == 0) d[r] = s;
}

/* Query rows of the dK/dV kernel's inner Q tile: 32 at hs = 128, where dK and dV already take
 * 128 accumulator registers a lane (64 rows there spill), else 64. */
static constexpr __host__ __device__ int fa_dkv_qb(int hs) { return hs == 128 ? 32 : 64; }

/* dK, dV of K/V head kvh, keys k0 .. k0+63 (tile j = blockIdx.y; small j has the most work and
 * starts first). Warp w owns keys k0 + 16w + g (accumulator elements 0, 1) and + 8 (elements
 * 2, 3); its products run with keys as rows, so P^T and dS^T are already A operands:
 *   S^T  = K_w Q^T          (16 keys x QB queries; B = Q stored [q][d]: ld_b)
 *   P^T  = exp2(S^T scale log2e - lse[q] log2e), 0 where key > q or q >= T
 *   dV  += P^T dO           (B = dO stored [q][d] = [k][n]: ld_bt)
 *   dP^T = V_w dO^T         (ld_b on dO)
 *   dS^T = P^T (dP^T - D[q])
 *   dK  += dS^T Q           (ld_bt on Q), times scale once at the end
 * The query heads of the group, then their Q tiles q0 = k0, k0+QB, ... are visited in that
 * fixed order (tiles with q0 < k0 see no key of the block). */
template <typename T16, int HS>
static __global__ void __launch_bounds__(FA_THREADS) fa_bwd_dkv_kernel(fa_params p)
{
    extern __shared__ __align__(16) unsigned char fa_smem[];
    constexpr int LD = HS + FA_PAD, QB = fa_dkv_qb(HS);
    T16 *sK = reinterpret_cast<T16 *>(fa_smem); /* [BC][LD], the block's keys */
    T16 *sV = sK + FA_BC * LD;                   /* [BC][LD] */
    T16 *sQ = sV + FA_BC * LD;                   /* [2][QB][LD], Q tiles */
    T16 *sdO = sQ + 2 * QB * LD;                 /* [2][QB][LD] */
    float *sL = reinterpret_cast<float *>(sdO + 2 * QB * LD); /* [2][QB]: lse */
    float *sD = sL + 2 * QB;                                   /* [2][QB]: D */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int T = p.T, nkv = p.NH / p.group;
    const int kvh = (int)(blockIdx.x % nkv), b = (int)(blockIdx.x / nkv);
    const int k0 = (int)blockIdx.y * FA_BC;
    const int key0 = k0 + warp * 16 + g; /* and key0 + 8 */
    const int qh_end = (kvh + 1) * p.group;

    /* Issues the copies of query head qh's Q tile at q0 (Q, dO, lse, D) into buffer buf. */
    auto issue = [&](int buf, int qh, int q0) {
        stage<T16, HS, QB>(sQ + buf * QB * LD,
                           static_cast<const T16 *>(p.q) + (size_t)b * T * p.ld_q + (size_t)qh * HS,
                           p.ld_q, q0, T);
        stage<T16, HS, QB>(sdO + buf * QB * LD,
                           static_cast<const T16 *>(p.dout) + (size_t)b * T * p.ld_o +
                               (size_t)qh * HS,
                           p.ld_o, q0, T);
        if (threadIdx.x < QB) {
            const int q = q0 + threadIdx.x, in = q < T;
            const size_t r = ((size_t)b * p.NH + qh) * T + (in ? q : 0);
            cp_async4(sL + buf * QB + threadIdx.x, p.lse + r, in ? 4 : 0);
            cp_async4(sD + buf * QB + threadIdx.x, p.dsum + r, in ? 4 : 0);
        }
        cp_async_commit();
    };

    const size_t kvoff = (size_t)b * T * p.ld_kv + (size_t)kvh * HS;
    stage<T16, HS>(sK, static_cast<const T16 *>(p.k) + kvoff, p.ld_kv, k0, T);
    stage<T16, HS>(sV, static_cast<const T16 *>(p.v) + kvoff, p.ld_kv, k0, T);
    issue(0, kvh * p.group, k0); /* K and V are in the first group */

    float dk[HS / 8][4], dv[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;

    /* the group's query heads in order, each one's Q tiles q0 = k0, k0 + QB, ... in order */
    for (int it = 0, qh = kvh * p.group, q0 = k0;; it++) {
        int nqh = qh, nq0 = q0 + QB; /* the next tile */
        if (nq0 >= T) {
            nqh++;
            nq0 = k0;
        }
        const bool more = nqh < qh_end;
        cp_async_wait<0>();
        __syncthreads(); /* tile it is in; every warp is done with tile it - 1's buffer */
        if (more) issue((it + 1) & 1, nqh, nq0);
        const T16 *cQ = sQ + (it & 1) * QB * LD, *cdO = sdO + (it & 1) * QB * LD;
        const float *cL = sL + (it & 1) * QB, *cD = sD + (it & 1) * QB;

        float st[QB / 8][4];
#pragma unroll
        for (int n = 0; n < QB / 8; n++) st[n][0] = st[n][1] = st[n][2] = st[n][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < HS / 16; ks++) {
            uint32_t a[4];
            ld_a<LD>(a, sK, warp * 16, ks * 16, lane);
            mma_rows_b<T16, LD, QB / 8, 1>(&st, &a, cQ, ks * 16, lane);
        }
        /* masking: tiles that reach into the diagonal block (q0 < k0 + 64) and the tile
         * holding rows >= T */
        const bool edge = q0 < k0 + FA_BC || q0 + QB > T;
#pragma unroll
        for (int n = 0; n < QB / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int qi = n * 8 + 2 * t + (e & 1), q = q0 + qi;
                float x = exp2f(fmaf(st[n][e], p.sl2, -(cL[qi] * FA_LOG2E)));
                if (edge && (key0 + (e >> 1) * 8 > q || q >= T)) x = 0.0f;
                st[n][e] = x;
            }
#pragma unroll
        for (int kk = 0; kk < QB / 16; kk++) {
            uint32_t pa[4];
            acc_to_a<T16>(pa, st, kk);
            mma_rows_bt<T16, LD, HS / 8, 1>(&dv, &pa, cdO, kk * 16, lane);
        }

        float dpt[QB / 8][4];
#pragma unroll
        for (int n = 0; n < QB / 8; n++) dpt[n][0] = dpt[n][1] = dpt[n][2] = dpt[n][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < HS / 16; ks++) {
            uint32_t a[4];
            ld_a<LD>(a, sV, warp * 16, ks * 16, lane);
            mma_rows_b<T16, LD, QB / 8, 1>(&dpt, &a, cdO, ks * 16, lane);
        }
        /* dS^T = P^T (dP^T - D[q]); masked entries have P = 0, dP and D finite: 0 */
#pragma unroll
        for (int n = 0; n < QB / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                dpt[n][e] = st[n][e] * (dpt[n][e] - cD[n * 8 + 2 * t + (e & 1)]);
#pragma unroll
        for (int kk = 0; kk < QB / 16; kk++) {
            uint32_t da[4];
            acc_to_a<T16>(da, dpt, kk);
            mma_rows_bt<T16, LD, HS / 8, 1>(&dk, &da, cQ, kk * 16, lane);
        }
        if (!more) break;
        qh = nqh;
        q0 = nq0;
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = key0 + r * 8;
        if (key >= T) continue;
        const size_t off = ((size_t)b * T + key) * p.ld_kv + (size_t)kvh * HS + 2 * t;
        T16 *pk = static_cast<T16 *>(p.dk) + off, *pv = static_cast<T16 *>(p.dv) + off;
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            store2(pk + n * 8, p.scale * dk[n][2 * r], p.scale * dk[n][2 * r + 1]);
            store2(pv + n * 8, dv[n][2 * r], dv[n][2 * r + 1]);
        }
    }
}

/* K/V buffers of the dQ kernel: two, unless its six tiles would pass 99 KB of shared memory,
 * the opt-in limit of compute capability 8.6 and 8.9 (hs = 128: one buffer, 68 KB, its copies
 * issued after the barrier that ends a tile's reads). */
static constexpr __host__ __device__ int fa_dq_buffers(int hs)
{
    return 6 * FA_BC * (hs + FA_PAD) * 2 <= 99 * 1024 ? 2 : 1;
}

/* dQ of query head h, rows q0 .. q0+63 (tile i, heaviest first). Warp w owns rows q0 + 16w + g
 * and + 8. Per K/V tile j = 0 .. i, in order:
 *   S  = Q_w K^T (ld_b on K),  P = exp2(S scale log2e - lse log2e), 0 where key > row (tile i)
 *   dP = dO_w V^T (ld_b on V), dS = P (dP - D)
 *   dQ += dS K   (ld_bt on K), times scale once at the end.
 * Rows >= T (zero Q, dO; lse = D = 0) give finite values and are never stored. */
template <typename T16, int HS>
static __global__ void __launch_bounds__(FA_THREADS) fa_bwd_dq_kernel(fa_params p)
{
    extern __shared__ __align__(16) unsigned char fa_smem[];
    constexpr int LD = HS + FA_PAD, TILE = FA_BC * LD, NB = fa_dq_buffers(HS);
    T16 *sQ = reinterpret_cast<T16 *>(fa_smem); /* [BR][LD] */
    T16 *sdO = sQ + FA_BR * LD;                  /* [BR][LD] */
    T16 *sK = sdO + FA_BR * LD;                  /* [NB][BC][LD], K/V tiles */
    T16 *sV = sK + NB * TILE;                    /* [NB][BC][LD] */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int T = p.T, h = (int)(blockIdx.x % p.NH), b = (int)(blockIdx.x / p.NH);
    const int kvh = h / p.group;
    const int i = (int)(gridDim.y - 1 - blockIdx.y), q0 = i * FA_BR;
    const T16 *kg = static_cast<const T16 *>(p.k) + (size_t)b * T * p.ld_kv + (size_t)kvh * HS;
    const T16 *vg = static_cast<const T16 *>(p.v) + (size_t)b * T * p.ld_kv + (size_t)kvh * HS;
    const int row0 = q0 + warp * 16 + g; /* and row0 + 8 */
    const size_t rbase = ((size_t)b * p.NH + h) * T;

    stage<T16, HS>(sQ, static_cast<const T16 *>(p.q) + (size_t)b * T * p.ld_q + (size_t)h * HS,
                   p.ld_q, q0, T);
    stage<T16, HS>(sdO,
                   static_cast<const T16 *>(p.dout) + (size_t)b * T * p.ld_o + (size_t)h * HS,
                   p.ld_o, q0, T);
    stage<T16, HS>(sK, kg, p.ld_kv, 0, T);
    stage<T16, HS>(sV, vg, p.ld_kv, 0, T);
    cp_async_commit();
    float lse2[2], dd[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row0 + r * 8;
        lse2[r] = row < T ? p.lse[rbase + row] * FA_LOG2E : 0.0f;
        dd[r] = row < T ? p.dsum[rbase + row] : 0.0f;
    }

    float dq[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;

    for (int j = 0; j <= i; j++) {
        const int k0 = j * FA_BC;
        /* the copies of tile j + 1 into buffer (j + 1) % NB */
        auto issue_next = [&] {
            const int nb = (j + 1) % NB * TILE;
            stage<T16, HS>(sK + nb, kg, p.ld_kv, k0 + FA_BC, T);
            stage<T16, HS>(sV + nb, vg, p.ld_kv, k0 + FA_BC, T);
            cp_async_commit();
        };
        cp_async_wait<0>();
        __syncthreads(); /* tile j is in (and Q, dO); every warp is done with tile j - 1 */
        if (NB == 2 && j < i) issue_next();
        const T16 *cK = sK + j % NB * TILE, *cV = sV + j % NB * TILE;

        float s[FA_BC / 8][4], dp[FA_BC / 8][4];
#pragma unroll
        for (int n = 0; n < FA_BC / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < HS / 16; ks++) {
            uint32_t a[4];
            ld_a<LD>(a, sQ, warp * 16, ks * 16, lane);
            mma_rows_b<T16, LD, FA_BC / 8, 1>(&s, &a, cK, ks * 16, lane);
            ld_a<LD>(a, sdO, warp * 16, ks * 16, lane);
            mma_rows_b<T16, LD, FA_BC / 8, 1>(&dp, &a, cV, ks * 16, lane);
        }
#pragma unroll
        for (int n = 0; n < FA_BC / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1;
                float x = exp2f(fmaf(s[n][e], p.sl2, -lse2[r]));
                if (j == i && k0 + n * 8 + 2 * t + (e & 1) > row0 + r * 8) x = 0.0f;
                dp[n][e] = x * (dp[n][e] - dd[r]);
            }
#pragma unroll
        for (int kk = 0; kk < FA_BC / 16; kk++) {
            uint32_t da[4];
            acc_to_a<T16>(da, dp, kk);
            mma_rows_bt<T16, LD, HS / 8, 1>(&dq, &da, cK, kk * 16, lane);
        }
        if (NB == 1 && j < i) {
            __syncthreads(); /* every warp is done with the one buffer */
            issue_next();
        }
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row0 + r * 8;
        if (row >= T) continue;
        T16 *dst = static_cast<T16 *>(p.dq) + ((size_t)b * T + row) * p.ld_q + (size_t)h * HS +
                   2 * t;
#pragma unroll
        for (int n = 0; n < HS / 8; n++)
            store2(dst + n * 8, p.scale * dq[n][2 * r], p.scale * dq[n][2 * r + 1]);
    }
}

/* ---- Host side ---- */

typedef void (*fa_kernel_t)(fa_params);

enum { FA_FWD, FA_BWD_DKV, FA_BWD_DQ, FA_NKINDS };

/* The forward's m-tiles a warp: 2 (32 rows a warp, 2 warps a block) at hs <= 64 unless
 * DDP_FA_FWD_ROWS=16 asks for the one-m-tile kernel (4 warps of 16 rows), which gives the same
 * bits: the benchmarks compare the two (tests/gpu/attention_times.c). */
static int fa_fwd_mt(int hs)
{
    const char *rows = getenv("DDP_FA_FWD_ROWS");
    return hs <= 64 && !(rows && !strcmp(rows, "16")) ? 2 : 1;
}

/* [MT - 1][0 bf16, 1 fp16][hs 32, 64, 128]: the forward's instantiations (none with 2 m-tiles
 * at hs = 128) */
static const fa_kernel_t fa_fwd_kernels[2][2][3] = {
    {{fa_fwd_kernel<__nv_bfloat16, 32, 1>, fa_fwd_kernel<__nv_bfloat16, 64, 1>,
      fa_fwd_kernel<__nv_bfloat16, 128, 1>},
     {fa_fwd_kernel<__half, 32, 1>, fa_fwd_kernel<__half, 64, 1>,
      fa_fwd_kernel<__half, 128, 1>}},
    {{fa_fwd_kernel<__nv_bfloat16, 32, 2>, fa_fwd_kernel<__nv_bfloat16, 64, 2>, NULL},
     {fa_fwd_kernel<__half, 32, 2>, fa_fwd_kernel<__half, 64, 2>, NULL}},
};

/* [kind][0 bf16, 1 fp16][hs 32, 64, 128]: the backward's instantiations (kind FA_FWD: see
 * fa_fwd_kernels) */
static const fa_kernel_t fa_kernels[FA_NKINDS][2][3] = {
    {{NULL, NULL, NULL}, {NULL, NULL, NULL}},
    {{fa_bwd_dkv_kernel<__nv_bfloat16, 32>, fa_bwd_dkv_kernel<__nv_bfloat16, 64>,
      fa_bwd_dkv_kernel<__nv_bfloat16, 128>},
     {fa_bwd_dkv_kernel<__half, 32>, fa_bwd_dkv_kernel<__half, 64>,
      fa_bwd_dkv_kernel<__half, 128>}},
    {{fa_bwd_dq_kernel<__nv_bfloat16, 32>, fa_bwd_dq_kernel<__nv_bfloat16, 64>,
      fa_bwd_dq_kernel<__nv_bfloat16, 128>},
     {fa_bwd_dq_kernel<__half, 32>, fa_bwd_dq_kernel<__half, 64>, fa_bwd_dq_kernel<__half, 128>}},
};

/* Dynamic shared memory of a kernel kind at head size hs (bytes). */
static size_t fa_smem_bytes(int kind, int hs)
{
    size_t row = (size_t)(hs + FA_PAD) * 2, tile = 64 * row; /* a [64][hs + pad] 16-bit tile */
    if (kind == FA_FWD) return 4 * tile;    /* K, V: two buffers each */
    if (kind == FA_BWD_DQ) return (2 + 2 * (size_t)fa_dq_buffers(hs)) * tile; /* Q, dO; K, V */
    size_t qb = (size_t)fa_dkv_qb(hs);      /* K, V; Q, dO, lse, D: two buffers each */
    return 2 * tile + 2 * (2 * qb * row + 2 * qb * sizeof(float));
}

int ddp__cuda_flash_supported(const ddp_kctx_t *ctx, int C, int NH)
{
    if (!ctx || C <= 0 || NH <= 0 || C % NH) return 0;
    if (ctx->prec != DDP_KPREC_BF16 && ctx->prec != DDP_KPREC_FP16) return 0;
    int hs = C / NH;
    if (hs != 32 && hs != 64 && hs != 128) return 0;
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ctx->device) !=
        cudaSuccess) {
        cudaGetLastError(); /* not an op error: the shape is just not taken */
        return 0;
    }
    return major >= 8; /* mma.sync m16n8k16 bf16/fp16 */
}

/* Records rc on ctx (first error kept) with a message; always returns rc. */
static int fa_fail(ddp_kctx_t *ctx, int rc, const char *what, const char *why)
{
    DDP_ERROR("cuda: %s: %s", what, why);
    if (ctx->err == 0) ctx->err = rc;
    return rc;
}

/* Validates the call and fills the parts of p common to forward and backward. */
static int fa_setup(ddp_kctx_t *ctx, fa_params *p, const void *qkv, const void *aligned[3], int B,
                    int T, int C, int NH, int NKV, const char *what)
{
    if (NKV <= 0 || NH % NKV)
        return fa_fail(ctx, DDP_EINVAL, what, "NH is not a multiple of NKV");
    if (!ddp__cuda_flash_supported(ctx, C, NH))
        return fa_fail(ctx, DDP_ENOTSUP, what, "shape or precision not taken (bf16/fp16, "
                                                "hs 32/64/128, sm_80+)");
    if ((T + FA_BR - 1) / FA_BR > 65535 || (long long)B * NH > 0x7fffffffLL)
        return fa_fail(ctx, DDP_EINVAL, what, "T or B*NH beyond the grid limits");
    for (int n = 0; n < 3; n++)
        if (aligned[n] && ((uintptr_t)aligned[n] & 15))
            return fa_fail(ctx, DDP_EINVAL, what, "tensor not 16-byte aligned");
    int hs = C / NH;
    memset(p, 0, sizeof *p);
    size_t kvw = (size_t)NKV * hs; /* the K (or V) heads of a position */
    p->q = qkv; /* 2-byte elements: k and v start C and C + NKV hs of them further */
    p->k = (const char *)qkv + 2 * (size_t)C;
    p->v = (const char *)qkv + 2 * ((size_t)C + kvw);
    p->ld_q = p->ld_kv = (size_t)C + 2 * kvw;
    p->ld_o = (size_t)C;
    p->T = T;
    p->NH = NH;
    p->group = NH / NKV;
    p->scale = 1.0f / sqrtf((float)hs);
    p->sl2 = p->scale * FA_LOG2E;
    return 0;
}

/* Queues kernel `kind` for ctx->prec and hs on grid (gx, gy). */
static int fa_launch(ddp_kctx_t *ctx, int kind, int hs, unsigned gx, unsigned gy,
                     const fa_params *p, const char *what)
{
    int ti = ctx->prec == DDP_KPREC_BF16 ? 0 : 1;
    int hi = hs == 32 ? 0 : hs == 64 ? 1 : 2, mt = kind == FA_FWD ? fa_fwd_mt(hs) : 1;
    fa_kernel_t k = kind == FA_FWD ? fa_fwd_kernels[mt - 1][ti][hi] : fa_kernels[kind][ti][hi];
    size_t smem = fa_smem_bytes(kind, hs);
    if (smem > 48 * 1024)
        DDP_CHECK(ddp__cuda_check(
            ctx, cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
            what));
    k<<<dim3(gx, gy), FA_THREADS / mt, smem, ctx->stream>>>(*p);
    return ddp__cuda_launched(ctx, what);
}

void ddp__cuda_flash_fwd(ddp_kctx_t *ctx, void *out, float *lse, const void *qkv, int B, int T,
                         int C, int NH, int NKV)
{
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0 || ddp__cuda_enter(ctx)) return;
    fa_params p;
    const void *aligned[3] = {qkv, out, NULL};
    if (fa_setup(ctx, &p, qkv, aligned, B, T, C, NH, NKV, "flash_fwd")) return;
    p.out = out;
    p.lse = lse;
    fa_launch(ctx, FA_FWD, C / NH, (unsigned)(B * NH), (unsigned)((T + FA_BR - 1) / FA_BR), &p,
              "flash_fwd");
}

void ddp__cuda_flash_bwd(ddp_kctx_t *ctx, void *dqkv, const void *dout, const void *qkv,
                         const void *out, const float *lse, int B, int T, int C, int NH,
                         int NKV)
{
    if (B <= 0 || T <= 0 || C <= 0 || NH <= 0 || ddp__cuda_enter(ctx)) return;
    fa_params p;
    const void *aligned[3] = {qkv, dout, dqkv};
    if (fa_setup(ctx, &p, qkv, aligned, B, T, C, NH, NKV, "flash_bwd")) return;
    if ((uintptr_t)out & 15) {
        fa_fail(ctx, DDP_EINVAL, "flash_bwd", "tensor not 16-byte aligned");
        return;
    }
    int hs = C / NH;
    long rows = (long)B * NH * T;
    float *dsum;
    if (ddp__cuda_scratch(ctx, (size_t)rows * sizeof(float), (void **)&dsum)) return;
    typedef void (*rowdot_t)(float *, const void *, const void *, size_t, int, int, long);
    static const rowdot_t rowdots[2][3] = {
        {fa_rowdot_kernel<__nv_bfloat16, 32>, fa_rowdot_kernel<__nv_bfloat16, 64>,
         fa_rowdot_kernel<__nv_bfloat16, 128>},
        {fa_rowdot_kernel<__half, 32>, fa_rowdot_kernel<__half, 64>,
         fa_rowdot_kernel<__half, 128>}};
    rowdot_t rowdot = rowdots[ctx->prec == DDP_KPREC_BF16 ? 0 : 1][hs == 32 ? 0 : hs == 64 ? 1 : 2];
    long lanes = rows * (hs / 8);
    rowdot<<<(unsigned)((lanes + 255) / 256), 256, 0, ctx->stream>>>(dsum, dout, out, (size_t)C,
                                                                     T, NH, rows);
    if (ddp__cuda_launched(ctx, "flash_bwd(D)")) return;
    p.dq = dqkv; /* addressed as qkv */
    p.dk = (char *)dqkv + ((const char *)p.k - (const char *)qkv);
    p.dv = (char *)dqkv + ((const char *)p.v - (const char *)qkv);
    p.dout = dout;
    p.lse = (float *)lse; /* read only in the backward kernels */
    p.dsum = dsum;
    unsigned tiles = (unsigned)((T + FA_BR - 1) / FA_BR);
    if (fa_launch(ctx, FA_BWD_DKV, hs, (unsigned)(B * (NH / p.group)), tiles, &p,
                  "flash_bwd(dk, dv)"))
        return;
    fa_launch(ctx, FA_BWD_DQ, hs, (unsigned)(B * NH), tiles, &p, "flash_bwd(dq)");
}
