#!/usr/bin/env python3
"""Format check of ddpd checkpoints with the reference `safetensors` package and numpy.

Given a checkpoint and a raw dump of the tensors that went into it (from ckpt_dump, or
`--dir DIR` for a dump made elsewhere), reads every shard with safetensors.numpy.load_file and
compares names, shapes, dtypes and values; checks the index files (weight_map, total_size) as
Hugging Face writes them, the "format": "pt" metadata that `transformers` requires, the header
padding, config.json, and every MANIFEST.json size and CRC32C (computed here independently).

    python3 tests/checkpoint_format.py --helper build/tests/unit/checkpoint/ckpt_dump
    python3 tests/checkpoint_format.py --dir DIR        (DIR holds dump.json, dump.bin)
"""
import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file

DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I32": np.int32,
          "I64": np.int64, "U8": np.uint8, "I8": np.int8, "I16": np.int16, "U16": np.uint16}


def crc32c_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        t.append(c)
    return t


TABLE = crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    t = TABLE
    for b in data:
        c = (c >> 8) ^ t[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF


failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg)


def shards(ckpt, base):
    index = os.path.join(ckpt, base + ".safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            idx = json.load(f)
        return idx, sorted(set(idx["weight_map"].values()))
    return None, [base + ".safetensors"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--helper")
    ap.add_argument("--dir")
    a = ap.parse_args()
    tmp = None
    if a.helper:
        tmp = tempfile.TemporaryDirectory(prefix="ddp-ckpt-format-")
        subprocess.run([a.helper, tmp.name], check=True)
        a.dir = tmp.name
    with open(os.path.join(a.dir, "dump.json")) as f:
        dump = json.load(f)
    raw = open(os.path.join(a.dir, "dump.bin"), "rb").read()
    ckpt = os.path.join(a.dir, dump["checkpoint"])

    with open(os.path.join(ckpt, "MANIFEST.json")) as f:
        manifest = json.load(f)
    check(manifest["step"] == dump["step"], "manifest step")
    listed = set(manifest["files"])
    present = set(os.listdir(ckpt)) - {"MANIFEST.json"}
    check(listed == present, f"manifest lists {sorted(listed)}, directory has {sorted(present)}")
    for name, e in manifest["files"].items():
        data = open(os.path.join(ckpt, name), "rb").read()
        check(len(data) == e["size"], f"{name}: size {len(data)} != {e['size']}")
        check(f"{crc32c(data):08x}" == e["crc32c"], f"{name}: crc32c differs from manifest")
    with open(os.path.join(ckpt, "config.json")) as f:
        check(json.load(f) == json.loads(dump["config"]), "config.json differs")

    seen = {}
    for kind in ("model", "optim"):
        idx, files = shards(ckpt, kind)
        want = {t["name"]: t for t in dump["tensors"] if t["kind"] == kind}
        check(len(files) > 1, f"{kind}: expected several shards, got {files}")
        if idx is not None:
            check(set(idx["weight_map"]) == set(want), f"{kind}: weight_map names differ")
            check(idx["metadata"]["total_size"] == sum(t["nbytes"] for t in want.values()),
                  f"{kind}: total_size")
        for fn in files:
            path = os.path.join(ckpt, fn)
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
            check(n % 8 == 0, f"{fn}: header length {n} not a multiple of 8")
            with safe_open(path, framework="numpy") as so:
                check((so.metadata() or {}).get("format") == "pt", f"{fn}: metadata format")
            tensors = load_file(path)
            for name, arr in tensors.items():
                check(name in want, f"{fn}: unexpected tensor {name}")
                if name not in want:
                    continue
                t = want[name]
                seen[name] = True
                if idx is not None:
                    check(idx["weight_map"][name] == fn, f"{name}: index says another file")
                check(list(arr.shape) == t["shape"], f"{name}: shape {arr.shape} != {t['shape']}")
                check(arr.dtype == DTYPES[t["dtype"]], f"{name}: dtype {arr.dtype}")
                ref = np.frombuffer(raw, dtype=DTYPES[t["dtype"]],
                                    count=t["nbytes"] // np.dtype(DTYPES[t["dtype"]]).itemsize,
                                    offset=t["offset"]).reshape(t["shape"])
                check(np.array_equal(arr, ref), f"{name}: values differ")
    check(len(seen) == len(dump["tensors"]),
          f"{len(dump['tensors']) - len(seen)} tensors missing from the shards")
    n = len(dump["tensors"])
    if failures:
        print(f"checkpoint_format: 0 passed, {len(failures)} failed")
        return 1
    print(f"checkpoint_format: {n} tensors, every shard, index and manifest entry match")
    return 0


if __name__ == "__main__":
    sys.exit(main())
