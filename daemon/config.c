/* Config defaults, the YAML file (libyaml's document API, walked against the known keys and laid
 * over the defaults), and derived values. Unknown keys are rejected so a typo is not silently
 * lost. */
#include "config.h"

#include <errno.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <yaml.h>

#include "common/alloc.h"
#include "daemon/client.h"
#include "daemon/gpus.h"
#include "proto/spec.h"

static void copy_str(char *dst, size_t n, const char *src) { snprintf(dst, n, "%s", src ? src : ""); }

void ddpd_config_defaults(ddpd_config_t *cfg, const char *self_exe)
{
    memset(cfg, 0, sizeof *cfg);
    if (gethostname(cfg->node_name, sizeof cfg->node_name - 1) != 0)
        copy_str(cfg->node_name, sizeof cfg->node_name, "localhost");
    ddpd_default_socket_path(cfg->socket_path, sizeof cfg->socket_path);
    ddpd_default_state_dir(cfg->state_dir, sizeof cfg->state_dir); /* ddpctl reads it too */
    copy_str(cfg->metrics, sizeof cfg->metrics, "127.0.0.1:9464");
    cfg->grace_s = 10.0;
    cfg->status_public = -1; /* ddpd_config_finish: private under root */
    cfg->max_sessions_per_user = 64;
    cfg->max_peer_links_per_addr = 8;
    cfg->reserve_after_s = 600;
    cfg->quota = (ddpd_quota_t){.queued_jobs = 100, .log_bytes = (int64_t)1 << 30,
                                .metrics_bytes = (int64_t)1 << 30,
                                .tensorboard_bytes = (int64_t)1 << 30};
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

/* The file is read with libyaml's document API (the job specs' parser too) and walked here:
 * a top-level mapping of known keys, each a scalar except `peers`, a sequence of {name, addr}
 * mappings. Anything else, and any unknown key, is an error naming the line and column. */

/* Keeps the first error: "LINE:COL: what" with the file as the path. */
static int cfg_error(ddp_errinfo_t *ei, const char *path, const yaml_node_t *n, const char *fmt,
                     ...) __attribute__((format(printf, 4, 5)));

static int cfg_error(ddp_errinfo_t *ei, const char *path, const yaml_node_t *n, const char *fmt,
                     ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ddp_errinfo_set(ei, DDP_EFORMAT, "%zu:%zu: %s", n ? n->start_mark.line + 1 : 0,
                    n ? n->start_mark.column + 1 : 0, msg);
    ddp_errinfo_path(ei, "%s", path);
    return DDP_EFORMAT;
}

/* The scalar n into dst[len], or an error naming `key`. */
static int cfg_string(const yaml_node_t *n, const char *key, char *dst, size_t len,
                      const char *path, ddp_errinfo_t *ei)
{
    if (n->type != YAML_SCALAR_NODE)
        return cfg_error(ei, path, n, "%s: expected a string", key);
    if (n->data.scalar.length >= len)
        return cfg_error(ei, path, n, "%s: longer than %zu characters", key, len - 1);
    memcpy(dst, n->data.scalar.value, n->data.scalar.length);
    dst[n->data.scalar.length] = '\0';
    return 0;
}

/* The scalar n as a number >= 0 (an integer when `integer`), or an error naming `key`. */
static int cfg_number(const yaml_node_t *n, const char *key, int integer, double *out,
                      const char *path, ddp_errinfo_t *ei)
{
    char text[64], *end;
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.length >= sizeof text)
        return cfg_error(ei, path, n, "%s: expected a number", key);
    memcpy(text, n->data.scalar.value, n->data.scalar.length);
    text[n->data.scalar.length] = '\0';
    *out = integer ? (double)strtol(text, &end, 10) : strtod(text, &end);
    if (!text[0] || *end || *out < 0 || (integer && *out > 1 << 20))
        return cfg_error(ei, path, n, "%s: expected %s >= 0, got '%s'", key,
                         integer ? "an integer" : "a number", text);
    return 0;
}

/* peers: a sequence of {name, addr} mappings (addr required). */
static int cfg_peers(yaml_document_t *doc, const yaml_node_t *seq, ddpd_config_t *cfg,
                     const char *path, ddp_errinfo_t *ei)
{
    if (seq->type != YAML_SEQUENCE_NODE)
        return cfg_error(ei, path, seq, "peers: expected a sequence of {name, addr}");
    int n = 0;
    for (yaml_node_item_t *it = seq->data.sequence.items.start;
         it < seq->data.sequence.items.top; it++, n++) {
        const yaml_node_t *m = yaml_document_get_node(doc, *it);
        if (n >= DDPD_MAX_PEERS)
            return cfg_error(ei, path, m, "peers: more than %d", DDPD_MAX_PEERS);
        if (m->type != YAML_MAPPING_NODE)
            return cfg_error(ei, path, m, "peers[%d]: expected {name, addr}", n);
        ddpd_peer_cfg_t *p = &cfg->peers[n];
        memset(p, 0, sizeof *p);
        for (yaml_node_pair_t *kv = m->data.mapping.pairs.start; kv < m->data.mapping.pairs.top;
             kv++) {
            const yaml_node_t *k = yaml_document_get_node(doc, kv->key);
            const yaml_node_t *v = yaml_document_get_node(doc, kv->value);
            const char *key = k->type == YAML_SCALAR_NODE ? (const char *)k->data.scalar.value : "";
            int rc = !strcmp(key, "name")   ? cfg_string(v, "peers.name", p->name,
                                                         sizeof p->name, path, ei)
                     : !strcmp(key, "addr") ? cfg_string(v, "peers.addr", p->addr,
                                                         sizeof p->addr, path, ei)
                     : cfg_error(ei, path, k, "peers[%d].%s: unknown key", n, key);
            if (rc) return rc;
        }
        if (!p->addr[0]) return cfg_error(ei, path, m, "peers[%d]: addr is required", n);
    }
    cfg->n_peers = n;
    return 0;
}

/* One of `words` (NULL-terminated) for key; *out its index. */
static int cfg_choice(const yaml_node_t *n, const char *key, const char *const *words, int *out,
                      const char *path, ddp_errinfo_t *ei)
{
    char text[64];
    DDP_CHECK(cfg_string(n, key, text, sizeof text, path, ei));
    for (int i = 0; words[i]; i++)
        if (!strcmp(text, words[i])) {
            *out = i;
            return 0;
        }
    return cfg_error(ei, path, n, "%s: expected %s or %s, got '%s'", key, words[0], words[1],
                     text);
}

/* A quota mapping {queued_jobs, running_ranks, log_bytes, metrics_bytes, tensorboard_bytes}
 * into q; *set gets a bit per field given. */
static int cfg_quota(yaml_document_t *doc, const yaml_node_t *m, const char *where,
                     ddpd_quota_t *q, unsigned *set, const char *path, ddp_errinfo_t *ei)
{
    if (m->type != YAML_MAPPING_NODE)
        return cfg_error(ei, path, m, "%s: expected a mapping of limits", where);
    for (yaml_node_pair_t *kv = m->data.mapping.pairs.start; kv < m->data.mapping.pairs.top;
         kv++) {
        const yaml_node_t *k = yaml_document_get_node(doc, kv->key);
        const yaml_node_t *v = yaml_document_get_node(doc, kv->value);
        const char *key = k->type == YAML_SCALAR_NODE ? (const char *)k->data.scalar.value : "";
        char name[160], text[64];
        snprintf(name, sizeof name, "%s.%s", where, key);
        double x;
        int64_t bytes;
        long *count = !strcmp(key, "queued_jobs")     ? &q->queued_jobs
                      : !strcmp(key, "running_ranks") ? &q->running_ranks
                                                      : NULL;
        if (count) {
            DDP_CHECK(cfg_number(v, name, 1, &x, path, ei));
            *count = (long)x;
            *set |= count == &q->queued_jobs ? 1u : 2u;
            continue;
        }
        int64_t *dst = !strcmp(key, "log_bytes")           ? &q->log_bytes
                       : !strcmp(key, "metrics_bytes")     ? &q->metrics_bytes
                       : !strcmp(key, "tensorboard_bytes") ? &q->tensorboard_bytes
                                                           : NULL;
        if (!dst) return cfg_error(ei, path, k, "%s: unknown key", name);
        DDP_CHECK(cfg_string(v, name, text, sizeof text, path, ei));
        if (ddp_spec_parse_bytes(text, &bytes) != 0)
            return cfg_error(ei, path, v, "%s: expected a byte count (e.g. 1073741824 or 1GiB), "
                             "got '%s'", name, text);
        *dst = bytes;
        *set |= dst == &q->log_bytes ? 4u : dst == &q->metrics_bytes ? 8u : 16u;
    }
    return 0;
}

/* quotas: {default: QUOTA, users: {NAME_OR_UID: QUOTA, ...}} */
static int cfg_quotas(yaml_document_t *doc, const yaml_node_t *m, ddpd_config_t *cfg,
                      const char *path, ddp_errinfo_t *ei)
{
    if (m->type != YAML_MAPPING_NODE)
        return cfg_error(ei, path, m, "quotas: expected {default: ..., users: ...}");
    for (yaml_node_pair_t *kv = m->data.mapping.pairs.start; kv < m->data.mapping.pairs.top;
         kv++) {
        const yaml_node_t *k = yaml_document_get_node(doc, kv->key);
        const yaml_node_t *v = yaml_document_get_node(doc, kv->value);
        const char *key = k->type == YAML_SCALAR_NODE ? (const char *)k->data.scalar.value : "";
        unsigned set = 0;
        if (!strcmp(key, "default")) {
            DDP_CHECK(cfg_quota(doc, v, "quotas.default", &cfg->quota, &set, path, ei));
            continue;
        }
        if (strcmp(key, "users") != 0) return cfg_error(ei, path, k, "quotas.%s: unknown key", key);
        if (v->type != YAML_MAPPING_NODE)
            return cfg_error(ei, path, v, "quotas.users: expected a mapping of users");
        for (yaml_node_pair_t *u = v->data.mapping.pairs.start; u < v->data.mapping.pairs.top;
             u++) {
            const yaml_node_t *uk = yaml_document_get_node(doc, u->key);
            char user[64], where[96], *end;
            DDP_CHECK(cfg_string(uk, "quotas.users", user, sizeof user, path, ei));
            if (cfg->n_user_quotas >= DDPD_MAX_QUOTA_USERS)
                return cfg_error(ei, path, uk, "quotas.users: more than %d", DDPD_MAX_QUOTA_USERS);
            ddpd_user_quota_t *q = &cfg->user_quotas[cfg->n_user_quotas++];
            memset(q, 0, sizeof *q);
            unsigned long id = strtoul(user, &end, 10);
            struct passwd *pw = NULL;
            if (user[0] && !*end && id < 0xffffffffUL) {
                q->uid = (uint32_t)id; /* a uid, with or without a passwd entry */
            } else if ((pw = getpwnam(user))) {
                q->uid = pw->pw_uid;
            } else {
                return cfg_error(ei, path, uk, "quotas.users.%s: no such user", user);
            }
            snprintf(where, sizeof where, "quotas.users.%s", user);
            DDP_CHECK(cfg_quota(doc, yaml_document_get_node(doc, u->value), where, &q->q, &q->set,
                                path, ei));
        }
    }
    return 0;
}

void ddpd_config_quota(const ddpd_config_t *cfg, uint32_t uid, ddpd_quota_t *out)
{
    *out = cfg->quota;
    for (int i = 0; i < cfg->n_user_quotas; i++) {
        const ddpd_user_quota_t *u = &cfg->user_quotas[i];
        if (u->uid != uid) continue;
        if (u->set & 1u) out->queued_jobs = u->q.queued_jobs;
        if (u->set & 2u) out->running_ranks = u->q.running_ranks;
        if (u->set & 4u) out->log_bytes = u->q.log_bytes;
        if (u->set & 8u) out->metrics_bytes = u->q.metrics_bytes;
        if (u->set & 16u) out->tensorboard_bytes = u->q.tensorboard_bytes;
    }
}

/* One top-level key's value into cfg. */
static int cfg_key(yaml_document_t *doc, const yaml_node_t *k, const yaml_node_t *v,
                   ddpd_config_t *cfg, const char *path, ddp_errinfo_t *ei)
{
#define STR(name, field)                                                                      \
    if (!strcmp(key, name)) return cfg_string(v, name, cfg->field, sizeof cfg->field, path, ei)
    const char *key = k->type == YAML_SCALAR_NODE ? (const char *)k->data.scalar.value : "";
    STR("node_name", node_name);
    STR("socket", socket_path);
    STR("socket_group", socket_group);
    STR("admin_group", admin_group);
    STR("listen", listen);
    STR("advertise", advertise);
    STR("state_dir", state_dir);
    STR("run_dir", run_dir);
    STR("metrics", metrics);
    STR("worker_bin", worker_bin);
    STR("secret_file", secret_file);
#undef STR
    double x;
    if (!strcmp(key, "slots")) {
        DDP_CHECK(cfg_number(v, key, 1, &x, path, ei));
        if (x > 0) cfg->slots = (int)x; /* 0: one per GPU or core (ddpd_config_finish) */
        return 0;
    }
    if (!strcmp(key, "grace_s")) {
        DDP_CHECK(cfg_number(v, key, 0, &x, path, ei));
        if (x > 0) cfg->grace_s = x;
        return 0;
    }
    if (!strcmp(key, "peers")) return cfg_peers(doc, v, cfg, path, ei);
    if (!strcmp(key, "quotas")) return cfg_quotas(doc, v, cfg, path, ei);
    static const char *const page[] = {"private", "public", NULL};
    static const char *const auth[] = {"required", "allow-legacy", NULL};
    static const char *const root[] = {"refuse", "allow", NULL};
    if (!strcmp(key, "status_page")) return cfg_choice(v, key, page, &cfg->status_public, path, ei);
    if (!strcmp(key, "peer_auth")) return cfg_choice(v, key, auth, &cfg->peer_legacy, path, ei);
    if (!strcmp(key, "peer_root_jobs"))
        return cfg_choice(v, key, root, &cfg->peer_root_jobs, path, ei);
    int *count = !strcmp(key, "max_sessions_per_user")     ? &cfg->max_sessions_per_user
                 : !strcmp(key, "max_peer_links_per_addr") ? &cfg->max_peer_links_per_addr
                                                           : NULL;
    if (count) {
        DDP_CHECK(cfg_number(v, key, 1, &x, path, ei));
        if (x < 1) return cfg_error(ei, path, v, "%s: expected an integer >= 1", key);
        *count = (int)x;
        return 0;
    }
    double *secs = !strcmp(key, "reserve_after_s")  ? &cfg->reserve_after_s
                   : !strcmp(key, "runs_keep_days") ? &cfg->runs_keep_days
                                                    : NULL;
    if (secs) return cfg_number(v, key, 0, secs, path, ei);
    return cfg_error(ei, path, k, "%s: unknown key", key);
}

int ddpd_config_load(ddpd_config_t *cfg, const char *path, ddp_errinfo_t *ei)
{
    FILE *f = fopen(path, "re");
    if (!f) {
        int rc = -errno;
        ddp_errinfo_set(ei, rc, "cannot read config: %s", strerror(errno));
        ddp_errinfo_path(ei, "%s", path);
        return rc;
    }
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser)) {
        fclose(f);
        return ddp_errinfo_set(ei, DDP_ENOMEM, "out of memory");
    }
    yaml_parser_set_input_file(&parser, f);
    int rc = 0;
    if (!yaml_parser_load(&parser, &doc)) {
        ddp_errinfo_set(ei, DDP_EFORMAT, "%zu:%zu: %s", parser.problem_mark.line + 1,
                        parser.problem_mark.column + 1,
                        parser.problem ? parser.problem : "not YAML");
        ddp_errinfo_path(ei, "%s", path);
        yaml_parser_delete(&parser);
        fclose(f);
        return DDP_EFORMAT;
    }
    /* the file's values laid over the defaults only when all of them are good */
    ddpd_config_t next = *cfg;
    const yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root && root->type == YAML_MAPPING_NODE) {
        for (yaml_node_pair_t *kv = root->data.mapping.pairs.start;
             rc == 0 && kv < root->data.mapping.pairs.top; kv++)
            rc = cfg_key(&doc, yaml_document_get_node(&doc, kv->key),
                         yaml_document_get_node(&doc, kv->value), &next, path, ei);
    } else if (root && !(root->type == YAML_SCALAR_NODE && !root->data.scalar.length)) {
        rc = cfg_error(ei, path, root, "expected a mapping of settings");
    }
    if (rc == 0) *cfg = next;
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    fclose(f);
    return rc;
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
    /* the name peers know this node by becomes a directory name on them and a word in logs */
    if (!ddp_spec_name_ok(cfg->node_name))
        return ddp_errinfo_set(ei, DDP_EINVAL, "node_name '%s' must use only letters, digits, "
                               "'-', '_' and '.', and start with a letter or digit; set "
                               "node_name (or --node-name)", cfg->node_name);
    for (int i = 0; i < cfg->n_peers; i++)
        if (cfg->peers[i].name[0] && !ddp_spec_name_ok(cfg->peers[i].name))
            return ddp_errinfo_set(ei, DDP_EINVAL, "peers[%d].name '%s' is not a valid node name",
                                   i, cfg->peers[i].name);
    if (cfg->status_public < 0) cfg->status_public = geteuid() != 0;
    if (!cfg->run_dir[0]) {
        int n = snprintf(cfg->run_dir, sizeof cfg->run_dir, "%s/runs", cfg->state_dir);
        if (n >= (int)sizeof cfg->run_dir)
            return ddp_errinfo_set(ei, DDP_EINVAL, "state_dir is too long");
    }
    if (cfg->slots <= 0) {
        /* one slot per GPU where the CUDA module finds some, else one per core */
        long n = ddpd_gpu_count();
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
