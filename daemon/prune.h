/* Pruning old run directories (opt-in: ddpd.yaml runs_keep_days, 0 = never, the default).
 *
 * Once an hour (and at start) the run directories of this daemon's jobs that ended more than
 * runs_keep_days ago are removed, on libuv's thread pool. The store keeps their records; only
 * the files go. A run directory is the user's: its contents are removed relative to directory
 * descriptors (openat with O_NOFOLLOW, unlinkat), never through a path and never following a
 * symlink, and not across filesystems, so a link or a mount the user left there leads nowhere.
 * Peers' ranks' directories (<coordinator>-job-N) are not pruned: no record here says when
 * their jobs ended. Loop thread only (but for the removal itself).
 */
#ifndef DDPD_PRUNE_H
#define DDPD_PRUNE_H

#include <sys/types.h>

#include "daemon/ddpd.h"

/* Starts the hourly pass when cfg.runs_keep_days > 0. */
void ddpd_prune_start(ddpd_t *d);
/* Stops it (a pass on the pool finishes first). NULL-safe as to a daemon that never started. */
void ddpd_prune_close(ddpd_t *d);

/* Removes everything in directory dirfd and then `name` in parentfd (the directory itself),
 * never following a symlink and not leaving device `dev`. Returns 0, or the first -errno of an
 * entry it could not remove (it goes on with the others). Any thread. */
int ddpd_prune_tree(int parentfd, const char *name, dev_t dev);

#endif
