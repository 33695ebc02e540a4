/* The CPU's element loops in the widest vectors the CPU has: AVX-512, AVX2 or the build's
 * baseline (SSE2 on x86-64), chosen at run time, with the same results bit for bit.
 *
 * The build targets the baseline, so a loop that gcc vectorises runs 4 floats wide even on a CPU
 * with AVX-512. DDP_VECTOR_FN compiles a loop function three times (the baseline and two
 * `target` clones of the same body, which is always inlined into each) and calls the one
 * ddp_cpu_isa() names. gcc's own target_clones does the same behind an ifunc, but an ifunc's
 * choice cannot be lowered for a test, and TSan's runtime is not up when resolvers run.
 *
 * Why the bits stay the same: every clone performs each element's operations in the same order
 * with the same IEEE roundings (the loops are written so that gcc vectorises them without
 * reassociating: reductions keep explicit lanes), and the project builds with -ffp-contract=off
 * (meson.build), so no clone fuses a multiply and an add into an FMA with one rounding fewer.
 * tests/unit/worker/test_vector_isa.sh trains with each width and compares the weights.
 *
 *   DDP_VECTOR_FN(scale_rows, (float *x, size_t n, float a), (x, n, a))
 *   {
 *       for (size_t i = 0; i < n; i++) x[i] *= a;
 *   }
 *
 * defines `static void scale_rows(float *x, size_t n, float a)`. The body keeps its hot loops in
 * itself or in DDP_VECTOR_INLINE helpers (inlined into each clone; kernels/math's DDP_HD
 * functions are too); a call to any other function runs that function's own code. Meant for
 * loops over many elements: the choice costs a load and a branch per call. */
#ifndef DDP_COMMON_VECTOR_ISA_H
#define DDP_COMMON_VECTOR_ISA_H

typedef enum { DDP_ISA_BASELINE, DDP_ISA_AVX2, DDP_ISA_AVX512 } ddp_isa_t;

/* The widest the CPU runs (AVX-512: F, BW, VL and DQ), or what DDP_CPU_VECTOR=baseline|avx2|avx512
 * lowers it to (a comparison switch for tests and benchmarks; it never raises it). Decided at the
 * first call. */
ddp_isa_t ddp_cpu_isa(void);

/* NULL when DDP_CPU_VECTOR is unset or valid, else a one-line message naming the value (the CPU
 * kernels refuse to open with it). */
const char *ddp_cpu_isa_env_error(void);

/* "AVX-512", "AVX2" or "baseline": for the log line that says which loops run. */
const char *ddp_cpu_isa_name(ddp_isa_t isa);

#if defined(__x86_64__)
#define DDP_VECTOR_FN(name, params, args)                                                          \
    static inline __attribute__((always_inline)) void name##_loops params;                         \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))) static void name##_avx512 params \
    {                                                                                              \
        name##_loops args;                                                                         \
    }                                                                                              \
    __attribute__((target("avx2"))) static void name##_avx2 params { name##_loops args; }          \
    static void name params                                                                        \
    {                                                                                              \
        ddp_isa_t isa_ = ddp_cpu_isa();                                                            \
        if (isa_ == DDP_ISA_AVX512)                                                                \
            name##_avx512 args;                                                                    \
        else if (isa_ == DDP_ISA_AVX2)                                                             \
            name##_avx2 args;                                                                      \
        else                                                                                       \
            name##_loops args;                                                                     \
    }                                                                                              \
    static inline __attribute__((always_inline)) void name##_loops params
#else
#define DDP_VECTOR_FN(name, params, args)                                                          \
    static inline __attribute__((always_inline)) void name##_loops params;                         \
    static void name params { name##_loops args; }                                                 \
    static inline __attribute__((always_inline)) void name##_loops params
#endif

/* A helper of DDP_VECTOR_FN bodies: inlined into each clone. */
#define DDP_VECTOR_INLINE static inline __attribute__((always_inline))

/* The same for a pool task, `static void name(void *varg, long task)`. */
#define DDP_VECTOR_TASK(name) DDP_VECTOR_FN(name, (void *varg, long task), (varg, task))

#endif
