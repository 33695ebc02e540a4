/* CRC32C: SSE4.2 path with run-time dispatch, slicing-by-8 fallback. See checksum.h.
 *
 * The hardware path runs three independent crc32 chains over three adjacent blocks (the
 * instruction has a latency of 3 cycles and a throughput of 1), then joins them by shifting the
 * first two over the bytes that follow them: a shift by a fixed length is a linear map, applied
 * with four 256-entry tables built once per block length.
 */
#include "checksum.h"

#include <pthread.h>
#include <string.h>

#define POLY 0x82F63B78u /* reflected Castagnoli polynomial */

static uint32_t table[8][256];
static pthread_once_t once = PTHREAD_ONCE_INIT;
static int have_hw;

#if defined(__x86_64__)
#define BLOCK 4096 /* bytes per chain in the 3-way path */
/* shift[k][b]: the CRC register after feeding BLOCK zero bytes from a register holding byte b at
 * byte position k (and zeros elsewhere). A register shift is linear, so it is the XOR of four. */
static uint32_t shift[4][256];
#endif

/* Advances the raw (non-inverted) register over one zero byte. */
static uint32_t zero_byte(uint32_t c)
{
    for (int k = 0; k < 8; k++) c = (c >> 1) ^ (POLY & (0u - (c & 1)));
    return c;
}

static void init_tables(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (POLY & (0u - (c & 1)));
        table[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (int i = 0; i < 256; i++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xff];
#if defined(__x86_64__)
    __builtin_cpu_init();
    have_hw = __builtin_cpu_supports("sse4.2") != 0;
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

__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const void *buf,
                                                           size_t n)
{
    const unsigned char *p = buf;
    uint64_t c0 = ~crc;
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
    return ~(uint32_t)c0;
}
#endif

uint32_t ddp_crc32c_update(uint32_t crc, const void *buf, size_t n)
{
    pthread_once(&once, init_tables);
#if defined(__x86_64__)
    if (have_hw) return crc_hw(crc, buf, n);
#endif
    return ddp__crc32c_sw(crc, buf, n);
}

int ddp_crc32c_hw(void)
{
    pthread_once(&once, init_tables);
    return have_hw;
}
