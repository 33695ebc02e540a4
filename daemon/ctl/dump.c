/* `ddpctl dump RUN_DIR`: the diagnosis of the dumps already there (any trigger; no daemon).
 * `ddpctl dump ID [--timeout S]`: the flight recorder dumps of a running job's ranks and their
 * diagnosis (collectives/flight.h). job.dump makes the daemon send SIGUSR2 to the job's ranks on
 * its node; each rank's dump thread writes RUN_DIR/flight/rank-R.json. This waits (polling, up to
 * the deadline) until as many of those files as ranks were signalled hold a "request" dump taken
 * after the daemon's signal (their "now_ns" and its "since_ns" are the same host's monotonic
 * clock), prints one line per rank and the diagnosis, and writes it to
 * RUN_DIR/flight/diagnosis.txt. ddpctl may run as root and the run directory is the job's user's,
 * who may have put a symlink or a FIFO there: that file is written as the daemon writes in run
 * directories (daemon/userfs.h), never through a link.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <glob.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "collectives/flight.h"
#include "common/clock.h"
#include "common/err.h"
#include "daemon/client.h"
#include "daemon/ctl/ctl.h"
#include "daemon/userfs.h"

/* The dumps in dir/flight taken at or after since_ns (0: all) for a request (SIGUSR2's, or the
 * elastic coordinator's, which a request sets off): fills dumps (up to max), returns how many. */
static int fresh_dumps(const char *dir, int64_t since_ns, json_t **dumps, int max)
{
    char pat[PATH_MAX + 32];
    snprintf(pat, sizeof pat, "%s/flight/rank-*.json", dir);
    glob_t g;
    int n = 0;
    if (glob(pat, 0, NULL, &g) != 0) return 0;
    for (size_t i = 0; i < g.gl_pathc && n < max; i++) {
        json_t *d = json_load_file(g.gl_pathv[i], 0, NULL); /* a half-written one fails: later */
        const char *t = json_string_value(json_object_get(d, "trigger"));
        if (d && t && (!since_ns || !strcmp(t, "request") || !strcmp(t, "coordinator")) &&
            json_integer_value(json_object_get(d, "now_ns")) >= since_ns)
            dumps[n++] = d;
        else
            json_decref(d);
    }
    globfree(&g);
    return n;
}

/* The elastic coordinator's diagnosis, RUN_DIR/flight/diagnosis.txt, when written after `asked`
 * (its first line into out). Returns 1 when there is one. */
static int coordinator_diagnosis(const char *dir, const struct timespec *asked, char *out,
                                 size_t cap)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/flight/diagnosis.txt", dir);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC); /* maybe root's read */
    struct stat st;
    if (fd < 0) return 0;
    int fresh = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                (st.st_mtim.tv_sec > asked->tv_sec ||
                 (st.st_mtim.tv_sec == asked->tv_sec && st.st_mtim.tv_nsec >= asked->tv_nsec));
    ssize_t got = fresh ? read(fd, out, cap - 1) : -1;
    close(fd);
    if (got <= 0) return 0;
    out[got] = '\0';
    out[strcspn(out, "\n")] = '\0';
    return out[0] != 0;
}

/* "rank 3: 64 records, last allreduce #1842 started, waits on rank 2" */
static void print_rank(json_t *d)
{
    json_t *recs = json_object_get(d, "records");
    size_t n = json_array_size(recs);
    json_t *last = n ? json_array_get(recs, n - 1) : NULL;
    printf("rank %lld (pid %lld): %zu record(s)",
           (long long)json_integer_value(json_object_get(d, "rank")),
           (long long)json_integer_value(json_object_get(d, "pid")), n);
    if (last) {
        printf(", last %s #%lld of generation %lld %s",
               json_string_value(json_object_get(last, "kind")),
               (long long)json_integer_value(json_object_get(last, "seq")),
               (long long)json_integer_value(json_object_get(last, "generation")),
               json_string_value(json_object_get(last, "state")));
        long long peer = json_integer_value(json_object_get(last, "peer"));
        const char *st = json_string_value(json_object_get(last, "state"));
        if (peer >= 0 && st && !strcmp(st, "started")) printf(", waits on rank %lld", peer);
    }
    printf("\n");
}

/* The diagnosis of the dumps already in RUN_DIR/flight (a job that is over, mpirun's). */
static int dump_dir(const char *dir)
{
    json_t *dumps[4096];
    int n = fresh_dumps(dir, 0, dumps, 4096);
    char diag[1024];
    if (!n) {
        fprintf(stderr, "ddpctl: no flight recorder dump in %s/flight\n", dir);
        return CTL_JOB_FAILED;
    }
    ddp_flight_diagnose(dumps, (size_t)n, diag, sizeof diag);
    printf("%s: %d rank dump(s)\n", dir, n);
    for (int i = 0; i < n; i++) {
        printf("(%s) ", json_string_value(json_object_get(dumps[i], "trigger")));
        print_rank(dumps[i]);
        json_decref(dumps[i]);
    }
    printf("diagnosis: %s\n", diag);
    return CTL_OK;
}

/* RUN_DIR/flight/diagnosis.txt := diag, never through a link (ddpd_userfile_replace_in: ddpctl
 * may be root). Failure is reported on stderr, not fatal: the diagnosis has been printed. */
static void write_diagnosis(const char *dir, const char *diag)
{
    char flight[PATH_MAX + 16], why[512] = "", text[1100];
    snprintf(flight, sizeof flight, "%s/flight", dir);
    int n = snprintf(text, sizeof text, "%s\n", diag);
    if (ddpd_userfile_replace_in(flight, "diagnosis.txt", text, (size_t)n, why, sizeof why) != 0)
        fprintf(stderr, "ddpctl: cannot write %s/diagnosis.txt: %s\n", flight, why);
}

int ddpctl_dump(int argc, char **argv, const ddpctl_where_t *w, int as_json)
{
    static const struct option o[] = {{"timeout", required_argument, 0, 't'}, {0, 0, 0, 0}};
    double timeout_s = 10;
    int c;
    optind = 0;
    while ((c = getopt_long(argc, argv, "t:", o, NULL)) != -1) {
        if (c == 't') timeout_s = atof(optarg);
        else return CTL_USAGE;
    }
    if (optind == argc - 1 && strspn(argv[optind], "0123456789") != strlen(argv[optind]))
        return dump_dir(argv[optind]);
    if (optind != argc - 1 || timeout_s <= 0) {
        fprintf(stderr, "usage: ddpctl dump ID [--timeout S] | ddpctl dump RUN_DIR\n");
        return CTL_USAGE;
    }
    long long id = atoll(argv[optind]);
    ddpd_client_t cl;
    int rc = ddpd_client_connect(&cl, w->socket);
    if (rc) {
        fprintf(stderr, "ddpctl: dump needs a running daemon, and none answers at %s: %s\n",
                w->socket, strerror(-rc));
        return CTL_UNAVAILABLE;
    }
    json_t *res = NULL, *err = NULL;
    struct timespec asked; /* an elastic coordinator's diagnosis.txt written after this is fresh */
    clock_gettime(CLOCK_REALTIME_COARSE, &asked); /* the clock of files' times */
    rc = ddpd_client_call(&cl, "job.dump", json_pack("{sI}", "id", (json_int_t)id), &res, &err,
                          60000);
    ddpd_client_close(&cl);
    if (rc == 1) {
        ddpctl_print_error(err);
        json_decref(err);
        return CTL_JOB_FAILED;
    }
    if (rc < 0) {
        fprintf(stderr, "ddpctl: job.dump: %s\n", strerror(-rc));
        return CTL_ERROR;
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", json_string_value(json_object_get(res, "run_dir")) ?: "");
    int want = (int)json_integer_value(json_object_get(res, "signalled"));
    int world = (int)json_integer_value(json_object_get(res, "world"));
    /* ranks on other nodes dump in their nodes' run directories: with the job's coordinator on
     * this daemon, its diagnosis (RUN_DIR/flight/diagnosis.txt) covers them */
    int remote = (int)json_integer_value(json_object_get(res, "remote"));
    int coordinated = json_is_true(json_object_get(res, "coordinated"));
    int64_t since = json_integer_value(json_object_get(res, "since_ns"));
    json_decref(res);
    json_t **dumps = calloc((size_t)(world > 0 ? world : 1) + 1, sizeof *dumps);
    if (!dumps) return CTL_ERROR;
    int n = 0;
    int64_t deadline = ddp_now_ns() + (int64_t)(timeout_s * 1e9);
    char diag[1024], whole[1024] = "";
    for (;;) { /* the files are the event; nothing else tells of them */
        for (int i = 0; i < n; i++) json_decref(dumps[i]);
        n = fresh_dumps(dir, since, dumps, world > 0 ? world : 1);
        int all = !remote || !coordinated || coordinator_diagnosis(dir, &asked, whole, sizeof whole);
        if ((n >= want && all) || ddp_now_ns() > deadline) break;
        nanosleep(&(struct timespec){0, 50000000}, NULL);
    }
    int drc = n ? ddp_flight_diagnose(dumps, (size_t)n, diag, sizeof diag) : DDP_EINVAL;
    if (!n) snprintf(diag, sizeof diag, "no rank answered within %.0f s", timeout_s);
    if (whole[0]) { /* every rank's, this node's and the others' */
        snprintf(diag, sizeof diag, "%s", whole);
        drc = strncmp(whole, "no ", 3) != 0; /* "no collective is stuck", "no dump holds ..." */
    }
    if (as_json) {
        json_t *arr = json_array();
        for (int i = 0; i < n; i++) json_array_append(arr, dumps[i]);
        char *s = json_dumps(json_pack("{sI ss so ss sb}", "id", (json_int_t)id, "run_dir", dir,
                                       "dumps", arr, "diagnosis", diag, "stuck", drc == 1),
                             JSON_COMPACT);
        printf("%s\n", s ? s : "null");
        free(s);
    } else {
        printf("job %lld: %d of %d rank(s) dumped to %s/flight\n", id, n, world, dir);
        for (int i = 0; i < n; i++) print_rank(dumps[i]);
        if (remote)
            printf("%d rank(s) on other nodes dumped to their nodes' run directories%s\n", remote,
                   whole[0]  ? "; the coordinator's diagnosis covers every rank"
                   : coordinated ? "; the coordinator's diagnosis did not come"
                                 : "; the diagnosis covers this node's ranks only");
        printf("diagnosis: %s\n", diag);
    }
    if (n < want)
        fprintf(stderr, "ddpctl: %d of %d signalled rank(s) wrote no dump within %.0f s\n",
                want - n, want, timeout_s);
    if (n && !whole[0]) write_diagnosis(dir, diag); /* the coordinator wrote its own */
    for (int i = 0; i < n; i++) json_decref(dumps[i]);
    free(dumps);
    return n ? CTL_OK : CTL_JOB_FAILED;
}
