/* The daemon's HTTP port (config `metrics`, 127.0.0.1:9464 by default): a tiny HTTP/1.0
 * responder that routes by path. GET /metrics: the Prometheus text (metrics.c); GET / (also
 * /index.html, any query string): the status page (status_page.c); any other path 404, any
 * other method 405. A request is read up to the end of its headers (8 KiB at most, or the
 * connection is dropped) and answered with one body, then the connection closes.
 * Bounded: a connection has IDLE_MS in all to send its request and take the answer, and at
 * most MAX_CONNS are open at once (more are accepted and closed at once), so idle connections
 * cannot hold the daemon's descriptors. Every answer carries headers that keep browsers from
 * caching it, sniffing its type, framing it or running anything in it.
 * Loop thread.
 */
#include "daemon/http.h"

#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/log.h"
#include "daemon/config.h"
#include "daemon/metrics.h"
#include "daemon/status_page.h"

enum { IDLE_MS = 10000, MAX_CONNS = 64 };

typedef struct hconn {
    uv_tcp_t tcp;
    uv_timer_t idle; /* closes a connection that takes longer than IDLE_MS */
    ddpd_t *d;
    struct ddpd_http *http;
    struct hconn *next;
    int handles;     /* tcp + idle: freed when both are closed */
    char buf[8192];
    size_t len;
    int answered, closing;
    char *resp; /* the response, kept until its write completes */
} hconn_t;

struct ddpd_http {
    uv_tcp_t listener;
    hconn_t *list; /* open connections */
    int conns;
    int refs;      /* the listener and each connection: freed at 0 */
};

static void http_unref(ddpd_http_t *m)
{
    if (--m->refs == 0) free(m);
}

ddpd_http_route_t ddpd_http_route(const char *req, size_t len)
{
    size_t m = 0;
    while (m < len && req[m] != ' ') m++;
    if (m != 3 || m >= len || memcmp(req, "GET", 3) != 0) return DDPD_HTTP_BAD_METHOD;
    const char *path = req + 4, *end = path;
    while (end < req + len && *end != ' ' && *end != '?' && *end != '\r' && *end != '\n') end++;
    size_t n = (size_t)(end - path);
    if (path >= req + len) return DDPD_HTTP_NOT_FOUND;
    if ((n == 1 && path[0] == '/') || (n == 11 && !memcmp(path, "/index.html", 11)))
        return DDPD_HTTP_STATUS_PAGE;
    if (n == 8 && !memcmp(path, "/metrics", 8)) return DDPD_HTTP_METRICS;
    return DDPD_HTTP_NOT_FOUND;
}

static void conn_closed(uv_handle_t *h)
{
    hconn_t *c = h->data;
    if (--c->handles > 0) return;
    ddpd_http_t *m = c->http;
    for (hconn_t **pp = &m->list; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    m->conns--;
    free(c->resp);
    free(c);
    http_unref(m);
}

static void conn_close(hconn_t *c)
{
    if (c->closing) return;
    c->closing = 1;
    uv_close((uv_handle_t *)&c->tcp, conn_closed);
    uv_close((uv_handle_t *)&c->idle, conn_closed);
}

static void idle_cb(uv_timer_t *t) { conn_close(t->data); }

static void wrote(uv_write_t *req, int status)
{
    (void)status;
    hconn_t *c = req->data;
    free(req);
    conn_close(c);
}

static void m_alloc(uv_handle_t *h, size_t sz, uv_buf_t *buf)
{
    (void)sz;
    hconn_t *c = h->data;
    buf->base = c->buf + c->len;
    buf->len = sizeof c->buf - c->len;
}

static void m_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf)
{
    (void)buf;
    hconn_t *c = st->data;
    if (c->answered) return;
    if (n < 0 || (n == 0 && c->len == sizeof c->buf)) {
        conn_close(c);
        return;
    }
    c->len += (size_t)n;
    if (!memmem(c->buf, c->len, "\r\n\r\n", 4) && !memmem(c->buf, c->len, "\n\n", 2)) {
        if (c->len == sizeof c->buf) conn_close(c);
        return;
    }
    c->answered = 1;
    uv_read_stop(st);
    ddpd_http_route_t route = ddpd_http_route(c->buf, c->len);
    char *body = route == DDPD_HTTP_STATUS_PAGE ? ddpd_status_page_html(c->d)
                 : route == DDPD_HTTP_METRICS   ? ddpd_metrics_text(c->d)
                 : route == DDPD_HTTP_NOT_FOUND
                     ? ddp_strdup("not found: GET /metrics (Prometheus) or / (status page)\n")
                     : ddp_strdup("method not allowed: GET only\n");
    size_t bl = body ? strlen(body) : 0;
    char *resp = ddp_malloc(bl + 1024);
    uv_write_t *req = ddp_malloc(sizeof *req);
    if (!resp || !req) {
        free(body);
        free(resp);
        free(req);
        conn_close(c);
        return;
    }
    static const char *const status[] = {"200 OK", "200 OK", "404 Not Found",
                                         "405 Method Not Allowed"};
    int hl = snprintf(resp, 1024,
                      "HTTP/1.0 %s\r\nContent-Type: %s\r\n"
                      "Content-Length: %zu\r\nConnection: close\r\n"
                      "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
                      "Content-Security-Policy: default-src 'none'; style-src 'unsafe-inline'; "
                      "frame-ancestors 'none'\r\nX-Frame-Options: DENY\r\n"
                      "Referrer-Policy: no-referrer\r\n\r\n",
                      status[route],
                      route == DDPD_HTTP_STATUS_PAGE ? "text/html; charset=utf-8"
                      : route == DDPD_HTTP_METRICS   ? "text/plain; version=0.0.4"
                                                     : "text/plain",
                      bl);
    if (bl) memcpy(resp + hl, body, bl);
    free(body);
    c->resp = resp;
    uv_buf_t ub = uv_buf_init(resp, (unsigned)(hl + (int)bl));
    req->data = c;
    c->len = 0;
    if (uv_write(req, st, &ub, 1, wrote) != 0) {
        free(req);
        conn_close(c);
    }
}

static void m_conn(uv_stream_t *server, int status)
{
    ddpd_t *d = server->data;
    if (status < 0) return;
    hconn_t *c = ddp_calloc(1, sizeof *c);
    if (!c) return;
    ddpd_http_t *m = d->http;
    c->d = d;
    c->http = m;
    c->handles = 2;
    c->next = m->list;
    m->list = c;
    m->conns++;
    m->refs++;
    uv_tcp_init(d->loop, &c->tcp);
    uv_timer_init(d->loop, &c->idle);
    c->tcp.data = c->idle.data = c;
    /* over MAX_CONNS: accepted (or it would wait in the backlog) and closed at once */
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0 || m->conns > MAX_CONNS ||
        uv_read_start((uv_stream_t *)&c->tcp, m_alloc, m_read) != 0) {
        conn_close(c);
        return;
    }
    uv_timer_start(&c->idle, idle_cb, IDLE_MS, 0);
}

int ddpd_http_start(ddpd_t *d, ddp_errinfo_t *ei)
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
    ddpd_http_t *m = ddp_calloc(1, sizeof *m);
    if (!m) return DDP_ENOMEM;
    m->refs = 1;
    d->http = m;
    uv_tcp_init(d->loop, &m->listener);
    m->listener.data = d;
    int rc = uv_tcp_bind(&m->listener, (struct sockaddr *)&sa, 0);
    if (rc == 0) rc = uv_listen((uv_stream_t *)&m->listener, 64, m_conn);
    if (rc != 0) {
        DDP_WARN("metrics: cannot listen on %s: %s (metrics off)", d->cfg.metrics,
                 uv_strerror(rc));
        ddpd_http_close(d);
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

static void listener_closed(uv_handle_t *h) { http_unref(h->data); }

void ddpd_http_close(ddpd_t *d)
{
    ddpd_http_t *m = d->http;
    if (!m) return;
    d->http = NULL;
    for (hconn_t *c = m->list; c; c = c->next) conn_close(c);
    m->listener.data = m;
    uv_close((uv_handle_t *)&m->listener, listener_closed);
}
