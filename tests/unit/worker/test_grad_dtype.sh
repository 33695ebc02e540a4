#!/usr/bin/env bash
# ddp.grad_dtype: bf16 through the real trainer (TAP). gpt2-tiny on the fox corpus, 2 ranks, fp32
# activations, 2 micro-steps of accumulation per rank:
#  - two bf16 runs give the same weights bitwise, and not fp32's (the buckets were rounded);
#  - ZeRO-1 (reduce-scatter + all-gather) gives the unsharded run's weights bitwise;
#  - the simulated GPU ("sim" kernels and collectives: nccl.c's bf16 all-reduce) gives the CPU's;
#  - a resume may change grad_dtype (fp32 checkpoint, resumed in bf16): allowed and logged;
#  - an elastic job whose replacement rank receives the state during a step (ddp.state_transfer:
#    overlap) completes: the joiner's -0.0 contribution left the holders' bf16 sums exact, or the
#    replica check that ends the transfer would fail the job (the -0.0 itself: test_grad_dtype.c).
#   test_grad_dtype.sh DDP_WORKER DDP_PREP
set -uo pipefail
worker=$1 prep=$2
here=$(cd "$(dirname "$0")" && pwd)
root=${DDP_SOURCE_ROOT:-$here/../../..}
launch="$root/deploy/launch-local.sh"
tmp=$(mktemp -d /tmp/ddp-test-grad-dtype.XXXXXX)
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
export DDP_WORKER=$worker DDP_LOG_LEVEL=warn
export LD_LIBRARY_PATH=$(dirname "$worker")/../tests/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

. "$(dirname "$0")/../../tap.sh"
. "$(dirname "$0")/../../corpus.sh"
. "$(dirname "$0")/../../wait.sh"

fox_corpus "$prep" "$tmp" 4000 --val-fraction 0.1 || skip_all "ddp-prep failed"
cat >"$tmp/job.yaml" <<YAML
name: grad-dtype
model: {preset: gpt2-tiny}
data: {train: "$tmp/data/train_*.bin", val: "$tmp/data/val_*.bin"}
train: {steps: 12, micro_batch: 2, seq_len: 32, global_batch_tokens: 512, lr: 1.0e-3, warmup: 2,
        val_every: 0, sample_tokens: 0, threads: 1, log_every: 1, precision: fp32}
ddp: {bucket_mb: 0.25, first_bucket_mb: 0.0625, check_every: 4, grad_dtype: bf16}
YAML
# run NAME N [options]: N ranks of JOB (job.yaml); weights in $tmp/NAME.st, hash on stdout
run() {
    local name=$1 n=$2
    shift 2
    RUN_DIR="$tmp/$name" "$launch" "$n" "${JOB:-$tmp/job.yaml}" --quiet \
        --dump-weights "$tmp/$name.st" "$@" >"$tmp/$name.log" 2>&1 ||
        { sed 's/^/# /' "$tmp/$name.log" "$tmp/$name"/rank-*.log | tail -20 >&2; return 1; }
    sha256sum "$tmp/$name.st" | cut -c1-16
}
same() { # DESCRIPTION HASH_A HASH_B
    [ -n "$2" ] && [ "$2" = "$3" ] && ok "$1" || not_ok "$1" "got '$2' and '$3'"
}

a=$(run bf16a 2 --set ddp.shard_optimizer=false)
b=$(run bf16b 2 --set ddp.shard_optimizer=false)
same "two bf16 runs give the same weights bitwise" "$a" "$b"
f=$(run fp32 2 --set ddp.shard_optimizer=false --set ddp.grad_dtype=fp32)
[ -n "$a" ] && [ -n "$f" ] && [ "$a" != "$f" ] && ok "bf16 gradients are not fp32's ($a, $f)" ||
    not_ok "bf16 gradients are not fp32's" "bf16 '$a', fp32 '$f'"
z=$(run zero1 2 --set ddp.shard_optimizer=true)
same "bf16: ZeRO-1 gives the unsharded weights bitwise" "$a" "$z"
if [ -e "$(dirname "$worker")/../tests/sim/ddp_coll_sim.so" ]; then
    s=$(run sim 2 --backend sim --set ddp.shard_optimizer=false)
    same "bf16: the simulated GPU (nccl.c, ncclBfloat16) gives the CPU's weights bitwise" "$a" "$s"
else
    skip "bf16 on the simulated GPU" "tests/sim not built"
fi

# a resume that changes grad_dtype: 6 fp32 steps saved, resumed to 12 in bf16
ck="$tmp/ckpt"
r1=$(run resume1 2 --set ddp.grad_dtype=fp32 --set train.steps=6 --set checkpoint.dir="$ck")
r2=$(DDP_LOG_LEVEL=info run resume2 2 --set checkpoint.dir="$ck" --set ddp.shard_optimizer=false \
    --set train.allow_schedule_change=true)
if [ -n "$r1" ] && [ -n "$r2" ] && grep -q "ddp.grad_dtype: resumed at step 6 .* in bf16, the checkpoint's run in fp32" \
    "$tmp/resume2.log" "$tmp/resume2"/rank-*.log 2>/dev/null; then
    ok "a resume may change ddp.grad_dtype (fp32 -> bf16), and says so"
else
    not_ok "a resume may change ddp.grad_dtype (fp32 -> bf16), and says so" \
        "$(cat "$tmp/resume2.log" 2>/dev/null | tail -5)"
fi

# elastic, overlapped state transfer: rank 2 of 4 hangs as step 8 begins and is replaced
sed 's/^ddp: {/ddp: {workers: 4, min_workers: 4, restart: on-failure, max_restarts: 1, state_transfer: overlap, /' \
    "$tmp/job.yaml" >"$tmp/elastic.yaml"
DDP_LOG_LEVEL=info DDP_TEST_HANG=8:2 JOB=$tmp/elastic.yaml run overlap 4 >"$tmp/overlap.hash" &
pid=$!
wait_until 120 grep -q "hangs as step 8 begins" "$tmp/overlap/rank-2.log"
kill -KILL "$(cat "$tmp/overlap/rank-2.pid" 2>/dev/null)" 2>/dev/null
wait "$pid"
if [ -s "$tmp/overlap.hash" ] &&
    grep -q "received while the other ranks computed step" "$tmp/overlap"/rank-*.log; then
    ok "bf16: a joiner receiving the state during a step ends with the holders' weights"
else
    not_ok "bf16: a joiner receiving the state during a step ends with the holders' weights" \
        "$(tail -5 "$tmp/overlap.log")" "$(grep -h "error\|replica" "$tmp/overlap"/rank-*.log | tail -5)"
fi

tap_plan
exit $((TAP_FAILED > 0))
