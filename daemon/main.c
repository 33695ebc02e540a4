/* ddpd: the node daemon. Parses options and the config, opens the store, recovers what a
 * previous daemon left, starts the control socket, metrics and peer links, tells systemd it is
 * ready, and runs the loop. SIGTERM/SIGINT: stop taking jobs, end running ranks (SIGTERM, then
 * SIGKILL after the grace period), record them, close every handle, exit 0.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/log.h"
#include "daemon/api.h"
#include "daemon/ddpd.h"
#include "daemon/exec_rank.h"
#include "daemon/job.h"
#include "daemon/http.h"
#include "daemon/prune.h"
#include "daemon/link.h"
#include "daemon/remote.h"
#include "daemon/recover.h"
#include "daemon/sched.h"
#include "daemon/store.h"

#ifdef DDPD_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#define NOTIFY(...) sd_notifyf(0, __VA_ARGS__)
#else
#define NOTIFY(...) ((void)0)
#endif

static void usage(FILE *f)
{
    fprintf(f,
            "usage: ddpd [options]\n"
            "  -c, --config FILE      YAML config (default /etc/ddpd/ddpd.yaml when present)\n"
            "  -s, --socket PATH      control socket\n"
            "      --state-dir DIR    SQLite store and run directories\n"
            "      --run-dir DIR      job run directories (default STATE_DIR/runs)\n"
            "      --slots N          local rank slots (default: cores)\n"
            "      --listen HOST:PORT TCP listener for peer daemons\n"
            "      --advertise HOST   address peers and ranks use to reach this node\n"
            "      --metrics HOST:PORT Prometheus endpoint ('off' to disable)\n"
            "      --worker-bin PATH  ddp-worker (env DDP_WORKER_BIN)\n"
            "      --secret-file PATH cluster shared secret\n"
            "      --peer [NAME=]HOST:PORT  a peer daemon (repeatable)\n"
            "      --node-name NAME   this node's name (default hostname)\n"
            "      --grace SECONDS    SIGTERM to SIGKILL delay on cancel (default 10)\n"
            "      --status-page private|public  job names on the HTTP status page (default:\n"
            "                         private under root: counts only)\n"
            "      --peer-auth required|allow-legacy  peers of an older ddpd (rolling upgrade)\n"
            "      --ready-fd FD      write one byte to FD when serving, then close it\n"
            "      --check-config     load and validate the config, print it, exit\n"
            "  -V, --version\n");
}

static void copy(char *dst, size_t n, const char *src) { snprintf(dst, n, "%s", src); }

enum { O_STATE = 256, O_RUN, O_SLOTS, O_LISTEN, O_ADV, O_METRICS, O_WORKER, O_SECRET, O_PEER,
       O_NODE, O_GRACE, O_READY, O_CHECK, O_PAGE, O_PEER_AUTH };

static void on_stop_timer(uv_timer_t *t);

/* Local ranks started or ended: the peers hear of this node's free slots. */
static void slots_changed(void *arg, ddpd_job_t *j, unsigned what)
{
    (void)j;
    if (what & DDPD_JOB_SLOTS) ddpd_peers_announce(arg);
}

/* What peers report about this node's jobs goes to the jobs and the scheduler. */
static const ddpd_remote_reports_t remote_reports = {
    .started = ddpd_job_remote_started,
    .exited = ddpd_job_remote_exit,
    .failed = ddpd_job_remote_failed,
    .adopted = ddpd_job_remote_adopted,
    .node_down = ddpd_job_node_down,
    .nodes_changed = ddpd_sched_kick,
};

/* Closes every module's handles; the loop then ends once their callbacks have run. */
static void close_all(ddpd_t *d)
{
    ddpd_job_close_idle(d);
    ddpd_api_close(d);
    ddpd_http_close(d);
    ddpd_remote_close(d);
    ddpd_sched_close(d);
    ddpd_prune_close(d);
    uv_close((uv_handle_t *)&d->store_timer, NULL);
    uv_close((uv_handle_t *)&d->sig_term, NULL);
    uv_close((uv_handle_t *)&d->sig_int, NULL);
    uv_close((uv_handle_t *)&d->stop_timer, NULL);
}

/* The store keeps what it could not write (a full filesystem): written here once it can. */
static void store_timer_cb(uv_timer_t *t)
{
    ddpd_t *d = t->data;
    if (ddpd_store_full(d->store)) ddpd_store_retry(d->store);
}

static int busy(ddpd_t *d)
{
    return ddpd_job_busy(d) || ddpd_remote_guest_ranks(d) > 0;
}

static void on_stop_timer(uv_timer_t *t)
{
    ddpd_t *d = t->data;
    if (busy(d)) return;
    uv_timer_stop(t);
    DDP_INFO("no rank left to wait for; closing");
    close_all(d);
}

/* SIGTERM (systemctl stop/restart, an upgrade) leaves running jobs training: the next ddpd
 * adopts them, as slurmd's restart leaves its jobs. SIGINT (^C on a ddpd in a terminal) ends
 * them: SIGTERM to their ranks, SIGKILL after grace_s; a second signal kills at once. */
static void on_signal(uv_signal_t *s, int signum)
{
    ddpd_t *d = s->data;
    if (d->stopping) {
        DDP_WARN("second %s: stopping without waiting", strsignal(signum));
        ddpd_job_kill_all(d);
        return;
    }
    d->stopping = 1;
    if (signum == SIGTERM) {
        DDP_INFO("%s: stopping; running jobs keep training and are adopted when ddpd starts "
                 "again", strsignal(signum));
        NOTIFY("STOPPING=1\nSTATUS=stopping: running jobs stay");
        ddpd_job_detach_all(d);
        ddpd_remote_detach_guests(d);
    } else {
        DDP_INFO("%s: stopping (running jobs get SIGTERM, SIGKILL after %.0fs)",
                 strsignal(signum), d->cfg.grace_s);
        NOTIFY("STOPPING=1\nSTATUS=stopping: ending running jobs");
        ddpd_job_stop_all(d, "the daemon was stopped while the job was running");
        ddpd_remote_stop_guests(d);
    }
    uv_timer_start(&d->stop_timer, on_stop_timer, 0, 100);
}

/* mkdir -p; the last component gets `mode` (the umask aside) when it is created. */
static int mkdirs(const char *path, mode_t mode)
{
    char p[PATH_MAX];
    copy(p, sizeof p, path);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(p, mode) != 0 && errno != EEXIST) return -errno;
            *s = '/';
        }
    if (mkdir(p, mode) != 0 && errno != EEXIST) return -errno;
    return 0;
}

/* The state directory and the run directories' base. Under a root daemon both are root's and
 * only traversable by others (0711): every user's job reaches its own run directory (0700, the
 * user's) through them, and nobody lists anyone's. A directory an older ddpd made 0750 is
 * opened up to 0711 here. A user's daemon keeps its own (0700). */
static int open_layout(const ddpd_config_t *cfg)
{
    mode_t mode = geteuid() == 0 ? 0711 : 0700;
    const char *dirs[] = {cfg->state_dir, cfg->run_dir};
    for (int i = 0; i < 2; i++) {
        int rc = mkdirs(dirs[i], mode);
        if (rc) return rc;
        struct stat st;
        if (geteuid() == 0 && stat(dirs[i], &st) == 0 && st.st_uid == 0 &&
            (st.st_mode & 07777) != mode && chmod(dirs[i], mode) != 0)
            return -errno;
    }
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, 0, 'c'}, {"socket", required_argument, 0, 's'},
        {"state-dir", required_argument, 0, O_STATE}, {"run-dir", required_argument, 0, O_RUN},
        {"slots", required_argument, 0, O_SLOTS}, {"listen", required_argument, 0, O_LISTEN},
        {"advertise", required_argument, 0, O_ADV}, {"metrics", required_argument, 0, O_METRICS},
        {"worker-bin", required_argument, 0, O_WORKER},
        {"secret-file", required_argument, 0, O_SECRET}, {"peer", required_argument, 0, O_PEER},
        {"node-name", required_argument, 0, O_NODE}, {"grace", required_argument, 0, O_GRACE},
        {"ready-fd", required_argument, 0, O_READY}, {"check-config", no_argument, 0, O_CHECK},
        {"status-page", required_argument, 0, O_PAGE},
        {"peer-auth", required_argument, 0, O_PEER_AUTH},
        {"version", no_argument, 0, 'V'},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    /* a rank being started: ddpd is its own exec helper (exec_rank.h), never a daemon here */
    if (argc >= 2 && !strcmp(argv[1], DDPD_EXEC_RANK_ARG)) return ddpd_exec_rank_main(argc, argv);
    static ddpd_t dd;
    ddpd_t *d = &dd;
    char self[PATH_MAX];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
    self[sl > 0 ? sl : 0] = 0;
    ddpd_config_defaults(&d->cfg, sl > 0 ? self : argv[0]);

    /* the config file first, then the options over it */
    const char *config = NULL;
    int c, ready_fd = -1, check_only = 0;
    while ((c = getopt_long(argc, argv, "c:s:Vh", opts, NULL)) != -1) {
        if (c == 'c') config = optarg;
        if (c == 'h') {
            usage(stdout);
            return 0;
        }
        if (c == 'V') {
            printf("ddpd %s\n", DDPD_VERSION);
            return 0;
        }
        if (c == '?') {
            usage(stderr);
            return 64;
        }
    }
    ddp_errinfo_t ei;
    ddp_errinfo_clear(&ei);
    char eb[1024];
    if (!config && access("/etc/ddpd/ddpd.yaml", R_OK) == 0 && geteuid() == 0)
        config = "/etc/ddpd/ddpd.yaml";
    if (config && ddpd_config_load(&d->cfg, config, &ei) != 0) {
        fprintf(stderr, "ddpd: %s\n", ddp_errinfo_str(&ei, eb, sizeof eb));
        return 78;
    }
    optind = 1;
    while ((c = getopt_long(argc, argv, "c:s:Vh", opts, NULL)) != -1) {
        ddpd_config_t *g = &d->cfg;
        switch (c) {
        case 's': copy(g->socket_path, sizeof g->socket_path, optarg); break;
        case O_STATE: copy(g->state_dir, sizeof g->state_dir, optarg); break;
        case O_RUN: copy(g->run_dir, sizeof g->run_dir, optarg); break;
        case O_SLOTS: g->slots = atoi(optarg); break;
        case O_LISTEN: copy(g->listen, sizeof g->listen, optarg); break;
        case O_ADV: copy(g->advertise, sizeof g->advertise, optarg); break;
        case O_METRICS:
            copy(g->metrics, sizeof g->metrics, strcmp(optarg, "off") ? optarg : "");
            break;
        case O_WORKER: copy(g->worker_bin, sizeof g->worker_bin, optarg); break;
        case O_SECRET: copy(g->secret_file, sizeof g->secret_file, optarg); break;
        case O_NODE: copy(g->node_name, sizeof g->node_name, optarg); break;
        case O_GRACE: g->grace_s = atof(optarg); break;
        case O_READY: ready_fd = atoi(optarg); break;
        case O_CHECK: check_only = 1; break;
        case O_PAGE:
        case O_PEER_AUTH: {
            const char *yes = c == O_PAGE ? "public" : "allow-legacy",
                       *no = c == O_PAGE ? "private" : "required";
            if (strcmp(optarg, yes) && strcmp(optarg, no)) {
                fprintf(stderr, "ddpd: --%s takes %s or %s, not '%s'\n",
                        c == O_PAGE ? "status-page" : "peer-auth", no, yes, optarg);
                return 64;
            }
            *(c == O_PAGE ? &g->status_public : &g->peer_legacy) = !strcmp(optarg, yes);
            break;
        }
        case O_PEER: {
            if (g->n_peers >= DDPD_MAX_PEERS) break;
            ddpd_peer_cfg_t *p = &g->peers[g->n_peers++];
            const char *eq = strchr(optarg, '=');
            if (eq) {
                snprintf(p->name, sizeof p->name, "%.*s", (int)(eq - optarg), optarg);
                copy(p->addr, sizeof p->addr, eq + 1);
            } else {
                copy(p->addr, sizeof p->addr, optarg);
            }
            break;
        }
        default: break;
        }
    }
    if (ddpd_config_finish(&d->cfg, &ei) != 0) {
        fprintf(stderr, "ddpd: config: %s\n", ddp_errinfo_str(&ei, eb, sizeof eb));
        return 78;
    }
    if (check_only) {
        ddpd_config_t *g = &d->cfg;
        printf("node_name: %s\nsocket: %s\nlisten: %s\nadvertise: %s\nstate_dir: %s\n"
               "run_dir: %s\nmetrics: %s\nworker_bin: %s\nsecret_file: %s\nslots: %d\n"
               "grace_s: %g\nsocket_group: %s\nadmin_group: %s\nstatus_page: %s\n"
               "peer_auth: %s\npeer_root_jobs: %s\nmax_sessions_per_user: %d\n"
               "max_peer_links_per_addr: %d\nreserve_after_s: %g\nruns_keep_days: %g\n"
               "quotas.default: {queued_jobs: %ld, running_ranks: %ld, log_bytes: %lld, "
               "metrics_bytes: %lld, tensorboard_bytes: %lld}\nquotas.users: %d\npeers: %d\n",
               g->node_name, g->socket_path, g->listen, g->advertise, g->state_dir, g->run_dir,
               g->metrics, g->worker_bin, g->secret_file, g->slots, g->grace_s, g->socket_group,
               g->admin_group, g->status_public ? "public" : "private",
               g->peer_legacy ? "allow-legacy" : "required",
               g->peer_root_jobs ? "allow" : "refuse", g->max_sessions_per_user,
               g->max_peer_links_per_addr, g->reserve_after_s, g->runs_keep_days,
               g->quota.queued_jobs, g->quota.running_ranks, (long long)g->quota.log_bytes,
               (long long)g->quota.metrics_bytes, (long long)g->quota.tensorboard_bytes,
               g->n_user_quotas, g->n_peers);
        for (int i = 0; i < g->n_peers; i++)
            printf("  - {name: %s, addr: %s}\n", g->peers[i].name, g->peers[i].addr);
        return 0;
    }
    if (sodium_init() < 0) {
        fprintf(stderr, "ddpd: libsodium failed to initialise\n");
        return 70;
    }
    signal(SIGPIPE, SIG_IGN);
    int rc;
    if ((rc = open_layout(&d->cfg)) != 0) {
        fprintf(stderr, "ddpd: cannot create %s or %s: %s\n", d->cfg.state_dir, d->cfg.run_dir,
                strerror(-rc));
        return 73;
    }
    d->loop = uv_default_loop();
    d->start_ms = ddp_wall_ms();
    if ((rc = ddpd_store_open(&d->store, d->cfg.state_dir)) != 0) {
        fprintf(stderr, "ddpd: cannot open the job store in %s: %s\n", d->cfg.state_dir,
                ddp_strerror(rc));
        return 73;
    }
    ddpd_sched_init(d);
    ddpd_job_on_change(d, slots_changed, d);
    uv_signal_init(d->loop, &d->sig_term);
    uv_signal_init(d->loop, &d->sig_int);
    uv_timer_init(d->loop, &d->stop_timer);
    uv_timer_init(d->loop, &d->store_timer);
    d->sig_term.data = d->sig_int.data = d->stop_timer.data = d->store_timer.data = d;
    uv_timer_start(&d->store_timer, store_timer_cb, 2000, 2000);
    int exit_code = 0;
    if ((rc = ddpd_api_start(d, &ei)) != 0 || (rc = ddpd_http_start(d, &ei)) != 0 ||
        (rc = ddpd_remote_start(d, &remote_reports, &ei)) != 0) {
        fprintf(stderr, "ddpd: %s\n", ddp_errinfo_str(&ei, eb, sizeof eb));
        exit_code = 1;
        d->stopping = 1;
        close_all(d);
    } else {
        ddpd_recover(d);
        ddpd_prune_start(d);
        uv_signal_start(&d->sig_term, on_signal, SIGTERM);
        uv_signal_start(&d->sig_int, on_signal, SIGINT);
        DDP_INFO("ddpd %s on %s: socket %s, %d slots, worker %s, state %s", DDPD_VERSION,
                 d->cfg.node_name, d->cfg.socket_path, d->cfg.slots, d->cfg.worker_bin,
                 d->cfg.state_dir);
        NOTIFY("READY=1\nSTATUS=serving %s, %d slots", d->cfg.socket_path, d->cfg.slots);
        if (ready_fd >= 0) {
            ssize_t w = write(ready_fd, "R", 1);
            (void)w;
            close(ready_fd);
        }
    }
    uv_run(d->loop, UV_RUN_DEFAULT);
    ddpd_job_free_all(d); /* every job's handles are closed: drop the rest */
    ddpd_store_close(d->store);
    uv_loop_close(d->loop);
    DDP_INFO("stopped");
    return exit_code;
}
