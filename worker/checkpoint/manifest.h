/* MANIFEST.json: the list of a checkpoint's files with their sizes and CRC32C checksums.
 *
 * It is written last, after every file it lists is durable; a checkpoint directory without a
 * manifest, or whose files do not match it, is not a checkpoint. Format (version 1):
 *
 *   {"format": "ddpd-checkpoint", "version": 1, "step": 1200, "checksum": "crc32c",
 *    "files": {"config.json": {"size": 714, "crc32c": "1a2b3c4d"}, ...}}
 *
 * File names are plain names inside the checkpoint directory (no '/', not "." or ".."), so a
 * hostile manifest cannot make a verifier read outside it. The same format, with a partial file
 * list, is used for the per-rank part files of striped writers (".part-00001.json").
 */
#ifndef DDP_WORKER_CHECKPOINT_MANIFEST_H
#define DDP_WORKER_CHECKPOINT_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

#define DDP_MANIFEST_NAME "MANIFEST.json"
#define DDP_MANIFEST_MAX_NAME 255

typedef struct ddp_manifest_entry {
    char name[DDP_MANIFEST_MAX_NAME + 1];
    uint64_t size;
    uint32_t crc32c;
} ddp_manifest_entry_t;

/* Caller-owned; zero-initialise or ddp_manifest_init, release with ddp_manifest_close. */
typedef struct ddp_manifest {
    int64_t step;
    size_t n, cap;
    ddp_manifest_entry_t *e;
} ddp_manifest_t;

/* Empties m for `step`. */
void ddp_manifest_init(ddp_manifest_t *m, int64_t step);
/* Frees the entries; m may be reused after ddp_manifest_init. NULL-safe. */
void ddp_manifest_close(ddp_manifest_t *m);

/* Appends (or, for a name already present, replaces) an entry. Returns 0, DDP_EINVAL for a name
 * that is not a plain file name, DDP_ENOMEM. One thread per manifest. */
int ddp_manifest_add(ddp_manifest_t *m, const char *name, uint64_t size, uint32_t crc32c);
/* Entry by name or NULL. */
const ddp_manifest_entry_t *ddp_manifest_find(const ddp_manifest_t *m, const char *name);

/* Writes m as `dir`/`name` (create or replace), fsyncs it and, when `sync_dir`, the directory.
 * Returns 0 or a negative error with ei naming the file. Any thread. */
int ddp_manifest_write(const ddp_manifest_t *m, const char *dir, const char *name, int sync_dir,
                       ddp_errinfo_t *ei);

/* Reads and validates `path` into m (initialised by the call; close it even on error). Returns
 * 0, -errno (-ENOENT when missing), DDP_EFORMAT with ei naming the file and the problem, or
 * DDP_ENOMEM. Any thread. */
int ddp_manifest_read(const char *path, ddp_manifest_t *m, ddp_errinfo_t *ei);

/* Size and CRC32C of a whole file, read with pread through a small buffer (so it costs no
 * resident memory). Returns 0 or -errno / DDP_ENOMEM with ei naming the file. Any thread. */
int ddp_file_crc32c(const char *path, uint64_t *size, uint32_t *crc32c, ddp_errinfo_t *ei);

/* Verifies checkpoint directory `dir`: reads its MANIFEST.json and checks every listed file's
 * size, then its checksum (sizes of all first, so a truncation is found without reading data).
 * When m is not NULL it receives the manifest (close it). Returns 0; -ENOENT ("MANIFEST.json
 * missing"); DDP_EFORMAT (unreadable manifest, a listed file missing or of the wrong size);
 * DDP_ECHECKSUM (content differs); ei names the file. Any thread. */
int ddp_manifest_verify(const char *dir, ddp_manifest_t *m, ddp_errinfo_t *ei);

#endif
