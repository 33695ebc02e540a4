/* ddpctl's exit codes, its error printing, and following a job (ctl_watch.c); used by the
 * commands (ctl.c, ctl_plot.c, ctl_trace.c). */
#ifndef DDPD_CTL_WATCH_H
#define DDPD_CTL_WATCH_H

#include <jansson.h>

#include "daemon/client.h"

enum { CTL_OK = 0, CTL_JOB_FAILED = 1, CTL_JOB_CANCELLED = 2, CTL_USAGE = 64,
       CTL_UNAVAILABLE = 69, CTL_ERROR = 70 };

/* Follows job `id` on c (job.watch) until it ends, drawing a live line on a terminal and
 * plain lines otherwise (or JSON lines with as_json). Sends job.cancel on the first SIGINT when
 * cancel_on_int is set. Returns CTL_OK / CTL_JOB_FAILED / CTL_JOB_CANCELLED, or CTL_ERROR. */
int ddpctl_follow(ddpd_client_t *c, const char *socket_path, long long id, int as_json,
                  int cancel_on_int);

/* Prints a JSON-RPC error object to stderr as "ddpctl: message (code N)" plus its data. */
void ddpctl_print_error(json_t *err);

#endif
