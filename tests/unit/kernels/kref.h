/* Test helpers for the kernel tests: a seeded RNG, double-precision reference ops, a tolerance
 * compare that prints both values, and a central finite-difference gradient check.
 *
 * The references are plain loops in double, written from the op contracts in kernels/kernels.h
 * independently of the CPU backend's code.
 */
#ifndef DDP_TESTS_UNIT_KERNELS_KREF_H
#define DDP_TESTS_UNIT_KERNELS_KREF_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"

/* An fp32 array passed as an activation tensor (fp32 contexts: the type is the same). */
#define KA(x) ((ddp_act_t *)(x))

typedef struct {
    uint64_t s;
} krng_t;

/* Uniform in [lo, hi). */
double krng_unif(krng_t *r, double lo, double hi);
/* Uniform integer in [0, n). */
uint32_t krng_below(krng_t *r, uint32_t n);
void kfill(krng_t *r, float *x, size_t n, double lo, double hi);
void ktod(double *d, const float *f, size_t n);
/* calloc that aborts on failure (tests only). */
void *kcalloc(size_t n, size_t size);
/* x[0..n) rounded to prec, as fp32: the widened values a 16-bit activation holds (a copy). */
float *kround(const float *x, size_t n, ddp_kprec_t prec);
/* x[0..n) stored as an activation tensor of prec (ddp_act_bytes(prec) each; a copy). */
void *kact(const float *x, size_t n, ddp_kprec_t prec);

/* Number of elements where |got - ref| > rtol |ref| + atol_frac max|ref|; prints the first few
 * with both values. */
size_t kclose(const char *what, const float *got, const double *ref, size_t n, double rtol,
              double atol_frac);

/* The loss sum(out * w) of a double reference forward, with its inputs as they are now. */
typedef double (*kloss_fn)(void *arg);
/* Central differences of f over x[i] (h = 1e-6 relative) against got[i] - before[i] (before may
 * be NULL = zeros), on every index when n <= max_checks, else on max_checks random ones.
 * Returns the number of mismatches (printed with both values). */
size_t kfd_check(const char *what, kloss_fn f, void *arg, double *x, size_t n, const float *got,
                 const float *before, size_t max_checks, krng_t *r, double rtol,
                 double atol_frac);

/* Double references of the ops (forward). */
void ref_encoder(double *out, const int32_t *inp, const double *wte, const double *wpe, int B,
                 int T, int C);
void ref_layernorm(double *out, double *mean, double *rstd, const double *inp, const double *w,
                   const double *b, int N, int C);
void ref_matmul(double *out, const double *inp, const double *w, const double *bias, int N,
                int C, int OC, ddp_wlayout_t layout);
/* Causal attention with NKV K/V heads (NKV == NH: multi-head) on qkv[B,T,C + 2 NKV hs]; lse
 * (may be NULL) gets each row's log-sum-exp [B,NH,T]. */
void ref_attention(double *out, double *lse, const double *qkv, int B, int T, int C, int NH,
                   int NKV);
/* out[N,C] = inp / sqrt(mean(inp^2) + eps) * w; rstd[N] (may be NULL). */
void ref_rmsnorm(double *out, double *rstd, const double *inp, const double *w, int N, int C,
                 double eps);
/* RoPE in place on the q and k heads of qkv[B,T,(NH + 2 NKV) hs]; rope[T, hs/2, 2]. */
void ref_rope(double *qkv, const double *rope, int B, int T, int NH, int NKV, int hs);
/* out[N,H] = silu(inp[:, :H]) * inp[:, H:] */
void ref_swiglu(double *out, const double *inp, int N, int H);
double ref_gelu(double x);
void ref_xent(double *losses, const double *logits, const int32_t *targets, int N, int V);
double kdot(const double *a, const double *b, size_t n);

#endif
