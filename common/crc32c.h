/* CRC32C (Castagnoli), the checksum of checkpoint files in MANIFEST.json, also computed by the
 * CPU AdamW kernel over what it writes (so a save's writer need not read the tensors again).
 *
 * Why CRC32C and not a library hash: it is in the x86 instruction set (SSE4.2 `crc32`), so it runs
 * at several GB/s per core with no dependency beyond the compiler, it detects every burst error
 * up to 32 bits (a flipped byte, a torn sector), and `crc32c` from Python or `gsutil hash -c`
 * reproduce it. The fastest path the CPU has is chosen at run time (cpuid): carry-less folding
 * with VPCLMULQDQ on AVX-512 registers, else on AVX2 registers (AMD Zen 3/4 without AVX-512),
 * else the SSE4.2 crc32 instruction; other CPUs get a slicing-by-8 table. All give the same
 * values.
 *
 * Streaming: crc = ddp_crc32c_update(0, a, n); crc = ddp_crc32c_update(crc, b, m) equals one call
 * over a then b. The conventional init/final inversion is done inside, so 0 is the start value and
 * ddp_crc32c_update(0, "123456789", 9) == 0xE3069283.
 */
#ifndef DDP_COMMON_CRC32C_H
#define DDP_COMMON_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends `crc` (0 to start) over buf[0..n). Pure; any thread. */
uint32_t ddp_crc32c_update(uint32_t crc, const void *buf, size_t n);

/* Extends three CRCs at once, crc[k] over buf[k][0..n), as three ddp_crc32c_update calls would.
 * It runs the crc32 instruction on three independent chains (one per buffer) and no folding:
 * called on a block just written to L1 between blocks of memory-bound work (the CPU AdamW
 * kernel), it runs in that work's shadow, where folding a whole chunk afterwards is a pass of its
 * own. Pure; any thread. */
void ddp_crc32c_update3(uint32_t crc[3], const void *const buf[3], size_t n);

/* The CRC32C of A||B from crc_a = CRC of A, crc_b = CRC of B and len_b = |B| (zlib's
 * crc32_combine for this polynomial), so CRCs of pieces computed apart (by several threads, or
 * by the update of each tensor) make the CRC of a whole file. O(log len_b) small products; no
 * data is read. Pure; any thread. */
uint32_t ddp_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

/* The same with the portable table path, whatever the CPU (tests compare the two). Any thread. */
uint32_t ddp__crc32c_sw(uint32_t crc, const void *buf, size_t n);

/* The implementations, slowest first. */
enum { DDP__CRC_SW = 0, DDP__CRC_SSE42 = 1, DDP__CRC_VPCLMUL256 = 2, DDP__CRC_VPCLMUL = 3 };

/* ddp_crc32c_update with at most implementation `impl` (the CPU's best if it has no such one),
 * so tests can check each path the CPU has against the table. Any thread. */
uint32_t ddp__crc32c_impl(int impl, uint32_t crc, const void *buf, size_t n);

/* The implementation in use (DDP__CRC_*): non-zero when it is a hardware one. Any thread. */
int ddp_crc32c_hw(void);

#endif
