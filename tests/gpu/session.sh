#!/usr/bin/env bash
# The one command of a lent GPU window (about 8 minutes on an H100/H200), run on the GPU machine
# from the repository root over a tree built here by tests/gpu/bundle.sh:
#   1. tests/gpu.sh (self-test with the flash attention rows, memcheck and racecheck, fp32 and
#      bf16 against the CPU, determinism, recompute, the memory budget, the per-op profile, NCCL)
#   2. tests/bench/gpu_train.sh: GPT-2 124M at B=8 and B=16, T=1024, and GPT-2 355M at B=8,
#      against PyTorch (torch.compile) on the same GPU, when this machine's python3 has torch;
#      SmolLM2-135M at B=8 against transformers' LlamaForCausalLM when it has transformers too
# Everything goes to $OUT (default $PWD/gpu-out): gpu.txt and gpu_train-*.txt, to copy into
# tests/bench/README.md.
#
#   LD_LIBRARY_PATH=<cuda, cublas, nccl lib dirs>:$PWD/.gpu-libs tests/gpu/session.sh [build-gpu]
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
bdir=${1:-$src/build-gpu}
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
GPU_SH_PREBUILT=${GPU_SH_PREBUILT:-1} GPU_SH_MEMCHECK_S=${GPU_SH_MEMCHECK_S:-120} \
    OUT="$out/gpu" "$src/tests/gpu.sh" "$bdir" 2>&1 | tee "$out/gpu.txt" | grep '^== '
if python3 -c 'import torch' 2>/dev/null; then
    cfgs=("gpt2-124M 8" "gpt2-124M 16" "gpt2-355M 8")
    python3 -c 'import transformers' 2>/dev/null && cfgs+=("smollm2-135m 8")
    for cfg in "${cfgs[@]}"; do
        set -- $cfg
        MODEL=$1 B=$2 T=1024 STEPS=${STEPS:-20} OUT="$out/bench-$1-$2" \
            "$src/tests/bench/gpu_train.sh" "$bdir" >"$out/gpu_train-$1-B$2.txt" 2>&1
        sed -n '/^ddpd\|^PyTorch\|speed/p' "$out/gpu_train-$1-B$2.txt"
    done
else
    echo "session: python3 has no torch here: gpu_train.sh skipped"
fi
