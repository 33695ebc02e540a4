/* Collectives between two "hosts" for real: two network namespaces joined by a veth pair
 * (created here, removed at the end). Each rank runs in its own namespace, so host ids differ and
 * the ring uses TCP across the veth link. Exits 77 (skip) only when namespaces cannot be created.
 */
#include <fcntl.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "world.h"

static char ns_a[32], ns_b[32];

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
    int id = (int)(getpid() % 100000);
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

int main(void)
{
    if (setup() < 0) {
        fprintf(stderr, "cannot create network namespaces: skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_hosts),
    };
    int rc = cmocka_run_group_tests_name("collectives_netns", tests, NULL, NULL);
    cleanup();
    return rc;
}
