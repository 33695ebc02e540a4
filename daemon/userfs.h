/* Files in users' run directories, touched by a root daemon without following their links.
 *
 * A job's run directory (<run_dir>/job-N, or <run_dir>/<coordinator>-job-N for a peer's ranks)
 * belongs to the job's user, who may put anything there at any time: a symlink to /etc/shadow
 * named rank-0.log, a FIFO named metrics.jsonl, a hard link to another user's file. So the
 * daemon never opens a path inside one: it opens the directory itself relative to its parent
 * (the daemon's own, root-owned base) with O_NOFOLLOW, then each file relative to that
 * descriptor, with O_NOFOLLOW (a symlink fails), O_NONBLOCK (a FIFO does not wait for a writer)
 * and, for reads, checks on the open descriptor that it is a regular file with one link owned
 * by the job's user. Files it writes there are new files (O_CREAT|O_EXCL never follows a link)
 * renamed into place. Every user-controlled path here is one directory and one name below the
 * base, so plain openat with O_NOFOLLOW at each step is enough; openat2's RESOLVE_BENEATH is not
 * needed (and Debian 12's glibc has no wrapper for it).
 *
 * What the worker itself writes there it writes as the user (spawn.c's exec helper), so the
 * kernel's permission checks apply and nothing here is needed for that.
 * Blocking system calls on local files, no FIFO waits; any thread.
 */
#ifndef DDPD_USERFS_H
#define DDPD_USERFS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Opens the directory `path` for *at calls: its parent is opened by path (the daemon's own
 * base: a configured, root-owned directory), its last component with O_NOFOLLOW. When
 * `owner` is not (uint32_t)-1 the directory must belong to that uid or to root (a run directory
 * whose chown has not happened yet). Returns the fd (O_DIRECTORY|O_CLOEXEC; the caller closes
 * it) or an error (-errno, DDP_EPERM) with why (whylen bytes) saying what is wrong. */
int ddpd_dir_open(const char *path, uint32_t owner, char *why, size_t whylen);

/* Makes the run directory `path` (its parent is the daemon's base) for uid:gid, private (0700),
 * or takes an existing one that is a real directory owned by uid or root (a re-queued job's);
 * root-owned ones are given to uid:gid. Nothing is chowned through a path. When the daemon is
 * not root the directory stays its own. Returns 0 or an error with why filled. */
int ddpd_rundir_make(const char *path, uint32_t uid, uint32_t gid, char *why, size_t whylen);

/* Opens `name` in directory dirfd for reading: not a symlink, not blocking, and only a regular
 * file with one link owned by `owner` (checked on the descriptor). Returns the fd (blocking mode
 * restored, O_CLOEXEC) or an error with why filled: -ENOENT when absent, DDP_EPERM for a file
 * that fails a check, another -errno. */
int ddpd_userfile_open(int dirfd, const char *name, uint32_t owner, char *why, size_t whylen);

/* ddpd_dir_open(dir, owner) then ddpd_userfile_open(name, owner): the file `name` of run
 * directory `dir`. Same returns. */
int ddpd_userfile_open_in(const char *dir, const char *name, uint32_t owner, char *why,
                          size_t whylen);

/* Reads at most cap - 1 bytes of `name` in `dir` (opened as ddpd_userfile_open_in does) into
 * buf, NUL-terminated, *len (may be NULL) the bytes read. Returns 0 or an error with why. */
int ddpd_userfile_read(const char *dir, const char *name, uint32_t owner, char *buf, size_t cap,
                       size_t *len, char *why, size_t whylen);

/* Writes data[0..len) to `name` in directory dirfd as a new file (a random temporary name,
 * O_CREAT|O_EXCL|O_NOFOLLOW) that is then renamed over `name` (a symlink or a file there is
 * replaced, never followed). The file gets `mode` and, when the daemon is root, the owner
 * uid:gid, and is fsynced before the rename (common/file.h). Returns 0 or -errno with why
 * filled; the temporary file is removed on failure. */
int ddpd_userfile_write(int dirfd, const char *name, const void *data, size_t len, uint32_t uid,
                        uint32_t gid, mode_t mode, char *why, size_t whylen);

/* The file `name` in the directory `dir` := data[0..len), for a tool that may run as root in a
 * user's directory (ddpctl dump, ddp-rdzv: RUN_DIR/flight/diagnosis.txt): dir is opened without
 * following a link; a `name` there that is not a regular file (a symlink, a FIFO) is refused;
 * otherwise ddpd_userfile_write replaces it, owned by the directory's owner. A link that appears
 * after the check is replaced by the rename, not followed. Returns 0 or an error with why. */
int ddpd_userfile_replace_in(const char *dir, const char *name, const void *data, size_t len,
                             char *why, size_t whylen);

#endif
