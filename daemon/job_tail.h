/* A running job's view from the tail of rank 0's metrics.jsonl: the last step's record, the
 * "done" event, and the progress object job.get/job.watch show. Reads the file from
 * j->metrics_off on; never writes. Loop thread only.
 */
#ifndef DDPD_JOB_TAIL_H
#define DDPD_JOB_TAIL_H

#include <jansson.h>

#include "daemon/job.h"

/* Reads what rank 0 appended since the last call (at most 64 KiB a call). Returns 1 if a new
 * line was parsed. */
int ddpd_job_tail_read(ddpd_job_t *j);

/* Starts the tail near the end of the file (an adopted job: the last step's record is all the
 * view needs) and reads to the end. */
void ddpd_job_tail_from_end(ddpd_job_t *j);

/* Live view of an active job for job.get/job.watch (new object; state, progress, eta_s). */
json_t *ddpd_job_progress(const ddpd_job_t *j);

#endif
