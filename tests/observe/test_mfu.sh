#!/usr/bin/env bash
# MFU end to end (TAP): the model FLOPs that ddp-worker counts per token (6 N + 6 L C T, logged
# at start) agree within 3% with the FLOPs the per-op profiler counts over two real steps, for a
# GPT-2 (gpt2-mini) and a Llama (llama-tiny, untied embedding); every step line and metrics
# record carries MFU, and on the CPU its peak is measured and said to be.
# The difference has two parts, both small next to 6 N: the profiler counts products only (no
# position embedding, norms or biases), and causal attention as 7 L C T (2 T C per layer and
# token forward, 2.5 times that backward) where Kaplan's convention is 6 L C T.
#   test_mfu.sh DDP_WORKER DDP_PREP
set -uo pipefail
worker=$1 prep=$2
tmp=$(mktemp -d /tmp/ddp-test-mfu.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export DDP_LOG_LEVEL=info

. "$(dirname "$0")/../tap.sh"
. "$(dirname "$0")/../corpus.sh"

fox_corpus "$prep" "$tmp" 4000 --val-fraction 0.1 || { not_ok "ddp-prep"; tap_plan; exit 1; }

for preset in gpt2-mini:256 llama-tiny:128; do
  name=${preset%%:*} T=${preset##*:}
  cat >"$tmp/$name.yaml" <<YAML
name: mfu-$name
model: {preset: $name}
data: {train: "$tmp/data/train_*.bin"}
train: {steps: 4, micro_batch: 2, seq_len: $T, lr: 1.0e-3, warmup: 1, val_every: 0,
        sample_tokens: 0, threads: 1, precision: fp32, profile: 2}
YAML
  if "$worker" "$tmp/$name.yaml" --run-dir "$tmp/$name" >"$tmp/$name.log" 2>&1; then
    ok "$name: a 4-step run with train.profile: 2"
  else
    not_ok "$name: a 4-step run with train.profile: 2" "$(tail -5 "$tmp/$name.log")"
    continue
  fi
  check "$name: the count is within 3% of the profiler's FLOPs per token" \
      python3 - "$tmp/$name.log" "$tmp/$name/profile-rank0.json" 2 "$T" <<'PY'
import json, re, sys
log, prof, B, T = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
m = re.search(r"MFU: 6 N \+ 6 L C T = ([0-9.e+]+) MFLOP per token", open(log).read())
ours = float(m.group(1)) * 1e6
p = json.load(open(prof))
theirs = p["total"]["flops"] / p["steps"]["count"] / (B * T)
diff = (ours - theirs) / theirs
print(f"# ours {ours:.6g}, profiler {theirs:.6g} FLOP per token: {100 * diff:+.2f}%")
sys.exit(0 if abs(diff) < 0.03 else 1)
PY
  check "$name: every step line carries MFU, and the peak is measured on the CPU" \
      bash -c "test \$(grep -c 'step .*/4 | .* tok/s | MFU [ 0-9.]*% |' '$tmp/$name.log') -eq 4 &&
               grep -q 'peak .* TFLOP/s per rank, measured: a fp32 product of 512' '$tmp/$name.log'"
  # (not "at most 1": a measured peak is the fastest of its rounds, but other processes on
  # this machine may slow every round)
  check "$name: every step record of metrics.jsonl has its mfu: tokens/s x count / peak" \
      python3 - "$tmp/$name.log" "$tmp/$name/metrics.jsonl" <<'PY'
import json, re, sys
m = re.search(r"= ([0-9.e+]+) MFLOP per token; peak ([0-9.e+-]+) TFLOP/s", open(sys.argv[1]).read())
count, peak = float(m.group(1)) * 1e6, float(m.group(2)) * 1e12
steps = [r for r in map(json.loads, open(sys.argv[2])) if "loss" in r and "step" in r]
ok = len(steps) == 4 and all(
    abs(r["mfu"] / (r["tokens_per_s"] * count / peak) - 1) < 0.01 for r in steps)
sys.exit(0 if ok else 1)
PY
done
tap_plan
