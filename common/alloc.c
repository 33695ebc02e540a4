/* Allocation wrappers with one failure-injection counter. */
#include "alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

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
