/* The per-op profiler behind the front door (kernels.h, "Per-op profiling"; kernels_int.h
 * states the invariants).
 *
 * A window records, for each call of the owner thread, two backend marks (timer_mark) and the
 * host clock around the backend call; the marks are read (timer_elapsed_ms) once, at stop,
 * after one synchronisation, or every DDP__KPROF_DRAIN calls in a long window. A backend
 * without marks is timed by the host clock alone. Nothing here touches tensors, so results do
 * not change.
 */
#include "kernels/kernels_int.h"

#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/err.h"
#include "common/log.h"

__thread struct ddp__kprof *ddp__kprof_mine;

static const char *const OP_NAMES[] = {
#define OP_NAME(op, params) #op,
    DDP_KOPS(OP_NAME)
#undef OP_NAME
};

const char *ddp_kop_name(ddp_kop_t op)
{
    return (unsigned)op < DDP_KOP_COUNT ? OP_NAMES[op] : "?";
}

static int opened(const ddp_kernels_t *k) { return k && k->ops && k->ctx; }

/* The error ddp_k_sync would return after a wait that returned rc. */
static int sync_result(ddp_kernels_t *k, int rc)
{
    int kept = __atomic_load_n(&k->err, __ATOMIC_RELAXED);
    return kept ? kept : rc;
}

static void keep(struct ddp__kprof *p, int rc)
{
    if (rc && !p->err) p->err = rc;
}

/* Reads the marks of the records so far into the ops' ms and forgets them (the caller has
 * synchronised since the last mark). */
static void read_marks(ddp_kernels_t *k, struct ddp__kprof *p)
{
    if (!p->marks) return;
    for (size_t i = 0; i < p->n; i++) {
        double ms = k->ops->timer_elapsed_ms(k->ctx, p->recs[i].a, p->recs[i].b);
        if (ms < 0) {
            keep(p, DDP_EIO);
            continue;
        }
        p->op[p->recs[i].op].ms += ms;
    }
    p->n = 0;
    k->ops->timer_reset(k->ctx);
}

/* A full record list in a long window: one synchronisation, then the marks are read. An error
 * of the wait is kept in k as well, for the trainer's next ddp_k_sync. */
static void drain(ddp_kernels_t *k, struct ddp__kprof *p)
{
    int rc = k->ops->sync(k->ctx);
    if (rc) {
        keep(p, rc);
        int none = 0;
        __atomic_compare_exchange_n(&k->err, &none, rc, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    }
    read_marks(k, p);
}

int ddp__kprof_begin_slow(ddp_kernels_t *k, struct ddp__kprof *p, ddp__kspan_t *s)
{
    if (!p->on) return 0;
    s->p = p;
    s->a = NULL;
    if (p->marks) {
        if (p->n == DDP__KPROF_DRAIN) drain(k, p);
        if (p->n == p->cap) {
            size_t cap = p->cap ? p->cap * 2 : 1024;
            ddp__kprof_rec_t *r = realloc(p->recs, cap * sizeof *r);
            if (!r) {
                keep(p, DDP_ENOMEM);
                return 0;
            }
            p->recs = r;
            p->cap = cap;
        }
        int rc = k->ops->timer_mark(k->ctx, &s->a);
        if (rc) {
            keep(p, rc);
            return 0;
        }
    }
    s->h0 = ddp_now_ns();
    return 1;
}

void ddp__kprof_end(ddp_kernels_t *k, ddp_kop_t op, const ddp__kspan_t *s, double flops,
                    double bytes)
{
    struct ddp__kprof *p = s->p;
    double host = (double)(ddp_now_ns() - s->h0) / 1e6;
    ddp_kprof_stat_t *st = &p->op[op];
    st->calls++;
    st->host_ms += host;
    st->flops += flops;
    st->bytes += bytes;
    if (!p->marks) {
        st->ms += host;
        return;
    }
    void *b = NULL;
    int rc = k->ops->timer_mark(k->ctx, &b);
    if (rc) { /* the call counts, its stream time is lost: the window reports the error */
        keep(p, rc);
        return;
    }
    p->recs[p->n++] = (ddp__kprof_rec_t){s->a, b, (int)op};
}

int ddp_k_profile_start(ddp_kernels_t *k)
{
    if (!opened(k) || ddp__kprof_mine) return DDP_EINVAL;
    struct ddp__kprof *p = __atomic_load_n(&k->prof, __ATOMIC_ACQUIRE);
    if (!p) {
        p = calloc(1, sizeof *p);
        if (!p) return DDP_ENOMEM;
        __atomic_store_n(&k->prof, p, __ATOMIC_RELEASE);
    }
    if (p->open) return DDP_EINVAL; /* another thread's window */
    int rc = sync_result(k, k->ops->sync(k->ctx));
    if (rc) return rc;
    memset(p->op, 0, sizeof p->op);
    p->marks = k->ops->timer_mark && k->ops->timer_elapsed_ms && k->ops->timer_reset;
    if (p->marks) k->ops->timer_reset(k->ctx);
    p->n = 0;
    p->err = 0;
    p->wall_ms = 0;
    p->open = p->on = 1;
    ddp__kprof_mine = p;
    p->t0 = ddp_now_ns();
    return 0;
}

void ddp_k_profile_pause(ddp_kernels_t *k)
{
    struct ddp__kprof *p = k ? __atomic_load_n(&k->prof, __ATOMIC_ACQUIRE) : NULL;
    if (!p || p != ddp__kprof_mine || !p->on) return;
    p->wall_ms += (double)(ddp_now_ns() - p->t0) / 1e6;
    p->on = 0;
}

void ddp_k_profile_resume(ddp_kernels_t *k)
{
    struct ddp__kprof *p = k ? __atomic_load_n(&k->prof, __ATOMIC_ACQUIRE) : NULL;
    if (!p || p != ddp__kprof_mine || p->on) return;
    p->on = 1;
    p->t0 = ddp_now_ns();
}

int ddp_k_profile_stop(ddp_kernels_t *k, ddp_kprof_report_t *out)
{
    if (out) memset(out, 0, sizeof *out);
    struct ddp__kprof *p = opened(k) ? __atomic_load_n(&k->prof, __ATOMIC_ACQUIRE) : NULL;
    if (!p || p != ddp__kprof_mine) return DDP_EINVAL;
    int rc = sync_result(k, k->ops->sync(k->ctx));
    if (p->on) p->wall_ms += (double)(ddp_now_ns() - p->t0) / 1e6;
    read_marks(k, p);
    p->open = p->on = 0;
    ddp__kprof_mine = NULL;
    if (out) {
        memcpy(out->op, p->op, sizeof out->op);
        out->wall_ms = p->wall_ms;
        out->stream_marks = p->marks;
        out->err = p->err;
    }
    if (p->err)
        DDP_WARN("kernels: profile of %s: %s; some calls have no stream time", k->ops->name,
                 ddp_strerror(p->err));
    return rc;
}

void ddp__kprof_free(struct ddp__kprof *p)
{
    if (!p) return;
    if (ddp__kprof_mine == p) ddp__kprof_mine = NULL;
    free(p->recs);
    free(p);
}
