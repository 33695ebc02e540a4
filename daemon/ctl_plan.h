/* `ddpctl plan`: a job spec's memory budget per rank, without running it. */
#ifndef DDPD_CTL_PLAN_H
#define DDPD_CTL_PLAN_H

/* ddpctl plan SPEC [--workers N] [--local N] [--gpu BYTES]: loads SPEC and prints the budget
 * rank 0 would print at start (worker/memory_budget.h) for N ranks (default ddp.workers),
 * `local` of them on one host (default all), on the CPU or on GPUs of BYTES ("80GiB") each,
 * then the total of the ranks that write no checkpoint shard where it is smaller, and the
 * advice when rank 0's does not fit (rank 0 writes shards: it needs the most). Returns CTL_OK
 * when it fits, CTL_JOB_FAILED when it does not, CTL_USAGE for a bad spec or arguments. */
int ddpctl_plan(int argc, char **argv);

#endif
