/* Files in users' run directories (see userfs.h). */
#include "daemon/userfs.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sodium.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/file.h"

static int fail(char *why, size_t whylen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(char *why, size_t whylen, int rc, const char *fmt, ...)
{
    if (why && whylen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, whylen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/* One name below a directory: never empty, ".", ".." or holding a '/'. */
static int plain_name(const char *name)
{
    return name[0] && strcmp(name, ".") && strcmp(name, "..") && !strchr(name, '/');
}

/* Opens path's parent (O_PATH) and points *name at its last component. */
static int open_parent(const char *path, const char **name, char *why, size_t whylen)
{
    const char *slash = strrchr(path, '/');
    char parent[PATH_MAX];
    if (!slash || (size_t)(slash - path) >= sizeof parent)
        return fail(why, whylen, -EINVAL, "%s: not an absolute path", path);
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    memcpy(parent, path, n);
    parent[n] = '\0';
    *name = slash + 1;
    if (!plain_name(*name)) return fail(why, whylen, -EINVAL, "%s: no directory name", path);
    int fd = open(parent, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return fail(why, whylen, -errno, "%s: %s", parent, strerror(errno));
    return fd;
}

/* The last component of a directory path, opened without following it. */
static int open_dir_at(int pfd, const char *name, const char *path, char *why, size_t whylen)
{
    int fd = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) return fd;
    int e = errno;
    if (e == ELOOP || e == ENOTDIR)
        return fail(why, whylen, DDP_EPERM, "%s is not a directory (a symlink is not followed)",
                    path);
    return fail(why, whylen, -e, "%s: %s", path, strerror(e));
}

int ddpd_dir_open(const char *path, uint32_t owner, char *why, size_t whylen)
{
    const char *name;
    int pfd = open_parent(path, &name, why, whylen);
    if (pfd < 0) return pfd;
    int fd = open_dir_at(pfd, name, path, why, whylen);
    close(pfd);
    if (fd < 0) return fd;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int rc = fail(why, whylen, -errno, "%s: %s", path, strerror(errno));
        close(fd);
        return rc;
    }
    if (owner != (uint32_t)-1 && st.st_uid != owner && st.st_uid != 0) {
        close(fd);
        return fail(why, whylen, DDP_EPERM, "%s belongs to uid %u, not the job's uid %u", path,
                    (unsigned)st.st_uid, (unsigned)owner);
    }
    return fd;
}

int ddpd_rundir_make(const char *path, uint32_t uid, uint32_t gid, char *why, size_t whylen)
{
    const char *name;
    int pfd = open_parent(path, &name, why, whylen);
    if (pfd < 0) return pfd;
    if (mkdirat(pfd, name, 0700) != 0 && errno != EEXIST) {
        int rc = fail(why, whylen, -errno, "cannot create %s: %s", path, strerror(errno));
        close(pfd);
        return rc;
    }
    int fd = open_dir_at(pfd, name, path, why, whylen);
    close(pfd);
    if (fd < 0) return fd;
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) != 0) {
        rc = fail(why, whylen, -errno, "%s: %s", path, strerror(errno));
    } else if (geteuid() != 0) {
        /* a daemon of one user: every run directory is its own */
    } else if (st.st_uid == 0 && uid != 0) {
        /* new (or an old daemon's, never handed over): the user's now, through the fd */
        if (fchown(fd, uid, gid) != 0 || fchmod(fd, 0700) != 0)
            rc = fail(why, whylen, -errno, "cannot give %s to uid %u: %s", path, (unsigned)uid,
                      strerror(errno));
    } else if (st.st_uid != uid) {
        rc = fail(why, whylen, DDP_EPERM, "%s exists and belongs to uid %u, not the job's uid %u",
                  path, (unsigned)st.st_uid, (unsigned)uid);
    }
    close(fd);
    return rc;
}

int ddpd_userfile_open(int dirfd, const char *name, uint32_t owner, char *why, size_t whylen)
{
    if (!plain_name(name)) return fail(why, whylen, -EINVAL, "'%s' is not a file name", name);
    int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        if (e == ELOOP) return fail(why, whylen, DDP_EPERM, "%s is a symlink (not followed)", name);
        return fail(why, whylen, -e, "%s: %s", name, strerror(e));
    }
    struct stat st;
    const char *bad = NULL;
    char msg[96];
    if (fstat(fd, &st) != 0) {
        int rc = fail(why, whylen, -errno, "%s: %s", name, strerror(errno));
        close(fd);
        return rc;
    }
    if (!S_ISREG(st.st_mode)) {
        bad = "is not a regular file";
    } else if (st.st_nlink != 1) {
        bad = "has more than one link";
    } else if (st.st_uid != owner) {
        snprintf(msg, sizeof msg, "belongs to uid %u, not the job's uid %u", (unsigned)st.st_uid,
                 (unsigned)owner);
        bad = msg;
    }
    if (bad || fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
        int rc = bad ? fail(why, whylen, DDP_EPERM, "%s %s", name, bad)
                     : fail(why, whylen, -errno, "%s: %s", name, strerror(errno));
        close(fd);
        return rc;
    }
    return fd;
}

int ddpd_userfile_open_in(const char *dir, const char *name, uint32_t owner, char *why,
                          size_t whylen)
{
    int dfd = ddpd_dir_open(dir, owner, why, whylen);
    if (dfd < 0) return dfd;
    int fd = ddpd_userfile_open(dfd, name, owner, why, whylen);
    close(dfd);
    return fd;
}

int ddpd_userfile_read(const char *dir, const char *name, uint32_t owner, char *buf, size_t cap,
                       size_t *len, char *why, size_t whylen)
{
    if (len) *len = 0;
    if (cap) buf[0] = '\0';
    int fd = ddpd_userfile_open_in(dir, name, owner, why, whylen);
    if (fd < 0) return fd;
    size_t got = 0;
    while (got + 1 < cap) {
        ssize_t n = read(fd, buf + got, cap - 1 - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            int rc = fail(why, whylen, -errno, "%s: %s", name, strerror(errno));
            close(fd);
            return rc;
        }
        if (n == 0) break;
        got += (size_t)n;
    }
    close(fd);
    if (cap) buf[got] = '\0';
    if (len) *len = got;
    return 0;
}

int ddpd_userfile_write(int dirfd, const char *name, const void *data, size_t len, uint32_t uid,
                        uint32_t gid, mode_t mode, char *why, size_t whylen)
{
    if (!plain_name(name)) return fail(why, whylen, -EINVAL, "'%s' is not a file name", name);
    char tmp[NAME_MAX + 1];
    int fd = -1;
    /* randombytes_random below: sodium_init is idempotent, and the tools that write here
     * (ddpctl, ddp-rdzv) do not call it at start as ddpd does */
    if (sodium_init() < 0) return fail(why, whylen, -EIO, "libsodium cannot start");
    for (int tries = 0; fd < 0 && tries < 8; tries++) {
        snprintf(tmp, sizeof tmp, ".%.200s.%08x", name, randombytes_random());
        fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
        if (fd < 0 && errno != EEXIST)
            return fail(why, whylen, -errno, "cannot create %s: %s", tmp, strerror(errno));
    }
    if (fd < 0) return fail(why, whylen, -EEXIST, "cannot create a temporary file for %s", name);
    int rc = 0;
    for (size_t off = 0; rc == 0 && off < len;) {
        ssize_t n = write(fd, (const char *)data + off, len - off);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0)
            rc = fail(why, whylen, -errno, "%s: %s", tmp, strerror(errno));
        else
            off += (size_t)n;
    }
    if (rc == 0 && fchmod(fd, mode) != 0)
        rc = fail(why, whylen, -errno, "%s: %s", tmp, strerror(errno));
    if (rc == 0 && geteuid() == 0 && fchown(fd, uid, gid) != 0)
        rc = fail(why, whylen, -errno, "cannot give %s to uid %u: %s", tmp, (unsigned)uid,
                  strerror(errno));
    ddp_errinfo_t ei;
    int sc = ddp_file_sync_close(fd, tmp, rc, &ei); /* fsynced unless rc is an error already */
    if (rc == 0 && sc != 0) rc = fail(why, whylen, sc, "%s", ei.msg);
    if (rc == 0 && renameat(dirfd, tmp, dirfd, name) != 0)
        rc = fail(why, whylen, -errno, "cannot rename %s to %s: %s", tmp, name, strerror(errno));
    if (rc != 0) unlinkat(dirfd, tmp, 0);
    return rc;
}

int ddpd_userfile_replace_in(const char *dir, const char *name, const void *data, size_t len,
                             char *why, size_t whylen)
{
    int dfd = ddpd_dir_open(dir, (uint32_t)-1, why, whylen);
    if (dfd < 0) return dfd;
    struct stat st, ds;
    int rc = 0;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode))
        rc = fail(why, whylen, DDP_EPERM, "%s is %s: not written (a link is never followed)", name,
                  S_ISLNK(st.st_mode) ? "a symlink" : "not a regular file");
    else if (fstat(dfd, &ds) != 0)
        rc = fail(why, whylen, -errno, "%s: %s", dir, strerror(errno));
    else
        rc = ddpd_userfile_write(dfd, name, data, len, ds.st_uid, ds.st_gid, 0644, why, whylen);
    close(dfd);
    return rc;
}
