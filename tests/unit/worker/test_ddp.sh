#!/usr/bin/env bash
# Multi-rank training with real processes (TAP): equivalence of ranks and accumulation,
# bitwise determinism, the world-size refusal message, a replica mismatch named, and mpirun;
# the Llama family (llama-tiny) through the same equivalences: ranks, the sharded optimizer
# step and recomputation.
#   test_ddp.sh DDP_WORKER DDP_PREP
set -uo pipefail
worker=$1 prep=$2
here=$(cd "$(dirname "$0")" && pwd)
root=${DDP_SOURCE_ROOT:-$here/../../..}
launch="$root/deploy/launch-local.sh"
compare="$here/compare_weights.py"
tmp=$(mktemp -d /tmp/ddp-test-ddp.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
export DDP_WORKER=$worker DDP_LOG_LEVEL=warn

. "$(dirname "$0")/../../tap.sh"
. "$(dirname "$0")/../../corpus.sh"

# data: a deterministic text of ~200 KB
fox_corpus "$prep" "$tmp" 4000 --val-fraction 0.1
cat >"$tmp/job.yaml" <<YAML
name: ddp-test
model: {preset: gpt2-tiny}
data: {train: "$tmp/data/train_*.bin", val: "$tmp/data/val_*.bin"}
train: {steps: 10, micro_batch: 2, seq_len: 32, lr: 1.0e-3, warmup: 2, val_every: 0,
        sample_tokens: 0, threads: 1}
ddp: {bucket_mb: 0.25, first_bucket_mb: 0.0625, check_every: 5}
YAML
run1() { # out.safetensors accum-tokens [options]
  local out=$1 gbt=$2; shift 2
  "$worker" "$tmp/job.yaml" --quiet --set train.global_batch_tokens=$gbt --dump-weights "$out" "$@"
}
runN() { # ranks out.safetensors accum-tokens [options]
  local ranks=$1 out=$2 gbt=$3; shift 3
  RUN_DIR="$tmp/run$ranks" "$launch" "$ranks" "$tmp/job.yaml" --quiet \
    --set train.global_batch_tokens=$gbt --dump-weights "$out" "$@" >"$tmp/launch.log" 2>&1 ||
    { cat "$tmp/launch.log" "$tmp"/run$ranks/rank-*.log; return 1; }
}

echo "1..17"
# 1 rank x 2 micro-steps == 2 ranks x 1, bitwise (global batch 2 x 2 x 32 = 128 tokens)
run1 "$tmp/a1.st" 128 && runN 2 "$tmp/a2.st" 128 &&
  check "2 ranks x B equal 1 rank x 2 accumulation steps bitwise" python3 "$compare" "$tmp/a1.st" "$tmp/a2.st" --bitwise ||
  not_ok "2-rank equivalence runs"
# 4 ranks vs 1 rank x 4 accumulation steps, within 1e-6 per tensor
run1 "$tmp/b1.st" 256 && runN 4 "$tmp/b4.st" 256 &&
  check "4 ranks agree with 1 rank x 4 accumulation steps within 1e-6" python3 "$compare" "$tmp/b1.st" "$tmp/b4.st" --rel 1e-6 ||
  not_ok "4-rank equivalence runs"
# two 2-rank runs are bitwise identical
runN 2 "$tmp/a2b.st" 128 &&
  check "two 2-rank runs give identical weights" cmp "$tmp/a2.st" "$tmp/a2b.st" || not_ok "second 2-rank run"
# 20 steps, same seed, twice: bitwise identical (1 rank)
run1 "$tmp/d1.st" 64 --set train.steps=20 && run1 "$tmp/d2.st" 64 --set train.steps=20 &&
  check "two 1-rank runs of 20 steps give identical weights" cmp "$tmp/d1.st" "$tmp/d2.st" || not_ok "determinism runs"
# a different seed gives different weights (the comparison can fail)
run1 "$tmp/d3.st" 64 --set train.steps=20 --set train.seed=7 &&
  check "a different seed gives different weights" bash -c "! cmp -s '$tmp/d1.st' '$tmp/d3.st'" || not_ok "seed run"
# the sharded optimizer step (the default when ranks share memory) and the plain one agree bitwise
DDP_LOG_LEVEL=info RUN_DIR="$tmp/runsh" "$launch" 2 "$tmp/job.yaml" --set train.steps=3 >"$tmp/sh.log" 2>&1 &&
  check "2 local ranks shard the optimizer step by default" grep -q "optimizer step sharded" "$tmp/sh.log" ||
  not_ok "2-rank run of one step"
runN 2 "$tmp/a2u.st" 128 --set ddp.shard_optimizer=false &&
  check "2 ranks: a sharded optimizer step gives the unsharded step's weights bitwise" cmp "$tmp/a2.st" "$tmp/a2u.st" ||
  not_ok "2-rank run without the sharded optimizer step"
# the Llama family: 2 ranks == 1 rank x 2 micro-steps, the sharded step == the plain one, and
# recomputation == none, each bitwise
llama=(--set model.preset=llama-tiny)
run1 "$tmp/l1.st" 128 "${llama[@]}" && runN 2 "$tmp/l2.st" 128 "${llama[@]}" &&
  check "llama-tiny: 2 ranks x B equal 1 rank x 2 accumulation steps bitwise" python3 "$compare" "$tmp/l1.st" "$tmp/l2.st" --bitwise ||
  not_ok "llama-tiny 2-rank equivalence runs"
runN 2 "$tmp/l2u.st" 128 "${llama[@]}" --set ddp.shard_optimizer=false &&
  check "llama-tiny: the sharded optimizer step gives the unsharded step's weights bitwise" cmp "$tmp/l2.st" "$tmp/l2u.st" ||
  not_ok "llama-tiny 2-rank run without the sharded optimizer step"
runN 2 "$tmp/l2r.st" 128 "${llama[@]}" --set train.recompute=block &&
  check "llama-tiny: recomputing each block gives the same weights bitwise" cmp "$tmp/l2.st" "$tmp/l2r.st" ||
  not_ok "llama-tiny 2-rank run with recomputation"
# a world size that cannot split the global batch is refused with the sizes that would
if RUN_DIR="$tmp/run3" "$launch" 3 "$tmp/job.yaml" --set train.global_batch_tokens=256 >"$tmp/w3.log" 2>&1; then
  not_ok "3 ranks cannot split 4 sequences: refused"
else
  check "3 ranks cannot split 4 sequences: refused, naming 1, 2, 4" grep -q "world sizes that divide it: 1, 2, 4" "$tmp/w3.log" "$tmp"/run3/rank-*.log
fi
# a replica that drifts is named with the first differing tensor
if DDP_TEST_REPLICA_FLIP_RANK=1 RUN_DIR="$tmp/run2f" "$launch" 2 "$tmp/job.yaml" >"$tmp/flip.log" 2>&1; then
  not_ok "a drifted replica stops the job"
else
  check "a drifted replica stops the job naming rank 1 and a tensor" grep -q "replicas differ: rank(s) 1 .*first differing tensor wte.weight" "$tmp/flip.log"
fi
# a NaN in a gradient skips that update on every rank and names the tensor; training goes on
if DDP_TEST_NAN_STEP=3 RUN_DIR="$tmp/runnan" "$launch" 2 "$tmp/job.yaml" --set train.global_batch_tokens=128 >"$tmp/nan.log" 2>&1; then
  check "a NaN gradient skips the update, naming the tensor" grep -q "step 3: gradient norm nan, first non-finite tensor h.1.mlp.c_proj.weight: update skipped" "$tmp/nan.log"
else
  not_ok "a NaN gradient skips the update"; sed 's/^/# /' "$tmp/nan.log" | tail -5
fi
# the PyTorch launcher convention (torchrun --no-python, Kubeflow's PyTorchJob): RANK,
# WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and no DDP_* variable give
# the 2-rank run of launch-local.sh, bitwise
torch_env() { # port ranks [options]: ranks ddp-workers with the torchrun variables; waits
  local port=$1 ranks=$2 r rc=0 pids=()
  shift 2
  for ((r = 0; r < ranks; r++)); do
    env RANK=$r WORLD_SIZE=$ranks LOCAL_RANK=$r LOCAL_WORLD_SIZE=$ranks MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=$port "$worker" "$tmp/job.yaml" --quiet --set train.global_batch_tokens=128 \
      "$@" >"$tmp/torch-$r.log" 2>&1 &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r" || rc=1; done
  return $rc
}
tport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
torch_env "$tport" 2 --dump-weights "$tmp/t2.st" &&
  check "2 ranks from torchrun's variables give launch-local's weights bitwise" cmp "$tmp/a2.st" "$tmp/t2.st" ||
  { not_ok "2 ranks from torchrun's variables"; sed 's/^/# /' "$tmp"/torch-*.log | tail -10; }
# ... and a bad one is refused, naming it
if WORLD_SIZE=2 RANK=5 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 "$worker" "$tmp/job.yaml" >"$tmp/tbad.log" 2>&1; then
  not_ok "RANK outside WORLD_SIZE is refused"
else
  check "RANK outside WORLD_SIZE is refused, naming it" grep -q "RANK='5' is not an integer in \[0, 1\]" "$tmp/tbad.log"
fi
# mpirun (deploy/mpirun.sh): 2 ranks from MPI give the same weights as the environment
# rendezvous, over our ring and over MPI_Iallreduce (a sum of two is the same either way)
if command -v mpirun >/dev/null; then
  for backend in ring mpi; do
    ASAN_OPTIONS=detect_leaks=0 "$root/deploy/mpirun.sh" --oversubscribe --mca plm isolated -np 2 \
      "$tmp/job.yaml" --quiet --set train.global_batch_tokens=128 --set ddp.backend=$backend \
      --dump-weights "$tmp/m2-$backend.st" >"$tmp/mpi.log" 2>&1 &&
      check "mpirun -np 2 with the $backend backend gives the env rendezvous's weights" cmp "$tmp/a2.st" "$tmp/m2-$backend.st" ||
      { not_ok "mpirun -np 2 run ($backend)"; sed 's/^/# /' "$tmp/mpi.log" | tail -20; }
  done
else
  for backend in ring mpi; do skip "mpirun $backend" "mpirun not installed"; done
fi
exit $((TAP_FAILED > 0))
