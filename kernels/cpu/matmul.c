/* Matmul forward and backward on OpenBLAS sgemm, parallelised by hand on the context's pool.
 *
 * Forward:  out[N,OC] = inp[N,C] @ W (+ bias), W as [C,OC] (DDP_W_IN_OUT) or [OC,C] (OUT_IN).
 * Backward: dinp[N,C] = dout @ W^T (overwritten);  dweight += inp^T @ dout in W's layout;
 *           dbias[OC] += colsum(dout).
 * out's and dout's rows are ldo >= OC elements apart (the LM head's padded logits).
 * OpenBLAS runs single-threaded (cpu_init sets it); each product is cut into tiles of its OUTPUT
 * and each tile is one sgemm task, so BLAS shares the one pool with the element ops and nothing
 * spins. Apart from the split-K case below, the reduction dimension K is not split: every output
 * element is one sgemm dot product, and the tiling depends on the shapes only, so results are
 * bitwise identical for any thread count. For the tied LM head (OC = V large) the forward and
 * dweight tiles cut V.
 * One backward call runs its dinp, dweight and dbias tasks as one batch for load balance.
 * Split K, the one exception: the LM head's dinp [N,C] = dout [N,V] @ wte [V,C] is small and its
 * reduction V long, so output tiles would re-read dout and wte many times; instead it is cut
 * into K chunks of MM_KCHUNK whose products go to scratch and are then added in chunk order
 * (a fixed order, so still thread-independent). Used only while the partials fit in
 * MM_KSPLIT_BYTES; otherwise output tiles as above (also when scratch cannot be allocated: the
 * result is then correct but rounded differently, the one case that depends on more than shape).
 * Mixed precision (ctx->prec bf16/fp16, lowp.c): inp, dout, out and dinp are 16-bit activation
 * tensors. The same tiles run natively on bf16 (bf16_gemm.c, oneDNN, one tile per task as with
 * sgemm) where the CPU has bf16 instructions, the activations' bits being the operands as they
 * are, else by sgemm on the activations widened into lowp.c's input slots; the weights are
 * lowp.c's converted copies, and so is the bias: rounded to the 16-bit type, as PyTorch's
 * autocast rounds every input of a linear layer and as the GPU's cuBLASLt epilogue takes it. An
 * out or dinp tile is computed in fp32 into its thread's scratch (the bias added there), then
 * rounded once on store -- the same sgemm calls as in fp32 mode,
 * so an emulated tile is bitwise the fp32 op's on the same values, rounded. Split-K partials
 * are summed in fp32 and rounded once. dweight and dbias accumulate in fp32 (dbias from the
 * widened dout). Scratch: a tile (at most R x MM_WIDE floats, R the rows) per thread. For fp32
 * OpenBLAS was kept over oneDNN by measurement (lowp.c says why).
 * GELU (matmul_gelu_fwd, matmul_dgelu_bwd): the forward's tile, after its rounding into pre, is
 * taken through gelu from the same fp32 values and rounded into out; the backward's dinp tile
 * is multiplied by gelu'(pre) before its one rounding (split K: as its partials are added). In
 * fp32 mode both are exactly matmul then gelu_fwd / gelu_bwd.
 */
#include "kernels/cpu/cpu.h"

#include <cblas.h>
#include <string.h>

#include "kernels/math/gelu.h"
#include "kernels/math/lowp.h"

#define MM_WIDE 512    /* preferred tile width */
#define MM_MIN_COLS 128
#define MM_MIN_ROWS 64
#define MM_TILES 8     /* aim for at least this many tiles (balance over 2..4 threads) */
#define MM_BIAS_COLS 256
#define MM_KSPLIT_MIN 8192             /* split K of dinp from this K (= OC) on */
#define MM_KCHUNK 4096
#define MM_KSPLIT_BYTES (32u << 20)    /* most scratch for the partials */
#define MM_REDUCE_ROWS 16
#define MM_GELU_COLS 256               /* elements of a row widened at a time */

typedef struct {
    int R, Cc;   /* output dims */
    int rb, cb;  /* tile dims */
    int nr, nc;  /* tile counts */
} tiling_t;

static int cdiv(int a, int b) { return (a + b - 1) / b; }
static int round16(int a) { return (a + 15) / 16 * 16; }

/* Splits `extent` into at least MM_TILES blocks of at most MM_WIDE, none under `min_block`. */
static int split_primary(int extent, int min_block)
{
    int n = cdiv(extent, MM_WIDE);
    if (n < MM_TILES) {
        int most = extent / min_block;
        n = most < MM_TILES ? most : MM_TILES;
    }
    return n < 1 ? 1 : n;
}

/* The other dimension: enough blocks to reach MM_TILES tiles, none under `min_block`. */
static int split_secondary(int extent, int primary, int min_block)
{
    if (primary >= MM_TILES) return 1;
    int n = cdiv(MM_TILES, primary), most = extent / min_block;
    if (n > most) n = most;
    return n < 1 ? 1 : n;
}

/* Tiles an R x Cc output by its shape alone. The longer dimension is cut first, so a tile keeps
 * the whole of a short dimension (the LM head's [V, C] weight gradient is cut along V only). */
static void plan(tiling_t *tl, int R, int Cc)
{
    int nr, nc;
    if (Cc >= R) {
        nc = split_primary(Cc, MM_MIN_COLS);
        nr = split_secondary(R, nc, MM_MIN_ROWS);
    } else {
        nr = split_primary(R, MM_MIN_ROWS * 2);
        nc = split_secondary(Cc, nr, MM_MIN_COLS / 2);
    }
    tl->R = R;
    tl->Cc = Cc;
    tl->cb = round16(cdiv(Cc, nc));
    tl->rb = round16(cdiv(R, nr));
    tl->nc = cdiv(Cc, tl->cb);
    tl->nr = cdiv(R, tl->rb);
}

static long ntiles(const tiling_t *tl) { return (long)tl->nr * tl->nc; }

size_t ddp_kernels_cpu_tile_floats(int R, int Cc)
{
    if (R < 1 || Cc < 1) return 0;
    tiling_t tl;
    plan(&tl, R, Cc);
    return (size_t)tl.rb * tl.cb;
}

/* Tile `i`'s origin and size. */
static void tile_at(const tiling_t *tl, long i, int *r0, int *c0, int *h, int *w)
{
    *r0 = (int)(i / tl->nc) * tl->rb;
    *c0 = (int)(i % tl->nc) * tl->cb;
    *h = tl->R - *r0 < tl->rb ? tl->R - *r0 : tl->rb;
    *w = tl->Cc - *c0 < tl->cb ? tl->Cc - *c0 : tl->cb;
}

typedef struct {
    ddp_act_t *out, *dinp;
    float *dweight, *dbias;
    const void *inp, *weight, *dout; /* the operands: floats, or bf16 bits when bf16 != NULL */
    const float *bias;
    ddp_act_t *gelu;           /* matmul_gelu_fwd: gelu of the product, whose rounding is out */
    const ddp_act_t *gelu_pre; /* matmul_dgelu_bwd: dinp is taken on through gelu at pre */
    const ddp_act_t *dout_act; /* dbias's dout, as the caller gave it */
    ddp__bf16_t *bf16;         /* native bf16 tiles; NULL: sgemm */
    ddp_kprec_t prec;
    int N, C, OC, ldo; /* ldo: out's and dout's row stride */
    ddp_wlayout_t layout;
    tiling_t fwd, di, dw;
    long n_di, n_dw, n_db; /* backward task counts per kind, in that order */
    int ksplit;            /* > 0: dinp by split K into `part`, ksplit chunks */
    float *part;           /* [ksplit][N][C] */
    ddp__tscratch_t tile;  /* 16-bit: an out or dinp tile per thread, before its rounding */
} mm_args_t;

/* Where tile (r0, c0, h x w) of an [R, ld] activation output is computed in fp32: in place in
 * fp32 mode, else the thread's tile scratch (leading dimension w); *ldc gets the leading
 * dimension. */
static float *tile_out(const mm_args_t *a, ddp_act_t *x, int r0, int c0, int w, int ld, int *ldc)
{
    if (a->prec == DDP_KPREC_FP32) {
        *ldc = ld;
        return (float *)x + (size_t)r0 * ld + c0;
    }
    *ldc = w;
    return ddp__tscratch_mine(&a->tile);
}

/* Rounds a tile from tile_out's scratch into x (nothing to do in fp32 mode). */
static void tile_store(const mm_args_t *a, ddp_act_t *x, int r0, int c0, int h, int w, int ld,
                       const float *t)
{
    if (a->prec == DDP_KPREC_FP32) return;
    for (int r = 0; r < h; r++)
        ddp__cpu_act_store(x, (size_t)(r0 + r) * ld + c0, t + (size_t)r * w, (size_t)w, a->prec);
}

/* matmul_gelu_fwd: a->gelu's tile (r0, c0, h x w), rows a->OC apart, = gelu(t), t the tile's
 * fp32 values (leading dimension ldt) after out's rounding has been stored; 16-bit: t is the
 * thread's scratch and is overwritten. */
DDP_VECTOR_FN(gelu_tile, (const mm_args_t *a, int r0, int c0, int h, int w, float *t, int ldt),
              (a, r0, c0, h, w, t, ldt))
{
    for (int r = 0; r < h; r++) {
        size_t at = (size_t)(r0 + r) * a->OC + c0;
        float *src = t + (size_t)r * ldt; /* 16-bit: dst is src, computed in place */
        float *dst = ddp__cpu_act_out(a->gelu, at, a->prec, src);
        for (int j = 0; j < w; j++) dst[j] = ddp_gelu(src[j]);
        ddp__cpu_act_store(a->gelu, at, dst, (size_t)w, a->prec);
    }
}

/* matmul_dgelu_bwd: t[0..n) *= gelu'(pre[i0 .. i0 + n)), before t's rounding into dinp. */
DDP_VECTOR_FN(dgelu_mul, (const mm_args_t *a, float *t, size_t i0, size_t n), (a, t, i0, n))
{
    float wide[MM_GELU_COLS];
    for (size_t j0 = 0; j0 < n; j0 += MM_GELU_COLS) {
        size_t m = n - j0 < MM_GELU_COLS ? n - j0 : MM_GELU_COLS;
        const float *restrict x = ddp__cpu_act_in(a->gelu_pre, i0 + j0, m, a->prec, wide);
        for (size_t j = 0; j < m; j++) t[j0 + j] *= ddp_gelu_grad(x[j]);
    }
}

/* One tile: C[m,n] = (acc ? C : 0) + op(A) @ op(B), A and B at element offsets offa, offb (see
 * ddp__bf16_gemm for op and the layouts). */
static void gemm(const mm_args_t *a, int ta, int tb, int m, int n, int k, const void *A,
                 size_t offa, int lda, const void *B, size_t offb, int ldb, int acc, float *C,
                 int ldc)
{
    if (a->bf16) {
        ddp__bf16_gemm(a->bf16, ta, tb, m, n, k, (const uint16_t *)A + offa, lda,
                       (const uint16_t *)B + offb, ldb, acc, C, ldc);
        return;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
                n, k, 1.0f, (const float *)A + offa, lda, (const float *)B + offb, ldb,
                acc ? 1.0f : 0.0f, C, ldc);
}

static void fwd_task(void *varg, long task)
{
    const mm_args_t *a = varg;
    int r0, c0, h, w;
    tile_at(&a->fwd, task, &r0, &c0, &h, &w);
    int C = a->C, OC = a->OC, ldo;
    float *out = tile_out(a, a->out, r0, c0, w, a->ldo, &ldo);
    if (a->bias) { /* rounded to the activations' type in 16-bit runs (the header says why) */
        const float *restrict b = a->bias + c0;
        for (int j = 0; j < w; j++)
            out[j] = a->prec == DDP_KPREC_BF16   ? ddp_round_bf16(b[j])
                     : a->prec == DDP_KPREC_FP16 ? ddp_round_fp16(b[j])
                                                 : b[j];
        for (int r = 1; r < h; r++) memcpy(out + (size_t)r * ldo, out, (size_t)w * sizeof(float));
    }
    size_t inp = (size_t)r0 * C;
    if (a->layout == DDP_W_IN_OUT)
        gemm(a, 0, 0, h, w, C, a->inp, inp, C, a->weight, c0, OC, !!a->bias, out, ldo);
    else
        gemm(a, 0, 1, h, w, C, a->inp, inp, C, a->weight, (size_t)c0 * C, C, !!a->bias, out, ldo);
    tile_store(a, a->out, r0, c0, h, w, a->ldo, out);
    if (a->gelu) gelu_tile(a, r0, c0, h, w, out, ldo);
}

/* Activation operand *x (n elements) as the products read it: as it is in fp32 mode and for the
 * native bf16 tiles (its bits), else widened into input slot `slot` (lowp.c). 0, or -1 with
 * ctx->err set. */
static int operand(ddp_kctx_t *ctx, const mm_args_t *a, int slot, const void **x, size_t n)
{
    if (a->prec == DDP_KPREC_FP32 || a->bf16) return 0;
    *x = ddp__cpu_widen_input(ctx, slot, *x, n);
    return *x ? 0 : -1;
}

/* The tile scratch for 16-bit outputs tiled by tl; 0, or -1 with ctx->err set. */
static int tile_scratch(ddp_kctx_t *ctx, mm_args_t *a, const tiling_t *tl)
{
    if (a->prec == DDP_KPREC_FP32) return 0;
    return ddp__cpu_tscratch(ctx, &a->tile, (size_t)tl->rb * tl->cb) ? -1 : 0;
}

/* matmul_fwd, and matmul_gelu_fwd with gelu != NULL (out is then its pre, ldo = OC). */
static void matmul_fwd(ddp_kctx_t *ctx, ddp_act_t *out, ddp_act_t *gelu, const ddp_act_t *inp,
                       const float *weight, const float *bias, int N, int C, int OC, int ldo,
                       ddp_wlayout_t layout)
{
    mm_args_t a = {.out = out, .gelu = gelu, .inp = inp, .weight = weight, .bias = bias, .N = N,
                   .C = C, .OC = OC, .ldo = ldo, .layout = layout, .prec = ctx->prec,
                   .bf16 = ddp__cpu_native(ctx) ? ctx->bf16 : NULL};
    plan(&a.fwd, N, OC);
    if (a.prec != DDP_KPREC_FP32 &&
        !(a.weight = ddp__cpu_lowp_weight(ctx, weight, (size_t)C * OC)))
        return;
    if (operand(ctx, &a, 0, &a.inp, (size_t)N * C) || tile_scratch(ctx, &a, &a.fwd)) return;
    ddp__bf16_run(ctx, a.bf16, ntiles(&a.fwd), fwd_task, &a);
}

void ddp__cpu_matmul_fwd(ddp_kctx_t *ctx, ddp_act_t *out, const ddp_act_t *inp,
                         const float *weight, const float *bias, int N, int C, int OC, int ldo,
                         ddp_wlayout_t layout)
{
    matmul_fwd(ctx, out, NULL, inp, weight, bias, N, C, OC, ldo, layout);
}

void ddp__cpu_matmul_gelu_fwd(ddp_kctx_t *ctx, ddp_act_t *out, ddp_act_t *pre,
                              const ddp_act_t *inp, const float *weight, const float *bias, int N,
                              int C, int OC, ddp_wlayout_t layout)
{
    matmul_fwd(ctx, pre, out, inp, weight, bias, N, C, OC, OC, layout);
}

/* part[k] = dout[:, k0:k1] @ W^T[k0:k1, :], chunk k of the split-K dinp. */
static void dinp_chunk_task(const mm_args_t *a, long k)
{
    int N = a->N, C = a->C, OC = a->OC;
    int k0 = (int)k * MM_KCHUNK, kw = OC - k0 < MM_KCHUNK ? OC - k0 : MM_KCHUNK;
    float *part = a->part + (size_t)k * N * C;
    if (a->layout == DDP_W_IN_OUT)
        gemm(a, 0, 1, N, C, kw, a->dout, k0, a->ldo, a->weight, k0, OC, 0, part, C);
    else
        gemm(a, 0, 0, N, C, kw, a->dout, k0, a->ldo, a->weight, (size_t)k0 * C, C, 0, part, C);
}

/* dinp rows = the split-K partials, added in chunk order (in 16-bit mode into chunk 0's own
 * elements, each read before it is written, then rounded on store). */
DDP_VECTOR_TASK(dinp_reduce_task)
{
    const mm_args_t *a = varg;
    size_t NC = (size_t)a->N * a->C;
    int r0 = (int)task * MM_REDUCE_ROWS;
    int r1 = r0 + MM_REDUCE_ROWS < a->N ? r0 + MM_REDUCE_ROWS : a->N;
    size_t lo = (size_t)r0 * a->C, n = (size_t)(r1 - r0) * a->C;
    const float *p = a->part + lo;
    float *d = ddp__cpu_act_out(a->dinp, lo, a->prec, a->part + lo);
    for (size_t i = 0; i < n; i++) {
        float s = p[i];
        for (int k = 1; k < a->ksplit; k++) s += p[(size_t)k * NC + i];
        d[i] = s;
    }
    if (a->gelu_pre) dgelu_mul(a, d, lo, n);
    ddp__cpu_act_store(a->dinp, lo, d, n, a->prec);
}

/* dinp[N,C] = dout[N,OC] @ W^T (W^T as [OC,C]). */
static void dinp_task(const mm_args_t *a, long task)
{
    if (a->ksplit) {
        dinp_chunk_task(a, task);
        return;
    }
    int r0, c0, h, w;
    tile_at(&a->di, task, &r0, &c0, &h, &w);
    int C = a->C, OC = a->OC, ldo = a->ldo, ldd;
    size_t dout = (size_t)r0 * ldo;
    float *dinp = tile_out(a, a->dinp, r0, c0, w, C, &ldd);
    if (a->layout == DDP_W_IN_OUT) /* W[C][OC]: rows c0.. of W, transposed */
        gemm(a, 0, 1, h, w, OC, a->dout, dout, ldo, a->weight, (size_t)c0 * OC, OC, 0, dinp, ldd);
    else /* W[OC][C]: columns c0.. of W */
        gemm(a, 0, 0, h, w, OC, a->dout, dout, ldo, a->weight, c0, C, 0, dinp, ldd);
    if (a->gelu_pre)
        for (int r = 0; r < h; r++)
            dgelu_mul(a, dinp + (size_t)r * ldd, (size_t)(r0 + r) * C + c0, (size_t)w);
    tile_store(a, a->dinp, r0, c0, h, w, C, dinp);
}

/* IN_OUT: dW[C][OC] += inp^T @ dout.  OUT_IN: dW[OC][C] += dout^T @ inp. */
static void dweight_task(const mm_args_t *a, long task)
{
    int r0, c0, h, w;
    tile_at(&a->dw, task, &r0, &c0, &h, &w);
    int N = a->N, C = a->C, OC = a->OC;
    if (a->layout == DDP_W_IN_OUT)
        gemm(a, 1, 0, h, w, N, a->inp, r0, C, a->dout, c0, a->ldo, 1,
             a->dweight + (size_t)r0 * OC + c0, OC);
    else
        gemm(a, 1, 0, h, w, N, a->dout, r0, a->ldo, a->inp, c0, C, 1,
             a->dweight + (size_t)r0 * C + c0, C);
}

/* dbias[c0..c1) += sum over rows n in order. */
DDP_VECTOR_FN(dbias_task, (const mm_args_t *a, long task), (a, task))
{
    int c0 = (int)task * MM_BIAS_COLS;
    int w = a->OC - c0 < MM_BIAS_COLS ? a->OC - c0 : MM_BIAS_COLS;
    float acc[MM_BIAS_COLS] = {0}, wide[MM_BIAS_COLS];
    for (int n = 0; n < a->N; n++) {
        const float *restrict d =
            ddp__cpu_act_in(a->dout_act, (size_t)n * a->ldo + c0, (size_t)w, a->prec, wide);
        for (int j = 0; j < w; j++) acc[j] += d[j];
    }
    for (int j = 0; j < w; j++) a->dbias[c0 + j] += acc[j];
}

static void bwd_task(void *varg, long task)
{
    const mm_args_t *a = varg;
    /* dweight tiles first: for the LM head they are the largest. */
    if (task < a->n_dw) {
        dweight_task(a, task);
        return;
    }
    task -= a->n_dw;
    if (task < a->n_di) {
        dinp_task(a, task);
        return;
    }
    dbias_task(a, task - a->n_di);
}

/* matmul_bwd, and matmul_dgelu_bwd with gelu_pre != NULL. */
static void matmul_bwd(ddp_kctx_t *ctx, ddp_act_t *dinp, float *dweight, float *dbias,
                       const ddp_act_t *dout, const ddp_act_t *inp, const ddp_act_t *gelu_pre,
                       const float *weight, int N, int C, int OC, int ldo, ddp_wlayout_t layout)
{
    mm_args_t a = {.dinp = dinp, .dweight = dweight, .dbias = dbias, .dout = dout, .inp = inp,
                   .weight = weight, .gelu_pre = gelu_pre, .N = N, .C = C, .OC = OC,
                   .ldo = ldo, .layout = layout, .dout_act = dout, .prec = ctx->prec,
                   .bf16 = ddp__cpu_native(ctx) ? ctx->bf16 : NULL};
    if (a.prec != DDP_KPREC_FP32 && dinp &&
        !(a.weight = ddp__cpu_lowp_weight(ctx, weight, (size_t)C * OC)))
        return;
    /* dout's N rows, the last one without the stride's padding (never read) */
    size_t dout_n = (size_t)(N - 1) * ldo + OC;
    if (operand(ctx, &a, 1, &a.inp, (size_t)N * C) || operand(ctx, &a, 0, &a.dout, dout_n)) return;
    plan(&a.di, N, C);
    if (layout == DDP_W_IN_OUT)
        plan(&a.dw, C, OC);
    else
        plan(&a.dw, OC, C);
    a.n_dw = dweight ? ntiles(&a.dw) : 0;
    a.n_di = dinp ? ntiles(&a.di) : 0;
    a.n_db = dbias ? ddp__ntasks((size_t)OC, MM_BIAS_COLS) : 0;
    if (dinp && OC >= MM_KSPLIT_MIN) {
        int ks = (OC + MM_KCHUNK - 1) / MM_KCHUNK;
        size_t bytes = (size_t)ks * N * C * sizeof(float);
        if (bytes <= MM_KSPLIT_BYTES) a.part = ddp__cpu_scratch(ctx, bytes);
        if (a.part) {
            a.ksplit = ks;
            a.n_di = ks;
        }
    }
    if (dinp && !a.ksplit && tile_scratch(ctx, &a, &a.di)) return;
    ddp__bf16_run(ctx, a.bf16, a.n_dw + a.n_di + a.n_db, bwd_task, &a);
    if (a.ksplit)
        ddp__pool_run(ctx->pool, ddp__ntasks((size_t)N, MM_REDUCE_ROWS), dinp_reduce_task, &a);
}

void ddp__cpu_matmul_bwd(ddp_kctx_t *ctx, ddp_act_t *dinp, float *dweight, float *dbias,
                         const ddp_act_t *dout, const ddp_act_t *inp, const float *weight, int N,
                         int C, int OC, int ldo, ddp_wlayout_t layout)
{
    matmul_bwd(ctx, dinp, dweight, dbias, dout, inp, NULL, weight, N, C, OC, ldo, layout);
}

void ddp__cpu_matmul_dgelu_bwd(ddp_kctx_t *ctx, ddp_act_t *dpre, float *dweight, float *dbias,
                               const ddp_act_t *dout, const ddp_act_t *inp, const ddp_act_t *pre,
                               const float *weight, int N, int C, int OC, ddp_wlayout_t layout)
{
    matmul_bwd(ctx, dpre, dweight, dbias, dout, inp, pre, weight, N, C, OC, OC, layout);
}
