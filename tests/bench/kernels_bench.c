/* Micro-benchmark of the CPU kernel backend on GPT-2 124M shapes (B=4, T=64, C=768, 12 layers,
 * 12 heads, V=50257): the time of one forward+backward of every matmul (the sgemm floor of a
 * training step), of the other ops of a step, and of AdamW over 124M parameters.
 * Prints the median of `reps` runs and the matmul GFLOP/s, and the process CPU time of the
 * matmuls (on a shared, loaded machine CPU time / threads is the better estimate of the unloaded
 * wall time). Not part of pass/fail.
 *
 *   kernels_bench [threads] [reps] [fp32|bf16]      (threads 0 = one per core; bf16: the
 *                                                    products at train.precision bf16)
 * Build (not registered with meson: tests/bench/meson.build belongs to the benchmark owner):
 *   cc -O3 -I. tests/bench/kernels_bench.c BUILD/kernels/libddp_kernels.a \
 *      BUILD/common/libddp_common.a -lopenblas -lpthread -lm -ldl
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/clock.h"
#include "kernels/kernels.h"

/* A buffer passed as an activation tensor (of the context's precision; the buffers are sized for
 * fp32, which covers 16-bit activations too). */
#define A(x) ((ddp_act_t *)(x))

enum { B = 4, T = 64, C = 768, L = 12, NH = 12, V = 50257, N = B * T };

static float *buf(ddp_kernels_t *k, size_t n, unsigned seed)
{
    float *p = NULL;
    if (k->ops->alloc(k->ctx, (void **)&p, n * sizeof(float)) < 0) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    srand(seed);
    for (size_t i = 0; i < n; i++) p[i] = ((float)rand() / (float)RAND_MAX - 0.5f) * 0.04f;
    return p;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int threads = argc > 1 ? atoi(argv[1]) : 0, reps = argc > 2 ? atoi(argv[2]) : 5;
    if (reps < 1 || reps > 99) reps = 5;
    ddp_kernels_t k;
    if (ddp_kernels_open(&k, "cpu", 0, threads) < 0) return 1;
    ddp_kprec_t prec = argc > 3 && !strcmp(argv[3], "bf16") ? DDP_KPREC_BF16 : DDP_KPREC_FP32;
    /* Per layer: qkv [C,3C], attn proj [C,C], fc [C,4C], fc proj [4C,C], as separate tensors. */
    const int oc[4] = {3 * C, C, 4 * C, C}, ic[4] = {C, C, C, 4 * C};
    float *w[L][4], *dw[L][4], *bias[L][4], *dbias[L][4];
    for (int l = 0; l < L; l++)
        for (int j = 0; j < 4; j++) {
            w[l][j] = buf(&k, (size_t)ic[j] * oc[j], 1u + l * 4 + j);
            dw[l][j] = buf(&k, (size_t)ic[j] * oc[j], 2);
            bias[l][j] = buf(&k, (size_t)oc[j], 3);
            dbias[l][j] = buf(&k, (size_t)oc[j], 3);
        }
    float *wte = buf(&k, (size_t)V * C, 4), *dwte = buf(&k, (size_t)V * C, 5);
    float *x = buf(&k, (size_t)N * 4 * C, 6), *dx = buf(&k, (size_t)N * 4 * C, 7);
    float *y = buf(&k, (size_t)N * 4 * C, 8), *dy = buf(&k, (size_t)N * 4 * C, 9);
    float *logits = buf(&k, (size_t)N * V, 10), *losses = buf(&k, N, 11);
    float *lse = buf(&k, (size_t)B * NH * T, 12);
    float *mean = buf(&k, N, 14), *rstd = buf(&k, N, 15), *lnw = buf(&k, C, 16);
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (i * 7919) % V;

    double flops = 0;
    for (int j = 0; j < 4; j++) flops += 6.0 * N * ic[j] * oc[j] * L;
    flops += 6.0 * N * C * (double)V;

    double tm[99], to[99], ta[99], tc[99];
    size_t np = 124475904; /* GPT-2 124M with the tied wte */
    float *p = buf(&k, np, 17), *g = buf(&k, np, 18), *m = buf(&k, np, 19), *v = buf(&k, np, 20);
    float *sums = malloc((np / 16384 + 1) * sizeof(float)); /* host, the norm's block sums */
    for (int r = 0; r < reps; r++) {
        double c0 = cpu_s();
        DDP_K(&k, set_precision, prec); /* the weights are converted once per step */
        double t0 = ddp_now_s();
        for (int l = 0; l < L; l++)
            for (int j = 0; j < 4; j++)
                DDP_K(&k, matmul_fwd, A(y), A(x), w[l][j], bias[l][j], N, ic[j], oc[j], oc[j],
                      DDP_W_IN_OUT);
        DDP_K(&k, matmul_fwd, A(logits), A(x), wte, NULL, N, C, V, V, DDP_W_OUT_IN);
        DDP_K(&k, matmul_bwd, A(dx), dwte, NULL, A(logits), A(x), wte, N, C, V, V, DDP_W_OUT_IN);
        for (int l = L - 1; l >= 0; l--)
            for (int j = 3; j >= 0; j--)
                DDP_K(&k, matmul_bwd, A(dx), dw[l][j], dbias[l][j], A(dy), A(x), w[l][j], N, ic[j],
                      oc[j], oc[j], DDP_W_IN_OUT);
        double t1 = ddp_now_s();
        tc[r] = cpu_s() - c0;
        /* The other ops of a step, at their real sizes. */
        DDP_K(&k, encoder_fwd, y, tok, wte, lnw, B, 1, C);
        for (int l = 0; l < L; l++) {
            for (int q = 0; q < 2; q++)
                DDP_K(&k, layernorm_fwd, A(y), mean, rstd, x, lnw, lnw, N, C);
            DDP_K(&k, attention_fwd, A(y), lse, A(x), B, T, C, NH, NH);
            DDP_K(&k, gelu_fwd, A(y), A(x), (size_t)N * 4 * C);
            for (int q = 0; q < 2; q++) DDP_K(&k, residual_fwd, y, x, A(y), (size_t)N * C);
        }
        DDP_K(&k, xent_fwd_bwd, losses, A(logits), A(logits), tok, N, V, V, 1.0f / N);
        for (int l = 0; l < L; l++) {
            DDP_K(&k, gelu_bwd, A(dx), A(x), A(dy), (size_t)N * 4 * C);
            DDP_K(&k, attention_bwd, A(dx), A(dy), A(x), A(y), lse, B, T, C, NH, NH);
            for (int q = 0; q < 2; q++)
                DDP_K(&k, layernorm_bwd, dx, NULL, dy, dy + C, A(dy), x, lnw, mean, rstd, N, C);
        }
        double t2 = ddp_now_s();
        ddp_krange_t all = {0, np, 0};
        DDP_K(&k, sumsq_blocks, sums, g, &all, 1, 16384);
        ddp_kadamw_range_t whole = {0, np, 0.1f};
        DDP_K(&k, adamw, p, g, m, v, &whole, 1, 1e-4f, 0.9f, 0.95f, 1e-8f, 1.0f, r + 1, NULL);
        double t3 = ddp_now_s();
        tm[r] = t1 - t0, to[r] = t2 - t1, ta[r] = t3 - t2;
    }
    qsort(tm, reps, sizeof(double), cmp);
    qsort(to, reps, sizeof(double), cmp);
    qsort(ta, reps, sizeof(double), cmp);
    qsort(tc, reps, sizeof(double), cmp);
    int h = reps / 2;
    printf("threads %d (0 = per core), %s, median of %d (OPENBLAS_CORETYPE=%s)\n", threads,
           prec == DDP_KPREC_BF16 ? "bf16" : "fp32", reps,
           getenv("OPENBLAS_CORETYPE") ? getenv("OPENBLAS_CORETYPE") : "(unset)");
    printf("matmuls fwd+bwd      %7.1f ms  %6.1f GFLOP/s (%.0f GFLOP)\n", tm[h] * 1e3,
           flops / tm[h] * 1e-9, flops * 1e-9);
    printf("matmuls CPU time      %7.1f ms  (all threads together)\n", tc[h] * 1e3);
    printf("other ops fwd+bwd    %7.1f ms\n", to[h] * 1e3);
    printf("sumsq + adamw (124M) %7.1f ms\n", ta[h] * 1e3);
    printf("total                %7.1f ms\n", (tm[h] + to[h] + ta[h]) * 1e3);
    free(sums);
    ddp_kernels_close(&k);
    return 0;
}
