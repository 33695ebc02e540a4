/* `ddpctl trace JOB [-o FILE.json]`: merges the ranks' timeline traces (RUN_DIR/trace/
 * rank-R.json, written by ranks whose spec has train.trace; common/trace.h) into one Chrome
 * trace-event file, one process row per rank, that Perfetto (ui.perfetto.dev: Open trace file)
 * and chrome://tracing load. Timestamps are rebased to the earliest event of any rank, so the
 * file starts at 0; otherData keeps each rank's notes (bucket count, traced steps).
 */

#include <getopt.h>
#include <glob.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "daemon/ctl/ctl.h"

int ddpctl_trace(int argc, char **argv, const ddpctl_where_t *w)
{
    static const struct option o[] = {{"output", required_argument, 0, 'o'}, {0, 0, 0, 0}};
    const char *out = NULL;
    int c;
    optind = 0; /* 0: full re-initialisation, so GNU getopt permutes again */
    while ((c = getopt_long(argc, argv, "o:", o, NULL)) != -1) {
        if (c == 'o') out = optarg;
        else return CTL_USAGE;
    }
    if (optind != argc - 1) {
        fprintf(stderr, "usage: ddpctl trace JOB|RUN_DIR [-o FILE.json]\n");
        return CTL_USAGE;
    }
    const char *job = argv[optind];
    char def[64] = "trace.json", dir[PATH_MAX], title[512];
    if (strspn(job, "0123456789") == strlen(job))
        snprintf(def, sizeof def, "job-%.40s-trace.json", job);
    if (!out) out = def;
    int is_file;
    int rc = ddpctl_run_dir(job, w, dir, sizeof dir - 32, &is_file, title,
                            sizeof title);
    if (rc) return rc;
    if (is_file) {
        fprintf(stderr, "ddpctl trace: %s is a file; give the run directory or the job id\n",
                job);
        return CTL_USAGE;
    }
    char pattern[PATH_MAX + 32];
    snprintf(pattern, sizeof pattern, "%s/trace/rank-*.json", dir);
    glob_t g;
    if (glob(pattern, 0, NULL, &g) != 0 || g.gl_pathc == 0) {
        fprintf(stderr, "ddpctl trace: no %s (was the job run with train.trace, e.g. "
                        "--set train.trace='\"10-12\"', and has it reached those steps?)\n",
                pattern);
        globfree(&g);
        return CTL_ERROR;
    }
    json_t *events = json_array(), *other = json_object(), *ranks = json_object();
    double t0 = INFINITY;
    rc = 0;
    for (size_t i = 0; i < g.gl_pathc && rc == 0; i++) {
        json_error_t je;
        json_t *f = json_load_file(g.gl_pathv[i], 0, &je);
        json_t *ev = json_object_get(f, "traceEvents");
        if (!json_is_array(ev)) {
            fprintf(stderr, "ddpctl trace: %s: not a trace (%s)\n", g.gl_pathv[i],
                    f ? "no traceEvents array" : je.text);
            rc = CTL_ERROR;
        } else {
            size_t k;
            json_t *e;
            json_array_foreach(ev, k, e) {
                json_t *ts = json_object_get(e, "ts");
                if (json_is_number(ts) && json_number_value(ts) < t0) t0 = json_number_value(ts);
                json_array_append(events, e);
            }
            json_t *od = json_object_get(f, "otherData");
            json_t *r = json_object_get(od, "rank");
            char key[32];
            snprintf(key, sizeof key, "%lld", (long long)json_integer_value(r));
            if (od) json_object_set(ranks, key, od);
        }
        json_decref(f);
    }
    globfree(&g);
    if (rc == 0) {
        size_t k;
        json_t *e;
        json_array_foreach(events, k, e) {
            json_t *ts = json_object_get(e, "ts");
            if (json_is_number(ts))
                json_object_set_new(e, "ts", json_real(json_number_value(ts) - t0));
        }
        json_object_set_new(other, "title", json_string(title));
        json_object_set_new(other, "ranks", ranks);
        ranks = NULL;
        json_t *root = json_pack("{sO ss sO}", "traceEvents", events, "displayTimeUnit", "ms",
                                 "otherData", other);
        if (!root || json_dump_file(root, out, JSON_COMPACT) != 0) {
            fprintf(stderr, "ddpctl trace: cannot write %s\n", out);
            rc = CTL_ERROR;
        } else {
            printf("wrote %s: %zu events from %zu rank(s); open it in ui.perfetto.dev or "
                   "chrome://tracing\n",
                   out, json_array_size(events), json_object_size(json_object_get(other, "ranks")));
        }
        json_decref(root);
    }
    json_decref(ranks);
    json_decref(events);
    json_decref(other);
    return rc;
}
