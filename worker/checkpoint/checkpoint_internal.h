/* Directory helpers shared by checkpoint.c (saving) and checkpoint_load.c; not public. */
#ifndef DDP_WORKER_CHECKPOINT_CHECKPOINT_INTERNAL_H
#define DDP_WORKER_CHECKPOINT_CHECKPOINT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define DDP__CKPT_STEP_FMT "step-%08lld"
#define DDP__CKPT_TMP_FMT ".step-%08lld.tmp"
#define DDP__CKPT_PART_FMT ".part-%05d.json"

#define FILE_NAME_MAX 64 /* the longest file name a checkpoint directory holds, NUL included */

/* Parses "step-<digits>" (the whole name); returns the step or -1. */
int64_t ddp__ckpt_parse_step(const char *name);

/* Steps of all step-* directories under dir, ascending, ddp_malloc'd into *steps (free it; NULL
 * when *n == 0). Returns 0, -errno, DDP_ENOMEM. */
int ddp__ckpt_list_steps(const char *dir, int64_t **steps, size_t *n);

/* Removes dir/name and the plain files in it (checkpoint directories are flat). Returns 0 or
 * -errno (a missing directory is 0). */
int ddp__ckpt_rmdir(const char *dir, const char *name);

/* mkdir -p. Returns 0 or -errno (ei names the path). */
int ddp__ckpt_mkdirs(const char *path, ddp_errinfo_t *ei);

/* Reads a whole small file into a ddp_malloc'd NUL-terminated string. Returns 0, -errno,
 * DDP_ENOMEM, DDP_EFORMAT (larger than max). */
int ddp__ckpt_read_text(const char *path, size_t max, char **out, ddp_errinfo_t *ei);
/* Removes dir's ".step-N.tmp"/".step-N.old" directories (N < below; below < 0: all) left by an
 * interrupted or failed save, and a stale ".latest.tmp" link; a ".step-N.old" without a step-N
 * (a committed step moved aside by a commit that did not finish) is renamed back to step-N
 * instead. Logs each; a removal that fails is logged and left for the next sweep. */
void ddp__ckpt_remove_stale_tmp(const char *dir, int64_t below);
/* Points dir/latest at target atomically (a new link renamed over the old). Returns 0 or -errno
 * with ei naming the link. */
int ddp__ckpt_swap_latest(const char *dir, const char *target, ddp_errinfo_t *ei);

#endif
