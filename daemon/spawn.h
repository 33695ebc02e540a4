/* Starting one worker rank as a child process (uv_spawn) with the worker contract's
 * environment, as the job's user with the job's groups, its stdout/stderr appended to
 * <run_dir>/rank-N.log, in its own process group so a signal reaches everything it started.
 * Every rank starts as ddpd's exec helper (exec_rank.h), which takes the user's credentials,
 * opens the log and enters the working directory as that user, then execs the worker.
 *
 * A ddpd_proc_t is caller-owned storage that holds a uv_process_t: after ddpd_spawn_rank (even
 * a failed one) it stays in use until on_close has run. Loop thread only.
 */
#ifndef DDPD_SPAWN_H
#define DDPD_SPAWN_H

#include <limits.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

typedef struct ddpd_launch {
    const char *worker_bin;
    const char *spec_path; /* passed as argv[1] */
    const char *run_dir;   /* DDP_RUN_DIR; logs go here */
    const char *cwd;       /* working directory, entered as the user (run_dir when "", NULL or
                              the user may not enter it) */
    const char *rdzv;      /* DDP_RDZV host:port */
    const char *token;     /* DDP_JOB_TOKEN */
    int64_t job_id;
    int generation;
    int world, local_world;
    int threads;           /* DDP_THREADS; 0: the cores divided among this host's local_world */
    int elastic; /* DDP_ELASTIC=1: DDP_RDZV is the job's coordinator (daemon/coord.h) */
    /* the user the rank runs as when the daemon is root (uid 0: root's job, as root) */
    uint32_t uid, gid;
    const uint32_t *groups; /* supplementary groups (at most DDPD_MAX_GROUPS) */
    int n_groups;
    /* this node's byte caps for the user's files (DDP_LIMIT_LOG_BYTES, _METRICS_BYTES,
     * _TENSORBOARD_BYTES; 0: none): the worker lowers its spec's limits.* to them */
    int64_t log_bytes, metrics_bytes, tensorboard_bytes;
} ddpd_launch_t;

typedef struct ddpd_proc ddpd_proc_t;
typedef void (*ddpd_proc_cb)(ddpd_proc_t *p);

struct ddpd_proc {
    uv_process_t h;       /* a rank this daemon spawned */
    uv_poll_t watch;      /* a rank it adopted: its pidfd turns readable when it exits */
    int pidfd;
    int adopted;          /* not this process's child: watched through a pidfd */
    int status_unknown;   /* adopted, and it ended without recording its exit status */
    char run_dir[PATH_MAX]; /* adopted: where it records its exit status */
    uint32_t owner;       /* adopted: the uid whose exit record is to be believed */
    int rank, local_rank;
    int pid;
    int open;             /* the uv handle is initialised: on_close is still to come */
    int alive;            /* spawned and not yet exited */
    int64_t exit_status;  /* valid after on_exit */
    int term_signal;      /* 0 or the signal that ended it */
    int restarts;         /* times the owner spawned this rank again (elastic jobs) */
    int respawn;          /* the owner spawns it again once the handle is closed */
    ddpd_proc_cb on_exit; /* process ended (not called when the spawn failed) */
    ddpd_proc_cb on_close; /* the handle is closed: storage may be freed */
    void *data;
};

/* Spawns rank `rank` (through the exec helper: a rank it could not start exits with
 * DDPD_EXEC_FAILED). On success returns 0 and on_exit will be called once, then on_close.
 * On failure returns a negative libuv/-errno code and fills why; on_exit is not called, and
 * on_close is called later only if p->open is set (the handle got initialised). */
int ddpd_spawn_rank(uv_loop_t *loop, ddpd_proc_t *p, const ddpd_launch_t *l, int rank,
                    int local_rank, char *why, size_t whylen);

/* Takes over a rank that an earlier run of this daemon spawned (the daemon restarted and the
 * rank kept training): `pid` must be alive and carry DDP_JOB_TOKEN=token and DDP_RANK=rank in
 * its environment, else -ESRCH. Its exit is watched through a pidfd; the exit status is the one
 * the worker records in <run_dir>/rank-<rank>.exit ("<pid> <code>", a regular file of `owner`,
 * read as userfs.h does), or status_unknown when it recorded none (killed by a signal). Same
 * callbacks and on_close contract as ddpd_spawn_rank.
 * When it fails, exit_status/status_unknown say how the rank ended, as far as it recorded. */
int ddpd_adopt_rank(uv_loop_t *loop, ddpd_proc_t *p, int pid, int rank, int local_rank,
                    const char *token, const char *run_dir, uint32_t owner);

/* Writes a job's spec (JSON text) to <run_dir>/job.json, the file every rank gets as argv[1],
 * as a new file of uid:gid (userfs.h: never through a link the user planted); path receives
 * its name. Returns 0 or an error with why filled. */
int ddpd_write_spec(const char *run_dir, const char *spec_json, uint32_t uid, uint32_t gid,
                    char *path, size_t n, char *why, size_t whylen);

/* Stops watching the rank without signalling it (the daemon stops and leaves it running):
 * on_exit is not called; on_close follows. No-op when no handle is open. */
void ddpd_proc_release(ddpd_proc_t *p);

/* 1 when process pid's environment holds the entry `kv` ("KEY=value"). */
int ddpd_proc_has_env(int pid, const char *kv);

/* Sends sig to the rank's process group (falls back to the process). No-op when not alive. */
void ddpd_proc_signal(ddpd_proc_t *p, int sig);
/* A request by signal (SIGUSR2: a flight recorder dump), to the rank's process alone and only
 * when it catches the signal, whose default action would end it. Returns 1 when sent. */
int ddpd_proc_request(ddpd_proc_t *p, int sig);

/* Makes a random hex token of 2*nbytes characters (nbytes <= 32) into out. */
void ddpd_random_hex(char *out, size_t nbytes);

#endif
