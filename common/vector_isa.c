/* Which of DDP_VECTOR_FN's clones run (vector_isa.h). */
#include "common/vector_isa.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const names[] = {"baseline", "avx2", "avx512"};

/* The DDP_CPU_VECTOR value's level, or -1 when unset, or -2 when it names none. */
static int env_level(void)
{
    const char *v = getenv("DDP_CPU_VECTOR");
    if (!v || !*v) return -1;
    for (int i = 0; i < 3; i++)
        if (!strcmp(v, names[i])) return i;
    return -2;
}

static ddp_isa_t detect(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return DDP_ISA_AVX512;
    if (__builtin_cpu_supports("avx2")) return DDP_ISA_AVX2;
#endif
    return DDP_ISA_BASELINE;
}

ddp_isa_t ddp_cpu_isa(void)
{
    static int chosen = -1; /* computed once; a race computes the same value twice */
    int v = __atomic_load_n(&chosen, __ATOMIC_RELAXED);
    if (v >= 0) return (ddp_isa_t)v;
    v = (int)detect();
    int want = env_level();
    if (want >= 0 && want < v) v = want;
    __atomic_store_n(&chosen, v, __ATOMIC_RELAXED);
    return (ddp_isa_t)v;
}

const char *ddp_cpu_isa_env_error(void)
{
    static char msg[200];
    if (env_level() != -2) return NULL;
    snprintf(msg, sizeof msg, "DDP_CPU_VECTOR=%.80s: not baseline, avx2 or avx512",
             getenv("DDP_CPU_VECTOR"));
    return msg;
}

const char *ddp_cpu_isa_name(ddp_isa_t isa)
{
    return isa == DDP_ISA_AVX512 ? "AVX-512" : isa == DDP_ISA_AVX2 ? "AVX2" : "baseline";
}
