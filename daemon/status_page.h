/* The status page: GET / on the metrics port (config `metrics`, 127.0.0.1:9464 by default)
 * answers a self-refreshing HTML page with the newest jobs (state, ranks, progress, loss,
 * tokens/s, ETA) and, for each active job, its live loss curve as inline SVG drawn from the
 * tail of rank 0's metrics.jsonl. Loop thread only.
 */
#ifndef DDPD_STATUS_PAGE_H
#define DDPD_STATUS_PAGE_H

#include <stddef.h>

#include "daemon/ddpd.h"

/* The page (new NUL-terminated string, caller frees; NULL when out of memory). Reads the store
 * and, per active job, at most the last 1 MiB of its metrics.jsonl (blocking file reads, bounded
 * so a page costs the same at step 10 and at step 100000). */
char *ddpd_status_page_html(ddpd_t *d);

#endif
