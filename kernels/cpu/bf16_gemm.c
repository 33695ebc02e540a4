/* Native bf16 matrix products on the CPU: one tile C[m,n] (+)= A[m,k] @ B[k,n] with bf16 inputs
 * and fp32 accumulation and output, run by oneDNN's matmul primitive on the calling thread.
 *
 * Why oneDNN (Debian's libdnnl, what PyTorch uses on CPUs): it JIT-compiles kernels for the
 * CPU's bf16 dot-product instructions (AVX512_BF16's vdpbf16ps, AMX tiles), which OpenBLAS 0.3.21
 * (Debian, no sbgemm) and a hand-written loop lack. Measured on a 2-vCPU AMD EPYC (Zen 4,
 * AVX512_BF16) on GPT-2 124M's shapes, each tile on one thread, two threads: 350-440 GFLOP/s
 * against 160-200 for OpenBLAS sgemm on the same tiles (tests/bench/gemm_shapes.c).
 *
 * Threading: matmul.c cuts a product into tiles by its shapes alone and runs each tile as a
 * task of the backend's pool, as it does with sgemm, so oneDNN must not start threads of its
 * own: every thread that creates or runs a primitive first sets its OpenMP team size to 1
 * (oneDNN's runtime here is OpenMP; a team of one runs inline and nothing spins). A tile's
 * result then depends on its shape only: bitwise the same for any thread count.
 *
 * Primitives: one per tile shape (m, n, k, transposes, leading dimensions, accumulate), created
 * on first use under a mutex and kept until free or a trim; a step uses a few dozen. This cache
 * is the only one: oneDNN's own primitive cache (1,024 by default) is turned off, or it would
 * keep the JIT code of every primitive trimmed here alive (measured: 14 MiB more resident over
 * 500 new shapes, as a sample's growing context makes). A primitive computes the same whatever
 * the cache held before, so results never depend on it. Each pool thread has
 * its own stream and scratchpad (user-managed, so no two threads share one).
 *
 * Loading: libdnnl is dlopen()ed the first time a process asks for native bf16 (and kept), not
 * linked: a run in fp32, or on a CPU without bf16 instructions, neither maps it (4 MiB of
 * resident relocations and OpenMP runtime) nor needs it installed. Building needs its headers
 * only (libdnnl-dev).
 */
#include "kernels/cpu/cpu.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/log.h"

#ifdef DDP_HAVE_DNNL

#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>

#include "common/alloc.h"

#define DNNL_LIBRARY "libdnnl.so.2"

/* The library's functions this file calls, resolved by dlsym (X: name). */
#define DNNL_FUNCS(X)                                                                          \
    X(dnnl_memory_desc_init_by_strides)                                                        \
    X(dnnl_memory_desc_get_size)                                                               \
    X(dnnl_matmul_desc_init)                                                                   \
    X(dnnl_primitive_attr_create)                                                              \
    X(dnnl_primitive_attr_destroy)                                                             \
    X(dnnl_primitive_attr_set_scratchpad_mode)                                                 \
    X(dnnl_primitive_attr_set_post_ops)                                                        \
    X(dnnl_post_ops_create)                                                                    \
    X(dnnl_post_ops_destroy)                                                                   \
    X(dnnl_post_ops_append_sum)                                                                \
    X(dnnl_primitive_desc_create)                                                              \
    X(dnnl_primitive_desc_destroy)                                                             \
    X(dnnl_primitive_desc_query_md)                                                            \
    X(dnnl_primitive_create)                                                                   \
    X(dnnl_primitive_destroy)                                                                  \
    X(dnnl_primitive_execute)                                                                  \
    X(dnnl_memory_create)                                                                      \
    X(dnnl_memory_destroy)                                                                     \
    X(dnnl_engine_create)                                                                      \
    X(dnnl_engine_destroy)                                                                     \
    X(dnnl_stream_create)                                                                      \
    X(dnnl_stream_destroy)                                                                     \
    X(dnnl_set_primitive_cache_capacity)

static struct {
#define DECLARE(f) __typeof__(&f) f;
    DNNL_FUNCS(DECLARE)
#undef DECLARE
    void (*omp_set_num_threads)(int); /* from the OpenMP runtime that libdnnl loads */
    int loaded;                       /* 1 when every pointer is set */
} D;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;

static void load_library(void)
{
    void *h = dlopen(DNNL_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    int ok = 1;
#define RESOLVE(f) ok &= (*(void **)&D.f = dlsym(h, #f)) != NULL;
    DNNL_FUNCS(RESOLVE)
#undef RESOLVE
    ok &= (*(void **)&D.omp_set_num_threads = dlsym(h, "omp_set_num_threads")) != NULL;
    /* trimming frees a primitive only if oneDNN keeps no copy (see the top) */
    if (ok && D.dnnl_set_primitive_cache_capacity(0) != dnnl_success) ok = 0;
    D.loaded = ok;
}

/* 1 when libdnnl is loaded with every function this file needs. */
static int library_loaded(void)
{
    pthread_once(&load_once, load_library);
    return D.loaded;
}

#define CACHE_SLOTS 1024 /* open addressing */
/* ddp__bf16_trim empties the cache past this many primitives: a training step uses a few dozen
 * shapes (GPT-2 124M: 24), a sample a few more per 64 positions of context (sample.c pads it),
 * but a caller may make a new row count per product */
#define TRIM_AT 128

typedef struct {
    int ta, tb, m, n, k, lda, ldb, ldc, acc;
} shape_t;

typedef struct {
    shape_t key;
    _Atomic int used; /* published last: the other fields are complete once it reads 1 */
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t prim;
    const dnnl_memory_desc_t *a_md, *b_md, *c_md, *scratch_md;
    size_t scratch_bytes;
} entry_t;

typedef struct {
    dnnl_stream_t stream;
    void *scratch;
    size_t scratch_bytes;
} thread_state_t;

struct ddp__bf16 {
    dnnl_engine_t engine;
    pthread_mutex_t mu; /* guards cache inserts */
    entry_t *cache;     /* CACHE_SLOTS */
    int n_entries;
    int threads;
    thread_state_t *per_thread; /* [threads], indexed by ddp__pool_self() */
    _Atomic int err;            /* first error of a tile since the last take */
};

/* oneDNN's OpenMP team for this thread: one, so a primitive runs inline (see the top). */
static void one_omp_thread(void)
{
    static _Thread_local int done;
    if (!done) {
        D.omp_set_num_threads(1);
        done = 1;
    }
}

static int map_status(dnnl_status_t s, const char *what)
{
    if (s == dnnl_success) return 0;
    DDP_ERROR("oneDNN: %s failed (status %d)", what, (int)s);
    return s == dnnl_out_of_memory ? DDP_ENOMEM : DDP_ENOTSUP;
}

static unsigned hash_shape(const shape_t *s)
{
    unsigned h = 2166136261u;
    const int *v = (const int *)s;
    for (size_t i = 0; i < sizeof *s / sizeof(int); i++) h = (h ^ (unsigned)v[i]) * 16777619u;
    return h;
}

static int create_prim(ddp__bf16_t *b, entry_t *e, const shape_t *s)
{
    dnnl_memory_desc_t a, w, c;
    dnnl_dims_t da = {s->m, s->k}, dw = {s->k, s->n}, dc = {s->m, s->n};
    dnnl_dims_t sa = {s->ta ? 1 : s->lda, s->ta ? s->lda : 1};
    dnnl_dims_t sw = {s->tb ? 1 : s->ldb, s->tb ? s->ldb : 1};
    dnnl_dims_t sc = {s->ldc, 1};
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t post = NULL;
    dnnl_matmul_desc_t md;
    int rc = map_status(D.dnnl_memory_desc_init_by_strides(&a, 2, da, dnnl_bf16, sa), "src desc");
    if (!rc) rc = map_status(D.dnnl_memory_desc_init_by_strides(&w, 2, dw, dnnl_bf16, sw), "wei desc");
    if (!rc) rc = map_status(D.dnnl_memory_desc_init_by_strides(&c, 2, dc, dnnl_f32, sc), "dst desc");
    if (!rc) rc = map_status(D.dnnl_matmul_desc_init(&md, &a, &w, NULL, &c), "matmul desc");
    if (!rc) rc = map_status(D.dnnl_primitive_attr_create(&attr), "attr");
    if (!rc)
        rc = map_status(D.dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user),
                        "scratchpad mode");
    if (!rc && s->acc) {
        rc = map_status(D.dnnl_post_ops_create(&post), "post-ops");
        if (!rc) rc = map_status(D.dnnl_post_ops_append_sum(post, 1.0f), "sum post-op");
        if (!rc) rc = map_status(D.dnnl_primitive_attr_set_post_ops(attr, post), "set post-ops");
    }
    if (!rc)
        rc = map_status(D.dnnl_primitive_desc_create(&e->pd, &md, attr, b->engine, NULL),
                        "matmul primitive desc");
    if (!rc) rc = map_status(D.dnnl_primitive_create(&e->prim, e->pd), "matmul primitive");
    if (post) D.dnnl_post_ops_destroy(post);
    if (attr) D.dnnl_primitive_attr_destroy(attr);
    if (rc) {
        if (e->pd) D.dnnl_primitive_desc_destroy(e->pd);
        e->pd = NULL;
        return rc;
    }
    e->a_md = D.dnnl_primitive_desc_query_md(e->pd, dnnl_query_src_md, 0);
    e->b_md = D.dnnl_primitive_desc_query_md(e->pd, dnnl_query_weights_md, 0);
    e->c_md = D.dnnl_primitive_desc_query_md(e->pd, dnnl_query_dst_md, 0);
    e->scratch_md = D.dnnl_primitive_desc_query_md(e->pd, dnnl_query_scratchpad_md, 0);
    e->scratch_bytes = D.dnnl_memory_desc_get_size(e->scratch_md);
    e->key = *s;
    return 0;
}

/* The primitive of shape s, created on first use. Lookups of entries already made take no lock:
 * an entry is published (used = 1, release) only when complete and is never changed after. */
static int lookup(ddp__bf16_t *b, const shape_t *s, const entry_t **out)
{
    unsigned h = hash_shape(s) % CACHE_SLOTS;
    for (unsigned i = 0; i < CACHE_SLOTS; i++) {
        entry_t *e = &b->cache[(h + i) % CACHE_SLOTS];
        if (!atomic_load_explicit(&e->used, memory_order_acquire)) break;
        if (!memcmp(&e->key, s, sizeof *s)) {
            *out = e;
            return 0;
        }
    }
    pthread_mutex_lock(&b->mu);
    int rc = DDP_ENOMEM;
    for (unsigned i = 0; i < CACHE_SLOTS; i++) {
        entry_t *e = &b->cache[(h + i) % CACHE_SLOTS];
        if (e->used && !memcmp(&e->key, s, sizeof *s)) { /* made by another thread meanwhile */
            *out = e;
            rc = 0;
            break;
        }
        if (!e->used) { /* unpublished: lock-free readers stop here and read nothing else */
            if (b->n_entries + 1 >= CACHE_SLOTS / 2) break; /* keep probes short */
            rc = create_prim(b, e, s);
            if (!rc) {
                atomic_store_explicit(&e->used, 1, memory_order_release);
                b->n_entries++;
                *out = e;
            }
            break;
        }
    }
    pthread_mutex_unlock(&b->mu);
    return rc;
}

/* This thread's stream and a scratchpad of at least `bytes`. */
static int thread_state(ddp__bf16_t *b, size_t bytes, thread_state_t **out)
{
    int self = ddp__pool_self();
    if (self < 0 || self >= b->threads) return DDP_EINVAL;
    thread_state_t *t = &b->per_thread[self];
    if (!t->stream) {
        int rc = map_status(D.dnnl_stream_create(&t->stream, b->engine, dnnl_stream_default_flags),
                            "stream");
        if (rc) return rc;
    }
    if (bytes > t->scratch_bytes) {
        void *p = ddp_aligned_alloc(64, (bytes + 63) / 64 * 64);
        if (!p) return DDP_ENOMEM;
        free(t->scratch);
        t->scratch = p;
        t->scratch_bytes = bytes;
    }
    *out = t;
    return 0;
}

static int run(ddp__bf16_t *b, const shape_t *s, const uint16_t *A, const uint16_t *B, float *C)
{
    one_omp_thread();
    const entry_t *e;
    thread_state_t *t;
    int rc = lookup(b, s, &e);
    if (!rc) rc = thread_state(b, e->scratch_bytes, &t);
    if (rc) return rc;
    dnnl_memory_t mem[4] = {NULL, NULL, NULL, NULL};
    rc = map_status(D.dnnl_memory_create(&mem[0], e->a_md, b->engine, (void *)A), "memory");
    if (!rc) rc = map_status(D.dnnl_memory_create(&mem[1], e->b_md, b->engine, (void *)B), "memory");
    if (!rc) rc = map_status(D.dnnl_memory_create(&mem[2], e->c_md, b->engine, C), "memory");
    if (!rc)
        rc = map_status(D.dnnl_memory_create(&mem[3], e->scratch_md, b->engine, t->scratch),
                        "memory");
    if (!rc) {
        dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, mem[0]},
                                   {DNNL_ARG_WEIGHTS, mem[1]},
                                   {DNNL_ARG_DST, mem[2]},
                                   {DNNL_ARG_SCRATCHPAD, mem[3]}};
        rc = map_status(D.dnnl_primitive_execute(e->prim, t->stream, 4, args), "matmul");
    }
    for (int i = 0; i < 4; i++)
        if (mem[i]) D.dnnl_memory_destroy(mem[i]);
    return rc;
}

void ddp__bf16_gemm(ddp__bf16_t *b, int ta, int tb, int m, int n, int k, const uint16_t *A,
                    int lda, const uint16_t *B, int ldb, int accumulate, float *C, int ldc)
{
    if (m <= 0 || n <= 0) return;
    if (k <= 0) { /* an empty sum: oneDNN refuses K = 0 */
        if (!accumulate)
            for (int r = 0; r < m; r++) memset(C + (size_t)r * ldc, 0, (size_t)n * sizeof(float));
        return;
    }
    shape_t s = {.ta = !!ta, .tb = !!tb, .m = m, .n = n, .k = k, .lda = lda, .ldb = ldb,
                 .ldc = ldc, .acc = !!accumulate};
    int rc = run(b, &s, A, B, C);
    int none = 0;
    if (rc) atomic_compare_exchange_strong(&b->err, &none, rc);
}

int ddp__bf16_take_error(ddp__bf16_t *b) { return atomic_exchange(&b->err, 0); }

/* Destroys every cached primitive (the caller guarantees no tile runs). */
static void clear_cache(ddp__bf16_t *b)
{
    for (int i = 0; i < CACHE_SLOTS; i++) {
        entry_t *e = &b->cache[i];
        if (!e->used) continue;
        D.dnnl_primitive_destroy(e->prim);
        D.dnnl_primitive_desc_destroy(e->pd);
        memset(&e->key, 0, sizeof e->key);
        e->pd = NULL;
        e->prim = NULL;
        atomic_store(&e->used, 0);
    }
    b->n_entries = 0;
}

void ddp__bf16_trim(ddp__bf16_t *b)
{
    if (b->n_entries > TRIM_AT) clear_cache(b);
}

int ddp__bf16_probe(const char **why)
{
#if defined(__x86_64__)
    if (!__builtin_cpu_supports("avx512bf16")) {
        *why = "this CPU has no bf16 instructions (no AVX512_BF16/AMX): bf16 products are "
               "emulated (inputs rounded, OpenBLAS sgemm), correct but not faster than fp32";
        return 0;
    }
    if (!library_loaded()) {
        *why = "this CPU has AVX512_BF16, but " DNNL_LIBRARY " (Debian: libdnnl2) could not be "
               "loaded: bf16 products are emulated, correct but not faster than fp32";
        return 0;
    }
    *why = "this CPU multiplies bf16 natively (AVX512_BF16, oneDNN)";
    return 1;
#else
    *why = "native bf16 products are built for x86-64 CPUs with AVX512_BF16 only";
    return 0;
#endif
}

int ddp__bf16_new(ddp__bf16_t **out, int threads)
{
    *out = NULL;
    const char *why;
    if (!ddp__bf16_probe(&why)) return DDP_ENOTSUP;
    one_omp_thread();
    ddp__bf16_t *b = ddp_calloc(1, sizeof *b);
    if (!b) return DDP_ENOMEM;
    b->threads = threads;
    b->cache = ddp_calloc(CACHE_SLOTS, sizeof *b->cache);
    b->per_thread = ddp_calloc((size_t)threads, sizeof *b->per_thread);
    pthread_mutex_init(&b->mu, NULL);
    int rc = b->cache && b->per_thread ? 0 : DDP_ENOMEM;
    if (!rc) rc = map_status(D.dnnl_engine_create(&b->engine, dnnl_cpu, 0), "engine");
    if (rc) {
        ddp__bf16_free(b);
        return rc;
    }
    *out = b;
    return 0;
}

void ddp__bf16_free(ddp__bf16_t *b)
{
    if (!b) return;
    if (b->cache) clear_cache(b);
    for (int i = 0; b->per_thread && i < b->threads; i++) {
        if (b->per_thread[i].stream) D.dnnl_stream_destroy(b->per_thread[i].stream);
        free(b->per_thread[i].scratch);
    }
    if (b->engine) D.dnnl_engine_destroy(b->engine);
    pthread_mutex_destroy(&b->mu);
    free(b->cache);
    free(b->per_thread);
    free(b);
}

#else /* built without oneDNN's headers */

int ddp__bf16_probe(const char **why)
{
    *why = "this build has no oneDNN (libdnnl-dev): bf16 products are emulated (inputs rounded, "
           "OpenBLAS sgemm), correct but not faster than fp32";
    return 0;
}

int ddp__bf16_new(ddp__bf16_t **out, int threads)
{
    (void)threads;
    *out = NULL;
    return DDP_ENOTSUP;
}

void ddp__bf16_free(ddp__bf16_t *b) { (void)b; }

void ddp__bf16_trim(ddp__bf16_t *b) { (void)b; }

void ddp__bf16_gemm(ddp__bf16_t *b, int ta, int tb, int m, int n, int k, const uint16_t *A,
                    int lda, const uint16_t *B, int ldb, int accumulate, float *C, int ldc)
{
    (void)b, (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)A, (void)lda, (void)B;
    (void)ldb, (void)accumulate, (void)C, (void)ldc;
}

int ddp__bf16_take_error(ddp__bf16_t *b)
{
    (void)b;
    return DDP_ENOTSUP;
}

#endif

void ddp__bf16_run(ddp_kctx_t *ctx, ddp__bf16_t *b, long ntasks, ddp__task_fn fn, void *arg)
{
    if (b) ddp__bf16_trim(b); /* no tile runs between ops */
    ddp__pool_run(ctx->pool, ntasks, fn, arg);
    int rc = b ? ddp__bf16_take_error(b) : 0;
    if (rc && !ctx->err) ctx->err = rc;
}

int ddp_kernels_cpu_bf16(const char **why)
{
    const char *force = getenv("DDP_CPU_BF16");
    if (force && !strcmp(force, "emulate")) {
        *why = "bf16 products are emulated (DDP_CPU_BF16=emulate): correct, not faster than fp32";
        return 0;
    }
    return ddp__bf16_probe(why);
}
