#!/usr/bin/env bash
# TensorBoard event files from a real 2-rank training run (TAP), read back with TensorBoard's
# own reader (tensorboard.backend.event_processing): every scalar of metrics.jsonl at its step
# with its value, and a flipped byte rejected by the record CRCs.
#   test_tensorboard.sh DDP_WORKER DDP_PREP
# Installs the `tensorboard` package from PyPI when it is missing; skips (77) only when that
# fails.
set -uo pipefail
worker=$1 prep=$2
here=$(cd "$(dirname "$0")" && pwd)
root=${DDP_SOURCE_ROOT:-$here/../..}
tmp=$(mktemp -d /tmp/ddp-test-tb.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export DDP_WORKER=$worker DDP_LOG_LEVEL=warn

if ! python3 -c 'import tensorboard' 2>/dev/null; then
  python3 -m pip install -q tensorboard >"$tmp/pip.log" 2>&1 ||
    python3 -m pip install -q --break-system-packages tensorboard >>"$tmp/pip.log" 2>&1
  python3 -c 'import tensorboard' 2>/dev/null ||
    { echo "1..0 # SKIP the tensorboard package cannot be installed"; tail -3 "$tmp/pip.log"; exit 77; }
fi

. "$(dirname "$0")/../tap.sh"
. "$(dirname "$0")/../corpus.sh"

fox_corpus "$prep" "$tmp" 3000 --val-fraction 0.1 || { not_ok "ddp-prep made the training shards"; tap_plan; exit 1; }
cat >"$tmp/job.yaml" <<YAML
name: tb-test
model: {preset: gpt2-tiny}
data: {train: "$tmp/data/train_*.bin", val: "$tmp/data/val_*.bin"}
train: {steps: 8, micro_batch: 2, seq_len: 32, lr: 1.0e-3, warmup: 2, val_every: 3,
        val_batches: 2, sample_tokens: 0, threads: 1}
ddp: {bucket_mb: 0.25, first_bucket_mb: 0.0625}
eval:
  - {name: tiny, path: "$tmp/task.jsonl", every: 4}
YAML
printf '%s\n' '{"context": "line 3: the", "choices": [" quick", "x y"], "label": 0}' \
    '{"context": "the quick brown", "choices": [" fox", " dog"], "label": 0}' >"$tmp/task.jsonl"
run=$tmp/run
if RUN_DIR=$run "$root/deploy/launch-local.sh" 2 "$tmp/job.yaml" --quiet >"$tmp/launch.log" 2>&1; then
  ok "a 2-rank run of 8 steps finished"
else
  not_ok "a 2-rank run of 8 steps finished" "$(tail -5 "$tmp/launch.log")"
fi
files=("$run"/tb/events.out.tfevents.*)
if [ ${#files[@]} -eq 1 ] && [ -s "${files[0]}" ]; then
  ok "rank 0 wrote one event file, RUN_DIR/tb/events.out.tfevents.<time>.<host>"
else
  not_ok "rank 0 wrote one event file" "$(ls -la "$run" "$run/tb" 2>&1)"
fi

python3 "$here/tb_check.py" "$run" "$TAP_N" tiny >"$tmp/check.out" 2>"$tmp/check.err"
rc=$?
cat "$tmp/check.out"
TAP_N=$((TAP_N + $(grep -cE '^(not )?ok ' "$tmp/check.out")))
[ $rc -eq 0 ] || { TAP_FAILED=$((TAP_FAILED + 1)); grep -q '^not ok' "$tmp/check.out" || not_ok "tb_check.py ran" "$(tail -5 "$tmp/check.err")"; }

# the record CRCs are real: flip one byte of the last record's payload, and TensorBoard's
# reader drops that record (the run's final_loss, written last) and keeps the ones before it
mkdir -p "$tmp/bad/tb"
cp "${files[0]}" "$tmp/bad/tb/"
bad=("$tmp"/bad/tb/events.*)
size=$(stat -c %s "${bad[0]}")
printf '\xff' | dd of="${bad[0]}" bs=1 seek=$((size - 8)) conv=notrunc status=none
steps=$(python3 - "$tmp/bad/tb" <<'PY' 2>/dev/null
import sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0}); ea.Reload()
tags = ea.Tags()["scalars"]
print(len(ea.Scalars("loss/train")), len(ea.Scalars("final_loss")) if "final_loss" in tags else 0)
PY
)
if [ "$steps" = "8 0" ]; then
  ok "a flipped byte in the last record: TensorBoard's reader rejects it, keeps those before"
else
  not_ok "a flipped byte in the last record is rejected" "loss/train, final_loss read: '$steps' (want '8 0')"
fi
tap_plan
exit $((TAP_FAILED > 0))
