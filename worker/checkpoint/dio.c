/* O_DIRECT appends with a bounce buffer and a buffered fallback (see dio.h). */
#include "dio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/log.h"

#define SYNC_EVERY (8u << 20) /* buffered mode: start writeback this often */

static int io_err(ddp__dio_t *d, const char *what, uint64_t at, ddp_errinfo_t *ei)
{
    int rc = -errno;
    ddp_errinfo_set(ei, rc, "%s: %s at offset %llu: %s", d->path, what, (unsigned long long)at,
                    strerror(errno));
    ddp_errinfo_path(ei, "%s", d->path);
    if (ei) ei->offset = (long long)at;
    return rc;
}

/* Direct I/O alignment of fd: 0 when the file system does not support O_DIRECT. */
static void dio_align(int fd, size_t *align, size_t *mem_align)
{
    *align = *mem_align = 4096; /* what every Linux file system accepts, when it accepts any */
#ifdef STATX_DIOALIGN
    struct statx sx;
    if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
        *align = sx.stx_dio_offset_align;
        *mem_align = sx.stx_dio_mem_align;
    }
#endif
}

int ddp__dio_open(ddp__dio_t *d, const char *path, bool want_direct, bool overwrite,
                  ddp__uring_t *ring, ddp_errinfo_t *ei)
{
    memset(d, 0, sizeof *d);
    d->path = path;
    d->ring = ring;
    d->fd = -1;
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (overwrite ? 0 : O_TRUNC);
    if (want_direct) d->fd = open(path, flags | O_DIRECT, 0644);
    bool opened_direct = d->fd >= 0;
    if (d->fd < 0 && (!want_direct || errno == EINVAL))
        d->fd = open(path, flags, 0644); /* EINVAL: this file system refuses O_DIRECT */
    if (d->fd < 0) return io_err(d, "cannot create", 0, ei);
    struct stat st; /* overwrite: without the old size a longer old tail would survive close */
    if (overwrite && fstat(d->fd, &st) < 0) {
        int rc = io_err(d, "fstat", 0, ei);
        close(d->fd);
        d->fd = -1;
        return rc;
    }
    if (overwrite) d->old_size = (uint64_t)st.st_size;
    if (opened_direct) {
        dio_align(d->fd, &d->align, &d->mem_align);
        /* the bounce buffer must hold whole aligned blocks; a stranger device is written
         * buffered */
        d->direct = d->align && d->mem_align && d->align <= 4096 && d->mem_align <= 4096 &&
                    !(d->align & (d->align - 1)) && !(d->mem_align & (d->mem_align - 1));
        if (d->direct) d->bounce = ddp_aligned_alloc(4096, DDP__DIO_BOUNCE);
        if (d->direct && !d->bounce) {
            close(d->fd);
            d->fd = -1;
            return ddp_errinfo_set(ei, DDP_ENOMEM, "%s: out of memory", path);
        }
        if (!d->direct) (void)fcntl(d->fd, F_SETFL, fcntl(d->fd, F_GETFL) & ~O_DIRECT);
    }
    return 0;
}

/* Write of all n bytes at d->off: through the ring when p is registered memory (direct mode),
 * else pwrite(2). */
static int write_all(ddp__dio_t *d, const void *p, size_t n, ddp_errinfo_t *ei)
{
    const char *c = p;
    while (n) {
        ssize_t w = d->direct && d->ring ? ddp__uring_pwrite(d->ring, d->fd, c, n, d->off)
                                         : -ENOENT;
        if (w > 0) d->fixed_bytes += (uint64_t)w;
        if (w == -ENOENT) {
            w = pwrite(d->fd, c, n, (off_t)d->off);
            if (w < 0) w = -errno;
        }
        if (w == -EINTR) continue;
        if (w == 0) w = -EIO;
        if (w < 0) {
            errno = (int)-w;
            return io_err(d, "write", d->off, ei);
        }
        c += w;
        n -= (size_t)w;
        d->off += (uint64_t)w;
    }
    if (!d->direct && d->off - d->synced >= SYNC_EVERY) {
        /* Start writeback of what is written so far, so the final fsync waits for little.
         * Failure here is harmless: fsync reports real errors. */
        (void)sync_file_range(d->fd, (off_t)d->synced, (off_t)(d->off - d->synced),
                              SYNC_FILE_RANGE_WRITE);
        d->synced = d->off;
    }
    return 0;
}

/* Leaves direct mode after the kernel refused a direct write (EINVAL); the bounce content is
 * still to be written, now buffered. */
static int go_buffered(ddp__dio_t *d, ddp_errinfo_t *ei)
{
    DDP_DEBUG("%s: O_DIRECT write refused at offset %llu; writing buffered", d->path,
              (unsigned long long)d->off);
    if (fcntl(d->fd, F_SETFL, fcntl(d->fd, F_GETFL) & ~O_DIRECT) < 0)
        return io_err(d, "fcntl", d->off, ei);
    d->direct = 0;
    d->synced = d->off;
    size_t n = d->blen;
    d->blen = 0;
    return write_all(d, d->bounce, n, ei);
}

/* A direct write of p[0..n) (aligned); on EINVAL the rest is written buffered. */
static int write_direct(ddp__dio_t *d, const void *p, size_t n, ddp_errinfo_t *ei)
{
    uint64_t at = d->off;
    int rc = write_all(d, p, n, ei);
    if (rc == -EINVAL) {
        if (ei) ddp_errinfo_clear(ei);
        size_t done = (size_t)(d->off - at);
        DDP_CHECK(go_buffered(d, ei));
        return write_all(d, (const char *)p + done, n - done, ei);
    }
    return rc;
}

static int flush_bounce(ddp__dio_t *d, ddp_errinfo_t *ei)
{
    size_t n = d->blen;
    if (!n) return 0;
    uint64_t at = d->off;
    int rc = write_all(d, d->bounce, n, ei);
    if (rc == -EINVAL) {
        if (ei) ddp_errinfo_clear(ei);
        size_t done = (size_t)(d->off - at);
        memmove(d->bounce, d->bounce + done, n - done);
        d->blen = n - done;
        return go_buffered(d, ei);
    }
    d->blen = 0;
    return rc;
}

int ddp__dio_write(ddp__dio_t *d, const void *p, size_t n, ddp_errinfo_t *ei)
{
    d->size += n;
    const unsigned char *c = p;
    while (n && d->direct) {
        size_t A = d->align;
        if (d->blen % A == 0 && (uintptr_t)c % d->mem_align == 0 && n >= A) {
            DDP_CHECK(flush_bounce(d, ei)); /* whole blocks, if any */
            if (!d->direct) break;
            size_t k = n / A * A;
            DDP_CHECK(write_direct(d, c, k, ei));
            if (d->direct) d->direct_bytes += k;
            c += k;
            n -= k;
            continue;
        }
        /* Through the bounce buffer: up to the next aligned offset (from where the rest may go
         * directly), or as much as fits when the source's phase differs from the file's. */
        size_t room = DDP__DIO_BOUNCE - d->blen;
        size_t k = d->blen % A ? A - d->blen % A : room;
        if (k > n) k = n;
        memcpy(d->bounce + d->blen, c, k);
        d->blen += k;
        c += k;
        n -= k;
        if (d->blen == DDP__DIO_BOUNCE) DDP_CHECK(flush_bounce(d, ei));
    }
    if (n) DDP_CHECK(write_all(d, c, n, ei));
    return 0;
}

int ddp__dio_close(ddp__dio_t *d, int rc, ddp_errinfo_t *ei)
{
    if (rc == 0 && d->blen && d->direct) {
        /* the tail: whole blocks (zero padded), then cut back to the real size */
        size_t real = d->blen, n = (real + d->align - 1) / d->align * d->align;
        memset(d->bounce + real, 0, n - real);
        d->blen = n;
        rc = flush_bounce(d, ei); /* refused: written buffered, padding too; cut below */
    }
    if (rc == 0 && (d->off != d->size || d->old_size > d->size) &&
        ftruncate(d->fd, (off_t)d->size) < 0)
        rc = io_err(d, "ftruncate", d->size, ei);
    if (rc == 0 && fsync(d->fd) < 0) rc = io_err(d, "fsync", d->size, ei);
    if (close(d->fd) < 0 && rc == 0) rc = io_err(d, "close", d->size, ei);
    d->fd = -1;
    free(d->bounce);
    d->bounce = NULL;
    return rc;
}
