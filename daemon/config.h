/* ddpd's configuration: defaults, the YAML config file (libyaml), and command-line overrides.
 *
 * Every field has a usable default, so a daemon started with no file runs a single node on the
 * local CPU slots. Strings are fixed-size arrays so a config is a plain value that can be copied.
 */
#ifndef DDPD_CONFIG_H
#define DDPD_CONFIG_H

#include <limits.h>

#include "common/err.h"

#define DDPD_MAX_PEERS 64

typedef struct ddpd_peer_cfg {
    char name[64];  /* node name the peer announces; "" = take what it announces */
    char addr[256]; /* host:port of its TCP listener */
} ddpd_peer_cfg_t;

typedef struct ddpd_config {
    char node_name[64];       /* default: hostname */
    char socket_path[PATH_MAX]; /* control socket */
    char socket_group[64];    /* group that may use the socket ("" = the daemon's) */
    char listen[256];         /* host:port for peers ("" = no TCP listener) */
    char advertise[256];      /* address peers and ranks reach this node at ("" = listen host) */
    char state_dir[PATH_MAX]; /* SQLite store */
    char run_dir[PATH_MAX];   /* one directory per job ("" = state_dir/runs) */
    char metrics[256];        /* host:port of the Prometheus endpoint ("" = off) */
    char worker_bin[PATH_MAX];
    char secret_file[PATH_MAX]; /* cluster secret; required when peers or listen are set */
    int slots;                /* local rank slots; 0 = number of cores */
    double grace_s;           /* SIGTERM → SIGKILL delay on cancel */
    int n_peers;
    ddpd_peer_cfg_t peers[DDPD_MAX_PEERS];
} ddpd_config_t;

/* Fills cfg with defaults. `self_exe` (may be NULL) is ddpd's own path, used to find ddp-worker
 * beside it; DDP_WORKER_BIN overrides. Socket: /run/ddpd/ddpd.sock for root, else
 * $XDG_RUNTIME_DIR/ddpd.sock; state: $DDPD_STATE_DIR, else /var/lib/ddpd for root, else $XDG_STATE_HOME/ddpd. */
void ddpd_config_defaults(ddpd_config_t *cfg, const char *self_exe);

/* Reads a YAML config file over the values already in cfg (keys absent keep their value).
 * Unknown keys are errors. Returns 0, -errno (unreadable), or DDP_EFORMAT with ei filled. */
int ddpd_config_load(ddpd_config_t *cfg, const char *path, ddp_errinfo_t *ei);

/* Finishes a config after all overrides: derives run_dir, slots and advertise.
 * Returns 0 or DDP_EINVAL with ei filled (e.g. peers without a secret file). */
int ddpd_config_finish(ddpd_config_t *cfg, ddp_errinfo_t *ei);

/* Splits "host:port" (IPv4 or [v6]:port). Returns 0 or DDP_EINVAL. */
int ddpd_split_hostport(const char *s, char *host, size_t hostlen, int *port);

#endif
