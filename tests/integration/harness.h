/* Test harness for C daemon tests: starts a real ddpd on a private socket and state dir in a
 * temporary directory, waits until it serves (--ready-fd), and stops it, returning how it
 * exited. TAP helpers. Single-threaded tests only.
 */
#ifndef DDPD_TEST_HARNESS_H
#define DDPD_TEST_HARNESS_H

#include <sys/types.h>

typedef struct ddpd_test_daemon {
    pid_t pid;
    char dir[256];
    char socket[300];
} ddpd_test_daemon_t;

/* Starts ddpd ($DDP_BUILD_ROOT/daemon/ddpd) with extra NULL-terminated args. 0 or -1. */
int ddpd_test_start(ddpd_test_daemon_t *t, const char *const *extra);
/* SIGTERM, wait (10 s, then SIGKILL). Returns the wait status; removes the directory. */
int ddpd_test_stop(ddpd_test_daemon_t *t);

/* TAP */
void tap_ok(int cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints the plan; returns the exit code (0 if all passed). */
int tap_done(void);

#endif
