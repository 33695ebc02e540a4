/* ddpd's flash attention on a GPU, forward and backward, at the shapes of the GPT-2 124M and
 * SmolLM2-135M benchmarks (bf16, B=8 T=1024), through the kernels' front door as training
 * calls it: each op queued REPS times between two waits, after WARMUP calls, the median of
 * RUNS such batches. The forward runs with both of its kernels (DDP_FA_FWD_ROWS=16: one m-tile
 * of 16 query rows a warp, 4 warps a block; 32: two m-tiles, 2 warps, the default at hs <= 64)
 * and their outputs must be bitwise equal (exit status 1 otherwise). FLOPs as the per-op
 * profile counts them (2 B NH T^2 hs forward, 2.5 times that backward; the causal half is not
 * discounted); tests/gpu/gemm_shapes.py times PyTorch's causal SDPA at the first shape. Run by
 * tests/gpu/session.sh (part `gemm`) with DDP_KERNELS_PATH naming the CUDA module.
 *
 *   attention_times [BACKEND [B T]]   (default cuda 8 1024; e.g. `sim 1 128` checks the program
 *                                     itself on a machine without a GPU)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"
#include "kernels/kernels.h"

enum { REPS = 10, RUNS = 7, WARMUP = 3 };

typedef struct {
    const char *name;
    int B, T, C, NH, NKV;
} shape_t;

static shape_t shapes[] = {
    {"gpt2-124M", 8, 1024, 768, 12, 12},
    {"smollm2-135m", 8, 1024, 576, 9, 3},
};

static void die(const char *what, int rc)
{
    fprintf(stderr, "attention_times: %s: %s\n", what, ddp_strerror(rc));
    exit(1);
}

/* A device buffer of n random bf16 values in [-2, 2). */
static void *rand_bf16(ddp_kernels_t *k, size_t n, uint32_t *seed)
{
    uint16_t *h = malloc(n * 2);
    if (!h) die("host buffer", DDP_ENOMEM);
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 1664525u + 1013904223u;
        float f = ((float)(*seed >> 8) / 16777216.0f - 0.5f) * 4.0f;
        uint32_t u;
        memcpy(&u, &f, 4);
        h[i] = (uint16_t)(u >> 16);
    }
    void *d = NULL;
    int rc = ddp_k_alloc(k, &d, n * 2);
    if (rc == 0) rc = ddp_k_memcpy_h2d(k, d, h, n * 2);
    if (rc == 0) rc = ddp_k_sync(k);
    if (rc) die("device buffer", rc);
    free(h);
    return d;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median seconds of one call: fwd (1) or bwd (0). */
static double time_op(ddp_kernels_t *k, const shape_t *s, int fwd, void *out, float *lse,
                      void *qkv, void *dout, void *dqkv)
{
    double t[RUNS];
    for (int r = -1; r < RUNS; r++) { /* r = -1: the warm-up */
        double t0 = ddp_now_s();
        for (int i = 0; i < (r < 0 ? WARMUP : REPS); i++) {
            if (fwd)
                DDP_K(k, attention_fwd, out, lse, qkv, s->B, s->T, s->C, s->NH, s->NKV);
            else
                DDP_K(k, attention_bwd, dqkv, dout, qkv, out, lse, s->B, s->T, s->C, s->NH,
                      s->NKV);
        }
        int rc = ddp_k_sync(k);
        if (rc) die(fwd ? "attention_fwd" : "attention_bwd", rc);
        if (r >= 0) t[r] = (ddp_now_s() - t0) / REPS;
    }
    qsort(t, RUNS, sizeof *t, cmp);
    return t[RUNS / 2];
}

int main(int argc, char **argv)
{
    const char *backend = argc > 1 ? argv[1] : "cuda";
    for (size_t i = 0; argc > 3 && i < sizeof shapes / sizeof *shapes; i++)
        shapes[i].B = atoi(argv[2]), shapes[i].T = atoi(argv[3]);
    ddp_kernels_t k;
    int rc = ddp_kernels_open(&k, backend, 0, 1);
    if (rc) die("opening the kernel backend", rc);
    DDP_K(&k, set_precision, DDP_KPREC_BF16);
    int differ = 0;
    printf("%-14s %-10s %9s %9s\n", "shape", "op", "ms", "TFLOP/s");
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        const shape_t *s = &shapes[i];
        int hs = s->C / s->NH;
        size_t n = (size_t)s->B * s->T, qkvw = (size_t)s->C + 2 * (size_t)s->NKV * hs;
        uint32_t seed = 7;
        void *qkv = rand_bf16(&k, n * qkvw, &seed), *dout = rand_bf16(&k, n * s->C, &seed);
        void *out = NULL, *dqkv = NULL;
        float *lse = NULL;
        if ((rc = ddp_k_alloc(&k, &out, n * s->C * 2)) ||
            (rc = ddp_k_alloc(&k, &dqkv, n * qkvw * 2)) ||
            (rc = ddp_k_alloc(&k, (void **)&lse, (size_t)s->B * s->NH * s->T * 4)))
            die("device buffers", rc);
        double flop = 2.0 * s->B * s->NH * (double)s->T * s->T * hs;
        uint16_t *first = malloc(n * s->C * 2), *again = malloc(n * s->C * 2);
        if (!first || !again) die("host buffers", DDP_ENOMEM);
        const char *rows[] = {"16", "32"};
        for (int v = 0; v < 2; v++) {
            setenv("DDP_FA_FWD_ROWS", rows[v], 1);
            double f = time_op(&k, s, 1, out, lse, qkv, dout, dqkv);
            char op[16];
            snprintf(op, sizeof op, "fwd (%s)", rows[v]);
            printf("%-14s %-10s %9.3f %9.1f\n", s->name, op, f * 1e3, flop / f * 1e-12);
            if ((rc = ddp_k_memcpy_d2h(&k, v ? again : first, out, n * s->C * 2)) ||
                (rc = ddp_k_sync(&k)))
                die("reading out", rc);
        }
        unsetenv("DDP_FA_FWD_ROWS");
        int same = !memcmp(first, again, n * s->C * 2);
        differ |= !same;
        printf("%-14s fwd kernels give the same bits: %s\n", s->name, same ? "yes" : "NO");
        double b = time_op(&k, s, 0, out, lse, qkv, dout, dqkv);
        printf("%-14s %-10s %9.3f %9.1f\n", s->name, "bwd", b * 1e3, 2.5 * flop / b * 1e-12);
        free(first), free(again);
        void *bufs[] = {qkv, dout, out, dqkv, lse};
        for (size_t j = 0; j < sizeof bufs / sizeof *bufs; j++) ddp_k_free(&k, bufs[j]);
    }
    ddp_kernels_close(&k);
    return differ;
}
