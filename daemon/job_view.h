/* The live view of an active job for job.get/job.watch and the status page. Loop thread only. */
#ifndef DDPD_JOB_VIEW_H
#define DDPD_JOB_VIEW_H

#include <jansson.h>

#include "daemon/job.h"

/* New object: id, name, state, reason, world, steps; with step, loss, tokens_per_s, mfu, straggler,
 * eta_s and the last step's record ("metrics") once there is one, and "done" at the end. */
json_t *ddpd_job_progress(const ddpd_job_t *j);

#endif
