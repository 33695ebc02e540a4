/* The status page (see status_page.h).
 *
 * Plain HTML with a refresh header and no script: it renders in any browser, in `curl`, and
 * in a headless browser's DOM dump, and a stale tab costs one small request every 5 s. The
 * loss curve is inline SVG drawn here (a polyline per series and a few labels) rather than by
 * gnuplot: the daemon's loop must not wait on a child process, and a page needs no more.
 * Every string that comes from a user (job names, reasons, paths) is HTML-escaped.
 * The TCP port carries no caller identity: a page of a private daemon (config status_page:
 * private, the default under root) shows counts only, no job's name, reason or curve; a
 * public one (status_page: public) shows every job. metrics.jsonl is read as userfs.h says.
 */
#include "daemon/status_page.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/clock.h"
#include "daemon/job.h"
#include "daemon/job_view.h"
#include "daemon/link.h"
#include "daemon/series.h"
#include "daemon/slots.h"
#include "daemon/store.h"
#include "daemon/userfs.h"

enum { TAIL_BYTES = 1 << 20, MAX_POINTS = 800, JOBS_SHOWN = 25, REFRESH_S = 5 };

static void put_escaped(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        case '\'': fputs("&#39;", f); break;
        default: fputc(*s, f);
        }
    }
}

/* The loss curve of one run as an <svg>: training loss (blue polyline, at most MAX_POINTS
 * points), validation loss (red, with dots), dashed lines where the generation changes. */
static void put_curve(FILE *f, const ddpd_series_t *s)
{
    const double W = 720, H = 240, L = 60, R = 12, T = 12, B = 34;
    long x0 = s->step[0], x1 = s->step[s->n - 1];
    if (x1 <= x0) x1 = x0 + 1;
    double lo = INFINITY, hi = -INFINITY;
    for (size_t i = 0; i < s->n; i++)
        if (isfinite(s->loss[i])) lo = fmin(lo, s->loss[i]), hi = fmax(hi, s->loss[i]);
    for (size_t i = 0; i < s->n_val; i++)
        if (s->val_step[i] >= x0 && isfinite(s->val_loss[i]))
            lo = fmin(lo, s->val_loss[i]), hi = fmax(hi, s->val_loss[i]);
    if (!(lo < hi)) lo = (isfinite(lo) ? lo : 0) - 0.5, hi = lo + 1;
    /* a loss that falls by more than 4x is drawn on a log axis, or its last 90% is flat */
    int logy = lo > 0 && hi / lo >= 4;
    double ylo = logy ? log(lo) : lo, yhi = logy ? log(hi) : hi;
#define PX(step) (L + (W - L - R) * (double)((step) - x0) / (double)(x1 - x0))
#define PY(v) (T + (H - T - B) * (yhi - (logy ? log(v) : (v))) / (yhi - ylo))
    fprintf(f, "<svg class=\"curve\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
               "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" role=\"img\">\n",
            W, H, W, H);
    fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"#fff\" "
               "stroke=\"#999\"/>\n", L, T, W - L - R, H - T - B);
    for (int k = 0; k <= 4; k++) { /* five loss labels and grid lines */
        double v = logy ? exp(ylo + (yhi - ylo) * k / 4.0) : lo + (hi - lo) * k / 4.0;
        double y = PY(v);
        fprintf(f, "<line x1=\"%.0f\" x2=\"%.0f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>"
                   "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\" class=\"tick\">%.3g</text>\n",
                L, W - R, y, y, L - 6, y + 4, v);
    }
    for (int k = 0; k <= 4; k++) {
        long st = x0 + (long)((double)(x1 - x0) * k / 4.0);
        fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\" class=\"tick\">%ld</text>\n",
                PX(st), H - B + 16, st);
    }
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\" class=\"axis\">step</text>\n",
            L + (W - L - R) / 2, H - 2);
    fprintf(f, "<text x=\"12\" y=\"%.0f\" transform=\"rotate(-90 12 %.0f)\" "
               "text-anchor=\"middle\" class=\"axis\">%s</text>\n",
            T + (H - T - B) / 2, T + (H - T - B) / 2, logy ? "loss (log scale)" : "loss");
    for (size_t i = 1; i < s->n; i++)
        if (s->gen[i] != s->gen[i - 1] && s->gen[i] >= 0)
            fprintf(f, "<line class=\"generation\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.0f\" "
                       "y2=\"%.0f\" stroke=\"#9467bd\" stroke-dasharray=\"4 3\"/><text x=\"%.1f\" "
                       "y=\"%.0f\" class=\"tick\" fill=\"#9467bd\">generation %ld</text>\n",
                    PX(s->step[i]), PX(s->step[i]), T, H - B, PX(s->step[i]) + 3, T + 12,
                    s->gen[i]);
    size_t every = s->n > MAX_POINTS ? (s->n + MAX_POINTS - 1) / MAX_POINTS : 1;
    fputs("<polyline class=\"loss\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" "
          "points=\"", f);
    for (size_t i = 0; i < s->n; i += every)
        if (isfinite(s->loss[i])) fprintf(f, "%.1f,%.1f ", PX(s->step[i]), PY(s->loss[i]));
    if ((s->n - 1) % every && isfinite(s->loss[s->n - 1]))
        fprintf(f, "%.1f,%.1f", PX(s->step[s->n - 1]), PY(s->loss[s->n - 1]));
    fputs("\"/>\n", f);
    size_t v0 = 0;
    while (v0 < s->n_val && s->val_step[v0] < x0) v0++;
    if (v0 < s->n_val) {
        fputs("<polyline class=\"val_loss\" fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\" "
              "points=\"", f);
        for (size_t i = v0; i < s->n_val; i++)
            fprintf(f, "%.1f,%.1f ", PX(s->val_step[i]), PY(s->val_loss[i]));
        fputs("\"/>\n", f);
        for (size_t i = v0; i < s->n_val; i++)
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#d62728\"/>\n",
                    PX(s->val_step[i]), PY(s->val_loss[i]));
    }
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"end\" class=\"legend\">"
               "<tspan fill=\"#1f77b4\">&#9473; training loss</tspan>%s</text>\n",
            W - R - 6, T + 16,
            v0 < s->n_val ? "  <tspan fill=\"#d62728\">&#9473; validation loss</tspan>" : "");
    fputs("</svg>\n", f);
#undef PX
#undef PY
}

static const char *str(json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

/* One row of the jobs table: the store's record, with the live progress of an active job. */
static void put_row(FILE *f, ddpd_t *d, json_t *row)
{
    json_int_t id = json_integer_value(json_object_get(row, "id"));
    ddpd_job_t *j = ddpd_job_find(d, id);
    json_t *live = j ? ddpd_job_progress(j) : NULL;
    json_t *src = live ? live : row;
    const char *state = str(src, "state");
    long step = (long)json_integer_value(json_object_get(src, "step"));
    long steps = (long)json_integer_value(json_object_get(src, "steps"));
    json_t *loss = json_object_get(src, live ? "loss" : "final_loss");
    json_t *tps = live ? json_object_get(live, "tokens_per_s") : NULL;
    json_t *mfu = live ? json_object_get(live, "mfu") : NULL;
    json_t *eta = live ? json_object_get(live, "eta_s") : NULL;
    fprintf(f, "<tr id=\"job-%lld\" class=\"%s\"><td>%lld</td><td class=\"name\">",
            (long long)id, state, (long long)id);
    put_escaped(f, str(row, "name"));
    fprintf(f, "</td><td class=\"state\">%s</td><td>%lld</td><td class=\"progress\">", state,
            (long long)json_integer_value(json_object_get(row, "world")));
    if (steps > 0)
        fprintf(f, "<progress value=\"%ld\" max=\"%ld\"></progress> %ld/%ld", step, steps, step,
                steps);
    json_t *skips = live ? json_object_get(live, "skips") : NULL; /* spike / non-finite skips */
    if (json_integer_value(skips) > 0)
        fprintf(f, " <span class=\"skips\">(%lld skipped)</span>",
                (long long)json_integer_value(skips));
    fputs("</td><td>", f);
    if (json_is_number(loss)) fprintf(f, "%.4f", json_number_value(loss));
    fputs("</td><td>", f);
    if (json_is_number(tps)) fprintf(f, "%.0f", json_number_value(tps));
    if (json_is_number(mfu))
        fprintf(f, " <span class=\"mfu\">MFU %.1f%%</span>", 100 * json_number_value(mfu));
    fputs("</td><td>", f);
    char buf[32];
    if (json_is_number(eta)) fputs(ddp_fmt_duration(json_number_value(eta), buf, sizeof buf), f);
    fputs("</td><td class=\"reason\">", f);
    put_escaped(f, str(src, "reason"));
    fputs("</td></tr>\n", f);
    json_decref(live);
}

/* A private page: how many jobs are in each state, nothing about any one of them. */
static void put_counts(FILE *f, ddpd_t *d)
{
    json_t *counts = NULL;
    if (ddpd_store_job_counts(d->store, &counts) != 0) return;
    fputs("<table id=\"counts\"><tr><th>state</th><th>jobs</th></tr>\n", f);
    static const char *const states[] = {"queued", "starting", "running", "succeeded",
                                         "failed", "cancelled"};
    for (int i = 0; i < 6; i++)
        fprintf(f, "<tr class=\"%s\"><td class=\"state\">%s</td><td>%lld</td></tr>\n",
                states[i], states[i],
                (long long)json_integer_value(json_object_get(counts, states[i])));
    fputs("</table>\n<p>This daemon's page shows no job's name or details (status_page: "
          "private); <code>ddpctl ls</code> shows a user's own jobs.</p>\n", f);
    json_decref(counts);
}

char *ddpd_status_page_html(ddpd_t *d)
{
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    if (!f) return NULL;
    int running = 0, up = 0;
    for (ddpd_job_t *j = ddpd_job_first(d); j; j = ddpd_job_next(j))
        running += ddpd_job_state(j) == DDPD_RUNNING;
    for (int i = 0; i < ddpd_peers_count(d); i++) up += ddpd_peers_up(d, i);
    fprintf(f, "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
               "<meta http-equiv=\"refresh\" content=\"%d\"><title>ddpd: %d running</title>\n"
               "<style>body{font:14px/1.4 'DejaVu Sans',sans-serif;margin:20px;color:#222}"
               "table{border-collapse:collapse}td,th{padding:4px 10px;border-bottom:1px solid "
               "#ddd;text-align:left}th{background:#f4f4f4}tr.running .state{color:#2ca02c;"
               "font-weight:bold}tr.failed .state{color:#d62728}tr.succeeded .state{color:#1f77b4}"
               "progress{width:120px}.tick{font-size:11px;fill:#555}.axis,.legend{font-size:12px}"
               "section{margin-top:18px}h2{font-size:15px;margin:0 0 4px}"
               ".reason{color:#666;max-width:360px}.name,.progress{white-space:nowrap}"
               "</style></head>\n<body>\n",
            REFRESH_S, running);
    fputs("<h1>ddpd on ", f);
    put_escaped(f, d->cfg.node_name);
    char up_s[32];
    fprintf(f, "</h1>\n<p id=\"daemon\">up %s &middot; %d of %d slots in use &middot; %d of %d "
               "peers up &middot; refreshes every %d s</p>\n",
            ddp_fmt_duration((double)(ddp_wall_ms() - d->start_ms) / 1000.0, up_s, sizeof up_s),
            ddpd_slots_used(d), d->cfg.slots, up, ddpd_peers_count(d), REFRESH_S);
    if (!d->cfg.status_public) {
        put_counts(f, d);
        fputs("</body></html>\n", f);
        return fclose(f) == 0 ? out : (free(out), NULL);
    }
    fputs("<table id=\"jobs\"><tr><th>job</th><th>name</th><th>state</th><th>ranks</th>"
          "<th>progress</th><th>loss</th><th>tokens/s</th><th>ETA</th><th>reason</th></tr>\n", f);
    json_t *rows = NULL;
    size_t i;
    json_t *row;
    if (ddpd_store_job_list(d->store, NULL, -1, JOBS_SHOWN, &rows) == 0)
        json_array_foreach(rows, i, row) put_row(f, d, row);
    fputs("</table>\n", f);
    if (!rows || !json_array_size(rows)) fputs("<p>No jobs yet.</p>\n", f);
    json_decref(rows);
    for (ddpd_job_t *j = ddpd_job_first(d); j; j = ddpd_job_next(j)) {
        if (ddpd_job_state(j) != DDPD_RUNNING && ddpd_job_state(j) != DDPD_STARTING) continue;
        char why[256];
        int fd = ddpd_userfile_open_in(ddpd_job_run_dir(j), "metrics.jsonl", ddpd_job_uid(j), why,
                                       sizeof why);
        ddpd_series_t s;
        if (fd < 0 || ddpd_series_read_fd(fd, TAIL_BYTES, &s) != 0) continue;
        fprintf(f, "<section id=\"curve-%lld\"><h2>job %lld (", (long long)ddpd_job_id(j),
                (long long)ddpd_job_id(j));
        put_escaped(f, ddpd_job_name(j));
        fputs("): loss</h2>\n", f);
        if (s.n) put_curve(f, &s);
        else fputs("<p>waiting for the first step</p>\n", f);
        fputs("</section>\n", f);
        ddpd_series_free(&s);
    }
    fputs("</body></html>\n", f);
    if (fclose(f) != 0) {
        free(out);
        return NULL;
    }
    return out;
}
