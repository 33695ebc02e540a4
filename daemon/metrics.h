/* Prometheus text exposition on a loopback TCP port (config `metrics`, default
 * 127.0.0.1:9464): any HTTP GET gets the current counters and gauges, then the connection
 * closes. Loop thread only.
 */
#ifndef DDPD_METRICS_H
#define DDPD_METRICS_H

#include "common/err.h"
#include "daemon/ddpd.h"

/* Starts the listener when cfg.metrics is set. A port that is taken is a warning, not fatal
 * (the daemon is more useful running without metrics than not running). */
int ddpd_metrics_start(ddpd_t *d, ddp_errinfo_t *ei);
void ddpd_metrics_close(ddpd_t *d);
/* The exposition text (new string, caller frees). */
char *ddpd_metrics_text(ddpd_t *d);

#endif
