/* The norms over rows of C channels, forward and backward: LayerNorm (GPT-2; eps =
 * DDP_LAYERNORM_EPS; math in kernels/math/layernorm.h) and RMSNorm (Llama; kernels/math/
 * rmsnorm.h), and the residual add fused with either (residual_norm_fwd).
 *
 * Forward: out[N,C], mean[N] (LayerNorm), rstd[N]; tasks are blocks of NORM_ROWS rows. The fused
 * op's task first writes its row of res = a + b (residual_fwd's sum) and then runs the same row
 * code on it, so its results are bitwise residual_fwd's followed by the norm's.
 * Backward, one call with two kinds of independent tasks:
 *   row tasks:    dinp[N,C] += rstd (dnorm - mean(dnorm) - xhat mean(dnorm xhat)), dnorm = dout w
 *                 (RMSNorm: without the mean(dnorm) term and with xhat = x rstd), and the
 *                 row's dinp_act (to_act's rounding of the new dinp) while it is in cache;
 *   column tasks: dweight[C] += sum_n dout xhat (and LayerNorm's dbias[C] += sum_n dout), each
 *                 column summed over n in order by one task (no cross-thread reduction,
 *                 thread-independent result).
 * Row sums use NORM_LANES partial sums so that gcc vectorises them; the order is fixed.
 * Activations: out (forward) and dout (backward) are of the activation type; in bf16/fp16 mode a
 * row task computes or widens its row in its thread's scratch (C floats) and a column task
 * widens its NORM_COLS-wide piece of each row on the stack (cpu.h). The rest is fp32.
 */
#include "kernels/cpu/cpu.h"

#include "kernels/math/layernorm.h"
#include "kernels/math/rmsnorm.h"

#define NORM_ROWS 16
#define NORM_COLS 128
#define NORM_LANES 8

typedef struct {
    ddp_act_t *out;
    float *mean, *rstd, *dinp, *dweight, *dbias;
    ddp_act_t *dinp_act; /* backward: NULL, or dinp rounded to the activation type */
    float *res;         /* residual_norm_fwd: a + b, normalised (inp is a) */
    const float *inp, *weight, *bias;
    const ddp_act_t *dout, *b;
    const float *cmean, *crstd;
    float eps;
    int N, C;
    long row_tasks;
    ddp_kprec_t prec;
    ddp__tscratch_t s; /* 16-bit: a row per thread */
} norm_args_t;

/* The calling thread's row of scratch (NULL in fp32 mode, which needs none). */
static float *row_tmp(const norm_args_t *a)
{
    return a->prec == DDP_KPREC_FP32 ? NULL : ddp__tscratch_mine(&a->s);
}

/* The rows [*lo, return) of row task `task`. */
static int task_rows(const norm_args_t *a, long task, int *lo)
{
    *lo = (int)task * NORM_ROWS;
    return *lo + NORM_ROWS < a->N ? *lo + NORM_ROWS : a->N;
}

/* A backward task's view of row r: its input x, its output gradient dy (widened to fp32 in the
 * thread's scratch in 16-bit mode) and the residual stream's gradient dx it adds to. */
typedef struct {
    const float *x, *dy;
    float *dx;
} bwd_row_t;

DDP_VECTOR_INLINE bwd_row_t bwd_row(const norm_args_t *a, int r)
{
    size_t i0 = (size_t)r * a->C;
    return (bwd_row_t){a->inp + i0, ddp__cpu_act_in(a->dout, i0, (size_t)a->C, a->prec, row_tmp(a)),
                       a->dinp + i0};
}

/* Runs ntasks on the pool with a row of scratch per thread in 16-bit mode. */
static void run(ddp_kctx_t *ctx, norm_args_t *a, long ntasks, ddp__task_fn fn)
{
    a->prec = ctx->prec;
    if (a->prec != DDP_KPREC_FP32 && ddp__cpu_tscratch(ctx, &a->s, (size_t)a->C)) return;
    ddp__pool_run(ctx->pool, ntasks, fn, a);
}

DDP_VECTOR_INLINE float lane_sum(const float acc[NORM_LANES])
{
    float s = 0.0f;
    for (int j = 0; j < NORM_LANES; j++) s += acc[j];
    return s;
}

/* Row r of the forward from x (its C inputs, fp32): out's row, mean[r] and rstd[r]. The one
 * row code of layernorm_fwd and residual_norm_fwd, so the two are bitwise alike. */
DDP_VECTOR_INLINE void ln_fwd_row(const norm_args_t *a, int r, const float *restrict x)
{
    int C = a->C;
    float *restrict y = ddp__cpu_act_out(a->out, (size_t)r * C, a->prec, row_tmp(a));
    float acc[NORM_LANES] = {0};
    int c = 0;
    for (; c + NORM_LANES <= C; c += NORM_LANES)
        for (int j = 0; j < NORM_LANES; j++) acc[j] += x[c + j];
    for (int j = 0; c < C; c++, j++) acc[j] += x[c];
    float m = lane_sum(acc) / (float)C;
    float acc2[NORM_LANES] = {0};
    for (c = 0; c + NORM_LANES <= C; c += NORM_LANES)
        for (int j = 0; j < NORM_LANES; j++) acc2[j] += (x[c + j] - m) * (x[c + j] - m);
    for (int j = 0; c < C; c++, j++) acc2[j] += (x[c] - m) * (x[c] - m);
    float rs = ddp_layernorm_rstd_eps(lane_sum(acc2), C, a->eps);
    const float *restrict w = a->weight;
    const float *restrict b = a->bias;
    for (c = 0; c < C; c++) y[c] = ddp_layernorm_y(x[c], m, rs, w[c], b[c]);
    ddp__cpu_act_store(a->out, (size_t)r * C, y, (size_t)C, a->prec);
    a->mean[r] = m;
    a->rstd[r] = rs;
}

DDP_VECTOR_TASK(ln_fwd_task)
{
    const norm_args_t *a = varg;
    int lo, hi = task_rows(a, task, &lo);
    for (int r = lo; r < hi; r++) ln_fwd_row(a, r, a->inp + (size_t)r * a->C);
}

void ddp__cpu_layernorm_fwd(ddp_kctx_t *ctx, ddp_act_t *out, float *mean, float *rstd,
                            const float *inp, const float *weight, const float *bias, int N,
                            int C)
{
    norm_args_t a = {.out = out, .mean = mean, .rstd = rstd, .inp = inp, .weight = weight,
                   .bias = bias, .eps = DDP_LAYERNORM_EPS, .N = N, .C = C};
    run(ctx, &a, ddp__ntasks((size_t)N, NORM_ROWS), ln_fwd_task);
}

/* Row r of the forward from x (its C inputs, fp32): out's row and rstd[r]. The one row code
 * of rmsnorm_fwd and residual_norm_fwd, so the two are bitwise alike. */
DDP_VECTOR_INLINE void rn_fwd_row(const norm_args_t *a, int r, const float *restrict x)
{
    int C = a->C;
    float *restrict y = ddp__cpu_act_out(a->out, (size_t)r * C, a->prec, row_tmp(a));
    float acc[NORM_LANES] = {0};
    int c = 0;
    for (; c + NORM_LANES <= C; c += NORM_LANES)
        for (int j = 0; j < NORM_LANES; j++) acc[j] += x[c + j] * x[c + j];
    for (int j = 0; c < C; c++, j++) acc[j] += x[c] * x[c];
    float rs = ddp_rmsnorm_rstd(lane_sum(acc), C, a->eps);
    const float *restrict w = a->weight;
    for (c = 0; c < C; c++) y[c] = ddp_rmsnorm_y(x[c], rs, w[c]);
    ddp__cpu_act_store(a->out, (size_t)r * C, y, (size_t)C, a->prec);
    a->rstd[r] = rs;
}

DDP_VECTOR_TASK(rn_fwd_task)
{
    const norm_args_t *a = varg;
    int lo, hi = task_rows(a, task, &lo);
    for (int r = lo; r < hi; r++) rn_fwd_row(a, r, a->inp + (size_t)r * a->C);
}

void ddp__cpu_rmsnorm_fwd(ddp_kctx_t *ctx, ddp_act_t *out, float *rstd, const float *inp,
                          const float *weight, int N, int C, float eps)
{
    norm_args_t a = {.out = out, .rstd = rstd, .inp = inp, .weight = weight, .eps = eps, .N = N,
                   .C = C};
    run(ctx, &a, ddp__ntasks((size_t)N, NORM_ROWS), rn_fwd_task);
}

/* Row r of dinp_act (if wanted) = its dinp row dx, rounded once (to_act's rounding, while the
 * row is in cache). */
DDP_VECTOR_INLINE void store_dinp_act(const norm_args_t *a, int r, const float *dx)
{
    if (a->dinp_act) ddp__cpu_act_store(a->dinp_act, (size_t)r * a->C, dx, (size_t)a->C, a->prec);
}

DDP_VECTOR_INLINE void ln_bwd_rows(const norm_args_t *a, long task)
{
    int C = a->C;
    int lo, hi = task_rows(a, task, &lo);
    const float *restrict w = a->weight;
    for (int r = lo; r < hi; r++) {
        bwd_row_t row = bwd_row(a, r);
        const float *restrict x = row.x, *restrict dy = row.dy;
        float *restrict dx = row.dx;
        float m = a->cmean[r], rs = a->crstd[r];
        float s1[NORM_LANES] = {0}, s2[NORM_LANES] = {0};
        int c = 0;
        for (; c + NORM_LANES <= C; c += NORM_LANES)
            for (int j = 0; j < NORM_LANES; j++) {
                float dn = dy[c + j] * w[c + j];
                s1[j] += dn;
                s2[j] += dn * ((x[c + j] - m) * rs);
            }
        for (int j = 0; c < C; c++, j++) {
            float dn = dy[c] * w[c];
            s1[j] += dn;
            s2[j] += dn * ((x[c] - m) * rs);
        }
        float mdn = lane_sum(s1) / (float)C, mdnx = lane_sum(s2) / (float)C;
        for (c = 0; c < C; c++)
            dx[c] += ddp_layernorm_dx(dy[c] * w[c], (x[c] - m) * rs, mdn, mdnx, rs);
        store_dinp_act(a, r, dx);
    }
}

DDP_VECTOR_INLINE void ln_bwd_cols(const norm_args_t *a, long task)
{
    int C = a->C;
    int c0 = (int)task * NORM_COLS, c1 = c0 + NORM_COLS < C ? c0 + NORM_COLS : C;
    int nc = c1 - c0;
    float accw[NORM_COLS] = {0}, accb[NORM_COLS] = {0}, wide[NORM_COLS];
    for (int r = 0; r < a->N; r++) {
        const float *restrict x = a->inp + (size_t)r * C + c0;
        const float *restrict dy =
            ddp__cpu_act_in(a->dout, (size_t)r * C + c0, (size_t)nc, a->prec, wide);
        float m = a->cmean[r], rs = a->crstd[r];
        for (int j = 0; j < nc; j++) {
            accw[j] += dy[j] * ((x[j] - m) * rs);
            accb[j] += dy[j];
        }
    }
    for (int j = 0; j < nc; j++) {
        a->dweight[c0 + j] += accw[j];
        a->dbias[c0 + j] += accb[j];
    }
}

DDP_VECTOR_INLINE void rn_bwd_rows(const norm_args_t *a, long task)
{
    int C = a->C;
    int lo, hi = task_rows(a, task, &lo);
    const float *restrict w = a->weight;
    for (int r = lo; r < hi; r++) {
        bwd_row_t row = bwd_row(a, r);
        const float *restrict x = row.x, *restrict dy = row.dy;
        float *restrict dx = row.dx;
        float rs = a->crstd[r];
        float s[NORM_LANES] = {0};
        int c = 0;
        for (; c + NORM_LANES <= C; c += NORM_LANES)
            for (int j = 0; j < NORM_LANES; j++) s[j] += dy[c + j] * w[c + j] * (x[c + j] * rs);
        for (int j = 0; c < C; c++, j++) s[j] += dy[c] * w[c] * (x[c] * rs);
        float mdnx = lane_sum(s) / (float)C;
        for (c = 0; c < C; c++) dx[c] += ddp_rmsnorm_dx(dy[c] * w[c], x[c] * rs, mdnx, rs);
        store_dinp_act(a, r, dx);
    }
}

DDP_VECTOR_INLINE void rn_bwd_cols(const norm_args_t *a, long task)
{
    int C = a->C;
    int c0 = (int)task * NORM_COLS, c1 = c0 + NORM_COLS < C ? c0 + NORM_COLS : C;
    int nc = c1 - c0;
    float accw[NORM_COLS] = {0}, wide[NORM_COLS];
    for (int r = 0; r < a->N; r++) {
        const float *restrict x = a->inp + (size_t)r * C + c0;
        const float *restrict dy =
            ddp__cpu_act_in(a->dout, (size_t)r * C + c0, (size_t)nc, a->prec, wide);
        float rs = a->crstd[r];
        for (int j = 0; j < nc; j++) accw[j] += dy[j] * (x[j] * rs);
    }
    for (int j = 0; j < nc; j++) a->dweight[c0 + j] += accw[j];
}

/* residual_norm_fwd: each row is added (res = a + b, b widened into the thread's row of
 * scratch in 16-bit mode) and normalised while it is in cache, by LayerNorm's row code or, with
 * mean NULL, RMSNorm's; the scratch row is free again once res is written, so the row code
 * computes out's row in it. */
DDP_VECTOR_TASK(res_task)
{
    const norm_args_t *a = varg;
    int C = a->C;
    int lo, hi = task_rows(a, task, &lo);
    for (int r = lo; r < hi; r++) {
        size_t i0 = (size_t)r * C;
        ddp__cpu_residual(a->res, a->inp, a->b, i0, (size_t)C, a->prec, row_tmp(a));
        if (a->mean)
            ln_fwd_row(a, r, a->res + i0);
        else
            rn_fwd_row(a, r, a->res + i0);
    }
}

void ddp__cpu_residual_norm_fwd(ddp_kctx_t *ctx, float *res, ddp_act_t *out, float *mean,
                                float *rstd, const float *a, const ddp_act_t *b,
                                const float *weight, const float *bias, int N, int C, float eps)
{
    norm_args_t args = {.out = out, .mean = mean, .rstd = rstd, .res = res, .inp = a, .b = b,
                        .weight = weight, .bias = bias, .eps = eps, .N = N, .C = C};
    run(ctx, &args, ddp__ntasks((size_t)N, NORM_ROWS), res_task);
}

/* A backward task: a row task or a column task, of LayerNorm (cmean set) or RMSNorm. */
DDP_VECTOR_TASK(norm_bwd_task)
{
    const norm_args_t *a = varg;
    long c = task - a->row_tasks; /* >= 0: a column task */
    if (a->cmean && c < 0)
        ln_bwd_rows(a, task);
    else if (a->cmean)
        ln_bwd_cols(a, c);
    else if (c < 0)
        rn_bwd_rows(a, task);
    else
        rn_bwd_cols(a, c);
}

void ddp__cpu_layernorm_bwd(ddp_kctx_t *ctx, float *dinp, ddp_act_t *dinp_act, float *dweight,
                            float *dbias, const ddp_act_t *dout, const float *inp,
                            const float *weight, const float *mean, const float *rstd, int N,
                            int C)
{
    norm_args_t a = {.dinp = dinp, .dinp_act = dinp_act, .dweight = dweight, .dbias = dbias,
                   .dout = dout, .inp = inp, .weight = weight, .cmean = mean, .crstd = rstd,
                   .N = N, .C = C};
    a.row_tasks = ddp__ntasks((size_t)N, NORM_ROWS);
    run(ctx, &a, a.row_tasks + ddp__ntasks((size_t)C, NORM_COLS), norm_bwd_task);
}

void ddp__cpu_rmsnorm_bwd(ddp_kctx_t *ctx, float *dinp, ddp_act_t *dinp_act, float *dweight,
                          const ddp_act_t *dout, const float *inp, const float *weight,
                          const float *rstd, int N, int C)
{
    norm_args_t a = {.dinp = dinp, .dinp_act = dinp_act, .dweight = dweight, .dout = dout,
                   .inp = inp, .weight = weight, .crstd = rstd, .N = N, .C = C};
    a.row_tasks = ddp__ntasks((size_t)N, NORM_ROWS);
    run(ctx, &a, a.row_tasks + ddp__ntasks((size_t)C, NORM_COLS), norm_bwd_task);
}
