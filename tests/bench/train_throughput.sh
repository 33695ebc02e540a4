#!/usr/bin/env bash
# Training throughput, ddpd against PyTorch in the same invocation (issues 2 and 22).
#
#   tests/bench/train_throughput.sh [build-dir]        (default: build)
#
# For each of CONFIGS (default "gpt2-124M 4 64" and "gpt2-mini 8 128"; add "gpt2-124M 1 1024"):
# - ddp-worker with DDP_THREADS compute threads (default 2) at train.precision PREC (default
#   auto: what a user gets; the chosen precision is printed);
# - PyTorch 2.x from PyPI, the reference users install today, in the virtual environment
#   TORCH2_VENV (default ../venv-torch beside the repository; created here with
#   `python3 -m venv` + `pip install torch numpy` when missing and TORCH2_INSTALL=1, about
#   5 GB), at fp32 and bf16 autocast, each eager and torch.compile, same model, shapes, AdamW,
#   clip and threads: its best of the four is the reference;
# - Debian's python3-torch (1.13) fp32 with 1 and 2 threads, when installed (the README's
#   older reference).
# Every side: WARMUP untimed steps (default 2; torch.compile compiles in them), then STEPS
# measured steps (default 8); medians. Peak RSS: /usr/bin/time -v for ddp-worker, getrusage for
# PyTorch. The environment (OPENBLAS_CORETYPE ...) is left as it is for all. Never run in CI.
# Knobs: CONFIGS (";"-separated), STEPS, WARMUP, DDP_THREADS, PREC, TORCH2_VENV,
# TORCH2_INSTALL, TORCH2_RUNS (default "fp32:0 fp32:1 bf16:0 bf16:1" = amp:compile).
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
steps=${STEPS:-8}
warmup=${WARMUP:-2}
dthreads=${DDP_THREADS:-2}
prec=${PREC:-auto}
configs=${CONFIGS:-"gpt2-124M 4 64;gpt2-mini 8 128"}
venv=${TORCH2_VENV:-$src/../venv-torch}
runs2=${TORCH2_RUNS:-"fp32:0 fp32:1 bf16:0 bf16:1"}
BENCH_DEBIAN_TORCH_OPTIONAL=1
. "$src/tests/bench/bench_common.sh"

bench_header "$0 $*  (STEPS=$steps WARMUP=$warmup DDP_THREADS=$dthreads PREC=$prec)"
bench_setup

PY2=$venv/bin/python
if [ ! -x "$PY2" ] && [ "${TORCH2_INSTALL:-0}" = 1 ]; then
    echo "installing PyTorch from PyPI into $venv (about 5 GB)"
    python3 -m venv "$venv" && "$venv/bin/pip" install -q torch numpy ||
        echo "PyTorch 2.x could not be installed (is PyPI reachable?)"
fi
have2=0
"$PY2" -c 'import torch' 2>/dev/null && have2=1
[ $have2 = 1 ] && echo "PyTorch 2.x: $("$PY2" -c 'import torch; print(torch.__version__)') ($PY2)" ||
    echo "PyTorch 2.x: not found at $venv (TORCH2_INSTALL=1 installs it)"
[ "$HAVE_DEBIAN_TORCH" = 1 ] && echo "Debian PyTorch: $("$PY" -c 'import torch; print(torch.__version__)')" ||
    echo "Debian PyTorch: not installed (apt-get install python3-torch)"
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'); bf16 instructions: $(grep -qw avx512_bf16 /proc/cpuinfo && echo AVX512_BF16 || echo none)"
echo

# best_of JSON...: the line with the most tokens/s
best_of() { "$PY" -c 'import json, sys; print(max(sys.argv[1:], key=lambda l: json.loads(l)["tokens_per_s"]))' "$@"; }

rows=()
IFS=';' read -ra cfgs <<<"$configs"
for cfg in "${cfgs[@]}"; do
    set -- $cfg
    model=$1 B=$2 T=$3
    echo "== $model B=$B T=$T"
    run=$work/run-$model-$B-$T; mkdir -p "$run"
    cmd=("$worker" "$work/job.yaml" --run-dir "$run"
         --set model.preset=$model --set train.micro_batch=$B --set train.seq_len=$T
         --set train.steps=$((warmup + steps)) --set train.threads=$dthreads
         --set train.precision=\"$prec\")
    echo "  ddpd:    ${cmd[*]}"
    /usr/bin/time -v -o "$work/time.txt" "${cmd[@]}" >"$work/ddpd.log" 2>&1 ||
        { cat "$work/ddpd.log" >&2; exit 1; }
    chosen=$(sed -n 's/.*precision: \(.*\)/\1/p' "$work/ddpd.log" | head -1 | cut -c1-60)
    d=$(ddpd_stats "$run" "$warmup")
    d_rss=$(maxrss_mb "$work/time.txt")
    echo "           $d  peak_rss_mb=$d_rss  precision: $chosen"

    p2=()
    if [ $have2 = 1 ]; then
        for r in $runs2; do
            pcmd=("$PY2" "$src/tests/bench/pytorch_train.py" --model $model -B $B -T $T
                  --threads $dthreads --warmup $warmup --steps $steps
                  --amp ${r%%:*} --compile ${r##*:})
            echo "  pytorch2: ${pcmd[*]}"
            if p=$("${pcmd[@]}" 2>"$work/p2.err" | tail -1) && [ -n "$p" ]; then
                echo "           $p"; p2+=("$p")
            else
                echo "           failed: $(tail -2 "$work/p2.err")"
            fi
        done
    fi
    p1=()
    if [ "$HAVE_DEBIAN_TORCH" = 1 ]; then
        for th in 1 2; do
            pcmd=("$PY" "$src/tests/bench/pytorch_train.py" --model $model -B $B -T $T
                  --threads $th --warmup $warmup --steps $steps)
            echo "  pytorch1: ${pcmd[*]}"
            p=$("${pcmd[@]}"); echo "           $p"; p1+=("$p")
        done
    fi
    b2='{}'; [ ${#p2[@]} -gt 0 ] && b2=$(best_of "${p2[@]}")
    b1='{}'; [ ${#p1[@]} -gt 0 ] && b1=$(best_of "${p1[@]}")
    rows+=("$("$PY" - "$model" "$B" "$T" "$dthreads" "$d" "$d_rss" "$b2" "$b1" "$prec" <<'PYEOF'
import json, sys
model, B, T, dth = sys.argv[1:5]
d, d_rss = json.loads(sys.argv[5]), float(sys.argv[6])
p2, p1, prec = json.loads(sys.argv[7]), json.loads(sys.argv[8]), sys.argv[9]
def ref(p):
    if not p:
        return "— | —"
    how = f"{p.get('amp', 'fp32')}{' + compile' if p.get('compile') else ''}"
    return (f"{p['tokens_per_s']:.0f} ({p['torch']}, {how}, {p['threads']} thr) "
            f"| **{d['tokens_per_s'] / p['tokens_per_s']:.2f}x**")
rss = f"{d_rss:.0f} / {p2['peak_rss_mb']:.0f} MB" if p2 else f"{d_rss:.0f} MB / —"
print(f"| {model} | {B}x{T} | {d['tokens_per_s']:.0f} ({prec}, {d['step_ms']:.0f} ms, {dth} thr) "
      f"| {ref(p2)} | {ref(p1)} | {rss} |")
PYEOF
)")
done

echo
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
echo "| model | B x T | ddpd tokens/s | PyTorch 2.x best tokens/s | ddpd / 2.x | Debian PyTorch best | ddpd / Debian | peak RSS ddpd / PyTorch 2.x |"
echo "|---|---|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
