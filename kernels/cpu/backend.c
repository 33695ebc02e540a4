/* The built-in CPU kernel backend: its ops table, context (thread pool), memory and copies.
 *
 * Memory is host memory: alloc returns 64-byte aligned, zero-filled blocks (cache-line and
 * AVX-512 aligned; page-aligned from 1 MiB up, so the checkpoint writer can hand the parameter
 * and moment arenas to O_DIRECT writes as they are), copies are memcpy, and sync only reports
 * the first error an op recorded. A sparse arena (reserve) is such a block with its pages given
 * back: a page commits itself when first touched, decommit gives it back (ddp_mem_release), and
 * the context keeps each reservation's extent to check ranges against; close releases the
 * reservations still held.
 * The ops live in the other files of this folder; cpu.h states the threading invariants.
 */
#include "kernels/cpu/cpu.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

#define CPU_ALIGN 64
#define CPU_PAGE_ALIGN_FROM (1u << 20) /* bytes */

static int cpu_probe(void) { return 1; }

static int default_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 256 ? 256 : (int)n;
}

static int cpu_init(ddp_kctx_t **out, int device, int threads)
{
    *out = NULL;
    if (threads < 0) return DDP_EINVAL;
    const char *bad = ddp_cpu_isa_env_error();
    if (bad) {
        DDP_ERROR("kernels: %s", bad);
        return DDP_EINVAL;
    }
    if (threads == 0) threads = default_threads();
    ddp_kctx_t *ctx = ddp_calloc(1, sizeof(*ctx));
    if (!ctx) return DDP_ENOMEM;
    int rc = ddp__pool_new(&ctx->pool, threads);
    if (rc < 0) {
        free(ctx);
        return rc;
    }
    ctx->threads = threads;
    /* Every sgemm runs inside one of our tasks: OpenBLAS must not start threads of its own. */
    openblas_set_num_threads(1);
    *out = ctx;
    return 0;
}

/* A sparse arena: its extent as reserved, for commit's check (pages need nothing more). */
typedef struct ddp__cpu_resv {
    struct ddp__cpu_resv *next;
    char *base;
    size_t bytes;
} resv_t;

static void cpu_free(ddp_kctx_t *ctx, void *p);

static void cpu_close(ddp_kctx_t *ctx)
{
    if (!ctx) return;
    while (ctx->resv) cpu_free(ctx, ctx->resv->base);
    ddp__pool_free(ctx->pool);
    ddp__cpu_lowp_free(ctx);
    ddp__bf16_free(ctx->bf16);
    free(ctx->scratch);
    free(ctx);
}

float *ddp__cpu_scratch(ddp_kctx_t *ctx, size_t bytes)
{
    if (bytes <= ctx->scratch_bytes) return ctx->scratch;
    float *p = ddp_aligned_alloc(CPU_ALIGN, bytes);
    if (!p) return NULL;
    free(ctx->scratch);
    ctx->scratch = p;
    ctx->scratch_bytes = bytes;
    return p;
}

int ddp__cpu_tscratch(ddp_kctx_t *ctx, ddp__tscratch_t *s, size_t per)
{
    s->per = (per + 15) / 16 * 16; /* each thread's slice on its own cache lines */
    s->base = ddp__cpu_scratch(ctx, (size_t)ctx->threads * s->per * sizeof(float));
    if (s->base) return 0;
    if (!ctx->err) ctx->err = DDP_ENOMEM;
    return DDP_ENOMEM;
}

static int cpu_alloc(ddp_kctx_t *ctx, void **out, size_t bytes)
{
    size_t align = bytes >= CPU_PAGE_ALIGN_FROM ? 4096 : CPU_ALIGN;
    size_t rounded = (bytes + align - 1) / align * align;
    void *p = align == 4096 ? ddp_alloc_big(rounded)
                            : ddp_aligned_alloc(align, rounded ? rounded : align);
    if (!p) return DDP_ENOMEM;
    if (align == 4096) /* zero-fill on demand: touching it now (huge pages compacted at each
                        * fault) took 2.7 s for GPT-2 124M's moments, which a joining rank's
                        * peers would wait through; the pages fault in at first use instead */
        ddp_mem_release(p, rounded);
    else
        memset(p, 0, rounded ? rounded : align);
    *out = p;
    return 0;
}

static size_t cpu_commit_granule(ddp_kctx_t *ctx) { return (size_t)sysconf(_SC_PAGESIZE); }

/* alloc's allocator for large blocks, so that free() releases both kinds; ddp_mem_release
 * makes every page zero-on-demand however malloc got it (a fresh mmap or reused heap). */
static int cpu_reserve(ddp_kctx_t *ctx, void **out, size_t bytes)
{
    *out = NULL;
    if (bytes == 0) return 0;
    size_t page = cpu_commit_granule(ctx), rounded = (bytes + page - 1) / page * page;
    resv_t *r = ddp_malloc(sizeof *r);
    void *p = r ? ddp_alloc_big(rounded) : NULL;
    if (!p) {
        free(r);
        return DDP_ENOMEM;
    }
    ddp_mem_release(p, rounded);
    *r = (resv_t){ctx->resv, p, bytes};
    ctx->resv = r;
    *out = p;
    return 0;
}

/* The reservation holding all of [p, p + bytes), or NULL. */
static resv_t *resv_of(ddp_kctx_t *ctx, const void *p, size_t bytes)
{
    const char *c = p;
    for (resv_t *r = ctx->resv; r; r = r->next)
        if (c >= r->base && c < r->base + r->bytes)
            return bytes <= (size_t)(r->base + r->bytes - c) ? r : NULL;
    return NULL;
}

/* A page commits itself at its first touch and reads zero until then: only the range is
 * checked. */
static int cpu_commit(ddp_kctx_t *ctx, void *p, size_t bytes)
{
    return bytes == 0 || resv_of(ctx, p, bytes) ? 0 : DDP_EINVAL;
}

static void cpu_decommit(ddp_kctx_t *ctx, void *p, size_t bytes)
{
    if (bytes == 0) return;
    resv_t *r = resv_of(ctx, p, bytes);
    if (!r) {
        DDP_ERROR("kernels: cpu: decommit of [%p, +%zu), which is not inside one reservation", p,
                  bytes);
        if (!ctx->err) ctx->err = DDP_EINVAL;
        return;
    }
    size_t page = cpu_commit_granule(ctx), off = (size_t)((char *)p - r->base);
    if (off + bytes == r->bytes) /* the last page ends with the reservation */
        bytes = (r->bytes + page - 1) / page * page - off;
    ddp_mem_release(p, bytes);
}

static void cpu_free(ddp_kctx_t *ctx, void *p)
{
    for (resv_t **pr = &ctx->resv; *pr; pr = &(*pr)->next)
        if ((*pr)->base == p) {
            resv_t *r = *pr;
            *pr = r->next;
            free(r);
            break;
        }
    free(p);
}

/* Host memory is all there is. */
static int cpu_on_device(ddp_kctx_t *ctx, const void *p, size_t bytes) { return 0; }

/* Large copies and fills go over the pool in pieces: one thread's stores reach about 10 GB/s on
 * the development Xeon, and the gradient arena's zeroing is 500 MB a step for GPT-2 124M. */
#define PIECE ((size_t)1 << 20)

typedef struct {
    char *dst;
    const char *src; /* NULL: fill with zeros */
    size_t bytes;
} pieces_t;

static void piece_task(void *varg, long task)
{
    const pieces_t *a = varg;
    size_t lo = (size_t)task * PIECE, n = a->bytes - lo < PIECE ? a->bytes - lo : PIECE;
    if (a->src)
        memcpy(a->dst + lo, a->src + lo, n);
    else
        memset(a->dst + lo, 0, n);
}

/* 1 when dst and src (bytes each) go in pieces: large, more than one thread, no overlap. */
static int in_pieces(const ddp_kctx_t *ctx, const char *dst, const char *src, size_t bytes)
{
    return ctx->threads > 1 && bytes >= 4 * PIECE &&
           (!src || dst + bytes <= src || src + bytes <= dst);
}

static int cpu_memcpy(ddp_kctx_t *ctx, void *dst, const void *src, size_t bytes)
{
    pieces_t a = {dst, src, bytes};
    if (in_pieces(ctx, dst, src, bytes))
        ddp__pool_run(ctx->pool, ddp__ntasks(bytes, PIECE), piece_task, &a);
    else if (bytes)
        memmove(dst, src, bytes);
    return 0;
}

static int cpu_memset0(ddp_kctx_t *ctx, void *dst, size_t bytes)
{
    pieces_t a = {dst, NULL, bytes};
    if (in_pieces(ctx, dst, NULL, bytes))
        ddp__pool_run(ctx->pool, ddp__ntasks(bytes, PIECE), piece_task, &a);
    else if (bytes)
        memset(dst, 0, bytes);
    return 0;
}

static int cpu_sync(ddp_kctx_t *ctx)
{
    int rc = ctx->err;
    ctx->err = 0;
    return rc;
}

static int cpu_device_count(void) { return 0; }

/* Ops are synchronous: there is nothing to order after. */
static int cpu_record_event(ddp_kctx_t *ctx, void **event)
{
    *event = NULL;
    return 0;
}

/* Profiling marks: ops are synchronous, so a mark is the monotonic clock at the call, carried
 * in the pointer itself (nanoseconds since boot, never 0): nothing to store, reset or free. */
_Static_assert(sizeof(void *) >= sizeof(int64_t), "a mark holds a clock value");

static int cpu_timer_mark(ddp_kctx_t *ctx, void **mark)
{
    *mark = (void *)(uintptr_t)ddp_now_ns();
    return 0;
}

static double cpu_timer_elapsed_ms(ddp_kctx_t *ctx, void *a, void *b)
{
    return (double)((int64_t)(uintptr_t)b - (int64_t)(uintptr_t)a) / 1e6;
}

static void cpu_timer_reset(ddp_kctx_t *ctx) {}

const ddp_kernels_ops_t ddp_kernels_cpu = {
    .name = "cpu",
    .coll_backend = "ring",
    .host_memory = 1,
    .gpu_memory = 0,
    .record_event = cpu_record_event,
    .timer_mark = cpu_timer_mark,
    .timer_elapsed_ms = cpu_timer_elapsed_ms,
    .timer_reset = cpu_timer_reset,
    .probe = cpu_probe,
    .device_count = cpu_device_count,
    .init = cpu_init,
    .close = cpu_close,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .reserve = cpu_reserve,
    .commit = cpu_commit,
    .decommit = cpu_decommit,
    .commit_granule = cpu_commit_granule,
    .on_device = cpu_on_device,
    .memcpy_h2d = cpu_memcpy,
    .memcpy_d2h = cpu_memcpy,
    .memcpy_d2d = cpu_memcpy,
    .memset0 = cpu_memset0,
    .sync = cpu_sync,
    .prec_native = ddp__cpu_prec_native,
#define CPU_OP(name, params) .name = ddp__cpu_##name,
    DDP_KERNEL_OPS(CPU_OP)
#undef CPU_OP
};
