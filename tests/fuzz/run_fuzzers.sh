#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz/harness/fuzz_*.c) with Debian's clang and
# -fsanitize=fuzzer,address,undefined in their own directory, and runs each for a bounded time
# from its seed corpus (tests/fuzz/corpus/<harness>/, which also holds every crash ever found, so
# each run first replays them as regression inputs). Any crash, leak, UB report or timeout fails.
#
#   tests/fuzz/run_fuzzers.sh [OUT_DIR]        default OUT_DIR=build-fuzz
#   FUZZ_SECONDS=30   time per harness (0: only replay the corpus)
#   FUZZ_ONLY="spec rpc"   a subset
#
# Prints one line per harness (executions, edges covered, corpus size) and writes
# OUT_DIR/testlog.json in meson's format, one record per harness, for tests/summarize.py.
# New inputs the fuzzer finds go to OUT_DIR/corpus/<harness>/ (the repository's corpus is not
# changed); a crashing input is kept as OUT_DIR/crashes/<harness>/crash-*: fix the bug, then
# copy the input into tests/fuzz/corpus/<harness>/ as a regression input.
# Exit status: 0 all passed, 1 a harness failed or did not build, 77 no clang/libFuzzer here.
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mkdir -p "${1:-$src/build-fuzz}" && cd "${1:-$src/build-fuzz}" && pwd)
secs=${FUZZ_SECONDS:-30}
all=(spec shard safetensors manifest ckpt rpc peer peer_msg hello metrics tokenizer eval_task)
read -r -a only <<<"${FUZZ_ONLY:-${all[*]}}"

cc=${FUZZ_CC:-clang}
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n){return 0;}' >"$probe/p.c"
if ! command -v "$cc" >/dev/null ||
    ! "$cc" -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" 2>/dev/null; then
    echo "run_fuzzers: SKIP: no clang with libFuzzer ($cc; deploy/install-deps.sh installs it)"
    echo '{"name": "libfuzzer", "result": "SKIP", "stdout": ""}' >"$out/testlog.json"
    exit 77
fi

flags=(-g -O1 -std=gnu11 -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -I"$src" -I"$src/tests/fuzz/harness"
       -fno-omit-frame-pointer -fno-sanitize-recover=all -Wno-unused-command-line-argument)
libsan=("-fsanitize=fuzzer-no-link,address,undefined")
# what each harness links beyond its own file
common=(common/err.c common/log.c common/alloc.c common/file.c common/crc32c.c common/trace.c
        common/host.c common/test_hook.c)
proto=(proto/spec.c proto/spec_value.c proto/spec_list.c proto/spec_rules.c proto/spec_out.c
       proto/spec_presets.c proto/spec_tree.c proto/shard.c proto/hf_config.c)
ckpt=(worker/checkpoint/safetensors.c worker/checkpoint/manifest.c
      worker/checkpoint/checkpoint.c worker/checkpoint/checkpoint_commit.c
      worker/checkpoint/checkpoint_load.c worker/checkpoint/checkpoint_fs.c
      worker/checkpoint/dio.c worker/checkpoint/uring.c)
uv_cflags=$(pkg-config --cflags libuv 2>/dev/null)
declare -A srcs=(
    [spec]="${proto[*]}" [shard]="${proto[*]}" [metrics]="proto/metrics.c"
    [safetensors]="${ckpt[*]}" [manifest]="${ckpt[*]}" [ckpt]="${ckpt[*]}"
    [rpc]="daemon/rpc.c" [peer]="daemon/auth.c" [peer_msg]="daemon/peer_msg.c daemon/auth.c"
    [hello]="collectives/rdzv_hello.c collectives/net.c"
    [tokenizer]="worker/data/tokenizer.c worker/data/bytemap.c"
    [eval_task]="worker/evaluate/task.c worker/data/tokenizer.c worker/data/bytemap.c"
)
libs=(-ljansson -lyaml -luring -lsodium -lpcre2-8 -lutf8proc -lm -lpthread)

mkdir -p "$out/obj"
build_obj() { # source -> object path (rebuilt when the source is newer)
    local o
    o=$out/obj/$(echo "$1" | tr / _).o
    if [ ! -f "$o" ] || [ "$src/$1" -nt "$o" ]; then
        "$cc" "${flags[@]}" "${libsan[@]}" $uv_cflags -c "$src/$1" -o "$o" 2>"$o.log" ||
            { cat "$o.log" >&2; return 1; }
    fi
    echo "$o"
}

status=0
: >"$out/testlog.json"
record() { # name result stdout-file
    python3 -c 'import json,sys; print(json.dumps({"name": "libfuzzer_" + sys.argv[1],
        "result": sys.argv[2], "stdout": open(sys.argv[3], errors="replace").read()}))' \
        "$1" "$2" "$3" >>"$out/testlog.json"
}

for h in "${only[@]}"; do
    log=$out/$h.log
    objs=()
    ok=1
    for s in "${common[@]}" ${srcs[$h]}; do
        o=$(build_obj "$s") || { ok=0; break; }
        objs+=("$o")
    done
    bin=$out/fuzz_$h
    if [ $ok = 1 ]; then
        "$cc" "${flags[@]}" -fsanitize=fuzzer,address,undefined $uv_cflags \
            "$src/tests/fuzz/harness/fuzz_$h.c" "${objs[@]}" "${libs[@]}" -o "$bin" 2>"$log" ||
            ok=0
    fi
    if [ $ok = 0 ]; then
        echo "fuzz $h: BUILD FAILED"; tail -20 "$log"
        echo "not ok 1 - fuzz_$h builds" >"$log.tap"; record "$h" FAIL "$log.tap"
        status=1; continue
    fi
    seeds=$src/tests/fuzz/corpus/$h
    work=$out/corpus/$h
    mkdir -p "$work" "$out/crashes/$h" "$seeds"
    t0=$SECONDS
    limit=(-max_total_time="$secs")
    [ "$secs" = 0 ] && limit=(-runs=0) # replay the corpus only
    # ASan's leak check runs at exit; libFuzzer also reports per-input leaks (-detect_leaks).
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
    TMPDIR=$out/tmp-$h \
        bash -c 'mkdir -p "$TMPDIR"; exec "$@"' _ "$bin" "${limit[@]}" \
        -print_final_stats=1 -timeout=20 -rss_limit_mb=2048 -error_exitcode=1 \
        -timeout_exitcode=1 -artifact_prefix="$out/crashes/$h/" "$work" "$seeds" >"$log" 2>&1
    rc=$?
    rm -rf "$out/tmp-$h"
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
    cov=$(grep -oE '(cov|DONE +cov): [0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
    ft=$(grep -oE 'ft: [0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
    corp=$(grep -oE 'corp: [0-9]+/[0-9]+[a-zA-Z]*' "$log" | tail -1 | cut -d' ' -f2)
    total=$(grep -oE 'Loaded 1 modules +\([0-9]+' "$log" | grep -oE '[0-9]+$' | head -1)
    line="fuzz $h: ${execs:-?} executions in $((SECONDS - t0)) s, ${cov:-?} of ${total:-?} instrumented edges covered, ${ft:-?} features, corpus ${corp:-?}"
    if [ $rc -eq 0 ]; then
        echo "$line"
        echo "ok 1 - fuzz_$h: $line" >"$log.tap"; record "$h" OK "$log.tap"
    else
        echo "$line: FAILED (exit $rc)"
        grep -E 'ERROR: |SUMMARY: |runtime error|Test unit written' "$log" | head -8
        echo "not ok 1 - fuzz_$h: $line: exit $rc; log $log" >"$log.tap"
        grep -E 'ERROR: |SUMMARY: |runtime error|Test unit written' "$log" | head -8 |
            sed 's/^/# /' >>"$log.tap"
        record "$h" FAIL "$log.tap"
        status=1
    fi
done
exit $status
