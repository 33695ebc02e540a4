/* Durable-file helpers shared by manifest.c and checkpoint*.c; not part of the public API. */
#ifndef DDP_WORKER_CHECKPOINT_MANIFEST_INTERNAL_H
#define DDP_WORKER_CHECKPOINT_MANIFEST_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* fsync of a file or directory by path. Returns 0 or -errno (ei names it). Any thread. */
int ddp__fsync_path(const char *path, ddp_errinfo_t *ei);

/* Creates or replaces dir/name with data[0..len), fsyncs and closes it; *crc (when not NULL)
 * gets the CRC32C of the bytes. Returns 0 or -errno (ei names the file). Any thread. */
int ddp__write_durable(const char *dir, const char *name, const void *data, size_t len,
                       uint32_t *crc, ddp_errinfo_t *ei);

#endif
