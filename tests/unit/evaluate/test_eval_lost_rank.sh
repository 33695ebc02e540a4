#!/usr/bin/env bash
# A rank lost during an evaluation (worker/evaluate.c): an elastic job of 3 ranks (gpt2-tiny,
# min_workers 2, restart on-failure) with an eval task every 3 steps; rank 2 stops for good as
# the evaluation after step 3 begins (DDP_TEST_EVAL_HANG=3:2, first generation only) and is
# SIGKILLed there. The others must log that evaluation abandoned, regroup and finish every step,
# with eval records at the later evaluations and none at step 3.
# Every wait is for a log line with a deadline.
#   test_eval_lost_rank.sh BUILD_DIR SOURCE_ROOT
set -uo pipefail
build=$(cd "$1" && pwd) root=$(cd "$2" && pwd)
tmp=$(mktemp -d /tmp/ddp-eval-lost.XXXXXX)
launcher=""
cleanup() {
    [ -n "$launcher" ] && kill -TERM "$launcher" 2>/dev/null
    for f in "$tmp"/run/rank-*.pid; do [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null; done
    wait 2>/dev/null
    [ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"
}
trap cleanup EXIT
export DDP_WORKER=$build/worker/ddp-worker DDP_LOG_LEVEL=info
. "$root/tests/corpus.sh"
. "$root/tests/wait.sh"
fox_corpus "$build/worker/ddp-prep" "$tmp" 2000 --val-fraction 0.1
cat >"$tmp/job.yaml" <<YAML
name: eval-lost
model: {preset: gpt2-tiny}
data: {train: "$tmp/data/train_*.bin"}
train: {steps: 9, micro_batch: 2, seq_len: 64, global_batch_tokens: 768, lr: 1.0e-3, warmup: 1,
        sample_tokens: 0, threads: 1, log_every: 1, precision: fp32}
ddp: {workers: 3, min_workers: 2, restart: on-failure, max_restarts: 1, heartbeat_timeout_s: 1,
      rejoin_timeout_s: 30}
eval:
  - {name: shakespeare, path: "$root/tests/fixtures/eval/shakespeare.jsonl", every: 3}
YAML
mkdir -p "$tmp/run"
DDP_TEST_EVAL_HANG=3:2 RUN_DIR="$tmp/run" "$root/deploy/launch-local.sh" 3 "$tmp/job.yaml" \
    >"$tmp/out.log" 2>&1 &
launcher=$!
fail=0
hung() { grep -q "hangs as the evaluation after step 3 begins" "$tmp/run/rank-2.log" 2>/dev/null; }
hung_or_over() { hung || ! kill -0 "$launcher" 2>/dev/null; } # the launcher ended without it
if ! wait_until 120 hung_or_over || ! hung; then
    echo "not ok 1 - rank 2 never reached the evaluation after step 3"
    tail -20 "$tmp/out.log"
    exit 1
fi
kill -KILL "$(cat "$tmp/run/rank-2.pid")"
wait "$launcher"
rc=$?
launcher=""
if [ $rc -eq 0 ]; then echo "ok 1 - the job finished after losing rank 2 in an evaluation"
else echo "not ok 1 - the job failed (exit $rc)"; tail -20 "$tmp/out.log"; fail=1; fi
if grep -q "eval shakespeare at step 3 abandoned" "$tmp/out.log"; then
    echo "ok 2 - the evaluation was abandoned and logged"
else echo "not ok 2 - no 'abandoned' line in rank 0's output"; fail=1; fi
steps=$(grep -c '"loss"' "$tmp/run/metrics.jsonl")
gens=$(grep -c '"event":"generation"' "$tmp/run/metrics.jsonl")
evals=$(grep '"event":"eval"' "$tmp/run/metrics.jsonl" | sed 's/.*"step":\([0-9]*\).*/\1/' | tr '\n' ' ')
if [ "$steps" -eq 9 ] && [ "$evals" = "6 9 " ] && [ "$gens" -ge 1 ]; then
    echo "ok 3 - training went on: $steps step lines, $gens new generation(s), evaluations after steps $evals"
else echo "not ok 3 - step lines $steps, generations $gens, evaluations at '$evals' (want 6 9)"; fail=1; fi
[ $fail -eq 0 ] && echo "3 passed, 0 failed" || echo "some failed"
exit $fail
