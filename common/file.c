/* Durable writes and whole-file reads (see file.h). */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/log.h"

int ddp_file_create(const char *path, ddp_errinfo_t *ei)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) return fd;
    int rc = -errno;
    ddp_errinfo_set(ei, rc, "%s: cannot create: %s", path, strerror(errno));
    ddp_errinfo_path(ei, "%s", path);
    return rc;
}

int ddp_file_sync_close(int fd, const char *path, int rc, ddp_errinfo_t *ei)
{
    if (rc == 0 && fsync(fd) < 0) {
        rc = -errno;
        ddp_errinfo_set(ei, rc, "%s: fsync: %s", path, strerror(errno));
    }
    if (close(fd) < 0 && rc == 0) {
        rc = -errno;
        ddp_errinfo_set(ei, rc, "%s: close: %s", path, strerror(errno));
    }
    return rc;
}

int ddp_file_read(const char *path, size_t max, char **out, size_t *len)
{
    *out = NULL;
    if (len) *len = 0;
    if (max >= SIZE_MAX / 2) return -EINVAL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    /* a regular file's size sizes the buffer, a pipe's grows it; reading one byte more than
     * max tells a file that is too big */
    struct stat st;
    size_t cap = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? (size_t)st.st_size + 1 : 65536;
    if (cap > max + 1) cap = max + 1;
    size_t got = 0;
    char *buf = ddp_malloc(cap + 1);
    int rc = buf ? 0 : DDP_ENOMEM;
    while (rc == 0) {
        if (got == cap) {
            if (cap > max) {
                rc = -EFBIG;
                break;
            }
            size_t next = cap * 2 < max + 1 ? cap * 2 : max + 1;
            char *nb = ddp_realloc(buf, next + 1);
            if (!nb) {
                rc = DDP_ENOMEM;
                break;
            }
            buf = nb;
            cap = next;
        }
        ssize_t r = read(fd, buf + got, cap - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) rc = -errno;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[got] = 0;
    *out = buf;
    if (len) *len = got;
    return 0;
}

void ddp_file_raise_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max) return;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        DDP_DEBUG("cannot raise the descriptor limit: %s", strerror(errno));
}
