/* Daemon benchmarks (not pass/fail):
 *  1. submit-to-first-step latency of a gpt2-tiny job: job.submit sent -> the first
 *     job.progress notification carrying a step (median of DDPD_BENCH_RUNS runs, default 5);
 *     the worker's own time to its first step (process start, model init, step 1) is inside.
 *  2. job.list latency with 1,000 jobs in the store and 100 concurrent clients (threads, each
 *     with its own connection): p50/p99 per call and calls/s, for the whole list and limit 50.
 * Needs DDP_BUILD_ROOT; uses $DDP_BUILD_ROOT/worker/ddp-worker and ddp-prep.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/clock.h"
#include "daemon/client.h"
#include "daemon/store.h"
#include "tests/integration/harness.h"

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    int i = (int)(p * (n - 1) + 0.5);
    return v[i];
}

static ddpd_test_daemon_t D;
static const char *list_params;
enum { CLIENTS = 100, CALLS = 20 };
static double lat[CLIENTS * CALLS];

static void *client_thread(void *arg)
{
    long k = (long)arg;
    ddpd_client_t c;
    if (ddpd_client_connect(&c, D.socket) != 0) return NULL;
    for (int i = 0; i < CALLS; i++) {
        json_t *r = NULL, *e = NULL;
        int64_t t0 = ddp_now_ns();
        ddpd_client_call(&c, "job.list", list_params ? json_loads(list_params, 0, NULL) : NULL, &r,
                         &e, 60000);
        lat[k * CALLS + i] = (double)(ddp_now_ns() - t0) / 1e6;
        json_decref(r);
        json_decref(e);
    }
    ddpd_client_close(&c);
    return NULL;
}

static void bench_list(const char *params, const char *label)
{
    list_params = params;
    pthread_t th[CLIENTS];
    int64_t t0 = ddp_now_ns();
    for (long i = 0; i < CLIENTS; i++) pthread_create(&th[i], NULL, client_thread, (void *)i);
    for (int i = 0; i < CLIENTS; i++) pthread_join(th[i], NULL);
    double secs = (double)(ddp_now_ns() - t0) / 1e9;
    int n = CLIENTS * CALLS;
    printf("job.list %-10s 1000 jobs, %d clients x %d calls: p50 %.2f ms  p99 %.2f ms  "
           "%.0f calls/s\n",
           label, CLIENTS, CALLS, pct(lat, n, 0.5), pct(lat, n, 0.99), n / secs);
}

int main(void)
{
    const char *build = getenv("DDP_BUILD_ROOT");
    if (!build) return 2;
    int runs = getenv("DDPD_BENCH_RUNS") ? atoi(getenv("DDPD_BENCH_RUNS")) : 5;
    char worker[1024], prep[1024], cmd[4096];
    snprintf(worker, sizeof worker, "%s/worker/ddp-worker", build);
    snprintf(prep, sizeof prep, "%s/worker/ddp-prep", build);
    const char *extra[] = {"--worker-bin", worker, "--slots", "2", NULL};
    if (ddpd_test_start(&D, extra) != 0) return 1;

    /* 1. submit -> first step */
    snprintf(cmd, sizeof cmd, "cat %s/../daemon/*.c > %s/corpus.txt 2>/dev/null; "
             "%s --out %s/data %s/corpus.txt >/dev/null 2>&1", build, D.dir, prep, D.dir, D.dir);
    if (system(cmd) != 0) fprintf(stderr, "ddp-prep failed\n");
    char spec[2048];
    snprintf(spec, sizeof spec,
             "name: bench\nmodel: {preset: gpt2-tiny}\ndata: {train: \"%s/data/train_*.bin\"}\n"
             "train: {steps: 3, micro_batch: 2, seq_len: 32, log_every: 1}\nddp: {workers: 1}\n",
             D.dir);
    double first[64];
    int got = 0;
    for (int r = 0; r < runs && r < 64; r++) {
        ddpd_client_t c;
        if (ddpd_client_connect(&c, D.socket) != 0) break;
        json_t *res = NULL, *err = NULL;
        int64_t t0 = ddp_now_ns();
        if (ddpd_client_call(&c, "job.submit", json_pack("{ss}", "spec", spec), &res, &err,
                             30000) != 0) {
            fprintf(stderr, "submit failed\n");
            ddpd_client_close(&c);
            break;
        }
        long long id = json_integer_value(json_object_get(res, "id"));
        json_decref(res);
        ddpd_client_send(&c, "job.watch", json_pack("{sI}", "id", (json_int_t)id), NULL);
        double ms = -1;
        json_t *m;
        while (ddpd_client_recv(&c, &m, 60000) == 0) {
            json_t *job = json_object_get(json_object_get(m, "params"), "job");
            int done = json_object_get(m, "result") != NULL;
            if (ms < 0 && json_integer_value(json_object_get(job, "step")) >= 1)
                ms = (double)(ddp_now_ns() - t0) / 1e6;
            json_decref(m);
            if (done) break;
        }
        ddpd_client_close(&c);
        if (ms > 0) first[got++] = ms;
    }
    if (got)
        printf("submit -> first step (gpt2-tiny, 1 rank): median %.1f ms over %d runs "
               "(min %.1f, max %.1f)\n",
               pct(first, got, 0.5), got, first[0], first[got - 1]);

    /* 2. job.list with 1000 jobs: a fresh store filled while no daemon runs */
    ddpd_test_stop(&D);
    char state[300];
    snprintf(state, sizeof state, "/tmp/ddpd-bench.XXXXXX");
    if (!mkdtemp(state)) return 1;
    ddpd_store_t *s;
    if (ddpd_store_open(&s, state) != 0) return 1;
    for (int i = 0; i < 1000; i++) {
        int64_t id;
        ddpd_jobrec_t rec = {.name = "bench-job", .uid = 0, .world = 2, .spec_json = "{}",
                             .run_dir = "/tmp/x", .cwd = "/", .token = "t",
                             .submitted_ms = ddp_wall_ms()};
        ddpd_store_job_insert(s, &rec, &id);
        ddpd_store_job_transition(s, id, "queued", "starting", "placed", ddp_wall_ms());
        ddpd_store_job_transition(s, id, "starting", "succeeded", "all 2 ranks exited 0",
                                  ddp_wall_ms());
        ddpd_store_job_result(s, id, 0, 100, 100, 3.21);
    }
    ddpd_store_close(s);
    /* the later --state-dir wins over the harness's own */
    const char *again[] = {"--worker-bin", worker, "--slots", "2", "--state-dir", state, NULL};
    if (ddpd_test_start(&D, again) != 0) return 1;
    bench_list(NULL, "(all)");
    bench_list("{\"limit\":50}", "(limit 50)");
    ddpd_test_stop(&D);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", state);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", state);
    return 0;
}
