/* The daemon's HTTP port: /metrics and the status page (see http.c). Loop thread only. */
#ifndef DDPD_HTTP_H
#define DDPD_HTTP_H

#include <stddef.h>

#include "common/err.h"
#include "daemon/ddpd.h"

typedef enum {
    DDPD_HTTP_STATUS_PAGE = 0, /* GET / or /index.html */
    DDPD_HTTP_METRICS = 1,     /* GET /metrics */
    DDPD_HTTP_NOT_FOUND = 2,   /* GET of any other path: 404 */
    DDPD_HTTP_BAD_METHOD = 3,  /* not a GET: 405 */
} ddpd_http_route_t;

/* The route of the HTTP request in req[0..len) (its request line; a query string is ignored).
 * Pure. */
ddpd_http_route_t ddpd_http_route(const char *req, size_t len);

/* Listens on cfg.metrics when it is set. A port that is taken is a warning, not fatal (the
 * daemon is more useful running without its HTTP port than not running). */
int ddpd_http_start(ddpd_t *d, ddp_errinfo_t *ei);
void ddpd_http_close(ddpd_t *d); /* NULL-safe as to the listener */

#endif
