/* Model FLOPs utilisation: the share of the device's peak that the model's arithmetic uses, as
 * llm.c counts it (llmc/mfu.h; Kaplan et al. 2020, 2001.08361, section 2.1).
 *
 * The count per trained token is 6 N + 6 L C T: N the parameters (every one, with the tied token
 * embedding once; the Llama family's untied input embedding left out, as it is a lookup, not a
 * product), L layers, C channels, T the training sequence length. It is the model's FLOPs, not
 * the machine's: activation recomputation does not raise it. It differs from what the per-op
 * profiler counts (kernels/kernels.h) in two places, both small next to 6 N: the profiler counts
 * products only (no position embedding, norms or biases in N), and causal attention as 2 T C per
 * layer and token forward and 2.5 times that backward (7 L C T), where 6 L C T is Kaplan's
 * convention (tests/unit/worker_mfu checks that they agree within 3%).
 *
 * The peak is a GPU's dense tensor rate in the run's precision from the table in mfu.c (bf16 and
 * fp16 with fp32 accumulation; fp32 runs use the plain FP32 rate unless DDP_CUDA_TF32=1 turns
 * TF32 on), or, on a CPU and on a GPU the table lacks, a rate measured once at start: the run's
 * own product (ddp_k_matmul_fwd, its precision and threads) on a square of 512 (CPU) or 8192
 * (GPU), the fastest of its rounds over 200 ms, labelled as measured. MFU is then per rank: tokens per second per rank x count / peak.
 *
 * Threads: ddp_mfu_init on the compute thread (it runs products); the rest is pure.
 */
#ifndef DDP_WORKER_OBSERVE_MFU_H
#define DDP_WORKER_OBSERVE_MFU_H

#include <stddef.h>

#include "kernels/kernels.h"
#include "proto/spec.h"

typedef struct ddp_mfu {
    double flops_per_token; /* 6 N + 6 L C T */
    double peak;            /* FLOP/s of this rank's device in the run's precision; 0: unknown */
    int measured;           /* 1: the peak was measured here */
    char peak_what[160];    /* where the peak comes from, for the log */
} ddp_mfu_t;

/* 6 N + 6 L C T for a model of cfg with n_params parameters (all of them, as the arena holds
 * them) trained on sequences of seq_len. Pure. */
double ddp_mfu_flops_per_token(const ddp_model_cfg_t *cfg, size_t n_params, int seq_len);

/* The table's dense peak in FLOP/s for a device named `device` (the driver's name) multiplying
 * in prec (tf32: fp32 products on TF32 tensor cores), with its source in *source. Returns 0, or
 * DDP_ENOTFOUND for a device or precision the table does not have. Pure. */
int ddp_mfu_table_peak(const char *device, ddp_kprec_t prec, int tf32, double *flops,
                       const char **source);

/* Measures the rate of k's products in prec: a product of n x n by n x n, after one warm-up in
 * rounds of 4 for at least min_ms; the fastest round gives *flops. Returns 0, or an error of
 * the kernels. */
int ddp_mfu_measure_peak(ddp_kernels_t *k, ddp_kprec_t prec, int n, double min_ms,
                         double *flops);

/* Fills m for this rank: the count, and the peak from the table or measured. A failed
 * measurement leaves peak 0 (MFU unknown) and says why in peak_what; returns 0. */
int ddp_mfu_init(ddp_mfu_t *m, ddp_kernels_t *k, ddp_kprec_t prec, const ddp_model_cfg_t *cfg,
                 size_t n_params, int seq_len);

/* The utilisation (a fraction) at tokens_per_s tokens per second on this rank; NAN when the peak
 * is unknown. Pure. */
double ddp_mfu_of(const ddp_mfu_t *m, double tokens_per_s);

#endif
