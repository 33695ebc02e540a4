/* Prometheus endpoint: a tiny HTTP/1.0 responder. Requests are read up to the end of the
 * headers (8 KiB at most, or the connection is dropped) and answered with one text body. */
#include "metrics.h"

#include <math.h>
#include <netinet/in.h>
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
#include "daemon/status_page.h"

typedef struct mconn {
    uv_tcp_t tcp;
    ddpd_t *d;
    char buf[8192];
    size_t len;
    int answered;
    char *resp; /* the response, kept until its write completes */
} mconn_t;

struct ddpd_metrics {
    uv_tcp_t listener;
};

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
    sb_add(&b, "# TYPE ddpd_slots_used gauge\nddpd_slots_used %d\n", d->slots_used);
    sb_add(&b, "# TYPE ddpd_jobs_submitted_total counter\nddpd_jobs_submitted_total %llu\n",
           (unsigned long long)d->n_submitted);
    sb_add(&b, "# TYPE ddpd_jobs_finished_total counter\n");
    static const char *const fin[] = {"succeeded", "failed", "cancelled"};
    for (int i = 0; i < 3; i++)
        sb_add(&b, "ddpd_jobs_finished_total{state=\"%s\"} %llu\n", fin[i],
               (unsigned long long)d->n_finished[i]);
    int per[6] = {0};
    for (ddpd_job_t *j = d->jobs; j; j = j->next) per[j->state]++;
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
    sb_add(&b, "# TYPE ddpd_job_generation gauge\n");
    for (ddpd_job_t *j = d->jobs; j; j = j->next)
        if (j->coord && !ddpd_state_terminal(j->state))
            sb_add(&b, "ddpd_job_generation{job=\"%lld\"} %lu\n", (long long)j->id,
                   j->generation);
    sb_add(&b, "# TYPE ddpd_job_step gauge\n# TYPE ddpd_job_loss gauge\n"
               "# TYPE ddpd_job_tokens_per_second gauge\n# TYPE ddpd_job_straggler_rank gauge\n");
    for (ddpd_job_t *j = d->jobs; j; j = j->next) {
        if (!j->tail.has_last || ddpd_state_terminal(j->state)) continue;
        const ddp_metrics_rec_t *m = &j->tail.last_step;
        sb_add(&b, "ddpd_job_step{job=\"%lld\"} %lld\n", (long long)j->id, (long long)m->step);
        if ((m->has & DDP_MF(LOSS)) && isfinite(m->loss)) /* null: no number */
            sb_add(&b, "ddpd_job_loss{job=\"%lld\"} %.6g\n", (long long)j->id, m->loss);
        if ((m->has & DDP_MF(TOKENS_PER_S)) && isfinite(m->tokens_per_s))
            sb_add(&b, "ddpd_job_tokens_per_second{job=\"%lld\"} %.6g\n", (long long)j->id,
                   m->tokens_per_s);
        if (m->has & DDP_MF(STRAGGLER)) /* -1: none */
            sb_add(&b, "ddpd_job_straggler_rank{job=\"%lld\"} %lld\n", (long long)j->id,
                   (long long)m->straggler);
    }
    return b.p;
}

static void conn_closed(uv_handle_t *h)
{
    mconn_t *c = h->data;
    free(c->resp);
    free(c);
}

static void wrote(uv_write_t *req, int status)
{
    (void)status;
    mconn_t *c = req->data;
    free(req);
    uv_close((uv_handle_t *)&c->tcp, conn_closed);
}

static void m_alloc(uv_handle_t *h, size_t sz, uv_buf_t *buf)
{
    (void)sz;
    mconn_t *c = h->data;
    buf->base = c->buf + c->len;
    buf->len = sizeof c->buf - c->len;
}

static void m_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
    (void)buf;
    mconn_t *c = st->data;
    if (c->answered) return;
    if (n < 0 || (n == 0 && c->len == sizeof c->buf)) {
        uv_close((uv_handle_t *)&c->tcp, conn_closed);
        return;
    }
    c->len += (size_t)n;
    if (!memmem(c->buf, c->len, "\r\n\r\n", 4) && !memmem(c->buf, c->len, "\n\n", 2)) {
        if (c->len == sizeof c->buf) uv_close((uv_handle_t *)&c->tcp, conn_closed);
        return;
    }
    c->answered = 1;
    uv_read_stop(st);
    int page = ddpd_status_page_wanted(c->buf, c->len); /* GET / is the status page */
    char *body = page ? ddpd_status_page_html(c->d) : ddpd_metrics_text(c->d);
    size_t bl = body ? strlen(body) : 0;
    char *resp = ddp_malloc(bl + 256);
    uv_write_t *req = ddp_malloc(sizeof *req);
    if (!resp || !req) {
        free(body);
        free(resp);
        free(req);
        uv_close((uv_handle_t *)&c->tcp, conn_closed);
        return;
    }
    int hl = snprintf(resp, 256,
                      "HTTP/1.0 200 OK\r\nContent-Type: %s\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                      page ? "text/html; charset=utf-8" : "text/plain; version=0.0.4", bl);
    if (bl) memcpy(resp + hl, body, bl);
    free(body);
    c->resp = resp;
    uv_buf_t ub = uv_buf_init(resp, (unsigned)(hl + (int)bl));
    req->data = c;
    c->len = 0;
    if (uv_write(req, st, &ub, 1, wrote) != 0) {
        free(req);
        uv_close((uv_handle_t *)&c->tcp, conn_closed);
    }
}

static void m_conn(uv_stream_t *server, int status)
{
    ddpd_t *d = server->data;
    if (status < 0) return;
    mconn_t *c = ddp_calloc(1, sizeof *c);
    if (!c) return;
    c->d = d;
    uv_tcp_init(d->loop, &c->tcp);
    c->tcp.data = c;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0 ||
        uv_read_start((uv_stream_t *)&c->tcp, m_alloc, m_read) != 0)
        uv_close((uv_handle_t *)&c->tcp, conn_closed);
}

int ddpd_metrics_start(ddpd_t *d, ddp_errinfo_t *ei)
{
    (void)ei;
    if (!d->cfg.metrics[0]) return 0;
    char host[256];
    int port;
    if (ddpd_split_hostport(d->cfg.metrics, host, sizeof host, &port) != 0) return DDP_EINVAL;
    struct sockaddr_storage sa;
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&sa) != 0 &&
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&sa) != 0) {
        DDP_WARN("metrics: bad address %s", d->cfg.metrics);
        return 0;
    }
    ddpd_metrics_t *m = ddp_calloc(1, sizeof *m);
    if (!m) return DDP_ENOMEM;
    d->metrics = m;
    uv_tcp_init(d->loop, &m->listener);
    m->listener.data = d;
    int rc = uv_tcp_bind(&m->listener, (struct sockaddr *)&sa, 0);
    if (rc == 0) rc = uv_listen((uv_stream_t *)&m->listener, 64, m_conn);
    if (rc != 0) {
        DDP_WARN("metrics: cannot listen on %s: %s (metrics off)", d->cfg.metrics,
                 uv_strerror(rc));
        ddpd_metrics_close(d);
        return 0;
    }
    if (port == 0) {
        struct sockaddr_storage got;
        int gl = sizeof got;
        uv_tcp_getsockname(&m->listener, (struct sockaddr *)&got, &gl);
        port = ntohs(((struct sockaddr_in *)&got)->sin_port);
        snprintf(d->cfg.metrics, sizeof d->cfg.metrics, "%.200s:%d", host, port);
    }
    DDP_INFO("metrics on http://%s/metrics, status page on http://%s/", d->cfg.metrics,
             d->cfg.metrics);
    return 0;
}

static void listener_closed(uv_handle_t *h) { free(h->data); }

void ddpd_metrics_close(ddpd_t *d)
{
    ddpd_metrics_t *m = d->metrics;
    if (!m) return;
    d->metrics = NULL;
    m->listener.data = m;
    uv_close((uv_handle_t *)&m->listener, listener_closed);
}
