/* Unit tests of the flight recorder (collectives/flight.c) and its diagnosis (flight_diag.c): the
 * records of a fake world's operations, one rank that never submits named by the diagnosis after
 * the other's deadline, the async-signal-safe file and a SIGSEGV's dump in a child process, the
 * ring's wrap, and the diagnosis over hand-made dumps (a rank behind, a rank that sent nothing,
 * everything finished). One cmocka group; the recorder is per process, so tests run in order.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "collectives/coll.h"
#include "collectives/flight.h"
#include "common/clock.h"

static char run_dir[256];

static int setup_group(void **state)
{
    (void)state;
    snprintf(run_dir, sizeof run_dir, "/tmp/ddp-flight-XXXXXX");
    if (!mkdtemp(run_dir)) return -1;
    ddp_flight_cfg_t cfg = {.records = 8, .run_dir = run_dir, .rank = 0};
    return ddp_flight_setup(&cfg);
}

static int teardown_group(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", run_dir);
    return system(cmd) == 0 ? 0 : -1;
}

/* ---- a fake world of two threads: rank 1 skips the second all-reduce ---------------------- */

typedef struct {
    ddp_coll_fake_world_t *w;
    int rank, rc2;
    pthread_barrier_t *first_done;
} rank_arg_t;

static void *rank_main(void *p)
{
    rank_arg_t *a = p;
    ddp_coll_opts_t o = {.timeout_s = 10}; /* #2 gets an explicit deadline below */
    ddp_coll_t *c;
    if (ddp_coll_new_fake(a->w, a->rank, &o, &c) != 0) return NULL;
    float v[1000];
    for (int i = 0; i < 1000; i++) v[i] = (float)i;
    ddp_coll_req_t *r;
    ddp_coll_tag_next(c, 4);
    ddp_coll_allreduce(c, v, 1000, DDP_DT_F32, DDP_OP_SUM, &r);
    ddp_coll_wait(r, 0, NULL);
    pthread_barrier_wait(a->first_done);
    if (a->rank == 0) { /* rank 1 never submits #2: rank 0 times out on it */
        ddp_coll_tag_next(c, 7);
        ddp_coll_allreduce(c, v, 1000, DDP_DT_F32, DDP_OP_SUM, &r);
        a->rc2 = ddp_coll_wait(r, ddp_now_ns() + 500000000LL, NULL);
    }
    pthread_barrier_wait(a->first_done);
    ddp_coll_free(c);
    return NULL;
}

static json_t *load_file(int rank)
{
    char path[512];
    snprintf(path, sizeof path, "%s/flight/rank-%d.json", run_dir, rank);
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    if (!j) print_message("%s: %s\n", path, e.text);
    return j;
}

static void test_fake_world_hang(void **state)
{
    (void)state;
    ddp_coll_fake_world_t *w;
    assert_int_equal(ddp_coll_fake_world_new(2, &w), 0);
    pthread_barrier_t b;
    pthread_barrier_init(&b, NULL, 2);
    rank_arg_t a[2] = {{w, 0, 0, &b}, {w, 1, 0, &b}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, rank_main, &a[i]);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    pthread_barrier_destroy(&b);
    ddp_coll_fake_world_free(w);
    assert_int_equal(a[0].rc2, DDP_ETIMEDOUT);

    /* the timeout wrote the file from the waiting thread */
    json_t *d = load_file(0);
    assert_non_null(d);
    assert_string_equal(json_string_value(json_object_get(d, "trigger")), "timeout");
    json_t *recs = json_object_get(d, "records");
    assert_int_equal(json_array_size(recs), 3); /* #1 on both ranks, #2 on rank 0 */
    json_t *last = json_array_get(recs, 2);
    assert_int_equal(json_integer_value(json_object_get(last, "seq")), 2);
    assert_int_equal(json_integer_value(json_object_get(last, "bucket")), 7);
    assert_int_equal(json_integer_value(json_object_get(last, "bytes")), 4000);
    assert_string_equal(json_string_value(json_object_get(last, "kind")), "allreduce");
    assert_int_equal(json_integer_value(json_object_get(last, "peer")), 1);
    json_t *first = json_array_get(recs, 0);
    assert_string_equal(json_string_value(json_object_get(first, "state")), "finished");
    assert_int_equal(json_integer_value(json_object_get(first, "bucket")), 4);
    assert_true(json_integer_value(json_object_get(first, "t_finished_ns")) >=
                json_integer_value(json_object_get(first, "t_started_ns")));

    char msg[512];
    assert_int_equal(ddp_flight_diagnose(&d, 1, msg, sizeof msg), 1);
    print_message("diagnosis: %s\n", msg);
    assert_non_null(strstr(msg, "rank 1 never started allreduce #2 (bucket 7, 3.91 KiB) of "
                                "generation 0; rank 0 waits on it; it failed"));
    json_decref(d);
}

/* ---- the signal-safe path ------------------------------------------------------------------ */

static void test_raw_and_wrap(void **state)
{
    (void)state;
    for (int i = 1; i <= 20; i++) { /* 8 records: the last 8 stay */
        uint64_t id = ddp_flight_queued(5, (uint64_t)i, 0, 1, "broadcast", 64, -1);
        ddp_flight_started(id);
        ddp_flight_finished(id, 0);
    }
    assert_int_equal(ddp_flight_write_raw("request"), 0);
    json_t *d = load_file(0);
    assert_non_null(d);
    json_t *recs = json_object_get(d, "records");
    assert_int_equal(json_array_size(recs), 8);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(recs, 0), "seq")), 13);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(recs, 7), "seq")), 20);
    char msg[256];
    assert_int_equal(ddp_flight_diagnose(&d, 1, msg, sizeof msg), 0);
    assert_non_null(strstr(msg, "no collective is stuck"));
    json_decref(d);
    /* a buffer too small for every record still holds valid JSON */
    char small[700];
    ddp_flight_format(small, sizeof small, "x");
    json_error_t e;
    json_t *j = json_loads(small, 0, &e);
    assert_non_null(j);
    json_decref(j);
}

static void test_fatal_signal(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        signal(SIGSEGV, SIG_DFL); /* cmocka's handler would catch it otherwise */
        ddp_flight_cfg_t cfg = {.records = 8, .run_dir = run_dir, .rank = 5};
        ddp_flight_setup(&cfg);
        ddp_flight_catch_fatal();
        ddp_flight_queued(2, 99, 5, 6, "allgather", 1 << 20, 3);
        raise(SIGSEGV);
        _exit(0);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGSEGV); /* chained to the default action */
    json_t *d = load_file(5);
    assert_non_null(d);
    assert_string_equal(json_string_value(json_object_get(d, "trigger")), "signal SIGSEGV");
    json_t *recs = json_object_get(d, "records");
    json_t *last = json_array_get(recs, json_array_size(recs) - 1);
    assert_int_equal(json_integer_value(json_object_get(last, "seq")), 99);
    assert_string_equal(json_string_value(json_object_get(last, "state")), "queued");
    json_decref(d);
}

/* ---- the diagnosis over hand-made dumps ---------------------------------------------------- */

static json_t *rec(int gen, int seq, int rank, int size, const char *state, int peer)
{
    return json_pack("{s:i, s:i, s:i, s:i, s:s, s:I, s:i, s:s, s:i}", "generation", gen, "seq",
                     seq, "rank", rank, "size", size, "kind", "allreduce", "bytes",
                     (json_int_t)25 << 20, "bucket", 7, "state", state, "peer", peer);
}

/* A dump of `rank` with seqs lo..hi of generation gen finished, then `last` in state `st`. */
static json_t *dump(int gen, int rank, int size, int lo, int hi, int last, const char *st,
                    int peer)
{
    json_t *recs = json_array();
    for (int s = lo; s <= hi; s++)
        json_array_append_new(recs, rec(gen, s, rank, size, "finished", -1));
    if (last) json_array_append_new(recs, rec(gen, last, rank, size, st, peer));
    return json_pack("{s:i, s:o}", "rank", rank, "records", recs);
}

static void test_diagnose(void **state)
{
    (void)state;
    char msg[512];
    /* rank 3 finished #1841 and never queued #1842; ranks 0-2 started it; an older generation
     * with a hang of its own is not the one reported */
    json_t *d[5] = {dump(2, 0, 4, 1830, 1841, 1842, "started", 3),
                    dump(2, 1, 4, 1830, 1841, 1842, "started", 0),
                    dump(2, 2, 4, 1830, 1841, 1842, "started", 1),
                    dump(2, 3, 4, 1830, 1841, 0, NULL, -1), dump(1, 0, 2, 1, 3, 4, "started", 1)};
    assert_int_equal(ddp_flight_diagnose(d, 5, msg, sizeof msg), 1);
    assert_string_equal(msg, "rank 3 never started allreduce #1842 (bucket 7, 25 MiB) of "
                             "generation 2; ranks 0-2 wait on it");
    /* the dumps' order does not matter */
    json_t *rev[5] = {d[4], d[3], d[2], d[1], d[0]};
    char msg2[512];
    assert_int_equal(ddp_flight_diagnose(rev, 5, msg2, sizeof msg2), 1);
    assert_string_equal(msg, msg2);
    /* rank 3 queued it but never started it */
    json_decref(d[3]);
    d[3] = dump(2, 3, 4, 1830, 1841, 1842, "queued", -1);
    assert_int_equal(ddp_flight_diagnose(d, 4, msg, sizeof msg), 1);
    assert_non_null(strstr(msg, "rank 3 never started allreduce #1842"));
    assert_non_null(strstr(msg, "(queued, not started)"));
    /* rank 3 sent no dump: the others wait; the rank missing is named */
    assert_int_equal(ddp_flight_diagnose(d, 3, msg, sizeof msg), 1);
    assert_string_equal(msg, "rank 3 sent no record of allreduce #1842 (bucket 7, 25 MiB) of "
                             "generation 2; ranks 0-2 wait on it");
    /* everyone started it; ranks 0 and 2 wait on rank 1 */
    json_t *e[3] = {dump(1, 0, 3, 1, 4, 5, "started", 1), dump(1, 1, 3, 1, 4, 5, "started", 2),
                    dump(1, 2, 3, 1, 4, 5, "started", 1)};
    assert_int_equal(ddp_flight_diagnose(e, 3, msg, sizeof msg), 1);
    assert_string_equal(msg, "allreduce #5 (bucket 7, 25 MiB) of generation 1 started on every "
                             "rank but did not finish; ranks 0-2 wait on ranks 1-2");
    /* nothing at all */
    json_t *none = json_pack("{s:[]}", "records");
    assert_int_equal(ddp_flight_diagnose(&none, 1, msg, sizeof msg), DDP_EINVAL);
    json_decref(none);
    for (int i = 0; i < 5; i++) json_decref(d[i]);
    for (int i = 0; i < 3; i++) json_decref(e[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fake_world_hang),
        cmocka_unit_test(test_raw_and_wrap),
        cmocka_unit_test(test_fatal_signal),
        cmocka_unit_test(test_diagnose),
    };
    return cmocka_run_group_tests_name("flight", tests, setup_group, teardown_group);
}
