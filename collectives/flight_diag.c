/* The flight recorder's diagnosis (flight.h ddp_flight_diagnose): the ranks' dumps lined up by
 * (generation, sequence number), never by clock, since the ranks' clocks and speeds differ.
 *
 * In the newest generation where some recorded operation is not finished everywhere, the first
 * such sequence number s is the one that matters: every later one queues behind it. Per rank of
 * that generation, s is "never queued" (its newest record is older than s), "queued" (not yet
 * started), "started" (waiting, on the peer it names), "finished", "failed", or unknown (its
 * ring no longer holds s, or it sent no dump). The ranks that never started s are the cause; the
 * ranks that started it wait on them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/flight.h"
#include "common/alloc.h"
#include "common/err.h"

enum { NONE = -1, QUEUED = 0, STARTED = 1, FINISHED = 2, FAILED = 3, NEVER = 4, UNKNOWN = 5 };

typedef struct {
    int have;        /* a dump holds records of this rank in the generation */
    uint64_t lo, hi; /* lowest and highest seq recorded */
} span_t;

static int state_of(const char *s)
{
    if (!s) return UNKNOWN;
    if (!strcmp(s, "queued")) return QUEUED;
    if (!strcmp(s, "started")) return STARTED;
    if (!strcmp(s, "finished")) return FINISHED;
    if (!strcmp(s, "failed")) return FAILED;
    return UNKNOWN;
}

/* Calls fn on every record of every dump. */
#define EACH_RECORD(dumps, n, rec, body)                                                           \
    for (size_t d_ = 0; d_ < (n); d_++) {                                                          \
        json_t *recs_ = (dumps)[d_] ? json_object_get((dumps)[d_], "records") : NULL;              \
        size_t i_;                                                                                 \
        json_t *rec;                                                                               \
        json_array_foreach(recs_, i_, rec) { body }                                                \
    }

static uint64_t u64(json_t *o, const char *k)
{
    return (uint64_t)json_integer_value(json_object_get(o, k));
}

static int i32(json_t *o, const char *k) { return (int)json_integer_value(json_object_get(o, k)); }

/* Appends "rank 3" / "ranks 0-2, 5" for the ranks with sel[r] set; returns how many. */
static int rank_list(char *out, size_t len, const unsigned char *sel, int size)
{
    int count = 0;
    for (int r = 0; r < size; r++) count += sel[r] != 0;
    size_t at = strlen(out);
    at += (size_t)snprintf(out + at, at < len ? len - at : 0, count == 1 ? "rank " : "ranks ");
    int first = 1;
    for (int r = 0; r < size; r++) {
        if (!sel[r]) continue;
        int e = r;
        while (e + 1 < size && sel[e + 1]) e++;
        if (at < len)
            at += (size_t)(e == r ? snprintf(out + at, len - at, "%s%d", first ? "" : ", ", r)
                           : snprintf(out + at, len - at, "%s%d-%d", first ? "" : ", ", r, e));
        first = 0;
        r = e;
    }
    return count;
}

static void human_bytes(char *b, size_t len, uint64_t n)
{
    if (n >= (1u << 20))
        snprintf(b, len, "%.3g MiB", (double)n / (1 << 20));
    else if (n >= 1024)
        snprintf(b, len, "%.3g KiB", (double)n / 1024);
    else
        snprintf(b, len, "%llu bytes", (unsigned long long)n);
}

static void cat(char *out, size_t len, const char *fmt, const char *a)
{
    size_t at = strlen(out);
    if (at < len) snprintf(out + at, len - at, fmt, a);
}

int ddp_flight_diagnose(json_t *const *dumps, size_t n, char *out, size_t len)
{
    if (!out || len == 0) return DDP_EINVAL;
    out[0] = 0;
    int any = 0;
    uint64_t gen_hi = 0;
    EACH_RECORD(dumps, n, rec, {
        any = 1;
        if (u64(rec, "generation") > gen_hi) gen_hi = u64(rec, "generation");
    })
    if (!any) {
        snprintf(out, len, "no dump holds a collective operation");
        return DDP_EINVAL;
    }
    /* generations from the newest down: the first one with an unfinished operation */
    for (uint64_t g = gen_hi + 1; g-- > 0;) {
        int size = 0;
        EACH_RECORD(dumps, n, rec, {
            if (u64(rec, "generation") == g && i32(rec, "size") > size) size = i32(rec, "size");
        })
        if (size <= 0) continue;
        span_t *sp = ddp_calloc((size_t)size, sizeof *sp);
        int *st = ddp_calloc((size_t)size, sizeof *st);
        int *peer = ddp_calloc((size_t)size, sizeof *peer);
        unsigned char *sel = ddp_calloc((size_t)size, 1);
        if (!sp || !st || !peer || !sel) {
            free(sp), free(st), free(peer), free(sel);
            return DDP_ENOMEM;
        }
        EACH_RECORD(dumps, n, rec, {
            int r = i32(rec, "rank");
            uint64_t s = u64(rec, "seq");
            if (u64(rec, "generation") != g || r < 0 || r >= size) continue;
            if (!sp[r].have || s < sp[r].lo) sp[r].lo = s;
            if (!sp[r].have || s > sp[r].hi) sp[r].hi = s;
            sp[r].have = 1;
        })
        /* the lowest seq some rank has not finished */
        uint64_t stuck = 0;
        json_t *what = NULL;
        EACH_RECORD(dumps, n, rec, {
            if (u64(rec, "generation") != g) continue;
            int s = state_of(json_string_value(json_object_get(rec, "state")));
            if (s != FINISHED && (!stuck || u64(rec, "seq") < stuck)) stuck = u64(rec, "seq");
        })
        /* a rank whose newest record is older than an operation others recorded never queued
         * it: that is stuck too, even when every record says finished */
        uint64_t hi_all = 0;
        for (int r = 0; r < size; r++)
            if (sp[r].have && sp[r].hi > hi_all) hi_all = sp[r].hi;
        for (int r = 0; r < size; r++)
            if (sp[r].have && sp[r].hi < hi_all && (!stuck || sp[r].hi + 1 < stuck))
                stuck = sp[r].hi + 1;
        if (!stuck) {
            free(sp), free(st), free(peer), free(sel);
            if (g == gen_hi)
                snprintf(out, len, "no collective is stuck: every rank finished every operation "
                         "it recorded (generation %llu, up to #%llu)", (unsigned long long)g,
                         (unsigned long long)hi_all);
            if (g == gen_hi) return 0;
            continue;
        }
        for (int r = 0; r < size; r++) {
            st[r] = !sp[r].have ? UNKNOWN : sp[r].hi < stuck ? NEVER : sp[r].lo > stuck ? UNKNOWN
                                                                                       : NONE;
            peer[r] = -1;
        }
        EACH_RECORD(dumps, n, rec, {
            int r = i32(rec, "rank");
            if (u64(rec, "generation") != g || u64(rec, "seq") != stuck || r < 0 || r >= size)
                continue;
            st[r] = state_of(json_string_value(json_object_get(rec, "state")));
            peer[r] = i32(rec, "peer");
            if (!what) what = rec;
        })
        /* the operation */
        char op[160], b[32];
        human_bytes(b, sizeof b, what ? u64(what, "bytes") : 0);
        const char *kind = what ? json_string_value(json_object_get(what, "kind")) : NULL;
        int bucket = what ? i32(what, "bucket") : -1;
        if (bucket >= 0)
            snprintf(op, sizeof op, "%s #%llu (bucket %d, %s) of generation %llu",
                     kind ? kind : "operation", (unsigned long long)stuck, bucket, b,
                     (unsigned long long)g);
        else
            snprintf(op, sizeof op, "%s #%llu (%s) of generation %llu", kind ? kind : "operation",
                     (unsigned long long)stuck, b, (unsigned long long)g);
        int culprits = 0, waiters = 0, silent = 0;
        for (int r = 0; r < size; r++) culprits += st[r] == NEVER || st[r] == QUEUED;
        for (int r = 0; r < size; r++) waiters += st[r] == STARTED || st[r] == FAILED;
        for (int r = 0; r < size; r++) silent += st[r] == UNKNOWN || st[r] == NONE;
        if (culprits) {
            for (int r = 0; r < size; r++) sel[r] = st[r] == NEVER || st[r] == QUEUED;
            rank_list(out, len, sel, size);
            cat(out, len, " never started %s", op);
            int queued = 0;
            for (int r = 0; r < size; r++) queued += st[r] == QUEUED;
            if (queued) cat(out, len, "%s", queued == culprits ? " (queued, not started)"
                                                              : " (some queued, not started)");
        } else {
            for (int r = 0; r < size; r++) sel[r] = st[r] == UNKNOWN || st[r] == NONE;
            if (silent) {
                rank_list(out, len, sel, size);
                cat(out, len, " sent no record of %s", op);
            } else {
                cat(out, len, "%s", op);
                cat(out, len, "%s", " started on every rank but did not finish");
            }
        }
        if (waiters) {
            for (int r = 0; r < size; r++) sel[r] = st[r] == STARTED || st[r] == FAILED;
            cat(out, len, "%s", "; ");
            rank_list(out, len, sel, size);
            if (culprits || silent) {
                cat(out, len, "%s", waiters == 1 ? " waits on it" : " wait on it");
            } else {
                cat(out, len, "%s", waiters == 1 ? " waits" : " wait");
                memset(sel, 0, (size_t)size);
                for (int r = 0; r < size; r++)
                    if ((st[r] == STARTED || st[r] == FAILED) && peer[r] >= 0 && peer[r] < size)
                        sel[peer[r]] = 1;
                int p = 0;
                for (int r = 0; r < size; r++) p += sel[r];
                if (p) {
                    cat(out, len, "%s", " on ");
                    rank_list(out, len, sel, size);
                }
            }
        }
        int failed = 0;
        for (int r = 0; r < size; r++) failed += st[r] == FAILED;
        if (failed) {
            for (int r = 0; r < size; r++) sel[r] = st[r] == FAILED;
            cat(out, len, "%s", "; it failed (deadline or abort) on ");
            rank_list(out, len, sel, size);
        }
        if (culprits && silent) {
            for (int r = 0; r < size; r++) sel[r] = st[r] == UNKNOWN || st[r] == NONE;
            cat(out, len, "%s", "; no record of it from ");
            rank_list(out, len, sel, size);
        }
        free(sp), free(st), free(peer), free(sel);
        return 1;
    }
    snprintf(out, len, "no dump holds a collective operation");
    return DDP_EINVAL;
}
