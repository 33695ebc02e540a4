/* The elastic coordinator (daemon/coord.c) against clients that speak its protocol
 * (collectives/elastic_proto.h) over real loopback TCP: the first generation, the end of the job
 * and a rank that comes after it, and adoption after a daemon restart (all members back; a
 * joiner or a missing member ends the adopted generation instead), and the collection of flight
 * recorder dumps and its diagnosis, and the choice of the source by step and by the generation
 * a state came from. One thread: the test pumps
 * the coordinator's libuv loop while it waits for a client's line. One cmocka group.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "common/clock.h"
#include "daemon/coord.h"

typedef struct {
    int fd;
    char buf[65536];
    size_t len;
} client_t;

static json_t *events; /* every event the coordinator emitted */

static void on_event(void *arg, json_t *ev)
{
    (void)arg;
    json_array_append(events, ev);
}

static ddpd_coord_t *coord_start(uv_loop_t *loop, int world, int min_workers, int adopt,
                                 unsigned long last_gen, double hb_timeout_s)
{
    ddpd_coord_cfg_t cfg = {.host = "127.0.0.1", .token = "tok", .world = world,
                            .min_workers = min_workers, .max_workers = world,
                            .hb_timeout_s = hb_timeout_s, .rejoin_timeout_s = 30,
                            .adopt = adopt, .last_gen = last_gen, .on_event = on_event};
    ddpd_coord_t *c = NULL;
    ddp_errinfo_t ei;
    ddp_errinfo_clear(&ei);
    assert_int_equal(ddpd_coord_new(loop, &cfg, &c, &ei), 0);
    return c;
}

static void coord_stop(uv_loop_t *loop, ddpd_coord_t *c)
{
    ddpd_coord_close(c);
    uv_run(loop, UV_RUN_DEFAULT); /* until every handle is closed */
}

/* A coordinator on its own loop, and clients connected to it. */
typedef struct {
    uv_loop_t loop;
    ddpd_coord_t *c;
    client_t cl[3];
    int n;
} fixture_t;

static void cl_connect(client_t *cl, int port);

static void fx_start(fixture_t *f, int n_clients, int world, int min_workers, int adopt,
                     unsigned long last_gen, double hb_timeout_s)
{
    uv_loop_init(&f->loop);
    f->c = coord_start(&f->loop, world, min_workers, adopt, last_gen, hb_timeout_s);
    f->n = n_clients;
    for (int i = 0; i < n_clients; i++) cl_connect(&f->cl[i], ddpd_coord_port(f->c));
}

static void fx_stop(fixture_t *f)
{
    for (int i = 0; i < f->n; i++) close(f->cl[i].fd);
    coord_stop(&f->loop, f->c);
    uv_loop_close(&f->loop);
}

static void cl_connect(client_t *cl, int port)
{
    memset(cl, 0, sizeof *cl);
    cl->fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(cl->fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(cl->fd, (struct sockaddr *)&a, sizeof a), 0);
    fcntl(cl->fd, F_SETFL, O_NONBLOCK);
}

static void cl_send(client_t *cl, const char *line)
{
    size_t n = strlen(line);
    assert_int_equal(write(cl->fd, line, n), (ssize_t)n);
    assert_int_equal(write(cl->fd, "\n", 1), 1);
}

/* A join with its state's step and generation (sgen; 0: a worker that does not say). */
static void cl_join_state(client_t *cl, int hint, long step, unsigned long sgen)
{
    char line[240];
    snprintf(line, sizeof line,
             "{\"t\":\"join\",\"token\":\"tok\",\"pid\":%d,\"host_id\":\"test\",\"hint\":%d,"
             "\"step\":%ld,\"sgen\":%lu}", 100000 + hint, hint, step, sgen);
    cl_send(cl, line);
}

static void cl_join(client_t *cl, int hint, long step) { cl_join_state(cl, hint, step, 0); }

static void cl_rejoin(client_t *cl, unsigned long gen, int rank, int size, long step)
{
    char line[300];
    snprintf(line, sizeof line,
             "{\"t\":\"rejoin\",\"token\":\"tok\",\"pid\":%d,\"host_id\":\"test\",\"hint\":%d,"
             "\"step\":%ld,\"gen\":%lu,\"rank\":%d,\"size\":%d}", 100000 + rank, rank, step, gen,
             rank, size);
    cl_send(cl, line);
}

/* Pumps the loop and reads cl until a line of type `t` arrives (heartbeats skipped), sending
 * cl's own heartbeat every 100 ms as a worker does: the message (new reference), or NULL after
 * a 10 s deadline. */
static json_t *cl_expect(uv_loop_t *loop, client_t *cl, const char *t)
{
    int64_t deadline = ddp_now_ns() + 10000000000LL, next_hb = 0;
    while (ddp_now_ns() < deadline) {
        if (ddp_now_ns() >= next_hb) {
            cl_send(cl, "{\"t\":\"hb\",\"step\":40}");
            next_hb = ddp_now_ns() + 100000000LL;
        }
        char *nl;
        while ((nl = memchr(cl->buf, '\n', cl->len))) {
            json_t *m = json_loadb(cl->buf, (size_t)(nl - cl->buf), 0, NULL);
            size_t used = (size_t)(nl - cl->buf) + 1;
            memmove(cl->buf, nl + 1, cl->len - used);
            cl->len -= used;
            const char *mt = json_string_value(json_object_get(m, "t"));
            if (mt && !strcmp(mt, t)) return m;
            json_decref(m);
        }
        uv_run(loop, UV_RUN_NOWAIT);
        ssize_t n = read(cl->fd, cl->buf + cl->len, sizeof cl->buf - cl->len);
        if (n > 0) cl->len += (size_t)n;
        if (n <= 0) {
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    return NULL;
}

static long ival(json_t *m, const char *k)
{
    return (long)json_integer_value(json_object_get(m, k));
}

/* The event of that kind the coordinator emitted last, or NULL (borrowed). */
static json_t *last_event(const char *what)
{
    json_t *found = NULL, *e;
    size_t i;
    json_array_foreach(events, i, e)
    {
        if (!strcmp(json_string_value(json_object_get(e, "event")), what)) found = e;
    }
    return found;
}

static int setup(void **state)
{
    (void)state;
    events = json_array();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    json_decref(events);
    return 0;
}

/* Two joiners form generation 1 in the launcher's order; both finish: "done", and a rank that
 * comes after that is told the job is done. */
static void test_form_done_late(void **state)
{
    (void)state;
    fixture_t f;
    fx_start(&f, 3, 2, 1, 0, 0, 5);
    client_t *a = &f.cl[0], *b = &f.cl[1], *late = &f.cl[2];
    cl_join(b, 1, -1);
    cl_join(a, 0, -1);
    json_t *ga = cl_expect(&f.loop, a, "gen"), *gb = cl_expect(&f.loop, b, "gen");
    assert_non_null(ga);
    assert_non_null(gb);
    assert_int_equal(ival(ga, "gen"), 1);
    assert_int_equal(ival(ga, "rank"), 0);
    assert_int_equal(ival(gb, "rank"), 1);
    assert_int_equal(ival(gb, "size"), 2);
    assert_true(json_number_value(json_object_get(ga, "reconnect_s")) == 30.0);
    json_decref(ga);
    json_decref(gb);
    cl_send(a, "{\"t\":\"done\",\"step\":10}");
    cl_send(b, "{\"t\":\"done\",\"step\":10}");
    int64_t deadline = ddp_now_ns() + 10000000000LL;
    while (!last_event("done") && ddp_now_ns() < deadline) uv_run(&f.loop, UV_RUN_NOWAIT);
    assert_non_null(last_event("done"));
    cl_join(late, 1, -1);
    json_t *x = cl_expect(&f.loop, late, "exit");
    assert_non_null(x);
    assert_true(json_is_true(json_object_get(x, "done")));
    assert_string_equal(json_string_value(json_object_get(x, "why")), "the job is done");
    json_decref(x);
    fx_stop(&f);
}

/* After a failure, a replacement that joined before the survivor came back is left out of the
 * survivor's generation (which is told to regroup at its first boundary), and taken into the
 * next one with the survivor's state. */
static void test_failure_defers_a_fresh_rank(void **state)
{
    (void)state;
    fixture_t f;
    fx_start(&f, 3, 2, 1, 0, 0, 5);
    client_t *a = &f.cl[0], *b = &f.cl[1], *c = &f.cl[2];
    cl_join(a, 0, -1);
    cl_join(b, 1, -1);
    json_decref(cl_expect(&f.loop, a, "gen"));
    json_decref(cl_expect(&f.loop, b, "gen"));
    close(b->fd); /* b dies */
    b->fd = open("/dev/null", O_RDONLY); /* fx_stop closes it */
    json_t *reform = cl_expect(&f.loop, a, "reform");
    assert_non_null(reform);
    json_decref(reform);
    cl_join(c, 2, -1); /* the replacement (pid 100002), before the survivor is back */
    int64_t deadline = ddp_now_ns() + 10000000000LL;
    json_t *ev = NULL;
    while (!((ev = last_event("join")) && ival(ev, "pid") == 100002) &&
           ddp_now_ns() < deadline)
        uv_run(&f.loop, UV_RUN_NOWAIT);
    assert_non_null(ev);
    cl_join(a, 0, 5);
    json_t *g2 = cl_expect(&f.loop, a, "gen");
    assert_non_null(g2);
    assert_int_equal(ival(g2, "gen"), 2);
    assert_int_equal(ival(g2, "size"), 1);
    json_t *rg = cl_expect(&f.loop, a, "regroup");
    assert_non_null(rg);
    assert_int_equal(ival(rg, "gen"), 2);
    cl_join(a, 0, 6); /* after its step */
    json_t *ga = cl_expect(&f.loop, a, "gen"), *gc = cl_expect(&f.loop, c, "gen");
    assert_non_null(ga);
    assert_non_null(gc);
    assert_int_equal(ival(gc, "gen"), 3);
    assert_int_equal(ival(gc, "size"), 2);
    assert_int_equal(ival(gc, "rank"), 1);
    assert_true(json_is_true(json_object_get(gc, "sync")));
    assert_int_equal(ival(gc, "source"), 0);
    assert_int_equal(ival(gc, "step"), 6);
    json_decref(g2);
    json_decref(rg);
    json_decref(ga);
    json_decref(gc);
    fx_stop(&f);
}

/* A rank late for a generation that redid its step holds the same step number with another
 * history: b, left alone in generation 2 after a died mid-vote, redid step 19; a returns (a new
 * connection, as after a coordinator restart) with its own step 19 of generation 1. Generation 3
 * takes b's state and tells a to receive it; b receives nothing. Before, equal steps meant no
 * transfer, and the replicas diverged (the replica check failed the job). */
static void test_same_step_older_generation_receives(void **state)
{
    (void)state;
    fixture_t f;
    fx_start(&f, 3, 2, 1, 0, 0, 5);
    client_t *a = &f.cl[0], *b = &f.cl[1], *late = &f.cl[2];
    cl_join(a, 0, -1);
    cl_join(b, 1, -1);
    json_decref(cl_expect(&f.loop, a, "gen"));
    json_decref(cl_expect(&f.loop, b, "gen"));
    close(a->fd); /* a dies in step 19's vote: b never got its result */
    a->fd = open("/dev/null", O_RDONLY); /* fx_stop closes it */
    cl_join_state(b, 1, 18, 1);
    json_t *g2 = cl_expect(&f.loop, b, "gen");
    assert_non_null(g2);
    assert_int_equal(ival(g2, "gen"), 2);
    assert_int_equal(ival(g2, "size"), 1);
    assert_false(json_is_true(json_object_get(g2, "receive")));
    json_decref(g2);
    cl_join_state(late, 0, 19, 1); /* a, back with step 19 of generation 1 */
    json_t *rg = cl_expect(&f.loop, b, "regroup");
    assert_non_null(rg);
    json_decref(rg);
    cl_join_state(b, 1, 19, 2); /* b redid step 19 in generation 2 */
    json_t *gb = cl_expect(&f.loop, b, "gen"), *gl = cl_expect(&f.loop, late, "gen");
    assert_non_null(gb);
    assert_non_null(gl);
    assert_int_equal(ival(gb, "gen"), 3);
    assert_int_equal(ival(gb, "rank"), 0); /* the survivor keeps its place */
    assert_int_equal(ival(gl, "rank"), 1);
    assert_int_equal(ival(gl, "source"), 0);
    assert_int_equal(ival(gl, "step"), 19);
    assert_true(json_is_true(json_object_get(gl, "sync")));
    assert_true(json_is_true(json_object_get(gl, "receive")));
    assert_false(json_is_true(json_object_get(gb, "receive")));
    json_decref(gb);
    json_decref(gl);
    fx_stop(&f);
}

/* A coordinator that restarted numbers its generations above every generation its members'
 * states came from: a generation 3 formed there must not tie with a member's older generation 5. */
static void test_generations_above_members_states(void **state)
{
    (void)state;
    fixture_t f;
    fx_start(&f, 2, 2, 2, 0, 0, 5);
    cl_join_state(&f.cl[0], 0, 40, 5);
    cl_join_state(&f.cl[1], 1, 40, 5);
    json_t *ga = cl_expect(&f.loop, &f.cl[0], "gen"), *gb = cl_expect(&f.loop, &f.cl[1], "gen");
    assert_non_null(ga);
    assert_non_null(gb);
    assert_int_equal(ival(ga, "gen"), 6);
    assert_false(json_is_true(json_object_get(ga, "sync"))); /* the same state: no transfer */
    assert_false(json_is_true(json_object_get(gb, "receive")));
    json_decref(ga);
    json_decref(gb);
    fx_stop(&f);
}

/* A restarted coordinator adopts generation 7 once both of its members are back, without a
 * new generation: each member hears "adopted". */
/* A member's flight recorder dump (its collective timed out) gets the other member asked for one
 * ("dump"); once it answers, the "flight" event carries their diagnosis. */
static void test_flight_collection(void **state)
{
    (void)state;
    fixture_t f;
    fx_start(&f, 2, 2, 2, 0, 0, 5);
    client_t *a = &f.cl[0], *b = &f.cl[1];
    cl_join(a, 0, -1);
    cl_join(b, 1, -1);
    json_t *ga = cl_expect(&f.loop, a, "gen"), *gb = cl_expect(&f.loop, b, "gen");
    assert_non_null(ga);
    assert_non_null(gb);
    json_decref(ga);
    json_decref(gb);
    static const char rec[] = "{\"generation\":1,\"seq\":%d,\"rank\":%d,\"size\":2,"
                              "\"kind\":\"allreduce\",\"bytes\":1048576,\"bucket\":2,"
                              "\"state\":\"%s\",\"peer\":%d}";
    char r4a[256], r5a[256], r4b[256], line[1024];
    snprintf(r4a, sizeof r4a, rec, 4, 0, "finished", -1);
    snprintf(r5a, sizeof r5a, rec, 5, 0, "failed", 1);
    snprintf(r4b, sizeof r4b, rec, 4, 1, "finished", -1);
    snprintf(line, sizeof line, "{\"t\":\"flight\",\"dump\":{\"rank\":0,\"trigger\":\"timeout\","
             "\"records\":[%s,%s]}}", r4a, r5a);
    cl_send(a, line);
    json_t *ask = cl_expect(&f.loop, b, "dump");
    assert_non_null(ask);
    assert_non_null(strstr(json_string_value(json_object_get(ask, "why")), "timeout"));
    json_decref(ask);
    assert_null(last_event("flight")); /* not before b answered */
    snprintf(line, sizeof line, "{\"t\":\"flight\",\"dump\":{\"rank\":1,\"trigger\":"
             "\"coordinator\",\"records\":[%s]}}", r4b);
    cl_send(b, line);
    int64_t deadline = ddp_now_ns() + 10000000000LL;
    while (!last_event("flight") && ddp_now_ns() < deadline) uv_run(&f.loop, UV_RUN_NOWAIT);
    json_t *ev = last_event("flight");
    assert_non_null(ev);
    assert_string_equal(json_string_value(json_object_get(ev, "diagnosis")),
                        "rank 1 never started allreduce #5 (bucket 2, 1 MiB) of generation 1; "
                        "rank 0 waits on it; it failed (deadline or abort) on rank 0");
    assert_int_equal(ival(ev, "ranks"), 2);
    assert_true(json_is_true(json_object_get(ev, "stuck")));
    fx_stop(&f);
}

static void test_adopt_all_back(void **state)
{
    (void)state;
    fixture_t f;
    fx_start(&f, 2, 2, 1, 1, 7, 5);
    cl_rejoin(&f.cl[1], 7, 1, 2, 40);
    cl_rejoin(&f.cl[0], 7, 0, 2, 40);
    for (int i = 0; i < 2; i++) {
        json_t *x = cl_expect(&f.loop, &f.cl[i], "adopted");
        assert_non_null(x);
        assert_int_equal(ival(x, "gen"), 7);
        json_decref(x);
    }
    json_t *ev = last_event("adopted");
    assert_non_null(ev);
    assert_int_equal(ival(ev, "size"), 2);
    assert_null(last_event("generation"));
    assert_int_equal(ddpd_coord_generation(f.c), 7);
    fx_stop(&f);
}

/* A worker that asks to join while the coordinator adopts (its generation failed meanwhile):
 * the member that came back aborts generation 7, joins again, and generation 8 forms. */
static void test_adopt_abandoned_by_join(void **state)
{
    (void)state;
    fixture_t f;
    fx_start(&f, 2, 2, 1, 1, 7, 5);
    client_t *a = &f.cl[0], *b = &f.cl[1];
    cl_rejoin(a, 7, 0, 2, 40);
    cl_join(b, 1, 40);
    json_t *r = cl_expect(&f.loop, a, "reform");
    assert_non_null(r);
    assert_int_equal(ival(r, "gen"), 7);
    json_decref(r);
    cl_join(a, 0, 40);
    json_t *ga = cl_expect(&f.loop, a, "gen"), *gb = cl_expect(&f.loop, b, "gen");
    assert_non_null(ga);
    assert_non_null(gb);
    assert_int_equal(ival(ga, "gen"), 8); /* above every generation the members had */
    assert_int_equal(ival(ga, "size"), 2);
    assert_int_equal(ival(ga, "rank"), 0); /* the survivor keeps its place */
    json_decref(ga);
    json_decref(gb);
    assert_null(last_event("adopted"));
    fx_stop(&f);
}

/* One of two members never comes back: after heartbeat_timeout_s the adopted generation ends
 * and the one that is back forms generation 8 alone (min_workers 1). */
static void test_adopt_member_missing(void **state)
{
    (void)state;
    fixture_t f;
    fx_start(&f, 1, 2, 1, 1, 7, 0.3);
    client_t *a = &f.cl[0];
    cl_rejoin(a, 7, 0, 2, 40);
    json_t *r = cl_expect(&f.loop, a, "reform");
    assert_non_null(r);
    json_decref(r);
    cl_join(a, 0, 40);
    json_t *g = cl_expect(&f.loop, a, "gen");
    assert_non_null(g);
    assert_int_equal(ival(g, "gen"), 8);
    assert_int_equal(ival(g, "size"), 1);
    json_decref(g);
    fx_stop(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_form_done_late, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failure_defers_a_fresh_rank, setup, teardown),
        cmocka_unit_test_setup_teardown(test_flight_collection, setup, teardown),
        cmocka_unit_test_setup_teardown(test_same_step_older_generation_receives, setup, teardown),
        cmocka_unit_test_setup_teardown(test_generations_above_members_states, setup, teardown),
        cmocka_unit_test_setup_teardown(test_adopt_all_back, setup, teardown),
        cmocka_unit_test_setup_teardown(test_adopt_abandoned_by_join, setup, teardown),
        cmocka_unit_test_setup_teardown(test_adopt_member_missing, setup, teardown),
    };
    return cmocka_run_group_tests_name("coord", tests, NULL, NULL);
}
