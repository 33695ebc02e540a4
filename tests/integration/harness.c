/* Daemon test harness (see harness.h). */
#include "tests/integration/harness.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static int n_tests, n_failed;

void tap_ok(int cond, const char *fmt, ...)
{
    va_list ap;
    n_tests++;
    if (!cond) n_failed++;
    printf("%s %d - ", cond ? "ok" : "not ok", n_tests);
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

int tap_done(void)
{
    printf("1..%d\n", n_tests);
    return n_failed ? 1 : 0;
}

int ddpd_test_start(ddpd_test_daemon_t *t, const char *const *extra)
{
    const char *build = getenv("DDP_BUILD_ROOT");
    if (!build) {
        fprintf(stderr, "DDP_BUILD_ROOT is not set\n");
        return -1;
    }
    snprintf(t->dir, sizeof t->dir, "/tmp/ddpd-ctest.XXXXXX");
    if (!mkdtemp(t->dir)) return -1;
    snprintf(t->socket, sizeof t->socket, "%s/d.sock", t->dir);
    char bin[1024], state[300], log[300], fdarg[16];
    snprintf(bin, sizeof bin, "%s/daemon/ddpd", build);
    snprintf(state, sizeof state, "%s/state", t->dir);
    snprintf(log, sizeof log, "%s/ddpd.log", t->dir);
    int pfd[2];
    if (pipe(pfd) != 0) return -1;
    t->pid = fork();
    if (t->pid < 0) return -1;
    if (t->pid == 0) {
        close(pfd[0]);
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* a test that crashes leaves no daemon behind */
        int lf = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (lf >= 0) dup2(lf, 2);
        snprintf(fdarg, sizeof fdarg, "%d", pfd[1]);
        /* an empty config: not the machine's /etc/ddpd/ddpd.yaml, which a root ddpd reads */
        const char *argv[64] = {bin,       "-c",     "/dev/null", "--socket", t->socket,
                                "--state-dir", state, "--metrics", "off",     "--grace",
                                "2",       "--ready-fd", fdarg};
        int n = 13;
        for (int i = 0; extra && extra[i] && n < 62; i++) argv[n++] = extra[i];
        argv[n] = NULL;
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    close(pfd[1]);
    char b;
    ssize_t r;
    do r = read(pfd[0], &b, 1);
    while (r < 0 && errno == EINTR);
    close(pfd[0]);
    if (r != 1) {
        fprintf(stderr, "# ddpd did not start; log in %s\n", log);
        return -1;
    }
    return 0;
}

int ddpd_test_stop(ddpd_test_daemon_t *t)
{
    int st = 0;
    kill(t->pid, SIGTERM);
    for (int i = 0; i < 200; i++) {
        if (waitpid(t->pid, &st, WNOHANG) == t->pid) goto done;
        usleep(50000);
    }
    kill(t->pid, SIGKILL);
    waitpid(t->pid, &st, 0);
done:;
    /* SIGTERM leaves running jobs' ranks training (a restarted daemon adopts them): end the
     * ones this test's daemon started, found by their spec's path under its directory */
    char kill_cmd[400];
    snprintf(kill_cmd, sizeof kill_cmd, "pkill -KILL -f '%s/.*job.json'", t->dir);
    if (system(kill_cmd) < 0) fprintf(stderr, "# could not run pkill\n");
    if (!getenv("KEEP_TMP")) {
        char cmd[400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", t->dir);
        if (system(cmd) != 0) fprintf(stderr, "# could not remove %s\n", t->dir);
    }
    return st;
}
