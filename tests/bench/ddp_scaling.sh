#!/usr/bin/env bash
# Data-parallel scaling, ddpd against PyTorch DDP in the same invocation (issue 4, "Performance").
#
#   tests/bench/ddp_scaling.sh [build-dir]        (default: build)
#
# GPT-2 124M, B=4, T=64 per rank, AdamW, clip 1.0, 1 compute thread per rank, ddpd at
# train.precision PREC (default fp32) and PyTorch at AMP (fp32, or bf16 autocast):
#   ddpd     1 rank            (ddp-worker, train.threads=1)
#   ddpd     2 ranks           (deploy/launch-local.sh 2, environment rendezvous)
#   PyTorch  1 process         (tests/bench/pytorch_train.py --threads 1)
#   PyTorch  DDP 2 processes   (tests/bench/pytorch_train.py --ddp 2: torch.distributed gloo)
# Global tokens/s (medians over STEPS measured steps after WARMUP untimed ones), the ddpd/PyTorch
# DDP ratio, scaling efficiency (2-rank tokens/s / (2 x 1-rank tokens/s)) for both, and ddpd's
# communication accounting from metrics.jsonl (median hidden fraction, comm and exposed ms).
# The environment (OPENBLAS_CORETYPE, OPENBLAS_L2_SIZE) is left as it is, for both sides.
# Environment knobs: STEPS (default 8), WARMUP (default 2), PREC, AMP, TORCH_PY (the Python
# whose torch is the reference; default Debian's python3-torch, e.g. ../venv-torch/bin/python
# for PyTorch 2.x from PyPI). About 3-4 minutes on 2 cores.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
steps=${STEPS:-8}
warmup=${WARMUP:-2}
B=4 T=64 model=gpt2-124M
prec=${PREC:-fp32}
amp=${AMP:-fp32}
. "$src/tests/bench/bench_common.sh"
PY=${TORCH_PY:-$PY}

bench_header "$0 $*  (STEPS=$steps WARMUP=$warmup PREC=$prec AMP=$amp TORCH_PY=$PY)"
bench_setup

set_args=(--set model.preset=$model --set train.micro_batch=$B --set train.seq_len=$T
          --set train.steps=$((warmup + steps)) --set train.threads=1
          --set train.precision=\"$prec\")

echo "== ddpd, 1 rank x 1 thread"
mkdir -p "$work/run1"
cmd=("$worker" "$work/job.yaml" --quiet --run-dir "$work/run1" "${set_args[@]}")
echo "  ${cmd[*]}"
/usr/bin/time -v -o "$work/time1.txt" "${cmd[@]}" >"$work/ddpd1.log" 2>&1 ||
    { cat "$work/ddpd1.log" >&2; exit 1; }
d1=$(ddpd_stats "$work/run1" "$warmup")
d1_rss=$(maxrss_mb "$work/time1.txt")
echo "  $d1  peak_rss_mb=$d1_rss"

echo "== ddpd, 2 ranks x 1 thread"
cmd=(env DDP_WORKER="$worker" RUN_DIR="$work/run2" "$src/deploy/launch-local.sh" 2
     "$work/job.yaml" --quiet "${set_args[@]}")
echo "  ${cmd[*]}"
/usr/bin/time -v -o "$work/time2.txt" "${cmd[@]}" >"$work/ddpd2.log" 2>&1 ||
    { cat "$work/ddpd2.log" "$work/run2"/rank-*.log >&2; exit 1; }
d2=$(ddpd_stats "$work/run2" "$warmup")
d2_rss=$(maxrss_mb "$work/time2.txt")   # the largest of the ranks (RUSAGE_CHILDREN)
echo "  $d2  peak_rss_mb(largest rank)=$d2_rss"

echo "== PyTorch, 1 process x 1 thread"
pcmd=("$PY" "$src/tests/bench/pytorch_train.py" --model $model -B $B -T $T --threads 1
      --warmup $warmup --steps $steps --amp $amp)
echo "  ${pcmd[*]}"
p1=$("${pcmd[@]}")
echo "  $p1"

echo "== PyTorch DDP (gloo), 2 processes x 1 thread"
pcmd=("$PY" "$src/tests/bench/pytorch_train.py" --model $model -B $B -T $T --threads 1 --ddp 2
      --warmup $warmup --steps $steps --amp $amp)
echo "  ${pcmd[*]}"
p2=$("${pcmd[@]}")
echo "  $p2"

echo
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
"$PY" - "$d1" "$d1_rss" "$d2" "$d2_rss" "$p1" "$p2" <<'EOF'
import json, sys
d1, d1_rss, d2, d2_rss, p1, p2 = sys.argv[1:]
d1, d2, p1, p2 = (json.loads(x) for x in (d1, d2, p1, p2))
d1_rss, d2_rss = float(d1_rss), float(d2_rss)
ms = lambda p: p["median_step_s"] * 1000
print("| configuration | median step | global tokens/s | scaling efficiency | comm / exposed ms, hidden | peak RSS per process |")
print("|---|---|---|---|---|---|")
print(f"| ddpd 1 rank x 1 thread | {d1['step_ms']:.0f} ms | {d1['tokens_per_s']:.0f} | - | - | {d1_rss:.0f} MB |")
print(f"| ddpd 2 ranks x 1 thread | {d2['step_ms']:.0f} ms | {d2['tokens_per_s']:.0f} "
      f"| {d2['tokens_per_s'] / (2 * d1['tokens_per_s']):.0%} "
      f"| {d2['comm_ms']:.0f} / {d2['exposed_comm_ms']:.0f} ms, {d2['hidden']:.0%} hidden | {d2_rss:.0f} MB (largest rank) |")
print(f"| PyTorch 1 process x 1 thread | {ms(p1):.0f} ms | {p1['tokens_per_s']:.0f} | - | - | {p1['peak_rss_mb']:.0f} MB |")
print(f"| PyTorch DDP gloo 2 x 1 thread | {ms(p2):.0f} ms | {p2['tokens_per_s']:.0f} "
      f"| {p2['tokens_per_s'] / (2 * p1['tokens_per_s']):.0%} | - | {p2['peak_rss_mb']:.0f} MB (largest rank) |")
print()
print(f"ddpd 2 ranks / PyTorch DDP 2 processes: **{d2['tokens_per_s'] / p2['tokens_per_s']:.2f}x** global tokens/s; "
      f"ddpd 1 rank / PyTorch 1 process: {d1['tokens_per_s'] / p1['tokens_per_s']:.2f}x")
print(f"ddpd scaling efficiency 1 -> 2 ranks: **{d2['tokens_per_s'] / (2 * d1['tokens_per_s']):.0%}** "
      f"(PyTorch: {p2['tokens_per_s'] / (2 * p1['tokens_per_s']):.0%}); "
      f"ddpd communication hidden behind backward: **{d2['hidden']:.0%}** (median over steps; "
      f"comm {d2['comm_ms']:.0f} ms, exposed {d2['exposed_comm_ms']:.0f} ms of a {d2['step_ms']:.0f} ms step)")
EOF
