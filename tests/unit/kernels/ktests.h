/* Test cases of the kernels test binary that live outside test_kernels.c (one cmocka group,
 * registered in test_kernels.c's main). */
#ifndef DDP_TESTS_UNIT_KERNELS_KTESTS_H
#define DDP_TESTS_UNIT_KERNELS_KTESTS_H

/* test_threads.c: every op gives bitwise identical outputs with 1, 2 and 3 threads. */
void test_threads(void **state);
/* test_open.c: ddp_kernels_open/close with cpu, auto, cuda and a fake module; alloc and copies. */
void test_open(void **state);
void test_memory(void **state);
void test_front_door(void **state);
/* test_sparse.c: the sparse arena on cpu, sim (its hazards too) and, when built, cuda. */
void test_sparse_cpu(void **state);
void test_sparse_sim(void **state);
void test_sparse_sim_hazards(void **state);
#ifdef DDP_TEST_CUDA_MODULE
void test_sparse_cuda(void **state);
#endif
/* test_profile.c: the per-op profiler's counts, times and formulas on cpu and sim. */
void test_profile_cpu(void **state);
void test_profile_sim(void **state);
void test_profile_edges(void **state);

/* test_llama.c: the Llama family's ops (RMSNorm, RoPE, SwiGLU) against double references and
 * finite differences, and their front-door checks (grouped-query attention is in
 * test_kernels.c). */
void test_rmsnorm(void **state);
void test_rope(void **state);
void test_swiglu(void **state);
/* the residual add fused with each norm: bitwise residual_fwd + the norm, 1-3 threads (fp32) */
void test_residual_norm(void **state);
void test_llama_front_door(void **state);

#endif
