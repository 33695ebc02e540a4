/* CRC32C: carry-less-multiply folding (VPCLMULQDQ on AVX-512 or AVX2 registers), SSE4.2 crc32
 * and slicing-by-8 paths, chosen at run time; all give the same values. See crc32c.h.
 *
 * Why folding: a checkpoint save checksums 1.5 GB while training uses every core, so the CRC's
 * CPU time is taken from training. The crc32 path peaks near 22 GB/s from cache (8 bytes a
 * cycle) and reads DRAM at about 11 GB/s here; folding computes 4x faster (85 GB/s from cache),
 * so it runs at what one core's loads pull from memory (~12.6 GB/s) with fewer cycles spent.
 * Why not ISA-L: Debian's libisal 2.30 crc32_iscsi read the same 1.5 GB at 10.3-11.0 GB/s here,
 * no faster than the crc32 path.
 *
 * The SSE4.2 path runs three independent crc32 chains over three adjacent blocks (the
 * instruction has a latency of 3 cycles and a throughput of 1), then joins them by shifting the
 * first two over the bytes that follow them: a shift by a fixed length is a linear map, applied
 * with four 256-entry tables built once per block length.
 *
 * The folding path (Intel, "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ"):
 * 128-bit lanes of the message are carried forward over F bits by multiplying their two 64-bit
 * halves by x^(F+63) and x^(F-1) mod P and adding the next data; in the reflected bit order a
 * carry-less product comes out multiplied by x once, hence the -1. Sixteen such lanes (four zmm
 * registers, or eight ymm registers where the CPU has VPCLMULQDQ but not AVX-512: 256 bytes) are
 * folded per iteration, then joined into one lane, whose CRC the crc32 instruction finishes. The
 * constants are computed at start-up, not typed in. On an AMD EPYC without AVX-512 the ymm path
 * runs at 24 GB/s from cache against 17-20 GB/s for the crc32 chains.
 *
 * ddp_crc32c_update3 is the crc32 path again, on three buffers at once, for a caller that
 * interleaves it with memory-bound work (see crc32c.h): there the chains cost almost nothing
 * while a fold of the same bytes afterwards is compute-bound work of its own. GPT-2 124M's
 * AdamW on 2 threads (a standalone loop here): 62 ms alone, +5 ms checksumming its 1.5 GB of
 * outputs 2 KiB per array at a time with the chains, +39 ms folding each 128 KiB chunk after
 * its update.
 */
#include "crc32c.h"

#include <pthread.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define POLY 0x82F63B78u /* reflected Castagnoli polynomial */

static uint32_t table[8][256];
/* x^(2^k) mod P for k = 0..63, reflected (bit 31 is the coefficient of x^0): the shift of a CRC
 * register over n zero bits is the product of the entries of n's set bits. */
static uint32_t x2k[64];
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int have_hw; /* DDP__CRC_* in use: the best the CPU supports */

#if defined(__x86_64__)
#define BLOCK 4096 /* bytes per chain in the 3-way path */
/* shift[k][b]: the CRC register after feeding BLOCK zero bytes from a register holding byte b at
 * byte position k (and zeros elsewhere). A register shift is linear, so it is the XOR of four. */
static uint32_t shift[4][256];

/* Fold constants: {x^(F+63) mod P, x^(F-1) mod P} as reflected 64-bit lanes, for F = 2048 (the
 * main loop: 256 bytes ahead), 512 (one zmm register to the next), 256 (one ymm register to the
 * next) and 128 (one lane to the next). */
static uint64_t k2048[2], k512[2], k256[2], k128[2];
#endif

/* c(x) * x mod P, reflected: one bit of a register's advance. */
static inline uint32_t times_x(uint32_t c) { return (c >> 1) ^ (POLY & (0u - (c & 1))); }

/* Advances the raw (non-inverted) register over one zero byte. */
static uint32_t zero_byte(uint32_t c)
{
    for (int k = 0; k < 8; k++) c = times_x(c);
    return c;
}

#if defined(__x86_64__)
/* x^n mod P (normal bit order: bit d is the coefficient of x^d) as a reflected 64-bit lane: the
 * coefficient of x^d at bit 63 - d. */
static uint64_t xpow_lane(unsigned n)
{
    uint64_t r = 1;
    for (unsigned i = 0; i < n; i++) {
        r <<= 1;
        if (r >> 32) r ^= 0x11EDC6F41ull; /* P = x^32 + ..., normal order */
    }
    uint64_t lane = 0;
    for (int d = 0; d < 32; d++)
        if (r >> d & 1) lane |= 1ull << (63 - d);
    return lane;
}

static void fold_const(uint64_t k[2], unsigned f)
{
    k[0] = xpow_lane(f + 63); /* multiplies the lane's first 8 bytes (higher degree) */
    k[1] = xpow_lane(f - 1);  /* its last 8 */
}
#endif

/* a(x) b(x) mod P, both reflected: b is multiplied by x once per bit of a, from x^0 on. */
static uint32_t mul_mod(uint32_t a, uint32_t b)
{
    uint32_t r = 0;
    for (uint32_t bit = 1u << 31; bit; bit >>= 1) {
        if (a & bit) r ^= b;
        b = times_x(b);
    }
    return r;
}

static void init_tables(void)
{
    x2k[0] = 1u << 30; /* x^1 */
    for (int k = 1; k < 64; k++) x2k[k] = mul_mod(x2k[k - 1], x2k[k - 1]);
    for (uint32_t i = 0; i < 256; i++) table[0][i] = zero_byte(i);
    for (int t = 1; t < 8; t++)
        for (int i = 0; i < 256; i++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
#if defined(__x86_64__)
    __builtin_cpu_init();
    have_hw = __builtin_cpu_supports("sse4.2") ? DDP__CRC_SSE42 : DDP__CRC_SW;
    if (have_hw && __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("vpclmulqdq"))
        have_hw = DDP__CRC_VPCLMUL;
    else if (have_hw && __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("avx2") &&
             __builtin_cpu_supports("vpclmulqdq"))
        have_hw = DDP__CRC_VPCLMUL256;
    fold_const(k2048, 2048);
    fold_const(k512, 512);
    fold_const(k256, 256);
    fold_const(k128, 128);
    uint32_t basis[32]; /* the shift of each single-bit register; the rest is XORs of these */
    for (int bit = 0; bit < 32; bit++) {
        uint32_t c = 1u << bit;
        for (int z = 0; z < BLOCK; z++) c = zero_byte(c);
        basis[bit] = c;
    }
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++) {
            uint32_t c = 0;
            for (int bit = 0; bit < 8; bit++)
                if (b & (1u << bit)) c ^= basis[8 * k + bit];
            shift[k][b] = c;
        }
#endif
}

uint32_t ddp__crc32c_sw(uint32_t crc, const void *buf, size_t n)
{
    pthread_once(&once, init_tables);
    const unsigned char *p = buf;
    uint32_t c = ~crc;
    while (n && ((uintptr_t)p & 7)) {
        c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= c;
        c = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^
            table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff] ^
            table[2][(w >> 40) & 0xff] ^ table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) c = (c >> 8) ^ table[0][(c ^ *p++) & 0xff];
    return ~c;
}

#if defined(__x86_64__)
static inline uint32_t shift_block(uint32_t c)
{
    return shift[0][c & 0xff] ^ shift[1][(c >> 8) & 0xff] ^ shift[2][(c >> 16) & 0xff] ^
           shift[3][c >> 24];
}

/* The crc32 path on the raw register (no inversion). */
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t reg, const void *buf, size_t n)
{
    const unsigned char *p = buf;
    uint64_t c0 = reg;
    while (n && ((uintptr_t)p & 7)) {
        c0 = __builtin_ia32_crc32qi((uint32_t)c0, *p++);
        n--;
    }
    while (n >= 3 * BLOCK) {
        uint64_t c1 = 0, c2 = 0;
        const unsigned char *p1 = p + BLOCK, *p2 = p + 2 * BLOCK;
        for (size_t i = 0; i < BLOCK; i += 8) {
            uint64_t w0, w1, w2;
            memcpy(&w0, p + i, 8);
            memcpy(&w1, p1 + i, 8);
            memcpy(&w2, p2 + i, 8);
            c0 = __builtin_ia32_crc32di(c0, w0);
            c1 = __builtin_ia32_crc32di(c1, w1);
            c2 = __builtin_ia32_crc32di(c2, w2);
        }
        /* Raw registers compose as reg(A||B) = shift_|B|(reg(A)) ^ reg_from_zero(B). */
        c0 = shift_block(shift_block((uint32_t)c0) ^ (uint32_t)c1) ^ (uint32_t)c2;
        p += 3 * BLOCK;
        n -= 3 * BLOCK;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c0 = __builtin_ia32_crc32di(c0, w);
        p += 8;
        n -= 8;
    }
    while (n--) c0 = __builtin_ia32_crc32qi((uint32_t)c0, *p++);
    return (uint32_t)c0;
}

#define LANE_TARGET __attribute__((target("sse4.2,pclmul")))
#define VP_TARGET __attribute__((target("sse4.2,pclmul,avx512f,vpclmulqdq")))
#define VP2_TARGET __attribute__((target("sse4.2,pclmul,avx2,vpclmulqdq")))

/* One 128-bit lane folded over F bits (k: that F's constants). */
LANE_TARGET static inline __m128i fold128(__m128i x, __m128i k)
{
    return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

/* The end of both folding paths: the last 16-byte pieces folded into lane t, which then is a
 * 16-byte message whose CRC (zero register) is the register so far; crc32 does the rest. */
LANE_TARGET static uint32_t finish_lane(__m128i t, const unsigned char *p, size_t n)
{
    const __m128i k1 = _mm_loadu_si128((const __m128i *)k128);
    while (n >= 16) {
        t = _mm_xor_si128(fold128(t, k1), _mm_loadu_si128((const __m128i *)p));
        p += 16;
        n -= 16;
    }
    uint64_t c = __builtin_ia32_crc32di(0, (uint64_t)_mm_cvtsi128_si64(t));
    c = __builtin_ia32_crc32di(c, (uint64_t)_mm_extract_epi64(t, 1));
    return crc_hw((uint32_t)c, p, n);
}

/* Four lanes folded over F bits plus the next data: fold(x) ^ d. */
VP_TARGET static inline __m512i fold512(__m512i x, __m512i k, __m512i d)
{
    return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, k, 0x00),
                                     _mm512_clmulepi64_epi128(x, k, 0x11), d, 0x96);
}

/* The folding path on zmm registers, on the raw register; n >= 256. */
VP_TARGET static uint32_t crc_vpclmul(uint32_t reg, const void *buf, size_t n)
{
    const unsigned char *p = buf;
    /* the register enters as an XOR into the first 4 message bytes */
    __m512i x0 = _mm512_xor_si512(_mm512_loadu_si512(p),
                                  _mm512_zextsi128_si512(_mm_cvtsi32_si128((int)reg)));
    __m512i x1 = _mm512_loadu_si512(p + 64), x2 = _mm512_loadu_si512(p + 128),
            x3 = _mm512_loadu_si512(p + 192);
    p += 256;
    n -= 256;
    const __m512i kf = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)k2048));
    while (n >= 256) {
        /* No software prefetch: asking for the lines 4 KiB ahead into L2 read DRAM faster
         * alone (14.7 against 12.6 GB/s) but beside training it evicted the compute thread's
         * L2 on the shared core: +285 ms of stall per save against +81 ms without (one run
         * each, GPT-2 124M, 2 cores); prefetchnta was as bad (+309 ms). */
        x0 = fold512(x0, kf, _mm512_loadu_si512(p));
        x1 = fold512(x1, kf, _mm512_loadu_si512(p + 64));
        x2 = fold512(x2, kf, _mm512_loadu_si512(p + 128));
        x3 = fold512(x3, kf, _mm512_loadu_si512(p + 192));
        p += 256;
        n -= 256;
    }
    const __m512i k4 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)k512));
    x1 = fold512(x0, k4, x1);
    x2 = fold512(x1, k4, x2);
    x3 = fold512(x2, k4, x3);
    const __m128i k1 = _mm_loadu_si128((const __m128i *)k128);
    __m128i t = _mm512_extracti32x4_epi32(x3, 0);
    t = _mm_xor_si128(fold128(t, k1), _mm512_extracti32x4_epi32(x3, 1));
    t = _mm_xor_si128(fold128(t, k1), _mm512_extracti32x4_epi32(x3, 2));
    t = _mm_xor_si128(fold128(t, k1), _mm512_extracti32x4_epi32(x3, 3));
    return finish_lane(t, p, n);
}

/* Two lanes folded over F bits plus the next data. */
VP2_TARGET static inline __m256i fold256(__m256i x, __m256i k, __m256i d)
{
    return _mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128(x, k, 0x00),
                                             _mm256_clmulepi64_epi128(x, k, 0x11)),
                            d);
}

/* The folding path on ymm registers (eight of them: 256 bytes per iteration, as above), on the
 * raw register; n >= 256. */
VP2_TARGET static uint32_t crc_vpclmul256(uint32_t reg, const void *buf, size_t n)
{
    const unsigned char *p = buf;
    __m256i x[8];
    for (int i = 0; i < 8; i++) x[i] = _mm256_loadu_si256((const __m256i *)(p + 32 * i));
    x[0] = _mm256_xor_si256(x[0], _mm256_zextsi128_si256(_mm_cvtsi32_si128((int)reg)));
    p += 256;
    n -= 256;
    const __m256i kf = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)k2048));
    while (n >= 256) {
        for (int i = 0; i < 8; i++)
            x[i] = fold256(x[i], kf, _mm256_loadu_si256((const __m256i *)(p + 32 * i)));
        p += 256;
        n -= 256;
    }
    const __m256i k2 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)k256));
    for (int i = 0; i < 7; i++) x[i + 1] = fold256(x[i], k2, x[i + 1]);
    const __m128i k1 = _mm_loadu_si128((const __m128i *)k128);
    __m128i t = _mm_xor_si128(fold128(_mm256_castsi256_si128(x[7]), k1),
                              _mm256_extracti128_si256(x[7], 1));
    return finish_lane(t, p, n);
}
#endif

#if defined(__x86_64__)
/* Three crc32 chains, one per buffer, on raw registers: with a latency of 3 cycles and a
 * throughput of 1, three chains keep the instruction busy without any joining. */
__attribute__((target("sse4.2"))) static void crc3_hw(uint32_t reg[3],
                                                      const unsigned char *const b[3], size_t n)
{
    uint64_t c0 = reg[0], c1 = reg[1], c2 = reg[2];
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w0, w1, w2;
        memcpy(&w0, b[0] + i, 8);
        memcpy(&w1, b[1] + i, 8);
        memcpy(&w2, b[2] + i, 8);
        c0 = __builtin_ia32_crc32di(c0, w0);
        c1 = __builtin_ia32_crc32di(c1, w1);
        c2 = __builtin_ia32_crc32di(c2, w2);
    }
    reg[0] = crc_hw((uint32_t)c0, b[0] + i, n - i); /* the last 0-7 bytes */
    reg[1] = crc_hw((uint32_t)c1, b[1] + i, n - i);
    reg[2] = crc_hw((uint32_t)c2, b[2] + i, n - i);
}
#endif

void ddp_crc32c_update3(uint32_t crc[3], const void *const buf[3], size_t n)
{
    pthread_once(&once, init_tables);
#if defined(__x86_64__)
    if (have_hw >= DDP__CRC_SSE42) {
        uint32_t reg[3] = {~crc[0], ~crc[1], ~crc[2]};
        crc3_hw(reg, (const unsigned char *const *)buf, n);
        for (int k = 0; k < 3; k++) crc[k] = ~reg[k];
        return;
    }
#endif
    for (int k = 0; k < 3; k++) crc[k] = ddp__crc32c_sw(crc[k], buf[k], n);
}

uint32_t ddp_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b)
{
    pthread_once(&once, init_tables);
    /* The inversions at both ends cancel: crc(A||B) = crc_a * x^(8 len_b) mod P ^ crc_b. */
    uint32_t by = 1u << 31; /* x^0 */
    for (int k = 3; len_b; len_b >>= 1, k++)
        if (len_b & 1) by = mul_mod(x2k[k], by);
    return mul_mod(by, crc_a) ^ crc_b;
}

uint32_t ddp__crc32c_impl(int impl, uint32_t crc, const void *buf, size_t n)
{
    pthread_once(&once, init_tables);
    if (impl > have_hw) impl = have_hw;
#if defined(__x86_64__)
    if (impl == DDP__CRC_VPCLMUL && n >= 256) return ~crc_vpclmul(~crc, buf, n);
    if (impl == DDP__CRC_VPCLMUL256 && n >= 256) return ~crc_vpclmul256(~crc, buf, n);
    if (impl >= DDP__CRC_SSE42) return ~crc_hw(~crc, buf, n);
#endif
    return ddp__crc32c_sw(crc, buf, n);
}

uint32_t ddp_crc32c_update(uint32_t crc, const void *buf, size_t n)
{
    return ddp__crc32c_impl(DDP__CRC_VPCLMUL, crc, buf, n);
}

int ddp_crc32c_hw(void)
{
    pthread_once(&once, init_tables);
    return have_hw;
}
