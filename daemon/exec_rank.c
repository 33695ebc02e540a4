/* The exec helper (see exec_rank.h). It runs between ddpd's fork and the worker's exec, so it
 * uses plain system calls and stdio only, and says why it failed in one line. */
#include "daemon/exec_rank.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* "ddpd: job J rank R: <what>" on stderr (ddpd's own log until the rank's log is open). */
static int failed(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int failed(int code, const char *fmt, ...)
{
    const char *job = getenv("DDP_JOB_ID"), *rank = getenv("DDP_RANK");
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "ddpd: job %s rank %s: %s\n", job ? job : "?", rank ? rank : "?", msg);
    return code;
}

static int parse_id(const char *s, unsigned long *out)
{
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (!*s || *end || errno || v > 0xfffffffeUL || s[0] == '-') return -1;
    *out = v;
    return 0;
}

/* GROUPS ("-" or "g1,g2,...") into gids; returns the count or -1. */
static int parse_groups(const char *s, gid_t *gids, int cap)
{
    if (!strcmp(s, "-")) return 0;
    int n = 0;
    char buf[16];
    while (*s) {
        size_t len = strcspn(s, ",");
        unsigned long g;
        if (!len || len >= sizeof buf || n >= cap) return -1;
        memcpy(buf, s, len);
        buf[len] = '\0';
        if (parse_id(buf, &g)) return -1;
        gids[n++] = (gid_t)g;
        s += len + (s[len] == ',');
    }
    return n;
}

/* Takes uid, gid and the groups for good (all three ids of each; groups before the uid, while
 * the process may still set them), and checks that root cannot be regained. */
static int become(uid_t uid, gid_t gid, const gid_t *groups, int n)
{
    if (setgroups((size_t)n, groups) != 0)
        return failed(DDPD_EXEC_FAILED, "setgroups (%d groups): %s", n, strerror(errno));
    if (setresgid(gid, gid, gid) != 0)
        return failed(DDPD_EXEC_FAILED, "setresgid(%u): %s", (unsigned)gid, strerror(errno));
    if (setresuid(uid, uid, uid) != 0)
        return failed(DDPD_EXEC_FAILED, "setresuid(%u): %s", (unsigned)uid, strerror(errno));
    uid_t r, e, s;
    if (getresuid(&r, &e, &s) != 0 || r != uid || e != uid || s != uid || setuid(0) == 0)
        return failed(DDPD_EXEC_FAILED, "the credentials of uid %u did not hold", (unsigned)uid);
    return 0;
}

/* The rank's log, opened as the user: appended to, never through a symlink, never a FIFO or a
 * file of someone else. Becomes fds 1 and 2. */
static int open_log(int dfd, const char *name)
{
    int fd = openat(dfd, name,
                    O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC,
                    0640);
    if (fd < 0)
        return failed(DDPD_EXEC_FAILED, "cannot open %s: %s", name,
                      errno == ELOOP ? "it is a symlink (not followed)" : strerror(errno));
    struct stat st;
    const char *bad = NULL;
    if (fstat(fd, &st) != 0)
        bad = strerror(errno);
    else if (!S_ISREG(st.st_mode))
        bad = "not a regular file";
    else if (st.st_nlink != 1)
        bad = "it has more than one link";
    else if (st.st_uid != geteuid())
        bad = "it belongs to another user";
    if (!bad && fcntl(fd, F_SETFL, O_APPEND) != 0) bad = strerror(errno);
    if (!bad && (dup2(fd, STDOUT_FILENO) < 0 || dup2(fd, STDERR_FILENO) < 0)) bad = strerror(errno);
    close(fd);
    if (bad) return failed(DDPD_EXEC_FAILED, "cannot use %s: %s", name, bad);
    return 0;
}

int ddpd_exec_rank_main(int argc, char **argv)
{
    if (argc != DDPD_EXEC_RANK_ARGC || strcmp(argv[1], DDPD_EXEC_RANK_ARG) != 0)
        return failed(DDPD_EXEC_FAILED, "exec helper: %d arguments, %d expected", argc,
                      DDPD_EXEC_RANK_ARGC);
    const char *cwd = argv[5], *run_dir = argv[6], *log = argv[7], *worker = argv[8],
               *spec = argv[9];
    unsigned long uid, gid;
    static gid_t groups[DDPD_MAX_GROUPS];
    int n = parse_groups(argv[4], groups, DDPD_MAX_GROUPS);
    if (parse_id(argv[2], &uid) || parse_id(argv[3], &gid) || n < 0)
        return failed(DDPD_EXEC_FAILED, "exec helper: bad uid, gid or groups");
    int rc;
    if (geteuid() == 0 && uid != 0 && (rc = become((uid_t)uid, (gid_t)gid, groups, n)) != 0)
        return rc;
    /* the run directory: the daemon made it and its parent is root's; as the user now */
    int dfd = open(run_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0)
        return failed(DDPD_EXEC_FAILED, "cannot open the run directory %s as uid %lu: %s", run_dir,
                      uid, strerror(errno));
    if ((rc = open_log(dfd, log)) != 0) return rc;
    /* from here on, what goes wrong is in the rank's log */
    if (*cwd && chdir(cwd) != 0) {
        fprintf(stderr,
                "ddpd: cannot enter the working directory %s as uid %lu (%s); the rank "
                "starts in its run directory\n",
                cwd, uid, strerror(errno));
        cwd = "";
    }
    if (!*cwd && fchdir(dfd) != 0)
        return failed(DDPD_EXEC_FAILED, "cannot enter %s: %s", run_dir, strerror(errno));
    close(dfd);
    char *args[] = {(char *)worker, (char *)spec, NULL};
    execvp(worker, args);
    return failed(127, "cannot start %s: %s", worker, strerror(errno));
}
