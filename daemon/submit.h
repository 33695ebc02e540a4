/* job.submit (submit.c): the spec read and parsed off the loop thread, then the job accepted.
 * Called by methods.c with the request's params already type-checked. Loop thread only.
 */
#ifndef DDPD_SUBMIT_H
#define DDPD_SUBMIT_H

#include <jansson.h>

#include "daemon/session.h"

/* Starts a submission: exactly one of path (a file, relative to cwd when not absolute) and spec
 * (a string of YAML or JSON, or an object) is set; name is a valid job name or NULL; workers 0
 * or the override. The reply to `id` (borrowed) comes later, once the spec is parsed, unless
 * the session has closed by then. */
void ddpd__submit(ddpd_session_t *s, json_t *id, const char *path, const char *cwd,
                  const char *name, const char *origin, int workers, json_t *spec);

#endif
