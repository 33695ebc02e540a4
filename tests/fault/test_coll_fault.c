/* Collectives under faults: a rank SIGKILLed in the middle of an all-reduce (shm and TCP, the
 * single-pass path on shared collective memory, and the two-level all-reduce between the hosts of
 * the DDP_TEST_HOST_OF_RANK test hook) makes
 * every survivor's wait fail within 5 s with an error naming that rank; the survivors abort, form
 * a new communicator (next generation) in the same process, and it works. A stalled rank
 * (SIGSTOP) is named by the deadline. Over TCP, a survivor that frees its buffer (16 MiB: unmapped)
 * as soon as the failed wait returns must not crash: the link sends no byte from it afterwards.
 * Foreign and malformed connections to the rendezvous and data ports (wrong token, garbage, half a
 * header then a stall) are refused and the job goes on.
 */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/socket.h>

#include <cmocka.h>

#include "collectives/net.h"
#include "world.h"

typedef struct {
    int rc;
    int64_t t_err;
    int after_ok;
    char msg[520];
} report_t;

typedef struct {
    int victim;
    int fds[8][2];  /* per rank: report pipe */
    int ready[2];   /* ranks write a byte when inside the all-reduce loop */
    int port2;      /* rendezvous of the next generation */
    const char *transport;
    double timeout_s;
    int coll_mem; /* the all-reduces run on memory from ddp_coll_mem_alloc */
    int free_early; /* survivors free the (malloc'ed) buffer right after the failure */
    const char *hosts; /* DDP_TEST_HOST_OF_RANK (w_cfg_t.hosts): NULL one host */
} kill_arg_t;

/* Survivors: loop big all-reduces until one fails; report; re-form without the victim. */
static int kill_rank_fn(ddp_coll_t *c, void *p)
{
    kill_arg_t *a = p;
    int me = ddp_coll_rank(c), n = ddp_coll_size(c);
    size_t count = 4u << 20; /* 16 MiB of fp32 */
    report_t rep = {0};
    ddp_errinfo_t ei;
    float *buf = NULL;
    if (a->hosts && strncmp(ddp_coll_algorithm(c), "two-level", 9))
        W_FAIL("hosts %s: all-reduce %s, expected two-level", a->hosts, ddp_coll_algorithm(c));
    if (a->coll_mem) {
        if (ddp_coll_mem_alloc(c, count * sizeof(float), (void **)&buf, &ei) ||
            !ddp_coll_mem_shared(c, buf))
            W_FAIL("shared collective memory: %s", ei.msg);
    } else {
        buf = malloc(count * sizeof(float));
    }
    for (size_t i = 0; i < count; i++) buf[i] = 1.0f;
    char one = 1;
    for (int it = 0; it < 100000; it++) {
        ddp_coll_req_t *r;
        int rc = ddp_coll_allreduce(c, buf, count, DDP_DT_F32, DDP_OP_AVG, &r);
        if (rc == 0) rc = ddp_coll_wait(r, 0, &ei);
        else snprintf(ei.msg, sizeof ei.msg, "%s", ddp_coll_last_error(c));
        if (it == 1 && write(a->ready[1], &one, 1) != 1) return 1;
        if (rc) {
            rep.rc = rc;
            rep.t_err = ddp_now_ns();
            snprintf(rep.msg, sizeof rep.msg, "%s", ei.msg);
            if (a->free_early && !a->coll_mem) {
                free(buf);
                buf = NULL;
                usleep(100000); /* the comm thread tells the neighbours meanwhile */
            }
            break;
        }
    }
    /* new generation of the survivors, ranks renumbered in order */
    int newrank = me < a->victim ? me : me - 1;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", a->port2);
    ddp_coll_rdzv_cfg_t rc2 = {.rank = newrank, .size = n - 1, .addr = addr,
                               .token = "test-token", .generation = 1, .timeout_s = 20};
    ddp_coll_bootstrap_t *bs;
    ddp_coll_t *c2 = NULL;
    if (ddp_coll_bootstrap_tcp(&rc2, &bs, &ei) == 0) {
        ddp_coll_opts_t o = {.transport = a->transport};
        if (ddp_coll_new(bs, &o, &c2, &ei) == 0) {
            rep.after_ok = !w_check_allreduce(c2, 1000003, DDP_DT_F32, DDP_OP_SUM, 9) &&
                           ddp_coll_generation(c2) == 1;
        }
        ddp_coll_bootstrap_free(bs);
    }
    if (!c2) fprintf(stderr, "rank %d: re-forming failed: %s\n", me, ei.msg);
    ddp_coll_free(c2);
    if (write(a->fds[me][1], &rep, sizeof rep) != sizeof rep) return 1;
    if (!a->coll_mem) free(buf); /* collective memory went with its communicator */
    return 0;
}

static void run_kill_hosts(int n, int victim, const char *transport, int stop_instead,
                           int coll_mem, int free_early, const char *hosts)
{
    kill_arg_t a = {.victim = victim, .transport = transport, .port2 = w_port(),
                    .timeout_s = stop_instead ? 2.0 : 0, .coll_mem = coll_mem,
                    .free_early = free_early, .hosts = hosts};
    assert_int_equal(pipe(a.ready), 0);
    for (int r = 0; r < n; r++) assert_int_equal(pipe(a.fds[r]), 0);
    w_cfg_t cfg = {.n = n, .transport = transport, .port = w_port(), .timeout_s = a.timeout_s,
                   .hosts = hosts};
    pid_t pids[8];
    for (int r = 0; r < n; r++) {
        pids[r] = fork();
        if (pids[r] == 0) _exit(w_child(&cfg, r, kill_rank_fn, &a) ? 1 : 0);
    }
    /* wait until every rank has completed two all-reduces, then strike mid-operation */
    for (int k = 0; k < n; k++) {
        char b;
        assert_int_equal(read(a.ready[0], &b, 1), 1);
    }
    int64_t t_kill = ddp_now_ns();
    kill(pids[victim], stop_instead ? SIGSTOP : SIGKILL);
    /* collect every survivor's report first and only then release the victim, so that a
     * failed assertion below can never leave a stopped process behind */
    report_t reps[8];
    for (int r = 0; r < n; r++) {
        if (r == victim) continue;
        fcntl(a.fds[r][0], F_SETFL, 0);
        if (read(a.fds[r][0], &reps[r], sizeof reps[r]) != sizeof reps[r]) reps[r].rc = 1;
    }
    kill(pids[victim], SIGKILL);
    int named = 0;
    for (int r = 0; r < n; r++) {
        if (r == victim) continue;
        report_t rep = reps[r];
        assert_true(rep.rc != 1);
        double dt = (double)(rep.t_err - t_kill) * 1e-9;
        fprintf(stderr, "# rank %d: %s after %.3f s: %s; new generation works: %d\n", r,
                ddp_err_name(rep.rc), dt, rep.msg, rep.after_ok);
        assert_true(rep.rc == DDP_EPEER || rep.rc == DDP_ETIMEDOUT);
        assert_true(dt < 5.0);
        char name[32];
        snprintf(name, sizeof name, "rank %d", victim);
        /* a SIGKILLed rank is named by every survivor; a stalled one by its downstream
         * neighbour at least (others may name the neighbour they were waiting on) */
        if (!stop_instead) assert_non_null(strstr(rep.msg, name));
        named += strstr(rep.msg, name) != NULL;
        assert_non_null(strstr(rep.msg, "did not arrive"));
        assert_non_null(strstr(rep.msg, "allreduce #"));
        assert_true(rep.after_ok);
    }
    assert_true(named >= 1);
    for (int r = 0; r < n; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        if (r != victim) assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
        close(a.fds[r][0]);
        close(a.fds[r][1]);
    }
    close(a.ready[0]);
    close(a.ready[1]);
}

static void run_kill_ex(int n, int victim, const char *transport, int stop_instead,
                        int coll_mem, int free_early)
{
    run_kill_hosts(n, victim, transport, stop_instead, coll_mem, free_early, NULL);
}

static void run_kill_in(int n, int victim, const char *transport, int stop_instead,
                        int coll_mem)
{
    run_kill_ex(n, victim, transport, stop_instead, coll_mem, 0);
}

static void run_kill(int n, int victim, const char *transport, int stop_instead)
{
    run_kill_in(n, victim, transport, stop_instead, 0);
}

static void test_kill_shm_3(void **s) { run_kill(3, 1, "auto", 0); }
static void test_kill_mem_3(void **s) { run_kill_in(3, 1, "auto", 0, 1); }
static void test_kill_mem_4(void **s) { run_kill_in(4, 0, "auto", 0, 1); }
static void test_stall_mem_3(void **s) { run_kill_in(3, 2, "auto", 1, 1); }
static void test_kill_tcp_3(void **s) { run_kill(3, 2, "tcp", 0); }
static void test_kill_tcp_3_free(void **s) { run_kill_ex(3, 0, "tcp", 0, 0, 1); }
static void test_kill_shm_4(void **s) { run_kill(4, 0, "auto", 0); }
static void test_stall_shm_3(void **s) { run_kill(3, 1, "auto", 1); }
/* the two-level all-reduce (hosts of the DDP_TEST_HOST_OF_RANK hook): a rank killed or stalled
 * in one step is named by the ranks of the other steps too */
static void test_kill_two_level_2x2(void **s) { run_kill_hosts(4, 3, "auto", 0, 0, 0, "0,0,1,1"); }
static void test_kill_two_level_3x2(void **s)
{
    run_kill_hosts(6, 4, "auto", 0, 0, 0, "0,1,2,0,1,2");
}
static void test_stall_two_level_2x2(void **s)
{
    run_kill_hosts(4, 0, "auto", 1, 0, 0, "0,0,1,1");
}

/* ---- malformed connections ---------------------------------------------------------------- */

static int rogue(const char *host, int port, const void *bytes, size_t len)
{
    /* retries until the port listens (30 s): the test waits for that event, not for a time */
    int fd = ddp__net_connect(host, port, ddp_now_ns() + 30000000000LL);
    if (fd < 0) return fd;
    if (len) ddp__net_send_all(fd, bytes, len, ddp_now_ns() + 1000000000LL);
    return fd;
}

typedef struct {
    int data_base;
} mal_arg_t;

static int mal_fn(ddp_coll_t *c, void *p)
{
    return w_check_allreduce(c, 100003, DDP_DT_F32, DDP_OP_SUM, 3);
}

static void test_malformed(void **s)
{
    int port = w_port(), dbase = w_port() + 40;
    char logpath[] = "/tmp/ddp-coll-mal-XXXXXX";
    int logfd = mkstemp(logpath);
    assert_true(logfd >= 0);
    char db[16];
    snprintf(db, sizeof db, "%d", dbase);
    setenv("DDP_DATA_PORT", db, 1);
    w_cfg_t cfg = {.n = 2, .transport = "tcp", .port = port, .pre_new_delay_s = 1.0};
    pid_t p0 = fork();
    if (p0 == 0) {
        dup2(logfd, 2);
        _exit(w_child(&cfg, 0, mal_fn, NULL) ? 1 : 0);
    }
    /* rank 0 is alone at the rendezvous: send it garbage, a wrong token, half a hello (rogue
     * connects as soon as rank 0 listens) */
    char garbage[200];
    memset(garbage, 'G', sizeof garbage);
    struct {
        char magic[8];
        uint32_t rank, size;
        uint64_t gen;
        char token[128];
    } h = {.magic = "DDPRDZV1", .rank = 1, .size = 2};
    snprintf(h.token, sizeof h.token, "not-the-token");
    int f1 = rogue("127.0.0.1", port, garbage, sizeof garbage);
    int f2 = rogue("127.0.0.1", port, &h, sizeof h);
    int f3 = rogue("127.0.0.1", port, &h, 20); /* half a header, then silence */
    assert_true(f1 >= 0 && f2 >= 0 && f3 >= 0);
    /* rank 1 joins; before its data link, rank 0's data port gets the same treatment */
    pid_t p1 = fork();
    if (p1 == 0) {
        dup2(logfd, 2);
        _exit(w_child(&cfg, 1, mal_fn, NULL) ? 1 : 0);
    }
    /* rank 1 holds back its communicator for 1 s (pre_new_delay_s): rank 0's data port opens
     * meanwhile, and rogue connects as soon as it does */
    int g1 = rogue("127.0.0.1", dbase, garbage, sizeof garbage);
    int g3 = rogue("127.0.0.1", dbase, "DDPLINK1xxxx", 12);
    int st0, st1;
    waitpid(p0, &st0, 0);
    waitpid(p1, &st1, 0);
    unsetenv("DDP_DATA_PORT");
    assert_true(WIFEXITED(st0) && WEXITSTATUS(st0) == 0);
    assert_true(WIFEXITED(st1) && WEXITSTATUS(st1) == 0);
    close(f1);
    close(f2);
    close(f3);
    if (g1 >= 0) close(g1);
    if (g3 >= 0) close(g3);
    char log[16384] = "";
    lseek(logfd, 0, SEEK_SET);
    ssize_t n = read(logfd, log, sizeof log - 1);
    log[n > 0 ? n : 0] = 0;
    close(logfd);
    unlink(logpath);
    fprintf(stderr, "%s", log);
    assert_non_null(strstr(log, "garbage bytes"));
    assert_non_null(strstr(log, "wrong job token"));
    assert_non_null(strstr(log, "incomplete hello"));
    assert_non_null(strstr(log, "refused data connection"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_kill_shm_3),
        cmocka_unit_test(test_kill_tcp_3),
        cmocka_unit_test(test_kill_tcp_3_free),
        cmocka_unit_test(test_kill_shm_4),
        cmocka_unit_test(test_stall_shm_3),
        cmocka_unit_test(test_kill_mem_3),
        cmocka_unit_test(test_kill_mem_4),
        cmocka_unit_test(test_stall_mem_3),
        cmocka_unit_test(test_kill_two_level_2x2),
        cmocka_unit_test(test_kill_two_level_3x2),
        cmocka_unit_test(test_stall_two_level_2x2),
    };
    return cmocka_run_group_tests_name("collectives_fault", tests, NULL, NULL);
}
