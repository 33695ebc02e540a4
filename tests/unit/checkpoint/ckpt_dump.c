/* Format-check helper: writes a GPT-2-shaped checkpoint (Hugging Face names, several model and
 * optimizer shards) under DIR/ckpt, plus DIR/dump.json (each tensor's name, kind, dtype, shape,
 * offset and size in DIR/dump.bin) and DIR/dump.bin (the raw bytes), for
 * tests/checkpoint_format.py to compare with what the `safetensors` package reads.
 * Usage: ckpt_dump DIR */
#include <jansson.h>
#include <stdio.h>

#include "ckpt_testutil.h"

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    char path[4096];
    tstate_t ts;
    tu_make(&ts, 257, 32, 48, 2, 1, 77);
    snprintf(path, sizeof path, "%s/ckpt", argv[1]);
    ddp_ckpt_opts_t o = {.dir = path, .shard_mb = 0.08, .keep_last = 2};
    ddp_ckpt_saver_t *s;
    ddp_errinfo_t ei;
    ddp_ckpt_state_t st = tu_state(&ts, 123, "{\"step\": 123, \"tokens\": 456}");
    if (ddp_ckpt_saver_new(&o, &s, &ei) < 0 || ddp_ckpt_save(s, &st, &ei) < 0 ||
        ddp_ckpt_wait(s, &ei) < 0) {
        fprintf(stderr, "ckpt_dump: %s\n", ei.msg);
        return 1;
    }
    ddp_ckpt_saver_free(s);
    snprintf(path, sizeof path, "%s/dump.bin", argv[1]);
    FILE *bin = fopen(path, "wb");
    json_t *list = json_array();
    uint64_t off = 0;
    for (size_t i = 0; i < ts.n_model + ts.n_optim; i++) {
        const ddp_ckpt_tensor_t *t = i < ts.n_model ? &ts.model[i] : &ts.optim[i - ts.n_model];
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_array_append_new(list, json_pack("{s:s, s:s, s:s, s:o, s:I, s:I}", "name", t->name,
                                              "kind", i < ts.n_model ? "model" : "optim", "dtype",
                                              ddp_st_dtype_name(t->dtype), "shape", shape,
                                              "offset", (json_int_t)off, "nbytes",
                                              (json_int_t)t->nbytes));
        if (fwrite(t->data, 1, t->nbytes, bin) != t->nbytes) return 1;
        off += t->nbytes;
    }
    fclose(bin);
    json_t *root = json_pack("{s:s, s:I, s:s, s:o}", "checkpoint", "ckpt/step-00000123", "step",
                             (json_int_t)123, "config", st.config_json, "tensors", list);
    snprintf(path, sizeof path, "%s/dump.json", argv[1]);
    if (json_dump_file(root, path, JSON_INDENT(1)) < 0) return 1;
    json_decref(root);
    tu_free(&ts);
    return 0;
}
