/* Causal multi-head self-attention with grouped-query heads, forward and backward,
 * flash-attention style: the op keeps no [T,T] tensor. Forward saves the output and each row's
 * log-sum-exp; backward recomputes the probabilities from them, block by block.
 *
 * qkv[B,T,QKV], QKV = C + 2 NKV hs: per position NH query heads, then NKV key heads, then NKV
 * value heads, each of hs = C/NH; query head h reads K/V head h / (NH/NKV) (Hugging Face's
 * repeat_kv); out[B,T,C]; lse[B,NH,T].
 * Forward: one task per (b, query head); it writes only that head's out and lse. Backward: one
 * task per (b, K/V head); it visits the query heads of its group in ascending order, writing
 * each one's dQ and adding its terms to the group's dK and dV, so every gradient element is
 * one task's and summed in a fixed order. Its products are single-threaded sgemms of fixed
 * shapes: results do not depend on the thread count.
 * Causal blocks: a task walks the rows in blocks of ATT_ROWS; block [r0, r1) multiplies only
 * the columns < r1 (the ones its rows can see), which skips most of the masked upper triangle:
 * at T = 1024 the products do 56% of the full square's work. A block's scores live in a
 * per-thread scratch of ATT_ROWS x T floats (two in backward: P and dS), so the op's memory is
 * 2 x threads x ATT_ROWS x T floats, not B x NH x T x T (plus, in bf16/fp16 mode, 8 T hs floats
 * per thread: below). The CPU does not tile the columns
 * further (the GPU's kernel does): the whole causal width of a block is one sgemm, which is
 * what keeps the products fast, and a row's softmax then needs no running rescale.
 * Each block's contributions to dK and dV are added in (query head, block) order, a fixed
 * order; dqkv is overwritten (dK, dV summed from zero).
 * Activations (qkv, out, dout, dqkv) are of the context's type: in bf16/fp16 mode a task widens
 * its heads' slices of qkv (and out, dout) into its thread's scratch, runs the same fp32 code on
 * them and rounds out or dq, dk, dv once on store; lse stays fp32. One difference, as in
 * FlashAttention's kernels and the GPU's (kernels/cuda/flash_attention.cu): the left operand of
 * the products P V, P^T dO, dS K and dS^T Q, a block of P or dS, is rounded to the activation
 * type first, and dQ, dK are scaled after their products; so a 16-bit run's attention is not its
 * fp32 op rounded (test_act16 holds it to stated bounds). Where the CPU multiplies bf16
 * natively, every product of a bf16 run (the scores and dP too) runs on oneDNN's tiles straight
 * from the tensors' bits, and q, k, v are not widened: GPT-2 124M's attention at T = 1024 took
 * about a third less time than on sgemm (tests/bench/README.md).
 * Scores are scaled by 1/sqrt(hs). The softmax pieces come from kernels/math/softmax.h; exp is
 * ddp_expf_approx (about 2 ulp), whose loops vectorise where glibc's expf is a call per element
 * (half of a 1024-token context's attention forward went to it otherwise).
 */
#include "kernels/cpu/cpu.h"

#include <cblas.h>
#include <math.h>

#include "common/err.h"
#include "common/vector_isa.h"
#include "kernels/math/softmax.h"

#define ATT_ROWS 128 /* rows of a causal block */
#define LANES 16     /* partial sums of a row, added in lane order: vectorisable, and fixed */

/* sum of x[0..n) * (y ? y : 1)[0..n) over LANES partial sums (a fixed order that depends on n
 * only) */
DDP_VECTOR_INLINE float lane_dot(const float *restrict x, const float *restrict y, int n)
{
    float acc[LANES] = {0};
    int i = 0;
    if (y)
        for (; i + LANES <= n; i += LANES)
            for (int j = 0; j < LANES; j++) acc[j] += x[i + j] * y[i + j];
    else
        for (; i + LANES <= n; i += LANES)
            for (int j = 0; j < LANES; j++) acc[j] += x[i + j];
    for (int j = 0; i < n; i++, j++) acc[j] += y ? x[i] * y[i] : x[i];
    float s = 0.0f;
    for (int j = 0; j < LANES; j++) s += acc[j];
    return s;
}

/* max of x[0..n), n >= 1 (order-free: lanes only let it vectorise) */
DDP_VECTOR_INLINE float lane_max(const float *restrict x, int n)
{
    float acc[LANES];
    for (int j = 0; j < LANES; j++) acc[j] = x[0];
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
    for (int j = 0; i < n; i++, j++) acc[j] = x[i] > acc[j] ? x[i] : acc[j];
    float m = acc[0];
    for (int j = 1; j < LANES; j++) m = acc[j] > m ? acc[j] : m;
    return m;
}

typedef struct {
    ddp_act_t *out, *dqkv;
    float *lse;
    const ddp_act_t *qkv, *dout, *cout;
    const float *clse;
    int B, T, C, NH, NKV;
    /* blocks of ATT_ROWS x T floats per thread: 1 forward, 2 backward, and in 16-bit mode one
     * more for P or dS rounded (rounded()) */
    int blocks;
    ddp_kprec_t prec;
    const ddp_kctx_t *ctx; /* 16-bit: the rounding of P and dS */
    ddp__bf16_t *bf16;     /* native bf16 products (all of a bf16 run's), or NULL: sgemm */
    ddp__tscratch_t s;     /* per thread: the score blocks, then (16-bit) the widened slices */
} att_args_t;

/* A product's operand in a 16-bit run: rows of a tensor, or a rounded() block, as bf16 bits for
 * the native products (b, ldb) and as fp32 for sgemm (w, ldw); what the run does not use is
 * NULL. */
typedef struct {
    const uint16_t *b;
    const float *w;
    int ldb, ldw;
} opnd_t;

/* o from its row r */
static opnd_t from_row(opnd_t o, int r)
{
    if (o.b) o.b += (size_t)r * o.ldb;
    if (o.w) o.w += (size_t)r * o.ldw;
    return o;
}

/* One task's slices as fp32, each row-major with its own leading dimension: the tensors
 * themselves in fp32 mode, else copies in the thread's scratch after the score blocks (q, k, v
 * interleaved per row, 3 hs wide, but not when the products are native: they read the bits;
 * out and dout hs wide; the gradients laid out as q, k, v).
 * A query head's parts (q, out, dout, o, dq) and its K/V head's (k, v, dk, dv) are set apart:
 * backward visits the query heads of one K/V head in turn. */
typedef struct {
    const float *q, *k, *v, *out, *dout;
    float *o, *dq, *dk, *dv; /* outputs: out forward, dq/dk/dv backward */
    int ld, ldo;             /* of q, k, v, dq, dk, dv; of out, dout, o */
    size_t q0, kv0, out0;    /* the heads' first elements in qkv (q; k) and in out */
    opnd_t Q, K, V, dO;      /* 16-bit: q, k, v and dout as product operands */
} slices_t;

/* rows x cols elements of activation src from element off, leading dimension lds, widened into
 * dst (leading dimension ldd). */
static void widen(float *dst, int ldd, const ddp_act_t *src, size_t off, int lds, int rows,
                  int cols, ddp_kprec_t prec)
{
    for (int r = 0; r < rows; r++)
        ddp_act_to_f32(dst + (size_t)r * ldd, ddp_act_at(src, off + (size_t)r * lds, prec),
                       (size_t)cols, prec);
}

/* The reverse: rows x cols fp32 of src rounded into activation dst. */
static void store(ddp_act_t *dst, size_t off, int ldd, const float *src, int lds, int rows,
                  int cols, ddp_kprec_t prec)
{
    for (int r = 0; r < rows; r++)
        ddp__cpu_act_store(dst, off + (size_t)r * ldd, src + (size_t)r * lds, (size_t)cols, prec);
}

/* Activation x's bf16 bits from element off when the products are native, else NULL. */
static const uint16_t *bits(const att_args_t *a, const ddp_act_t *x, size_t off)
{
    return a->bf16 ? (const uint16_t *)ddp_act_at(x, off, a->prec) : NULL;
}

/* Elements per position of qkv: NH query heads and NKV key and value heads. */
static int qkv_width(const att_args_t *a) { return a->C + 2 * a->NKV * (a->C / a->NH); }

/* Batch b's K/V head kvh: k and v (bwd: dk, dv too), widened in 16-bit mode. *p = the thread's
 * score blocks; the widened slices follow them. */
static void slices_kv(const att_args_t *a, int b, int kvh, int bwd, slices_t *sl, float **p)
{
    int T = a->T, hs = a->C / a->NH, QKV = qkv_width(a), kvs = a->NKV * hs;
    sl->q0 = (size_t)b * T * QKV;
    sl->kv0 = sl->q0 + (size_t)a->C + (size_t)kvh * hs;
    sl->out0 = (size_t)b * T * a->C;
    *p = ddp__tscratch_mine(&a->s);
    if (a->prec == DDP_KPREC_FP32) {
        sl->k = (const float *)a->qkv + sl->kv0, sl->v = sl->k + kvs;
        sl->ld = QKV, sl->ldo = a->C;
        if (bwd) sl->dk = (float *)a->dqkv + sl->kv0, sl->dv = sl->dk + kvs;
        return;
    }
    size_t rows = T < ATT_ROWS ? (size_t)T : ATT_ROWS;
    float *w = *p + (size_t)a->blocks * rows * T; /* [T][3 hs] q, k, v; then [T][hs] out, dout */
    sl->ld = 3 * hs, sl->ldo = hs;
    sl->k = sl->v = NULL; /* the native products read the bits */
    if (!a->bf16) {
        widen(w + hs, 3 * hs, a->qkv, sl->kv0, QKV, T, hs, a->prec);
        widen(w + 2 * hs, 3 * hs, a->qkv, sl->kv0 + kvs, QKV, T, hs, a->prec);
        sl->k = w + hs, sl->v = w + 2 * hs;
    }
    sl->K = (opnd_t){bits(a, a->qkv, sl->kv0), sl->k, QKV, sl->ld};
    sl->V = (opnd_t){bits(a, a->qkv, sl->kv0 + kvs), sl->v, QKV, sl->ld};
    if (bwd) { /* [T][3 hs] dq, dk, dv after out and dout */
        sl->dk = w + (size_t)5 * hs * T + hs, sl->dv = sl->dk + hs;
    }
}

/* Query head h of the batch slices_kv set: q, and out (fwd) or out, dout, dq (bwd). */
static void slices_q(const att_args_t *a, int h, int bwd, slices_t *sl, float *p)
{
    int T = a->T, hs = a->C / a->NH, QKV = qkv_width(a);
    size_t q0 = sl->q0 + (size_t)h * hs, o0 = sl->out0 + (size_t)h * hs;
    if (a->prec == DDP_KPREC_FP32) {
        sl->q = (const float *)a->qkv + q0;
        if (bwd) {
            sl->out = (const float *)a->cout + o0;
            sl->dout = (const float *)a->dout + o0;
            sl->dq = (float *)a->dqkv + q0;
        } else {
            sl->o = (float *)a->out + o0;
        }
        return;
    }
    size_t rows = T < ATT_ROWS ? (size_t)T : ATT_ROWS;
    float *w = p + (size_t)a->blocks * rows * T, *wo = w + (size_t)3 * hs * T;
    sl->q = NULL; /* the native products read the bits */
    if (!a->bf16) {
        widen(w, 3 * hs, a->qkv, q0, QKV, T, hs, a->prec);
        sl->q = w;
    }
    sl->Q = (opnd_t){bits(a, a->qkv, q0), sl->q, QKV, sl->ld};
    if (!bwd) {
        sl->o = wo;
        return;
    }
    widen(wo, hs, a->cout, o0, a->C, T, hs, a->prec);
    widen(wo + (size_t)hs * T, hs, a->dout, o0, a->C, T, hs, a->prec);
    sl->out = wo, sl->dout = wo + (size_t)hs * T;
    sl->dO = (opnd_t){bits(a, a->dout, o0), sl->dout, a->C, hs};
    sl->dq = wo + (size_t)2 * hs * T;
}

/* 16-bit runs: a block x[rows, cols] of P or dS rounded to the activation type into the
 * thread's last block (p: its first), as the left operand of its products, the way
 * FlashAttention's kernels and the GPU's (kernels/cuda/flash_attention.cu) take it: bf16 bits
 * for the native products, else rounded floats for sgemm. */
static opnd_t rounded(const att_args_t *a, float *p, const float *x, int rows, int cols)
{
    float *r = p + (size_t)(a->blocks - 1) * (a->T < ATT_ROWS ? a->T : ATT_ROWS) * a->T;
    ddp__cpu_lowp_round(a->ctx, r, 0, x, (size_t)rows * cols);
    return a->bf16 ? (opnd_t){(const uint16_t *)r, NULL, cols, 0} : (opnd_t){NULL, r, 0, cols};
}

/* 16-bit runs: C[m,n] (acc: +=) = op(A) op(B), op transposing with ta, tb: on the native bf16
 * products where the run has them, else sgemm. */
static void product16(const att_args_t *a, int ta, int tb, int m, int n, int k, opnd_t A, opnd_t B,
                      int acc, float *C, int ldc)
{
    if (a->bf16)
        ddp__bf16_gemm(a->bf16, ta, tb, m, n, k, A.b, A.ldb, B.b, B.ldb, acc, C, ldc);
    else
        cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                    m, n, k, 1.0f, A.w, A.ldw, B.w, B.ldw, acc ? 1.0f : 0.0f, C, ldc);
}

/* x[t * ld + i] *= s for t < rows, i < cols (16-bit runs scale dQ and dK once, after the
 * products of the unscaled dS, as the GPU does). */
DDP_VECTOR_FN(scale_rows, (float *x, int ld, int rows, int cols, float s), (x, ld, rows, cols, s))
{
    for (int t = 0; t < rows; t++)
        for (int i = 0; i < cols; i++) x[(size_t)t * ld + i] *= s;
}

/* Block [r0, r1)'s scores scale Q K^T over the columns < r1 into s[rb, r1] (the native
 * products' scaled afterwards). */
static void block_scores(const att_args_t *a, const slices_t *sl, float *s, int r0, int r1, int hs)
{
    float scale = 1.0f / sqrtf((float)hs);
    if (a->bf16) {
        product16(a, 0, 1, r1 - r0, r1, hs, from_row(sl->Q, r0), sl->K, 0, s, r1);
        scale_rows(s, r1, r1 - r0, r1, scale);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r1 - r0, r1, hs, scale,
                sl->q + (size_t)r0 * sl->ld, sl->ld, sl->k, sl->ld, 0.0f, s, r1);
}

/* Rows [r0, r1) of a block's scores s[rb, r1] become probabilities, in place: each row's
 * softmax over its columns <= t, zeros after; lse[t] = the row's log-sum-exp. */
DDP_VECTOR_FN(softmax_rows, (float *s, int r0, int r1, float *lse), (s, r0, r1, lse))
{
    for (int t = r0; t < r1; t++) {
        float *restrict row = s + (size_t)(t - r0) * r1;
        int n = t + 1;
        float mx = lane_max(row, n);
        for (int i = 0; i < n; i++) row[i] = ddp_softmax_exp_approx(row[i], mx);
        float sum = lane_dot(row, NULL, n), inv = 1.0f / sum;
        for (int i = 0; i < n; i++) row[i] *= inv;
        for (int i = n; i < r1; i++) row[i] = 0.0f;
        lse[t] = mx + logf(sum);
    }
}

/* Backward's recomputation: scores to P = exp(s - lse), in place, zero above the diagonal. */
DDP_VECTOR_FN(probability_rows, (float *s, int r0, int r1, const float *lse), (s, r0, r1, lse))
{
    for (int t = r0; t < r1; t++) {
        float *restrict row = s + (size_t)(t - r0) * r1;
        for (int i = 0; i <= t; i++) row[i] = ddp_softmax_exp_approx(row[i], lse[t]);
        for (int i = t + 1; i < r1; i++) row[i] = 0.0f;
    }
}

/* Softmax backward in place: dS = P (dP - D) over ds[rb, r1] (holding dP), D = dO . O of the
 * row; zero above the diagonal. */
DDP_VECTOR_FN(softmax_bwd_rows,
              (float *ds, const float *p, int r0, int r1, const float *dout, const float *out,
               int ldo, int hs),
              (ds, p, r0, r1, dout, out, ldo, hs))
{
    for (int t = r0; t < r1; t++) {
        const float *restrict prow = p + (size_t)(t - r0) * r1;
        float *restrict row = ds + (size_t)(t - r0) * r1;
        float d = lane_dot(dout + (size_t)t * ldo, out + (size_t)t * ldo, hs);
        for (int i = 0; i <= t; i++) row[i] = ddp_softmax_bwd(prow[i], row[i], d);
        for (int i = t + 1; i < r1; i++) row[i] = 0.0f;
    }
}

static void att_fwd_task(void *varg, long task)
{
    const att_args_t *a = varg;
    int T = a->T, NH = a->NH, hs = a->C / NH;
    int b = (int)(task / NH), h = (int)(task % NH);
    slices_t sl;
    float *p; /* [rb, r1] scores, then probabilities */
    slices_kv(a, b, h / (NH / a->NKV), 0, &sl, &p);
    slices_q(a, h, 0, &sl, p);
    float *lse = a->lse + ((size_t)b * NH + h) * T;
    for (int r0 = 0; r0 < T; r0 += ATT_ROWS) {
        int r1 = r0 + ATT_ROWS < T ? r0 + ATT_ROWS : T, rb = r1 - r0;
        block_scores(a, &sl, p, r0, r1, hs);
        softmax_rows(p, r0, r1, lse);
        /* out = P V over columns < r1 */
        float *o = sl.o + (size_t)r0 * sl.ldo;
        if (a->prec == DDP_KPREC_FP32)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rb, hs, r1, 1.0f, p, r1, sl.v,
                        sl.ld, 0.0f, o, sl.ldo);
        else
            product16(a, 0, 0, rb, hs, r1, rounded(a, p, p, rb, r1), sl.V, 0, o, sl.ldo);
    }
    if (a->prec != DDP_KPREC_FP32)
        store(a->out, sl.out0 + (size_t)h * hs, a->C, sl.o, hs, T, hs, a->prec);
}

/* Per-thread scratch for `blocks` score blocks of ATT_ROWS x T floats and, in 16-bit mode, the
 * rounded block and the widened slices (8 T hs floats at most, backward's); the native bf16
 * engine when the products run on it. 0, or DDP_ENOMEM (kept in ctx->err). */
static int att_scratch(ddp_kctx_t *ctx, att_args_t *a, int blocks)
{
    size_t rows = a->T < ATT_ROWS ? (size_t)a->T : ATT_ROWS, hs = (size_t)(a->C / a->NH);
    int lowp = ctx->prec != DDP_KPREC_FP32;
    size_t wide = lowp ? (blocks == 1 ? 4 : 8) * hs * (size_t)a->T : 0;
    a->blocks = blocks + lowp;
    a->prec = ctx->prec;
    a->ctx = ctx;
    a->bf16 = ddp__cpu_native(ctx) ? ctx->bf16 : NULL;
    return ddp__cpu_tscratch(ctx, &a->s, (size_t)a->blocks * rows * (size_t)a->T + wide);
}

void ddp__cpu_attention_fwd(ddp_kctx_t *ctx, ddp_act_t *out, float *lse, const ddp_act_t *qkv,
                            int B, int T, int C, int NH, int NKV)
{
    att_args_t a = {.out = out, .lse = lse, .qkv = qkv, .B = B, .T = T, .C = C, .NH = NH,
                    .NKV = NKV};
    if (att_scratch(ctx, &a, 1)) return;
    ddp__bf16_run(ctx, a.bf16, (long)B * NH, att_fwd_task, &a);
}

/* Query head h's share of backward: dq (overwritten) and its terms of dk, dv (added). */
static void att_bwd_head(const att_args_t *a, int b, int h, const slices_t *sl, float *p)
{
    int T = a->T, NH = a->NH, hs = a->C / NH;
    float *ds = p + (size_t)(T < ATT_ROWS ? T : ATT_ROWS) * T;
    const float *q = sl->q, *k = sl->k, *v = sl->v, *dout = sl->dout, *out = sl->out;
    float *dq = sl->dq, *dk = sl->dk, *dv = sl->dv;
    int ld = sl->ld, ldo = sl->ldo, lowp = a->prec != DDP_KPREC_FP32;
    const float *lse = a->clse + ((size_t)b * NH + h) * T;
    float scale = 1.0f / sqrtf((float)hs);
    for (int r0 = 0; r0 < T; r0 += ATT_ROWS) {
        int r1 = r0 + ATT_ROWS < T ? r0 + ATT_ROWS : T, rb = r1 - r0;
        const float *dob = dout + (size_t)r0 * ldo;
        /* P = exp(scores - lse) again, zero above the diagonal */
        block_scores(a, sl, p, r0, r1, hs);
        probability_rows(p, r0, r1, lse);
        /* out = P V:  dP = dO V^T,  dV += P^T dO (columns < r1) */
        if (a->bf16)
            product16(a, 0, 1, rb, r1, hs, from_row(sl->dO, r0), sl->V, 0, ds, r1);
        else
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rb, r1, hs, 1.0f, dob, ldo, v, ld,
                        0.0f, ds, r1);
        if (lowp)
            product16(a, 1, 0, r1, hs, rb, rounded(a, p, p, rb, r1), from_row(sl->dO, r0), 1, dv,
                      ld);
        else
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, hs, rb, 1.0f, p, r1, dob, ldo,
                        1.0f, dv, ld);
        /* softmax backward, in place: dS = P (dP - D), D = dO . O = sum(P dP) for the row */
        softmax_bwd_rows(ds, p, r0, r1, dout, out, ldo, hs);
        /* scores = scale Q K^T:  dQ = scale dS K,  dK += scale dS^T Q (columns < r1); 16-bit:
         * the products of dS rounded, times scale afterwards (dQ below, dK in att_bwd_task) */
        if (lowp) {
            opnd_t dsr = rounded(a, p, ds, rb, r1);
            product16(a, 0, 0, rb, hs, r1, dsr, sl->K, 0, dq + (size_t)r0 * ld, ld);
            product16(a, 1, 0, r1, hs, rb, dsr, from_row(sl->Q, r0), 1, dk, ld);
            continue;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rb, hs, r1, scale, ds, r1, k, ld,
                    0.0f, dq + (size_t)r0 * ld, ld);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r1, hs, rb, scale, ds, r1,
                    q + (size_t)r0 * ld, ld, 1.0f, dk, ld);
    }
    if (lowp) scale_rows(dq, ld, T, hs, scale);
}

/* Task (b, K/V head kvh): the query heads of its group in ascending order, each adding its
 * terms to dK and dV (from zero: dqkv is overwritten) and writing its dQ. */
static void att_bwd_task(void *varg, long task)
{
    const att_args_t *a = varg;
    int T = a->T, NKV = a->NKV, hs = a->C / a->NH, G = a->NH / NKV, QKV = qkv_width(a);
    int b = (int)(task / NKV), kvh = (int)(task % NKV);
    slices_t sl;
    float *p; /* [rb, r1] each: P, then dS */
    slices_kv(a, b, kvh, 1, &sl, &p);
    for (int t = 0; t < T; t++)
        for (int i = 0; i < hs; i++)
            sl.dk[(size_t)t * sl.ld + i] = sl.dv[(size_t)t * sl.ld + i] = 0.0f;
    for (int h = kvh * G; h < (kvh + 1) * G; h++) {
        slices_q(a, h, 1, &sl, p);
        att_bwd_head(a, b, h, &sl, p);
        if (a->prec != DDP_KPREC_FP32)
            store(a->dqkv, sl.q0 + (size_t)h * hs, QKV, sl.dq, sl.ld, T, hs, a->prec);
    }
    if (a->prec != DDP_KPREC_FP32) {
        scale_rows(sl.dk, sl.ld, T, hs, 1.0f / sqrtf((float)hs));
        store(a->dqkv, sl.kv0, QKV, sl.dk, sl.ld, T, hs, a->prec);
        store(a->dqkv, sl.kv0 + (size_t)NKV * hs, QKV, sl.dv, sl.ld, T, hs, a->prec);
    }
}

void ddp__cpu_attention_bwd(ddp_kctx_t *ctx, ddp_act_t *dqkv, const ddp_act_t *dout,
                            const ddp_act_t *qkv, const ddp_act_t *out, const float *lse, int B,
                            int T, int C, int NH, int NKV)
{
    att_args_t a = {.dqkv = dqkv, .dout = dout, .qkv = qkv, .cout = out, .clse = lse, .B = B,
                    .T = T, .C = C, .NH = NH, .NKV = NKV};
    if (att_scratch(ctx, &a, 2)) return;
    ddp__bf16_run(ctx, a.bf16, (long)B * NKV, att_bwd_task, &a);
}
