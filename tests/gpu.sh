#!/usr/bin/env bash
# Everything a lent GPU machine should check, in one command, in under 10 minutes:
#   1. build with -Dcuda=enabled for this GPU's architecture (nvidia-smi compute_cap)
#   2. ddp-worker --selftest (every CUDA op against the CPU op) with TF32 off
#   3. compute-sanitizer memcheck on the self-test (when compute-sanitizer is installed), and
#      racecheck (shared-memory races: the flash attention kernels) on 2 bf16 gpt2-mini steps
#   4. gpt2-mini and gpt2-124M, 20 steps each, fp32 on the GPU against the CPU's losses
#   5. bf16 (the default precision) on the GPU: tokens/s and memory; train.recompute block gives
#      the weights of none, bitwise, in less GPU memory; the memory budget against the peaks;
#      the per-op profile (train.profile) of 3 gpt2-124M steps at 8 x 1024 in bf16 and fp32;
#      20 bf16 steps of gpt2-124M twice (weights bitwise equal) and against the CPU's bf16 losses
#      (within 0.1%, or no further from the CPU's fp32 losses than twice the CPU's bf16 is)
#   6. NCCL all-reduce, reduce-scatter and all-gather through the project's nccl backend: 1 rank,
#      and 2 on a 2-GPU machine; on one GPU, 2 ranks over the ring (device buffers staged through
#      the host) against 1 rank x 2 micro-steps, bitwise, ZeRO-1 too, and NCCL refused by name
#      (then also 2-rank NCCL training against 1 GPU with the same global batch, and ZeRO-1
#      against the unsharded step, bitwise)
#   7. on 2 GPUs, the elastic NCCL abort-and-rebuild test (tests/gpu/elastic_abort.sh: a rank
#      killed, restarted, rejoining; the uninterrupted run's weights within 1e-5)
# and one summary at the end. Exit 0 when nothing failed, 1 otherwise, 77 when there is no GPU.
#
#   tests/gpu.sh [BUILD_DIR]          default build-gpu; OUT=<dir> keeps the logs (default a
#                                     temporary directory, printed at the end)
#   GPU_SH_PREBUILT=1                 BUILD_DIR was built elsewhere (meson -Dcuda=enabled
#                                     -Dgpu_arch=<cap>) for a GPU machine without the -dev
#                                     packages: step 1 only checks that its programs load
#   GPU_SH_MEMCHECK_S=<seconds>       limit for step 3 (default 240)
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
. "$src/tests/gpu/lib.sh"
bdir=${1:-$src/build-gpu}
t_start=$SECONDS

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "tests/gpu.sh: SKIP: no NVIDIA GPU here (nvidia-smi missing or lists no GPU)"
    exit 77
fi
ngpu=$(nvidia-smi -L | grep -c '^GPU ')
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
out=${OUT:-$(mktemp -d /tmp/ddp-gpu.XXXXXX)}
mkdir -p "$out"
export NVIDIA_TF32_OVERRIDE=0 # no TF32 in cuBLAS: the GPU must match the CPU's fp32
export DDP_COLL_PATH=$bdir/collectives

results=()
failed=0
res() { # PASS|FAIL|SKIP name detail
    results+=("$(printf '%-4s  %-34s %s' "$1" "$2" "$3")")
    [ "$1" = FAIL ] && failed=1
    echo "== $1 $2: $3"
}
secs() { echo "$(($SECONDS - $1)) s"; }

echo "== $gpu_name x $ngpu, compute capability $cap; logs in $out"

# 1. build (or, prebuilt, check that the programs find every library they link)
t=$SECONDS
if [ "${GPU_SH_PREBUILT:-0}" = 1 ]; then
    missing=$(ldd "$bdir/worker/ddp-worker" "$bdir/worker/ddp_kernels_cuda.so" \
        "$bdir/collectives/ddp_coll_nccl.so" 2>&1 | grep 'not found' | sort -u)
    if [ -z "$missing" ] && [ -f "$bdir/worker/ddp_kernels_cuda.so" ]; then
        res PASS build "prebuilt $bdir, every linked library found"
    else
        echo "$missing"
        res FAIL build "prebuilt $bdir: ddp_kernels_cuda.so missing or libraries not found"
        printf '%s\n' "${results[@]}"
        exit 1
    fi
elif { [ -f "$bdir/build.ninja" ] ||
     meson setup "$bdir" -Dcuda=enabled -Dgpu_arch="$cap" -Dbuildtype=release \
         -Dwerror=false >"$out/setup.log" 2>&1; } &&
   meson configure "$bdir" -Dcuda=enabled -Dgpu_arch="$cap" >>"$out/setup.log" 2>&1 &&
   ninja -C "$bdir" >"$out/build.log" 2>&1 &&
   [ -f "$bdir/worker/ddp_kernels_cuda.so" ]; then
    res PASS build "-Dcuda=enabled -Dgpu_arch=$cap, $(secs $t)"
else
    tail -n 30 "$out/setup.log" "$out/build.log" 2>/dev/null
    res FAIL build "see $out/build.log"
    printf '%s\n' "${results[@]}"
    exit 1
fi
W=$bdir/worker/ddp-worker

# 2. self-test
t=$SECONDS
timeout 300 "$W" --selftest >"$out/selftest.log" 2>&1
rc=$?
if [ $rc -eq 0 ]; then
    res PASS "selftest (TF32 off)" "every CUDA op matches the CPU op, $(secs $t)"
else
    # the first failures (a sticky CUDA error fails every later case with "setup failed")
    grep -m 12 'FAIL\|error' "$out/selftest.log"
    res FAIL "selftest (TF32 off)" "exit $rc (2: no usable GPU backend); $out/selftest.log"
fi

# 3. compute-sanitizer memcheck on the self-test
cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [ -n "$cs" ]; then
    t=$SECONDS
    timeout "${GPU_SH_MEMCHECK_S:-240}" "$cs" --tool memcheck --error-exitcode 9 "$W" --selftest >"$out/memcheck.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then res PASS "memcheck selftest" "no errors, $(secs $t)"
    elif [ $rc -eq 124 ]; then res SKIP "memcheck selftest" "over ${GPU_SH_MEMCHECK_S:-240} s, stopped"
    else grep -m 1 -A 14 'Invalid\|Error\|error' "$out/memcheck.log"; grep -m 1 'ERROR SUMMARY' "$out/memcheck.log"
        res FAIL "memcheck selftest" "exit $rc"
    fi
else
    res SKIP "memcheck selftest" "compute-sanitizer not installed"
fi

word_salad_shards "$bdir" "$out" ||
    { res FAIL data "ddp-prep failed"; printf '%s\n' "${results[@]}"; exit 1; }
job() { # name preset micro_batch seq_len
    cat >"$out/$1.yaml" <<YAML
name: gpu-$1
model: {preset: $2}
data: {train: "$out/data/train_*.bin"}
train: {steps: 20, micro_batch: $3, seq_len: $4, lr: 3e-4, warmup: 5, seed: 1,
        sample_tokens: 0, val_every: 0, precision: fp32}
YAML
}
# 3b. racecheck: shared-memory races in the kernels a bf16 step runs (flash attention, hs 64)
if [ -n "$cs" ]; then
    t=$SECONDS
    job racecheck gpt2-mini 1 256
    timeout "${GPU_SH_MEMCHECK_S:-240}" "$cs" --tool racecheck --error-exitcode 9 "$W" \
        "$out/racecheck.yaml" --backend cuda --set train.steps=2 --set train.precision=\"bf16\" \
        >"$out/racecheck.log" 2>&1
    rc=$?
    if [ $rc -eq 0 ]; then res PASS "racecheck 2 bf16 steps" "no hazards, $(secs $t)"
    elif [ $rc -eq 124 ]; then res SKIP "racecheck 2 bf16 steps" "over ${GPU_SH_MEMCHECK_S:-240} s, stopped"
    else grep -m 5 'ERROR SUMMARY\|hazard' "$out/racecheck.log"; tail -n 12 "$out/racecheck.log"
        res FAIL "racecheck 2 bf16 steps" "exit $rc"
    fi
fi

# 4. and 5.: fp32 GPU vs CPU, then bf16 on the GPU
compare_model() { # name preset B T tolerance
    local name=$1 tol=$5
    job "$name" "$2" "$3" "$4"
    local t=$SECONDS
    timeout 300 "$W" "$out/$name.yaml" --backend cpu >"$out/$name-cpu.log" 2>&1 ||
        { res FAIL "$name fp32 GPU vs CPU" "CPU run failed: $out/$name-cpu.log"; return; }
    with_mem "$out/$name-mem.txt" timeout 300 "$W" "$out/$name.yaml" --backend cuda \
        >"$out/$name-gpu.log" 2>&1 ||
        { res FAIL "$name fp32 GPU vs CPU" "GPU run failed: $out/$name-gpu.log"; return; }
    local worst
    worst=$(paste <(losses "$out/$name-cpu.log") <(losses "$out/$name-gpu.log") |
        awk 'NF == 2 {d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > w) w = d; n++}
             END {if (n < 20) print "missing"; else printf "%.2e", w}')
    local detail
    detail="20 steps, worst relative loss difference $worst (limit $tol); GPU $(median_tps "$out/$name-gpu.log") tok/s vs CPU $(median_tps "$out/$name-cpu.log") tok/s; GPU memory peak $(peak "$out/$name-mem.txt") MiB; $(secs $t)"
    if [ "$worst" != missing ] && awk -v w="$worst" -v l="$tol" 'BEGIN {exit !(w <= l)}'; then
        res PASS "$name fp32 GPU vs CPU" "$detail"
    else
        res FAIL "$name fp32 GPU vs CPU" "$detail"
    fi
    t=$SECONDS
    with_mem "$out/$name-bf16-mem.txt" timeout 300 "$W" "$out/$name.yaml" --backend cuda \
        --set train.precision=\"bf16\" >"$out/$name-bf16.log" 2>&1
    local rc=$? last
    last=$(losses "$out/$name-bf16.log" | tail -n 1)
    if [ $rc -eq 0 ] && [ -n "$last" ] && awk -v l="$last" -v f="$(losses "$out/$name-cpu.log" | tail -n 1)" \
        'BEGIN {d = (l - f) / f; if (d < 0) d = -d; exit !(d < 0.05)}'; then
        res PASS "$name bf16 on the GPU" "$(median_tps "$out/$name-bf16.log") tok/s, memory peak $(peak "$out/$name-bf16-mem.txt") MiB, final loss $last (CPU fp32 $(losses "$out/$name-cpu.log" | tail -n 1)); $(secs $t)"
    else
        res FAIL "$name bf16 on the GPU" "exit $rc, final loss ${last:-none}: $out/$name-bf16.log"
    fi
}
compare_model gpt2-mini gpt2-mini 8 256 2e-3
compare_model gpt2-124M gpt2-124M 2 256 2e-3

# 5b. activation recomputation on the GPU: the same weights bitwise, less memory
t=$SECONDS
job recompute gpt2-124M 4 1024
for r in none block; do
    with_mem "$out/recompute-$r-mem.txt" timeout 300 "$W" "$out/recompute.yaml" --backend cuda \
        --set train.steps=8 --set train.recompute=\"$r\" --dump-weights "$out/recompute-$r.st" \
        >"$out/recompute-$r.log" 2>&1
done
pn=$(peak "$out/recompute-none-mem.txt") pb=$(peak "$out/recompute-block-mem.txt")
detail="gpt2-124M 4 x 1024 fp32, 8 steps: GPU memory peak $pn MiB (none) -> $pb MiB (block); $(median_tps "$out/recompute-none.log") -> $(median_tps "$out/recompute-block.log") tok/s; $(secs $t)"
if [ -s "$out/recompute-none.st" ] && cmp -s "$out/recompute-none.st" "$out/recompute-block.st" &&
   [ -n "$pn" ] && [ -n "$pb" ] && [ "$pb" -lt "$pn" ]; then
    res PASS "recompute block == none, bitwise" "$detail"
else
    res FAIL "recompute block == none, bitwise" "$detail; $out/recompute-*.log"
fi

# 5c. the memory budget (printed before step 1) against the GPU's peak of the runs above: never
# more than 10% under (a job it says fits must not run out of memory), at most 15% over
t=$SECONDS
ratios="" bad=0
for r in gpt2-124M-gpu:gpt2-124M-mem gpt2-124M-bf16:gpt2-124M-bf16-mem \
         recompute-none:recompute-none-mem recompute-block:recompute-block-mem; do
    b=$(budget_mib "$out/${r%%:*}.log") p=$(peak "$out/${r#*:}.txt")
    q=$(awk -v b="${b:-0}" -v p="${p:-0}" 'BEGIN {if (p > 0) printf "%.2f", b / p; else print "?"}')
    ratios="$ratios ${r%%:*} ${b:-?}/${p:-?} MiB = $q;"
    awk -v q="$q" 'BEGIN {exit !(q != "?" && q >= 0.9 && q <= 1.15)}' || bad=1
done
if [ $bad -eq 0 ]; then res PASS "memory budget vs GPU peak" "budget/peak:$ratios $(secs $t)"
else res FAIL "memory budget vs GPU peak" "budget/peak (0.90-1.15 wanted):$ratios"
fi

# 5d. where a step's time goes: the per-op profile of 3 gpt2-124M steps at 8 x 1024 (after 2
# warm-up steps) in bf16 and in fp32, each table printed here and kept in
# $out/profile-<precision>/profile-rank0.{txt,json}
job profile gpt2-124M 8 1024
for prec in bf16 fp32; do
    t=$SECONDS
    timeout 300 "$W" "$out/profile.yaml" --backend cuda --set train.steps=5 \
        --set train.warmup=1 --set train.profile=3 --set train.precision=\"$prec\" \
        --run-dir "$out/profile-$prec" >"$out/profile-$prec.log" 2>&1
    rc=$?
    table=$out/profile-$prec/profile-rank0.txt
    if [ $rc -eq 0 ] && [ -s "$table" ]; then
        cat "$table"
        res PASS "per-op profile 124M $prec 8x1024" "$(head -n 1 "$table" | grep -o '[0-9.]* ms per step'); top op: $(sed -n 3p "$table" | awk '{print $1, $3 " ms", $4}'); $(secs $t)"
    else
        tail -n 20 "$out/profile-$prec.log"
        res FAIL "per-op profile 124M $prec 8x1024" "exit $rc: $out/profile-$prec.log"
    fi
done

# 5e. bf16 on the GPU is deterministic (two runs, the same weights bitwise: no atomics in flash
# attention's backward) and as accurate as the CPU's bf16: within 0.1% of its losses per step
# over 20 steps, or, where the two bf16 runs round in different places (both round P and dS to
# bf16 since 2026-11-27, but their products sum in different orders, and the CPU's statistics
# differ in their last bits), no further from the CPU's fp32 losses than twice the CPU's bf16
# is (and 0.1% always allowed)
t=$SECONDS
job bf16det gpt2-124M 2 256
for r in 1 2; do
    timeout 300 "$W" "$out/bf16det.yaml" --backend cuda --set train.precision=\"bf16\" \
        --dump-weights "$out/bf16det-$r.st" >"$out/bf16det-$r.log" 2>&1
done
timeout 300 "$W" "$out/bf16det.yaml" --backend cpu --set train.precision=\"bf16\" \
    >"$out/bf16det-cpu.log" 2>&1
timeout 300 "$W" "$out/bf16det.yaml" --backend cpu >"$out/bf16det-cpu32.log" 2>&1
worst_between() { # log log: the largest relative loss difference over 20 steps, or "missing"
    paste <(losses "$1") <(losses "$2") |
        awk 'NF == 2 {d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > w) w = d; n++}
             END {if (n < 20) print "missing"; else printf "%.2e", w}'
}
worst=$(worst_between "$out/bf16det-cpu.log" "$out/bf16det-1.log")
gpu_fp32=$(worst_between "$out/bf16det-cpu32.log" "$out/bf16det-1.log")
cpu_fp32=$(worst_between "$out/bf16det-cpu32.log" "$out/bf16det-cpu.log")
if [ -s "$out/bf16det-1.st" ] && cmp -s "$out/bf16det-1.st" "$out/bf16det-2.st"; then
    res PASS "bf16 GPU runs bitwise equal" "gpt2-124M 2 x 256, 20 steps, $(secs $t)"
else
    res FAIL "bf16 GPU runs bitwise equal" "$out/bf16det-*.log"
fi
rm -f "$out"/bf16det-*.st
detail="worst relative difference $worst over 20 steps; from the CPU's fp32 losses: GPU bf16 $gpu_fp32, CPU bf16 $cpu_fp32"
if [ "$worst" != missing ] && awk -v w="$worst" 'BEGIN {exit !(w <= 1e-3)}'; then
    res PASS "bf16 GPU vs CPU bf16 losses" "$detail"
elif [ "$gpu_fp32" != missing ] && [ "$cpu_fp32" != missing ] &&
    awk -v g="$gpu_fp32" -v c="$cpu_fp32" 'BEGIN {exit !(g <= 2 * c || g <= 1e-3)}'; then
    res PASS "bf16 GPU vs CPU bf16 losses" "as accurate as the CPU's bf16: $detail"
else
    res FAIL "bf16 GPU vs CPU bf16 losses" "$detail: $out/bf16det-*.log"
fi

# 6. NCCL through the project's backend
N=$bdir/tests/gpu/nccl_allreduce
t=$SECONDS
if timeout 120 "$N" >"$out/nccl1.log" 2>&1; then
    res PASS "nccl collectives, 1 rank" "$(grep -o '256 MiB.*' "$out/nccl1.log"); $(grep -o 'reduce-scatter.*' "$out/nccl1.log"), $(secs $t)"
else
    tail -n 10 "$out/nccl1.log"; res FAIL "nccl collectives, 1 rank" "$out/nccl1.log"
fi
if [ "$ngpu" -ge 2 ]; then
    t=$SECONDS
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    pids=()
    for r in 0 1; do
        DDP_RANK=$r DDP_LOCAL_RANK=$r DDP_WORLD_SIZE=2 DDP_RDZV=127.0.0.1:$port \
            DDP_JOB_TOKEN=gpu-sh timeout 120 "$N" >"$out/nccl2-$r.log" 2>&1 &
        pids+=($!)
    done
    rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    if [ $rc -eq 0 ]; then
        res PASS "nccl collectives, 2 ranks" "$(grep -o '256 MiB.*' "$out/nccl2-0.log"); $(grep -o 'reduce-scatter.*' "$out/nccl2-0.log"), $(secs $t)"
    else
        tail -n 5 "$out"/nccl2-*.log; res FAIL "nccl collectives, 2 ranks" "$out/nccl2-*.log"
    fi
    # 2 GPUs with NCCL against 1 GPU accumulating 2 micro-steps: the same global batch
    t=$SECONDS
    job ddp2 gpt2-mini 8 256
    gbt="--set train.global_batch_tokens=4096"
    # shellcheck disable=SC2086
    timeout 300 "$W" "$out/ddp2.yaml" --backend cuda $gbt >"$out/ddp2-1gpu.log" 2>&1
    # shellcheck disable=SC2086
    DDP_WORKER=$W RUN_DIR=$out/run2 timeout 300 "$src/deploy/launch-local.sh" 2 "$out/ddp2.yaml" \
        --backend cuda --set ddp.backend=\"nccl\" $gbt --dump-weights "$out/ddp2.st" \
        >"$out/ddp2-2gpu.log" 2>&1
    rc=$?
    worst=$(paste <(losses "$out/ddp2-1gpu.log") <(losses "$out/ddp2-2gpu.log") |
        awk 'NF == 2 {d = ($1 - $2) / $1; if (d < 0) d = -d; if (d > w) w = d; n++}
             END {if (n < 20) print "missing"; else printf "%.2e", w}')
    if [ $rc -eq 0 ] && [ "$worst" != missing ] && awk -v w="$worst" 'BEGIN {exit !(w <= 1e-3)}'; then
        res PASS "2-GPU NCCL training vs 1 GPU" "worst relative loss difference $worst, $(median_tps "$out/ddp2-2gpu.log") tok/s on 2 GPUs, $(secs $t)"
    else
        res FAIL "2-GPU NCCL training vs 1 GPU" "exit $rc, worst $worst: $out/ddp2-2gpu.log"
    fi
    # ZeRO-1 over NCCL (ddp.shard_optimizer, on by default above) against the unsharded step: two
    # ranks sum in one order, so the weights are bitwise equal
    t=$SECONDS
    # shellcheck disable=SC2086
    DDP_WORKER=$W RUN_DIR=$out/run2u timeout 300 "$src/deploy/launch-local.sh" 2 "$out/ddp2.yaml" \
        --backend cuda --set ddp.backend=\"nccl\" $gbt --set ddp.shard_optimizer=false \
        --dump-weights "$out/ddp2u.st" >"$out/ddp2u-2gpu.log" 2>&1
    if grep -q "optimizer step sharded" "$out/ddp2-2gpu.log" && [ -s "$out/ddp2.st" ] &&
       cmp -s "$out/ddp2.st" "$out/ddp2u.st"; then
        res PASS "2-GPU ZeRO-1 == unsharded, bitwise" "$(median_tps "$out/ddp2-2gpu.log") vs $(median_tps "$out/ddp2u-2gpu.log") tok/s unsharded, $(secs $t)"
    else
        res FAIL "2-GPU ZeRO-1 == unsharded, bitwise" "$out/ddp2-2gpu.log, $out/ddp2u-2gpu.log"
    fi
else
    res SKIP "nccl collectives, 2 ranks" "one GPU here"
    # 6b. two ranks on this one GPU over the ring, their device buffers staged through host
    # memory (NCCL refuses two ranks on one GPU, and is refused by name first): the weights of
    # 1 rank accumulating 2 micro-steps, bitwise, with and without ZeRO-1 (10 gpt2-mini steps)
    t=$SECONDS
    job ring2 gpt2-mini 8 256
    gbt="--set train.global_batch_tokens=4096 --set train.steps=10"
    two() { # name [options]: 2 ranks of ring2.yaml on this GPU
        local name=$1; shift
        DDP_WORKER=$W RUN_DIR=$out/run-$name timeout 300 "$src/deploy/launch-local.sh" 2 \
            "$out/ring2.yaml" --backend cuda $gbt "$@" >"$out/$name.log" 2>&1
    }
    # shellcheck disable=SC2086
    timeout 300 "$W" "$out/ring2.yaml" --backend cuda $gbt --dump-weights "$out/ring1.st" \
        >"$out/ring1.log" 2>&1
    two ring2 --set ddp.backend=\"ring\" --set ddp.shard_optimizer=false --dump-weights "$out/ring2.st"
    two ring2z --set ddp.backend=\"ring\" --set ddp.shard_optimizer=true --dump-weights "$out/ring2z.st"
    two ring2n --set ddp.backend=\"nccl\"
    if [ -s "$out/ring1.st" ] && cmp -s "$out/ring1.st" "$out/ring2.st" &&
       cmp -s "$out/ring1.st" "$out/ring2z.st" && grep -q "optimizer step sharded" "$out/ring2z.log"; then
        res PASS "2 ranks on 1 GPU over the ring == 1 rank x 2 micro-steps, bitwise (ZeRO-1 too)" "$(median_tps "$out/ring2.log") tok/s, $(secs $t)"
    else
        res FAIL "2 ranks on 1 GPU over the ring == 1 rank x 2 micro-steps, bitwise (ZeRO-1 too)" "$out/ring1.log $out/ring2.log $out/ring2z.log"
    fi
    if grep -q "NCCL cannot run two ranks on one GPU" "$out/ring2n.log"; then
        res PASS "2 ranks on 1 GPU with NCCL: refused by name" ""
    else
        res FAIL "2 ranks on 1 GPU with NCCL: refused by name" "$out/ring2n.log"
    fi
fi

# 7. the elastic NCCL abort-and-rebuild test (checked on the simulated GPU with BACKEND=sim)
if [ "$ngpu" -ge 2 ]; then
    t=$SECONDS
    if timeout 400 "$src/tests/gpu/elastic_abort.sh" "$bdir" >"$out/elastic.log" 2>&1; then
        res PASS "elastic NCCL abort + rebuild" "$(grep -o 'within 1e-5.*' "$out/elastic.log"), $(secs $t)"
    else
        tail -n 10 "$out/elastic.log"; res FAIL "elastic NCCL abort + rebuild" "$out/elastic.log"
    fi
else
    res SKIP "elastic NCCL abort + rebuild" "one GPU here"
fi

echo
echo "== summary: $gpu_name x $ngpu (sm_$cap), $(($SECONDS - t_start)) s, logs in $out"
printf '%s\n' "${results[@]}"
exit $failed
