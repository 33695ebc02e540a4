#!/usr/bin/env bash
# The loss of bf16 gradients (ddp.grad_dtype: bf16) against fp32 gradients, beside how far two
# fp32 runs at different world sizes are apart, and two bf16-activation runs (train.precision:
# bf16) at different world sizes (not pass/fail, not in CI). Same samples, same seed, the global
# batch of MICRO micro-batches (4) dealt over the ranks: with 4, 2 ranks sum (g0 + g2) + (g1 + g3)
# and 1 rank ((g0 + g1) + g2) + g3, another order (with 2 micro-batches the two orders would be
# the same sum, a + b, bitwise):
#   fp32-w2   fp32 gradients and activations, 2 ranks (the reference)
#   bf16g-w2  bf16 gradients, 2 ranks
#   fp32-w1   fp32, 1 rank (another sum order: the fp32 world-size difference)
#   bf16a-w2  bf16 activations (fp32 gradients), 2 ranks
#   bf16a-w1  bf16 activations, 1 rank
# The five jobs run at once (nice). Prints each run's final train loss, the mean of its last 50
# steps' losses and its final validation loss, then the differences that matter.
#   tests/bench/grad_dtype_loss.sh BUILD_DIR TEXT_FILE [PRESET (gpt2-mini)] [STEPS (2000)] [MICRO]
set -uo pipefail
build=$(cd "${1:?usage: grad_dtype_loss.sh BUILD_DIR TEXT [PRESET] [STEPS]}" && pwd)
text=${2:?text file}
preset=${3:-gpt2-mini} steps=${4:-2000} micro=${5:-4}
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=${OUT_DIR:-$(mktemp -d /tmp/ddp-grad-loss.XXXXXX)}
mkdir -p "$tmp"
"$build/worker/ddp-prep" --out "$tmp/data" --val-fraction 0.05 "$text" >/dev/null || exit 1
cat >"$tmp/job.yaml" <<YAML
name: grad-dtype-loss
model: {preset: $preset}
data: {train: "$tmp/data/train_*.bin", val: "$tmp/data/val_*.bin"}
train: {steps: $steps, micro_batch: 4, seq_len: 64, global_batch_tokens: $((micro * 256)),
        lr: 1.0e-3,
        warmup: $((steps / 20 + 1)), val_every: $steps, val_batches: 16, sample_tokens: 0,
        threads: 1, log_every: 1, precision: fp32, seed: 1337, weight_decay: 0.1, clip: 1.0}
ddp: {check_every: 0, shard_optimizer: false}
YAML
job() { # NAME N [options]
    local name=$1 n=$2
    shift 2
    DDP_LOG_LEVEL=warn DDP_WORKER="$build/worker/ddp-worker" RUN_DIR="$tmp/$name" nice \
        "$root/deploy/launch-local.sh" "$n" "$tmp/job.yaml" --quiet "$@" >"$tmp/$name.log" 2>&1 ||
        echo "$name FAILED: $(tail -1 "$tmp/$name.log")" >&2
}
job fp32-w2 2 &
job bf16g-w2 2 --set ddp.grad_dtype=bf16 &
job fp32-w1 1 &
job bf16a-w2 2 --set train.precision=bf16 &
job bf16a-w1 1 --set train.precision=bf16 &
wait
python3 - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
runs = ["fp32-w2", "bf16g-w2", "fp32-w1", "bf16a-w2", "bf16a-w1"]
r = {}
for n in runs:
    loss, val = {}, None
    for line in open(f"{d}/{n}/metrics.jsonl"):
        o = json.loads(line)
        if "loss" in o and "step" in o: loss[o["step"]] = o["loss"]
        for k in ("val_loss",):
            if k in o: val = o[k]
    last = max(loss)
    tail = [loss[s] for s in sorted(loss)[-50:]]
    r[n] = (loss[last], sum(tail) / len(tail), val, last)
    print(f"{n:9s} step {last}: loss {loss[last]:.5f}, mean of the last 50 {r[n][1]:.5f}, "
          f"val {val if val is None else f'{val:.5f}'}")
def diff(a, b, what):
    x, y = r[a], r[b]
    v = "" if x[2] is None or y[2] is None else f", val {x[2] - y[2]:+.5f}"
    print(f"{what}: {a} - {b}: final {x[0] - y[0]:+.5f}, last-50 mean {x[1] - y[1]:+.5f}{v}")
diff("bf16g-w2", "fp32-w2", "bf16 gradients against fp32")
diff("fp32-w1", "fp32-w2", "fp32 at 1 and 2 ranks")
diff("bf16a-w1", "bf16a-w2", "bf16 activations at 1 and 2 ranks")
PY
