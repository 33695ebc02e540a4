/* A worker's connection to its elastic coordinator (collectives/bootstrap_elastic.c) against a
 * scripted coordinator on loopback TCP, in a thread of this process: a member whose coordinator
 * goes away redials it and rejoins its generation (gen, rank, size, step), training on meanwhile;
 * a member whose coordinator does not come back within reconnect_s leaves; a worker that was
 * never a member leaves at once; a coordinator's "dump" is answered with a flight recorder dump.
 * TSan runs it (the connection has a thread of its own).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "collectives/elastic.h"
#include "collectives/flight.h"
#include "common/clock.h"

typedef struct {
    int lfd, port;
    double reconnect_s; /* sent in the generation */
    int come_back;      /* accept a second connection after closing the first */
    pthread_mutex_t mu;
    json_t *rejoin;     /* the first line on the second connection */
    int done;
} fake_coord_t;

/* One line from fd (blocking, at most 10 s); NULL at EOF or timeout. */
static json_t *read_line(int fd)
{
    char buf[4096];
    size_t n = 0;
    int64_t deadline = ddp_now_ns() + 10000000000LL;
    while (n < sizeof buf - 1 && ddp_now_ns() < deadline) {
        ssize_t r = recv(fd, buf + n, 1, 0);
        if (r <= 0) return NULL;
        if (buf[n] == '\n') return json_loadb(buf, n, 0, NULL);
        n++;
    }
    return NULL;
}

static void send_line(int fd, const char *s)
{
    assert_int_equal(send(fd, s, strlen(s), MSG_NOSIGNAL), (ssize_t)strlen(s));
}

static void *coord_main(void *arg)
{
    fake_coord_t *f = arg;
    int c = accept(f->lfd, NULL, NULL);
    json_t *m;
    while ((m = read_line(c)) && strcmp(json_string_value(json_object_get(m, "t")), "join"))
        json_decref(m); /* heartbeats may come first */
    json_decref(m);
    char gen[300];
    snprintf(gen, sizeof gen,
             "{\"t\":\"gen\",\"gen\":5,\"rank\":0,\"size\":1,\"source\":0,\"sync\":false,"
             "\"step\":-1,\"why\":\"start\",\"hb_timeout_s\":5,\"reconnect_s\":%g}\n",
             f->reconnect_s);
    send_line(c, gen);
    /* the coordinator "restarts" once the member trains: a heartbeat says step 3 */
    while ((m = read_line(c)) && json_integer_value(json_object_get(m, "step")) != 3)
        json_decref(m);
    json_decref(m);
    close(c);
    if (!f->come_back) {
        close(f->lfd);
        return NULL;
    }
    c = accept(f->lfd, NULL, NULL);
    while ((m = read_line(c)) && !strcmp(json_string_value(json_object_get(m, "t")), "hb"))
        json_decref(m);
    pthread_mutex_lock(&f->mu);
    f->rejoin = m;
    pthread_mutex_unlock(&f->mu);
    send_line(c, "{\"t\":\"adopted\",\"gen\":5}\n");
    while ((m = read_line(c))) json_decref(m); /* until the worker closes */
    close(c);
    close(f->lfd);
    return NULL;
}

/* The fake coordinator's listener on a free loopback port, served by `fn` in a thread. */
static void fake_start(fake_coord_t *f, pthread_t *th, void *(*fn)(void *))
{
    f->lfd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(f->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    assert_int_equal(bind(f->lfd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(f->lfd, 4), 0);
    getsockname(f->lfd, (struct sockaddr *)&a, &al);
    f->port = ntohs(a.sin_port);
    pthread_mutex_init(&f->mu, NULL);
    assert_int_equal(pthread_create(th, NULL, fn, f), 0);
}

static ddp_elastic_t *connect_to(fake_coord_t *f)
{
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", f->port);
    ddp_elastic_t *e = NULL;
    ddp_errinfo_t ei;
    ddp_errinfo_clear(&ei);
    assert_int_equal(ddp_elastic_connect(addr, "tok", 0, 5, &e, &ei), 0);
    return e;
}

static ddp_elastic_t *member(fake_coord_t *f)
{
    ddp_elastic_t *e = connect_to(f);
    ddp_errinfo_t ei;
    ddp_errinfo_clear(&ei);
    ddp_elastic_gen_t g;
    ddp_coll_bootstrap_t *bs = NULL;
    assert_int_equal(ddp_elastic_join(e, -1, &g, &bs, &ei), 0);
    assert_int_equal(g.gen, 5);
    ddp_coll_bootstrap_free(bs);
    ddp_elastic_watch(e, NULL); /* a world of one: formed without a communicator */
    ddp_elastic_set_step(e, 3);
    return e;
}

static void test_rejoin_after_restart(void **state)
{
    (void)state;
    fake_coord_t f = {.reconnect_s = 10, .come_back = 1};
    pthread_t th;
    fake_start(&f, &th, coord_main);
    ddp_elastic_t *e = member(&f);
    json_t *r = NULL;
    int64_t deadline = ddp_now_ns() + 20000000000LL;
    while (!r && ddp_now_ns() < deadline) {
        pthread_mutex_lock(&f.mu);
        r = f.rejoin;
        pthread_mutex_unlock(&f.mu);
        if (!r) {
            struct timespec ts = {0, 10000000};
            nanosleep(&ts, NULL);
        }
    }
    assert_non_null(r);
    assert_string_equal(json_string_value(json_object_get(r, "t")), "rejoin");
    assert_string_equal(json_string_value(json_object_get(r, "token")), "tok");
    assert_int_equal(json_integer_value(json_object_get(r, "gen")), 5);
    assert_int_equal(json_integer_value(json_object_get(r, "rank")), 0);
    assert_int_equal(json_integer_value(json_object_get(r, "size")), 1);
    assert_int_equal(json_integer_value(json_object_get(r, "step")), 3);
    assert_false(ddp_elastic_lost(e, NULL));
    assert_false(ddp_elastic_regroup_wanted(e)); /* its generation goes on */
    ddp_elastic_free(e);
    pthread_join(th, NULL);
    json_decref(f.rejoin);
}

static void test_gone_for_good(void **state)
{
    (void)state;
    fake_coord_t f = {.reconnect_s = 0.3, .come_back = 0};
    pthread_t th;
    fake_start(&f, &th, coord_main);
    ddp_elastic_t *e = member(&f);
    const char *why = NULL;
    int64_t deadline = ddp_now_ns() + 20000000000LL;
    while (!ddp_elastic_lost(e, &why) && ddp_now_ns() < deadline) {
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    assert_true(ddp_elastic_lost(e, &why));
    assert_non_null(strstr(why, "lost the connection to the coordinator"));
    assert_true(ddp_elastic_regroup_wanted(e));
    ddp_elastic_free(e);
    pthread_join(th, NULL);
}

/* A coordinator that asks its member for a flight recorder dump and keeps the answer. */
static void *ask_dump(void *arg)
{
    fake_coord_t *f = arg;
    int c = accept(f->lfd, NULL, NULL);
    json_t *m;
    while ((m = read_line(c)) && strcmp(json_string_value(json_object_get(m, "t")), "join"))
        json_decref(m);
    json_decref(m);
    send_line(c, "{\"t\":\"gen\",\"gen\":5,\"rank\":0,\"size\":1,\"source\":0,\"sync\":false,"
                 "\"step\":-1,\"why\":\"start\",\"hb_timeout_s\":5,\"reconnect_s\":1}\n");
    send_line(c, "{\"t\":\"dump\",\"why\":\"a test\"}\n");
    while ((m = read_line(c)) && strcmp(json_string_value(json_object_get(m, "t")), "flight"))
        json_decref(m);
    pthread_mutex_lock(&f->mu);
    f->rejoin = m; /* the flight message */
    pthread_mutex_unlock(&f->mu);
    while ((m = read_line(c))) json_decref(m);
    close(c);
    close(f->lfd);
    return NULL;
}

/* The coordinator's "dump" is answered from the connection's thread with this process's flight
 * recorder dump (collectives/flight.h). */
static void test_dump_on_request(void **state)
{
    (void)state;
    fake_coord_t f = {0};
    pthread_t th;
    fake_start(&f, &th, ask_dump);
    ddp_flight_queued(5, 77, 0, 1, "allreduce", 4096, 3);
    ddp_elastic_t *e = member(&f);
    json_t *r = NULL;
    int64_t deadline = ddp_now_ns() + 20000000000LL;
    while (!r && ddp_now_ns() < deadline) {
        pthread_mutex_lock(&f.mu);
        r = f.rejoin;
        pthread_mutex_unlock(&f.mu);
        if (!r) nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    assert_non_null(r);
    json_t *d = json_object_get(r, "dump");
    assert_string_equal(json_string_value(json_object_get(d, "trigger")), "coordinator");
    json_t *recs = json_object_get(d, "records");
    json_t *last = json_array_get(recs, json_array_size(recs) - 1);
    assert_int_equal(json_integer_value(json_object_get(last, "seq")), 77);
    assert_int_equal(json_integer_value(json_object_get(last, "bucket")), 3);
    ddp_elastic_free(e);
    pthread_join(th, NULL);
    json_decref(f.rejoin);
}

/* Never a member: a coordinator that closes before the first generation ends the worker. */
static void *close_after_join(void *arg)
{
    fake_coord_t *f = arg;
    int c = accept(f->lfd, NULL, NULL);
    json_t *m;
    while ((m = read_line(c)) && strcmp(json_string_value(json_object_get(m, "t")), "join"))
        json_decref(m);
    json_decref(m);
    close(c);
    close(f->lfd);
    return NULL;
}

static void test_never_a_member(void **state)
{
    (void)state;
    fake_coord_t f = {0};
    pthread_t th;
    fake_start(&f, &th, close_after_join);
    ddp_elastic_t *e = connect_to(&f);
    ddp_errinfo_t ei;
    ddp_errinfo_clear(&ei);
    ddp_elastic_gen_t g;
    ddp_coll_bootstrap_t *bs = NULL;
    int64_t t0 = ddp_now_ns();
    assert_int_equal(ddp_elastic_join(e, -1, &g, &bs, &ei), DDP_EABORTED);
    assert_true(ddp_now_ns() - t0 < 5000000000LL); /* at once, not after a window */
    ddp_elastic_free(e);
    pthread_join(th, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rejoin_after_restart),
        cmocka_unit_test(test_gone_for_good),
        cmocka_unit_test(test_never_a_member),
        cmocka_unit_test(test_dump_on_request),
    };
    return cmocka_run_group_tests_name("elastic_conn", tests, NULL, NULL);
}
