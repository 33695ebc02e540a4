#!/usr/bin/env python3
"""ddp-prep --tokenizer against Hugging Face's `tokenizers` (TAP).

Trains a byte-level BPE (vocab 2000) with `tokenizers` on tinyshakespeare, offline, saves its
tokenizer.json, and checks that ddp-prep's ids equal `tokenizers`' on the whole corpus (one and
two threads, with and without a validation split, and a corpus large enough to be cut into
several chunks) and on hostile text (NUL, 1 MB lines, every Unicode category, odd whitespace,
added tokens inside words); that invalid UTF-8 is refused with the file and the byte offset
Python's decoder reports; that `tokenizers` decodes ddp-prep's ids back to the text; that a
vocabulary past 65,536 gives 32-bit shards with the same ids, and that ddp-worker trains on them;
and data.tokenizer in a ddp-worker run (a small Llama of the tokenizer's vocabulary): the run
directory and every checkpoint hold the tokenizer byte for byte (with tokenizer_config.json,
generation_config.json and its BOS/EOS), the sample is decoded through it, a checkpoint resumes,
one that lost its tokenizer.json is skipped, and a bad tokenizer is refused by field and file.

  test_tokenizer_hf.py DDP_PREP DDP_WORKER
Skips (exit 77) when `tokenizers` is not importable or tinyshakespeare is not found
(DDP_SOURCE_ROOT/../shared/data/tinyshakespeare.txt).
"""
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import unicodedata

prep, worker = sys.argv[1], sys.argv[2]
root = os.environ.get("DDP_SOURCE_ROOT",
                      os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
corpus_path = os.path.join(root, "..", "shared", "data", "tinyshakespeare.txt")
try:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
except ImportError:
    print("1..0 # SKIP the Python package `tokenizers` is not installed "
          "(deploy/install-deps.sh pip-installs it)")
    sys.exit(77)
if not os.path.exists(corpus_path):
    print("1..0 # SKIP %s not found (the shared data folder beside the checkout)" % corpus_path)
    sys.exit(77)

tmp = tempfile.mkdtemp(prefix="ddp-test-tok-")
n = 0
failed = 0


def ok(cond, what, detail=""):
    global n, failed
    n += 1
    if cond:
        print("ok %d - %s" % (n, what))
    else:
        failed += 1
        print("not ok %d - %s" % (n, what))
        for line in str(detail).splitlines()[:20]:
            print("# " + line)


def read_shards(d, split):
    """All ids of DIR/split_*.bin in order, and the (magic, version) of each shard."""
    ids, labels = [], []
    for name in sorted(os.listdir(d)):
        if not (name.startswith(split + "_") and name.endswith(".bin")):
            continue
        data = open(os.path.join(d, name), "rb").read()
        magic, version, count = struct.unpack("<3i", data[:12])
        width = 4 if magic == 20240801 else 2
        labels.append((magic, version))
        ids += list(struct.unpack("<%d%s" % (count, "I" if width == 4 else "H"), data[1024:]))
    return ids, labels


def run_prep(tok_json, files, *args):
    out = tempfile.mkdtemp(dir=tmp)
    p = subprocess.run([prep, "--tokenizer", tok_json, "--out", out, "--val-fraction", "0"] +
                       list(args) + files, capture_output=True, text=True)
    return p, out


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return "first difference at id %d: ddp-prep %r, tokenizers %r (of %d and %d ids)" % (
                i, a[i:i + 6], b[i:i + 6], len(a), len(b))
    return "lengths differ: ddp-prep %d, tokenizers %d" % (len(a), len(b))


# ---- train a byte-level BPE, offline ----
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|endoftext|>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                              show_progress=False)
tok.train([corpus_path], trainer)
tok_json = os.path.join(tmp, "tokenizer.json")
tok.save(tok_json)
text = open(corpus_path, encoding="utf-8").read()

print("1..26")

# 1-3: the whole corpus, one and two threads, and with a validation split
t0 = time.time()
want = tok.encode(text).ids
hf_s = time.time() - t0
p, out = run_prep(tok_json, [corpus_path], "--threads", "2")
got, labels = read_shards(out, "train")
ok(p.returncode == 0 and got == want, "whole corpus: ddp-prep's ids equal tokenizers' (%d ids)"
   % len(want), p.stderr + first_diff(got, want))
speed = [l for l in p.stdout.splitlines() if l.startswith("tokenized")]
print("# ddp-prep: %s; tokenizers' Python encode: %.2f MB/s" % (
    speed[0] if speed else "?", len(text.encode()) / hf_s / 1e6))
ok(labels == [(20240520, 1)], "a vocabulary of 2000 gives 16-bit shards", labels)
p1, out1 = run_prep(tok_json, [corpus_path], "--threads", "1")
p2 = subprocess.run([prep, "--tokenizer", tok_json, "--out", out1 + "v", corpus_path],
                    capture_output=True, text=True)
tr, _ = read_shards(out1 + "v", "train")
va, _ = read_shards(out1 + "v", "val")
ok(read_shards(out1, "train")[0] == want and p2.returncode == 0 and tr + va == want and
   0.05 < len(va) / len(want) < 0.15,
   "one thread gives the same ids; train + val (10%%: %d ids) are the whole corpus' ids"
   % len(va), p2.stderr)

# 4: a corpus cut into many chunks (about 256 KiB each) at line starts
big = os.path.join(tmp, "big.txt")
big_text = (text + text.upper()) * 2
open(big, "w", encoding="utf-8").write(big_text)
p, out = run_prep(tok_json, [big], "--threads", "2")
got, _ = read_shards(out, "train")
want_big = tok.encode(big_text).ids
ok(p.returncode == 0 and got == want_big, "a 4.5 MB corpus in several chunks: equal ids",
   p.stderr + first_diff(got, want_big))

# 5: --bos/--eos around each file
p, out = run_prep(tok_json, [corpus_path], "--bos", "<|endoftext|>", "--eos", "<|endoftext|>")
got, _ = read_shards(out, "train")
ok(p.returncode == 0 and got == [0] + want + [0], "--bos and --eos add <|endoftext|> (id 0)",
   p.stderr)

# 6: --eos config: the eos_token of tokenizer_config.json beside the tokenizer
json.dump({"eos_token": {"content": "<|endoftext|>"}, "bos_token": None},
          open(os.path.join(tmp, "tokenizer_config.json"), "w"))
pc, outc = run_prep(tok_json, [corpus_path], "--eos", "config")
pb, _ = run_prep(tok_json, [corpus_path], "--bos", "config")
ok(pc.returncode == 0 and read_shards(outc, "train")[0] == want + [0] and pb.returncode == 1 and
   "no bos_token" in pb.stderr, "--eos config takes tokenizer_config.json's eos_token; a null "
   "bos_token is named", pc.stderr + pb.stderr)

# 7: decode round trip: tokenizers decodes ddp-prep's ids to the corpus
ok(tok.decode(got[1:-1], skip_special_tokens=False) == text,
   "tokenizers decodes ddp-prep's ids back to the corpus")

# ---- 8: hostile text ----
rng = random.Random(1)
cats = {}
for cp in range(0x110000):
    c = unicodedata.category(chr(cp))
    if c in ("Cs",):  # surrogates: not UTF-8
        continue
    cats.setdefault(c, []).append(cp)
every_cat = []
for c in sorted(cats):
    pool = cats[c]
    picks = rng.sample(pool, min(40, len(pool)))
    for cp in picks:
        every_cat.append(chr(cp) + rng.choice(["", " ", "a", "\n", "1", "'s", "  ", "\t"]))
hostile = {
    "NUL bytes": "a\0b\0\0 c\0\n\0'\0s\n",
    "a 1 MB line of words": " ".join(rng.choice(["the", "King", "o'er", "42", "--", "déjà"])
                                     for _ in range(200000))[:1000000],
    "a 1 MB word": "a" * 1000000,
    "1 MB of mixed runs": "".join(rng.choice(["ab", "ba", "aab", "x", "!!", "   "])
                                  for _ in range(400000))[:1000000],
    "every Unicode category": "".join(every_cat),
    "odd whitespace": "a\u00a0b \u3000c\u2028d\u0085e\x0b\x0cf\r\n\r\n  g\n \n\t\n h \u200b i",
    "contractions and case": "DON'T I'LL we'Re it's 'S 'sx ''s they've y'all",
    "numbers": "1234567 ١٢٣٤ ⅷ ½ 3.14 1,000,000 ²",
    "added token in words": "hello<|endoftext|>world <|endoftext|><|endoftext|> <|endoftext",
    "emoji and combining marks": "e\u0301 👩‍👩‍👧 🇫🇷 a\u0300\u0301\u0302 ﷽ \U0010fffd",
    "only whitespace": " \n\n  \t\r\n   ",
}
mismatch = []
for name, s in hostile.items():
    f = os.path.join(tmp, "h.txt")
    open(f, "w", encoding="utf-8", newline="").write(s)
    p, out = run_prep(tok_json, [f], "--shard-tokens", "100000000")
    got, _ = read_shards(out, "train")
    w = tok.encode(s).ids
    if p.returncode != 0 or got != w:
        mismatch.append("%s: %s%s" % (name, p.stderr, first_diff(got, w)))
    elif tok.decode(got, skip_special_tokens=False) != s:
        mismatch.append("%s: decode round trip differs" % name)
ok(not mismatch, "hostile text (%s): equal ids and a decode round trip" % ", ".join(hostile),
   "\n".join(mismatch))

# 9: invalid UTF-8 refused, naming the file and the offset Python's decoder reports
bad = {
    "0xff": b"good text\nmore \xff here",
    "truncated sequence": b"abc \xe2\x82",
    "overlong": b"x\xc0\xaf",
    "surrogate": b"ab\xed\xa0\x80cd",
    "past U+10FFFF": b"\xf4\x90\x80\x80",
    "stray continuation": b"line\n\x80",
}
wrong = []
for name, b in bad.items():
    f = os.path.join(tmp, "bad.txt")
    open(f, "wb").write(b)
    try:
        b.decode("utf-8")
        wrong.append("%s: Python decodes it" % name)
        continue
    except UnicodeDecodeError as e:
        at = e.start
    p, _ = run_prep(tok_json, [f])
    expect = "%s: byte offset %d: invalid UTF-8" % (f, at)
    if p.returncode != 1 or expect not in p.stderr:
        wrong.append("%s: rc %d, stderr %r, want %r" % (name, p.returncode, p.stderr, expect))
ok(not wrong, "invalid UTF-8 (%s) is refused with the file and byte offset" % ", ".join(bad),
   "\n".join(wrong))

# 10: invalid UTF-8 deep in a big file: the offset counts from the file's start
f = os.path.join(tmp, "deep.txt")
deep = text.encode() * 2 + b"\nX\xfe\n" + text.encode()
open(f, "wb").write(deep)
p, _ = run_prep(tok_json, [f], "--threads", "2")
ok(p.returncode == 1 and ("byte offset %d:" % (2 * len(text.encode()) + 2)) in p.stderr,
   "invalid UTF-8 after 2 MB is named at its offset in the file", p.stderr)

# 11-13: refused tokenizer.json shapes name the field
j = json.load(open(tok_json))


def refused(mutate, needle):
    d = json.loads(json.dumps(j))
    mutate(d)
    f = os.path.join(tmp, "t.json")
    json.dump(d, open(f, "w"))
    p, _ = run_prep(f, [corpus_path])
    return p.returncode == 1 and needle in p.stderr, p.stderr


r = refused(lambda d: d.update(normalizer={"type": "NFKC"}), "normalizer.type: NFKC is not "
            "implemented")
ok(r[0], "a normalizer it does not implement is named", r[1])
r = refused(lambda d: d["model"].update(type="Unigram"), "model.type: Unigram: only BPE")
ok(r[0], "a Unigram (SentencePiece) model is named", r[1])
r = refused(lambda d: d["model"].update(byte_fallback=True), "model.byte_fallback")
ok(r[0], "byte_fallback (SentencePiece-style BPE) is named", r[1])

# 14-15: Llama 3's and Qwen2's pre-tokenizer shape (Sequence of Split + ByteLevel without its
# regex), Llama 3's with ignore_merges, Qwen2's with its NFC normalizer, against tokenizers with
# the same JSON; text in decomposed forms for NFC to compose
shapes = {
    "Llama 3": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+", True),
    "Qwen2": (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
              r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+", False),
}
nfc_text = ("e\u0301 A\u030a \u212b \u1100\u1161\u11a8 \u0958 \u2126 o\u0308\u0304 "
            "\u1e9b\u0323 q\u0307\u0323 \u0041\u0300\n") * 50
sample = big_text + "".join(hostile.values()) + nfc_text
f = os.path.join(tmp, "l.txt")
open(f, "w", encoding="utf-8", newline="").write(sample)
for name, (regex, ignore_merges) in shapes.items():
    d = json.loads(json.dumps(j))
    d["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": False}]}
    d["model"]["ignore_merges"] = ignore_merges
    if name == "Qwen2":
        d["normalizer"] = {"type": "NFC"}
    shape_json = os.path.join(tmp, "shape.json")
    json.dump(d, open(shape_json, "w"))
    p, out = run_prep(shape_json, [f], "--threads", "2")
    got, _ = read_shards(out, "train")
    w = Tokenizer.from_file(shape_json).encode(sample).ids
    ok(p.returncode == 0 and got == w, "%s's pre-tokenizer shape%s: equal ids on the chunked "
       "corpus and the hostile text" % (name, " and ignore_merges" if ignore_merges else
                                        " and NFC"),
       p.stderr + first_diff(got, w))

# 16-18: a vocabulary past 65,536: ids shifted up by 68,000, 32-bit shards, equal ids, training
d = json.loads(json.dumps(j))
shift = lambda i: i if i < 257 else i + 68000
d["model"]["vocab"] = {k: shift(v) for k, v in d["model"]["vocab"].items()}
wide_json = os.path.join(tmp, "wide.json")
json.dump(d, open(wide_json, "w"))
wtok = Tokenizer.from_file(wide_json)
p, out = run_prep(wide_json, [corpus_path], "--val-fraction", "0.1")
tr, labels = read_shards(out, "train")
va, vlabels = read_shards(out, "val")
w = wtok.encode(text).ids
ok(p.returncode == 0 and tr + va == w and max(w) > 65535,
   "vocabulary %d: equal ids past 65,535" % (max(w) + 1), p.stderr + first_diff(tr + va, w))
ok(set(labels + vlabels) == {(20240801, 7)}, "it is written as 32-bit shards (magic 20240801, "
   "version 7)", labels + vlabels)
job = os.path.join(tmp, "job.yaml")
open(job, "w").write(
    "name: wide-vocab\n"
    "model: {n_layer: 1, n_head: 2, n_embd: 16, vocab_size: 70000, block_size: 32}\n"
    "data: {train: \"%s/train_*.bin\", val: \"%s/val_*.bin\"}\n"
    "train: {steps: 3, micro_batch: 2, seq_len: 32, lr: 1.0e-3, warmup: 1, val_every: 0,\n"
    "        sample_tokens: 0, threads: 1}\n" % (out, out))
p = subprocess.run([worker, job, "--quiet"], capture_output=True, text=True, timeout=240,
                   env=dict(os.environ, DDP_LOG_LEVEL="warn"))
ok(p.returncode == 0, "ddp-worker trains 3 steps on the 32-bit shards (vocab 70000)",
   p.stdout[-2000:] + p.stderr[-2000:])

# ---- 19-26: data.tokenizer in a ddp-worker run: a small Llama of the tokenizer's vocabulary
# on the shards of test 3 (out1 + "v"); tokenizer_config.json (test 6) is beside tok_json ----
vocab = tok.get_vocab_size()
data = out1 + "v"
run = tempfile.mkdtemp(dir=tmp)
llama_cfg = os.path.join(run, "llama.json")
json.dump({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
           "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "max_position_embeddings": 128, "vocab_size": vocab,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
           "hidden_act": "silu"}, open(llama_cfg, "w"))
tok_job = os.path.join(run, "job.yaml")
open(tok_job, "w").write(
    "name: tok-run\n"
    "model: {config: \"%s\"}\n"
    "data: {train: \"%s/train_*.bin\", val: \"%s/val_*.bin\", tokenizer: \"%s\"}\n"
    "train: {steps: 4, micro_batch: 2, seq_len: 64, lr: 1.0e-3, warmup: 1, val_every: 0,\n"
    "        sample_tokens: 40, threads: 1}\n"
    "checkpoint: {dir: \"%s/ck\", every: 2}\n" % (llama_cfg, data, data, tok_json, run))


def run_worker(*args):
    return subprocess.run([worker, tok_job, "--quiet"] + list(args), capture_output=True,
                          timeout=240, env=dict(os.environ, DDP_LOG_LEVEL="info"))


def sample_of(p):
    """The bytes the run printed after its sample line (without the closing newline)."""
    marker = b"--- sample (40 tokens) ---\n"
    at = p.stdout.find(marker)
    return p.stdout[at + len(marker):].rstrip(b"\n") if at >= 0 else None


def text(p):
    return (p.stdout[-1500:] + p.stderr[-2500:]).decode(errors="replace")


src = open(tok_json, "rb").read()
src_cfg = open(os.path.join(tmp, "tokenizer_config.json"), "rb").read()
p = run_worker("--run-dir", os.path.join(run, "rd"))
rd = os.path.join(run, "rd")
ok(p.returncode == 0 and open(os.path.join(rd, "tokenizer.json"), "rb").read() == src and
   open(os.path.join(rd, "tokenizer_config.json"), "rb").read() == src_cfg and
   not [f for f in os.listdir(rd) if f.endswith(".tmp")],
   "data.tokenizer: the run directory holds tokenizer.json and tokenizer_config.json, "
   "byte-identical to the source (no temporary file left)", text(p))
want_gen = {"_from_model_config": True, "eos_token_id": 0, "transformers_version": "4.46.0"}
bad_ckpt = []
for step in (2, 4):
    d = os.path.join(run, "ck", "step-%08d" % step)
    try:
        man = json.load(open(os.path.join(d, "MANIFEST.json")))["files"]
        got_gen = json.load(open(os.path.join(d, "generation_config.json")))
        cfg = json.load(open(os.path.join(d, "config.json")))
        if open(os.path.join(d, "tokenizer.json"), "rb").read() != src:
            bad_ckpt.append("%s: tokenizer.json differs from the source" % d)
        if open(os.path.join(d, "tokenizer_config.json"), "rb").read() != src_cfg:
            bad_ckpt.append("%s: tokenizer_config.json differs from the source" % d)
        if got_gen != want_gen:
            bad_ckpt.append("%s: generation_config.json is %r" % (d, got_gen))
        if cfg.get("eos_token_id") != 0 or "bos_token_id" in cfg:
            bad_ckpt.append("%s: config.json's ids: bos %r, eos %r" % (
                d, cfg.get("bos_token_id"), cfg.get("eos_token_id")))
        for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
            if man.get(f, {}).get("size") != os.path.getsize(os.path.join(d, f)):
                bad_ckpt.append("%s: MANIFEST.json lists %s as %r" % (d, f, man.get(f)))
    except (OSError, ValueError, KeyError) as e:
        bad_ckpt.append("%s: %s" % (d, e))
ok(p.returncode == 0 and not bad_ckpt, "every checkpoint holds tokenizer.json and "
   "tokenizer_config.json byte-identical to the source, generation_config.json and config.json "
   "with tokenizer_config.json's EOS (0) and no BOS, all in its manifest", "\n".join(bad_ckpt))

# 21: the sample is the tokenizer's decoding of the ids the same run without a tokenizer prints
got = sample_of(p)
p0 = run_worker("--set", "data.tokenizer=\"\"", "--set", "checkpoint.dir=\"%s/ck0\"" % run)
ids_text = sample_of(p0)
try:
    ids = [int(x) for x in ids_text.split()]
except (AttributeError, ValueError):
    ids = []
ok(got is not None and len(ids) == 40 and got != ids_text and
   got.decode("utf-8", errors="replace") == tok.decode(ids, skip_special_tokens=False) and
   not os.path.exists(os.path.join(run, "ck0", "step-00000004", "tokenizer.json")),
   "the sample is text decoded through the tokenizer (tokenizers' decoding of the ids the run "
   "without data.tokenizer prints; that run's checkpoint has no tokenizer.json)",
   "with: %r\nwithout: %r\n%s" % (got, ids_text, text(p0)))

# 22: a checkpoint with a tokenizer resumes as before (to 6 steps: the cosine's length changes,
# which a resume must allow)
p = run_worker("--set", "train.steps=6", "--set", "train.allow_schedule_change=true")
d6 = os.path.join(run, "ck", "step-00000006")
ok(p.returncode == 0 and b"resumed from" in p.stderr and b"step-00000004" in p.stderr and
   open(os.path.join(d6, "tokenizer.json"), "rb").read() == src,
   "it resumes from step 4 and saves step 6 with its tokenizer.json", text(p))

# 23: a checkpoint that lost its tokenizer.json is not complete: it is skipped, by name
os.unlink(os.path.join(d6, "tokenizer.json"))
p = run_worker("--set", "train.steps=6", "--set", "train.allow_schedule_change=true",
               "--set", "train.sample_tokens=0")
ok(p.returncode == 0 and b"step-00000006" in p.stderr and b"tokenizer.json" in p.stderr and
   b"resumed from" in p.stderr and b"step 4" in p.stderr,
   "a checkpoint without its tokenizer.json fails verification by name; the run resumes from "
   "the one before", text(p))

# 24-25: refusals name data.tokenizer and the file, or both vocabulary sizes
missing = os.path.join(tmp, "no-such-tokenizer.json")
p = run_worker("--set", "data.tokenizer=\"%s\"" % missing)
uni = os.path.join(tmp, "unigram.json")
d = json.loads(json.dumps(j))
d["model"]["type"] = "Unigram"
json.dump(d, open(uni, "w"))
pu = run_worker("--set", "data.tokenizer=\"%s\"" % uni)
ok(p.returncode == 2 and ("data.tokenizer: %s: cannot read" % missing).encode() in p.stderr and
   pu.returncode == 2 and ("data.tokenizer: %s: model.type: Unigram" % uni).encode() in pu.stderr,
   "a missing or unloadable tokenizer is refused naming data.tokenizer and the file",
   text(p) + text(pu))
small_cfg = os.path.join(run, "small.json")
c = json.load(open(llama_cfg))
c["vocab_size"] = vocab - 1
json.dump(c, open(small_cfg, "w"))
p = run_worker("--set", "model.config=\"%s\"" % small_cfg)
ok(p.returncode == 2 and ("data.tokenizer: %s has %d tokens, more than model.vocab_size %d" % (
   tok_json, vocab, vocab - 1)).encode() in p.stderr,
   "a tokenizer larger than the model's vocabulary is refused naming both sizes", text(p))

# 26: without tokenizer_config.json beside it, <|endoftext|> is BOS and EOS
alone = os.path.join(run, "alone")
os.mkdir(alone)
shutil.copy(tok_json, alone)
p = run_worker("--set", "data.tokenizer=\"%s/tokenizer.json\"" % alone, "--set",
               "checkpoint.dir=\"%s/ck1\"" % run, "--set", "train.steps=2")
d = os.path.join(run, "ck1", "step-00000002")
try:
    gen = json.load(open(os.path.join(d, "generation_config.json")))
except (OSError, ValueError) as e:
    gen = str(e)
ok(p.returncode == 0 and gen == dict(want_gen, bos_token_id=0) and
   not os.path.exists(os.path.join(d, "tokenizer_config.json")) and sample_of(p),
   "without tokenizer_config.json: <|endoftext|> (0) is BOS and EOS; no tokenizer_config.json "
   "in the checkpoint", "%r\n%s" % (gen, text(p)))

shutil.rmtree(tmp, ignore_errors=True)
sys.exit(1 if failed else 0)
