#!/usr/bin/env bash
# Multiple-choice scoring against training, tokens/s of the same model in one invocation
# (issue 48; target: scoring >= 2.5x training).
#
#   tests/bench/eval_throughput.sh [build-dir]        (default: build)
#
# 1. ddp-worker trains PRESET (default gpt2-mini) for STEPS steps (default 8) at micro_batch B
#    (default 4) x seq_len T (default the preset's block_size, 256), fp32, THREADS compute
#    threads (default 0: all cores), with an `eval` task scored after the last step, saving a
#    checkpoint at the end. Training tokens/s: the median of the step records after the first 2;
#    in-loop scoring tokens/s: the eval record's tokens over its eval_ms (same process, model,
#    kernels and threads).
# 2. ddp-worker --eval scores the same task with that checkpoint (fp32, CPU kernels, 4 rows).
# The task: N examples (default 32), four choices each, contexts of 40 lines of tinyshakespeare's
# validation split, so each forward is [4, ~T]; tokens are the forwards' positions, padding
# included (a forward pays for it). Prints the figures and ratios. Not pass/fail; not in CI.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
preset=${PRESET:-gpt2-mini} steps=${STEPS:-8} B=${B:-4} T=${T:-256} n=${N:-32}
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
  - {name: bench, path: "$tmp/task.jsonl"}
YAML
"$build/worker/ddp-worker" --quiet --run-dir "$tmp/run" "$tmp/job.yaml" >"$tmp/train.log" 2>&1 ||
    { tail -5 "$tmp/train.log"; exit 1; }
ckpt=$(ls -d "$tmp"/ckpt/step-* | tail -1)
"$build/worker/ddp-worker" --eval "$tmp/task.jsonl" --init-from "$ckpt" >"$tmp/eval.out" 2>"$tmp/eval.log" ||
    { cat "$tmp/eval.log"; exit 1; }
python3 - "$tmp/run/metrics.jsonl" "$tmp/eval.out" "$preset" "$B" "$T" <<'PY'
import json, statistics, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l and '"event"' not in l]
train = statistics.median(s["tokens_per_s"] for s in steps[2:] or steps)
print(f"{sys.argv[3]}, fp32, CPU: training {train:,.0f} tokens/s (micro_batch {sys.argv[4]} x "
      f"{sys.argv[5]}, median of {len(steps[2:] or steps)} steps)")
rec = [json.loads(l) for l in open(sys.argv[1]) if '"event":"eval"' in l][-1]
loop = rec["tokens"] / (rec["eval_ms"] / 1e3)
print(f"in the loop:       scoring {loop:,.0f} tokens/s ({rec['examples']} examples, "
      f"{rec['tokens']} tokens in {rec['eval_ms'] / 1e3:.2f} s): {loop / train:.2f}x training")
ev = json.loads(open(sys.argv[2]).readline())
score = ev["tokens"] / ev["seconds"]
print(f"ddp-worker --eval: scoring {score:,.0f} tokens/s ({ev['examples']} examples, "
      f"{ev['tokens']} tokens in {ev['seconds']:.2f} s): {score / train:.2f}x training "
      f"(target >= 2.5x)")
PY
