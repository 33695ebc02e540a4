/* Files: durable writes (create, then fsync and close with one error path; every writer of a
 * file that must survive a crash -- token shards, checkpoint shards, manifests -- uses these, so
 * "written" always means fsynced and closed without error) and reading a small file whole (the
 * one reader of specs, trainer.json, config.json and manifests), and the descriptor limit. */
#ifndef DDP_COMMON_FILE_H
#define DDP_COMMON_FILE_H

#include <stddef.h>

#include "common/err.h"

/* Creates or truncates `path` for writing (mode 0644, close-on-exec). Returns the fd, or -errno
 * with ei naming the file. */
int ddp_file_create(const char *path, ddp_errinfo_t *ei);

/* fsyncs and closes fd. `rc` is the writer's result so far: when it is already an error the
 * file is only closed and rc is returned; otherwise returns 0 or the fsync/close -errno with ei
 * naming the file. */
int ddp_file_sync_close(int fd, const char *path, int rc, ddp_errinfo_t *ei);

/* Reads all of `path` (a regular file, or a pipe read to its end) into a NUL-terminated buffer
 * from ddp_malloc: *out, which the caller frees, and *len (may be NULL), the bytes without the
 * NUL. Returns 0; -EFBIG when it holds more than `max` bytes; DDP_ENOMEM; or the open/read
 * -errno (a directory: -EISDIR); -EINVAL for a max of SIZE_MAX / 2 or more. *out is NULL on
 * failure. Blocking; any thread. */
int ddp_file_read(const char *path, size_t max, char **out, size_t *len);

/* Raises this process's soft limit on open descriptors (RLIMIT_NOFILE) to its hard limit, for a
 * process that holds one per client or per file (the daemon's sessions, a trainer's token
 * shards: a dataset of thousands of shards passes the usual soft limit of 1,024). Failure
 * changes nothing and is logged at debug level. */
void ddp_file_raise_fd_limit(void);

#endif
