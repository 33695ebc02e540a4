/* Config defaults, the YAML file (libcyaml schema onto a scratch struct that is then laid over
 * the defaults), and derived values. Unknown keys are rejected so a typo is not silently lost. */
#include "config.h"

#include <cyaml/cyaml.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "daemon/client.h"
#include "kernels/kernels.h"

static void copy_str(char *dst, size_t n, const char *src) { snprintf(dst, n, "%s", src ? src : ""); }

void ddpd_config_defaults(ddpd_config_t *cfg, const char *self_exe)
{
    memset(cfg, 0, sizeof *cfg);
    if (gethostname(cfg->node_name, sizeof cfg->node_name - 1) != 0)
        copy_str(cfg->node_name, sizeof cfg->node_name, "localhost");
    const char *home = getenv("HOME");
    ddpd_default_socket_path(cfg->socket_path, sizeof cfg->socket_path);
    if (geteuid() == 0) {
        copy_str(cfg->state_dir, sizeof cfg->state_dir, "/var/lib/ddpd");
    } else {
        const char *xs = getenv("XDG_STATE_HOME");
        if (xs && *xs)
            snprintf(cfg->state_dir, sizeof cfg->state_dir, "%s/ddpd", xs);
        else
            snprintf(cfg->state_dir, sizeof cfg->state_dir, "%s/.local/state/ddpd",
                     home ? home : "/tmp");
    }
    const char *sd = getenv("DDPD_STATE_DIR"); /* an embedded daemon's history (ddpctl run) */
    if (sd && *sd) copy_str(cfg->state_dir, sizeof cfg->state_dir, sd);
    copy_str(cfg->metrics, sizeof cfg->metrics, "127.0.0.1:9464");
    cfg->grace_s = 10.0;
    const char *wb = getenv("DDP_WORKER_BIN");
    if (wb && *wb) {
        copy_str(cfg->worker_bin, sizeof cfg->worker_bin, wb);
    } else if (self_exe && strchr(self_exe, '/')) {
        char dir[PATH_MAX];
        copy_str(dir, sizeof dir, self_exe);
        *strrchr(dir, '/') = 0;
        /* ddpd lives in <build>/daemon, ddp-worker in <build>/worker; installed, both in bin/ */
        snprintf(cfg->worker_bin, sizeof cfg->worker_bin, "%.4000s/ddp-worker", dir);
        if (access(cfg->worker_bin, X_OK) != 0) {
            char alt[PATH_MAX];
            snprintf(alt, sizeof alt, "%.4000s/../worker/ddp-worker", dir);
            if (access(alt, X_OK) == 0) copy_str(cfg->worker_bin, sizeof cfg->worker_bin, alt);
        }
    } else {
        copy_str(cfg->worker_bin, sizeof cfg->worker_bin, "ddp-worker");
    }
}

/* The file's shape: every string is an inline array so the scratch struct needs no frees
 * beyond the one cyaml allocation. */
typedef struct file_cfg {
    char node_name[64];
    char socket[PATH_MAX];
    char socket_group[64];
    char listen[256];
    char advertise[256];
    char state_dir[PATH_MAX];
    char run_dir[PATH_MAX];
    char metrics[256];
    char worker_bin[PATH_MAX];
    char secret_file[PATH_MAX];
    int slots;
    double grace_s;
    ddpd_peer_cfg_t peers[DDPD_MAX_PEERS];
    unsigned n_peers;
} file_cfg_t;

static const cyaml_schema_field_t peer_fields[] = {
    CYAML_FIELD_STRING("name", CYAML_FLAG_OPTIONAL, ddpd_peer_cfg_t, name, 0),
    CYAML_FIELD_STRING("addr", CYAML_FLAG_DEFAULT, ddpd_peer_cfg_t, addr, 1),
    CYAML_FIELD_END};
static const cyaml_schema_value_t peer_schema = {
    CYAML_VALUE_MAPPING(CYAML_FLAG_DEFAULT, ddpd_peer_cfg_t, peer_fields)};

#define OPT CYAML_FLAG_OPTIONAL
static const cyaml_schema_field_t top_fields[] = {
    CYAML_FIELD_STRING("node_name", OPT, file_cfg_t, node_name, 0),
    CYAML_FIELD_STRING("socket", OPT, file_cfg_t, socket, 0),
    CYAML_FIELD_STRING("socket_group", OPT, file_cfg_t, socket_group, 0),
    CYAML_FIELD_STRING("listen", OPT, file_cfg_t, listen, 0),
    CYAML_FIELD_STRING("advertise", OPT, file_cfg_t, advertise, 0),
    CYAML_FIELD_STRING("state_dir", OPT, file_cfg_t, state_dir, 0),
    CYAML_FIELD_STRING("run_dir", OPT, file_cfg_t, run_dir, 0),
    CYAML_FIELD_STRING("metrics", OPT, file_cfg_t, metrics, 0),
    CYAML_FIELD_STRING("worker_bin", OPT, file_cfg_t, worker_bin, 0),
    CYAML_FIELD_STRING("secret_file", OPT, file_cfg_t, secret_file, 0),
    CYAML_FIELD_INT("slots", OPT, file_cfg_t, slots),
    CYAML_FIELD_FLOAT("grace_s", OPT, file_cfg_t, grace_s),
    CYAML_FIELD_SEQUENCE_COUNT("peers", OPT, file_cfg_t, peers, n_peers, &peer_schema, 0,
                               DDPD_MAX_PEERS),
    CYAML_FIELD_END};
static const cyaml_schema_value_t top_schema = {
    CYAML_VALUE_MAPPING(CYAML_FLAG_POINTER, file_cfg_t, top_fields)};

typedef struct log_ctx {
    char msg[512];
} log_ctx_t;

/* cyaml reports errors through its log function; keep the first error line for the person. */
static void cyaml_log_cb(cyaml_log_t level, void *ctx, const char *fmt, va_list args)
{
    log_ctx_t *lc = ctx;
    if (level < CYAML_LOG_ERROR || lc->msg[0]) return;
    vsnprintf(lc->msg, sizeof lc->msg, fmt, args);
    size_t n = strlen(lc->msg);
    while (n && (lc->msg[n - 1] == '\n' || lc->msg[n - 1] == ' ')) lc->msg[--n] = 0;
}

#define OVERLAY(field, src)                                                                   \
    do {                                                                                      \
        if ((src)[0]) copy_str(cfg->field, sizeof cfg->field, (src));                         \
    } while (0)

int ddpd_config_load(ddpd_config_t *cfg, const char *path, ddp_errinfo_t *ei)
{
    if (access(path, R_OK) != 0) {
        int rc = -errno;
        ddp_errinfo_set(ei, rc, "cannot read config: %s", strerror(errno));
        ddp_errinfo_path(ei, "%s", path);
        return rc;
    }
    log_ctx_t lc = {{0}};
    const cyaml_config_t ccfg = {
        .log_fn = cyaml_log_cb,
        .log_ctx = &lc,
        .mem_fn = cyaml_mem,
        .log_level = CYAML_LOG_WARNING,
        .flags = CYAML_CFG_DEFAULT,
    };
    file_cfg_t *f = NULL;
    cyaml_err_t err = cyaml_load_file(path, &ccfg, &top_schema, (cyaml_data_t **)&f, NULL);
    if (err != CYAML_OK) {
        ddp_errinfo_set(ei, DDP_EFORMAT, "%s%s%s", cyaml_strerror(err), lc.msg[0] ? ": " : "",
                        lc.msg);
        ddp_errinfo_path(ei, "%s", path);
        return DDP_EFORMAT;
    }
    OVERLAY(node_name, f->node_name);
    OVERLAY(socket_path, f->socket);
    OVERLAY(socket_group, f->socket_group);
    OVERLAY(listen, f->listen);
    OVERLAY(advertise, f->advertise);
    OVERLAY(state_dir, f->state_dir);
    OVERLAY(run_dir, f->run_dir);
    OVERLAY(metrics, f->metrics);
    OVERLAY(worker_bin, f->worker_bin);
    OVERLAY(secret_file, f->secret_file);
    if (f->slots) cfg->slots = f->slots;
    if (f->grace_s > 0) cfg->grace_s = f->grace_s;
    if (f->n_peers) {
        cfg->n_peers = (int)f->n_peers;
        memcpy(cfg->peers, f->peers, sizeof cfg->peers[0] * f->n_peers);
    }
    int bad = f->slots < 0 || f->grace_s < 0;
    cyaml_free(&ccfg, &top_schema, f, 0);
    if (bad) {
        ddp_errinfo_set(ei, DDP_EFORMAT, "slots and grace_s must not be negative");
        ddp_errinfo_path(ei, "%s", path);
        return DDP_EFORMAT;
    }
    return 0;
}

int ddpd_split_hostport(const char *s, char *host, size_t hostlen, int *port)
{
    const char *colon;
    const char *h = s;
    size_t hl;
    if (!s || !*s) return DDP_EINVAL;
    if (s[0] == '[') {
        const char *rb = strchr(s, ']');
        if (!rb || rb[1] != ':') return DDP_EINVAL;
        h = s + 1;
        hl = (size_t)(rb - h);
        colon = rb + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon) return DDP_EINVAL;
        hl = (size_t)(colon - s);
    }
    if (hl >= hostlen) return DDP_EINVAL;
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end || p < 0 || p > 65535 || end == colon + 1) return DDP_EINVAL;
    memcpy(host, h, hl);
    host[hl] = 0;
    if (!host[0]) snprintf(host, hostlen, "0.0.0.0");
    *port = (int)p;
    return 0;
}

int ddpd_config_finish(ddpd_config_t *cfg, ddp_errinfo_t *ei)
{
    if (!cfg->run_dir[0]) {
        int n = snprintf(cfg->run_dir, sizeof cfg->run_dir, "%s/runs", cfg->state_dir);
        if (n >= (int)sizeof cfg->run_dir)
            return ddp_errinfo_set(ei, DDP_EINVAL, "state_dir is too long");
    }
    if (cfg->slots <= 0) {
        /* one slot per GPU where the CUDA module finds some, else one per core */
        long n = ddp_kernels_gpu_count();
        if (n <= 0) n = sysconf(_SC_NPROCESSORS_ONLN);
        cfg->slots = n > 0 ? (int)n : 1;
    }
    char host[256];
    int port;
    if (cfg->listen[0] && ddpd_split_hostport(cfg->listen, host, sizeof host, &port) != 0)
        return ddp_errinfo_set(ei, DDP_EINVAL, "listen must be host:port, got '%s'", cfg->listen);
    if (cfg->metrics[0] && ddpd_split_hostport(cfg->metrics, host, sizeof host, &port) != 0)
        return ddp_errinfo_set(ei, DDP_EINVAL, "metrics must be host:port, got '%s'",
                               cfg->metrics);
    if (!cfg->advertise[0]) {
        if (cfg->listen[0]) {
            ddpd_split_hostport(cfg->listen, host, sizeof host, &port);
            copy_str(cfg->advertise, sizeof cfg->advertise,
                     strcmp(host, "0.0.0.0") && strcmp(host, "::") ? host : cfg->node_name);
        } else {
            copy_str(cfg->advertise, sizeof cfg->advertise, "127.0.0.1");
        }
    }
    for (int i = 0; i < cfg->n_peers; i++)
        if (ddpd_split_hostport(cfg->peers[i].addr, host, sizeof host, &port) != 0 || port == 0)
            return ddp_errinfo_set(ei, DDP_EINVAL, "peers[%d].addr must be host:port, got '%s'",
                                   i, cfg->peers[i].addr);
    if ((cfg->n_peers || cfg->listen[0]) && !cfg->secret_file[0])
        return ddp_errinfo_set(ei, DDP_EINVAL,
                               "listen/peers need secret_file (the cluster's shared secret)");
    return 0;
}
