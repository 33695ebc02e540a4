/* `ddpctl plan`: a job spec's memory budget per rank, without running it. */
#ifndef DDPD_CTL_PLAN_H
#define DDPD_CTL_PLAN_H

/* ddpctl plan SPEC [--workers N] [--local N] [--gpu BYTES]: loads SPEC and prints the budget
 * each rank would print at start (worker/memory_budget.h) for N ranks (default ddp.workers),
 * `local` of them on one host (default all), on the CPU or on GPUs of BYTES ("80GiB") each,
 * and the advice when it does not fit. Returns CTL_OK when it fits,
 * CTL_JOB_FAILED when it does not, CTL_USAGE for a bad spec or arguments. */
int ddpctl_plan(int argc, char **argv);

#endif
