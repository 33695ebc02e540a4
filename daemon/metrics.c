/* The Prometheus exposition text of the daemon's counters and gauges (served by http.c at
 * /metrics). */
#include "metrics.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/clock.h"
#include "common/log.h"
#include "daemon/config.h"
#include "daemon/job.h"
#include "daemon/link.h"
#include "daemon/slots.h"
#include "daemon/store.h"

typedef struct {
    char *p;
    size_t len, cap;
} sbuf_t;

static void sb_add(sbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(sbuf_t *b, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) return;
        if (b->p && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->len + (size_t)n + 1) cap *= 2;
        char *np = ddp_realloc(b->p, cap);
        if (!np) return;
        b->p = np;
        b->cap = cap;
    }
}

char *ddpd_metrics_text(ddpd_t *d)
{
    sbuf_t b = {0};
    sb_add(&b, "# HELP ddpd_up The daemon is serving.\n# TYPE ddpd_up gauge\nddpd_up 1\n");
    sb_add(&b, "# TYPE ddpd_uptime_seconds gauge\nddpd_uptime_seconds %.3f\n",
           (double)(ddp_wall_ms() - d->start_ms) / 1000.0);
    sb_add(&b, "# HELP ddpd_slots Local rank slots.\n# TYPE ddpd_slots gauge\nddpd_slots %d\n",
           d->cfg.slots);
    sb_add(&b, "# TYPE ddpd_slots_used gauge\nddpd_slots_used %d\n", ddpd_slots_used(d));
    sb_add(&b, "# TYPE ddpd_jobs_submitted_total counter\nddpd_jobs_submitted_total %llu\n",
           (unsigned long long)d->n_submitted);
    sb_add(&b, "# TYPE ddpd_jobs_finished_total counter\n");
    static const char *const fin[] = {"succeeded", "failed", "cancelled"};
    for (int i = 0; i < 3; i++)
        sb_add(&b, "ddpd_jobs_finished_total{state=\"%s\"} %llu\n", fin[i],
               (unsigned long long)d->n_finished[i]);
    int per[6] = {0};
    for (ddpd_job_t *j = ddpd_job_first(d); j; j = ddpd_job_next(j)) per[ddpd_job_state(j)]++;
    sb_add(&b, "# TYPE ddpd_jobs gauge\n");
    for (int i = 0; i < 3; i++)
        sb_add(&b, "ddpd_jobs{state=\"%s\"} %d\n", ddpd_state_name((ddpd_state_t)i), per[i]);
    sb_add(&b, "# TYPE ddpd_api_requests_total counter\nddpd_api_requests_total %llu\n",
           (unsigned long long)d->n_requests);
    sb_add(&b, "# TYPE ddpd_api_errors_total counter\nddpd_api_errors_total %llu\n",
           (unsigned long long)d->n_request_errors);
    int up = 0;
    for (int i = 0; i < ddpd_peers_count(d); i++) up += ddpd_peers_up(d, i);
    sb_add(&b, "# TYPE ddpd_peers gauge\nddpd_peers %d\n", ddpd_peers_count(d));
    sb_add(&b, "# TYPE ddpd_peers_up gauge\nddpd_peers_up %d\n", up);
    sb_add(&b, "# TYPE ddpd_worker_restarts_total counter\nddpd_worker_restarts_total %llu\n",
           (unsigned long long)d->n_worker_restarts);
    sb_add(&b, "# TYPE ddpd_store_errors_total counter\nddpd_store_errors_total %llu\n",
           (unsigned long long)d->n_store_errors);
    sb_add(&b, "# HELP ddpd_store_full The state filesystem is full: records wait in memory and "
               "no new job is taken.\n# TYPE ddpd_store_full gauge\nddpd_store_full %d\n",
           ddpd_store_full(d->store));
    sb_add(&b, "# TYPE ddpd_job_generation gauge\n");
    unsigned long gen;
    for (ddpd_job_t *j = ddpd_job_first(d); j; j = ddpd_job_next(j))
        if (ddpd_job_generation(j, &gen))
            sb_add(&b, "ddpd_job_generation{job=\"%lld\"} %lu\n", (long long)ddpd_job_id(j),
                   gen);
    sb_add(&b, "# TYPE ddpd_job_step gauge\n# TYPE ddpd_job_loss gauge\n"
               "# TYPE ddpd_job_tokens_per_second gauge\n# TYPE ddpd_job_straggler_rank gauge\n");
    for (ddpd_job_t *j = ddpd_job_first(d); j; j = ddpd_job_next(j)) {
        const ddp_metrics_rec_t *m = ddpd_job_last_step(j);
        if (!m || ddpd_state_terminal(ddpd_job_state(j))) continue;
        long long id = (long long)ddpd_job_id(j);
        sb_add(&b, "ddpd_job_step{job=\"%lld\"} %lld\n", id, (long long)m->step);
        if ((m->has & DDP_MF(LOSS)) && isfinite(m->loss)) /* null: no number */
            sb_add(&b, "ddpd_job_loss{job=\"%lld\"} %.6g\n", id, m->loss);
        if ((m->has & DDP_MF(TOKENS_PER_S)) && isfinite(m->tokens_per_s))
            sb_add(&b, "ddpd_job_tokens_per_second{job=\"%lld\"} %.6g\n", id,
                   m->tokens_per_s);
        if (m->has & DDP_MF(STRAGGLER)) /* -1: none */
            sb_add(&b, "ddpd_job_straggler_rank{job=\"%lld\"} %lld\n", id,
                   (long long)m->straggler);
    }
    return b.p;
}
