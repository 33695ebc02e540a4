/* DDP_HD: the qualifier for per-element math shared by the CPU (gcc) and CUDA (nvcc) backends.
 * Under nvcc it makes a function callable from host and device; under gcc it is static inline,
 * always inlined (as __forceinline__ is on the device): into each of the CPU's vector clones too
 * (common/vector_isa.h), where a call would run the baseline's code element by element.
 * Every header in kernels/math/ is valid C11 and CUDA C++, and uses only <math.h> functions that
 * both provide (tanhf, expf, sqrtf, logf). */
#ifndef DDP_KERNELS_MATH_HD_H
#define DDP_KERNELS_MATH_HD_H

#include <math.h>

#ifdef __CUDACC__
#define DDP_HD static __host__ __device__ __forceinline__
#else
#define DDP_HD static inline __attribute__((always_inline))
#endif

#endif
