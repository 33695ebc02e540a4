/* Token + position embedding, forward and backward.
 *
 * forward   out[B,T,C] = wte[inp[b,t], :] + wpe[t, :]        grid-stride over B*T*C
 *           (wpe NULL: no positions, wte's row alone)
 * backward  dwpe[T,C] += sum_b dout[b,t,:]                   one thread per (t, c), b in order
 *           dwte[V,C] += sum over positions with that token  deterministic, no atomics:
 *             1. the B*T (token, position) pairs are sorted by token with CUB's stable radix
 *                sort, so each token's positions form one run in position order;
 *             2. the sorted list is cut into pieces at every run head and every multiple of
 *                DWTE_PIECE: one block per piece head sums the piece's dout rows in order
 *                (128 threads striding over C) into partial[head];
 *             3. one block per run head adds its run's pieces' partials in order to dwte.
 *           A run as long as the batch (a batch of padding tokens) is summed by B*T/DWTE_PIECE
 *           blocks, not one block walking all of it; the order is fixed by the shapes.
 *           Scratch: 3 * B*T int32 + B*T*C floats + CUB's temporary storage.
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
        float v = wte[(size_t)inp[bt] * C + c];
        out[i] = wpe ? v + wpe[(size_t)t * C + c] : v;
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

/* rows of the sorted list one block sums at most (step 2) */
#define DWTE_PIECE 64

static __device__ __forceinline__ int piece_head(const int32_t *tok, int i)
{
    return i == 0 || tok[i - 1] != tok[i] || i % DWTE_PIECE == 0;
}

/* Step 2: block i, when i heads a piece, sums its rows into partial[i, :]. */
static __global__ void dwte_pieces_kernel(float *partial, const float *dout, const int32_t *tok,
                                          const int32_t *pos, int BT, int C)
{
    int i = blockIdx.x;
    if (!piece_head(tok, i)) return;
    int t = tok[i], end = i + 1;
    while (end < BT && tok[end] == t && end % DWTE_PIECE != 0) end++;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = 0.0f;
        for (int j = i; j < end; j++) s += dout[(size_t)pos[j] * C + c];
        partial[(size_t)i * C + c] = s;
    }
}

/* Step 3: block i, when i heads a run, adds the run's pieces in order to dwte[tok[i], :]. */
static __global__ void dwte_runs_kernel(float *dwte, const float *partial, const int32_t *tok,
                                        int BT, int C)
{
    int i = blockIdx.x;
    int t = tok[i];
    if (i > 0 && tok[i - 1] == t) return; /* not the head of its run */
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float s = 0.0f;
        /* the pieces: the run head, then each multiple of DWTE_PIECE inside the run */
        for (int j = i; j < BT && tok[j] == t; j = (j / DWTE_PIECE + 1) * DWTE_PIECE)
            s += partial[(size_t)j * C + c];
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
    size_t floats = ((size_t)BT * C * sizeof(float) + 255) / 256 * 256;
    void *scratch;
    if (ddp__cuda_scratch(ctx, 3 * ints + floats + sort_bytes, &scratch)) return;
    char *base = (char *)scratch;
    int32_t *tok = (int32_t *)base;
    int32_t *pos_in = (int32_t *)(base + ints);
    int32_t *pos = (int32_t *)(base + 2 * ints);
    float *partial = (float *)(base + 3 * ints);
    void *temp = base + 3 * ints + floats;

    iota_kernel<<<ddp__grid((size_t)BT, DDP_CUDA_BLOCK), DDP_CUDA_BLOCK, 0, ctx->stream>>>(
        pos_in, BT);
    if (ddp__cuda_launched(ctx, "encoder_bwd(iota)")) return;
    if (ddp__cuda_check(ctx,
                        cub::DeviceRadixSort::SortPairs(temp, sort_bytes, inp, tok, pos_in, pos,
                                                        BT, 0, 32, ctx->stream),
                        "encoder_bwd(sort)"))
        return;
    dwte_pieces_kernel<<<(unsigned)BT, 128, 0, ctx->stream>>>(partial, dout, tok, pos, BT, C);
    if (ddp__cuda_launched(ctx, "encoder_bwd(dwte pieces)")) return;
    dwte_runs_kernel<<<(unsigned)BT, 128, 0, ctx->stream>>>(dwte, partial, tok, BT, C);
    ddp__cuda_launched(ctx, "encoder_bwd(dwte runs)");
}
