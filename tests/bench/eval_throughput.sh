#!/usr/bin/env bash
# Multiple-choice scoring against training, tokens/s of the same model in one invocation
# (issue 48; target: scoring >= 2.5x training).
#
#   tests/bench/eval_throughput.sh [build-dir]        (default: build)
#
# 1. ddp-worker trains PRESET (default gpt2-mini) for STEPS steps (default 12) at micro_batch B
#    (default 4) x seq_len T (default the preset's block_size, 256), fp32, THREADS compute
#    threads (default 0: all cores), with an `eval` task scored every EVERY steps (default 2),
#    saving a checkpoint at the end. Each evaluation's scoring tokens/s (the eval record's tokens
#    over its eval_ms) is set against the training tokens/s of the EVERY steps just before it
#    (same process, model, kernels, threads, and nearly the same moment: on a shared machine the
#    load drifts, and alternating cancels most of it); the figure is the median of those ratios
#    (the first evaluation, after the warm-up steps, left out when there are others).
# 2. ddp-worker --eval scores the same task with that checkpoint (fp32, CPU kernels, 4 rows).
# The task: N examples (default 8), four choices each, contexts of 40 lines of tinyshakespeare's
# validation split, so each forward is [4, ~T]; tokens are the forwards' positions, padding
# included (a forward pays for it). Prints the figures and ratios. Not pass/fail; not in CI.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
preset=${PRESET:-gpt2-mini} steps=${STEPS:-12} B=${B:-4} T=${T:-256} n=${N:-8} every=${EVERY:-2}
threads=${THREADS:-0}
text=${TEXT:-$src/../shared/data/tinyshakespeare.txt}
[ -f "$text" ] || text=/work/shared/data/tinyshakespeare.txt
tmp=$(mktemp -d /tmp/ddp-eval-bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export DDP_LOG_LEVEL=warn
"$build/worker/ddp-prep" --out "$tmp/data" "$text" >/dev/null
python3 - "$text" "$n" >"$tmp/task.jsonl" <<'PY'
import json, random, sys
data = open(sys.argv[1], "rb").read()
n_val = int(len(data) * 0.1 + 0.5)
lines = [l for l in data[len(data) - n_val:].decode().split("\n")[1:] if l.strip()]
rng = random.Random(48)
for i in rng.sample(range(40, len(lines)), int(sys.argv[2])):
    ch = [lines[rng.randrange(len(lines))] for _ in range(3)]
    label = rng.randrange(4)
    ch.insert(label, lines[i])
    print(json.dumps({"context": "\n".join(lines[i - 40:i]) + "\n", "choices": ch, "label": label}))
PY
cat >"$tmp/job.yaml" <<YAML
name: eval-bench
model: {preset: $preset}
data: {train: "$tmp/data/train_*.bin"}
train: {steps: $steps, micro_batch: $B, seq_len: $T, lr: 1.0e-3, warmup: 1, sample_tokens: 0,
        threads: $threads, log_every: 1, precision: fp32}
checkpoint: {dir: "$tmp/ckpt"}
eval:
  - {name: bench, path: "$tmp/task.jsonl", every: $every}
YAML
"$build/worker/ddp-worker" --quiet --run-dir "$tmp/run" "$tmp/job.yaml" >"$tmp/train.log" 2>&1 ||
    { tail -5 "$tmp/train.log"; exit 1; }
ckpt=$(ls -d "$tmp"/ckpt/step-* | tail -1)
"$build/worker/ddp-worker" --eval "$tmp/task.jsonl" --init-from "$ckpt" >"$tmp/eval.out" 2>"$tmp/eval.log" ||
    { cat "$tmp/eval.log"; exit 1; }
python3 - "$tmp/run/metrics.jsonl" "$tmp/eval.out" "$preset" "$B" "$T" "$every" <<'PY'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
steps = {o["step"]: o["tokens_per_s"] for o in lines if "loss" in o and "event" not in o}
evals = [o for o in lines if o.get("event") == "eval"]
every = int(sys.argv[6])
rows = []
for e in evals:
    before = [steps[s] for s in range(e["step"] - every + 1, e["step"] + 1) if s in steps]
    train = statistics.median(before)
    score = e["tokens"] / (e["eval_ms"] / 1e3)
    rows.append((e["step"], train, score, score / train))
    print(f"  after step {e['step']:3d}: training {train:8,.0f} tokens/s, scoring {score:8,.0f} "
          f"tokens/s ({e['tokens']} tokens in {e['eval_ms'] / 1e3:.2f} s): {score / train:.2f}x")
use = rows[1:] or rows
ratio = statistics.median(r[3] for r in use)
train_all = statistics.median(steps[s] for s in sorted(steps)[2:] or sorted(steps))
print(f"{sys.argv[3]}, fp32, CPU, micro_batch {sys.argv[4]} x {sys.argv[5]}: in the loop, "
      f"scoring/training = {ratio:.2f}x (median of {len(use)} evaluations; target >= 2.5x)")
ev = json.loads(open(sys.argv[2]).readline())
score = ev["tokens"] / ev["seconds"]
print(f"ddp-worker --eval on the final checkpoint: scoring {score:,.0f} tokens/s against the "
      f"run's median training {train_all:,.0f} tokens/s: {score / train_all:.2f}x")
PY
