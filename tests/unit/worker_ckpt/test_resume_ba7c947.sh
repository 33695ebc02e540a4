#!/usr/bin/env bash
# A checkpoint written by ba7c947's ddp-worker resumes here (TAP): its weights load bit for bit,
# its position (step, tokens, AdamW's count, fp16's loss scale and clean steps) goes on, and,
# where ba7c947 can be built from this repository's history, this build's continuation to step
# 8 is ba7c947's own, bit for bit. The fixture: tests/fixtures/ba7c947/README.md.
#
#   test_resume_ba7c947.sh DDP-WORKER DDP-PREP ST-COMPARE BUILD_DIR
set -uo pipefail
worker=$1 prep=$2 compare=$3 build=$4
src=${DDP_SOURCE_ROOT:-$(cd "$(dirname "$0")/../../.." && pwd)}
fixture=$src/tests/fixtures/ba7c947/checkpoint/step-00000004
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ddp-resume-ba7c947.XXXXXX")
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
. "$(dirname "$0")/../../tap.sh"
. "$(dirname "$0")/../../corpus.sh"
echo "1..7"
cd "$tmp" || exit 1
word_salad "$prep" . 400 12 7 || { not_ok "ddp-prep made the training shards"; exit 1; }
# job STEPS DIR: the fixture's job, to STEPS steps, its checkpoints in DIR (a copy of the fixture)
job() {
    mkdir -p "$2" && cp -r "$fixture" "$2/"
    cat >"$2.yaml" <<YAML
name: ba7c947-fixture
model: {n_layer: 1, n_head: 2, n_embd: 32, vocab_size: 256, block_size: 32}
data: {train: $tmp/data/train_*.bin}
train: {steps: $1, micro_batch: 2, seq_len: 32, global_batch_tokens: 128, lr: 1e-3, warmup: 2,
        seed: 5, threads: 1, sample_tokens: 0, precision: fp16}
checkpoint: {dir: $tmp/$2, every: 4, keep_last: 0}
YAML
}
field() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$@"; }

# nothing left to train: the weights are the checkpoint's
job 4 at4
"$worker" at4.yaml --quiet --dump-weights at4.st >at4.log 2>&1
check "ba7c947's checkpoint resumes at its step" grep -q "resumed from $tmp/at4/step-00000004: step 4, 512 tokens, AdamW t 3" at4.log
check "its weights load bit for bit" "$compare" "$fixture/model.safetensors" at4.st

# four more steps: the position goes on from the checkpoint's (its cosine was over 4 steps:
# another train.steps is allowed explicitly, docs/training.md)
job 8 new
"$worker" new.yaml --quiet --set train.allow_schedule_change=true --dump-weights new.st >new.log 2>&1
t=new/step-00000008/trainer.json
check "four more steps from it are saved at step 8" test -f "$t"
check "tokens and AdamW's count go on (1024, 3 + 4)" test "$(field "$t" '(d["tokens"], d["adamw"]["t"])')" = "(1024, 7)"
check "fp16's loss scale and its clean steps go on (32768, 2 + 4)" test "$(field "$t" '(d["loss_scale"], d["loss_scale_clean"])')" = "(32768.0, 6)"
check "trainer.json keeps its format" test "$(field "$t" 'd["format"]')" = ddpd-trainer-1

# ba7c947's own continuation, where it can be built (from git history; 12 s on 2 cores)
old=$build/resume-ba7c947
build_old() {
    [ -x "$old/build/worker/ddp-worker" ] && return 0
    git -C "$src" cat-file -e 'ba7c947^{commit}' 2>/dev/null || return 1
    rm -rf "$old" && mkdir -p "$old/src" &&
        git -C "$src" archive ba7c947 | tar -x -C "$old/src" &&
        meson setup "$old/build" "$old/src" -Dcuda=disabled -Dmpi=disabled -Dwerror=false \
            >"$old.log" 2>&1 &&
        ninja -C "$old/build" worker/ddp-worker >>"$old.log" 2>&1
}
if build_old; then
    job 8 old
    "$old/build/worker/ddp-worker" old.yaml --quiet --dump-weights old.st >old.log 2>&1
    check "the continuation to step 8 is ba7c947's, bit for bit" "$compare" old.st new.st
else
    skip "the continuation to step 8 is ba7c947's, bit for bit" "ba7c947 cannot be built here (no git history of it, or its build failed)"
fi
exit $((TAP_FAILED > 0))
