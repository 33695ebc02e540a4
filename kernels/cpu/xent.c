/* Fused softmax + cross-entropy over logits[N,V] (rows ld elements apart): losses[N], and
 * dlogits[N,V] (the same stride) when asked.
 *
 * One task per row. A row is read once for its maximum, once to write exp(x - max) into dlogits
 * (which may alias logits: each element is read before it is written, and the target logit is
 * saved first), and once more to turn the exponentials into (p - onehot) * dloss. Sums use
 * XENT_LANES partial sums in a fixed order; the per-element math is kernels/math/softmax.h.
 * logits and dlogits are of the activation type: in bf16/fp16 mode a task widens its row into
 * its thread's scratch (V floats), computes the gradient there in place, and rounds it on store.
 */
#include "kernels/cpu/cpu.h"

#include <string.h>

#include "kernels/math/softmax.h"

#define XENT_LANES 8

typedef struct {
    float *losses;
    ddp_act_t *dlogits;
    const ddp_act_t *logits;
    const int32_t *targets;
    int N, V, ld;
    float dloss;
    ddp_kprec_t prec;
    ddp__tscratch_t s; /* 16-bit: a row per thread */
} xent_args_t;

/* GCC vector extensions (portable across targets) of the baseline SSE width, two accumulators:
 * gcc does not vectorise a float max reduction by itself without -ffinite-math-only. */
typedef float v4f_t __attribute__((vector_size(16)));
typedef int32_t v4i_t __attribute__((vector_size(16)));

static inline v4f_t vmax(v4f_t a, v4f_t b)
{
    v4i_t gt = a > b;
    return (v4f_t)((gt & (v4i_t)a) | (~gt & (v4i_t)b));
}

DDP_VECTOR_INLINE float row_max(const float *restrict x, int V)
{
    v4f_t acc0 = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, acc1 = acc0;
    int i = 0;
    for (; i + 8 <= V; i += 8) {
        v4f_t v0, v1;
        memcpy(&v0, x + i, sizeof(v0));
        memcpy(&v1, x + i + 4, sizeof(v1));
        acc0 = vmax(v0, acc0);
        acc1 = vmax(v1, acc1);
    }
    acc0 = vmax(acc0, acc1);
    float m = acc0[0];
    for (int j = 1; j < 4; j++) m = acc0[j] > m ? acc0[j] : m;
    for (; i < V; i++) m = x[i] > m ? x[i] : m;
    return m;
}

DDP_VECTOR_TASK(xent_task)
{
    const xent_args_t *a = varg;
    int V = a->V;
    size_t row = (size_t)task * a->ld;
    float *wide = a->prec == DDP_KPREC_FP32 ? NULL : ddp__tscratch_mine(&a->s);
    const float *x = ddp__cpu_act_in(a->logits, row, (size_t)V, a->prec, wide);
    /* the row's gradient, computed in place over the widened row in 16-bit mode */
    float *dl = a->dlogits ? ddp__cpu_act_out(a->dlogits, row, a->prec, wide) : NULL;
    int t = a->targets[task];
    float xt = x[t];
    float mx = row_max(x, V);
    float acc[XENT_LANES] = {0};
    if (!dl) {
        int i = 0;
        for (; i + XENT_LANES <= V; i += XENT_LANES)
            for (int j = 0; j < XENT_LANES; j++) acc[j] += ddp_softmax_exp_approx(x[i + j], mx);
        for (int j = 0; i < V; i++, j++) acc[j] += ddp_softmax_exp_approx(x[i], mx);
    } else {
        float *d = dl; /* No restrict: d may be x. */
        int i = 0;
        for (; i + XENT_LANES <= V; i += XENT_LANES)
            for (int j = 0; j < XENT_LANES; j++) {
                float e = ddp_softmax_exp_approx(x[i + j], mx);
                d[i + j] = e;
                acc[j] += e;
            }
        for (int j = 0; i < V; i++, j++) {
            float e = ddp_softmax_exp_approx(x[i], mx);
            d[i] = e;
            acc[j] += e;
        }
    }
    float sum = 0.0f;
    for (int j = 0; j < XENT_LANES; j++) sum += acc[j];
    a->losses[task] = ddp_xent_loss(xt, mx, sum);
    if (dl) {
        float *restrict d = dl;
        float inv = 1.0f / sum;
        float et = d[t];
        float dloss = a->dloss;
        for (int i = 0; i < V; i++) d[i] = ddp_xent_grad(d[i] * inv, 0, dloss);
        d[t] = ddp_xent_grad(et * inv, 1, dloss);
        ddp__cpu_act_store(a->dlogits, row, d, (size_t)V, a->prec);
    }
}

void ddp__cpu_xent_fwd_bwd(ddp_kctx_t *ctx, float *losses, ddp_act_t *dlogits,
                           const ddp_act_t *logits, const int32_t *targets, int N, int V, int ld,
                           float dloss)
{
    xent_args_t a = {.losses = losses, .dlogits = dlogits, .logits = logits, .targets = targets,
                     .N = N, .V = V, .ld = ld, .dloss = dloss, .prec = ctx->prec};
    if (a.prec != DDP_KPREC_FP32 && ddp__cpu_tscratch(ctx, &a.s, (size_t)V)) return;
    ddp__pool_run(ctx->pool, N, xent_task, &a);
}
