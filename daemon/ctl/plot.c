/* `ddpctl plot` (see ctl.h).
 *
 * gnuplot draws: it is a well-kept plotting program in Debian (gnuplot-nox has the svg and
 * pngcairo terminals and no X11), and a script plus two data files in a private temporary
 * directory is all it needs; nothing is drawn by hand here. The script quotes every path as a
 * gnuplot single-quoted string (a ' is doubled) and titles are not "enhanced" text, so a job
 * name or path cannot inject gnuplot commands or markup.
 */

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/ctl/ctl.h"
#include "daemon/series.h"

extern char **environ;

/* A gnuplot single-quoted string literal of s. */
static void put_quoted(FILE *f, const char *s)
{
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'') fputc('\'', f);
        if (*s != '\n') fputc(*s, f);
    }
    fputc('\'', f);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcasecmp(s + n - m, suffix);
}

int ddpctl_run_dir(const char *job, const ddpctl_where_t *w, char *path, size_t len,
                   int *is_file, char *title, size_t tlen)
{
    struct stat st;
    if (stat(job, &st) == 0) {
        snprintf(path, len, "%s", job);
        *is_file = !S_ISDIR(st.st_mode);
        snprintf(title, tlen, "%s", job);
        return 0;
    }
    *is_file = 0;
    char *end = NULL;
    long long id = strtoll(job, &end, 10);
    if (!*job || *end || id <= 0) {
        fprintf(stderr, "ddpctl plot: '%s' is neither a job id, a run directory nor a "
                        "metrics.jsonl\n", job);
        return CTL_USAGE;
    }
    json_t *res;
    int rc = ddpctl_job_get(w, id, &res);
    if (rc) return rc;
    const char *dir = json_string_value(json_object_get(res, "run_dir"));
    snprintf(path, len, "%s", dir ? dir : "");
    snprintf(title, tlen, "job %lld (%s)", id,
             json_string_value(json_object_get(res, "name")) ?: "?");
    json_decref(res);
    return 0;
}

/* train.dat: step loss tokens/s MFU% ("?" = missing); val.dat: step val_loss */
static int write_data(const char *dir, const ddpd_series_t *s)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/train.dat", dir);
    FILE *f = fopen(p, "we");
    if (!f) return -errno;
    for (size_t i = 0; i < s->n; i++) {
        fprintf(f, "%ld %.9g ", s->step[i], s->loss[i]);
        if (isnan(s->tps[i])) fputs("? ", f);
        else fprintf(f, "%.6g ", s->tps[i]);
        if (isnan(s->mfu[i])) fputs("?\n", f);
        else fprintf(f, "%.6g\n", 100.0 * s->mfu[i]);
    }
    int bad = fclose(f);
    snprintf(p, sizeof p, "%s/val.dat", dir);
    if (!(f = fopen(p, "we"))) return -errno;
    for (size_t i = 0; i < s->n_val; i++) fprintf(f, "%ld %.9g\n", s->val_step[i], s->val_loss[i]);
    return (fclose(f) || bad) ? -EIO : 0;
}

static int write_script(const char *dir, const ddpd_series_t *s, const char *out, int png,
                        int logy, const char *title)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/plot.gp", dir);
    FILE *f = fopen(p, "we");
    if (!f) return -errno;
    int have_tps = 0, have_gen = 0, have_mfu = 0;
    for (size_t i = 0; i < s->n; i++) {
        have_tps |= !isnan(s->tps[i]);
        have_mfu |= !isnan(s->mfu[i]);
        have_gen |= s->gen[i] >= 0;
    }
    if (png) fputs("set terminal pngcairo size 1000,720 noenhanced font 'DejaVu Sans,11' "
                   "background rgb 'white'\n", f);
    else fputs("set terminal svg size 1000,720 dynamic noenhanced font 'DejaVu Sans,12' "
               "background rgb 'white'\n", f);
    fputs("set output ", f);
    put_quoted(f, out);
    fputs("\nset datafile missing '?'\nset grid lc rgb '#dddddd'\nset border lc rgb '#444444'\n"
          "set lmargin 12\nset multiplot\n", f);
    fprintf(f, "set rmargin %d\n", have_mfu ? 10 : 4); /* room for MFU's axis, both panels */
    fprintf(f, "set origin 0,%s\nset size 1,%s\n", have_tps ? "0.34" : "0",
            have_tps ? "0.66" : "1");
    fputs("set title ", f);
    put_quoted(f, title);
    /* the key bottom left, where a falling loss curve leaves room; generation labels top */
    fprintf(f, "\nset ylabel %s\nset key bottom left box opaque\n",
            logy ? "'loss (log scale)'" : "'loss'");
    if (logy) {
        /* gnuplot widens a log axis to whole decades; 0.1..10 flattens a curve of 0.6..6 */
        double lo = INFINITY, hi = -INFINITY;
        for (size_t i = 0; i < s->n; i++)
            if (s->loss[i] > 0) lo = fmin(lo, s->loss[i]), hi = fmax(hi, s->loss[i]);
        for (size_t i = 0; i < s->n_val; i++)
            if (s->val_loss[i] > 0) lo = fmin(lo, s->val_loss[i]), hi = fmax(hi, s->val_loss[i]);
        fputs("set logscale y\n", f);
        if (lo < hi) {
            fprintf(f, "set yrange [%.6g:%.6g]\nset ytics (", lo / 1.1, hi * 1.1);
            /* within a decade or two gnuplot's log axis labels nothing: 1-2-3-5 steps, finer
             * when the curve spans less than a decade and a half */
            static const double coarse[] = {1, 2, 3, 5, 0}, fine[] = {1, 1.5, 2, 3, 4, 5, 6, 8, 0};
            const double *mant = log10(hi / lo) > 1.5 ? coarse : fine;
            const char *sep = "";
            for (int e = (int)floor(log10(lo / 1.1)); e <= (int)ceil(log10(hi * 1.1)); e++)
                for (int m = 0; mant[m] > 0; m++) {
                    double v = mant[m] * pow(10, e);
                    if (v < lo / 1.1 || v > hi * 1.1) continue;
                    fprintf(f, "%s%.6g", sep, v);
                    sep = ", ";
                }
            fputs(")\n", f);
        }
    }
    fprintf(f, "set xrange [%ld:%ld]\n", s->step[0] > 1 ? s->step[0] - 1 : 0, s->step[s->n - 1]);
    if (!have_tps) fputs("set xlabel 'step'\n", f);
    /* generation changes: a dashed line and a label at the first step of the new one */
    for (size_t i = 1; have_gen && i < s->n; i++) {
        if (s->gen[i] == s->gen[i - 1] || s->gen[i] < 0) continue;
        fprintf(f, "set arrow from %ld, graph 0 to %ld, graph 1 nohead dt 2 lw 1.5 "
                   "lc rgb '#9467bd' front\n", s->step[i], s->step[i]);
        fprintf(f, "set label 'generation %ld' at %ld, graph 0.97 offset 0.5,0 "
                   "tc rgb '#9467bd' front\n", s->gen[i], s->step[i]);
    }
    fprintf(f, "plot '%s/train.dat' using 1:2 with lines lw 1.5 lc rgb '#1f77b4' "
               "title 'training loss'", dir);
    if (s->n_val)
        fprintf(f, ", \\\n     '%s/val.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.7 "
                   "lc rgb '#d62728' title 'validation loss'", dir);
    fputs("\n", f);
    if (have_tps) {
        fputs("unset title\nunset logscale y\nunset label\nunset arrow\n"
              "set origin 0,0\nset size 1,0.34\nset xlabel 'step'\nset ylabel 'tokens/s'\n"
              "set ytics autofreq\n"
              "set yrange [0:*]\nset key top right box opaque\n", f);
        for (size_t i = 1; have_gen && i < s->n; i++)
            if (s->gen[i] != s->gen[i - 1] && s->gen[i] >= 0)
                fprintf(f, "set arrow from %ld, graph 0 to %ld, graph 1 nohead dt 2 lw 1.5 "
                           "lc rgb '#9467bd' front\n", s->step[i], s->step[i]);
        /* MFU on the right axis, in percent */
        if (have_mfu)
            fputs("set y2label 'MFU (%)'\nset y2tics\nset y2range [0:*]\nset ytics nomirror\n", f);
        fprintf(f, "plot '%s/train.dat' using 1:3 with lines lw 1.2 lc rgb '#2ca02c' "
                   "title 'tokens/s'", dir);
        if (have_mfu)
            fprintf(f, ", \\\n     '%s/train.dat' using 1:4 axes x1y2 with lines lw 1.2 "
                       "lc rgb '#ff7f0e' title 'MFU'", dir);
        fputs("\n", f);
    }
    fputs("unset multiplot\n", f);
    return fclose(f) ? -EIO : 0;
}

static int run_gnuplot(const char *dir)
{
    char script[PATH_MAX];
    snprintf(script, sizeof script, "%s/plot.gp", dir);
    char *argv[] = {"gnuplot", script, NULL};
    pid_t pid;
    int rc = posix_spawnp(&pid, "gnuplot", NULL, NULL, argv, environ);
    if (rc) {
        fprintf(stderr, "ddpctl plot: cannot run gnuplot: %s (Debian: apt install gnuplot-nox)\n",
                strerror(rc));
        return CTL_ERROR;
    }
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "ddpctl plot: gnuplot failed (script %s)\n", script);
        return CTL_ERROR;
    }
    return 0;
}

static void remove_tmp(const char *dir)
{
    static const char *const names[] = {"plot.gp", "train.dat", "val.dat"};
    char p[PATH_MAX];
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        unlink(p);
    }
    rmdir(dir);
}

int ddpctl_plot(int argc, char **argv, const ddpctl_where_t *w)
{
    static const struct option o[] = {{"output", required_argument, 0, 'o'},
                                      {"log", no_argument, 0, 'l'},
                                      {0, 0, 0, 0}};
    const char *out = NULL;
    int logy = 0, c;
    optind = 0; /* 0: full re-initialisation, so GNU getopt permutes again */
    while ((c = getopt_long(argc, argv, "o:", o, NULL)) != -1) {
        if (c == 'o') out = optarg;
        else if (c == 'l') logy = 1;
        else return CTL_USAGE;
    }
    if (optind != argc - 1) {
        fprintf(stderr, "usage: ddpctl plot JOB|RUN_DIR|metrics.jsonl [-o FILE.svg|.png] "
                        "[--log]\n");
        return CTL_USAGE;
    }
    const char *job = argv[optind];
    char def[64] = "loss.svg"; /* job-N-loss.svg for a job id */
    if (strspn(job, "0123456789") == strlen(job))
        snprintf(def, sizeof def, "job-%.40s-loss.svg", job);
    if (!out) out = def;
    int png = ends_with(out, ".png");
    if (!png && !ends_with(out, ".svg")) {
        fprintf(stderr, "ddpctl plot: -o %s: the name must end in .svg or .png\n", out);
        return CTL_USAGE;
    }
    char path[PATH_MAX], title[512];
    int is_file;
    int rc = ddpctl_run_dir(job, w, path, sizeof path - 16, &is_file, title,
                            sizeof title);
    if (rc) return rc;
    if (!is_file) strcat(path, "/metrics.jsonl");
    ddpd_series_t s;
    rc = ddpd_series_read(path, 0, &s);
    if (rc) {
        fprintf(stderr, "ddpctl plot: %s: %s\n", path, rc == -ENOENT ? "no such file (has the "
                        "job started?)" : strerror(-rc));
        return CTL_ERROR;
    }
    if (s.n == 0) {
        fprintf(stderr, "ddpctl plot: %s has no step lines yet\n", path);
        ddpd_series_free(&s);
        return CTL_ERROR;
    }
    char dir[] = "/tmp/ddpctl-plot.XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "ddpctl plot: mkdtemp: %s\n", strerror(errno));
        ddpd_series_free(&s);
        return CTL_ERROR;
    }
    rc = write_data(dir, &s);
    if (!rc) rc = write_script(dir, &s, out, png, logy, title);
    if (rc) fprintf(stderr, "ddpctl plot: writing in %s: %s\n", dir, strerror(-rc));
    rc = rc ? CTL_ERROR : run_gnuplot(dir);
    if (!rc)
        printf("wrote %s: %zu steps (%ld..%ld), %zu validations\n", out, s.n, s.step[0],
               s.step[s.n - 1], s.n_val);
    remove_tmp(dir);
    ddpd_series_free(&s);
    return rc;
}
