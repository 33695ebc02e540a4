/* The per-op profiler of the front door (kernels.h, ddp_k_profile_*), on the CPU and on the
 * simulated GPU (whose marks are clock reads queued on its stream).
 *
 * A fixed sequence of calls inside a window must be counted exactly, op by op, with nothing
 * else counted: not the calls before the window or after it, not those of a paused window,
 * not another thread's, not a call refused for its arguments. Every time is >= 0 and the ops'
 * times add up to no more than the window's wall time. matmul's FLOPs and bytes are the
 * formulas of kernels.h. The outputs are bitwise those of the same sequence unprofiled. A
 * window longer than 65536 calls reads its marks on the way and still counts every call.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <stdio.h>

#include "common/err.h"
#include "kernels/kernels.h"
#include "kref.h"
#include "ktests.h"

enum { N = 6, C = 10, OC = 14 };

/* The sequence's tensors on k's device, and their host images. */
typedef struct {
    float *inp, *w, *bias, *out, *dinp, *dw, *db, *dout;
    float h_inp[N * C], h_w[C * OC], h_bias[OC], h_dout[N * OC];
} seq_t;

static float *dev(ddp_kernels_t *k, size_t n)
{
    float *p = NULL;
    assert_int_equal(ddp_k_alloc(k, (void **)&p, n * sizeof(float)), 0);
    return p;
}

static void seq_init(ddp_kernels_t *k, seq_t *s)
{
    krng_t r = {42};
    kfill(&r, s->h_inp, N * C, -1, 1);
    kfill(&r, s->h_w, C * OC, -1, 1);
    kfill(&r, s->h_bias, OC, -1, 1);
    kfill(&r, s->h_dout, N * OC, -1, 1);
    s->inp = dev(k, N * C), s->w = dev(k, C * OC), s->bias = dev(k, OC);
    s->out = dev(k, N * OC), s->dinp = dev(k, N * C), s->dw = dev(k, C * OC);
    s->db = dev(k, OC), s->dout = dev(k, N * OC);
    assert_int_equal(ddp_k_memcpy_h2d(k, s->w, s->h_w, sizeof s->h_w), 0);
    assert_int_equal(ddp_k_memcpy_h2d(k, s->bias, s->h_bias, sizeof s->h_bias), 0);
    assert_int_equal(ddp_k_memcpy_h2d(k, s->dout, s->h_dout, sizeof s->h_dout), 0);
}

static void seq_free(ddp_kernels_t *k, seq_t *s)
{
    float *all[] = {s->inp, s->w, s->bias, s->out, s->dinp, s->dw, s->db, s->dout};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ddp_k_free(k, all[i]);
}

/* The fixed sequence: what it calls is what `expected` says. Leaves out[] and dw[] in host
 * memory for the comparison with an unprofiled run. */
static void seq_run(ddp_kernels_t *k, seq_t *s, float *h_out, float *h_dw)
{
    assert_int_equal(ddp_k_memcpy_h2d(k, s->inp, s->h_inp, sizeof s->h_inp), 0);
    for (int i = 0; i < 3; i++)
        DDP_K(k, matmul_fwd, KA(s->out), KA(s->inp), s->w, s->bias, N, C, OC, OC, DDP_W_IN_OUT);
    DDP_K(k, matmul_bwd, KA(s->dinp), s->dw, s->db, KA(s->dout), KA(s->inp), s->w, N, C, OC, OC,
          DDP_W_IN_OUT);
    DDP_K(k, matmul_bwd, NULL, s->dw, NULL, KA(s->dout), KA(s->inp), s->w, N, C, OC, OC,
          DDP_W_IN_OUT);
    DDP_K(k, gelu_fwd, KA(s->out), KA(s->out), (size_t)N * OC);
    DDP_K(k, gelu_fwd, KA(s->out), KA(s->out), (size_t)N * OC);
    assert_int_equal(ddp_k_memset0(k, s->dinp, N * C * sizeof(float)), 0);
    assert_int_equal(ddp_k_sync(k), 0);
    assert_int_equal(ddp_k_memcpy_d2h(k, h_out, s->out, N * OC * sizeof(float)), 0);
    assert_int_equal(ddp_k_memcpy_d2h(k, h_dw, s->dw, C * OC * sizeof(float)), 0);
    assert_int_equal(ddp_k_sync(k), 0);
}

static const long expected[DDP_KOP_COUNT] = {
    [DDP_KOP_memcpy_h2d] = 1, [DDP_KOP_matmul_fwd] = 3, [DDP_KOP_matmul_bwd] = 2,
    [DDP_KOP_gelu_fwd] = 2,   [DDP_KOP_memset0] = 1,    [DDP_KOP_sync] = 2,
    [DDP_KOP_memcpy_d2h] = 2,
};

/* Every op's count is expected[], every time >= 0, their sum <= the window's wall time. */
static void check_report(const char *be, const ddp_kprof_report_t *r)
{
    double sum = 0;
    for (int i = 0; i < DDP_KOP_COUNT; i++) {
        const ddp_kprof_stat_t *s = &r->op[i];
        if (s->calls != expected[i])
            fail_msg("%s: %s: %ld calls, want %ld", be, ddp_kop_name(i), s->calls, expected[i]);
        if (s->ms < 0 || s->host_ms < 0)
            fail_msg("%s: %s: ms %g, host ms %g: negative", be, ddp_kop_name(i), s->ms,
                     s->host_ms);
        if (!s->calls && (s->ms != 0 || s->bytes != 0 || s->flops != 0))
            fail_msg("%s: %s: no call but ms %g bytes %g flops %g", be, ddp_kop_name(i), s->ms,
                     s->bytes, s->flops);
        sum += s->ms;
    }
    if (!(sum <= r->wall_ms) || !(r->wall_ms > 0))
        fail_msg("%s: ops' times add up to %.6f ms, the window's wall time is %.6f ms", be, sum,
                 r->wall_ms);
    assert_int_equal(r->stream_marks, 1);
    /* matmul: 2 N C OC forward, 4 N C OC backward with dinp and 2 N C OC without */
    double nco = (double)N * C * OC;
    if (r->op[DDP_KOP_matmul_fwd].flops != 3 * 2 * nco)
        fail_msg("%s: matmul_fwd flops %g, want %g", be, r->op[DDP_KOP_matmul_fwd].flops,
                 3 * 2 * nco);
    if (r->op[DDP_KOP_matmul_bwd].flops != 4 * nco + 2 * nco)
        fail_msg("%s: matmul_bwd flops %g, want %g", be, r->op[DDP_KOP_matmul_bwd].flops,
                 6 * nco);
    double fwd_bytes = 3 * 4.0 * (N * C + C * OC + N * OC + OC);
    if (r->op[DDP_KOP_matmul_fwd].bytes != fwd_bytes)
        fail_msg("%s: matmul_fwd bytes %g, want %g", be, r->op[DDP_KOP_matmul_fwd].bytes,
                 fwd_bytes);
    if (r->op[DDP_KOP_gelu_fwd].bytes != 2 * 4.0 * 2 * N * OC)
        fail_msg("%s: gelu_fwd bytes %g", be, r->op[DDP_KOP_gelu_fwd].bytes);
    if (r->op[DDP_KOP_sync].flops != 0 || r->op[DDP_KOP_sync].bytes != 0)
        fail_msg("%s: sync has bytes or flops", be);
}

typedef struct {
    ddp_kernels_t *k;
    float *src;
    float host[N * OC];
    int rc;
} other_t;

static void *other_thread(void *arg)
{
    other_t *o = arg;
    o->rc = ddp_k_memcpy_d2h(o->k, o->host, o->src, sizeof o->host);
    return NULL;
}

/* The sequence on backend `be`, profiled, against the same sequence unprofiled. other_thread:
 * another thread copies during the window (the CPU's memory is the host's). */
static void check_backend(const char *be, int other)
{
    ddp_kernels_t k;
    assert_int_equal(ddp_kernels_open(&k, be, 0, 2), 0);
    seq_t a, b;
    float out_a[N * OC], dw_a[C * OC], out_b[N * OC], dw_b[C * OC];
    seq_init(&k, &a);
    seq_init(&k, &b);
    seq_run(&k, &a, out_a, dw_a); /* unprofiled */

    DDP_K(&k, gelu_fwd, KA(b.out), KA(b.out), (size_t)N * OC); /* before the window: not counted */
    assert_int_equal(ddp_k_memset0(&k, b.out, N * OC * sizeof(float)), 0);
    assert_int_equal(ddp_k_profile_start(&k), 0);
    assert_int_equal(ddp_k_profile_start(&k), DDP_EINVAL); /* one window at a time */
    seq_run(&k, &b, out_b, dw_b);
    if (other) {
        other_t o = {.k = &k, .src = b.out};
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, other_thread, &o), 0);
        pthread_join(th, NULL);
        assert_int_equal(o.rc, 0);
    }
    ddp_k_profile_pause(&k);
    DDP_K(&k, scale, b.dinp, 1.0f, (size_t)N * C); /* paused: not counted */
    ddp_k_profile_resume(&k);
    ddp_kprof_report_t r;
    assert_int_equal(ddp_k_profile_stop(&k, &r), 0);
    assert_int_equal(ddp_k_profile_stop(&k, NULL), DDP_EINVAL); /* no window open */
    DDP_K(&k, scale, b.dinp, 1.0f, (size_t)N * C); /* after the window: not counted */
    assert_int_equal(ddp_k_sync(&k), 0);
    check_report(be, &r);
    assert_memory_equal(out_a, out_b, sizeof out_a);
    assert_memory_equal(dw_a, dw_b, sizeof dw_a);

    /* a second window on the same k counts afresh */
    assert_int_equal(ddp_k_profile_start(&k), 0);
    seq_run(&k, &b, out_b, dw_b);
    assert_int_equal(ddp_k_profile_stop(&k, &r), 0);
    check_report(be, &r);
    seq_free(&k, &a);
    seq_free(&k, &b);
    ddp_kernels_close(&k);
}

void test_profile_cpu(void **state) { check_backend("cpu", 1); }

void test_profile_sim(void **state) { check_backend("sim", 0); }

/* A call refused for its arguments is not counted (and its error is the window's, as it is
 * ddp_k_sync's); a window longer than 65536 calls counts them all. */
void test_profile_edges(void **state)
{
    ddp_kernels_t k;
    assert_int_equal(ddp_k_profile_start(NULL), DDP_EINVAL);
    assert_int_equal(ddp_k_profile_stop(NULL, NULL), DDP_EINVAL);
    assert_int_equal(ddp_kernels_open(&k, "cpu", 0, 1), 0);
    float x[4] = {1, 2, 3, 4};
    long n = 65536 + 1000; /* kernels.h: marks are read every 65536 calls */
    assert_int_equal(ddp_k_profile_start(&k), 0);
    for (long i = 0; i < n; i++) DDP_K(&k, scale, x, 1.0f, 4);
    ddp_kprof_report_t r;
    assert_int_equal(ddp_k_profile_stop(&k, &r), 0);
    assert_int_equal(r.op[DDP_KOP_scale].calls, n);
    assert_true(r.op[DDP_KOP_scale].ms >= 0 && r.op[DDP_KOP_scale].ms <= r.wall_ms);
    assert_true(r.op[DDP_KOP_scale].bytes == 4.0 * 2 * 4 * (double)n);

    assert_int_equal(ddp_k_profile_start(&k), 0);
    DDP_K(&k, matmul_fwd, KA(x), KA(x), x, NULL, 0, 1, 1, 1, DDP_W_IN_OUT); /* N = 0: refused */
    assert_int_equal(ddp_k_profile_stop(&k, &r), DDP_EINVAL);
    assert_int_equal(r.op[DDP_KOP_matmul_fwd].calls, 0);
    ddp_kernels_close(&k);
    assert_string_equal(ddp_kop_name(DDP_KOP_matmul_fwd), "matmul_fwd");
    assert_string_equal(ddp_kop_name(DDP_KOP_COUNT), "?");
}
