/* Start-up recovery after a daemon that stopped or died: jobs it left running are adopted
 * (ddpd_job_adopt: their ranks trained on meanwhile); one that cannot be is marked failed in the
 * store with the reason, and any of its worker processes still alive are ended (found by the
 * job's token in /proc/<pid>/environ, so an unrelated process is never touched); jobs it left
 * queued are queued again. Loop thread, before the API starts.
 */
#ifndef DDPD_RECOVER_H
#define DDPD_RECOVER_H

#include "daemon/ddpd.h"

/* Returns 0 or a store error. Logs what it did. */
int ddpd_recover(ddpd_t *d);

/* Sends sig to every process whose environment holds DDP_JOB_TOKEN=token. Returns how many. */
int ddpd_kill_by_token(const char *token, int sig);

#endif
