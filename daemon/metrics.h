/* Prometheus text exposition of the daemon's counters and gauges (served at /metrics on the
 * `metrics` port by http.c). Loop thread only.
 */
#ifndef DDPD_METRICS_H
#define DDPD_METRICS_H

#include "daemon/ddpd.h"

/* The exposition text (new string, caller frees; NULL when out of memory). */
char *ddpd_metrics_text(ddpd_t *d);

#endif
