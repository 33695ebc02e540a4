/* Durable file helpers (see file.h). */
#include "file.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

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
