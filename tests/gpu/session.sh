#!/usr/bin/env bash
# The commands of a lent GPU window, run on the GPU machine from the repository root over a tree
# built here by tests/gpu/bundle.sh. A window is 15 minutes of device time in all (the machine's
# start included) and at most 10 minutes a command, so the work comes in parts, by priority,
# and each command stops starting parts once its budget is spent (SESSION_BUDGET_S, default
# 540 s: a part is started only when its usual length still fits):
#   gpu       tests/gpu.sh: self-test with the flash attention rows, memcheck and racecheck,
#             fp32 and bf16 against the CPU, determinism, recompute, the memory budget, the
#             per-op profile, NCCL, 2 ranks on one GPU over the ring (about 5 minutes)
#   bench124  tests/bench/gpu_train.sh, GPT-2 124M at B=8 T=1024 against PyTorch
#             (torch.compile) on the same GPU: the issue's headline (about 2.5 minutes)
#   ncu       tests/gpu/kernel_times.sh: every kernel of one GPT-2 124M bf16 step at 8 x 1024
#             under Nsight Compute, grouped, largest first (about a minute)
#   gemm      tests/gpu/gemm_shapes (the step's products on cuBLASLt as ddpd sets them up: the
#             heuristic's first algorithm against the best of 16) and gemm_shapes.py (the same
#             products, and causal attention, in PyTorch), then tests/gpu/attention_times
#             (ddpd's flash attention at the benchmarks' shapes, both forward kernels)
#             (about 50 s)
#   smol      the same for SmolLM2-135M at B=8 against transformers' LlamaForCausalLM
#   more      GPT-2 124M at B=16 and GPT-2 355M at B=8
# The first command of a window: `session.sh build-gpu` (gpu, bench124, then ncu, gemm and
# smol while they fit); a second one with what is left: `session.sh build-gpu more` (or
# whatever was skipped). The benchmarks need python3 with torch (and transformers for smol) on
# the GPU machine; without them they are skipped.
# Everything goes to $OUT (default $PWD/gpu-out): gpu.txt and gpu_train-*.txt, to copy into
# tests/bench/README.md, and logs.tgz with every log (the folders themselves are removed: a
# lent machine's reply carries a few files of limited size).
#
# The CUDA runtime, cuBLAS and NCCL are looked up under /usr/local/cuda and python3's packages
# (where NVIDIA's wheels put them) and put on LD_LIBRARY_PATH with .gpu-libs (bundle.sh's).
#
#   tests/gpu/session.sh [build-gpu] [gpu|bench124|ncu|gemm|smol|more ...]
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
site=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null || true)
for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
    # shellcheck disable=SC2086 # $site: several folders
    found=$(find /usr/local/cuda/ $site -name "$lib" 2>/dev/null | head -n 1)
    dir=$(dirname "${found:-.}")
    case ":${LD_LIBRARY_PATH:-}:" in
    *":$dir:"*) ;;
    *) [ -n "$found" ] && LD_LIBRARY_PATH=$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} ;;
    esac
done
export LD_LIBRARY_PATH=$src/.gpu-libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
bdir=${1:-$src/build-gpu}
[ $# -gt 0 ] && shift
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(gpu bench124 ncu gemm smol)
budget=${SESSION_BUDGET_S:-540}
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"

fits() { # part usual-seconds: 0 when the part may start within the budget
    if [ $((SECONDS + $2)) -gt "$budget" ]; then
        echo "session: $1 skipped: ${SECONDS} s spent, it takes about $2 s, budget $budget s"
        return 1
    fi
}
bench() { # model batch [python module it needs]
    local model=$1 b=$2 need=${3:-torch}
    if ! python3 -c "import $need" 2>/dev/null; then
        echo "session: python3 has no $need here: $model B=$b skipped"
        return
    fi
    fits "$model B=$b" 150 || return
    MODEL=$model B=$b T=1024 STEPS=${STEPS:-20} OUT="$out/bench-$model-$b" \
        "$src/tests/bench/gpu_train.sh" "$bdir" >"$out/gpu_train-$model-B$b.txt" 2>&1
    sed -n '/^ddpd\|^PyTorch\|speed/p' "$out/gpu_train-$model-B$b.txt"
}

for part in "${parts[@]}"; do
    case $part in
    gpu)
        fits gpu.sh 360 || continue
        GPU_SH_PREBUILT=${GPU_SH_PREBUILT:-1} GPU_SH_MEMCHECK_S=${GPU_SH_MEMCHECK_S:-90} \
            OUT="$out/gpu" "$src/tests/gpu.sh" "$bdir" 2>&1 | tee "$out/gpu.txt" | grep '^== ' ;;
    bench124) bench gpt2-124M 8 ;;
    ncu)
        fits "kernel times" 90 || continue
        OUT="$out/ncu" "$src/tests/gpu/kernel_times.sh" "$bdir" >"$out/kernel_times.txt" 2>&1
        head -n 25 "$out/kernel_times.txt" ;;
    gemm)
        fits "the step's products" 75 || continue
        { "$bdir/tests/gpu/gemm_shapes"; python3 "$src/tests/gpu/gemm_shapes.py"; } \
            >"$out/gemm.txt" 2>&1
        DDP_KERNELS_PATH="$bdir/worker" "$bdir/tests/gpu/attention_times" >"$out/attention.txt" 2>&1
        grep '^step' "$out/gemm.txt"
        cat "$out/attention.txt" ;;
    smol) bench smollm2-135m 8 transformers ;;
    more) bench gpt2-124M 16; bench gpt2-355M 8 ;;
    *) echo "session: unknown part '$part' (gpu, bench124, ncu, gemm, smol, more)" >&2; exit 2 ;;
    esac
done
# the logs, in one archive that comes back (the folders hold data shards and checkpoints too)
(cd "$out" && find . -type f -size -4M ! -path './logs.tgz' \
    \( -name '*.log' -o -name '*.txt' -o -name '*.yaml' -o -name '*.json' -o -name '*.csv' \) \
    -print0 |
    tar czf logs.tgz --null -T - &&
    find . -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +)
echo "session: ${SECONDS} s"
