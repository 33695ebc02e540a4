#!/usr/bin/env bash
# Mixed precision in real ddp-worker processes (TAP): train.precision's choice is printed (auto:
# bf16 where the CPU multiplies it natively, else fp32), bf16 (native and emulated) and fp16 runs
# differ from fp32 and their 200-step loss curves track it; bf16 on 2 ranks is bitwise 1 rank
# with 2 accumulation steps; fp16's loss scaler: an overflow injected on one
# of 2 ranks skips the step on every rank (bitwise the 1-rank run with the overflow on its
# only rank) and halves the scale; the scale grows after the interval; a resumed run keeps the
# scale and its clean-step count (bitwise the straight run).
#
#   test_prec.sh DDP-WORKER DDP-PREP ST-COMPARE
set -uo pipefail
worker=$1 prep=$2 compare=$3
src=${DDP_SOURCE_ROOT:-$(cd "$(dirname "$0")/../../.." && pwd)}
launch=$src/deploy/launch-local.sh
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ddp-prec.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/../../tap.sh"
. "$(dirname "$0")/../../corpus.sh"
# the loss scale in metrics.jsonl at step S of run directory D
scale_at() { python3 -c "
import json, sys
for l in open('$1/metrics.jsonl'):
    r = json.loads(l)
    if r['step'] == $2: print(r['loss_scale'])" ; }
export -f scale_at

cd "$tmp" || exit 1
word_salad "$prep" . 4000 12 11 || { not_ok "ddp-prep made the training shards"; tap_plan; exit 1; }
cat >job.yaml <<YAML
name: prec
model: {preset: gpt2-tiny}
data: {train: $tmp/data/train_*.bin}
train: {steps: 12, micro_batch: 2, seq_len: 32, global_batch_tokens: 128, lr: 1e-3, warmup: 2,
        seed: 5, threads: 1, sample_tokens: 0, val_every: 0}
ddp: {max_workers: 2}
YAML
W() { "$worker" job.yaml "$@"; }
L() { DDP_WORKER=$worker "$launch" "$@"; }
echo "1..12"

W --set train.precision=\"auto\" --dump-weights auto.st >auto.log 2>&1
W --set train.precision=\"fp32\" --dump-weights fp32.st >fp32.log 2>&1
W --set train.precision=\"bf16\" --dump-weights bf16.st >bf16.log 2>&1
W --set train.precision=\"fp16\" --dump-weights fp16.st >fp16.log 2>&1
# auto is bf16 where the CPU has bf16 instructions (and the build has oneDNN), else fp32
want=fp32
grep -qw avx512_bf16 /proc/cpuinfo && ! grep -q "no oneDNN" auto.log && want=bf16
check "auto: the choice ($want on this CPU) and its reason are printed" \
    grep -q "precision: auto -> $want on backend cpu: " auto.log
check "auto is the $want run, bitwise" "$compare" auto.st $want.st
# 200-step loss curves: bf16 and fp16 track fp32 no worse than fp32 tracks itself with the
# learning rate 1% higher (means over windows of 20 steps), and the loss falls
long=(--set train.steps=200 --quiet)
for p in fp32 bf16 fp16; do W "${long[@]}" --set train.precision=\"$p\" --run-dir "c$p" >"c$p.log" 2>&1; done
DDP_CPU_BF16=emulate W "${long[@]}" --set train.precision=\"bf16\" --run-dir cbf16e >cbf16e.log 2>&1
W "${long[@]}" --set train.precision=\"fp32\" --set train.lr=1.01e-3 --run-dir clr >clr.log 2>&1
check "200 steps: bf16 (native and emulated) and fp16 loss curves within fp32's own distance from a 1% lr change" \
    python3 - <<'PY'
import json
def curve(d):
    rows = [json.loads(l) for l in open(f"c{d}/metrics.jsonl")]
    ls = [r["loss"] for r in rows if "step_ms" in r]
    return [sum(ls[i:i + 20]) / 20 for i in range(0, 200, 20)]
def dist(c, ref):
    return max(abs(a - b) / b for a, b in zip(c, ref))
ref = curve("fp32")
assert len(ref) == 10 and ref[-1] < 0.6 * ref[0], ref
bound = dist(curve("lr"), ref)
for p in ("bf16", "bf16e", "fp16"):
    print(p, "worst window", round(dist(curve(p), ref), 6), "bound (lr +1%)", round(bound, 6))
    assert dist(curve(p), ref) <= bound, (p, curve(p), ref)
PY
check "bf16 and fp16 runs round: not bitwise the fp32 run" \
    bash -c "! '$compare' bf16.st fp32.st && ! '$compare' fp16.st fp32.st"
RUN_DIR=$tmp/b2 L 2 job.yaml --set train.precision=\"bf16\" --dump-weights bf16x2.st >bf16x2.log 2>&1
check "bf16: 2 ranks == 1 rank with 2 accumulation steps, bitwise" "$compare" bf16x2.st bf16.st
check "fp16: the step line shows the loss scale" grep -qE "step +1/12 .*\| scale 65536" fp16.log

# an overflow on rank 1 only, at step 5: both ranks skip it
RUN_DIR=$tmp/r2 DDP_TEST_OVERFLOW=5:1 L 2 job.yaml --set train.precision=\"fp16\" \
    --dump-weights ov2.st >ov2.log 2>&1
DDP_TEST_OVERFLOW=5:0 W --set train.precision=\"fp16\" --dump-weights ov1.st >ov1.log 2>&1
check "overflow on rank 1 of 2: the step is skipped and the scale halves" \
    bash -c "grep -q 'step 5: fp16 overflow (non-finite gradient): update skipped, loss scale 65536 -> 32768' ov2.log &&
             [ \"\$(scale_at r2 4)\" = 65536 ] && [ \"\$(scale_at r2 12)\" = 32768 ]"
check "overflow on one rank: 2 ranks == 1 rank (accumulation 2) with the same overflow, bitwise" \
    "$compare" ov2.st ov1.st
check "the skipped step changed the run (not bitwise the run without it)" \
    bash -c "! '$compare' ov1.st fp16.st"

# growth after the interval, and a resume that keeps the scale and its clean-step count
grow=(--set train.precision=\"fp16\" --set train.loss_scale_interval=4)
W "${grow[@]}" --run-dir "$tmp/g" --dump-weights grow.st >grow.log 2>&1
check "the scale doubles after 4 clean steps: 65536 at step 3, 131072 at 4, 262144 at 8" \
    bash -c "[ \"\$(scale_at g 3)\" = 65536 ] && [ \"\$(scale_at g 4)\" = 131072 ] &&
             [ \"\$(scale_at g 8)\" = 262144 ] && [ \"\$(scale_at g 12)\" = 524288 ]"
W "${grow[@]}" --set checkpoint.dir=\"$tmp/ck\" --set checkpoint.every=6 --stop-at-step 6 \
    >ga.log 2>&1
W "${grow[@]}" --run-dir "$tmp/gr" --set checkpoint.dir=\"$tmp/ck\" --dump-weights gres.st >gb.log 2>&1
check "resume: step 6's scale and clean count come back (doubling again at step 8)" \
    bash -c "grep -q 'resumed from' gb.log && [ \"\$(scale_at gr 7)\" = 131072 ] &&
             [ \"\$(scale_at gr 8)\" = 262144 ]"
check "resume: 6 + resume + 6 == 12 straight, bitwise" "$compare" grow.st gres.st
exit $((TAP_FAILED > 0))
