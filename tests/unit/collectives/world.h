/* Test helpers for the collectives: fork a world of ranks that form a ring communicator over a
 * TCP rendezvous on loopback (on one host, or on several made by the DDP_TEST_HOST_OF_RANK test
 * hook: w_cfg_t.hosts), and numerics checks against a serial sum in double.
 *
 * Children never call cmocka: they print what differs and exit non-zero; the parent asserts on
 * the exit statuses. A world that runs past its time limit is SIGKILLed and counts as failed.
 */
#ifndef DDP_TESTS_COLL_WORLD_H
#define DDP_TESTS_COLL_WORLD_H

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "collectives/coll.h"
#include "collectives/coll_impl.h"
#include "common/clock.h"
#include "common/test_hook.h"

#define W_FAIL(...)                                                                            \
    do {                                                                                       \
        fprintf(stderr, "[test rank] %s:%d: ", __FILE__, __LINE__);                            \
        fprintf(stderr, __VA_ARGS__);                                                          \
        fprintf(stderr, "\n");                                                                 \
        return 1;                                                                              \
    } while (0)

typedef int (*w_rank_fn)(ddp_coll_t *c, void *arg);

static int w_port_next;

/* True when 127.0.0.1:port can be bound now. */
static inline int w_port_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0) return 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* A fresh loopback port for a rendezvous (distinct per process and call): from a block of 64
 * per process below the kernel's ephemeral range (net.ipv4.ip_local_port_range), where no
 * outgoing connection of this or any other program can hold it, and free when asked. */
static inline int w_port(void)
{
    if (!w_port_next) {
        int lo = 32768;
        FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "re");
        if (f) {
            if (fscanf(f, "%d", &lo) != 1) lo = 32768;
            fclose(f);
        }
        int blocks = (lo - 10000) / 64;
        if (blocks < 16) blocks = 16;
        w_port_next = 10000 + (int)(getpid() % blocks) * 64;
    }
    while (!w_port_free(w_port_next)) w_port_next++;
    return w_port_next++;
}

static inline uint32_t w_hash(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return x;
}

/* Rank r's input element i: a multiple of 1/1024 in [-9.77, 9.77], exact in fp32. */
static inline float w_input(size_t i, int r, uint32_t seed)
{
    uint32_t h = w_hash((uint32_t)i * 2654435761U ^ w_hash((uint32_t)r + seed * 977U));
    return (float)((int)(h % 20001) - 10000) / 1024.0f;
}

static inline void w_fill(void *buf, size_t n, ddp_dtype_t dt, int r, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        float v = w_input(i, r, seed);
        if (dt == DDP_DT_F32)
            ((float *)buf)[i] = v;
        else
            ((uint16_t *)buf)[i] = ddp__f32_to_bf16(v);
    }
}

static inline double w_get(const void *buf, size_t i, ddp_dtype_t dt)
{
    return dt == DDP_DT_F32 ? ((const float *)buf)[i] : ddp__bf16_to_f32(((const uint16_t *)buf)[i]);
}

/* Checks one all-reduce of `count` against the serial double sum, twice, bitwise equal; on buffers
 * from ddp_coll_mem_alloc (at an odd offset inside it) when coll_mem, else from malloc. */
static inline int w_check_allreduce_in(ddp_coll_t *c, size_t count, ddp_dtype_t dt,
                                       ddp_redop_t op, uint32_t seed, int coll_mem)
{
    int n = ddp_coll_size(c), me = ddp_coll_rank(c);
    size_t es = ddp_dtype_size(dt);
    char *mem = NULL, *a, *b;
    if (coll_mem) {
        ddp_errinfo_t mei;
        if (ddp_coll_mem_alloc(c, 2 * count * es + 64, (void **)&mem, &mei))
            W_FAIL("ddp_coll_mem_alloc: %s", mei.msg);
        a = mem + es;
        b = mem + es + count * es + 16;
    } else {
        a = malloc(count * es + 16);
        b = malloc(count * es + 16);
    }
    float *scratch = malloc(sizeof(float) * (count + 1));
    if (!a || !b || !scratch) W_FAIL("malloc");
    char d[128];
    snprintf(d, sizeof d, "count %zu %s %s n=%d", count, dt == DDP_DT_F32 ? "f32" : "bf16",
             op == DDP_OP_AVG ? "avg" : "sum", n);
    for (int pass = 0; pass < 2; pass++) {
        char *buf = pass ? b : a;
        w_fill(buf, count, dt, me, seed);
        ddp_coll_req_t *req;
        ddp_errinfo_t ei;
        int rc = ddp_coll_allreduce(c, buf, count, dt, op, &req);
        if (rc) W_FAIL("%s: submit: %s", d, ddp_err_name(rc));
        rc = ddp_coll_wait(req, 0, &ei);
        if (rc) W_FAIL("%s: wait: %s: %s", d, ddp_err_name(rc), ei.msg);
    }
    if (memcmp(a, b, count * es)) W_FAIL("%s: two runs differ bitwise", d);
    double eps = dt == DDP_DT_F32 ? 1.2e-7 : 7.9e-3;
    for (size_t i = 0; i < count; i++) {
        double ref = 0, mag = 0;
        for (int r = 0; r < n; r++) {
            float v = w_input(i, r, seed);
            double x = dt == DDP_DT_F32 ? v : ddp__bf16_to_f32(ddp__f32_to_bf16(v));
            ref += x;
            mag += fabs(x);
        }
        if (op == DDP_OP_AVG) {
            ref /= n;
            mag /= n;
        }
        double got = w_get(a, i, dt);
        double tol = eps * (n + 1) * (mag + fabs(ref)) + 1e-12;
        if (fabs(got - ref) > tol)
            W_FAIL("%s: element %zu = %.9g, serial double sum %.9g (tolerance %.3g)", d, i, got,
                   ref, tol);
    }
    if (coll_mem) {
        ddp_coll_mem_free(c, mem);
    } else {
        free(a);
        free(b);
    }
    free(scratch);
    return 0;
}

static inline int w_check_allreduce(ddp_coll_t *c, size_t count, ddp_dtype_t dt, ddp_redop_t op,
                                    uint32_t seed)
{
    return w_check_allreduce_in(c, count, dt, op, seed, 0);
}

/* Reduce-scatter then all-gather, of collective memory or of malloc()ed memory: this rank's
 * slice (ddp_coll_slice) equals an all-reduce's bitwise and the rest of the buffer is left as it
 * was; the all-gather (with garbage outside the slice) then gives every rank the whole
 * all-reduced buffer. The ring does this over any memory (its schedule's two halves); a backend
 * that cannot refuses memory not shared by every rank with DDP_ENOTSUP. In a world of one both
 * change nothing. */
static inline int w_check_scatter_gather(ddp_coll_t *c, size_t count, ddp_dtype_t dt,
                                         ddp_redop_t op, uint32_t seed, int coll_mem)
{
    const size_t es = ddp_dtype_size(dt), bytes = count * es;
    const int n = ddp_coll_size(c), me = ddp_coll_rank(c);
    char *buf, *ref, *orig = malloc(bytes + 1);
    ddp_errinfo_t ei;
    ddp_coll_req_t *r;
    if (!coll_mem) {
        buf = malloc(bytes + 1);
        ref = malloc(bytes + 1);
    } else if (ddp_coll_mem_alloc(c, bytes + 1, (void **)&buf, &ei) ||
               ddp_coll_mem_alloc(c, bytes + 1, (void **)&ref, &ei)) {
        W_FAIL("ddp_coll_mem_alloc: %s", ei.msg);
    }
    w_fill(buf, count, dt, me, seed);
    w_fill(ref, count, dt, me, seed);
    w_fill(orig, count, dt, me, seed);
    int rc = ddp_coll_reduce_scatter(c, buf, count, dt, op, &r);
    if (!ddp_coll_slices_anywhere(c) && !ddp_coll_mem_shared(c, buf) && n > 1 && count) {
        if (rc != DDP_ENOTSUP) W_FAIL("reduce-scatter of private memory: %s", ddp_err_name(rc));
        if (ddp_coll_allgather(c, buf, count, dt, &r) != DDP_ENOTSUP)
            W_FAIL("allgather of private memory accepted");
        goto done;
    }
    if (rc || ddp_coll_wait(r, 0, &ei)) W_FAIL("reduce-scatter of %zu: %s", count, ei.msg);
    if (ddp_coll_allreduce(c, ref, count, dt, op, &r) || ddp_coll_wait(r, 0, &ei))
        W_FAIL("allreduce: %s", ei.msg);
    size_t lo, hi;
    ddp_coll_slice(count, n, me, &lo, &hi);
    if (memcmp(buf + lo * es, ref + lo * es, (hi - lo) * es))
        W_FAIL("reduce-scatter of %zu (dt %d op %d): slice [%zu, %zu) differs from the all-reduce",
               count, (int)dt, (int)op, lo, hi);
    if (memcmp(buf, orig, lo * es) || memcmp(buf + hi * es, orig + hi * es, (count - hi) * es))
        W_FAIL("reduce-scatter of %zu changed memory outside [%zu, %zu)", count, lo, hi);
    memset(buf, 0xA5, lo * es);
    memset(buf + hi * es, 0xA5, (count - hi) * es);
    if (ddp_coll_allgather(c, buf, count, dt, &r) || ddp_coll_wait(r, 0, &ei))
        W_FAIL("allgather of %zu: %s", count, ei.msg);
    if (memcmp(buf, ref, bytes)) W_FAIL("allgather of %zu differs from the all-reduce", count);
done:
    if (coll_mem) {
        ddp_coll_mem_free(c, buf);
        ddp_coll_mem_free(c, ref);
    } else {
        free(buf);
        free(ref);
    }
    free(orig);
    return 0;
}

typedef struct {
    int n;
    const char *transport; /* "auto" or "tcp" */
    const char *host;      /* rendezvous host, default 127.0.0.1 */
    int port;
    uint64_t generation;
    double timeout_s;
    double pre_new_delay_s; /* ranks > 0 sleep this long between bootstrap and communicator */
    const char *hosts;      /* DDP_TEST_HOST_OF_RANK: the host each rank pretends to be on */
    const char *algo;       /* opts.algo (NULL: auto) */
    size_t chunk_bytes;     /* opts.chunk_bytes (0: default) */
} w_cfg_t;

/* Runs in a child: bootstrap, communicator, fn, free. Returns the exit status. */
static inline int w_child(const w_cfg_t *cfg, int rank, w_rank_fn fn, void *arg)
{
    /* a child must not run cmocka's handlers (they would resume the test runner in here) */
    signal(SIGSEGV, SIG_DFL);
    signal(SIGABRT, SIG_DFL);
    signal(SIGBUS, SIG_DFL);
    signal(SIGILL, SIG_DFL);
    signal(SIGFPE, SIG_DFL);
    if (cfg->hosts) {
        ddp_test_hooks_t h = {0};
        snprintf(h.host_of_rank, sizeof h.host_of_rank, "%s", cfg->hosts);
        ddp_test_hooks_set(&h);
    }
    char addr[96];
    snprintf(addr, sizeof addr, "%s:%d", cfg->host ? cfg->host : "127.0.0.1", cfg->port);
    ddp_coll_rdzv_cfg_t rc = {.rank = rank, .size = cfg->n, .addr = addr, .token = "test-token",
                              .generation = cfg->generation, .timeout_s = 20};
    ddp_coll_bootstrap_t *bs;
    ddp_errinfo_t ei;
    int e = ddp_coll_bootstrap_tcp(&rc, &bs, &ei);
    if (e) W_FAIL("rank %d: bootstrap: %s: %s", rank, ddp_err_name(e), ei.msg);
    if (rank > 0 && cfg->pre_new_delay_s > 0) usleep((useconds_t)(cfg->pre_new_delay_s * 1e6));
    ddp_coll_opts_t o = {.transport = cfg->transport, .timeout_s = cfg->timeout_s,
                         .algo = cfg->algo, .chunk_bytes = cfg->chunk_bytes};
    ddp_coll_t *c;
    e = ddp_coll_new(bs, &o, &c, &ei);
    ddp_coll_bootstrap_free(bs);
    if (e) W_FAIL("rank %d: ddp_coll_new: %s: %s", rank, ddp_err_name(e), ei.msg);
    int r = fn(c, arg);
    ddp_coll_free(c);
    return r;
}

/* Forks cfg->n ranks running fn; returns the number of ranks that failed (or timed out). */
static inline int w_run(w_cfg_t cfg, w_rank_fn fn, void *arg, double limit_s)
{
    if (!cfg.port) cfg.port = w_port();
    pid_t pids[16];
    for (int r = 0; r < cfg.n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(w_child(&cfg, r, fn, arg) ? 1 : 0);
    }
    int failed = 0, left = cfg.n;
    int64_t deadline = ddp_now_ns() + (int64_t)(limit_s * 1e9);
    while (left > 0) {
        for (int r = 0; r < cfg.n; r++) {
            if (pids[r] <= 0) continue;
            int st;
            pid_t p = waitpid(pids[r], &st, WNOHANG);
            if (p == pids[r]) {
                if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
                    fprintf(stderr, "rank %d of %d failed (status 0x%x)\n", r, cfg.n, st);
                    failed++;
                }
                pids[r] = 0;
                left--;
            }
        }
        if (left && ddp_now_ns() > deadline) {
            for (int r = 0; r < cfg.n; r++)
                if (pids[r] > 0) {
                    fprintf(stderr, "rank %d of %d timed out: killed\n", r, cfg.n);
                    kill(pids[r], SIGKILL);
                    waitpid(pids[r], NULL, 0);
                    failed++;
                    pids[r] = 0;
                    left--;
                }
        }
        if (left) {
            struct timespec ts = {0, 5000000};
            nanosleep(&ts, NULL);
        }
    }
    return failed;
}

#endif
