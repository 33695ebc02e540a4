/* Test helpers and double-precision reference ops for test_kernels.c (see kref.h). */
#include "kref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/math/lowp.h"

static uint64_t next(krng_t *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull); /* splitmix64 */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double krng_unif(krng_t *r, double lo, double hi)
{
    return lo + (hi - lo) * (double)(next(r) >> 11) * 0x1.0p-53;
}

uint32_t krng_below(krng_t *r, uint32_t n) { return (uint32_t)(next(r) % n); }

void kfill(krng_t *r, float *x, size_t n, double lo, double hi)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)krng_unif(r, lo, hi);
}

void ktod(double *d, const float *f, size_t n)
{
    for (size_t i = 0; i < n; i++) d[i] = f[i];
}

void *kcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        fprintf(stderr, "kcalloc: out of memory\n");
        abort();
    }
    return p;
}

size_t kclose(const char *what, const float *got, const double *ref, size_t n, double rtol,
              double atol_frac)
{
    double mx = 0.0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i]));
    double atol = atol_frac * mx + 1e-30;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= rtol * fabs(ref[i]) + atol)) {
            if (bad < 5)
                printf("# %s[%zu]: got %.9g, want %.9g (|diff| %.3g > tol %.3g)\n", what, i,
                       (double)got[i], ref[i], d, rtol * fabs(ref[i]) + atol);
            bad++;
        }
    }
    if (bad) printf("# %s: %zu of %zu elements out of tolerance\n", what, bad, n);
    return bad;
}

size_t kfd_check(const char *what, kloss_fn f, void *arg, double *x, size_t n, const float *got,
                 const float *before, size_t max_checks, krng_t *r, double rtol,
                 double atol_frac)
{
    size_t m = n <= max_checks ? n : max_checks;
    size_t *idx = kcalloc(m, sizeof(*idx));
    double *fd = kcalloc(m, sizeof(*fd));
    float *g = kcalloc(m, sizeof(*g));
    for (size_t k = 0; k < m; k++) {
        size_t i = n <= max_checks ? k : krng_below(r, (uint32_t)n);
        idx[k] = i;
        double x0 = x[i];
        double h = 1e-6 * fmax(1.0, fabs(x0));
        x[i] = x0 + h;
        double lp = f(arg);
        x[i] = x0 - h;
        double lm = f(arg);
        x[i] = x0;
        fd[k] = (lp - lm) / (2.0 * h);
        g[k] = (float)((double)got[i] - (before ? (double)before[i] : 0.0));
    }
    size_t bad = kclose(what, g, fd, m, rtol, atol_frac);
    if (bad)
        for (size_t k = 0; k < m && k < 3; k++)
            printf("# %s: index %zu: backward %.9g, finite difference %.9g\n", what, idx[k],
                   (double)g[k], fd[k]);
    free(idx);
    free(fd);
    free(g);
    return bad;
}

float *kround(const float *x, size_t n, ddp_kprec_t prec)
{
    float *y = kcalloc(n, sizeof(float));
    for (size_t i = 0; i < n; i++)
        y[i] = prec == DDP_KPREC_FP32   ? x[i]
               : prec == DDP_KPREC_BF16 ? ddp_round_bf16(x[i])
                                        : ddp_round_fp16(x[i]);
    return y;
}

void *kact(const float *x, size_t n, ddp_kprec_t prec)
{
    void *y = kcalloc(n, ddp_act_bytes(prec));
    uint16_t *h = y;
    if (prec == DDP_KPREC_FP32) memcpy(y, x, n * sizeof(float));
    for (size_t i = 0; prec != DDP_KPREC_FP32 && i < n; i++)
        h[i] = prec == DDP_KPREC_BF16 ? ddp_bf16_bits(x[i]) : ddp_fp16_bits(x[i]);
    return y;
}

double kdot(const double *a, const double *b, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

void ref_encoder(double *out, const int32_t *inp, const double *wte, const double *wpe, int B,
                 int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                out[((size_t)b * T + t) * C + c] =
                    wte[(size_t)inp[b * T + t] * C + c] + wpe[(size_t)t * C + c];
}

void ref_layernorm(double *out, double *mean, double *rstd, const double *inp, const double *w,
                   const double *b, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const double *x = inp + (size_t)n * C;
        double m = 0.0, v = 0.0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        v /= C;
        double rs = 1.0 / sqrt(v + 1e-5);
        for (int c = 0; c < C; c++) out[(size_t)n * C + c] = (x[c] - m) * rs * w[c] + b[c];
        if (mean) mean[n] = m;
        if (rstd) rstd[n] = rs;
    }
}

void ref_matmul(double *out, const double *inp, const double *w, const double *bias, int N,
                int C, int OC, ddp_wlayout_t layout)
{
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0.0;
            for (int c = 0; c < C; c++)
                s += inp[(size_t)n * C + c] *
                     (layout == DDP_W_IN_OUT ? w[(size_t)c * OC + o] : w[(size_t)o * C + c]);
            out[(size_t)n * OC + o] = s;
        }
}

void ref_attention(double *out, double *lse, const double *qkv, int B, int T, int C, int NH,
                   int NKV)
{
    int hs = C / NH, G = NH / NKV;
    size_t QKV = (size_t)C + 2 * (size_t)NKV * hs;
    double scale = 1.0 / sqrt((double)hs);
    double *p = kcalloc((size_t)T, sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            size_t ko = (size_t)C + (size_t)(h / G) * hs, vo = ko + (size_t)NKV * hs;
            for (int t = 0; t < T; t++) {
                const double *q = qkv + ((size_t)b * T + t) * QKV + (size_t)h * hs;
                double mx = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const double *k = qkv + ((size_t)b * T + t2) * QKV + ko;
                    p[t2] = kdot(q, k, (size_t)hs) * scale;
                    mx = fmax(mx, p[t2]);
                }
                double sum = 0.0;
                for (int t2 = 0; t2 <= t; t2++) sum += (p[t2] = exp(p[t2] - mx));
                for (int t2 = 0; t2 <= t; t2++) p[t2] /= sum;
                if (lse) lse[((size_t)b * NH + h) * T + t] = mx + log(sum);
                double *o = out + ((size_t)b * T + t) * C + (size_t)h * hs;
                for (int i = 0; i < hs; i++) {
                    double s = 0.0;
                    for (int t2 = 0; t2 <= t; t2++)
                        s += p[t2] * qkv[((size_t)b * T + t2) * QKV + vo + i];
                    o[i] = s;
                }
            }
        }
    free(p);
}

void ref_rmsnorm(double *out, double *rstd, const double *inp, const double *w, int N, int C,
                 double eps)
{
    for (int n = 0; n < N; n++) {
        const double *x = inp + (size_t)n * C;
        double ss = 0.0;
        for (int c = 0; c < C; c++) ss += x[c] * x[c];
        double rs = 1.0 / sqrt(ss / C + eps);
        for (int c = 0; c < C; c++) out[(size_t)n * C + c] = x[c] * rs * w[c];
        if (rstd) rstd[n] = rs;
    }
}

void ref_rope(double *qkv, const double *rope, int B, int T, int NH, int NKV, int hs)
{
    size_t row = (size_t)(NH + 2 * NKV) * hs;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH + NKV; h++) { /* the q heads, then the k heads */
                double *x = qkv + ((size_t)b * T + t) * row + (size_t)h * hs;
                for (int i = 0; i < hs / 2; i++) {
                    double c = rope[((size_t)t * (hs / 2) + i) * 2];
                    double s = rope[((size_t)t * (hs / 2) + i) * 2 + 1];
                    double x0 = x[i], x1 = x[i + hs / 2];
                    x[i] = x0 * c - x1 * s;
                    x[i + hs / 2] = x1 * c + x0 * s;
                }
            }
}

void ref_swiglu(double *out, const double *inp, int N, int H)
{
    for (int n = 0; n < N; n++)
        for (int j = 0; j < H; j++) {
            double g = inp[(size_t)n * 2 * H + j], u = inp[(size_t)n * 2 * H + H + j];
            out[(size_t)n * H + j] = g / (1.0 + exp(-g)) * u;
        }
}

double ref_gelu(double x)
{
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

void ref_xent(double *losses, const double *logits, const int32_t *targets, int N, int V)
{
    for (int n = 0; n < N; n++) {
        const double *x = logits + (size_t)n * V;
        double mx = -INFINITY, s = 0.0;
        for (int i = 0; i < V; i++) mx = fmax(mx, x[i]);
        for (int i = 0; i < V; i++) s += exp(x[i] - mx);
        losses[n] = log(s) + mx - x[targets[n]];
    }
}
