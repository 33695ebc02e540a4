/* Which matrix-product library the CPU backend should use, measured on GPT-2 124M's shapes
 * (B*T = 256 rows, C = 768, 12 layers, V = 50257): the forward and backward products of one
 * training step, by
 *   ddpd    the CPU backend's matmul_fwd/matmul_bwd as it runs in training (OpenBLAS sgemm, one
 *           thread per task, output tiles on ddpd's pool of `threads`)
 *   ddpdbf  the same at train.precision bf16: native bf16 tiles (oneDNN, one thread per task)
 *           where the CPU has AVX512_BF16/AMX, else emulated; the conversions of the inputs and
 *           of the weight (once per step in training, once per repetition here) included
 *   dnnl    oneDNN's fp32 matmul primitive (created once per shape; execution timed only), its
 *           OpenMP runtime with `threads` threads; beta = 0 where ddpd accumulates (an advantage
 *           to oneDNN)
 *   dnnlbf  the same with bf16 inputs, fp32 output (needs AVX512_BF16/AVX512 on oneDNN 2.6; it
 *           reports "unimplemented" on an AVX2-only CPU)
 * One library per process (two thread pools in one process fight over the cores); run the modes
 * alternately several times on a shared machine. Prints one line per shape (median of `reps`
 * GFLOP/s) and the step's total, in wall time and in process CPU time (on a loaded machine the
 * CPU time is the steadier measure of work; run oneDNN with OMP_WAIT_POLICY=passive so that
 * its idle threads do not spin into it). Not part of pass/fail; needs libdnnl-dev (which ddpd's
 * native bf16 path uses too).
 *
 *   cc -O2 -I. tests/bench/gemm_shapes.c BUILD/kernels/libddp_kernels.a \
 *      BUILD/common/libddp_common.a -ldnnl -lopenblas -lpthread -lm -ldl -o /tmp/gemm_shapes
 *   for i in 1 2 3; do for m in ddpd dnnl; do OMP_NUM_THREADS=2 /tmp/gemm_shapes $m 2 5; done; done
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <oneapi/dnnl/dnnl.h>

#include "kernels/kernels.h"

/* A buffer passed as an activation tensor (of the context's precision; the buffers are sized for
 * fp32, which covers 16-bit activations too). */
#define A(x) ((ddp_act_t *)(x))

enum { N = 256, C = 768, L = 12, V = 50257 };

static double cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static float *rnd(size_t n)
{
    float *p = aligned_alloc(64, (n * 4 + 63) / 64 * 64);
    for (size_t i = 0; i < n; i++) p[i] = ((float)rand() / (float)RAND_MAX - 0.5f) * 0.04f;
    return p;
}

/* One linear layer's shapes: inp [N, K] x weight -> [N, OC]; out_in: weight is [OC, K]. */
typedef struct {
    const char *name;
    int K, OC, out_in, per_step;
} shape_t;

static const shape_t SHAPES[] = {
    {"qkv", C, 3 * C, 0, L},
    {"attn proj", C, C, 0, L},
    {"fc", C, 4 * C, 0, L},
    {"fc proj", 4 * C, C, 0, L},
    {"lm head", C, V, 1, 1},
};

/* ---- oneDNN: M x K @ K x Nn with given strides (transposes as strides) ---- */
typedef struct {
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c;
} dprim_t;

static dnnl_engine_t eng;
static dnnl_stream_t stream;

static int dprim(dprim_t *p, int M, int K, int Nn, int ta, int tb, dnnl_data_type_t dt, void *A,
                 void *B, float *Cm)
{
    dnnl_dims_t ad = {M, K}, bd = {K, Nn}, cd = {M, Nn};
    dnnl_dims_t as = {ta ? 1 : K, ta ? M : 1}, bs = {tb ? 1 : Nn, tb ? K : 1};
    dnnl_memory_desc_t a, b, c;
    dnnl_memory_desc_init_by_strides(&a, 2, ad, dt, as);
    dnnl_memory_desc_init_by_strides(&b, 2, bd, dt, bs);
    dnnl_memory_desc_init_by_tag(&c, 2, cd, dnnl_f32, dnnl_ab);
    dnnl_matmul_desc_t md;
    dnnl_primitive_desc_t pd;
    if (dnnl_matmul_desc_init(&md, &a, &b, NULL, &c) != dnnl_success) return -1;
    if (dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL) != dnnl_success) return -1;
    const char *impl = "";
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    static int said;
    if (!said++) fprintf(stderr, "oneDNN implementation: %s\n", impl);
    dnnl_primitive_create(&p->prim, pd);
    dnnl_primitive_desc_destroy(pd);
    dnnl_memory_create(&p->a, &a, eng, A);
    dnnl_memory_create(&p->b, &b, eng, B);
    dnnl_memory_create(&p->c, &c, eng, Cm);
    return 0;
}

static void dexec(dprim_t *p)
{
    dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, p->a}, {DNNL_ARG_WEIGHTS, p->b}, {DNNL_ARG_DST, p->c}};
    dnnl_primitive_execute(p->prim, stream, 3, args);
    dnnl_stream_wait(stream);
}

static void *to_bf16(const float *x, size_t n)
{
    uint16_t *o = malloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        o[i] = (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    }
    return o;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "ddpd";
    int threads = argc > 2 ? atoi(argv[2]) : 2, reps = argc > 3 ? atoi(argv[3]) : 5;
    if (reps > 64) reps = 64;
    int dbf = strcmp(mode, "ddpdbf") == 0;
    int ddpd = dbf || strcmp(mode, "ddpd") == 0, bf = strcmp(mode, "dnnlbf") == 0;
    ddp_kernels_t k;
    if (ddpd && ddp_kernels_open(&k, "cpu", 0, threads)) return 1;
    if (!ddpd) {
        dnnl_engine_create(&eng, dnnl_cpu, 0);
        dnnl_stream_create(&stream, eng, dnnl_stream_default_flags);
    }
    double step_s = 0, step_flop = 0, step_cpu = 0;
    for (size_t s = 0; s < sizeof SHAPES / sizeof *SHAPES; s++) {
        const shape_t *sh = &SHAPES[s];
        int K = sh->K, OC = sh->OC;
        float *inp = rnd((size_t)N * K), *w = rnd((size_t)K * OC), *dout = rnd((size_t)N * OC);
        float *out = rnd((size_t)N * OC), *dinp = rnd((size_t)N * K), *dw = rnd((size_t)K * OC);
        dprim_t f, di, dwp;
        if (!ddpd) {
            dnnl_data_type_t dt = bf ? dnnl_bf16 : dnnl_f32;
            void *I = bf ? to_bf16(inp, (size_t)N * K) : inp;
            void *W = bf ? to_bf16(w, (size_t)K * OC) : w;
            void *D = bf ? to_bf16(dout, (size_t)N * OC) : dout;
            /* fwd: inp[N,K] @ W (W [K,OC], or [OC,K] transposed) */
            int rc = dprim(&f, N, K, OC, 0, sh->out_in, dt, I, W, out);
            /* dinp[N,K] = dout[N,OC] @ W^T */
            rc |= dprim(&di, N, OC, K, 0, !sh->out_in, dt, D, W, dinp);
            /* dW: [K,OC] = inp^T @ dout, or [OC,K] = dout^T @ inp */
            rc |= sh->out_in ? dprim(&dwp, OC, N, K, 1, 0, dt, D, I, dw)
                             : dprim(&dwp, K, N, OC, 1, 0, dt, I, D, dw);
            if (rc) {
                printf("%s: oneDNN has no %s matmul here (unimplemented)\n", mode,
                       bf ? "bf16" : "fp32");
                return 0;
            }
        }
        double t[64], c0 = cpu_s();
        for (int r = 0; r < reps; r++) {
            double t0 = now_s();
            if (ddpd) {
                ddp_wlayout_t lay = sh->out_in ? DDP_W_OUT_IN : DDP_W_IN_OUT;
                if (dbf) DDP_K(&k, set_precision, DDP_KPREC_BF16); /* the weight converted anew */
                DDP_K(&k, matmul_fwd, A(out), A(inp), w, NULL, N, K, OC, OC, lay);
                DDP_K(&k, matmul_bwd, A(dinp), dw, NULL, A(dout), A(inp), w, N, K, OC, OC, lay);
            } else {
                dexec(&f);
                dexec(&di);
                dexec(&dwp);
            }
            t[r] = now_s() - t0;
        }
        double cpu = (cpu_s() - c0) / reps;
        qsort(t, (size_t)reps, sizeof *t, cmp);
        double flop = 3 * 2.0 * N * K * OC;
        printf("%-6s %-9s %4dx%4dx%5d  fwd+bwd %7.2f ms  %6.1f GFLOP/s\n", mode, sh->name, N, K,
               OC, t[reps / 2] * 1e3, flop / t[reps / 2] / 1e9);
        step_s += t[reps / 2] * sh->per_step;
        step_cpu += cpu * sh->per_step;
        step_flop += flop * sh->per_step;
        free(inp), free(w), free(dout), free(out), free(dinp), free(dw);
    }
    printf("%-6s one step's matmuls: %.0f ms, %.1f GFLOP/s (threads %d); CPU time %.0f ms\n",
           mode, step_s * 1e3, step_flop / step_s / 1e9, threads, step_cpu * 1e3);
    if (ddpd) ddp_kernels_close(&k);
    return 0;
}
