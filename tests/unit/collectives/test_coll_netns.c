/* Collectives between two "hosts" for real: two network namespaces joined by a veth pair
 * (created here, removed at the end). Each rank runs in its own namespace, so host ids differ and
 * the ring uses TCP across the veth link. Then two ranks in each namespace: the two-level
 * all-reduce (shared memory within a namespace, TCP across) against the serial double sum, and
 * the bytes that leave each namespace by its veth interface (its kernel counter: headers, ACKs
 * and setup included) against the flat ring's: at most 0.7 of them (2 x 2: 1.0 against 1.5
 * buffers). Exits 77 (skip) only when namespaces cannot be created.
 */
#include <fcntl.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/mman.h>

#include <cmocka.h>

#include "world.h"

static char ns_a[32], ns_b[32];
static int if_id;

static int sh(const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char full[600];
    snprintf(full, sizeof full, "%s >/dev/null 2>&1", cmd);
    return system(full);
}

static void cleanup(void)
{
    sh("ip netns del %s", ns_a);
    sh("ip netns del %s", ns_b);
}

static int setup(void)
{
    int id = if_id = (int)(getpid() % 100000);
    snprintf(ns_a, sizeof ns_a, "ddpA%d", id);
    snprintf(ns_b, sizeof ns_b, "ddpB%d", id);
    if (sh("ip netns add %s", ns_a) || sh("ip netns add %s", ns_b)) {
        cleanup();
        return -1;
    }
    int rc = sh("ip link add va%d type veth peer name vb%d", id, id) ||
             sh("ip link set va%d netns %s", id, ns_a) || sh("ip link set vb%d netns %s", id, ns_b) ||
             sh("ip -n %s addr add 10.199.7.1/24 dev va%d", ns_a, id) ||
             sh("ip -n %s addr add 10.199.7.2/24 dev vb%d", ns_b, id) ||
             sh("ip -n %s link set va%d up", ns_a, id) || sh("ip -n %s link set vb%d up", ns_b, id) ||
             sh("ip -n %s link set lo up", ns_a) || sh("ip -n %s link set lo up", ns_b);
    if (rc) {
        cleanup();
        return -1;
    }
    return 0;
}

static int rank_fn(ddp_coll_t *c, void *arg)
{
    if (strcmp(ddp_coll_transport_name(c), "tcp"))
        W_FAIL("transport %s between namespaces, expected tcp", ddp_coll_transport_name(c));
    if (w_check_allreduce(c, 1000003, DDP_DT_F32, DDP_OP_AVG, 11)) return 1;
    if (w_check_allreduce(c, 7, DDP_DT_BF16, DDP_OP_SUM, 12)) return 1;
    return w_check_allreduce(c, 262144 * 2, DDP_DT_F32, DDP_OP_SUM, 13);
}

static void test_two_hosts(void **s)
{
    w_cfg_t cfg = {.n = 2, .transport = "auto", .host = "10.199.7.1", .port = w_port()};
    pid_t pids[2];
    for (int r = 0; r < 2; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            char path[128];
            snprintf(path, sizeof path, "/var/run/netns/%s", r == 0 ? ns_a : ns_b);
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd < 0 || setns(fd, CLONE_NEWNET) < 0) _exit(3);
            close(fd);
            _exit(w_child(&cfg, r, rank_fn, NULL) ? 1 : 0);
        }
    }
    for (int r = 0; r < 2; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
}

/* ---- two ranks per namespace ------------------------------------------------------------- */

#define TWO_COUNT ((size_t)2 << 20) /* 8 MiB of fp32 per all-reduce */
#define TWO_OPS 3

typedef struct {
    char algo[4][64];
    uint64_t net[4];
} two_board_t;

static two_board_t *two_board;

static int two_per_host(ddp_coll_t *c, void *arg)
{
    const char *want = arg;
    const int me = ddp_coll_rank(c);
    snprintf(two_board->algo[me], sizeof two_board->algo[me], "%s", ddp_coll_algorithm(c));
    if (strcmp(ddp_coll_algorithm(c), want))
        W_FAIL("all-reduce %s, expected %s", ddp_coll_algorithm(c), want);
    if (w_check_allreduce(c, 1000003, DDP_DT_F32, DDP_OP_AVG, 31) ||
        w_check_allreduce(c, 3 * DDP_COLL_SLICE_ELEMS + 7, DDP_DT_BF16, DDP_OP_SUM, 32) ||
        w_check_scatter_gather(c, 1000003, DDP_DT_F32, DDP_OP_AVG, 33, 0))
        return 1;
    float *x = malloc(TWO_COUNT * sizeof(float));
    w_fill(x, TWO_COUNT, DDP_DT_F32, me, 5);
    ddp_errinfo_t ei;
    uint64_t before = ddp_coll_net_bytes_sent(c);
    for (int k = 0; k < TWO_OPS; k++) {
        ddp_coll_req_t *r;
        if (ddp_coll_allreduce(c, x, TWO_COUNT, DDP_DT_F32, DDP_OP_SUM, &r) ||
            ddp_coll_wait(r, 0, &ei))
            W_FAIL("all-reduce: %s", ei.msg);
    }
    two_board->net[me] = ddp_coll_net_bytes_sent(c) - before;
    free(x);
    return 0;
}

/* The bytes interface `dev` of namespace ns has sent. */
static uint64_t tx_bytes(const char *ns, const char *dev)
{
    char cmd[160];
    snprintf(cmd, sizeof cmd, "ip netns exec %s cat /sys/class/net/%s/statistics/tx_bytes", ns,
             dev);
    FILE *f = popen(cmd, "r");
    unsigned long long v = 0;
    if (f) {
        if (fscanf(f, "%llu", &v) != 1) v = 0;
        pclose(f);
    }
    return v;
}

/* Ranks 0, 1 in namespace A, 2, 3 in B, with algorithm algo; tx[h]: bytes each namespace's veth
 * sent meanwhile, net[h]: the TCP payload its ranks counted. */
static void run_two_per_host(const char *algo, const char *want, uint64_t tx[2], uint64_t net[2])
{
    char va[16], vb[16];
    snprintf(va, sizeof va, "va%d", if_id);
    snprintf(vb, sizeof vb, "vb%d", if_id);
    uint64_t a0 = tx_bytes(ns_a, va), b0 = tx_bytes(ns_b, vb);
    w_cfg_t cfg = {.n = 4, .host = "10.199.7.1", .port = w_port(), .algo = algo};
    pid_t pids[4];
    for (int r = 0; r < 4; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            char path[128];
            snprintf(path, sizeof path, "/var/run/netns/%s", r < 2 ? ns_a : ns_b);
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd < 0 || setns(fd, CLONE_NEWNET) < 0) _exit(3);
            close(fd);
            _exit(w_child(&cfg, r, two_per_host, (void *)want) ? 1 : 0);
        }
    }
    for (int r = 0; r < 4; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        assert_true(WIFEXITED(st));
        assert_int_equal(WEXITSTATUS(st), 0);
    }
    tx[0] = tx_bytes(ns_a, va) - a0;
    tx[1] = tx_bytes(ns_b, vb) - b0;
    net[0] = two_board->net[0] + two_board->net[1];
    net[1] = two_board->net[2] + two_board->net[3];
}

static void test_two_hosts_two_ranks(void **s)
{
    uint64_t tx[2][2], net[2][2]; /* [flat, two-level][namespace] */
    run_two_per_host("flat", "flat ring", tx[0], net[0]);
    run_two_per_host(NULL, "two-level (2 hosts x 2 ranks)", tx[1], net[1]);
    const double S = (double)TWO_COUNT * sizeof(float) * TWO_OPS;
    for (int h = 0; h < 2; h++) {
        double veth = (double)tx[1][h] / (double)tx[0][h];
        double payload = (double)net[1][h] / (double)net[0][h];
        fprintf(stderr, "# namespace %c: its veth sent %.1f MB over the world's life (flat ring "
                "%.1f MB): ratio %.4f; TCP payload of the %d all-reduces: %.3f buffers (flat "
                "%.3f): ratio %.4f\n", 'A' + h, tx[1][h] / 1e6, tx[0][h] / 1e6, veth, TWO_OPS,
                net[1][h] / S, net[0][h] / S, payload);
        assert_true(tx[0][h] > 0 && net[0][h] > 0);
        assert_true(veth <= 0.7);
        assert_true(payload <= 0.7);
    }
}

int main(void)
{
    if (setup() < 0) {
        fprintf(stderr, "cannot create network namespaces: skipped\n");
        return 77;
    }
    two_board = mmap(NULL, sizeof *two_board, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                     -1, 0);
    if (two_board == MAP_FAILED) {
        cleanup();
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_hosts),
        cmocka_unit_test(test_two_hosts_two_ranks),
    };
    int rc = cmocka_run_group_tests_name("collectives_netns", tests, NULL, NULL);
    cleanup();
    return rc;
}
