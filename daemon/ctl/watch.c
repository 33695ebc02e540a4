/* ddpctl's job follower: job.watch notifications rendered as a live progress line (terminal)
 * or as plain lines (pipe/file, at most one a second plus every state change). */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/clock.h"
#include "daemon/ctl/ctl.h"

static volatile sig_atomic_t got_int;
static void on_int(int sig)
{
    (void)sig;
    got_int++;
}

void ddpctl_print_error(json_t *err)
{
    const char *msg = json_string_value(json_object_get(err, "message"));
    fprintf(stderr, "ddpctl: %s (code %lld)\n", msg ? msg : "error",
            (long long)json_integer_value(json_object_get(err, "code")));
}

static const char *num(json_t *v, const char *fmt, char *buf, size_t n)
{
    if (!json_is_number(v)) return "-";
    snprintf(buf, n, fmt, json_number_value(v));
    return buf;
}

static const char *fmt_tps(double t, char *buf, size_t n)
{
    if (t >= 1e6)
        snprintf(buf, n, "%.2fM", t / 1e6);
    else if (t >= 1e3)
        snprintf(buf, n, "%.1fk", t / 1e3);
    else
        snprintf(buf, n, "%.0f", t);
    return buf;
}

/* What the follower remembers between notifications. Not every notification carries a step's
 * metrics (a validation line or a state change may be the newest thing the daemon read), so the
 * last loss and rate seen are kept, and the first and last (tokens, wall_ms) pairs give the
 * run's average rate when it ends. */
typedef struct follow {
    int64_t last_print;
    long long last_step;
    char last_state[32];
    double loss, tps;         /* last seen; NAN until one is */
    double tok0, wall0;       /* first step metrics seen: cumulative tokens, ms since start */
    double tok1, wall1;       /* last ones */
    int n_seen;               /* step metrics seen */
} follow_t;

static void remember(follow_t *f, json_t *job)
{
    json_t *m = json_object_get(job, "metrics");
    json_t *l = json_object_get(job, "loss"), *t = json_object_get(job, "tokens_per_s");
    if (json_is_number(l)) f->loss = json_number_value(l);
    if (json_is_number(t)) f->tps = json_number_value(t);
    json_t *tok = json_object_get(m, "tokens"), *w = json_object_get(m, "wall_ms");
    if (!json_is_number(tok) || !json_is_number(w)) return;
    f->tok1 = json_number_value(tok);
    f->wall1 = json_number_value(w);
    if (f->n_seen++ == 0) {
        f->tok0 = f->tok1;
        f->wall0 = f->wall1;
    }
}

/* The run's average tokens/s: over the steps this follower saw (first to last), or the last
 * step's rate when it saw only one. NAN when it saw none. */
static double average_tps(const follow_t *f)
{
    if (f->n_seen >= 2 && f->wall1 > f->wall0)
        return (f->tok1 - f->tok0) / ((f->wall1 - f->wall0) / 1000.0);
    return f->tps;
}

static int terminal(const char *state)
{
    return state && (!strcmp(state, "succeeded") || !strcmp(state, "failed") ||
                     !strcmp(state, "cancelled"));
}

static void render(json_t *job, int tty, int as_json, follow_t *f)
{
    if (as_json) {
        char *s = json_dumps(job, JSON_COMPACT);
        if (s) printf("%s\n", s);
        free(s);
        fflush(stdout);
        return;
    }
    remember(f, job);
    const char *state = json_string_value(json_object_get(job, "state"));
    long long step = json_integer_value(json_object_get(job, "step"));
    long long steps = json_integer_value(json_object_get(job, "steps"));
    int changed = strcmp(state ? state : "", f->last_state) != 0;
    int64_t now = ddp_now_ns();
    if (!tty && !changed && (step == f->last_step || now - f->last_print < 1000000000LL)) return;
    char l[64] = "-", tps[64] = "-", eta[32];
    long long id = (long long)json_integer_value(json_object_get(job, "id"));
    char line[512];
    if (json_object_get(job, "step") && terminal(state)) {
        /* the end: the final loss (the worker's "done" record) and the run's average speed */
        json_t *fl = json_object_get(json_object_get(job, "done"), "final_loss");
        double loss = json_is_number(fl) ? json_number_value(fl) : f->loss;
        double avg = average_tps(f);
        if (isfinite(loss)) snprintf(l, sizeof l, "%.4f", loss);
        if (isfinite(avg)) fmt_tps(avg, tps, sizeof tps);
        snprintf(line, sizeof line, "job %lld [%s] step %lld/%lld  final loss %s  %s tok/s average",
                 id, state, step, steps, l, tps);
    } else if (json_object_get(job, "step")) {
        if (isfinite(f->loss)) snprintf(l, sizeof l, "%.4f", f->loss);
        if (isfinite(f->tps)) fmt_tps(f->tps, tps, sizeof tps);
        json_t *e = json_object_get(job, "eta_s");
        snprintf(line, sizeof line, "job %lld [%s] step %lld/%lld  loss %s  %s tok/s  ETA %s", id,
                 state, step, steps, l, tps,
                 json_is_number(e) ? ddp_fmt_duration(json_number_value(e), eta, sizeof eta) : "-");
    } else {
        snprintf(line, sizeof line, "job %lld [%s] %s", id, state,
                 json_string_value(json_object_get(job, "reason")));
    }
    if (tty)
        fprintf(stderr, "\r\033[K%s", line);
    else
        printf("%s\n", line);
    fflush(tty ? stderr : stdout);
    f->last_print = now;
    f->last_step = step;
    snprintf(f->last_state, sizeof f->last_state, "%s", state ? state : "");
}

int ddpctl_follow(ddpd_client_t *c, const char *socket_path, long long id, int as_json,
                  int cancel_on_int)
{
    (void)socket_path;
    struct sigaction sa = {.sa_handler = on_int}, old;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old);
    long rid;
    int tty = isatty(STDERR_FILENO) && !as_json;
    int rc = ddpd_client_send(c, "job.watch", json_pack("{sI}", "id", (json_int_t)id), &rid);
    follow_t f = {.last_step = -1, .loss = NAN, .tps = NAN};
    int cancels = 0, ret = CTL_ERROR;
    json_t *final = NULL;
    while (rc == 0) {
        if (got_int && cancel_on_int && cancels == 0) {
            cancels = 1;
            if (tty) fprintf(stderr, "\n");
            fprintf(stderr, "ddpctl: cancelling job %lld (^C again to stop waiting)\n", id);
            ddpd_client_send(c, "job.cancel", json_pack("{sI}", "id", (json_int_t)id), NULL);
        } else if (got_int && (cancels || !cancel_on_int)) {
            if (tty) fprintf(stderr, "\n");
            break;
        }
        json_t *m;
        rc = ddpd_client_recv(c, &m, 500);
        if (rc == -ETIMEDOUT || rc == -EINTR) {
            rc = 0;
            continue;
        }
        if (rc) break;
        const char *method = json_string_value(json_object_get(m, "method"));
        json_t *mid = json_object_get(m, "id");
        if (method && !strcmp(method, "job.progress")) {
            render(json_object_get(json_object_get(m, "params"), "job"), tty, as_json, &f);
        } else if (json_is_integer(mid) && json_integer_value(mid) == rid) {
            if (json_object_get(m, "error")) {
                ddpctl_print_error(json_object_get(m, "error"));
                json_decref(m);
                break;
            }
            final = json_incref(json_object_get(m, "result"));
            json_decref(m);
            break;
        }
        json_decref(m);
    }
    sigaction(SIGINT, &old, NULL);
    if (final) {
        const char *state = json_string_value(json_object_get(final, "state"));
        if (tty) fprintf(stderr, "\n");
        if (as_json) {
            char *s = json_dumps(final, JSON_COMPACT);
            printf("%s\n", s ? s : "{}");
            free(s);
        } else {
            char fl[64], dur[32];
            json_t *st = json_object_get(final, "started_ms"), *en = json_object_get(final, "ended_ms");
            double secs = json_is_integer(st) && json_is_integer(en)
                              ? (double)(json_integer_value(en) - json_integer_value(st)) / 1000.0
                              : 0;
            printf("job %lld %s: %s (final loss %s, %s)\n", id, state,
                   json_string_value(json_object_get(final, "reason")),
                   num(json_object_get(final, "final_loss"), "%.4f", fl, sizeof fl),
                   ddp_fmt_duration(secs, dur, sizeof dur));
            printf("run dir: %s\n", json_string_value(json_object_get(final, "run_dir")));
        }
        fflush(stdout);
        ret = !strcmp(state, "succeeded")   ? CTL_OK
              : !strcmp(state, "cancelled") ? CTL_JOB_CANCELLED
                                            : CTL_JOB_FAILED;
        json_decref(final);
    } else if (rc) {
        fprintf(stderr, "ddpctl: lost the daemon while following job %lld: %s\n", id,
                strerror(-rc));
    }
    return ret;
}
