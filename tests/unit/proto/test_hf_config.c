/* Unit tests of Hugging Face config.json (proto/hf_config.h): every preset round-trips through
 * the written config.json; configs as transformers 4 and 5 write them parse to the model they
 * describe; what ddpd does not implement is refused by its key; a spec's model.config gives the
 * model and cannot be combined with a preset; a checkpoint's config.json tells another model
 * apart by key; the token ids of config.json and generation_config.json. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "proto/hf_config.h"
#include "proto/spec_int.h"

static int parse_text(const char *text, ddp_model_cfg_t *cfg, ddp_errinfo_t *ei)
{
    return ddp_hf_config_parse(text, "config.json", cfg, ei);
}

static void test_presets_round_trip(void **state)
{
    (void)state;
    for (size_t i = 0; i < ddp__spec_n_presets; i++) {
        const ddp_model_cfg_t *want = &ddp__spec_presets[i].cfg;
        char *text = ddp_hf_config_json(want);
        assert_non_null(text);
        ddp_model_cfg_t got;
        ddp_errinfo_t ei = {0};
        int rc = parse_text(text, &got, &ei);
        if (rc) print_error("%s: %s\n", ddp__spec_presets[i].name, ei.msg);
        assert_int_equal(rc, 0);
        char what[160] = "";
        if (ddp_hf_config_diff(want, &got, what, sizeof what))
            print_error("%s: %s\n", ddp__spec_presets[i].name, what);
        assert_memory_equal(want, &got, sizeof got);
        free(text);
    }
}

/* SmolLM2-135M's config.json as published (transformers 4), less a few unused keys. */
static const char SMOLLM2[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, "
    "\"attention_dropout\": 0.0, \"bos_token_id\": 0, \"eos_token_id\": 0, \"hidden_act\": "
    "\"silu\", \"hidden_size\": 576, \"initializer_range\": 0.041666666666666664, "
    "\"intermediate_size\": 1536, \"is_llama_config\": true, \"max_position_embeddings\": 8192, "
    "\"mlp_bias\": false, \"model_type\": \"llama\", \"num_attention_heads\": 9, "
    "\"num_hidden_layers\": 30, \"num_key_value_heads\": 3, \"pretraining_tp\": 1, "
    "\"rms_norm_eps\": 1e-05, \"rope_interleaved\": false, \"rope_scaling\": null, "
    "\"rope_theta\": 100000, \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\", "
    "\"transformers_version\": \"4.42.3\", \"use_cache\": true, \"vocab_size\": 49152}";

static void test_published_configs(void **state)
{
    (void)state;
    ddp_model_cfg_t c, p;
    ddp_errinfo_t ei = {0};
    assert_int_equal(parse_text(SMOLLM2, &c, &ei), 0);
    assert_int_equal(ddp_spec_preset("smollm2-135m", &p), 0);
    assert_memory_equal(&c, &p, sizeof c);
    /* Llama 3.2's scaling, as transformers 5 writes it (rope_parameters) */
    const char *l3 =
        "{\"model_type\": \"llama\", \"hidden_size\": 2048, \"intermediate_size\": 8192, "
        "\"num_hidden_layers\": 16, \"num_attention_heads\": 32, \"num_key_value_heads\": 8, "
        "\"vocab_size\": 128256, \"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-05, "
        "\"tie_word_embeddings\": true, \"head_dim\": 64, \"rope_parameters\": {\"rope_type\": "
        "\"llama3\", \"rope_theta\": 500000.0, \"factor\": 32.0, \"low_freq_factor\": 1.0, "
        "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}}";
    assert_int_equal(parse_text(l3, &c, &ei), 0);
    assert_int_equal(ddp_spec_preset("llama-3.2-1b", &p), 0);
    assert_memory_equal(&c, &p, sizeof c);
    /* Qwen2: q/k/v biases; a sliding window that is off passes */
    const char *qw =
        "{\"model_type\": \"qwen2\", \"hidden_size\": 896, \"intermediate_size\": 4864, "
        "\"num_hidden_layers\": 24, \"num_attention_heads\": 14, \"num_key_value_heads\": 2, "
        "\"vocab_size\": 151936, \"max_position_embeddings\": 32768, \"rms_norm_eps\": 1e-06, "
        "\"rope_theta\": 1000000.0, \"tie_word_embeddings\": true, \"use_sliding_window\": "
        "false, \"sliding_window\": 32768, \"max_window_layers\": 21}";
    assert_int_equal(parse_text(qw, &c, &ei), 0);
    assert_int_equal(ddp_spec_preset("qwen2.5-0.5b", &p), 0);
    assert_memory_equal(&c, &p, sizeof c);
    /* num_key_value_heads absent: multi-head attention; tie absent: untied (Llama's default) */
    const char *mha = "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": "
                      "160, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                      "\"vocab_size\": 256, \"max_position_embeddings\": 64}";
    assert_int_equal(parse_text(mha, &c, &ei), 0);
    assert_int_equal(c.n_kv_head, 4);
    assert_int_equal(c.tie_embeddings, 0);
    assert_true(c.norm_eps == 1e-6 && c.rope_theta == 10000.0);
}

/* Each config is SMOLLM2 with one key's text replaced; the error names `key`. */
static void refused(const char *from, const char *to, const char *key)
{
    char text[sizeof SMOLLM2 + 256];
    const char *at = strstr(SMOLLM2, from);
    assert_non_null(at);
    snprintf(text, sizeof text, "%.*s%s%s", (int)(at - SMOLLM2), SMOLLM2, to,
             at + strlen(from));
    ddp_model_cfg_t c;
    ddp_errinfo_t ei = {0};
    assert_int_equal(parse_text(text, &c, &ei), DDP_ESPEC);
    if (!strstr(ei.msg, key)) print_error("'%s' does not name %s\n", ei.msg, key);
    assert_non_null(strstr(ei.msg, key));
}

static void test_refusals(void **state)
{
    (void)state;
    refused("\"model_type\": \"llama\"", "\"model_type\": \"mixtral\"", "model_type \"mixtral\"");
    refused("\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}",
            "rope_scaling.rope_type \"yarn\"");
    refused("\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"llama3\"}",
            "rope_scaling");
    refused("\"attention_bias\": false", "\"attention_bias\": true", "attention_bias");
    refused("\"mlp_bias\": false", "\"mlp_bias\": true", "mlp_bias");
    refused("\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", "hidden_act");
    refused("\"num_key_value_heads\": 3", "\"num_key_value_heads\": 4", "num_key_value_heads");
    refused("\"num_key_value_heads\": 3", "\"head_dim\": 128", "head_dim");
    refused("\"hidden_size\": 576, ", "", "hidden_size");
    refused("\"rms_norm_eps\": 1e-05", "\"rms_norm_eps\": \"small\"", "rms_norm_eps");
    refused("\"tie_word_embeddings\": true", "\"tie_word_embeddings\": 1",
            "tie_word_embeddings");
    refused("\"model_type\": \"llama\"", "\"model_type\": \"qwen2\", \"use_sliding_window\": true",
            "use_sliding_window");
}

static void test_spec_model_config(void **state)
{
    (void)state;
    char dir[] = "/tmp/ddp_hfcfg_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(SMOLLM2, f);
    fclose(f);
    char text[512];
    ddp_spec_t s;
    ddp_errinfo_t ei = {0};
    /* the directory or the file; seq_len defaults to the config's block_size */
    for (int file = 0; file < 2; file++) {
        snprintf(text, sizeof text, "model: {config: %s}\ndata: {train: x}\n",
                 file ? path : dir);
        assert_int_equal(ddp_spec_parse(&s, text, strlen(text), "<t>", &ei), 0);
        assert_int_equal(ddp_spec_resolve_model(&s, &ei), 0);
        assert_int_equal(s.model.arch, DDP_ARCH_LLAMA);
        assert_int_equal(s.model.n_kv_head, 3);
        assert_int_equal(s.seq_len, 8192);
    }
    /* beside a preset: refused by the parser, naming model.config */
    snprintf(text, sizeof text, "model: {preset: gpt2-tiny, config: %s}\ndata: {train: x}\n",
             dir);
    assert_int_equal(ddp_spec_parse(&s, text, strlen(text), "<t>", &ei), DDP_ESPEC);
    assert_string_equal(ei.path, "model.config");
    /* init_from with another model than model.config: named */
    char other[] = "/tmp/ddp_hfcfg_XXXXXX";
    assert_non_null(mkdtemp(other));
    char opath[128];
    snprintf(opath, sizeof opath, "%s/config.json", other);
    char *tiny = NULL;
    ddp_model_cfg_t lt;
    assert_int_equal(ddp_spec_preset("llama-tiny", &lt), 0);
    tiny = ddp_hf_config_json(&lt);
    f = fopen(opath, "w");
    assert_non_null(f);
    fputs(tiny, f);
    fclose(f);
    free(tiny);
    snprintf(text, sizeof text, "model: {config: %s, init_from: %s}\ndata: {train: x}\n"
             "train: {seq_len: 64}\n", dir, other);
    assert_int_equal(ddp_spec_parse(&s, text, strlen(text), "<t>", &ei), 0);
    assert_int_equal(ddp_spec_resolve_model(&s, &ei), DDP_ESPEC);
    assert_string_equal(ei.path, "model.config");
    assert_non_null(strstr(ei.msg, "num_hidden_layers is 30 and 2"));
    /* a config that is not there */
    snprintf(text, sizeof text, "model: {config: %s/nothing.json}\ndata: {train: x}\n", dir);
    assert_int_equal(ddp_spec_parse(&s, text, strlen(text), "<t>", &ei), 0);
    assert_int_equal(ddp_spec_resolve_model(&s, &ei), DDP_ESPEC);
    assert_string_equal(ei.path, "model.config");
    unlink(path);
    unlink(opath);
    rmdir(dir);
    rmdir(other);
}

static void test_diff_names_the_key(void **state)
{
    (void)state;
    ddp_model_cfg_t a, b;
    assert_int_equal(ddp_spec_preset("llama-3.2-1b", &a), 0);
    b = a;
    char what[160];
    assert_int_equal(ddp_hf_config_diff(&a, &b, what, sizeof what), 0);
    b.rope_factor = 8;
    assert_int_equal(ddp_hf_config_diff(&a, &b, what, sizeof what), 1);
    assert_string_equal(what, "rope_scaling.factor is 32 and 8");
    assert_int_equal(ddp_spec_preset("gpt2-124M", &b), 0);
    assert_int_equal(ddp_hf_config_diff(&a, &b, what, sizeof what), 1);
    assert_string_equal(what, "model_type is llama and gpt2");
}

/* The ids of o's key (-1 when absent). */
static long id_of(const char *text, const char *key)
{
    const char *p = strstr(text, key);
    return p ? strtol(p + strlen(key) + 3, NULL, 10) : -1; /* "key": N */
}

/* bos_token_id / eos_token_id: the model's defaults (GPT-2's end of text, a byte-level Llama's
 * newline, none for another Llama) in config.json and generation_config.json alike, a
 * tokenizer's ids instead when given, and -1 left out. */
static void test_token_ids(void **state)
{
    (void)state;
    static const struct {
        const char *preset;
        long id;
    } want[] = {{"gpt2-124M", 50256}, {"gpt2-tiny", 10}, {"llama-tiny", 10},
                {"smollm2-135m", -1}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        ddp_model_cfg_t c;
        assert_int_equal(ddp_spec_preset(want[i].preset, &c), 0);
        ddp_hf_ids_t d = ddp_hf_default_ids(&c);
        char *cfg = ddp_hf_config_json(&c), *gen = ddp_hf_generation_config_json(&c, NULL);
        assert_non_null(cfg);
        assert_non_null(gen);
        if (d.bos != want[i].id || id_of(cfg, "\"bos_token_id") != want[i].id ||
            id_of(cfg, "\"eos_token_id") != want[i].id ||
            id_of(gen, "\"bos_token_id") != want[i].id ||
            id_of(gen, "\"eos_token_id") != want[i].id)
            fail_msg("%s: want %ld in both files, default %ld/%ld:\n%s\n%s", want[i].preset,
                     want[i].id, d.bos, d.eos, cfg, gen);
        free(cfg);
        free(gen);
    }
    ddp_model_cfg_t c;
    assert_int_equal(ddp_spec_preset("smollm2-135m", &c), 0);
    ddp_hf_ids_t ids = {.bos = 1, .eos = 2};
    char *cfg = ddp_hf_config_json_ids(&c, &ids), *gen = ddp_hf_generation_config_json(&c, &ids);
    assert_int_equal(id_of(cfg, "\"bos_token_id"), 1);
    assert_int_equal(id_of(cfg, "\"eos_token_id"), 2);
    assert_string_equal(gen, "{\n  \"_from_model_config\": true,\n  \"bos_token_id\": 1,\n  "
                             "\"eos_token_id\": 2,\n  \"transformers_version\": \"4.46.0\"\n}");
    ddp_model_cfg_t back;
    ddp_errinfo_t ei = {0};
    assert_int_equal(parse_text(cfg, &back, &ei), 0); /* the ids change nothing of the model */
    assert_memory_equal(&c, &back, sizeof c);
    free(cfg);
    free(gen);
    ids = (ddp_hf_ids_t){.bos = -1, .eos = 7}; /* a tokenizer without BOS */
    assert_int_equal(ddp_spec_preset("gpt2-124M", &c), 0);
    cfg = ddp_hf_config_json_ids(&c, &ids);
    gen = ddp_hf_generation_config_json(&c, &ids);
    assert_null(strstr(cfg, "bos_token_id"));
    assert_null(strstr(gen, "bos_token_id"));
    assert_int_equal(id_of(cfg, "\"eos_token_id"), 7);
    assert_int_equal(id_of(gen, "\"eos_token_id"), 7);
    free(cfg);
    free(gen);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_presets_round_trip),
        cmocka_unit_test(test_published_configs),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_spec_model_config),
        cmocka_unit_test(test_diff_names_the_key),
        cmocka_unit_test(test_token_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
