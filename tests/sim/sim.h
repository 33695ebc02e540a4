/* What the simulated CUDA runtime and NCCL (sim_runtime.c here) tell tests. */
#ifndef DDP_TESTS_SIM_SIM_H
#define DDP_TESTS_SIM_SIM_H

#include <stddef.h>
#include <stdint.h>

/* Misuses of the simulated NCCL so far (see nccl.h here), and the last one's message. Any
 * thread. */
uint64_t ddp_sim_nccl_violations(void);
void ddp_sim_nccl_last_violation(char *buf, size_t len);
/* Threads inside a call of the simulated NCCL right now (over every communicator). */
int ddp_sim_nccl_calls_in_flight(void);
/* The calling thread's current simulated device (cudaSetDevice). */
int ddp_sim_current_device(void);

#endif
