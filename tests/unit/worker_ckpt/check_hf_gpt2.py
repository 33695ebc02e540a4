#!/usr/bin/env python3
"""Checks a ddpd training checkpoint against Hugging Face's GPT-2 layout with `safetensors`.

    check_hf_gpt2.py CKPT_DIR [DUMP.safetensors]

config.json must carry what transformers' GPT2Config needs; the model shards must hold exactly
GPT-2's tensor names with GPT-2's shapes (Conv1D weights [in, out]) in F32, with the "format":
"pt" metadata; the optimizer shards exp_avg.* / exp_avg_sq.* with the same shapes; trainer.json
the resume state. With DUMP (ddp-worker --dump-weights of the same step) the values must be
bitwise equal. Exit 0 when everything holds; the failures are printed.
"""
import json
import os
import sys

import numpy as np
from safetensors import safe_open

fails = []


def check(cond, msg):
    if not cond:
        fails.append(msg)
        print("FAIL:", msg)


def load_kind(ckpt, base):
    index = os.path.join(ckpt, base + ".safetensors.index.json")
    files = [base + ".safetensors"]
    if os.path.exists(index):
        with open(index) as f:
            idx = json.load(f)
        files = sorted(set(idx["weight_map"].values()))
    out = {}
    for name in files:
        with safe_open(os.path.join(ckpt, name), framework="np") as f:
            check((f.metadata() or {}).get("format") == "pt", name + ": metadata format != pt")
            for k in f.keys():
                out[k] = f.get_tensor(k)
    return out


def main():
    ckpt = sys.argv[1]
    with open(os.path.join(ckpt, "config.json")) as f:
        cfg = json.load(f)
    for k, v in {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
                 "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
                 "tie_word_embeddings": True}.items():
        check(cfg.get(k) == v, "config.json %s = %r, want %r" % (k, cfg.get(k), v))
    for k in ("n_layer", "n_head", "n_embd", "vocab_size", "n_positions", "n_ctx",
              "bos_token_id", "eos_token_id"):
        check(isinstance(cfg.get(k), int), "config.json %s missing" % k)
    L, C, V, P = cfg["n_layer"], cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"]
    want = {"wte.weight": (V, C), "wpe.weight": (P, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for i in range(L):
        h = "h.%d." % i
        want.update({h + "ln_1.weight": (C,), h + "ln_1.bias": (C,),
                     h + "attn.c_attn.weight": (C, 3 * C), h + "attn.c_attn.bias": (3 * C,),
                     h + "attn.c_proj.weight": (C, C), h + "attn.c_proj.bias": (C,),
                     h + "ln_2.weight": (C,), h + "ln_2.bias": (C,),
                     h + "mlp.c_fc.weight": (C, 4 * C), h + "mlp.c_fc.bias": (4 * C,),
                     h + "mlp.c_proj.weight": (4 * C, C), h + "mlp.c_proj.bias": (C,)})
    model = load_kind(ckpt, "model")
    check(set(model) == set(want), "model names differ from GPT-2's: extra %s, missing %s" %
          (sorted(set(model) - set(want))[:5], sorted(set(want) - set(model))[:5]))
    for k, shape in want.items():
        if k in model:
            check(model[k].shape == shape, "%s shape %s, want %s" % (k, model[k].shape, shape))
            check(model[k].dtype == np.float32, "%s dtype %s" % (k, model[k].dtype))
    optim = load_kind(ckpt, "optim")
    for k, shape in want.items():
        for mo in ("exp_avg.", "exp_avg_sq."):
            check(mo + k in optim and optim[mo + k].shape == shape, "optimizer %s%s" % (mo, k))
    with open(os.path.join(ckpt, "trainer.json")) as f:
        tr = json.load(f)
    check(len(tr.get("rng", [])) == 4 and all(isinstance(w, str) for w in tr["rng"]),
          "trainer.json rng: 4 words as strings")
    for k in ("step", "tokens", "world_size", "accum", "spec", "schedule", "adamw", "data"):
        check(k in tr, "trainer.json has no %s" % k)
    if "data" in tr:
        check(tr["data"]["cursor"] == tr["step"] * tr["data"]["global_batch_sequences"],
              "trainer.json data.cursor = step x global batch sequences")
    if len(sys.argv) > 2:
        with safe_open(sys.argv[2], framework="np") as f:
            for k in f.keys():
                check(k in model and np.array_equal(f.get_tensor(k), model[k]),
                      "%s differs from the dump" % k)
    print("%d model tensors, %d optimizer tensors checked; %d failure(s)" %
          (len(model), len(optim), len(fails)))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
