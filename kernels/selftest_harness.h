/* The kernel self-test's harness (kernels/selftest.c, the only includer): the list of ops it
 * reports, a test's state, tensors made on both backends from one host array, and the
 * comparison rule. Functions are static inline: one includer, kept apart so that the cases read
 * on their own.
 */
#ifndef DDP_KERNELS_SELFTEST_HARNESS_H
#define DDP_KERNELS_SELFTEST_HARNESS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/kernels.h"

/* The ops, in the order their lines are printed. */
#define ST_OPS(X)                                                                            \
    X(MEMORY, "memory")                                                                      \
    X(SPARSE, "sparse_arena")                                                                \
    X(ENCODER_FWD, "encoder_fwd")                                                            \
    X(ENCODER_BWD, "encoder_bwd")                                                            \
    X(LAYERNORM_FWD, "layernorm_fwd")                                                        \
    X(LAYERNORM_BWD, "layernorm_bwd")                                                        \
    X(MATMUL_FWD, "matmul_fwd")                                                              \
    X(MATMUL_BWD, "matmul_bwd")                                                              \
    X(MATMUL_GELU_FWD, "matmul_gelu_fwd")                                                    \
    X(MATMUL_DGELU_BWD, "matmul_dgelu_bwd")                                                  \
    X(ATTENTION_FWD, "attention_fwd")                                                        \
    X(ATTENTION_BWD, "attention_bwd")                                                        \
    X(ROPE_FWD, "rope_fwd")                                                                  \
    X(ROPE_BWD, "rope_bwd")                                                                  \
    X(RMSNORM_FWD, "rmsnorm_fwd")                                                            \
    X(RMSNORM_BWD, "rmsnorm_bwd")                                                            \
    X(SWIGLU_FWD, "swiglu_fwd")                                                              \
    X(SWIGLU_BWD, "swiglu_bwd")                                                              \
    X(GELU_FWD, "gelu_fwd")                                                                  \
    X(GELU_BWD, "gelu_bwd")                                                                  \
    X(RESIDUAL_FWD, "residual_fwd")                                                          \
    X(RESIDUAL_NORM_FWD, "residual_norm_fwd")                                                \
    X(TO_ACT, "to_act")                                                                      \
    X(XENT_FWD_BWD, "xent_fwd_bwd")                                                          \
    X(ADAMW, "adamw")                                                                        \
    X(SET_WEIGHTS, "set_weights")                                                            \
    X(SUMSQ, "sumsq_blocks")                                                                 \
    X(ADD, "add")                                                                            \
    X(SCALE, "scale")                                                                        \
    X(NONFINITE, "nonfinite")

enum {
#define ST_ENUM(id, name) OP_##id,
    ST_OPS(ST_ENUM)
#undef ST_ENUM
        OP_COUNT
};

static const char *const op_names[OP_COUNT] = {
#define ST_NAME(id, name) name,
    ST_OPS(ST_NAME)
#undef ST_NAME
};

typedef struct {
    double max_abs, max_rel;
    int ran, fail;
    char note[160]; /* the first failure's detail */
} result_t;

#define NPREC 3 /* ddp_kprec_t's values */
static const char *const prec_names[NPREC] = {"fp32", "bf16", "fp16"};

#define ST_MAX_BUFS 32

/* One comparison run: the CPU oracle, the backend under test, the buffers of the current case. */
typedef struct {
    ddp_kernels_t *k[2]; /* [0] cpu, [1] the backend under test */
    uint64_t rng;
    void *bufs[ST_MAX_BUFS][2];
    int nbufs;
    int err; /* first allocation/copy error of the current case */
    ddp_kprec_t prec; /* the current case's precision: its activations' type */
    result_t res[OP_COUNT][NPREC];
} st_t;

/* The same tensor on both backends: c on the CPU, g on the backend under test; n elements of
 * type `type` (FP32 for an fp32 tensor, the case's precision for an activation). */
typedef struct {
    void *c, *g;
    size_t n;
    ddp_kprec_t type;
} pt_t;

typedef struct {
    int32_t *c, *g;
    size_t n;
} pti_t;

/* Picks side `side`'s pointer of a pair inside the two-backend loops below. */
#define P(t) (side ? (t).g : (t).c)
/* The current case's result row of op `id`. */
#define RES(id) (&s->res[OP_##id][s->prec])
#define BOTH for (int side = 0; side < 2; side++)
#define KS (s->k[side])

static inline void note(result_t *r, const char *fmt, const char *a, const char *b)
{
    r->fail = 1;
    if (!r->note[0]) snprintf(r->note, sizeof(r->note), fmt, a, b);
}

/* ---- random inputs ---- */

static inline uint64_t next_u64(st_t *s)
{
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    return s->rng * 0x2545F4914F6CDD1DULL;
}

static inline float uniform(st_t *s, float lo, float hi)
{
    return lo + (hi - lo) * (float)((next_u64(s) >> 40) * (1.0 / 16777216.0));
}

/* ---- buffers of one case ---- */

static inline void *alloc_both(st_t *s, size_t bytes, const void *host, void **g)
{
    *g = NULL;
    if (s->err) return NULL;
    if (s->nbufs == ST_MAX_BUFS) {
        s->err = DDP_ENOMEM;
        return NULL;
    }
    void *p[2] = {NULL, NULL};
    BOTH
    {
        int rc = KS->ops->alloc(KS->ctx, &p[side], bytes);
        if (rc == 0 && host) rc = KS->ops->memcpy_h2d(KS->ctx, p[side], host, bytes);
        if (rc && !s->err) s->err = rc;
    }
    s->bufs[s->nbufs][0] = p[0];
    s->bufs[s->nbufs][1] = p[1];
    s->nbufs++;
    if (s->err) return NULL;
    *g = p[1];
    return p[0];
}

static inline void end_case(st_t *s)
{
    for (int i = 0; i < s->nbufs; i++) BOTH KS->ops->free(KS->ctx, s->bufs[i][side]);
    s->nbufs = 0;
    s->err = 0;
}

/* n floats of host as elements of `type` (rounded to nearest even), into a new buffer. */
static inline void *to_type(st_t *s, const float *host, size_t n, ddp_kprec_t type)
{
    void *h = malloc((n ? n : 1) * ddp_act_bytes(type));
    if (!h) {
        if (!s->err) s->err = DDP_ENOMEM;
        return NULL;
    }
    ddp_act_from_f32(h, host, n, type);
    return h;
}

static inline pt_t pt_from(st_t *s, const float *host, size_t n, ddp_kprec_t type)
{
    pt_t t = {NULL, NULL, n, type};
    void *h = host ? to_type(s, host, n, type) : NULL;
    if (host && !h) return t;
    t.c = alloc_both(s, n * ddp_act_bytes(type), h, &t.g);
    free(h);
    return t;
}

static inline pt_t pt_rand_as(st_t *s, size_t n, float lo, float hi, ddp_kprec_t type)
{
    float *h = malloc((n ? n : 1) * sizeof(float));
    if (!h) {
        if (!s->err) s->err = DDP_ENOMEM;
        return (pt_t){NULL, NULL, n, type};
    }
    for (size_t i = 0; i < n; i++) h[i] = uniform(s, lo, hi);
    pt_t t = pt_from(s, h, n, type);
    free(h);
    return t;
}

/* An fp32 tensor, and an activation tensor of the case's precision. */
static inline pt_t pt_rand(st_t *s, size_t n, float lo, float hi)
{
    return pt_rand_as(s, n, lo, hi, DDP_KPREC_FP32);
}
static inline pt_t act_rand(st_t *s, size_t n, float lo, float hi)
{
    return pt_rand_as(s, n, lo, hi, s->prec);
}
static inline pt_t pt_zero(st_t *s, size_t n) { return pt_from(s, NULL, n, DDP_KPREC_FP32); }
static inline pt_t act_zero(st_t *s, size_t n) { return pt_from(s, NULL, n, s->prec); }

/* Token ids in [0, V); `narrow` draws from the first 5 only, so runs of equal tokens occur. */
static inline pti_t pt_tokens(st_t *s, size_t n, int V, int narrow)
{
    pti_t t = {NULL, NULL, n};
    int32_t *h = malloc((n ? n : 1) * sizeof(int32_t));
    if (!h) {
        if (!s->err) s->err = DDP_ENOMEM;
        return t;
    }
    int range = narrow && V > 5 ? 5 : V;
    for (size_t i = 0; i < n; i++) h[i] = (int32_t)(next_u64(s) % (uint64_t)range);
    void *g;
    t.c = alloc_both(s, n * sizeof(int32_t), h, &g);
    t.g = g;
    free(h);
    return t;
}

/* A host copy of one side of t widened to fp32 (caller frees), or NULL with s->err set. */
static inline float *fetch(st_t *s, pt_t t, int side)
{
    size_t bytes = t.n * ddp_act_bytes(t.type);
    float *h = malloc((t.n ? t.n : 1) * sizeof(float));
    void *raw = malloc(bytes ? bytes : 1);
    int rc = h && raw ? KS->ops->memcpy_d2h(KS->ctx, raw, P(t), bytes) : DDP_ENOMEM;
    if (rc == 0) ddp_act_to_f32(h, raw, t.n, t.type);
    free(raw);
    if (rc) {
        if (!s->err) s->err = rc;
        free(h);
        return NULL;
    }
    return h;
}

/* The CPU side of t as a new pair (the same values on both backends). */
static inline pt_t pt_copy_cpu(st_t *s, pt_t t)
{
    if (s->err) return (pt_t){NULL, NULL, t.n, t.type};
    int side = 0;
    float *h = fetch(s, t, side);
    if (!h) return (pt_t){NULL, NULL, t.n, t.type};
    pt_t r = pt_from(s, h, t.n, t.type); /* exact: h holds values of t's type */
    free(h);
    return r;
}

/* ---- running and comparing ---- */

/* True when the case's buffers are ready; otherwise records the failure. */
static inline int ready(st_t *s, result_t *r)
{
    if (!s->err) return 1;
    note(r, "setup failed: %s%s", ddp_strerror(s->err), "");
    return 0;
}

/* Waits for both backends; false (and the op failed) when either reports an error. */
static inline int sync_both(st_t *s, result_t *r)
{
    int ok = 1;
    BOTH
    {
        int rc = KS->ops->sync(KS->ctx);
        if (rc) {
            note(r, "%s: %s", KS->ops->name, ddp_strerror(rc));
            ok = 0;
        }
    }
    return ok;
}

/* Folds one element pair into r; `scale` is the tensor's largest |cpu|. */
static inline void compare_one(result_t *r, double dev, double cpu, double scale, double tol)
{
    double d = fabs(dev - cpu);
    if (isnan(dev) != isnan(cpu) || isinf(dev) != isinf(cpu) || isnan(d)) {
        r->fail = 1;
        r->max_abs = INFINITY;
        r->max_rel = INFINITY;
        return;
    }
    double floor = 1e-3 * scale > 1e-30 ? 1e-3 * scale : 1e-30;
    double rel = d / (fabs(cpu) > floor ? fabs(cpu) : floor);
    if (d > r->max_abs) r->max_abs = d;
    if (rel > r->max_rel) r->max_rel = rel;
    if (d > tol * (fabs(cpu) + scale)) r->fail = 1;
}

/* Compares t on both sides at the op's fp32 tolerance `tol`, plus one unit in the last place
 * for a 16-bit tensor (see the top). */
static inline void check(st_t *s, result_t *r, pt_t t, double tol, const char *what)
{
    static const double ulp[NPREC] = {0, 1.0 / 256, 1.0 / 2048};
    tol += ulp[t.type];
    r->ran = 1;
    float *h[2] = {NULL, NULL};
    BOTH h[side] = fetch(s, t, side);
    if (!h[0] || !h[1]) {
        note(r, "copy of %s failed: %s", what, ddp_strerror(s->err ? s->err : DDP_ENOMEM));
    } else {
        double scale = 0.0;
        for (size_t i = 0; i < t.n; i++)
            if (fabs(h[0][i]) > scale) scale = fabs(h[0][i]);
        int was = r->fail;
        for (size_t i = 0; i < t.n; i++) compare_one(r, h[1][i], h[0][i], scale, tol);
        if (r->fail && !was) note(r, "%s%s out of tolerance", what, "");
    }
    free(h[0]);
    free(h[1]);
}

#endif
