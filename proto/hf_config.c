/* Hugging Face GPT-2 config.json (see hf_config.h). */
#include "proto/hf_config.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#define CONFIG_MAX_BYTES (1 << 20)

/* The keys, where they go in ddp_model_cfg_t, the spec field they check, and their range (the
 * spec's own). */
static const struct {
    const char *key, *field;
    size_t off;
    long hi;
} KEYS[] = {
    {"n_layer", "model.n_layer", offsetof(ddp_model_cfg_t, n_layer), 1000},
    {"n_head", "model.n_head", offsetof(ddp_model_cfg_t, n_head), 1024},
    {"n_embd", "model.n_embd", offsetof(ddp_model_cfg_t, n_embd), 65536},
    {"vocab_size", "model.vocab_size", offsetof(ddp_model_cfg_t, vocab_size), 1 << 20},
    {"n_positions", "model.block_size", offsetof(ddp_model_cfg_t, block_size), 1 << 20},
};
#define N_KEYS (sizeof KEYS / sizeof KEYS[0])

static int *cfg_int(ddp_model_cfg_t *cfg, size_t i) { return (int *)((char *)cfg + KEYS[i].off); }

int ddp_hf_config_read(const char *dir, ddp_model_cfg_t *cfg, ddp_errinfo_t *ei)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "re");
    if (!f) {
        int rc = -errno;
        ddp_errinfo_set(ei, rc, "%s: %s", path, strerror(errno));
        return rc;
    }
    json_error_t je;
    json_t *o = json_loadf(f, JSON_REJECT_DUPLICATES, &je);
    fclose(f);
    int rc = 0;
    if (!json_is_object(o)) {
        rc = ddp_errinfo_set(ei, DDP_ESPEC, "%s: not a JSON object (%s, line %d)", path,
                             o ? "another JSON value" : je.text, je.line);
        goto out;
    }
    const char *type = json_string_value(json_object_get(o, "model_type"));
    if (json_object_get(o, "model_type") && (!type || strcmp(type, "gpt2"))) {
        rc = ddp_errinfo_set(ei, DDP_ESPEC, "%s: model_type is %s%s%s, not \"gpt2\"", path,
                             type ? "\"" : "", type ? type : "not a string", type ? "\"" : "");
        goto out;
    }
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < N_KEYS; i++) {
        json_t *v = json_object_get(o, KEYS[i].key);
        const char *key = KEYS[i].key;
        if (!v && !strcmp(key, "n_positions")) v = json_object_get(o, key = "n_ctx");
        if (!json_is_integer(v) || json_integer_value(v) < 1 ||
            json_integer_value(v) > KEYS[i].hi) {
            rc = ddp_errinfo_set(ei, DDP_ESPEC, "%s: %s must be an integer in 1..%ld%s", path,
                                 KEYS[i].key, KEYS[i].hi, v ? "" : ", and it is missing");
            goto out;
        }
        *cfg_int(cfg, i) = (int)json_integer_value(v);
    }
    if (cfg->n_embd % cfg->n_head) {
        rc = ddp_errinfo_set(ei, DDP_ESPEC, "%s: n_embd (%d) must be divisible by n_head (%d)",
                             path, cfg->n_embd, cfg->n_head);
        goto out;
    }
    json_t *inner = json_object_get(o, "n_inner");
    if (inner && !json_is_null(inner) &&
        (!json_is_integer(inner) || json_integer_value(inner) != 4 * (json_int_t)cfg->n_embd))
        rc = ddp_errinfo_set(ei, DDP_ESPEC, "%s: n_inner must be null or 4 * n_embd = %d: this "
                             "GPT-2 has no other MLP width", path, 4 * cfg->n_embd);
out:
    json_decref(o);
    if (rc) ddp_errinfo_path(ei, "model.init_from");
    return rc;
}

int ddp_spec_resolve_model(ddp_spec_t *s, ddp_errinfo_t *ei)
{
    if (!s->init_from[0]) return 0;
    int from_config = s->model.n_layer == 0; /* proto/spec.c leaves it so */
    ddp_model_cfg_t c;
    int rc = ddp_hf_config_read(s->init_from, &c, ei);
    if (rc == -ENOENT && !from_config) {
        ddp_errinfo_clear(ei); /* the spec says the model; there is nothing to check it against */
    } else if (rc == -ENOENT) {
        ddp_errinfo_set(ei, DDP_ESPEC, "%s/config.json does not exist: add model.preset or "
                        "the dimensions (n_layer, n_head, n_embd, vocab_size, block_size)",
                        s->init_from);
        ddp_errinfo_path(ei, "model.init_from");
        return DDP_ESPEC;
    } else if (rc) {
        return rc;
    } else if (from_config) {
        s->model = c;
    } else {
        for (size_t i = 0; i < N_KEYS; i++) {
            int want = *cfg_int(&c, i), have = *cfg_int(&s->model, i);
            if (want == have) continue;
            if (s->preset[0]) {
                ddp_errinfo_set(ei, DDP_ESPEC, "%s has %s %d, but %s/config.json says %s %d "
                                "(model.init_from): drop the preset to take the model from "
                                "config.json", s->preset, KEYS[i].field + 6, have, s->init_from,
                                KEYS[i].key, want);
                ddp_errinfo_path(ei, "model.preset");
            } else {
                ddp_errinfo_set(ei, DDP_ESPEC, "is %d, but %s/config.json says %s %d "
                                "(model.init_from): drop the dimensions to take them from "
                                "config.json", have, s->init_from, KEYS[i].key, want);
                ddp_errinfo_path(ei, "%s", KEYS[i].field);
            }
            return DDP_ESPEC;
        }
    }
    /* the rules of proto/spec.c that need the model */
    if (s->seq_len == 0) s->seq_len = s->model.block_size;
    if (s->seq_len > s->model.block_size) {
        ddp_errinfo_set(ei, DDP_ESPEC, "must be <= the block_size of %s/config.json (%d), got %d",
                        s->init_from, s->model.block_size, s->seq_len);
        ddp_errinfo_path(ei, "train.seq_len");
        return DDP_ESPEC;
    }
    long per = (long)s->micro_batch * s->seq_len;
    if (s->global_batch_tokens % per) {
        ddp_errinfo_set(ei, DDP_ESPEC, "must be 0 or a multiple of train.micro_batch * "
                        "train.seq_len = %ld, got %ld", per, s->global_batch_tokens);
        ddp_errinfo_path(ei, "train.global_batch_tokens");
        return DDP_ESPEC;
    }
    return 0;
}
