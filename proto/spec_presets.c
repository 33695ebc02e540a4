/* The model presets of model.preset: GPT-2's sizes and the Llama family's published shapes (see
 * spec.h's ddp_spec_preset; spec_out.c writes the table into docs/spec.md). */
#include <string.h>

#include "proto/spec.h"
#include "proto/spec_int.h"

/* GPT-2: n_layer, n_head, n_embd, vocab_size, block_size. Parameters (tied LM head):
 * V*C + T*C + L*(12*C*C + 13*C) + 2*C.
 * The Llama family: the shapes of the published models' config.json (random initial weights;
 * model.init_from loads the published ones). Parameters: V*C (twice untied) + C +
 * L*(2*C*C + 2*C*KV + 3*C*I + 2*C), KV = n_kv_head * C / n_head (+ C + 2*KV biases: Qwen2). */
#define GPT2(L, NH, C, V, BLOCK)                                                             \
    {.n_layer = L, .n_head = NH, .n_embd = C, .vocab_size = V, .block_size = BLOCK}
#define LLAMA(L, NH, KV, C, I, V, BLOCK, ...)                                                \
    {.n_layer = L, .n_head = NH, .n_kv_head = KV, .n_embd = C, .intermediate_size = I,        \
     .vocab_size = V, .block_size = BLOCK, .arch = DDP_ARCH_LLAMA, __VA_ARGS__}
const ddp__spec_preset_t ddp__spec_presets[] = {
    {"gpt2-tiny", GPT2(2, 4, 128, 256, 128)},   /* 0.44M parameters, byte-level */
    {"gpt2-mini", GPT2(6, 6, 384, 256, 256)},   /* 10.8M parameters, byte-level */
    {"gpt2-124M", GPT2(12, 12, 768, 50257, 1024)},
    {"gpt2-355M", GPT2(24, 16, 1024, 50257, 1024)},
    {"gpt2-774M", GPT2(36, 20, 1280, 50257, 1024)},
    {"gpt2-1558M", GPT2(48, 25, 1600, 50257, 1024)},
    /* 0.5M parameters, byte-level: the tests' and demos' Llama */
    {"llama-tiny", LLAMA(2, 4, 2, 128, 352, 256, 128, .norm_eps = 1e-5, .rope_theta = 10000)},
    {"smollm2-135m", LLAMA(30, 9, 3, 576, 1536, 49152, 8192, .tie_embeddings = 1,
                           .norm_eps = 1e-5, .rope_theta = 100000)},
    {"smollm2-360m", LLAMA(32, 15, 5, 960, 2560, 49152, 8192, .tie_embeddings = 1,
                           .norm_eps = 1e-5, .rope_theta = 100000)},
    {"tinyllama-1.1b", LLAMA(22, 32, 4, 2048, 5632, 32000, 2048, .norm_eps = 1e-5,
                             .rope_theta = 10000)},
    {"llama-3.2-1b", LLAMA(16, 32, 8, 2048, 8192, 128256, 131072, .tie_embeddings = 1,
                           .norm_eps = 1e-5, .rope_theta = 500000, .rope_factor = 32,
                           .rope_low_freq_factor = 1, .rope_high_freq_factor = 4,
                           .rope_original_max = 8192)},
    {"qwen2.5-0.5b", LLAMA(24, 14, 2, 896, 4864, 151936, 32768, .tie_embeddings = 1,
                           .attention_bias = 1, .qwen2 = 1, .norm_eps = 1e-6,
                           .rope_theta = 1000000)},
};
#undef GPT2
#undef LLAMA
#define N_PRESETS (sizeof ddp__spec_presets / sizeof ddp__spec_presets[0])
const size_t ddp__spec_n_presets = N_PRESETS;
static const ddp__spec_preset_t *const PRESETS = ddp__spec_presets;

int ddp_spec_preset(const char *name, ddp_model_cfg_t *out)
{
    for (size_t i = 0; name && i < N_PRESETS; i++) {
        if (!strcmp(PRESETS[i].name, name)) {
            if (out) *out = PRESETS[i].cfg;
            return 0;
        }
    }
    return DDP_ENOTFOUND;
}

