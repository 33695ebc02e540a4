#!/usr/bin/env bash
# Checkpoint benchmark (issue 5), one invocation: the training stall per save and the save's write
# throughput against a plain write. Not a timed test.
#
#   tests/bench/checkpoint_stall.sh [BUILD_DIR] [STEPS] [EVERY] [PAIRS]   (defaults: build 16 4 2)
#
# Stall: GPT-2 124M on the CPU, B=4, T=64, the same job run without and with
# checkpoint.every=EVERY (PAIRS times each, alternating). From metrics.jsonl's wall_ms (time since
# the training loop started, taken at the end of each step):
#     stall per save = ((wall[STEPS] - wall[1]) with saves - the same without) / saves in between
# i.e. everything a save costs the training loop from the end of step 1 to the end of the last
# step: the work at the step boundary, the wait before the next update, and the slowdown of the
# steps the writer runs beside. Step 1 (warm-up) and the save of the last step (written after
# the loop, at the end of training) are outside the window; every other save is in it, and the
# script checks that the last one in it was committed before the window closed.
#
# Throughput: BUILD_DIR/tests/unit/checkpoint/bench_checkpoint (ninja -C BUILD_DIR
# tests/unit/checkpoint/bench_checkpoint) on the same disk: the saver alone writing the same
# 1.5 GB state, against a plain sequential write + fsync of the same bytes.
set -euo pipefail
build=${1:-build} steps=${2:-16} every=${3:-4} pairs=${4:-2}
here=$(cd "$(dirname "$0")/../.." && pwd)
worker=$here/$build/worker/ddp-worker prep=$here/$build/worker/ddp-prep
bench=$here/$build/tests/unit/checkpoint/bench_checkpoint
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ddp-ckpt-stall.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "command: $0 $build $steps $every $pairs; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset};" \
     "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
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
for p in $(seq 1 "$pairs"); do
    "$worker" "$tmp/job.yaml" --run-dir "$tmp" >"$tmp/base$p.log" 2>&1
    mv "$tmp/metrics.jsonl" "$tmp/base$p.jsonl"
    rm -rf "$tmp/ck"
    "$worker" "$tmp/job.yaml" --run-dir "$tmp" --set checkpoint.dir=\"$tmp/ck\" \
        --set checkpoint.every="$every" --set checkpoint.keep_last=1 >"$tmp/ckpt$p.log" 2>&1
    mv "$tmp/metrics.jsonl" "$tmp/ckpt$p.jsonl"
done
python3 - "$tmp" "$steps" "$every" "$pairs" <<'PY'
import json, re, statistics, sys
tmp, steps, every, pairs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def wall(name):
    w = {r["step"]: r["wall_ms"] for r in map(json.loads, open(f"{tmp}/{name}.jsonl")) if "wall_ms" in r}
    return w[steps] - w[1]
saves = [s for s in range(1, steps) if s % every == 0]
print(f"GPT-2 124M, B=4, T=64, {steps} steps, checkpoint.every={every} (CPU, fp32, ddp-worker "
      f"default threads); window: end of step 1 to end of step {steps}, saves of steps {saves}")
print("| pair | window without saves | with saves | mean step without | stall per save | % of a step |")
print("|---|---|---|---|---|---|")
stalls, pcts = [], []
for p in range(1, pairs + 1):
    b, c = wall(f"base{p}"), wall(f"ckpt{p}")
    step = b / (steps - 1)
    stall = (c - b) / len(saves)
    stalls.append(stall); pcts.append(100 * stall / step)
    print(f"| {p} | {b:.0f} ms | {c:.0f} ms | {step:.0f} ms | {stall:.0f} ms | {100*stall/step:.1f}% |")
    log = open(f"{tmp}/ckpt{p}.log").read()
    # the last save in the window must be committed before step `steps` ended
    last = saves[-1]
    mc = re.search(rf"checkpoint step {last}: [\d.]+ MB in .*committed", log)
    i_end = log.find(f"step {steps:5d}/")
    if not mc or i_end < 0 or mc.start() > i_end:
        print(f"|   | WARNING: the save of step {last} was not committed inside the window |||||")
print(f"**median stall per save: {statistics.median(stalls):.0f} ms = "
      f"{statistics.median(pcts):.1f}% of a step** ({pairs} pair(s))")
log = open(f"{tmp}/ckpt{pairs}.log").read()
waits = re.findall(r"the update waited ([\d.]+) ms for it \(([\d.]+) MB left to copy\)", log)
m = re.search(r"checkpoint: (\d+) save\(s\); training thread paid ([\d.]+) ms at step boundaries", log)
writes = re.findall(r"checkpoint step (\d+): ([\d.]+ MB in [\d.]+ s \(\d+ MB/s\))", log)
print(f"last pair, per save: training thread at the boundary "
      f"{float(m.group(2)) / int(m.group(1)):.1f} ms (incl. the final save); update waited "
      + ", ".join(f"{w} ms ({mb} MB copied)" for w, mb in waits))
print("last pair, writer beside training: " + "; ".join(f"step {s}: {w}" for s, w in writes))
PY
if [ -x "$bench" ]; then
    "$bench" --dir "$tmp/bench" --runs 3
else
    echo "(write throughput: build $bench with: ninja -C $build tests/unit/checkpoint/bench_checkpoint)"
fi
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
