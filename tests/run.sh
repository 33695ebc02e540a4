#!/usr/bin/env bash
# Builds ddpd and runs every test suite (unit, integration, fault, fuzz), then the unit and fuzz
# tests again under ASan+UBSan, the threaded ones (kernel pool, the native bf16 tiles,
# collectives, reducer, data loader) under TSan, and the libFuzzer harnesses
# (tests/fuzz/run_fuzzers.sh, FUZZ_SECONDS each, default 12: 11 harnesses in under 3 minutes;
# a clean-clone CI on a 2-vCPU machine took 23-26 of its 25 minutes at 15 s, on 2026-11-27,
# depending on the machine's load; any crash fails).
# Ends with one line: "tests: N passed, N failed, N skipped".
# Exit status is non-zero when any test failed or a build broke.
#
#   tests/run.sh            everything
#   tests/run.sh --quick    only the main build's suites (no sanitizer build)
set -uo pipefail
cd "$(dirname "$0")/.."

quick=0
[ "${1:-}" = "--quick" ] && quick=1
werror=false
[ "${CI:-}" = "true" ] && werror=true

deploy/install-deps.sh || exit 1

status=0
summaries=()

run_suites() { # builddir label meson-test-args...
  local dir=$1 label=$2
  shift 2
  meson test -C "$dir" --print-errorlogs --num-processes 2 "$@" >"$dir/test-output.txt" 2>&1
  local rc=$?
  grep -E '^ *[0-9]+/[0-9]+ ' "$dir/test-output.txt" | sed "s/^/[$label] /"
  [ $rc -ne 0 ] && status=1 # tests/summarize.py shows each failed test's output
  summaries+=("$dir/meson-logs/testlog.json")
}

setup() { # builddir meson-options...
  local dir=$1
  shift
  if [ ! -f "$dir/build.ninja" ]; then
    meson setup "$dir" -Dwerror=$werror "$@" >"$dir.setup.log" 2>&1 ||
      { cat "$dir.setup.log"; return 1; }
  fi
  ninja -C "$dir" >"$dir.build.log" 2>&1 || { tail -n 60 "$dir.build.log"; return 1; }
}

if setup build; then
  run_suites build main
else
  summaries+=(--broken build); status=1
fi

if [ $quick -eq 0 ]; then
  if setup build-asan -Db_sanitize=address,undefined -Dcuda=disabled -Dbuildtype=debugoptimized; then
    run_suites build-asan asan --suite unit --suite fuzz
  else
    summaries+=(--broken build-asan); status=1
  fi
  if setup build-tsan -Db_sanitize=thread -Dcuda=disabled -Dbuildtype=debugoptimized; then
    TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
      run_suites build-tsan tsan --timeout-multiplier 3 kernels kernels_lowp collectives collectives_hier elastic_conn reducer data gpu_sim \
        flight
  else
    summaries+=(--broken build-tsan); status=1
  fi
fi

if [ $quick -eq 0 ]; then
  # coverage-guided fuzzing with clang in its own build dir; 77 = no clang/libFuzzer (a skip)
  t0=$SECONDS
  FUZZ_SECONDS=${FUZZ_SECONDS:-12} tests/fuzz/run_fuzzers.sh build-fuzz | sed 's/^/[libfuzzer] /'
  rc=${PIPESTATUS[0]}
  echo "[libfuzzer] $((SECONDS - t0)) s"
  [ $rc -ne 0 ] && [ $rc -ne 77 ] && status=1
  summaries+=(build-fuzz/testlog.json)
fi

python3 tests/summarize.py "${summaries[@]}" || status=1
exit $status
