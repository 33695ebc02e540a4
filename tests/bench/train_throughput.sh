#!/usr/bin/env bash
# Training throughput, ddpd against PyTorch in the same invocation (issue 2, "Performance").
#
#   tests/bench/train_throughput.sh [build-dir]        (default: build)
#
# For GPT-2 124M (vocab 50257) at B=4, T=64 and gpt2-mini at B=8, T=128: ddp-worker with
# 2 compute threads, and the same model in PyTorch (tests/bench/pytorch_gpt2.py: fp32, AdamW,
# clip 1.0, OMP_WAIT_POLICY=PASSIVE, explicit set_num_threads) with 1 and with 2 threads; the
# better PyTorch is the reference. Each side: WARMUP untimed steps (default 2), then STEPS
# measured steps (default 8); medians. Peak RSS: /usr/bin/time -v for ddp-worker, getrusage for
# PyTorch. The environment (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE) is left as it is, for both.
# Environment knobs: STEPS, WARMUP, DDP_THREADS (default 2). About 3 minutes on 2 cores.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
steps=${STEPS:-8}
warmup=${WARMUP:-2}
dthreads=${DDP_THREADS:-2}
. "$src/tests/bench/bench_common.sh"

bench_header "$0 $*  (STEPS=$steps WARMUP=$warmup DDP_THREADS=$dthreads)"
bench_setup

rows=()
for cfg in "gpt2-124M 4 64" "gpt2-mini 8 128"; do
    set -- $cfg
    model=$1 B=$2 T=$3
    echo "== $model B=$B T=$T"
    run=$work/run-$model; mkdir -p "$run"
    cmd=("$worker" "$work/job.yaml" --quiet --run-dir "$run"
         --set model.preset=$model --set train.micro_batch=$B --set train.seq_len=$T
         --set train.steps=$((warmup + steps)) --set train.threads=$dthreads)
    echo "  ddpd:    ${cmd[*]}"
    /usr/bin/time -v -o "$work/time-$model.txt" "${cmd[@]}" >"$work/ddpd-$model.log" 2>&1 ||
        { cat "$work/ddpd-$model.log" >&2; exit 1; }
    d=$(ddpd_stats "$run" "$warmup")
    d_rss=$(maxrss_mb "$work/time-$model.txt")
    echo "           $d  peak_rss_mb=$d_rss"

    best="" best_tps=0 best_th=0
    for th in 1 2; do
        pcmd=("$PY" "$src/tests/bench/pytorch_gpt2.py" --model $model -B $B -T $T
              --threads $th --warmup $warmup --steps $steps)
        echo "  pytorch: ${pcmd[*]}"
        p=$("${pcmd[@]}")
        echo "           $p"
        tps=$(jget "$p" tokens_per_s)
        if "$PY" -c "import sys; sys.exit(not float(sys.argv[1]) > float(sys.argv[2]))" "$tps" "$best_tps"; then
            best=$p best_tps=$tps best_th=$th
        fi
    done
    rows+=("$("$PY" - "$model" "$B" "$T" "$dthreads" "$d" "$d_rss" "$best" <<'EOF'
import json, sys
model, B, T, dth = sys.argv[1:5]
d, d_rss, p = json.loads(sys.argv[5]), float(sys.argv[6]), json.loads(sys.argv[7])
print(f"| {model} | {B}x{T} | {d['tokens_per_s']:.0f} ({d['step_ms']:.0f} ms, {dth} thr) "
      f"| {p['tokens_per_s']:.0f} ({p['median_step_s'] * 1000:.0f} ms, {p['threads']} thr) "
      f"| **{d['tokens_per_s'] / p['tokens_per_s']:.2f}x** "
      f"| {d_rss:.0f} / {p['peak_rss_mb']:.0f} MB ({d_rss / p['peak_rss_mb']:.2f}x) |")
EOF
)")
done

echo
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| model | B x T | ddpd tokens/s (median step) | PyTorch best tokens/s (median step, threads) | ddpd / PyTorch | peak RSS ddpd / PyTorch |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
