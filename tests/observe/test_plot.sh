#!/usr/bin/env bash
# `ddpctl plot` on the metrics of a real training run (TAP): SVG and PNG that are what they
# claim and show the curves, the log scale, generation changes marked, and usage errors.
#   test_plot.sh DDPCTL DDP_WORKER DDP_PREP
set -uo pipefail
ctl=$1 worker=$2 prep=$3
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d /tmp/ddp-test-plot.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
command -v gnuplot >/dev/null || { echo "1..0 # SKIP gnuplot is not installed (deploy/install-deps.sh)"; exit 77; }
python3 -c 'import PIL' 2>/dev/null || { echo "1..0 # SKIP python3-pil is not installed"; exit 77; }

. "$(dirname "$0")/../tap.sh"
. "$(dirname "$0")/../corpus.sh"

fox_corpus "$prep" "$tmp" 3000 --val-fraction 0.1 || { not_ok "ddp-prep made the training shards"; tap_plan; exit 1; }
cat >"$tmp/job.yaml" <<YAML
name: plot-test
model: {preset: gpt2-tiny}
data: {train: "$tmp/data/train_*.bin", val: "$tmp/data/val_*.bin"}
train: {steps: 40, micro_batch: 2, seq_len: 32, lr: 2.0e-3, warmup: 4, val_every: 10,
        val_batches: 2, sample_tokens: 0, threads: 1}
YAML
check "a 40-step run wrote its metrics" "$worker" "$tmp/job.yaml" --quiet --run-dir "$tmp/run"

check "ddpctl plot RUN_DIR -o FILE.svg" "$ctl" plot "$tmp/run" -o "$tmp/loss.svg"
check "the SVG is well-formed, shows both losses and tokens/s, one point per step" \
    python3 "$here/plot_check.py" "$tmp/loss.svg" 40
check "MFU is drawn on its own axis beside tokens/s" \
    bash -c "grep -q '>MFU (%)<' '$tmp/loss.svg' && grep -q '>MFU<' '$tmp/loss.svg'"
check "ddpctl plot metrics.jsonl -o FILE.png" "$ctl" plot "$tmp/run/metrics.jsonl" -o "$tmp/loss.png"
check "the PNG is 1000x720 and the three curves are drawn in it" \
    python3 "$here/plot_check.py" "$tmp/loss.png" 40
check "--log draws the loss on a log scale" \
    bash -c "'$ctl' plot '$tmp/run' --log -o '$tmp/log.svg' && grep -q 'log scale' '$tmp/log.svg'"

# generation changes (the elastic work adds "generation" to the step lines): marked and named
mkdir -p "$tmp/gen"
python3 - "$tmp/run/metrics.jsonl" >"$tmp/gen/metrics.jsonl" <<'PY'
import json, sys
for l in open(sys.argv[1]):
    o = json.loads(l)
    if "loss" in o:
        o["generation"] = 0 if o["step"] <= 15 else (1 if o["step"] <= 30 else 2)
    print(json.dumps(o))
PY
check "generation changes are marked and named" bash -c "'$ctl' plot '$tmp/gen' -o '$tmp/gen.svg' &&
    python3 '$here/plot_check.py' '$tmp/gen.svg' 40 'generation 1' 'generation 2'"
check "without a generation field nothing is marked" bash -c "! grep -q generation '$tmp/loss.svg'"

"$ctl" plot "$tmp/run" -o "$tmp/loss.pdf" >"$tmp/o.log" 2>&1
rc=$?
[ $rc -eq 64 ] && grep -q "must end in .svg or .png" "$tmp/o.log" && ok "-o FILE.pdf: usage error naming the formats" ||
    not_ok "-o FILE.pdf: usage error" "exit $rc: $(cat "$tmp/o.log")"
"$ctl" plot "$tmp/nothing-here" >"$tmp/o.log" 2>&1
rc=$?
[ $rc -eq 64 ] && grep -q "neither a job id" "$tmp/o.log" && ok "a path that does not exist: usage error" ||
    not_ok "a path that does not exist" "exit $rc: $(cat "$tmp/o.log")"
mkdir -p "$tmp/empty" && : >"$tmp/empty/metrics.jsonl"
"$ctl" plot "$tmp/empty" -o "$tmp/e.svg" >"$tmp/o.log" 2>&1
rc=$?
[ $rc -eq 70 ] && grep -q "no step lines yet" "$tmp/o.log" && [ ! -e "$tmp/e.svg" ] &&
    ok "a run without steps yet: a clear error, no picture" || not_ok "empty metrics" "exit $rc: $(cat "$tmp/o.log")"
tap_plan
exit $((TAP_FAILED > 0))
