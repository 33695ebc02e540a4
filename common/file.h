/* Durable files: create, then fsync and close with one error path. Every writer of a file that
 * must survive a crash (token shards, checkpoint shards, manifests) uses these, so "written"
 * always means fsynced and closed without error. */
#ifndef DDP_COMMON_FILE_H
#define DDP_COMMON_FILE_H

#include "common/err.h"

/* Creates or truncates `path` for writing (mode 0644, close-on-exec). Returns the fd, or -errno
 * with ei naming the file. */
int ddp_file_create(const char *path, ddp_errinfo_t *ei);

/* fsyncs and closes fd. `rc` is the writer's result so far: when it is already an error the
 * file is only closed and rc is returned; otherwise returns 0 or the fsync/close -errno with ei
 * naming the file. */
int ddp_file_sync_close(int fd, const char *path, int rc, ddp_errinfo_t *ei);

#endif
