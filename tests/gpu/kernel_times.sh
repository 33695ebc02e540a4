#!/usr/bin/env bash
# Every kernel of one GPT-2 124M bf16 training step under Nsight Compute: which products, which
# of cuBLASLt's kernels and tiles, and how long each of ddpd's own kernels takes, the detail that
# the per-op profile (train.profile) sums away. Two steps run under `ncu --clock-control none`
# (the card's own clocks) with one metric, the kernel's duration; tests/gpu/kernel_times.py
# keeps the second step's kernels and prints them grouped, largest first. ncu runs the kernels
# one at a time, so the sum is kernel time only (no overlap, no launch gaps). About a minute.
#   tests/gpu/kernel_times.sh [BUILD_DIR]   OUT=<dir> (default a temporary one), B and T (8, 1024)
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
. "$src/tests/gpu/lib.sh"
bdir=${1:-$src/build-gpu}
out=${OUT:-$(mktemp -d /tmp/ddp-ncu.XXXXXX)}
mkdir -p "$out"
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
[ -n "$ncu" ] || { echo "kernel_times: SKIP: no ncu here"; exit 0; }
word_salad_shards "$bdir" "$out" || { echo "kernel_times: ddp-prep failed"; exit 1; }
cat >"$out/step.yaml" <<YAML
name: kernel-times
model: {preset: gpt2-124M}
data: {train: "$out/data/train_*.bin"}
train: {steps: 2, micro_batch: ${B:-8}, seq_len: ${T:-1024}, lr: 3e-4, warmup: 1, seed: 1,
        sample_tokens: 0, val_every: 0, precision: bf16}
YAML
DDP_COLL_PATH=$bdir/collectives timeout 300 "$ncu" --clock-control none \
    --metrics gpu__time_duration.sum --csv --log-file "$out/ncu.csv" \
    "$bdir/worker/ddp-worker" "$out/step.yaml" --backend cuda >"$out/ncu-worker.log" 2>&1
rc=$?
[ $rc -eq 0 ] || { echo "kernel_times: ncu exit $rc"; tail -n 15 "$out/ncu-worker.log"; exit 1; }
python3 "$src/tests/gpu/kernel_times.py" "$out/ncu.csv" "${ROWS:-40}"
