#!/usr/bin/env bash
# The bytes each rank sends with ddp.grad_dtype fp32 and bf16 (not pass/fail, not in CI): 2 ranks
# of gpt2-mini over the ring forced onto TCP (DDP_COLL_TRANSPORT=tcp), each job alone in a network
# namespace of its own (unshare -rn: a private loopback), so /proc/net/dev's lo counters hold
# only its bytes: the gradient buckets, the embedding slots, the vote, the replica checks and the
# rendezvous and the start (rank 0's weights). Each job runs 2 and 2 + STEPS steps: the difference
# is what STEPS steps send. Prints the bytes per rank and step, and bf16's share of fp32's.
#   tests/bench/grad_bytes.sh BUILD_DIR [STEPS (4)] [ddp-worker options, e.g. --set ...]
set -uo pipefail
build=$(cd "${1:?usage: grad_bytes.sh BUILD_DIR [STEPS]}" && pwd); shift
steps=${1:-4}; shift || true
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d /tmp/ddp-grad-bytes.XXXXXX)
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
. "$root/tests/corpus.sh"
fox_corpus "$build/worker/ddp-prep" "$tmp" 4000 --val-fraction 0.1
cat >"$tmp/job.yaml" <<YAML
name: grad-bytes
model: {preset: gpt2-mini}
data: {train: "$tmp/data/train_*.bin", val: "$tmp/data/val_*.bin"}
train: {steps: 2, micro_batch: 1, seq_len: 32, global_batch_tokens: 64, lr: 1.0e-3,
        warmup: 1, val_every: 0, sample_tokens: 0, threads: 1, log_every: 1, precision: fp32}
ddp: {check_every: 0, shard_optimizer: false}
YAML
# tx DTYPE N [options]: loopback bytes sent by a job of N steps (both ranks), in its namespace
tx() {
    unshare -rn bash -c '
        ip link set lo up || exit 1
        before=$(awk "/^ *lo:/ {print \$10}" /proc/net/dev)
        DDP_COLL_TRANSPORT=tcp DDP_LOG_LEVEL=warn DDP_WORKER="$1/worker/ddp-worker" RUN_DIR="$2/run-$3" \
            "$4/deploy/launch-local.sh" 2 "$2/job.yaml" --quiet --set ddp.grad_dtype="$3" "${@:5}" \
            >"$2/$3.log" 2>&1 || { echo "FAILED: $(tail -2 "$2/$3.log")" >&2; exit 1; }
        after=$(awk "/^ *lo:/ {print \$10}" /proc/net/dev)
        echo $((after - before))' _ "$build" "$tmp" "$1" "$root" --set train.steps="$2" "${@:3}"
}
# per DTYPE: the bytes of `steps` steps (the difference of two jobs)
per() { local a z; a=$(tx "$1" 2 "${@:2}") && z=$(tx "$1" $((2 + steps)) "${@:2}") && echo $((z - a)); }
f=$(per fp32 "$@") && b=$(per bf16 "$@") || exit 1
awk -v f="$f" -v b="$b" -v s="$steps" 'BEGIN {
    printf "fp32: %d bytes sent (%.0f per rank and step)\n", f, f / 2 / s
    printf "bf16: %d bytes sent (%.0f per rank and step), %.3f of fp32\n", b, b / 2 / s, b / f }'
