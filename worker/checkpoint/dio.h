/* Appending a checkpoint file with O_DIRECT where the file system allows it; not public.
 *
 * Why: a buffered write copies every byte into the page cache, and on a machine whose cores all
 * train that copy (1.5 GB per GPT-2 124M save) is taken from training. With O_DIRECT the device
 * reads the caller's memory itself and the CPU does not touch the bytes (checksums are the
 * caller's). Direct writes need the file offset, the length and the memory address aligned
 * (statx STATX_DIOALIGN says to what;
 * 4096 when the kernel does not say); bytes that are not (a safetensors header, a tensor run
 * whose address has another phase than its file offset, the file's tail) go through a small
 * aligned bounce buffer. The tail is padded to the alignment and the file is then truncated to
 * its exact size, so no trailing byte remains. Where O_DIRECT is refused (tmpfs: EINVAL at
 * open, or at the first write) the file is written with plain buffered writes from the same
 * calls, starting writeback every 8 MiB (sync_file_range) so the final fsync has little left.
 *
 * Direct writes from memory registered with the optional io_uring (uring.h) go through it, which
 * spares the kernel pinning the pages for each write; the rest use pwrite(2).
 *
 * Invariant (direct mode): every write starts at an aligned file offset `off`; the bounce buffer
 * holds the `blen` bytes that follow `off`.
 *
 * Threads: one ddp__dio_t is used by one thread.
 */
#ifndef DDP_WORKER_CHECKPOINT_DIO_H
#define DDP_WORKER_CHECKPOINT_DIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "worker/checkpoint/uring.h"

typedef struct ddp__dio {
    int fd;
    ddp__uring_t *ring;    /* borrowed; NULL: pwrite(2) only */
    const char *path;      /* borrowed; names the file in errors */
    int direct;            /* O_DIRECT in effect */
    size_t align;          /* file offset and length alignment of a direct write */
    size_t mem_align;      /* memory alignment of a direct write */
    unsigned char *bounce; /* ddp_aligned_alloc'd, DDP__DIO_BOUNCE bytes */
    size_t blen;           /* bytes waiting in the bounce buffer */
    uint64_t off;          /* file offset of the next write(2) */
    uint64_t size;         /* bytes appended so far (the file's final size) */
    uint64_t old_size;     /* overwrite mode: the size at open; past `size` it is cut at close */
    uint64_t synced;       /* buffered mode: writeback started up to here */
    uint64_t direct_bytes; /* of them written straight from the caller's memory */
    uint64_t fixed_bytes;  /* of those, written from io_uring-registered memory */
} ddp__dio_t;

#define DDP__DIO_BOUNCE (4u << 20)

/* Creates or truncates `path` (0644), with O_DIRECT when `want_direct` and the file system
 * supports it; direct writes from memory registered with `ring` (may be NULL) go through it.
 * With `overwrite` an existing file is not truncated: its blocks are written over in place (no
 * block allocation, no unwritten extents to convert) and whatever lies past the new end is cut
 * at close. Returns 0, -errno (ei names the file), DDP_ENOMEM. */
int ddp__dio_open(ddp__dio_t *d, const char *path, bool want_direct, bool overwrite,
                  ddp__uring_t *ring, ddp_errinfo_t *ei);

/* Appends p[0..n). Reads p only during the call. Returns 0 or
 * -errno (ei names the file and the offset). */
int ddp__dio_write(ddp__dio_t *d, const void *p, size_t n, ddp_errinfo_t *ei);

/* Writes what the bounce buffer holds (padded, then truncated to the exact size), fsyncs and
 * closes; with rc != 0 (an earlier error) only closes and returns rc. Frees the bounce buffer
 * either way. Returns 0 or -errno. */
int ddp__dio_close(ddp__dio_t *d, int rc, ddp_errinfo_t *ei);

#endif
