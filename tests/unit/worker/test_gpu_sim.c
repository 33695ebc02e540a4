/* The GPU path's hazards on the simulated device (issue 24), one test per finding.
 *
 * Ranks are threads of this process, each with a "sim" kernel context on its own device (rank r
 * on device r) and a "sim" communicator (collectives/nccl.c over the simulated CUDA runtime and
 * NCCL); every rank runs its part on its own thread, as a worker's compute thread would. A
 * scenario returns 0, or fails with a message that the test prints. Deadlines, never sleeps:
 * a wait for another thread's event polls it with a deadline.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "collectives/coll.h"
#include "tests/sim/sim.h"
#include "common/clock.h"
#include "common/log.h"
#include "tests/sim/simdev.h"
#include "kernels/kernels.h"
#include "worker/sync/reducer.h"
#include "worker/optim/zero1.h"

#define NR 2

typedef struct rank rank_t;
typedef int (*scenario_fn)(rank_t *r);

struct rank {
    int rank, size, device, coll_device;
    char addr[64];
    double timeout_s;
    ddp_coll_t *comm;
    ddp_coll_t *parent;      /* form: the previous generation's communicator (opts.parent) */
    const int *parent_ranks; /* form: opts.parent_ranks */
    ddp_kernels_t k;
    scenario_fn fn;
    int rc;
    char msg[600];
    int64_t free_ns; /* dissolve: how long ddp_coll_free took */
};

/* Shared by the scenarios of one test. */
static _Atomic int flag;

#define FAIL(r, ...)                                                                           \
    do {                                                                                       \
        snprintf((r)->msg, sizeof (r)->msg, __VA_ARGS__);                                      \
        return -1;                                                                             \
    } while (0)

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    close(fd);
    return ntohs(sa.sin_port);
}

static void *form_main(void *arg)
{
    rank_t *r = arg;
    ddp_errinfo_t ei = {0};
    ddp_coll_rdzv_cfg_t cfg = {.rank = r->rank, .size = r->size, .addr = r->addr,
                               .token = "gpu-sim-test", .timeout_s = 30};
    ddp_coll_bootstrap_t *bs = NULL;
    r->rc = ddp_kernels_open(&r->k, "sim", r->device, 1);
    if (r->rc == 0) r->rc = ddp_coll_bootstrap_tcp(&cfg, &bs, &ei);
    ddp_coll_opts_t opts = {.backend = "sim", .cuda_device = r->coll_device,
                            .timeout_s = r->timeout_s, .parent = r->parent,
                            .parent_ranks = r->parent_ranks};
    if (r->rc == 0) r->rc = ddp_coll_new(bs, &opts, &r->comm, &ei);
    ddp_coll_bootstrap_free(bs);
    if (r->rc) snprintf(r->msg, sizeof r->msg, "forming: %s (%s)", ddp_strerror(r->rc), ei.msg);
    return NULL;
}

static void *run_main(void *arg)
{
    rank_t *r = arg;
    r->rc = r->fn(r);
    return NULL;
}

static void *dissolve_main(void *arg)
{
    rank_t *r = arg;
    if (r->fn) r->rc = r->fn(r); /* may wait for the other rank before freeing */
    int64_t t0 = ddp_now_ns();
    ddp_coll_free(r->comm);
    r->comm = NULL;
    r->free_ns = ddp_now_ns() - t0;
    ddp_kernels_close(&r->k);
    return NULL;
}

/* Runs fn on every rank's thread and waits for all. */
static void on_ranks(rank_t *rs, int n, void *(*fn)(void *))
{
    pthread_t th[8];
    for (int i = 0; i < n; i++) assert_int_equal(pthread_create(&th[i], NULL, fn, &rs[i]), 0);
    for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
}

static void expect_ok(rank_t *rs, int n, const char *what)
{
    for (int i = 0; i < n; i++)
        if (rs[i].rc != 0) fail_msg("%s: rank %d: rc %d: %s", what, i, rs[i].rc, rs[i].msg);
}

/* A world of n ranks; rank r's kernels on device[r] (NULL: r), its communicator on
 * coll_device[r] (NULL: the same). */
static void form_n(rank_t *rs, int n, const int *device, const int *coll_device, double timeout_s)
{
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", free_port());
    for (int i = 0; i < n; i++) {
        memset(&rs[i], 0, sizeof rs[i]);
        rs[i].rank = i;
        rs[i].size = n;
        rs[i].device = device ? device[i] : i;
        rs[i].coll_device = coll_device ? coll_device[i] : rs[i].device;
        rs[i].timeout_s = timeout_s;
        snprintf(rs[i].addr, sizeof rs[i].addr, "%s", addr);
    }
}

static void form(rank_t *rs, const int *coll_device, double timeout_s)
{
    form_n(rs, NR, NULL, coll_device, timeout_s);
    on_ranks(rs, NR, form_main);
    expect_ok(rs, NR, "form");
}

static void run(rank_t *rs, scenario_fn f0, scenario_fn f1)
{
    rs[0].fn = f0;
    rs[1].fn = f1;
    on_ranks(rs, NR, run_main);
}

static void dissolve(rank_t *rs, scenario_fn f0, scenario_fn f1)
{
    rs[0].fn = f0;
    rs[1].fn = f1;
    on_ranks(rs, NR, dissolve_main);
}

/* n floats of device memory holding base + i (through a copy, waited for: another stream reads
 * it next). */
static float *dev_iota(rank_t *r, size_t n, float base)
{
    float *h = malloc(n * sizeof *h), *d = NULL;
    for (size_t i = 0; i < n; i++) h[i] = base + (float)i;
    if (r->k.ops->alloc(r->k.ctx, (void **)&d, n * sizeof *d) ||
        r->k.ops->memcpy_h2d(r->k.ctx, d, h, n * sizeof *d) || r->k.ops->sync(r->k.ctx))
        d = NULL;
    free(h);
    return d;
}

/* 0 when device buffer d holds want(i) for every i < n. */
static int dev_expect(rank_t *r, const float *d, size_t n, float base, float step, const char *what)
{
    float *h = malloc(n * sizeof *h);
    int rc = r->k.ops->memcpy_d2h(r->k.ctx, h, d, n * sizeof *h);
    for (size_t i = 0; rc == 0 && i < n; i++)
        if (h[i] != base + step * (float)i) {
            snprintf(r->msg, sizeof r->msg, "%s[%zu] = %g, expected %g", what, i, h[i],
                     base + step * (float)i);
            rc = -1;
        }
    free(h);
    return rc;
}

/* ---- finding 2: host buffers go through device memory; device buffers as they are ---- */

typedef struct {
    int64_t step;
    float loss;
    char tag[12];
} header_t;

static int sc_host_and_device(rank_t *r)
{
    size_t n = 1000;
    float *d = dev_iota(r, n, (float)r->rank);
    if (!d) FAIL(r, "device buffer");
    ddp_coll_req_t *q;
    ddp_errinfo_t ei = {0};
    int rc = ddp_coll_allreduce(r->comm, d, n, DDP_DT_F32, DDP_OP_SUM, &q);
    if (rc == 0) rc = ddp_coll_wait(q, 0, &ei);
    if (rc) FAIL(r, "device all-reduce: %s", ei.msg);
    if (dev_expect(r, d, n, 1.0f, 2.0f, "device sum")) return -1; /* (0 + i) + (1 + i) */
    r->k.ops->free(r->k.ctx, d);
    float vals[5] = {1, 2, 3, 4, (float)r->rank}; /* host, on the stack, as the trainer's */
    rc = ddp_coll_allreduce(r->comm, vals, 5, DDP_DT_F32, DDP_OP_SUM, &q);
    if (rc == 0) rc = ddp_coll_wait(q, 0, &ei);
    if (rc) FAIL(r, "host all-reduce: rc %d %s", rc, ei.msg);
    if (vals[0] != 2 || vals[3] != 8 || vals[4] != 1)
        FAIL(r, "host sum: %g %g %g", vals[0], vals[3], vals[4]);
    header_t h = {.step = 100 + r->rank, .loss = 1.5f * (float)(r->rank + 1)};
    snprintf(h.tag, sizeof h.tag, "rank %d", r->rank);
    rc = ddp_coll_broadcast(r->comm, &h, sizeof h, 1, &q);
    if (rc == 0) rc = ddp_coll_wait(q, 0, &ei);
    if (rc) FAIL(r, "host broadcast: %s", ei.msg);
    if (h.step != 101 || h.loss != 3.0f || strcmp(h.tag, "rank 1") != 0)
        FAIL(r, "broadcast header: step %lld loss %g tag %s", (long long)h.step, h.loss, h.tag);
    if ((rc = ddp_coll_barrier(r->comm, 0, &ei)) != 0) FAIL(r, "barrier: %s", ei.msg);
    return 0;
}

/* fn on both ranks of a fresh world: it must succeed with no hazard and no NCCL misuse. */
static void run_clean(scenario_fn fn, const char *what)
{
    rank_t rs[NR];
    uint64_t hz = ddp_simdev_hazards(), vi = ddp_sim_nccl_violations();
    form(rs, NULL, 30);
    run(rs, fn, fn);
    expect_ok(rs, NR, what);
    dissolve(rs, NULL, NULL);
    assert_int_equal(ddp_simdev_hazards(), hz);
    assert_int_equal(ddp_sim_nccl_violations(), vi);
}

static void test_host_buffers_are_staged(void **state)
{
    run_clean(sc_host_and_device, "host and device buffers");
}

/* ---- ddp_coll_transfer: a joiner's state, chunked through NCCL broadcasts ---- */

static int sc_transfer(rank_t *r)
{
    size_t n = (9u << 20) / sizeof(float) + 5; /* several 4 MiB chunks and a tail */
    float *d = dev_iota(r, n, r->rank ? -1.0f : 3.0f), *other = dev_iota(r, n, 0);
    if (!d || !other) FAIL(r, "buffers");
    ddp_coll_req_t *q;
    ddp_errinfo_t ei = {0};
    for (int keep = 0; keep < 2; keep++) {
        unsigned char receivers[NR] = {0, (unsigned char)keep};
        /* the root's compute reads the buffer while it travels (the trainer's forward does) */
        if (r->rank == 0) DDP_K(&r->k, add, other, d, n);
        int rc = ddp_coll_transfer(r->comm, (r->rank == 0 || keep) ? d : NULL,
                                   n * sizeof(float), 0, receivers, &q);
        if (rc == 0) rc = ddp_coll_wait(q, 0, &ei);
        if (rc) FAIL(r, "transfer (rank 1 %s): %s", keep ? "keeps" : "passes", ei.msg);
        if (r->k.ops->sync(r->k.ctx)) FAIL(r, "sync");
        /* rank 1 keeps nothing the first time (its relay buffer takes the chunks) */
        float base = r->rank == 0 || keep ? 3.0f : -1.0f;
        if (dev_expect(r, d, n, base, 1.0f, keep ? "received" : "untouched")) return -1;
    }
    r->k.ops->free(r->k.ctx, d);
    r->k.ops->free(r->k.ctx, other);
    return 0;
}

static void test_transfer_chunks_through_broadcasts(void **state)
{
    run_clean(sc_transfer, "transfer");
}

/* ---- finding 1: the accumulation add and the all-reduce, ordered by an event ---- */

static int sc_reducer_acc(rank_t *r)
{
    size_t n = 70000; /* several buckets of 64 KiB */
    float *g = dev_iota(r, n, (float)r->rank), *acc = dev_iota(r, n, 10.0f);
    if (!g || !acc) FAIL(r, "buffers");
    ddp_reducer_t red;
    ddp_world_t world = {.comm = r->comm, .rank = r->rank, .size = r->size, .k = &r->k};
    ddp_reducer_cfg_t cfg = {.world = &world,
                             .arena = g,
                             .n = n,
                             .first_bucket_mb = 0.0625,
                             .bucket_mb = 0.0625,
                             .overlap = 1};
    if (ddp_reducer_init(&red, &cfg)) FAIL(r, "init");
    ddp_reducer_begin(&red, acc);
    ddp_errinfo_t ei = {0};
    int rc = ddp_reducer_ready(&red, n / 2);
    if (rc == 0) rc = ddp_reducer_ready(&red, n);
    int frc = ddp_reducer_finish(&red, NULL, &ei);
    ddp_reducer_close(&red);
    if (rc || frc) FAIL(r, "reducer: rc %d / %d: %s", rc, frc, ei.msg);
    /* sum over ranks of (rank + i) + (10 + i) = 21 + 4 i */
    if (dev_expect(r, g, n, 21.0f, 4.0f, "reduced gradient")) return -1;
    r->k.ops->free(r->k.ctx, g);
    r->k.ops->free(r->k.ctx, acc);
    return 0;
}

/* The same without the event: the simulator must see the race (the check can fail). */
static int sc_unordered_add(rank_t *r)
{
    size_t n = 4096;
    float *g = dev_iota(r, n, 0), *acc = dev_iota(r, n, 1);
    if (!g || !acc) FAIL(r, "buffers");
    DDP_K(&r->k, add, g, acc, n); /* queued on the compute stream */
    ddp_coll_req_t *q;
    ddp_errinfo_t ei = {0};
    int rc = ddp_coll_allreduce(r->comm, g, n, DDP_DT_F32, DDP_OP_SUM, &q);
    if (rc == 0) rc = ddp_coll_wait(q, 0, &ei);
    r->k.ops->sync(r->k.ctx);
    r->k.ops->free(r->k.ctx, g);
    r->k.ops->free(r->k.ctx, acc);
    if (rc == 0) FAIL(r, "an all-reduce of a buffer that a queued add writes succeeded");
    const char *why = ddp_coll_last_error(r->comm);
    if (!strstr(why, "hazard")) FAIL(r, "the error does not name the hazard: %s", why);
    return 0;
}

static void test_accumulation_add_ordered_before_allreduce(void **state)
{
    rank_t rs[NR];
    uint64_t hz = ddp_simdev_hazards();
    form(rs, NULL, 30);
    run(rs, sc_reducer_acc, sc_reducer_acc);
    expect_ok(rs, NR, "reducer with accumulation");
    assert_int_equal(ddp_simdev_hazards(), hz);
    run(rs, sc_unordered_add, sc_unordered_add);
    expect_ok(rs, NR, "unordered add (negative control)");
    assert_true(ddp_simdev_hazards() > hz);
    dissolve(rs, NULL, NULL);
}

/* ---- finding 3: the communicator on the rank's device, not device 0 ---- */

static int sc_device_buffer(rank_t *r)
{
    float *d = dev_iota(r, 64, 0);
    if (!d) FAIL(r, "buffer");
    ddp_coll_req_t *q;
    ddp_errinfo_t ei = {0};
    int rc = ddp_coll_allreduce(r->comm, d, 64, DDP_DT_F32, DDP_OP_SUM, &q);
    if (rc == 0) rc = ddp_coll_wait(q, 0, &ei);
    r->k.ops->free(r->k.ctx, d);
    snprintf(r->msg, sizeof r->msg, "%s", ei.msg);
    return rc;
}

static void test_communicator_on_the_ranks_device(void **state)
{
    rank_t rs[NR];
    int wrong[NR] = {0, 0}; /* what copts gave before: device 0 everywhere */
    form(rs, wrong, 5);
    run(rs, sc_device_buffer, sc_device_buffer);
    assert_int_not_equal(rs[1].rc, 0); /* rank 1's memory is device 1's */
    dissolve(rs, NULL, NULL);
    form(rs, NULL, 30);
    run(rs, sc_device_buffer, sc_device_buffer);
    expect_ok(rs, NR, "communicators on devices 0 and 1");
    dissolve(rs, NULL, NULL);
}

/* ---- finding 4: a failed cudaEventRecord fails the submit ---- */

static int sc_submit_fails(rank_t *r)
{
    float *d = dev_iota(r, 64, 0);
    ddp_coll_req_t *q = NULL;
    int rc = ddp_coll_allreduce(r->comm, d, 64, DDP_DT_F32, DDP_OP_SUM, &q);
    if (rc == 0) ddp_coll_wait(q, 0, NULL);
    r->k.ops->free(r->k.ctx, d);
    if (rc != DDP_ECUDA) FAIL(r, "submit with a failing cudaEventRecord returned %d", rc);
    return 0;
}

static void test_event_record_failure_is_an_error(void **state)
{
    rank_t rs[NR];
    form(rs, NULL, 5);
    setenv("DDP_SIM_FAIL", "cudaEventRecord", 1);
    run(rs, sc_submit_fails, sc_submit_fails);
    unsetenv("DDP_SIM_FAIL");
    expect_ok(rs, NR, "failing cudaEventRecord");
    assert_int_equal(ddp_coll_status(rs[0].comm), DDP_ECUDA);
    dissolve(rs, NULL, NULL);
}

/* ---- finding 5: ddp_coll_abort from another thread while the owner polls ---- */

static int sc_wait_aborted(rank_t *r)
{
    float *d = dev_iota(r, 64, 0);
    ddp_coll_req_t *q = NULL;
    ddp_errinfo_t ei = {0};
    int rc = ddp_coll_allreduce(r->comm, d, 64, DDP_DT_F32, DDP_OP_SUM, &q);
    atomic_store(&flag, 1);
    if (rc == 0) rc = ddp_coll_wait(q, ddp_now_ns() + 20 * 1000000000LL, &ei);
    r->k.ops->sync(r->k.ctx);
    r->k.ops->free(r->k.ctx, d);
    if (rc != DDP_EABORTED) FAIL(r, "wait returned %d (%s), not DDP_EABORTED", rc, ei.msg);
    return 0;
}

static int sc_idle(rank_t *r) { return 0; }

static void *abort_main(void *arg)
{
    rank_t *r = arg;
    int64_t deadline = ddp_now_ns() + 20 * 1000000000LL;
    /* once rank 0 is inside a call of NCCL (it polls in ddp_coll_wait) */
    while ((!atomic_load(&flag) || ddp_sim_nccl_calls_in_flight() == 0) && ddp_now_ns() < deadline)
        sched_yield();
    ddp_coll_abort(r->comm, DDP_EABORTED, "test: aborted from another thread");
    return NULL;
}

static void test_abort_from_another_thread(void **state)
{
    rank_t rs[NR];
    uint64_t vi = ddp_sim_nccl_violations();
    form(rs, NULL, 5);
    atomic_store(&flag, 0);
    setenv("DDP_SIM_NCCL_CALL_US", "20000", 1); /* each call stays 20 ms inside */
    pthread_t ab;
    assert_int_equal(pthread_create(&ab, NULL, abort_main, &rs[0]), 0);
    run(rs, sc_wait_aborted, sc_idle);
    pthread_join(ab, NULL);
    unsetenv("DDP_SIM_NCCL_CALL_US");
    expect_ok(rs, NR, "abort while waiting");
    char v[400];
    ddp_sim_nccl_last_violation(v, sizeof v);
    if (ddp_sim_nccl_violations() != vi) fail_msg("NCCL misuse: %s", v);
    dissolve(rs, NULL, NULL);
}

/* ---- finding 6: freeing a communicator whose peer is gone ends within its deadline ---- */

static int sc_free_first(rank_t *r) { return 0; }

static int sc_free_after_peer(rank_t *r)
{
    int64_t deadline = ddp_now_ns() + 15 * 1000000000LL; /* the peer "is dead" until then */
    while (!atomic_load(&flag) && ddp_now_ns() < deadline) sched_yield();
    if (!atomic_load(&flag)) FAIL(r, "rank 0's ddp_coll_free did not return within 15 s");
    return 0;
}

static void *flag_after_free(void *arg)
{
    rank_t *r = arg;
    dissolve_main(r);
    atomic_store(&flag, 1);
    return NULL;
}

static void test_free_has_a_deadline(void **state)
{
    rank_t rs[NR];
    form(rs, NULL, 1); /* a 1 s floor: the finalize's deadline */
    atomic_store(&flag, 0);
    rs[0].fn = sc_free_first;
    rs[1].fn = sc_free_after_peer;
    pthread_t t0, t1;
    assert_int_equal(pthread_create(&t0, NULL, flag_after_free, &rs[0]), 0);
    assert_int_equal(pthread_create(&t1, NULL, dissolve_main, &rs[1]), 0);
    pthread_join(t0, NULL);
    pthread_join(t1, NULL);
    expect_ok(rs, NR, "free with a silent peer");
    if (rs[0].free_ns > 10 * 1000000000LL)
        fail_msg("ddp_coll_free took %.1f s with a silent peer", rs[0].free_ns / 1e9);
}

/* ---- issue 17: a failed generation's communicator is shrunk into the survivors' ---- */

#define NS 3 /* ranks before the failure */

/* All-reduces base rank + i: every rank must get sum(ranks) + size * i. */
static int sc_sum_of_ranks(rank_t *r)
{
    size_t n = 1000;
    float *d = dev_iota(r, n, (float)r->rank);
    ddp_coll_req_t *q;
    ddp_errinfo_t ei = {0};
    int rc = d ? ddp_coll_allreduce(r->comm, d, n, DDP_DT_F32, DDP_OP_SUM, &q) : -1;
    if (rc == 0) rc = ddp_coll_wait(q, 0, &ei);
    if (rc) FAIL(r, "all-reduce over %d ranks: rc %d %s", r->size, rc, ei.msg);
    rc = dev_expect(r, d, n, (float)(r->size * (r->size - 1) / 2), (float)r->size, "sum");
    r->k.ops->free(r->k.ctx, d);
    return rc;
}

static int sc_dies(rank_t *r)
{
    ddp_coll_abort(r->comm, DDP_EPEER, "test: this rank died");
    return 0;
}

/* A survivor: its all-reduce fails with the dead peer, and the communicator stays to shrink. */
static int sc_survives(rank_t *r)
{
    float *d = dev_iota(r, 64, 0);
    ddp_coll_req_t *q;
    ddp_errinfo_t ei = {0};
    int rc = ddp_coll_allreduce(r->comm, d, 64, DDP_DT_F32, DDP_OP_SUM, &q);
    if (rc == 0) rc = ddp_coll_wait(q, ddp_now_ns() + 20 * 1000000000LL, &ei);
    r->k.ops->sync(r->k.ctx);
    r->k.ops->free(r->k.ctx, d);
    if (rc == 0) FAIL(r, "the all-reduce succeeded without the dead rank");
    if (!ddp_coll_shrinks(r->comm)) FAIL(r, "the failed communicator cannot be shrunk");
    return 0;
}

/* NS ranks, `dead` dies; the survivors (`kept`, their old ranks) form the next generation with
 * their old communicators as parents, except old rank `no_parent` (-1: none), which lost its.
 * Every new communicator must be shrunk (or formed afresh) as `shrunk` says, and sum right. */
static void next_generation(int dead, const int *kept, int no_parent, int shrunk)
{
    rank_t rs[NS], next[NS - 1];
    uint64_t vi = ddp_sim_nccl_violations(), hz = ddp_simdev_hazards();
    form_n(rs, NS, NULL, NULL, 5);
    on_ranks(rs, NS, form_main);
    expect_ok(rs, NS, "form");
    for (int i = 0; i < NS; i++) rs[i].fn = sc_sum_of_ranks;
    on_ranks(rs, NS, run_main);
    expect_ok(rs, NS, "generation 1");
    for (int i = 0; i < NS; i++) rs[i].fn = i == dead ? sc_dies : sc_survives;
    on_ranks(rs, NS, run_main);
    expect_ok(rs, NS, "a rank dies");

    form_n(next, NS - 1, kept, NULL, 5);
    for (int j = 0; j < NS - 1; j++) {
        next[j].parent = kept[j] == no_parent ? NULL : rs[kept[j]].comm;
        next[j].parent_ranks = kept;
    }
    on_ranks(next, NS - 1, form_main);
    expect_ok(next, NS - 1, "generation 2");
    for (int j = 0; j < NS - 1; j++) {
        if (ddp_coll_shrunk(next[j].comm) != shrunk)
            fail_msg("rank %d: generation 2 %s", j, shrunk ? "formed afresh" : "shrunk");
        next[j].fn = sc_sum_of_ranks;
    }
    on_ranks(next, NS - 1, run_main);
    expect_ok(next, NS - 1, "generation 2");
    for (int j = 0; j < NS - 1; j++) next[j].fn = NULL;
    on_ranks(next, NS - 1, dissolve_main);
    for (int i = 0; i < NS; i++) rs[i].fn = NULL;
    on_ranks(rs, NS, dissolve_main); /* the parents go last, as the trainer frees them */
    char v[400];
    ddp_sim_nccl_last_violation(v, sizeof v);
    if (ddp_sim_nccl_violations() != vi) fail_msg("NCCL misuse: %s", v);
    assert_int_equal(ddp_simdev_hazards(), hz);
}

static void test_failed_generation_is_shrunk(void **state)
{
    const int kept[] = {0, 2}; /* the middle rank dies: old rank 2 becomes rank 1 */
    next_generation(1, kept, -1, 1);
}

static void test_shrink_needs_every_rank(void **state)
{
    const int kept[] = {0, 1}; /* rank 1 has no parent: everyone forms afresh */
    next_generation(2, kept, 1, 0);
}

/* ---- ZeRO-1 over NCCL: in-place reduce-scatter and all-gather of ddp_coll_slice's slices ---- */

/* Equal slices (ncclReduceScatter / ncclAllGather), uneven ones (a group of ncclReduce /
 * ncclBroadcast per slice) and one rank's slice empty: after the reduce-scatter this rank's
 * slice holds the sum (rank 0's i + rank 1's 1 + i) and the rest is its own as it was; after the
 * all-gather of that, every element is the sum. */
static int sc_slices(rank_t *r)
{
    if (!ddp_coll_slices_anywhere(r->comm)) FAIL(r, "nccl does not take slices anywhere");
    const size_t counts[] = {2 * DDP_COLL_SLICE_ELEMS, DDP_COLL_SLICE_ELEMS + 1000, 64};
    for (int c = 0; c < 3; c++) {
        size_t n = counts[c], lo, hi;
        ddp_coll_slice(n, r->size, r->rank, &lo, &hi);
        float *d = dev_iota(r, n, (float)r->rank);
        if (!d) FAIL(r, "buffer");
        ddp_coll_req_t *q;
        ddp_errinfo_t ei = {0};
        int rc = ddp_coll_reduce_scatter(r->comm, d, n, DDP_DT_F32, DDP_OP_SUM, &q);
        if (rc == 0) rc = ddp_coll_wait(q, 0, &ei);
        if (rc) FAIL(r, "reduce-scatter of %zu: %s", n, ei.msg);
        if (dev_expect(r, d, lo, (float)r->rank, 1.0f, "before the slice") ||
            dev_expect(r, d + lo, hi - lo, 1.0f + 2.0f * (float)lo, 2.0f, "reduced slice") ||
            dev_expect(r, d + hi, n - hi, (float)(r->rank + hi), 1.0f, "after the slice"))
            return -1;
        rc = ddp_coll_allgather(r->comm, d, n, DDP_DT_F32, &q);
        if (rc == 0) rc = ddp_coll_wait(q, 0, &ei);
        if (rc) FAIL(r, "all-gather of %zu: %s", n, ei.msg);
        if (dev_expect(r, d, n, 1.0f, 2.0f, "gathered")) return -1;
        r->k.ops->free(r->k.ctx, d);
    }
    return 0;
}

static void test_slices_over_nccl(void **state)
{
    run_clean(sc_slices, "reduce-scatter and all-gather");
}

/* ZeRO-1's moment arenas on a device: reserved, this rank's slices committed; after a gather the
 * foreign slices are decommitted, and an op touching one is what a GPU faults on. */
static void test_sharded_moments_commit_own_slices(void **state)
{
    ddp_kernels_t k;
    ddp_errinfo_t ei = {0};
    assert_int_equal(ddp_kernels_open(&k, "sim", 0, 1), 0);
    size_t g = ddp_k_commit_granule(&k) / sizeof(float);
    size_t end[2] = {4 * g, 8 * g}; /* two buckets; this rank owns the first half of each */
    ddp_arena_part_t parts[2] = {{0, 2 * g, 0}, {4 * g, 6 * g, 0}};
    ddp_reducer_t r = {.n_buckets = 2, .bucket_end = end, .parts = parts};
    for (int whole = 0; whole < 2; whole++) { /* without, then with checkpoints */
        ddp_world_t world = {.rank = 0, .size = 2, .k = &k};
        ddp_zero1_t z = {.world = &world, .reducer = &r};
        assert_int_equal(ddp_zero1_reserve_device(&z, 8 * g, whole, &ei), 0);
        assert_int_equal(ddp_zero1_begin(&z, &ei), 0);
        assert_int_equal(z.whole, whole);
        if (whole) ddp_zero1_drop_foreign(&z);
        uint64_t hz = ddp_simdev_hazards();
        for (int i = 0; i < 2; i++)
            for (int b = 0; b < 2; b++)
                ddp_k_memset0(&k, z.moments[i] + parts[b].lo, 2 * g * sizeof(float));
        assert_int_equal(ddp_k_sync(&k), 0);
        assert_int_equal(ddp_simdev_hazards(), hz); /* this rank's slices are usable */
        ddp_k_memset0(&k, z.moments[1] + 6 * g, g * sizeof(float)); /* bucket 1's other half */
        ddp_k_sync(&k);
        assert_true(ddp_simdev_hazards() > hz); /* not committed, or given back */
        for (int i = 0; i < 2; i++) ddp_k_free(&k, z.moments[i]);
    }
    ddp_kernels_close(&k);
}

/* ---- finding 8: the self-test checks the LM head's input gradient at OC = 50257 ---- */

static int quiet_selftest(void)
{
    fflush(stdout);
    int saved = dup(1);
    FILE *null = fopen("/dev/null", "w");
    dup2(fileno(null), 1);
    int rc = ddp_kernels_selftest();
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    fclose(null);
    return rc;
}

static void test_selftest_checks_lm_head_dinp(void **state)
{
    setenv("DDP_SELFTEST_BACKENDS", "sim", 1);
    assert_int_equal(quiet_selftest(), 0);
    setenv("DDP_SIM_BREAK", "lm_head_dinp", 1); /* a wrong dinp for OC = 50257 only */
    assert_int_equal(quiet_selftest(), 1);
    unsetenv("DDP_SIM_BREAK");
    unsetenv("DDP_SELFTEST_BACKENDS");
}

/* ---- the simulator itself: the host may not touch device memory ---- */

static sigjmp_buf segv_jump;
static void on_segv(int sig) { siglongjmp(segv_jump, 1); }

static void test_host_access_to_device_memory_faults(void **state)
{
    ddp_kernels_t k;
    assert_int_equal(ddp_kernels_open(&k, "sim", 3, 1), 0);
    float *d = NULL;
    assert_int_equal(k.ops->alloc(k.ctx, (void **)&d, 256), 0);
    assert_int_equal(ddp_simdev_device_of(d, 256), 3);
    struct sigaction sa = {.sa_handler = on_segv}, old;
    sigaction(SIGSEGV, &sa, &old);
    volatile int faulted = 0;
    if (sigsetjmp(segv_jump, 1) == 0)
        d[0] = 1.0f; /* the host writing device memory directly */
    else
        faulted = 1;
    sigaction(SIGSEGV, &old, NULL);
    assert_int_equal(faulted, 1);
    k.ops->free(k.ctx, d);
    ddp_kernels_close(&k);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_buffers_are_staged),
        cmocka_unit_test(test_transfer_chunks_through_broadcasts),
        cmocka_unit_test(test_accumulation_add_ordered_before_allreduce),
        cmocka_unit_test(test_communicator_on_the_ranks_device),
        cmocka_unit_test(test_event_record_failure_is_an_error),
        cmocka_unit_test(test_abort_from_another_thread),
        cmocka_unit_test(test_free_has_a_deadline),
        cmocka_unit_test(test_failed_generation_is_shrunk),
        cmocka_unit_test(test_shrink_needs_every_rank),
        cmocka_unit_test(test_slices_over_nccl),
        cmocka_unit_test(test_sharded_moments_commit_own_slices),
        cmocka_unit_test(test_selftest_checks_lm_head_dinp),
        cmocka_unit_test(test_host_access_to_device_memory_faults),
    };
    DDP_DEBUG("test_gpu_sim"); /* the logger reads its level once, here, before any thread */
    const char *only = getenv("GPU_SIM_TEST"); /* one test by name, e.g. to check a revert */
    if (only && *only) cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
