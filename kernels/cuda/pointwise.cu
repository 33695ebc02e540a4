/* Elementwise ops: GELU (kernels/math/gelu.h), SwiGLU (kernels/math/swiglu.h), residual add,
 * to_act, y += x, x *= s, and AdamW (kernels/math/adamw.h).
 *
 * gelu_fwd   out[n] = gelu(inp[n])                      act -> act
 * gelu_bwd   dinp[n] = gelu'(inp[n]) * dout[n]          act (overwritten; may alias dout)
 * swiglu_fwd out[r,j] = silu(inp[r,j]) inp[r,H+j]       act [N,2H] -> act [N,H]
 * swiglu_bwd dinp[r,j], dinp[r,H+j] from dout[r,j]      act (overwritten), over the N H outputs
 * residual   out[n] = a[n] + b[n]                       fp32 + act -> fp32 (out may alias a)
 * to_act     out[n] = inp[n] rounded to the act type    fp32 -> act
 * act_to_f32 out[n] = inp[n] widened (exactly)          act -> fp32 (attention's general path)
 * add        y[n] += x[n]                               fp32
 * scale      x[n] *= s                                  fp32
 * adamw      param, m, v updated in place from grad * grad_scale (and the weights' 16-bit
 *            copy, when param is set_weights' arena); the bias corrections 1 - beta^t are
 *            computed once on the host, in double.
 * The activation ops are templates on the act type (ctx->prec), compute in fp32 and round once
 * on store. When every pointer is aligned to 16 bytes' worth of activations (8 16-bit or 4 fp32
 * elements), a thread moves that many at a time (16-byte accesses of activations; the fp32
 * side of a 16-bit op moves 32 bytes), the last n % V elements one by one; otherwise element by
 * element (SwiGLU's groups also need H % V == 0, so that a group stays in one row). All are
 * grid-stride loops over a size_t n with 256-thread blocks and at most
 * DDP_CUDA_MAX_GRID blocks; n == 0 queues nothing.
 */
#include "kernels/cuda/kcuda.cuh"
#include "kernels/math/adamw.h"
#include "kernels/math/gelu.h"
#include "kernels/math/swiglu.h"

#define GRID_STRIDE(i, n)                                                                     \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n);                   \
         i += (size_t)gridDim.x * blockDim.x)

#define LAUNCH(kernel, n, what, ...)                                                          \
    do {                                                                                      \
        if ((n) == 0 || ddp__cuda_enter(ctx)) return;                                         \
        kernel<<<ddp__grid((n), DDP_CUDA_BLOCK), DDP_CUDA_BLOCK, 0, ctx->stream>>>(          \
            __VA_ARGS__);                                                                     \
        ddp__cuda_launched(ctx, what);                                                        \
    } while (0)

/* f.template run<V>(i) handles elements i .. i+V-1: groups of V over [0, n - n % V), then the
 * tail one by one (V == 1: all of it). */
template <int V, typename F> static __global__ void ew_kernel(size_t n, F f)
{
    size_t body = n - n % V;
    for (size_t g = blockIdx.x * (size_t)blockDim.x + threadIdx.x; g < body / V;
         g += (size_t)gridDim.x * blockDim.x)
        f.template run<V>(g * V);
    if (V > 1) GRID_STRIDE(i, n - body) f.template run<1>(body + i);
}

/* Queues f over n elements, V at a time when `aligned` (all of f's pointers fit V-element
 * accesses), else one at a time. */
template <int V, typename F>
static void ew_launch(ddp_kctx_t *ctx, size_t n, int aligned, F f, const char *what)
{
    if (n == 0 || ddp__cuda_enter(ctx)) return;
    if (aligned)
        ew_kernel<V><<<ddp__grid(n / V + 1, DDP_CUDA_BLOCK), DDP_CUDA_BLOCK, 0, ctx->stream>>>(
            n, f);
    else
        ew_kernel<1><<<ddp__grid(n, DDP_CUDA_BLOCK), DDP_CUDA_BLOCK, 0, ctx->stream>>>(n, f);
    ddp__cuda_launched(ctx, what);
}

/* Elements of T in 16 bytes: the vector width of T's ops. */
template <typename T> static constexpr int vec_of() { return (int)(16 / sizeof(T)); }

template <typename T> struct gelu_fwd_f {
    T *out;
    const T *inp;
    template <int V> __device__ __forceinline__ void run(size_t i) const
    {
        float x[V];
        ddp__ldv<V>(x, inp + i);
#pragma unroll
        for (int k = 0; k < V; k++) x[k] = ddp_gelu(x[k]);
        ddp__stv<V>(out + i, x);
    }
};

void ddp__cuda_gelu_fwd(ddp_kctx_t *ctx, ddp_act_t *out, const ddp_act_t *inp, size_t n)
{
    DDP_ACT_DISPATCH(ctx->prec, T, {
        constexpr int V = vec_of<T>();
        gelu_fwd_f<T> f = {(T *)out, (const T *)inp};
        ew_launch<V>(ctx, n, ddp__aligned(out, 16) && ddp__aligned(inp, 16), f, "gelu_fwd");
    });
}

/* dinp may alias dout: each element is read before it is written, by the same thread. */
template <typename T> struct gelu_bwd_f {
    T *dinp;
    const T *inp, *dout;
    template <int V> __device__ __forceinline__ void run(size_t i) const
    {
        float x[V], d[V];
        ddp__ldv<V>(x, inp + i);
        ddp__ldv<V>(d, dout + i);
#pragma unroll
        for (int k = 0; k < V; k++) d[k] = ddp_gelu_grad(x[k]) * d[k];
        ddp__stv<V>(dinp + i, d);
    }
};

void ddp__cuda_gelu_bwd(ddp_kctx_t *ctx, ddp_act_t *dinp, const ddp_act_t *inp,
                        const ddp_act_t *dout, size_t n)
{
    DDP_ACT_DISPATCH(ctx->prec, T, {
        constexpr int V = vec_of<T>();
        gelu_bwd_f<T> f = {(T *)dinp, (const T *)inp, (const T *)dout};
        int al = ddp__aligned(dinp, 16) && ddp__aligned(inp, 16) && ddp__aligned(dout, 16);
        ew_launch<V>(ctx, n, al, f, "gelu_bwd");
    });
}

/* Output element i = (row r, column j) of swiglu: gate at r 2H + j, up H further. */
template <typename T> struct swiglu_fwd_f {
    T *out;
    const T *inp;
    size_t H;
    template <int V> __device__ __forceinline__ void run(size_t i) const
    {
        const T *g = inp + (i / H) * 2 * H + i % H;
        float x[V], u[V];
        ddp__ldv<V>(x, g);
        ddp__ldv<V>(u, g + H);
#pragma unroll
        for (int k = 0; k < V; k++) x[k] = ddp_swiglu(x[k], u[k]);
        ddp__stv<V>(out + i, x);
    }
};

void ddp__cuda_swiglu_fwd(ddp_kctx_t *ctx, ddp_act_t *out, const ddp_act_t *inp, int N, int H)
{
    if (N <= 0 || H <= 0) return;
    DDP_ACT_DISPATCH(ctx->prec, T, {
        constexpr int V = vec_of<T>();
        swiglu_fwd_f<T> f = {(T *)out, (const T *)inp, (size_t)H};
        int al = H % V == 0 && ddp__aligned(out, 16) && ddp__aligned(inp, 16);
        ew_launch<V>(ctx, (size_t)N * H, al, f, "swiglu_fwd");
    });
}

/* dinp may not alias inp (kernels.h): a thread reads its inp elements and writes dinp's. */
template <typename T> struct swiglu_bwd_f {
    T *dinp;
    const T *inp, *dout;
    size_t H;
    template <int V> __device__ __forceinline__ void run(size_t i) const
    {
        size_t at = (i / H) * 2 * H + i % H;
        float g[V], u[V], d[V];
        ddp__ldv<V>(g, inp + at);
        ddp__ldv<V>(u, inp + at + H);
        ddp__ldv<V>(d, dout + i);
#pragma unroll
        for (int k = 0; k < V; k++) ddp_swiglu_grad(g[k], u[k], d[k], &g[k], &u[k]);
        ddp__stv<V>(dinp + at, g);
        ddp__stv<V>(dinp + at + H, u);
    }
};

void ddp__cuda_swiglu_bwd(ddp_kctx_t *ctx, ddp_act_t *dinp, const ddp_act_t *inp,
                          const ddp_act_t *dout, int N, int H)
{
    if (N <= 0 || H <= 0) return;
    DDP_ACT_DISPATCH(ctx->prec, T, {
        constexpr int V = vec_of<T>();
        swiglu_bwd_f<T> f = {(T *)dinp, (const T *)inp, (const T *)dout, (size_t)H};
        int al = H % V == 0 && ddp__aligned(dinp, 16) && ddp__aligned(inp, 16) &&
                 ddp__aligned(dout, 16);
        ew_launch<V>(ctx, (size_t)N * H, al, f, "swiglu_bwd");
    });
}

template <typename T> struct residual_f {
    float *out;
    const float *a;
    const T *b;
    template <int V> __device__ __forceinline__ void run(size_t i) const
    {
        float x[V], y[V];
        ddp__ldv<V>(x, a + i);
        ddp__ldv<V>(y, b + i);
#pragma unroll
        for (int k = 0; k < V; k++) x[k] += y[k];
        ddp__stv<V>(out + i, x);
    }
};

void ddp__cuda_residual_fwd(ddp_kctx_t *ctx, float *out, const float *a, const ddp_act_t *b,
                            size_t n)
{
    DDP_ACT_DISPATCH(ctx->prec, T, {
        constexpr int V = vec_of<T>();
        residual_f<T> f = {out, a, (const T *)b};
        size_t fb = V * sizeof(float); /* bytes of V fp32 elements */
        int al = ddp__aligned(out, fb) && ddp__aligned(a, fb) && ddp__aligned(b, 16);
        ew_launch<V>(ctx, n, al, f, "residual_fwd");
    });
}

/* out[i] = inp[i] converted between fp32 and the act type: rounded once, or widened exactly. */
template <typename O, typename I> struct convert_f {
    O *out;
    const I *inp;
    template <int V> __device__ __forceinline__ void run(size_t i) const
    {
        float x[V];
        ddp__ldv<V>(x, inp + i);
        ddp__stv<V>(out + i, x);
    }
};

void ddp__cuda_to_act(ddp_kctx_t *ctx, ddp_act_t *out, const float *inp, size_t n)
{
    DDP_ACT_DISPATCH(ctx->prec, T, {
        constexpr int V = vec_of<T>();
        convert_f<T, float> f = {(T *)out, inp};
        int al = ddp__aligned(out, 16) && ddp__aligned(inp, V * sizeof(float));
        ew_launch<V>(ctx, n, al, f, "to_act");
    });
}

void ddp__cuda_act_to_f32(ddp_kctx_t *ctx, float *out, const ddp_act_t *inp, size_t n)
{
    DDP_ACT_DISPATCH(ctx->prec, T, {
        constexpr int V = vec_of<T>();
        convert_f<float, T> f = {out, (const T *)inp};
        int al = ddp__aligned(inp, 16) && ddp__aligned(out, V * sizeof(float));
        ew_launch<V>(ctx, n, al, f, "act_to_f32");
    });
}

static __global__ void add_kernel(float *y, const float *x, size_t n)
{
    GRID_STRIDE(i, n) y[i] += x[i];
}

void ddp__cuda_add(ddp_kctx_t *ctx, float *y, const float *x, size_t n)
{
    LAUNCH(add_kernel, n, "add", y, x, n);
}

static __global__ void scale_kernel(float *x, float s, size_t n)
{
    GRID_STRIDE(i, n) x[i] *= s;
}

void ddp__cuda_scale(ddp_kctx_t *ctx, float *x, float s, size_t n)
{
    LAUNCH(scale_kernel, n, "scale", x, s, n);
}

/* AdamW in one launch over every range: the ranges are cut on the host into tiles of at most
 * ADAMW_TILE elements, one thread block each (a small tensor is one tile; the largest, many).
 * A tile moves 4 elements an access (16-byte loads of fp32) from its first multiple of 4 when
 * every array allows it, the elements before and after one by one. With the weights' 16-bit
 * copy (set_weights' arena, lowp.cu) each new weight is also rounded into it: autocast's weight
 * cast without another pass over the fp32 weights. */
#define ADAMW_TILE 65536

struct adamw_tile {
    size_t lo, hi;
    float wd;
};

struct adamw_args {
    float *param, *m, *v;
    const float *grad;
    void *copy; /* NULL, or the arena's 16-bit copy, of type W */
    float lr, beta1, beta2, eps, grad_scale, bc1, bc2;
};

/* Elements i .. i+V-1 of a tile with weight decay wd. */
template <int V, typename W>
static __device__ __forceinline__ void adamw_elems(const adamw_args &a, size_t i, float wd)
{
    float p[V], g[V], mm[V], vv[V];
    ddp__ldv<V>(p, a.param + i);
    ddp__ldv<V>(g, a.grad + i);
    ddp__ldv<V>(mm, a.m + i);
    ddp__ldv<V>(vv, a.v + i);
#pragma unroll
    for (int k = 0; k < V; k++)
        ddp_adamw_elem(&p[k], &mm[k], &vv[k], g[k] * a.grad_scale, a.lr, a.beta1, a.beta2, a.eps,
                       wd, a.bc1, a.bc2);
    ddp__stv<V>(a.param + i, p);
    ddp__stv<V>(a.m + i, mm);
    ddp__stv<V>(a.v + i, vv);
    if (a.copy) ddp__stv<V>((W *)a.copy + i, p);
}

/* W: the copy's type (float when there is none); vec: 4 elements an access. */
template <typename W>
static __global__ void adamw_kernel(adamw_args a, const adamw_tile *tiles, int vec)
{
    adamw_tile tl = tiles[blockIdx.x];
    size_t body = vec ? (tl.lo + 3) / 4 * 4 : tl.hi, end = tl.hi;
    if (body > end) body = end;
    size_t body_end = vec ? body + (end - body) / 4 * 4 : body;
    for (size_t i = tl.lo + threadIdx.x; i < body; i += blockDim.x) adamw_elems<1, W>(a, i, tl.wd);
    for (size_t i = body + 4 * (size_t)threadIdx.x; i < body_end; i += 4 * (size_t)blockDim.x)
        adamw_elems<4, W>(a, i, tl.wd);
    for (size_t i = body_end + threadIdx.x; i < end; i += blockDim.x)
        adamw_elems<1, W>(a, i, tl.wd);
}

void ddp__cuda_adamw(ddp_kctx_t *ctx, float *param, const float *grad, float *m, float *v,
                     const ddp_kadamw_range_t *ranges, int nranges, float lr, float beta1,
                     float beta2, float eps, float grad_scale, int t, uint32_t *crc)
{
    if (crc) { /* host-side checksums of device memory are not offered (kernels.h) */
        DDP_ERROR("cuda: adamw: CRC32C of the outputs is a CPU-backend feature");
        if (!ctx->err) ctx->err = DDP_ENOTSUP;
        return;
    }
    size_t ntiles = 0;
    for (int r = 0; r < nranges; r++)
        ntiles += (ranges[r].hi - ranges[r].lo + ADAMW_TILE - 1) / ADAMW_TILE;
    if (ntiles == 0 || ddp__cuda_enter(ctx)) return;
    adamw_tile *tiles = (adamw_tile *)malloc(ntiles * sizeof *tiles);
    if (!tiles) {
        if (!ctx->err) ctx->err = DDP_ENOMEM;
        return;
    }
    size_t k = 0;
    for (int r = 0; r < nranges; r++)
        for (size_t lo = ranges[r].lo; lo < ranges[r].hi; lo += ADAMW_TILE)
            tiles[k++] = {lo, lo + ADAMW_TILE < ranges[r].hi ? lo + ADAMW_TILE : ranges[r].hi,
                          ranges[r].wd};
    /* In double, as PyTorch (and the CPU backend) compute them. */
    adamw_args a = {param, m, v, grad, ddp__cuda_lowp_kept(ctx, param), lr, beta1, beta2, eps,
                    grad_scale, (float)(1.0 - pow((double)beta1, (double)t)),
                    (float)(1.0 - pow((double)beta2, (double)t))};
    int vec = ddp__aligned(param, 16) && ddp__aligned(grad, 16) && ddp__aligned(m, 16) &&
              ddp__aligned(v, 16) && ddp__aligned(a.copy, 8);
    void *dev;
    /* the table goes through the scratch; cudaMemcpyAsync from pageable memory has read it
     * when it returns, so it is freed at once */
    if (ddp__cuda_scratch(ctx, ntiles * sizeof *tiles, &dev) == 0 &&
        ddp__cuda_check(ctx, cudaMemcpyAsync(dev, tiles, ntiles * sizeof *tiles,
                                             cudaMemcpyHostToDevice, ctx->stream),
                        "adamw(tiles)") == 0) {
        const adamw_tile *dt = (const adamw_tile *)dev;
        if (!a.copy)
            adamw_kernel<float><<<(unsigned)ntiles, DDP_CUDA_BLOCK, 0, ctx->stream>>>(a, dt, vec);
        else
            DDP_ACT_DISPATCH(ctx->prec, W, {
                adamw_kernel<W><<<(unsigned)ntiles, DDP_CUDA_BLOCK, 0, ctx->stream>>>(a, dt, vec);
            });
        ddp__cuda_launched(ctx, "adamw");
    }
    free(tiles);
}
