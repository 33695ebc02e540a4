/* Allocation wrappers with one failure-injection counter. */
#include "alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

static atomic_long fail_countdown;

static int should_fail(void)
{
    long k = atomic_load_explicit(&fail_countdown, memory_order_relaxed);
    if (k <= 0) return 0;
    return atomic_fetch_sub(&fail_countdown, 1) == 1;
}

void ddp_alloc_fail_at(long k) { atomic_store(&fail_countdown, k); }

void *ddp_malloc(size_t n) { return should_fail() ? NULL : malloc(n ? n : 1); }

void *ddp_calloc(size_t count, size_t size)
{
    return should_fail() ? NULL : calloc(count ? count : 1, size ? size : 1);
}

void *ddp_realloc(void *p, size_t n) { return should_fail() ? NULL : realloc(p, n ? n : 1); }

char *ddp_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = ddp_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

void *ddp_aligned_alloc(size_t alignment, size_t n)
{
    if (should_fail()) return NULL;
    void *p = NULL;
    if (posix_memalign(&p, alignment, n ? n : alignment)) return NULL;
    return p;
}

#define HUGE_PAGE ((size_t)2 << 20)

void *ddp_alloc_big(size_t n)
{
    const char *thp = getenv("DDP_THP"); /* "0": 4 KiB pages, for comparisons */
    if (n < HUGE_PAGE || (thp && !strcmp(thp, "0"))) return ddp_aligned_alloc(4096, n);
    size_t rounded = (n + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
    void *p = ddp_aligned_alloc(HUGE_PAGE, rounded);
#ifdef MADV_HUGEPAGE
    if (p) (void)madvise(p, rounded, MADV_HUGEPAGE); /* advice only: 4 KiB pages work too */
#endif
    return p;
}

void ddp_mem_release(void *p, size_t n)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + page - 1) & ~(uintptr_t)(page - 1);
    uintptr_t b = ((uintptr_t)p + n) & ~(uintptr_t)(page - 1);
    if (!p || b <= a) return;
    (void)madvise((void *)a, b - a, MADV_DONTNEED); /* advice: the pages may also just stay */
}

long long ddp_mem_resident(const void *p, size_t n)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(page - 1);
    size_t pages = ((uintptr_t)p + n - a + page - 1) / page;
    if (!p || !n) return 0;
    unsigned char *vec = malloc(pages);
    if (!vec) return -1;
    long long resident = -1;
    if (mincore((void *)a, pages * page, vec) == 0) {
        resident = 0;
        for (size_t i = 0; i < pages; i++) resident += vec[i] & 1;
        resident *= (long long)page;
    }
    free(vec);
    return resident;
}
