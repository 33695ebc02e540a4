/* RMSNorm (Llama) forward and backward over rows of C channels; the math is
 * kernels/math/rmsnorm.h, the structure layernorm.c's.
 *
 * Forward: out[N,C] = inp * rstd * weight, rstd[N] saved; tasks are blocks of RN_ROWS rows.
 * The residual add fused with it (residual_norm_fwd with mean NULL; the entry is layernorm.c's):
 * a task first writes its row of res = a + b (residual_fwd's sum), then runs the same row code
 * on it, so its results are bitwise residual_fwd's followed by rmsnorm_fwd's.
 * Backward, one call with two kinds of independent tasks:
 *   row tasks:    dinp[N,C] += rstd (dnorm - xhat mean(dnorm xhat)), dnorm = dout w;
 *   column tasks: dweight[C] += sum_n dout xhat, each column summed over n in order by one task
 *                 (no cross-thread reduction, thread-independent result).
 * Row sums use RN_LANES partial sums so that gcc vectorises them; the order is fixed.
 * Activations: out (forward) and dout (backward) are of the activation type; in bf16/fp16 mode a
 * row task computes or widens its row in its thread's scratch (C floats) and a column task
 * widens its RN_COLS-wide piece of each row on the stack (cpu.h). The rest is fp32.
 */
#include "kernels/cpu/cpu.h"

#include "kernels/math/rmsnorm.h"

#define RN_ROWS 16
#define RN_COLS 128
#define RN_LANES 8

typedef struct {
    ddp_act_t *out;
    float *rstd, *dinp, *dweight;
    float *res; /* residual_norm_fwd: a + b, normalised (inp is a) */
    const float *inp, *weight, *crstd;
    const ddp_act_t *dout, *b;
    float eps;
    int N, C;
    long row_tasks;
    ddp_kprec_t prec;
    ddp__tscratch_t s; /* 16-bit: a row per thread */
} rn_args_t;

/* The calling thread's row of scratch (NULL in fp32 mode, which needs none). */
static float *row_tmp(const rn_args_t *a)
{
    return a->prec == DDP_KPREC_FP32 ? NULL : ddp__tscratch_mine(&a->s);
}

/* Runs ntasks on the pool with a row of scratch per thread in 16-bit mode. */
static void run(ddp_kctx_t *ctx, rn_args_t *a, long ntasks, ddp__task_fn fn)
{
    a->prec = ctx->prec;
    if (a->prec != DDP_KPREC_FP32 && ddp__cpu_tscratch(ctx, &a->s, (size_t)a->C)) return;
    ddp__pool_run(ctx->pool, ntasks, fn, a);
}

static float lane_sum(const float acc[RN_LANES])
{
    float s = 0.0f;
    for (int j = 0; j < RN_LANES; j++) s += acc[j];
    return s;
}

/* Row r of the forward from x (its C inputs, fp32): out's row and rstd[r]. The one row code
 * of rmsnorm_fwd and residual_norm_fwd, so the two are bitwise alike. */
static void rn_fwd_row(const rn_args_t *a, int r, const float *restrict x)
{
    int C = a->C;
    float *restrict y = ddp__cpu_act_out(a->out, (size_t)r * C, a->prec, row_tmp(a));
    float acc[RN_LANES] = {0};
    int c = 0;
    for (; c + RN_LANES <= C; c += RN_LANES)
        for (int j = 0; j < RN_LANES; j++) acc[j] += x[c + j] * x[c + j];
    for (int j = 0; c < C; c++, j++) acc[j] += x[c] * x[c];
    float rs = ddp_rmsnorm_rstd(lane_sum(acc), C, a->eps);
    const float *restrict w = a->weight;
    for (c = 0; c < C; c++) y[c] = ddp_rmsnorm_y(x[c], rs, w[c]);
    ddp__cpu_act_store(a->out, (size_t)r * C, y, (size_t)C, a->prec);
    a->rstd[r] = rs;
}

static void rn_fwd_task(void *varg, long task)
{
    const rn_args_t *a = varg;
    int lo = (int)task * RN_ROWS, hi = lo + RN_ROWS < a->N ? lo + RN_ROWS : a->N;
    for (int r = lo; r < hi; r++) rn_fwd_row(a, r, a->inp + (size_t)r * a->C);
}

void ddp__cpu_rmsnorm_fwd(ddp_kctx_t *ctx, ddp_act_t *out, float *rstd, const float *inp,
                          const float *weight, int N, int C, float eps)
{
    rn_args_t a = {.out = out, .rstd = rstd, .inp = inp, .weight = weight, .eps = eps, .N = N,
                   .C = C};
    run(ctx, &a, ddp__ntasks((size_t)N, RN_ROWS), rn_fwd_task);
}

/* residual_norm_fwd's RMSNorm: each row is added (res = a + b, b widened into the thread's row
 * of scratch in 16-bit mode) and normalised while it is in cache; the scratch row is free
 * again once res is written, so rn_fwd_row computes out's row in it. */
static void rn_res_task(void *varg, long task)
{
    const rn_args_t *a = varg;
    int C = a->C;
    int lo = (int)task * RN_ROWS, hi = lo + RN_ROWS < a->N ? lo + RN_ROWS : a->N;
    for (int r = lo; r < hi; r++) {
        size_t i0 = (size_t)r * C;
        ddp__cpu_residual(a->res, a->inp, a->b, i0, (size_t)C, a->prec, row_tmp(a));
        rn_fwd_row(a, r, a->res + i0);
    }
}

void ddp__cpu_residual_rmsnorm_fwd(ddp_kctx_t *ctx, float *res, ddp_act_t *out, float *rstd,
                                   const float *a, const ddp_act_t *b, const float *weight, int N,
                                   int C, float eps)
{
    rn_args_t args = {.out = out, .rstd = rstd, .res = res, .inp = a, .b = b, .weight = weight,
                      .eps = eps, .N = N, .C = C};
    run(ctx, &args, ddp__ntasks((size_t)N, RN_ROWS), rn_res_task);
}

static void rn_bwd_rows(const rn_args_t *a, long task)
{
    int C = a->C;
    int lo = (int)task * RN_ROWS, hi = lo + RN_ROWS < a->N ? lo + RN_ROWS : a->N;
    const float *restrict w = a->weight;
    for (int r = lo; r < hi; r++) {
        const float *restrict x = a->inp + (size_t)r * C;
        const float *restrict dy =
            ddp__cpu_act_in(a->dout, (size_t)r * C, (size_t)C, a->prec, row_tmp(a));
        float *restrict dx = a->dinp + (size_t)r * C;
        float rs = a->crstd[r];
        float s[RN_LANES] = {0};
        int c = 0;
        for (; c + RN_LANES <= C; c += RN_LANES)
            for (int j = 0; j < RN_LANES; j++) s[j] += dy[c + j] * w[c + j] * (x[c + j] * rs);
        for (int j = 0; c < C; c++, j++) s[j] += dy[c] * w[c] * (x[c] * rs);
        float mdnx = lane_sum(s) / (float)C;
        for (c = 0; c < C; c++) dx[c] += ddp_rmsnorm_dx(dy[c] * w[c], x[c] * rs, mdnx, rs);
    }
}

static void rn_bwd_cols(const rn_args_t *a, long task)
{
    int C = a->C;
    int c0 = (int)task * RN_COLS, c1 = c0 + RN_COLS < C ? c0 + RN_COLS : C;
    int nc = c1 - c0;
    float accw[RN_COLS] = {0}, wide[RN_COLS];
    for (int r = 0; r < a->N; r++) {
        const float *restrict x = a->inp + (size_t)r * C + c0;
        const float *restrict dy =
            ddp__cpu_act_in(a->dout, (size_t)r * C + c0, (size_t)nc, a->prec, wide);
        float rs = a->crstd[r];
        for (int j = 0; j < nc; j++) accw[j] += dy[j] * (x[j] * rs);
    }
    for (int j = 0; j < nc; j++) a->dweight[c0 + j] += accw[j];
}

static void rn_bwd_task(void *varg, long task)
{
    const rn_args_t *a = varg;
    if (task < a->row_tasks)
        rn_bwd_rows(a, task);
    else
        rn_bwd_cols(a, task - a->row_tasks);
}

void ddp__cpu_rmsnorm_bwd(ddp_kctx_t *ctx, float *dinp, float *dweight, const ddp_act_t *dout,
                          const float *inp, const float *weight, const float *rstd, int N, int C)
{
    rn_args_t a = {.dinp = dinp, .dweight = dweight, .dout = dout, .inp = inp, .weight = weight,
                   .crstd = rstd, .N = N, .C = C};
    a.row_tasks = ddp__ntasks((size_t)N, RN_ROWS);
    run(ctx, &a, a.row_tasks + ddp__ntasks((size_t)C, RN_COLS), rn_bwd_task);
}
