/* The kernel self-test (`ddp-worker --selftest`): every op of every backend other than the CPU
 * that opens on this host, against the CPU backend as the oracle.
 *
 * Each op runs on the same random inputs (a fixed seed; several shapes, odd sizes included) on
 * both backends; the results are copied back and compared element by element. An element
 * passes when |dev - cpu| <= tol * (|cpu| + scale), scale = the largest |cpu| of that tensor:
 * relative for large values, and relative to the tensor's magnitude for values that come out
 * of a cancellation. `tol` per op reflects fp32 summation orders that legitimately differ
 * (cuBLAS vs OpenBLAS, warp vs lane reductions), in fp32: the self-test turns TF32 off. The
 * tied LM head's matmul (DDP_W_OUT_IN, OC = 50257) is checked with its input gradient.
 * DDP_SELFTEST_BACKENDS=sim checks the simulated GPU, which runs it in CI. Backward ops start
 * from non-zero gradients, so their += (and the overwriting of activation gradients) is
 * checked too; the aliasing the interface allows is exercised.
 * Every op with activation tensors runs in each precision (kernels.h: fp32, and bf16 and fp16
 * activations): both sides get the same 16-bit inputs, compute in fp32 and round once, so a
 * 16-bit output may differ by one unit in its last place where the fp32 results straddle a
 * rounding boundary: 16-bit outputs are compared at 2^-8 (bf16) and 2^-11 (fp16) plus the
 * op's fp32 tolerance, fp32 outputs at the op's fp32 tolerance.
 * The sparse arena (reserve/commit/decommit) is checked on both against what its
 * contract says each byte holds.
 *
 * Output: one line per op, precision and backend: op, precision, backend, max abs error, max
 * relative error (|d| / max(|cpu|, 1e-3 scale)), PASS/FAIL. Plain C: it uses only kernels.h.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "kernels/kernels.h"
#include "kernels/selftest_harness.h" /* the ops' list, the state, tensors on both, check() */

/* ---- the cases ---- */

typedef struct {
    int B, T, C, NH, V, OC;
    int NKV; /* attention's K/V heads; 0: NH */
} shape_t;

static const shape_t shapes[] = {
    {1, 1, 4, 1, 3, 5, 1},         /* one position, one head */
    {2, 7, 12, 3, 37, 20, 3},      /* odd sizes */
    {3, 33, 64, 4, 257, 129, 2},   /* warps with tails, odd vocab and OC; 2 heads a K/V head */
    {2, 64, 96, 6, 1000, 384, 2},  /* several warps per row; 3 heads a K/V head */
    {1, 3, 8, 2, 50257, 8, 1},     /* GPT-2's vocabulary; 2 heads a K/V head */
    {2, 5, 6, 2, 11, 10, 1},       /* C not a multiple of 4: the kernels' one-element paths */
};

/* memcpy_h2d reads its source at the call (kernels.h): copies from one host buffer rewritten
 * between them, small ones (staged on a GPU) and one over 4 MiB (a plain copy), must each land
 * with the values it had at its call. */
#define H2D_SMALL 4
#define H2D_BIG ((size_t)5 << 18) /* floats: 5 MiB */

static void case_memory(st_t *s)
{
    result_t *r = RES(MEMORY);
    size_t n = 1031, nc = H2D_SMALL * n + H2D_BIG;
    pt_t z = pt_zero(s, n);
    pt_t a = pt_rand(s, n, -1, 1);
    pt_t b = pt_zero(s, n);
    pt_t c = pt_zero(s, nc);
    float *h = malloc(H2D_BIG * sizeof(float));
    if (!h || !ready(s, r)) goto out;
    check(s, r, z, 0.0, "alloc (zero-filled)");
    BOTH
    {
        int rc = KS->ops->memcpy_d2d(KS->ctx, P(b), P(a), n * sizeof(float));
        if (rc == 0) rc = KS->ops->memset0(KS->ctx, (float *)P(a) + 100, 200 * sizeof(float));
        for (int j = 0; rc == 0 && j <= H2D_SMALL; j++) {
            size_t m = j < H2D_SMALL ? n : H2D_BIG;
            for (size_t i = 0; i < m; i++) h[i] = (float)j + (float)i * 1e-3f;
            rc = KS->ops->memcpy_h2d(KS->ctx, (float *)P(c) + (size_t)j * n, h,
                                     m * sizeof(float));
        }
        if (rc) note(r, "%s: %s", KS->ops->name, ddp_strerror(rc));
    }
    if (!sync_both(s, r)) goto out;
    check(s, r, a, 0.0, "memset0");
    check(s, r, b, 0.0, "memcpy_d2d");
    check(s, r, c, 0.0, "memcpy_h2d (its source read at the call)");
out:
    free(h);
    end_case(s);
}

/* The sparse arena, at G = the larger granule of the two backends so that both give back the
 * same granules: reserve 3 G and a bit, commit a middle range (rounded out: granules 0-2), write
 * a pattern over it, decommit granule 1 and the last 100 bytes of granule 0 (less than a page:
 * the CPU keeps them too), commit granule 1 again (2 still is) and the tail. Granule 1 and the
 * tail must read zero, 0 and 2 their pattern; a commit past the end is DDP_EINVAL. */
static void case_sparse(st_t *s)
{
    result_t *r = RES(SPARSE);
    size_t gran[2];
    BOTH gran[side] = ddp_k_commit_granule(KS);
    size_t G = gran[0] > gran[1] ? gran[0] : gran[1], bytes = 3 * G + 1000;
    size_t n = bytes / sizeof(float), g1 = G / sizeof(float), tail = 3 * g1;
    float *pattern = malloc(bytes), *got = malloc(bytes);
    if (!gran[0] || !gran[1] || !pattern || !got) {
        note(r, "setup failed: %s%s", !pattern || !got ? ddp_strerror(DDP_ENOMEM) : "",
             !gran[0] || !gran[1] ? "no commit granule" : "");
        goto out;
    }
    for (size_t i = 0; i < n; i++) pattern[i] = uniform(s, -1, 1);
    BOTH
    {
        char *p = NULL;
        int rc = ddp_k_reserve(KS, (void **)&p, bytes), past_end = 0;
        if (rc == 0) rc = ddp_k_commit(KS, p + G / 2, 2 * G);
        if (rc == 0) rc = ddp_k_memcpy_h2d(KS, p, pattern, 3 * G);
        if (rc == 0) {
            ddp_k_decommit(KS, p + G - 100, G + 100);
            rc = ddp_k_commit(KS, p + G, 2 * G);
        }
        if (rc == 0) rc = ddp_k_commit(KS, p + 3 * G, bytes - 3 * G);
        if (rc == 0) past_end = ddp_k_commit(KS, p + bytes - 10, 20);
        if (rc == 0) rc = ddp_k_memcpy_d2h(KS, got, p, bytes);
        if (rc == 0) rc = ddp_k_sync(KS);
        ddp_k_free(KS, p);
        if (rc) {
            note(r, "%s: %s", KS->ops->name, ddp_strerror(rc));
            continue;
        }
        if (past_end != DDP_EINVAL)
            note(r, "%s: a commit past the end gave %s, not DDP_EINVAL", KS->ops->name,
                 ddp_err_name(past_end));
        int was = r->fail;
        for (size_t i = 0; i < n; i++)
            compare_one(r, got[i], (i >= g1 && i < 2 * g1) || i >= tail ? 0.0f : pattern[i], 1.0,
                        0.0);
        if (r->fail && !was) note(r, "%s: %s", KS->ops->name, "contents out of tolerance");
    }
out:
    free(pattern);
    free(got);
}

/* narrow: tokens from a few ids (runs of equal tokens), and a forward without positions. */
static void case_encoder(st_t *s, const shape_t *sh, int narrow)
{
    int B = sh->B, T = sh->T, C = sh->C, V = sh->V;
    size_t BT = (size_t)B * T;
    result_t *rf = RES(ENCODER_FWD), *rb = RES(ENCODER_BWD);
    pti_t inp = pt_tokens(s, BT, V, narrow);
    pt_t wte = pt_rand(s, (size_t)V * C, -1, 1), wpe = pt_rand(s, (size_t)T * C, -1, 1);
    pt_t out = pt_zero(s, BT * C), dout = pt_rand(s, BT * C, -1, 1);
    pt_t dwte = pt_rand(s, (size_t)V * C, -1, 1), dwpe = pt_rand(s, (size_t)T * C, -1, 1);
    if (!ready(s, rf) || !ready(s, rb)) goto out;
    BOTH DDP_K(KS, encoder_fwd, P(out), P(inp), P(wte), narrow ? NULL : P(wpe), B, T, C);
    if (sync_both(s, rf)) check(s, rf, out, 1e-6, "out");
    BOTH DDP_K(KS, encoder_bwd, P(dwte), P(dwpe), P(dout), P(inp), B, T, C);
    if (sync_both(s, rb)) {
        check(s, rb, dwte, 1e-5, "dwte");
        check(s, rb, dwpe, 1e-5, "dwpe");
    }
out:
    end_case(s);
}

/* In the case's precision s->prec (set on both sides by run_backend). */
static void case_layernorm(st_t *s, const shape_t *sh)
{
    int N = sh->B * sh->T, C = sh->C;
    size_t NC = (size_t)N * C;
    result_t *rf = RES(LAYERNORM_FWD), *rb = RES(LAYERNORM_BWD);
    pt_t inp = pt_rand(s, NC, -2, 3), w = pt_rand(s, C, 0.5f, 1.5f), b = pt_rand(s, C, -1, 1);
    pt_t out = act_zero(s, NC), mean = pt_zero(s, N), rstd = pt_zero(s, N);
    pt_t dout = act_rand(s, NC, -1, 1), dinp = pt_rand(s, NC, -1, 1);
    pt_t dw = pt_rand(s, C, -1, 1), db = pt_rand(s, C, -1, 1), dinpa = act_zero(s, NC);
    if (!ready(s, rf)) goto out;
    BOTH DDP_K(KS, layernorm_fwd, P(out), P(mean), P(rstd), P(inp), P(w), P(b), N, C);
    if (!sync_both(s, rf)) goto out;
    check(s, rf, out, 1e-5, "out");
    check(s, rf, mean, 1e-5, "mean");
    check(s, rf, rstd, 1e-5, "rstd");
    /* The backward gets the CPU's saved statistics on both sides. */
    pt_t m2 = pt_copy_cpu(s, mean), r2 = pt_copy_cpu(s, rstd);
    if (!ready(s, rb)) goto out;
    BOTH DDP_K(KS, layernorm_bwd, P(dinp), P(dinpa), P(dw), P(db), P(dout), P(inp), P(w), P(m2),
               P(r2), N, C);
    if (sync_both(s, rb)) {
        check(s, rb, dinp, 1e-5, "dinp");
        check(s, rb, dinpa, 1e-5, "dinp_act");
        check(s, rb, dw, 1e-5, "dweight");
        check(s, rb, db, 1e-5, "dbias");
    }
out:
    end_case(s);
}

/* DDP_W_OUT_IN is the tied LM head (with a bias: a Llama's biased layers, Qwen2's q, k, v, through
 * the GPU's BGRADB epilogue): OC is the vocabulary (50257 for GPT-2's), its logits' rows
 * padded to ddp_logits_ld(V) as the model's (the padding, zero in out and random in dout, must
 * be neither written nor read), and its input gradient (dinp) is what backward carries into the
 * final LayerNorm, so it is checked too.
 * In bf16/fp16 both sides multiply the same 16-bit values (the weights and bias rounded alike)
 * with fp32 accumulation: only the summation order differs before the one rounding. */
static void case_matmul(st_t *s, const shape_t *sh, ddp_wlayout_t layout, int with_bias)
{
    int N = sh->B * sh->T, C = sh->C, OC = layout == DDP_W_OUT_IN ? sh->V : sh->OC;
    int ld = layout == DDP_W_OUT_IN ? ddp_logits_ld(OC) : OC;
    result_t *rf = RES(MATMUL_FWD), *rb = RES(MATMUL_BWD);
    pt_t inp = act_rand(s, (size_t)N * C, -1, 1), w = pt_rand(s, (size_t)C * OC, -1, 1);
    pt_t bias = pt_rand(s, OC, -1, 1), out = act_zero(s, (size_t)N * ld);
    pt_t dout = act_rand(s, (size_t)N * ld, -1, 1), dinp = act_rand(s, (size_t)N * C, -1, 1);
    pt_t dw = pt_rand(s, (size_t)C * OC, -1, 1), db = pt_rand(s, OC, -1, 1);
    if (!ready(s, rf)) goto out;
    BOTH DDP_K(KS, set_precision, s->prec); /* new weights: their converted copies again */
    BOTH DDP_K(KS, matmul_fwd, P(out), P(inp), P(w), with_bias ? P(bias) : NULL, N, C, OC, ld,
               layout);
    if (sync_both(s, rf)) check(s, rf, out, 1e-5, "out");
    /* Without bias dbias is left out; dinp is always computed (the LM head needs it). */
    BOTH DDP_K(KS, matmul_bwd, P(dinp), P(dw), with_bias ? P(db) : NULL, P(dout), P(inp), P(w), N,
               C, OC, ld, layout);
    if (sync_both(s, rb)) {
        check(s, rb, dinp, 1e-5, "dinp");
        check(s, rb, dw, 1e-5, "dweight");
        if (with_bias) check(s, rb, db, 1e-5, "dbias");
    }
out:
    end_case(s);
}

/* GPT-2's MLP products with their GELU (IN_OUT with a bias; OUT_IN without, the epilogue's
 * GELU_AUX form). A GPU's cuBLASLt takes the GELU (tanh form) in its epilogue, its own
 * arithmetic against kernels/math/gelu.h's (within the 16-bit rounding the check allows), or
 * falls back to gelu.h where the epilogue is refused or the rows are not a multiple of 8. */
static void case_matmul_gelu(st_t *s, const shape_t *sh, ddp_wlayout_t layout, int with_bias)
{
    int N = sh->B * sh->T, C = sh->C, OC = sh->OC;
    result_t *rf = RES(MATMUL_GELU_FWD), *rb = RES(MATMUL_DGELU_BWD);
    pt_t inp = act_rand(s, (size_t)N * C, -1, 1), w = pt_rand(s, (size_t)C * OC, -1, 1);
    pt_t bias = pt_rand(s, OC, -1, 1), out = act_zero(s, (size_t)N * OC);
    pt_t pre = act_zero(s, (size_t)N * OC), dout = act_rand(s, (size_t)N * OC, -1, 1);
    pt_t dpre = act_rand(s, (size_t)N * C, -1, 1), dw = pt_rand(s, (size_t)C * OC, -1, 1);
    pt_t db = pt_rand(s, OC, -1, 1), pre_in = act_rand(s, (size_t)N * C, -3, 3);
    if (!ready(s, rf)) goto out;
    BOTH DDP_K(KS, set_precision, s->prec); /* new weights: their converted copies again */
    BOTH DDP_K(KS, matmul_gelu_fwd, P(out), P(pre), P(inp), P(w), with_bias ? P(bias) : NULL, N,
               C, OC, layout);
    if (sync_both(s, rf)) {
        check(s, rf, pre, 1e-5, "pre");
        check(s, rf, out, 1e-5, "out");
    }
    /* the product that reads the GELU's output: inp [N,C] is its input, pre_in its pre */
    BOTH DDP_K(KS, matmul_dgelu_bwd, P(dpre), P(dw), with_bias ? P(db) : NULL, P(dout), P(inp),
               P(pre_in), P(w), N, C, OC, layout);
    if (sync_both(s, rb)) {
        check(s, rb, dpre, 1e-5, "dpre");
        check(s, rb, dw, 1e-5, "dweight");
        if (with_bias) check(s, rb, db, 1e-5, "dbias");
    }
out:
    end_case(s);
}

/* fp32: every backend's general path, against the CPU at fp32 tolerances. bf16/fp16: a GPU
 * takes its tensor-core flash kernels (head sizes 32, 64, 128), which round P and dS to 16 bits
 * as well, while the CPU keeps them fp32. A numpy model of exactly that rounding on these shapes
 * and T = 1024 errs by at most 3.4e-3 (bf16) and 7.5e-4 (fp16) of this check's measure, to
 * which the outputs' own rounding adds one unit in the last place: the tolerances leave about
 * 2x, and a wrong fragment or mask errs by O(1). */
static void case_attention(st_t *s, const shape_t *sh)
{
    int B = sh->B, T = sh->T, C = sh->C, NH = sh->NH, NKV = sh->NKV ? sh->NKV : NH;
    size_t BTC = (size_t)B * T * C, lse_n = (size_t)B * NH * T;
    size_t nq = (size_t)B * T * (C + 2 * (size_t)NKV * (C / NH));
    static const double tol_fwd[] = {1e-5, 1e-2, 3e-3}, tol_bwd[] = {5e-5, 1.2e-2, 3e-3};
    result_t *rf = RES(ATTENTION_FWD), *rb = RES(ATTENTION_BWD);
    pt_t qkv = act_rand(s, nq, -2, 2), out = act_zero(s, BTC), lse = pt_zero(s, lse_n);
    pt_t dout = act_rand(s, BTC, -1, 1), dqkv = act_rand(s, nq, -1, 1);
    if (!ready(s, rf)) goto out;
    BOTH DDP_K(KS, attention_fwd, P(out), P(lse), P(qkv), B, T, C, NH, NKV);
    if (!sync_both(s, rf)) goto out;
    check(s, rf, out, tol_fwd[s->prec], "out");
    check(s, rf, lse, tol_fwd[s->prec], "lse");
    /* both sides' backward reads the CPU's forward, so only backward's own error is measured */
    pt_t out2 = pt_copy_cpu(s, out), lse2 = pt_copy_cpu(s, lse);
    if (!ready(s, rb)) goto out;
    BOTH DDP_K(KS, attention_bwd, P(dqkv), P(dout), P(qkv), P(out2), P(lse2), B, T, C, NH, NKV);
    if (sync_both(s, rb)) check(s, rb, dqkv, tol_bwd[s->prec], "dqkv");
out:
    end_case(s);
}

/* RoPE on the q and k heads of qkv[B,T,(NH + 2 NKV) hs], forward then backward on a
 * gradient, with a table of real angles (Llama's base 10000). */
static void case_rope(st_t *s, int B, int T, int NH, int NKV, int hs)
{
    size_t n = (size_t)B * T * (size_t)(NH + 2 * NKV) * hs, nt = (size_t)T * hs;
    result_t *rf = RES(ROPE_FWD), *rb = RES(ROPE_BWD);
    float *tab = malloc(nt * sizeof(float));
    if (!tab) {
        note(rf, "setup failed: %s%s", ddp_strerror(DDP_ENOMEM), "");
        return;
    }
    for (size_t i = 0; i < nt / 2; i++) { /* position i / (hs/2), frequency i % (hs/2) */
        double ang = (double)(i / (hs / 2)) * pow(10000.0, -2.0 * (double)(i % (hs / 2)) / hs);
        tab[2 * i] = (float)cos(ang), tab[2 * i + 1] = (float)sin(ang);
    }
    pt_t qkv = act_rand(s, n, -2, 2), dqkv = act_rand(s, n, -1, 1);
    pt_t rope = pt_from(s, tab, nt, DDP_KPREC_FP32);
    free(tab);
    if (!ready(s, rf)) goto out;
    BOTH DDP_K(KS, rope_fwd, P(qkv), P(rope), B, T, NH, NKV, hs);
    if (sync_both(s, rf)) check(s, rf, qkv, 2e-6, "qkv");
    BOTH DDP_K(KS, rope_bwd, P(dqkv), P(rope), B, T, NH, NKV, hs);
    if (sync_both(s, rb)) check(s, rb, dqkv, 2e-6, "dqkv");
out:
    end_case(s);
}

/* In the case's precision; the backward from the CPU's saved rstd on both sides. */
static void case_rmsnorm(st_t *s, const shape_t *sh)
{
    int N = sh->B * sh->T, C = sh->C;
    size_t NC = (size_t)N * C;
    result_t *rf = RES(RMSNORM_FWD), *rb = RES(RMSNORM_BWD);
    pt_t inp = pt_rand(s, NC, -2, 3), w = pt_rand(s, C, 0.5f, 1.5f);
    pt_t out = act_zero(s, NC), rstd = pt_zero(s, N);
    pt_t dout = act_rand(s, NC, -1, 1), dinp = pt_rand(s, NC, -1, 1), dw = pt_rand(s, C, -1, 1);
    pt_t dinpa = act_zero(s, NC);
    if (!ready(s, rf)) goto out;
    BOTH DDP_K(KS, rmsnorm_fwd, P(out), P(rstd), P(inp), P(w), N, C, 1e-5f);
    if (!sync_both(s, rf)) goto out;
    check(s, rf, out, 1e-5, "out");
    check(s, rf, rstd, 1e-5, "rstd");
    pt_t r2 = pt_copy_cpu(s, rstd);
    if (!ready(s, rb)) goto out;
    BOTH DDP_K(KS, rmsnorm_bwd, P(dinp), P(dinpa), P(dw), P(dout), P(inp), P(w), P(r2), N, C);
    if (sync_both(s, rb)) {
        check(s, rb, dinp, 1e-5, "dinp");
        check(s, rb, dinpa, 1e-5, "dinp_act");
        check(s, rb, dw, 1e-5, "dweight");
    }
out:
    end_case(s);
}

/* residual_norm_fwd with LayerNorm or (rms) RMSNorm, then again with res aliasing a. */
static void case_residual_norm(st_t *s, const shape_t *sh, int rms)
{
    int N = sh->B * sh->T, C = sh->C;
    result_t *r = RES(RESIDUAL_NORM_FWD);
    pt_t res = pt_zero(s, (size_t)N * C), a = pt_rand(s, res.n, -2, 3);
    pt_t b = act_rand(s, res.n, -1, 1), out = act_zero(s, res.n), mean = pt_zero(s, N);
    pt_t w = pt_rand(s, C, 0.5f, 1.5f), bias = pt_rand(s, C, -1, 1), rstd = pt_zero(s, N);
    for (int alias = 0; alias < 2 && ready(s, r); alias++) {
        BOTH DDP_K(KS, residual_norm_fwd, P(alias ? a : res), P(out), rms ? NULL : P(mean),
                   P(rstd), P(a), P(b), P(w), rms ? NULL : P(bias), N, C, 1e-5f);
        if (!sync_both(s, r)) break;
        check(s, r, alias ? a : res, 1e-6, alias ? "res (aliasing a)" : "res");
        check(s, r, out, 1e-5, "out"), check(s, r, mean, 1e-5, "mean");
        check(s, r, rstd, 1e-5, "rstd");
    }
    end_case(s);
}

/* SwiGLU over N rows of 2H, in the case's precision (dinp starts as garbage: overwritten). */
static void case_swiglu(st_t *s, int N, int H)
{
    size_t nh = (size_t)N * H;
    result_t *rf = RES(SWIGLU_FWD), *rb = RES(SWIGLU_BWD);
    pt_t inp = act_rand(s, 2 * nh, -6, 6), out = act_zero(s, nh);
    pt_t dout = act_rand(s, nh, -1, 1), dinp = act_rand(s, 2 * nh, -1, 1);
    if (!ready(s, rf)) goto out;
    BOTH DDP_K(KS, swiglu_fwd, P(out), P(inp), N, H);
    if (sync_both(s, rf)) check(s, rf, out, 2e-6, "out");
    BOTH DDP_K(KS, swiglu_bwd, P(dinp), P(inp), P(dout), N, H);
    if (sync_both(s, rb)) check(s, rb, dinp, 2e-6, "dinp");
out:
    end_case(s);
}

/* The activations' element-wise ops, in the case's precision. */
static void case_pointwise(st_t *s, size_t n)
{
    result_t *r;
    pt_t a = act_rand(s, n, -4, 4), b = act_rand(s, n, -1, 1), out = act_zero(s, n);
    pt_t d = act_rand(s, n, -1, 1), x = pt_rand(s, n, -1, 1), sum = pt_zero(s, n);
    if (!ready(s, RES(GELU_FWD))) goto out;

    r = RES(GELU_FWD);
    BOTH DDP_K(KS, gelu_fwd, P(out), P(a), n);
    if (sync_both(s, r)) check(s, r, out, 2e-6, "out");
    r = RES(GELU_BWD);
    BOTH DDP_K(KS, gelu_bwd, P(d), P(a), P(b), n);
    if (sync_both(s, r)) check(s, r, d, 2e-6, "dinp");
    BOTH DDP_K(KS, gelu_bwd, P(b), P(a), P(b), n); /* dinp aliases dout */
    if (sync_both(s, r)) check(s, r, b, 2e-6, "dinp (aliasing dout)");
    r = RES(RESIDUAL_FWD);
    BOTH DDP_K(KS, residual_fwd, P(sum), P(x), P(d), n);
    if (sync_both(s, r)) check(s, r, sum, 1e-6, "out");
    BOTH DDP_K(KS, residual_fwd, P(x), P(x), P(d), n); /* out aliases a */
    if (sync_both(s, r)) check(s, r, x, 1e-6, "out (aliasing a)");
    r = RES(TO_ACT);
    BOTH DDP_K(KS, to_act, P(out), P(x), n);
    if (sync_both(s, r)) check(s, r, out, 0.0, "out");
out:
    end_case(s);
}

/* The fp32 vector helpers. */
static void case_vector(st_t *s, size_t n)
{
    result_t *r;
    pt_t b = pt_rand(s, n, -1, 1), y = pt_rand(s, n, -1, 1);
    if (!ready(s, RES(ADD))) goto out;
    r = RES(ADD);
    BOTH DDP_K(KS, add, P(y), P(b), n);
    if (sync_both(s, r)) check(s, r, y, 1e-6, "y");
    r = RES(SCALE);
    BOTH DDP_K(KS, scale, P(y), 0.37f, n);
    if (sync_both(s, r)) check(s, r, y, 1e-6, "x");
out:
    end_case(s);
}

static void case_adamw(st_t *s, size_t n, int t)
{
    result_t *r = RES(ADAMW);
    pt_t p = pt_rand(s, n, -1, 1), g = pt_rand(s, n, -1, 1);
    pt_t m = pt_rand(s, n, -0.1f, 0.1f), v = pt_rand(s, n, 0.0f, 0.01f);
    if (!ready(s, r)) goto out;
    /* two ranges, with and without weight decay, in one call */
    ddp_kadamw_range_t ranges[2] = {{0, n / 2, 0.1f}, {n / 2, n, 0.0f}};
    for (int step = t; step < t + 3; step++) {
        BOTH DDP_K(KS, adamw, P(p), P(g), P(m), P(v), ranges, 2, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.5f,
                   step, NULL);
        if (!sync_both(s, r)) goto out;
    }
    check(s, r, p, 1e-5, "param");
    check(s, r, m, 1e-5, "m");
    check(s, r, v, 1e-5, "v");
out:
    end_case(s);
}

/* set_weights' arena (a weight and its bias among other parameters): after adamw on the arena
 * the backend's product reads the weights' 16-bit copy that the update wrote, with no
 * set_precision; the CPU converts afresh (set_precision) and is the reference. Twice: an
 * update of the whole arena, then of a slice that cuts the weight (a sharded step's). */
static void case_set_weights(st_t *s, const shape_t *sh)
{
    int N = sh->B * sh->T, C = sh->C, OC = sh->OC;
    size_t nw = (size_t)C * OC, off = 8, n = off + nw + OC + 5;
    result_t *r = RES(SET_WEIGHTS);
    pt_t w = pt_rand(s, n, -1, 1), g = pt_rand(s, n, -1, 1), m = pt_rand(s, n, -0.1f, 0.1f);
    pt_t v = pt_rand(s, n, 0.0f, 0.01f), inp = act_rand(s, (size_t)N * C, -1, 1);
    pt_t out = act_zero(s, (size_t)N * OC);
    if (!ready(s, r)) goto out;
    BOTH DDP_K(KS, set_weights, P(w), n);
    ddp_kadamw_range_t all[2] = {{0, off + nw / 2, 0.1f}, {off + nw / 2, n, 0.0f}};
    ddp_kadamw_range_t slice[1] = {{off + 3, off + nw - 5, 0.1f}};
    for (int step = 1; step <= 2; step++) {
        BOTH DDP_K(KS, matmul_fwd, P(out), P(inp), (float *)P(w) + off, (float *)P(w) + off + nw,
                   N, C, OC, OC, DDP_W_IN_OUT); /* the copy made */
        BOTH DDP_K(KS, adamw, P(w), P(g), P(m), P(v), step == 1 ? all : slice, step == 1 ? 2 : 1,
                   1e-2f, 0.9f, 0.95f, 1e-8f, 1.0f, step, NULL);
        DDP_K(s->k[0], set_precision, s->prec); /* the reference converts afresh */
        BOTH DDP_K(KS, matmul_fwd, P(out), P(inp), (float *)P(w) + off, (float *)P(w) + off + nw,
                   N, C, OC, OC, DDP_W_IN_OUT); /* the copy kept */
        if (!sync_both(s, r)) break;
        check(s, r, out, 1e-5, step == 1 ? "out after a whole update" : "out after a slice's");
    }
out:
    BOTH DDP_K(KS, set_weights, NULL, 0); /* the arena is freed next */
    end_case(s);
}

static void case_xent(st_t *s, const shape_t *sh, int mode)
{
    int N = sh->B * sh->T, V = sh->V, ld = ddp_logits_ld(V); /* rows padded as the model's */
    size_t NV = (size_t)N * ld;
    result_t *r = RES(XENT_FWD_BWD);
    pt_t logits = act_rand(s, NV, -4, 4), losses = pt_zero(s, N), dl = act_zero(s, NV);
    pti_t tgt = pt_tokens(s, N, V, 0);
    if (!ready(s, r)) goto out;
    float dloss = 1.0f / (float)N;
    /* mode 0: separate dlogits; 1: losses only; 2: dlogits aliases logits. */
    BOTH DDP_K(KS, xent_fwd_bwd, P(losses), mode == 0 ? P(dl) : mode == 2 ? P(logits) : NULL,
               P(logits), P(tgt), N, V, ld, dloss);
    if (!sync_both(s, r)) goto out;
    check(s, r, losses, 1e-5, "losses");
    if (mode == 0) check(s, r, dl, 1e-5, "dlogits");
    if (mode == 2) check(s, r, logits, 1e-5, "dlogits (aliasing logits)");
out:
    end_case(s);
}

static void case_sumsq(st_t *s, size_t n)
{
    result_t *r = RES(SUMSQ);
    pt_t x = pt_rand(s, n, -3, 3);
    const size_t block = 16384, nb = (n + block - 1) / block + 1;
    float *out[2] = {calloc(nb, sizeof(float)), calloc(nb, sizeof(float))};
    if (!ready(s, r) || !out[0] || !out[1]) goto out;
    /* two ranges with a gap between them, the second's blocks first in out */
    size_t mid = n / 2, gap = n > 10 ? 3 : 0;
    size_t b1 = (n - mid - gap + block - 1) / block;
    ddp_krange_t ranges[2] = {{0, mid, b1}, {mid + gap, n, 0}};
    BOTH DDP_K(KS, sumsq_blocks, out[side], P(x), ranges, 2, block);
    if (!sync_both(s, r)) goto out;
    /* Both sum each block in double and round once: only the order differs. */
    for (size_t j = 0; j < nb; j++) compare_one(r, out[1][j], out[0][j], fabs(out[0][j]), 1e-6);
    if (r->fail) note(r, "sum of squares of a block out of tolerance%s%s", "", "");
out:
    free(out[0]);
    free(out[1]);
    end_case(s);
}

static void case_nonfinite(st_t *s, size_t n)
{
    result_t *r = RES(NONFINITE);
    float *h = malloc(n * sizeof(float));
    if (!h) {
        note(r, "setup failed: %s%s", ddp_strerror(DDP_ENOMEM), "");
        return;
    }
    for (size_t i = 0; i < n; i++) h[i] = uniform(s, -1, 1);
    size_t at = (size_t)(next_u64(s) % n);
    /* 0: all finite; 1: a NaN somewhere; 2: +Inf at the end. */
    for (int kind = 0; kind < 3; kind++) {
        if (kind == 1) h[at] = NAN;
        if (kind == 2) {
            h[at] = 0.5f;
            h[n - 1] = INFINITY;
        }
        pt_t x = pt_from(s, h, n, DDP_KPREC_FP32);
        int out[2] = {-1, -1};
        if (ready(s, r)) {
            BOTH DDP_K(KS, nonfinite, &out[side], P(x), n);
            if (sync_both(s, r) && (out[0] != (kind != 0) || out[1] != (kind != 0))) {
                r->max_abs = r->max_rel = 1.0;
                note(r, "wrong answer for %s%s", kind == 0 ? "finite input" : "NaN/Inf input",
                     "");
            }
        }
        end_case(s);
    }
    free(h);
}

/* Runs every case of one backend against the CPU; returns the number of failed ops. */
static int run_backend(ddp_kernels_t *cpu, ddp_kernels_t *dev)
{
    st_t *s = calloc(1, sizeof(*s));
    if (!s) {
        printf("selftest: %s: out of memory\n", dev->ops->name);
        return OP_COUNT;
    }
    s->k[0] = cpu;
    s->k[1] = dev;
    s->rng = 0x9E3779B97F4A7C15ULL;

    s->prec = DDP_KPREC_FP32;
    case_memory(s);
    case_sparse(s);
    size_t nshapes = sizeof(shapes) / sizeof(shapes[0]);
    const size_t sizes[] = {1, 31, 1000, 100003, (1u << 20) + 7};
    size_t nsizes = sizeof(sizes) / sizeof(sizes[0]);
    for (size_t i = 0; i < nshapes; i++) {
        case_encoder(s, &shapes[i], 0);
        case_encoder(s, &shapes[i], 1);
    }
    for (size_t i = 0; i < nsizes; i++) {
        case_vector(s, sizes[i]);
        case_adamw(s, sizes[i], i % 2 ? 1 : 1000);
        case_sumsq(s, sizes[i]);
        case_nonfinite(s, sizes[i]);
    }
    /* the flash kernels' head sizes, with T on and off their tiles, and grouped-query heads
     * (groups of 1, 2, 3, 4; hs 12 goes to a GPU's general path) (B, T, C, NH, NKV) */
    static const int att_shapes[][5] = {
        {1, 1, 64, 1, 1},    {2, 65, 128, 2, 2},  {1, 200, 96, 3, 3}, {2, 63, 256, 2, 2},
        {1, 300, 768, 12, 12}, {2, 65, 256, 4, 2}, {1, 130, 576, 9, 3}, {2, 63, 512, 4, 1},
        {1, 100, 192, 6, 2}, {2, 33, 48, 4, 1}};
    /* RoPE (B, T, NH, NKV, hs): odd shapes, SmolLM2's heads, a 16-bit vector's tails */
    static const int rope_shapes[][5] = {{1, 1, 1, 1, 2},  {2, 7, 3, 3, 4},   {3, 33, 4, 2, 16},
                                         {1, 65, 9, 3, 64}, {2, 17, 4, 1, 128}, {1, 5, 2, 2, 6}};
    /* every op with activations, in each precision */
    for (int p = DDP_KPREC_FP32; p <= DDP_KPREC_FP16; p++) {
        s->prec = (ddp_kprec_t)p;
        BOTH DDP_K(KS, set_precision, s->prec);
        for (size_t i = 0; i < nshapes; i++) {
            const shape_t *sh = &shapes[i];
            case_layernorm(s, sh);
            case_matmul(s, sh, DDP_W_IN_OUT, 1);
            case_matmul(s, sh, DDP_W_OUT_IN, 0);
            case_matmul(s, sh, DDP_W_OUT_IN, 1);
            case_matmul_gelu(s, sh, DDP_W_IN_OUT, 1);
            case_matmul_gelu(s, sh, DDP_W_OUT_IN, 0);
            case_set_weights(s, sh);
            case_attention(s, sh);
            case_rmsnorm(s, sh);
            for (int rms = 0; rms < 2; rms++) case_residual_norm(s, sh, rms);
            case_swiglu(s, sh->B * sh->T, sh->OC);
            for (int mode = 0; mode < 3; mode++) case_xent(s, sh, mode);
        }
        for (size_t i = 0; i < sizeof(att_shapes) / sizeof(att_shapes[0]); i++) {
            const int *a = att_shapes[i];
            shape_t sh = {.B = a[0], .T = a[1], .C = a[2], .NH = a[3], .NKV = a[4]};
            case_attention(s, &sh);
        }
        for (size_t i = 0; i < sizeof(rope_shapes) / sizeof(rope_shapes[0]); i++) {
            const int *a = rope_shapes[i];
            case_rope(s, a[0], a[1], a[2], a[3], a[4]);
        }
        for (size_t i = 0; i < nsizes; i++) case_pointwise(s, sizes[i]);
    }
    s->prec = DDP_KPREC_FP32;
    BOTH DDP_K(KS, set_precision, DDP_KPREC_FP32);

    int failed = 0;
    for (int i = 0; i < OP_COUNT; i++)
        for (int p = 0; p < NPREC; p++) {
            const result_t *r = &s->res[i][p];
            if (p > 0 && !r->ran && !r->fail) continue; /* no activations: fp32 only */
            printf("%-17s %-5s %-7s %12.3e %12.3e  %s%s%s\n", op_names[i], prec_names[p],
                   dev->ops->name, r->max_abs, r->max_rel, r->fail ? "FAIL" : "PASS",
                   r->fail && r->note[0] ? "  " : "", r->fail ? r->note : "");
            failed += r->fail;
        }
    free(s);
    return failed;
}

/* The backends to check: $DDP_SELFTEST_BACKENDS (comma-separated; "cpu" checks the CPU
 * against itself, which tests this harness), else every backend but the CPU ("cuda"). */
static int backend_list(char names[][16], int max)
{
    const char *env = getenv("DDP_SELFTEST_BACKENDS");
    if (!env || !*env) env = "cuda";
    int n = 0;
    while (*env && n < max) {
        size_t len = strcspn(env, ",");
        if (len > 0 && len < 16) {
            memcpy(names[n], env, len);
            names[n][len] = '\0';
            n++;
        }
        env += len;
        if (*env == ',') env++;
    }
    return n;
}

int ddp_kernels_selftest(void)
{
    /* fp32 tolerances: TF32 matmuls (10-bit mantissas) would fail them, so TF32 is off for the
     * self-test whatever the environment says (read by the CUDA runtime and our module when
     * they start, which is below) */
    setenv("NVIDIA_TF32_OVERRIDE", "0", 1);
    unsetenv("DDP_CUDA_TF32");
    printf("selftest: TF32 off (NVIDIA_TF32_OVERRIDE=0, DDP_CUDA_TF32 unset): fp32 tolerances\n");
    char backends[4][16];
    int nbackends = backend_list(backends, 4);
    ddp_kernels_t cpu;
    int rc = ddp_kernels_open(&cpu, "cpu", 0, 0);
    if (rc) {
        printf("selftest: cannot open the cpu backend: %s\n", ddp_strerror(rc));
        return 1;
    }
    int tested = 0, failed = 0;
    char why[256] = "";
    size_t used = 0;
    for (int i = 0; i < nbackends; i++) {
        ddp_kernels_t dev;
        rc = ddp_kernels_open(&dev, backends[i], 0, 0);
        if (rc) {
            int n = snprintf(why + used, sizeof(why) - used, "%s%s: %s", used ? "; " : "",
                             backends[i], ddp_strerror(rc));
            if (n > 0 && (size_t)n < sizeof(why) - used) used += (size_t)n;
            continue;
        }
        printf("%-17s %-5s %-7s %12s %12s  %s\n", "op", "prec", "backend", "max_abs_err",
               "max_rel_err", "result");
        int f = run_backend(&cpu, &dev);
        printf("selftest: %s: %d failed\n", backends[i], f);
        failed += f;
        tested++;
        ddp_kernels_close(&dev);
    }
    ddp_kernels_close(&cpu);
    if (!tested) {
        printf("selftest: no GPU backend usable on this host: %s\n", why);
        printf("selftest: (the module is looked up beside the executable, then in "
               "$DDP_KERNELS_PATH; DDP_LOG_LEVEL=debug says why it was not used)\n");
        return 2;
    }
    return failed ? 1 : 0;
}
