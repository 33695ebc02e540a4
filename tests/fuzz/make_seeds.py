#!/usr/bin/env python3
"""Writes the libFuzzer seed corpus into tests/fuzz/corpus/<harness>/ (seed-*.* files; crash
regression inputs live beside them under other names and are never touched here). The seeds are
small valid inputs of each format, built here byte by byte so the corpus needs no build:
job specs (the examples and fixtures, YAML and JSON), token shards, safetensors files,
MANIFEST.json, whole checkpoint directories packed as "@@FILE name\\n<bytes>" records, control
API request lines and peer handshake messages.   Usage: tests/fuzz/make_seeds.py"""
import json, os, shutil, struct, zlib

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
corpus = os.path.join(root, "tests", "fuzz", "corpus")


def put(h, name, data):
    d = os.path.join(corpus, h)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def crc32c(b):
    c = 0xFFFFFFFF
    for x in b:
        c ^= x
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    return c ^ 0xFFFFFFFF


def safetensors(tensors, meta={"format": "pt"}):
    hdr, off, body = {}, 0, b""
    if meta:
        hdr["__metadata__"] = meta
    for t in tensors:
        name, shape, vals = t[:3]
        dtype = t[3] if len(t) > 3 else "F32"
        if dtype == "F32":
            raw = struct.pack("<%df" % len(vals), *vals)
        elif dtype == "F16":
            raw = struct.pack("<%de" % len(vals), *vals)
        else:  # BF16: the high half of the fp32 bits
            raw = b"".join(struct.pack("<f", v)[2:] for v in vals)
        hdr[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        body += raw
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + body


def manifest(step, files):
    return json.dumps({"format": "ddpd-checkpoint", "version": 1, "step": step,
                       "checksum": "crc32c",
                       "files": {n: {"size": len(b), "crc32c": "%08x" % crc32c(b)}
                                 for n, b in files.items()}}, indent=1).encode()


def pack(files):
    return b"".join(b"@@FILE " + n.encode() + b"\n" + b for n, b in files.items())


# spec
for d in ("deploy/examples", "tests/fixtures/specs"):
    for n in sorted(os.listdir(os.path.join(root, d))):
        if n.endswith((".yaml", ".json")):
            put("spec", n, open(os.path.join(root, d, n), "rb").read())

# shard
def shard(tokens, magic=20240520, version=1, count=None, fmt="H"):
    h = [0] * 256
    h[0], h[1], h[2] = magic, version, len(tokens) if count is None else count
    return struct.pack("<256i", *h) + struct.pack("<%d%s" % (len(tokens), fmt), *tokens)
put("shard", "valid.bin", shard(list(range(40))))
put("shard", "empty.bin", shard([]))
put("shard", "count-too-big.bin", shard([1, 2, 3], count=9))
put("shard", "valid32.bin", shard([70000 + i for i in range(40)], 20240801, 7, fmt="I"))
put("shard", "mislabelled32.bin", shard(list(range(40)), 20240801, 7, count=20))

# safetensors
wte = ("wte.weight", [8, 4], [i / 8 for i in range(32)])
lnb = ("ln_f.bias", [4], [0.5, -1, 2, 0])
put("safetensors", "two.safetensors", safetensors([wte, lnb]))
put("safetensors", "nometa.safetensors", safetensors([lnb], meta=None))
put("safetensors", "scalar.safetensors", safetensors([("s", [], [1.0])]))

# manifest and checkpoints
model = safetensors([wte, lnb])
config = json.dumps({"model_type": "gpt2", "n_layer": 0, "n_embd": 4}).encode()
trainer = json.dumps({"step": 1, "tokens": 64}).encode()
files = {"model.safetensors": model, "config.json": config, "trainer.json": trainer}
man = manifest(1, files)
put("manifest", "MANIFEST.json", man)
put("manifest", "empty-files.json", manifest(0, {}))
put("ckpt", "single-file.ckpt", pack({"MANIFEST.json": man, **files}))
s1, s2 = safetensors([wte]), safetensors([lnb])
index = json.dumps({"metadata": {"total_size": 144},
                    "weight_map": {"wte.weight": "model-00001-of-00002.safetensors",
                                   "ln_f.bias": "model-00002-of-00002.safetensors"}}).encode()
files2 = {"model-00001-of-00002.safetensors": s1, "model-00002-of-00002.safetensors": s2,
          "model.safetensors.index.json": index, "config.json": config, "trainer.json": trainer}
put("ckpt", "sharded.ckpt", pack({"MANIFEST.json": manifest(1, files2), **files2}))
hf = safetensors([("transformer.wte.weight", [8, 4], [0.0] * 32), ("transformer.ln_f.bias", [4],
                  [1.0] * 4), ("lm_head.weight", [8, 4], [0.0] * 32)])
put("ckpt", "hf-prefixed.ckpt", pack({"model.safetensors": hf}))
# half-precision sources (converted to F32 by init_from), and a shape that does not match
half = safetensors([("wte.weight", [8, 4], [i / 4 for i in range(32)], "F16"),
                    ("ln_f.bias", [4], [1.5, -2.0, 0.25, 3.0], "BF16")])
put("ckpt", "hf-half.ckpt", pack({"model.safetensors": half}))
bad_shape = safetensors([("wte.weight", [4, 8], [0.0] * 32), lnb])
put("ckpt", "bad-shape.ckpt", pack({"model.safetensors": bad_shape, "config.json": config,
                                    "trainer.json": trainer,
                                    "MANIFEST.json": manifest(1, {"model.safetensors": bad_shape})}))

# rpc
reqs = [
    {"jsonrpc": "2.0", "id": 1, "method": "daemon.status"},
    {"jsonrpc": "2.0", "id": "a", "method": "job.list", "params": {"limit": 5, "state": "failed"}},
    {"jsonrpc": "2.0", "id": 3, "method": "job.submit",
     "params": {"spec": "name: f\ndata: {train: x}\ntrain: {steps: 2}\n"}},
    {"jsonrpc": "2.0", "method": "job.cancel", "params": {"id": 2}},
    {"jsonrpc": "2.0", "id": None, "method": "job.logs", "params": None},
]
put("rpc", "requests.jsonl", "\n".join(json.dumps(r) for r in reqs) + "\n")
put("rpc", "bad.jsonl", '{"jsonrpc":"1.0","id":[1],"method":2}\n\n  \r\n{"a":\n\xc3\x28 text\n')

# metrics: every kind of metrics.jsonl line (as the codec writes them), older and stranger ones
metrics = [
    '{"step":1200,"steps":2000,"loss":3.281742,"lr":0.00059873,"grad_norm":1.02346,'
    '"tokens_per_s":45678.9,"step_ms":123.46,"compute_ms":100.12,"comm_ms":30.50,'
    '"exposed_comm_ms":5.25,"hidden":0.8279,"optim_ms":2.50,"tokens":78643200,"world":4,'
    '"generation":2,"straggler":-1,"loss_scale":1,"wall_ms":148148.1}',
    '{"step":1,"steps":10,"loss":null,"lr":6e-05,"grad_norm":null,"loss_scale":65536}',
    '{"step":300,"val_loss":2.718282}',
    '{"event":"generation","generation":3,"world":3,"step":41,"cause":"rank 2 \\"x\\" \\n '
    '\u00fc \u2713","reconfig_ms":1234.6,"form_ms":1000.0,"comm_ms":200.1,"attach_ms":30.0,'
    '"state_ms":4.5,"receivers":1,"source":0,"shrunk":true}',
    '{"event":"state_transfer","generation":4,"step":99,"mode":"overlap","receivers":2,'
    '"source":1,"mb":1493.28,"ms":812.2,"mb_per_s":1838.4}',
    '{"event":"done","step":2000,"final_loss":1.234568}',
    '{"event":"done","final_loss":0.714286}',
    '{"event":"generation","step":5,"cause":"rank 1 died","sync_mb":1.25,"sync_ms":3.0}',
    '{"loss": 2.5, "step": 4, "generation": 1, "x": [1, {}]}',
    '{"event":"checkpoint","step":200,"ms":12.5}',
    '{"event":"eval","step":500,"task":"hellaswag","examples":10042,"acc":0.289185,'
    '"acc_norm":0.311392,"acc_tok":0.295459,"eval_ms":81234.5,"tokens":4016800}',
]
put("metrics", "kinds.jsonl", "\n".join(metrics) + "\n")
put("metrics", "bad.jsonl", '{"step":1,"loss":nan}\n{"step":"7"}\n{"event":7}\n[1]\n{"step":1\n')

# peer
n = "ab" * 32
put("peer", "hello.json", json.dumps({"hello": "ddpd", "node": "a", "nonce": n}))
put("peer", "reply.json", json.dumps({"node": "b", "nonce": n, "peer_nonce": "cd" * 32,
                                      "mac": "ef" * 32}))

# peer_msg: one line of each message kind the peer protocol has (daemon/peer_msg.h)
peer_msgs = {
    "hello": {"hello": "node-a", "nonce": n},
    "challenge": {"node": "node-b", "nonce": "cd" * 32, "mac": "ef" * 32},
    "proof": {"mac": "ef" * 32},
    "ok": {"ok": True, "node": "node-b"},
    "refused": {"error": "authentication failed"},
    "status": {"t": "status", "node": "node-b", "slots": 8, "free": 3},
    "start": {"t": "start", "job": 12, "name": "tiny", "ranks": [2, 3], "world": 4,
              "rdzv": "10.0.0.1:29500", "token": "0123456789abcdef", "spec": '{"name":"tiny"}',
              "cwd": "/home/u", "uid": 1000, "gid": 1000, "threads": 2, "elastic": True,
              "max_restarts": 3},
    "kill": {"t": "kill", "job": 12, "pid": 4242, "host_id": "boot-1234/node-b"},
    "signal": {"t": "signal", "job": 12, "sig": 15},
    "started": {"t": "started", "job": 12, "n": 2},
    "failed": {"t": "failed", "job": 12, "why": "node node-b has 0 free slots, 2 asked"},
    "adopted": {"t": "adopted", "job": 12, "ranks": [2]},
    "exit": {"t": "exit", "job": 12, "rank": 3, "code": 0, "sig": 0},
}
for k, m in peer_msgs.items():
    put("peer_msg", k + ".json", json.dumps(m, separators=(",", ":")))
put("peer_msg", "bad.json", '{"t":"start","job":-1,"ranks":"x"} trailing')


# hello: rendezvous hellos (collectives/rdzv_hello.h) for a world of 4 at generation 7 with
# the token "fuzz-token", as tests/fuzz/harness/fuzz_hello.c expects them
def hello(rank, size=4, gen=7, token=b"fuzz-token", magic=b"DDPRDZV1"):
    return magic + struct.pack("=IIQ", rank, size, gen) + token.ljust(128, b"\0")


put("hello", "valid.bin", hello(1))
put("hello", "wrong-token.bin", hello(3, token=b"other"))
put("hello", "half.bin", hello(2)[:40])
put("hello", "garbage.bin", b"GET / HTTP/1.1\r\n\r\n")
print("seeds written to", corpus)
