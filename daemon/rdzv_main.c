/* ddp-rdzv: an elastic job's coordinator as a process of its own, for launchers without a daemon
 * (deploy/launch-local.sh, a Slurm or shell script). ddpd runs the same coordinator (coord.c)
 * inside its own loop.
 *
 *   DDP_JOB_TOKEN=T ddp-rdzv --listen HOST:PORT --world N [--min-workers M] [--max-workers X]
 *                            [--heartbeat-timeout S] [--rejoin-timeout S] [--port-file F]
 *                            [--run-dir D]
 *
 * Prints every event as one JSON line on stdout ({"event":"generation",...}, "evict", "done",
 * "failed", "flight"). With --run-dir, each "flight" event's diagnosis (the ranks' flight recorder
 * dumps lined up, collectives/flight.h) is also written to D/flight/diagnosis.txt, where the ranks
 * write their dumps (this process runs as the job's user). Exit status: 0 once every member is
 * done, 1 when the job failed, 2 on bad usage, 143 on SIGTERM/SIGINT. The token comes from the environment so that it never shows in `ps`.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "daemon/coord.h"
#include "daemon/userfs.h"

static int result = -1;
static const char *run_dir;

/* D/flight/diagnosis.txt: the diagnosis line, written to a temporary file and renamed. */
/* RUN_DIR/flight/diagnosis.txt := diag, never through a link (whoever runs the coordinator,
 * root included: ddpd_userfile_replace_in). */
static void write_diagnosis(const char *diag)
{
    char dir[4096], why[512] = "";
    snprintf(dir, sizeof dir, "%s/flight", run_dir);
    mkdir(run_dir, 0755);
    mkdir(dir, 0755);
    char *text = NULL;
    int n = asprintf(&text, "%s\n", diag);
    if (n < 0 || ddpd_userfile_replace_in(dir, "diagnosis.txt", text, (size_t)n, why, sizeof why))
        fprintf(stderr, "ddp-rdzv: cannot write %s/diagnosis.txt: %s\n", dir,
                n < 0 ? "out of memory" : why);
    free(text);
}

static void on_event(void *arg, json_t *ev)
{
    (void)arg;
    char *s = json_dumps(ev, JSON_COMPACT);
    if (s) {
        printf("%s\n", s);
        fflush(stdout);
        free(s);
    }
    const char *what = json_string_value(json_object_get(ev, "event"));
    if (what && !strcmp(what, "done")) result = 0;
    if (what && !strcmp(what, "failed")) result = 1;
    const char *diag = json_string_value(json_object_get(ev, "diagnosis"));
    if (what && !strcmp(what, "flight") && diag && run_dir) write_diagnosis(diag);
}

static void on_signal(uv_signal_t *s, int sig)
{
    (void)sig;
    result = 143;
    uv_stop(s->loop);
}

static void on_check(uv_check_t *h)
{
    if (result >= 0) uv_stop(h->loop);
}

static int parse_addr(const char *addr, char *host, size_t hostlen, int *port)
{
    const char *colon = strrchr(addr, ':');
    if (!colon || (size_t)(colon - addr) >= hostlen) return -1;
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end || p < 0 || p > 65535) return -1;
    *port = (int)p;
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"listen", required_argument, NULL, 'l'},
        {"world", required_argument, NULL, 'w'},
        {"min-workers", required_argument, NULL, 'm'},
        {"max-workers", required_argument, NULL, 'x'},
        {"heartbeat-timeout", required_argument, NULL, 'h'},
        {"rejoin-timeout", required_argument, NULL, 'r'},
        {"port-file", required_argument, NULL, 'p'},
        {"run-dir", required_argument, NULL, 'd'},
        {NULL, 0, NULL, 0},
    };
    char host[256] = "127.0.0.1";
    const char *port_file = NULL;
    ddpd_coord_cfg_t cfg = {.token = getenv("DDP_JOB_TOKEN"), .on_event = on_event};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'l':
            if (parse_addr(optarg, host, sizeof host, &cfg.port) < 0) {
                fprintf(stderr, "ddp-rdzv: --listen: expected HOST:PORT, got '%s'\n", optarg);
                return 2;
            }
            break;
        case 'w': cfg.world = atoi(optarg); break;
        case 'm': cfg.min_workers = atoi(optarg); break;
        case 'x': cfg.max_workers = atoi(optarg); break;
        case 'h': cfg.hb_timeout_s = atof(optarg); break;
        case 'r': cfg.rejoin_timeout_s = atof(optarg); break;
        case 'p': port_file = optarg; break;
        case 'd': run_dir = optarg; break;
        default: fprintf(stderr, "ddp-rdzv: see the usage at the top of daemon/rdzv_main.c\n");
                 return 2;
        }
    }
    if (!cfg.token || !*cfg.token) {
        fprintf(stderr, "ddp-rdzv: DDP_JOB_TOKEN is not set\n");
        return 2;
    }
    if (!cfg.min_workers) cfg.min_workers = cfg.world;
    if (!cfg.max_workers) cfg.max_workers = cfg.world;
    cfg.host = host;
    uv_loop_t *loop = uv_default_loop();
    ddpd_coord_t *coord;
    ddp_errinfo_t ei;
    ddp_errinfo_clear(&ei);
    if (ddpd_coord_new(loop, &cfg, &coord, &ei) != 0) {
        fprintf(stderr, "ddp-rdzv: %s\n", ei.msg);
        return 2;
    }
    if (port_file) {
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp", port_file);
        FILE *f = fopen(tmp, "w");
        if (!f || fprintf(f, "%d\n", ddpd_coord_port(coord)) < 0 || fclose(f) != 0 ||
            rename(tmp, port_file) != 0) {
            fprintf(stderr, "ddp-rdzv: cannot write %s\n", port_file);
            return 2;
        }
    }
    uv_signal_t sig_term, sig_int;
    uv_signal_init(loop, &sig_term);
    uv_signal_init(loop, &sig_int);
    uv_signal_start(&sig_term, on_signal, SIGTERM);
    uv_signal_start(&sig_int, on_signal, SIGINT);
    uv_check_t check;
    uv_check_init(loop, &check);
    uv_check_start(&check, on_check);
    uv_run(loop, UV_RUN_DEFAULT);
    ddpd_coord_close(coord);
    uv_close((uv_handle_t *)&sig_term, NULL);
    uv_close((uv_handle_t *)&sig_int, NULL);
    uv_close((uv_handle_t *)&check, NULL);
    uv_run(loop, UV_RUN_DEFAULT);
    return result < 0 ? 1 : result;
}
