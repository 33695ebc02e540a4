/* Allocation helpers with a fault-injection hook for tests.
 *
 * Every heap allocation in the project goes through these, so a test can make the k-th one fail
 * (ddp_alloc_fail_at) and check that the caller returns DDP_ENOMEM cleanly and leaks nothing.
 */
#ifndef DDP_COMMON_ALLOC_H
#define DDP_COMMON_ALLOC_H

#include <stddef.h>

/* malloc/calloc/realloc/strdup that return NULL when the injected failure is due. */
void *ddp_malloc(size_t n);
void *ddp_calloc(size_t count, size_t size);
void *ddp_realloc(void *p, size_t n);
char *ddp_strdup(const char *s);
/* Aligned allocation (alignment a power of two, >= sizeof(void*)); free with free(). */
void *ddp_aligned_alloc(size_t alignment, size_t n);
/* A large buffer (an arena, a snapshot), free with free(): page-aligned, and from 2 MiB on aligned
 * to 2 MiB and marked MADV_HUGEPAGE, so the kernel backs it with transparent huge pages where
 * they are enabled ("madvise" or "always"). Why: an O_DIRECT write from 2 MiB pages goes to the
 * disk in requests of the queue's largest size (4 MiB on virtio) instead of 254 4 KiB segments
 * (1 MiB), four times fewer requests, interrupts and wake-ups per checkpoint; and the training
 * loops miss the TLB less. */
void *ddp_alloc_big(size_t n);

/* Gives the whole pages inside [p, p + n) back to the kernel: they read as zero afterwards and
 * take no memory until written again (MADV_DONTNEED). For private memory: anonymous mappings
 * and large allocations; shared memory keeps its pages. The partial pages at either end are
 * left alone. */
void ddp_mem_release(void *p, size_t n);

/* Bytes of [p, p + n) resident in memory (whole pages, mincore()), or -1 when unknown. */
long long ddp_mem_resident(const void *p, size_t n);

/* Test hook: the k-th allocation from now fails (k >= 1); 0 disables. Not thread-safe with
 * respect to concurrent allocations' ordering; meant for single-threaded tests. */
void ddp_alloc_fail_at(long k);

#endif
