#!/usr/bin/env bash
# ZeRO-1 across "hosts" (TAP): ranks in two network namespaces joined by a veth pair, so the
# ring runs over TCP between them. With 2, 3 and 4 ranks (4: two in each namespace, so the
# all-reduce, reduce-scatter and all-gather run in two levels), ddp.shard_optimizer (reduce-scatter
# the gradients, update this rank's slices, all-gather the parameters) gives the unsharded run's
# weights and checkpoint bitwise, and each rank holds only its slices of the optimizer's moments
# (measured page by page by the worker). A sharded 3-rank checkpoint resumes on 2 ranks.
# Skips (77) where namespaces cannot be made.
#   test_zero_netns.sh DDP_WORKER DDP_PREP
set -uo pipefail
worker=$1 prep=$2
[ "$(id -u)" = 0 ] || { echo "1..0 # SKIP needs root for network namespaces"; exit 77; }
tmp=$(mktemp -d /tmp/ddp-test-zero.XXXXXX)
sfx=$$
NA=ddpz-a-$sfx NB=ddpz-b-$sfx
net=$((sfx % 200 + 20))
A=10.78.$net.1 B=10.78.$net.2
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  ip netns del "$NA" 2>/dev/null
  ip netns del "$NB" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
. "$(dirname "$0")/../../netns_pair.sh"
netns_pair "$NA" "$NB" "z$sfx" "$A" "$B" ||
    { echo "1..0 # SKIP cannot create network namespaces"; exit 77; }

. "$(dirname "$0")/../../tap.sh"
. "$(dirname "$0")/../../corpus.sh"

cd "$tmp"
fox_corpus "$prep" . 4000 || { not_ok "ddp-prep made the training shards"; tap_plan; exit 1; }
# buckets of 6 x 16384 floats: every rank's slice has the same number of 16384-float blocks
cat >job.yaml <<YAML
name: zero-netns
model: {preset: gpt2-tiny}
data: {train: $tmp/data/train_*.bin}
train: {steps: 12, micro_batch: 2, seq_len: 32, global_batch_tokens: 384, lr: 1e-3, warmup: 2,
        seed: 3, threads: 1, sample_tokens: 0}
ddp: {bucket_mb: 0.375, first_bucket_mb: 0.375, check_every: 4}
checkpoint: {dir: $tmp/ck, every: 6, keep_last: 0}
YAML

# run NAME WORLD [worker options...]: ranks alternate between the namespaces (rank 0 in A, 1 in
# B, 2 in A), so every link but 2 -> 0 crosses the veth; logs in NAME/rank-R.log
run() {
  local name=$1 world=$2; shift 2
  local port=$((20000 + RANDOM % 20000)) r rc=0 ps=()
  mkdir -p "$name"
  for ((r = 0; r < world; r++)); do
    local ns=$NA; [ $((r % 2)) = 1 ] && ns=$NB
    ip netns exec "$ns" env DDP_RANK=$r DDP_WORLD_SIZE=$world DDP_LOCAL_RANK=$((r / 2)) \
      DDP_LOCAL_WORLD_SIZE=$(((world + 1 - r % 2) / 2)) DDP_RDZV=$A:$port \
      DDP_JOB_TOKEN=zero-$sfx DDP_RUN_DIR="$tmp/$name" DDP_LOG_LEVEL=info \
      "$worker" job.yaml "$@" >"$name/rank-$r.log" 2>&1 &
    ps+=($!); pids+=($!)
  done
  for p in "${ps[@]}"; do wait "$p" || rc=1; done
  [ $rc = 0 ] || tail -n 5 "$name"/rank-*.log | sed 's/^/# /'
  return $rc
}
# resident KiB of the moments after step 1, per rank, summed or of one rank
resident() { grep -h 'moments resident after step 1' "$@" | grep -o '([0-9]* KiB)' | tr -dc '0-9\n'; }
sum() { awk '{ s += $1 } END { print s + 0 }'; }

echo "1..13"
for world in 2 3 4; do
  batch=(); [ $world = 4 ] && batch=(--set train.global_batch_tokens=512) # 384 needs 1, 2, 3, 6
  run s$world $world "${batch[@]}" --set checkpoint.dir=\"$tmp/ck-s$world\" \
      --dump-weights s$world.st &&
    run u$world $world "${batch[@]}" --set ddp.shard_optimizer=false \
      --set checkpoint.dir=\"$tmp/ck-u$world\" --dump-weights u$world.st ||
    { not_ok "$world ranks across two namespaces trained"; continue; }
  algo="flat ring"; [ $world = 4 ] && algo="two-level (2 hosts x 2 ranks)"
  check "$world ranks: the step is sharded, the ring crosses hosts over TCP, all-reduce $algo" \
    bash -c "grep -q 'optimizer step sharded' s$world/rank-0.log &&
             grep -q 'ring to the next rank over tcp, all-reduce $algo' s$world/rank-1.log"
  check "$world ranks over TCP: sharded weights == unsharded, bitwise" cmp s$world.st u$world.st
  check "$world ranks over TCP: the sharded run's checkpoint of step 6 == the unsharded one's" \
    bash -c "cmp ck-s$world/step-00000006/optim.safetensors ck-u$world/step-00000006/optim.safetensors &&
             cmp ck-s$world/step-00000006/model.safetensors ck-u$world/step-00000006/model.safetensors"
  # each rank touches only its slices: the ranks' moments add up to one copy, and no rank holds
  # more than its share and a block (the unsharded ranks hold a copy each)
  whole=$(resident u$world/rank-0.log)
  total=$(resident s$world/rank-*.log | sum)
  most=$(resident s$world/rank-*.log | sort -n | tail -1)
  echo "# $world ranks: moments resident per rank $(resident s$world/rank-*.log | tr '\n' ' ')KiB sharded, $whole KiB unsharded"
  check "$world ranks: each rank keeps its slices of the moments, together one copy" \
    test -n "$whole" -a "$total" -le $((whole * 11 / 10)) -a "$most" -le $((whole / world + whole / 8))
done

# the 3-rank sharded checkpoint of step 6 resumed on 2 ranks (sharded) == the unsharded one's
rm -rf r2s r2u
run r2s 2 --resume-step 6 --set checkpoint.dir=\"$tmp/ck-s3\" --set checkpoint.every=0 \
  --dump-weights r2s.st &&
  run r2u 2 --resume-step 6 --set checkpoint.dir=\"$tmp/ck-u3\" --set checkpoint.every=0 \
    --set ddp.shard_optimizer=false --dump-weights r2u.st &&
  check "a sharded 3-rank checkpoint resumes on 2 sharded ranks: the unsharded resume's weights" \
    bash -c "grep -q 'resumed from .*step-00000006' r2s/rank-0.log && cmp r2s.st r2u.st" ||
  not_ok "resume of the 3-rank checkpoint on 2 ranks"
exit $((TAP_FAILED > 0))
