/* Model FLOPs utilisation (see mfu.h). */
#include "worker/observe/mfu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"

double ddp_mfu_flops_per_token(const ddp_model_cfg_t *cfg, size_t n_params, int seq_len)
{
    double N = (double)n_params;
    if (cfg->arch == DDP_ARCH_LLAMA && !cfg->tie_embeddings)
        N -= (double)cfg->vocab_size * cfg->n_embd; /* the input embedding: a lookup */
    return 6.0 * N + 6.0 * cfg->n_layer * (double)cfg->n_embd * seq_len;
}

/* Dense peaks in TFLOP/s, from NVIDIA's datasheets (the "with sparsity" figures halved). Looked
 * up by the first `match` that the driver's name contains, so a longer name comes before a name
 * it contains (H100 NVL before H100, L40S before L4, A100 before A10). */
static const struct gpu_peak {
    const char *match;
    double fp32, tf32, bf16, fp16;
    const char *source;
} GPUS[] = {
    {"H100 NVL", 60, 417.5, 835.5, 835.5, "NVIDIA H100 NVL datasheet"},
    {"H100 PCIe", 51, 378, 756, 756, "NVIDIA H100 PCIe datasheet"},
    {"H100", 67, 494.5, 989.5, 989.5, "NVIDIA H100 SXM5 datasheet"},
    {"H200 NVL", 60, 417.5, 835.5, 835.5, "NVIDIA H200 NVL datasheet"},
    {"H200", 67, 494.5, 989.5, 989.5, "NVIDIA H200 SXM datasheet"},
    {"GH200", 67, 494.5, 989.5, 989.5, "NVIDIA GH200 datasheet"},
    {"A100", 19.5, 156, 312, 312, "NVIDIA A100 datasheet"},
    {"A10", 31.2, 62.5, 125, 125, "NVIDIA A10 datasheet"},
    {"A40", 37.4, 74.8, 149.7, 149.7, "NVIDIA A40 datasheet"},
    {"L40S", 91.6, 183, 362, 362, "NVIDIA L40S datasheet"},
    {"L40", 90.5, 90.5, 181, 181, "NVIDIA L40 datasheet"},
    {"L4", 30.3, 60, 121, 121, "NVIDIA L4 datasheet"},
};

int ddp_mfu_table_peak(const char *device, ddp_kprec_t prec, int tf32, double *flops,
                       const char **source)
{
    if (!device) return DDP_ENOTFOUND;
    for (size_t i = 0; i < sizeof GPUS / sizeof GPUS[0]; i++) {
        const struct gpu_peak *g = &GPUS[i];
        if (!strstr(device, g->match)) continue;
        double t = prec == DDP_KPREC_BF16 ? g->bf16
                   : prec == DDP_KPREC_FP16 ? g->fp16
                   : tf32                   ? g->tf32
                                            : g->fp32;
        *flops = t * 1e12;
        *source = g->source;
        return 0;
    }
    return DDP_ENOTFOUND;
}

int ddp_mfu_measure_peak(ddp_kernels_t *k, ddp_kprec_t prec, int n, double min_ms,
                         double *flops)
{
    void *in = NULL, *out = NULL, *w = NULL;
    size_t act = (size_t)n * n * ddp_act_bytes(prec);
    int rc = ddp_k_alloc(k, &in, act);
    if (!rc) rc = ddp_k_alloc(k, &out, act);
    if (!rc) rc = ddp_k_alloc(k, &w, (size_t)n * n * sizeof(float));
    /* a warm-up product (the weight's conversion, the pages' first touch), then rounds of 4
     * until min_ms have passed; the fastest round is the peak: a round that other processes
     * slowed says less about the device than the fastest one */
    if (!rc) ddp_k_matmul_fwd(k, out, in, w, NULL, n, n, n, n, DDP_W_IN_OUT);
    if (!rc) rc = ddp_k_sync(k);
    double best_ns = 0, total_ns = 0;
    while (!rc && total_ns < min_ms * 1e6) {
        int64_t t0 = ddp_now_ns();
        for (int i = 0; i < 4; i++) ddp_k_matmul_fwd(k, out, in, w, NULL, n, n, n, n, DDP_W_IN_OUT);
        rc = ddp_k_sync(k);
        double ns = (double)(ddp_now_ns() - t0);
        total_ns += ns;
        if (best_ns == 0 || ns < best_ns) best_ns = ns;
    }
    if (!rc) *flops = 4 * 2.0 * n * (double)n * n / (best_ns / 1e9);
    ddp_k_free(k, in);
    ddp_k_free(k, out);
    ddp_k_free(k, w);
    ddp_k_set_precision(k, prec); /* drops a 16-bit copy of w a backend may keep (kernels.h) */
    if (!rc) rc = ddp_k_sync(k);
    return rc;
}

int ddp_mfu_init(ddp_mfu_t *m, ddp_kernels_t *k, ddp_kprec_t prec, const ddp_model_cfg_t *cfg,
                 size_t n_params, int seq_len)
{
    static const char *const PREC[] = {"fp32", "bf16", "fp16"};
    memset(m, 0, sizeof *m);
    m->flops_per_token = ddp_mfu_flops_per_token(cfg, n_params, seq_len);
    const char *device = ddp_k_device_name(k), *source;
    const char *tf32_env = getenv("DDP_CUDA_TF32");
    int tf32 = device && prec == DDP_KPREC_FP32 && tf32_env && !strcmp(tf32_env, "1");
    if (ddp_mfu_table_peak(device, prec, tf32, &m->peak, &source) == 0) {
        snprintf(m->peak_what, sizeof m->peak_what, "%s, %s dense (%s)", device,
                 tf32 ? "tf32" : PREC[prec], source);
        return 0;
    }
    int n = device ? 8192 : 512; /* a CPU: 1024 left 3 MB more resident (the product
                                  * library's buffers) than a small run needs */
    if (ddp_mfu_measure_peak(k, prec, n, 200, &m->peak)) {
        m->peak = 0;
        snprintf(m->peak_what, sizeof m->peak_what, "unknown (measuring a product failed)");
        return 0;
    }
    m->measured = 1;
    snprintf(m->peak_what, sizeof m->peak_what, "measured: a %s product of %d x %d x %d%s%s",
             PREC[prec], n, n, n, device ? " on " : "", device ? device : "");
    return 0;
}

double ddp_mfu_of(const ddp_mfu_t *m, double tokens_per_s)
{
    return m->peak > 0 ? tokens_per_s * m->flops_per_token / m->peak : NAN;
}
