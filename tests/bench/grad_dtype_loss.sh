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
# The jobs run at once (nice); RUNS="fp32-w2 bf16g-w2 fp32-w1" runs only those (the three that
# compare bf16 gradients with fp32, at 3/5 of the time). Prints each run's final train loss, the
# mean of its last 50 steps' losses and its final validation loss, then the differences that
# matter (those whose two runs ran). The data is ddp-prep's split (the last 10% for validation).
# Each run leaves its final checkpoint in OUT_DIR/NAME-checkpoints: the script also prints the
# largest relative difference of a weight tensor between the compared runs (the weights drift
# further apart than the loss shows), and a checkpoint can be scored on make_task.py's task
# from that validation split (ddp-worker --eval).
#   tests/bench/grad_dtype_loss.sh BUILD_DIR TEXT_FILE [PRESET (gpt2-mini)] [STEPS (2000)] [MICRO]
set -uo pipefail
build=$(cd "${1:?usage: grad_dtype_loss.sh BUILD_DIR TEXT [PRESET] [STEPS]}" && pwd)
text=${2:?text file}
preset=${3:-gpt2-mini} steps=${4:-2000} micro=${5:-4}
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=${OUT_DIR:-$(mktemp -d /tmp/ddp-grad-loss.XXXXXX)}
mkdir -p "$tmp"
"$build/worker/ddp-prep" --out "$tmp/data" "$text" >/dev/null || exit 1
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
        "$root/deploy/launch-local.sh" "$n" "$tmp/job.yaml" --quiet \
        --set checkpoint.dir="$tmp/$name-checkpoints" "$@" >"$tmp/$name.log" 2>&1 ||
        echo "$name FAILED: $(tail -1 "$tmp/$name.log")" >&2
}
runs=${RUNS:-fp32-w2 bf16g-w2 fp32-w1 bf16a-w2 bf16a-w1}
for name in $runs; do
    case $name in
    fp32-w2) job fp32-w2 2 & ;;
    bf16g-w2) job bf16g-w2 2 --set ddp.grad_dtype=bf16 & ;;
    fp32-w1) job fp32-w1 1 & ;;
    bf16a-w2) job bf16a-w2 2 --set train.precision=bf16 & ;;
    bf16a-w1) job bf16a-w1 1 --set train.precision=bf16 & ;;
    *) echo "grad_dtype_loss.sh: unknown run '$name' in RUNS" >&2; exit 2 ;;
    esac
done
wait
python3 - "$tmp" $runs <<'PY'
import json, sys
d = sys.argv[1]
runs = sys.argv[2:]
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
def weights(name):
    import glob
    import numpy as np
    from safetensors.numpy import load_file
    steps = sorted(glob.glob(f"{d}/{name}-checkpoints/step-*"))
    if not steps: return None
    w = {}
    for f in sorted(glob.glob(f"{steps[-1]}/model*.safetensors")):
        w.update({k: v.astype(np.float64) for k, v in load_file(f).items()})
    return w
def weight_diff(a, b):
    try:
        wa, wb = weights(a), weights(b)
    except ImportError:
        return ", weights: numpy and safetensors not installed"
    if not wa or not wb: return ", weights: no checkpoint"
    import numpy as np
    # per tensor: the largest element difference over the tensor's largest magnitude
    rel = {k: np.abs(wa[k] - wb[k]).max() / max(np.abs(wa[k]).max(), 1e-30) for k in wa}
    worst = max(rel, key=rel.get)
    num = sum(((wa[k] - wb[k]) ** 2).sum() for k in wa)
    den = sum((wa[k] ** 2).sum() for k in wa)
    return (f", weights: largest relative difference {rel[worst]:.2e} ({worst}), "
            f"all weights' relative L2 {(num / den) ** 0.5:.2e}")
def diff(a, b, what):
    if a not in r or b not in r: return
    x, y = r[a], r[b]
    v = "" if x[2] is None or y[2] is None else f", val {x[2] - y[2]:+.5f}"
    print(f"{what}: {a} - {b}: final {x[0] - y[0]:+.5f}, last-50 mean {x[1] - y[1]:+.5f}{v}"
          f"{weight_diff(a, b)}")
diff("bf16g-w2", "fp32-w2", "bf16 gradients against fp32")
diff("fp32-w1", "fp32-w2", "fp32 at 1 and 2 ranks")
diff("bf16a-w1", "bf16a-w2", "bf16 activations at 1 and 2 ranks")
PY
