/* Collectives: the ring all-reduce and broadcast over shared memory and TCP between real
 * processes on loopback (1-4 ranks), over the in-process fake transport, and the world of one;
 * odd and chunk-multiple counts, sum and average, fp32 and bf16, checked against a serial double
 * sum and bitwise between two runs; the single-pass path on memory from ddp_coll_mem_alloc
 * (shared on one host, private over TCP), mixed with the ring's; reduce-scatter and all-gather
 * on both kinds of memory; argument validation; the TCP link's caller-memory operations (send_from, recv_post,
 * detach) between two processes.
 */
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <poll.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "collectives/transport.h"
#include "world.h"

/* 2 rounds of 4 ranks' 512 KiB fp32 segments: a multiple of the chunk size */
#define CHUNK_MULT ((size_t)(512 * 1024 / 4) * 4 * 2)

static const size_t counts[] = {0, 1, 7, 1000003, CHUNK_MULT};

/* ddp_coll_transfer from every root to every set of receivers: receivers get root's bytes,
 * every other rank's buffer is untouched (NULL on half of those ranks: never read or written),
 * and an all-reduce queued behind each transfer still sums right. */
static int check_transfers(ddp_coll_t *c)
{
    int n = ddp_coll_size(c), me = ddp_coll_rank(c);
    size_t bytes = 1024 * 1024 + 3;
    unsigned char *bb = malloc(bytes), receivers[8];
    ddp_errinfo_t ei;
    for (int root = 0; root < n; root++)
        for (unsigned set = 0; set < (1u << n); set++) {
            for (int r = 0; r < n; r++) receivers[r] = (set >> r) & 1;
            int keeps = me != root && receivers[me];
            unsigned char mark = (unsigned char)(0xA0 + set);
            for (size_t i = 0; i < bytes; i++)
                bb[i] = me == root ? (unsigned char)(i * 7 + set) : mark;
            void *buf = (keeps || me == root || (set + (unsigned)me) % 2) ? bb : NULL;
            ddp_coll_req_t *t, *a;
            float one = 1;
            if (ddp_coll_transfer(c, buf, bytes, root, receivers, &t)) W_FAIL("transfer submit");
            if (ddp_coll_allreduce(c, &one, 1, DDP_DT_F32, DDP_OP_SUM, &a)) W_FAIL("submit");
            int rc = ddp_coll_wait(t, 0, &ei);
            if (rc == 0) rc = ddp_coll_wait(a, 0, &ei);
            if (rc) W_FAIL("transfer from %d to set %u: %s", root, set, ei.msg);
            for (size_t i = 0; i < bytes; i++) {
                unsigned char want = (keeps || me == root) ? (unsigned char)(i * 7 + set) : mark;
                if (bb[i] != want)
                    W_FAIL("transfer from %d to set %u: byte %zu = %u, want %u", root, set, i,
                           bb[i], want);
            }
            if (one != (float)n) W_FAIL("all-reduce after a transfer: %g", one);
        }
    free(bb);
    return 0;
}

static int full_suite(ddp_coll_t *c, int coll_mem)
{
    uint32_t seed = 1;
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
        for (int dt = 0; dt < 2; dt++)
            for (int op = 0; op < 2; op++)
                if (w_check_allreduce_in(c, counts[k], (ddp_dtype_t)dt, (ddp_redop_t)op, seed++,
                                         coll_mem))
                    return 1;
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
        for (int dt = 0; dt < 2; dt++)
            for (int op = 0; op < 2; op++)
                if (w_check_scatter_gather(c, counts[k], (ddp_dtype_t)dt, (ddp_redop_t)op, seed++,
                                         coll_mem))
                    return 1;
    /* several buckets in flight at once, then one wait for all (the reducer's pattern), with a
     * small malloc()ed all-reduce between them (the ring's path amid the single-pass one) */
    size_t nb = 6, per = 300001;
    ddp_errinfo_t ei;
    float *arena, small[3] = {1, 2, 3};
    if (coll_mem) {
        if (ddp_coll_mem_alloc(c, sizeof(float) * nb * per, (void **)&arena, &ei))
            W_FAIL("ddp_coll_mem_alloc: %s", ei.msg);
    } else {
        arena = malloc(sizeof(float) * nb * per);
    }
    int n = ddp_coll_size(c), me = ddp_coll_rank(c);
    for (size_t i = 0; i < nb * per; i++) arena[i] = (float)(me + 1) * (float)(i % 97);
    ddp_coll_req_t *req[7];
    for (size_t b = 0; b < nb; b++) {
        if (ddp_coll_allreduce(c, arena + b * per, per, DDP_DT_F32, DDP_OP_SUM, &req[b]))
            W_FAIL("submit bucket %zu", b);
        if (b == 2 && ddp_coll_allreduce(c, small, 3, DDP_DT_F32, DDP_OP_SUM, &req[6]))
            W_FAIL("submit small");
    }
    int rc = ddp_coll_wait_all(c, ddp_now_ns() + 20000000000LL, &ei);
    if (rc) W_FAIL("wait_all: %s: %s", ddp_err_name(rc), ei.msg);
    float tri = (float)(n * (n + 1) / 2);
    for (size_t i = 0; i < nb * per; i++)
        if (arena[i] != tri * (float)(i % 97)) W_FAIL("bucket element %zu = %g", i, arena[i]);
    if (small[0] != (float)n || small[2] != (float)(3 * n)) W_FAIL("small all-reduce %g", small[0]);
    if (coll_mem)
        ddp_coll_mem_free(c, arena);
    else
        free(arena);
    /* broadcast from every root, odd size */
    size_t bytes = 3 * 1024 * 1024 + 5;
    unsigned char *bb = malloc(bytes);
    for (int root = 0; root < n; root++) {
        for (size_t i = 0; i < bytes; i++)
            bb[i] = me == root ? (unsigned char)(i * 31 + (size_t)root) : 0xEE;
        ddp_coll_req_t *r;
        if (ddp_coll_broadcast(c, bb, bytes, root, &r)) W_FAIL("broadcast submit");
        if ((rc = ddp_coll_wait(r, 0, &ei))) W_FAIL("broadcast: %s", ei.msg);
        for (size_t i = 0; i < bytes; i++)
            if (bb[i] != (unsigned char)(i * 31 + (size_t)root))
                W_FAIL("broadcast from %d: byte %zu = %u", root, i, bb[i]);
    }
    free(bb);
    if (check_transfers(c)) return 1;
    if ((rc = ddp_coll_barrier(c, ddp_now_ns() + 10000000000LL, &ei))) W_FAIL("barrier: %s", ei.msg);
    return 0;
}

typedef struct {
    const char *transport; /* expected transport name */
    int coll_mem;          /* buffers from ddp_coll_mem_alloc */
    int shared;            /* ... which must then be shared (1) or private (0) */
} expect_t;

static int suite_and_transport(ddp_coll_t *c, void *arg)
{
    const expect_t *e = arg;
    if (strcmp(ddp_coll_transport_name(c), e->transport))
        W_FAIL("transport %s, expected %s", ddp_coll_transport_name(c), e->transport);
    if (e->coll_mem) {
        void *p;
        ddp_errinfo_t ei;
        if (ddp_coll_mem_alloc(c, 12345, &p, &ei)) W_FAIL("ddp_coll_mem_alloc: %s", ei.msg);
        if (ddp_coll_mem_shared(c, (char *)p + 100) != e->shared)
            W_FAIL("collective memory shared = %d, expected %d", !e->shared, e->shared);
        if (((char *)p)[12344] != 0) W_FAIL("collective memory not zeroed");
        ddp_coll_mem_free(c, p);
    }
    return full_suite(c, e->coll_mem);
}

static void run_world_mem(int n, const char *transport, const char *expect, int coll_mem,
                          int shared)
{
    w_cfg_t cfg = {.n = n, .transport = transport};
    expect_t e = {.transport = expect, .coll_mem = coll_mem, .shared = shared};
    int failed = w_run(cfg, suite_and_transport, &e, 60);
    assert_int_equal(failed, 0);
}

static void run_world(int n, const char *transport, const char *expect)
{
    run_world_mem(n, transport, expect, 0, 0);
}

/* The single-pass path and the ring give bitwise the same sums for two ranks (addition commutes);
 * the single-pass one leaves no segment behind in /dev/shm. */
static int same_as_ring(ddp_coll_t *c, void *arg)
{
    (void)arg;
    size_t count = 1000003;
    float *shared, *plain = malloc(count * sizeof(float));
    ddp_errinfo_t ei;
    if (ddp_coll_mem_alloc(c, count * sizeof(float), (void **)&shared, &ei))
        W_FAIL("ddp_coll_mem_alloc: %s", ei.msg);
    w_fill(shared, count, DDP_DT_F32, ddp_coll_rank(c), 5);
    w_fill(plain, count, DDP_DT_F32, ddp_coll_rank(c), 5);
    ddp_coll_req_t *r1, *r2;
    if (ddp_coll_allreduce(c, shared, count, DDP_DT_F32, DDP_OP_AVG, &r1) ||
        ddp_coll_allreduce(c, plain, count, DDP_DT_F32, DDP_OP_AVG, &r2))
        W_FAIL("submit");
    if (ddp_coll_wait(r1, 0, &ei) || ddp_coll_wait(r2, 0, &ei)) W_FAIL("wait: %s", ei.msg);
    if (memcmp(shared, plain, count * sizeof(float))) W_FAIL("single-pass and ring sums differ");
    char cmd[160];
    snprintf(cmd, sizeof cmd, "ls /dev/shm | grep -q '^ddp-coll\\.%d\\.'", (int)getpid());
    if (ddp_coll_barrier(c, 0, &ei)) W_FAIL("barrier: %s", ei.msg);
    if (ddp_coll_rank(c) == 0 && system(cmd) == 0) W_FAIL("a segment was left in /dev/shm");
    ddp_coll_mem_free(c, shared);
    free(plain);
    return 0;
}

static void test_shm_2(void **s) { run_world(2, "auto", "shm"); }
static void test_shm_3(void **s) { run_world(3, "auto", "shm"); }
static void test_shm_4(void **s) { run_world(4, "auto", "shm"); }
static void test_tcp_2(void **s) { run_world(2, "tcp", "tcp"); }
static void test_tcp_3(void **s) { run_world(3, "tcp", "tcp"); }
static void test_tcp_1(void **s) { run_world(1, "tcp", "self"); }
static void test_mem_shm_2(void **s) { run_world_mem(2, "auto", "shm", 1, 1); }
static void test_mem_shm_3(void **s) { run_world_mem(3, "auto", "shm", 1, 1); }
static void test_mem_shm_4(void **s) { run_world_mem(4, "auto", "shm", 1, 1); }
static void test_mem_tcp_2(void **s) { run_world_mem(2, "tcp", "tcp", 1, 0); }
static void test_mem_single(void **s) { run_world_mem(1, "auto", "self", 1, 0); }

/* A /dev/shm too small for the buffers (as in containers): collective memory stays private on
 * every rank and the results are right. Needs a private mount namespace (root), else skipped. */
static void test_mem_small_devshm(void **s)
{
    pid_t p = fork();
    if (p == 0) {
        if (unshare(CLONE_NEWNS) || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) ||
            mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=8k"))
            _exit(77);
        w_cfg_t cfg = {.n = 2, .transport = "auto"};
        expect_t e = {.transport = "shm", .coll_mem = 1, .shared = 0};
        _exit(w_run(cfg, suite_and_transport, &e, 60) ? 1 : 0);
    }
    int st;
    assert_int_equal(waitpid(p, &st, 0), p);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == 77) skip();
    assert_int_equal(WEXITSTATUS(st), 0);
}

static void test_mem_same_as_ring(void **s)
{
    w_cfg_t cfg = {.n = 2, .transport = "auto"};
    assert_int_equal(w_run(cfg, same_as_ring, NULL, 60), 0);
}

static void test_single(void **s)
{
    ddp_coll_bootstrap_t *bs;
    ddp_coll_t *c;
    ddp_errinfo_t ei;
    assert_int_equal(ddp_coll_bootstrap_single(&bs, &ei), 0);
    assert_int_equal(ddp_coll_new(bs, NULL, &c, &ei), 0);
    ddp_coll_bootstrap_free(bs);
    assert_int_equal(ddp_coll_size(c), 1);
    assert_string_equal(ddp_coll_backend_name(c), "ring");
    assert_int_equal(full_suite(c, 0), 0);
    ddp_coll_free(c);
}

static void test_args(void **s)
{
    ddp_coll_bootstrap_t *bs;
    ddp_coll_t *c;
    ddp_errinfo_t ei;
    ddp_coll_req_t *r;
    float x = 1;
    assert_int_equal(ddp_coll_bootstrap_single(&bs, &ei), 0);
    ddp_coll_opts_t o = {.backend = "nonesuch"};
    assert_int_equal(ddp_coll_new(bs, &o, &c, &ei), DDP_EINVAL);
    o.backend = "nccl";
    setenv("DDP_COLL_PATH", "/nonexistent", 1);
    assert_int_equal(ddp_coll_new(bs, &o, &c, &ei), DDP_ENODEV);
    assert_non_null(strstr(ei.msg, "nccl"));
    assert_int_equal(ddp_coll_new(bs, NULL, &c, &ei), 0);
    ddp_coll_bootstrap_free(bs);
    assert_int_equal(ddp_coll_allreduce(NULL, &x, 1, DDP_DT_F32, DDP_OP_SUM, &r), DDP_EINVAL);
    assert_int_equal(ddp_coll_allreduce(c, NULL, 1, DDP_DT_F32, DDP_OP_SUM, &r), DDP_EINVAL);
    assert_int_equal(ddp_coll_allreduce(c, &x, 1, (ddp_dtype_t)7, DDP_OP_SUM, &r), DDP_EINVAL);
    assert_int_equal(ddp_coll_allreduce(c, &x, 1, DDP_DT_F32, (ddp_redop_t)9, &r), DDP_EINVAL);
    assert_int_equal(ddp_coll_broadcast(c, &x, 4, 1, &r), DDP_EINVAL);
    assert_int_equal(ddp_coll_wait(NULL, 0, NULL), 0);
    assert_string_equal(ddp_coll_last_error(c), "");
    ddp_coll_abort(c, DDP_EABORTED, "test abort");
    assert_int_equal(ddp_coll_status(c), DDP_EABORTED);
    assert_int_equal(ddp_coll_allreduce(c, &x, 1, DDP_DT_F32, DDP_OP_SUM, &r), DDP_EABORTED);
    assert_string_equal(ddp_coll_last_error(c), "test abort");
    ddp_coll_free(c);
    /* environment bootstrap errors name the variable */
    setenv("DDP_WORLD_SIZE", "2", 1);
    unsetenv("DDP_RANK");
    assert_int_equal(ddp_coll_bootstrap_env(&bs, &ei), DDP_EINVAL);
    assert_non_null(strstr(ei.msg, "DDP_RANK"));
    setenv("DDP_RANK", "0", 1);
    unsetenv("DDP_RDZV");
    assert_int_equal(ddp_coll_bootstrap_env(&bs, &ei), DDP_EINVAL);
    assert_non_null(strstr(ei.msg, "DDP_RDZV"));
    unsetenv("DDP_WORLD_SIZE");
    unsetenv("DDP_RANK");
    unsetenv("DDP_COLL_PATH");
}

/* ddp_coll_slice: consecutive slices in rank order that cover the buffer, starting at multiples
 * of DDP_COLL_SLICE_ELEMS, about equal. */
static void test_slice(void **s)
{
    const size_t B = DDP_COLL_SLICE_ELEMS, counts2[] = {0, 1, B - 1, B, B + 1, 7 * B, 1000003};
    for (size_t k = 0; k < sizeof counts2 / sizeof counts2[0]; k++)
        for (int n = 1; n <= 5; n++) {
            size_t end = 0, most = 0;
            for (int r = 0; r < n; r++) {
                size_t lo, hi;
                ddp_coll_slice(counts2[k], n, r, &lo, &hi);
                assert_int_equal(lo, end);
                assert_true(hi >= lo);
                assert_true(lo % B == 0 || lo == counts2[k]);
                most = hi - lo > most ? hi - lo : most;
                end = hi;
            }
            assert_int_equal(end, counts2[k]);
            assert_true(most <= (counts2[k] + (size_t)n * B) / (size_t)n);
        }
}

static void test_bf16_rounding(void **s)
{
    assert_int_equal(ddp__f32_to_bf16(1.0f), 0x3f80);
    /* 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0) */
    assert_int_equal(ddp__f32_to_bf16(1.00390625f), 0x3f80);
    /* 1 + 3 * 2^-8 is halfway: ties to even (1 + 2^-6) */
    assert_int_equal(ddp__f32_to_bf16(1.01171875f), 0x3f82);
    assert_true(isnan(ddp__bf16_to_f32(ddp__f32_to_bf16(NAN))));
}

typedef struct {
    ddp_coll_fake_world_t *w;
    int rank;
    int delay_us;
    int rc;
    double seconds;
} fake_arg_t;

static void *fake_rank(void *p)
{
    fake_arg_t *a = p;
    ddp_coll_opts_t o = {.chunk_delay_us = a->delay_us};
    ddp_coll_t *c;
    a->rc = ddp_coll_new_fake(a->w, a->rank, &o, &c);
    if (a->rc) return NULL;
    int64_t t0 = ddp_now_ns();
    if (a->delay_us)
        a->rc = w_check_allreduce(c, CHUNK_MULT, DDP_DT_F32, DDP_OP_AVG, 5);
    else
        a->rc = full_suite(c, 0);
    a->seconds = (double)(ddp_now_ns() - t0) * 1e-9;
    ddp_coll_free(c);
    return NULL;
}

static void run_fake(int n, int delay_us, double *seconds)
{
    ddp_coll_fake_world_t *w;
    assert_int_equal(ddp_coll_fake_world_new(n, &w), 0);
    pthread_t th[4];
    fake_arg_t a[4];
    for (int r = 0; r < n; r++) {
        a[r] = (fake_arg_t){.w = w, .rank = r, .delay_us = delay_us};
        pthread_create(&th[r], NULL, fake_rank, &a[r]);
    }
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++) assert_int_equal(a[r].rc, 0);
    if (seconds) *seconds = a[0].seconds;
    ddp_coll_fake_world_free(w);
}

static void test_fake_3(void **s) { run_fake(3, 0, NULL); }

static void test_fake_delay(void **s)
{
    /* 2 runs x 2 rounds x 2 steps x 2 chunks sent per round... each chunk sent sleeps 20 ms:
     * the delayed run must take measurably longer than the chunk count times the delay */
    double secs;
    run_fake(2, 20000, &secs);
    assert_true(secs > 0.2);
}

/* Device memory staged through the host (ddp_coll_device_t), on 2 fake ranks: a pretend device
 * (a region the test owns, copied in and out by counting functions). Each operation gets the
 * right result in the "device" buffer, and exactly the part it reads is copied in and the part
 * it writes copied out: an all-reduce all of it both ways, a reduce-scatter all in and this
 * rank's slice out, an all-gather the slice in and all out, a broadcast in at the root only and
 * out elsewhere only; a host buffer is not staged; a device event needs no waiting. */
typedef struct {
    char *base;
    size_t bytes, in, out; /* bytes copied to the host (d2h) and back (h2d) */
} pretend_dev_t;

static int dev_on(void *arg, const void *p, size_t n)
{
    pretend_dev_t *d = arg;
    return (const char *)p >= d->base && (const char *)p + n <= d->base + d->bytes;
}

static int dev_d2h(void *arg, void *dst, const void *src, size_t n)
{
    ((pretend_dev_t *)arg)->in += n;
    memcpy(dst, src, n);
    return 0;
}

static int dev_h2d(void *arg, void *dst, const void *src, size_t n)
{
    ((pretend_dev_t *)arg)->out += n;
    memcpy(dst, src, n);
    return 0;
}

typedef struct {
    ddp_coll_fake_world_t *w;
    int rank, rc, abort;
} staged_arg_t;

#define STAGED_COUNT (3 * DDP_COLL_SLICE_ELEMS + 5)

/* Runs one operation on the device buffer and checks the bytes staged each way. */
static int staged_op(ddp_coll_t *c, pretend_dev_t *d, int kind, size_t want_in, size_t want_out)
{
    ddp_coll_req_t *r = NULL;
    float *x = (float *)d->base;
    int rc = kind == DDP__REQ_ALLREDUCE
                 ? ddp_coll_allreduce(c, x, STAGED_COUNT, DDP_DT_F32, DDP_OP_SUM, &r)
             : kind == DDP__REQ_REDUCE_SCATTER
                 ? ddp_coll_reduce_scatter(c, x, STAGED_COUNT, DDP_DT_F32, DDP_OP_SUM, &r)
             : kind == DDP__REQ_ALLGATHER ? ddp_coll_allgather(c, x, STAGED_COUNT, DDP_DT_F32, &r)
                                          : ddp_coll_broadcast(c, x, STAGED_COUNT * 4, 0, &r);
    if (rc == 0) rc = ddp_coll_wait(r, 0, NULL);
    if (rc) W_FAIL("kind %d: %s", kind, ddp_strerror(rc));
    if (d->in != want_in || d->out != want_out)
        W_FAIL("kind %d: staged %zu in and %zu out, want %zu and %zu", kind, d->in, d->out,
               want_in, want_out);
    d->in = d->out = 0;
    return 0;
}

static int staged_rank(ddp_coll_fake_world_t *w, int rank)
{
    size_t n = STAGED_COUNT, bytes = n * 4, lo, hi;
    float *x = malloc(bytes);
    pretend_dev_t d = {(char *)x, bytes, 0, 0};
    ddp_coll_device_t dev = {&d, dev_on, dev_d2h, dev_h2d};
    ddp_coll_opts_t o = {.device = &dev};
    ddp_coll_t *c;
    if (!x || ddp_coll_new_fake(w, rank, &o, &c)) W_FAIL("setup");
    ddp_coll_slice(n, 2, rank, &lo, &hi);
    size_t slice = (hi - lo) * 4;
    for (size_t i = 0; i < n; i++) x[i] = (float)(i % 97) + (float)rank;
    if (staged_op(c, &d, DDP__REQ_ALLREDUCE, bytes, bytes)) return 1;
    for (size_t i = 0; i < n; i++)
        if (x[i] != (float)(2 * (i % 97) + 1)) W_FAIL("all-reduce: x[%zu] = %g", i, x[i]);
    for (size_t i = 0; i < n; i++) x[i] = (float)rank;
    if (staged_op(c, &d, DDP__REQ_REDUCE_SCATTER, bytes, slice)) return 1;
    for (size_t i = lo; i < hi; i++)
        if (x[i] != 1.0f) W_FAIL("reduce-scatter: x[%zu] = %g", i, x[i]);
    for (size_t i = 0; i < n; i++) x[i] = i >= lo && i < hi ? (float)i : -1.0f;
    if (staged_op(c, &d, DDP__REQ_ALLGATHER, slice, bytes)) return 1;
    for (size_t i = 0; i < n; i++)
        if (x[i] != (float)i) W_FAIL("all-gather: x[%zu] = %g", i, x[i]);
    for (size_t i = 0; i < n; i++) x[i] = rank ? 0.0f : (float)(i % 13);
    if (staged_op(c, &d, DDP__REQ_BCAST, rank ? 0 : bytes, rank ? bytes : 0)) return 1;
    for (size_t i = 0; i < n; i++)
        if (x[i] != (float)(i % 13)) W_FAIL("broadcast: x[%zu] = %g", i, x[i]);
    float h = 1.0f; /* host memory: not staged */
    ddp_coll_req_t *r;
    if (ddp_coll_allreduce(c, &h, 1, DDP_DT_F32, DDP_OP_SUM, &r) || ddp_coll_wait(r, 0, NULL) ||
        h != 2.0f || d.in || d.out)
        W_FAIL("host buffer: %g, staged %zu in %zu out", h, d.in, d.out);
    int event; /* any non-NULL event: the copies at submit already waited for the device */
    if (ddp_coll_wait_event(c, &event)) W_FAIL("wait_event with staging");
    ddp_coll_free(c);
    free(x);
    return 0;
}

/* A staged all-reduce that fails (the communicator aborted while its transport holds it back: a
 * second per chunk sent) leaves the device buffer as it was, copies nothing back, and its host
 * copy is freed with the communicator (ASan: no leak, no use after free). */
static int staged_abort_rank(ddp_coll_fake_world_t *w, int rank)
{
    size_t n = STAGED_COUNT, bytes = n * 4;
    float *x = malloc(bytes);
    pretend_dev_t d = {(char *)x, bytes, 0, 0};
    ddp_coll_device_t dev = {&d, dev_on, dev_d2h, dev_h2d};
    ddp_coll_opts_t o = {.device = &dev, .chunk_delay_us = 1000000};
    ddp_coll_t *c;
    if (!x || ddp_coll_new_fake(w, rank, &o, &c)) W_FAIL("setup");
    for (size_t i = 0; i < n; i++) x[i] = (float)i;
    ddp_coll_req_t *r;
    if (ddp_coll_allreduce(c, x, n, DDP_DT_F32, DDP_OP_SUM, &r)) W_FAIL("submit");
    ddp_coll_abort(c, DDP_EABORTED, "test: aborted while staged");
    int rc = ddp_coll_wait(r, 0, NULL);
    if (rc != DDP_EABORTED) W_FAIL("wait gave %s, want DDP_EABORTED", ddp_err_name(rc));
    if (d.in != bytes || d.out != 0) W_FAIL("staged %zu in and %zu out", d.in, d.out);
    for (size_t i = 0; i < n; i++)
        if (x[i] != (float)i) W_FAIL("x[%zu] = %g after the failure", i, x[i]);
    ddp_coll_free(c);
    free(x);
    return 0;
}

static void *staged_thread(void *p)
{
    staged_arg_t *a = p;
    a->rc = a->abort ? staged_abort_rank(a->w, a->rank) : staged_rank(a->w, a->rank);
    return NULL;
}

static void run_staged(int abort)
{
    ddp_coll_fake_world_t *w;
    assert_int_equal(ddp_coll_fake_world_new(2, &w), 0);
    pthread_t th[2];
    staged_arg_t a[2];
    for (int r = 0; r < 2; r++) {
        a[r] = (staged_arg_t){.w = w, .rank = r, .abort = abort};
        pthread_create(&th[r], NULL, staged_thread, &a[r]);
    }
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++) assert_int_equal(a[r].rc, 0);
    ddp_coll_fake_world_free(w);
}

static void test_device_staged(void **s) { run_staged(0); }
static void test_device_staged_abort(void **s) { run_staged(1); }

/* TCP (sums reduced in place in the caller's buffer) and shared memory (sums through slots) give
 * bitwise the same results for three ranks, fp32 and bf16, sum and average. */
static int write_sums(ddp_coll_t *c, void *arg)
{
    size_t count = 1000003;
    void *buf = malloc(count * 4);
    FILE *f = ddp_coll_rank(c) == 0 ? fopen(arg, "w") : NULL;
    for (int dt = 0; dt < 2; dt++)
        for (int op = 0; op < 2; op++) {
            w_fill(buf, count, (ddp_dtype_t)dt, ddp_coll_rank(c), 11);
            ddp_coll_req_t *r;
            ddp_errinfo_t ei;
            if (ddp_coll_allreduce(c, buf, count, (ddp_dtype_t)dt, (ddp_redop_t)op, &r) ||
                ddp_coll_wait(r, 0, &ei))
                W_FAIL("all-reduce: %s", ddp_coll_last_error(c));
            if (f && fwrite(buf, ddp_dtype_size((ddp_dtype_t)dt), count, f) != count)
                W_FAIL("write %s", (char *)arg);
        }
    if (f) fclose(f);
    free(buf);
    return 0;
}

static void test_tcp_shm_same_bits(void **s)
{
    char pt[] = "/tmp/ddp-coll-tcp-XXXXXX", ps[] = "/tmp/ddp-coll-shm-XXXXXX";
    int ft = mkstemp(pt), fs = mkstemp(ps);
    assert_true(ft >= 0 && fs >= 0);
    w_cfg_t ct = {.n = 3, .transport = "tcp"}, cs = {.n = 3, .transport = "auto"};
    assert_int_equal(w_run(ct, write_sums, pt, 60), 0);
    assert_int_equal(w_run(cs, write_sums, ps, 60), 0);
    off_t nt = lseek(ft, 0, SEEK_END), ns = lseek(fs, 0, SEEK_END);
    assert_int_equal(nt, (off_t)1000003 * 12);
    assert_int_equal(nt, ns);
    char *a = malloc((size_t)nt), *b = malloc((size_t)nt);
    assert_int_equal(pread(ft, a, (size_t)nt, 0), nt);
    assert_int_equal(pread(fs, b, (size_t)nt, 0), nt);
    assert_int_equal(memcmp(a, b, (size_t)nt), 0);
    free(a);
    free(b);
    close(ft);
    close(fs);
    unlink(pt);
    unlink(ps);
}

/* ---- the TCP link's caller memory ------------------------------------------------------- */

#define XS_SLOT 4096
#define XS_GUARD 0x5A

static void fill_pat(unsigned char *p, size_t n, int k)
{
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 7 + (size_t)k * 13 + 1);
}

static int is_pat(const unsigned char *p, size_t n, int k)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i * 7 + (size_t)k * 13 + 1)) return 0;
    return 1;
}

/* Child: sends messages 0..4 of `lens`, from caller memory except message 2 (a slot), then waits
 * until everything is written and the receiver closes. */
static int xs_sender(int fd, const size_t *lens)
{
    ddp__xport_t *x;
    if (ddp__tcp_xport_new(fd, 1, 0, XS_SLOT, 8, &x)) return 1;
    static unsigned char bufs[5][XS_SLOT];
    for (int k = 0; k < 5; k++) {
        fill_pat(bufs[k], lens[k], k);
        void *slot = x->ops->send_slot(x);
        if (!slot) return 2;
        if (k == 2) {
            memcpy(slot, bufs[k], lens[k]);
            x->ops->send_commit(x, lens[k]);
        } else {
            x->ops->send_from(x, bufs[k], lens[k]);
        }
    }
    int64_t end = ddp_now_ns() + 10000000000LL;
    while (x->ops->pending(x) > 0 && ddp_now_ns() < end) {
        int cu, co;
        if (x->ops->progress(x, &cu, &co) < 0) return 3;
        usleep(1000);
    }
    if (x->ops->pending(x) > 0) return 4;
    struct pollfd pf = {.fd = fd, .events = POLLIN}; /* the receiver's close */
    if (poll(&pf, 1, 10000) != 1) return 5;
    x->ops->close(x);
    return 0;
}

/* Waits for the next complete message on x (one read before the sender's exit counts). */
static const unsigned char *xs_next(ddp__xport_t *x, size_t *len)
{
    int64_t end = ddp_now_ns() + 10000000000LL;
    for (;;) {
        int cu, co, rc = x->ops->progress(x, &cu, &co);
        const void *p = x->ops->recv_slot(x, len);
        if (p || ddp_now_ns() > end || rc < 0) return p;
        usleep(1000);
    }
}

/* Message 0 lands in its posted destination; message 1 posted with the wrong length lands in a
 * slot and leaves the destination alone; message 2 (sent from a slot) lands in its destination;
 * message 3 is posted to a slot; message 4's post is dropped by detach() and it lands in a slot.
 * Whatever the sender took from caller memory or a slot arrives intact. */
static void test_tcp_caller_memory(void **s)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    const size_t lens[5] = {1000, 600, 4096, 3, 777};
    pid_t pid = fork();
    if (pid == 0) {
        close(sv[0]);
        _exit(xs_sender(sv[1], lens));
    }
    close(sv[1]);
    ddp__xport_t *x;
    assert_int_equal(ddp__tcp_xport_new(sv[0], 0, 1, XS_SLOT, 8, &x), 0);
    static unsigned char dst[5][XS_SLOT + 64];
    memset(dst, XS_GUARD, sizeof dst);
    assert_int_equal(x->ops->recv_post(x, dst[0], lens[0]), 0);
    assert_int_equal(x->ops->recv_post(x, dst[1], 500), 0); /* the sender's 600 do not fit */
    assert_int_equal(x->ops->recv_post(x, dst[2], lens[2]), 0);
    assert_int_equal(x->ops->recv_post(x, NULL, 0), 0);
    for (int k = 0; k < 5; k++) {
        if (k == 4) { /* dropped at once: it goes to a slot, arrived yet or not */
            assert_int_equal(x->ops->recv_post(x, dst[4], lens[4]), 0);
            x->ops->detach(x);
        }
        size_t len = 0;
        const unsigned char *p = xs_next(x, &len);
        assert_non_null(p);
        assert_int_equal(len, lens[k]);
        assert_true(is_pat(p, len, k));
        if (k == 0 || k == 2) assert_ptr_equal(p, dst[k]);
        if (k == 1 || k == 3 || k == 4) assert_true(p < dst[0] || p >= dst[4] + sizeof dst[4]);
        x->ops->recv_release(x);
    }
    for (int k = 0; k < 8; k++) assert_int_equal(x->ops->recv_post(x, NULL, 0), 0);
    assert_int_equal(x->ops->recv_post(x, NULL, 0), -1); /* 8 posted, none released */
    for (int k = 1; k < 5; k += 3)
        for (size_t i = 0; i < sizeof dst[k]; i++) assert_int_equal(dst[k][i], XS_GUARD);
    for (size_t i = lens[0]; i < sizeof dst[0]; i++) assert_int_equal(dst[0][i], XS_GUARD);
    x->ops->close(x);
    int st;
    waitpid(pid, &st, 0);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_rounding),
        cmocka_unit_test(test_slice),
        cmocka_unit_test(test_args),
        cmocka_unit_test(test_single),
        cmocka_unit_test(test_fake_3),
        cmocka_unit_test(test_fake_delay),
        cmocka_unit_test(test_device_staged),
        cmocka_unit_test(test_device_staged_abort),
        cmocka_unit_test(test_tcp_1),
        cmocka_unit_test(test_shm_2),
        cmocka_unit_test(test_shm_3),
        cmocka_unit_test(test_shm_4),
        cmocka_unit_test(test_tcp_2),
        cmocka_unit_test(test_tcp_3),
        cmocka_unit_test(test_mem_shm_2),
        cmocka_unit_test(test_mem_shm_3),
        cmocka_unit_test(test_mem_shm_4),
        cmocka_unit_test(test_mem_tcp_2),
        cmocka_unit_test(test_mem_single),
        cmocka_unit_test(test_mem_same_as_ring),
        cmocka_unit_test(test_mem_small_devshm),
        cmocka_unit_test(test_tcp_caller_memory),
        cmocka_unit_test(test_tcp_shm_same_bits),
    };
    return cmocka_run_group_tests_name("collectives", tests, NULL, NULL);
}
