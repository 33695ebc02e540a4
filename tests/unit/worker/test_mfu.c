/* Unit tests of model FLOPs utilisation (worker/observe/mfu.h): the count per token against
 * llm.c's for GPT-2 124M and the Llama family's rule for an untied input embedding, the table's
 * peaks by device name and precision (a longer name before one it contains), and the measured
 * rate of the CPU's products. The count against the per-op profiler's FLOPs on real runs is
 * tests/observe/test_mfu.sh. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "worker/model/model.h"
#include "worker/observe/mfu.h"

static void test_count(void **state)
{
    (void)state;
    ddp_model_cfg_t gpt2;
    assert_int_equal(ddp_spec_preset("gpt2-124M", &gpt2), 0);
    size_t n = ddp_model_count_params(&gpt2);
    assert_int_equal(n, 124439808); /* Hugging Face's gpt2: 124,439,808 parameters */
    /* llm.c: 6 N + 6 L C T, N with the tied embedding once (its 803.5M per token counts the
     * padded vocabulary 50304: 6 x 47 x 768 = 216,576 more) */
    double want = 6.0 * 124439808 + 6.0 * 12 * 768 * 1024;
    assert_true(ddp_mfu_flops_per_token(&gpt2, n, 1024) == want);
    assert_true(fabs(want + 6.0 * 47 * 768 - 803.5e6) < 0.05e6);

    /* Llama untied: the input embedding is a lookup, left out; tied: counted once (the head) */
    ddp_model_cfg_t llama;
    assert_int_equal(ddp_spec_preset("tinyllama-1.1b", &llama), 0);
    assert_int_equal(llama.tie_embeddings, 0);
    n = ddp_model_count_params(&llama);
    double emb = (double)llama.vocab_size * llama.n_embd;
    assert_true(ddp_mfu_flops_per_token(&llama, n, 2048) ==
                6.0 * ((double)n - emb) + 6.0 * llama.n_layer * llama.n_embd * 2048.0);
    assert_int_equal(ddp_spec_preset("smollm2-135m", &llama), 0);
    n = ddp_model_count_params(&llama);
    assert_true(ddp_mfu_flops_per_token(&llama, n, 512) ==
                6.0 * (double)n + 6.0 * llama.n_layer * llama.n_embd * 512.0);
}

static void test_table(void **state)
{
    (void)state;
    double f;
    const char *src;
    assert_int_equal(ddp_mfu_table_peak("NVIDIA H100 80GB HBM3", DDP_KPREC_BF16, 0, &f, &src), 0);
    assert_true(f == 989.5e12);
    assert_non_null(strstr(src, "SXM5"));
    assert_int_equal(ddp_mfu_table_peak("NVIDIA H100 80GB HBM3", DDP_KPREC_FP32, 0, &f, &src), 0);
    assert_true(f == 67e12); /* fp32 without TF32: the plain rate */
    assert_int_equal(ddp_mfu_table_peak("NVIDIA H100 80GB HBM3", DDP_KPREC_FP32, 1, &f, &src), 0);
    assert_true(f == 494.5e12);
    assert_int_equal(ddp_mfu_table_peak("NVIDIA H100 PCIe", DDP_KPREC_FP16, 0, &f, &src), 0);
    assert_true(f == 756e12);
    assert_int_equal(ddp_mfu_table_peak("NVIDIA H100 NVL", DDP_KPREC_BF16, 0, &f, &src), 0);
    assert_true(f == 835.5e12);
    assert_int_equal(ddp_mfu_table_peak("NVIDIA H200", DDP_KPREC_BF16, 0, &f, &src), 0);
    assert_true(f == 989.5e12);
    assert_int_equal(ddp_mfu_table_peak("NVIDIA A100-SXM4-80GB", DDP_KPREC_BF16, 0, &f, &src), 0);
    assert_true(f == 312e12);
    assert_int_equal(ddp_mfu_table_peak("NVIDIA A10", DDP_KPREC_BF16, 0, &f, &src), 0);
    assert_true(f == 125e12);
    assert_int_equal(ddp_mfu_table_peak("NVIDIA L40S", DDP_KPREC_BF16, 0, &f, &src), 0);
    assert_true(f == 362e12);
    assert_int_equal(ddp_mfu_table_peak("NVIDIA L4", DDP_KPREC_BF16, 0, &f, &src), 0);
    assert_true(f == 121e12);
    assert_int_equal(ddp_mfu_table_peak("Tesla T4", DDP_KPREC_BF16, 0, &f, &src), DDP_ENOTFOUND);
    assert_int_equal(ddp_mfu_table_peak(NULL, DDP_KPREC_FP32, 0, &f, &src), DDP_ENOTFOUND);
}

static void test_measured_cpu(void **state)
{
    (void)state;
    ddp_kernels_t k;
    assert_int_equal(ddp_kernels_open(&k, "cpu", 0, 1), 0);
    double f = 0;
    assert_int_equal(ddp_mfu_measure_peak(&k, DDP_KPREC_FP32, 256, 20, &f), 0);
    assert_true(isfinite(f) && f > 1e8 && f < 1e13); /* one thread: 0.1 GFLOP/s .. 10 TFLOP/s */
    ddp_model_cfg_t cfg;
    assert_int_equal(ddp_spec_preset("gpt2-tiny", &cfg), 0);
    ddp_mfu_t m;
    assert_int_equal(ddp_mfu_init(&m, &k, DDP_KPREC_FP32, &cfg, ddp_model_count_params(&cfg), 64),
                     0);
    assert_int_equal(m.measured, 1);
    assert_true(m.peak > 0);
    assert_non_null(strstr(m.peak_what, "measured: a fp32 product of 512"));
    /* MFU is tokens/s x count / peak */
    assert_true(fabs(ddp_mfu_of(&m, 1000) - 1000 * m.flops_per_token / m.peak) < 1e-15);
    m.peak = 0;
    assert_true(isnan(ddp_mfu_of(&m, 1000)));
    ddp_kernels_close(&k);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_count),
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_measured_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
