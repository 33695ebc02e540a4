#!/usr/bin/env bash
# Line coverage of the files each libFuzzer harness targets, measured on its corpus (the seeds
# plus what run_fuzzers.sh found, OUT/corpus/<harness>/): builds every harness once more with
# clang's source-based coverage (-fprofile-instr-generate -fcoverage-mapping, no sanitizers),
# replays the corpus (-runs=0) and prints llvm-cov's line and branch coverage per target file.
# Not part of CI (run_fuzzers.sh is); for the numbers in tests/HARDENING.md.
#
#   tests/fuzz/coverage.sh [OUT_DIR]      default build-fuzz (after tests/fuzz/run_fuzzers.sh)
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
out=$(cd "${1:-$src/build-fuzz}" && pwd) || { echo "coverage.sh: run run_fuzzers.sh first"; exit 1; }
cc=${FUZZ_CC:-clang}
cov=$out/coverage
mkdir -p "$cov"
common=(common/err.c common/log.c common/alloc.c common/file.c common/crc32c.c)
proto=(proto/spec.c proto/spec_value.c proto/spec_list.c proto/spec_rules.c proto/spec_out.c
       proto/spec_presets.c proto/spec_tree.c proto/shard.c)
ckpt=(worker/checkpoint/safetensors.c worker/checkpoint/manifest.c
      worker/checkpoint/checkpoint.c worker/checkpoint/checkpoint_commit.c
      worker/checkpoint/checkpoint_load.c worker/checkpoint/checkpoint_fs.c
      worker/checkpoint/dio.c worker/checkpoint/uring.c)
declare -A srcs=(
    [spec]="${proto[*]}" [shard]="${proto[*]}" [metrics]="proto/metrics.c"
    [safetensors]="${ckpt[*]}" [manifest]="${ckpt[*]}" [ckpt]="${ckpt[*]}"
    [rpc]="daemon/rpc.c" [peer]="daemon/auth.c" [peer_msg]="daemon/peer_msg.c daemon/auth.c"
    [hello]="collectives/rdzv_hello.c collectives/net.c"
    [tokenizer]="worker/data/tokenizer.c worker/data/bytemap.c"
)
declare -A targets=(
    [spec]="proto/spec.c proto/spec_value.c proto/spec_list.c proto/spec_rules.c proto/spec_out.c proto/spec_presets.c proto/spec_tree.c" [shard]="proto/shard.c"
    [safetensors]="worker/checkpoint/safetensors.c" [manifest]="worker/checkpoint/manifest.c"
    [ckpt]="worker/checkpoint/checkpoint_load.c worker/checkpoint/manifest.c worker/checkpoint/safetensors.c"
    [rpc]="daemon/rpc.c" [peer]="daemon/auth.c" [peer_msg]="daemon/peer_msg.c"
    [hello]="collectives/rdzv_hello.c"
    [tokenizer]="worker/data/tokenizer.c worker/data/bytemap.c" [metrics]="proto/metrics.c"
)
uv_cflags=$(pkg-config --cflags libuv 2>/dev/null)
printf '%-12s %-36s %8s %8s\n' harness file lines branches
for h in spec shard safetensors manifest ckpt rpc peer peer_msg hello metrics tokenizer; do
    files=()
    for s in "${common[@]}" ${srcs[$h]}; do files+=("$src/$s"); done
    # shellcheck disable=SC2086
    "$cc" -g -O1 -std=gnu11 -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -I"$src" \
        -I"$src/tests/fuzz/harness" $uv_cflags -fsanitize=fuzzer \
        -fprofile-instr-generate -fcoverage-mapping -Wno-unused-command-line-argument \
        "$src/tests/fuzz/harness/fuzz_$h.c" "${files[@]}" \
        -ljansson -lyaml -luring -lsodium -lpcre2-8 -lutf8proc -lm -lpthread -o "$cov/fuzz_$h" \
        2>"$cov/$h.build.log" || { echo "$h: build failed"; continue; }
    rm -f "$cov/$h".*.profraw
    mkdir -p "$cov/tmp"
    LLVM_PROFILE_FILE="$cov/$h.%p.profraw" TMPDIR=$cov/tmp "$cov/fuzz_$h" -runs=0 \
        "$out/corpus/$h" "$src/tests/fuzz/corpus/$h" >"$cov/$h.run.log" 2>&1
    llvm-profdata merge -sparse "$cov/$h".*.profraw -o "$cov/$h.profdata" || continue
    for t in ${targets[$h]}; do
        llvm-cov report "$cov/fuzz_$h" -instr-profile="$cov/$h.profdata" "$src/$t" 2>/dev/null |
            awk -v h="$h" -v t="$t" '$1 ~ /\.c$/ {
                # columns: regions missed cover functions missed exec lines missed cover branches missed cover
                printf "%-12s %-36s %8s %8s\n", h, t, $10, $13 }'
    done
done
