/* The control API's methods (methods.c): what each request does, and the job.logs / job.watch
 * streams. Called by api.c; they answer through session.h. Loop thread only.
 */
#ifndef DDPD_METHODS_H
#define DDPD_METHODS_H

#include <jansson.h>

#include "daemon/session.h"

/* Runs one request (params may be NULL). */
void ddpd__dispatch(ddpd_session_t *s, json_t *id, const char *method, json_t *params);
/* Advances a session's log streams (from the tick timer and right after job.logs). */
void ddpd__service_logs(ddpd_session_t *s);
/* Forwards a job event to the session's watch streams. */
void ddpd__watch_event(ddpd_session_t *s, ddpd_job_t *j);

#endif
