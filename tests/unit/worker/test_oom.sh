#!/usr/bin/env bash
# The out-of-memory toolbox with real processes (TAP): train.recompute block gives the weights
# of none bit for bit (1 and 2 ranks) at a lower peak RSS; the memory budget each rank prints
# before step 1 is within 10% of the peak RSS measured (ru_maxrss) for three shapes; a job over
# train.memory_limit fails before step 1 with advice; `ddpctl plan` prints the same budget.
#   test_oom.sh DDP_WORKER DDP_PREP DDPCTL
set -uo pipefail
worker=$1 prep=$2 ddpctl=$3
here=$(cd "$(dirname "$0")" && pwd)
root=${DDP_SOURCE_ROOT:-$here/../../..}
launch="$root/deploy/launch-local.sh"
tmp=$(mktemp -d /tmp/ddp-test-oom.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export DDP_WORKER=$worker DDP_LOG_LEVEL=info

n=0 failed=0
ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() { n=$((n + 1)); failed=$((failed + 1)); echo "not ok $n - $1"; }
check() { local what=$1; shift; if "$@" >"$tmp/check.log" 2>&1; then ok "$what"; else not_ok "$what"; sed 's/^/# /' "$tmp/check.log"; fi; }

awk 'BEGIN { for (i = 0; i < 8000; i++) printf "line %d: the quick brown fox %d jumps over %d lazy dogs.\n", i, i * 7 % 13, i % 11 }' >"$tmp/text.txt"
"$prep" --out "$tmp/data" --val-fraction 0.1 "$tmp/text.txt" >/dev/null
cat >"$tmp/job.yaml" <<YAML
name: oom-test
model: {preset: gpt2-tiny}
data: {train: "$tmp/data/train_*.bin"}
train: {steps: 6, micro_batch: 2, seq_len: 64, lr: 1.0e-3, val_every: 0, sample_tokens: 0,
        threads: 2}
ddp: {bucket_mb: 0.25, first_bucket_mb: 0.0625}
YAML

echo "1..12"
# 1-2: recompute block == none, bitwise, 1 rank (with accumulation) and 2 ranks
for r in none block; do
  "$worker" "$tmp/job.yaml" --quiet --set train.recompute=$r --set train.global_batch_tokens=256 \
    --dump-weights "$tmp/w1-$r.st" >"$tmp/w1-$r.log" 2>&1 || { cat "$tmp/w1-$r.log"; }
  RUN_DIR="$tmp/run2-$r" "$launch" 2 "$tmp/job.yaml" --quiet --set train.recompute=$r \
    --set train.global_batch_tokens=256 --dump-weights "$tmp/w2-$r.st" >"$tmp/w2-$r.log" 2>&1 ||
    { sed 's/^/# /' "$tmp/w2-$r.log" "$tmp"/run2-$r/rank-*.log; }
done
check "1 rank x 2 micro-steps: recompute block gives none's weights bitwise" cmp "$tmp/w1-none.st" "$tmp/w1-block.st"
check "2 ranks: recompute block gives none's weights bitwise" cmp "$tmp/w2-none.st" "$tmp/w2-block.st"

# 3-5: the budget against the peak RSS, three shapes (one step each; no sample, no validation)
# measured: /usr/bin/time's maximum resident set size (ru_maxrss), else the worker's own line
peak_kib() { # LOG TIMEFILE
  if [ -s "$2" ]; then tail -n 1 "$2"; else sed -n 's/.*(ru_maxrss \([0-9]*\) KiB).*/\1/p' "$1"; fi
}
budget_kib() { sed -n 's/.*the memory budget said .* (\([0-9]*\) KiB).*/\1/p' "$1"; }
shape() { # NAME preset B T recompute global_batch_tokens [extra --set ...]
  local name=$1 preset=$2 B=$3 T=$4 r=$5 gbt=$6; shift 6
  local timer=()
  [ -x /usr/bin/time ] && timer=(/usr/bin/time -f %M -o "$tmp/$name.time")
  "${timer[@]}" "$worker" "$tmp/job.yaml" --set train.steps=1 --set model.preset=$preset \
    --set train.micro_batch=$B --set train.seq_len=$T --set train.recompute=$r \
    --set train.global_batch_tokens=$gbt "$@" >"$tmp/$name.log" 2>&1 || { sed 's/^/# /' "$tmp/$name.log"; return 1; }
  local peak pred
  peak=$(peak_kib "$tmp/$name.log" "$tmp/$name.time") pred=$(budget_kib "$tmp/$name.log")
  echo "# $name: peak RSS $peak KiB, budget $pred KiB"
  eval "peak_$name=$peak pred_$name=$pred"
  python3 -c "import sys; p, b = $peak, $pred; sys.exit(0 if abs(b - p) <= 0.10 * p else 1)" ||
    { echo "# $name: off by more than 10%"; return 1; }
}
check_shape() { local what=$1; shift; if shape "$@"; then ok "$what"; else not_ok "$what"; fi; }
check_shape "budget within 10% of peak RSS: gpt2-tiny 8 x 128" tiny gpt2-tiny 8 128 none 1024
check_shape "budget within 10% of peak RSS: gpt2-mini 4 x 256" mini gpt2-mini 4 256 none 1024
check_shape "budget within 10% of peak RSS: gpt2-mini 4 x 256, recompute block, 2 micro-steps, checkpoints" \
  miniblock gpt2-mini 4 256 block 2048 --set checkpoint.dir="$tmp/ckpt"

# 6: recompute lowers the peak (the same shape as 4, without the accumulation and checkpoint)
if shape miniblock1 gpt2-mini 4 256 block 1024; then
  check "recompute block lowers the peak RSS of gpt2-mini 4 x 256 (${peak_mini:-?} -> ${peak_miniblock1:-?} KiB)" \
    test "${peak_miniblock1:-0}" -lt "$(( ${peak_mini:-0} * 85 / 100 ))"
else
  not_ok "recompute block run"
fi

# 7-8: a job over its limit fails before step 1, naming what helps
if "$worker" "$tmp/job.yaml" --set model.preset=gpt2-mini --set train.micro_batch=8 \
    --set train.seq_len=256 --set train.memory_limit=300MiB >"$tmp/over.log" 2>&1; then
  not_ok "a job over train.memory_limit is refused"
else
  check "a job over train.memory_limit is refused before step 1" bash -c "! grep -q 'step  *1/' '$tmp/over.log' && grep -q 'memory budget: needs .* but the limit is 300.0 MiB' '$tmp/over.log'"
  check "the refusal names micro_batch, recompute, precision and shard_optimizer with savings" \
    bash -c "grep 'memory budget: needs' '$tmp/over.log' | grep 'train.micro_batch [0-9]* (the same global batch in [0-9]* micro-steps per rank) saves' | grep 'train.recompute: block saves' | grep -q 'ddp.shard_optimizer'"
fi

# 9-12: ddpctl plan prints the worker's budget without running; an oversized spec exits 1
sed -n 's/^.*info    total /  total /p' "$tmp/mini.log" >"$tmp/worker-total.txt"
"$ddpctl" plan "$tmp/job.yaml" >"$tmp/plan.txt" 2>&1
check "ddpctl plan prints the budget's lines" grep -q "activations .* recompute none" "$tmp/plan.txt"
sed -e 's/seq_len: 64/seq_len: 256/' -e 's/micro_batch: 2/micro_batch: 4/' \
  -e 's/preset: gpt2-tiny/preset: gpt2-mini/' -e 's/global_batch_tokens: [0-9]*//' \
  "$tmp/job.yaml" >"$tmp/mini.yaml"
"$ddpctl" plan "$tmp/mini.yaml" | grep "^  total" >"$tmp/plan-total.txt"
check "ddpctl plan's total is the worker's for the same spec" diff "$tmp/worker-total.txt" "$tmp/plan-total.txt"
sed 's/threads: 2}/threads: 2, memory_limit: 100MiB}/' "$tmp/mini.yaml" >"$tmp/small.yaml"
"$ddpctl" plan "$tmp/small.yaml" >"$tmp/plan-small.txt" 2>&1
rc=$?
check "ddpctl plan of a spec that cannot fit exits 1 with the advice" bash -c "[ $rc -eq 1 ] && grep -q 'does not fit: needs' '$tmp/plan-small.txt'"
"$ddpctl" plan "$tmp/mini.yaml" --gpu 80GiB >"$tmp/plan-gpu.txt" 2>&1
check "ddpctl plan --gpu 80GiB plans for GPUs of that size" grep -q "total .* of 80.00 GiB (the GPU's memory): fits" "$tmp/plan-gpu.txt"
exit $((failed > 0))
