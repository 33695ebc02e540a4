#!/usr/bin/env bash
# The CPU's element loops give the same bits in every vector width (common/vector_isa.h), TAP:
# GPT-2 and Llama (gpt2-tiny, llama-tiny) trained in fp32, bf16 (native products where the CPU
# has them, and emulated) and fp16 with the widest loops this CPU runs and with each narrower one
# (DDP_CPU_VECTOR), the weights compared byte for byte; the log names the loops; a bad
# DDP_CPU_VECTOR is refused by name. On a CPU with AVX-512 this compares AVX-512, AVX2 and the
# baseline; on one with AVX2 only, AVX2 and the baseline.
#   test_vector_isa.sh DDP_WORKER DDP_PREP
set -uo pipefail
worker=$1 prep=$2
tmp=$(mktemp -d /tmp/ddp-test-isa.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export DDP_LOG_LEVEL=warn

. "$(dirname "$0")/../../tap.sh"
. "$(dirname "$0")/../../corpus.sh"

fox_corpus "$prep" "$tmp" 2000 --val-fraction 0
cat >"$tmp/job.yaml" <<YAML
name: isa-test
model: {preset: gpt2-tiny}
data: {train: "$tmp/data/train_*.bin"}
train: {steps: 4, micro_batch: 2, seq_len: 64, lr: 1.0e-3, warmup: 1, val_every: 0,
        sample_tokens: 0, threads: 2}
YAML

# The widest loops: what the model line names with DDP_CPU_VECTOR unset.
DDP_LOG_LEVEL=info "$worker" "$tmp/job.yaml" --set train.steps=2 >"$tmp/info.log" 2>&1
widest=$(sed -n 's/.*cpu kernels with \([^ ]*\) loops.*/\1/p' "$tmp/info.log" | head -n 1)
case $widest in
AVX-512) narrower="avx2 baseline" ;;
AVX2) narrower="baseline" ;;
*) narrower="" ;;
esac

echo "1..3"
if [ -z "$widest" ]; then
  not_ok "the model line names the loops (it said: $(grep -m1 'kernels' "$tmp/info.log"))"
else
  DDP_CPU_VECTOR=baseline DDP_LOG_LEVEL=info "$worker" "$tmp/job.yaml" --set train.steps=2 \
    >"$tmp/base.log" 2>&1
  check "the model line names the loops ($widest here; baseline when DDP_CPU_VECTOR lowers it)" \
    grep -q "cpu kernels with baseline loops" "$tmp/base.log"
fi

run() { # out model precision [DDP_CPU_VECTOR]: a run's weights (bf16-emulated: emulated products)
  local p=$3 env=()
  [ "$p" = bf16-emulated ] && env=(DDP_CPU_BF16=emulate) p=bf16
  env "${env[@]}" ${4:+DDP_CPU_VECTOR=$4} "$worker" "$tmp/job.yaml" --quiet \
    --set model.preset="$2" --set train.precision=\""$p"\" --dump-weights "$1"
}

if [ -z "$narrower" ]; then
  skip "the same weights in every vector width" "this CPU has no vectors wider than the baseline's"
else
  bad=""
  for model in gpt2-tiny llama-tiny; do
    for prec in fp32 bf16 bf16-emulated fp16; do
      run "$tmp/wide.st" $model $prec || bad="$bad $model/$prec:run"
      for v in $narrower; do
        run "$tmp/$v.st" $model $prec "$v" || bad="$bad $model/$prec/$v:run"
        cmp -s "$tmp/wide.st" "$tmp/$v.st" || bad="$bad $model/$prec/$v"
      done
    done
  done
  what="the same weights with $widest loops as with $narrower, 2 models x 4 precisions"
  check "$what${bad:+; differ:$bad}" test -z "$bad"
fi

DDP_CPU_VECTOR=avx1024 "$worker" "$tmp/job.yaml" >"$tmp/bad.log" 2>&1
rc=$?
refusal="DDP_CPU_VECTOR=avx1024: not baseline, avx2 or avx512"
check "DDP_CPU_VECTOR=avx1024 is refused by name (exit $rc)" \
  bash -c "[ $rc -ne 0 ] && grep -q '$refusal' '$tmp/bad.log'"
exit $((TAP_FAILED > 0))
