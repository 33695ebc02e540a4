/* The exec helper that every rank starts as: ddpd runs its own binary again
 * (`/proc/self/exe __exec-rank ...`, spawn.c), which takes the job user's credentials, opens the
 * rank's log and enters the working directory *as that user*, then execs ddp-worker in the same
 * process (same pid, same environment: adoption through /proc/PID/environ keeps working).
 *
 * Why a helper: libuv's uv_spawn has no pre-exec hook, does chdir(cwd) as root and drops every
 * supplementary group (setgroups(0, NULL)) before setgid/setuid. Opening the log and entering
 * the directory with the user's credentials means a symlink planted in a run directory, or a
 * working directory the user may not enter, gets the kernel's answer for that user, never
 * root's. The same design as slurmstepd's privilege drop before opening task output and
 * OpenSSH's sshd-session.
 *
 * argv: ddpd-exec __exec-rank UID GID GROUPS CWD RUN_DIR LOG WORKER SPEC
 *   GROUPS: supplementary gids, comma-separated, or "-" for none; CWD: "" = RUN_DIR;
 *   LOG: a file name in RUN_DIR (opened O_APPEND|O_NOFOLLOW, a regular file of the user).
 * The credentials change only when the helper runs as root and UID is not 0.
 * Exit status when the rank could not be started: DDPD_EXEC_FAILED (the reason goes to the
 * rank's log when it is open, else to ddpd's stderr).
 */
#ifndef DDPD_EXEC_RANK_H
#define DDPD_EXEC_RANK_H

#define DDPD_EXEC_RANK_ARG "__exec-rank"
#define DDPD_EXEC_RANK_ARGC 10
#define DDPD_EXEC_FAILED 126
/* The most supplementary groups a job may carry (one argv string stays under the kernel's
 * 128 KiB per-string limit). */
#define DDPD_MAX_GROUPS 4096

/* Runs the helper (argv as above). Returns only on failure, with DDPD_EXEC_FAILED or 127 (the
 * worker could not be executed) for main to return. Single-threaded process only. */
int ddpd_exec_rank_main(int argc, char **argv);

#endif
