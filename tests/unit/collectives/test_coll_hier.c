/* The two-level all-reduce (collectives/hier.c) between real processes on loopback, with "hosts"
 * made by the DDP_TEST_HOST_OF_RANK test hook (each rank appends its host number to its host id:
 * TCP between hosts, shared memory within): which topologies choose it; all-reduce,
 * reduce-scatter and all-gather against a serial double sum at many sizes (0, 1, odd, not
 * divisible by the ranks or the slice blocks, many slots long), fp32 and bf16, sum and average,
 * on 2 x 2 and 3 x 2 ranks (hosts contiguous in rank order and interleaved); bitwise equality run
 * to run; a reduce-scatter's slice bitwise equal to the all-reduce's; broadcasts, transfers and a
 * barrier amid them; and the bytes each host sends to the other: at most 0.7 of the flat ring's
 * (2 x 2: 1.0 against 1.5 buffers). A rank killed mid-operation: tests/fault/test_coll_fault.c;
 * real network namespaces: test_coll_netns.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/mman.h>

#include <cmocka.h>

#include "world.h"

#define B DDP_COLL_SLICE_ELEMS
#define CHUNK (64 * 1024) /* slots of 16384 fp32: the large sizes take many rounds */

/* What every rank of a world reports to the test (shared memory made before the fork). */
typedef struct {
    char algo[8][64];
    char transport[8][16];
    uint64_t hash[8][4];
    uint64_t net[8];
} board_t;

static board_t *board;

static uint64_t fnv(const void *p, size_t n, uint64_t h)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return h;
}

/* ---- which algorithm each topology gets ------------------------------------------------------ */

static int report_choice(ddp_coll_t *c, void *arg)
{
    (void)arg;
    int me = ddp_coll_rank(c);
    snprintf(board->algo[me], sizeof board->algo[me], "%s", ddp_coll_algorithm(c));
    snprintf(board->transport[me], sizeof board->transport[me], "%s", ddp_coll_transport_name(c));
    return w_check_allreduce(c, 3 * B + 5, DDP_DT_F32, DDP_OP_SUM, 3);
}

static void expect_choice(int n, const char *hosts, const char *transport, const char *algo,
                          const char *want)
{
    memset(board, 0, sizeof *board);
    w_cfg_t cfg = {.n = n, .hosts = hosts, .transport = transport, .algo = algo};
    assert_int_equal(w_run(cfg, report_choice, NULL, 30), 0);
    for (int r = 0; r < n; r++) {
        fprintf(stderr, "# hosts %s, transport %s, algo %s: rank %d: %s over %s\n",
                hosts ? hosts : "(one)", transport ? transport : "auto", algo ? algo : "auto", r,
                board->algo[r], board->transport[r]);
        assert_string_equal(board->algo[r], want);
    }
}

static void test_choice(void **s)
{
    expect_choice(4, "0,0,1,1", NULL, NULL, "two-level (2 hosts x 2 ranks)");
    /* the ring's own links keep their transports: 0 -> 1 within host 0, 1 -> 2 across */
    assert_string_equal(board->transport[0], "shm");
    assert_string_equal(board->transport[1], "tcp");
    expect_choice(4, "0,1,0,1", NULL, NULL, "two-level (2 hosts x 2 ranks)");
    expect_choice(6, "0,1,2,0,1,2", NULL, NULL, "two-level (3 hosts x 2 ranks)");
    expect_choice(4, "0,0,1,1", NULL, "two-level", "two-level (2 hosts x 2 ranks)");
    expect_choice(4, "0,0,0,1", NULL, NULL, "flat ring");        /* uneven hosts */
    expect_choice(3, "0,1,2", NULL, NULL, "flat ring");          /* one rank per host */
    expect_choice(4, NULL, NULL, NULL, "flat ring");             /* one host */
    expect_choice(4, "0,0,1,1", "tcp", NULL, "flat ring");       /* forced TCP */
    expect_choice(4, "0,0,1,1", NULL, "flat", "flat ring");      /* the override */
    expect_choice(4, "0,0,0,1", NULL, "two-level", "flat ring"); /* asked, impossible */
}

static void test_unknown_algo(void **s)
{
    ddp_coll_bootstrap_t *bs;
    ddp_coll_t *c;
    ddp_errinfo_t ei;
    assert_int_equal(ddp_coll_bootstrap_single(&bs, &ei), 0);
    ddp_coll_opts_t o = {.algo = "tree"};
    assert_int_equal(ddp_coll_new(bs, &o, &c, &ei), DDP_EINVAL);
    assert_non_null(strstr(ei.msg, "'tree'"));
    setenv("DDP_COLL_ALGO", "two_level", 1);
    assert_int_equal(ddp_coll_new(bs, NULL, &c, &ei), DDP_EINVAL);
    assert_non_null(strstr(ei.msg, "DDP_COLL_ALGO"));
    unsetenv("DDP_COLL_ALGO");
    assert_int_equal(ddp_coll_new(bs, NULL, &c, &ei), 0);
    assert_string_equal(ddp_coll_algorithm(c), "single");
    ddp_coll_free(c);
    ddp_coll_bootstrap_free(bs);
}

/* ---- numerics -------------------------------------------------------------------------------- */

static const size_t sizes[] = {0, 1, 7, B - 1, B + 1, 4 * B + 5, 1000003};

/* Buckets in flight at once with a broadcast and a transfer between them (they run on the flat
 * ring, in submission order with the two-level operations), then a barrier. */
static int mixed_queue(ddp_coll_t *c)
{
    const int n = ddp_coll_size(c), me = ddp_coll_rank(c);
    const size_t per = 3 * B + 11, bytes = 100003;
    float *arena = malloc(sizeof(float) * 4 * per);
    unsigned char *bb = malloc(bytes), *tb = malloc(bytes), receivers[8] = {0};
    ddp_coll_req_t *req[6];
    ddp_errinfo_t ei;
    for (size_t i = 0; i < 4 * per; i++) arena[i] = (float)(me + 1) * (float)(i % 89);
    for (size_t i = 0; i < bytes; i++) {
        bb[i] = me == 1 ? (unsigned char)(i * 13) : 0xEE;
        tb[i] = me == n - 1 ? (unsigned char)(i * 7 + 1) : 0xDD;
    }
    receivers[0] = receivers[2] = 1;
    if (ddp_coll_allreduce(c, arena, per, DDP_DT_F32, DDP_OP_SUM, &req[0]) ||
        ddp_coll_broadcast(c, bb, bytes, 1, &req[1]) ||
        ddp_coll_allreduce(c, arena + per, per, DDP_DT_F32, DDP_OP_SUM, &req[2]) ||
        ddp_coll_transfer(c, tb, bytes, n - 1, receivers, &req[3]) ||
        ddp_coll_reduce_scatter(c, arena + 2 * per, 2 * per, DDP_DT_F32, DDP_OP_SUM, &req[4]))
        W_FAIL("submit");
    if (ddp_coll_wait_all(c, ddp_now_ns() + 20000000000LL, &ei)) W_FAIL("wait_all: %s", ei.msg);
    if (ddp_coll_allgather(c, arena + 2 * per, 2 * per, DDP_DT_F32, &req[5]) ||
        ddp_coll_wait(req[5], 0, &ei))
        W_FAIL("allgather: %s", ei.msg);
    const float tri = (float)(n * (n + 1) / 2);
    for (size_t i = 0; i < 4 * per; i++)
        if (arena[i] != tri * (float)(i % 89))
            W_FAIL("bucket element %zu = %g, want %g", i, arena[i], tri * (float)(i % 89));
    for (size_t i = 0; i < bytes; i++) {
        if (bb[i] != (unsigned char)(i * 13)) W_FAIL("broadcast byte %zu = %u", i, bb[i]);
        unsigned char want = me == n - 1 || receivers[me] ? (unsigned char)(i * 7 + 1) : 0xDD;
        if (tb[i] != want) W_FAIL("transfer byte %zu = %u, want %u", i, tb[i], want);
    }
    free(arena);
    free(bb);
    free(tb);
    if (ddp_coll_barrier(c, ddp_now_ns() + 10000000000LL, &ei)) W_FAIL("barrier: %s", ei.msg);
    return 0;
}

static int suite(ddp_coll_t *c, void *arg)
{
    const char *want = arg;
    if (strcmp(ddp_coll_algorithm(c), want))
        W_FAIL("algorithm %s, expected %s", ddp_coll_algorithm(c), want);
    uint32_t seed = 1;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
        for (int dt = 0; dt < 2; dt++)
            for (int op = 0; op < 2; op++) {
                if (w_check_allreduce(c, sizes[k], (ddp_dtype_t)dt, (ddp_redop_t)op, seed++))
                    return 1;
                if (w_check_scatter_gather(c, sizes[k], (ddp_dtype_t)dt, (ddp_redop_t)op, seed++,
                                           0))
                    return 1;
            }
    return mixed_queue(c);
}

static void run_suite(int n, const char *hosts, const char *want)
{
    w_cfg_t cfg = {.n = n, .hosts = hosts, .chunk_bytes = CHUNK};
    assert_int_equal(w_run(cfg, suite, (void *)want, 50), 0);
}

static void test_2x2(void **s) { run_suite(4, "0,0,1,1", "two-level (2 hosts x 2 ranks)"); }
static void test_3x2(void **s) { run_suite(6, "0,0,1,1,2,2", "two-level (3 hosts x 2 ranks)"); }
static void test_3x2_interleaved(void **s)
{
    run_suite(6, "0,1,2,0,1,2", "two-level (3 hosts x 2 ranks)");
}

/* ---- bitwise, run to run --------------------------------------------------------------------- */

/* Hashes of: an fp32 sum, a bf16 average, this rank's slice of an fp32 average's
 * reduce-scatter, and that slice of the all-reduce of the same input. */
static int hashes(ddp_coll_t *c, void *arg)
{
    (void)arg;
    const int n = ddp_coll_size(c), me = ddp_coll_rank(c);
    const size_t count = 1000003;
    float *f = malloc(count * sizeof(float)), *g = malloc(count * sizeof(float));
    uint16_t *h = malloc(count * sizeof(uint16_t));
    ddp_coll_req_t *r[4];
    ddp_errinfo_t ei;
    w_fill(f, count, DDP_DT_F32, me, 21);
    w_fill(h, count, DDP_DT_BF16, me, 22);
    w_fill(g, count, DDP_DT_F32, me, 23);
    if (ddp_coll_allreduce(c, f, count, DDP_DT_F32, DDP_OP_SUM, &r[0]) ||
        ddp_coll_allreduce(c, h, count, DDP_DT_BF16, DDP_OP_AVG, &r[1]) ||
        ddp_coll_reduce_scatter(c, g, count, DDP_DT_F32, DDP_OP_AVG, &r[2]) ||
        ddp_coll_wait_all(c, 0, &ei))
        W_FAIL("operations: %s", ei.msg);
    size_t lo, hi;
    ddp_coll_slice(count, n, me, &lo, &hi);
    board->hash[me][0] = fnv(f, count * sizeof(float), 1469598103934665603ULL);
    board->hash[me][1] = fnv(h, count * sizeof(uint16_t), 1469598103934665603ULL);
    board->hash[me][2] = fnv(g + lo, (hi - lo) * sizeof(float), 1469598103934665603ULL);
    w_fill(g, count, DDP_DT_F32, me, 23);
    if (ddp_coll_allreduce(c, g, count, DDP_DT_F32, DDP_OP_AVG, &r[3]) ||
        ddp_coll_wait(r[3], 0, &ei))
        W_FAIL("all-reduce: %s", ei.msg);
    board->hash[me][3] = fnv(g + lo, (hi - lo) * sizeof(float), 1469598103934665603ULL);
    snprintf(board->algo[me], sizeof board->algo[me], "%s", ddp_coll_algorithm(c));
    free(f);
    free(g);
    free(h);
    return 0;
}

static void test_bitwise_run_to_run(void **s)
{
    uint64_t first[8][4];
    for (int run = 0; run < 2; run++) {
        memset(board, 0, sizeof *board);
        w_cfg_t cfg = {.n = 4, .hosts = "0,0,1,1", .chunk_bytes = CHUNK};
        assert_int_equal(w_run(cfg, hashes, NULL, 30), 0);
        for (int r = 0; r < 4; r++) {
            assert_string_equal(board->algo[r], "two-level (2 hosts x 2 ranks)");
            /* every rank holds the same all-reduced buffers */
            assert_true(board->hash[r][0] == board->hash[0][0]);
            assert_true(board->hash[r][1] == board->hash[0][1]);
            /* a reduce-scatter's slice is the all-reduce's there, bitwise */
            assert_true(board->hash[r][2] == board->hash[r][3]);
            if (run == 1)
                for (int k = 0; k < 4; k++) assert_true(board->hash[r][k] == first[r][k]);
        }
        memcpy(first, board->hash, sizeof first);
    }
}

/* ---- bytes across hosts ---------------------------------------------------------------------- */

#define BYTES_COUNT ((size_t)2 << 20) /* 8 MiB of fp32 per all-reduce */
#define BYTES_OPS 3

/* The TCP bytes this rank sends during BYTES_OPS all-reduces (between two barriers). */
static int count_bytes(ddp_coll_t *c, void *arg)
{
    (void)arg;
    const int me = ddp_coll_rank(c);
    float *x = malloc(BYTES_COUNT * sizeof(float));
    ddp_errinfo_t ei;
    w_fill(x, BYTES_COUNT, DDP_DT_F32, me, 5);
    if (ddp_coll_barrier(c, 0, &ei)) W_FAIL("barrier: %s", ei.msg);
    uint64_t before = ddp_coll_net_bytes_sent(c);
    for (int k = 0; k < BYTES_OPS; k++) {
        ddp_coll_req_t *r;
        if (ddp_coll_allreduce(c, x, BYTES_COUNT, DDP_DT_F32, DDP_OP_AVG, &r) ||
            ddp_coll_wait(r, 0, &ei))
            W_FAIL("all-reduce: %s", ei.msg);
    }
    board->net[me] = ddp_coll_net_bytes_sent(c) - before;
    snprintf(board->algo[me], sizeof board->algo[me], "%s", ddp_coll_algorithm(c));
    free(x);
    return 0;
}

static void test_bytes_across_hosts(void **s)
{
    uint64_t host[2][2]; /* [flat, two-level][host] */
    const char *algos[2] = {"flat", "auto"};
    for (int a = 0; a < 2; a++) {
        memset(board, 0, sizeof *board);
        w_cfg_t cfg = {.n = 4, .hosts = "0,0,1,1", .algo = algos[a]};
        assert_int_equal(w_run(cfg, count_bytes, NULL, 30), 0);
        assert_string_equal(board->algo[0], a ? "two-level (2 hosts x 2 ranks)" : "flat ring");
        host[a][0] = board->net[0] + board->net[1];
        host[a][1] = board->net[2] + board->net[3];
    }
    const double S = (double)BYTES_COUNT * sizeof(float) * BYTES_OPS;
    for (int h = 0; h < 2; h++) {
        double ratio = (double)host[1][h] / (double)host[0][h];
        fprintf(stderr, "# host %d sent %.3f buffers across (flat ring %.3f): ratio %.4f\n", h,
                (double)host[1][h] / S, (double)host[0][h] / S, ratio);
        /* the flat ring's one link out of each host: 2 (W-1)/W = 1.5 buffers; two-level:
         * 2 (H-1)/H = 1 (the counters see every payload byte: no slack for headers needed) */
        assert_true(host[0][h] >= (uint64_t)(1.5 * S));
        assert_true(ratio <= 0.7);
    }
}

int main(void)
{
    board = mmap(NULL, sizeof *board, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (board == MAP_FAILED) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unknown_algo),
        cmocka_unit_test(test_choice),
        cmocka_unit_test(test_2x2),
        cmocka_unit_test(test_3x2),
        cmocka_unit_test(test_3x2_interleaved),
        cmocka_unit_test(test_bitwise_run_to_run),
        cmocka_unit_test(test_bytes_across_hosts),
    };
    return cmocka_run_group_tests_name("collectives_hier", tests, NULL, NULL);
}
