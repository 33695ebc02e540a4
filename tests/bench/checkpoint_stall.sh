#!/usr/bin/env bash
# Training stall per checkpoint save (issue 5): GPT-2 124M on the CPU, B=4, T=64, the same
# steps with and without checkpoint.every, step times from metrics.jsonl. Not a timed test.
#
#   tests/bench/checkpoint_stall.sh [BUILD_DIR] [STEPS] [EVERY]     (defaults: build 8 2)
#
# Prints a table: mean step time of the steps that overlap a snapshot (the step right after a
# save), of the other steps, and the same steps in the run without checkpoints; plus what the
# training thread paid at the step boundaries and waiting for the snapshot (from the log).
# Stall per save = (overlapped steps - same steps without checkpoints) + boundary + wait.
set -euo pipefail
build=${1:-build} steps=${2:-8} every=${3:-2}
here=$(cd "$(dirname "$0")/../.." && pwd)
worker=$here/$build/worker/ddp-worker prep=$here/$build/worker/ddp-prep
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ddp-ckpt-stall.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
python3 -c "
import random
r = random.Random(1)
w = 'the of and to in a is that for it as was with be by on not he this are or his'.split()
print('\n'.join(' '.join(r.choice(w) for _ in range(16)) for _ in range(20000)))" >"$tmp/text.txt"
"$prep" --out "$tmp/data" "$tmp/text.txt" >/dev/null
cat >"$tmp/job.yaml" <<YAML
name: ckpt-stall
model: {preset: gpt2-124M}
data: {train: $tmp/data/train_*.bin}
train: {steps: $steps, micro_batch: 4, seq_len: 64, lr: 3e-4, warmup: 1, seed: 1, sample_tokens: 0}
YAML
cmd_base="ddp-worker job.yaml --quiet"
cmd_ckpt="$cmd_base --set checkpoint.dir=DIR --set checkpoint.every=$every --set checkpoint.keep_last=1"
"$worker" "$tmp/job.yaml" --quiet --run-dir "$tmp" >"$tmp/base.log" 2>&1
mv "$tmp/metrics.jsonl" "$tmp/base.jsonl"
"$worker" "$tmp/job.yaml" --run-dir "$tmp" --set checkpoint.dir=\"$tmp/ck\" \
    --set checkpoint.every="$every" --set checkpoint.keep_last=1 >"$tmp/ckpt.log" 2>&1
mv "$tmp/metrics.jsonl" "$tmp/ckpt.jsonl"
python3 - "$tmp" "$every" "$steps" "$cmd_base" "$cmd_ckpt" <<'PY'
import json, re, sys
tmp, every, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def times(name):
    return {r["step"]: r["step_ms"] for r in map(json.loads, open(f"{tmp}/{name}.jsonl")) if "step_ms" in r}
base, ck = times("base"), times("ckpt")
over = [s for s in ck if s > 1 and (s - 1) % every == 0 and s - 1 < steps]   # overlap a snapshot
other = [s for s in ck if s not in over and s > 1]                           # step 1 warms up
mean = lambda d, ss: sum(d[s] for s in ss) / max(1, len(ss))
log = open(f"{tmp}/ckpt.log").read()
m = re.search(r"checkpoint: (\d+) save\(s\); training thread paid ([\d.]+) ms at step boundaries and ([\d.]+) ms waiting", log)
saves, boundary, wait = int(m.group(1)), float(m.group(2)), float(m.group(3))
snaps = [float(x) for x in re.findall(r"snapshot copied in ([\d.]+) ms", log)]
writes = re.findall(r"checkpoint step \d+: ([\d.]+ MB in [\d.]+ s \(\d+ MB/s\))", log)
n_over = max(1, len(over))
stall = mean(ck, over) - mean(base, over) + (boundary + wait) / saves
print(f"GPT-2 124M, B=4, T=64, {steps} steps, checkpoint.every={every} (CPU, fp32)")
print(f"  without: {sys.argv[4]}\n  with:    {sys.argv[5]}")
print(f"| | step ms |\n|---|---|")
print(f"| no checkpoints, steps {over} | {mean(base, over):.0f} |")
print(f"| with checkpoints, same steps (each overlaps a snapshot copy) | {mean(ck, over):.0f} |")
print(f"| with checkpoints, other steps | {mean(ck, other):.0f} (no checkpoints: {mean(base, other):.0f}) |")
print(f"| snapshot copy on the helper thread (would be the stall if synchronous) | {sum(snaps)/max(1,len(snaps)):.0f} |")
print(f"| training thread at the save boundary + waiting for the snapshot, per save | {(boundary + wait)/saves:.1f} |")
print(f"| **stall per save** (overlapped step - same step without + boundary + wait) | **{stall:.0f} ({100*stall/mean(base, over):.1f}% of a step)** |")
print(f"writes: {'; '.join(writes)}")
PY
