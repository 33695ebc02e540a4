#!/usr/bin/env bash
# The out-of-memory toolbox with real processes (TAP): train.recompute block gives the weights
# of none bit for bit (1 and 2 ranks) at a lower peak RSS; the memory budget each rank prints
# before step 1 is within 10% of the peak RSS measured (VmHWM) for three 1-rank shapes, and
# for each rank of 2-rank runs with validation and with checkpoints (where the rank that writes
# the shards needs more than the one that does not); a job over train.memory_limit fails before
# step 1 with advice; `ddpctl plan` prints the same budget, and the non-writers' total.
#   test_oom.sh DDP_WORKER DDP_PREP DDPCTL
set -uo pipefail
worker=$1 prep=$2 ddpctl=$3
here=$(cd "$(dirname "$0")" && pwd)
root=${DDP_SOURCE_ROOT:-$here/../../..}
launch="$root/deploy/launch-local.sh"
tmp=$(mktemp -d /tmp/ddp-test-oom.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export DDP_WORKER=$worker DDP_LOG_LEVEL=info

. "$(dirname "$0")/../../tap.sh"
. "$(dirname "$0")/../../corpus.sh"

fox_corpus "$prep" "$tmp" 8000 --val-fraction 0.1
cat >"$tmp/job.yaml" <<YAML
name: oom-test
model: {preset: gpt2-tiny}
data: {train: "$tmp/data/train_*.bin"}
train: {steps: 6, micro_batch: 2, seq_len: 64, lr: 1.0e-3, val_every: 0, sample_tokens: 0,
        threads: 2}
ddp: {bucket_mb: 0.25, first_bucket_mb: 0.0625}
YAML

echo "1..19"
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

# 3-6: the budget against the peak RSS, four shapes (one step each; no validation; the fourth
# samples)
# measured: /usr/bin/time's maximum resident set size (ru_maxrss), else the worker's own line;
# as a job runs, without meson's MALLOC_PERTURB_ (it fills every block malloc hands out, so
# pages that a run never touches count: the whole 4 MiB O_DIRECT bounce buffer of a save)
peak_kib() { # LOG TIMEFILE
  if [ -s "$2" ]; then tail -n 1 "$2"; else sed -n 's/.*(\(VmHWM\|ru_maxrss\) \([0-9]*\) KiB).*/\2/p' "$1"; fi
}
budget_kib() { sed -n 's/.*the memory budget said .* (\([0-9]*\) KiB).*/\1/p' "$1"; }
shape() { # NAME preset B T recompute global_batch_tokens [extra --set ...]
  local name=$1 preset=$2 B=$3 T=$4 r=$5 gbt=$6; shift 6
  local timer=()
  [ -x /usr/bin/time ] && timer=(/usr/bin/time -f %M -o "$tmp/$name.time")
  "${timer[@]}" env -u MALLOC_PERTURB_ "$worker" "$tmp/job.yaml" --set train.steps=1 \
    --set model.preset=$preset --set train.micro_batch=$B --set train.seq_len=$T \
    --set train.recompute=$r --set train.global_batch_tokens=$gbt "$@" >"$tmp/$name.log" 2>&1 ||
    { sed 's/^/# /' "$tmp/$name.log"; return 1; }
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
# a sample at the end: its context grows token by token (on a CPU with native bf16 each new
# product shape was a oneDNN primitive that stayed resident: 24% over the budget)
check_shape "budget within 10% of peak RSS: gpt2-tiny 4 x 64, a 300-token sample" \
  sample gpt2-tiny 4 64 none 256 --set train.sample_tokens=300

# 7: recompute lowers the peak (the same shape as 4, without the accumulation and checkpoint)
if shape miniblock1 gpt2-mini 4 256 block 1024; then
  check "recompute block lowers the peak RSS of gpt2-mini 4 x 256 (${peak_mini:-?} -> ${peak_miniblock1:-?} KiB)" \
    test "${peak_miniblock1:-0}" -lt "$(( ${peak_mini:-0} * 85 / 100 ))"
else
  not_ok "recompute block run"
fi

# 8-9: a job over its limit fails before step 1, naming what helps
if "$worker" "$tmp/job.yaml" --set model.preset=gpt2-mini --set train.micro_batch=8 \
    --set train.seq_len=256 --set train.memory_limit=340MiB >"$tmp/over.log" 2>&1; then
  not_ok "a job over train.memory_limit is refused"
else
  check "a job over train.memory_limit is refused before step 1" bash -c "! grep -q 'step  *1/' '$tmp/over.log' && grep -q 'memory budget: needs .* but the limit is 340.0 MiB' '$tmp/over.log'"
  check "the refusal names micro_batch, recompute, precision and shard_optimizer with savings" \
    bash -c "grep 'memory budget: needs' '$tmp/over.log' | grep 'train.micro_batch [0-9]* (the same global batch in [0-9]* micro-steps per rank) saves' | grep 'train.recompute: block saves' | grep -q 'ddp.shard_optimizer'"
fi

# 10-13: ddpctl plan prints the worker's budget without running; an oversized spec exits 1
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
# 14-17: 2 ranks (gpt2-tiny, 4 steps): validation every 2 steps, then checkpoints every 2 steps
# (rank 0 writes the shards, rank 1 none): each rank's own budget within 10% of its own peak RSS
# (its peak line, VmHWM, printed as it ends)
rank_peak() { sed -n 's/.*(\(VmHWM\|ru_maxrss\) \([0-9]*\) KiB).*/\2/p' "$1"; }
within10() { # LOG: the rank's peak line against its budget
  local peak pred
  peak=$(rank_peak "$1") pred=$(budget_kib "$1")
  [ -n "$peak" ] && [ -n "$pred" ] &&
    python3 -c "import sys; p, b = $peak, $pred; sys.exit(0 if abs(b - p) <= 0.10 * p else 1)"
}
show() { # LOG...: each rank's figures, for the record
  for f in "$@"; do
    echo "# ${f#$tmp/}: peak RSS $(rank_peak "$f") KiB, budget $(budget_kib "$f") KiB"
  done
}
shape2() { # NAME [extra --set ...]: a 2-rank run; its ranks' logs in $tmp/NAME/
  local name=$1; shift
  env -u MALLOC_PERTURB_ RUN_DIR="$tmp/$name" "$launch" 2 "$tmp/job.yaml" --set train.steps=4 \
    --set "data.val=$tmp/data/val_*.bin" "$@" >"$tmp/$name/rank-0.log" 2>&1 ||
    { sed 's/^/# /' "$tmp/$name"/rank-*.log; return 1; }
}
mkdir -p "$tmp/val2" "$tmp/ckpt2"
if shape2 val2 --set train.val_every=2 --set train.val_batches=4 &&
    grep -q "step  *4/4 | val loss" "$tmp/val2/rank-0.log"; then
  show "$tmp"/val2/rank-[01].log
  check "2 ranks, validation: rank 0's budget within 10% of its peak RSS" within10 "$tmp/val2/rank-0.log"
  check "2 ranks, validation: rank 1's budget within 10% of its peak RSS" within10 "$tmp/val2/rank-1.log"
else
  not_ok "2 ranks, validation: rank 0 (the run failed, or did not validate)"; not_ok "2 ranks, validation: rank 1"
fi
if shape2 ckpt2 --set checkpoint.dir="$tmp/ckpt2/saves" --set checkpoint.every=2 &&
    [ -f "$tmp/ckpt2/saves/step-00000004/MANIFEST.json" ]; then
  show "$tmp"/ckpt2/rank-[01].log
  check "2 ranks, checkpoints: the writer's (rank 0) budget within 10% of its peak RSS" within10 "$tmp/ckpt2/rank-0.log"
  check "2 ranks, checkpoints: the non-writer's (rank 1) budget within 10% of its peak RSS" within10 "$tmp/ckpt2/rank-1.log"
else
  not_ok "2 ranks, checkpoints: rank 0 (the run failed, or saved no step 4)"; not_ok "2 ranks, checkpoints: rank 1"
fi

# 18-19: each rank prints its own budget, and `ddpctl plan` names the non-writers' total
pred_w=$(budget_kib "$tmp/ckpt2/rank-0.log") pred_n=$(budget_kib "$tmp/ckpt2/rank-1.log")
check "2 ranks, checkpoints: each rank prints its own budget, the writer's the larger (${pred_w:-?} > ${pred_n:-?} KiB)" \
  test "${pred_w:-0}" -gt "${pred_n:-0}"
sed -e "s#^data: .*#data: {train: \"$tmp/data/train_*.bin\"}\ncheckpoint: {dir: \"$tmp/plan-ckpt\"}#" \
  "$tmp/job.yaml" >"$tmp/ckpt-plan.yaml"
"$ddpctl" plan "$tmp/ckpt-plan.yaml" --workers 2 >"$tmp/plan-ckpt.txt" 2>&1
check "ddpctl plan of a 2-rank job with checkpoints prints rank 0's budget and rank 1's total" \
  bash -c "grep -q '^memory budget of rank 0' '$tmp/plan-ckpt.txt' && grep -q '^rank 1 writes no checkpoint shard: total' '$tmp/plan-ckpt.txt'"
exit $((TAP_FAILED > 0))
