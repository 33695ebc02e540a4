/* train.profile: which steps are profiled, and the report of a window (see profile.h). */
#include "worker/observe/profile.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"

void ddp_profile_plan(ddp_profile_t *p, long n, long done, long end)
{
    memset(p, 0, sizeof *p);
    p->asked = n;
    p->to = -1;
    long left = end - done;
    if (n <= 0 || left <= 0) return;
    p->warmup = left > DDP_PROFILE_WARMUP ? DDP_PROFILE_WARMUP : left - 1;
    long count = n < left - p->warmup ? n : left - p->warmup;
    p->from = done + p->warmup + 1;
    p->to = p->from + count - 1;
}

static int profiled(const ddp_profile_t *p, long step) { return step >= p->from && step <= p->to; }

int ddp_profile_before_step(ddp_profile_t *p, ddp_kernels_t *k, long step)
{
    if (!profiled(p, step)) return 0;
    if (p->open) { /* the next profiled step, or a failed one redone */
        ddp_k_profile_resume(k);
        return 0;
    }
    DDP_CHECK(ddp_k_profile_start(k));
    p->open = 1;
    return 0;
}

int ddp_profile_after_step(ddp_profile_t *p, ddp_kernels_t *k, long step, double step_ms,
                           double comm_ms, double exposed_ms, const char *run_dir, int rank)
{
    if (!p->open || !profiled(p, step)) return 0;
    p->step_ms += step_ms;
    p->comm_ms += comm_ms;
    p->exposed_ms += exposed_ms;
    if (step < p->to) {
        ddp_k_profile_pause(k);
        return 0;
    }
    ddp_kprof_report_t r;
    p->open = 0;
    DDP_CHECK(ddp_k_profile_stop(k, &r));
    ddp_profile_info_t in = {.rank = rank,
                             .backend = ddp_k_name(k),
                             .from = p->from,
                             .to = p->to,
                             .warmup = p->warmup,
                             .asked = p->asked,
                             .comm_ms = p->comm_ms,
                             .exposed_ms = p->exposed_ms,
                             .step_ms = p->step_ms};
    ddp_errinfo_t ei;
    ddp_errinfo_clear(&ei);
    if (ddp_profile_report(&r, &in, run_dir, &ei) != 0) {
        char msg[1200];
        DDP_WARN("%s; the table is in the log only", ddp_errinfo_str(&ei, msg, sizeof msg));
    }
    return 0;
}

/* ---- the report ---- */

/* The ops that ran, sorted by total time (then by name, so ties print alike everywhere). */
static int by_time(const void *a, const void *b, void *arg)
{
    const ddp_kprof_report_t *r = arg;
    const ddp_kprof_stat_t *x = &r->op[*(const int *)a], *y = &r->op[*(const int *)b];
    if (x->ms != y->ms) return x->ms < y->ms ? 1 : -1;
    return strcmp(ddp_kop_name(*(const int *)a), ddp_kop_name(*(const int *)b));
}

static int sorted_ops(const ddp_kprof_report_t *r, int *idx)
{
    int n = 0;
    for (int i = 0; i < DDP_KOP_COUNT; i++)
        if (r->op[i].calls > 0) idx[n++] = i;
    qsort_r(idx, (size_t)n, sizeof *idx, by_time, (void *)r);
    return n;
}

static ddp_kprof_stat_t totals(const ddp_kprof_report_t *r)
{
    ddp_kprof_stat_t t = {0};
    for (int i = 0; i < DDP_KOP_COUNT; i++) {
        t.calls += r->op[i].calls;
        t.ms += r->op[i].ms;
        t.host_ms += r->op[i].host_ms;
        t.bytes += r->op[i].bytes;
        t.flops += r->op[i].flops;
    }
    return t;
}

static long n_steps(const ddp_profile_info_t *in) { return in->to - in->from + 1; }

static double share(double ms, const ddp_kprof_report_t *r)
{
    return r->wall_ms > 0 ? ms / r->wall_ms : 0;
}

/* "-" for a figure not known (0 bytes or FLOPs, or no time to divide by). */
static const char *num(char *buf, size_t len, double v, int prec, int known)
{
    if (!known) return "-";
    snprintf(buf, len, "%.*f", prec, v);
    return buf;
}

static void text_row(FILE *f, const char *name, const char *calls, const ddp_kprof_stat_t *s,
                     const ddp_kprof_report_t *r)
{
    char b[4][32];
    int rate_ok = s->ms > 0;
    fprintf(f, "%-16s %7s %10.3f %6.1f%% %10.3f %10s %9s %8s %8s\n", name, calls, s->ms,
            100.0 * share(s->ms, r), s->host_ms, num(b[0], 32, s->bytes / 1e6, 2, s->bytes > 0),
            num(b[1], 32, s->flops / 1e9, 3, s->flops > 0),
            num(b[2], 32, s->bytes / s->ms / 1e6, 2, s->bytes > 0 && rate_ok),
            num(b[3], 32, s->flops / s->ms / 1e9, 3, s->flops > 0 && rate_ok));
}

void ddp_profile_write_text(FILE *f, const ddp_kprof_report_t *r, const ddp_profile_info_t *in)
{
    int idx[DDP_KOP_COUNT];
    int n = sorted_ops(r, idx);
    long steps = n_steps(in);
    ddp_kprof_stat_t tot = totals(r);
    /* the stream idle (launch gaps, the host's own work, waits) and the host outside the ops */
    ddp_kprof_stat_t rest = {.ms = r->wall_ms - tot.ms, .host_ms = r->wall_ms - tot.host_ms};
    const ddp_kprof_stat_t *sy = &r->op[DDP_KOP_sync];
    fprintf(f,
            "per-op profile, rank %d, %s kernels: steps %ld-%ld (%ld step%s after %ld "
            "warm-up%s), %.3f ms per step (%.3f ms in all); op times from %s; activations' "
            "bytes at the run's precision\n",
            in->rank, in->backend, in->from, in->to, steps, steps == 1 ? "" : "s", in->warmup,
            steps < in->asked ? "; the run has no more" : "", r->wall_ms / (double)steps,
            r->wall_ms, r->stream_marks ? "the compute stream's marks" : "the host clock");
    if (r->err)
        fprintf(f, "incomplete: %s; some calls have no stream time\n", ddp_strerror(r->err));
    fprintf(f, "%-16s %7s %10s %7s %10s %10s %9s %8s %8s\n", "op", "calls", "total ms", "share",
            "host ms", "MB", "GFLOP", "GB/s", "TFLOP/s");
    char calls[32];
    for (int i = 0; i < n; i++) {
        snprintf(calls, sizeof calls, "%ld", r->op[idx[i]].calls);
        text_row(f, ddp_kop_name(idx[i]), calls, &r->op[idx[i]], r);
    }
    snprintf(calls, sizeof calls, "%ld", tot.calls);
    text_row(f, "total", calls, &tot, r);
    text_row(f, "(not in any op)", "", &rest, r);
    fprintf(f,
            "step wall time %.3f ms per step; the steps' lines say %.3f ms; "
            "sync: %ld calls, the host waited %.3f ms in them (%.1f%%); "
            "communication %.3f ms, exposed %.3f ms\n",
            r->wall_ms / (double)steps, in->step_ms / (double)steps, sy->calls, sy->host_ms,
            100.0 * share(sy->host_ms, r), in->comm_ms, in->exposed_ms);
}

/* A figure, or JSON null when it is not known. */
static json_t *known(double v, int ok) { return ok ? json_real(v) : json_null(); }

static json_t *json_stat(const char *name, const ddp_kprof_stat_t *s, const ddp_kprof_report_t *r)
{
    int rate_ok = s->ms > 0;
    return json_pack("{s:s, s:I, s:f, s:f, s:f, s:o, s:o, s:o, s:o}", "op", name, "calls",
                     (json_int_t)s->calls, "ms", s->ms, "share", share(s->ms, r), "host_ms",
                     s->host_ms, "bytes", known(s->bytes, s->bytes > 0), "flops",
                     known(s->flops, s->flops > 0), "gb_per_s",
                     known(s->bytes / s->ms / 1e6, s->bytes > 0 && rate_ok), "tflop_per_s",
                     known(s->flops / s->ms / 1e9, s->flops > 0 && rate_ok));
}

json_t *ddp_profile_json(const ddp_kprof_report_t *r, const ddp_profile_info_t *in)
{
    int idx[DDP_KOP_COUNT];
    int n = sorted_ops(r, idx);
    long steps = n_steps(in);
    ddp_kprof_stat_t tot = totals(r);
    const ddp_kprof_stat_t *sy = &r->op[DDP_KOP_sync];
    json_t *ops = json_array();
    for (int i = 0; ops && i < n; i++)
        if (json_array_append_new(ops, json_stat(ddp_kop_name(idx[i]), &r->op[idx[i]], r))) {
            json_decref(ops);
            ops = NULL;
        }
    if (!ops) return NULL;
    return json_pack(
        "{s:i, s:s, s:{s:I, s:I, s:I, s:I, s:I}, s:f, s:f, s:f, s:b, s:o, s:o, "
        "s:f, s:f, s:{s:I, s:f}, s:{s:f, s:f}, s:s?}",
        "rank", in->rank, "backend", in->backend, "steps", "from", (json_int_t)in->from, "to",
        (json_int_t)in->to, "count", (json_int_t)steps, "warmup", (json_int_t)in->warmup, "asked",
        (json_int_t)in->asked, "wall_ms", r->wall_ms, "step_ms", r->wall_ms / (double)steps,
        "step_line_ms", in->step_ms / (double)steps, "stream_marks", r->stream_marks, "ops", ops,
        "total", json_stat("total", &tot, r), "not_in_any_op_ms", r->wall_ms - tot.ms,
        "host_not_in_any_op_ms", r->wall_ms - tot.host_ms, "syncs", "calls", (json_int_t)sy->calls,
        "host_wait_ms", sy->host_ms, "comm", "ms", in->comm_ms, "exposed_ms", in->exposed_ms,
        "incomplete", r->err ? ddp_strerror(r->err) : NULL);
}

/* Writes path with the text of the table (fmt 't') or its JSON (fmt 'j'). */
static int write_file(const char *path, const ddp_kprof_report_t *r, const ddp_profile_info_t *in,
                      int fmt, ddp_errinfo_t *ei)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return ddp_errinfo_set(ei, -errno, "profile: cannot write %s: %s", path, strerror(errno));
    int rc = 0;
    if (fmt == 't') {
        ddp_profile_write_text(f, r, in);
    } else {
        json_t *j = ddp_profile_json(r, in);
        rc = j ? json_dumpf(j, f, JSON_INDENT(1) | JSON_REAL_PRECISION(9)) : -1;
        json_decref(j);
        if (rc == 0) fputc('\n', f);
    }
    int err = ferror(f) ? errno : 0;
    if (fclose(f) != 0 && !err) err = errno;
    if (rc || err)
        return ddp_errinfo_set(ei, rc && !err ? DDP_ENOMEM : -err, "profile: cannot write %s: %s",
                               path, rc && !err ? "out of memory" : strerror(err));
    return 0;
}

int ddp_profile_report(const ddp_kprof_report_t *r, const ddp_profile_info_t *in,
                       const char *run_dir, ddp_errinfo_t *ei)
{
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (m) {
        ddp_profile_write_text(m, r, in);
        fclose(m);
    }
    for (char *line = text, *nl; line && *line; line = nl + 1) {
        nl = strchr(line, '\n');
        if (!nl) break;
        DDP_INFO("%.*s", (int)(nl - line), line);
    }
    free(text);
    if (!run_dir) {
        DDP_INFO("profile: no run directory: the table is in the log only");
        return 0;
    }
    if (mkdir(run_dir, 0755) != 0 && errno != EEXIST)
        return ddp_errinfo_set(ei, -errno, "profile: cannot create %s: %s", run_dir,
                               strerror(errno));
    char path[4096];
    snprintf(path, sizeof path, "%s/profile-rank%d.txt", run_dir, in->rank);
    DDP_CHECK(write_file(path, r, in, 't', ei));
    snprintf(path, sizeof path, "%s/profile-rank%d.json", run_dir, in->rank);
    return write_file(path, r, in, 'j', ei);
}
