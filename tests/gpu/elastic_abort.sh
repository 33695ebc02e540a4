#!/usr/bin/env bash
# Elastic training over NCCL on two GPUs (tests/gpu.sh runs it, step 7): rank 1 of 2 is
# SIGKILLed after step 3; rank 0 ends the NCCL communicator (revoke, or abort) and goes on alone,
# the launcher restarts rank 1, which rejoins in a communicator formed afresh and receives the
# state from rank 0. The final weights must equal an uninterrupted 2-rank run's within 1e-5 (the
# survivor sums the dead rank's micro-batches in another order). Rank 0's micro-steps are paced
# by DDP_TEST_SLOW_RANK so that the kill lands mid-run however fast the GPU is.
#
#   tests/gpu/elastic_abort.sh BUILD_DIR     BACKEND=sim: the same on the simulated GPU (CPU only),
#                                            which is how this script itself is checked
# Exit 0 when every check passes, 1 otherwise.
set -uo pipefail
bdir=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
backend=${BACKEND:-cuda}
. "$src/tests/gpu/lib.sh"
tmp=$(mktemp -d /tmp/ddp-elastic-gpu.XXXXXX)
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
export DDP_WORKER=$bdir/worker/ddp-worker DDP_COLL_PATH=$bdir/collectives
# the simulated GPU's modules (never installed) are found through the dynamic linker's path
[ "$backend" != sim ] || export LD_LIBRARY_PATH=$bdir/tests/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
word_salad_shards "$bdir" "$tmp" || { echo "FAIL: ddp-prep"; exit 1; }
cat >"$tmp/job.yaml" <<YAML
name: elastic-gpu
model: {preset: gpt2-mini}
data: {train: "$tmp/data/train_*.bin"}
train: {steps: 12, micro_batch: 4, seq_len: 128, lr: 3e-4, warmup: 2, seed: 1, sample_tokens: 0,
        val_every: 0, precision: fp32, global_batch_tokens: 2048}
ddp: {restart: on-failure, max_restarts: 2, state_transfer: overlap}
YAML
failed=0
result() { # PASS|FAIL what
    echo "$1: $2"
    [ "$1" = PASS ] || failed=1
}
launch() { # name: 2 ranks; weights in $tmp/name.st, output in $tmp/name.launch, logs in $tmp/name/
    DDP_LOG_LEVEL=info DDP_TEST_SLOW_RANK=0:150000 RUN_DIR="$tmp/$1" timeout 300 \
        "$src/deploy/launch-local.sh" 2 "$tmp/job.yaml" --backend "$backend" \
        --dump-weights "$tmp/$1.st" >"$tmp/$1.launch" 2>&1
}

launch ref || { tail -n 20 "$tmp/ref.launch"; result FAIL "uninterrupted 2-rank run"; exit 1; }

launch killed &
pid=$!
# rank 0 logs to the launcher's output: wait for its step 3 line (tail follows the file as it
# grows and grep ends at the first match), 120 s at most
timeout 120 tail -n +1 -F "$tmp/killed.launch" 2>/dev/null | grep -q -m 1 "step     3/"
kill -9 "$(cat "$tmp/killed/rank-1.pid" 2>/dev/null)" 2>/dev/null ||
    result FAIL "rank 1 was not running at step 3"
wait $pid
rc=$?
[ $rc -eq 0 ] && result PASS "the job with rank 1 killed after step 3 succeeded" ||
    { tail -n 20 "$tmp/killed.launch"; result FAIL "the job exited $rc"; }
if grep -qh "state of step [3-9][0-9]* from rank 0\|state of step 1[0-2] from rank 0" \
    "$tmp/killed.launch" "$tmp/killed"/rank-*.log; then
    result PASS "the restarted rank 1 rejoined with rank 0's state"
else
    result FAIL "no rejoin with rank 0's state in $tmp/killed.launch"
fi
if python3 "$src/tests/unit/worker/compare_weights.py" "$tmp/ref.st" "$tmp/killed.st" \
    --rel 1e-5 >"$tmp/compare.txt" 2>&1; then
    result PASS "the weights equal the uninterrupted run's within 1e-5 ($(tail -n 1 "$tmp/compare.txt"))"
else
    result FAIL "the weights differ: $(tail -n 1 "$tmp/compare.txt")"
fi
exit $failed
