#!/usr/bin/env bash
# Evaluation in the training loop (worker/evaluate.c), on gpt2-tiny with the tinyshakespeare task:
#   1. the weights of a 2-rank job are bitwise the same with and without `eval` (it uses neither
#      the loader, the RNG nor the gradient arena);
#   2. metrics.jsonl has an eval record at each `every` and after the last step, with every
#      example of the task (the limit too: a second task scores only its first 10);
#   3. 1 and 2 ranks give the same counts (each example's forward has one shape, whatever the
#      deal), checked at every evaluation: on jobs whose lr (1e-60, zero in fp32) leaves the weights at their
#      seeded start, since 1 and 2 ranks sum gradients in different orders;
#   4. a bad row refuses the job at start with its file, line and field (exit 2);
#   5. the simulated GPU (--backend sim: device memory apart from the host's, the kernels'
#      device path) gives the same counts as the CPU;
#   6. `target_delimiter: ""` reaches the scorer: the task with " " put before every choice,
#      scored with no delimiter, gives the default's acc, acc_tok and forward tokens (acc_norm
#      counts the choice's characters, one more).
# Usage: test_eval_loop.sh BUILD_DIR SOURCE_ROOT
set -euo pipefail
build=$(cd "$1" && pwd) root=$(cd "$2" && pwd)
tmp=$(mktemp -d /tmp/ddp-eval-loop.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export DDP_WORKER=$build/worker/ddp-worker DDP_LOG_LEVEL=warn
. "$root/tests/corpus.sh"
fox_corpus "$build/worker/ddp-prep" "$tmp" 2000 --val-fraction 0.1
task=$root/tests/fixtures/eval/shakespeare.jsonl
cat >"$tmp/base.yaml" <<YAML
name: evalloop
model: {preset: gpt2-tiny}
data: {train: "$tmp/data/train_*.bin"}
train: {steps: 6, micro_batch: 2, seq_len: 64, global_batch_tokens: 512, lr: 1.0e-3, warmup: 1,
        sample_tokens: 0, threads: 1, log_every: 1, precision: fp32}
ddp: {bucket_mb: 0.25}
YAML
cp "$tmp/base.yaml" "$tmp/eval.yaml"
cat >>"$tmp/eval.yaml" <<YAML
eval:
  - {name: shakespeare, path: "$task", every: 4}
  - {name: first10, path: "$root/tests/fixtures/eval/shakespeare_hellaswag.jsonl", every: 0, limit: 10}
YAML
run() { # NAME N JOB: N ranks; prints the weights' hash
    local name=$1 n=$2 job=$3
    RUN_DIR="$tmp/$name" "$root/deploy/launch-local.sh" "$n" "$job" --quiet \
        --dump-weights "$tmp/$name.st" >"$tmp/$name.log" 2>&1 ||
        { echo "FAIL: $name: $(tail -3 "$tmp/$name.log")" >&2; exit 1; }
    sha256sum "$tmp/$name.st" | cut -c1-16
}
fail=0
plain=$(run plain 2 "$tmp/base.yaml")
with=$(run with 2 "$tmp/eval.yaml")
sed 's/lr: 1.0e-3/lr: 1.0e-60, min_lr: 1.0e-61/' "$tmp/eval.yaml" >"$tmp/still.yaml"
one=$(run one 1 "$tmp/still.yaml")
two=$(run two 2 "$tmp/still.yaml")
echo "weights: 2 ranks without eval $plain, with eval $with; lr 1e-60: 1 rank $one, 2 ranks $two"
if [ "$plain" = "$with" ]; then echo "ok 1 - the weights are bitwise the same with eval"
else echo "not ok 1 - eval changed the weights"; fail=1; fi
records() { grep '"event":"eval"' "$tmp/$1/metrics.jsonl" | sed 's/,"eval_ms":[0-9.]*//'; }
records with >"$tmp/with.ev"
records one >"$tmp/one.ev"
records two >"$tmp/two.ev"
cat "$tmp/with.ev"
want='{"event":"eval","step":4,"task":"shakespeare","examples":40,
{"event":"eval","step":6,"task":"shakespeare","examples":40,
{"event":"eval","step":6,"task":"first10","examples":10,'
got=$(sed 's/"acc".*//' "$tmp/with.ev")
if [ "$got" = "$want" ]; then echo "ok 2 - eval records at steps 4 and 6, every example, the limit"
else echo "not ok 2 - eval records:"; echo "$got"; fail=1; fi
if [ "$two" = "$one" ] && [ -s "$tmp/one.ev" ]; then
    if cmp -s "$tmp/two.ev" "$tmp/one.ev"; then echo "ok 3 - 1 and 2 ranks give the same counts"
    else echo "not ok 3 - 1 and 2 ranks differ:"; diff "$tmp/two.ev" "$tmp/one.ev" || true; fail=1; fi
else
    echo "not ok 3 - the lr 1e-60 jobs' weights differ ($one vs $two) or have no eval record"
    fail=1
fi
printf '{"context": "a", "choices": ["b"], "label": 0}\n{"context": "a", "choices": ["b", ""], "label": 0}\n' >"$tmp/bad.jsonl"
sed "s|path: \"$task\"|path: \"$tmp/bad.jsonl\"|" "$tmp/eval.yaml" >"$tmp/bad.yaml"
set +e
"$DDP_WORKER" --quiet "$tmp/bad.yaml" >"$tmp/bad.log" 2>&1
rc=$?
set -e
if [ $rc -eq 2 ] && grep -q "bad.jsonl:2:1: choices\[1\]: empty" "$tmp/bad.log"; then
    echo "ok 4 - a bad row refuses the job with its file, line and field"
else echo "not ok 4 - bad row: exit $rc: $(tail -2 "$tmp/bad.log")"; fail=1; fi
if "$DDP_WORKER" --quiet --backend sim --run-dir "$tmp/sim" "$tmp/still.yaml" >"$tmp/sim.log" 2>&1; then
    records sim >"$tmp/sim.ev"
    if [ -s "$tmp/sim.ev" ] && cmp -s "$tmp/sim.ev" "$tmp/one.ev"; then
        echo "ok 5 - the simulated GPU gives the CPU's counts"
    else echo "not ok 5 - sim and CPU differ:"; diff "$tmp/sim.ev" "$tmp/one.ev" || true; fail=1; fi
else echo "not ok 5 - the sim run failed: $(tail -2 "$tmp/sim.log")"; fail=1; fi
python3 - "$task" "$tmp/spaced.jsonl" <<'PY'
import json, sys
with open(sys.argv[1]) as f, open(sys.argv[2], "w") as out:
    for line in f:
        row = json.loads(line)
        row["choices"] = [" " + c for c in row["choices"]]
        out.write(json.dumps(row) + "\n")
PY
sed "s|path: \"$task\", every: 4}|path: \"$tmp/spaced.jsonl\", every: 4, target_delimiter: \"\"}|" \
    "$tmp/still.yaml" >"$tmp/delim.yaml"
run delim 1 "$tmp/delim.yaml" >/dev/null
shakespeare() { grep '"task":"shakespeare"' "$tmp/$1.ev" | sed 's/"acc_norm":[0-9.]*,//'; }
records delim >"$tmp/delim.ev"
if [ -s "$tmp/delim.ev" ] && [ "$(shakespeare delim)" = "$(shakespeare one)" ]; then
    echo "ok 6 - target_delimiter \"\" scores \" \" + choice as the default scores the choice"
else echo "not ok 6 - target_delimiter:"; shakespeare delim; shakespeare one; fail=1; fi
[ $fail -eq 0 ] && echo "6 passed, 0 failed" || echo "some failed"
exit $fail
