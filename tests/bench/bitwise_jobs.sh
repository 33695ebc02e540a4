#!/usr/bin/env bash
# The weights of a set of jobs, as SHA-256 hashes: a refactoring of the trainer must leave every
# one unchanged (run it before and after; not a pass/fail test, not in CI).
#   tests/bench/bitwise_jobs.sh BUILD_DIR [JOB...]      (default: every job below)
# Jobs (gpt2-tiny on the fox corpus, fp32 unless named, 2 micro-steps of accumulation per rank):
#   zero1       2 ranks, ddp.shard_optimizer: true (ZeRO-1)
#   nozero1     2 ranks, ddp.shard_optimizer: false
#   fp16        2 ranks, train.precision: fp16 (dynamic loss scale)
#   pause       4 ranks, elastic with min_workers 4: rank 2 stops as step 8 begins (DDP_TEST_HANG)
#               and is SIGKILLed there; the others wait for its replacement, which rejoins, and
#               step 8 is redone with ddp.state_transfer: pause (the same steps every time)
#   overlap     the same with ddp.state_transfer: overlap (step 8 computed by the 3 holders)
#   sim         2 ranks on the simulated GPU ("sim" kernels and collectives)
# Each job runs twice: a job whose two runs differ is reported (its hash is not a fingerprint).
set -uo pipefail
build=$(cd "${1:?usage: bitwise_jobs.sh BUILD_DIR [JOB...]}" && pwd); shift
root=$(cd "$(dirname "$0")/../.." && pwd)
jobs=("$@"); [ ${#jobs[@]} -gt 0 ] || jobs=(zero1 nozero1 fp16 pause overlap sim)
tmp=$(mktemp -d /tmp/ddp-bitwise.XXXXXX)
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
export DDP_WORKER=$build/worker/ddp-worker DDP_LOG_LEVEL=warn
export LD_LIBRARY_PATH=$build/tests/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
. "$root/tests/corpus.sh"
fox_corpus "$build/worker/ddp-prep" "$tmp" 4000 --val-fraction 0.1
cat >"$tmp/job.yaml" <<YAML
name: bitwise
model: {preset: gpt2-tiny}
data: {train: "$tmp/data/train_*.bin", val: "$tmp/data/val_*.bin"}
train: {steps: 24, micro_batch: 2, seq_len: 32, global_batch_tokens: 512, lr: 1.0e-3, warmup: 2,
        val_every: 8, val_batches: 2, sample_tokens: 0, threads: 1, log_every: 1,
        precision: fp32}
ddp: {bucket_mb: 0.25, first_bucket_mb: 0.0625, check_every: 4}
YAML
sed 's/^ddp: {/ddp: {workers: 4, min_workers: 4, restart: on-failure, max_restarts: 1, /' \
    "$tmp/job.yaml" >"$tmp/elastic.yaml"
# run NAME N [launch-local options...]: N ranks of $JOB (job.yaml); prints the weights' hash
run() {
    local name=$1 n=$2; shift 2
    RUN_DIR="$tmp/$name" "$root/deploy/launch-local.sh" "$n" "${JOB:-$tmp/job.yaml}" --quiet \
        --dump-weights "$tmp/$name.st" "$@" >"$tmp/$name.log" 2>&1 ||
        { echo "FAILED ($(tail -1 "$tmp/$name.log"))"; return 1; }
    sha256sum "$tmp/$name.st" | cut -c1-16
}
elastic() { # NAME MODE: rank 2 of 4 hangs as step 8 begins, is killed there and replaced
    local name=$1 mode=$2 deadline=$((SECONDS + 120))
    DDP_TEST_HANG=8:2 JOB=$tmp/elastic.yaml run "$name" 4 --set ddp.state_transfer="$mode" \
        >"$tmp/$name.hash" &
    local pid=$!
    until grep -q "hangs as step 8 begins" "$tmp/$name/rank-2.log" 2>/dev/null; do
        [ $SECONDS -ge $deadline ] && break
        sleep 0.05
    done
    kill -KILL "$(cat "$tmp/$name/rank-2.pid")" 2>/dev/null
    wait "$pid"
    cat "$tmp/$name.hash"
}
for j in "${jobs[@]}"; do
    for try in a b; do
        case $j in
            zero1) h=$(run "$j$try" 2 --set ddp.shard_optimizer=true) ;;
            nozero1) h=$(run "$j$try" 2 --set ddp.shard_optimizer=false) ;;
            fp16) h=$(run "$j$try" 2 --set train.precision=fp16) ;;
            pause|overlap) h=$(elastic "$j$try" "$j") ;;
            sim) h=$(run "$j$try" 2 --backend sim --set ddp.shard_optimizer=false) ;;
            *) echo "unknown job $j" >&2; exit 2 ;;
        esac
        eval "h_$try=\$h"
    done
    [ "$h_a" = "$h_b" ] && echo "$j $h_a" || echo "$j NOT REPRODUCIBLE: $h_a $h_b"
done
