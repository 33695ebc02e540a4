#!/usr/bin/env bash
# Activation recomputation: peak RSS and tokens/s of one rank with train.recompute none and
# block, and what the memory budget predicted (issue 19's benchmark, the ddpd side).
#
#   tests/bench/recompute.sh [build-dir] [preset B T]     (default: build gpt2-124M 1 1024)
#
# WARMUP untimed steps (default 1), then STEPS measured ones (default 2); medians of
# metrics.jsonl. Peak RSS: /usr/bin/time -v (ru_maxrss). fp32 on the CPU, DDP_THREADS compute
# threads (default 2). GPT-2 124M at 1 x 1024: about 4 minutes on 2 cores.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
model=${2:-gpt2-124M} B=${3:-1} T=${4:-1024}
steps=${STEPS:-2} warmup=${WARMUP:-1} dthreads=${DDP_THREADS:-2}
PY=python3
. "$src/tests/bench/bench_common.sh"
bench_header "$0 $*  (STEPS=$steps WARMUP=$warmup DDP_THREADS=$dthreads)"
worker=$build/worker/ddp-worker prep=$build/worker/ddp-prep
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-bench-recompute.XXXXXX")
trap 'rm -rf "$work"' EXIT
awk 'BEGIN { srand(1337); split("the of and to in that is was he for it with as his on be at by", w, " ");
             for (i = 0; i < 30000; i++) { for (j = 0; j < 8; j++) printf "%s ", w[int(rand() * 18) + 1]; print "." } }' >"$work/text.txt"
"$prep" --val-fraction 0 --out "$work/data" "$work/text.txt" >/dev/null
cat >"$work/job.yaml" <<YAML
name: bench-recompute
model: {preset: $model}
data: {train: "$work/data/train_*.bin"}
train: {steps: $((warmup + steps)), micro_batch: $B, seq_len: $T, warmup: 0, schedule: constant,
        val_every: 0, sample_tokens: 0, threads: $dthreads, precision: fp32}
YAML
echo "| recompute | peak RSS (ru_maxrss) | budget said | tokens/s | step ms |"
echo "|---|---|---|---|---|"
for r in none block; do
  run=$work/run-$r
  cmd=("$worker" "$work/job.yaml" --run-dir "$run" --set train.recompute=$r)
  echo "# ${cmd[*]}" >&2
  DDP_LOG_LEVEL=info /usr/bin/time -v -o "$work/time-$r.txt" "${cmd[@]}" >"$work/$r.log" 2>&1 ||
    { cat "$work/$r.log" >&2; exit 1; }
  stats=$(ddpd_stats "$run" "$warmup")
  budget=$(sed -n 's/.*info    total *\([0-9.]* [KMG]iB\).*/\1/p' "$work/$r.log")
  echo "| $r | $(maxrss_mb "$work/time-$r.txt") MB | $budget | $(jget "$stats" tokens_per_s) | $(jget "$stats" step_ms) |"
done
