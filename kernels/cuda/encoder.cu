/* Token + position embedding, forward and backward.
 *
 * forward   out[B,T,C] = wte[inp[b,t], :] + wpe[t, :]        grid-stride over B*T*C
 * backward  dwpe[T,C] += sum_b dout[b,t,:]                   one thread per (t, c), b in order
 *           dwte[V,C] += sum over positions with that token  deterministic, no atomics:
 *             1. the B*T (token, position) pairs are sorted by token with CUB's stable radix
 *                sort, so each token's positions form one run in position order;
 *             2. one block per run head (blocks of other positions exit at once) sums the run's
 *                dout rows in order, 128 threads striding over C, and adds the sum to dwte.
 *           Scratch: 3 * B*T int32 + CUB's temporary storage.
 * Limits: B*T < 2^31 (one block per position in step 2); token ids in [0, V).
 */
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/kcuda.cuh"

static __global__ void encoder_fwd_kernel(float *out, const int32_t *inp, const float *wte,
                                          const float *wpe, int T, int C, size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t bt = i / (size_t)C;
        int c = (int)(i % (size_t)C);
        int t = (int)(bt % (size_t)T);
        out[i] = wte[(size_t)inp[bt] * C + c] + wpe[(size_t)t * C + c];
    }
}

void ddp__cuda_encoder_fwd(ddp_kctx_t *ctx, float *out, const int32_t *inp, const float *wte,
                           const float *wpe, int B, int T, int C)
{
    size_t total = (size_t)B * T * C;
    if (total == 0 || ddp__cuda_enter(ctx)) return;
    encoder_fwd_kernel<<<ddp__grid(total, DDP_CUDA_BLOCK), DDP_CUDA_BLOCK, 0, ctx->stream>>>(
        out, inp, wte, wpe, T, C, total);
    ddp__cuda_launched(ctx, "encoder_fwd");
}

static __global__ void encoder_dwpe_kernel(float *dwpe, const float *dout, int B, int T, int C)
{
    size_t total = (size_t)T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        for (int b = 0; b < B; b++) s += dout[(size_t)b * total + i];
        dwpe[i] += s;
    }
}

static __global__ void iota_kernel(int32_t *x, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] = i;
}

static __global__ void encoder_dwte_kernel(float *dwte, const float *dout, const int32_t *tok,
                                           const int32_t *pos, int BT, int C)
{
    int i = blockIdx.x;
    int t = tok[i];
    if (i > 0 && tok[i - 1] == t) return; /* not the head of its run */
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = 0.0f;
        for (int j = i; j < BT && tok[j] == t; j++) s += dout[(size_t)pos[j] * C + c];
        dwte[(size_t)t * C + c] += s;
    }
}

void ddp__cuda_encoder_bwd(ddp_kctx_t *ctx, float *dwte, float *dwpe, const float *dout,
                           const int32_t *inp, int B, int T, int C)
{
    int BT = B * T;
    if (BT <= 0 || C <= 0 || ddp__cuda_enter(ctx)) return;
    size_t tc = (size_t)T * C;
    if (dwpe) {
        encoder_dwpe_kernel<<<ddp__grid(tc, DDP_CUDA_BLOCK), DDP_CUDA_BLOCK, 0, ctx->stream>>>(
            dwpe, dout, B, T, C);
        if (ddp__cuda_launched(ctx, "encoder_bwd(dwpe)")) return;
    }
    if (!dwte) return;

    size_t sort_bytes = 0;
    if (ddp__cuda_check(ctx,
                        cub::DeviceRadixSort::SortPairs(NULL, sort_bytes, (const int32_t *)NULL,
                                                        (int32_t *)NULL, (const int32_t *)NULL,
                                                        (int32_t *)NULL, BT, 0, 32, ctx->stream),
                        "encoder_bwd(sort size)"))
        return;
    size_t ints = ((size_t)BT * sizeof(int32_t) + 255) / 256 * 256; /* keep 256-byte alignment */
    void *scratch;
    if (ddp__cuda_scratch(ctx, 3 * ints + sort_bytes, &scratch)) return;
    char *base = (char *)scratch;
    int32_t *tok = (int32_t *)base;
    int32_t *pos_in = (int32_t *)(base + ints);
    int32_t *pos = (int32_t *)(base + 2 * ints);
    void *temp = base + 3 * ints;

    iota_kernel<<<ddp__grid((size_t)BT, DDP_CUDA_BLOCK), DDP_CUDA_BLOCK, 0, ctx->stream>>>(
        pos_in, BT);
    if (ddp__cuda_launched(ctx, "encoder_bwd(iota)")) return;
    if (ddp__cuda_check(ctx,
                        cub::DeviceRadixSort::SortPairs(temp, sort_bytes, inp, tok, pos_in, pos,
                                                        BT, 0, 32, ctx->stream),
                        "encoder_bwd(sort)"))
        return;
    encoder_dwte_kernel<<<(unsigned)BT, 128, 0, ctx->stream>>>(dwte, dout, tok, pos, BT, C);
    ddp__cuda_launched(ctx, "encoder_bwd(dwte)");
}
