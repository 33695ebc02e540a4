#!/usr/bin/env bash
# A resume with another train.steps (TAP), real ddp-worker processes: refused for the cosine
# schedule with a clear error, allowed with train.allow_schedule_change; a wsd cooldown forked
# from a stable-phase checkpoint moves the decay (the log says where it starts) and gives the
# weights of a straight run of the new length, bit for bit; a resumed step already past the new
# decay start decays from there to the new end; trainer.json names every schedule.
#
#   test_schedule_resume.sh DDP-WORKER DDP-PREP ST-COMPARE
set -uo pipefail
worker=$1 prep=$2 compare=$3
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ddp-sched-resume.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "$0")/../../tap.sh"
. "$(dirname "$0")/../../corpus.sh"
export DDP_LOG_LEVEL=info

cd "$tmp" || exit 1
word_salad "$prep" . 2000 12 7 || { not_ok "ddp-prep made the training shards"; tap_plan; exit 1; }
cat >job.yaml <<YAML
name: sched-resume
model: {preset: gpt2-tiny}
data: {train: $tmp/data/train_*.bin}
train: {steps: 20, micro_batch: 2, seq_len: 32, global_batch_tokens: 64, lr: 1e-3, warmup: 2,
        seed: 5, threads: 1, sample_tokens: 0, val_every: 0}
checkpoint: {dir: $tmp/ck, every: 5, keep_last: 0}
YAML
W() { "$worker" job.yaml "$@"; }
# lr_at RUN_DIR STEP: the lr of STEP's metrics line
lr_at() { python3 -c '
import json, sys
for l in open(sys.argv[1] + "/metrics.jsonl"):
    r = json.loads(l)
    if r.get("step") == int(sys.argv[2]) and "lr" in r: print(r["lr"])' "$1" "$2" | tail -1; }
# sched CKPT KEY: trainer.json's schedule.KEY
sched() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1] + "/trainer.json"))["schedule"][sys.argv[2]])' "$1" "$2"; }
echo "1..9"

# cosine: 20 steps, stopped at 10; resumed with 30 steps
W --run-dir "$tmp/c1" --stop-at-step 10 >c1.log 2>&1 || diag c1.log
if W --run-dir "$tmp/c2" --set train.steps=30 >c2.log 2>&1; then
  not_ok "cosine: a resume with another train.steps is refused"
else
  check "cosine: a resume with another train.steps is refused, naming the flag" \
    grep -q "train.steps changed from 20 to 30 under the cosine schedule.*refused unless --set train.allow_schedule_change=true" c2.log
fi
W --run-dir "$tmp/c3" --set train.steps=30 --set train.allow_schedule_change=true >c3.log 2>&1 &&
  check "cosine: allowed with train.allow_schedule_change, training to step 30" \
    test "$(sched ck/step-00000030 steps)" = 30 ||
  { not_ok "cosine: allowed with train.allow_schedule_change"; diag c3.log; }
check "trainer.json labels the cosine schedule cosine" test "$(sched ck/step-00000030 kind)" = cosine

# wsd: a 40-step run (decay from step 32) stopped at 10, its cooldown forked to 20 steps: the
# decay moves to step 16 and the weights are those of a straight 20-step wsd run
wsd=(--set train.schedule=wsd --set train.min_lr=0 --set checkpoint.dir=\"$tmp/ckw\")
W "${wsd[@]}" --set train.steps=40 --run-dir "$tmp/w1" --stop-at-step 10 >w1.log 2>&1 || diag w1.log
check "wsd: the log says where the decay starts" grep -q "schedule: wsd, .*decay (1-sqrt, to min_lr 0) from step 32 to 40" w1.log
check "trainer.json labels the wsd schedule wsd, with its decay start" \
  test "$(sched ckw/step-00000010 kind) $(sched ckw/step-00000010 decay_start)" = "wsd 32"
W "${wsd[@]}" --run-dir "$tmp/w2" --dump-weights fork.st >w2.log 2>&1 || diag w2.log
check "wsd: a resume with train.steps 20 moves the decay to step 16, logged" \
  grep -q "schedule: train.steps 20 (the checkpoint's 40): the wsd decay (1-sqrt, to min_lr 0) now starts at step 16 and ends at step 20" w2.log
W "${wsd[@]}" --no-resume --set checkpoint.dir=\"$tmp/ckw2\" --run-dir "$tmp/w3" --dump-weights straight.st >w3.log 2>&1 || diag w3.log
check "wsd: the forked cooldown equals a straight 20-step wsd run, bitwise" "$compare" straight.st fork.st

# past the start: the 40-step run resumed at step 10 with 12 steps (decay 2 steps, from 10:
# not past) and with 11 steps (decay from round(0.2 x 11) = 2 steps before the end, step 9,
# which step 10 is past): the decay runs from step 10 to 11
W "${wsd[@]}" --set checkpoint.dir=\"$tmp/ckp\" --set train.steps=40 --run-dir "$tmp/p1" --stop-at-step 10 >p1.log 2>&1 || diag p1.log
W "${wsd[@]}" --set checkpoint.dir=\"$tmp/ckp\" --set train.steps=11 --run-dir "$tmp/p2" >p2.log 2>&1 || diag p2.log
check "wsd: a resumed step past the new decay start starts the decay there, logged" \
  grep -q "now starts at step 10, the resumed step, which is past the spec's decay start and ends at step 11" p2.log
check "wsd: past the start, step 11's lr is lr (r = 0) and trainer.json has forked_at 10" \
  test "$(lr_at "$tmp/p2" 11) $(sched ckp/step-00000011 forked_at)" = "0.001 10"
exit $((TAP_FAILED > 0))
