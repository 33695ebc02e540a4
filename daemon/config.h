/* ddpd's configuration: defaults, the YAML config file (libyaml), and command-line overrides.
 *
 * Every field has a usable default, so a daemon started with no file runs a single node on the
 * local CPU slots. Strings are fixed-size arrays so a config is a plain value that can be copied.
 */
#ifndef DDPD_CONFIG_H
#define DDPD_CONFIG_H

#include <limits.h>
#include <stdint.h>

#include "common/err.h"

#define DDPD_MAX_PEERS 64
#define DDPD_MAX_QUOTA_USERS 256

/* What one user may do through this daemon when it coordinates their jobs (quotas hold per
 * coordinating daemon: a cluster of N daemons lets a user queue on each). 0 = no cap. */
typedef struct ddpd_quota {
    long queued_jobs;   /* jobs waiting in the queue */
    long running_ranks; /* ranks of the user's started jobs (the queue holds the rest back) */
    int64_t log_bytes, metrics_bytes, tensorboard_bytes; /* the worker's caps (spec's limits.*
                                                            lowered to these) */
} ddpd_quota_t;

typedef struct ddpd_user_quota {
    uint32_t uid;
    unsigned set; /* bit i: field i of ddpd_quota_t given (others come from the default) */
    ddpd_quota_t q;
} ddpd_user_quota_t;

typedef struct ddpd_peer_cfg {
    char name[64];  /* node name the peer announces; "" = take what it announces */
    char addr[256]; /* host:port of its TCP listener */
} ddpd_peer_cfg_t;

typedef struct ddpd_config {
    char node_name[64];       /* default: hostname */
    char socket_path[PATH_MAX]; /* control socket */
    char socket_group[64];    /* group that may use the socket ("" = the daemon's) */
    char admin_group[64];     /* members see and cancel every user's jobs ("" = root only) */
    char listen[256];         /* host:port for peers ("" = no TCP listener) */
    char advertise[256];      /* address peers and ranks reach this node at ("" = listen host) */
    char state_dir[PATH_MAX]; /* SQLite store */
    char run_dir[PATH_MAX];   /* one directory per job ("" = state_dir/runs) */
    char metrics[256];        /* host:port of the Prometheus endpoint ("" = off) */
    char worker_bin[PATH_MAX];
    char secret_file[PATH_MAX]; /* cluster secret; required when peers or listen are set */
    int slots;                /* local rank slots; 0 = number of cores */
    double grace_s;           /* SIGTERM → SIGKILL delay on cancel */
    int status_public;        /* status_page: public (job names on the HTTP page); default:
                                 private under a root daemon, public under a user's */
    int peer_legacy;          /* peer_auth: allow-legacy (v1 links without per-message
                                 authentication, for a rolling upgrade); default required */
    int peer_root_jobs;       /* peer_root_jobs: allow (peers may start uid 0 ranks here) */
    int max_sessions_per_user; /* control-socket connections per uid (root: no cap) */
    int max_peer_links_per_addr; /* unauthenticated peer connections per remote address */
    double reserve_after_s;   /* a job waiting this long holds the queue until it starts */
    double runs_keep_days;    /* run directories of jobs ended longer ago are removed; 0: never */
    ddpd_quota_t quota;       /* every user's, unless quotas.users says otherwise */
    int n_user_quotas;
    ddpd_user_quota_t user_quotas[DDPD_MAX_QUOTA_USERS];
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

/* The quota of uid: the default with the fields quotas.users gives for it. */
void ddpd_config_quota(const ddpd_config_t *cfg, uint32_t uid, ddpd_quota_t *out);

/* Splits "host:port" (IPv4 or [v6]:port). Returns 0 or DDP_EINVAL. */
int ddpd_split_hostport(const char *s, char *host, size_t hostlen, int *port);

#endif
