/* ddpctl: the command-line client of ddpd.
 *
 *   ddpctl [--socket PATH] [--state-dir DIR] [--json] COMMAND ...
 *   run SPEC [--workers N] [--name NAME]   submit and follow; starts an embedded ddpd in the
 *                                           foreground when no daemon answers
 *   submit SPEC [--workers N] [--name NAME] ls [--state S] [--limit N]   status ID
 *   logs ID [-f] [--rank N]   cancel ID   dump ID   watch ID   nodes   info   call METHOD [PARAMS]
 * ls, status, logs (without -f), plot and trace read the daemon's store and run directories
 * when no daemon answers (offline.c); the other commands need the daemon.
 * Exit codes: 0 success (run/watch: the job succeeded), 1 the job failed or the daemon
 * answered with an error, 2 the job was cancelled, 64 usage, 69 no daemon, 70 other errors.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/file.h"
#include "daemon/client.h"
#include "daemon/ctl/ctl.h"
#include "daemon/rpc.h"

static int as_json;
static ddpctl_where_t where;
static int state_dir_given; /* --state-dir: the embedded daemon of `run` gets it too */

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ddpctl [--socket PATH] [--state-dir DIR] [--json] COMMAND [ARGS]\n"
            "  run SPEC [--workers N] [--name NAME]   submit and follow to the end (starts an\n"
            "                                         embedded daemon if none is running)\n"
            "  submit SPEC [--workers N] [--name NAME]\n"
            "  ls [--state STATE] [--limit N]\n"
            "  status ID\n"
            "  logs ID [-f|--follow] [--rank N]\n"
            "  cancel ID\n"
            "  dump ID [--timeout S]   the ranks' flight recorder dumps and their diagnosis\n"
            "  dump RUN_DIR            the diagnosis of the dumps in RUN_DIR/flight\n"
            "  watch ID\n"
            "  plot ID|RUN_DIR [-o FILE.svg|.png] [--log]   loss curves (gnuplot)\n"
            "  trace ID|RUN_DIR [-o FILE.json]        the ranks' train.trace in one file\n"
            "  plan SPEC [--workers N] [--local N] [--gpu BYTES]\n"
            "                                         memory budget per rank, without running\n"
            "  nodes\n"
            "  info                                   daemon status\n"
            "  call METHOD [PARAMS-JSON]              raw JSON-RPC call\n"
            "ls, status, logs (without -f), plot and trace read the store in --state-dir\n"
            "(default: ddpd's, so `ddpctl run`'s) when no daemon answers; the others need one\n"
            "exit: 0 ok / job succeeded, 1 job failed or error, 2 cancelled, 64 usage, 69 no "
            "daemon\n");
}

static void print_json(json_t *v)
{
    char *s = json_dumps(v, JSON_COMPACT);
    printf("%s\n", s ? s : "null");
    free(s);
}

/* Connects for a command that changes a job or follows a live one (`what`: "cancel"), which
 * only a daemon can do; the store would not do. Returns 0 or CTL_UNAVAILABLE, having said so. */
static int connect_or_die(ddpd_client_t *c, const char *what)
{
    int rc = ddpd_client_connect(c, where.socket);
    if (ddpctl_no_daemon(rc)) {
        fprintf(stderr, "ddpctl: %s needs a running daemon, and none answers at %s: %s (start "
                        "ddpd, or use --socket)\n", what, where.socket, strerror(-rc));
        return CTL_UNAVAILABLE;
    }
    if (rc) {
        fprintf(stderr, "ddpctl: cannot reach the daemon at %s: %s\n", where.socket,
                strerror(-rc));
        return CTL_UNAVAILABLE;
    }
    return 0;
}

/* One call; prints errors. Returns 0 with *res, or an exit code. */
static int call(ddpd_client_t *c, const char *method, json_t *params, json_t **res)
{
    json_t *err = NULL;
    int rc = ddpd_client_call(c, method, params, res, &err, 60000);
    if (rc == 1) {
        if (as_json) {
            char *s = json_dumps(err, JSON_COMPACT);
            fprintf(stderr, "%s\n", s ? s : "");
            free(s);
        } else {
            ddpctl_print_error(err);
            json_t *data = json_object_get(err, "data");
            /* a spec error's message already reads "FILE:LINE:COLUMN: FIELD: ..." */
            if (json_integer_value(json_object_get(err, "code")) == DDPD_RPC_BAD_SPEC &&
                json_integer_value(json_object_get(data, "line")) > 0)
                data = NULL;
            const char *p = json_string_value(json_object_get(data, "path"));
            long long line = json_integer_value(json_object_get(data, "line"));
            if (p && *p)
                fprintf(stderr, "  at %s%s", p, line ? "" : "\n");
            if (p && *p && line)
                fprintf(stderr, " (line %lld, column %lld)\n", line,
                        (long long)json_integer_value(json_object_get(data, "column")));
        }
        json_decref(err);
        return CTL_JOB_FAILED;
    }
    if (rc == -EMSGSIZE) {
        fprintf(stderr, "ddpctl: %s: the request is over the daemon's limit of %u bytes (a spec "
                "sent inline must fit in it)\n", method, DDPD_MAX_LINE);
        return CTL_ERROR;
    }
    if (rc < 0) {
        fprintf(stderr, "ddpctl: %s: %s\n", method, strerror(-rc));
        return CTL_ERROR;
    }
    return 0;
}

static long long parse_id(const char *s)
{
    char *end;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || *end || v <= 0) {
        fprintf(stderr, "ddpctl: a job id (positive integer) is required, got '%s'\n",
                s ? s : "");
        return -1;
    }
    return v;
}

/* job.submit params for a spec file: the text goes inline (the daemon may not see the file);
 * the submitter's directory goes along so relative data paths resolve as the user expects, and
 * the file's name as typed, so a spec error reads "job.yaml:4:7: train.lr: ..." as ddp-worker
 * prints it. */
static json_t *submit_params(const char *spec, int workers, const char *name)
{
    char *text = NULL;
    int rc = ddp_file_read(spec, DDPD_MAX_LINE, &text, NULL);
    if (rc == -EFBIG) {
        fprintf(stderr, "ddpctl: %s is larger than the daemon takes in one request (%u bytes); "
                "a job spec is a few kilobytes\n", spec, DDPD_MAX_LINE);
        return NULL;
    }
    if (rc) {
        fprintf(stderr, "ddpctl: cannot read %s: %s\n", spec, ddp_strerror(rc));
        return NULL;
    }
    char cwd[PATH_MAX];
    json_t *p = json_pack("{ss}", "spec", text);
    free(text);
    if (!p) {
        fprintf(stderr, "ddpctl: %s is not valid UTF-8 text\n", spec);
        return NULL;
    }
    if (getcwd(cwd, sizeof cwd)) json_object_set_new(p, "cwd", json_string(cwd));
    json_t *origin = json_string(spec); /* NULL when the name is not UTF-8: then "<inline>" */
    if (origin) json_object_set_new(p, "origin", origin);
    if (workers > 0) json_object_set_new(p, "workers", json_integer(workers));
    if (name) json_object_set_new(p, "name", json_string(name));
    return p;
}

static int parse_submit_args(int argc, char **argv, const char **spec, int *workers,
                             const char **name)
{
    static const struct option o[] = {{"workers", required_argument, 0, 'w'},
                                      {"name", required_argument, 0, 'n'},
                                      {0, 0, 0, 0}};
    int c;
    optind = 0; /* 0: full re-initialisation, so GNU getopt permutes again */
    while ((c = getopt_long(argc, argv, "w:n:", o, NULL)) != -1) {
        if (c == 'w') *workers = atoi(optarg);
        else if (c == 'n') *name = optarg;
        else return CTL_USAGE;
    }
    if (optind != argc - 1) {
        fprintf(stderr, "ddpctl: %s needs exactly one spec file\n", argv[0]);
        return CTL_USAGE;
    }
    *spec = argv[optind];
    return 0;
}

/* The job.submit params of `submit`/`run`'s arguments. Returns 0 with *params (caller owns), or
 * the usage exit code (the message is printed). */
static int submit_request(int argc, char **argv, json_t **params)
{
    const char *spec = NULL, *name = NULL;
    int workers = 0;
    int rc = parse_submit_args(argc, argv, &spec, &workers, &name);
    if (rc) return rc;
    *params = submit_params(spec, workers, name);
    return *params ? 0 : CTL_USAGE;
}

/* A submission's warning (job.submit's "warning"), on stderr. */
static void print_warning(json_t *res)
{
    const char *w = json_string_value(json_object_get(res, "warning"));
    if (w) fprintf(stderr, "ddpctl: warning: %s\n", w);
}

static int cmd_submit(int argc, char **argv)
{
    json_t *p;
    int rc = submit_request(argc, argv, &p);
    if (rc) return rc;
    ddpd_client_t c;
    if ((rc = connect_or_die(&c, "submit"))) {
        json_decref(p);
        return rc;
    }
    json_t *res;
    rc = call(&c, "job.submit", p, &res);
    if (!rc) {
        print_warning(res);
        if (as_json)
            print_json(res);
        else
            printf("%lld\n", (long long)json_integer_value(json_object_get(res, "id")));
        json_decref(res);
    }
    ddpd_client_close(&c);
    return rc;
}

/* Starts ddpd (beside this binary) on where.socket in the foreground of this command, its log
 * in a file; returns its pid or -1. */
static pid_t start_embedded(char *logpath, size_t ln)
{
    char self[PATH_MAX], bin[PATH_MAX + 8];
    const char *env = getenv("DDPD_BIN");
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (env && *env) {
        snprintf(bin, sizeof bin, "%s", env);
    } else if (n > 0) {
        self[n] = 0;
        *strrchr(self, '/') = 0;
        snprintf(bin, sizeof bin, "%s/ddpd", self);
    } else {
        snprintf(bin, sizeof bin, "ddpd");
    }
    const char *tmp = getenv("TMPDIR");
    snprintf(logpath, ln, "%s/ddpd-embedded-%d.log", tmp && *tmp ? tmp : "/tmp", (int)getpid());
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) != 0) return -1;
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        int lf = open(logpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (lf >= 0) {
            dup2(lf, 1);
            dup2(lf, 2);
        }
        int rfd = dup(pfd[1]); /* without CLOEXEC */
        char fdarg[16];
        snprintf(fdarg, sizeof fdarg, "%d", rfd);
        setpgid(0, 0); /* the terminal's ^C goes to ddpctl, which cancels the job cleanly */
        /* without --state-dir (the NULL ends the list there) ddpd's default state dir, which
         * ddpctl reads when no daemon answers */
        char *args[] = {bin, "--socket", where.socket, "--metrics", "off", "--ready-fd", fdarg,
                        state_dir_given ? "--state-dir" : NULL, where.state_dir, NULL};
        execv(bin, args);
        dprintf(2, "ddpctl: cannot run %s: %s\n", bin, strerror(errno));
        _exit(127);
    }
    close(pfd[1]);
    char b;
    ssize_t r;
    do {
        r = read(pfd[0], &b, 1);
    } while (r < 0 && errno == EINTR);
    close(pfd[0]);
    if (r != 1) {
        int st;
        waitpid(pid, &st, 0);
        fprintf(stderr, "ddpctl: the embedded daemon did not start; its log: %s\n", logpath);
        return -1;
    }
    return pid;
}

static void stop_embedded(pid_t pid)
{
    int st;
    kill(pid, SIGTERM);
    for (int i = 0; i < 300; i++) {
        if (waitpid(pid, &st, WNOHANG) == pid) return;
        usleep(50000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
}

static int cmd_run(int argc, char **argv)
{
    json_t *p;
    int rc = submit_request(argc, argv, &p);
    if (rc) return rc;
    ddpd_client_t c;
    pid_t embedded = -1;
    char logpath[PATH_MAX];
    rc = ddpd_client_connect(&c, where.socket);
    if (ddpctl_no_daemon(rc)) {
        embedded = start_embedded(logpath, sizeof logpath);
        if (embedded < 0) {
            json_decref(p);
            return CTL_UNAVAILABLE;
        }
        fprintf(stderr, "ddpctl: no daemon at %s; started one for this run (log: %s)\n",
                where.socket, logpath);
        rc = ddpd_client_connect(&c, where.socket);
    }
    if (rc) {
        fprintf(stderr, "ddpctl: cannot reach the daemon at %s: %s\n", where.socket,
                strerror(-rc));
        json_decref(p);
        if (embedded > 0) stop_embedded(embedded);
        return CTL_UNAVAILABLE;
    }
    json_t *res;
    rc = call(&c, "job.submit", p, &res);
    if (!rc) {
        print_warning(res);
        long long id = json_integer_value(json_object_get(res, "id"));
        if (!as_json)
            fprintf(stderr, "job %lld submitted: %lld ranks, run dir %s\n", id,
                    (long long)json_integer_value(json_object_get(res, "world")),
                    json_string_value(json_object_get(res, "run_dir")));
        json_decref(res);
        rc = ddpctl_follow(&c, where.socket, id, as_json, 1);
    }
    ddpd_client_close(&c);
    if (embedded > 0) {
        stop_embedded(embedded);
        if (rc == CTL_OK)
            unlink(logpath); /* kept when something went wrong */
        else
            fprintf(stderr, "ddpctl: the embedded daemon's log: %s\n", logpath);
    }
    return rc;
}

static int cmd_ls(int argc, char **argv)
{
    static const struct option o[] = {{"state", required_argument, 0, 's'},
                                      {"limit", required_argument, 0, 'l'},
                                      {0, 0, 0, 0}};
    const char *state = NULL;
    int limit = 0, c2, rc;
    optind = 0; /* 0: full re-initialisation, so GNU getopt permutes again */
    while ((c2 = getopt_long(argc, argv, "s:l:", o, NULL)) != -1) {
        if (c2 == 's') state = optarg;
        else if (c2 == 'l') limit = atoi(optarg);
        else return CTL_USAGE;
    }
    ddpd_client_t c;
    json_t *jobs, *res = NULL;
    if ((rc = ddpctl_connect_or_store(&c, &where)) == 1) {
        if ((rc = ddpctl_store_jobs(&where, state, limit, &jobs))) return rc;
    } else if (rc) {
        return rc;
    } else {
        json_t *p = json_object();
        if (state) json_object_set_new(p, "state", json_string(state));
        if (limit > 0) json_object_set_new(p, "limit", json_integer(limit));
        rc = call(&c, "job.list", p, &res);
        ddpd_client_close(&c);
        if (rc) return rc;
        jobs = json_incref(json_object_get(res, "jobs"));
        json_decref(res);
    }
    if (as_json) {
        print_json(jobs);
    } else {
        printf("%-5s %-20s %-10s %5s %13s %9s  %s\n", "ID", "NAME", "STATE", "RANKS", "STEP",
               "LOSS", "REASON");
        size_t i;
        json_t *j;
        json_array_foreach(jobs, i, j)
        {
            char step[32] = "-", loss[32] = "-";
            json_t *s = json_object_get(j, "step"), *l = json_object_get(j, "final_loss");
            if (!l) l = json_object_get(j, "loss");
            if (json_is_integer(s))
                snprintf(step, sizeof step, "%lld/%lld", (long long)json_integer_value(s),
                         (long long)json_integer_value(json_object_get(j, "steps")));
            if (json_is_number(l)) snprintf(loss, sizeof loss, "%.4f", json_number_value(l));
            printf("%-5lld %-20.20s %-10s %5lld %13s %9s  %s\n",
                   (long long)json_integer_value(json_object_get(j, "id")),
                   json_string_value(json_object_get(j, "name")),
                   json_string_value(json_object_get(j, "state")),
                   (long long)json_integer_value(json_object_get(j, "world")), step, loss,
                   json_string_value(json_object_get(j, "reason")));
        }
    }
    json_decref(jobs);
    return 0;
}

static int cmd_status(int argc, char **argv)
{
    long long id = parse_id(argc > 1 ? argv[1] : NULL);
    if (id < 0) return CTL_USAGE;
    ddpd_client_t c;
    json_t *res;
    int rc = ddpctl_connect_or_store(&c, &where);
    if (rc == 1) {
        rc = ddpctl_store_job(&where, id, &res);
    } else if (!rc) {
        rc = call(&c, "job.get", json_pack("{sI}", "id", (json_int_t)id), &res);
        ddpd_client_close(&c);
    }
    if (rc) return rc;
    if (as_json) {
        print_json(res);
    } else {
        printf("job %lld  %s\n  state:   %s (%s)\n  ranks:   %lld on %s\n  run dir: %s\n",
               id, json_string_value(json_object_get(res, "name")),
               json_string_value(json_object_get(res, "state")),
               json_string_value(json_object_get(res, "reason")),
               (long long)json_integer_value(json_object_get(res, "world")),
               json_string_value(json_object_get(res, "nodes")),
               json_string_value(json_object_get(res, "run_dir")));
        json_t *pg = json_object_get(res, "progress");
        if (pg && json_object_get(pg, "step")) {
            /* a validation line may be the newest record: no loss in it then */
            json_t *pl = json_object_get(pg, "loss");
            char lb[32] = "-";
            if (json_is_number(pl)) snprintf(lb, sizeof lb, "%.4f", json_number_value(pl));
            printf("  step:    %lld/%lld  loss %s\n",
                   (long long)json_integer_value(json_object_get(pg, "step")),
                   (long long)json_integer_value(json_object_get(pg, "steps")), lb);
            json_t *sg = json_object_get(pg, "straggler");
            if (json_is_integer(sg) && json_integer_value(sg) >= 0)
                printf("  straggler: rank %lld (compute >= 20%% above the median)\n",
                       (long long)json_integer_value(sg));
        }
        json_t *fl = json_object_get(res, "final_loss");
        if (json_is_number(fl)) printf("  final loss: %.4f\n", json_number_value(fl));
        printf("  transitions:\n");
        size_t i;
        json_t *t;
        json_array_foreach(json_object_get(res, "transitions"), i, t)
        {
            time_t ts = (time_t)(json_integer_value(json_object_get(t, "ts_ms")) / 1000);
            struct tm tm;
            char tb[32];
            localtime_r(&ts, &tm);
            strftime(tb, sizeof tb, "%Y-%m-%d %H:%M:%S", &tm);
            printf("    %s  %-9s -> %-9s %s\n", tb,
                   json_string_value(json_object_get(t, "from")),
                   json_string_value(json_object_get(t, "to")),
                   json_string_value(json_object_get(t, "reason")));
        }
    }
    int ret = 0;
    const char *st = json_string_value(json_object_get(res, "state"));
    if (st && !strcmp(st, "failed")) ret = CTL_JOB_FAILED;
    if (st && !strcmp(st, "cancelled")) ret = CTL_JOB_CANCELLED;
    json_decref(res);
    return ret;
}

static int cmd_logs(int argc, char **argv)
{
    static const struct option o[] = {{"follow", no_argument, 0, 'f'},
                                      {"rank", required_argument, 0, 'r'},
                                      {0, 0, 0, 0}};
    int follow = 0, rank = 0, c2, rc;
    optind = 0; /* 0: full re-initialisation, so GNU getopt permutes again */
    while ((c2 = getopt_long(argc, argv, "fr:", o, NULL)) != -1) {
        if (c2 == 'f') follow = 1;
        else if (c2 == 'r') rank = atoi(optarg);
        else return CTL_USAGE;
    }
    long long id = parse_id(optind < argc ? argv[optind] : NULL);
    if (id < 0) return CTL_USAGE;
    ddpd_client_t c;
    if (follow) {
        if ((rc = connect_or_die(&c, "logs -f (following a live job)"))) return rc;
    } else if ((rc = ddpctl_connect_or_store(&c, &where)) == 1) {
        return ddpctl_store_logs(&where, id, rank);
    } else if (rc) {
        return rc;
    }
    long rid;
    rc = ddpd_client_send(&c, "job.logs",
                          json_pack("{sI si sb}", "id", (json_int_t)id, "rank", rank, "follow",
                                    follow),
                          &rid);
    int ret = CTL_ERROR;
    while (rc == 0) {
        json_t *m;
        rc = ddpd_client_recv(&c, &m, -1);
        if (rc) break;
        json_t *mid = json_object_get(m, "id");
        if (json_is_integer(mid) && json_integer_value(mid) == rid) {
            if (json_object_get(m, "error")) {
                ddpctl_print_error(json_object_get(m, "error"));
                ret = CTL_JOB_FAILED;
            } else {
                ret = 0;
            }
            json_decref(m);
            break;
        }
        json_t *p = json_object_get(m, "params");
        json_t *data = json_object_get(p, "data");
        if (json_is_string(data)) {
            fwrite(json_string_value(data), 1, json_string_length(data), stdout);
            fflush(stdout);
        }
        json_decref(m);
    }
    ddpd_client_close(&c);
    return ret;
}

/* One call of a command that needs the daemon (`what`: its name); prints the result when
 * `print` or --json. Returns 0 or an exit code. */
static int simple(const char *what, const char *method, json_t *params, int print)
{
    ddpd_client_t c;
    int rc;
    if ((rc = connect_or_die(&c, what))) {
        json_decref(params);
        return rc;
    }
    json_t *res;
    rc = call(&c, method, params, &res);
    ddpd_client_close(&c);
    if (rc) return rc;
    if (print || as_json) print_json(res);
    json_decref(res);
    return 0;
}

static int cmd_cancel(int argc, char **argv)
{
    long long id = parse_id(argc > 1 ? argv[1] : NULL);
    if (id < 0) return CTL_USAGE;
    int rc = simple("cancel", "job.cancel", json_pack("{sI}", "id", (json_int_t)id), 0);
    if (!rc && !as_json) printf("job %lld: cancel requested\n", id);
    return rc;
}

static int cmd_watch(int argc, char **argv)
{
    long long id = parse_id(argc > 1 ? argv[1] : NULL);
    if (id < 0) return CTL_USAGE;
    ddpd_client_t c;
    int rc;
    const char *what = "watch (following a live job; `ddpctl status` reads an ended one)";
    if ((rc = connect_or_die(&c, what))) return rc;
    rc = ddpctl_follow(&c, where.socket, id, as_json, 0);
    ddpd_client_close(&c);
    return rc;
}

static int cmd_nodes(void)
{
    ddpd_client_t c;
    int rc;
    if ((rc = connect_or_die(&c, "nodes"))) return rc;
    json_t *res;
    rc = call(&c, "node.list", NULL, &res);
    ddpd_client_close(&c);
    if (rc) return rc;
    json_t *nodes = json_object_get(res, "nodes");
    if (as_json) {
        print_json(nodes);
    } else {
        printf("%-20s %-24s %-6s %5s %5s\n", "NODE", "ADDRESS", "STATE", "SLOTS", "FREE");
        size_t i;
        json_t *n;
        json_array_foreach(nodes, i, n)
        printf("%-20s %-24s %-6s %5lld %5lld%s\n", json_string_value(json_object_get(n, "name")),
               json_string_value(json_object_get(n, "addr")),
               json_is_true(json_object_get(n, "up")) ? "up" : "down",
               (long long)json_integer_value(json_object_get(n, "slots")),
               (long long)json_integer_value(json_object_get(n, "free")),
               json_is_true(json_object_get(n, "self")) ? "  (this node)" : "");
    }
    json_decref(res);
    return 0;
}

static int cmd_call(int argc, char **argv)
{
    if (argc < 2) return CTL_USAGE;
    json_t *params = NULL;
    if (argc > 2) {
        json_error_t je;
        params = json_loads(argv[2], 0, &je);
        if (!params) {
            fprintf(stderr, "ddpctl: params: %s\n", je.text);
            return CTL_USAGE;
        }
    }
    as_json = 1;
    return simple("call", argv[1], params, 1);
}

int main(int argc, char **argv)
{
    static const struct option o[] = {{"socket", required_argument, 0, 's'},
                                      {"state-dir", required_argument, 0, 'S'},
                                      {"json", no_argument, 0, 'j'},
                                      {"help", no_argument, 0, 'h'},
                                      {0, 0, 0, 0}};
    const char *env = getenv("DDPD_SOCKET");
    if (env && *env) {
        snprintf(where.socket, sizeof where.socket, "%s", env);
    } else {
        ddpd_default_socket_path(where.socket, sizeof where.socket);
        /* a user on a node whose ddpd is the system's (the unit's /run/ddpd/ddpd.sock) and who
         * runs no daemon of their own talks to the system's, and reads its state directory */
        if (geteuid() != 0 && access(where.socket, F_OK) != 0 &&
            access(DDPD_SYSTEM_SOCKET, F_OK) == 0) {
            snprintf(where.socket, sizeof where.socket, "%s", DDPD_SYSTEM_SOCKET);
            snprintf(where.state_dir, sizeof where.state_dir, "/var/lib/ddpd");
        }
    }
    if (!where.state_dir[0]) ddpd_default_state_dir(where.state_dir, sizeof where.state_dir);
    int c;
    /* options before the command only ("+"), so each command parses its own */
    while ((c = getopt_long(argc, argv, "+s:jh", o, NULL)) != -1) {
        if (c == 's') snprintf(where.socket, sizeof where.socket, "%s", optarg);
        else if (c == 'S') {
            snprintf(where.state_dir, sizeof where.state_dir, "%s", optarg);
            state_dir_given = 1;
        } else if (c == 'j') as_json = 1;
        else if (c == 'h') {
            usage(stdout);
            return 0;
        } else {
            usage(stderr);
            return CTL_USAGE;
        }
    }
    if (optind >= argc) {
        usage(stderr);
        return CTL_USAGE;
    }
    signal(SIGPIPE, SIG_IGN);
    const char *cmd = argv[optind];
    int sub_argc = argc - optind;
    char **sub_argv = argv + optind;
    /* a trailing --json after the command works too */
    for (int i = 1; i < sub_argc; i++)
        if (!strcmp(sub_argv[i], "--json")) {
            as_json = 1;
            for (int k = i; k < sub_argc - 1; k++) sub_argv[k] = sub_argv[k + 1];
            sub_argc--;
            i--;
        }
    if (!strcmp(cmd, "run")) return cmd_run(sub_argc, sub_argv);
    if (!strcmp(cmd, "submit")) return cmd_submit(sub_argc, sub_argv);
    if (!strcmp(cmd, "ls") || !strcmp(cmd, "list")) return cmd_ls(sub_argc, sub_argv);
    if (!strcmp(cmd, "status")) return cmd_status(sub_argc, sub_argv);
    if (!strcmp(cmd, "logs")) return cmd_logs(sub_argc, sub_argv);
    if (!strcmp(cmd, "cancel")) return cmd_cancel(sub_argc, sub_argv);
    if (!strcmp(cmd, "watch")) return cmd_watch(sub_argc, sub_argv);
    if (!strcmp(cmd, "nodes")) return cmd_nodes();
    if (!strcmp(cmd, "info")) return simple("info", "daemon.status", NULL, 1);
    if (!strcmp(cmd, "call")) return cmd_call(sub_argc, sub_argv);
    if (!strcmp(cmd, "plot")) return ddpctl_plot(sub_argc, sub_argv, &where);
    if (!strcmp(cmd, "trace")) return ddpctl_trace(sub_argc, sub_argv, &where);
    if (!strcmp(cmd, "dump")) return ddpctl_dump(sub_argc, sub_argv, &where, as_json);
    if (!strcmp(cmd, "plan")) return ddpctl_plan(sub_argc, sub_argv);
    fprintf(stderr, "ddpctl: unknown command '%s'\n", cmd);
    usage(stderr);
    return CTL_USAGE;
}
