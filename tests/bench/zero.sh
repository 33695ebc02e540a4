#!/usr/bin/env bash
# The out-of-memory tools side by side with PyTorch 2.x in the same invocation (issue 19's
# benchmark): 2 ranks x 1 thread, GPT-2 at B=1 T=1024 per rank, fp32, with activation
# recomputation off/on and the optimizer sharded (ZeRO-1) off/on.
#   ddpd     deploy/launch-local.sh 2, the ring forced onto TCP (DDP_COLL_TRANSPORT=tcp, as
#            between hosts); train.recompute none|block, ddp.shard_optimizer false|true
#   PyTorch  tests/bench/pytorch_train.py --ddp 2 (gloo); --recompute: torch.utils.checkpoint per
#            block; --zero: ZeroRedundancyOptimizer around AdamW
# Per row: the larger rank's peak RSS (ru_maxrss; ddpd: each rank logs its own), what ddpd
# measured of its moments after step 1 (mincore), global tokens/s (medians over STEPS measured
# steps after WARMUP), and the ratios against PyTorch at the same settings.
#
#   tests/bench/zero.sh [build-dir] [preset]      (default: build gpt2-124M)
#
# Needs PyTorch 2.x: TORCH_PY (default /work/venv-torch/bin/python). STEPS (default 2), WARMUP
# (default 1), ROWS (default "none:false none:true block:false block:true": recompute:sharded).
# GPT-2 124M: about 15 minutes on 2 cores.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
model=${2:-gpt2-124M}
steps=${STEPS:-2} warmup=${WARMUP:-1}
TORCH_PY=${TORCH_PY:-/work/venv-torch/bin/python}
BENCH_DEBIAN_TORCH_OPTIONAL=1
. "$src/tests/bench/bench_common.sh"
"$TORCH_PY" -c 'import torch' 2>/dev/null || { echo "$TORCH_PY has no torch" >&2; exit 1; }
bench_header "$0 $*  (STEPS=$steps WARMUP=$warmup)"
bench_setup

set_args=(--set model.preset=$model --set train.micro_batch=1 --set train.seq_len=1024
          --set train.steps=$((warmup + steps)) --set train.threads=1)
echo "torch $("$TORCH_PY" -c 'import torch; print(torch.__version__)')"
echo
echo "| recompute | sharded | ddpd peak RSS/rank | ddpd moments resident/rank | PyTorch peak RSS/rank | RSS ratio | ddpd tok/s | PyTorch tok/s | speed ratio |"
echo "|---|---|---|---|---|---|---|---|---|"
for row in ${ROWS:-none:false none:true block:false block:true}; do
  rc=${row%:*} sh=${row#*:}
  run=$work/run-$rc-$sh
  DDP_COLL_TRANSPORT=tcp DDP_LOG_LEVEL=info DDP_WORKER="$worker" RUN_DIR="$run" \
    "$src/deploy/launch-local.sh" 2 "$work/job.yaml" "${set_args[@]}" \
    --set train.recompute=$rc --set ddp.shard_optimizer=$sh >"$work/d-$rc-$sh.log" 2>&1 ||
    { tail -20 "$work/d-$rc-$sh.log" "$run"/rank-*.log >&2; exit 1; }
  d=$(ddpd_stats "$run" "$warmup")
  logs=("$work/d-$rc-$sh.log" "$run"/rank-*.log)
  d_rss=$(grep -h 'peak RSS' "${logs[@]}" | sed 's/.*(\(VmHWM\|ru_maxrss\) \([0-9]*\) KiB.*/\2/' |
          sort -n | tail -1)
  d_mom=$(grep -h 'moments resident after step' "${logs[@]}" |
          sed 's/.*(\([0-9]*\) KiB).*/\1/' | sort -n | tail -1)
  p=$("$TORCH_PY" "$src/tests/bench/pytorch_train.py" --model $model -B 1 -T 1024 --threads 1 \
        --ddp 2 --warmup $warmup --steps $steps --recompute $([ $rc = block ] && echo 1 || echo 0) \
        --zero $([ $sh = true ] && echo 1 || echo 0))
  echo "# ddpd: $d" >&2
  echo "# pytorch: $p" >&2
  p_rss=$(jget "$p" peak_rss_mb) d_tps=$(jget "$d" tokens_per_s) p_tps=$(jget "$p" tokens_per_s)
  awk -v rc=$rc -v sh=$sh -v dr="$d_rss" -v dm="$d_mom" -v pr="$p_rss" -v dt="$d_tps" -v pt="$p_tps" \
    'BEGIN { printf "| %s | %s | %.0f MB | %.0f MB | %.0f MB | %.2f | %.0f | %.0f | %.2f |\n",
             rc, sh, dr / 1024, dm / 1024, pr, dr / 1024 / pr, dt, pt, dt / pt }'
done
