#!/usr/bin/env python3
"""Writes a Hugging Face GPT-2 directory from a ddpd checkpoint, laid out as transformers'
save_pretrained writes GPT2LMHeadModel: config.json with GPT2Config's keys (n_inner null,
n_ctx, summary_* ...), tensors named "transformer.h.0.attn.c_attn.weight" plus lm_head.weight
(tied) and each block's attn.bias causal-mask buffer (older transformers saved it), as fp32.

    make_hf_dir.py CHECKPOINT_DIR OUT_DIR [--shards N]   (N > 1: model-0000i-of-0000N
                                                          .safetensors + the index)
"""
import json
import os
import sys

import numpy as np
from safetensors.numpy import load_file, save_file

src, out = sys.argv[1], sys.argv[2]
shards = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--shards" else 1
ours = json.load(open(os.path.join(src, "config.json")))
w = load_file(os.path.join(src, "model.safetensors"))
T = ours["n_positions"]
hf = {"transformer." + k: v for k, v in w.items()}
hf["lm_head.weight"] = w["wte.weight"]
for i in range(ours["n_layer"]):
    hf["transformer.h.%d.attn.bias" % i] = np.tril(np.ones((T, T), np.float32))[None, None]
config = {
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
    "bos_token_id": 10, "embd_pdrop": 0.1, "eos_token_id": 10, "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": T, "n_embd": ours["n_embd"],
    "n_head": ours["n_head"], "n_inner": None, "n_layer": ours["n_layer"], "n_positions": T,
    "reorder_and_upcast_attn": False, "resid_pdrop": 0.1, "scale_attn_by_inverse_layer_idx": False,
    "scale_attn_weights": True, "summary_activation": None, "summary_first_dropout": 0.1,
    "summary_proj_to_labels": True, "summary_type": "cls_index", "summary_use_proj": True,
    "torch_dtype": "float32", "transformers_version": "4.44.2", "use_cache": True,
    "vocab_size": ours["vocab_size"]}
os.makedirs(out, exist_ok=True)
json.dump(config, open(os.path.join(out, "config.json"), "w"), indent=2)
names = sorted(hf)
if shards == 1:
    save_file(hf, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
else:
    weight_map = {}
    for s in range(shards):
        fname = "model-%05d-of-%05d.safetensors" % (s + 1, shards)
        part = {n: hf[n] for n in names[s::shards]}
        save_file(part, os.path.join(out, fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    total = sum(v.nbytes for v in hf.values())
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map},
              open(os.path.join(out, "model.safetensors.index.json"), "w"), indent=2)
