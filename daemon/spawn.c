/* uv_spawn of one worker rank: environment (the worker contract), log file, process group. */
#include "spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/log.h"

extern char **environ;

/* Keys the worker contract sets; inherited copies of them are dropped. */
static const char *const contract_keys[] = {
    "DDP_RANK=",     "DDP_WORLD_SIZE=", "DDP_LOCAL_RANK=", "DDP_LOCAL_WORLD_SIZE=",
    "DDP_RDZV=",     "DDP_JOB_TOKEN=",  "DDP_JOB_ID=",     "DDP_GENERATION=",
    "DDP_RUN_DIR=",  "DDP_THREADS=",    "NOTIFY_SOCKET=",  "LISTEN_FDS=",
    "LISTEN_PID=",   "DDP_ELASTIC=",    NULL};

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
    if (p->on_close) p->on_close(p);
}

int ddpd_spawn_rank(uv_loop_t *loop, ddpd_proc_t *p, const ddpd_launch_t *l, int rank,
                    int local_rank, char *why, size_t whylen)
{
    char logpath[4200];
    snprintf(logpath, sizeof logpath, "%s/rank-%d.log", l->run_dir, rank);
    p->rank = rank;
    p->local_rank = local_rank;
    p->alive = 0;
    p->open = 0;
    p->pid = 0;
    p->h.data = p;

    size_t n_env = 0;
    while (environ[n_env]) n_env++;
    char **env = ddp_calloc(n_env + 16, sizeof *env);
    char extra[11][4400];
    int fd = -1, rc = 0;
    if (!env) {
        rc = -ENOMEM;
        snprintf(why, whylen, "out of memory");
        goto fail;
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
    snprintf(extra[9], sizeof extra[9], "DDP_THREADS=%d", l->threads);
    snprintf(extra[10], sizeof extra[10], "DDP_ELASTIC=%d", l->elastic);
    for (int i = 0; i < 11; i++) env[k++] = extra[i];
    env[k] = NULL;

    fd = open(logpath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (fd < 0) {
        rc = -errno;
        snprintf(why, whylen, "cannot open %s: %s", logpath, strerror(errno));
        goto fail;
    }
    if (l->as_user && geteuid() == 0 && fchown(fd, l->uid, l->gid) != 0)
        DDP_WARN("spawn: chown %s: %s", logpath, strerror(errno));

    char *args[3] = {(char *)l->worker_bin, (char *)l->spec_path, NULL};
    uv_stdio_container_t stdio[3];
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_INHERIT_FD;
    stdio[1].data.fd = fd;
    stdio[2].flags = UV_INHERIT_FD;
    stdio[2].data.fd = fd;
    uv_process_options_t opt;
    memset(&opt, 0, sizeof opt);
    opt.exit_cb = exit_cb;
    opt.file = l->worker_bin;
    opt.args = args;
    opt.env = env;
    opt.cwd = (l->cwd && *l->cwd) ? l->cwd : l->run_dir;
    opt.stdio = stdio;
    opt.stdio_count = 3;
    /* own session and process group: cancel signals the whole group, and a terminal's ^C on
     * a foreground ddpd does not reach the workers directly */
    opt.flags = UV_PROCESS_DETACHED;
    if (l->as_user && geteuid() == 0 && l->uid != 0) {
        opt.flags |= UV_PROCESS_SETUID | UV_PROCESS_SETGID;
        opt.uid = l->uid;
        opt.gid = l->gid;
    }
    rc = uv_spawn(loop, &p->h, &opt);
    p->open = 1; /* initialised even when the spawn failed */
    close(fd);
    fd = -1;
    free(env);
    env = NULL;
    if (rc != 0) {
        snprintf(why, whylen, "cannot start %s for rank %d: %s", l->worker_bin, rank,
                 uv_strerror(rc));
        p->open = 1;
        uv_close((uv_handle_t *)&p->h, close_cb);
        return rc;
    }
    p->alive = 1;
    p->pid = p->h.pid;
    return 0;
fail:
    if (fd >= 0) close(fd);
    free(env);
    return rc;
}

void ddpd_proc_signal(ddpd_proc_t *p, int sig)
{
    if (!p->alive || p->pid <= 0) return;
    if (kill(-p->pid, sig) != 0) kill(p->pid, sig);
}
