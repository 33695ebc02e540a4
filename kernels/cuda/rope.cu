/* Rotary position embedding (Llama), forward and backward, in place on qkv's q and k heads
 * (math in kernels/math/rope.h, shared with the CPU).
 *
 * qkv[B,T,(NH + 2 NKV) hs]: per position NH query heads, then NKV key heads (rotated), then NKV
 * value heads (untouched); rope[T, hs/2, 2] fp32 (cos, sin). Element i < hs/2 of a head pairs
 * with element i + hs/2. Backward rotates back (sine negated).
 * A grid-stride loop over the B T (NH + NKV) hs/2 pairs, V consecutive pairs a thread: V = 16
 * bytes of activations (8 16-bit or 4 fp32 elements) when hs/2 % V == 0 and qkv is 16-byte
 * aligned (then every head half starts on a multiple of V), else 1. Each element is read and
 * written by one thread: no order to fix.
 * Limits: any shape whose element count fits size_t; hs even.
 */
#include "kernels/cuda/kcuda.cuh"
#include "kernels/math/rope.h"

template <typename T, int V>
static __global__ void rope_kernel(T *qkv, const float *rope, int T_, int NH, int NKV, int hs,
                                   float sign, size_t groups)
{
    int half = hs / 2, heads = NH + NKV, per_head = half / V;
    size_t row = (size_t)(NH + 2 * NKV) * hs;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < groups;
         e += (size_t)gridDim.x * blockDim.x) {
        int i = (int)(e % per_head) * V;
        size_t hh = e / per_head;
        int h = (int)(hh % heads);
        size_t bt = hh / heads;
        int t = (int)(bt % T_);
        T *x0 = qkv + bt * row + (size_t)h * hs + i, *x1 = x0 + half;
        const float *cs = rope + ((size_t)t * half + i) * 2;
        float a[V], b[V];
        ddp__ldv<V>(a, x0);
        ddp__ldv<V>(b, x1);
#pragma unroll
        for (int k = 0; k < V; k++) {
            float c = cs[2 * k], s = sign * cs[2 * k + 1];
            ddp_rope_rotate(a[k], b[k], c, s, &a[k], &b[k]);
        }
        ddp__stv<V>(x0, a);
        ddp__stv<V>(x1, b);
    }
}

static void rope(ddp_kctx_t *ctx, ddp_act_t *qkv, const float *table, int B, int T, int NH,
                 int NKV, int hs, float sign, const char *what)
{
    if (B <= 0 || T <= 0 || NH <= 0 || NKV < 0 || hs < 2 || ddp__cuda_enter(ctx)) return;
    size_t pairs = (size_t)B * T * (size_t)(NH + NKV) * (size_t)(hs / 2);
    DDP_ACT_DISPATCH(ctx->prec, T_, {
        constexpr int V = (int)(16 / sizeof(T_));
        if ((hs / 2) % V == 0 && ddp__aligned(qkv, 16))
            rope_kernel<T_, V><<<ddp__grid(pairs / V, DDP_CUDA_BLOCK), DDP_CUDA_BLOCK, 0,
                                 ctx->stream>>>((T_ *)qkv, table, T, NH, NKV, hs, sign,
                                                pairs / V);
        else
            rope_kernel<T_, 1><<<ddp__grid(pairs, DDP_CUDA_BLOCK), DDP_CUDA_BLOCK, 0,
                                 ctx->stream>>>((T_ *)qkv, table, T, NH, NKV, hs, sign, pairs);
    });
    ddp__cuda_launched(ctx, what);
}

void ddp__cuda_rope_fwd(ddp_kctx_t *ctx, ddp_act_t *qkv, const float *table, int B, int T,
                        int NH, int NKV, int hs)
{
    rope(ctx, qkv, table, B, T, NH, NKV, hs, 1.0f, "rope_fwd");
}

void ddp__cuda_rope_bwd(ddp_kctx_t *ctx, ddp_act_t *dqkv, const float *table, int B, int T,
                        int NH, int NKV, int hs)
{
    rope(ctx, dqkv, table, B, T, NH, NKV, hs, -1.0f, "rope_bwd");
}
