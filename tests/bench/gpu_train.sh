#!/usr/bin/env bash
# ddpd against PyTorch on one GPU, in one invocation: the same GPT-2, shapes, optimizer and
# precision (tests/bench/pytorch_train.py is the reference model), PyTorch at its best (flash
# attention through SDPA, fused AdamW, bf16 autocast, eager and torch.compile). Both sides run
# plain fp32 matrix products when fp32 (no TF32: ddpd's default, PyTorch's default for matmul).
# Prints one table: median tokens/s after 3 warm-up steps, and peak GPU memory as nvidia-smi
# sees the process (CUDA context included on both sides), with the ratio ddpd / PyTorch.
#
#   tests/bench/gpu_train.sh [BUILD_DIR]     default build-gpu (meson -Dcuda=enabled)
#   MODEL=gpt2-124M B=8 T=1024 STEPS=30 PY=python3 OUT=<dir for the logs>   override
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
bdir=${1:-$src/build-gpu}
. "$src/tests/gpu/lib.sh"
MODEL=${MODEL:-gpt2-124M} B=${B:-8} T=${T:-1024} STEPS=${STEPS:-30} PY=${PY:-python3}
out=${OUT:-$(mktemp -d /tmp/ddp-gpubench.XXXXXX)}
mkdir -p "$out"
nvidia-smi -L >/dev/null 2>&1 || { echo "gpu_train.sh: SKIP: no NVIDIA GPU here"; exit 77; }
W=$bdir/worker/ddp-worker
word_salad_shards "$bdir" "$out" || { echo "ddp-prep failed" >&2; exit 1; }
cat >"$out/job.yaml" <<YAML
name: gpu-bench
model: {preset: $MODEL}
data: {train: "$out/data/train_*.bin"}
train: {steps: $STEPS, micro_batch: $B, seq_len: $T, lr: 6e-4, warmup: 2, seed: 1, clip: 1.0,
        weight_decay: 0.1, beta1: 0.9, beta2: 0.95, sample_tokens: 0, val_every: 0}
YAML
echo "command: tests/bench/gpu_train.sh $*  (MODEL=$MODEL B=$B T=$T STEPS=$STEPS)"
echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"

rows=()
ddpd() { # name precision recompute
    with_mem "$out/$1-mem.txt" timeout 300 "$W" "$out/job.yaml" --backend cuda \
        --set train.precision=\""$2"\" --set train.recompute=\""$3"\" >"$out/$1.log" 2>&1 ||
        { tail -n 5 "$out/$1.log"; rows+=("$1 failed"); return; }
    rows+=("$(printf '%-34s %10s tok/s %8s MiB' "ddpd $2, recompute $3" \
        "$(median_tps "$out/$1.log")" "$(peak "$out/$1-mem.txt")")")
    eval "tps_$1=$(median_tps "$out/$1.log") mem_$1=$(peak "$out/$1-mem.txt")"
}
torch_run() { # name amp compile recompute
    with_mem "$out/$1-mem.txt" timeout 400 "$PY" "$src/tests/bench/pytorch_train.py" \
        --device cuda --sdpa 1 --model "$MODEL" -B "$B" -T "$T" --warmup 3 \
        --steps $((STEPS - 3)) --amp "$2" --compile "$3" --recompute "$4" >"$out/$1.json" \
        2>"$out/$1.err" || { tail -n 5 "$out/$1.err"; rows+=("$1 failed"); return; }
    local tps
    tps=$("$PY" -c 'import json, sys; print(int(json.load(open(sys.argv[1]))["tokens_per_s"]))' \
        "$out/$1.json")
    rows+=("$(printf '%-34s %10s tok/s %8s MiB' "PyTorch $2, compile $3, recompute $4" "$tps" \
        "$(peak "$out/$1-mem.txt")")")
    eval "tps_$1=$tps mem_$1=$(peak "$out/$1-mem.txt")"
}
ratio() { # ddpd-name torch-name
    awk -v a="${!1:-0}" -v b="${!2:-0}" 'BEGIN {if (b > 0) printf "%.2fx", a / b; else print "-"}'
}

ddpd d_bf16 bf16 none
ddpd d_bf16_rc bf16 block
ddpd d_fp32 fp32 none
torch_run p_bf16 bf16 0 0
torch_run p_bf16_c bf16 1 0
torch_run p_bf16_rc bf16 0 1
torch_run p_fp32 fp32 0 0

echo
printf '%s\n' "${rows[@]}"
echo
echo "ddpd bf16 / PyTorch bf16 eager:     speed $(ratio tps_d_bf16 tps_p_bf16), memory $(ratio mem_d_bf16 mem_p_bf16)"
echo "ddpd bf16 / PyTorch bf16 compiled:  speed $(ratio tps_d_bf16 tps_p_bf16_c), memory $(ratio mem_d_bf16 mem_p_bf16_c)"
echo "ddpd bf16 recompute / PyTorch's:    speed $(ratio tps_d_bf16_rc tps_p_bf16_rc), memory $(ratio mem_d_bf16_rc mem_p_bf16_rc)"
echo "ddpd fp32 / PyTorch fp32 eager:     speed $(ratio tps_d_fp32 tps_p_fp32), memory $(ratio mem_d_fp32 mem_p_fp32)"
echo "logs: $out"
