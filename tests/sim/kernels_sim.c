/* The "sim" kernel backend: a simulated GPU for tests (simdev.h), with the CPU's math.
 *
 * It has the CUDA backend's semantics, not the CPU's: memory is simulated device memory of the
 * context's device (PROT_NONE to the host between ops); every op is queued on the context's
 * compute stream (a thread) and runs later, by the CPU backend's op on a CPU context of
 * `threads` threads that only the stream thread uses, so results are bitwise the CPU
 * backend's. What waits mirrors kernels/cuda/backend.cu: alloc returns zeroed memory that any
 * stream may use at once; free, memcpy_d2h, sumsq_blocks and nonfinite wait for the stream;
 * memcpy_d2d, memset0 and every other op do not; memcpy_h2d reads src at the call into a copy
 * of its own and queues the device write, at any size (the GPU stages up to 4 MiB and waits
 * above, which only adds ordering: the sim is the stricter). record_event records a
 * simulated event that the "sim" collectives backend's stream waits for. A sparse arena is a
 * simulated reservation of 64 KiB granules (ddp_simdev_reserve): commit is synchronous,
 * decommit waits for the stream, and an op touching a granule not committed is a hazard.
 * A profiling mark (timer_mark) is a read of the host's monotonic clock queued on the compute
 * stream, as a GPU's event records when the stream reaches it.
 *
 * Each op declares the ranges it reads and writes, so the simulator reports an op that touches
 * memory another stream (a collective) still uses without an event between them, and a buffer
 * that is not device memory of this device. A hazard is kept as the context's error
 * (DDP_EHAZARD, returned by the next sync) and logged.
 *
 * Test hook: DDP_SIM_BREAK=lm_head_dinp adds 1 to dinp[0] in matmul_bwd for the tied LM head's
 * shape (layout DDP_W_OUT_IN, OC >= 50257), a bug the self-test must catch.
 * Built as the test-only module ddp_kernels_sim.so (tests/sim/meson.build, never installed),
 * which ddp_kernels_open("sim") loads as it loads the CUDA module; its only entry point is
 * ddp_kernels_module() (DDP_KERNELS_MODULE_SYMBOL). The CPU backend it runs on is linked into
 * the module; the simulated device is libddp_sim.so's, shared with the "sim" collectives.
 * Opened only by name ("sim"); "auto" never picks it. Threads: one caller thread per context.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"
#include "tests/sim/simdev.h"
#include "kernels/kernels.h"

struct ddp_kctx {
    int device;
    ddp_simdev_stream_t *stream; /* the compute stream */
    ddp_kctx_t *cpu;             /* the CPU backend's context (its own struct): stream only */
    int err;                     /* first error since the last sync (caller's thread) */
    int break_lm_head;           /* DDP_SIM_BREAK=lm_head_dinp */
    ddp_kprec_t prec;            /* the last set_precision's, as queued: activations' type */
    ddp_simdev_event_t order;    /* record_event's event */
    pthread_mutex_t owner_lock;  /* guards owner, has_owner, idle (see owned_by_caller) */
    pthread_t owner;
    int has_owner;
    int idle; /* nothing queued since the owner's last wait for the stream */
    /* profiling marks: clock slots in chunks that never move (the stream thread writes a slot
     * it was given; the chunk table grows on the caller's thread only) */
    int64_t **mark_chunks;
    size_t n_mark_chunks, marks_used;
};

#define MARKS_PER_CHUNK 1024

#define CPU ddp_kernels_cpu

enum {
    ENC_FWD, ENC_BWD, LN_FWD, LN_BWD, MM_FWD, MM_BWD, MM_GELU_FWD, MM_DGELU_BWD, ATT_FWD,
    ATT_BWD, ROPE_FWD, ROPE_BWD, RMS_FWD, RMS_BWD, SWIGLU_FWD, SWIGLU_BWD, GELU_FWD, GELU_BWD, RESIDUAL, RES_NORM, TO_ACT,
    XENT, ADAMW, SUMSQ, ADD, SCALE, NONFINITE, COPY, COPY_STAGED, ZERO, SET_PREC,
    SET_WEIGHTS
};

/* One queued op: its kind and arguments (pointers, ints, sizes, floats). */
typedef struct {
    ddp_kctx_t *ctx;
    int op;
    void *p[9];
    int i[6];
    size_t z[2];
    float f[7];
} args_t;

/* The test hook's bug: activation element 0 of type prec += 1. */
static void add_one(void *x, ddp_kprec_t prec)
{
    float v;
    ddp_act_to_f32(&v, x, 1, prec);
    v += 1.0f;
    ddp_act_from_f32(x, &v, 1, prec);
}

static void run(void *arg)
{
    args_t *a = arg;
    ddp_kctx_t *c = a->ctx->cpu;
    void **p = a->p;
    int *i = a->i;
    switch (a->op) {
    case ENC_FWD: CPU.encoder_fwd(c, p[0], p[1], p[2], p[3], i[0], i[1], i[2]); break;
    case ENC_BWD: CPU.encoder_bwd(c, p[0], p[1], p[2], p[3], i[0], i[1], i[2]); break;
    case LN_FWD: CPU.layernorm_fwd(c, p[0], p[1], p[2], p[3], p[4], p[5], i[0], i[1]); break;
    case LN_BWD:
        CPU.layernorm_bwd(c, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], i[0], i[1]);
        break;
    case MM_FWD: CPU.matmul_fwd(c, p[0], p[1], p[2], p[3], i[0], i[1], i[2], i[4], i[3]); break;
    case MM_BWD:
        CPU.matmul_bwd(c, p[0], p[1], p[2], p[3], p[4], p[5], i[0], i[1], i[2], i[5], i[3]);
        if (a->ctx->break_lm_head && p[0] && i[3] == DDP_W_OUT_IN && i[2] >= 50257)
            add_one(p[0], (ddp_kprec_t)i[4]);
        break;
    case MM_GELU_FWD:
        CPU.matmul_gelu_fwd(c, p[0], p[1], p[2], p[3], p[4], i[0], i[1], i[2], i[3]);
        break;
    case MM_DGELU_BWD:
        CPU.matmul_dgelu_bwd(c, p[0], p[1], p[2], p[3], p[4], p[5], p[6], i[0], i[1], i[2], i[3]);
        break;
    case ATT_FWD: CPU.attention_fwd(c, p[0], p[1], p[2], i[0], i[1], i[2], i[3], i[4]); break;
    case ATT_BWD:
        CPU.attention_bwd(c, p[0], p[1], p[2], p[3], p[4], i[0], i[1], i[2], i[3], i[4]);
        break;
    case ROPE_FWD: CPU.rope_fwd(c, p[0], p[1], i[0], i[1], i[2], i[3], i[4]); break;
    case ROPE_BWD: CPU.rope_bwd(c, p[0], p[1], i[0], i[1], i[2], i[3], i[4]); break;
    case RMS_FWD: CPU.rmsnorm_fwd(c, p[0], p[1], p[2], p[3], i[0], i[1], a->f[0]); break;
    case RMS_BWD: CPU.rmsnorm_bwd(c, p[0], p[1], p[2], p[3], p[4], p[5], p[6], i[0], i[1]); break;
    case SWIGLU_FWD: CPU.swiglu_fwd(c, p[0], p[1], i[0], i[1]); break;
    case SWIGLU_BWD: CPU.swiglu_bwd(c, p[0], p[1], p[2], i[0], i[1]); break;
    case GELU_FWD: CPU.gelu_fwd(c, p[0], p[1], a->z[0]); break;
    case GELU_BWD: CPU.gelu_bwd(c, p[0], p[1], p[2], a->z[0]); break;
    case RESIDUAL: CPU.residual_fwd(c, p[0], p[1], p[2], a->z[0]); break;
    case RES_NORM:
        CPU.residual_norm_fwd(c, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], i[0], i[1],
                              a->f[0]);
        break;
    case TO_ACT: CPU.to_act(c, p[0], p[1], a->z[0]); break;
    case XENT: CPU.xent_fwd_bwd(c, p[0], p[1], p[2], p[3], i[0], i[1], i[2], a->f[0]); break;
    case ADAMW:
        CPU.adamw(c, p[0], p[1], p[2], p[3], p[4], i[1], a->f[0], a->f[1], a->f[2], a->f[3],
                  a->f[4], i[0], NULL);
        free(p[4]); /* the ranges' copy */
        break;
    case SUMSQ:
        CPU.sumsq_blocks(c, p[0], p[1], p[2], i[0], a->z[0]);
        free(p[2]); /* the ranges' copy */
        break;
    case ADD: CPU.add(c, p[0], p[1], a->z[0]); break;
    case SCALE: CPU.scale(c, p[0], a->f[0], a->z[0]); break;
    case NONFINITE: CPU.nonfinite(c, p[0], p[1], a->z[0]); break;
    case COPY: memmove(p[0], p[1], a->z[0]); break;
    case COPY_STAGED:
        memcpy(p[0], p[1], a->z[0]);
        free(p[1]); /* memcpy_h2d's copy of its source */
        break;
    case ZERO: memset(p[0], 0, a->z[0]); break;
    case SET_PREC: CPU.set_precision(c, (ddp_kprec_t)i[0]); break;
    case SET_WEIGHTS: CPU.set_weights(c, p[0], a->z[0]); break;
    }
}

/* A range for an op's access list; NULL pointers give an empty range. */
#define RANGE(ptr, n, sz, m) ((ddp_simdev_access_t){(ptr), (ptr) ? (size_t)(n) * (sz) : 0, (m)})
#define F(ptr, n, m) RANGE(ptr, n, sizeof(float), m)
#define A(ptr, n, m) RANGE(ptr, n, ddp_act_bytes(ctx->prec), m) /* an activation tensor */
#define R DDP_SIMDEV_R
#define W DDP_SIMDEV_W
#define RW DDP_SIMDEV_RW

/* The CUDA backend's contract (kcuda.cuh): one thread uses a context at a time. The thread
 * that queues work or syncs here owns the context; another thread may take it over only when
 * the context is idle (its owner waited for everything it queued: a hand-over, such as a
 * thread joined after its last sync). A call from another thread while the owner's work is
 * queued is the misuse that on a GPU races on the context's error and puts the caller's work in
 * the owner's stream order (once the checkpoint helper's copies): logged, refused. `queued`: the
 * call queues work (the context is then busy until the owner waits). */
static int owned_by_caller(ddp_kctx_t *ctx, const char *what, int queued)
{
    pthread_mutex_lock(&ctx->owner_lock);
    pthread_t self = pthread_self();
    int ok = !ctx->has_owner || pthread_equal(ctx->owner, self) || ctx->idle;
    if (ok) {
        ctx->owner = self;
        ctx->has_owner = 1;
        if (queued) ctx->idle = 0;
    }
    pthread_mutex_unlock(&ctx->owner_lock);
    if (!ok)
        DDP_ERROR("sim: %s from a second thread while the context's owner has work queued: a "
                  "kernel context belongs to one thread at a time", what);
    return ok;
}

/* The owner waited for everything queued so far: the context may change hands. */
static void now_idle(ddp_kctx_t *ctx)
{
    pthread_mutex_lock(&ctx->owner_lock);
    ctx->idle = 1;
    pthread_mutex_unlock(&ctx->owner_lock);
}

static args_t *new_args(ddp_kctx_t *ctx, int op)
{
    if (!owned_by_caller(ctx, "an op", 1)) return NULL;
    args_t *a = calloc(1, sizeof *a);
    if (!a) {
        if (!ctx->err) ctx->err = DDP_ENOMEM;
        return NULL;
    }
    a->ctx = ctx;
    a->op = op;
    return a;
}

/* Queues a; keeps the first error (a hazard) for sync. */
static void launch(ddp_kctx_t *ctx, args_t *a, const char *what, const ddp_simdev_access_t *acc,
                   int nacc)
{
    if (!a) return;
    int rc = ddp_simdev_launch(ctx->stream, what, run, a, acc, nacc);
    if (rc && !ctx->err) ctx->err = rc;
}

#define LAUNCH(ctx, a, what, ...)                                                            \
    do {                                                                                     \
        ddp_simdev_access_t acc_[] = {__VA_ARGS__};                                          \
        launch(ctx, a, what, acc_, (int)(sizeof acc_ / sizeof acc_[0]));                     \
    } while (0)

static void set_p(args_t *a, int n, ...)
{
    va_list ap;
    va_start(ap, n);
    for (int k = 0; k < n; k++) a->p[k] = va_arg(ap, void *);
    va_end(ap);
}

/* ---- memory, copies, context ---- */

static int sim_probe(void) { return 1; /* usable anywhere; "auto" never loads this module */ }
static int sim_device_count(void) { return 8; }

static void sim_close(ddp_kctx_t *ctx)
{
    if (!ctx) return;
    ddp_simdev_stream_free(ctx->stream);
    if (ctx->cpu) CPU.close(ctx->cpu);
    pthread_mutex_destroy(&ctx->owner_lock);
    for (size_t i = 0; i < ctx->n_mark_chunks; i++) free(ctx->mark_chunks[i]);
    free(ctx->mark_chunks);
    free(ctx);
}

static int sim_init(ddp_kctx_t **out, int device, int threads)
{
    *out = NULL;
    if (device < 0) return DDP_ENODEV;
    ddp_kctx_t *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return DDP_ENOMEM;
    ctx->device = device;
    ctx->order.stream = -1;
    pthread_mutex_init(&ctx->owner_lock, NULL);
    const char *brk = getenv("DDP_SIM_BREAK");
    ctx->break_lm_head = brk && strcmp(brk, "lm_head_dinp") == 0;
    char name[32];
    snprintf(name, sizeof name, "compute(dev %d)", device);
    int rc = CPU.init(&ctx->cpu, 0, threads);
    if (rc == 0) rc = ddp_simdev_stream_new(device, name, &ctx->stream);
    if (rc) {
        sim_close(ctx);
        return rc;
    }
    *out = ctx;
    return 0;
}

static int sim_alloc(ddp_kctx_t *ctx, void **out, size_t bytes)
{
    *out = NULL;
    if (bytes == 0) return 0;
    return ddp_simdev_alloc(ctx->device, bytes, out);
}

static void sim_free(ddp_kctx_t *ctx, void *p)
{
    if (!p) return;
    ddp_simdev_stream_sync(ctx->stream); /* as cuda_free: queued ops may still use p */
    ddp_simdev_free(p);
}

/* Smaller than the GPU's 2 MiB, so that the arenas of the small models the tests train span
 * several granules and a rank's foreign slices are really decommitted: an op that touches one
 * is then caught in CI. ZeRO-1's slices start at multiples of DDP_COLL_SLICE_ELEMS floats
 * (64 KiB), so here they are given back whole; on a GPU the granules at a slice's edges stay. */
#define SIM_GRANULE ((size_t)64 << 10)

static size_t sim_commit_granule(ddp_kctx_t *ctx) { return SIM_GRANULE; }

static int sim_on_device(ddp_kctx_t *ctx, const void *p, size_t bytes)
{
    return ddp_simdev_device_of(p, bytes) == ctx->device;
}

static int sim_reserve(ddp_kctx_t *ctx, void **out, size_t bytes)
{
    *out = NULL;
    if (bytes == 0) return 0;
    return ddp_simdev_reserve(ctx->device, bytes, SIM_GRANULE, out);
}

/* Synchronous, as the CUDA backend's (which zeroes the new granules and waits). */
static int sim_commit(ddp_kctx_t *ctx, void *p, size_t bytes)
{
    if (bytes == 0) return 0;
    return ddp_simdev_device_of(p, 1) == ctx->device ? ddp_simdev_commit(p, bytes) : DDP_EINVAL;
}

/* Waits for the compute stream as the CUDA backend does; what another stream (a collective)
 * still does there without a host sync is reported by the simulator. */
static void sim_decommit(ddp_kctx_t *ctx, void *p, size_t bytes)
{
    if (bytes == 0) return;
    ddp_simdev_stream_sync(ctx->stream);
    int rc = DDP_EINVAL;
    if (ddp_simdev_device_of(p, 1) == ctx->device)
        rc = ddp_simdev_decommit(p, bytes);
    else
        DDP_ERROR("sim: decommit of [%p, +%zu), which is not memory of device %d", p, bytes,
                  ctx->device);
    if (rc && !ctx->err) ctx->err = rc;
}

static int sim_sync(ddp_kctx_t *ctx)
{
    if (!owned_by_caller(ctx, "sync", 0)) return DDP_EHAZARD;
    ddp_simdev_stream_sync(ctx->stream);
    now_idle(ctx);
    int rc = ctx->err, cpu = CPU.sync(ctx->cpu);
    ctx->err = 0;
    return rc ? rc : cpu;
}

enum { H2D, D2H, D2D };

/* Queues a copy of `kind` as the GPU does it: h2d reads src now (into a copy of its own that the
 * queued op frees) and queues the write; d2h waits for it (its error reported here rather than
 * at the next sync); d2d is queued (an error kept so far is returned, and kept). */
static int copy(ddp_kctx_t *ctx, void *dst, const void *src, size_t bytes, int kind,
                const char *what)
{
    if (bytes == 0) return 0;
    if (!owned_by_caller(ctx, what, 1)) return DDP_EHAZARD;
    void *staged = kind == H2D ? malloc(bytes) : NULL;
    args_t *a = kind != H2D || staged ? new_args(ctx, kind == H2D ? COPY_STAGED : COPY) : NULL;
    if (!a) {
        free(staged);
        return DDP_ENOMEM;
    }
    if (staged) src = memcpy(staged, src, bytes);
    set_p(a, 2, dst, (void *)src);
    a->z[0] = bytes;
    LAUNCH(ctx, a, what, RANGE(dst, bytes, 1, W | (kind == D2H ? DDP_SIMDEV_HOSTSIDE : 0)),
           RANGE(src, bytes, 1, R | (kind == H2D ? DDP_SIMDEV_HOSTSIDE : 0)));
    if (kind == H2D) return 0; /* as the GPU's staged copy: errors come with the sync */
    if (kind == D2D) return ctx->err;
    ddp_simdev_stream_sync(ctx->stream);
    now_idle(ctx);
    int rc = ctx->err;
    ctx->err = 0;
    return rc;
}

static int sim_h2d(ddp_kctx_t *ctx, void *dst, const void *src, size_t bytes)
{
    return copy(ctx, dst, src, bytes, H2D, "memcpy_h2d");
}

static int sim_d2h(ddp_kctx_t *ctx, void *dst, const void *src, size_t bytes)
{
    return copy(ctx, dst, src, bytes, D2H, "memcpy_d2h");
}

static int sim_d2d(ddp_kctx_t *ctx, void *dst, const void *src, size_t bytes)
{
    return copy(ctx, dst, src, bytes, D2D, "memcpy_d2d");
}

static int sim_memset0(ddp_kctx_t *ctx, void *dst, size_t bytes)
{
    if (bytes == 0) return 0;
    if (!owned_by_caller(ctx, "memset0", 1)) return DDP_EHAZARD;
    args_t *a = new_args(ctx, ZERO);
    if (!a) return DDP_ENOMEM;
    a->p[0] = dst;
    a->z[0] = bytes;
    LAUNCH(ctx, a, "memset0", RANGE(dst, bytes, 1, W));
    return 0;
}

static int sim_record_event(ddp_kctx_t *ctx, void **event)
{
    ddp_simdev_event_record(&ctx->order, ctx->stream);
    *event = &ctx->order;
    return 0;
}

/* ---- profiling marks ---- */

typedef struct {
    int64_t *slot;
} stamp_t;

static void stamp(void *arg) { *((stamp_t *)arg)->slot = ddp_now_ns(); }

static int sim_timer_mark(ddp_kctx_t *ctx, void **mark)
{
    *mark = NULL;
    size_t i = ctx->marks_used;
    if (i == ctx->n_mark_chunks * MARKS_PER_CHUNK) {
        int64_t **t = realloc(ctx->mark_chunks, (ctx->n_mark_chunks + 1) * sizeof *t);
        if (!t) return DDP_ENOMEM;
        ctx->mark_chunks = t;
        t[ctx->n_mark_chunks] = calloc(MARKS_PER_CHUNK, sizeof **t);
        if (!t[ctx->n_mark_chunks]) return DDP_ENOMEM;
        ctx->n_mark_chunks++;
    }
    int64_t *slot = &ctx->mark_chunks[i / MARKS_PER_CHUNK][i % MARKS_PER_CHUNK];
    stamp_t *a = malloc(sizeof *a);
    if (!a) return DDP_ENOMEM;
    a->slot = slot;
    int rc = ddp_simdev_launch(ctx->stream, "timer_mark", stamp, a, NULL, 0); /* takes a */
    if (rc) return rc;
    ctx->marks_used++;
    *mark = slot;
    return 0;
}

static double sim_timer_elapsed_ms(ddp_kctx_t *ctx, void *a, void *b)
{
    return (double)(*(int64_t *)b - *(int64_t *)a) / 1e6;
}

static void sim_timer_reset(ddp_kctx_t *ctx) { ctx->marks_used = 0; }

/* ---- ops ---- */

/* sim_<op> for every op of DDP_KERNEL_OPS (below; the table at the end lists them). */
#define SIM_OP(name, params) static void sim_##name DDP_KOP_CTX_PARAMS params;
DDP_KERNEL_OPS(SIM_OP)
#undef SIM_OP

static void sim_encoder_fwd(ddp_kctx_t *ctx, float *out, const int32_t *inp, const float *wte,
                            const float *wpe, int B, int T, int C)
{
    args_t *a = new_args(ctx, ENC_FWD);
    if (!a) return;
    size_t BT = (size_t)B * T;
    set_p(a, 4, out, inp, wte, wpe);
    a->i[0] = B, a->i[1] = T, a->i[2] = C;
    LAUNCH(ctx, a, "encoder_fwd", F(out, BT * C, W), RANGE(inp, BT, 4, R), F(wte, C, R),
           F(wpe, (size_t)T * C, R));
}

static void sim_encoder_bwd(ddp_kctx_t *ctx, float *dwte, float *dwpe, const float *dout,
                            const int32_t *inp, int B, int T, int C)
{
    args_t *a = new_args(ctx, ENC_BWD);
    if (!a) return;
    size_t BT = (size_t)B * T;
    set_p(a, 4, dwte, dwpe, dout, inp);
    a->i[0] = B, a->i[1] = T, a->i[2] = C;
    /* dwte's rows are the tokens': the op may write anywhere up to the end of its allocation */
    size_t wte_bytes = dwte ? (size_t)((const char *)ddp_simdev_end_of(dwte) - (char *)dwte) : 0;
    LAUNCH(ctx, a, "encoder_bwd", RANGE(dwte, wte_bytes, 1, RW), F(dwpe, (size_t)T * C, RW),
           F(dout, BT * C, R), RANGE(inp, BT, 4, R));
}

static void sim_layernorm_fwd(ddp_kctx_t *ctx, ddp_act_t *out, float *mean, float *rstd,
                              const float *inp, const float *weight, const float *bias, int N,
                              int C)
{
    args_t *a = new_args(ctx, LN_FWD);
    if (!a) return;
    size_t NC = (size_t)N * C;
    set_p(a, 6, out, mean, rstd, inp, weight, bias);
    a->i[0] = N, a->i[1] = C;
    LAUNCH(ctx, a, "layernorm_fwd", A(out, NC, W), F(mean, N, W), F(rstd, N, W), F(inp, NC, R),
           F(weight, C, R), F(bias, C, R));
}

static void sim_layernorm_bwd(ddp_kctx_t *ctx, float *dinp, ddp_act_t *dinp_act, float *dweight,
                              float *dbias, const ddp_act_t *dout, const float *inp,
                              const float *weight, const float *mean, const float *rstd, int N,
                              int C)
{
    args_t *a = new_args(ctx, LN_BWD);
    if (!a) return;
    size_t NC = (size_t)N * C;
    set_p(a, 9, dinp, dinp_act, dweight, dbias, dout, inp, weight, mean, rstd);
    a->i[0] = N, a->i[1] = C;
    LAUNCH(ctx, a, "layernorm_bwd", F(dinp, NC, RW), A(dinp_act, NC, W), F(dweight, C, RW),
           F(dbias, C, RW),
           A(dout, NC, R), F(inp, NC, R), F(weight, C, R), F(mean, N, R), F(rstd, N, R));
}

/* Queued like the ops around it, so products already queued keep the precision they had. */
static void sim_set_precision(ddp_kctx_t *ctx, ddp_kprec_t prec)
{
    args_t *a = new_args(ctx, SET_PREC);
    if (!a) return;
    a->i[0] = (int)prec;
    launch(ctx, a, "set_precision", NULL, 0);
    ctx->prec = prec; /* the ops queued from here on have activations of this type */
}

/* Queued, as set_precision: the copies it drops may still be read by queued products. The
 * arena's copy is the CPU context's own memory, out of the hazard checks' sight (a GPU's too is
 * the backend's). */
static void sim_set_weights(ddp_kctx_t *ctx, const float *w, size_t n)
{
    args_t *a = new_args(ctx, SET_WEIGHTS);
    if (!a) return;
    a->p[0] = (void *)w;
    a->z[0] = n;
    launch(ctx, a, "set_weights", NULL, 0);
}

/* The simulated GPU computes with the CPU's emulation: nothing is faster in bf16, and "auto"
 * stays fp32 so that sim results remain bitwise the CPU backend's. */
static int sim_prec_native(ddp_kctx_t *ctx, ddp_kprec_t prec, const char **why)
{
    *why = prec == DDP_KPREC_FP32 ? "fp32 is native"
                                  : "the simulated GPU emulates bf16/fp16 with the CPU's ops";
    return prec == DDP_KPREC_FP32;
}

/* The elements an [N, cols] tensor with rows ld apart spans (the last row's padding is not) */
static size_t strided(int N, int cols, int ld) { return (size_t)(N - 1) * ld + cols; }

static void sim_matmul_fwd(ddp_kctx_t *ctx, ddp_act_t *out, const ddp_act_t *inp,
                           const float *weight, const float *bias, int N, int C, int OC, int ldo,
                           ddp_wlayout_t layout)
{
    args_t *a = new_args(ctx, MM_FWD);
    if (!a) return;
    set_p(a, 4, out, inp, weight, bias);
    a->i[0] = N, a->i[1] = C, a->i[2] = OC, a->i[3] = (int)layout, a->i[4] = ldo;
    LAUNCH(ctx, a, "matmul_fwd", A(out, strided(N, OC, ldo), W), A(inp, (size_t)N * C, R),
           F(weight, (size_t)C * OC, R), F(bias, OC, R));
}

static void sim_matmul_bwd(ddp_kctx_t *ctx, ddp_act_t *dinp, float *dweight, float *dbias,
                           const ddp_act_t *dout, const ddp_act_t *inp, const float *weight,
                           int N, int C, int OC, int ldo, ddp_wlayout_t layout)
{
    args_t *a = new_args(ctx, MM_BWD);
    if (!a) return;
    set_p(a, 6, dinp, dweight, dbias, dout, inp, weight);
    a->i[0] = N, a->i[1] = C, a->i[2] = OC, a->i[3] = (int)layout, a->i[4] = (int)ctx->prec;
    a->i[5] = ldo;
    LAUNCH(ctx, a, "matmul_bwd", A(dinp, (size_t)N * C, W), F(dweight, (size_t)C * OC, RW),
           F(dbias, OC, RW), A(dout, strided(N, OC, ldo), R), A(inp, (size_t)N * C, R),
           F(weight, (size_t)C * OC, R));
}

static void sim_matmul_gelu_fwd(ddp_kctx_t *ctx, ddp_act_t *out, ddp_act_t *pre,
                                const ddp_act_t *inp, const float *weight, const float *bias,
                                int N, int C, int OC, ddp_wlayout_t layout)
{
    args_t *a = new_args(ctx, MM_GELU_FWD);
    if (!a) return;
    set_p(a, 5, out, pre, inp, weight, bias);
    a->i[0] = N, a->i[1] = C, a->i[2] = OC, a->i[3] = (int)layout;
    LAUNCH(ctx, a, "matmul_gelu_fwd", A(out, (size_t)N * OC, W), A(pre, (size_t)N * OC, W),
           A(inp, (size_t)N * C, R), F(weight, (size_t)C * OC, R), F(bias, OC, R));
}

static void sim_matmul_dgelu_bwd(ddp_kctx_t *ctx, ddp_act_t *dpre, float *dweight, float *dbias,
                                 const ddp_act_t *dout, const ddp_act_t *inp,
                                 const ddp_act_t *pre, const float *weight, int N, int C, int OC,
                                 ddp_wlayout_t layout)
{
    args_t *a = new_args(ctx, MM_DGELU_BWD);
    if (!a) return;
    set_p(a, 7, dpre, dweight, dbias, dout, inp, pre, weight);
    a->i[0] = N, a->i[1] = C, a->i[2] = OC, a->i[3] = (int)layout;
    LAUNCH(ctx, a, "matmul_dgelu_bwd", A(dpre, (size_t)N * C, W), F(dweight, (size_t)C * OC, RW),
           F(dbias, OC, RW), A(dout, (size_t)N * OC, R), A(inp, (size_t)N * C, R),
           A(pre, (size_t)N * C, R), F(weight, (size_t)C * OC, R));
}

/* qkv's elements: per position NH query heads and NKV key and value heads of C / NH each */
static size_t qkv_elems(size_t BT, int C, int NH, int NKV)
{
    return BT * ((size_t)C + 2 * (size_t)NKV * (size_t)(C / NH));
}

static void sim_attention_fwd(ddp_kctx_t *ctx, ddp_act_t *out, float *lse,
                              const ddp_act_t *qkv, int B, int T, int C, int NH, int NKV)
{
    args_t *a = new_args(ctx, ATT_FWD);
    if (!a) return;
    size_t BT = (size_t)B * T;
    set_p(a, 3, out, lse, qkv);
    a->i[0] = B, a->i[1] = T, a->i[2] = C, a->i[3] = NH, a->i[4] = NKV;
    LAUNCH(ctx, a, "attention_fwd", A(out, BT * C, W), F(lse, BT * NH, W),
           A(qkv, qkv_elems(BT, C, NH, NKV), R));
}

static void sim_attention_bwd(ddp_kctx_t *ctx, ddp_act_t *dqkv, const ddp_act_t *dout,
                              const ddp_act_t *qkv, const ddp_act_t *out, const float *lse,
                              int B, int T, int C, int NH, int NKV)
{
    args_t *a = new_args(ctx, ATT_BWD);
    if (!a) return;
    size_t BT = (size_t)B * T, nq = qkv_elems(BT, C, NH, NKV);
    set_p(a, 5, dqkv, dout, qkv, out, lse);
    a->i[0] = B, a->i[1] = T, a->i[2] = C, a->i[3] = NH, a->i[4] = NKV;
    LAUNCH(ctx, a, "attention_bwd", A(dqkv, nq, W), A(dout, BT * C, R), A(qkv, nq, R),
           A(out, BT * C, R), F(lse, BT * NH, R));
}

/* RoPE rotates the q and k heads in place: every position's row is read and written (v's part
 * in between is untouched, but the row's range covers it: declared RW as a whole). */
static void sim_rope(ddp_kctx_t *ctx, int op, ddp_act_t *x, const float *rope, int B, int T,
                     int NH, int NKV, int hs)
{
    args_t *a = new_args(ctx, op);
    if (!a) return;
    set_p(a, 2, x, rope);
    a->i[0] = B, a->i[1] = T, a->i[2] = NH, a->i[3] = NKV, a->i[4] = hs;
    LAUNCH(ctx, a, op == ROPE_FWD ? "rope_fwd" : "rope_bwd",
           A(x, (size_t)B * T * (size_t)(NH + 2 * NKV) * hs, RW), F(rope, (size_t)T * hs, R));
}

static void sim_rope_fwd(ddp_kctx_t *ctx, ddp_act_t *qkv, const float *rope, int B, int T,
                         int NH, int NKV, int hs)
{
    sim_rope(ctx, ROPE_FWD, qkv, rope, B, T, NH, NKV, hs);
}

static void sim_rope_bwd(ddp_kctx_t *ctx, ddp_act_t *dqkv, const float *rope, int B, int T,
                         int NH, int NKV, int hs)
{
    sim_rope(ctx, ROPE_BWD, dqkv, rope, B, T, NH, NKV, hs);
}

static void sim_rmsnorm_fwd(ddp_kctx_t *ctx, ddp_act_t *out, float *rstd, const float *inp,
                            const float *weight, int N, int C, float eps)
{
    args_t *a = new_args(ctx, RMS_FWD);
    if (!a) return;
    size_t NC = (size_t)N * C;
    set_p(a, 4, out, rstd, inp, weight);
    a->i[0] = N, a->i[1] = C;
    a->f[0] = eps;
    LAUNCH(ctx, a, "rmsnorm_fwd", A(out, NC, W), F(rstd, N, W), F(inp, NC, R), F(weight, C, R));
}

static void sim_rmsnorm_bwd(ddp_kctx_t *ctx, float *dinp, ddp_act_t *dinp_act, float *dweight,
                            const ddp_act_t *dout, const float *inp, const float *weight,
                            const float *rstd, int N, int C)
{
    args_t *a = new_args(ctx, RMS_BWD);
    if (!a) return;
    size_t NC = (size_t)N * C;
    set_p(a, 7, dinp, dinp_act, dweight, dout, inp, weight, rstd);
    a->i[0] = N, a->i[1] = C;
    LAUNCH(ctx, a, "rmsnorm_bwd", F(dinp, NC, RW), A(dinp_act, NC, W), F(dweight, C, RW),
           A(dout, NC, R),
           F(inp, NC, R), F(weight, C, R), F(rstd, N, R));
}

static void sim_swiglu_fwd(ddp_kctx_t *ctx, ddp_act_t *out, const ddp_act_t *inp, int N, int H)
{
    args_t *a = new_args(ctx, SWIGLU_FWD);
    if (!a) return;
    size_t NH = (size_t)N * H;
    set_p(a, 2, out, inp);
    a->i[0] = N, a->i[1] = H;
    LAUNCH(ctx, a, "swiglu_fwd", A(out, NH, W), A(inp, 2 * NH, R));
}

static void sim_swiglu_bwd(ddp_kctx_t *ctx, ddp_act_t *dinp, const ddp_act_t *inp,
                           const ddp_act_t *dout, int N, int H)
{
    args_t *a = new_args(ctx, SWIGLU_BWD);
    if (!a) return;
    size_t NH = (size_t)N * H;
    set_p(a, 3, dinp, inp, dout);
    a->i[0] = N, a->i[1] = H;
    LAUNCH(ctx, a, "swiglu_bwd", A(dinp, 2 * NH, W), A(inp, 2 * NH, R), A(dout, NH, R));
}

static void sim_gelu_fwd(ddp_kctx_t *ctx, ddp_act_t *out, const ddp_act_t *inp, size_t n)
{
    args_t *a = new_args(ctx, GELU_FWD);
    if (!a) return;
    set_p(a, 2, out, inp);
    a->z[0] = n;
    LAUNCH(ctx, a, "gelu_fwd", A(out, n, W), A(inp, n, R));
}

static void sim_gelu_bwd(ddp_kctx_t *ctx, ddp_act_t *dinp, const ddp_act_t *inp,
                         const ddp_act_t *dout, size_t n)
{
    args_t *a = new_args(ctx, GELU_BWD);
    if (!a) return;
    set_p(a, 3, dinp, inp, dout);
    a->z[0] = n;
    LAUNCH(ctx, a, "gelu_bwd", A(dinp, n, W), A(inp, n, R), A(dout, n, R));
}

static void sim_residual_fwd(ddp_kctx_t *ctx, float *out, const float *x, const ddp_act_t *y,
                             size_t n)
{
    args_t *a = new_args(ctx, RESIDUAL);
    if (!a) return;
    set_p(a, 3, out, x, y);
    a->z[0] = n;
    LAUNCH(ctx, a, "residual_fwd", F(out, n, W), F(x, n, R), A(y, n, R));
}

static void sim_residual_norm_fwd(ddp_kctx_t *ctx, float *res, ddp_act_t *out, float *mean,
                                  float *rstd, const float *x, const ddp_act_t *y,
                                  const float *weight, const float *bias, int N, int C, float eps)
{
    args_t *a = new_args(ctx, RES_NORM);
    if (!a) return;
    size_t NC = (size_t)N * C;
    set_p(a, 8, res, out, mean, rstd, x, y, weight, bias);
    a->i[0] = N, a->i[1] = C;
    a->f[0] = eps;
    /* res aliasing x (the residual stream updated in place) is read as well as written */
    LAUNCH(ctx, a, "residual_norm_fwd", F(res, NC, res == x ? RW : W), A(out, NC, W),
           F(mean, N, W), F(rstd, N, W), F(x, NC, R), A(y, NC, R), F(weight, C, R),
           F(bias, C, R));
}

static void sim_to_act(ddp_kctx_t *ctx, ddp_act_t *out, const float *inp, size_t n)
{
    args_t *a = new_args(ctx, TO_ACT);
    if (!a) return;
    set_p(a, 2, out, inp);
    a->z[0] = n;
    LAUNCH(ctx, a, "to_act", A(out, n, W), F(inp, n, R));
}

static void sim_xent_fwd_bwd(ddp_kctx_t *ctx, float *losses, ddp_act_t *dlogits,
                     const ddp_act_t *logits, const int32_t *targets, int N, int V, int ld,
                     float dloss)
{
    args_t *a = new_args(ctx, XENT);
    if (!a) return;
    size_t NV = strided(N, V, ld);
    set_p(a, 4, losses, dlogits, logits, targets);
    a->i[0] = N, a->i[1] = V, a->i[2] = ld;
    a->f[0] = dloss;
    LAUNCH(ctx, a, "xent_fwd_bwd", F(losses, N, W), A(dlogits, NV, W), A(logits, NV, R),
           RANGE(targets, N, 4, R));
}

/* An op over a table of ranges: *copy gets a copy of the table (the op's, freed by run()) and
 * *acc room for nacc accesses (the caller's to fill and free after launch). NULL, with
 * DDP_ENOMEM kept, when either cannot be had. */
static args_t *new_ranged(ddp_kctx_t *ctx, int op, const void *table, size_t bytes, int nacc,
                          void **copy, ddp_simdev_access_t **acc)
{
    *copy = malloc(bytes);
    *acc = malloc((size_t)nacc * sizeof **acc);
    args_t *a = *copy && *acc ? new_args(ctx, op) : NULL;
    if (!a) {
        if (!ctx->err) ctx->err = DDP_ENOMEM;
        free(*copy), free(*acc);
        return NULL;
    }
    memcpy(*copy, table, bytes);
    return a;
}

static void sim_adamw(ddp_kctx_t *ctx, float *param, const float *grad, float *m, float *v,
                      const ddp_kadamw_range_t *ranges, int nranges, float lr, float beta1,
                      float beta2, float eps, float grad_scale, int t, uint32_t *crc)
{
    if (crc) { /* as the CUDA backend: checksums are the CPU backend's */
        if (!ctx->err) ctx->err = DDP_ENOTSUP;
        return;
    }
    if (nranges <= 0) return;
    ddp_simdev_access_t *acc;
    ddp_kadamw_range_t *copy;
    args_t *a = new_ranged(ctx, ADAMW, ranges, (size_t)nranges * sizeof *ranges, 4 * nranges,
                           (void **)&copy, &acc);
    if (!a) return;
    for (int r = 0; r < nranges; r++) {
        size_t lo = ranges[r].lo, n = ranges[r].hi - lo;
        acc[4 * r] = F(param ? param + lo : NULL, n, RW);
        acc[4 * r + 1] = F(grad ? grad + lo : NULL, n, R);
        acc[4 * r + 2] = F(m ? m + lo : NULL, n, RW);
        acc[4 * r + 3] = F(v ? v + lo : NULL, n, RW);
    }
    set_p(a, 5, param, (void *)grad, m, v, copy);
    float f[] = {lr, beta1, beta2, eps, grad_scale};
    memcpy(a->f, f, sizeof f);
    a->i[0] = t;
    a->i[1] = nranges;
    launch(ctx, a, "adamw", acc, 4 * nranges);
    free(acc);
}

static void sim_sumsq_blocks(ddp_kctx_t *ctx, float *out, const float *x,
                             const ddp_krange_t *ranges, int nranges, size_t block)
{
    if (nranges <= 0) return;
    ddp_simdev_access_t *acc;
    ddp_krange_t *copy;
    args_t *a = new_ranged(ctx, SUMSQ, ranges, (size_t)nranges * sizeof *ranges, 2 * nranges,
                           (void **)&copy, &acc);
    if (!a) return;
    for (int r = 0; r < nranges; r++) {
        size_t n = ranges[r].hi - ranges[r].lo;
        acc[2 * r] = F(out ? out + ranges[r].out : NULL, (n + block - 1) / block,
                       W | DDP_SIMDEV_HOSTSIDE);
        acc[2 * r + 1] = F(x ? x + ranges[r].lo : NULL, n, R);
    }
    set_p(a, 3, out, x, copy);
    a->i[0] = nranges;
    a->z[0] = block;
    launch(ctx, a, "sumsq_blocks", acc, 2 * nranges);
    free(acc);
    ddp_simdev_stream_sync(ctx->stream); /* a host result, as in the CUDA backend */
}

static void sim_add(ddp_kctx_t *ctx, float *y, const float *x, size_t n)
{
    args_t *a = new_args(ctx, ADD);
    if (!a) return;
    set_p(a, 2, y, x);
    a->z[0] = n;
    LAUNCH(ctx, a, "add", F(y, n, RW), F(x, n, R));
}

static void sim_scale(ddp_kctx_t *ctx, float *x, float s, size_t n)
{
    args_t *a = new_args(ctx, SCALE);
    if (!a) return;
    a->p[0] = x;
    a->f[0] = s;
    a->z[0] = n;
    LAUNCH(ctx, a, "scale", F(x, n, RW));
}

static void sim_nonfinite(ddp_kctx_t *ctx, int *out, const float *x, size_t n)
{
    args_t *a = new_args(ctx, NONFINITE);
    if (!a) return;
    set_p(a, 2, out, x);
    a->z[0] = n;
    LAUNCH(ctx, a, "nonfinite", RANGE(out, 1, sizeof(int), W | DDP_SIMDEV_HOSTSIDE), F(x, n, R));
    ddp_simdev_stream_sync(ctx->stream);
}

static const ddp_kernels_ops_t sim_ops = {
    .name = "sim",
    .coll_backend = "sim",
    .host_memory = 0,
    .gpu_memory = 0, /* simulated: pages of this process */
    .probe = sim_probe,
    .device_count = sim_device_count,
    .init = sim_init,
    .close = sim_close,
    .alloc = sim_alloc,
    .free = sim_free,
    .reserve = sim_reserve,
    .commit = sim_commit,
    .decommit = sim_decommit,
    .commit_granule = sim_commit_granule,
    .on_device = sim_on_device,
    .memcpy_h2d = sim_h2d,
    .memcpy_d2h = sim_d2h,
    .memcpy_d2d = sim_d2d,
    .memset0 = sim_memset0,
    .sync = sim_sync,
    .record_event = sim_record_event,
    .timer_mark = sim_timer_mark,
    .timer_elapsed_ms = sim_timer_elapsed_ms,
    .timer_reset = sim_timer_reset,
    .prec_native = sim_prec_native,
#define SIM_OP(name, params) .name = sim_##name,
    DDP_KERNEL_OPS(SIM_OP)
#undef SIM_OP
};

/* The module's entry point (DDP_KERNELS_MODULE_SYMBOL): returns the sim's ops table, which lives
 * as long as the module is loaded. Any thread. */
__attribute__((visibility("default"))) const ddp_kernels_ops_t *ddp_kernels_module(void)
{
    return &sim_ops;
}
