#!/usr/bin/env bash
# Data mixtures with real processes (TAP): each step's samples (the sum over ranks of the
# loader's sample-id hashes) are the same on 1, 2 and 3 ranks; 2 ranks equal 1 rank x 2
# accumulation steps bitwise; a resume with the same weights is bitwise the run that never
# stopped; new weights on resume repeat and skip no sequence of any source (counted from the
# loader's source:sequence lines) and hold the new shares from the resume; a source dropped is
# named, a source added starts at 0; a source's new epoch is logged; a checkpoint without
# cursors resumes as a mixture from 0; a changed global batch keeps the cursors; metrics.jsonl's tokens/<source> and val_loss/<set> (and
# TensorBoard's, when its reader is installed); an elastic job's replacement rank takes the
# mixture's position from the state transfer (pause and overlap: the same samples per step).
#   test_mixture.sh DDP_WORKER DDP_PREP
set -uo pipefail
worker=$1 prep=$2
here=$(cd "$(dirname "$0")" && pwd)
root=${DDP_SOURCE_ROOT:-$here/../../..}
launch="$root/deploy/launch-local.sh"
compare="$here/compare_weights.py"
count="$here/mixture_count.py"
tmp=$(mktemp -d /tmp/ddp-test-mixture.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export DDP_WORKER=$worker DDP_LOG_LEVEL=debug

. "$(dirname "$0")/../../tap.sh"
. "$(dirname "$0")/../../corpus.sh"

# three sources; c is small (about 40 windows), so that it wraps into a new epoch
mkdir -p "$tmp/a" "$tmp/b" "$tmp/c"
fox_corpus "$prep" "$tmp/a" 3000 --val-fraction 0.1 &&
  word_salad "$prep" "$tmp/b" 800 12 1 --val-fraction 0.1 &&
  word_salad "$prep" "$tmp/c" 24 12 2 --val-fraction 0.1 || { echo "Bail out! ddp-prep failed"; exit 1; }

# job NAME "SOURCE:WEIGHT ..." [STEPS]: $tmp/NAME.yaml over those sources (G = 12 sequences), its
# checkpoints in $tmp/ck (shared by every job, so that phases resume each other's)
job() {
  local name=$1 sources=$2 steps=${3:-12} s
  {
    echo "name: mixture-test"
    echo "model: {preset: gpt2-tiny}"
    echo "data:"
    echo "  train:"
    for s in $sources; do
      local src=${s%%:*} dir=${s%%:*}
      [ "$src" = d ] && dir=c # d: c's shards under another name
      echo "    - {name: $src, path: \"$tmp/$dir/data/train_*.bin\", weight: ${s#*:}}"
    done
    echo "  val: \"$tmp/a/data/val_*.bin\""
    echo "train: {steps: $steps, micro_batch: 2, seq_len: 32, global_batch_tokens: 384, lr: 1.0e-3,"
    echo "        warmup: 2, val_every: 0, sample_tokens: 0, threads: 1}"
    echo "ddp: {bucket_mb: 0.25, first_bucket_mb: 0.0625, check_every: 4}"
    echo "checkpoint: {dir: \"$tmp/ck\"}"
  } >"$tmp/$name.yaml"
}
# run NAME RANKS JOB [options]: its logs are $tmp/NAME/*.log (rank 0's: $tmp/NAME/rank-0.log)
run() {
  local name=$1 n=$2 job=$3
  shift 3
  mkdir -p "$tmp/$name"
  RUN_DIR="$tmp/$name" "$launch" "$n" "$tmp/$job.yaml" --quiet --dump-weights "$tmp/$name.st" \
    "$@" >"$tmp/$name/rank-0.log" 2>&1 || { tail -5 "$tmp/$name"/*.log; return 1; }
}

job mix "a:5 b:3 c:2"
# 1. the same samples per step on 1, 2 and 3 ranks
ids_ok=1
for n in 1 2 3; do
  rm -rf "$tmp/ck"
  run "w$n" $n mix || { ids_ok=0; break; }
  python3 "$count" ids 1 12 "$tmp/w$n"/*.log >"$tmp/ids$n"
done
if [ $ids_ok = 1 ] && [ -s "$tmp/ids1" ] && cmp -s "$tmp/ids1" "$tmp/ids2" &&
  cmp -s "$tmp/ids1" "$tmp/ids3" && [ "$(tr ' ' '\n' <"$tmp/ids1" | grep -c '/12$')" = 12 ]; then
  ok "each step's 12 samples hash alike on 1, 2 and 3 ranks ($(cut -c1-40 "$tmp/ids1")...)"
else
  not_ok "each step's samples hash alike on 1, 2 and 3 ranks" "1: $(cat "$tmp/ids1" 2>/dev/null)" \
    "2: $(cat "$tmp/ids2" 2>/dev/null)" "3: $(cat "$tmp/ids3" 2>/dev/null)"
fi

# 2. 2 ranks x 1 micro-step == 1 rank x 2, bitwise (a global batch of 4 sequences)
rm -rf "$tmp/ck"
run e1 1 mix --no-resume --set train.global_batch_tokens=128 &&
  run e2 2 mix --no-resume --set train.global_batch_tokens=128 &&
  check "a mixture: 2 ranks equal 1 rank x 2 accumulation steps bitwise" \
    python3 "$compare" "$tmp/e1.st" "$tmp/e2.st" --bitwise || not_ok "2-rank equivalence runs"

# 3. resume with the same weights: bitwise the run that never stopped (2 ranks)
rm -rf "$tmp/ck"
run r1 2 mix --stop-at-step 6 && run r2 2 mix &&
  check "a mixture resumed at step 6 with the same weights equals the run without a stop" \
    cmp "$tmp/w2.st" "$tmp/r2.st" || not_ok "resume runs"

# 4. new weights on resume: every source's sequences 0..n-1 drawn once each over both phases
job mix2 "a:2 b:3 c:5"
if [ -d "$tmp/ck/step-00000012" ]; then rm -rf "$tmp/ck/step-00000012"; fi
run p2 2 mix2 &&
  python3 "$count" sources 1 6 "$tmp/r1"/*.log >"$tmp/k1.json" &&
  python3 "$count" sources 7 12 "$tmp/p2"/*.log >"$tmp/k2.json" &&
  check "new weights on resume: no sequence of any source repeated or skipped, the new shares held" \
    python3 - "$tmp/k1.json" "$tmp/k2.json" "$tmp/ck/step-00000012/trainer.json" <<'EOF' ||
import json, sys
k1, k2 = (json.load(open(p)) for p in sys.argv[1:3])
saved = {s["name"]: s["count"] for s in json.load(open(sys.argv[3]))["data"]["mixture"]["sources"]}
names, w2, total = ["a", "b", "c"], [0.2, 0.3, 0.5], 0
for d, name in enumerate(names):
    ks = sorted(k1.get(str(d), []) + k2.get(str(d), []))
    assert ks == list(range(len(ks))), f"source {name}: sequences {ks} are not 0..{len(ks) - 1} once each"
    assert saved[name] == len(ks), f"source {name}: trainer.json counts {saved[name]}, the logs {len(ks)}"
    after = len(k2.get(str(d), []))
    assert abs(after - w2[d] * 72) <= 1, f"source {name}: {after} of 72 after the resume, share {w2[d]}"
    total += len(ks)
    print(f"{name}: {len(k1.get(str(d), []))} + {after} sequences")
assert total == 144, f"{total} sequences in 12 steps of 12"
EOF
  not_ok "weight-change runs"
check "the weight change is logged with the old and the new weights" \
  grep -q "mixture changed at sample 72: weights were a 5, b 3, c 2, now a 2, b 3, c 5" "$tmp/p2/rank-0.log"
check "source c's new epoch is logged" grep -q "source c wraps into its epoch 2" "$tmp/p2/rank-0.log" "$tmp/r1/rank-0.log" "$tmp/w1/rank-0.log"

# 5. a source dropped (c) and one added (d) on resume: named; a and b go on, d starts at 0
job mix3 "a:1 b:1 d:1" 18
run p3 2 mix3 --set train.allow_schedule_change=true && python3 "$count" sources 13 18 "$tmp/p3"/*.log >"$tmp/k3.json" &&
  check "a source dropped on resume is named, one added starts at 0, the others go on" \
    python3 - "$tmp/k1.json" "$tmp/k2.json" "$tmp/k3.json" "$tmp/p3/rank-0.log" <<'EOF' ||
import json, sys
k1, k2, k3 = (json.load(open(p)) for p in sys.argv[1:4])
log = open(sys.argv[4]).read()
assert "source c (50 sequences drawn) is no longer in data.train" in log, "no warning naming c"
assert "data.train's source d is new: it starts at its sequence 0" in log, "no line naming d"
for d, name in ((0, "a"), (1, "b")):
    ks = sorted(k1.get(str(d), []) + k2.get(str(d), []) + k3.get(str(d), []))
    assert ks == list(range(len(ks))), f"source {name}: {ks} are not 0..{len(ks) - 1} once each"
new = sorted(k3.get("2", []))
assert new == list(range(len(new))) and len(new) == 24, f"source d: {new}"
EOF
  not_ok "source-change run"

# 6. a checkpoint without cursors (a single-source run) resumes as a mixture from 0
rm -rf "$tmp/ck"
sed 's#^  train:#  train: "'"$tmp"'/a/data/train_*.bin"#; /^    - /d' "$tmp/mix.yaml" >"$tmp/single.yaml"
run s1 1 single --stop-at-step 3 && run s2 1 mix --stop-at-step 5 &&
  check "a checkpoint without cursors resumes as a mixture, each source from 0" \
    grep -q "has no per-source cursors .* starts each at its sequence 0 at sample 36" "$tmp/s2/rank-0.log" ||
  not_ok "single-then-mixture runs"

# 6b. a global batch changed on resume (12 -> 16 sequences): each source goes on from its cursor
rm -rf "$tmp/ck"
run g1 2 mix --stop-at-step 6 && run g2 2 mix --set train.global_batch_tokens=512 &&
  python3 "$count" sources 1 6 "$tmp/g1"/*.log >"$tmp/g1.json" &&
  python3 "$count" sources 7 12 "$tmp/g2"/*.log >"$tmp/g2.json" &&
  check "a global batch changed on resume: no sequence of any source repeated or skipped" \
    python3 - "$tmp/g1.json" "$tmp/g2.json" "$tmp/ck/step-00000012/trainer.json" "$tmp/g2/rank-0.log" <<'EOF' ||
import json, sys
k1, k2 = (json.load(open(p)) for p in sys.argv[1:3])
saved = {s["name"]: s["count"] for s in json.load(open(sys.argv[3]))["data"]["mixture"]["sources"]}
assert "mixture changed at sample 96" in open(sys.argv[4]).read(), "no line on the change"
total = 0
for d, name in enumerate("abc"):
    ks = sorted(k1.get(str(d), []) + k2.get(str(d), []))
    assert ks == list(range(len(ks))), f"source {name}: {ks} are not 0..{len(ks) - 1} once each"
    assert saved[name] == len(ks), f"source {name}: trainer.json {saved[name]}, the logs {len(ks)}"
    total += len(ks)
assert total == 6 * 12 + 6 * 16, total
EOF
  not_ok "global-batch-change runs"

# 7. metrics: each step's tokens per source (tokens/<name>, adding up to tokens), each named
# validation set's val_loss/<name>; TensorBoard has them when its reader is installed
rm -rf "$tmp/ck"
sed -e 's#^  val: .*#  val:\n    - {name: fox, path: "'"$tmp"'/a/data/val_*.bin"}\n    - {name: salad, path: "'"$tmp"'/b/data/val_*.bin"}#' \
  -e 's/val_every: 0, /val_every: 2, val_batches: 2, /' -e 's/steps: 12,/steps: 4,/' "$tmp/mix.yaml" >"$tmp/val.yaml"
run v 2 val --no-resume &&
  check "metrics.jsonl: tokens/<source> per step adding up to tokens, val_loss/<set> per validation" \
    python3 - "$tmp/v/metrics.jsonl" <<'EOF' ||
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
steps = [o for o in lines if "loss" in o]
vals = [o for o in lines if "val_loss" in o and "loss" not in o]
assert len(steps) == 4 and len(vals) == 2, (len(steps), len(vals))
for o in steps:
    by = [o["tokens/" + s] for s in "abc"]
    assert sum(by) == o["tokens"], f"step {o['step']}: {by} do not add up to {o['tokens']}"
assert steps[-1]["tokens/a"] > steps[-1]["tokens/c"] > 0, steps[-1]
for o in vals:
    assert o["val_loss"] == o["val_loss/fox"] and o["val_loss/salad"] > 0, o
EOF
  not_ok "validation-list run"
if python3 -c 'import tensorboard' 2>/dev/null; then
  check "TensorBoard has every named value at its step (train/tokens/<source>, loss/val/<set>)" \
    python3 "$root/tests/observe/tb_check.py" "$tmp/v" 0
else
  skip "TensorBoard has every named value at its step" "the tensorboard package is not installed"
fi

# 8. elastic (4 ranks, after a weight change on resume, so that the mixture's position is not
# the one a replacement would derive): rank 2 hangs as step 8 begins and is killed; its
# replacement takes the position from the state transfer: steps 5..16 train on the same samples
# as without the failure (pause and overlap), and pause gives the same weights
rm -rf "$tmp/ck"
job el1 "a:5 b:3 c:2" 16
job el2 "a:2 b:3 c:5" 16
for f in el1 el2; do
  sed -i -e 's/^ddp: {/ddp: {workers: 4, min_workers: 4, restart: on-failure, max_restarts: 1, /' \
    -e 's/global_batch_tokens: 384/global_batch_tokens: 512/' "$tmp/$f.yaml"
done
# elastic NAME MODE: el2 from the step-4 checkpoint, rank 2 killed as step 8 begins
elastic() {
  local name=$1 mode=$2 deadline=$((SECONDS + 120))
  rm -rf "$tmp/ck" && cp -r "$tmp/ck4" "$tmp/ck"
  DDP_TEST_HANG=8:2 run "$name" 4 el2 --set ddp.state_transfer="$mode" &
  local pid=$!
  until grep -q "hangs as step 8 begins" "$tmp/$name/rank-2.log" 2>/dev/null; do
    [ $SECONDS -ge $deadline ] && break
    sleep 0.05
  done
  kill -KILL "$(cat "$tmp/$name/rank-2.pid")" 2>/dev/null
  wait "$pid"
}
if run el-first 4 el1 --stop-at-step 4 && cp -r "$tmp/ck" "$tmp/ck4" && run el-plain 4 el2 &&
  elastic el-pause pause && elastic el-overlap overlap; then
  for r in plain pause overlap; do python3 "$count" ids 5 16 "$tmp/el-$r"/*.log >"$tmp/el-$r.ids"; done
  if [ "$(tr ' ' '\n' <"$tmp/el-plain.ids" | grep -c '/16$')" = 12 ] &&
    cmp -s "$tmp/el-plain.ids" "$tmp/el-pause.ids" && cmp -s "$tmp/el-plain.ids" "$tmp/el-overlap.ids"; then
    ok "elastic: a replacement takes the mixture's position; steps 5..16 train on the same samples (pause, overlap)"
  else
    not_ok "elastic: the same samples with a replacement" "plain: $(cat "$tmp/el-plain.ids")" \
      "pause: $(cat "$tmp/el-pause.ids")" "overlap: $(cat "$tmp/el-overlap.ids")"
  fi
  check "elastic, pause: the weights equal the run without a failure" cmp "$tmp/el-plain.st" "$tmp/el-pause.st"
else
  not_ok "elastic runs"
  not_ok "elastic, pause: the weights equal the run without a failure"
fi

tap_plan
exit $((TAP_FAILED > 0))
