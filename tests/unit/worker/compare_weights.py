#!/usr/bin/env python3
"""Compares two safetensors files tensor by tensor (numpy only; the format is read by hand so the
check needs no safetensors package).

   compare_weights.py A B --bitwise          every tensor identical, bit for bit
   compare_weights.py A B --rel TOL          per-tensor ||a - b|| / ||b|| <= TOL
In --rel mode the key third of every attn.c_attn.bias is left out: its gradient is zero in exact
arithmetic (softmax ignores a constant added to all keys), so what training writes there is
rounding noise that Adam scales up to lr-sized steps, and it differs with any change in the
order of a sum. It influences nothing else in the model.
Prints the worst tensor; exit 1 on a mismatch."""
import json
import struct
import sys

import numpy as np


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    out = {}
    for name, t in header.items():
        assert t["dtype"] == "F32", (name, t["dtype"])
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(data[base + b:base + e], dtype="<f4").reshape(t["shape"])
    return out


a, b = load(sys.argv[1]), load(sys.argv[2])
mode = sys.argv[3]
if sorted(a) != sorted(b):
    print("tensor names differ")
    sys.exit(1)
worst, worst_name = 0.0, None
for name in a:
    if mode == "--bitwise":
        diff = int(np.count_nonzero(a[name].view(np.uint32) != b[name].view(np.uint32)))
    else:
        x, y = a[name].astype(np.float64), b[name].astype(np.float64)
        if name.endswith("attn.c_attn.bias"):
            c = x.shape[0] // 3
            x, y = np.concatenate([x[:c], x[2 * c:]]), np.concatenate([y[:c], y[2 * c:]])
        diff = float(np.linalg.norm(x - y) / (np.linalg.norm(y) + 1e-30))
    if diff > worst or worst_name is None:
        worst, worst_name = diff, name
limit = 0 if mode == "--bitwise" else float(sys.argv[4])
print(f"worst tensor {worst_name}: {'differing elements' if mode == '--bitwise' else 'rel err'} "
      f"{worst}")
sys.exit(0 if worst <= limit else 1)
