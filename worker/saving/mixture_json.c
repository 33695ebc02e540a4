/* trainer.json's data.mixture and the resume rules (see mixture_json.h). */
#include "worker/saving/mixture_json.h"

#include <stdio.h>
#include <string.h>

#include "common/log.h"

/* The "mixture" object for s, or NULL when s has none (or on ENOMEM). New reference. */
static json_t *mixture_json(const ddp_spec_t *spec, const ddp_mixture_state_t *s)
{
    if (s->n <= 0 || s->n != spec->n_train) return NULL;
    json_t *list = json_array();
    for (int d = 0; list && d < s->n; d++)
        json_array_append_new(list,
                              json_pack("{s:s, s:f, s:I, s:I}", "name", spec->train[d].name,
                                        "weight", spec->train[d].weight, "count",
                                        (json_int_t)s->count[d], "base", (json_int_t)s->base[d]));
    return list ? json_pack("{s:I, s:I, s:o}", "at", (json_int_t)s->at, "base_seq",
                            (json_int_t)s->base_seq, "sources", list)
                : NULL;
}

void ddp__mixture_save(json_t *o, const ddp_spec_t *spec, const ddp_position_t *pos)
{
    json_t *mix = mixture_json(spec, &pos->ext.mix);
    if (mix) json_object_set_new(json_object_get(o, "data"), "mixture", mix);
}

/* "name weight, name weight, ..." of a list for the log. */
static void describe(char *buf, size_t len, const char (*names)[64], const double *w, int n)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int d = 0; d < n && at < len; d++)
        at += (size_t)snprintf(buf + at, len - at, "%s%s %g", d ? ", " : "", names[d], w[d]);
}

/* The rules of mixture_json.h for a resume at sample `at`; logs when `log`. */
static int resume(const ddp_spec_t *spec, json_t *data, int64_t at, ddp_mixture_state_t *s,
                  const char *path, int log, ddp_errinfo_t *ei)
{
    json_t *mix = data ? json_object_get(data, "mixture") : NULL;
    json_t *list = mix ? json_object_get(mix, "sources") : NULL;
    int K = spec->n_train;
    memset(s, 0, sizeof *s);
    if (mix &&
        (!json_is_object(mix) || !json_is_array(list) || json_array_size(list) < 1 ||
         json_array_size(list) > DDP_MIXTURE_MAX || !json_is_integer(json_object_get(mix, "at")) ||
         !json_is_integer(json_object_get(mix, "base_seq"))))
        return ddp_errinfo_set(ei, DDP_EFORMAT,
                               "%s/trainer.json: data.mixture needs at, base_seq and 1 to %d "
                               "sources",
                               path, DDP_MIXTURE_MAX);
    if (K <= 1) {
        if (mix && log)
            DDP_WARN("checkpoint %s: its data mixture of %zu sources is not resumed: data.train is "
                     "one source now, which continues at sample %lld of its own order",
                     path, json_array_size(list), (long long)at);
        return 0;
    }
    ddp_mixture_state_init(s, K);
    s->at = s->base_seq = at;
    if (!mix) {
        if (log)
            DDP_INFO("checkpoint %s has no per-source cursors (a single-source run, or an older "
                     "build): the mixture of %d sources starts each at its sequence 0 at sample "
                     "%lld",
                     path, K, (long long)at);
        return 0;
    }
    int n_old = (int)json_array_size(list);
    char old_names[DDP_MIXTURE_MAX][64];
    double old_w[DDP_MIXTURE_MAX];
    int64_t old_count[DDP_MIXTURE_MAX], old_base[DDP_MIXTURE_MAX];
    for (int o = 0; o < n_old; o++) {
        json_t *e = json_array_get(list, (size_t)o);
        json_t *nm = json_object_get(e, "name"), *w = json_object_get(e, "weight");
        json_t *c = json_object_get(e, "count"), *b = json_object_get(e, "base");
        if (!json_is_string(nm) || !json_is_number(w) || !json_is_integer(c) ||
            !json_is_integer(b) || json_integer_value(c) < 0)
            return ddp_errinfo_set(ei, DDP_EFORMAT,
                                   "%s/trainer.json: data.mixture.sources[%d] needs name, "
                                   "weight, count and base",
                                   path, o);
        snprintf(old_names[o], sizeof old_names[o], "%s", json_string_value(nm));
        old_w[o] = json_number_value(w);
        old_count[o] = json_integer_value(c);
        old_base[o] = json_integer_value(b);
    }
    int same = n_old == K && json_integer_value(json_object_get(mix, "at")) == at;
    int used[DDP_MIXTURE_MAX] = {0};
    for (int d = 0; d < K; d++) {
        int o = 0;
        while (o < n_old && strcmp(old_names[o], spec->train[d].name)) o++;
        if (o == n_old) {
            same = 0;
            if (log)
                DDP_INFO("checkpoint %s: data.train's source %s is new: it starts at its "
                         "sequence 0",
                         path, spec->train[d].name);
            continue;
        }
        used[o] = 1;
        s->count[d] = old_count[o];
        s->base[d] = old_base[o];
        same = same && o == d && old_w[o] == spec->train[d].weight;
    }
    for (int o = 0; o < n_old; o++)
        if (!used[o] && log)
            DDP_WARN("checkpoint %s: source %s (%lld sequences drawn) is no longer in data.train: "
                     "its cursor is dropped (listed again later, it would start over at 0)",
                     path, old_names[o], (long long)old_count[o]);
    if (same) { /* the saved position as it is: bitwise the run that never stopped */
        s->base_seq = json_integer_value(json_object_get(mix, "base_seq"));
        return 0;
    }
    ddp_mixture_rebase(s); /* the counts stay; the weights count from here */
    if (log) {
        char was[1024], now[1024], counts[1024];
        char names[DDP_MIXTURE_MAX][64];
        double w[DDP_MIXTURE_MAX], c[DDP_MIXTURE_MAX];
        for (int d = 0; d < K; d++) {
            snprintf(names[d], sizeof names[d], "%s", spec->train[d].name);
            w[d] = spec->train[d].weight;
            c[d] = (double)s->count[d];
        }
        describe(was, sizeof was, old_names, old_w, n_old);
        describe(now, sizeof now, names, w, K);
        describe(counts, sizeof counts, names, c, K);
        DDP_INFO("checkpoint %s: data.train's mixture changed at sample %lld: weights were %s, "
                 "now %s; each source goes on from its cursor (%s): nothing is repeated or "
                 "skipped",
                 path, (long long)at, was, now, counts);
    }
    return 0;
}

int ddp__mixture_read(const ddp_spec_t *spec, json_t *data, long G, const char *path, int rank,
                      ddp_position_t *pos, ddp_errinfo_t *ei)
{
    return resume(spec, data, (int64_t)pos->step * G, &pos->ext.mix, path, rank == 0, ei);
}
