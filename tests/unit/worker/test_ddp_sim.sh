#!/usr/bin/env bash
# The GPU path on the simulated device (TAP): 2 ranks with the "sim" kernel backend (simulated
# device memory, ops queued on stream threads) and the "sim" collectives backend (nccl.c over a
# simulated CUDA runtime and NCCL), with gradient accumulation, validation, the replica check and
# checkpoints, must give the CPU backend's weights bitwise and report no hazard or misuse. This
# is what fails when the compute stream and NCCL's are not ordered (issue 24, finding 1), when a
# host buffer reaches NCCL (finding 2) or when NCCL runs on another device than the rank's
# (finding 3): see docs/gpu.md.
#   test_ddp_sim.sh DDP_WORKER DDP_PREP
set -uo pipefail
worker=$1 prep=$2
here=$(cd "$(dirname "$0")" && pwd)
root=${DDP_SOURCE_ROOT:-$here/../../..}
launch="$root/deploy/launch-local.sh"
compare="$here/compare_weights.py"
tmp=$(mktemp -d /tmp/ddp-test-sim.XXXXXX)
trap '[ -n "${KEEP_TMP:-}" ] || rm -rf "$tmp"' EXIT
export DDP_WORKER=$worker DDP_LOG_LEVEL=warn

. "$(dirname "$0")/../../tap.sh"
. "$(dirname "$0")/../../corpus.sh"

fox_corpus "$prep" "$tmp" 4000 --val-fraction 0.1
# fp32 (bf16 below): auto would pick bf16 on the CPU with AVX512_BF16 and fp32 on the sim, whose
# precision_native says no: the runs name their precision
cat >"$tmp/job.yaml" <<YAML
name: sim-test
model: {preset: gpt2-tiny}
data: {train: "$tmp/data/train_*.bin", val: "$tmp/data/val_*.bin"}
train: {steps: 4, micro_batch: 2, seq_len: 32, lr: 1.0e-3, warmup: 2, val_every: 2,
        val_batches: 4, sample_tokens: 0, threads: 1, global_batch_tokens: 256, precision: fp32}
ddp: {bucket_mb: 0.25, first_bucket_mb: 0.0625, check_every: 2, shard_optimizer: false}
YAML
run2() { # name backend [options]: RANKS (2) ranks of JOB (job.yaml), weights in $tmp/name.st,
        # logs in $tmp/name/ (LOUD=1: not --quiet)
  local name=$1 backend=$2 quiet=(--quiet); shift 2
  [ -n "${LOUD:-}" ] && quiet=()
  RUN_DIR="$tmp/$name" "$launch" "${RANKS:-2}" "${JOB:-$tmp/job.yaml}" "${quiet[@]}" --backend "$backend" \
    --dump-weights "$tmp/$name.st" "$@" >"$tmp/$name.launch" 2>&1 ||
    { sed 's/^/# /' "$tmp/$name.launch" "$tmp/$name"/rank-*.log | tail -30; return 1; }
}
clean() { # name: no hazard, no NCCL misuse, no error in the ranks' logs (a 1-rank run has none)
  local logs=("$tmp/$1.launch") r
  for r in "$tmp/$1"/rank-*.log; do [ -e "$r" ] && logs+=("$r"); done
  ! grep -h "hazard\|violation\|error" "${logs[@]}"
}

echo "1..29"
# 2 ranks x 2 accumulation steps, on the CPU and on the simulated GPU: bitwise equal
run2 cpu cpu && run2 sim sim &&
  check "2 sim ranks with accumulation give the CPU backend's weights bitwise" python3 "$compare" "$tmp/cpu.st" "$tmp/sim.st" --bitwise ||
  not_ok "2-rank runs on cpu and sim"
check "the sim run reports no hazard, misuse or error" clean sim
# bf16 (16-bit activations, products of bf16): the simulated GPU runs the CPU backend's ops on
# the same types, so its weights are still the CPU's bitwise, with accumulation and no hazard
run2 cpu16 cpu --set train.precision=\"bf16\" && run2 sim16 sim --set train.precision=\"bf16\" &&
  check "bf16: 2 sim ranks with accumulation give the CPU backend's weights bitwise" python3 "$compare" "$tmp/cpu16.st" "$tmp/sim16.st" --bitwise ||
  not_ok "2-rank bf16 runs on cpu and sim"
check "the bf16 sim run reports no hazard, misuse or error" clean sim16
# the ring over device memory (two ranks on one GPU, which NCCL refuses): every collective's
# device buffer is staged through host memory (copied out at submit, back at the wait); the
# weights are the CPU's bitwise, with and without the sharded optimizer step (reduce-scatter
# and all-gather of slices over staged buffers)
run2 simring sim --set ddp.backend=\"ring\" &&
  check "2 sim ranks over the ring, device buffers staged: the CPU backend's weights bitwise" python3 "$compare" "$tmp/cpu.st" "$tmp/simring.st" --bitwise ||
  not_ok "2-rank run on sim over the ring"
check "the ring-over-sim run reports no hazard, misuse or error" clean simring
run2 zsimring sim --set ddp.backend=\"ring\" --set ddp.shard_optimizer=true &&
  check "2 sim ranks over the ring, sharded optimizer step: the same weights bitwise" python3 "$compare" "$tmp/cpu.st" "$tmp/zsimring.st" --bitwise ||
  not_ok "sharded 2-rank run on sim over the ring"
# the Llama family (RMSNorm, RoPE, SwiGLU, grouped-query attention) in fp32 and bf16: the sim
# gives the CPU's weights bitwise, with accumulation and no hazard
for p in fp32 bf16; do
  run2 llcpu$p cpu --set model.preset=llama-tiny --set train.precision=\"$p\" &&
    run2 llsim$p sim --set model.preset=llama-tiny --set train.precision=\"$p\" &&
    check "llama-tiny $p: 2 sim ranks with accumulation give the CPU backend's weights bitwise" python3 "$compare" "$tmp/llcpu$p.st" "$tmp/llsim$p.st" --bitwise ||
    not_ok "llama-tiny $p 2-rank runs on cpu and sim"
  check "the llama-tiny $p sim run reports no hazard, misuse or error" clean llsim$p
done
# every op delayed on its stream thread: the same weights (ordering, not luck)
DDP_SIM_DELAY_US=300 run2 simslow sim && check "ops delayed by 300 us: the same weights" cmp "$tmp/sim.st" "$tmp/simslow.st" ||
  not_ok "2-rank run with delayed ops"
# checkpoints on the simulated device: stopped at step 2 and resumed, the same weights
cat >>"$tmp/job.yaml" <<YAML
checkpoint: {dir: "$tmp/ckpt", every: 2, keep_last: 2}
YAML
run2 simstop sim --stop-at-step 2 && run2 simres sim &&
  check "a sim run checkpointed at step 2 and resumed gives the same weights" cmp "$tmp/sim.st" "$tmp/simres.st" ||
  not_ok "checkpoint and resume on sim"
check "the checkpointed runs report no hazard, misuse or error" clean simres
# one rank of one thread leaves a core idle: the step-2 save's device-to-host copy runs on the
# checkpoint helper thread beside step 3, on its own context (the sim refuses a context used by
# two threads, the race a GPU would have on the context's error and stream)
sed "s|$tmp/ckpt\"|$tmp/ckpt1\"|" "$tmp/job.yaml" >"$tmp/job1.yaml"
JOB="$tmp/job1.yaml" RANKS=1 run2 simhelper sim && check "a save on the helper thread: no second thread on a context, no hazard" clean simhelper ||
  not_ok "1-rank checkpointed run on sim"
check "the helper thread saved step 2" test -f "$tmp/ckpt1/step-00000002/MANIFEST.json"
# the replica check (host tables through NCCL) still names a drifted replica on the sim
if DDP_TEST_REPLICA_FLIP_RANK=1 run2 simflip sim --no-resume >/dev/null; then
  not_ok "a drifted replica stops the sim job"
else
  check "a drifted replica stops the sim job naming rank 1" grep -q "replicas differ: rank(s) 1 " "$tmp/simflip.launch" "$tmp/simflip"/rank-*.log
fi
# ZeRO-1 over NCCL on the simulated GPU (ddp.shard_optimizer): each bucket reduce-scattered
# (ncclReduceScatter where the slices are equal, else one ncclReduce per slice), this rank's
# slices updated, the parameters all-gathered; between saves the moment arenas are committed in
# this rank's slices only (an op touching the rest would be a hazard). 2 ranks sum in one order
# whatever the collective, so the unsharded weights come out bitwise.
sed -e '/^checkpoint:/d' -e 's/shard_optimizer: false}/shard_optimizer: true}/' "$tmp/job.yaml" >"$tmp/zjob.yaml"
LOUD=1 DDP_LOG_LEVEL=info JOB=$tmp/zjob.yaml run2 zsim sim &&
  check "2 sim ranks, sharded optimizer over NCCL: the unsharded weights bitwise" cmp "$tmp/sim.st" "$tmp/zsim.st" ||
  not_ok "sharded 2-rank run on sim"
# the moments' pages resident after step 1 (mincore; the simulator gives decommitted granules
# back): this rank's half and the 64 KiB granules around its slices' edges, under 60%
sharded_clean() { # run: says it is sharded, its moments' residency, no hazard / misuse / error
  grep -q "optimizer step sharded" "$1.launch" || return 1
  sed -nE 's/.*moments resident after step 1: ([0-9.]+) MiB of ([0-9.]+) MiB.*/\1 \2/p' "$1.launch" |
    awk '{print "# resident " $1 " of " $2 " MiB"; ok = $1 <= 0.6 * $2} END {exit !ok}' || return 1
  ! grep -h "hazard\|violation\|error" "$1.launch" "$1"/rank-*.log
}
check "the sharded run says so, keeps under 60% of the moments resident, reports no hazard" \
  sharded_clean "$tmp/zsim"
# checkpoints gather the moments (committed first) and a resume loads them whole
sed -e 's/shard_optimizer: false}/shard_optimizer: true}/' -e "s|$tmp/ckpt|$tmp/zckpt|" "$tmp/job.yaml" >"$tmp/zjobc.yaml"
sed "s|$tmp/zckpt|$tmp/zckpt1|" "$tmp/zjobc.yaml" >"$tmp/zjobc1.yaml"
if LOUD=1 DDP_LOG_LEVEL=info JOB=$tmp/zjobc.yaml run2 zstop sim --stop-at-step 2 &&
   cp -r "$tmp/zckpt" "$tmp/zckpt1" && JOB=$tmp/zjobc.yaml run2 zres sim; then
  check "sharded on sim, checkpointed at step 2 and resumed: the same weights" cmp "$tmp/zsim.st" "$tmp/zres.st"
  # committed whole at start (a resume would load them whole), the foreign slices go after step 1
  check "with checkpoints too, under 60% of the moments stay resident after step 1, no hazard" \
    sharded_clean "$tmp/zstop"
  # the gathered moments resume on 1 rank x 4 micro-steps (summed in another order)
  "$worker" "$tmp/zjobc1.yaml" --quiet --backend cpu --resume-step 2 --dump-weights "$tmp/z1cpu.st" \
    >"$tmp/z1cpu.log" 2>&1
  check "the sharded checkpoint of step 2 resumed on 1 CPU rank: the same weights within 1e-5" \
    python3 "$compare" "$tmp/zsim.st" "$tmp/z1cpu.st" --rel 1e-5
else
  not_ok "sharded checkpoint and resume on sim"; not_ok "moments resident with checkpoints"
  not_ok "sharded checkpoint resumed on 1 CPU rank"
fi
# 3 ranks: uneven slices (grouped ncclReduce / ncclBroadcast), a sum order of NCCL's own
sed '/^checkpoint:/d' "$tmp/job.yaml" >"$tmp/njob.yaml"
RANKS=3 JOB=$tmp/njob.yaml run2 sim3 sim --set train.global_batch_tokens=384 &&
  RANKS=3 JOB=$tmp/zjob.yaml run2 zsim3 sim --set train.global_batch_tokens=384 &&
  check "3 sim ranks, sharded: the unsharded 3-rank weights within 1e-6" python3 "$compare" "$tmp/sim3.st" "$tmp/zsim3.st" --rel 1e-6 ||
  not_ok "3-rank runs on sim, sharded and not"
# elastic on the simulated GPU, 3 ranks: rank 1 is killed after step 3, restarted, and rejoins;
# the coordinator's thread revokes the sim communicator, ranks 0 and 2 shrink it into theirs
# (ncclCommShrink) and redo the step; the joiner comes back in a communicator formed afresh, the
# source broadcasts its counters (a host header) and sends its device arenas to the joiner in
# chunked NCCL broadcasts during the next step, which the other two compute (in another order
# than the CPU run's 2-rank ring: the last bits differ); the replicas are checked, and the
# weights are the uninterrupted CPU run's within 1e-5
sed -e '/^checkpoint:/d' -e 's/steps: 4,/steps: 12,/' -e 's/val_every: 2,/val_every: 0,/' \
    -e 's/shard_optimizer: false}/shard_optimizer: false, restart: on-failure, max_restarts: 2, state_transfer: overlap}/' \
    "$tmp/job.yaml" >"$tmp/ejob.yaml"
RUN_DIR="$tmp/ecpu" "$launch" 2 "$tmp/ejob.yaml" --quiet --backend cpu --dump-weights "$tmp/ecpu.st" \
  >"$tmp/ecpu.launch" 2>&1 || { not_ok "elastic run on the CPU"; sed 's/^/# /' "$tmp/ecpu.launch" | tail; }
# (bounded: a generation that fails the same way each time would be re-formed for ever)
( DDP_LOG_LEVEL=info DDP_SIM_DELAY_US=2000 RUN_DIR="$tmp/esim" timeout 100 "$launch" 3 "$tmp/ejob.yaml" \
    --backend sim --dump-weights "$tmp/esim.st" >"$tmp/esim.launch" 2>&1 ) &
elaunch=$!
deadline=$((SECONDS + 60))  # rank 0 logs to the launcher's output: wait for its step 3
until grep -q "step     3/" "$tmp/esim.launch" 2>/dev/null || [ $SECONDS -ge $deadline ]; do sleep 0.1; done
kill -9 "$(cat "$tmp/esim/rank-1.pid")" 2>/dev/null
wait $elaunch
check "elastic on sim: rank 1 killed after step 3 rejoins and gets the state of step 3" \
  grep -q "state of step [3-9] from rank 0" "$tmp/esim.launch"
check "elastic on sim: the survivors shrank the failed generation's communicator" \
  grep -q "generation [0-9]*: rank 1 of 2 (was 3 ranks).*its communicator the last one shrunk" \
  "$tmp/esim/rank-2.log"
check "elastic on sim with a rank killed gives the uninterrupted CPU run's weights" \
  python3 "$compare" "$tmp/ecpu.st" "$tmp/esim.st" --rel 1e-5
check "elastic on sim: the joiner received its state during rank 0's step, not before it" \
  grep -q "received while the other ranks computed step" "$tmp/esim.launch" "$tmp/esim/rank-1.log"
check "elastic on sim: no stream hazard or NCCL misuse while the state travels" \
  bash -c '! grep -h "hazard\|violation" "$0.launch" "$0"/rank-*.log' "$tmp/esim"
# the NCCL module is found beside ddp-worker (without DDP_COLL_PATH): here, without a GPU, it
# loads and says it is not usable, rather than not found
if [ -f "${DDP_BUILD_ROOT:-$(dirname "$worker")/..}/collectives/ddp_coll_nccl.so" ]; then
  if RUN_DIR="$tmp/nccl" env -u DDP_COLL_PATH timeout 60 "$launch" 2 "$tmp/ejob.yaml" --quiet \
       --backend cpu --set ddp.backend=nccl --set ddp.restart=never >"$tmp/nccl.launch" 2>&1; then
    ok "nccl on this host: a GPU is present # SKIP the module ran"
  else
    check "ddp_coll_nccl.so is found beside ddp-worker" \
      grep -q "backend 'nccl' is not usable here" "$tmp/nccl.launch" "$tmp/nccl"/rank-*.log
  fi
else
  skip "nccl module beside ddp-worker" "built without NCCL"
fi
exit $((TAP_FAILED > 0))
