/* The kernel backends' front door: ddp_k_<member>(k, ...) for every member of the ops table
 * (kernels.h), in the table's order.
 *
 * Each wrapper accepts a k that is NULL or not opened, checks its arguments against the
 * table's contract and only then calls the backend. Ops return nothing (they are asynchronous
 * on a GPU), so an op with bad arguments is skipped, logged, and its DDP_EINVAL kept in k->err
 * (the first only, by compare-and-swap: the checkpoint helper thread shares the context) for
 * ddp_k_sync(), the way a GPU reports an asynchronous error at the next synchronisation.
 * A count of 0 is passed through to the backend unchanged (every backend treats it as nothing
 * to do), so callers see no difference on any valid call.
 *
 * Profiling lives here and only here: each op's backend call is wrapped in TIMED, which inside
 * a profile window (kernels.h) brackets it with timing marks and charges the op with the bytes
 * and FLOPs of its shapes; kprof.c keeps the window.
 */
#include "kernels/kernels.h"

#include "common/err.h"
#include "common/log.h"
#include "kernels/kernels_int.h"

static int opened(const ddp_kernels_t *k) { return k && k->ops && k->ctx; }

/* Keeps the first argument error of k (when k exists) and logs what was wrong. */
static void bad_args(ddp_kernels_t *k, const char *op, const char *what)
{
    DDP_ERROR("kernels: %s: %s; the op is not run", op, what);
    if (!k) return;
    int none = 0;
    __atomic_compare_exchange_n(&k->err, &none, DDP_EINVAL, 0, __ATOMIC_RELAXED,
                                __ATOMIC_RELAXED);
}

/* The checks every op shares: an opened k, then each condition; 1 = run the op. */
#define OP_READY(k, op) (opened(k) ? 1 : (bad_args((k), #op, "backend not opened"), 0))
#define REQUIRE(k, op, cond)                                                                 \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            bad_args((k), #op, "requires " #cond);                                           \
            return;                                                                          \
        }                                                                                    \
    } while (0)

/* Runs `call`, the backend call of wrapper `op`. Inside a profile window of the calling thread
 * the call is bracketed with marks and op is charged with `flops` and `bytes` (evaluated only
 * then); outside one this costs ddp__kprof_begin's load and branch. */
#define TIMED(k, op, flops, bytes, call)                                                     \
    do {                                                                                     \
        ddp__kspan_t span_;                                                                  \
        if (!ddp__kprof_begin((k), &span_)) {                                                \
            call;                                                                            \
            break;                                                                           \
        }                                                                                    \
        call;                                                                                \
        ddp__kprof_end((k), DDP_KOP_##op, &span_, (double)(flops), (double)(bytes));         \
    } while (0)

#define F32 4.0 /* bytes per fp32 element */
#define ACT ((double)ddp_act_bytes(k->prec)) /* bytes per activation element of k, now */

const char *ddp_k_name(const ddp_kernels_t *k) { return k && k->ops ? k->ops->name : "none"; }

const char *ddp_k_coll_backend(const ddp_kernels_t *k)
{
    return k && k->ops ? k->ops->coll_backend : "ring";
}

int ddp_k_host_memory(const ddp_kernels_t *k) { return k && k->ops && k->ops->host_memory; }
int ddp_k_gpu_memory(const ddp_kernels_t *k) { return k && k->ops && k->ops->gpu_memory; }
int ddp_k_devices(const ddp_kernels_t *k) { return k && k->ops ? k->ops->device_count() : 0; }
const char *ddp_k_device_name(const ddp_kernels_t *k)
{
    return opened(k) && k->ops->device_name ? k->ops->device_name(k->ctx) : NULL;
}

int ddp_k_alloc(ddp_kernels_t *k, void **out, size_t bytes)
{
    if (out) *out = NULL;
    if (!opened(k) || !out) return DDP_EINVAL;
    return k->ops->alloc(k->ctx, out, bytes);
}

void ddp_k_free(ddp_kernels_t *k, void *p)
{
    if (opened(k) && p) k->ops->free(k->ctx, p);
}

int ddp_k_reserve(ddp_kernels_t *k, void **out, size_t bytes)
{
    if (out) *out = NULL;
    if (!opened(k) || !out) return DDP_EINVAL;
    return k->ops->reserve(k->ctx, out, bytes);
}

int ddp_k_commit(ddp_kernels_t *k, void *p, size_t bytes)
{
    if (!opened(k) || (bytes && !p)) return DDP_EINVAL;
    return k->ops->commit(k->ctx, p, bytes);
}

/* Returns nothing, like an op: a bad argument is kept for ddp_k_sync(). */
void ddp_k_decommit(ddp_kernels_t *k, void *p, size_t bytes)
{
    if (!OP_READY(k, decommit)) return;
    REQUIRE(k, decommit, bytes == 0 || p);
    k->ops->decommit(k->ctx, p, bytes);
}

size_t ddp_k_commit_granule(ddp_kernels_t *k)
{
    return opened(k) ? k->ops->commit_granule(k->ctx) : 0;
}

int ddp_k_on_device(ddp_kernels_t *k, const void *p, size_t bytes)
{
    return opened(k) && p && bytes ? k->ops->on_device(k->ctx, p, bytes) : 0;
}

int ddp_k_memcpy_h2d(ddp_kernels_t *k, void *dst, const void *src, size_t bytes)
{
    if (!opened(k) || (bytes && (!dst || !src))) return DDP_EINVAL;
    int rc;
    TIMED(k, memcpy_h2d, 0, bytes, rc = k->ops->memcpy_h2d(k->ctx, dst, src, bytes));
    return rc;
}

int ddp_k_memcpy_d2h(ddp_kernels_t *k, void *dst, const void *src, size_t bytes)
{
    if (!opened(k) || (bytes && (!dst || !src))) return DDP_EINVAL;
    int rc;
    TIMED(k, memcpy_d2h, 0, bytes, rc = k->ops->memcpy_d2h(k->ctx, dst, src, bytes));
    return rc;
}

int ddp_k_memcpy_d2d(ddp_kernels_t *k, void *dst, const void *src, size_t bytes)
{
    if (!opened(k) || (bytes && (!dst || !src))) return DDP_EINVAL;
    int rc;
    TIMED(k, memcpy_d2d, 0, 2.0 * bytes, rc = k->ops->memcpy_d2d(k->ctx, dst, src, bytes));
    return rc;
}

int ddp_k_memset0(ddp_kernels_t *k, void *dst, size_t bytes)
{
    if (!opened(k) || (bytes && !dst)) return DDP_EINVAL;
    int rc;
    TIMED(k, memset0, 0, bytes, rc = k->ops->memset0(k->ctx, dst, bytes));
    return rc;
}

int ddp_k_sync(ddp_kernels_t *k)
{
    if (!opened(k)) return DDP_EINVAL;
    int rc;
    TIMED(k, sync, 0, 0, rc = k->ops->sync(k->ctx));
    int kept = __atomic_load_n(&k->err, __ATOMIC_RELAXED);
    return kept ? kept : rc;
}

int ddp_k_record_event(ddp_kernels_t *k, void **event)
{
    if (event) *event = NULL;
    if (!opened(k) || !event) return DDP_EINVAL;
    return k->ops->record_event(k->ctx, event);
}

void ddp_k_encoder_fwd(ddp_kernels_t *k, float *out, const int32_t *inp, const float *wte,
                       const float *wpe, int B, int T, int C)
{
    if (!OP_READY(k, encoder_fwd)) return;
    REQUIRE(k, encoder_fwd, out && inp && wte); /* wpe NULL: no positions */
    REQUIRE(k, encoder_fwd, B > 0 && T > 0 && C > 0);
    TIMED(k, encoder_fwd, 0,
          F32 * (2.0 * B * T * C + (wpe ? (double)T * C : 0) + (double)B * T),
          k->ops->encoder_fwd(k->ctx, out, inp, wte, wpe, B, T, C));
}

void ddp_k_encoder_bwd(ddp_kernels_t *k, float *dwte, float *dwpe, const float *dout,
                       const int32_t *inp, int B, int T, int C)
{
    if (!OP_READY(k, encoder_bwd)) return;
    REQUIRE(k, encoder_bwd, dout && inp);
    REQUIRE(k, encoder_bwd, B > 0 && T > 0 && C > 0);
    TIMED(k, encoder_bwd, 0,
          F32 * ((double)B * T * (C + 1) + (dwte ? 2.0 * B * T * C : 0) +
                 (dwpe ? 2.0 * T * C : 0)),
          k->ops->encoder_bwd(k->ctx, dwte, dwpe, dout, inp, B, T, C));
}

void ddp_k_layernorm_fwd(ddp_kernels_t *k, ddp_act_t *out, float *mean, float *rstd,
                         const float *inp, const float *weight, const float *bias, int N, int C)
{
    if (!OP_READY(k, layernorm_fwd)) return;
    REQUIRE(k, layernorm_fwd, out && mean && rstd && inp && weight && bias);
    REQUIRE(k, layernorm_fwd, N > 0 && C > 0);
    TIMED(k, layernorm_fwd, 0, F32 * ((double)N * C + 2.0 * C + 2.0 * N) + ACT * N * C,
          k->ops->layernorm_fwd(k->ctx, out, mean, rstd, inp, weight, bias, N, C));
}

void ddp_k_layernorm_bwd(ddp_kernels_t *k, float *dinp, ddp_act_t *dinp_act, float *dweight,
                         float *dbias, const ddp_act_t *dout, const float *inp,
                         const float *weight, const float *mean, const float *rstd, int N, int C)
{
    if (!OP_READY(k, layernorm_bwd)) return;
    REQUIRE(k, layernorm_bwd, dinp && dweight && dbias && dout && inp && weight && mean && rstd);
    REQUIRE(k, layernorm_bwd, N > 0 && C > 0);
    TIMED(k, layernorm_bwd, 0,
          F32 * (3.0 * N * C + 5.0 * C + 2.0 * N) + ACT * N * C * (dinp_act ? 2.0 : 1.0),
          k->ops->layernorm_bwd(k->ctx, dinp, dinp_act, dweight, dbias, dout, inp, weight, mean,
                                rstd, N, C));
}

void ddp_k_matmul_fwd(ddp_kernels_t *k, ddp_act_t *out, const ddp_act_t *inp,
                      const float *weight, const float *bias, int N, int C, int OC, int ldo,
                      ddp_wlayout_t layout)
{
    if (!OP_READY(k, matmul_fwd)) return;
    REQUIRE(k, matmul_fwd, out && inp && weight);
    REQUIRE(k, matmul_fwd, N > 0 && C > 0 && OC > 0 && ldo >= OC);
    REQUIRE(k, matmul_fwd, layout == DDP_W_IN_OUT || layout == DDP_W_OUT_IN);
    /* the weight as the product reads it: its copy in the run's precision */
    TIMED(k, matmul_fwd, 2.0 * N * C * OC,
          ACT * ((double)N * C + (double)C * OC + (double)N * OC) + F32 * (bias ? OC : 0),
          k->ops->matmul_fwd(k->ctx, out, inp, weight, bias, N, C, OC, ldo, layout));
}

void ddp_k_matmul_bwd(ddp_kernels_t *k, ddp_act_t *dinp, float *dweight, float *dbias,
                      const ddp_act_t *dout, const ddp_act_t *inp, const float *weight, int N,
                      int C, int OC, int ldo, ddp_wlayout_t layout)
{
    if (!OP_READY(k, matmul_bwd)) return;
    REQUIRE(k, matmul_bwd, dweight && dout && inp && weight);
    REQUIRE(k, matmul_bwd, N > 0 && C > 0 && OC > 0 && ldo >= OC);
    REQUIRE(k, matmul_bwd, layout == DDP_W_IN_OUT || layout == DDP_W_OUT_IN);
    /* without dinp the weight is not read and only dweight's product runs */
    TIMED(k, matmul_bwd, (dinp ? 4.0 : 2.0) * N * C * OC,
          ACT * ((double)N * OC + (double)N * C + (dinp ? (double)N * C + (double)C * OC : 0)) +
              F32 * (2.0 * C * OC + (dbias ? 2.0 * OC : 0)),
          k->ops->matmul_bwd(k->ctx, dinp, dweight, dbias, dout, inp, weight, N, C, OC, ldo,
                             layout));
}

void ddp_k_matmul_gelu_fwd(ddp_kernels_t *k, ddp_act_t *out, ddp_act_t *pre, const ddp_act_t *inp,
                           const float *weight, const float *bias, int N, int C, int OC,
                           ddp_wlayout_t layout)
{
    if (!OP_READY(k, matmul_gelu_fwd)) return;
    REQUIRE(k, matmul_gelu_fwd, out && pre && inp && weight);
    REQUIRE(k, matmul_gelu_fwd, out != pre && out != inp && pre != inp);
    REQUIRE(k, matmul_gelu_fwd, N > 0 && C > 0 && OC > 0);
    REQUIRE(k, matmul_gelu_fwd, layout == DDP_W_IN_OUT || layout == DDP_W_OUT_IN);
    TIMED(k, matmul_gelu_fwd, 2.0 * N * C * OC,
          ACT * ((double)N * C + (double)C * OC + 2.0 * N * OC) + F32 * (bias ? OC : 0),
          k->ops->matmul_gelu_fwd(k->ctx, out, pre, inp, weight, bias, N, C, OC, layout));
}

void ddp_k_matmul_dgelu_bwd(ddp_kernels_t *k, ddp_act_t *dpre, float *dweight, float *dbias,
                            const ddp_act_t *dout, const ddp_act_t *inp, const ddp_act_t *pre,
                            const float *weight, int N, int C, int OC, ddp_wlayout_t layout)
{
    if (!OP_READY(k, matmul_dgelu_bwd)) return;
    REQUIRE(k, matmul_dgelu_bwd, dpre && dweight && dout && inp && pre && weight);
    REQUIRE(k, matmul_dgelu_bwd, dpre != dout && dpre != inp && dpre != pre);
    REQUIRE(k, matmul_dgelu_bwd, N > 0 && C > 0 && OC > 0);
    REQUIRE(k, matmul_dgelu_bwd, layout == DDP_W_IN_OUT || layout == DDP_W_OUT_IN);
    TIMED(k, matmul_dgelu_bwd, 4.0 * N * C * OC,
          ACT * ((double)N * OC + 3.0 * N * C + (double)C * OC) +
              F32 * (2.0 * C * OC + (dbias ? 2.0 * OC : 0)),
          k->ops->matmul_dgelu_bwd(k->ctx, dpre, dweight, dbias, dout, inp, pre, weight, N, C,
                                   OC, layout));
}

void ddp_k_attention_fwd(ddp_kernels_t *k, ddp_act_t *out, float *lse, const ddp_act_t *qkv,
                         int B, int T, int C, int NH, int NKV)
{
    if (!OP_READY(k, attention_fwd)) return;
    REQUIRE(k, attention_fwd, out && lse && qkv);
    REQUIRE(k, attention_fwd, B > 0 && T > 0 && C > 0 && NH > 0 && C % NH == 0);
    REQUIRE(k, attention_fwd, NKV > 0 && NH % NKV == 0);
    TIMED(k, attention_fwd, ddp__attn_flops(B, T, C, NH, 0),
          ddp__attn_bytes(B, T, C, NH, NKV, 0, ACT),
          k->ops->attention_fwd(k->ctx, out, lse, qkv, B, T, C, NH, NKV));
}

void ddp_k_attention_bwd(ddp_kernels_t *k, ddp_act_t *dqkv, const ddp_act_t *dout,
                         const ddp_act_t *qkv, const ddp_act_t *out, const float *lse, int B,
                         int T, int C, int NH, int NKV)
{
    if (!OP_READY(k, attention_bwd)) return;
    REQUIRE(k, attention_bwd, dqkv && dout && qkv && out && lse);
    REQUIRE(k, attention_bwd, B > 0 && T > 0 && C > 0 && NH > 0 && C % NH == 0);
    REQUIRE(k, attention_bwd, NKV > 0 && NH % NKV == 0);
    TIMED(k, attention_bwd, ddp__attn_flops(B, T, C, NH, 1),
          ddp__attn_bytes(B, T, C, NH, NKV, 1, ACT),
          k->ops->attention_bwd(k->ctx, dqkv, dout, qkv, out, lse, B, T, C, NH, NKV));
}

/* RoPE reads and writes the q and k heads, B T (NH + NKV) hs activations, and reads the table
 * (T hs/2 pairs of fp32) */
static double rope_bytes(const ddp_kernels_t *k, int B, int T, int NH, int NKV, int hs)
{
    return ACT * 2.0 * B * T * (double)(NH + NKV) * hs + F32 * (double)T * hs;
}

void ddp_k_rope_fwd(ddp_kernels_t *k, ddp_act_t *qkv, const float *rope, int B, int T, int NH,
                    int NKV, int hs)
{
    if (!OP_READY(k, rope_fwd)) return;
    REQUIRE(k, rope_fwd, qkv && rope);
    REQUIRE(k, rope_fwd, B > 0 && T > 0 && NH > 0 && NKV > 0 && hs > 0 && hs % 2 == 0);
    TIMED(k, rope_fwd, 0, rope_bytes(k, B, T, NH, NKV, hs),
          k->ops->rope_fwd(k->ctx, qkv, rope, B, T, NH, NKV, hs));
}

void ddp_k_rope_bwd(ddp_kernels_t *k, ddp_act_t *dqkv, const float *rope, int B, int T, int NH,
                    int NKV, int hs)
{
    if (!OP_READY(k, rope_bwd)) return;
    REQUIRE(k, rope_bwd, dqkv && rope);
    REQUIRE(k, rope_bwd, B > 0 && T > 0 && NH > 0 && NKV > 0 && hs > 0 && hs % 2 == 0);
    TIMED(k, rope_bwd, 0, rope_bytes(k, B, T, NH, NKV, hs),
          k->ops->rope_bwd(k->ctx, dqkv, rope, B, T, NH, NKV, hs));
}

void ddp_k_rmsnorm_fwd(ddp_kernels_t *k, ddp_act_t *out, float *rstd, const float *inp,
                       const float *weight, int N, int C, float eps)
{
    if (!OP_READY(k, rmsnorm_fwd)) return;
    REQUIRE(k, rmsnorm_fwd, out && rstd && inp && weight);
    REQUIRE(k, rmsnorm_fwd, N > 0 && C > 0 && eps >= 0.0f);
    TIMED(k, rmsnorm_fwd, 0, F32 * ((double)N * C + C + N) + ACT * N * C,
          k->ops->rmsnorm_fwd(k->ctx, out, rstd, inp, weight, N, C, eps));
}

void ddp_k_rmsnorm_bwd(ddp_kernels_t *k, float *dinp, ddp_act_t *dinp_act, float *dweight,
                       const ddp_act_t *dout, const float *inp, const float *weight,
                       const float *rstd, int N, int C)
{
    if (!OP_READY(k, rmsnorm_bwd)) return;
    REQUIRE(k, rmsnorm_bwd, dinp && dweight && dout && inp && weight && rstd);
    REQUIRE(k, rmsnorm_bwd, N > 0 && C > 0);
    /* dinp and dweight accumulate: read and written */
    TIMED(k, rmsnorm_bwd, 0,
          F32 * (3.0 * N * C + 3.0 * C + N) + ACT * N * C * (dinp_act ? 2.0 : 1.0),
          k->ops->rmsnorm_bwd(k->ctx, dinp, dinp_act, dweight, dout, inp, weight, rstd, N, C));
}

void ddp_k_swiglu_fwd(ddp_kernels_t *k, ddp_act_t *out, const ddp_act_t *inp, int N, int H)
{
    if (!OP_READY(k, swiglu_fwd)) return;
    REQUIRE(k, swiglu_fwd, out && inp);
    REQUIRE(k, swiglu_fwd, N > 0 && H > 0);
    TIMED(k, swiglu_fwd, 0, ACT * 3.0 * N * H, k->ops->swiglu_fwd(k->ctx, out, inp, N, H));
}

void ddp_k_swiglu_bwd(ddp_kernels_t *k, ddp_act_t *dinp, const ddp_act_t *inp,
                      const ddp_act_t *dout, int N, int H)
{
    if (!OP_READY(k, swiglu_bwd)) return;
    REQUIRE(k, swiglu_bwd, dinp && inp && dout && dinp != inp);
    REQUIRE(k, swiglu_bwd, N > 0 && H > 0);
    TIMED(k, swiglu_bwd, 0, ACT * 5.0 * N * H,
          k->ops->swiglu_bwd(k->ctx, dinp, inp, dout, N, H));
}

void ddp_k_gelu_fwd(ddp_kernels_t *k, ddp_act_t *out, const ddp_act_t *inp, size_t n)
{
    if (!OP_READY(k, gelu_fwd)) return;
    REQUIRE(k, gelu_fwd, n == 0 || (out && inp));
    TIMED(k, gelu_fwd, 0, ACT * 2 * n,
          k->ops->gelu_fwd(k->ctx, out, inp, n));
}

void ddp_k_gelu_bwd(ddp_kernels_t *k, ddp_act_t *dinp, const ddp_act_t *inp,
                    const ddp_act_t *dout, size_t n)
{
    if (!OP_READY(k, gelu_bwd)) return;
    REQUIRE(k, gelu_bwd, n == 0 || (dinp && inp && dout));
    TIMED(k, gelu_bwd, 0, ACT * 3 * n,
          k->ops->gelu_bwd(k->ctx, dinp, inp, dout, n));
}

void ddp_k_residual_fwd(ddp_kernels_t *k, float *out, const float *a, const ddp_act_t *b,
                        size_t n)
{
    if (!OP_READY(k, residual_fwd)) return;
    REQUIRE(k, residual_fwd, n == 0 || (out && a && b));
    TIMED(k, residual_fwd, 0, (F32 * 2 + ACT) * n,
          k->ops->residual_fwd(k->ctx, out, a, b, n));
}

void ddp_k_residual_norm_fwd(ddp_kernels_t *k, float *res, ddp_act_t *out, float *mean,
                             float *rstd, const float *a, const ddp_act_t *b, const float *weight,
                             const float *bias, int N, int C, float eps)
{
    if (!OP_READY(k, residual_norm_fwd)) return;
    REQUIRE(k, residual_norm_fwd, res && out && rstd && a && b && weight);
    REQUIRE(k, residual_norm_fwd, mean || !bias); /* RMSNorm (mean NULL) has no bias */
    REQUIRE(k, residual_norm_fwd, N > 0 && C > 0 && eps >= 0.0f);
    /* reads a, b, weight (and bias); writes res, out, rstd (and mean): one pass over the rows */
    double stats = mean ? 2.0 : 1.0;
    TIMED(k, residual_norm_fwd, 0,
          F32 * (2.0 * N * C + stats * (C + N)) + 2.0 * ACT * N * C,
          k->ops->residual_norm_fwd(k->ctx, res, out, mean, rstd, a, b, weight, bias, N, C, eps));
}

void ddp_k_to_act(ddp_kernels_t *k, ddp_act_t *out, const float *inp, size_t n)
{
    if (!OP_READY(k, to_act)) return;
    REQUIRE(k, to_act, n == 0 || (out && inp));
    TIMED(k, to_act, 0, (F32 + ACT) * n,
          k->ops->to_act(k->ctx, out, inp, n));
}

void ddp_k_xent_fwd_bwd(ddp_kernels_t *k, float *losses, ddp_act_t *dlogits,
                        const ddp_act_t *logits, const int32_t *targets, int N, int V, int ld,
                        float dloss)
{
    if (!OP_READY(k, xent_fwd_bwd)) return;
    REQUIRE(k, xent_fwd_bwd, losses && logits && targets);
    REQUIRE(k, xent_fwd_bwd, N > 0 && V > 0 && ld >= V);
    TIMED(k, xent_fwd_bwd, 0, ACT * (dlogits ? 2.0 : 1.0) * N * V + F32 * 2.0 * N,
          k->ops->xent_fwd_bwd(k->ctx, losses, dlogits, logits, targets, N, V, ld, dloss));
}

void ddp_k_adamw(ddp_kernels_t *k, float *param, const float *grad, float *m, float *v,
                 const ddp_kadamw_range_t *ranges, int nranges, float lr, float beta1,
                 float beta2, float eps, float grad_scale, int t, uint32_t *crc)
{
    if (!OP_READY(k, adamw)) return;
    REQUIRE(k, adamw, t >= 1 && nranges >= 0 && (nranges == 0 || ranges));
    size_t n = 0;
    for (int r = 0; r < nranges; r++) {
        REQUIRE(k, adamw, ranges[r].lo <= ranges[r].hi);
        n += ranges[r].hi - ranges[r].lo;
    }
    REQUIRE(k, adamw, n == 0 || (param && grad && m && v));
    TIMED(k, adamw, 0, F32 * 7 * n,
          k->ops->adamw(k->ctx, param, grad, m, v, ranges, nranges, lr, beta1, beta2, eps,
                        grad_scale, t, crc));
}

void ddp_k_sumsq_blocks(ddp_kernels_t *k, float *out, const float *x, const ddp_krange_t *ranges,
                        int nranges, size_t block)
{
    if (!OP_READY(k, sumsq_blocks)) return;
    REQUIRE(k, sumsq_blocks, block > 0 && nranges >= 0 && (nranges == 0 || ranges));
    size_t n = 0, outs = 0;
    for (int r = 0; r < nranges; r++) {
        REQUIRE(k, sumsq_blocks, ranges[r].lo <= ranges[r].hi);
        n += ranges[r].hi - ranges[r].lo;
        outs += (ranges[r].hi - ranges[r].lo + block - 1) / block;
    }
    REQUIRE(k, sumsq_blocks, n == 0 || (out && x));
    TIMED(k, sumsq_blocks, 0, F32 * (n + outs),
          k->ops->sumsq_blocks(k->ctx, out, x, ranges, nranges, block));
}

void ddp_k_add(ddp_kernels_t *k, float *y, const float *x, size_t n)
{
    if (!OP_READY(k, add)) return;
    REQUIRE(k, add, n == 0 || (y && x));
    TIMED(k, add, 0, F32 * 3 * n,
          k->ops->add(k->ctx, y, x, n));
}

void ddp_k_scale(ddp_kernels_t *k, float *x, float s, size_t n)
{
    if (!OP_READY(k, scale)) return;
    REQUIRE(k, scale, n == 0 || x);
    TIMED(k, scale, 0, F32 * 2 * n,
          k->ops->scale(k->ctx, x, s, n));
}

void ddp_k_nonfinite(ddp_kernels_t *k, int *out, const float *x, size_t n)
{
    if (!OP_READY(k, nonfinite)) return;
    REQUIRE(k, nonfinite, out && (n == 0 || x));
    TIMED(k, nonfinite, 0, F32 * n,
          k->ops->nonfinite(k->ctx, out, x, n));
}

void ddp_k_set_precision(ddp_kernels_t *k, ddp_kprec_t prec)
{
    if (!OP_READY(k, set_precision)) return;
    REQUIRE(k, set_precision, prec == DDP_KPREC_FP32 || prec == DDP_KPREC_BF16 ||
                                  prec == DDP_KPREC_FP16);
    TIMED(k, set_precision, 0, 0,
          k->ops->set_precision(k->ctx, prec));
    k->prec = prec;
}

void ddp_k_set_weights(ddp_kernels_t *k, const float *w, size_t n)
{
    if (!OP_READY(k, set_weights)) return;
    REQUIRE(k, set_weights, (w == NULL) == (n == 0));
    TIMED(k, set_weights, 0, 0,
          k->ops->set_weights(k->ctx, w, n));
}

ddp_kprec_t ddp_k_precision(const ddp_kernels_t *k)
{
    return opened(k) ? k->prec : DDP_KPREC_FP32;
}

int ddp_k_prec_native(ddp_kernels_t *k, ddp_kprec_t prec, const char **why)
{
    const char *none = NULL;
    if (!why) why = &none;
    *why = "no kernel backend is open";
    if (!opened(k)) return 0;
    return k->ops->prec_native(k->ctx, prec, why);
}
