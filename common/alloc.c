/* Allocation wrappers with one failure-injection counter. */
#include "alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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
