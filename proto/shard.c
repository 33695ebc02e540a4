/* Token shards in llm.c's format, 16 or 32-bit tokens: open (validate), read (pread), write
 * (atomic), glob (sorted).
 *
 * Invariants: an open shard holds the file open read-only, its header checked against its size:
 * exactly n_tokens tokens of token_bytes each follow the 1 KiB header. Reads are pread() calls,
 * not a mapping: a trainer samples windows all over a dataset, and every page of a mapping it
 * touched would stay in its resident set (a fault maps the pages around it too, up to a large
 * folio: giving a window's own pages back after each read kept 2.7 of a 4.8 MB shard resident),
 * so RSS would grow towards the dataset's size. pread's copy is a few KiB per sequence. A shard
 * is written under `path`.tmp, fsynced, renamed over `path`, and the directory is fsynced, so a
 * reader sees the old file or the complete new one, never half of one. Shards are little-endian
 * on disk and read as they are, so this code assumes a little-endian host (checked at build).
 */
#include "proto/shard.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <libgen.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/file.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "shards are read as stored: LE only");

/* Adds where an error is to ei (NULL-safe): the shard's path and the byte offset (-1: none).
 * Returns rc. */
static int located(ddp_errinfo_t *ei, const char *path, long long offset, int rc)
{
    ddp_errinfo_path(ei, "%s", path);
    if (ei) ei->offset = offset;
    return rc;
}

/* ddp_errinfo_set's message, then where it is (the arguments run first). */
#define SHARD_ERROR(ei, rc, path, offset, ...)                                               \
    located((ei), (path), (offset), ddp_errinfo_set((ei), (rc), __VA_ARGS__))

/* Reads bytes at offset `at` of s in full. Returns 0, or -errno / DDP_EFORMAT (end of file) with
 * ei naming the file and the offset. */
static int read_at(const ddp_shard_t *s, void *buf, size_t bytes, off_t at, ddp_errinfo_t *ei)
{
    for (size_t done = 0; done < bytes;) {
        ssize_t r = pread(s->fd, (char *)buf + done, bytes - done, at + (off_t)done);
        int e = errno;
        if (r < 0 && e == EINTR) continue;
        if (r < 0)
            return SHARD_ERROR(ei, -e, s->path, (long long)(at + (off_t)done),
                               "cannot read the token shard: %s", strerror(e));
        if (r == 0)
            return SHARD_ERROR(ei, DDP_EFORMAT, s->path, (long long)(at + (off_t)done),
                               "cannot read the token shard: the file is shorter than when "
                               "opened");
        done += (size_t)r;
    }
    return 0;
}

int ddp_shard_open(ddp_shard_t *s, const char *path, ddp_errinfo_t *ei)
{
    memset(s, 0, sizeof *s);
    if (strlen(path) >= sizeof s->path)
        return SHARD_ERROR(ei, DDP_EINVAL, path, -1, "path longer than %zu bytes",
                           sizeof s->path - 1);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int rc = -errno;
        return SHARD_ERROR(ei, rc, path, -1, "cannot open token shard: %s", strerror(errno));
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int rc = -errno;
        close(fd);
        return SHARD_ERROR(ei, rc, path, -1, "cannot stat token shard: %s", strerror(-rc));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return SHARD_ERROR(ei, DDP_EFORMAT, path, -1, "not a regular file");
    }
    size_t size = (size_t)st.st_size;
    if (size < DDP_SHARD_HEADER_BYTES) {
        close(fd);
        return SHARD_ERROR(ei, DDP_EFORMAT, path, (long long)size,
                           "truncated token shard: %zu bytes, shorter than the %d-byte header",
                           size, DDP_SHARD_HEADER_BYTES);
    }
    int32_t h[3];
    s->fd = fd;
    snprintf(s->path, sizeof s->path, "%s", path);
    int rc = read_at(s, h, sizeof h, 0, ei);
    if (rc) {
        ddp_shard_close(s);
        return rc;
    }

    int width = 0;
    if (h[0] == DDP_SHARD_MAGIC) width = 2;
    else if (h[0] == DDP_SHARD32_MAGIC) width = 4;
    int want_version = width == 4 ? DDP_SHARD32_VERSION : DDP_SHARD_VERSION;
    if (!width) {
        rc = SHARD_ERROR(ei, DDP_EFORMAT, path, 0,
                         "not a token shard: magic is %d (0x%08x), expected %d (uint16 tokens) "
                         "or %d (uint32 tokens; llm.c format)",
                         h[0], (unsigned)h[0], DDP_SHARD_MAGIC, DDP_SHARD32_MAGIC);
    } else if (h[1] != want_version) {
        rc = SHARD_ERROR(ei, DDP_EFORMAT, path, 4,
                         "unsupported token shard version %d for magic %d (supported: %d)",
                         h[1], h[0], want_version);
    } else if (h[2] < 0) {
        rc = SHARD_ERROR(ei, DDP_EFORMAT, path, 8, "negative token count %d in the header",
                         h[2]);
    } else {
        size_t want = DDP_SHARD_HEADER_BYTES + (size_t)h[2] * (size_t)width;
        /* The one mislabelling the size can tell: tokens of the other width. */
        size_t other = DDP_SHARD_HEADER_BYTES + (size_t)h[2] * (size_t)(6 - width);
        if (want != size)
            rc = SHARD_ERROR(ei, DDP_EFORMAT, path, (long long)(size < want ? size : want),
                             "%s token shard: header says %d %d-byte tokens, so %zu bytes "
                             "expected, but the file has %zu bytes%s",
                             size < want ? "truncated" : "oversized", h[2], width, want, size,
                             h[2] > 0 && size == other
                                 ? (width == 2 ? " (32-bit tokens labelled 16-bit?)"
                                               : " (16-bit tokens labelled 32-bit?)")
                                 : "");
    }
    if (rc) {
        ddp_shard_close(s);
        return rc;
    }
    s->n_tokens = (size_t)h[2];
    s->token_bytes = width;
    return 0;
}

int ddp_shard_read(const ddp_shard_t *s, size_t first, size_t n, uint32_t *out, ddp_errinfo_t *ei)
{
    off_t at = DDP_SHARD_HEADER_BYTES + (off_t)(first * (size_t)s->token_bytes);
    if (s->token_bytes == 4) return read_at(s, out, n * 4, at, ei);
    uint16_t narrow[2048]; /* 16-bit tokens are widened chunk by chunk */
    for (size_t i = 0; i < n; i += 2048) {
        size_t m = n - i < 2048 ? n - i : 2048;
        DDP_CHECK(read_at(s, narrow, m * 2, at + (off_t)(i * 2), ei));
        for (size_t j = 0; j < m; j++) out[i + j] = narrow[j];
    }
    return 0;
}

void ddp_shard_close(ddp_shard_t *s)
{
    if (!s) return;
    if (s->path[0]) close(s->fd);
    memset(s, 0, sizeof *s);
}

static int write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/* fsync the directory holding path, so a rename in it is durable. */
static int fsync_parent(const char *path)
{
    char *copy = ddp_strdup(path);
    if (!copy) return DDP_ENOMEM;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(copy);
    if (fd < 0) return -errno;
    int rc = fsync(fd) < 0 ? -errno : 0;
    close(fd);
    return rc;
}

/* Writes header + body to path.tmp, fsyncs, renames over path, fsyncs the directory. */
static int write_shard(const char *path, int32_t magic, int32_t version, const void *tokens,
                       size_t n_tokens, size_t width)
{
    if (n_tokens > INT32_MAX) return DDP_EINVAL;
    size_t plen = strlen(path);
    char *tmp = ddp_malloc(plen + 5);
    if (!tmp) return DDP_ENOMEM;
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);

    int32_t header[DDP_SHARD_HEADER_INTS] = {0};
    header[0] = magic;
    header[1] = version;
    header[2] = (int32_t)n_tokens;

    int fd = ddp_file_create(tmp, NULL);
    int rc = fd < 0 ? fd : 0;
    if (rc == 0) {
        rc = write_all(fd, header, sizeof header);
        if (rc == 0 && n_tokens) rc = write_all(fd, tokens, n_tokens * width);
        rc = ddp_file_sync_close(fd, tmp, rc, NULL);
        if (rc == 0 && rename(tmp, path) < 0) rc = -errno;
        if (rc == 0) rc = fsync_parent(path);
        else unlink(tmp);
    }
    free(tmp);
    return rc;
}

int ddp_shard_write(const char *path, const uint16_t *tokens, size_t n_tokens)
{
    return write_shard(path, DDP_SHARD_MAGIC, DDP_SHARD_VERSION, tokens, n_tokens, 2);
}

int ddp_shard_write32(const char *path, const uint32_t *tokens, size_t n_tokens)
{
    return write_shard(path, DDP_SHARD32_MAGIC, DDP_SHARD32_VERSION, tokens, n_tokens, 4);
}

int ddp_shard_glob(const char *pattern, char ***paths, size_t *count, ddp_errinfo_t *ei)
{
    *paths = NULL;
    *count = 0;
    glob_t g;
    int grc = glob(pattern, GLOB_ERR, NULL, &g);
    if (grc == GLOB_NOMATCH || (grc == 0 && g.gl_pathc == 0)) {
        if (grc == 0) globfree(&g);
        ddp_errinfo_set(ei, DDP_ENOTFOUND, "no token shards match the pattern");
        ddp_errinfo_path(ei, "%s", pattern);
        return DDP_ENOTFOUND;
    }
    if (grc != 0) {
        int rc = grc == GLOB_NOSPACE ? DDP_ENOMEM : DDP_EIO;
        ddp_errinfo_set(ei, rc, "cannot expand the pattern (%s)",
                        grc == GLOB_NOSPACE ? "out of memory" : "read error");
        ddp_errinfo_path(ei, "%s", pattern);
        return rc;
    }
    char **out = ddp_calloc(g.gl_pathc, sizeof *out);
    if (!out) {
        globfree(&g);
        return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    }
    for (size_t i = 0; i < g.gl_pathc; i++) {
        if (!(out[i] = ddp_strdup(g.gl_pathv[i]))) {
            ddp_shard_glob_free(out, i);
            globfree(&g);
            return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
        }
    }
    /* glob's order follows the locale; sort bytewise so every host agrees. */
    for (size_t i = 1; i < g.gl_pathc; i++)
        for (size_t j = i; j > 0 && strcmp(out[j - 1], out[j]) > 0; j--) {
            char *t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    *paths = out;
    *count = g.gl_pathc;
    globfree(&g);
    return 0;
}

void ddp_shard_glob_free(char **paths, size_t count)
{
    if (!paths) return;
    for (size_t i = 0; i < count; i++) free(paths[i]);
    free(paths);
}
