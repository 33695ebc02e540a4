/* uv_spawn of one worker rank: environment (the worker contract), the exec helper that becomes
 * the user and opens the log (exec_rank.h), process group; and the adoption of a rank an earlier
 * run of the daemon spawned. */
#include "spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sodium.h>
#include <sys/syscall.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/log.h"
#include "daemon/exec_rank.h"
#include "daemon/userfs.h"

extern char **environ;

/* Keys the worker contract sets; inherited copies of them are dropped. */
static const char *const contract_keys[] = {
    "DDP_RANK=",     "DDP_WORLD_SIZE=", "DDP_LOCAL_RANK=", "DDP_LOCAL_WORLD_SIZE=",
    "DDP_RDZV=",     "DDP_JOB_TOKEN=",  "DDP_JOB_ID=",     "DDP_GENERATION=",
    "DDP_RUN_DIR=",  "DDP_THREADS=",    "NOTIFY_SOCKET=",  "LISTEN_FDS=",
    "LISTEN_PID=",   "DDP_ELASTIC=",    "DDP_LIMIT_",      NULL};

static int is_contract_key(const char *kv)
{
    for (int i = 0; contract_keys[i]; i++)
        if (!strncmp(kv, contract_keys[i], strlen(contract_keys[i]))) return 1;
    return 0;
}

void ddpd_random_hex(char *out, size_t nbytes)
{
    unsigned char b[32];
    if (nbytes > sizeof b) nbytes = sizeof b;
    randombytes_buf(b, nbytes);
    sodium_bin2hex(out, nbytes * 2 + 1, b, nbytes);
}

static void close_cb(uv_handle_t *h);

static void exit_cb(uv_process_t *h, int64_t status, int sig)
{
    ddpd_proc_t *p = h->data;
    p->alive = 0;
    p->exit_status = status;
    p->term_signal = sig;
    if (p->on_exit) p->on_exit(p);
    uv_close((uv_handle_t *)h, close_cb);
}

static void close_cb(uv_handle_t *h)
{
    ddpd_proc_t *p = h->data;
    p->open = 0;
    if (p->adopted && p->pidfd >= 0) {
        close(p->pidfd);
        p->pidfd = -1;
    }
    if (p->on_close) p->on_close(p);
}

/* "g1,g2,..." or "-" for the helper's GROUPS argument (caller frees). */
static char *groups_arg(const uint32_t *groups, int n)
{
    char *s = ddp_malloc((size_t)n * 11 + 2);
    if (!s) return NULL;
    size_t k = 0;
    for (int i = 0; i < n; i++) k += (size_t)sprintf(s + k, "%s%u", i ? "," : "", groups[i]);
    if (!n) s[k++] = '-';
    s[k] = '\0';
    return s;
}

int ddpd_spawn_rank(uv_loop_t *loop, ddpd_proc_t *p, const ddpd_launch_t *l, int rank,
                    int local_rank, char *why, size_t whylen)
{
    p->rank = rank;
    p->local_rank = local_rank;
    p->alive = 0;
    p->open = 0;
    p->pid = 0;
    p->adopted = 0;
    p->status_unknown = 0;
    p->h.data = p;
    if (l->n_groups < 0 || l->n_groups > DDPD_MAX_GROUPS) {
        snprintf(why, whylen, "%d supplementary groups, more than %d", l->n_groups,
                 DDPD_MAX_GROUPS);
        return DDP_EINVAL;
    }

    size_t n_env = 0;
    while (environ[n_env]) n_env++;
    char **env = ddp_calloc(n_env + 16, sizeof *env);
    char *groups = groups_arg(l->groups, l->n_groups);
    char extra[14][4400];
    int rc = 0;
    if (!env || !groups) {
        free(env);
        free(groups);
        snprintf(why, whylen, "out of memory");
        return DDP_ENOMEM;
    }
    size_t k = 0;
    for (size_t i = 0; i < n_env; i++)
        if (!is_contract_key(environ[i])) env[k++] = environ[i];
    snprintf(extra[0], sizeof extra[0], "DDP_RANK=%d", rank);
    snprintf(extra[1], sizeof extra[1], "DDP_WORLD_SIZE=%d", l->world);
    snprintf(extra[2], sizeof extra[2], "DDP_LOCAL_RANK=%d", local_rank);
    snprintf(extra[3], sizeof extra[3], "DDP_LOCAL_WORLD_SIZE=%d", l->local_world);
    snprintf(extra[4], sizeof extra[4], "DDP_RDZV=%s", l->rdzv);
    snprintf(extra[5], sizeof extra[5], "DDP_JOB_TOKEN=%s", l->token);
    snprintf(extra[6], sizeof extra[6], "DDP_JOB_ID=%lld", (long long)l->job_id);
    snprintf(extra[7], sizeof extra[7], "DDP_GENERATION=%d", l->generation);
    snprintf(extra[8], sizeof extra[8], "DDP_RUN_DIR=%s", l->run_dir);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int per_rank = l->local_world > 0 && cores / l->local_world > 0 ? (int)(cores / l->local_world)
                                                                     : 1;
    snprintf(extra[9], sizeof extra[9], "DDP_THREADS=%d", l->threads > 0 ? l->threads : per_rank);
    snprintf(extra[10], sizeof extra[10], "DDP_ELASTIC=%d", l->elastic);
    snprintf(extra[11], sizeof extra[11], "DDP_LIMIT_LOG_BYTES=%lld", (long long)l->log_bytes);
    snprintf(extra[12], sizeof extra[12], "DDP_LIMIT_METRICS_BYTES=%lld",
             (long long)l->metrics_bytes);
    snprintf(extra[13], sizeof extra[13], "DDP_LIMIT_TENSORBOARD_BYTES=%lld",
             (long long)l->tensorboard_bytes);
    for (int i = 0; i < 14; i++) env[k++] = extra[i];
    env[k] = NULL;

    /* the exec helper: this binary again (the pid stays the rank's; see exec_rank.h) */
    char uid[16], gid[16], logname[32];
    snprintf(uid, sizeof uid, "%u", l->uid);
    snprintf(gid, sizeof gid, "%u", l->gid);
    snprintf(logname, sizeof logname, "rank-%d.log", rank);
    char *args[DDPD_EXEC_RANK_ARGC + 1] = {
        "ddpd-exec", DDPD_EXEC_RANK_ARG,   uid, gid, groups,
        (char *)(l->cwd ? l->cwd : ""),    (char *)l->run_dir, logname,
        (char *)l->worker_bin,             (char *)l->spec_path, NULL};
    uv_stdio_container_t stdio[3];
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_INHERIT_FD; /* the helper's own complaints go to ddpd's log */
    stdio[1].data.fd = STDERR_FILENO;
    stdio[2].flags = UV_INHERIT_FD;
    stdio[2].data.fd = STDERR_FILENO;
    uv_process_options_t opt;
    memset(&opt, 0, sizeof opt);
    opt.exit_cb = exit_cb;
    opt.file = "/proc/self/exe";
    opt.args = args;
    opt.env = env;
    opt.stdio = stdio;
    opt.stdio_count = 3;
    /* own session and process group: cancel signals the whole group, and a terminal's ^C on
     * a foreground ddpd does not reach the workers directly */
    opt.flags = UV_PROCESS_DETACHED;
    rc = uv_spawn(loop, &p->h, &opt);
    p->open = 1; /* initialised even when the spawn failed */
    free(env);
    free(groups);
    if (rc != 0) {
        snprintf(why, whylen, "cannot start rank %d: %s", rank, uv_strerror(rc));
        uv_close((uv_handle_t *)&p->h, close_cb);
        return rc;
    }
    p->alive = 1;
    p->pid = p->h.pid;
    return 0;
}

int ddpd_write_spec(const char *run_dir, const char *spec_json, uint32_t uid, uint32_t gid,
                    char *path, size_t n, char *why, size_t whylen)
{
    snprintf(path, n, "%s/job.json", run_dir);
    int dfd = ddpd_dir_open(run_dir, uid, why, whylen);
    if (dfd < 0) return dfd;
    size_t len = strlen(spec_json);
    char *text = ddp_malloc(len + 2);
    int rc = DDP_ENOMEM;
    if (text) {
        memcpy(text, spec_json, len);
        text[len] = '\n';
        rc = ddpd_userfile_write(dfd, "job.json", text, len + 1, uid, gid, 0600, why, whylen);
        free(text);
    } else {
        snprintf(why, whylen, "out of memory");
    }
    close(dfd);
    return rc;
}

int ddpd_proc_has_env(int pid, const char *kv)
{
    char path[64], buf[65536];
    snprintf(path, sizeof path, "/proc/%d/environ", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    size_t kl = strlen(kv);
    for (ssize_t i = 0; n > 0 && i < n;) {
        size_t l = strnlen(buf + i, (size_t)(n - i));
        if (l == kl && !memcmp(buf + i, kv, kl)) return 1;
        i += (ssize_t)l + 1;
    }
    return 0;
}

/* The exit status an adopted rank recorded, if it is this process's (a regular file of the
 * rank's user: one the user planted elsewhere is not followed). */
static void read_exit_record(ddpd_proc_t *p)
{
    char name[32], buf[64], why[256];
    snprintf(name, sizeof name, "rank-%d.exit", p->rank);
    long pid = 0, code = 0;
    int got = ddpd_userfile_read(p->run_dir, name, p->owner, buf, sizeof buf, NULL, why,
                                 sizeof why) == 0 &&
              sscanf(buf, "%ld %ld", &pid, &code) == 2;
    p->term_signal = 0;
    p->exit_status = got && pid == p->pid ? code : -1;
    p->status_unknown = !(got && pid == p->pid);
}

static void adopted_cb(uv_poll_t *h, int status, int events)
{
    ddpd_proc_t *p = h->data;
    (void)status;
    (void)events;
    uv_poll_stop(h);
    p->alive = 0;
    read_exit_record(p);
    if (p->on_exit) p->on_exit(p);
    uv_close((uv_handle_t *)h, close_cb);
}

int ddpd_adopt_rank(uv_loop_t *loop, ddpd_proc_t *p, int pid, int rank, int local_rank,
                    const char *token, const char *run_dir, uint32_t owner)
{
    char kv[160];
    p->rank = rank;
    p->local_rank = local_rank;
    p->alive = p->open = 0;
    p->pid = pid;
    p->adopted = 1;
    p->status_unknown = 0;
    p->pidfd = -1;
    snprintf(p->run_dir, sizeof p->run_dir, "%s", run_dir);
    p->owner = owner;
    /* a rank that is gone ended while no daemon watched it: its record says how, if it could */
    read_exit_record(p);
    if (pid <= 0) return -ESRCH;
    /* the pidfd first: the identity checked next is then the process it refers to, not a
     * later one that reused the number */
    int fd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (fd < 0) return -errno;
    int ok = 1;
    snprintf(kv, sizeof kv, "DDP_JOB_TOKEN=%s", token);
    ok = ok && ddpd_proc_has_env(pid, kv);
    snprintf(kv, sizeof kv, "DDP_RANK=%d", rank);
    ok = ok && ddpd_proc_has_env(pid, kv);
    if (!ok) {
        close(fd);
        return -ESRCH;
    }
    p->pidfd = fd;
    p->watch.data = p;
    int rc = uv_poll_init(loop, &p->watch, fd);
    if (rc == 0) rc = uv_poll_start(&p->watch, UV_READABLE, adopted_cb);
    p->open = 1;
    if (rc) {
        uv_close((uv_handle_t *)&p->watch, close_cb);
        return rc;
    }
    p->alive = 1;
    return 0;
}

void ddpd_proc_release(ddpd_proc_t *p)
{
    uv_handle_t *h = p->adopted ? (uv_handle_t *)&p->watch : (uv_handle_t *)&p->h;
    if (!p->open || uv_is_closing(h)) return;
    p->alive = 0;
    uv_close(h, close_cb);
}

/* 1 when process pid has a handler for sig (the SigCgt mask of /proc/PID/status): a signal it
 * does not catch, such as SIGUSR2 to a worker older than the flight recorder, would end it.
 * The path is procfs's for a pid of the daemon's own ranks, never a user's file: no link to
 * follow, and reading it cannot block. */
static int catches(int pid, int sig)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "re");
    if (!f) return 0;
    unsigned long long mask = 0;
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = sscanf(line, "SigCgt: %llx", &mask) == 1;
    fclose(f);
    return found && sig >= 1 && sig <= 64 && (mask >> (sig - 1) & 1);
}

int ddpd_proc_request(ddpd_proc_t *p, int sig)
{
    return p->alive && p->pid > 0 && catches(p->pid, sig) && kill(p->pid, sig) == 0;
}

void ddpd_proc_signal(ddpd_proc_t *p, int sig)
{
    if (!p->alive || p->pid <= 0) return;
    if (kill(-p->pid, sig) != 0) kill(p->pid, sig);
}
