#!/usr/bin/env bash
# The largest model that trains on this machine with 2 ranks (issues 19 and 32): `ddpctl plan`
# sizes every preset of MODELS (default the GPT-2 ones; MODELS="smollm2-135m smollm2-360m
# qwen2.5-0.5b tinyllama-1.1b llama-3.2-1b" for the Llama family) at B=1 T=1024 per rank with the out-of-memory tools off and on (recompute block,
# shard_optimizer), then the largest preset that fits with them is trained for real: 2 ranks x 1
# thread over TCP (DDP_COLL_TRANSPORT=tcp), WARMUP + STEPS steps. Prints each rank's peak RSS
# beside the plan's total, the moments each rank holds, and the machine's RAM.
#
#   tests/bench/largest_model.sh [build-dir]       (default: build)
#
# STEPS (default 1), WARMUP (default 1). GPT-2 774M on 2 cores: about 10 minutes.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
steps=${STEPS:-1} warmup=${WARMUP:-1}
BENCH_DEBIAN_TORCH_OPTIONAL=1
. "$src/tests/bench/bench_common.sh"
bench_header "$0 $*  (STEPS=$steps WARMUP=$warmup)"
bench_setup
ddpctl=$build/daemon/ddpctl
echo "RAM: $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo)"
echo
echo "| preset | plan per rank, tools off | plan per rank, recompute block + sharded | fits 2 ranks |"
echo "|---|---|---|---|"
largest=
for m in ${MODELS:-gpt2-124M gpt2-355M gpt2-774M gpt2-1558M}; do
  plan() { # recompute shard
    cat >"$work/plan.yaml" <<YAML
name: plan
model: {preset: $m}
data: {train: "$work/data/train_*.bin"}
train: {micro_batch: 1, seq_len: 1024, recompute: $1, threads: 1}
ddp: {workers: 2, shard_optimizer: $2}
YAML
    "$ddpctl" plan "$work/plan.yaml" --local 2 2>&1 || true
  }
  off=$(plan none false) on=$(plan block true)
  total() { sed -n 's/^ *total *\([0-9.]* [KMG]iB\).*/\1/p' <<<"$1"; }
  fits=no
  grep -q ': fits;' <<<"$on" && { fits=yes; largest=$m; }
  echo "| $m | $(total "$off") | $(total "$on") | $fits |"
done
[ -n "$largest" ] || { echo "nothing fits"; exit 1; }
echo
echo "training $largest: 2 ranks x 1 thread over TCP, B=1 T=1024, recompute block, sharded"
run=$work/run
DDP_COLL_TRANSPORT=tcp DDP_LOG_LEVEL=info DDP_WORKER="$worker" RUN_DIR="$run" \
  "$src/deploy/launch-local.sh" 2 "$work/job.yaml" --set model.preset=$largest \
  --set train.micro_batch=1 --set train.seq_len=1024 --set train.steps=$((warmup + steps)) \
  --set train.threads=1 --set train.recompute=block --set ddp.shard_optimizer=true \
  >"$work/run.log" 2>&1 || { tail -20 "$work/run.log" "$run"/rank-*.log >&2; exit 1; }
for f in "$work/run.log" "$run"/rank-1.log; do
  grep -h 'peak RSS\|moments resident' "$f" | sed 's/^[0-9:.]* info  */  /'
done
echo "  $(ddpd_stats "$run" "$warmup")"
