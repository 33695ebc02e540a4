#!/usr/bin/env bash
# Timeline trace of real 2-rank training (TAP): train.trace "3-4" makes each rank write Chrome
# trace-event JSON for steps 3 and 4 only; `ddpctl trace` merges them, one process per rank;
# the merged file is valid trace-event JSON with, in each traced step of each rank, forward and
# backward of every block, the optimizer and every bucket's collective on the communication
# lane, and the checkpoint writer of the save at step 3; bad ranges are refused.
#   test_trace.sh DDPCTL DDP_WORKER DDP_PREP
set -uo pipefail
ctl=$1 worker=$2 prep=$3
here=$(cd "$(dirname "$0")" && pwd)
root=${DDP_SOURCE_ROOT:-$here/../..}
tmp=$(mktemp -d /tmp/ddp-test-trace.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export DDP_WORKER=$worker

. "$(dirname "$0")/../tap.sh"
. "$(dirname "$0")/../corpus.sh"

fox_corpus "$prep" "$tmp" 3000 --val-fraction 0.1 || { not_ok "ddp-prep made the training shards"; tap_plan; exit 1; }
cat >"$tmp/job.yaml" <<YAML
name: trace-test
model: {preset: gpt2-tiny}
data: {train: "$tmp/data/train_*.bin"}
train: {steps: 6, micro_batch: 2, seq_len: 32, lr: 1.0e-3, warmup: 1, val_every: 0,
        sample_tokens: 0, threads: 1, trace: "3-4"}
ddp: {bucket_mb: 0.25, first_bucket_mb: 0.0625}
checkpoint: {dir: "$tmp/ck", every: 3}
YAML
run=$tmp/run
if RUN_DIR=$run "$root/deploy/launch-local.sh" 2 "$tmp/job.yaml" >"$tmp/launch.log" 2>&1; then
  ok "a 2-rank run with train.trace: \"3-4\" finished"
else
  not_ok "a 2-rank run with train.trace finished" "$(tail -5 "$tmp/launch.log")"
fi
check "each rank wrote RUN_DIR/trace/rank-R.json, and says so" \
    bash -c "test -s '$run/trace/rank-0.json' && test -s '$run/trace/rank-1.json' &&
             grep -q 'trace of steps 3-4: .* spans in $run/trace/rank-0.json' '$tmp/launch.log'"
check "ddpctl trace RUN_DIR merges the ranks" "$ctl" trace "$run" -o "$tmp/trace.json"
check "valid trace-event JSON: per rank and traced step, every block's forward and backward, the optimizer, every bucket" \
    python3 "$here/trace_check.py" "$tmp/trace.json" 2 3 4
check "the checkpoint writer of the save at step 3 is on rank 0's writer lane" \
    python3 -c "
import json, sys
ev = json.load(open('$tmp/trace.json'))['traceEvents']
sys.exit(0 if any(e['ph'] == 'X' and e['pid'] == 0 and e['tid'] == 4 and
                  e['name'].startswith('checkpoint step 3') for e in ev) else 1)"
check "the data loader's prefetch is on its own lane" \
    python3 -c "
import json, sys
ev = json.load(open('$tmp/trace.json'))['traceEvents']
sys.exit(0 if sum(e['ph'] == 'X' and e['tid'] == 3 and e['name'].startswith('load step')
                  for e in ev) >= 2 else 1)"

if command -v gnuplot >/dev/null && python3 -c 'import PIL' 2>/dev/null; then
  check "the merged trace draws as a timeline (tests/observe/trace_picture.py)" bash -c "
      python3 '$here/trace_picture.py' '$tmp/trace.json' '$tmp/trace.png' &&
      python3 -c \"from PIL import Image; im = Image.open('$tmp/trace.png'); assert im.size[0] == 1200 and len(set(im.convert('RGB').getdata())) > 20\""
fi

"$worker" "$tmp/job.yaml" --set train.trace='"5-2"' >"$tmp/bad.log" 2>&1
rc=$?
[ $rc -eq 2 ] && grep -q 'train.trace: must be "N" or "N-M"' "$tmp/bad.log" &&
    ok "train.trace \"5-2\" is refused naming the field" || not_ok "a bad range is refused" "exit $rc: $(cat "$tmp/bad.log")"
mkdir -p "$tmp/none"
"$ctl" trace "$tmp/none" -o "$tmp/none.json" >"$tmp/none.log" 2>&1
rc=$?
[ $rc -eq 70 ] && grep -q "was the job run with train.trace" "$tmp/none.log" &&
    ok "ddpctl trace on a run without a trace says why" || not_ok "no trace: clear error" "exit $rc: $(cat "$tmp/none.log")"
tap_plan
exit $((TAP_FAILED > 0))
