/* Hugging Face config.json, read and written (see hf_config.h). */
#include "proto/hf_config.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/alloc.h"
#include "common/file.h"

#define CONFIG_MAX_BYTES (1 << 20) /* a config.json is a few KiB */

/* The keys of each architecture that carry an integer of ddp_model_cfg_t: config.json's name,
 * the spec field it checks, where it goes, its range (the spec's own), and whether it may be
 * absent (then it is left as set before: num_key_value_heads = num_attention_heads). */
typedef struct {
    const char *key, *field;
    size_t off;
    long hi;
    int optional;
} int_key_t;

#define INT_KEY(k, f, m, hi, opt) {k, f, offsetof(ddp_model_cfg_t, m), hi, opt}
static const int_key_t GPT2_KEYS[] = {
    INT_KEY("n_layer", "model.n_layer", n_layer, 1000, 0),
    INT_KEY("n_head", "model.n_head", n_head, 1024, 0),
    INT_KEY("n_embd", "model.n_embd", n_embd, 65536, 0),
    INT_KEY("vocab_size", "model.vocab_size", vocab_size, 1 << 20, 0),
    INT_KEY("n_positions", "model.block_size", block_size, 1 << 20, 0),
};
static const int_key_t LLAMA_KEYS[] = {
    INT_KEY("num_hidden_layers", "model.n_layer", n_layer, 1000, 0),
    INT_KEY("num_attention_heads", "model.n_head", n_head, 1024, 0),
    INT_KEY("hidden_size", "model.n_embd", n_embd, 65536, 0),
    INT_KEY("vocab_size", "model.vocab_size", vocab_size, 1 << 20, 0),
    INT_KEY("max_position_embeddings", "model.block_size", block_size, 1 << 24, 0),
    INT_KEY("num_key_value_heads", "model.config", n_kv_head, 1024, 1),
    INT_KEY("intermediate_size", "model.config", intermediate_size, 1 << 20, 0),
};
#undef INT_KEY
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

static int *cfg_int(ddp_model_cfg_t *cfg, const int_key_t *k)
{
    return (int *)((char *)cfg + k->off);
}

/* The number at key k of o (integer or real), or `dflt` when absent; -1 in *bad when present
 * but not a number. */
static double num_or(json_t *o, const char *k, double dflt, int *bad)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v)) return dflt;
    if (!json_is_number(v)) *bad = 1;
    return json_number_value(v);
}

/* A boolean key that must be absent, null or false, else the refusal `why`. */
static int must_be_off(json_t *o, const char *key, const char *name, const char *why,
                       ddp_errinfo_t *ei)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v) || json_is_false(v)) return 0;
    return ddp_errinfo_set(ei, DDP_ESPEC, "%s: %s is %s: %s", name, key,
                           json_is_true(v) ? "true" : "set", why);
}

/* RoPE: rope_theta and rope_scaling (transformers 4), or rope_parameters (transformers 5). */
static int parse_rope(json_t *o, const char *name, ddp_model_cfg_t *c, ddp_errinfo_t *ei)
{
    json_t *params = json_object_get(o, "rope_parameters");
    json_t *scaling = params ? params : json_object_get(o, "rope_scaling");
    const char *skey = params ? "rope_parameters" : "rope_scaling";
    int bad = 0;
    c->rope_theta = num_or(params ? params : o, "rope_theta", 10000.0, &bad);
    if (bad || !(c->rope_theta > 1.0))
        return ddp_errinfo_set(ei, DDP_ESPEC, "%s: %srope_theta must be a number > 1", name,
                               params ? "rope_parameters." : "");
    if (!scaling || json_is_null(scaling)) return 0;
    if (!json_is_object(scaling))
        return ddp_errinfo_set(ei, DDP_ESPEC, "%s: %s must be an object or null", name, skey);
    const char *type = json_string_value(json_object_get(scaling, "rope_type"));
    if (!type) type = json_string_value(json_object_get(scaling, "type"));
    if (!type || !strcmp(type, "default")) return 0;
    if (strcmp(type, "llama3"))
        return ddp_errinfo_set(ei, DDP_ESPEC, "%s: %s.rope_type \"%s\" is not implemented "
                               "(only \"default\" and Llama 3's \"llama3\")", name, skey, type);
    c->rope_factor = num_or(scaling, "factor", 0, &bad);
    c->rope_low_freq_factor = num_or(scaling, "low_freq_factor", 0, &bad);
    c->rope_high_freq_factor = num_or(scaling, "high_freq_factor", 0, &bad);
    double orig = num_or(scaling, "original_max_position_embeddings", 0, &bad);
    if (bad || !(c->rope_factor >= 1) || !(c->rope_low_freq_factor > 0) ||
        !(c->rope_high_freq_factor > c->rope_low_freq_factor) || !(orig >= 1) ||
        orig > (1 << 24) || orig != floor(orig))
        return ddp_errinfo_set(ei, DDP_ESPEC, "%s: %s (llama3) needs factor >= 1, 0 < "
                               "low_freq_factor < high_freq_factor and an integer "
                               "original_max_position_embeddings >= 1", name, skey);
    c->rope_original_max = (int)orig;
    return 0;
}

/* The Llama family's keys beyond the integers: what is implemented, and what is refused. */
static int parse_llama(json_t *o, const char *name, int qwen2, ddp_model_cfg_t *c,
                       ddp_errinfo_t *ei)
{
    c->arch = DDP_ARCH_LLAMA;
    c->qwen2 = qwen2;
    c->attention_bias = qwen2; /* Qwen2's q/k/v always have biases, its o_proj none */
    const char *act = json_string_value(json_object_get(o, "hidden_act"));
    if (json_object_get(o, "hidden_act") && (!act || strcmp(act, "silu")))
        return ddp_errinfo_set(ei, DDP_ESPEC, "%s: hidden_act must be \"silu\" (SwiGLU)", name);
    if (!qwen2)
        DDP_CHECK(must_be_off(o, "attention_bias", name, "biases on q/k/v/o are not "
                              "implemented for Llama (Qwen2's q/k/v biases are)", ei));
    DDP_CHECK(must_be_off(o, "mlp_bias", name, "MLP biases are not implemented", ei));
    DDP_CHECK(must_be_off(o, "use_sliding_window", name, "sliding-window attention is not "
                          "implemented", ei));
    json_t *hd = json_object_get(o, "head_dim");
    if (hd && !json_is_null(hd) &&
        (!json_is_integer(hd) || json_integer_value(hd) != c->n_embd / c->n_head))
        return ddp_errinfo_set(ei, DDP_ESPEC, "%s: head_dim must be hidden_size / "
                               "num_attention_heads = %d", name, c->n_embd / c->n_head);
    if (c->n_kv_head == 0) c->n_kv_head = c->n_head;
    if (c->n_head % c->n_kv_head)
        return ddp_errinfo_set(ei, DDP_ESPEC, "%s: num_key_value_heads (%d) must divide "
                               "num_attention_heads (%d)", name, c->n_kv_head, c->n_head);
    if ((c->n_embd / c->n_head) % 2)
        return ddp_errinfo_set(ei, DDP_ESPEC, "%s: the head size hidden_size / "
                               "num_attention_heads (%d) must be even (RoPE)", name,
                               c->n_embd / c->n_head);
    int bad = 0;
    c->norm_eps = num_or(o, "rms_norm_eps", 1e-6, &bad);
    if (bad || !(c->norm_eps > 0) || c->norm_eps > 1)
        return ddp_errinfo_set(ei, DDP_ESPEC, "%s: rms_norm_eps must be a number in (0, 1]",
                               name);
    json_t *tie = json_object_get(o, "tie_word_embeddings");
    if (tie && !json_is_boolean(tie))
        return ddp_errinfo_set(ei, DDP_ESPEC, "%s: tie_word_embeddings must be true or false",
                               name);
    c->tie_embeddings = json_is_true(tie);
    return parse_rope(o, name, c, ei);
}

static int parse_object(json_t *o, const char *name, ddp_model_cfg_t *cfg, ddp_errinfo_t *ei)
{
    const char *type = json_string_value(json_object_get(o, "model_type"));
    if (json_object_get(o, "model_type") && !type)
        return ddp_errinfo_set(ei, DDP_ESPEC, "%s: model_type must be a string", name);
    int gpt2 = !type || !strcmp(type, "gpt2");
    int qwen2 = type && !strcmp(type, "qwen2");
    if (!gpt2 && !qwen2 && strcmp(type, "llama"))
        return ddp_errinfo_set(ei, DDP_ESPEC, "%s: model_type \"%s\" is not implemented "
                               "(\"gpt2\", \"llama\" and \"qwen2\" are)", name, type);
    const int_key_t *keys = gpt2 ? GPT2_KEYS : LLAMA_KEYS;
    size_t nkeys = gpt2 ? N_OF(GPT2_KEYS) : N_OF(LLAMA_KEYS);
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < nkeys; i++) {
        const char *key = keys[i].key;
        json_t *v = json_object_get(o, key);
        if (!v && gpt2 && !strcmp(key, "n_positions")) v = json_object_get(o, key = "n_ctx");
        if (!v && keys[i].optional) continue;
        if (!json_is_integer(v) || json_integer_value(v) < 1 ||
            json_integer_value(v) > keys[i].hi)
            return ddp_errinfo_set(ei, DDP_ESPEC, "%s: %s must be an integer in 1..%ld%s", name,
                                   keys[i].key, keys[i].hi, v ? "" : ", and it is missing");
        *cfg_int(cfg, &keys[i]) = (int)json_integer_value(v);
    }
    if (cfg->n_embd % cfg->n_head)
        return ddp_errinfo_set(ei, DDP_ESPEC, "%s: %s (%d) must be divisible by %s (%d)", name,
                               keys[2].key, cfg->n_embd, keys[1].key, cfg->n_head);
    if (!gpt2) return parse_llama(o, name, qwen2, cfg, ei);
    json_t *inner = json_object_get(o, "n_inner");
    if (inner && !json_is_null(inner) &&
        (!json_is_integer(inner) || json_integer_value(inner) != 4 * (json_int_t)cfg->n_embd))
        return ddp_errinfo_set(ei, DDP_ESPEC, "%s: n_inner must be null or 4 * n_embd = %d: "
                               "GPT-2 has no other MLP width here", name, 4 * cfg->n_embd);
    return 0;
}

int ddp_hf_config_parse(const char *text, const char *name, ddp_model_cfg_t *cfg,
                        ddp_errinfo_t *ei)
{
    json_error_t je;
    json_t *o = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    int rc;
    if (!json_is_object(o))
        rc = ddp_errinfo_set(ei, DDP_ESPEC, "%s: not a JSON object (%s, line %d)", name,
                             o ? "another JSON value" : je.text, je.line);
    else
        rc = parse_object(o, name, cfg, ei);
    json_decref(o);
    return rc;
}

int ddp_hf_config_read(const char *path, ddp_model_cfg_t *cfg, ddp_errinfo_t *ei)
{
    char file[4200], *text = NULL;
    struct stat st;
    int is_dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    snprintf(file, sizeof file, "%s%s", path, is_dir ? "/config.json" : "");
    int rc = ddp_file_read(file, CONFIG_MAX_BYTES, &text, NULL);
    if (rc) {
        ddp_errinfo_set(ei, rc, "%s: %s", file, ddp_strerror(rc));
        return rc;
    }
    rc = ddp_hf_config_parse(text, file, cfg, ei);
    free(text);
    return rc;
}

/* ---- writing ---------------------------------------------------------------------------- */

ddp_hf_ids_t ddp_hf_default_ids(const ddp_model_cfg_t *cfg)
{
    /* the start token of sampling: newline for byte-level models, <|endoftext|> for BPE */
    long eot = cfg->vocab_size == 256 ? '\n' : cfg->vocab_size - 1;
    if (cfg->arch == DDP_ARCH_LLAMA && cfg->vocab_size != 256) eot = -1;
    return (ddp_hf_ids_t){eot, eot};
}

static json_t *gpt2_json(const ddp_model_cfg_t *cfg)
{
    return json_pack(
        "{s:[s], s:s, s:s, s:f, s:f, s:f, s:f, s:f, s:i, s:i, s:i, s:n, s:i, s:i, "
        "s:i, s:b, s:b, s:b, s:s, s:s}",
        "architectures", "GPT2LMHeadModel", "model_type", "gpt2", "activation_function",
        "gelu_new", "attn_pdrop", 0.0, "embd_pdrop", 0.0, "resid_pdrop", 0.0,
        "initializer_range", 0.02, "layer_norm_epsilon", 1e-5, "n_ctx",
        cfg->block_size, "n_embd", cfg->n_embd, "n_head", cfg->n_head, "n_inner", "n_layer",
        cfg->n_layer, "n_positions", cfg->block_size, "vocab_size", cfg->vocab_size,
        "tie_word_embeddings", 1, "scale_attn_weights", 1, "use_cache", 1, "torch_dtype",
        "float32", "transformers_version", "4.40.0");
}

static json_t *llama_json(const ddp_model_cfg_t *c)
{
    json_t *o = json_pack(
        "{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:b, s:s, s:f, s:f, "
        "s:b, s:s, s:s}",
        "architectures", c->qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM", "model_type",
        c->qwen2 ? "qwen2" : "llama", "hidden_size", c->n_embd, "intermediate_size",
        c->intermediate_size, "num_hidden_layers", c->n_layer, "num_attention_heads", c->n_head,
        "num_key_value_heads", c->n_kv_head, "head_dim", c->n_embd / c->n_head, "vocab_size",
        c->vocab_size, "max_position_embeddings", c->block_size, "rms_norm_eps", c->norm_eps,
        "rope_theta", c->rope_theta, "tie_word_embeddings", c->tie_embeddings, "hidden_act",
        "silu", "attention_dropout", 0.0, "initializer_range", 0.02, "use_cache", 1,
        "torch_dtype", "float32", "transformers_version", "4.46.0");
    if (!o) return NULL;
    if (!c->qwen2) {
        json_object_set_new(o, "attention_bias", json_false());
        json_object_set_new(o, "mlp_bias", json_false());
    } else {
        json_object_set_new(o, "use_sliding_window", json_false());
    }
    json_t *scaling = c->rope_factor > 0
                          ? json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3",
                                      "factor", c->rope_factor, "low_freq_factor",
                                      c->rope_low_freq_factor, "high_freq_factor",
                                      c->rope_high_freq_factor,
                                      "original_max_position_embeddings", c->rope_original_max)
                          : json_null();
    if (!scaling || json_object_set_new(o, "rope_scaling", scaling)) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Sets bos_token_id and eos_token_id of o to ids's, leaving out those that are -1. Returns o,
 * or NULL (o released) when out of memory. */
static json_t *set_ids(json_t *o, const ddp_hf_ids_t *ids)
{
    if (!o) return NULL;
    const char *keys[] = {"bos_token_id", "eos_token_id"};
    long v[] = {ids->bos, ids->eos};
    for (int i = 0; i < 2; i++)
        if (v[i] >= 0 && json_object_set_new(o, keys[i], json_integer(v[i]))) {
            json_decref(o);
            return NULL;
        }
    return o;
}

/* o as indented text with sorted keys, ddp_malloc'd; releases o. NULL when out of memory. */
static char *dump(json_t *o)
{
    if (!o) return NULL;
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(o);
    char *out = text ? ddp_strdup(text) : NULL;
    free(text);
    return out;
}

char *ddp_hf_config_json_ids(const ddp_model_cfg_t *cfg, const ddp_hf_ids_t *ids)
{
    ddp_hf_ids_t def = ddp_hf_default_ids(cfg);
    json_t *o = cfg->arch == DDP_ARCH_LLAMA ? llama_json(cfg) : gpt2_json(cfg);
    return dump(set_ids(o, ids ? ids : &def));
}

char *ddp_hf_config_json(const ddp_model_cfg_t *cfg) { return ddp_hf_config_json_ids(cfg, NULL); }

char *ddp_hf_generation_config_json(const ddp_model_cfg_t *cfg, const ddp_hf_ids_t *ids)
{
    ddp_hf_ids_t def = ddp_hf_default_ids(cfg);
    json_t *o = json_pack("{s:b, s:s}", "_from_model_config", 1, "transformers_version",
                          "4.46.0");
    return dump(set_ids(o, ids ? ids : &def));
}

/* ---- comparing -------------------------------------------------------------------------- */

/* ddp_hf_config_diff, with *field the spec field that gives the differing key ("model.n_embd";
 * "model.config" for the keys only a config gives). */
static int diff_field(const ddp_model_cfg_t *a, const ddp_model_cfg_t *b, char *what, size_t n,
                      const char **field)
{
    *field = "model.config";
    if (a->arch != b->arch) {
        snprintf(what, n, "model_type is %s and %s", a->arch ? "llama" : "gpt2",
                 b->arch ? "llama" : "gpt2");
        return 1;
    }
    const int_key_t *keys = a->arch == DDP_ARCH_GPT2 ? GPT2_KEYS : LLAMA_KEYS;
    size_t nkeys = a->arch == DDP_ARCH_GPT2 ? N_OF(GPT2_KEYS) : N_OF(LLAMA_KEYS);
    for (size_t i = 0; i < nkeys; i++) {
        int x = *cfg_int((ddp_model_cfg_t *)a, &keys[i]);
        int y = *cfg_int((ddp_model_cfg_t *)b, &keys[i]);
        if (x != y) {
            snprintf(what, n, "%s is %d and %d", keys[i].key, x, y);
            *field = keys[i].field;
            return 1;
        }
    }
    if (a->arch == DDP_ARCH_GPT2) return 0;
    const struct {
        const char *key;
        double x, y;
    } d[] = {
        {"tie_word_embeddings", a->tie_embeddings, b->tie_embeddings},
        {"model_type qwen2", a->qwen2, b->qwen2},
        {"rms_norm_eps", a->norm_eps, b->norm_eps},
        {"rope_theta", a->rope_theta, b->rope_theta},
        {"rope_scaling.factor", a->rope_factor, b->rope_factor},
        {"rope_scaling.low_freq_factor", a->rope_low_freq_factor, b->rope_low_freq_factor},
        {"rope_scaling.high_freq_factor", a->rope_high_freq_factor, b->rope_high_freq_factor},
        {"rope_scaling.original_max_position_embeddings", a->rope_original_max,
         b->rope_original_max},
    };
    for (size_t i = 0; i < N_OF(d); i++) {
        if (d[i].x == d[i].y) continue;
        snprintf(what, n, "%s is %g and %g", d[i].key, d[i].x, d[i].y);
        return 1;
    }
    return 0;
}

int ddp_hf_config_diff(const ddp_model_cfg_t *a, const ddp_model_cfg_t *b, char *what, size_t n)
{
    const char *field;
    return diff_field(a, b, what, n, &field);
}

/* ---- the spec's model from files -------------------------------------------------------- */

int ddp_spec_resolve_model(ddp_spec_t *s, ddp_errinfo_t *ei)
{
    if (!s->init_from[0] && !s->config[0]) return 0;
    int rc;
    if (s->config[0]) { /* proto/spec_rules.c refuses it beside a preset or dimensions */
        rc = ddp_hf_config_read(s->config, &s->model, ei);
        if (rc) {
            ddp_errinfo_path(ei, "model.config");
            return rc == -ENOENT ? DDP_ESPEC : rc;
        }
    }
    int known = s->model.n_layer != 0; /* proto/spec_rules.c leaves it 0 for init_from alone */
    if (s->init_from[0]) {
        ddp_model_cfg_t c;
        char what[160];
        const char *field;
        rc = ddp_hf_config_read(s->init_from, &c, ei);
        if (rc == -ENOENT && known) {
            ddp_errinfo_clear(ei); /* the spec says the model; nothing to check it against */
        } else if (rc == -ENOENT) {
            ddp_errinfo_set(ei, DDP_ESPEC, "%s/config.json does not exist: add model.preset, "
                            "model.config or the dimensions (n_layer, n_head, n_embd, "
                            "vocab_size, block_size)", s->init_from);
            ddp_errinfo_path(ei, "model.init_from");
            return DDP_ESPEC;
        } else if (rc) {
            ddp_errinfo_path(ei, "model.init_from");
            return rc;
        } else if (!known) {
            s->model = c;
        } else if (diff_field(&s->model, &c, what, sizeof what, &field)) {
            /* the field that gave the model: model.config, model.preset or a dimension */
            const char *by = s->config[0] ? "model.config" : s->preset[0] ? "model.preset" : field;
            const char *what_by = s->config[0] ? s->config : s->preset[0] ? s->preset : "";
            ddp_errinfo_set(ei, DDP_ESPEC, "%s%sdisagrees with %s/config.json (model.init_from): "
                            "%s (this spec's first); drop %s to take the model from init_from",
                            what_by, what_by[0] ? " " : "", s->init_from, what,
                            s->config[0] || s->preset[0] ? by : "the dimensions");
            ddp_errinfo_path(ei, "%s", by);
            return DDP_ESPEC;
        }
    }
    /* the rules of proto/spec_rules.c that need the model */
    if (s->seq_len == 0) s->seq_len = s->model.block_size;
    if (s->seq_len > s->model.block_size) {
        ddp_errinfo_set(ei, DDP_ESPEC, "must be <= the model's block_size (%d, from its "
                        "config.json), got %d", s->model.block_size, s->seq_len);
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
