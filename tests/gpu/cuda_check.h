/* CK(call): a CUDA runtime call of the GPU check programs in tests/gpu; on failure, the call,
 * its place and CUDA's message on stderr, and exit 1. */
#ifndef DDP_TESTS_GPU_CUDA_CHECK_H
#define DDP_TESTS_GPU_CUDA_CHECK_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e_ = (x);                                                                  \
        if (e_ != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

#endif
