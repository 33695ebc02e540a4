#!/usr/bin/env bash
# Checkpoint resume of real ddp-worker processes (TAP): exact resume on 1 and 2 ranks, a 2-rank
# checkpoint resumed on 1 rank, 2 ranks stopped by SIGTERM and resumed, striped writers, SIGKILL
# during a save, damaged newest checkpoints (flipped byte, truncated shard, missing manifest) and
# the Python format check.
#
#   test_resume.sh DDP-WORKER DDP-PREP ST-COMPARE
#
# Training data is made here (a deterministic word salad through ddp-prep); every run is
# gpt2-tiny with B=2, T=32, so each takes well under a second.
set -uo pipefail
worker=$1 prep=$2 compare=$3
src=${DDP_SOURCE_ROOT:-$(cd "$(dirname "$0")/../../.." && pwd)}
launch=$src/deploy/launch-local.sh
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ddp-ckpt-resume.XXXXXX")
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"; }
trap cleanup EXIT
. "$(dirname "$0")/../../tap.sh"
. "$(dirname "$0")/../../corpus.sh"
# wait_until TIMEOUT_S COMMAND...: polls COMMAND every 20 ms until it succeeds (0) or the
# deadline passes (1). Tests wait for events this way, never with a bare sleep.
wait_until() {
    local deadline=$((SECONDS + $1)); shift
    until "$@" >/dev/null 2>&1; do [ $SECONDS -ge $deadline ] && return 1; sleep 0.02; done
}
# DDP_TEST_SLOW_US (default 0): a delay per all-reduce chunk in every run here
# (DDP_COLL_DELAY_US), to check that the verdicts do not depend on the machine's speed.
[ "${DDP_TEST_SLOW_US:-0}" -gt 0 ] && export DDP_COLL_DELAY_US=$DDP_TEST_SLOW_US

cd "$tmp" || exit 1
word_salad "$prep" . 4000 12 7 || { not_ok "ddp-prep made the training shards"; tap_plan; exit 1; }
cat >job.yaml <<YAML
name: ckpt-resume
model: {preset: gpt2-tiny}
data: {train: $tmp/data/train_*.bin}
train: {steps: 20, micro_batch: 2, seq_len: 32, global_batch_tokens: 128, lr: 1e-3, warmup: 2,
        seed: 5, threads: 1, sample_tokens: 0}
ddp: {max_workers: 2}
checkpoint: {dir: $tmp/ck, every: 5, keep_last: 0}
YAML
W() { "$worker" job.yaml --quiet "$@"; }
L() { DDP_WORKER=$worker RUN_DIR=$tmp/run "$launch" "$@"; }
echo "1..20"

# 1 rank: 20 straight vs 10 + resume + 10
W --no-resume --set checkpoint.dir=\"$tmp/full1\" --dump-weights full1.st >full1.log 2>&1
W --stop-at-step 10 >a.log 2>&1
W --dump-weights res1.st >b.log 2>&1
check "1 rank: 20 steps straight == 10 + resume + 10, bitwise" "$compare" full1.st res1.st
check "1 rank: the resumed run says where it resumed" grep -q "resumed from $tmp/ck/step-00000010: step 10" b.log
# run again: it resumes at step 20 with nothing left to train, and reports the saved step's
# training loss as its final loss (not 0: no step ran in this process)
W --run-dir "$tmp/rerun" >rerun.log 2>&1
check "1 rank: resumed at the last step, the done record's final loss is step 20's" python3 -c "
import json
saved = json.load(open('$tmp/ck/step-00000020/trainer.json'))['last_loss']
done = [json.loads(l) for l in open('$tmp/rerun/metrics.jsonl') if '\"done\"' in l][-1]
assert saved > 0 and abs(done['final_loss'] - saved) <= 1e-6 * saved, (saved, done)"
# the planned saves took every CRC32C from the update (and the resume above verified them)
check "1 rank: a planned save reads no tensor for its checksums" \
    grep -q "checkpoint step 10: .*, 0.0 MB checksummed by the writer" a.log

# the Llama family: 2 ranks, 20 straight vs 10 + resume + 10 (its checkpoint holds lm_head,
# model.norm, model.layers.* and config.json in Hugging Face's layout)
llama=(--set model.preset=llama-tiny)
L 2 job.yaml --quiet "${llama[@]}" --no-resume --set checkpoint.dir=\"$tmp/fullL\" --dump-weights fullL.st >fullL.log 2>&1
L 2 job.yaml --quiet "${llama[@]}" --no-resume --set checkpoint.dir=\"$tmp/ckL\" --stop-at-step 10 >l1.log 2>&1
L 2 job.yaml --quiet "${llama[@]}" --set checkpoint.dir=\"$tmp/ckL\" --dump-weights resL.st >l2.log 2>&1
check "llama-tiny, 2 ranks: 20 steps straight == 10 + resume + 10, bitwise" "$compare" fullL.st resL.st
check "llama-tiny: the checkpoint's config.json is a LlamaForCausalLM's" \
    grep -q '"LlamaForCausalLM"' "$tmp/ckL/step-00000010/config.json"
# resuming it as another model names the differing key
if W --set model.preset=gpt2-tiny --set checkpoint.dir=\"$tmp/ckL\" >lbad.log 2>&1; then
  not_ok "a Llama checkpoint resumed as GPT-2 is refused"
else
  check "a Llama checkpoint resumed as GPT-2 is refused, naming model_type" \
      grep -q "is another model than this run's (model_type is llama and gpt2" lbad.log
fi

# 2 ranks
L 2 job.yaml --quiet --set checkpoint.dir=\"$tmp/full2\" --dump-weights full2.st >full2.log 2>&1
rm -rf ck
L 2 job.yaml --stop-at-step 10 >c.log 2>&1
cp -a ck ck2
L 2 job.yaml --quiet --dump-weights res2.st >d.log 2>&1
check "2 ranks: 20 steps straight == 10 + resume + 10, bitwise" "$compare" full2.st res2.st
check "2 ranks, sharded update: the CRCs merged over the ranks cover every tensor" \
    bash -c "grep -q 'optimizer step sharded' c.log &&
             grep -q 'checkpoint step 10: .*, 0.0 MB checksummed by the writer' c.log"

# the 2-rank checkpoint of step 10 resumed on 1 rank
rm -rf ck && cp -a ck2 ck
W --dump-weights res21.st >e.log 2>&1
check "2-rank checkpoint resumed on 1 rank == 2-rank run within 1e-6" "$compare" full2.st res21.st 1e-6
check "1-rank resume keeps the global batch (accumulation 2)" grep -q "now 1 x 2" e.log

# 2 ranks stopped by SIGTERM at whatever step they reach: an unplanned save, for which the
# sharded optimizer step gathers the moments at the boundary; resumed, bitwise the straight run
long=(--quiet --set train.steps=500 --set checkpoint.every=0)
L 2 job.yaml "${long[@]}" --set checkpoint.dir=\"$tmp/full500\" --dump-weights full500.st >t0.log 2>&1
# The run prints its step lines (no --quiet) and every all-reduce chunk waits 2 ms, so 500
# steps take seconds at any machine speed; SIGTERM goes as soon as step 20 is logged.
DDP_COLL_DELAY_US=$((${DDP_TEST_SLOW_US:-0} > 2000 ? ${DDP_TEST_SLOW_US:-0} : 2000)) \
    DDP_WORKER=$worker RUN_DIR=$tmp/run "$launch" 2 job.yaml "${long[@]:1}" \
    --set checkpoint.dir=\"$tmp/ckt\" >t1.log 2>&1 &
t1=$!; pids+=($t1)
wait_until 120 grep -qE 'step +20/500' t1.log || echo "# step 20 never logged: $(tail -3 t1.log)"
kill -TERM $t1
wait $t1
L 2 job.yaml "${long[@]}" --set checkpoint.dir=\"$tmp/ckt\" --dump-weights term.st >t2.log 2>&1
check "2 ranks stopped by SIGTERM mid-run, resumed: bitwise the straight run" \
    bash -c "grep -q 'stopping: saving a checkpoint of step [0-9]' t1.log &&
             ! grep -q 'stopping: saving a checkpoint of step 500' t1.log &&
             '$compare' full500.st term.st"

# striped writers: 2 ranks write, rank 0 commits; same weights, and the stripes resume
rm -rf ck
L 2 job.yaml --quiet --set checkpoint.writers=2 --set checkpoint.shard_mb=1 --dump-weights st.st >f.log 2>&1
check "striped writers: committed by rank 0, weights unchanged" \
    bash -c "grep -q 'step 20 committed by rank 0' f.log && '$compare' full2.st st.st"
W --resume-step 15 --dump-weights st1.st >g.log 2>&1
check "striped checkpoint (6 shards over 2 writers) resumes on 1 rank" \
    bash -c "grep -q 'resumed from .*step-00000015' g.log && '$compare' full2.st st1.st 1e-6"

# SIGKILL while step 10 is being written: step 5 stays intact and `latest` points to it
rm -rf ck
W --stop-at-step 5 >h.log 2>&1
DDP_TEST_CKPT_SHARD_DELAY_MS=5000 "$worker" job.yaml --quiet --stop-at-step 10 \
    --set checkpoint.shard_mb=1 >i.log 2>&1 &
pid=$!; pids+=($pid)
# the first shard of step 10 is written (the writer then pauses 5 s): kill in the middle
wait_until 120 bash -c 'ls ck/.step-00000010.tmp/*.safetensors' ||
    echo "# step 10's first shard never appeared"
kill -9 $pid; wait $pid 2>/dev/null
check "SIGKILL during a save: previous checkpoint intact, latest -> step-00000005" \
    bash -c "[ \"\$(readlink ck/latest)\" = step-00000005 ] && [ -f ck/step-00000005/MANIFEST.json ] && [ ! -d ck/step-00000010 ] && [ -d ck/.step-00000010.tmp ]"
W --dump-weights k.st >k.log 2>&1
check "after the crash resume uses step 5 and ends bitwise equal to the straight run" \
    bash -c "grep -q 'resumed from .*step-00000005' k.log && '$compare' full1.st k.st"

# damaged newest checkpoint: each is named and resume falls back to step 15
damage() { # $1: label, $2: command that damages ck/step-00000020
    rm -rf ck && cp -a "$tmp/full1" ck && (cd ck/step-00000020 && eval "$2")
    W --stop-at-step 17 --dump-weights dmg.st >dmg.log 2>&1
    check "$1: named, and resume falls back to step 15" \
        bash -c "grep -q 'step-00000020\|step 20' dmg.log && grep -qi '$3' dmg.log && grep -q 'resumed from .*step-00000015' dmg.log"
}
damage "flipped byte in a shard" \
    "python3 -c \"f=open('model.safetensors','r+b'); f.seek(4000); b=f.read(1); f.seek(4000); f.write(bytes([b[0]^0x40]))\" 2>/dev/null || printf '\\x55' | dd of=model.safetensors bs=1 seek=4000 conv=notrunc 2>/dev/null" \
    "model.safetensors"
damage "truncated shard" "truncate -s -100 optim.safetensors" "optim.safetensors"
damage "missing manifest" "rm MANIFEST.json" "MANIFEST"

# format: safetensors + numpy read the model as Hugging Face GPT-2 (skipped without them)
if python3 -c 'import safetensors, numpy' 2>/dev/null; then
    check "format: HF GPT-2 names, shapes and config.json (safetensors + numpy)" \
        python3 "$src/tests/unit/worker_ckpt/check_hf_gpt2.py" "$tmp/full1/step-00000020" full1.st
else
    skip "" "safetensors/numpy not installed"
fi
exit $((TAP_FAILED > 0))
